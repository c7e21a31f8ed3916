//! `cargo xtask`: orchestration only. Installs prerequisites, runs the test
//! suites, the demo and the benchmarks. No product logic lives here.

mod setup;

use std::process::Command;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "lb project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build and the tests need (idempotent; only what is missing).
    Setup,
    /// Install prerequisites if missing, then run every test: unit, datapath (in the kernel), end-to-end.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// rustfmt and clippy, warnings as errors.
    Lint,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(setup::Mode::Always),
        Task::Test { args } => test(&args),
        Task::Lint => lint(),
    }
}

/// Runs a command, streaming its output; fails if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn test(args: &[String]) -> Result<()> {
    setup::run(setup::Mode::IfMissing)?;
    if !setup::is_root() {
        eprintln!(
            "warning: not running as root: the datapath and end-to-end tests will fail \
             (they load XDP programs and create network namespaces)"
        );
    }
    run(cargo()
        .args(["test", "--workspace", "--exclude", "lb-ebpf"])
        .args(args))
}

fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "lb-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF crate only builds for the BPF target.
    run(Command::new("rustup")
        .current_dir("lb-ebpf")
        .args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--bins",
            "--",
            "-D",
            "warnings",
        ])
        .env_remove("RUSTC")
        .env_remove("CARGO"))?;
    Ok(())
}

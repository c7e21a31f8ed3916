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
    /// Run lbd in a namespace rig with real connections and print a summary.
    Demo {
        /// Leave the rig running afterwards.
        #[arg(long)]
        keep: bool,
        /// Remove a rig left by --keep.
        #[arg(long)]
        down: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(setup::Mode::Always),
        Task::Test { args } => test(&args),
        Task::Lint => lint(),
        Task::Demo { keep, down } => demo(keep, down),
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
    // The end-to-end tests run the real lbd and lbctl binaries.
    build_bins()?;
    run(cargo()
        .args(["test", "--workspace", "--exclude", "lb-ebpf"])
        .args(args))
}

fn build_bins() -> Result<()> {
    run(cargo().args(["build", "--workspace", "--exclude", "lb-ebpf", "--bins"]))
}

fn demo(keep: bool, down: bool) -> Result<()> {
    setup::run(setup::Mode::IfMissing)?;
    if !setup::is_root() {
        bail!("the demo creates network namespaces and attaches XDP programs: run it as root");
    }
    build_bins()?;
    let mut cmd = Command::new("target/debug/lb-demo");
    if keep {
        cmd.arg("--keep");
    }
    if down {
        cmd.arg("--down");
    }
    run(&mut cmd)
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

//! `cargo xtask`: orchestration only. Installs prerequisites, runs the test
//! suites, the demo, the benchmarks and the fuzzer. No product logic lives
//! here.

mod package;
mod setup;
mod structure;
mod suite;
mod vmtest;

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
    /// Install prerequisites if missing, then run every test: unit, datapath (in the kernel),
    /// end-to-end, and the kernel matrix's slice (`vmtest`).
    Test {
        /// Leave out the kernel matrix (`cargo xtask vmtest`), for quicker local runs.
        #[arg(long)]
        no_vm: bool,
        /// Only the unit tests: no root, no kernel, no eBPF build (the
        /// programs are stubbed, `LB_EBPF=stub`, in `target/unit`).
        #[arg(long)]
        unit: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// The kernel matrix: boots Debian's kernels (6.1, 6.12) in QEMU with systemd, and runs
    /// every program's load, the datapath suites, a fuzzer slice, end-to-end rig tests and the
    /// systemd checks of the package there (root; the guest image is built once and cached).
    Vmtest {
        /// Which kernels.
        #[arg(long, value_enum, default_value_t = vmtest::KernelChoice::All)]
        kernel: vmtest::KernelChoice,
        /// More of every suite (the slice is what `cargo xtask test` runs).
        #[arg(long)]
        full: bool,
        /// Only these steps (load, golden, ..., fuzz, e2e, systemd), for iterating on one.
        #[arg(long = "step", value_name = "STEP")]
        steps: Vec<String>,
    },
    /// rustfmt and clippy, warnings as errors.
    Lint,
    /// The fast inner loop: clippy on the userspace crates without building
    /// the eBPF programs (`LB_EBPF=stub`, in `target/unit`); no nightly, no
    /// root. `cargo xtask test --unit` runs their unit tests the same way.
    Check,
    /// Measure: datapath ns per packet class, veth forwarding rate, table
    /// writes, memory, Maglev build time and quality, and the control plane
    /// at scale (`lb-scale`). Prints the figures and writes them into
    /// BENCHMARKS.md (between its bench and scale markers).
    Bench {
        /// Also measure the `lb_xdp` of this git revision (e.g. `HEAD~3`) in
        /// the same rounds, for before/after figures (`LB_BENCH_BASELINE`),
        /// and its `lbd` in the scale scenarios (`LB_SCALE_BASELINE`).
        #[arg(long)]
        baseline: Option<String>,
    },
    /// Differential fuzzer of the XDP program: frames through
    /// BPF_PROG_TEST_RUN against an independent oracle (release build, root).
    Fuzz {
        /// Frames to run.
        #[arg(long, default_value_t = 10_000_000)]
        packets: u64,
        /// Seed (default: a fresh one, printed first; a violation's report
        /// names the seed to replay).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// The runtime code's shape: largest files, functions over 80 lines,
    /// module cycles (the suite holds the rules; this prints the figures).
    Structure {
        /// Another checkout to measure (e.g. a `git worktree` of an older
        /// revision), for before/after figures.
        #[arg(long)]
        workspace: Option<std::path::PathBuf>,
    },
    /// Build the Debian package (target/debian/lb_<version>_<arch>.deb):
    /// lbd, lbctl, lb-backend-setup, the systemd unit, the example
    /// configuration, man pages and shell completions.
    Package {
        /// Build and package the binaries of this profile.
        #[arg(long, value_enum, default_value_t = package::Profile::Release)]
        profile: package::Profile,
        /// Package the lbd and lbctl found in DIR instead (no build).
        #[arg(long, value_name = "DIR")]
        bin_dir: Option<std::path::PathBuf>,
        /// Write the .deb into DIR (default target/debian).
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
    },
    /// Mutation testing with cargo-mutants (installed if missing): each
    /// mutant of the named files (default: the modules issue 27 names) is
    /// built with the eBPF programs stubbed and judged by the unit tests
    /// (`--lib`), optionally only those matching FILTER. Hours for the whole
    /// default set on two cores: name files for a slice, or run it in
    /// shards. `--slice` is the bounded slice CI runs.
    Mutants(MutantsRun),
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
        Task::Test {
            unit: true, args, ..
        } => unit_tests(&args),
        Task::Test { no_vm, args, .. } => test(&args, !no_vm),
        Task::Vmtest {
            kernel,
            full,
            steps,
        } => {
            setup::run(setup::Mode::IfMissing)?;
            let depth = if full {
                vmtest::Depth::Full
            } else {
                vmtest::Depth::Slice
            };
            vmtest::vmtest(kernel, depth, &steps)
        }
        Task::Lint => lint(),
        Task::Check => setup::build_tools().and_then(|()| check()),
        Task::Demo { keep, down } => demo(keep, down),
        Task::Mutants(job) => mutants(&job),
        Task::Bench { baseline } => bench(baseline.as_deref()),
        Task::Fuzz { packets, seed } => fuzz(packets, seed),
        Task::Structure { workspace } => structure::report(workspace),
        Task::Package {
            profile,
            bin_dir,
            out,
        } => package::package(&package::Options {
            profile,
            bin_dir,
            out,
        }),
    }
}

/// `cargo xtask check`: clippy over the userspace crates, the eBPF
/// programs stubbed (no nightly, no bpf-linker).
fn check() -> Result<()> {
    run(cargo()
        .env("LB_EBPF", "stub")
        .env("CARGO_TARGET_DIR", "target/unit")
        .args(CLIPPY_USERSPACE))
}

/// clippy over every crate but the eBPF one, warnings denied.
const CLIPPY_USERSPACE: [&str; 8] = [
    "clippy",
    "--workspace",
    "--exclude",
    "lb-ebpf",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];

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

fn test(args: &[String], vm: bool) -> Result<()> {
    if !setup::is_root() {
        bail!(
            "cargo xtask test needs root: its datapath and end-to-end tests load XDP programs and make network namespaces (`cargo xtask test --unit` runs the unit tests without root)"
        );
    }
    setup::run(setup::Mode::IfMissing)?;
    // The end-to-end tests run the real lbd and lbctl binaries.
    build_bins()?;
    if args.is_empty() {
        suite::run_host_suite()?;
    } else {
        // A filter or cargo options: one `cargo test`, one binary at a time.
        run(cargo()
            .args(["test", "--workspace", "--exclude", "lb-ebpf"])
            .args(args))?;
    }
    if vm {
        vmtest::vmtest(vmtest::KernelChoice::All, vmtest::Depth::Slice, &[])?;
    }
    Ok(())
}

/// `cargo xtask test --unit`: every unit test of the workspace (the
/// libraries', the binaries' and xtask's), built without the eBPF
/// programs in a target directory of its own, so that switching between
/// this and the full suite rebuilds nothing. No root, no kernel, no
/// nightly toolchain.
fn unit_tests(args: &[String]) -> Result<()> {
    setup::build_tools()?;
    run(cargo()
        .env("LB_EBPF", "stub")
        .env("CARGO_TARGET_DIR", "target/unit")
        .args([
            "test",
            "--workspace",
            "--exclude",
            "lb-ebpf",
            "--lib",
            "--bins",
        ])
        .args(args))
}

/// The modules whose mutants issue 27 asks the tests to catch.
const MUTATED: &[&str] = &[
    "lb-userspace/src/config/*.rs",
    "lb-userspace/src/daemon/*.rs",
    "lb-userspace/src/announce/bgp/*.rs",
    "lb-userspace/src/announce/bgp/wire/*.rs",
    "lb-userspace/src/maglev.rs",
    "lb-userspace/src/passive.rs",
    "lb-userspace/src/second_chance.rs",
    "lb-userspace/src/lifecycle/*.rs",
];

/// Test threads per mutant: the unit tests' wall time is 14 s on 2
/// threads and 6 s on 8 on this project's 2-core machines, since the
/// longest of them sleep through BGP hold and keepalive timers.
const MUTANT_TEST_THREADS: usize = 8;

/// What `cargo xtask mutants` was asked for.
#[derive(clap::Args)]
struct MutantsRun {
    /// Source files, relative to the workspace (globs as cargo-mutants
    /// takes them).
    #[arg(long = "file", value_name = "FILE")]
    files: Vec<String>,
    /// Only the unit tests whose names contain this.
    #[arg(long)]
    filter: Option<String>,
    /// Leave out the unit tests whose names contain this (may be given
    /// more than once). A mutant that only they catch comes back missed,
    /// and a later `--iterate` run without `--skip` judges it again.
    #[arg(long, value_name = "PATTERN")]
    skip: Vec<String>,
    /// Build and test this many mutants at once, each in its own scratch
    /// copy with its own target directory (each builds the dependencies
    /// once, on its first mutant).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Cut a mutant's tests after this many seconds: a hang, counted as
    /// caught.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u32,
    /// Only shard K of N (0-based) of the mutants: N runs, one per K,
    /// cover them all.
    #[arg(long, value_name = "K/N")]
    shard: Option<String>,
    /// Skip the mutants that earlier runs recorded as caught in
    /// `mutants.out/` (and keep their record). Not with `--shard`:
    /// cargo-mutants drops the caught ones before it shards, so the shards
    /// would no longer split one set.
    #[arg(long, conflicts_with = "shard")]
    iterate: bool,
    /// Write the report to `DIR/mutants.out/` instead of `./mutants.out/`
    /// (one directory per shard keeps each shard's record).
    #[arg(long, value_name = "DIR")]
    output: Option<std::path::PathBuf>,
    /// The bounded slice CI runs ([`SLICE`]): fails if one of its mutants
    /// is missed. Built in the workspace's own target directory with the
    /// test profile, so that after `cargo xtask test` only the workspace's
    /// crates are built again; its report is in
    /// `target/mutants-slice/mutants.out/`.
    #[arg(long, conflicts_with_all = ["files", "filter", "skip", "jobs", "shard", "iterate", "output"])]
    slice: bool,
}

/// The slice of [`MUTATED`] that `.ci/run` runs (`--slice`): files whose
/// every mutant a unit test catches (MUTANTS.md), and the tests that
/// judge them. A few minutes on two cores.
const SLICE: (&[&str], &[&str]) = (
    &[
        "lb-userspace/src/lifecycle/flaps.rs",
        "lb-userspace/src/lifecycle/passive.rs",
        "lb-userspace/src/daemon/passive.rs",
    ],
    &["lifecycle::", "passive"],
);

/// `cargo xtask mutants`: cargo-mutants over `files` (default
/// [`MUTATED`]), each mutant judged by the unit tests of `lb-userspace`
/// built with stubbed eBPF programs. Its report is in `mutants.out/`.
///
/// Each mutant is built in cargo-mutants' scratch copy of the tree. With
/// one job, the copies share one target directory, `target/mutants`, so
/// the dependencies are built once, not once per run. With `--jobs N`
/// each copy keeps its own: a shared one let two jobs build the same
/// unit-test binary into one file, and cargo, which judges freshness by
/// modification times, took the other job's newer binary as its own, so
/// each job tested the other's mutant. The `mutants` profile builds
/// without debug info (a smaller test binary, linked faster). Only the
/// library's unit-test binary is built (`--lib` on every cargo call):
/// building the integration tests and binaries too recompiled every one
/// of them per mutant, 25-47 s where the library alone takes about 3.
/// The unit tests run on [`MUTANT_TEST_THREADS`] threads, more than the
/// cores, because the slowest of them wait on BGP timers rather than
/// compute.
///
/// A shard is a round-robin sample (mutant `i` on shard `i % N`), so any
/// one shard spreads over every file. The CI slice (`--slice`) is built
/// instead where `cargo xtask test` built, with the test profile, so CI
/// builds no dependency a second time.
fn mutants(job: &MutantsRun) -> Result<()> {
    setup::build_tools()?;
    let installed = Command::new("cargo")
        .args(["mutants", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        run(cargo().args(["install", "--locked", "cargo-mutants@27.1.0"]))?;
    }
    if job.iterate {
        keep_hangs(job.output.as_deref().unwrap_or(std::path::Path::new(".")))?;
    }
    run(&mut mutants_command(job))
}

/// The cargo-mutants command line for `job`.
fn mutants_command(job: &MutantsRun) -> Command {
    let workspace = structure::workspace();
    let mut cmd = cargo();
    cmd.env("LB_EBPF", "stub")
        .args(["mutants", "-p", "lb-userspace", "--no-shuffle"])
        .args(["--cargo-arg", "--lib"]);
    if job.slice {
        cmd.env("CARGO_TARGET_DIR", workspace.join("target"))
            .arg("--output")
            .arg(workspace.join("target/mutants-slice"));
    } else {
        if job.jobs > 1 {
            cmd.env_remove("CARGO_TARGET_DIR")
                .args(["--jobs", &job.jobs.to_string()]);
        } else {
            cmd.env("CARGO_TARGET_DIR", workspace.join("target/mutants"));
        }
        cmd.args(["--profile", "mutants"]);
    }
    // A mutant that hangs (a loop that never ends: a quarter of the
    // Maglev builder's do) is cut after `--timeout`, 30 s unless told.
    // The unit tests pass in 4.4 s idle; of 224 runs that did not hang,
    // none that passed took over 6.7 s while other builds shared the
    // cores. At 60 s the hangs took two thirds of the Maglev file's time.
    cmd.args(["--timeout", &job.timeout.to_string()])
        .args(["--build-timeout", "600"]);
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        cmd.env("RUST_TEST_THREADS", MUTANT_TEST_THREADS.to_string());
    }
    let default: Vec<&str> = if job.slice { SLICE.0 } else { MUTATED }.to_vec();
    let named: Vec<&str> = job.files.iter().map(String::as_str).collect();
    for f in if named.is_empty() { &default } else { &named } {
        cmd.args(["-f", f]);
    }
    if let Some(shard) = &job.shard {
        cmd.args(["--shard", shard, "--sharding", "round-robin"]);
    }
    if job.iterate {
        cmd.arg("--iterate");
    }
    if let Some(dir) = &job.output {
        cmd.arg("--output").arg(dir);
    }
    let test_args = mutant_test_args(job);
    if !test_args.is_empty() {
        cmd.args(["--", "--"]).args(test_args);
    }
    cmd
}

/// The arguments `job` gives each mutant's unit-test binary: its
/// `--filter` (or the slice's) and its `--skip`s.
fn mutant_test_args(job: &MutantsRun) -> Vec<String> {
    let mut args: Vec<String> = match &job.filter {
        Some(f) => vec![f.clone()],
        None if job.slice => SLICE.1.iter().map(|s| s.to_string()).collect(),
        None => Vec::new(),
    };
    for pattern in &job.skip {
        args.extend(["--skip".to_owned(), pattern.clone()]);
    }
    args
}

/// Before an `--iterate` run in `dir`: cargo-mutants tries every mutant
/// that timed out again, 30 s each, at every resume; a hang is a catch
/// (the tests never passed). So the hangs of the runs so far are added to
/// `dir/hung.txt`, the record of every hang, and to the list of caught
/// mutants the next run skips.
fn keep_hangs(dir: &std::path::Path) -> Result<()> {
    let out = dir.join("mutants.out");
    let read = |path: &std::path::Path| -> Result<Vec<String>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    };
    let hung = read(&out.join("timeout.txt"))?;
    for file in [dir.join("hung.txt"), out.join("previously_caught.txt")] {
        let mut lines = read(&file)?;
        let new: Vec<String> = hung
            .iter()
            .filter(|h| !lines.contains(h))
            .cloned()
            .collect();
        if new.is_empty() {
            continue;
        }
        lines.extend(new);
        std::fs::write(&file, lines.join("\n") + "\n")
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(())
}

fn build_bins() -> Result<()> {
    run(cargo().args(["build", "--workspace", "--exclude", "lb-ebpf", "--bins"]))
}

/// Runs a command and returns its standard output (stderr passes through).
fn capture(cmd: &mut Command) -> Result<String> {
    eprintln!("+ {cmd:?}");
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn bench(baseline: Option<&str>) -> Result<()> {
    setup::run(setup::Mode::IfMissing)?;
    if !setup::is_root() {
        bail!("the datapath benchmarks load XDP programs: run `cargo xtask bench` as root");
    }
    let scale_baseline = baseline.map(baseline_bins).transpose()?;
    let baseline = baseline.map(baseline_object).transpose()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "lb-userspace",
        "-p",
        "lb-tests",
        "--bins",
    ]))?;
    let mut lb_bench = Command::new("target/release/lb-bench");
    if let Some(object) = &baseline {
        lb_bench.env("LB_BENCH_BASELINE", object);
        // Its `lb-decap`, copied beside it.
        let name = object.file_name().unwrap_or_default().to_string_lossy();
        let decap = object.with_file_name(name.replacen("lb-xdp-", "lb-decap-", 1));
        if decap.is_file() {
            lb_bench.env("LB_BENCH_BASELINE_DECAP", decap);
        }
    }
    let datapath = capture(&mut lb_bench)?;
    let maglev = capture(cargo().args(["bench", "-q", "-p", "lb-userspace", "--bench", "maglev"]))?;
    let report = format!(
        "{datapath}## Maglev builder\n\n`cargo bench -p lb-userspace --bench maglev`: build time (median, min, max of 21 runs at M = 65537, 9 at M = 655373), the textbook population loop (the loop Katran runs) timed in the same runs and the ratio of the medians, share spread (largest relative deviation of a backend's slots from its weight share), slots moved when one backend is removed (median of 5) or added.\n\n```\n{}```\n",
        maglev
            .lines()
            .filter(|l| !l.trim().is_empty()
                && !l.starts_with("running")
                && !l.contains("test result"))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
    print!("{report}");
    let path = std::path::Path::new("BENCHMARKS.md");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = ("<!-- bench:begin -->", "<!-- bench:end -->");
    let updated = match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{begin}\n{report}{}", &text[..b], &text[e..]),
        _ => format!("{text}\n{begin}\n{report}{end}\n"),
    };
    std::fs::write(path, updated).context("writing BENCHMARKS.md")?;
    eprintln!("BENCHMARKS.md updated");
    scale(scale_baseline)
}

/// The control plane at scale (`lb-scale`, issue 19), written between
/// BENCHMARKS.md's scale markers.
fn scale(baseline: Option<(std::path::PathBuf, String)>) -> Result<()> {
    let mut lb_scale = Command::new("target/release/lb-scale");
    if let Some((dir, label)) = &baseline {
        lb_scale
            .env("LB_SCALE_BASELINE", dir)
            .env("LB_SCALE_BASELINE_LABEL", label);
    }
    let report = capture(&mut lb_scale)?;
    print!("{report}");
    let path = std::path::Path::new("BENCHMARKS.md");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = ("<!-- scale:begin -->", "<!-- scale:end -->");
    let updated = match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{begin}\n{report}{}", &text[..b], &text[e..]),
        _ => format!("{text}\n{begin}\n{report}{end}\n"),
    };
    std::fs::write(path, updated).context("writing BENCHMARKS.md")?;
    eprintln!("BENCHMARKS.md updated (scale)");
    Ok(())
}

/// A clean export of git revision `rev` under `target/bench-baseline/`;
/// returns the full commit and the export's directory.
fn baseline_export(rev: &str) -> Result<(String, std::path::PathBuf)> {
    let commit =
        capture(Command::new("git").args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")]))?;
    let commit = commit.trim().to_string();
    let src = std::env::current_dir()?
        .join("target/bench-baseline")
        .join(&commit);
    if !src.join("Cargo.toml").is_file() {
        std::fs::create_dir_all(&src)?;
        let archive = Command::new("git")
            .args(["archive", "--format=tar", &commit])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("git archive")?;
        run(Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&src)
            .stdin(archive.stdout.context("git archive's output")?))?;
    }
    Ok((commit, src))
}

/// Builds `lbd` and `lbctl` of git revision `rev` (release) from a clean
/// export, for `lb-scale`; returns their directory and a label.
fn baseline_bins(rev: &str) -> Result<(std::path::PathBuf, String)> {
    let (commit, src) = baseline_export(rev)?;
    // A target directory per revision: cargo names a workspace member's
    // units by its path within the workspace, so two revisions' `lbd`
    // built in one directory could share a stale build script's output
    // (the eBPF objects).
    let target_dir = std::env::current_dir()?
        .join("target/bench-baseline")
        .join(format!("target-{}", &commit[..12]));
    run(cargo()
        .current_dir(&src)
        .args(["build", "--release", "-p", "lb-userspace", "--bins"])
        .arg("--target-dir")
        .arg(&target_dir)
        // The export lies inside this checkout: keep git from naming this
        // checkout's commit as the export's.
        .env("GIT_CEILING_DIRECTORIES", src.parent().unwrap_or(&src)))?;
    let label = format!("lbd {} ({rev})", &commit[..12]);
    eprintln!(
        "baseline: {label} in {}",
        target_dir.join("release").display()
    );
    Ok((target_dir.join("release"), label))
}

/// Builds the `lb-xdp` object of git revision `rev` from a clean export of
/// that revision (under `target/bench-baseline/`), the way `lb-userspace`'s
/// build script builds the current one, and returns its path; its
/// `lb-decap` is copied beside it (`lb-decap-<commit>`).
fn baseline_object(rev: &str) -> Result<std::path::PathBuf> {
    let (commit, src) = baseline_export(rev)?;
    let commit = commit.as_str();
    let root = std::env::current_dir()?.join("target/bench-baseline");
    let target_dir = root.join("target");
    run(Command::new("rustup")
        .current_dir(&src)
        .args([
            "run",
            "nightly",
            "cargo",
            "build",
            "--package",
            "lb-ebpf",
            "--bins",
        ])
        .args([
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // What aya-build passes (lb-userspace/build.rs).
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        .env_remove("RUSTC")
        .env_remove("CARGO"))?;
    let mut copy = std::path::PathBuf::new();
    for name in ["lb-decap", "lb-xdp"] {
        let object = target_dir.join("bpfel-unknown-none/release").join(name);
        copy = root.join(format!("{name}-{commit}"));
        std::fs::copy(&object, &copy).with_context(|| format!("copying {}", object.display()))?;
        eprintln!("baseline: {name} of {commit} at {}", copy.display());
    }
    Ok(copy)
}

fn fuzz(packets: u64, seed: Option<u64>) -> Result<()> {
    setup::run(setup::Mode::IfMissing)?;
    if !setup::is_root() {
        bail!("the fuzzer runs frames through BPF_PROG_TEST_RUN: run `cargo xtask fuzz` as root");
    }
    run(cargo().args(["build", "--release", "-p", "lb-tests", "--bin", "lb-fuzz"]))?;
    let mut cmd = Command::new("target/release/lb-fuzz");
    cmd.args(["--packets", &packets.to_string()]);
    if let Some(seed) = seed {
        cmd.args(["--seed", &seed.to_string()]);
    }
    run(&mut cmd)
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
    setup::build_tools()?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(CLIPPY_USERSPACE))?;
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

#[cfg(test)]
mod tests {
    use super::{Cli, Task, keep_hangs, mutants_command};
    use clap::Parser;

    /// The cargo-mutants command `cargo xtask mutants ARGS` runs.
    fn mutants_for(args: &[&str]) -> std::process::Command {
        let cli = Cli::try_parse_from(["xtask", "mutants"].iter().chain(args)).unwrap();
        let Task::Mutants(job) = cli.task else {
            panic!("not a mutants run")
        };
        mutants_command(&job)
    }

    /// Its arguments.
    fn mutants_args(args: &[&str]) -> Vec<String> {
        let cmd = mutants_for(args);
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Its `CARGO_TARGET_DIR`: `Some(None)` when it is removed.
    fn target_dir(args: &[&str]) -> Option<Option<String>> {
        let cmd = mutants_for(args);
        cmd.get_envs()
            .find(|(k, _)| *k == "CARGO_TARGET_DIR")
            .map(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
    }

    /// Parallel jobs get a target directory each (a shared one made each
    /// job test the other's binary), and `--skip` reaches the test binary.
    #[test]
    fn jobs_build_apart_and_skips_reach_the_tests() {
        let shared = target_dir(&[]).flatten().expect("one shared directory");
        assert!(shared.ends_with("target/mutants"), "{shared}");
        assert_eq!(target_dir(&["--jobs", "2"]), Some(None));
        let args = mutants_args(&[
            "--jobs",
            "2",
            "--skip",
            "bgp::tests::",
            "--skip",
            "slow",
            "--timeout",
            "15",
        ]);
        let tail = args.iter().position(|a| a == "--").expect("test arguments");
        assert_eq!(
            args[tail..],
            ["--", "--", "--skip", "bgp::tests::", "--skip", "slow"]
        );
        let at = |flag: &str| &args[args.iter().position(|a| a == flag).unwrap() + 1];
        assert_eq!(
            (at("--jobs").as_str(), at("--timeout").as_str()),
            ("2", "15")
        );
        let slice = mutants_args(&["--slice"]);
        assert!(!slice.contains(&"--jobs".to_owned()), "{slice:?}");
        assert!(slice.ends_with(&["lifecycle::".to_owned(), "passive".to_owned()]));
        assert!(Cli::try_parse_from(["xtask", "mutants", "--slice", "--skip", "x"]).is_err());
    }

    /// A resumed run skips the hangs of the runs before it, and the record
    /// of hangs keeps each once.
    #[test]
    fn hangs_are_kept_once_and_skipped_by_the_next_run() {
        struct Removed(std::path::PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("xtask-hangs-{}", std::process::id()));
        let _guard = Removed(dir.clone());
        let out = dir.join("mutants.out");
        std::fs::create_dir_all(&out).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        keep_hangs(&dir).unwrap();
        assert!(
            !dir.join("hung.txt").exists(),
            "no run yet: nothing written"
        );
        std::fs::write(out.join("previously_caught.txt"), "a.rs:1:1: x\n").unwrap();
        std::fs::write(out.join("timeout.txt"), "b.rs:2:2: y\nc.rs:3:3: z\n").unwrap();
        keep_hangs(&dir).unwrap();
        keep_hangs(&dir).unwrap();
        assert_eq!(read("hung.txt"), "b.rs:2:2: y\nc.rs:3:3: z\n");
        assert_eq!(
            read("mutants.out/previously_caught.txt"),
            "a.rs:1:1: x\nb.rs:2:2: y\nc.rs:3:3: z\n"
        );
    }
}

//! `cargo xtask test`'s host suite. The unit tests and the kernel's
//! datapath suites run one binary at a time, as `cargo test` runs them
//! (the datapath suites make CPUs race each other and want them).
//! The end-to-end binaries of `lb-tests` mostly wait — on hold timers,
//! health probes, routers converging — and a whole run of them kept two
//! cores about 70% idle, so they run [`LANES`] at a time instead. Each
//! builds its rigs in namespaces named after its own process and pins
//! under names of its own, so binaries never share a resource (two tests
//! that must not overlap are in one binary and serialise themselves).
//!
//! Each binary's output goes to `target/test-logs/NAME.log` and is printed
//! whole when it ends, with its time; every binary runs even after one
//! fails, and the failures are named together at the end.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, run};

/// End-to-end binaries at once. Three keep both cores busy without
/// stacking more waiting rigs than the busiest test expects beside it.
pub const LANES: usize = 3;

/// Binaries started first because they take longest (about 110, 95 and
/// 90 s idle); the order changes only the wall time, never a result.
const LONGEST_FIRST: &[&str] = &["bfd", "passive", "health", "tier", "bgp"];

/// One test executable `cargo test --no-run` built.
#[derive(Clone, Debug)]
pub struct TestBinary {
    /// The member's directory name: `lb-userspace`, or `tests` for
    /// `lb-tests`.
    pub member: String,
    /// The member's directory, where `cargo test` runs its binaries.
    pub dir: PathBuf,
    /// The target's name (`forward`, `bfd`, …).
    pub name: String,
    /// An integration test (`tests/`, `e2e/`), not a unit test.
    pub integration: bool,
    pub exe: PathBuf,
}

/// Builds the binaries and every test executable of the workspace.
pub fn build_tests() -> Result<Vec<TestBinary>> {
    run(cargo().args(["build", "--workspace", "--exclude", "lb-ebpf", "--bins"]))?;
    let out = cargo()
        .args(["test", "--workspace", "--exclude", "lb-ebpf"])
        .args(["--no-run", "--message-format=json"])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the test binaries failed");
    }
    let mut tests = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name), Some(manifest)) = (
            msg["executable"].as_str(),
            msg["target"]["name"].as_str(),
            msg["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let dir = Path::new(manifest).parent().unwrap_or(Path::new("."));
        let member = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let kinds = msg["target"]["kind"].as_array();
        tests.push(TestBinary {
            member: member.to_string(),
            dir: dir.to_path_buf(),
            name: name.to_string(),
            integration: kinds.is_some_and(|k| k.iter().any(|k| k == "test")),
            exe: PathBuf::from(exe),
        });
    }
    Ok(tests)
}

/// The whole host suite: the unit tests and doc tests through `cargo
/// test`, the other integration binaries (the datapath suites) one at a
/// time, then the end-to-end ones in lanes. Every step selects the whole
/// workspace, so cargo unifies features once and builds nothing twice.
pub fn run_host_suite() -> Result<()> {
    let workspace = ["test", "--workspace", "--exclude", "lb-ebpf"];
    run(cargo().args(workspace).args(["--lib", "--bins"]))?;
    run(cargo().args(workspace).arg("--doc"))?;
    let (mut e2e, datapath): (Vec<TestBinary>, Vec<TestBinary>) = build_tests()?
        .into_iter()
        .filter(|t| t.integration)
        .partition(|t| t.member == "tests");
    let failed = lanes(&datapath, 1)?;
    if !failed.is_empty() {
        bail!("integration binaries failed: {}", failed.join(", "));
    }
    e2e.sort_by_key(|t| {
        let rank = LONGEST_FIRST.iter().position(|n| *n == t.name);
        (rank.unwrap_or(LONGEST_FIRST.len()), t.name.clone())
    });
    if e2e.is_empty() {
        bail!("cargo built no end-to-end binary of lb-tests");
    }
    let failed = lanes(&e2e, LANES)?;
    if !failed.is_empty() {
        bail!("end-to-end binaries failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The longest one test binary may run before it is killed and counted
/// failed, with its output so far: a hung one would otherwise show
/// nothing until CI's own limit. The longest runs about 5 minutes on 2
/// busy cores.
const BINARY_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// One binary running, with where its output goes.
struct Running {
    name: String,
    child: Child,
    log: PathBuf,
    started: Instant,
}

/// Runs `binaries` at most `width` at a time; returns the names of those
/// that failed.
fn lanes(binaries: &[TestBinary], width: usize) -> Result<Vec<String>> {
    let dir = Path::new("target/test-logs");
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut queue = binaries.iter();
    let mut running: Vec<Running> = Vec::new();
    let mut failed = Vec::new();
    let t0 = Instant::now();
    loop {
        while running.len() < width {
            let Some(next) = queue.next() else { break };
            match start(next, dir) {
                Ok(r) => running.push(r),
                Err(e) => {
                    // Not left running behind an error.
                    for r in &mut running {
                        let _ = r.child.kill();
                        let _ = r.child.wait();
                    }
                    return Err(e);
                }
            }
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            let over = running[i].started.elapsed() > BINARY_DEADLINE;
            if over {
                eprintln!(
                    "integration: {} still runs after {} s: killed",
                    running[i].name,
                    BINARY_DEADLINE.as_secs()
                );
                let _ = running[i].child.kill();
            }
            match running[i].child.try_wait()? {
                Some(status) => {
                    let done = running.swap_remove(i);
                    if !report(&done, status.success() && !over) {
                        failed.push(done.name);
                    }
                }
                None if over => {
                    let mut done = running.swap_remove(i);
                    let _ = done.child.wait();
                    report(&done, false);
                    failed.push(done.name);
                }
                None => i += 1,
            }
        }
    }
    eprintln!(
        "integration: {} binaries in {:.0} s, {} at a time; failed: {}",
        binaries.len(),
        t0.elapsed().as_secs_f64(),
        width,
        if failed.is_empty() {
            "none".to_string()
        } else {
            failed.join(", ")
        }
    );
    Ok(failed)
}

/// Starts one binary in its package's directory, as `cargo test` would.
fn start(t: &TestBinary, dir: &Path) -> Result<Running> {
    let log = dir.join(format!("{}.log", t.name));
    let out = File::create(&log).with_context(|| log.display().to_string())?;
    let err = out.try_clone()?;
    eprintln!("integration: starting {}/{}", t.member, t.name);
    let child = Command::new(&t.exe)
        .current_dir(&t.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {}", t.exe.display()))?;
    Ok(Running {
        name: t.name.clone(),
        child,
        log,
        started: Instant::now(),
    })
}

/// Prints a finished binary's whole output under one header; returns
/// whether it passed.
fn report(done: &Running, passed: bool) -> bool {
    let text = std::fs::read_to_string(&done.log).unwrap_or_default();
    println!(
        "\n===== {}: {} in {:.1} s (output also in {})\n{text}",
        done.name,
        if passed { "ok" } else { "FAILED" },
        done.started.elapsed().as_secs_f64(),
        done.log.display()
    );
    passed
}

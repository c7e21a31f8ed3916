//! `cargo xtask vmtest`: the kernel matrix. Boots Debian's own kernels —
//! 6.1 (Debian 12, the oldest lb supports) and 6.12 (Debian 13) — in QEMU
//! with systemd as PID 1 and a Debian 12 root ([`image`]), and runs there
//! the test binaries built on the host ([`job`]): every program's load,
//! the datapath suites, a slice of the differential fuzzer, end-to-end
//! rig tests and the systemd checks of the package (`tests/e2e/vm.rs`).
//!
//! Nested KVM does not work on the machines this runs on (guests hang
//! after "Probing EDD"), so the machine is emulated (QEMU's TCG, two
//! virtual CPUs on two threads): about 8x slower than the host here for
//! these tests. The slice is what `cargo xtask test` runs; `--full` runs
//! more of every suite.

mod image;
mod job;

use std::{
    collections::BTreeMap,
    io::{Read as _, Seek as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub use job::Depth;

use crate::run;

/// Which kernels to boot.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelChoice {
    /// Debian 12's kernel, the oldest lb supports.
    #[value(name = "6.1")]
    V6_1,
    /// Debian 13's.
    #[value(name = "6.12")]
    V6_12,
    /// Debian 11's, older than lb supports: what an older verifier makes
    /// of the programs (not part of `all`).
    #[value(name = "5.10")]
    V5_10,
    /// 6.1 and 6.12, what the suite runs.
    All,
}

impl KernelChoice {
    fn names(self) -> &'static [&'static str] {
        match self {
            KernelChoice::V6_1 => &["6.1"],
            KernelChoice::V6_12 => &["6.12"],
            KernelChoice::V5_10 => &["5.10"],
            KernelChoice::All => &["6.1", "6.12"],
        }
    }
}

/// How long one machine may run before it is stopped (and its run failed).
fn deadline(depth: Depth) -> Duration {
    match depth {
        // The 6.1 slice took 24-28 minutes in CI runs of 2026-12-04
        // (before it was made smaller): a net, not a figure.
        Depth::Slice => Duration::from_secs(40 * 60),
        Depth::Full => Duration::from_secs(150 * 60),
    }
}

/// Builds what the guest runs, boots each kernel in turn, prints the
/// matrix, and fails if any step failed on any kernel.
pub fn vmtest(kernels: KernelChoice, depth: Depth, only: &[String]) -> Result<()> {
    crate::setup::vm_tools()?;
    let started = Instant::now();
    let image = image::ensure()?;
    let tests = build_tests()?;
    let mut steps = job::steps(&tests, depth)?;
    if !only.is_empty() {
        for name in only {
            if !steps.iter().any(|s| s.name == *name) {
                bail!("no step {name}");
            }
        }
        steps.retain(|s| only.contains(&s.name));
    }
    let work = Path::new("target/vmtest")
        .canonicalize()
        .or_else(|_| {
            std::fs::create_dir_all("target/vmtest")?;
            Path::new("target/vmtest").canonicalize()
        })
        .context("target/vmtest")?;
    let deb = package(&work)?;
    let mut runs = Vec::new();
    for name in kernels.names() {
        let kernel = image
            .kernels
            .iter()
            .find(|k| k.name == *name)
            .with_context(|| format!("the image has no {name} kernel"))?;
        let out = work.join(name);
        // Once more if the guest died before its first step (said, with
        // its console); a step's failure is never retried.
        let here = job::on_kernel(&steps, name, depth);
        if here.is_empty() {
            eprintln!("vmtest: nothing for {name} in this slice (`--full` runs every step there)");
            continue;
        }
        let attempt = || boot(&image, kernel, &out, &here, &deb, depth);
        let run = match attempt() {
            Err(e) if e.downcast_ref::<NoStep>().is_some() => {
                eprintln!("vmtest: {e:#}\nvmtest: booting the {name} machine again");
                attempt()
            }
            other => other,
        };
        runs.push((run?, here));
    }
    let runs: Vec<Run> = runs
        .into_iter()
        .map(|(mut run, here)| {
            run.planned = here.iter().map(|s| s.name.clone()).collect();
            run
        })
        .collect();
    print_matrix(&runs);
    eprintln!(
        "vmtest: {} kernel(s) in {:.0} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            let missing = r
                .planned
                .iter()
                .filter(|s| !r.steps.iter().any(|o| o.name == **s))
                .map(move |s| format!("{}: {s} never ran", r.kernel));
            r.steps
                .iter()
                .filter(|o| o.rc != 0)
                .map(move |o| format!("{}: {} failed (rc {})", r.kernel, o.name, o.rc))
                .chain(missing)
        })
        .collect();
    if !failed.is_empty() {
        bail!("the kernel matrix failed: {}", failed.join("; "));
    }
    Ok(())
}

/// The test binaries by `package/target` name (`cargo test --no-run`),
/// the package named as cargo names it (`lb-tests` for `tests/`).
fn build_tests() -> Result<BTreeMap<String, PathBuf>> {
    let mut tests = BTreeMap::new();
    for t in crate::suite::build_tests()? {
        let package = match t.member.as_str() {
            "lb-userspace" => "lb-userspace",
            "tests" => "lb-tests",
            _ => continue,
        };
        tests.insert(format!("{package}/{}", t.name), t.exe);
    }
    Ok(tests)
}

/// The Debian package of the debug binaries, for the systemd checks.
fn package(work: &Path) -> Result<PathBuf> {
    let dir = work.join("deb");
    let _ = std::fs::remove_dir_all(&dir);
    crate::package::package(&crate::package::Options {
        profile: crate::package::Profile::Dev,
        bin_dir: Some(PathBuf::from("target/debug")),
        out: Some(dir.clone()),
    })?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            return Ok(path);
        }
    }
    bail!("no .deb in {}", dir.display())
}

/// One kernel's run.
struct Run {
    kernel: String,
    release: String,
    steps: Vec<job::Outcome>,
    /// The steps it was to run.
    planned: Vec<String>,
    total: Duration,
}

/// A guest that died before its first step: the guest kernel itself
/// (seen once on a loaded host: 6.12 oopsed at boot under emulation),
/// not a step's verdict.
#[derive(Debug)]
struct NoStep(String);

impl std::fmt::Display for NoStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoStep {}

/// Boots `kernel` on a fresh overlay of the image with the job in `out`,
/// echoes the job's log as it grows, and reads the outcomes.
fn boot(
    image: &image::Image,
    kernel: &image::BootKernel,
    out: &Path,
    steps: &[job::Step],
    deb: &Path,
    depth: Depth,
) -> Result<Run> {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out)?;
    let steps = snapshot(steps, out)?;
    std::fs::write(out.join("job.sh"), job::script(&steps))?;
    std::fs::copy(deb, out.join("lb.deb"))?;
    let disk = out.with_file_name(format!("{}.qcow2", kernel.name));
    let _ = std::fs::remove_file(&disk);
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&image.root)
        .arg(&disk))?;
    let src = std::env::current_dir()?;
    eprintln!(
        "vmtest: booting Linux {} ({}) under emulation",
        kernel.release, kernel.name
    );
    let started = Instant::now();
    let mut qemu = Machine(qemu(kernel, &disk, &src, out)?);
    let status = follow(&mut qemu.0, &out.join("log"), &kernel.name, deadline(depth))?;
    let total = started.elapsed();
    let _ = std::fs::remove_file(&disk);
    let log = std::fs::read_to_string(out.join("log")).unwrap_or_default();
    let (release, outcomes) = job::outcomes(&log)?;
    if outcomes.is_empty() {
        let console = std::fs::read_to_string(out.join("console.log")).unwrap_or_default();
        let tail: Vec<&str> = console.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(NoStep(format!(
            "the {} machine ran no step ({status}); its console ended:\n{}",
            kernel.name,
            tail.join("\n")
        ))
        .into());
    }
    if release != kernel.release {
        bail!(
            "the {} machine ran {release:?}, not {}",
            kernel.name,
            kernel.release
        );
    }
    Ok(Run {
        kernel: kernel.name.clone(),
        release,
        steps: outcomes,
        planned: Vec::new(),
        total,
    })
}

/// Where the output share is mounted in the guest.
const GUEST_OUT: &str = "/lb/out";

/// The binaries a run uses, hard-linked (copied where links fail) into
/// `out/bin` (the test binaries into `out/bin/deps`, so that they find
/// `lbd` and `lbctl` beside them as in `target/debug`): a build on the
/// host while the machine runs does not change what it runs. Returns the
/// steps with their programs at the guest's paths.
fn snapshot(steps: &[job::Step], out: &Path) -> Result<Vec<job::Step>> {
    let bin = out.join("bin");
    std::fs::create_dir_all(bin.join("deps"))?;
    let link = |from: &Path, to: &Path| -> Result<()> {
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        Ok(())
    };
    let debug = Path::new("target/debug");
    for name in ["lbd", "lbctl", "lb-bgp-probe"] {
        let from = debug.join(name);
        if from.is_file() {
            link(&from, &bin.join(name))?;
        }
    }
    let mut taken = Vec::new();
    for step in steps {
        let name = step
            .program
            .file_name()
            .context("a test binary has a name")?
            .to_owned();
        let to = bin.join("deps").join(&name);
        if !to.exists() {
            link(&step.program, &to)?;
        }
        taken.push(job::Step {
            name: step.name.clone(),
            env: step.env.clone(),
            program: Path::new(GUEST_OUT).join("bin/deps").join(&name),
            args: step.args.clone(),
        });
    }
    Ok(taken)
}

/// The QEMU process: emulated (TCG on two threads), no network but its
/// own namespaces, the checkout read-only and `out` writable over 9p.
fn qemu(kernel: &image::BootKernel, disk: &Path, src: &Path, out: &Path) -> Result<Child> {
    let append = format!(
        "root=/dev/vda rw console=ttyS0 panic=-1 quiet mitigations=off lb.src={}",
        src.display()
    );
    Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2"])
        .args(["-m", "3G", "-nic", "none", "-no-reboot"])
        .args(["-display", "none", "-monitor", "none"])
        .arg("-serial")
        .arg(format!("file:{}", out.join("console.log").display()))
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&kernel.initrd)
        .args(["-append", &append])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=qcow2", disk.display()))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=lbsrc,security_model=none,readonly=on",
            src.display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=lbout,security_model=none",
            out.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64")
}

/// A QEMU child, killed if still running when dropped.
struct Machine(Child);

impl Drop for Machine {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Prints the job's log as it grows (prefixed with the kernel) until the
/// machine powers off, or stops it at `limit`.
fn follow(
    qemu: &mut Child,
    log: &Path,
    name: &str,
    limit: Duration,
) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    let mut offset = 0u64;
    let mut partial = String::new();
    loop {
        if let Ok(mut f) = std::fs::File::open(log) {
            f.seek(std::io::SeekFrom::Start(offset))?;
            let mut chunk = String::new();
            offset += f.read_to_string(&mut chunk)? as u64;
            partial.push_str(&chunk);
            while let Some(end) = partial.find('\n') {
                eprintln!("[{name}] {}", &partial[..end]);
                partial.drain(..=end);
            }
        }
        if let Some(status) = qemu.try_wait()? {
            if !partial.is_empty() {
                eprintln!("[{name}] {partial}");
            }
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = qemu.kill();
            let status = qemu.wait()?;
            eprintln!(
                "vmtest: the {name} machine ran past {} min and was stopped",
                limit.as_secs() / 60
            );
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The matrix: one row per step, one column per kernel; then the output
/// of every failed step.
fn print_matrix(runs: &[Run]) {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        for o in &r.steps {
            if !names.contains(&o.name.as_str()) {
                names.push(&o.name);
            }
        }
    }
    let mut header = format!("{:<14}", "step");
    for r in runs {
        header.push_str(&format!(
            " | {:<28}",
            format!("{} ({})", r.kernel, r.release)
        ));
    }
    eprintln!("\nvmtest: kernel matrix\n{header}");
    for name in &names {
        let mut row = format!("{name:<14}");
        for r in runs {
            let cell = match r.steps.iter().find(|o| o.name == *name) {
                Some(o) if o.rc == 0 => format!("ok {:.0} s", o.millis as f64 / 1000.0),
                Some(o) if o.rc < 0 => "did not finish".to_string(),
                Some(o) => format!("FAILED (rc {}) {:.0} s", o.rc, o.millis as f64 / 1000.0),
                None => "not run".to_string(),
            };
            row.push_str(&format!(" | {cell:<28}"));
        }
        eprintln!("{row}");
    }
    let mut total = format!("{:<14}", "machine");
    for r in runs {
        total.push_str(&format!(
            " | {:<28}",
            format!("{:.0} s with boot", r.total.as_secs_f64())
        ));
    }
    eprintln!("{total}\n");
    for r in runs {
        for o in r.steps.iter().filter(|o| o.rc != 0) {
            let from = o.output.len().saturating_sub(80);
            eprintln!(
                "vmtest: {} on {} ({}), last lines:\n{}\n",
                o.name,
                r.kernel,
                r.release,
                o.output[from..].join("\n")
            );
        }
    }
}

//! What runs inside the virtual machine: a list of steps, each a test
//! binary built on the host (the checkout is shared at its own path) with
//! its arguments, written out as the guest's `job.sh`; and the reading of
//! the step results the job prints (`::end NAME RC MILLISECONDS`).

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use anyhow::{Context as _, Result, bail};

/// How much of the matrix a run covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// What `cargo xtask test` (and so `.ci/run`) runs on every kernel.
    Slice,
    /// `cargo xtask vmtest --full`: everything below, longer.
    Full,
}

/// One step: a name and a command line in the guest.
#[derive(Clone)]
pub struct Step {
    pub name: String,
    pub env: Vec<(String, String)>,
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// Frames of the differential fuzzer per kernel in the slice (the host
/// suite runs 400,000; emulation is ~8x slower).
const SLICE_FUZZ_FRAMES: u64 = 30_000;

/// The datapath suites, `BPF_PROG_TEST_RUN` over fixtures (root, no rig).
const DATAPATH: &[&str] = &[
    "golden",
    "parse",
    "forward",
    "icmp",
    "fragments",
    "hash_fields",
    "decap",
    "second_chance",
    "bfd",
    "quic",
];

/// End-to-end tests of `tests/e2e/main.rs` in the slice: 50 streaming
/// connections through `lbd`, a `kill -9` and a restart adopting the pins
/// (none breaks). The 300 connections of the weights test take over six
/// minutes under emulation: `--full` runs it (and the rest of the file).
const E2E_SLICE: &[&str] = &["kill_9_and_restart_keep_connections_and_runtime_changes"];

/// The kernel the slice runs most on: Debian 12's, the oldest lb
/// supports (and the one its package is built for).
const OLDEST: &str = "6.1";

/// What the slice runs on the oldest kernel: every program's load (the
/// verifier), the golden frames, the parser, forwarding, `lb_decap` (its
/// socket-lookup helpers), QUIC by connection ID, the fuzzer's slice, the
/// end-to-end restart and the package under systemd.
const ON_OLDEST: &[&str] = &[
    "load", "golden", "parse", "forward", "decap", "quic", "fuzz", "e2e", "systemd",
];

/// What the slice runs on the other kernels: every program's load, the
/// golden frames, the parser and the fuzzer's slice. The rest of the
/// datapath suites (ICMP, fragments, hash fields, second chance, BFD:
/// their verifier is `load`'s, their behaviour the host's kernel checks)
/// and, on 6.12, forwarding, decap, the end-to-end restart (328 s there)
/// and the systemd checks (the same Debian 12 root on every kernel) run
/// with `--full`: under emulation the whole matrix took over 40 minutes
/// of a CI run on 2026-12-04.
const ELSEWHERE: &[&str] = &["load", "golden", "parse", "fuzz"];

/// The steps of `steps` that kernel `name` runs at `depth`.
pub fn on_kernel(steps: &[Step], name: &str, depth: Depth) -> Vec<Step> {
    let slice = if name == OLDEST { ON_OLDEST } else { ELSEWHERE };
    steps
        .iter()
        .filter(|s| depth == Depth::Full || slice.contains(&s.name.as_str()))
        .cloned()
        .collect()
}

/// The steps of a run at `depth`, from the test binaries `tests` (by
/// target name; a datapath suite and an end-to-end one may share a name,
/// so those are keyed `lb-userspace/NAME` and `lb-tests/NAME`).
pub fn steps(tests: &BTreeMap<String, PathBuf>, depth: Depth) -> Result<Vec<Step>> {
    let bin = |key: &str| {
        tests
            .get(key)
            .cloned()
            .with_context(|| format!("no test binary {key} was built"))
    };
    let step = |name: &str, key: &str, args: &[&str]| -> Result<Step> {
        Ok(Step {
            name: name.into(),
            env: Vec::new(),
            program: bin(key)?,
            args: args.iter().map(|a| a.to_string()).collect(),
        })
    };
    // With its output: each program's verified instruction count.
    let mut steps = vec![step("load", "lb-userspace/load", &["--nocapture"])?];
    for suite in DATAPATH {
        steps.push(step(suite, &format!("lb-userspace/{suite}"), &[])?);
    }
    let frames = match depth {
        Depth::Slice => SLICE_FUZZ_FRAMES,
        Depth::Full => 200_000,
    };
    let mut fuzz = step(
        "fuzz",
        "lb-tests/fuzz",
        match depth {
            Depth::Slice => &["fixed_seed", "--exact"],
            Depth::Full => &[],
        },
    )?;
    fuzz.env.push(("LB_FUZZ_FRAMES".into(), frames.to_string()));
    steps.push(fuzz);
    let mut e2e: Vec<&str> = vec!["--test-threads", "1", "--nocapture"];
    match depth {
        Depth::Slice => {
            e2e.extend_from_slice(E2E_SLICE);
            e2e.push("--exact");
        }
        Depth::Full => {}
    }
    steps.push(step("e2e", "lb-tests/e2e", &e2e)?);
    if depth == Depth::Full {
        steps.push(step("concurrency", "lb-userspace/concurrency", &[])?);
        for suite in ["trace", "health", "scale"] {
            steps.push(step(
                suite,
                &format!("lb-tests/{suite}"),
                &["--test-threads", "1"],
            )?);
        }
    }
    let mut systemd = step(
        "systemd",
        "lb-tests/vm",
        &["--ignored", "--test-threads", "1", "--nocapture"],
    )?;
    let depth_name = match depth {
        Depth::Slice => "slice",
        Depth::Full => "full",
    };
    systemd
        .env
        .push(("LB_VM_DEPTH".into(), depth_name.to_string()));
    steps.push(systemd);
    Ok(steps)
}

/// `job.sh`: each step in turn (a failed one does not stop the rest),
/// framed by `::step NAME` and `::end NAME RC MS`; exits with the number
/// of failed steps.
pub fn script(steps: &[Step]) -> String {
    let mut s = String::from(
        "#!/bin/bash\n\
         set -u\n\
         export RUST_BACKTRACE=1 LB_VM_GUEST=1 LB_VM_OUT=/lb/out\n\
         echo \"::kernel $(uname -r)\"\n\
         failed=0\n\
         step() {\n  \
           local name=$1; shift\n  \
           local t0=$(date +%s%N)\n  \
           echo \"::step $name\"\n  \
           \"$@\"\n  \
           local rc=$?\n  \
           echo \"::end $name $rc $(( ($(date +%s%N) - t0) / 1000000 ))\"\n  \
           [ $rc -eq 0 ] || failed=$((failed + 1))\n\
         }\n",
    );
    for step in steps {
        let mut line = format!("step {} env", step.name);
        for (k, v) in &step.env {
            let _ = write!(line, " {k}={}", quote(v));
        }
        let _ = write!(line, " {}", quote(&step.program.to_string_lossy()));
        for a in &step.args {
            let _ = write!(line, " {}", quote(a));
        }
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str("exit $failed\n");
    s
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A step's outcome, read from the log.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: String,
    pub rc: i32,
    pub millis: u64,
    /// The step's own lines of the log.
    pub output: Vec<String>,
}

/// The exit status given to a step whose test binaries ran no test.
pub const NO_TEST_RAN: i32 = 125;

/// Whether a step's test binaries all said `running 0 tests`: a step that
/// picks its tests by exact name passes with none run if one is renamed.
/// A step that is no test binary (no such line) is not judged.
fn ran_no_test(output: &[String]) -> bool {
    let counts: Vec<u64> = output
        .iter()
        .filter_map(|l| {
            l.strip_prefix("running ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    !counts.is_empty() && counts.iter().all(|n| *n == 0)
}

/// The kernel release the guest printed and each step's outcome, from
/// the job's log. A step that started and never ended (the machine died
/// or was stopped) is reported with rc -1.
pub fn outcomes(log: &str) -> Result<(String, Vec<Outcome>)> {
    let mut kernel = String::new();
    let mut done = Vec::new();
    let mut current: Option<Outcome> = None;
    for line in log.lines() {
        if let Some(k) = line.strip_prefix("::kernel ") {
            kernel = k.to_string();
        } else if let Some(name) = line.strip_prefix("::step ") {
            current = Some(Outcome {
                name: name.to_string(),
                rc: -1,
                millis: 0,
                output: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("::end ") {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let (Some(mut o), [name, rc, ms]) = (current.take(), f.as_slice()) else {
                bail!("cannot read the step end {line:?}");
            };
            if o.name != *name {
                bail!("step {} ended as {name}", o.name);
            }
            o.rc = rc.parse()?;
            o.millis = ms.parse()?;
            if o.rc == 0 && ran_no_test(&o.output) {
                o.rc = NO_TEST_RAN;
                o.output
                    .push("vmtest: the step ran no test (a renamed test?): failed".into());
            }
            done.push(o);
        } else if let Some(o) = current.as_mut() {
            o.output.push(line.to_string());
        }
    }
    done.extend(current);
    Ok((kernel, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_runs_most_on_the_oldest_kernel_and_full_runs_everything() {
        let names = ["load", "forward", "icmp", "decap", "fuzz", "e2e", "systemd"];
        let steps: Vec<Step> = names
            .iter()
            .map(|n| Step {
                name: n.to_string(),
                env: Vec::new(),
                program: PathBuf::from("/bin/true"),
                args: Vec::new(),
            })
            .collect();
        let on = |kernel, depth| -> Vec<String> {
            on_kernel(&steps, kernel, depth)
                .into_iter()
                .map(|s| s.name)
                .collect()
        };
        assert_eq!(
            on("6.1", Depth::Slice),
            ["load", "forward", "decap", "fuzz", "e2e", "systemd"]
        );
        assert_eq!(on("6.12", Depth::Slice), ["load", "fuzz"]);
        assert_eq!(on("6.12", Depth::Full).len(), names.len());
        assert_eq!(on("6.1", Depth::Full).len(), names.len());
    }

    #[test]
    fn the_log_is_read_step_by_step() {
        let log = "::kernel 6.1.0-50-amd64\n::step load\nrunning 3 tests\n::end load 0 1200\n::step fuzz\nboom\n::end fuzz 101 900\n::step e2e\nhalf\n";
        let (kernel, steps) = outcomes(log).expect("reads");
        assert_eq!(kernel, "6.1.0-50-amd64");
        let got: Vec<(&str, i32, u64)> = steps
            .iter()
            .map(|s| (s.name.as_str(), s.rc, s.millis))
            .collect();
        assert_eq!(
            got,
            vec![("load", 0, 1200), ("fuzz", 101, 900), ("e2e", -1, 0)]
        );
        assert_eq!(steps[1].output, vec!["boom".to_string()]);
    }

    /// A step whose binaries ran no test fails, whatever its exit status;
    /// one that ran some, or is no test binary, keeps its own.
    #[test]
    fn a_step_that_ran_no_test_fails() {
        let log = "::step e2e\nrunning 0 tests\ntest result: ok. 0 passed\n::end e2e 0 10\n\
                   ::step load\nrunning 0 tests\nrunning 3 tests\n::end load 0 10\n\
                   ::step systemd\nunit started\n::end systemd 0 10\n";
        let (_, steps) = outcomes(log).expect("reads");
        let rcs: Vec<i32> = steps.iter().map(|s| s.rc).collect();
        assert_eq!(rcs, [NO_TEST_RAN, 0, 0]);
        assert!(steps[0].output.last().unwrap().contains("ran no test"));
    }

    #[test]
    fn arguments_are_quoted_for_the_shell() {
        let s = script(&[Step {
            name: "x".into(),
            env: vec![("A".into(), "it's".into())],
            program: "/p q/t".into(),
            args: vec!["a b".into()],
        }]);
        assert!(s.contains(r"step x env A='it'\''s' '/p q/t' 'a b'"), "{s}");
    }
}

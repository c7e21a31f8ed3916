//! The differential fuzzer of `lb_xdp` in the suite: 200,000 frames from a
//! fixed seed and 200,000 from a fresh one (printed, so a failure replays
//! with `cargo xtask fuzz --seed S --packets 200000`), each required to
//! break no invariant and to produce every class its generators aim at.
//! `LB_FUZZ_FRAMES` sets another count (`cargo xtask vmtest` runs a
//! smaller slice on each kernel of its matrix, under emulation).
//! Root: the frames go through `BPF_PROG_TEST_RUN`.

use lb_tests::fuzz;

const FRAMES: u64 = 200_000;

/// The frames per seed: [`FRAMES`], or `LB_FUZZ_FRAMES`.
fn frames() -> u64 {
    match std::env::var("LB_FUZZ_FRAMES") {
        Ok(n) => n.parse().expect("LB_FUZZ_FRAMES is a number of frames"),
        Err(_) => FRAMES,
    }
}
/// "lbfuzz".
const FIXED_SEED: u64 = 0x6c62_6675_7a7a;

fn fuzz_run(seed: u64) {
    let report = fuzz::run(&fuzz::Options {
        packets: frames(),
        seed,
        progress: 0,
    })
    .expect("the fuzzer runs: it needs root and a kernel with XDP test runs");
    eprintln!("{}", report.text());
    if let Some(found) = &report.found {
        panic!("seed {seed}: {}", found.text(seed));
    }
    // The classes are calibrated for FRAMES frames; a smaller slice checks
    // the invariants only.
    let missing = report.stats.missing();
    if frames() < FRAMES {
        eprintln!(
            "fuzz: {} frames, under {FRAMES}: class coverage not judged ({} classes missing)",
            frames(),
            missing.len()
        );
        return;
    }
    assert!(
        missing.is_empty(),
        "seed {seed}: classes the generators aim at never occurred: {}",
        missing.join("; ")
    );
}

#[test]
fn fixed_seed() {
    eprintln!("fuzz: fixed seed {FIXED_SEED}");
    fuzz_run(FIXED_SEED);
}

#[test]
fn fresh_seed() {
    let seed = fuzz::fresh_seed();
    eprintln!(
        "fuzz: fresh seed {seed} (replay: cargo xtask fuzz --seed {seed} --packets {})",
        frames()
    );
    fuzz_run(seed);
}

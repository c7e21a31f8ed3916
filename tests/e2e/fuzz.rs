//! The differential fuzzer of `lb_xdp` in the suite: 200,000 frames from a
//! fixed seed and 200,000 from a fresh one (printed, so a failure replays
//! with `cargo xtask fuzz --seed S --packets 200000`), each required to
//! break no invariant and to produce every class its generators aim at.
//! Root: the frames go through `BPF_PROG_TEST_RUN`.

use lb_tests::fuzz;

const FRAMES: u64 = 200_000;
/// "lbfuzz".
const FIXED_SEED: u64 = 0x6c62_6675_7a7a;

fn fuzz_run(seed: u64) {
    let report = fuzz::run(&fuzz::Options {
        packets: FRAMES,
        seed,
        progress: 0,
    })
    .expect("the fuzzer runs: it needs root and a kernel with XDP test runs");
    eprintln!("{}", report.text());
    if let Some(found) = &report.found {
        panic!("seed {seed}: {}", found.text(seed));
    }
    let missing = report.stats.missing();
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
        "fuzz: fresh seed {seed} (replay: cargo xtask fuzz --seed {seed} --packets {FRAMES})"
    );
    fuzz_run(seed);
}

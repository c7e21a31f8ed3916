//! `lb-fuzz`: the differential fuzzer of `lb_xdp` (see `lb_tests::fuzz`).
//! Runs N frames (default 10 million) from seed S (default: a fresh one,
//! printed first), prints the counts per class, the rate and the run time;
//! on a violation prints the seed, the frame's index and its smallest
//! reproducer and exits 1. Exits 2 if a class the generators aim at never
//! occurred in a run of at least 200,000 frames. Needs root.

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use lb_tests::fuzz;

#[derive(Parser)]
#[command(about = "Differential fuzzer of lb's XDP program (BPF_PROG_TEST_RUN, root)")]
struct Args {
    /// Frames to run.
    #[arg(long, default_value_t = 10_000_000)]
    packets: u64,
    /// Seed of the run (default: a fresh one, printed).
    #[arg(long)]
    seed: Option<u64>,
}

/// Below this many frames, missing coverage is not an error.
const COVERAGE_FRAMES: u64 = 200_000;

fn main() -> Result<ExitCode> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(fuzz::fresh_seed);
    println!("lb-fuzz: seed {seed}, {} frames", args.packets);
    let report = fuzz::run(&fuzz::Options {
        packets: args.packets,
        seed,
        progress: 1_000_000,
    })?;
    print!("{}", report.text());
    if report.found.is_some() {
        return Ok(ExitCode::from(1));
    }
    let missing = report.stats.missing();
    if !missing.is_empty() {
        println!("\nnever occurred: {}", missing.join("; "));
        if args.packets >= COVERAGE_FRAMES {
            return Ok(ExitCode::from(2));
        }
    }
    println!("\nno violations");
    Ok(ExitCode::SUCCESS)
}

//! Maglev build time and quality: `cargo bench -p lb-userspace --bench maglev`
//! (also run by `cargo xtask bench`). Prints one table; never fails on a
//! timing.
//!
//! For each M and N, equal and weighted (weights 1..=10, fixed pseudo-random
//! sequence): build time (median, min, max of 21 runs at M = 65537, 9 at
//! M = 655373), the textbook loop's time for the same table in the same
//! run (`build_textbook`, the loop Katran's C++ runs; runs alternate, so
//! host noise hits both alike) and the ratio of the medians, share spread
//! (largest relative deviation of a backend's slots from its weight
//! share), and slots moved (fraction of M whose owner changes) when one
//! backend is removed or added, as the median over 5 choices of backend.
//! The first line says whether the builder ran its AVX-512 paths.

use std::{net::IpAddr, time::Instant};

use lb::maglev::{MaglevBackend, MaglevTable, build, build_textbook, moved_slots};

fn backends(n: u32, weighted: bool) -> Vec<MaglevBackend> {
    let mut x = 0x2545_f491u32;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            MaglevBackend {
                addr: IpAddr::V4((0x0a00_0000 + i).into()),
                weight: if weighted { 1 + x % 10 } else { 1 },
            }
        })
        .collect()
}

fn spread(bs: &[MaglevBackend], m: u32) -> f64 {
    let t = build(bs, m).expect("build");
    let total: u64 = bs.iter().map(|b| b.weight as u64).sum();
    bs.iter()
        .zip(t.shares(bs.len()))
        .map(|(b, got)| {
            let want = m as f64 * b.weight as f64 / total as f64;
            (got as f64 - want).abs() / want
        })
        .fold(0.0, f64::max)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    println!(
        "builder: {}",
        if lb::maglev::uses_avx512() {
            "AVX-512 paths (detected at run time)"
        } else {
            "scalar (no AVX-512 on this CPU)"
        }
    );
    println!(
        "{:>7} {:>5} {:>8} | {:>9} {:>9} {:>9} | {:>9} {:>6} | {:>7} | {:>8} {:>8}",
        "M",
        "N",
        "weights",
        "build ms",
        "min",
        "max",
        "textbook",
        "ratio",
        "spread",
        "moved-1",
        "moved+1"
    );
    for m in [65_537u32, 655_373] {
        for n in [10u32, 100, 1000] {
            for weighted in [false, true] {
                let bs = backends(n + 1, weighted);
                let (base, extra) = bs.split_at(n as usize);
                let time = |f: fn(&[MaglevBackend], u32) -> MaglevTable| {
                    let t = Instant::now();
                    std::hint::black_box(f(base, m));
                    t.elapsed().as_secs_f64() * 1e3
                };
                let runs = if m < 100_000 { 21 } else { 9 };
                let (times, textbook): (Vec<f64>, Vec<f64>) = (0..runs)
                    .map(|_| {
                        (
                            time(|b, m| build(b, m).expect("build")),
                            time(|b, m| build_textbook(b, m).expect("build")),
                        )
                    })
                    .unzip();
                let min = times.iter().copied().fold(f64::MAX, f64::min);
                let max = times.iter().copied().fold(0.0, f64::max);
                let full = build(base, m).expect("build");
                let removed: Vec<f64> = (0..5)
                    .map(|k| {
                        let victim = (k * n as usize / 5) + 1;
                        let mut fewer = base.to_vec();
                        fewer.remove(victim.min(fewer.len() - 1));
                        let t = build(&fewer, m).expect("build");
                        moved_slots(&full, base, &t, &fewer) as f64 / m as f64
                    })
                    .collect();
                let added = {
                    let more: Vec<_> = base.iter().chain(extra).copied().collect();
                    let t = build(&more, m).expect("build");
                    moved_slots(&full, base, &t, &more) as f64 / m as f64
                };
                let (fast, slow) = (median(times), median(textbook));
                println!(
                    "{:>7} {:>5} {:>8} | {:>9.3} {:>9.3} {:>9.3} | {:>9.3} {:>6.2} | {:>6.2}% | {:>7.3}% {:>7.3}%",
                    m,
                    n,
                    if weighted { "1..10" } else { "equal" },
                    fast,
                    min,
                    max,
                    slow,
                    fast / slow,
                    spread(base, m) * 100.0,
                    median(removed) * 100.0,
                    added * 100.0
                );
            }
        }
    }
}

//! The datapath with a busy box's working set: a connection table of
//! [`BUCKETS`] buckets (128 MiB) prefilled with four million flows, and
//! the recent-SYN table full of live SYNs, so that a packet's bucket is a
//! random cache line of a table far beyond the CPU caches, as on a box
//! holding millions of connections. The small-table figures of
//! `datapath` hit one bucket over and over, which stays in L1.
//!
//! The hit classes cycle through their prefilled flows
//! (`BenchPacket::stamp_mod`: run `n` stamps the source address
//! `n mod flows`, plus one); the new-tuple classes stamp a fresh source
//! every run. Each class is printed with its ratio to the established hit
//! measured in the same run, and next to the small-table figures.
//!
//! Beside them, the flow hash alone ([`hash_ns`]), IPv4's and IPv6's:
//! how much of an IPv6 hit's extra cost the longer hash explains. The
//! floor beside them is measured here too: a chase of dependent loads
//! through random cache lines of a 128 MiB buffer without huge pages
//! ([`random_line_ns`]): what any path that must touch one random line of
//! a DRAM-sized table pays at least, when nothing overlaps the miss.

use anyhow::{Result, bail};
use aya::programs::{ProgramFd, TestRun as _, TestRunOptions};
use lb_common::{BENCH_HASH_CHAIN, Counter, consts::SYN_SLOTS};

use super::{Harness, Net, REPEAT, RUNS, XDP_PASS, XDP_TX, balancer, counters, tcp4, tcp6, udp4};

/// Connection-table buckets: 2²¹ cache lines of six ways, 128 MiB.
const BUCKETS: u32 = 1 << 21;

/// Source address offsets the harness stamps: IPv4's, and the last four
/// octets of IPv6's.
const SRC4: u32 = 26;
const SRC6: u32 = 34;

/// One packet class measured on the full table.
struct Class {
    class: &'static str,
    /// The small-table class it compares with (a prefix of its name).
    small: &'static str,
    frame: Vec<u8>,
    stamp: u32,
    /// Prefilled flows it cycles through (0: a new tuple every run, or
    /// the same one without a stamp).
    flows: u32,
    /// Runs of it sent before the rounds (see [`prefill`]).
    prefill: u32,
    counter: Counter,
}

/// A class's figures on the full table.
pub struct Measured {
    pub class: &'static str,
    pub small: &'static str,
    pub net: Net,
    /// The share of its packets that hit the connection table (hit
    /// classes: flows evicted by the fill's overflowing buckets miss).
    pub hit_share: Option<f64>,
}

fn classes() -> Vec<Class> {
    let class = |class, small, frame, stamp, flows: u32, counter| Class {
        class,
        small,
        frame,
        stamp,
        flows,
        // A hit class's flows twice (recorded, then confirmed); a fresh
        // tuple's class nothing; one packet of any other.
        prefill: match (flows, stamp) {
            (0, 0) => 1,
            (0, _) => 0,
            (flows, _) => 2 * flows,
        },
        counter,
    };
    vec![
        class(
            "established TCP, 2M flows in turn (connection-table hits, a random bucket each)",
            "established TCP",
            tcp4([10, 0, 0, 10], 2000, false),
            SRC4,
            2 << 20,
            Counter::FwdConntrack,
        ),
        class(
            "established TCP, one flow (its bucket stays cached)",
            "established TCP",
            tcp4([10, 0, 0, 10], 2100, false),
            0,
            0,
            Counter::FwdConntrack,
        ),
        class(
            "UDP, 1M flows in turn (table hits)",
            "UDP, table hit",
            udp4([10, 0, 0, 10], 5000),
            SRC4,
            1 << 20,
            Counter::FwdConntrack,
        ),
        class(
            "IPv6 VIP, 1M flows in turn (table hits)",
            "IPv6 VIP",
            tcp6(6000, false),
            SRC6,
            1 << 20,
            Counter::FwdConntrack,
        ),
        class(
            "IPv6 VIP, one flow (its bucket stays cached)",
            "IPv6 VIP",
            tcp6(6100, false),
            0,
            0,
            Counter::FwdConntrack,
        ),
        Class {
            // The recent-SYN table full of live SYNs first.
            prefill: 2 * SYN_SLOTS,
            ..class(
                "new flow by SYN (recent-SYN table full)",
                "new flow by SYN",
                tcp4([10, 0, 0, 10], 3500, true),
                SRC4,
                0,
                Counter::FwdMaglev,
            )
        },
        class(
            "TCP SYN of the same tuple again (a retransmission)",
            "TCP SYN of the same tuple",
            tcp4([10, 0, 0, 10], 4000, true),
            0,
            0,
            Counter::FwdMaglev,
        ),
        // It adds six million flows to the table over the run.
        class(
            "new flow: miss → Maglev → insert into the full table",
            "new flow: miss",
            tcp4([10, 0, 0, 10], 3000, false),
            SRC4,
            0,
            Counter::FwdMaglev,
        ),
    ]
}

/// Runs `frame` through the harness `runs` times in one call (the
/// prefill), stamped as the class says; every run must forward.
fn fill(h: &mut Harness, lb: &ProgramFd, c: &Class, runs: u32) -> Result<()> {
    h.cycle = c.flows;
    h.jump_to(lb)?;
    h.set_packet(&c.frame, c.stamp, 0)?;
    let r = h.prog("lb_bench")?.test_run(TestRunOptions {
        data_in: Some(&c.frame),
        repeat: runs,
        ..TestRunOptions::new()
    })?;
    if r.return_value != XDP_TX {
        bail!("{}: the prefill was not forwarded", c.class);
    }
    Ok(())
}

/// The prefill: every hit class's flows (four million in all, two per
/// bucket on average), each sent twice so that it is confirmed (a class
/// above the new flows the insert class adds, which then evict only their
/// own kind); twice as many SYNs of fresh tuples as the recent-SYN table
/// has slots; one packet of each unstamped class.
fn prefill(h: &mut Harness, lb: &ProgramFd, classes: &[Class]) -> Result<u32> {
    for c in classes.iter().filter(|c| c.prefill != 0) {
        fill(h, lb, c, c.prefill)?;
    }
    Ok(classes.iter().map(|c| c.flows).sum())
}

/// Packets counted per counter, summed over a class's batches.
type Deltas = Vec<u64>;

/// Checks that the class's packets took its path: a hit class's hits and
/// misses (a flow its bucket's overflow evicted, re-picked) add up; any
/// other class's counter moved once per run. Returns the hit share.
fn check(c: &Class, delta: &Deltas) -> Result<Option<f64>> {
    let delta = |k: Counter| delta[k as usize];
    let expected = u64::from(REPEAT) * RUNS as u64;
    let (moved, share) = if c.flows != 0 {
        let hits = delta(Counter::FwdConntrack);
        let share = hits as f64 / expected as f64;
        (hits + delta(Counter::FwdMaglev), Some(share))
    } else {
        // A fresh tuple whose tag matches a prefilled flow of its bucket
        // is taken for it: about 6 in 2³² per lookup (see `datapath`).
        let collisions = if c.stamp != 0 {
            delta(Counter::FwdConntrack).min(2)
        } else {
            0
        };
        (delta(c.counter) + collisions, None)
    };
    if moved != expected || share.is_some_and(|s| s < 0.98) {
        bail!(
            "{}: expected {expected} packets counted as {} (hits at least 98%); counted: {}",
            c.class,
            c.counter.name(),
            super::counted(&delta)
        );
    }
    Ok(share)
}

/// Every class on the full table, and the number of flows prefilled. The
/// classes take turns within each round, like the builds of `datapath`
/// (their order rotating), so that the host's drift stays out of their
/// ratios; each round starts with the empty program.
pub fn measure() -> Result<(Vec<Measured>, u32)> {
    let mut r = balancer(BUCKETS)?;
    let mut h = Harness::load()?;
    let lb = r.dataplane_mut().program().fd()?.try_clone()?;
    let empty = h.fd("bench_pass")?;
    let classes = classes();
    let flows = prefill(&mut h, &lb, &classes)?;
    let n = classes.len();
    let mut times = vec![Vec::new(); n + 1];
    let mut deltas: Vec<Deltas> = vec![vec![0; Counter::ALL.len()]; n];
    let plain = &classes[0].frame;
    for round in 0..RUNS {
        h.cycle = 0;
        h.jump_to(&empty)?;
        h.set_packet(plain, 0, 0)?;
        times[0].push(h.batch(plain, XDP_PASS)?);
        h.jump_to(&lb)?;
        for turn in 0..n {
            let i = (round + turn) % n;
            let c = &classes[i];
            h.cycle = c.flows;
            h.set_packet(&c.frame, c.stamp, 0)?;
            let before = counters(&r)?;
            times[i + 1].push(h.batch(&c.frame, XDP_TX)?);
            for (d, (a, b)) in deltas[i].iter_mut().zip(counters(&r)?.iter().zip(before)) {
                *d += a.packets - b.packets;
            }
        }
    }
    h.cycle = 0;
    let mut rows = Vec::new();
    for (i, c) in classes.iter().enumerate() {
        rows.push(Measured {
            class: c.class,
            small: c.small,
            net: Net::of(&times[i + 1], &times[0]),
            hit_share: check(c, &deltas[i])?,
        });
    }
    Ok((rows, flows))
}

/// Prints the full-table section; `small`: the small-table rows of the
/// same run, if it measured them.
pub fn print(small: Option<&[super::Row]>) -> Result<()> {
    let (rows, flows) = measure()?;
    let floor = random_line_ns()?;
    println!(
        "## Datapath with a full connection table (`cargo xtask bench`, {})",
        super::today()
    );
    println!();
    println!(
        "The connection table at {BUCKETS} buckets (128 MiB) prefilled with {flows} flows, the recent-SYN table with {} fresh SYNs; the hit classes take their prefilled flows in turn, so each packet's bucket is a random cache line of a table far beyond the caches. Net ns as in the section above; \"×\" is the class's cost (of minima) over the established hit of the same table measured in this run.",
        2 * SYN_SLOTS
    );
    println!();
    let hit = rows.first().map_or(f64::NAN, |r| r.net.of_minima);
    let small_hit = small.and_then(|s| of_minima(s, "established TCP"));
    println!(
        "| packet class | full: pairs median \\| min \\| max | full: of minima | × established hit (full) | small table: of minima | × established hit (small) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        let small_ns = small.and_then(|s| of_minima(s, r.small));
        let small_cell = small_ns.map_or("–".into(), |v| format!("{v:.0}"));
        let small_ratio = small_ns
            .zip(small_hit)
            .map_or("–".into(), |(v, h)| format!("{:.2}", v / h));
        let share = r
            .hit_share
            .map_or(String::new(), |s| format!(" ({:.2}% hits)", s * 100.0));
        println!(
            "| {}{share} | {} | {:.0} | {:.2} | {small_cell} | {small_ratio} |",
            r.class,
            super::ns_row(&r.net.pairs),
            r.net.of_minima,
            r.net.of_minima / hit,
        );
    }
    println!();
    let row = |prefix: &str| rows.iter().find(|r| r.class.starts_with(prefix));
    for (what, v6, v4) in [
        (
            "over their millions of flows",
            "IPv6 VIP, 1M",
            "established TCP, 2M",
        ),
        (
            "on one cached flow each",
            "IPv6 VIP, one",
            "established TCP, one",
        ),
    ] {
        if let (Some(v6), Some(v4)) = (row(v6), row(v4)) {
            println!(
                "An IPv6 hit costs {:.2}× an IPv4 hit {what} (of minima, the same rounds).",
                v6.net.of_minima / v4.net.of_minima
            );
        }
    }
    let [h4, h6, ct6] = hash_ns()?;
    let cached = row("established TCP, one").map_or(f64::NAN, |r| r.net.of_minima);
    println!(
        "The flow hashes alone, JIT-compiled (`bench_hash_v4`, `bench_hash_v6`, `bench_ct_hash_v6`: {BENCH_HASH_CHAIN} in a row, each from the one before, of minima): IPv4 {h4:.1} ns (a hit's and a new flow's); IPv6 {ct6:.1} ns for the connection-table hash a hit pays, {h6:.1} ns for the pinned hash a new flow pays as well. An IPv6 hit's hash costs {:+.1} ns against IPv4's, {:+.0}% of an IPv4 hit on one cached flow; the target lets an IPv6 hit cost 15% more in all.",
        ct6 - h4,
        100.0 * (ct6 - h4) / cached
    );
    println!();
    println!(
        "The floor: one dependent load of a random cache line of a 128 MiB buffer (4 KiB pages) costs {floor:.0} ns on this host (a pointer chase in userspace, best of three). A packet whose path must touch one random line of a DRAM-sized table pays that at least, unless the CPU overlaps it with other work: the established hit over 2M flows costs {:.2}× it.",
        hit / floor
    );
    println!();
    Ok(())
}

/// Nanoseconds of one IPv4 flow hash, one IPv6 flow hash and one IPv6
/// connection-table hash in the kernel: the bench object's hash chains,
/// net of the harness, over their length.
fn hash_ns() -> Result<[f64; 3]> {
    let mut h = Harness::load()?;
    let empty = h.fd("bench_pass")?;
    let v4 = h.fd("bench_hash_v4")?;
    let v6 = h.fd("bench_hash_v6")?;
    let ct6 = h.fd("bench_ct_hash_v6")?;
    let frame = tcp4([10, 0, 0, 10], 1000, false);
    h.set_packet(&frame, 0, 0)?;
    let times = h.rounds(&[&v4, &v6, &ct6], &empty, &frame, 0, XDP_PASS)?;
    let per_hash = |t: &[f64]| Net::of(t, &times[0]).of_minima / BENCH_HASH_CHAIN as f64;
    Ok([
        per_hash(&times[1]),
        per_hash(&times[2]),
        per_hash(&times[3]),
    ])
}

/// The of-minima figure of the small-table class named `prefix…`.
fn of_minima(rows: &[super::Row], prefix: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.class.starts_with(prefix))
        .map(|r| r.stat.of_minima)
}

/// The buffer of the floor's chase: as large as the full table.
const CHASE_BYTES: usize = 128 << 20;
const LINE: usize = 64;

/// Nanoseconds per dependent load of a random cache line of a 128 MiB
/// buffer (4 KiB pages, as the kernel's array maps have): the best of
/// three chases of two million steps through one random cycle over every
/// line (Sattolo's shuffle, a fixed seed).
pub fn random_line_ns() -> Result<f64> {
    let lines = CHASE_BYTES / LINE;
    // SAFETY: an anonymous private mapping, unmapped below; no other
    // reference to it exists.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHASE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        bail!(
            "mmap of {CHASE_BYTES} bytes: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: the mapping above; advice only.
    unsafe { libc::madvise(base, CHASE_BYTES, libc::MADV_NOHUGEPAGE) };
    // SAFETY: `lines` 64-byte lines of the mapping, 8-byte aligned (page
    // aligned), zeroed by the kernel, owned here until the munmap.
    let words = unsafe { std::slice::from_raw_parts_mut(base.cast::<usize>(), lines * 8) };
    let next = sattolo(lines);
    for (i, n) in next.iter().enumerate() {
        words[i * 8] = *n;
    }
    let mut best = f64::MAX;
    let mut at = 0usize;
    for _ in 0..3 {
        let steps = 2_000_000;
        let started = std::time::Instant::now();
        for _ in 0..steps {
            // SAFETY: `at` is a line index below `lines` (a permutation's).
            at = unsafe { std::ptr::read_volatile(&words[at * 8]) };
        }
        best = best.min(started.elapsed().as_nanos() as f64 / f64::from(steps));
    }
    std::hint::black_box(at);
    // SAFETY: the mapping above, no longer referenced (`words` ends here).
    unsafe { libc::munmap(base, CHASE_BYTES) };
    Ok(best)
}

/// A random cyclic permutation of `0..n` (Sattolo's algorithm, splitmix64
/// with a fixed seed): following it from any index visits every index.
fn sattolo(n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rand = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..n).rev() {
        let j = (rand() % i as u64) as usize;
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::sattolo;

    #[test]
    fn the_chase_visits_every_line_once() {
        let p = sattolo(1000);
        let (mut at, mut seen) = (0, vec![false; 1000]);
        for _ in 0..1000 {
            assert!(!seen[at], "line {at} visited twice");
            seen[at] = true;
            at = p[at];
        }
        assert_eq!(at, 0, "a single cycle returns to its start");
    }
}

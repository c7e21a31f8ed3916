//! Two CPUs forwarding at once through the one shared connection table:
//! concurrent inserts, evictions and lookups must never send a packet to
//! a backend other than its flow's. A way is one 8-byte word (tag and
//! backend handle) written and read whole, so a reader sees an old or a
//! new entry, never a tag with another flow's handle; this test tries
//! hard to catch the opposite.
//!
//! A 16-bucket table (96 ways) and two CPUs sending the same 150 flows
//! over and over, so that entries are displaced all the time. On each
//! CPU a `BPF_PROG_TEST_RUN` thread drives the benchmark harness
//! (`lb_bench`: it restores the frame and stamps the flow's source
//! address before each run, then tail-calls `lb_xdp`), 2 million packets
//! a round in batches, cycling through the flows: mostly packets of
//! established connections, every fourth batch SYNs. On a busy machine
//! the two threads may not run at the same time for long: rounds go on
//! until they have overlapped for [`MIN_OVERLAP`] in all (the overlap
//! measured, never assumed, and printed), up to [`MAX_ROUNDS`]. Each CPU reads the very entries
//! the other is writing, in the same sixteen cache lines, all the time.
//! The tables never change, so every packet must reach its flow's Maglev
//! backend, whether it came from the connection table, the recent SYNs
//! or the table: the per-backend packet counts must equal the counts the
//! flows' picks add up to, exactly. (Tags are 32 bits: two of the flows a
//! bucket sees sharing one would move a flow legitimately; this flow set
//! has none.)
//!
//! What it cannot show: an entry written as two 4-byte stores, on
//! purpose, passed this test (the two stores leave the other core a few
//! cycles, far less than a cache line takes to move between cores). The
//! guarantee against torn entries is the single aligned 8-byte store
//! (`conntrack::insert`, `FlowEntry`); this test is the guard against
//! everything coarser: lost or mixed-up entries between CPUs.
//!
//! What a lost race costs: two CPUs inserting into one bucket may pick
//! the same way, and the later store wins; the other flow's next packet
//! misses and is placed again by the Maglev table, to the same backend
//! unless the table changed in between (as after an eviction). A way's
//! stamp and entry are separate stores, so a race can pair one insert's
//! stamp with the other's entry: that orders evictions wrongly, never a
//! packet.

mod common;

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, ProgramArray},
    programs::{ProgramFd, TestRun, TestRunOptions, Xdp},
};
use common::{
    XDP_TX,
    packets::tcp4,
    xdp::{BACKENDS, Rig, TO_LB, V4_BACKENDS},
};
use lb::{dataplane::Dataplane, objects, predict::predict};
use lb_common::{BENCH_RESTORE_LEN, BenchPacket, Counter, FlowKey, consts::*};

const FLOWS: u32 = 150;
const BATCH: u32 = 100_000;
const BATCHES: u32 = 20;
/// How long the two CPUs must have raced, summed over rounds.
const MIN_OVERLAP: Duration = Duration::from_secs(1);
/// Rounds before giving up on a machine too busy to run two threads.
const MAX_ROUNDS: u64 = 30;
/// The source address's offset in the frame: the harness stamps it.
const SRC_OFFSET: u32 = 26;

/// The source port of the flows: both CPUs send the same flows, so that
/// one reads the very entries the other writes.
fn sport(_cpu: usize) -> u16 {
    40_000
}

fn pin_to_cpu(cpu: usize) -> i32 {
    // SAFETY: a zeroed cpu_set_t is valid and CPU_SET writes within it;
    // sched_setaffinity(0) and sched_getcpu act on the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning to CPU {cpu}"
        );
        libc::sched_getcpu()
    }
}

/// A harness of its own (its own frame and sequence) in front of `lb`.
fn harness(lb: &ProgramFd) -> Ebpf {
    let mut h = Ebpf::load(objects::LB_BENCH).expect("loading the bench object");
    let prog: &mut Xdp = h
        .program_mut("lb_bench")
        .expect("lb_bench")
        .try_into()
        .expect("XDP");
    prog.load().expect("loading lb_bench");
    let mut jump = ProgramArray::try_from(h.map_mut("BENCH_JUMP").expect("BENCH_JUMP"))
        .expect("a program array");
    jump.set(0, lb, 0).expect("BENCH_JUMP");
    h
}

fn set_frame(h: &mut Ebpf, frame: &[u8]) {
    let mut data = [0u8; BENCH_RESTORE_LEN];
    data.copy_from_slice(&frame[..BENCH_RESTORE_LEN]);
    let p = BenchPacket {
        len: frame.len() as u32,
        stamp_off: SRC_OFFSET,
        redirect_ifindex: 0,
        stamp_mod: FLOWS,
        data,
    };
    let mut map: Array<_, BenchPacket> =
        Array::try_from(h.map_mut("BENCH_PACKET").expect("BENCH_PACKET")).expect("an array");
    map.set(0, p, 0).expect("BENCH_PACKET");
}

/// One CPU's run; returns the CPU it ran on and when it started and ended.
fn send(lb: &ProgramFd, cpu: usize) -> (i32, Instant, Instant) {
    let on = pin_to_cpu(cpu);
    let mut h = harness(lb);
    let start = Instant::now();
    for batch in 0..BATCHES {
        let syn = batch % 4 == 0;
        let mut frame = tcp4(TO_LB, "10.0.0.10", 80, sport(cpu), syn, b"");
        frame.resize(frame.len().max(BENCH_RESTORE_LEN), 0);
        set_frame(&mut h, &frame);
        let prog: &Xdp = h
            .program("lb_bench")
            .expect("lb_bench")
            .try_into()
            .expect("XDP");
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(&frame),
                repeat: BATCH,
                ..TestRunOptions::new()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(r.return_value, XDP_TX, "CPU {cpu}, batch {batch}");
    }
    (on, start, Instant::now())
}

/// How many of 1..=total are `r` modulo `m`.
fn times(total: u64, m: u64, r: u64) -> u64 {
    match r {
        0 => total / m,
        r if r > total => 0,
        r => (total - r) / m + 1,
    }
}

/// Packets each backend of the TCP VIP must have received: flow `n` of
/// CPU `cpu` (source address `n`, for `n` in 1..=FLOWS) gets the packets
/// whose sequence number (1, 2, ...) is `n - 1` modulo FLOWS, and goes
/// to its Maglev pick.
fn expected(rig: &Rig) -> Vec<u64> {
    let total = u64::from(BATCH) * u64::from(BATCHES);
    let mut want = vec![0u64; V4_BACKENDS.len()];
    for cpu in 0..2 {
        for n in 1..=FLOWS {
            let seqs = times(total, u64::from(FLOWS), u64::from(n - 1));
            let flow = FlowKey::new(
                IpAddr::from(n.to_be_bytes()),
                "10.0.0.10".parse().expect("VIP"),
                PROTO_TCP,
                sport(cpu),
                80,
            );
            let pick = predict(rig.dp(), &flow, true)
                .expect("predict")
                .and_then(|p| p.backend)
                .and_then(|b| b.ip())
                .expect("a backend");
            let i = V4_BACKENDS
                .iter()
                .position(|&b| pick == BACKENDS[b].parse::<IpAddr>().expect("ip"))
                .expect("a TCP backend");
            want[i] += seqs;
        }
    }
    want
}

#[test]
fn two_cpus_inserting_and_reading_one_table_never_misdirect_a_flow() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs two CPUs to run the datapath on both at once ({cpus} here)"
    );
    let mut rig = Rig::new(16);
    let vips = rig.standard_vips();
    let lb = rig
        .r
        .dataplane_mut()
        .program()
        .fd()
        .expect("fd")
        .try_clone()
        .expect("dup");
    let (mut rounds, mut overlap, mut elapsed) = (0u64, Duration::ZERO, Duration::ZERO);
    let mut on = (0, 0);
    while overlap < MIN_OVERLAP && rounds < MAX_ROUNDS {
        let runs = std::thread::scope(|s| {
            let a = s.spawn(|| send(&lb, 0));
            let b = s.spawn(|| send(&lb, 1));
            [a.join().expect("CPU 0"), b.join().expect("CPU 1")]
        });
        assert_ne!(runs[0].0, runs[1].0, "the threads ran on two CPUs");
        on = (runs[0].0, runs[1].0);
        overlap += runs[0]
            .2
            .min(runs[1].2)
            .saturating_duration_since(runs[0].1.max(runs[1].1));
        elapsed += runs[0].2.max(runs[1].2) - runs[0].1.min(runs[1].1);
        rounds += 1;
    }
    // The CPUs really raced, for long enough.
    assert!(
        overlap >= MIN_OVERLAP,
        "the two CPUs overlapped only {overlap:?} in {rounds} rounds ({elapsed:?}): the machine \
         never ran both threads at once for long"
    );

    let got: Vec<u64> = V4_BACKENDS
        .iter()
        .map(|&b| {
            let index = rig.handle(&vips.tcp4, b) & BACKEND_INDEX_MASK;
            rig.dp().backend_stats(index).expect("stats").packets
        })
        .collect();
    let want: Vec<u64> = expected(&rig).iter().map(|n| n * rounds).collect();
    let sent = 2 * u64::from(BATCH) * u64::from(BATCHES) * rounds;
    assert_eq!(want.iter().sum::<u64>(), sent);
    assert_eq!(
        got, want,
        "packets per backend after {sent} packets from two CPUs"
    );
    let c = rig.counters();
    let evicted = c[Counter::CtEvicted as usize].packets;
    assert!(
        evicted > 100 * 96,
        "only {evicted} evictions in a 96-way table: no churn"
    );
    eprintln!(
        "{sent} packets of {} flows in {rounds} rounds on CPUs {} and {}, overlapping {overlap:?} of {elapsed:?}: \
         {evicted} evictions, {} connection-table hits, {} handshakes; per backend {got:?}, as the flows' picks add up",
        FLOWS,
        on.0,
        on.1,
        c[Counter::FwdConntrack as usize].packets,
        c[Counter::FwdHandshake as usize].packets,
    );
}

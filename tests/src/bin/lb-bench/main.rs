//! `lb-bench` (run by `cargo xtask bench`, as root): datapath cost per
//! packet class, the same on a connection table prefilled with millions of
//! flows (`full.rs`), forwarding rate on a veth (`forwarding.rs`), the
//! datapath on two CPUs at once (`multicore.rs`), table-write cost, and
//! memory; `LB_BENCH_ONLY` (any of datapath, full, forwarding, multicore,
//! decap, table, memory) picks parts. Prints markdown sections; never
//! fails on a timing, only on a broken measurement (wrong action, counters
//! that did not move).
//!
//! `second_chance` (a file of its own) measures `lb_decap` the same way.
//!
//! Per-packet costs use `BPF_PROG_TEST_RUN` with `repeat` through the
//! `lb_bench` harness, which restores the original frame before every run
//! and tail-calls the program under test; the harness's own cost (measured
//! by tail-calling an empty program in the same run) is subtracted: "net".

mod forwarding;
mod full;
mod multicore;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    maps::{Array, ProgramArray},
    programs::{ProgramFd, TestRun, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};
use etherparse::PacketBuilder;
use lb::{
    DatapathSettings, Reconciler,
    config::{BackendConfig, MalformedPolicy, QuicConfig, ServerId, VipConfig},
    dataplane::{Dataplane, KernelDataplane, Layout},
    objects,
};
use lb_common::{BENCH_RESTORE_LEN, BenchPacket, Counter, CounterValue};
use lb_tests::{
    netns::{Netns, unique, veth},
    rig::{Lbd, require_root},
    stat::Stat,
};

mod second_chance;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const REPEAT: u32 = 500_000;
/// A multiple of 2, 3 and 4, so that each program goes first equally often
/// in rounds of two (datapath A/B) and of three or four (forwarding).
const RUNS: usize = 12;

/// A program's net cost: the pairwise differences, and the difference of
/// the fastest batches (noise on a shared host only ever adds time, so the
/// minima are the steadiest estimate).
#[derive(Clone, Copy, Debug)]
struct Net {
    pairs: Stat,
    of_minima: f64,
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it;
    // sched_setaffinity(0) affects the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];

/// Frames of at least `BENCH_RESTORE_LEN` bytes (the harness restores that
/// many).
fn tcp4(dst: [u8; 4], sport: u16, syn: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 0, 2, 7], dst, 64)
        .tcp(sport, 80, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut out = vec![];
    b.write(&mut out, &[0x55; 60]).expect("build");
    out
}

fn udp4(dst: [u8; 4], sport: u16) -> Vec<u8> {
    udp4_to(dst, 53, sport, &[0x55; 60])
}

fn udp4_to(dst: [u8; 4], dport: u16, sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 0, 2, 7], dst, 64)
        .udp(sport, dport)
        .write(&mut out, payload)
        .expect("build");
    out
}

/// A short-header QUIC packet to the QUIC VIP (`10.0.0.10:443/udp`)
/// whose connection ID names server ID `00 02` (config 0), 60 bytes of
/// payload like the other frames.
fn quic_short(sport: u16) -> Vec<u8> {
    let mut payload = vec![0x40, 0x00, 0x00, 0x02, 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6];
    payload.resize(60, 0x55);
    udp4_to([10, 0, 0, 10], 443, sport, &payload)
}

fn tcp6(sport: u16, syn: bool) -> Vec<u8> {
    let dst: std::net::Ipv6Addr = "2001:db8::10".parse().expect("literal");
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(
            "2001:db8:c::7"
                .parse::<std::net::Ipv6Addr>()
                .expect("literal")
                .octets(),
            dst.octets(),
            64,
        )
        .tcp(sport, 80, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut out = vec![];
    b.write(&mut out, &[0x55; 40]).expect("build");
    out
}

/// The VIPs; `current`: this build's features, second chance on
/// 10.0.0.20:80 and QUIC routing on 10.0.0.10:443/udp (an earlier build,
/// without `LB_ALTERNATES` or `LB_QUIC_SERVERS`, gets the same VIPs
/// without them).
fn vips(n_backends: usize, current: bool) -> Vec<VipConfig> {
    let v4: Vec<BackendConfig> = (1..=n_backends)
        .map(|i| BackendConfig::new(format!("10.1.0.{i}").parse().expect("ip"), 1))
        .collect();
    let v6: Vec<BackendConfig> = (1..=n_backends)
        .map(|i| BackendConfig::new(format!("fd00:1::{i}").parse().expect("ip"), 1))
        .collect();
    vec![
        VipConfig::new("10.0.0.10:80/tcp".parse().expect("vip"), v4.clone()),
        VipConfig {
            second_chance: current,
            ..VipConfig::new("10.0.0.20:80/tcp".parse().expect("vip"), v4.clone())
        },
        VipConfig::new("10.0.0.10:53/udp".parse().expect("vip"), v4.clone()),
        quic_vip(v4, current),
        VipConfig::new("[2001:db8::10]:80/tcp".parse().expect("vip"), v6),
    ]
}

/// The QUIC VIP: server IDs `00 01`, `00 02`... with `quic` on.
fn quic_vip(mut backends: Vec<BackendConfig>, quic: bool) -> VipConfig {
    let id = "10.0.0.10:443/udp".parse().expect("vip");
    if !quic {
        return VipConfig::new(id, backends);
    }
    for (i, b) in backends.iter_mut().enumerate() {
        b.server_id = Some(ServerId(vec![0, i as u8 + 1]));
    }
    VipConfig {
        quic: Some(QuicConfig {
            server_id_len: 2,
            config_id: 0,
        }),
        ..VipConfig::new(id, backends)
    }
}

/// The balancer, programmed through the reconciler like `lbd` does.
fn balancer(ct_buckets: u32) -> Result<Reconciler<KernelDataplane>> {
    balancer_of(objects::LB_XDP, ct_buckets, true)
}

/// The balancer from `object` (this build's `lb-xdp` with second chance,
/// or a baseline's, without).
fn balancer_of(
    object: &[u8],
    ct_buckets: u32,
    second_chance: bool,
) -> Result<Reconciler<KernelDataplane>> {
    let layout = Layout {
        table_size: 65_537,
        max_vips: 16,
        max_backends: 64,
        ct_buckets,
        table_pool: 0,
        second_chance_vips: 2,
    };
    let mut r = Reconciler::adopt(KernelDataplane::load_object(object, layout, None)?)?;
    r.apply_settings(&DatapathSettings {
        gateway_mac: GW_MAC,
        outer_source_v4: Some("10.255.0.1".parse()?),
        outer_source_v6: Some("fd00:ff::1".parse()?),
        malformed: MalformedPolicy::Pass,
        ..Default::default()
    })?;
    r.apply(&vips(3, second_chance), &|_, _| true)?;
    Ok(r)
}

struct Harness {
    bench: Ebpf,
    /// Stamped runs cycle through this many flows (`BenchPacket::stamp_mod`;
    /// 0: a new flow every run).
    cycle: u32,
}

impl Harness {
    fn load() -> Result<Harness> {
        let mut h = Harness {
            bench: Ebpf::load(objects::LB_BENCH).context("loading the bench object")?,
            cycle: 0,
        };
        for name in [
            "lb_bench",
            "bench_pass",
            "bench_mac_swap",
            "bench_grow",
            "bench_gen",
            "bench_drop",
            "bench_bounce",
            "bench_hash_v4",
            "bench_hash_v6",
            "bench_ct_hash_v6",
        ] {
            h.xdp_mut(name)?
                .load()
                .with_context(|| format!("loading {name}"))?;
        }
        Ok(h)
    }

    fn prog(&self, name: &str) -> Result<&Xdp> {
        Ok(self.bench.program(name).context("program")?.try_into()?)
    }

    fn xdp_mut(&mut self, name: &str) -> Result<&mut Xdp> {
        Ok(self
            .bench
            .program_mut(name)
            .with_context(|| format!("{name} in the bench object"))?
            .try_into()?)
    }

    fn fd(&self, name: &str) -> Result<ProgramFd> {
        Ok(self.prog(name)?.fd()?.try_clone()?)
    }

    fn set_packet(&mut self, frame: &[u8], stamp_off: u32, redirect_ifindex: u32) -> Result<()> {
        if frame.len() < BENCH_RESTORE_LEN {
            bail!("bench frames must be at least {BENCH_RESTORE_LEN} bytes");
        }
        let mut data = [0u8; BENCH_RESTORE_LEN];
        data.copy_from_slice(&frame[..BENCH_RESTORE_LEN]);
        let p = BenchPacket {
            len: frame.len() as u32,
            stamp_off,
            redirect_ifindex,
            stamp_mod: self.cycle,
            data,
        };
        let mut map: Array<_, BenchPacket> =
            Array::try_from(self.bench.map_mut("BENCH_PACKET").context("BENCH_PACKET")?)?;
        map.set(0, p, 0)?;
        Ok(())
    }

    fn jump_to(&mut self, fd: &ProgramFd) -> Result<()> {
        let mut jump =
            ProgramArray::try_from(self.bench.map_mut("BENCH_JUMP").context("BENCH_JUMP")?)?;
        jump.set(0, fd, 0)?;
        Ok(())
    }

    /// One batch of `REPEAT` runs of the harness on `frame`: ns per run;
    /// checks the action.
    fn batch(&self, frame: &[u8], expect: u32) -> Result<f64> {
        let r = self.prog("lb_bench")?.test_run(TestRunOptions {
            data_in: Some(frame),
            repeat: REPEAT,
            ..TestRunOptions::new()
        })?;
        if r.return_value != expect {
            bail!("action {} instead of {expect}", r.return_value);
        }
        Ok(r.duration.as_nanos() as f64)
    }

    /// `RUNS` rounds on `frame`: in each, one batch of the harness with the
    /// empty program, then one with each of `targets`, their order rotating
    /// from round to round (going first after the empty program is worth a
    /// few ns). Returns the batch times, empty first. Taking turns within a
    /// round keeps the machine's drift (shared host, other core busy) out
    /// of the differences.
    fn rounds(
        &mut self,
        targets: &[&ProgramFd],
        empty: &ProgramFd,
        frame: &[u8],
        stamp_off: u32,
        expect: u32,
    ) -> Result<Vec<Vec<f64>>> {
        let mut times = vec![Vec::new(); targets.len() + 1];
        for round in 0..RUNS {
            self.jump_to(empty)?;
            self.set_packet(frame, 0, 0)?;
            times[0].push(self.batch(frame, XDP_PASS)?);
            for turn in 0..targets.len() {
                let i = (round + turn) % targets.len();
                self.jump_to(targets[i])?;
                self.set_packet(frame, stamp_off, 0)?;
                let t = self.batch(frame, expect)?;
                times[i + 1].push(t);
            }
        }
        Ok(times)
    }

    /// Net ns per packet of `target` on `frame` (see [`Net`]).
    fn net(
        &mut self,
        target: &ProgramFd,
        empty: &ProgramFd,
        frame: &[u8],
        stamp_off: u32,
        expect: u32,
    ) -> Result<Net> {
        let times = self.rounds(&[target], empty, frame, stamp_off, expect)?;
        Ok(Net::of(&times[1], &times[0]))
    }
}

impl Net {
    /// From per-round batch times of a program and of the empty one.
    fn of(target: &[f64], empty: &[f64]) -> Net {
        let min = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
        Net {
            pairs: Stat::of(target.iter().zip(empty).map(|(t, e)| t - e).collect()),
            of_minima: min(target) - min(empty),
        }
    }
}

/// Every counter that moved, with how much (`delta`), for an error.
fn counted(delta: &dyn Fn(Counter) -> u64) -> String {
    let seen: Vec<String> = Counter::ALL
        .iter()
        .filter(|&&c| delta(c) > 0)
        .map(|&c| format!("{} {}", c.name(), delta(c)))
        .collect();
    seen.join(", ")
}

fn counters(r: &Reconciler<KernelDataplane>) -> Result<Vec<CounterValue>> {
    Ok(r.dataplane().counters()?)
}

struct Row {
    class: &'static str,
    stat: Net,
    /// With `LB_BENCH_BASELINE`: the baseline build's net cost, and lb's
    /// batch minus the baseline's, averaged over pairs of rounds (one with
    /// each program first).
    baseline: Option<(Net, Stat)>,
}

/// `LB_BENCH_BASELINE=<path>`: another build of the `lb-xdp` object (say,
/// the previous commit's `target/release/build/lb-userspace-*/out/lb-xdp`),
/// measured in the same rounds as this one, for before/after figures that
/// the host's noise cannot fake. It must share this build's ABI: its maps,
/// config and counter numbering (it is programmed and checked as this
/// build's).
fn baseline_object() -> Result<Option<(String, Vec<u8>)>> {
    let Ok(path) = std::env::var("LB_BENCH_BASELINE") else {
        return Ok(None);
    };
    let object = std::fs::read(&path).with_context(|| format!("LB_BENCH_BASELINE={path}"))?;
    Ok(Some((path, object)))
}

/// Per-packet cost of each class, net of the harness.
fn datapath(baseline: Option<&[u8]>) -> Result<(Vec<Row>, Net, Stat)> {
    let mut r = balancer(1 << 21)?;
    let mut h = Harness::load()?;
    let lb = r.dataplane_mut().program().fd()?.try_clone()?;
    let mut base = baseline
        .map(|o| balancer_of(o, 1 << 21, false))
        .transpose()?;
    let base_fd = match &mut base {
        Some(b) => Some(b.dataplane_mut().program().fd()?.try_clone()?),
        None => None,
    };
    let empty = h.fd("bench_pass")?;
    let plain = tcp4([10, 0, 0, 10], 1000, false);

    // The harness alone, for the record.
    h.jump_to(&empty)?;
    h.set_packet(&plain, 0, 0)?;
    let harness = Stat::of(
        (0..RUNS)
            .map(|_| h.batch(&plain, XDP_PASS))
            .collect::<Result<_>>()?,
    );
    let swap = h.net(&h.fd("bench_mac_swap")?, &empty, &plain, 0, XDP_TX)?;

    // (class, frame, stamp offset, warm-up frames, action, counter)
    type Case = (&'static str, Vec<u8>, u32, Vec<Vec<u8>>, u32, Counter);
    let cases: Vec<Case> = vec![
        (
            "established TCP (connection-table hit)",
            tcp4([10, 0, 0, 10], 2000, false),
            0,
            vec![tcp4([10, 0, 0, 10], 2000, false)],
            XDP_TX,
            Counter::FwdConntrack,
        ),
        (
            "new flow: miss → Maglev → insert (2M-bucket table)",
            tcp4([10, 0, 0, 10], 3000, false),
            26,
            vec![],
            XDP_TX,
            Counter::FwdMaglev,
        ),
        (
            "new flow by SYN (2M-bucket table)",
            tcp4([10, 0, 0, 10], 3500, true),
            26,
            vec![],
            XDP_TX,
            Counter::FwdMaglev,
        ),
        (
            "TCP SYN of the same tuple again (a retransmission)",
            tcp4([10, 0, 0, 10], 4000, true),
            0,
            vec![],
            XDP_TX,
            Counter::FwdMaglev,
        ),
        (
            "UDP, table hit",
            udp4([10, 0, 0, 10], 5000),
            0,
            vec![udp4([10, 0, 0, 10], 5000)],
            XDP_TX,
            Counter::FwdConntrack,
        ),
        (
            "QUIC short header routed by its connection ID (a moved client: no table entry; baseline: UDP table hit)",
            quic_short(5500),
            0,
            vec![quic_short(5500)],
            XDP_TX,
            Counter::FwdQuicCid,
        ),
        (
            "IPv6 VIP, table hit",
            tcp6(6000, false),
            0,
            vec![tcp6(6000, false)],
            XDP_TX,
            Counter::FwdConntrack,
        ),
        (
            // The source address's last word stamped: a new tuple each.
            "new IPv6 flow by SYN (2M-bucket table)",
            tcp6(6500, true),
            34,
            vec![],
            XDP_TX,
            Counter::FwdMaglev,
        ),
        (
            "new IPv6 flow: miss → Maglev → insert (2M-bucket table)",
            tcp6(6600, false),
            34,
            vec![],
            XDP_TX,
            Counter::FwdMaglev,
        ),
        (
            "mid-flow TCP without entry, second chance: alternates, not recorded (2M-bucket table; baseline: miss → insert)",
            tcp4([10, 0, 0, 20], 8000, false),
            26,
            vec![],
            XDP_TX,
            Counter::FwdSecondChance,
        ),
        (
            "moved flow, steady state: second chance (alternates every packet; baseline: table hit)",
            tcp4([10, 0, 0, 20], 8200, false),
            0,
            vec![tcp4([10, 0, 0, 20], 8200, false)],
            XDP_TX,
            Counter::FwdSecondChance,
        ),
        (
            "established TCP of a second-chance VIP (connection-table hit)",
            tcp4([10, 0, 0, 20], 8500, false),
            0,
            // Its handshake: the SYN, then the ACK that records the flow.
            vec![
                tcp4([10, 0, 0, 20], 8500, true),
                tcp4([10, 0, 0, 20], 8500, false),
            ],
            XDP_TX,
            Counter::FwdConntrack,
        ),
        (
            "not a VIP → pass",
            tcp4([10, 9, 9, 9], 7000, false),
            0,
            vec![],
            XDP_PASS,
            Counter::PassNotVip,
        ),
    ];
    let mut rows = Vec::new();
    for (class, frame, stamp, warm, action, counter) in cases {
        let programs: Vec<&ProgramFd> = std::iter::once(&lb).chain(&base_fd).collect();
        for w in warm {
            for p in &programs {
                h.jump_to(p)?;
                h.set_packet(&w, 0, 0)?;
                let warm_run = h.prog("lb_bench")?.test_run(TestRunOptions {
                    data_in: Some(&w),
                    ..TestRunOptions::new()
                })?;
                if warm_run.return_value != XDP_TX {
                    bail!("{class}: the warm-up packet was not forwarded");
                }
            }
        }
        let balancers: Vec<&Reconciler<KernelDataplane>> =
            std::iter::once(&r).chain(&base).collect();
        let before: Vec<Vec<CounterValue>> = balancers
            .iter()
            .map(|b| counters(b))
            .collect::<Result<_>>()?;
        let times = h.rounds(&programs, &empty, &frame, stamp, action)?;
        let expected = u64::from(REPEAT) * RUNS as u64;
        for (i, (b, before)) in balancers.iter().zip(before).enumerate() {
            let after = counters(b)?;
            let delta = |c: Counter| after[c as usize].packets - before[c as usize].packets;
            let counter = if i == 0 {
                counter
            } else {
                baseline_counter(counter, stamp)
            };
            let moved = delta(counter);
            // A fresh flow whose bucket holds another flow with the same
            // 32-bit tag is taken for that flow (a connection-table hit):
            // at most 6 in 2³² per lookup, under 0.01 expected in the
            // millions of new flows here; three would be a 1-in-10⁷ event
            // (a weaker tag, more likely).
            let new_flows = [Counter::FwdMaglev, Counter::FwdSecondChance];
            let collisions = if new_flows.contains(&counter) && stamp != 0 {
                delta(Counter::FwdConntrack)
            } else {
                0
            };
            if moved + collisions != expected || collisions > 2 {
                bail!(
                    "{class}: expected {expected} packets counted as {}; counted: {}",
                    counter.name(),
                    counted(&delta)
                );
            }
            if collisions > 0 {
                eprintln!("{class}: {collisions} tag collision(s) in {expected} new flows");
            }
        }
        rows.push(Row {
            class,
            stat: Net::of(&times[1], &times[0]),
            baseline: times.get(2).map(|b| {
                // Two rounds, one with each program first, make one sample.
                let per_round: Vec<f64> = times[1].iter().zip(b).map(|(l, b)| l - b).collect();
                let samples = per_round.chunks(2).map(|c| c.iter().sum::<f64>() / 2.0);
                (Net::of(b, &times[0]), Stat::of(samples.collect()))
            }),
        });
    }
    Ok((rows, swap, harness))
}

/// What a baseline build (without second chance) counts where this one
/// counts `counter`: a second-chance miss is a new flow there, or, for
/// the same flow again (no stamp), a connection-table hit.
fn baseline_counter(counter: Counter, stamp: u32) -> Counter {
    match counter {
        Counter::FwdSecondChance if stamp != 0 => Counter::FwdMaglev,
        Counter::FwdSecondChance => Counter::FwdConntrack,
        Counter::FwdQuicCid => Counter::FwdConntrack,
        c => c,
    }
}

/// Writing a 65,537-slot table: lb's chunked half (65 map updates) and the
/// swap that publishes it, against one `bpf_map_update_elem` per slot.
fn table_write() -> Result<(Stat, Stat, Stat)> {
    let mut r = balancer(1 << 10)?;
    let mut h = Harness::load()?;
    let slots: Vec<u32> = (0..65_537u32).map(|i| 0x0001_0000 | (i % 3)).collect();
    let mut chunked = Vec::new();
    let mut publish = Vec::new();
    let mut per_slot = Vec::new();
    let key = lb_common::VipKey::new("10.0.0.10".parse()?, 80, 6);
    for _ in 0..RUNS {
        let dp = r.dataplane_mut();
        let t = Instant::now();
        dp.write_table(0, &slots)?;
        chunked.push(t.elapsed().as_secs_f64() * 1e3);
        let mut meta = dp.vip(&key)?.context("vip")?;
        let t = Instant::now();
        dp.publish_table(&key, &mut meta, Some(&slots))?;
        publish.push(t.elapsed().as_secs_f64() * 1e3);
        let mut map: Array<_, u32> =
            Array::try_from(h.bench.map_mut("BENCH_SLOTS").context("slots")?)?;
        let t = Instant::now();
        for (i, s) in slots.iter().enumerate() {
            map.set(i as u32, *s, 0)?;
        }
        per_slot.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((Stat::of(chunked), Stat::of(publish), Stat::of(per_slot)))
}

/// Kernel memory of the maps of `lbd`'s default layout (from the kernel's
/// own accounting in fdinfo), and `lbd`'s resident memory with 64 VIPs.
/// Per map: (name, bytes computed from the layout, bytes the kernel charges).
type MapMemory = Vec<(String, u64, u64)>;

fn memory() -> Result<(MapMemory, u64, u64)> {
    let layout = Layout::default();
    let before = map_memlock()?;
    let dp = KernelDataplane::load(layout)?;
    let after = map_memlock()?;
    let ncpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    let mut rows = Vec::new();
    for (name, computed) in layout.map_bytes(ncpus) {
        // The kernel keeps at most 15 characters of a map's name.
        let short = &name[..name.len().min(15)];
        let kernel =
            after.get(short).copied().unwrap_or(0) - before.get(short).copied().unwrap_or(0);
        rows.push((name.to_string(), computed, kernel));
    }
    drop(dp);
    let rss = lbd_rss()?;
    Ok((rows, rss.0, rss.1))
}

/// memlock of every map fd of this process by map name.
fn map_memlock() -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo")? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if let (Some(memlock), Some(id)) = (field("memlock:"), field("map_id:")) {
            let name = aya::maps::MapInfo::from_id(id.parse()?)
                .ok()
                .and_then(|i| i.name_as_str().map(str::to_string))
                .unwrap_or_default();
            *out.entry(name).or_default() += memlock.parse::<u64>().unwrap_or(0);
        }
    }
    Ok(out)
}

/// Starts the real `lbd` with 64 VIPs of 8 backends in a namespace and
/// reads its resident set size; returns (RSS KiB, VIPs).
fn lbd_rss() -> Result<(u64, u64)> {
    let ns = Netns::new(&unique("lbbenchd"))?;
    let other = Netns::new(&unique("lbbenchx"))?;
    veth(&ns, "eth0", &other, "eth0", 1500)?;
    ns.ip(&["addr", "add", "10.10.2.2/24", "dev", "eth0"])?;
    let dir = std::env::temp_dir().join(unique("lbbenchdir"));
    std::fs::create_dir_all(&dir)?;
    let instance = unique("bench");
    let mut yaml = format!(
        "instance: {instance}\ninterfaces: [eth0]\ngateway_mac: \"02:00:00:00:00:03\"\nouter_source_v4: 10.10.2.2\napi_socket: {d}/lbd.sock\nstate_file: {d}/state.json\nvips:\n",
        d = dir.display()
    );
    for v in 0..64 {
        yaml.push_str(&format!(
            "  - address: 10.99.{}.{}\n    port: 80\n    protocol: tcp\n    backends:\n",
            v / 200,
            v % 200 + 1
        ));
        for b in 0..8 {
            yaml.push_str(&format!(
                "      - address: 10.10.{}.{}\n",
                30 + b,
                v % 200 + 2
            ));
        }
    }
    let config = dir.join("lbd.yaml");
    std::fs::write(&config, yaml)?;
    let pins = Path::new("/sys/fs/bpf/lb").join(&instance);
    let result = (|| -> Result<(u64, u64)> {
        let lbd = Lbd::start_in(&ns, &dir, &config)?;
        std::thread::sleep(Duration::from_millis(500));
        let status = std::fs::read_to_string(format!("/proc/{}/status", lbd.pid()))?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("VmRSS")?;
        let vips = lbd.lbctl_json(&["status"])?["vips"].as_u64().unwrap_or(0);
        Ok((rss, vips))
    })();
    let _ = std::fs::remove_dir_all(&pins);
    let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb"));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn ns_row(s: &Stat) -> String {
    format!("{:>7.1} \\| {:>7.1} \\| {:>7.1}", s.median, s.min, s.max)
}

/// `LB_BENCH_ONLY=datapath,forwarding,multicore,decap,table,memory` runs only those parts
/// (all by default).
fn wanted(part: &str) -> bool {
    std::env::var("LB_BENCH_ONLY").map_or(true, |v| v.split(',').any(|p| p == part))
}

fn main() -> Result<()> {
    require_root()?;
    let started = Instant::now();
    pin_to_cpu(1);
    let small = if wanted("datapath") {
        Some(print_datapath()?)
    } else {
        None
    };
    if wanted("full") {
        full::print(small.as_deref())?;
    }
    if wanted("forwarding") {
        forwarding::print()?;
    }
    if wanted("multicore") {
        multicore::print_multicore()?;
    }
    if wanted("decap") {
        second_chance::print()?;
    }
    if wanted("table") {
        print_table_write()?;
    }
    if wanted("memory") {
        print_memory()?;
    }
    eprintln!("bench finished in {:.0}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn print_datapath() -> Result<Vec<Row>> {
    println!("## Datapath (`cargo xtask bench`, {})", today());
    println!();
    println!(
        "Net ns per packet, `BPF_PROG_TEST_RUN` through the restoring harness: {RUNS} pairs of {REPEAT}-repeat batches (the harness with an empty program, then with the program under test). \"pairs\": median \\| min \\| max of the per-pair differences. \"of minima\": fastest batch of the program minus fastest batch of the empty program (noise on a shared host only adds time, so this is the steadiest figure). Ratios appear only between things measured in this run (a baseline build below, the floor in the forwarding rate); figures from other programs or hosts never enter one (BENCHMARKS.md cites them with their host)."
    );
    println!();
    let baseline = baseline_object()?;
    let (rows, swap, harness) = datapath(baseline.as_ref().map(|(_, o)| &o[..]))?;
    println!("| packet class | lb pairs: median \\| min \\| max | lb of minima |");
    println!("| --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} |",
            r.class,
            ns_row(&r.stat.pairs),
            r.stat.of_minima,
        );
    }
    println!(
        "| trivial MAC swap + XDP_TX (floor) | {} | {:.0} |",
        ns_row(&swap.pairs),
        swap.of_minima
    );
    println!(
        "| harness alone (subtracted above) | {} | |",
        ns_row(&harness)
    );
    println!();
    let of = |prefix: &str| {
        rows.iter()
            .find(|r| r.class.starts_with(prefix))
            .map(|r| r.stat.of_minima)
    };
    if let (Some(quic), Some(udp)) = (of("QUIC short header"), of("UDP, table hit")) {
        println!(
            "A QUIC packet routed by its connection ID costs {:.2}× a UDP table hit (of minima, this run).",
            quic / udp
        );
        println!();
    }
    if let Some((path, _)) = baseline {
        println!(
            "Against the baseline build `{path}`, measured in the same rounds (\"lb − baseline\": lb's batch minus the baseline's, averaged over two rounds that each program started once; {} such samples; negative is faster).",
            RUNS / 2
        );
        println!();
        println!(
            "| packet class | baseline pairs: median \\| min \\| max | baseline of minima | lb − baseline: median \\| min \\| max | lb ÷ baseline (of minima) |"
        );
        println!("| --- | --- | --- | --- | --- |");
        for r in &rows {
            if let Some((net, diff)) = &r.baseline {
                println!(
                    "| {} | {} | {:.0} | {} | {:.2} |",
                    r.class,
                    ns_row(&net.pairs),
                    net.of_minima,
                    ns_row(diff),
                    r.stat.of_minima / net.of_minima,
                );
            }
        }
        println!();
    }
    Ok(rows)
}

fn print_table_write() -> Result<()> {
    let (chunked, publish, per_slot) = table_write()?;
    println!("## Writing a 65,537-slot Maglev table into the kernel");
    println!();
    println!("| method | ms (median \\| min \\| max) | speed-up over one syscall per slot |");
    println!("| --- | --- | --- |");
    println!(
        "| one `bpf_map_update_elem` per slot (u32 array) | {:.2} \\| {:.2} \\| {:.2} | 1 |",
        per_slot.median, per_slot.min, per_slot.max
    );
    println!(
        "| lb: 65 chunks of 1024 slots, one update each | {:.2} \\| {:.2} \\| {:.2} | {:.0}× |",
        chunked.median,
        chunked.min,
        chunked.max,
        per_slot.median / chunked.median
    );
    println!(
        "| lb: publish = write the inactive half + flip the VIP (atomic) | {:.2} \\| {:.2} \\| {:.2} | {:.0}× |",
        publish.median,
        publish.min,
        publish.max,
        per_slot.median / publish.median
    );
    println!();
    Ok(())
}

fn print_memory() -> Result<()> {
    let (maps, rss, vips) = memory()?;
    println!("## Memory");
    println!();
    println!(
        "Maps of the default layout (64 VIPs × 2 halves × M = 65537, 4096 backends, 262,144 connection-table buckets = 1,572,864 flows): bytes computed from the layout and bytes the kernel charges (fdinfo memlock)."
    );
    println!();
    println!("| map | computed | kernel |");
    println!("| --- | --- | --- |");
    let (mut tc, mut tk) = (0, 0);
    for (name, computed, kernel) in &maps {
        println!("| {name} | {computed} | {kernel} |");
        tc += computed;
        tk += kernel;
    }
    println!("| total | {tc} | {tk} |");
    println!();
    println!("`lbd` resident memory with {vips} VIPs of 8 backends: {rss} KiB.");
    println!();
    Ok(())
}

fn today() -> String {
    let out = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

//! Forwarding rate on a veth pair with native XDP, one core: the
//! generator and the receiving program share it, as on a real box's queue.
//! The receiving end (`lb0`) runs the program under test, which sends
//! every frame back (`XDP_TX`) to the generator's end (`gen0`). The
//! programs take turns within each round, the order rotating from round to
//! round, so that the host's drift (the machines are shared) and the
//! position in the round hit them all alike.
//!
//! Two generators, the same measurement:
//!
//! - **Live frames** (`BPF_F_TEST_XDP_LIVE_FRAMES`, batch 64): `bench_gen`
//!   writes each frame and redirects it into `gen0`; `bench_drop` on `gen0`
//!   drops what comes back. The kernel asks for `CAP_SYS_RESOURCE`.
//! - **The ring**, where live frames are refused (a container's root
//!   without `CAP_SYS_RESOURCE`): [`RING_FRAMES`] frames sent once into
//!   `gen0` by an `AF_PACKET` socket go back and forth: `bench_bounce` on
//!   `gen0` restores each frame and sends it back, and counts it. Both
//!   ends' NAPI polls run on the core that sent the frames; the rate is
//!   the count's growth over [`RING_WINDOW`].

use std::cell::RefCell;

use aya::maps::{MapData, PerCpuArray};
use lb_tests::flood::RawSocket;

use super::*;

/// Frames sent into the ring: a NAPI batch (64) in each direction, well
/// under the veth's 256-frame rings, so that none is dropped for room.
const RING_FRAMES: usize = 128;
/// How long a ring runs before its count is read the first time.
const RING_WARMUP: Duration = Duration::from_millis(20);
/// How long the ring's count is taken over.
const RING_WINDOW: Duration = Duration::from_millis(250);
/// How long a stopped ring is given to drop its frames.
const RING_DRAIN: Duration = Duration::from_millis(20);

/// Mpps per round of each program on the veth.
pub struct Forwarding {
    lb: Vec<f64>,
    floor: Vec<f64>,
    grow: Vec<f64>,
    /// With `LB_BENCH_BASELINE`: the baseline build of `lb_xdp`.
    baseline: Option<Vec<f64>>,
    /// Frames lb counted as forwarded.
    forwarded: u64,
    /// The ring harness ran (live frames were refused).
    ring: bool,
}

/// How frames reach the program under test.
enum Generator {
    Live(Vec<u8>),
    Ring(Box<Ring>),
}

/// The ring harness's socket and `bench_bounce`'s maps.
struct Ring {
    frame: Vec<u8>,
    socket: RawSocket,
    stop: RefCell<Array<MapData, u32>>,
    bounces: PerCpuArray<MapData, u64>,
}

impl Generator {
    /// Live frames if the kernel allows them here, else the ring; attaches
    /// the generator side's program to `gen0`.
    fn new(h: &mut Harness, frame: &[u8]) -> Result<Generator> {
        if live_frames_allowed(h, frame)? {
            h.xdp_mut("bench_drop")?.attach("gen0", XdpMode::Driver)?;
            return Ok(Generator::Live(frame.to_vec()));
        }
        h.xdp_mut("bench_bounce")?.attach("gen0", XdpMode::Driver)?;
        let take = |h: &mut Harness, name: &str| {
            h.bench
                .take_map(name)
                .with_context(|| format!("{name} in the bench object"))
        };
        let mut stop = Array::try_from(take(h, "BENCH_STOP")?)?;
        stop.set(0, 1, 0)?;
        Ok(Generator::Ring(Box::new(Ring {
            frame: frame.to_vec(),
            socket: RawSocket::open("gen0")?,
            stop: RefCell::new(stop),
            bounces: PerCpuArray::try_from(take(h, "BENCH_BOUNCES")?)?,
        })))
    }

    /// Mpps the program attached to `lb0` forwards.
    fn run(&self, h: &Harness) -> Result<f64> {
        match self {
            Generator::Live(frame) => {
                let n: u32 = 2_000_000;
                let start = Instant::now();
                h.prog("bench_gen")?.test_run(TestRunOptions {
                    data_in: Some(frame),
                    repeat: n,
                    attrs: TestRunAttrs::new().xdp_live_frames(64),
                    ..TestRunOptions::new()
                })?;
                Ok(n as f64 / start.elapsed().as_secs_f64() / 1e6)
            }
            Generator::Ring(ring) => ring.run(),
        }
    }
}

impl Ring {
    /// Frames bounced so far, over every CPU.
    fn bounced(&self) -> Result<u64> {
        Ok(self.bounces.get(&0, 0)?.iter().sum())
    }

    fn set_stop(&self, stop: bool) -> Result<()> {
        Ok(self.stop.borrow_mut().set(0, u32::from(stop), 0)?)
    }

    /// One round: starts the ring, counts over [`RING_WINDOW`], stops it.
    fn run(&self) -> Result<f64> {
        self.set_stop(false)?;
        let frames = vec![self.frame.as_slice(); RING_FRAMES];
        let mut sent = 0;
        for _ in 0..10 {
            sent += self.socket.send_batch(&frames[sent..])?;
            if sent == RING_FRAMES {
                break;
            }
        }
        std::thread::sleep(RING_WARMUP);
        let (first, start) = (self.bounced()?, Instant::now());
        std::thread::sleep(RING_WINDOW);
        let (last, took) = (self.bounced()?, start.elapsed());
        self.set_stop(true)?;
        std::thread::sleep(RING_DRAIN);
        let drained = self.bounced()?;
        std::thread::sleep(RING_DRAIN);
        if self.bounced()? != drained {
            bail!("the ring still ran {RING_DRAIN:?} after it was stopped");
        }
        if last == first {
            bail!("no frame went round the ring ({sent} of {RING_FRAMES} sent)");
        }
        Ok((last - first) as f64 / took.as_secs_f64() / 1e6)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The namespace's removal frees the frames too; this ends them
        // first.
        let _ = self.set_stop(true);
    }
}

/// Whether `BPF_F_TEST_XDP_LIVE_FRAMES` runs here: `EPERM` means no.
fn live_frames_allowed(h: &Harness, frame: &[u8]) -> Result<bool> {
    let run = h.prog("bench_gen")?.test_run(TestRunOptions {
        data_in: Some(frame),
        repeat: 64,
        attrs: TestRunAttrs::new().xdp_live_frames(64),
        ..TestRunOptions::new()
    });
    match run {
        Ok(_) => Ok(true),
        Err(aya::programs::ProgramError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::EPERM) =>
        {
            eprintln!("live frames refused (EPERM): the forwarding bench runs the ring");
            Ok(false)
        }
        Err(e) => Err(e).context("bpf_prog_test_run (live frames)"),
    }
}

/// The rates of lb, the floors and the baseline (see the module doc).
fn measure(baseline: Option<Vec<u8>>) -> Result<Forwarding> {
    let ns = Netns::new(&unique("lbbench"))?;
    let peer = Netns::new(&unique("lbbenchp"))?;
    veth(&ns, "gen0", &peer, "tmp0", 1500)?;
    // Move the peer end into the same namespace: both ends live in `ns`.
    peer.ip(&["link", "set", "tmp0", "netns", &ns.name, "name", "lb0"])?;
    ns.ip(&["link", "set", "lb0", "up"])?;
    drop(peer);
    let path = ns.path();
    std::thread::spawn(move || -> Result<Forwarding> {
        lb_tests::netns::enter_path(&path)?;
        pin_to_cpu(0);
        let mut lb = balancer(1 << 16)?;
        let mut base = baseline
            .map(|o| balancer_of(&o, 1 << 16, false))
            .transpose()?;
        let mut h = Harness::load()?;
        let frame = tcp4([10, 0, 0, 10], 9000, false);
        h.set_packet(&frame, 0, ifindex("gen0")?)?;
        let generator = Generator::new(&mut h, &frame)?;
        // A balancer's first frame puts the flow into its connection table.
        let before = counters(&lb)?;
        let programs = if base.is_some() { 4 } else { 3 };
        let mut rates = vec![Vec::new(); 4];
        for round in 0..RUNS {
            for turn in 0..programs {
                let i = (round + turn) % programs;
                let rate = match i {
                    0 => attach_and_run(&mut lb, &h, &generator)?,
                    3 => attach_and_run(base.as_mut().context("baseline")?, &h, &generator)?,
                    _ => {
                        let name = if i == 1 {
                            "bench_mac_swap"
                        } else {
                            "bench_grow"
                        };
                        let link = h.xdp_mut(name)?.attach("lb0", XdpMode::Driver)?;
                        let rate = generator.run(&h);
                        h.xdp_mut(name)?.detach(link)?;
                        rate?
                    }
                };
                rates[i].push(rate);
            }
        }
        let after = counters(&lb)?;
        let forwarded: u64 = [Counter::FwdConntrack, Counter::FwdMaglev]
            .iter()
            .map(|c| after[*c as usize].packets - before[*c as usize].packets)
            .sum();
        let baseline = rates.pop().filter(|b| !b.is_empty());
        let [lb, floor, grow] = <[Vec<f64>; 3]>::try_from(rates).expect("three");
        Ok(Forwarding {
            lb,
            floor,
            grow,
            baseline,
            forwarded,
            ring: matches!(generator, Generator::Ring(_)),
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("forwarding bench panicked"))?
}

/// Attaches `r`'s program to `lb0`, runs the generator, detaches.
fn attach_and_run(
    r: &mut Reconciler<KernelDataplane>,
    h: &Harness,
    generator: &Generator,
) -> Result<f64> {
    let link = r.dataplane_mut().program().attach("lb0", XdpMode::Driver)?;
    let rate = generator.run(h);
    r.dataplane_mut().program().detach(link)?;
    rate
}

/// Median over rounds of `a[i] / b[i]`.
fn ratio(a: &[f64], b: &[f64]) -> f64 {
    Stat::of(a.iter().zip(b).map(|(a, b)| a / b).collect()).median
}

fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        bail!("no interface {name}");
    }
    Ok(i)
}

/// Measures and prints the section.
pub fn print() -> Result<()> {
    let baseline = baseline_object()?;
    let f = measure(baseline.as_ref().map(|(_, o)| o.clone()))?;
    println!("## Forwarding rate on a veth pair, native XDP, one core");
    println!();
    if f.ring {
        println!(
            "The ring harness (live frames were refused here): {RING_FRAMES} frames sent into the veth go back and forth between the program under test, which sends each back (XDP_TX), and `bench_bounce`, which restores it and sends it back again. Mpps counted over {} ms, {RUNS} rounds per program, the programs taking turns within each round; the ratio is the median over rounds of the program's rate over the floor's in the same round. `bench_bounce` also shrinks back the 20 bytes a tunnelling program added: lb and the tunnelling floor pay that, the MAC-swap floor does not.",
            RING_WINDOW.as_millis()
        );
    } else {
        println!(
            "Live frames (`BPF_F_TEST_XDP_LIVE_FRAMES`, batch 64) redirected into a veth; the receiving end runs the program, which sends every frame back (XDP_TX) to a drop program. Mpps, {RUNS} rounds of 2M frames per program, the programs taking turns within each round; the ratio is the median over rounds of the program's rate over the floor's in the same round."
        );
    }
    println!();
    println!("| program | Mpps (median \\| min \\| max) | ratio to the floor |");
    println!("| --- | --- | --- |");
    let mut rows = vec![("lb_xdp (established flow)".to_string(), &f.lb)];
    if let (Some((path, _)), Some(b)) = (&baseline, &f.baseline) {
        rows.push((format!("baseline `{path}` (established flow)"), b));
    }
    rows.push(("MAC swap + XDP_TX (floor)".to_string(), &f.floor));
    rows.push((
        "grow the head by 20 bytes + MAC swap + XDP_TX (tunnelling floor)".to_string(),
        &f.grow,
    ));
    for (label, rates) in rows {
        let s = Stat::of(rates.clone());
        println!(
            "| {label} | {:.2} \\| {:.2} \\| {:.2} | {:.2} |",
            s.median,
            s.min,
            s.max,
            ratio(rates, &f.floor)
        );
    }
    println!();
    if let Some(b) = &f.baseline {
        println!(
            "lb over the baseline, median over rounds: {:.3}.",
            ratio(&f.lb, b)
        );
        println!();
    }
    println!(
        "lb over the tunnelling floor, median over rounds: {:.3}.",
        ratio(&f.lb, &f.grow)
    );
    println!();
    println!(
        "lb forwarded {} frames in those runs (its counters).",
        f.forwarded
    );
    println!();
    if f.forwarded == 0 {
        bail!("lb forwarded nothing on the veth: its rate is not a forwarding rate");
    }
    Ok(())
}

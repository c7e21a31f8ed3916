//! Second chance on the backend: `lb_decap`'s cost per packet through the
//! same restoring harness as the balancer's classes, in a network
//! namespace of its own that holds the connection the lookups find (an
//! established socket on loopback). Plain IP-in-IP and GUE as before,
//! against a baseline build of `lb_decap` (`LB_BENCH_BASELINE_DECAP`) when
//! given; the lists of second chance with their socket lookup, delivered
//! and handed on, which no earlier build has.

use std::net::{SocketAddr, TcpListener, TcpStream};

use lb::decap::Decap;
use lb_common::{
    consts::GUE_PORT,
    counters::{DECAP_COUNTER_SLOTS, DecapCounter},
};

use super::{Harness, Net, REPEAT, RUNS, Stat, XDP_PASS, XDP_TX, ns_row};
use anyhow::{Context as _, Result, bail};
use lb_tests::netns::{Netns, unique};

/// The backend's tunnel address and another backend's.
const BACKEND: [u8; 4] = [10, 1, 0, 1];
const OTHER: [u8; 4] = [10, 1, 0, 2];
const THIRD: [u8; 4] = [10, 1, 0, 3];
const BALANCER: [u8; 4] = [10, 255, 0, 1];

/// One packet class of `lb_decap`.
struct Class {
    name: &'static str,
    frame: Vec<u8>,
    action: u32,
    counter: DecapCounter,
    /// An earlier build handles it the same way (so it is compared).
    comparable: bool,
}

pub(super) struct Row {
    name: &'static str,
    stat: Net,
    baseline: Option<(Net, Stat)>,
}

/// The client's TCP segment from `from` to `to` (loopback addresses), an
/// ACK with 60 bytes: the IP packet only.
fn inner(from: SocketAddr, to: SocketAddr) -> Result<Vec<u8>> {
    let (SocketAddr::V4(f), SocketAddr::V4(t)) = (from, to) else {
        bail!("IPv4 loopback expected");
    };
    let mut out = vec![];
    etherparse::PacketBuilder::ipv4(f.ip().octets(), t.ip().octets(), 64)
        .tcp(f.port(), t.port(), 1, 65535)
        .ack(1)
        .write(&mut out, &[0x55; 60])?;
    Ok(out)
}

/// `packet` behind Ethernet, an outer IPv4 header from the balancer to the
/// backend with protocol `proto`, and `between` (a UDP header and GUE).
fn outer(packet: &[u8], proto: u8, between: &[u8]) -> Result<Vec<u8>> {
    let mut out = vec![2, 0, 0, 0, 0, 0x0b, 2, 0, 0, 0, 0, 0x0a, 0x08, 0x00];
    let mut h = etherparse::Ipv4Header::new(
        (between.len() + packet.len()) as u16,
        64,
        etherparse::IpNumber(proto),
        BALANCER,
        BACKEND,
    )?;
    h.header_checksum = h.calc_header_checksum();
    h.write(&mut out)?;
    out.extend_from_slice(between);
    out.extend_from_slice(packet);
    Ok(out)
}

/// GUE to the default port: variant 1 (no list), or variant 0 with lb's
/// list of `alternates`.
fn gue(packet: &[u8], alternates: &[[u8; 4]]) -> Result<Vec<u8>> {
    let mut gue = vec![];
    if !alternates.is_empty() {
        gue.extend_from_slice(&[1 + alternates.len() as u8, 4, 0, 0]);
        gue.extend_from_slice(&[0x4c, 0x42, 0, alternates.len() as u8]);
        for a in alternates {
            gue.extend_from_slice(a);
        }
    }
    let mut between = vec![];
    between.extend_from_slice(&0xc123u16.to_be_bytes());
    between.extend_from_slice(&GUE_PORT.to_be_bytes());
    between.extend_from_slice(&((8 + gue.len() + packet.len()) as u16).to_be_bytes());
    between.extend_from_slice(&[0, 0]);
    between.extend_from_slice(&gue);
    outer(packet, 17, &between)
}

fn classes(here: (SocketAddr, SocketAddr), stranger: SocketAddr) -> Result<Vec<Class>> {
    let local = inner(here.0, here.1)?;
    let away = inner(stranger, here.1)?;
    Ok(vec![
        Class {
            name: "IP-in-IP, decapsulated (as before)",
            frame: outer(&local, 4, &[])?,
            action: XDP_PASS,
            counter: DecapCounter::DecapIpip,
            comparable: true,
        },
        Class {
            name: "GUE, decapsulated (as before)",
            frame: gue(&local, &[])?,
            action: XDP_PASS,
            counter: DecapCounter::DecapGue,
            comparable: true,
        },
        Class {
            name: "GUE + 2 alternates, connection here: socket lookup, delivered",
            frame: gue(&local, &[OTHER, THIRD])?,
            action: XDP_PASS,
            counter: DecapCounter::DecapScLocal,
            comparable: false,
        },
        Class {
            name: "GUE + 2 alternates, no connection here: socket lookup, handed on",
            frame: gue(&away, &[OTHER, THIRD])?,
            action: XDP_TX,
            counter: DecapCounter::FwdScNextHop,
            comparable: false,
        },
    ])
}

fn loaded(decap: Option<&[u8]>) -> Result<Decap> {
    let mut d = match decap {
        Some(object) => Decap::load_build(object)?,
        None => Decap::load()?,
    };
    d.set_local_addrs(&[BACKEND.into()], GUE_PORT)?;
    Ok(d)
}

/// Every class through this build and, for the comparable ones, the
/// baseline's, in the same rounds; counters checked.
fn measure(baseline: Option<Vec<u8>>) -> Result<Vec<Row>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let server = listener.local_addr()?;
    let client = TcpStream::connect(server)?;
    let (_accepted, _) = listener.accept()?;
    let from = client.local_addr()?;
    let stranger = SocketAddr::new(from.ip(), from.port().wrapping_add(1));
    let mut h = Harness::load()?;
    let empty = h.fd("bench_pass")?;
    let mut lb = loaded(None)?;
    let mut base = baseline.as_deref().map(|o| loaded(Some(o))).transpose()?;
    let lb_fd = lb.program().fd()?.try_clone()?;
    let base_fd = match &mut base {
        Some(b) => Some(b.program().fd()?.try_clone()?),
        None => None,
    };
    let mut rows = Vec::new();
    for class in classes((from, server), stranger)? {
        let mut programs = vec![&lb_fd];
        if class.comparable
            && let Some(b) = &base_fd
        {
            programs.push(b);
        }
        let before = lb.counters()?;
        let times = h.rounds(&programs, &empty, &class.frame, 0, class.action)?;
        let after = lb.counters()?;
        check(&class, &before, &after)?;
        rows.push(Row {
            name: class.name,
            stat: Net::of(&times[1], &times[0]),
            baseline: times.get(2).map(|b| {
                let per_round: Vec<f64> = times[1].iter().zip(b).map(|(l, b)| l - b).collect();
                let samples = per_round.chunks(2).map(|c| c.iter().sum::<f64>() / 2.0);
                (Net::of(b, &times[0]), Stat::of(samples.collect()))
            }),
        });
    }
    drop(client);
    Ok(rows)
}

/// Every run counted as `class.counter`, nothing else.
fn check(
    class: &Class,
    before: &[lb_common::CounterValue],
    after: &[lb_common::CounterValue],
) -> Result<()> {
    let expected = u64::from(REPEAT) * RUNS as u64;
    for i in 0..DECAP_COUNTER_SLOTS as usize {
        let moved = after[i].packets - before[i].packets;
        let want = if i == class.counter as usize {
            expected
        } else {
            0
        };
        if moved != want {
            bail!(
                "{}: counter {i} moved by {moved}, expected {want} ({})",
                class.name,
                class.counter.name()
            );
        }
    }
    Ok(())
}

/// Runs the measurement in a namespace of its own (its loopback holds the
/// connection) and prints the section.
pub(super) fn print() -> Result<()> {
    let baseline = match std::env::var("LB_BENCH_BASELINE_DECAP") {
        Ok(path) => Some((
            path.clone(),
            std::fs::read(&path).with_context(|| format!("LB_BENCH_BASELINE_DECAP={path}"))?,
        )),
        Err(_) => None,
    };
    let ns = Netns::new(&unique("lbbenchsc"))?;
    ns.ip(&["link", "set", "lo", "up"])?;
    let path = ns.path();
    let object = baseline.as_ref().map(|(_, o)| o.clone());
    let rows = std::thread::spawn(move || -> Result<Vec<Row>> {
        lb_tests::netns::enter_path(&path)?;
        super::pin_to_cpu(1);
        measure(object)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("decap bench panicked"))??;
    println!("## Backend: `lb_decap` per packet (second chance)");
    println!();
    println!(
        "Net ns per packet through the same harness and rounds as the datapath above, in a namespace whose loopback holds the connection the lookups find. The lists carry two IPv4 alternates; \"handed on\" rewrites the outer addresses, the next index and the MACs and returns `XDP_TX`."
    );
    println!();
    println!("| packet class | pairs: median \\| min \\| max | of minima |");
    println!("| --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} |",
            r.name,
            ns_row(&r.stat.pairs),
            r.stat.of_minima
        );
    }
    println!();
    if let Some((path, _)) = baseline {
        println!(
            "Against the baseline build `{path}` (earlier builds cannot read the lists: only the classes they handle alike)."
        );
        println!();
        println!("| packet class | baseline of minima | lb − baseline: median \\| min \\| max |");
        println!("| --- | --- | --- |");
        for r in &rows {
            if let Some((net, diff)) = &r.baseline {
                println!("| {} | {:.0} | {} |", r.name, net.of_minima, ns_row(diff));
            }
        }
        println!();
    }
    Ok(())
}

//! Second-chance tests: the real programs in the kernel, driven with
//! `BPF_PROG_TEST_RUN`.
//!
//! The balancer (`lb_xdp`, programmed through the reconciler): a TCP packet
//! of a second-chance VIP that is not a SYN and has no connection-table
//! entry leaves as GUE variant 0 carrying exactly the alternates
//! `lb::predict` names (read back byte by byte), and is not recorded;
//! SYNs, packets with an entry, UDP and VIPs without second chance leave
//! as before, with no extra byte; the MTU check counts the largest
//! second-chance header for every packet of such a VIP.
//!
//! The backend (`lb_decap`), in a private network namespace whose sockets
//! its lookup sees (the test run's packets belong to the calling thread's
//! namespace): a packet whose connection is local (established, request
//! and time-wait sockets, an ACK with a valid SYN cookie) is delivered;
//! one with no local socket goes on to the next alternate, rewritten as
//! the wire format says; the hop limit ends a chain; SYNs and UDP are
//! delivered without a lookup; malformed lists are counted and dropped,
//! never sent on.
//!
//! Needs root; without it every test fails saying so.

mod common;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    time::Duration,
};

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, PacketBuilder};
use lb::{
    config::Encap,
    predict::{Via, predict},
};
use lb_common::{
    BackendDef, Counter,
    consts::{GUE_PORT, OUTER_TTL, PROTO_UDP, SC_MAX_OVERHEAD_V4, SC_MAX_OVERHEAD_V6},
    counters::DecapCounter,
};

use common::{
    XDP_TX,
    decap::DecapRig,
    ip,
    packets::{fix_ipv4_checksum, l2_len, tcp4, tcp6, udp4},
    require_root,
    xdp::{
        BACKENDS, GUE_TEST_PORT, GW_MAC, Rig, SRC_V4, SRC_V6, TO_LB, V4_BACKENDS, V6_BACKENDS,
        check_encapsulated, flow_of, gue_source_port, with_settings,
    },
};

// ---------------------------------------------------------------- balancer

/// VIPs with second chance (TCP over IPv4 and IPv6; UDP, which the
/// configuration refuses but the datapath must ignore anyway) and one
/// without.
struct Vips {
    tcp4: lb_common::VipKey,
    tcp6: lb_common::VipKey,
    udp4: lb_common::VipKey,
    plain: lb_common::VipKey,
}

const TCP4: &str = "10.0.0.90";
const TCP6: &str = "2001:db8::90";
const PLAIN: &str = "10.0.0.91";

/// A rig with the second-chance VIPs, backend 10.1.0.2 down: its flows'
/// table owner differs from their configured one.
fn balancer() -> (Rig, Vips) {
    let mut rig = Rig::new(1 << 12);
    let tcp4 = rig.add_vip("10.0.0.90:80/tcp", Encap::Ipip, true, &V4_BACKENDS);
    let tcp6 = rig.add_vip("[2001:db8::90]:80/tcp", Encap::Gre, true, &V6_BACKENDS);
    let udp4 = rig.add_vip("10.0.0.90:53/udp", Encap::Ipip, true, &V4_BACKENDS);
    let plain = rig.add_vip("10.0.0.91:80/tcp", Encap::Ipip, true, &V4_BACKENDS);
    for key in [&tcp4, &tcp6, &udp4] {
        rig.vip_mut(key).second_chance = true;
    }
    rig.apply();
    rig.mark_down(&tcp4, 1);
    (
        rig,
        Vips {
            tcp4,
            tcp6,
            udp4,
            plain,
        },
    )
}

/// What the reference says a packet of `frame` carries: its backend and
/// alternates (empty: none).
fn expected(rig: &Rig, frame: &[u8]) -> (BackendDef, Vec<BackendDef>, Via) {
    let (flow, syn) = flow_of(frame);
    let p = predict(rig.dp(), &flow, syn)
        .expect("predict")
        .expect("a VIP");
    (
        p.backend.expect("a backend"),
        p.alternates().copied().collect(),
        p.via,
    )
}

/// Asserts that `out` is `input` sent to `primary` with `alts`, as
/// ARCHITECTURE.md lays second chance out on the wire.
fn check_second_chance(input: &[u8], out: &[u8], primary: &BackendDef, alts: &[BackendDef]) {
    let l2 = l2_len(input);
    let (flow, _) = flow_of(input);
    let inner = &input[l2..];
    let inner_v4 = inner[0] >> 4 == 4;
    assert_eq!(out[0..6], GW_MAC, "to the gateway");
    assert_eq!(out[6..12], input[0..6], "from our own MAC");
    let (outer, addr_len) = match primary.ip().expect("backend") {
        IpAddr::V4(dst) => {
            let h = Ipv4HeaderSlice::from_slice(&out[l2..]).expect("outer IPv4");
            assert_eq!(h.destination_addr(), dst);
            assert_eq!(IpAddr::V4(h.source_addr()), ip(SRC_V4));
            assert_eq!((h.protocol().0, h.ttl()), (PROTO_UDP, OUTER_TTL));
            let header = h.to_header();
            assert_eq!(header.header_checksum, header.calc_header_checksum());
            (20, 4)
        }
        IpAddr::V6(dst) => {
            let h = Ipv6HeaderSlice::from_slice(&out[l2..]).expect("outer IPv6");
            assert_eq!(h.destination_addr(), dst);
            assert_eq!(IpAddr::V6(h.source_addr()), ip(SRC_V6));
            assert_eq!((h.next_header().0, h.hop_limit()), (PROTO_UDP, OUTER_TTL));
            (40, 16)
        }
    };
    let udp = &out[l2 + outer..];
    let list_len = 4 + alts.len() * addr_len;
    let be = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    assert_eq!(
        be(&udp[0..]),
        gue_source_port(&flow),
        "UDP source: flow hash"
    );
    assert_eq!(be(&udp[2..]), GUE_TEST_PORT, "UDP destination: gue_port");
    assert_eq!(be(&udp[4..]) as usize, 8 + 4 + list_len + inner.len());
    assert_eq!(be(&udp[6..]), 0, "no UDP checksum");
    let gue = &udp[8..];
    assert_eq!(gue[0] as usize, list_len / 4, "version 0, C 0, hlen");
    assert_eq!(gue[1], if inner_v4 { 4 } else { 41 }, "inner protocol");
    assert_eq!(gue[2..4], [0, 0], "no flags");
    let list = &gue[4..];
    assert_eq!(
        list[0..4],
        [0x4c, 0x42, 0, alts.len() as u8],
        "type LB, next, count"
    );
    for (i, alt) in alts.iter().enumerate() {
        let got = &list[4 + i * addr_len..4 + (i + 1) * addr_len];
        let want: Vec<u8> = match alt.ip().expect("alternate") {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        assert_eq!(got, want, "alternate {i}");
    }
    assert_eq!(&list[list_len..], inner, "inner packet byte-identical");
}

#[test]
fn alternates_ride_only_on_tcp_misses_that_are_not_syns() {
    let (mut rig, v) = balancer();
    let down = ip(BACKENDS[1]);
    let mut listed_down = 0;
    for (dst, family_len) in [(TCP4, 4), (TCP6, 16)] {
        for sport in 40_000..40_048 {
            let frame = if family_len == 4 {
                tcp4(TO_LB, dst, 80, sport, false, b"mid-flow")
            } else {
                tcp6(TO_LB, dst, 80, sport, false, b"mid-flow")
            };
            let (primary, alts, via) = expected(&rig, &frame);
            assert_eq!(via, Via::Maglev);
            assert!(!alts.is_empty(), "three backends: always an alternate");
            assert!(alts.iter().all(|a| a.handle != primary.handle));
            listed_down += alts.iter().filter(|a| a.ip() == Some(down)).count();
            // Twice: the flow is not recorded, so it stays a miss.
            for _ in 0..2 {
                let (action, out, _) = rig.run_counted(&frame, Counter::FwdSecondChance);
                assert_eq!(action, XDP_TX);
                check_second_chance(&frame, &out, &primary, &alts);
            }
        }
    }
    assert!(listed_down > 0, "a backend down here is still an alternate");

    // IPv6 with a destination-options header before TCP: no list (a
    // backend looks for TCP right after the fixed header, so the list
    // would cost its bytes and do nothing).
    let mut frame = tcp6(TO_LB, TCP6, 80, 40_100, false, b"mid-flow");
    frame[20] = 60;
    let payload_len = u16::from_be_bytes([frame[18], frame[19]]) + 8;
    frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
    frame.splice(54..54, [6u8, 0, 1, 4, 0, 0, 0, 0]);
    let (action, _, _) = rig.run_counted(&frame, Counter::FwdMaglev);
    assert_eq!(action, XDP_TX);

    // A SYN, then its handshake's ACK (placed here: recorded, no list),
    // then the flow's next packet (an entry): as without second chance.
    let syn = tcp4(TO_LB, TCP4, 80, 41_000, true, b"");
    let (primary, _, _) = expected(&rig, &syn);
    let (_, out, _) = rig.run_counted(&syn, Counter::FwdMaglev);
    check_encapsulated(&syn, &out, &primary, 0);
    let ack = tcp4(TO_LB, TCP4, 80, 41_000, false, b"");
    let (_, out, _) = rig.run_counted(&ack, Counter::FwdHandshake);
    check_encapsulated(&ack, &out, &primary, 0);
    let data = tcp4(TO_LB, TCP4, 80, 41_000, false, b"after");
    let (_, out, _) = rig.run_counted(&data, Counter::FwdConntrack);
    check_encapsulated(&data, &out, &primary, 0);

    // UDP, and a VIP without second chance: as before.
    for (frame, vip) in [
        (udp4(TO_LB, TCP4, 53, 41_001, b"dns"), v.udp4),
        (tcp4(TO_LB, PLAIN, 80, 41_002, false, b"x"), v.plain),
    ] {
        let (primary, alts, _) = expected(&rig, &frame);
        assert!(alts.is_empty(), "{vip:?}");
        let (_, out, _) = rig.run_counted(&frame, Counter::FwdMaglev);
        check_encapsulated(&frame, &out, &primary, 0);
    }
    let _ = (v.tcp4, v.tcp6);
}

/// A TCP packet from the client with an IP packet of `ip_len` bytes and DF.
fn big_tcp4(dst: &str, sport: u16, ip_len: usize, syn: bool) -> Vec<u8> {
    let mut f = tcp4(TO_LB, dst, 80, sport, syn, &vec![0xab; ip_len - 40]);
    f[20] |= 0x40;
    fix_ipv4_checksum(&mut f, 14);
    f
}

#[test]
fn the_mtu_check_counts_the_largest_second_chance_header() {
    let (mut rig, _) = balancer();
    with_settings(&mut rig, |s| s.mtu = 1400);
    let fits_plain = 1400 - 20;
    for (dst, counter_if_fits) in [
        (PLAIN, Counter::FwdHandshake),
        (TCP4, Counter::ReplyFragNeeded),
    ] {
        // Its SYN went out from here, so the big packet is its handshake's
        // ACK: second chance would not even list alternates for it.
        rig.run(&big_tcp4(dst, 42_000, 60, true));
        let big = big_tcp4(dst, 42_000, fits_plain, false);
        let (action, out, _) = rig.run_counted(&big, counter_if_fits);
        assert_eq!(action, XDP_TX, "{dst}");
        if counter_if_fits == Counter::ReplyFragNeeded {
            let mtu = u16::from_be_bytes([out[14 + 20 + 6], out[14 + 20 + 7]]);
            assert_eq!(mtu as usize, 1400 - SC_MAX_OVERHEAD_V4, "{dst}");
        }
    }
    // What fits the largest header goes, with its alternates if a miss.
    let fits = big_tcp4(TCP4, 42_001, 1400 - SC_MAX_OVERHEAD_V4, false);
    let (primary, alts, _) = expected(&rig, &fits);
    let (_, out, _) = rig.run_counted(&fits, Counter::FwdSecondChance);
    check_second_chance(&fits, &out, &primary, &alts);
    assert!(out.len() - 14 <= 1400, "within the MTU");
    assert_eq!(SC_MAX_OVERHEAD_V6, 40 + 8 + 4 + 4 + 48);
}

// ---------------------------------------------------------------- backend

/// The backend's own addresses (tunnel endpoints) and two others.
const BACKEND_V4: &str = "10.1.0.1";
const OTHER_V4: &str = "10.1.0.2";
const THIRD_V4: &str = "10.1.0.3";
const BACKEND_V6: &str = "fd00:1::1";
const OTHER_V6: &str = "fd00:1::2";
const THIRD_V6: &str = "fd00:1::3";
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

/// `lb_decap` loaded with `local` as its addresses.
struct Backend {
    rig: DecapRig,
}

impl Backend {
    fn new(local: &[&str]) -> Backend {
        let addrs: Vec<IpAddr> = local.iter().map(|a| ip(a)).collect();
        Backend {
            rig: DecapRig::new("second chance", &addrs),
        }
    }

    /// Runs `input`; asserts that exactly `want` moved (one packet, the
    /// input's bytes) and that the action is its kind's.
    fn run(&mut self, name: &str, input: &[u8], want: DecapCounter) -> Vec<u8> {
        self.rig.run_counted(name, input, want).1
    }
}

/// The client's TCP packet as a frame: a SYN, or an ACK with 4 bytes.
fn inner(src: SocketAddr, dst: SocketAddr, syn: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(ROUTER_MAC, BACKEND_MAC);
    let b = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), 64),
        _ => panic!("mixed families"),
    };
    let b = b.tcp(src.port(), dst.port(), 1000, 65535);
    let b = if syn { b.syn() } else { b.ack(2000) };
    let mut out = vec![];
    b.write(&mut out, if syn { b"" } else { b"data" })
        .expect("inner packet");
    out
}

/// A list as the balancer (or a previous backend) sends it: the frame
/// `inner`'s IP packet in GUE variant 0 from `src` to `dst`, with
/// `alternates` and `next`.
fn listed(inner: &[u8], src: &str, dst: &str, alternates: &[&str], next: u8) -> Vec<u8> {
    let packet = &inner[14..];
    let v6 = ip(dst).is_ipv6();
    let mut list = vec![0x4c, 0x42, next, alternates.len() as u8];
    for a in alternates {
        match ip(a) {
            IpAddr::V4(a) => list.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => list.extend_from_slice(&a.octets()),
        }
    }
    let inner_proto = if packet[0] >> 4 == 4 { 4 } else { 41 };
    let mut udp = vec![];
    udp.extend_from_slice(&0xc123u16.to_be_bytes());
    udp.extend_from_slice(&GUE_PORT.to_be_bytes());
    udp.extend_from_slice(&((8 + 4 + list.len() + packet.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&[(list.len() / 4) as u8, inner_proto, 0, 0]);
    udp.extend_from_slice(&list);
    udp.extend_from_slice(packet);
    let mut out = inner[..12].to_vec();
    if v6 {
        out.extend_from_slice(&[0x86, 0xdd]);
        etherparse::Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: udp.len() as u16,
            next_header: etherparse::IpNumber(17),
            hop_limit: 60,
            source: common::v6(src),
            destination: common::v6(dst),
        }
        .write(&mut out)
        .expect("outer IPv6");
    } else {
        out.extend_from_slice(&[0x08, 0x00]);
        let mut h = etherparse::Ipv4Header::new(
            udp.len() as u16,
            60,
            etherparse::IpNumber(17),
            common::v4(src),
            common::v4(dst),
        )
        .expect("outer IPv4");
        h.header_checksum = h.calc_header_checksum();
        h.write(&mut out).expect("outer IPv4");
    }
    out.extend_from_slice(&udp);
    out
}

/// Asserts that `out` is `input` handed on to `next` by `own`: addresses
/// moved, next index incremented, MACs swapped, all else unchanged.
fn check_handed_on(input: &[u8], out: &[u8], own: &str, next: &str) {
    assert_eq!(out.len(), input.len(), "same length");
    assert_eq!(out[0..6], input[6..12], "back to the router");
    assert_eq!(out[6..12], input[0..6], "from us");
    let (list_at, src, dst) = if ip(own).is_ipv6() {
        let h = Ipv6HeaderSlice::from_slice(&out[14..]).expect("outer");
        (
            14 + 40 + 8 + 4,
            IpAddr::V6(h.source_addr()),
            IpAddr::V6(h.destination_addr()),
        )
    } else {
        let h = Ipv4HeaderSlice::from_slice(&out[14..]).expect("outer");
        let header = h.to_header();
        assert_eq!(header.header_checksum, header.calc_header_checksum());
        (
            14 + 20 + 8 + 4,
            IpAddr::V4(h.source_addr()),
            IpAddr::V4(h.destination_addr()),
        )
    };
    assert_eq!((src, dst), (ip(own), ip(next)));
    assert_eq!(out[list_at + 2], input[list_at + 2] + 1, "next index");
    let unchanged = |b: &[u8]| {
        let mut v = b.to_vec();
        v[list_at + 2] = 0;
        v.drain(0..list_at - 12).for_each(drop);
        v
    };
    assert_eq!(unchanged(out), unchanged(input), "UDP, GUE, list, inner");
}

/// Runs `f` on a thread in a network namespace of its own (loopback up),
/// whose sockets `lb_decap`'s lookups then see.
fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    require_root("second chance");
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) with a flag changes only this thread's
            // network namespace.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .expect("ip");
            assert!(up.success());
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// An established connection on loopback: (client, server side, client's
/// address, listener's address).
fn connection(loopback: IpAddr) -> (TcpStream, TcpStream, SocketAddr, SocketAddr, TcpListener) {
    let listener = TcpListener::bind((loopback, 0)).expect("listen");
    let server = listener.local_addr().expect("addr");
    let client = TcpStream::connect(server).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    let from = client.local_addr().expect("addr");
    (client, accepted, from, server, listener)
}

#[test]
fn a_local_connection_keeps_the_packet_another_one_hands_it_on() {
    in_private_netns(|| {
        for (lo, own, other, third) in [
            (
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                BACKEND_V4,
                OTHER_V4,
                THIRD_V4,
            ),
            (
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                BACKEND_V6,
                OTHER_V6,
                THIRD_V6,
            ),
        ] {
            let mut b = Backend::new(&[own]);
            let (client, accepted, from, server, _listener) = connection(lo);
            let balancer = if lo.is_ipv4() {
                "10.255.0.1"
            } else {
                "fd00:ff::1"
            };
            let alts = [other, third];

            // Established here: delivered, exactly as any tunnel.
            let pkt = inner(from, server, false);
            let out = b.run(
                "local",
                &listed(&pkt, balancer, own, &alts, 0),
                DecapCounter::DecapScLocal,
            );
            assert_eq!(out, pkt, "stripped to the inner frame");

            // The listener is here, the connection is not: handed on.
            let stranger = SocketAddr::new(lo, from.port().wrapping_add(1));
            let pkt = inner(stranger, server, false);
            let input = listed(&pkt, balancer, own, &alts, 0);
            let out = b.run("not here", &input, DecapCounter::FwdScNextHop);
            check_handed_on(&input, &out, own, other);
            // From the second hop on, to the third.
            let input = listed(&pkt, other, own, &alts, 1);
            let out = b.run("second hop", &input, DecapCounter::FwdScNextHop);
            check_handed_on(&input, &out, own, third);
            // The last hop, or the next one is ourselves: delivered here.
            let input = listed(&pkt, third, own, &alts, 2);
            b.run("no alternate left", &input, DecapCounter::DecapScLastResort);
            let input = listed(&pkt, balancer, own, &[own, other], 0);
            b.run("next is us", &input, DecapCounter::DecapScLastResort);

            // A SYN, and UDP, with alternates: delivered without a lookup.
            let syn = inner(stranger, server, true);
            b.run(
                "syn",
                &listed(&syn, balancer, own, &alts, 0),
                DecapCounter::DecapScNoLookup,
            );

            // Time-wait (the server closed first): still this host's.
            drop(accepted);
            std::thread::sleep(Duration::from_millis(20));
            drop(client);
            std::thread::sleep(Duration::from_millis(100));
            let pkt = inner(from, server, false);
            b.run(
                "time-wait",
                &listed(&pkt, balancer, own, &alts, 0),
                DecapCounter::DecapScLocal,
            );
        }
    });
}

/// A list forged by a host outside the prefixes the backend takes
/// tunnels from is dropped, never handed on (the backend would relay it to
/// the addresses it names); the same list from the balancer's or another
/// backend's prefix is handed on.
#[test]
fn a_list_from_outside_the_given_prefixes_is_dropped_not_handed_on() {
    let mut b = Backend::new(&[BACKEND_V4]);
    let from: Vec<ipnet::IpNet> = vec![
        "10.255.0.0/24".parse().unwrap(),
        "10.1.0.0/24".parse().unwrap(),
    ];
    b.rig
        .decap
        .set_tunnels(&[ip(BACKEND_V4)], GUE_PORT, &from)
        .expect("write addresses and prefixes");
    // To a VIP address no socket here holds: a list would be handed on.
    let client: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let vip: SocketAddr = "10.0.0.10:80".parse().unwrap();
    let pkt = inner(client, vip, false);
    let target = "198.51.100.9";
    let forged = listed(&pkt, "203.0.113.5", BACKEND_V4, &[target], 0);
    b.run("forged", &forged, DecapCounter::DropSource);
    for src in ["10.255.0.1", OTHER_V4] {
        let input = listed(&pkt, src, BACKEND_V4, &[OTHER_V4], 0);
        let out = b.run(src, &input, DecapCounter::FwdScNextHop);
        check_handed_on(&input, &out, BACKEND_V4, OTHER_V4);
    }
    // From an allowed source, a list naming an address tunnels may not
    // come from: delivered here, not relayed there (helper-33).
    let input = listed(&pkt, "10.255.0.1", BACKEND_V4, &[target], 0);
    b.run("outside --from", &input, DecapCounter::DecapScLastResort);
}

/// Without `--from`, a list still never names a loopback, multicast,
/// broadcast or unspecified next hop: such a packet is delivered here.
#[test]
fn a_list_naming_no_unicast_address_is_delivered_here() {
    let mut b = Backend::new(&[BACKEND_V4, BACKEND_V6]);
    let client: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let vip: SocketAddr = "10.0.0.10:80".parse().unwrap();
    let pkt = inner(client, vip, false);
    for next in [
        "127.0.0.1",
        "224.0.0.5",
        "255.255.255.255",
        "0.0.0.0",
        "0.1.2.3",
    ] {
        let input = listed(&pkt, "10.255.0.1", BACKEND_V4, &[next], 0);
        b.run(next, &input, DecapCounter::DecapScLastResort);
    }
    let input = listed(&pkt, "10.255.0.1", BACKEND_V4, &["198.51.100.9"], 0);
    b.run("unicast", &input, DecapCounter::FwdScNextHop);
    let client: SocketAddr = "[2001:db8::7]:40000".parse().unwrap();
    let vip: SocketAddr = "[fd00::10]:80".parse().unwrap();
    let pkt = inner(client, vip, false);
    for next in ["::1", "ff02::1", "::"] {
        let input = listed(&pkt, "fd00:ff::1", BACKEND_V6, &[next], 0);
        b.run(next, &input, DecapCounter::DecapScLastResort);
    }
    let input = listed(&pkt, "fd00:ff::1", BACKEND_V6, &["2001:db8::9"], 0);
    b.run("unicast v6", &input, DecapCounter::FwdScNextHop);
}

#[test]
fn a_connection_in_its_handshake_is_local() {
    in_private_netns(|| {
        let mut b = Backend::new(&[BACKEND_V4]);
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        // With TCP_DEFER_ACCEPT the server keeps the handshake's request
        // socket until data arrives: the third ACK leaves it in SYN_RECV.
        let secs: libc::c_int = 30;
        // SAFETY: a valid socket and a 4-byte option value.
        let rc = unsafe {
            libc::setsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&secs as *const libc::c_int).cast(),
                4,
            )
        };
        assert_eq!(rc, 0);
        let server = listener.local_addr().expect("addr");
        let client = TcpStream::connect(server).expect("connect");
        let from = client.local_addr().expect("addr");
        std::thread::sleep(Duration::from_millis(50));
        let pkt = inner(from, server, false);
        let input = listed(&pkt, "10.255.0.1", BACKEND_V4, &[OTHER_V4], 0);
        b.run("request socket", &input, DecapCounter::DecapScLocal);
        drop(client);
    });
}

/// A change to one byte of a well-formed list.
type Edit = fn(&mut Vec<u8>);

#[test]
fn malformed_lists_are_counted_and_dropped_never_sent_on() {
    in_private_netns(|| {
        let mut b = Backend::new(&[BACKEND_V4]);
        let pkt = inner(
            "192.0.2.7:40000".parse().unwrap(),
            "10.0.0.10:80".parse().unwrap(),
            false,
        );
        let good = listed(&pkt, "10.255.0.1", BACKEND_V4, &[OTHER_V4, THIRD_V4], 0);
        b.run(
            "well formed, nowhere local",
            &good,
            DecapCounter::FwdScNextHop,
        );
        // Offsets: UDP at 34, GUE at 42, lb's header at 46.
        let edits: [(&str, Edit); 9] = [
            ("control bit", |f| f[42] |= 0x20),
            ("flags", |f| f[45] = 1),
            ("another private type", |f| f[46] = 0),
            ("no alternate", |f| f[49] = 0),
            ("four alternates", |f| f[49] = 4),
            ("next past the count", |f| f[48] = 3),
            ("hlen and count disagree", |f| f[42] = 4),
            ("a UDP checksum", |f| f[40] = 0x12),
            ("inner protocol UDP", |f| f[43] = 17),
        ];
        for (name, edit) in edits {
            let mut bad = good.clone();
            edit(&mut bad);
            b.run(name, &bad, DecapCounter::MalformedSc);
        }
        // A list the packet cannot hold: hlen past the end of the packet.
        let mut cut = listed(&pkt, "10.255.0.1", BACKEND_V4, &[OTHER_V4], 0);
        cut.truncate(14 + 20 + 8 + 4 + 4 + 2);
        let len = (cut.len() - 14) as u16;
        cut[16..18].copy_from_slice(&len.to_be_bytes());
        cut[38..40].copy_from_slice(&(len - 20).to_be_bytes());
        fix_ipv4_checksum(&mut cut, 14);
        b.run("cut short", &cut, DecapCounter::MalformedSc);
    });
}

/// A raw TCP socket (the kernel adds the IPv4 header) on loopback.
struct RawTcp(std::os::fd::OwnedFd);

impl RawTcp {
    fn open() -> RawTcp {
        use std::os::fd::FromRawFd as _;
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor we own.
        RawTcp(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Sends a TCP header (checksummed here) from 127.0.0.1 to 127.0.0.1.
    fn send(&self, segment: &[u8]) {
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: a valid buffer and address of the sizes given.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                segment.as_ptr().cast(),
                segment.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        assert_eq!(
            n,
            segment.len() as isize,
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// The next TCP segment to `port` (an IPv4 packet with its header).
    fn receive_to(&self, port: u16) -> Vec<u8> {
        let mut buf = [0u8; 1500];
        for _ in 0..100 {
            // SAFETY: a valid buffer of the size given; MSG_DONTWAIT.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                let p = &buf[..n as usize];
                let ihl = usize::from(p[0] & 0x0f) * 4;
                if u16::from_be_bytes([p[ihl + 2], p[ihl + 3]]) == port {
                    return p.to_vec();
                }
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("no segment to port {port}");
    }
}

/// A 20-byte TCP header from 127.0.0.1:`sport` to 127.0.0.1:`dport`,
/// checksummed over the IPv4 pseudo-header.
fn segment(sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    // Pseudo-header: 127.0.0.1 twice, protocol 6, length 20.
    let seed = 2 * (0x7f00 + 0x0001) + 6 + 20;
    let c = common::packets::inet_checksum(&t, seed);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

#[test]
fn an_ack_with_a_valid_syn_cookie_is_local() {
    in_private_netns(|| {
        let ok = std::process::Command::new("sysctl")
            .args(["-qw", "net.ipv4.tcp_syncookies=2"])
            .status()
            .expect("sysctl");
        assert!(ok.success(), "cookies for every SYN");
        let mut b = Backend::new(&[BACKEND_V4]);
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let server = listener.local_addr().expect("addr");
        let raw = RawTcp::open();
        // A SYN from a port with no socket: the listener answers with a
        // cookie and keeps nothing (our stack resets the SYN-ACK).
        let (client_port, isn) = (40_123, 0x1000_0000u32);
        raw.send(&segment(client_port, server.port(), isn, 0, 0x02));
        let synack = raw.receive_to(client_port);
        let ihl = usize::from(synack[0] & 0x0f) * 4;
        let cookie = u32::from_be_bytes(synack[ihl + 4..ihl + 8].try_into().unwrap());

        let ack = |ack_seq: u32| {
            let mut f = vec![2, 0, 0, 0, 0, 0x0b, 2, 0, 0, 0, 0, 0x0a, 0x08, 0x00];
            let tcp = segment(client_port, server.port(), isn + 1, ack_seq, 0x10);
            let mut ip = etherparse::Ipv4Header::new(
                20,
                64,
                etherparse::IpNumber(6),
                [127, 0, 0, 1],
                [127, 0, 0, 1],
            )
            .expect("ipv4");
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut f).expect("ipv4");
            f.extend_from_slice(&tcp);
            listed(&f, "10.255.0.1", BACKEND_V4, &[OTHER_V4], 0)
        };
        b.run(
            "valid cookie",
            &ack(cookie.wrapping_add(1)),
            DecapCounter::DecapScLocal,
        );
        b.run(
            "no cookie of ours",
            &ack(cookie.wrapping_add(7)),
            DecapCounter::FwdScNextHop,
        );
        drop(listener);
    });
}

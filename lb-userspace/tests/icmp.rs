//! ICMP, in the kernel (`lb_xdp`): echo requests to a VIP address answered
//! in XDP (or passed when echo is off), "fragmentation needed" and "packet
//! too big" built for packets that would not fit the tunnel, ICMP errors
//! about a VIP's flow sent to that flow's backend, and the ICMP that goes
//! to the kernel. Replies are checked byte by byte (lengths, addresses,
//! TTL, checksums recomputed here independently, the quoted bytes, the MTU
//! value).
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use std::net::IpAddr;

use etherparse::{
    EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv4HeaderSlice, Ipv6HeaderSlice,
    PacketBuilder, VlanId,
};
use lb::{
    dataplane::Dataplane,
    predict::{Via, predict},
};
use lb_common::{BackendDef, Counter, FlowKey, consts::*};

use common::{
    XDP_DROP, XDP_PASS, XDP_TX, ip,
    packets::{fix_ipv4_checksum, icmp4, icmp6, inet_checksum, l2_len, tcp4, tcp4_vlan, tcp6},
    v4, v6,
    xdp::{
        BACKENDS, CLIENT_MAC, CLIENT_V4, CLIENT_V6, Expect, Fixture, LB_MAC, Rig, TO_LB, Vips,
        check_encapsulated, forward, gue_source_port, port_for_backend, run_table, with_settings,
    },
};

/// A router on the path back to the client (the source of ICMP errors).
const ROUTER_V4: [u8; 4] = [198, 51, 100, 1];
const ROUTER_V6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
];

/// Recomputes the ICMP checksum of an untagged IPv4 ICMP frame.
fn fix_icmp4_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    let l4 = 14 + usize::from(frame[14] & 0x0f) * 4;
    frame[l4 + 2..l4 + 4].copy_from_slice(&[0, 0]);
    let c = inet_checksum(&frame[l4..], 0);
    frame[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
    frame
}

/// ICMP that is not for the balancer to answer or route: the kernel's.
fn fixtures(_: &Vips) -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    let mut icmp_other = icmp4(TO_LB, "10.0.0.10");
    icmp_other[34] = 13; // timestamp request
    let icmp_other = fix_icmp4_checksum(icmp_other);
    vec![
        f(
            "icmp echo to another address",
            icmp4(TO_LB, "10.9.9.9"),
            Pass(PassIcmp),
        ),
        f(
            "icmpv6 echo to another address",
            icmp6(TO_LB, "2001:db8::99"),
            Pass(PassIcmp),
        ),
        f(
            "icmp timestamp request to a vip address",
            icmp_other,
            Pass(PassIcmp),
        ),
    ]
}

#[test]
fn fixture_table() {
    run_table(fixtures);
}

/// Sum of the IPv6 pseudo-header (RFC 8200 §8.1) as 16-bit words.
fn pseudo_v6(src: &[u8], dst: &[u8], len: usize, next: u8) -> u32 {
    let words = |b: &[u8]| -> u32 {
        b.chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum()
    };
    words(src) + words(dst) + (len as u32 >> 16) + (len as u32 & 0xffff) + u32::from(next)
}

/// Asserts that the ICMP (IPv4) or ICMPv6 message of `frame` has a valid
/// checksum, and returns `(l3 offset, l4 offset, ip end)`.
fn check_icmp_checksums(frame: &[u8], name: &str) -> (usize, usize, usize) {
    let l3 = l2_len(frame);
    if frame[l3] >> 4 == 4 {
        let h = Ipv4HeaderSlice::from_slice(&frame[l3..]).expect("ipv4");
        let header = h.to_header();
        assert_eq!(
            header.header_checksum,
            header.calc_header_checksum(),
            "{name}: IPv4 header checksum"
        );
        assert_eq!(h.protocol(), IpNumber::ICMP, "{name}: protocol");
        let l4 = l3 + h.ihl() as usize * 4;
        let end = l3 + h.total_len() as usize;
        assert_eq!(
            inet_checksum(&frame[l4..end], 0),
            0,
            "{name}: ICMP checksum"
        );
        (l3, l4, end)
    } else {
        let h = Ipv6HeaderSlice::from_slice(&frame[l3..]).expect("ipv6");
        assert_eq!(h.next_header(), IpNumber::IPV6_ICMP, "{name}: next header");
        let l4 = l3 + 40;
        let end = l4 + h.payload_length() as usize;
        let seed = pseudo_v6(
            &frame[l3 + 8..l3 + 24],
            &frame[l3 + 24..l3 + 40],
            end - l4,
            58,
        );
        assert_eq!(
            inet_checksum(&frame[l4..end], seed),
            0,
            "{name}: ICMPv6 checksum"
        );
        (l3, l4, end)
    }
}

fn icmp6_echo_vlan() -> Vec<u8> {
    let b = PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .single_vlan(VlanId::try_new(9).expect("vlan"))
        .ipv6(CLIENT_V6, v6("2001:db8::10"), 17)
        .icmpv6_echo_request(0x1234, 7);
    let mut out = vec![];
    b.write(&mut out, b"ping with a tag").expect("build packet");
    out
}

#[test]
fn echo_requests_to_a_vip_address_are_answered() {
    let mut rig = Rig::new(1 << 12);
    rig.standard_vips();
    let requests = [
        ("icmp echo", icmp4(TO_LB, "10.0.0.10")),
        ("icmpv6 echo", icmp6(TO_LB, "2001:db8::10")),
        ("icmpv6 echo, vlan-tagged", icmp6_echo_vlan()),
        // An address whose only VIP is an all-ports one.
        ("icmp echo, all-ports vip", icmp4(TO_LB, "10.0.0.40")),
    ];
    for (name, req) in &requests {
        let (action, out, events) = rig.run_counted(req, Counter::ReplyIcmpEcho);
        assert_eq!(action, XDP_TX, "{name}: sent back");
        assert!(events.is_empty(), "{name}: events {events:?}");
        assert_eq!(out.len(), req.len(), "{name}: same length");
        assert_eq!(out[0..6], req[6..12], "{name}: to the sender's MAC");
        assert_eq!(out[6..12], req[0..6], "{name}: from ours");
        let l3 = l2_len(req);
        assert_eq!(out[12..l3], req[12..l3], "{name}: ethertype and tag kept");
        let (_, l4, end) = check_icmp_checksums(&out, name);
        if req[l3] >> 4 == 4 {
            assert_eq!(
                out[l3 + 12..l3 + 16],
                req[l3 + 16..l3 + 20],
                "{name}: source"
            );
            assert_eq!(out[l3 + 16..l3 + 20], req[l3 + 12..l3 + 16], "{name}: dest");
            assert_eq!(out[l3 + 8], 64, "{name}: ttl");
            assert_eq!(out[l4], 0, "{name}: echo reply");
        } else {
            assert_eq!(
                out[l3 + 8..l3 + 24],
                req[l3 + 24..l3 + 40],
                "{name}: source"
            );
            assert_eq!(out[l3 + 24..l3 + 40], req[l3 + 8..l3 + 24], "{name}: dest");
            assert_eq!(out[l3 + 7], 64, "{name}: hop limit");
            assert_eq!(out[l4], 129, "{name}: echo reply");
        }
        assert_eq!(out[l4 + 1], req[l4 + 1], "{name}: code");
        assert_eq!(
            out[l4 + 4..end],
            req[l4 + 4..end],
            "{name}: identifier, sequence and data echoed"
        );
    }

    // Echo off: the kernel gets them (and answers if the VIP is local).
    with_settings(&mut rig, |s| s.icmp_echo = false);
    for (name, req) in &requests {
        let (action, out, _) = rig.run_counted(req, Counter::PassIcmp);
        assert_eq!(action, XDP_PASS, "{name}: echo off");
        assert_eq!(&out, req, "{name}: untouched");
    }
}

/// A TCP packet from the client with an IP packet of exactly `ip_len`
/// bytes, DF set or not.
fn big_tcp4(dst: &str, dport: u16, ip_len: usize, df: bool) -> Vec<u8> {
    let mut f = tcp4(TO_LB, dst, dport, 41000, false, &vec![0xab; ip_len - 40]);
    if df {
        f[20] |= 0x40;
    } else {
        f[20] &= !0x40;
    }
    fix_ipv4_checksum(&mut f, 14);
    assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, ip_len);
    f
}

fn big_tcp6(dst: &str, dport: u16, ip_len: usize) -> Vec<u8> {
    tcp6(TO_LB, dst, dport, 41000, false, &vec![0xcd; ip_len - 60])
}

/// Asserts that `out` is the balancer's "fragmentation needed" for the
/// too-big IPv4 packet `req`, announcing `mtu`.
fn check_frag_needed(req: &[u8], out: &[u8], mtu: u16, name: &str) {
    let l2 = l2_len(req);
    assert_eq!(out.len(), l2 + 20 + 8 + 68, "{name}: reply length");
    assert_eq!(out[0..6], req[6..12], "{name}: to the sender's MAC");
    assert_eq!(out[6..12], req[0..6], "{name}: from ours");
    assert_eq!(out[12..l2], req[12..l2], "{name}: ethertype and tag kept");
    let (l3, l4, end) = check_icmp_checksums(out, name);
    assert_eq!(end, out.len(), "{name}: IP length is the frame's");
    assert_eq!(out[l3], 0x45, "{name}: version, ihl");
    assert_eq!(out[l3 + 8], 64, "{name}: ttl");
    assert_eq!(
        out[l3 + 12..l3 + 16],
        req[l2 + 16..l2 + 20],
        "{name}: from the VIP"
    );
    assert_eq!(
        out[l3 + 16..l3 + 20],
        req[l2 + 12..l2 + 16],
        "{name}: to the client"
    );
    assert_eq!((out[l4], out[l4 + 1]), (3, 4), "{name}: type 3 code 4");
    assert_eq!(out[l4 + 4..l4 + 6], [0, 0], "{name}: unused");
    assert_eq!(
        u16::from_be_bytes([out[l4 + 6], out[l4 + 7]]),
        mtu,
        "{name}: next-hop MTU"
    );
    assert_eq!(
        out[l4 + 8..],
        req[l2..l2 + 68],
        "{name}: quotes the IP header and the start of the payload"
    );
}

/// A SYN the tunnel cannot carry (TCP Fast Open data) is answered and
/// never reaches a backend: no backend counts it, so the client's smaller
/// retry is a first SYN there, not a retransmission passive health would
/// hold against a backend that saw neither.
#[test]
fn a_syn_too_big_for_the_tunnel_counts_on_no_backend() {
    let mut rig = Rig::new(1 << 12);
    rig.standard_vips();
    with_settings(&mut rig, |s| s.mtu = 1500);
    let total = |rig: &Rig| {
        let all = rig.dp().all_backend_syns().expect("SYN counters");
        all.iter()
            .fold((0, 0), |(s, r), c| (s + c.syns, r + c.retransmits))
    };
    // 1,441 bytes of data: an IP packet of 1,481, one more than IP-in-IP
    // leaves of 1,500.
    let mut tfo = tcp4(TO_LB, "10.0.0.10", 80, 41000, true, &vec![0xab; 1441]);
    tfo[20] |= 0x40;
    fix_ipv4_checksum(&mut tfo, 14);
    for _ in 0..2 {
        rig.run_counted(&tfo, Counter::ReplyFragNeeded);
    }
    assert_eq!(total(&rig), (0, 0), "no backend saw them");
    let syn = tcp4(TO_LB, "10.0.0.10", 80, 41000, true, b"");
    let (action, _, _) = rig.run_counted(&syn, Counter::FwdMaglev);
    assert_eq!(action, XDP_TX);
    assert_eq!(total(&rig), (1, 0), "a first SYN, not a retransmission");
}

#[test]
fn too_big_ipv4_is_answered_with_fragmentation_needed() {
    let mut rig = Rig::new(1 << 12);
    let v = rig.standard_vips();
    with_settings(&mut rig, |s| s.mtu = 1500);
    // VIP, port, encapsulation overhead.
    let cases = [
        ("ipip", "10.0.0.10", 80, 20u16),
        ("gre", "10.0.0.30", 80, 24),
        ("gue", "10.0.0.80", 80, 28),
        ("4in6", "10.0.0.20", 80, 40),
        ("gue 4in6", "10.0.0.80", 443, 48),
    ];
    for (name, vip, port, overhead) in cases {
        let mtu = 1500 - overhead;
        // The largest packet that fits is forwarded...
        let fits = big_tcp4(vip, port, mtu as usize, true);
        let (action, out) = rig.run(&fits);
        assert_eq!(action, XDP_TX, "{name}: {mtu} bytes fit");
        assert_eq!(
            out.len(),
            fits.len() + overhead as usize,
            "{name}: encapsulated"
        );
        // ...one byte more is answered.
        let req = big_tcp4(vip, port, mtu as usize + 1, true);
        let (action, out, _) = rig.run_counted(&req, Counter::ReplyFragNeeded);
        assert_eq!(action, XDP_TX, "{name}: answered");
        check_frag_needed(&req, &out, mtu, name);
    }

    // Tagged: the reply keeps the tag.
    let mut tagged = tcp4_vlan(TO_LB, "10.0.0.10", 80, 41001, 42);
    let ip_len = 1481usize;
    let extra = ip_len - u16::from_be_bytes([tagged[20], tagged[21]]) as usize;
    tagged.extend(std::iter::repeat_n(0x11, extra));
    tagged[20..22].copy_from_slice(&(ip_len as u16).to_be_bytes());
    tagged[24] |= 0x40;
    let (action, out, _) = rig.run_counted(&tagged, Counter::ReplyFragNeeded);
    assert_eq!(action, XDP_TX);
    check_frag_needed(&tagged, &out, 1480, "vlan-tagged");

    // Without DF: dropped, or passed by policy; never forwarded.
    let no_df = big_tcp4("10.0.0.10", 80, 1481, false);
    let meta = rig.dp().vip(&v.tcp4).expect("vip").expect("vip exists");
    let before = rig.dp().vip_stats(meta.id()).expect("stats").packets;
    let (action, _, _) = rig.run_counted(&no_df, Counter::DropTooBigNoDf);
    assert_eq!(action, XDP_DROP, "no DF: dropped");
    let after = rig.dp().vip_stats(meta.id()).expect("stats").packets;
    assert_eq!(after, before + 1, "counted for the VIP");
    with_settings(&mut rig, |s| {
        s.mtu = 1500;
        s.pass_too_big = true;
    });
    let (action, out, _) = rig.run_counted(&no_df, Counter::PassTooBigNoDf);
    assert_eq!(action, XDP_PASS, "no DF: passed by policy");
    assert_eq!(out, no_df, "untouched");

    // MTU 0: no check at all.
    with_settings(&mut rig, |s| s.mtu = 0);
    let (action, _) = rig.run(&big_tcp4("10.0.0.10", 80, 1481, true));
    assert_eq!(action, XDP_TX, "unchecked MTU: forwarded");
}

#[test]
fn too_big_ipv6_is_answered_with_packet_too_big() {
    let mut rig = Rig::new(1 << 12);
    rig.standard_vips();
    with_settings(&mut rig, |s| s.mtu = 1500);
    for (name, vip, port, overhead) in [
        ("6in6", "2001:db8::10", 80, 40u16),
        ("gre 6in6", "2001:db8::30", 443, 44),
        ("gue 6in6", "2001:db8::80", 80, 48),
    ] {
        let mtu = 1500 - overhead;
        let (action, _) = rig.run(&big_tcp6(vip, port, mtu as usize));
        assert_eq!(action, XDP_TX, "{name}: {mtu} bytes fit");
        let req = big_tcp6(vip, port, mtu as usize + 1);
        let (action, out, _) = rig.run_counted(&req, Counter::ReplyPacketTooBig);
        assert_eq!(action, XDP_TX, "{name}: answered");
        assert_eq!(out.len(), 14 + 40 + 8 + 256, "{name}: reply length");
        assert_eq!(out[0..6], req[6..12], "{name}: to the sender's MAC");
        assert_eq!(out[6..12], req[0..6], "{name}: from ours");
        assert_eq!(out[12..14], [0x86, 0xdd], "{name}: ethertype");
        let (l3, l4, end) = check_icmp_checksums(&out, name);
        assert_eq!(end, out.len(), "{name}: payload length is the frame's");
        assert_eq!(out[l3] >> 4, 6, "{name}: version");
        assert_eq!(out[l3 + 7], 64, "{name}: hop limit");
        assert_eq!(
            out[l3 + 8..l3 + 24],
            req[14 + 24..14 + 40],
            "{name}: from the VIP"
        );
        assert_eq!(
            out[l3 + 24..l3 + 40],
            req[14 + 8..14 + 24],
            "{name}: to the client"
        );
        assert_eq!((out[l4], out[l4 + 1]), (2, 0), "{name}: type 2 code 0");
        assert_eq!(
            u32::from_be_bytes([out[l4 + 4], out[l4 + 5], out[l4 + 6], out[l4 + 7]]),
            u32::from(mtu),
            "{name}: MTU"
        );
        assert_eq!(
            out[l4 + 8..],
            req[14..14 + 256],
            "{name}: quotes the packet's start"
        );
    }
}

/// An ICMP error from a router to `vip`, quoting `quote` (the start of the
/// packet the router could not deliver).
fn icmp4_error(vip: &str, kind: u8, code: u8, rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let mut icmp = vec![kind, code, 0, 0];
    icmp.extend_from_slice(&rest);
    icmp.extend_from_slice(quote);
    let c = inet_checksum(&icmp, 0);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut out = vec![];
    Ethernet2Header {
        source: CLIENT_MAC,
        destination: LB_MAC,
        ether_type: EtherType::IPV4,
    }
    .write(&mut out)
    .expect("eth");
    Ipv4Header::new(icmp.len() as u16, 60, IpNumber::ICMP, ROUTER_V4, v4(vip))
        .expect("ipv4")
        .write(&mut out)
        .expect("ipv4");
    out.extend_from_slice(&icmp);
    out
}

fn icmp6_error(vip: &str, kind: u8, code: u8, rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let mut icmp = vec![kind, code, 0, 0];
    icmp.extend_from_slice(&rest);
    icmp.extend_from_slice(quote);
    let seed = pseudo_v6(&ROUTER_V6, &v6(vip), icmp.len(), 58);
    let c = inet_checksum(&icmp, seed);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut out = vec![];
    Ethernet2Header {
        source: CLIENT_MAC,
        destination: LB_MAC,
        ether_type: EtherType::IPV6,
    }
    .write(&mut out)
    .expect("eth");
    etherparse::Ipv6Header {
        traffic_class: 0,
        flow_label: Default::default(),
        payload_length: icmp.len() as u16,
        next_header: IpNumber::IPV6_ICMP,
        hop_limit: 60,
        source: ROUTER_V6,
        destination: v6(vip),
    }
    .write(&mut out)
    .expect("ipv6");
    out.extend_from_slice(&icmp);
    out
}

/// Shortens the IP packet of an untagged ICMP error so that it ends 12
/// bytes into the quote (inside the quoted IP header for IPv4, before its
/// addresses for IPv6), leaving the frame as it is: the rest of the quote
/// becomes trailer bytes after the IP packet, which must not be read.
fn cut_by_ip_len(mut frame: Vec<u8>) -> Vec<u8> {
    if frame[12..14] == [0x08, 0x00] {
        let ihl = usize::from(frame[14] & 0x0f) * 4;
        let len = (ihl + 8 + 12) as u16;
        frame[16..18].copy_from_slice(&len.to_be_bytes());
        fix_ipv4_checksum(&mut frame, 14);
    } else {
        frame[18..20].copy_from_slice(&(8u16 + 12).to_be_bytes());
    }
    frame
}

/// The backend's answer to the client, as the router saw it: from
/// `vip:vport` to the client's `sport`; its IP header and `l4` bytes.
fn answer4(vip: &str, vport: u16, sport: u16, udp: bool, l4: usize) -> Vec<u8> {
    let b = PacketBuilder::ipv4(v4(vip), CLIENT_V4, 63);
    let mut out = vec![];
    if udp {
        b.udp(vport, sport).write(&mut out, &[1; 64])
    } else {
        b.tcp(vport, sport, 5, 100).ack(1).write(&mut out, &[1; 64])
    }
    .expect("answer");
    out.truncate(20 + l4);
    out
}

fn answer6(vip: &str, vport: u16, sport: u16) -> Vec<u8> {
    let mut out = vec![];
    PacketBuilder::ipv6(v6(vip), CLIENT_V6, 63)
        .tcp(vport, sport, 5, 100)
        .ack(1)
        .write(&mut out, &[2; 400])
        .expect("answer");
    out
}

/// The backend an error must reach: the one `predict` names for the
/// quoted flow (connection table first, as for its next packet).
fn owner(rig: &Rig, client: IpAddr, vip: &str, proto: u8, sport: u16, vport: u16) -> BackendDef {
    let flow = FlowKey::new(client, ip(vip), proto, sport, vport);
    predict(rig.dp(), &flow, false)
        .expect("predict")
        .expect("a vip")
        .backend
        .expect("a backend")
}

#[test]
fn icmp_errors_about_a_vip_flow_reach_its_backend() {
    let mut rig = Rig::new(1 << 12);
    let v = rig.standard_vips();
    errors_follow_the_connection_table(&mut rig, &v);
    errors_of_unknown_flows_follow_maglev(&mut rig, &v);
    icmpv6_errors_follow_their_flow(&mut rig);
    errors_that_cannot_be_placed_pass(&mut rig);
}

/// An established flow, and one whose handshake is under way, whose
/// slots then move to another backend: the errors must follow the
/// connection table and the recent SYN, not the new table.
fn errors_follow_the_connection_table(rig: &mut Rig, v: &Vips) {
    let client4 = IpAddr::from(CLIENT_V4);
    let sport = port_for_backend(rig, "10.0.0.10", 80, 1);
    // Another flow Maglev sends to backend 1.
    let half_open = (sport + 1..u16::MAX)
        .find(|&p| {
            let flow = FlowKey::new(client4, ip("10.0.0.10"), PROTO_TCP, p, 80);
            let pick = predict(rig.dp(), &flow, true).expect("predict");
            pick.and_then(|w| w.backend).and_then(|b| b.ip()) == Some(ip(BACKENDS[1]))
        })
        .expect("a second port on backend 1");
    assert_eq!(
        forward(rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"")).0,
        1
    );
    assert_eq!(
        forward(rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"")).0,
        1
    );
    assert_eq!(
        forward(rig, &tcp4(TO_LB, "10.0.0.10", 80, half_open, true, b"")).0,
        1
    );
    rig.set_weight(&v.tcp4, 1, 0);
    for (name, kind, code, rest, port) in [
        ("frag needed", 3u8, 4u8, [0, 0, 0x05, 0x78], sport),
        ("host unreachable", 3, 1, [0; 4], sport),
        ("ttl exceeded", 11, 0, [0; 4], sport),
        ("host unreachable, handshake", 3, 1, [0; 4], half_open),
    ] {
        let quote = answer4("10.0.0.10", 80, port, false, 8);
        let err = icmp4_error("10.0.0.10", kind, code, rest, &quote);
        let (action, out, events) = rig.run_counted(&err, Counter::FwdIcmpError);
        assert_eq!(action, XDP_TX, "{name}: forwarded");
        assert!(events.is_empty(), "{name}: events {events:?}");
        let def = owner(rig, client4, "10.0.0.10", PROTO_TCP, port, 80);
        assert_eq!(
            def.ip(),
            Some(ip(BACKENDS[1])),
            "{name}: the flow's backend"
        );
        check_encapsulated(&err, &out, &def, ENCAP_IPIP);
    }
}

/// A flow the balancer has not seen (or forgot): where its next packet
/// would go. UDP too, and a quote longer than the minimum.
fn errors_of_unknown_flows_follow_maglev(rig: &mut Rig, v: &Vips) {
    let client4 = IpAddr::from(CLIENT_V4);
    for (name, vip, port, udp, key) in [
        ("tcp, no entry", "10.0.0.10", 80, false, v.tcp4),
        ("udp, no entry", "10.0.0.10", 53, true, v.udp4),
        ("gre vip", "10.0.0.30", 80, false, v.gre4),
        ("gue vip", "10.0.0.80", 80, false, v.gue4),
    ] {
        let proto = if udp { PROTO_UDP } else { PROTO_TCP };
        let quote = answer4(vip, port, 50_001, udp, 40);
        let err = icmp4_error(vip, 3, 4, [0, 0, 0x05, 0x00], &quote);
        let (action, out, _) = rig.run_counted(&err, Counter::FwdIcmpError);
        assert_eq!(action, XDP_TX, "{name}: forwarded");
        let def = owner(rig, client4, vip, proto, 50_001, port);
        let meta = rig.dp().vip(&key).expect("vip").expect("exists");
        check_encapsulated(&err, &out, &def, meta.encap);
        let flow = FlowKey::new(client4, ip(vip), proto, 50_001, port);
        if meta.encap == ENCAP_GUE {
            assert_eq!(
                u16::from_be_bytes([out[34], out[35]]),
                gue_source_port(&flow),
                "{name}: GUE source port of the quoted flow"
            );
        }
        // The error made no connection-table entry.
        assert_eq!(
            predict(rig.dp(), &flow, false)
                .expect("predict")
                .expect("vip")
                .via,
            Via::Maglev,
            "{name}: no entry created"
        );
    }
}

/// ICMPv6: packet too big (≥ 1280), unreachable, time exceeded; below the
/// IPv6 minimum MTU, dropped.
fn icmpv6_errors_follow_their_flow(rig: &mut Rig) {
    let client6 = IpAddr::from(CLIENT_V6);
    let sport6 = 50_002;
    assert_eq!(
        forward(rig, &tcp6(TO_LB, "2001:db8::10", 80, sport6, true, b"")).1,
        Counter::FwdMaglev
    );
    for (name, kind, code, rest) in [
        ("packet too big 1400", 2u8, 0u8, 1400u32.to_be_bytes()),
        ("packet too big 1280", 2, 0, 1280u32.to_be_bytes()),
        ("unreachable", 1, 4, [0; 4]),
        ("time exceeded", 3, 0, [0; 4]),
    ] {
        let err = icmp6_error(
            "2001:db8::10",
            kind,
            code,
            rest,
            &answer6("2001:db8::10", 80, sport6),
        );
        let (action, out, _) = rig.run_counted(&err, Counter::FwdIcmpError);
        assert_eq!(action, XDP_TX, "{name}: forwarded");
        let def = owner(rig, client6, "2001:db8::10", PROTO_TCP, sport6, 80);
        check_encapsulated(&err, &out, &def, ENCAP_IPIP);
    }

    // Below the IPv6 minimum MTU: dropped, counted apart.
    let err = icmp6_error(
        "2001:db8::10",
        2,
        0,
        1279u32.to_be_bytes(),
        &answer6("2001:db8::10", 80, sport6),
    );
    let (action, _, _) = rig.run_counted(&err, Counter::DropIcmpPtbTooSmall);
    assert_eq!(action, XDP_DROP, "PTB below 1280");
}

/// Errors the balancer cannot place go to the kernel.
fn errors_that_cannot_be_placed_pass(rig: &mut Rig) {
    for (name, err) in [
        (
            "quotes a flow of another service",
            icmp4_error(
                "10.0.0.10",
                3,
                4,
                [0; 4],
                &answer4("10.0.0.10", 22, 1, false, 8),
            ),
        ),
        (
            "quote cut before the ports",
            icmp4_error(
                "10.0.0.10",
                3,
                4,
                [0; 4],
                &answer4("10.0.0.10", 80, 1, false, 2),
            ),
        ),
        (
            "quotes icmp",
            icmp4_error(
                "10.0.0.10",
                3,
                4,
                [0; 4],
                &icmp4(TO_LB, "10.0.0.10")[14..42],
            ),
        ),
        (
            "quote cut by the ip length, the ports in the frame's trailer",
            cut_by_ip_len(icmp4_error(
                "10.0.0.10",
                3,
                4,
                [0; 4],
                &answer4("10.0.0.10", 80, 1, false, 8),
            )),
        ),
        (
            "ipv6 quote cut by the payload length",
            cut_by_ip_len(icmp6_error(
                "2001:db8::10",
                1,
                4,
                [0; 4],
                &answer6("2001:db8::10", 80, 1),
            )),
        ),
        (
            "quotes a flow of another vip address",
            icmp4_error(
                "10.0.0.20",
                3,
                4,
                [0; 4],
                &answer4("10.0.0.10", 80, 1, false, 8),
            ),
        ),
    ] {
        let (action, out, _) = rig.run_counted(&err, Counter::PassIcmp);
        assert_eq!(action, XDP_PASS, "{name}");
        assert_eq!(out, err, "{name}: untouched");
    }
}

//! Parsing and passing, in the kernel (`lb_xdp`): traffic that is not the
//! balancer's goes to the kernel untouched, each with its counter (ARP,
//! other addresses and ports, other L4 protocols); malformed frames are
//! counted, then passed or dropped by the policy; the parser's limits hold
//! (VLAN tags, IPv4 options and lengths, the IPv6 extension-header walk,
//! L4 headers, Ethernet padding, runt frames). Also a VIP-filter false
//! positive and the flows of a removed VIP.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use aya::programs::{TestRun, TestRunOptions};
use etherparse::{IpHeaders, IpNumber, Ipv4Header, Ipv6RawExtHeader, PacketBuilder};
use lb::{config::VipId, dataplane::Dataplane, predict::Via};
use lb_common::{Counter, VipKey, consts::PROTO_TCP};

use common::{
    XDP_PASS, ip,
    packets::{arp, tcp4, tcp4_vlan, tcp6, udp4, udp6, with_ipv6_ext},
    v4,
    xdp::{CLIENT_MAC, CLIENT_V4, Expect, Fixture, Rig, TO_LB, Vips, forward, run_table},
};

// ---------------------------------------------------------------- packets

fn tcp4_with_options(dst: &str, dport: u16) -> Vec<u8> {
    let mut h = Ipv4Header::new(0, 64, IpNumber::TCP, CLIENT_V4, v4(dst)).expect("ipv4");
    h.options = [1u8, 1, 1, 0, 1, 1, 1, 0].into();
    let b = PacketBuilder::ethernet2(TO_LB.src_mac, TO_LB.dst_mac)
        .ip(IpHeaders::Ipv4(h, Default::default()))
        .tcp(40001, dport, 1, 65535)
        .ack(1);
    let mut out = vec![];
    b.write(&mut out, b"options").expect("build packet");
    assert_eq!(out[14] & 0x0f, 7, "IHL with 8 bytes of options");
    out
}

/// An 8-byte extension header (hop-by-hop, routing, destination options
/// layout) whose next header is `next`, with PadN filling the rest.
fn ext8(next: u8) -> [u8; 8] {
    [next, 0, 1, 4, 0, 0, 0, 0]
}

/// Destination options of `len` bytes (a multiple of 8), PadN inside.
fn dstopts(next: u8, len: usize) -> Vec<u8> {
    let mut h = vec![next, (len / 8 - 1) as u8];
    while h.len() < len {
        let n = (len - h.len() - 2).min(255);
        h.extend_from_slice(&[1, n as u8]);
        h.extend(std::iter::repeat_n(0, n));
    }
    h
}

/// One 1032-byte destination-options header whose option data, from its
/// ninth byte, looks like a TCP SYN to the VIP's port 80: the real TCP
/// header after it is for port 22, which no VIP serves. Once a parser that
/// wrapped offsets at 1024 read the ports from inside the options.
fn options_hiding_tcp() -> Vec<u8> {
    let mut opts = vec![IpNumber::TCP.0, (1032 / 8 - 1) as u8, 1, 4, 0, 0, 0, 0];
    // A PadN option (type 1, 254 bytes) whose bytes are a TCP header:
    // source port 0x01fe, destination port 80, data offset 5, SYN.
    let mut fake = vec![0u8; 256];
    fake[0..4].copy_from_slice(&[0x01, 0xfe, 0, 80]);
    fake[12] = 0x50;
    fake[13] = 0x02;
    opts.extend_from_slice(&fake);
    // PadN options filling the rest (255 + 2 bytes each at most).
    while opts.len() < 1032 {
        let n = (1032 - opts.len() - 2).min(255);
        opts.extend_from_slice(&[1, n as u8]);
        opts.extend(std::iter::repeat_n(0, n));
    }
    let f = with_ipv6_ext(tcp6(TO_LB, "2001:db8::10", 22, 40000, true, b""), 60, &opts);
    assert_eq!(f.len(), 1106, "the 1106-byte SYN of the report");
    f
}

// ---------------------------------------------------------------- fixtures

/// Ethernet, VLAN, IPv4 and the fixed IPv6 header: frames that pass, and
/// broken headers.
fn frames_and_ip_headers(v: &Vips) -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    let mut bad_version = tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"");
    bad_version[14] = 0x55;
    let mut ihl4 = tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"");
    ihl4[14] = 0x44;
    let mut long_len = tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"");
    long_len[16..18].copy_from_slice(&2000u16.to_be_bytes());
    let mut short_len = tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"");
    short_len[16..18].copy_from_slice(&16u16.to_be_bytes());
    let mut v6_bad_version = tcp6(TO_LB, "2001:db8::10", 80, 1, true, b"");
    v6_bad_version[14] = 0x40;
    let mut v6_long = tcp6(TO_LB, "2001:db8::10", 80, 1, true, b"");
    v6_long[18..20].copy_from_slice(&3000u16.to_be_bytes());
    let mut sctp = udp4(TO_LB, "10.0.0.10", 53, 5000, b"not udp");
    sctp[23] = 132;
    let mut vlan_trunc = tcp4_vlan(TO_LB, "10.0.0.10", 80, 1, 5);
    vlan_trunc.truncate(16);
    let mut qinq = tcp4_vlan(TO_LB, "10.0.0.10", 80, 1, 5);
    qinq[16..18].copy_from_slice(&[0x81, 0x00]);
    // A minimum-size frame: 54 bytes of headers padded to 60.
    let mut padded = tcp4(TO_LB, "10.0.0.10", 80, 40002, false, b"");
    padded.resize(60, 0);

    vec![
        f(
            "ipv4 with options",
            tcp4_with_options("10.0.0.10", 80),
            Forward(v.tcp4, Via::Maglev, FwdMaglev),
        ),
        f(
            "padded minimum frame",
            padded,
            Forward(v.tcp4, Via::Maglev, FwdMaglev),
        ),
        f("arp", arp(CLIENT_MAC), Pass(PassNotIp)),
        f("sctp to a vip address", sctp, Pass(PassNotL4)),
        f(
            "tcp to another address",
            tcp4(TO_LB, "10.9.9.9", 80, 1, true, b""),
            Pass(PassNotVip),
        ),
        f(
            "tcp to a vip address, other port",
            tcp4(TO_LB, "10.0.0.10", 8080, 1, true, b""),
            Pass(PassNotVip),
        ),
        f(
            "udp to a tcp-only vip port",
            udp4(TO_LB, "10.0.0.30", 80, 1, b""),
            Pass(PassNotVip),
        ),
        f(
            "ipv6 tcp to another address",
            tcp6(TO_LB, "2001:db8::99", 80, 1, true, b""),
            Pass(PassNotVip),
        ),
        f("truncated vlan tag", vlan_trunc, Malformed(MalformedVlan)),
        f("two vlan tags (qinq)", qinq, Malformed(MalformedVlan)),
        f(
            "truncated ipv4 header",
            tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"")[..24].to_vec(),
            Malformed(MalformedIpv4Truncated),
        ),
        f(
            "ipv4 version 5",
            bad_version,
            Malformed(MalformedIpv4Header),
        ),
        f("ipv4 ihl 4", ihl4, Malformed(MalformedIpv4Header)),
        f(
            "ipv4 total length past the frame",
            long_len,
            Malformed(MalformedIpv4Len),
        ),
        f(
            "ipv4 total length below the header",
            short_len,
            Malformed(MalformedIpv4Len),
        ),
        f(
            "truncated ipv6 header",
            tcp6(TO_LB, "2001:db8::10", 80, 1, true, b"")[..40].to_vec(),
            Malformed(MalformedIpv6Truncated),
        ),
        f(
            "ipv6 version 4",
            v6_bad_version,
            Malformed(MalformedIpv6Header),
        ),
        f(
            "ipv6 payload length past the frame",
            v6_long,
            Malformed(MalformedIpv6Len),
        ),
    ]
}

/// The IPv6 extension-header walk: what it walks, its bounds.
fn ipv6_extension_headers(v: &Vips) -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    let hbh = Ipv6RawExtHeader::new_raw(IpNumber::UDP, &[0; 6])
        .expect("hop-by-hop")
        .to_bytes();
    // The hop-by-hop header claims 16 bytes; the packet ends after 8.
    let mut hbh_cut = with_ipv6_ext(udp6(TO_LB, "2001:db8::10", 53, 1, b""), 0, &hbh);
    hbh_cut[55] = 1;
    hbh_cut.truncate(14 + 40 + 8);
    hbh_cut[18..20].copy_from_slice(&8u16.to_be_bytes());
    // Hop-by-hop, then destination options, then routing, then UDP: three
    // walked headers.
    let three_ext = {
        let mut f = udp6(TO_LB, "2001:db8::10", 53, 7001, b"ext");
        // Routing type 0 with no segments left (RFC 5095: ignored).
        f = with_ipv6_ext(f, 43, &[IpNumber::UDP.0, 0, 0, 0, 0, 0, 0, 0]);
        f = with_ipv6_ext(f, 60, &ext8(43));
        with_ipv6_ext(f, 0, &ext8(60))
    };
    // Five destination-options headers: one more than the walk's bound.
    let five_ext = (0..4).fold(
        with_ipv6_ext(
            udp6(TO_LB, "2001:db8::10", 53, 7002, b"ext"),
            60,
            &ext8(IpNumber::UDP.0),
        ),
        |f, _| with_ipv6_ext(f, 60, &ext8(60)),
    );
    // Exactly the 1024 bytes of extension headers the parser reads.
    let ext_1024 = with_ipv6_ext(
        with_ipv6_ext(
            udp6(TO_LB, "2001:db8::10", 53, 7005, b"ext"),
            60,
            &dstopts(IpNumber::UDP.0, 512),
        ),
        60,
        &dstopts(60, 512),
    );
    // Eight bytes more: past the limit, its own reason.
    let ext_1032 = with_ipv6_ext(ext_1024.clone(), 60, &dstopts(60, 8));
    // Three headers, the last starting 528 bytes in (an earlier limit on
    // where a header may start refused these).
    let late_start = (0..3).fold(udp6(TO_LB, "2001:db8::10", 53, 7006, b"ext"), |f, i| {
        let next = if i == 0 { IpNumber::UDP.0 } else { 60 };
        with_ipv6_ext(f, 60, &dstopts(next, 264))
    });
    // Mobility header (135): an extension header the datapath does not walk.
    let mobility = with_ipv6_ext(
        udp6(TO_LB, "2001:db8::10", 53, 7003, b"ext"),
        135,
        &ext8(17),
    );

    vec![
        f(
            "ipv6 hop-by-hop header is walked",
            with_ipv6_ext(udp6(TO_LB, "2001:db8::10", 53, 7000, b"x"), 0, &hbh),
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "ipv6 three extension headers are walked",
            three_ext,
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "ipv6 five extension headers: past the bound",
            five_ext,
            Malformed(MalformedIpv6ExtChain),
        ),
        f(
            "ipv6 1032-byte options hiding a tcp header to a vip port",
            options_hiding_tcp(),
            Malformed(MalformedIpv6ExtTooLong),
        ),
        f(
            "ipv6 extension headers of 1024 bytes are walked",
            ext_1024,
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "ipv6 extension headers of 1032 bytes: past the limit",
            ext_1032,
            Malformed(MalformedIpv6ExtTooLong),
        ),
        f(
            "ipv6 header starting 528 bytes in is walked",
            late_start,
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "ipv6 mobility header: not walked",
            mobility,
            Malformed(MalformedIpv6Ext),
        ),
        f(
            "ipv6 hop-by-hop header cut short",
            hbh_cut,
            Malformed(MalformedIpv6Ext),
        ),
    ]
}

/// Broken TCP and UDP headers.
fn l4_headers() -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    let mut tcp_trunc = tcp4(TO_LB, "10.0.0.10", 80, 1, true, b"");
    tcp_trunc.truncate(14 + 20 + 10);
    tcp_trunc[16..18].copy_from_slice(&30u16.to_be_bytes());
    let mut tcp_doff = tcp4(TO_LB, "10.0.0.10", 80, 1, false, b"");
    tcp_doff[14 + 20 + 12] = 0x40; // data offset 4
    // A UDP header that the frame holds (Ethernet padding) but the IP
    // packet does not: total length covers only 4 of its 8 bytes.
    let mut udp_past_ip = udp4(TO_LB, "10.0.0.10", 53, 5000, b"");
    udp_past_ip[16..18].copy_from_slice(&24u16.to_be_bytes());

    vec![
        f("truncated tcp header", tcp_trunc, Malformed(MalformedL4)),
        f("tcp data offset 4", tcp_doff, Malformed(MalformedL4)),
        f(
            "udp header past the ip length",
            udp_past_ip,
            Malformed(MalformedL4),
        ),
    ]
}

/// The parse and pass rows, in the order the parser meets the headers.
fn fixtures(v: &Vips) -> Vec<Fixture> {
    let mut rows = frames_and_ip_headers(v);
    rows.extend(ipv6_extension_headers(v));
    rows.extend(l4_headers());
    rows
}

#[test]
fn fixture_table() {
    run_table(fixtures);
}

#[test]
fn frames_shorter_than_ethernet_never_reach_the_program() {
    // The program counts such frames as `malformed_eth_truncated`, but the
    // kernel never hands XDP less than an Ethernet header: drivers drop runt
    // frames and BPF_PROG_TEST_RUN refuses them. Pin that, so the fixture
    // table's lack of a runt row stays justified.
    let mut rig = Rig::new(1 << 4);
    let mut out = vec![0u8; 64];
    let err = rig
        .r
        .dataplane_mut()
        .program()
        .test_run(TestRunOptions {
            data_in: Some(&arp(CLIENT_MAC)[..10]),
            data_out: Some(&mut out),
            ..TestRunOptions::new()
        })
        .expect_err("a 10-byte frame is refused");
    assert!(format!("{err:?}").contains("Invalid argument"), "{err:?}");
}

#[test]
fn a_filter_false_positive_is_settled_by_the_vip_lookup() {
    let mut rig = Rig::new(1 << 8);
    let vips = rig.standard_vips();
    // A port of the VIP's address whose filter bit is set by some VIP key
    // although no VIP has that port: the filter lets it by, the lookup
    // says no.
    let filter = rig.dp().vip_filter().expect("filter");
    let port = (1024..u16::MAX)
        .find(|&p| {
            let key = VipKey::new(ip("10.0.0.10"), p, PROTO_TCP);
            p != 80 && filter.contains(&key)
        })
        .expect("some port collides in a 16k-bit filter");
    let (action, out, _) = rig.run_counted(
        &tcp4(TO_LB, "10.0.0.10", port, 1234, false, b""),
        Counter::PassNotVip,
    );
    assert_eq!(action, XDP_PASS);
    assert_eq!(out, tcp4(TO_LB, "10.0.0.10", port, 1234, false, b""));
    assert!(filter.contains(&vips.tcp4), "the VIP's own bit is set");
}

#[test]
fn flows_of_a_removed_vip_pass_instead_of_following_stale_entries() {
    let mut rig = Rig::new(1 << 8);
    let vips = rig.standard_vips();
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.30", 80, 41000, true, b"")).1,
        Counter::FwdMaglev
    );
    let gone = VipId::from_key(&vips.gre4).expect("vip");
    rig.vips.retain(|v| v.id != gone);
    rig.apply();
    // The connection-table entry still names its backend, now retired: a
    // stale hit, then no VIP.
    let stale = rig.counters()[Counter::CtStale as usize].packets;
    let (action, _, _) = rig.run_counted(
        &tcp4(TO_LB, "10.0.0.30", 80, 41000, false, b""),
        Counter::PassNotVip,
    );
    assert_eq!(action, XDP_PASS);
    let stale_now = rig.counters()[Counter::CtStale as usize].packets;
    assert!(stale_now <= stale + 1, "at most one stale hit");
    assert!(
        !rig.dp().vip_filter().expect("filter").contains(&vips.gre4),
        "its filter bit is cleared"
    );
}

//! Decap tests: the real `lb_decap` program in the kernel, its local
//! addresses written through `lb::decap`, packets run with
//! `BPF_PROG_TEST_RUN` (aya `TestRun`). Every tunnel the balancer emits must
//! come out as exactly the frame the client's packet would have been on the
//! backend's wire: same MACs, same VLAN tag, inner ethertype, inner packet
//! byte-identical. Everything else passes untouched or is dropped, each with
//! exactly one counter.
//!
//! The last tests attach the program for real (`lb::decap::attach`) to a veth
//! in a private network namespace, send tunnelled frames through it with an
//! AF_PACKET socket and receive the inner datagrams on sockets bound to VIPs
//! on `lo`; they also replace the program in its pinned link and detach it.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15) and a bpffs at
//! `/sys/fs/bpf`. Without them every test fails with a message saying so;
//! none is skipped.

mod common;

use std::{
    ffi::CString,
    io,
    net::{IpAddr, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::programs::XdpMode;
use etherparse::{EtherType, IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, PacketBuilder};
use lb::decap::{self, DecapError, PassProgram};
use lb_common::{
    CounterValue,
    consts::GUE_PORT,
    counters::{DECAP_COUNTER_SLOTS, DecapCounter},
};

use common::{
    decap::DecapRig,
    in_private_netns, ip, ip_cmd,
    packets::{self, Link, arp, fix_ipv4_checksum, icmp4, l2_len},
    require_root, v4, v6,
};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
/// The client (inner packets): 192.0.2.7 and 2001:db8:c::7.
const CLIENT_V4: [u8; 4] = [192, 0, 2, 7];
const CLIENT_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0xc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
/// Frames from the balancer to the backend, carrying the client's packets.
const TO_BACKEND: Link = Link {
    src_mac: LB_MAC,
    dst_mac: BACKEND_MAC,
    client_v4: CLIENT_V4,
    client_v6: CLIENT_V6,
};
/// Outer sources (the balancer).
const LB_V4: &str = "10.255.0.1";
const LB_V6: &str = "fd00:ff::1";
/// The backend's own addresses (the tunnel endpoints).
const BACKEND_V4: &str = "10.1.0.1";
const BACKEND_V6: &str = "fd00:1::1";
/// Another backend's addresses.
const OTHER_V4: &str = "10.1.0.2";
const OTHER_V6: &str = "fd00:1::2";
/// The VIPs (inner packets).
const VIP_V4: &str = "10.0.0.10";
const VIP_V6: &str = "2001:db8::10";

/// `lb_decap` with the backend's two addresses.
fn rig() -> DecapRig {
    DecapRig::new("decap", &[ip(BACKEND_V4), ip(BACKEND_V6)])
}

// ---------------------------------------------------------------- packets

#[derive(Clone, Copy, Debug)]
enum Vlan {
    Untagged,
    Dot1q(u16),
    Dot1ad(u16),
}

#[derive(Clone, Copy, Debug)]
enum L4 {
    Tcp,
    Udp,
}

/// The client's packet as the backend should see it after decapsulation:
/// Ethernet from the balancer to the backend (tagged if asked), IPv4 or IPv6
/// from the client to a VIP, then TCP or UDP.
fn inner_frame(inner_v6: bool, l4: L4, vlan: Vlan, payload: &[u8]) -> Vec<u8> {
    let frame = match (inner_v6, l4) {
        (false, L4::Tcp) => packets::tcp4(TO_BACKEND, VIP_V4, 80, 40000, false, payload),
        (false, L4::Udp) => packets::udp4(TO_BACKEND, VIP_V4, 53, 5353, payload),
        (true, L4::Tcp) => packets::tcp6(TO_BACKEND, VIP_V6, 80, 40000, false, payload),
        (true, L4::Udp) => packets::udp6(TO_BACKEND, VIP_V6, 53, 5353, payload),
    };
    match vlan {
        Vlan::Untagged => frame,
        Vlan::Dot1q(id) => with_vlan(frame, 0x8100, id),
        Vlan::Dot1ad(id) => with_vlan(frame, 0x88a8, id),
    }
}

/// Inserts a VLAN tag (`tpid`, priority 0, VLAN `id`) after the MAC
/// addresses.
fn with_vlan(mut frame: Vec<u8>, tpid: u16, id: u16) -> Vec<u8> {
    let [t0, t1] = tpid.to_be_bytes();
    let [i0, i1] = id.to_be_bytes();
    frame.splice(12..12, [t0, t1, i0, i1]);
    frame
}

/// How to wrap an inner frame.
#[derive(Clone, Copy)]
struct Outer<'a> {
    /// Tunnel destination: its family is the outer family.
    dst: &'a str,
    /// Tunnel source (the balancer's address, or one of an RSS prefix).
    src: &'a str,
    gre: bool,
    /// GUE: UDP to this port (0: not GUE).
    gue_port: u16,
    /// IPv4 options (a multiple of 4 bytes) in the outer header.
    options: &'a [u8],
}

impl<'a> Outer<'a> {
    fn ipip(dst: &'a str) -> Self {
        let src = if ip(dst).is_ipv4() { LB_V4 } else { LB_V6 };
        Outer {
            dst,
            src,
            gre: false,
            gue_port: 0,
            options: &[],
        }
    }

    fn gre(dst: &'a str) -> Self {
        Outer {
            gre: true,
            ..Outer::ipip(dst)
        }
    }

    fn gue(dst: &'a str) -> Self {
        Outer {
            gue_port: GUE_PORT,
            ..Outer::ipip(dst)
        }
    }
}

/// Wraps the IP packet of `inner` (a frame) as the balancer does: the L2
/// header is kept with the outer ethertype, then the outer IPv4 or IPv6
/// header from the balancer to `outer.dst`, the GRE header if asked, and the
/// inner packet unchanged.
fn encap(inner: &[u8], outer: Outer) -> Vec<u8> {
    let l2 = l2_len(inner);
    let packet = &inner[l2..];
    let inner_v6 = packet[0] >> 4 == 6;
    let mut payload = vec![];
    if outer.gre {
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(if inner_v6 {
            &[0x86, 0xdd]
        } else {
            &[0x08, 0x00]
        });
    }
    if outer.gue_port != 0 {
        // Source port as the balancer picks it (ephemeral range), no checksum.
        payload.extend_from_slice(&0xc123u16.to_be_bytes());
        payload.extend_from_slice(&outer.gue_port.to_be_bytes());
        payload.extend_from_slice(&((8 + packet.len()) as u16).to_be_bytes());
        payload.extend_from_slice(&[0, 0]);
    }
    payload.extend_from_slice(packet);
    let proto = IpNumber(if outer.gre {
        47
    } else if outer.gue_port != 0 {
        17
    } else if inner_v6 {
        41
    } else {
        4
    });
    let mut out = inner[..l2].to_vec();
    match ip(outer.dst) {
        IpAddr::V4(dst) => {
            out[l2 - 2..l2].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
            let mut h =
                Ipv4Header::new(payload.len() as u16, 64, proto, v4(outer.src), dst.octets())
                    .expect("outer ipv4");
            h.options = outer.options.try_into().expect("ipv4 options");
            h.total_len = (h.header_len() + payload.len()) as u16;
            h.write(&mut out).expect("outer ipv4");
        }
        IpAddr::V6(dst) => {
            out[l2 - 2..l2].copy_from_slice(&EtherType::IPV6.0.to_be_bytes());
            Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::try_new(0x12345).expect("flow label"),
                payload_length: payload.len() as u16,
                next_header: proto,
                hop_limit: 64,
                source: v6(outer.src),
                destination: dst.octets(),
            }
            .write(&mut out)
            .expect("outer ipv6");
        }
    }
    out.extend_from_slice(&payload);
    out
}

/// A plain TCP SYN (no tunnel) from the client to port 22 of `dst`.
fn tcp4_plain(dst: &str) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(LB_MAC, BACKEND_MAC)
        .ipv4(CLIENT_V4, v4(dst), 64)
        .tcp(40000, 22, 1, 65535)
        .syn();
    let mut out = vec![];
    b.write(&mut out, b"").expect("build packet");
    out
}

fn tcp6_plain(dst: &str) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(LB_MAC, BACKEND_MAC)
        .ipv6(CLIENT_V6, v6(dst), 64)
        .tcp(40000, 22, 1, 65535)
        .syn();
    let mut out = vec![];
    b.write(&mut out, b"").expect("build packet");
    out
}

/// Sets a big-endian u16 at `off`.
fn put16(frame: &mut [u8], off: usize, v: u16) {
    frame[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

fn get16(frame: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([frame[off], frame[off + 1]])
}

// ---------------------------------------------------------------- fixtures

enum Expect {
    /// Decapsulated (`XDP_PASS`) to exactly this frame.
    Decap(Vec<u8>, DecapCounter),
    /// Passed unchanged.
    Pass(DecapCounter),
    /// Dropped.
    Drop(DecapCounter),
}

struct Fixture {
    name: String,
    packet: Vec<u8>,
    expect: Expect,
}

fn fixture(name: impl Into<String>, packet: Vec<u8>, expect: Expect) -> Fixture {
    Fixture {
        name: name.into(),
        packet,
        expect,
    }
}

/// Every tunnel the balancer emits: name, outer, inner family, counter.
fn tunnels() -> [(&'static str, Outer<'static>, bool, DecapCounter); 12] {
    use DecapCounter::{DecapGre, DecapGue, DecapIpip};
    [
        ("4in4", Outer::ipip(BACKEND_V4), false, DecapIpip),
        ("6in6", Outer::ipip(BACKEND_V6), true, DecapIpip),
        ("4in6", Outer::ipip(BACKEND_V6), false, DecapIpip),
        ("6in4", Outer::ipip(BACKEND_V4), true, DecapIpip),
        (
            "gre ipv4 over ipv4",
            Outer::gre(BACKEND_V4),
            false,
            DecapGre,
        ),
        ("gre ipv6 over ipv4", Outer::gre(BACKEND_V4), true, DecapGre),
        (
            "gre ipv4 over ipv6",
            Outer::gre(BACKEND_V6),
            false,
            DecapGre,
        ),
        ("gre ipv6 over ipv6", Outer::gre(BACKEND_V6), true, DecapGre),
        (
            "gue ipv4 over ipv4",
            Outer::gue(BACKEND_V4),
            false,
            DecapGue,
        ),
        ("gue ipv6 over ipv4", Outer::gue(BACKEND_V4), true, DecapGue),
        (
            "gue ipv4 over ipv6",
            Outer::gue(BACKEND_V6),
            false,
            DecapGue,
        ),
        ("gue ipv6 over ipv6", Outer::gue(BACKEND_V6), true, DecapGue),
    ]
}

/// Round trips: every tunnel × VLAN tagging × TCP/UDP, plus shapes the
/// balancer does not emit but the program must handle.
fn round_trips() -> Vec<Fixture> {
    let mut out = vec![];
    for (tunnel, outer, inner_v6, counter) in tunnels() {
        for vlan in [Vlan::Untagged, Vlan::Dot1q(42), Vlan::Dot1ad(7)] {
            for l4 in [L4::Tcp, L4::Udp] {
                let inner = inner_frame(inner_v6, l4, vlan, b"hello, backend");
                out.push(fixture(
                    format!("{tunnel}, {l4:?}, {vlan:?}"),
                    encap(&inner, outer),
                    Expect::Decap(inner, counter),
                ));
            }
        }
    }
    out.extend(other_shapes());
    out
}

/// Tunnels of shapes the balancer does not emit (or not often): a large
/// payload, outer options, padding, other outer sources, inner fragments.
fn other_shapes() -> Vec<Fixture> {
    use DecapCounter::*;
    let mut out = vec![];
    let big = inner_frame(false, L4::Tcp, Vlan::Untagged, &[0x5a; 1400]);
    out.push(fixture(
        "4in4, 1400-byte payload",
        encap(&big, Outer::ipip(BACKEND_V4)),
        Expect::Decap(big, DecapIpip),
    ));

    // Outer IPv4 options: the overhead is the IHL, not 20.
    let inner = inner_frame(false, L4::Udp, Vlan::Dot1q(5), b"options");
    let with_options = Outer {
        options: &[1, 1, 1, 0, 1, 1, 1, 0],
        ..Outer::gre(BACKEND_V4)
    };
    let packet = encap(&inner, with_options);
    assert_eq!(packet[18] & 0x0f, 7, "outer IHL with 8 bytes of options");
    out.push(fixture(
        "gre over ipv4 with outer options, tagged",
        packet,
        Expect::Decap(inner, DecapGre),
    ));

    // Ethernet padding after the outer packet stays after the inner one
    // (the stack trims it by the inner IP length).
    let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"");
    let mut packet = encap(&inner, Outer::ipip(BACKEND_V4));
    packet.extend_from_slice(&[0; 6]);
    let mut want = inner;
    want.extend_from_slice(&[0; 6]);
    out.push(fixture(
        "4in4 with ethernet padding",
        packet,
        Expect::Decap(want, DecapIpip),
    ));

    // RSS-friendly outer sources: any source in the balancer's prefix (the
    // program never looks at the outer source).
    for (src, dst, inner_v6) in [
        ("10.255.2.7", BACKEND_V4, false),
        ("10.255.200.1", BACKEND_V4, true),
        ("fd00:ff::c000:207", BACKEND_V6, false),
    ] {
        let inner = inner_frame(inner_v6, L4::Tcp, Vlan::Untagged, b"rss");
        out.push(fixture(
            format!("ip-in-ip from {src} (outer source prefix)"),
            encap(
                &inner,
                Outer {
                    src,
                    ..Outer::ipip(dst)
                },
            ),
            Expect::Decap(inner, DecapIpip),
        ));
    }

    // An inner fragment is the stack's to reassemble: decapsulated.
    let mut inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"fragment");
    inner[20] |= 0x20; // MF
    fix_ipv4_checksum(&mut inner, 14);
    out.push(fixture(
        "4in4 carrying an inner fragment",
        encap(&inner, Outer::ipip(BACKEND_V4)),
        Expect::Decap(inner, DecapIpip),
    ));
    out
}

/// The inner frame most rejects carry: UDP over IPv4, untagged.
fn inner_udp4() -> Vec<u8> {
    inner_frame(false, L4::Udp, Vlan::Untagged, b"payload")
}

fn inner_udp6() -> Vec<u8> {
    inner_frame(true, L4::Udp, Vlan::Untagged, b"payload")
}

// Untagged 4in4 / 6in6 / GRE: outer header at 14, inner after it.

fn ipip4() -> Vec<u8> {
    encap(&inner_udp4(), Outer::ipip(BACKEND_V4))
}

fn ipip6() -> Vec<u8> {
    encap(&inner_udp6(), Outer::ipip(BACKEND_V6))
}

fn gre4() -> Vec<u8> {
    encap(&inner_udp4(), Outer::gre(BACKEND_V4))
}

/// Frames that are not ours to strip, or that are broken.
fn rejects() -> Vec<Fixture> {
    let mut out = not_ours();
    out.extend(outer_fragments_and_other_gre());
    out.extend(broken_outer());
    out.extend(broken_inner());
    out.extend(gue_rejects());
    out
}

/// Frames passed to the stack: not tunnels, or tunnels to other addresses.
fn not_ours() -> Vec<Fixture> {
    use DecapCounter::*;
    use Expect::Pass;
    let mut out = vec![
        fixture("arp", arp(LB_MAC), Pass(PassNotTunnel)),
        fixture(
            "plain tcp to us",
            tcp4_plain(BACKEND_V4),
            Pass(PassNotTunnel),
        ),
        fixture(
            "plain tcp over ipv6 to us",
            tcp6_plain(BACKEND_V6),
            Pass(PassNotTunnel),
        ),
        fixture(
            "icmp echo to us",
            icmp4(TO_BACKEND, BACKEND_V4),
            Pass(PassNotTunnel),
        ),
        fixture(
            "plain udp to a vip",
            inner_frame(false, L4::Udp, Vlan::Dot1q(3), b"x"),
            Pass(PassNotTunnel),
        ),
        fixture(
            "4in4 to another address",
            encap(&inner_udp4(), Outer::ipip(OTHER_V4)),
            Pass(PassNotLocal),
        ),
        fixture(
            "6in6 to another address",
            encap(&inner_udp6(), Outer::ipip(OTHER_V6)),
            Pass(PassNotLocal),
        ),
        fixture(
            "gre over ipv6 to another address, tagged",
            encap(
                &inner_frame(false, L4::Tcp, Vlan::Dot1q(9), b"x"),
                Outer::gre(OTHER_V6),
            ),
            Pass(PassNotLocal),
        ),
        fixture(
            "4in4 to a vip (not a tunnel endpoint)",
            encap(&inner_udp4(), Outer::ipip(VIP_V4)),
            Pass(PassNotLocal),
        ),
    ];

    // IPv6 with a hop-by-hop header before the tunnel protocol.
    let mut hbh = ipip6();
    hbh[20] = 0; // next header: hop-by-hop
    hbh.splice(54..54, [41u8, 0, 0, 0, 0, 0, 0, 0]);
    let plen = get16(&hbh, 18) + 8;
    put16(&mut hbh, 18, plen);
    out.push(fixture(
        "6in6 behind a hop-by-hop header",
        hbh,
        Pass(PassNotTunnel),
    ));

    // Two VLAN tags: the program reads one.
    let qinq = with_vlan(
        encap(
            &inner_frame(false, L4::Udp, Vlan::Dot1q(5), b"x"),
            Outer::ipip(BACKEND_V4),
        ),
        0x88a8,
        7,
    );
    out.push(fixture(
        "4in4 with two vlan tags",
        qinq,
        Pass(PassNotTunnel),
    ));
    out
}

/// Tunnels passed to the stack: outer fragments, GRE that lb never sends.
fn outer_fragments_and_other_gre() -> Vec<Fixture> {
    use DecapCounter::*;
    use Expect::Pass;
    let mut out = vec![];
    let mut frag_mf = ipip4();
    frag_mf[20] = 0x20; // MF, DF clear
    fix_ipv4_checksum(&mut frag_mf, 14);
    out.push(fixture(
        "4in4 outer first fragment (MF)",
        frag_mf,
        Pass(PassOuterFragment),
    ));
    let mut frag_off = gre4();
    put16(&mut frag_off, 20, 0x0010); // offset 16×8
    fix_ipv4_checksum(&mut frag_off, 14);
    out.push(fixture(
        "gre outer later fragment (offset)",
        frag_off,
        Pass(PassOuterFragment),
    ));
    let mut frag_other = encap(&inner_udp4(), Outer::ipip(OTHER_V4));
    frag_other[20] = 0x20;
    fix_ipv4_checksum(&mut frag_other, 14);
    out.push(fixture(
        "4in4 fragment to another address",
        frag_other,
        Pass(PassNotLocal),
    ));

    // GRE that lb never sends. With the key flag the header is 8 bytes.
    let mut gre_key = gre4();
    put16(&mut gre_key, 34, 0x2000);
    gre_key.splice(38..38, [0, 0, 0, 42]);
    let tot = get16(&gre_key, 16) + 4;
    put16(&mut gre_key, 16, tot);
    fix_ipv4_checksum(&mut gre_key, 14);
    out.push(fixture(
        "gre with the key flag",
        gre_key,
        Pass(PassGreUnsupported),
    ));
    let mut gre_v1 = gre4();
    put16(&mut gre_v1, 34, 0x0001);
    out.push(fixture("gre version 1", gre_v1, Pass(PassGreUnsupported)));
    let mut gre_teb = gre4();
    put16(&mut gre_teb, 36, 0x6558); // transparent Ethernet bridging
    out.push(fixture(
        "gre carrying ethernet",
        gre_teb,
        Pass(PassGreUnsupported),
    ));
    out
}

/// Broken outer headers of tunnel packets to us.
fn broken_outer() -> Vec<Fixture> {
    use DecapCounter::*;
    use Expect::Drop;
    let mut out = vec![];
    let mut ihl4 = ipip4();
    ihl4[14] = 0x44;
    out.push(fixture("4in4 outer ihl 4", ihl4, Drop(MalformedOuter)));
    let mut outer_long = ipip4();
    let tot = get16(&outer_long, 16) + 1;
    put16(&mut outer_long, 16, tot);
    fix_ipv4_checksum(&mut outer_long, 14);
    out.push(fixture(
        "4in4 outer total length past the frame",
        outer_long,
        Drop(MalformedOuter),
    ));
    let mut outer_short = ipip4();
    put16(&mut outer_short, 16, 19);
    fix_ipv4_checksum(&mut outer_short, 14);
    out.push(fixture(
        "4in4 outer total length below the header",
        outer_short,
        Drop(MalformedOuter),
    ));
    let mut v6_long = ipip6();
    let plen = get16(&v6_long, 18) + 1;
    put16(&mut v6_long, 18, plen);
    out.push(fixture(
        "6in6 outer payload length past the frame",
        v6_long,
        Drop(MalformedOuter),
    ));
    let mut gre_cut = gre4();
    gre_cut.truncate(14 + 20 + 2);
    put16(&mut gre_cut, 16, 22);
    fix_ipv4_checksum(&mut gre_cut, 14);
    out.push(fixture(
        "gre header cut short",
        gre_cut,
        Drop(MalformedOuter),
    ));
    out
}

/// Broken inner packets of tunnel packets to us.
fn broken_inner() -> Vec<Fixture> {
    use DecapCounter::*;
    use Expect::Drop;
    let mut out = vec![];
    let mut wrong_version = ipip4();
    wrong_version[34] = 0x65;
    out.push(fixture(
        "4in4 whose inner version is 6",
        wrong_version,
        Drop(MalformedInner),
    ));
    // Protocol 41 (IPv6 inside) around an IPv4 packet.
    let mut v4_as_v6 = ipip4();
    v4_as_v6[14 + 9] = 41;
    fix_ipv4_checksum(&mut v4_as_v6, 14);
    out.push(fixture(
        "6in4 whose inner packet is ipv4",
        v4_as_v6,
        Drop(MalformedInner),
    ));
    let mut gre_mismatch = gre4();
    put16(&mut gre_mismatch, 36, 0x86dd);
    out.push(fixture(
        "gre saying ipv6 around ipv4",
        gre_mismatch,
        Drop(MalformedInner),
    ));
    let mut inner_long = ipip4();
    let tot = get16(&inner_long, 36) + 1;
    put16(&mut inner_long, 36, tot);
    fix_ipv4_checksum(&mut inner_long, 34);
    out.push(fixture(
        "4in4 inner total length past the frame",
        inner_long,
        Drop(MalformedInner),
    ));
    let mut inner_long6 = ipip6();
    let plen = get16(&inner_long6, 54 + 4) + 1;
    put16(&mut inner_long6, 54 + 4, plen);
    out.push(fixture(
        "6in6 inner payload length past the frame",
        inner_long6,
        Drop(MalformedInner),
    ));
    // The frame holds the inner packet (as padding) but the outer packet
    // does not: the outer length wins.
    let mut inner_past_outer = ipip4();
    let tot = get16(&inner_past_outer, 16) - 4;
    put16(&mut inner_past_outer, 16, tot);
    fix_ipv4_checksum(&mut inner_past_outer, 14);
    out.push(fixture(
        "4in4 inner packet longer than the outer packet",
        inner_past_outer,
        Drop(MalformedInner),
    ));
    let mut inner_cut = ipip6();
    inner_cut.truncate(14 + 40 + 30);
    put16(&mut inner_cut, 18, 30);
    out.push(fixture(
        "6in6 inner header cut short",
        inner_cut,
        Drop(MalformedInner),
    ));
    let mut inner_ihl = ipip4();
    inner_ihl[34] = 0x44;
    out.push(fixture("4in4 inner ihl 4", inner_ihl, Drop(MalformedInner)));
    out
}

/// GUE: only UDP to the GUE port of a local address is a tunnel.
fn gue_rejects() -> Vec<Fixture> {
    use DecapCounter::*;
    use Expect::{Drop, Pass};
    let mut out = vec![];
    let gue4 = || encap(&inner_udp4(), Outer::gue(BACKEND_V4));
    let mut other_port = gue4();
    put16(&mut other_port, 14 + 20 + 2, 53);
    out.push(fixture(
        "udp to a local address, not the gue port",
        other_port,
        Pass(PassNotTunnel),
    ));
    out.push(fixture(
        "gue to another host is just udp",
        encap(&inner_udp4(), Outer::gue(OTHER_V4)),
        Pass(PassNotTunnel),
    ));
    let mut udp_len = gue4();
    put16(&mut udp_len, 14 + 20 + 4, 9);
    out.push(fixture(
        "gue with a udp length that is not the packet's",
        udp_len,
        Drop(MalformedOuter),
    ));
    let mut bad_inner = gue4();
    bad_inner[14 + 20 + 8] = 0x55;
    out.push(fixture(
        "gue whose payload is no ip version",
        bad_inner,
        Drop(MalformedInner),
    ));
    let mut gue6_cut = encap(&inner_udp6(), Outer::gue(BACKEND_V6));
    gue6_cut.truncate(14 + 40 + 8 + 20);
    put16(&mut gue6_cut, 18, 28);
    put16(&mut gue6_cut, 14 + 40 + 4, 28);
    out.push(fixture(
        "gue over ipv6, inner header cut short",
        gue6_cut,
        Drop(MalformedInner),
    ));
    out
}

#[test]
fn gue_is_not_accepted_on_a_port_of_zero() {
    let mut rig = rig();
    rig.decap
        .set_local_addrs(&[ip(BACKEND_V4), ip(BACKEND_V6)], 0)
        .expect("write local addresses");
    let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"payload");
    let packet = encap(&inner, Outer::gue(BACKEND_V4));
    let (_, out) = rig.run_counted("gue, no gue port", &packet, DecapCounter::PassNotTunnel);
    assert_eq!(out, packet, "passed untouched");
}

fn run_fixtures(rig: &mut DecapRig, fixtures: Vec<Fixture>) {
    for fx in fixtures {
        let name = fx.name.as_str();
        match fx.expect {
            Expect::Decap(want, counter) => {
                let (_, out) = rig.run_counted(name, &fx.packet, counter);
                assert_eq!(
                    out.len(),
                    want.len(),
                    "{name}: frame shrank by exactly the tunnel headers"
                );
                let l2 = l2_len(&want);
                assert_eq!(out[0..12], want[0..12], "{name}: MACs kept");
                if l2 == 18 {
                    assert_eq!(out[12..16], want[12..16], "{name}: VLAN TPID and TCI kept");
                }
                assert_eq!(out[l2 - 2..l2], want[l2 - 2..l2], "{name}: inner ethertype");
                assert_eq!(out[l2..], want[l2..], "{name}: inner packet byte-identical");
                assert_eq!(out, want, "{name}: the inner frame");
            }
            Expect::Pass(counter) => {
                let (_, out) = rig.run_counted(name, &fx.packet, counter);
                assert_eq!(out, fx.packet, "{name}: passed untouched");
            }
            Expect::Drop(counter) => {
                rig.run_counted(name, &fx.packet, counter);
            }
        }
    }
}

#[test]
fn every_tunnel_decapsulates_to_the_inner_frame() {
    let mut rig = rig();
    let fixtures = round_trips();
    assert!(
        fixtures.len() >= 72,
        "12 tunnels × 3 taggings × 2 protocols"
    );
    run_fixtures(&mut rig, fixtures);
}

#[test]
fn other_traffic_passes_and_broken_tunnels_drop() {
    let mut rig = rig();
    run_fixtures(&mut rig, rejects());
}

#[test]
fn local_addresses_are_replaced_not_merged() {
    let mut rig = rig();
    let packet = encap(
        &inner_frame(false, L4::Udp, Vlan::Untagged, b"x"),
        Outer::ipip(BACKEND_V4),
    );
    rig.run_counted("before", &packet, DecapCounter::DecapIpip);

    rig.decap
        .set_local_addrs(&[ip(BACKEND_V6), ip(OTHER_V4)], GUE_PORT)
        .expect("replace addresses");
    let mut now = rig.decap.local_addrs().expect("read addresses");
    now.sort();
    assert_eq!(now, vec![ip(OTHER_V4), ip(BACKEND_V6)]);
    let (_, out) = rig.run_counted("after removal", &packet, DecapCounter::PassNotLocal);
    assert_eq!(out, packet);
    let moved = encap(
        &inner_frame(false, L4::Udp, Vlan::Untagged, b"x"),
        Outer::ipip(OTHER_V4),
    );
    rig.run_counted("new address", &moved, DecapCounter::DecapIpip);

    let too_many: Vec<IpAddr> = (0..=lb_common::consts::DECAP_MAX_ADDRS)
        .map(|i| IpAddr::from([10, 9, (i >> 8) as u8, i as u8]))
        .collect();
    assert!(matches!(
        rig.decap.set_local_addrs(&too_many, GUE_PORT),
        Err(DecapError::TooManyAddresses { .. })
    ));
}

/// With prefixes to take tunnels from (`lbctl decap attach --from`), every
/// kind of tunnel, over IPv4 and IPv6, is stripped from a source inside
/// them and dropped (`drop_source_not_allowed`) from one outside, even
/// next to the boundary; other UDP to the host passes whatever its
/// source. Without prefixes, tunnels come from anywhere again.
#[test]
fn tunnels_are_taken_only_from_the_given_prefixes() {
    let mut rig = rig();
    let addrs = [ip(BACKEND_V4), ip(BACKEND_V6)];
    // Host bits are cleared: the trie holds networks.
    let from: Vec<ipnet::IpNet> = vec![
        "10.255.0.77/24".parse().unwrap(),
        "fd00:ff::/64".parse().unwrap(),
    ];
    rig.decap
        .set_tunnels(&addrs, GUE_PORT, &from)
        .expect("write addresses and prefixes");
    let mut listed = rig.decap.sources().expect("read prefixes");
    listed.sort();
    let want: Vec<ipnet::IpNet> = vec![
        "10.255.0.0/24".parse().unwrap(),
        "fd00:ff::/64".parse().unwrap(),
    ];
    assert_eq!(listed, want);
    let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"x");
    let cases = [
        (BACKEND_V4, "10.255.0.255", "10.255.1.0"),
        (BACKEND_V6, "fd00:ff::ffff:1", "fd00:ff:0:1::1"),
    ];
    for (dst, inside, outside) in cases {
        let kinds = [
            (Outer::ipip(dst), DecapCounter::DecapIpip),
            (Outer::gre(dst), DecapCounter::DecapGre),
            (Outer::gue(dst), DecapCounter::DecapGue),
        ];
        for (outer, decapsulated) in kinds {
            let from_inside = Outer {
                src: inside,
                ..outer
            };
            rig.run_counted(inside, &encap(&inner, from_inside), decapsulated);
            let from_outside = Outer {
                src: outside,
                ..outer
            };
            rig.run_counted(
                outside,
                &encap(&inner, from_outside),
                DecapCounter::DropSource,
            );
        }
        let not_gue = Outer {
            src: outside,
            gue_port: GUE_PORT + 1,
            ..Outer::gue(dst)
        };
        let packet = encap(&inner, not_gue);
        let (_, out) = rig.run_counted("plain udp", &packet, DecapCounter::PassNotTunnel);
        assert_eq!(out, packet, "other UDP passes untouched");
    }
    // IP-in-IP from outside is dropped before anything else is judged:
    // an outer fragment of it is not passed to the stack either.
    let outside_v4 = Outer {
        src: "10.255.1.0",
        ..Outer::ipip(BACKEND_V4)
    };
    let mut fragment = encap(&inner, outside_v4);
    fragment[20] = 0x20; // MF
    fix_ipv4_checksum(&mut fragment, 14);
    rig.run_counted("fragment from outside", &fragment, DecapCounter::DropSource);
    // An IPv6 source that maps an allowed IPv4 address is no IPv4 source.
    let mapped = Outer {
        src: "::ffff:10.255.0.1",
        ..Outer::ipip(BACKEND_V6)
    };
    rig.run_counted(
        "v4-mapped v6 source",
        &encap(&inner, mapped),
        DecapCounter::DropSource,
    );
    // IPv6 prefixes over the IPv4 sources' part of the trie are refused.
    for over in ["::/0", "::ffff:10.0.0.0/104"] {
        let net: ipnet::IpNet = over.parse().unwrap();
        assert!(matches!(
            rig.decap.set_tunnels(&addrs, GUE_PORT, &[net]),
            Err(DecapError::MappedPrefix(_))
        ));
    }
    // A full set replaced by another full set: the map holds both for a
    // moment.
    let full = |third: u8| -> Vec<ipnet::IpNet> {
        (0..lb_common::consts::DECAP_MAX_FROM)
            .map(|i| ipnet::IpNet::new(IpAddr::from([10, third, i as u8, 0]), 24).unwrap())
            .collect()
    };
    for third in [200, 201] {
        let dropped = rig
            .decap
            .set_tunnels(&addrs, GUE_PORT, &full(third))
            .expect("a full set");
        assert_eq!(rig.decap.sources().expect("read").len(), 256);
        // What the set before had and this one lacks, said to the caller.
        let gone: Vec<ipnet::IpNet> = match third {
            200 => want.clone(),
            _ => full(200),
        };
        assert_eq!(dropped, gone, "the prefixes no longer taken");
    }
    let mut one_too_many = full(202);
    one_too_many.push("10.203.0.0/16".parse().unwrap());
    assert!(matches!(
        rig.decap.set_tunnels(&addrs, GUE_PORT, &one_too_many),
        Err(DecapError::TooManyPrefixes { count: 257, .. })
    ));
    assert_eq!(rig.decap.sources().expect("read").len(), 256, "kept");
    // Too many local addresses: refused before the prefixes change (the
    // addresses that still run would take tunnels from the new ones).
    let many: Vec<IpAddr> = (0..=256u32)
        .map(|i| IpAddr::from([10, 9, (i >> 8) as u8, i as u8]))
        .collect();
    let new_prefix: ipnet::IpNet = "10.204.0.0/16".parse().unwrap();
    assert!(matches!(
        rig.decap.set_tunnels(&many, GUE_PORT, &[new_prefix]),
        Err(DecapError::TooManyAddresses { count: 257, .. })
    ));
    let kept = rig.decap.sources().expect("read");
    assert_eq!(kept.len(), 256, "kept");
    assert!(!kept.contains(&new_prefix), "not added");
    rig.decap
        .set_tunnels(&addrs, GUE_PORT, &[])
        .expect("no prefixes");
    assert_eq!(rig.decap.sources().expect("read prefixes"), vec![]);
    let anyone = Outer {
        src: "192.0.2.99",
        ..Outer::ipip(BACKEND_V4)
    };
    rig.run_counted("anyone", &encap(&inner, anyone), DecapCounter::DecapIpip);
}

/// Inserts IPv6 extension headers (type, bytes written out by hand; the
/// first byte of each, its next header, is filled in here) after the fixed
/// IPv6 header of an untagged `frame`, and fixes the payload length.
fn with_ipv6_extensions(frame: &[u8], exts: &[Ext]) -> Vec<u8> {
    let (l2, fixed) = (14, 40);
    let mut out = frame[..l2 + fixed].to_vec();
    let upper = out[l2 + 6];
    out[l2 + 6] = exts[0].0;
    for (i, (_, bytes)) in exts.iter().enumerate() {
        let mut h = bytes.to_vec();
        h[0] = exts.get(i + 1).map_or(upper, |e| e.0);
        out.extend_from_slice(&h);
    }
    out.extend_from_slice(&frame[l2 + fixed..]);
    let payload = (out.len() - l2 - fixed) as u16;
    put16(&mut out, l2 + 4, payload);
    out
}

/// An IPv6 extension header: its type and its bytes.
type Ext<'a> = (u8, &'a [u8]);
/// A case: its name, the frame, the extension headers to put in it.
type ExtCase<'a> = (&'a str, &'a [u8], &'a [Ext<'a>]);

/// Destination options (60) holding one 4-byte PadN: 8 bytes.
const DSTOPTS: Ext = (60, &[0, 0, 1, 4, 0, 0, 0, 0]);
/// A first fragment (44): offset 0, more fragments, id 7.
const FIRST_FRAGMENT: Ext = (44, &[0, 0, 0x00, 0x01, 0, 0, 0, 7]);
/// A later fragment: offset 1 (8 bytes), id 7.
const LATER_FRAGMENT: Ext = (44, &[0, 0, 0x00, 0x08, 0, 0, 0, 7]);

/// lb never sends a tunnel behind IPv6 extension headers, but the kernel's
/// tunnel drivers would strip one. To an address that takes tunnels only
/// from given prefixes, IP-in-IP or GRE from outside them behind a fragment
/// header or options, or behind a chain too long to walk, is dropped;
/// anything else with extension headers passes untouched, as before.
#[test]
fn a_tunnel_behind_ipv6_extension_headers_from_outside_is_dropped() {
    let mut rig = rig();
    let addrs = [ip(BACKEND_V4), ip(BACKEND_V6)];
    let from: Vec<ipnet::IpNet> = vec!["fd00:ff::/64".parse().unwrap()];
    rig.decap
        .set_tunnels(&addrs, GUE_PORT, &from)
        .expect("write addresses and prefixes");
    let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"hidden");
    let outside = |outer: Outer<'static>| Outer {
        src: "fd00:fe::1",
        ..outer
    };
    let ipip = encap(&inner, outside(Outer::ipip(BACKEND_V6)));
    let gre = encap(&inner, outside(Outer::gre(BACKEND_V6)));
    let five = [DSTOPTS; 5];
    // Destination options of (128 + 1) × 8 bytes: one PadN of 255 bytes,
    // then Pad1s (zeros). More than the 1,024 bytes lb walks.
    let mut big = vec![0u8; 1032];
    big[1..4].copy_from_slice(&[128, 1, 255]);
    let dropped: [ExtCase; 5] = [
        ("first fragment, ip-in-ip", &ipip, &[FIRST_FRAGMENT]),
        ("options, gre", &gre, &[DSTOPTS]),
        (
            "options, first fragment, options, gre",
            &gre,
            &[DSTOPTS, FIRST_FRAGMENT, DSTOPTS],
        ),
        ("five options headers, ip-in-ip", &ipip, &five),
        ("options of 1,032 bytes, ip-in-ip", &ipip, &[(60, &big)]),
    ];
    for (name, packet, exts) in dropped {
        let frame = with_ipv6_extensions(packet, exts);
        rig.run_counted(name, &frame, DecapCounter::DropSource);
    }
    // A first fragment that ends inside the chain (fragment header, then
    // options whose next header is more options): the kernel reassembles
    // it, and the rest of the chain, up to GRE, may be in the next one.
    let mut split = with_ipv6_extensions(&gre, &[FIRST_FRAGMENT, DSTOPTS, DSTOPTS]);
    split.truncate(14 + 40 + 16);
    put16(&mut split, 14 + 4, 16);
    rig.run_counted(
        "a first fragment cut inside its chain",
        &split,
        DecapCounter::DropSource,
    );
    // An options header cut short by the frame's end (the kernel drops it).
    let cut = with_ipv6_extensions(&ipip, &[DSTOPTS]);
    let cut = &cut[..14 + 40 + 4];
    let (_, out) = rig.run_counted("cut short", cut, DecapCounter::PassNotTunnel);
    assert_eq!(out, cut, "cut short: passed untouched");
    let udp = encap(&inner, outside(Outer::gue(BACKEND_V6)));
    let from_inside = encap(&inner, Outer::ipip(BACKEND_V6));
    let to_another = encap(&inner, outside(Outer::ipip(OTHER_V6)));
    let plain = tcp6_plain(BACKEND_V6);
    let passed: [ExtCase; 5] = [
        ("later fragment, ip-in-ip", &ipip, &[LATER_FRAGMENT]),
        ("first fragment, udp", &udp, &[FIRST_FRAGMENT]),
        ("options, tcp", &plain, &[DSTOPTS]),
        (
            "from inside, first fragment, ip-in-ip",
            &from_inside,
            &[FIRST_FRAGMENT],
        ),
        (
            "to another host, options, ip-in-ip",
            &to_another,
            &[DSTOPTS],
        ),
    ];
    for (name, packet, exts) in passed {
        let frame = with_ipv6_extensions(packet, exts);
        let (_, out) = rig.run_counted(name, &frame, DecapCounter::PassNotTunnel);
        assert_eq!(out, frame, "{name}: passed untouched");
    }
    rig.decap
        .set_tunnels(&addrs, GUE_PORT, &[])
        .expect("no prefixes");
    let frame = with_ipv6_extensions(&ipip, &[FIRST_FRAGMENT]);
    rig.run_counted("without prefixes", &frame, DecapCounter::PassNotTunnel);
}

// ---------------------------------------------------------------- attached

/// The id of the XDP program attached to `iface`, if any.
/// The XDP program on `iface` once a detach took effect: the kernel
/// releases a link with its last reference, and a child another test
/// thread forks holds copies of our descriptors until it execs, so give
/// it a moment (bounded) before reading the attachment.
fn xdp_prog_id_after_detach(iface: &str) -> Option<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let id = xdp_prog_id(iface);
        if id.is_none() || std::time::Instant::now() > deadline {
            return id;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn xdp_prog_id(iface: &str) -> Option<u64> {
    let json = ip_cmd(&format!("-j -d link show dev {iface}"));
    let links: serde_json::Value = serde_json::from_str(&json).expect("ip -j output");
    links[0]["xdp"]["prog"]["id"].as_u64()
}

/// A veth pair: `dcp-a` (the wire, LB_MAC) and `dcp-b` (the backend's NIC,
/// BACKEND_MAC, with the backend's addresses); VIPs on `lo`.
fn backend_netns_setup() {
    ip_cmd("link set lo up");
    ip_cmd(&format!(
        "link add dcp-a address {} type veth peer name dcp-b address {}",
        mac(LB_MAC),
        mac(BACKEND_MAC)
    ));
    ip_cmd(&format!("addr add {BACKEND_V4}/24 dev dcp-b"));
    ip_cmd(&format!("-6 addr add {BACKEND_V6}/64 dev dcp-b nodad"));
    ip_cmd("link set dcp-a up");
    ip_cmd("link set dcp-b up");
    ip_cmd(&format!("addr add {VIP_V4}/32 dev lo"));
    ip_cmd(&format!("-6 addr add {VIP_V6}/128 dev lo"));
    ip_cmd("route add default dev dcp-b");
}

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Sends `frame` out of `iface` as is.
fn send_frame(iface: &str, frame: &[u8]) {
    let name = CString::new(iface).expect("interface name");
    // SAFETY: `name` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no interface {iface}");
    // SAFETY: socket(2) has no memory preconditions.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(fd >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut sll_addr = [0u8; 8];
    sll_addr[..6].copy_from_slice(&frame[..6]);
    let addr = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: 0,
        sll_ifindex: index as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr,
    };
    // SAFETY: the buffer and the address are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(
        sent,
        frame.len() as isize,
        "sendto: {}",
        io::Error::last_os_error()
    );
}

/// A UDP socket bound to `addr:port`, with a short receive timeout.
fn udp_listener(addr: &str, port: u16) -> UdpSocket {
    let sock = UdpSocket::bind((ip(addr), port)).expect("bind udp listener");
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    sock
}

fn received(sock: &UdpSocket) -> Option<Vec<u8>> {
    let mut buf = [0u8; 2048];
    match sock.recv(&mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// A pin directory on the host's bpffs, removed (with whatever is pinned in
/// it) when dropped, so that a failing test leaves nothing attached.
struct PinDir(PathBuf);

impl PinDir {
    fn new(test: &str) -> PinDir {
        let bpffs = Path::new("/sys/fs/bpf");
        assert!(
            bpffs.is_dir(),
            "no bpffs at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf)"
        );
        let dir = bpffs.join(format!("lb-test-decap-{}-{test}", std::process::id()));
        decap::detach(&dir).expect("clear a leftover pin directory");
        PinDir(dir)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        decap::detach(&self.0).ok();
    }
}

fn counter(values: &[CounterValue], c: DecapCounter) -> u64 {
    values[c as usize].packets
}

#[test]
fn attached_program_decapsulates_for_the_stack_and_survives_replacement() {
    require_root("decap");
    in_private_netns(|| {
        backend_netns_setup();
        let pins = PinDir::new("attach");
        let dir = pins.0.as_path();
        // No addresses given: the program takes dcp-b's own.
        decap::attach("dcp-b", XdpMode::Driver, &[], GUE_PORT, &[], dir).expect("attach");
        let first = xdp_prog_id("dcp-b").expect("an XDP program on dcp-b");
        assert!(dir.join(decap::LINK_PIN).exists(), "link pinned");
        // Everything we loaded is closed: only the pins keep it attached.

        let sock4 = udp_listener(VIP_V4, 53);
        let sock6 = udp_listener(VIP_V6, 53);
        let cases = [
            ("4in4", Outer::ipip(BACKEND_V4), false),
            ("6in6", Outer::ipip(BACKEND_V6), true),
            ("gre ipv6 over ipv4", Outer::gre(BACKEND_V4), true),
            ("gre ipv4 over ipv6", Outer::gre(BACKEND_V6), false),
        ];
        for (name, outer, inner_v6) in cases {
            let payload = format!("datagram {name}");
            let inner = inner_frame(inner_v6, L4::Udp, Vlan::Untagged, payload.as_bytes());
            send_frame("dcp-a", &encap(&inner, outer));
            let sock = if inner_v6 { &sock6 } else { &sock4 };
            assert_eq!(
                received(sock).as_deref(),
                Some(payload.as_bytes()),
                "{name}: the inner datagram reaches the socket on the VIP"
            );
        }
        // To another backend: passed to the stack, which has no use for it.
        let stray = inner_frame(false, L4::Udp, Vlan::Untagged, b"stray");
        send_frame("dcp-a", &encap(&stray, Outer::ipip(OTHER_V4)));
        assert_eq!(
            received(&sock4),
            None,
            "not decapsulated for another address"
        );

        let c = decap::counters_pinned(dir).expect("pinned counters");
        assert_eq!(c.len(), DECAP_COUNTER_SLOTS as usize);
        assert_eq!(counter(&c, DecapCounter::DecapIpip), 2);
        assert_eq!(counter(&c, DecapCounter::DecapGre), 2);
        assert_eq!(counter(&c, DecapCounter::PassNotLocal), 1);

        // Attach again, IPv4 only: the program is replaced inside the pinned
        // link, the counters carry on, the address set is replaced.
        decap::attach(
            "dcp-b",
            XdpMode::Driver,
            &[ip(BACKEND_V4)],
            GUE_PORT,
            &[],
            dir,
        )
        .expect("re-attach");
        let second = xdp_prog_id("dcp-b").expect("still an XDP program on dcp-b");
        assert_ne!(first, second, "a new program in the link");
        let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"after replace");
        send_frame("dcp-a", &encap(&inner, Outer::ipip(BACKEND_V4)));
        assert_eq!(received(&sock4).as_deref(), Some(&b"after replace"[..]));
        let inner = inner_frame(true, L4::Udp, Vlan::Untagged, b"v6 gone");
        send_frame("dcp-a", &encap(&inner, Outer::ipip(BACKEND_V6)));
        assert_eq!(received(&sock6), None, "{BACKEND_V6} no longer local");
        let c = decap::counters_pinned(dir).expect("pinned counters");
        assert_eq!(counter(&c, DecapCounter::DecapIpip), 3);
        assert_eq!(counter(&c, DecapCounter::PassNotLocal), 2);

        // The same pin directory cannot take over another interface.
        match decap::attach(
            "dcp-a",
            XdpMode::Driver,
            &[ip(BACKEND_V4)],
            GUE_PORT,
            &[],
            dir,
        ) {
            Err(DecapError::PinnedElsewhere { .. }) => {}
            other => panic!("attach to dcp-a with dcp-b's pins: {other:?}"),
        }
        assert_eq!(xdp_prog_id("dcp-a"), None);
        assert_eq!(xdp_prog_id("dcp-b"), Some(second));

        decap::detach(dir).expect("detach");
        assert!(!dir.exists(), "pin directory removed");
        assert_eq!(xdp_prog_id_after_detach("dcp-b"), None, "detached");
        let inner = inner_frame(false, L4::Udp, Vlan::Untagged, b"after detach");
        send_frame("dcp-a", &encap(&inner, Outer::ipip(BACKEND_V4)));
        assert_eq!(received(&sock4), None, "no decapsulation once detached");
        decap::detach(dir).expect("detaching twice is fine");
    });
}

#[test]
fn attach_errors_leave_nothing_behind() {
    require_root("decap");
    in_private_netns(|| {
        ip_cmd("link add dcp-a type veth peer name dcp-b");
        let pins = PinDir::new("errors");
        let dir = pins.0.as_path();
        match decap::attach("nope0", XdpMode::Skb, &[], GUE_PORT, &[], dir) {
            Err(DecapError::UnknownInterface { .. }) => {}
            other => panic!("attach to a missing interface: {other:?}"),
        }
        // Down, so not even a link-local address.
        match decap::attach("dcp-b", XdpMode::Skb, &[], GUE_PORT, &[], dir) {
            Err(DecapError::NoAddresses { .. }) => {}
            other => panic!("attach without addresses: {other:?}"),
        }
        assert!(!dir.exists(), "nothing pinned");

        // An XDP program that is not ours is in the way.
        let _pass = PassProgram::attach("dcp-b").expect("attach lb_pass");
        let err = decap::attach("dcp-b", XdpMode::Skb, &[ip(BACKEND_V4)], GUE_PORT, &[], dir)
            .expect_err("dcp-b is taken");
        assert!(
            matches!(err, DecapError::Program { .. }),
            "unexpected error {err:?}"
        );
        assert!(!dir.exists(), "a failed attach unpins what it pinned");
    });
}

#[test]
fn pass_program_is_attached_while_it_lives() {
    require_root("decap");
    in_private_netns(|| {
        ip_cmd("link add dcp-a type veth peer name dcp-b");
        assert_eq!(xdp_prog_id("dcp-a"), None);
        let pass = PassProgram::attach("dcp-a").expect("attach lb_pass");
        assert!(xdp_prog_id("dcp-a").is_some(), "attached");
        drop(pass);
        assert_eq!(xdp_prog_id("dcp-a"), None, "detached on drop");
    });
}

#[test]
fn a_pinned_link_whose_interface_is_gone_is_replaced() {
    require_root("decap");
    in_private_netns(|| {
        let pins = PinDir::new("stale");
        let dir = pins.0.as_path();
        let setup = || {
            ip_cmd("link add dcp-a type veth peer name dcp-b");
            ip_cmd("link set dcp-b up");
        };
        setup();
        decap::attach(
            "dcp-b",
            XdpMode::Driver,
            &[ip(BACKEND_V4)],
            GUE_PORT,
            &[],
            dir,
        )
        .expect("attach");
        // Deleting the interface leaves a pinned link attached to nothing.
        ip_cmd("link del dcp-a");
        setup();
        assert_eq!(xdp_prog_id("dcp-b"), None);
        decap::attach(
            "dcp-b",
            XdpMode::Driver,
            &[ip(BACKEND_V4)],
            GUE_PORT,
            &[],
            dir,
        )
        .expect("attach over a stale pin");
        assert!(xdp_prog_id("dcp-b").is_some(), "attached to the new dcp-b");
        decap::detach(dir).expect("detach");
        assert_eq!(xdp_prog_id_after_detach("dcp-b"), None);
    });
}

//! Fragments, in the kernel (`lb_xdp`): each VIP's fragment policy
//! (`drop`, or `hash`: every fragment and every whole datagram of a
//! 3-tuple to one backend, without a connection-table entry), fragments to
//! other addresses and ports passed, and IPv6 atomic fragments, which are
//! whole packets.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use std::{collections::BTreeSet, net::IpAddr};

use etherparse::{IpNumber, PacketBuilder};
use lb::{
    config::{Encap, FragmentPolicy},
    predict::{Via, predict},
};
use lb_common::{Counter, FlowKey, consts::*};

use common::{
    XDP_DROP, XDP_PASS, XDP_TX, ip,
    packets::{tcp4, udp4, udp6, with_ipv6_ext},
    v4,
    xdp::{
        BACKENDS, CLIENT_MAC, CLIENT_V4, CLIENT_V6, Expect, Fixture, LB_MAC, Rig, TO_LB,
        V4_BACKENDS, V6_BACKENDS, Vips, check_encapsulated, run_table, tunnel_dst,
    },
};

/// An IPv6 fragment header laid out by hand from RFC 8200 §4.5: next
/// header, reserved, then the offset in 8-byte units (13 bits), two
/// reserved bits and the M flag, then the identification. (etherparse
/// 0.16 writes the M flag and the offset to the wrong bits.)
fn frag6(next: u8, offset: u16, more: bool, id: u32) -> [u8; 8] {
    let word = (offset << 3) | u16::from(more);
    let [a, b] = word.to_be_bytes();
    let [i0, i1, i2, i3] = id.to_be_bytes();
    [next, 0, a, b, i0, i1, i2, i3]
}

/// Fragments to the standard VIPs, whose policy is `drop`, and to other
/// addresses.
fn fixtures(v: &Vips) -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    let mut frag_mf = udp4(TO_LB, "10.0.0.10", 53, 5000, b"frag");
    frag_mf[20] |= 0x20; // MF
    let mut frag_off = udp4(TO_LB, "10.0.0.10", 53, 5000, b"frag");
    frag_off[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 16×8, DF clear
    let frag_hdr = frag6(IpNumber::UDP.0, 0, true, 7);
    let atomic_frag = frag6(IpNumber::UDP.0, 0, false, 8);
    let mut frag_to_other = udp4(TO_LB, "10.9.9.9", 53, 5000, b"frag");
    frag_to_other[20] |= 0x20; // MF
    vec![
        f(
            "ipv4 fragment to another address",
            frag_to_other,
            Pass(PassFragmentNotVip),
        ),
        f(
            "ipv4 first fragment (MF), vip drops fragments",
            frag_mf,
            Dropped(DropFragment),
        ),
        f(
            "ipv4 later fragment (offset), vip drops fragments",
            frag_off,
            Dropped(DropFragment),
        ),
        f(
            "ipv6 fragment, vip drops fragments",
            with_ipv6_ext(udp6(TO_LB, "2001:db8::10", 53, 1, b"x"), 44, &frag_hdr),
            Dropped(DropFragment),
        ),
        f(
            "ipv6 atomic fragment (offset 0, no M) is a whole packet",
            with_ipv6_ext(
                udp6(TO_LB, "2001:db8::10", 53, 7004, b"x"),
                44,
                &atomic_frag,
            ),
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
    ]
}

#[test]
fn fixture_table() {
    run_table(fixtures);
}

/// A UDP datagram from `client` to `vip:53` cut into two IPv4 fragments:
/// `(first, later, whole)`.
fn fragments4(client: [u8; 4], vip: &str, sport: u16) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut whole = vec![];
    PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4(client, v4(vip), 64)
        .udp(sport, 53)
        .write(&mut whole, &[0x77; 40])
        .expect("udp");
    // First: UDP header and 16 data bytes (24 bytes, offset 0, MF).
    let mut first = whole[..14 + 20 + 24].to_vec();
    first[16..18].copy_from_slice(&44u16.to_be_bytes());
    first[18..20].copy_from_slice(&0x4242u16.to_be_bytes());
    first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    // Later: the remaining 24 bytes at offset 24 (3 × 8), no MF.
    let mut later = whole[..14 + 20].to_vec();
    later.extend_from_slice(&whole[14 + 20 + 24..]);
    later[16..18].copy_from_slice(&44u16.to_be_bytes());
    later[18..20].copy_from_slice(&0x4242u16.to_be_bytes());
    later[20..22].copy_from_slice(&3u16.to_be_bytes());
    (first, later, whole)
}

fn fragments6(vip: &str, sport: u16) -> (Vec<u8>, Vec<u8>) {
    let first_hdr = frag6(IpNumber::UDP.0, 0, true, 0x99);
    let later_hdr = frag6(IpNumber::UDP.0, 3, false, 0x99);
    let first = with_ipv6_ext(udp6(TO_LB, vip, 53, sport, &[0x55; 16]), 44, &first_hdr);
    // The later fragment's payload is plain data; a UDP builder's bytes
    // serve as well, the program must not read them as a header.
    let later = with_ipv6_ext(udp6(TO_LB, vip, 53, 1, &[0x66; 16]), 44, &later_hdr);
    (first, later)
}

#[test]
fn fragments_follow_their_vips_policy() {
    let mut rig = Rig::new(1 << 12);
    let v = rig.standard_vips();
    let hash4 = rig.add_vip("10.0.0.70:53/udp", Encap::Ipip, true, &V4_BACKENDS);
    let drop4 = rig.add_vip("10.0.0.70:5353/udp", Encap::Ipip, true, &V4_BACKENDS);
    let hash6 = rig.add_vip("[2001:db8::70]:53/udp", Encap::Gre, true, &V6_BACKENDS);
    for key in [hash4, hash6] {
        rig.vip_mut(&key).fragments = FragmentPolicy::Hash;
    }
    rig.apply();
    let _ = drop4;

    ipv4_fragments_follow_their_3_tuple(&mut rig);
    ipv6_fragments_follow_their_flow(&mut rig);

    // TCP to the same address has no fragment policy of its own: not a VIP.
    let mut tcp_frag = tcp4(TO_LB, "10.0.0.70", 80, 1, false, b"x");
    tcp_frag[20] |= 0x20;
    let (action, _, _) = rig.run_counted(&tcp_frag, Counter::PassFragmentNotVip);
    assert_eq!(action, XDP_PASS);

    // Switching the VIP to `drop` drops them.
    rig.vip_mut(&hash4).fragments = FragmentPolicy::Drop;
    rig.apply();
    let (first, later, _) = fragments4(CLIENT_V4, "10.0.0.70", 6000);
    for frag in [&first, &later] {
        let (action, _, _) = rig.run_counted(frag, Counter::DropFragment);
        assert_eq!(action, XDP_DROP);
    }
    let _ = v;
}

/// IPv4: both fragments of a datagram, and its unfragmented packets, go to
/// the backend of the 3-tuple; across clients, to several backends.
fn ipv4_fragments_follow_their_3_tuple(rig: &mut Rig) {
    let mut seen = BTreeSet::new();
    for c in 1..=24u8 {
        let client = [192, 0, 2, c];
        let (first, later, whole) = fragments4(client, "10.0.0.70", 6000 + u16::from(c));
        let three = FlowKey::new(IpAddr::from(client), ip("10.0.0.70"), PROTO_UDP, 0, 0);
        let want = predict(rig.dp(), &three, true).expect("predict");
        // The reference knows no 3-tuple VIP; ask it for the VIP's pick.
        let flow = FlowKey::new(IpAddr::from(client), ip("10.0.0.70"), PROTO_UDP, 1, 53);
        let pick = predict(rig.dp(), &flow, true)
            .expect("predict")
            .expect("vip")
            .backend
            .expect("backend");
        assert!(want.is_none(), "port 0 is no VIP of this address");
        for (name, frag) in [("first", &first), ("later", &later)] {
            let (action, out, events) = rig.run_counted(frag, Counter::FwdFragment);
            assert_eq!(action, XDP_TX, "client {c}: {name} fragment forwarded");
            assert!(
                events.is_empty(),
                "client {c}: fragments touch no flow entry"
            );
            check_encapsulated(frag, &out, &pick, ENCAP_IPIP);
        }
        let (action, out) = rig.run(&whole);
        assert_eq!(action, XDP_TX);
        assert_eq!(
            Some(ip(BACKENDS[tunnel_dst(&out)])),
            pick.ip(),
            "client {c}: whole datagrams go where the fragments go"
        );
        seen.insert(tunnel_dst(&out));
    }
    assert!(seen.len() >= 2, "fragments of 24 clients spread: {seen:?}");
}

/// IPv6, GRE: both fragments go to the backend of the datagram's flow.
fn ipv6_fragments_follow_their_flow(rig: &mut Rig) {
    for sport in [7000u16, 7001] {
        let (first, later) = fragments6("2001:db8::70", sport);
        let flow = FlowKey::new(
            IpAddr::from(CLIENT_V6),
            ip("2001:db8::70"),
            PROTO_UDP,
            sport,
            53,
        );
        let pick = predict(rig.dp(), &flow, true)
            .expect("predict")
            .expect("vip")
            .backend
            .expect("backend");
        for frag in [&first, &later] {
            let (action, out, _) = rig.run_counted(frag, Counter::FwdFragment);
            assert_eq!(action, XDP_TX, "ipv6 fragment forwarded");
            check_encapsulated(frag, &out, &pick, ENCAP_GRE);
        }
    }
}

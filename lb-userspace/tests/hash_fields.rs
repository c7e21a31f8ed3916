//! What picks a new flow's backend, in the kernel (`lb_xdp`): a VIP's hash
//! fields (`hash: [src_ip]` sends every connection of a client to one
//! backend; `[src_ip/64]` every IPv6 client of a /64) and the tier's
//! secret hash key (another placement, which `lb::predict` follows when
//! it reads the key from the maps). Established connections keep their
//! backend through a change of key: the connection table is keyed by the
//! whole 5-tuple, without the key.
//!
//! Needs root; without it every test fails with a message saying so.

mod common;

use std::{collections::BTreeSet, net::IpAddr};

use lb::{config::Encap, config::HashFields, predict::predict};
use lb_common::{Counter, FlowKey, consts::PROTO_TCP};

use common::{
    ip,
    packets::{Link, tcp4, tcp6},
    xdp::{BACKENDS, Rig, TO_LB, V4_BACKENDS, V6_BACKENDS, forward, with_settings},
};

fn from_v4(client: [u8; 4]) -> Link {
    Link {
        client_v4: client,
        ..TO_LB
    }
}

fn from_v6(client: [u8; 16]) -> Link {
    Link {
        client_v6: client,
        ..TO_LB
    }
}

/// The backend the reference predicts for a SYN of this flow.
fn predicted(rig: &Rig, src: IpAddr, dst: &str, sport: u16, dport: u16) -> IpAddr {
    let flow = FlowKey::new(src, ip(dst), PROTO_TCP, sport, dport);
    predict(rig.dp(), &flow, true)
        .expect("predict")
        .expect("a VIP")
        .backend
        .and_then(|b| b.ip())
        .expect("a backend")
}

#[test]
fn a_source_only_vip_sends_every_connection_of_a_client_to_one_backend() {
    let mut rig = Rig::new(1 << 12);
    let affinity = rig.add_vip("10.0.0.10:80/tcp", Encap::Ipip, true, &V4_BACKENDS);
    rig.vip_mut(&affinity).hash = HashFields::parse(["src_ip"]).expect("fields");
    rig.apply();
    rig.add_vip("10.0.0.20:80/tcp", Encap::Ipip, true, &V4_BACKENDS);
    let mut clients_per_backend = BTreeSet::new();
    for c in 0..40u8 {
        let client = [198, 51, 100, c];
        let mut seen = BTreeSet::new();
        for sport in 40_000..40_050 {
            let syn = tcp4(from_v4(client), "10.0.0.10", 80, sport, true, b"");
            let (to, via) = forward(&mut rig, &syn);
            assert_eq!(via, Counter::FwdMaglev);
            assert_eq!(
                ip(BACKENDS[to]),
                predicted(&rig, IpAddr::from(client), "10.0.0.10", sport, 80),
                "the kernel and the reference agree"
            );
            seen.insert(to);
        }
        assert_eq!(
            seen.len(),
            1,
            "client {client:?}: 50 connections, backends {seen:?}"
        );
        clients_per_backend.extend(seen);
    }
    assert_eq!(
        clients_per_backend.len(),
        3,
        "40 clients spread over the 3 backends"
    );
    // The 5-tuple (the default): one client's connections spread.
    let spread: BTreeSet<usize> = (40_000..40_050)
        .map(|sport| forward(&mut rig, &tcp4(TO_LB, "10.0.0.20", 80, sport, true, b"")).0)
        .collect();
    assert_eq!(spread.len(), 3, "the 5-tuple spreads one client's ports");
}

#[test]
fn an_ipv6_client_is_hashed_on_its_64_when_asked() {
    let mut rig = Rig::new(1 << 12);
    let vip = rig.add_vip("[2001:db8::10]:80/tcp", Encap::Ipip, true, &V6_BACKENDS);
    rig.vip_mut(&vip).hash = HashFields::parse(["src_ip/64"]).expect("fields");
    rig.apply();
    let mut per_prefix = BTreeSet::new();
    for prefix in 0..30u8 {
        let mut seen = BTreeSet::new();
        for host in 1..=20u8 {
            // 2001:db8:0:PREFIX::HOST:HOST — privacy addresses of one /64.
            let mut client = [
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, prefix, 0, 0, 0, 0, host, 0, 0, host,
            ];
            client[9] = host.wrapping_mul(7);
            let syn = tcp6(
                from_v6(client),
                "2001:db8::10",
                80,
                50_000 + u16::from(host),
                true,
                b"",
            );
            let (to, _) = forward(&mut rig, &syn);
            assert_eq!(
                ip(BACKENDS[to]),
                predicted(
                    &rig,
                    IpAddr::from(client),
                    "2001:db8::10",
                    50_000 + u16::from(host),
                    80
                )
            );
            seen.insert(to);
        }
        assert_eq!(seen.len(), 1, "/64 number {prefix}: {seen:?}");
        per_prefix.extend(seen);
    }
    assert_eq!(
        per_prefix.len(),
        3,
        "30 prefixes spread over the 3 backends"
    );
}

#[test]
fn a_hash_key_moves_new_flows_only_and_the_reference_follows() {
    let mut rig = Rig::new(1 << 12);
    rig.add_vip("10.0.0.10:80/tcp", Encap::Ipip, true, &V4_BACKENDS);
    let ports = 30_000..30_300u16;
    let unkeyed: Vec<usize> = ports
        .clone()
        .map(|p| forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, p, true, b"")).0)
        .collect();
    // An established connection, before the key.
    let kept_port = 31_000;
    let (kept_to, _) = forward(
        &mut rig,
        &tcp4(TO_LB, "10.0.0.10", 80, kept_port, true, b""),
    );
    forward(
        &mut rig,
        &tcp4(TO_LB, "10.0.0.10", 80, kept_port, false, b""),
    );

    with_settings(&mut rig, |s| {
        s.hash_key = Some([0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321])
    });
    let client = IpAddr::from(common::xdp::CLIENT_V4);
    let keyed: Vec<usize> = ports
        .clone()
        .map(|p| {
            let (to, _) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, p, true, b""));
            assert_eq!(
                ip(BACKENDS[to]),
                predicted(&rig, client, "10.0.0.10", p, 80),
                "port {p}"
            );
            to
        })
        .collect();
    let moved = unkeyed.iter().zip(&keyed).filter(|(a, b)| a != b).count();
    // Two thirds of the flows should move (three equal backends).
    assert!(
        (150..=250).contains(&moved),
        "{moved} of 300 new flows moved with the key"
    );
    let (to, via) = forward(
        &mut rig,
        &tcp4(TO_LB, "10.0.0.10", 80, kept_port, false, b"data"),
    );
    assert_eq!(
        (to, via),
        (kept_to, Counter::FwdConntrack),
        "the connection kept its backend"
    );
    // Without the key again: the public placement.
    with_settings(&mut rig, |s| s.hash_key = None);
    let back: Vec<usize> = ports
        .map(|p| forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, p, true, b"")).0)
        .collect();
    assert_eq!(back, unkeyed);
}

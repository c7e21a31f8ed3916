//! Forwarding, in the kernel (`lb_xdp`): packets to a VIP leave tunnelled
//! to the backend the reference (`lb::predict`) names, per encapsulation
//! (IP-in-IP in all four family pairs, GRE, GUE), with the VIP's and the
//! backend's stats; the connection table (established flows keep their
//! backend across rebuilds, down and reused backends, eviction, a SYN
//! flood); health probes wrapped by `lb_probe_encap`; the outer source's
//! host bits; GUE tunnels taken apart by `lb_decap` on the backend.
//! Whole frames, byte for byte, are in `golden.rs`.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use std::{collections::BTreeSet, net::IpAddr};

use aya::programs::{TestRun, TestRunOptions};
use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, PacketBuilder};
use lb::{
    config::{BackendConfig, VipId},
    dataplane::Dataplane,
    decap::Decap,
    predict::{Via, predict},
};
use lb_common::{
    Counter, CounterValue, DatapathConfig, FlowBucket, FlowKey, consts::*, counters::DecapCounter,
};

use common::{
    XDP_PASS, XDP_TX, ip,
    packets::{tcp4, tcp4_vlan, tcp6, udp4, udp6},
    v4,
    xdp::{
        BACKENDS, CLIENT_MAC, CLIENT_V4, Expect, Fixture, GUE_TEST_PORT, GW_MAC, LB_MAC, M, Rig,
        TEST_CT_KEY, TO_LB, V4_BACKENDS, Vips, check_encapsulated, flow_of, forward,
        port_for_backend, run_table, tunnel_dst, with_settings,
    },
};

/// Forwarding per encapsulation. A TCP flow's SYN follows Maglev and is
/// kept apart (recent SYNs); its next packet goes where the SYN went and
/// records the flow (handshake); later ones follow the connection table.
/// A UDP flow's second packet follows the connection table; a VIP without
/// one follows Maglev every time.
fn fixtures(v: &Vips) -> Vec<Fixture> {
    use Counter::*;
    use Expect::*;
    let f = Fixture::new;
    vec![
        f(
            "tcp syn to ipv4 vip, ipip",
            tcp4(TO_LB, "10.0.0.10", 80, 40000, true, b""),
            Forward(v.tcp4, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp ack of that flow, ipip",
            tcp4(TO_LB, "10.0.0.10", 80, 40000, false, b""),
            Forward(v.tcp4, Via::Handshake, FwdHandshake),
        ),
        f(
            "tcp data of that flow, ipip",
            tcp4(TO_LB, "10.0.0.10", 80, 40000, false, b"data"),
            Forward(v.tcp4, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "tcp ack of an unseen flow",
            tcp4(TO_LB, "10.0.0.10", 80, 40100, false, &[7; 1200]),
            Forward(v.tcp4, Via::Maglev, FwdMaglev),
        ),
        f(
            "udp to ipv4 vip",
            udp4(TO_LB, "10.0.0.10", 53, 5353, b"query"),
            Forward(v.udp4, Via::Maglev, FwdMaglev),
        ),
        f(
            "udp again, same flow",
            udp4(TO_LB, "10.0.0.10", 53, 5353, b"query2"),
            Forward(v.udp4, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "tcp syn to ipv6 vip, ip6ip6",
            tcp6(TO_LB, "2001:db8::10", 80, 40000, true, b""),
            Forward(v.tcp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp ack to ipv6 vip",
            tcp6(TO_LB, "2001:db8::10", 80, 40000, false, b"data"),
            Forward(v.tcp6, Via::Handshake, FwdHandshake),
        ),
        f(
            "tcp ack to ipv6 vip, again",
            tcp6(TO_LB, "2001:db8::10", 80, 40000, false, b"data"),
            Forward(v.tcp6, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "udp to ipv6 vip",
            udp6(TO_LB, "2001:db8::10", 53, 5353, b"query"),
            Forward(v.udp6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp syn to ipv4 vip, ipv6 backends (4in6)",
            tcp4(TO_LB, "10.0.0.20", 80, 40000, true, b""),
            Forward(v.tcp4_on_v6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp ack 4in6",
            tcp4(TO_LB, "10.0.0.20", 80, 40000, false, b"data"),
            Forward(v.tcp4_on_v6, Via::Handshake, FwdHandshake),
        ),
        f(
            "tcp ack 4in6, again",
            tcp4(TO_LB, "10.0.0.20", 80, 40000, false, b"data"),
            Forward(v.tcp4_on_v6, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "udp 4in6",
            udp4(TO_LB, "10.0.0.20", 53, 5353, b"q"),
            Forward(v.udp4_on_v6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp syn gre over ipv4",
            tcp4(TO_LB, "10.0.0.30", 80, 40000, true, b""),
            Forward(v.gre4, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp ack gre over ipv4",
            tcp4(TO_LB, "10.0.0.30", 80, 40000, false, b"x"),
            Forward(v.gre4, Via::Handshake, FwdHandshake),
        ),
        f(
            "tcp ack gre over ipv4, again",
            tcp4(TO_LB, "10.0.0.30", 80, 40000, false, b"x"),
            Forward(v.gre4, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "tcp syn gre over ipv6",
            tcp6(TO_LB, "2001:db8::30", 443, 40000, true, b""),
            Forward(v.gre6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp syn gue over ipv4",
            tcp4(TO_LB, "10.0.0.80", 80, 40000, true, b""),
            Forward(v.gue4, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp ack gue over ipv4",
            tcp4(TO_LB, "10.0.0.80", 80, 40000, false, b"x"),
            Forward(v.gue4, Via::Handshake, FwdHandshake),
        ),
        f(
            "tcp ack gue over ipv4, again",
            tcp4(TO_LB, "10.0.0.80", 80, 40000, false, b"x"),
            Forward(v.gue4, Via::ConnTrack, FwdConntrack),
        ),
        f(
            "tcp syn gue, ipv6 over ipv6",
            tcp6(TO_LB, "2001:db8::80", 80, 40000, true, b""),
            Forward(v.gue6, Via::Maglev, FwdMaglev),
        ),
        f(
            "tcp syn gue, ipv4 over ipv6",
            tcp4(TO_LB, "10.0.0.80", 443, 40001, true, b""),
            Forward(v.gue4_on_v6, Via::Maglev, FwdMaglev),
        ),
        f(
            "vlan-tagged tcp to ipv4 vip keeps its tag",
            tcp4_vlan(TO_LB, "10.0.0.10", 80, 40050, 42),
            Forward(v.tcp4, Via::Maglev, FwdMaglev),
        ),
        f(
            "all-ports vip, any port",
            tcp4(TO_LB, "10.0.0.40", 9999, 40000, true, b""),
            Forward(v.all_ports4, Via::Maglev, FwdMaglev),
        ),
        f(
            "udp vip without connection table",
            udp4(TO_LB, "10.0.0.60", 53, 6000, b"q"),
            Forward(v.udp4_no_ct, Via::Maglev, FwdMaglevNoConntrack),
        ),
        f(
            "udp vip without connection table, again",
            udp4(TO_LB, "10.0.0.60", 53, 6000, b"q"),
            Forward(v.udp4_no_ct, Via::Maglev, FwdMaglevNoConntrack),
        ),
        f(
            "vip without backends",
            tcp4(TO_LB, "10.0.0.50", 80, 1, true, b""),
            Drop(v.empty4, DropNoBackend),
        ),
    ]
}

/// `lb_xdp_trace` (swapped in only while `lbctl trace` runs) is loaded
/// lazily, so nothing else here would notice it failing the verifier: its
/// stack is `lb_xdp`'s plus the trace writer's, and must fit 512 bytes.
#[test]
fn the_traced_program_passes_the_verifier() {
    let mut rig = Rig::new(1 << 12);
    rig.r
        .dataplane_mut()
        .select_program(true)
        .expect("lb_xdp_trace loads");
    rig.r
        .dataplane_mut()
        .select_program(false)
        .expect("lb_xdp again");
}

#[test]
fn fixture_table() {
    run_table(fixtures);
}

// ---------------------------------------------------------------- connection table

/// A TCP connection's handshake as the balancer sees it: the SYN, then
/// the ACK. Returns the backend both went to.
fn handshake(rig: &mut Rig, dst: &str, dport: u16, sport: u16) -> usize {
    let (to, via) = forward(rig, &tcp4(TO_LB, dst, dport, sport, true, b""));
    assert_eq!(via, Counter::FwdMaglev, "port {sport}: the SYN");
    assert_eq!(
        forward(rig, &tcp4(TO_LB, dst, dport, sport, false, b"")),
        (to, Counter::FwdHandshake),
        "port {sport}: the ACK goes where the SYN went"
    );
    to
}

/// The client's TCP flow from `sport` to the standard TCP VIP.
fn tcp_flow(sport: u16) -> FlowKey {
    FlowKey::new(
        IpAddr::from(CLIENT_V4),
        ip("10.0.0.10"),
        PROTO_TCP,
        sport,
        80,
    )
}

/// The activity class of a connection-table stamp.
fn class(stamp: u16) -> u16 {
    stamp >> CT_STAMP_CLASS_SHIFT
}

/// Sets every live way of bucket `index` to activity class `class`, last
/// seen `ticks_ago` before the newest stamp of the bucket (a way aged on
/// its own with [`age_entry`] keeps its age relative to that).
fn set_classes(rig: &mut Rig, index: u32, class: u16, ticks_ago: u16) {
    let mut bucket = rig.dp().flow_bucket(index).expect("bucket");
    let newest = bucket
        .stamps
        .iter()
        .map(|s| s & CT_STAMP_TIME)
        .max()
        .unwrap_or(0);
    for (e, s) in bucket.entries.iter().zip(bucket.stamps.iter_mut()) {
        if e.0 != 0 {
            *s = class << CT_STAMP_CLASS_SHIFT | (newest.wrapping_sub(ticks_ago) & CT_STAMP_TIME);
        }
    }
    rig.r
        .dataplane_mut()
        .set_flow_bucket(index, &bucket)
        .expect("write bucket");
}

/// Makes the connection-table entry of `flow` active (class 3), as four
/// packets would have.
fn activate(rig: &mut Rig, flow: &FlowKey) {
    let cfg = rig.dp().config().expect("config");
    let (index, tag) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let index = index & cfg.ct_mask;
    let mut bucket = rig.dp().flow_bucket(index).expect("bucket");
    let way = bucket
        .entries
        .iter()
        .position(|e| e.0 != 0 && e.tag() == tag)
        .expect("the flow's way");
    bucket.stamps[way] =
        CT_CLASS_ACTIVE << CT_STAMP_CLASS_SHIFT | (bucket.stamps[way] & CT_STAMP_TIME);
    rig.r
        .dataplane_mut()
        .set_flow_bucket(index, &bucket)
        .expect("write bucket");
}

/// Makes the connection-table entry of `flow` look last seen `ticks`
/// stamp ticks ago (as if the flow had been idle), keeping its state.
fn age_entry(rig: &mut Rig, flow: &FlowKey, ticks: u16) {
    let cfg = rig.dp().config().expect("config");
    let (index, tag) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let index = index & cfg.ct_mask;
    let mut bucket = rig.dp().flow_bucket(index).expect("bucket");
    let way = bucket
        .entries
        .iter()
        .position(|e| e.0 != 0 && e.tag() == tag)
        .expect("the flow's way");
    let s = bucket.stamps[way];
    bucket.stamps[way] = (s & !CT_STAMP_TIME) | (s.wrapping_sub(ticks) & CT_STAMP_TIME);
    rig.r
        .dataplane_mut()
        .set_flow_bucket(index, &bucket)
        .expect("write bucket");
}

#[test]
fn established_flow_keeps_its_backend_after_rebuild() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 1);
    assert_eq!(handshake(&mut rig, "10.0.0.10", 80, sport), 1);

    // Rebuild without backend 1 (weight 0, as when it drains): the slot
    // now belongs to someone else, but the connection stays on backend 1.
    rig.set_weight(&vips.tcp4, 1, 0);
    let flow = tcp_flow(sport);
    for _ in 0..3 {
        assert_eq!(
            forward(
                &mut rig,
                &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"more")
            ),
            (1, Counter::FwdConntrack)
        );
    }
    // A SYN on the live flow's tuple (anyone can spoof one) goes where the
    // entry says, and so does the client's answer to what it provokes:
    // the flow is not moved (it was, by the SYN's next packet, before).
    let p = predict(rig.dp(), &flow, true)
        .expect("predict")
        .expect("vip");
    assert_eq!(
        (p.via, p.backend.and_then(|b| b.ip())),
        (Via::ConnTrack, Some(ip(BACKENDS[1])))
    );
    let reopened = rig.counters()[Counter::CtReopened as usize].packets;
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"")),
        (1, Counter::FwdConntrack),
        "a SYN on a live flow's tuple"
    );
    // Its answer comes a stamp tick after the flow's last packet.
    age_entry(&mut rig, &flow, 1);
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"")),
        (1, Counter::FwdConntrack),
        "the client's challenge ACK"
    );
    assert_eq!(
        rig.counters()[Counter::CtReopened as usize].packets,
        reopened
    );
    // A new connection on the tuple soon after (a proxy cycling its
    // ports): its SYN and ACK go there too, and its SYN counts as one more
    // flow's, not as a retransmission of the one before (passive health).
    // Each comes a stamp tick after the entry's last packet (the slot is
    // cleared once per tick, where the entry's stamp moves).
    let counted = syn_counts(&rig, 1);
    for _ in 0..2 {
        age_entry(&mut rig, &flow, 1);
        assert_eq!(
            forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"")),
            (1, Counter::FwdConntrack)
        );
        assert_eq!(
            forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"")),
            (1, Counter::FwdConntrack)
        );
    }
    let now = syn_counts(&rig, 1);
    assert_eq!(
        (
            now.syns - counted.syns,
            now.retransmits - counted.retransmits
        ),
        (2, 0),
        "two connections' SYNs"
    );

    // The connection ends; over a minute later a new one on the same
    // 5-tuple (SYN) follows the new table, and so does its ACK: the entry,
    // idle since before that SYN, now names the SYN's backend.
    age_entry(&mut rig, &flow, CT_PROTECT_TICKS + 1);
    let fresh = predict(rig.dp(), &flow, true)
        .expect("predict")
        .expect("vip");
    assert_eq!(fresh.via, Via::Maglev);
    assert_ne!(
        fresh.backend.and_then(|b| b.ip()),
        Some(ip(BACKENDS[1])),
        "slot moved"
    );
    let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b""));
    assert_eq!(via, Counter::FwdMaglev);
    assert_eq!(Some(ip(BACKENDS[to])), fresh.backend.and_then(|b| b.ip()));
    let ack = tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"");
    let (action, out, events) = rig.run_counted(&ack, Counter::FwdConntrack);
    assert_eq!(action, XDP_TX);
    assert_eq!(events, vec![Counter::CtReopened]);
    assert_eq!(
        common::xdp::tunnel_dst(&out),
        to,
        "the new connection's backend"
    );
    assert_eq!(
        forward(
            &mut rig,
            &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"more")
        ),
        (to, Counter::FwdConntrack)
    );
}

#[test]
fn a_handshake_keeps_its_syns_backend_across_a_table_change() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 1);
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"")),
        (1, Counter::FwdMaglev)
    );
    // Backend 1 leaves the table between the SYN and the ACK (weight 0:
    // still usable). The ACK goes where the SYN went, not to the new pick.
    rig.set_weight(&vips.tcp4, 1, 0);
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"")),
        (1, Counter::FwdHandshake)
    );
    // The entry it made is confirmed at once (a handshake was seen).
    let cfg = rig.dp().config().expect("config");
    let flow = tcp_flow(sport);
    let (index, tag) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let bucket = rig.dp().flow_bucket(index & cfg.ct_mask).expect("bucket");
    let way = bucket
        .entries
        .iter()
        .position(|e| e.tag() == tag)
        .expect("way");
    assert!(
        class(bucket.stamps[way]) >= CT_CLASS_CONFIRMED,
        "{bucket:?}"
    );

    // A SYN whose backend went down before its ACK: the ACK is re-picked.
    let other = port_for_backend(&rig, "10.0.0.10", 80, 2);
    forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, other, true, b""));
    rig.mark_down(&vips.tcp4, 2);
    let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, other, false, b""));
    assert_ne!(to, 2);
    assert_eq!(via, Counter::FwdMaglev);

    // A reused tuple whose old entry names a backend now down: its new
    // SYN's ACK goes where the SYN went, and `predict` says so too.
    let (old, _) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"x"));
    rig.mark_down(&vips.tcp4, old);
    let (syn_to, _) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b""));
    assert_ne!(syn_to, old);
    let p = predict(rig.dp(), &flow, false)
        .expect("predict")
        .expect("a VIP");
    assert_eq!(p.via, Via::Handshake, "{p:?}");
    assert_eq!(
        p.backend.and_then(|b| b.ip()),
        Some(ip(BACKENDS[syn_to])),
        "{p:?}"
    );
    // The ACK goes where the SYN went: by the recent SYN when the old
    // entry's last packet, the SYN and the ACK fall in one stamp tick (the
    // old entry, naming a backend now down, is passed over), or by the old
    // entry rewritten to the SYN's backend when a tick passed since its
    // last packet (`ct_reopened`), as on a slow or busy machine.
    let reopened = rig.counters()[Counter::CtReopened as usize].packets;
    let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b""));
    assert_eq!(to, syn_to, "the ACK follows its SYN");
    match via {
        Counter::FwdHandshake => {}
        Counter::FwdConntrack => assert_eq!(
            rig.counters()[Counter::CtReopened as usize].packets,
            reopened + 1,
            "by the reopened entry"
        ),
        other => panic!("the ACK went by {other:?}"),
    }
}

/// A SYN is held only by its own tuple's protected entry naming a usable
/// backend of its VIP: not by another flow's entry in its bucket, not by
/// an entry whose backend is down, not by another VIP's; `predict` (what
/// `lbctl simulate` says) agrees each time.
#[test]
fn a_syn_is_held_only_by_its_own_usable_entry() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 1);
    let flow = tcp_flow(sport);
    // An active entry, stamped by the kernel's clock.
    assert_eq!(handshake(&mut rig, "10.0.0.10", 80, sport), 1);
    for _ in 0..3 {
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"x"));
    }
    let cfg = rig.dp().config().expect("config");
    let (index, tag) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let index = index & cfg.ct_mask;
    let syn = tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"");
    let expect = |rig: &mut Rig, (to, via, counted): (usize, Via, Counter), what: &str| {
        let p = predict(rig.dp(), &flow, true)
            .expect("predict")
            .expect("vip");
        assert_eq!(
            (p.via, p.backend.and_then(|b| b.ip())),
            (via, Some(ip(BACKENDS[to]))),
            "predict: {what}"
        );
        assert_eq!(forward(rig, &syn), (to, counted), "{what}");
    };
    // The entry's way rewritten in place, its stamp kept.
    let rewrite = |rig: &mut Rig, entry: lb_common::FlowEntry| {
        let mut bucket = rig.dp().flow_bucket(index).expect("bucket");
        let way = bucket
            .entries
            .iter()
            .position(|e| e.0 != 0)
            .expect("the flow's way");
        assert!(class(bucket.stamps[way]) >= CT_CLASS_ACTIVE, "{bucket:?}");
        bucket.entries[way] = entry;
        rig.r
            .dataplane_mut()
            .set_flow_bucket(index, &bucket)
            .expect("write bucket");
    };
    let two = rig.handle(&vips.tcp4, 2);
    let held = (2, Via::ConnTrack, Counter::FwdConntrack);
    let pick = (1, Via::Maglev, Counter::FwdMaglev);
    rewrite(&mut rig, lb_common::FlowEntry::new(tag, two));
    expect(&mut rig, held, "its own entry, on backend 2");
    rewrite(&mut rig, lb_common::FlowEntry::new(tag ^ 1, two));
    expect(&mut rig, pick, "another flow's entry");
    let other_vip = rig.handle(&vips.gre4, 2);
    rewrite(&mut rig, lb_common::FlowEntry::new(tag, other_vip));
    expect(&mut rig, pick, "an entry of another VIP");
    rewrite(&mut rig, lb_common::FlowEntry::new(tag, two));
    rig.mark_down(&vips.tcp4, 2);
    expect(&mut rig, pick, "an entry on a backend that is down");
}

/// A SYN never re-points an entry at a backend of another VIP than the
/// entry's: an entry that only shares its tag with the SYN's tuple (a
/// tuple of another VIP, crafted to collide) keeps its backend, and the
/// SYN's own flow is not placed by it.
#[test]
fn a_syn_never_moves_an_entry_to_another_vips_backend() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 1);
    let flow = tcp_flow(sport);
    // The tuple's entry names a backend of the GRE VIP (another VIP),
    // idle for over a minute: no longer protected.
    let cfg = rig.dp().config().expect("config");
    let (index, tag) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let other = rig.handle(&vips.gre4, 2);
    plant_entry(&mut rig, index & cfg.ct_mask, tag, other);
    age_entry(&mut rig, &flow, CT_PROTECT_TICKS + 1);
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"")),
        (1, Counter::FwdMaglev),
        "the SYN: the table's pick, not the other VIP's entry"
    );
    let reopened = rig.counters()[Counter::CtReopened as usize].packets;
    forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b""));
    assert_eq!(
        rig.counters()[Counter::CtReopened as usize].packets,
        reopened,
        "the entry was re-pointed across VIPs"
    );
    let bucket = rig.dp().flow_bucket(index & cfg.ct_mask).expect("bucket");
    assert!(
        bucket
            .entries
            .iter()
            .any(|e| e.0 != 0 && e.tag() == tag && e.handle() == other),
        "{bucket:?}"
    );
}

/// The protection window is the one `lbd` writes for the kernel's HZ
/// (`protect_window`), not the datapath's default of 240 ticks: at
/// HZ=1000's 960 ticks an entry idle for 300 still holds its tuple's SYN
/// (the minute it is meant to), and at 100 ticks one idle for 101 no
/// longer does. `lbctl simulate` reads the same window.
#[test]
fn a_live_flow_is_protected_for_the_window_lbd_wrote() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 1);
    assert_eq!(handshake(&mut rig, "10.0.0.10", 80, sport), 1);
    let flow = tcp_flow(sport);
    activate(&mut rig, &flow);
    // The table no longer picks backend 1 (it drains).
    rig.set_weight(&vips.tcp4, 1, 0);
    let set_window = |rig: &mut Rig, ticks: u32| {
        let cfg = rig.dp().config().expect("config");
        let cfg = DatapathConfig {
            protect_window: ticks,
            ..cfg
        };
        rig.r.dataplane_mut().set_config(&cfg).expect("config");
    };
    let syn = tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"");
    let predicted_syn = |rig: &Rig| {
        let p = predict(rig.dp(), &flow, true)
            .expect("predict")
            .expect("vip");
        (p.via, p.backend.and_then(|b| b.ip()))
    };

    set_window(&mut rig, 960);
    age_entry(&mut rig, &flow, 300);
    assert_eq!(predicted_syn(&rig), (Via::ConnTrack, Some(ip(BACKENDS[1]))));
    assert_eq!(
        forward(&mut rig, &syn),
        (1, Counter::FwdConntrack),
        "idle 300 ticks of a 960-tick window: held"
    );

    set_window(&mut rig, 100);
    age_entry(&mut rig, &flow, 1);
    let (via, to) = predicted_syn(&rig);
    assert_eq!(via, Via::Maglev, "idle 301 ticks of a 100-tick window");
    let (got, counter) = forward(&mut rig, &syn);
    assert_eq!(counter, Counter::FwdMaglev);
    assert_ne!(got, 1, "the drained backend");
    assert_eq!(Some(ip(BACKENDS[got])), to, "as predicted");
}

/// The handshake's ACK goes where its SYN went while the SYN is within
/// the window `lbd` wrote (`syn_window`, in ticks of the kernel's clock),
/// and by the table once it is older; `lbctl simulate` agrees.
#[test]
fn an_ack_takes_its_syns_backend_within_the_window_lbd_wrote() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let ports: Vec<u16> = (1024..u16::MAX)
        .filter(|&sport| {
            predict(rig.dp(), &tcp_flow(sport), true)
                .expect("predict")
                .and_then(|p| p.backend)
                .and_then(|b| b.ip())
                == Some(ip(BACKENDS[1]))
        })
        .take(2)
        .collect();
    for &sport in &ports {
        let syn = tcp4(TO_LB, "10.0.0.10", 80, sport, true, b"");
        assert_eq!(forward(&mut rig, &syn), (1, Counter::FwdMaglev));
    }
    // The table no longer picks backend 1 (it drains).
    rig.set_weight(&vips.tcp4, 1, 0);

    for (sport, window, age, held) in [(ports[0], 160, 100, true), (ports[1], 40, 41, false)] {
        let cfg = rig.dp().config().expect("config");
        let cfg = DatapathConfig {
            syn_window: window,
            ..cfg
        };
        rig.r.dataplane_mut().set_config(&cfg).expect("config");
        let flow = tcp_flow(sport);
        age_syn(&mut rig, &flow, age);
        let (via, to) = predicted(&rig, &flow);
        let (got, counter) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b""));
        let why = format!("a SYN {age} ticks old, a {window}-tick window");
        if held {
            assert_eq!(
                (via, got, counter),
                (Via::Handshake, 1, Counter::FwdHandshake),
                "{why}"
            );
        } else {
            assert_eq!(via, Via::Maglev, "{why}");
            assert_eq!(counter, Counter::FwdMaglev, "{why}");
            assert_ne!(got, 1, "{why}: the drained backend");
        }
        assert_eq!(Some(ip(BACKENDS[got])), to, "{why}: as predicted");
    }
}

/// Makes the recent SYN of `flow` `ticks` older.
fn age_syn(rig: &mut Rig, flow: &FlowKey, ticks: u16) {
    let cfg = rig.dp().config().expect("config");
    let (index, _) = lb_common::flow::ct_position(flow.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let mut slot = rig.dp().syn_slot(index).expect("slot");
    assert_ne!(slot.entry, lb_common::FlowEntry::EMPTY, "the flow's SYN");
    slot.stamp = slot.stamp.wrapping_sub(ticks) & CT_STAMP_TIME;
    rig.r
        .dataplane_mut()
        .set_syn_slot(index, &slot)
        .expect("write slot");
}

/// Writes `tag → handle` into a free way of bucket `index` (as an older
/// version's datapath would have), active and seen now.
fn plant_entry(rig: &mut Rig, index: u32, tag: u32, handle: u32) {
    let mut bucket = rig.dp().flow_bucket(index).expect("bucket");
    let way = bucket
        .entries
        .iter()
        .position(|e| e.0 == 0)
        .expect("a free way");
    bucket.entries[way] = lb_common::FlowEntry::new(tag, handle);
    let newest = bucket.stamps.iter().map(|s| s & CT_STAMP_TIME).max();
    bucket.stamps[way] = CT_CLASS_ACTIVE << CT_STAMP_CLASS_SHIFT | newest.unwrap_or(0);
    rig.r
        .dataplane_mut()
        .set_flow_bucket(index, &bucket)
        .expect("write bucket");
}

/// Sets or clears `CFG_F_CT_V6_LEGACY` in the running config, as `lbd`
/// does on adopting older maps and an hour later.
fn set_ct_v6_legacy(rig: &mut Rig, on: bool) {
    let mut cfg = rig.dp().config().expect("config");
    cfg.flags = if on {
        cfg.flags | CFG_F_CT_V6_LEGACY
    } else {
        cfg.flags & !CFG_F_CT_V6_LEGACY
    };
    rig.r.dataplane_mut().set_config(&cfg).expect("config");
}

/// How the reference says a packet (not a SYN) of `flow` goes, and where.
fn predicted(rig: &Rig, flow: &FlowKey) -> (Via, Option<IpAddr>) {
    let p = predict(rig.dp(), flow, false)
        .expect("predict")
        .expect("vip");
    (p.via, p.backend.and_then(|b| b.ip()))
}

#[test]
fn an_ipv6_flow_an_older_version_placed_moves_and_keeps_its_backend() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let cfg = rig.dp().config().expect("config");
    assert_ne!(
        cfg.flags & CFG_F_CT_V6_KEYED,
        0,
        "fresh maps use the keyed hash"
    );
    assert_eq!(cfg.flags & CFG_F_CT_V6_LEGACY, 0);
    let flow_of_port = |sport| {
        FlowKey::new(
            IpAddr::from(common::xdp::CLIENT_V6),
            ip("2001:db8::10"),
            PROTO_TCP,
            sport,
            80,
        )
    };
    // Two flows the version before placed (at the unkeyed `ct_hash_v6`'s
    // positions), each on a backend that is not its Maglev pick (as after
    // a table change).
    let mut planted = Vec::new();
    for sport in [41000, 41001] {
        let flow = flow_of_port(sport);
        assert_ne!(flow.ct_hash(&TEST_CT_KEY), flow.ct_hash_unkeyed());
        let pick = predict(rig.dp(), &flow, true)
            .expect("predict")
            .expect("vip");
        let pick = common::xdp::V6_BACKENDS
            .iter()
            .position(|&i| pick.backend.and_then(|b| b.ip()) == Some(ip(BACKENDS[i])))
            .expect("a v6 backend");
        let kept = common::xdp::V6_BACKENDS[(pick + 1) % 3];
        let (index, tag) = lb_common::flow::ct_position(flow.ct_hash_unkeyed(), cfg.ct_seed);
        let handle = rig.handle(&vips.tcp6, kept);
        plant_entry(&mut rig, index & cfg.ct_mask, tag, handle);
        planted.push((sport, flow, kept));
    }
    let packet = |sport| tcp6(TO_LB, "2001:db8::10", 80, sport, false, b"more");

    // Without the legacy lookup the old position is not read: the first
    // flow goes to its Maglev pick (and is recorded there).
    let (sport, flow, kept) = planted[0];
    assert_eq!(predicted(&rig, &flow).0, Via::Maglev, "nor predicted");
    let (to, via) = forward(&mut rig, &packet(sport));
    assert_eq!(via, Counter::FwdMaglev);
    assert_ne!(to, kept);

    // With it, the second flow's entry is found, moved and followed.
    set_ct_v6_legacy(&mut rig, true);
    let (sport, flow2, kept2) = planted[1];
    assert_eq!(
        predicted(&rig, &flow2),
        (Via::ConnTrack, Some(ip(BACKENDS[kept2])))
    );
    let (action, out, events) = rig.run_counted(&packet(sport), Counter::FwdConntrack);
    assert_eq!(action, XDP_TX);
    assert_eq!(events, vec![Counter::CtMovedV6]);
    assert_eq!(tunnel_dst(&out), kept2);
    let (index, tag) = lb_common::flow::ct_position(flow2.ct_hash(&TEST_CT_KEY), cfg.ct_seed);
    let bucket = rig.dp().flow_bucket(index & cfg.ct_mask).expect("bucket");
    let moved = bucket.entries.iter().find(|e| e.0 != 0 && e.tag() == tag);
    assert_eq!(
        moved.map(|e| e.handle()),
        Some(rig.handle(&vips.tcp6, kept2))
    );
    // The first flow, already recorded at its own position, stays there.
    assert_eq!(
        forward(&mut rig, &packet(planted[0].0)),
        (to, Counter::FwdConntrack)
    );
    assert_eq!(
        predicted(&rig, &flow),
        (Via::ConnTrack, Some(ip(BACKENDS[to])))
    );

    // The old way is left to age out: the flow's own entry is what it
    // follows from now on.
    let (old, old_tag) = lb_common::flow::ct_position(flow2.ct_hash_unkeyed(), cfg.ct_seed);
    let bucket = rig.dp().flow_bucket(old & cfg.ct_mask).expect("bucket");
    assert!(
        bucket
            .entries
            .iter()
            .any(|e| e.0 != 0 && e.tag() == old_tag)
    );
    // An old entry naming another VIP's backend is not followed (nor
    // predicted): the flow is picked for its own VIP.
    let stray = flow_of_port(41002);
    let (old, old_tag) = lb_common::flow::ct_position(stray.ct_hash_unkeyed(), cfg.ct_seed);
    let gre6 = rig.handle(&vips.gre6, common::xdp::V6_BACKENDS[0]);
    plant_entry(&mut rig, old & cfg.ct_mask, old_tag, gre6);
    assert_eq!(predicted(&rig, &stray).0, Via::Maglev);
    let (_, via) = forward(&mut rig, &packet(41002));
    assert_eq!(via, Counter::FwdMaglev);

    // The hour is up: the moved flow keeps its backend from its own entry.
    set_ct_v6_legacy(&mut rig, false);
    let (action, out, events) = rig.run_counted(&packet(sport), Counter::FwdConntrack);
    assert_eq!((action, tunnel_dst(&out)), (XDP_TX, kept2));
    assert!(events.is_empty(), "{events:?}");
}

/// The IPv6 connection-table hash of the version before (five seeded
/// lanes, xor, MurmurHash3's finaliser), written out here from its
/// definition: the attack below inverts its second lane.
mod unkeyed {
    pub const K: u64 = 0x9E37_79B9_7F4A_7C15;
    pub const SEEDS: [u64; 5] = [
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
        0x4528_21E6_38D0_1377,
        0xBE54_66CF_34E9_0C6C,
        0xC0AC_29B7_C97C_50DD,
    ];

    pub fn lane(seed: u64, hi: u32, lo: u32) -> u64 {
        ((seed ^ (u64::from(hi) << 32 | u64::from(lo))).wrapping_mul(K)).rotate_left(31)
    }

    /// The multiplicative inverse of [`K`] modulo 2⁶⁴ (Newton's iteration).
    pub fn k_inverse() -> u64 {
        let mut x = K;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(K.wrapping_mul(x)));
        }
        x
    }
}

/// A client of another /64 that knows a victim's IPv6 tuple solves for
/// the interface ID whose tuple has the victim's unkeyed hash, so the
/// version before took its packets for the victim's flow (its bucket and
/// tag under every seed). Under the box's key the same tuple is a flow of
/// its own, and the victim keeps its entry.
#[test]
fn an_ipv6_tuple_solved_against_a_known_flow_does_not_take_its_entry() {
    use unkeyed::{SEEDS, k_inverse, lane};
    let mut rig = Rig::new(1 << 12);
    rig.standard_vips();
    let vip = "2001:db8::10";
    let victim = FlowKey::new(
        IpAddr::from(common::xdp::CLIENT_V6),
        ip(vip),
        PROTO_TCP,
        41_000,
        80,
    );
    let from_victim = |payload: &[u8]| tcp6(TO_LB, vip, 80, 41_000, false, payload);
    // The victim's flow, recorded by the datapath.
    let (victims, via) = forward(&mut rig, &from_victim(b"first"));
    assert_eq!(via, Counter::FwdMaglev);

    // The attacker: 2001:db8:99:1::/64, another source port, an interface
    // ID solved for.
    let mut attacker = victim;
    attacker.src[0] = u32::from_le_bytes([0x20, 0x01, 0x0d, 0xb8]);
    attacker.src[1] = u32::from_le_bytes([0x00, 0x99, 0x00, 0x01]);
    attacker.sport = 51_234u16.to_be();
    let a = |f: &FlowKey| lane(SEEDS[0], f.src[0], f.src[1]);
    let e = |f: &FlowKey| lane(SEEDS[4], f.ports_word(), u32::from(f.proto));
    let b = lane(SEEDS[1], victim.src[2], victim.src[3]);
    let wanted = a(&victim) ^ b ^ e(&victim) ^ a(&attacker) ^ e(&attacker);
    let w = wanted.rotate_right(31).wrapping_mul(k_inverse()) ^ SEEDS[1];
    (attacker.src[2], attacker.src[3]) = ((w >> 32) as u32, w as u32);
    assert_eq!(
        attacker.ct_hash_unkeyed(),
        victim.ct_hash_unkeyed(),
        "the solved tuple collides without a key"
    );
    assert_ne!(attacker.src, victim.src);

    let mut client_v6 = [0u8; 16];
    for (bytes, word) in client_v6.chunks_mut(4).zip(attacker.src) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    let from_attacker = common::packets::Link { client_v6, ..TO_LB };
    let packet = tcp6(from_attacker, vip, 80, 51_234, false, b"data");
    assert_eq!(
        flow_of(&packet).0,
        attacker,
        "the frame carries the solved tuple"
    );
    // Its packet is a new flow, picked by Maglev, not the victim's entry.
    let (action, out, _) = rig.run_counted(&packet, Counter::FwdMaglev);
    assert_eq!(action, XDP_TX);
    let own = predict(rig.dp(), &attacker, true)
        .expect("predict")
        .expect("vip");
    assert_eq!(
        Some(ip(BACKENDS[tunnel_dst(&out)])),
        own.backend.and_then(|b| b.ip())
    );
    // And the victim still follows its own entry.
    assert_eq!(
        forward(&mut rig, &from_victim(b"more")),
        (victims, Counter::FwdConntrack)
    );
}

#[test]
fn syns_never_write_the_connection_table() {
    let mut rig = Rig::new(1 << 4);
    rig.standard_vips();
    let empty: Vec<FlowBucket> = (0..16)
        .map(|i| rig.dp().flow_bucket(i).expect("b"))
        .collect();
    for p in 0..300u16 {
        let syn = tcp4(TO_LB, "10.0.0.10", 80, 20000 + p, true, b"");
        let (action, _, events) = rig.run_counted(&syn, Counter::FwdMaglev);
        assert_eq!(action, XDP_TX);
        assert!(events.is_empty(), "{events:?}");
    }
    let after: Vec<FlowBucket> = (0..16)
        .map(|i| rig.dp().flow_bucket(i).expect("b"))
        .collect();
    assert_eq!(after, empty, "300 SYNs, not one way written");
}

#[test]
fn flow_on_a_down_backend_is_repicked() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 2);
    assert_eq!(handshake(&mut rig, "10.0.0.10", 80, sport), 2);

    rig.mark_down(&vips.tcp4, 2);
    let before = rig.counters()[Counter::CtStale as usize].packets;
    let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"x"));
    assert_ne!(to, 2, "re-picked away from the down backend");
    assert_eq!(via, Counter::FwdMaglev);
    assert_eq!(
        rig.counters()[Counter::CtStale as usize].packets,
        before + 1
    );
    // The re-pick was recorded: the next packet is a connection-table hit.
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"x")),
        (to, Counter::FwdConntrack)
    );
}

#[test]
fn a_reused_backend_index_does_not_inherit_flows() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let sport = port_for_backend(&rig, "10.0.0.10", 80, 0);
    assert_eq!(handshake(&mut rig, "10.0.0.10", 80, sport), 0);

    // Backend 0 leaves, and a newcomer takes its index with a new
    // generation: in the configuration with weight 0, so not in the table
    // but usable. The old flow must not follow the index to it.
    let old = rig.handle(&vips.tcp4, 0);
    rig.remove_backend(&vips.tcp4, 0);
    let newcomer = ip("10.1.0.99");
    rig.vip_mut(&vips.tcp4)
        .backends
        .push(BackendConfig::new(newcomer, 0));
    rig.apply();
    let id = VipId::from_key(&vips.tcp4).expect("vip");
    let new = rig.r.vips()[&id].backends[&newcomer].handle;
    assert_eq!(
        new & BACKEND_INDEX_MASK,
        old & BACKEND_INDEX_MASK,
        "index reused"
    );
    assert_ne!(new, old, "with a new generation");
    let stale = rig.counters()[Counter::CtStale as usize].packets;
    let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, sport, false, b"x"));
    assert!(to == 1 || to == 2, "went to {to}");
    assert_eq!(via, Counter::FwdMaglev);
    assert_eq!(rig.counters()[Counter::CtStale as usize].packets, stale + 1);
}

#[test]
fn table_swap_changes_only_moved_flows() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    // UDP flows without connection table follow the active table exactly.
    let flows: Vec<u16> = (7000..7200).collect();
    let route = |rig: &mut Rig| -> Vec<usize> {
        flows
            .iter()
            .map(|&p| {
                let (_, out) = rig.run(&udp4(TO_LB, "10.0.0.60", 53, p, b"q"));
                let dst: IpAddr = Ipv4HeaderSlice::from_slice(&out[14..])
                    .expect("outer")
                    .destination_addr()
                    .into();
                BACKENDS
                    .iter()
                    .position(|b| ip(b) == dst)
                    .expect("known backend")
            })
            .collect()
    };
    let before = route(&mut rig);
    assert!(
        V4_BACKENDS.iter().all(|b| before.contains(b)),
        "all three backends used"
    );
    rig.set_weight(&vips.udp4_no_ct, 2, 0);
    let after = route(&mut rig);
    for (b, a) in before.iter().zip(&after) {
        if *b != 2 {
            assert_eq!(a, b, "a flow not on the removed backend moved");
        } else {
            assert_ne!(*a, 2);
        }
    }
}

#[test]
fn full_bucket_evicts_the_stalest_way_and_a_known_flow_keeps_its_own() {
    // One bucket: every flow competes for the same six ways. Flows seen
    // mid-way (no handshake here) make unconfirmed entries.
    let mut rig = Rig::new(1);
    rig.standard_vips();
    let flow = |p: u16| tcp4(TO_LB, "10.0.0.10", 80, p, false, b"");
    for p in 0..CT_WAYS as u16 {
        assert_eq!(forward(&mut rig, &flow(30000 + p)).1, Counter::FwdMaglev);
    }
    let full: FlowBucket = rig.dp().flow_bucket(0).expect("bucket");
    assert!(
        full.entries.iter().all(|e| e.0 != 0),
        "six flows fill six ways"
    );

    // A known flow's packet hits its own way; a SYN of a known flow (a
    // new connection on its tuple) writes nothing: nothing evicted.
    let before = rig.counters()[Counter::CtEvicted as usize].packets;
    assert_eq!(forward(&mut rig, &flow(30003)).1, Counter::FwdConntrack);
    forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, 30004, true, b""));
    assert_eq!(rig.counters()[Counter::CtEvicted as usize].packets, before);
    assert_eq!(
        rig.dp().flow_bucket(0).expect("bucket").entries,
        full.entries
    );

    // A seventh flow evicts one entry and is counted.
    forward(&mut rig, &flow(30100));
    assert_eq!(
        rig.counters()[Counter::CtEvicted as usize].packets,
        before + 1
    );
    let after = rig.dp().flow_bucket(0).expect("bucket");
    let kept = after
        .entries
        .iter()
        .filter(|e| full.entries.contains(e))
        .count();
    assert_eq!(kept, CT_WAYS - 1, "exactly one way replaced");
    // The newcomer is found again.
    assert_eq!(
        forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, 30100, false, b"")).1,
        Counter::FwdConntrack
    );
}

#[test]
fn floods_never_evict_an_established_flow() {
    // One bucket: the floods and the established flows compete for the
    // same six ways.
    let mut rig = Rig::new(1);
    let v = rig.standard_vips();
    let events = |rig: &Rig| {
        let c = rig.counters();
        (
            c[Counter::CtEvicted as usize].packets,
            c[Counter::CtEvictedConfirmed as usize].packets,
        )
    };
    // Three established flows, one per backend: a SYN, then the ACK that
    // records the flow, confirmed.
    let established: Vec<u16> = V4_BACKENDS
        .iter()
        .map(|&b| port_for_backend(&rig, "10.0.0.10", 80, b))
        .collect();
    let owners: Vec<usize> = established
        .iter()
        .map(|&p| handshake(&mut rig, "10.0.0.10", 80, p))
        .collect();
    assert_eq!(owners, V4_BACKENDS);
    let bucket = rig.dp().flow_bucket(0).expect("bucket");
    let confirmed = bucket
        .stamps
        .iter()
        .filter(|s| class(**s) == CT_CLASS_CONFIRMED)
        .count();
    assert_eq!(
        confirmed, 3,
        "three handshakes, three confirmed ways: {bucket:?}"
    );

    // 500 spoofed SYNs, each a new flow: the table is not touched.
    let (evicted_before, _) = events(&rig);
    for p in 0..500u16 {
        let syn = tcp4(TO_LB, "10.0.0.10", 80, 40000 + p, true, b"");
        let (action, _, ev) = rig.run_counted(&syn, Counter::FwdMaglev);
        assert_eq!(action, XDP_TX);
        assert!(ev.is_empty(), "SYN {p}: {ev:?}");
    }
    assert_eq!(rig.dp().flow_bucket(0).expect("bucket"), bucket);
    // 500 spoofed one-packet flows that are not SYNs: they fight over the
    // other three ways only.
    for p in 0..500u16 {
        let ack = tcp4(TO_LB, "10.0.0.10", 80, 50000 + p, false, b"");
        let (action, _, ev) = rig.run_counted(&ack, Counter::FwdMaglev);
        assert_eq!(action, XDP_TX);
        assert!(
            !ev.contains(&Counter::CtEvictedConfirmed),
            "packet {p} evicted an established flow"
        );
    }
    let (evicted, evicted_confirmed) = events(&rig);
    assert_eq!(
        evicted - evicted_before,
        500 - 3,
        "every flow past the free ways evicted one"
    );
    assert_eq!(evicted_confirmed, 0);

    // The established flows still hit, and keep their backend across a
    // table change that moves every flow off backend 0.
    rig.set_weight(&v.tcp4, 0, 0);
    for (&p, &owner) in established.iter().zip(&owners) {
        let (to, via) = forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, p, false, b"data"));
        assert_eq!(
            (to, via),
            (owner, Counter::FwdConntrack),
            "port {p} kept its entry and backend"
        );
    }

    // Spoofed SYN + ACK pairs earn class 1: they displace one another,
    // never a flow that has been active (class 3, seen within a minute).
    for &p in &established {
        let flow = FlowKey::new(IpAddr::from(CLIENT_V4), ip("10.0.0.10"), PROTO_TCP, p, 80);
        activate(&mut rig, &flow);
    }
    let before = rig.dp().flow_bucket(0).expect("bucket");
    for p in 0..300u16 {
        let port = 20000 + p;
        rig.run_counted(
            &tcp4(TO_LB, "10.0.0.10", 80, port, true, b""),
            Counter::FwdMaglev,
        );
        let (_, _, ev) = rig.run_counted(
            &tcp4(TO_LB, "10.0.0.10", 80, port, false, b""),
            Counter::FwdHandshake,
        );
        assert!(
            !ev.contains(&Counter::CtEvictedConfirmed) && !ev.contains(&Counter::CtInsertRefused),
            "pair {p}: {ev:?}"
        );
    }
    let after = rig.dp().flow_bucket(0).expect("bucket");
    let kept = |b: &FlowBucket| -> Vec<u64> {
        b.entries
            .iter()
            .zip(b.stamps)
            .filter(|(_, s)| class(*s) == CT_CLASS_ACTIVE)
            .map(|(e, _)| e.0)
            .collect()
    };
    assert_eq!(
        kept(&after),
        kept(&before),
        "the active flows kept their ways"
    );
    assert_eq!(events(&rig).1, 0);

    // Every way established (class 2), none active: a new flow takes the
    // stalest, and says an established flow lost its pinning.
    for p in 31003..31006u16 {
        handshake(&mut rig, "10.0.0.10", 80, p);
    }
    set_classes(&mut rig, 0, 2, 0);
    let ack = tcp4(TO_LB, "10.0.0.10", 80, 45000, false, b"");
    let (_, _, ev) = rig.run_counted(&ack, Counter::FwdMaglev);
    assert_eq!(ev, vec![Counter::CtEvicted, Counter::CtEvictedConfirmed]);

    // Every way active and seen now: nothing is taken; the new flow goes to
    // its Maglev backend unrecorded, again on its next packet.
    set_classes(&mut rig, 0, CT_CLASS_ACTIVE, 0);
    let full = rig.dp().flow_bucket(0).expect("bucket");
    let ack = tcp4(TO_LB, "10.0.0.10", 80, 45001, false, b"");
    for _ in 0..2 {
        let (action, _, ev) = rig.run_counted(&ack, Counter::FwdMaglev);
        assert_eq!((action, ev), (XDP_TX, vec![Counter::CtInsertRefused]));
    }
    assert_eq!(rig.dp().flow_bucket(0).expect("bucket"), full);
    // One of them idle for longer than the protection: that one goes.
    set_classes(&mut rig, 0, CT_CLASS_ACTIVE, 0);
    let mut aged = rig.dp().flow_bucket(0).expect("bucket");
    aged.stamps[2] = CT_CLASS_ACTIVE << CT_STAMP_CLASS_SHIFT
        | ((aged.stamps[2] & CT_STAMP_TIME).wrapping_sub(CT_PROTECT_TICKS + 1) & CT_STAMP_TIME);
    rig.r
        .dataplane_mut()
        .set_flow_bucket(0, &aged)
        .expect("write bucket");
    let (_, _, ev) = rig.run_counted(&ack, Counter::FwdMaglev);
    assert_eq!(ev, vec![Counter::CtEvicted, Counter::CtEvictedConfirmed]);
    let now = rig.dp().flow_bucket(0).expect("bucket");
    assert_ne!(now.entries[2], aged.entries[2], "the idle way was taken");
    assert_eq!(
        (0..6)
            .filter(|&w| now.entries[w] != aged.entries[w])
            .count(),
        1,
        "only that one"
    );
}

// ---------------------------------------------------------------- table sizes

/// Every flow of `sports` to `dst` (UDP, no connection table: each packet
/// is hashed through the VIP's table) leaves for the backend `predict`
/// names, from the slot `hash % m`.
fn forwarded_as_predicted(rig: &mut Rig, dst: &str, m: u32, sports: std::ops::Range<u16>) {
    for sport in sports {
        let packet = udp4(TO_LB, dst, 53, sport, b"q");
        let (flow, _) = flow_of(&packet);
        let p = predict(rig.dp(), &flow, false)
            .expect("predict")
            .expect("a vip");
        assert_eq!(p.slot, (flow.hash() as u32) % m, "{dst}: slot of M = {m}");
        let (action, out) = rig.run(&packet);
        assert_eq!(action, XDP_TX);
        let want = p.backend.and_then(|b| b.ip()).expect("a backend");
        assert_eq!(
            ip(BACKENDS[tunnel_dst(&out)]),
            want,
            "{dst}:53 from {sport}"
        );
    }
}

#[test]
fn vips_of_different_table_sizes_forward_as_predicted() {
    let mut rig = Rig::new(1 << 12);
    // One VIP of the global size (4099: five chunks a half) and one of
    // its own (1009: one chunk), over the same backends.
    let big = rig.add_vip(
        "10.0.0.60:53/udp",
        lb::config::Encap::Ipip,
        false,
        &V4_BACKENDS,
    );
    let mut own = rig.vips[0].clone();
    own.id = "10.0.0.61:53/udp".parse().expect("vip");
    own.table_size = Some(1009);
    rig.vips.push(own.clone());
    rig.apply();
    let meta = |rig: &Rig, key| rig.dp().vip(&key).expect("lookup").expect("vip");
    assert_eq!(meta(&rig, big).table_size(), M);
    assert_eq!(meta(&rig, own.id.key()).table_size(), 1009);
    forwarded_as_predicted(&mut rig, "10.0.0.60", M, 5000..5300);
    forwarded_as_predicted(&mut rig, "10.0.0.61", 1009, 5000..5300);
    // The two tables differ, so some flow goes elsewhere on each VIP.
    let differ = (5000..5300u16).any(|sport| {
        let to = |dst: &str| {
            let flow = FlowKey::new(ip("192.0.2.7"), ip(dst), PROTO_UDP, sport, 53);
            predict(rig.dp(), &flow, false)
                .expect("predict")
                .expect("vip")
                .backend
        };
        to("10.0.0.60").map(|b| b.addr) != to("10.0.0.61").map(|b| b.addr)
    });
    assert!(differ, "M = 4099 and M = 1009 spread flows alike");

    // A new size for the first VIP: a region of that size, the size in the
    // same entry write, and forwarding by it at once.
    rig.vip_mut(&big).table_size = Some(2053);
    rig.apply();
    assert_eq!(meta(&rig, big).table_size(), 2053);
    forwarded_as_predicted(&mut rig, "10.0.0.60", 2053, 5000..5300);
    forwarded_as_predicted(&mut rig, "10.0.0.61", 1009, 5000..5300);

    // The batch reads of the per-CPU counters agree with one read per
    // element, after those packets.
    let dp = rig.dp();
    let all = dp.all_backend_stats().expect("batch");
    let layout = dp.layout();
    assert_eq!(all.len(), layout.max_backends as usize);
    for (i, c) in all.iter().enumerate() {
        assert_eq!(*c, dp.backend_stats(i as u32).expect("one"), "backend {i}");
    }
    assert!(all.iter().map(|c| c.packets).sum::<u64>() >= 4 * 300);
    let vips = dp.all_vip_stats().expect("batch");
    for (i, c) in vips.iter().enumerate() {
        assert_eq!(*c, dp.vip_stats(i as u32).expect("one"), "VIP id {i}");
    }
    let syns = dp.all_backend_syns().expect("batch");
    for (i, c) in syns.iter().enumerate() {
        assert_eq!(*c, dp.backend_syns(i as u32).expect("one"), "backend {i}");
    }
}

// ---------------------------------------------------------------- stats

#[test]
fn vip_and_backend_stats_add_up() {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    let meta = rig.dp().vip(&vips.tcp4).expect("vip").expect("exists");
    let mut bytes = 0u64;
    for p in 0..50u16 {
        let pkt = tcp4(
            TO_LB,
            "10.0.0.10",
            80,
            20000 + p,
            true,
            &vec![0; p as usize],
        );
        bytes += pkt.len() as u64;
        forward(&mut rig, &pkt);
    }
    let id = VipId::from_key(&vips.tcp4).expect("vip");
    let total = |rig: &Rig| rig.r.vip_counters(&id).expect("counters").expect("VIP").0;
    let vip = total(&rig);
    assert_eq!((vip.packets, vip.bytes), (50, bytes));
    let per_backend: Vec<CounterValue> = V4_BACKENDS
        .iter()
        .map(|&b| {
            rig.dp()
                .backend_stats(rig.handle(&vips.tcp4, b) & BACKEND_INDEX_MASK)
                .expect("stats")
        })
        .collect();
    assert_eq!(per_backend.iter().map(|c| c.packets).sum::<u64>(), 50);
    assert_eq!(per_backend.iter().map(|c| c.bytes).sum::<u64>(), bytes);
    assert!(per_backend.iter().all(|c| c.packets > 0), "{per_backend:?}");

    // A backend leaves: the VIP's total stays (its packets are retired
    // into the VIP's count), and a dropped packet adds to it.
    rig.remove_backend(&vips.tcp4, V4_BACKENDS[0]);
    assert_eq!(total(&rig), vip, "the VIP's total after a backend left");
    // The daemon's per-second sample (batch reads) says the same.
    let sampled = rig.r.all_vip_counters().expect("batch");
    assert_eq!(sampled[&id].0, vip, "the batch-read total");

    // What the reconciler does before reusing an id or an index.
    let index = rig.handle(&vips.tcp4, V4_BACKENDS[1]) & BACKEND_INDEX_MASK;
    let dp = rig.r.dataplane_mut();
    dp.clear_vip_stats(meta.id()).expect("clear");
    dp.clear_backend_stats(index).expect("clear");
    assert_eq!(
        dp.vip_stats(meta.id()).expect("stats"),
        CounterValue::default()
    );
    assert_eq!(
        dp.backend_stats(index).expect("stats"),
        CounterValue::default()
    );
}

// ---------------------------------------------------------------- health probes

/// Runs `frame` through `lb_probe_encap` with `mark` on the skb:
/// `(TC action, output frame)`.
fn run_probe_encap(rig: &mut Rig, frame: &[u8], mark: u32) -> (u32, Vec<u8>) {
    // struct __sk_buff is 192 bytes; `mark` is at offset 8 (kernel BTF).
    let mut ctx = [0u8; 192];
    ctx[8..12].copy_from_slice(&mark.to_ne_bytes());
    let mut out = vec![0u8; frame.len() + 256];
    let result = rig
        .r
        .dataplane_mut()
        .probe_encap()
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::new()
        })
        .expect("BPF_PROG_TEST_RUN on the classifier");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

#[test]
fn probes_with_a_probe_mark_are_tunnelled_to_that_backend() {
    const TC_ACT_OK: u32 = 0;
    const TC_ACT_SHOT: u32 = 2;
    let mut rig = Rig::new(1 << 4);
    let vips = rig.standard_vips();
    // A probe from the balancer to the VIP, as the kernel hands it to TC
    // egress (Ethernet header included).
    let probe = tcp4(TO_LB, "10.0.0.10", 80, 45000, true, b"");
    for (vip, backend, gre) in [
        (vips.tcp4, 0usize, false),
        (vips.gre4, 1, true),
        (vips.tcp6, 3, false),
    ] {
        let index = rig.handle(&vip, backend) & BACKEND_INDEX_MASK;
        let (action, out) = run_probe_encap(&mut rig, &probe, probe_mark(index, gre));
        let def = rig.dp().backend(index).expect("backend");
        if def.family == FAMILY_V6 {
            // An IPv6 backend cannot carry an IPv4 probe in a same-family
            // tunnel: dropped, so the probe fails (sent plainly to the VIP,
            // another balancer's backend could have answered it).
            assert_eq!(action, TC_ACT_SHOT, "backend {backend}: dropped");
            continue;
        }
        assert_eq!(action, TC_ACT_OK);
        let encap = if gre { ENCAP_GRE } else { ENCAP_IPIP };
        check_encapsulated(&probe, &rewrite_macs(&out, &probe), &def, encap);
    }
    // A backend index with no entry (retired): dropped too.
    let (action, _) = run_probe_encap(&mut rig, &probe, probe_mark(BACKEND_INDEX_MASK, false));
    assert_eq!(action, TC_ACT_SHOT, "no backend at the index");
    // Without the mark nothing happens.
    let (action, out) = run_probe_encap(&mut rig, &probe, 0x1234);
    assert_eq!((action, out), (TC_ACT_OK, probe));
}

/// The TC program leaves the MACs to the stack; `check_encapsulated`
/// expects the balancer's rewrite (gateway, own MAC), so put those in.
fn rewrite_macs(out: &[u8], input: &[u8]) -> Vec<u8> {
    let mut frame = out.to_vec();
    assert_eq!(
        frame[0..12],
        input[0..12],
        "MACs untouched by the TC program"
    );
    frame[0..6].copy_from_slice(&GW_MAC);
    frame[6..12].copy_from_slice(&input[0..6]);
    frame
}

// ---------------------------------------------------------------- outer source, GUE on the backend

/// `lb_decap` as every backend of the rig runs it (all backend addresses,
/// GUE on the rig's port).
fn backend_decap() -> Decap {
    let mut decap = Decap::load().expect("load lb_decap");
    let local: Vec<IpAddr> = BACKENDS.iter().map(|b| ip(b)).collect();
    decap
        .set_local_addrs(&local, GUE_TEST_PORT)
        .expect("local addresses");
    decap
}

/// Runs a tunnelled frame through `lb_decap`; it must pass the inner frame.
fn decapsulate(decap: &mut Decap, frame: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; frame.len()];
    let r = decap
        .program()
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut buf),
            ..TestRunOptions::new()
        })
        .expect("decap run");
    assert_eq!(r.return_value, XDP_PASS, "decapsulated and passed");
    buf.truncate(r.data_size_out as usize);
    buf
}

#[test]
fn outer_source_takes_host_bits_from_the_client() {
    let mut rig = Rig::new(1 << 12);
    rig.standard_vips();
    with_settings(&mut rig, |s| {
        s.outer_source_v4 = Some("10.255.0.0".parse().expect("literal"));
        s.outer_source_v4_host_bits = 16;
        s.outer_source_v6 = Some("fd00:ff::".parse().expect("literal"));
        s.outer_source_v6_host_bits = 32;
    });
    let mut decap = backend_decap();

    let v4_client = |c: [u8; 4], dst: &str, dport: u16| {
        let mut f = vec![];
        PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
            .ipv4(c, v4(dst), 64)
            .tcp(40000, dport, 1, 1000)
            .syn()
            .write(&mut f, b"")
            .expect("build");
        f
    };
    for (client, dst, dport, want_src) in [
        ([192, 0, 2, 7], "10.0.0.10", 80, "10.255.2.7"),
        ([198, 18, 5, 9], "10.0.0.10", 80, "10.255.5.9"),
        ([198, 18, 5, 9], "10.0.0.30", 80, "10.255.5.9"),
        ([198, 18, 5, 9], "10.0.0.20", 80, "fd00:ff::c612:509"),
    ] {
        let req = v4_client(client, dst, dport);
        let (action, out) = rig.run(&req);
        assert_eq!(action, XDP_TX, "{dst}");
        let src: IpAddr = if out[12..14] == [0x08, 0x00] {
            let h = Ipv4HeaderSlice::from_slice(&out[14..]).expect("outer");
            let header = h.to_header();
            assert_eq!(header.header_checksum, header.calc_header_checksum());
            h.source_addr().into()
        } else {
            Ipv6HeaderSlice::from_slice(&out[14..])
                .expect("outer")
                .source_addr()
                .into()
        };
        assert_eq!(src, ip(want_src), "client {client:?} to {dst}");
        // The backend's decap program takes any outer source.
        let buf = decapsulate(&mut decap, &out);
        assert_eq!(buf[14..], req[14..], "decapsulated to the client's packet");
    }
    let v6 = tcp6(TO_LB, "2001:db8::10", 80, 40000, true, b"");
    let (_, out) = rig.run(&v6);
    let src: IpAddr = Ipv6HeaderSlice::from_slice(&out[14..])
        .expect("outer")
        .source_addr()
        .into();
    assert_eq!(src, ip("fd00:ff::7"), "IPv6 client: its last 32 bits");
}

#[test]
fn gue_tunnels_decapsulate_on_the_backend() {
    let mut rig = Rig::new(1 << 12);
    let v = rig.standard_vips();
    let mut decap = backend_decap();
    let mut ports = BTreeSet::new();
    for sport in 42000..42016u16 {
        for (req, key) in [
            (tcp4(TO_LB, "10.0.0.80", 80, sport, true, b"gue"), v.gue4),
            (tcp6(TO_LB, "2001:db8::80", 80, sport, true, b"gue"), v.gue6),
            (
                tcp4(TO_LB, "10.0.0.80", 443, sport, true, b"gue"),
                v.gue4_on_v6,
            ),
        ] {
            let (flow, syn) = flow_of(&req);
            let want = predict(rig.dp(), &flow, syn)
                .expect("predict")
                .expect("vip");
            assert_eq!(want.vip, key);
            let (action, out, _) = rig.run_counted(&req, Counter::FwdMaglev);
            assert_eq!(action, XDP_TX);
            check_encapsulated(&req, &out, &want.backend.expect("backend"), ENCAP_GUE);
            let l3 = 14 + if out[12..14] == [0x08, 0x00] { 20 } else { 40 };
            ports.insert(u16::from_be_bytes([out[l3], out[l3 + 1]]));

            let before = decap.counters().expect("counters")[DecapCounter::DecapGue as usize];
            let buf = decapsulate(&mut decap, &out);
            assert_eq!(buf[12..], req[12..], "the client's packet, its ethertype");
            let after = decap.counters().expect("counters")[DecapCounter::DecapGue as usize];
            assert_eq!(after.packets, before.packets + 1, "counted as GUE");
        }
    }
    assert!(
        ports.len() >= 24,
        "source ports spread flows: {} of 48",
        ports.len()
    );
}

/// The SYN counters of backend `BACKENDS[b]` of the VIP at 10.0.0.10:80.
fn syn_counts(rig: &Rig, b: usize) -> lb_common::SynCounts {
    let vip: lb::config::VipId = "10.0.0.10:80/tcp".parse().unwrap();
    let addr: IpAddr = BACKENDS[b].parse().unwrap();
    let handle = rig.r.vips()[&vip].backends[&addr].handle;
    rig.dp()
        .backend_syns(handle & BACKEND_INDEX_MASK)
        .expect("SYN counters")
}

#[test]
fn a_syn_repeated_before_any_other_packet_counts_as_retransmitted() {
    let mut rig = Rig::new(1 << 10);
    rig.standard_vips();
    let p = port_for_backend(&rig, "10.0.0.10", 80, 1);
    let syn = tcp4(TO_LB, "10.0.0.10", 80, p, true, b"");
    let (to, _) = forward(&mut rig, &syn);
    assert_eq!(to, 1);
    assert_eq!(
        (syn_counts(&rig, 1).syns, syn_counts(&rig, 1).retransmits),
        (1, 0)
    );
    // The client got no SYN-ACK: the same SYN again, twice, then 1,000
    // more (a spoofed tuple repeated): one flow, retried, counted once.
    forward(&mut rig, &syn);
    forward(&mut rig, &syn);
    let c = syn_counts(&rig, 1);
    assert_eq!(
        (c.syns, c.retransmits),
        (1, 1),
        "one flow whose SYN was retried, however often"
    );
    for _ in 0..1000 {
        forward(&mut rig, &syn);
    }
    let c = syn_counts(&rig, 1);
    assert_eq!((c.syns, c.retransmits), (1, 1));
    // Answered: the ACK confirms the entry; a later SYN of the same tuple
    // (a new connection on a reused port) is a new flow, no retransmission.
    forward(&mut rig, &tcp4(TO_LB, "10.0.0.10", 80, p, false, b"ack"));
    forward(&mut rig, &syn);
    let c = syn_counts(&rig, 1);
    assert_eq!((c.syns, c.retransmits), (2, 1));
    // Other backends saw nothing; a non-SYN miss counts no SYN.
    let q = port_for_backend(&rig, "10.0.0.10", 80, 2);
    forward(
        &mut rig,
        &tcp4(TO_LB, "10.0.0.10", 80, q, false, b"mid-flow"),
    );
    assert_eq!(syn_counts(&rig, 2), lb_common::SynCounts::default());
    assert_eq!(syn_counts(&rig, 0), lb_common::SynCounts::default());
}

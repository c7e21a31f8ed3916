//! BFD in the kernel (`lb_xdp`): control packets of a configured session
//! answered with `XDP_TX`, the replies compared byte for byte with frames
//! written out here from RFC 5880 §4.1 and RFC 5881 (checksums computed
//! independently); the three-way handshake, a Poll answered with Final,
//! the Detection Time applied to a late packet, every check of §6.8.6
//! and RFC 5881 §5 counted as `drop_bfd_invalid`, the transmit limit, and
//! packets of no session passed untouched.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use std::time::Duration;

use lb::{BfdTable, KernelBfdTable};
use lb_common::{BfdConfig, BfdKey, BfdState, Counter, addr_to_words};

use common::{XDP_DROP, XDP_PASS, XDP_TX, ip, packets::inet_checksum, xdp::Rig};

const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const MY_DISC: u32 = 0x0102_0304;
const PEER_DISC: u32 = 0xaabb_ccdd;
/// Our UDP source port, 49200.
const SRC_PORT: u16 = 49200;

/// A rig with one BFD session from `peer` to `local`, 300 ms × 3.
fn rig(peer: &str, local: &str) -> (Rig, KernelBfdTable) {
    let mut rig = Rig::new(1024);
    let (peers, state) = rig
        .r
        .dataplane_mut()
        .take_bfd_maps()
        .expect("the object has the BFD maps");
    let table = KernelBfdTable::from_maps(peers, state).expect("BFD maps");
    let (addr, family) = addr_to_words(ip(peer));
    let key = BfdKey {
        addr,
        family,
        _pad: [0; 3],
    };
    let config = BfdConfig {
        local_addr: addr_to_words(ip(local)).0,
        my_disc: MY_DISC,
        desired_min_tx_us: 300_000,
        required_min_rx_us: 300_000,
        slot: 5,
        config_gen: 0,
        src_port: SRC_PORT.to_be(),
        detect_mult: 3,
        flags: 0,
    };
    table.set_peer(&key, &config).expect("write the session");
    table.reset_state(5).expect("zero its slot");
    (rig, table)
}

/// A control packet's 24 bytes (RFC 5880 §4.1).
fn control(state: u8, flags: u8, mult: u8, my: u32, your: u32, tx: u32, rx: u32) -> Vec<u8> {
    let mut b = vec![1 << 5, state << 6 | flags, mult, 24];
    for w in [my, your, tx, rx, 0] {
        b.extend_from_slice(&w.to_be_bytes());
    }
    b
}

/// The sum of an address pair and (0, 17, UDP length): the pseudo-header.
fn pseudo(src: &[u8], dst: &[u8], udp_len: usize) -> u32 {
    let mut sum = 17 + udp_len as u32;
    for c in src.chunks(2).chain(dst.chunks(2)) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    sum
}

/// Ethernet, IPv4 (TOS 0xc0, DF, `ttl`, id `id`), UDP `sport` → `dport`,
/// `payload`; checksums filled in.
fn frame4(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst, ttl): (&str, &str, u8),
    id: u16,
    (sport, dport): (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let (s, d) = (common::v4(src), common::v4(dst));
    let udp_len = 8 + payload.len();
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (20 + udp_len) as u16;
    f.extend_from_slice(&[0x45, 0xc0]);
    f.extend_from_slice(&tot.to_be_bytes());
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(&[0x40, 0x00, ttl, 17, 0, 0]);
    f.extend_from_slice(&s);
    f.extend_from_slice(&d);
    let c = inet_checksum(&f[14..34], 0);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    udp(&mut f, sport, dport, payload, pseudo(&s, &d, udp_len));
    f
}

/// Ethernet, IPv6 (traffic class 0xc0, hop limit `hops`), UDP, `payload`.
fn frame6(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst, hops): (&str, &str, u8),
    (sport, dport): (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let (s, d) = (common::v6(src), common::v6(dst));
    let udp_len = 8 + payload.len();
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x86, 0xdd, 0x6c, 0x00, 0x00, 0x00]);
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[17, hops]);
    f.extend_from_slice(&s);
    f.extend_from_slice(&d);
    udp(&mut f, sport, dport, payload, pseudo(&s, &d, udp_len));
    f
}

fn udp(f: &mut Vec<u8>, sport: u16, dport: u16, payload: &[u8], pseudo: u32) {
    let at = f.len();
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let c = match inet_checksum(&f[at..], pseudo) {
        0 => 0xffff,
        c => c,
    };
    f[at + 6..at + 8].copy_from_slice(&c.to_be_bytes());
}

/// The router's packet to the balancer over IPv4.
fn from_router(payload: &[u8]) -> Vec<u8> {
    frame4(
        (LB_MAC, ROUTER_MAC),
        ("10.98.1.1", "10.98.1.2", 255),
        0x1234,
        (49999, 3784),
        payload,
    )
}

/// Our reply as RFC 5881 wants it: from our address and port, TTL 255.
fn to_router(payload: &[u8]) -> Vec<u8> {
    frame4(
        (ROUTER_MAC, LB_MAC),
        ("10.98.1.2", "10.98.1.1", 255),
        0,
        (SRC_PORT, 3784),
        payload,
    )
}

fn state(table: &KernelBfdTable) -> BfdState {
    table.state(5).expect("read the session's state")
}

/// Waits out our transmit limit (11/16 of 1 s while not Up).
fn wait_out_the_limit() {
    std::thread::sleep(Duration::from_millis(720));
}

const C: u8 = 0x08;
const P: u8 = 0x20;
const F: u8 = 0x10;

#[test]
fn the_datapath_brings_a_session_up_and_answers_polls_with_final() {
    let (mut rig, table) = rig("10.98.1.1", "10.98.1.2");
    // The router starts Down, slow (1 s), not knowing our discriminator.
    let down = from_router(&control(1, 0, 3, PEER_DISC, 0, 1_000_000, 300_000));
    let (action, out, _) = rig.run_counted(&down, Counter::ReplyBfd);
    assert_eq!(action, XDP_TX);
    // Init, C set, 1 s while not Up (§6.8.3), our Required Min RX 300 ms.
    assert_eq!(
        out,
        to_router(&control(2, C, 3, MY_DISC, PEER_DISC, 1_000_000, 300_000))
    );
    let s = state(&table);
    assert_eq!((s.state, s.remote_disc, s.rx, s.tx), (2, PEER_DISC, 1, 1));
    assert_eq!(s.detect_ns, 3_000_000_000, "3 × the router's 1 s");

    // The same packet again at once: taken, not answered (§6.8.7).
    let (action, _, _) = rig.run_counted(&down, Counter::DropBfdTooSoon);
    assert_eq!(action, XDP_DROP);
    assert_eq!(state(&table).too_soon, 1);

    // The router goes Init: we are Up.
    wait_out_the_limit();
    let init = from_router(&control(2, 0, 3, PEER_DISC, MY_DISC, 1_000_000, 300_000));
    let (_, out, _) = rig.run_counted(&init, Counter::ReplyBfd);
    assert_eq!(
        out,
        to_router(&control(3, C, 3, MY_DISC, PEER_DISC, 1_000_000, 300_000))
    );
    assert_eq!((state(&table).state, state(&table).ups), (3, 1));

    // Up, it polls to go fast (300 ms): Final, and our 300 ms.
    wait_out_the_limit();
    let poll = from_router(&control(3, P, 3, PEER_DISC, MY_DISC, 300_000, 300_000));
    let (_, out, _) = rig.run_counted(&poll, Counter::ReplyBfd);
    assert_eq!(
        out,
        to_router(&control(3, C | F, 3, MY_DISC, PEER_DISC, 300_000, 300_000))
    );
    // Our Desired Min TX changed: we poll until the router's Final.
    std::thread::sleep(Duration::from_millis(220));
    let up = from_router(&control(3, 0, 3, PEER_DISC, MY_DISC, 300_000, 300_000));
    let (_, out, _) = rig.run_counted(&up, Counter::ReplyBfd);
    assert_eq!(
        out,
        to_router(&control(3, C | P, 3, MY_DISC, PEER_DISC, 300_000, 300_000))
    );
    std::thread::sleep(Duration::from_millis(220));
    let fin = from_router(&control(3, F, 3, PEER_DISC, MY_DISC, 300_000, 300_000));
    let (_, out, _) = rig.run_counted(&fin, Counter::ReplyBfd);
    assert_eq!(
        out,
        to_router(&control(3, C, 3, MY_DISC, PEER_DISC, 300_000, 300_000))
    );
    assert_eq!(state(&table).detect_ns, 900_000_000);

    // Silent past the Detection Time (900 ms): the next packet finds the
    // session Down (diagnostic 1), and an Up from a Down session changes
    // nothing (§6.8.6).
    std::thread::sleep(Duration::from_millis(1000));
    let (_, out, _) = rig.run_counted(&up, Counter::ReplyBfd);
    let mut want = control(1, C | P, 3, MY_DISC, PEER_DISC, 1_000_000, 300_000);
    want[0] |= 1; // diagnostic 1: control detection time expired
    assert_eq!(out, to_router(&want));
    // It says Down: so do we, and the handshake starts over.
    wait_out_the_limit();
    let down = from_router(&control(1, 0, 3, PEER_DISC, 0, 1_000_000, 300_000));
    let (_, out, _) = rig.run_counted(&down, Counter::ReplyBfd);
    assert_eq!(out[42 + 1] >> 6, 2, "Init again");
}

#[test]
fn packets_failing_a_check_are_dropped_and_counted() {
    let (mut rig, table) = rig("10.98.1.1", "10.98.1.2");
    let good = control(1, 0, 3, PEER_DISC, 0, 1_000_000, 300_000);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        from_router(&b)
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "TTL 254 (RFC 5881 §5)",
            frame4(
                (LB_MAC, ROUTER_MAC),
                ("10.98.1.1", "10.98.1.2", 254),
                1,
                (49999, 3784),
                &good,
            ),
        ),
        (
            "to another address of ours",
            frame4(
                (LB_MAC, ROUTER_MAC),
                ("10.98.1.1", "10.98.1.3", 255),
                1,
                (49999, 3784),
                &good,
            ),
        ),
        ("version 2", with(&|b| b[0] = 2 << 5)),
        ("Length 23", with(&|b| b[3] = 23)),
        ("Length past the packet", with(&|b| b[3] = 25)),
        ("Detect Mult 0", with(&|b| b[2] = 0)),
        ("Multipoint", with(&|b| b[1] |= 0x01)),
        ("authentication", with(&|b| b[1] |= 0x04)),
        ("My Discriminator 0", with(&|b| b[4..8].fill(0))),
        (
            "someone else's Your Discriminator",
            with(&|b| b[8..12].copy_from_slice(&7u32.to_be_bytes())),
        ),
        ("Up without Your Discriminator", with(&|b| b[1] = 3 << 6)),
        ("Init without Your Discriminator", with(&|b| b[1] = 2 << 6)),
        ("cut short", from_router(&good[..20])),
    ];
    for (i, (what, frame)) in cases.iter().enumerate() {
        let (action, out, _) = rig.run_counted(frame, Counter::DropBfdInvalid);
        assert_eq!(action, XDP_DROP, "{what}: {out:?}");
        assert_eq!(state(&table).invalid, i as u64 + 1, "{what}");
    }
    let s = state(&table);
    assert_eq!(
        (s.rx, s.tx, s.state),
        (0, 0, 1),
        "no invalid packet touched the session"
    );
    // A packet of no session is the kernel's, untouched.
    let stranger = frame4(
        (LB_MAC, ROUTER_MAC),
        ("10.98.9.9", "10.98.1.2", 255),
        1,
        (49999, 3784),
        &good,
    );
    let (action, out, _) = rig.run_counted(&stranger, Counter::PassNotVip);
    assert_eq!((action, out), (XDP_PASS, stranger));
    // The good one still works.
    let (action, _, _) = rig.run_counted(&from_router(&good), Counter::ReplyBfd);
    assert_eq!(action, XDP_TX);
}

#[test]
fn an_ipv6_session_is_answered_with_a_udp_checksum() {
    let (mut rig, table) = rig("fd00:98:1::1", "fd00:98:1::2");
    let down = control(1, 0, 3, PEER_DISC, 0, 1_000_000, 300_000);
    let frame = frame6(
        (LB_MAC, ROUTER_MAC),
        ("fd00:98:1::1", "fd00:98:1::2", 255),
        (49999, 3784),
        &down,
    );
    let (action, out, _) = rig.run_counted(&frame, Counter::ReplyBfd);
    assert_eq!(action, XDP_TX);
    let want = frame6(
        (ROUTER_MAC, LB_MAC),
        ("fd00:98:1::2", "fd00:98:1::1", 255),
        (SRC_PORT, 3784),
        &control(2, C, 3, MY_DISC, PEER_DISC, 1_000_000, 300_000),
    );
    assert_eq!(out, want);
    assert_ne!(&out[60..62], &[0, 0], "IPv6 UDP needs its checksum");
    assert_eq!(state(&table).state, 2);
    // Hop limit 64: dropped.
    let far = frame6(
        (LB_MAC, ROUTER_MAC),
        ("fd00:98:1::1", "fd00:98:1::2", 64),
        (49999, 3784),
        &down,
    );
    rig.run_counted(&far, Counter::DropBfdInvalid);
}

#[test]
fn trailing_bytes_are_cut_from_the_reply() {
    let (mut rig, _table) = rig("10.98.1.1", "10.98.1.2");
    let mut frame = from_router(&control(1, 0, 3, PEER_DISC, 0, 1_000_000, 300_000));
    frame.extend_from_slice(&[0xee; 30]); // Ethernet padding
    let (action, out, _) = rig.run_counted(&frame, Counter::ReplyBfd);
    assert_eq!(action, XDP_TX);
    assert_eq!(
        out,
        to_router(&control(2, C, 3, MY_DISC, PEER_DISC, 1_000_000, 300_000))
    );
}

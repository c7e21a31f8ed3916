//! QUIC by connection ID, in the kernel (`lb_xdp`): a short-header packet
//! to a VIP with `quic:` reaches the backend whose server ID its
//! connection ID carries, from any client address and port, and is not
//! recorded, and decides also for a tuple the connection table holds;
//! long headers, other configuration ids, unknown server IDs, servers
//! down or gone and datagrams too short are hashed as any UDP flow is
//! (`lb::predict` names the backend) and counted. Connection IDs
//! are written out by hand here, octet by octet, after the draft's format
//! (first octet: config id in the three high bits; then the server ID;
//! then the nonce), never with lb's encoder or decoder.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15).

mod common;

use std::net::IpAddr;

use etherparse::PacketBuilder;
use lb::{
    config::{Encap, QuicConfig},
    dataplane::Dataplane,
    predict::{Via, predict, predict_payload},
};
use lb_common::{Counter, FlowKey, VipKey, consts::PROTO_UDP};

use common::{
    XDP_TX, ip,
    packets::udp4,
    v4,
    xdp::{BACKENDS, CLIENT_MAC, CLIENT_V4, LB_MAC, Rig, TO_LB, V4_BACKENDS, tunnel_dst},
};

const VIP: &str = "10.0.0.70";
const PORT: u16 = 443;

/// The rig's QUIC VIP: server IDs of two octets, config id 1; backend i of
/// `V4_BACKENDS` has server ID `00 0i+1`.
fn quic_rig() -> (Rig, VipKey) {
    let mut rig = Rig::new(1024);
    let key = rig.add_vip("10.0.0.70:443/udp", Encap::Ipip, true, &V4_BACKENDS);
    let vip = rig.vip_mut(&key);
    vip.quic = Some(QuicConfig {
        server_id_len: 2,
        config_id: 1,
    });
    for (i, b) in vip.backends.iter_mut().enumerate() {
        b.server_id = Some(format!("00{:02x}", i + 1).parse().expect("hex"));
    }
    rig.apply();
    (rig, key)
}

/// A short-header QUIC packet (first byte 0x40: fixed bit, key phase 0)
/// whose Destination Connection ID is `cid`, with a packet number and a
/// 20-byte stand-in for the protected payload and tag.
fn short(cid: &[u8]) -> Vec<u8> {
    let mut p = vec![0x40];
    p.extend_from_slice(cid);
    p.push(0x07);
    p.extend_from_slice(&[0x5a; 20]);
    p
}

/// A connection ID of config 1 (first octet 0b001_00111: length 7 after
/// it) for server ID `00 sid`, nonce 4 octets.
fn cid_for(sid: u8) -> [u8; 8] {
    [0x27, 0x00, sid, 0xde, 0xad, 0xbe, 0xef, 0x01]
}

/// `payload` in a UDP datagram from `client:sport` to the VIP.
fn from(client: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC)
        .ipv4(client, v4(VIP), 64)
        .udp(sport, PORT);
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("build packet");
    out
}

/// The backend (index in `BACKENDS`) Maglev gives the UDP flow
/// `client:sport` → VIP, by the reference.
fn hashed(rig: &Rig, client: [u8; 4], sport: u16) -> usize {
    let flow = FlowKey::new(IpAddr::from(client), ip(VIP), PROTO_UDP, sport, PORT);
    let p = predict(rig.dp(), &flow, false)
        .expect("predict")
        .expect("a vip");
    let addr = p.backend.and_then(|b| b.ip()).expect("a backend");
    BACKENDS.iter().position(|b| ip(b) == addr).expect("known")
}

/// Runs `frame`, wants `outcome` and exactly the events `events`, and
/// returns the backend it was tunnelled to.
fn sent(rig: &mut Rig, frame: &[u8], outcome: Counter, events: &[Counter]) -> usize {
    let (action, out, moved) = rig.run_counted(frame, outcome);
    assert_eq!(action, XDP_TX, "forwarded");
    assert_eq!(moved, events, "events counted");
    tunnel_dst(&out)
}

#[test]
fn short_headers_reach_the_server_their_connection_id_names_from_any_address() {
    let (mut rig, _) = quic_rig();
    let clients = [CLIENT_V4, [198, 51, 100, 9], [203, 0, 113, 200]];
    let mut hashed_elsewhere = 0;
    for (i, &backend) in V4_BACKENDS.iter().enumerate() {
        let payload = short(&cid_for(i as u8 + 1));
        for client in clients {
            for sport in (40_000..40_040).step_by(3) {
                let frame = from(client, sport, &payload);
                let to = sent(&mut rig, &frame, Counter::FwdQuicCid, &[]);
                assert_eq!(to, backend, "server ID 00{:02x} from port {sport}", i + 1);
                hashed_elsewhere += usize::from(hashed(&rig, client, sport) != backend);
                // Not recorded: the same tuple is routed by its ID again.
                let again = sent(&mut rig, &frame, Counter::FwdQuicCid, &[]);
                assert_eq!(again, backend);
            }
        }
    }
    // The tuples chosen would have spread over the backends by hash: the
    // connection ID, not luck, kept each on its server.
    assert!(
        hashed_elsewhere > 20,
        "only {hashed_elsewhere} tuples hash elsewhere"
    );
}

#[test]
fn long_headers_and_ids_that_do_not_decode_are_hashed_and_counted() {
    let (mut rig, _) = quic_rig();
    let mut sport = 50_000;
    let mut next = || {
        sport += 1;
        sport
    };
    // An Initial (long header, version 1) with the server's ID in its DCID.
    let mut initial = vec![0xc0, 0, 0, 0, 1, 8];
    initial.extend_from_slice(&cid_for(2));
    initial.extend_from_slice(&[0; 30]);
    let cases: Vec<(&str, Vec<u8>, Counter)> = vec![
        ("long header", initial, Counter::QuicLongHeader),
        // Config id 0 (0x07) and the unroutable 0b111 (0xe7), not the VIP's 1.
        (
            "another config id",
            short(&[0x07, 0x00, 0x02, 1, 2, 3, 4]),
            Counter::QuicUnroutable,
        ),
        (
            "the unroutable config id",
            short(&[0xe7, 0x00, 0x02, 1, 2, 3, 4]),
            Counter::QuicUnroutable,
        ),
        (
            "an unknown server ID",
            short(&cid_for(9)),
            Counter::QuicUnroutable,
        ),
        // 16 bytes of payload: one short of what the datapath reads.
        (
            "a datagram too short",
            vec![
                0x40, 0x27, 0x00, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
            ],
            Counter::QuicUnroutable,
        ),
    ];
    for (what, payload, event) in cases {
        let port = next();
        let frame = from(CLIENT_V4, port, &payload);
        let to = sent(&mut rig, &frame, Counter::FwdMaglev, &[event]);
        assert_eq!(to, hashed(&rig, CLIENT_V4, port), "{what}");
        // Recorded as any UDP flow: the next packet is a table hit.
        let again = sent(&mut rig, &frame, Counter::FwdConntrack, &[]);
        assert_eq!(again, to, "{what}");
    }
    // Exactly 17 bytes: decoded.
    let exact = [
        0x40, 0x27, 0x00, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
    ];
    let frame = from(CLIENT_V4, next(), &exact);
    assert_eq!(sent(&mut rig, &frame, Counter::FwdQuicCid, &[]), 1);
}

#[test]
fn a_server_down_or_removed_is_no_route_and_a_draining_one_still_is() {
    let (mut rig, key) = quic_rig();
    let payload = short(&cid_for(2));
    let frame = |sport| from([198, 51, 100, 1], sport, &payload);
    // Draining (weight 0, still usable): its connections keep reaching it.
    rig.set_weight(&key, 1, 0);
    for sport in 1000..1010 {
        assert_eq!(sent(&mut rig, &frame(sport), Counter::FwdQuicCid, &[]), 1);
    }
    // Down: hashed elsewhere, where the client's next attempt is answered.
    rig.set_weight(&key, 1, 1);
    rig.mark_down(&key, 1);
    for sport in 2000..2010 {
        let to = sent(
            &mut rig,
            &frame(sport),
            Counter::FwdMaglev,
            &[Counter::QuicUnroutable],
        );
        assert_ne!(to, 1, "a down server gets nothing");
    }
    // Removed: likewise, and its ID is gone from the map.
    rig.remove_backend(&key, 1);
    let to = sent(
        &mut rig,
        &frame(3000),
        Counter::FwdMaglev,
        &[Counter::QuicUnroutable],
    );
    assert_ne!(to, 1);
    let servers = rig.dp().quic_servers().expect("read LB_QUIC_SERVERS");
    assert_eq!(servers.len(), 2, "one entry per remaining server ID");
}

#[test]
fn a_connection_id_outranks_the_connection_table_and_a_vip_without_quic_ignores_ids() {
    let (mut rig, _) = quic_rig();
    // A flow recorded by its Initial keeps the recorded backend while its
    // packets name no server.
    let port = 60_001;
    let mut initial = vec![0xc0, 0, 0, 0, 1, 8];
    initial.extend_from_slice(&[9; 8]);
    initial.extend_from_slice(&[0; 30]);
    let first = sent(
        &mut rig,
        &from(CLIENT_V4, port, &initial),
        Counter::FwdMaglev,
        &[Counter::QuicLongHeader],
    );
    let foreign = short(&[0x07, 0x00, 0x02, 1, 2, 3, 4]);
    let to = sent(
        &mut rig,
        &from(CLIENT_V4, port, &foreign),
        Counter::FwdConntrack,
        &[],
    );
    assert_eq!(to, first, "an ID of another config id: the entry decides");
    // The same tuple, reused by another connection (a NAT gave the port
    // to another client; the stack reused it): its ID names its server,
    // which the entry's backend is not. The ID decides, every time, and
    // the entry stays for the packets that name no server.
    let other = (first + 1) % 3;
    let reused = from(CLIENT_V4, port, &short(&cid_for(other as u8 + 1)));
    for _ in 0..2 {
        let to = sent(&mut rig, &reused, Counter::FwdQuicCid, &[]);
        assert_eq!(to, other, "the connection ID outranks the entry");
    }
    let to = sent(
        &mut rig,
        &from(CLIENT_V4, port, &foreign),
        Counter::FwdConntrack,
        &[],
    );
    assert_eq!(to, first);
    // `lbctl simulate`'s model, on the kernel's maps, agrees.
    let flow = FlowKey::new(IpAddr::from(CLIENT_V4), ip(VIP), PROTO_UDP, port, PORT);
    for (payload, via, to) in [
        (short(&cid_for(other as u8 + 1)), Via::QuicCid, other),
        (foreign.clone(), Via::ConnTrack, first),
    ] {
        let p = predict_payload(rig.dp(), &flow, false, Some(&payload))
            .expect("predict")
            .expect("a vip");
        let addr = p.backend.and_then(|b| b.ip());
        assert_eq!((p.via, addr), (via, Some(ip(BACKENDS[to]))));
    }
    // A server ID of the entry's own backend: the same place, by the ID.
    let own = from(CLIENT_V4, port, &short(&cid_for(first as u8 + 1)));
    assert_eq!(sent(&mut rig, &own, Counter::FwdQuicCid, &[]), first);
    // The standard UDP VIP has no `quic:`: IDs mean nothing there.
    rig.add_vip("10.0.0.10:53/udp", Encap::Ipip, true, &V4_BACKENDS);
    let frame = udp4(TO_LB, "10.0.0.10", 53, 7000, &short(&cid_for(1)));
    let (action, _, events) = rig.run_counted(&frame, Counter::FwdMaglev);
    assert_eq!(action, XDP_TX);
    assert!(
        events.is_empty(),
        "no QUIC events on a plain VIP: {events:?}"
    );
}

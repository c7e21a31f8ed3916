//! The oracle's reading of QUIC by connection ID, written from the
//! feature's description (issue #30), not from lb's code, as amended when
//! a reused tuple showed the connection table must not outrank the ID: a
//! datagram to a VIP with `quic:` is read by the first 17 bytes of its
//! UDP payload, which must lie inside the IP packet (bytes in the
//! frame's trailer do not count). Byte 0 with its
//! high bit set is a long header: hashed. Otherwise (a short header) byte
//! 1 opens the connection ID: its three high bits must be the VIP's
//! configuration id, and the next `server_id_len` bytes a server ID of
//! one of the VIP's backends that is up (weight 0, draining, still
//! counts): the datagram goes to that backend and is not recorded, even
//! if a connection-table entry claims its tuple. Every other short header
//! is unroutable: a table hit if an entry claims it, else hashed. Uses nothing of lb's:
//! neither `lb_common::quic` nor lb's parser, tables or `predict`.

use std::net::IpAddr;

use crate::fuzz::model::Model;

/// Bytes of UDP payload the balancer reads.
pub const READ_LEN: usize = 17;

/// QUIC version 2 (RFC 9369).
const VERSION_2: u32 = 0x6b33_43cf;

/// Where a datagram to a QUIC VIP goes: a server always; the others
/// where a usable connection-table entry says, if one claims the tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To this backend, counted `fwd_quic_cid`, not recorded.
    Server(IpAddr),
    /// Hashed as any UDP flow, with the event `quic_long_header`.
    LongHeader,
    /// Hashed as any UDP flow, with the event `quic_cid_unroutable`.
    Unroutable,
}

/// The oracle's reading of a datagram to a QUIC VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub route: Route,
    /// What it read, for reports and coverage (one of [`READINGS`]).
    pub why: &'static str,
    /// The server ID's length, for a datagram routed by it.
    pub server_id_len: u8,
}

pub const CUT: &str = "under 17 bytes of UDP payload in the IP packet";
pub const LONG_V1: &str = "long header, version 1";
pub const LONG_V2: &str = "long header, version 2";
pub const LONG_VN: &str = "long header, version negotiation (0)";
pub const LONG_OTHER: &str = "long header, another version";
pub const CONFIG_7: &str = "short header, configuration id 7";
pub const CONFIG_OTHER: &str = "short header, another configuration id";
pub const UP: &str = "short header, server ID of an up backend";
pub const DRAINING: &str = "short header, server ID of a draining backend (weight 0)";
pub const DOWN: &str = "short header, server ID of a down backend";
pub const UNKNOWN: &str = "short header, a server ID the VIP does not have";

/// Every reading (what a run's coverage must show).
pub const READINGS: [&str; 11] = [
    CUT,
    LONG_V1,
    LONG_V2,
    LONG_VN,
    LONG_OTHER,
    CONFIG_7,
    CONFIG_OTHER,
    UP,
    DRAINING,
    DOWN,
    UNKNOWN,
];

/// The reading of `payload` (the UDP payload, bounded by the IP packet)
/// for VIP `v`; `None` if the VIP has no `quic:`.
pub fn read(model: &Model, v: usize, payload: &[u8]) -> Option<Reading> {
    let vip = &model.vips[v];
    let quic = vip.quic?;
    let hashed = |route, why| Reading {
        route,
        why,
        server_id_len: 0,
    };
    let Some(head) = payload.get(..READ_LEN) else {
        return Some(hashed(Route::Unroutable, CUT));
    };
    if head[0] & 0x80 != 0 {
        let why = match u32::from_be_bytes([head[1], head[2], head[3], head[4]]) {
            0 => LONG_VN,
            1 => LONG_V1,
            VERSION_2 => LONG_V2,
            _ => LONG_OTHER,
        };
        return Some(hashed(Route::LongHeader, why));
    }
    let config = head[1] >> 5;
    if config != quic.config_id {
        let why = if config == 7 { CONFIG_7 } else { CONFIG_OTHER };
        return Some(hashed(Route::Unroutable, why));
    }
    let sid = &head[2..2 + usize::from(quic.server_id_len)];
    let owner = vip
        .backends
        .iter()
        .find(|b| b.server_id.as_deref() == Some(sid));
    Some(match owner {
        Some(b) if b.up => Reading {
            route: Route::Server(b.addr),
            why: if b.weight == 0 { DRAINING } else { UP },
            server_id_len: quic.server_id_len,
        },
        Some(_) => hashed(Route::Unroutable, DOWN),
        None => hashed(Route::Unroutable, UNKNOWN),
    })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::fuzz::{
        generate::Pkt,
        oracle::{Kinds, expect},
        wire::{self, Eth},
    };

    /// The model with quic4 configured by hand: 2-octet server IDs under
    /// configuration id 2; `0a0b` up, `0c0d` draining, `0e0f` down.
    fn model() -> (Model, usize) {
        let (mut m, q) = Model::with_quic4(2);
        let v = &mut m.vips[q];
        let ids = [
            ([0x0a, 0x0b], 1, true),
            ([0x0c, 0x0d], 0, true),
            ([0x0e, 0x0f], 1, false),
        ];
        for (b, (id, weight, up)) in v.backends.iter_mut().zip(ids) {
            b.server_id = Some(id.to_vec());
            b.weight = weight;
            b.up = up;
        }
        (m, q)
    }

    fn frame(m: &Model, q: usize, payload: &[u8]) -> Vec<u8> {
        let s: IpAddr = "192.0.2.1".parse().expect("address literal");
        let d = m.vips[q].addr;
        let p = Pkt::new(s, d, wire::UDP, wire::udp((s, d), (4000, 443), payload));
        Eth::default().frame(wire::ETH_IPV4, &p.build().0)
    }

    /// A short header (17 bytes) under `config` carrying `sid`.
    fn short(config: u8, sid: [u8; 2]) -> [u8; 17] {
        let mut p = [0x5a; 17];
        p[0] = 0x41;
        p[1] = config << 5 | 0x11;
        p[2..4].copy_from_slice(&sid);
        p
    }

    fn read_frame(m: &Model, f: &[u8]) -> Reading {
        expect(m, f).quic.expect("a datagram to a QUIC VIP")
    }

    #[test]
    fn a_short_header_goes_to_the_usable_server_its_id_names() {
        let (m, q) = model();
        let addr = |i: usize| m.vips[q].backends[i].addr;
        let e = expect(&m, &frame(&m, q, &short(2, [0x0a, 0x0b])));
        assert_eq!(e.kinds, Kinds::FORWARD);
        assert!(e.touches.is_none(), "routed by its ID: not recorded");
        let r = e.quic.expect("QUIC");
        assert_eq!(
            (r.route, r.why, r.server_id_len),
            (Route::Server(addr(0)), UP, 2)
        );
        let r = read_frame(&m, &frame(&m, q, &short(2, [0x0c, 0x0d])));
        assert_eq!((r.route, r.why), (Route::Server(addr(1)), DRAINING));
        let unroutable = [
            (short(2, [0x0e, 0x0f]), DOWN),
            (short(2, [0x0a, 0x0c]), UNKNOWN),
            (short(3, [0x0a, 0x0b]), CONFIG_OTHER),
            (short(7, [0x0a, 0x0b]), CONFIG_7),
        ];
        for (p, why) in unroutable {
            let e = expect(&m, &frame(&m, q, &p));
            assert!(e.touches.is_some(), "{why}: hashed, recorded");
            let r = e.quic.expect("QUIC");
            assert_eq!((r.route, r.why), (Route::Unroutable, why));
        }
    }

    #[test]
    fn a_long_header_is_hashed_whatever_follows_its_first_byte() {
        let (m, q) = model();
        let mut p = short(2, [0x0a, 0x0b]);
        p[0] |= 0x80;
        let r = read_frame(&m, &frame(&m, q, &p));
        assert_eq!((r.route, r.why), (Route::LongHeader, LONG_OTHER));
        for (version, why) in [(1u32, LONG_V1), (VERSION_2, LONG_V2), (0, LONG_VN)] {
            p[1..5].copy_from_slice(&version.to_be_bytes());
            assert_eq!(read_frame(&m, &frame(&m, q, &p)).why, why);
        }
    }

    #[test]
    fn the_17_bytes_must_lie_inside_the_ip_packet() {
        let (m, q) = model();
        let p = short(2, [0x0a, 0x0b]);
        for n in 0..17 {
            let r = read_frame(&m, &frame(&m, q, &p[..n]));
            assert_eq!((r.route, r.why), (Route::Unroutable, CUT), "{n} bytes");
        }
        // The IP length ends one byte early; the frame keeps the byte.
        let mut f = frame(&m, q, &p);
        f[16..18].copy_from_slice(&(20u16 + 8 + 16).to_be_bytes());
        wire::fix_ipv4_checksum(&mut f[14..]);
        assert_eq!(read_frame(&m, &f).why, CUT);
        // No quic: this epoch, or a VIP that never has it: no reading.
        let mut none = m.clone();
        none.vips[q].quic = None;
        assert!(expect(&none, &frame(&none, q, &p)).quic.is_none());
        let udp4 = m.vips.iter().position(|v| v.name == "udp4").expect("udp4");
        let s: IpAddr = "192.0.2.1".parse().expect("address literal");
        let d = m.vips[udp4].addr;
        let plain = Pkt::new(s, d, wire::UDP, wire::udp((s, d), (4000, 53), &p));
        let plain = Eth::default().frame(wire::ETH_IPV4, &plain.build().0);
        assert!(expect(&m, &plain).quic.is_none());
    }
}

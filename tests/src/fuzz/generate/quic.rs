//! QUIC datagrams to the QUIC VIPs (and a few to UDP VIPs without
//! `quic:`): short headers whose connection ID carries the server ID of
//! an up, draining, down or removed backend, an unknown one or another
//! VIP's; other configuration ids, 7 among them; long headers of versions
//! 1 and 2 (their destination ID often routable), version negotiation,
//! unknown versions, and long headers whose bytes after the first would
//! route as a short header's. UDP payloads are cut at every length from 0
//! to 20, or by the IP length with the rest of the header left in the
//! frame's trailer; some frames then take a mutation or two aimed at the
//! bytes the balancer reads. Flows come from a pool of their own, so that
//! a flow's packets meet the connection-table entries its other packets
//! left: hits for IDs that name no server, outranked by those that do.
//!
//! The aims are labels for the report; the oracle reads every frame
//! afresh.

use super::{Gen, Generator, Pkt, PoolFlow, Sample};
use crate::fuzz::{
    model::{Backend, Model, Quic, Vip},
    wire,
};

/// QUIC flows remembered.
const POOL_SIZE: usize = 1024;

/// QUIC version 2 (RFC 9369).
const VERSION_2: u32 = 0x6b33_43cf;

/// The aim of a datagram whose header was mutated afterwards.
pub const MUTATED: &str = "mutated after being built";

/// One datagram to a QUIC VIP (or, for one new flow in twenty, to
/// another UDP VIP).
pub fn datagram(g: &mut Generator, model: &Model) -> Sample {
    let flow = quic_flow(g, model);
    let vip = &model.vips[flow.vip];
    let (mut aim, mut payload) = match vip.quic {
        Some(q) => header(g, model, flow.vip, q),
        None => ("to a UDP VIP without a quic: section", any_header(g)),
    };
    let total = match g.rng.below(10) {
        0..=6 => g.rng.range(20, 120),
        7 | 8 => g.rng.range(120, 1250),
        _ => g.rng.range(1250, 1500),
    };
    if payload.len() < total {
        let pad = g.rng.bytes(total - payload.len());
        payload.extend_from_slice(&pad);
    }
    let cut = match g.rng.below(100) {
        0..=14 => {
            payload.truncate(g.rng.range(0, 20));
            aim = "UDP payload cut to 0-20 bytes";
            None
        }
        15..=19 => {
            aim = "UDP payload cut by the IP length, the rest in the trailer";
            Some(g.rng.range(0, 17))
        }
        _ => None,
    };
    let ends = (flow.client, vip.addr);
    let udp = wire::udp(ends, (flow.sport, flow.dport), &payload);
    let mut p = Pkt::new(flow.client, vip.addr, wire::UDP, udp);
    p.df = g.rng.chance(80);
    if !p.v6() && g.rng.chance(10) {
        p.v4_options = vec![1; 4 * g.rng.range(1, 4)];
    }
    if p.v6() && g.rng.chance(10) {
        p.v6_ext.push((
            60,
            wire::ext_header(60, 0, 8 * g.rng.range(1, 3), &mut |_| 0),
        ));
    }
    let ip_header = if p.v6() {
        40 + p.v6_ext.iter().map(|(_, b)| b.len()).sum::<usize>()
    } else {
        20 + p.v4_options.len()
    };
    let mut s = g.sample(Gen::Quic, &p);
    let at = 14 + ip_header + 8;
    if let Some(keep) = cut {
        cut_by_ip_length(&mut s.frame, p.v6(), ip_header, keep);
    }
    let last_sid = 1 + vip.quic.map_or(1, |q| usize::from(q.server_id_len));
    s.fields
        .extend([at, at + 1, at + 2, at + last_sid, at + 16, at + 17]);
    if g.rng.chance(12) {
        for _ in 0..g.rng.range(1, 2) {
            mutate(g, &mut s.frame, at);
        }
        aim = MUTATED;
    }
    s.quic = Some(aim);
    s
}

/// A flow to a QUIC VIP: most often one seen before.
fn quic_flow(g: &mut Generator, model: &Model) -> PoolFlow {
    if !g.quic.is_empty() && g.rng.chance(70) {
        return *g.rng.pick(&g.quic);
    }
    let quic_vip = g.rng.chance(95);
    let vips: Vec<usize> = (0..model.vips.len())
        .filter(|&i| {
            let v = &model.vips[i];
            v.proto == wire::UDP && v.has_backends() && (v.quic_row || !quic_vip)
        })
        .collect();
    let vip = *g.rng.pick(&vips);
    let v = &model.vips[vip];
    let f = PoolFlow {
        client: g.client(v.is_v6()),
        vip,
        sport: g.rng.u16().max(1),
        dport: match v.port {
            0 => g.rng.u16(),
            p => p,
        },
    };
    if g.quic.len() < POOL_SIZE {
        g.quic.push(f);
    } else {
        let i = g.rng.below(POOL_SIZE);
        g.quic[i] = f;
    }
    f
}

/// The start of a QUIC packet to VIP `v` (configured with `q`) and what
/// it aims at: a long header one time in four, else a short one.
fn header(g: &mut Generator, model: &Model, v: usize, q: Quic) -> (&'static str, Vec<u8>) {
    let len = usize::from(q.server_id_len);
    let up =
        server_id(g, &model.vips[v], |b| b.up && b.weight > 0).unwrap_or_else(|| g.rng.bytes(len));
    if g.rng.chance(27) {
        return long_header(g, q, &up);
    }
    let (aim, config, sid) = short_aim(g, model, v, q, up);
    (aim, short(g, config, &sid))
}

/// What a short header to VIP `v` carries: its aim, configuration id and
/// server ID (`up`, an up backend's, when the aim has none to offer).
fn short_aim(
    g: &mut Generator,
    model: &Model,
    v: usize,
    q: Quic,
    up: Vec<u8>,
) -> (&'static str, u8, Vec<u8>) {
    let vip = &model.vips[v];
    let (len, config) = (usize::from(q.server_id_len), q.config_id);
    let found =
        match g.rng.weighted(&[30, 8, 8, 6, 6, 4, 6, 4]) {
            1 => server_id(g, vip, |b| b.up && b.weight == 0)
                .map(|s| ("short, server ID of a draining backend", config, s)),
            2 => server_id(g, vip, |b| !b.up)
                .map(|s| ("short, server ID of a down backend", config, s)),
            3 => retired_id(g, vip, len)
                .map(|s| ("short, a server ID of a removed backend", config, s)),
            4 => Some((
                "short, a server ID no backend has",
                config,
                unknown_id(g, vip, len),
            )),
            5 => other_vips_id(g, model, v, len)
                .map(|s| ("short, another QUIC VIP's server ID", config, s)),
            6 => {
                let other = (config + 1 + g.rng.below(6) as u8) % 7;
                Some(("short, another configuration id", other, up.clone()))
            }
            7 => Some(("short, configuration id 7", 7, up.clone())),
            _ => None,
        };
    found.unwrap_or(("short, server ID of an up backend", config, up))
}

/// A long header and its aim: versions 1 and 2 (the destination ID often
/// `up`'s, routable), version negotiation, an unknown version, or a
/// routable short header with the high bit set.
fn long_header(g: &mut Generator, q: Quic, up: &[u8]) -> (&'static str, Vec<u8>) {
    match g.rng.weighted(&[12, 5, 5, 4]) {
        0 => {
            let version = if g.rng.chance(60) { 1 } else { VERSION_2 };
            let dcid = if g.rng.chance(50) {
                cid(g, q.config_id, up)
            } else {
                g.rng.bytes_in(8, 20)
            };
            ("long header, version 1 or 2", long(g, version, &dcid))
        }
        1 => {
            let dcid = g.rng.bytes_in(0, 20);
            ("long header, version negotiation", long(g, 0, &dcid))
        }
        2 => {
            let version = unknown_version(g);
            let dcid = cid(g, q.config_id, up);
            ("long header, an unknown version", long(g, version, &dcid))
        }
        _ => {
            let mut h = short(g, q.config_id, up);
            h[0] |= 0x80;
            ("long header, routable if read as a short one", h)
        }
    }
}

/// A short header: the first byte (fixed bit mostly set, the high bit
/// clear), then a connection ID of `config` and `sid`.
fn short(g: &mut Generator, config: u8, sid: &[u8]) -> Vec<u8> {
    let first = if g.rng.chance(90) {
        0x40 | (g.rng.u8() & 0x3f)
    } else {
        g.rng.u8() & 0x7f
    };
    let mut h = vec![first];
    h.extend(cid(g, config, sid));
    h
}

/// A connection ID: the first octet (`config` in its three high bits),
/// the server ID, a nonce up to 20 octets in all (at least 4).
fn cid(g: &mut Generator, config: u8, sid: &[u8]) -> Vec<u8> {
    let mut c = vec![config << 5 | (g.rng.u8() & 0x1f)];
    c.extend_from_slice(sid);
    let nonce = g.rng.range(4, 19 - sid.len());
    let bytes = g.rng.bytes(nonce);
    c.extend(bytes);
    c
}

/// A long header of `version` with destination ID `dcid` and a random
/// source ID.
fn long(g: &mut Generator, version: u32, dcid: &[u8]) -> Vec<u8> {
    let first = if g.rng.chance(90) {
        0xc0 | (g.rng.u8() & 0x3f)
    } else {
        0x80 | (g.rng.u8() & 0x7f)
    };
    let mut h = vec![first];
    h.extend(version.to_be_bytes());
    h.push(dcid.len() as u8);
    h.extend_from_slice(dcid);
    let scid = g.rng.bytes_in(0, 20);
    h.push(scid.len() as u8);
    h.extend(scid);
    h
}

/// A version no QUIC speaks here: a draft, a reserved (greasing) one,
/// gQUIC, or any.
fn unknown_version(g: &mut Generator) -> u32 {
    let any = g.rng.u32() | 0x0100_0000;
    *g.rng.pick(&[0xff00_001d, 0x1a2a_3a4a, 0x5130_3530, 2, any])
}

/// Any QUIC-looking start (for a VIP without `quic:`).
fn any_header(g: &mut Generator) -> Vec<u8> {
    let len = g.rng.range(1, 15);
    let sid = g.rng.bytes(len);
    if g.rng.chance(50) {
        let config = g.rng.below(8) as u8;
        short(g, config, &sid)
    } else {
        let dcid = g.rng.bytes_in(0, 20);
        long(g, 1, &dcid)
    }
}

/// The server ID of one of `vip`'s backends that `which` accepts.
fn server_id(g: &mut Generator, vip: &Vip, which: impl Fn(&Backend) -> bool) -> Option<Vec<u8>> {
    let ids: Vec<&Vec<u8>> = vip
        .backends
        .iter()
        .filter(|b| which(b))
        .filter_map(|b| b.server_id.as_ref())
        .collect();
    (!ids.is_empty()).then(|| g.rng.pick(&ids).to_vec())
}

/// A server ID of `len` octets `vip` had and no backend has now.
fn retired_id(g: &mut Generator, vip: &Vip, len: usize) -> Option<Vec<u8>> {
    let gone: Vec<&Vec<u8>> = vip
        .retired_ids
        .iter()
        .filter(|s| s.len() == len && !vip.has_server_id(s))
        .collect();
    (!gone.is_empty()).then(|| g.rng.pick(&gone).to_vec())
}

/// A server ID of `len` octets that another QUIC VIP has and `v` has not.
fn other_vips_id(g: &mut Generator, model: &Model, v: usize, len: usize) -> Option<Vec<u8>> {
    let ids: Vec<&Vec<u8>> = model
        .vips
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != v)
        .flat_map(|(_, o)| o.backends.iter().filter_map(|b| b.server_id.as_ref()))
        .filter(|s| s.len() == len && !model.vips[v].has_server_id(s))
        .collect();
    (!ids.is_empty()).then(|| g.rng.pick(&ids).to_vec())
}

/// `len` octets no backend of `vip` has as its server ID.
fn unknown_id(g: &mut Generator, vip: &Vip, len: usize) -> Vec<u8> {
    loop {
        let sid = g.rng.bytes(len);
        if !vip.has_server_id(&sid) {
            return sid;
        }
    }
}

/// Shortens the IP packet of `frame` (its length field only) so that it
/// holds `keep` bytes of UDP payload; the frame keeps the rest.
fn cut_by_ip_length(frame: &mut [u8], v6: bool, ip_header: usize, keep: usize) {
    let l3 = 14;
    if frame.len() < l3 + ip_header + 8 + keep {
        return;
    }
    if v6 {
        let len = (ip_header - 40 + 8 + keep) as u16;
        frame[l3 + 4..l3 + 6].copy_from_slice(&len.to_be_bytes());
    } else {
        let len = (ip_header + 8 + keep) as u16;
        frame[l3 + 2..l3 + 4].copy_from_slice(&len.to_be_bytes());
        wire::fix_ipv4_checksum(&mut frame[l3..]);
    }
}

/// One change to the bytes the balancer reads (the UDP payload at `at`):
/// the long-header bit, the configuration id, a server-ID byte, any of
/// the 17, or the frame cut inside them.
fn mutate(g: &mut Generator, frame: &mut Vec<u8>, at: usize) {
    let i = at + g.rng.below(17);
    match g.rng.below(5) {
        0 if at < frame.len() => frame[at] ^= 0x80,
        1 if at + 1 < frame.len() => frame[at + 1] ^= 0x20 << g.rng.below(3),
        2 if i < frame.len() => frame[i] ^= 1 << g.rng.below(8),
        3 if i < frame.len() => frame[i] = g.rng.u8(),
        _ => frame.truncate(at + g.rng.range(0, 20)),
    }
}

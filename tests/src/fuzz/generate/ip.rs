//! Generators of TCP, UDP and fragments: to VIPs (well formed, with IPv4
//! options or a few IPv6 extension headers), beside VIPs (other ports,
//! protocols and addresses), too big for the MTU, and broken in one
//! chosen header field.

use std::net::IpAddr;

use super::{Gen, Generator, Pkt, PoolFlow, Sample};
use crate::fuzz::{model::Model, wire};

/// A payload length: mostly small, sometimes past any MTU.
fn payload_len(g: &mut Generator) -> usize {
    match g.rng.below(10) {
        0..=6 => g.rng.range(0, 200),
        7 | 8 => g.rng.range(200, 1400),
        _ => g.rng.range(1400, 3300),
    }
}

/// A packet of `flow` with `payload` bytes, DF mostly set.
fn flow_packet(g: &mut Generator, model: &Model, flow: &PoolFlow, payload: usize) -> Pkt {
    let (proto, l4) = g.segment(model, flow, payload);
    let mut p = Pkt::new(flow.client, model.vips[flow.vip].addr, proto, l4);
    p.df = g.rng.chance(75);
    p.tos = if g.rng.chance(20) { g.rng.u8() } else { 0 };
    p
}

/// Well-formed TCP or UDP to a VIP, sometimes with IPv4 options or a
/// short chain of walked IPv6 extension headers.
pub fn vip(g: &mut Generator, model: &Model, v6: bool) -> Sample {
    let flow = g.flow(model, v6);
    let len = payload_len(g);
    let mut p = flow_packet(g, model, &flow, len);
    if !v6 && g.rng.chance(10) {
        let words = g.rng.range(1, 10);
        p.v4_options = options(g, words * 4);
    }
    if v6 && g.rng.chance(15) {
        for _ in 0..g.rng.range(1, 3) {
            let kind = *g.rng.pick(&[0u8, 43, 60, 51]);
            let len = if kind == 51 {
                4 * g.rng.range(3, 8)
            } else {
                8 * g.rng.range(1, 4)
            };
            let bytes = wire::ext_header(kind, 0, len, &mut |_| 0);
            p.v6_ext.push((kind, bytes));
        }
    }
    let source = if v6 { Gen::Vip6 } else { Gen::Vip4 };
    g.sample(source, &p)
}

/// IPv4 options of `len` bytes: NOPs and an end-of-list, or random bytes
/// (lb skips options without reading them).
fn options(g: &mut Generator, len: usize) -> Vec<u8> {
    if g.rng.chance(50) {
        let mut o = vec![1u8; len];
        o[len - 1] = 0;
        o
    } else {
        g.rng.bytes(len)
    }
}

/// IPv4 to a VIP with options of every length (IHL 6 to 15).
pub fn options4(g: &mut Generator, model: &Model) -> Sample {
    let flow = g.flow(model, false);
    let len = g.rng.range(0, 300);
    let mut p = flow_packet(g, model, &flow, len);
    let words = g.rng.range(1, 10);
    p.v4_options = options(g, words * 4);
    g.sample(Gen::Options4, &p)
}

/// Traffic next to the VIPs: a VIP address with another port or
/// protocol, other L4 protocols, and addresses that are no VIP's.
pub fn near_vip(g: &mut Generator, model: &Model) -> Sample {
    let v6 = g.rng.chance(50);
    let mut flow = g.flow(model, v6);
    let client = flow.client;
    let vip_addr = model.vips[flow.vip].addr;
    let (dst, proto) = match g.rng.below(5) {
        0 => {
            flow.dport = g.rng.u16();
            (vip_addr, model.vips[flow.vip].proto)
        }
        1 => (
            vip_addr,
            if model.vips[flow.vip].proto == wire::TCP {
                wire::UDP
            } else {
                wire::TCP
            },
        ),
        2 => (
            vip_addr,
            *g.rng.pick(&[132u8, 50, 47, 4, 41, 59, 103, 0, 43, 255]),
        ),
        3 => (other_address(g, v6), model.vips[flow.vip].proto),
        _ => (vip_addr, model.vips[flow.vip].proto),
    };
    let ends = (client, dst);
    let ports = (flow.sport, flow.dport);
    let data = g.rng.bytes_in(0, 100);
    let l4 = match proto {
        wire::TCP => wire::tcp(ends, ports, wire::TCP_SYN, &[], &data),
        wire::UDP => wire::udp(ends, ports, &data),
        _ => data,
    };
    let mut p = Pkt::new(client, dst, proto, l4);
    if g.rng.chance(20) && !p.v6() {
        p.v4_options = options(g, 4);
    }
    g.sample(Gen::NearVip, &p)
}

/// An address that is no VIP's (or, rarely, a VIP's neighbour).
pub fn other_address(g: &mut Generator, v6: bool) -> IpAddr {
    if v6 {
        let mut o = [
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99,
        ];
        if g.rng.chance(50) {
            g.rng.fill(&mut o[4..]);
        }
        IpAddr::from(o)
    } else if g.rng.chance(50) {
        IpAddr::from([10, 0, 0, *g.rng.pick(&[9u8, 11, 41, 99, 255])])
    } else {
        IpAddr::from(g.rng.u32().to_be_bytes())
    }
}

/// IPv4 fragments (MF and offset) or IPv6 fragment headers (after a few
/// walked headers, sometimes): first, middle and last fragments to
/// fragment-hashing VIPs, to VIPs that drop fragments, to no VIP.
pub fn fragment(g: &mut Generator, model: &Model, v6: bool) -> Sample {
    let mut flow = g.flow(model, v6);
    if g.rng.chance(50) {
        // Aim at the fragment-hashing VIP of the family.
        if let Some(i) = model
            .vips
            .iter()
            .position(|v| v.frag_hash && v.is_v6() == v6)
        {
            flow.vip = i;
            flow.dport = model.vips[i].port;
        }
    }
    let len = payload_len(g);
    let mut p = flow_packet(g, model, &flow, len);
    if g.rng.chance(10) {
        p.dst = other_address(g, v6);
    }
    let (offset, more) = match g.rng.below(3) {
        0 => (0, true),
        1 => (g.rng.range(1, 500) as u16, true),
        _ => (g.rng.range(1, 8000) as u16, false),
    };
    if offset != 0 {
        // A later fragment carries data, not the L4 header.
        let n = p.l4.len();
        p.l4 = g.rng.bytes(n.max(8));
    }
    p.df = g.rng.chance(10);
    if v6 {
        if g.rng.chance(20) {
            p.v6_ext.push((0, wire::ext_header(0, 0, 8, &mut |_| 0)));
        }
        let id = g.rng.u32();
        p.v6_ext
            .push((44, wire::frag_header(0, offset, more, id).to_vec()));
    } else {
        p.frag = (offset & 0x1fff) | if more { wire::MF } else { 0 };
    }
    let source = if v6 { Gen::Frag6 } else { Gen::Frag4 };
    g.sample(source, &p)
}

/// A VIP packet (or fragment of a hashing VIP) whose IP length is within a
/// few bytes of what fits the MTU once tunnelled.
pub fn too_big(g: &mut Generator, model: &Model) -> Sample {
    let v6 = g.rng.chance(50);
    let flow = g.flow(model, v6);
    let vip = &model.vips[flow.vip];
    let mtu = match model.settings.mtu {
        0 => 1500,
        m => usize::from(m),
    };
    let fits = mtu.saturating_sub(vip.overhead());
    let ip_len = (fits + g.rng.range(0, 6)).saturating_sub(3);
    let hdr = if v6 { 40 } else { 20 } + if vip.proto == wire::TCP { 20 } else { 8 };
    let mut p = flow_packet(g, model, &flow, ip_len.saturating_sub(hdr));
    p.df = g.rng.chance(60);
    g.sample(Gen::TooBig, &p)
}

/// A VIP packet broken in one header field or cut short.
pub fn malformed(g: &mut Generator, model: &Model) -> Sample {
    let v6 = g.rng.chance(50);
    let mut s = vip(g, model, v6);
    s.source = Gen::Malformed;
    let f = &mut s.frame;
    let l3 = 14;
    let ip_len = f.len() - l3;
    let set16 = |f: &mut Vec<u8>, at: usize, v: usize| {
        f[at..at + 2].copy_from_slice(&(v.min(0xffff) as u16).to_be_bytes());
    };
    let hlen = if v6 {
        40
    } else {
        usize::from(f[l3] & 0x0f) * 4
    };
    match g.rng.below(6) {
        // Cut inside the IP header.
        0 => f.truncate(l3 + g.rng.below(hlen)),
        // Wrong version (and, for IPv4, IHL below 5 half the time).
        1 => {
            let v = *g.rng.pick(&[0u8, 4, 5, 6, 7, 15]);
            let ihl = if g.rng.chance(50) {
                g.rng.below(5) as u8
            } else {
                f[l3] & 0x0f
            };
            f[l3] = v << 4 | if v6 { f[l3] & 0x0f } else { ihl };
        }
        // Length past the frame.
        2 => {
            let at = if v6 { l3 + 4 } else { l3 + 2 };
            let extra = g.rng.range(1, 2000);
            set16(f, at, ip_len - if v6 { 40 } else { 0 } + extra);
        }
        // Length cutting the L4 header (the frame keeps the bytes).
        3 => {
            let at = if v6 { l3 + 4 } else { l3 + 2 };
            let keep = g.rng.below(20);
            set16(f, at, if v6 { keep } else { hlen + keep });
        }
        // IPv4 total length below the header; IPv6 payload length 0.
        4 => set16(
            f,
            if v6 { l3 + 4 } else { l3 + 2 },
            g.rng.below(hlen.min(20)),
        ),
        // TCP data offset below 5 (or a UDP length field, which is not read).
        _ => {
            let l4 = l3 + hlen;
            if l4 + 13 < f.len() {
                f[l4 + 12] = (g.rng.below(5) as u8) << 4;
            }
        }
    }
    if !v6 && f.len() >= l3 + 20 {
        wire::fix_ipv4_checksum(&mut f[l3..]);
    }
    s
}

//! ICMP generators: errors from a router about VIP flows (the backend's
//! answer VIP → client, quoted), of every error type and of types that are
//! no errors, with quotes whole, longer, or cut at every length, quoting
//! from another address than the one the error is sent to, and with the
//! outer IP length cut inside the quote while the frame keeps the quote's
//! bytes as trailer; and echo requests (and other ICMP) to VIP addresses
//! and others.

use std::net::IpAddr;

use super::{Gen, Generator, Pkt, Sample, ip::other_address};
use crate::fuzz::{model::Model, wire};

/// A router on the way back to the client.
fn router(g: &mut Generator, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::from([
            0x20,
            0x01,
            0x0d,
            0xb8,
            0xff,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            g.rng.u8(),
        ])
    } else {
        IpAddr::from([198, 51, 100, g.rng.u8()])
    }
}

/// Type, code and the 4 bytes after the checksum.
fn error_kind(g: &mut Generator, v6: bool) -> (u8, u8, [u8; 4]) {
    if v6 {
        let mtu = *g
            .rng
            .pick(&[1280u32, 1279, 1500, 1400, 576, 0, 9000, 65535]);
        match g.rng.below(10) {
            0..=2 => (1, g.rng.below(7) as u8, [0; 4]),
            3..=5 => (2, 0, mtu.to_be_bytes()),
            6 | 7 => (3, g.rng.below(2) as u8, [0; 4]),
            _ => (*g.rng.pick(&[4u8, 128, 129, 133, 135, 137, 200]), 0, [0; 4]),
        }
    } else {
        let mtu = *g.rng.pick(&[0u16, 576, 1400, 1480, 68]);
        match g.rng.below(10) {
            0..=4 => (
                3,
                g.rng.below(16) as u8,
                [0, 0, (mtu >> 8) as u8, mtu as u8],
            ),
            5..=7 => (11, g.rng.below(2) as u8, [0; 4]),
            _ => (*g.rng.pick(&[0u8, 4, 5, 12, 13, 8]), 0, [0; 4]),
        }
    }
}

/// The packet a router could not deliver: the backend's answer to a flow
/// of the pool, VIP:port → client:port.
fn quoted(g: &mut Generator, model: &Model, v6: bool) -> (IpAddr, Vec<u8>) {
    let flow = g.flow(model, v6);
    let vip = &model.vips[flow.vip];
    let ends = (vip.addr, flow.client);
    let data = g.rng.bytes_in(0, 40);
    let ports = (flow.dport, flow.sport);
    let (proto, l4) = match (vip.proto, g.rng.below(20)) {
        (_, 0) => (wire::ICMP, g.rng.bytes(8)),
        (wire::TCP, _) => (wire::TCP, wire::tcp(ends, ports, wire::TCP_ACK, &[], &data)),
        _ => (wire::UDP, wire::udp(ends, ports, &data)),
    };
    let mut p = Pkt::new(vip.addr, flow.client, proto, l4);
    if !v6 && g.rng.chance(15) {
        p.v4_options = vec![1; 4 * g.rng.range(1, 10)];
    }
    if !v6 && g.rng.chance(5) {
        p.frag = g.rng.range(1, 100) as u16;
    }
    if v6 && g.rng.chance(5) {
        p.v6_ext.push((60, wire::ext_header(60, 0, 8, &mut |_| 0)));
    }
    (vip.addr, p.build().0)
}

/// An ICMP or ICMPv6 error about a VIP flow.
pub fn error(g: &mut Generator, model: &Model, v6: bool) -> Sample {
    let (vip_addr, mut quote) = quoted(g, model, v6);
    let hdr = if v6 {
        40
    } else {
        usize::from(quote[0] & 0x0f) * 4
    };
    let cut = match g.rng.below(10) {
        0..=4 => hdr + 8,
        5 | 6 => quote.len(),
        _ => g.rng.range(0, hdr + 8),
    };
    quote.truncate(cut.min(quote.len()));
    let dst = match g.rng.below(20) {
        0 => other_address(g, v6),
        1 | 2 => *g.rng.pick(&model.vip_addrs(v6)),
        _ => vip_addr,
    };
    let src = router(g, v6);
    let (kind, code, rest) = error_kind(g, v6);
    let msg = if v6 {
        wire::icmp6((src, dst), kind, code, rest, &quote)
    } else {
        wire::icmp4(kind, code, rest, &quote)
    };
    let mut p = Pkt::new(src, dst, if v6 { wire::ICMPV6 } else { wire::ICMP }, msg);
    if !v6 && g.rng.chance(10) {
        p.v4_options = vec![1; 4 * g.rng.range(1, 4)];
    }
    if v6 && g.rng.chance(10) {
        p.v6_ext.push((0, wire::ext_header(0, 0, 8, &mut |_| 0)));
    }
    let source = if v6 { Gen::IcmpError6 } else { Gen::IcmpError4 };
    let mut s = g.sample(source, &p);
    if g.rng.chance(25) {
        cut_by_ip_length(g, &mut s, v6);
    }
    s
}

/// Shortens the IP packet of `s` (IP length only) so that it ends inside
/// the ICMP message or its quote; the frame keeps the rest as trailer.
fn cut_by_ip_length(g: &mut Generator, s: &mut Sample, v6: bool) {
    let f = &mut s.frame;
    let l3 = 14;
    if v6 {
        let plen = usize::from(u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]));
        let new = g.rng.below(plen.max(1)) as u16;
        f[l3 + 4..l3 + 6].copy_from_slice(&new.to_be_bytes());
    } else {
        let hlen = usize::from(f[l3] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]));
        let new = g.rng.range(hlen, total.max(hlen)) as u16;
        f[l3 + 2..l3 + 4].copy_from_slice(&new.to_be_bytes());
        wire::fix_ipv4_checksum(&mut f[l3..]);
    }
}

/// Echo requests to VIP addresses and others, and other ICMP types.
pub fn echo(g: &mut Generator, model: &Model) -> Sample {
    let v6 = g.rng.chance(50);
    let src = g.client(v6);
    let dst = if g.rng.chance(75) {
        *g.rng.pick(&model.vip_addrs(v6))
    } else {
        other_address(g, v6)
    };
    let request = if v6 { 128 } else { 8 };
    let kind = if g.rng.chance(80) {
        request
    } else {
        *g.rng.pick(&[0u8, 13, 15, 17, 129, 133, 134, 135, 136])
    };
    let code = if g.rng.chance(90) { 0 } else { g.rng.u8() };
    let rest = g.rng.u32().to_be_bytes();
    let n = g.rng.length(1400);
    let data = g.rng.bytes(n);
    let mut msg = if v6 {
        wire::icmp6((src, dst), kind, code, rest, &data)
    } else {
        wire::icmp4(kind, code, rest, &data)
    };
    if g.rng.chance(10) {
        msg[2] ^= 0x5a; // a wrong checksum: the reply must stay as wrong
    }
    let mut p = Pkt::new(src, dst, if v6 { wire::ICMPV6 } else { wire::ICMP }, msg);
    if !v6 && g.rng.chance(10) {
        p.v4_options = vec![1; 8];
    }
    g.sample(Gen::Echo, &p)
}

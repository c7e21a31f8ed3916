//! The oracle's reading of ICMP and ICMPv6 to VIP addresses: echo
//! requests are answered (when enabled), errors about a VIP flow go to that
//! flow's VIP, named by the *reversed* quoted 5-tuple, provided the quote
//! (IP header and ports) lies inside the IP packet and comes from the VIP
//! address the error is sent to; everything else is the kernel's.

use std::net::IpAddr;

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice};

use super::{Expect, Flow, Forward, Kinds, Reply, parse::Ip};
use crate::fuzz::model::Model;

/// The IPv6 minimum MTU: smaller "packet too big" values are dropped.
const IPV6_MIN_MTU: u32 = 1280;

/// The verdict on the ICMP message at `offset` of the IP packet.
pub fn verdict(model: &Model, ip: &Ip, offset: usize) -> Expect {
    if !model.is_vip_addr(ip.dst) {
        return Expect::pass("ICMP to no VIP address");
    }
    // The 8-byte header only: etherparse's ICMP slices also check type
    // specific lengths (timestamps), which the README does not.
    let msg = &ip.packet[offset..];
    if msg.len() < 8 {
        return Expect::pass("ICMP header cut by the IP length");
    }
    let (kind, rest, body) = (msg[0], [msg[4], msg[5], msg[6], msg[7]], &msg[8..]);
    let echo = if ip.v6() { 128 } else { 8 };
    if kind == echo {
        return echo_request(model, ip, offset);
    }
    let is_error = if ip.v6() {
        matches!(kind, 1..=3)
    } else {
        matches!(kind, 3 | 11)
    };
    if !is_error {
        return Expect::pass("ICMP other than echo requests and errors");
    }
    let quoted = if ip.v6() {
        quote_v6(ip, body)
    } else {
        quote_v4(ip, body)
    };
    let routed = quoted.and_then(|flow| {
        model
            .lookup(flow.dst, flow.dport, flow.proto)
            .map(|v| (v, flow))
    });
    if ip.v6() && kind == 2 && u32::from_be_bytes(rest) < IPV6_MIN_MTU {
        let e = Expect::drop("ICMPv6 packet too big below 1280");
        // Only about VIP flows, or about anything sent to a VIP address?
        return if routed.is_some() {
            e
        } else {
            e.or(Expect::pass(
                "ICMPv6 packet too big below 1280, about no VIP flow",
            ))
        };
    }
    let Some((v, flow)) = routed else {
        return Expect::pass("ICMP error whose quote names no VIP flow (or is cut short)");
    };
    if !model.vips[v].has_backends() {
        return Expect::drop("ICMP error about a flow of a VIP without backends");
    }
    let mut e = Expect::only(Kinds::FORWARD, "ICMP error about a VIP flow");
    e.forward = Some(Forward {
        vip: v,
        flow,
        inner: ip.start..ip.start + ip.packet.len(),
        source: ip.src,
        icmp_error: true,
        syn: false,
    });
    e
}

fn echo_request(model: &Model, ip: &Ip, offset: usize) -> Expect {
    if !model.settings.icmp_echo {
        return Expect::pass("echo request to a VIP address, replies off");
    }
    let mut e = Expect::only(Kinds::REPLY, "echo request to a VIP address");
    e.reply = Some(Reply::Echo {
        icmp: ip.start + offset,
        ip_end: ip.start + ip.packet.len(),
    });
    e
}

/// The flow an IPv4 error quotes, client → VIP: a first (or only) TCP or
/// UDP fragment from the address the error is sent to, its header and
/// ports inside `quote` (which ends with the IP packet).
fn quote_v4(ip: &Ip, quote: &[u8]) -> Option<Flow> {
    let h = Ipv4HeaderSlice::from_slice(quote).ok()?;
    let hlen = usize::from(h.ihl()) * 4;
    let proto = h.protocol().0;
    if quote.len() < hlen + 4
        || IpAddr::from(h.source_addr()) != ip.dst
        || h.fragments_offset().value() != 0
        || !matches!(proto, 6 | 17)
    {
        return None;
    }
    Some(reversed(
        h.source_addr().into(),
        h.destination_addr().into(),
        proto,
        &quote[hlen..hlen + 4],
    ))
}

/// The flow an IPv6 error quotes: TCP or UDP right after the fixed header.
fn quote_v6(ip: &Ip, quote: &[u8]) -> Option<Flow> {
    let h = Ipv6HeaderSlice::from_slice(quote).ok()?;
    let proto = h.next_header().0;
    if quote.len() < 44 || IpAddr::from(h.source_addr()) != ip.dst || !matches!(proto, 6 | 17) {
        return None;
    }
    Some(reversed(
        h.source_addr().into(),
        h.destination_addr().into(),
        proto,
        &quote[40..44],
    ))
}

/// The client → VIP flow of a quoted VIP → client packet.
fn reversed(vip: IpAddr, client: IpAddr, proto: u8, ports: &[u8]) -> Flow {
    Flow {
        src: client,
        dst: vip,
        proto,
        sport: u16::from_be_bytes([ports[2], ports[3]]),
        dport: u16::from_be_bytes([ports[0], ports[1]]),
        three_tuple: false,
    }
}

//! The invariants, checked for one frame from the program's action, its
//! output and the counters against the oracle's [`Expect`]:
//!
//! 1. a frame the oracle reads as no VIP's, malformed or beyond the
//!    README's limits is never `XDP_TX`, except as a reply the README
//!    describes (checked by [`super::reply`]);
//! 2. a passed frame is byte-identical to the input;
//! 3. a tunnelled frame is well formed and goes to a backend of the VIP
//!    the packet (or the flow an ICMP error quotes) is for;
//! 4. exactly one outcome counter moves, by one packet and the frame's
//!    bytes, and its kind agrees with the action;
//! 5. (in [`super::flows`]) one flow, one backend;
//! 6. the outcome's kind is one the README prescribes for the frame;
//! 7. a datagram to a QUIC VIP whose connection ID names a usable server
//!    goes to exactly that backend, whether or not a connection-table
//!    entry claims its tuple (a tuple outlives its connection); one that
//!    names none is a table hit or hashed with the one QUIC event its
//!    header calls for; no other frame moves a QUIC counter.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice};
use lb::config::Encap;
use lb_common::{Counter, CounterValue, counters::Kind};

use super::{
    csum,
    model::{GW_MAC, Model, Settings},
    oracle::{Expect, Forward, Kinds, quic::Route},
    reply,
    target::{XDP_DROP, XDP_PASS, XDP_TX},
    wire,
};

/// A broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: u8,
    /// Short and stable: two violations with the same invariant and code
    /// are the same bug (the reproducer shrinker keeps it).
    pub code: &'static str,
    pub detail: String,
    /// What makes two violations the same (the code, and for invariants 1
    /// and 6 the outcome's kind and the oracle's reading; not the counter,
    /// which a re-run may change from a new flow to a connection-table
    /// hit): the shrinker keeps a candidate only if its signature is
    /// unchanged.
    pub signature: String,
}

impl Violation {
    pub fn new(invariant: u8, code: &'static str, detail: impl Into<String>) -> Violation {
        Violation {
            invariant,
            code,
            detail: detail.into(),
            signature: code.to_string(),
        }
    }

    fn signed(mut self, signature: String) -> Violation {
        self.signature = signature;
        self
    }

    pub fn same_as(&self, other: &Violation) -> bool {
        self.invariant == other.invariant && self.signature == other.signature
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant {} ({}): {}",
            self.invariant, self.code, self.detail
        )
    }
}

/// What a judged frame did that later checks (invariant 5) and the
/// report need.
#[derive(Clone, Copy, Debug, Default)]
pub struct Judged {
    pub sent: Option<Sent>,
    /// A known deviation of lb's from the README or an RFC, tolerated
    /// (counted, with a reproducer) so that it does not hide other
    /// findings. None is known today.
    pub deviation: Option<&'static str>,
}

/// Where a tunnelled frame went.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub backend: IpAddr,
    pub weight: u32,
    /// The GUE source port, for GUE tunnels.
    pub gue_sport: Option<u16>,
}

pub fn action_name(action: u32) -> &'static str {
    match action {
        0 => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        4 => "XDP_REDIRECT",
        _ => "unknown action",
    }
}

/// Invariant 4: the one outcome counter that moved (and the events).
pub fn outcome(
    before: &[CounterValue],
    after: &[CounterValue],
    len: usize,
    action: u32,
    malformed_drop: bool,
) -> Result<Counter, Violation> {
    let mut outcomes = Vec::new();
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if a == b {
            continue;
        }
        let Some(&c) = Counter::ALL.get(i) else {
            return Err(Violation::new(
                4,
                "unused-slot",
                format!("unused counter slot {i} moved"),
            ));
        };
        let (p, n) = (
            a.packets.wrapping_sub(b.packets),
            a.bytes.wrapping_sub(b.bytes),
        );
        if p != 1 || n != len as u64 {
            let what = format!(
                "{} moved by {p} packets and {n} bytes, not 1 and {len}",
                c.name()
            );
            return Err(Violation::new(4, "counter-delta", what));
        }
        match c.kind() {
            Kind::Event => {}
            Kind::Retired => {
                return Err(Violation::new(
                    4,
                    "retired",
                    format!("retired {} moved", c.name()),
                ));
            }
            _ => outcomes.push(c),
        }
    }
    let [c] = outcomes[..] else {
        let names: Vec<&str> = outcomes.iter().map(|c| c.name()).collect();
        let what = format!("{} outcome counters moved: {names:?}", outcomes.len());
        return Err(Violation::new(4, "outcome-count", what));
    };
    let want = match c.kind() {
        Kind::Forward | Kind::Reply => XDP_TX,
        Kind::Pass => XDP_PASS,
        Kind::Drop => XDP_DROP,
        _ if malformed_drop => XDP_DROP,
        _ => XDP_PASS,
    };
    if action != want {
        let what = format!(
            "{} ({:?}) with {}, not {}",
            c.name(),
            c.kind(),
            action_name(action),
            action_name(want)
        );
        return Err(Violation::new(4, "kind-action", what));
    }
    Ok(c)
}

/// Invariants 1, 2, 3 and 6 for a frame the program ran in one buffer.
pub fn frame(
    model: &Model,
    input: &[u8],
    action: u32,
    out: &[u8],
    counter: Counter,
    expect: &Expect,
) -> Result<Judged, Violation> {
    let mut judged = Judged::default();
    if action == XDP_TX {
        let read = || format!("the oracle reads {}", expect.reading());
        let sign = |code: &str| format!("{code} {:?} / {}", counter.kind(), expect.why);
        match (counter.kind(), &expect.forward, &expect.reply) {
            (Kind::Forward, Some(fwd), _) => {
                judged.sent = Some(tunnel(model, input, out, fwd, expect.l2)?);
            }
            (Kind::Forward, None, _) => {
                let what = format!("forwarded ({}) but {}", counter.name(), read());
                return Err(Violation::new(1, "forwarded", what).signed(sign("forwarded")));
            }
            (_, _, Some(r)) => judged.deviation = reply::check(input, out, r, expect.l2)?,
            (_, _, None) => {
                let what = format!("answered ({}) but {}", counter.name(), read());
                return Err(Violation::new(1, "replied", what).signed(sign("replied")));
            }
        }
    }
    if action == XDP_PASS && out != input {
        let what = format!(
            "passed ({}) with {} bytes changed",
            counter.name(),
            diff(input, out)
        );
        return Err(Violation::new(2, "pass-changed", what));
    }
    if !expect.kinds.contains(Kinds::of(counter.kind())) {
        let what = format!(
            "{} ({:?}), but the oracle reads {} and expects {}",
            counter.name(),
            counter.kind(),
            expect.why,
            expect.kinds
        );
        let sig = format!("{:?} / {} / {}", counter.kind(), expect.why, expect.kinds);
        return Err(Violation::new(6, "outcome-kind", what).signed(sig));
    }
    Ok(judged)
}

/// Invariant 7 (see the module doc): QUIC by connection ID, judged by
/// the outcome counter, the QUIC events that moved and where the frame
/// went (`sent`). A datagram whose server ID names a usable backend
/// reaches exactly that backend, whatever the hash or the connection
/// table would say; a connection-table hit (`fwd_conntrack_hit`) is right
/// only for the others, and moves no QUIC event.
pub fn quic(
    before: &[CounterValue],
    after: &[CounterValue],
    counter: Counter,
    expect: &Expect,
    sent: Option<Sent>,
) -> Result<(), Violation> {
    let moved = |c: &Counter| before.get(*c as usize) != after.get(*c as usize);
    let events: Vec<Counter> = [Counter::QuicLongHeader, Counter::QuicUnroutable]
        .into_iter()
        .filter(moved)
        .collect();
    let outcome = || {
        let names: Vec<&str> = events.iter().map(|c| c.name()).collect();
        format!("{} with QUIC events {names:?}", counter.name())
    };
    let Some(q) = &expect.quic else {
        if counter == Counter::FwdQuicCid || !events.is_empty() {
            let what = format!("{}, but the frame is no datagram to a QUIC VIP", outcome());
            return Err(Violation::new(7, "quic-not-quic", what));
        }
        return Ok(());
    };
    let fail = |code: &'static str, what: String| {
        let sig = format!("{code} / {}", q.why);
        Err(Violation::new(7, code, what).signed(sig))
    };
    // Outcomes only a hashed datagram without a connection-table entry has.
    let hashed = matches!(
        counter,
        Counter::FwdMaglev
            | Counter::FwdMaglevNoConntrack
            | Counter::FwdHandshake
            | Counter::FwdSecondChance
            | Counter::DropNoBackend
    );
    let hashed_with = |event: Counter| {
        let ok = match counter {
            Counter::FwdQuicCid => false,
            Counter::FwdConntrack => events.is_empty(),
            _ if hashed => events == [event],
            _ => events.is_empty() || events == [event],
        };
        if ok {
            return Ok(());
        }
        let what = format!(
            "{}, but {}: hashed, with {}, unless a connection-table entry claims it",
            outcome(),
            q.why,
            event.name()
        );
        fail("quic-hashed", what)
    };
    match q.route {
        Route::Server(backend) => {
            if hashed || counter == Counter::FwdConntrack || !events.is_empty() {
                let what = format!("{}, but {}: {backend} takes it", outcome(), q.why);
                return fail("quic-not-by-cid", what);
            }
            let to = sent.map(|s| s.backend);
            if counter == Counter::FwdQuicCid && to != Some(backend) {
                let what = format!("fwd_quic_cid to {to:?}, but {}: {backend}", q.why);
                return fail("quic-wrong-server", what);
            }
            Ok(())
        }
        Route::LongHeader => hashed_with(Counter::QuicLongHeader),
        Route::Unroutable => hashed_with(Counter::QuicUnroutable),
    }
}

/// Bytes that differ (and the length difference).
fn diff(a: &[u8], b: &[u8]) -> String {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    format!("{n} (lengths {} and {})", a.len(), b.len())
}

fn fail<T>(code: &'static str, what: String) -> Result<T, Violation> {
    Err(Violation::new(3, code, what))
}

/// Invariant 3: `out` is the input's IP packet in a tunnel to a backend of
/// `fwd.vip`.
fn tunnel(
    model: &Model,
    input: &[u8],
    out: &[u8],
    fwd: &Forward,
    l2: usize,
) -> Result<Sent, Violation> {
    let vip = &model.vips[fwd.vip];
    ethernet(input, out, l2)?;
    // A second-chance VIP of these tunnels sends UDP only with a list.
    let plain_udp = vip.encap == Encap::Gue;
    if vip.second_chance && !plain_udp && outer_protocol(out, l2) == Some(wire::UDP) {
        return listed(model, input, out, fwd, l2);
    }
    let inner = &input[fwd.inner.clone()];
    let tun_len = match vip.encap {
        Encap::Ipip => 0,
        Encap::Gre => 4,
        Encap::Gue => 8,
    };
    let (payload, next) = (inner.len() + tun_len, next_header(vip.encap, inner));
    let (dst, src, ip_len) = match u16::from_be_bytes([out[l2 - 2], out[l2 - 1]]) {
        0x0800 => outer_v4(out, l2, payload, next)?,
        0x86dd => outer_v6(out, l2, payload, next)?,
        t => return fail("ethertype", format!("outer ethertype {t:#06x}")),
    };
    let weight = owner(model, fwd, dst)?;
    outer_source_is(model, fwd, dst.is_ipv6(), src)?;
    let at = l2 + ip_len;
    let gue_sport = tunnel_header(model, out, at, vip.encap, inner)?;
    inner_and_trailer(input, out, fwd, at + tun_len)?;
    Ok(Sent {
        backend: dst,
        weight,
        gue_sport,
    })
}

/// The outer source is the one [`outer_source`] gives for the packet.
fn outer_source_is(model: &Model, fwd: &Forward, v6: bool, src: IpAddr) -> Result<(), Violation> {
    let want = outer_source(&model.settings, v6, fwd.source);
    if src != want {
        return fail(
            "outer-source",
            format!("outer source {src}, expected {want}"),
        );
    }
    Ok(())
}

/// The input's IP packet follows the tunnel headers at `start` untouched,
/// and whatever follows it is the input's Ethernet padding.
fn inner_and_trailer(
    input: &[u8],
    out: &[u8],
    fwd: &Forward,
    start: usize,
) -> Result<(), Violation> {
    let inner = &input[fwd.inner.clone()];
    if out.len() < start + inner.len() || out[start..start + inner.len()] != *inner {
        let what = "inner packet differs from the input's IP packet";
        return fail("inner", what.into());
    }
    let trailer = &out[start + inner.len()..];
    if !trailer.is_empty() && trailer != &input[fwd.inner.end..] {
        let what = "bytes after the tunnel packet are not the input's padding";
        return fail("trailer", what.into());
    }
    Ok(())
}

/// The outer IP header's protocol (`None`: neither IPv4 nor IPv6). The
/// frame holds at least `l2 + 40` bytes ([`ethernet`]).
fn outer_protocol(out: &[u8], l2: usize) -> Option<u8> {
    match u16::from_be_bytes([out[l2 - 2], out[l2 - 1]]) {
        0x0800 => Some(out[l2 + 9]),
        0x86dd => Some(out[l2 + 6]),
        _ => None,
    }
}

/// A second-chance frame, read by the layout ARCHITECTURE.md gives
/// ("Wire format"), not by lb's code: the outer IP header (protocol 17),
/// UDP to the GUE port with checksum 0, GUE variant 0 (C = 0, `hlen` the
/// words of private data, the inner protocol, flags 0), lb's header (type
/// 0x4C42, `next` 0, count 1–3), the alternates (of the outer family, each
/// another backend of the same VIP, none twice), then the inner packet.
fn listed(
    model: &Model,
    input: &[u8],
    out: &[u8],
    fwd: &Forward,
    l2: usize,
) -> Result<Sent, Violation> {
    let inner = &input[fwd.inner.clone()];
    let v6 = u16::from_be_bytes([out[l2 - 2], out[l2 - 1]]) == 0x86dd;
    let at = l2 + if v6 { 40 } else { 20 };
    if out.len() < at + 16 {
        return fail("sc-short", format!("listed frame of {} bytes", out.len()));
    }
    let word = |i: usize| u16::from_be_bytes([out[at + i], out[at + i + 1]]);
    let count = usize::from(out[at + 15]);
    let size = if v6 { 16 } else { 4 };
    let list = 4 + count * size;
    let payload = 8 + 4 + list + inner.len();
    let (dst, src, _) = if v6 {
        outer_v6(out, l2, payload, wire::UDP)?
    } else {
        outer_v4(out, l2, payload, wire::UDP)?
    };
    let weight = owner(model, fwd, dst)?;
    outer_source_is(model, fwd, v6, src)?;
    let inner_proto = if inner[0] >> 4 == 6 { 41 } else { 4 };
    let problems = [
        (word(2) != model.settings.gue_port, "not to the GUE port"),
        (usize::from(word(4)) != payload, "wrong UDP length"),
        (word(6) != 0, "UDP checksum not 0"),
        (out[at + 8] >> 5 != 0, "not GUE variant 0 with C = 0"),
        (
            usize::from(out[at + 8] & 0x1f) * 4 != list,
            "hlen does not match the count",
        ),
        (out[at + 9] != inner_proto, "wrong inner protocol"),
        (word(10) != 0, "GUE flags not 0"),
        (word(12) != 0x4c42, "not lb's list type"),
        (out[at + 14] != 0, "next not 0"),
        (!(1..=3).contains(&count), "count not 1-3"),
        (out.len() < at + 12 + list + inner.len(), "cut short"),
    ];
    if let Some((_, what)) = problems.iter().find(|(bad, _)| *bad) {
        let head = &out[at..(at + 16).min(out.len())];
        return fail(
            "sc-header",
            format!("second-chance header {head:02x?}: {what}"),
        );
    }
    let mut seen = vec![dst];
    for i in 0..count {
        let a = &out[at + 16 + i * size..at + 16 + (i + 1) * size];
        let alt = if v6 {
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a).expect("16 bytes")))
        } else {
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a).expect("4 bytes")))
        };
        owner(model, fwd, alt)?;
        if seen.contains(&alt) {
            let what = format!("alternate {alt} listed twice or is the backend itself");
            return fail("sc-alternate", what);
        }
        seen.push(alt);
    }
    inner_and_trailer(input, out, fwd, at + 12 + list)?;
    Ok(Sent {
        backend: dst,
        weight,
        gue_sport: Some(word(0)),
    })
}

/// The Ethernet header of a tunnelled frame: to the gateway, from our own
/// MAC (the input's destination), the VLAN tag kept.
fn ethernet(input: &[u8], out: &[u8], l2: usize) -> Result<(), Violation> {
    if out.len() < l2 + 40 {
        return fail("short", format!("tunnelled frame of {} bytes", out.len()));
    }
    if out[0..6] != GW_MAC || out[6..12] != input[0..6] {
        return fail(
            "mac",
            "not readdressed from our MAC to the gateway's".into(),
        );
    }
    if l2 == 18 && out[12..16] != input[12..16] {
        return fail("vlan", "VLAN tag not kept".into());
    }
    Ok(())
}

/// The weight of backend `dst`, which must be one of `fwd.vip`'s, and up.
fn owner(model: &Model, fwd: &Forward, dst: IpAddr) -> Result<u32, Violation> {
    let Some((owner, backend)) = model.backend_at(dst) else {
        return fail(
            "not-a-backend",
            format!("tunnelled to {dst}, no backend of any VIP"),
        );
    };
    if owner != fwd.vip {
        let (o, v) = (&model.vips[owner], &model.vips[fwd.vip]);
        let what = format!(
            "tunnelled to {dst}, a backend of {} ({}:{}), but the packet is for {} ({}:{}) by {:?}",
            o.name, o.addr, o.port, v.name, v.addr, v.port, fwd.flow
        );
        return fail("wrong-vip", what);
    }
    if !backend.up {
        let v = &model.vips[owner];
        let what = format!("tunnelled to {dst}, a backend of {} that is down", v.name);
        return fail("down-backend", what);
    }
    Ok(backend.weight)
}

/// The outer protocol: GRE 47, UDP 17, else IP-in-IP by the inner family.
fn next_header(encap: Encap, inner: &[u8]) -> u8 {
    match encap {
        Encap::Gre => 47,
        Encap::Gue => 17,
        Encap::Ipip if inner[0] >> 4 == 6 => 41,
        Encap::Ipip => 4,
    }
}

/// Checks the outer IPv4 header; returns (destination, source, header length).
fn outer_v4(
    out: &[u8],
    l2: usize,
    payload: usize,
    next: u8,
) -> Result<(IpAddr, IpAddr, usize), Violation> {
    let Ok(h) = Ipv4HeaderSlice::from_slice(&out[l2..]) else {
        return fail("outer-ipv4", "outer IPv4 header unreadable".into());
    };
    let problems = [
        (h.ihl() != 5, "IHL not 5"),
        (!csum::verifies(h.slice(), 0), "bad header checksum"),
        (
            usize::from(h.total_len()) != 20 + payload,
            "wrong total length",
        ),
        (!h.dont_fragment(), "DF not set"),
        (
            h.more_fragments() || h.fragments_offset().value() != 0,
            "fragmented",
        ),
        (h.ttl() != 64, "TTL not 64"),
        (h.protocol().0 != next, "wrong protocol"),
    ];
    if let Some((_, what)) = problems.iter().find(|(bad, _)| *bad) {
        return fail(
            "outer-ipv4",
            format!(
                "outer IPv4: {what} (protocol {}, length {})",
                h.protocol().0,
                h.total_len()
            ),
        );
    }
    Ok((h.destination_addr().into(), h.source_addr().into(), 20))
}

fn outer_v6(
    out: &[u8],
    l2: usize,
    payload: usize,
    next: u8,
) -> Result<(IpAddr, IpAddr, usize), Violation> {
    let Ok(h) = Ipv6HeaderSlice::from_slice(&out[l2..]) else {
        return fail("outer-ipv6", "outer IPv6 header unreadable".into());
    };
    let problems = [
        (
            usize::from(h.payload_length()) != payload,
            "wrong payload length",
        ),
        (h.next_header().0 != next, "wrong next header"),
        (h.hop_limit() != 64, "hop limit not 64"),
    ];
    if let Some((_, what)) = problems.iter().find(|(bad, _)| *bad) {
        return fail("outer-ipv6", format!("outer IPv6: {what}"));
    }
    Ok((h.destination_addr().into(), h.source_addr().into(), 40))
}

/// Checks the GRE or GUE header at `at`; returns the GUE source port.
fn tunnel_header(
    model: &Model,
    out: &[u8],
    at: usize,
    encap: Encap,
    inner: &[u8],
) -> Result<Option<u16>, Violation> {
    let word = |i: usize| u16::from_be_bytes([out[at + i], out[at + i + 1]]);
    match encap {
        Encap::Ipip => Ok(None),
        Encap::Gre => {
            let proto = if inner[0] >> 4 == 6 { 0x86dd } else { 0x0800 };
            if out.len() < at + 4 || word(0) != 0 || word(2) != proto {
                return fail(
                    "gre",
                    format!("GRE header {:02x?}", &out[at..(at + 4).min(out.len())]),
                );
            }
            Ok(None)
        }
        Encap::Gue => {
            if out.len() < at + 8
                || word(2) != model.settings.gue_port
                || usize::from(word(4)) != 8 + inner.len()
                || word(6) != 0
            {
                let what = format!(
                    "GUE/UDP header {:02x?} (port {}, {} inner bytes)",
                    &out[at..(at + 8).min(out.len())],
                    model.settings.gue_port,
                    inner.len()
                );
                return fail("gue", what);
            }
            Ok(Some(word(0)))
        }
    }
}

/// The outer source: the configured address, its host bits (the low
/// `bits`) taken from the packet's source (its last 32 bits for IPv6).
pub fn outer_source(s: &Settings, v6: bool, source: IpAddr) -> IpAddr {
    let host = match source {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => u32::from_be_bytes(a.octets()[12..16].try_into().expect("4 bytes")),
    };
    let mask = |bits: u8| match bits {
        0 => 0,
        b if b >= 32 => u32::MAX,
        b => (1u32 << b) - 1,
    };
    if v6 {
        let mut o = s.src_v6.octets();
        let m = mask(s.src_v6_host_bits);
        let low = u32::from_be_bytes(o[12..16].try_into().expect("4 bytes"));
        o[12..16].copy_from_slice(&((low & !m) | (host & m)).to_be_bytes());
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        let m = mask(s.src_v4_host_bits);
        IpAddr::V4(Ipv4Addr::from((u32::from(s.src_v4) & !m) | (host & m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::{
        generate::Pkt,
        oracle,
        wire::{self, Eth},
    };

    fn input() -> Vec<u8> {
        let (s, d): (IpAddr, IpAddr) = (
            "192.0.2.1".parse().expect("a"),
            "10.0.0.10".parse().expect("a"),
        );
        let p = Pkt::new(
            s,
            d,
            wire::TCP,
            wire::tcp((s, d), (4000, 80), wire::TCP_SYN, &[], b""),
        );
        Eth::default().frame(wire::ETH_IPV4, &p.build().0)
    }

    /// `payload` under an outer IPv4 header (protocol `proto`, DF, ID 0)
    /// to `backend`, framed from `input`'s destination MAC to the gateway.
    fn outer4(input: &[u8], backend: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut outer = wire::V4::new([10, 255, 0, 1], backend, proto).packet(payload);
        outer[4..6].copy_from_slice(&[0, 0]);
        wire::fix_ipv4_checksum(&mut outer);
        let eth = Eth {
            dst: GW_MAC,
            src: input[0..6].try_into().expect("MAC"),
            tags: Vec::new(),
        };
        eth.frame(wire::ETH_IPV4, &outer)
    }

    /// `input` in IP-in-IP to `backend`, as the README describes it.
    fn tunnelled(input: &[u8], backend: [u8; 4]) -> Vec<u8> {
        outer4(input, backend, 4, &input[14..])
    }

    #[test]
    fn a_tunnel_to_a_backend_of_the_vip_passes_and_to_another_vips_fails() {
        let m = Model::new();
        let input = input();
        let e = oracle::expect(&m, &input);
        let ok = frame(
            &m,
            &input,
            XDP_TX,
            &tunnelled(&input, [10, 1, 1, 2]),
            Counter::FwdMaglev,
            &e,
        )
        .expect("a well-formed tunnel to a backend of tcp4");
        assert_eq!(
            ok.sent.expect("sent").backend,
            "10.1.1.2".parse::<IpAddr>().expect("a")
        );
        // 10.1.2.x are udp4's backends.
        let wrong = frame(
            &m,
            &input,
            XDP_TX,
            &tunnelled(&input, [10, 1, 2, 1]),
            Counter::FwdMaglev,
            &e,
        );
        assert_eq!(wrong.expect_err("wrong VIP").code, "wrong-vip");
        let mut bad_ttl = tunnelled(&input, [10, 1, 1, 2]);
        bad_ttl[22] = 63;
        wire::fix_ipv4_checksum(&mut bad_ttl[14..]);
        let bad = frame(&m, &input, XDP_TX, &bad_ttl, Counter::FwdMaglev, &e);
        assert_eq!(bad.expect_err("TTL").code, "outer-ipv4");
        let passed = frame(&m, &input, XDP_PASS, &input, Counter::PassNotVip, &e);
        assert_eq!(passed.expect_err("a VIP packet passed").invariant, 6);
    }

    /// `input` (an IPv4 packet) as a second-chance frame to `backend`
    /// listing `alts`, laid out by hand from ARCHITECTURE.md.
    fn listed_frame(m: &Model, input: &[u8], backend: Ipv4Addr, alts: &[Ipv4Addr]) -> Vec<u8> {
        let inner = &input[14..];
        let mut udp = Vec::new();
        let len = 8 + 4 + 4 + 4 * alts.len() + inner.len();
        udp.extend_from_slice(&0xc123u16.to_be_bytes());
        udp.extend_from_slice(&m.settings.gue_port.to_be_bytes());
        udp.extend_from_slice(&(len as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(&[1 + alts.len() as u8, 4, 0, 0]);
        udp.extend_from_slice(&[0x4c, 0x42, 0, alts.len() as u8]);
        for a in alts {
            udp.extend_from_slice(&a.octets());
        }
        udp.extend_from_slice(inner);
        outer4(input, backend.octets(), wire::UDP, &udp)
    }

    #[test]
    fn a_list_of_the_vips_other_backends_passes_and_anything_else_fails() {
        let m = Model::new();
        let sc = m.vips.iter().position(|v| v.name == "sc4").expect("sc4");
        let b: Vec<Ipv4Addr> = m.vips[sc]
            .backends
            .iter()
            .map(|b| match b.addr {
                IpAddr::V4(a) => a,
                IpAddr::V6(_) => panic!("sc4 has IPv4 backends"),
            })
            .collect();
        let (s, d): (IpAddr, IpAddr) = ("192.0.2.1".parse().expect("a"), m.vips[sc].addr);
        let p = Pkt::new(
            s,
            d,
            wire::TCP,
            wire::tcp((s, d), (4000, 80), wire::TCP_ACK, &[], b"data"),
        );
        let input = Eth::default().frame(wire::ETH_IPV4, &p.build().0);
        let e = oracle::expect(&m, &input);
        let run = |out: &[u8]| frame(&m, &input, XDP_TX, out, Counter::FwdSecondChance, &e);
        let ok = run(&listed_frame(&m, &input, b[0], &[b[1], b[2]])).expect("a good list");
        assert_eq!(ok.sent.expect("sent").backend, IpAddr::V4(b[0]));
        let code = |out: Vec<u8>| run(&out).expect_err("a bad list").code;
        // The backend itself, twice the same, another VIP's backend.
        assert_eq!(
            code(listed_frame(&m, &input, b[0], &[b[0]])),
            "sc-alternate"
        );
        assert_eq!(
            code(listed_frame(&m, &input, b[0], &[b[1], b[1]])),
            "sc-alternate"
        );
        let other = Ipv4Addr::new(10, 1, 1, 2);
        assert_eq!(code(listed_frame(&m, &input, b[0], &[other])), "wrong-vip");
        // A header byte off: the type, `next`, the count.
        for (at, value) in [(14 + 20 + 12, 0x47), (14 + 20 + 14, 1), (14 + 20 + 15, 4)] {
            let mut f = listed_frame(&m, &input, b[0], &[b[1]]);
            f[at] = value;
            assert!(run(&f).is_err(), "byte {at} = {value}");
        }
    }

    /// A QUIC datagram to quic4 (2-octet server IDs, configuration id 1,
    /// backend 0's ID `0102`) with `first` as its first byte and
    /// `sid` as its server ID, and the oracle's reading.
    fn quic_frame(sid: [u8; 2], first: u8) -> (Model, Expect) {
        let (mut m, q) = Model::with_quic4(1);
        for (i, b) in m.vips[q].backends.iter_mut().enumerate() {
            (b.up, b.weight, b.server_id) = (true, 1, Some(vec![1, 2 + i as u8]));
        }
        let (s, d): (IpAddr, IpAddr) = ("192.0.2.1".parse().expect("a"), m.vips[q].addr);
        let mut payload = [0u8; 30];
        payload[..4].copy_from_slice(&[first, 1 << 5, sid[0], sid[1]]);
        let p = Pkt::new(s, d, wire::UDP, wire::udp((s, d), (4000, 443), &payload));
        let e = oracle::expect(&m, &Eth::default().frame(wire::ETH_IPV4, &p.build().0));
        (m, e)
    }

    #[test]
    fn a_quic_datagram_goes_by_its_id_also_when_the_table_claims_it() {
        let slots = lb_common::counters::COUNTER_SLOTS as usize;
        let before = vec![CounterValue::default(); slots];
        let with = |events: &[Counter]| {
            let mut after = before.clone();
            for e in events {
                after[*e as usize].packets += 1;
            }
            after
        };
        let (m, e) = quic_frame([1, 2], 0x41);
        let server = m
            .vips
            .iter()
            .find(|v| v.name == "quic4")
            .expect("quic4")
            .backends[0]
            .addr;
        let other = "10.1.99.1".parse().expect("a");
        let sent = |backend| {
            Some(Sent {
                backend,
                weight: 1,
                gue_sport: None,
            })
        };
        let none = with(&[]);
        let code = |r: Result<(), Violation>| r.expect_err("a violation").code;
        quic(&before, &none, Counter::FwdQuicCid, &e, sent(server)).expect("its server");
        let hit = quic(&before, &none, Counter::FwdConntrack, &e, sent(other));
        assert_eq!(code(hit), "quic-not-by-cid", "the ID outranks the table");
        let wrong = quic(&before, &none, Counter::FwdQuicCid, &e, sent(other));
        assert_eq!(code(wrong), "quic-wrong-server");
        let hashed = quic(&before, &none, Counter::FwdMaglev, &e, sent(other));
        assert_eq!(code(hashed), "quic-not-by-cid");
        let counted = with(&[Counter::QuicUnroutable]);
        let counted = quic(&before, &counted, Counter::FwdConntrack, &e, sent(other));
        assert_eq!(code(counted), "quic-not-by-cid");
        // Unknown server ID 0109: hashed, with the event, or a table hit.
        let (_, e) = quic_frame([1, 9], 0x41);
        let unroutable = with(&[Counter::QuicUnroutable]);
        quic(&before, &unroutable, Counter::FwdMaglev, &e, sent(other)).expect("hashed");
        quic(&before, &none, Counter::FwdConntrack, &e, sent(other)).expect("a hit");
        for (after, c) in [
            (&none, Counter::FwdMaglev),
            (&with(&[Counter::QuicLongHeader]), Counter::FwdMaglev),
            (&unroutable, Counter::FwdConntrack),
            (&none, Counter::FwdQuicCid),
        ] {
            assert_eq!(
                code(quic(&before, after, c, &e, sent(other))),
                "quic-hashed"
            );
        }
        // A long header names its event; a plain UDP VIP moves none.
        let (_, e) = quic_frame([1, 2], 0xc1);
        let long = with(&[Counter::QuicLongHeader]);
        quic(&before, &long, Counter::FwdMaglev, &e, sent(other)).expect("hashed");
        let plain = oracle::expect(&m, &input());
        let moved = quic(&before, &long, Counter::FwdMaglev, &plain, sent(other));
        assert_eq!(code(moved), "quic-not-quic");
    }

    #[test]
    fn exactly_one_outcome_counter_moves_with_the_action_of_its_kind() {
        let slots = lb_common::counters::COUNTER_SLOTS as usize;
        let before = vec![CounterValue::default(); slots];
        let mut after = before.clone();
        let bump = |v: &mut Vec<CounterValue>, c: Counter| {
            v[c as usize] += CounterValue {
                packets: 1,
                bytes: 60,
            };
        };
        bump(&mut after, Counter::FwdMaglev);
        bump(&mut after, Counter::CtEvicted);
        assert_eq!(
            outcome(&before, &after, 60, XDP_TX, false).expect("one"),
            Counter::FwdMaglev
        );
        assert_eq!(
            outcome(&before, &after, 60, XDP_PASS, false)
                .expect_err("")
                .code,
            "kind-action"
        );
        assert_eq!(
            outcome(&before, &after, 61, XDP_TX, false)
                .expect_err("")
                .code,
            "counter-delta"
        );
        bump(&mut after, Counter::PassNotVip);
        assert_eq!(
            outcome(&before, &after, 60, XDP_TX, false)
                .expect_err("")
                .code,
            "outcome-count"
        );
        let mut malformed = before.clone();
        bump(&mut malformed, Counter::MalformedVlan);
        assert!(outcome(&before, &malformed, 60, XDP_DROP, true).is_ok());
        assert!(outcome(&before, &malformed, 60, XDP_DROP, false).is_err());
    }
}

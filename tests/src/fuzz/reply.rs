//! The balancer's own ICMP replies, checked byte by byte against the
//! request: an echo reply is the request turned around (MACs and
//! addresses swapped, type changed, TTL 64, everything else kept, the
//! checksums as valid as the request's); "fragmentation needed" and
//! "packet too big" go from the VIP back to the client, quote the start of
//! the packet, announce the MTU and carry valid checksums. Checksums are
//! recomputed here ([`super::csum`]), never taken from the program.

use std::net::IpAddr;

use super::{check::Violation, csum, oracle::Reply};

fn fail<T>(code: &'static str, what: impl Into<String>) -> Result<T, Violation> {
    Err(Violation::new(1, code, what))
}

/// Checks `out` as the reply `r` to `input` (with `l2` bytes of Ethernet);
/// `Ok(Some(_))` names a known deviation.
pub fn check(
    input: &[u8],
    out: &[u8],
    r: &Reply,
    l2: usize,
) -> Result<Option<&'static str>, Violation> {
    let least = match r {
        Reply::Echo { icmp, .. } => icmp + 8,
        Reply::TooBig { ip, .. } => l2 + 8 + if input[ip.start] >> 4 == 6 { 40 } else { 20 },
    };
    if out.len() < least {
        return fail("reply-short", format!("reply of {} bytes", out.len()));
    }
    if out[0..6] != input[6..12] || out[6..12] != input[0..6] || out[12..l2] != input[12..l2] {
        return fail(
            "reply-l2",
            "reply not sent back with MACs swapped, tag and ethertype kept",
        );
    }
    match r {
        Reply::Echo { icmp, ip_end } => echo(input, out, l2, *icmp, *ip_end),
        Reply::TooBig { ip, mtu } => too_big(&input[ip.clone()], &out[l2..], *mtu).map(|()| None),
    }
}

fn addrs(packet: &[u8]) -> (IpAddr, IpAddr) {
    if packet[0] >> 4 == 4 {
        let a = |i: usize| IpAddr::from(<[u8; 4]>::try_from(&packet[i..i + 4]).expect("4"));
        (a(12), a(16))
    } else {
        let a = |i: usize| IpAddr::from(<[u8; 16]>::try_from(&packet[i..i + 16]).expect("16"));
        (a(8), a(24))
    }
}

/// Whether the ICMP message `msg` (of an IP packet from `src` to `dst`)
/// has a valid checksum.
fn icmp_ok(msg: &[u8], src: IpAddr, dst: IpAddr) -> bool {
    let seed = match src {
        IpAddr::V4(_) => 0,
        IpAddr::V6(_) => csum::pseudo(src, dst, 58, msg.len()),
    };
    csum::verifies(msg, seed)
}

fn echo(
    input: &[u8],
    out: &[u8],
    l3: usize,
    icmp: usize,
    ip_end: usize,
) -> Result<Option<&'static str>, Violation> {
    if out.len() != input.len() {
        return fail(
            "echo",
            format!("echo reply of {} bytes to {}", out.len(), input.len()),
        );
    }
    let (req, rep) = (&input[l3..ip_end], &out[l3..ip_end]);
    let v6 = req[0] >> 4 == 6;
    let (src, dst) = addrs(req);
    if addrs(rep) != (dst, src) {
        return fail("echo", "addresses not swapped");
    }
    // Unchanged: everything but TTL, header checksum and addresses (IPv4);
    // but hop limit and addresses (IPv6); and the ICMP type and checksum.
    let same = |a: usize, b: usize| req[a..b] == rep[a..b];
    let fixed = if v6 {
        same(0, 7)
    } else {
        same(0, 8) && same(9, 10) && same(20, icmp - l3)
    };
    let ttl = if v6 { rep[7] } else { rep[8] };
    let i = icmp - l3;
    let want_type = if v6 { 129 } else { 0 };
    if !fixed || ttl != 64 || rep[i] != want_type || !same(i + 1, i + 2) || !same(i + 4, rep.len())
    {
        return fail(
            "echo",
            "echo reply differs from the request beyond TTL, addresses and type",
        );
    }
    if v6 && !same(40, i) {
        return fail("echo", "extension headers changed");
    }
    if out[ip_end..] != input[ip_end..] {
        return fail("echo", "bytes after the IP packet changed");
    }
    if !v6 && csum::verifies(&req[..i], 0) != csum::verifies(&rep[..i], 0) {
        return fail(
            "echo-checksum",
            "IPv4 header checksum: valid in one of request and reply only",
        );
    }
    if icmp_ok(&req[i..], src, dst) != icmp_ok(&rep[i..], dst, src) {
        return fail(
            "echo-checksum",
            "ICMP checksum: valid in one of request and reply only",
        );
    }
    Ok(None)
}

/// `reply` (from its IP header on) as the answer to the too-big `packet`.
fn too_big(packet: &[u8], reply: &[u8], mtu: u32) -> Result<(), Violation> {
    let v6 = packet[0] >> 4 == 6;
    let (src, dst) = addrs(packet);
    let (hlen, limit) = if v6 { (40, 1280) } else { (20, 576) };
    let ok_header = if v6 {
        reply[0] >> 4 == 6
            && usize::from(u16::from_be_bytes([reply[4], reply[5]])) + 40 == reply.len()
            && reply[6] == 58
            && reply[7] == 64
    } else {
        reply[0] == 0x45
            && usize::from(u16::from_be_bytes([reply[2], reply[3]])) == reply.len()
            && reply[8] == 64
            && reply[9] == 1
            && csum::verifies(&reply[..20], 0)
    };
    if !ok_header || addrs(reply) != (dst, src) {
        return fail(
            "too-big-ip",
            "reply IP header: version, length, protocol, TTL, checksum or addresses",
        );
    }
    let msg = &reply[hlen..];
    let (kind, code) = if v6 { (2, 0) } else { (3, 4) };
    let announced = if v6 {
        u32::from_be_bytes([msg[4], msg[5], msg[6], msg[7]])
    } else {
        u32::from(u16::from_be_bytes([msg[6], msg[7]]))
    };
    if msg[0] != kind || msg[1] != code || (!v6 && msg[4..6] != [0, 0]) || announced != mtu {
        let what = format!(
            "ICMP {}/{} announcing {announced}, expected {kind}/{code} announcing {mtu}",
            msg[0], msg[1]
        );
        return fail("too-big-icmp", what);
    }
    if !icmp_ok(msg, dst, src) {
        return fail("too-big-checksum", "ICMP checksum invalid");
    }
    let quote = &msg[8..];
    let min_quote = if v6 { 48 } else { 28 };
    if quote.len() < min_quote || reply.len() > limit || !packet.starts_with(quote) {
        let what = format!(
            "quote of {} bytes, reply of {} (the packet's start, at least {min_quote}, reply at most {limit})",
            quote.len(),
            reply.len()
        );
        return fail("too-big-quote", what);
    }
    Ok(())
}

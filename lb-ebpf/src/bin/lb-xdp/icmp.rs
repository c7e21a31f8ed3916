//! ICMP and ICMPv6 at the balancer: reading messages addressed to a VIP,
//! answering echo requests, and building "fragmentation needed" and
//! "packet too big" for packets that would not fit once encapsulated.
//!
//! An ICMP error about a VIP flow arrives at the balancer because the
//! backend answered the client directly with the VIP as source (DSR): the
//! router that could not deliver the answer reports to the VIP. The message
//! quotes that answer, `VIP:port → client:port`; reversed, it is the flow's
//! own 5-tuple, which names the backend that must learn about it.
//!
//! Replies are built in place and sent back with `XDP_TX` toward the MAC
//! the request came from. They carry the VIP as source and TTL 64.

use aya_ebpf::{
    helpers::generated::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::consts::{
    ETH_HDR_LEN, FAMILY_V4, IPV4_HDR_LEN, IPV6_HDR_LEN, OUTER_TTL, PROTO_ICMP, PROTO_ICMPV6,
    PROTO_TCP, PROTO_UDP,
};
use lb_ebpf::{
    access::At,
    csum,
    hdr::{
        EthHdr, ICMP_DEST_UNREACH, ICMP_ECHO, ICMP_ECHO_REPLY, ICMP_FRAG_NEEDED,
        ICMP_TIME_EXCEEDED, ICMPV6_DEST_UNREACH, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST,
        ICMPV6_PKT_TOOBIG, ICMPV6_TIME_EXCEED, IP_OFFSET, IPV6_MIN_MTU, IcmpHdr, Ipv4Hdr, Ipv6Hdr,
        VlanHdr, be16, be32,
    },
    parse::Packet,
};

const ICMP_HDR_LEN: usize = 8;
/// The source and destination ports at the start of a quoted TCP or UDP
/// header: all the balancer reads of it.
const PORTS_LEN: usize = 4;

/// The flow an ICMP error is about, in the client → VIP direction.
#[derive(Clone, Copy)]
pub struct Quoted {
    pub client: [u32; 4],
    pub vip: [u32; 4],
    /// Ports word as the client's packets carry it (client port low).
    pub ports: u32,
    pub proto: u8,
}

impl Quoted {
    /// VIP port, network order.
    #[inline(always)]
    pub fn vip_port(&self) -> u16 {
        (self.ports >> 16) as u16
    }
}

/// What an ICMP message to a VIP address asks of the balancer.
pub enum Message {
    /// An echo request.
    Echo,
    /// An error about the quoted flow.
    Error(Quoted),
    /// ICMPv6 packet-too-big below the IPv6 minimum MTU.
    PtbTooSmall,
    /// Anything else (other types, quotes the balancer cannot read).
    Other,
}

/// Reads the ICMP message of `pkt` (a non-fragment with `is_icmp()`).
#[inline(always)]
pub fn classify(ctx: &XdpContext, pkt: &Packet) -> Message {
    let off = pkt.l4_off();
    let ip_end = pkt.ip_end();
    if off + ICMP_HDR_LEN > ip_end {
        return Message::Other;
    }
    let Some(h) = At::<IcmpHdr>::new(ctx, off) else {
        return Message::Other;
    };
    let h = h.read();
    let quote = off + ICMP_HDR_LEN;
    if pkt.family == FAMILY_V4 {
        match h.kind {
            ICMP_ECHO => Message::Echo,
            ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED => quoted_v4(ctx, pkt, quote),
            _ => Message::Other,
        }
    } else {
        match h.kind {
            ICMPV6_ECHO_REQUEST => Message::Echo,
            ICMPV6_PKT_TOOBIG if u32::from_be(h.rest) < IPV6_MIN_MTU => Message::PtbTooSmall,
            ICMPV6_DEST_UNREACH | ICMPV6_PKT_TOOBIG | ICMPV6_TIME_EXCEED => {
                quoted_v6(ctx, pkt, quote)
            }
            _ => Message::Other,
        }
    }
}

/// The quoted IPv4 packet: a first (or only) fragment of TCP or UDP from
/// the VIP the error is addressed to, with at least its ports, all inside
/// the outer IP packet (not in the frame's padding after it).
#[inline(always)]
fn quoted_v4(ctx: &XdpContext, pkt: &Packet, off: usize) -> Message {
    let ip_end = pkt.ip_end();
    if off + IPV4_HDR_LEN > ip_end {
        return Message::Other;
    }
    let Some(ip) = At::<Ipv4Hdr>::new(ctx, off) else {
        return Message::Other;
    };
    let ip = ip.read();
    // At most 60: the mask below only restates that for the verifier.
    let ihl = ((ip.version_ihl & 0x0f) as usize) * 4;
    if ip.version_ihl >> 4 != 4
        || ihl < IPV4_HDR_LEN
        || off + ihl + PORTS_LEN > ip_end
        || ip.saddr != pkt.dst[0]
        || ip.frag_off & be16(IP_OFFSET) != 0
        || (ip.protocol != PROTO_TCP && ip.protocol != PROTO_UDP)
    {
        return Message::Other;
    }
    let Some(ports) = At::<u32>::new(ctx, off + (ihl & 0x3c)) else {
        return Message::Other;
    };
    let ports = ports.read();
    Message::Error(Quoted {
        client: [ip.daddr, 0, 0, 0],
        vip: [ip.saddr, 0, 0, 0],
        ports: ports.rotate_left(16),
        proto: ip.protocol,
    })
}

/// The quoted IPv6 packet: TCP or UDP right after the fixed header, from
/// the VIP the error is addressed to, its ports inside the outer packet.
#[inline(always)]
fn quoted_v6(ctx: &XdpContext, pkt: &Packet, off: usize) -> Message {
    if off + IPV6_HDR_LEN + PORTS_LEN > pkt.ip_end() {
        return Message::Other;
    }
    let Some(ip) = At::<Ipv6Hdr>::new(ctx, off) else {
        return Message::Other;
    };
    let ip = ip.read();
    if u32::from_be(ip.vtc_flow) >> 28 != 6
        || (ip.nexthdr != PROTO_TCP && ip.nexthdr != PROTO_UDP)
        || ip.saddr[0] != pkt.dst[0]
        || ip.saddr[1] != pkt.dst[1]
        || ip.saddr[2] != pkt.dst[2]
        || ip.saddr[3] != pkt.dst[3]
    {
        return Message::Other;
    }
    let (client, vip, proto) = (ip.daddr, ip.saddr, ip.nexthdr);
    let Some(ports) = At::<u32>::new(ctx, off + IPV6_HDR_LEN) else {
        return Message::Other;
    };
    let ports = ports.read();
    Message::Error(Quoted {
        client,
        vip,
        ports: ports.rotate_left(16),
        proto,
    })
}

/// A reply could not be built (the frame could not be resized or re-read).
pub struct ReplyError;

/// Turns the echo request in `ctx` into its reply, in place.
#[inline(always)]
pub fn echo_reply(ctx: &XdpContext, pkt: &Packet) -> Result<(), ReplyError> {
    swap_macs(ctx)?;
    let l3 = pkt.l2_len as usize & 0x1f;
    let off = pkt.l4_off();
    let h = At::<IcmpHdr>::new(ctx, off).ok_or(ReplyError)?;
    let (old, new_kind) = if pkt.family == FAMILY_V4 {
        let at = At::<Ipv4Hdr>::new(ctx, l3).ok_or(ReplyError)?;
        let ip = at.read();
        at.set_saddr(ip.daddr);
        at.set_daddr(ip.saddr);
        // TTL and protocol share a checksummed word.
        let old = u16::from_ne_bytes([ip.ttl, ip.protocol]);
        let new = u16::from_ne_bytes([OUTER_TTL, ip.protocol]);
        at.set_ttl(OUTER_TTL);
        at.set_check(csum::replace16(ip.check, old, new));
        (ICMP_ECHO, ICMP_ECHO_REPLY)
    } else {
        // Swapping the addresses leaves the pseudo-header sum, and so the
        // checksum, unchanged.
        let at = At::<Ipv6Hdr>::new(ctx, l3).ok_or(ReplyError)?;
        let ip = at.read();
        at.set_saddr(&ip.daddr);
        at.set_daddr(&ip.saddr);
        at.set_hop_limit(OUTER_TTL);
        (ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY)
    };
    let icmp = h.read();
    h.set_kind(new_kind);
    h.set_check(csum::replace16(
        icmp.check,
        u16::from_ne_bytes([old, icmp.code]),
        u16::from_ne_bytes([new_kind, icmp.code]),
    ));
    Ok(())
}

#[inline(always)]
fn swap_macs(ctx: &XdpContext) -> Result<(), ReplyError> {
    let at = At::<EthHdr>::new(ctx, 0).ok_or(ReplyError)?;
    let eth = at.read();
    at.set_dest(eth.h_source);
    at.set_source(eth.h_dest);
    Ok(())
}

/// Bytes of the offending IPv4 packet quoted in "fragmentation needed":
/// the longest IP header (60 bytes) and 8 more, so the quote always holds
/// the header and the first 8 bytes of its payload (RFC 792 asks for no
/// more; RFC 1812 allows up to 576 bytes in all). The packet being too
/// big, it always has that many.
pub const FRAG_NEEDED_QUOTE_LEN: usize = 68;

/// Bytes of the offending IPv6 packet quoted in "packet too big": its
/// headers and then some, well inside the 1280-byte minimum.
pub const PTB_QUOTE_LEN: usize = 256;

/// Replaces the too-big IPv4 packet in `ctx` with an ICMP "fragmentation
/// needed" (type 3, code 4) to its source, from the VIP, quoting its first
/// [`FRAG_NEEDED_QUOTE_LEN`] bytes, with next-hop MTU `mtu`.
#[inline(always)]
pub fn frag_needed(ctx: &XdpContext, pkt: &Packet, mtu: u32) -> Result<(), ReplyError> {
    if (pkt.ip_len as usize) < FRAG_NEEDED_QUOTE_LEN {
        return Err(ReplyError);
    }
    let l2 = pkt.l2_len as usize & 0x1f;
    let ip = At::<Ipv4Hdr>::new(ctx, l2).ok_or(ReplyError)?.read();
    let quote = FRAG_NEEDED_QUOTE_LEN;
    let new_hdrs = IPV4_HDR_LEN + ICMP_HDR_LEN;
    // The frame becomes [L2][IPv4][ICMP][quote]: cut everything after the
    // quote, then grow the front by the two new headers. The quote stays
    // where it is, right after them.
    let (mac, vlan) = reverse_l2(ctx, l2)?;
    resize(ctx, l2 + quote, new_hdrs)?;
    write_l2(ctx, mac, vlan)?;
    let out = At::<Ipv4Hdr>::new(ctx, l2).ok_or(ReplyError)?;
    out.set_version_ihl(0x45);
    out.set_tos(0);
    out.set_tot_len(be16((new_hdrs + quote) as u16));
    out.set_id(0);
    out.set_frag_off(0);
    out.set_ttl(OUTER_TTL);
    out.set_protocol(PROTO_ICMP);
    out.set_check(0);
    out.set_saddr(ip.daddr);
    out.set_daddr(ip.saddr);
    // SAFETY: `out` is a whole IPv4 header without options in the packet.
    out.set_check(unsafe { csum::ipv4_header(out.as_ptr() as *const u16) });
    let off = l2 + IPV4_HDR_LEN;
    let h = At::<IcmpHdr>::new(ctx, off).ok_or(ReplyError)?;
    h.set_kind(ICMP_DEST_UNREACH);
    h.set_code(ICMP_FRAG_NEEDED);
    h.set_check(0);
    // Unused (16 bits), then the next-hop MTU (RFC 1191).
    h.set_rest(be32(mtu & 0xffff));
    let sum = sum_bytes::<{ ICMP_HDR_LEN + FRAG_NEEDED_QUOTE_LEN }>(ctx, off, 0)?;
    h.set_check(csum::fold(sum));
    Ok(())
}

/// Replaces the too-big IPv6 packet in `ctx` with an ICMPv6 "packet too
/// big" to its source, from the VIP, quoting its first
/// [`PTB_QUOTE_LEN`] bytes, with MTU `mtu`.
#[inline(always)]
pub fn packet_too_big(ctx: &XdpContext, pkt: &Packet, mtu: u32) -> Result<(), ReplyError> {
    if (pkt.ip_len as usize) < PTB_QUOTE_LEN {
        return Err(ReplyError);
    }
    let l2 = pkt.l2_len as usize & 0x1f;
    let new_hdrs = IPV6_HDR_LEN + ICMP_HDR_LEN;
    let (mac, vlan) = reverse_l2(ctx, l2)?;
    resize(ctx, l2 + PTB_QUOTE_LEN, new_hdrs)?;
    write_l2(ctx, mac, vlan)?;
    let payload = ICMP_HDR_LEN + PTB_QUOTE_LEN;
    let out = At::<Ipv6Hdr>::new(ctx, l2).ok_or(ReplyError)?;
    out.set_vtc_flow(be32(6 << 28));
    out.set_payload_len(be16(payload as u16));
    out.set_nexthdr(PROTO_ICMPV6);
    out.set_hop_limit(OUTER_TTL);
    // The addresses are the original packet's (in `pkt`), reversed.
    out.set_saddr(&pkt.dst);
    out.set_daddr(&pkt.src);
    let mut sum = csum::halves(be32(payload as u32)) + csum::halves(be32(PROTO_ICMPV6 as u32));
    for i in 0..4 {
        sum += csum::halves(pkt.dst[i]) + csum::halves(pkt.src[i]);
    }
    let off = l2 + IPV6_HDR_LEN;
    let h = At::<IcmpHdr>::new(ctx, off).ok_or(ReplyError)?;
    h.set_kind(ICMPV6_PKT_TOOBIG);
    h.set_code(0);
    h.set_check(0);
    h.set_rest(be32(mtu));
    let sum = sum_bytes::<{ ICMP_HDR_LEN + PTB_QUOTE_LEN }>(ctx, off, sum)?;
    h.set_check(csum::fold(sum));
    Ok(())
}

/// The L2 header of the frame with source and destination swapped, and its
/// VLAN tag if `l2` says there is one.
#[inline(always)]
fn reverse_l2(ctx: &XdpContext, l2: usize) -> Result<(EthHdr, Option<VlanHdr>), ReplyError> {
    let mut eth = At::<EthHdr>::new(ctx, 0).ok_or(ReplyError)?.read();
    core::mem::swap(&mut eth.h_dest, &mut eth.h_source);
    let vlan = if l2 > ETH_HDR_LEN {
        Some(
            At::<VlanHdr>::new(ctx, ETH_HDR_LEN)
                .ok_or(ReplyError)?
                .read(),
        )
    } else {
        None
    };
    Ok((eth, vlan))
}

#[inline(always)]
fn write_l2(ctx: &XdpContext, eth: EthHdr, vlan: Option<VlanHdr>) -> Result<(), ReplyError> {
    // The ethertypes are unchanged (the reply has the request's IP version).
    At::<EthHdr>::new(ctx, 0).ok_or(ReplyError)?.write(eth);
    if let Some(vlan) = vlan {
        At::<VlanHdr>::new(ctx, ETH_HDR_LEN)
            .ok_or(ReplyError)?
            .write(vlan);
    }
    Ok(())
}

/// Keeps the first `keep` bytes of the frame and grows its front by `grow`.
#[inline(always)]
fn resize(ctx: &XdpContext, keep: usize, grow: usize) -> Result<(), ReplyError> {
    let len = ctx.data_end() - ctx.data();
    if keep > len {
        return Err(ReplyError);
    }
    // SAFETY: `ctx.ctx` is the program's context; no packet pointer is
    // held across these calls.
    unsafe {
        if bpf_xdp_adjust_tail(ctx.ctx, -((len - keep) as i32)) != 0 {
            return Err(ReplyError);
        }
        if bpf_xdp_adjust_head(ctx.ctx, -(grow as i32)) != 0 {
            return Err(ReplyError);
        }
    }
    Ok(())
}

/// One's-complement sum (unfolded) of the `N` bytes at `off` plus `seed`,
/// by the kernel's `bpf_csum_diff`. `N` is a multiple of 4, at most 512.
#[inline(always)]
pub(crate) fn sum_bytes<const N: usize>(
    ctx: &XdpContext,
    off: usize,
    seed: u32,
) -> Result<u32, ReplyError> {
    let p = At::<[u8; N]>::new(ctx, off).ok_or(ReplyError)?;
    // SAFETY: `p` covers `N` bytes of the packet (checked by `At::new`).
    let sum = unsafe {
        bpf_csum_diff(
            core::ptr::null_mut(),
            0,
            p.as_ptr() as *mut u32,
            N as u32,
            seed,
        )
    };
    if sum < 0 {
        return Err(ReplyError);
    }
    Ok(sum as u32)
}

//! The packet parser: Ethernet (one optional 802.1Q/802.1ad tag), IPv4 or
//! IPv6 (walking up to four hop-by-hop, routing, destination-options or AH
//! extension headers), then the TCP or UDP ports, or the ICMP header.
//!
//! It decides nothing about VIPs. Either it returns a [`Packet`] (TCP, UDP
//! or ICMP over IP whose headers are complete and consistent; a fragment
//! has no ports), or the counter that names why not: a `Pass*` counter for
//! traffic that is simply not ours, a `Malformed*` counter for packets the
//! entry point passes or drops by policy. It reads the packet through
//! [`At`], as everything else does.

use aya_ebpf::programs::XdpContext;
use lb_common::{
    Counter,
    consts::{
        ETH_HDR_LEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, FAMILY_V4, FAMILY_V6,
        IPV6_HDR_LEN, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, VLAN_HDR_LEN,
    },
};

use crate::{
    access::At,
    hdr::{EthHdr, IP_DF, IP_MF, IP_OFFSET, Ipv4Hdr, Ipv6Hdr, TcpHdr, UdpHdr, VlanHdr, be16},
};

/// A TCP, UDP or ICMP packet, parsed. Addresses and ports are raw packet
/// words.
#[derive(Clone, Copy)]
pub struct Packet {
    /// Bytes from the Ethernet header to the end of the frame.
    pub frame_len: u32,
    /// Ethernet header plus the VLAN tag if any: 14 or 18.
    pub l2_len: u32,
    /// The VLAN tag (TCI) if `l2_len == 18`.
    pub vlan_tci: u16,
    /// The tag's TPID (802.1Q or 802.1ad), network order.
    pub vlan_tpid: u16,
    pub family: u8,
    /// The upper-layer protocol (after IPv6 extension headers).
    pub proto: u8,
    /// TCP flags, 0 for UDP, ICMP and fragments.
    pub tcp_flags: u8,
    /// IPv4 TOS or IPv6 traffic class, copied to the outer header.
    pub tos: u8,
    /// A fragment: no ports (later fragments have no L4 header, and the
    /// first one is hashed like them).
    pub frag: bool,
    /// IPv4 "don't fragment".
    pub df: bool,
    /// Length of the IP packet (header included) per its own header: what
    /// gets encapsulated. Ethernet padding after it is not counted.
    pub ip_len: u32,
    /// Offset of the L4 (or ICMP) header from the start of the frame, at
    /// most [`MAX_L4_OFF`]; read it with [`Packet::l4_off`].
    pub l4_off: u32,
    /// Source and destination: word 0 only for IPv4.
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// First four bytes of the L4 header (source port, destination port);
    /// 0 for ICMP and fragments.
    pub ports: u32,
}

impl Packet {
    /// Destination port, network order.
    #[inline(always)]
    pub fn dport(&self) -> u16 {
        (self.ports >> 16) as u16
    }

    /// Offset of the L4 (or ICMP) header, bounded for the verifier. The
    /// mask is a no-op: the parser never produces an offset above
    /// [`MAX_L4_OFF`].
    #[inline(always)]
    pub fn l4_off(&self) -> usize {
        self.l4_off as usize & L4_OFF_MASK
    }

    /// End of the IP packet (its own length, not the frame's), from the
    /// start of the frame.
    #[inline(always)]
    pub fn ip_end(&self) -> usize {
        self.l2_len as usize + self.ip_len as usize
    }

    #[inline(always)]
    pub fn is_icmp(&self) -> bool {
        self.proto == PROTO_ICMP || self.proto == PROTO_ICMPV6
    }

    #[inline(always)]
    pub fn is_tcp(&self) -> bool {
        self.proto == PROTO_TCP
    }
}

/// Why a frame is not a [`Packet`].
#[derive(Clone, Copy)]
pub enum Reject {
    /// Well-formed, but not TCP, UDP or ICMP over IP: not the balancer's
    /// business.
    NotOurs(Counter),
    /// Malformed or unsupported: the entry point applies the global policy.
    Malformed(Counter),
}

use Reject::{Malformed, NotOurs};

/// Parses `ctx` down to the ports.
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Packet, Reject> {
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    let eth = At::<EthHdr>::new(ctx, 0).ok_or(Malformed(Counter::MalformedEth))?;
    let mut proto = eth.read().h_proto;
    let mut l2_len = ETH_HDR_LEN;
    let mut vlan_tci = 0;
    let mut vlan_tpid = 0;
    if proto == be16(ETH_P_8021Q) || proto == be16(ETH_P_8021AD) {
        let vlan = At::<VlanHdr>::new(ctx, ETH_HDR_LEN)
            .ok_or(Malformed(Counter::MalformedVlan))?
            .read();
        vlan_tpid = proto;
        vlan_tci = vlan.tci;
        proto = vlan.encapsulated_proto;
        if proto == be16(ETH_P_8021Q) || proto == be16(ETH_P_8021AD) {
            return Err(Malformed(Counter::MalformedVlan));
        }
        l2_len += VLAN_HDR_LEN;
    }

    let mut pkt = Packet {
        frame_len,
        l2_len: l2_len as u32,
        vlan_tci,
        vlan_tpid,
        family: 0,
        proto: 0,
        tcp_flags: 0,
        tos: 0,
        frag: false,
        df: false,
        ip_len: 0,
        l4_off: 0,
        src: [0; 4],
        dst: [0; 4],
        ports: 0,
    };
    let l3_room = frame_len as usize - l2_len;
    if proto == be16(ETH_P_IPV4) {
        parse_ipv4(ctx, l2_len, l3_room, &mut pkt)?;
    } else if proto == be16(ETH_P_IPV6) {
        parse_ipv6(ctx, l2_len, l3_room, &mut pkt)?;
    } else {
        return Err(NotOurs(Counter::PassNotIp));
    }
    if pkt.frag {
        return Ok(pkt);
    }
    let icmp = if pkt.family == FAMILY_V4 {
        PROTO_ICMP
    } else {
        PROTO_ICMPV6
    };
    if pkt.proto == PROTO_TCP || pkt.proto == PROTO_UDP {
        parse_l4(ctx, l2_len + pkt.ip_len as usize, &mut pkt)?;
    } else if pkt.proto != icmp {
        return Err(NotOurs(Counter::PassNotL4));
    }
    Ok(pkt)
}

#[inline(always)]
fn parse_ipv4(ctx: &XdpContext, off: usize, room: usize, pkt: &mut Packet) -> Result<(), Reject> {
    let ip = At::<Ipv4Hdr>::new(ctx, off)
        .ok_or(Malformed(Counter::MalformedIpv4Truncated))?
        .read();
    if ip.version_ihl >> 4 != 4 {
        return Err(Malformed(Counter::MalformedIpv4Header));
    }
    let ihl = ((ip.version_ihl & 0x0f) as usize) * 4;
    if ihl < 20 {
        return Err(Malformed(Counter::MalformedIpv4Header));
    }
    let tot_len = u16::from_be(ip.tot_len) as usize;
    if tot_len < ihl || tot_len > room {
        return Err(Malformed(Counter::MalformedIpv4Len));
    }
    pkt.family = FAMILY_V4;
    pkt.proto = ip.protocol;
    pkt.tos = ip.tos;
    pkt.ip_len = tot_len as u32;
    pkt.src[0] = ip.saddr;
    pkt.dst[0] = ip.daddr;
    pkt.frag = ip.frag_off & be16(IP_MF | IP_OFFSET) != 0;
    pkt.df = ip.frag_off & be16(IP_DF) != 0;
    pkt.l4_off = (off + ihl) as u32;
    Ok(())
}

/// Extension headers the parser walks (hop-by-hop, routing, destination
/// options, AH) and the ones it does not (mobility, HIP, shim6,
/// experimental): a packet carrying the latter is malformed for us.
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
pub const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DSTOPTS: u8 = 60;
/// Most extension headers walked before the chain counts as too long
/// (`malformed_ipv6_ext_chain_too_long`).
pub const IPV6_MAX_EXT: usize = 4;
/// Most bytes of extension headers, all together, before the upper-layer
/// header (`malformed_ipv6_ext_too_long`). With it every offset the parser
/// hands on is exact and below [`L4_OFF_MASK`].
pub const IPV6_MAX_EXT_BYTES: usize = 1024;

/// Largest L4 offset the parser produces: a VLAN tag, the IPv6 header and
/// [`IPV6_MAX_EXT_BYTES`] of extension headers (IPv4's is 18 + 60).
pub const MAX_L4_OFF: usize = ETH_HDR_LEN + VLAN_HDR_LEN + IPV6_HDR_LEN + IPV6_MAX_EXT_BYTES;
/// A mask that leaves every offset up to [`MAX_L4_OFF`] unchanged. Applied
/// where the verifier has lost an offset's bound: it can never change a
/// value the parser produced, only restate the bound.
pub const L4_OFF_MASK: usize = 0x7ff;
const _: () = assert!(MAX_L4_OFF <= L4_OFF_MASK);

#[inline(always)]
fn is_unsupported_ext(nexthdr: u8) -> bool {
    matches!(nexthdr, 135 | 139 | 140 | 253 | 254)
}

/// An extension header the parsers walk.
#[inline(always)]
pub fn is_walked_ext(nexthdr: u8) -> bool {
    matches!(
        nexthdr,
        IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS | IPV6_AH | IPV6_FRAGMENT
    )
}

/// The length of a walked extension header of type `nexthdr` whose first
/// 8 bytes are `h`: the fragment header is 8 bytes, AH counts 4-byte units
/// less 2, the others 8-byte units less 1. For `lb_decap`: [`parse_ipv6`]
/// keeps its own copy of this rule inline, in the shape the verifier of
/// Linux 6.1 accepts within its limit for `lb_xdp_trace` (written through
/// this function, the trace program went over the million instructions).
#[inline(always)]
pub fn ext_len(nexthdr: u8, h: &[u8; 8]) -> usize {
    match nexthdr {
        IPV6_FRAGMENT => 8,
        IPV6_AH => (h[1] as usize + 2) * 4,
        _ => (h[1] as usize + 1) * 8,
    }
}

#[inline(always)]
fn parse_ipv6(ctx: &XdpContext, off: usize, room: usize, pkt: &mut Packet) -> Result<(), Reject> {
    let ip = At::<Ipv6Hdr>::new(ctx, off)
        .ok_or(Malformed(Counter::MalformedIpv6Truncated))?
        .read();
    let vtc = u32::from_be(ip.vtc_flow);
    if vtc >> 28 != 6 {
        return Err(Malformed(Counter::MalformedIpv6Header));
    }
    let ip_len = IPV6_HDR_LEN + u16::from_be(ip.payload_len) as usize;
    if ip_len > room {
        return Err(Malformed(Counter::MalformedIpv6Len));
    }
    pkt.family = FAMILY_V6;
    pkt.tos = (vtc >> 20) as u8;
    pkt.ip_len = ip_len as u32;
    pkt.src = ip.saddr;
    pkt.dst = ip.daddr;

    let mut nexthdr = ip.nexthdr;
    // Bytes of extension headers walked so far: at most
    // IPV6_MAX_EXT_BYTES whenever it is used as an offset.
    let mut ext = 0usize;
    for _ in 0..IPV6_MAX_EXT {
        if !is_walked_ext(nexthdr) {
            break;
        }
        let at = off + IPV6_HDR_LEN + ext;
        // Every walked header starts with (next header, length) and is at
        // least 8 bytes long; the fragment header is exactly 8.
        let h = At::<[u8; 8]>::new(ctx, at)
            .ok_or(Malformed(Counter::MalformedIpv6Ext))?
            .read();
        let len = match nexthdr {
            IPV6_FRAGMENT => {
                // Offset and M flag; an atomic fragment (both 0, RFC 6946)
                // is a whole packet.
                let frag = u16::from_be_bytes([h[2], h[3]]);
                if frag & 0xfff9 != 0 {
                    pkt.frag = true;
                }
                8
            }
            IPV6_AH => (h[1] as usize + 2) * 4,
            _ => (h[1] as usize + 1) * 8,
        };
        nexthdr = h[0];
        ext += len;
        if IPV6_HDR_LEN + ext > ip_len {
            return Err(Malformed(Counter::MalformedIpv6Ext));
        }
        if ext > IPV6_MAX_EXT_BYTES {
            return Err(Malformed(Counter::MalformedIpv6ExtTooLong));
        }
        if pkt.frag {
            break;
        }
    }
    if !pkt.frag && is_walked_ext(nexthdr) {
        return Err(Malformed(Counter::MalformedIpv6ExtChain));
    }
    if is_unsupported_ext(nexthdr) {
        return Err(Malformed(Counter::MalformedIpv6Ext));
    }
    pkt.proto = nexthdr;
    pkt.l4_off = (off + IPV6_HDR_LEN + ext) as u32;
    Ok(())
}

#[inline(always)]
fn parse_l4(ctx: &XdpContext, ip_end: usize, pkt: &mut Packet) -> Result<(), Reject> {
    let off = pkt.l4_off();
    let l4_min = if pkt.proto == PROTO_TCP {
        core::mem::size_of::<TcpHdr>()
    } else {
        core::mem::size_of::<UdpHdr>()
    };
    // The header must fit inside the IP packet, not just inside the frame
    // (which may carry Ethernet padding after it).
    if off + l4_min > ip_end {
        return Err(Malformed(Counter::MalformedL4));
    }
    if pkt.proto == PROTO_TCP {
        let tcp = At::<TcpHdr>::new(ctx, off)
            .ok_or(Malformed(Counter::MalformedL4))?
            .read();
        if tcp.doff_res >> 4 < 5 {
            return Err(Malformed(Counter::MalformedL4));
        }
        pkt.tcp_flags = tcp.flags;
        pkt.ports = u32::from(tcp.source) | (u32::from(tcp.dest) << 16);
    } else {
        let udp = At::<UdpHdr>::new(ctx, off)
            .ok_or(Malformed(Counter::MalformedL4))?
            .read();
        pkt.ports = u32::from(udp.source) | (u32::from(udp.dest) << 16);
    }
    Ok(())
}

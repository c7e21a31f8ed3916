//! Recognising a tunnel packet addressed to us: Ethernet (one optional
//! 802.1Q/802.1ad tag), the outer IPv4 or IPv6 header, the GRE or GUE (UDP)
//! header if any, and the inner IP header's version and length.
//!
//! It changes nothing in the packet. Either it returns a [`Tunnel`] that is
//! safe to strip, or the counter that says why not. Checks run in this
//! order, so the counter is the first thing that is wrong:
//!
//! 1. not IP, or IP with a protocol other than 4/41/47/17 (IPv6: as the
//!    fixed header's next header; extension headers are not walked) →
//!    `pass_not_tunnel`;
//! 2. outer destination not in `LB_DECAP_ADDRS` → `pass_not_local`: another
//!    host's traffic is never judged, whatever its state;
//! 3. outer header broken → `malformed_outer`; IPv4 fragment →
//!    `pass_outer_fragment`;
//! 4. GRE that lb does not send (flags, version, payload type) →
//!    `pass_gre_unsupported`; GRE header cut short → `malformed_outer`;
//!    UDP to another host, or to another port than the address's GUE port
//!    (the map's value; 0: no GUE) → `pass_not_tunnel`; UDP length wrong →
//!    `malformed_outer`;
//! 5. inner header missing, of the wrong version or longer than the outer
//!    packet → `malformed_inner`. For GUE the version nibble of the first
//!    byte says which inner header to expect (GUE variant 1).
//!
//! The outer IPv4 checksum is not verified (the kernel's tunnel drivers rely
//! on `ip_rcv` for that; here the Ethernet FCS covers the last hop, and the
//! stack checks the inner packet's own checksums).

use aya_ebpf::programs::XdpContext;
use lb_common::{
    DecapAddr,
    consts::{
        ETH_HDR_LEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, FAMILY_V4, FAMILY_V6,
        GRE_HDR_LEN, IPV4_HDR_LEN, IPV6_HDR_LEN, PROTO_GRE, PROTO_IPIP, PROTO_IPV6, PROTO_UDP,
        UDP_HDR_LEN, VLAN_HDR_LEN,
    },
    counters::DecapCounter::{
        self, DecapGre, DecapGue, DecapIpip, MalformedInner, MalformedOuter, PassGreUnsupported,
        PassNotLocal, PassNotTunnel, PassOuterFragment,
    },
};
use lb_ebpf::{
    access::At,
    hdr::{EthHdr, GreHdr, IP_MF, IP_OFFSET, Ipv4Hdr, Ipv6Hdr, UdpHdr, VlanHdr, be16},
};

use crate::maps::LB_DECAP_ADDRS;

/// A tunnel packet addressed to us whose inner packet is complete.
#[derive(Clone, Copy)]
pub struct Tunnel {
    /// Ethernet header plus the VLAN tag if any: 14 or 18.
    pub l2_len: usize,
    /// Bytes between the L2 header and the inner IP header: the outer IP
    /// header (with IPv4 options) and the GRE header.
    pub overhead: usize,
    /// Ethertype of the inner packet, network order.
    pub inner_ethertype: u16,
    /// `DecapIpip`, `DecapGre` or `DecapGue`: the outcome if stripping
    /// succeeds.
    pub outcome: DecapCounter,
}

/// The outer IP header, checked.
struct Outer {
    /// Header length (IPv4 options included).
    hdr_len: usize,
    /// Length of the whole outer packet per its header.
    len: usize,
    /// Protocol / next header: 4, 41, 47 or 17.
    next: u8,
    /// The GUE port of the destination address (network order; 0: none).
    gue_port: u16,
}

#[inline(always)]
fn is_tunnel_proto(proto: u8) -> bool {
    proto == PROTO_IPIP || proto == PROTO_IPV6 || proto == PROTO_GRE || proto == PROTO_UDP
}

/// The outcome of a packet to another host: UDP is only a tunnel on a
/// local address's GUE port, so to another host it is just UDP.
#[inline(always)]
fn not_local(proto: u8) -> DecapCounter {
    if proto == PROTO_UDP {
        PassNotTunnel
    } else {
        PassNotLocal
    }
}

/// If `addr` is one of the backend's own addresses: its GUE port.
#[inline(always)]
fn local(addr: [u32; 4], family: u8) -> Option<u16> {
    let key = DecapAddr {
        addr,
        family,
        _pad: [0; 3],
    };
    // SAFETY: a live map value, copied out.
    LB_DECAP_ADDRS.get_ptr(key).map(|v| unsafe { *v } as u16)
}

/// Parses `ctx` down to the inner IP header.
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Tunnel, DecapCounter> {
    let frame_len = ctx.data_end() - ctx.data();
    let mut proto = At::<EthHdr>::new(ctx, 0)
        .ok_or(PassNotTunnel)?
        .read()
        .h_proto;
    let mut l2_len = ETH_HDR_LEN;
    if proto == be16(ETH_P_8021Q) || proto == be16(ETH_P_8021AD) {
        let vlan = At::<VlanHdr>::new(ctx, ETH_HDR_LEN).ok_or(PassNotTunnel)?;
        proto = vlan.read().encapsulated_proto;
        l2_len += VLAN_HDR_LEN;
    }
    // The reads above proved the frame holds `l2_len` bytes.
    let room = frame_len - l2_len;
    let outer = if proto == be16(ETH_P_IPV4) {
        outer_ipv4(ctx, l2_len, room)?
    } else if proto == be16(ETH_P_IPV6) {
        outer_ipv6(ctx, l2_len, room)?
    } else {
        return Err(PassNotTunnel);
    };

    let outer_end = l2_len + outer.len;
    let (inner_off, inner_v6, outcome) =
        tunnel_header(ctx, &outer, l2_len + outer.hdr_len, outer_end)?;
    // Bytes the outer packet carries after the inner header's start.
    let inner_room = outer_end - inner_off;
    let inner_ethertype = if inner_v6 {
        inner_ipv6(ctx, inner_off, inner_room)?;
        be16(ETH_P_IPV6)
    } else {
        inner_ipv4(ctx, inner_off, inner_room)?;
        be16(ETH_P_IPV4)
    };
    Ok(Tunnel {
        l2_len,
        overhead: inner_off - l2_len,
        inner_ethertype,
        outcome,
    })
}

/// The GUE (UDP) or GRE header at `off` if `outer` says there is one:
/// where the inner IP header starts, whether it is IPv6, and the outcome.
#[inline(always)]
fn tunnel_header(
    ctx: &XdpContext,
    outer: &Outer,
    off: usize,
    outer_end: usize,
) -> Result<(usize, bool, DecapCounter), DecapCounter> {
    let mut inner_off = off;
    let (inner_v6, outcome) = if outer.next == PROTO_UDP {
        let udp = At::<UdpHdr>::new(ctx, inner_off)
            .ok_or(PassNotTunnel)?
            .read();
        if outer.gue_port == 0 || udp.dest != outer.gue_port {
            return Err(PassNotTunnel);
        }
        if inner_off + UDP_HDR_LEN + 1 > outer_end
            || u16::from_be(udp.len) as usize != outer_end - inner_off
        {
            return Err(MalformedOuter);
        }
        inner_off += UDP_HDR_LEN;
        // Two bytes, not one: a 1-byte check compiles to a comparison the
        // verifier does not take as a bound.
        let version = At::<[u8; 2]>::new(ctx, inner_off).ok_or(MalformedInner)?;
        let inner_v6 = match version.read()[0] >> 4 {
            4 => false,
            6 => true,
            _ => return Err(MalformedInner),
        };
        (inner_v6, DecapGue)
    } else if outer.next == PROTO_GRE {
        if inner_off + GRE_HDR_LEN > outer_end {
            return Err(MalformedOuter);
        }
        let gre = At::<GreHdr>::new(ctx, inner_off)
            .ok_or(MalformedOuter)?
            .read();
        if gre.flags_version != 0 {
            return Err(PassGreUnsupported);
        }
        let inner_v6 = if gre.protocol == be16(ETH_P_IPV4) {
            false
        } else if gre.protocol == be16(ETH_P_IPV6) {
            true
        } else {
            return Err(PassGreUnsupported);
        };
        inner_off += GRE_HDR_LEN;
        (inner_v6, DecapGre)
    } else {
        (outer.next == PROTO_IPV6, DecapIpip)
    };

    Ok((inner_off, inner_v6, outcome))
}

/// The outer IPv4 header at `off`; `room` is what the frame holds from it.
#[inline(always)]
fn outer_ipv4(ctx: &XdpContext, off: usize, room: usize) -> Result<Outer, DecapCounter> {
    let ip = At::<Ipv4Hdr>::new(ctx, off).ok_or(PassNotTunnel)?.read();
    if ip.version_ihl >> 4 != 4 || !is_tunnel_proto(ip.protocol) {
        return Err(PassNotTunnel);
    }
    let Some(gue_port) = local([ip.daddr, 0, 0, 0], FAMILY_V4) else {
        return Err(not_local(ip.protocol));
    };
    let ihl = ((ip.version_ihl & 0x0f) as usize) * 4;
    if ihl < IPV4_HDR_LEN {
        return Err(MalformedOuter);
    }
    let tot_len = u16::from_be(ip.tot_len) as usize;
    if tot_len < ihl || tot_len > room {
        return Err(MalformedOuter);
    }
    if ip.frag_off & be16(IP_MF | IP_OFFSET) != 0 {
        return Err(PassOuterFragment);
    }
    Ok(Outer {
        hdr_len: ihl,
        len: tot_len,
        next: ip.protocol,
        gue_port,
    })
}

/// The outer IPv6 header at `off`: the fixed header only; the tunnel
/// protocol must be its next header.
#[inline(always)]
fn outer_ipv6(ctx: &XdpContext, off: usize, room: usize) -> Result<Outer, DecapCounter> {
    let ip = At::<Ipv6Hdr>::new(ctx, off).ok_or(PassNotTunnel)?.read();
    if u32::from_be(ip.vtc_flow) >> 28 != 6 || !is_tunnel_proto(ip.nexthdr) {
        return Err(PassNotTunnel);
    }
    let Some(gue_port) = local(ip.daddr, FAMILY_V6) else {
        return Err(not_local(ip.nexthdr));
    };
    // A jumbogram (payload length 0) leaves no room for an inner header and
    // fails below as `malformed_inner`.
    let len = IPV6_HDR_LEN + u16::from_be(ip.payload_len) as usize;
    if len > room {
        return Err(MalformedOuter);
    }
    Ok(Outer {
        hdr_len: IPV6_HDR_LEN,
        len,
        next: ip.nexthdr,
        gue_port,
    })
}

/// The inner IPv4 header at `off`; `room` is what the outer packet carries
/// from there. Inner fragments are fine: the stack reassembles them.
#[inline(always)]
fn inner_ipv4(ctx: &XdpContext, off: usize, room: usize) -> Result<(), DecapCounter> {
    let ip = At::<Ipv4Hdr>::new(ctx, off).ok_or(MalformedInner)?.read();
    if ip.version_ihl >> 4 != 4 {
        return Err(MalformedInner);
    }
    let ihl = ((ip.version_ihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be(ip.tot_len) as usize;
    if ihl < IPV4_HDR_LEN || tot_len < ihl || tot_len > room {
        return Err(MalformedInner);
    }
    Ok(())
}

/// The inner IPv6 header at `off`; `room` as for [`inner_ipv4`].
#[inline(always)]
fn inner_ipv6(ctx: &XdpContext, off: usize, room: usize) -> Result<(), DecapCounter> {
    let ip = At::<Ipv6Hdr>::new(ctx, off).ok_or(MalformedInner)?.read();
    if u32::from_be(ip.vtc_flow) >> 28 != 6 {
        return Err(MalformedInner);
    }
    if IPV6_HDR_LEN + u16::from_be(ip.payload_len) as usize > room {
        return Err(MalformedInner);
    }
    Ok(())
}

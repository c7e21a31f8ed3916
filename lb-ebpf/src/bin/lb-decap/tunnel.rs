//! Recognising a tunnel packet addressed to us: Ethernet (one optional
//! 802.1Q/802.1ad tag), the outer IPv4 or IPv6 header, the GRE or GUE (UDP)
//! header if any, and the inner IP header's version and length.
//!
//! It changes nothing in the packet. Either it returns a [`Tunnel`] that is
//! safe to strip, or the counter that says why not. Checks run in this
//! order, so the counter is the first thing that is wrong:
//!
//! 1. not IP, or IP with a protocol other than 4/41/47/17 (IPv6: as the
//!    fixed header's next header) → `pass_not_tunnel`. lb never sends a
//!    tunnel behind IPv6 extension headers, but the kernel's tunnel
//!    drivers take one: to a destination that checks sources (step 6),
//!    from a source outside its prefixes, the extension headers are walked
//!    and IP-in-IP or GRE behind them (or a chain too long to walk) →
//!    `drop_source_not_allowed`;
//! 2. outer destination not in `LB_DECAP_ADDRS` → `pass_not_local`: another
//!    host's traffic is never judged, whatever its state;
//! 3. outer header broken → `malformed_outer`; IPv4 fragment →
//!    `pass_outer_fragment`;
//! 4. GRE that lb does not send (flags, version, payload type) →
//!    `pass_gre_unsupported`; GRE header cut short → `malformed_outer`;
//!    UDP to another host, or to another port than the address's GUE port
//!    (the map's value; 0: no GUE) → `pass_not_tunnel`; UDP length wrong →
//!    `malformed_outer`;
//! 5. GUE only: the first two bits after the UDP header say the variant.
//!    Variant 1 (`01`: an IPv4 or IPv6 header's first nibble) is the inner
//!    packet itself. Variant 0 (`00`) must be lb's second-chance list: GUE
//!    version 0, not a control message, no flags, lb's private data type,
//!    1 to 3 alternates, `hlen` matching their count and size (the outer
//!    family's), the next index at most the count, UDP checksum 0 (lb sends
//!    0 and a forwarding backend rewrites addresses), the inner protocol 4
//!    or 41 → otherwise `malformed_sc_header`;
//! 6. the destination takes tunnels only from `LB_DECAP_FROM`
//!    (`DECAP_F_CHECK_SOURCE` in its value) and the outer source is in no
//!    prefix there, or is an IPv6 source inside `::ffff:0:0/96` (an IPv4
//!    address in disguise) → `drop_source_not_allowed`: neither stripped
//!    nor handed on (a forged second-chance list would make this host
//!    relay). IP-in-IP and GRE are checked as soon as the destination is
//!    known to be local (before step 3: no fragment or odd GRE of theirs
//!    reaches the stack), GUE once the port says it is GUE;
//! 7. inner header missing, of the wrong version or longer than the outer
//!    packet → `malformed_inner`. For GUE the version nibble of the first
//!    byte (variant 1) or the GUE header's protocol (variant 0) says which
//!    inner header to expect.
//!
//! The outer IPv4 checksum is not verified (the kernel's tunnel drivers rely
//! on `ip_rcv` for that; here the Ethernet FCS covers the last hop, and the
//! stack checks the inner packet's own checksums).

use aya_ebpf::{maps::lpm_trie::Key, programs::XdpContext};
use lb_common::{
    AddrWords, DecapAddr, V4_MAPPED_WORD,
    consts::{
        DECAP_F_CHECK_SOURCE, ETH_HDR_LEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6,
        FAMILY_V4, FAMILY_V6, GRE_HDR_LEN, GUE_HDR_LEN, IPV4_HDR_LEN, IPV6_HDR_LEN, PROTO_GRE,
        PROTO_IPIP, PROTO_IPV6, PROTO_UDP, SC_HDR_LEN, SC_MAX_ALTERNATES, SC_TYPE, UDP_HDR_LEN,
        VLAN_HDR_LEN,
    },
    counters::DecapCounter::{
        self, DecapGre, DecapGue, DecapIpip, DropSource, MalformedInner, MalformedOuter,
        MalformedSc, PassGreUnsupported, PassNotLocal, PassNotTunnel, PassOuterFragment,
    },
};
use lb_ebpf::{
    access::At,
    hdr::{
        EthHdr, GreHdr, GueHdr, IP_MF, IP_OFFSET, Ipv4Hdr, Ipv6Hdr, ScHdr, UdpHdr, VlanHdr, be16,
    },
    parse::{IPV6_FRAGMENT, IPV6_MAX_EXT, IPV6_MAX_EXT_BYTES, ext_len, is_walked_ext},
};

use crate::maps::{LB_DECAP_ADDRS, LB_DECAP_FROM};

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
    /// GUE variant 0: lb's second-chance list, checked.
    pub alternates: Option<AltList>,
    /// The destination takes tunnels only from `LB_DECAP_FROM`; so is a
    /// packet handed on only to an alternate there.
    pub check_source: bool,
}

/// lb's second-chance list in a GUE variant 0 header, checked: `count`
/// alternates of the outer family, `next ≤ count`.
#[derive(Clone, Copy)]
pub struct AltList {
    /// Where lb's private header (`ScHdr`) starts in the frame; the
    /// addresses follow it.
    pub hdr_off: usize,
    pub next: u8,
    pub count: u8,
    /// The outer header (and so each address) is IPv6.
    pub outer_v6: bool,
}

/// Where the inner packet starts, what it is, and the list if any.
struct Inner {
    off: usize,
    v6: bool,
    outcome: DecapCounter,
    alternates: Option<AltList>,
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
    v6: bool,
    /// GUE only: the source as `LB_DECAP_FROM` keys hold it, if the
    /// destination takes tunnels only from there (other tunnels are
    /// checked at once, [`source_check`]).
    checked_source: Option<AddrWords>,
    /// The destination takes tunnels only from `LB_DECAP_FROM`.
    check_source: bool,
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

/// If `addr` is one of the backend's own addresses: its value (GUE port
/// and flags).
#[inline(always)]
fn local(addr: [u32; 4], family: u8) -> Option<u32> {
    let key = DecapAddr {
        addr,
        family,
        _pad: [0; 3],
    };
    // SAFETY: a live map value, copied out.
    LB_DECAP_ADDRS.get_ptr(key).map(|v| unsafe { *v })
}

/// Is `src` (as [`mapped`](lb_common::mapped_words) words) in a prefix of
/// `LB_DECAP_FROM`? An IPv6 source (`v6`) inside `::ffff:0:0/96` never is:
/// it would pass for the IPv4 address it maps.
#[inline(always)]
pub fn allowed(src: AddrWords, v6: bool) -> bool {
    let mapped = src[0] == 0 && src[1] == 0 && src[2] == V4_MAPPED_WORD;
    !(v6 && mapped) && LB_DECAP_FROM.get(Key::new(128, src)).is_some()
}

/// The source check of a tunnel to a local address whose value is
/// `local`: UDP is checked later, once it is known to be GUE (the
/// source, returned); other tunnels now.
#[inline(always)]
fn source_check(
    local: u32,
    proto: u8,
    src: AddrWords,
    v6: bool,
) -> Result<Option<AddrWords>, DecapCounter> {
    if local & DECAP_F_CHECK_SOURCE == 0 {
        return Ok(None);
    }
    if proto == PROTO_UDP {
        return Ok(Some(src));
    }
    if allowed(src, v6) {
        Ok(None)
    } else {
        Err(DropSource)
    }
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
    let inner = tunnel_header(ctx, &outer, l2_len + outer.hdr_len, outer_end)?;
    if let Some(src) = outer.checked_source
        && !allowed(src, outer.v6)
    {
        return Err(DropSource);
    }
    // Bytes the outer packet carries after the inner header's start.
    let inner_room = outer_end - inner.off;
    let inner_ethertype = if inner.v6 {
        inner_ipv6(ctx, inner.off, inner_room)?;
        be16(ETH_P_IPV6)
    } else {
        inner_ipv4(ctx, inner.off, inner_room)?;
        be16(ETH_P_IPV4)
    };
    Ok(Tunnel {
        l2_len,
        overhead: inner.off - l2_len,
        inner_ethertype,
        outcome: inner.outcome,
        alternates: inner.alternates,
        check_source: outer.check_source,
    })
}

/// The GUE (UDP) or GRE header at `off` if `outer` says there is one:
/// where the inner IP header starts, whether it is IPv6, the outcome, and
/// lb's alternates list for GUE variant 0.
#[inline(always)]
fn tunnel_header(
    ctx: &XdpContext,
    outer: &Outer,
    off: usize,
    outer_end: usize,
) -> Result<Inner, DecapCounter> {
    if outer.next == PROTO_UDP {
        return gue(ctx, outer, off, outer_end);
    }
    if outer.next != PROTO_GRE {
        return Ok(Inner {
            off,
            v6: outer.next == PROTO_IPV6,
            outcome: DecapIpip,
            alternates: None,
        });
    }
    if off + GRE_HDR_LEN > outer_end {
        return Err(MalformedOuter);
    }
    let gre = At::<GreHdr>::new(ctx, off).ok_or(MalformedOuter)?.read();
    if gre.flags_version != 0 {
        return Err(PassGreUnsupported);
    }
    let v6 = if gre.protocol == be16(ETH_P_IPV4) {
        false
    } else if gre.protocol == be16(ETH_P_IPV6) {
        true
    } else {
        return Err(PassGreUnsupported);
    };
    Ok(Inner {
        off: off + GRE_HDR_LEN,
        v6,
        outcome: DecapGre,
        alternates: None,
    })
}

/// UDP at `off`: GUE on the address's GUE port, variant 1 (the inner IP
/// header right after UDP) or variant 0 (lb's alternates list first).
#[inline(always)]
fn gue(
    ctx: &XdpContext,
    outer: &Outer,
    off: usize,
    outer_end: usize,
) -> Result<Inner, DecapCounter> {
    let udp = At::<UdpHdr>::new(ctx, off).ok_or(PassNotTunnel)?.read();
    if outer.gue_port == 0 || udp.dest != outer.gue_port {
        return Err(PassNotTunnel);
    }
    if off + UDP_HDR_LEN + 1 > outer_end || u16::from_be(udp.len) as usize != outer_end - off {
        return Err(MalformedOuter);
    }
    let off = off + UDP_HDR_LEN;
    // Two bytes, not one: a 1-byte check compiles to a comparison the
    // verifier does not take as a bound.
    let first = At::<[u8; 2]>::new(ctx, off).ok_or(MalformedInner)?.read()[0];
    if first >> 6 == 0 {
        return alternates_list(ctx, outer, off, outer_end, udp.check);
    }
    let v6 = match first >> 4 {
        4 => false,
        6 => true,
        _ => return Err(MalformedInner),
    };
    Ok(Inner {
        off,
        v6,
        outcome: DecapGue,
        alternates: None,
    })
}

/// GUE variant 0 at `off` (after UDP): lb's alternates list, checked as
/// the module docs say; anything else is `malformed_sc_header`.
#[inline(always)]
fn alternates_list(
    ctx: &XdpContext,
    outer: &Outer,
    off: usize,
    outer_end: usize,
    udp_check: u16,
) -> Result<Inner, DecapCounter> {
    let g = At::<GueHdr>::new(ctx, off).ok_or(MalformedSc)?.read();
    let h = At::<ScHdr>::new(ctx, off + GUE_HDR_LEN)
        .ok_or(MalformedSc)?
        .read();
    let words = (g.ver_c_hlen & 0x1f) as usize;
    let count = h.count as usize;
    let addr_words = if outer.v6 { 4 } else { 1 };
    if g.ver_c_hlen & 0xe0 != 0
        || g.flags != 0
        || udp_check != 0
        || h.kind != be16(SC_TYPE)
        || count == 0
        || count > SC_MAX_ALTERNATES
        || h.next as usize > count
        || words != SC_HDR_LEN / 4 + count * addr_words
    {
        return Err(MalformedSc);
    }
    let v6 = match g.proto_ctype {
        PROTO_IPIP => false,
        PROTO_IPV6 => true,
        _ => return Err(MalformedSc),
    };
    let inner = off + GUE_HDR_LEN + words * 4;
    if inner > outer_end {
        return Err(MalformedSc);
    }
    Ok(Inner {
        off: inner,
        v6,
        outcome: DecapGue,
        alternates: Some(AltList {
            hdr_off: off + GUE_HDR_LEN,
            next: h.next,
            count: h.count,
            outer_v6: outer.v6,
        }),
    })
}

/// The outer IPv4 header at `off`; `room` is what the frame holds from it.
#[inline(always)]
fn outer_ipv4(ctx: &XdpContext, off: usize, room: usize) -> Result<Outer, DecapCounter> {
    let ip = At::<Ipv4Hdr>::new(ctx, off).ok_or(PassNotTunnel)?.read();
    if ip.version_ihl >> 4 != 4 || !is_tunnel_proto(ip.protocol) {
        return Err(PassNotTunnel);
    }
    let Some(value) = local([ip.daddr, 0, 0, 0], FAMILY_V4) else {
        return Err(not_local(ip.protocol));
    };
    let mapped = [0, 0, V4_MAPPED_WORD, ip.saddr];
    let checked_source = source_check(value, ip.protocol, mapped, false)?;
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
        gue_port: value as u16,
        v6: false,
        checked_source,
        check_source: value & DECAP_F_CHECK_SOURCE != 0,
    })
}

/// The outer IPv6 header at `off`: the fixed header only; the tunnel
/// protocol must be its next header (a tunnel behind extension headers is
/// not lb's: see [`behind_extensions`]).
#[inline(always)]
fn outer_ipv6(ctx: &XdpContext, off: usize, room: usize) -> Result<Outer, DecapCounter> {
    let ip = At::<Ipv6Hdr>::new(ctx, off).ok_or(PassNotTunnel)?.read();
    if u32::from_be(ip.vtc_flow) >> 28 != 6 {
        return Err(PassNotTunnel);
    }
    if !is_tunnel_proto(ip.nexthdr) {
        return Err(behind_extensions(ctx, off, &ip));
    }
    let Some(value) = local(ip.daddr, FAMILY_V6) else {
        return Err(not_local(ip.nexthdr));
    };
    let checked_source = source_check(value, ip.nexthdr, ip.saddr, true)?;
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
        gue_port: value as u16,
        v6: true,
        checked_source,
        check_source: value & DECAP_F_CHECK_SOURCE != 0,
    })
}

/// An IPv6 packet whose fixed header's next header is not a tunnel. lb
/// never sends one, so it passes (`pass_not_tunnel`), unless it is a
/// tunnel after all, behind extension headers (a fragment header,
/// options), to a destination that takes tunnels only from
/// `LB_DECAP_FROM`, from a source outside it: the kernel's own `ip6_tunnel`
/// or `ip6_gre`, if loaded, would strip it, so it is dropped
/// (`drop_source_not_allowed`).
#[inline(always)]
fn behind_extensions(ctx: &XdpContext, off: usize, ip: &Ipv6Hdr) -> DecapCounter {
    if !is_walked_ext(ip.nexthdr) {
        return PassNotTunnel;
    }
    match local(ip.daddr, FAMILY_V6) {
        Some(value) if value & DECAP_F_CHECK_SOURCE != 0 && !allowed(ip.saddr, true) => {}
        _ => return PassNotTunnel,
    }
    let payload = u16::from_be(ip.payload_len) as usize;
    if hides_tunnel(ctx, off, ip.nexthdr, payload) {
        DropSource
    } else {
        PassNotTunnel
    }
}

/// Whether the extension headers after the IPv6 header at `off` (the
/// first of type `next`; `payload` bytes follow the fixed header) lead to
/// IP-in-IP or GRE, as the kernel would walk them, or run longer than lb
/// walks (`IPV6_MAX_EXT` headers, `IPV6_MAX_EXT_BYTES`: it cannot tell, so
/// yes). A later fragment says no: the first fragment, checked on its
/// own, decides what the kernel reassembles. A chain that ends before its
/// upper-layer header says no in a whole packet (the kernel drops it) and
/// yes in a first fragment (the kernel reassembles it: the rest of the
/// chain, a tunnel, may be in the next fragment). UDP says no: GUE is only
/// ever stripped here, and a fragment of it is not.
#[inline(always)]
fn hides_tunnel(ctx: &XdpContext, off: usize, mut next: u8, payload: usize) -> bool {
    // Bytes walked so far, at most IPV6_MAX_EXT_BYTES when used.
    let mut ext = 0usize;
    // Past the header of a first fragment: the chain may go on in the next.
    let mut fragmented = false;
    for _ in 0..IPV6_MAX_EXT {
        if !is_walked_ext(next) {
            return is_kernel_tunnel(next);
        }
        // Every walked header is at least 8 bytes, inside the packet.
        if ext + 8 > payload {
            return fragmented;
        }
        let Some(h) = At::<[u8; 8]>::new(ctx, off + IPV6_HDR_LEN + ext) else {
            return fragmented;
        };
        let h = h.read();
        if next == IPV6_FRAGMENT {
            let frag = u16::from_be_bytes([h[2], h[3]]);
            if frag & 0xfff8 != 0 {
                return false;
            }
            fragmented |= frag & 1 != 0;
        }
        ext += ext_len(next, &h);
        next = h[0];
        if ext > IPV6_MAX_EXT_BYTES {
            return true;
        }
    }
    is_kernel_tunnel(next) || is_walked_ext(next)
}

/// IP-in-IP or GRE: what a kernel tunnel driver strips without a port.
#[inline(always)]
fn is_kernel_tunnel(proto: u8) -> bool {
    proto == PROTO_IPIP || proto == PROTO_IPV6 || proto == PROTO_GRE
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

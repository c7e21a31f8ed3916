//! Encapsulation toward a backend: grow the frame at the front, write the
//! Ethernet header (keeping a VLAN tag), the outer IPv4 or IPv6 header and,
//! for GRE, a 4-byte GRE header, for GUE an 8-byte UDP header. The inner
//! packet is not touched.
//!
//! The outer source is the configured address, or, with an outer source
//! prefix, the prefix with its host bits taken from the client's address
//! (its last word for IPv6 clients): a backend NIC that spreads packets by
//! outer addresses then spreads one balancer's tunnel over its queues.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BackendDef, DatapathConfig,
    consts::{
        ENCAP_GRE, ENCAP_GUE, ETH_P_IPV4, ETH_P_IPV6, FAMILY_V4, FAMILY_V6, GRE_HDR_LEN,
        IPV4_HDR_LEN, IPV6_HDR_LEN, OUTER_TTL, PROTO_GRE, PROTO_IPIP, PROTO_IPV6, PROTO_UDP,
        UDP_HDR_LEN, VLAN_HDR_LEN,
    },
};
use lb_ebpf::{
    csum,
    hdr::{EthHdr, GreHdr, IP_DF, Ipv4Hdr, Ipv6Hdr, UdpHdr, VlanHdr, be16, be32},
    parse::{Packet, ptr_at},
};

/// Why encapsulation failed (the frame could not be grown or re-read).
pub struct EncapError;

#[inline(always)]
fn mac_words(mac: &[u8; 6]) -> [u16; 3] {
    [
        u16::from_ne_bytes([mac[0], mac[1]]),
        u16::from_ne_bytes([mac[2], mac[3]]),
        u16::from_ne_bytes([mac[4], mac[5]]),
    ]
}

/// Bytes the encapsulation toward `backend` adds in front of the packet.
#[inline(always)]
pub fn overhead(backend: &BackendDef) -> u32 {
    let ip = if backend.family == FAMILY_V6 {
        IPV6_HDR_LEN
    } else {
        IPV4_HDR_LEN
    };
    (ip + tunnel_len(backend.encap)) as u32
}

/// The GRE or UDP header after the outer IP header, 0 for IP-in-IP.
#[inline(always)]
fn tunnel_len(encap: u8) -> usize {
    match encap {
        ENCAP_GRE => GRE_HDR_LEN,
        ENCAP_GUE => UDP_HDR_LEN,
        _ => 0,
    }
}

/// The GUE source port of a flow: from the flow hash, in the ephemeral
/// range 49152–65535 (RFC 6335), network order.
#[inline(always)]
pub fn gue_source_port(hash: u64) -> u16 {
    be16(0xc000 | ((hash >> 32) as u16 & 0x3fff))
}

/// Wraps the packet for `backend` and readdresses the frame to the gateway.
/// On success the frame is ready for `XDP_TX`.
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    backend: &BackendDef,
    pkt: &Packet,
    hash: u64,
) -> Result<(), EncapError> {
    let gre = backend.encap == ENCAP_GRE;
    let gue = backend.encap == ENCAP_GUE;
    let outer_v6 = backend.family == FAMILY_V6;
    let tun_len = tunnel_len(backend.encap);
    let overhead = overhead(backend) as usize;
    // Host bits of the outer source, from the client (masks are 0 without
    // an outer source prefix).
    let client = if pkt.family == FAMILY_V4 {
        pkt.src[0]
    } else {
        pkt.src[3]
    };

    // Our own MAC (the frame's destination) becomes the new source.
    let eth: *const EthHdr = ptr_at(ctx, 0).ok_or(EncapError)?;
    // SAFETY: bounds checked by `ptr_at`.
    let own_mac = unsafe { (*eth).h_dest };

    // SAFETY: `ctx.ctx` is the program's context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(overhead as i32)) } != 0 {
        return Err(EncapError);
    }

    let inner_proto = if pkt.family == FAMILY_V4 {
        PROTO_IPIP
    } else {
        PROTO_IPV6
    };
    let inner_ethertype = if pkt.family == FAMILY_V4 {
        ETH_P_IPV4
    } else {
        ETH_P_IPV6
    };
    let outer_ethertype = be16(if outer_v6 { ETH_P_IPV6 } else { ETH_P_IPV4 });
    let next = if gre {
        PROTO_GRE
    } else if gue {
        PROTO_UDP
    } else {
        inner_proto
    };

    let eth: *mut EthHdr = ptr_at(ctx, 0).ok_or(EncapError)?;
    let l3 = if pkt.l2_len as usize > core::mem::size_of::<EthHdr>() {
        let vlan: *mut VlanHdr = ptr_at(ctx, core::mem::size_of::<EthHdr>()).ok_or(EncapError)?;
        // SAFETY: both headers bounds checked by `ptr_at`.
        unsafe {
            (*eth).h_proto = pkt.vlan_tpid;
            (*vlan).tci = pkt.vlan_tci;
            (*vlan).encapsulated_proto = outer_ethertype;
        }
        core::mem::size_of::<EthHdr>() + VLAN_HDR_LEN
    } else {
        // SAFETY: bounds checked by `ptr_at`.
        unsafe { (*eth).h_proto = outer_ethertype };
        core::mem::size_of::<EthHdr>()
    };
    // SAFETY: bounds checked by `ptr_at`.
    unsafe {
        (*eth).h_dest = mac_words(&cfg.gw_mac);
        (*eth).h_source = own_mac;
    }

    let inner_len = pkt.ip_len as usize;
    if outer_v6 {
        let ip: *mut Ipv6Hdr = ptr_at(ctx, l3).ok_or(EncapError)?;
        let vtc = 6 << 28 | (pkt.tos as u32) << 20 | (hash as u32 & 0x000f_ffff);
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*ip).vtc_flow = be32(vtc);
            (*ip).payload_len = be16((inner_len + tun_len) as u16);
            (*ip).nexthdr = next;
            (*ip).hop_limit = OUTER_TTL;
            // Word by word: an array assignment would become a byte loop.
            (*ip).saddr[0] = cfg.src_v6[0];
            (*ip).saddr[1] = cfg.src_v6[1];
            (*ip).saddr[2] = cfg.src_v6[2];
            (*ip).saddr[3] =
                (cfg.src_v6[3] & !cfg.src_v6_host_mask) | (client & cfg.src_v6_host_mask);
            (*ip).daddr[0] = backend.addr[0];
            (*ip).daddr[1] = backend.addr[1];
            (*ip).daddr[2] = backend.addr[2];
            (*ip).daddr[3] = backend.addr[3];
        }
    } else {
        let ip: *mut Ipv4Hdr = ptr_at(ctx, l3).ok_or(EncapError)?;
        let tot_len = be16((inner_len + overhead) as u16);
        let frag_off = be16(IP_DF);
        let saddr = (cfg.src_v4 & !cfg.src_v4_host_mask) | (client & cfg.src_v4_host_mask);
        let daddr = backend.addr[0];
        // The checksum from the values rather than read back from the
        // packet: loading 16-bit words just stored a byte at a time stalls
        // store forwarding (6% of lb_xdp's samples forwarding on a veth).
        let check = csum::fold(
            u16::from_ne_bytes([0x45, pkt.tos]) as u32
                + tot_len as u32
                + frag_off as u32
                + u16::from_ne_bytes([OUTER_TTL, next]) as u32
                + csum::halves(saddr)
                + csum::halves(daddr),
        );
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*ip).version_ihl = 0x45;
            (*ip).tos = pkt.tos;
            (*ip).tot_len = tot_len;
            (*ip).id = 0;
            (*ip).frag_off = frag_off;
            (*ip).ttl = OUTER_TTL;
            (*ip).protocol = next;
            (*ip).check = check;
            (*ip).saddr = saddr;
            (*ip).daddr = daddr;
        }
    }
    debug_assert!(backend.family == FAMILY_V4 || backend.family == FAMILY_V6);

    let off = l3 + overhead - tun_len;
    if gre {
        let g: *mut GreHdr = ptr_at(ctx, off).ok_or(EncapError)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*g).flags_version = 0;
            (*g).protocol = be16(inner_ethertype);
        }
    } else if gue {
        let u: *mut UdpHdr = ptr_at(ctx, off).ok_or(EncapError)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*u).source = gue_source_port(hash);
            (*u).dest = cfg.gue_port;
            (*u).len = be16((inner_len + UDP_HDR_LEN) as u16);
            // Zero: no checksum (RFC 768 for IPv4; RFC 6935 and 6936 allow
            // it for tunnels over IPv6, and the inner packet carries its own).
            (*u).check = 0;
        }
    }
    Ok(())
}

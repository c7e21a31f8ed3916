//! Encapsulation toward a backend: grow the frame at the front, write the
//! Ethernet header (keeping a VLAN tag), the outer IPv4 or IPv6 header and,
//! for GRE, a 4-byte GRE header. The inner packet is not touched.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BackendDef, DatapathConfig,
    consts::{
        ENCAP_GRE, ETH_P_IPV4, ETH_P_IPV6, FAMILY_V4, FAMILY_V6, GRE_HDR_LEN, IPV4_HDR_LEN,
        IPV6_HDR_LEN, OUTER_TTL, PROTO_GRE, PROTO_IPIP, PROTO_IPV6, VLAN_HDR_LEN,
    },
};
use lb_ebpf::{
    csum,
    hdr::{EthHdr, GreHdr, IP_DF, Ipv4Hdr, Ipv6Hdr, VlanHdr, be16, be32},
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
    let outer_v6 = backend.family == FAMILY_V6;
    let gre_len = if gre { GRE_HDR_LEN } else { 0 };
    let overhead = if outer_v6 { IPV6_HDR_LEN } else { IPV4_HDR_LEN } + gre_len;

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
    let next = if gre { PROTO_GRE } else { inner_proto };

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
            (*ip).payload_len = be16((inner_len + gre_len) as u16);
            (*ip).nexthdr = next;
            (*ip).hop_limit = OUTER_TTL;
            // Word by word: an array assignment would become a byte loop.
            (*ip).saddr[0] = cfg.src_v6[0];
            (*ip).saddr[1] = cfg.src_v6[1];
            (*ip).saddr[2] = cfg.src_v6[2];
            (*ip).saddr[3] = cfg.src_v6[3];
            (*ip).daddr[0] = backend.addr[0];
            (*ip).daddr[1] = backend.addr[1];
            (*ip).daddr[2] = backend.addr[2];
            (*ip).daddr[3] = backend.addr[3];
        }
    } else {
        let ip: *mut Ipv4Hdr = ptr_at(ctx, l3).ok_or(EncapError)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*ip).version_ihl = 0x45;
            (*ip).tos = pkt.tos;
            (*ip).tot_len = be16((inner_len + overhead) as u16);
            (*ip).id = 0;
            (*ip).frag_off = be16(IP_DF);
            (*ip).ttl = OUTER_TTL;
            (*ip).protocol = next;
            (*ip).check = 0;
            (*ip).saddr = cfg.src_v4;
            (*ip).daddr = backend.addr[0];
            (*ip).check = csum::ipv4_header(ip as *const u16);
        }
    }
    debug_assert!(backend.family == FAMILY_V4 || backend.family == FAMILY_V6);

    if gre {
        let off = l3 + overhead - GRE_HDR_LEN;
        let g: *mut GreHdr = ptr_at(ctx, off).ok_or(EncapError)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            (*g).flags_version = 0;
            (*g).protocol = be16(inner_ethertype);
        }
    }
    Ok(())
}

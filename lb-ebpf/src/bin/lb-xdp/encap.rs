//! Encapsulation toward a backend: grow the frame at the front, write the
//! Ethernet header (keeping a VLAN tag), the outer IPv4 or IPv6 header and,
//! for GRE, a 4-byte GRE header, for GUE an 8-byte UDP header. The inner
//! packet is not touched.
//!
//! A packet with second-chance alternates is sent as GUE variant 0 whatever
//! the VIP's encapsulation: UDP to the GUE port, the GUE header and lb's
//! private data (the alternates list), 16 bytes plus 4 or 16 per alternate
//! (`lb_common::consts::GUE_HDR_LEN`).
//!
//! The outer source is the configured address, or, with an outer source
//! prefix, the prefix with its host bits taken from the client's address
//! (its last word for IPv6 clients): a backend NIC that spreads packets by
//! outer addresses then spreads one balancer's tunnel over its queues.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BackendDef, DatapathConfig,
    consts::{
        BACKEND_F_SECOND_CHANCE, ENCAP_GRE, ENCAP_GUE, ETH_HDR_LEN, ETH_P_IPV4, ETH_P_IPV6,
        FAMILY_V4, FAMILY_V6, GRE_HDR_LEN, GUE_HDR_LEN, IPV4_HDR_LEN, IPV6_HDR_LEN, OUTER_TTL,
        PROTO_GRE, PROTO_IPIP, PROTO_IPV6, PROTO_UDP, SC_HDR_LEN, SC_MAX_ALTERNATES,
        SC_MAX_OVERHEAD_V4, SC_MAX_OVERHEAD_V6, SC_TYPE, UDP_HDR_LEN, VLAN_HDR_LEN,
    },
};
use lb_ebpf::{
    access::At,
    csum,
    hdr::{
        AltAddr4, AltAddr6, EthHdr, GreHdr, GueHdr, IP_DF, Ipv4Hdr, Ipv6Hdr, ScHdr, UdpHdr,
        VlanHdr, be16, be32,
    },
    parse::Packet,
};

use crate::second_chance::Alternates;

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

/// The most bytes an encapsulation toward `backend` adds in front of a
/// packet: what the MTU check counts. For a backend of a second-chance VIP
/// that is the largest alternates header, for every packet of the VIP, so
/// that the MTU a client learns does not depend on the balancer; and for a
/// packet that carries a list (`listed`) whatever the backend says (while
/// second chance is turned off, the backends lose the flag a moment before
/// the VIP entry does).
#[inline(always)]
pub fn overhead(backend: &BackendDef, listed: bool) -> u32 {
    let v6 = backend.family == FAMILY_V6;
    if listed || backend.flags & BACKEND_F_SECOND_CHANCE != 0 {
        return if v6 {
            SC_MAX_OVERHEAD_V6
        } else {
            SC_MAX_OVERHEAD_V4
        } as u32;
    }
    let ip = if v6 { IPV6_HDR_LEN } else { IPV4_HDR_LEN };
    (ip + tunnel_len(backend.encap)) as u32
}

/// Bytes after the outer IP header of a second-chance packet with `count`
/// alternates: UDP, GUE, lb's header, the addresses.
#[inline(always)]
fn alternates_len(count: usize, v6: bool) -> usize {
    let addr = if v6 { 16 } else { 4 };
    UDP_HDR_LEN + GUE_HDR_LEN + SC_HDR_LEN + (count & SC_MAX_ALTERNATES) * addr
}

/// The GRE or UDP header after the outer IP header, 0 for IP-in-IP.
#[inline(always)]
pub fn tunnel_len(encap: u8) -> usize {
    match encap {
        ENCAP_GRE => GRE_HDR_LEN,
        ENCAP_GUE => UDP_HDR_LEN,
        _ => 0,
    }
}

/// The protocol (next header) of the outer IP header.
#[inline(always)]
pub fn next_header(encap: u8, inner_v4: bool) -> u8 {
    match encap {
        ENCAP_GRE => PROTO_GRE,
        ENCAP_GUE => PROTO_UDP,
        _ if inner_v4 => PROTO_IPIP,
        _ => PROTO_IPV6,
    }
}

/// The GUE source port of a flow: from the flow hash, in the ephemeral
/// range 49152–65535 (RFC 6335), network order.
#[inline(always)]
pub fn gue_source_port(hash: u64) -> u16 {
    be16(0xc000 | ((hash >> 32) as u16 & 0x3fff))
}

/// Wraps the packet for `backend` (with `alts`, if any: then as GUE
/// variant 0 carrying them) and readdresses the frame to the gateway.
/// On success the frame is ready for `XDP_TX`.
#[inline(always)]
pub fn encapsulate(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    backend: &BackendDef,
    pkt: &Packet,
    hash: u64,
    alts: Option<&Alternates>,
) -> Result<(), EncapError> {
    let outer_v6 = backend.family == FAMILY_V6;
    let (tun_len, next) = if let Some(alts) = alts {
        (alternates_len(alts.count, outer_v6), PROTO_UDP)
    } else {
        (
            tunnel_len(backend.encap),
            next_header(backend.encap, pkt.family == FAMILY_V4),
        )
    };
    let ip_len = if outer_v6 { IPV6_HDR_LEN } else { IPV4_HDR_LEN };
    let overhead = ip_len + tun_len;
    // Our own MAC (the frame's destination) becomes the new source.
    let own_mac = At::<EthHdr>::new(ctx, 0).ok_or(EncapError)?.read().h_dest;

    // SAFETY: `ctx.ctx` is the program's context; no packet pointer is
    // used across this call.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(overhead as i32)) } != 0 {
        return Err(EncapError);
    }

    let l3 = write_l2(ctx, cfg, pkt, own_mac, outer_v6)?;
    // Host bits of the outer source, from the client (masks are 0 without
    // an outer source prefix).
    let client = if pkt.family == FAMILY_V4 {
        pkt.src[0]
    } else {
        pkt.src[3]
    };
    let inner_len = pkt.ip_len as usize;
    if outer_v6 {
        let ip = At::<Ipv6Hdr>::new(ctx, l3).ok_or(EncapError)?;
        let vtc = 6 << 28 | (pkt.tos as u32) << 20 | (hash as u32 & 0x000f_ffff);
        ip.set_vtc_flow(be32(vtc));
        ip.set_payload_len(be16((inner_len + tun_len) as u16));
        ip.set_nexthdr(next);
        ip.set_hop_limit(OUTER_TTL);
        let src = &cfg.src_v6;
        let last = (src[3] & !cfg.src_v6_host_mask) | (client & cfg.src_v6_host_mask);
        ip.set_saddr(&[src[0], src[1], src[2], last]);
        ip.set_daddr(&backend.addr);
    } else {
        let ip = At::<Ipv4Hdr>::new(ctx, l3).ok_or(EncapError)?;
        let saddr = (cfg.src_v4 & !cfg.src_v4_host_mask) | (client & cfg.src_v4_host_mask);
        write_ipv4(
            &ip,
            pkt.tos,
            (inner_len + overhead) as u16,
            next,
            saddr,
            backend.addr[0],
        );
    }
    debug_assert!(backend.family == FAMILY_V4 || backend.family == FAMILY_V6);

    let off = l3 + ip_len;
    if let Some(alts) = alts {
        return write_alternates(ctx, cfg, pkt, off, hash, alts, outer_v6);
    }
    write_tunnel(ctx, cfg, backend, pkt, off, hash)
}

/// The GRE header or the UDP header of GUE (variant 1) at `off`, after the
/// outer IP header; nothing for IP-in-IP.
#[inline(always)]
fn write_tunnel(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    backend: &BackendDef,
    pkt: &Packet,
    off: usize,
    hash: u64,
) -> Result<(), EncapError> {
    match backend.encap {
        ENCAP_GRE => {
            let g = At::<GreHdr>::new(ctx, off).ok_or(EncapError)?;
            g.set_flags_version(0);
            g.set_protocol(be16(if pkt.family == FAMILY_V4 {
                ETH_P_IPV4
            } else {
                ETH_P_IPV6
            }));
        }
        ENCAP_GUE => {
            let u = At::<UdpHdr>::new(ctx, off).ok_or(EncapError)?;
            u.set_source(gue_source_port(hash));
            u.set_dest(cfg.gue_port);
            u.set_len(be16((pkt.ip_len as usize + UDP_HDR_LEN) as u16));
            // Zero: no checksum (RFC 768 for IPv4; RFC 6935 and 6936 allow
            // it for tunnels over IPv6, and the inner packet carries its own).
            u.set_check(0);
        }
        _ => {}
    }
    Ok(())
}

/// The UDP and GUE headers and lb's alternates list at `off` (after the
/// outer IP header), as ARCHITECTURE.md lays them out.
#[inline(always)]
fn write_alternates(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
    off: usize,
    hash: u64,
    alts: &Alternates,
    outer_v6: bool,
) -> Result<(), EncapError> {
    let count = alts.count & SC_MAX_ALTERNATES;
    let tun_len = alternates_len(count, outer_v6);
    let u = At::<UdpHdr>::new(ctx, off).ok_or(EncapError)?;
    u.set_source(gue_source_port(hash));
    u.set_dest(cfg.gue_port);
    u.set_len(be16((pkt.ip_len as usize + tun_len) as u16));
    u.set_check(0);
    // hlen: words of private data, lb's header and the addresses.
    let words = (tun_len - UDP_HDR_LEN - GUE_HDR_LEN) / 4;
    let g = At::<GueHdr>::new(ctx, off + UDP_HDR_LEN).ok_or(EncapError)?;
    g.set_ver_c_hlen(words as u8);
    g.set_proto_ctype(if pkt.family == FAMILY_V4 {
        PROTO_IPIP
    } else {
        PROTO_IPV6
    });
    g.set_flags(0);
    let list = off + UDP_HDR_LEN + GUE_HDR_LEN;
    let h = At::<ScHdr>::new(ctx, list).ok_or(EncapError)?;
    h.set_kind(be16(SC_TYPE));
    h.set_next(0);
    h.set_count(count as u8);
    let first = list + SC_HDR_LEN;
    for i in 0..SC_MAX_ALTERNATES {
        if i >= count {
            break;
        }
        // Checked a moment ago by `second_chance::alternates`; a backend
        // retired since then (its handle stays, its family goes to 0)
        // fails the packet rather than list a stranger or 0.0.0.0.
        let def = crate::backend_of(alts.handles[i]).ok_or(EncapError)?;
        if def.family != if outer_v6 { FAMILY_V6 } else { FAMILY_V4 } {
            return Err(EncapError);
        }
        if outer_v6 {
            At::<AltAddr6>::new(ctx, first + 16 * i)
                .ok_or(EncapError)?
                .set_addr(&def.addr);
        } else {
            At::<AltAddr4>::new(ctx, first + 4 * i)
                .ok_or(EncapError)?
                .set_addr(def.addr[0]);
        }
    }
    Ok(())
}

/// Readdresses the grown frame from us (`own_mac`) to the gateway, keeping
/// the VLAN tag, with the outer header's ethertype; returns where the
/// outer IP header starts.
#[inline(always)]
fn write_l2(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
    own_mac: [u16; 3],
    outer_v6: bool,
) -> Result<usize, EncapError> {
    let outer_ethertype = be16(if outer_v6 { ETH_P_IPV6 } else { ETH_P_IPV4 });
    let eth = At::<EthHdr>::new(ctx, 0).ok_or(EncapError)?;
    let l3 = if pkt.l2_len as usize > ETH_HDR_LEN {
        let vlan = At::<VlanHdr>::new(ctx, ETH_HDR_LEN).ok_or(EncapError)?;
        eth.set_proto(pkt.vlan_tpid);
        vlan.set_tci(pkt.vlan_tci);
        vlan.set_encapsulated_proto(outer_ethertype);
        ETH_HDR_LEN + VLAN_HDR_LEN
    } else {
        eth.set_proto(outer_ethertype);
        ETH_HDR_LEN
    };
    eth.set_dest(mac_words(&cfg.gw_mac));
    eth.set_source(own_mac);
    Ok(l3)
}

/// The outer IPv4 header: no options, DF set, TTL [`OUTER_TTL`].
#[inline(always)]
fn write_ipv4(ip: &At<Ipv4Hdr>, tos: u8, len: u16, next: u8, saddr: u32, daddr: u32) {
    let tot_len = be16(len);
    let frag_off = be16(IP_DF);
    // The checksum from the values rather than read back from the packet:
    // loading 16-bit words just stored a byte at a time stalls store
    // forwarding (6% of lb_xdp's samples forwarding on a veth).
    let check = csum::fold(
        u16::from_ne_bytes([0x45, tos]) as u32
            + tot_len as u32
            + frag_off as u32
            + u16::from_ne_bytes([OUTER_TTL, next]) as u32
            + csum::halves(saddr)
            + csum::halves(daddr),
    );
    ip.set_version_ihl(0x45);
    ip.set_tos(tos);
    ip.set_tot_len(tot_len);
    ip.set_id(0);
    ip.set_frag_off(frag_off);
    ip.set_ttl(OUTER_TTL);
    ip.set_protocol(next);
    ip.set_check(check);
    ip.set_saddr(saddr);
    ip.set_daddr(daddr);
}

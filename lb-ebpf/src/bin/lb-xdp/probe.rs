//! `lb_probe_encap`: a TC egress program on the balancer's interfaces that
//! tunnels `lbd`'s own health probes. A probe through the tunnel is a TCP
//! connection from the balancer to the VIP whose socket carries
//! `probe_mark(backend index, gre)`; this program wraps each such packet for
//! that backend (same outer header as `lb_xdp` writes: IPIP, GRE or GUE as
//! the backend's definition says, outer source from `LB_CONFIG`, outer
//! family = the packet's, DF set) and lets it go. (The mark's GRE bit is
//! informational: the backend's definition is authoritative.) Anything
//! else goes out untouched. A probe it cannot wrap (its backend's entry
//! gone or of the other family, the room not grown) is dropped, so the
//! probe fails, the right verdict: sent plainly to the VIP it could reach
//! another balancer, through which another backend would answer for the
//! one probed.
//!
//! The backend's reply comes straight back from the VIP (direct server
//! return) and `lb_xdp` passes it to the stack as non-VIP traffic.

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_F_ADJ_ROOM_ENCAP_L4_GRE,
        BPF_F_ADJ_ROOM_ENCAP_L4_UDP, TC_ACT_OK, TC_ACT_SHOT,
    },
    macros::classifier,
    programs::TcContext,
};
use lb_common::consts::{
    BACKEND_INDEX_MASK, ENCAP_GRE, ENCAP_GUE, ETH_HDR_LEN, ETH_P_IPV4, ETH_P_IPV6, FAMILY_V4,
    FAMILY_V6, IPV4_HDR_LEN, IPV6_HDR_LEN, OUTER_TTL, PROBE_MARK, PROBE_MARK_MASK, UDP_HDR_LEN,
};
use lb_ebpf::{
    csum,
    hdr::{GreHdr, IP_DF, Ipv4Hdr, Ipv6Hdr, UdpHdr, be16, be32},
};

use crate::{
    encap::{next_header, tunnel_len},
    maps::{LB_BACKENDS, LB_CONFIG},
};

/// `bpf_skb_adjust_room` mode: grow right after the MAC header.
const BPF_ADJ_ROOM_MAC: u32 = 1;

#[classifier]
pub fn lb_probe_encap(ctx: TcContext) -> i32 {
    // SAFETY: the context's skb pointer is valid for the program's run.
    let mark = unsafe { (*ctx.skb.skb).mark };
    if mark & PROBE_MARK_MASK != PROBE_MARK {
        return TC_ACT_OK;
    }
    match wrap(&ctx, mark) {
        Ok(()) => TC_ACT_OK,
        Err(()) => TC_ACT_SHOT,
    }
}

/// Wraps the probe marked `mark` for its backend.
#[inline(always)]
fn wrap(ctx: &TcContext, mark: u32) -> Result<(), ()> {
    let backend = LB_BACKENDS.get(mark & BACKEND_INDEX_MASK).ok_or(())?;
    let cfg = LB_CONFIG.get(0).ok_or(())?;
    let ethertype: u16 = ctx.load(12).map_err(|_| ())?;
    let v4 = ethertype == be16(ETH_P_IPV4);
    if !v4 && ethertype != be16(ETH_P_IPV6) {
        return Err(());
    }
    // Only same-family tunnels: the frame keeps its ethertype.
    if backend.family != if v4 { FAMILY_V4 } else { FAMILY_V6 } {
        return Err(());
    }
    let tun_len = tunnel_len(backend.encap);
    let ip_len = if v4 { IPV4_HDR_LEN } else { IPV6_HDR_LEN };
    let inner_len = ctx.len() as usize - ETH_HDR_LEN;
    ctx.adjust_room(
        (ip_len + tun_len) as i32,
        BPF_ADJ_ROOM_MAC,
        room_flags(v4, backend.encap),
    )
    .map_err(|_| ())?;
    let next = next_header(backend.encap, v4);
    if v4 {
        let len = (IPV4_HDR_LEN + tun_len + inner_len) as u16;
        let ip = outer_ipv4(len, next, cfg.src_v4, backend.addr[0]);
        ctx.store(ETH_HDR_LEN, &ip, 0).map_err(|_| ())?;
    } else {
        let ip = Ipv6Hdr {
            vtc_flow: be32(6 << 28),
            payload_len: be16((tun_len + inner_len) as u16),
            nexthdr: next,
            hop_limit: OUTER_TTL,
            saddr: cfg.src_v6,
            daddr: backend.addr,
        };
        ctx.store(ETH_HDR_LEN, &ip, 0).map_err(|_| ())?;
    }
    let off = ETH_HDR_LEN + ip_len;
    match backend.encap {
        ENCAP_GRE => {
            let g = GreHdr {
                flags_version: 0,
                protocol: ethertype,
            };
            ctx.store(off, &g, 0).map_err(|_| ())?;
        }
        ENCAP_GUE => {
            let u = UdpHdr {
                // Any port of the ephemeral range: one per backend.
                source: be16(0xc000 | (mark & 0x3fff) as u16),
                dest: cfg.gue_port,
                len: be16((UDP_HDR_LEN + inner_len) as u16),
                check: 0,
            };
            ctx.store(off, &u, 0).map_err(|_| ())?;
        }
        _ => {}
    }
    Ok(())
}

/// `bpf_skb_adjust_room` flags for the outer header and tunnel.
#[inline(always)]
fn room_flags(v4: bool, encap: u8) -> u64 {
    let l3 = if v4 {
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4
    } else {
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV6
    };
    let l4 = match encap {
        ENCAP_GRE => BPF_F_ADJ_ROOM_ENCAP_L4_GRE,
        ENCAP_GUE => BPF_F_ADJ_ROOM_ENCAP_L4_UDP,
        _ => 0,
    };
    (l3 | l4) as u64
}

/// An outer IPv4 header (DF set) with its checksum.
#[inline(always)]
fn outer_ipv4(len: u16, next: u8, saddr: u32, daddr: u32) -> Ipv4Hdr {
    let mut ip = Ipv4Hdr {
        version_ihl: 0x45,
        tos: 0,
        tot_len: be16(len),
        id: 0,
        frag_off: be16(IP_DF),
        ttl: OUTER_TTL,
        protocol: next,
        check: 0,
        saddr,
        daddr,
    };
    // SAFETY: `ip` is a 20-byte header on the stack.
    ip.check = unsafe { csum::ipv4_header(&ip as *const Ipv4Hdr as *const u16) };
    ip
}

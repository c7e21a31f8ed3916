//! `lb_xdp`: the balancer. Parse; pass what the VIP filter proves is no
//! VIP's; forward an established flow straight from the connection table;
//! otherwise find the VIP, pick the backend by Maglev, record the flow;
//! encapsulate, `XDP_TX`. Every packet ends in exactly one outcome counter,
//! incremented here and nowhere else.
#![no_std]
#![no_main]

mod conntrack;
mod encap;
mod maglev;
mod maps;
mod probe;
mod stats;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use lb_common::{
    BackendDef, Counter, DatapathConfig, VIP_FILTER_WORDS, VipKey, VipMeta,
    consts::{
        BACKEND_F_USABLE, BACKEND_INDEX_MASK, CFG_F_ALL_PORTS_VIPS, CFG_F_DROP_MALFORMED,
        FAMILY_V4, VIP_F_NO_BACKENDS, VIP_F_NO_CONNTRACK,
    },
    flow::{ct_position, hash_v4, hash_v6, vip_filter_bit},
};
use lb_ebpf::{
    hdr::{TCP_ACK, TCP_SYN},
    parse::{Packet, Reject, parse},
};
use maps::{LB_BACKENDS, LB_CONFIG, LB_FLOWS, LB_VIP_FILTER, LB_VIPS};

#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    let (action, outcome) = run(&ctx);
    stats::count(outcome, frame_len);
    action
}

#[inline(always)]
fn run(ctx: &XdpContext) -> (u32, Counter) {
    let Some(cfg) = LB_CONFIG.get(0) else {
        // Unreachable: an array always has element 0.
        return (xdp_action::XDP_PASS, Counter::PassNotIp);
    };
    let pkt = match parse(ctx) {
        Ok(pkt) => pkt,
        Err(Reject::NotOurs(c)) => return (xdp_action::XDP_PASS, c),
        Err(Reject::Malformed(c)) => {
            let action = if cfg.flags & CFG_F_DROP_MALFORMED != 0 {
                xdp_action::XDP_DROP
            } else {
                xdp_action::XDP_PASS
            };
            return (action, c);
        }
    };
    if !maybe_vip(cfg, &pkt) {
        return (xdp_action::XDP_PASS, Counter::PassNotVip);
    }
    let hash = if pkt.family == FAMILY_V4 {
        hash_v4(pkt.src[0], pkt.dst[0], pkt.ports, pkt.proto)
    } else {
        hash_v6(&pkt.src, &pkt.dst, pkt.ports, pkt.proto)
    };
    let (bucket_index, tag) = ct_position(hash, cfg.ct_seed);
    let bucket = LB_FLOWS.get_ptr_mut(bucket_index & cfg.ct_mask);
    let syn = pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;

    // Established flows first: the connection table names the backend,
    // and the backend carries what the VIP would say (encapsulation, id),
    // so a hit needs no VIP lookup at all.
    if !syn
        && let Some(bucket) = bucket
        && let Some((way, handle)) = conntrack::find(bucket, tag)
    {
        match backend_of(handle) {
            Some(def) if def.flags & BACKEND_F_USABLE != 0 => {
                conntrack::touch(bucket, way, conntrack::now());
                return forward(ctx, cfg, def, &pkt, hash, Counter::FwdConntrack);
            }
            _ => stats::count(Counter::CtStale, pkt.frame_len),
        }
    }

    let Some(meta) = find_vip(cfg, &pkt) else {
        return (xdp_action::XDP_PASS, Counter::PassNotVip);
    };
    if meta.flags & VIP_F_NO_BACKENDS != 0 {
        stats::vip(meta.vip_id, pkt.frame_len);
        return (xdp_action::XDP_DROP, Counter::DropNoBackend);
    }
    let Some(def) = maglev::lookup(cfg, &meta, hash).and_then(backend_of) else {
        stats::vip(meta.vip_id, pkt.frame_len);
        return (xdp_action::XDP_DROP, Counter::DropNoBackend);
    };
    let outcome = match bucket {
        Some(bucket) if meta.flags & VIP_F_NO_CONNTRACK == 0 => {
            if conntrack::insert(bucket, tag, def.handle, conntrack::now()) {
                stats::count(Counter::CtEvicted, pkt.frame_len);
            }
            Counter::FwdMaglev
        }
        _ => Counter::FwdMaglevNoConntrack,
    };
    forward(ctx, cfg, def, &pkt, hash, outcome)
}

/// Encapsulates for `def` and counts the packet for its VIP and itself.
#[inline(always)]
fn forward(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    def: &BackendDef,
    pkt: &Packet,
    hash: u64,
    outcome: Counter,
) -> (u32, Counter) {
    if encap::encapsulate(ctx, cfg, def, pkt, hash).is_err() {
        return (xdp_action::XDP_DROP, Counter::DropEncap);
    }
    stats::vip(def.vip_id as u32, pkt.frame_len);
    stats::backend(def.handle & BACKEND_INDEX_MASK, pkt.frame_len);
    (xdp_action::XDP_TX, outcome)
}

/// The VIP filter: `false` proves the packet is no VIP's.
#[inline(always)]
fn maybe_vip(cfg: &DatapathConfig, pkt: &Packet) -> bool {
    let Some(filter) = LB_VIP_FILTER.get(0) else {
        return true;
    };
    let test = |port: u16| {
        let bit = vip_filter_bit(&pkt.dst, port, pkt.proto);
        // SAFETY: `bit / 64 < VIP_FILTER_WORDS` by construction of the bit.
        let word = unsafe {
            *filter
                .words
                .get_unchecked((bit / 64) as usize % VIP_FILTER_WORDS)
        };
        word & (1 << (bit % 64)) != 0
    };
    test(pkt.dport()) || (cfg.flags & CFG_F_ALL_PORTS_VIPS != 0 && test(0))
}

/// `{dst, dport, proto}`, then `{dst, 0, proto}` if all-ports VIPs exist.
#[inline(always)]
fn find_vip(cfg: &DatapathConfig, pkt: &Packet) -> Option<VipMeta> {
    let mut key = VipKey {
        addr: pkt.dst,
        port: pkt.dport(),
        proto: pkt.proto,
        family: pkt.family,
    };
    if let Some(meta) = LB_VIPS.get_ptr(key) {
        // SAFETY: a live value of a non-preallocated hash map.
        return Some(unsafe { *meta });
    }
    if cfg.flags & CFG_F_ALL_PORTS_VIPS == 0 {
        return None;
    }
    key.port = 0;
    // SAFETY: as above.
    LB_VIPS.get_ptr(key).map(|meta| unsafe { *meta })
}

/// The backend `handle` names, if it still occupies its index.
#[inline(always)]
fn backend_of(handle: u32) -> Option<&'static BackendDef> {
    let def = LB_BACKENDS.get(handle & BACKEND_INDEX_MASK)?;
    (def.handle == handle).then_some(def)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

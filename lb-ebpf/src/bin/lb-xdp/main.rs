//! `lb_xdp`: the balancer. Parse, find the VIP, pick the backend (connection
//! table, else Maglev), encapsulate, `XDP_TX`. Every packet ends in exactly
//! one outcome counter, incremented here and nowhere else.
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
    BackendDef, Counter, DatapathConfig, VipKey, VipMeta,
    consts::{
        BACKEND_F_USABLE, BACKEND_INDEX_MASK, CFG_F_ALL_PORTS_VIPS, CFG_F_DROP_MALFORMED,
        FAMILY_V4, VIP_F_NO_BACKENDS, VIP_F_NO_CONNTRACK,
    },
    flow::{ct_position, hash_v4, hash_v6},
};
use lb_ebpf::{
    hdr::{TCP_ACK, TCP_SYN},
    parse::{Packet, Reject, parse},
};
use maps::{LB_BACKENDS, LB_CONFIG, LB_FLOWS, LB_VIPS};

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
    let Some(meta) = find_vip(cfg, &pkt) else {
        return (xdp_action::XDP_PASS, Counter::PassNotVip);
    };
    stats::vip(meta.vip_id, pkt.frame_len);
    if meta.flags & VIP_F_NO_BACKENDS != 0 {
        return (xdp_action::XDP_DROP, Counter::DropNoBackend);
    }
    let hash = if pkt.family == FAMILY_V4 {
        hash_v4(pkt.src[0], pkt.dst[0], pkt.ports, pkt.proto)
    } else {
        hash_v6(&pkt.src, &pkt.dst, pkt.ports, pkt.proto)
    };
    let Some((backend, outcome)) = select_backend(cfg, &meta, &pkt, hash) else {
        return (xdp_action::XDP_DROP, Counter::DropNoBackend);
    };
    if encap::encapsulate(ctx, cfg, &meta, &backend, &pkt, hash).is_err() {
        return (xdp_action::XDP_DROP, Counter::DropEncap);
    }
    stats::backend(backend.handle & BACKEND_INDEX_MASK, pkt.frame_len);
    (xdp_action::XDP_TX, outcome)
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
fn backend_of(handle: u32) -> Option<BackendDef> {
    let def = LB_BACKENDS.get(handle & BACKEND_INDEX_MASK)?;
    (def.handle == handle).then_some(*def)
}

/// Connection table first (unless SYN or the VIP opted out), then Maglev.
#[inline(always)]
fn select_backend(
    cfg: &DatapathConfig,
    meta: &VipMeta,
    pkt: &Packet,
    hash: u64,
) -> Option<(BackendDef, Counter)> {
    if meta.flags & VIP_F_NO_CONNTRACK != 0 {
        let handle = maglev::lookup(cfg, meta, hash)?;
        return Some((backend_of(handle)?, Counter::FwdMaglevNoConntrack));
    }
    let (bucket_index, tag) = ct_position(hash, cfg.ct_seed);
    let bucket = LB_FLOWS.get_ptr_mut(bucket_index & cfg.ct_mask)?;
    let now = conntrack::now();
    let syn = pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if !syn && let Some((way, handle)) = conntrack::find(bucket, tag) {
        match backend_of(handle) {
            Some(def) if def.flags & BACKEND_F_USABLE != 0 => {
                conntrack::touch(bucket, way, now);
                return Some((def, Counter::FwdConntrack));
            }
            _ => stats::count(Counter::CtStale, pkt.frame_len),
        }
    }
    let handle = maglev::lookup(cfg, meta, hash)?;
    let def = backend_of(handle)?;
    if conntrack::insert(bucket, tag, handle, now) {
        stats::count(Counter::CtEvicted, pkt.frame_len);
    }
    Some((def, Counter::FwdMaglev))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

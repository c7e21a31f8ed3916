//! `lb_decap`: the backend side of lb's tunnels. The balancer wraps each
//! packet in IP-in-IP (4in4, 6in6, 4in6, 6in4), GRE or GUE toward the backend;
//! the kernels we run on have no ipip/gre/fou modules, so this program strips
//! the outer headers in XDP and passes the inner packet (addressed to a VIP
//! on the backend's `lo`) to the stack, as if it had arrived bare.
//!
//! Only packets addressed to one of the backend's own addresses
//! (`LB_DECAP_ADDRS`, written by `lb::decap`) are touched; everything else
//! passes unchanged. An address attached with `--from` takes tunnels only
//! from those prefixes (`LB_DECAP_FROM`); a tunnel from elsewhere is
//! dropped before anything is stripped or handed on. A tunnel packet to us that is malformed (outer or inner
//! header broken or cut short) is dropped: it is ours, nothing else on the
//! host can use it (no tunnel driver), and passing it would only show the
//! stack a protocol-4/41/47 packet it answers with ICMP "protocol
//! unreachable" toward the balancer. Every packet ends in exactly one
//! `DecapCounter`, incremented here and nowhere else.
//!
//! A GUE packet with lb's alternates list (second chance) is delivered
//! only if this host holds its TCP connection; otherwise it is handed on
//! to the next alternate (`XDP_TX`), or, with none left, delivered anyway
//! (`second_chance`).
//!
//! `lb_pass` (a bare `XDP_PASS`) lives in the same object for test rigs: on
//! veth, the peer of an interface that sends `XDP_TX` frames only receives
//! them with an XDP program attached.
#![no_std]
#![no_main]

mod decap;
mod maps;
mod second_chance;
mod tunnel;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use lb_common::counters::{DecapCounter, DecapKind};
use maps::LB_DECAP_COUNTERS;
use second_chance::Verdict;

#[xdp]
pub fn lb_decap(ctx: XdpContext) -> u32 {
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    let outcome = run(&ctx);
    count(outcome, frame_len);
    match outcome.kind() {
        DecapKind::Decap | DecapKind::Pass => xdp_action::XDP_PASS,
        DecapKind::Drop => xdp_action::XDP_DROP,
        DecapKind::Forward => xdp_action::XDP_TX,
    }
}

#[inline(always)]
fn run(ctx: &XdpContext) -> DecapCounter {
    let tunnel = match tunnel::parse(ctx) {
        Ok(t) => t,
        Err(outcome) => return outcome,
    };
    let mut outcome = tunnel.outcome;
    if let Some(list) = &tunnel.alternates {
        match second_chance::decide(ctx, &tunnel, list) {
            Verdict::Deliver(c) => outcome = c,
            Verdict::HandOn(next) => {
                return match second_chance::hand_on(ctx, &tunnel, list, next) {
                    Ok(()) => DecapCounter::FwdScNextHop,
                    // Not seen: `tunnel::parse` checked the list's bytes.
                    Err(second_chance::HandOnError) => DecapCounter::MalformedSc,
                };
            }
        }
    }
    match decap::strip(ctx, &tunnel) {
        Ok(()) => outcome,
        Err(decap::StripError) => DecapCounter::DropAdjustFailed,
    }
}

/// The packet's one outcome: the only write to `LB_DECAP_COUNTERS`.
#[inline(always)]
fn count(outcome: DecapCounter, bytes: u32) {
    if let Some(v) = LB_DECAP_COUNTERS.get_ptr_mut(outcome as u32) {
        // SAFETY: a per-CPU array element, written only by this CPU.
        unsafe {
            (*v).packets += 1;
            (*v).bytes += bytes as u64;
        }
    }
}

#[xdp]
pub fn lb_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

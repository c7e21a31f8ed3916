//! `lbctl trace`: in `lb_xdp_trace` (the program `lbd` swaps in while a
//! trace runs), each packet that matches `LB_TRACE`'s filter is described
//! into the ring buffer `LB_TRACE_EVENTS` once its outcome is known:
//! addresses, ports, outcome, flow hash, and the backend and tunnel it was
//! sent to. `lb_xdp` is compiled without any of it.
//!
//! A plain ring buffer rather than `aya-log`: the reader needs the fields
//! (to filter, to resolve the backend, to compute the Maglev slot), not a
//! formatted line, and a fixed-size record costs one copy per event with
//! no format string to walk.

use lb_common::{BackendDef, TraceEvent, TraceFilter};
use lb_ebpf::parse::Packet;

use crate::maps::{LB_TRACE, LB_TRACE_EVENTS, LB_TRACE_PACKET};

/// Notes what an event would carry of `pkt`, before its outcome is
/// decided. [`packet`] then reads the note, not `pkt`: were `pkt` read
/// after the decision, its fields would stay live through all of it, and
/// 6.1's verifier would prune far fewer of the decision's paths (this
/// note took `lb_xdp_trace` from 864,330 verified instructions to 542,305 on
/// Debian 12's 6.1).
#[inline(always)]
pub fn note(pkt: &Packet) {
    let Some(n) = LB_TRACE_PACKET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: `n` is this CPU's element of a per-CPU array; an XDP program
    // runs to its end on one CPU, so nothing else writes it meanwhile.
    unsafe {
        (*n).family = pkt.family;
        (*n).proto = pkt.proto;
        (*n).src = pkt.src;
        (*n).dst = pkt.dst;
        (*n).ports = pkt.ports;
        (*n).frame_len = pkt.frame_len;
    }
}

/// Describes the packet [`note`] noted (sent to `backend`, if any) if the
/// active trace's filter matches it. Inlined at each call site, though a
/// single called copy would be smaller: older verifiers (6.1's among
/// them) cannot track which values matter across a call between BPF functions,
/// gives up by treating every value as exact, and then explores
/// `lb_xdp_trace` past its million-instruction limit (measured on Debian
/// 12's 6.1: refused with a call, accepted inlined).
#[inline(always)]
pub fn packet(counter: u32, backend: Option<&BackendDef>, hash: u64) {
    let Some(filter) = LB_TRACE.get(0) else {
        return;
    };
    let Some(pkt) = LB_TRACE_PACKET.get(0) else {
        return;
    };
    if !matches(filter, pkt) {
        return;
    }
    // Written in place in the ring, not built on the stack and copied: the
    // traced program's stack (the caller's frame plus this one) must stay
    // within the verifier's 512 bytes. A full ring drops the event: the
    // reader is behind, the packet is not.
    let Some(mut entry) = LB_TRACE_EVENTS.reserve::<TraceEvent>(0) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved ring record of
    // `size_of::<TraceEvent>()` bytes, ours until submitted; every field is
    // written before the submit (`TraceEvent` has no implicit padding).
    unsafe {
        (*event).session = filter.session;
        (*event).counter = counter as u16;
        (*event).family = pkt.family;
        (*event).proto = pkt.proto;
        (*event).src = pkt.src;
        (*event).dst = pkt.dst;
        (*event).ports = pkt.ports;
        (*event).frame_len = pkt.frame_len;
        (*event).hash = hash;
        match backend {
            Some(b) => {
                (*event).backend = b.addr;
                (*event).backend_family = b.family;
                (*event).encap = b.encap;
            }
            None => {
                (*event).backend = [0; 4];
                (*event).backend_family = 0;
                (*event).encap = 0;
            }
        }
        (*event)._pad = [0; 6];
    }
    entry.submit(0);
}

#[inline(always)]
fn matches(f: &TraceFilter, pkt: &TraceEvent) -> bool {
    if f.vip_family != 0
        && (f.vip_family != pkt.family
            || f.vip_proto != pkt.proto
            || (f.vip_port != 0 && f.vip_port != (pkt.ports >> 16) as u16)
            || f.vip_addr[0] != pkt.dst[0]
            || f.vip_addr[1] != pkt.dst[1]
            || f.vip_addr[2] != pkt.dst[2]
            || f.vip_addr[3] != pkt.dst[3])
    {
        return false;
    }
    f.client_family == 0
        || (f.client_family == pkt.family
            && pkt.src[0] & f.client_mask[0] == f.client_net[0]
            && pkt.src[1] & f.client_mask[1] == f.client_net[1]
            && pkt.src[2] & f.client_mask[2] == f.client_net[2]
            && pkt.src[3] & f.client_mask[3] == f.client_net[3])
}

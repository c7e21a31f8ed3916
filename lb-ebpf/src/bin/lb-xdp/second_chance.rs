//! Second chance on the balancer: which packets carry alternates, and
//! which alternates.
//!
//! A TCP packet that is not a SYN and found no connection-table entry is
//! a mid-flow packet this balancer never placed (ECMP moved its flow here,
//! or this balancer restarted): exactly the packets whose backend may
//! differ from the one that holds the connection, when this balancer's
//! table differs from the one that placed the flow. For a VIP with second
//! chance such a packet goes to its Maglev backend as usual, carrying the
//! backends its flow has under the VIP's other tables (computed by `lbd`
//! into `LB_ALTERNATES`, one entry per Maglev slot: ARCHITECTURE.md,
//! "Second chance"). Each alternate is checked here: it must still hold
//! its handle, belong to the same VIP, share the packet's backend's family
//! (the list has one address size) and differ from that backend; the rest
//! are skipped. The table is written in place, not swapped, because an
//! alternate that passes these checks is always a backend the flow may
//! live on, whichever version of the table it came from.
//!
//! What is not here: SYNs, UDP and packets with an entry never reach this
//! module (they travel as before, with no extra bytes); encapsulation is
//! `encap`'s.

use lb_common::{
    BackendDef, DatapathConfig, VipMeta,
    consts::{
        FAMILY_V6, IPV6_HDR_LEN, PROTO_TCP, SC_MAX_ALTERNATES, TABLE_CHUNK_SLOTS, VIP_F_FRAG_HASH,
        VIP_F_SECOND_CHANCE,
    },
    flow::maglev_slot,
};
use lb_ebpf::parse::Packet;

use crate::maps::LB_ALTERNATES;

/// The alternates of one packet: `count` backend handles (checked: of the
/// family of the backend it goes to), in the order the backends try them.
/// Handles, not addresses: the program's stack (512 bytes, shared with the
/// trace writer in `lb_xdp_trace`) has no room for four 16-byte addresses
/// and their copies; `encap` reads each address once, as it writes it.
pub struct Alternates {
    pub count: usize,
    pub handles: [u32; SC_MAX_ALTERNATES + 1],
}

impl Alternates {
    /// No list: the packet travels as it would without second chance.
    pub const NONE: Alternates = Alternates {
        count: 0,
        handles: [0; SC_MAX_ALTERNATES + 1],
    };
}

/// Whether a packet of `meta`'s VIP that found no connection-table entry
/// gets alternates (the caller has ruled out SYNs): the VIP has second
/// chance and the packet is TCP. (A VIP that hashes fragments never has
/// second chance; the test keeps the slot below the one `pick` used.)
/// An IPv6 packet with extension headers gets none: a backend looks for
/// the TCP header right after the fixed one, so the list would cost its
/// bytes and do nothing.
#[inline(always)]
pub fn wanted(meta: &VipMeta, pkt: &Packet) -> bool {
    pkt.proto == PROTO_TCP
        && (pkt.family != FAMILY_V6 || pkt.l4_off == pkt.l2_len + IPV6_HDR_LEN as u32)
        && meta.flags & (VIP_F_SECOND_CHANCE | VIP_F_FRAG_HASH) == VIP_F_SECOND_CHANCE
}

/// The alternates of the flow with `hash` whose packet goes to `primary`.
/// At most three table entries are read, one cache line.
#[inline(always)]
pub fn alternates(
    cfg: &DatapathConfig,
    meta: &VipMeta,
    hash: u64,
    primary: &BackendDef,
) -> Alternates {
    let mut alts = Alternates::NONE;
    // The VIP's own M: at most the global one for a second-chance VIP
    // (validated), so the slot stays inside the VIP's region.
    let m = meta.maglev_size(cfg.table_size);
    if m == 0 || m > cfg.table_size {
        return alts;
    }
    let slot = maglev_slot(hash, m);
    let base = meta.alt_index as u32 * cfg.table_chunks;
    let Some(chunk) = LB_ALTERNATES.get_ptr(base + slot / TABLE_CHUNK_SLOTS) else {
        return alts;
    };
    let i = (slot % TABLE_CHUNK_SLOTS) as usize;
    // SAFETY: a live map value; `i < TABLE_CHUNK_SLOTS`.
    let handles = unsafe { *(*chunk).slots.get_unchecked(i) };
    for handle in handles {
        if handle == 0 {
            break;
        }
        if handle == primary.handle {
            continue;
        }
        let Some(def) = crate::backend_of(handle) else {
            continue;
        };
        if def.vip_id != primary.vip_id || def.family != primary.family {
            continue;
        }
        // The mask restates the bound for the verifier: count ≤ 3 here.
        alts.handles[alts.count & SC_MAX_ALTERNATES] = handle;
        alts.count += 1;
    }
    alts
}

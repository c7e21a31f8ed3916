//! The connection table: a set-associative hash table in one array map,
//! shared by all CPUs.
//!
//! A flow's seeded hash picks a bucket (one cache line) and a 32-bit tag.
//! Each of the bucket's ways is one 8-byte word `tag << 32 | handle`, read
//! and written whole, so a lookup on one CPU never sees half of an insert on
//! another. Each way also has a 16-bit stamp: the tick it was last seen and
//! its *activity class*, what its flow has paid to be kept: 0 (one packet),
//! 1 (confirmed: a second packet, or a handshake this balancer saw), then
//! one class more per packet, up to 3 (*active*: four packets, e.g. a
//! handshake, a request and the ACK of its answer). A flow is recorded by its first packet that is not a SYN
//! (SYNs are kept apart, in `syns.rs`). It takes a way holding the same
//! tag, else an empty way, else the way of the lowest class, the stalest
//! within it; an active way seen within the protection window (a minute,
//! `DatapathConfig::protect_ticks`, sized by `lbd` for the kernel's HZ) is
//! never taken, and a new flow that finds only such ways goes unrecorded
//! (`ct_insert_refused`: its Maglev backend, every packet).
//!
//! So a flood of spoofed SYNs never reaches the table (and a SYN on a
//! protected way's tuple goes to the way's backend: `main.rs`, `held_by`,
//! so no SYN moves a live flow); a flood of
//! one-packet flows, or of spoofed SYN + ACK pairs (two packets: class 1),
//! displaces only its own kind, bare handshakes, and flows idle for over a
//! minute; and a flow that has sent four packets keeps its way for as long
//! as it is seen at least once a minute, whatever a flood sends.
//!
//! Why not the kernel's LRU hash: a miss-and-insert there cost 260-600 ns
//! on our machines (measured with `BPF_PROG_TEST_RUN` before this table
//! was built: common and per-CPU LRUs, 64k to 4M entries), this table's
//! ~50 ns plus one cache miss.
//! Why not per CPU: on veth, virtio without RSS, or generic XDP, one flow's
//! packets are processed on whichever CPU scheduled the NAPI poll; a per-CPU
//! table then misses on the other CPUs and re-picks through Maglev, which
//! breaks the flow after a membership change. A shared table has the same
//! cost per hit and stays right when a flow changes CPU.

use aya_ebpf::helpers::generated::bpf_jiffies64;
use lb_common::{
    FlowBucket, FlowEntry,
    consts::{
        CT_CLASS_ACTIVE, CT_CLASS_CONFIRMED, CT_CLASS_NEW, CT_STAMP_CLASS_SHIFT,
        CT_STAMP_TICK_SHIFT, CT_STAMP_TIME, CT_WAYS,
    },
    ct_protected,
};

/// The current tick of the stamps' clock: jiffies >> 6, 256 ms at HZ=250,
/// 14 bits (wrapping after 70 minutes, 17.5 at HZ=1000; what the wrap
/// does to protection: `CT_STAMP_TIME`).
#[inline(always)]
pub fn now() -> u16 {
    // SAFETY: helper without arguments.
    (unsafe { bpf_jiffies64() } >> CT_STAMP_TICK_SHIFT) as u16 & CT_STAMP_TIME
}

/// The way holding `tag`, and its backend handle.
#[inline(always)]
pub fn find(bucket: *mut FlowBucket, tag: u32) -> Option<(usize, u32)> {
    for way in 0..CT_WAYS {
        // SAFETY: `bucket` is a live map value; one aligned 8-byte load.
        let e = unsafe { core::ptr::read_volatile(&(*bucket).entries[way]) };
        if e.tag() == tag && e != FlowEntry::EMPTY {
            return Some((way, e.handle()));
        }
    }
    None
}

/// A stamp of class `class` at tick `now`.
#[inline(always)]
fn stamp(class: u16, now: u16) -> u16 {
    class << CT_STAMP_CLASS_SHIFT | now
}

/// Marks `way` as seen now by a packet after the one that created it:
/// one class more, up to active. Writes only when the stamp changes (the
/// first few packets of a flow, then once per tick), so a busy flow
/// dirties its cache line once per tick, not on every packet. Returns the
/// way's stamp from before (its class and the tick it was last seen) if
/// that tick was an earlier one (the flow was idle since), or if the
/// entry had seen one packet only.
#[inline(always)]
pub fn touch(bucket: *mut FlowBucket, way: usize, now: u16) -> Option<u16> {
    // SAFETY: live map value, `way < CT_WAYS` (from `find`).
    unsafe {
        let slot = &mut (*bucket).stamps[way];
        let last = *slot;
        let (class, tick) = (last >> CT_STAMP_CLASS_SHIFT, last & CT_STAMP_TIME);
        let class = if class < CT_CLASS_ACTIVE {
            class + 1
        } else {
            class
        };
        let stamp_now = stamp(class, now);
        if last == stamp_now {
            return None;
        }
        *slot = stamp_now;
        (tick != now || last >> CT_STAMP_CLASS_SHIFT == CT_CLASS_NEW).then_some(last)
    }
}

/// Whether `way` is protected at tick `now` with a protection window of
/// `window` ticks (`lb_common::ct_protected`: no insert takes it, and no
/// SYN moves it: `main.rs`, `held_by` and `tracked`).
#[inline(always)]
pub fn protected(bucket: *mut FlowBucket, way: usize, now: u16, window: u16) -> bool {
    // SAFETY: live map value, `way < CT_WAYS` (from `find`).
    ct_protected(unsafe { (*bucket).stamps[way] }, now, window)
}

/// Points `way` (holding `tag`) at backend `handle`.
#[inline(always)]
pub fn set(bucket: *mut FlowBucket, way: usize, tag: u32, handle: u32) {
    // SAFETY: live map value, `way < CT_WAYS` (from `find`); one aligned
    // 8-byte store.
    unsafe { core::ptr::write_volatile(&mut (*bucket).entries[way], FlowEntry::new(tag, handle)) };
}

/// Eviction rank of a way (higher goes first): a way of the same flow,
/// then an empty one, then live entries by class (the lowest first) and
/// age (the stalest first within a class); an active way seen within
/// `window` ticks ranks [`RANK_PROTECTED`] and is never taken.
#[inline(always)]
fn eviction_rank(e: FlowEntry, stamp: u16, tag: u32, (now, window): (u16, u16)) -> u32 {
    if e == FlowEntry::EMPTY {
        RANK_EMPTY
    } else if e.tag() == tag {
        RANK_SAME_FLOW
    } else {
        let class = stamp >> CT_STAMP_CLASS_SHIFT;
        let age = now.wrapping_sub(stamp) & CT_STAMP_TIME;
        if ct_protected(stamp, now, window) {
            RANK_PROTECTED
        } else {
            let lower = u32::from(CT_CLASS_ACTIVE - class.min(CT_CLASS_ACTIVE));
            1 + ((lower << CT_STAMP_CLASS_SHIFT) | u32::from(age))
        }
    }
}

/// Below every other rank: never taken.
const RANK_PROTECTED: u32 = 0;
/// The live ranks are 1 + ((3 − class) << 14 | age), at most 0x1_0000;
/// classes 0 and 1 rank from this one up.
const RANK_CONFIRMED: u32 =
    1 + (((CT_CLASS_ACTIVE - CT_CLASS_CONFIRMED) as u32) << CT_STAMP_CLASS_SHIFT);
const RANK_EMPTY: u32 = 0x2_0000;
const RANK_SAME_FLOW: u32 = 0x3_0000;

/// What an insert displaced.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// Nothing live: the flow's own way or an empty one.
    Nothing,
    /// A live entry of class 0 or 1: one packet, or a confirmation only
    /// (what a spoofed SYN + ACK pair earns).
    Unconfirmed,
    /// A live entry of class 2 or more (traffic in more than one tick): an
    /// established flow lost its pinning.
    Confirmed,
    /// Nothing: every way holds an active flow seen recently. The new
    /// flow is not recorded.
    Refused,
}

/// Records `tag → handle` in the way [`eviction_rank`] puts first (the
/// first such way on a tie), unless every way is protected (at tick
/// `now`, within `window` ticks), at activity class `class`: `CT_CLASS_NEW`
/// for a first packet, `CT_CLASS_CONFIRMED` when its handshake was seen
/// or it moved (`moved_v6`).
#[inline(always)]
pub fn insert(
    bucket: *mut FlowBucket,
    tag: u32,
    handle: u32,
    (now, window): (u16, u16),
    class: u16,
) -> Evicted {
    let mut best = 0;
    let mut best_rank = 0u32;
    for way in 0..CT_WAYS {
        // SAFETY: live map value; `way < CT_WAYS`.
        let (e, stamp) = unsafe {
            (
                core::ptr::read_volatile(&(*bucket).entries[way]),
                (*bucket).stamps[way],
            )
        };
        let rank = eviction_rank(e, stamp, tag, (now, window));
        if way == 0 || rank > best_rank {
            best = way;
            best_rank = rank;
        }
    }
    if best_rank == RANK_PROTECTED {
        return Evicted::Refused;
    }
    // SAFETY: live map value; `best < CT_WAYS`; one aligned 8-byte store.
    unsafe {
        core::ptr::write_volatile(&mut (*bucket).entries[best], FlowEntry::new(tag, handle));
        (*bucket).stamps[best] = stamp(class, now);
    }
    if best_rank >= RANK_EMPTY {
        Evicted::Nothing
    } else if best_rank >= RANK_CONFIRMED {
        Evicted::Unconfirmed
    } else {
        Evicted::Confirmed
    }
}

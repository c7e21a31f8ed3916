//! The connection table: a set-associative hash table in one array map,
//! shared by all CPUs.
//!
//! A flow's seeded hash picks a bucket (one cache line) and a 32-bit tag.
//! Each of the bucket's ways is one 8-byte word `tag << 32 | handle`, read
//! and written whole, so a lookup on one CPU never sees half of an insert on
//! another. Each way also has a 16-bit stamp: when it was last seen and
//! whether it is *confirmed* (has seen a packet after the one that created
//! it). A flow is recorded by its first packet that is not a SYN (SYNs
//! are kept apart, in `syns.rs`): confirmed at once when it completes a
//! handshake this balancer saw, else unconfirmed. It takes a way holding
//! the same tag, else an empty way, else the stalest unconfirmed entry,
//! and only then the stalest confirmed one: a flood of spoofed SYNs never
//! reaches the table, and a flood of other one-packet flows displaces
//! only its own kind while established flows have their ways.
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
    consts::{CT_STAMP_CONFIRMED, CT_STAMP_TICK_SHIFT, CT_STAMP_TIME, CT_WAYS},
};

/// The current tick of the stamps' clock: jiffies >> 6, 256 ms at HZ=250,
/// 15 bits (wrapping after 2.3 hours; stamps only rank ways for eviction,
/// so wrapping is harmless).
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

/// Marks `way` as seen now by a packet after the one that created it:
/// confirmed. Writes only when the stamp changes, so a busy flow dirties
/// its cache line once per tick, not on every packet. Returns the tick
/// the way was last seen if that was before this one (the flow was idle).
#[inline(always)]
pub fn touch(bucket: *mut FlowBucket, way: usize, now: u16) -> Option<u16> {
    let stamp_now = CT_STAMP_CONFIRMED | now;
    // SAFETY: live map value, `way < CT_WAYS` (from `find`).
    unsafe {
        let stamp = &mut (*bucket).stamps[way];
        let last = *stamp;
        if last == stamp_now {
            return None;
        }
        *stamp = stamp_now;
        Some(last & CT_STAMP_TIME)
    }
}

/// Points `way` (holding `tag`) at backend `handle`.
#[inline(always)]
pub fn set(bucket: *mut FlowBucket, way: usize, tag: u32, handle: u32) {
    // SAFETY: live map value, `way < CT_WAYS` (from `find`); one aligned
    // 8-byte store.
    unsafe { core::ptr::write_volatile(&mut (*bucket).entries[way], FlowEntry::new(tag, handle)) };
}

/// Eviction rank of a way (higher goes first): a way of the same flow,
/// then an empty one, then unconfirmed entries (one packet seen, no
/// handshake), then confirmed ones; the stalest first within each class.
/// A flood of one-packet flows therefore only ever displaces other
/// one-packet entries while a confirmed flow has a way.
#[inline(always)]
fn eviction_rank(e: FlowEntry, stamp: u16, tag: u32, now: u16) -> u32 {
    if e == FlowEntry::EMPTY {
        RANK_EMPTY
    } else if e.tag() == tag {
        RANK_SAME_FLOW
    } else {
        let age = now.wrapping_sub(stamp) & CT_STAMP_TIME;
        let unconfirmed = if stamp & CT_STAMP_CONFIRMED == 0 {
            RANK_UNCONFIRMED
        } else {
            0
        };
        unconfirmed | age as u32
    }
}

/// Ranks above every age (15 bits).
const RANK_UNCONFIRMED: u32 = 0x1_0000;
const RANK_EMPTY: u32 = 0x2_0000;
const RANK_SAME_FLOW: u32 = 0x3_0000;

/// What an insert displaced.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// Nothing live: the flow's own way or an empty one.
    Nothing,
    /// A live entry that had seen one packet.
    Unconfirmed,
    /// A live entry that had seen more than one: an established flow lost
    /// its pinning.
    Confirmed,
}

/// Records `tag → handle` in the way [`eviction_rank`] puts first (the
/// first such way on a tie); `confirmed` when the flow is known to be
/// established already (its handshake was seen).
#[inline(always)]
pub fn insert(
    bucket: *mut FlowBucket,
    tag: u32,
    handle: u32,
    now: u16,
    confirmed: bool,
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
        let rank = eviction_rank(e, stamp, tag, now);
        if way == 0 || rank > best_rank {
            best = way;
            best_rank = rank;
        }
    }
    let stamp = if confirmed {
        CT_STAMP_CONFIRMED | now
    } else {
        now
    };
    // SAFETY: live map value; `best < CT_WAYS`; one aligned 8-byte store.
    unsafe {
        core::ptr::write_volatile(&mut (*bucket).entries[best], FlowEntry::new(tag, handle));
        (*bucket).stamps[best] = stamp;
    }
    if best_rank >= RANK_EMPTY {
        Evicted::Nothing
    } else if best_rank >= RANK_UNCONFIRMED {
        Evicted::Unconfirmed
    } else {
        Evicted::Confirmed
    }
}

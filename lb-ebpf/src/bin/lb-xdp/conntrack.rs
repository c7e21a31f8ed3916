//! The connection table: a set-associative hash table in one array map,
//! shared by all CPUs.
//!
//! A flow's seeded hash picks a bucket (one cache line) and a 32-bit tag.
//! Each of the bucket's ways is one 8-byte word `tag << 32 | handle`, read
//! and written whole, so a lookup on one CPU never sees half of an insert on
//! another. Each way also has a 16-bit stamp: when it was last seen and
//! whether it is *confirmed* (has seen a packet after the one that created
//! it). A new flow takes a way holding the same tag (a SYN replacing its
//! old entry), else an empty way, else the stalest unconfirmed entry, and
//! only then the stalest confirmed one: under a flood of spoofed SYNs
//! (or any one-packet flows) established flows keep their ways.
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
/// its cache line once per tick, not on every packet.
#[inline(always)]
pub fn touch(bucket: *mut FlowBucket, way: usize, now: u16) {
    let stamp_now = CT_STAMP_CONFIRMED | now;
    // SAFETY: live map value, `way < CT_WAYS` (from `find`).
    unsafe {
        let stamp = &mut (*bucket).stamps[way];
        if *stamp != stamp_now {
            *stamp = stamp_now;
        }
    }
}

/// Eviction rank of a way (higher goes first): a way of the same flow,
/// then an empty one, then unconfirmed entries (one packet seen: a SYN,
/// or a flow's first packet here), then confirmed ones; the stalest
/// first within each class. A flood of one-packet flows, spoofed SYNs
/// above all, therefore only ever displaces other one-packet entries
/// while a confirmed flow has a way.
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
    /// The flow's own way, unconfirmed and young: its previous packet (a
    /// SYN, for the callers that care) went to backend `handle` and was
    /// not followed by anything else from the client.
    Repeated { handle: u32 },
    /// A live entry that had seen one packet.
    Unconfirmed,
    /// A live entry that had seen more than one: an established flow lost
    /// its pinning.
    Confirmed,
}

/// Records `tag → handle`, unconfirmed, in the way [`eviction_rank`]
/// puts first (the first such way on a tie). `window`: how many stamp
/// ticks old the flow's own unconfirmed entry may be to count as
/// [`Evicted::Repeated`].
#[inline(always)]
pub fn insert(bucket: *mut FlowBucket, tag: u32, handle: u32, now: u16, window: u16) -> Evicted {
    let mut best = 0;
    let mut best_rank = 0u32;
    let mut best_entry = FlowEntry::EMPTY;
    let mut best_stamp = 0u16;
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
            best_entry = e;
            best_stamp = stamp;
        }
    }
    // SAFETY: live map value; `best < CT_WAYS`; one aligned 8-byte store.
    unsafe {
        core::ptr::write_volatile(&mut (*bucket).entries[best], FlowEntry::new(tag, handle));
        (*bucket).stamps[best] = now;
    }
    if best_rank == RANK_SAME_FLOW
        && best_stamp & CT_STAMP_CONFIRMED == 0
        && now.wrapping_sub(best_stamp) & CT_STAMP_TIME <= window
    {
        Evicted::Repeated {
            handle: best_entry.handle(),
        }
    } else if best_rank >= RANK_EMPTY {
        Evicted::Nothing
    } else if best_rank >= RANK_UNCONFIRMED {
        Evicted::Unconfirmed
    } else {
        Evicted::Confirmed
    }
}

//! The connection table: a set-associative hash table in one array map,
//! shared by all CPUs.
//!
//! A flow's seeded hash picks a bucket (one cache line) and a 32-bit tag.
//! Each of the bucket's ways is one 8-byte word `tag << 32 | handle`, read
//! and written whole, so a lookup on one CPU never sees half of an insert on
//! another. A new flow takes a way holding the same tag (a SYN replacing its
//! old entry), else an empty way, else the way seen longest ago.
//!
//! Why not the kernel's LRU hash: a miss-and-insert there costs ~400 ns on
//! these machines, this table's ~50 ns plus one cache miss (../shared/PERF-NOTES.md).
//! Why not per CPU: on veth, virtio without RSS, or generic XDP, one flow's
//! packets are processed on whichever CPU scheduled the NAPI poll; a per-CPU
//! table then misses on the other CPUs and re-picks through Maglev, which
//! breaks the flow after a membership change. A shared table has the same
//! cost per hit and stays right when a flow changes CPU.

use aya_ebpf::helpers::generated::bpf_jiffies64;
use lb_common::{FlowBucket, FlowEntry, consts::CT_WAYS};

/// Stamps are jiffies >> 8: ~1 s per tick at HZ=250, wrapping after ~18 h
/// (they only rank ways for eviction, so wrapping is harmless).
#[inline(always)]
pub fn now() -> u16 {
    // SAFETY: helper without arguments.
    (unsafe { bpf_jiffies64() } >> 8) as u16
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

/// Marks `way` as seen now. Writes only when the stamp changes, so a busy
/// flow does not dirty its cache line on every packet.
#[inline(always)]
pub fn touch(bucket: *mut FlowBucket, way: usize, now: u16) {
    // SAFETY: live map value, `way < CT_WAYS` (from `find`).
    unsafe {
        let stamp = &mut (*bucket).stamps[way];
        if *stamp != now {
            *stamp = now;
        }
    }
}

/// Records `tag → handle`; returns `true` if a live entry of another flow
/// was evicted to make room.
#[inline(always)]
pub fn insert(bucket: *mut FlowBucket, tag: u32, handle: u32, now: u16) -> bool {
    // Score each way: same tag beats empty beats age; the first best wins.
    let mut best = 0;
    let mut best_score = 0u32;
    let mut best_live = false;
    for way in 0..CT_WAYS {
        // SAFETY: live map value; `way < CT_WAYS`.
        let (e, stamp) = unsafe {
            (
                core::ptr::read_volatile(&(*bucket).entries[way]),
                (*bucket).stamps[way],
            )
        };
        let score = if e == FlowEntry::EMPTY {
            0x2_0000
        } else if e.tag() == tag {
            0x3_0000
        } else {
            now.wrapping_sub(stamp) as u32
        };
        if way == 0 || score > best_score {
            best = way;
            best_score = score;
            best_live = score < 0x2_0000;
        }
    }
    // SAFETY: live map value; `best < CT_WAYS`; one aligned 8-byte store.
    unsafe {
        core::ptr::write_volatile(&mut (*bucket).entries[best], FlowEntry::new(tag, handle));
        (*bucket).stamps[best] = now;
    }
    best_live
}

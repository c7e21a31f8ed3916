//! Recent SYNs: a direct-mapped array shared by all CPUs, one slot per
//! flow position (the connection-table bucket index modulo
//! [`SYN_SLOTS`]), holding the flow's tag, the backend its last SYN went
//! to, and when.
//!
//! A SYN writes here and never into the connection table: a flood of
//! spoofed SYNs costs one store into 1 MiB that stays in the caches and a
//! read of the flow's bucket (whether its tuple has a protected entry,
//! whose backend the SYN keeps: `main.rs`, `held_by`), where it used to
//! cost a write there, and it can displace no established flow. The flow is recorded by its next packet
//! (the handshake's ACK), which finds its SYN here and takes that SYN's
//! backend even if the table changed in between. A SYN that finds its own
//! flow's earlier SYN here, recent and unanswered, is a retransmission
//! (passive health). Passive health counts flows, not packets: a flow's
//! SYN counts once however often it is sent within the window, and its
//! retransmission once (the slot remembers it was counted), so one
//! spoofed tuple sent 100,000 times is one flow that retried. Slots are
//! overwritten freely: a lost slot costs a retransmission uncounted, or an
//! ACK placed by the Maglev table, as before the slot existed.

use lb_common::{FlowEntry, SynSlot, consts::CT_STAMP_TIME, consts::SYN_SLOTS};

use crate::maps::LB_SYNS;

/// The slot of the flow at connection-table bucket index `bucket_index`.
#[inline(always)]
pub fn slot(bucket_index: u32) -> Option<*mut SynSlot> {
    LB_SYNS.get_ptr_mut(bucket_index & (SYN_SLOTS - 1))
}

/// Whether a stamp `stamp` is at most `window` ticks before `now`.
#[inline(always)]
fn recent(stamp: u16, now: u16, window: u16) -> bool {
    now.wrapping_sub(stamp) & CT_STAMP_TIME <= window
}

/// What a SYN counts for passive health.
#[derive(Clone, Copy)]
pub enum SynSeen {
    /// The flow's first SYN within the window: one more flow.
    First,
    /// A retransmission: the first one of the flow, whose predecessor went
    /// to this backend (handle) unanswered.
    Retried(u32),
    /// A further retransmission: counted already.
    Again,
}

/// Records a SYN of flow `tag` sent to backend `handle` at `now`, and
/// says what it counts for: a new flow, its first retransmission within
/// `window` ticks (unanswered), or nothing new.
#[inline(always)]
pub fn record(slot: *mut SynSlot, tag: u32, handle: u32, now: u16, window: u16) -> SynSeen {
    // SAFETY: a live map value; the entry is one aligned 8-byte word.
    let (old, stamp, retried) = unsafe {
        (
            core::ptr::read_volatile(&(*slot).entry),
            (*slot).stamp,
            (*slot).retried,
        )
    };
    let repeat = old != FlowEntry::EMPTY && old.tag() == tag && recent(stamp, now, window);
    // SAFETY: as above; one aligned 8-byte store.
    unsafe {
        core::ptr::write_volatile(&mut (*slot).entry, FlowEntry::new(tag, handle));
        (*slot).stamp = now;
        (*slot).retried = u8::from(repeat);
    }
    match (repeat, retried) {
        (false, _) => SynSeen::First,
        (true, 0) => SynSeen::Retried(old.handle()),
        (true, _) => SynSeen::Again,
    }
}

/// The backend of a recent SYN of flow `tag`, the slot left as it is
/// (an ICMP error about the flow's handshake).
#[inline(always)]
pub fn peek(slot: *mut SynSlot, tag: u32, now: u16, window: u16) -> Option<u32> {
    // SAFETY: a live map value; one aligned 8-byte load.
    let (e, stamp) = unsafe { (core::ptr::read_volatile(&(*slot).entry), (*slot).stamp) };
    (e != FlowEntry::EMPTY && e.tag() == tag && recent(stamp, now, window)).then_some(e.handle())
}

/// The backend of a recent SYN of flow `tag`, if there is one no older
/// than `since` (a stamp: the SYN came after a packet seen then); the
/// slot is cleared, the SYN being answered.
#[inline(always)]
pub fn take(
    slot: *mut SynSlot,
    tag: u32,
    now: u16,
    window: u16,
    since: Option<u16>,
) -> Option<u32> {
    // SAFETY: a live map value; one aligned 8-byte load.
    let (e, stamp) = unsafe { (core::ptr::read_volatile(&(*slot).entry), (*slot).stamp) };
    if e == FlowEntry::EMPTY || e.tag() != tag || !recent(stamp, now, window) {
        return None;
    }
    if let Some(since) = since
        && now.wrapping_sub(stamp) & CT_STAMP_TIME > now.wrapping_sub(since) & CT_STAMP_TIME
    {
        return None;
    }
    // SAFETY: as above; one aligned 8-byte store.
    unsafe { core::ptr::write_volatile(&mut (*slot).entry, FlowEntry::EMPTY) };
    Some(e.handle())
}

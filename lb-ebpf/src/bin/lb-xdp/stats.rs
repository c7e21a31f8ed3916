//! Counting: the only writes to the counter maps.

use aya_ebpf::maps::PerCpuArray;
use lb_common::{Counter, CounterValue};

use crate::maps::{LB_BACKEND_STATS, LB_BACKEND_SYNS, LB_COUNTERS, LB_VIP_STATS};

#[inline(always)]
fn bump(map: &PerCpuArray<CounterValue>, index: u32, bytes: u32) {
    if let Some(v) = map.get_ptr_mut(index) {
        // SAFETY: a per-CPU array element, written only by this CPU.
        unsafe {
            (*v).packets += 1;
            (*v).bytes += bytes as u64;
        }
    }
}

/// The packet's one outcome, or an event on its way.
#[inline(always)]
pub fn count(counter: Counter, bytes: u32) {
    bump(&LB_COUNTERS, counter as u32, bytes);
}

#[inline(always)]
pub fn vip(vip_id: u32, bytes: u32) {
    bump(&LB_VIP_STATS, vip_id, bytes);
}

#[inline(always)]
pub fn backend(index: u32, bytes: u32) {
    bump(&LB_BACKEND_STATS, index, bytes);
}

/// A SYN sent to backend `index`; `repeat_of`: the backend index its
/// unanswered predecessor went to, if it is a retransmission.
#[inline(always)]
pub fn syn(index: u32, repeat_of: Option<u32>) {
    if let Some(c) = LB_BACKEND_SYNS.get_ptr_mut(index) {
        // SAFETY: a per-CPU value: no other writer.
        unsafe { (*c).syns += 1 };
    }
    if let Some(old) = repeat_of
        && let Some(c) = LB_BACKEND_SYNS.get_ptr_mut(old)
    {
        // SAFETY: as above.
        unsafe { (*c).retransmits += 1 };
    }
}

//! Counting: the only writes to the counter maps.

use aya_ebpf::maps::PerCpuArray;
use lb_common::{Counter, CounterValue};

use crate::maps::{LB_BACKEND_STATS, LB_COUNTERS, LB_VIP_STATS};

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

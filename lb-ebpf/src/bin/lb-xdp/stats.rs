//! Counting: the only writes to the counter maps.

use aya_ebpf::maps::PerCpuArray;
use lb_common::{Counter, CounterValue, consts::BACKEND_INDEX_MASK};

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

/// A SYN sent to backend `index`, as `seen` counts it: a flow's first
/// SYN counts one SYN for `index`; its first retransmission one for the
/// backend its unanswered predecessor went to; further ones nothing.
#[inline(always)]
pub fn syn(index: u32, seen: crate::syns::SynSeen) {
    use crate::syns::SynSeen;
    match seen {
        SynSeen::First => {
            if let Some(c) = LB_BACKEND_SYNS.get_ptr_mut(index) {
                // SAFETY: a per-CPU value: no other writer.
                unsafe { (*c).syns += 1 };
            }
        }
        SynSeen::Retried(old) => {
            if let Some(c) = LB_BACKEND_SYNS.get_ptr_mut(old & BACKEND_INDEX_MASK) {
                // SAFETY: as above.
                unsafe { (*c).retransmits += 1 };
            }
        }
        SynSeen::Again => {}
    }
}

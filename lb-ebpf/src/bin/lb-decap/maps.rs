//! The decap program's maps. `lb::decap` pins them next to the program's
//! link, so the addresses and counters outlive the process that attached it.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use lb_common::{CounterValue, DecapAddr, consts::DECAP_MAX_ADDRS, counters::DECAP_COUNTER_SLOTS};

/// The backend's own addresses: a tunnel packet is stripped only if its
/// outer destination is one of them. The value is the UDP port (network
/// order, low 16 bits) on which that address accepts GUE; 0: no GUE.
#[map]
pub static LB_DECAP_ADDRS: HashMap<DecapAddr, u32> = HashMap::with_max_entries(DECAP_MAX_ADDRS, 0);

/// One outcome per packet, per CPU, indexed by `DecapCounter`.
#[map]
pub static LB_DECAP_COUNTERS: PerCpuArray<CounterValue> =
    PerCpuArray::with_max_entries(DECAP_COUNTER_SLOTS, 0);

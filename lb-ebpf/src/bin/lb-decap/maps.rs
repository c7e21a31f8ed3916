//! The decap program's maps. `lb::decap` pins them next to the program's
//! link, so the addresses and counters outlive the process that attached it.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, LpmTrie, PerCpuArray},
};
use lb_common::{
    AddrWords, CounterValue, DecapAddr,
    consts::{DECAP_MAX_ADDRS, DECAP_MAX_FROM},
    counters::DECAP_COUNTER_SLOTS,
};

/// The backend's own addresses: a tunnel packet is stripped only if its
/// outer destination is one of them. The value is the UDP port (network
/// order, low 16 bits) on which that address accepts GUE (0: no GUE), and
/// `DECAP_F_CHECK_SOURCE` if its tunnels must come from `LB_DECAP_FROM`.
#[map]
pub static LB_DECAP_ADDRS: HashMap<DecapAddr, u32> = HashMap::with_max_entries(DECAP_MAX_ADDRS, 0);

/// The prefixes tunnels may come from (the balancers', and for second
/// chance the other backends'), IPv4 mapped into `::ffff:0:0/96`
/// (`lb_common::mapped_words`). The value is not read. Room for twice
/// the most a set holds: a set is replaced by adding the new prefixes
/// before removing the old.
#[map]
pub static LB_DECAP_FROM: LpmTrie<AddrWords, u32> =
    LpmTrie::with_max_entries(2 * DECAP_MAX_FROM, 0);

/// One outcome per packet, per CPU, indexed by `DecapCounter`.
#[map]
pub static LB_DECAP_COUNTERS: PerCpuArray<CounterValue> =
    PerCpuArray::with_max_entries(DECAP_COUNTER_SLOTS, 0);

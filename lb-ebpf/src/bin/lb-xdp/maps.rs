//! The balancer's maps. Sizes here are placeholders: `lbd` (and the tests)
//! set every size at load time from the configuration.

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use lb_common::{
    AltChunk, BackendDef, BfdConfig, BfdKey, BfdState, CounterValue, CtKey, DatapathConfig,
    FlowBucket, HashKey, SynCounts, SynSlot, TableChunk, TraceEvent, TraceFilter, VipFilter,
    VipKey, VipMeta,
    bfd::BFD_MAX_SESSIONS,
    consts::{SYN_SLOTS, TRACE_RING_BYTES},
    counters::COUNTER_SLOTS,
    quic::QuicServerKey,
};

/// One element: the global datapath configuration.
#[map]
pub static LB_CONFIG: Array<DatapathConfig> = Array::with_max_entries(1, 0);

/// `{address, port, protocol}` → VIP. Not preallocated, so that replacing a
/// value (the table swap) never lets a reader see a recycled element.
#[map]
pub static LB_VIPS: HashMap<VipKey, VipMeta> = HashMap::with_max_entries(64, BPF_F_NO_PREALLOC);

/// Backend index (low 16 bits of a handle) → tunnel endpoint.
#[map]
pub static LB_BACKENDS: Array<BackendDef> = Array::with_max_entries(256, 0);

/// Maglev table chunks: two halves per VIP.
#[map]
pub static LB_TABLES: Array<TableChunk> = Array::with_max_entries(2, 0);

/// Second chance: each second-chance VIP's alternates, one region of
/// `table_chunks` chunks per VIP (`VipMeta::alt_index`), written in place
/// by `lbd` (every alternate is checked before use, see `second_chance`).
#[map]
pub static LB_ALTERNATES: Array<AltChunk> = Array::with_max_entries(1, 0);

/// The connection table: one cache line per bucket. Mmapable so that the
/// value area is page aligned and no bucket straddles two cache lines.
#[map]
pub static LB_FLOWS: Array<FlowBucket> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Outcome and event counters, per CPU.
#[map]
pub static LB_COUNTERS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Per-VIP packets and bytes the datapath did not forward (no backend,
/// too big, encapsulation failed), per CPU. Forwarded packets are counted
/// per backend only; `lbd` adds a VIP's backends (and `LB_VIP_RETIRED`)
/// to this for the VIP's total, which saves a counter update per packet.
#[map]
pub static LB_VIP_STATS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(64, 0);

/// Per-VIP packets and bytes of backends that left the VIP (their
/// counters added when their index was freed): written by `lbd` only,
/// never by the program, and pinned so that a VIP's total survives a
/// restart.
#[map]
pub static LB_VIP_RETIRED: Array<CounterValue> = Array::with_max_entries(64, 0);

/// Per-backend packets and bytes forwarded, per CPU.
#[map]
pub static LB_BACKEND_STATS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(256, 0);

/// Per-backend SYNs and retransmitted SYNs, per CPU (passive health).
#[map]
pub static LB_BACKEND_SYNS: PerCpuArray<SynCounts> = PerCpuArray::with_max_entries(256, 0);

/// Recent SYNs, shared by all CPUs (see `syns.rs`).
#[map]
pub static LB_SYNS: Array<SynSlot> = Array::with_max_entries(SYN_SLOTS, 0);

/// One element: the VIP filter (see `lb_common::VipFilter`).
#[map]
pub static LB_VIP_FILTER: Array<VipFilter> = Array::with_max_entries(1, 0);

/// One element: which packets an active trace describes (read only while
/// `CFG_F_TRACE` is set).
#[map]
pub static LB_TRACE: Array<TraceFilter> = Array::with_max_entries(1, 0);

/// One element per CPU: what `lb_xdp_trace` notes of a packet before
/// deciding its outcome (see `trace.rs`). Not pinned: each loaded object
/// has its own, and `lb_xdp` never touches it.
#[map]
pub static LB_TRACE_PACKET: PerCpuArray<TraceEvent> = PerCpuArray::with_max_entries(1, 0);

/// Trace events, read by `lbctl trace` from the pinned map.
#[map]
pub static LB_TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);

/// BFD sessions by peer address: their configuration, written by `lbd`
/// only (see `bfd.rs`).
#[map]
pub static LB_BFD_PEERS: HashMap<BfdKey, BfdConfig> =
    HashMap::with_max_entries(BFD_MAX_SESSIONS, 0);

/// Each BFD session's state, written by this program only (`lbd` zeroes a
/// slot for a new session).
#[map]
pub static LB_BFD_STATE: Array<BfdState> = Array::with_max_entries(BFD_MAX_SESSIONS, 0);

/// QUIC-LB server IDs of the VIPs with `VIP_F_QUIC`: `{server ID, VIP
/// id}` → backend handle, written by `lbd` only (see `quic.rs`).
#[map]
pub static LB_QUIC_SERVERS: HashMap<QuicServerKey, u32> = HashMap::with_max_entries(256, 0);

/// The tier's secret hash key (`CFG_F_HASH_KEY`).
#[map]
pub static LB_HASH_KEY: Array<HashKey> = Array::with_max_entries(1, 0);

/// The box's secret key of the IPv6 connection-table hash
/// (`ct_hash_v6_keyed`), written by `lbd` before the program runs.
#[map]
pub static LB_CT_KEY: Array<CtKey> = Array::with_max_entries(1, 0);

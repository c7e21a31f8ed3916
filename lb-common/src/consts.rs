//! Map names, sizes, flag bits and protocol numbers shared by both sides.
//!
//! Flag values are part of the pinned-map ABI: a bit keeps its meaning forever;
//! a retired bit is left unused, never recycled.

/// Address family tags stored in [`crate::VipKey`] and [`crate::BackendDef`].
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// IP protocol numbers (IANA).
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IPIP: u8 = 4;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_IPV6: u8 = 41;
pub const PROTO_GRE: u8 = 47;
pub const PROTO_ICMPV6: u8 = 58;

/// Ethertypes, host order.
pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;

/// Encapsulation of a VIP's packets toward its backends ([`crate::VipMeta::encap`]).
/// The outer family is always the backend's family; the inner packet is untouched.
/// IP-in-IP: 4in4 (protocol 4), 6in6 (next header 41), 4in6 (next header 4), 6in4 (protocol 41).
pub const ENCAP_IPIP: u8 = 0;
/// GRE (RFC 2784) without key, checksum or sequence number: a 4-byte header after the outer IP header.
pub const ENCAP_GRE: u8 = 1;
/// GUE variant 1 (draft-ietf-intarea-gue), i.e. FOU: the inner IP packet
/// directly after an outer UDP header whose destination port is the GUE
/// port and whose source port comes from the flow hash (so the backend's
/// NIC spreads flows over its queues). UDP checksum 0.
pub const ENCAP_GUE: u8 = 2;

/// Default GUE destination port.
pub const GUE_PORT: u16 = 6080;
pub const UDP_HDR_LEN: usize = 8;

/// Second chance on the wire: GUE variant 0 (draft-ietf-intarea-gue), a
/// 4-byte GUE header (version 0, C 0, `hlen` words of private data, the
/// inner protocol 4 or 41, flags 0), then lb's private data: a 4-byte
/// header ([`SC_TYPE`], the index of the next alternate to try, the
/// number of alternates) and the alternates' addresses, 4 or 16 bytes
/// each (the outer header's family). Variant 1 (the inner IP header right
/// after UDP, first nibble 4 or 6) is what `encap: gue` sends; the first
/// two bits tell them apart. ARCHITECTURE.md draws it byte by byte.
pub const GUE_HDR_LEN: usize = 4;
/// lb's private data header after the GUE header.
pub const SC_HDR_LEN: usize = 4;
/// lb's private data type, network order on the wire (`LB`): GitHub's
/// GLB uses type 0 for its own hop list, so neither reads the other's.
pub const SC_TYPE: u16 = 0x4c42;
/// Most alternates a packet carries: also the hop limit, since a backend
/// forwards only to the alternate at index `next` and increments it.
pub const SC_MAX_ALTERNATES: usize = 3;
/// The largest second-chance header over IPv4: outer IPv4, UDP, GUE,
/// lb's header and three IPv4 alternates.
pub const SC_MAX_OVERHEAD_V4: usize =
    IPV4_HDR_LEN + UDP_HDR_LEN + GUE_HDR_LEN + SC_HDR_LEN + 4 * SC_MAX_ALTERNATES;
/// The same over IPv6 (three IPv6 alternates).
pub const SC_MAX_OVERHEAD_V6: usize =
    IPV6_HDR_LEN + UDP_HDR_LEN + GUE_HDR_LEN + SC_HDR_LEN + 16 * SC_MAX_ALTERNATES;

/// Outer header sizes.
pub const IPV4_HDR_LEN: usize = 20;
pub const IPV6_HDR_LEN: usize = 40;
pub const GRE_HDR_LEN: usize = 4;
pub const ETH_HDR_LEN: usize = 14;
pub const VLAN_HDR_LEN: usize = 4;

/// Outer header fields the balancer writes.
pub const OUTER_TTL: u8 = 64;

/// [`crate::VipMeta::flags`]: do not use the connection table for this VIP
/// (every packet is hashed through the Maglev table; UDP VIPs may opt out).
pub const VIP_F_NO_CONNTRACK: u16 = 1 << 0;
/// [`crate::VipMeta::flags`]: the VIP has no usable backend; its packets are
/// dropped and counted as `drop_no_backend`. The table halves are not read.
pub const VIP_F_NO_BACKENDS: u16 = 1 << 1;
/// [`crate::VipMeta::flags`]: fragment policy `hash` — every packet of the
/// VIP is hashed on its 3-tuple (addresses, protocol), so the fragments of
/// a datagram and the unfragmented packets of a flow reach the same
/// backend. Without it, fragments of the VIP are dropped.
pub const VIP_F_FRAG_HASH: u16 = 1 << 2;
/// [`crate::VipMeta::flags`]: `table_base` is the second half of the VIP's
/// table region, which starts `ceil(M / 1024)` chunks before it (the first
/// half when clear). Written by `lbd` with every table swap so that a
/// restarted `lbd` recovers each VIP's region from the map alone; the
/// datapath never reads it.
pub const VIP_F_SECOND_HALF: u16 = 1 << 3;
/// [`crate::VipMeta::flags`]: second chance. A TCP packet of the VIP that
/// is not a SYN and has no connection-table entry (a mid-flow packet this
/// balancer never placed) is sent to its Maglev backend with the flow's
/// alternates (the backends other tables give it) in lb's GUE list, and
/// is not recorded; the backend's `lb_decap` hands it on to the next
/// alternate unless it holds the connection (ARCHITECTURE.md, "Second
/// chance"). [`crate::VipMeta::alt_index`] names the VIP's alternates in
/// `LB_ALTERNATES`.
pub const VIP_F_SECOND_CHANCE: u16 = 1 << 4;
/// [`crate::VipMeta::flags`]: QUIC by connection ID (a UDP VIP with
/// `quic:`). A short-header packet without connection-table entry whose
/// connection ID carries one of the VIP's server IDs (`LB_QUIC_SERVERS`)
/// goes to that server if it is usable, and is not recorded; other
/// packets are hashed as usual. `aux_port` holds the VIP's
/// [`crate::quic::QuicParams`].
pub const VIP_F_QUIC: u16 = 1 << 5;
/// [`crate::VipMeta::flags`], the VIP's hash fields (`hash:` in the file):
/// each bit leaves one field of the 5-tuple out of the hash that picks a
/// new flow's backend (none set: the whole 5-tuple). See
/// [`crate::flow::select_fields`].
pub const VIP_F_HASH_NO_SPORT: u16 = 1 << 8;
pub const VIP_F_HASH_NO_DPORT: u16 = 1 << 9;
pub const VIP_F_HASH_NO_DST: u16 = 1 << 10;
pub const VIP_F_HASH_NO_PROTO: u16 = 1 << 11;
/// An IPv6 source is hashed on its /64 (privacy addresses change within
/// it); an IPv4 source whole.
pub const VIP_F_HASH_SRC_V6_64: u16 = 1 << 12;
/// Every hash-field bit.
pub const VIP_F_HASH_FIELDS: u16 = VIP_F_HASH_NO_SPORT
    | VIP_F_HASH_NO_DPORT
    | VIP_F_HASH_NO_DST
    | VIP_F_HASH_NO_PROTO
    | VIP_F_HASH_SRC_V6_64;

/// Auxiliary `LB_VIPS` keys, next to the VIPs themselves:
/// - `{addr, 0, proto, family | KEY_FRAGMENTS}` per VIP address and
///   protocol: fragments carry no ports to look a VIP up by, so this key
///   says what to do with them. Its value has `VIP_F_FRAG_HASH` set and
///   `aux_port` naming the VIP `{addr, aux_port, proto}` if that VIP's
///   fragment policy is `hash`; otherwise fragments are dropped.
/// - `{addr, 0, PROTO_ICMP or PROTO_ICMPV6, family}` per VIP address: the
///   address is a VIP's (ICMP echo, ICMP errors about its flows). The
///   value is not read.
///
/// `LB_VIPS` therefore holds up to three entries per VIP.
pub const KEY_FRAGMENTS: u8 = 0x80;
/// `LB_VIPS` entries per configured VIP, auxiliary keys included.
pub const VIP_KEYS_PER_VIP: u32 = 3;

/// [`crate::BackendDef::flags`]: connection-table entries pointing at this
/// backend are honoured (the backend is active, slow-starting or draining).
/// Without it (down, removed) an entry is a miss and the flow is re-picked.
pub const BACKEND_F_USABLE: u8 = 1 << 0;
/// [`crate::BackendDef::flags`]: the backend's VIP has second chance, so
/// its packets may carry an alternates list: the MTU check counts the
/// largest such header ([`SC_MAX_OVERHEAD_V4`], [`SC_MAX_OVERHEAD_V6`])
/// for every packet of the VIP, so that a client's path MTU never depends
/// on which balancer its packets cross.
pub const BACKEND_F_SECOND_CHANCE: u8 = 1 << 1;
/// [`crate::BackendDef::flags`]: the backend's VIP has `VIP_F_QUIC`, so a
/// connection-table hit of a UDP packet still reads its connection ID,
/// which decides when it names a usable server of the VIP: a client's
/// tuple reused by another connection (a NAT's or the client's own port
/// reuse) must not take that connection to the tuple's old server.
pub const BACKEND_F_QUIC: u8 = 1 << 2;

/// [`crate::DatapathConfig::flags`]: drop malformed or unsupported packets
/// (default: pass them to the kernel's stack, which makes its own decision).
pub const CFG_F_DROP_MALFORMED: u32 = 1 << 0;
/// [`crate::DatapathConfig::flags`]: at least one all-ports VIP (port 0) exists,
/// so a miss on `{addr, port, proto}` retries `{addr, 0, proto}`.
pub const CFG_F_ALL_PORTS_VIPS: u32 = 1 << 1;
/// [`crate::DatapathConfig::flags`]: answer ICMP/ICMPv6 echo requests to VIP
/// addresses.
pub const CFG_F_ICMP_ECHO: u32 = 1 << 2;
/// [`crate::DatapathConfig::flags`]: an IPv4 packet without DF that is too
/// big once encapsulated is passed to the kernel (default: dropped).
pub const CFG_F_PASS_TOO_BIG: u32 = 1 << 3;
/// [`crate::DatapathConfig::flags`]: a trace is active: `lb_xdp_trace`
/// (attached only then) describes the packets matching `LB_TRACE`'s filter
/// into `LB_TRACE_EVENTS`. `lb_xdp` has no tracing code.
pub const CFG_F_TRACE: u32 = 1 << 4;
/// [`crate::DatapathConfig::flags`]: the hash that picks a new flow's
/// backend is keyed with the secret in `LB_HASH_KEY` (`hash_key_file`):
/// without the key, nobody can tell which tuples reach which backend.
pub const CFG_F_HASH_KEY: u32 = 1 << 5;
/// [`crate::DatapathConfig::flags`]: the connection table's IPv6 flows are
/// not at the positions of [`crate::flow::hash_v6`] (the version that
/// introduced [`crate::flow::ct_hash_v6`] set it; kept for the versions
/// before [`CFG_F_CT_V6_KEYED`], which read it).
pub const CFG_F_CT_V6_SHORT: u32 = 1 << 6;
/// [`crate::DatapathConfig::flags`]: an IPv6 packet (not a SYN) that misses
/// the connection table also tries its flow's position under the unkeyed
/// hash of the version before, [`crate::flow::ct_hash_v6`], and moves an
/// entry found there to its own position. `lbd` sets it when it adopts
/// maps without [`CFG_F_CT_V6_KEYED`], or keyed maps a program without
/// the key ran on (a downgrade), and clears it [`CT_V6_LEGACY_SECS`]
/// later.
pub const CFG_F_CT_V6_LEGACY: u32 = 1 << 7;
/// [`crate::DatapathConfig::flags`]: the connection table's IPv6 flows are
/// at the positions of [`crate::flow::ct_hash_v6_keyed`] under the key in
/// `LB_CT_KEY`, which `lbd` wrote before it set this bit. Absent in maps
/// an older version made (see [`CFG_F_CT_V6_LEGACY`]).
pub const CFG_F_CT_V6_KEYED: u32 = 1 << 8;
/// Seconds `lbd` keeps [`CFG_F_CT_V6_LEGACY`] after adopting older maps:
/// an hour, far past the minute after which an idle flow's entry may be
/// taken by others anyway (`CT_PROTECT_TICKS`); every flow that sends a
/// packet in that hour moves on its first.
pub const CT_V6_LEGACY_SECS: u64 = 3600;

/// Bytes of the trace ring buffer (a power of two, a multiple of the page
/// size): a few thousand events.
pub const TRACE_RING_BYTES: u32 = 256 * 1024;

/// Maglev tables live in `LB_TABLES` as chunks of this many slots: one map
/// element per chunk keeps memory at 4 bytes per slot (an array of `u32` would
/// round every element up to 8 bytes) and makes a whole-table write a few
/// dozen map updates instead of 65,537.
pub const TABLE_CHUNK_SLOTS: u32 = 1024;

/// Ways per connection-table bucket: six 8-byte entries and six 2-byte stamps
/// fill one 64-byte cache line.
pub const CT_WAYS: usize = 6;

/// [`crate::FlowBucket::stamps`]: the top two bits are the way's activity
/// class (what its flow has paid to be kept), the low 14 bits the tick it
/// was last seen (`jiffies >> CT_STAMP_TICK_SHIFT`, see [`CT_STAMP_TIME`]).
pub const CT_STAMP_CLASS_SHIFT: u32 = 14;
/// The low 14 bits of a stamp: the tick (16,384 ticks: 70 minutes at
/// HZ=250, 17.5 at HZ=1000, before wrapping). Stamps rank ways, and the
/// wrap is not harmless for one thing: an active way idle for a whole
/// number of wraps, give or take the protection window, reads as
/// protected again for that window: an idle active way spends 1.5% of
/// its idle time so at HZ=250 (61 s of 70 minutes), 5.9% at HZ=1000 (61 s
/// of 17.5 minutes), holding its way and its tuple's SYNs.
pub const CT_STAMP_TIME: u16 = (1 << CT_STAMP_CLASS_SHIFT) - 1;
/// Class 0: one packet seen, and no handshake this balancer saw.
pub const CT_CLASS_NEW: u16 = 0;
/// Class 1: a second packet, or a handshake whose SYN went out from here
/// (a spoofed SYN followed by an ACK of the same tuple reaches this, for
/// two packets).
pub const CT_CLASS_CONFIRMED: u16 = 1;
/// Class 3, the highest: four packets seen (one more class per packet
/// after the first), e.g. a handshake, a request and the ACK of its
/// answer.
pub const CT_CLASS_ACTIVE: u16 = 3;
/// How long a way of class [`CT_CLASS_ACTIVE`] is protected after its
/// flow was last seen: never evicted (a new flow that finds every way of
/// its bucket so held goes to its Maglev backend unrecorded,
/// `ct_insert_refused`), and never moved by a SYN. 61.44 s: 240 ticks at
/// HZ=250. `lbd` writes it in ticks of the kernel's HZ
/// ([`crate::DatapathConfig::protect_window`]).
pub const CT_PROTECT_MS: u32 = 61_440;
/// [`crate::DatapathConfig::protect_window`] where `lbd` cannot learn
/// the kernel's HZ: 240 ticks, [`CT_PROTECT_MS`] at HZ=250, a quarter of
/// it at HZ=1000.
pub const CT_PROTECT_TICKS: u16 = 240;
/// The stamps' tick: 64 jiffies (256 ms at HZ=250, 64 ms at HZ=1000).
pub const CT_STAMP_TICK_SHIFT: u64 = 6;
/// How long a SYN in `LB_SYNS` stays recent: 10.24 s (40 ticks at
/// HZ=250), past Linux's second retransmission (3 s) and its third (7 s).
/// `lbd` writes it in ticks of the kernel's HZ
/// ([`crate::DatapathConfig::syn_window`]).
pub const CT_SYN_WINDOW_MS: u32 = 10_240;
/// [`crate::DatapathConfig::syn_window`] where `lbd` cannot learn the
/// kernel's HZ: 40 ticks, [`CT_SYN_WINDOW_MS`] at HZ=250, a quarter of it
/// at HZ=1000.
pub const CT_SYN_WINDOW_DEFAULT: u16 = 40;

/// The longest window the datapath reads: half the stamps' 16,384 ticks
/// (an age beyond it may be a wrapped one), all ones.
pub const CT_WINDOW_MAX: u16 = CT_STAMP_TIME >> 1;

/// `ms` milliseconds in stamp ticks of a kernel ticking `hz` times a
/// second, rounded up, from 1 to [`CT_WINDOW_MAX`] (what `lbd`
/// writes into [`crate::DatapathConfig`]).
pub const fn stamp_ticks(ms: u32, hz: u32) -> u32 {
    let jiffies = (ms as u64 * hz as u64).div_ceil(1000);
    let ticks = jiffies.div_ceil(1 << CT_STAMP_TICK_SHIFT);
    let max = CT_WINDOW_MAX as u64;
    if ticks == 0 {
        1
    } else if ticks > max {
        max as u32
    } else {
        ticks as u32
    }
}

/// Slots of `LB_SYNS`, the recent SYNs (a power of two): 16 bytes each,
/// 1 MiB in all, shared by all CPUs. A flow's slot is its
/// connection-table bucket index modulo this.
pub const SYN_SLOTS: u32 = 1 << 16;

/// A backend handle is `generation << 16 | index`. The index addresses
/// `LB_BACKENDS` and `LB_BACKEND_STATS`; the generation changes whenever an
/// index is given to a different backend, so a stale connection-table entry
/// can never reach the new occupant. Generation 0 is never used, so handle 0
/// means "no backend".
pub const BACKEND_INDEX_BITS: u32 = 16;
pub const BACKEND_INDEX_MASK: u32 = (1 << BACKEND_INDEX_BITS) - 1;
/// Largest number of backend slots the handle format can address.
pub const MAX_BACKENDS: u32 = 1 << BACKEND_INDEX_BITS;

/// `SO_MARK` of health probes sent through the tunnel: `PROBE_MARK |
/// [PROBE_MARK_GRE] | backend index`. The balancer's TC egress program
/// (`lb_probe_encap`) wraps packets carrying such a mark for that backend,
/// exactly as `lb_xdp` wraps client packets, so the probe proves the
/// backend's decapsulation and VIP set-up.
pub const PROBE_MARK: u32 = 0x4C42_0000;
pub const PROBE_MARK_MASK: u32 = 0xFFFE_0000;
pub const PROBE_MARK_GRE: u32 = 0x0001_0000;

/// The mark for a probe of backend `index` (the low 16 bits of its handle).
pub const fn probe_mark(index: u32, gre: bool) -> u32 {
    PROBE_MARK | if gre { PROBE_MARK_GRE } else { 0 } | (index & BACKEND_INDEX_MASK)
}

/// Map names in the object file and under the pin directory.
pub const MAP_CONFIG: &str = "LB_CONFIG";
pub const MAP_VIPS: &str = "LB_VIPS";
pub const MAP_BACKENDS: &str = "LB_BACKENDS";
pub const MAP_TABLES: &str = "LB_TABLES";
pub const MAP_FLOWS: &str = "LB_FLOWS";
pub const MAP_COUNTERS: &str = "LB_COUNTERS";
pub const MAP_VIP_STATS: &str = "LB_VIP_STATS";
pub const MAP_BACKEND_STATS: &str = "LB_BACKEND_STATS";
pub const MAP_VIP_FILTER: &str = "LB_VIP_FILTER";
pub const MAP_TRACE: &str = "LB_TRACE";
pub const MAP_BACKEND_SYNS: &str = "LB_BACKEND_SYNS";
pub const MAP_TRACE_EVENTS: &str = "LB_TRACE_EVENTS";
pub const MAP_SYNS: &str = "LB_SYNS";
pub const MAP_VIP_RETIRED: &str = "LB_VIP_RETIRED";
pub const MAP_ALTERNATES: &str = "LB_ALTERNATES";
pub const MAP_BFD_PEERS: &str = "LB_BFD_PEERS";
pub const MAP_BFD_STATE: &str = "LB_BFD_STATE";
/// The tier's secret hash key (one [`crate::HashKey`]), read only when
/// [`CFG_F_HASH_KEY`] is set.
pub const MAP_HASH_KEY: &str = "LB_HASH_KEY";
/// QUIC-LB server IDs: [`crate::quic::QuicServerKey`] → backend handle.
pub const MAP_QUIC_SERVERS: &str = "LB_QUIC_SERVERS";
/// The box's secret key of the IPv6 connection-table hash (one
/// [`crate::CtKey`]).
pub const MAP_CT_KEY: &str = "LB_CT_KEY";

/// Every map of the balancer object, in a stable order.
pub const ALL_MAPS: [&str; 20] = [
    MAP_CONFIG,
    MAP_VIPS,
    MAP_BACKENDS,
    MAP_TABLES,
    MAP_FLOWS,
    MAP_COUNTERS,
    MAP_VIP_STATS,
    MAP_BACKEND_STATS,
    MAP_VIP_FILTER,
    MAP_TRACE,
    MAP_TRACE_EVENTS,
    MAP_BACKEND_SYNS,
    MAP_SYNS,
    MAP_VIP_RETIRED,
    MAP_ALTERNATES,
    MAP_BFD_PEERS,
    MAP_BFD_STATE,
    MAP_HASH_KEY,
    MAP_QUIC_SERVERS,
    MAP_CT_KEY,
];

/// Name of the balancer's XDP program in the object file.
pub const PROG_LB: &str = "lb_xdp";
/// The same program with tracing compiled in, swapped into the links while
/// `lbctl trace` runs.
pub const PROG_LB_TRACE: &str = "lb_xdp_trace";
/// Name of the TC egress program that tunnels health probes.
pub const PROG_PROBE_ENCAP: &str = "lb_probe_encap";

/// The backend-side decapsulation object (`lb_decap`): its maps and programs.
/// Map names are also the file names under the decap pin directory.
pub const MAP_DECAP_ADDRS: &str = "LB_DECAP_ADDRS";
pub const MAP_DECAP_COUNTERS: &str = "LB_DECAP_COUNTERS";
pub const MAP_DECAP_FROM: &str = "LB_DECAP_FROM";

/// Every map of the decap object, in a stable order.
pub const ALL_DECAP_MAPS: [&str; 3] = [MAP_DECAP_ADDRS, MAP_DECAP_COUNTERS, MAP_DECAP_FROM];

/// Most local addresses `LB_DECAP_ADDRS` holds.
pub const DECAP_MAX_ADDRS: u32 = 256;

/// Most prefixes a set of `LB_DECAP_FROM` holds (the map has room for
/// two: the new set is added before the old one is removed).
pub const DECAP_MAX_FROM: u32 = 256;

/// In an `LB_DECAP_ADDRS` value, above the GUE port's 16 bits: tunnel
/// packets to this address must come from a prefix in `LB_DECAP_FROM`.
pub const DECAP_F_CHECK_SOURCE: u32 = 1 << 16;

/// Name of the decapsulation XDP program in the object file.
pub const PROG_DECAP: &str = "lb_decap";
/// Name of the trivial `XDP_PASS` program in the same object (for the peer
/// of a veth that receives `XDP_TX` frames).
pub const PROG_PASS: &str = "lb_pass";

/// Bits of the VIP filter: 16,384 bits (2 KiB, one map value) keep false
/// positives under 1% for a few dozen VIPs.
pub const VIP_FILTER_WORDS: usize = 256;

/// Words of the IPv6 connection-table key ([`crate::CtKey`]): one per
/// 32-bit word of the 5-tuple [`crate::flow::ct_hash_v6_keyed`] reads
/// (four per address, the ports, the protocol), and four more for its
/// second pass over the words a client chooses.
pub const CT_KEY_WORDS: usize = 14;

//! Every map key and value, with its exact layout.
//!
//! All types are `#[repr(C)]`, `Copy`, padded explicitly, and free of `bool`,
//! `Option` and Rust enums. Addresses are network-order bytes stored as `u32`
//! words exactly as a little-endian load from the packet gives them, so the
//! XDP program copies words without swapping. Ports are network order too.
//! A `const` assertion pins every size; `tests` below pins every offset.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::consts::{
    BACKEND_INDEX_MASK, CT_WAYS, FAMILY_V4, FAMILY_V6, SC_MAX_ALTERNATES, TABLE_CHUNK_SLOTS,
};

/// An IPv4 or IPv6 address as the datapath stores it: four words of
/// network-order bytes. IPv4 uses word 0 and leaves the rest zero.
pub type AddrWords = [u32; 4];

/// Converts an address to the datapath's word form and family tag.
pub fn addr_to_words(addr: IpAddr) -> (AddrWords, u8) {
    match addr {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

/// Word 2 of an IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`): bytes
/// `00 00 ff ff`.
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// An address as `LB_DECAP_FROM` keys hold it (after the prefix length):
/// IPv6 as it is, IPv4 mapped into `::ffff:0:0/96`, so that one trie holds
/// both and an IPv4 prefix of length n is 96 + n bits long.
pub fn mapped_words(addr: IpAddr) -> AddrWords {
    match addr_to_words(addr) {
        (w, FAMILY_V4) => [0, 0, V4_MAPPED_WORD, w[0]],
        (w, _) => w,
    }
}

/// Converts the datapath's word form back to an address; `None` for an
/// unknown family tag.
pub fn words_to_addr(words: &AddrWords, family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => Some(IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))),
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            for (i, w) in words.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

/// Key of `LB_VIPS`: one service, `{address, port, protocol}`. Port 0 is an
/// all-ports VIP, tried when the exact port has no entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    pub addr: AddrWords,
    /// Destination port, network order; 0 for all ports.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

impl VipKey {
    /// `port` is in host order.
    pub fn new(addr: IpAddr, port: u16, proto: u8) -> Self {
        let (addr, family) = addr_to_words(addr);
        Self {
            addr,
            port: port.to_be(),
            proto,
            family,
        }
    }

    pub fn ip(&self) -> Option<IpAddr> {
        words_to_addr(&self.addr, self.family)
    }

    /// Port in host order.
    pub fn port(&self) -> u16 {
        u16::from_be(self.port)
    }
}

/// Value of `LB_VIPS`. Replaced as a whole (the map is `BPF_F_NO_PREALLOC`,
/// so a reader never sees a half-written value); flipping `table_base` to the
/// other half of the VIP's table region is the atomic table swap, and a new
/// table size travels in the same write.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipMeta {
    /// Index into `LB_VIP_STATS` (below 2¹⁶: `max_vips` ≤ 65,535). Was
    /// the low half of a `u32` whose high half was always 0.
    pub vip_id: u16,
    /// With [`crate::consts::VIP_F_SECOND_CHANCE`]: the VIP's region of
    /// `LB_ALTERNATES` (its first chunk is `alt_index × table_chunks`).
    /// Took the high half of the `u32` VIP id, always written 0.
    pub alt_index: u16,
    /// First chunk of the active Maglev table half in `LB_TABLES`.
    pub table_base: u32,
    /// `VIP_F_*` bits.
    pub flags: u16,
    /// `ENCAP_*`.
    pub encap: u8,
    /// Bits 16-23 of the VIP's Maglev table size (see
    /// [`VipMeta::table_size`]). Was `_pad0` (always written 0) before
    /// per-VIP table sizes.
    pub table_size_hi: u8,
    /// Auxiliary fragment keys (see [`crate::consts::KEY_FRAGMENTS`]):
    /// the port (network order) of the VIP whose fragment policy is `hash`.
    /// A VIP's own entry with [`crate::consts::VIP_F_QUIC`]: its
    /// [`crate::quic::QuicParams`] ([`VipMeta::quic`]); 0 otherwise.
    pub aux_port: u16,
    /// Bits 0-15 of the VIP's Maglev table size. Was `_reserved` (always
    /// written 0) before per-VIP table sizes.
    pub table_size_lo: u16,
}

impl VipMeta {
    /// The VIP id as the maps index it.
    #[inline(always)]
    pub const fn id(&self) -> u32 {
        self.vip_id as u32
    }

    /// The VIP's own Maglev table size M (a prime below 2²⁴), as stored;
    /// 0 in entries written before per-VIP sizes, whose tables have the
    /// global size ([`VipMeta::maglev_size`]).
    #[inline(always)]
    pub const fn table_size(&self) -> u32 {
        ((self.table_size_hi as u32) << 16) | self.table_size_lo as u32
    }

    /// The VIP's QUIC-LB parameters, if it routes QUIC by connection ID.
    #[inline(always)]
    pub const fn quic(&self) -> Option<crate::quic::QuicParams> {
        if self.flags & crate::consts::VIP_F_QUIC == 0 {
            return None;
        }
        Some(crate::quic::QuicParams::unpack(self.aux_port))
    }

    /// Stores M (its low 24 bits; M is below 2²⁴).
    pub fn set_table_size(&mut self, m: u32) {
        self.table_size_hi = (m >> 16) as u8;
        self.table_size_lo = m as u16;
    }

    /// The M the datapath hashes this VIP's flows with: its own, or
    /// `global` ([`DatapathConfig::table_size`]) for an entry without one.
    #[inline(always)]
    pub const fn maglev_size(&self, global: u32) -> u32 {
        match self.table_size() {
            0 => global,
            m => m,
        }
    }
}

/// Value of `LB_BACKENDS`, indexed by the low 16 bits of a backend handle.
/// A backend belongs to exactly one VIP, so it also carries what the
/// datapath needs of that VIP to forward an established flow without
/// looking the VIP up: its encapsulation and id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendDef {
    /// Tunnel destination.
    pub addr: AddrWords,
    /// The handle of the backend that occupies this index now. A table slot
    /// or connection-table entry whose handle differs is stale.
    pub handle: u32,
    /// The VIP this backend serves (index of `LB_VIP_STATS`; also lets
    /// `lbd` rebuild its view from pinned maps after a restart).
    pub vip_id: u16,
    /// `BACKEND_F_*` bits.
    pub flags: u8,
    /// `FAMILY_*`; 0 marks a free index (its `handle` keeps the last
    /// generation so the next occupant gets a new one).
    pub family: u8,
    /// The VIP's `ENCAP_*`.
    pub encap: u8,
    pub _pad: [u8; 7],
}

impl BackendDef {
    pub fn index(&self) -> u32 {
        self.handle & BACKEND_INDEX_MASK
    }

    pub fn ip(&self) -> Option<IpAddr> {
        words_to_addr(&self.addr, self.family)
    }
}

/// The single element of `LB_CONFIG`: what the datapath needs besides the
/// per-VIP and per-backend maps, plus the layout the maps were created with
/// (checked when `lbd` adopts pinned maps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// `CFG_F_*` bits.
    pub flags: u32,
    /// The default Maglev table size M (prime): of VIPs that set none, and
    /// of every `LB_VIPS` entry written before per-VIP sizes (whose
    /// [`VipMeta::table_size`] is 0).
    pub table_size: u32,
    /// Chunks of [`TABLE_CHUNK_SLOTS`] per table half of size `table_size`:
    /// `ceil(M / 1024)`.
    pub table_chunks: u32,
    /// Connection-table buckets minus one (bucket count is a power of two).
    pub ct_mask: u32,
    /// Secret mixed into the connection-table index so that flows cannot be
    /// aimed at one bucket from outside. Random when the maps are created,
    /// kept when they are adopted.
    pub ct_seed: u64,
    /// Destination MAC of every forwarded frame (the next-hop router).
    pub gw_mac: [u8; 6],
    pub _pad0: [u8; 2],
    /// Outer source address for IPv4 tunnels.
    pub src_v4: u32,
    /// An active connection-table entry seen within this many stamp ticks
    /// is protected ([`ct_protected`]): [`crate::consts::CT_PROTECT_MS`]
    /// in ticks of the kernel's HZ, or [`crate::consts::CT_PROTECT_TICKS`]
    /// where `lbd` cannot learn HZ; always written (0 protects nothing
    /// past the current tick). Was `_pad1` (always 0) before.
    pub protect_window: u32,
    /// Outer source address for IPv6 tunnels.
    pub src_v6: AddrWords,
    /// MTU of the path toward the backends: a packet that would exceed it
    /// once encapsulated is answered with "too big" (or dropped). 0: no check.
    pub mtu: u16,
    /// GUE destination port, network order.
    pub gue_port: u16,
    /// Bits of the IPv4 outer source taken from the client's address (the
    /// rest from `src_v4`), so one balancer's tunnels spread over a
    /// backend's receive queues. Network order; 0: a fixed source.
    pub src_v4_host_mask: u32,
    /// The same for the last word of the IPv6 outer source.
    pub src_v6_host_mask: u32,
    /// A SYN in `LB_SYNS` at most this many stamp ticks old is recent: a
    /// SYN of its tuple is its retransmission (passive health), and its
    /// flow's first packet goes where it went:
    /// [`crate::consts::CT_SYN_WINDOW_MS`] in ticks of the kernel's HZ, or
    /// [`crate::consts::CT_SYN_WINDOW_DEFAULT`] where `lbd` cannot learn
    /// HZ; always written. Was `_reserved` (always written 0) before
    /// passive health, and 0 stood for the default until `lbd` wrote it.
    pub syn_window: u32,
}

impl DatapathConfig {
    /// [`Self::protect_window`] as the datapath reads it: without a
    /// branch (each would multiply the verifier's paths through every
    /// caller), so `lbd` always writes it, at most
    /// [`CT_WINDOW_MAX`](crate::consts::CT_WINDOW_MAX).
    #[inline(always)]
    pub const fn protect_ticks(&self) -> u16 {
        (self.protect_window & crate::consts::CT_WINDOW_MAX as u32) as u16
    }

    /// [`Self::syn_window`] as the datapath reads it (as
    /// [`Self::protect_ticks`]).
    #[inline(always)]
    pub const fn syn_ticks(&self) -> u16 {
        (self.syn_window & crate::consts::CT_WINDOW_MAX as u32) as u16
    }
}

pub use crate::consts::VIP_FILTER_WORDS;

/// The single element of `LB_HASH_KEY`: the tier's secret key for the hash
/// that picks a new flow's backend ([`crate::flow::pick_hash`]), read by
/// the datapath only when [`crate::consts::CFG_F_HASH_KEY`] is set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashKey {
    pub k: [u64; 2],
}

/// The single element of `LB_CT_KEY`: the box's secret key for the IPv6
/// connection-table hash ([`crate::flow::ct_hash_v6_keyed`]). Random when
/// the maps are created (or adopted from a version without it), then
/// never changed while they live: every IPv6 flow's entry is where this
/// key put it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtKey {
    pub k: [u32; crate::consts::CT_KEY_WORDS],
    /// When `lbd` clears [`crate::consts::CFG_F_CT_V6_LEGACY`]:
    /// `CLOCK_BOOTTIME` nanoseconds (pins do not outlive a boot), kept
    /// here so that a restart does not start the hour again; 0: no
    /// deadline recorded. The datapath never reads it.
    pub legacy_until: u64,
}

/// The single element of `LB_VIP_FILTER`: bit [`crate::flow::vip_filter_bit`]
/// of each VIP key (exact port, or port 0 for all-ports VIPs) is set. A
/// clear bit proves a packet is no VIP's, so non-VIP traffic passes after
/// one cache-resident load, and VIP traffic can try the connection table
/// before looking the VIP up. A set bit may be a false positive: the VIP
/// lookup decides.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipFilter {
    pub words: [u64; VIP_FILTER_WORDS],
}

impl Default for VipFilter {
    fn default() -> Self {
        Self {
            words: [0; VIP_FILTER_WORDS],
        }
    }
}

impl VipFilter {
    pub fn insert(&mut self, key: &VipKey) {
        let bit = crate::flow::vip_filter_bit(&key.addr, key.port, key.proto);
        self.words[(bit / 64) as usize] |= 1 << (bit % 64);
    }

    pub fn contains(&self, key: &VipKey) -> bool {
        let bit = crate::flow::vip_filter_bit(&key.addr, key.port, key.proto);
        self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }
}

/// One chunk of a Maglev table: slot `s` of a table that starts at chunk
/// `base` is `LB_TABLES[base + s / 1024].slots[s % 1024]`, a backend handle
/// (0: no backend).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableChunk {
    pub slots: [u32; TABLE_CHUNK_SLOTS as usize],
}

impl Default for TableChunk {
    fn default() -> Self {
        Self {
            slots: [0; TABLE_CHUNK_SLOTS as usize],
        }
    }
}

/// One chunk of a second-chance VIP's alternates (`LB_ALTERNATES`): slot
/// `s` of the region that starts at chunk `base` is
/// `LB_ALTERNATES[base + s / 1024].slots[s % 1024]`, the handles of the
/// backends the flows of Maglev slot `s` would have under the VIP's other
/// tables, in the order they are tried, distinct, 0 after the last. The
/// datapath skips one that is the packet's own backend, no longer holds
/// its handle, belongs to another VIP or is of another family than the
/// backend the packet goes to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AltChunk {
    pub slots: [[u32; SC_MAX_ALTERNATES]; TABLE_CHUNK_SLOTS as usize],
}

impl Default for AltChunk {
    fn default() -> Self {
        Self {
            slots: [[0; SC_MAX_ALTERNATES]; TABLE_CHUNK_SLOTS as usize],
        }
    }
}

/// The single element of `LB_TRACE`: which packets a trace describes.
/// Addresses are packet words (network order), as in [`VipKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFilter {
    /// Copied into every event, so that a reader skips the events of an
    /// earlier trace still in the ring.
    pub session: u32,
    /// The VIP's family ([`FAMILY_V4`]/[`FAMILY_V6`]); 0: any destination.
    pub vip_family: u8,
    pub vip_proto: u8,
    /// Network order; 0: any port (and all-ports VIPs).
    pub vip_port: u16,
    pub vip_addr: [u32; 4],
    /// The client's family; 0: any client. A client matches when
    /// `src & client_mask == client_net`, word by word.
    pub client_family: u8,
    pub _pad: [u8; 3],
    pub client_net: [u32; 4],
    pub client_mask: [u32; 4],
}

/// One traced packet, as `LB_TRACE_EVENTS` carries it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    pub session: u32,
    /// The outcome counter's id ([`crate::Counter`]).
    pub counter: u16,
    pub family: u8,
    pub proto: u8,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// As [`FlowKey::ports`] reads them: source port low, network order.
    pub ports: u32,
    pub frame_len: u32,
    /// The flow hash (the Maglev slot is `hash % M`); 0 if none was taken.
    pub hash: u64,
    /// The backend it was sent to (`backend_family` 0: none).
    pub backend: [u32; 4],
    pub backend_family: u8,
    /// `ENCAP_*` of the backend.
    pub encap: u8,
    pub _pad: [u8; 6],
}

/// A flow's 5-tuple, the input of the flow hash ([`crate::flow`]). The
/// datapath hashes the same words straight from the packet; userspace builds
/// a `FlowKey` to predict what the datapath will do (`lbctl simulate`, tests).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: AddrWords,
    pub dst: AddrWords,
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

impl FlowKey {
    /// The flow hash the datapath computes for this 5-tuple.
    pub fn hash(&self) -> u64 {
        if self.family == FAMILY_V6 {
            crate::flow::hash_v6(&self.src, &self.dst, self.ports_word(), self.proto)
        } else {
            crate::flow::hash_v4(self.src[0], self.dst[0], self.ports_word(), self.proto)
        }
    }

    /// The hash the datapath places this flow in the connection table by
    /// ([`crate::flow::ct_hash`]) on maps whose key is `key`, before the
    /// table's seed.
    pub fn ct_hash(&self, key: &CtKey) -> u64 {
        crate::flow::ct_hash(
            self.family,
            &key.k,
            &self.src,
            &self.dst,
            self.ports_word(),
            self.proto,
        )
    }

    /// The hash the version before the keyed one placed an IPv6 flow by
    /// ([`crate::flow::ct_hash_v6`]), where the datapath looks for it while
    /// [`crate::consts::CFG_F_CT_V6_LEGACY`] is set; IPv4's is unchanged.
    pub fn ct_hash_unkeyed(&self) -> u64 {
        if self.family == FAMILY_V6 {
            crate::flow::ct_hash_v6(&self.src, &self.dst, self.ports_word(), self.proto)
        } else {
            self.hash()
        }
    }

    /// Ports in host order. Panics in debug if the families differ; the
    /// datapath never sees such a flow.
    pub fn new(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Self {
        let (src, family) = addr_to_words(src);
        let (dst, _) = addr_to_words(dst);
        Self {
            src,
            dst,
            sport: sport.to_be(),
            dport: dport.to_be(),
            proto,
            family,
            _pad: [0; 2],
        }
    }

    /// The ports as the datapath loads them: the first four bytes of the TCP
    /// or UDP header read as one little-endian word.
    pub fn ports_word(&self) -> u32 {
        let s = self.sport.to_ne_bytes();
        let d = self.dport.to_ne_bytes();
        u32::from_le_bytes([s[0], s[1], d[0], d[1]])
    }
}

/// One connection-table entry: `tag << 32 | backend handle`, written and read
/// as one 8-byte word so that a reader on another CPU sees either the old
/// entry or the new one, never half of each. 0 is an empty way.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry(pub u64);

impl FlowEntry {
    pub const EMPTY: FlowEntry = FlowEntry(0);

    #[inline(always)]
    pub const fn new(tag: u32, handle: u32) -> Self {
        Self(((tag as u64) << 32) | handle as u64)
    }

    #[inline(always)]
    pub const fn tag(self) -> u32 {
        (self.0 >> 32) as u32
    }

    #[inline(always)]
    pub const fn handle(self) -> u32 {
        self.0 as u32
    }
}

/// One slot of `LB_SYNS`, the recent SYNs: the flow's tag and the backend
/// its last SYN went to (one 8-byte word, as in the connection table, so
/// that no reader sees a tag with another flow's backend), the stamp tick
/// of that SYN, and whether the flow's retransmission was counted already
/// (passive health counts flows, not packets).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynSlot {
    pub entry: FlowEntry,
    pub stamp: u16,
    /// 1 once a retransmitted SYN of this flow was counted (was padding,
    /// always 0, before: older slots read as not yet counted).
    pub retried: u8,
    pub _pad: [u8; 5],
}

/// One bucket of the connection table `LB_FLOWS`: one cache line holding
/// [`CT_WAYS`] entries and their stamps. A stamp is the way's activity
/// class (top 2 bits, [`crate::consts::CT_STAMP_CLASS_SHIFT`]) and the
/// tick it was last seen (low 14 bits, coarse and wrapping). A flow lives
/// in the bucket its seeded hash selects; a new flow takes an empty way or
/// evicts the way of the lowest class, the stalest within it, but never an
/// active way seen recently ([`ct_protected`]).
///
/// Stamps written by older versions (a confirmed bit and 15 bits of tick,
/// or whole 16-bit ticks) read as arbitrary classes and ages until their
/// flows are seen again: eviction order only, never a flow's backend.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowBucket {
    pub entries: [FlowEntry; CT_WAYS],
    pub stamps: [u16; CT_WAYS],
    pub _pad: [u8; 4],
}

/// Whether a way stamped `stamp` is protected at tick `now`: an active
/// flow ([`crate::consts::CT_CLASS_ACTIVE`]) seen within `window` ticks
/// ([`DatapathConfig::protect_ticks`]). No new flow takes its way, and no
/// SYN moves it: a SYN of its tuple keeps its backend. The datapath and
/// `lbctl simulate` both ask this.
#[inline(always)]
pub const fn ct_protected(stamp: u16, now: u16, window: u16) -> bool {
    use crate::consts::{CT_CLASS_ACTIVE, CT_STAMP_CLASS_SHIFT, CT_STAMP_TIME};
    stamp >> CT_STAMP_CLASS_SHIFT >= CT_CLASS_ACTIVE
        && now.wrapping_sub(stamp) & CT_STAMP_TIME <= window
}

/// A backend's SYNs, the value of `LB_BACKEND_SYNS` (per CPU): the SYNs
/// sent to it, and the SYNs retransmitted by clients whose previous SYN
/// went to it unanswered (passive health).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynCounts {
    pub syns: u64,
    pub retransmits: u64,
}

impl core::ops::AddAssign for SynCounts {
    fn add_assign(&mut self, rhs: Self) {
        self.syns = self.syns.wrapping_add(rhs.syns);
        self.retransmits = self.retransmits.wrapping_add(rhs.retransmits);
    }
}

/// Packets and bytes, the value of every counter map (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub packets: u64,
    pub bytes: u64,
}

impl core::ops::AddAssign for CounterValue {
    fn add_assign(&mut self, rhs: Self) {
        self.packets = self.packets.wrapping_add(rhs.packets);
        self.bytes = self.bytes.wrapping_add(rhs.bytes);
    }
}

/// Key of `LB_DECAP_ADDRS`: one of the backend's own addresses. The decap
/// program strips a tunnel header only from packets addressed to one of
/// these. The value (a `u32`) is the address's GUE port in network order
/// in its low 16 bits (0: no GUE), and `DECAP_F_CHECK_SOURCE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DecapAddr {
    pub addr: AddrWords,
    /// `FAMILY_*`.
    pub family: u8,
    pub _pad: [u8; 3],
}

impl DecapAddr {
    pub fn new(addr: IpAddr) -> Self {
        let (addr, family) = addr_to_words(addr);
        Self {
            addr,
            family,
            _pad: [0; 3],
        }
    }

    pub fn ip(&self) -> Option<IpAddr> {
        words_to_addr(&self.addr, self.family)
    }
}

/// Bytes of a benchmark packet the harness restores before each run: every
/// header any program here rewrites lies within them.
pub const BENCH_RESTORE_LEN: usize = 96;

/// How many flow hashes the bench object's `bench_hash_v4` and
/// `bench_hash_v6` and `bench_ct_hash_v6` compute in a row, each from the one before.
pub const BENCH_HASH_CHAIN: usize = 32;

/// The benchmark harness's packet (`BENCH_PACKET[0]`, bench object only):
/// before each run the harness shrinks the frame back to `len` and
/// rewrites its first [`BENCH_RESTORE_LEN`] bytes from `data`, then, if
/// `stamp_off` is not 0, writes a fresh 32-bit sequence number at that
/// offset (a new flow every run), or with `stamp_mod` not 0 the sequence
/// number modulo `stamp_mod`, plus 1 (`stamp_mod` flows, over and over).
/// Aligned to 8 so that the harness can copy `data` a word at a time.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchPacket {
    pub len: u32,
    pub stamp_off: u32,
    /// `ifindex` to redirect to (live-frames generator), else 0.
    pub redirect_ifindex: u32,
    pub stamp_mod: u32,
    pub data: [u8; BENCH_RESTORE_LEN],
}

/// `LB_BFD_PEERS` key: a BFD peer's address (the source of its control
/// packets), in the datapath's word form.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BfdKey {
    pub addr: AddrWords,
    /// [`crate::consts::FAMILY_V4`] or [`crate::consts::FAMILY_V6`].
    pub family: u8,
    pub _pad: [u8; 3],
}

/// `LB_BFD_PEERS` value: one BFD session's configuration, written by
/// `lbd` only (`lb_xdp` reads it; its state is in [`BfdState`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BfdConfig {
    /// Our address on the link, where the peer's packets must be sent
    /// and ours come from (word form of the key's family).
    pub local_addr: AddrWords,
    /// bfd.LocalDiscr: nonzero, unique among the sessions.
    pub my_disc: u32,
    /// bfd.DesiredMinTxInterval (configured; the advertised value also
    /// depends on the peer, see `bfd::advertised_tx_us`), microseconds.
    pub desired_min_tx_us: u32,
    /// bfd.RequiredMinRxInterval, microseconds.
    pub required_min_rx_us: u32,
    /// Index of the session's [`BfdState`] in `LB_BFD_STATE`.
    pub slot: u32,
    /// Bumped by `lbd` when the timers change: a Poll Sequence follows
    /// until the peer's Final ([`BfdState::config_gen`] catches up).
    pub config_gen: u32,
    /// Our UDP source port (49152–65535), network order.
    pub src_port: u16,
    /// bfd.DetectMult.
    pub detect_mult: u8,
    /// Reserved (0).
    pub flags: u8,
}

/// `LB_BFD_STATE` value: one session's state, written by `lb_xdp` as the
/// peer's packets arrive (`lbd` only resets a slot, to zeroes and state
/// Down, before giving it to a new session). The Detection Time is applied lazily: a packet that
/// comes after `detect_ns` without one first takes the session Down
/// (diagnostic 1), as the expired timer would have; `lbd` applies the
/// same rule when it reads the state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BfdState {
    /// `bpf_ktime_get_ns` of the last packet that passed the checks.
    pub last_rx_ns: u64,
    /// ... and of our last reply.
    pub last_tx_ns: u64,
    /// Our Detection Time for the peer, from its last packet.
    pub detect_ns: u64,
    /// When `state` last changed.
    pub changed_ns: u64,
    /// Packets that passed the checks; replies sent; packets discarded
    /// (a failed check of RFC 5880 §6.8.6 or RFC 5881 §5); packets
    /// processed but not answered (too soon after the last reply).
    pub rx: u64,
    pub tx: u64,
    pub invalid: u64,
    pub too_soon: u64,
    /// Transitions to Up.
    pub ups: u64,
    /// bfd.RemoteDiscr, the peer's Required Min RX and Desired Min TX
    /// (microseconds), from its last packet.
    pub remote_disc: u32,
    pub remote_min_rx_us: u32,
    pub remote_min_tx_us: u32,
    /// The Desired Min TX of our last reply.
    pub adv_tx_us: u32,
    /// The [`BfdConfig::config_gen`] whose Poll Sequence completed.
    pub config_gen: u32,
    /// bfd.SessionState and bfd.LocalDiag.
    pub state: u8,
    pub diag: u8,
    /// The State, Diag and Detect Mult of the peer's last packet.
    pub remote_state: u8,
    pub remote_diag: u8,
    pub remote_mult: u8,
    /// `BFD_ST_*` bits.
    pub flags: u8,
    pub _pad: [u8; 6],
}

const _: () = {
    assert!(core::mem::size_of::<BenchPacket>() == 16 + BENCH_RESTORE_LEN);
    assert!(core::mem::offset_of!(BenchPacket, data) % 8 == 0);
    assert!(core::mem::size_of::<VipKey>() == 20);
    assert!(core::mem::size_of::<VipMeta>() == 16);
    assert!(core::mem::size_of::<BackendDef>() == 32);
    assert!(core::mem::size_of::<VipFilter>() == 8 * VIP_FILTER_WORDS);
    assert!(core::mem::size_of::<DatapathConfig>() == 72);
    assert!(core::mem::size_of::<TableChunk>() == 4 * TABLE_CHUNK_SLOTS as usize);
    assert!(core::mem::size_of::<AltChunk>() == 4 * SC_MAX_ALTERNATES * TABLE_CHUNK_SLOTS as usize);
    assert!(core::mem::size_of::<FlowKey>() == 40);
    assert!(core::mem::size_of::<FlowEntry>() == 8);
    assert!(core::mem::size_of::<FlowBucket>() == 64);
    assert!(core::mem::size_of::<SynSlot>() == 16);
    assert!(core::mem::align_of::<FlowBucket>() == 64);
    assert!(core::mem::size_of::<CounterValue>() == 16);
    assert!(core::mem::size_of::<DecapAddr>() == 20);
    assert!(core::mem::size_of::<TraceFilter>() == 60);
    assert!(core::mem::size_of::<TraceEvent>() == 80);
    assert!(core::mem::size_of::<HashKey>() == 16);
    assert!(core::mem::size_of::<CtKey>() == 64);
    assert!(core::mem::size_of::<SynCounts>() == 16);
    assert!(core::mem::size_of::<BfdKey>() == 20);
    assert!(core::mem::size_of::<BfdConfig>() == 40);
    assert!(core::mem::size_of::<BfdState>() == 104);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: every type below is `#[repr(C)]` (or transparent over a u64),
    // `Copy`, has no padding that is not an explicit field, and is valid for
    // any bit pattern.
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for VipMeta {}
    unsafe impl aya::Pod for BackendDef {}
    unsafe impl aya::Pod for DatapathConfig {}
    unsafe impl aya::Pod for TableChunk {}
    unsafe impl aya::Pod for AltChunk {}
    unsafe impl aya::Pod for VipFilter {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowEntry {}
    unsafe impl aya::Pod for FlowBucket {}
    unsafe impl aya::Pod for CounterValue {}
    unsafe impl aya::Pod for BenchPacket {}
    unsafe impl aya::Pod for DecapAddr {}
    unsafe impl aya::Pod for TraceFilter {}
    unsafe impl aya::Pod for TraceEvent {}
    unsafe impl aya::Pod for HashKey {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for SynCounts {}
    unsafe impl aya::Pod for SynSlot {}
    unsafe impl aya::Pod for BfdKey {}
    unsafe impl aya::Pod for BfdConfig {}
    unsafe impl aya::Pod for BfdState {}
    unsafe impl aya::Pod for crate::quic::QuicServerKey {}
}

#[cfg(test)]
mod tests {
    use core::mem::offset_of;

    use super::*;

    /// The windows `lbd` writes, against ticks worked out by hand: 64
    /// jiffies a tick, so 61.44 s and 10.24 s are 240 and 40 ticks at
    /// HZ=250 (the datapath's defaults), four times that at HZ=1000.
    #[test]
    fn windows_are_the_same_seconds_on_every_hz() {
        use crate::consts::{CT_PROTECT_MS, CT_SYN_WINDOW_MS, stamp_ticks};
        for (hz, protect, syn) in [
            (100, 96, 16),
            (250, 240, 40),
            (300, 288, 48),
            (1000, 960, 160),
        ] {
            assert_eq!(stamp_ticks(CT_PROTECT_MS, hz), protect, "HZ={hz}");
            assert_eq!(stamp_ticks(CT_SYN_WINDOW_MS, hz), syn, "HZ={hz}");
        }
        // Rounded up, never 0 (the datapath reads 0 as no window at all).
        assert_eq!(stamp_ticks(1, 100), 1);
        assert_eq!(stamp_ticks(0, 100), 1);
        assert_eq!(stamp_ticks(641, 100), 2);
        assert_eq!(
            stamp_ticks(u32::MAX, u32::MAX),
            8191,
            "at most half the wrap"
        );
        assert_eq!(stamp_ticks(CT_PROTECT_MS, 100_000), 8191);
        let cfg = |protect_window, syn_window| DatapathConfig {
            protect_window,
            syn_window,
            ..Default::default()
        };
        assert_eq!(
            (cfg(960, 160).protect_ticks(), cfg(960, 160).syn_ticks()),
            (960, 160)
        );
        assert_eq!(crate::consts::CT_WINDOW_MAX, 8191);
        assert_eq!(cfg(8191, 8191).protect_ticks(), 8191);
        // Protected within the window, by the wrapped age.
        let active = 3 << crate::consts::CT_STAMP_CLASS_SHIFT;
        assert!(ct_protected(
            active | 16_000,
            16_000u16.wrapping_add(960) & 0x3fff,
            960
        ));
        assert!(!ct_protected(
            active | 16_000,
            16_000u16.wrapping_add(961) & 0x3fff,
            960
        ));
        assert!(!ct_protected(2 << 14 | 5, 5, 960), "class 2 is not active");
    }

    #[test]
    fn layouts_are_pinned() {
        assert_eq!(offset_of!(BfdKey, family), 16);
        assert_eq!(offset_of!(BfdConfig, my_disc), 16);
        assert_eq!(offset_of!(BfdConfig, slot), 28);
        assert_eq!(offset_of!(BfdConfig, config_gen), 32);
        assert_eq!(offset_of!(BfdConfig, src_port), 36);
        assert_eq!(offset_of!(BfdConfig, detect_mult), 38);
        assert_eq!(offset_of!(BfdState, rx), 32);
        assert_eq!(offset_of!(BfdState, ups), 64);
        assert_eq!(offset_of!(BfdState, remote_disc), 72);
        assert_eq!(offset_of!(BfdState, config_gen), 88);
        assert_eq!(offset_of!(BfdState, state), 92);
        assert_eq!(offset_of!(BfdState, flags), 97);

        assert_eq!(offset_of!(VipKey, port), 16);
        assert_eq!(offset_of!(VipKey, proto), 18);
        assert_eq!(offset_of!(VipKey, family), 19);

        assert_eq!(offset_of!(VipMeta, table_base), 4);
        assert_eq!(offset_of!(VipMeta, flags), 8);
        assert_eq!(offset_of!(VipMeta, encap), 10);
        assert_eq!(offset_of!(VipMeta, table_size_hi), 11);
        assert_eq!(offset_of!(VipMeta, aux_port), 12);
        assert_eq!(offset_of!(VipMeta, table_size_lo), 14);
        assert_eq!(offset_of!(VipMeta, alt_index), 2);

        assert_eq!(offset_of!(BackendDef, handle), 16);
        assert_eq!(offset_of!(BackendDef, vip_id), 20);
        assert_eq!(offset_of!(BackendDef, flags), 22);
        assert_eq!(offset_of!(BackendDef, family), 23);
        assert_eq!(offset_of!(BackendDef, encap), 24);

        assert_eq!(offset_of!(DatapathConfig, table_size), 4);
        assert_eq!(offset_of!(DatapathConfig, ct_mask), 12);
        assert_eq!(offset_of!(DatapathConfig, ct_seed), 16);
        assert_eq!(offset_of!(DatapathConfig, gw_mac), 24);
        assert_eq!(offset_of!(DatapathConfig, src_v4), 32);
        assert_eq!(offset_of!(DatapathConfig, protect_window), 36);
        assert_eq!(offset_of!(DatapathConfig, src_v6), 40);
        assert_eq!(offset_of!(DatapathConfig, mtu), 56);
        assert_eq!(offset_of!(DatapathConfig, gue_port), 58);
        assert_eq!(offset_of!(DatapathConfig, src_v4_host_mask), 60);
        assert_eq!(offset_of!(DatapathConfig, src_v6_host_mask), 64);
        assert_eq!(offset_of!(DatapathConfig, syn_window), 68);

        assert_eq!(offset_of!(FlowKey, dst), 16);
        assert_eq!(offset_of!(FlowKey, sport), 32);
        assert_eq!(offset_of!(FlowKey, dport), 34);
        assert_eq!(offset_of!(FlowKey, proto), 36);
        assert_eq!(offset_of!(FlowKey, family), 37);

        assert_eq!(offset_of!(FlowBucket, stamps), 48);
        assert_eq!(offset_of!(CounterValue, bytes), 8);

        assert_eq!(offset_of!(DecapAddr, family), 16);
        assert_eq!(offset_of!(DecapAddr, _pad), 17);
    }

    #[test]
    fn vip_meta_carries_a_24_bit_table_size() {
        let mut m = VipMeta::default();
        assert_eq!((m.table_size(), m.maglev_size(65_537)), (0, 65_537));
        for size in [101, 65_537, 655_373, (1 << 24) - 3] {
            m.set_table_size(size);
            assert_eq!((m.table_size(), m.maglev_size(65_537)), (size, size));
        }
        m.set_table_size(65_537);
        assert_eq!((m.table_size_hi, m.table_size_lo), (1, 1));
    }

    #[test]
    fn addresses_round_trip_in_network_order() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let (w, f) = addr_to_words(v4);
        assert_eq!(f, FAMILY_V4);
        assert_eq!(w[0].to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(words_to_addr(&w, f), Some(v4));

        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let (w, f) = addr_to_words(v6);
        assert_eq!(f, FAMILY_V6);
        assert_eq!(w[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(words_to_addr(&w, f), Some(v6));
        assert_eq!(words_to_addr(&w, 9), None);
    }

    #[test]
    fn vip_key_port_is_network_order() {
        let k = VipKey::new("10.0.0.1".parse().unwrap(), 80, 6);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
        assert_eq!(k.port(), 80);
    }

    #[test]
    fn decap_addr_round_trips() {
        for s in ["192.0.2.1", "2001:db8::2"] {
            let a: IpAddr = s.parse().unwrap();
            let k = DecapAddr::new(a);
            assert_eq!(k._pad, [0; 3]);
            assert_eq!(k.ip(), Some(a));
        }
    }

    #[test]
    fn flow_entry_packs_tag_and_handle() {
        let e = FlowEntry::new(0xdead_beef, 0x0001_0002);
        assert_eq!(e.tag(), 0xdead_beef);
        assert_eq!(e.handle(), 0x0001_0002);
        assert_ne!(e, FlowEntry::EMPTY);
    }

    #[test]
    fn ports_word_matches_a_little_endian_load() {
        let k = FlowKey::new(
            "1.1.1.1".parse().unwrap(),
            "2.2.2.2".parse().unwrap(),
            6,
            0x1234,
            80,
        );
        // TCP header bytes: 12 34 00 50
        assert_eq!(k.ports_word(), u32::from_le_bytes([0x12, 0x34, 0x00, 0x50]));
    }
}

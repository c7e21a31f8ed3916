//! The reconciler: the one owner of the dataplane maps.
//!
//! It holds what the maps contain (VIP ids, backend handles, a shadow copy
//! of every active table) and turns a desired state — the VIPs with
//! their backends and weights, plus the datapath settings — into the fewest
//! map writes that make the kernel match it:
//!
//! - a VIP's table is rebuilt only if the builder's input changed (its
//!   usable backends with a weight, the weights, its table size: the
//!   builder is deterministic, so the same input is the same table),
//!   written into the inactive half (only the chunks that differ from
//!   what that half holds), and swapped in by replacing the VIP's
//!   metadata: packets see the old table or the new one, never a mix.
//!   Tables are not shadowed in memory (at a thousand VIPs of 65,537
//!   slots that was a quarter of a gigabyte); whoever needs one reads it
//!   from the kernel;
//! - a new backend is written before any table refers to it; a removed one
//!   is retired only after no table refers to it, keeping its handle so the
//!   next occupant of its index gets a new generation;
//! - unchanged VIPs and backends are not written at all;
//! - the auxiliary `LB_VIPS` keys (per address: ICMP; per address and
//!   protocol: fragment policy) follow the VIP set after every apply;
//! - each VIP's two table halves are a region of the table pool sized by
//!   its own table size ([`regions`]: allocation, compaction, a changed
//!   size), checked to fit before anything is written;
//! - a second-chance VIP's alternates ([`crate::second_chance`]) are
//!   recomputed only when their sources change (configured or previous
//!   backends and weights, never health) and written in place into the
//!   VIP's region of `LB_ALTERNATES`, chunks that differ only, after new
//!   backends and before the VIP entry names the region.
//!
//! [`Reconciler::adopt`] rebuilds this view from maps that already exist
//! (pinned by a previous `lbd`), regions included, so a restart with the
//! same configuration writes nothing and disturbs no flow.

mod alternates;
mod ct_v6;
mod quic;
mod regions;

use alternates::AltState;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb_common::{
    BackendDef, CounterValue, DatapathConfig, FlowKey, TraceFilter, VipFilter, VipKey, VipMeta,
    addr_to_words,
    consts::{
        BACKEND_F_QUIC, BACKEND_F_SECOND_CHANCE, BACKEND_F_USABLE, BACKEND_INDEX_MASK,
        CFG_F_ALL_PORTS_VIPS, CFG_F_DROP_MALFORMED, CFG_F_HASH_KEY, CFG_F_ICMP_ECHO,
        CFG_F_PASS_TOO_BIG, CFG_F_TRACE, CT_PROTECT_MS, CT_PROTECT_TICKS, CT_SYN_WINDOW_DEFAULT,
        CT_SYN_WINDOW_MS, FAMILY_V4, GUE_PORT, KEY_FRAGMENTS, PROTO_ICMP, PROTO_ICMPV6,
        TABLE_CHUNK_SLOTS, VIP_F_FRAG_HASH, VIP_F_HASH_FIELDS, VIP_F_NO_BACKENDS,
        VIP_F_NO_CONNTRACK, VIP_F_QUIC, VIP_F_SECOND_CHANCE, stamp_ticks,
    },
};
use thiserror::Error;
use tracing::{debug, info};

use crate::{
    config::{Encap, FragmentPolicy, MalformedPolicy, VipConfig, VipId},
    dataplane::{
        Dataplane, DataplaneError, Layout,
        pool::{PoolError, Region, TablePool},
    },
    maglev::{self, MaglevBackend, MaglevError, MaglevTable},
    predict::{self, Prediction},
    second_chance::{AltTable, Sources},
};

#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("VIP {vip}: {source}")]
    Maglev {
        vip: VipId,
        #[source]
        source: MaglevError,
    },
    #[error("no free VIP id: max_vips ({0}) VIPs are in use")]
    VipIdsExhausted(u32),
    #[error("VIP {0} is not in the maps")]
    NotProgrammed(VipId),
    #[error("no free backend slot: max_backends ({0}) backends are in use")]
    BackendsExhausted(u32),
    #[error("no free alternates region: second_chance_vips ({0}) VIPs have second chance")]
    AlternatesExhausted(u32),
    #[error(
        "VIP {vip}: second chance with table_size {m}, above the global table_size {global} its alternates region holds"
    )]
    AlternatesTableSize { vip: VipId, m: u32, global: u32 },
    #[error(
        "no room for VIP {vip}'s table ({need}) in the table pool: {used} of {capacity} would be in use; raise table_pool_mib (new maps: stop lbd, `lbd teardown`, start; drops the connection table) or give VIPs a smaller table_size"
    )]
    TablePoolFull {
        vip: VipId,
        need: String,
        used: String,
        capacity: String,
    },
    #[error(
        "no random key for the connection table: the kernel's random source failed ({0}); lbd will not place flows where anyone can compute them"
    )]
    NoRandomness(std::io::Error),
    #[error(
        "table region of VIP {vip}: {source} (pinned maps that contradict each other: remove the pin directory, which drops the connection table)"
    )]
    Region {
        vip: VipId,
        #[source]
        source: PoolError,
    },
}

pub type Result<T, E = ReconcileError> = std::result::Result<T, E>;

/// Datapath settings that are not per VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatapathSettings {
    pub gateway_mac: [u8; 6],
    /// Outer source addresses (or the prefix address, see below).
    pub outer_source_v4: Option<Ipv4Addr>,
    pub outer_source_v6: Option<Ipv6Addr>,
    /// Low bits of the outer source taken from the client's address (its
    /// last 32 bits): 0 for a fixed source, at most 32.
    pub outer_source_v4_host_bits: u8,
    pub outer_source_v6_host_bits: u8,
    pub malformed: MalformedPolicy,
    /// MTU toward the backends; 0: unchecked.
    pub mtu: u16,
    /// GUE destination port (host order).
    pub gue_port: u16,
    pub icmp_echo: bool,
    /// Pass (rather than drop) IPv4 packets without DF that are too big.
    pub pass_too_big: bool,
    /// The tier's secret key for the hash that picks backends; `None`:
    /// the public hash.
    pub hash_key: Option<[u64; 2]>,
    /// The kernel's HZ (`liveflows::kernel_hz`), which sizes the
    /// datapath's windows in stamp ticks: the same seconds on every
    /// kernel. `None`: the windows the maps hold, else HZ=250's ticks
    /// (the same seconds there only).
    pub kernel_hz: Option<u32>,
}

impl Default for DatapathSettings {
    /// No gateway MAC or outer source, MTU unchecked, echo answered.
    fn default() -> Self {
        Self {
            gateway_mac: [0; 6],
            outer_source_v4: None,
            outer_source_v6: None,
            outer_source_v4_host_bits: 0,
            outer_source_v6_host_bits: 0,
            malformed: MalformedPolicy::Pass,
            mtu: 0,
            gue_port: GUE_PORT,
            hash_key: None,
            icmp_echo: true,
            pass_too_big: false,
            kernel_hz: None,
        }
    }
}

/// The host mask of a word whose last `bits` bits (in network order) are
/// host bits, as the datapath stores words.
fn host_mask(bits: u8) -> u32 {
    let host_order = match bits {
        0 => 0,
        b if b >= 32 => u32::MAX,
        b => (1u32 << b) - 1,
    };
    u32::from_ne_bytes(host_order.to_be_bytes())
}

/// The backends of an adopted VIP from their pinned entries. Weights are
/// not in the kernel: a backend's is 1 if the VIP's table names it, else
/// 0, until the desired state says.
fn adopted_backends(
    meta: &VipMeta,
    active: &[u32],
    defs: Option<Vec<BackendDef>>,
) -> BTreeMap<IpAddr, BackendState> {
    let in_table: BTreeSet<u32> = active.iter().copied().collect();
    defs.unwrap_or_default()
        .into_iter()
        .filter_map(|def| {
            let addr = def.ip()?;
            let weight =
                u32::from(meta.flags & VIP_F_NO_BACKENDS == 0 && in_table.contains(&def.handle));
            Some((
                addr,
                BackendState {
                    handle: def.handle,
                    weight,
                    usable: def.flags & BACKEND_F_USABLE != 0,
                },
            ))
        })
        .collect()
}

/// One backend of one VIP as the kernel knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendState {
    pub handle: u32,
    pub weight: u32,
    /// Connection-table entries to it are honoured.
    pub usable: bool,
}

/// One VIP as the kernel knows it.
#[derive(Clone, Debug)]
pub struct VipState {
    pub meta: VipMeta,
    /// Its Maglev table size M.
    pub table_size: u32,
    /// Where its two table halves are in `LB_TABLES`.
    pub region: Region,
    pub encap: Encap,
    pub conntrack: bool,
    /// Its backends carry `BACKEND_F_SECOND_CHANCE`.
    pub second_chance: bool,
    /// Its backends carry `BACKEND_F_QUIC`.
    pub quic: bool,
    pub backends: BTreeMap<IpAddr, BackendState>,
    /// The builder's input of the published table (no input: no table);
    /// `None` when not known (a VIP adopted from pinned maps, a new one).
    built: Option<Vec<MaglevBackend>>,
    /// Second chance: the VIP's alternates region and what it holds.
    alt: Option<AltState>,
}

impl VipState {
    /// A VIP as pinned maps hold it: `meta`, its table of size `m` at
    /// `region` (`live`, the half in use) and its backends' entries.
    fn adopted(
        meta: VipMeta,
        m: u32,
        region: Region,
        live: &[u32],
        defs: Option<Vec<BackendDef>>,
    ) -> Self {
        // An older version's maps have no `BACKEND_F_QUIC`: the first
        // apply then finds the owner changed and rewrites the entries.
        let quic = defs.iter().flatten().any(|d| d.flags & BACKEND_F_QUIC != 0);
        let second_chance = meta.flags & VIP_F_SECOND_CHANCE != 0;
        VipState {
            meta,
            table_size: m,
            region,
            encap: Encap::from_code(meta.encap).unwrap_or_default(),
            conntrack: meta.flags & VIP_F_NO_CONNTRACK == 0,
            second_chance,
            quic,
            backends: adopted_backends(&meta, live, defs),
            built: None,
            alt: second_chance.then_some(AltState {
                index: meta.alt_index,
                computed: None,
                written: None,
            }),
        }
    }

    /// The VIP's alternates as addresses per slot, if it has second chance
    /// and they were computed by this process.
    pub fn alternates(&self) -> Option<&AltTable> {
        self.alt.as_ref()?.computed.as_ref().map(|(_, t)| t)
    }

    /// What those alternates were computed from.
    pub fn alternate_sources(&self) -> Option<&Sources> {
        self.alt.as_ref()?.computed.as_ref().map(|(s, _)| s)
    }

    /// Which half of the region is live (0 or 1).
    pub fn live_half(&self) -> u32 {
        u32::from(self.meta.table_base != self.region.base)
    }

    /// The VIP has a table (a backend to send flows to).
    pub fn has_table(&self) -> bool {
        self.meta.flags & VIP_F_NO_BACKENDS == 0
    }
}

/// What an apply found for one VIP's table.
enum Built {
    /// The builder's input is the published table's: nothing to build.
    Same,
    /// A table built (as handles), or none (no backend with a weight).
    Table(Option<Vec<u32>>),
}

/// What one `apply` changed, for logs and replies.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub vips_added: usize,
    pub vips_removed: usize,
    pub vips_updated: usize,
    pub backends_added: usize,
    pub backends_removed: usize,
    pub tables_published: usize,
    pub chunks_written: usize,
    /// Tables moved within the pool to close gaps (same contents).
    pub tables_moved: usize,
    /// How long each table built took (one per VIP applied).
    pub table_builds: Vec<std::time::Duration>,
}

/// The builds as a count and a sum: a line of log, whatever the VIPs.
impl std::fmt::Debug for ApplyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: std::time::Duration = self.table_builds.iter().sum();
        let slowest = self.table_builds.iter().max().copied().unwrap_or_default();
        f.debug_struct("ApplyReport")
            .field("vips_added", &self.vips_added)
            .field("vips_removed", &self.vips_removed)
            .field("vips_updated", &self.vips_updated)
            .field("backends_added", &self.backends_added)
            .field("backends_removed", &self.backends_removed)
            .field("tables_published", &self.tables_published)
            .field("chunks_written", &self.chunks_written)
            .field("tables_moved", &self.tables_moved)
            .field("table_builds", &self.table_builds.len())
            .field("build_time", &total)
            .field("slowest_build", &slowest)
            .finish()
    }
}

impl ApplyReport {
    /// Nothing was written (tables may have been built and found equal).
    pub fn is_noop(&self) -> bool {
        let wrote = ApplyReport {
            table_builds: Vec::new(),
            ..self.clone()
        };
        wrote == ApplyReport::default()
    }
}

/// Brings entries of a map whose contents are kept in `written` to
/// `want`: the stale ones removed first (`remove`), then new and changed
/// ones written (`set`), `written` following each write that succeeded.
/// Stale first: a stale key is one nothing uses any more (an address or
/// protocol no VIP has, a retired backend's server ID), and the map is
/// sized for what is wanted, not for old and new together: written the
/// other way round, a full `LB_VIPS` refused the new keys of a VIP moved
/// to another address, and a start-up that adopted it failed every time.
fn sync_entries<D, K: Copy + Eq + std::hash::Hash, V: Copy + PartialEq>(
    dp: &mut D,
    written: &mut HashMap<K, V>,
    want: &HashMap<K, V>,
    mut set: impl FnMut(&mut D, &K, &V) -> Result<()>,
    mut remove: impl FnMut(&mut D, &K) -> Result<()>,
) -> Result<()> {
    let stale: Vec<K> = written
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    for key in stale {
        remove(dp, &key)?;
        written.remove(&key);
    }
    for (key, value) in want {
        if written.get(key) != Some(value) {
            set(dp, key, value)?;
            written.insert(*key, *value);
        }
    }
    Ok(())
}

/// A VIP's counter and each of its backends' counters.
pub type VipCounters = (CounterValue, Vec<(IpAddr, CounterValue)>);

/// A backend retired by an apply that has not yet succeeded: its handle
/// and, if its counts went into its VIP's retired total, the VIP id and
/// the counts.
#[derive(Clone, Copy, Debug)]
struct Retired {
    handle: u32,
    counted: Option<(u32, CounterValue)>,
}

/// Owner of the maps behind a [`Dataplane`].
pub struct Reconciler<D: Dataplane> {
    dp: D,
    layout: Layout,
    vips: BTreeMap<VipId, VipState>,
    /// Handle last stored at each backend index (keeps generations), and
    /// whether the index is occupied.
    slots: Vec<(u32, bool)>,
    /// The unoccupied backend indexes and unused VIP ids (each taken
    /// lowest first), so that a new one is found without a scan.
    free_slots: BTreeSet<u32>,
    /// Indexes freed since the last apply that succeeded: taken only when
    /// `free_slots` has none (an undo may give one back to its backend,
    /// see `retired`), and joined to `free_slots` after a good apply.
    free_retired: BTreeSet<u32>,
    free_ids: BTreeSet<u32>,
    /// Which chunks of `LB_TABLES` the VIPs' regions take.
    pool: TablePool,
    /// What each second-chance VIP's alternates come from (the daemon
    /// says; a VIP without an entry uses its own desired weights).
    sources: BTreeMap<VipId, Sources>,
    /// Backends retired since the last apply that succeeded, by VIP and
    /// address: an apply that fails half-way is undone by the next one,
    /// which gives such a backend its old handle back (its index still
    /// free) so that connection-table entries naming it stay good.
    retired: BTreeMap<(VipId, IpAddr), Retired>,
    /// The last apply succeeded (what `retired` is kept for).
    clean: bool,
    /// The auxiliary `LB_VIPS` keys as written (read once at adoption):
    /// keeping them here spares every apply a walk of the whole map.
    aux: HashMap<VipKey, VipMeta>,
    /// The VIP filter as written (read once at adoption).
    filter: VipFilter,
    /// `LB_QUIC_SERVERS` as written (read once at adoption).
    quic: HashMap<lb_common::quic::QuicServerKey, u32>,
    /// When `CFG_F_CT_V6_LEGACY` goes (see `ct_v6`), if it is set.
    ct_v6_legacy_until: Option<std::time::Instant>,
    /// Interfaces where an older `lbd`'s program ran on these keyed maps
    /// (see `ct_v6`), until the next settings write takes them.
    ct_v6_unkeyed_links: Vec<String>,
}

/// What a backend's entry says of its VIP besides the tunnel.
#[derive(Clone, Copy)]
struct Owner {
    vip_id: u32,
    encap: Encap,
    second_chance: bool,
    quic: bool,
}

impl Owner {
    fn of(vip: &VipConfig, vip_id: u32) -> Self {
        Self {
            vip_id,
            encap: vip.encap,
            second_chance: vip.second_chance,
            quic: vip.quic.is_some(),
        }
    }
}

fn backend_def(addr: IpAddr, handle: u32, usable: bool, owner: Owner) -> BackendDef {
    let (words, family) = addr_to_words(addr);
    let mut flags = if usable { BACKEND_F_USABLE } else { 0 };
    if owner.second_chance {
        flags |= BACKEND_F_SECOND_CHANCE;
    }
    if owner.quic {
        flags |= BACKEND_F_QUIC;
    }
    BackendDef {
        addr: words,
        handle,
        vip_id: owner.vip_id as u16,
        flags,
        family,
        encap: owner.encap.code(),
        _pad: [0; 7],
    }
}

impl<D: Dataplane> Reconciler<D> {
    /// Takes over `dp`, learning what its maps already hold (nothing, for
    /// fresh maps).
    pub fn adopt(dp: D) -> Result<Self> {
        let layout = dp.layout();
        let mut slots = Vec::with_capacity(layout.max_backends as usize);
        let mut by_vip: BTreeMap<u32, Vec<BackendDef>> = BTreeMap::new();
        for def in dp.all_backends()? {
            let occupied = def.family != 0 && def.handle != 0;
            slots.push((def.handle, occupied));
            if occupied {
                by_vip.entry(def.vip_id as u32).or_default().push(def);
            }
        }
        let mut pool = TablePool::new(layout.pool_chunks());
        let mut vips = BTreeMap::new();
        let mut aux = HashMap::new();
        for (key, meta) in dp.vips()? {
            let Some(id) = VipId::from_key(&key) else {
                if is_aux_key(&key) {
                    aux.insert(key, meta);
                }
                continue;
            };
            let (region, live) = layout.region_of(&meta);
            pool.reserve(region.base, region.chunks())
                .map_err(|source| ReconcileError::Region { vip: id, source })?;
            let m = layout.vip_table_size(&meta);
            let live = dp.read_table(region.half_base(live), m)?;
            let defs = by_vip.remove(&meta.id());
            vips.insert(id, VipState::adopted(meta, m, region, &live, defs));
        }
        let free_slots = (0..layout.max_backends)
            .filter(|i| !slots[*i as usize].1)
            .collect();
        let used: BTreeSet<u32> = vips.values().map(|v| v.meta.id()).collect();
        let free_ids = (0..layout.max_vips).filter(|i| !used.contains(i)).collect();
        // Backends whose VIP is gone (a crash between steps) are freed.
        let mut r = Self {
            layout,
            vips,
            slots,
            free_slots,
            free_retired: BTreeSet::new(),
            free_ids,
            pool,
            sources: BTreeMap::new(),
            retired: BTreeMap::new(),
            clean: true,
            filter: dp.vip_filter()?,
            aux,
            quic: dp.quic_servers()?.into_iter().collect(),
            ct_v6_legacy_until: None,
            ct_v6_unkeyed_links: Vec::new(),
            dp,
        };
        for defs in by_vip.into_values() {
            for def in defs {
                r.retire_backend(def.handle, None)?;
            }
        }
        if !r.vips.is_empty() {
            info!(vips = r.vips.len(), "adopted existing dataplane state");
        }
        Ok(r)
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn vips(&self) -> &BTreeMap<VipId, VipState> {
        &self.vips
    }

    /// What the alternates of second-chance VIPs are computed from, from
    /// the next [`apply`](Self::apply) on (the daemon's configured and
    /// previous backends; see [`crate::second_chance`]).
    pub fn set_alternate_sources(&mut self, sources: BTreeMap<VipId, Sources>) {
        self.sources = sources;
    }

    /// The table pool: which chunks the VIPs' regions take.
    pub fn pool(&self) -> &TablePool {
        &self.pool
    }

    /// Writes the datapath settings; keeps the connection-table seed and
    /// IPv6 key of adopted maps, picks random ones for fresh maps (and
    /// marks where their IPv6 flows live, see `ct_v6`).
    pub fn apply_settings(&mut self, s: &DatapathSettings) -> Result<bool> {
        let old = self.dp.config()?;
        let mut cfg = old;
        self.layout.apply_to(&mut cfg);
        let fresh = cfg.ct_seed == 0;
        if fresh {
            cfg.ct_seed = random_seed();
        }
        self.mark_ct_v6(&mut cfg, fresh, std::time::Instant::now())?;
        cfg.gw_mac = s.gateway_mac;
        cfg.src_v4 = s
            .outer_source_v4
            .map(|a| addr_to_words(a.into()).0[0])
            .unwrap_or(0);
        cfg.src_v6 = s
            .outer_source_v6
            .map(|a| addr_to_words(a.into()).0)
            .unwrap_or_default();
        cfg.src_v4_host_mask = host_mask(s.outer_source_v4_host_bits);
        cfg.src_v6_host_mask = host_mask(s.outer_source_v6_host_bits);
        cfg.mtu = s.mtu;
        cfg.gue_port = s.gue_port.to_be();
        // HZ unknown: what the maps hold (pins do not outlive a boot, so
        // an earlier lbd wrote it for this kernel), else HZ=250's ticks.
        let ticks = |ms, default: u16, held: u32| match s.kernel_hz {
            Some(hz) => stamp_ticks(ms, hz),
            None if held != 0 => held,
            None => default.into(),
        };
        cfg.protect_window = ticks(CT_PROTECT_MS, CT_PROTECT_TICKS, old.protect_window);
        cfg.syn_window = ticks(CT_SYN_WINDOW_MS, CT_SYN_WINDOW_DEFAULT, old.syn_window);
        cfg.flags = self.all_ports_flag(cfg.flags);
        // The key before the flag that makes the datapath read it.
        if let Some(key) = &s.hash_key
            && self.dp.hash_key()? != *key
        {
            self.dp.set_hash_key(key)?;
        }
        for (bit, on) in [
            (CFG_F_DROP_MALFORMED, s.malformed == MalformedPolicy::Drop),
            (CFG_F_ICMP_ECHO, s.icmp_echo),
            (CFG_F_PASS_TOO_BIG, s.pass_too_big),
            (CFG_F_HASH_KEY, s.hash_key.is_some()),
        ] {
            if on {
                cfg.flags |= bit;
            } else {
                cfg.flags &= !bit;
            }
        }
        if cfg == old {
            return Ok(false);
        }
        self.dp.set_config(&cfg)?;
        Ok(true)
    }

    /// Starts a trace with `filter`, or stops it (`None`): the filter and
    /// `CFG_F_TRACE` are written before the traced program is swapped in,
    /// and the plain program is back before the flag is cleared.
    pub fn set_trace(&mut self, filter: Option<&TraceFilter>) -> Result<()> {
        match filter {
            Some(f) => self.dp.set_trace_filter(f)?,
            None => self.dp.select_program(false)?,
        }
        let mut cfg = self.dp.config()?;
        let flags = match filter {
            Some(_) => cfg.flags | CFG_F_TRACE,
            None => cfg.flags & !CFG_F_TRACE,
        };
        if flags != cfg.flags {
            cfg.flags = flags;
            self.dp.set_config(&cfg)?;
        }
        if filter.is_some() {
            self.dp.select_program(true)?;
        }
        Ok(())
    }

    fn all_ports_flag(&self, flags: u32) -> u32 {
        if self.vips.keys().any(|id| id.port == 0) {
            flags | CFG_F_ALL_PORTS_VIPS
        } else {
            flags & !CFG_F_ALL_PORTS_VIPS
        }
    }

    /// Whether `desired` finds room, as [`apply`](Self::apply) checks before
    /// it writes anything: every table its room in the pool, every backend
    /// an index. Callers ask before they change anything else (a revision,
    /// the state file, the datapath settings), so that a change that does
    /// not fit is refused with nothing done.
    pub fn check_room(&self, desired: &[VipConfig]) -> Result<()> {
        let wanted: BTreeMap<VipId, &VipConfig> = desired.iter().map(|v| (v.id, v)).collect();
        self.check_pool(desired, &wanted)?;
        self.check_backends(desired, &wanted)
    }

    /// Makes the maps hold exactly `desired` (the VIPs, their backends and
    /// weights). `usable` says, per VIP and backend address, whether the
    /// backend may receive flows (health, drain state); absent means yes.
    pub fn apply(
        &mut self,
        desired: &[VipConfig],
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
    ) -> Result<ApplyReport> {
        let mut report = ApplyReport::default();
        let wanted: BTreeMap<VipId, &VipConfig> = desired.iter().map(|v| (v.id, v)).collect();
        // Before anything is written: every table will find its room, and
        // every backend an index.
        self.check_pool(desired, &wanted)?;
        self.check_backends(desired, &wanted)?;
        if self.clean {
            self.retired.clear();
            let freed = std::mem::take(&mut self.free_retired);
            self.free_slots.extend(freed);
        }
        self.clean = false;
        let result = self.apply_checked(desired, &wanted, usable, &mut report);
        self.clean = result.is_ok();
        result?;
        if !report.is_noop() {
            info!(?report, "dataplane updated");
        }
        Ok(report)
    }

    /// Brings only `vips` — VIPs in the maps already, whose health or
    /// timers moved their backends' weights and usable flags — to what
    /// they say, and leaves every other VIP, the auxiliary keys, the filter
    /// and the settings alone: the work of one verdict is its VIP's, not
    /// every VIP's. A VIP not in the maps is an error (that is
    /// [`apply`](Self::apply)'s job).
    pub fn apply_some(
        &mut self,
        vips: &[VipConfig],
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
    ) -> Result<ApplyReport> {
        let mut report = ApplyReport::default();
        if let Some(v) = vips.iter().find(|v| !self.vips.contains_key(&v.id)) {
            return Err(ReconcileError::NotProgrammed(v.id));
        }
        let was_clean = self.clean;
        if was_clean {
            self.retired.clear();
            let freed = std::mem::take(&mut self.free_retired);
            self.free_slots.extend(freed);
        }
        self.clean = false;
        let result = vips
            .iter()
            .try_for_each(|vip| self.apply_vip(vip, usable, &mut report));
        // Some VIPs brought to what they say leave the others as a failed
        // apply left them: only a whole apply may forget what it retired
        // (the backends it must give back under their handles).
        self.clean = was_clean && result.is_ok();
        result?;
        if !report.is_noop() {
            debug!(?report, "dataplane updated");
        }
        Ok(report)
    }

    /// Whether every new backend of `desired` finds a free index at the
    /// moment the apply adds it: removed VIPs give theirs back first, a
    /// kept VIP's leaving backends only after its own new ones are in.
    fn check_backends(
        &self,
        desired: &[VipConfig],
        wanted: &BTreeMap<VipId, &VipConfig>,
    ) -> Result<()> {
        let mut free = self.free_slots.len() + self.free_retired.len();
        free += self
            .vips
            .iter()
            .filter(|(id, _)| !wanted.contains_key(id))
            .map(|(_, v)| v.backends.len())
            .sum::<usize>();
        for vip in desired {
            let have = self.vips.get(&vip.id).map(|s| &s.backends);
            let new = vip
                .backends
                .iter()
                .filter(|b| have.is_none_or(|h| !h.contains_key(&b.address)))
                .count();
            if new > free {
                return Err(ReconcileError::BackendsExhausted(self.layout.max_backends));
            }
            free -= new;
            free += have.map_or(0, |h| {
                h.keys()
                    .filter(|a| !vip.backends.iter().any(|b| b.address == **a))
                    .count()
            });
        }
        Ok(())
    }

    fn apply_checked(
        &mut self,
        desired: &[VipConfig],
        wanted: &BTreeMap<VipId, &VipConfig>,
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
        report: &mut ApplyReport,
    ) -> Result<()> {
        // Removed VIPs first: frees their ids and backend slots.
        let gone: Vec<VipId> = self
            .vips
            .keys()
            .filter(|id| !wanted.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            self.remove_vip(&id)?;
            report.vips_removed += 1;
        }
        self.apply_kept(desired, usable, report)
    }

    /// [`apply`](Self::apply) after the removed VIPs went.
    fn apply_kept(
        &mut self,
        desired: &[VipConfig],
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
        report: &mut ApplyReport,
    ) -> Result<()> {
        // Regions of VIPs that turn second chance off are free before any
        // VIP of this apply takes one: otherwise a region moving from a VIP
        // late in `desired` to one early in it would be refused. Until its
        // entry is rewritten, the old VIP may read the new owner's
        // alternates, and skips them all (they belong to another VIP).
        for vip in desired.iter().filter(|v| !v.second_chance) {
            if let Some(state) = self.vips.get_mut(&vip.id) {
                state.alt = None;
            }
        }
        for vip in desired {
            self.apply_vip(vip, usable, report)?;
        }
        self.sync_aux_keys(desired)?;
        self.sync_quic(desired)?;
        // The filter follows the VIP set: new VIPs become reachable, removed
        // ones stop costing a lookup.
        self.sync_vip_filter()?;
        // The all-ports flag follows the VIP set.
        let cfg = self.dp.config()?;
        let flags = self.all_ports_flag(cfg.flags);
        if flags != cfg.flags {
            self.dp.set_config(&DatapathConfig { flags, ..cfg })?;
        }
        Ok(())
    }

    /// Makes the auxiliary `LB_VIPS` keys match the VIP set: an ICMP key
    /// per VIP address, a fragment key per VIP address and protocol (naming
    /// the VIP that hashes fragments, if one does). Stale keys are removed
    /// before new ones are written ([`sync_entries`]).
    fn sync_aux_keys(&mut self, desired: &[VipConfig]) -> Result<()> {
        let mut want: HashMap<VipKey, VipMeta> = HashMap::new();
        for vip in desired {
            let key = vip.id.key();
            let icmp = if key.family == FAMILY_V4 {
                PROTO_ICMP
            } else {
                PROTO_ICMPV6
            };
            want.insert(
                VipKey {
                    port: 0,
                    proto: icmp,
                    ..key
                },
                VipMeta::default(),
            );
            let frag = want
                .entry(VipKey {
                    port: 0,
                    family: key.family | KEY_FRAGMENTS,
                    ..key
                })
                .or_default();
            if vip.fragments == FragmentPolicy::Hash {
                frag.flags = VIP_F_FRAG_HASH;
                frag.aux_port = key.port;
            }
        }
        sync_entries(
            &mut self.dp,
            &mut self.aux,
            &want,
            |dp, key, meta| Ok(dp.upsert_vip(key, meta)?),
            |dp, key| Ok(dp.remove_vip(key)?),
        )
    }

    /// Writes the VIP filter of the keys now in `LB_VIPS` (the VIPs and
    /// the auxiliary keys) if it differs from the one written.
    fn sync_vip_filter(&mut self) -> Result<()> {
        let mut filter = VipFilter::default();
        for key in self
            .vips
            .keys()
            .map(VipId::key)
            .chain(self.aux.keys().copied())
        {
            filter.insert(&key);
        }
        if filter != self.filter {
            self.dp.set_vip_filter(&filter)?;
            self.filter = filter;
        }
        Ok(())
    }

    fn remove_vip(&mut self, id: &VipId) -> Result<()> {
        let Some(state) = self.vips.remove(id) else {
            return Ok(());
        };
        self.dp.remove_vip(&id.key())?;
        self.pool.release(state.region.base, state.region.chunks());
        self.free_ids.insert(state.meta.id());
        // Its id may serve another VIP next: counts an earlier retirement
        // put into its total must not be taken out of that one's.
        for ((vip, _), r) in self.retired.iter_mut() {
            if vip == id {
                r.counted = None;
            }
        }
        for (addr, b) in &state.backends {
            self.retire((*id, *addr), b.handle, None)?;
        }
        info!(vip = %id, "VIP removed");
        Ok(())
    }

    fn free_vip_id(&self) -> Result<u32> {
        self.free_ids
            .first()
            .copied()
            .ok_or(ReconcileError::VipIdsExhausted(self.layout.max_vips))
    }

    fn new_backend(&mut self, vip: VipId, addr: IpAddr, usable: bool, owner: Owner) -> Result<u32> {
        if let Some(Retired { handle, counted }) = self.unretire(vip, addr) {
            // An apply that failed half-way retired it: the same backend
            // comes back under the same handle, its flows with it, and its
            // counts leave the VIP's retired total, which would count them
            // twice (they are its own again).
            let index = handle & BACKEND_INDEX_MASK;
            self.dp
                .set_backend(index, &backend_def(addr, handle, usable, owner))?;
            if let Some((vip_id, counts)) = counted {
                let minus = CounterValue {
                    packets: counts.packets.wrapping_neg(),
                    bytes: counts.bytes.wrapping_neg(),
                };
                self.dp.add_vip_retired(vip_id, minus)?;
            }
            self.slots[index as usize] = (handle, true);
            self.free_retired.remove(&index);
            return Ok(handle);
        }
        // An index retired since the last good apply is taken last: an
        // undo may want to give it back to its backend.
        let index = self
            .free_slots
            .first()
            .or_else(|| self.free_retired.first())
            .map(|i| *i as usize)
            .ok_or(ReconcileError::BackendsExhausted(self.layout.max_backends))?;
        let generation = ((self.slots[index].0 >> 16) + 1) & 0xffff;
        let handle = (generation.max(1) << 16) | index as u32;
        // The index may have served a backend before: its counters start
        // from zero, before the backend can receive a packet.
        self.dp.clear_backend_stats(index as u32)?;
        self.dp
            .set_backend(index as u32, &backend_def(addr, handle, usable, owner))?;
        self.slots[index] = (handle, true);
        self.free_slots.remove(&(index as u32));
        self.free_retired.remove(&(index as u32));
        Ok(handle)
    }

    /// The handle backend `addr` of `vip` had before an apply that did
    /// not finish retired it, if its index has served no one since.
    fn unretire(&mut self, vip: VipId, addr: IpAddr) -> Option<Retired> {
        let r = self.retired.remove(&(vip, addr))?;
        let index = r.handle & BACKEND_INDEX_MASK;
        (self.slots.get(index as usize) == Some(&(r.handle, false))).then_some(r)
    }

    /// Frees a backend's index (see [`Self::retire_backend`]) and keeps
    /// what an undo needs to give it back as `(vip, addr)`.
    fn retire(&mut self, key: (VipId, IpAddr), handle: u32, vip_id: Option<u32>) -> Result<()> {
        self.retired.insert(
            key,
            Retired {
                handle,
                counted: None,
            },
        );
        let counted = self.retire_backend(handle, vip_id)?;
        if let Some(r) = self.retired.get_mut(&key) {
            r.counted = counted;
        }
        Ok(())
    }

    /// Frees a backend's index. Its handle stays in the map with no flags,
    /// so connection-table entries pointing at it are misses. Its counters
    /// join those of VIP id `vip_id` (if the VIP stays), whose total would
    /// otherwise drop: the datapath counts forwarded packets per backend
    /// only. (A packet in flight on another CPU as the backend leaves may
    /// be counted after the read, and is lost when the index is reused.)
    fn retire_backend(
        &mut self,
        handle: u32,
        vip_id: Option<u32>,
    ) -> Result<Option<(u32, CounterValue)>> {
        let index = handle & BACKEND_INDEX_MASK;
        let def = BackendDef {
            handle,
            ..Default::default()
        };
        self.dp.set_backend(index, &def)?;
        if let Some(slot) = self.slots.get_mut(index as usize) {
            *slot = (handle, false);
            self.free_retired.insert(index);
        }
        let Some(vip_id) = vip_id else {
            return Ok(None);
        };
        let counts = self.dp.backend_stats(index)?;
        self.dp.add_vip_retired(vip_id, counts)?;
        Ok(Some((vip_id, counts)))
    }

    /// Brings one VIP's backends, table and entry to `vip`: new backends
    /// first (before a table names them), then the table into the inactive
    /// half, then the VIP entry that publishes it, and only then the
    /// backends that left are retired.
    fn apply_vip(
        &mut self,
        vip: &VipConfig,
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
        report: &mut ApplyReport,
    ) -> Result<()> {
        let is_new = self.ensure_vip(vip, report)?;
        let retire = self.sync_backends(vip, is_new, usable, report)?;
        let m = vip.maglev_size(&self.layout);
        let state = &self.vips[&vip.id];
        let input = maglev_input(
            state
                .backends
                .iter()
                .filter(|(_, b)| b.usable)
                .map(|(a, b)| (*a, b.weight)),
        );
        let built = if m == state.table_size && state.built.as_ref() == Some(&input) {
            Built::Same
        } else {
            let started = std::time::Instant::now();
            let table = self.build_table(&vip.id, &input, m)?;
            report.table_builds.push(started.elapsed());
            Built::Table(table)
        };
        if vip.second_chance {
            self.sync_alternates(vip, m, report)?;
        } else {
            // The entry written next names no region: it is free.
            self.vips.get_mut(&vip.id).expect("present").alt = None;
        }
        if m == self.vips[&vip.id].table_size {
            self.publish(vip, is_new, built, report)?;
        } else if let Built::Table(table) = built {
            self.resize(vip, m, table, report)?;
        }
        let state = self.vips.get_mut(&vip.id).expect("present");
        state.built = Some(input);
        let vip_id = Some(state.meta.id());
        for (addr, handle) in retire {
            self.retire((vip.id, addr), handle, vip_id)?;
        }
        Ok(())
    }

    /// Gives a VIP seen for the first time an id and state; `true` if it
    /// was new.
    fn ensure_vip(&mut self, vip: &VipConfig, report: &mut ApplyReport) -> Result<bool> {
        if self.vips.contains_key(&vip.id) {
            return Ok(false);
        }
        let vip_id = self.free_vip_id()?;
        // A reused id starts its counters from zero.
        self.dp.clear_vip_stats(vip_id)?;
        let m = vip.maglev_size(&self.layout);
        let region = Region::new(self.allocate_region(&vip.id, m, report)?, m);
        self.free_ids.remove(&vip_id);
        let mut meta = VipMeta {
            vip_id: vip_id as u16,
            flags: VIP_F_NO_BACKENDS,
            encap: vip.encap.code(),
            ..Default::default()
        };
        meta.set_table_size(m);
        region.point(&mut meta, 0);
        self.vips.insert(
            vip.id,
            VipState {
                meta,
                table_size: m,
                region,
                encap: vip.encap,
                conntrack: vip.conntrack,
                second_chance: vip.second_chance,
                quic: vip.quic.is_some(),
                backends: BTreeMap::new(),
                built: None,
                alt: None,
            },
        );
        report.vips_added += 1;
        Ok(true)
    }

    /// Adds new backends, rewrites the ones whose usable flag or tunnel
    /// changed, and drops the ones that left from the VIP's state; returns
    /// those to retire (address, handle) once no table names them.
    fn sync_backends(
        &mut self,
        vip: &VipConfig,
        is_new: bool,
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
        report: &mut ApplyReport,
    ) -> Result<Vec<(IpAddr, u32)>> {
        let id = vip.id;
        let vip_id = self.vips[&id].meta.id();
        let wanted: BTreeMap<IpAddr, u32> =
            vip.backends.iter().map(|b| (b.address, b.weight)).collect();
        let state = self.vips.get_mut(&id).expect("present");
        let owner_changed = !is_new
            && (state.encap != vip.encap
                || state.second_chance != vip.second_chance
                || state.quic != vip.quic.is_some());
        state.second_chance = vip.second_chance;
        state.quic = vip.quic.is_some();
        let owner = Owner::of(vip, vip_id);
        let mut retire = Vec::new();
        state.backends.retain(|addr, b| {
            let keep = wanted.contains_key(addr);
            if !keep {
                retire.push((*addr, b.handle));
                report.backends_removed += 1;
            }
            keep
        });
        for (addr, weight) in &wanted {
            let ok = usable(&id, addr);
            let state = match self.vips[&id].backends.get(addr).copied() {
                Some(mut s) => {
                    if s.usable != ok || owner_changed {
                        self.dp.set_backend(
                            s.handle & BACKEND_INDEX_MASK,
                            &backend_def(*addr, s.handle, ok, owner),
                        )?;
                        s.usable = ok;
                    }
                    s.weight = *weight;
                    s
                }
                None => {
                    report.backends_added += 1;
                    BackendState {
                        handle: self.new_backend(id, *addr, ok, owner)?,
                        weight: *weight,
                        usable: ok,
                    }
                }
            };
            let vip_state = self.vips.get_mut(&id).expect("present");
            vip_state.backends.insert(*addr, state);
        }
        Ok(retire)
    }

    /// The Maglev table of `m` slots over `input` (the VIP's usable
    /// backends with a weight), as backend handles; `None` when empty.
    fn build_table(&self, id: &VipId, input: &[MaglevBackend], m: u32) -> Result<Option<Vec<u32>>> {
        let state = &self.vips[id];
        let handles: Vec<u32> = input
            .iter()
            .map(|b| state.backends[&b.addr].handle)
            .collect();
        let table = maglev::build(input, m)
            .map_err(|source| ReconcileError::Maglev { vip: *id, source })?;
        Ok(match table {
            MaglevTable::Empty => None,
            MaglevTable::Slots(slots) => Some(slots.iter().map(|i| handles[*i as usize]).collect()),
        })
    }

    /// The published table of `id` (backend handles), read from the
    /// kernel; empty for a VIP without a table, `None` for no such VIP.
    pub fn live_table(&self, id: &VipId) -> Result<Option<Vec<u32>>> {
        let Some(state) = self.vips.get(id) else {
            return Ok(None);
        };
        if !state.has_table() {
            return Ok(Some(Vec::new()));
        }
        let base = state.region.half_base(state.live_half());
        Ok(Some(self.dp.read_table(base, state.table_size)?))
    }

    /// The published table of `id` as backend addresses, slot by slot
    /// (`None`: the slot drops; every slot of a VIP without backends).
    /// `None` if the VIP is not programmed.
    pub fn table_addresses(&self, id: &VipId) -> Result<Option<Vec<Option<IpAddr>>>> {
        let Some(table) = self.live_table(id)? else {
            return Ok(None);
        };
        let state = &self.vips[id];
        if table.is_empty() {
            return Ok(Some(vec![None; state.table_size as usize]));
        }
        let mut by_handle: Vec<(u32, IpAddr)> =
            state.backends.iter().map(|(a, b)| (b.handle, *a)).collect();
        by_handle.sort_unstable();
        let address = |h: &u32| {
            by_handle
                .binary_search_by_key(h, |(handle, _)| *handle)
                .ok()
                .map(|i| by_handle[i].1)
        };
        Ok(Some(table.iter().map(address).collect()))
    }

    /// The VIP's entry as `vip` wants it, before its table: tunnel and
    /// flags, its table size, and the flag naming the live half (entries
    /// adopted from an older `lbd` gain both here).
    fn wanted_meta(&mut self, vip: &VipConfig) -> VipMeta {
        let state = self.vips.get_mut(&vip.id).expect("present");
        state.encap = vip.encap;
        state.conntrack = vip.conntrack;
        let mut meta = state.meta;
        meta.encap = vip.encap.code();
        meta.flags &= !(VIP_F_NO_CONNTRACK
            | VIP_F_FRAG_HASH
            | VIP_F_SECOND_CHANCE
            | VIP_F_HASH_FIELDS
            | VIP_F_QUIC);
        meta.flags |= vip.hash.flags();
        meta.aux_port = 0;
        if let Some(quic) = vip.quic {
            meta.flags |= VIP_F_QUIC;
            meta.aux_port = quic.params().pack();
        }
        if !vip.conntrack {
            meta.flags |= VIP_F_NO_CONNTRACK;
        }
        meta.alt_index = state.alt.as_ref().map_or(0, |a| a.index);
        if state.alt.is_some() {
            meta.flags |= VIP_F_SECOND_CHANCE;
        }
        if vip.fragments == FragmentPolicy::Hash {
            meta.flags |= VIP_F_FRAG_HASH;
        }
        meta.set_table_size(state.table_size);
        state.region.point(&mut meta, state.live_half());
        meta
    }

    /// Writes a changed table into the inactive half and the VIP entry
    /// (flags, tunnel, live half) when it differs from what is published.
    fn publish(
        &mut self,
        vip: &VipConfig,
        is_new: bool,
        built: Built,
        report: &mut ApplyReport,
    ) -> Result<()> {
        let id = vip.id;
        let mut meta = self.wanted_meta(vip);
        let mut swapped = false;
        match built {
            Built::Same => {}
            Built::Table(None) => meta.flags |= VIP_F_NO_BACKENDS,
            Built::Table(Some(h)) if self.is_live(&id, &h)? => {}
            Built::Table(Some(h)) => {
                let state = &self.vips[&id];
                let (region, next) = (state.region, 1 - state.live_half());
                self.write_half(region.half_base(next), &h, report)?;
                region.point(&mut meta, next);
                meta.flags &= !VIP_F_NO_BACKENDS;
                swapped = true;
            }
        }
        let state = self.vips.get_mut(&id).expect("present");
        if is_new || meta != state.meta {
            self.dp.upsert_vip(&id.key(), &meta)?;
            state.meta = meta;
            if !is_new {
                report.vips_updated += 1;
            }
            if swapped {
                report.tables_published += 1;
                debug!(vip = %id, "table swapped");
            }
        }
        Ok(())
    }

    /// `table` is what `id` publishes now. Known without a look when the
    /// builder's input is known (a changed input is a changed table);
    /// otherwise (adopted from pinned maps) read from the kernel, so a
    /// restart with the same configuration writes no table.
    fn is_live(&self, id: &VipId, table: &[u32]) -> Result<bool> {
        let state = &self.vips[id];
        if state.built.is_some() || !state.has_table() {
            return Ok(false);
        }
        Ok(self.live_table(id)?.is_some_and(|live| live == table))
    }

    /// Writes `table` into the (inactive) half at `base`, chunk by chunk
    /// where it differs from what the kernel holds there.
    fn write_half(&mut self, base: u32, table: &[u32], report: &mut ApplyReport) -> Result<()> {
        let old = self.dp.read_table(base, table.len() as u32)?;
        for (c, (new, old)) in table
            .chunks(TABLE_CHUNK_SLOTS as usize)
            .zip(old.chunks(TABLE_CHUNK_SLOTS as usize))
            .enumerate()
        {
            if new != old {
                self.dp.write_table(base + c as u32, new)?;
                report.chunks_written += 1;
            }
        }
        Ok(())
    }

    /// What the datapath would do with a packet of `flow`.
    pub fn simulate(&self, flow: &FlowKey, syn: bool) -> Result<Option<Prediction>> {
        Ok(predict::predict(&self.dp, flow, syn)?)
    }

    /// [`simulate`](Self::simulate) for a UDP datagram carrying `payload`
    /// (a QUIC VIP reads its connection ID).
    pub fn simulate_payload(
        &self,
        flow: &FlowKey,
        syn: bool,
        payload: Option<&[u8]>,
    ) -> Result<Option<Prediction>> {
        Ok(predict::predict_payload(&self.dp, flow, syn, payload)?)
    }

    /// The VIP and address of the backend with `handle`, if any.
    pub fn backend_by_handle(&self, handle: u32) -> Option<(VipId, IpAddr)> {
        self.vips.iter().find_map(|(id, v)| {
            v.backends
                .iter()
                .find(|(_, b)| b.handle == handle)
                .map(|(a, _)| (*id, *a))
        })
    }

    /// Counters of every VIP (every packet that matched it: its own count
    /// plus its backends') and of each of its backends, read in a few
    /// batch lookups.
    pub fn all_vip_counters(&self) -> Result<BTreeMap<VipId, VipCounters>> {
        let vips = self.dp.all_vip_stats()?;
        let backends = self.dp.all_backend_stats()?;
        let at = |all: &[CounterValue], i: u32| all.get(i as usize).copied().unwrap_or_default();
        Ok(self
            .vips
            .iter()
            .map(|(id, v)| {
                let by_backend: Vec<(IpAddr, CounterValue)> = v
                    .backends
                    .iter()
                    .map(|(addr, b)| (*addr, at(&backends, b.handle & BACKEND_INDEX_MASK)))
                    .collect();
                let mut total = at(&vips, v.meta.id());
                for (_, counts) in &by_backend {
                    total += *counts;
                }
                (*id, (total, by_backend))
            })
            .collect())
    }

    /// Counters of one VIP (every packet that matched it: its own count
    /// plus its backends') and of each of its backends.
    pub fn vip_counters(&self, id: &VipId) -> Result<Option<VipCounters>> {
        let Some(v) = self.vips.get(id) else {
            return Ok(None);
        };
        let mut vip = self.dp.vip_stats(v.meta.id())?;
        let mut backends = Vec::new();
        for (addr, b) in &v.backends {
            let counts = self.dp.backend_stats(b.handle & BACKEND_INDEX_MASK)?;
            vip += counts;
            backends.push((*addr, counts));
        }
        Ok(Some((vip, backends)))
    }
}

/// The builder's input for `members` (address → effective weight, in
/// address order): those with a weight; those of weight 0 take no slot.
fn maglev_input(members: impl Iterator<Item = (IpAddr, u32)>) -> Vec<MaglevBackend> {
    members
        .filter(|(_, w)| *w > 0)
        .map(|(addr, weight)| MaglevBackend { addr, weight })
        .collect()
}

/// The Maglev table over `members` (address → effective weight; those of
/// weight 0 take no slot), as the backend address of each slot; `None`
/// when no member has a weight. The reconciler publishes exactly this
/// table (as handles), so a preview built with it is what an apply builds.
pub fn maglev_table(
    members: &BTreeMap<IpAddr, u32>,
    m: u32,
) -> std::result::Result<Option<Vec<IpAddr>>, MaglevError> {
    let input = maglev_input(members.iter().map(|(a, w)| (*a, *w)));
    Ok(match maglev::build(&input, m)? {
        MaglevTable::Empty => None,
        MaglevTable::Slots(slots) => {
            Some(slots.into_iter().map(|i| input[i as usize].addr).collect())
        }
    })
}

/// An auxiliary `LB_VIPS` key (ICMP or fragment policy), not a VIP.
pub fn is_aux_key(key: &VipKey) -> bool {
    key.family & KEY_FRAGMENTS != 0 || key.proto == PROTO_ICMP || key.proto == PROTO_ICMPV6
}

/// A random 64-bit seed from the kernel.
fn random_seed() -> u64 {
    let mut buf = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut buf).is_ok() {
            return u64::from_ne_bytes(buf) | 1;
        }
    }
    // Fallback: time-based, still unpredictable enough from outside.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    lb_common::flow::fmix64(t ^ u64::from(std::process::id())) | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::{BackendConfig, Protocol},
        dataplane::fake::FakeDataplane,
        second_chance,
    };

    /// A small layout (also `ct_v6`'s tests').
    pub(super) fn layout() -> Layout {
        Layout {
            table_size: 2053,
            max_vips: 4,
            max_backends: 16,
            ct_buckets: 16,
            table_pool: 0,
            second_chance_vips: 2,
        }
    }

    fn vip(addr: &str, port: u16, backends: &[(&str, u32)]) -> VipConfig {
        let id = VipId {
            addr: addr.parse().unwrap(),
            port,
            proto: Protocol::Tcp,
        };
        let backends = backends
            .iter()
            .map(|(a, w)| BackendConfig::new(a.parse().unwrap(), *w))
            .collect();
        VipConfig::new(id, backends)
    }

    fn all(_: &VipId, _: &IpAddr) -> bool {
        true
    }

    fn owners(r: &Reconciler<FakeDataplane>, id: &VipId) -> BTreeMap<IpAddr, usize> {
        let state = &r.vips()[id];
        let meta = r.dataplane().vip(&id.key()).unwrap().unwrap();
        assert_eq!(meta, state.meta, "kernel metadata matches the shadow");
        let table = r
            .dataplane()
            .read_table(meta.table_base, r.layout().table_size)
            .unwrap();
        assert_eq!(
            Some(table.clone()),
            r.live_table(id).unwrap(),
            "the live half is the one the entry names"
        );
        let mut counts = BTreeMap::new();
        for h in table {
            let (_, addr) = r.backend_by_handle(h).expect("slot names a known backend");
            *counts.entry(addr).or_default() += 1;
        }
        counts
    }

    #[test]
    fn builds_tables_and_swaps_halves() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let v = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 1)]);
        let rep = r.apply(std::slice::from_ref(&v), &all).unwrap();
        assert_eq!(
            (rep.vips_added, rep.backends_added, rep.tables_published),
            (1, 2, 1)
        );
        assert_eq!(owners(&r, &v.id).len(), 2);
        let half = r.vips()[&v.id].live_half();

        let v2 = vip(
            "10.0.0.1",
            80,
            &[("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 2)],
        );
        let rep = r.apply(std::slice::from_ref(&v2), &all).unwrap();
        assert_eq!((rep.backends_added, rep.tables_published), (1, 1));
        assert_ne!(r.vips()[&v2.id].live_half(), half, "halves flipped");
        let o = owners(&r, &v2.id);
        assert!(
            o[&"10.1.0.3".parse::<IpAddr>().unwrap()] > o[&"10.1.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn the_same_state_writes_nothing() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let vs = [
            vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 3)]),
            vip("10.0.0.2", 0, &[("10.1.0.9", 1)]),
        ];
        r.apply(&vs, &all).unwrap();
        let writes = r.dataplane().writes;
        assert!(r.apply(&vs, &all).unwrap().is_noop());
        assert_eq!(
            r.dataplane().writes,
            writes,
            "no map writes for an unchanged state"
        );
    }

    #[test]
    fn only_vips_whose_builder_input_changed_are_built() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let mut vs = vec![
            vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 3)]),
            vip("10.0.0.2", 80, &[("10.1.0.3", 1), ("10.1.0.4", 0)]),
            vip("10.0.0.3", 80, &[("10.1.0.5", 1)]),
        ];
        assert_eq!(r.apply(&vs, &all).unwrap().table_builds.len(), 3);
        assert!(r.apply(&vs, &all).unwrap().table_builds.is_empty());
        // One backend more in one VIP: one build, one table.
        vs[2] = vip("10.0.0.3", 80, &[("10.1.0.5", 1), ("10.1.0.6", 1)]);
        let rep = r.apply(&vs, &all).unwrap();
        assert_eq!((rep.table_builds.len(), rep.tables_published), (1, 1));
        // A zero-weight backend's weight, or an unusable one, is no input.
        vs[1] = vip(
            "10.0.0.2",
            80,
            &[("10.1.0.3", 1), ("10.1.0.4", 0), ("10.1.0.7", 0)],
        );
        let rep = r.apply(&vs, &all).unwrap();
        assert_eq!((rep.table_builds.len(), rep.backends_added), (0, 1));
        // After a restart the first apply builds, finds the same tables in
        // the kernel and writes none.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut again = Reconciler::adopt(dp).unwrap();
        let writes = again.dataplane().writes;
        let rep = again.apply(&vs, &all).unwrap();
        assert_eq!((rep.table_builds.len(), rep.tables_published), (3, 0));
        assert_eq!(again.dataplane().writes, writes);
        assert!(again.apply(&vs, &all).unwrap().table_builds.is_empty());
    }

    #[test]
    fn a_weight_change_writes_only_changed_chunks() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let backends: Vec<(String, u32)> = (1..=8).map(|i| (format!("10.1.0.{i}"), 1)).collect();
        let b: Vec<(&str, u32)> = backends.iter().map(|(a, w)| (a.as_str(), *w)).collect();
        r.apply(&[vip("10.0.0.1", 80, &b)], &all).unwrap();
        // Second apply fills the other half fully (it held zeros).
        let mut b2 = b.clone();
        b2[0].1 = 2;
        r.apply(&[vip("10.0.0.1", 80, &b2)], &all).unwrap();
        // Third: back to the first table, which the inactive half still holds.
        let rep = r.apply(&[vip("10.0.0.1", 80, &b)], &all).unwrap();
        assert_eq!(rep.tables_published, 1);
        assert_eq!(
            rep.chunks_written, 0,
            "the inactive half already held this table"
        );
    }

    #[test]
    fn removing_backends_and_vips_retires_handles_with_new_generations() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let v = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 1)]);
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let old = r.vips()[&v.id].backends[&"10.1.0.2".parse::<IpAddr>().unwrap()].handle;
        let rep = r
            .apply(&[vip("10.0.0.1", 80, &[("10.1.0.1", 1)])], &all)
            .unwrap();
        assert_eq!(rep.backends_removed, 1);
        let def = r.dataplane().backend(old & BACKEND_INDEX_MASK).unwrap();
        assert_eq!(
            (def.handle, def.flags, def.family),
            (old, 0, 0),
            "retired, handle kept"
        );
        // The freed index is reused with a new generation.
        r.apply(
            &[vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.7", 1)])],
            &all,
        )
        .unwrap();
        let new = r.vips()[&v.id].backends[&"10.1.0.7".parse::<IpAddr>().unwrap()].handle;
        assert_eq!(new & BACKEND_INDEX_MASK, old & BACKEND_INDEX_MASK);
        assert_ne!(new, old);

        let rep = r.apply(&[], &all).unwrap();
        assert_eq!(rep.vips_removed, 1);
        assert_eq!(r.dataplane().vip(&v.id.key()).unwrap(), None);
        assert!(
            r.dataplane()
                .backend(new & BACKEND_INDEX_MASK)
                .unwrap()
                .flags
                == 0
        );
    }

    #[test]
    fn reused_backend_indexes_and_vip_ids_start_their_counters_at_zero() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let a = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 1)]);
        r.apply(std::slice::from_ref(&a), &all).unwrap();
        let handle = |r: &Reconciler<FakeDataplane>, vip: &VipConfig, addr: &str| {
            r.vips()[&vip.id].backends[&addr.parse::<IpAddr>().unwrap()].handle
        };
        let old = handle(&r, &a, "10.1.0.2") & BACKEND_INDEX_MASK;
        let vip_id = r.vips()[&a.id].meta.id();
        let seen = lb_common::CounterValue {
            packets: 7,
            bytes: 700,
        };
        r.dataplane_mut().backend_stats[old as usize] = seen;
        r.dataplane_mut().vip_stats[vip_id as usize] = seen;

        // 10.1.0.2 leaves; 10.1.0.7 takes its index, without its packets;
        // the VIP carries on, with its counters and the leaver's.
        r.apply(&[vip("10.0.0.1", 80, &[("10.1.0.1", 1)])], &all)
            .unwrap();
        let a2 = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.7", 1)]);
        r.apply(std::slice::from_ref(&a2), &all).unwrap();
        assert_eq!(handle(&r, &a2, "10.1.0.7") & BACKEND_INDEX_MASK, old);
        assert_eq!(
            r.dataplane().backend_stats(old).unwrap(),
            Default::default()
        );
        let mut both = seen;
        both += seen;
        assert_eq!(r.dataplane().vip_stats(vip_id).unwrap(), both);

        // A new VIP takes the id of one that went, without its packets.
        r.apply(&[], &all).unwrap();
        let b = vip("10.0.0.2", 443, &[("10.1.0.3", 1)]);
        r.apply(std::slice::from_ref(&b), &all).unwrap();
        assert_eq!(r.vips()[&b.id].meta.id(), vip_id);
        assert_eq!(r.dataplane().vip_stats(vip_id).unwrap(), Default::default());
    }

    #[test]
    fn unusable_and_zero_weight_backends_leave_the_table_but_keep_their_handle() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let v = vip(
            "10.0.0.1",
            80,
            &[("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 0)],
        );
        let down: IpAddr = "10.1.0.2".parse().unwrap();
        r.apply(std::slice::from_ref(&v), &|_, a| *a != down)
            .unwrap();
        let o = owners(&r, &v.id);
        assert_eq!(
            o.keys().collect::<Vec<_>>(),
            vec![&"10.1.0.1".parse::<IpAddr>().unwrap()]
        );
        let h = r.vips()[&v.id].backends[&down].handle;
        assert_eq!(
            r.dataplane().backend(h & BACKEND_INDEX_MASK).unwrap().flags,
            0,
            "not usable"
        );
        // Zero weight but usable: out of the table, existing flows honoured.
        let z = r.vips()[&v.id].backends[&"10.1.0.3".parse::<IpAddr>().unwrap()].handle;
        assert_eq!(
            r.dataplane().backend(z & BACKEND_INDEX_MASK).unwrap().flags,
            BACKEND_F_USABLE
        );
    }

    #[test]
    fn no_backends_is_an_explicit_state() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let v = vip("10.0.0.1", 80, &[("10.1.0.1", 1)]);
        r.apply(std::slice::from_ref(&v), &|_, _| false).unwrap();
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_ne!(meta.flags & VIP_F_NO_BACKENDS, 0);
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_eq!(meta.flags & VIP_F_NO_BACKENDS, 0);
    }

    #[test]
    fn adopting_existing_maps_restores_the_view_and_changes_nothing() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let vs = [
            vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 1)]),
            vip("10.0.0.2", 443, &[("10.1.0.3", 1)]),
        ];
        r.apply(&vs, &all).unwrap();
        r.apply(&vs[..1], &all).unwrap();
        r.apply(&vs, &all).unwrap();
        let before: Vec<_> = r
            .vips()
            .iter()
            .map(|(k, v)| (*k, v.meta, v.backends.clone()))
            .collect();
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let writes = dp.writes;
        let mut again = Reconciler::adopt(dp).unwrap();
        let after: Vec<_> = again
            .vips()
            .iter()
            .map(|(k, v)| (*k, v.meta, v.backends.clone()))
            .collect();
        assert_eq!(before, after);
        assert!(again.apply(&vs, &all).unwrap().is_noop());
        assert_eq!(again.dataplane().writes, writes);
    }

    #[test]
    fn limits_are_errors_not_panics() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let many: Vec<VipConfig> = (0..5)
            .map(|i| vip(&format!("10.0.0.{i}"), 80, &[("10.1.0.1", 1)]))
            .collect();
        assert!(matches!(
            r.apply(&many, &all),
            Err(ReconcileError::VipIdsExhausted(4))
        ));
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let backends: Vec<(String, u32)> = (1..=17).map(|i| (format!("10.1.0.{i}"), 1)).collect();
        let b: Vec<(&str, u32)> = backends.iter().map(|(a, w)| (a.as_str(), *w)).collect();
        assert!(matches!(
            r.apply(&[vip("10.0.0.1", 80, &b)], &all),
            Err(ReconcileError::BackendsExhausted(16))
        ));
    }

    /// A reconciler with VIP A (10.1.0.1, 10.1.0.2) and VIP B (10.1.0.3)
    /// applied, and the two VIPs.
    fn two_vips() -> (Reconciler<FakeDataplane>, VipConfig, VipConfig) {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let a = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.2", 1)]);
        let b = vip("10.0.0.2", 80, &[("10.1.0.3", 1)]);
        r.apply(&[a.clone(), b.clone()], &all).unwrap();
        (r, a, b)
    }

    /// A backend retired by an apply that then fails elsewhere, given back
    /// by the next apply, takes its counts out of its VIP's retired total
    /// again (helper-34: they were counted twice, there and as its own).
    #[test]
    fn an_undone_retirement_counts_the_backend_once() {
        let (mut r, a, b) = two_vips();
        let gone: IpAddr = "10.1.0.2".parse().unwrap();
        let handle = r.vips()[&a.id].backends[&gone].handle;
        let index = (handle & BACKEND_INDEX_MASK) as usize;
        let vip_id = r.vips()[&a.id].meta.id() as usize;
        let counts = CounterValue {
            packets: 10,
            bytes: 1000,
        };
        r.dataplane_mut().backend_stats[index] = counts;
        // A drops the backend (retired, counted into A's total); B's entry
        // write then fails: the apply stops half-way.
        let a_less = vip("10.0.0.1", 80, &[("10.1.0.1", 1)]);
        let b_more = vip("10.0.0.2", 80, &[("10.1.0.3", 1), ("10.1.0.4", 1)]);
        r.dataplane_mut().refuse_vip = Some(b.id.key());
        assert!(r.apply(&[a_less, b_more], &all).is_err());
        assert_eq!(r.dataplane().vip_stats[vip_id], counts, "retired, counted");
        r.dataplane_mut().refuse_vip = None;
        r.apply(&[a.clone(), b.clone()], &all).unwrap();
        assert_eq!(r.vips()[&a.id].backends[&gone].handle, handle, "given back");
        assert_eq!(r.dataplane().backend_stats[index], counts, "its own again");
        assert_eq!(r.dataplane().vip_stats[vip_id], CounterValue::default());

        // Retired and counted again; then a failed apply removes A, whose
        // id a new VIP takes before A and its backend return: nothing is
        // taken out of the new VIP's total (helper-35: it wrapped).
        let a_less = vip("10.0.0.1", 80, &[("10.1.0.1", 1)]);
        let b_more = vip("10.0.0.2", 80, &[("10.1.0.3", 1), ("10.1.0.4", 1)]);
        r.dataplane_mut().refuse_vip = Some(b.id.key());
        assert!(r.apply(&[a_less, b_more.clone()], &all).is_err());
        assert!(
            r.apply(std::slice::from_ref(&b_more), &all).is_err(),
            "A removed, B refused"
        );
        r.dataplane_mut().refuse_vip = None;
        let c = vip("10.0.0.3", 80, &[("10.1.0.5", 1)]);
        r.apply(&[c.clone(), a.clone(), b.clone()], &all).unwrap();
        let c_id = r.vips()[&c.id].meta.id() as usize;
        assert_eq!(c_id, vip_id, "the new VIP took A's id");
        assert_eq!(r.dataplane().vip_stats[c_id], CounterValue::default());
    }

    /// After an apply that failed half-way, a verdict's partial apply of
    /// another VIP that succeeds does not make the maps clean: the next
    /// whole apply still gives the retired backend back under its handle
    /// (helper-41: its flows were re-picked under a new generation).
    #[test]
    fn a_partial_apply_after_a_failed_one_keeps_what_it_retired() {
        let (mut r, a, b) = two_vips();
        let gone: IpAddr = "10.1.0.2".parse().unwrap();
        let handle = r.vips()[&a.id].backends[&gone].handle;
        let a_less = vip("10.0.0.1", 80, &[("10.1.0.1", 1)]);
        let b_more = vip("10.0.0.2", 80, &[("10.1.0.3", 1), ("10.1.0.4", 1)]);
        r.dataplane_mut().refuse_vip = Some(b.id.key());
        assert!(r.apply(&[a_less, b_more], &all).is_err());
        r.dataplane_mut().refuse_vip = None;
        r.apply_some(std::slice::from_ref(&b), &all)
            .expect("a verdict's apply of B");
        r.apply(&[a.clone(), b.clone()], &all).unwrap();
        assert_eq!(r.vips()[&a.id].backends[&gone].handle, handle, "given back");
    }

    #[test]
    fn failed_writes_surface_as_errors() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.dataplane_mut().fail_writes = Some("injected".into());
        let err = r
            .apply(&[vip("10.0.0.1", 80, &[("10.1.0.1", 1)])], &all)
            .unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
    }

    /// `LB_VIPS` full (4 VIPs of `max_vips` 4 on four addresses: 4 main,
    /// 4 ICMP and 4 fragment keys of 12): a VIP moved to another address
    /// fits, whether running or adopted after a restart, because the old
    /// address's keys go before the new one's come.
    #[test]
    fn a_vip_moved_to_another_address_fits_a_full_map() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let at = |addr: &str| vip(addr, 80, &[("10.1.0.1", 1)]);
        let four: Vec<VipConfig> = (1..=4).map(|i| at(&format!("10.0.0.{i}"))).collect();
        r.apply(&four, &all).unwrap();
        assert_eq!(r.dataplane().vips().unwrap().len(), 12, "full");
        let mut moved = four.clone();
        moved[3] = at("10.0.9.9");
        r.apply(&moved, &all).expect("moved while running");
        assert_eq!(r.dataplane().vips().unwrap().len(), 12);
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        moved[2] = at("10.0.9.8");
        r.apply(&moved, &all).expect("moved after a restart");
        let keys = r.dataplane().vips().unwrap();
        assert_eq!(keys.len(), 12);
        let icmp_of = |addr: &str| VipKey {
            port: 0,
            proto: PROTO_ICMP,
            ..at(addr).id.key()
        };
        assert!(keys.iter().any(|(k, _)| *k == icmp_of("10.0.9.8")));
        assert!(!keys.iter().any(|(k, _)| *k == icmp_of("10.0.0.3")));
    }

    #[test]
    fn auxiliary_keys_follow_the_vip_set() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let mut dns = vip("10.0.0.1", 53, &[("10.1.0.1", 1)]);
        dns.id.proto = Protocol::Udp;
        dns.fragments = FragmentPolicy::Hash;
        let web = vip("10.0.0.1", 80, &[("10.1.0.1", 1)]);
        let v6 = vip("2001:db8::1", 80, &[("fd00::1", 1)]);
        r.apply(&[dns.clone(), web.clone(), v6.clone()], &all)
            .unwrap();
        let aux = |r: &Reconciler<FakeDataplane>| -> HashMap<VipKey, VipMeta> {
            r.dataplane()
                .vips()
                .unwrap()
                .into_iter()
                .filter(|(k, _)| is_aux_key(k))
                .collect()
        };
        let keys = aux(&r);
        // ICMP: one per address; fragments: one per address and protocol.
        assert_eq!(keys.len(), 2 + 3, "{keys:?}");
        let frag_udp = VipKey {
            port: 0,
            family: FAMILY_V4 | KEY_FRAGMENTS,
            ..dns.id.key()
        };
        assert_eq!(keys[&frag_udp].flags, VIP_F_FRAG_HASH);
        assert_eq!(keys[&frag_udp].aux_port, 53u16.to_be());
        let frag_tcp = VipKey {
            port: 0,
            family: FAMILY_V4 | KEY_FRAGMENTS,
            ..web.id.key()
        };
        assert_eq!(keys[&frag_tcp].flags, 0, "tcp fragments are dropped");
        let icmp6 = VipKey {
            port: 0,
            proto: PROTO_ICMPV6,
            ..v6.id.key()
        };
        assert!(keys.contains_key(&icmp6));
        // The VIP itself carries the flag for its whole packets.
        assert_ne!(r.vips()[&dns.id].meta.flags & VIP_F_FRAG_HASH, 0);
        assert_eq!(r.vips()[&web.id].meta.flags & VIP_F_FRAG_HASH, 0);

        // A restart adopts only the VIPs.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        assert_eq!(r.vips().len(), 3);

        // Without the IPv6 VIP and the hash policy.
        dns.fragments = FragmentPolicy::Drop;
        r.apply(&[dns.clone(), web], &all).unwrap();
        let keys = aux(&r);
        assert_eq!(keys.len(), 1 + 2, "{keys:?}");
        assert!(!keys.contains_key(&icmp6), "gone with its address");
        assert_eq!(keys[&frag_udp].flags, 0, "policy back to drop");
        assert_eq!(r.vips()[&dns.id].meta.flags & VIP_F_FRAG_HASH, 0);
    }

    /// The addresses region `index` lists for each slot, read back.
    fn listed(r: &Reconciler<FakeDataplane>, index: u16) -> Vec<Vec<IpAddr>> {
        let l = r.layout();
        r.dataplane()
            .read_alternates(l.alt_base(index), l.table_size)
            .unwrap()
            .iter()
            .map(|slot| {
                slot.iter()
                    .take_while(|&&h| h != 0)
                    .map(|&h| r.backend_by_handle(h).expect("a live backend").1)
                    .collect()
            })
            .collect()
    }

    fn second_chance(addr: &str, backends: &[(&str, u32)]) -> VipConfig {
        VipConfig {
            second_chance: true,
            ..vip(addr, 80, backends)
        }
    }

    #[test]
    fn second_chance_vips_get_their_alternates_and_a_region_each() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let three = [("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 1)];
        let v = second_chance("10.0.0.1", &three);
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_ne!(meta.flags & VIP_F_SECOND_CHANCE, 0);
        assert_eq!(meta.alt_index, 0);
        for b in r.vips()[&v.id].backends.values() {
            let def = r
                .dataplane()
                .backend(b.handle & BACKEND_INDEX_MASK)
                .unwrap();
            assert_ne!(def.flags & BACKEND_F_SECOND_CHANCE, 0);
        }
        // What the region holds is what the module computes.
        let want = second_chance::alternates(
            &Sources {
                configured: second_chance::configured_members(&v, 1),
                previous: None,
            },
            r.layout().table_size,
        )
        .unwrap();
        let got = listed(&r, 0);
        let table = r.table_addresses(&v.id).unwrap().unwrap();
        for (s, list) in got.iter().enumerate() {
            assert_eq!(*list, want.slot(s).collect::<Vec<_>>(), "slot {s}");
            // All healthy: the configured table is the published one, so
            // the datapath skips the first alternate as the backend itself.
            assert_eq!(Some(list[0]), table[s], "slot {s}");
        }
        assert!(r.apply(std::slice::from_ref(&v), &all).unwrap().is_noop());

        // One region each; no third.
        let w = second_chance("10.0.0.2", &three);
        let x = second_chance("10.0.0.3", &three);
        r.apply(&[v.clone(), w.clone()], &all).unwrap();
        assert_eq!(r.vips()[&w.id].meta.alt_index, 1);
        assert!(matches!(
            r.apply(&[v.clone(), w.clone(), x.clone()], &all),
            Err(ReconcileError::AlternatesExhausted(2))
        ));

        // Off: the entry and the backends lose the flag, the region is free.
        let off = VipConfig {
            second_chance: false,
            ..v.clone()
        };
        r.apply(&[off.clone(), w.clone()], &all).unwrap();
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_eq!(meta.flags & VIP_F_SECOND_CHANCE, 0);
        for b in r.vips()[&v.id].backends.values() {
            let def = r
                .dataplane()
                .backend(b.handle & BACKEND_INDEX_MASK)
                .unwrap();
            assert_eq!(def.flags & BACKEND_F_SECOND_CHANCE, 0);
        }
        r.apply(&[off, w, x.clone()], &all).unwrap();
        assert_eq!(r.vips()[&x.id].meta.alt_index, 0);
    }

    #[test]
    fn a_region_moves_to_a_vip_earlier_in_the_same_apply() {
        // Two regions, both taken; the third VIP takes the region of the
        // one turning second chance off, which comes after it.
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let three = [("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 1)];
        let v = second_chance("10.0.0.1", &three);
        let w = second_chance("10.0.0.2", &three);
        let x = second_chance("10.0.0.3", &three);
        r.apply(&[v.clone(), w.clone()], &all).unwrap();
        let off = VipConfig {
            second_chance: false,
            ..v.clone()
        };
        r.apply(&[x.clone(), w.clone(), off], &all).unwrap();
        let index = |id: &VipId| r.vips()[id].meta.alt_index;
        assert_eq!(index(&x.id), 0, "the region v gave up");
        assert_eq!(index(&w.id), 1);
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_eq!(meta.flags & VIP_F_SECOND_CHANCE, 0);
        assert_eq!(listed(&r, 0).len(), r.layout().table_size as usize);
    }

    #[test]
    fn health_leaves_the_alternates_alone() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let v = second_chance(
            "10.0.0.1",
            &[("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 1)],
        );
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let before = listed(&r, 0);
        let down: IpAddr = "10.1.0.2".parse().unwrap();
        let rep = r
            .apply(std::slice::from_ref(&v), &|_, a| *a != down)
            .unwrap();
        assert_eq!(rep.tables_published, 1, "the table lost the backend");
        assert_eq!(listed(&r, 0), before, "its alternates did not");
        assert!(before.iter().any(|l| l.contains(&down)));

        // Adopted maps: the region is kept and nothing is rewritten.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let writes = dp.writes;
        let mut again = Reconciler::adopt(dp).unwrap();
        assert_eq!(again.vips()[&v.id].meta.alt_index, 0);
        again
            .apply(std::slice::from_ref(&v), &|_, a| *a != down)
            .unwrap();
        assert_eq!(again.dataplane().writes, writes);
    }

    #[test]
    fn datapath_settings_reach_the_config() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.apply_settings(&DatapathSettings {
            outer_source_v4: Some("10.99.0.0".parse().unwrap()),
            outer_source_v4_host_bits: 16,
            outer_source_v6: Some("fd00:99::".parse().unwrap()),
            outer_source_v6_host_bits: 32,
            mtu: 9000,
            gue_port: 7000,
            icmp_echo: false,
            pass_too_big: true,
            ..Default::default()
        })
        .unwrap();
        let cfg = r.dataplane().config().unwrap();
        assert_eq!(cfg.src_v4_host_mask, u32::from_ne_bytes([0, 0, 0xff, 0xff]));
        assert_eq!(cfg.src_v6_host_mask, u32::MAX);
        assert_eq!(cfg.src_v4, u32::from_ne_bytes([10, 99, 0, 0]));
        assert_eq!((cfg.mtu, cfg.gue_port), (9000, 7000u16.to_be()));
        assert_eq!(cfg.flags & CFG_F_ICMP_ECHO, 0);
        assert_ne!(cfg.flags & CFG_F_PASS_TOO_BIG, 0);
        assert_eq!(host_mask(0), 0);
        assert_eq!(host_mask(8), u32::from_ne_bytes([0, 0, 0, 0xff]));
    }

    /// The datapath's windows are written in ticks of the kernel's HZ
    /// (the same seconds everywhere); when HZ is unknown, what the maps
    /// hold, else HZ=250's ticks: never 0.
    #[test]
    fn windows_are_written_in_ticks_of_the_kernels_hz() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let windows = |r: &Reconciler<FakeDataplane>| {
            let cfg = r.dataplane().config().unwrap();
            (cfg.protect_window, cfg.syn_window)
        };
        for (hz, want) in [
            (Some(1000), (960, 160)),
            (Some(100), (96, 16)),
            (None, (96, 16)),
        ] {
            let s = DatapathSettings {
                kernel_hz: hz,
                ..Default::default()
            };
            r.apply_settings(&s).unwrap();
            assert_eq!(windows(&r), want, "HZ {hz:?}");
        }
        let mut fresh = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        fresh.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(windows(&fresh), (240, 40), "fresh maps, HZ unknown");
    }

    #[test]
    fn settings_keep_an_existing_seed() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let s = DatapathSettings {
            gateway_mac: [2, 0, 0, 0, 0, 1],
            outer_source_v4: Some("10.0.0.9".parse().unwrap()),
            malformed: MalformedPolicy::Drop,
            ..Default::default()
        };
        assert!(r.apply_settings(&s).unwrap());
        let cfg = r.dataplane().config().unwrap();
        assert_ne!(cfg.ct_seed, 0);
        assert_ne!(cfg.flags & CFG_F_DROP_MALFORMED, 0);
        assert_eq!(cfg.table_size, 2053);
        assert!(
            !r.apply_settings(&s).unwrap(),
            "unchanged settings write nothing"
        );
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut again = Reconciler::adopt(dp).unwrap();
        again.apply_settings(&s).unwrap();
        assert_eq!(again.dataplane().config().unwrap().ct_seed, cfg.ct_seed);
    }

    /// A UDP VIP with `quic:` whose backends have server IDs `00 01`...
    fn quic_vip(addr: &str, backends: &[&str]) -> VipConfig {
        let mut v = vip(
            addr,
            443,
            &backends.iter().map(|b| (*b, 1)).collect::<Vec<_>>(),
        );
        v.id.proto = Protocol::Udp;
        v.quic = Some(crate::config::quic::QuicConfig {
            server_id_len: 2,
            config_id: 0,
        });
        for (i, b) in v.backends.iter_mut().enumerate() {
            b.server_id = Some(crate::config::quic::ServerId(vec![0, i as u8 + 1]));
        }
        v
    }

    /// The `BACKEND_F_QUIC` bit of each backend entry of VIP `id`.
    fn quic_flags(r: &Reconciler<FakeDataplane>, id: &VipId) -> Vec<bool> {
        r.vips()[id]
            .backends
            .values()
            .map(|b| {
                let def = r
                    .dataplane()
                    .backend(b.handle & BACKEND_INDEX_MASK)
                    .unwrap();
                def.flags & BACKEND_F_QUIC != 0
            })
            .collect()
    }

    #[test]
    fn a_quic_vips_backends_carry_the_flag_also_after_an_older_version() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let a = quic_vip("10.0.0.1", &["10.1.0.1", "10.1.0.2"]);
        r.apply(std::slice::from_ref(&a), &all).unwrap();
        assert_eq!(quic_flags(&r, &a.id), [true, true]);
        // Entries an older version wrote have no flag: adopted, the first
        // apply rewrites them.
        let mut dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        for mut def in dp.all_backends().unwrap() {
            if def.family != 0 {
                def.flags &= !BACKEND_F_QUIC;
                dp.set_backend(def.handle & BACKEND_INDEX_MASK, &def)
                    .unwrap();
            }
        }
        let mut r = Reconciler::adopt(dp).unwrap();
        assert_eq!(quic_flags(&r, &a.id), [false, false]);
        r.apply(std::slice::from_ref(&a), &all).unwrap();
        assert_eq!(quic_flags(&r, &a.id), [true, true]);
        // `quic:` off takes the flag away; a plain VIP never has it.
        let mut off = a.clone();
        off.quic = None;
        for b in &mut off.backends {
            b.server_id = None;
        }
        let plain = vip("10.0.0.2", 80, &[("10.1.0.1", 1)]);
        r.apply(&[off.clone(), plain.clone()], &all).unwrap();
        assert_eq!(quic_flags(&r, &off.id), [false, false]);
        assert_eq!(quic_flags(&r, &plain.id), [false]);
    }

    /// `LB_QUIC_SERVERS` as (VIP id, server ID's first word, backend).
    fn quic_map(r: &Reconciler<FakeDataplane>) -> BTreeSet<(u32, u64, IpAddr)> {
        r.dataplane()
            .quic_servers()
            .unwrap()
            .into_iter()
            .map(|(k, h)| {
                let (_, addr) = r.backend_by_handle(h).expect("a live handle");
                (k.vip_id, k.sid[0], addr)
            })
            .collect()
    }

    #[test]
    fn quic_server_ids_follow_backends_and_vips() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let a = quic_vip("10.0.0.1", &["10.1.0.1", "10.1.0.2"]);
        r.apply(std::slice::from_ref(&a), &all).unwrap();
        let id = r.vips()[&a.id].meta.id();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // Octets 00 01 read as a little-endian word: 0x0100.
        let want: BTreeSet<_> = [(id, 0x0100, ip("10.1.0.1")), (id, 0x0200, ip("10.1.0.2"))].into();
        assert_eq!(quic_map(&r), want);
        let meta = r.dataplane().vip(&a.id.key()).unwrap().unwrap();
        let q = meta.quic().expect("VIP_F_QUIC set");
        assert_eq!((q.config_id, q.server_id_len), (0, 2));
        // Health writes nothing here; a removed backend's ID goes.
        let writes = r.dataplane().writes;
        r.apply(std::slice::from_ref(&a), &|_, b| *b != ip("10.1.0.2"))
            .unwrap();
        assert_eq!(quic_map(&r).len(), 2, "a down backend keeps its entry");
        assert!(r.dataplane().writes > writes, "its usable flag was written");
        let mut fewer = a.clone();
        fewer.backends.truncate(1);
        r.apply(std::slice::from_ref(&fewer), &all).unwrap();
        assert_eq!(quic_map(&r), [(id, 0x0100, ip("10.1.0.1"))].into());
        // Adoption reads the map back; then quic off clears it.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        assert_eq!(quic_map(&r).len(), 1);
        let mut off = fewer.clone();
        off.quic = None;
        off.backends[0].server_id = None;
        r.apply(std::slice::from_ref(&off), &all).unwrap();
        assert!(quic_map(&r).is_empty());
        let meta = r.dataplane().vip(&off.id.key()).unwrap().unwrap();
        assert_eq!((meta.quic(), meta.aux_port), (None, 0));
        // A removed VIP takes its IDs along.
        r.apply(std::slice::from_ref(&a), &all).unwrap();
        assert_eq!(quic_map(&r).len(), 2);
        r.apply(&[], &all).unwrap();
        assert!(r.dataplane().quic_servers().unwrap().is_empty());
    }
}

//! The reconciler: the one owner of the dataplane maps.
//!
//! It holds what the maps contain (VIP ids, backend handles, a shadow copy
//! of every active table) and turns a desired state — the VIPs with
//! their backends and weights, plus the datapath settings — into the fewest
//! map writes that make the kernel match it:
//!
//! - a VIP's table is rebuilt only if its usable backends or weights
//!   changed, written into the inactive half (only the chunks that differ
//!   from what that half holds, read back from the kernel rather than
//!   shadowed: a shadow of both halves was two thirds of `lbd`'s memory),
//!   and swapped in by replacing the VIP's
//!   metadata: packets see the old table or the new one, never a mix;
//! - a new backend is written before any table refers to it; a removed one
//!   is retired only after no table refers to it, keeping its handle so the
//!   next occupant of its index gets a new generation;
//! - unchanged VIPs and backends are not written at all;
//! - the auxiliary `LB_VIPS` keys (per address: ICMP; per address and
//!   protocol: fragment policy) follow the VIP set after every apply;
//! - a second-chance VIP's alternates ([`crate::second_chance`]) are
//!   recomputed only when their sources change (configured or previous
//!   backends and weights, never health) and written in place into the
//!   VIP's region of `LB_ALTERNATES`, chunks that differ only, after new
//!   backends and before the VIP entry names the region.
//!
//! [`Reconciler::adopt`] rebuilds this view from maps that already exist
//! (pinned by a previous `lbd`), so a restart with the same configuration
//! writes nothing and disturbs no flow.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use lb_common::{
    BackendDef, CounterValue, DatapathConfig, FlowKey, TraceFilter, VipKey, VipMeta, addr_to_words,
    consts::{
        BACKEND_F_SECOND_CHANCE, BACKEND_F_USABLE, BACKEND_INDEX_MASK, CFG_F_ALL_PORTS_VIPS,
        CFG_F_DROP_MALFORMED, CFG_F_ICMP_ECHO, CFG_F_PASS_TOO_BIG, CFG_F_TRACE, FAMILY_V4,
        GUE_PORT, KEY_FRAGMENTS, PROTO_ICMP, PROTO_ICMPV6, TABLE_CHUNK_SLOTS, VIP_F_FRAG_HASH,
        VIP_F_NO_BACKENDS, VIP_F_NO_CONNTRACK, VIP_F_SECOND_CHANCE,
    },
};
use thiserror::Error;
use tracing::{debug, info};

use crate::{
    config::{Encap, FragmentPolicy, MalformedPolicy, VipConfig, VipId},
    dataplane::{AltSlot, Dataplane, DataplaneError, Layout},
    maglev::{self, MaglevBackend, MaglevError, MaglevTable},
    predict::{self, Prediction},
    second_chance::{self, AltTable, Sources},
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
    #[error("no free backend slot: max_backends ({0}) backends are in use")]
    BackendsExhausted(u32),
    #[error("no free alternates region: second_chance_vips ({0}) VIPs have second chance")]
    AlternatesExhausted(u32),
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
            icmp_echo: true,
            pass_too_big: false,
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
    pub encap: Encap,
    pub conntrack: bool,
    /// Its backends carry `BACKEND_F_SECOND_CHANCE`.
    pub second_chance: bool,
    pub backends: BTreeMap<IpAddr, BackendState>,
    /// Contents of the active table half.
    active: Vec<u32>,
    /// Second chance: the VIP's alternates region and what it holds.
    alt: Option<AltState>,
}

/// A second-chance VIP's region of `LB_ALTERNATES`.
#[derive(Clone, Debug)]
struct AltState {
    index: u16,
    /// The sources the table was computed from, and the table.
    computed: Option<(Sources, AltTable)>,
    /// The handles the region holds, if known (read back otherwise).
    written: Option<Vec<AltSlot>>,
}

impl VipState {
    /// The VIP's alternates as addresses per slot, if it has second chance
    /// and they were computed by this process.
    pub fn alternates(&self) -> Option<&AltTable> {
        self.alt.as_ref()?.computed.as_ref().map(|(_, t)| t)
    }

    /// What those alternates were computed from.
    pub fn alternate_sources(&self) -> Option<&Sources> {
        self.alt.as_ref()?.computed.as_ref().map(|(s, _)| s)
    }

    /// The active table (handles), empty if the VIP has no backend.
    pub fn table(&self) -> &[u32] {
        if self.meta.flags & VIP_F_NO_BACKENDS != 0 {
            &[]
        } else {
            &self.active
        }
    }
}

/// What one `apply` changed, for logs and replies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub vips_added: usize,
    pub vips_removed: usize,
    pub vips_updated: usize,
    pub backends_added: usize,
    pub backends_removed: usize,
    pub tables_published: usize,
    pub chunks_written: usize,
    /// How long each table built took (one per VIP applied).
    pub table_builds: Vec<std::time::Duration>,
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

/// A VIP's counter and each of its backends' counters.
pub type VipCounters = (CounterValue, Vec<(IpAddr, CounterValue)>);

/// Owner of the maps behind a [`Dataplane`].
pub struct Reconciler<D: Dataplane> {
    dp: D,
    layout: Layout,
    vips: BTreeMap<VipId, VipState>,
    /// Handle last stored at each backend index (keeps generations), and
    /// whether the index is occupied.
    slots: Vec<(u32, bool)>,
    /// What each second-chance VIP's alternates come from (the daemon
    /// says; a VIP without an entry uses its own desired weights).
    sources: BTreeMap<VipId, Sources>,
}

/// What a backend's entry says of its VIP besides the tunnel.
#[derive(Clone, Copy)]
struct Owner {
    vip_id: u32,
    encap: Encap,
    second_chance: bool,
}

impl Owner {
    fn of(vip: &VipConfig, vip_id: u32) -> Self {
        Self {
            vip_id,
            encap: vip.encap,
            second_chance: vip.second_chance,
        }
    }
}

fn backend_def(addr: IpAddr, handle: u32, usable: bool, owner: Owner) -> BackendDef {
    let (words, family) = addr_to_words(addr);
    let mut flags = if usable { BACKEND_F_USABLE } else { 0 };
    if owner.second_chance {
        flags |= BACKEND_F_SECOND_CHANCE;
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
        let m = layout.table_size;
        let mut slots = Vec::with_capacity(layout.max_backends as usize);
        let mut by_vip: BTreeMap<u32, Vec<BackendDef>> = BTreeMap::new();
        for index in 0..layout.max_backends {
            let def = dp.backend(index)?;
            let occupied = def.family != 0 && def.handle != 0;
            slots.push((def.handle, occupied));
            if occupied {
                by_vip.entry(def.vip_id as u32).or_default().push(def);
            }
        }
        let mut vips = BTreeMap::new();
        for (key, meta) in dp.vips()? {
            let Some(id) = VipId::from_key(&key) else {
                continue;
            };
            let active_half = layout.active_half(&meta);
            let active = dp.read_table(layout.half_base(meta.vip_id, active_half), m)?;
            // Weights are not in the kernel; recover the table's view of
            // them as "in the table or not" until the desired state says.
            let in_table: BTreeSet<u32> = active.iter().copied().collect();
            let backends = by_vip
                .remove(&meta.vip_id)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|def| {
                    let addr = def.ip()?;
                    let weight = u32::from(
                        meta.flags & VIP_F_NO_BACKENDS == 0 && in_table.contains(&def.handle),
                    );
                    Some((
                        addr,
                        BackendState {
                            handle: def.handle,
                            weight,
                            usable: def.flags & BACKEND_F_USABLE != 0,
                        },
                    ))
                })
                .collect();
            let second_chance = meta.flags & VIP_F_SECOND_CHANCE != 0;
            vips.insert(
                id,
                VipState {
                    meta,
                    encap: Encap::from_code(meta.encap).unwrap_or_default(),
                    conntrack: meta.flags & VIP_F_NO_CONNTRACK == 0,
                    second_chance,
                    backends,
                    active,
                    alt: second_chance.then_some(AltState {
                        index: meta.alt_index,
                        computed: None,
                        written: None,
                    }),
                },
            );
        }
        // Backends whose VIP is gone (a crash between steps) are freed.
        let mut r = Self {
            dp,
            layout,
            vips,
            slots,
            sources: BTreeMap::new(),
        };
        for defs in by_vip.into_values() {
            for def in defs {
                r.retire_backend(def.handle)?;
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

    /// Writes the datapath settings; keeps the connection-table seed of
    /// adopted maps, picks a random one for fresh maps.
    pub fn apply_settings(&mut self, s: &DatapathSettings) -> Result<bool> {
        let old = self.dp.config()?;
        let mut cfg = old;
        self.layout.apply_to(&mut cfg);
        if cfg.ct_seed == 0 {
            cfg.ct_seed = random_seed();
        }
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
        cfg.flags = self.all_ports_flag(cfg.flags);
        for (bit, on) in [
            (CFG_F_DROP_MALFORMED, s.malformed == MalformedPolicy::Drop),
            (CFG_F_ICMP_ECHO, s.icmp_echo),
            (CFG_F_PASS_TOO_BIG, s.pass_too_big),
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
        for vip in desired {
            self.apply_vip(vip, usable, &mut report)?;
        }
        self.sync_aux_keys(desired)?;
        // The filter follows the VIP set: new VIPs become reachable, removed
        // ones stop costing a lookup.
        self.dp.sync_vip_filter()?;
        // The all-ports flag follows the VIP set.
        let cfg = self.dp.config()?;
        let flags = self.all_ports_flag(cfg.flags);
        if flags != cfg.flags {
            self.dp.set_config(&DatapathConfig { flags, ..cfg })?;
        }
        if !report.is_noop() {
            info!(?report, "dataplane updated");
        }
        Ok(report)
    }

    /// Makes the auxiliary `LB_VIPS` keys match the VIP set: an ICMP key
    /// per VIP address, a fragment key per VIP address and protocol (naming
    /// the VIP that hashes fragments, if one does). New keys are written
    /// before stale ones are removed.
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
        let have: HashMap<VipKey, VipMeta> = self
            .dp
            .vips()?
            .into_iter()
            .filter(|(k, _)| is_aux_key(k))
            .collect();
        for (key, meta) in &want {
            if have.get(key) != Some(meta) {
                self.dp.upsert_vip(key, meta)?;
            }
        }
        for key in have.keys().filter(|k| !want.contains_key(k)) {
            self.dp.remove_vip(key)?;
        }
        Ok(())
    }

    fn remove_vip(&mut self, id: &VipId) -> Result<()> {
        let Some(state) = self.vips.remove(id) else {
            return Ok(());
        };
        self.dp.remove_vip(&id.key())?;
        for b in state.backends.values() {
            self.retire_backend(b.handle)?;
        }
        info!(vip = %id, "VIP removed");
        Ok(())
    }

    fn free_vip_id(&self) -> Result<u32> {
        let used: BTreeSet<u32> = self.vips.values().map(|v| v.meta.vip_id).collect();
        (0..self.layout.max_vips)
            .find(|i| !used.contains(i))
            .ok_or(ReconcileError::VipIdsExhausted(self.layout.max_vips))
    }

    fn new_backend(&mut self, addr: IpAddr, usable: bool, owner: Owner) -> Result<u32> {
        let index = self
            .slots
            .iter()
            .position(|(_, occupied)| !occupied)
            .ok_or(ReconcileError::BackendsExhausted(self.layout.max_backends))?;
        let generation = ((self.slots[index].0 >> 16) + 1) & 0xffff;
        let handle = (generation.max(1) << 16) | index as u32;
        // The index may have served a backend before: its counters start
        // from zero, before the backend can receive a packet.
        self.dp.clear_backend_stats(index as u32)?;
        self.dp
            .set_backend(index as u32, &backend_def(addr, handle, usable, owner))?;
        self.slots[index] = (handle, true);
        Ok(handle)
    }

    /// Frees a backend's index. Its handle stays in the map with no flags,
    /// so connection-table entries pointing at it are misses.
    fn retire_backend(&mut self, handle: u32) -> Result<()> {
        let index = handle & BACKEND_INDEX_MASK;
        let def = BackendDef {
            handle,
            ..Default::default()
        };
        self.dp.set_backend(index, &def)?;
        if let Some(slot) = self.slots.get_mut(index as usize) {
            *slot = (handle, false);
        }
        Ok(())
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
        let started = std::time::Instant::now();
        let handles = self.build_table(&vip.id)?;
        report.table_builds.push(started.elapsed());
        let alt_index = if vip.second_chance {
            Some(self.sync_alternates(vip, report)?)
        } else {
            None
        };
        self.publish(vip, is_new, handles, alt_index, report)?;
        if !vip.second_chance {
            // The entry no longer names a region: it is free.
            self.vips.get_mut(&vip.id).expect("present").alt = None;
        }
        for handle in retire {
            self.retire_backend(handle)?;
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
        let m = self.layout.table_size as usize;
        self.vips.insert(
            vip.id,
            VipState {
                meta: VipMeta {
                    vip_id,
                    table_base: self.layout.half_base(vip_id, 0),
                    flags: VIP_F_NO_BACKENDS,
                    encap: vip.encap.code(),
                    ..Default::default()
                },
                encap: vip.encap,
                conntrack: vip.conntrack,
                second_chance: vip.second_chance,
                backends: BTreeMap::new(),
                // Unknown contents: never equal to a built table.
                active: vec![u32::MAX; m],
                alt: None,
            },
        );
        report.vips_added += 1;
        Ok(true)
    }

    /// Adds new backends, rewrites the ones whose usable flag or tunnel
    /// changed, and drops the ones that left from the VIP's state; returns
    /// the handles of those to retire once no table names them.
    fn sync_backends(
        &mut self,
        vip: &VipConfig,
        is_new: bool,
        usable: &dyn Fn(&VipId, &IpAddr) -> bool,
        report: &mut ApplyReport,
    ) -> Result<Vec<u32>> {
        let id = vip.id;
        let vip_id = self.vips[&id].meta.vip_id;
        let wanted: BTreeMap<IpAddr, u32> =
            vip.backends.iter().map(|b| (b.address, b.weight)).collect();
        let state = self.vips.get_mut(&id).expect("present");
        let owner_changed =
            !is_new && (state.encap != vip.encap || state.second_chance != vip.second_chance);
        state.second_chance = vip.second_chance;
        let owner = Owner::of(vip, vip_id);
        let mut retire = Vec::new();
        state.backends.retain(|addr, b| {
            let keep = wanted.contains_key(addr);
            if !keep {
                retire.push(b.handle);
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
                        handle: self.new_backend(*addr, ok, owner)?,
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

    /// The Maglev table of the VIP's usable backends with positive weight,
    /// as backend handles; `None` when there is none.
    fn build_table(&self, id: &VipId) -> Result<Option<Vec<u32>>> {
        let state = &self.vips[id];
        let members: BTreeMap<IpAddr, u32> = state
            .backends
            .iter()
            .filter(|(_, b)| b.usable)
            .map(|(a, b)| (*a, b.weight))
            .collect();
        let table = maglev_table(&members, self.layout.table_size)
            .map_err(|source| ReconcileError::Maglev { vip: *id, source })?;
        Ok(table.map(|slots| {
            slots
                .into_iter()
                .map(|addr| state.backends[&addr].handle)
                .collect()
        }))
    }

    /// The published table of `id` as backend addresses, slot by slot
    /// (`None`: the slot drops; every slot of a VIP without backends).
    /// `None` if the VIP is not programmed.
    pub fn table_addresses(&self, id: &VipId) -> Option<Vec<Option<IpAddr>>> {
        let state = self.vips.get(id)?;
        let by_handle: BTreeMap<u32, IpAddr> =
            state.backends.iter().map(|(a, b)| (b.handle, *a)).collect();
        let table = state.table();
        if table.is_empty() {
            return Some(vec![None; self.layout.table_size as usize]);
        }
        Some(table.iter().map(|h| by_handle.get(h).copied()).collect())
    }

    /// Writes a changed table into the inactive half and the VIP entry
    /// (flags, tunnel, live half) when it differs from what is published.
    fn publish(
        &mut self,
        vip: &VipConfig,
        is_new: bool,
        handles: Option<Vec<u32>>,
        alt_index: Option<u16>,
        report: &mut ApplyReport,
    ) -> Result<()> {
        let id = vip.id;
        let state = self.vips.get_mut(&id).expect("present");
        state.encap = vip.encap;
        state.conntrack = vip.conntrack;
        let mut meta = state.meta;
        meta.encap = vip.encap.code();
        meta.flags &= !(VIP_F_NO_CONNTRACK | VIP_F_FRAG_HASH | VIP_F_SECOND_CHANCE);
        if !vip.conntrack {
            meta.flags |= VIP_F_NO_CONNTRACK;
        }
        meta.alt_index = alt_index.unwrap_or(0);
        if alt_index.is_some() {
            meta.flags |= VIP_F_SECOND_CHANCE;
        }
        if vip.fragments == FragmentPolicy::Hash {
            meta.flags |= VIP_F_FRAG_HASH;
        }
        let mut swapped = false;
        match handles {
            None => meta.flags |= VIP_F_NO_BACKENDS,
            Some(h) if meta.flags & VIP_F_NO_BACKENDS == 0 && h == state.active => {}
            Some(h) => {
                meta.table_base = self.write_inactive_half(&meta, &h, report)?;
                meta.flags &= !VIP_F_NO_BACKENDS;
                self.vips.get_mut(&id).expect("present").active = h;
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

    /// Writes `table` into the half `meta` does not publish, chunk by
    /// chunk where it differs from what the kernel holds there; returns
    /// that half's base.
    fn write_inactive_half(
        &mut self,
        meta: &VipMeta,
        table: &[u32],
        report: &mut ApplyReport,
    ) -> Result<u32> {
        let half = 1 - self.layout.active_half(meta);
        let base = self.layout.half_base(meta.vip_id, half);
        let old = self.dp.read_table(base, self.layout.table_size)?;
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
        Ok(base)
    }

    /// Computes (when its sources changed) and writes (the chunks that
    /// differ) the alternates of second-chance VIP `vip`; returns its
    /// region of `LB_ALTERNATES`. Called after the VIP's new backends are
    /// written and before its entry names the region.
    fn sync_alternates(&mut self, vip: &VipConfig, report: &mut ApplyReport) -> Result<u16> {
        let id = vip.id;
        let index = self.alt_index_for(&id)?;
        let sources = self.sources.get(&id).cloned().unwrap_or_else(|| Sources {
            configured: second_chance::configured_members(vip, 1),
            previous: None,
        });
        let m = self.layout.table_size;
        let state = self.vips.get_mut(&id).expect("present");
        let alt = state.alt.get_or_insert(AltState {
            index,
            computed: None,
            written: None,
        });
        if alt.computed.as_ref().map(|(s, _)| s) != Some(&sources) {
            let table = second_chance::alternates(&sources, m)
                .map_err(|source| ReconcileError::Maglev { vip: id, source })?;
            alt.computed = Some((sources, table));
        }
        let (_, table) = alt.computed.as_ref().expect("computed above");
        let slots = alt_handles(table, &state.backends, m as usize);
        let written = alt.written.take();
        let base = self.layout.alt_base(index);
        let chunks = self.write_changed_alternates(base, &slots, written)?;
        report.chunks_written += chunks;
        let state = self.vips.get_mut(&id).expect("present");
        state.alt.as_mut().expect("set above").written = Some(slots);
        Ok(index)
    }

    /// The VIP's alternates region: the one it has, else the lowest free.
    fn alt_index_for(&self, id: &VipId) -> Result<u16> {
        if let Some(alt) = self.vips.get(id).and_then(|v| v.alt.as_ref()) {
            return Ok(alt.index);
        }
        let used: BTreeSet<u16> = self
            .vips
            .values()
            .filter_map(|v| v.alt.as_ref().map(|a| a.index))
            .collect();
        (0..self.layout.second_chance_vips)
            .map(|i| i as u16)
            .find(|i| !used.contains(i))
            .ok_or(ReconcileError::AlternatesExhausted(
                self.layout.second_chance_vips,
            ))
    }

    /// Writes the chunks of `slots` at chunk `base` of `LB_ALTERNATES` that
    /// differ from `written` (what the region held; read back if unknown);
    /// returns how many were written.
    fn write_changed_alternates(
        &mut self,
        base: u32,
        slots: &[AltSlot],
        written: Option<Vec<AltSlot>>,
    ) -> Result<usize> {
        let old = match written {
            Some(w) => w,
            None => self.dp.read_alternates(base, slots.len() as u32)?,
        };
        let size = TABLE_CHUNK_SLOTS as usize;
        let mut chunks = 0;
        for (c, (new, old)) in slots.chunks(size).zip(old.chunks(size)).enumerate() {
            if new != old {
                self.dp.write_alternates(base + c as u32, new)?;
                chunks += 1;
            }
        }
        Ok(chunks)
    }

    /// What the datapath would do with a packet of `flow`.
    pub fn simulate(&self, flow: &FlowKey, syn: bool) -> Result<Option<Prediction>> {
        Ok(predict::predict(&self.dp, flow, syn)?)
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

    /// Counters of one VIP and of each of its backends.
    pub fn vip_counters(&self, id: &VipId) -> Result<Option<VipCounters>> {
        let Some(v) = self.vips.get(id) else {
            return Ok(None);
        };
        let vip = self.dp.vip_stats(v.meta.vip_id)?;
        let mut backends = Vec::new();
        for (addr, b) in &v.backends {
            backends.push((*addr, self.dp.backend_stats(b.handle & BACKEND_INDEX_MASK)?));
        }
        Ok(Some((vip, backends)))
    }
}

/// The Maglev table over `members` (address → effective weight; those of
/// weight 0 take no slot), as the backend address of each slot; `None`
/// when no member has a weight. The reconciler publishes exactly this
/// table (as handles), so a preview built with it is what an apply builds.
pub fn maglev_table(
    members: &BTreeMap<IpAddr, u32>,
    m: u32,
) -> std::result::Result<Option<Vec<IpAddr>>, MaglevError> {
    let input: Vec<MaglevBackend> = members
        .iter()
        .filter(|(_, w)| **w > 0)
        .map(|(addr, weight)| MaglevBackend {
            addr: *addr,
            weight: *weight,
        })
        .collect();
    Ok(match maglev::build(&input, m)? {
        MaglevTable::Empty => None,
        MaglevTable::Slots(slots) => {
            Some(slots.into_iter().map(|i| input[i as usize].addr).collect())
        }
    })
}

/// The handles of `table`'s alternates, slot by slot, in order, skipping
/// those that are not a backend of the VIP now (a previous configuration's).
fn alt_handles(
    table: &AltTable,
    backends: &BTreeMap<IpAddr, BackendState>,
    m: usize,
) -> Vec<AltSlot> {
    let by_member: Vec<u32> = table
        .members
        .iter()
        .map(|a| backends.get(a).map_or(0, |b| b.handle))
        .collect();
    (0..m)
        .map(|s| {
            let mut out = AltSlot::default();
            let handles = table.slots.get(s).into_iter().flatten();
            let live = handles
                .take_while(|&&i| i != second_chance::NONE)
                .map(|&i| by_member[i as usize])
                .filter(|&h| h != 0);
            for (o, h) in out.iter_mut().zip(live) {
                *o = h;
            }
            out
        })
        .collect()
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
    };

    fn layout() -> Layout {
        Layout {
            table_size: 2053,
            max_vips: 4,
            max_backends: 16,
            ct_buckets: 16,
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
        assert_eq!(table, state.table(), "kernel table matches the shadow");
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
        let half = r.layout().active_half(&r.vips()[&v.id].meta);

        let v2 = vip(
            "10.0.0.1",
            80,
            &[("10.1.0.1", 1), ("10.1.0.2", 1), ("10.1.0.3", 2)],
        );
        let rep = r.apply(std::slice::from_ref(&v2), &all).unwrap();
        assert_eq!((rep.backends_added, rep.tables_published), (1, 1));
        assert_ne!(
            r.layout().active_half(&r.vips()[&v2.id].meta),
            half,
            "halves flipped"
        );
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
        let vip_id = r.vips()[&a.id].meta.vip_id;
        let seen = lb_common::CounterValue {
            packets: 7,
            bytes: 700,
        };
        r.dataplane_mut().backend_stats[old as usize] = seen;
        r.dataplane_mut().vip_stats[vip_id as usize] = seen;

        // 10.1.0.2 leaves; 10.1.0.7 takes its index, without its packets;
        // the VIP carries on, with its counters.
        r.apply(&[vip("10.0.0.1", 80, &[("10.1.0.1", 1)])], &all)
            .unwrap();
        let a2 = vip("10.0.0.1", 80, &[("10.1.0.1", 1), ("10.1.0.7", 1)]);
        r.apply(std::slice::from_ref(&a2), &all).unwrap();
        assert_eq!(handle(&r, &a2, "10.1.0.7") & BACKEND_INDEX_MASK, old);
        assert_eq!(
            r.dataplane().backend_stats(old).unwrap(),
            Default::default()
        );
        assert_eq!(r.dataplane().vip_stats(vip_id).unwrap(), seen);

        // A new VIP takes the id of one that went, without its packets.
        r.apply(&[], &all).unwrap();
        let b = vip("10.0.0.2", 443, &[("10.1.0.3", 1)]);
        r.apply(std::slice::from_ref(&b), &all).unwrap();
        assert_eq!(r.vips()[&b.id].meta.vip_id, vip_id);
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

    #[test]
    fn failed_writes_surface_as_errors() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.dataplane_mut().fail_writes = Some("injected".into());
        let err = r
            .apply(&[vip("10.0.0.1", 80, &[("10.1.0.1", 1)])], &all)
            .unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
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
        let table = r.table_addresses(&v.id).unwrap();
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
}

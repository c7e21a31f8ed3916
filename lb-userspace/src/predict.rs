//! What will the datapath do with this flow? The userspace model of the XDP
//! program's decision (VIP filter, connection table, recent SYNs, VIP
//! lookup, Maglev, second-chance alternates), computed from the maps
//! through a [`Dataplane`] with the same hash as the kernel; for a VIP
//! with `quic:`, the server a datagram's connection ID names. It models
//! TCP and UDP packets, not fragments or ICMP.
//!
//! `lbctl simulate` answers operators with it; the datapath tests use it as
//! the reference the kernel's output must match.

use lb_common::{
    BackendDef, DatapathConfig, FlowEntry, FlowKey, VipKey, VipMeta,
    consts::{
        BACKEND_F_QUIC, BACKEND_F_USABLE, BACKEND_INDEX_MASK, CFG_F_ALL_PORTS_VIPS,
        CFG_F_CT_V6_LEGACY, CFG_F_HASH_KEY, CT_STAMP_TIME, FAMILY_V6, PROTO_TCP, PROTO_UDP,
        SC_MAX_ALTERNATES, TABLE_CHUNK_SLOTS, VIP_F_FRAG_HASH, VIP_F_NO_BACKENDS,
        VIP_F_NO_CONNTRACK, VIP_F_SECOND_CHANCE,
    },
    flow::{ct_position, maglev_slot, pick_fields, pick_hash},
    quic::{QUIC_READ_LEN, QuicRoute, route},
};

use crate::dataplane::{Dataplane, Result};

/// How the backend was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// An existing connection-table entry.
    ConnTrack,
    /// The Maglev table (a new flow, a SYN, or a VIP without connection table).
    Maglev,
    /// The backend the flow's SYN went to, from the recent SYNs (a TCP
    /// handshake in progress: its ACK goes where its SYN went).
    Handshake,
    /// The server ID in a short-header QUIC packet's connection ID (a VIP
    /// with `quic:`), not recorded.
    QuicCid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    pub vip: VipKey,
    pub meta: VipMeta,
    pub hash: u64,
    /// Maglev slot: the VIP's pick hash (its fields, the tier's key; no
    /// ports for a VIP that hashes fragments) `% M`.
    pub slot: u32,
    /// `None`: the VIP has no usable backend, the packet is dropped.
    pub backend: Option<BackendDef>,
    pub via: Via,
    /// Second chance: the alternates the packet carries, in order (a TCP
    /// packet that is not a SYN, by Maglev, of a VIP with second chance).
    /// A packet with alternates is not recorded in the connection table.
    pub alternates: [Option<BackendDef>; SC_MAX_ALTERNATES],
}

impl Prediction {
    /// The alternates, in order.
    pub fn alternates(&self) -> impl Iterator<Item = &BackendDef> {
        self.alternates.iter().flatten()
    }
}

/// The VIP a packet of `flow` matches, as the datapath looks it up.
pub fn find_vip(dp: &dyn Dataplane, flow: &FlowKey) -> Result<Option<(VipKey, VipMeta)>> {
    let mut key = VipKey {
        addr: flow.dst,
        port: flow.dport,
        proto: flow.proto,
        family: flow.family,
    };
    if let Some(meta) = dp.vip(&key)? {
        return Ok(Some((key, meta)));
    }
    if dp.config()?.flags & CFG_F_ALL_PORTS_VIPS == 0 {
        return Ok(None);
    }
    key.port = 0;
    Ok(dp.vip(&key)?.map(|meta| (key, meta)))
}

fn live_backend(dp: &dyn Dataplane, handle: u32) -> Result<Option<BackendDef>> {
    if handle == 0 {
        return Ok(None);
    }
    let def = dp.backend(handle & BACKEND_INDEX_MASK)?;
    Ok((def.handle == handle).then_some(def))
}

/// Whether the VIP filter lets a packet of `flow` past (a clear bit
/// proves it is no VIP's; a set bit may be a false positive).
pub fn passes_filter(dp: &dyn Dataplane, flow: &FlowKey) -> Result<bool> {
    let filter = dp.vip_filter()?;
    let mut key = VipKey {
        addr: flow.dst,
        port: flow.dport,
        proto: flow.proto,
        family: flow.family,
    };
    if filter.contains(&key) {
        return Ok(true);
    }
    key.port = 0;
    Ok(dp.config()?.flags & CFG_F_ALL_PORTS_VIPS != 0 && filter.contains(&key))
}

/// The usable backend of `flow`'s connection-table entry: at its own
/// position, else (an IPv6 flow on maps adopted from an older version,
/// `CFG_F_CT_V6_LEGACY`) at its position under the older, unkeyed hash if
/// that names a backend of its own VIP (`vip_id`), which the datapath
/// moves to its own.
fn tracked_backend(
    dp: &dyn Dataplane,
    cfg: &DatapathConfig,
    flow: &FlowKey,
    vip_id: Option<u16>,
) -> Result<Option<BackendDef>> {
    let legacy = (flow.family == FAMILY_V6 && cfg.flags & CFG_F_CT_V6_LEGACY != 0)
        .then(|| flow.ct_hash_unkeyed());
    let own = std::iter::once((flow.ct_hash(&dp.ct_key()?), true));
    for (hash, at_own) in own.chain(legacy.map(|h| (h, false))) {
        let (bucket, tag) = ct_position(hash, cfg.ct_seed);
        let bucket = dp.flow_bucket(bucket & cfg.ct_mask)?;
        let entry = bucket.entries.iter().find(|e| e.0 != 0 && e.tag() == tag);
        if let Some(e) = entry
            && let Some(def) = live_backend(dp, e.handle())?
            && def.flags & BACKEND_F_USABLE != 0
            && (at_own || vip_id == Some(def.vip_id))
        {
            return Ok(Some(def));
        }
    }
    Ok(None)
}

/// The backend a SYN of `flow` keeps, as the datapath's `held_by` finds
/// it: its tuple's entry, if protected (`lb_common::ct_protected`: active
/// and seen within the configured window, a minute, by the kernel's clock; taken as seen now where
/// that clock cannot be read) and naming a usable backend of the VIP.
fn held_by(
    dp: &dyn Dataplane,
    cfg: &DatapathConfig,
    flow: &FlowKey,
    meta: &VipMeta,
) -> Result<Option<BackendDef>> {
    if flow.proto != PROTO_TCP || meta.flags & VIP_F_NO_CONNTRACK != 0 {
        return Ok(None);
    }
    let (index, tag) = ct_position(flow.ct_hash(&dp.ct_key()?), cfg.ct_seed);
    let bucket = dp.flow_bucket(index & cfg.ct_mask)?;
    let Some(way) = bucket
        .entries
        .iter()
        .position(|e| e.0 != 0 && e.tag() == tag)
    else {
        return Ok(None);
    };
    let stamp = bucket.stamps[way];
    let now = kernel_tick_or(stamp);
    if !lb_common::ct_protected(stamp, now, cfg.protect_ticks()) {
        return Ok(None);
    }
    Ok(live_backend(dp, bucket.entries[way].handle())?
        .filter(|def| def.flags & BACKEND_F_USABLE != 0 && def.vip_id == meta.vip_id))
}

/// The kernel's stamp tick now; without the kernel's clock, `stamp`'s own
/// tick stands for now.
fn kernel_tick_or(stamp: u16) -> u16 {
    crate::liveflows::jiffies().map_or(stamp & CT_STAMP_TIME, crate::liveflows::tick_of)
}

/// A TCP packet without a (usable) connection-table entry whose flow's
/// SYN is in the recent SYNs goes where that SYN went, as the datapath's
/// `syns::take` finds it: the SYN is recent if it came at most the
/// configured window before now (`DatapathConfig::syn_ticks`, ten
/// seconds) by the kernel's clock, taken as now where that clock cannot
/// be read.
fn handshake(
    dp: &dyn Dataplane,
    flow: &FlowKey,
    vip: Option<(VipKey, VipMeta)>,
    hash: u64,
    slot: u32,
) -> Result<Option<Prediction>> {
    let Some((vip, meta)) = vip else {
        return Ok(None);
    };
    if flow.proto != PROTO_TCP || meta.flags & VIP_F_NO_CONNTRACK != 0 {
        return Ok(None);
    }
    let cfg = dp.config()?;
    let (bucket, tag) = ct_position(flow.ct_hash(&dp.ct_key()?), cfg.ct_seed);
    let s = dp.syn_slot(bucket)?;
    if s.entry == FlowEntry::EMPTY || s.entry.tag() != tag {
        return Ok(None);
    }
    let now = kernel_tick_or(s.stamp);
    if now.wrapping_sub(s.stamp) & CT_STAMP_TIME > cfg.syn_ticks() {
        return Ok(None);
    }
    let Some(def) = live_backend(dp, s.entry.handle())? else {
        return Ok(None);
    };
    if def.flags & BACKEND_F_USABLE == 0 || def.vip_id != meta.vip_id {
        return Ok(None);
    }
    Ok(Some(Prediction {
        vip,
        meta,
        hash,
        slot,
        backend: Some(def),
        via: Via::Handshake,
        alternates: [None; SC_MAX_ALTERNATES],
    }))
}

/// The hash that picks the backend of a new flow of the VIP `meta`, as
/// the datapath's `vip_hash` computes it: the VIP's fields (no ports if
/// it hashes fragments), keyed with the tier's key if the datapath uses
/// one.
pub fn pick_hash_of(dp: &dyn Dataplane, meta: &VipMeta, flow: &FlowKey) -> Result<u64> {
    let key = if dp.config()?.flags & CFG_F_HASH_KEY != 0 {
        dp.hash_key()?
    } else {
        [0; 2]
    };
    Ok(pick_hash(
        &key,
        pick_fields(meta.flags),
        flow.family,
        &flow.src,
        &flow.dst,
        flow.ports_word(),
        flow.proto,
    ))
}

/// Predicts the datapath's choice for a packet of `flow`; `syn` is a TCP
/// SYN without ACK. `None` if the flow's destination is not a VIP.
///
/// The order is the datapath's: the VIP filter; for a packet that is not
/// a SYN, the connection table (a hit on a usable backend decides, the VIP
/// is not consulted), then the flow's recent SYN (TCP); then the VIP, for
/// a SYN its tuple's protected entry ([`held_by`]), and its Maglev table.
pub fn predict(dp: &dyn Dataplane, flow: &FlowKey, syn: bool) -> Result<Option<Prediction>> {
    predict_payload(dp, flow, syn, None)
}

/// [`predict`] for a UDP datagram carrying `payload` (at least its first
/// [`QUIC_READ_LEN`] bytes), which a VIP with `quic:` reads for a
/// connection ID: a server ID of a usable backend of the VIP decides,
/// also over a connection-table entry naming one of the VIP's backends
/// (`BACKEND_F_QUIC`, `quic::reroute` in the datapath).
pub fn predict_payload(
    dp: &dyn Dataplane,
    flow: &FlowKey,
    syn: bool,
    payload: Option<&[u8]>,
) -> Result<Option<Prediction>> {
    if !passes_filter(dp, flow)? {
        return Ok(None);
    }
    let vip = find_vip(dp, flow)?;
    let cfg = dp.config()?;
    let hash = flow.hash();
    // The VIP's own table size (the datapath's `maglev::lookup`), and the
    // slot of the hash that picks its backends (its fields, the key).
    let m = vip.map_or(cfg.table_size, |(_, meta)| meta.maglev_size(cfg.table_size));
    let vhash = match vip {
        Some((_, meta)) => pick_hash_of(dp, &meta, flow)?,
        None => hash,
    };
    let slot = if m == 0 { 0 } else { maglev_slot(vhash, m) };
    let prediction = |vip, meta, backend, via| Prediction {
        vip,
        meta,
        hash,
        slot,
        backend,
        via,
        alternates: [None; SC_MAX_ALTERNATES],
    };
    if !syn {
        if let Some(def) = tracked_backend(dp, &cfg, flow, vip.map(|(_, m)| m.vip_id))?
            && let Some((vip, meta)) = vip
        {
            let server = match def.flags & BACKEND_F_QUIC {
                0 => None,
                _ => quic_server(dp, flow, &meta, payload)?,
            };
            return Ok(Some(match server {
                Some(server) => prediction(vip, meta, Some(server), Via::QuicCid),
                None => prediction(vip, meta, Some(def), Via::ConnTrack),
            }));
        }
        if let Some(p) = handshake(dp, flow, vip, hash, slot)? {
            return Ok(Some(p));
        }
    }
    let Some((vip, meta)) = vip else {
        return Ok(None);
    };
    if syn && let Some(def) = held_by(dp, &cfg, flow, &meta)? {
        return Ok(Some(prediction(vip, meta, Some(def), Via::ConnTrack)));
    }
    if let Some(def) = quic_server(dp, flow, &meta, payload)? {
        return Ok(Some(prediction(vip, meta, Some(def), Via::QuicCid)));
    }
    let mut p = prediction(vip, meta, None, Via::Maglev);
    if meta.flags & VIP_F_NO_BACKENDS != 0 {
        return Ok(Some(p));
    }
    let chunk = meta.table_base + slot / TABLE_CHUNK_SLOTS;
    let within = slot % TABLE_CHUNK_SLOTS;
    let handle = dp.read_table(chunk, within + 1)?[within as usize];
    p.backend = live_backend(dp, handle)?;
    if let Some(primary) = &p.backend
        && !syn
        && flow.proto == PROTO_TCP
        && meta.flags & (VIP_F_SECOND_CHANCE | VIP_F_FRAG_HASH) == VIP_F_SECOND_CHANCE
        && m <= cfg.table_size
    {
        p.alternates = alternates(dp, &meta, slot, primary)?;
    }
    Ok(Some(p))
}

/// The server a datagram's connection ID names, as the datapath's
/// `quic::route_of` finds it: a short header to a VIP with `quic:`, the
/// configuration id and a server ID of a usable backend of the VIP.
fn quic_server(
    dp: &dyn Dataplane,
    flow: &FlowKey,
    meta: &VipMeta,
    payload: Option<&[u8]>,
) -> Result<Option<BackendDef>> {
    let (Some(params), Some(payload)) = (meta.quic(), payload) else {
        return Ok(None);
    };
    if flow.proto != PROTO_UDP {
        return Ok(None);
    }
    let bytes: Option<&[u8; QUIC_READ_LEN]> =
        payload.get(..QUIC_READ_LEN).and_then(|b| b.try_into().ok());
    let QuicRoute::Server(key) = route(meta.id(), params, bytes) else {
        return Ok(None);
    };
    let Some((_, handle)) = dp.quic_servers()?.into_iter().find(|(k, _)| *k == key) else {
        return Ok(None);
    };
    Ok(live_backend(dp, handle)?
        .filter(|def| def.flags & BACKEND_F_USABLE != 0 && def.vip_id == meta.vip_id))
}

/// The alternates the datapath lists for slot `slot` of a second-chance
/// VIP when the packet goes to `primary`: the region's entries that still
/// hold their handle, belong to the VIP, share `primary`'s family and are
/// not `primary`, in order.
fn alternates(
    dp: &dyn Dataplane,
    meta: &VipMeta,
    slot: u32,
    primary: &BackendDef,
) -> Result<[Option<BackendDef>; SC_MAX_ALTERNATES]> {
    let chunks = dp.layout().table_chunks();
    let base = meta.alt_index as u32 * chunks + slot / TABLE_CHUNK_SLOTS;
    let within = slot % TABLE_CHUNK_SLOTS;
    let handles = dp.read_alternates(base, within + 1)?[within as usize];
    let mut out = [None; SC_MAX_ALTERNATES];
    let mut n = 0;
    for handle in handles.into_iter().take_while(|&h| h != 0) {
        if handle == primary.handle {
            continue;
        }
        if let Some(def) = live_backend(dp, handle)?
            && def.vip_id == primary.vip_id
            && def.family == primary.family
        {
            out[n] = Some(def);
            n += 1;
        }
    }
    Ok(out)
}

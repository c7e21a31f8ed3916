//! `lb_xdp`: the balancer. Parse; pass what the VIP filter proves is no
//! VIP's; forward an established flow straight from the connection table;
//! otherwise find the VIP, pick the backend by Maglev, record the flow;
//! encapsulate, `XDP_TX`. Fragments and ICMP take their own short paths
//! (fragment policy, echo replies, errors routed to the flow's backend),
//! a packet too big once encapsulated is answered with ICMP, and BFD
//! control packets that are no VIP's are answered (`bfd.rs`). A QUIC VIP's
//! short-header packets go to the server their connection ID names
//! (`quic.rs`). Every
//! packet ends in exactly one outcome counter, incremented here and
//! nowhere else.
//!
//! Map pointers are looked up where they are used and checked right
//! there, never carried in an `Option` across branches: Linux 6.1's
//! verifier (Debian 12) loses the link between a pointer spilled to the
//! stack and a "was it NULL" flag computed from it, and refuses the
//! program. An array lookup is inlined by the verifier (a bounds check
//! and an add), so looking a bucket up twice costs nothing measurable.
#![no_std]
#![no_main]

mod bfd;
mod conntrack;
mod encap;
mod icmp;
mod maglev;
mod maps;
mod probe;
mod quic;
mod second_chance;
mod stats;
mod syns;
mod trace;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use lb_common::{
    BackendDef, Counter, DatapathConfig, FlowBucket, VIP_FILTER_WORDS, VipKey, VipMeta,
    consts::{
        BACKEND_F_USABLE, BACKEND_INDEX_MASK, CFG_F_ALL_PORTS_VIPS, CFG_F_CT_V6_LEGACY,
        CFG_F_DROP_MALFORMED, CFG_F_HASH_KEY, CFG_F_ICMP_ECHO, CFG_F_PASS_TOO_BIG, CFG_F_TRACE,
        CT_CLASS_CONFIRMED, CT_CLASS_NEW, FAMILY_V4, KEY_FRAGMENTS, PROTO_TCP, VIP_F_FRAG_HASH,
        VIP_F_NO_BACKENDS, VIP_F_NO_CONNTRACK, VIP_F_QUIC,
    },
    counters::Kind,
    ct_protected,
    flow::{
        ct_hash_v6, ct_hash_v6_keyed, ct_position, hash_v4, hash_v6, pick_fields, pick_hash,
        vip_filter_bit,
    },
};
use lb_ebpf::{
    hdr::{TCP_ACK, TCP_SYN},
    parse::{Packet, Reject, parse},
};
use maps::{LB_BACKENDS, LB_CONFIG, LB_CT_KEY, LB_FLOWS, LB_HASH_KEY, LB_VIP_FILTER, LB_VIPS};

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;
const TX: u32 = xdp_action::XDP_TX;

// `#[xdp]` wraps this function in the program's entry point; inlined, the
// program is one function (no BPF-to-BPF call per packet).
#[xdp]
#[inline(always)]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    entry::<false>(&ctx)
}

/// The same program, describing the packets a trace asks for: `lbd`
/// swaps it into the interfaces' links while `lbctl trace` runs, so that
/// `lb_xdp` itself carries no tracing code at all.
#[xdp]
#[inline(always)]
pub fn lb_xdp_trace(ctx: XdpContext) -> u32 {
    entry::<true>(&ctx)
}

#[inline(always)]
fn entry<const TRACE: bool>(ctx: &XdpContext) -> u32 {
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    let (action, outcome) = run::<TRACE>(ctx);
    stats::count(outcome, frame_len);
    action
}

#[inline(always)]
fn run<const TRACE: bool>(ctx: &XdpContext) -> (u32, Counter) {
    let Some(cfg) = LB_CONFIG.get(0) else {
        // Unreachable: an array always has element 0.
        return (PASS, Counter::PassNotIp);
    };
    let pkt = match parse(ctx) {
        Ok(pkt) => pkt,
        Err(Reject::NotOurs(c)) => return (PASS, c),
        Err(Reject::Malformed(c)) => {
            let action = if cfg.flags & CFG_F_DROP_MALFORMED != 0 {
                DROP
            } else {
                PASS
            };
            return (action, c);
        }
    };
    if TRACE {
        trace::note(&pkt);
    }
    let (action, outcome) = decide::<TRACE>(ctx, cfg, &pkt);
    // Forwarded packets are traced where their backend is known.
    if TRACE && cfg.flags & CFG_F_TRACE != 0 && outcome.kind() != Kind::Forward {
        trace::packet(outcome as u32, None, 0);
    }
    (action, outcome)
}

/// What to do with a parsed packet.
#[inline(always)]
fn decide<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
) -> (u32, Counter) {
    if pkt.frag {
        return fragment::<TRACE>(ctx, cfg, pkt);
    }
    if pkt.is_icmp() {
        return icmp_to_vip::<TRACE>(ctx, cfg, pkt);
    }
    if !maybe_vip(cfg, pkt) {
        return not_a_vip(ctx, pkt);
    }
    let Some(hash) = ct_hash(pkt.family, &pkt.src, &pkt.dst, pkt.ports, pkt.proto) else {
        return not_a_vip(ctx, pkt);
    };
    let (bucket_index, tag) = ct_position(hash, cfg.ct_seed);
    let syn = pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;

    // Established flows first: the connection table names the backend,
    // and the backend carries what the VIP would say (encapsulation, id),
    // so a hit needs no VIP lookup at all; but a QUIC VIP's connection ID
    // outranks its tuple's entry (`quic::reroute`).
    if !syn && let Some(def) = tracked(cfg, pkt, bucket_index, tag) {
        let (def, hashes, outcome) = match quic::reroute(ctx, cfg, pkt, def) {
            Some((server, id)) => (
                server,
                Hashes {
                    flow: hash,
                    pick: id,
                },
                Counter::FwdQuicCid,
            ),
            None => (def, Hashes::same(hash), Counter::FwdConntrack),
        };
        return forward::<TRACE>(ctx, cfg, def, pkt, hashes, outcome);
    }

    let Some(meta) = find_vip(cfg, &pkt.dst, pkt.dport(), pkt.proto, pkt.family) else {
        return not_a_vip(ctx, pkt);
    };
    // QUIC by connection ID: a moved client's packets name their server.
    if meta.flags & VIP_F_QUIC != 0 {
        match quic::route_of(ctx, pkt, &meta) {
            quic::Quic::Server(def, id) => {
                let hashes = Hashes {
                    flow: hash,
                    pick: id,
                };
                return forward::<TRACE>(ctx, cfg, def, pkt, hashes, Counter::FwdQuicCid);
            }
            quic::Quic::LongHeader => stats::count(Counter::QuicLongHeader, pkt.frame_len),
            quic::Quic::Unroutable => stats::count(Counter::QuicUnroutable, pkt.frame_len),
        }
    }
    let at = FlowAt {
        bucket_index,
        tag,
        // A tracked TCP flow has a slot in the recent SYNs.
        has_syn_slot: meta.flags & VIP_F_NO_CONNTRACK == 0 && pkt.is_tcp(),
    };
    if syn {
        return new_syn::<TRACE>(ctx, cfg, &meta, pkt, hash, at);
    }
    new_flow::<TRACE>(ctx, cfg, &meta, pkt, hash, at)
}

/// A TCP SYN (without ACK): the VIP's Maglev pick, or the backend of its
/// tuple's protected entry ([`held_by`]), written into the flow's slot of
/// the recent SYNs (never into the connection table).
#[inline(always)]
fn new_syn<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    meta: &VipMeta,
    pkt: &Packet,
    hash: u64,
    at: FlowAt,
) -> (u32, Counter) {
    let now = conntrack::now();
    let held = held_by(cfg, meta, at, now);
    let (def, hashes) = match held {
        Some(def) => (def, Hashes::same(hash)),
        None => {
            let vhash = vip_hash(
                cfg, meta, pkt.family, &pkt.src, &pkt.dst, pkt.ports, pkt.proto, hash,
            );
            let Some(def) = pick(cfg, meta, vhash) else {
                stats::vip(meta.vip_id as u32, pkt.frame_len);
                return (DROP, Counter::DropNoBackend);
            };
            let hashes = Hashes {
                flow: hash,
                pick: vhash,
            };
            (def, hashes)
        }
    };
    // A SYN the tunnel cannot carry (one with TCP Fast Open data, say) is
    // answered with "fragmentation needed" and never reaches the backend:
    // it is neither recorded nor counted, or the client's smaller retry
    // would count as a retransmission against a backend that saw neither.
    let fits = cfg.mtu == 0 || pkt.ip_len + encap::overhead(def, false) <= cfg.mtu as u32;
    let slot = if at.has_syn_slot && fits {
        syns::slot(at.bucket_index)
    } else {
        None
    };
    let outcome = match (slot, held) {
        (_, Some(_)) => Counter::FwdConntrack,
        (Some(_), None) => Counter::FwdMaglev,
        (None, None) => Counter::FwdMaglevNoConntrack,
    };
    if let Some(slot) = slot {
        let index = def.handle & BACKEND_INDEX_MASK;
        let seen = syns::record(slot, at.tag, def.handle, now, cfg.syn_ticks());
        stats::syn(index, seen);
    }
    forward::<TRACE>(ctx, cfg, def, pkt, hashes, outcome)
}

/// The backend a SYN keeps: that of its tuple's connection-table entry
/// when the entry is protected (an active flow seen within the last
/// minute, `conntrack::protected`) and names a usable backend of this
/// VIP. Anyone can spoof a SYN, and a DSR balancer never sees the answer
/// that would tell a real new connection from a forged one; a SYN that
/// went to the table's pick would re-point the entry with the next packet
/// of the flow (`reopened`), the live connection's own ACK included, and
/// break it. So a live flow is never moved by a SYN: a new connection on
/// a tuple reused within a minute lands where its predecessor did.
#[inline(always)]
fn held_by(
    cfg: &DatapathConfig,
    meta: &VipMeta,
    at: FlowAt,
    now: u16,
) -> Option<&'static BackendDef> {
    if !at.has_syn_slot {
        return None;
    }
    let bucket = LB_FLOWS.get_ptr_mut(at.bucket_index & cfg.ct_mask)?;
    let (way, handle) = conntrack::find(bucket, at.tag)?;
    if !conntrack::protected(bucket, way, now, cfg.protect_ticks()) {
        return None;
    }
    backend_of(handle).filter(|def| def.flags & BACKEND_F_USABLE != 0 && def.vip_id == meta.vip_id)
}

/// A TCP or UDP packet that is no VIP's: passed to the kernel, unless it
/// is a BFD control packet of a session `lbd` configured, which the
/// datapath answers itself (`bfd.rs`). The check costs VIP traffic
/// nothing: VIP packets never come here.
#[inline(always)]
fn not_a_vip(ctx: &XdpContext, pkt: &Packet) -> (u32, Counter) {
    if bfd::is_control(pkt)
        && let Some(done) = bfd::answer(ctx, pkt)
    {
        return done;
    }
    (PASS, Counter::PassNotVip)
}

/// Where a flow lives: its connection-table bucket (and recent-SYN slot)
/// by index, looked up where each is used, and its tag.
#[derive(Clone, Copy)]
struct FlowAt {
    bucket_index: u32,
    tag: u32,
    /// The flow is tracked TCP: it has a slot in `LB_SYNS`.
    has_syn_slot: bool,
}

/// A packet (not a SYN) of a flow the connection table does not hold:
/// the backend its recent SYN went to, else the Maglev table's; recorded
/// (confirmed if its handshake was seen here) unless the VIP keeps no
/// connection table.
#[inline(always)]
fn new_flow<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    meta: &VipMeta,
    pkt: &Packet,
    hash: u64,
    at: FlowAt,
) -> (u32, Counter) {
    let now = conntrack::now();
    let tag = at.tag;
    let answered = if at.has_syn_slot
        && let Some(slot) = syns::slot(at.bucket_index)
    {
        syns::take(slot, tag, now, cfg.syn_ticks(), None)
            .and_then(backend_of)
            .filter(|def| def.flags & BACKEND_F_USABLE != 0 && def.vip_id == meta.vip_id)
    } else {
        None
    };
    let vhash = vip_hash(
        cfg, meta, pkt.family, &pkt.src, &pkt.dst, pkt.ports, pkt.proto, hash,
    );
    let def = match answered {
        Some(def) => def,
        None => match pick(cfg, meta, vhash) {
            Some(def) => def,
            None => {
                stats::vip(meta.vip_id as u32, pkt.frame_len);
                return (DROP, Counter::DropNoBackend);
            }
        },
    };
    // Second chance: a mid-flow packet this balancer never placed carries
    // the flow's alternates and is not recorded (see `second_chance`).
    // One call of `forward_with` for both kinds keeps one copy of it.
    // A flow whose SYN went out from here a moment ago was placed here:
    // its backend is known, so it goes alone and is recorded.
    let mut alts = second_chance::Alternates::NONE;
    if answered.is_none() && second_chance::wanted(meta, pkt) {
        alts = second_chance::alternates(cfg, meta, vhash, def);
    }
    let outcome = if alts.count != 0 {
        Counter::FwdSecondChance
    } else if meta.flags & VIP_F_NO_CONNTRACK == 0
        && let Some(bucket) = LB_FLOWS.get_ptr_mut(at.bucket_index & cfg.ct_mask)
    {
        let class = if answered.is_some() {
            CT_CLASS_CONFIRMED
        } else {
            CT_CLASS_NEW
        };
        match conntrack::insert(bucket, tag, def.handle, (now, cfg.protect_ticks()), class) {
            conntrack::Evicted::Nothing => {}
            conntrack::Evicted::Unconfirmed => stats::count(Counter::CtEvicted, pkt.frame_len),
            conntrack::Evicted::Confirmed => {
                stats::count(Counter::CtEvicted, pkt.frame_len);
                stats::count(Counter::CtEvictedConfirmed, pkt.frame_len);
            }
            conntrack::Evicted::Refused => stats::count(Counter::CtInsertRefused, pkt.frame_len),
        }
        if answered.is_some() {
            Counter::FwdHandshake
        } else {
            Counter::FwdMaglev
        }
    } else {
        Counter::FwdMaglevNoConntrack
    };
    let alts = (alts.count != 0).then_some(&alts);
    let hashes = Hashes {
        flow: hash,
        pick: vhash,
    };
    forward_with::<TRACE>(ctx, cfg, def, pkt, hashes, alts, outcome)
}

/// A connection-table hit on an entry whose stamp was `last` (the tick it
/// was last seen in its low bits, `CT_STAMP_TIME`): if a SYN
/// of the flow came since (a new connection on a reused tuple), the
/// backend that SYN went to, which the entry now names. Never one of
/// another VIP than the entry's (a tuple of another VIP that shares the
/// flow's tag).
#[inline(always)]
fn reopened(
    cfg: &DatapathConfig,
    bucket: *mut FlowBucket,
    (way, old): (usize, u32),
    bucket_index: u32,
    tag: u32,
    (last, now): (u16, u16),
) -> Option<u32> {
    let slot = syns::slot(bucket_index)?;
    let handle = syns::take(slot, tag, now, cfg.syn_ticks(), Some(last))?;
    // An old backend gone leaves the entry stale: `new_flow` places the
    // packet, checking the SYN's backend against the VIP.
    if backend_of(handle)?.vip_id != backend_of(old)?.vip_id {
        return None;
    }
    conntrack::set(bucket, way, tag, handle);
    Some(handle)
}

/// The usable backend the connection table names for `pkt` (not a SYN):
/// its flow's entry, touched (re-pointed if a SYN of the flow came since it
/// was last seen, see [`reopened`]); else, on maps an older version filled,
/// the flow's entry at its older IPv6 position, moved ([`moved_v6`]).
/// Map pointers are looked up where used and checked there (module doc).
#[inline(always)]
fn tracked(
    cfg: &DatapathConfig,
    pkt: &Packet,
    bucket_index: u32,
    tag: u32,
) -> Option<&'static BackendDef> {
    if let Some(bucket) = LB_FLOWS.get_ptr_mut(bucket_index & cfg.ct_mask)
        && let Some((way, handle)) = conntrack::find(bucket, tag)
    {
        let now = conntrack::now();
        // A protected entry's SYNs went to its own backend while it was
        // usable (`held_by`): a SYN that went elsewhere moves nothing (it
        // came from a tuple that only shares the tag, or while the backend
        // was down, which the stale entry below hands to `new_flow`).
        // Asked of the stamp from before this packet, once per tick.
        let handle = match conntrack::touch(bucket, way, now) {
            Some(last) if pkt.is_tcp() && !ct_protected(last, now, cfg.protect_ticks()) => {
                reopened(cfg, bucket, (way, handle), bucket_index, tag, (last, now))
                    .inspect(|_| stats::count(Counter::CtReopened, pkt.frame_len))
                    .unwrap_or(handle)
            }
            Some(last) if pkt.is_tcp() => {
                // The SYN it answers went here too: taken, so that the
                // next connection on the tuple counts as a new flow, not
                // as its retransmission (passive health).
                if let Some(slot) = syns::slot(bucket_index) {
                    syns::take(slot, tag, now, cfg.syn_ticks(), Some(last));
                }
                handle
            }
            _ => handle,
        };
        match backend_of(handle) {
            Some(def) if def.flags & BACKEND_F_USABLE != 0 => return Some(def),
            _ => stats::count(Counter::CtStale, pkt.frame_len),
        }
    }
    if pkt.family != FAMILY_V4 && cfg.flags & CFG_F_CT_V6_LEGACY != 0 {
        let def = moved_v6(cfg, pkt, bucket_index, tag)?;
        stats::count(Counter::CtMovedV6, pkt.frame_len);
        return Some(def);
    }
    None
}

/// An IPv6 packet (not a SYN) that missed the connection table, on maps an
/// older version filled (`CFG_F_CT_V6_LEGACY`): its flow's entry at the
/// position of the older, unkeyed hash (`ct_hash_v6`), if that names a
/// usable backend of the packet's own VIP, written to the flow's own
/// position (`bucket_index`, `tag`; confirmed, as a flow with history),
/// and that backend. The old way is left to age out: against the unkeyed
/// hash a client can solve for a tuple that shares a known flow's old
/// position, and so it may follow that flow to a backend of the same VIP,
/// never another VIP's, and takes nothing from the flow. Costs one more
/// bucket on such a miss (and the VIP lookup if it finds one), nothing on
/// a hit.
#[inline(always)]
fn moved_v6(
    cfg: &DatapathConfig,
    pkt: &Packet,
    bucket_index: u32,
    tag: u32,
) -> Option<&'static BackendDef> {
    let (old_index, old_tag) = ct_position(
        ct_hash_v6(&pkt.src, &pkt.dst, pkt.ports, pkt.proto),
        cfg.ct_seed,
    );
    let old = LB_FLOWS.get_ptr_mut(old_index & cfg.ct_mask)?;
    let (_, handle) = conntrack::find(old, old_tag)?;
    let def = backend_of(handle).filter(|def| def.flags & BACKEND_F_USABLE != 0)?;
    let meta = find_vip(cfg, &pkt.dst, pkt.dport(), pkt.proto, pkt.family)?;
    if meta.vip_id != def.vip_id {
        return None;
    }
    let bucket = LB_FLOWS.get_ptr_mut(bucket_index & cfg.ct_mask)?;
    let now = (conntrack::now(), cfg.protect_ticks());
    conntrack::insert(bucket, tag, handle, now, CT_CLASS_CONFIRMED);
    Some(def)
}

/// The connection-table hash of `{src, dst, ports, proto}` in address
/// family `family` (`lb_common::flow::ct_hash`): IPv4's pinned hash, or
/// IPv6's under the box's key, whose map is read only for IPv6. `None`
/// only if `LB_CT_KEY` has no element, which an array never lacks.
#[inline(always)]
fn ct_hash(family: u8, src: &[u32; 4], dst: &[u32; 4], ports: u32, proto: u8) -> Option<u64> {
    if family == FAMILY_V4 {
        return Some(hash_v4(src[0], dst[0], ports, proto));
    }
    let key = LB_CT_KEY.get(0)?;
    Some(ct_hash_v6_keyed(&key.k, src, dst, ports, proto))
}

/// The flow hash of `{src, dst, ports, proto}` in address family `family`.
#[inline(always)]
fn flow_hash(family: u8, src: &[u32; 4], dst: &[u32; 4], ports: u32, proto: u8) -> u64 {
    if family == FAMILY_V4 {
        hash_v4(src[0], dst[0], ports, proto)
    } else {
        hash_v6(src, dst, ports, proto)
    }
}

/// The hash that picks the backend of a new flow of the VIP `meta` (its
/// Maglev slot, its second-chance alternates), the one place that says
/// which fields count: the VIP's hash fields (the 5-tuple by default; no
/// ports at all if the VIP hashes fragments, so that its fragments and
/// whole packets agree), keyed with the tier's secret if there is one.
/// `hash` is the flow's connection-table hash ([`ct_hash`]), for IPv4 its
/// unkeyed 5-tuple hash, returned as it is when nothing differs from it
/// (no cost for a plain IPv4 VIP); IPv6 computes the pinned `hash_v6`.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "the fields by reference: a struct of them would be copied onto the 512-byte stack"
)]
fn vip_hash(
    cfg: &DatapathConfig,
    meta: &VipMeta,
    family: u8,
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
    hash: u64,
) -> u64 {
    let fields = pick_fields(meta.flags);
    let keyed = cfg.flags & CFG_F_HASH_KEY != 0;
    if fields == 0 && !keyed && family == FAMILY_V4 {
        return hash;
    }
    // The key masked in, not branched on (fewer paths for the verifier).
    let k = LB_HASH_KEY.get(0).map_or([0; 2], |k| k.k);
    let on = 0u64.wrapping_sub(keyed as u64);
    pick_hash(
        &[k[0] & on, k[1] & on],
        fields,
        family,
        src,
        dst,
        ports,
        proto,
    )
}

/// The backend of a new flow of the VIP `meta`: Maglev on `vhash`, its
/// [`vip_hash`].
#[inline(always)]
fn pick(cfg: &DatapathConfig, meta: &VipMeta, vhash: u64) -> Option<&'static BackendDef> {
    if meta.flags & VIP_F_NO_BACKENDS != 0 {
        return None;
    }
    maglev::lookup(cfg, meta, vhash).and_then(backend_of)
}

/// A packet's two hashes: its flow's connection-table hash ([`ct_hash`]:
/// the GUE source port, so every packet of a connection takes one receive
/// queue), and the hash
/// its backend was picked with ([`vip_hash`]: the Maglev slot a trace
/// shows).
#[derive(Clone, Copy)]
struct Hashes {
    flow: u64,
    pick: u64,
}

impl Hashes {
    #[inline(always)]
    fn same(hash: u64) -> Self {
        Self {
            flow: hash,
            pick: hash,
        }
    }
}

/// Encapsulates for `def` and counts the packet for its VIP and itself;
/// answers with ICMP instead if the result would exceed the MTU.
#[inline(always)]
fn forward<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    def: &BackendDef,
    pkt: &Packet,
    hashes: Hashes,
    outcome: Counter,
) -> (u32, Counter) {
    forward_with::<TRACE>(ctx, cfg, def, pkt, hashes, None, outcome)
}

/// [`forward`] with second-chance alternates (`None`: as without).
#[inline(always)]
fn forward_with<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    def: &BackendDef,
    pkt: &Packet,
    hashes: Hashes,
    alts: Option<&second_chance::Alternates>,
    outcome: Counter,
) -> (u32, Counter) {
    let overhead = encap::overhead(def, alts.is_some());
    // ICMP errors are small (576 bytes for IPv4, 1280 for IPv6, at most)
    // and must never cause another.
    if cfg.mtu != 0 && pkt.ip_len + overhead > cfg.mtu as u32 && !pkt.is_icmp() {
        stats::vip(def.vip_id as u32, pkt.frame_len);
        return too_big(ctx, cfg, pkt, (cfg.mtu as u32).saturating_sub(overhead));
    }
    if encap::encapsulate(ctx, cfg, def, pkt, hashes.flow, alts).is_err() {
        stats::vip(def.vip_id as u32, pkt.frame_len);
        return (DROP, Counter::DropEncap);
    }
    // The VIP's count of forwarded packets is the sum of its backends'
    // (`lbd` adds them up), which saves a counter update per packet.
    stats::backend(def.handle & BACKEND_INDEX_MASK, pkt.frame_len);
    if TRACE && cfg.flags & CFG_F_TRACE != 0 {
        trace::packet(outcome as u32, Some(def), hashes.pick);
    }
    (TX, outcome)
}

/// A packet that would exceed the MTU once encapsulated: "fragmentation
/// needed" (IPv4 with DF) or "packet too big" (IPv6) carrying `mtu`, the
/// largest packet that fits; IPv4 without DF is dropped or passed by policy.
#[inline(always)]
fn too_big(ctx: &XdpContext, cfg: &DatapathConfig, pkt: &Packet, mtu: u32) -> (u32, Counter) {
    let (built, outcome) = if pkt.family == FAMILY_V4 {
        if !pkt.df {
            return if cfg.flags & CFG_F_PASS_TOO_BIG != 0 {
                (PASS, Counter::PassTooBigNoDf)
            } else {
                (DROP, Counter::DropTooBigNoDf)
            };
        }
        (icmp::frag_needed(ctx, pkt, mtu), Counter::ReplyFragNeeded)
    } else {
        (
            icmp::packet_too_big(ctx, pkt, mtu),
            Counter::ReplyPacketTooBig,
        )
    };
    match built {
        Ok(()) => (TX, outcome),
        Err(icmp::ReplyError) => (DROP, Counter::DropEncap),
    }
}

/// A fragment: no ports, so its VIP address and protocol decide. Dropped
/// unless a VIP there hashes fragments; then sent by the 3-tuple, like
/// every packet of that VIP. Fragments never touch the connection table.
#[inline(always)]
fn fragment<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
) -> (u32, Counter) {
    if !filter_has(&pkt.dst, 0, pkt.proto) {
        return (PASS, Counter::PassFragmentNotVip);
    }
    let mut key = VipKey {
        addr: pkt.dst,
        port: 0,
        proto: pkt.proto,
        family: pkt.family | KEY_FRAGMENTS,
    };
    let Some(policy) = lookup(&key) else {
        return (PASS, Counter::PassFragmentNotVip);
    };
    if policy.flags & VIP_F_FRAG_HASH == 0 {
        return (DROP, Counter::DropFragment);
    }
    key.port = policy.aux_port;
    key.family = pkt.family;
    let Some(meta) = lookup(&key) else {
        // The VIP went away after its policy was read.
        return (DROP, Counter::DropFragment);
    };
    let hash = flow_hash(pkt.family, &pkt.src, &pkt.dst, 0, pkt.proto);
    let vhash = vip_hash(
        cfg, &meta, pkt.family, &pkt.src, &pkt.dst, 0, pkt.proto, hash,
    );
    let Some(def) = pick(cfg, &meta, vhash) else {
        stats::vip(meta.vip_id as u32, pkt.frame_len);
        return (DROP, Counter::DropNoBackend);
    };
    let hashes = Hashes {
        flow: hash,
        pick: vhash,
    };
    forward::<TRACE>(ctx, cfg, def, pkt, hashes, Counter::FwdFragment)
}

/// ICMP or ICMPv6 to a VIP address: echo requests are answered, errors
/// about a VIP flow go to that flow's backend, the rest is the kernel's.
#[inline(always)]
fn icmp_to_vip<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
) -> (u32, Counter) {
    let key = VipKey {
        addr: pkt.dst,
        port: 0,
        proto: pkt.proto,
        family: pkt.family,
    };
    if !filter_has(&pkt.dst, 0, pkt.proto) || lookup(&key).is_none() {
        return (PASS, Counter::PassIcmp);
    }
    match icmp::classify(ctx, pkt) {
        icmp::Message::Echo if cfg.flags & CFG_F_ICMP_ECHO != 0 => {
            match icmp::echo_reply(ctx, pkt) {
                Ok(()) => (TX, Counter::ReplyIcmpEcho),
                Err(icmp::ReplyError) => (DROP, Counter::DropEncap),
            }
        }
        icmp::Message::Error(q) => icmp_error::<TRACE>(ctx, cfg, pkt, &q),
        icmp::Message::PtbTooSmall => (DROP, Counter::DropIcmpPtbTooSmall),
        _ => (PASS, Counter::PassIcmp),
    }
}

/// Sends an ICMP error to the backend of the flow it quotes: the one in
/// the connection table, else the one its recent SYN went to (TCP), else
/// the one Maglev picks (as for the flow's next packet). The error
/// creates no state.
#[inline(always)]
fn icmp_error<const TRACE: bool>(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
    q: &icmp::Quoted,
) -> (u32, Counter) {
    let Some(hash) = ct_hash(pkt.family, &q.client, &q.vip, q.ports, q.proto) else {
        return (PASS, Counter::PassIcmp);
    };
    let (bucket_index, tag) = ct_position(hash, cfg.ct_seed);
    if let Some(bucket) = LB_FLOWS.get_ptr_mut(bucket_index & cfg.ct_mask)
        && let Some((_, handle)) = conntrack::find(bucket, tag)
        && let Some(def) = backend_of(handle)
        && def.flags & BACKEND_F_USABLE != 0
    {
        return forward::<TRACE>(
            ctx,
            cfg,
            def,
            pkt,
            Hashes::same(hash),
            Counter::FwdIcmpError,
        );
    }
    let Some(meta) = find_vip(cfg, &q.vip, q.vip_port(), q.proto, pkt.family) else {
        return (PASS, Counter::PassIcmp);
    };
    if q.proto == PROTO_TCP
        && meta.flags & VIP_F_NO_CONNTRACK == 0
        && let Some(slot) = syns::slot(bucket_index)
        && let Some(handle) = syns::peek(slot, tag, conntrack::now(), cfg.syn_ticks())
        && let Some(def) = backend_of(handle)
        && def.flags & BACKEND_F_USABLE != 0
    {
        return forward::<TRACE>(
            ctx,
            cfg,
            def,
            pkt,
            Hashes::same(hash),
            Counter::FwdIcmpError,
        );
    }
    let vhash = vip_hash(
        cfg, &meta, pkt.family, &q.client, &q.vip, q.ports, q.proto, hash,
    );
    let Some(def) = pick(cfg, &meta, vhash) else {
        stats::vip(meta.vip_id as u32, pkt.frame_len);
        return (DROP, Counter::DropNoBackend);
    };
    let hashes = Hashes {
        flow: hash,
        pick: vhash,
    };
    forward::<TRACE>(ctx, cfg, def, pkt, hashes, Counter::FwdIcmpError)
}

/// Is the VIP filter's bit for `{addr, port, proto}` set? `false` proves
/// that no such key is in `LB_VIPS`.
#[inline(always)]
fn filter_has(addr: &[u32; 4], port: u16, proto: u8) -> bool {
    let Some(filter) = LB_VIP_FILTER.get(0) else {
        return true;
    };
    let bit = vip_filter_bit(addr, port, proto);
    // SAFETY: `bit / 64 < VIP_FILTER_WORDS` by construction of the bit.
    let word = unsafe {
        *filter
            .words
            .get_unchecked((bit / 64) as usize % VIP_FILTER_WORDS)
    };
    word & (1 << (bit % 64)) != 0
}

/// The VIP filter: `false` proves the packet is no VIP's.
#[inline(always)]
fn maybe_vip(cfg: &DatapathConfig, pkt: &Packet) -> bool {
    filter_has(&pkt.dst, pkt.dport(), pkt.proto)
        || (cfg.flags & CFG_F_ALL_PORTS_VIPS != 0 && filter_has(&pkt.dst, 0, pkt.proto))
}

#[inline(always)]
fn lookup(key: &VipKey) -> Option<VipMeta> {
    // SAFETY: a live value of a non-preallocated hash map, copied out.
    LB_VIPS.get_ptr(key).map(|meta| unsafe { *meta })
}

/// `{addr, port, proto}`, then `{addr, 0, proto}` if all-ports VIPs exist.
#[inline(always)]
pub(crate) fn find_vip(
    cfg: &DatapathConfig,
    addr: &[u32; 4],
    port: u16,
    proto: u8,
    family: u8,
) -> Option<VipMeta> {
    let mut key = VipKey {
        addr: *addr,
        port,
        proto,
        family,
    };
    if let Some(meta) = lookup(&key) {
        return Some(meta);
    }
    if cfg.flags & CFG_F_ALL_PORTS_VIPS == 0 {
        return None;
    }
    key.port = 0;
    lookup(&key)
}

/// The backend `handle` names, if it still occupies its index.
#[inline(always)]
pub(crate) fn backend_of(handle: u32) -> Option<&'static BackendDef> {
    let def = LB_BACKENDS.get(handle & BACKEND_INDEX_MASK)?;
    (def.handle == handle).then_some(def)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

//! QUIC by connection ID (`VIP_F_QUIC`): the server a short-header
//! packet's connection ID names, read with `lb_common::quic` (the format,
//! the limits) and looked up in `LB_QUIC_SERVERS`. Reads
//! [`QUIC_READ_LEN`] bytes of the UDP payload, inside the IP packet, and
//! nothing else. A connection-table hit of a QUIC VIP's flow reads the ID
//! too ([`reroute`]): a tuple can outlive its connection.

use lb_common::{
    BackendDef, DatapathConfig, VipMeta,
    consts::{BACKEND_F_QUIC, BACKEND_F_USABLE, PROTO_UDP, UDP_HDR_LEN},
    quic::{QUIC_READ_LEN, QuicRoute, route},
};
use lb_ebpf::{access::At, parse::Packet};

use crate::{backend_of, find_vip, maps::LB_QUIC_SERVERS};
use aya_ebpf::programs::XdpContext;

/// Where a datagram to the QUIC VIP `meta` goes.
pub enum Quic {
    /// To the server its connection ID names; the ID as a trace shows it
    /// ([`trace_id`]).
    Server(&'static BackendDef, u64),
    /// By the 4-tuple, as any UDP flow: a long header.
    LongHeader,
    /// By the 4-tuple: a short header naming no usable server of the VIP.
    Unroutable,
}

/// The route of `pkt` for `meta` (a VIP with `VIP_F_QUIC`). A server that
/// is down or gone is no route (the client's next attempt, hashed, reaches
/// one that answers); a draining one is, as a connection-table entry of
/// it is.
#[inline(always)]
pub fn route_of(ctx: &XdpContext, pkt: &Packet, meta: &VipMeta) -> Quic {
    let Some(params) = meta.quic() else {
        return Quic::Unroutable;
    };
    if pkt.proto != PROTO_UDP {
        return Quic::Unroutable;
    }
    let off = pkt.l4_off() + UDP_HDR_LEN;
    let bytes = if off + QUIC_READ_LEN <= pkt.ip_end() {
        At::<[u8; QUIC_READ_LEN]>::new(ctx, off).map(|at| at.read())
    } else {
        None
    };
    let key = match route(meta.id(), params, bytes.as_ref()) {
        QuicRoute::Server(key) => key,
        QuicRoute::LongHeader => return Quic::LongHeader,
        QuicRoute::Unroutable => return Quic::Unroutable,
    };
    // SAFETY: a live value of a preallocated hash map, copied out.
    let Some(handle) = LB_QUIC_SERVERS.get_ptr(key).map(|h| unsafe { *h }) else {
        return Quic::Unroutable;
    };
    match backend_of(handle) {
        Some(def) if def.flags & BACKEND_F_USABLE != 0 && def.vip_id == meta.vip_id => {
            Quic::Server(def, trace_id(key.sid[0], params.server_id_len))
        }
        _ => Quic::Unroutable,
    }
}

/// For a connection-table hit on `tracked`, a backend of a QUIC VIP: the
/// server `pkt`'s connection ID names, if it names a usable one of the
/// VIP (and its ID as a trace shows it). The ID decides over the entry: a
/// client's port, reused by a new connection (the client's stack, a
/// NAT), finds the old connection's entry, and only the ID knows which
/// server issued it. Costs a hit of any other VIP one flag test.
#[inline(always)]
pub fn reroute(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    pkt: &Packet,
    tracked: &BackendDef,
) -> Option<(&'static BackendDef, u64)> {
    if tracked.flags & BACKEND_F_QUIC == 0 || pkt.proto != PROTO_UDP {
        return None;
    }
    let meta = find_vip(cfg, &pkt.dst, pkt.dport(), pkt.proto, pkt.family)?;
    match route_of(ctx, pkt, &meta) {
        Quic::Server(def, id) => Some((def, id)),
        Quic::LongHeader | Quic::Unroutable => None,
    }
}

/// A server ID as a trace event's hash field carries it: its length in
/// the top octet, its first seven octets below (`lb::trace` prints them).
#[inline(always)]
fn trace_id(first: u64, len: u8) -> u64 {
    ((len as u64) << 56) | (first & 0x00ff_ffff_ffff_ffff)
}

//! Second chance on the backend: a TCP packet that arrives with lb's
//! alternates list is delivered here if this host holds its connection,
//! else handed on to the next alternate, else (no alternate left)
//! delivered here anyway.
//!
//! "Holds its connection" is what the kernel's own lookup says for the
//! inner 4-tuple (`bpf_skc_lookup_tcp`, this host's network namespace):
//! an established, request (`SYN_RECV`) or time-wait socket, or, when the
//! lookup finds only the listener, an ACK whose SYN cookie the listener
//! accepts (`bpf_tcp_check_syncookie`: the handshake of a connection the
//! listener answered with a cookie completes here). A SYN, a packet that
//! is not TCP, and one whose TCP header does not follow the inner IP
//! header (IPv6 extension headers, an inner fragment) are delivered
//! without a lookup: the balancer never lists alternates for them.
//!
//! Handing on rewrites three things in place and sends the frame back out
//! (`XDP_TX`): the outer source becomes this host (the outer destination
//! it arrived with), the outer destination the next alternate, and the
//! next index is incremented; the Ethernet addresses are swapped, so the
//! frame goes back to the router that delivered it (every frame of lb's
//! tunnels arrives from the balancer's gateway router, which routes to
//! every backend; XDP could not resolve a neighbour itself). The hop
//! limit is the list: a backend hands on only to the alternate at `next`
//! and only while `next < count ≤ 3`, and never to itself, so a packet
//! crosses at most three more backends.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, BPF_TCP_LISTEN, bpf_sock, bpf_sock_tuple},
    helpers::generated::{bpf_sk_release, bpf_skc_lookup_tcp, bpf_tcp_check_syncookie},
    programs::XdpContext,
};
use lb_common::{
    V4_MAPPED_WORD,
    consts::{ETH_P_IPV6, IPV4_HDR_LEN, IPV6_HDR_LEN, PROTO_TCP, SC_HDR_LEN},
    counters::DecapCounter::{self, DecapScLastResort, DecapScLocal, DecapScNoLookup},
};
use lb_ebpf::{
    access::At,
    csum,
    hdr::{
        AltAddr4, AltAddr6, EthHdr, IP_MF, IP_OFFSET, Ipv4Hdr, Ipv6Hdr, ScHdr, TCP_ACK, TCP_FIN,
        TCP_RST, TCP_SYN, TcpHdr, be16,
    },
};

use crate::tunnel::{AltList, Tunnel, allowed};

/// What to do with a packet that carries alternates.
pub enum Verdict {
    /// Strip and deliver here, counted as this.
    Deliver(DecapCounter),
    /// Hand on to the alternate at `next`, this address (word 0 only for
    /// IPv4).
    HandOn([u32; 4]),
}

/// Why it could not be handed on (the frame was not rewritten).
pub struct HandOnError;

/// Where the inner TCP header is, for a packet that gets a lookup.
struct InnerTcp {
    ip_off: usize,
    tcp_off: usize,
    v6: bool,
    flags: u8,
}

/// Decides for a packet with alternates `list` (see the module docs).
#[inline(always)]
pub fn decide(ctx: &XdpContext, t: &Tunnel, list: &AltList) -> Verdict {
    let Some(tcp) = inner_tcp(ctx, t) else {
        return Verdict::Deliver(DecapScNoLookup);
    };
    if tcp.flags & TCP_SYN != 0 {
        return Verdict::Deliver(DecapScNoLookup);
    }
    if is_local(ctx, &tcp) {
        return Verdict::Deliver(DecapScLocal);
    }
    if list.next < list.count
        && let Some(next) = next_alternate(ctx, list)
        && Some(next) != outer_daddr(ctx, t, list)
        && may_hand_on_to(next, list.outer_v6, t.check_source)
    {
        return Verdict::HandOn(next);
    }
    Verdict::Deliver(DecapScLastResort)
}

/// The inner TCP header right after the inner IP header, inside the inner
/// packet (whose length `tunnel::parse` checked), if there is one.
#[inline(always)]
fn inner_tcp(ctx: &XdpContext, t: &Tunnel) -> Option<InnerTcp> {
    let ip_off = t.l2_len + t.overhead;
    let v6 = t.inner_ethertype == be16(ETH_P_IPV6);
    let (tcp_off, end) = if v6 {
        let ip = At::<Ipv6Hdr>::new(ctx, ip_off)?.read();
        if ip.nexthdr != PROTO_TCP {
            return None;
        }
        (
            ip_off + IPV6_HDR_LEN,
            ip_off + IPV6_HDR_LEN + u16::from_be(ip.payload_len) as usize,
        )
    } else {
        let ip = At::<Ipv4Hdr>::new(ctx, ip_off)?.read();
        if ip.protocol != PROTO_TCP || ip.frag_off & be16(IP_MF | IP_OFFSET) != 0 {
            return None;
        }
        // IHL and total length were checked by `tunnel::parse`.
        let ihl = ((ip.version_ihl & 0x0f) as usize) * 4;
        (ip_off + ihl, ip_off + u16::from_be(ip.tot_len) as usize)
    };
    if tcp_off + core::mem::size_of::<TcpHdr>() > end {
        return None;
    }
    let th = At::<TcpHdr>::new(ctx, tcp_off)?.read();
    Some(InnerTcp {
        ip_off,
        tcp_off,
        v6,
        flags: th.flags,
    })
}

/// Does this host hold the connection of the inner packet?
#[inline(always)]
fn is_local(ctx: &XdpContext, tcp: &InnerTcp) -> bool {
    let Some(th) = At::<TcpHdr>::new(ctx, tcp.tcp_off) else {
        return false;
    };
    let ports = th.read();
    // SAFETY: a plain C struct (a union of two address layouts), zeroed.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let (size, iph, iph_len) = if tcp.v6 {
        let Some(ip) = At::<Ipv6Hdr>::new(ctx, tcp.ip_off) else {
            return false;
        };
        let h = ip.read();
        // SAFETY: writing the IPv6 member of the zeroed union.
        unsafe {
            let t = &mut tuple.__bindgen_anon_1.ipv6;
            t.saddr = h.saddr;
            t.daddr = h.daddr;
            t.sport = ports.source;
            t.dport = ports.dest;
        }
        (36, ip.as_ptr() as *mut _, IPV6_HDR_LEN as u32)
    } else {
        let Some(ip) = At::<Ipv4Hdr>::new(ctx, tcp.ip_off) else {
            return false;
        };
        let h = ip.read();
        // SAFETY: writing the IPv4 member of the zeroed union.
        unsafe {
            let t = &mut tuple.__bindgen_anon_1.ipv4;
            t.saddr = h.saddr;
            t.daddr = h.daddr;
            t.sport = ports.source;
            t.dport = ports.dest;
        }
        (12, ip.as_ptr() as *mut _, IPV4_HDR_LEN as u32)
    };
    // SAFETY: the program's context, a tuple on the stack of `size` bytes;
    // the socket returned (if any) is released below on every path.
    let sk = unsafe {
        bpf_skc_lookup_tcp(
            ctx.ctx as *mut _,
            &mut tuple,
            size,
            BPF_F_CURRENT_NETNS as u64,
            0,
        )
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a socket the helper returned; `state` is readable on any.
    let listener = unsafe { (*sk).state } == BPF_TCP_LISTEN;
    let local = !listener || cookie_ack(sk, iph, iph_len, th.as_ptr(), tcp.flags);
    // SAFETY: releases the reference the lookup took.
    unsafe { bpf_sk_release(sk as *mut _) };
    local
}

/// A bare ACK to a listener whose SYN cookie the listener accepts.
#[inline(always)]
fn cookie_ack(
    sk: *mut bpf_sock,
    iph: *mut core::ffi::c_void,
    iph_len: u32,
    th: *mut TcpHdr,
    flags: u8,
) -> bool {
    if flags & (TCP_ACK | TCP_SYN | TCP_RST | TCP_FIN) != TCP_ACK {
        return false;
    }
    // SAFETY: a listener the lookup returned (not yet released); `iph` and
    // `th` point at `iph_len` and 20 checked bytes of the packet.
    unsafe {
        bpf_tcp_check_syncookie(
            sk as *mut _,
            iph,
            iph_len,
            th as *mut _,
            core::mem::size_of::<TcpHdr>() as u32,
        ) == 0
    }
}

/// The outer destination address (word 0 only for IPv4).
#[inline(always)]
fn outer_daddr(ctx: &XdpContext, t: &Tunnel, list: &AltList) -> Option<[u32; 4]> {
    if list.outer_v6 {
        Some(At::<Ipv6Hdr>::new(ctx, t.l2_len)?.read().daddr)
    } else {
        Some([At::<Ipv4Hdr>::new(ctx, t.l2_len)?.read().daddr, 0, 0, 0])
    }
}

/// Whether a packet may be handed on to `next` (word 0 only for IPv4):
/// a unicast address (not unspecified, loopback, multicast or, for IPv4,
/// broadcast or 0/8), and one tunnels may come from where this backend
/// takes them only from `LB_DECAP_FROM` (the other backends are listed
/// there for second chance). A list is the sender's word: without this a
/// packet from an allowed source could make this backend relay it from
/// its own address to any address at all. Otherwise it is delivered here
/// as the last resort.
#[inline(always)]
fn may_hand_on_to(next: [u32; 4], v6: bool, check_source: bool) -> bool {
    let unicast = if v6 {
        // Network order in memory: the first byte is the low one.
        let loopback = next[0] == 0 && next[1] == 0 && next[2] == 0 && next[3] == 1u32.to_be();
        let unspecified = next[0] | next[1] | next[2] | next[3] == 0;
        next[0] as u8 != 0xff && !loopback && !unspecified
    } else {
        let first = next[0] as u8;
        first != 0 && first != 127 && first < 224
    };
    let key = if v6 {
        next
    } else {
        [0, 0, V4_MAPPED_WORD, next[0]]
    };
    unicast && (!check_source || allowed(key, v6))
}

/// The alternate at `next` (word 0 only for IPv4).
#[inline(always)]
fn next_alternate(ctx: &XdpContext, list: &AltList) -> Option<[u32; 4]> {
    let first = list.hdr_off + SC_HDR_LEN;
    // `next < count ≤ 3`, checked by the caller or by `tunnel::parse`.
    let next = (list.next & 3) as usize;
    if list.outer_v6 {
        Some(At::<AltAddr6>::new(ctx, first + 16 * next)?.read().addr)
    } else {
        Some([
            At::<AltAddr4>::new(ctx, first + 4 * next)?.read().addr,
            0,
            0,
            0,
        ])
    }
}

/// Rewrites the frame for the alternate at `next`, whose address is
/// `next` (module docs); on success it is ready for `XDP_TX`.
#[inline(always)]
pub fn hand_on(
    ctx: &XdpContext,
    t: &Tunnel,
    list: &AltList,
    next: [u32; 4],
) -> Result<(), HandOnError> {
    if list.outer_v6 {
        let ip = At::<Ipv6Hdr>::new(ctx, t.l2_len).ok_or(HandOnError)?;
        let own = ip.read().daddr;
        ip.set_saddr(&own);
        ip.set_daddr(&next);
    } else {
        let ip = At::<Ipv4Hdr>::new(ctx, t.l2_len).ok_or(HandOnError)?;
        let h = ip.read();
        // The sum changes from {saddr, own} to {own, next}: by next - saddr.
        let check = csum::replace16(h.check, h.saddr as u16, next[0] as u16);
        let check = csum::replace16(check, (h.saddr >> 16) as u16, (next[0] >> 16) as u16);
        ip.set_saddr(h.daddr);
        ip.set_daddr(next[0]);
        ip.set_check(check);
    }
    At::<ScHdr>::new(ctx, list.hdr_off)
        .ok_or(HandOnError)?
        .set_next(list.next + 1);
    let eth = At::<EthHdr>::new(ctx, 0).ok_or(HandOnError)?;
    let e = eth.read();
    eth.set_dest(e.h_source);
    eth.set_source(e.h_dest);
    Ok(())
}

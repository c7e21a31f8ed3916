//! BFD control packets answered by the datapath (RFC 5880 asynchronous
//! mode, RFC 5881 single hop): a packet to UDP 3784 from a peer `lbd`
//! configured in `LB_BFD_PEERS` is checked (RFC 5880 §6.8.6, RFC 5881 §5),
//! runs the session's state machine (`lb_common::bfd::receive`, with the
//! Detection Time applied lazily), and is turned into our reply in place:
//! addresses and ports swapped to the session's, TTL 255, our state,
//! discriminators and intervals, the C bit set (this answer shares fate
//! with forwarding, not with `lbd`), `XDP_TX`. One reply per packet,
//! never faster than RFC 5880 §6.8.7 allows (`min_reply_gap_ns`).
//!
//! Only packets that are no VIP's get here (`main.rs` asks on its
//! not-a-VIP paths), so VIP traffic pays nothing. The session's state
//! lives in `LB_BFD_STATE`, which only this program writes (`lbd` zeroes
//! a slot before a new session takes it). Two CPUs receiving the same
//! session's packets at the same instant may interleave their updates;
//! a peer sends one packet per interval, so they do not.

use aya_ebpf::{
    helpers::generated::{bpf_ktime_get_ns, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::{
    BfdConfig, BfdKey, BfdState, Counter,
    bfd::{
        BFD_CONTROL_LEN, BFD_PORT, BFD_ST_POLL, BFD_ST_REMOTE_C, BFD_TTL, BFD_VERSION, FLAG_A,
        FLAG_C, FLAG_F, FLAG_M, FLAG_P, STATE_ADMIN_DOWN, STATE_DOWN, STATE_UP, advertised_tx_us,
        detect_ns, expire, min_reply_gap_ns, receive,
    },
    consts::{FAMILY_V4, IPV4_HDR_LEN, IPV6_HDR_LEN, PROTO_UDP, UDP_HDR_LEN},
};
use lb_ebpf::{
    access::At,
    csum,
    hdr::{BfdHdr, EthHdr, IP_DF, Ipv4Hdr, Ipv6Hdr, UdpHdr, be16, be32},
    parse::Packet,
};

use crate::{
    icmp::sum_bytes,
    maps::{LB_BFD_PEERS, LB_BFD_STATE},
};

const DROP: u32 = aya_ebpf::bindings::xdp_action::XDP_DROP;
const TX: u32 = aya_ebpf::bindings::xdp_action::XDP_TX;
/// UDP header and control packet of a reply.
const REPLY_UDP_LEN: usize = UDP_HDR_LEN + BFD_CONTROL_LEN;
/// IP precedence 6 (internetwork control), as routers send BFD.
const TOS_NETWORK_CONTROL: u8 = 0xc0;

/// UDP to the BFD control port.
#[inline(always)]
pub fn is_control(pkt: &Packet) -> bool {
    pkt.proto == PROTO_UDP && pkt.dport() == be16(BFD_PORT)
}

/// A control packet that passed the checks: its mandatory section, its
/// State and its flags.
#[derive(Clone, Copy)]
struct Received {
    hdr: BfdHdr,
    state: u8,
    flags: u8,
}

/// Answers `pkt`, a control packet that is no VIP's, if a session is
/// configured for its source (`None`: no session; the caller passes it
/// on as before).
#[inline(always)]
pub fn answer(ctx: &XdpContext, pkt: &Packet) -> Option<(u32, Counter)> {
    let key = BfdKey {
        addr: pkt.src,
        family: pkt.family,
        _pad: [0; 3],
    };
    // SAFETY: a live value of a hash map, copied out.
    let cfg = unsafe { *LB_BFD_PEERS.get_ptr(key)? };
    let Some(rx) = check(ctx, pkt, &cfg) else {
        if let Some(st) = LB_BFD_STATE.get_ptr_mut(cfg.slot) {
            // SAFETY: a live array value; counters only.
            unsafe { (*st).invalid += 1 };
        }
        return Some((DROP, Counter::DropBfdInvalid));
    };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(st) = LB_BFD_STATE.get_ptr_mut(cfg.slot) else {
        return Some((DROP, Counter::DropBfdInvalid));
    };
    // SAFETY: a live array value, checked right above; this program is
    // its only writer.
    let st = unsafe { &mut *st };
    let Some(reply) = update(&cfg, st, &rx, now) else {
        st.too_soon += 1;
        return Some((DROP, Counter::DropBfdTooSoon));
    };
    if write_reply(ctx, pkt, &cfg, &reply).is_err() {
        return Some((DROP, Counter::DropBfdInvalid));
    }
    // The reply went out: look the state up again where it is written.
    if let Some(st) = LB_BFD_STATE.get_ptr_mut(cfg.slot) {
        // SAFETY: as above.
        unsafe {
            (*st).tx += 1;
            (*st).last_tx_ns = now;
        }
    }
    Some((TX, Counter::ReplyBfd))
}

/// The checks of RFC 5880 §6.8.6 and RFC 5881 §5 that do not need the
/// session's state: addressed to the session's address with TTL 255, no
/// IP options or extension headers, lengths that fit, version 1, no
/// authentication (lb configures none), Detect Mult and My
/// Discriminator nonzero, no Multipoint, Your Discriminator ours or 0
/// (then only in Down or AdminDown).
#[inline(always)]
fn check(ctx: &XdpContext, pkt: &Packet, cfg: &BfdConfig) -> Option<Received> {
    let l3 = pkt.l2_len as usize & 0x1f;
    let l4 = pkt.l4_off();
    if pkt.family == FAMILY_V4 {
        let ip = At::<Ipv4Hdr>::new(ctx, l3)?.read();
        if ip.ttl != BFD_TTL || l4 != l3 + IPV4_HDR_LEN || pkt.dst[0] != cfg.local_addr[0] {
            return None;
        }
    } else {
        let ip = At::<Ipv6Hdr>::new(ctx, l3)?.read();
        if ip.hop_limit != BFD_TTL
            || l4 != l3 + IPV6_HDR_LEN
            || pkt.dst[0] != cfg.local_addr[0]
            || pkt.dst[1] != cfg.local_addr[1]
            || pkt.dst[2] != cfg.local_addr[2]
            || pkt.dst[3] != cfg.local_addr[3]
        {
            return None;
        }
    }
    let udp = At::<UdpHdr>::new(ctx, l4)?.read();
    let udp_len = u16::from_be(udp.len) as usize;
    if udp_len < REPLY_UDP_LEN || l4 + udp_len > pkt.ip_end() {
        return None;
    }
    let hdr = At::<BfdHdr>::new(ctx, l4 + UDP_HDR_LEN)?.read();
    let length = hdr.length as usize;
    let state = hdr.sta_flags >> 6;
    let flags = hdr.sta_flags & 0x3f;
    if hdr.vers_diag >> 5 != BFD_VERSION
        || length < BFD_CONTROL_LEN
        || length > udp_len - UDP_HDR_LEN
        || hdr.detect_mult == 0
        || flags & (FLAG_M | FLAG_A) != 0
        || hdr.my_disc == 0
    {
        return None;
    }
    if hdr.your_disc == 0 {
        if state != STATE_DOWN && state != STATE_ADMIN_DOWN {
            return None;
        }
    } else if hdr.your_disc != be32(cfg.my_disc) {
        return None;
    }
    Some(Received { hdr, state, flags })
}

/// What our reply carries.
#[derive(Clone, Copy)]
struct Reply {
    state: u8,
    diag: u8,
    flags: u8,
    adv_tx: u32,
    /// The peer's My Discriminator (network order), our Your.
    your_disc: u32,
}

/// Takes a valid packet into the session's state (§6.8.6) and says what
/// to reply; `None`: too soon after the last reply (§6.8.7).
#[inline(always)]
fn update(cfg: &BfdConfig, st: &mut BfdState, rx: &Received, now: u64) -> Option<Reply> {
    let remote_tx = u32::from_be(rx.hdr.desired_min_tx);
    let remote_rx = u32::from_be(rx.hdr.required_min_rx);
    st.remote_disc = u32::from_be(rx.hdr.my_disc);
    st.remote_state = rx.state;
    st.remote_diag = rx.hdr.vers_diag & 0x1f;
    st.remote_mult = rx.hdr.detect_mult;
    st.remote_min_rx_us = remote_rx;
    st.remote_min_tx_us = remote_tx;
    st.flags = (st.flags & !BFD_ST_REMOTE_C)
        | if rx.flags & FLAG_C != 0 {
            BFD_ST_REMOTE_C
        } else {
            0
        };
    if rx.flags & FLAG_F != 0 {
        // The Poll Sequence is over; the peer has our current timers.
        st.flags &= !BFD_ST_POLL;
        st.config_gen = cfg.config_gen;
    }
    // The Detection Time, applied lazily: had it expired, the session
    // went Down then (diagnostic 1).
    let (mut state, mut diag) = (st.state, st.diag);
    if st.last_rx_ns != 0 && now.wrapping_sub(st.last_rx_ns) > st.detect_ns {
        (state, diag) = expire(state, diag);
    }
    if let Some((s, d)) = receive(state, diag, rx.state) {
        (state, diag) = (s, d);
    }
    if state != st.state {
        st.changed_ns = now;
        if state == STATE_UP {
            st.ups += 1;
        }
    }
    st.state = state;
    st.diag = diag;
    st.detect_ns = detect_ns(rx.hdr.detect_mult, remote_tx, cfg.required_min_rx_us);
    st.last_rx_ns = now;
    st.rx += 1;
    let adv_tx = advertised_tx_us(
        state,
        cfg.desired_min_tx_us,
        cfg.required_min_rx_us,
        remote_tx,
    );
    // §6.8.3: changed timers start a Poll Sequence.
    if (st.adv_tx_us != 0 && adv_tx != st.adv_tx_us) || st.config_gen != cfg.config_gen {
        st.flags |= BFD_ST_POLL;
    }
    st.adv_tx_us = adv_tx;
    let poll = rx.flags & FLAG_P != 0;
    let gap = min_reply_gap_ns(adv_tx, remote_rx, poll)?;
    if st.last_tx_ns != 0 && now.wrapping_sub(st.last_tx_ns) < gap {
        return None;
    }
    // A Poll is answered with Final; P and F never go together (§6.5).
    let flags = FLAG_C
        | if poll {
            FLAG_F
        } else if st.flags & BFD_ST_POLL != 0 {
            FLAG_P
        } else {
            0
        };
    Some(Reply {
        state,
        diag,
        flags,
        adv_tx,
        your_disc: rx.hdr.my_disc,
    })
}

/// Turns the packet into our reply, in place: the frame cut to the
/// reply's length, the addresses and ports swapped to the session's,
/// TTL 255, the UDP checksum computed.
#[inline(always)]
fn write_reply(ctx: &XdpContext, pkt: &Packet, cfg: &BfdConfig, r: &Reply) -> Result<(), ()> {
    let l3 = pkt.l2_len as usize & 0x1f;
    let ip_hdr = if pkt.family == FAMILY_V4 {
        IPV4_HDR_LEN
    } else {
        IPV6_HDR_LEN
    };
    let keep = l3 + ip_hdr + REPLY_UDP_LEN;
    let len = ctx.data_end() - ctx.data();
    if keep > len {
        return Err(());
    }
    if keep < len {
        // SAFETY: the program's context; no packet pointer is held
        // across the call.
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, -((len - keep) as i32)) } != 0 {
            return Err(());
        }
    }
    let eth = At::<EthHdr>::new(ctx, 0).ok_or(())?;
    let e = eth.read();
    eth.set_dest(e.h_source);
    eth.set_source(e.h_dest);
    let udp_len = be16(REPLY_UDP_LEN as u16);
    // The pseudo-header's protocol word (0, 17) and UDP length.
    let mut pseudo = u32::from(be16(PROTO_UDP as u16)) + u32::from(udp_len);
    if pkt.family == FAMILY_V4 {
        let ip = At::<Ipv4Hdr>::new(ctx, l3).ok_or(())?;
        ip.set_version_ihl(0x45);
        ip.set_tos(TOS_NETWORK_CONTROL);
        ip.set_tot_len(be16((IPV4_HDR_LEN + REPLY_UDP_LEN) as u16));
        ip.set_id(0);
        ip.set_frag_off(be16(IP_DF));
        ip.set_ttl(BFD_TTL);
        ip.set_protocol(PROTO_UDP);
        ip.set_check(0);
        ip.set_saddr(pkt.dst[0]);
        ip.set_daddr(pkt.src[0]);
        // SAFETY: `ip` is a whole IPv4 header without options in the packet.
        ip.set_check(unsafe { csum::ipv4_header(ip.as_ptr() as *const u16) });
        pseudo += csum::halves(pkt.dst[0]) + csum::halves(pkt.src[0]);
    } else {
        let ip = At::<Ipv6Hdr>::new(ctx, l3).ok_or(())?;
        ip.set_vtc_flow(be32(0x6000_0000 | (TOS_NETWORK_CONTROL as u32) << 20));
        ip.set_payload_len(udp_len);
        ip.set_nexthdr(PROTO_UDP);
        ip.set_hop_limit(BFD_TTL);
        ip.set_saddr(&pkt.dst);
        ip.set_daddr(&pkt.src);
        let mut i = 0;
        while i < 4 {
            pseudo += csum::halves(pkt.dst[i]) + csum::halves(pkt.src[i]);
            i += 1;
        }
    }
    let l4 = l3 + ip_hdr;
    let udp = At::<UdpHdr>::new(ctx, l4).ok_or(())?;
    udp.set_source(cfg.src_port);
    udp.set_dest(be16(BFD_PORT));
    udp.set_len(udp_len);
    udp.set_check(0);
    At::<BfdHdr>::new(ctx, l4 + UDP_HDR_LEN)
        .ok_or(())?
        .write(BfdHdr {
            vers_diag: BFD_VERSION << 5 | (r.diag & 0x1f),
            sta_flags: r.state << 6 | r.flags,
            detect_mult: cfg.detect_mult,
            length: BFD_CONTROL_LEN as u8,
            my_disc: be32(cfg.my_disc),
            your_disc: r.your_disc,
            desired_min_tx: be32(r.adv_tx),
            required_min_rx: be32(cfg.required_min_rx_us),
            required_min_echo_rx: 0,
        });
    let sum = sum_bytes::<REPLY_UDP_LEN>(ctx, l4, pseudo).map_err(|_| ())?;
    let check = csum::fold(sum);
    // 0 means "no checksum" in UDP: its other zero is sent instead.
    udp_at(ctx, l4)?.set_check(if check == 0 { 0xffff } else { check });
    Ok(())
}

#[inline(always)]
fn udp_at(ctx: &XdpContext, off: usize) -> Result<At<UdpHdr>, ()> {
    At::<UdpHdr>::new(ctx, off).ok_or(())
}

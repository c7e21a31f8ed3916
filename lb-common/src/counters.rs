//! Counter ids: every packet the XDP program sees ends in exactly one
//! *outcome* counter; a few *event* counters count things that happen on the
//! way (an eviction, a stale connection-table hit) and are not outcomes.
//!
//! Ids index `LB_COUNTERS` and are part of the pinned-map ABI: a new counter
//! takes a new id at the end; a retired one keeps its id and name.
//!
//! [`DecapCounter`] is the backend decap program's own set (`LB_DECAP_COUNTERS`),
//! with the same rules.

/// What the datapath does with a packet that matches `outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Handed to the kernel's stack unchanged (not ours).
    Pass,
    /// Encapsulated and sent to a backend.
    Forward,
    /// Dropped.
    Drop,
    /// Malformed or unsupported: passed or dropped by the global policy.
    Malformed,
    /// Answered by the balancer itself (ICMP echo reply, "too big" errors).
    Reply,
    /// Not an outcome: an event counted on the way.
    Event,
    /// No longer counted; the id stays reserved. Not shown by `lbctl`.
    Retired,
}

/// Defines a counter-id enum `$name` whose variants carry a stable name and
/// a kind of type `$kind_ty`.
macro_rules! counters {
    ($(#[doc = $tdoc:literal])* enum $name:ident: $kind_ty:ident {
        $( $(#[doc = $doc:literal])* $variant:ident = $id:literal, $cname:literal, $kind:ident; )*
    }) => {
        $(#[doc = $tdoc])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $( $(#[doc = $doc])* $variant = $id, )*
        }

        impl $name {
            /// Every counter, in id order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// Stable snake_case name used by `lbctl` and metrics.
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $cname,)* }
            }

            pub const fn kind(self) -> $kind_ty {
                match self { $($name::$variant => $kind_ty::$kind,)* }
            }
        }
    };
}

counters! {
    /// A counter id (index into `LB_COUNTERS`).
    enum Counter: Kind {
    /// Not IPv4 or IPv6 (ARP, LLDP, ...).
    PassNotIp = 0, "pass_not_ip", Pass;
    /// IP, but the protocol is neither TCP, UDP nor ICMP.
    PassNotL4 = 1, "pass_not_tcp_udp", Pass;
    /// TCP or UDP to an address/port/protocol that is no VIP.
    PassNotVip = 2, "pass_not_vip", Pass;
    /// Forwarded to the backend found in the connection table.
    FwdConntrack = 3, "fwd_conntrack_hit", Forward;
    /// Forwarded by the Maglev table; the flow was (re)inserted in the
    /// connection table (unless `ct_insert_refused` counts it too).
    FwdMaglev = 4, "fwd_maglev_new_flow", Forward;
    /// Forwarded by the Maglev table for a VIP that does not use the connection table.
    FwdMaglevNoConntrack = 5, "fwd_maglev_no_conntrack", Forward;
    /// VIP without a usable backend.
    DropNoBackend = 6, "drop_no_backend", Drop;
    /// The frame could not be grown for the tunnel header.
    DropEncap = 7, "drop_encap_failed", Drop;
    /// Shorter than an Ethernet header.
    MalformedEth = 8, "malformed_eth_truncated", Malformed;
    /// A VLAN tag cut short, or a second (QinQ) tag.
    MalformedVlan = 9, "malformed_vlan", Malformed;
    /// Shorter than an IPv4 header.
    MalformedIpv4Truncated = 10, "malformed_ipv4_truncated", Malformed;
    /// IPv4 version field is not 4, or IHL below 5.
    MalformedIpv4Header = 11, "malformed_ipv4_bad_header", Malformed;
    /// IPv4 total length shorter than the header or longer than the frame.
    MalformedIpv4Len = 12, "malformed_ipv4_bad_length", Malformed;
    /// Retired (never counted): fragments now follow their VIP's fragment
    /// policy (`drop_fragment`, `fwd_fragment_3tuple`, `pass_fragment_not_vip`).
    MalformedIpv4Frag = 13, "malformed_ipv4_fragment", Retired;
    /// Shorter than an IPv6 header.
    MalformedIpv6Truncated = 14, "malformed_ipv6_truncated", Malformed;
    /// IPv6 version field is not 6.
    MalformedIpv6Header = 15, "malformed_ipv6_bad_header", Malformed;
    /// IPv6 payload length longer than the frame.
    MalformedIpv6Len = 16, "malformed_ipv6_bad_length", Malformed;
    /// Retired (never counted): see `malformed_ipv4_fragment`.
    MalformedIpv6Frag = 17, "malformed_ipv6_fragment", Retired;
    /// IPv6 extension header the datapath does not walk.
    MalformedIpv6Ext = 18, "malformed_ipv6_ext_header", Malformed;
    /// TCP or UDP header cut short (by the frame or by the IP length), or a TCP data offset below 5.
    MalformedL4 = 19, "malformed_l4_truncated", Malformed;
    /// Event: a new flow evicted a live connection-table entry (of any
    /// kind; see `ct_evicted_established`).
    CtEvicted = 20, "ct_evicted", Event;
    /// Event: a connection-table hit pointed at a backend that is down or
    /// gone; re-picked. The entry is kept (the flow returns to its backend
    /// if it comes back) unless the re-pick records the flow anew, so a
    /// flow of a second-chance VIP, whose packets are not recorded, counts
    /// one per packet while its backend is down.
    CtStale = 21, "ct_stale_backend", Event;
    /// An IPv4 or IPv6 fragment to an address that is no VIP.
    PassFragmentNotVip = 22, "pass_fragment_not_vip", Pass;
    /// A fragment for a VIP whose fragment policy is `drop` (the default).
    DropFragment = 23, "drop_fragment", Drop;
    /// A fragment for a VIP whose fragment policy is `hash`: sent to the
    /// backend of its 3-tuple, like every packet of that VIP.
    FwdFragment = 24, "fwd_fragment_3tuple", Forward;
    /// ICMP or ICMPv6 echo request to a VIP address, answered by the balancer.
    ReplyIcmpEcho = 25, "reply_icmp_echo", Reply;
    /// ICMP error about a VIP flow (unreachable, time exceeded, too big),
    /// sent to the backend that owns the flow.
    FwdIcmpError = 26, "fwd_icmp_error", Forward;
    /// ICMPv6 packet-too-big below the IPv6 minimum MTU (1280): dropped.
    DropIcmpPtbTooSmall = 27, "drop_icmp_ptb_below_1280", Drop;
    /// IPv4 packet with DF too big for the path once encapsulated: answered
    /// with ICMP "fragmentation needed" carrying the usable MTU.
    ReplyFragNeeded = 28, "reply_frag_needed", Reply;
    /// IPv6 packet too big for the path once encapsulated: answered with
    /// ICMPv6 "packet too big" carrying the usable MTU.
    ReplyPacketTooBig = 29, "reply_packet_too_big", Reply;
    /// IPv4 packet without DF too big once encapsulated: dropped (policy).
    DropTooBigNoDf = 30, "drop_too_big_no_df", Drop;
    /// IPv4 packet without DF too big once encapsulated: passed (policy).
    PassTooBigNoDf = 31, "pass_too_big_no_df", Pass;
    /// More IPv6 extension headers than the datapath walks (4; a fragment
    /// header ends the walk).
    MalformedIpv6ExtChain = 32, "malformed_ipv6_ext_chain_too_long", Malformed;
    /// ICMP the balancer does not handle: to an address that is no VIP's,
    /// or to a VIP address but no echo request (or echo is off) and no
    /// error about a VIP flow it can route (or whose quote is cut short).
    PassIcmp = 33, "pass_icmp_other", Pass;
    /// IPv6 extension headers longer than the datapath reads (1,024 bytes
    /// in all before the TCP or UDP header).
    MalformedIpv6ExtTooLong = 34, "malformed_ipv6_ext_too_long", Malformed;
    /// Event: a new flow evicted an established connection-table entry
    /// (activity class 2 or more: three packets or more)
    /// because its bucket held no empty way nor one of a lower class (an
    /// active entry seen within a minute is never taken). Also counted in
    /// `ct_evicted`. A flow lost its pinning: a table change may now move
    /// it. Entries of one packet or of a bare handshake (class 0 and 1,
    /// what a spoofed SYN + ACK pair earns) count in `ct_evicted` only.
    CtEvictedConfirmed = 35, "ct_evicted_established", Event;
    /// Event: a connection-table hit on an entry idle since before a SYN
    /// of its flow: a new connection on a reused tuple. The entry now
    /// names that SYN's backend. Never for a protected entry (a SYN of
    /// its tuple went to its own backend) nor across VIPs.
    CtReopened = 36, "ct_reopened", Event;
    /// A TCP packet (not a SYN) without a connection-table entry whose
    /// flow's SYN this balancer sent a moment ago: sent to that SYN's
    /// backend, and the flow recorded as established.
    FwdHandshake = 37, "fwd_handshake", Forward;
    /// A TCP packet that is not a SYN, of a VIP with second chance, without
    /// connection-table entry (a mid-flow packet this balancer never
    /// placed, or whose entry went): sent to its Maglev backend with the
    /// flow's alternates in lb's GUE list, and not recorded (which of them
    /// holds the connection is the backends' to find out).
    FwdSecondChance = 38, "fwd_second_chance", Forward;
    /// A BFD control packet (UDP 3784) of a session `lbd` configured,
    /// answered by the datapath itself (`XDP_TX`) with the session's
    /// state (RFC 5880 asynchronous mode, one reply per packet).
    ReplyBfd = 39, "reply_bfd", Reply;
    /// A BFD control packet from a configured peer that fails a check of
    /// RFC 5880 §6.8.6 or RFC 5881 §5 (version, lengths, Detect Mult 0,
    /// Multipoint, discriminators, authentication, TTL other than 255,
    /// IP options or extension headers, not to the session's address):
    /// dropped, counted in the session too.
    DropBfdInvalid = 40, "drop_bfd_invalid", Drop;
    /// A valid BFD control packet that came too soon after our last reply
    /// (the transmit limit of RFC 5880 §6.8.7: a flood, or a peer faster
    /// than it advertised): its state is taken, no reply is sent.
    DropBfdTooSoon = 41, "drop_bfd_too_soon", Drop;
    /// Event: a new flow found every way of its connection-table bucket
    /// held by an active flow seen within the last minute (see
    /// `DatapathConfig::protect_window`): it went to its Maglev backend and was not
    /// recorded (its next packet tries again). A flood cannot evict such
    /// flows; a table too small for the box's active flows shows here.
    CtInsertRefused = 42, "ct_insert_refused", Event;
    /// A short-header QUIC packet to a VIP with `quic:`, without
    /// connection-table entry, whose connection ID carries the server ID
    /// of a usable backend: sent to it (a client that moved keeps its
    /// server), and not recorded.
    FwdQuicCid = 43, "fwd_quic_cid", Forward;
    /// Event: a long-header packet (Initial, 0-RTT, Handshake) to a QUIC
    /// VIP without connection-table entry: hashed on the 4-tuple as any
    /// UDP flow (its `fwd_*` outcome counts it too).
    QuicLongHeader = 44, "quic_long_header", Event;
    /// Event: a short-header packet to a QUIC VIP, without
    /// connection-table entry, whose connection ID names no usable server
    /// of the VIP (another configuration id, an unknown server ID, a
    /// server down or removed, a datagram too short): hashed instead.
    QuicUnroutable = 45, "quic_cid_unroutable", Event;
    /// Event: an IPv6 flow's entry found at its position under the older
    /// connection-table hash (maps adopted from an older version,
    /// `CFG_F_CT_V6_LEGACY`) and moved to its own; the packet counts as
    /// `fwd_conntrack`.
    CtMovedV6 = 46, "ct_moved_v6", Event;
    }
}

/// Number of counter ids in use.
pub const COUNTER_COUNT: u32 = Counter::ALL.len() as u32;

/// Size of `LB_COUNTERS`: room for new counters without recreating the
/// pinned map.
pub const COUNTER_SLOTS: u32 = 64;

const _: () = assert!(COUNTER_COUNT <= COUNTER_SLOTS);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_names_unique() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{c:?}");
            for d in &Counter::ALL[i + 1..] {
                assert_ne!(c.name(), d.name());
            }
        }
    }
}

/// What the decap program does with a packet that matches a [`DecapCounter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecapKind {
    /// The tunnel headers were stripped; the inner packet goes to the stack.
    Decap,
    /// Handed to the kernel's stack unchanged.
    Pass,
    /// Dropped.
    Drop,
    /// Sent on to another backend (second chance), not to this host's stack.
    Forward,
}

counters! {
    /// A decap counter id (index into `LB_DECAP_COUNTERS`). Every packet
    /// `lb_decap` sees ends in exactly one of them.
    enum DecapCounter: DecapKind {
    /// IP in IP (4in4, 6in6, 4in6, 6in4) addressed to us: outer header stripped.
    DecapIpip = 0, "decap_ipip", Decap;
    /// GRE addressed to us: outer and GRE headers stripped.
    DecapGre = 1, "decap_gre", Decap;
    /// Not IPv4/IPv6 whose protocol (next header, without extension headers)
    /// is 4, 41 or 47, or UDP to the address's GUE port: other traffic, or
    /// an outer IP header cut short.
    PassNotTunnel = 2, "pass_not_tunnel", Pass;
    /// A tunnel protocol, but to an address that is not in `LB_DECAP_ADDRS`.
    PassNotLocal = 3, "pass_not_local", Pass;
    /// An IPv4 fragment of a tunnel packet to us (the balancer sets DF, so
    /// this means someone else's tunnel or a broken path); the stack
    /// reassembles or discards it, the program does not.
    PassOuterFragment = 4, "pass_outer_fragment", Pass;
    /// Well-formed GRE to us that lb never sends: checksum, key or sequence
    /// flags, a version other than 0, or a payload other than IPv4/IPv6.
    PassGreUnsupported = 5, "pass_gre_unsupported", Pass;
    /// Tunnel packet to us with a broken outer header: IPv4 IHL below 5,
    /// total length shorter than the header or longer than the frame, IPv6
    /// payload length past the frame, GRE header cut short.
    MalformedOuter = 6, "malformed_outer", Drop;
    /// Tunnel packet to us whose inner packet is cut short, is not the IP
    /// version the outer header announces, has a bad IPv4 header length, or
    /// claims more bytes than the outer packet carries.
    MalformedInner = 7, "malformed_inner", Drop;
    /// `bpf_xdp_adjust_head` refused to shrink the frame.
    DropAdjustFailed = 8, "drop_adjust_failed", Drop;
    /// GUE (direct IP over UDP, FOU-compatible) addressed to us on the GUE
    /// port: outer IP and UDP headers stripped.
    DecapGue = 9, "decap_gue", Decap;
    /// Second chance: a TCP packet with alternates whose connection is
    /// this host's (an established, request or time-wait socket, or an
    /// ACK carrying a valid SYN cookie): stripped and delivered.
    DecapScLocal = 10, "decap_sc_local", Decap;
    /// Second chance: a TCP packet with alternates that no local socket
    /// holds, with no alternate left to try (or the next one is this
    /// host): stripped and delivered; the stack answers (a reset, for a
    /// connection that is nowhere).
    DecapScLastResort = 11, "decap_sc_last_resort", Decap;
    /// Second chance: alternates on a packet that is a SYN, or not TCP, or
    /// whose TCP header does not follow the inner IP header (IPv6 extension
    /// headers): delivered here without a socket lookup (the balancer sends
    /// alternates only with TCP packets that are not SYNs).
    DecapScNoLookup = 12, "decap_sc_no_lookup", Decap;
    /// Second chance: a TCP packet no local socket holds, sent on to the
    /// next alternate (outer source: this host; destination: the alternate;
    /// the next index incremented) back through the router it came from.
    FwdScNextHop = 13, "fwd_sc_next_hop", Forward;
    /// GUE variant 0 to us that is not a well-formed lb alternates list
    /// (a control message, flags, another private data type, a length
    /// that disagrees with the count, no or too many alternates, a next
    /// index past the count, a UDP checksum, an inner protocol other than
    /// 4 or 41): dropped, never forwarded.
    MalformedSc = 14, "malformed_sc_header", Drop;
    /// A tunnel packet to an address that takes tunnels only from the
    /// prefixes in `LB_DECAP_FROM` (`lbctl decap attach --from`), from a
    /// source outside them: dropped, never stripped or handed on.
    DropSource = 15, "drop_source_not_allowed", Drop;
    }
}

/// Number of decap counter ids in use.
pub const DECAP_COUNTER_COUNT: u32 = DecapCounter::ALL.len() as u32;

/// Size of `LB_DECAP_COUNTERS`: room for new counters without recreating the
/// pinned map.
pub const DECAP_COUNTER_SLOTS: u32 = 32;

const _: () = assert!(DECAP_COUNTER_COUNT <= DECAP_COUNTER_SLOTS);

#[cfg(test)]
mod decap_tests {
    use super::*;

    #[test]
    fn decap_ids_are_dense_and_names_unique() {
        for (i, c) in DecapCounter::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{c:?}");
            for d in &DecapCounter::ALL[i + 1..] {
                assert_ne!(c.name(), d.name());
            }
        }
    }
}

//! Counter ids: every packet the XDP program sees ends in exactly one
//! *outcome* counter; a few *event* counters count things that happen on the
//! way (an eviction, a stale connection-table hit) and are not outcomes.
//!
//! Ids index `LB_COUNTERS` and are part of the pinned-map ABI: a new counter
//! takes a new id at the end; a retired one keeps its id and name.

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
    /// Not an outcome: an event counted on the way.
    Event,
}

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $variant:ident = $id:literal, $name:literal, $kind:ident; )*) => {
        /// A counter id (index into `LB_COUNTERS`).
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $( $(#[doc = $doc])* $variant = $id, )*
        }

        impl Counter {
            /// Every counter, in id order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant),*];

            /// Stable snake_case name used by `lbctl stats` and metrics.
            pub const fn name(self) -> &'static str {
                match self { $(Counter::$variant => $name,)* }
            }

            pub const fn kind(self) -> Kind {
                match self { $(Counter::$variant => Kind::$kind,)* }
            }
        }
    };
}

counters! {
    /// Not IPv4 or IPv6 (ARP, LLDP, ...).
    PassNotIp = 0, "pass_not_ip", Pass;
    /// IP, but the protocol is neither TCP nor UDP.
    PassNotL4 = 1, "pass_not_tcp_udp", Pass;
    /// TCP or UDP to an address/port/protocol that is no VIP.
    PassNotVip = 2, "pass_not_vip", Pass;
    /// Forwarded to the backend found in the connection table.
    FwdConntrack = 3, "fwd_conntrack_hit", Forward;
    /// Forwarded by the Maglev table; the flow was (re)inserted in the connection table.
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
    /// IPv4 fragment (MF set or non-zero offset).
    MalformedIpv4Frag = 13, "malformed_ipv4_fragment", Malformed;
    /// Shorter than an IPv6 header.
    MalformedIpv6Truncated = 14, "malformed_ipv6_truncated", Malformed;
    /// IPv6 version field is not 6.
    MalformedIpv6Header = 15, "malformed_ipv6_bad_header", Malformed;
    /// IPv6 payload length longer than the frame.
    MalformedIpv6Len = 16, "malformed_ipv6_bad_length", Malformed;
    /// IPv6 fragment header.
    MalformedIpv6Frag = 17, "malformed_ipv6_fragment", Malformed;
    /// IPv6 extension header the datapath does not walk.
    MalformedIpv6Ext = 18, "malformed_ipv6_ext_header", Malformed;
    /// TCP or UDP header cut short (by the frame or by the IP length), or a TCP data offset below 5.
    MalformedL4 = 19, "malformed_l4_truncated", Malformed;
    /// Event: a new flow evicted a live connection-table entry.
    CtEvicted = 20, "ct_evicted", Event;
    /// Event: a connection-table hit pointed at a backend that is down or gone; re-picked.
    CtStale = 21, "ct_stale_backend", Event;
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

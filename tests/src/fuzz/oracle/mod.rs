//! The oracle: what the README says the balancer must do with a frame,
//! decided from the frame alone and the plain [`Model`] of the
//! configuration. It reads packets with etherparse's header slices plus
//! code of its own where etherparse reads differently from the README (the
//! TCP header needs 20 bytes, not its options; AH and fragment-header
//! fields), and never with lb's parser, flow hash, Maglev tables or
//! `lb::predict`.
//!
//! The answer, an [`Expect`], is a set of acceptable outcome kinds and,
//! where a kind needs it, what the output must look like: the tunnel
//! target (the VIP and the flow) of a forward, or the reply the balancer
//! may send instead. Where the README can be read two ways (a fragment
//! header counted among the four walked extension headers or not; an AH
//! header of 8 bytes), both readings are accepted; every such case is
//! named in [`Expect::why`]. A datagram to a QUIC VIP also carries the
//! route its connection ID calls for ([`quic`]).

mod icmp;
mod parse;
pub mod quic;

use std::{fmt, net::IpAddr, ops::Range};

use lb_common::counters::Kind;

use super::model::Model;
pub use parse::read_l2;

/// A set of outcome kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    pub const PASS: Kinds = Kinds(1);
    pub const FORWARD: Kinds = Kinds(2);
    pub const DROP: Kinds = Kinds(4);
    pub const MALFORMED: Kinds = Kinds(8);
    pub const REPLY: Kinds = Kinds(16);

    pub fn of(kind: Kind) -> Kinds {
        match kind {
            Kind::Pass => Kinds::PASS,
            Kind::Forward => Kinds::FORWARD,
            Kind::Drop => Kinds::DROP,
            Kind::Malformed => Kinds::MALFORMED,
            Kind::Reply => Kinds::REPLY,
            Kind::Event | Kind::Retired => Kinds(0),
        }
    }

    pub fn contains(self, other: Kinds) -> bool {
        other.0 != 0 && self.0 & other.0 == other.0
    }

    pub fn union(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }
}

impl fmt::Display for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = ["pass", "forward", "drop", "malformed", "reply"];
        let set: Vec<&str> = (0..5)
            .filter(|i| self.0 & (1 << i) != 0)
            .map(|i| names[i])
            .collect();
        write!(f, "{}", set.join(" or "))
    }
}

/// A flow as the balancer must see it: the 5-tuple in the client → VIP
/// direction, or the 3-tuple (ports 0) for what is hashed without ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub three_tuple: bool,
}

/// What a forwarded frame must be: the input's IP packet in a tunnel to a
/// backend of `vip`.
#[derive(Clone, Debug)]
pub struct Forward {
    pub vip: usize,
    pub flow: Flow,
    /// The input's IP packet (by its own length: no Ethernet padding).
    pub inner: Range<usize>,
    /// The packet's IP source, whose low bits an outer source prefix takes.
    pub source: IpAddr,
    /// An ICMP error routed by the flow it quotes.
    pub icmp_error: bool,
    /// A TCP SYN without ACK: it starts a connection, so it goes to the
    /// table's pick whatever older state its tuple has, unless its tuple's
    /// entry is protected (an active flow: then it goes by the connection
    /// table, counted so).
    pub syn: bool,
}

/// A reply the balancer may send instead of forwarding.
#[derive(Clone, Debug)]
pub enum Reply {
    /// An echo reply: the request turned around in place.
    Echo { icmp: usize, ip_end: usize },
    /// "Fragmentation needed" (IPv4) or "packet too big" (IPv6) announcing
    /// `mtu`, quoting the start of the IP packet `ip`.
    TooBig { ip: Range<usize>, mtu: u32 },
}

/// The oracle's verdict on one frame.
#[derive(Clone, Debug)]
pub struct Expect {
    pub kinds: Kinds,
    /// What the oracle read (for reports).
    pub why: &'static str,
    pub forward: Option<Forward>,
    pub reply: Option<Reply>,
    /// A TCP or UDP flow of a VIP this frame may have entered in the
    /// connection table, even when it was not forwarded (a SYN answered
    /// with "fragmentation needed" still records its flow).
    pub touches: Option<Flow>,
    /// Ethernet header length with its tag (14 or 18).
    pub l2: usize,
    /// A datagram to a QUIC VIP: where it goes without a usable
    /// connection-table entry.
    pub quic: Option<quic::Reading>,
}

impl Expect {
    fn only(kinds: Kinds, why: &'static str) -> Expect {
        Expect {
            kinds,
            why,
            forward: None,
            reply: None,
            touches: None,
            l2: 14,
            quic: None,
        }
    }

    pub fn pass(why: &'static str) -> Expect {
        Expect::only(Kinds::PASS, why)
    }

    pub fn malformed(why: &'static str) -> Expect {
        Expect::only(Kinds::MALFORMED, why)
    }

    pub fn drop(why: &'static str) -> Expect {
        Expect::only(Kinds::DROP, why)
    }

    /// What the oracle read and the kinds it accepts, for reports.
    pub fn reading(&self) -> String {
        match &self.quic {
            Some(q) => format!("{} ({}); QUIC: {}", self.why, self.kinds, q.why),
            None => format!("{} ({})", self.why, self.kinds),
        }
    }

    /// Also accepts `other`'s outcomes (a frame the README lets be read
    /// two ways).
    pub fn or(mut self, other: Expect) -> Expect {
        self.kinds = self.kinds.union(other.kinds);
        self.forward = self.forward.or(other.forward);
        self.reply = self.reply.or(other.reply);
        self.touches = self.touches.or(other.touches);
        self.quic = self.quic.or(other.quic);
        self
    }

    /// Also accepts "malformed", for the reason `why`.
    pub fn or_malformed(self, why: &'static str) -> Expect {
        let mut e = self.or(Expect::malformed(why));
        e.why = why;
        e
    }
}

/// The verdict on `frame` (at least 14 bytes: shorter ones never reach the
/// program) under `model`.
pub fn expect(model: &Model, frame: &[u8]) -> Expect {
    let Some(l2) = read_l2(frame) else {
        return Expect::malformed("Ethernet header or its tag cut short, or two tags");
    };
    let mut e = match l2.ethertype {
        0x0800 | 0x86dd => parse::ip(model, frame, l2.len),
        _ => Expect::pass("not IP"),
    };
    e.l2 = l2.len;
    e
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::fuzz::{
        generate::Pkt,
        wire::{self, Eth},
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address literal")
    }

    fn frame(p: &Pkt) -> Vec<u8> {
        let ethertype = if p.v6() {
            wire::ETH_IPV6
        } else {
            wire::ETH_IPV4
        };
        Eth::default().frame(ethertype, &p.build().0)
    }

    fn udp(src: &str, dst: &str, dport: u16) -> Pkt {
        let (s, d) = (ip(src), ip(dst));
        Pkt::new(s, d, wire::UDP, wire::udp((s, d), (4000, dport), b"data"))
    }

    fn tcp(src: &str, dst: &str, dport: u16) -> Pkt {
        let (s, d) = (ip(src), ip(dst));
        Pkt::new(
            s,
            d,
            wire::TCP,
            wire::tcp((s, d), (4000, dport), wire::TCP_SYN, &[], b""),
        )
    }

    fn vip_named(m: &Model, name: &str) -> usize {
        m.vips
            .iter()
            .position(|v| v.name == name)
            .expect("VIP of the model")
    }

    /// Destination options of `len` bytes.
    fn dstopts(len: usize) -> (u8, Vec<u8>) {
        (60, wire::ext_header(60, 0, len, &mut |_| 0))
    }

    #[test]
    fn a_vip_packet_is_forwarded_for_its_vip_and_its_neighbours_pass() {
        let m = Model::new();
        let e = expect(&m, &frame(&tcp("192.0.2.1", "10.0.0.10", 80)));
        assert_eq!(e.kinds, Kinds::FORWARD);
        assert_eq!(e.forward.expect("forward").vip, vip_named(&m, "tcp4"));
        assert_eq!(
            expect(&m, &frame(&tcp("192.0.2.1", "10.0.0.10", 81))).kinds,
            Kinds::PASS
        );
        assert_eq!(
            expect(&m, &frame(&udp("192.0.2.1", "10.0.0.30", 80))).kinds,
            Kinds::PASS
        );
        let all = expect(&m, &frame(&tcp("192.0.2.1", "10.0.0.40", 9))).forward;
        assert_eq!(all.expect("all-ports").vip, vip_named(&m, "all4"));
        let port = expect(&m, &frame(&tcp("192.0.2.1", "10.0.0.40", 8080))).forward;
        assert_eq!(port.expect("port VIP first").vip, vip_named(&m, "port4"));
        assert_eq!(
            expect(&m, &frame(&tcp("192.0.2.1", "10.0.0.50", 80))).kinds,
            Kinds::DROP
        );
    }

    #[test]
    fn extension_headers_count_to_four_and_1024_bytes() {
        let m = Model::new();
        let with = |ext: Vec<(u8, Vec<u8>)>| {
            let mut p = udp("2001:db8:c::1", "2001:db8::10", 53);
            p.v6_ext = ext;
            expect(&m, &frame(&p)).kinds
        };
        assert_eq!(with(vec![dstopts(512), dstopts(512)]), Kinds::FORWARD);
        assert_eq!(with(vec![dstopts(1024), dstopts(8)]), Kinds::MALFORMED);
        assert_eq!(
            with(vec![(0, wire::ext_header(0, 0, 1032, &mut |_| 0))]),
            Kinds::MALFORMED
        );
        assert_eq!(with(vec![dstopts(8); 4]), Kinds::FORWARD);
        assert_eq!(with(vec![dstopts(8); 5]), Kinds::MALFORMED);
        let atomic = (44, wire::frag_header(0, 0, false, 1).to_vec());
        let mut four_and_atomic = vec![dstopts(8); 4];
        four_and_atomic.push(atomic.clone());
        assert_eq!(
            with(four_and_atomic),
            Kinds::FORWARD.union(Kinds::MALFORMED)
        );
        assert_eq!(with(vec![atomic]), Kinds::FORWARD);
        assert_eq!(
            with(vec![(135, wire::ext_header(135, 0, 8, &mut |_| 0))]),
            Kinds::MALFORMED
        );
        // A fragment (M set, RFC 8200 layout) of the hashing VIP.
        let real = (44, wire::frag_header(0, 0, true, 1).to_vec());
        let mut p = udp("2001:db8:c::1", "2001:db8::70", 53);
        p.v6_ext = vec![real];
        let e = expect(&m, &frame(&p));
        assert_eq!(e.kinds, Kinds::FORWARD);
        assert!(e.forward.expect("forward").flow.three_tuple);
    }

    #[test]
    fn fragments_follow_the_policy_of_their_address_and_protocol() {
        let m = Model::new();
        let frag = |mut p: Pkt| {
            p.frag = wire::MF;
            expect(&m, &frame(&p)).kinds
        };
        assert_eq!(frag(udp("192.0.2.1", "10.0.0.70", 9)), Kinds::FORWARD);
        assert_eq!(frag(tcp("192.0.2.1", "10.0.0.70", 80)), Kinds::DROP);
        assert_eq!(frag(udp("192.0.2.1", "10.0.0.10", 53)), Kinds::DROP);
        assert_eq!(frag(udp("192.0.2.1", "10.0.0.99", 53)), Kinds::PASS);
    }

    /// An ICMP error from a router to `to`, quoting VIP `vip`:`vport` → client.
    fn icmp_error(to: &str, vip: &str, vport: u16) -> Vec<u8> {
        let quoted = udp(vip, "192.0.2.1", 4000);
        let mut q = quoted.build().0;
        q[20..22].copy_from_slice(&vport.to_be_bytes());
        let msg = wire::icmp4(3, 3, [0; 4], &q[..28]);
        frame(&Pkt::new(ip("198.51.100.1"), ip(to), wire::ICMP, msg))
    }

    #[test]
    fn icmp_errors_go_by_the_quoted_flow_read_inside_the_ip_packet() {
        let m = Model::new();
        let e = expect(&m, &icmp_error("10.0.0.10", "10.0.0.10", 53));
        assert_eq!(e.kinds, Kinds::FORWARD);
        let fwd = e.forward.expect("forward");
        assert_eq!(fwd.vip, vip_named(&m, "udp4"));
        assert_eq!(
            (fwd.flow.src, fwd.flow.sport, fwd.flow.dport),
            (ip("192.0.2.1"), 4000, 53)
        );
        // Sent to another VIP's address than the quote's source.
        assert_eq!(
            expect(&m, &icmp_error("10.0.0.20", "10.0.0.10", 53)).kinds,
            Kinds::PASS
        );
        // The IP length ends inside the quote; the frame keeps the rest.
        let mut cut = icmp_error("10.0.0.10", "10.0.0.10", 53);
        cut[16..18].copy_from_slice(&(20u16 + 8 + 22).to_be_bytes());
        wire::fix_ipv4_checksum(&mut cut[14..]);
        assert_eq!(expect(&m, &cut).kinds, Kinds::PASS);
    }

    #[test]
    fn too_big_packets_are_answered_or_dropped_by_policy() {
        let m = Model::new();
        assert_eq!(m.settings.mtu, 1500);
        let big = |df: bool| {
            let (s, d) = (ip("192.0.2.1"), ip("10.0.0.10"));
            let mut p = Pkt::new(
                s,
                d,
                wire::TCP,
                wire::tcp((s, d), (1, 80), 0x10, &[], &[0; 1441]),
            );
            p.df = df;
            expect(&m, &frame(&p))
        };
        // 20 + 20 + 1441 = 1481 bytes, 20 more in IP-in-IP: one too many.
        let e = big(true);
        assert_eq!(e.kinds, Kinds::REPLY);
        assert!(matches!(e.reply, Some(Reply::TooBig { mtu: 1480, .. })));
        assert_eq!(big(false).kinds, Kinds::DROP);
    }
}

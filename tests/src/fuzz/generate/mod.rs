//! The frame generators: well-formed and broken frames aimed at every
//! path of the README's "How a packet is handled" — TCP/UDP to VIPs and
//! beside them, IPv4 options, IPv6 extension-header chains up to and past
//! the limits, fragments, ICMP errors quoting VIP flows (cut at every
//! length, or cut by the IP length with the rest left as trailer), echo
//! requests, VLAN tags, Ethernet padding, QUIC datagrams to the QUIC VIPs
//! — then mutations of those and plain random bytes, from 0 to ~3,700
//! bytes.
//!
//! Generators know the configuration (to aim at VIPs) but decide nothing:
//! the oracle reads every frame afresh. Flows are drawn from a pool so
//! that the same 5-tuples come back (connection-table hits, invariant 5)
//! and ICMP errors quote flows that were seen.

mod ext;
mod icmp;
mod ip;
mod mutate;
mod quic;

use std::{fmt, net::IpAddr};

use super::{
    model::Model,
    rng::Rng,
    wire::{self, Eth, V4, V6},
};

/// The generator a frame came from: half of a report's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gen {
    Vip4,
    Vip6,
    NearVip,
    Options4,
    Ext6,
    Frag4,
    Frag6,
    IcmpError4,
    IcmpError6,
    Echo,
    NotIp,
    Vlan,
    Qinq,
    Malformed,
    TooBig,
    Mutated,
    Random,
    RandomIp,
    Huge,
    Quic,
}

impl Gen {
    pub const ALL: [Gen; 20] = [
        Gen::Vip4,
        Gen::Vip6,
        Gen::NearVip,
        Gen::Options4,
        Gen::Ext6,
        Gen::Frag4,
        Gen::Frag6,
        Gen::IcmpError4,
        Gen::IcmpError6,
        Gen::Echo,
        Gen::NotIp,
        Gen::Vlan,
        Gen::Qinq,
        Gen::Malformed,
        Gen::TooBig,
        Gen::Mutated,
        Gen::Random,
        Gen::RandomIp,
        Gen::Huge,
        Gen::Quic,
    ];

    /// Relative frequency.
    fn weight(self) -> u32 {
        match self {
            Gen::Vip4 | Gen::Vip6 => 110,
            Gen::Quic => 90,
            Gen::Ext6 => 100,
            Gen::Mutated => 160,
            Gen::IcmpError4 | Gen::IcmpError6 => 60,
            Gen::NearVip | Gen::Malformed => 50,
            Gen::Options4 | Gen::Frag4 | Gen::Frag6 | Gen::Echo | Gen::Vlan | Gen::TooBig => 40,
            Gen::Qinq | Gen::Random | Gen::RandomIp => 15,
            Gen::NotIp | Gen::Huge => 10,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Gen::Vip4 => "vip4",
            Gen::Vip6 => "vip6",
            Gen::NearVip => "near_vip",
            Gen::Options4 => "ipv4_options",
            Gen::Ext6 => "ipv6_ext",
            Gen::Frag4 => "frag4",
            Gen::Frag6 => "frag6",
            Gen::IcmpError4 => "icmp_error4",
            Gen::IcmpError6 => "icmp_error6",
            Gen::Echo => "icmp_echo",
            Gen::NotIp => "not_ip",
            Gen::Vlan => "vlan",
            Gen::Qinq => "qinq",
            Gen::Malformed => "malformed",
            Gen::TooBig => "too_big",
            Gen::Mutated => "mutated",
            Gen::Random => "random",
            Gen::RandomIp => "random_ip",
            Gen::Huge => "huge",
            Gen::Quic => "quic",
        }
    }
}

impl fmt::Display for Gen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A generated frame and the offsets of its interesting bytes (lengths,
/// offsets, protocol numbers, ports), where mutations aim.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The generator it came from.
    pub source: Gen,
    pub frame: Vec<u8>,
    pub fields: Vec<usize>,
    /// A QUIC datagram's aim (what the generator meant it to be).
    pub quic: Option<&'static str>,
}

/// An IP packet to build: addresses, the upper-layer protocol and bytes,
/// and the header options the generators vary.
#[derive(Clone, Debug)]
pub struct Pkt {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub l4: Vec<u8>,
    pub df: bool,
    /// IPv4 MF and fragment offset bits.
    pub frag: u16,
    pub tos: u8,
    pub v4_options: Vec<u8>,
    /// IPv6 extension headers in order: type and bytes (the first byte, the
    /// next header, is filled in when built).
    pub v6_ext: Vec<(u8, Vec<u8>)>,
}

impl Pkt {
    pub fn new(src: IpAddr, dst: IpAddr, proto: u8, l4: Vec<u8>) -> Pkt {
        Pkt {
            src,
            dst,
            proto,
            l4,
            df: true,
            frag: 0,
            tos: 0,
            v4_options: Vec::new(),
            v6_ext: Vec::new(),
        }
    }

    pub fn v6(&self) -> bool {
        self.dst.is_ipv6()
    }

    /// The IP packet and its interesting offsets.
    pub fn build(&self) -> (Vec<u8>, Vec<usize>) {
        if self.v6() {
            let mut h = V6::new(wire::v6(self.src), wire::v6(self.dst));
            h.tclass = self.tos;
            let mut payload = Vec::new();
            let mut fields = vec![0, 4, 5, 6];
            let first = self.v6_ext.first().map_or(self.proto, |(k, _)| *k);
            for (i, (_, bytes)) in self.v6_ext.iter().enumerate() {
                let next = self.v6_ext.get(i + 1).map_or(self.proto, |(k, _)| *k);
                fields.extend([40 + payload.len(), 41 + payload.len(), 43 + payload.len()]);
                payload.push(next);
                payload.extend_from_slice(&bytes[1..]);
            }
            fields.extend(l4_fields(self.proto).map(|f| 40 + payload.len() + f));
            payload.extend_from_slice(&self.l4);
            (h.packet(first, &payload), fields)
        } else {
            let mut h = V4::new(wire::v4(self.src), wire::v4(self.dst), self.proto);
            h.tos = self.tos;
            h.frag = self.frag | if self.df { wire::DF } else { 0 };
            h.options = self.v4_options.clone();
            let hlen = 20 + self.v4_options.len();
            let mut fields = vec![0, 2, 3, 6, 7, 9];
            fields.extend(l4_fields(self.proto).map(|f| hlen + f));
            (h.packet(&self.l4), fields)
        }
    }
}

/// Interesting offsets inside an upper-layer header.
fn l4_fields(proto: u8) -> impl Iterator<Item = usize> {
    let f: &[usize] = match proto {
        wire::TCP => &[0, 1, 2, 3, 12, 13],
        wire::UDP => &[2, 3, 4, 5],
        _ => &[0, 1, 4, 5, 6, 7, 8, 9, 17, 20, 21, 22, 23],
    };
    f.iter().copied()
}

/// A flow of the pool: client → VIP.
#[derive(Clone, Copy, Debug)]
pub struct PoolFlow {
    pub client: IpAddr,
    pub vip: usize,
    pub sport: u16,
    pub dport: u16,
}

/// Flows per family, the previous epoch's kept for carried-over traffic.
#[derive(Default)]
struct Pool {
    now: Vec<PoolFlow>,
    before: Vec<PoolFlow>,
    next: usize,
}

const POOL_SIZE: usize = 4096;

pub struct Generator {
    pub rng: Rng,
    /// [`Gen::weight`] of every generator, in [`Gen::ALL`] order.
    weights: Vec<u32>,
    pools: [Pool; 2],
    /// Flows to the QUIC VIPs (see [`quic`]).
    quic: Vec<PoolFlow>,
    /// Frames above this become multi-buffer in the kernel.
    pub linear_max: usize,
}

impl Generator {
    pub fn new(seed: u64, linear_max: usize) -> Generator {
        Generator {
            rng: Rng::new(seed),
            weights: Gen::ALL.iter().map(|g| g.weight()).collect(),
            pools: Default::default(),
            quic: Vec::new(),
            linear_max,
        }
    }

    /// New flows for a new epoch; the old ones still come back sometimes.
    pub fn new_epoch(&mut self) {
        for p in &mut self.pools {
            p.before = std::mem::take(&mut p.now);
            p.next = 0;
        }
    }

    /// The next frame.
    pub fn next(&mut self, model: &Model) -> Sample {
        let source = Gen::ALL[self.rng.weighted(&self.weights)];
        let mut s = self.generate(model, source);
        s.source = source;
        s
    }

    /// A frame of generator `source`.
    pub fn generate(&mut self, model: &Model, source: Gen) -> Sample {
        match source {
            Gen::Vip4 => ip::vip(self, model, false),
            Gen::Vip6 => ip::vip(self, model, true),
            Gen::NearVip => ip::near_vip(self, model),
            Gen::Options4 => ip::options4(self, model),
            Gen::Ext6 => ext::chain(self, model),
            Gen::Frag4 => ip::fragment(self, model, false),
            Gen::Frag6 => ip::fragment(self, model, true),
            Gen::IcmpError4 => icmp::error(self, model, false),
            Gen::IcmpError6 => icmp::error(self, model, true),
            Gen::Echo => icmp::echo(self, model),
            Gen::NotIp => mutate::not_ip(self),
            Gen::Vlan => mutate::tagged(self, model, 1),
            Gen::Qinq => mutate::tagged(self, model, 2),
            Gen::Malformed => ip::malformed(self, model),
            Gen::TooBig => ip::too_big(self, model),
            Gen::Mutated => mutate::mutated(self, model),
            Gen::Random => mutate::random(self),
            Gen::RandomIp => mutate::random_ip(self, model),
            Gen::Huge => mutate::huge(self, model),
            Gen::Quic => quic::datagram(self, model),
        }
    }

    /// A frame around `pkt`: Ethernet (sometimes padded afterwards).
    pub fn sample(&mut self, source: Gen, pkt: &Pkt) -> Sample {
        let (packet, fields) = pkt.build();
        let eth = Eth::default();
        let ethertype = if pkt.v6() {
            wire::ETH_IPV6
        } else {
            wire::ETH_IPV4
        };
        let mut frame = eth.frame(ethertype, &packet);
        if self.rng.chance(8) {
            let n = self.rng.range(1, 64);
            let pad = self.rng.bytes(n);
            frame.extend_from_slice(&pad);
        } else if frame.len() < 60 && self.rng.chance(30) {
            frame.resize(60, 0);
        }
        let mut all = vec![12, 13];
        all.extend(fields.into_iter().map(|f| f + 14));
        Sample {
            source,
            frame,
            fields: all,
            quic: None,
        }
    }

    /// A client → VIP flow of family `v6`: most often one seen before.
    pub fn flow(&mut self, model: &Model, v6: bool) -> PoolFlow {
        let pool = &self.pools[usize::from(v6)];
        let reuse = self.rng.below(100);
        if reuse < 10 && !pool.before.is_empty() {
            return *self.rng.pick(&pool.before);
        }
        if reuse < 75 && !pool.now.is_empty() {
            return *self.rng.pick(&pool.now);
        }
        let vips: Vec<usize> = (0..model.vips.len())
            .filter(|&i| model.vips[i].is_v6() == v6)
            .collect();
        let vip = *self.rng.pick(&vips);
        let f = PoolFlow {
            client: self.client(v6),
            vip,
            sport: self.rng.u16().max(1),
            dport: match model.vips[vip].port {
                0 => self.rng.u16(),
                p => p,
            },
        };
        let pool = &mut self.pools[usize::from(v6)];
        if pool.now.len() < POOL_SIZE {
            pool.now.push(f);
        } else {
            pool.now[pool.next] = f;
            pool.next = (pool.next + 1) % POOL_SIZE;
        }
        f
    }

    /// A client address.
    pub fn client(&mut self, v6: bool) -> IpAddr {
        if v6 {
            let mut o = [
                0x20, 0x01, 0x0d, 0xb8, 0, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ];
            self.rng.fill(&mut o[8..]);
            IpAddr::from(o)
        } else {
            let o = [
                198,
                18 + self.rng.below(2) as u8,
                self.rng.u8(),
                self.rng.u8(),
            ];
            IpAddr::from(o)
        }
    }

    /// A TCP segment or UDP datagram of `flow`, `payload` bytes long.
    pub fn segment(&mut self, model: &Model, flow: &PoolFlow, payload: usize) -> (u8, Vec<u8>) {
        let vip = &model.vips[flow.vip];
        let data = self.rng.bytes(payload);
        let ends = (flow.client, vip.addr);
        let ports = (flow.sport, flow.dport);
        if vip.proto == wire::TCP {
            let flags = *self
                .rng
                .pick(&[0x02, 0x02, 0x10, 0x18, 0x11, 0x12, 0x04, 0x10]);
            let flags = if self.rng.chance(5) {
                self.rng.u8()
            } else {
                flags
            };
            (wire::TCP, wire::tcp(ends, ports, flags, &[], &data))
        } else {
            (wire::UDP, wire::udp(ends, ports, &data))
        }
    }
}

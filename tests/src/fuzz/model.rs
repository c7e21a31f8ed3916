//! What the balancer is configured with, as plain data: the VIPs (address,
//! port, protocol, encapsulation, connection-table and fragment policies,
//! backends and weights) and the datapath settings, per epoch. The target
//! turns it into lb's own configuration (`VipConfig`, `DatapathSettings`)
//! and programs the maps through the reconciler, as `lbd` does; the oracle
//! reads the same plain data and nothing of lb's.
//!
//! Every VIP has backend addresses of its own, so the outer destination of
//! a tunnelled packet names the VIP it was forwarded for.
//!
//! The QUIC VIPs (UDP) draw their QUIC-LB configuration per epoch: the
//! server-ID length from a shuffled deck of 1 to 15 (every length within
//! four epochs), a configuration id 0 to 6 (or no `quic:` at all this
//! epoch), a server ID per backend (unique in the VIP, some shared
//! with another QUIC VIP, a few backends without one), and their
//! backends' health (down ones stay configured, unusable) and draining
//! (weight 0).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb::{
    DatapathSettings,
    config::{
        BackendConfig, Encap, FragmentPolicy, MalformedPolicy, QuicConfig, ServerId, VipConfig,
        VipId,
    },
};

use super::{rng::Rng, wire};

/// The gateway MAC the balancer readdresses tunnelled frames to.
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];

/// Most backends a VIP gets (slots `1..=MAX_SLOTS` of its address block).
const MAX_SLOTS: u8 = 4;

/// One backend of a VIP.
#[derive(Clone, Debug)]
pub struct Backend {
    pub addr: IpAddr,
    /// 0: out of the table, its connections still honoured.
    pub weight: u32,
    /// Health: a down backend is out of the table, and neither its
    /// connection-table entries nor its server ID reach it (only QUIC
    /// VIPs' backends go down).
    pub up: bool,
    /// Its QUIC-LB server ID (a QUIC VIP's backend; `None`: it has none).
    pub server_id: Option<Vec<u8>>,
}

impl Backend {
    fn new(addr: IpAddr) -> Backend {
        Backend {
            addr,
            weight: 1,
            up: true,
            server_id: None,
        }
    }
}

/// A VIP's `quic:` (QUIC-LB, plaintext connection IDs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quic {
    /// Octets of server ID after the connection ID's first octet (1-15).
    pub server_id_len: u8,
    /// The configuration id in the first octet's three high bits (0-6).
    pub config_id: u8,
}

/// One VIP.
#[derive(Clone, Debug)]
pub struct Vip {
    pub name: &'static str,
    pub addr: IpAddr,
    /// 0: every port.
    pub port: u16,
    pub proto: u8,
    pub encap: Encap,
    pub conntrack: bool,
    pub frag_hash: bool,
    /// Second chance: a TCP packet without a connection-table entry may
    /// carry alternates (GUE variant 0 with lb's list, whatever `encap`).
    pub second_chance: bool,
    /// Client affinity (`hash: [src_ip]`, or `[src_ip/64]`: an IPv6
    /// client by its /64): every new flow of one client reaches one
    /// backend while the table is unchanged.
    pub affinity: Option<Affinity>,
    /// The family of its backends (`None`: a VIP that never has any).
    pub backend_v6: Option<bool>,
    pub backends: Vec<Backend>,
    /// QUIC by connection ID (`None`: none, or none this epoch).
    pub quic: Option<Quic>,
    /// One of the QUIC VIPs ([`QUIC`]): its `quic:`, server IDs and
    /// backends' health are drawn per epoch.
    pub quic_row: bool,
    /// Server IDs its backends had in earlier epochs and may have lost
    /// (the newest last; a few).
    pub retired_ids: Vec<Vec<u8>>,
    /// Index of its address block (`10.1.N.x`, `fd00:1:N::x`).
    block: u8,
}

impl Vip {
    pub fn is_v6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// Address of backend slot `slot` of this VIP.
    fn slot_addr(&self, slot: u8) -> IpAddr {
        match self.backend_v6 {
            Some(true) => IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                1,
                self.block.into(),
                0,
                0,
                0,
                0,
                slot.into(),
            )),
            _ => IpAddr::V4(Ipv4Addr::new(10, 1, self.block, slot)),
        }
    }

    /// Bytes the tunnel adds: outer IP header and GRE or UDP header; for
    /// a second-chance VIP the largest list (UDP, GUE, lb's header, three
    /// addresses), which README says every packet of the VIP is checked
    /// against.
    pub fn overhead(&self) -> usize {
        let v6 = self.backend_v6 == Some(true);
        let ip = if v6 { 40 } else { 20 };
        if self.second_chance {
            return ip + 8 + 4 + 4 + 3 * if v6 { 16 } else { 4 };
        }
        ip + match self.encap {
            Encap::Ipip => 0,
            Encap::Gre => 4,
            Encap::Gue => 8,
        }
    }

    pub fn has_backends(&self) -> bool {
        !self.backends.is_empty()
    }

    /// Whether a backend has server ID `sid`.
    pub fn has_server_id(&self, sid: &[u8]) -> bool {
        self.backends
            .iter()
            .any(|b| b.server_id.as_deref() == Some(sid))
    }
}

/// The datapath settings of an epoch.
#[derive(Clone, Debug)]
pub struct Settings {
    pub malformed_drop: bool,
    pub icmp_echo: bool,
    /// 0: unchecked.
    pub mtu: u16,
    pub pass_too_big: bool,
    pub gue_port: u16,
    pub src_v4: Ipv4Addr,
    pub src_v4_host_bits: u8,
    pub src_v6: Ipv6Addr,
    pub src_v6_host_bits: u8,
}

/// The whole configuration the balancer runs with now.
#[derive(Clone, Debug)]
pub struct Model {
    pub vips: Vec<Vip>,
    pub settings: Settings,
    pub epoch: u32,
    /// The QUIC draws' own stream, so that they leave the others alone.
    quic_rng: Rng,
    /// Server-ID lengths still to deal (a shuffled 1..=15, refilled).
    quic_lens: Vec<u8>,
}

/// `(name, VIP, encapsulation, conntrack, fragments hash, backends IPv6)`.
type VipRow = (&'static str, &'static str, Encap, bool, bool, Option<bool>);

/// Every combination the invariants must see: both families, TCP and UDP,
/// every encapsulation over both outer families, an all-ports VIP (with a
/// port-specific VIP on the same address), VIPs without backends, one
/// without the connection table, fragment-hashing VIPs next to VIPs of
/// the same address that drop fragments, two with second chance (over
/// IPv4 and IPv6 backends), and the QUIC VIPs ([`QUIC`]: both families
/// over every encapsulation, one without the connection table, one on
/// every port).
#[rustfmt::skip] // A table: one VIP per row.
const VIPS: &[VipRow] = &[
    ("tcp4", "10.0.0.10:80/tcp", Encap::Ipip, true, false, Some(false)),
    ("udp4", "10.0.0.10:53/udp", Encap::Ipip, true, false, Some(false)),
    ("tcp6", "[2001:db8::10]:80/tcp", Encap::Ipip, true, false, Some(true)),
    ("udp6", "[2001:db8::10]:53/udp", Encap::Ipip, true, false, Some(true)),
    ("tcp4in6", "10.0.0.20:80/tcp", Encap::Ipip, true, false, Some(true)),
    ("udp6in4", "[2001:db8::20]:53/udp", Encap::Ipip, true, false, Some(false)),
    ("gre4", "10.0.0.30:80/tcp", Encap::Gre, true, false, Some(false)),
    ("gre6", "[2001:db8::30]:443/tcp", Encap::Gre, true, false, Some(true)),
    ("gre4in6", "10.0.0.30:443/tcp", Encap::Gre, true, false, Some(true)),
    ("gre6in4", "[2001:db8::30]:53/udp", Encap::Gre, true, false, Some(false)),
    ("all4", "10.0.0.40:*/tcp", Encap::Ipip, true, false, Some(false)),
    ("port4", "10.0.0.40:8080/tcp", Encap::Gue, true, false, Some(true)),
    ("all6", "[2001:db8::40]:*/udp", Encap::Gre, true, false, Some(true)),
    ("empty4", "10.0.0.50:80/tcp", Encap::Ipip, true, false, None),
    ("empty6", "[2001:db8::50]:53/udp", Encap::Ipip, true, false, None),
    ("noct4", "10.0.0.60:53/udp", Encap::Ipip, false, false, Some(false)),
    ("fraghash4", "10.0.0.70:53/udp", Encap::Ipip, true, true, Some(false)),
    ("fragdrop4", "10.0.0.70:5353/udp", Encap::Ipip, true, false, Some(false)),
    ("fragtcp4", "10.0.0.70:80/tcp", Encap::Gre, true, false, Some(false)),
    ("fraghash6", "[2001:db8::70]:53/udp", Encap::Gue, true, true, Some(true)),
    ("fragdrop6", "[2001:db8::70]:80/tcp", Encap::Ipip, true, false, Some(true)),
    ("gue4", "10.0.0.80:80/tcp", Encap::Gue, true, false, Some(false)),
    ("gue6", "[2001:db8::80]:80/tcp", Encap::Gue, true, false, Some(true)),
    ("gue4in6", "10.0.0.80:443/tcp", Encap::Gue, true, false, Some(true)),
    ("gue6in4", "[2001:db8::80]:53/udp", Encap::Gue, true, false, Some(false)),
    ("sc4", "10.0.0.90:80/tcp", Encap::Ipip, true, false, Some(false)),
    ("sc6", "[2001:db8::90]:443/tcp", Encap::Gre, true, false, Some(true)),
    ("quic4", "10.0.0.100:443/udp", Encap::Ipip, true, false, Some(false)),
    ("quic6", "[2001:db8::100]:443/udp", Encap::Gre, true, false, Some(true)),
    ("quic4in6", "10.0.0.100:4433/udp", Encap::Gue, true, false, Some(true)),
    ("quic6in4", "[2001:db8::100]:4433/udp", Encap::Ipip, true, false, Some(false)),
    ("quicnoct4", "10.0.0.110:443/udp", Encap::Gre, false, false, Some(false)),
    ("quicall6", "[2001:db8::110]:*/udp", Encap::Gue, true, false, Some(true)),
];

/// The VIPs of [`VIPS`] that may have `quic:`.
const QUIC: &[&str] = &[
    "quic4",
    "quic6",
    "quic4in6",
    "quic6in4",
    "quicnoct4",
    "quicall6",
];

/// Most retired server IDs a VIP remembers.
const RETIRED_IDS: usize = 16;

/// The VIPs of [`VIPS`] with second chance.
const SECOND_CHANCE: &[&str] = &["sc4", "sc6"];

/// How a VIP with client affinity knows a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// By its address.
    Address,
    /// An IPv6 client by its /64 (an IPv4 one by its address).
    Prefix64,
}

/// How a VIP of affinity `a` knows the client at `src`: the address, or
/// for [`Affinity::Prefix64`] an IPv6 address with its last 64 bits zero.
pub fn client_of(src: IpAddr, a: Affinity) -> IpAddr {
    match (src, a) {
        (IpAddr::V6(v6), Affinity::Prefix64) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        (other, _) => other,
    }
}

/// The VIPs of [`VIPS`] with client affinity: each alone on its address
/// for its protocol, so that a client of the VIP names the VIP.
const AFFINITY: &[(&str, Affinity)] = &[("sc4", Affinity::Address), ("gre6", Affinity::Prefix64)];

impl Model {
    /// Epoch 0 with the QUIC draws of seed 0 (see [`Model::with_seed`]).
    pub fn new() -> Model {
        Model::with_seed(0)
    }

    /// Epoch 0: every VIP with three backends of weight 1 (none for the
    /// empty ones); the QUIC VIPs' configuration drawn from `seed`.
    pub fn with_seed(seed: u64) -> Model {
        let vips = VIPS
            .iter()
            .enumerate()
            .map(
                |(i, &(name, id, encap, conntrack, frag_hash, backend_v6))| {
                    let id: VipId = id.parse().expect("VIP literal");
                    let mut v = Vip {
                        name,
                        addr: id.addr,
                        port: id.port,
                        proto: id.proto.number(),
                        encap,
                        conntrack,
                        frag_hash,
                        second_chance: SECOND_CHANCE.contains(&name),
                        affinity: AFFINITY.iter().find(|(n, _)| *n == name).map(|(_, a)| *a),
                        backend_v6,
                        backends: Vec::new(),
                        quic: None,
                        quic_row: QUIC.contains(&name),
                        retired_ids: Vec::new(),
                        block: i as u8 + 1,
                    };
                    if backend_v6.is_some() {
                        v.backends = (1..=3).map(|s| Backend::new(v.slot_addr(s))).collect();
                    }
                    v
                },
            )
            .collect();
        let mut m = Model {
            vips,
            settings: Settings::for_epoch(0, &mut Rng::new(0)),
            epoch: 0,
            quic_rng: Rng::new(seed ^ 0x7175_6963),
            quic_lens: Vec::new(),
        };
        m.draw_quic(true);
        m
    }

    /// The VIP `{addr, port, proto}` serves: the exact one, else the
    /// address's all-ports VIP of that protocol.
    pub fn lookup(&self, addr: IpAddr, port: u16, proto: u8) -> Option<usize> {
        let find = |p: u16| {
            self.vips
                .iter()
                .position(|v| v.addr == addr && v.port == p && v.proto == proto)
        };
        find(port).or_else(|| find(0))
    }

    /// Whether `addr` is the address of any VIP.
    pub fn is_vip_addr(&self, addr: IpAddr) -> bool {
        self.vips.iter().any(|v| v.addr == addr)
    }

    /// The addresses of the VIPs of one family.
    pub fn vip_addrs(&self, v6: bool) -> Vec<IpAddr> {
        let family = self.vips.iter().filter(|v| v.is_v6() == v6);
        family.map(|v| v.addr).collect()
    }

    /// VIPs on `addr` with protocol `proto` (what a fragment may be for).
    pub fn vips_at(&self, addr: IpAddr, proto: u8) -> impl Iterator<Item = usize> + '_ {
        self.vips
            .iter()
            .enumerate()
            .filter(move |(_, v)| v.addr == addr && v.proto == proto)
            .map(|(i, _)| i)
    }

    /// The VIP and the backend at `addr`, if any VIP has it now.
    pub fn backend_at(&self, addr: IpAddr) -> Option<(usize, &Backend)> {
        self.vips
            .iter()
            .enumerate()
            .find_map(|(i, v)| v.backends.iter().find(|b| b.addr == addr).map(|b| (i, b)))
    }

    /// Whether the backend at `addr` is up (what the target tells the
    /// reconciler).
    pub fn is_up(&self, addr: IpAddr) -> bool {
        self.backend_at(addr).is_some_and(|(_, b)| b.up)
    }

    /// lb's configuration of these VIPs.
    pub fn lb_vips(&self) -> Vec<VipConfig> {
        self.vips
            .iter()
            .map(|v| {
                let id = VipId {
                    addr: v.addr,
                    port: v.port,
                    proto: if v.proto == wire::TCP {
                        lb::config::Protocol::Tcp
                    } else {
                        lb::config::Protocol::Udp
                    },
                };
                let mut c = VipConfig::new(
                    id,
                    v.backends
                        .iter()
                        .map(|b| BackendConfig {
                            server_id: b.server_id.clone().map(ServerId),
                            ..BackendConfig::new(b.addr, b.weight)
                        })
                        .collect(),
                );
                c.quic = v.quic.map(|q| QuicConfig {
                    server_id_len: q.server_id_len,
                    config_id: q.config_id,
                });
                c.encap = v.encap;
                c.conntrack = v.conntrack;
                c.second_chance = v.second_chance;
                c.hash = match v.affinity {
                    None => lb::config::HashFields::FIVE_TUPLE,
                    Some(Affinity::Address) => {
                        lb::config::HashFields::parse(["src_ip"]).expect("a field list")
                    }
                    Some(Affinity::Prefix64) => {
                        lb::config::HashFields::parse(["src_ip/64"]).expect("a field list")
                    }
                };
                if v.frag_hash {
                    c.fragments = FragmentPolicy::Hash;
                }
                c
            })
            .collect()
    }

    /// lb's datapath settings.
    pub fn lb_settings(&self) -> DatapathSettings {
        let s = &self.settings;
        DatapathSettings {
            gateway_mac: GW_MAC,
            outer_source_v4: Some(s.src_v4),
            outer_source_v6: Some(s.src_v6),
            outer_source_v4_host_bits: s.src_v4_host_bits,
            outer_source_v6_host_bits: s.src_v6_host_bits,
            malformed: if s.malformed_drop {
                MalformedPolicy::Drop
            } else {
                MalformedPolicy::Pass
            },
            mtu: s.mtu,
            gue_port: s.gue_port,
            icmp_echo: s.icmp_echo,
            pass_too_big: s.pass_too_big,
            // The windows in HZ=250's ticks, whatever this kernel's HZ.
            kernel_hz: None,
            // Every third epoch keyed: placement changes, no invariant may.
            hash_key: (self.epoch % 3 == 2).then_some([u64::from(self.epoch) + 1, 0x5151_5151]),
        }
    }

    /// The next epoch: new settings, a few VIPs' backends changed (one
    /// added, one removed, or re-weighted; a VIP keeps at least one
    /// backend of positive weight), and the QUIC VIPs' draws.
    pub fn next_epoch(&mut self, rng: &mut Rng) -> Vec<String> {
        self.epoch += 1;
        self.settings = Settings::for_epoch(self.epoch, rng);
        let mut changes = Vec::new();
        for _ in 0..rng.range(1, 4) {
            let i = rng.below(self.vips.len());
            if self.vips[i].has_backends() {
                changes.push(self.change_backends(i, rng));
            }
        }
        self.draw_quic(false);
        changes
    }

    fn change_backends(&mut self, i: usize, rng: &mut Rng) -> String {
        let v = &mut self.vips[i];
        let free: Vec<u8> = (1..=MAX_SLOTS)
            .filter(|s| !v.backends.iter().any(|b| b.addr == v.slot_addr(*s)))
            .collect();
        match rng.below(3) {
            0 if !free.is_empty() => {
                let addr = v.slot_addr(*rng.pick(&free));
                v.backends.push(Backend::new(addr));
                format!("{}: backend {addr} added", v.name)
            }
            1 if v.backends.len() > 1 => {
                let gone = v.backends.remove(rng.below(v.backends.len()));
                if v.backends.iter().all(|b| b.weight == 0) {
                    v.backends[0].weight = 1;
                }
                if let Some(sid) = gone.server_id {
                    v.retire_id(sid);
                }
                format!("{}: backend {} removed", v.name, gone.addr)
            }
            _ => {
                for b in &mut v.backends {
                    b.weight = rng.range(0, 4) as u32;
                }
                if v.backends.iter().all(|b| b.weight == 0) {
                    v.backends[0].weight = 1;
                }
                let w: Vec<u32> = v.backends.iter().map(|b| b.weight).collect();
                format!("{}: weights {w:?}", v.name)
            }
        }
    }
}

/// The QUIC VIPs' draws.
impl Model {
    /// The initial model with its VIP `quic4` given 2-octet server IDs
    /// under `config_id`, and that VIP's index (unit tests' fixture).
    #[cfg(test)]
    pub fn with_quic4(config_id: u8) -> (Model, usize) {
        let mut m = Model::new();
        let q = m
            .vips
            .iter()
            .position(|v| v.name == "quic4")
            .expect("quic4");
        m.vips[q].quic = Some(Quic {
            server_id_len: 2,
            config_id,
        });
        (m, q)
    }
}

impl Model {
    /// This epoch's QUIC configuration of the QUIC VIPs: four of them (all
    /// of them if `all`) deal a new `quic:` from the deck, so that every
    /// length is dealt within four epochs; of the others, some lose
    /// `quic:`, some take another's length, some keep it with new server
    /// IDs (servers replaced), the rest keep all. New server IDs retire
    /// the old ones; health and draining are drawn afresh; one up backend
    /// at least has an ID.
    fn draw_quic(&mut self, all: bool) {
        let rows: Vec<usize> = (0..self.vips.len())
            .filter(|&i| self.vips[i].quic_row)
            .collect();
        let mut fresh = rows.clone();
        if !all {
            shuffle(&mut self.quic_rng, &mut fresh);
            fresh.truncate(4);
        }
        for &i in &rows {
            let r = &mut self.quic_rng;
            let (quic, replaced) = if fresh.contains(&i) {
                (Some(self.deal_quic()), false)
            } else if r.chance(12) {
                (None, false)
            } else if r.chance(25) {
                (self.shared_quic(i), false)
            } else {
                (self.vips[i].quic, r.chance(50))
            };
            if quic != self.vips[i].quic || replaced {
                let v = &mut self.vips[i];
                v.quic = quic;
                let old: Vec<Vec<u8>> = v
                    .backends
                    .iter_mut()
                    .filter_map(|b| b.server_id.take())
                    .collect();
                old.into_iter().for_each(|sid| v.retire_id(sid));
            }
            self.draw_health(i);
            self.fill_server_ids(i);
        }
    }

    /// A `quic:` with the deck's next server-ID length (a shuffled 1..=15,
    /// dealt out before it is shuffled again) and a configuration id 0
    /// to 6.
    fn deal_quic(&mut self) -> Quic {
        let r = &mut self.quic_rng;
        if self.quic_lens.is_empty() {
            self.quic_lens = (1..=15).collect();
            shuffle(r, &mut self.quic_lens);
        }
        Quic {
            server_id_len: self.quic_lens.pop().expect("a refilled deck"),
            config_id: r.below(7) as u8,
        }
    }

    /// A `quic:` for VIP `i` with another QUIC VIP's server-ID length (so
    /// that server IDs can be shared), if one has `quic:`.
    fn shared_quic(&mut self, i: usize) -> Option<Quic> {
        let others: Vec<u8> = self
            .vips
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, v)| v.quic.map(|q| q.server_id_len))
            .collect();
        let r = &mut self.quic_rng;
        (!others.is_empty()).then(|| Quic {
            server_id_len: *r.pick(&others),
            config_id: r.below(7) as u8,
        })
    }

    /// Server IDs for VIP `i`'s backends that have none (one in ten stays
    /// without, unless no up backend would have one): unique in the VIP,
    /// one in five copied from another QUIC VIP of the same length.
    fn fill_server_ids(&mut self, i: usize) {
        let Some(q) = self.vips[i].quic else {
            return;
        };
        let others: Vec<Vec<u8>> = self
            .vips
            .iter()
            .enumerate()
            .filter(|(j, v)| *j != i && v.quic.map(|o| o.server_id_len) == Some(q.server_id_len))
            .flat_map(|(_, v)| v.backends.iter().filter_map(|b| b.server_id.clone()))
            .collect();
        for k in 0..self.vips[i].backends.len() {
            let v = &self.vips[i];
            let routable = v.backends.iter().any(|b| b.up && b.server_id.is_some());
            let last_up = v.backends[k].up && !v.backends[k + 1..].iter().any(|b| b.up);
            let skip = self.quic_rng.chance(10) && (routable || !last_up);
            if v.backends[k].server_id.is_some() || skip {
                continue;
            }
            let sid = loop {
                let r = &mut self.quic_rng;
                let candidate = if !others.is_empty() && r.chance(20) {
                    r.pick(&others).clone()
                } else {
                    r.bytes(usize::from(q.server_id_len))
                };
                if !self.vips[i].has_server_id(&candidate) {
                    break candidate;
                }
            };
            self.vips[i].backends[k].server_id = Some(sid);
        }
    }

    /// Health of VIP `i`'s backends (each down one time in seven) and,
    /// three times in ten, one drained to weight 0; one backend up and of
    /// positive weight remains.
    fn draw_health(&mut self, i: usize) {
        let r = &mut self.quic_rng;
        let v = &mut self.vips[i];
        let n = v.backends.len();
        if n == 0 {
            return;
        }
        for b in &mut v.backends {
            b.up = !r.chance(15);
        }
        if n > 1 && r.chance(30) {
            v.backends[r.below(n)].weight = 0;
        }
        if !v.backends.iter().any(|b| b.up && b.weight > 0) {
            let b = &mut v.backends[r.below(n)];
            b.up = true;
            b.weight = b.weight.max(1);
        }
    }
}

/// Shuffles `items` (Fisher-Yates).
fn shuffle<T>(r: &mut Rng, items: &mut [T]) {
    for k in (1..items.len()).rev() {
        items.swap(k, r.below(k + 1));
    }
}

impl Vip {
    /// Remembers a server ID a backend had (the oldest forgotten).
    fn retire_id(&mut self, sid: Vec<u8>) {
        if self.retired_ids.len() >= RETIRED_IDS {
            self.retired_ids.remove(0);
        }
        self.retired_ids.push(sid);
    }
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Settings {
    /// Epoch `n`'s settings: the malformed policy alternates (pass, drop),
    /// the no-DF policy every two epochs, echo replies are off one epoch in
    /// eight, the MTU cycles through values that make some frames too big
    /// (and 0, unchecked; 1,328 is the smallest the configuration accepts); the outer source prefix takes host bits from the
    /// client in two epochs of three.
    pub fn for_epoch(n: u32, rng: &mut Rng) -> Settings {
        const MTUS: [u16; 8] = [1500, 1400, 1500, 0, 1500, 2000, 1328, 1500];
        let prefix = !n.is_multiple_of(3);
        Settings {
            malformed_drop: n % 2 == 1,
            icmp_echo: n % 8 != 5,
            mtu: MTUS[n as usize % MTUS.len()],
            pass_too_big: n % 4 >= 2,
            gue_port: if rng.chance(50) { 7777 } else { 6080 },
            src_v4: Ipv4Addr::new(10, 255, 0, if prefix { 0 } else { 1 }),
            src_v4_host_bits: if prefix { rng.range(1, 16) as u8 } else { 0 },
            src_v6: if prefix {
                "fd00:ff::".parse().expect("literal")
            } else {
                "fd00:ff::1".parse().expect("literal")
            },
            src_v6_host_bits: if prefix { rng.range(1, 32) as u8 } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server-ID lengths routable in the epochs `0..=last` of seed
    /// `seed` (a QUIC VIP has the length and an up backend with an ID).
    fn lengths(seed: u64, last: u32) -> Vec<u8> {
        let mut m = Model::with_seed(seed);
        let mut rng = Rng::new(seed ^ 0x6570_6f63_6873);
        let mut seen = Vec::new();
        loop {
            for v in &m.vips {
                let routable = v.backends.iter().any(|b| b.up && b.server_id.is_some());
                if let (Some(q), true) = (v.quic, routable) {
                    seen.push(q.server_id_len);
                }
            }
            if m.epoch == last {
                break;
            }
            m.next_epoch(&mut rng);
        }
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    #[test]
    fn every_server_id_length_is_routable_within_four_epochs() {
        for seed in 0..200 {
            let all: Vec<u8> = (1..=15).collect();
            assert_eq!(lengths(seed, 3), all, "seed {seed}");
        }
    }

    #[test]
    fn quic_vips_keep_their_ids_unique_and_a_usable_backend() {
        let mut m = Model::with_seed(3);
        let mut rng = Rng::new(3);
        for _ in 0..40 {
            for v in m.vips.iter().filter(|v| v.quic_row) {
                assert!(
                    v.backends.iter().any(|b| b.up && b.weight > 0),
                    "{}",
                    v.name
                );
                let ids: Vec<&Vec<u8>> = v.backends.iter().flat_map(|b| &b.server_id).collect();
                let len = v.quic.map(|q| usize::from(q.server_id_len));
                assert!(ids.iter().all(|s| Some(s.len()) == len), "{}", v.name);
                let mut unique = ids.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), ids.len(), "{}", v.name);
            }
            m.next_epoch(&mut rng);
        }
    }
}

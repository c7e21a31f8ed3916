//! The `lb_xdp` rig: the real program in the kernel, its maps programmed
//! the way `lbd` programs them (reconciler over the dataplane layer),
//! packets run with `BPF_PROG_TEST_RUN` (aya `TestRun`), outputs checked
//! byte by byte against the userspace reference (`lb::predict`: same hash,
//! same tables, same order of decisions).
//!
//! Here: the [`Rig`] and its standard [`Vips`], the addresses and MACs of
//! the balancer's side, [`check_encapsulated`] (a tunnelled frame read
//! independently of the program), [`forward`] and [`port_for_backend`] for
//! the connection-table tests, and the fixture rows ([`Fixture`],
//! [`Expect`]) with [`run_table`], which runs a suite's rows under both
//! malformed-packet policies. The rows themselves live in the suites, by
//! feature.

use std::{collections::BTreeSet, net::IpAddr};

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, NetSlice, SlicedPacket, TransportSlice};
use lb::{
    DatapathSettings, Reconciler,
    config::{BackendConfig, Encap, MalformedPolicy, VipConfig, VipId},
    dataplane::{Dataplane, KernelDataplane, Layout},
    predict::{Via, predict},
};
use lb_common::{
    BackendDef, Counter, CounterValue, CtKey, FlowKey, VipKey, consts::*, counters::Kind,
};

use super::{
    XDP_DROP, XDP_PASS, XDP_TX, ip,
    packets::{Link, l2_len},
    require_root,
};

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];
pub const CLIENT_V4: [u8; 4] = [192, 0, 2, 7];
/// 2001:db8:c00::7.
pub const CLIENT_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0xc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
/// Frames from the client to the balancer.
pub const TO_LB: Link = Link {
    src_mac: CLIENT_MAC,
    dst_mac: LB_MAC,
    client_v4: CLIENT_V4,
    client_v6: CLIENT_V6,
};
pub const SRC_V4: &str = "10.255.0.1";
pub const SRC_V6: &str = "fd00:ff::1";

/// Prime, and larger than one 1024-slot chunk so lookups cross chunks.
pub const M: u32 = 4099;

pub const BACKENDS: [&str; 6] = [
    "10.1.0.1",
    "10.1.0.2",
    "10.1.0.3",
    "fd00:1::1",
    "fd00:1::2",
    "fd00:1::3",
];
pub const V4_BACKENDS: [usize; 3] = [0, 1, 2];
pub const V6_BACKENDS: [usize; 3] = [3, 4, 5];

/// A loaded program whose maps are programmed the way `lbd` programs them:
/// through the reconciler, on top of the dataplane layer.
pub struct Rig {
    pub r: Reconciler<KernelDataplane>,
    pub vips: Vec<VipConfig>,
    /// Backends (VIP, address) marked down.
    down: BTreeSet<(VipId, IpAddr)>,
}

/// The VIPs every rig has.
pub struct Vips {
    pub tcp4: VipKey,
    pub udp4: VipKey,
    pub tcp6: VipKey,
    pub udp6: VipKey,
    pub tcp4_on_v6: VipKey,
    pub udp4_on_v6: VipKey,
    pub gre4: VipKey,
    pub gre6: VipKey,
    pub all_ports4: VipKey,
    pub gue4: VipKey,
    pub gue6: VipKey,
    pub gue4_on_v6: VipKey,
    pub empty4: VipKey,
    pub udp4_no_ct: VipKey,
}

/// GUE destination port of the rig (not the default, to prove it is used).
pub const GUE_TEST_PORT: u16 = 7777;

pub fn settings(malformed: MalformedPolicy) -> DatapathSettings {
    DatapathSettings {
        gateway_mac: GW_MAC,
        outer_source_v4: Some(SRC_V4.parse().expect("literal")),
        outer_source_v6: Some(SRC_V6.parse().expect("literal")),
        malformed,
        gue_port: GUE_TEST_PORT,
        ..Default::default()
    }
}

/// Writes the rig's settings (malformed packets passed) as `change` edits
/// them.
pub fn with_settings(rig: &mut Rig, change: impl FnOnce(&mut DatapathSettings)) {
    let mut s = settings(MalformedPolicy::Pass);
    change(&mut s);
    rig.r.apply_settings(&s).expect("write config");
}

impl Rig {
    pub fn new(ct_buckets: u32) -> Rig {
        require_root("datapath");
        let layout = Layout {
            table_size: M,
            max_vips: 32,
            max_backends: 64,
            ct_buckets,
            table_pool: 0,
            second_chance_vips: 4,
        };
        let dp = KernelDataplane::load(layout).unwrap_or_else(|e| {
            panic!("loading lb_xdp failed (kernel without XDP/BTF support?): {e:#}")
        });
        let mut r = Reconciler::adopt(dp).expect("adopt fresh maps");
        r.apply_settings(&settings(MalformedPolicy::Pass))
            .expect("write config");
        // The random key `lbd` wrote, replaced by a fixed one before any
        // flow is placed, so that expected frames can be worked out.
        assert_ne!(r.dataplane().ct_key().expect("key"), CtKey::default());
        r.dataplane_mut()
            .set_ct_key(&TEST_CT_KEY)
            .expect("write the key");
        Rig {
            r,
            vips: Vec::new(),
            down: BTreeSet::new(),
        }
    }

    pub fn dp(&self) -> &KernelDataplane {
        self.r.dataplane()
    }

    pub fn apply(&mut self) {
        let down = self.down.clone();
        self.r
            .apply(&self.vips, &|id, a| !down.contains(&(*id, *a)))
            .expect("apply");
    }

    pub fn add_vip(
        &mut self,
        vip: &str,
        encap: Encap,
        conntrack: bool,
        backends: &[usize],
    ) -> VipKey {
        let id: VipId = vip.parse().expect("vip");
        let mut v = VipConfig::new(
            id,
            backends
                .iter()
                .map(|&i| BackendConfig::new(ip(BACKENDS[i]), 1))
                .collect(),
        );
        v.encap = encap;
        v.conntrack = conntrack;
        self.vips.push(v);
        self.apply();
        id.key()
    }

    pub fn vip_mut(&mut self, key: &VipKey) -> &mut VipConfig {
        let id = VipId::from_key(key).expect("vip key");
        self.vips
            .iter_mut()
            .find(|v| v.id == id)
            .expect("vip exists")
    }

    /// Sets backend `i`'s weight in `key` (0: out of the table, its flows
    /// still honoured) and swaps the rebuilt table in.
    pub fn set_weight(&mut self, key: &VipKey, i: usize, weight: u32) {
        let addr = ip(BACKENDS[i]);
        let v = self.vip_mut(key);
        match v.backends.iter_mut().find(|b| b.address == addr) {
            Some(b) => b.weight = weight,
            None => v.backends.push(BackendConfig::new(addr, weight)),
        }
        self.apply();
    }

    pub fn remove_backend(&mut self, key: &VipKey, i: usize) {
        let addr = ip(BACKENDS[i]);
        self.vip_mut(key).backends.retain(|b| b.address != addr);
        self.apply();
    }

    /// Marks backend `i` of `key` down (out of the table, flows re-picked).
    pub fn mark_down(&mut self, key: &VipKey, i: usize) {
        let id = VipId::from_key(key).expect("vip key");
        self.down.insert((id, ip(BACKENDS[i])));
        self.apply();
    }

    /// The handle of backend `i` of VIP `key`.
    pub fn handle(&self, key: &VipKey, i: usize) -> u32 {
        let id = VipId::from_key(key).expect("vip key");
        self.r.vips()[&id].backends[&ip(BACKENDS[i])].handle
    }

    pub fn standard_vips(&mut self) -> Vips {
        Vips {
            tcp4: self.add_vip("10.0.0.10:80/tcp", Encap::Ipip, true, &V4_BACKENDS),
            udp4: self.add_vip("10.0.0.10:53/udp", Encap::Ipip, true, &V4_BACKENDS),
            tcp6: self.add_vip("[2001:db8::10]:80/tcp", Encap::Ipip, true, &V6_BACKENDS),
            udp6: self.add_vip("[2001:db8::10]:53/udp", Encap::Ipip, true, &V6_BACKENDS),
            tcp4_on_v6: self.add_vip("10.0.0.20:80/tcp", Encap::Ipip, true, &V6_BACKENDS),
            udp4_on_v6: self.add_vip("10.0.0.20:53/udp", Encap::Ipip, true, &V6_BACKENDS),
            gre4: self.add_vip("10.0.0.30:80/tcp", Encap::Gre, true, &V4_BACKENDS),
            gre6: self.add_vip("[2001:db8::30]:443/tcp", Encap::Gre, true, &V6_BACKENDS),
            all_ports4: self.add_vip("10.0.0.40:*/tcp", Encap::Ipip, true, &V4_BACKENDS),
            gue4: self.add_vip("10.0.0.80:80/tcp", Encap::Gue, true, &V4_BACKENDS),
            gue6: self.add_vip("[2001:db8::80]:80/tcp", Encap::Gue, true, &V6_BACKENDS),
            gue4_on_v6: self.add_vip("10.0.0.80:443/tcp", Encap::Gue, true, &V6_BACKENDS),
            empty4: self.add_vip("10.0.0.50:80/tcp", Encap::Ipip, true, &[]),
            udp4_no_ct: self.add_vip("10.0.0.60:53/udp", Encap::Ipip, false, &V4_BACKENDS),
        }
    }

    pub fn set_malformed_policy(&mut self, drop: bool) {
        let policy = if drop {
            MalformedPolicy::Drop
        } else {
            MalformedPolicy::Pass
        };
        self.r
            .apply_settings(&settings(policy))
            .expect("write config");
    }

    pub fn counters(&self) -> Vec<CounterValue> {
        self.dp().counters().expect("read counters")
    }

    /// Runs one packet through the program: `(action, output frame)`.
    pub fn run(&mut self, input: &[u8]) -> (u32, Vec<u8>) {
        super::test_run(self.r.dataplane_mut().program(), input)
    }

    /// Runs `input` and asserts that exactly one outcome counter moved, by
    /// one packet and the frame's bytes, and that it is `want`. Returns the
    /// action, the output and the events counted on the way.
    pub fn run_counted(&mut self, input: &[u8], want: Counter) -> (u32, Vec<u8>, Vec<Counter>) {
        let before = self.counters();
        let (action, out) = self.run(input);
        let after = self.counters();
        let moved = super::moved(
            &before,
            &after,
            Counter::ALL,
            |c| c as usize,
            input.len(),
            "",
        );
        let (events, outcomes): (Vec<Counter>, Vec<Counter>) =
            moved.into_iter().partition(|c| c.kind() == Kind::Event);
        assert_eq!(outcomes, vec![want], "outcome counters that moved");
        (action, out, events)
    }
}

// ---------------------------------------------------------------- checks

/// The 5-tuple and SYN flag of a frame, read with etherparse (independently
/// of the program's parser).
pub fn flow_of(frame: &[u8]) -> (FlowKey, bool) {
    let p = SlicedPacket::from_ethernet(frame).expect("fixture parses");
    let (src, dst): (IpAddr, IpAddr) = match p.net.expect("ip") {
        NetSlice::Ipv4(s) => (
            s.header().source_addr().into(),
            s.header().destination_addr().into(),
        ),
        NetSlice::Ipv6(s) => (
            s.header().source_addr().into(),
            s.header().destination_addr().into(),
        ),
    };
    match p.transport.expect("tcp or udp") {
        TransportSlice::Tcp(t) => (
            FlowKey::new(src, dst, PROTO_TCP, t.source_port(), t.destination_port()),
            t.syn() && !t.ack(),
        ),
        TransportSlice::Udp(u) => (
            FlowKey::new(src, dst, PROTO_UDP, u.source_port(), u.destination_port()),
            false,
        ),
        _ => panic!("not tcp/udp"),
    }
}

/// The key of the IPv6 connection-table hash in every rig: the golden
/// ratio's multiples, `0x9E3779B9 · (i + 1)` modulo 2³².
pub const TEST_CT_KEY: CtKey = CtKey {
    k: [
        0x9e37_79b9,
        0x3c6e_f372,
        0xdaa6_6d2b,
        0x78dd_e6e4,
        0x1715_609d,
        0xb54c_da56,
        0x5384_540f,
        0xf1bb_cdc8,
        0x8ff3_4781,
        0x2e2a_c13a,
        0xcc62_3af3,
        0x6a99_b4ac,
        0x08d1_2e65,
        0xa708_a81e,
    ],
    legacy_until: 0,
};

/// The GUE source port the balancer picks for `flow`.
pub fn gue_source_port(flow: &FlowKey) -> u16 {
    0xc000 | ((flow.ct_hash(&TEST_CT_KEY) >> 32) as u16 & 0x3fff)
}

/// Asserts that `out` is `input` encapsulated for `backend` per `encap`.
pub fn check_encapsulated(input: &[u8], out: &[u8], backend: &BackendDef, encap: u8) {
    let l2 = l2_len(input);
    let inner_len = match input[l2] >> 4 {
        4 => u16::from_be_bytes([input[l2 + 2], input[l2 + 3]]) as usize,
        6 => 40 + u16::from_be_bytes([input[l2 + 4], input[l2 + 5]]) as usize,
        v => panic!("input IP version {v}"),
    };
    let inner = &input[l2..l2 + inner_len];
    let inner_is_v4 = input[l2] >> 4 == 4;

    // Ethernet: to the gateway, from our own MAC; the VLAN tag is kept.
    assert_eq!(out[0..6], GW_MAC, "destination MAC is the gateway");
    assert_eq!(
        out[6..12],
        input[0..6],
        "source MAC is the frame's original destination"
    );
    if l2 == 18 {
        assert_eq!(out[12..16], input[12..16], "VLAN TPID and TCI kept");
    }
    // The GRE or GUE (UDP) header between the outer and the inner packet.
    let tunnel_len = match encap {
        ENCAP_GRE => 4,
        ENCAP_GUE => 8,
        _ => 0,
    };
    let next = match encap {
        ENCAP_GRE => PROTO_GRE,
        ENCAP_GUE => PROTO_UDP,
        _ if inner_is_v4 => PROTO_IPIP,
        _ => PROTO_IPV6,
    };
    let outer_len = check_outer_ip(out, l2, backend, next, tunnel_len + inner_len);
    let tunnel = &out[l2 + outer_len..l2 + outer_len + tunnel_len];
    match encap {
        ENCAP_GRE => check_gre(tunnel, inner_is_v4),
        ENCAP_GUE => check_gue(tunnel, input, inner_len),
        _ => {}
    }
    let start = l2 + outer_len + tunnel_len;
    assert_eq!(
        &out[start..start + inner_len],
        inner,
        "inner packet byte-identical"
    );
    assert_eq!(
        out.len(),
        input.len() + outer_len + tunnel_len,
        "frame grew by exactly the tunnel headers"
    );
}

/// Asserts that the outer IP header of `out` (at `l2`) goes from the
/// balancer to `backend` carrying `next`, with `payload_len` bytes after
/// it; returns its length.
fn check_outer_ip(
    out: &[u8],
    l2: usize,
    backend: &BackendDef,
    next: u8,
    payload_len: usize,
) -> usize {
    match backend.ip().expect("backend address") {
        IpAddr::V4(dst) => {
            assert_eq!(out[l2 - 2..l2], [0x08, 0x00], "outer ethertype IPv4");
            let h = Ipv4HeaderSlice::from_slice(&out[l2..]).expect("outer IPv4 header");
            assert_eq!(h.ihl(), 5);
            assert_eq!(h.destination_addr(), dst);
            assert_eq!(IpAddr::V4(h.source_addr()), ip(SRC_V4));
            assert_eq!(h.protocol().0, next);
            assert_eq!(h.ttl(), OUTER_TTL);
            assert!(h.dont_fragment(), "outer DF set");
            assert!(!h.more_fragments());
            assert_eq!(h.total_len() as usize, 20 + payload_len);
            let header = h.to_header();
            assert_eq!(
                header.header_checksum,
                header.calc_header_checksum(),
                "outer IPv4 checksum"
            );
            20
        }
        IpAddr::V6(dst) => {
            assert_eq!(out[l2 - 2..l2], [0x86, 0xdd], "outer ethertype IPv6");
            let h = Ipv6HeaderSlice::from_slice(&out[l2..]).expect("outer IPv6 header");
            assert_eq!(h.destination_addr(), dst);
            assert_eq!(IpAddr::V6(h.source_addr()), ip(SRC_V6));
            assert_eq!(h.next_header().0, next);
            assert_eq!(h.hop_limit(), OUTER_TTL);
            assert_eq!(h.payload_length() as usize, payload_len);
            40
        }
    }
}

/// Asserts that `g` is the GRE header the balancer writes.
fn check_gre(g: &[u8], inner_is_v4: bool) {
    let proto: [u8; 2] = if inner_is_v4 {
        [0x08, 0x00]
    } else {
        [0x86, 0xdd]
    };
    assert_eq!(g[0..2], [0, 0], "GRE flags and version");
    assert_eq!(g[2..4], proto, "GRE protocol");
}

/// Asserts that `u` is the GUE (UDP) header the balancer writes for
/// `input`, whose IP packet is `inner_len` bytes.
fn check_gue(u: &[u8], input: &[u8], inner_len: usize) {
    // The source port of a TCP or UDP packet comes from its flow hash
    // (ICMP errors use the quoted flow's: checked by their test).
    if let Some(TransportSlice::Tcp(_) | TransportSlice::Udp(_)) =
        SlicedPacket::from_ethernet(input)
            .ok()
            .and_then(|p| p.transport)
    {
        let (flow, _) = flow_of(input);
        assert_eq!(
            u16::from_be_bytes([u[0], u[1]]),
            gue_source_port(&flow),
            "GUE source port from the flow hash"
        );
    }
    assert_eq!(u16::from_be_bytes([u[2], u[3]]), GUE_TEST_PORT, "GUE port");
    assert_eq!(
        u16::from_be_bytes([u[4], u[5]]) as usize,
        8 + inner_len,
        "UDP length"
    );
    assert_eq!(u[6..8], [0, 0], "no UDP checksum");
}

/// The backend index (in `BACKENDS`) an encapsulated frame is sent to.
pub fn tunnel_dst(out: &[u8]) -> usize {
    let dst: IpAddr = if out[12..14] == [0x08, 0x00] {
        Ipv4HeaderSlice::from_slice(&out[14..])
            .expect("outer")
            .destination_addr()
            .into()
    } else {
        Ipv6HeaderSlice::from_slice(&out[14..])
            .expect("outer")
            .destination_addr()
            .into()
    };
    BACKENDS
        .iter()
        .position(|b| ip(b) == dst)
        .expect("a known backend")
}

/// Runs `packet`, asserts it was forwarded, and returns the backend index
/// the output is addressed to and how it was chosen.
pub fn forward(rig: &mut Rig, packet: &[u8]) -> (usize, Counter) {
    let before = rig.counters();
    let (action, out) = rig.run(packet);
    assert_eq!(action, XDP_TX, "forwarded");
    let after = rig.counters();
    let counter = [
        Counter::FwdConntrack,
        Counter::FwdMaglev,
        Counter::FwdHandshake,
    ]
    .into_iter()
    .find(|c| after[*c as usize].packets > before[*c as usize].packets)
    .expect("a forward counter moved");
    (tunnel_dst(&out), counter)
}

/// A source port whose flow Maglev sends to backend `want` of `vip` (by
/// asking the reference).
pub fn port_for_backend(rig: &Rig, dst: &str, dport: u16, want: usize) -> u16 {
    (1024..u16::MAX)
        .find(|&sport| {
            let flow = FlowKey::new(IpAddr::from(CLIENT_V4), ip(dst), PROTO_TCP, sport, dport);
            let p = predict(rig.dp(), &flow, true)
                .expect("predict")
                .expect("a vip");
            p.backend.and_then(|b| b.ip()) == Some(ip(BACKENDS[want]))
        })
        .expect("some port maps to the backend")
}

// ---------------------------------------------------------------- fixtures

pub enum Expect {
    /// Encapsulated to the backend `lb::predict` names, via the given path.
    Forward(VipKey, Via, Counter),
    /// Passed unchanged with this counter.
    Pass(Counter),
    /// Dropped with this counter (and counted for the VIP).
    Drop(VipKey, Counter),
    /// Counted; passed or dropped by the malformed-packet policy.
    Malformed(Counter),
    /// Dropped with this counter, not attributed to a VIP.
    Dropped(Counter),
}

pub struct Fixture {
    pub name: &'static str,
    pub packet: Vec<u8>,
    pub expect: Expect,
}

impl Fixture {
    pub fn new(name: &'static str, packet: Vec<u8>, expect: Expect) -> Fixture {
        Fixture {
            name,
            packet,
            expect,
        }
    }
}

/// Runs a suite's rows on a rig with the standard VIPs, in order: every row
/// with malformed packets passed, then the rows that depend on the policy
/// (`Expect::Malformed`) again with them dropped. Rows run in the order
/// given, on one rig: a row may rely on the connection-table entry an
/// earlier row made.
pub fn run_table(fixtures: fn(&Vips) -> Vec<Fixture>) {
    let mut rig = Rig::new(1 << 12);
    let vips = rig.standard_vips();
    for drop_malformed in [false, true] {
        rig.set_malformed_policy(drop_malformed);
        for fx in fixtures(&vips) {
            // The second policy pass only re-runs the policy-dependent rows.
            if drop_malformed && !matches!(fx.expect, Expect::Malformed(_)) {
                continue;
            }
            run_fixture(&mut rig, fx, drop_malformed);
        }
    }
}

/// Runs one row and checks what its `Expect` says.
fn run_fixture(rig: &mut Rig, fx: Fixture, drop_malformed: bool) {
    let name = fx.name;
    match fx.expect {
        Expect::Forward(vip, via, counter) => {
            check_forward(rig, name, &fx.packet, vip, via, counter)
        }
        Expect::Pass(counter) => {
            let (action, out, _) = rig.run_counted(&fx.packet, counter);
            assert_eq!(action, XDP_PASS, "{name}: action");
            assert_eq!(out, fx.packet, "{name}: passed untouched");
        }
        Expect::Drop(vip, counter) => {
            let meta = rig.dp().vip(&vip).expect("vip").expect("vip exists");
            let before = rig.dp().vip_stats(meta.id()).expect("vip stats").packets;
            let (action, _, _) = rig.run_counted(&fx.packet, counter);
            assert_eq!(action, XDP_DROP, "{name}: action");
            let after = rig.dp().vip_stats(meta.id()).expect("vip stats").packets;
            assert_eq!(after, before + 1, "{name}: counted for the VIP");
        }
        Expect::Dropped(counter) => {
            let (action, _, _) = rig.run_counted(&fx.packet, counter);
            assert_eq!(action, XDP_DROP, "{name}: action");
        }
        Expect::Malformed(counter) => {
            let (action, out, _) = rig.run_counted(&fx.packet, counter);
            let want = if drop_malformed { XDP_DROP } else { XDP_PASS };
            assert_eq!(
                action, want,
                "{name}: action (drop policy {drop_malformed})"
            );
            if !drop_malformed {
                assert_eq!(out, fx.packet, "{name}: passed untouched");
            }
        }
    }
}

/// An `Expect::Forward` row: the reference's VIP, path and backend, the
/// encapsulation, the VIP's and the backend's stats.
fn check_forward(
    rig: &mut Rig,
    name: &str,
    packet: &[u8],
    vip: VipKey,
    via: Via,
    counter: Counter,
) {
    let (flow, syn) = flow_of(packet);
    let want = predict(rig.dp(), &flow, syn)
        .expect("predict")
        .unwrap_or_else(|| panic!("{name}: reference finds no VIP"));
    assert_eq!(want.vip, vip, "{name}: reference VIP");
    assert_eq!(want.via, via, "{name}: reference path");
    let backend = want.backend.unwrap_or_else(|| panic!("{name}: no backend"));
    let meta = rig.dp().vip(&vip).expect("vip").expect("vip exists");
    let vip_id = lb::config::VipId::from_key(&vip).expect("VIP id");
    let total = |rig: &Rig| {
        rig.r
            .vip_counters(&vip_id)
            .expect("counters")
            .expect("VIP")
            .0
    };
    let vip_before = total(rig);
    let own_before = rig.dp().vip_stats(meta.id()).expect("vip stats");
    let be_index = backend.handle & BACKEND_INDEX_MASK;
    let be_before = rig.dp().backend_stats(be_index).expect("backend stats");

    let (action, out, events) = rig.run_counted(packet, counter);
    assert_eq!(action, XDP_TX, "{name}: action");
    assert!(events.is_empty(), "{name}: events {events:?}");
    check_encapsulated(packet, &out, &backend, meta.encap);

    let len = packet.len() as u64;
    let vip_after = total(rig);
    let be_after = rig.dp().backend_stats(be_index).expect("backend stats");
    assert_eq!(
        (
            vip_after.packets - vip_before.packets,
            vip_after.bytes - vip_before.bytes
        ),
        (1, len),
        "{name}: VIP stats"
    );
    assert_eq!(
        rig.dp().vip_stats(meta.id()).expect("vip stats"),
        own_before,
        "{name}: a forwarded packet is counted for its backend only"
    );
    assert_eq!(
        (
            be_after.packets - be_before.packets,
            be_after.bytes - be_before.bytes
        ),
        (1, len),
        "{name}: backend stats"
    );
}

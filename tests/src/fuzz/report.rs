//! What a run saw: frames per class (generator × outcome counter), frames
//! `BPF_PROG_TEST_RUN` refused or ran as multi-buffer, the shapes of the
//! outputs (tunnel kinds, replies, tags), the QUIC datagrams by aim and by
//! the oracle's reading × outcome, the coverage the generators aim at and
//! what of it is missing, and the report of a violation with a hex dump
//! of its smallest reproducer.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use super::{
    check::Violation,
    generate::Gen,
    oracle::quic::{self, Reading},
};
use lb::config::Encap;
use lb_common::Counter;

/// Outcome label of frames the kernel refused (`EINVAL`).
pub const REFUSED: &str = "einval (refused, under 14 bytes)";
/// Outcome label of frames larger than one buffer (not judged).
pub const MULTI_BUFFER: &str = "multi_buffer (not judged)";

#[derive(Default)]
pub struct Stats {
    pub classes: BTreeMap<(Gen, &'static str), u64>,
    pub features: BTreeMap<String, u64>,
    pub frames: u64,
    pub refused: u64,
    pub multi_buffer: u64,
    /// Known deviations of lb's: count and the smallest frame seen.
    pub deviations: BTreeMap<&'static str, (u64, Vec<u8>)>,
    /// QUIC datagrams generated, by what the generator aimed at.
    pub quic_aims: BTreeMap<&'static str, u64>,
    /// Frames judged with a QUIC reading, by reading and outcome.
    pub quic: BTreeMap<(&'static str, &'static str), u64>,
}

impl Stats {
    pub fn class(&mut self, source: Gen, outcome: &'static str) {
        self.frames += 1;
        *self.classes.entry((source, outcome)).or_default() += 1;
        if outcome == REFUSED {
            self.refused += 1;
        } else if outcome == MULTI_BUFFER {
            self.multi_buffer += 1;
        }
    }

    pub fn deviation(&mut self, what: &'static str, frame: &[u8]) {
        let e = self.deviations.entry(what).or_insert((0, frame.to_vec()));
        e.0 += 1;
        if frame.len() < e.1.len() {
            e.1 = frame.to_vec();
        }
    }

    pub fn quic_aim(&mut self, aim: &'static str) {
        *self.quic_aims.entry(aim).or_default() += 1;
    }

    /// A judged frame the oracle read as a datagram to a QUIC VIP.
    pub fn quic(&mut self, q: &Reading, counter: Counter) {
        *self.quic.entry((q.why, counter.name())).or_default() += 1;
        if counter == Counter::FwdQuicCid {
            self.feature(quic_length_feature(q.server_id_len));
        }
    }

    pub fn feature(&mut self, name: impl Into<String>) {
        *self.features.entry(name.into()).or_default() += 1;
    }

    fn count(&self, source: Gen, outcome: &str) -> u64 {
        self.classes
            .iter()
            .filter(|((g, o), _)| *g == source && *o == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    /// Classes and features the generators aim at that never occurred.
    pub fn missing(&self) -> Vec<String> {
        let mut missing: Vec<String> = AIMS
            .iter()
            .flat_map(|(source, outcomes)| outcomes.iter().map(move |o| (*source, *o)))
            .filter(|(source, o)| self.count(*source, o) == 0)
            .map(|(source, o)| format!("{source} × {o}"))
            .collect();
        missing.extend(
            features_aimed()
                .into_iter()
                .filter(|f| !self.features.contains_key(f)),
        );
        missing.extend(
            quic::READINGS
                .iter()
                .filter(|r| !self.quic.keys().any(|(why, _)| why == *r))
                .map(|r| format!("QUIC: {r}")),
        );
        missing.extend(
            QUIC_AIMS
                .iter()
                .filter(|k| !self.quic.contains_key(k))
                .map(|(r, o)| format!("QUIC: {r} × {o}")),
        );
        missing
    }
}

/// What each generator must produce in a run of 200,000 frames.
const AIMS: &[(Gen, &[&str])] = &[
    (
        Gen::Vip4,
        &[
            "fwd_maglev_new_flow",
            "fwd_conntrack_hit",
            "fwd_maglev_no_conntrack",
            "drop_no_backend",
        ],
    ),
    (
        Gen::Vip6,
        &[
            "fwd_maglev_new_flow",
            "fwd_conntrack_hit",
            "drop_no_backend",
            "reply_packet_too_big",
        ],
    ),
    (Gen::NearVip, &["pass_not_vip", "pass_not_tcp_udp"]),
    (Gen::Options4, &["fwd_maglev_new_flow"]),
    (
        Gen::Ext6,
        &[
            "fwd_maglev_new_flow",
            "pass_not_vip",
            "malformed_ipv6_ext_chain_too_long",
            "malformed_ipv6_ext_too_long",
            "malformed_ipv6_ext_header",
        ],
    ),
    (
        Gen::Frag4,
        &[
            "fwd_fragment_3tuple",
            "drop_fragment",
            "pass_fragment_not_vip",
        ],
    ),
    (
        Gen::Frag6,
        &[
            "fwd_fragment_3tuple",
            "drop_fragment",
            "pass_fragment_not_vip",
        ],
    ),
    (
        Gen::IcmpError4,
        &["fwd_icmp_error", "pass_icmp_other", "drop_no_backend"],
    ),
    (
        Gen::IcmpError6,
        &[
            "fwd_icmp_error",
            "pass_icmp_other",
            "drop_icmp_ptb_below_1280",
            "drop_no_backend",
        ],
    ),
    (Gen::Echo, &["reply_icmp_echo", "pass_icmp_other"]),
    (Gen::NotIp, &["pass_not_ip"]),
    (
        Gen::Vlan,
        &[
            "fwd_maglev_new_flow",
            "reply_icmp_echo",
            "fwd_icmp_error",
            "malformed_vlan",
        ],
    ),
    (Gen::Qinq, &["malformed_vlan"]),
    (
        Gen::Malformed,
        &[
            "malformed_ipv4_truncated",
            "malformed_ipv4_bad_header",
            "malformed_ipv4_bad_length",
            "malformed_ipv6_truncated",
            "malformed_ipv6_bad_header",
            "malformed_ipv6_bad_length",
            "malformed_l4_truncated",
        ],
    ),
    (
        Gen::TooBig,
        &[
            "reply_frag_needed",
            "reply_packet_too_big",
            "drop_too_big_no_df",
            "pass_too_big_no_df",
        ],
    ),
    (
        Gen::Mutated,
        &[
            "fwd_maglev_new_flow",
            "malformed_l4_truncated",
            "pass_not_ip",
        ],
    ),
    (Gen::Random, &[REFUSED]),
    (Gen::Huge, &[MULTI_BUFFER, "fwd_maglev_new_flow"]),
    (
        Gen::Quic,
        &[
            "fwd_quic_cid",
            "fwd_maglev_new_flow",
            "fwd_conntrack_hit",
            "fwd_maglev_no_conntrack",
        ],
    ),
];

/// QUIC readings × outcomes every run must show: routed by the server
/// ID (up or draining), a table hit for an ID that names no server,
/// hashed with and without the connection table. (An up server's ID is
/// never a table hit: invariant 7.)
const QUIC_AIMS: &[(&str, &str)] = &[
    (quic::UP, "fwd_quic_cid"),
    (quic::DRAINING, "fwd_quic_cid"),
    (quic::UNKNOWN, "fwd_conntrack_hit"),
    (quic::DOWN, "fwd_maglev_new_flow"),
    (quic::UNKNOWN, "fwd_maglev_new_flow"),
    (quic::CUT, "fwd_maglev_new_flow"),
    (quic::LONG_V1, "fwd_maglev_new_flow"),
    (quic::LONG_V1, "fwd_maglev_no_conntrack"),
];

/// Output shapes every run must show.
fn features_aimed() -> Vec<String> {
    let mut f: Vec<String> = [Encap::Ipip, Encap::Gre, Encap::Gue]
        .into_iter()
        .flat_map(|e| {
            ["4in4", "6in6", "4in6", "6in4"]
                .into_iter()
                .map(move |s| tunnel_feature(e, s))
        })
        .collect();
    f.extend(
        [
            "forwarded with a VLAN tag",
            "forwarded with Ethernet padding",
            "reply with a VLAN tag",
            "ICMP error forwarded, IPv4",
            "ICMP error forwarded, IPv6",
            "fragment forwarded, IPv4",
            "fragment forwarded, IPv6",
            "malformed passed (policy pass)",
            "malformed dropped (policy drop)",
        ]
        .map(String::from),
    );
    f.extend(["4in4", "6in6"].map(second_chance_feature));
    f.extend((1..=15).map(quic_length_feature));
    f
}

/// A datagram routed by a server ID of `len` octets.
pub fn quic_length_feature(len: u8) -> String {
    format!("QUIC routed by a server ID of {len:>2} octets")
}

pub fn tunnel_feature(encap: Encap, shape: &str) -> String {
    format!("tunnel {encap:?} {shape}")
}

/// A second-chance packet (GUE variant 0 with lb's list).
pub fn second_chance_feature(shape: &str) -> String {
    format!("second-chance list {shape}")
}

/// A violation, where it happened, and its reproducers.
pub struct Found {
    pub index: u64,
    pub epoch: u32,
    pub source: Gen,
    pub violation: Violation,
    pub why: String,
    pub frame: Vec<u8>,
    pub shrunk: Vec<u8>,
    /// The shrunk frame's own violation and oracle reading (`None` if it
    /// did not reproduce when run again).
    pub shrunk_reading: Option<(Violation, String)>,
}

/// Everything a run reports.
pub struct Report {
    pub seed: u64,
    pub stats: Stats,
    pub elapsed: Duration,
    pub epochs: u32,
    pub linear_max: usize,
    pub found: Option<Found>,
}

impl Report {
    pub fn frames_per_second(&self) -> f64 {
        self.stats.frames as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn text(&self) -> String {
        let s = &self.stats;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "seed {}: {} frames in {:.1} s ({:.0} frames/s), {} epochs",
            self.seed,
            s.frames,
            self.elapsed.as_secs_f64(),
            self.frames_per_second(),
            self.epochs
        );
        let _ = writeln!(t, "\nframes per class (generator × outcome):");
        for ((source, outcome), n) in &s.classes {
            let _ = writeln!(t, "  {:<14} {:<36} {n:>10}", source.name(), outcome);
        }
        let _ = writeln!(t, "\noutcomes over all generators:");
        let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
        for ((_, o), n) in &s.classes {
            *totals.entry(o).or_default() += n;
        }
        for (o, n) in totals {
            let _ = writeln!(t, "  {o:<51} {n:>10}");
        }
        let _ = writeln!(t, "\noutput shapes:");
        for (f, n) in &s.features {
            let _ = writeln!(t, "  {f:<51} {n:>10}");
        }
        self.quic_text(&mut t);
        let _ = writeln!(
            t,
            "\nrefused by BPF_PROG_TEST_RUN (EINVAL, under 14 bytes): {}\nmulti-buffer (over {} bytes, not judged): {}",
            s.refused, self.linear_max, s.multi_buffer
        );
        for (what, (n, frame)) in &s.deviations {
            let _ = writeln!(t, "\n{what}: {n} frames; the smallest:\n{}", hexdump(frame));
        }
        if let Some(f) = &self.found {
            t.push_str(&f.text(self.seed));
        }
        t
    }
}

impl Report {
    /// The QUIC sections: datagrams by aim, judged frames by reading and
    /// outcome.
    fn quic_text(&self, t: &mut String) {
        let s = &self.stats;
        let aimed: u64 = s.quic_aims.values().sum();
        let _ = writeln!(t, "\nQUIC datagrams generated, by aim ({aimed}):");
        for (aim, n) in &s.quic_aims {
            let _ = writeln!(t, "  {aim:<62} {n:>10}");
        }
        let judged: u64 = s.quic.values().sum();
        let _ = writeln!(
            t,
            "\nframes judged as datagrams to a QUIC VIP, by reading × outcome ({judged}):"
        );
        for ((why, outcome), n) in &s.quic {
            let _ = writeln!(t, "  {why:<58} {outcome:<24} {n:>10}");
        }
    }
}

impl Found {
    pub fn text(&self, seed: u64) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nVIOLATION at frame {} (epoch {}, generator {}), seed {seed}",
            self.index, self.epoch, self.source
        );
        let _ = writeln!(t, "  {}", self.violation);
        let _ = writeln!(t, "  oracle: {}", self.why);
        let _ = writeln!(
            t,
            "  replay: cargo xtask fuzz --seed {seed} --packets {}",
            self.index + 1
        );
        let _ = writeln!(t, "\nsmallest reproducer ({} bytes):", self.shrunk.len());
        if let Some((v, why)) = &self.shrunk_reading {
            let _ = writeln!(t, "  {v}\n  oracle: {why}");
        }
        let _ = writeln!(t, "{}", hexdump(&self.shrunk));
        let _ = writeln!(
            t,
            "frame as generated ({} bytes):\n{}",
            self.frame.len(),
            hexdump(&self.frame)
        );
        t
    }
}

/// Offset, 16 bytes in hex per line.
pub fn hexdump(bytes: &[u8]) -> String {
    let mut t = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let _ = write!(t, "  {:04x} ", i * 16);
        for b in line {
            let _ = write!(t, " {b:02x}");
        }
        t.push('\n');
    }
    t
}

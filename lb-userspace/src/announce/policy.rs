//! The announce policy: which VIP addresses `lbd` asks its announcers to
//! announce, and why each VIP is or is not announced (`lbctl bgp`).
//!
//! An address is announced while the XDP program is attached, the node is
//! serving (not drained with `lbctl node drain`, not shutting down), and at
//! least one of the VIPs on that address (an address may carry several:
//! ports, protocols) has at least `min_healthy` usable backends. Usable
//! means in the table now: active or in slow start, with a weight above 0
//! (a backend that is down, draining or weighted 0 does not count, and
//! neither does a down backend that panic mode put back in the table),
//! and, if it is probed, confirmed by its probes: a backend awaiting its
//! first verdict (after `lbd` starts, or when it is added) forwards but
//! does not count, so a VIP whose backends are all dead is never announced,
//! not even for the first probe interval.
//!
//! Pure logic over what it is given: per VIP, its backends' counts
//! ([`VipCounts`], which the lifecycle computes); no I/O, no announcer,
//! no knowledge of backend states. `lbd` recomputes it after every change
//! of the dataplane and hands [`Decision::addresses`] to every announcer.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use crate::config::VipId;

/// What the policy needs of one VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipCounts {
    pub id: VipId,
    pub min_healthy: u32,
    /// Backends configured.
    pub backends: u32,
    /// Backends in the table now, confirmed by their probes (or unprobed).
    pub usable: u32,
    /// Backends in the table awaiting their first probe verdict.
    pub awaiting: u32,
}

/// What the node as a whole is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Announcing what the backends' health allows.
    Serving,
    /// `lbctl node drain`: everything withdrawn, forwarding goes on.
    Drained,
    /// SIGTERM/SIGINT: everything withdrawn, waiting out `shutdown_grace`.
    Stopping,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeState::Serving => "serving",
            NodeState::Drained => "drained",
            NodeState::Stopping => "stopping",
        })
    }
}

/// One VIP's verdict, for `lbctl bgp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipVerdict {
    pub vip: VipId,
    /// Backends in the table now (active or slow start, weight > 0).
    pub usable: u32,
    pub backends: u32,
    pub min_healthy: u32,
    /// The VIP's address is announced (because of this VIP or another one
    /// on the same address).
    pub announced: bool,
    /// Why, in words.
    pub reason: String,
}

/// The policy's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The addresses to announce (host routes).
    pub addresses: BTreeSet<IpAddr>,
    /// One verdict per VIP, in VIP order.
    pub vips: Vec<VipVerdict>,
}

/// Applies the policy to `vips` (each VIP's counts, in VIP order).
pub fn decide(vips: &[VipCounts], attached: bool, node: NodeState) -> Decision {
    // The first VIP (in VIP order) that qualifies each address.
    let mut qualified: BTreeMap<IpAddr, VipId> = BTreeMap::new();
    for v in vips {
        if v.usable >= v.min_healthy {
            qualified.entry(v.id.addr).or_insert(v.id);
        }
    }
    let serving = attached && node == NodeState::Serving;
    let addresses = if serving {
        qualified.keys().copied().collect()
    } else {
        BTreeSet::new()
    };
    let vips = vips
        .iter()
        .map(|v| VipVerdict {
            vip: v.id,
            usable: v.usable,
            backends: v.backends,
            min_healthy: v.min_healthy,
            announced: addresses.contains(&v.id.addr),
            reason: reason(v, attached, node, qualified.get(&v.id.addr)),
        })
        .collect();
    Decision { addresses, vips }
}

/// Why `v` is announced or not, in words; `by`: the VIP that qualifies
/// its address, if one does.
fn reason(v: &VipCounts, attached: bool, node: NodeState, by: Option<&VipId>) -> String {
    let waiting = if v.awaiting > 0 {
        format!(" ({} more awaiting their first probe verdict)", v.awaiting)
    } else {
        String::new()
    };
    let health = format!(
        "{} of {} backends usable{waiting}, min_healthy {}",
        v.usable, v.backends, v.min_healthy
    );
    match (attached, node, by) {
        (false, _, _) => "withheld: the XDP program is not attached".to_string(),
        (true, NodeState::Drained, _) => {
            "withdrawn: the node is drained (`lbctl node undrain` ends it)".to_string()
        }
        (true, NodeState::Stopping, _) => "withdrawn: lbd is shutting down".to_string(),
        (true, NodeState::Serving, None) => format!("withheld: {health}"),
        (true, NodeState::Serving, Some(by)) if *by == v.id || v.usable >= v.min_healthy => health,
        (true, NodeState::Serving, Some(by)) => {
            format!("announced for {by}; this VIP has {health}")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::{
        config::{BackendConfig, VipConfig},
        health::{ProbeResult, Tracker},
        lifecycle::{Lifecycle, VipLife},
    };

    /// The policy over the lifecycle's counts of `lives`, as lbd calls it.
    fn decide(
        vips: &[VipConfig],
        lives: &BTreeMap<VipId, VipLife>,
        attached: bool,
        node: NodeState,
    ) -> Decision {
        let lc = Lifecycle {
            vips: lives.clone(),
        };
        super::decide(&lc.counts(vips), attached, node)
    }

    fn vip(id: &str, backends: &[(&str, u32)], min_healthy: u32) -> VipConfig {
        let mut v = VipConfig::new(
            id.parse().expect("VIP"),
            backends
                .iter()
                .map(|(a, w)| BackendConfig::new(a.parse().expect("address"), *w))
                .collect(),
        );
        v.min_healthy = min_healthy;
        v
    }

    /// Lifecycle states for `vips`, with the backends in `down` failed by
    /// their probes.
    fn lives(vips: &[VipConfig], down: &[(&str, &str)]) -> BTreeMap<VipId, VipLife> {
        let mut lc = Lifecycle::default();
        let now = Instant::now();
        lc.sync(vips, &BTreeSet::new(), now, true);
        for (id, addr) in down {
            let (id, addr): (VipId, IpAddr) = (id.parse().unwrap(), addr.parse().unwrap());
            let b = lc
                .vips
                .get_mut(&id)
                .and_then(|v| v.backends.get_mut(&addr))
                .expect("backend");
            let mut t = Tracker::new(1, 1);
            t.record(ProbeResult {
                ok: false,
                latency_us: 0,
                detail: "refused".into(),
            });
            b.health = Some(t);
        }
        lc.plan(vips, now);
        lc.vips
    }

    fn addrs(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn a_vip_is_announced_while_it_has_min_healthy_usable_backends() {
        let vips = [
            vip("10.0.0.1:80/tcp", &[("10.1.0.1", 1), ("10.1.0.2", 1)], 2),
            vip("10.0.0.2:80/tcp", &[("10.1.0.1", 1), ("10.1.0.2", 1)], 1),
        ];
        let all_up = decide(&vips, &lives(&vips, &[]), true, NodeState::Serving);
        assert_eq!(all_up.addresses, addrs(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(
            all_up.vips[0].reason,
            "2 of 2 backends usable, min_healthy 2"
        );

        let one_down = [
            ("10.0.0.1:80/tcp", "10.1.0.2"),
            ("10.0.0.2:80/tcp", "10.1.0.2"),
        ];
        let d = decide(&vips, &lives(&vips, &one_down), true, NodeState::Serving);
        assert_eq!(d.addresses, addrs(&["10.0.0.2"]));
        assert_eq!((d.vips[0].usable, d.vips[0].announced), (1, false));
        assert_eq!(
            d.vips[0].reason,
            "withheld: 1 of 2 backends usable, min_healthy 2"
        );
        assert!(d.vips[1].announced);
    }

    #[test]
    fn panic_mode_does_not_count_down_backends_as_usable() {
        // Both down: panic mode puts them back in the table, but the VIP
        // has nothing healthy to offer, so it is withdrawn.
        let vips = [vip(
            "10.0.0.1:80/tcp",
            &[("10.1.0.1", 1), ("10.1.0.2", 1)],
            1,
        )];
        let down = [
            ("10.0.0.1:80/tcp", "10.1.0.1"),
            ("10.0.0.1:80/tcp", "10.1.0.2"),
        ];
        let lives = lives(&vips, &down);
        assert!(lives.values().all(|l| l.panic), "panic mode expected");
        let d = decide(&vips, &lives, true, NodeState::Serving);
        assert!(d.addresses.is_empty());
        assert_eq!(d.vips[0].usable, 0);
    }

    #[test]
    fn weight_zero_and_drained_backends_are_not_usable() {
        let vips = [vip(
            "10.0.0.1:80/tcp",
            &[("10.1.0.1", 0), ("10.1.0.2", 1)],
            1,
        )];
        let mut lc = Lifecycle::default();
        let now = Instant::now();
        let drained = BTreeSet::from([(vips[0].id, "10.1.0.2".parse().unwrap())]);
        lc.sync(&vips, &drained, now, true);
        lc.plan(&vips, now);
        let d = decide(&vips, &lc.vips, true, NodeState::Serving);
        assert_eq!((d.vips[0].usable, d.addresses.len()), (0, 0));
    }

    #[test]
    fn one_qualified_vip_announces_an_address_shared_with_others() {
        let vips = [
            vip("10.0.0.1:53/udp", &[("10.1.0.3", 1)], 1),
            vip("10.0.0.1:80/tcp", &[("10.1.0.1", 1)], 1),
        ];
        let d = decide(
            &vips,
            &lives(&vips, &[("10.0.0.1:80/tcp", "10.1.0.1")]),
            true,
            NodeState::Serving,
        );
        assert_eq!(d.addresses, addrs(&["10.0.0.1"]));
        assert!(d.vips.iter().all(|v| v.announced));
        assert_eq!(
            d.vips[1].reason,
            "announced for 10.0.0.1:53/udp; this VIP has 0 of 1 backends usable, min_healthy 1"
        );
    }

    #[test]
    fn nothing_is_announced_unless_attached_and_serving() {
        let vips = [vip("10.0.0.1:80/tcp", &[("10.1.0.1", 1)], 1)];
        let l = lives(&vips, &[]);
        for (attached, node, why) in [
            (false, NodeState::Serving, "not attached"),
            (true, NodeState::Drained, "node is drained"),
            (true, NodeState::Stopping, "shutting down"),
        ] {
            let d = decide(&vips, &l, attached, node);
            assert!(d.addresses.is_empty(), "{why}");
            assert!(!d.vips[0].announced);
            assert!(d.vips[0].reason.contains(why), "{:?}", d.vips[0].reason);
        }
    }

    #[test]
    fn a_probed_backend_counts_only_after_its_first_verdict() {
        let mut v = vip("10.0.0.1:80/tcp", &[("10.1.0.1", 1), ("10.1.0.2", 1)], 1);
        v.health_check =
            Some(serde_yaml::from_str("interval: 1s\ntimeout: 500ms").expect("health check"));
        let vips = [v];
        let mut lc = Lifecycle::default();
        let now = Instant::now();
        lc.sync(&vips, &BTreeSet::new(), now, true);
        lc.plan(&vips, now);
        // Both are in the table (up until probes say otherwise), neither
        // has been probed: nothing to announce yet.
        let d = decide(&vips, &lc.vips, true, NodeState::Serving);
        assert!(d.addresses.is_empty());
        assert_eq!(
            d.vips[0].reason,
            "withheld: 0 of 2 backends usable (2 more awaiting their first probe verdict), min_healthy 1"
        );
        let probe = |ok| ProbeResult {
            ok,
            latency_us: 10,
            detail: String::new(),
        };
        let (id, a, b) = (
            vips[0].id,
            "10.1.0.1".parse().unwrap(),
            "10.1.0.2".parse().unwrap(),
        );
        // A failed first probe is no verdict yet (fall 3); an answer is.
        lc.record_probe(&id, &a, probe(false), now);
        assert!(
            decide(&vips, &lc.vips, true, NodeState::Serving)
                .addresses
                .is_empty()
        );
        lc.record_probe(&id, &b, probe(true), now);
        let d = decide(&vips, &lc.vips, true, NodeState::Serving);
        assert_eq!(d.addresses, addrs(&["10.0.0.1"]));
        assert_eq!(d.vips[0].usable, 1);
        // A changed check keeps the verdict.
        lc.reset_health(&id, &b, 2, 2);
        assert_eq!(
            decide(&vips, &lc.vips, true, NodeState::Serving).vips[0].usable,
            1
        );
    }

    #[test]
    fn min_healthy_zero_announces_without_backends() {
        let vips = [vip("10.0.0.1:80/tcp", &[], 0)];
        let d = decide(&vips, &lives(&vips, &[]), true, NodeState::Serving);
        assert_eq!(d.addresses, addrs(&["10.0.0.1"]));
    }
}

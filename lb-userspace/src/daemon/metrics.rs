//! The daemon's side of the metrics: once a second (the tick) the state
//! the metrics report is copied into a [`Snapshot`]; events (table builds,
//! reloads, probes) are recorded where they happen.

use std::collections::BTreeSet;

use lb_common::{SynCounts, counters::Counter};

use super::{Daemon, views::state_wire};
use crate::{
    announce::SessionState,
    dataplane::Dataplane,
    metrics::{BackendSample, CounterSample, PeerSample, Snapshot, VipSample},
    reconcile::ApplyReport,
};

impl<D: Dataplane> Daemon<D> {
    /// After an apply: table builds, and the digests of what is published,
    /// computed again only for the VIPs whose entry changed (a table is
    /// only ever published by a new entry: another half, region or size).
    pub(super) fn record_builds(&mut self, report: &ApplyReport) {
        for d in &report.table_builds {
            self.metrics.table_builds.inc();
            self.metrics.table_build_duration.observe(d.as_secs_f64());
        }
        let old = std::mem::take(&mut self.table_digests);
        for (id, state) in self.reconciler.vips() {
            let digest = match old.get(id) {
                Some((meta, digest)) if *meta == state.meta => digest.clone(),
                _ => match self.reconciler.table_addresses(id) {
                    Ok(Some(slots)) => crate::digest::table(&slots),
                    _ => continue,
                },
            };
            self.table_digests.insert(*id, (state.meta, digest));
        }
    }

    /// Copies the state the metrics report (the tick).
    pub fn refresh_metrics(&mut self) {
        let conntrack = self.scan_table_if_due();
        let snapshot = Snapshot {
            counters: self.counter_samples(),
            vips: self.vip_samples(),
            peers: self.peer_samples(),
            addresses: self.address_samples(),
            conntrack,
            revision: self.revision,
            config_digest: self.running_digest(),
            auto_reverts: self.auto_reverts,
        };
        self.metrics.set_snapshot(snapshot);
    }

    fn counter_samples(&self) -> Vec<CounterSample> {
        let values = self.samples_latest_counters();
        Counter::ALL
            .iter()
            .filter(|c| c.kind() != lb_common::counters::Kind::Retired)
            .filter_map(|c| {
                let v = values.get(*c as usize)?;
                Some(CounterSample {
                    name: c.name(),
                    kind: super::views::kind_name(c.kind()),
                    packets: v.packets,
                    bytes: v.bytes,
                })
            })
            .collect()
    }

    fn vip_samples(&self) -> Vec<VipSample> {
        // Announced as it is: wanted, and held by a peer.
        let carried = self.carried_addresses(&self.announcers.peer_rows());
        let announced: BTreeSet<_> = self
            .announcers
            .decision
            .vips
            .iter()
            .filter(|v| v.announced && carried.contains(&v.vip.addr))
            .map(|v| v.vip)
            .collect();
        let qualifies: BTreeSet<_> = self
            .announcers
            .decision
            .vips
            .iter()
            .filter(|v| v.usable >= v.min_healthy)
            .map(|v| v.vip)
            .collect();
        let stats = self.samples_latest_vips();
        let syns = self.samples_latest_syns();
        self.effective()
            .iter()
            .map(|vip| {
                let life = self.lifecycle.vips.get(&vip.id);
                let (packets, bytes, by_backend) = stats
                    .get(&vip.id)
                    .map(|(v, b)| (v.packets, v.bytes, b.clone()))
                    .unwrap_or_default();
                VipSample {
                    vip: vip.id.to_string(),
                    packets,
                    bytes,
                    panic: life.is_some_and(|l| l.panic),
                    announced: self.has_announcers().then(|| announced.contains(&vip.id)),
                    qualifies: qualifies.contains(&vip.id),
                    table_digest: self
                        .table_digests
                        .get(&vip.id)
                        .map(|(_, d)| d.clone())
                        .unwrap_or_default(),
                    backends: vip
                        .backends
                        .iter()
                        .map(|b| {
                            let c = by_backend.get(&b.address).copied().unwrap_or_default();
                            let l = life.and_then(|l| l.backends.get(&b.address));
                            let state = l.map_or("down", |l| state_wire(l.state).name());
                            let syns = self.backend_syns(syns, &vip.id, &b.address);
                            BackendSample {
                                address: b.address.to_string(),
                                packets: c.packets,
                                bytes: c.bytes,
                                state,
                                syns: syns.syns,
                                syn_retransmits: syns.retransmits,
                                live_flows: l.and_then(|l| l.live_flows),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// One of `vip`'s backends' SYN counts among `all` (by backend index;
    /// zero when it has no handle or the object has no such map).
    fn backend_syns(
        &self,
        all: &[SynCounts],
        vip: &crate::config::VipId,
        addr: &std::net::IpAddr,
    ) -> SynCounts {
        self.reconciler
            .vips()
            .get(vip)
            .and_then(|v| v.backends.get(addr))
            .and_then(|b| {
                let index = b.handle & lb_common::consts::BACKEND_INDEX_MASK;
                all.get(index as usize).copied()
            })
            .unwrap_or_default()
    }

    fn peer_samples(&self) -> Vec<PeerSample> {
        self.announcers
            .peer_rows()
            .into_iter()
            .map(|p| PeerSample {
                established: p.state == SessionState::Established,
                uptime_secs: p.uptime_secs,
                updates_sent: p.updates_sent,
                updates_received: p.updates_received,
                updates_ignored: p.updates_ignored,
                graceful_restart: p
                    .graceful_restart
                    .as_ref()
                    .is_some_and(|g| g.offered && g.peer_supports),
                routes: ["ipv4", "ipv6"]
                    .into_iter()
                    .filter(|f| p.families.iter().any(|g| g == f))
                    .map(|f| {
                        let v4 = f == "ipv4";
                        let n = p
                            .carried
                            .as_ref()
                            .map_or(0, |c| c.iter().filter(|a| a.is_ipv4() == v4).count());
                        (f, n)
                    })
                    .collect(),
                bfd: p.bfd,
                peer: p.peer,
            })
            .collect()
    }

    /// Each VIP address and whether a router has it; none without an
    /// announcer (nothing can be known of the routes then).
    fn address_samples(&self) -> Vec<(String, bool)> {
        if !self.has_announcers() {
            return Vec::new();
        }
        let announced = &self.carried_addresses(&self.announcers.peer_rows());
        let addresses: BTreeSet<_> = self.effective().iter().map(|v| v.id.addr).collect();
        addresses
            .into_iter()
            .map(|a| (a.to_string(), announced.contains(&a)))
            .collect()
    }
}

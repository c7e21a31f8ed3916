//! The periodic read-only scan of the connection table: its occupancy
//! (a metric) and each backend's live flows ([`crate::liveflows`]), which
//! `lbctl health` and `vip list` show and which end a drain: a draining
//! backend with none left is `drained`. Every 15 ticks; every 2 while a
//! backend drains.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use lb_common::FlowEntry;

use super::Daemon;
use crate::{dataplane::Dataplane, liveflows};

/// Ticks between two scans (a scan reads every bucket through a read-only
/// mapping: tens of milliseconds for 2M buckets).
const SCAN_EVERY_TICKS: u32 = 15;
/// Ticks between two scans while a backend drains.
const DRAIN_SCAN_EVERY_TICKS: u32 = 2;

impl<D: Dataplane> Daemon<D> {
    /// The table's occupancy (ways in use, in all), scanning it when due.
    pub(super) fn scan_table_if_due(&mut self) -> Option<(u64, u64)> {
        self.ticks_since_scan = self.ticks_since_scan.saturating_add(1);
        let every = if self.draining_handles().is_empty() {
            SCAN_EVERY_TICKS
        } else {
            DRAIN_SCAN_EVERY_TICKS
        };
        if self.ticks_since_scan >= every {
            self.ticks_since_scan = 0;
            self.metrics_conntrack = self.scan_table();
        }
        self.metrics_conntrack
    }

    /// The handles of the backends being drained whose entries are still
    /// honoured (a drain past its `drain_timeout` is over: not watched).
    fn draining_handles(&self) -> BTreeSet<u32> {
        let kernel = self.reconciler.vips();
        self.lifecycle
            .vips
            .iter()
            .flat_map(|(id, v)| {
                v.backends
                    .iter()
                    .filter(|(_, l)| l.drained_since.is_some())
                    .filter_map(move |(addr, _)| kernel.get(id)?.backends.get(addr))
                    .filter(|b| b.usable)
                    .map(|b| b.handle)
            })
            .collect()
    }

    /// Scans the table: occupancy, and live flows into the lifecycle.
    /// Without the kernel's clock, or when the scan fails, the live flows
    /// and the remembered idle entries stay as they were (a count judged
    /// against no clock could call a live flow idle).
    fn scan_table(&mut self) -> Option<(u64, u64)> {
        let jiffies = liveflows::jiffies();
        if let Some(j) = jiffies {
            self.live_clock.observe(Instant::now(), j);
        }
        let watched = self.draining_handles();
        let window = self.live_clock.window_ticks();
        let mut scan = jiffies.map(|j| {
            self.live_flows
                .scan(liveflows::tick_of(j), window, &watched)
        });
        let (mut used, mut all) = (0u64, 0u64);
        let scanned = self.reconciler.dataplane().scan_flows(&mut |bucket| {
            all += bucket.entries.len() as u64;
            used += bucket
                .entries
                .iter()
                .filter(|e| **e != FlowEntry::EMPTY)
                .count() as u64;
            if let Some(scan) = scan.as_mut() {
                scan.bucket(bucket);
            }
        });
        scanned.ok()?;
        if let Some(scan) = scan {
            let counts = scan.finish();
            self.set_live_flows(&counts);
        }
        Some((used, all))
    }

    /// Each backend's live flows, from the counts per handle.
    fn set_live_flows(&mut self, counts: &BTreeMap<u32, u64>) {
        for (id, kernel) in self.reconciler.vips() {
            let Some(life) = self.lifecycle.vips.get_mut(id) else {
                continue;
            };
            for (addr, b) in &kernel.backends {
                if let Some(l) = life.backends.get_mut(addr) {
                    l.live_flows = Some(counts.get(&b.handle).copied().unwrap_or(0));
                }
            }
        }
    }
}

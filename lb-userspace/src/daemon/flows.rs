//! The read-only scans of the connection table. Periodic: its occupancy
//! (a metric) and each backend's live flows ([`crate::liveflows`]), which
//! `lbctl health` and `vip list` show and which end a drain: a draining
//! backend with none left is `drained`. Every 15 ticks; every 2 while a
//! backend drains. On request: `lbctl conns`, its entries as rows
//! ([`crate::conns`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Instant,
};

use lb_common::{FlowEntry, consts::CT_STAMP_CLASS_SHIFT};

use super::{Daemon, Result, refused};
use crate::{
    api::{ConnRow, Conns, ErrorKind},
    config::{Prefix, VipId},
    conns::{self, Found, Target},
    dataplane::{BucketReader, Dataplane},
    liveflows,
};

/// Ticks between two scans (a scan reads every bucket through a read-only
/// mapping: tens of milliseconds for 2M buckets).
const SCAN_EVERY_TICKS: u32 = 15;
/// Ticks between two scans while a backend drains.
const DRAIN_SCAN_EVERY_TICKS: u32 = 2;

impl<D: Dataplane> Daemon<D> {
    /// The table's occupancy (ways in use, in all), scanning it when due.
    pub(super) fn scan_table_if_due(&mut self) -> Option<(u64, u64)> {
        self.ticks_since_scan = self.ticks_since_scan.saturating_add(1);
        // The tick rate, learnt in the first seconds (idle times need it).
        if self.live_clock.hz().is_none() {
            self.read_jiffies();
        }
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
        let jiffies = self.read_jiffies();
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
        if let (Some(scan), Some(j)) = (scan, jiffies) {
            let counts = scan.finish();
            // Whole ticks, not the stamps' 14 bits: a drain may outlast
            // their wrap.
            let tick = j >> lb_common::consts::CT_STAMP_TICK_SHIFT;
            let recent = self.note_drain_traffic(tick, u64::from(window), &watched);
            self.set_scanned(&counts, &recent);
        }
        Some((used, all))
    }

    /// The draining backends (of `watched`) that were sent packets within
    /// `window` ticks of `tick`: each one's forwarded packets are compared
    /// with the count at the tick they last grew. A backend first seen
    /// draining counts as sent packets now (when it last was is unknown).
    fn note_drain_traffic(
        &mut self,
        tick: u64,
        window: u64,
        watched: &BTreeSet<u32>,
    ) -> BTreeSet<u32> {
        self.drain_traffic.retain(|h, _| watched.contains(h));
        let mut recent = BTreeSet::new();
        for &handle in watched {
            let index = handle & lb_common::consts::BACKEND_INDEX_MASK;
            let Ok(now) = self.reconciler.dataplane().backend_stats(index) else {
                recent.insert(handle);
                continue;
            };
            let (packets, at) = self
                .drain_traffic
                .entry(handle)
                .or_insert((now.packets, tick));
            if now.packets != *packets {
                (*packets, *at) = (now.packets, tick);
            }
            if tick.saturating_sub(*at) <= window {
                recent.insert(handle);
            }
        }
        recent
    }

    /// Each backend's live flows, from the counts per handle, and whether
    /// a draining backend of a QUIC VIP was sent packets lately (`recent`,
    /// by handle).
    fn set_scanned(&mut self, counts: &BTreeMap<u32, u64>, recent: &BTreeSet<u32>) {
        let quic: BTreeSet<VipId> = self
            .effective()
            .iter()
            .filter(|v| v.quic.is_some())
            .map(|v| v.id)
            .collect();
        for (id, kernel) in self.reconciler.vips() {
            let Some(life) = self.lifecycle.vips.get_mut(id) else {
                continue;
            };
            for (addr, b) in &kernel.backends {
                if let Some(l) = life.backends.get_mut(addr) {
                    l.live_flows = Some(counts.get(&b.handle).copied().unwrap_or(0));
                    l.quic_traffic = quic.contains(id) && recent.contains(&b.handle);
                }
            }
        }
    }
}

/// The backends a `conns` query asks about: handle → (VIP, address).
type Handles = BTreeMap<u32, (VipId, IpAddr)>;

impl<D: Dataplane> Daemon<D> {
    /// `lbctl conns`: the connection table's entries of `vip` (all VIPs
    /// if none), of `backend`, and, with `client`, the flows from that
    /// address or prefix with their ports; the first `limit` rows.
    pub fn conns(
        &mut self,
        vip: Option<VipId>,
        backend: Option<IpAddr>,
        client: Option<&str>,
        limit: usize,
    ) -> Result<Conns> {
        if limit == 0 || limit > conns::MAX_LIMIT {
            return Err(refused(
                ErrorKind::BadRequest,
                format!("--limit must be 1 to {}", conns::MAX_LIMIT),
            ));
        }
        let handles = self.conn_handles(vip, backend)?;
        let jiffies = self.read_jiffies();
        let started = Instant::now();
        let (found, searched, skipped) = match client {
            None => {
                let buckets = self.reconciler.layout().ct_buckets;
                let keep = |h: u32| handles.contains_key(&h);
                let found = self.read_flows(|read| conns::scan(read, buckets, &keep, limit))?;
                (found, format!("{buckets} buckets"), Vec::new())
            }
            Some(client) => self.conns_of_client(&handles, client, limit)?,
        };
        let now = jiffies.map(liveflows::tick_of);
        let rows = found
            .ways
            .iter()
            .filter_map(|w| {
                let (vip, backend) = *handles.get(&w.entry.handle())?;
                let class = (w.stamp >> CT_STAMP_CLASS_SHIFT) as u8;
                Some(ConnRow {
                    vip,
                    backend,
                    client: w.client,
                    idle_secs: now
                        .and_then(|n| self.live_clock.secs_of(liveflows::age_ticks(n, w.stamp))),
                    class,
                    confirmed: class >= 1,
                    bucket: w.bucket,
                    way: w.way,
                })
            })
            .collect();
        Ok(Conns {
            rows,
            matched: found.matched,
            searched,
            elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
            skipped,
        })
    }

    /// The handles of `vip`'s backends (every VIP's if none), `backend`
    /// only if given; either named and absent is refused.
    fn conn_handles(&self, vip: Option<VipId>, backend: Option<IpAddr>) -> Result<Handles> {
        let vips = self.reconciler.vips();
        if let Some(v) = vip
            && !vips.contains_key(&v)
        {
            return Err(refused(ErrorKind::NotFound, format!("no VIP {v}")));
        }
        let handles: Handles = vips
            .iter()
            .filter(|(id, _)| vip.is_none_or(|v| v == **id))
            .flat_map(|(id, v)| v.backends.iter().map(move |(a, b)| (b.handle, (*id, *a))))
            .filter(|(_, (_, a))| backend.is_none_or(|b| b == *a))
            .collect();
        if let Some(b) = backend
            && handles.is_empty()
        {
            let of = vip.map(|v| format!(" of VIP {v}")).unwrap_or_default();
            return Err(refused(ErrorKind::NotFound, format!("no backend {b}{of}")));
        }
        Ok(handles)
    }

    /// The flows from `client` to the VIPs of `handles`: every source
    /// port hashed (see [`conns::clients`]); all-ports VIPs are skipped.
    fn conns_of_client(
        &self,
        handles: &Handles,
        client: &str,
        limit: usize,
    ) -> Result<(Found, String, Vec<String>)> {
        let prefix = Prefix::address_or_prefix(client)
            .map_err(|e| refused(ErrorKind::BadRequest, format!("--client: {e}")))?;
        let mut targets: BTreeMap<VipId, Target> = BTreeMap::new();
        let mut skipped = BTreeSet::new();
        for (handle, (id, _)) in handles {
            if id.addr.is_ipv4() != prefix.addr.is_ipv4() {
                continue;
            }
            if id.port == 0 {
                skipped.insert(format!("{id}: all ports (every destination port too)"));
                continue;
            }
            let target = targets.entry(*id).or_insert_with(|| Target {
                addr: id.addr,
                port: id.port,
                proto: id.proto.number(),
                handles: BTreeSet::new(),
            });
            target.handles.insert(*handle);
        }
        let targets: Vec<Target> = targets.into_values().collect();
        if targets.is_empty() {
            let why = if skipped.is_empty() {
                "no VIP of the client's address family to search"
            } else {
                "only all-ports VIPs of the client's address family, which cannot be searched"
            };
            return Err(refused(
                ErrorKind::BadRequest,
                format!("--client {prefix}: {why}"),
            ));
        }
        let dp = self.reconciler.dataplane();
        let cfg = dp.config()?;
        let at = conns::Placement {
            mask: cfg.ct_mask,
            seed: cfg.ct_seed,
            key: dp.ct_key()?,
        };
        let found = self
            .read_flows(|read| conns::clients(read, &at, &targets, &prefix, limit))?
            .map_err(|e| refused(ErrorKind::BadRequest, e))?;
        let searched = format!(
            "{} tuples ({prefix}, every source port, to {} VIP(s))",
            conns::tuples(&prefix, targets.len()),
            targets.len()
        );
        Ok((found, searched, skipped.into_iter().collect()))
    }

    /// Runs `f` with a reader of the table's buckets.
    fn read_flows<T>(&self, f: impl FnOnce(BucketReader<'_>) -> T) -> Result<T> {
        let (mut f, mut out) = (Some(f), None);
        self.reconciler.dataplane().with_flow_reader(&mut |read| {
            out = f.take().map(|f| f(read));
        })?;
        out.ok_or_else(|| refused(ErrorKind::Internal, "the connection table was not read"))
    }

    /// The kernel's `jiffies`, also taught to the clock that learns HZ.
    fn read_jiffies(&mut self) -> Option<u64> {
        let jiffies = self.jiffies.read();
        if let Some(j) = jiffies {
            self.live_clock.observe(Instant::now(), j);
        }
        jiffies
    }
}

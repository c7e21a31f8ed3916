//! Prometheus metrics: the families `lbd` exports and the HTTP endpoint
//! that serves them (`metrics:` in the configuration; off by default).
//!
//! Two kinds of source. Events are recorded as they happen, into metrics
//! of the `prometheus` crate held here (probe durations, table builds,
//! reconcile errors, reloads). State is copied once a second by the daemon
//! into a [`Snapshot`] (datapath counters read from the maps, backend
//! states, BGP sessions, announcements, table digests, connection-table
//! occupancy), which a [`Collector`] turns into metric families at scrape
//! time. A scrape never waits for the daemon's loop, and the text is
//! encoded by the crate (Prometheus text format 0.0.4, which `promtool
//! check metrics` lints; `prometheus-client` writes only OpenMetrics,
//! which it cannot), never by hand.
//!
//! Names follow Prometheus' conventions: `lb_` prefix, base units
//! (seconds, bytes), `_total` on counters, `_info` on info gauges, states
//! as a label with 0/1.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus::{
    Encoder as _, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, Opts, Registry, TextEncoder,
    core::{Collector, Desc},
    proto::{self, MetricFamily, MetricType},
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::Semaphore,
};
use tracing::{debug, warn};

/// The version and commit `lbd` was built from.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("LB_GIT_COMMIT");

/// A datapath counter as read from the maps.
#[derive(Clone, Debug, Default)]
pub struct CounterSample {
    pub name: &'static str,
    /// `pass`, `forward`, `drop`, `malformed` or `event`.
    pub kind: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct BackendSample {
    pub address: String,
    pub packets: u64,
    pub bytes: u64,
    /// `active`, `slow-start`, `draining`, `drained`, `down` or `ejected`.
    pub state: &'static str,
    /// The datapath's SYNs to it and retransmitted ones (passive health),
    /// since its handle was allocated.
    pub syns: u64,
    pub syn_retransmits: u64,
    /// Its live flows at the last scan ([`crate::liveflows`]).
    pub live_flows: Option<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct VipSample {
    pub vip: String,
    pub packets: u64,
    pub bytes: u64,
    pub panic: bool,
    /// Its address is announced and a router has it (maybe qualified by
    /// another VIP on the same address).
    /// A router has its address; `None` with no announcer configured
    /// (the routes are set up outside `lbd`): not exported.
    pub announced: Option<bool>,
    /// Enough of its own backends are usable (`min_healthy`) to announce
    /// its address.
    pub qualifies: bool,
    pub table_digest: String,
    pub backends: Vec<BackendSample>,
}

#[derive(Clone, Debug, Default)]
pub struct PeerSample {
    pub peer: String,
    pub established: bool,
    pub uptime_secs: u64,
    pub updates_sent: u64,
    pub updates_received: u64,
    pub updates_ignored: u64,
    /// The peer's BFD session, if configured.
    pub bfd: Option<crate::bfd::BfdStatus>,
    /// Graceful restart negotiated (both sides sent the capability).
    pub graceful_restart: bool,
    /// Per address family the session negotiated, the routes the peer
    /// has from us.
    pub routes: Vec<(&'static str, usize)>,
}

/// The daemon's state as of its last tick.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub counters: Vec<CounterSample>,
    pub vips: Vec<VipSample>,
    pub peers: Vec<PeerSample>,
    /// VIP addresses and whether each is announced.
    pub addresses: Vec<(String, bool)>,
    /// Connection-table ways in use and in all, as of the last scan.
    pub conntrack: Option<(u64, u64)>,
    pub revision: u64,
    pub config_digest: String,
    pub auto_reverts: u64,
}

/// Every metric `lbd` exports.
pub struct Metrics {
    registry: Registry,
    /// Each probe's duration, by `vip` and `backend`.
    pub probe_duration: HistogramVec,
    pub table_builds: IntCounter,
    pub table_build_duration: Histogram,
    pub reconcile_errors: IntCounter,
    /// Reloads by `result` (`ok`, `failed`).
    reloads: IntCounterVec,
    reload_last_success: Gauge,
    /// The tier in etcd (`source.etcd`; all 0 without one).
    pub tier_configured: IntGauge,
    pub tier_connected: IntGauge,
    pub tier_seen: IntGauge,
    pub tier_applied: IntGauge,
    pub tier_refused: IntGauge,
    /// A staged rollout's steps on this balancer, by `step` (`apply`,
    /// `pass`, `fail`, `revert`, `promote`).
    pub tier_rollout_steps: IntCounterVec,
    snapshot: Arc<Mutex<Snapshot>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The tier's gauges: configured, connected, desired revision seen and
/// applied, newest refused.
fn tier_gauges() -> [IntGauge; 5] {
    let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
    [
        gauge(
            "lb_tier_configured",
            "1 when the VIPs come from a tier's desired state in etcd (source.etcd).",
        ),
        gauge(
            "lb_tier_connected",
            "1 while this balancer follows etcd; 0 when cut off (it keeps what it applied).",
        ),
        gauge(
            "lb_tier_desired_revision_seen",
            "The etcd revision of the newest desired state seen.",
        ),
        gauge(
            "lb_tier_desired_revision_applied",
            "The etcd revision of the desired state this balancer runs.",
        ),
        gauge(
            "lb_tier_desired_refused",
            "1 when the newest desired state was refused here (lbctl tier status says why).",
        ),
    ]
}

/// A staged rollout's steps, by step.
fn rollout_steps() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "lb_tier_rollout_steps_total",
            "Steps of staged rollouts taken by this balancer, by step (apply, pass, fail, revert, promote).",
        ),
        &["step"],
    )
    .expect("valid metric")
}

/// `factor^i × start` for `count` buckets.
fn buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count).unwrap_or_default()
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let probe_duration = HistogramVec::new(
            HistogramOpts::new(
                "lb_backend_probe_duration_seconds",
                "Health probe duration, from connect to verdict.",
            )
            .buckets(buckets(0.0001, 4.0, 9)),
            &["vip", "backend"],
        )
        .expect("valid metric");
        let table_builds = IntCounter::new(
            "lb_table_builds_total",
            "Maglev tables built (one per VIP each time the dataplane is programmed).",
        )
        .expect("valid metric");
        let table_build_duration = Histogram::with_opts(
            HistogramOpts::new(
                "lb_table_build_duration_seconds",
                "Time to build one Maglev table.",
            )
            .buckets(buckets(0.0001, 4.0, 8)),
        )
        .expect("valid metric");
        let reconcile_errors = IntCounter::new(
            "lb_reconcile_errors_total",
            "Failed attempts to program the dataplane's maps.",
        )
        .expect("valid metric");
        let reloads = IntCounterVec::new(
            Opts::new(
                "lb_reloads_total",
                "Reloads of the configuration file, by result.",
            ),
            &["result"],
        )
        .expect("valid metric");
        let reload_last_success = Gauge::new(
            "lb_reload_last_success_timestamp_seconds",
            "When the configuration file was last applied (Unix time; 0: not since start).",
        )
        .expect("valid metric");
        let tier = tier_gauges();
        let tier_rollout_steps = rollout_steps();
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let collectors: [Box<dyn Collector>; 8] = [
            Box::new(probe_duration.clone()),
            Box::new(table_builds.clone()),
            Box::new(table_build_duration.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(reloads.clone()),
            Box::new(reload_last_success.clone()),
            Box::new(tier_rollout_steps.clone()),
            Box::new(SnapshotCollector::new(snapshot.clone())),
        ];
        let tiered = tier
            .iter()
            .map(|g| Box::new(g.clone()) as Box<dyn Collector>);
        for c in collectors.into_iter().chain(tiered) {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            probe_duration,
            table_builds,
            table_build_duration,
            reconcile_errors,
            reloads,
            reload_last_success,
            tier_configured: tier[0].clone(),
            tier_connected: tier[1].clone(),
            tier_seen: tier[2].clone(),
            tier_applied: tier[3].clone(),
            tier_refused: tier[4].clone(),
            tier_rollout_steps,
            snapshot,
        }
    }

    /// Replaces the state the next scrape reports.
    pub fn set_snapshot(&self, snapshot: Snapshot) {
        if let Ok(mut s) = self.snapshot.lock() {
            *s = snapshot;
        }
    }

    /// A reload's result.
    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads.with_label_values(&[result]).inc();
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.reload_last_success.set(now);
        }
    }

    /// The exposition text (Prometheus text format 0.0.4).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The families the snapshot fills: (name, help, kind, labels).
const FAMILIES: &[(&str, &str, MetricType, &[&str])] = &[
    (
        "lb_datapath_packets_total",
        "Packets by outcome counter (one outcome per packet) and events.",
        MetricType::COUNTER,
        &["counter", "kind"],
    ),
    (
        "lb_datapath_bytes_total",
        "Bytes by outcome counter and events.",
        MetricType::COUNTER,
        &["counter", "kind"],
    ),
    (
        "lb_conntrack_entries",
        "Connection-table ways in use (scanned every 15 s).",
        MetricType::GAUGE,
        &[],
    ),
    (
        "lb_conntrack_capacity",
        "Connection-table ways in all.",
        MetricType::GAUGE,
        &[],
    ),
    (
        "lb_conntrack_evictions_total",
        "Connection-table entries replaced by a new flow (which: any, or established ones).",
        MetricType::COUNTER,
        &["which"],
    ),
    (
        "lb_vip_packets_total",
        "Packets forwarded (or dropped for want of a backend) per VIP.",
        MetricType::COUNTER,
        &["vip"],
    ),
    (
        "lb_vip_bytes_total",
        "Bytes per VIP.",
        MetricType::COUNTER,
        &["vip"],
    ),
    (
        "lb_vip_panic",
        "1 while too few backends are healthy and the table uses all of them.",
        MetricType::GAUGE,
        &["vip"],
    ),
    (
        "lb_vip_announced",
        "1 while the VIP's address is announced and a router has it; another VIP on the same address may be what qualifies it (lb_vip_qualifies).",
        MetricType::GAUGE,
        &["vip"],
    ),
    (
        "lb_vip_qualifies",
        "1 while at least min_healthy of the VIP's own backends are usable, so that it would have its address announced on its own; announced without it, its traffic finds too few backends.",
        MetricType::GAUGE,
        &["vip"],
    ),
    (
        "lb_vip_table_info",
        "The digest of the VIP's published table: equal on balancers that send every flow to the same backend.",
        MetricType::GAUGE,
        &["vip", "digest"],
    ),
    (
        "lb_address_announced",
        "1 while the VIP address is announced to the routers.",
        MetricType::GAUGE,
        &["address"],
    ),
    (
        "lb_backend_packets_total",
        "Packets forwarded per backend.",
        MetricType::COUNTER,
        &["vip", "backend"],
    ),
    (
        "lb_backend_bytes_total",
        "Bytes forwarded per backend.",
        MetricType::COUNTER,
        &["vip", "backend"],
    ),
    (
        "lb_backend_syns_total",
        "SYNs sent to the backend, retransmissions included (passive health).",
        MetricType::COUNTER,
        &["vip", "backend"],
    ),
    (
        "lb_backend_syn_retransmits_total",
        "Retransmitted SYNs of flows whose earlier SYN went to the backend unanswered.",
        MetricType::COUNTER,
        &["vip", "backend"],
    ),
    (
        "lb_backend_state",
        "1 for the backend's state (active, slow-start, draining, drained, down, ejected), 0 for the others.",
        MetricType::GAUGE,
        &["vip", "backend", "state"],
    ),
    (
        "lb_backend_live_flows",
        "The backend's connection-table entries seen within the last 10 s (absent until the table is first scanned).",
        MetricType::GAUGE,
        &["vip", "backend"],
    ),
    (
        "lb_bgp_session_established",
        "1 while the session with the peer is Established.",
        MetricType::GAUGE,
        &["peer"],
    ),
    (
        "lb_bgp_routes_announced",
        "Routes the peer has from us now, per address family the session negotiated.",
        MetricType::GAUGE,
        &["peer", "family"],
    ),
    (
        "lb_bgp_session_uptime_seconds",
        "Time since the session reached Established (0 when it is not).",
        MetricType::GAUGE,
        &["peer"],
    ),
    (
        "lb_bgp_updates_sent_total",
        "BGP UPDATEs sent to the peer.",
        MetricType::COUNTER,
        &["peer"],
    ),
    (
        "lb_bgp_updates_received_total",
        "BGP UPDATEs received from the peer.",
        MetricType::COUNTER,
        &["peer"],
    ),
    (
        "lb_bgp_updates_ignored_total",
        "Received UPDATEs with malformed attributes, ignored (RFC 7606).",
        MetricType::COUNTER,
        &["peer"],
    ),
    (
        "lb_bgp_graceful_restart",
        "1 while graceful restart is negotiated with the peer (both sent the capability).",
        MetricType::GAUGE,
        &["peer"],
    ),
    (
        "lb_bfd_session_up",
        "1 while the peer's BFD session is Up (answered by the datapath).",
        MetricType::GAUGE,
        &["peer"],
    ),
    (
        "lb_bfd_state_seconds",
        "Time since lbd saw the BFD session's state change (absent: not since lbd started).",
        MetricType::GAUGE,
        &["peer"],
    ),
    (
        "lb_bfd_transitions_up_total",
        "Times the peer's BFD session came Up.",
        MetricType::COUNTER,
        &["peer"],
    ),
    (
        "lb_bfd_packets_total",
        "The peer's BFD control packets: received (valid), replied, invalid (failed a check of RFC 5880/5881), too_soon (not answered: the transmit limit).",
        MetricType::COUNTER,
        &["peer", "what"],
    ),
    (
        "lb_build_info",
        "The lbd build: version and git commit.",
        MetricType::GAUGE,
        &["version", "commit"],
    ),
    (
        "lb_config_info",
        "The effective configuration's digest (equal across a tier running one configuration) and revision.",
        MetricType::GAUGE,
        &["digest", "revision"],
    ),
    (
        "lb_config_auto_reverts_total",
        "Changes reverted because they were not confirmed in time or cost an announcement.",
        MetricType::COUNTER,
        &[],
    ),
];

/// The snapshot as metric families, at scrape time.
struct SnapshotCollector {
    snapshot: Arc<Mutex<Snapshot>>,
    descs: Vec<Desc>,
}

impl SnapshotCollector {
    fn new(snapshot: Arc<Mutex<Snapshot>>) -> Self {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, _, labels)| {
                let labels = labels.iter().map(ToString::to_string).collect();
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    labels,
                    Default::default(),
                )
                .expect("valid metric")
            })
            .collect();
        Self { snapshot, descs }
    }
}

/// The samples of one family, as they are added.
struct Families(std::collections::BTreeMap<&'static str, Vec<proto::Metric>>);

impl Families {
    fn add(&mut self, name: &'static str, labels: &[(&str, &str)], value: f64) {
        let kind = FAMILIES
            .iter()
            .find(|f| f.0 == name)
            .map_or(MetricType::GAUGE, |f| f.2);
        let mut m = proto::Metric::from_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = proto::LabelPair::default();
                    l.set_name(k.to_string());
                    l.set_value(v.to_string());
                    l
                })
                .collect(),
        );
        if kind == MetricType::COUNTER {
            let mut c = proto::Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = proto::Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.0.entry(name).or_default().push(m);
    }
}

impl Collector for SnapshotCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = match self.snapshot.lock() {
            Ok(s) => s.clone(),
            Err(_) => return Vec::new(),
        };
        let mut f = Families(Default::default());
        add_datapath(&mut f, &s);
        add_vips(&mut f, &s);
        add_bgp(&mut f, &s);
        add_daemon(&mut f, &s);
        FAMILIES
            .iter()
            .filter_map(|(name, help, kind, _)| {
                let metrics = f.0.remove(name)?;
                let mut mf = MetricFamily::default();
                mf.set_name(name.to_string());
                mf.set_help(help.to_string());
                mf.set_field_type(*kind);
                mf.set_metric(metrics);
                Some(mf)
            })
            .collect()
    }
}

fn add_datapath(f: &mut Families, s: &Snapshot) {
    for c in &s.counters {
        let labels = [("counter", c.name), ("kind", c.kind)];
        f.add("lb_datapath_packets_total", &labels, c.packets as f64);
        f.add("lb_datapath_bytes_total", &labels, c.bytes as f64);
    }
    if let Some((used, capacity)) = s.conntrack {
        f.add("lb_conntrack_entries", &[], used as f64);
        f.add("lb_conntrack_capacity", &[], capacity as f64);
    }
    let count = |name: &str| {
        s.counters
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.packets) as f64
    };
    let evictions = "lb_conntrack_evictions_total";
    f.add(evictions, &[("which", "any")], count("ct_evicted"));
    f.add(
        evictions,
        &[("which", "established")],
        count("ct_evicted_established"),
    );
}

const STATES: [&str; 6] = [
    "active",
    "slow-start",
    "draining",
    "drained",
    "down",
    "ejected",
];

fn add_vips(f: &mut Families, s: &Snapshot) {
    for v in &s.vips {
        let vip = [("vip", v.vip.as_str())];
        f.add("lb_vip_packets_total", &vip, v.packets as f64);
        f.add("lb_vip_bytes_total", &vip, v.bytes as f64);
        f.add("lb_vip_panic", &vip, f64::from(u8::from(v.panic)));
        if let Some(on) = v.announced {
            f.add("lb_vip_announced", &vip, f64::from(u8::from(on)));
        }
        f.add("lb_vip_qualifies", &vip, f64::from(u8::from(v.qualifies)));
        let table = [("vip", v.vip.as_str()), ("digest", v.table_digest.as_str())];
        f.add("lb_vip_table_info", &table, 1.0);
        for b in &v.backends {
            let labels = [("vip", v.vip.as_str()), ("backend", b.address.as_str())];
            f.add("lb_backend_packets_total", &labels, b.packets as f64);
            f.add("lb_backend_bytes_total", &labels, b.bytes as f64);
            f.add("lb_backend_syns_total", &labels, b.syns as f64);
            let retransmits = "lb_backend_syn_retransmits_total";
            f.add(retransmits, &labels, b.syn_retransmits as f64);
            if let Some(n) = b.live_flows {
                f.add("lb_backend_live_flows", &labels, n as f64);
            }
            for state in STATES {
                let l = [labels[0], labels[1], ("state", state)];
                f.add(
                    "lb_backend_state",
                    &l,
                    f64::from(u8::from(b.state == state)),
                );
            }
        }
    }
    for (address, on) in &s.addresses {
        let l = [("address", address.as_str())];
        f.add("lb_address_announced", &l, f64::from(u8::from(*on)));
    }
}

fn add_bgp(f: &mut Families, s: &Snapshot) {
    for p in &s.peers {
        let peer = [("peer", p.peer.as_str())];
        let up = f64::from(u8::from(p.established));
        f.add("lb_bgp_session_established", &peer, up);
        for (family, n) in &p.routes {
            let labels = [("peer", p.peer.as_str()), ("family", *family)];
            f.add("lb_bgp_routes_announced", &labels, *n as f64);
        }
        f.add("lb_bgp_session_uptime_seconds", &peer, p.uptime_secs as f64);
        f.add("lb_bgp_updates_sent_total", &peer, p.updates_sent as f64);
        f.add(
            "lb_bgp_updates_received_total",
            &peer,
            p.updates_received as f64,
        );
        f.add(
            "lb_bgp_updates_ignored_total",
            &peer,
            p.updates_ignored as f64,
        );
        let gr = f64::from(u8::from(p.graceful_restart));
        f.add("lb_bgp_graceful_restart", &peer, gr);
        if let Some(b) = &p.bfd {
            f.add("lb_bfd_session_up", &peer, f64::from(u8::from(b.up)));
            if let Some(since) = b.since_secs {
                f.add("lb_bfd_state_seconds", &peer, since as f64);
            }
            f.add("lb_bfd_transitions_up_total", &peer, b.ups as f64);
            for (what, n) in [
                ("received", b.received),
                ("replied", b.replied),
                ("invalid", b.invalid),
                ("too_soon", b.too_soon),
            ] {
                let l = [("peer", p.peer.as_str()), ("what", what)];
                f.add("lb_bfd_packets_total", &l, n as f64);
            }
        }
    }
}

fn add_daemon(f: &mut Families, s: &Snapshot) {
    f.add(
        "lb_build_info",
        &[("version", VERSION), ("commit", COMMIT)],
        1.0,
    );
    let revision = s.revision.to_string();
    let config = [
        ("digest", s.config_digest.as_str()),
        ("revision", revision.as_str()),
    ];
    f.add("lb_config_info", &config, 1.0);
    f.add("lb_config_auto_reverts_total", &[], s.auto_reverts as f64);
}

/// Most scrapes served at once.
const MAX_SCRAPES: usize = 8;
/// Largest request head read.
const MAX_REQUEST_HEAD: usize = 8 << 10;

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "metrics: too many scrapes at once; closing");
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &metrics).await {
                debug!(%peer, error = %e, "metrics: scrape failed");
            }
            drop(permit);
        });
    }
}

/// Reads one request head (bounded in size and time) and answers it.
async fn answer(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::other("timed out reading the request"))??;
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (status, kind, body) = match (words.next(), words.next()) {
        (Some("GET"), Some(path)) if path == "/metrics" || path.starts_with("/metrics?") => {
            match metrics.encode() {
                Ok(text) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            }
        }
        (Some("GET"), _) => ("404 Not Found", "text/plain", "only /metrics here\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // A client that stops reading must not hold one of the few slots for
    // good: the whole answer gets as long as a scrape may take.
    let write = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(ANSWER_TIMEOUT, write)
        .await
        .map_err(|_| std::io::Error::other("the client read no answer in time"))?
}

/// How long a scraper may take to read its answer (Prometheus's default
/// scrape timeout is 10 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the metrics listener (a named error if the address is taken).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A scraper that sends its request and never reads the answer gives
    /// up its slot after [`ANSWER_TIMEOUT`] (eight of them used to hold
    /// every slot for good); one that reads gets the whole answer.
    #[tokio::test(start_paused = true)]
    async fn a_scraper_that_reads_nothing_lets_go_of_its_slot() {
        let metrics = Metrics::new();
        let (ours, mut theirs) = tokio::io::duplex(64);
        theirs
            .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let e = answer(ours, &metrics).await.unwrap_err();
        assert!(e.to_string().contains("in time"), "{e}");
        drop(theirs);

        let (ours, mut theirs) = tokio::io::duplex(64);
        theirs
            .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let reader = tokio::spawn(async move {
            let mut all = String::new();
            theirs.read_to_string(&mut all).await.map(|_| all)
        });
        answer(ours, &metrics).await.unwrap();
        let all = reader.await.unwrap().unwrap();
        assert!(all.starts_with("HTTP/1.1 200 OK"), "{all}");
    }
}

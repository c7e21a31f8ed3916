//! The daemon's state and every request's handler, generic over the
//! [`Dataplane`] so that they run against the in-memory dataplane
//! (`dataplane::fake`) in unit tests the way the reconciler does. `lbd`
//! (the binary) keeps only the wiring: loading and attaching the program,
//! the socket, signals, the gateway watcher, and the loop that feeds this
//! type one event at a time.
//!
//! One event at a time, and nothing else touches the maps: an API request
//! ([`Daemon::handle`]), a parsed reload ([`Daemon::reload`]), a probe
//! result ([`Daemon::on_probe`]), a gateway change ([`Daemon::on_gateway`]),
//! the one-second tick ([`Daemon::tick`]), a stop signal
//! ([`Daemon::begin_stop`]). After each change of the dataplane the
//! announce policy runs again and its answer goes to every announcer.
//!
//! Every configuration change (reload, API change, revert) goes through
//! [`Daemon::commit`], which previews it, or applies it and records it as
//! a revision, on probation with `--confirm-within`; [`Daemon::settle`]
//! runs a revert that came due, after every event.
//!
//! Submodules: [`requests`] (the dispatch of API requests), [`commit`]
//! (changes, revisions, probation), [`preview`] (what a change would do),
//! [`reload`] (file reloads, datapath settings, the blackhole guard),
//! [`announce`] (announcers, node drain and stop), [`probes`] (one prober
//! per probed backend), [`views`] (the answers to read-only requests),
//! [`second_chance`] (what second-chance alternates are computed from),
//! [`tier`] (the tier in etcd: what this balancer applied and reports),
//! [`rollout`] (its part in a staged rollout across the tier).

pub(crate) mod announce;
pub(crate) mod commit;
mod flows;
pub(crate) mod metrics;
pub(crate) mod passive;
pub(crate) mod preview;
pub(crate) mod probes;
pub(crate) mod reload;
pub(crate) mod requests;
pub(crate) mod rollout;
pub(crate) mod second_chance;
pub(crate) mod settings;
pub(crate) mod tier;
pub(crate) mod trace;
pub(crate) mod views;

pub use self::{
    probes::ProbeId,
    rollout::{Step, change as explain_change},
    settings::{datapath_settings, hash_key_of, resolve_gateway},
    views::humantime_millis,
};

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use thiserror::Error;
use tracing::{error, info, warn};

use crate::{
    announce::AnnounceError,
    api::{self, ErrorKind, Response},
    config::{Config, ConfigErrors, Mac, VipConfig, VipId},
    dataplane::{Dataplane, DataplaneError},
    health::ProbeResult,
    lifecycle::{Lifecycle, ProbeEffect},
    net::GatewayState,
    reconcile::{ApplyReport, DatapathSettings, ReconcileError, Reconciler},
    revisions::RevisionStore,
    state::{Overlay, StateError},
};

pub use self::{
    announce::{Announcers, StartAnnouncers},
    commit::{Force, Kind, Pending, REVERT_RETRY, Target},
    probes::{BackendKey, Probes, SpawnProber},
    reload::FileRead,
};

/// How often counters are sampled for rates.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    #[error(transparent)]
    Reconcile(#[from] ReconcileError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Announce(#[from] AnnounceError),
    /// A request refused: why, as a code, and in words.
    #[error("{message}")]
    Refused { kind: ErrorKind, message: String },
}

impl DaemonError {
    /// The code a refusal carries on the wire.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Config(_) => ErrorKind::InvalidConfig,
            Self::Reconcile(e) => match e {
                ReconcileError::VipIdsExhausted(_)
                | ReconcileError::BackendsExhausted(_)
                | ReconcileError::AlternatesExhausted(_)
                | ReconcileError::TablePoolFull { .. } => ErrorKind::Capacity,
                ReconcileError::Maglev { .. } | ReconcileError::AlternatesTableSize { .. } => {
                    ErrorKind::InvalidConfig
                }
                ReconcileError::Dataplane(_)
                | ReconcileError::NotProgrammed(_)
                | ReconcileError::NoRandomness(_)
                | ReconcileError::Region { .. } => ErrorKind::Internal,
            },
            Self::State(e) => match e {
                StateError::NoSuchVip(_) | StateError::NoSuchBackend { .. } => ErrorKind::NotFound,
                StateError::VipExists(_) | StateError::BackendExists { .. } => ErrorKind::Exists,
                StateError::File { .. } => ErrorKind::Internal,
            },
            Self::Dataplane(_) => ErrorKind::Internal,
            Self::Announce(e) => match e {
                AnnounceError::Config(_) | AnnounceError::InvalidPrefix { .. } => {
                    ErrorKind::InvalidConfig
                }
                _ => ErrorKind::Internal,
            },
            Self::Refused { kind, .. } => *kind,
        }
    }

    /// The answer that carries this error.
    pub fn response(&self) -> Response {
        Response::err(self.kind(), self.to_string())
    }
}

pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

/// A revision store's error as a refusal: a revision that does not
/// exist is `not_found`, anything else the store's failure.
fn revision_error(e: crate::revisions::RevisionError) -> DaemonError {
    let kind = match e {
        crate::revisions::RevisionError::Missing(_) => ErrorKind::NotFound,
        _ => ErrorKind::Internal,
    };
    refused(kind, e.to_string())
}

fn refused(kind: ErrorKind, message: impl Into<String>) -> DaemonError {
    DaemonError::Refused {
        kind,
        message: message.into(),
    }
}

/// What `lbd` learned at start-up that the daemon reports.
#[derive(Clone, Debug, Default)]
pub struct Startup {
    /// The interfaces the program is attached to.
    pub interfaces: Vec<api::InterfaceInfo>,
    /// The maps were adopted from a previous `lbd`.
    pub maps_adopted: bool,
    /// The program is attached (announcing is allowed).
    pub attached: bool,
}

/// The daemon's state: the running configuration and what the dataplane,
/// the probes and the announcers hold.
pub struct Daemon<D: Dataplane> {
    config_path: PathBuf,
    config: Config,
    overlay: Overlay,
    reconciler: Reconciler<D>,
    settings: DatapathSettings,
    startup: Startup,
    started: Instant,
    last_reload: Option<String>,
    lifecycle: Lifecycle,
    /// The last plan changes with time (slow start, drain timers).
    pending: bool,
    probes: Probes,
    announcers: Announcers,
    /// `gateway_mac: auto`: what the gateway watcher last said.
    gateway: Option<GatewayState>,
    /// The configuration file's text that runs, and its digest (made once
    /// per change: the text may be 16 MiB, and the status and the tier's
    /// report compare it with `file_digest`).
    text: Arc<str>,
    text_digest: String,
    /// The digest of the configuration file as last read from disk (it
    /// differs from `text`'s after a revert).
    file_digest: String,
    revisions: RevisionStore,
    /// The running revision and where it came from.
    revision: u64,
    revision_source: String,
    /// A change on probation (`--confirm-within`).
    confirm: Option<Pending>,
    /// Automatic reverts since start.
    auto_reverts: u64,
    /// Why an automatic revert is due ([`Daemon::settle`] runs it).
    revert_due: Option<String>,
    /// A change of the gateway settings: `lbd` restarts its watcher from
    /// this gateway and MAC.
    regateway: Option<(Option<IpAddr>, [u8; 6])>,
    /// What `metrics:` exports (kept whether or not it is served).
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The running configuration's digest, until a change applies (the
    /// metrics ask for it every second).
    running_digest: Option<String>,
    /// Each VIP's published table's digest, as of the last apply, with
    /// the entry it was computed for.
    table_digests: std::collections::BTreeMap<VipId, (lb_common::VipMeta, String)>,
    /// Ticks since the connection table was last scanned (see [`flows`]),
    /// and what the scan found (ways in use, in all).
    ticks_since_scan: u32,
    metrics_conntrack: Option<(u64, u64)>,
    /// The kernel's tick rate and the idle entries of draining backends,
    /// kept between scans.
    live_clock: crate::liveflows::Clock,
    /// Where the kernel's `jiffies` is read (a test sets its own clock).
    jiffies: crate::liveflows::Jiffies,
    live_flows: crate::liveflows::LiveFlows,
    /// Draining backends (by handle): their forwarded packets when the
    /// count last grew, and that tick (QUIC drains, `flows.rs`).
    drain_traffic: std::collections::BTreeMap<u32, (u64, u64)>,
    /// `lbctl trace`'s lease, while one runs.
    tracing: Option<trace::Lease>,
    samples: views::Samples,
    /// Second chance: each VIP's previous backends, from the revisions.
    alt_history: second_chance::History,
    /// Backends the last `lbd` found down: they start down (see
    /// [`Daemon::seed_verdicts`]).
    seeded_down: BTreeSet<BackendKey>,
    /// With `source.etcd`: the tier as the daemon knows it.
    tier: tier::TierState,
    /// With `source.etcd`: the staged rollout as the daemon knows it.
    rollout: rollout::RolloutState,
}

/// What `lbd`'s start-up and event loop read and set on the daemon; every
/// other field is the daemon's own.
impl<D: Dataplane> Daemon<D> {
    /// The running configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration file a reload reads.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config_path
    }

    /// The datapath, to attach the program and read its maps at start.
    pub fn dataplane_mut(&mut self) -> &mut D {
        self.reconciler.dataplane_mut()
    }

    /// The metrics registry the `/metrics` endpoint serves.
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.metrics.clone()
    }

    /// Records what the start found: the maps adopted from a previous
    /// `lbd`, the digest of the file as read, the gateway's state.
    pub fn started_with(
        &mut self,
        maps_adopted: bool,
        file_digest: String,
        gateway: Option<GatewayState>,
    ) {
        self.startup.maps_adopted = maps_adopted;
        self.file_digest = file_digest;
        self.gateway = gateway;
    }

    /// Records that the program is attached to `interfaces` (announcing
    /// is allowed from now on).
    pub fn attached(&mut self, interfaces: Vec<api::InterfaceInfo>) {
        self.startup.interfaces = interfaces;
        self.startup.attached = true;
    }

    /// A gateway to resolve again that a committed change asked for.
    pub fn take_regateway(&mut self) -> Option<(Option<IpAddr>, [u8; 6])> {
        self.regateway.take()
    }

    /// Stops every prober (the stop).
    pub fn stop_probes(&mut self) {
        self.probes.stop();
    }
}

impl<D: Dataplane> Daemon<D> {
    /// A daemon over `reconciler` (maps already adopted or created) with
    /// `settings` written; nothing programmed yet (see [`Daemon::program`]).
    /// `target` is what runs (its text is taken to be the file's);
    /// revisions go to `revisions` ([`Daemon::start_revision`] records the
    /// first).
    pub fn new(
        config_path: PathBuf,
        target: Target,
        reconciler: Reconciler<D>,
        settings: DatapathSettings,
        probes: Probes,
        announcers: Announcers,
        revisions: RevisionStore,
    ) -> Self {
        Self {
            config_path,
            file_digest: crate::digest::text(&target.text),
            text_digest: crate::digest::text(&target.text),
            text: target.text,
            config: target.config,
            overlay: target.overlay,
            revisions,
            revision: 0,
            revision_source: String::new(),
            confirm: None,
            auto_reverts: 0,
            revert_due: None,
            regateway: None,
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new()),
            running_digest: None,
            table_digests: std::collections::BTreeMap::new(),
            ticks_since_scan: u32::MAX,
            metrics_conntrack: None,
            live_clock: crate::liveflows::Clock::knowing(settings.kernel_hz),
            jiffies: Default::default(),
            live_flows: Default::default(),
            drain_traffic: Default::default(),
            tracing: None,
            reconciler,
            settings,
            startup: Startup::default(),
            started: Instant::now(),
            last_reload: None,
            lifecycle: Lifecycle::default(),
            pending: false,
            probes,
            announcers,
            gateway: None,
            samples: views::Samples::default(),
            alt_history: second_chance::History::default(),
            seeded_down: BTreeSet::new(),
            tier: tier::TierState::default(),
            rollout: rollout::RolloutState::default(),
        }
    }

    /// Before the first [`Daemon::program`]: the backends the last `lbd`
    /// found down (`verdicts.json` beside the revisions) start down, not
    /// up, until their probes say otherwise (`rise` successes). Without
    /// it, a restart puts a dead backend back in the table for the first
    /// probes' time, and new connections to it fail.
    pub fn seed_verdicts(&mut self) {
        match self.revisions.verdicts() {
            Ok(saved) => self.seeded_down = saved.down.into_iter().collect(),
            Err(e) => {
                warn!("the last probe verdicts cannot be read, so every backend starts up: {e}")
            }
        }
    }

    /// Keeps the backends found down now for the next start.
    fn save_verdicts(&self) {
        let saved = crate::revisions::SavedVerdicts {
            down: self.lifecycle.down().into_iter().collect(),
        };
        if let Err(e) = self.revisions.save_verdicts(&saved) {
            warn!("keeping the probe verdicts for a restart: {e}");
        }
    }

    /// The VIPs in force: the file's, with the API's changes on top.
    pub fn effective(&self) -> Vec<VipConfig> {
        self.overlay.apply(&self.config.vips)
    }

    /// Programs the dataplane for `effective`: lifecycle states (health,
    /// drains, slow start, panic) turn configured weights into effective
    /// ones, the reconciler writes what changed, probers follow, and the
    /// routes follow whatever the maps hold now. `initial`: at start-up,
    /// backends seen for the first time are taken as already serving.
    ///
    /// Maps that refuse the change (too many backends, a failed write)
    /// leave the bookkeeping as it was (the health verdicts, drains, slow
    /// starts and holds of what the change would have removed), and no
    /// announcer hears of it: the caller puts the running configuration
    /// back.
    pub fn program(&mut self, effective: &[VipConfig], initial: bool) -> Result<ApplyReport> {
        self.program_as(effective, initial, true)
    }

    /// [`program`](Self::program); `keep`: a copy of the bookkeeping is
    /// kept to put back if the maps refuse. A re-plan of the running
    /// configuration has nothing to put back (its sync removes and adds
    /// nothing) and skips the copy, O(backends), made at every probe
    /// batch otherwise.
    fn program_as(
        &mut self,
        effective: &[VipConfig],
        initial: bool,
        keep: bool,
    ) -> Result<ApplyReport> {
        let now = Instant::now();
        let drained = self.overlay.drained_in(effective);
        let before = keep.then(|| self.lifecycle.clone());
        self.lifecycle.sync(effective, &drained, now, initial);
        if initial {
            let began = self.overlay.drain_times();
            self.lifecycle
                .backdate_drains(effective, &began, now, commit::unix_now());
        }
        if initial && !self.seeded_down.is_empty() {
            let seeded = self
                .lifecycle
                .seed_down(&std::mem::take(&mut self.seeded_down));
            info!(
                "{seeded} backend(s) start down, as the last lbd left them, until their probes say up"
            );
        }
        let plan = self.lifecycle.plan(effective, now);
        for event in &plan.events {
            warn!("{event}");
        }
        let usable =
            |id: &VipId, addr: &IpAddr| plan.usable.get(&(*id, *addr)).copied().unwrap_or(true);
        let sources = self.alternate_sources(effective);
        self.reconciler.set_alternate_sources(sources);
        let report = match self.reconciler.apply(&plan.vips, &usable) {
            Ok(report) => report,
            Err(e) => {
                self.metrics.reconcile_errors.inc();
                if let Some(before) = before {
                    self.lifecycle = before;
                }
                return Err(e.into());
            }
        };
        self.pending = plan.pending;
        let unprobed = self
            .probes
            .sync(effective, &self.reconciler, &mut self.lifecycle);
        for (vip, addr) in unprobed {
            // Its series goes with it: a backend replaced every hour
            // would otherwise add twelve series for good.
            let _ = self
                .metrics
                .probe_duration
                .remove_label_values(&[&vip.to_string(), &addr.to_string()]);
        }
        self.record_builds(&report);
        self.announce_for(effective);
        Ok(report)
    }

    /// Re-plans the running configuration (after a verdict or a timer).
    pub fn replan(&mut self) {
        let effective = self.effective();
        if let Err(e) = self.program_as(&effective, false, false) {
            error!("updating the dataplane failed: {e}");
            // The routes still follow the backends' health (and an
            // announcer's refusal is still retried).
            self.announce();
        }
    }

    /// The one-second tick: counters sampled for rates, a probation's
    /// deadline checked, the IPv6 legacy lookup turned off once its hour
    /// is up (`reconcile/ct_v6.rs`), and either a re-plan (a ramp or a drain timer is
    /// running) or the announce policy again (which also retries what an
    /// announcer could not take).
    pub fn tick(&mut self) {
        self.sample();
        self.refresh_metrics();
        self.check_deadline();
        self.expire_trace();
        if let Err(e) = self.reconciler.expire_ct_v6_legacy(Instant::now()) {
            warn!("clearing the IPv6 legacy lookup failed (tried again next second): {e}");
        }
        if self.passive_tick() {
            self.pending = true;
        }
        if self.pending {
            self.replan();
        } else {
            self.announce();
        }
    }

    /// A probe result: a changed verdict is logged and re-planned.
    pub fn on_probe(&mut self, key: BackendKey, result: ProbeResult) {
        self.on_probes(std::iter::once((key, result)));
    }

    /// Probe results that arrived together (the loop takes every one
    /// queued): each recorded, and one re-plan for all the verdicts that
    /// changed, so a thousand backends coming up at once cost one apply,
    /// not a thousand.
    pub fn on_probes(&mut self, results: impl IntoIterator<Item = (BackendKey, ProbeResult)>) {
        let mut changed = BTreeSet::new();
        let mut first = false;
        for (key, result) in results {
            match self.record_probe(key, result) {
                ProbeEffect::Nothing => {}
                ProbeEffect::FirstVerdict => first = true,
                ProbeEffect::Changed => {
                    changed.insert(key.0);
                }
            }
        }
        if !changed.is_empty() {
            self.replan_vips(&changed);
            self.save_verdicts();
        } else if first {
            self.announce();
        }
    }

    /// Re-plans only the VIPs `ids`, whose backends' verdicts changed:
    /// their plan and their tables (the other VIPs, the auxiliary keys and
    /// the probers stay as they are), then the announcement of all. A
    /// failure there re-plans everything.
    pub fn replan_vips(&mut self, ids: &BTreeSet<VipId>) {
        let effective = self.effective();
        let some: Vec<VipConfig> = effective
            .iter()
            .filter(|v| ids.contains(&v.id))
            .cloned()
            .collect();
        let plan = self.lifecycle.plan(&some, Instant::now());
        for event in &plan.events {
            warn!("{event}");
        }
        self.pending |= plan.pending;
        let usable =
            |id: &VipId, addr: &IpAddr| plan.usable.get(&(*id, *addr)).copied().unwrap_or(true);
        match self.reconciler.apply_some(&plan.vips, &usable) {
            Ok(report) => {
                self.record_builds(&report);
                self.announce_for(&effective);
            }
            Err(e) => {
                self.metrics.reconcile_errors.inc();
                warn!("updating {} VIPs failed, updating all: {e}", ids.len());
                self.replan();
            }
        }
    }

    /// Results of the probers (by [`probes::ProbeId`]), each handed to
    /// every backend entry its prober serves; one re-plan for all.
    pub fn on_probe_results(&mut self, results: Vec<(probes::ProbeId, ProbeResult)>) {
        let mut fanned = Vec::with_capacity(results.len());
        for (id, result) in results {
            for key in self.probes.keys_of(id) {
                fanned.push((key, result.clone()));
            }
        }
        self.on_probes(fanned);
    }

    /// One probe result into the lifecycle; what it changed (logged).
    fn record_probe(&mut self, key: BackendKey, result: ProbeResult) -> ProbeEffect {
        if !self.probes.has(&key) {
            return ProbeEffect::Nothing; // a prober stopped since it sent this
        }
        let (vip, addr) = key;
        let detail = result.detail.clone();
        self.metrics
            .probe_duration
            .with_label_values(&[vip.to_string(), addr.to_string()])
            .observe(result.latency_us as f64 / 1e6);
        let effect = self
            .lifecycle
            .record_probe(&vip, &addr, result, Instant::now());
        if effect != ProbeEffect::Changed {
            return effect;
        }
        let up = self
            .lifecycle
            .vips
            .get(&vip)
            .and_then(|v| v.backends.get(&addr))
            .and_then(|b| b.health.as_ref())
            .is_some_and(|t| t.is_up());
        if up {
            info!(vip = %vip, backend = %addr, "backend is up: back in the table");
        } else {
            warn!(vip = %vip, backend = %addr, reason = %detail, "backend is down: out of the table");
        }
        effect
    }

    /// The gateway watcher saw a change: a new MAC is written at once (the
    /// watcher has logged it).
    pub fn on_gateway(&mut self, state: GatewayState) {
        if let Some(Mac(mac)) = state.mac
            && mac != self.settings.gateway_mac
        {
            self.settings.gateway_mac = mac;
            if let Err(e) = self.reconciler.apply_settings(&self.settings) {
                error!(error = %e, "writing the new gateway MAC failed");
            }
        }
        self.gateway = Some(state);
    }
}

#[cfg(test)]
mod tests;

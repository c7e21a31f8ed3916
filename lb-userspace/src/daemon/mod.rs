//! The daemon's state and every request's handler, generic over the
//! [`Dataplane`] so that they run against [`crate::dataplane::fake`] in
//! unit tests the way the reconciler does. `lbd` (the binary) keeps only
//! the wiring: loading and attaching the program, the socket, signals,
//! the gateway watcher, and the loop that feeds this type one event at a
//! time.
//!
//! One event at a time, and nothing else touches the maps: an API request
//! ([`Daemon::handle`]), a parsed reload ([`Daemon::reload`]), a probe
//! result ([`Daemon::on_probe`]), a gateway change ([`Daemon::on_gateway`]),
//! the one-second tick ([`Daemon::tick`]), a stop signal
//! ([`Daemon::begin_stop`]). After each change of the dataplane the
//! announce policy runs again and its answer goes to every announcer.
//!
//! Submodules: [`announce`] (announcers, node drain and stop), [`probes`]
//! (one prober per probed backend), [`reload`] (file reloads and the
//! blackhole guard), [`views`] (the answers to read-only requests).

pub mod announce;
pub mod probes;
pub mod reload;
pub mod views;

use std::{
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use thiserror::Error;
use tracing::{error, info, warn};

use crate::{
    announce::AnnounceError,
    api::{self, BackendRequest, NodeRequest, Request, Response, VipRequest},
    config::{Config, ConfigErrors, Mac, VipConfig, VipId},
    dataplane::{Dataplane, DataplaneError},
    health::ProbeResult,
    lifecycle::{Lifecycle, ProbeEffect},
    net::GatewayState,
    reconcile::{ApplyReport, DatapathSettings, ReconcileError, Reconciler},
    state::{Overlay, StateError},
};

pub use self::{
    announce::{Announcers, StartAnnouncers},
    probes::{BackendKey, Probes, SpawnProber},
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
    /// A request refused, with the reason in words.
    #[error("{0}")]
    Refused(String),
}

pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

fn refused(message: impl Into<String>) -> DaemonError {
    DaemonError::Refused(message.into())
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
    pub config_path: PathBuf,
    pub config: Config,
    pub overlay: Overlay,
    pub reconciler: Reconciler<D>,
    pub settings: DatapathSettings,
    pub startup: Startup,
    pub started: Instant,
    pub last_reload: Option<String>,
    pub lifecycle: Lifecycle,
    /// The last plan changes with time (slow start, drain timers).
    pub pending: bool,
    pub probes: Probes,
    pub announcers: Announcers,
    /// `gateway_mac: auto`: what the gateway watcher last said.
    pub gateway: Option<GatewayState>,
    samples: views::Samples,
}

impl<D: Dataplane> Daemon<D> {
    /// A daemon over `reconciler` (maps already adopted or created) with
    /// `settings` written; nothing programmed yet (see [`Daemon::program`]).
    pub fn new(
        config_path: PathBuf,
        config: Config,
        overlay: Overlay,
        reconciler: Reconciler<D>,
        settings: DatapathSettings,
        probes: Probes,
        announcers: Announcers,
    ) -> Self {
        Self {
            config_path,
            config,
            overlay,
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
    pub fn program(&mut self, effective: &[VipConfig], initial: bool) -> Result<ApplyReport> {
        let now = Instant::now();
        let drained = self.overlay.drained_in(effective);
        self.lifecycle.sync(effective, &drained, now, initial);
        let plan = self.lifecycle.plan(effective, now);
        for event in &plan.events {
            warn!("{event}");
        }
        self.pending = plan.pending;
        let usable =
            |id: &VipId, addr: &IpAddr| plan.usable.get(&(*id, *addr)).copied().unwrap_or(true);
        let result = self.reconciler.apply(&plan.vips, &usable);
        if result.is_ok() {
            self.probes
                .sync(effective, &self.reconciler, &mut self.lifecycle);
        }
        self.announce_for(effective);
        Ok(result?)
    }

    /// Re-plans the running configuration (after a verdict or a timer).
    pub fn replan(&mut self) {
        let effective = self.effective();
        if let Err(e) = self.program(&effective, false) {
            error!("updating the dataplane failed: {e}");
        }
    }

    /// The one-second tick: counters sampled for rates, and either a
    /// re-plan (a ramp or a drain timer is running) or the announce policy
    /// again (which also retries what an announcer could not take).
    pub fn tick(&mut self) {
        self.sample();
        if self.pending {
            self.replan();
        } else {
            self.announce();
        }
    }

    /// A probe result: a changed verdict is logged and re-planned.
    pub fn on_probe(&mut self, key: BackendKey, result: ProbeResult) {
        if !self.probes.has(&key) {
            return; // a prober stopped since it sent this
        }
        let (vip, addr) = key;
        let detail = result.detail.clone();
        match self
            .lifecycle
            .record_probe(&vip, &addr, result, Instant::now())
        {
            ProbeEffect::Nothing => return,
            ProbeEffect::FirstVerdict => return self.announce(),
            ProbeEffect::Changed => {}
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
        self.replan();
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

    /// Applies an overlay change: validate, refuse a blackhole (unless
    /// `force`), program, persist. Any failure leaves the running state
    /// and the state file as they were.
    pub fn change(
        &mut self,
        force: bool,
        edit: impl FnOnce(&mut Overlay, &[VipConfig]) -> Result<()>,
    ) -> Result<()> {
        let mut overlay = self.overlay.clone();
        edit(&mut overlay, &self.config.vips)?;
        let effective = overlay.apply(&self.config.vips);
        for w in self.config.check_vips(&effective)? {
            warn!("{w}");
        }
        self.refuse_blackhole(
            &effective,
            &overlay.drained_in(&effective),
            force,
            "--force",
        )?;
        let old = std::mem::replace(&mut self.overlay, overlay);
        let result = self
            .program(&effective, false)
            .and_then(|_| Ok(self.overlay.save(&self.config.state_file)?));
        if let Err(e) = result {
            self.overlay = old;
            let previous = self.effective();
            let _ = self.program(&previous, false);
            return Err(e);
        }
        Ok(())
    }

    /// Answers one request (a reload is [`Daemon::reload`], which needs
    /// the file read first; one that reaches here is refused).
    pub async fn handle(&mut self, request: Request) -> Response {
        let result = match request {
            Request::Vip(r) => self.handle_vip(r),
            Request::Backend(r) => self.handle_backend(r),
            Request::Node(r) => self.handle_node(r),
            Request::Reload { .. } => Err(refused(
                "a reload is read from the file off the daemon's loop: send it through lbd's socket",
            )),
            Request::Status => Ok(json(self.status())),
            Request::Health => Ok(json(self.health())),
            Request::Stats => Ok(json(self.stats())),
            Request::Table { vip } => self.table(&vip).map(json),
            Request::Simulate {
                src,
                dst,
                protocol,
                sport,
                dport,
                syn,
            } => self
                .simulate(src, dst, protocol.number(), sport, dport, syn)
                .map(json),
            Request::Bgp => Ok(json(self.announce_status())),
        };
        match result {
            Ok(data) => Response::ok(data),
            Err(e) => Response::err(e.to_string()),
        }
    }

    fn handle_vip(&mut self, r: VipRequest) -> Result<serde_json::Value> {
        match r {
            VipRequest::List => Ok(json(self.vip_list())),
            VipRequest::Add(add) => {
                let vip = views::vip_config(&add);
                self.change(false, |o, base| Ok(o.add_vip(base, vip)?))?;
                Ok(serde_json::Value::Null)
            }
            VipRequest::Del { vip } => {
                self.change(true, |o, base| Ok(o.delete_vip(base, &vip)?))?;
                Ok(serde_json::Value::Null)
            }
        }
    }

    fn handle_backend(&mut self, r: BackendRequest) -> Result<serde_json::Value> {
        match r {
            BackendRequest::Add {
                vip,
                address,
                weight,
            } => self.change(false, |o, base| {
                Ok(o.add_backend(base, &vip, address, weight)?)
            }),
            BackendRequest::Del {
                vip,
                address,
                force,
            } => self.change(force, |o, base| Ok(o.delete_backend(base, &vip, address)?)),
            BackendRequest::Weight {
                vip,
                address,
                weight,
                force,
            } => self.change(force, |o, base| {
                Ok(o.set_weight(base, &vip, address, weight)?)
            }),
            BackendRequest::Drain {
                vip,
                address,
                force,
            } => self.change(force, |o, base| {
                Ok(o.set_drained(base, &vip, address, true)?)
            }),
            BackendRequest::Undrain { vip, address } => self.change(false, |o, base| {
                Ok(o.set_drained(base, &vip, address, false)?)
            }),
        }
        .map(|_| serde_json::Value::Null)
    }

    fn handle_node(&mut self, r: NodeRequest) -> Result<serde_json::Value> {
        let drain = matches!(r, NodeRequest::Drain { .. });
        self.set_drained(drain).map(json)
    }
}

fn json(value: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

#[cfg(test)]
mod tests;

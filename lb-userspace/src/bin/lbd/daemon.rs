//! The daemon task: start-up (load or adopt the pinned program and maps,
//! apply the configuration, attach, start the route announcers), then one
//! loop that owns the reconciler and the announcers and handles API calls,
//! reloads, stats sampling and gateway refreshes in turn. Nothing else
//! touches the maps. After every change of the dataplane the announce
//! policy is applied again and its answer handed to every announcer.
//!
//! Stopping (SIGTERM/SIGINT): withdraw every VIP, keep serving the API and
//! the probes for `shutdown_grace` so the routers move traffic away, then
//! shut the announcers down (BGP: Cease) and exit, leaving the program
//! attached unless `detach_on_exit`. A second signal cuts the wait short.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode;
use lb::{
    announce::{
        AnnounceConfig, Announcer, SessionState,
        policy::{self, Decision, NodeState},
    },
    api::{
        AnnounceStatus, BackendHealth, BackendInfo, BackendStats, CounterInfo, InterfaceInfo,
        NodeChange, Rate, Request, Response, Simulation, Stats, Status, TableInfo, TableShare,
        VipHealth, VipInfo, VipStats,
    },
    config::{
        Config, Encap, Gateway, HealthCheck, Mac, MalformedPolicy, TooBigPolicy, VipConfig, VipId,
        XdpModeSetting,
    },
    dataplane::{Dataplane, kernel::KernelDataplane},
    health::{ProbeResult, ProbeTarget, spawn_prober},
    lifecycle::{Lifecycle, WEIGHT_SCALE},
    net,
    predict::Via,
    reconcile::{ApplyReport, DatapathSettings, Reconciler},
    state::Overlay,
};
use lb_common::{
    Counter, CounterValue, FlowKey,
    consts::{BACKEND_INDEX_MASK, probe_mark},
    counters::Kind,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{error, info, warn};

use crate::server::{self, Call};

/// How often counters are sampled for rates.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Counter values at one instant.
#[derive(Clone, Default)]
struct Sample {
    at: Option<Instant>,
    counters: Vec<CounterValue>,
    vips: BTreeMap<VipId, (CounterValue, BTreeMap<IpAddr, CounterValue>)>,
}

/// A backend of a VIP: the key of probes and lifecycle entries.
type BackendKey = (VipId, IpAddr);

/// A running prober and what it probes.
struct Prober {
    check: HealthCheck,
    target: ProbeTarget,
    task: tokio::task::JoinHandle<()>,
}

struct Daemon {
    /// The instance's lock, held until the process exits.
    _lock: lb::lock::DirLock,
    /// `gateway_mac: auto`: the task that follows the gateway's MAC.
    gateway: Option<GatewayWatch>,
    config_path: PathBuf,
    config: Config,
    overlay: Overlay,
    reconciler: Reconciler<KernelDataplane>,
    settings: DatapathSettings,
    interfaces: Vec<InterfaceInfo>,
    started: Instant,
    maps_adopted: bool,
    last_reload: Option<String>,
    previous: Sample,
    latest: Sample,
    lifecycle: Lifecycle,
    probers: BTreeMap<BackendKey, Prober>,
    probe_tx: mpsc::Sender<(BackendKey, ProbeResult)>,
    /// The last plan changes with time (slow start, drain timers).
    pending: bool,
    /// Route announcers (`announce:`), started once the program is
    /// attached.
    announcers: Vec<Box<dyn Announcer>>,
    /// The program is attached: announcing is allowed.
    attached: bool,
    /// Serving, drained (`lbctl node drain`) or stopping.
    node: NodeState,
    node_since: Instant,
    /// The announce policy's last answer.
    decision: Decision,
    /// When the announced set last lost its last address: the routers
    /// have had since then to move traffic away.
    withdrawn_at: Option<Instant>,
    /// The last error an announcer returned, logged once.
    announce_error: Option<String>,
}

fn xdp_mode(m: XdpModeSetting) -> XdpMode {
    match m {
        XdpModeSetting::Native => XdpMode::Driver,
        XdpModeSetting::Generic => XdpMode::Skb,
        XdpModeSetting::Auto => XdpMode::Default,
    }
}

fn mode_name(m: XdpModeSetting) -> &'static str {
    match m {
        XdpModeSetting::Native => "native",
        XdpModeSetting::Generic => "generic",
        XdpModeSetting::Auto => "auto",
    }
}

/// Mounts a bpffs at `dir` unless one is there already.
fn ensure_bpffs(dir: &Path) -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    let want = dir.to_string_lossy();
    if mounts.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_, point, fstype) = (f.next(), f.next(), f.next());
        point == Some(&*want) && fstype == Some("bpf")
    }) {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let status = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(dir)
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("{} is not a bpffs and mounting one failed", dir.display());
    }
    info!(dir = %dir.display(), "mounted bpffs");
    Ok(())
}

/// The gateway MAC: configured, or (`auto`) looked up now, with the
/// gateway's address.
async fn resolve_gateway(config: &Config) -> Result<(Option<IpAddr>, [u8; 6])> {
    match config.gateway {
        Gateway::Mac(Mac(mac)) => Ok((None, mac)),
        Gateway::Auto => {
            let iface = &config.interfaces[0];
            let (ip, mac) = net::gateway_mac(iface)
                .await
                .with_context(|| format!("resolving gateway_mac: auto on {iface}"))?;
            info!(gateway = %ip, mac = %mac, iface = %iface, "gateway resolved");
            Ok((Some(ip), mac.0))
        }
    }
}

/// For `gateway_mac: auto`: the watcher that looks the gateway up again
/// every `gateway_refresh`, off the daemon's loop.
struct GatewayWatch {
    state: tokio::sync::watch::Receiver<net::GatewayState>,
    task: tokio::task::JoinHandle<()>,
}

impl GatewayWatch {
    fn start(config: &Config, resolved: (Option<IpAddr>, [u8; 6])) -> Option<GatewayWatch> {
        let (Gateway::Auto, (Some(ip), mac)) = (config.gateway, resolved) else {
            return None;
        };
        let (state, task) = net::watch_gateway(
            config.interfaces[0].clone(),
            config.gateway_refresh,
            (ip, Mac(mac)),
        );
        Some(GatewayWatch { state, task })
    }

    /// Waits for the watcher's next change (forever without a watcher).
    async fn changed(watch: &mut Option<GatewayWatch>) -> net::GatewayState {
        if let Some(w) = watch
            && w.state.changed().await.is_ok()
        {
            return w.state.borrow_and_update().clone();
        }
        std::future::pending().await
    }
}

impl Drop for GatewayWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn settings(config: &Config, gateway_mac: [u8; 6]) -> DatapathSettings {
    let prefix_v4 = config.outer_source_v4_prefix;
    let prefix_v6 = config.outer_source_v6_prefix;
    DatapathSettings {
        gateway_mac,
        outer_source_v4: config
            .outer_source_v4
            .or(prefix_v4.and_then(|p| match p.addr {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            })),
        outer_source_v6: config
            .outer_source_v6
            .or(prefix_v6.and_then(|p| match p.addr {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })),
        outer_source_v4_host_bits: prefix_v4.map_or(0, |p| p.host_bits()),
        outer_source_v6_host_bits: prefix_v6.map_or(0, |p| p.host_bits()),
        malformed: config.malformed,
        mtu: config.mtu,
        gue_port: config.gue_port,
        icmp_echo: config.icmp_echo,
        pass_too_big: config.too_big_no_df == TooBigPolicy::Pass,
    }
}

pub async fn run(config_path: PathBuf) -> Result<()> {
    let config = Config::load(&config_path)?;
    for w in &config.warnings {
        warn!("{w}");
    }
    let overlay = Overlay::load(&config.state_file)?;
    let effective = overlay.apply(&config.vips);
    config.check_vips(&effective).map_err(|e| {
        anyhow::anyhow!(
            "the runtime changes in {} no longer fit {}: {e}",
            config.state_file.display(),
            config_path.display()
        )
    })?;

    ensure_bpffs(&config.bpffs)?;
    // Before any pin or the socket is touched: one lbd per instance.
    let lock = crate::lock_instance(&config)?;
    let pin_dir = config.pin_dir();
    let (dp, maps_adopted) = KernelDataplane::open_pinned(config.layout, &pin_dir)
        .with_context(|| format!("loading the XDP program (pins in {})", pin_dir.display()))?;
    let mut reconciler = Reconciler::adopt(dp)?;
    let resolved = resolve_gateway(&config).await?;
    let gateway = GatewayWatch::start(&config, resolved);
    let settings = settings(&config, resolved.1);
    reconciler.apply_settings(&settings)?;

    let (probe_tx, mut probe_rx) = mpsc::channel(1024);
    let mut daemon = Daemon {
        _lock: lock,
        gateway,
        config_path,
        config,
        overlay,
        reconciler,
        settings,
        interfaces: Vec::new(),
        started: Instant::now(),
        maps_adopted,
        last_reload: None,
        previous: Sample::default(),
        latest: Sample::default(),
        lifecycle: Lifecycle::default(),
        probers: BTreeMap::new(),
        probe_tx,
        pending: false,
        announcers: Vec::new(),
        attached: false,
        node: NodeState::Serving,
        node_since: Instant::now(),
        decision: Decision::default(),
        withdrawn_at: None,
        announce_error: None,
    };
    // Maps first, attachment second: the first packet sees the full state.
    let report = daemon.program(&effective, true)?;
    info!(?report, adopted = maps_adopted, "dataplane programmed");
    let config = &daemon.config;
    let reconciler = &mut daemon.reconciler;

    let mut interfaces = Vec::new();
    for iface in &config.interfaces {
        let adopted = reconciler
            .dataplane_mut()
            .attach(iface, xdp_mode(config.xdp_mode), &pin_dir)
            .with_context(|| format!("attaching XDP to {iface}"))?;
        info!(iface = %iface, mode = mode_name(config.xdp_mode), adopted, "XDP attached");
        interfaces.push(InterfaceInfo {
            name: iface.clone(),
            mode: mode_name(config.xdp_mode).into(),
            adopted,
        });
        // Health probes through the tunnel leave by this interface.
        reconciler
            .dataplane_mut()
            .attach_probe_encap(iface)
            .with_context(|| format!("attaching the probe tunnel program to {iface}"))?;
    }
    daemon.interfaces = interfaces;
    daemon.attached = true;
    // Announce only now: the maps are written and the program attached.
    daemon.start_announcers()?;
    daemon.announce();

    let listener = server::bind(&daemon.config.api_socket)?;
    let socket = daemon.config.api_socket.clone();
    let (tx, mut calls) = mpsc::channel::<Call>(64);
    tokio::spawn(server::serve(listener, tx));
    info!(socket = %socket.display(), instance = %daemon.config.instance, "lbd ready");
    daemon.sample();

    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut sample_tick = tokio::time::interval(SAMPLE_EVERY);
    // Files read and parsed off the loop, on their way to be applied.
    let (parsed_tx, mut parsed_rx) = mpsc::channel::<ParsedReload>(4);
    // Set by the first SIGTERM/SIGINT: when the grace period ends.
    let mut stop_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            Some((request, reply)) = calls.recv() => match request {
                Request::Reload { force } if daemon.node != NodeState::Stopping => {
                    ParsedReload::start(&daemon.config_path, force, Some(reply), &parsed_tx);
                }
                request => {
                    let response = daemon.handle(request).await;
                    let _ = reply.send(response);
                }
            },
            _ = hup.recv() => {
                info!("SIGHUP: reloading");
                ParsedReload::start(&daemon.config_path, false, None, &parsed_tx);
            }
            Some(parsed) = parsed_rx.recv() => {
                let result = daemon.reload(parsed.config, parsed.force).await;
                match parsed.reply {
                    Some(reply) => {
                        let _ = reply.send(match result {
                            Ok(w) => Response::ok(w),
                            Err(e) => Response::err(format!("{e:#}")),
                        });
                    }
                    None => {
                        if let Err(e) = result {
                            error!("reload failed, keeping the running configuration: {e:#}");
                        }
                    }
                }
            }
            Some((key, result)) = probe_rx.recv() => daemon.on_probe(key, result),
            _ = sample_tick.tick() => {
                daemon.sample();
                if daemon.pending {
                    daemon.replan();
                } else {
                    // Also retries what an announcer could not take.
                    daemon.announce();
                }
            }
            state = GatewayWatch::changed(&mut daemon.gateway) => daemon.on_gateway(&state),
            _ = term.recv() => match daemon.begin_stop("SIGTERM") {
                Some(wait) => stop_at = Some(tokio::time::Instant::now() + wait),
                None => break,
            },
            _ = int.recv() => match daemon.begin_stop("SIGINT") {
                Some(wait) => stop_at = Some(tokio::time::Instant::now() + wait),
                None => break,
            },
            _ = until(stop_at) => break,
        }
    }
    let _ = std::fs::remove_file(&socket);
    daemon.finish().await
}

/// A reload whose file was read and parsed on a blocking thread, so that
/// a large or hostile file never holds up the loop (the API, probe
/// verdicts, announcements).
struct ParsedReload {
    config: Result<Config, lb::config::ConfigErrors>,
    force: bool,
    /// `lbctl reload` waits for the answer; SIGHUP does not.
    reply: Option<tokio::sync::oneshot::Sender<Response>>,
}

impl ParsedReload {
    fn start(
        path: &Path,
        force: bool,
        reply: Option<tokio::sync::oneshot::Sender<Response>>,
        to: &mpsc::Sender<ParsedReload>,
    ) {
        let (path, to) = (path.to_path_buf(), to.clone());
        tokio::task::spawn_blocking(move || {
            let config = Config::load(&path);
            let _ = to.blocking_send(ParsedReload {
                config,
                force,
                reply,
            });
        });
    }
}

/// Waits until `at`, or forever.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The announcers an `announce:` section configures, by kind.
fn announcer_kinds(a: &AnnounceConfig) -> Vec<String> {
    [
        (a.bgp.is_some(), "bgp"),
        (a.exabgp.is_some(), "exabgp"),
        (a.exec.is_some(), "exec"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, k)| k.to_string())
    .collect()
}

fn rate(now: CounterValue, before: Option<CounterValue>, secs: f64) -> Rate {
    let (pps, bps) = match before {
        Some(b) if secs > 0.0 => (
            now.packets.saturating_sub(b.packets) as f64 / secs,
            now.bytes.saturating_sub(b.bytes) as f64 * 8.0 / secs,
        ),
        _ => (0.0, 0.0),
    };
    Rate {
        packets: now.packets,
        bytes: now.bytes,
        pps,
        bps,
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Pass => "pass",
        Kind::Forward => "forward",
        Kind::Drop => "drop",
        Kind::Malformed => "malformed",
        Kind::Reply => "reply",
        Kind::Event => "event",
        Kind::Retired => "retired",
    }
}

impl Daemon {
    fn effective(&self) -> Vec<VipConfig> {
        self.overlay.apply(&self.config.vips)
    }

    /// Programs the dataplane for `effective`: lifecycle states (health,
    /// drains, slow start, panic) turn configured weights into effective
    /// ones, the reconciler writes what changed, probers follow.
    fn program(&mut self, effective: &[VipConfig], initial: bool) -> Result<ApplyReport> {
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
            self.sync_probers(effective);
        }
        // Whatever the maps hold now, the routes follow it.
        self.announce_for(effective);
        Ok(result?)
    }

    /// Applies the announce policy to the running configuration.
    fn announce(&mut self) {
        let effective = self.effective();
        self.announce_for(&effective);
    }

    /// Applies the announce policy to `effective` and hands the answer to
    /// every announcer (they ignore a set they already have).
    fn announce_for(&mut self, effective: &[VipConfig]) {
        let decision = policy::decide(&self.lifecycle.counts(effective), self.attached, self.node);
        // Logged only when someone listens; a withdrawal for health is a
        // warning, one for a drain or a stop is the operator's wish.
        let listened = !self.announcers.is_empty();
        let chosen = self.node == NodeState::Serving;
        for v in decision.vips.iter().filter(|_| listened) {
            let before = self
                .decision
                .vips
                .iter()
                .find(|o| o.vip == v.vip)
                .is_some_and(|o| o.announced);
            match (before, v.announced) {
                (false, true) => info!(vip = %v.vip, reason = %v.reason, "VIP announced"),
                (true, false) if chosen => {
                    warn!(vip = %v.vip, reason = %v.reason, "VIP withdrawn")
                }
                (true, false) => info!(vip = %v.vip, reason = %v.reason, "VIP withdrawn"),
                _ => {}
            }
        }
        if !self.decision.addresses.is_empty() && decision.addresses.is_empty() {
            self.withdrawn_at = Some(Instant::now());
        }
        let mut failed = None;
        for a in &mut self.announcers {
            if let Err(e) = a.set_announced(&decision.addresses) {
                failed = Some(e.to_string());
            }
        }
        if failed != self.announce_error {
            if let Some(e) = &failed {
                error!(error = %e, "an announcer refused the VIP set; retrying every second");
            }
            self.announce_error = failed;
        }
        self.decision = decision;
    }

    /// Starts the configured announcers (none without `announce:`).
    fn start_announcers(&mut self) -> Result<()> {
        self.announcers =
            lb::announce::start(&self.config.announce).context("starting the route announcers")?;
        if !self.announcers.is_empty() {
            info!(
                announcers = %announcer_kinds(&self.config.announce).join(","),
                "route announcers started"
            );
        }
        Ok(())
    }

    /// Shuts every announcer down: withdrawals, then (BGP) Cease. Bounded
    /// by each announcer's own shutdown limit.
    async fn stop_announcers(&mut self) {
        let mut announcers = std::mem::take(&mut self.announcers);
        let results = futures::future::join_all(announcers.iter_mut().map(|a| a.shutdown())).await;
        for e in results.into_iter().filter_map(Result::err) {
            warn!(error = %e, "an announcer did not shut down cleanly");
        }
    }

    /// How long the routers still need, out of `shutdown_grace`, since the
    /// last announced address was withdrawn (0 without announcers).
    fn grace_left(&self) -> Duration {
        match (self.announcers.is_empty(), self.withdrawn_at) {
            (false, Some(at)) => self.config.shutdown_grace.saturating_sub(at.elapsed()),
            _ => Duration::ZERO,
        }
    }

    /// `lbctl node drain` / `undrain`.
    fn set_drained(&mut self, drained: bool) -> Result<NodeChange> {
        if self.node == NodeState::Stopping {
            bail!("lbd is shutting down");
        }
        let want = if drained {
            NodeState::Drained
        } else {
            NodeState::Serving
        };
        let changed = self.node != want;
        if changed {
            self.node = want;
            self.node_since = Instant::now();
        }
        let before = self.decision.addresses.clone();
        self.announce();
        let after = &self.decision.addresses;
        let addresses: Vec<IpAddr> = if drained {
            before.difference(after).copied().collect()
        } else {
            after.difference(&before).copied().collect()
        };
        if changed {
            info!(
                node = %self.node,
                addresses = ?addresses,
                "node {}",
                if drained { "drained: every VIP withdrawn, forwarding goes on" } else { "undrained" }
            );
        }
        Ok(NodeChange {
            node: self.node,
            changed,
            addresses,
            wait_secs: if drained {
                self.grace_left().as_secs_f64()
            } else {
                0.0
            },
        })
    }

    /// The first SIGTERM/SIGINT withdraws every VIP and returns how long
    /// to wait before stopping; a second one returns `None`: stop now.
    fn begin_stop(&mut self, signal: &str) -> Option<Duration> {
        if self.node == NodeState::Stopping {
            info!(signal, "second signal: stopping now");
            return None;
        }
        self.node = NodeState::Stopping;
        self.node_since = Instant::now();
        self.announce();
        let wait = self.grace_left();
        info!(
            signal,
            wait_ms = wait.as_millis() as u64,
            "stopping: every VIP withdrawn, waiting for the routers to move traffic away"
        );
        Some(wait)
    }

    /// The end of a graceful stop: announcers shut down (Cease), probers
    /// stopped, and the program detached if so configured.
    async fn finish(mut self) -> Result<()> {
        self.stop_announcers().await;
        for p in self.probers.values() {
            p.task.abort();
        }
        if self.config.detach_on_exit {
            crate::remove_pins(&self.config)?;
            info!(
                pins = %self.config.pin_dir().display(),
                "lbd exiting; detached and pins removed (detach_on_exit)"
            );
        } else {
            info!(
                pins = %self.config.pin_dir().display(),
                "lbd exiting; the XDP program stays attached and keeps forwarding (`lbd teardown` removes it)"
            );
        }
        Ok(())
    }

    fn announce_status(&self) -> AnnounceStatus {
        AnnounceStatus {
            node: self.node,
            node_state_secs: match self.node {
                NodeState::Serving => 0.0,
                _ => self.node_since.elapsed().as_secs_f64(),
            },
            attached: self.attached,
            shutdown_grace_secs: self.config.shutdown_grace.as_secs_f64(),
            announced: self.decision.addresses.iter().copied().collect(),
            announcers: announcer_kinds(&self.config.announce),
            peers: self.announcers.iter().flat_map(|a| a.status()).collect(),
            vips: self.decision.vips.clone(),
        }
    }

    /// One line for `lbctl status`.
    fn announce_summary(&self) -> String {
        let n = self.decision.addresses.len();
        let kinds = announcer_kinds(&self.config.announce);
        if kinds.is_empty() {
            return "no announcer configured (`announce:`)".into();
        }
        let peers: Vec<_> = self.announcers.iter().flat_map(|a| a.status()).collect();
        let up = peers
            .iter()
            .filter(|p| p.state == SessionState::Established)
            .count();
        let node = match self.node {
            NodeState::Serving => String::new(),
            other => format!("; node {other}"),
        };
        format!(
            "{}: {up} of {} up, {n} address(es) announced{node}",
            kinds.join(", "),
            peers.len()
        )
    }

    /// Re-plans the running configuration (after a verdict or a timer).
    fn replan(&mut self) {
        let effective = self.effective();
        if let Err(e) = self.program(&effective, false) {
            error!("updating the dataplane failed: {e:#}");
        }
    }

    /// Starts, restarts or stops probers so that each probed backend has
    /// exactly one, probing what its check says.
    fn sync_probers(&mut self, effective: &[VipConfig]) {
        let mut wanted: BTreeMap<BackendKey, (HealthCheck, ProbeTarget)> = BTreeMap::new();
        for vip in effective {
            for b in &vip.backends {
                let Some(check) = vip.health_check_of(b) else {
                    continue;
                };
                let port = check.port.unwrap_or(vip.id.port);
                let target = if check.through_tunnel {
                    let Some(handle) = self
                        .reconciler
                        .vips()
                        .get(&vip.id)
                        .and_then(|v| v.backends.get(&b.address))
                        .map(|s| s.handle)
                    else {
                        continue;
                    };
                    ProbeTarget {
                        addr: (vip.id.addr, port).into(),
                        mark: Some(probe_mark(
                            handle & BACKEND_INDEX_MASK,
                            vip.encap == Encap::Gre,
                        )),
                    }
                } else {
                    ProbeTarget {
                        addr: (b.address, port).into(),
                        mark: None,
                    }
                };
                wanted.insert((vip.id, b.address), (check.clone(), target));
            }
        }
        self.probers.retain(|key, p| {
            let keep = wanted
                .get(key)
                .is_some_and(|(c, t)| *c == p.check && *t == p.target);
            if !keep {
                p.task.abort();
            }
            keep
        });
        for (key, (check, target)) in wanted {
            if self.probers.contains_key(&key) {
                continue;
            }
            self.lifecycle
                .reset_health(&key.0, &key.1, check.rise, check.fall);
            let seed = lb_common::flow::fmix64(
                self.probers.len() as u64 ^ u64::from(key.1.is_ipv4()) ^ u64::from(key.0.port),
            );
            let task = spawn_prober(
                key,
                check.clone(),
                target.clone(),
                seed,
                self.probe_tx.clone(),
            );
            self.probers.insert(
                key,
                Prober {
                    check,
                    target,
                    task,
                },
            );
        }
    }

    fn on_probe(&mut self, key: BackendKey, result: ProbeResult) {
        if !self.probers.contains_key(&key) {
            return; // a prober stopped since it sent this
        }
        let (vip, addr) = key;
        let detail = result.detail.clone();
        if self
            .lifecycle
            .record_probe(&vip, &addr, result, Instant::now())
        {
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
    }

    fn read_sample(&self) -> lb::dataplane::Result<Sample> {
        let dp = self.reconciler.dataplane();
        let counters = dp.counters()?;
        let mut vips = BTreeMap::new();
        for id in self.reconciler.vips().keys() {
            if let Some((v, backends)) = self.reconciler.vip_counters(id).map_err(|e| {
                lb::dataplane::DataplaneError::Io(std::io::Error::other(e.to_string()))
            })? {
                vips.insert(*id, (v, backends.into_iter().collect()));
            }
        }
        Ok(Sample {
            at: Some(Instant::now()),
            counters,
            vips,
        })
    }

    fn sample(&mut self) {
        match self.read_sample() {
            Ok(s) => self.previous = std::mem::replace(&mut self.latest, s),
            Err(e) => warn!(error = %e, "reading counters failed"),
        }
    }

    /// The gateway watcher saw a change: a new MAC is written at once (the
    /// watcher has logged it).
    fn on_gateway(&mut self, state: &net::GatewayState) {
        let Some(Mac(mac)) = state.mac else { return };
        if mac != self.settings.gateway_mac {
            self.settings.gateway_mac = mac;
            if let Err(e) = self.reconciler.apply_settings(&self.settings) {
                error!(error = %e, "writing the new gateway MAC failed");
            }
        }
    }

    /// Re-reads the file. On any error the running configuration stays.
    async fn reload(
        &mut self,
        parsed: Result<Config, lb::config::ConfigErrors>,
        force: bool,
    ) -> Result<Vec<String>> {
        let result = match parsed {
            Ok(new) => self.try_reload(new, force).await,
            Err(e) => Err(e.into()),
        };
        let when = humantime(SystemTime::now());
        self.last_reload = Some(match &result {
            Ok(_) => format!("ok at {when}"),
            Err(e) => format!("failed at {when}: {e:#}"),
        });
        result
    }

    async fn try_reload(&mut self, new: Config, force: bool) -> Result<Vec<String>> {
        let fixed = [
            ("instance", new.instance != self.config.instance),
            ("interfaces", new.interfaces != self.config.interfaces),
            ("xdp_mode", new.xdp_mode != self.config.xdp_mode),
            (
                "table_size, conntrack_buckets, max_vips or max_backends",
                new.layout != self.config.layout,
            ),
            ("bpffs", new.bpffs != self.config.bpffs),
            ("api_socket", new.api_socket != self.config.api_socket),
            ("state_file", new.state_file != self.config.state_file),
        ];
        if let Some((what, _)) = fixed.iter().find(|(_, changed)| *changed) {
            bail!("{what} cannot change on reload; restart lbd to change it");
        }
        let effective = self.overlay.apply(&new.vips);
        let mut warnings = new.check_vips(&effective)?;
        warnings.extend(new.warnings.iter().cloned());
        warnings.extend(self.refuse_blackhole(
            &effective,
            &self.overlay.drained_in(&effective),
            force,
            "lbctl reload --force",
        )?);
        let regateway = new.gateway != self.config.gateway
            || new.gateway_refresh != self.config.gateway_refresh;
        let resolved = if new.gateway == self.config.gateway {
            let ip = self.gateway.as_ref().and_then(|g| g.state.borrow().gateway);
            (ip, self.settings.gateway_mac)
        } else {
            resolve_gateway(&new).await?
        };
        let settings = settings(&new, resolved.1);
        self.reconciler.apply_settings(&settings)?;
        if let Err(e) = self.program(&effective, false) {
            // Put the previous state back before giving up.
            let _ = self.reconciler.apply_settings(&self.settings);
            let old = self.effective();
            let _ = self.program(&old, false);
            return Err(e);
        }
        if new.announce != self.config.announce {
            info!("the announce section changed: restarting the announcers");
            self.stop_announcers().await;
            match lb::announce::start(&new.announce) {
                Ok(started) => self.announcers = started,
                Err(e) => {
                    let _ = self.reconciler.apply_settings(&self.settings);
                    let old = self.effective();
                    let _ = self.program(&old, false);
                    if let Err(e) = self.start_announcers() {
                        error!("restarting the previous announcers failed: {e:#}");
                    }
                    self.announce();
                    return Err(anyhow::Error::from(e).context("starting the new announcers"));
                }
            }
        }
        for w in &warnings {
            warn!("{w}");
        }
        if regateway {
            self.gateway = GatewayWatch::start(&new, resolved);
        }
        self.settings = settings;
        self.config = new;
        // min_healthy may have changed, and new announcers know nothing yet.
        self.announce();
        info!("configuration reloaded");
        Ok(warnings)
    }

    /// Checks that `effective` (with `drained`) leaves every VIP that is
    /// announced now with a backend in its table. A VIP left without one
    /// would drop all its traffic while the routers still send it here:
    /// refused, unless `force`, in which case the problems come back as
    /// warnings (and are logged as errors). `how` says how to force it.
    fn refuse_blackhole(
        &self,
        effective: &[VipConfig],
        drained: &std::collections::BTreeSet<BackendKey>,
        force: bool,
        how: &str,
    ) -> Result<Vec<String>> {
        let now = Instant::now();
        let mut lifecycle = self.lifecycle.clone();
        lifecycle.sync(effective, drained, now, false);
        lifecycle.plan(effective, now);
        let problems: Vec<String> = self
            .decision
            .vips
            .iter()
            .filter(|v| v.announced && v.usable > 0)
            .filter_map(|v| {
                let vip = effective.iter().find(|c| c.id == v.vip)?;
                let (usable, awaiting) =
                    lb::lifecycle::usable_backends(vip, lifecycle.vips.get(&vip.id));
                (usable + awaiting == 0).then(|| {
                    format!(
                        "VIP {} is announced and would have no usable backend ({})",
                        vip.id,
                        lb::lifecycle::why_unusable(vip, lifecycle.vips.get(&vip.id))
                    )
                })
            })
            .collect();
        if problems.is_empty() {
            return Ok(Vec::new());
        }
        if !force {
            bail!(
                "refused, it would blackhole traffic: {}; fix it, or force it with `{how}`",
                problems.join("; ")
            );
        }
        for p in &problems {
            error!("forced: {p}");
        }
        Ok(problems)
    }

    /// Applies an overlay change: validate, program, persist. Any failure
    /// leaves the running state and the state file as they were. `force`
    /// applies a change that leaves an announced VIP without a usable
    /// backend.
    fn change(
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

    async fn handle(&mut self, request: Request) -> Response {
        let result: Result<serde_json::Value> = match request {
            Request::Status => Ok(serde_json::to_value(self.status()).unwrap_or_default()),
            Request::VipList => Ok(serde_json::to_value(self.vip_list()).unwrap_or_default()),
            Request::VipAdd { vip } => self
                .change(false, |o, base| Ok(o.add_vip(base, *vip)?))
                .map(|_| serde_json::Value::Null),
            Request::VipDel { vip } => self
                .change(true, |o, base| Ok(o.delete_vip(base, &vip)?))
                .map(|_| serde_json::Value::Null),
            Request::BackendAdd {
                vip,
                address,
                weight,
            } => self
                .change(false, |o, base| {
                    Ok(o.add_backend(base, &vip, address, weight)?)
                })
                .map(|_| serde_json::Value::Null),
            Request::BackendDel {
                vip,
                address,
                force,
            } => self
                .change(force, |o, base| Ok(o.delete_backend(base, &vip, address)?))
                .map(|_| serde_json::Value::Null),
            Request::BackendWeight {
                vip,
                address,
                weight,
                force,
            } => self
                .change(force, |o, base| {
                    Ok(o.set_weight(base, &vip, address, weight)?)
                })
                .map(|_| serde_json::Value::Null),
            Request::BackendDrain {
                vip,
                address,
                force,
            } => self
                .change(force, |o, base| {
                    Ok(o.set_drained(base, &vip, address, true)?)
                })
                .map(|_| serde_json::Value::Null),
            Request::BackendUndrain { vip, address } => self
                .change(false, |o, base| {
                    Ok(o.set_drained(base, &vip, address, false)?)
                })
                .map(|_| serde_json::Value::Null),
            Request::Health => Ok(serde_json::to_value(self.health()).unwrap_or_default()),
            Request::Stats => Ok(serde_json::to_value(self.stats()).unwrap_or_default()),
            Request::Table { vip } => self
                .table(&vip)
                .map(|t| serde_json::to_value(t).unwrap_or_default()),
            Request::Simulate {
                src,
                dst,
                protocol,
                sport,
                dport,
                syn,
            } => self
                .simulate(src, dst, protocol.number(), sport, dport, syn)
                .map(|s| serde_json::to_value(s).unwrap_or_default()),
            // Reloads are read off the loop (see `ParsedReload`); one that
            // reaches here arrived while stopping.
            Request::Reload { .. } => Err(anyhow::anyhow!("lbd is shutting down")),
            Request::Bgp => Ok(serde_json::to_value(self.announce_status()).unwrap_or_default()),
            Request::NodeDrain => self
                .set_drained(true)
                .map(|c| serde_json::to_value(c).unwrap_or_default()),
            Request::NodeUndrain => self
                .set_drained(false)
                .map(|c| serde_json::to_value(c).unwrap_or_default()),
        };
        match result {
            Ok(data) => Response::ok(data),
            Err(e) => Response::err(format!("{e:#}")),
        }
    }

    fn status(&self) -> Status {
        let layout = self.reconciler.layout();
        let ncpus = aya::util::nr_cpus().unwrap_or(1);
        Status {
            instance: self.config.instance.clone(),
            pid: std::process::id(),
            uptime_secs: self.started.elapsed().as_secs(),
            config_file: self.config_path.display().to_string(),
            interfaces: self.interfaces.clone(),
            gateway_mac: Mac(self.settings.gateway_mac).to_string(),
            pin_dir: self.config.pin_dir().display().to_string(),
            maps_adopted: self.maps_adopted,
            vips: self.reconciler.vips().len(),
            backends: self
                .reconciler
                .vips()
                .values()
                .map(|v| v.backends.len())
                .sum(),
            table_size: layout.table_size,
            ct_buckets: layout.ct_buckets,
            max_vips: layout.max_vips,
            max_backends: layout.max_backends,
            map_bytes: layout
                .map_bytes(ncpus)
                .into_iter()
                .map(|(n, b)| (n.to_string(), b))
                .collect(),
            api_changes: !self.overlay.is_empty(),
            last_reload: self.last_reload.clone(),
            warnings: self.config.warnings.clone(),
            announce: self.announce_summary(),
            gateway: self.gateway.as_ref().map(|g| {
                let state = g.state.borrow();
                lb::api::GatewayInfo {
                    address: state.gateway,
                    looking_up: state.looking_up,
                    error: state.error.clone(),
                }
            }),
        }
    }

    fn vip_list(&self) -> Vec<VipInfo> {
        self.effective()
            .iter()
            .map(|v| {
                let kernel = self.reconciler.vips().get(&v.id);
                let life = self.lifecycle.vips.get(&v.id);
                VipInfo {
                    vip: v.id,
                    encap: v.encap.to_string(),
                    conntrack: v.conntrack,
                    backends: v
                        .backends
                        .iter()
                        .map(|b| {
                            let k = kernel.and_then(|k| k.backends.get(&b.address));
                            BackendInfo {
                                address: b.address,
                                weight: b.weight,
                                state: life
                                    .and_then(|l| l.backends.get(&b.address))
                                    .map(|l| l.state),
                                usable: k.is_some_and(|k| k.usable),
                                handle: k.map(|k| k.handle).unwrap_or(0),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn health(&self) -> Vec<VipHealth> {
        let now = Instant::now();
        self.effective()
            .iter()
            .map(|v| {
                let life = self.lifecycle.vips.get(&v.id);
                VipHealth {
                    vip: v.id,
                    panic: life.is_some_and(|l| l.panic),
                    panic_entered: life.map(|l| l.panic_entered).unwrap_or(0),
                    backends: v
                        .backends
                        .iter()
                        .filter_map(|b| {
                            let l = life?.backends.get(&b.address)?;
                            let check = v.health_check_of(b);
                            Some(BackendHealth {
                                address: b.address,
                                state: l.state,
                                health: match &l.health {
                                    None => "unchecked".into(),
                                    Some(t) if t.is_up() => "up".into(),
                                    Some(_) => "down".into(),
                                },
                                check: check.map(|c| describe_check(c, v, b.address)),
                                weight: b.weight,
                                effective_weight: l.effective_weight as f64 / WEIGHT_SCALE as f64,
                                in_state_secs: now
                                    .saturating_duration_since(l.state_since)
                                    .as_secs_f64(),
                                last_probe: l.health.as_ref().and_then(|t| t.last.clone()),
                                probes: l.health.as_ref().map(|t| t.probes).unwrap_or(0),
                            })
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn stats(&mut self) -> Stats {
        let now = match self.read_sample() {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "reading counters failed");
                self.latest.clone()
            }
        };
        // Rates against the older of the two samples kept, so the interval
        // is between one and two sampling periods.
        let before = if self.previous.at.is_some() {
            &self.previous
        } else {
            &self.latest
        };
        let secs = match (now.at, before.at) {
            (Some(a), Some(b)) => a.duration_since(b).as_secs_f64(),
            _ => 0.0,
        };
        let counters = Counter::ALL
            .iter()
            .filter(|c| c.kind() != Kind::Retired)
            .map(|c| CounterInfo {
                name: c.name().into(),
                kind: kind_name(c.kind()).into(),
                value: rate(
                    now.counters.get(*c as usize).copied().unwrap_or_default(),
                    before.counters.get(*c as usize).copied(),
                    secs,
                ),
            })
            .collect();
        let vips = now
            .vips
            .iter()
            .map(|(id, (v, backends))| {
                let old = before.vips.get(id);
                VipStats {
                    vip: *id,
                    value: rate(*v, old.map(|o| o.0), secs),
                    backends: backends
                        .iter()
                        .map(|(addr, b)| BackendStats {
                            address: *addr,
                            value: rate(*b, old.and_then(|o| o.1.get(addr)).copied(), secs),
                        })
                        .collect(),
                }
            })
            .collect();
        Stats {
            interval_secs: secs,
            counters,
            vips,
            malformed_policy: match self.config.malformed {
                MalformedPolicy::Pass => "pass".into(),
                MalformedPolicy::Drop => "drop".into(),
            },
        }
    }

    fn table(&self, id: &VipId) -> Result<TableInfo> {
        let v = self
            .reconciler
            .vips()
            .get(id)
            .with_context(|| format!("no VIP {id}"))?;
        let mut slots: BTreeMap<u32, u32> = BTreeMap::new();
        for h in v.table() {
            *slots.entry(*h).or_default() += 1;
        }
        let m = self.reconciler.layout().table_size;
        // The reconciler holds effective weights (scaled, ramped, panic);
        // the share they give is what the table should show.
        let in_table_weight: u32 = v
            .backends
            .values()
            .filter(|b| slots.contains_key(&b.handle))
            .map(|b| b.weight)
            .sum();
        let configured: BTreeMap<IpAddr, u32> = self
            .effective()
            .into_iter()
            .find(|c| c.id == *id)
            .map(|c| c.backends.iter().map(|b| (b.address, b.weight)).collect())
            .unwrap_or_default();
        Ok(TableInfo {
            vip: *id,
            table_size: m,
            active_half: self.reconciler.layout().active_half(&v.meta),
            backends: v
                .backends
                .iter()
                .map(|(addr, b)| {
                    let n = slots.get(&b.handle).copied().unwrap_or(0);
                    TableShare {
                        address: *addr,
                        weight: configured.get(addr).copied().unwrap_or(0),
                        slots: n,
                        share: n as f64 / m as f64,
                        weight_share: if n > 0 && in_table_weight > 0 {
                            b.weight as f64 / in_table_weight as f64
                        } else {
                            0.0
                        },
                    }
                })
                .collect(),
        })
    }

    fn simulate(
        &self,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        sport: u16,
        dport: u16,
        syn: bool,
    ) -> Result<Simulation> {
        if src.is_ipv4() != dst.is_ipv4() {
            bail!("source and destination must be of the same family");
        }
        let flow = FlowKey::new(src, dst, proto, sport, dport);
        let prediction = self.reconciler.simulate(&flow, syn)?;
        Ok(match prediction {
            None => Simulation {
                vip: None,
                hash: format!("{:#018x}", flow.hash()),
                slot: 0,
                backend: None,
                via: "not a VIP: passed to the kernel".into(),
            },
            Some(p) => Simulation {
                vip: VipId::from_key(&p.vip),
                hash: format!("{:#018x}", p.hash),
                slot: p.slot,
                backend: p.backend.and_then(|b| {
                    self.reconciler
                        .backend_by_handle(b.handle)
                        .map(|(_, a)| a)
                        .or_else(|| b.ip())
                }),
                via: match (p.backend, p.via) {
                    (None, _) => "no usable backend: dropped".into(),
                    (Some(_), Via::ConnTrack) => "connection table".into(),
                    (Some(b), Via::Maglev) => format!(
                        "maglev slot {} (backend index {})",
                        p.slot,
                        b.handle & BACKEND_INDEX_MASK
                    ),
                },
            },
        })
    }
}

/// What a check probes, for `lbctl health`.
fn describe_check(c: &HealthCheck, vip: &VipConfig, backend: IpAddr) -> String {
    let port = c.port.unwrap_or(vip.id.port);
    let what = if let Some(h) = &c.http {
        format!("http GET {} → {}", h.path, h.status)
    } else if c.send.is_some() || c.expect.is_some() {
        "tcp send/expect".to_string()
    } else {
        "tcp connect".to_string()
    };
    let target = if c.through_tunnel {
        format!("{}:{port} through the tunnel", vip.id.addr)
    } else {
        std::net::SocketAddr::from((backend, port)).to_string()
    };
    format!(
        "{what} {target} every {} (timeout {}, rise {}, fall {})",
        lb::config::duration::format(&c.interval),
        lb::config::duration::format(&c.timeout),
        c.rise,
        c.fall
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ` without a date crate.
fn humantime(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

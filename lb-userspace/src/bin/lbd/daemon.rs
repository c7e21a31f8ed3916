//! The daemon task: start-up (load or adopt the pinned program and maps,
//! apply the configuration, attach), then one loop that owns the
//! reconciler and handles API calls, reloads, stats sampling and gateway
//! refreshes in turn. Nothing else touches the maps.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode;
use lb::{
    api::{
        BackendInfo, BackendStats, CounterInfo, InterfaceInfo, Rate, Request, Response, Simulation,
        Stats, Status, TableInfo, TableShare, VipInfo, VipStats,
    },
    config::{Config, Gateway, Mac, MalformedPolicy, VipConfig, VipId, XdpModeSetting},
    dataplane::{Dataplane, kernel::KernelDataplane},
    net,
    predict::Via,
    reconcile::{DatapathSettings, Reconciler},
    state::Overlay,
};
use lb_common::{Counter, CounterValue, FlowKey, consts::BACKEND_INDEX_MASK, counters::Kind};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{error, info, warn};

use crate::server::{self, Call};

/// How often counters are sampled for rates.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often an `auto` gateway MAC is looked up again.
const GATEWAY_EVERY: Duration = Duration::from_secs(10);

/// Counter values at one instant.
#[derive(Clone, Default)]
struct Sample {
    at: Option<Instant>,
    counters: Vec<CounterValue>,
    vips: BTreeMap<VipId, (CounterValue, BTreeMap<IpAddr, CounterValue>)>,
}

struct Daemon {
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

async fn resolve_gateway(config: &Config) -> Result<[u8; 6]> {
    match config.gateway {
        Gateway::Mac(Mac(mac)) => Ok(mac),
        Gateway::Auto => {
            let iface = &config.interfaces[0];
            let (ip, mac) = net::gateway_mac(iface)
                .await
                .with_context(|| format!("resolving gateway_mac: auto on {iface}"))?;
            info!(gateway = %ip, mac = %mac, iface = %iface, "gateway resolved");
            Ok(mac.0)
        }
    }
}

fn settings(config: &Config, gateway_mac: [u8; 6]) -> DatapathSettings {
    DatapathSettings {
        gateway_mac,
        outer_source_v4: config.outer_source_v4,
        outer_source_v6: config.outer_source_v6,
        malformed: config.malformed,
    }
}

fn all_usable(_: &VipId, _: &IpAddr) -> bool {
    true
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
    let pin_dir = config.pin_dir();
    let (dp, maps_adopted) = KernelDataplane::open_pinned(config.layout, &pin_dir)
        .with_context(|| format!("loading the XDP program (pins in {})", pin_dir.display()))?;
    let mut reconciler = Reconciler::adopt(dp)?;
    let gateway_mac = resolve_gateway(&config).await?;
    let settings = settings(&config, gateway_mac);
    reconciler.apply_settings(&settings)?;
    // Maps first, attachment second: the first packet sees the full state.
    let report = reconciler.apply(&effective, &all_usable)?;
    info!(?report, adopted = maps_adopted, "dataplane programmed");

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
    }

    let listener = server::bind(&config.api_socket)?;
    let socket = config.api_socket.clone();
    let (tx, mut calls) = mpsc::channel::<Call>(64);
    tokio::spawn(server::serve(listener, tx));
    info!(socket = %socket.display(), instance = %config.instance, "lbd ready");

    let mut daemon = Daemon {
        config_path,
        config,
        overlay,
        reconciler,
        settings,
        interfaces,
        started: Instant::now(),
        maps_adopted,
        last_reload: None,
        previous: Sample::default(),
        latest: Sample::default(),
    };
    daemon.sample();

    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut sample_tick = tokio::time::interval(SAMPLE_EVERY);
    let mut gateway_tick = tokio::time::interval(GATEWAY_EVERY);
    gateway_tick.tick().await;
    loop {
        tokio::select! {
            Some((request, reply)) = calls.recv() => {
                let response = daemon.handle(request).await;
                let _ = reply.send(response);
            }
            _ = hup.recv() => {
                info!("SIGHUP: reloading");
                if let Err(e) = daemon.reload().await {
                    error!("reload failed, keeping the running configuration: {e:#}");
                }
            }
            _ = sample_tick.tick() => daemon.sample(),
            _ = gateway_tick.tick() => daemon.refresh_gateway().await,
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let _ = std::fs::remove_file(&socket);
    info!(
        pins = %daemon.config.pin_dir().display(),
        "lbd exiting; the XDP program stays attached and keeps forwarding (`lbd teardown` removes it)"
    );
    Ok(())
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
        Kind::Event => "event",
    }
}

impl Daemon {
    fn effective(&self) -> Vec<VipConfig> {
        self.overlay.apply(&self.config.vips)
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

    async fn refresh_gateway(&mut self) {
        if self.config.gateway != Gateway::Auto {
            return;
        }
        match resolve_gateway(&self.config).await {
            Ok(mac) if mac != self.settings.gateway_mac => {
                info!(mac = %Mac(mac), "gateway MAC changed");
                self.settings.gateway_mac = mac;
                if let Err(e) = self.reconciler.apply_settings(&self.settings) {
                    error!(error = %e, "writing the new gateway MAC failed");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(
                "gateway lookup failed, keeping {}: {e:#}",
                Mac(self.settings.gateway_mac)
            ),
        }
    }

    /// Re-reads the file. On any error the running configuration stays.
    async fn reload(&mut self) -> Result<Vec<String>> {
        let result = self.try_reload().await;
        let when = humantime(SystemTime::now());
        self.last_reload = Some(match &result {
            Ok(_) => format!("ok at {when}"),
            Err(e) => format!("failed at {when}: {e:#}"),
        });
        result
    }

    async fn try_reload(&mut self) -> Result<Vec<String>> {
        let new = Config::load(&self.config_path)?;
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
        let gateway_mac = if new.gateway == self.config.gateway {
            self.settings.gateway_mac
        } else {
            resolve_gateway(&new).await?
        };
        let settings = settings(&new, gateway_mac);
        self.reconciler.apply_settings(&settings)?;
        if let Err(e) = self.reconciler.apply(&effective, &all_usable) {
            // Put the previous state back before giving up.
            let _ = self.reconciler.apply_settings(&self.settings);
            let _ = self.reconciler.apply(&self.effective(), &all_usable);
            return Err(e.into());
        }
        for w in &warnings {
            warn!("{w}");
        }
        self.settings = settings;
        self.config = new;
        info!("configuration reloaded");
        Ok(warnings)
    }

    /// Applies an overlay change: validate, program, persist. Any failure
    /// leaves the running state and the state file as they were.
    fn change(
        &mut self,
        edit: impl FnOnce(&mut Overlay, &[VipConfig]) -> Result<()>,
    ) -> Result<()> {
        let mut overlay = self.overlay.clone();
        edit(&mut overlay, &self.config.vips)?;
        let effective = overlay.apply(&self.config.vips);
        for w in self.config.check_vips(&effective)? {
            warn!("{w}");
        }
        self.reconciler.apply(&effective, &all_usable)?;
        if let Err(e) = overlay.save(&self.config.state_file) {
            let _ = self.reconciler.apply(&self.effective(), &all_usable);
            return Err(e.into());
        }
        self.overlay = overlay;
        Ok(())
    }

    async fn handle(&mut self, request: Request) -> Response {
        let result: Result<serde_json::Value> = match request {
            Request::Status => Ok(serde_json::to_value(self.status()).unwrap_or_default()),
            Request::VipList => Ok(serde_json::to_value(self.vip_list()).unwrap_or_default()),
            Request::VipAdd { vip } => self
                .change(|o, base| Ok(o.add_vip(base, vip)?))
                .map(|_| serde_json::Value::Null),
            Request::VipDel { vip } => self
                .change(|o, base| Ok(o.delete_vip(base, &vip)?))
                .map(|_| serde_json::Value::Null),
            Request::BackendAdd {
                vip,
                address,
                weight,
            } => self
                .change(|o, base| Ok(o.add_backend(base, &vip, address, weight)?))
                .map(|_| serde_json::Value::Null),
            Request::BackendDel { vip, address } => self
                .change(|o, base| Ok(o.delete_backend(base, &vip, address)?))
                .map(|_| serde_json::Value::Null),
            Request::BackendWeight {
                vip,
                address,
                weight,
            } => self
                .change(|o, base| Ok(o.set_weight(base, &vip, address, weight)?))
                .map(|_| serde_json::Value::Null),
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
            Request::Reload => self
                .reload()
                .await
                .map(|w| serde_json::to_value(w).unwrap_or_default()),
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
        }
    }

    fn vip_list(&self) -> Vec<VipInfo> {
        self.reconciler
            .vips()
            .iter()
            .map(|(id, v)| VipInfo {
                vip: *id,
                encap: v.encap.to_string(),
                conntrack: v.conntrack,
                backends: v
                    .backends
                    .iter()
                    .map(|(addr, b)| BackendInfo {
                        address: *addr,
                        weight: b.weight,
                        usable: b.usable,
                        handle: b.handle,
                    })
                    .collect(),
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
        let in_table_weight: u32 = v
            .backends
            .values()
            .filter(|b| slots.contains_key(&b.handle))
            .map(|b| b.weight)
            .sum();
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
                        weight: b.weight,
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

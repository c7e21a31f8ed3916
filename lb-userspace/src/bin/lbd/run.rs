//! `lbd run`: the wiring around [`lb::daemon::Daemon`]. Start-up (lock
//! the instance, load or adopt the pinned program and maps, program them,
//! attach, start the announcers, bind the socket), then one loop that
//! feeds the daemon one event at a time: an API request, a reload read
//! off the loop, a probe result, a gateway change, the one-second tick, a
//! signal.
//!
//! Stopping (SIGTERM/SIGINT): withdraw every VIP, keep serving the API and
//! the probes for `shutdown_grace` so the routers move traffic away, then
//! shut the announcers down (BGP: Cease) and exit, leaving the program
//! attached unless `detach_on_exit`. A second signal cuts the wait short.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::XdpMode;
use lb::{
    Overlay, Reconciler, RevisionStore,
    api::{ChangeOptions, InterfaceInfo, Request, Response},
    config::{Config, ConfigErrors, Gateway, Mac, XdpModeSetting},
    daemon::{
        Announcers, Daemon, FileRead, Probes, SAMPLE_EVERY, Target, datapath_settings, hash_key_of,
        resolve_gateway,
    },
    dataplane::{KernelDataplane, TracedProgram},
    net,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot},
};
use tracing::{error, info, warn};

use crate::{
    server::{self, Call},
    tier::{Feed, TierLink, Via},
};

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

/// Mounts a bpffs at `dir` unless `dir` is on one already: the mount
/// itself, or a directory under it (`bpffs: /sys/fs/bpf/edge`, or written
/// with a trailing slash). Mounting over a bpffs hides the pins of the
/// last start: this one would take itself for a first start and find the
/// interfaces held by programs it could no longer adopt.
fn ensure_bpffs(dir: &Path) -> Result<()> {
    if lb::on_bpffs(dir).context("reading /proc/self/mounts")? {
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

/// A reload whose file was read and parsed on a blocking thread, so that
/// a large or hostile file never holds up the loop (the API, probe
/// verdicts, announcements).
/// `lbctl diff` reads its file the same way, as a reload with
/// `--dry-run`.
struct ParsedReload {
    /// The file read (`lbctl diff FILE` names another).
    path: PathBuf,
    file: Result<FileRead, ConfigErrors>,
    /// With `source.etcd`: the desired state the file was composed with,
    /// and why: a change in etcd, a rollout's step, or only to keep the
    /// VIPs while the file is read again.
    desired: Option<lb::tier::Desired>,
    via: Via,
    force: bool,
    options: ChangeOptions,
    /// `lbctl reload` waits for the answer; SIGHUP does not.
    reply: Option<oneshot::Sender<Response>>,
    /// Which read of the file this is, in the order the reads started
    /// ([`READS`]): a read that started later saw the file as new or
    /// newer.
    read: u64,
}

/// Reads of the configuration file started so far. Reads are parsed side
/// by side and finish in any order; one that finishes after a later read
/// was applied holds an older file ([`superseded`]).
static READS: AtomicU64 = AtomicU64::new(0);

/// Whether a reload of read `read` comes too late: a read that started
/// after it (`newest`, the newest applied or refused) already ran, so
/// applying this one would put an older file back for good.
fn superseded(read: u64, newest: u64) -> bool {
    read < newest
}

impl ParsedReload {
    /// Reads `path` off the loop (composed with `desired` when the VIPs
    /// come from etcd) and hands it to the loop.
    fn start(
        path: &Path,
        (desired, via): (Option<lb::tier::Desired>, Via),
        force: bool,
        options: ChangeOptions,
        reply: Option<oneshot::Sender<Response>>,
        to: &mpsc::Sender<ParsedReload>,
    ) {
        // Two parses at a time: each may hold a file of up to 16 MiB and
        // what it parses into, and 64 clients could ask for a diff at once.
        static PARSES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
        let (path, to) = (path.to_path_buf(), to.clone());
        let read = READS.fetch_add(1, Ordering::Relaxed) + 1;
        tokio::spawn(async move {
            let _turn = PARSES.acquire().await;
            let parse = tokio::task::spawn_blocking(move || {
                let file =
                    FileRead::load(&path).and_then(|f| crate::tier::compose(f, desired.as_ref()));
                let _ = to.blocking_send(ParsedReload {
                    path,
                    file,
                    desired,
                    via,
                    force,
                    options,
                    reply,
                    read,
                });
            });
            let _ = parse.await;
        });
    }
}

/// Probe results taken off the channel for one re-plan, at most.
const PROBE_BATCH: usize = 4096;

/// Waits until `at`, or forever.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What to run at start, and the file as read: the file's configuration,
/// or, when the file is unchanged since the newest revision was made and
/// that revision is a revert, the revision's (a restart does not undo a
/// revert), or, when the newest revision refused the file for what
/// `--force` overrides, the revision that ran (a restart does not apply a
/// refused reload); the API's changes on top, checked together.
fn load(
    config_path: &Path,
    file: FileRead,
) -> Result<(Target, FileRead, RevisionStore, lb::tier::Desired)> {
    for w in &file.config.warnings {
        warn!("{w}");
    }
    let store = RevisionStore::open(&file.config.revisions_dir(), file.config.history)?;
    // With the VIPs in etcd: those the last revision ran, until etcd says
    // (the revisions are read only then).
    let desired = match &file.config.source {
        Some(source) => crate::tier::start_from(&store, &source.prefix),
        None => crate::tier::nothing(),
    };
    let file = crate::tier::compose(file, Some(&desired))?;
    let (config, text) =
        if let Some((_, config, text)) = kept_over_refused(&store, &file, config_path) {
            (config, text)
        } else if let Some((number, config, text)) = reverted_revision(&store, &file) {
            warn!(
                revision = number,
                "starting from revision {number}, a revert: {} is unchanged since",
                config_path.display()
            );
            (config, text)
        } else {
            (file.config.clone(), file.text.clone())
        };
    let overlay = settled_overlay(&config)?;
    config
        .check_vips(&overlay.apply(&config.vips))
        .map_err(|e| {
            anyhow::anyhow!(
                "the runtime changes in {} no longer fit {}: {e}",
                config.state_file.display(),
                config_path.display()
            )
        })?;
    let target = Target {
        config,
        text,
        overlay,
    };
    Ok((target, file, store, desired))
}

/// The runtime changes of the state file, settled against the file as the
/// rule says (the newest intent for each object wins): a change whose
/// object the file changed while `lbd` was down no longer applies, and
/// says so. Changes kept by an `lbd` that recorded no origins are taken as
/// made against this file.
fn settled_overlay(config: &Config) -> Result<Overlay> {
    let loaded = Overlay::load(&config.state_file)?;
    let mut overlay = loaded.clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    overlay.adopt(
        &config.vips,
        &lb::Stamp {
            revision: 0,
            time: now,
            source: "kept by an earlier lbd".into(),
        },
    );
    for o in overlay.rebase(&config.vips) {
        warn!(
            vip = %o.vip,
            backend = ?o.backend,
            field = o.field,
            "the file changed this since the runtime change of revision {} ({}: {}): the file decides (it says {})",
            o.revision,
            o.source,
            o.running,
            o.file_now(&config.vips)
        );
    }
    if overlay != loaded
        && let Err(e) = overlay.save(&config.state_file)
    {
        warn!("keeping the settled runtime changes: {e}");
    }
    Ok(overlay)
}

/// The newest revision that ran, when the newest of all refused `file`
/// itself for what `--force` overrides (the blackhole guard, flows sent to
/// other backends): a start applies no more than the reload did. Said
/// loudly, with the way to apply the file anyway.
fn kept_over_refused(
    store: &RevisionStore,
    file: &FileRead,
    config_path: &std::path::Path,
) -> Option<(u64, Config, std::sync::Arc<str>)> {
    let (refused, ran) = store.kept_over_refused(&file.digest)?;
    let text = ran.config?;
    let config = match Config::parse(&text) {
        Ok(config) => config,
        Err(e) => {
            warn!(
                refused = refused.number,
                "{} was refused at revision {}, but revision {}, which ran before, no longer parses: starting with the file: {e}",
                config_path.display(),
                refused.number,
                ran.number
            );
            return None;
        }
    };
    warn!(
        refused = refused.number,
        running = ran.number,
        "{} was refused at revision {} ({}); starting with revision {}, which ran before: fix the file, or apply it with `lbctl reload --force`",
        config_path.display(),
        refused.number,
        refused.error.as_deref().unwrap_or("refused"),
        ran.number
    );
    Some((ran.number, config, text.into()))
}

/// The newest revision, if it runs another text than `file` while `file`
/// is the file it was made beside (a revert that a restart must keep).
fn reverted_revision(
    store: &RevisionStore,
    file: &FileRead,
) -> Option<(u64, Config, std::sync::Arc<str>)> {
    let latest = store.latest_applied(None).ok()??;
    let text = latest.config?;
    if latest.file_digest.as_deref() != Some(file.digest.as_str()) || *text == *file.text {
        return None;
    }
    match Config::parse(&text) {
        Ok(config) => Some((latest.number, config, text.into())),
        Err(e) => {
            warn!(
                revision = latest.number,
                "the newest revision no longer parses; starting from the file: {e}"
            );
            None
        }
    }
}

/// Says which VIPs the adopted maps serve that this start removes: not in
/// the file, nor among the state file's runtime changes, nor (with
/// `source.etcd`) in the last revision. Usually an edit made while `lbd`
/// was down; but a start that lost its state file or its revisions (a
/// changed `state_file`, a lost `/var/lib/lb`) would otherwise empty a
/// serving datapath in silence.
fn warn_dropped_vips(reconciler: &Reconciler<KernelDataplane>, target: &Target) {
    let config = &target.config;
    let kept: std::collections::BTreeSet<_> = target
        .overlay
        .apply(&config.vips)
        .into_iter()
        .map(|v| v.id)
        .collect();
    let dropped: Vec<String> = reconciler
        .vips()
        .keys()
        .filter(|id| !kept.contains(id))
        .map(ToString::to_string)
        .collect();
    if dropped.is_empty() {
        return;
    }
    let why = if !config.state_file.exists() {
        format!(
            "; {} does not exist (runtime changes, if an earlier lbd made any, were kept there: was it moved or lost?)",
            config.state_file.display()
        )
    } else if config.source.is_some() {
        format!(
            "; the VIPs come from etcd and come back when it answers (no revision under {} had them)",
            config.revisions_dir().display()
        )
    } else {
        String::new()
    };
    warn!(
        vips = %dropped.join(", "),
        "the pinned maps served {} VIP(s) this start removes{why}",
        dropped.len()
    );
}

/// Attaches the program (and the probe tunnel) to every configured
/// interface, afresh on those in `afresh` ([`interfaces_free`]), and
/// detaches it from interfaces no longer configured.
fn attach(daemon: &mut Daemon<KernelDataplane>, afresh: &[String]) -> Result<()> {
    let config = daemon.config();
    let (pin_dir, mode) = (config.pin_dir(), config.xdp_mode);
    let configured = config.interfaces.clone();
    let mut interfaces = Vec::new();
    for iface in &configured {
        let dp = daemon.dataplane_mut();
        let (adopted, used) = attach_one(dp, iface, mode, &pin_dir, afresh.contains(iface))?;
        info!(iface = %iface, mode = mode_name(used), adopted, "XDP attached");
        interfaces.push(InterfaceInfo {
            name: iface.clone(),
            mode: mode_name(used).into(),
            adopted,
        });
        // Health probes through the tunnel leave by this interface.
        dp.attach_probe_encap(iface)
            .with_context(|| format!("attaching the probe tunnel program to {iface}"))?;
    }
    for gone in KernelDataplane::pinned_links(&pin_dir) {
        if !configured.contains(&gone) {
            KernelDataplane::detach(&gone, &pin_dir)
                .with_context(|| format!("detaching XDP from {gone}"))?;
            warn!(iface = %gone, "no longer in interfaces: its XDP program is detached");
        }
    }
    // Every link runs this lbd's program now: earlier records can go.
    KernelDataplane::forget_unattached_programs(&pin_dir);
    daemon.attached(interfaces);
    Ok(())
}

/// The signals `lbd` answers, taken before it starts: one that comes
/// while it starts (seconds to minutes: maps, attachment, announcers)
/// waits for the loop, where SIGTERM stops it gracefully and SIGHUP
/// reloads, instead of ending it by the default action after it attached
/// and announced, with nothing withdrawn.
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn take() -> Result<Self> {
        Ok(Self {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

/// A started daemon and what feeds it besides requests.
struct Started {
    daemon: Daemon<KernelDataplane>,
    gateway: Option<GatewayWatch>,
    probes: mpsc::Receiver<(lb::daemon::ProbeId, lb::ProbeResult)>,
    /// With `source.etcd`: the link to the tier.
    tier: Option<TierLink>,
    /// Held until `lbd` exits: one `lbd` per instance.
    _lock: lb::DirLock,
}

pub async fn run(config_path: PathBuf) -> Result<()> {
    let mut signals = Signals::take()?;
    let Started {
        mut daemon,
        mut gateway,
        probes,
        mut tier,
        _lock,
    } = start(config_path).await?;
    let listener = server::bind(&daemon.config().api_socket)?;
    let socket = daemon.config().api_socket.clone();
    let (tx, calls) = mpsc::channel::<Call>(64);
    tokio::spawn(server::serve(listener, tx));
    if let Some(m) = &daemon.config().metrics {
        let listener = lb::metrics::bind(m.listen)
            .await
            .with_context(|| format!("metrics: listening on {}", m.listen))?;
        info!(listen = %m.listen, "serving Prometheus metrics at /metrics");
        tokio::spawn(lb::metrics::serve(listener, daemon.metrics()));
    }
    info!(socket = %socket.display(), instance = %daemon.config().instance, "lbd ready");
    crate::notify::ready(&format!("serving instance {}", daemon.config().instance));
    daemon.sample();
    let mut attachments = Attachments::seed(daemon.config()).await;
    let feeds = Feeds {
        signals: &mut signals,
        attachments: &mut attachments,
        gateway: &mut gateway,
        tier: &mut tier,
        traced: &mut Some(verify_traced(&mut daemon)),
    };
    let result = serve(&mut daemon, feeds, probes, calls).await;
    let _ = std::fs::remove_file(&socket);
    result?;
    finish(daemon).await
}

/// Loads and locks, programs the maps, attaches, and starts announcing.
/// A first start (no pins yet) that fails removes every pin it created;
/// a start that adopted pins leaves them, and the program forwarding.
async fn start(config_path: PathBuf) -> Result<Started> {
    let file = FileRead::load(&config_path)?;
    ensure_bpffs(&file.config.bpffs)?;
    // Before anything is written (the state file, a revision, a pin, the
    // socket): one lbd per instance. A second `lbd` started by hand on a
    // running instance must not settle and save its state file first.
    let lock = crate::lock_instance(&file.config)?;
    // Up to a second where the kernel's build configuration is not
    // installed: learnt while the program is verified.
    let hz = tokio::task::spawn_blocking(lb::kernel_hz);
    let (target, file, revisions, desired) = load(&config_path, file)?;
    let config = target.config.clone();
    let first = !KernelDataplane::has_pins(&config.pin_dir());
    // Before anything is attached or announced: a socket that cannot be
    // bound would end the start after both, with nothing withdrawn.
    server::check_path(&config.api_socket)?;
    let afresh = interfaces_free(&config, first).await?;
    match start_locked(
        config_path,
        (target, file, revisions, desired),
        (lock, hz),
        &afresh,
    )
    .await
    {
        Ok(started) => Ok(started),
        Err(e) => {
            if first {
                match crate::remove_pins(&config) {
                    Ok(()) => info!(
                        pins = %config.pin_dir().display(),
                        "start failed: removed the pins it had created"
                    ),
                    Err(c) => warn!("start failed, and removing its pins failed too: {c:#}"),
                }
            }
            Err(keep_verifier_log(e, &config))
        }
    }
}

/// How often a running `lbd` checks that its links still hold their
/// interfaces.
const ATTACHMENT_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// What the attachment check keeps between rounds, per interface.
#[derive(Default)]
struct Attachments {
    /// The index each interface had when its program was last seen in
    /// place: another one means the interface was made again.
    ifindex: std::collections::HashMap<String, u32>,
    /// Interfaces already warned about (held by another program, or an
    /// attachment that keeps failing): one message each, not one a round.
    warned: Vec<String>,
}

impl Attachments {
    /// The interfaces' indexes as the start left them attached.
    async fn seed(config: &Config) -> Self {
        let mut seen = Self::default();
        for iface in &config.interfaces {
            if let Ok((ifindex, _)) = net::xdp_state(iface).await {
                seen.ifindex.insert(iface.clone(), ifindex);
            }
        }
        seen
    }
}

/// Attaches afresh to an interface whose pinned link lost it (deleted and
/// made again while `lbd` ran: a driver reload, networkd re-making a bond),
/// and again every round while that fails. The new interface runs no XDP
/// program, and without this its VIP traffic would go to the kernel's
/// stack until a restart while the VIPs stayed announced.
async fn check_attachments(daemon: &mut Daemon<KernelDataplane>, seen: &mut Attachments) {
    let config = daemon.config();
    let pin_dir = config.pin_dir();
    for iface in config.interfaces.clone() {
        let ours =
            KernelDataplane::pinned_link_program(&KernelDataplane::link_pin(&pin_dir, &iface));
        // An interface that is gone right now is looked at next time.
        let Ok((ifindex, attached)) = net::xdp_state(&iface).await else {
            continue;
        };
        match attached {
            Some(a) if Some(a.program) == ours => {
                seen.ifindex.insert(iface.clone(), ifindex);
                seen.warned.retain(|w| *w != iface);
            }
            Some(a) => {
                if !seen.warned.contains(&iface) {
                    error!(iface = %iface, program = a.program, "the pinned XDP link lost the interface, which now runs another XDP program: lb does not forward there");
                    seen.warned.push(iface);
                }
            }
            None => {
                let remade = seen.ifindex.get(&iface) != Some(&ifindex);
                match reattach(daemon, &iface, remade) {
                    Ok(()) => {
                        warn!(iface = %iface, "the pinned XDP link lost the interface (deleted and made again?): attached afresh");
                        seen.ifindex.insert(iface.clone(), ifindex);
                        seen.warned.retain(|w| *w != iface);
                    }
                    Err(e) if !seen.warned.contains(&iface) => {
                        error!(iface = %iface, "the interface runs no XDP program, and attaching it failed (tried again every {}s): {e:#}", ATTACHMENT_CHECK_EVERY.as_secs());
                        seen.warned.push(iface);
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

/// Attaches the program to `iface` afresh ([`attach_one`]) and, on an
/// interface made again (`remade`, or not known), the probe tunnel's
/// program too: the old interface took it along; one whose link was only
/// cut loose still has it (the kernel then says it exists).
fn reattach(daemon: &mut Daemon<KernelDataplane>, iface: &str, remade: bool) -> Result<()> {
    let config = daemon.config();
    let (pin_dir, mode) = (config.pin_dir(), config.xdp_mode);
    let dp = daemon.dataplane_mut();
    attach_one(dp, iface, mode, &pin_dir, true)?;
    if remade
        && let Err(e) = dp.attach_probe_encap(iface)
        && !exists(&e)
    {
        warn!(iface = %iface, "the probe tunnel's program could not be attached again ({e}): tunnelled health probes leave untunnelled");
    }
    Ok(())
}

/// Whether `e` is the kernel's "File exists".
fn exists(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EEXIST))
        {
            return true;
        }
        at = e.source();
    }
    false
}

/// Attaches to `iface` in `mode` (afresh: [`KernelDataplane::attach`]). A
/// fresh attachment the kernel refuses natively (a driver without XDP, an
/// MTU too large for it) is made generic, which works everywhere, loudly:
/// the link it replaced is gone, and an interface left without the program
/// would take VIP traffic to the kernel's stack. Returns whether the link
/// was adopted, and the mode it runs in (what `lbctl status` shows).
fn attach_one(
    dp: &mut KernelDataplane,
    iface: &str,
    mode: XdpModeSetting,
    pin_dir: &Path,
    afresh: bool,
) -> Result<(bool, XdpModeSetting)> {
    match dp.attach(iface, xdp_mode(mode), pin_dir, afresh) {
        Ok(adopted) => Ok((adopted, mode)),
        Err(e) if afresh && mode != XdpModeSetting::Generic => {
            let adopted = dp
                .attach(iface, XdpMode::Skb, pin_dir, false)
                .with_context(|| format!("attaching XDP to {iface}"))?;
            error!(iface = %iface, xdp_mode = mode_name(mode), "attaching in xdp_mode failed ({e}); attached generic instead: fix xdp_mode or the interface");
            Ok((adopted, XdpModeSetting::Generic))
        }
        Err(e) => Err(e).with_context(|| format!("attaching XDP to {iface}")),
    }
}

/// Before anything is created: each interface exists and, unless this
/// instance attached to it before (its pinned link), runs no XDP program
/// already (another `lbd` instance's, or anyone's). Otherwise a start
/// would create and pin every map (tens of MiB) and only then fail at
/// attachment with "Device or resource busy".
///
/// Returns the interfaces whose pinned link is to be attached afresh: one
/// that no longer holds its interface (deleted and made again by a driver
/// reload or networkd: replacing the program in such a link fails, and
/// `lbd` could never start again), and one attached in another mode than
/// `xdp_mode` asks (a restart is how that setting changes).
async fn interfaces_free(config: &Config, first: bool) -> Result<Vec<String>> {
    let mut afresh = Vec::new();
    for iface in &config.interfaces {
        let pin = KernelDataplane::link_pin(&config.pin_dir(), iface);
        // The program in this instance's pinned link, if there is one.
        let ours = (!first && pin.exists()).then(|| KernelDataplane::pinned_link_program(&pin));
        let (_, attached) = net::xdp_state(iface)
            .await
            .with_context(|| format!("interfaces: {iface}"))?;
        match (attached, ours) {
            (None, None) => {}
            (Some(a), None) => bail!(
                "interfaces: {iface} already runs XDP program {}{}; stop it first (or `lbd teardown` its instance)",
                a.program,
                other_instance(iface, a.program)
                    .map(|i| format!(", lbd instance `{i}`'s"))
                    .unwrap_or_default()
            ),
            (Some(a), Some(link)) if link != Some(a.program) => bail!(
                "interfaces: {iface} runs XDP program {}, not the one in this instance's pinned link ({}); stop it first",
                a.program,
                pin.display()
            ),
            (None, Some(_)) => {
                warn!(
                    iface = %iface,
                    "the pinned XDP link no longer holds the interface (was it deleted and made again?): attaching afresh"
                );
                afresh.push(iface.clone());
            }
            (Some(a), Some(_)) if !mode_fits(a.mode, config.xdp_mode) => {
                warn!(
                    iface = %iface,
                    running = ?a.mode,
                    xdp_mode = mode_name(config.xdp_mode),
                    "attached in another mode than xdp_mode: attaching afresh (packets reach the kernel's stack for a moment)"
                );
                afresh.push(iface.clone());
            }
            (Some(_), Some(_)) => {}
        }
    }
    Ok(afresh)
}

/// Whether a program attached in `mode` is what `want` asks for.
fn mode_fits(mode: net::XdpAttachMode, want: XdpModeSetting) -> bool {
    match want {
        XdpModeSetting::Native => mode == net::XdpAttachMode::Driver,
        XdpModeSetting::Generic => mode == net::XdpAttachMode::Generic,
        XdpModeSetting::Auto => true,
    }
}

/// The `lbd` instance whose pinned link for `iface` runs program `id`.
fn other_instance(iface: &str, id: u32) -> Option<String> {
    let root = std::path::Path::new("/sys/fs/bpf/lb");
    std::fs::read_dir(root).ok()?.flatten().find_map(|dir| {
        let link = KernelDataplane::link_pin(&dir.path(), iface);
        let prog = KernelDataplane::pinned_link_program(&link)?;
        (prog == id).then(|| dir.file_name().to_string_lossy().into_owned())
    })
}

/// Writes the whole log of a verifier's refusal beside the state file
/// (the message names it and carries only its last lines).
fn keep_verifier_log(mut e: anyhow::Error, config: &Config) -> anyhow::Error {
    if let Some(lb::dataplane::DataplaneError::Verifier(rejection)) =
        e.downcast_mut::<lb::dataplane::DataplaneError>()
    {
        let path = config.state_file.with_file_name(format!(
            "{}.verifier-{}.log",
            config.instance, rejection.program
        ));
        if let Err(io) = rejection.save(&path) {
            warn!(path = %path.display(), "cannot write the verifier's log: {io}");
        }
    }
    e
}

async fn start_locked(
    config_path: PathBuf,
    (target, file, revisions, desired): (Target, FileRead, RevisionStore, lb::tier::Desired),
    (lock, hz): (lb::DirLock, HzTask),
    afresh: &[String],
) -> Result<Started> {
    let config = &target.config;
    let tier_name = crate::tier::name(config)?;
    let pin_dir = config.pin_dir();
    let (dp, maps_adopted) = KernelDataplane::open_pinned(config.layout, &pin_dir)
        .with_context(|| format!("loading the XDP program (pins in {})", pin_dir.display()))?;
    let mut reconciler = Reconciler::adopt(dp)?;
    if maps_adopted {
        // Before `attach` puts this lbd's program in the links.
        match KernelDataplane::links_without_ct_key(&pin_dir) {
            Some(links) => reconciler.note_unkeyed_links(links),
            None => info!(
                "cannot tell whether an older version's program ran on these maps (no program \
                 of this version recorded, and the kernel lists another program's maps only \
                 with CAP_SYS_ADMIN): after a downgrade, established IPv6 flows are picked \
                 again once"
            ),
        }
    }
    warn_dropped_vips(&reconciler, &target);
    // Room in the (adopted) maps before the settings are written: a start
    // that cannot apply must leave the running program as it found it.
    reconciler
        .check_room(&target.effective())
        .with_context(|| {
            format!(
                "the configuration does not fit the maps pinned in {}",
                pin_dir.display()
            )
        })?;
    let resolved = resolve_gateway(config).await?;
    let gateway = GatewayWatch::start(config, resolved);
    let mut settings = datapath_settings(config, resolved.1);
    settings.hash_key = hash_key_of(config)?;
    settings.kernel_hz = kernel_hz(hz).await;
    reconciler.apply_settings(&settings)?;
    // A trace of an lbd that died mid-trace ends here.
    reconciler.set_trace(None)?;

    let (probe_tx, probes) = mpsc::channel(1024);
    let mut daemon = Daemon::new(
        config_path,
        target,
        reconciler,
        settings,
        Probes::real(probe_tx),
        Announcers::real_with(pin_dir.clone(), maps_adopted),
        revisions,
    );
    daemon.started_with(
        maps_adopted,
        file.digest,
        gateway.as_ref().map(|g| g.state.borrow().clone()),
    );
    daemon.seed_verdicts();
    daemon.resume_drain();
    // Maps first, attachment second: the first packet sees the full state.
    let effective = daemon.effective();
    let report = daemon.program(&effective, true)?;
    info!(?report, adopted = maps_adopted, "dataplane programmed");
    attach(&mut daemon, afresh)?;
    // Announce only now: the maps are written and the program attached.
    daemon.start_announcers()?;
    daemon.announce();
    daemon.start_revision();
    daemon.resume_probation();
    let tier = TierLink::start(&mut daemon, tier_name, desired);
    Ok(Started {
        daemon,
        gateway,
        probes,
        tier,
        _lock: lock,
    })
}

/// [`lb::kernel_hz`] on a blocking thread.
type HzTask = tokio::task::JoinHandle<Option<(u32, String)>>;

/// The kernel's HZ, which sizes the datapath's windows (a minute of
/// protection for a live flow's entry, 10 s for a SYN to stay recent) in
/// its clock's ticks; logged, or warned about when it cannot be learnt.
async fn kernel_hz(task: HzTask) -> Option<u32> {
    let found = task.await.ok().flatten();
    match &found {
        Some((hz, from)) => info!(hz, from = %from, "kernel tick rate"),
        None => warn!("{}", lb::HZ_UNKNOWN),
    }
    found.map(|(hz, _)| hz)
}

/// The loop: one event at a time until a second stop signal or the end
/// of the grace period after the first.
/// What feeds the loop besides requests, probes and signals.
struct Feeds<'f> {
    signals: &'f mut Signals,
    attachments: &'f mut Attachments,
    gateway: &'f mut Option<GatewayWatch>,
    tier: &'f mut Option<TierLink>,
    traced: &'f mut TracedTask,
}

/// `lb_xdp_trace` being verified on a thread of its own (`None` once it
/// came).
type TracedTask = Option<oneshot::Receiver<lb::dataplane::Result<TracedProgram>>>;

/// Verifies the traced build apart, once `lbd` serves: `lbctl trace`
/// then only swaps links, no verifier run holds up the loop (and its
/// watchdog pings), and a start does not wait for it (it took a minute of
/// a two-minute start in an emulated guest). A plain thread, not Tokio's
/// blocking pool: the runtime waits for those when `lbd` exits, and a stop
/// soon after a start would then wait for the verifier (systemd's
/// watchdog killed one so in the 6.1 guest).
fn verify_traced(
    daemon: &mut Daemon<KernelDataplane>,
) -> oneshot::Receiver<lb::dataplane::Result<TracedProgram>> {
    let (layout, pins) = (daemon.config().layout, daemon.config().pin_dir());
    daemon.dataplane_mut().verifying_traced(true);
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("verify-traced".into())
        .spawn(move || {
            let _ = tx.send(KernelDataplane::verify_traced(layout, &pins));
        });
    if let Err(e) = spawned {
        // The sender went with the closure: the loop hears of it at once.
        error!("cannot start the thread that verifies lb_xdp_trace: {e}");
    }
    rx
}

/// The traced build, when its verification ends (never, once it has).
async fn traced_done(task: &mut TracedTask) -> Result<TracedProgram> {
    let Some(rx) = task.as_mut() else {
        return std::future::pending().await;
    };
    let received = rx.await;
    *task = None;
    Ok(received??)
}

/// Hands the traced build to the dataplane; if it failed, `lbctl trace`
/// verifies it when asked (and says why it cannot).
fn adopt_traced(daemon: &mut Daemon<KernelDataplane>, traced: Result<TracedProgram>) {
    match traced {
        Ok(program) => {
            daemon.dataplane_mut().adopt_traced(program);
            info!("lb_xdp_trace verified: lbctl trace is ready");
        }
        Err(e) => {
            daemon.dataplane_mut().verifying_traced(false);
            error!("verifying lb_xdp_trace failed (lbctl trace will try again): {e:#}");
        }
    }
}

/// Every probe result queued behind `first` too: one re-plan for all.
fn on_probes(
    daemon: &mut Daemon<KernelDataplane>,
    first: (lb::daemon::ProbeId, lb::ProbeResult),
    probes: &mut mpsc::Receiver<(lb::daemon::ProbeId, lb::ProbeResult)>,
) {
    let mut batch = vec![first];
    while batch.len() < PROBE_BATCH
        && let Ok(more) = probes.try_recv()
    {
        batch.push(more);
    }
    daemon.on_probe_results(batch);
}

async fn serve(
    daemon: &mut Daemon<KernelDataplane>,
    Feeds {
        signals,
        attachments,
        gateway,
        tier,
        traced,
    }: Feeds<'_>,
    mut probes: mpsc::Receiver<(lb::daemon::ProbeId, lb::ProbeResult)>,
    mut calls: mpsc::Receiver<Call>,
) -> Result<()> {
    let mut sample_tick = tokio::time::interval(SAMPLE_EVERY);
    let mut attachment_tick = tokio::time::interval(ATTACHMENT_CHECK_EVERY);
    let (parsed_tx, mut parsed_rx) = mpsc::channel::<ParsedReload>(4);
    // The newest read of the file that was applied (or refused).
    let mut newest_read = 0;
    let watchdog = crate::notify::watchdog();
    // Set by the first SIGTERM/SIGINT: when the grace period ends.
    let mut stop_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            Some((envelope, reply)) = calls.recv() => {
                fed(watchdog, on_call(daemon, envelope, reply, tier, &parsed_tx)).await
            }
            _ = signals.hup.recv() => {
                info!("SIGHUP: reloading");
                let options = ChangeOptions::default();
                let keep = (applied(tier), Via::Operator);
                ParsedReload::start(daemon.config_path(), keep, false, options, None, &parsed_tx);
            }
            Some(parsed) = parsed_rx.recv() => {
                let reload = apply_reload(daemon, tier, parsed, &parsed_tx, &mut newest_read);
                fed(watchdog, reload).await
            }
            feed = TierLink::next(tier) => on_feed(daemon, tier, feed, &parsed_tx),
            Some(first) = probes.recv() => on_probes(daemon, first, &mut probes),
            done = traced_done(traced) => adopt_traced(daemon, done),
            _ = sample_tick.tick() => {
                daemon.tick();
                if watchdog.is_some() {
                    crate::notify::alive();
                }
            }
            state = GatewayWatch::changed(gateway) => daemon.on_gateway(state),
            _ = attachment_tick.tick() => check_attachments(daemon, attachments).await,
            _ = signals.term.recv() => match daemon.begin_stop("SIGTERM") {
                Some(wait) => {
                    crate::notify::stopping();
                    stop_at = Some(tokio::time::Instant::now() + wait);
                }
                None => return Ok(()),
            },
            _ = signals.int.recv() => match daemon.begin_stop("SIGINT") {
                Some(wait) => {
                    crate::notify::stopping();
                    stop_at = Some(tokio::time::Instant::now() + wait);
                }
                None => return Ok(()),
            },
            _ = until(daemon.graceful_deadline().map(tokio::time::Instant::from_std)) => {
                daemon.end_graceful_shutdown();
            }
            _ = until(stop_at) => return Ok(()),
        }
        // A change on probation that came due is reverted now, and a
        // desired state refused meanwhile tried again.
        let probation = daemon.on_probation();
        fed(watchdog, daemon.settle()).await;
        if probation && !daemon.on_probation() {
            retry_tier(daemon, tier, &parsed_tx);
        }
        if let Some(link) = tier.as_mut() {
            link.publish(daemon);
        }
        if let Some(resolved) = daemon.take_regateway() {
            *gateway = GatewayWatch::start(daemon.config(), resolved);
        }
    }
}

/// The longest [`fed`] tells the watchdog a step is alive: above the
/// longest bounded wait (an exec announcer's minute of withdrawals).
const FED_AT_MOST: std::time::Duration = std::time::Duration::from_secs(180);

/// Awaits `step`, a step of the loop that may wait on the world outside
/// (a change of `announce:` waits for the old announcers' withdrawals:
/// exec commands up to a minute), telling systemd's watchdog every second
/// meanwhile that the loop waits and has not stalled. Every such wait is
/// bounded by its own limit; past [`FED_AT_MOST`] the watchdog is left to
/// judge (a step that never ends is a hung loop).
async fn fed<T>(
    watchdog: Option<std::time::Duration>,
    step: impl std::future::Future<Output = T>,
) -> T {
    if watchdog.is_none() {
        return step.await;
    }
    let mut step = std::pin::pin!(step);
    let mut beat = tokio::time::interval(std::time::Duration::from_secs(1));
    beat.tick().await;
    let until = tokio::time::Instant::now() + FED_AT_MOST;
    loop {
        tokio::select! {
            out = &mut step => return out,
            at = beat.tick() => if at < until {
                crate::notify::alive();
            },
        }
    }
}

/// An API request: reloads and diffs are read off the loop, everything
/// else is answered here.
async fn on_call(
    daemon: &mut Daemon<KernelDataplane>,
    envelope: lb::api::Envelope,
    reply: oneshot::Sender<Response>,
    tier: &mut Option<TierLink>,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    let options = envelope.change;
    let desired = applied(tier);
    match envelope.request {
        Request::Reload { force } if !daemon.stopping() => {
            let path = daemon.config_path();
            let forced = tier
                .as_ref()
                .filter(|_| force && !options.dry_run)
                .and_then(|link| crate::tier::forced(daemon, link));
            let (desired, via) = match forced {
                Some((latest, via)) => (Some(latest), via),
                None => (desired, Via::Operator),
            };
            ParsedReload::start(path, (desired, via), force, options, Some(reply), parsed);
        }
        Request::Tier(lb::api::TierRequest::Rollout { .. }) if options.confirm_within.is_some() => {
            let why = "--confirm-within does not apply to a rollout: its holds and gates take a failed candidate back";
            let _ = reply.send(Response::err(lb::api::ErrorKind::BadRequest, why));
        }
        Request::Tier(lb::api::TierRequest::Rollout {
            abort,
            text,
            canary,
            waves,
            hold,
            ..
        }) => {
            let ask = crate::tier::RolloutAsk {
                abort,
                text,
                canary,
                waves,
                hold,
                dry_run: options.dry_run,
            };
            crate::tier::rollout_request(daemon, tier.as_ref(), ask, reply);
        }
        Request::Diff { file, strict } => {
            let path = file.unwrap_or_else(|| daemon.config_path().to_path_buf());
            let desired = crate::tier::newest(tier.as_ref()).or(desired);
            let options = ChangeOptions {
                dry_run: true,
                ..options
            };
            ParsedReload::start(
                &path,
                (desired, Via::Diff),
                !strict,
                options,
                Some(reply),
                parsed,
            );
        }
        Request::History { last } if options.is_default() => {
            // One at a time: each holds a revision (up to 16 MiB) while
            // it reads, and 64 clients could ask at once.
            static ONE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
            let job = daemon.history_job(last);
            tokio::spawn(async move {
                let _turn = ONE.acquire().await;
                if let Ok(answer) = tokio::task::spawn_blocking(job).await {
                    let _ = reply.send(answer);
                }
            });
        }
        request => answer_here(daemon, (request, options), reply, tier, parsed).await,
    }
}

/// A request the daemon answers itself. A change on probation confirmed
/// or reverted (`lbctl confirm`, `lbctl revert`): a desired state refused
/// while it awaited confirmation is tried again.
async fn answer_here(
    daemon: &mut Daemon<KernelDataplane>,
    (request, options): (Request, ChangeOptions),
    reply: oneshot::Sender<Response>,
    tier: &mut Option<TierLink>,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    let confirm = matches!(request, Request::Confirm | Request::Revert { .. });
    let answer = daemon.handle(request, options).await;
    if confirm && answer.ok {
        retry_tier(daemon, tier, parsed);
    }
    let _ = reply.send(answer);
}

/// The tier's newest desired state tried again, if it was refused here
/// ([`crate::tier::retry_newest`]).
fn retry_tier(
    daemon: &mut Daemon<KernelDataplane>,
    tier: &mut Option<TierLink>,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    if let Some(link) = tier.as_mut()
        && let Some(retry) = crate::tier::retry_newest(daemon, link)
    {
        start_reloads(daemon, vec![retry], parsed);
    }
}

/// The desired state the running configuration was composed with.
fn applied(tier: &Option<TierLink>) -> Option<lb::tier::Desired> {
    tier.as_ref().map(|t| t.applied.clone())
}

/// The tier's feed: an event of the etcd task, or the rollout's tick.
fn on_feed(
    daemon: &mut Daemon<KernelDataplane>,
    tier: &mut Option<TierLink>,
    feed: Feed,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    let Some(link) = tier.as_mut() else { return };
    match feed {
        Feed::Event(event) => {
            on_tier(daemon, link, event, parsed);
            link.urgent = true;
        }
        Feed::Tick => {
            let steps = daemon.rollout_tick(crate::tier::rollout_now());
            let reloads = crate::tier::run_steps(daemon, link, steps);
            start_reloads(daemon, reloads, parsed);
        }
    }
}

/// Starts the reloads a rollout asked for (an apply, a revert).
fn start_reloads(
    daemon: &Daemon<KernelDataplane>,
    reloads: Vec<crate::tier::Reload>,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    for (desired, via) in reloads {
        let path = daemon.config_path().to_path_buf();
        let options = ChangeOptions::default();
        ParsedReload::start(&path, (Some(desired), via), false, options, None, parsed);
    }
}

/// What the etcd task said: a new desired state is read with the file
/// off the loop and applied as a reload; the rest is the daemon's to
/// know.
fn on_tier(
    daemon: &mut Daemon<KernelDataplane>,
    link: &mut TierLink,
    event: lb::tier::Event,
    parsed: &mpsc::Sender<ParsedReload>,
) {
    use lb::tier::Event;
    match event {
        Event::Link(up) => daemon.on_tier_link(up),
        Event::Members(members) => daemon.on_tier_members(members),
        Event::Rollout(record) => daemon.on_rollout(record),
        Event::Progress(progress) => daemon.on_rollout_progress(progress),
        Event::DesiredDeleted(revision) => {
            // Nothing to retry or compose with: etcd holds none.
            link.latest = None;
            daemon.tier_desired_absent(revision);
        }
        Event::Desired(Err((revision, why))) => daemon.tier_unreadable(revision, why),
        Event::Desired(Ok(desired)) => {
            link.latest = Some(desired.clone());
            if daemon.tier_should_apply(desired.revision) {
                info!(
                    revision = desired.revision,
                    "etcd: a new desired state; applying it"
                );
                let path = daemon.config_path().to_path_buf();
                let options = ChangeOptions::default();
                ParsedReload::start(
                    &path,
                    (Some(desired), Via::Desired),
                    false,
                    options,
                    None,
                    parsed,
                );
            }
        }
    }
}

/// Applies a reload (or a diff) read off the loop and answers `lbctl`
/// (SIGHUP's outcome is logged).
async fn apply_reload(
    daemon: &mut Daemon<KernelDataplane>,
    tier: &mut Option<TierLink>,
    parsed: ParsedReload,
    again: &mpsc::Sender<ParsedReload>,
    newest_read: &mut u64,
) {
    let Some(parsed) = current(daemon, tier, parsed, again) else {
        return;
    };
    let dry_run = parsed.options.dry_run;
    if !dry_run && superseded(parsed.read, *newest_read) {
        info!(
            "the file was read again, and applied, while this read of it was parsed; reading it once more"
        );
        let via = (parsed.desired, parsed.via);
        let (force, options) = (parsed.force, parsed.options);
        ParsedReload::start(&parsed.path, via, force, options, parsed.reply, again);
        return;
    }
    if !dry_run {
        *newest_read = (*newest_read).max(parsed.read);
    }
    let change = match (&parsed.via, &parsed.file) {
        (Via::Candidate(_), Ok(file)) => {
            Some(lb::daemon::explain_change(daemon.config(), &file.config))
        }
        _ => None,
    };
    let result = daemon
        .reload(parsed.file, parsed.force, &parsed.options)
        .await;
    if let (Some(link), Some(desired)) = (tier.as_mut(), parsed.desired) {
        let forceable = matches!(&result, Err(e) if matches!(e.kind(), lb::api::ErrorKind::NeedsForce | lb::api::ErrorKind::Blackhole));
        let refused_here = (
            desired.revision,
            matches!(parsed.via, Via::Desired) && !dry_run,
        );
        let outcome = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
        let reloads = crate::tier::after_reload(
            daemon,
            link,
            (desired, parsed.via, dry_run),
            (outcome, change),
        );
        if forceable && refused_here.1 {
            daemon.tier_refusal_forceable(refused_here.0);
        }
        start_reloads(daemon, reloads, again);
    }
    match (parsed.reply, result) {
        (Some(reply), Ok(committed)) => {
            let _ = reply.send(Response::ok(committed));
        }
        (Some(reply), Err(e)) => {
            let _ = reply.send(e.response());
        }
        (None, Err(e)) => error!("reload failed, keeping the running configuration: {e}"),
        (None, Ok(committed)) => {
            if let Some(note) = committed.note {
                info!("{note}");
            }
        }
    }
    give_back_memory();
}

/// `parsed` if its desired state is still current ([`crate::tier::stale`]);
/// otherwise what replaces it is done here: dropped, composed again, or
/// the rollout told its candidate was superseded.
fn current(
    daemon: &mut Daemon<KernelDataplane>,
    tier: &mut Option<TierLink>,
    parsed: ParsedReload,
    again: &mpsc::Sender<ParsedReload>,
) -> Option<ParsedReload> {
    use crate::tier::Stale;
    let (Some(link), Some(desired)) = (tier.as_mut(), parsed.desired.as_ref()) else {
        return Some(parsed);
    };
    let latest_refused = link
        .latest
        .as_ref()
        .is_some_and(|l| daemon.tier_refused(l.revision));
    let stale = crate::tier::stale(
        (link.latest.as_ref(), latest_refused, &link.applied),
        desired,
        &parsed.via,
    );
    match stale {
        None => Some(parsed),
        Some(Stale::Drop) => {
            info!(
                revision = desired.revision,
                "etcd: a newer desired state was read while this one was parsed; applying that one"
            );
            if let Some(reply) = parsed.reply {
                // `lbctl reload --force` of a refused state: said, not
                // dropped as an internal error.
                let _ = reply.send(Response::err(
                    lb::api::ErrorKind::Conflict,
                    "a newer desired state was read from etcd while this reload was parsed; it is applied instead (lbctl tier status): run it again if that one is refused too",
                ));
            }
            None
        }
        Some(Stale::Again(applied)) => {
            let via = (Some(applied), parsed.via);
            ParsedReload::start(
                &parsed.path,
                via,
                parsed.force,
                parsed.options,
                parsed.reply,
                again,
            );
            None
        }
        Some(Stale::Superseded(id)) => {
            daemon.rollout_superseded(id);
            None
        }
    }
}

/// Hands the heap's free memory back to the kernel. A reload, check or
/// preview of a big file (a 10 MB file of 150,000 VIPs parses into
/// hundreds of MB) frees it all when done, but the allocator keeps the
/// pages: `lbd` would stay at its peak for good.
fn give_back_memory() {
    // SAFETY: malloc_trim only releases free heap pages; no pointer is
    // involved.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The end of a graceful stop: announcers shut down (Cease), probers
/// stopped, and the program detached if so configured.
async fn finish(mut daemon: Daemon<KernelDataplane>) -> Result<()> {
    daemon.stop_trace();
    daemon.stop_announcers().await;
    daemon.stop_probes();
    let config = daemon.config();
    if config.detach_on_exit {
        crate::remove_pins(config)?;
        info!(
            pins = %config.pin_dir().display(),
            "lbd exiting; detached and pins removed (detach_on_exit)"
        );
    } else {
        info!(
            pins = %config.pin_dir().display(),
            "lbd exiting; the XDP program stays attached and keeps forwarding (`lbd teardown` removes it)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads are numbered as they start: a later read saw the file as new
    /// or newer, so only an earlier one than the newest that ran is too
    /// late; the same read (a reload composed again) or a later one is not.
    #[test]
    fn a_read_older_than_the_newest_that_ran_is_superseded() {
        let first = READS.fetch_add(1, Ordering::Relaxed) + 1;
        let second = READS.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(second > first);
        assert!(superseded(first, second));
        assert!(!superseded(second, second));
        assert!(!superseded(second, first));
        assert!(!superseded(first, 0), "nothing ran yet");
    }
}

//! `lbd`'s end of a tier in etcd ([`lb::tier`]): the desired state to
//! start from (what the last revision ran, so a restart while etcd is
//! away serves what it served), the etcd task, and the report it
//! publishes. A desired state is applied as a reload of the file
//! composed with it (see `run.rs`), so it is checked, guarded, previewed
//! and recorded like any other change.

use anyhow::{Context as _, Result, bail};
use lb::{
    config::{Config, source::valid_name},
    daemon::{Daemon, FileRead},
    dataplane::kernel::KernelDataplane,
    revisions::RevisionStore,
    tier::{Desired, Report, client},
};
use tokio::sync::{mpsc, watch};

/// The link to the tier's etcd, while `lbd` runs with `source.etcd`.
pub struct TierLink {
    events: mpsc::Receiver<client::Event>,
    reports: watch::Sender<Option<Report>>,
    task: tokio::task::JoinHandle<()>,
    /// The desired state the running configuration was composed with (a
    /// reload of the file composes with it again).
    pub applied: Desired,
    /// When the report was last computed, and whether something the
    /// tier must hear of at once happened since.
    computed: std::time::Instant,
    pub urgent: bool,
}

impl Drop for TierLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// No desired state yet: a first start serves no VIP until etcd says.
pub fn nothing() -> Desired {
    Desired {
        revision: 0,
        text: "vips: []\n".into(),
    }
}

/// This balancer's name in the tier: `source.etcd.name`, or the host
/// name. The TLS files are checked here too (the key private), before
/// anything starts.
pub fn name(config: &Config) -> Result<String> {
    let Some(source) = &config.source else {
        return Ok(String::new());
    };
    let files = source.check_files();
    if !files.is_empty() {
        return Err(lb::config::ConfigErrors {
            source_name: None,
            errors: files,
        }
        .into());
    }
    let name = match &source.name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("source.etcd.name is unset and the host name cannot be read")?
            .trim()
            .to_string(),
    };
    if !valid_name(&name) {
        bail!("source.etcd.name: the host name `{name}` is not a valid balancer name; set one");
    }
    Ok(name)
}

/// The desired state to start from: the `vips:` of the newest revision
/// that ran, with the etcd revision of the newest one that came from
/// etcd (so a restart while etcd is away serves what it served).
pub fn start_from(store: &RevisionStore) -> Desired {
    let Ok(Some(newest)) = store.latest_applied(None) else {
        return nothing();
    };
    let revision = store
        .numbers()
        .unwrap_or_default()
        .iter()
        .rev()
        .filter_map(|n| store.get(*n).ok())
        .filter(|r| r.applied())
        .find_map(|r| lb::tier::revision_of_origin(&r.source));
    match (newest.config, revision) {
        (Some(text), Some(revision)) => {
            Desired::from_config_text(revision, &text).unwrap_or_else(nothing)
        }
        _ => nothing(),
    }
}

/// The file composed with `desired` when the VIPs come from etcd, the
/// file as it is otherwise.
pub fn compose(
    file: FileRead,
    desired: Option<&Desired>,
) -> Result<FileRead, lb::config::ConfigErrors> {
    if file.config.source.is_none() {
        return Ok(file);
    }
    file.with_desired(desired.unwrap_or(&nothing()))
}

impl TierLink {
    /// Starts the etcd task when the configuration has `source.etcd`.
    pub fn start(
        daemon: &mut Daemon<KernelDataplane>,
        name: String,
        applied: Desired,
    ) -> Option<TierLink> {
        let source = daemon.config().source.clone()?;
        daemon.metrics().tier_configured.set(1);
        daemon.tier_started(
            name.clone(),
            (applied.revision > 0).then_some(applied.revision),
        );
        let (tx, events) = mpsc::channel(16);
        let (reports, rx) = watch::channel(daemon.tier_report());
        let task = client::spawn(source, name, tx, rx);
        Some(TierLink {
            events,
            reports,
            task,
            applied,
            computed: std::time::Instant::now(),
            urgent: false,
        })
    }

    /// The task's next event (never, without a tier).
    pub async fn next(link: &mut Option<TierLink>) -> client::Event {
        if let Some(l) = link
            && let Some(event) = l.events.recv().await
        {
            return event;
        }
        std::future::pending().await
    }

    /// Hands the task this balancer's report when it changed: computed
    /// at most once a second (every event would otherwise walk every
    /// VIP), at once after a change of the tier's.
    pub fn publish(&mut self, daemon: &mut Daemon<KernelDataplane>) {
        if !self.urgent && self.computed.elapsed() < std::time::Duration::from_secs(1) {
            return;
        }
        self.urgent = false;
        self.computed = std::time::Instant::now();
        let report = daemon.tier_report();
        self.reports.send_if_modified(|r| {
            let changed = *r != report;
            if changed {
                *r = report;
            }
            changed
        });
    }
}

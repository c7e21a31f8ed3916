//! The task that talks to etcd for `lbd`, off the daemon's loop. One
//! session at a time: connect (TLS when configured), record this
//! balancer as a member, take a lease, read the whole prefix, then watch
//! it from the revision read, keep the lease alive, and publish this
//! balancer's report whenever it changes. Whatever fails (a timeout, a
//! lost lease, a cancelled watch) ends the session: the daemon hears that
//! the link is down and keeps what it runs, and the task starts again
//! after a pause (1 s, doubling to 10 s).
//!
//! Everything read is bounded: a desired state of more than
//! [`MAX_DESIRED_BYTES`](crate::config::source::MAX_DESIRED_BYTES) is handed on as an error to refuse, reports of
//! more than [`MAX_REPORT_BYTES`] are unreadable, members beyond
//! [`MAX_BALANCERS`] are ignored.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, KeyValue, PutOptions,
    TlsOptions, WatchOptions,
};
use tokio::{
    sync::{mpsc, watch},
    time::{Instant, timeout},
};
use tracing::{info, warn};

use super::{Desired, Keys, MAX_BALANCERS, MAX_REPORT_BYTES, Member, Report, TierKey};
use crate::config::source::EtcdSource;

/// What the task tells the daemon.
#[derive(Debug)]
pub enum Event {
    /// Connected (with the cluster's revision), or not and why.
    Link(Result<i64, String>),
    /// The desired state changed (or was read at connection); an error
    /// is a value that cannot be one (too large, not UTF-8).
    Desired(Result<Desired, (i64, String)>),
    /// The desired key was deleted: nothing changes, and it is said.
    DesiredDeleted(i64),
    /// Every member and its report, after any of them changed.
    Members(Vec<Member>),
}

/// Starts the task; it runs until `events` is closed.
pub fn spawn(
    source: EtcdSource,
    name: String,
    events: mpsc::Sender<Event>,
    reports: watch::Receiver<Option<Report>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(source, name, events, reports))
}

async fn run(
    source: EtcdSource,
    name: String,
    events: mpsc::Sender<Event>,
    mut reports: watch::Receiver<Option<Report>>,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        let mut session = Session {
            source: &source,
            keys: Keys::new(&source),
            name: &name,
            events: &events,
            members: BTreeMap::new(),
        };
        let error = session.run(&mut reports).await;
        if events.is_closed() {
            return;
        }
        warn!("etcd: {error}; keeping the applied state, trying again in {pause:?}");
        if events.send(Event::Link(Err(error))).await.is_err() {
            return;
        }
        if started.elapsed() > Duration::from_secs(30) {
            pause = Duration::from_secs(1);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// A member as last read: its report's bytes, or none.
type Seen = BTreeMap<String, Option<Result<Report, String>>>;

/// A session's connection: the client, its lease and the watch.
struct Open {
    client: Client,
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    alive: etcd_client::LeaseKeepAliveStream,
    watch: etcd_client::WatchStream,
}

struct Session<'s> {
    source: &'s EtcdSource,
    keys: Keys,
    name: &'s str,
    events: &'s mpsc::Sender<Event>,
    members: Seen,
}

impl Session<'_> {
    /// One session, until something fails: what failed.
    async fn run(&mut self, reports: &mut watch::Receiver<Option<Report>>) -> String {
        match self.try_run(reports).await {
            Ok(()) => "the daemon stopped".into(),
            Err(e) => e,
        }
    }

    /// Connects, records the member, takes the lease, reads the prefix
    /// (handing the desired state and the members on) and starts the
    /// watch from the revision read.
    async fn open(&mut self) -> Result<Open, String> {
        let wait = self.source.timeout;
        let mut client = bounded(wait, "connecting", connect(self.source)).await?;
        let member = self.keys.member(self.name);
        bounded(
            wait,
            "recording the member",
            client.put(member, self.name, None),
        )
        .await?;
        let ttl = self.source.lease.as_secs() as i64;
        let lease = bounded(wait, "taking a lease", client.lease_grant(ttl, None))
            .await?
            .id();
        let (keeper, alive) =
            bounded(wait, "keeping the lease", client.lease_keep_alive(lease)).await?;
        let all = self.keys.all();
        let got = bounded(
            wait,
            "reading the tier",
            client.get(all.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let revision = got.header().map_or(0, |h| h.revision());
        info!(
            revision,
            lease, "etcd: connected to the tier at {}", self.source.prefix
        );
        self.send(Event::Link(Ok(revision))).await?;
        let mut desired = None;
        for kv in got.kvs() {
            if let Some(event) = self.on_put(kv) {
                desired = Some(event);
            }
        }
        self.send(desired.unwrap_or(Event::DesiredDeleted(revision)))
            .await?;
        self.send_members().await?;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let watch = bounded(wait, "watching the tier", client.watch(all, Some(options))).await?;
        Ok(Open {
            client,
            lease,
            keeper,
            alive,
            watch,
        })
    }

    async fn try_run(
        &mut self,
        reports: &mut watch::Receiver<Option<Report>>,
    ) -> Result<(), String> {
        let wait = self.source.timeout;
        let Open {
            mut client,
            lease,
            mut keeper,
            mut alive,
            mut watch,
        } = self.open().await?;
        let mut published: Option<Report> = None;
        reports.mark_changed();
        let mut renew = tokio::time::interval(self.source.lease / 3);
        let mut last_alive = Instant::now();
        loop {
            tokio::select! {
                message = watch.message() => {
                    let response = message
                        .map_err(|e| format!("the watch failed: {e}"))?
                        .ok_or("the watch ended")?;
                    if response.canceled() {
                        return Err(format!("the watch was cancelled: {}", response.cancel_reason()));
                    }
                    self.on_watch(response.events()).await?;
                }
                _ = renew.tick() => {
                    if last_alive.elapsed() > self.source.lease {
                        return Err("the lease was not renewed in time".into());
                    }
                    bounded(wait, "renewing the lease", keeper.keep_alive()).await?;
                }
                answer = alive.message() => {
                    match answer.map_err(|e| format!("renewing the lease: {e}"))? {
                        Some(a) if a.ttl() > 0 => last_alive = Instant::now(),
                        _ => return Err("the lease expired".into()),
                    }
                }
                changed = reports.changed() => {
                    changed.map_err(|_| "the daemon stopped")?;
                    let report = reports.borrow_and_update().clone();
                    if let Some(report) = report.filter(|r| published.as_ref() != Some(r)) {
                        let json = serde_json::to_vec(&report).map_err(|e| e.to_string())?;
                        let key = self.keys.balancer(self.name);
                        let put = client.put(key, json, Some(PutOptions::new().with_lease(lease)));
                        bounded(wait, "publishing the report", put).await?;
                        published = Some(report);
                    }
                }
            }
        }
    }

    async fn send(&self, event: Event) -> Result<(), String> {
        self.events
            .send(event)
            .await
            .map_err(|_| "the daemon stopped".to_string())
    }

    async fn send_members(&self) -> Result<(), String> {
        let members = self
            .members
            .iter()
            .map(|(name, report)| Member {
                name: name.clone(),
                report: report.as_ref().and_then(|r| r.as_ref().ok().cloned()),
                unreadable: report.as_ref().and_then(|r| r.as_ref().err().cloned()),
            })
            .collect();
        self.send(Event::Members(members)).await
    }

    async fn on_watch(&mut self, events: &[etcd_client::Event]) -> Result<(), String> {
        let mut members_changed = false;
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let Ok(key) = kv.key_str() else { continue };
            match (event.event_type(), self.keys.classify(key)) {
                (EventType::Put, Some(TierKey::Desired)) => {
                    if let Some(e) = self.on_put(kv) {
                        self.send(e).await?;
                    }
                }
                (EventType::Delete, Some(TierKey::Desired)) => {
                    self.send(Event::DesiredDeleted(kv.mod_revision())).await?
                }
                (EventType::Put, Some(_)) => {
                    self.on_put(kv);
                    members_changed = true;
                }
                (EventType::Delete, Some(TierKey::Balancer(name))) => {
                    if let Some(seen) = self.members.get_mut(name) {
                        *seen = None;
                    }
                    members_changed = true;
                }
                (EventType::Delete, Some(TierKey::Member(name))) => {
                    self.members.remove(name);
                    members_changed = true;
                }
                _ => {}
            }
        }
        if members_changed {
            self.send_members().await?;
        }
        Ok(())
    }

    /// A key written: the desired state is handed back as an event, a
    /// member or report is kept.
    fn on_put(&mut self, kv: &KeyValue) -> Option<Event> {
        let key = kv.key_str().ok()?;
        match self.keys.classify(key)? {
            TierKey::Desired => Some(Event::Desired(desired(kv))),
            TierKey::Member(name) => {
                if self.members.len() < MAX_BALANCERS || self.members.contains_key(name) {
                    self.members.entry(name.to_string()).or_insert(None);
                } else {
                    warn!("etcd: more than {MAX_BALANCERS} members; {name} is ignored");
                }
                None
            }
            TierKey::Balancer(name) => {
                if let Some(seen) = self.members.get_mut(name) {
                    *seen = Some(report(kv.value()));
                }
                None
            }
        }
    }
}

/// The desired state a key holds, or why it cannot be one.
fn desired(kv: &KeyValue) -> Result<Desired, (i64, String)> {
    let revision = kv.mod_revision();
    let value = kv.value();
    super::check_size(value.len()).map_err(|e| (revision, e))?;
    let text = std::str::from_utf8(value)
        .map_err(|e| (revision, format!("the desired state is not UTF-8: {e}")))?;
    Ok(Desired {
        revision,
        text: Arc::from(text),
    })
}

/// Another balancer's report, or why it cannot be read.
fn report(value: &[u8]) -> Result<Report, String> {
    if value.len() > MAX_REPORT_BYTES {
        return Err(format!(
            "{} bytes, more than {MAX_REPORT_BYTES}",
            value.len()
        ));
    }
    serde_json::from_slice(value).map_err(|e| format!("not a report: {e}"))
}

/// Runs an etcd request for at most `wait`; a failure says what was being
/// done.
async fn bounded<T>(
    wait: Duration,
    doing: &str,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match timeout(wait, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{doing}: {e}")),
        Err(_) => Err(format!("{doing}: no answer within {wait:?}")),
    }
}

/// A client of the source's endpoints, over TLS when configured, with
/// HTTP/2 pings so that a dead connection is noticed within the timeout.
async fn connect(source: &EtcdSource) -> Result<Client, etcd_client::Error> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(source.timeout)
        .with_timeout(source.timeout)
        .with_keep_alive(source.timeout / 2, source.timeout);
    if let Some(tls) = &source.tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| etcd_client::Error::InvalidArgs(format!("{}: {e}", path.display())))
        };
        let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        options = options.with_tls(config);
    }
    Client::connect(&source.endpoints, Some(options)).await
}

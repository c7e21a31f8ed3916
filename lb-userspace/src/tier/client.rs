//! The task that talks to etcd for `lbd`, off the daemon's loop. One
//! session at a time, with one member of the cluster: connect (TLS when
//! configured), record this
//! balancer as a member, take a lease, read the whole prefix, then watch
//! it from the revision read, keep the lease alive, and publish this
//! balancer's report whenever it changes. Whatever fails (a timeout, a
//! lost lease, a cancelled watch) ends the session: the daemon hears that
//! the link is down and keeps what it runs, and the task starts again
//! with the next member ([`Backoff`]: at once, and after a whole round
//! of failures a pause of 1 s, doubling to 10 s).
//!
//! Everything read is bounded: a desired state of more than
//! [`MAX_DESIRED_BYTES`](crate::config::source::MAX_DESIRED_BYTES) is handed on as an error to refuse, reports of
//! more than [`MAX_REPORT_BYTES`] are unreadable, members beyond
//! [`MAX_BALANCERS`] are ignored.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KeyValue, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use tokio::{
    sync::{mpsc, watch},
    time::{Instant, timeout},
};
use tracing::{info, warn};

use super::{
    Desired, Keys, MAX_BALANCERS, MAX_REPORT_BYTES, Member, Report, TierKey,
    rollout::{Progress, Rollout},
};
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
    /// The rollout record (with its modification revision), absent, or
    /// why it cannot be read (with its modification revision).
    Rollout(Option<Result<(Rollout, i64), (i64, String)>>),
    /// Every balancer's progress in a rollout, after any changed.
    Progress(BTreeMap<String, Progress>),
}

/// A write the daemon asks of the task (a rollout's steps). Each answers
/// the revision it was made at, or `None` when a compare-and-swap found
/// the key changed (not an error).
#[derive(Debug)]
pub struct Command {
    pub write: Write,
    pub reply: Option<tokio::sync::oneshot::Sender<Result<Option<i64>, String>>>,
}

impl Command {
    /// Whoever asked for the write stopped waiting for its answer (`lbd`
    /// answers `lbctl` that nothing was written when etcd does not take a
    /// write in time): a command queued while a session ended must not be
    /// written when etcd comes back, maybe hours later.
    pub fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| r.is_closed())
    }
}

#[derive(Debug)]
pub enum Write {
    /// This balancer's progress.
    Progress(Progress),
    /// The rollout record, if it is still at modification revision `at`
    /// (0: absent) and, with `desired_at`, the desired state still at
    /// that revision (0: absent).
    Rollout {
        at: i64,
        desired_at: Option<i64>,
        record: Rollout,
    },
    /// The rollout record marked done and its candidate as the desired
    /// state, in one transaction, if the record is still at `at`.
    Promote { at: i64, record: Rollout },
}

/// Starts the task; it runs until `events` is closed.
/// `(name, instance)` is this balancer's name in the tier and its
/// installation's id ([`super::instance_id`]).
pub fn spawn(
    source: EtcdSource,
    (name, instance): (String, String),
    events: mpsc::Sender<Event>,
    reports: watch::Receiver<Option<Report>>,
    commands: mpsc::Receiver<Command>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(source, (name, instance), events, (reports, commands)))
}

async fn run(
    source: EtcdSource,
    (name, instance): (String, String),
    events: mpsc::Sender<Event>,
    (mut reports, mut commands): (watch::Receiver<Option<Report>>, mpsc::Receiver<Command>),
) {
    let mut backoff = Backoff::new(&source, &name);
    loop {
        let started = Instant::now();
        let endpoint = backoff.endpoint().to_string();
        let mut session = Session {
            source: &source,
            endpoint: &endpoint,
            keys: Keys::new(&source),
            name: &name,
            instance: &instance,
            events: &events,
            members: BTreeMap::new(),
            members_changed: false,
            progress: BTreeMap::new(),
        };
        let error = session.run(&mut reports, &mut commands).await;
        if events.is_closed() {
            return;
        }
        let (next, pause) = backoff.failed(started.elapsed());
        warn!("etcd {endpoint}: {error}; keeping the applied state, trying {next} in {pause:?}");
        if events.send(Event::Link(Err(error))).await.is_err() {
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Which member to talk to next, and after how long. One member per
/// session: a client over several endpoints keeps sending requests to a
/// dead one (a three-member cluster with one member down failed every
/// session), so a session that fails moves to the next member at once,
/// and only a whole round of failures waits (1 s, doubling to 10 s). A
/// balancer starts at a member of its own (by its name), so that a tier
/// spreads over the cluster.
#[derive(Debug)]
struct Backoff {
    endpoints: Vec<String>,
    at: usize,
    failed: usize,
    pause: Duration,
}

impl Backoff {
    fn new(source: &EtcdSource, name: &str) -> Backoff {
        let n = source.endpoints.len().max(1);
        let spread = name.bytes().map(usize::from).sum::<usize>();
        Backoff {
            endpoints: source.endpoints.clone(),
            at: spread % n,
            failed: 0,
            pause: Duration::from_secs(1),
        }
    }

    fn endpoint(&self) -> &str {
        &self.endpoints[self.at % self.endpoints.len()]
    }

    /// A session of `lasted` failed: the member to try next, and the
    /// pause before.
    fn failed(&mut self, lasted: Duration) -> (&str, Duration) {
        if lasted > Duration::from_secs(30) {
            self.failed = 0;
            self.pause = Duration::from_secs(1);
        }
        self.failed += 1;
        self.at = (self.at + 1) % self.endpoints.len();
        let pause = if self.failed < self.endpoints.len() {
            Duration::from_millis(200)
        } else {
            self.failed = 0;
            let pause = self.pause;
            self.pause = (self.pause * 2).min(Duration::from_secs(10));
            pause
        };
        (self.endpoint(), pause)
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
    /// The member this session talks to.
    endpoint: &'s str,
    keys: Keys,
    name: &'s str,
    /// This installation's id, stamped on every report it publishes.
    instance: &'s str,
    events: &'s mpsc::Sender<Event>,
    members: Seen,
    /// A report or member changed since the members were last sent: they
    /// go to the daemon at most every [`MEMBERS_EVERY`], not on every
    /// report a peer puts (each send clones every report).
    members_changed: bool,
    progress: BTreeMap<String, Progress>,
}

/// How often at most the tier's members (every balancer's report) are
/// sent to the daemon. A tier of 256 balancers whose backends flap puts
/// hundreds of reports a second, each of up to 1 MiB.
const MEMBERS_EVERY: Duration = Duration::from_millis(250);

impl Session<'_> {
    /// One session, until something fails: what failed.
    async fn run(
        &mut self,
        reports: &mut watch::Receiver<Option<Report>>,
        commands: &mut mpsc::Receiver<Command>,
    ) -> String {
        match self.try_run(reports, commands).await {
            Ok(()) => "the daemon stopped".into(),
            Err(e) => e,
        }
    }

    /// Connects, records the member, takes the lease, reads the prefix
    /// (handing the desired state and the members on) and starts the
    /// watch from the revision read.
    async fn open(&mut self) -> Result<Open, String> {
        let wait = self.source.timeout;
        let mut client = bounded(wait, "connecting", connect(self.source, self.endpoint)).await?;
        let member = self.keys.member(self.name);
        bounded(
            wait,
            "recording the member",
            client.put(member, self.name, None),
        )
        .await?;
        let all = self.keys.all();
        // Read before the lease is taken: a long paged read must not
        // outlast a lease nothing renews yet.
        let (revision, kvs) = read_prefix(&mut client, &all, wait).await?;
        self.refuse_a_namesake(&kvs)?;
        let ttl = self.source.lease.as_secs() as i64;
        let lease = bounded(wait, "taking a lease", client.lease_grant(ttl, None))
            .await?
            .id();
        let (keeper, alive) =
            bounded(wait, "keeping the lease", client.lease_keep_alive(lease)).await?;
        info!(
            revision,
            lease, "etcd: connected to the tier at {}", self.source.prefix
        );
        let (mut desired, mut rollout) = (None, Event::Rollout(None));
        let mut kvs: Vec<&KeyValue> = kvs.iter().collect();
        self.keys.members_first(&mut kvs, |kv| kv.key_str().ok());
        for kv in kvs {
            match self.on_put(kv) {
                Some(e @ Event::Desired(_)) => desired = Some(e),
                Some(e @ Event::Rollout(_)) => rollout = e,
                _ => {}
            }
        }
        self.send(desired.unwrap_or(Event::DesiredDeleted(revision)))
            .await?;
        self.send(rollout).await?;
        self.send(Event::Progress(self.progress.clone())).await?;
        self.send_members().await?;
        // Connected only once this session's view is in: a rollout step,
        // decided only while connected, decided in between on the last
        // session's record (a candidate aborted meanwhile applied, then
        // reverted a second later).
        self.send(Event::Link(Ok(revision))).await?;
        // A watcher catching up gets up to 1,000 revisions in one answer:
        // fragments (etcd splits an answer over its request limit, 1.5
        // MiB, and each event stands alone, so they are handled as they
        // come) and a decode limit above one fragment, not gRPC's 4 MiB,
        // which a burst of reports passed and ended every session.
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1)
            .with_fragment();
        let mut watcher = client
            .watch_client()
            .max_decoding_message_size(MAX_WATCH_ANSWER);
        let watch = bounded(wait, "watching the tier", watcher.watch(all, Some(options))).await?;
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
        commands: &mut mpsc::Receiver<Command>,
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
        let mut members = tokio::time::interval(MEMBERS_EVERY);
        members.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_alive = Instant::now();
        loop {
            tokio::select! {
                _ = members.tick(), if self.members_changed => {
                    self.members_changed = false;
                    self.send_members().await?;
                }
                message = watch.message() => {
                    let response = message
                        .map_err(|e| format!("the watch failed: {e}"))?
                        .ok_or("the watch ended")?;
                    if response.canceled() {
                        return Err(format!("the watch was cancelled: {}", response.cancel_reason()));
                    }
                    let gone = self.on_watch(response.events()).await?;
                    if gone.report {
                        // This balancer's report deleted by hand (not by
                        // its lease, which ends the session): published
                        // again, or the tier would count it gone.
                        published = None;
                        reports.mark_changed();
                    }
                    if gone.member {
                        self.member_again(&mut client).await?;
                    }
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
                Some(command) = commands.recv() => self.command(&mut client, command).await?,
                changed = reports.changed() => {
                    changed.map_err(|_| "the daemon stopped")?;
                    let report = reports.borrow_and_update().clone();
                    self.publish(&mut client, lease, report, &mut published).await?;
                }
            }
        }
    }

    /// Its member key deleted while it runs (a cleanup aimed at another
    /// box): recorded again, or peers would ignore its reports and leave
    /// it out of rollout plans.
    async fn member_again(&self, client: &mut Client) -> Result<(), String> {
        warn!("etcd: this balancer's member key was deleted while it runs: recorded again");
        let put = client.put(self.keys.member(self.name), self.name, None);
        bounded(self.source.timeout, "recording the member again", put).await?;
        Ok(())
    }

    /// Puts `report` (stamped and cut to size) under the lease unless it
    /// is what was `published` last.
    async fn publish(
        &self,
        client: &mut Client,
        lease: i64,
        report: Option<Report>,
        published: &mut Option<Report>,
    ) -> Result<(), String> {
        let report = report.map(|mut r| {
            r.instance = Some(self.instance.to_string());
            r.bounded()
        });
        let Some(report) = report.filter(|r| published.as_ref() != Some(r)) else {
            return Ok(());
        };
        let cut = |r: &Report| r.down_omitted + r.tables_omitted > 0;
        if cut(&report) && !published.as_ref().is_some_and(cut) {
            warn!(
                down_omitted = report.down_omitted,
                tables_omitted = report.tables_omitted,
                "etcd: this balancer's report is cut to {MAX_REPORT_BYTES} bytes"
            );
        }
        let json = serde_json::to_vec(&report).map_err(|e| e.to_string())?;
        let put = client.put(
            self.keys.balancer(self.name),
            json,
            Some(PutOptions::new().with_lease(lease)),
        );
        bounded(self.source.timeout, "publishing the report", put).await?;
        *published = Some(report);
        Ok(())
    }

    /// Carries out `command` and answers it; an error ends the session.
    /// One no one waits for any more is dropped (`Command::abandoned`).
    async fn command(&mut self, client: &mut Client, command: Command) -> Result<(), String> {
        if command.abandoned() {
            warn!(
                "etcd: a rollout write its requester stopped waiting for is dropped, not written late"
            );
            return Ok(());
        }
        let result = self.write(client, command.write).await;
        // A write the balancer's role does not allow is refused, as often
        // as it is asked; the session (the watch, the report) goes on.
        let ends = match &result {
            Err(Failed { why, denied: true }) => {
                warn!(
                    "etcd: {why}: this balancer's role may not write there (README, \"A tier in etcd\")"
                );
                None
            }
            Err(Failed { why, .. }) => Some(why.clone()),
            Ok(_) => None,
        };
        if let Some(reply) = command.reply {
            let _ = reply.send(result.map_err(|f| f.why));
        }
        ends.map_or(Ok(()), Err)
    }

    /// Makes a write the daemon asked for: the revision it was made at
    /// (`None`: a compare failed), or why it failed.
    async fn write(&mut self, client: &mut Client, write: Write) -> Result<Option<i64>, Failed> {
        let wait = self.source.timeout;
        let (rollout_key, desired_key) = (self.keys.rollout(), self.keys.desired());
        let txn = match write {
            Write::Progress(p) => {
                let put = client.put(self.keys.progress(self.name), json(&p)?, None);
                let done = bounded_write(wait, "writing the rollout progress", put).await?;
                return Ok(done.header().map(|h| h.revision()));
            }
            Write::Rollout {
                at,
                desired_at,
                record,
            } => {
                let mut when = vec![Compare::mod_revision(
                    rollout_key.clone(),
                    CompareOp::Equal,
                    at,
                )];
                if let Some(d) = desired_at {
                    when.push(Compare::mod_revision(desired_key, CompareOp::Equal, d));
                }
                Txn::new()
                    .when(when)
                    .and_then(vec![TxnOp::put(rollout_key, json(&record)?, None)])
            }
            Write::Promote { at, record } => {
                let mut when = vec![Compare::mod_revision(
                    rollout_key.clone(),
                    CompareOp::Equal,
                    at,
                )];
                // A desired state written after the rollout started
                // supersedes it: promoting would overwrite it.
                if let Some(id) = record.revision {
                    when.push(Compare::mod_revision(
                        desired_key.clone(),
                        CompareOp::Less,
                        id + 1,
                    ));
                }
                Txn::new().when(when).and_then(vec![
                    TxnOp::put(desired_key, record.desired.clone(), None),
                    TxnOp::put(rollout_key, json(&record)?, None),
                ])
            }
        };
        let done = bounded_write(wait, "writing the rollout", client.txn(txn)).await?;
        Ok(done
            .succeeded()
            .then(|| done.header().map_or(0, |h| h.revision())))
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

    /// Takes the watch's `events`; says which of this balancer's own keys
    /// were deleted.
    async fn on_watch(&mut self, events: &[etcd_client::Event]) -> Result<OwnKeysGone, String> {
        let (mut members_changed, mut progress_changed) = (false, false);
        let mut gone = OwnKeysGone::default();
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
                (EventType::Put, Some(TierKey::Rollout)) => {
                    if let Some(e) = self.on_put(kv) {
                        self.send(e).await?;
                    }
                }
                (EventType::Delete, Some(TierKey::Rollout)) => {
                    self.send(Event::Rollout(None)).await?
                }
                (EventType::Put, Some(TierKey::Progress(_))) => {
                    self.on_put(kv);
                    progress_changed = true;
                }
                (EventType::Delete, Some(TierKey::Progress(name))) => {
                    progress_changed |= self.progress.remove(name).is_some();
                }
                (EventType::Put, Some(_)) => {
                    self.refuse_a_namesake(std::slice::from_ref(kv))?;
                    self.on_put(kv);
                    members_changed = true;
                }
                (EventType::Delete, Some(TierKey::Balancer(name))) => {
                    gone.report |= name == self.name;
                    if let Some(seen) = self.members.get_mut(name) {
                        *seen = None;
                    }
                    members_changed = true;
                }
                (EventType::Delete, Some(TierKey::Member(name))) => {
                    gone.member |= name == self.name;
                    self.members.remove(name);
                    members_changed = true;
                }
                _ => {}
            }
        }
        self.members_changed |= members_changed;
        if progress_changed {
            self.send(Event::Progress(self.progress.clone())).await?;
        }
        Ok(gone)
    }

    /// Ends the session if one of `kvs` is a report under this balancer's
    /// name written by another installation: two balancers share the name,
    /// and would share one report and one rollout progress (one's
    /// "passed" letting the other skip its hold). The other keeps the
    /// name; this one tries again after the usual pause, and connects once
    /// the other's report is gone.
    fn refuse_a_namesake(&self, kvs: &[KeyValue]) -> Result<(), String> {
        let mine = self.keys.balancer(self.name);
        for kv in kvs.iter().filter(|kv| kv.key() == mine.as_bytes()) {
            if let Ok(r) = report(kv.value())
                && let Some(why) = super::written_by_another(&r, self.instance)
            {
                return Err(why);
            }
        }
        Ok(())
    }

    /// A key written: the desired state is handed back as an event, a
    /// member or report is kept.
    fn on_put(&mut self, kv: &KeyValue) -> Option<Event> {
        let key = kv.key_str().ok()?;
        match self.keys.classify(key)? {
            TierKey::Desired => Some(Event::Desired(desired(kv))),
            TierKey::Rollout => {
                let at = kv.mod_revision();
                let record = Rollout::parse(kv.value()).map(|r| (r, at));
                Some(Event::Rollout(Some(record.map_err(|e| (at, e)))))
            }
            TierKey::Progress(name) => {
                match progress(kv.value()) {
                    Ok(p) => keep_progress(&mut self.progress, name, p),
                    Err(e) => warn!("etcd: {name}'s rollout progress is unreadable: {e}"),
                }
                None
            }
            TierKey::Member(name) => {
                admit(&mut self.members, name);
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

/// Takes member `name` into `members`. At [`MAX_BALANCERS`], a new name
/// takes the place of a member that reports nothing (a name that left the
/// tier and was never removed, most likely), so that names piling up
/// never keep a new balancer out; with none quiet, it is ignored.
fn admit(members: &mut Seen, name: &str) {
    if members.contains_key(name) {
        return;
    }
    if members.len() >= MAX_BALANCERS {
        let quiet = members
            .iter()
            .find(|(_, report)| report.is_none())
            .map(|(n, _)| n.clone());
        match quiet {
            Some(quiet) => {
                warn!(
                    "etcd: more than {MAX_BALANCERS} members; {quiet}, which does not report, makes room for {name}"
                );
                members.remove(&quiet);
            }
            None => {
                warn!("etcd: more than {MAX_BALANCERS} members that report; {name} is ignored");
                return;
            }
        }
    }
    members.insert(name.to_string(), None);
}

/// Keeps balancer `name`'s progress `p`. At [`MAX_BALANCERS`] names, it
/// takes the place of the progress of the oldest rollout, if that is
/// older (progress in a rollout long over decides nothing).
fn keep_progress(all: &mut BTreeMap<String, Progress>, name: &str, p: Progress) {
    if !all.contains_key(name) && all.len() >= MAX_BALANCERS {
        let oldest = all
            .iter()
            .min_by_key(|(_, q)| q.rollout)
            .filter(|(_, q)| q.rollout < p.rollout)
            .map(|(n, _)| n.clone());
        match oldest {
            Some(oldest) => {
                all.remove(&oldest);
            }
            None => {
                warn!("etcd: progress of more than {MAX_BALANCERS} balancers; {name}'s is ignored");
                return;
            }
        }
    }
    all.insert(name.to_string(), p);
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
        rollout: false,
    })
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, String> {
    serde_json::to_vec(value).map_err(|e| e.to_string())
}

/// A balancer's progress in a rollout, or why it cannot be read.
fn progress(value: &[u8]) -> Result<Progress, String> {
    bounded_json(value, MAX_PROGRESS_BYTES, "a rollout progress")
}

/// `value` as JSON of a `what`, if it is at most `max` bytes.
fn bounded_json<T: serde::de::DeserializeOwned>(
    value: &[u8],
    max: usize,
    what: &str,
) -> Result<T, String> {
    if value.len() > max {
        return Err(format!("{} bytes, more than {max}", value.len()));
    }
    serde_json::from_slice(value).map_err(|e| format!("not {what}: {e}"))
}

/// The largest progress record taken (a failure's reason is in it).
const MAX_PROGRESS_BYTES: usize = 16 << 10;

/// Another balancer's report, or why it cannot be read.
fn report(value: &[u8]) -> Result<Report, String> {
    bounded_json(value, MAX_REPORT_BYTES, "a report")
}

/// Runs an etcd request for at most `wait`; a failure says what was being
/// done.
async fn bounded<T>(
    wait: Duration,
    doing: &str,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    bounded_write(wait, doing, request).await.map_err(|f| f.why)
}

/// A write that failed: why, and whether etcd refused it for the role's
/// permissions (the session is fine: only this write may not be made).
#[derive(Debug)]
struct Failed {
    why: String,
    denied: bool,
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Failed { why, denied: false }
    }
}

/// gRPC's status code PERMISSION_DENIED (grpc/doc/statuscodes.md), which
/// etcd answers a write outside the user's role with.
const GRPC_PERMISSION_DENIED: i32 = 7;

/// [`bounded`], with a refusal for permissions told apart (a write's).
async fn bounded_write<T>(
    wait: Duration,
    doing: &str,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Failed> {
    match timeout(wait, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failed {
            denied: matches!(&e, etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == GRPC_PERMISSION_DENIED),
            why: format!("{doing}: {e}"),
        }),
        Err(_) => Err(Failed {
            why: format!("{doing}: no answer within {wait:?}"),
            denied: false,
        }),
    }
}

/// This balancer's own keys that a watch answer deleted.
#[derive(Default)]
struct OwnKeysGone {
    /// Its report (by hand: the lease's expiry ends the session).
    report: bool,
    /// Its member key.
    member: bool,
}

/// Keys one page of the first read takes: two of the largest values etcd
/// stores (1.5 MiB, its default request limit) stay under the 4 MiB a
/// gRPC answer may hold.
const PAGE_KEYS: i64 = 2;
/// The largest watch answer decoded: a fragment (at most etcd's request
/// limit, 1.5 MiB by default) and one event of that size beyond it.
const MAX_WATCH_ANSWER: usize = 16 << 20;
/// Keys the first read takes at most before it gives up (a prefix that
/// keeps saying there is more).
const MAX_PREFIX_KEYS: usize = 100_000;

/// Every key under `prefix` as of one revision, read page by page: in one
/// answer, a tier of many balancers and VIPs passed the 4 MiB a gRPC
/// answer may hold, and no session could start. The revision read and
/// the keys in order.
async fn read_prefix(
    client: &mut Client,
    prefix: &str,
    wait: Duration,
) -> Result<(i64, Vec<KeyValue>), String> {
    let end = prefix_end(prefix.as_bytes());
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut kvs = Vec::new();
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(PAGE_KEYS);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let mut got = bounded(
            wait,
            "reading the tier",
            client.get(from.clone(), Some(options)),
        )
        .await?;
        if revision == 0 {
            revision = got.header().map_or(0, |h| h.revision());
        }
        let more = got.more();
        let page = got.take_kvs();
        let Some(last) = page.last() else { break };
        from = last.key().to_vec();
        from.push(0);
        kvs.extend(page);
        if kvs.len() > MAX_PREFIX_KEYS {
            return Err(format!(
                "the tier's prefix holds more than {MAX_PREFIX_KEYS} keys"
            ));
        }
        if !more {
            break;
        }
    }
    Ok((revision, kvs))
}

/// The end of the range of keys that start with `prefix` (its last byte
/// below 0xff incremented, what etcd's `with_prefix` asks for).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A client of one member (`endpoint`), over TLS when configured, with
/// HTTP/2 pings so that a dead connection is noticed within the timeout.
async fn connect(source: &EtcdSource, endpoint: &str) -> Result<Client, etcd_client::Error> {
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
    if let Some(auth) = &source.auth {
        let password = auth.password().map_err(etcd_client::Error::InvalidArgs)?;
        // A quiet tier writes nothing for minutes while its lease is kept
        // alive; etcd expires the idle token meanwhile, and the next write
        // would end the session.
        options = options
            .with_user(auth.user.clone(), password)
            .with_auto_token_refresh(true);
    }
    Client::connect([endpoint], Some(options)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::rollout::Phase;

    fn source(endpoints: &[&str]) -> EtcdSource {
        let text = format!(
            "interfaces: [eth0]\nouter_source_v4: 10.0.0.1\ngateway_mac: 02:00:00:00:00:01\nsource:\n  etcd:\n    endpoints: [{}]\n    prefix: /lb/t\n",
            endpoints.join(", ")
        );
        crate::config::Config::parse(&text).unwrap().source.unwrap()
    }

    /// A write whose requester stopped waiting (`lbd` answered `lbctl`
    /// that nothing was written) is abandoned; the daemon's own writes
    /// (no one waits) and awaited ones are not.
    #[test]
    fn a_write_no_one_waits_for_any_more_is_abandoned() {
        let write = || {
            Write::Progress(crate::tier::rollout::Progress {
                rollout: 7,
                phase: Phase::Passed,
            })
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let awaited = Command {
            write: write(),
            reply: Some(tx),
        };
        assert!(!awaited.abandoned());
        drop(rx);
        assert!(awaited.abandoned());
        let own = Command {
            write: write(),
            reply: None,
        };
        assert!(!own.abandoned());
    }

    #[test]
    fn a_failed_session_moves_to_the_next_member_and_only_a_round_waits() {
        let s = source(&["http://a:2379", "http://b:2379", "http://c:2379"]);
        let mut b = Backoff::new(&s, "lb1");
        let first = b.endpoint().to_string();
        let short = Duration::from_secs(1);
        let mut seen = vec![first.clone()];
        let mut pauses = Vec::new();
        for _ in 0..6 {
            let (next, pause) = b.failed(short);
            seen.push(next.to_string());
            pauses.push(pause.as_millis());
        }
        assert_ne!(seen[0], seen[1], "the next member at once");
        assert_eq!(seen[0], seen[3], "round and round");
        assert_eq!(pauses, [200, 200, 1000, 200, 200, 2000]);
        // A session that lasted starts the pauses over.
        b.failed(Duration::from_secs(60));
        b.failed(short);
        assert_eq!(b.failed(short).1, Duration::from_secs(1));
        // Balancers start on members of their own.
        let starts: std::collections::BTreeSet<String> = ["lb1", "lb2", "lb3"]
            .iter()
            .map(|n| Backoff::new(&s, n).endpoint().to_string())
            .collect();
        assert_eq!(starts.len(), 3);
    }

    /// At the cap, a new member takes the place of one that reports
    /// nothing; members that all report keep a new one out.
    #[test]
    fn a_full_tier_makes_room_for_a_new_member_from_a_quiet_one() {
        let mut members = Seen::new();
        for i in 0..MAX_BALANCERS {
            admit(&mut members, &format!("lb{i:03}"));
            let seen = members.get_mut(&format!("lb{i:03}")).unwrap();
            if i != 7 {
                *seen = Some(Err("a report".into()));
            }
        }
        admit(&mut members, "new1");
        assert_eq!(members.len(), MAX_BALANCERS);
        assert!(members.contains_key("new1") && !members.contains_key("lb007"));
        *members.get_mut("new1").unwrap() = Some(Err("a report".into()));
        admit(&mut members, "new2");
        assert!(!members.contains_key("new2"), "nobody quiet: ignored");
        assert_eq!(members.len(), MAX_BALANCERS);
    }

    /// At the cap, progress in a newer rollout takes the place of the
    /// oldest rollout's; an older one is ignored.
    #[test]
    fn a_full_progress_list_keeps_the_newest_rollouts() {
        let mut all = BTreeMap::new();
        let p = |rollout| Progress {
            rollout,
            phase: Phase::Passed,
        };
        for i in 0..MAX_BALANCERS {
            keep_progress(&mut all, &format!("lb{i:03}"), p(10 + i as i64));
        }
        keep_progress(&mut all, "canary", p(1_000));
        assert!(all.contains_key("canary") && !all.contains_key("lb000"));
        keep_progress(&mut all, "late", p(5));
        assert!(!all.contains_key("late"));
        // As old as the oldest kept (lb001's 11): not newer, ignored.
        keep_progress(&mut all, "tie", p(11));
        assert!(!all.contains_key("tie") && all.contains_key("lb001"));
        assert_eq!(all.len(), MAX_BALANCERS);
    }

    /// The range of a prefix ends past its last byte: `/lb/t1/` covers
    /// `/lb/t1/…` and nothing of `/lb/t10`.
    #[test]
    fn a_prefix_range_ends_after_its_last_byte() {
        assert_eq!(prefix_end(b"/lb/t1/"), b"/lb/t10".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn one_member_is_retried_with_pauses() {
        let mut b = Backoff::new(&source(&["http://a:2379"]), "lb1");
        let pauses: Vec<u128> = (0..5)
            .map(|_| b.failed(Duration::from_secs(1)).1.as_millis())
            .collect();
        assert_eq!(pauses, [1000, 2000, 4000, 8000, 10000]);
    }
}

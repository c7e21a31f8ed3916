//! `lbd`'s end of a tier in etcd ([`lb::tier`]): the desired state to
//! start from (what the last revision ran, so a restart while etcd is
//! away serves what it served), the etcd task, and the report it
//! publishes. A desired state is applied as a reload of the file
//! composed with it (see `run.rs`), so it is checked, guarded, previewed
//! and recorded like any other change.

use anyhow::{Context as _, Result, bail};
use lb::{
    RevisionStore,
    api::{ErrorKind, Response},
    config::{Config, valid_name},
    daemon::{Daemon, FileRead, Step},
    dataplane::KernelDataplane,
    tier::{Change, Command, Desired, Event, Report, Write, spawn_client},
};
use tokio::sync::{mpsc, watch};

/// The link to the tier's etcd, while `lbd` runs with `source.etcd`.
pub struct TierLink {
    events: mpsc::Receiver<Event>,
    reports: watch::Sender<Option<Report>>,
    task: tokio::task::JoinHandle<()>,
    /// The desired state the running configuration was composed with (a
    /// reload of the file composes with it again).
    pub applied: Desired,
    /// The tier's desired state as last read (a rollout that fails goes
    /// back to it).
    pub latest: Option<Desired>,
    /// The desired state that ran before a rollout's candidate (a revert
    /// goes back to it if the tier's is absent or unreadable).
    before_candidate: Option<Desired>,
    /// Writes for the etcd task (a rollout's steps).
    commands: mpsc::Sender<Command>,
    /// A rollout's clock: its steps are decided once a second.
    tick: tokio::time::Interval,
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
        rollout: false,
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
/// that came from etcd, with its etcd revision (or that of the rollout
/// whose candidate it was), if it came from the tier under `prefix`, so a
/// restart while etcd is away serves what it served. A revert made since
/// (`lbctl revert`) is not a desired state: the start keeps it running
/// (`reverted_revision` in `run.rs`), as the tier's report says. With no
/// revision from etcd left in the history, the `vips:` of the newest
/// that ran, at revision 0; and revision 0 also when it came from
/// another tier (still what it served: the tier's desired state replaces
/// it once etcd answers; a balancer moved to another prefix, or back to
/// one it left, takes that tier's at once).
pub fn start_from(store: &RevisionStore, prefix: &str) -> Desired {
    let from_etcd = store
        .numbers()
        .unwrap_or_default()
        .iter()
        .rev()
        .filter_map(|n| store.get(*n).ok())
        .find(|r| r.applied() && r.source.starts_with("etcd "));
    let (revision, text) = match from_etcd {
        Some(r) => (lb::tier::revision_of_origin(&r.source, prefix), r.config),
        None => match store.latest_applied(None) {
            Ok(Some(newest)) => (None, newest.config),
            _ => return nothing(),
        },
    };
    text.and_then(|text| Desired::from_config_text(revision.unwrap_or((0, false)), &text))
        .unwrap_or_else(nothing)
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

/// What the tier feeds the loop.
pub enum Feed {
    Event(Event),
    Tick,
}

/// Writes queued for the etcd task at most.
const COMMANDS: usize = 64;

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
            (applied.revision > 0).then_some((applied.revision, applied.rollout)),
        );
        let (tx, events) = mpsc::channel(16);
        let (reports, rx) = watch::channel(daemon.tier_report());
        let (commands, from_daemon) = mpsc::channel(COMMANDS);
        let dir = daemon.config().state_file.parent().map_or_else(
            || std::path::PathBuf::from("."),
            std::path::Path::to_path_buf,
        );
        let instance = match lb::tier::instance_id(&dir) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(
                    "etcd: this installation's id cannot be kept in {} ({e}): a restart will look like another balancer until its old report expires",
                    dir.display()
                );
                lb::tier::instance_id(&std::env::temp_dir()).unwrap_or_default()
            }
        };
        let task = spawn_client(source, (name, instance), tx, rx, from_daemon);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A restart during a hold: what ran before, as the last lbd kept
        // it (a revert goes there if the tier's newest is refused here).
        let before_candidate = applied
            .rollout
            .then(|| daemon.kept_before_candidate(applied.revision))
            .flatten()
            .map(|(revision, text)| Desired {
                revision,
                text: text.into(),
                rollout: false,
            });
        Some(TierLink {
            events,
            reports,
            task,
            applied,
            latest: None,
            before_candidate,
            commands,
            tick,
            computed: std::time::Instant::now(),
            urgent: false,
        })
    }

    /// The task's next event, or the rollout clock's tick (once a
    /// second); never, without a tier.
    pub async fn next(link: &mut Option<TierLink>) -> Feed {
        let Some(l) = link else {
            return std::future::pending().await;
        };
        tokio::select! {
            Some(event) = l.events.recv() => Feed::Event(event),
            _ = l.tick.tick() => Feed::Tick,
        }
    }

    /// Hands a write to the etcd task; `reply` hears whether it was made.
    pub fn send(
        &self,
        write: Write,
        reply: Option<tokio::sync::oneshot::Sender<Result<Option<i64>, String>>>,
    ) {
        let command = Command { write, reply };
        if let Err(e) = self.commands.try_send(command) {
            tracing::warn!(
                "etcd: a rollout write was not queued ({e}); it is decided again in a second"
            );
        }
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

/// What `lbctl diff` compares with: the tier's newest desired state when
/// it is newer than the one applied (refused, or not yet applied), so that
/// the diff shows what following the tier would change here.
pub fn newest(link: Option<&TierLink>) -> Option<Desired> {
    let link = link?;
    Some(newest_of(link.latest.as_ref(), &link.applied).clone())
}

/// `latest` if it is newer than `applied`, else `applied`.
fn newest_of<'d>(latest: Option<&'d Desired>, applied: &'d Desired) -> &'d Desired {
    latest
        .filter(|l| l.revision > applied.revision)
        .unwrap_or(applied)
}

/// Why a reload composed with a desired state is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `lbctl reload`, SIGHUP: the file read again, with the VIPs that
    /// run.
    Operator,
    /// `lbctl diff`: the file read again, with the tier's newest desired
    /// state ([`newest`]).
    Diff,
    /// A new desired state in etcd.
    Desired,
    /// A rollout's candidate (the rollout's revision).
    Candidate(i64),
    /// Back to the tier's desired state after rollout `id` failed; `say`:
    /// write "reverted"; `before`: to what ran before the candidate (the
    /// tier's newest was refused here, or is unknown), not to the newest.
    Revert { id: i64, say: bool, before: bool },
}

/// A reload parsed off the loop whose desired state is out of date by
/// the time it is to be applied (reloads are parsed side by side, and
/// finish in any order).
#[derive(Debug, PartialEq, Eq)]
pub enum Stale {
    /// A desired state older than the newest read: that one's own reload
    /// follows.
    Drop,
    /// An operator's reload (or diff) composed with a desired state that
    /// is no longer the one to compose with: compose it again with this
    /// one.
    Again(Desired),
    /// A rollout's candidate (the rollout's revision) superseded by a
    /// newer desired state before it could be applied.
    Superseded(i64),
}

/// Whether a reload composed with `desired` (made `via`) is out of date,
/// given the newest desired state read (`latest`, and whether this
/// balancer refused it) and the one the running configuration was
/// composed with (`applied`). Applied anyway, an older state would
/// overwrite a newer one, and nothing would apply the newer one again.
pub fn stale(
    (latest, latest_refused, applied): (Option<&Desired>, bool, &Desired),
    desired: &Desired,
    via: &Via,
) -> Option<Stale> {
    let newer = |than: i64| latest.is_some_and(|l| l.revision > than);
    match via {
        Via::Desired if newer(desired.revision) => Some(Stale::Drop),
        Via::Operator if desired != applied => Some(Stale::Again(applied.clone())),
        Via::Diff if desired != newest_of(latest, applied) => {
            Some(Stale::Again(newest_of(latest, applied).clone()))
        }
        Via::Candidate(id) if newer(*id) => Some(Stale::Superseded(*id)),
        // A revert goes back to the tier's newest desired state, also one
        // read while it was parsed; one back to what ran before the
        // candidate (the newest refused here) goes there instead if a
        // newer one came that this balancer has not refused, which it
        // would otherwise overwrite, and nothing apply again.
        Via::Revert { before, .. } if newer(desired.revision) && !(*before && latest_refused) => {
            latest.cloned().map(Stale::Again)
        }
        _ => None,
    }
}

/// A rollout's clock: seconds since the first reading, on the monotonic
/// clock. Only holds are timed with it, and a hold's clock never outlives
/// the process (a restart holds again from the start; only the state
/// before the candidate is kept, in `hold.json`), so a step of the wall clock (NTP
/// setting it just after a start) can neither end a hold early nor
/// stretch it.
pub fn rollout_now() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
}

/// A reload composed with a desired state, for a reason.
pub type Reload = (Desired, Via);

/// Carries out a rollout's steps: writes go to the etcd task; an apply or
/// a revert is a reload composed with the candidate or the tier's desired
/// state, returned for the loop to start.
pub fn run_steps(
    daemon: &mut Daemon<KernelDataplane>,
    link: &mut TierLink,
    steps: Vec<Step>,
) -> Vec<Reload> {
    let mut reloads = Vec::new();
    for step in steps {
        let (desired, via) = match step {
            Step::Write(write) => {
                link.send(write, None);
                continue;
            }
            Step::Apply(candidate) => {
                let id = candidate.revision;
                (candidate, Via::Candidate(id))
            }
            Step::Revert { id, say } => {
                let refused = |d: &Desired| daemon.tier_refused(d.revision);
                match revert_target(
                    link.latest.as_ref(),
                    link.before_candidate.as_ref(),
                    refused,
                ) {
                    Some(back) => {
                        let before = link.latest.as_ref() != Some(&back);
                        (back, Via::Revert { id, say, before })
                    }
                    None => {
                        tracing::error!(
                            rollout = id,
                            "rollout: no desired state to go back to (the tier's is absent or unreadable, and none ran before the candidate here): the candidate stays"
                        );
                        daemon.rollout_reverted(id, say, false);
                        continue;
                    }
                }
            }
        };
        link.urgent = true;
        reloads.push((desired, via));
    }
    reloads
}

/// What a revert goes back to: the tier's desired state as last read,
/// unless this balancer refused it (going back to it would be refused
/// again, and the failed candidate stay), else the one that ran before
/// the candidate; never no VIPs at all (a revert with neither keeps the
/// candidate: fail static).
fn revert_target(
    latest: Option<&Desired>,
    before: Option<&Desired>,
    refused: impl Fn(&Desired) -> bool,
) -> Option<Desired> {
    match (latest, before) {
        (Some(l), Some(b)) if refused(l) => Some(b.clone()),
        _ => latest.or(before).cloned(),
    }
}

/// After a reload composed with `desired` (made `via`): what the tier and
/// a rollout make of its outcome.
pub fn after_reload(
    daemon: &mut Daemon<KernelDataplane>,
    link: &mut TierLink,
    (desired, via, dry_run): (Desired, Via, bool),
    (outcome, change): (Result<(), String>, Option<Change>),
) -> Vec<Reload> {
    link.urgent = true;
    let revision = desired.revision;
    if outcome.is_ok() && !dry_run {
        let ran = std::mem::replace(&mut link.applied, desired);
        if matches!(via, Via::Candidate(_)) && !ran.rollout {
            link.before_candidate = Some(ran);
        }
    }
    let now = rollout_now();
    let steps = match via {
        Via::Operator if outcome.is_ok() && !dry_run => {
            return retry_newest(daemon, link).into_iter().collect();
        }
        Via::Operator | Via::Diff => Vec::new(),
        // A dry run decides nothing (it was taken for a refusal's end).
        Via::Desired if dry_run => Vec::new(),
        Via::Desired => {
            daemon.tier_outcome(revision, outcome);
            Vec::new()
        }
        Via::Candidate(id) => {
            let steps =
                daemon.rollout_applied(id, outcome.map(|_| change.unwrap_or_default()), now);
            if let Some(before) = &link.before_candidate {
                daemon.keep_before_candidate(before.revision, &before.text);
            }
            steps
        }
        Via::Revert { id, say, .. } => {
            let ok = outcome.is_ok();
            if ok {
                daemon.tier_outcome(revision, Ok(()));
            } else if let Err(why) = outcome {
                tracing::error!(rollout = id, "rollout: going back was refused: {why}");
            }
            daemon.rollout_reverted(id, say, ok)
        }
    };
    run_steps(daemon, link, steps)
}

/// After an operator's reload, `lbctl confirm` or a revert went through:
/// the tier's newest desired state, to apply again, if it is the newest
/// seen, was refused here (maybe for something in the file this reload
/// fixed, an IPv6 tunnel source, say, or for a change awaiting
/// confirmation), is not the one running and should be
/// (`Daemon::tier_should_apply`); not while a change is on probation
/// (it would be refused again for that). No other write would bring it
/// back. Refused again, it waits for the next write or reload.
pub fn retry_newest(daemon: &mut Daemon<KernelDataplane>, link: &TierLink) -> Option<Reload> {
    let latest = link.latest.as_ref()?;
    let again = *latest != link.applied
        && !daemon.on_probation()
        && daemon.tier_refused(latest.revision)
        && daemon.tier_should_apply(latest.revision);
    again.then(|| (latest.clone(), Via::Desired))
}

/// What `lbctl reload --force` composes the file with: the tier's newest
/// desired state if this balancer refused it for something force
/// overrides (a serving VIP's table size or hash, the blackhole guard),
/// so that the force applies it here, as the refusal says; otherwise
/// `None` (the applied one, as any reload). It used to compose the file
/// with the applied state: the answer was OK, nothing of the refused
/// state ran, and a retry refused it again.
pub fn forced(daemon: &Daemon<KernelDataplane>, link: &TierLink) -> Option<Reload> {
    let latest = link.latest.as_ref()?;
    (*latest != link.applied && daemon.tier_refused_forceable(latest.revision))
        .then(|| (latest.clone(), Via::Desired))
}

/// The answer to `--abort`.
fn aborted(daemon: &Daemon<KernelDataplane>) -> lb::api::RolloutPlan {
    lb::api::RolloutPlan {
        prefix: daemon
            .config()
            .source
            .as_ref()
            .map_or(String::new(), |s| s.prefix.clone()),
        waves: Vec::new(),
        hold_secs: 0,
        preview: None,
        revision: None,
        aborted: true,
    }
}

/// `lbctl tier rollout` as asked.
pub struct RolloutAsk {
    pub abort: bool,
    pub text: Option<String>,
    pub canary: Option<String>,
    pub waves: usize,
    pub hold: u64,
    pub dry_run: bool,
}

/// `lbctl tier rollout`: the plan (with `--dry-run`, only that), else the
/// record written to etcd if nothing changed since the plan; `--abort`:
/// the record marked aborted. The answer waits for etcd, off the loop.
pub fn rollout_request(
    daemon: &mut Daemon<KernelDataplane>,
    link: Option<&TierLink>,
    ask: RolloutAsk,
    reply: tokio::sync::oneshot::Sender<Response>,
) {
    let refuse = |kind, message: &str| Response::err(kind, message.to_string());
    let Some(link) = link else {
        let _ = reply.send(refuse(
            ErrorKind::NotFound,
            "this balancer takes its VIPs from its file: no tier",
        ));
        return;
    };
    if daemon.tier_link_up() != Some(true) && !ask.dry_run {
        let _ = reply.send(refuse(
            ErrorKind::Unavailable,
            "not connected to etcd (lbctl tier status): nothing written",
        ));
        return;
    }
    let (write, plan) = if ask.abort {
        match daemon.rollout_abort("aborted with lbctl tier rollout --abort") {
            // The rollout can be aborted; with --dry-run, nothing is
            // written (no revision in the answer).
            Ok(_) if ask.dry_run => {
                let _ = reply.send(Response::ok(aborted(daemon)));
                return;
            }
            Ok(write) => (write, aborted(daemon)),
            Err(e) => {
                let _ = reply.send(e.response());
                return;
            }
        }
    } else {
        let text = ask.text.unwrap_or_default();
        match daemon.rollout_plan(&text, ask.canary.as_deref(), ask.waves, ask.hold) {
            Ok((plan, _, _, _)) if ask.dry_run => {
                let _ = reply.send(Response::ok(plan));
                return;
            }
            Ok((plan, record, desired_at, at)) => (
                Write::Rollout {
                    at,
                    desired_at: Some(desired_at.unwrap_or(0)),
                    record,
                },
                plan,
            ),
            Err(e) => {
                let _ = reply.send(e.response());
                return;
            }
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    link.send(write, Some(tx));
    tokio::spawn(async move {
        // Within `lbctl`'s own patience (30 s); dropping `rx` tells the
        // etcd task not to write it later (`Command::abandoned`).
        let answer = match tokio::time::timeout(ROLLOUT_ANSWER, rx).await {
            Err(_) => Response::err(
                ErrorKind::Unavailable,
                format!(
                    "etcd did not take the write within {} s: it will not be written later (one already under way may still land: see `lbctl tier status`)",
                    ROLLOUT_ANSWER.as_secs()
                ),
            ),
            Ok(answer) => rollout_answer(answer, plan),
        };
        let _ = reply.send(answer);
    });
}

/// How long `lbd` waits for the etcd task to write a rollout or its
/// abort before it answers that nothing was written.
const ROLLOUT_ANSWER: std::time::Duration = std::time::Duration::from_secs(20);

/// The answer to `lbctl tier rollout` once the etcd task wrote (or did
/// not write) the record.
fn rollout_answer(
    answer: Result<Result<Option<i64>, String>, tokio::sync::oneshot::error::RecvError>,
    plan: lb::api::RolloutPlan,
) -> Response {
    let refuse = |kind, message: &str| Response::err(kind, message.to_string());
    match answer {
        Ok(Ok(Some(revision))) => {
            let mut plan = plan;
            plan.revision = Some(revision);
            Response::ok(plan)
        }
        Ok(Ok(None)) => refuse(
            ErrorKind::Conflict,
            "the rollout record or the desired state changed in etcd since the plan: nothing written; try again",
        ),
        Ok(Err(e)) => refuse(ErrorKind::Unavailable, &format!("etcd: {e}")),
        Err(_) => refuse(ErrorKind::Unavailable, "the etcd task stopped"),
    }
}

#[cfg(test)]
mod tests {
    use lb::{Overlay, Revision, RevisionStore};

    /// A revision that ran `vips` (one VIP with `backend`), from `source`.
    fn ran(number: u64, source: &str, backend: &str) -> Revision {
        Revision {
            number,
            time: 1_700_000_000 + number,
            source: source.into(),
            digest: Some(format!("d{number}")),
            error: None,
            config: Some(format!(
                "source: {{ etcd: {{ endpoints: [http://127.0.0.1:2379], prefix: /lb/t1 }} }}\nvips:\n- address: 10.99.0.1\n  port: 80\n  protocol: tcp\n  backends:\n  - address: {backend}\n"
            )),
            overlay: Some(Overlay::default()),
            file_digest: None,
            forceable: false,
        }
    }

    /// A reload whose desired state went out of date while it was parsed
    /// is dropped, composed again, or its rollout told; a current one is
    /// applied.
    #[test]
    fn a_reload_parsed_against_an_old_desired_state_is_not_applied() {
        use super::{Stale, Via, stale};
        let d = |revision, rollout| lb::tier::Desired {
            revision,
            text: format!("vips: [] # {revision}\n").into(),
            rollout,
        };
        let (r5, r7) = (d(5, false), d(7, false));
        type At<'d> = (Option<&'d lb::tier::Desired>, bool, &'d lb::tier::Desired);
        fn at(latest: &lb::tier::Desired) -> At<'_> {
            (Some(latest), false, latest)
        }
        assert_eq!(stale(at(&r7), &r5, &Via::Desired), Some(Stale::Drop));
        assert_eq!(stale(at(&r7), &r7, &Via::Desired), None);
        assert_eq!(stale(at(&r5), &r7, &Via::Desired), None);
        assert_eq!(
            stale(at(&r7), &r5, &Via::Operator),
            Some(Stale::Again(r7.clone()))
        );
        assert_eq!(stale(at(&r7), &r7, &Via::Operator), None);
        // A diff composes with the newest desired state, even one refused
        // here (newer than the applied one).
        assert_eq!(stale((Some(&r7), false, &r5), &r7, &Via::Diff), None);
        assert_eq!(stale((Some(&r7), false, &r5), &r5, &Via::Operator), None);
        assert_eq!(
            stale((Some(&r7), false, &r5), &r5, &Via::Diff),
            Some(Stale::Again(r7.clone()))
        );
        assert_eq!(stale((None, false, &r5), &r5, &Via::Diff), None);
        let candidate = d(6, true);
        assert_eq!(
            stale(at(&r7), &candidate, &Via::Candidate(6)),
            Some(Stale::Superseded(6))
        );
        assert_eq!(stale(at(&r5), &candidate, &Via::Candidate(6)), None);
        assert_eq!(stale((None, false, &r5), &r5, &Via::Desired), None);
        let back = Via::Revert {
            id: 6,
            say: true,
            before: false,
        };
        assert_eq!(stale(at(&r7), &r5, &back), Some(Stale::Again(r7.clone())));
        assert_eq!(stale(at(&r7), &r7, &back), None);
        assert_eq!(stale((None, false, &r5), &r5, &back), None);
        // Back to what ran before the candidate, the newest being refused
        // here: not sent back to the newest.
        let before = Via::Revert {
            id: 6,
            say: true,
            before: true,
        };
        let refused = (Some(&r7), true, &r7);
        assert_eq!(stale(refused, &r5, &before), None);
        // A newer one not refused here (the operator fixed it) came while
        // the revert was parsed: it goes there, not over it (helper-32).
        assert_eq!(stale(at(&r7), &r5, &before), Some(Stale::Again(r7.clone())));
    }

    /// A revert goes back to the tier's desired state (unless this
    /// balancer refused it), else to what ran before the candidate, else
    /// nowhere (never to no VIPs).
    #[test]
    fn a_revert_goes_back_to_the_tiers_state_or_what_ran_before_never_to_nothing() {
        let d = |revision| lb::tier::Desired {
            revision,
            text: format!("vips: [] # {revision}\n").into(),
            rollout: false,
        };
        let back = |l: Option<i64>, b: Option<i64>, refused: Option<i64>| {
            let (l, b) = (l.map(d), b.map(d));
            super::revert_target(l.as_ref(), b.as_ref(), |d| Some(d.revision) == refused)
                .map(|t| t.revision)
        };
        assert_eq!(back(Some(9), Some(5), None), Some(9));
        assert_eq!(back(None, Some(5), None), Some(5));
        assert_eq!(back(None, None, None), None);
        // The tier's state refused here: what ran before the candidate.
        assert_eq!(back(Some(9), Some(5), Some(9)), Some(5));
        assert_eq!(back(Some(9), None, Some(9)), Some(9), "never to nothing");
    }

    /// A restart starts from the desired state that ran last, with its
    /// etcd revision (a revert since is kept by `reverted_revision`, not
    /// taken for a desired state); once more `lbctl` changes than the
    /// history keeps have pushed every revision from etcd out, from what
    /// ran last (at revision 0, which etcd's desired state replaces),
    /// never from no VIPs at all.
    #[test]
    fn a_restart_starts_from_what_ran_even_without_an_etcd_revision_left() {
        let dir = crate::ScratchDir::new("start-from");
        let store = RevisionStore::open(&dir.join("r"), 3).unwrap();
        store
            .append(&ran(1, "etcd /lb/t1/desired@42", "10.1.0.1"))
            .unwrap();
        store
            .append(&ran(2, "lbctl backend weight", "10.1.0.2"))
            .unwrap();
        let from = super::start_from(&store, "/lb/t1");
        assert_eq!(from.revision, 42);
        assert!(
            from.text.contains("10.1.0.1") && !from.text.contains("10.1.0.2"),
            "desired revision 42's VIPs, not a revert's since: {}",
            from.text
        );
        // Moved to another tier: its revisions are another history.
        let moved = super::start_from(&store, "/lb/t2");
        assert_eq!(moved.revision, 0);
        assert!(moved.text.contains("10.1.0.1"), "{}", moved.text);
        // Back in t2 after running t1's state: t2's old revision is not
        // what runs.
        let dir2 = crate::ScratchDir::new("start-from-back");
        let back = RevisionStore::open(&dir2.join("r"), 5).unwrap();
        back.append(&ran(1, "etcd /lb/t2/desired@42", "10.1.0.1"))
            .unwrap();
        back.append(&ran(2, "etcd /lb/t1/desired@7", "10.1.0.2"))
            .unwrap();
        assert_eq!(super::start_from(&back, "/lb/t2").revision, 0);
        assert_eq!(super::start_from(&back, "/lb/t1").revision, 7);
        for n in 3..=4 {
            store
                .append(&ran(n, "lbctl backend weight", "10.1.0.3"))
                .unwrap();
        }
        let from = super::start_from(&store, "/lb/t1");
        assert_eq!(from.revision, 0);
        assert!(from.text.contains("10.1.0.3"), "{}", from.text);
        assert!(!from.rollout);
    }
}

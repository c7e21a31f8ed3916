//! The daemon's side of a staged rollout ([`crate::tier::rollout`]): the
//! record and every balancer's progress as the etcd task last read them,
//! this balancer's hold, the gates' snapshots, and the steps it asks of
//! `lbd` (apply the candidate, go back, write to etcd). Applying and going
//! back are reloads, so a candidate is checked and guarded like any other
//! change.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::IpAddr,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::{Daemon, Result, refused};
use crate::{
    api::{BackendState, ErrorKind, RolloutPlan, RolloutView},
    config::{Config, VipConfig, VipId},
    dataplane::Dataplane,
    tier::{
        Desired,
        client::Write,
        rollout::{
            Action, Change, Expected, Local, Outcome, Phase, Progress, Rollout, Snapshot, View,
            decide, gates, routes_missing,
        },
    },
};

/// What the daemon knows of a rollout.
#[derive(Clone, Debug, Default)]
pub struct RolloutState {
    /// The record and its modification revision, or why it is unreadable.
    record: Option<std::result::Result<(Rollout, i64), (i64, String)>>,
    progress: BTreeMap<String, Progress>,
    hold: Option<Hold>,
    /// Taken just before the candidate of rollout `.0` was applied, with
    /// the candidate's digest.
    before: Option<(i64, Snapshot, String)>,
    /// An apply or a revert is being read off the loop.
    busy: bool,
    /// The last step asked, and when (not asked again for 3 s; a revert
    /// for `revert_wait`).
    sent: Option<(Action, Instant)>,
    /// How long a revert of rollout `.0` waits before it is asked again:
    /// 3 s, doubled by each refusal up to a minute (a revert refused here,
    /// against a file that keeps failing, is not retried, logged and
    /// recorded as a refused revision every 3 s), back to 3 s once one
    /// works or for another rollout.
    revert_wait: Option<(i64, Duration)>,
    /// What this balancer does in the rollout, in words.
    step: String,
    /// Packets forwarded, sampled once a second for the last 10 s.
    forwarded: VecDeque<u64>,
    /// The record (or its absence) was read since `lbd` started: before
    /// that, a restarted balancer holding a candidate knows nothing of it.
    record_read: bool,
    /// Every balancer's progress was read since `lbd` started: before
    /// that, a restarted balancer cannot tell a hold it must take up from
    /// one it already passed.
    progress_read: bool,
}

/// This balancer holds the candidate of rollout `id` since `since`.
#[derive(Clone, Debug)]
struct Hold {
    id: i64,
    since: u64,
    before: Snapshot,
    change: Change,
    /// A gate that broke while etcd was away (nothing could be written
    /// then): the hold fails with it once etcd answers.
    broke: Option<String>,
    /// etcd away since then: the hold's clock stands still.
    paused: Option<u64>,
    /// Taken up again at this time after a restart, with the state
    /// before the candidate kept on disk, and the peers have not all had
    /// their routes back since: the hold's clock stands and the routes
    /// are not judged ([`Daemon::await_routes`]).
    routes_after: Option<u64>,
}

impl Hold {
    /// The hold of rollout `id` from `since`, judged against `before`
    /// with what `change` explains, nothing broken or paused yet.
    fn new(
        id: i64,
        since: u64,
        before: Snapshot,
        change: Change,
        routes_after: Option<u64>,
    ) -> Self {
        Self {
            id,
            since,
            before,
            change,
            broke: None,
            paused: None,
            routes_after,
        }
    }
}

/// What `lbd` must do for a rollout step.
#[derive(Debug)]
pub enum Step {
    /// A write to etcd.
    Write(Write),
    /// Apply this candidate (a reload composed with it).
    Apply(Desired),
    /// Apply the tier's desired state again; `say`: write "reverted".
    Revert { id: i64, say: bool },
}

/// Samples of forwarded packets kept (one a second).
const FORWARD_WINDOW: usize = 10;
/// What the step says while etcd is away.
const AWAY: &str = "; etcd away: nothing is written until it answers";
/// A step is not asked again sooner than this.
const ASK_AGAIN: Duration = Duration::from_secs(3);
/// The least a hold taken up after a restart waits for the peers' routes
/// before judging them (seconds; [`Daemon::routes_grace`]).
const ROUTES_GRACE: u64 = 60;
/// Seconds beyond a router's hold timer and `lbd`'s longest connect retry
/// for a session to come up and carry the routes.
const ROUTES_MARGIN: u64 = 10;
/// The longest a refused revert waits before it is asked again.
const REVERT_WAIT_MAX: Duration = Duration::from_secs(60);

impl<D: Dataplane> Daemon<D> {
    /// The rollout record changed (or was read at connection).
    pub fn on_rollout(
        &mut self,
        record: Option<std::result::Result<(Rollout, i64), (i64, String)>>,
    ) {
        if let Some(Err((at, why))) = &record {
            warn!("etcd: the rollout record at revision {at} is refused: {why}");
        }
        self.rollout.record = record;
        self.rollout.record_read = true;
    }

    /// The rollout whose candidate runs here, if nothing will judge or
    /// revert it any more: its record is gone, or is another rollout's
    /// now, and no newer desired state took over.
    fn orphaned_candidate(&self) -> Option<i64> {
        let candidate = self.tier.candidate?;
        let current = match &self.rollout.record {
            Some(Ok((record, at))) => Some(record.id(*at)),
            Some(Err(_)) => return None,
            None => None,
        };
        let superseded = self.tier.seen.is_some_and(|d| d > candidate);
        (self.rollout.record_read && current != Some(candidate) && !superseded).then_some(candidate)
    }

    /// Every balancer's progress, as last read.
    pub fn on_rollout_progress(&mut self, progress: BTreeMap<String, Progress>) {
        self.rollout.progress = progress;
        self.rollout.progress_read = true;
    }

    /// Once a second: the steps this balancer takes in the rollout now.
    pub fn rollout_tick(&mut self, now: u64) -> Vec<Step> {
        let forwarded = self.forwarded_total();
        let samples = &mut self.rollout.forwarded;
        samples.push_back(forwarded);
        while samples.len() > FORWARD_WINDOW {
            samples.pop_front();
        }
        let connected = matches!(self.tier_link_up(), Some(true));
        if self.rollout.busy {
            return Vec::new();
        }
        if !connected {
            self.hold_while_away(now);
            self.say_away();
            return Vec::new();
        }
        if let Some(hold) = &mut self.rollout.hold
            && let Some(paused) = hold.paused.take()
        {
            hold.since += now.saturating_sub(paused);
        }
        if let Some(id) = self.orphaned_candidate() {
            return self.revert_orphan(id);
        }
        let Some(Ok((record, at))) = self.rollout.record.clone() else {
            return Vec::new();
        };
        self.await_routes(now);
        let action = self.rollout_decide(&record, at, now);
        let action = self.while_routes_return(action, record.id(at), now);
        self.rollout.step = match &action {
            Action::Wait(why) => why.clone(),
            Action::Idle => String::new(),
            other => format!("{other:?}"),
        };
        self.rollout_act(action, &record, at, now)
    }

    /// While etcd is away nothing is written, but a hold still being
    /// judged is judged on: a gate that breaks is kept for when etcd
    /// answers, and the hold's clock stands still, so that a hold passes
    /// only after a whole hold of seconds with etcd there to take a
    /// failure.
    fn hold_while_away(&mut self, now: u64) {
        let Some(Ok((record, at))) = &self.rollout.record else {
            return;
        };
        let Some(hold) = &self.rollout.hold else {
            return;
        };
        let judged =
            (self.rollout.progress.get(&self.tier.name)).is_some_and(|p| p.rollout == hold.id);
        if record.id(*at) != hold.id || record.outcome.is_some() || judged {
            return;
        }
        let broke = match &hold.broke {
            Some(why) => Some(why.clone()),
            None => self.judge(hold, &record.expected, false).err(),
        };
        if let Some(hold) = &mut self.rollout.hold {
            if hold.broke.is_none()
                && let Some(why) = &broke
            {
                warn!(
                    rollout = hold.id,
                    "rollout: a gate broke while etcd is away (said when it answers): {why}"
                );
            }
            hold.broke = broke;
            hold.paused.get_or_insert(now);
        }
    }

    /// The step in words while etcd is away: the last one, and that
    /// nothing moves (with the gate that broke meanwhile, if one did).
    fn say_away(&mut self) {
        let base = self.rollout.step.split(AWAY).next().unwrap_or_default();
        if base.is_empty() {
            return;
        }
        let hold = self.rollout.hold.as_ref().filter(|h| h.paused.is_some());
        let held = match hold.and_then(|h| h.broke.as_ref()) {
            Some(why) => format!(", and the hold fails then: a gate broke: {why}"),
            None if hold.is_some() => ", and the hold's clock stands".into(),
            None => String::new(),
        };
        self.rollout.step = format!("{base}{AWAY}{held}");
    }

    /// Goes back from the candidate of rollout `id`, which no record
    /// judges any more ([`Self::orphaned_candidate`]); asked once per 3 s.
    fn revert_orphan(&mut self, id: i64) -> Vec<Step> {
        if self.asked_recently(Action::Revert(id), Instant::now()) {
            return Vec::new();
        }
        warn!(
            rollout = id,
            "rollout: its record is gone or another rollout's: going back to the tier's desired state"
        );
        self.rollout.busy = true;
        vec![Step::Revert { id, say: false }]
    }

    fn rollout_decide(&self, record: &Rollout, at: i64, now: u64) -> Action {
        let local = Local {
            applied: self.tier.candidate.or(self.tier.applied),
            holding: self.rollout.hold.as_ref().map(|h| (h.id, h.since)),
        };
        let view = View {
            rollout: Some((record, at)),
            desired: self.tier.seen,
            progress: &self.rollout.progress,
        };
        // The snapshot (every VIP's health and table) only while holding.
        decide(&view, &self.tier.name, &local, now, |ending| {
            match &self.rollout.hold {
                Some(Hold {
                    broke: Some(why), ..
                }) => Err(format!("{why} (while etcd was away)")),
                Some(h) => self.judge(h, &record.expected, ending),
                None => Ok(()),
            }
        })
    }

    /// The steps of `action`, and what the daemon itself notes of it.
    fn rollout_act(&mut self, action: Action, record: &Rollout, at: i64, now: u64) -> Vec<Step> {
        match action {
            Action::Wait(_) | Action::Idle => return Vec::new(),
            // The etcd task reads the progress right after the record.
            Action::StartHold(_) if !self.rollout.progress_read => return Vec::new(),
            Action::StartHold(id) => {
                let Some(hold) = self.resumed_hold(id, record, now) else {
                    return self.revert_orphan(id);
                };
                self.say_unjudged(id);
                self.rollout.hold = Some(hold);
                return Vec::new();
            }
            _ => {}
        }
        if self.asked_recently(action.clone(), Instant::now()) {
            return Vec::new();
        }
        self.rollout_steps(action, record, at)
    }

    /// How long a revert of rollout `id` waits to be asked again.
    fn revert_wait(&self, id: i64) -> Duration {
        match self.rollout.revert_wait {
            Some((of, wait)) if of == id => wait,
            _ => ASK_AGAIN,
        }
    }

    /// Whether `action` was asked less than 3 s (a revert: its wait)
    /// before `now`; if not, it is asked now.
    pub(super) fn asked_recently(&mut self, action: Action, now: Instant) -> bool {
        let wait = match action {
            Action::Revert(id) => self.revert_wait(id),
            _ => ASK_AGAIN,
        };
        let repeated = self
            .rollout
            .sent
            .as_ref()
            .is_some_and(|(a, t)| *a == action && now.saturating_duration_since(*t) < wait);
        if !repeated {
            self.rollout.sent = Some((action, now));
        }
        repeated
    }

    /// The steps of an action that does something.
    fn rollout_steps(&mut self, action: Action, record: &Rollout, at: i64) -> Vec<Step> {
        let step = |name: &str| {
            self.metrics
                .tier_rollout_steps
                .with_label_values(&[name])
                .inc()
        };
        let mark = |id: i64, outcome: Outcome| {
            Step::Write(Write::Rollout {
                at,
                desired_at: None,
                record: marked(record, id, outcome),
            })
        };
        match action {
            Action::Apply(id) => {
                step("apply");
                info!(
                    rollout = id,
                    "rollout: this balancer's wave started; applying the candidate"
                );
                // Kept before the candidate runs: a restart from here on
                // judges its hold against the state before it.
                let before = self.rollout_snapshot();
                let candidate = crate::digest::text(&record.desired);
                self.keep_hold(id, &candidate, &before, &Change::default());
                self.rollout.before = Some((id, before, candidate));
                self.rollout.busy = true;
                vec![Step::Apply(Desired {
                    revision: id,
                    text: record.desired.as_str().into(),
                    rollout: true,
                })]
            }
            Action::Pass(id) => {
                step("pass");
                info!(
                    rollout = id,
                    "rollout: the gates held for {} s here: passed", record.hold_secs
                );
                vec![progress(id, Phase::Passed)]
            }
            Action::Fail(id, why) => {
                step("fail");
                warn!(
                    rollout = id,
                    "rollout: a gate failed here, reverting the tier: {why}"
                );
                self.rollout.busy = true;
                let by = self.tier.name.clone();
                let why = cut(why);
                vec![
                    progress(id, Phase::Failed { why: why.clone() }),
                    mark(id, Outcome::Failed { by, why }),
                    Step::Revert { id, say: false },
                ]
            }
            Action::MarkFailed(id, by, why) => vec![mark(id, Outcome::Failed { by, why })],
            Action::Revert(id) => {
                step("revert");
                warn!(
                    rollout = id,
                    "rollout: it failed; going back to the tier's desired state"
                );
                self.rollout.busy = true;
                vec![Step::Revert { id, say: true }]
            }
            Action::Promote(id, _) => {
                step("promote");
                info!(
                    rollout = id,
                    "rollout: every wave passed; promoting the candidate"
                );
                let record = marked(record, id, Outcome::Done);
                vec![Step::Write(Write::Promote { at, record })]
            }
            Action::Wait(_) | Action::Idle | Action::StartHold(_) => Vec::new(),
        }
    }

    /// The candidate of rollout `id` was applied (with what the change
    /// explains), or refused: the steps that follow.
    pub fn rollout_applied(
        &mut self,
        id: i64,
        result: std::result::Result<Change, String>,
        now: u64,
    ) -> Vec<Step> {
        self.rollout.busy = false;
        let (before, candidate) = match self.rollout.before.take() {
            Some((at, snapshot, candidate)) if at == id => (snapshot, Some(candidate)),
            _ => (self.rollout_snapshot(), None),
        };
        match result {
            Ok(change) => {
                self.say_unjudged(id);
                self.tier.candidate = Some(id);
                if let Some(candidate) = &candidate {
                    self.keep_hold(id, candidate, &before, &change);
                }
                self.rollout.hold = Some(Hold::new(id, now, before, change, None));
                Vec::new()
            }
            Err(why) => {
                self.forget_hold();
                let Some(Ok((record, at))) = self.rollout.record.clone() else {
                    return Vec::new();
                };
                let why = format!("refused here: {why}");
                self.rollout_act(Action::Fail(id, why), &record, at, now)
            }
        }
    }

    /// The candidate of rollout `id` was not applied: a newer desired
    /// state came while it was read. Nothing is written: the rollout is
    /// superseded (`decide` leaves it to the desired state).
    pub fn rollout_superseded(&mut self, id: i64) {
        info!(
            rollout = id,
            "rollout: a newer desired state came before its candidate was applied; following that"
        );
        self.rollout.busy = false;
        self.rollout.before = None;
        self.forget_hold();
    }

    /// A revert (to the tier's desired state) ended: the steps that
    /// follow.
    pub fn rollout_reverted(&mut self, id: i64, say: bool, ok: bool) -> Vec<Step> {
        self.rollout.busy = false;
        if !ok {
            let wait = (self.revert_wait(id) * 2).min(REVERT_WAIT_MAX);
            self.rollout.revert_wait = Some((id, wait));
            warn!(
                rollout = id,
                "rollout: going back failed; the candidate still runs here (tried again in {} s)",
                wait.as_secs()
            );
            return Vec::new();
        }
        self.rollout.revert_wait = None;
        self.rollout.hold = None;
        self.tier.candidate = None;
        self.forget_hold();
        if say {
            vec![progress(id, Phase::Reverted)]
        } else {
            Vec::new()
        }
    }

    /// The hold of rollout `id`'s candidate, which runs here but is not
    /// held: `lbd` restarted during the hold. It is judged against the
    /// state before the candidate that the last `lbd` kept (`hold.json`),
    /// with the change it explained, and packets forwarded count from now
    /// (a reboot starts the counters over); without one (an older `lbd`,
    /// a file lost), against the state now. Its clock starts over. `None`:
    /// the kept hold names another candidate under this id (etcd's
    /// history went back), so the one running here is not this record's.
    fn resumed_hold(&self, id: i64, record: &Rollout, now: u64) -> Option<Hold> {
        let candidate = crate::digest::text(&record.desired);
        let saved = match self.revisions.hold() {
            Ok(Some(saved)) if saved.rollout == id && saved.candidate != candidate => {
                warn!(
                    rollout = id,
                    "rollout: the candidate running here is not this record's (etcd's history went back?): going back to the tier's desired state"
                );
                return None;
            }
            Ok(Some(saved)) if saved.rollout == id => Some(saved),
            Ok(_) => None,
            Err(e) => {
                warn!(rollout = id, "rollout: the kept hold is unreadable: {e}");
                None
            }
        };
        let (before, change, routes_after) = match saved {
            Some(saved) => {
                info!(
                    rollout = id,
                    "rollout: holding the candidate again after a restart, against the state before it"
                );
                let before = Snapshot {
                    forwarded: self.forwarded_total(),
                    ..saved.before
                };
                (before, saved.change, Some(now))
            }
            None => {
                warn!(
                    rollout = id,
                    "rollout: holding the candidate again after a restart; no state from before it was kept, so the gates compare with the state now"
                );
                (self.rollout_snapshot(), Change::default(), None)
            }
        };
        Some(Hold::new(id, now, before, change, routes_after))
    }

    /// Keeps the hold of rollout `id` (its candidate's digest, the state
    /// before it, what the change explains) for a restart (`hold.json`).
    /// A failure is logged: a restart would then judge against the state
    /// it finds.
    fn keep_hold(&self, id: i64, candidate: &str, before: &Snapshot, change: &Change) {
        let saved = crate::revisions::SavedHold {
            rollout: id,
            candidate: candidate.to_string(),
            before: before.clone(),
            change: change.clone(),
            before_desired: None,
        };
        if let Err(e) = self.revisions.save_hold(Some(&saved)) {
            warn!(rollout = id, "rollout: keeping the hold for a restart: {e}");
        }
    }

    /// Adds the desired state that ran before the candidate (`revision`,
    /// `text`) to the kept hold, for a revert after a restart. A failure
    /// is logged: such a revert then goes to the tier's newest.
    pub fn keep_before_candidate(&self, revision: i64, text: &str) {
        let kept = match self.revisions.hold() {
            Ok(Some(mut saved)) => {
                saved.before_desired = Some((revision, text.to_string()));
                self.revisions.save_hold(Some(&saved))
            }
            Ok(None) => return,
            Err(e) => Err(e),
        };
        if let Err(e) = kept {
            warn!("rollout: keeping the state before the candidate for a restart: {e}");
        }
    }

    /// The desired state that ran before rollout `id`'s candidate, as the
    /// last `lbd` kept it with its hold.
    pub fn kept_before_candidate(&self, id: i64) -> Option<(i64, String)> {
        let saved = self.revisions.hold().ok().flatten()?;
        (saved.rollout == id)
            .then_some(saved.before_desired)
            .flatten()
    }

    /// No candidate runs here any more: nothing to hold after a restart.
    pub(super) fn forget_hold(&self) {
        if let Err(e) = self.revisions.save_hold(None) {
            warn!("rollout: removing the kept hold: {e}");
        }
    }

    /// The gates of `hold` now (`ending`: at the hold's end), the routes
    /// aside while it waits for them after a restart.
    fn judge(
        &self,
        hold: &Hold,
        expected: &BTreeMap<String, Expected>,
        ending: bool,
    ) -> std::result::Result<(), String> {
        let mut now = self.rollout_snapshot();
        if hold.routes_after.is_some() {
            // Routes not judged yet: taken as they were.
            now.announced.clone_from(&hold.before.announced);
        }
        gates(&hold.before, &now, expected, &hold.change, ending)
    }

    /// A hold taken up after a restart waits for the BGP sessions, which
    /// start over with `lbd`: its clock stands until every peer has as
    /// many routes as before the candidate again (less those the change
    /// removed), or [`Self::routes_grace`] passed; from then on the routes are
    /// judged like every gate. Otherwise a restart during a rollout would
    /// fail it for routes the restart, not the candidate, took away.
    fn await_routes(&mut self, now: u64) {
        if (self.rollout.hold.as_ref()).is_none_or(|h| h.routes_after.is_none()) {
            return;
        }
        let announced = self.announced_now();
        let grace = self.routes_grace();
        let Some(hold) = &mut self.rollout.hold else {
            return;
        };
        let Some(from) = hold.routes_after else {
            return;
        };
        let missing = routes_missing(&hold.before.announced, &announced, &hold.change);
        if missing.is_empty() {
            info!(
                rollout = hold.id,
                "rollout: every peer has its routes again after the restart; the hold starts"
            );
            hold.routes_after = None;
        } else if now.saturating_sub(from) >= grace {
            warn!(
                rollout = hold.id,
                "rollout: routes still missing {grace} s after the restart; judged from now: {}",
                missing.join("; ")
            );
            hold.routes_after = None;
            hold.since = now;
        } else {
            hold.since = now;
        }
    }

    /// `action` for rollout `id` while its hold waits for the peers'
    /// routes after a restart: it neither passes nor counts seconds.
    fn while_routes_return(&self, action: Action, id: i64, now: u64) -> Action {
        let Some(from) = (self.rollout.hold.as_ref())
            .filter(|h| h.id == id)
            .and_then(|h| h.routes_after)
        else {
            return action;
        };
        match action {
            Action::Pass(_) | Action::Wait(_) => Action::Wait(format!(
                "holding: waiting for the peers' routes after a restart, {} s of at most {} s",
                now.saturating_sub(from),
                self.routes_grace()
            )),
            other => other,
        }
    }

    /// How long a hold taken up after a restart waits for the peers'
    /// routes (seconds): a minute, or longer if the BGP settings need it.
    /// A router keeps the session of a killed `lbd` (no Cease was sent)
    /// until its hold timer expires and refuses the new one meanwhile;
    /// `lbd` connects out only, and tries again within
    /// `connect_retry.max`.
    pub(super) fn routes_grace(&self) -> u64 {
        let bgp = self.config.announce.bgp.as_ref();
        let needs = bgp.map_or(0, |b| {
            (b.hold_time + b.connect_retry.max).as_secs() + ROUTES_MARGIN
        });
        needs.max(ROUTES_GRACE)
    }

    /// Routes each peer has from this balancer now.
    pub(super) fn announced_now(&self) -> BTreeMap<String, usize> {
        self.announcers
            .peer_rows()
            .into_iter()
            .map(|p| (p.peer.clone(), p.prefixes_announced))
            .collect()
    }

    /// Packets forwarded so far (every CPU, every forwarding outcome).
    fn forwarded_total(&self) -> u64 {
        lb_common::counters::Counter::ALL
            .iter()
            .filter(|c| c.kind() == lb_common::counters::Kind::Forward)
            .filter_map(|c| self.samples_latest_counters().get(*c as usize))
            .map(|v| v.packets)
            .sum()
    }

    /// What the gates compare, now.
    fn rollout_snapshot(&self) -> Snapshot {
        let health = self.health();
        let layout = &self.config.layout;
        let sizes: BTreeMap<String, u32> = self
            .config
            .vips
            .iter()
            .map(|v| (v.id.to_string(), v.maglev_size(layout)))
            .collect();
        let changed = self.changed_here();
        let mut snapshot = Snapshot::default();
        for v in &health {
            let vip = v.vip.to_string();
            let serving = |b: &crate::api::BackendHealth| {
                b.state == BackendState::Active
                    && (b.effective_weight - f64::from(b.weight)).abs() < 1e-9
            };
            if !v.panic && v.backends.iter().all(serving) && !changed.contains(&v.vip) {
                snapshot.nominal.insert(vip.clone());
            }
            for b in &v.backends {
                let name = format!("{vip} {}", b.address);
                if matches!(b.state, BackendState::Down | BackendState::Ejected) {
                    snapshot.down.insert(name);
                } else if matches!(b.state, BackendState::Active | BackendState::SlowStart)
                    && (b.check.is_none() || b.health == "up")
                {
                    snapshot.serving.insert(name);
                }
            }
        }
        for (id, (_, digest)) in &self.table_digests {
            let vip = id.to_string();
            let size = sizes.get(&vip).copied().unwrap_or(layout.table_size);
            snapshot.tables.insert(vip, (size, digest.clone()));
        }
        snapshot.announced = self.announced_now();
        let samples = &self.rollout.forwarded;
        snapshot.forwarded = samples.back().copied().unwrap_or(0);
        snapshot.forwarding = samples.front() < samples.back();
        snapshot
    }

    /// VIPs whose backends or weights runtime changes (`lbctl backend`,
    /// `lbctl vip`) alter here. Their tables are this balancer's own: the
    /// plan computed the desired state's, so the gates do not compare them.
    fn changed_here(&self) -> BTreeSet<VipId> {
        let members = |v: &VipConfig| -> BTreeMap<IpAddr, u32> {
            v.backends.iter().map(|b| (b.address, b.weight)).collect()
        };
        let base: BTreeMap<VipId, _> = self
            .config
            .vips
            .iter()
            .map(|v| (v.id, members(v)))
            .collect();
        self.effective()
            .iter()
            .filter(|v| base.get(&v.id) != Some(&members(v)))
            .map(|v| v.id)
            .collect()
    }

    /// Logs the VIPs whose tables the hold of rollout `id` does not
    /// compare, if any ([`Self::unjudged`]).
    fn say_unjudged(&self, id: i64) {
        if let Some(note) = self.unjudged() {
            info!(rollout = id, "rollout: {note}");
        }
    }

    /// What a hold says of the VIPs it does not compare with the plan
    /// ([`Self::changed_here`]); `None` if it compares them all.
    pub(super) fn unjudged(&self) -> Option<String> {
        let changed = self.changed_here();
        (!changed.is_empty()).then(|| {
            let vips: Vec<String> = changed.iter().map(ToString::to_string).collect();
            format!(
                "runtime changes here (lbctl overrides) give {} a table of its own: not compared with the plan's",
                vips.join(", ")
            )
        })
    }

    /// `lbctl tier rollout`: the plan of a rollout of `text` (a desired
    /// state), checked against this balancer's file, with the slot moves
    /// of each VIP here and the digests every balancer should compute.
    pub fn rollout_plan(
        &self,
        text: &str,
        canary: Option<&str>,
        waves: usize,
        hold_secs: u64,
    ) -> Result<(RolloutPlan, Rollout, Option<i64>, i64)> {
        let Some(source) = self.config.source.clone() else {
            return Err(refused(
                ErrorKind::NotFound,
                "this balancer takes its VIPs from its file: no tier to roll out to",
            ));
        };
        self.refuse_while_in_progress()?;
        let candidate = Desired {
            revision: 0,
            text: text.into(),
            rollout: true,
        };
        let running = self.text.clone();
        let (composed, config) =
            crate::tier::with_vips(&running, &candidate, "the rollout's desired state".into())
                .map_err(|e| refused(ErrorKind::InvalidConfig, e.to_string()))?;
        let target = super::commit::Target {
            config: config.clone(),
            text: composed.into(),
            overlay: self.overlay.clone(),
        };
        let preview = self.preview(&target)?;
        // Members that do not report (stopped, cut off) are left out of
        // the plan: they would hold it up; they take the state when it is
        // promoted.
        let members: Vec<String> = self
            .tier
            .members
            .iter()
            .filter(|m| m.report.is_some())
            .map(|m| m.name.clone())
            .collect();
        let waves = crate::tier::rollout::plan(&members, canary, waves)
            .map_err(|e| refused(ErrorKind::BadRequest, e))?;
        let record = Rollout {
            desired: text.to_string(),
            waves,
            hold_secs,
            expected: nominal_tables(&config),
            by: format!("lbctl tier rollout on {}", self.tier.name),
            revision: None,
            outcome: None,
        };
        record
            .check()
            .map_err(|e| refused(ErrorKind::BadRequest, e))?;
        check_record_size(&record)?;
        let at = match &self.rollout.record {
            Some(Ok((_, at))) | Some(Err((at, _))) => *at,
            None => 0,
        };
        let plan = RolloutPlan {
            prefix: source.prefix,
            waves: record.waves.clone(),
            hold_secs,
            preview: Some(preview),
            revision: None,
            aborted: false,
        };
        // The desired key as it is now (absent: 0); a rollout started
        // after a deletion compared the newest revision seen, and every
        // attempt was refused as "changed since the plan".
        let desired_at = self.tier.desired_key_at.or(self.tier.seen);
        Ok((plan, record, desired_at, at))
    }

    /// A rollout in progress refuses another; an unreadable, ended or
    /// superseded record may be replaced.
    fn refuse_while_in_progress(&self) -> Result<()> {
        match self.rollout_view() {
            Some(view) if view.outcome.is_none() && !view.superseded && view.error.is_none() => {
                Err(refused(
                    ErrorKind::Conflict,
                    format!(
                        "rollout {} is in progress (lbctl tier status); abort it first (lbctl tier rollout --abort)",
                        view.revision
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `lbctl tier rollout --abort`: the record marked aborted.
    pub fn rollout_abort(&self, why: &str) -> Result<Write> {
        let Some(Ok((record, at))) = self.rollout.record.clone() else {
            return Err(refused(ErrorKind::NotFound, "no rollout to abort"));
        };
        if record.outcome.is_some() {
            return Err(refused(ErrorKind::Conflict, "the rollout already ended"));
        }
        let aborted = Outcome::Aborted { why: why.into() };
        Ok(Write::Rollout {
            at,
            desired_at: None,
            record: marked(&record, record.id(at), aborted),
        })
    }

    /// The rollout as `lbctl tier status` shows it.
    pub fn rollout_view(&self) -> Option<RolloutView> {
        let (record, at) = match self.rollout.record.as_ref()? {
            Ok((r, at)) => (r, *at),
            Err((at, why)) => {
                return Some(RolloutView {
                    revision: *at,
                    error: Some(why.clone()),
                    ..RolloutView::default()
                });
            }
        };
        let id = record.id(at);
        let phase = |name: &String| -> String {
            match self.rollout.progress.get(name).filter(|p| p.rollout == id) {
                Some(p) => match &p.phase {
                    Phase::Passed => "passed".into(),
                    Phase::Failed { why } => format!("FAILED: {why}"),
                    Phase::Reverted => "reverted".into(),
                },
                None => "-".into(),
            }
        };
        Some(RolloutView {
            revision: id,
            by: record.by.clone(),
            hold_secs: record.hold_secs,
            waves: record
                .waves
                .iter()
                .map(|w| w.iter().map(|n| (n.clone(), phase(n))).collect())
                .collect(),
            outcome: record.outcome.clone(),
            superseded: self.tier.seen.is_some_and(|d| d > id) && record.outcome.is_none(),
            step: self.rollout.step.clone(),
            error: None,
        })
    }
}

/// A failure's reason cut to [`OUTCOME_ROOM`] / 8 characters: what a
/// marked record has room for, and well within a progress entry's 16 KiB
/// (a longer one every balancer would skip as unreadable).
pub(super) fn cut(why: String) -> String {
    let room = OUTCOME_ROOM / 8;
    match why.char_indices().nth(room) {
        Some((at, _)) => format!("{}…", &why[..at]),
        None => why,
    }
}

/// The record marked with how rollout `id` ended. A reason is cut to
/// [`OUTCOME_ROOM`] / 8 characters (each at most 6 bytes in JSON, an
/// escaped control character), so that the marked record stays within the
/// room [`Daemon::rollout_plan`] left it.
pub(super) fn marked(record: &Rollout, id: i64, outcome: Outcome) -> Rollout {
    let outcome = match outcome {
        Outcome::Failed { by, why } => Outcome::Failed { by, why: cut(why) },
        Outcome::Aborted { why } => Outcome::Aborted { why: cut(why) },
        done => done,
    };
    let mut marked = record.clone();
    marked.revision = Some(id);
    marked.outcome = Some(outcome);
    marked
}

/// The record as written (the text escaped, the plan and the tables
/// beside it) must leave [`OUTCOME_ROOM`] for its outcome: a record every
/// balancer refuses as too big would be "written" and never run. And the
/// promotion, one transaction writing the desired state and the marked
/// record (which holds it again), must fit etcd's request limit: refused
/// there, every wave would pass and the change never be promoted.
fn check_record_size(record: &Rollout) -> Result<()> {
    let size = serde_json::to_vec(record).map_or(usize::MAX, |j| j.len());
    let most = crate::tier::rollout::MAX_ROLLOUT_BYTES - OUTCOME_ROOM;
    let vips = record.expected.len();
    if size > most {
        return Err(refused(
            ErrorKind::Capacity,
            format!(
                "the rollout record would be {size} bytes (the desired state, its {vips} VIPs' tables, the plan), more than the {most} a balancer reads; write it with etcdctl as the desired state, or in smaller steps"
            ),
        ));
    }
    let promotion = size + OUTCOME_ROOM + record.desired.len();
    if promotion > ETCD_MAX_REQUEST {
        return Err(refused(
            ErrorKind::Capacity,
            format!(
                "promoting the rollout would write {promotion} bytes at once (the desired state, and the record that holds it again), more than the {ETCD_MAX_REQUEST} etcd takes in one request by default; write it with etcdctl as the desired state, or in smaller steps"
            ),
        ));
    }
    Ok(())
}

/// Bytes a rollout record keeps free for its outcome (and the revision)
/// when it is written: marked failed with a long reason, a record of the
/// largest size would be unreadable to every balancer.
const OUTCOME_ROOM: usize = 8 << 10;

/// etcd's default limit of one request (`--max-request-bytes`, 1.5 MiB),
/// less room for the transaction's keys and framing.
const ETCD_MAX_REQUEST: usize = (3 << 19) - (4 << 10);

fn progress(id: i64, phase: Phase) -> Step {
    Step::Write(Write::Progress(Progress { rollout: id, phase }))
}

/// Each VIP's nominal table (every backend at its configured weight) as
/// every balancer with the same table size computes it.
pub fn nominal_tables(config: &Config) -> BTreeMap<String, Expected> {
    let mut out = BTreeMap::new();
    for v in &config.vips {
        let m = v.maglev_size(&config.layout);
        let members: BTreeMap<std::net::IpAddr, u32> =
            v.backends.iter().map(|b| (b.address, b.weight)).collect();
        if let Ok(Some(slots)) = crate::reconcile::maglev_table(&members, m) {
            let slots: Vec<_> = slots.into_iter().map(Some).collect();
            out.insert(
                v.id.to_string(),
                Expected {
                    table_size: m,
                    digest: crate::digest::table(&slots),
                },
            );
        }
    }
    out
}

/// What a change from `old` to `new` explains: the backends it adds, and
/// the routes of the VIP addresses it removes.
pub fn change(old: &Config, new: &Config) -> Change {
    let backends = |c: &Config| -> BTreeSet<String> {
        c.vips
            .iter()
            .flat_map(|v| {
                v.backends
                    .iter()
                    .map(move |b| format!("{} {}", v.id, b.address))
            })
            .collect()
    };
    let addresses =
        |c: &Config| -> BTreeSet<std::net::IpAddr> { c.vips.iter().map(|v| v.id.addr).collect() };
    Change {
        added: backends(new).difference(&backends(old)).cloned().collect(),
        removed_routes: addresses(old).difference(&addresses(new)).count(),
    }
}

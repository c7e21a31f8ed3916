//! The daemon's side of a tier ([`crate::tier`]): what the etcd task last
//! said (connected or not, the newest desired state seen, the members and
//! their reports), what this balancer applied or refused, the report it
//! publishes, and `lbctl tier status`. Applying a desired state is a
//! reload ([`Daemon::reload`] with a composed file), so nothing here
//! touches the maps.

use std::{collections::BTreeMap, time::SystemTime};

use tracing::{info, warn};

use super::{Daemon, Result, refused};
use crate::{
    api::{BackendState, ErrorKind, TierStatus},
    dataplane::Dataplane,
    tier::{Member, Report, compare},
};

/// What the daemon knows of its tier.
#[derive(Clone, Debug, Default)]
pub struct TierState {
    /// Connected (with the cluster's revision then) or why not, and since
    /// when; `None` before the first word from the task.
    link: Option<(Result<i64, String>, SystemTime)>,
    /// The newest desired revision seen, and why it was refused if it was.
    pub(super) seen: Option<i64>,
    /// The desired revisions refused since one applied (the newest 64),
    /// each with whether `--force` overrides its refusal (a serving VIP's
    /// table size or hash, the blackhole guard).
    refusals: BTreeMap<i64, bool>,
    /// The desired key's own revision as last read: 0 once deleted (what
    /// etcd compares an absent key as), `None` before any word of it. A
    /// rollout's compare-and-swap asks for it.
    pub(super) desired_key_at: Option<i64>,
    refused: Option<String>,
    /// The desired revision this balancer runs (or ran before the
    /// candidate).
    pub(super) applied: Option<i64>,
    /// The rollout whose candidate this balancer runs, if it does.
    pub(super) candidate: Option<i64>,
    /// etcd's history went back below `applied` (restored from a
    /// snapshot, or a new cluster): the desired revision it was at then.
    /// A write after it is new, whatever its number.
    rewound: Option<i64>,
    /// Something the operator should know (the desired key deleted, etcd
    /// behind what was applied).
    note: Option<String>,
    pub(super) members: Vec<Member>,
    /// This balancer's name in the tier (`source.etcd.name`, or the host
    /// name).
    pub(super) name: String,
}

impl<D: Dataplane> Daemon<D> {
    /// At start: this balancer's name in the tier, and the desired
    /// revision (or the rollout's candidate) the running configuration
    /// came from.
    pub fn tier_started(&mut self, name: String, applied: Option<(i64, bool)>) {
        self.tier.name = name;
        match applied {
            Some((revision, true)) => self.tier.candidate = Some(revision),
            Some((revision, false)) => {
                self.tier.applied = Some(revision);
                self.tier.seen = Some(revision);
                self.metrics.tier_applied.set(revision);
                self.metrics.tier_seen.set(revision);
            }
            None => {}
        }
    }

    /// Connected to etcd (`None` without a tier, or before the first
    /// word from the task).
    pub fn tier_link_up(&self) -> Option<bool> {
        self.tier.link.as_ref().map(|(l, _)| l.is_ok())
    }

    /// The revision running here if it is not the file composed with the
    /// tier's desired state (or a rollout's candidate) as last read: a
    /// revert (`lbctl revert`, a probation's automatic one, or a restart
    /// that kept one), with any runtime change on top. It runs until a
    /// reload composes something else (a newer desired state, a changed
    /// file).
    pub fn tier_reverted(&self) -> Option<u64> {
        self.config.source.as_ref()?;
        self.runs_other_than_file().then_some(self.revision)
    }

    /// The desired revision this balancer runs.
    pub fn tier_applied(&self) -> Option<i64> {
        self.tier.applied
    }

    /// The etcd task connected (with the cluster's revision) or lost etcd.
    /// Its time is when the link last went up or down: a failed retry
    /// while etcd stays away keeps the time it went (the reason is the
    /// newest).
    pub fn on_tier_link(&mut self, link: std::result::Result<i64, String>) {
        let was = self.tier.link.as_ref().map(|(l, t)| (l.is_ok(), *t));
        if let Ok(revision) = &link
            && was.is_none_or(|(up, _)| !up)
        {
            info!(
                revision,
                "etcd: connected; following the tier's desired state"
            );
        }
        let since = match was {
            Some((up, t)) if up == link.is_ok() => t,
            _ => SystemTime::now(),
        };
        self.tier.link = Some((link, since));
        self.metrics
            .tier_connected
            .set(i64::from(matches!(self.tier.link, Some((Ok(_), _)))));
    }

    /// A desired state seen: `true` if it should be applied (newer than
    /// the one running). One older than what runs means etcd's history
    /// went back (restored from a snapshot, which keeps the snapshot's
    /// revision, or a new cluster): what it holds then is not applied,
    /// the balancer keeps what it runs and says so, and the next write
    /// is applied, though its revision is below the one applied before.
    pub fn tier_should_apply(&mut self, revision: i64) -> bool {
        self.tier_saw(revision);
        if let Some(candidate) = self.tier.candidate
            && revision < candidate
        {
            // The rollout decides whether this balancer keeps its
            // candidate or goes back to this desired state.
            self.tier.applied.get_or_insert(revision);
            return false;
        }
        match self.tier.applied {
            // First: a write after the rewind may land on any number,
            // the applied one's too.
            Some(_) if self.tier.rewound.is_some_and(|r| revision > r) => true,
            Some(applied) if revision == applied => false,
            Some(applied) if revision < applied => {
                self.tier_rewound(revision, applied);
                false
            }
            _ => true,
        }
    }

    /// etcd's desired state is at `revision`, below the `applied` one:
    /// its history went back. The newest seen is counted from there (a
    /// rollout's compare-and-swap asks for it).
    fn tier_rewound(&mut self, revision: i64, applied: i64) {
        let note = format!(
            "etcd's desired state is at revision {revision}, behind the {applied} this balancer applied (etcd restored from a snapshot, or a new cluster?): keeping what runs until the next write of the desired state, which applies"
        );
        if self.tier.rewound != Some(revision) {
            warn!("{note}");
        }
        self.tier.note = Some(note);
        self.tier_went_back(revision);
    }

    /// etcd's history went back to `revision`: a write after it is new;
    /// the newest seen counts from there, and a refusal of the old
    /// history's newest is over.
    fn tier_went_back(&mut self, revision: i64) {
        self.tier.rewound = Some(revision);
        self.tier.seen = Some(revision);
        self.tier.refused = None;
        self.tier.refusals.clear();
        self.metrics.tier_seen.set(revision);
        self.metrics.tier_refused.set(0);
    }

    /// etcd reports something at `revision`, below the applied revision:
    /// its history went back (an unreadable or absent desired state; a
    /// readable one goes through [`Self::tier_should_apply`]).
    fn tier_went_back_if_below(&mut self, revision: i64) {
        if self.tier.applied.is_some_and(|a| revision < a) {
            self.tier_went_back(revision);
        }
    }

    /// The newest desired revision seen is at least `revision`.
    fn tier_saw(&mut self, revision: i64) {
        self.tier.desired_key_at = Some(revision);
        let seen = self.tier.seen.map_or(revision, |s| s.max(revision));
        self.tier.seen = Some(seen);
        self.metrics.tier_seen.set(seen);
    }

    /// This balancer refused desired revision `revision` (since it last
    /// applied one). Not "the newest seen was refused": a newer one read
    /// but not yet judged is not refused, and one refused before it stays
    /// so (helper-35).
    pub fn tier_refused(&self, revision: i64) -> bool {
        self.tier.refusals.contains_key(&revision)
    }

    /// This balancer refused desired revision `revision` for something
    /// `--force` overrides.
    pub fn tier_refused_forceable(&self, revision: i64) -> bool {
        self.tier.refusals.get(&revision) == Some(&true)
    }

    /// The refusal of desired revision `revision` is one `--force`
    /// overrides.
    pub fn tier_refusal_forceable(&mut self, revision: i64) {
        if let Some(forceable) = self.tier.refusals.get_mut(&revision) {
            *forceable = true;
        }
    }

    /// The outcome of applying desired revision `revision`. A refusal of
    /// a newer one seen meanwhile stands.
    pub fn tier_outcome(&mut self, revision: i64, result: std::result::Result<(), String>) {
        match result {
            Ok(()) => {
                self.tier.applied = Some(revision);
                self.tier.rewound = None;
                if self.tier.candidate.take().is_some() {
                    self.forget_hold();
                }
                if self.tier.seen.is_none_or(|seen| seen <= revision) {
                    self.tier.refused = None;
                    self.metrics.tier_refused.set(0);
                }
                self.tier.refusals.retain(|r, _| *r > revision);
                self.tier.note = None;
                self.metrics.tier_applied.set(revision);
            }
            Err(why) => {
                warn!(
                    revision,
                    "etcd: desired state refused, keeping the running one: {why}"
                );
                self.tier.refused = Some(why);
                self.tier.refusals.insert(revision, false);
                if self.tier.refusals.len() > 64 {
                    self.tier.refusals.pop_first();
                }
                self.metrics.tier_refused.set(1);
            }
        }
    }

    /// A desired state that is not one (too large, not text).
    /// Below the applied revision, etcd went back (see
    /// [`Self::tier_should_apply`]).
    pub fn tier_unreadable(&mut self, revision: i64, why: String) {
        self.tier_went_back_if_below(revision);
        self.tier_saw(revision);
        self.tier_outcome(revision, Err(why));
    }

    /// The desired key is absent (deleted, or never written).
    pub fn tier_desired_absent(&mut self, revision: i64) {
        self.tier.desired_key_at = Some(0);
        let note = format!(
            "etcd has no desired state (key absent at revision {revision}): keeping what runs; an empty tier is written as `vips: []`"
        );
        if self.tier.applied.is_some() {
            warn!("{note}");
        }
        self.tier.note = Some(note);
        // Absent below what was applied: etcd went back to before the
        // key was written (a snapshot restored, a new cluster); the next
        // write is new.
        self.tier_went_back_if_below(revision);
    }

    /// The tier's members and their reports, as last read.
    pub fn on_tier_members(&mut self, members: Vec<Member>) {
        self.tier.members = members;
    }

    /// What this balancer publishes (`None` without a tier).
    pub fn tier_report(&mut self) -> Option<Report> {
        self.config.source.as_ref()?;
        let name = self.tier.name.clone();
        let down = self
            .health()
            .into_iter()
            .flat_map(|v| {
                v.backends
                    .into_iter()
                    .filter(|b| matches!(b.state, BackendState::Down | BackendState::Ejected))
                    .map(move |b| format!("{} {} {}", v.vip, b.address, b.state.name()))
            })
            .collect();
        let announced = self.announced_now();
        Some(Report {
            name,
            version: crate::VERSION.to_string(),
            applied: self.tier.applied,
            candidate: self.tier.candidate,
            reverted: self.tier_reverted(),
            seen: self.tier.seen,
            refused: self.tier.refused.clone(),
            revision: self.revision,
            config_digest: self.running_digest(),
            tables: self
                .table_digests
                .iter()
                .map(|(id, (_, d))| (id.to_string(), d.clone()))
                .collect(),
            announced,
            down,
            overrides: self.override_rows().len(),
            last_error: self.last_reload.clone().filter(|r| r.starts_with("failed")),
            // The etcd task stamps its installation's id, and bounds it.
            instance: None,
            hash_key: Some(crate::digest::hash_key(self.settings.hash_key.as_ref())),
            down_omitted: 0,
            tables_omitted: 0,
        })
    }

    /// `lbctl tier status`.
    pub fn tier_status(&self) -> Result<TierStatus> {
        let Some(source) = &self.config.source else {
            return Err(refused(
                ErrorKind::NotFound,
                "this balancer takes its VIPs from its file: no tier (see `source.etcd`)",
            ));
        };
        let (connected, since, error) = match &self.tier.link {
            Some((Ok(_), t)) => (true, *t, None),
            Some((Err(e), t)) => (false, *t, Some(e.clone())),
            None => (false, SystemTime::now(), Some("not connected yet".into())),
        };
        Ok(TierStatus {
            name: self.tier.name.clone(),
            prefix: source.prefix.clone(),
            endpoints: source.endpoints.clone(),
            connected,
            since: super::views::humantime(since),
            error,
            seen: self.tier.seen,
            applied: self.tier.applied,
            refused: self.tier.refused.clone(),
            note: self.tier.note.clone(),
            flags: compare(&self.tier.members),
            members: self.tier.members.clone(),
            candidate: self.tier.candidate,
            reverted: self.tier_reverted(),
            rollout: self.rollout_view(),
        })
    }

    /// One line for `lbctl status`: where the VIPs come from.
    pub fn tier_line(&self) -> String {
        let Some(source) = &self.config.source else {
            return "file".into();
        };
        let link = match &self.tier.link {
            Some((Ok(_), _)) => "connected".to_string(),
            Some((Err(e), t)) => {
                format!("NOT CONNECTED since {}: {e}", super::views::humantime(*t))
            }
            None => "connecting".to_string(),
        };
        let applied = match (self.tier_reverted(), self.tier.candidate, self.tier.applied) {
            (Some(r), ..) => format!("revision {r} running, from a revert here"),
            (None, Some(c), _) => format!("rollout {c}'s candidate running"),
            (None, None, Some(a)) => format!("desired revision {a} applied"),
            (None, None, None) => "desired revision none yet applied".into(),
        };
        format!(
            "etcd {} ({link}; {applied}{})",
            source.prefix,
            if self.tier.refused.is_some() {
                "; the newest was REFUSED"
            } else {
                ""
            }
        )
    }
}

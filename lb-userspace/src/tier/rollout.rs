//! A staged rollout across a tier, decided by each balancer for itself.
//!
//! `<prefix>/rollout` holds a [`Rollout`]: the new desired state, its
//! waves (the first is the canary), how long each wave's gates must hold,
//! and the table digests every balancer should compute. Nobody
//! coordinates: each balancer reads the record and every balancer's
//! [`Progress`] (`<prefix>/progress/<name>`, durable, written only by its
//! owner) and [`decide`]s its own next step:
//!
//! 1. its wave starts when every balancer of the waves before it passed;
//! 2. it applies the candidate (a reload, checked and guarded as always;
//!    a refusal fails the rollout), then holds for `hold` while its
//!    [`gates`] hold;
//! 3. it writes "passed", or on any gate failing "failed" and marks the
//!    record failed (a compare-and-swap: marked once);
//! 4. every balancer that runs the candidate of a failed rollout reverts
//!    to the tier's desired state by itself;
//! 5. when every wave passed, one balancer promotes the candidate: the
//!    record's revision unchanged, it writes the candidate to `desired`
//!    and marks the record done, in one transaction.
//!
//! A desired state written after the rollout started supersedes it (etcd
//! revisions only grow), so a tool that writes `desired` directly always
//! wins. A balancer cut off from etcd keeps what it runs (fail static): a
//! canary holding the candidate keeps it until it hears again.
//!
//! Everything here is pure (time is passed in, in seconds): the daemon
//! runs it once a second; the tests run it on virtual time against a
//! fake store.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The record at `<prefix>/rollout` (JSON). Written by `lbctl tier
/// rollout` through `lbd`, or by any tool: `desired` and `waves` are
/// required, the rest has defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// The new desired state: a YAML document with `vips:`.
    pub desired: String,
    /// Balancer names, wave by wave; the first wave is the canary.
    pub waves: Vec<Vec<String>>,
    /// Seconds each wave's gates must hold before the next wave starts.
    #[serde(default = "default_hold")]
    pub hold_secs: u64,
    /// Per VIP, the table every balancer of that table size computes
    /// when all of the VIP's backends serve (checked by the gates where
    /// they do).
    #[serde(default)]
    pub expected: BTreeMap<String, Expected>,
    /// Who started it, in words.
    #[serde(default)]
    pub by: String,
    /// The revision the rollout started at, written with the outcome
    /// (until then, the record's own modification revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

fn default_hold() -> u64 {
    30
}

/// A VIP's nominal table: its size and digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Expected {
    pub table_size: u32,
    pub digest: String,
}

/// The most waves and the longest hold a record may ask for.
pub const MAX_WAVES: usize = 64;
pub const MAX_HOLD_SECS: u64 = 3600;
/// The largest rollout record taken (the desired state and the plan).
pub const MAX_ROLLOUT_BYTES: usize = crate::config::source::MAX_DESIRED_BYTES + (64 << 10);

/// How a rollout ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every wave passed; the candidate is the tier's desired state.
    Done,
    /// A gate failed on balancer `by`: every balancer that took the
    /// candidate reverts.
    Failed { by: String, why: String },
    /// Stopped by an operator (`lbctl tier rollout --abort`); reverted as
    /// a failure is.
    Aborted { why: String },
}

/// One balancer's progress in a rollout (`<prefix>/progress/<name>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Progress {
    /// The rollout (its revision).
    pub rollout: i64,
    pub phase: Phase,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Runs the candidate; its gates held for the whole hold.
    Passed,
    /// Refused the candidate, or a gate failed.
    Failed { why: String },
    /// Ran the candidate of a failed rollout, and went back.
    Reverted,
}

impl Rollout {
    /// The record as read from etcd: at most [`MAX_ROLLOUT_BYTES`], and
    /// a plan that makes sense (waves of known size, names once each).
    pub fn parse(value: &[u8]) -> Result<Rollout, String> {
        if value.len() > MAX_ROLLOUT_BYTES {
            return Err(format!(
                "the rollout record is {} bytes, more than {MAX_ROLLOUT_BYTES}",
                value.len()
            ));
        }
        let r: Rollout =
            serde_json::from_slice(value).map_err(|e| format!("not a rollout record: {e}"))?;
        r.check()?;
        Ok(r)
    }

    /// The plan's rules.
    pub fn check(&self) -> Result<(), String> {
        super::check_size(self.desired.len())?;
        if self.waves.is_empty() || self.waves.len() > MAX_WAVES {
            return Err(format!("a rollout has 1 to {MAX_WAVES} waves"));
        }
        if self.hold_secs > MAX_HOLD_SECS {
            return Err(format!("hold_secs is at most {MAX_HOLD_SECS}"));
        }
        let mut seen = BTreeSet::new();
        for name in self.waves.iter().flatten() {
            if !crate::config::source::valid_name(name) {
                return Err(format!("`{name}` is not a balancer name"));
            }
            if !seen.insert(name) {
                return Err(format!("{name} is in more than one wave"));
            }
        }
        if self.waves.iter().any(Vec::is_empty) || seen.len() > super::MAX_BALANCERS {
            return Err("every wave names at least one balancer, and at most 256 in all".into());
        }
        Ok(())
    }

    /// The rollout's revision, given the record's modification revision:
    /// `revision` only as the outcome's writer sets it (with an outcome,
    /// and no later than the record's own write). A tool that wrote a
    /// later one into a record in progress would make every balancer
    /// holding its candidate ignore the tier's newer desired states.
    pub fn id(&self, mod_revision: i64) -> i64 {
        match self.revision {
            Some(r) if self.outcome.is_some() && r <= mod_revision => r,
            _ => mod_revision,
        }
    }

    /// The wave `name` is in.
    pub fn wave_of(&self, name: &str) -> Option<usize> {
        self.waves.iter().position(|w| w.iter().any(|n| n == name))
    }
}

/// The waves of a rollout over `members`: `canary` (default: the first
/// by name) alone, then the rest in `waves` waves of near-equal size.
pub fn plan(
    members: &[String],
    canary: Option<&str>,
    waves: usize,
) -> Result<Vec<Vec<String>>, String> {
    let mut rest: Vec<String> = members.to_vec();
    rest.sort();
    rest.dedup();
    let canary = match canary {
        Some(c) => c.to_string(),
        None => rest.first().cloned().ok_or("the tier has no member")?,
    };
    let Some(at) = rest.iter().position(|n| *n == canary) else {
        return Err(format!("{canary} is not a member of the tier"));
    };
    rest.remove(at);
    let mut plan = vec![vec![canary]];
    let waves = waves.clamp(1, MAX_WAVES - 1).min(rest.len().max(1));
    let size = rest.len().div_ceil(waves);
    plan.extend(rest.chunks(size.max(1)).map(<[String]>::to_vec));
    Ok(plan)
}

/// What a balancer sees of its tier when it decides.
pub struct View<'v> {
    /// The rollout record and its modification revision.
    pub rollout: Option<(&'v Rollout, i64)>,
    /// The revision of the tier's desired state.
    pub desired: Option<i64>,
    /// Every balancer's progress, by name.
    pub progress: &'v BTreeMap<String, Progress>,
}

/// What the balancer itself knows: the desired (or rollout) revision it
/// runs, and since when it holds the candidate of rollout `.0` (seconds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Local {
    pub applied: Option<i64>,
    pub holding: Option<(i64, u64)>,
}

/// A balancer's next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do, with what it waits for (for `lbctl tier status`).
    Wait(String),
    /// Nothing: no rollout in progress.
    Idle,
    /// Apply the candidate of rollout `.0`.
    Apply(i64),
    /// Start holding the candidate now (after a restart, the hold starts
    /// again).
    StartHold(i64),
    /// Write "passed".
    Pass(i64),
    /// Write "failed" (why), mark the record failed, and revert.
    Fail(i64, String),
    /// Mark the record failed for another balancer's failure (it failed,
    /// and could not mark the record itself).
    MarkFailed(i64, String, String),
    /// Go back to the tier's desired state, and write "reverted".
    Revert(i64),
    /// Every wave passed: write the candidate as the desired state and
    /// mark the record done, if the record is still at `.1`.
    Promote(i64, i64),
}

/// The next step of balancer `me` at `now` (seconds). `gates` says
/// whether its gates hold (asked only while it holds the candidate; with
/// `true` when the hold is over).
pub fn decide(
    view: &View<'_>,
    me: &str,
    local: &Local,
    now: u64,
    gates: impl FnOnce(bool) -> Result<(), String>,
) -> Action {
    let Some((rollout, mod_revision)) = view.rollout else {
        return Action::Idle;
    };
    let id = rollout.id(mod_revision);
    if view.desired.is_some_and(|d| d > id) {
        // Promoted, or superseded by a direct write: the desired state
        // decides.
        return Action::Idle;
    }
    let runs = local.applied == Some(id);
    let progress = |name: &str| view.progress.get(name).filter(|p| p.rollout == id);
    match &rollout.outcome {
        Some(Outcome::Failed { .. } | Outcome::Aborted { .. }) => {
            return match (runs, progress(me).map(|p| &p.phase)) {
                (true, _) => Action::Revert(id),
                _ => Action::Idle,
            };
        }
        Some(Outcome::Done) => return Action::Idle,
        None => {}
    }
    let failed = view.progress.iter().find_map(|(name, p)| match &p.phase {
        Phase::Failed { why } if p.rollout == id => Some((name.clone(), why.clone())),
        _ => None,
    });
    if let Some((by, why)) = failed {
        return Action::MarkFailed(id, by, why);
    }
    let passed = |name: &String| progress(name).is_some_and(|p| p.phase == Phase::Passed);
    let Some(wave) = rollout.wave_of(me) else {
        return Action::Wait(
            "not in the rollout's plan: takes the state when it is promoted".into(),
        );
    };
    if let Some(waiting) = rollout.waves[..wave].iter().flatten().find(|n| !passed(n)) {
        return Action::Wait(format!("wave {} waits for {waiting} to pass", wave + 1));
    }
    match progress(me).map(|p| &p.phase) {
        Some(Phase::Passed) => {
            return match rollout.waves.iter().flatten().find(|n| !passed(n)) {
                Some(n) => Action::Wait(format!("passed; the rollout waits for {n}")),
                None => Action::Promote(id, mod_revision),
            };
        }
        Some(_) => return Action::Wait("failed here; the record is being marked".into()),
        None => {}
    }
    if !runs {
        return Action::Apply(id);
    }
    let since = match local.holding {
        Some((rollout, since)) if rollout == id => since,
        _ => return Action::StartHold(id),
    };
    let held = now.saturating_sub(since);
    if let Err(why) = gates(held >= rollout.hold_secs) {
        return Action::Fail(id, why);
    }
    if held >= rollout.hold_secs {
        Action::Pass(id)
    } else {
        Action::Wait(format!(
            "wave {}: holding, {} s of {} s",
            wave + 1,
            held,
            rollout.hold_secs
        ))
    }
}

/// What the gates compare: a balancer's state before it took the
/// candidate, and now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Backends down or ejected, as `VIP backend`.
    pub down: BTreeSet<String>,
    /// Backends serving (in the table, and up if they are checked).
    pub serving: BTreeSet<String>,
    /// VIPs whose every backend serves at its configured weight, with no
    /// runtime change here (their table is the nominal one).
    pub nominal: BTreeSet<String>,
    /// Each VIP's table: its size and digest.
    pub tables: BTreeMap<String, (u32, String)>,
    /// Routes each peer has from this balancer.
    pub announced: BTreeMap<String, usize>,
    /// Packets forwarded so far, and whether any were in the seconds
    /// before the snapshot.
    pub forwarded: u64,
    pub forwarding: bool,
}

/// The gates of a balancer holding a candidate: every one named when it
/// fails.
///
/// - the tables of VIPs that serve nominally are the ones the plan
///   computed (`expected`);
/// - no backend is down or ejected that was serving before, unless the
///   change removed it (`added` backends must come up by the hold's end:
///   `ending`);
/// - every peer still has as many routes as before, less the VIPs the
///   change removed (`removed_routes`);
/// - a balancer that forwarded before forwarded during the hold.
pub fn gates(
    before: &Snapshot,
    now: &Snapshot,
    expected: &BTreeMap<String, Expected>,
    change: &Change,
    ending: bool,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for vip in &now.nominal {
        match (now.tables.get(vip), expected.get(vip)) {
            (Some((size, have)), Some(want))
                if *size == want.table_size && *have != want.digest =>
            {
                problems.push(format!(
                    "VIP {vip}: table {} here, the plan computed {}",
                    super::short_digest(have),
                    super::short_digest(&want.digest)
                ))
            }
            _ => {}
        }
    }
    for down in now.down.difference(&before.down) {
        let added = change.added.contains(down);
        if !added {
            problems.push(format!("{down}: stopped serving after the change"));
        }
    }
    if ending {
        for added in change.added.difference(&now.serving) {
            problems.push(format!("{added}: added by the change, not serving"));
        }
    }
    problems.extend(routes_missing(&before.announced, &now.announced, change));
    if ending && before.forwarding && now.forwarded == before.forwarded {
        problems.push("no packet forwarded during the hold".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The peers with fewer routes from this balancer than `before` (routes
/// per peer), less the VIPs the change removed: each in words.
pub fn routes_missing(
    before: &BTreeMap<String, usize>,
    now: &BTreeMap<String, usize>,
    change: &Change,
) -> Vec<String> {
    before
        .iter()
        .filter_map(|(peer, had)| {
            let has = now.get(peer).copied().unwrap_or(0);
            (has + change.removed_routes < *had)
                .then(|| format!("peer {peer}: {has} routes, {had} before the change"))
        })
        .collect()
}

/// What a change explains: the backends it adds (as `VIP backend`), and
/// the routes of the VIPs it removes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Change {
    pub added: BTreeSet<String>,
    pub removed_routes: usize,
}

#[cfg(test)]
mod tests;

//! What the daemon tells the reconciler second-chance alternates come
//! from: each second-chance VIP's configured backends and weights, and its
//! previous ones, read from the revisions on disk ([`History`]). Revisions
//! survive a restart of `lbd`, so a balancer that restarts with empty maps
//! computes the alternates it computed before; a balancer whose revisions
//! do not reach back to the change (a new one, or `history` revisions
//! later) has no previous table and relies on the other two.
//!
//! The effective configuration of a revision (its file with the API's
//! changes on top) is parsed once and kept per revision number; the
//! previous members are looked for again only when a VIP's configured
//! members change, never on a health change.

use std::collections::BTreeMap;

use tracing::debug;

use super::Daemon;
use crate::{
    config::{Config, VipConfig, VipId},
    dataplane::Dataplane,
    lifecycle::WEIGHT_SCALE,
    revisions::RevisionStore,
    second_chance::{self, Members, Sources},
};

/// Members of the second-chance VIPs per revision, and the last answer.
#[derive(Debug, Default)]
pub struct History {
    /// Revision number → each VIP's configured members in it (scaled as
    /// the tables are built).
    parsed: BTreeMap<u64, BTreeMap<VipId, Members>>,
    /// The current members the last answer was for, and the answer.
    last: Option<(BTreeMap<VipId, Members>, BTreeMap<VipId, Members>)>,
}

impl History {
    /// The previous members of each VIP of `current` in `store` (see
    /// [`second_chance::previous_members`]).
    pub fn previous(
        &mut self,
        current: &BTreeMap<VipId, Members>,
        store: &RevisionStore,
    ) -> BTreeMap<VipId, Members> {
        if let Some((c, answer)) = &self.last
            && c == current
        {
            return answer.clone();
        }
        let numbers = store.numbers().unwrap_or_default();
        self.parsed.retain(|n, _| numbers.contains(n));
        for &n in &numbers {
            self.parsed
                .entry(n)
                .or_insert_with(|| members_of_revision(store, n));
        }
        let answer = second_chance::previous_members(current, self.parsed.values().rev());
        self.last = Some((current.clone(), answer.clone()));
        answer
    }
}

/// Each VIP's configured members in revision `n` (none if it was refused
/// or no longer parses).
fn members_of_revision(store: &RevisionStore, n: u64) -> BTreeMap<VipId, Members> {
    let Ok(revision) = store.get(n) else {
        return BTreeMap::new();
    };
    let (Some(text), Some(overlay)) = (revision.config, revision.overlay) else {
        return BTreeMap::new();
    };
    match Config::parse(&text) {
        Ok(config) => members(&overlay.apply(&config.vips), false),
        Err(e) => {
            debug!(revision = n, "not a source of previous backends: {e}");
            BTreeMap::new()
        }
    }
}

/// The configured members of `vips` (only the second-chance ones if
/// `second_chance_only`), weights scaled as the tables are built.
fn members(vips: &[VipConfig], second_chance_only: bool) -> BTreeMap<VipId, Members> {
    vips.iter()
        .filter(|v| v.second_chance || !second_chance_only)
        .map(|v| (v.id, second_chance::configured_members(v, WEIGHT_SCALE)))
        .collect()
}

impl<D: Dataplane> Daemon<D> {
    /// The sources of every second-chance VIP of `effective`.
    pub(super) fn alternate_sources(
        &mut self,
        effective: &[VipConfig],
    ) -> BTreeMap<VipId, Sources> {
        let current = members(effective, true);
        if current.is_empty() {
            return BTreeMap::new();
        }
        let mut previous = self.alt_history.previous(&current, &self.revisions);
        current
            .into_iter()
            .map(|(id, configured)| {
                let previous = previous.remove(&id);
                (
                    id,
                    Sources {
                        configured,
                        previous,
                    },
                )
            })
            .collect()
    }
}

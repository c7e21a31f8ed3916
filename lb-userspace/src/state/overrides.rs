//! Which change wins: the provenance of every runtime change (the
//! revision, time and source that made it, and what the file said of its
//! object then), the rule that settles a file edit against it, and the
//! list `lbctl overrides` shows.
//!
//! The rule (README, "Which change wins"): **the newest intent for an
//! object wins**. A runtime change holds until the file changes the same
//! object; a reload of a file that changed it drops the runtime change
//! (the file is now the newer intent), says so in the reload's answer and
//! the log, and `lbctl diff` shows it beforehand. A file that left the
//! object as it was keeps the runtime change, and `lbctl diff` shows each
//! field it shadows. Objects are a VIP (added, deleted or redefined through
//! the API) and a backend of a file VIP (added, removed, or its weight).
//! Drains are operational state, not configuration: they stay until
//! undrained or cleared.
//!
//! Not here: applying the overlay to the file ([`super::Overlay::apply`])
//! and the commit path that records a change ([`crate::daemon`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

use super::Overlay;
use crate::config::{BackendConfig, VipConfig, VipId};

/// Where a runtime change came from, and the file's version of its object
/// when it was made (`None`: the file did not have it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Origin<T> {
    pub revision: u64,
    /// Seconds since the Unix epoch.
    pub time: u64,
    /// `api: backend weight ...`, `api: vip add ...`.
    pub source: String,
    pub file: Option<T>,
}

/// The origin of every runtime change in an [`Overlay`], by object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Origins {
    /// VIPs added, deleted or redefined.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vips: BTreeMap<VipId, Origin<VipConfig>>,
    /// Backends of file VIPs added, removed or re-weighted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<VipId, BTreeMap<IpAddr, Origin<BackendConfig>>>,
    /// Drains (the file has no such setting: `file` is always `None`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drained: BTreeMap<VipId, BTreeMap<IpAddr, Origin<()>>>,
}

impl Origins {
    pub fn is_empty(&self) -> bool {
        self.vips.is_empty() && self.backends.is_empty() && self.drained.is_empty()
    }
}

/// Who made a change: what [`Overlay::stamp`] writes into the origins.
#[derive(Clone, Debug)]
pub struct Stamp {
    pub revision: u64,
    pub time: u64,
    pub source: String,
}

impl Stamp {
    fn origin<T>(&self, file: Option<T>) -> Origin<T> {
        Origin {
            revision: self.revision,
            time: self.time,
            source: self.source.clone(),
            file,
        }
    }
}

/// The file's VIP `id`.
fn file_vip(base: &[VipConfig], id: &VipId) -> Option<VipConfig> {
    base.iter().find(|v| v.id == *id).cloned()
}

/// The file's backend `addr` of VIP `id`.
fn file_backend(base: &[VipConfig], id: &VipId, addr: &IpAddr) -> Option<BackendConfig> {
    base.iter()
        .find(|v| v.id == *id)?
        .backends
        .iter()
        .find(|b| b.address == *addr)
        .cloned()
}

/// One runtime change in force, or one a reload takes back: the row of
/// `lbctl overrides` and of `lbctl diff`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub vip: VipId,
    /// `None`: the VIP itself.
    pub backend: Option<IpAddr>,
    /// `vip`, `backend`, `weight`, `state`.
    pub field: &'static str,
    /// What the file says (`absent` where it has no such object).
    pub file: String,
    /// What runs.
    pub running: String,
    pub revision: u64,
    pub time: u64,
    pub source: String,
}

impl Override {
    /// What the file `base` says now of this row's object, in the row's
    /// words. A row a reload takes back keeps, in `file`, what the file
    /// said when the change was made; this is what runs after it.
    pub fn file_now(&self, base: &[VipConfig]) -> String {
        let Some(addr) = self.backend else {
            let defined = file_vip(base, &self.vip).is_some();
            return if defined { "defined" } else { "absent" }.into();
        };
        match (file_backend(base, &self.vip, &addr), self.field) {
            (None, _) => "absent".into(),
            (Some(b), "weight") => b.weight.to_string(),
            (Some(b), "backend") => format!("weight {}", b.weight),
            (Some(_), _) => "-".into(),
        }
    }
}

impl Overlay {
    /// Records `stamp` as the origin of every entry that differs from
    /// `before` (new or changed), with the file's version of its object
    /// from `base`; drops the origins of entries that are gone.
    pub fn stamp(&mut self, before: &Overlay, base: &[VipConfig], stamp: &Stamp) {
        let vip_ids: BTreeSet<VipId> = self
            .vips_added
            .keys()
            .chain(self.vips_deleted.iter())
            .copied()
            .collect();
        for id in &vip_ids {
            let same = self.vips_added.get(id) == before.vips_added.get(id)
                && self.vips_deleted.contains(id) == before.vips_deleted.contains(id);
            if !same || !self.origins.vips.contains_key(id) {
                let origin = stamp.origin(file_vip(base, id));
                self.origins.vips.insert(*id, origin);
            }
        }
        self.origins.vips.retain(|id, _| vip_ids.contains(id));
        let mut backends = BTreeMap::new();
        for (id, changes) in &self.backends {
            for (addr, change) in changes {
                let was = before.backends.get(id).and_then(|c| c.get(addr));
                let kept = self.origins.backends.get(id).and_then(|o| o.get(addr));
                let origin = match kept {
                    Some(o) if was == Some(change) => o.clone(),
                    _ => stamp.origin(file_backend(base, id, addr)),
                };
                backends
                    .entry(*id)
                    .or_insert_with(BTreeMap::new)
                    .insert(*addr, origin);
            }
        }
        self.origins.backends = backends;
        let mut drained = BTreeMap::new();
        for (id, addrs) in &self.drained {
            for addr in addrs {
                let kept = self.origins.drained.get(id).and_then(|o| o.get(addr));
                let origin = kept.cloned().unwrap_or_else(|| stamp.origin(None));
                drained
                    .entry(*id)
                    .or_insert_with(BTreeMap::new)
                    .insert(*addr, origin);
            }
        }
        self.origins.drained = drained;
    }

    /// Gives every entry without an origin (a state file written before
    /// origins were kept) one from `base`, as if made now by `stamp`.
    pub fn adopt(&mut self, base: &[VipConfig], stamp: &Stamp) {
        let before = self.clone();
        self.stamp(&before, base, stamp);
    }

    /// The rule: the runtime changes whose object the file `base` changed
    /// since they were made are dropped (the file is the newer intent);
    /// returns them as they were, for the reload's answer and the log.
    pub fn rebase(&mut self, base: &[VipConfig]) -> Vec<Override> {
        let before = self.clone();
        let mut dropped = Vec::new();
        let vips: Vec<VipId> = self
            .origins
            .vips
            .iter()
            .filter(|(id, o)| o.file != file_vip(base, id))
            .map(|(id, _)| *id)
            .collect();
        for id in vips {
            dropped.extend(before.vip_rows(&id));
            self.vips_added.remove(&id);
            self.vips_deleted.remove(&id);
            self.origins.vips.remove(&id);
        }
        let backends: Vec<(VipId, IpAddr)> = self
            .origins
            .backends
            .iter()
            .flat_map(|(id, m)| m.iter().map(move |(addr, o)| (id, addr, o)))
            .filter(|(id, addr, o)| o.file != file_backend(base, id, addr))
            .map(|(id, addr, _)| (*id, *addr))
            .collect();
        for (id, addr) in backends {
            dropped.extend(before.backend_row(base, &id, &addr));
            if let Some(m) = self.backends.get_mut(&id) {
                m.remove(&addr);
                if m.is_empty() {
                    self.backends.remove(&id);
                }
            }
            if let Some(m) = self.origins.backends.get_mut(&id) {
                m.remove(&addr);
                if m.is_empty() {
                    self.origins.backends.remove(&id);
                }
            }
        }
        dropped.extend(self.drop_drains_of_absent_backends(base));
        dropped
    }

    /// Drains of backends that no longer run (the file removed them): they
    /// go, so a backend the file adds back later is not drained in
    /// silence by a drain made for the one before.
    fn drop_drains_of_absent_backends(&mut self, base: &[VipConfig]) -> Vec<Override> {
        let effective = self.apply(base);
        let runs = |id: &VipId, addr: &IpAddr| {
            effective
                .iter()
                .any(|v| v.id == *id && v.backends.iter().any(|b| b.address == *addr))
        };
        let gone: Vec<(VipId, IpAddr)> = self
            .drained
            .iter()
            .flat_map(|(id, addrs)| addrs.iter().map(move |addr| (*id, *addr)))
            .filter(|(id, addr)| !runs(id, addr))
            .collect();
        let mut dropped = Vec::new();
        for (id, addr) in gone {
            let origin = self
                .origins
                .drained
                .get_mut(&id)
                .and_then(|m| m.remove(&addr));
            dropped.push(row(
                id,
                Some(addr),
                "state",
                "-".into(),
                "drained".into(),
                origin.as_ref(),
            ));
            if let Some(set) = self.drained.get_mut(&id) {
                set.remove(&addr);
                if set.is_empty() {
                    self.drained.remove(&id);
                }
            }
            if self
                .origins
                .drained
                .get(&id)
                .is_some_and(BTreeMap::is_empty)
            {
                self.origins.drained.remove(&id);
            }
        }
        dropped
    }

    /// Every runtime change in force over `base`, VIP by VIP.
    pub fn overrides(&self, base: &[VipConfig]) -> Vec<Override> {
        let mut ids: BTreeSet<VipId> = self.origins.vips.keys().copied().collect();
        ids.extend(self.backends.keys());
        ids.extend(self.drained.keys());
        let mut rows = Vec::new();
        for id in ids {
            rows.extend(self.vip_rows(&id));
            for addr in self.backends.get(&id).into_iter().flat_map(|m| m.keys()) {
                rows.extend(self.backend_row(base, &id, addr));
            }
            for addr in self.drained.get(&id).into_iter().flatten() {
                let origin = self.origins.drained.get(&id).and_then(|m| m.get(addr));
                rows.push(row(
                    id,
                    Some(*addr),
                    "state",
                    "-".into(),
                    "drained".into(),
                    origin,
                ));
            }
        }
        rows
    }

    fn vip_rows(&self, id: &VipId) -> Option<Override> {
        let origin = self.origins.vips.get(id);
        let in_file = origin.is_some_and(|o| o.file.is_some());
        let file = if in_file { "defined" } else { "absent" };
        let running = match (self.vips_added.get(id), self.vips_deleted.contains(id)) {
            (Some(v), _) => format!("added by the API ({} backend(s))", v.backends.len()),
            (None, true) => "deleted".to_string(),
            (None, false) => return None,
        };
        Some(row(*id, None, "vip", file.into(), running, origin))
    }

    fn backend_row(&self, base: &[VipConfig], id: &VipId, addr: &IpAddr) -> Option<Override> {
        let change = self.backends.get(id)?.get(addr)?;
        let origin = self.origins.backends.get(id).and_then(|m| m.get(addr));
        let file = origin
            .map(|o| o.file.clone())
            .unwrap_or_else(|| file_backend(base, id, addr));
        let (field, file, running) = match (file, change) {
            (None, Some(w)) => ("backend", "absent".into(), format!("added, weight {w}")),
            (Some(b), Some(w)) => ("weight", b.weight.to_string(), w.to_string()),
            (Some(b), None) => ("backend", format!("weight {}", b.weight), "removed".into()),
            (None, None) => return None,
        };
        Some(row(*id, Some(*addr), field, file, running, origin))
    }

    /// Drops the runtime changes of VIP `vip` (all of them: `None`), or of
    /// one backend of it. Returns how many rows of
    /// [`Overlay::overrides`] that clears.
    pub fn clear(
        &mut self,
        base: &[VipConfig],
        vip: Option<&VipId>,
        backend: Option<IpAddr>,
    ) -> usize {
        let before = self.overrides(base).len();
        match (vip, backend) {
            (None, _) => *self = Overlay::default(),
            (Some(id), None) => {
                self.vips_added.remove(id);
                self.vips_deleted.remove(id);
                self.backends.remove(id);
                self.drained.remove(id);
                self.origins.vips.remove(id);
                self.origins.backends.remove(id);
                self.origins.drained.remove(id);
            }
            (Some(id), Some(addr)) => {
                if let Some(m) = self.backends.get_mut(id) {
                    m.remove(&addr);
                }
                if let Some(s) = self.drained.get_mut(id) {
                    s.remove(&addr);
                }
                if let Some(m) = self.origins.backends.get_mut(id) {
                    m.remove(&addr);
                }
                if let Some(m) = self.origins.drained.get_mut(id) {
                    m.remove(&addr);
                }
                self.backends.retain(|_, m| !m.is_empty());
                self.drained.retain(|_, s| !s.is_empty());
                self.origins.backends.retain(|_, m| !m.is_empty());
                self.origins.drained.retain(|_, m| !m.is_empty());
            }
        }
        before - self.overrides(base).len()
    }
}

fn row<T>(
    vip: VipId,
    backend: Option<IpAddr>,
    field: &'static str,
    file: String,
    running: String,
    origin: Option<&Origin<T>>,
) -> Override {
    Override {
        vip,
        backend,
        field,
        file,
        running,
        revision: origin.map_or(0, |o| o.revision),
        time: origin.map_or(0, |o| o.time),
        source: origin.map_or_else(String::new, |o| o.source.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> VipId {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vip(s: &str, backends: &[(&str, u32)]) -> VipConfig {
        let backends = backends
            .iter()
            .map(|(a, w)| BackendConfig::new(ip(a), *w))
            .collect();
        VipConfig::new(id(s), backends)
    }

    const WEB: &str = "10.0.0.1:80/tcp";

    fn file() -> Vec<VipConfig> {
        vec![vip(WEB, &[("10.1.0.1", 1), ("10.1.0.2", 1)])]
    }

    fn stamp(revision: u64) -> Stamp {
        Stamp {
            revision,
            time: 1_000 + revision,
            source: format!("api: change {revision}"),
        }
    }

    /// `edit` made through the API as revision `revision`.
    fn change(o: &mut Overlay, base: &[VipConfig], revision: u64, edit: impl FnOnce(&mut Overlay)) {
        let before = o.clone();
        edit(o);
        o.stamp(&before, base, &stamp(revision));
    }

    fn weight_of(vips: &[VipConfig], addr: &str) -> Option<u32> {
        vips[0]
            .backends
            .iter()
            .find(|b| b.address == ip(addr))
            .map(|b| b.weight)
    }

    /// A drain goes with its backend: the file that removes the backend
    /// drops the drain (said, as the rule's other drops are), so the file
    /// adding the backend back later does not bring it back drained.
    #[test]
    fn a_drain_goes_when_the_file_removes_its_backend() {
        let base = file();
        let mut o = Overlay::default();
        change(&mut o, &base, 3, |o| {
            o.set_drained(&base, &id(WEB), ip("10.1.0.2"), true)
                .unwrap()
        });
        assert!(o.clone().rebase(&base).is_empty(), "the backend runs: kept");
        let without = vec![vip(WEB, &[("10.1.0.1", 1)])];
        let dropped = o.rebase(&without);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(
            (dropped[0].backend, dropped[0].field, dropped[0].revision),
            (Some(ip("10.1.0.2")), "state", 3)
        );
        assert!(
            o.drained_in(&o.apply(&base)).is_empty(),
            "back in the file: not drained"
        );
        assert!(o.origins.drained.is_empty());
    }

    #[test]
    fn a_runtime_weight_holds_until_the_file_changes_that_weight() {
        let base = file();
        let mut o = Overlay::default();
        change(&mut o, &base, 3, |o| {
            o.set_weight(&base, &id(WEB), ip("10.1.0.1"), 5).unwrap()
        });
        // The file unchanged, or changed elsewhere: the runtime weight stays.
        let mut elsewhere = base.clone();
        elsewhere[0].backends[1].weight = 7;
        assert!(o.clone().rebase(&base).is_empty());
        let mut kept = o.clone();
        assert!(kept.rebase(&elsewhere).is_empty());
        assert_eq!(weight_of(&kept.apply(&elsewhere), "10.1.0.1"), Some(5));
        // The file changes that weight: it decides.
        let mut edited = base.clone();
        edited[0].backends[0].weight = 3;
        let dropped = o.rebase(&edited);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        let d = &dropped[0];
        assert_eq!(
            (
                d.backend,
                d.field,
                d.file.as_str(),
                d.running.as_str(),
                d.revision
            ),
            (Some(ip("10.1.0.1")), "weight", "1", "5", 3)
        );
        assert_eq!(d.file_now(&edited), "3", "what runs after it");
        assert_eq!(weight_of(&o.apply(&edited), "10.1.0.1"), Some(3));
        assert!(o.is_empty() && o.origins.is_empty(), "{o:?}");
    }

    #[test]
    fn a_vip_added_at_runtime_gives_way_when_the_file_defines_it() {
        let base = file();
        let mut o = Overlay::default();
        let api = "10.0.0.2:443/tcp";
        change(&mut o, &base, 2, |o| {
            o.add_vip(&base, vip(api, &[("10.1.0.9", 1)])).unwrap()
        });
        assert!(o.clone().rebase(&base).is_empty(), "not in the file: kept");
        let mut edited = base.clone();
        let mut theirs = vip(api, &[("10.1.0.7", 1), ("10.1.0.8", 1)]);
        theirs.min_healthy = 2;
        edited.push(theirs.clone());
        let dropped = o.rebase(&edited);
        assert_eq!(
            dropped
                .iter()
                .map(|d| (d.vip, d.field, d.file.as_str()))
                .collect::<Vec<_>>(),
            [(id(api), "vip", "absent")]
        );
        assert_eq!(o.apply(&edited)[1], theirs, "the file's VIP runs");
    }

    #[test]
    fn a_deleted_vip_stays_deleted_until_the_file_changes_it() {
        let base = file();
        let mut o = Overlay::default();
        change(&mut o, &base, 4, |o| o.delete_vip(&base, &id(WEB)).unwrap());
        assert!(o.clone().rebase(&base).is_empty());
        assert!(o.apply(&base).is_empty());
        let mut edited = base.clone();
        edited[0]
            .backends
            .push(BackendConfig::new(ip("10.1.0.3"), 1));
        let dropped = o.rebase(&edited);
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            (dropped[0].field, dropped[0].running.as_str()),
            ("vip", "deleted")
        );
        assert_eq!(o.apply(&edited), edited, "it comes back as the file has it");
    }

    #[test]
    fn a_removed_or_added_backend_gives_way_to_a_file_that_changes_it() {
        let base = file();
        let mut o = Overlay::default();
        change(&mut o, &base, 5, |o| {
            o.delete_backend(&base, &id(WEB), ip("10.1.0.2")).unwrap();
            o.add_backend(&base, &id(WEB), ip("10.1.0.3"), 2).unwrap();
        });
        let rows = o.overrides(&base);
        assert_eq!(
            rows.iter()
                .map(|r| (
                    r.backend.unwrap(),
                    r.field,
                    r.file.as_str(),
                    r.running.as_str()
                ))
                .collect::<Vec<_>>(),
            [
                (ip("10.1.0.2"), "backend", "weight 1", "removed"),
                (ip("10.1.0.3"), "backend", "absent", "added, weight 2"),
            ]
        );
        let mut edited = base.clone();
        edited[0].backends[1].weight = 4;
        edited[0]
            .backends
            .push(BackendConfig::new(ip("10.1.0.3"), 9));
        assert_eq!(o.rebase(&edited).len(), 2);
        assert_eq!(o.apply(&edited), edited);
    }

    #[test]
    fn an_untouched_change_keeps_its_origin_and_drains_are_listed() {
        let base = file();
        let mut o = Overlay::default();
        change(&mut o, &base, 6, |o| {
            o.set_weight(&base, &id(WEB), ip("10.1.0.1"), 5).unwrap()
        });
        change(&mut o, &base, 7, |o| {
            o.set_drained(&base, &id(WEB), ip("10.1.0.2"), true)
                .unwrap()
        });
        let rows = o.overrides(&base);
        assert_eq!(
            rows.iter()
                .map(|r| (r.field, r.revision, r.source.as_str()))
                .collect::<Vec<_>>(),
            [
                ("weight", 6, "api: change 6"),
                ("state", 7, "api: change 7")
            ]
        );
        // A later weight change of the same backend is a newer origin.
        change(&mut o, &base, 8, |o| {
            o.set_weight(&base, &id(WEB), ip("10.1.0.1"), 6).unwrap()
        });
        assert_eq!(o.overrides(&base)[0].revision, 8);
    }

    #[test]
    fn clearing_drops_what_is_asked_and_nothing_else() {
        let base = file();
        let other = "10.0.0.2:443/tcp";
        let mut o = Overlay::default();
        change(&mut o, &base, 2, |o| {
            o.set_weight(&base, &id(WEB), ip("10.1.0.1"), 5).unwrap();
            o.set_drained(&base, &id(WEB), ip("10.1.0.2"), true)
                .unwrap();
            o.add_vip(&base, vip(other, &[("10.1.0.9", 1)])).unwrap();
        });
        assert_eq!(o.overrides(&base).len(), 3);
        let mut one = o.clone();
        assert_eq!(one.clear(&base, Some(&id(WEB)), Some(ip("10.1.0.2"))), 1);
        assert_eq!(one.overrides(&base).len(), 2);
        assert_eq!(
            one.clear(&base, Some(&id(other)), Some(ip("10.1.0.9"))),
            0,
            "an API VIP's backends are the VIP's"
        );
        let mut vip_only = o.clone();
        assert_eq!(vip_only.clear(&base, Some(&id(WEB)), None), 2);
        assert_eq!(vip_only.apply(&base).len(), 2);
        assert_eq!(o.clear(&base, None, None), 3);
        assert_eq!(o.apply(&base), base);
    }

    #[test]
    fn changes_from_before_origins_are_adopted_against_the_file_they_run_on() {
        let base = file();
        let mut o = Overlay::default();
        o.set_weight(&base, &id(WEB), ip("10.1.0.1"), 5).unwrap();
        assert!(o.origins.is_empty());
        o.adopt(&base, &stamp(0));
        assert_eq!(o.overrides(&base)[0].source, "api: change 0");
        assert!(o.clone().rebase(&base).is_empty());
        let text = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Overlay>(&text).unwrap(), o);
    }
}

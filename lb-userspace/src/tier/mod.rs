//! A tier of balancers as one system: the VIPs in etcd, each balancer's
//! report beside them. With `source.etcd` (see
//! [`crate::config::source`]), `lbd` takes its VIPs from the desired
//! state at `<prefix>/desired` and keeps everything else from its file;
//! a change in etcd goes through [`crate::daemon::Daemon::commit`] like a
//! reload of the file, and is recorded as a revision that names the etcd
//! revision. Each `lbd` publishes a [`Report`] at
//! `<prefix>/balancers/<name>` under a lease, and records itself once at
//! `<prefix>/members/<name>` (no lease): a member without a report is a
//! balancer whose lease expired.
//!
//! Fail static: when etcd is unreachable, slow or answers nonsense, `lbd`
//! keeps what it applied last (forwarding, announcing), says so, and
//! retries. An absent or deleted desired state changes nothing: an empty
//! tier is written as `vips: []`, never as a missing key.
//!
//! [`compose`] builds the configuration a balancer runs (its file, with
//! the desired VIPs); [`compare`] finds where the balancers disagree;
//! [`client`] is the task that talks to etcd.

pub(crate) mod client;
pub(crate) mod rollout;

pub use self::{
    client::{Command, Event, Write, spawn as spawn_client},
    rollout::{Change, Outcome},
};

use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::config::{
    Config, ConfigError, ConfigErrors,
    source::{EtcdSource, MAX_DESIRED_BYTES},
};

/// The keys of a tier under its prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(source: &EtcdSource) -> Keys {
        Keys {
            prefix: source.prefix.clone(),
        }
    }

    /// Every key of the tier (a watch's range).
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// The tier's desired state: a YAML document with `vips:`.
    pub fn desired(&self) -> String {
        format!("{}/desired", self.prefix)
    }

    /// Where balancer `name` reports (under its lease).
    pub fn balancer(&self, name: &str) -> String {
        format!("{}/balancers/{name}", self.prefix)
    }

    /// Where balancer `name` recorded that it is part of the tier.
    pub fn member(&self, name: &str) -> String {
        format!("{}/members/{name}", self.prefix)
    }

    /// The staged rollout in progress or last ([`rollout::Rollout`]).
    pub fn rollout(&self) -> String {
        format!("{}/rollout", self.prefix)
    }

    /// Balancer `name`'s progress in a rollout ([`rollout::Progress`]).
    pub fn progress(&self, name: &str) -> String {
        format!("{}/progress/{name}", self.prefix)
    }

    /// Sorts `items` (keys as `key` reads them) so that the members come
    /// first, in their order, and the rest after them, in theirs. A first
    /// read must see a member before its report (a report counts only for
    /// a known member), and etcd returns `balancers/` before `members/`.
    ///
    /// Members with a report come before those without: with more than
    /// [`MAX_BALANCERS`] names (names that left and were never removed),
    /// the cap keeps the balancers that report.
    pub fn members_first<T>(&self, items: &mut [T], key: impl Fn(&T) -> Option<&str>) {
        let reporting: std::collections::BTreeSet<String> = items
            .iter()
            .filter_map(|t| match self.classify(key(t)?)? {
                TierKey::Balancer(name) => Some(name.to_string()),
                _ => None,
            })
            .collect();
        items.sort_by_key(|t| match key(t).and_then(|k| self.classify(k)) {
            Some(TierKey::Member(name)) if reporting.contains(name) => 0,
            Some(TierKey::Member(_)) => 1,
            _ => 2,
        });
    }

    /// What a key of the tier is.
    pub fn classify<'k>(&self, key: &'k str) -> Option<TierKey<'k>> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        if rest == "desired" {
            return Some(TierKey::Desired);
        }
        if rest == "rollout" {
            return Some(TierKey::Rollout);
        }
        if let Some(name) = rest.strip_prefix("balancers/") {
            return Some(TierKey::Balancer(name));
        }
        if let Some(name) = rest.strip_prefix("progress/") {
            return Some(TierKey::Progress(name));
        }
        rest.strip_prefix("members/").map(TierKey::Member)
    }
}

/// A key of the tier, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierKey<'k> {
    Desired,
    Rollout,
    Balancer(&'k str),
    Member(&'k str),
    Progress(&'k str),
}

/// A desired state as read from etcd: the key's modification revision
/// and its text (at most [`MAX_DESIRED_BYTES`]); or a rollout's candidate
/// (`rollout`, with the rollout's revision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub revision: i64,
    pub text: Arc<str>,
    pub rollout: bool,
}

/// The document at `<prefix>/desired`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DesiredDoc {
    vips: serde_yaml::Value,
}

impl Desired {
    /// The desired state a revision ran: its `vips:` (a balancer that
    /// restarts while etcd is away keeps serving them).
    pub fn from_config_text((revision, rollout): (i64, bool), text: &str) -> Option<Desired> {
        let value: serde_yaml::Value = serde_yaml::from_str(text).ok()?;
        let vips = value.get("vips")?.clone();
        let mut doc = serde_yaml::Mapping::new();
        doc.insert("vips".into(), vips);
        let text = serde_yaml::to_string(&doc).ok()?;
        Some(Desired {
            revision,
            text: text.into(),
            rollout,
        })
    }

    /// Its `vips:` value, or why it is not a desired state.
    fn vips(&self) -> Result<serde_yaml::Value, String> {
        check_size(self.text.len())?;
        crate::config::parse::precheck(&self.text)?;
        let doc: DesiredDoc = serde_yaml::from_str(&self.text).map_err(|e| {
            format!("not a desired state (a YAML document with `vips:` and nothing else): {e}")
        })?;
        Ok(doc.vips)
    }
}

/// A desired state of `bytes` is taken, or why not (more than
/// [`MAX_DESIRED_BYTES`]).
pub fn check_size(bytes: usize) -> Result<(), String> {
    if bytes > MAX_DESIRED_BYTES {
        return Err(format!(
            "the desired state is {bytes} bytes, more than the {MAX_DESIRED_BYTES} a balancer takes"
        ));
    }
    Ok(())
}

/// A digest as shown beside others: its first 12 hex digits, enough to
/// tell two apart. Digests come from peers and records in etcd, so any
/// text: cut at a character's boundary.
pub fn short_digest(digest: &str) -> &str {
    let end = digest
        .char_indices()
        .nth(12)
        .map_or(digest.len(), |(at, _)| at);
    &digest[..end]
}

/// The name a revision made from `desired` carries:
/// `etcd <prefix>/desired@N`, or `etcd <prefix>/rollout@N` for a
/// rollout's candidate.
pub fn origin(source: &EtcdSource, desired: &Desired) -> String {
    let key = if desired.rollout {
        "rollout"
    } else {
        "desired"
    };
    format!("etcd {}/{key}@{}", source.prefix, desired.revision)
}

/// The etcd revision in a revision's origin (see [`origin`]), and
/// whether it was a rollout's candidate; `None` for another origin, also
/// for a tier under another prefix than `prefix` (its revisions count in
/// another history).
pub fn revision_of_origin(origin: &str, prefix: &str) -> Option<(i64, bool)> {
    let rest = origin.strip_prefix("etcd ")?.strip_prefix(prefix)?;
    if let Some(n) = rest.strip_prefix("/desired@") {
        return Some((n.parse().ok()?, false));
    }
    Some((rest.strip_prefix("/rollout@")?.parse().ok()?, true))
}

/// The configuration a balancer of the tier runs: its file (`text`,
/// parsed as `file`, which must list no VIPs of its own) with the VIPs of
/// `desired`: the composed text and what it parses to. Every problem is
/// named, as the file's would be, and nothing runs of a refused one.
pub fn compose(
    text: &str,
    file: &Config,
    desired: &Desired,
) -> Result<(String, Config), ConfigErrors> {
    let Some(source) = &file.source else {
        return Ok((text.to_string(), file.clone()));
    };
    if !file.vips.is_empty() {
        return Err(ConfigErrors {
            source_name: None,
            errors: vec![ConfigError {
                field: "vips".into(),
                message: "the VIPs come from etcd (source.etcd): the file lists none".into(),
            }],
        });
    }
    let mut config = with_vips(text, desired, origin(source, desired))?;
    config.1.warnings.retain(|w| !file.warnings.contains(w));
    Ok(config)
}

/// `text` (a configuration) with the VIPs of `desired` in place of its
/// own, named `name` in every problem.
pub fn with_vips(
    text: &str,
    desired: &Desired,
    name: String,
) -> Result<(String, Config), ConfigErrors> {
    let one = |field: &str, message: String| ConfigErrors {
        source_name: Some(name.clone()),
        errors: vec![ConfigError {
            field: field.into(),
            message,
        }],
    };
    let vips = desired.vips().map_err(|e| one("", e))?;
    let mut whole: serde_yaml::Mapping = serde_yaml::from_str(text)
        .map_err(|e| one("", format!("the file is not a mapping: {e}")))?;
    whole.insert("vips".into(), vips);
    let text = serde_yaml::to_string(&whole).map_err(|e| one("", e.to_string()))?;
    let config = Config::parse(&text).map_err(|mut e| {
        e.source_name = Some(name.clone());
        e
    })?;
    Ok((text, config))
}

/// What one balancer publishes about itself (JSON, at
/// `<prefix>/balancers/<name>`). Only state, no counters: a report is
/// written when it changes, and every balancer reads every other's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Report {
    pub name: String,
    /// `lbd`'s version.
    pub version: String,
    /// The etcd revision of the desired state it runs (or ran before a
    /// rollout's candidate).
    pub applied: Option<i64>,
    /// The rollout whose candidate it runs, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<i64>,
    /// Its revision (`revision`), if that is not the desired state
    /// `applied` (or the candidate) names: a revert here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<u64>,
    /// The newest desired state it saw, and why it refused it if it did.
    pub seen: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Its revision (`lbctl history`) and the configuration's digest.
    pub revision: u64,
    pub config_digest: String,
    /// Each VIP's table digest (`lbctl table`), by VIP.
    pub tables: BTreeMap<String, String>,
    /// The VIPs each announcer's peer has from it, by peer.
    pub announced: BTreeMap<String, usize>,
    /// Backends that are not serving: `VIP backend state`.
    pub down: Vec<String>,
    /// Runtime changes (`lbctl vip`, `lbctl backend`) in force on top of
    /// the tier's desired state on this balancer.
    #[serde(default)]
    pub overrides: usize,
    /// The last change that failed here, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Which `lbd` installation wrote it ([`instance_id`]): two
    /// balancers configured with one name write different ones. The etcd
    /// task fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The fingerprint of its flow hash's key ([`crate::digest::hash_key`];
    /// absent from an `lbd` before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// Entries of `down` and of `tables` left out to keep the report
    /// within [`MAX_REPORT_BYTES`] ([`Report::bounded`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub down_omitted: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tables_omitted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// The report cut to fit [`MAX_REPORT_BYTES`], what every balancer
    /// reads of another's (and below etcd's default request limit, 1.5
    /// MiB): a tier of thousands of VIPs that loses a rack lists tens of
    /// thousands of backends down, and a report etcd refused, or peers
    /// could not read, left the balancer unreported. The tail of `down`
    /// goes first, then tables' digests (a VIP without one is not
    /// compared), each counted in `*_omitted`.
    pub fn bounded(mut self) -> Report {
        let size = |r: &Report| serde_json::to_vec(r).map_or(usize::MAX, |v| v.len());
        // Room for the counts themselves.
        let limit = MAX_REPORT_BYTES - 64;
        let mut over = size(&self).saturating_sub(limit);
        while over > 0 {
            // `"entry",` and `"vip":"digest",`: the bytes each one takes.
            if let Some(gone) = self.down.pop() {
                self.down_omitted += 1;
                over = over.saturating_sub(gone.len() + 3);
            } else if let Some((vip, digest)) = self.tables.pop_last() {
                self.tables_omitted += 1;
                over = over.saturating_sub(vip.len() + digest.len() + 6);
            } else {
                break;
            }
            if over == 0 {
                over = size(&self).saturating_sub(limit);
            }
        }
        self
    }
}

/// The file, beside the state file, that keeps this installation's
/// instance id across restarts.
pub const INSTANCE_FILE: &str = "tier-instance";

/// This installation's instance id: read from `dir`'s [`INSTANCE_FILE`],
/// or made (128 random bits, in hex) and written there. The same across
/// restarts of one box, so a restarted `lbd` whose old report still
/// lives is itself, not a duplicate; another box with the same name has
/// another.
pub fn instance_id(dir: &std::path::Path) -> std::io::Result<String> {
    let path = dir.join(INSTANCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if is_instance_id(text.trim()) => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut id = String::new();
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        id.push_str(&format!("{:016x}", h.finish()));
    }
    std::fs::create_dir_all(dir)?;
    crate::atomic_file::write_private(&path, format!("{id}\n").as_bytes())?;
    Ok(id)
}

fn is_instance_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `report`, found under this balancer's own name, was written by
/// another installation (`ours` is this one's id): two balancers share a
/// name. A report without an id (an older `lbd`) is not judged.
pub fn written_by_another(report: &Report, ours: &str) -> Option<String> {
    report
        .instance
        .as_deref()
        .filter(|theirs| *theirs != ours)
        .map(|theirs| {
            format!(
                "another balancer reports as {} (instance {theirs}; this one is {ours}): give each balancer its own source.etcd.name; this one stays off the tier meanwhile",
                report.name
            )
        })
}

/// The largest report taken from another balancer.
pub const MAX_REPORT_BYTES: usize = 1 << 20;
/// Balancers a tier may have (members beyond it are ignored, and said so).
pub const MAX_BALANCERS: usize = 256;

/// One balancer as `lbctl tier status` shows it: its report, or none
/// when it is a member whose lease expired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Member {
    pub name: String,
    pub report: Option<Report>,
    /// A report that could not be read, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Where the balancers of a tier disagree, each in words: a balancer that
/// stopped reporting, one on another desired revision than the newest
/// any of them saw, one that refused it, and a VIP whose table digest
/// differs between balancers that run the same revision.
pub fn compare(members: &[Member]) -> Vec<String> {
    let mut flags = Vec::new();
    let reports: Vec<&Report> = members.iter().filter_map(|m| m.report.as_ref()).collect();
    for m in members {
        match (&m.report, &m.unreadable) {
            (_, Some(why)) => flags.push(format!("{}: its report is unreadable: {why}", m.name)),
            (None, None) => flags.push(format!(
                "{}: not reporting (its lease expired: stopped, or cut off from etcd)",
                m.name
            )),
            _ => {}
        }
    }
    let newest = reports.iter().filter_map(|r| r.seen.max(r.applied)).max();
    for r in &reports {
        if let Some(why) = &r.refused {
            flags.push(format!(
                "{}: refused desired revision {}: {why}",
                r.name,
                r.seen.unwrap_or(0)
            ));
        }
        if r.overrides > 0 {
            flags.push(format!(
                "{}: {} runtime change(s) on top of the desired state (`lbctl overrides list` there)",
                r.name, r.overrides
            ));
        }
        if let Some(c) = r.candidate {
            flags.push(format!("{}: runs the candidate of rollout {c}", r.name));
        }
        if let Some(n) = r.reverted {
            let instead = match (r.candidate, r.applied) {
                (Some(c), _) => format!("rollout {c}'s candidate"),
                (None, a) => format!(
                    "desired revision {}",
                    a.map_or("none".into(), |a| a.to_string())
                ),
            };
            flags.push(format!(
                "{}: runs its revision {n}, from a revert there, instead of {instead} (until a desired state with other VIPs or a changed file applies)",
                r.name
            ));
        }
        if newest.is_some() && r.applied != newest {
            flags.push(format!(
                "{}: runs desired revision {}, the newest is {}",
                r.name,
                r.applied.map_or("none".into(), |a| a.to_string()),
                newest.unwrap_or(0)
            ));
        }
    }
    flags.extend(table_disagreements(&reports));
    flags.extend(hash_key_disagreement(&reports));
    flags
}

/// Balancers whose flow hash keys differ, by fingerprint: their tables
/// agree, yet a flow ECMP moves between them changes backend.
fn hash_key_disagreement(reports: &[&Report]) -> Option<String> {
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in reports {
        if let Some(key) = &r.hash_key {
            by_key.entry(key).or_default().push(&r.name);
        }
    }
    (by_key.len() > 1).then(|| {
        let groups: Vec<String> = by_key
            .iter()
            .map(|(key, names)| format!("{} ({key})", names.join(", ")))
            .collect();
        format!(
            "the balancers' flow hash keys (hash_key_file) differ: {}; a flow ECMP moves between them goes to another backend",
            groups.join(" against ")
        )
    })
}

/// VIPs whose table digest differs between balancers that run one
/// revision and see the same of its backends down (a backend one
/// balancer's probes find down is out of that balancer's table only:
/// that difference is the health checks', and `down` says so).
fn table_disagreements(reports: &[&Report]) -> Vec<String> {
    /// Reports are compared within a revision: the desired one, the
    /// candidate, and a balancer's own after a revert.
    type Side<'r> = (
        (Option<i64>, Option<i64>, Option<&'r str>),
        &'r str,
        Vec<&'r str>,
    );
    let mut by_vip: BTreeMap<Side<'_>, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    // A report whose down list was cut cannot say which of its tables
    // lack a backend: compared, they would differ for that (helper-35).
    for r in reports.iter().filter(|r| r.down_omitted == 0) {
        for (vip, digest) in &r.tables {
            let down: Vec<&str> = r
                .down
                .iter()
                .filter(|d| d.split(' ').next() == Some(vip.as_str()))
                .map(String::as_str)
                .collect();
            by_vip
                .entry((
                    (r.applied, r.candidate, r.reverted.map(|_| r.name.as_str())),
                    vip,
                    down,
                ))
                .or_default()
                .entry(digest)
                .or_default()
                .push(&r.name);
        }
    }
    by_vip
        .into_iter()
        .filter(|(_, digests)| digests.len() > 1)
        .map(|((_, vip, _), digests)| {
            let sides: Vec<String> = digests
                .iter()
                .map(|(d, names)| format!("{} on {}", short_digest(d), names.join(", ")))
                .collect();
            format!("VIP {vip}: tables differ ({})", sides.join("; "))
        })
        .collect()
}

#[cfg(test)]
mod tests;

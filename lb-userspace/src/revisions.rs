//! Revisions: every configuration `lbd` applied (or tried to), numbered,
//! kept across restarts so that an operator can list them and go back to
//! one (`lbctl history`, `lbctl revert`).
//!
//! A revision holds what is needed to run it again: the configuration
//! file's text as it was applied and the API's changes on top (the
//! overlay), with its time, its source (`start`, `reload`, `api: ...`,
//! `revert to 7`, ...), the digest of the effective configuration
//! ([`crate::digest::config`]), the result, and the digest of the file on
//! disk when it was applied (so that a reload of an unchanged file does not
//! undo a revert).
//!
//! One private file per revision (`00000012.json`, mode 0600, written
//! atomically) in a private directory beside the state file; the newest
//! `keep` are kept. Numbers come from the file names, so a corrupt file
//! never makes a number be used twice: it is listed with the reason and
//! left in place, and every other revision stays usable.
//!
//! Beside them, the small JSON files a restarted `lbd` resumes from: the
//! probation in force (`probation.json`), the backends found down
//! (`verdicts.json`), a rollout's hold (`hold.json`) and a node drain an
//! `lbd` that did not stop cleanly leaves (`drain.json`).

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{
    atomic_file,
    config::VipId,
    state::Overlay,
    tier::rollout::{Change, Snapshot},
};

/// Largest revision file read back (a configuration is at most 16 MiB).
const MAX_REVISION_BYTES: u64 = 40 << 20;

#[derive(Debug, Error)]
pub enum RevisionError {
    #[error("revision {0} does not exist (see `lbctl history`)")]
    Missing(u64),
    #[error("revision {number}: {path} is unreadable: {reason}")]
    Corrupt {
        number: u64,
        path: String,
        reason: String,
    },
    #[error("revisions in {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl RevisionError {
    /// The revision it is about, if one.
    pub fn number(&self) -> Option<u64> {
        match self {
            Self::Missing(n) | Self::Corrupt { number: n, .. } => Some(*n),
            Self::Io { .. } => None,
        }
    }
}

/// One applied (or refused) configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    pub number: u64,
    /// Seconds since the Unix epoch.
    pub time: u64,
    /// Where it came from, in words.
    pub source: String,
    /// The effective configuration's digest (`None` if it never parsed).
    pub digest: Option<String>,
    /// `None`: applied; otherwise why not.
    pub error: Option<String>,
    /// The configuration file's text as applied.
    pub config: Option<String>,
    /// The API's changes on top of it.
    pub overlay: Option<Overlay>,
    /// The digest of the configuration file on disk when this revision
    /// was made (it differs from `config`'s after a revert; for a refused
    /// reload, the refused file's).
    pub file_digest: Option<String>,
    /// A refusal that `--force` overrides (the blackhole guard, flows sent
    /// to other backends): a start does not apply that file either
    /// ([`RevisionStore::kept_over_refused`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forceable: bool,
}

impl Revision {
    /// It ran (it can be reverted to).
    pub fn applied(&self) -> bool {
        self.error.is_none() && self.config.is_some() && self.overlay.is_some()
    }
}

/// A revision as listed: the revision, or why its file cannot be read.
pub type Listed = Result<Revision, RevisionError>;

/// The file of the probation in force, beside the revisions.
const PROBATION: &str = "probation.json";
/// A probation as the revision store keeps it (`probation.json`), so that
/// an `lbd` restarted before the deadline resumes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedProbation {
    pub revision: u64,
    pub fallback: u64,
    /// The deadline, in seconds since the Unix epoch.
    pub deadline: u64,
    pub announced: Vec<VipId>,
}

/// The backends the probes last found down, beside the revisions.
const VERDICTS: &str = "verdicts.json";

/// The probes' last verdicts that matter across a restart: the backends
/// found down (`verdicts.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedVerdicts {
    pub down: Vec<(VipId, std::net::IpAddr)>,
}

/// The node drain in force, beside the revisions.
const DRAIN: &str = "drain.json";

/// A node drain (`lbctl node drain`), kept until `lbctl node undrain` or a
/// clean stop (`drain.json`): a balancer that crashed or was killed by its
/// watchdog while drained for maintenance comes back drained, not
/// announcing every VIP again on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDrain {
    /// When the drain began, seconds since the Unix epoch.
    pub since_unix_secs: u64,
}

/// The rollout hold in force, beside the revisions.
const HOLD: &str = "hold.json";

/// What a balancer holding a rollout's candidate judges it against
/// (`hold.json`), so that an `lbd` restarted during the hold compares with
/// the state before the candidate, not with the candidate's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedHold {
    /// The rollout (its record's revision).
    pub rollout: i64,
    /// The digest of the candidate's text ([`crate::digest::text`]): a
    /// rollout id seen again after etcd went back is another rollout.
    pub candidate: String,
    pub before: Snapshot,
    pub change: Change,
    /// The desired state that ran before the candidate (its revision and
    /// text): where a revert goes when this balancer refused the tier's
    /// newest, also after a restart (absent from an older `lbd`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_desired: Option<(i64, String)>,
}

/// The revisions of one instance, on disk.
#[derive(Clone, Debug)]
pub struct RevisionStore {
    dir: PathBuf,
    keep: usize,
    /// A test's fault: this many listings of the directory fail next.
    #[cfg(test)]
    failing_listings: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl RevisionStore {
    /// The store in `dir` (created, private, if missing), keeping the
    /// newest `keep` revisions.
    pub fn open(dir: &Path, keep: usize) -> Result<Self, RevisionError> {
        let io = |source| RevisionError::Io {
            path: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            keep: keep.max(1),
            #[cfg(test)]
            failing_listings: Default::default(),
        })
    }

    /// Makes the next `n` listings of the directory fail (a disk that
    /// cannot even be read), in this store and its clones.
    #[cfg(test)]
    pub fn fail_listings(&self, n: u32) {
        self.failing_listings
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// A listing this test made fail (one fewer to fail after it).
    #[cfg(test)]
    fn listing_fault(&self) -> Option<std::io::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let failed = self
            .failing_listings
            .fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1));
        failed
            .is_ok()
            .then(|| std::io::Error::other("a listing this test made fail"))
    }

    /// No listing fails but the disk's own.
    #[cfg(not(test))]
    fn listing_fault(&self) -> Option<std::io::Error> {
        None
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:08}.json"))
    }

    /// The revision numbers on disk, ascending (from the file names).
    pub fn numbers(&self) -> Result<Vec<u64>, RevisionError> {
        let io = |source| RevisionError::Io {
            path: self.dir.display().to_string(),
            source,
        };
        if let Some(fault) = self.listing_fault() {
            return Err(io(fault));
        }
        let mut numbers: Vec<u64> = std::fs::read_dir(&self.dir)
            .map_err(io)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".json")?;
                (stem.len() == 8 && stem.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| stem.parse().ok())?
            })
            .collect();
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// The number the next revision gets.
    pub fn next_number(&self) -> Result<u64, RevisionError> {
        Ok(self.numbers()?.last().map_or(1, |n| n + 1))
    }

    /// Reads revision `number`.
    pub fn get(&self, number: u64) -> Result<Revision, RevisionError> {
        let path = self.path(number);
        let corrupt = |reason: String| RevisionError::Corrupt {
            number,
            path: path.display().to_string(),
            reason,
        };
        let text = match read_bounded(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RevisionError::Missing(number));
            }
            Err(e) => return Err(corrupt(e.to_string())),
        };
        let revision: Revision = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if revision.number != number {
            return Err(corrupt(format!(
                "it says it is revision {}",
                revision.number
            )));
        }
        Ok(revision)
    }

    /// Writes `revision` (numbered by the caller from
    /// [`next_number`](Self::next_number)) and drops the oldest beyond
    /// `keep`, except the newest that ran, and the newest that ran before
    /// `revision` (which is written before it runs, and removed if it then
    /// fails: [`remove`](Self::remove)). A restart starts from it, and a
    /// run of refused changes (a revert retried against a broken file)
    /// must not leave it nothing to start from. A probation's revision and
    /// the fallback its automatic revert goes to are kept while it lasts
    /// (`probation.json`): refusals during it must not take away the way
    /// back. So `keep` files, or more while those it must keep are more.
    pub fn append(&self, revision: &Revision) -> Result<(), RevisionError> {
        let path = self.path(revision.number);
        let io = |source| RevisionError::Io {
            path: path.display().to_string(),
            source,
        };
        let text = serde_json::to_vec_pretty(revision).map_err(|e| io(e.into()))?;
        atomic_file::write_private(&path, &text).map_err(io)?;
        let numbers = self.numbers()?;
        let excess = numbers.len().saturating_sub(self.keep);
        let [ran, ran_before] = [None, Some(revision.number)]
            .map(|before| self.newest_applied(&numbers, before).map(|r| r.number));
        // An unreadable probation file protects nothing: it is refused
        // where it is read.
        let probation = self.probation().ok().flatten();
        let kept = [
            ran,
            ran_before,
            probation.as_ref().map(|p| p.revision),
            probation.as_ref().map(|p| p.fallback),
        ];
        for old in numbers
            .iter()
            .filter(|n| !kept.contains(&Some(**n)))
            .take(excess)
        {
            let _ = std::fs::remove_file(self.path(*old));
        }
        Ok(())
    }

    /// The newest of `numbers` (below `before`) that ran and can be read.
    fn newest_applied(&self, numbers: &[u64], before: Option<u64>) -> Option<Revision> {
        numbers
            .iter()
            .rev()
            .filter(|n| before.is_none_or(|b| **n < b))
            .filter_map(|n| self.get(*n).ok())
            .find(Revision::applied)
    }

    /// The probation an `lbd` left (`probation.json`), if any.
    pub fn probation(&self) -> Result<Option<SavedProbation>, RevisionError> {
        self.read_side(PROBATION)
    }

    /// The backends the last `lbd` found down; none if it left no file.
    pub fn verdicts(&self) -> Result<SavedVerdicts, RevisionError> {
        Ok(self.read_side(VERDICTS)?.unwrap_or_default())
    }

    /// Writes the backends found down now.
    pub fn save_verdicts(&self, saved: &SavedVerdicts) -> Result<(), RevisionError> {
        self.write_side(VERDICTS, Some(saved))
    }

    /// Writes the probation (`None`: removes it).
    pub fn save_probation(&self, saved: Option<&SavedProbation>) -> Result<(), RevisionError> {
        self.write_side(PROBATION, saved)
    }

    /// The node drain an `lbd` left (`drain.json`), if any.
    pub fn drain(&self) -> Result<Option<SavedDrain>, RevisionError> {
        self.read_side(DRAIN)
    }

    /// Writes the node drain (`None`: removes it).
    pub fn save_drain(&self, saved: Option<&SavedDrain>) -> Result<(), RevisionError> {
        self.write_side(DRAIN, saved)
    }

    /// The rollout hold an `lbd` left (`hold.json`), if any.
    pub fn hold(&self) -> Result<Option<SavedHold>, RevisionError> {
        self.read_side(HOLD)
    }

    /// Writes the rollout hold (`None`: removes it).
    pub fn save_hold(&self, saved: Option<&SavedHold>) -> Result<(), RevisionError> {
        self.write_side(HOLD, saved)
    }

    /// A JSON file kept beside the revisions (bounded as they are); `None`
    /// if there is none.
    fn read_side<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, RevisionError> {
        let path = self.dir.join(name);
        match read_bounded(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| RevisionError::Corrupt {
                    number: 0,
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RevisionError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Writes a JSON file beside the revisions, privately and atomically
    /// (`None`: removes it).
    fn write_side<T: Serialize>(&self, name: &str, saved: Option<&T>) -> Result<(), RevisionError> {
        let path = self.dir.join(name);
        let io = |source| RevisionError::Io {
            path: path.display().to_string(),
            source,
        };
        match saved {
            Some(saved) => {
                let text = serde_json::to_vec(saved).map_err(|e| io(e.into()))?;
                atomic_file::write_private(&path, &text).map_err(io)
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            },
        }
    }

    /// Removes revision `number` (one written for a change that the maps
    /// then refused: its number goes to the refusal's record). Best
    /// effort: a file left behind reads as a revision that did not run.
    pub fn remove(&self, number: u64) {
        let _ = std::fs::remove_file(self.path(number));
    }

    /// The newest `last` revisions, newest first, each read or the reason
    /// it cannot be; read one at a time as the iterator is walked, so that
    /// a long history of large files is never in memory at once.
    pub fn list(&self, last: usize) -> Result<impl Iterator<Item = Listed> + '_, RevisionError> {
        let numbers = self.numbers()?;
        // A revision pruned (by a write) after the listing is gone, not
        // unreadable: left out.
        Ok(numbers
            .into_iter()
            .rev()
            .take(last)
            .map(|n| self.get(n))
            .filter(|r| !matches!(r, Err(RevisionError::Missing(_)))))
    }

    /// What a start runs instead of the file whose digest is `file_digest`:
    /// the newest revision that ran, when a reload of that very file was
    /// refused for what `--force` overrides and the file has not run since.
    /// Newest first, a revision that ran the file's text ends it; what ran
    /// beside the file without being it (a start that kept what ran, a
    /// revert, API changes on the old text) and other refusals do not. A
    /// reload refused for the blackhole guard or for flows it would move
    /// must not be applied by the next start (an upgrade, a crash) without
    /// the force it was refused for.
    pub fn kept_over_refused(&self, file_digest: &str) -> Option<(Revision, Revision)> {
        let numbers = self.numbers().ok()?;
        let refused = numbers
            .iter()
            .rev()
            .filter_map(|n| self.get(*n).ok())
            .filter(|r| r.file_digest.as_deref() == Some(file_digest))
            .find(|r| {
                let ran_it = r.applied()
                    && r.config.as_deref().map(crate::digest::text).as_deref() == Some(file_digest);
                ran_it || r.forceable
            })?;
        if !refused.forceable {
            return None;
        }
        let ran = self.newest_applied(&numbers, None)?;
        Some((refused, ran))
    }

    /// The newest revision that was applied and is readable, before
    /// `before` (or at all, with `None`).
    pub fn latest_applied(&self, before: Option<u64>) -> Result<Option<Revision>, RevisionError> {
        Ok(self.newest_applied(&self.numbers()?, before))
    }
}

fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_REVISION_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_REVISION_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_REVISION_BYTES} bytes"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch::ScratchDir;

    fn revision(number: u64, ok: bool) -> Revision {
        Revision {
            number,
            time: 1_700_000_000 + number,
            source: format!("reload {number}"),
            digest: Some(format!("d{number}")),
            error: (!ok).then(|| "refused".to_string()),
            config: Some(format!("instance: r{number}\n")),
            overlay: Some(Overlay::default()),
            file_digest: Some("f".into()),
            forceable: false,
        }
    }

    /// A start keeps what ran over a file the newest revision refused for
    /// what `--force` overrides; not over a file refused otherwise, nor
    /// over a file changed since, nor once something ran after.
    #[test]
    fn a_start_keeps_what_ran_over_a_file_refused_for_force() {
        let dir = ScratchDir::new("revisions-refused");
        let store = RevisionStore::open(&dir.join("r"), 10).unwrap();
        // File E ran; file F is refused for force.
        let (e_text, f_text) = ("instance: e\n", "instance: f\n");
        let (e, f) = (crate::digest::text(e_text), crate::digest::text(f_text));
        let made = |n: u64, ran: Option<&str>, beside: &str| Revision {
            config: ran.map(str::to_string),
            overlay: ran.map(|_| Overlay::default()),
            error: ran.is_none().then(|| "refused".to_string()),
            file_digest: Some(beside.into()),
            ..revision(n, true)
        };
        store.append(&made(1, Some(e_text), &e)).unwrap();
        assert!(store.kept_over_refused(&f).is_none(), "nothing refused");
        store
            .append(&Revision {
                forceable: true,
                ..made(2, None, &f)
            })
            .unwrap();
        let (refused, ran) = store.kept_over_refused(&f).expect("kept");
        assert_eq!((refused.number, ran.number), (2, 1));
        assert!(store.kept_over_refused(&e).is_none(), "another file now");
        // What ran beside F without being it: a start that kept E, API
        // changes on E, an API change refused. The refusal stands, and the
        // newest that ran is what a start runs.
        store.append(&made(3, Some(e_text), &f)).unwrap();
        store.append(&made(4, None, &f)).unwrap();
        let (refused, ran) = store.kept_over_refused(&f).expect("kept");
        assert_eq!((refused.number, ran.number), (2, 3));
        // Forced: F ran.
        store.append(&made(5, Some(f_text), &f)).unwrap();
        assert!(store.kept_over_refused(&f).is_none(), "the file ran after");
    }

    #[test]
    fn revisions_survive_a_reopen_and_the_oldest_are_dropped() {
        let dir = ScratchDir::new("revisions");
        let store = RevisionStore::open(&dir.join("r"), 3).unwrap();
        assert_eq!(store.next_number().unwrap(), 1);
        for n in 1..=5 {
            store.append(&revision(n, n != 4)).unwrap();
        }
        let again = RevisionStore::open(&dir.join("r"), 3).unwrap();
        assert_eq!(again.numbers().unwrap(), vec![3, 4, 5]);
        assert_eq!(again.next_number().unwrap(), 6);
        assert_eq!(again.get(5).unwrap(), revision(5, true));
        assert!(matches!(again.get(1), Err(RevisionError::Missing(1))));
        // 4 was refused: the one before 5 that can be run again is 3.
        assert_eq!(again.latest_applied(Some(5)).unwrap().unwrap().number, 3);
        let mode = std::fs::metadata(again.path(5))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(again.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    /// More refused revisions than `keep` in a row (a revert retried
    /// against a broken file) keep the newest that ran, so a restart has
    /// something to start from.
    #[test]
    fn the_newest_revision_that_ran_outlives_a_run_of_refused_ones() {
        let dir = ScratchDir::new("revisions-refused");
        let store = RevisionStore::open(&dir.join("r"), 3).unwrap();
        store.append(&revision(1, true)).unwrap();
        store.append(&revision(2, true)).unwrap();
        for n in 3..=7 {
            store.append(&revision(n, false)).unwrap();
        }
        assert_eq!(store.numbers().unwrap(), vec![2, 6, 7]);
        assert_eq!(store.latest_applied(None).unwrap().unwrap().number, 2);
        // A change is written before it runs: 2 stays until 8 is known
        // to have run (the next append), in case 8 fails and is removed.
        store.append(&revision(8, true)).unwrap();
        assert_eq!(store.numbers().unwrap(), vec![2, 7, 8]);
        store.remove(8);
        assert_eq!(store.latest_applied(None).unwrap().unwrap().number, 2);
        store.append(&revision(8, true)).unwrap();
        store.append(&revision(9, false)).unwrap();
        assert_eq!(store.numbers().unwrap(), vec![7, 8, 9]);
    }

    /// A probation's revision and its fallback outlive refused changes
    /// made while it lasts (each is a revision of its own), so the
    /// automatic revert still finds its way back; after it they go.
    /// The files a restart resumes from are written, read back and
    /// removed; removing one that is not there is no fault, and one that
    /// cannot be read or removed (a directory in its place) is named, not
    /// taken for no file.
    #[test]
    fn side_files_are_kept_and_removed_and_their_faults_named() {
        let dir = ScratchDir::new("revisions-side");
        let path = dir.join("r");
        let store = RevisionStore::open(&path, 3).unwrap();
        assert_eq!(store.hold().unwrap(), None);
        store
            .save_hold(None)
            .expect("nothing to remove is no fault");
        let mut before = Snapshot::default();
        before.announced.insert("192.0.2.1:179".into(), 2);
        let saved = SavedHold {
            rollout: 8,
            candidate: "c".into(),
            before,
            change: Change::default(),
            before_desired: Some((5, "vips: []\n".into())),
        };
        store.save_hold(Some(&saved)).unwrap();
        assert_eq!(store.hold().unwrap(), Some(saved));
        // An older lbd's hold, without the state before: read all the same.
        std::fs::write(
            path.join("hold.json"),
            r#"{"rollout":8,"candidate":"c","before":{},"change":{}}"#,
        )
        .unwrap();
        assert_eq!(store.hold().unwrap().unwrap().before_desired, None);
        store.save_hold(None).unwrap();
        assert_eq!(store.hold().unwrap(), None);
        std::fs::create_dir(path.join(HOLD)).unwrap();
        let e = store.hold().unwrap_err();
        assert!(matches!(e, RevisionError::Io { .. }), "{e}");
        assert!(store.save_hold(None).is_err(), "a directory is not removed");
        std::fs::remove_dir(path.join(HOLD)).unwrap();
        std::fs::write(path.join(HOLD), "{").unwrap();
        let e = store.hold().unwrap_err();
        assert!(matches!(e, RevisionError::Corrupt { .. }), "{e}");
    }

    #[test]
    fn a_probations_fallback_outlives_the_refusals_made_during_it() {
        let dir = ScratchDir::new("revisions-probation");
        let store = RevisionStore::open(&dir.join("r"), 3).unwrap();
        for n in 1..=3 {
            store.append(&revision(n, true)).unwrap();
        }
        let probation = SavedProbation {
            revision: 3,
            fallback: 2,
            deadline: 1_700_000_300,
            announced: Vec::new(),
        };
        store.save_probation(Some(&probation)).unwrap();
        for n in 4..=8 {
            store.append(&revision(n, false)).unwrap();
        }
        assert_eq!(store.numbers().unwrap(), vec![2, 3, 8]);
        assert_eq!(store.get(2).unwrap().number, 2, "the way back is readable");
        store.save_probation(None).unwrap();
        store.append(&revision(9, false)).unwrap();
        assert_eq!(
            store.numbers().unwrap(),
            vec![3, 8, 9],
            "the newest that ran stays"
        );
    }

    /// A revision pruned while a listing is being read is left out, not
    /// shown as unreadable.
    #[test]
    fn a_revision_pruned_during_a_listing_is_left_out() {
        let dir = ScratchDir::new("revisions-pruned");
        let store = RevisionStore::open(&dir.join("r"), 10).unwrap();
        for n in 1..=3 {
            store.append(&revision(n, true)).unwrap();
        }
        let mut listed = store.list(10).unwrap();
        assert_eq!(listed.next().unwrap().unwrap().number, 3);
        std::fs::remove_file(store.path(1)).unwrap();
        let rest: Vec<u64> = listed.map(|r| r.unwrap().number).collect();
        assert_eq!(rest, [2]);
    }

    #[test]
    fn a_corrupt_revision_is_named_and_loses_nothing_else() {
        let dir = ScratchDir::new("revisions-corrupt");
        let store = RevisionStore::open(&dir.join("r"), 10).unwrap();
        for n in 1..=3 {
            store.append(&revision(n, true)).unwrap();
        }
        std::fs::write(store.path(2), b"{ half a revis").unwrap();
        std::fs::write(store.dir().join("notes.txt"), b"not a revision").unwrap();
        let listed: Vec<Listed> = store.list(10).unwrap().collect();
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[0].as_ref().unwrap().number, 3);
        let err = listed[1].as_ref().unwrap_err().to_string();
        assert!(
            err.starts_with("revision 2: ") && err.contains("00000002.json"),
            "{err}"
        );
        assert_eq!(listed[2].as_ref().unwrap().number, 1);
        // The corrupt one is skipped, not reused, and left for inspection.
        assert_eq!(store.latest_applied(Some(3)).unwrap().unwrap().number, 1);
        assert_eq!(store.next_number().unwrap(), 4);
        assert!(store.path(2).exists());
        // A file whose content names another number is corrupt too.
        std::fs::write(
            store.path(3),
            serde_json::to_vec(&revision(9, true)).unwrap(),
        )
        .unwrap();
        let err = store.get(3).unwrap_err().to_string();
        assert!(err.contains("it says it is revision 9"), "{err}");
    }
}

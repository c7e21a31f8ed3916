//! Every configuration change goes through one path, [`Daemon::commit`]:
//! a reload, an API change, a revert, an automatic revert. It checks the
//! change (rules, fixed settings, the blackhole guard), previews it
//! (`--dry-run`), or applies it (settings, tables, state file,
//! announcers), records it as a revision, and with `--confirm-within`
//! arms the automatic revert.
//!
//! Commit confirmed: until `lbctl confirm`, the change runs on probation.
//! When the window ends, or as soon as the change makes a VIP that was
//! announced lose its announcement (checked before the announcers hear of
//! it, so the routers never see the withdrawal), `lbd` reverts to the
//! revision that ran before ([`Daemon::settle`]), logs it and counts it.

use std::{collections::BTreeSet, sync::Arc, time::SystemTime};

use tracing::{error, info, warn};

use super::{
    Daemon, Result, refused,
    settings::{datapath_settings, fixed_setting_changed, hash_key_of, resolve_gateway},
};
use crate::api::ErrorKind;
use crate::{
    announce::policy::NodeState,
    api::{ChangeOptions, Committed},
    config::{Config, VipConfig, VipId},
    dataplane::Dataplane,
    digest,
    revisions::{Revision, SavedProbation},
    state::Overlay,
};

/// A configuration to run: the file's (and its text), and the API's
/// changes on top.
#[derive(Clone, Debug)]
pub struct Target {
    pub config: Config,
    pub text: Arc<str>,
    pub overlay: Overlay,
}

impl Target {
    /// The effective VIPs.
    pub fn effective(&self) -> Vec<VipConfig> {
        self.overlay.apply(&self.config.vips)
    }

    /// The digest of the effective configuration.
    pub fn digest(&self) -> String {
        digest::config(self.config.layout.table_size, &self.effective())
    }
}

/// Whether a change may leave a serving VIP without a usable backend, and
/// how the operator says so.
#[derive(Clone, Copy, Debug)]
pub struct Force {
    pub yes: bool,
    pub how: &'static str,
    /// A reload of a changed file: its refusal for what `yes` overrides
    /// holds across a start (`RevisionStore::kept_over_refused`).
    pub file: bool,
}

/// A change on probation (`--confirm-within`).
#[derive(Clone, Debug)]
pub struct Pending {
    pub revision: u64,
    /// What runs again without a confirmation.
    pub fallback: u64,
    pub deadline: tokio::time::Instant,
    /// VIPs announced when the probation began that the change touched
    /// ([`Daemon::watched`]): losing one reverts.
    pub announced: BTreeSet<VipId>,
    /// The automatic revert failed: why it was due, and why it failed. It
    /// is tried again at `deadline` (now [`REVERT_RETRY`] later).
    pub revert_failed: Option<(String, String)>,
}

/// How long after a failed automatic revert it is tried again.
pub const REVERT_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A probation as the revision store keeps it.
fn saved_probation(p: &Pending) -> SavedProbation {
    let left = p
        .deadline
        .saturating_duration_since(tokio::time::Instant::now());
    SavedProbation {
        revision: p.revision,
        fallback: p.fallback,
        deadline: unix_now() + left.as_secs() + u64::from(left.subsec_nanos() > 0),
        announced: p.announced.iter().copied().collect(),
    }
}

/// What kind of change a commit is (reverts may cut a probation short).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Change,
    Revert,
}

impl<D: Dataplane> Daemon<D> {
    /// The running configuration as a [`Target`].
    pub fn running(&self) -> Target {
        Target {
            config: self.config.clone(),
            text: self.text.clone(),
            overlay: self.overlay.clone(),
        }
    }

    /// Checks, previews or applies `target` (see the module docs). A
    /// change that fails is recorded as a refused revision; the running
    /// configuration stays.
    pub async fn commit(
        &mut self,
        target: Target,
        source: String,
        options: &ChangeOptions,
        force: Force,
        kind: Kind,
    ) -> Result<Committed> {
        let result = self.try_commit(target, &source, options, force, kind).await;
        if let Err(e) = &result
            && !options.dry_run
        {
            let forceable =
                force.file && matches!(e.kind(), ErrorKind::Blackhole | ErrorKind::NeedsForce);
            self.record_as(&source, Err(e.to_string()), forceable);
        }
        result
    }

    async fn try_commit(
        &mut self,
        mut target: Target,
        source: &str,
        options: &ChangeOptions,
        force: Force,
        kind: Kind,
    ) -> Result<Committed> {
        let mut warnings = self.check(&target, force, options.dry_run)?;
        if options.dry_run {
            return self.dry_run(&target, warnings, kind, options);
        }
        if let Some(p) = &self.confirm
            && kind == Kind::Change
            && options.confirm_within.is_none()
        {
            return Err(refused(
                ErrorKind::Conflict,
                format!(
                    "revision {} awaits confirmation: `lbctl confirm` it, `lbctl revert` it, or make this change with --confirm-within too",
                    p.revision
                ),
            ));
        }
        if self.is_running(&target) {
            return Ok(Committed {
                revision: Some(self.revision),
                warnings,
                note: Some("nothing changed".into()),
                ..Committed::default()
            });
        }
        warnings.extend(self.dropped_override_warnings(&target));
        if kind == Kind::Revert {
            target.overlay.restamp_drains(&self.overlay, unix_now());
        }
        // Everything that can fail is done before the first map write:
        // the checks above, then the revision, the state file and the
        // probation.
        let number = match self.persist(&target, source, options) {
            Ok(n) => n,
            Err(e) if kind == Kind::Revert => self.revert_off_disk(&e, &mut warnings),
            Err(e) => return Err(e),
        };
        let before = self.confirm.clone();
        if let Some(within) = &options.confirm_within {
            self.confirm = Some(Pending {
                revision: 0,
                fallback: before.as_ref().map_or(self.revision, |p| p.fallback),
                deadline: tokio::time::Instant::now() + within.0,
                announced: self.watched(&target),
                revert_failed: None,
            });
        } else if kind == Kind::Revert {
            self.confirm = None;
        }
        if let Err(e) = self.apply(target).await {
            self.confirm = before;
            self.unpersist(number);
            self.save_probation();
            return Err(e);
        }
        self.applied(number, source, options);
        for w in &warnings {
            warn!("{w}");
        }
        Ok(Committed {
            revision: Some(number),
            warnings,
            confirm_within_secs: options.confirm_within.map(|w| w.0.as_secs_f64()),
            ..Committed::default()
        })
    }

    /// A revert (an automatic one above all) is the way out of a bad
    /// change: it goes on even if the disk took nothing (`e`), and says so.
    /// Its number.
    fn revert_off_disk(&self, e: &super::DaemonError, warnings: &mut Vec<String>) -> u64 {
        error!("{e}: reverting all the same");
        let number = self.next_revision().unwrap_or(self.revision + 1);
        warnings.push(format!(
            "the revert runs, but nothing of it reached the disk ({e}): `lbctl history` has no revision {number}, and a restart of lbd runs what the state file and the file say, which may be the change this reverts"
        ));
        number
    }

    /// A dry run's answer: the preview, with the checks' warnings, and a
    /// word if the change, made now, would be refused for a probation.
    fn dry_run(
        &self,
        target: &Target,
        mut warnings: Vec<String>,
        kind: Kind,
        options: &ChangeOptions,
    ) -> Result<Committed> {
        let mut preview = self.preview(target)?;
        if let Some(p) = &self.confirm
            && kind == Kind::Change
            && options.confirm_within.is_none()
        {
            warnings.push(format!(
                "revision {} awaits confirmation: made now, this change would be refused unless made with --confirm-within too",
                p.revision
            ));
        }
        preview.warnings = warnings;
        Ok(Committed {
            preview: Some(preview),
            ..Committed::default()
        })
    }

    /// A change applied as revision `number`: it runs, on probation if
    /// asked.
    fn applied(&mut self, number: u64, source: &str, options: &ChangeOptions) {
        self.revision = number;
        self.revision_source = source.to_string();
        if let Some(p) = &mut self.confirm
            && options.confirm_within.is_some()
        {
            p.revision = number;
            info!(
                revision = number,
                fallback = p.fallback,
                "change on probation until `lbctl confirm`"
            );
        }
        if options.confirm_within.is_none() {
            // A revert ended the probation, or there was none.
            self.save_probation();
        }
    }

    /// The runtime changes `target` takes back (the file changed their
    /// object), in words for the change's answer.
    fn dropped_override_warnings(&self, target: &Target) -> Vec<String> {
        self.dropped_overrides(target)
            .into_iter()
            .map(|o| {
                let what = match o.backend {
                    Some(b) => format!("VIP {} backend {b} {}", o.vip, o.field),
                    None => format!("VIP {}", o.vip),
                };
                format!(
                    "{what}: the runtime change of revision {} ({}: {}) no longer applies; the file says {}",
                    o.revision, o.source, o.running, o.file
                )
            })
            .collect()
    }

    /// The digest of the running configuration, kept until a change
    /// applies.
    pub fn running_digest(&mut self) -> String {
        if let Some(d) = &self.running_digest {
            return d.clone();
        }
        let d = self.running().digest();
        self.running_digest = Some(d.clone());
        d
    }

    /// `target` is what runs now (same text, same API changes).
    /// The target is what runs: the same text, runtime changes and
    /// configuration, and the same hash key (its file rewritten in place
    /// changes none of the others: a rotation forced with `--force` was
    /// answered "nothing changed" and the old key kept, helper-37).
    fn is_running(&self, target: &Target) -> bool {
        target.text == self.text
            && target.overlay == self.overlay
            && target.config == self.config
            && hash_key_of(&target.config).is_ok_and(|k| k == self.settings.hash_key)
    }

    /// The rules a change must pass before anything is written: settings
    /// only a restart may change, the VIP rules, the blackhole guard.
    /// Returns the warnings.
    fn check(&self, target: &Target, force: Force, dry_run: bool) -> Result<Vec<String>> {
        if let Some((what, why)) = fixed_setting_changed(&self.config, &target.config) {
            return Err(refused(
                ErrorKind::FixedSetting,
                format!(
                    "{what} changed: only a restart changes it ({why}); restart lbd to change it"
                ),
            ));
        }
        // The new announcers' files (BGP keys) before anything is
        // written: found missing only when they start, the change would
        // be half made.
        if target.config.announce != self.config.announce {
            let errors = target.config.announce.check_files();
            if !errors.is_empty() {
                return Err(crate::config::ConfigErrors {
                    source_name: None,
                    errors,
                }
                .into());
            }
        }
        let effective = target.effective();
        let mut warnings = target.config.check_vips(&effective)?;
        // Room in the maps before anything is written (the revision, the
        // state file, the settings): the apply would refuse it half-way.
        self.reconciler.check_room(&effective)?;
        if target.text != self.text {
            let file_only = file_only_warnings(&target.config.warnings, &warnings);
            warnings.extend(file_only);
        }
        let key = hash_key_of(&target.config)?;
        let remaps = self.remaps(&effective, key);
        if !remaps.is_empty() && !force.yes {
            return Err(refused(
                ErrorKind::NeedsForce,
                format!(
                    "refused, it sends flows to other backends (a table size or the hash fields change): {}; to do it anyway: `{}`",
                    remaps.join("; "),
                    force.how
                ),
            ));
        }
        let drained = target.overlay.drained_in(&effective);
        let mut forced = self.refuse_blackhole(&effective, &drained, force.yes, force.how)?;
        let (gone, _) = self.serving_removed(&effective);
        warnings.extend(gone.iter().map(|id| {
            format!("VIP {id} is removed: it serves now; it is withdrawn and its connections end")
        }));
        forced.extend(remaps);
        if !dry_run {
            for p in &forced {
                error!("forced: {p}");
            }
        }
        warnings.extend(forced);
        Ok(warnings)
    }

    /// The number of the next revision: after the newest on disk, and
    /// after the one running (a revert the disk took nothing of runs under
    /// a number no file has: the next change must not take it again).
    pub(super) fn next_revision(
        &self,
    ) -> std::result::Result<u64, crate::revisions::RevisionError> {
        Ok(self.revisions.next_number()?.max(self.revision + 1))
    }

    /// Writes what a change must leave on disk before it touches the maps:
    /// its revision (as applied) and, if the API's changes differ, the
    /// state file. A failure here refuses the change with nothing written
    /// to the maps; a revision written before a later failure goes again.
    fn persist(&mut self, target: &Target, source: &str, options: &ChangeOptions) -> Result<u64> {
        let number = self
            .next_revision()
            .map_err(|e| refused(ErrorKind::Internal, format!("{e}; nothing changed")))?;
        let revision = self.revision_of(number, source, Ok(target));
        self.revisions.append(&revision).map_err(|e| {
            refused(
                ErrorKind::Internal,
                format!("writing revision {number}: {e}; nothing changed"),
            )
        })?;
        // The probation before the state file: a crash between the two
        // then leaves a probation of a change that never ran (a start ends
        // it), never a change that runs unwatched.
        if let Some(within) = &options.confirm_within {
            let saved = SavedProbation {
                revision: number,
                fallback: self.confirm.as_ref().map_or(self.revision, |p| p.fallback),
                deadline: unix_now() + within.0.as_secs(),
                announced: self.watched(target).into_iter().collect(),
            };
            if let Err(e) = self.revisions.save_probation(Some(&saved)) {
                self.revisions.remove(number);
                return Err(refused(
                    ErrorKind::Internal,
                    format!("{e}; nothing changed"),
                ));
            }
        }
        if target.overlay != self.overlay
            && let Err(e) = target.overlay.save(&target.config.state_file)
        {
            self.revisions.remove(number);
            if options.confirm_within.is_some() {
                self.save_probation();
            }
            return Err(refused(
                ErrorKind::Internal,
                format!("{e}; nothing changed"),
            ));
        }
        Ok(number)
    }

    /// Makes the revision store's probation what runs now (none, or the
    /// one on probation). Logged, not fatal: the change itself stands.
    fn save_probation(&self) {
        let saved = self.confirm.as_ref().map(saved_probation);
        if let Err(e) = self.revisions.save_probation(saved.as_ref()) {
            error!("revisions: the probation: {e}");
        }
    }

    /// At start-up, after [`start_revision`](Self::start_revision): a
    /// probation an earlier `lbd` left resumes if what starts is the
    /// revision on probation, with the time it had left; if its deadline
    /// passed while `lbd` was away, the revert is due at once (unconfirmed
    /// is unconfirmed, whoever was running). A start that runs something
    /// else (the file changed since) ends it: that is the operator's newer
    /// intent.
    pub fn resume_probation(&mut self) {
        let saved = match self.revisions.probation() {
            Ok(Some(saved)) => saved,
            Ok(None) => return,
            Err(e) => {
                error!("revisions: the probation cannot be read, so it is dropped: {e}");
                let _ = self.revisions.save_probation(None);
                return;
            }
        };
        if saved.revision != self.revision {
            warn!(
                revision = saved.revision,
                running = self.revision,
                "a probation left by the last lbd ends: this start runs another revision"
            );
            let _ = self.revisions.save_probation(None);
            return;
        }
        let left = std::time::Duration::from_secs(saved.deadline.saturating_sub(unix_now()));
        self.confirm = Some(Pending {
            revision: saved.revision,
            fallback: saved.fallback,
            deadline: tokio::time::Instant::now() + left,
            announced: saved.announced.into_iter().collect(),
            revert_failed: None,
        });
        if left.is_zero() {
            self.revert_due = Some(
                "it was not confirmed in time (the deadline passed while lbd was not running)"
                    .into(),
            );
        } else {
            warn!(
                revision = saved.revision,
                fallback = saved.fallback,
                "resuming the probation of revision {}: {}s left to `lbctl confirm` it",
                saved.revision,
                left.as_secs()
            );
        }
    }

    /// Takes back what [`persist`](Self::persist) wrote, after the maps
    /// refused the change: the revision goes (the refusal is recorded in
    /// its place) and the state file holds the running changes again.
    fn unpersist(&mut self, number: u64) {
        self.revisions.remove(number);
        if let Err(e) = self.overlay.save(&self.config.state_file) {
            error!("restoring the state file after a refused change: {e}");
        }
    }

    /// Makes `target` run: datapath settings, tables, announcers (the
    /// state file is written already). Any failure puts the running
    /// configuration back.
    async fn apply(&mut self, target: Target) -> Result<()> {
        self.running_digest = None;
        let new = &target.config;
        let resolved = if new.gateway == self.config.gateway {
            let ip = self.gateway.as_ref().and_then(|g| g.gateway);
            (ip, self.settings.gateway_mac)
        } else {
            resolve_gateway(new).await?
        };
        let mut settings = datapath_settings(new, resolved.1);
        settings.hash_key = hash_key_of(new)?;
        settings.kernel_hz = self.settings.kernel_hz;
        if let Err(e) = self.reconciler.apply_settings(&settings) {
            // A part may be written (the hash key, not the rest).
            self.restore();
            return Err(e.into());
        }
        let effective = target.effective();
        let old_overlay = std::mem::replace(&mut self.overlay, target.overlay.clone());
        if let Err(e) = self.program(&effective, false) {
            self.overlay = old_overlay;
            self.restore();
            return Err(e);
        }
        if new.announce != self.config.announce
            && let Err(e) = self.restart_announcers(new).await
        {
            self.overlay = old_overlay;
            self.restore();
            self.announce();
            return Err(e);
        }
        if new.gateway != self.config.gateway || new.gateway_refresh != self.config.gateway_refresh
        {
            self.regateway = Some(resolved);
        }
        self.settings = settings;
        self.config = target.config;
        self.text_digest = crate::digest::text(&target.text);
        self.text = target.text;
        // min_healthy may have changed, and new announcers know nothing yet.
        self.announce();
        Ok(())
    }

    /// Records a revision: of what runs now (`Ok`, at start-up), or of a
    /// refused change and why; returns its number. A revision that cannot
    /// be written is logged: a refusal is not made worse by it, and a
    /// start-up goes on.
    pub fn record(&mut self, source: &str, result: std::result::Result<(), String>) -> u64 {
        self.record_as(source, result, false)
    }

    /// [`record`](Self::record), saying of a refusal whether it holds
    /// across a start (`Revision::forceable`).
    fn record_as(
        &mut self,
        source: &str,
        result: std::result::Result<(), String>,
        forceable: bool,
    ) -> u64 {
        let number = match self.next_revision() {
            Ok(n) => n,
            Err(e) => {
                error!("revisions: {e}");
                return self.revision;
            }
        };
        let running = self.running();
        let mut revision = match result {
            Ok(()) => self.revision_of(number, source, Ok(&running)),
            Err(e) => self.revision_of(number, source, Err(e)),
        };
        revision.forceable = forceable;
        // The same refusal again (a broken file reloaded every half hour by
        // a script) takes the place of the last, with its time: refusals
        // must not push the revisions that ran out of the history.
        // (Only a refusal reads the last revision, which may be 16 MiB.)
        if !revision.applied()
            && let Some(last) = number
                .checked_sub(1)
                .and_then(|n| self.revisions.get(n).ok())
            && !last.applied()
            && (&last.source, &last.error, &last.file_digest)
                == (&revision.source, &revision.error, &revision.file_digest)
        {
            revision.number = last.number;
        }
        let number = revision.number;
        let applied = revision.applied();
        if let Err(e) = self.revisions.append(&revision) {
            error!("revisions: {e}");
        }
        if applied {
            self.revision = number;
            self.revision_source = source.to_string();
        }
        number
    }

    /// Revision `number`: `target` as it runs (or will), or a refusal.
    fn revision_of(
        &self,
        number: u64,
        source: &str,
        what: std::result::Result<&Target, String>,
    ) -> Revision {
        let time = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (target, error) = match what {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e)),
        };
        Revision {
            number,
            time,
            source: source.to_string(),
            digest: target.map(Target::digest),
            error,
            config: target.map(|t| t.text.to_string()),
            overlay: target.map(|t| t.overlay.clone()),
            file_digest: Some(self.file_digest.clone()),
            forceable: false,
        }
    }

    /// The VIPs announced now.
    fn announced_vips(&self) -> BTreeSet<VipId> {
        let decision = &self.announcers.decision;
        decision
            .vips
            .iter()
            .filter(|v| v.announced)
            .map(|v| v.vip)
            .collect()
    }

    /// The VIPs a probation of `target` watches: those announced now that
    /// the change touches (its VIP differs, or it is gone), all of them
    /// if it changes anything but VIPs (a tunnel source, the gateway),
    /// and those an earlier probation it joins watched. A VIP the change
    /// left alone that loses its backends during the window is not the
    /// change's doing, and does not revert it.
    fn watched(&self, target: &Target) -> BTreeSet<VipId> {
        let mut watched = self
            .confirm
            .as_ref()
            .map(|p| p.announced.clone())
            .unwrap_or_default();
        let bare = |c: &Config| Config {
            vips: Vec::new(),
            warnings: Vec::new(),
            ..c.clone()
        };
        let settings_changed = bare(&self.config) != bare(&target.config);
        let (now, next) = (self.effective(), target.effective());
        let touched = |id: &VipId| {
            settings_changed
                || now.iter().find(|v| v.id == *id) != next.iter().find(|v| v.id == *id)
        };
        watched.extend(self.announced_vips().into_iter().filter(|id| touched(id)));
        watched
    }

    /// During a probation: whether this announce decision takes a VIP's
    /// announcement away that it had when the probation began (and still
    /// exists). Then the decision is held back and the revert is due.
    pub(super) fn probation_breaks(
        &mut self,
        decision: &crate::announce::policy::Decision,
    ) -> bool {
        let Some(p) = &self.confirm else {
            return false;
        };
        // A revert that failed is tried again at its deadline, not at every
        // announce; meanwhile the routes follow the change that runs.
        if p.revert_failed.is_some()
            || self.announcers.node != NodeState::Serving
            || !self.startup.attached
        {
            return false;
        }
        let lost: Vec<String> = decision
            .vips
            .iter()
            .filter(|v| !v.announced && p.announced.contains(&v.vip))
            .map(|v| v.vip.to_string())
            .collect();
        if lost.is_empty() {
            return false;
        }
        if self.revert_due.is_none() {
            self.revert_due = Some(format!("it made {} lose its announcement", lost.join(", ")));
        }
        true
    }

    /// Called by the tick: a probation whose window ended is due.
    pub(super) fn check_deadline(&mut self) {
        if let Some(p) = &self.confirm
            && tokio::time::Instant::now() >= p.deadline
            && self.revert_due.is_none()
        {
            let reason = match &p.revert_failed {
                Some((reason, _)) => reason.clone(),
                None => "it was not confirmed in time".into(),
            };
            self.revert_due = Some(reason);
        }
    }

    /// Runs the automatic revert if one is due (after every event).
    pub async fn settle(&mut self) {
        let Some(reason) = self.revert_due.take() else {
            return;
        };
        // Left in place while the revert runs: the revert ends it, a
        // failure puts it back (and it keeps its fallback from being
        // pruned from the history meanwhile).
        let Some(p) = self.confirm.clone() else {
            return;
        };
        let source = format!(
            "automatic revert of {} to {}: {reason}",
            p.revision, p.fallback
        );
        error!(
            "reverting revision {} to {}: {reason}",
            p.revision, p.fallback
        );
        let result = match self.target_of(p.fallback) {
            Ok(target) => {
                let force = Force {
                    yes: true,
                    how: "automatic revert",
                    file: false,
                };
                self.commit(
                    target,
                    source,
                    &ChangeOptions::default(),
                    force,
                    Kind::Revert,
                )
                .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(_) => {
                self.auto_reverts += 1;
                self.confirm = None;
            }
            Err(e) => {
                // The probation stays, and says so: an unconfirmed change
                // must not become permanent because its revert failed.
                error!(
                    "the automatic revert to {} failed: {e}; revision {} stays on probation and the revert is tried again in {} s (`lbctl confirm` keeps it)",
                    p.fallback,
                    p.revision,
                    REVERT_RETRY.as_secs()
                );
                self.confirm = Some(Pending {
                    deadline: tokio::time::Instant::now() + REVERT_RETRY,
                    revert_failed: Some((reason, e.to_string())),
                    ..p
                });
            }
        }
        self.save_probation();
    }

    /// The configuration of revision `number`, ready to run again.
    pub fn target_of(&self, number: u64) -> Result<Target> {
        let revision = self.revisions.get(number).map_err(super::revision_error)?;
        let (Some(text), Some(overlay)) = (revision.config, revision.overlay) else {
            return Err(refused(
                ErrorKind::Conflict,
                format!(
                    "revision {number} was refused ({}); it cannot run",
                    revision.error.unwrap_or_default()
                ),
            ));
        };
        let config = Config::parse(&text).map_err(|e| {
            refused(
                ErrorKind::Conflict,
                format!(
                    "revision {number} no longer parses (was it made by another release?): {e}"
                ),
            )
        })?;
        Ok(Target {
            config,
            text: text.into(),
            overlay,
        })
    }

    /// At start-up, after the first [`Daemon::program`]: the running
    /// configuration becomes a revision, unless it is the newest one
    /// already (a restart with nothing changed).
    pub fn start_revision(&mut self) {
        let digest = self.running().digest();
        let latest = self.revisions.latest_applied(None).ok().flatten();
        match latest {
            Some(r)
                if r.digest.as_deref() == Some(digest.as_str())
                    && r.config.as_deref() == Some(&*self.text) =>
            {
                self.revision = r.number;
                self.revision_source = r.source;
            }
            _ => {
                self.record("start", Ok(()));
            }
        }
    }

    /// `lbctl confirm`: the change on probation stays.
    /// A change is on probation (`--confirm-within`), awaiting `lbctl
    /// confirm`.
    pub fn on_probation(&self) -> bool {
        self.confirm.is_some()
    }

    pub fn confirm(&mut self) -> Result<Committed> {
        let Some(p) = self.confirm.take() else {
            return Err(refused(
                ErrorKind::Conflict,
                "no change awaits confirmation",
            ));
        };
        self.revert_due = None;
        self.save_probation();
        info!(revision = p.revision, "change confirmed");
        Ok(Committed {
            revision: Some(p.revision),
            note: Some(format!("revision {} confirmed", p.revision)),
            ..Committed::default()
        })
    }
}

/// The file's own warnings (`vips[0]: …`) that `effective` (the rules
/// over the VIPs as they will run, `VIP …: …`) does not already give: the
/// same advice after its position is said once, by VIP. What differs
/// (an API change made the running VIP differ from the file's) stays.
fn file_only_warnings(file: &[String], effective: &[String]) -> Vec<String> {
    let advice = |w: &str| {
        w.split_once(": ")
            .map_or(w.to_owned(), |(_, a)| a.to_owned())
    };
    let said: BTreeSet<String> = effective.iter().map(|w| advice(w)).collect();
    file.iter()
        .filter(|w| !said.contains(&advice(w)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A probation with `left` to run, saved: when the clock read
    /// before, its deadline, when the clock read after.
    fn saved_with(left: Duration) -> (u64, u64, u64) {
        let before = unix_now();
        let p = Pending {
            revision: 2,
            fallback: 1,
            deadline: tokio::time::Instant::now() + left,
            announced: BTreeSet::new(),
            revert_failed: None,
        };
        let saved = saved_probation(&p);
        (before, saved.deadline, unix_now())
    }

    /// A probation saved with 1.5 s left is due 2 s on, not 1: rounded
    /// up, so a restart never cuts the operator's window short.
    #[test]
    fn a_saved_probations_deadline_is_rounded_up() {
        let (before, due, after) = saved_with(Duration::from_millis(1_500));
        assert!(
            (before + 2..=after + 2).contains(&due),
            "due at {due}, saved between {before} and {after}"
        );
    }

    /// Whole seconds left stay whole (paused time: exactly 8 s).
    #[tokio::test(start_paused = true)]
    async fn a_saved_probations_whole_seconds_are_not_rounded() {
        let (before, due, after) = saved_with(Duration::from_secs(8));
        assert!(
            (before + 8..=after + 8).contains(&due),
            "due at {due}, saved between {before} and {after}"
        );
    }
}

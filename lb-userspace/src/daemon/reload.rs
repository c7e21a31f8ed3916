//! Reloads of the configuration file, and the guard every change passes:
//! a change that would leave a serving VIP with no usable backend is
//! refused unless forced. The file is read and parsed by the caller (off
//! the daemon's loop); this applies it, or keeps the running one.

use std::{
    collections::BTreeSet,
    time::{Instant, SystemTime},
};

use tracing::{error, info};

use super::{
    BackendKey, Daemon, Result,
    commit::{Force, Kind, Target},
    refused,
    views::humantime,
};
use crate::api::ErrorKind;
use crate::{
    api::{ChangeOptions, Committed},
    config::{Config, ConfigErrors, VipConfig, VipId},
    dataplane::Dataplane,
    digest, lifecycle,
};

/// A configuration file as read: its text, the text's digest, and the
/// configuration it parses to; with `source.etcd`, composed with the
/// tier's desired state (or a rollout's candidate) `desired`
/// ([`crate::tier::compose`]).
#[derive(Clone, Debug)]
pub struct FileRead {
    pub text: std::sync::Arc<str>,
    pub digest: String,
    pub config: Config,
    pub desired: Option<crate::tier::Desired>,
}

impl FileRead {
    /// With `source.etcd`: this file composed with the tier's desired
    /// state ([`crate::tier::compose`]); the file as it is otherwise.
    pub fn with_desired(
        &self,
        desired: &crate::tier::Desired,
    ) -> std::result::Result<Self, ConfigErrors> {
        if self.config.source.is_none() {
            return Ok(self.clone());
        }
        let (text, config) = crate::tier::compose(&self.text, &self.config, desired)?;
        Ok(Self {
            digest: digest::text(&text),
            text: text.into(),
            config,
            desired: Some(desired.clone()),
        })
    }

    /// Reads (bounded; a regular file only) and parses `path`; errors name
    /// the file.
    pub fn load(path: &std::path::Path) -> std::result::Result<Self, ConfigErrors> {
        let text = Config::read_file_text(path)?;
        let config = Config::parse(&text).map_err(|e| e.named(path))?;
        Ok(Self {
            digest: digest::text(&text),
            text: text.into(),
            config,
            desired: None,
        })
    }
}

impl<D: Dataplane> Daemon<D> {
    /// A reload of the configuration file, read and parsed off the loop
    /// (`lbctl reload`, SIGHUP, and with `dry_run` `lbctl diff`). A file
    /// unchanged since it was last read does not undo a revert. The
    /// outcome is kept for `lbctl status`.
    pub async fn reload(
        &mut self,
        file: std::result::Result<FileRead, ConfigErrors>,
        force: bool,
        options: &ChangeOptions,
    ) -> Result<Committed> {
        let result = self.try_reload(file, force, options).await;
        if !options.dry_run {
            self.metrics.reload(result.is_ok());
            let when = humantime(SystemTime::now());
            self.last_reload = Some(match &result {
                Ok(_) => format!("ok at {when}"),
                Err(e) => format!("failed at {when}: {e}"),
            });
        }
        result
    }

    async fn try_reload(
        &mut self,
        file: std::result::Result<FileRead, ConfigErrors>,
        force: bool,
        options: &ChangeOptions,
    ) -> Result<Committed> {
        let read = match file {
            Ok(read) => read,
            Err(e) => {
                if !options.dry_run {
                    self.record("reload", Err(e.to_string()));
                }
                return Err(e.into());
            }
        };
        let reverted = self.runs_other_than_file();
        // `--force` applies an unchanged file only over its own forceable
        // refusal (a start kept what ran); over a revert it keeps it, as
        // scripts that always force expect.
        // (Asked last: it reads revisions.)
        let forcing_refused = || force && self.revisions.kept_over_refused(&read.digest).is_some();
        if !options.dry_run && reverted && read.digest == self.file_digest && !forcing_refused() {
            return Ok(Committed {
                revision: Some(self.revision),
                note: Some(format!(
                    "{} is unchanged since it was last read: revision {} ({}) keeps running; a changed file applies, `lbctl revert N` runs another revision",
                    self.config_path.display(),
                    self.revision,
                    self.revision_source
                )),
                ..Committed::default()
            });
        }
        // The revision records the file it was made from; a failed reload
        // leaves the file as not read (the next reload tries it again).
        let seen = if options.dry_run {
            self.file_digest.clone()
        } else {
            std::mem::replace(&mut self.file_digest, read.digest)
        };
        // Which change wins: runtime changes whose object the file changed
        // since are dropped (the preview and the answer say which).
        let mut overlay = self.overlay.clone();
        overlay.rebase(&read.config.vips);
        let source = match (&read.config.source, &read.desired) {
            (Some(etcd), Some(desired)) => crate::tier::origin(etcd, desired),
            _ => "reload".to_string(),
        };
        let target = Target {
            config: read.config,
            text: read.text,
            overlay,
        };
        let force = Force {
            yes: force,
            how: "lbctl reload --force",
            // The file itself changed (not only a key file it names): its
            // forceable refusal holds across a start.
            file: self.file_digest != seen,
        };
        let result = self
            .commit(target, source, options, force, Kind::Change)
            .await;
        if result.is_err() {
            self.file_digest = seen;
        }
        result
    }

    /// Puts the running configuration back into the maps after a failed
    /// reload.
    pub(super) fn restore(&mut self) {
        let _ = self.reconciler.apply_settings(&self.settings);
        let old = self.effective();
        if self.program(&old, false).is_err() {
            self.announce();
        }
    }

    /// The announce section changed: the announcers restart (a short
    /// withdrawal). If the new ones cannot start, the old ones start again
    /// (the caller puts the rest of the running configuration back).
    pub(super) async fn restart_announcers(&mut self, new: &Config) -> Result<()> {
        info!("the announce section changed: restarting the announcers");
        self.stop_announcers().await;
        let previous = std::mem::replace(&mut self.config.announce, new.announce.clone());
        if let Err(e) = self.start_announcers() {
            self.config.announce = previous;
            if let Err(again) = self.start_announcers() {
                error!("restarting the previous announcers failed: {again}");
            }
            return Err(refused(
                ErrorKind::Internal,
                format!("starting the new announcers: {e}"),
            ));
        }
        Ok(())
    }

    /// The VIPs with a table now whose new flows `effective` (with the
    /// hash key `key`) sends elsewhere wholesale, in words: a changed
    /// table size moves every flow to another slot, a changed set of hash
    /// fields or key gives every flow another hash. A change that does
    /// this must be forced.
    pub fn remaps(&self, effective: &[VipConfig], key: Option<[u64; 2]>) -> Vec<String> {
        const KEPT: &str = "established connections keep their backend through this balancer's connection table; flows that move between balancers that disagree do not";
        let layout = &self.config.layout;
        let running = self.effective();
        let mut out: Vec<String> = effective
            .iter()
            .filter_map(|v| {
                let state = self.reconciler.vips().get(&v.id)?;
                if !state.has_table() {
                    return None;
                }
                let m = v.maglev_size(layout);
                let was = running.iter().find(|r| r.id == v.id).map(|r| r.hash);
                if m != state.table_size {
                    Some(format!(
                        "VIP {}: table_size {} -> {m} remaps every flow of the VIP ({KEPT})",
                        v.id, state.table_size
                    ))
                } else {
                    was.filter(|h| *h != v.hash).map(|h| {
                        format!(
                            "VIP {}: hash {h} -> {} sends new flows to other backends ({KEPT})",
                            v.id, v.hash
                        )
                    })
                }
            })
            .collect();
        if key != self.settings.hash_key && self.reconciler.vips().values().any(|s| s.has_table()) {
            let what = match (self.settings.hash_key.is_some(), key.is_some()) {
                (false, true) => "a hash key (hash_key_file) added",
                (true, false) => "the hash key removed",
                _ => "the hash key changed",
            };
            out.push(format!(
                "{what}: every VIP's new flows go to other backends ({KEPT})"
            ));
        }
        out
    }

    /// The VIPs serving now (announced, with a usable backend) that
    /// `effective` no longer has, and how many serve now.
    pub(super) fn serving_removed(&self, effective: &[VipConfig]) -> (Vec<VipId>, usize) {
        let serving: Vec<VipId> = self
            .announcers
            .decision
            .vips
            .iter()
            .filter(|v| v.announced && v.usable > 0)
            .map(|v| v.vip)
            .collect();
        let gone = serving
            .iter()
            .filter(|id| !effective.iter().any(|c| c.id == **id))
            .copied()
            .collect();
        (gone, serving.len())
    }

    /// Checks that `effective` (with `drained`) leaves every VIP that is
    /// serving now (announced, with a usable backend) with a usable backend
    /// in its table. A VIP left without one would drop all its traffic
    /// while the routers still send it here: refused, unless `force`, in
    /// which case the problems come back (the caller logs them when it
    /// applies). `how` says how to force it. A change that removes every
    /// VIP serving now, leaving none that would serve, is refused alike (a
    /// truncated file, `vips: []`); `lbctl vip del` forces its own. Backends awaiting their first
    /// probe do not count, as they do not for the announce policy: left
    /// with only those, the VIP is withdrawn until one passes, for good if
    /// none ever does, and the connections of the backends it lost are
    /// cut. Add the new ones first, remove the old once they are up.
    pub fn refuse_blackhole(
        &self,
        effective: &[VipConfig],
        drained: &BTreeSet<BackendKey>,
        force: bool,
        how: &str,
    ) -> Result<Vec<String>> {
        let now = Instant::now();
        let mut prospect = self.lifecycle.clone();
        prospect.sync(effective, drained, now, false);
        prospect.plan(effective, now);
        let mut problems: Vec<String> = self
            .announcers
            .decision
            .vips
            .iter()
            .filter(|v| v.announced && v.usable > 0)
            .filter_map(|v| {
                let vip = effective.iter().find(|c| c.id == v.vip)?;
                let life = prospect.vips.get(&vip.id);
                match lifecycle::usable_backends(vip, life) {
                    (0, 0) => Some(format!(
                        "VIP {} is announced and would have no usable backend ({})",
                        vip.id,
                        lifecycle::why_unusable(vip, life)
                    )),
                    (0, awaiting) => Some(format!(
                        "VIP {} is announced and would keep only {awaiting} backend(s) awaiting their first probe: it would be withdrawn until one passes (add new backends first, remove the old ones once they are up)",
                        vip.id
                    )),
                    _ => None,
                }
            })
            .collect();
        let (gone, serving) = self.serving_removed(effective);
        let none_would_serve = effective
            .iter()
            .all(|vip| lifecycle::usable_backends(vip, prospect.vips.get(&vip.id)).0 == 0);
        if !gone.is_empty() && gone.len() == serving && none_would_serve {
            problems.push(format!(
                "it removes every VIP this balancer serves ({}) and none would serve after it: each would be withdrawn and its connections cut (a truncated or wrong file?)",
                gone.iter().map(VipId::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
        if problems.is_empty() {
            return Ok(Vec::new());
        }
        if !force {
            return Err(refused(
                ErrorKind::Blackhole,
                format!(
                    "refused, it would blackhole traffic: {}; fix it, or force it with `{how}`",
                    problems.join("; ")
                ),
            ));
        }
        Ok(problems)
    }
}

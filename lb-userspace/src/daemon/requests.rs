//! The dispatch of API requests: one arm per [`Request`], read-only ones
//! answered from [`super::views`], changes turned into a [`Target`] and
//! handed to [`Daemon::commit`]. Reloads and diffs need the file read
//! first (off the loop): `lbd` reads it and calls [`Daemon::reload`].

use super::{
    Daemon, Result,
    commit::{Force, Kind, Target},
    refused, revision_error, views,
};
use crate::api::ErrorKind;
use crate::{
    api::{
        BackendRequest, ChangeOptions, Committed, NodeRequest, OverridesRequest, Request, Response,
        RevisionRow, TierRequest, VipRequest,
    },
    config::VipConfig,
    dataplane::Dataplane,
    state::{Overlay, Stamp},
};

impl<D: Dataplane> Daemon<D> {
    /// Answers one request; `options` apply to changes only.
    pub async fn handle(&mut self, request: Request, options: ChangeOptions) -> Response {
        let result = if options.is_default() || is_change(&request) {
            self.dispatch(request, &options).await
        } else {
            Err(refused(
                ErrorKind::BadRequest,
                "--dry-run and --confirm-within apply to changes (vip add|del, backend ..., reload, revert)",
            ))
        };
        match result {
            Ok(data) => Response::ok(data),
            Err(e) => e.response(),
        }
    }

    /// Reloads and diffs are read from the file off the daemon's loop
    /// (`lbd`'s socket does); a reload while `lbd` stops is too late.
    fn not_here(&self, request: &Request) -> super::DaemonError {
        if matches!(request, Request::Reload { .. }) && self.stopping() {
            return refused(
                ErrorKind::Unavailable,
                "lbd is shutting down: the next lbd reads the file",
            );
        }
        refused(
            ErrorKind::BadRequest,
            "a reload is read from the file off the daemon's loop: send it through lbd's socket",
        )
    }

    async fn dispatch(
        &mut self,
        request: Request,
        options: &ChangeOptions,
    ) -> Result<serde_json::Value> {
        match request {
            Request::Vip(VipRequest::List) => json(self.vip_list()),
            Request::Vip(r) => self.handle_vip(r, options).await.and_then(json),
            Request::Backend(r) => self.handle_backend(r, options).await.and_then(json),
            Request::Node(r) => self.handle_node(r).and_then(json),
            Request::Reload { .. } | Request::Diff { .. } => Err(self.not_here(&request)),
            Request::Revert { revision, force } => {
                self.revert(revision, force, options).await.and_then(json)
            }
            Request::Confirm => self.confirm().and_then(json),
            Request::TraceLease(r) => self.trace(r).and_then(json),
            Request::History { last } => self.history(last),
            Request::Status => json(self.status()),
            Request::Health => json(self.health()),
            Request::Stats => json(self.stats()),
            Request::Table { vip, slots } => self.table(&vip, slots).and_then(json),
            Request::Simulate {
                src,
                dst,
                protocol,
                sport,
                dport,
                syn,
                quic_cid,
            } => self
                .simulate(
                    src,
                    dst,
                    protocol.number(),
                    (sport, dport),
                    views::Shape {
                        syn,
                        quic_cid: quic_cid.as_deref(),
                    },
                )
                .and_then(json),
            Request::Conns {
                vip,
                backend,
                client,
                limit,
            } => self
                .conns(vip, backend, client.as_deref(), limit)
                .and_then(json),
            Request::Bgp => json(self.announce_status()),
            Request::Tier(TierRequest::Status) => self.tier_status().and_then(json),
            Request::Tier(TierRequest::Rollout { .. }) => Err(refused(
                ErrorKind::BadRequest,
                "a rollout is written to etcd by lbd's loop: send it through lbd's socket",
            )),
            Request::Overrides(OverridesRequest::List) => json(self.override_rows()),
            Request::Overrides(OverridesRequest::Clear {
                vip,
                backend,
                force,
            }) => {
                let source = format!("api: {}", describe(&request_of_clear(vip, backend)));
                let result = self
                    .change(source, forced(force), options, |o, base| {
                        if o.clear(base, vip.as_ref(), backend) == 0 {
                            return Err(refused(
                                ErrorKind::NotFound,
                                nothing_to_clear(o, vip, backend),
                            ));
                        }
                        Ok(())
                    })
                    .await;
                result.and_then(json)
            }
        }
    }

    /// Applies an edit of the API's changes as a revision (see
    /// [`Daemon::commit`]). A failed edit changes nothing.
    pub async fn change(
        &mut self,
        source: String,
        force: Force,
        options: &ChangeOptions,
        edit: impl FnOnce(&mut Overlay, &[VipConfig]) -> Result<()>,
    ) -> Result<Committed> {
        let mut target = self.running();
        let before = target.overlay.clone();
        edit(&mut target.overlay, &self.config.vips)?;
        let stamp = Stamp {
            revision: self.next_revision().unwrap_or(self.revision + 1),
            time: super::commit::unix_now(),
            source: source.clone(),
        };
        target.overlay.stamp(&before, &self.config.vips, &stamp);
        self.commit(target, source, options, force, Kind::Change)
            .await
    }

    async fn handle_vip(&mut self, r: VipRequest, options: &ChangeOptions) -> Result<Committed> {
        let source = format!("api: {}", describe(&Request::Vip(r.clone())));
        match r {
            VipRequest::List => Err(refused(ErrorKind::BadRequest, "not a change")),
            VipRequest::Add(add) => {
                let vip =
                    views::vip_config(&add).map_err(|e| refused(ErrorKind::InvalidConfig, e))?;
                let force = forced(false);
                let unchecked = vip.health_check.is_none() && !vip.backends.is_empty();
                let mut done = self
                    .change(source, force, options, |o, base| Ok(o.add_vip(base, vip)?))
                    .await?;
                if unchecked {
                    done.warnings.push(format!(
                        "VIP {}: no health check, so its backends count as up whether they answer or not (and it is announced): --health-check, --health-check-port ... probe them",
                        add.vip
                    ));
                }
                Ok(done)
            }
            VipRequest::Del { vip } => {
                // Deleting a VIP withdraws it on purpose.
                let force = forced(true);
                self.change(source, force, options, |o, base| {
                    Ok(o.delete_vip(base, &vip)?)
                })
                .await
            }
        }
    }

    async fn handle_backend(
        &mut self,
        r: BackendRequest,
        options: &ChangeOptions,
    ) -> Result<Committed> {
        let source = format!("api: {}", describe(&Request::Backend(r.clone())));
        match r {
            BackendRequest::Add {
                vip,
                address,
                weight,
            } => {
                self.change(source, forced(false), options, |o, base| {
                    Ok(o.add_backend(base, &vip, address, weight)?)
                })
                .await
            }
            BackendRequest::Del {
                vip,
                address,
                force,
            } => {
                self.change(source, forced(force), options, |o, base| {
                    Ok(o.delete_backend(base, &vip, address)?)
                })
                .await
            }
            BackendRequest::Weight {
                vip,
                address,
                weight,
                force,
            } => {
                self.change(source, forced(force), options, |o, base| {
                    Ok(o.set_weight(base, &vip, address, weight)?)
                })
                .await
            }
            BackendRequest::Drain {
                vip,
                address,
                force,
                ..
            } => {
                let mut done = self
                    .change(source, forced(force), options, |o, base| {
                        Ok(o.set_drained(base, &vip, address, true)?)
                    })
                    .await?;
                let untracked = self.effective().iter().any(|v| v.id == vip && !v.conntrack);
                if untracked {
                    done.warnings.push(format!(
                        "VIP {vip} has no connection table (conntrack: false): its flows are neither kept nor seen, so those on {address} moved to other backends at once, and `drained` only means it takes no new ones"
                    ));
                }
                Ok(done)
            }
            BackendRequest::Undrain { vip, address } => {
                self.change(source, forced(false), options, |o, base| {
                    Ok(o.set_drained(base, &vip, address, false)?)
                })
                .await
            }
        }
    }

    fn handle_node(&mut self, r: NodeRequest) -> Result<crate::api::NodeChange> {
        self.set_drained(matches!(r, NodeRequest::Drain { .. }))
    }

    /// `lbctl revert [N]`: revision `N` (default: the last applied one
    /// before the running one) runs again, as a new revision.
    pub async fn revert(
        &mut self,
        revision: Option<u64>,
        force: bool,
        options: &ChangeOptions,
    ) -> Result<Committed> {
        let number = match revision {
            Some(n) => n,
            None => self
                .revisions
                .latest_applied(Some(self.revision))
                .map_err(revision_error)?
                .map(|r| r.number)
                .ok_or_else(|| refused(ErrorKind::NotFound, "no earlier revision to revert to"))?,
        };
        let target: Target = self.target_of(number)?;
        let force = Force {
            yes: force,
            how: "lbctl revert --force",
            file: false,
        };
        self.commit(
            target,
            format!("revert to {number}"),
            options,
            force,
            Kind::Revert,
        )
        .await
    }

    /// `lbctl history`, here (`lbd` runs [`Self::history_job`] instead).
    fn history(&self, last: usize) -> Result<serde_json::Value> {
        history_rows(&self.revisions, last, self.revision).and_then(json)
    }

    /// `lbctl history` as a job to run off the loop: every revision file
    /// is read and parsed (up to a configuration's 16 MiB each), which for
    /// a long history takes seconds the loop (probes, the watchdog) does
    /// not have.
    pub fn history_job(&self, last: usize) -> impl FnOnce() -> Response + Send + 'static {
        let (store, running) = (self.revisions.clone(), self.revision);
        move || match history_rows(&store, last, running).and_then(json) {
            Ok(data) => Response::ok(data),
            Err(e) => e.response(),
        }
    }
}

/// `lbctl history`: the newest `last` revisions of `store`, `running`
/// marked.
fn history_rows(
    store: &crate::revisions::RevisionStore,
    last: usize,
    running: u64,
) -> Result<Vec<RevisionRow>> {
    let listed = store.list(last.clamp(1, 10_000)).map_err(revision_error)?;
    // Each revision (its whole configuration with it) is dropped once its
    // row is made.
    Ok(listed
        .map(|r| match r {
            Ok(r) => RevisionRow {
                revision: r.number,
                time: views::humantime(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.time),
                ),
                result: r.error.map_or("ok".into(), |e| format!("failed: {e}")),
                running: r.number == running,
                source: r.source,
                digest: r.digest,
            },
            Err(e) => RevisionRow {
                revision: e.number().unwrap_or(0),
                time: String::new(),
                source: String::new(),
                digest: None,
                result: format!("unreadable: {e}"),
                running: false,
            },
        })
        .collect())
}

/// The clear request, for its description.
fn request_of_clear(
    vip: Option<crate::config::VipId>,
    backend: Option<std::net::IpAddr>,
) -> Request {
    Request::Overrides(OverridesRequest::Clear {
        vip,
        backend,
        force: false,
    })
}

/// Why `lbctl overrides clear` found nothing to clear.
fn nothing_to_clear(
    o: &Overlay,
    vip: Option<crate::config::VipId>,
    backend: Option<std::net::IpAddr>,
) -> String {
    match (vip, backend) {
        (Some(v), Some(_)) if o.vips_added.contains_key(&v) => format!(
            "VIP {v} was added by the API: its backends are part of it; `lbctl overrides clear {v}` drops the VIP's runtime definition"
        ),
        (Some(v), Some(b)) => format!("no runtime change of VIP {v} backend {b} is in force"),
        (Some(v), None) => format!("no runtime change of VIP {v} is in force"),
        (None, _) => "no runtime change is in force: the file decides everything".into(),
    }
}

fn forced(yes: bool) -> Force {
    Force {
        yes,
        how: "--force",
        file: false,
    }
}

/// Requests that change the configuration (and so take options).
fn is_change(r: &Request) -> bool {
    matches!(
        r,
        Request::Vip(VipRequest::Add(_) | VipRequest::Del { .. })
            | Request::Backend(_)
            | Request::Reload { .. }
            | Request::Revert { .. }
            | Request::Overrides(OverridesRequest::Clear { .. })
    )
}

/// A change in a few words, for revisions: `backend del 10.0.0.1:80/tcp 10.1.0.2`.
pub fn describe(r: &Request) -> String {
    match r {
        Request::Vip(VipRequest::Add(a)) => format!("vip add {}", a.vip),
        Request::Vip(VipRequest::Del { vip }) => format!("vip del {vip}"),
        Request::Backend(b) => match b {
            BackendRequest::Add {
                vip,
                address,
                weight,
            } => format!("backend add {vip} {address} weight {weight}"),
            BackendRequest::Del { vip, address, .. } => format!("backend del {vip} {address}"),
            BackendRequest::Weight {
                vip,
                address,
                weight,
                ..
            } => format!("backend weight {vip} {address} {weight}"),
            BackendRequest::Drain { vip, address, .. } => format!("backend drain {vip} {address}"),
            BackendRequest::Undrain { vip, address } => {
                format!("backend undrain {vip} {address}")
            }
        },
        Request::Overrides(OverridesRequest::Clear { vip, backend, .. }) => {
            let mut s = "overrides clear".to_string();
            for part in [vip.map(|v| v.to_string()), backend.map(|b| b.to_string())]
                .into_iter()
                .flatten()
            {
                s.push(' ');
                s.push_str(&part);
            }
            s
        }
        other => format!("{other:?}"),
    }
}

/// An answer's data as JSON; one that cannot be written is refused, not
/// sent as `null`.
fn json(value: impl serde::Serialize) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| {
        refused(
            ErrorKind::Internal,
            format!("lbd could not write its answer as JSON: {e}"),
        )
    })
}

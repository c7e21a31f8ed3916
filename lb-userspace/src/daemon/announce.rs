//! The daemon's side of route announcement: the running announcers, the
//! node's state (serving, drained, stopping), the announce policy's last
//! answer and when everything was last withdrawn (the grace the routers
//! get). How announcers are started is given ([`StartAnnouncers`]): `lbd`
//! starts the configured ones, tests give recording fakes.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{error, info, warn};

use super::{Daemon, Result, refused};
use crate::api::ErrorKind;
use crate::{
    announce::{
        self, AnnounceError, Announcer, SessionState, StartContext,
        policy::{self, Decision, NodeState},
    },
    api::{self, AnnounceStatus, NodeChange},
    bfd::{BfdTable, KernelBfdTable},
    config::{VipConfig, announce::AnnounceConfig},
    dataplane::Dataplane,
};

/// Starts the announcers a configuration asks for.
pub type StartAnnouncers =
    Box<dyn Fn(&AnnounceConfig) -> Result<Vec<Box<dyn Announcer>>, AnnounceError> + Send>;

/// The announcers and the node's state.
pub struct Announcers {
    running: Vec<Box<dyn Announcer>>,
    start: StartAnnouncers,
    pub node: NodeState,
    pub node_since: Instant,
    /// The announce policy's last answer.
    pub decision: Decision,
    /// When the announced set last lost its last address: the routers
    /// have had since then to move traffic away.
    withdrawn_at: Option<Instant>,
    /// The last error an announcer returned, logged once.
    error: Option<String>,
    /// A graceful shutdown (RFC 8326) is re-announcing `graceful_set`
    /// with the GRACEFUL_SHUTDOWN community until then; the withdrawal
    /// follows.
    graceful_until: Option<Instant>,
    graceful_set: BTreeSet<IpAddr>,
}

impl Announcers {
    pub fn new(start: StartAnnouncers) -> Self {
        Self {
            running: Vec::new(),
            start,
            node: NodeState::Serving,
            node_since: Instant::now(),
            decision: Decision::default(),
            withdrawn_at: None,
            error: None,
            graceful_until: None,
            graceful_set: BTreeSet::new(),
        }
    }

    /// The announcers the configuration names ([`announce::start`]).
    pub fn real() -> Self {
        Self::new(Box::new(announce::start))
    }

    /// The announcers the configuration names, with the instance's BFD
    /// maps (pinned under `pin_dir`) and, for the first start, whether
    /// `lbd` restarted over a datapath that kept forwarding (`adopted`).
    pub fn real_with(pin_dir: PathBuf, adopted: bool) -> Self {
        let first = AtomicBool::new(true);
        Self::new(Box::new(move |config: &AnnounceConfig| {
            let first = first.swap(false, Ordering::Relaxed);
            let wants_bfd = config
                .bgp
                .as_ref()
                .is_some_and(|b| b.peers.iter().any(|p| p.bfd.is_some()));
            let bfd = if wants_bfd {
                let table = KernelBfdTable::open_pinned(&pin_dir)
                    .map_err(|e| AnnounceError::Bfd(e.into()))?;
                Some(Arc::new(table) as Arc<dyn BfdTable>)
            } else {
                forget_bfd_sessions(&pin_dir);
                None
            };
            let (restarted, fresh) = start_kind(first, adopted);
            let ctx = StartContext {
                bfd,
                restarted,
                fresh,
            };
            announce::start_with(config, &ctx)
        }))
    }

    /// The longest graceful-shutdown wait of the running announcers.
    fn graceful_wait(&self) -> Option<Duration> {
        self.running
            .iter()
            .filter_map(|a| a.graceful_shutdown_wait())
            .max()
            .filter(|w| !w.is_zero())
    }

    fn set_graceful(&mut self, on: bool) {
        for a in &mut self.running {
            a.set_graceful_shutdown(on);
        }
    }

    /// Every announcer's rows (peers, pipes, commands).
    pub fn peer_rows(&self) -> Vec<crate::announce::PeerStatus> {
        self.running.iter().flat_map(|a| a.status()).collect()
    }
}

/// No peer asks for BFD: the sessions an earlier configuration (or
/// `lbd`) left in the pinned maps are removed, or the datapath would go
/// on answering them, with nobody watching.
fn forget_bfd_sessions(pin_dir: &std::path::Path) {
    let Ok(table) = KernelBfdTable::open_pinned(pin_dir) else {
        return;
    };
    match crate::bfd::remove_all(&table) {
        Ok(0) => {}
        Ok(n) => info!(
            sessions = n,
            "no BGP peer asks for BFD: its sessions are removed and the datapath stops answering them"
        ),
        Err(e) => warn!(error = %e, "cannot remove the BFD sessions no peer asks for"),
    }
}

/// The announcer kinds an `announce:` section configures.
fn kinds(a: &AnnounceConfig) -> Vec<String> {
    [
        (a.bgp.is_some(), "bgp"),
        (a.exabgp.is_some(), "exabgp"),
        (a.exec.is_some(), "exec"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, k)| k.to_string())
    .collect()
}

impl<D: Dataplane> Daemon<D> {
    /// Some announcer is configured (or runs): what a router has from
    /// this box can be known.
    pub(super) fn has_announcers(&self) -> bool {
        !kinds(&self.config.announce).is_empty() || !self.announcers.running.is_empty()
    }

    /// Applies the announce policy to the running configuration.
    pub fn announce(&mut self) {
        let effective = self.effective();
        self.announce_for(&effective);
    }

    /// Applies the announce policy to `effective` and hands the answer to
    /// every announcer (they ignore a set they already have).
    pub fn announce_for(&mut self, effective: &[VipConfig]) {
        let counts = self.lifecycle.counts(effective);
        // Routes held back after a restart (until the first verdicts) go
        // out at once when the node stops serving: a drain or a stop must
        // reach the routers, which still hold the last `lbd`'s routes.
        let settled = counts.iter().all(|c| c.awaiting == 0)
            || self.announcers.node != NodeState::Serving
            || self.announcers.graceful_until.is_some();
        let mut decision = policy::decide(&counts, self.startup.attached, self.announcers.node);
        if self.announcers.graceful_until.is_some() {
            // A graceful shutdown keeps what was announced, with the
            // community, until its wait is over.
            decision.addresses = self.announcers.graceful_set.clone();
        }
        // A change on probation that costs a VIP its announcement is
        // reverted before any router hears of it.
        if self.probation_breaks(&decision) {
            return;
        }
        let a = &mut self.announcers;
        if !a.running.is_empty() {
            log_changes(&a.decision, &decision, a.node);
        }
        if !a.decision.addresses.is_empty() && decision.addresses.is_empty() {
            a.withdrawn_at = Some(Instant::now());
        }
        let mut failed = None;
        for announcer in &mut a.running {
            announcer.set_settled(settled);
            if let Err(e) = announcer.set_announced(&decision.addresses) {
                failed = Some(e.to_string());
            }
        }
        if failed != a.error {
            if let Some(e) = &failed {
                error!(error = %e, "an announcer refused the VIP set; retrying every second");
            }
            a.error = failed;
        }
        a.decision = decision;
    }

    /// Starts the configured announcers (none without `announce:`).
    pub fn start_announcers(&mut self) -> Result<()> {
        self.announcers.running = (self.announcers.start)(&self.config.announce)?;
        // Announcers started during a graceful shutdown's wait (a reload
        // that changed `announce:`) carry its community too.
        if self.announcers.graceful_until.is_some() {
            self.announcers.set_graceful(true);
        }
        if !self.announcers.running.is_empty() {
            info!(
                announcers = %kinds(&self.config.announce).join(","),
                "route announcers started"
            );
        }
        Ok(())
    }

    /// Shuts every announcer down: withdrawals, then (BGP) Cease. Bounded
    /// by each announcer's own shutdown limit.
    pub async fn stop_announcers(&mut self) {
        let mut running = std::mem::take(&mut self.announcers.running);
        let results = futures::future::join_all(running.iter_mut().map(|a| a.shutdown())).await;
        for e in results.into_iter().filter_map(Result::err) {
            warn!(error = %e, "an announcer did not shut down cleanly");
        }
    }

    /// How long the routers still need, out of `shutdown_grace`, since the
    /// last announced address was withdrawn (0 without announcers).
    pub fn grace_left(&self) -> Duration {
        match (
            self.announcers.running.is_empty(),
            self.announcers.withdrawn_at,
        ) {
            (false, Some(at)) => self.config.shutdown_grace.saturating_sub(at.elapsed()),
            _ => Duration::ZERO,
        }
    }

    /// Starts a graceful shutdown if an announcer does one and something
    /// is announced: the routes stay, with the GRACEFUL_SHUTDOWN
    /// community, for its wait. Returns the wait.
    fn begin_graceful(&mut self) -> Option<Duration> {
        let a = &mut self.announcers;
        let wait = a.graceful_wait()?;
        if a.node != NodeState::Serving || a.decision.addresses.is_empty() {
            return None;
        }
        a.graceful_set = a.decision.addresses.clone();
        a.graceful_until = Some(Instant::now() + wait);
        a.set_graceful(true);
        info!(
            addresses = ?a.graceful_set,
            wait_ms = wait.as_millis() as u64,
            "graceful shutdown: routes announced again with GRACEFUL_SHUTDOWN, withdrawn after the wait"
        );
        Some(wait)
    }

    /// When the graceful shutdown's wait ends (the serve loop's timer).
    pub fn graceful_deadline(&self) -> Option<Instant> {
        self.announcers.graceful_until
    }

    /// The graceful shutdown's wait is over: withdraw now.
    pub fn end_graceful_shutdown(&mut self) {
        if self.announcers.graceful_until.take().is_some() {
            self.announce();
        }
    }

    /// A stop signal came: only the grace period is left.
    pub fn stopping(&self) -> bool {
        self.announcers.node == NodeState::Stopping
    }

    /// `lbctl node drain` / `undrain`.
    pub fn set_drained(&mut self, drained: bool) -> Result<NodeChange> {
        if self.announcers.node == NodeState::Stopping {
            return Err(refused(ErrorKind::Unavailable, "lbd is shutting down"));
        }
        let want = if drained {
            NodeState::Drained
        } else {
            NodeState::Serving
        };
        let changed = self.announcers.node != want;
        let graceful = if drained && changed {
            self.begin_graceful()
        } else {
            None
        };
        if !drained {
            self.announcers.graceful_until = None;
            self.announcers.set_graceful(false);
        }
        if changed {
            self.announcers.node = want;
            self.announcers.node_since = Instant::now();
            self.save_drain(drained);
        }
        let before = self.announcers.decision.addresses.clone();
        self.announce();
        let after = &self.announcers.decision.addresses;
        let addresses: Vec<IpAddr> = match (drained, graceful) {
            (true, Some(_)) => self.announcers.graceful_set.iter().copied().collect(),
            (true, None) => before.difference(after).copied().collect(),
            (false, _) => after.difference(&before).copied().collect(),
        };
        if changed {
            info!(
                node = %self.announcers.node,
                addresses = ?addresses,
                "node {}",
                if drained { "drained: every VIP withdrawn, forwarding goes on" } else { "undrained" }
            );
        }
        Ok(NodeChange {
            node: node_wire(self.announcers.node),
            changed,
            addresses,
            wait_secs: match (drained, graceful) {
                (true, Some(w)) => (w + self.config.shutdown_grace).as_secs_f64(),
                (true, None) => self.grace_left().as_secs_f64(),
                (false, _) => 0.0,
            },
        })
    }

    /// Keeps a node drain for a start after a crash (`drain.json`), or
    /// forgets it. A failure is a warning: the drain holds while `lbd`
    /// runs.
    fn save_drain(&self, drained: bool) {
        let saved = drained.then(|| crate::revisions::SavedDrain {
            since_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        if let Err(e) = self.revisions.save_drain(saved.as_ref()) {
            warn!("keeping the node drain for a restart after a crash: {e}");
        }
    }

    /// Before the first announcement: a node drain the last `lbd` left
    /// (it crashed, or its watchdog killed it, while drained) holds again,
    /// said loudly. A clean stop forgets the drain: a balancer restarted on
    /// purpose is one the operator wants back.
    pub fn resume_drain(&mut self) {
        let saved = match self.revisions.drain() {
            Ok(Some(saved)) => saved,
            Ok(None) => return,
            Err(e) => {
                warn!(
                    "a node drain the last lbd may have left cannot be read, so the node serves: {e}"
                );
                return;
            }
        };
        self.announcers.node = NodeState::Drained;
        self.announcers.node_since = Instant::now();
        warn!(
            since_unix_secs = saved.since_unix_secs,
            "the node was drained when lbd last stopped without a clean stop (a crash or a kill): it starts drained, every VIP withdrawn; `lbctl node undrain` serves again"
        );
    }

    /// The first SIGTERM/SIGINT withdraws every VIP and returns how long
    /// to wait before stopping; a second one returns `None`: stop now.
    /// A node drain is forgotten (see [`Daemon::resume_drain`]).
    pub fn begin_stop(&mut self, signal: &str) -> Option<Duration> {
        if self.announcers.node == NodeState::Stopping {
            info!(signal, "second signal: stopping now");
            return None;
        }
        self.save_drain(false);
        // A graceful shutdown already under way (a drain) runs on.
        let graceful = self.begin_graceful().or_else(|| {
            self.announcers
                .graceful_until
                .map(|t| t.saturating_duration_since(Instant::now()))
        });
        self.announcers.node = NodeState::Stopping;
        self.announcers.node_since = Instant::now();
        self.announce();
        let wait = match graceful {
            Some(w) => w + self.config.shutdown_grace,
            None => self.grace_left(),
        };
        info!(
            signal,
            wait_ms = wait.as_millis() as u64,
            "stopping: every VIP withdrawn, waiting for the routers to move traffic away"
        );
        Some(wait)
    }

    /// `lbctl bgp`.
    pub fn announce_status(&self) -> AnnounceStatus {
        let a = &self.announcers;
        let rows = a.peer_rows();
        AnnounceStatus {
            node: node_wire(a.node),
            node_state_secs: match a.node {
                NodeState::Serving => 0.0,
                _ => a.node_since.elapsed().as_secs_f64(),
            },
            attached: self.startup.attached,
            shutdown_grace_secs: self.config.shutdown_grace.as_secs_f64(),
            announced: self.carried_addresses(&rows).into_iter().collect(),
            announcers: kinds(&self.config.announce),
            peers: rows
                .iter()
                .cloned()
                .map(crate::announce::PeerStatus::row)
                .collect(),
            vips: a
                .decision
                .vips
                .iter()
                .map(|v| {
                    let (announced, reason) = self.truth(v.vip.addr, v.announced, &v.reason, &rows);
                    api::VipAnnouncement {
                        vip: v.vip,
                        usable: v.usable,
                        backends: v.backends,
                        min_healthy: v.min_healthy,
                        announced,
                        wanted: v.announced,
                        reason,
                    }
                })
                .collect(),
        }
    }

    /// The addresses some peer has from us now: none with no announcer
    /// configured (routes are then set up outside `lbd`, which cannot
    /// know whether a router has them).
    pub fn carried_addresses(&self, peers: &[crate::announce::PeerStatus]) -> BTreeSet<IpAddr> {
        let wanted = &self.announcers.decision.addresses;
        wanted
            .iter()
            .filter(|a| peers.iter().any(|p| p.carries(a, wanted)))
            .copied()
            .collect()
    }

    /// A VIP's announcement as it is: wanted by the policy *and* held by
    /// a peer; when wanted and held by none, why, peer by peer.
    fn truth(
        &self,
        addr: IpAddr,
        wanted: bool,
        reason: &str,
        peers: &[crate::announce::PeerStatus],
    ) -> (bool, String) {
        let set = &self.announcers.decision.addresses;
        if !wanted || peers.iter().any(|p| p.carries(&addr, set)) {
            return (wanted, reason.to_string());
        }
        if !self.has_announcers() {
            return (
                false,
                format!(
                    "not announced: no announcer is configured (`announce:`); the policy would ({reason})"
                ),
            );
        }
        let why: Vec<String> = peers
            .iter()
            .map(|p| {
                let withheld = p.withheld.iter().find(|(a, _)| *a == addr);
                match (p.state, withheld) {
                    (_, Some((_, w))) => format!("{}: {w}", p.peer),
                    (SessionState::Established, None) => format!("{}: not sent yet", p.peer),
                    (state, None) => format!("{}: session {state}", p.peer),
                }
            })
            .collect();
        let peers = if why.is_empty() {
            "no peer".to_string()
        } else {
            why.join("; ")
        };
        (
            false,
            format!("withheld: wanted ({reason}), but no router has it: {peers}"),
        )
    }

    /// One line for `lbctl status`.
    pub fn announce_summary(&self) -> String {
        let a = &self.announcers;
        let n = a.decision.addresses.len();
        let kinds = kinds(&self.config.announce);
        if kinds.is_empty() {
            return "no announcer configured (`announce:`)".into();
        }
        let peers: Vec<_> = a.running.iter().flat_map(|x| x.status()).collect();
        let up = peers
            .iter()
            .filter(|p| p.state == SessionState::Established)
            .count();
        let node = match a.node {
            NodeState::Serving => String::new(),
            other => format!("; node {other}"),
        };
        let bfd: Vec<_> = peers.iter().filter_map(|p| p.bfd.as_ref()).collect();
        let bfd = if bfd.is_empty() {
            String::new()
        } else {
            let up = bfd.iter().filter(|b| b.up).count();
            format!(", BFD {up} of {} up", bfd.len())
        };
        let carried = self.carried_addresses(&peers).len();
        let held_by_none = if carried < n {
            format!(", {} wanted but held by no router", n - carried)
        } else {
            String::new()
        };
        format!(
            "{}: {up} of {} up{bfd}, {carried} address(es) announced{held_by_none}{node}",
            kinds.join(", "),
            peers.len()
        )
    }
}

/// Whether a start of the announcers (`first`, or a later one for a
/// reload) over a datapath that was `adopted` is a restart (graceful
/// restart's Restart State: the routers kept the routes) and whether it
/// is fresh (End-of-RIB at once). Only the first start is either.
fn start_kind(first: bool, adopted: bool) -> (bool, bool) {
    (first && adopted, first && !adopted)
}

/// A VIP's announcement that began or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Announced,
    /// Withdrawn; `warn`: for health (the node serves), not for a drain
    /// or a stop, which are the operator's wish.
    Withdrawn {
        warn: bool,
    },
}

/// The VIPs of `after` whose announcement began or ended since `before`.
fn changes<'d>(
    before: &Decision,
    after: &'d Decision,
    node: NodeState,
) -> Vec<(&'d policy::VipVerdict, Change)> {
    let serving = node == NodeState::Serving;
    after
        .vips
        .iter()
        .filter_map(|v| {
            let was = before
                .vips
                .iter()
                .find(|o| o.vip == v.vip)
                .is_some_and(|o| o.announced);
            match (was, v.announced) {
                (false, true) => Some((v, Change::Announced)),
                (true, false) => Some((v, Change::Withdrawn { warn: serving })),
                _ => None,
            }
        })
        .collect()
}

/// Logs each VIP that is newly announced or withdrawn: a withdrawal for
/// health is a warning, one for a drain or a stop is the operator's wish.
fn log_changes(before: &Decision, after: &Decision, node: NodeState) {
    for (v, change) in changes(before, after, node) {
        match change {
            Change::Announced => info!(vip = %v.vip, reason = %v.reason, "VIP announced"),
            Change::Withdrawn { warn: true } => {
                warn!(vip = %v.vip, reason = %v.reason, "VIP withdrawn")
            }
            Change::Withdrawn { warn: false } => {
                info!(vip = %v.vip, reason = %v.reason, "VIP withdrawn")
            }
        }
    }
}

pub(super) fn node_wire(n: NodeState) -> api::NodeState {
    match n {
        NodeState::Serving => api::NodeState::Serving,
        NodeState::Drained => api::NodeState::Drained,
        NodeState::Stopping => api::NodeState::Stopping,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Verdicts of VIPs `10.99.0.N:80/tcp`, announced or not.
    fn decision(announced: &[(u8, bool)]) -> Decision {
        Decision {
            addresses: BTreeSet::new(),
            vips: announced
                .iter()
                .map(|(n, on)| policy::VipVerdict {
                    vip: format!("10.99.0.{n}:80/tcp").parse().unwrap(),
                    usable: 1,
                    backends: 1,
                    min_healthy: 1,
                    announced: *on,
                    reason: String::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_withdrawal_is_a_warning_only_while_the_node_serves() {
        let before = decision(&[(1, true), (2, false), (3, true)]);
        let after = decision(&[(1, false), (2, true), (3, true), (4, true)]);
        let said = |node| -> Vec<(String, Change)> {
            changes(&before, &after, node)
                .into_iter()
                .map(|(v, c)| (v.vip.to_string(), c))
                .collect()
        };
        let serving = said(NodeState::Serving);
        assert_eq!(
            serving,
            [
                ("10.99.0.1:80/tcp".into(), Change::Withdrawn { warn: true }),
                ("10.99.0.2:80/tcp".into(), Change::Announced),
                ("10.99.0.4:80/tcp".into(), Change::Announced),
            ]
        );
        for node in [NodeState::Drained, NodeState::Stopping] {
            assert_eq!(said(node)[0].1, Change::Withdrawn { warn: false });
        }
    }

    #[test]
    fn only_the_first_start_is_a_restart_or_fresh() {
        // (first, adopted) → (restarted, fresh)
        assert_eq!(start_kind(true, true), (true, false), "over kept maps");
        assert_eq!(start_kind(true, false), (false, true), "over new maps");
        assert_eq!(start_kind(false, true), (false, false), "a reload");
        assert_eq!(start_kind(false, false), (false, false), "a reload");
    }
}

//! Route announcement: telling the routers that this balancer takes a VIP's
//! traffic, by announcing a host route (/32 for IPv4, /128 for IPv6) for it.
//! With several balancers announcing the same VIPs, the routers spread
//! flows over them by ECMP (active-active).
//!
//! This module owns the [`Announcer`] trait, the status rows `lbctl bgp`
//! shows ([`PeerStatus`]), the set arithmetic every announcer shares
//! ([`diff`]), the configuration section ([`AnnounceConfig`]) and three
//! announcers:
//!
//! - [`bgp`]: a built-in, originate-only BGP-4 speaker (one session per
//!   router, next hop self, routes from the routers ignored);
//! - [`exabgp`]: `announce route …`/`withdraw route …` lines for an ExaBGP
//!   process that runs this one;
//! - [`exec`]: an operator's command, run once per change.
//!
//! Which VIPs to announce is [`policy`]'s answer (pure logic over the
//! configuration and the backends' states), which `lbd` hands to the
//! announcers; nothing here touches the kernel's routing table.
//!
//! # Calling convention: synchronous set, asynchronous shutdown
//!
//! The announcers are driven from one tokio task (`lbd`'s daemon loop).
//! [`Announcer::set_announced`] is a plain function that never blocks on
//! the network or a child process: it records the desired set and returns;
//! the announcer's own tasks (BGP sessions, the exec worker) catch up and
//! report progress and failures through [`Announcer::status`]. So the
//! daemon loop never waits for a slow router or script. (The ExaBGP
//! announcer writes a few lines to a pipe, which is as non-blocking as a
//! log line.) [`Announcer::shutdown`] has to wait for I/O (withdrawals and
//! a NOTIFICATION on the wire, withdraw commands), so it returns a boxed
//! future, bounded in time; boxing keeps the trait object-safe, so `lbd`
//! can hold a `Vec<Box<dyn Announcer>>`. Announcers that spawn tasks must be
//! started inside a tokio runtime.

pub(crate) mod bgp;
pub(crate) mod exabgp;
pub(crate) mod exec;
pub(crate) mod policy;

pub use self::bgp::{BgpConfig, BgpSpeaker, ConnectRetry, PeerConfig, wire};
pub use self::exec::commands_keep_open_files_limit;

use std::{collections::BTreeSet, fmt, net::IpAddr};

use futures::future::BoxFuture;
use thiserror::Error;

pub use crate::config::announce::AnnounceConfig;
use crate::config::{ConfigErrors, error::prefixed};

/// Something that makes routers send the announced VIPs to this box.
pub trait Announcer: Send {
    /// Makes the announced set exactly `prefixes` (each a host route: /32
    /// for IPv4, /128 for IPv6). Returns at once; see the module docs.
    /// Fails for an address that cannot be a VIP and after
    /// [`shutdown`](Self::shutdown) (then nothing changes), and for the
    /// ExaBGP announcer when its output fails (then the next call retries
    /// what was not written). Failures of the network or of a command show
    /// in [`status`](Self::status), not here.
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError>;

    /// One row per peer (BGP) or target (ExaBGP, command).
    fn status(&self) -> Vec<PeerStatus>;

    /// Withdraws everything and closes cleanly (BGP: an UPDATE withdrawing
    /// every route, then a NOTIFICATION Cease). Bounded in time; after it,
    /// [`set_announced`](Self::set_announced) fails.
    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>>;

    /// Whether every backend has had its first probe verdict, so the set
    /// given to [`set_announced`](Self::set_announced) is the policy's
    /// real answer (after a restart, BGP sends its routes and End-of-RIB
    /// only then).
    fn set_settled(&mut self, _settled: bool) {}

    /// How long a graceful shutdown (RFC 8326) waits between re-announcing
    /// with the GRACEFUL_SHUTDOWN community and withdrawing; `None`: this
    /// announcer does not do one.
    fn graceful_shutdown_wait(&self) -> Option<std::time::Duration> {
        None
    }

    /// Starts (or ends) the graceful shutdown's re-announcement.
    fn set_graceful_shutdown(&mut self, _on: bool) {}
}

/// What an announcer's start needs from `lbd` beyond its configuration.
#[derive(Clone, Default)]
pub struct StartContext {
    /// The BFD maps (the instance's pins); `None`: BFD cannot run.
    pub bfd: Option<std::sync::Arc<dyn crate::bfd::BfdTable>>,
    /// `lbd` restarted over a datapath that kept forwarding (its pins
    /// were adopted): the first sessions say so (graceful restart).
    pub restarted: bool,
    /// The datapath is new (nothing adopted): the first sessions clear
    /// the Forwarding State bit.
    pub fresh: bool,
}

/// The BGP finite state machine's states (RFC 4271 §8.2.2). Announcers
/// without sessions use `Established` for "working", `Active` for "waiting
/// to retry after a failure" and `Idle` for "stopped".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Not trying (stopped, or not started).
    Idle,
    /// A TCP connection to the peer is being set up.
    Connect,
    /// Waiting to retry after a failed connection or a closed session (we
    /// never listen, so this is where a speaker waits out its backoff).
    Active,
    /// Our OPEN is sent; waiting for the peer's.
    OpenSent,
    /// OPENs are exchanged; waiting for the peer's first KEEPALIVE.
    OpenConfirm,
    /// Routes flow.
    Established,
}

impl fmt::Display for SessionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The state of one peer or target, for `lbctl bgp` (JSON over `lbd`'s
/// API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// `10.0.0.1:179` for a BGP peer, `exabgp` or `exec <command>`.
    pub peer: String,
    /// The peer's AS (BGP only).
    pub remote_as: Option<u32>,
    pub state: SessionState,
    /// Seconds since the session reached `Established` (0 when it is not).
    pub uptime_secs: u64,
    /// Hold time agreed with the peer in the current session (BGP only).
    pub hold_time_secs: Option<u16>,
    /// Prefixes the peer (or target) has from us now.
    pub prefixes_announced: usize,
    /// How often the session reached `Established` (BGP only; 0 otherwise).
    pub sessions_established: u64,
    /// The most recent failure, kept after recovery so that flaps are
    /// visible.
    pub last_error: Option<String>,
    /// BGP messages (or lines, or command runs) sent and received.
    pub messages_sent: u64,
    pub messages_received: u64,
    /// BGP UPDATEs (or prefix changes) sent and received.
    pub updates_sent: u64,
    pub updates_received: u64,
    /// UPDATEs with malformed attributes, ignored as RFC 7606's
    /// treat-as-withdraw (BGP only).
    pub updates_ignored: u64,
    /// The peer's BFD session, if configured (BGP only).
    pub bfd: Option<crate::bfd::BfdStatus>,
    /// Graceful restart with this peer (BGP only).
    pub graceful_restart: Option<GracefulRestartStatus>,
    /// The announcements carry the GRACEFUL_SHUTDOWN community now.
    pub graceful_shutdown: bool,
    /// The addresses the peer has from us now (BGP: sent in a family the
    /// session negotiated, with a next hop, on a session the peer
    /// confirmed; exec: whose command succeeded). `None`: the announcer
    /// cannot tell addresses apart (ExaBGP: everything it was given, while
    /// it works).
    pub carried: Option<Vec<IpAddr>>,
    /// The address families the session negotiated (BGP): `ipv4`, `ipv6`.
    pub families: Vec<String>,
    /// Addresses wanted but not sent to this peer, and why.
    pub withheld: Vec<(IpAddr, String)>,
}

impl PeerStatus {
    /// The row `lbctl bgp` shows: the API's own type, so that a change
    /// here cannot change the wire.
    pub fn row(self) -> crate::api::PeerRow {
        crate::api::PeerRow {
            peer: self.peer,
            remote_as: self.remote_as,
            state: session_wire(self.state),
            uptime_secs: self.uptime_secs,
            hold_time_secs: self.hold_time_secs,
            prefixes_announced: self.prefixes_announced,
            sessions_established: self.sessions_established,
            last_error: self.last_error,
            messages_sent: self.messages_sent,
            messages_received: self.messages_received,
            updates_sent: self.updates_sent,
            updates_received: self.updates_received,
            updates_ignored: self.updates_ignored,
            bfd: self.bfd,
            graceful_restart: self.graceful_restart,
            graceful_shutdown: self.graceful_shutdown,
            carried: self.carried,
            families: self.families,
            withheld: self.withheld,
        }
    }

    /// Whether this peer has `addr` from us now, `wanted` being what the
    /// policy hands the announcers. A list of what it carries is taken at
    /// its word (BGP lists nothing outside Established; exec lists what
    /// its command did, also while another change fails); without one,
    /// everything wanted while the announcer works.
    pub fn carries(&self, addr: &IpAddr, wanted: &std::collections::BTreeSet<IpAddr>) -> bool {
        match &self.carried {
            Some(list) => list.contains(addr),
            None => self.state == SessionState::Established && wanted.contains(addr),
        }
    }
}

/// Graceful restart (RFC 4724) in a peer's current or last session: the
/// API's row itself (a report; `lbd` fills it).
pub use crate::api::GracefulRestartRow as GracefulRestartStatus;

impl PeerStatus {
    /// A row with zero counters.
    pub fn new(peer: impl Into<String>, state: SessionState) -> Self {
        Self {
            peer: peer.into(),
            remote_as: None,
            state,
            uptime_secs: 0,
            hold_time_secs: None,
            prefixes_announced: 0,
            sessions_established: 0,
            last_error: None,
            messages_sent: 0,
            messages_received: 0,
            updates_sent: 0,
            updates_received: 0,
            updates_ignored: 0,
            bfd: None,
            graceful_restart: None,
            graceful_shutdown: false,
            carried: None,
            families: Vec::new(),
            withheld: Vec::new(),
        }
    }
}

#[derive(Debug, Error)]
pub enum AnnounceError {
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    #[error("{prefix} cannot be announced: {reason}")]
    InvalidPrefix {
        prefix: IpAddr,
        reason: &'static str,
    },
    #[error("the {announcer} announcer must be started inside a tokio runtime")]
    NoRuntime { announcer: &'static str },
    #[error("writing to {target}: {source}")]
    Write {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the announcer is shut down")]
    ShutDown,
    #[error("shutdown incomplete: {0}")]
    Shutdown(String),
    #[error("BFD: {0}")]
    Bfd(#[from] crate::bfd::BfdError),
}

/// What turns `current` into `desired`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// In `desired`, not in `current`.
    pub announce: BTreeSet<IpAddr>,
    /// In `current`, not in `desired`.
    pub withdraw: BTreeSet<IpAddr>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.announce.is_empty() && self.withdraw.is_empty()
    }
}

/// The announcements and withdrawals that turn `current` into `desired`.
pub fn diff(current: &BTreeSet<IpAddr>, desired: &BTreeSet<IpAddr>) -> Diff {
    Diff {
        announce: desired.difference(current).copied().collect(),
        withdraw: current.difference(desired).copied().collect(),
    }
}

/// The host route for `vip`: `10.0.0.1/32`, `2001:db8::1/128`.
pub fn host_prefix(vip: IpAddr) -> String {
    match vip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// `set_announced` for announcers whose worker follows a watch channel:
/// checks the set and publishes it, waking the worker only if it changed.
pub fn publish_desired(
    desired: &tokio::sync::watch::Sender<std::sync::Arc<BTreeSet<IpAddr>>>,
    shut_down: bool,
    prefixes: &BTreeSet<IpAddr>,
) -> Result<(), AnnounceError> {
    if shut_down {
        return Err(AnnounceError::ShutDown);
    }
    check_prefixes(prefixes)?;
    desired.send_if_modified(|current| {
        if **current == *prefixes {
            return false;
        }
        *current = std::sync::Arc::new(prefixes.clone());
        true
    });
    Ok(())
}

/// Refuses addresses that cannot be a VIP: unspecified, loopback,
/// multicast, IPv4 broadcast.
pub fn check_prefixes(prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
    for &prefix in prefixes {
        let reason = if prefix.is_unspecified() {
            "unspecified address"
        } else if prefix.is_loopback() {
            "loopback address"
        } else if prefix.is_multicast() {
            "multicast address"
        } else if matches!(prefix, IpAddr::V4(a) if a.is_broadcast()) {
            "broadcast address"
        } else {
            continue;
        };
        return Err(AnnounceError::InvalidPrefix { prefix, reason });
    }
    Ok(())
}

/// Starts every announcer `config` asks for (inside a tokio runtime; the
/// ExaBGP one writes to standard output), without BFD or restart state.
pub fn start(config: &AnnounceConfig) -> Result<Vec<Box<dyn Announcer>>, AnnounceError> {
    start_with(config, &StartContext::default())
}

/// [`start`] with what `lbd` knows: its BFD maps, whether it restarted.
pub fn start_with(
    config: &AnnounceConfig,
    ctx: &StartContext,
) -> Result<Vec<Box<dyn Announcer>>, AnnounceError> {
    let errors = config.validate();
    if !errors.is_empty() {
        return Err(ConfigErrors {
            source_name: None,
            errors,
        }
        .into());
    }
    let mut started: Vec<Box<dyn Announcer>> = Vec::new();
    if let Some(bgp) = &config.bgp {
        started.push(Box::new(bgp::BgpSpeaker::start_with(bgp.clone(), ctx)?));
    }
    if let Some(exabgp) = &config.exabgp {
        started.push(Box::new(exabgp::ExabgpAnnouncer::stdout(exabgp.clone())));
    }
    if let Some(exec) = &config.exec {
        started.push(Box::new(exec::ExecAnnouncer::start(exec.clone())?));
    }
    Ok(started)
}

fn session_wire(s: SessionState) -> crate::api::SessionState {
    match s {
        SessionState::Idle => crate::api::SessionState::Idle,
        SessionState::Connect => crate::api::SessionState::Connect,
        SessionState::Active => crate::api::SessionState::Active,
        SessionState::OpenSent => crate::api::SessionState::OpenSent,
        SessionState::OpenConfirm => crate::api::SessionState::OpenConfirm,
        SessionState::Established => crate::api::SessionState::Established,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().expect("address")).collect()
    }

    #[test]
    fn diff_announces_the_new_and_withdraws_the_gone() {
        let current = set(&["10.0.0.1", "10.0.0.2", "2001:db8::1"]);
        let desired = set(&["10.0.0.2", "10.0.0.3", "2001:db8::2"]);
        let d = diff(&current, &desired);
        assert_eq!(d.announce, set(&["10.0.0.3", "2001:db8::2"]));
        assert_eq!(d.withdraw, set(&["10.0.0.1", "2001:db8::1"]));
        assert!(!d.is_empty());
    }

    #[test]
    fn diff_of_equal_sets_is_empty_and_from_empty_announces_all() {
        let s = set(&["10.0.0.1", "2001:db8::1"]);
        assert!(diff(&s, &s).is_empty());
        let from_empty = diff(&BTreeSet::new(), &s);
        assert_eq!(from_empty.announce, s);
        assert!(from_empty.withdraw.is_empty());
        let to_empty = diff(&s, &BTreeSet::new());
        assert_eq!(to_empty.withdraw, s);
        assert!(to_empty.announce.is_empty());
    }

    #[test]
    fn host_prefixes_are_32_and_128() {
        assert_eq!(host_prefix("10.0.0.1".parse().unwrap()), "10.0.0.1/32");
        assert_eq!(
            host_prefix("2001:db8::1".parse().unwrap()),
            "2001:db8::1/128"
        );
    }

    #[test]
    fn addresses_that_cannot_be_vips_are_refused() {
        assert!(check_prefixes(&set(&["10.0.0.1", "2001:db8::1"])).is_ok());
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "224.0.0.5",
            "255.255.255.255",
            "::",
            "::1",
            "ff02::1",
        ] {
            let err = check_prefixes(&set(&["10.0.0.1", bad])).expect_err(bad);
            assert!(
                matches!(err, AnnounceError::InvalidPrefix { prefix, .. } if prefix.to_string() == bad),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_section_parses_and_rejects_unknown_fields() {
        let cfg: AnnounceConfig = serde_yaml::from_str(
            "bgp:\n  local_as: 65001\n  router_id: 10.0.0.11\n  peers:\n    - { address: 10.0.0.1, remote_as: 65000 }\nexabgp: {}\n",
        )
        .expect("valid section");
        assert!(cfg.validate().is_empty(), "{:?}", cfg.validate());
        assert_eq!(cfg.bgp.as_ref().map(|b| b.peers.len()), Some(1));
        assert!(cfg.exabgp.is_some() && cfg.exec.is_none());

        let err = serde_yaml::from_str::<AnnounceConfig>("bpg: {}\n").expect_err("typo");
        assert!(err.to_string().contains("unknown field `bpg`"), "{err}");
    }

    #[test]
    fn section_errors_carry_the_announcer_in_the_field_path() {
        let cfg: AnnounceConfig = serde_yaml::from_str(
            "bgp:\n  local_as: 0\n  router_id: 10.0.0.11\n  peers:\n    - { address: 10.0.0.1, remote_as: 65000 }\nexec:\n  command: []\n",
        )
        .expect("parses");
        let fields: Vec<String> = cfg.validate().into_iter().map(|e| e.field).collect();
        assert!(fields.contains(&"bgp.local_as".to_string()), "{fields:?}");
        assert!(fields.contains(&"exec.command".to_string()), "{fields:?}");
    }
}

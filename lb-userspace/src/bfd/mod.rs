//! BFD sessions for the BGP peers that ask for them (`bfd:` on a peer):
//! `lbd`'s half of BFD. The datapath answers the peers' control packets
//! (`lb_xdp`'s `bfd.rs`, state machine in `lb_common::bfd`); `lbd` only
//!
//! - writes each session's configuration into `LB_BFD_PEERS` ([`start`]):
//!   our address on the link (the peer's `local_address`, or the one the
//!   kernel picks for the route to the peer), a discriminator and a UDP
//!   source port of its own, and the timers. A restarted `lbd` adopts the
//!   entries it finds (same discriminator, port and slot), so the
//!   sessions run on through the restart;
//! - reads each session's state from `LB_BFD_STATE` every
//!   [`POLL_EVERY`], applies the Detection Time (a session that received
//!   nothing for that long is Down), and tells the peer's BGP session
//!   ([`BfdLink`]) and `lbctl bgp` ([`BfdStatus`]).
//!
//! Not here: the BGP reaction (a BFD session that goes down takes the BGP
//! session down: `announce::bgp::session`), the maps themselves
//! ([`table`]).

pub(crate) mod table;

use std::{
    collections::{BTreeMap, BTreeSet},
    hash::{BuildHasher as _, Hasher as _},
    net::{IpAddr, SocketAddr, UdpSocket},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use lb_common::{
    BfdConfig, BfdKey, BfdState, addr_to_words,
    bfd::{
        BFD_MAX_SESSIONS, BFD_PORT, BFD_SRC_PORT_MIN, BFD_ST_REMOTE_C, STATE_UP, diag_name, expire,
        state_name,
    },
};
use thiserror::Error;
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

#[cfg(test)]
pub use self::table::FakeBfdTable;
pub use self::table::{BfdTable, BfdTableError, KernelBfdTable};
use crate::config::announce::bgp::BfdTimers;

/// How often `lbd` reads the sessions' state.
pub const POLL_EVERY: Duration = Duration::from_millis(50);
/// How often an address the kernel picked is looked up again.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum BfdError {
    #[error(transparent)]
    Table(#[from] BfdTableError),
    #[error("more than {BFD_MAX_SESSIONS} BFD sessions")]
    TooMany,
    #[error("BFD must be started inside a tokio runtime")]
    NoRuntime,
    #[error("bfd needs the datapath's BFD maps, which only lbd has")]
    NoMaps,
}

/// One peer's BFD session as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BfdPeer {
    pub peer: IpAddr,
    /// Our address on the link; `None`: the kernel's choice for the route.
    pub local: Option<IpAddr>,
    pub timers: BfdTimers,
}

/// A session's state, for `lbctl bgp` and metrics: the API's row itself
/// (a report, so its home is the wire; `lbd` fills it, nothing else
/// reads it).
pub use crate::api::BfdRow as BfdStatus;

/// What one BGP session follows: whether its BFD session is Up, and its
/// status.
#[derive(Clone)]
pub struct BfdLink {
    pub up: watch::Receiver<bool>,
    status: Arc<Mutex<BfdStatus>>,
}

impl BfdLink {
    pub fn status(&self) -> BfdStatus {
        lock(&self.status).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running sessions; dropping it stops the reading (the datapath goes
/// on answering).
pub struct BfdSessions {
    links: Vec<BfdLink>,
    task: JoinHandle<()>,
}

impl BfdSessions {
    /// Session `i` of the peers given to [`start`].
    pub fn link(&self, i: usize) -> BfdLink {
        self.links[i].clone()
    }
}

impl Drop for BfdSessions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One session as installed.
struct Installed {
    peer: BfdPeer,
    key: BfdKey,
    config: BfdConfig,
    /// The peer's address is the kernel's choice, looked up again now and
    /// then.
    resolved: bool,
}

/// Installs `peers`' sessions (adopting those a previous `lbd` left,
/// removing the others) and starts reading their state on the current
/// tokio runtime.
pub fn start(table: Arc<dyn BfdTable>, peers: Vec<BfdPeer>) -> Result<BfdSessions, BfdError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| BfdError::NoRuntime)?;
    let installed = install(table.as_ref(), peers)?;
    let mut links = Vec::new();
    let mut senders = Vec::new();
    for s in &installed {
        let (tx, rx) = watch::channel(false);
        let status = Arc::new(Mutex::new(BfdStatus {
            state: state_name(lb_common::bfd::STATE_DOWN).into(),
            local_disc: s.config.my_disc,
            local: s.peer.local,
            ..BfdStatus::default()
        }));
        links.push(BfdLink {
            up: rx,
            status: Arc::clone(&status),
        });
        senders.push((tx, status));
    }
    let task = runtime.spawn(poll(table, installed, senders));
    Ok(BfdSessions { links, task })
}

/// Removes every session from the maps, when no peer asks for BFD any
/// more: the datapath stops answering the routers' control packets, and
/// a BFD daemon on the host gets them again. Returns how many there were.
pub fn remove_all(table: &dyn BfdTable) -> Result<usize, BfdError> {
    let peers = table.peers()?;
    for (key, _) in &peers {
        table.remove_peer(key)?;
    }
    Ok(peers.len())
}

/// A random `u32` (the standard library's randomly keyed hasher).
fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 32) as u32
}

/// The address the kernel would send from to `peer` (no packet is sent).
fn resolve_local(peer: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = if peer.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let s = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    s.connect(SocketAddr::new(peer, BFD_PORT)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

fn key_of(peer: IpAddr) -> BfdKey {
    let (addr, family) = addr_to_words(peer);
    BfdKey {
        addr,
        family,
        _pad: [0; 3],
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// The configuration `peer` wants, on top of `old` (its adopted entry),
/// with `local` as our address; the generation moves when the timers do.
fn config_for(peer: &BfdPeer, local: Option<IpAddr>, old: BfdConfig) -> BfdConfig {
    let mut c = old;
    c.local_addr = local.map_or([0; 4], |l| addr_to_words(l).0);
    c.desired_min_tx_us = micros(peer.timers.min_tx);
    c.required_min_rx_us = micros(peer.timers.min_rx);
    c.detect_mult = peer.timers.multiplier;
    if (c.desired_min_tx_us, c.required_min_rx_us, c.detect_mult)
        != (
            old.desired_min_tx_us,
            old.required_min_rx_us,
            old.detect_mult,
        )
        && old.my_disc != 0
    {
        c.config_gen = old.config_gen.wrapping_add(1);
    }
    c
}

/// Writes the sessions into the peers map; see [`start`].
fn install(table: &dyn BfdTable, peers: Vec<BfdPeer>) -> Result<Vec<Installed>, BfdError> {
    if peers.len() > BFD_MAX_SESSIONS as usize {
        return Err(BfdError::TooMany);
    }
    let wanted: BTreeSet<BfdKey> = peers.iter().map(|p| key_of(p.peer)).collect();
    let mut existing: BTreeMap<BfdKey, BfdConfig> = BTreeMap::new();
    for (key, config) in table.peers()? {
        if wanted.contains(&key) && config.slot < BFD_MAX_SESSIONS {
            existing.insert(key, config);
        } else {
            table.remove_peer(&key)?;
        }
    }
    let mut slots: BTreeSet<u32> = existing.values().map(|c| c.slot).collect();
    let mut discs: BTreeSet<u32> = existing.values().map(|c| c.my_disc).collect();
    let mut out = Vec::new();
    for peer in peers {
        let key = key_of(peer.peer);
        let local = peer.local.or_else(|| resolve_local(peer.peer));
        let old = match existing.get(&key) {
            Some(c) => *c,
            None => {
                let slot = (0..BFD_MAX_SESSIONS)
                    .find(|s| !slots.contains(s))
                    .ok_or(BfdError::TooMany)?;
                slots.insert(slot);
                let mut disc = 0;
                while disc == 0 || discs.contains(&disc) {
                    disc = random_u32();
                }
                discs.insert(disc);
                table.reset_state(slot)?;
                BfdConfig {
                    my_disc: disc,
                    slot,
                    src_port: (BFD_SRC_PORT_MIN + (random_u32() % 16384) as u16).to_be(),
                    ..BfdConfig::default()
                }
            }
        };
        let config = config_for(&peer, local, old);
        if config != old || !existing.contains_key(&key) {
            table.set_peer(&key, &config)?;
        }
        info!(
            peer = %peer.peer,
            local = ?local,
            discriminator = config.my_disc,
            adopted = existing.contains_key(&key),
            "BFD session configured (answered by the datapath)"
        );
        out.push(Installed {
            resolved: peer.local.is_none(),
            peer: BfdPeer { local, ..peer },
            key,
            config,
        });
    }
    Ok(out)
}

/// What the reader remembers of one session between reads.
struct Seen {
    rx: u64,
    rx_at: Instant,
    state: Option<u8>,
    since: Option<Instant>,
}

type Senders = Vec<(watch::Sender<bool>, Arc<Mutex<BfdStatus>>)>;

/// Reads every session's state every [`POLL_EVERY`] until dropped.
async fn poll(table: Arc<dyn BfdTable>, mut installed: Vec<Installed>, senders: Senders) {
    let now = Instant::now();
    let mut seen: Vec<Seen> = installed
        .iter()
        .map(|_| Seen {
            rx: 0,
            rx_at: now,
            state: None,
            since: None,
        })
        .collect();
    let mut resolved_at = now;
    let mut tick = tokio::time::interval(POLL_EVERY);
    loop {
        tick.tick().await;
        if resolved_at.elapsed() >= RESOLVE_EVERY {
            resolved_at = Instant::now();
            reresolve(table.as_ref(), &mut installed);
        }
        for ((s, seen), (up_tx, status)) in installed.iter().zip(&mut seen).zip(&senders) {
            let read = table.state(s.config.slot).map_err(|e| e.to_string());
            let mut next = match &read {
                Ok(state) => observe(s, state, seen),
                Err(e) => BfdStatus {
                    error: Some(e.clone()),
                    ..lock(status).clone()
                },
            };
            next.local = s.peer.local;
            next.local_disc = s.config.my_disc;
            if next.local.is_none() {
                next.error = Some(format!(
                    "no address of ours toward {}: set local_address",
                    s.peer.peer
                ));
            }
            // The status first: a BGP session woken by the bit reads it.
            let up = next.up;
            *lock(status) = next;
            up_tx.send_if_modified(|was| std::mem::replace(was, up) != up);
        }
    }
}

/// Looks up again the addresses the kernel picked; a changed one is
/// written.
fn reresolve(table: &dyn BfdTable, installed: &mut [Installed]) {
    for s in installed.iter_mut().filter(|s| s.resolved) {
        let local = resolve_local(s.peer.peer);
        if local != s.peer.local && local.is_some() {
            s.peer.local = local;
            s.config = config_for(&s.peer, local, s.config);
            if let Err(e) = table.set_peer(&s.key, &s.config) {
                warn!(peer = %s.peer.peer, error = %e, "cannot update a BFD session");
            }
        }
    }
}

/// When the session's last packet came, as an [`Instant`]: its
/// `bpf_ktime_get_ns` stamp is `CLOCK_MONOTONIC`, the clock of `now`.
/// `now` for a session that received nothing.
fn received_at(st: &BfdState, now: Instant) -> Instant {
    if st.rx == 0 || st.last_rx_ns == 0 {
        return now;
    }
    let age = crate::liveflows::clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(st.last_rx_ns);
    now.checked_sub(Duration::from_nanos(age)).unwrap_or(now)
}

/// One read of a session: the Detection Time applied (nothing received
/// for that long: Down), a change logged.
fn observe(s: &Installed, st: &BfdState, seen: &mut Seen) -> BfdStatus {
    let now = Instant::now();
    if seen.state.is_none() {
        // The first read: the count may be an earlier `lbd`'s, so the
        // last packet's own time says how long the peer has been quiet.
        seen.rx = st.rx;
        seen.rx_at = received_at(st, now);
    } else if st.rx != seen.rx {
        seen.rx = st.rx;
        seen.rx_at = now;
    }
    let silent = now.duration_since(seen.rx_at) > Duration::from_nanos(st.detect_ns) + POLL_EVERY;
    let (state, diag) = if silent {
        expire(st.state, st.diag)
    } else {
        (st.state, st.diag)
    };
    if seen.state != Some(state) {
        if seen.state.is_some() {
            seen.since = Some(now);
            let (from, to) = (state_name(seen.state.unwrap_or(0)), state_name(state));
            if state == STATE_UP {
                info!(peer = %s.peer.peer, from, to, "BFD session up");
            } else {
                warn!(peer = %s.peer.peer, from, to, diag = diag_name(diag), "BFD session not up");
            }
        }
        seen.state = Some(state);
    }
    BfdStatus {
        state: state_name(state).into(),
        up: state == STATE_UP,
        diag: diag_name(diag).into(),
        remote_state: state_name(st.remote_state).into(),
        remote_diag: diag_name(st.remote_diag).into(),
        since_secs: seen.since.map(|t| t.elapsed().as_secs()),
        local: None,
        local_disc: 0,
        remote_disc: st.remote_disc,
        detect_ms: st.detect_ns / 1_000_000,
        tx_interval_ms: u64::from(st.adv_tx_us) / 1000,
        remote_control_independent: st.flags & BFD_ST_REMOTE_C != 0,
        received: st.rx,
        replied: st.tx,
        invalid: st.invalid,
        too_soon: st.too_soon,
        ups: st.ups,
        error: None,
    }
}

#[cfg(test)]
mod tests;

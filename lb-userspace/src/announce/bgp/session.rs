//! One peer's BGP session as a tokio task: the RFC 4271 finite state
//! machine for a speaker that only connects out (Idle → Connect →
//! OpenSent → OpenConfirm → Established, and Active while it waits to
//! retry), its timers (hold, keepalive, exponential reconnect backoff with
//! jitter), and the peer's Adj-RIB-Out: the host routes this session has
//! announced, brought to the desired set by minimal UPDATEs.
//!
//! Not here: encoding (see [`super::wire`]), the desired set (owned by
//! [`super::BgpSpeaker`], shared through a `watch` channel), and any use
//! of the peer's routes, which are checked and dropped. Connection
//! collisions cannot happen: we never listen.

use std::{
    collections::BTreeSet,
    hash::{BuildHasher as _, Hasher as _},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use lb_common::bfd::{STATE_ADMIN_DOWN, state_name};
use netgauze_bgp_pkt::{capabilities::BgpCapability, open::BgpOpenMessage};
use netgauze_iana::address_family::AddressType;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream},
    sync::watch,
    time::{Instant, sleep, sleep_until, timeout},
};
use tracing::{debug, info, warn};

use super::{
    GracefulRestart, PeerConfig,
    wire::{self, Decoder, GracefulRestartOffer, Message, Notification, RouteAttrs},
};
use crate::{
    announce::{GracefulRestartStatus, PeerStatus, SessionState, diff},
    bfd::BfdLink,
};

/// What the speaker wants every session to announce.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub prefixes: BTreeSet<IpAddr>,
    /// Every backend has had its first probe verdict (see
    /// `Announcer::set_settled`).
    pub settled: bool,
    /// A graceful shutdown is under way: announce with GRACEFUL_SHUTDOWN.
    pub shutdown: bool,
}

type DesiredRx = watch::Receiver<Arc<Desired>>;

/// Hold timer while waiting for the peer's OPEN (RFC 4271 §8: "a large
/// value", suggested 4 minutes).
const OPEN_HOLD: Duration = Duration::from_secs(240);
/// Giving up on a TCP connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Giving up on a peer that does not read what we send.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A session that stayed Established this long was a working one: the
/// reconnection backoff starts over after it.
const STABLE_SESSION: Duration = Duration::from_secs(10);
/// Why a session that dies after the connection but before the peer's
/// KEEPALIVE did: our OPEN never reached the peer, or never pleased it.
/// With BIRD and FRR, the usual cause is GTSM on the router only.
const UNCONFIRMED: &str = "(the peer never confirmed our OPEN: a router with GTSM (ttl-security) drops our segments unless ttl_security is set here too)";

/// How often an Established session checks whether the peer's TCP has
/// acknowledged our KEEPALIVE, until it has.
const CONFIRM_POLL: Duration = Duration::from_millis(20);

/// How long we read (and discard) after our NOTIFICATION before closing,
/// so that the kernel sends FIN, not RST, and the peer gets to read it.
const LINGER: Duration = Duration::from_millis(500);

/// What every session of one speaker shares.
#[derive(Clone, Debug)]
pub(super) struct Local {
    pub local_as: u32,
    pub router_id: Ipv4Addr,
    pub hold_time: u16,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub next_hop_v4: Option<Ipv4Addr>,
    pub next_hop_v6: Option<Ipv6Addr>,
    pub graceful_restart: GracefulRestart,
    /// `graceful_shutdown` is configured.
    pub graceful_shutdown: bool,
    /// `lbd` restarted over a forwarding datapath / the datapath is new
    /// (see `announce::StartContext`).
    pub restarted: bool,
    pub fresh: bool,
}

/// A peer's status, written by its task, read by `status()`.
#[derive(Debug, Default)]
pub(super) struct PeerShared {
    inner: Mutex<Counters>,
}

#[derive(Debug)]
struct Counters {
    state: SessionState,
    established_at: Option<Instant>,
    hold_time: Option<u16>,
    prefixes: usize,
    sessions_established: u64,
    last_error: Option<String>,
    messages_sent: u64,
    messages_received: u64,
    updates_sent: u64,
    updates_received: u64,
    /// UPDATEs with malformed attributes, ignored (RFC 7606).
    updates_ignored: u64,
    graceful_restart: Option<GracefulRestartStatus>,
    graceful_shutdown: bool,
    /// Established on our side, not yet confirmed by the peer: a second
    /// handle on the session's socket, to ask it (see
    /// [`PeerShared::confirm_if_acknowledged`]).
    unconfirmed: Option<Unconfirmed>,
    /// What the peer has from us (the session's Adj-RIB-Out).
    carried: BTreeSet<IpAddr>,
    /// The families the session negotiated.
    families: Vec<String>,
    /// Wanted but not sent, and why.
    withheld: Vec<(IpAddr, String)>,
}

/// A session we hold Established and the peer may not (yet).
#[derive(Debug)]
struct Unconfirmed {
    socket: socket2::Socket,
    peer: SocketAddr,
    hold: u16,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            state: SessionState::Idle,
            established_at: None,
            hold_time: None,
            prefixes: 0,
            sessions_established: 0,
            last_error: None,
            messages_sent: 0,
            messages_received: 0,
            updates_sent: 0,
            updates_received: 0,
            updates_ignored: 0,
            graceful_restart: None,
            graceful_shutdown: false,
            unconfirmed: None,
            carried: BTreeSet::new(),
            families: Vec::new(),
            withheld: Vec::new(),
        }
    }
}

impl PeerShared {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        // A panic elsewhere while holding the lock leaves counters that
        // are still good enough to show.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self, peer: &PeerConfig) -> PeerStatus {
        self.confirm_if_acknowledged();
        let c = self.lock();
        PeerStatus {
            peer: peer.socket_addr().to_string(),
            remote_as: Some(peer.remote_as),
            state: c.state,
            uptime_secs: c.established_at.map_or(0, |t| t.elapsed().as_secs()),
            hold_time_secs: c.hold_time,
            // Routes count as announced only on a session the peer has.
            prefixes_announced: if c.state == SessionState::Established {
                c.prefixes
            } else {
                0
            },
            sessions_established: c.sessions_established,
            last_error: c.last_error.clone(),
            messages_sent: c.messages_sent,
            messages_received: c.messages_received,
            updates_sent: c.updates_sent,
            updates_received: c.updates_received,
            updates_ignored: c.updates_ignored,
            bfd: None,
            graceful_restart: c.graceful_restart.clone(),
            graceful_shutdown: c.graceful_shutdown,
            carried: Some(if c.state == SessionState::Established {
                c.carried.iter().copied().collect()
            } else {
                Vec::new()
            }),
            families: c.families.clone(),
            withheld: c.withheld.clone(),
        }
    }

    fn set_state(&self, state: SessionState) {
        let mut c = self.lock();
        c.state = state;
        c.unconfirmed = None;
        if state != SessionState::Established {
            c.established_at = None;
            c.hold_time = None;
            c.prefixes = 0;
            c.carried.clear();
            c.withheld.clear();
        }
    }

    /// Our side of the session is Established (the peer's KEEPALIVE came):
    /// the status stays OpenConfirm until the peer's TCP has acknowledged
    /// everything we sent, our KEEPALIVE included, so the peer has it
    /// too. A router with GTSM (or a filter) may drop our segments after
    /// accepting the connection and sit in OpenConfirm; we must not say
    /// Established then. A socket we cannot ask is taken at its word.
    fn await_confirmation(&self, stream: &TcpStream, peer: SocketAddr, hold: u16) {
        match socket2::SockRef::from(stream).try_clone() {
            Ok(socket) => {
                self.lock().unconfirmed = Some(Unconfirmed { socket, peer, hold });
                self.confirm_if_acknowledged();
            }
            Err(_) => self.confirm(peer, hold),
        }
    }

    /// Says Established once the peer's TCP holds all we sent (see
    /// [`Self::await_confirmation`]); checked on every status read, so
    /// the status is true when it is read.
    fn confirm_if_acknowledged(&self) {
        let mut c = self.lock();
        let Some(u) = &c.unconfirmed else {
            return;
        };
        if super::sockopt::unacknowledged(&u.socket).is_ok_and(|n| n > 0) {
            return;
        }
        let (peer, hold) = (u.peer, u.hold);
        c.unconfirmed = None;
        // Under the same lock as the check: released in between, the
        // session task could set it Active, and this would overwrite that
        // with Established on a closed session (helper-36).
        Self::established(&mut c, hold);
        drop(c);
        info!(peer = %peer, hold_secs = hold, "BGP session established");
    }

    fn confirm(&self, peer: SocketAddr, hold: u16) {
        Self::established(&mut self.lock(), hold);
        info!(peer = %peer, hold_secs = hold, "BGP session established");
    }

    fn established(c: &mut Counters, hold: u16) {
        c.state = SessionState::Established;
        c.established_at = Some(Instant::now());
        c.hold_time = Some(hold);
        c.sessions_established += 1;
    }

    /// The peer has our KEEPALIVE: the shared state says Established
    /// only after [`Self::confirm`], which follows the confirmation.
    fn confirmed(&self) -> bool {
        self.lock().state == SessionState::Established
    }

    pub fn set_idle(&self) {
        self.set_state(SessionState::Idle);
    }

    fn error(&self, message: String) {
        self.lock().last_error = Some(message);
    }
}

/// Waits until the speaker is stopped (or dropped).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Exponential backoff with jitter.
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }

    /// After a session: back to `initial` only if it stayed Established
    /// for [`STABLE_SESSION`]. A peer that accepts and resets at once
    /// keeps us backing off, as any failure does.
    fn session_ended(&mut self, established_for: Option<Duration>) {
        if established_for.is_some_and(|d| d >= STABLE_SESSION) {
            self.reset();
        }
    }

    /// The next wait: the current step shortened by 0–25% at random; the
    /// step doubles up to `max`.
    fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        step.mul_f64(1.0 - 0.25 * random_unit())
    }
}

/// A number in [0, 1) that differs from call to call: the standard
/// library's randomly keyed hasher, enough for spreading reconnects.
fn random_unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

async fn connect(peer: &PeerConfig) -> io::Result<TcpStream> {
    let addr = peer.socket_addr();
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(hops) = peer.ttl_security {
        super::sockopt::set_ttl_security(&socket2::SockRef::from(&socket), addr.ip(), hops)?;
    }
    if let Some(key) = peer
        .md5_key()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
    {
        super::sockopt::set_md5_key(&socket, addr, &key)?;
    }
    if let Some(local) = peer.local_address {
        socket.bind(SocketAddr::new(local, 0))?;
    }
    let stream = timeout(CONNECT_TIMEOUT, socket.connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connection timed out"))??;
    // Keepalives and small UPDATEs must not wait for Nagle.
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The peer's task: connect, run a session, wait, again, until stopped.
pub(super) async fn run_peer(
    local: Arc<Local>,
    peer: PeerConfig,
    shared: Arc<PeerShared>,
    mut desired: DesiredRx,
    mut stop: watch::Receiver<bool>,
    bfd: Option<BfdLink>,
) {
    let addr = peer.socket_addr();
    let mut backoff = Backoff::new(local.retry_initial, local.retry_max);
    let gr_on = peer.graceful_restart(&local.graceful_restart);
    let mut first = true;
    loop {
        if *stop.borrow() {
            break;
        }
        shared.set_state(SessionState::Connect);
        let connected = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            c = connect(&peer) => c,
        };
        match connected {
            Ok(stream) => {
                debug!(peer = %addr, "BGP connection up");
                let mut session = Session::new(&local, &peer, &shared, stream);
                session.bfd = bfd.clone();
                // RFC 4724: Restart State on the first session after lbd
                // restarted; Forwarding State unless the datapath is new.
                session.gr = gr_on.then(|| GracefulRestartOffer {
                    restarting: first && local.restarted,
                    restart_time: local.graceful_restart.restart_time.as_secs() as u16,
                    forwarding: !(first && local.fresh),
                });
                let end = session.run(&mut desired, &mut stop).await;
                // The restart is over once a session sent routes: one
                // that closed before (the peer still winding the old one
                // down, or closing while they were held back) must not use
                // up Restart State, or the next would send routes, and
                // End-of-RIB, before the first verdicts.
                if session.synced {
                    first = false;
                }
                backoff.session_ended(session.established_for());
                match end {
                    End::Stopped => break,
                    End::Failed(reason) => {
                        let reason = if session.unconfirmed() && silent_end(&reason) {
                            format!("{reason} {UNCONFIRMED}")
                        } else {
                            reason
                        };
                        warn!(peer = %addr, reason = %reason, "BGP session closed");
                        shared.error(reason);
                    }
                }
            }
            Err(e) => {
                debug!(peer = %addr, error = %e, "BGP connection failed");
                shared.error(format!("connecting to {addr}: {e}"));
            }
        }
        shared.set_state(SessionState::Active);
        let wait = backoff.next_delay();
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = sleep(wait) => {}
        }
    }
    shared.set_idle();
}

/// How a session ended.
#[derive(Debug)]
enum End {
    /// The speaker is shutting down; routes were withdrawn and a Cease
    /// sent.
    Stopped,
    Failed(String),
}

struct Session<'a> {
    local: &'a Local,
    peer: &'a PeerConfig,
    shared: &'a PeerShared,
    stream: TcpStream,
    decoder: Decoder,
    state: SessionState,
    /// Agreed hold time; zero: no hold timer and no keepalives.
    hold: Duration,
    hold_deadline: Instant,
    keepalive_at: Instant,
    attrs: RouteAttrs,
    /// Address families the peer accepts.
    v4: bool,
    v6: bool,
    /// What the peer has from us in this session.
    adj_out: BTreeSet<IpAddr>,
    /// Every route is to be sent again (new attributes, or the peer asked
    /// for them): the next sync withdraws what is no longer carried, then
    /// announces all that is.
    resend: bool,
    /// VIPs we could not announce to this peer (family not accepted, no
    /// next hop), as last reported.
    skipped: BTreeSet<IpAddr>,
    /// When it reached Established, if it did.
    established_at: Option<Instant>,
    /// The peer's BFD session, if configured.
    bfd: Option<BfdLink>,
    /// BFD was Up in this session: its going down ends it.
    bfd_was_up: bool,
    /// What our OPEN offers of graceful restart.
    gr: Option<GracefulRestartOffer>,
    /// The peer sent the capability: it gets End-of-RIB.
    peer_gr: bool,
    end_of_rib_sent: bool,
    /// Routes went out in this session: they were not (or no longer)
    /// held back after a restart.
    synced: bool,
    /// After a restart, routes and End-of-RIB wait until then at most for
    /// the backends' first verdicts.
    defer_until: Instant,
}

impl<'a> Session<'a> {
    fn new(
        local: &'a Local,
        peer: &'a PeerConfig,
        shared: &'a PeerShared,
        stream: TcpStream,
    ) -> Self {
        let now = Instant::now();
        Self {
            local,
            peer,
            shared,
            stream,
            decoder: Decoder::new(),
            state: SessionState::Connect,
            hold: OPEN_HOLD,
            hold_deadline: now + OPEN_HOLD,
            keepalive_at: now,
            attrs: RouteAttrs {
                local_as: local.local_as,
                ebgp: peer.remote_as != local.local_as,
                asn4: false,
                shutdown: None,
            },
            v4: false,
            v6: false,
            adj_out: BTreeSet::new(),
            resend: false,
            skipped: BTreeSet::new(),
            established_at: None,
            bfd: None,
            bfd_was_up: false,
            gr: None,
            peer_gr: false,
            end_of_rib_sent: false,
            synced: false,
            defer_until: now,
        }
    }

    /// How long the session was Established (`None`: it never was).
    fn established_for(&self) -> Option<Duration> {
        self.established_at.map(|t| t.elapsed())
    }

    fn addr(&self) -> SocketAddr {
        self.peer.socket_addr()
    }

    /// The peer has not shown that it got our OPEN and KEEPALIVE.
    fn unconfirmed(&self) -> bool {
        match self.state {
            SessionState::OpenSent | SessionState::OpenConfirm => true,
            SessionState::Established => !self.shared.confirmed(),
            _ => false,
        }
    }

    fn set_state(&mut self, state: SessionState) {
        self.state = state;
        self.shared.set_state(state);
    }

    fn keepalive_interval(&self) -> Option<Duration> {
        (!self.hold.is_zero()).then(|| (self.hold / 3).max(Duration::from_secs(1)))
    }

    async fn run(&mut self, desired: &mut DesiredRx, stop: &mut watch::Receiver<bool>) -> End {
        self.bfd_was_up = self.bfd.as_ref().is_some_and(|b| *b.up.borrow());
        let open = match wire::open(
            self.local.local_as,
            self.local.hold_time,
            self.local.router_id,
            self.gr,
        ) {
            Ok(open) => open,
            Err(e) => return End::Failed(e.to_string()),
        };
        if let Err(end) = self.send(&open).await {
            return end;
        }
        self.set_state(SessionState::OpenSent);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let hold_on = !self.hold.is_zero();
            let keepalive_on = self.keepalive_interval().is_some()
                && matches!(
                    self.state,
                    SessionState::OpenConfirm | SessionState::Established
                );
            let established = self.state == SessionState::Established;
            let defer_pending = established && self.defer_pending(desired);
            let result = tokio::select! {
                biased;
                _ = stopped(stop) => return self.stop_gracefully().await,
                _ = sleep_until(self.hold_deadline), if hold_on => {
                    self.on_hold_expiry(&mut buf, desired).await
                }
                _ = sleep_until(self.keepalive_at), if keepalive_on => {
                    self.send_keepalive().await
                }
                changed = desired.changed(), if established => match changed {
                    Ok(()) => self.sync(desired).await,
                    // The speaker is gone: same as a stop.
                    Err(_) => return self.stop_gracefully().await,
                },
                _ = sleep_until(self.defer_until), if defer_pending => self.sync(desired).await,
                _ = sleep(CONFIRM_POLL), if established && !self.shared.confirmed() => {
                    self.shared.confirm_if_acknowledged();
                    Ok(())
                }
                up = bfd_changed(&mut self.bfd) => self.on_bfd(up).await,
                read = self.stream.read(&mut buf) => match read {
                    Ok(0) => Err(End::Failed("the peer closed the connection".into())),
                    Ok(n) => self.on_bytes(&buf[..n], desired).await,
                    Err(e) => Err(End::Failed(format!("reading: {e}"))),
                },
            };
            if let Err(end) = result {
                return end;
            }
        }
    }

    /// The hold timer ran out. The loop may come back late (a write that
    /// waited on the peer, a stalled worker) to find the peer's messages
    /// unread in the socket: those are taken first, and count (helper-36:
    /// a live session was closed, and every route withdrawn, for a
    /// KEEPALIVE that had arrived in time). Only silence is a failure.
    async fn on_hold_expiry(&mut self, buf: &mut [u8], desired: &mut DesiredRx) -> Result<(), End> {
        match self.stream.try_read(buf) {
            Ok(0) => Err(End::Failed("the peer closed the connection".into())),
            Ok(n) => self.on_bytes(&buf[..n], desired).await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let detail = format!(
                    "hold timer expired: nothing from the peer for {} s",
                    self.hold.as_secs()
                );
                Err(self.fail(Notification::hold_timer_expired(), detail).await)
            }
            Err(e) => Err(End::Failed(format!("reading: {e}"))),
        }
    }

    /// BFD went up or down: down after being up in this session ends it
    /// (Cease, subcode 10: BFD Down, RFC 9384), unless the peer took BFD
    /// down itself (AdminDown, RFC 5882 §3.2: not a failure of the path;
    /// the session stays, and BFD counts again once it is back up).
    async fn on_bfd(&mut self, up: bool) -> Result<(), End> {
        if up {
            self.bfd_was_up = true;
            return Ok(());
        }
        if !self.bfd_was_up {
            return Ok(());
        }
        let status = self.bfd.as_ref().map(BfdLink::status).unwrap_or_default();
        if status.remote_state == state_name(STATE_ADMIN_DOWN) {
            self.bfd_was_up = false;
            info!(
                peer = %self.addr(),
                "the peer took its BFD session administratively down: the BGP session stays"
            );
            return Ok(());
        }
        let detail = status.diag;
        Err(self
            .fail(
                Notification::new(wire::CEASE, 10, []),
                format!("the BFD session went down ({detail})"),
            )
            .await)
    }

    /// Routes and End-of-RIB are held back: the first session after a
    /// restart, until the backends' first verdicts or `eor_defer_max`.
    /// Only once Established: `defer_until` is in the future from then.
    fn deferring(&self, desired: &DesiredRx) -> bool {
        self.gr.is_some_and(|g| g.restarting)
            && !self.end_of_rib_sent
            && !desired.borrow().settled
            && Instant::now() < self.defer_until
    }

    /// Routes are held back, or were until `defer_until` and no sync has
    /// run since: the timer's arm stays on until one has (a deadline that
    /// passed while another arm ran fires at once). Tested on the time
    /// instead, a deadline passed during a long read of the router's
    /// table disabled the arm, and nothing sent the routes until the
    /// desired set changed (helper-36).
    fn defer_pending(&self, desired: &DesiredRx) -> bool {
        self.gr.is_some_and(|g| g.restarting)
            && !self.end_of_rib_sent
            && !self.synced
            && !desired.borrow().settled
    }

    fn publish_gr(&self, deferring: bool) {
        let Some(gr) = self.gr else {
            return;
        };
        self.shared.lock().graceful_restart = Some(GracefulRestartStatus {
            offered: true,
            peer_supports: self.peer_gr,
            restart_time_secs: gr.restart_time,
            restarting: gr.restarting,
            forwarding: gr.forwarding,
            deferring,
            end_of_rib_sent: self.end_of_rib_sent,
        });
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), End> {
        match timeout(WRITE_TIMEOUT, self.stream.write_all(bytes)).await {
            Ok(Ok(())) => {
                self.shared.lock().messages_sent += 1;
                Ok(())
            }
            Ok(Err(e)) => Err(End::Failed(format!("sending: {e}"))),
            Err(_) => Err(End::Failed(format!(
                "sending: the peer read nothing for {} s",
                WRITE_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn send_keepalive(&mut self) -> Result<(), End> {
        self.send(&wire::keepalive()).await?;
        self.restart_keepalive_timer();
        Ok(())
    }

    fn restart_keepalive_timer(&mut self) {
        if let Some(interval) = self.keepalive_interval() {
            self.keepalive_at = Instant::now() + interval;
        }
    }

    /// Sends `notification`, closes, and says why.
    async fn fail(&mut self, notification: Notification, detail: String) -> End {
        warn!(
            peer = %self.addr(),
            notification = %notification,
            detail = %detail,
            "sending NOTIFICATION"
        );
        let _ = self.send(&notification.encode()).await;
        self.close().await;
        End::Failed(format!("sent NOTIFICATION {notification}: {detail}"))
    }

    /// Half-closes and reads what is left for a moment, so that the peer
    /// sees FIN after our last message instead of a reset.
    async fn close(&mut self) {
        let _ = timeout(WRITE_TIMEOUT, self.stream.shutdown()).await;
        let mut sink = [0u8; 4096];
        let _ = timeout(LINGER, async {
            while let Ok(n) = self.stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }

    /// Withdraws everything, sends Cease, closes.
    async fn stop_gracefully(&mut self) -> End {
        // Only an Established session has sent routes.
        if !self.adj_out.is_empty() {
            let all = std::mem::take(&mut self.adj_out);
            match self.updates(&all, &BTreeSet::new()) {
                Ok(messages) => {
                    for m in messages {
                        if self.send_update(&m).await.is_err() {
                            break;
                        }
                    }
                }
                Err(e) => warn!(peer = %self.addr(), error = %e, "cannot encode withdrawals"),
            }
            {
                let mut c = self.shared.lock();
                c.prefixes = 0;
                c.carried.clear();
            }
        }
        let cease = Notification::cease();
        let _ = self.send(&cease.encode()).await;
        self.close().await;
        info!(peer = %self.addr(), "BGP session closed: routes withdrawn, Cease sent");
        End::Stopped
    }

    async fn on_bytes(&mut self, bytes: &[u8], desired: &mut DesiredRx) -> Result<(), End> {
        self.decoder.extend(bytes);
        loop {
            match self.decoder.next_message() {
                Ok(None) => return Ok(()),
                Ok(Some(message)) => {
                    self.shared.lock().messages_received += 1;
                    self.on_message(message, desired).await?;
                }
                Err(malformed) => {
                    return Err(match malformed.reply {
                        Some(reply) => self.fail(reply, malformed.detail).await,
                        None => {
                            self.close().await;
                            End::Failed(format!("malformed NOTIFICATION: {}", malformed.detail))
                        }
                    });
                }
            }
        }
    }

    async fn on_message(&mut self, message: Message, desired: &mut DesiredRx) -> Result<(), End> {
        if let Message::Notification(n) = &message {
            self.close().await;
            return Err(End::Failed(format!("the peer sent NOTIFICATION {n}")));
        }
        // Any valid message shows the peer is alive.
        if !self.hold.is_zero() {
            self.hold_deadline = Instant::now() + self.hold;
        }
        let unexpected_in = match self.state {
            SessionState::OpenSent => 1,
            SessionState::OpenConfirm => 2,
            _ => 3,
        };
        match (self.state, message) {
            (SessionState::OpenSent, Message::Open(open)) => self.on_open(&open).await,
            (SessionState::OpenConfirm, Message::Keepalive) => {
                // Ours only: the status follows once the peer has our
                // KEEPALIVE (`PeerShared::await_confirmation`).
                self.state = SessionState::Established;
                self.established_at = Some(Instant::now());
                let hold = u16::try_from(self.hold.as_secs()).unwrap_or(u16::MAX);
                self.shared
                    .await_confirmation(&self.stream, self.addr(), hold);
                info!(
                    peer = %self.addr(),
                    remote_as = self.peer.remote_as,
                    hold_secs = self.hold.as_secs(),
                    ipv4 = self.v4,
                    ipv6 = self.v6,
                    graceful_restart = self.peer_gr && self.gr.is_some(),
                    "BGP session open; established once the peer acknowledges our KEEPALIVE"
                );
                self.defer_until = Instant::now() + self.local.graceful_restart.eor_defer_max;
                self.sync(desired).await
            }
            (SessionState::Established, Message::Keepalive) => Ok(()),
            (SessionState::Established, Message::Update) => {
                self.shared.lock().updates_received += 1;
                Ok(())
            }
            (SessionState::Established, Message::UpdateIgnored(why)) => {
                let first = {
                    let mut c = self.shared.lock();
                    c.updates_received += 1;
                    c.updates_ignored += 1;
                    c.updates_ignored == 1
                };
                // Once per session: a peer that sends the same broken
                // attribute in every UPDATE must not flood the log.
                if first {
                    warn!(
                        peer = %self.addr(),
                        error = %why,
                        "ignoring a malformed UPDATE (RFC 7606 treat-as-withdraw; lbd takes no routes); further ones are counted, not logged"
                    );
                }
                Ok(())
            }
            (SessionState::Established, Message::RouteRefresh) => {
                self.resend = true;
                self.sync(desired).await
            }
            (_, other) => {
                let kind = other.type_code();
                let state = self.state;
                Err(self
                    .fail(
                        Notification::unexpected(unexpected_in, kind),
                        format!("message type {kind} in {state}"),
                    )
                    .await)
            }
        }
    }

    async fn on_open(&mut self, open: &BgpOpenMessage) -> Result<(), End> {
        let peer_as = open.my_asn4();
        if peer_as != self.peer.remote_as {
            let detail = format!(
                "the peer is AS {peer_as}, configured as AS {}",
                self.peer.remote_as
            );
            return Err(self
                .fail(Notification::bad_peer_as(open.my_as()), detail)
                .await);
        }
        if !self.attrs.ebgp && open.bgp_id() == self.local.router_id {
            let detail = format!("internal peer has our router id {}", open.bgp_id());
            return Err(self
                .fail(Notification::bad_bgp_identifier(open.bgp_id()), detail)
                .await);
        }
        let capabilities = open.capabilities();
        let asn4 = capabilities
            .iter()
            .any(|c| matches!(c, BgpCapability::FourOctetAs(_)));
        self.peer_gr = capabilities
            .iter()
            .any(|c| matches!(c, BgpCapability::GracefulRestartCapability(_)));
        let families: Vec<AddressType> = capabilities
            .iter()
            .filter_map(|c| match c {
                BgpCapability::MultiProtocolExtensions(mp) => Some(mp.address_type()),
                _ => None,
            })
            .collect();
        // RFC 4760: a peer without multiprotocol capabilities speaks IPv4
        // unicast only.
        (self.v4, self.v6) = if families.is_empty() {
            (true, false)
        } else {
            (
                families.contains(&AddressType::Ipv4Unicast),
                families.contains(&AddressType::Ipv6Unicast),
            )
        };
        self.attrs.asn4 = asn4;
        self.decoder.set_asn4(asn4);
        self.shared.lock().families = [(self.v4, "ipv4"), (self.v6, "ipv6")]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string())
            .collect();
        self.hold = Duration::from_secs(u64::from(self.local.hold_time.min(open.hold_time())));
        if self.hold.is_zero() && self.local.hold_time > 0 {
            self.watch_with_tcp_keepalives();
        }
        self.hold_deadline = Instant::now() + self.hold;
        self.send_keepalive().await?;
        self.set_state(SessionState::OpenConfirm);
        Ok(())
    }

    /// The peer asked for no hold timer (hold time 0, which RFC 4271
    /// allows), so no KEEPALIVE will show it is gone: TCP keepalives at a
    /// third of our hold time watch the connection instead, so a peer that
    /// lost power ends the session (and what it says of our routes) after
    /// about twice our hold time, not never (`TCP_USER_TIMEOUT` too, for
    /// when data is in flight and no probe is sent).
    fn watch_with_tcp_keepalives(&self) {
        let third = Duration::from_secs(u64::from(self.local.hold_time).div_ceil(3));
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(third)
            .with_interval(third)
            .with_retries(3);
        // Keepalive probes stop while data waits to be acknowledged (a
        // route change sent to a peer that lost power): the user timeout
        // ends the connection then, after twice our hold time.
        let sock = socket2::SockRef::from(&self.stream);
        let set = sock.set_tcp_keepalive(&keepalive).and_then(|()| {
            sock.set_tcp_user_timeout(Some(Duration::from_secs(
                2 * u64::from(self.local.hold_time),
            )))
        });
        match set {
            Ok(()) => info!(
                peer = %self.addr(),
                "the peer asked for no hold timer: TCP keepalives watch the connection instead"
            ),
            Err(e) => warn!(
                peer = %self.addr(),
                "the peer asked for no hold timer, and TCP keepalives could not be set ({e}): a dead peer will not be noticed"
            ),
        }
    }

    /// The next hop for `vip` on this session, or why there is none.
    fn next_hop(&self, vip: IpAddr) -> Result<IpAddr, &'static str> {
        let local = self.stream.local_addr().map(|a| a.ip()).ok();
        match vip {
            IpAddr::V4(_) if !self.v4 => Err("the peer did not offer IPv4 unicast"),
            IpAddr::V6(_) if !self.v6 => Err("the peer did not offer IPv6 unicast"),
            // A peer's own next hop first, then the session's own
            // address, then the speaker's setting for the other family.
            IpAddr::V4(_) => match (self.peer.next_hop_v4, local) {
                (Some(nh), _) => Ok(nh.into()),
                (None, Some(IpAddr::V4(a))) => Ok(a.into()),
                _ => self
                    .local
                    .next_hop_v4
                    .map(IpAddr::from)
                    .ok_or("the session is over IPv6 and next_hop_v4 is not set"),
            },
            IpAddr::V6(_) => match (self.peer.next_hop_v6, local) {
                (Some(nh), _) => Ok(nh.into()),
                (None, Some(IpAddr::V6(a))) => Ok(a.into()),
                _ => self
                    .local
                    .next_hop_v6
                    .map(IpAddr::from)
                    .ok_or("the session is over IPv4 and next_hop_v6 is not set"),
            },
        }
    }

    /// The UPDATEs that take the peer from `current` to `wanted`:
    /// withdrawals first, then announcements.
    /// The UPDATEs that take the peer from `adj_out` to `carried`; after
    /// [`Self::resend`], withdrawals of what is no longer carried and then
    /// every carried route again.
    fn route_updates(
        &mut self,
        carried: &BTreeSet<IpAddr>,
    ) -> Result<Vec<Vec<u8>>, wire::WireError> {
        if !std::mem::take(&mut self.resend) {
            return self.updates(&self.adj_out, carried);
        }
        let kept = self.adj_out.intersection(carried).copied().collect();
        let mut out = self.updates(&self.adj_out, &kept)?;
        out.extend(self.updates(&BTreeSet::new(), carried)?);
        Ok(out)
    }

    fn updates(
        &self,
        current: &BTreeSet<IpAddr>,
        wanted: &BTreeSet<IpAddr>,
    ) -> Result<Vec<Vec<u8>>, wire::WireError> {
        let d = diff(current, wanted);
        let (w4, w6) = split(&d.withdraw);
        let (a4, a6) = split(&d.announce);
        let mut out = wire::withdraw_v4(&w4)?;
        out.extend(wire::withdraw_v6(&w6)?);
        if let Some(&first) = a4.first()
            && let Ok(IpAddr::V4(nh)) = self.next_hop(first.into())
        {
            out.extend(wire::announce_v4(&self.attrs, nh, &a4)?);
        }
        if let Some(&first) = a6.first()
            && let Ok(IpAddr::V6(nh)) = self.next_hop(first.into())
        {
            out.extend(wire::announce_v6(&self.attrs, nh, &a6)?);
        }
        Ok(out)
    }

    async fn send_update(&mut self, message: &[u8]) -> Result<(), End> {
        self.send(message).await?;
        self.shared.lock().updates_sent += 1;
        self.restart_keepalive_timer();
        Ok(())
    }

    /// Brings the peer's routes from us to the desired set (then, once,
    /// End-of-RIB), unless they are held back after a restart.
    async fn sync(&mut self, desired: &mut DesiredRx) -> Result<(), End> {
        let want = Arc::clone(&desired.borrow_and_update());
        let deferring = self.deferring(desired);
        self.publish_gr(deferring);
        if deferring {
            return Ok(());
        }
        self.synced = true;
        let shutdown =
            (want.shutdown && self.local.graceful_shutdown).then_some(self.peer.graceful_shutdown);
        if shutdown != self.attrs.shutdown {
            // New attributes for every route: announce them all again.
            self.attrs.shutdown = shutdown;
            self.resend = true;
            self.shared.lock().graceful_shutdown = shutdown.is_some();
            info!(peer = %self.addr(), on = shutdown.is_some(), "graceful shutdown (GRACEFUL_SHUTDOWN community)");
        }
        let mut carried = BTreeSet::new();
        let mut skipped = BTreeSet::new();
        let mut withheld = Vec::new();
        let mut reason = "";
        for &vip in want.prefixes.iter() {
            match self.next_hop(vip) {
                Ok(_) => {
                    carried.insert(vip);
                }
                Err(why) => {
                    skipped.insert(vip);
                    withheld.push((vip, why.to_string()));
                    reason = why;
                }
            }
        }
        let messages = match self.route_updates(&carried) {
            Ok(m) => m,
            Err(e) => {
                return Err(self
                    .fail(Notification::cease(), format!("internal error: {e}"))
                    .await);
            }
        };
        let changes = diff(&self.adj_out, &carried);
        for m in &messages {
            self.send_update(m).await?;
        }
        if !changes.is_empty() {
            debug!(
                peer = %self.addr(),
                announced = changes.announce.len(),
                withdrawn = changes.withdraw.len(),
                updates = messages.len(),
                "routes sent"
            );
        }
        self.adj_out = carried;
        {
            let mut c = self.shared.lock();
            c.prefixes = self.adj_out.len();
            c.carried = self.adj_out.clone();
            c.withheld = withheld;
        }
        if !self.end_of_rib_sent && self.peer_gr && self.gr.is_some() {
            self.send_end_of_rib().await?;
        }
        if !skipped.is_empty() && skipped != self.skipped {
            let message = format!(
                "{} VIP(s) not announced to this peer ({}): {reason}",
                skipped.len(),
                skipped
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            warn!(peer = %self.addr(), "{message}");
            self.shared.error(message);
        }
        self.skipped = skipped;
        Ok(())
    }
}

impl Session<'_> {
    /// End-of-RIB for each family the peer takes (RFC 4724 §2).
    async fn send_end_of_rib(&mut self) -> Result<(), End> {
        if self.v4 {
            self.send_update(&wire::end_of_rib_v4()).await?;
        }
        if self.v6 {
            self.send_update(&wire::end_of_rib_v6()).await?;
        }
        self.end_of_rib_sent = true;
        self.publish_gr(false);
        info!(peer = %self.addr(), routes = self.adj_out.len(), "End-of-RIB sent");
        Ok(())
    }
}

/// Waits for the BFD session to change; its new state. Never without
/// one.
async fn bfd_changed(bfd: &mut Option<BfdLink>) -> bool {
    match bfd {
        Some(link) => {
            if link.up.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            *link.up.borrow_and_update()
        }
        None => std::future::pending().await,
    }
}

fn split(set: &BTreeSet<IpAddr>) -> (Vec<Ipv4Addr>, Vec<Ipv6Addr>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for ip in set {
        match ip {
            IpAddr::V4(a) => v4.push(*a),
            IpAddr::V6(a) => v6.push(*a),
        }
    }
    (v4, v6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_at_most_25_percent_jitter() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let mut steps = Vec::new();
        for _ in 0..8 {
            steps.push(b.next_delay());
        }
        for (d, nominal) in steps.iter().zip([1u64, 2, 4, 8, 16, 30, 30, 30]) {
            let nominal = Duration::from_secs(nominal);
            assert!(
                *d <= nominal && *d >= nominal.mul_f64(0.75),
                "{d:?} outside [{:?}, {nominal:?}]",
                nominal.mul_f64(0.75)
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn sessions_that_die_at_once_do_not_reset_the_backoff() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        // Established, then reset by the peer within a second, five times:
        // the waits keep doubling (each at least 75% of its step).
        let mut waits = Vec::new();
        for _ in 0..5 {
            b.session_ended(Some(Duration::from_millis(300)));
            waits.push(b.next_delay());
        }
        for (w, step) in waits.iter().zip([1u64, 2, 4, 8, 16]) {
            assert!(*w >= Duration::from_secs(step).mul_f64(0.75), "{waits:?}");
        }
        // A session that worked for a while starts the backoff over.
        b.session_ended(Some(STABLE_SESSION));
        assert!(b.next_delay() <= Duration::from_secs(1));
        b.session_ended(None);
        assert!(b.next_delay() >= Duration::from_millis(1500));
    }

    /// What the backoff is told of a session: how long it was
    /// Established, measured from then, or that it never was.
    #[tokio::test]
    async fn a_session_says_how_long_it_was_established() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let local = Local {
            local_as: 65001,
            router_id: Ipv4Addr::new(10, 0, 0, 11),
            hold_time: 3,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(1),
            next_hop_v4: None,
            next_hop_v6: None,
            graceful_restart: GracefulRestart::default(),
            graceful_shutdown: false,
            restarted: false,
            fresh: false,
        };
        let peer = PeerConfig::new(Ipv4Addr::LOCALHOST.into(), 65000);
        let shared = PeerShared::default();
        let mut session = Session::new(&local, &peer, &shared, stream);
        assert_eq!(session.established_for(), None);
        session.established_at = Some(Instant::now() - STABLE_SESSION);
        let d = session.established_for().expect("it was established");
        assert!(d >= STABLE_SESSION, "{d:?}");
    }

    #[test]
    fn jitter_varies() {
        let samples: BTreeSet<u64> = (0..20).map(|_| random_unit().to_bits()).collect();
        assert!(samples.len() > 10, "random_unit repeats: {samples:?}");
        assert!(
            (0..1000)
                .map(|_| random_unit())
                .all(|x| (0.0..1.0).contains(&x))
        );
    }
}

/// A session that ended in silence (the hold timer, a close, a read that
/// failed), not in a NOTIFICATION naming a cause: only then may a router
/// that drops our segments (GTSM, a filter) be why, and the hint say so.
/// A NOTIFICATION from the peer proves it got them; one of ours other
/// than the hold timer's names the cause itself (a wrong `remote_as`
/// was told to look at GTSM, helper-36).
fn silent_end(reason: &str) -> bool {
    if reason.starts_with("the peer sent NOTIFICATION") {
        return false;
    }
    !reason.starts_with("sent NOTIFICATION") || reason.starts_with("sent NOTIFICATION 4/")
}

#[cfg(test)]
mod silence_tests {
    use super::*;

    /// The GTSM hint follows silence only, in the reasons as `fail` and
    /// `on_message` write them.
    #[test]
    fn only_a_silent_end_may_be_gtsm() {
        let sent = |n: Notification| format!("sent NOTIFICATION {n}: x");
        assert!(silent_end(&sent(Notification::hold_timer_expired())));
        assert!(silent_end("the peer closed the connection"));
        assert!(
            !silent_end(&sent(Notification::new(2, 2, []))),
            "bad peer AS"
        );
        assert!(!silent_end(&format!(
            "the peer sent NOTIFICATION {}",
            Notification::new(2, 2, [])
        )));
    }
}

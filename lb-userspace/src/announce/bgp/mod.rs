//! The built-in BGP speaker: originate-only BGP-4 (RFC 4271) with
//! multiprotocol IPv4/IPv6 unicast (RFC 4760) and 4-octet AS numbers
//! (RFC 6793), one outgoing session per configured router.
//!
//! [`BgpSpeaker`] owns the desired set of VIPs and one task per peer
//! ([`session`]); every session announces each VIP as a host route with
//! itself as the next hop (the session's local address; for the other
//! family, the configured `next_hop_v4`/`next_hop_v6`) and attributes that
//! are identical on every balancer, so routers merge the balancers' routes
//! into one ECMP route. Routes the routers send are parsed far enough to
//! be checked and then dropped: nothing here touches the kernel's routing
//! table. It never listens for connections.
//!
//! Encoding and parsing live in [`wire`] (netgauze-bgp-pkt, see there why),
//! the configuration in `crate::config::announce::bgp`.

mod session;
mod sockopt;
pub mod wire;

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::Duration};

pub use self::session::Desired;

use futures::future::BoxFuture;
use tokio::{sync::watch, task::JoinHandle};
use tracing::info;

use self::session::{Local, PeerShared};
use super::{AnnounceError, Announcer, PeerStatus, StartContext, check_prefixes};
pub use crate::config::announce::bgp::{BgpConfig, ConnectRetry, GracefulRestart, PeerConfig};
use crate::{
    bfd::{BfdLink, BfdPeer, BfdSessions},
    config::ConfigErrors,
};

/// How long [`Announcer::shutdown`] waits for the sessions to withdraw,
/// send Cease and close before it abandons them.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

struct Peer {
    config: PeerConfig,
    shared: Arc<PeerShared>,
    bfd: Option<BfdLink>,
    task: Option<JoinHandle<()>>,
}

/// A running speaker. Dropping it stops the sessions (they still withdraw
/// and send Cease while the runtime lives); [`Announcer::shutdown`] also
/// waits for that.
pub struct BgpSpeaker {
    desired: watch::Sender<Arc<Desired>>,
    /// `true` stops the sessions; so does dropping it, with the speaker
    /// (`session::stopped` ends when the channel closes).
    stop: watch::Sender<bool>,
    peers: Vec<Peer>,
    shut_down: bool,
    graceful_shutdown: Option<Duration>,
    /// Reads the BFD sessions' state while the speaker runs.
    _bfd: Option<BfdSessions>,
}

impl BgpSpeaker {
    /// Validates `config` and starts one session task per peer on the
    /// current tokio runtime. Nothing is announced until
    /// [`Announcer::set_announced`].
    pub fn start(config: BgpConfig) -> Result<Self, AnnounceError> {
        Self::start_with(config, &StartContext::default())
    }

    /// [`start`](Self::start) with `lbd`'s BFD maps and restart state.
    pub fn start_with(config: BgpConfig, ctx: &StartContext) -> Result<Self, AnnounceError> {
        let mut errors = config.validate();
        errors.extend(config.check_files());
        if !errors.is_empty() {
            return Err(ConfigErrors {
                source_name: None,
                errors: super::prefixed("bgp", errors),
            }
            .into());
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| AnnounceError::NoRuntime { announcer: "bgp" })?;
        let local = Arc::new(Local {
            local_as: config.local_as,
            router_id: config.router_id,
            hold_time: config.hold_time_secs(),
            retry_initial: config.connect_retry.initial,
            retry_max: config.connect_retry.max,
            next_hop_v4: config.next_hop_v4,
            next_hop_v6: config.next_hop_v6,
            graceful_restart: config.graceful_restart.clone(),
            graceful_shutdown: config.graceful_shutdown.is_some(),
            restarted: ctx.restarted,
            fresh: ctx.fresh,
        });
        let bfd = start_bfd(&config, ctx)?;
        let (desired, desired_rx) = watch::channel(Arc::new(Desired::default()));
        let (stop, stop_rx) = watch::channel(false);
        let mut next_bfd = 0;
        let peers = config
            .peers
            .into_iter()
            .map(|peer| {
                let shared = Arc::new(PeerShared::default());
                let link = match (&bfd, peer.bfd) {
                    (Some(sessions), Some(_)) => {
                        next_bfd += 1;
                        Some(sessions.link(next_bfd - 1))
                    }
                    _ => None,
                };
                let task = runtime.spawn(session::run_peer(
                    Arc::clone(&local),
                    peer.clone(),
                    Arc::clone(&shared),
                    desired_rx.clone(),
                    stop_rx.clone(),
                    link.clone(),
                ));
                Peer {
                    config: peer,
                    shared,
                    bfd: link,
                    task: Some(task),
                }
            })
            .collect::<Vec<_>>();
        info!(
            local_as = local.local_as,
            router_id = %local.router_id,
            peers = peers.len(),
            "BGP speaker started"
        );
        Ok(Self {
            desired,
            stop,
            peers,
            shut_down: false,
            graceful_shutdown: config.graceful_shutdown.map(|g| g.wait),
            _bfd: bfd,
        })
    }

    fn update_desired(&self, f: impl FnOnce(&mut Desired)) {
        self.desired.send_if_modified(|current| {
            let mut next = (**current).clone();
            f(&mut next);
            if next == **current {
                return false;
            }
            *current = Arc::new(next);
            true
        });
    }
}

/// The BFD sessions of the peers that ask for one, in peer order.
fn start_bfd(config: &BgpConfig, ctx: &StartContext) -> Result<Option<BfdSessions>, AnnounceError> {
    let peers: Vec<BfdPeer> = config
        .peers
        .iter()
        .filter_map(|p| {
            p.bfd.map(|timers| BfdPeer {
                peer: p.address,
                local: p.local_address,
                timers,
            })
        })
        .collect();
    if peers.is_empty() {
        return Ok(None);
    }
    let Some(table) = &ctx.bfd else {
        return Err(crate::bfd::BfdError::NoMaps.into());
    };
    Ok(Some(crate::bfd::start(Arc::clone(table), peers)?))
}

impl Announcer for BgpSpeaker {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        if self.shut_down {
            return Err(AnnounceError::ShutDown);
        }
        check_prefixes(prefixes)?;
        self.update_desired(|d| d.prefixes.clone_from(prefixes));
        Ok(())
    }

    fn set_settled(&mut self, settled: bool) {
        self.update_desired(|d| d.settled = settled);
    }

    fn graceful_shutdown_wait(&self) -> Option<Duration> {
        self.graceful_shutdown
    }

    fn set_graceful_shutdown(&mut self, on: bool) {
        let on = on && self.graceful_shutdown.is_some();
        self.update_desired(|d| d.shutdown = on);
    }

    fn status(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let mut s = p.shared.status(&p.config);
                s.bfd = p.bfd.as_ref().map(BfdLink::status);
                s
            })
            .collect()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async move {
            self.shut_down = true;
            let _ = self.stop.send(true);
            let deadline = tokio::time::Instant::now() + SHUTDOWN_TIMEOUT;
            let mut abandoned = Vec::new();
            for peer in &mut self.peers {
                let Some(task) = peer.task.take() else {
                    continue;
                };
                let abort = task.abort_handle();
                if tokio::time::timeout_at(deadline, task).await.is_err() {
                    abort.abort();
                    peer.shared.set_idle();
                    abandoned.push(peer.config.socket_addr().to_string());
                }
            }
            if abandoned.is_empty() {
                info!("BGP speaker stopped");
                Ok(())
            } else {
                Err(AnnounceError::Shutdown(format!(
                    "sessions with {} did not close within {} s",
                    abandoned.join(", "),
                    SHUTDOWN_TIMEOUT.as_secs()
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    //! The speaker against a scripted peer on loopback: no root, no router.

    use std::{
        net::{IpAddr, Ipv4Addr},
        time::Duration,
    };

    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::{TcpListener, TcpStream},
        time::timeout,
    };

    use super::{wire::*, *};
    use crate::{announce::SessionState, config::announce::bgp::GracefulShutdown};

    fn config(port: u16, hold_secs: u64) -> BgpConfig {
        BgpConfig {
            local_as: 65001,
            router_id: Ipv4Addr::new(10, 0, 0, 11),
            hold_time: Duration::from_secs(hold_secs),
            connect_retry: ConnectRetry {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
            },
            next_hop_v4: None,
            next_hop_v6: None,
            graceful_restart: GracefulRestart::default(),
            graceful_shutdown: None,
            peers: vec![PeerConfig {
                port,
                ..PeerConfig::new(Ipv4Addr::LOCALHOST.into(), 65000)
            }],
        }
    }

    #[tokio::test]
    async fn each_peer_with_bfd_gets_a_session_of_its_own_and_the_others_none() {
        let mut cfg = config(1, 9);
        let peer = |addr: &str, bfd: bool| PeerConfig {
            port: 1,
            bfd: bfd.then(crate::config::announce::bgp::BfdTimers::default),
            ..PeerConfig::new(addr.parse().unwrap(), 65000)
        };
        cfg.peers = vec![
            peer("127.0.0.2", false),
            peer("127.0.0.3", true),
            peer("127.0.0.4", true),
        ];
        let table = Arc::new(crate::bfd::FakeBfdTable::default());
        let ctx = StartContext {
            bfd: Some(table),
            ..StartContext::default()
        };
        let speaker = BgpSpeaker::start_with(cfg, &ctx).expect("starts");
        let rows = speaker.status();
        let bfd: Vec<_> = rows
            .iter()
            .map(|r| r.bfd.as_ref().map(|b| b.local_disc))
            .collect();
        assert_eq!(bfd[0], None, "{rows:?}");
        let (a, b) = (bfd[1].expect("a session"), bfd[2].expect("a session"));
        assert_ne!(a, b, "one session each");
    }

    /// A speaker whose one peer (hold time 30 s, a fresh loopback
    /// listener) has BFD, on a fake BFD table: the listener, the table,
    /// the speaker.
    async fn speaker_with_bfd() -> (TcpListener, Arc<crate::bfd::FakeBfdTable>, BgpSpeaker) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = config(listener.local_addr().unwrap().port(), 30);
        cfg.peers[0].bfd = Some(crate::config::announce::bgp::BfdTimers::default());
        let table = Arc::new(crate::bfd::FakeBfdTable::default());
        let ctx = StartContext {
            bfd: Some(Arc::clone(&table) as Arc<dyn crate::bfd::BfdTable>),
            ..StartContext::default()
        };
        let speaker = BgpSpeaker::start_with(cfg, &ctx).expect("starts");
        (listener, table, speaker)
    }

    /// BFD (RFC 9384): a session whose BFD session goes down after being
    /// up ends with Cease, subcode 10 (BFD Down). The next session, begun
    /// with BFD still down, is not ended by that old news: BFD down only
    /// counts once it was up in the same session.
    #[tokio::test]
    async fn bfd_down_after_up_ends_the_session_and_only_then() {
        use lb_common::{
            BfdState,
            bfd::{STATE_DOWN, STATE_UP},
        };
        let (listener, table, mut speaker) = speaker_with_bfd().await;
        let bfd = |state: u8| BfdState {
            state,
            // Never silent for as long as the test runs.
            detect_ns: 600_000_000_000,
            ..BfdState::default()
        };
        let (mut sock, _) = open_with_any(&listener, 30).await;
        wait_for_state(&speaker, SessionState::Established).await;
        table.put_state(0, bfd(STATE_UP));
        wait_for(&speaker, "BFD up", |s| s.bfd.as_ref().is_some_and(|b| b.up)).await;
        // The peer says Down (it stopped hearing us).
        table.put_state(
            0,
            BfdState {
                state: STATE_DOWN,
                remote_state: STATE_DOWN,
                ..bfd(STATE_DOWN)
            },
        );
        let next = after_keepalives(&mut sock).await;
        assert_eq!(next, Notification::new(wire::CEASE, 10, []).encode());
        let s = wait_for(&speaker, "the session ended", |s| {
            s.state != SessionState::Established
        })
        .await;
        assert!(s.last_error.unwrap().contains("BFD session went down"));
        // Again, BFD down all along: the session is established and stays.
        let (mut sock, _) = open_with_any(&listener, 30).await;
        wait_for_state(&speaker, SessionState::Established).await;
        let mut rest = [0u8; 64];
        let quiet = timeout(Duration::from_millis(300), sock.read(&mut rest)).await;
        assert!(quiet.is_err(), "nothing but silence: {quiet:?}");
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!(s.sessions_established, 2);
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// RFC 5882 §3.2: the peer taking its BFD session administratively
    /// down (AdminDown) is no failure of the path: the BGP session stays.
    /// Once BFD is back up, a real failure (the peer says Down) ends the
    /// session as before.
    #[tokio::test]
    async fn the_peers_bfd_admin_down_keeps_the_session_and_a_failure_after_does_not() {
        use lb_common::{
            BfdState,
            bfd::{DIAG_NEIGHBOR_DOWN, STATE_ADMIN_DOWN, STATE_DOWN, STATE_UP},
        };
        let (listener, table, mut speaker) = speaker_with_bfd().await;
        let bfd = |state: u8, remote_state: u8| BfdState {
            state,
            remote_state,
            diag: if state == STATE_UP {
                0
            } else {
                DIAG_NEIGHBOR_DOWN
            },
            detect_ns: 600_000_000_000,
            ..BfdState::default()
        };
        let (mut sock, _) = open_with_any(&listener, 30).await;
        wait_for_state(&speaker, SessionState::Established).await;
        table.put_state(0, bfd(STATE_UP, STATE_UP));
        wait_for(&speaker, "BFD up", |s| s.bfd.as_ref().is_some_and(|b| b.up)).await;
        table.put_state(0, bfd(STATE_DOWN, STATE_ADMIN_DOWN));
        wait_for(&speaker, "BFD down", |s| {
            s.bfd.as_ref().is_some_and(|b| !b.up)
        })
        .await;
        let quiet = timeout(Duration::from_millis(500), after_keepalives(&mut sock)).await;
        assert!(quiet.is_err(), "no NOTIFICATION: {quiet:?}");
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!(s.sessions_established, 1);
        table.put_state(0, bfd(STATE_UP, STATE_UP));
        wait_for(&speaker, "BFD up again", |s| {
            s.bfd.as_ref().is_some_and(|b| b.up)
        })
        .await;
        table.put_state(0, bfd(STATE_DOWN, STATE_DOWN));
        let next = after_keepalives(&mut sock).await;
        assert_eq!(next, Notification::new(wire::CEASE, 10, []).encode());
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// The counters `lbctl bgp` shows, each message counted once: ours
    /// (OPEN, KEEPALIVE), the peer's (OPEN, KEEPALIVE, three UPDATEs of
    /// which one is malformed and ignored).
    #[tokio::test]
    async fn each_message_is_counted_once() {
        let (listener, mut speaker) = speaker_with_peer(30).await;
        let (mut sock, _) = open_with_any(&listener, 30).await;
        wait_for_state(&speaker, SessionState::Established).await;
        // ORIGIN 7 (no such origin): treat-as-withdraw.
        #[rustfmt::skip]
        let bad_origin = [
            0, 0, 0, 14, 0x40, 1, 1, 7, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1,
            32, 10, 99, 0, 1,
        ];
        let bad = message(TYPE_UPDATE, &bad_origin);
        for m in [end_of_rib_v4(), bad, end_of_rib_v6()] {
            sock.write_all(&m).await.unwrap();
        }
        let s = wait_for(&speaker, "three UPDATEs", |s| s.updates_received == 3).await;
        assert_eq!(s.updates_ignored, 1, "{s:?}");
        assert_eq!((s.messages_received, s.messages_sent), (5, 2), "{s:?}");
        assert_eq!((s.updates_sent, s.sessions_established), (0, 1), "{s:?}");
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// RFC 6608: a message the FSM does not expect gets a NOTIFICATION
    /// whose subcode names the state (1 OpenSent, 2 OpenConfirm, 3
    /// Established) and whose data is the message type. And however a
    /// session fails, the peer sees our NOTIFICATION and then FIN, not a
    /// reset: what it sent after the error is read and dropped first.
    #[tokio::test]
    async fn unexpected_messages_name_the_state_and_a_failure_closes_cleanly() {
        let (listener, mut speaker) = speaker_with_peer(30).await;
        let peer_open = wire::open(65000, 30, Ipv4Addr::new(10, 0, 0, 1), None).unwrap();
        // A KEEPALIVE before the peer's OPEN: unexpected in OpenSent.
        let (mut sock, _) = accepted(&listener).await;
        sock.write_all(&keepalive()).await.unwrap();
        assert_eq!(
            frame(&mut sock).await,
            Notification::unexpected(1, 4).encode()
        );
        // An UPDATE before the peer's KEEPALIVE: unexpected in OpenConfirm.
        let (mut sock, _) = accepted(&listener).await;
        sock.write_all(&peer_open).await.unwrap();
        sock.write_all(&end_of_rib_v4()).await.unwrap();
        let next = after_keepalives(&mut sock).await;
        assert_eq!(next, Notification::unexpected(2, 2).encode());
        // Established, then a broken marker followed by 95 KB more than
        // the speaker reads at once. Unread bytes at its close would make
        // its kernel answer with a reset, which takes our socket out of
        // CLOSE_WAIT (the state a FIN leaves it in until we close).
        let (mut sock, _) = open_with_any(&listener, 30).await;
        wait_for_state(&speaker, SessionState::Established).await;
        let mut broken = keepalive();
        broken[0] = 0;
        for _ in 0..5000 {
            broken.extend(keepalive());
        }
        sock.write_all(&broken).await.expect("written");
        let mut rest = Vec::new();
        timeout(Duration::from_secs(5), sock.read_to_end(&mut rest))
            .await
            .expect("the speaker closes")
            .expect("a FIN, not a reset");
        let want = Notification::new(1, 1, []).encode();
        assert!(rest.ends_with(&want), "{rest:?}");
        // Past the speaker's linger (500 ms): still CLOSE_WAIT, no reset.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ends = (sock.local_addr().unwrap(), sock.peer_addr().unwrap());
        assert_eq!(
            tcp_state(ends.0.port(), ends.1.port()),
            Some(0x08),
            "CLOSE_WAIT"
        );
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// The kernel's state of the loopback connection from local port
    /// `local` to `remote` (`/proc/net/tcp`, its `st` column), if the
    /// kernel still has it.
    fn tcp_state(local: u16, remote: u16) -> Option<u8> {
        tcp_field(local, remote, 3)
    }

    /// Field `i` of `/proc/net/tcp`'s row of the loopback connection from
    /// local port `local` to `remote` (its part before a `:`), in hex.
    fn tcp_field(local: u16, remote: u16, i: usize) -> Option<u8> {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let ends = [
            format!("0100007F:{local:04X}"),
            format!("0100007F:{remote:04X}"),
        ];
        table.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let field = f.get(i)?.split(':').next()?;
            (f.get(1..3)? == ends).then(|| u8::from_str_radix(field, 16).ok())?
        })
    }

    /// A message of `msg_type` with `body`, its header written out.
    fn message(msg_type: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![0xff; 16];
        m.extend_from_slice(&((HEADER_LEN + body.len()) as u16).to_be_bytes());
        m.push(msg_type);
        m.extend_from_slice(body);
        m
    }

    /// The next message that is not a KEEPALIVE.
    async fn after_keepalives(sock: &mut TcpStream) -> Vec<u8> {
        loop {
            let next = frame(sock).await;
            if next != keepalive() {
                return next;
            }
        }
    }

    /// A speaker whose one peer (hold time `hold`) is a listener on a
    /// fresh loopback port, and that listener.
    async fn speaker_with_peer(hold: u64) -> (TcpListener, BgpSpeaker) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let speaker = BgpSpeaker::start(config(port, hold)).expect("starts");
        (listener, speaker)
    }

    /// Accepts the speaker's connection within 5 s and reads its OPEN.
    async fn accepted(listener: &TcpListener) -> (TcpStream, Vec<u8>) {
        let (mut sock, _) = timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("the speaker connects")
            .expect("accept");
        let open = frame(&mut sock).await;
        (sock, open)
    }

    /// Reads one whole message (header included) within 5 s.
    async fn frame(sock: &mut TcpStream) -> Vec<u8> {
        timeout(Duration::from_secs(5), async {
            let mut msg = vec![0u8; HEADER_LEN];
            sock.read_exact(&mut msg).await.expect("header");
            let len = usize::from(u16::from_be_bytes([msg[16], msg[17]]));
            msg.resize(len, 0);
            sock.read_exact(&mut msg[HEADER_LEN..]).await.expect("body");
            msg
        })
        .await
        .expect("a message within 5 s")
    }

    /// Accepts the speaker's connection and completes OPEN/KEEPALIVE.
    async fn establish(listener: &TcpListener, peer_hold: u16) -> TcpStream {
        let (sock, open) = open_with_any(listener, peer_hold).await;
        assert_eq!(
            open,
            wire::open(65001, 3, Ipv4Addr::new(10, 0, 0, 11), None).unwrap()
        );
        sock
    }

    /// Accepts the speaker's connection and completes OPEN/KEEPALIVE
    /// whatever its OPEN said; returns that too.
    async fn open_with_any(listener: &TcpListener, peer_hold: u16) -> (TcpStream, Vec<u8>) {
        let (mut sock, open) = accepted(listener).await;
        sock.write_all(&wire::open(65000, peer_hold, Ipv4Addr::new(10, 0, 0, 1), None).unwrap())
            .await
            .unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        assert_eq!(
            frame(&mut sock).await,
            keepalive(),
            "KEEPALIVE confirms our OPEN"
        );
        (sock, open)
    }

    async fn wait_for_state(speaker: &BgpSpeaker, state: SessionState) -> PeerStatus {
        wait_for(speaker, &format!("reached {state}"), |s| s.state == state).await
    }

    #[tokio::test]
    async fn announces_withdraws_and_ceases() {
        let (listener, mut speaker) = speaker_with_peer(3).await;
        let vip: IpAddr = "10.99.0.1".parse().unwrap();
        let vip6: IpAddr = "fd00:99::1".parse().unwrap();
        speaker
            .set_announced(&[vip, vip6].into_iter().collect())
            .unwrap();

        let mut sock = establish(&listener, 9).await;
        // The IPv4 VIP, next hop self; the IPv6 one has no next hop on an
        // IPv4 session without next_hop_v6.
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        let want =
            announce_v4(&attrs, Ipv4Addr::LOCALHOST, &[Ipv4Addr::new(10, 99, 0, 1)]).unwrap();
        assert_eq!(vec![frame(&mut sock).await], want);
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!(s.hold_time_secs, Some(3), "min(3, 9)");
        assert_eq!((s.prefixes_announced, s.sessions_established), (1, 1));
        assert!(
            s.last_error
                .as_deref()
                .unwrap_or("")
                .contains("next_hop_v6 is not set"),
            "{s:?}"
        );

        // Keepalives at a third of the hold time.
        let started = tokio::time::Instant::now();
        assert_eq!(frame(&mut sock).await, keepalive());
        let gap = started.elapsed();
        assert!(
            gap <= Duration::from_millis(1500),
            "keepalive after {gap:?}"
        );

        speaker
            .set_announced(&[vip6].into_iter().collect())
            .unwrap();
        let next = after_keepalives(&mut sock).await;
        assert_eq!(
            vec![next],
            withdraw_v4(&[Ipv4Addr::new(10, 99, 0, 1)]).unwrap()
        );

        // Back on, then shutdown: withdrawal, then Cease, then FIN.
        speaker.set_announced(&[vip].into_iter().collect()).unwrap();
        let next = after_keepalives(&mut sock).await;
        assert_eq!(vec![next], want);
        speaker.shutdown().await.expect("clean shutdown");
        let mut rest = Vec::new();
        timeout(Duration::from_secs(5), sock.read_to_end(&mut rest))
            .await
            .expect("the speaker closes")
            .expect("read");
        let mut d = Decoder::new();
        d.set_asn4(true);
        d.extend(&rest);
        let mut got = Vec::new();
        while let Some(m) = d.next_message().expect("well-formed") {
            got.push(m);
        }
        got.retain(|m| *m != Message::Keepalive);
        assert_eq!(
            got,
            [
                Message::Update,
                Message::Notification(Notification::cease())
            ]
        );
        let withdrawal = withdraw_v4(&[Ipv4Addr::new(10, 99, 0, 1)])
            .unwrap()
            .remove(0);
        let mut tail = withdrawal;
        tail.extend(Notification::cease().encode());
        assert!(rest.ends_with(&tail), "{rest:?}");
        assert_eq!(speaker.status()[0].state, SessionState::Idle);
        assert!(speaker.set_announced(&BTreeSet::new()).is_err());
    }

    /// A peer that stops hearing us after our OPEN (a router with GTSM
    /// only on its side: the kernel drops our TTL-64 segments) sits in
    /// OpenConfirm; we must say OpenConfirm too, not Established, and say
    /// Established once the peer's TCP has our KEEPALIVE.
    #[tokio::test]
    async fn established_is_shown_only_once_the_peer_has_our_keepalive() {
        let (listener, mut speaker) = speaker_with_peer(30).await;
        let (mut sock, _) = accepted(&listener).await;
        // From now on our segments (TTL 64 on loopback) are dropped.
        let deaf = |sock: &TcpStream, hops| {
            sockopt::set_ttl_security(
                &socket2::SockRef::from(sock),
                Ipv4Addr::LOCALHOST.into(),
                hops,
            )
        };
        deaf(&sock, 1).expect("IP_MINTTL 255");
        sock.write_all(&wire::open(65000, 30, Ipv4Addr::new(10, 0, 0, 1), None).unwrap())
            .await
            .unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        let mut states = BTreeSet::new();
        for _ in 0..40 {
            let s = speaker.status().remove(0);
            states.insert(s.state.to_string());
            assert_ne!(s.state, SessionState::Established, "{s:?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(states.contains("OpenConfirm"), "{states:?}");
        // The peer hears us again: TCP retransmits, the KEEPALIVE lands.
        deaf(&sock, 255).expect("IP_MINTTL 1");
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!(s.sessions_established, 1);
        assert_eq!(frame(&mut sock).await, keepalive());
        speaker.shutdown().await.expect("clean shutdown");
    }

    async fn wait_for(
        speaker: &BgpSpeaker,
        what: &str,
        done: impl Fn(&PeerStatus) -> bool,
    ) -> PeerStatus {
        for _ in 0..250 {
            let s = speaker.status().remove(0);
            if done(&s) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never {what}: {:?}", speaker.status());
    }

    /// Why a session ended says whether the peer had confirmed it: one
    /// lost while the peer cannot hear us (after its OPEN, and after its
    /// KEEPALIVE with ours unacknowledged) names GTSM; one lost after the
    /// peer had our KEEPALIVE does not. What a session showed (hold time,
    /// the routes it carried and withheld) goes with it.
    #[tokio::test]
    async fn a_lost_session_says_whether_the_peer_had_confirmed_it() {
        let (listener, mut speaker) = speaker_with_peer(30).await;
        let (vip, vip6): (IpAddr, IpAddr) =
            ("10.99.0.1".parse().unwrap(), "fd00:99::1".parse().unwrap());
        speaker
            .set_announced(&[vip, vip6].into_iter().collect())
            .unwrap();
        let peer_open = || wire::open(65000, 30, Ipv4Addr::new(10, 0, 0, 1), None).unwrap();
        let unconfirmed = |s: &PeerStatus| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("never confirmed our OPEN"))
        };
        // 1. The peer's OPEN, then it goes away: lost in OpenConfirm.
        // Before the peer's OPEN, our OPEN is all we send (no KEEPALIVE
        // in OpenSent).
        let (mut sock, _) = accepted(&listener).await;
        let mut more = [0u8; 64];
        let quiet = timeout(Duration::from_millis(300), sock.read(&mut more)).await;
        assert!(quiet.is_err(), "nothing after our OPEN: {quiet:?}");
        sock.write_all(&peer_open()).await.unwrap();
        wait_for_state(&speaker, SessionState::OpenConfirm).await;
        drop(sock);
        let s = wait_for(&speaker, "lost in OpenConfirm", |s| {
            s.last_error.is_some() && s.state != SessionState::OpenConfirm
        })
        .await;
        assert!(unconfirmed(&s), "{s:?}");
        // 2. Its KEEPALIVE too, but it cannot hear ours (IP_MINTTL 255):
        // Established on our side only, shown as OpenConfirm; then lost.
        let (mut sock, _) = accepted(&listener).await;
        sockopt::set_ttl_security(
            &socket2::SockRef::from(&sock),
            Ipv4Addr::LOCALHOST.into(),
            1,
        )
        .expect("IP_MINTTL 255");
        sock.write_all(&peer_open()).await.unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        for _ in 0..10 {
            let s = wait_for_state(&speaker, SessionState::OpenConfirm).await;
            assert_eq!(s.sessions_established, 0, "{s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(sock);
        let s = wait_for(&speaker, "lost unconfirmed", |s| {
            s.state != SessionState::OpenConfirm && s.sessions_established == 0
        })
        .await;
        assert!(unconfirmed(&s), "{s:?}");
        // 3. A session the peer confirms, then loses: no word of GTSM.
        let (mut sock, _) = accepted(&listener).await;
        sock.write_all(&peer_open()).await.unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        let s = wait_for(&speaker, "carrying the VIP", |s| {
            s.state == SessionState::Established && s.carried == Some(vec![vip])
        })
        .await;
        assert_eq!((s.hold_time_secs, s.prefixes_announced), (Some(30), 1));
        assert_eq!(s.withheld.len(), 1, "{s:?}");
        assert_eq!(s.withheld[0].0, vip6);
        drop(sock);
        let s = wait_for(&speaker, "lost after confirmation", |s| {
            s.state != SessionState::Established
        })
        .await;
        assert_eq!(s.sessions_established, 1);
        // A FIN, or a reset for what the peer left unread.
        let why = s.last_error.clone().unwrap_or_default();
        let lost = why.contains("closed the connection") || why.contains("reset by peer");
        assert!(lost && !unconfirmed(&s), "{s:?}");
        assert_eq!(s.hold_time_secs, None, "{s:?}");
        assert_eq!((s.carried, s.withheld), (Some(vec![]), vec![]));
        speaker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn over_ipv6_ipv4_vips_take_next_hop_v4() {
        let listener = TcpListener::bind("[::1]:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut cfg = config(port, 3);
        cfg.peers[0].address = std::net::Ipv6Addr::LOCALHOST.into();
        cfg.next_hop_v4 = Some(Ipv4Addr::new(192, 0, 2, 11));
        let mut speaker = BgpSpeaker::start(cfg).expect("starts");
        let v4 = Ipv4Addr::new(10, 99, 0, 1);
        let v6: std::net::Ipv6Addr = "fd00:99::1".parse().unwrap();
        speaker
            .set_announced(&[IpAddr::from(v4), v6.into()].into_iter().collect())
            .unwrap();
        let mut sock = establish(&listener, 3).await;
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        let mut want = announce_v4(&attrs, Ipv4Addr::new(192, 0, 2, 11), &[v4]).unwrap();
        want.extend(announce_v6(&attrs, std::net::Ipv6Addr::LOCALHOST, &[v6]).unwrap());
        let got = vec![frame(&mut sock).await, frame(&mut sock).await];
        assert_eq!(got, want);
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!((s.prefixes_announced, s.last_error), (2, None));
        speaker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn a_peer_of_its_own_next_hop_gets_it_not_the_speakers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut cfg = config(port, 3);
        // The speaker-wide next hop is on another link; this peer has its
        // own.
        cfg.next_hop_v6 = Some("2001:db8:aaaa::11".parse().unwrap());
        cfg.peers[0].next_hop_v6 = Some("2001:db8:bbbb::11".parse().unwrap());
        let mut speaker = BgpSpeaker::start(cfg).expect("starts");
        let v6: std::net::Ipv6Addr = "fd00:99::1".parse().unwrap();
        speaker
            .set_announced(&[IpAddr::from(v6)].into_iter().collect())
            .unwrap();
        let mut sock = establish(&listener, 3).await;
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        let want = announce_v6(&attrs, "2001:db8:bbbb::11".parse().unwrap(), &[v6]).unwrap();
        assert_eq!(vec![frame(&mut sock).await], want);
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// The peer's OPEN: AS 65000, hold 30, BGP identifier `id`, and
    /// these capabilities, written out by hand.
    fn peer_open(id: [u8; 4], capabilities: &[u8]) -> Vec<u8> {
        let mut body = vec![4, 0xfd, 0xe8, 0, 30];
        body.extend_from_slice(&id);
        body.extend_from_slice(&[capabilities.len() as u8 + 2, 2, capabilities.len() as u8]);
        body.extend_from_slice(capabilities);
        message(TYPE_OPEN, &body)
    }

    /// Accepts the speaker, answers with `open` and a KEEPALIVE.
    async fn answer(listener: &TcpListener, open: &[u8]) -> TcpStream {
        let (mut sock, _) = accepted(listener).await;
        sock.write_all(open).await.unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        sock
    }

    const AS4_65000: [u8; 6] = [65, 4, 0, 0, 0xfd, 0xe8];

    /// A family the peer did not offer is withheld, with the reason; the
    /// other is announced, an IPv4 VIP with the peer's own next hop. The
    /// warning about a withheld VIP stays when nothing is withheld any
    /// more (it is not replaced by "0 VIPs").
    #[tokio::test]
    async fn a_family_the_peer_did_not_offer_is_withheld() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = config(listener.local_addr().unwrap().port(), 30);
        cfg.next_hop_v6 = Some("2001:db8:aaaa::11".parse().unwrap());
        cfg.peers[0].next_hop_v4 = Some(Ipv4Addr::new(10, 98, 0, 2));
        let mut speaker = BgpSpeaker::start(cfg).expect("starts");
        let (v4, v6): (IpAddr, IpAddr) =
            ("10.99.0.1".parse().unwrap(), "fd00:99::1".parse().unwrap());
        speaker
            .set_announced(&[v4, v6].into_iter().collect())
            .unwrap();
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        // IPv4 unicast only: the IPv6 VIP is withheld.
        let only_v4 = [&[1, 4, 0, 1, 0, 1][..], &AS4_65000].concat();
        let mut sock = answer(&listener, &peer_open([10, 0, 0, 1], &only_v4)).await;
        assert_eq!(frame(&mut sock).await, keepalive());
        let want = announce_v4(
            &attrs,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        );
        assert_eq!(vec![frame(&mut sock).await], want.unwrap());
        let s = wait_for(&speaker, "IPv4 carried", |s| s.carried == Some(vec![v4])).await;
        assert_eq!(
            (s.families.as_slice(), s.updates_sent),
            (&["ipv4".to_string()][..], 1)
        );
        let why = "the peer did not offer IPv6 unicast".to_string();
        assert_eq!(s.withheld, [(v6, why)]);
        // Nothing withheld any more: the last warning is not replaced.
        speaker.set_announced(&[v4].into_iter().collect()).unwrap();
        let s = wait_for(&speaker, "nothing withheld", |s| s.withheld.is_empty()).await;
        let last = s.last_error.unwrap_or_default();
        assert!(last.starts_with("1 VIP(s) not announced"), "{last}");
        drop(sock);
        // IPv6 unicast only: the IPv4 VIP is withheld.
        speaker
            .set_announced(&[v4, v6].into_iter().collect())
            .unwrap();
        let only_v6 = [&[1, 4, 0, 2, 0, 1][..], &AS4_65000].concat();
        let mut sock = answer(&listener, &peer_open([10, 0, 0, 1], &only_v6)).await;
        assert_eq!(frame(&mut sock).await, keepalive());
        let want = announce_v6(
            &attrs,
            "2001:db8:aaaa::11".parse().unwrap(),
            &["fd00:99::1".parse().unwrap()],
        );
        assert_eq!(vec![frame(&mut sock).await], want.unwrap());
        let s = wait_for(&speaker, "IPv6 carried", |s| s.carried == Some(vec![v6])).await;
        assert_eq!(s.families, ["ipv6"]);
        let why = "the peer did not offer IPv4 unicast".to_string();
        assert_eq!(s.withheld, [(v4, why)]);
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// RFC 4271 §6.2 and RFC 6286: an internal peer with our BGP
    /// identifier is refused (Bad BGP Identifier, the identifier as data);
    /// an internal peer with another, or an external one with ours, is
    /// not.
    #[tokio::test]
    async fn only_an_internal_peer_may_not_share_our_identifier() {
        let ours = [10, 0, 0, 11];
        for (remote_as, id, refused) in [
            (65001, ours, true),
            (65001, [10, 0, 0, 1], false),
            (65000, ours, false),
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut cfg = config(listener.local_addr().unwrap().port(), 30);
            cfg.peers[0].remote_as = remote_as;
            let mut speaker = BgpSpeaker::start(cfg).expect("starts");
            let mut open = peer_open(id, &AS4_65000);
            let asn = (remote_as as u16).to_be_bytes();
            (open[20], open[21]) = (asn[0], asn[1]);
            let n = open.len();
            (open[n - 2], open[n - 1]) = (asn[0], asn[1]);
            let mut sock = answer(&listener, &open).await;
            let got = frame(&mut sock).await;
            let what = format!("AS {remote_as}, identifier {id:?}");
            if refused {
                assert_eq!(got, Notification::new(2, 3, ours).encode(), "{what}");
            } else {
                assert_eq!(got, keepalive(), "{what}");
                wait_for_state(&speaker, SessionState::Established).await;
            }
            speaker.shutdown().await.expect("clean shutdown");
        }
    }

    #[tokio::test]
    async fn malformed_attributes_in_an_update_are_ignored_not_a_reset() {
        crate::test_logs::capture();
        let (listener, mut speaker) = speaker_with_peer(3).await;
        let mut sock = establish(&listener, 3).await;
        wait_for_state(&speaker, SessionState::Established).await;
        // A 3-byte COMMUNITIES, three times (as a router would resend it).
        let bad = message(
            TYPE_UPDATE,
            &[
                0, 0, 0, 20, 0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1, 0xc0, 8, 3, 1, 2,
                3, 32, 10, 99, 0, 1,
            ],
        );
        for _ in 0..3 {
            sock.write_all(&bad).await.unwrap();
        }
        // The session goes on: keepalives keep coming, no NOTIFICATION.
        for _ in 0..3 {
            let m = frame(&mut sock).await;
            assert_eq!(
                m,
                keepalive(),
                "the speaker answered a bad UPDATE with {m:?}"
            );
        }
        let s = speaker.status().remove(0);
        assert_eq!(s.state, SessionState::Established);
        assert_eq!((s.updates_ignored, s.sessions_established), (3, 1), "{s:?}");
        // Logged once, the others counted.
        let logged = crate::test_logs::lines("ignoring a malformed UPDATE");
        assert_eq!(logged.len(), 1, "{logged:?}");
        speaker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn a_silent_peer_gets_hold_timer_expired_and_a_new_session() {
        let (listener, mut speaker) = speaker_with_peer(3).await;
        let mut sock = establish(&listener, 3).await;
        wait_for_state(&speaker, SessionState::Established).await;
        // Say nothing; read what the speaker sends until it closes.
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        timeout(Duration::from_secs(6), sock.read_to_end(&mut rest))
            .await
            .expect("closed within the hold time")
            .expect("read");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(2500) && elapsed <= Duration::from_millis(4500),
            "closed after {elapsed:?}, hold time 3 s"
        );
        assert!(
            rest.ends_with(&Notification::hold_timer_expired().encode()),
            "{rest:?}"
        );
        // It comes back.
        let _again = establish(&listener, 3).await;
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert_eq!(s.sessions_established, 2);
        assert!(
            s.last_error
                .as_deref()
                .unwrap_or("")
                .contains("hold timer expired"),
            "{s:?}"
        );
        speaker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn a_wrong_peer_as_is_refused_with_bad_peer_as() {
        let (listener, mut speaker) = speaker_with_peer(3).await;
        let (mut sock, _) = accepted(&listener).await;
        sock.write_all(&wire::open(65099, 3, Ipv4Addr::new(10, 0, 0, 1), None).unwrap())
            .await
            .unwrap();
        let reply = frame(&mut sock).await;
        assert_eq!(reply, Notification::bad_peer_as(65099).encode());
        speaker.shutdown().await.expect("clean shutdown");
        let s = speaker.status().remove(0);
        assert!(
            s.last_error.as_deref().unwrap_or("").contains("AS 65099"),
            "{s:?}"
        );
    }

    /// The peer's OPEN with the graceful restart capability (restart time
    /// 120 s, IPv4 unicast), written out from RFC 4724 §3.
    fn open_with_gr() -> Vec<u8> {
        #[rustfmt::skip]
        let body = [
            4, 0xfd, 0xe8, 0, 3, 10, 0, 0, 1,
            22, 2, 20,
            1, 4, 0, 1, 0, 1,
            65, 4, 0, 0, 0xfd, 0xe8,
            64, 6, 0, 120, 0, 1, 1, 0,
        ];
        message(TYPE_OPEN, &body)
    }

    /// Accepts, checks that our OPEN offers `gr`, answers with GR.
    async fn establish_gr(listener: &TcpListener, gr: GracefulRestartOffer) -> TcpStream {
        let (mut sock, open) = accepted(listener).await;
        assert_eq!(
            open,
            wire::open(65001, 3, Ipv4Addr::new(10, 0, 0, 11), Some(gr)).unwrap()
        );
        sock.write_all(&open_with_gr()).await.unwrap();
        sock.write_all(&keepalive()).await.unwrap();
        assert_eq!(frame(&mut sock).await, keepalive());
        sock
    }

    /// The next message that is not a KEEPALIVE.
    async fn next_update(sock: &mut TcpStream) -> Vec<u8> {
        loop {
            let m = frame(sock).await;
            if m != keepalive() {
                return m;
            }
        }
    }

    fn gr_config(port: u16) -> BgpConfig {
        let mut c = config(port, 3);
        c.graceful_restart.mode = crate::config::announce::bgp::GracefulRestartMode::On;
        c.graceful_restart.eor_defer_max = Duration::from_secs(20);
        c
    }

    /// A speaker with graceful restart, started after a restart of `lbd`
    /// (it offers Restart State), and its one peer's listener.
    async fn restarted_speaker() -> (TcpListener, BgpSpeaker) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ctx = StartContext {
            restarted: true,
            ..StartContext::default()
        };
        let speaker = BgpSpeaker::start_with(gr_config(port), &ctx).expect("starts");
        (listener, speaker)
    }

    #[tokio::test]
    async fn after_a_restart_routes_and_end_of_rib_wait_for_the_first_verdicts() {
        let (listener, mut speaker) = restarted_speaker().await;
        let vip: IpAddr = "10.99.0.1".parse().unwrap();
        // What the policy says before the verdicts: nothing yet.
        speaker.set_announced(&BTreeSet::new()).unwrap();
        let gr = GracefulRestartOffer {
            restarting: true,
            restart_time: 30,
            forwarding: true,
        };
        let mut sock = establish_gr(&listener, gr).await;
        wait_for_state(&speaker, SessionState::Established).await;
        // Held back: a withdrawal-free, route-free second, no End-of-RIB.
        speaker.set_announced(&[vip].into_iter().collect()).unwrap();
        for _ in 0..2 {
            assert_eq!(
                frame(&mut sock).await,
                keepalive(),
                "nothing but keepalives while deferring"
            );
        }
        let s = speaker.status().remove(0);
        let g = s.graceful_restart.expect("graceful restart status");
        assert!(
            g.deferring && g.restarting && g.peer_supports && !g.end_of_rib_sent,
            "{g:?}"
        );
        // The verdicts are in: the route, then End-of-RIB.
        speaker.set_settled(true);
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        let want =
            announce_v4(&attrs, Ipv4Addr::LOCALHOST, &[Ipv4Addr::new(10, 99, 0, 1)]).unwrap();
        assert_eq!(vec![next_update(&mut sock).await], want);
        assert_eq!(next_update(&mut sock).await, end_of_rib_v4());
        // The graceful shutdown: the same route again, with the community.
        speaker.set_graceful_shutdown(true);
        assert!(speaker.graceful_shutdown_wait().is_none(), "not configured");
        assert!(
            !speaker.desired.borrow().shutdown,
            "not configured: no community"
        );
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// A speaker started fresh with graceful shutdown (a 5 s wait; the
    /// peer's MED `med` with it), announcing `vips` on an Established
    /// session with graceful restart: the routes and End-of-RIB read, the
    /// speaker, the peer's socket and the attributes they went with.
    async fn fresh_with_graceful_shutdown(
        med: Option<u32>,
        vips: &[Ipv4Addr],
    ) -> (BgpSpeaker, TcpStream, RouteAttrs) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut cfg = gr_config(port);
        cfg.graceful_shutdown = Some(GracefulShutdown {
            wait: Duration::from_secs(5),
        });
        cfg.peers[0].graceful_shutdown.med = med;
        let ctx = StartContext {
            fresh: true,
            ..StartContext::default()
        };
        let mut speaker = BgpSpeaker::start_with(cfg, &ctx).expect("starts");
        let wanted: BTreeSet<IpAddr> = vips.iter().map(|v| IpAddr::from(*v)).collect();
        speaker.set_announced(&wanted).unwrap();
        let gr = GracefulRestartOffer {
            restarting: false,
            restart_time: 30,
            forwarding: false,
        };
        let mut sock = establish_gr(&listener, gr).await;
        let attrs = RouteAttrs {
            local_as: 65001,
            ebgp: true,
            asn4: true,
            shutdown: None,
        };
        let plain = announce_v4(&attrs, Ipv4Addr::LOCALHOST, vips).unwrap();
        assert_eq!(vec![next_update(&mut sock).await], plain);
        assert_eq!(next_update(&mut sock).await, end_of_rib_v4());
        (speaker, sock, attrs)
    }

    #[tokio::test]
    async fn a_fresh_start_sends_end_of_rib_at_once_and_graceful_shutdown_re_announces() {
        let vip = Ipv4Addr::new(10, 99, 0, 1);
        let (mut speaker, mut sock, mut attrs) =
            fresh_with_graceful_shutdown(Some(7), &[vip]).await;
        assert_eq!(
            speaker.graceful_shutdown_wait(),
            Some(Duration::from_secs(5))
        );
        speaker.set_graceful_shutdown(true);
        attrs.shutdown = Some(crate::config::announce::bgp::ShutdownAttributes {
            med: Some(7),
            ..Default::default()
        });
        let gshut = announce_v4(&attrs, Ipv4Addr::LOCALHOST, &[vip]).unwrap();
        assert_eq!(vec![next_update(&mut sock).await], gshut);
        assert!(speaker.status()[0].graceful_shutdown);
        // Then the withdrawal.
        speaker.set_announced(&BTreeSet::new()).unwrap();
        assert_eq!(
            vec![next_update(&mut sock).await],
            withdraw_v4(&[vip]).unwrap()
        );
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// The graceful shutdown ended and a route went in one change (an
    /// undrain while a VIP lost its backends): every route is sent again
    /// without the community, and the one that went is withdrawn, not
    /// left with the router.
    #[tokio::test]
    async fn routes_sent_again_withdraw_what_went_meanwhile() {
        let (a, b) = (Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2));
        let (mut speaker, mut sock, mut attrs) = fresh_with_graceful_shutdown(None, &[a, b]).await;
        speaker.set_graceful_shutdown(true);
        attrs.shutdown = Some(Default::default());
        let gshut = announce_v4(&attrs, Ipv4Addr::LOCALHOST, &[a, b]).unwrap();
        assert_eq!(vec![next_update(&mut sock).await], gshut);
        // Both before the session runs again: it sees one change.
        speaker.set_graceful_shutdown(false);
        speaker
            .set_announced(&[a.into()].into_iter().collect())
            .unwrap();
        assert_eq!(
            vec![next_update(&mut sock).await],
            withdraw_v4(&[b]).unwrap()
        );
        attrs.shutdown = None;
        let again = announce_v4(&attrs, Ipv4Addr::LOCALHOST, &[a]).unwrap();
        assert_eq!(vec![next_update(&mut sock).await], again);
        let one = |s: &PeerStatus| s.carried.as_ref().is_some_and(|c| c.len() == 1);
        let s = wait_for(&speaker, "carries a alone", one).await;
        assert_eq!(s.carried, Some(vec![IpAddr::from(a)]));
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// After a restart, a connection the peer closes before the session
    /// comes up (a router still winding the old session down) does not use
    /// up Restart State: the next OPEN still says it, so routes still wait
    /// for the first verdicts.
    #[tokio::test]
    async fn restart_state_outlives_a_connection_closed_before_established() {
        let (listener, mut speaker) = restarted_speaker().await;
        let gr = GracefulRestartOffer {
            restarting: true,
            restart_time: 30,
            forwarding: true,
        };
        let (sock, open) = accepted(&listener).await;
        assert_eq!(
            open,
            wire::open(65001, 3, Ipv4Addr::new(10, 0, 0, 11), Some(gr)).unwrap()
        );
        drop(sock);
        let _sock = establish_gr(&listener, gr).await;
        let s = wait_for_state(&speaker, SessionState::Established).await;
        let g = s.graceful_restart.expect("graceful restart status");
        assert!(g.restarting && g.deferring, "{g:?}");
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// After a restart, a session that closes while its routes are still
    /// held back (no verdict yet) does not use up Restart State either:
    /// the next session still offers it and still waits, so no End-of-RIB
    /// makes the router flush the last `lbd`'s routes before the verdicts.
    #[tokio::test]
    async fn restart_state_outlives_a_session_closed_while_routes_were_held_back() {
        let (listener, mut speaker) = restarted_speaker().await;
        let vip: IpAddr = "10.99.0.1".parse().unwrap();
        speaker.set_announced(&[vip].into_iter().collect()).unwrap();
        let gr = GracefulRestartOffer {
            restarting: true,
            restart_time: 30,
            forwarding: true,
        };
        let sock = establish_gr(&listener, gr).await;
        let s = wait_for_state(&speaker, SessionState::Established).await;
        assert!(s.graceful_restart.is_some_and(|g| g.deferring));
        drop(sock);
        let mut sock = establish_gr(&listener, gr).await;
        let s = wait_for_state(&speaker, SessionState::Established).await;
        let g = s.graceful_restart.expect("graceful restart status");
        assert!(g.restarting && g.deferring && !g.end_of_rib_sent, "{g:?}");
        assert_eq!(frame(&mut sock).await, keepalive(), "still held back");
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// A peer that asks for no hold timer (hold time 0) sends no
    /// KEEPALIVEs: the speaker's end of the connection gets TCP
    /// keepalives instead (the kernel's keepalive timer runs on it, as
    /// `/proc/net/tcp` shows), so a peer that lost power is noticed.
    #[tokio::test]
    async fn a_peer_without_a_hold_timer_is_watched_by_tcp_keepalives() {
        let (listener, mut speaker) = speaker_with_peer(3).await;
        let (sock, _) = open_with_any(&listener, 0).await;
        wait_for_state(&speaker, SessionState::Established).await;
        let (ours, theirs) = (sock.local_addr().unwrap(), sock.peer_addr().unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tcp_timer(theirs.port(), ours.port()) != Some(2) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no keepalive timer on the speaker's end: {:?}",
                tcp_timer(theirs.port(), ours.port())
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        speaker.shutdown().await.expect("clean shutdown");
    }

    /// The timer running on the loopback connection from local port
    /// `local` to `remote` (`/proc/net/tcp`, the `tr` column: 0 none, 1
    /// retransmit, 2 keepalive, ...).
    fn tcp_timer(local: u16, remote: u16) -> Option<u8> {
        tcp_field(local, remote, 5)
    }

    #[test]
    fn starting_needs_a_runtime_and_a_valid_config() {
        assert!(matches!(
            BgpSpeaker::start(config(179, 3)),
            Err(AnnounceError::NoRuntime { announcer: "bgp" })
        ));
        let mut bad = config(179, 3);
        bad.local_as = 0;
        let err = BgpSpeaker::start(bad).err().expect("invalid");
        assert!(err.to_string().contains("bgp.local_as"), "{err}");
    }
}

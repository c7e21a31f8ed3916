//! The daemon's side of route announcement (`daemon/announce.rs`): what
//! the announcers are told and when, the node's state (serving, drained,
//! stopping) and the graceful shutdown a drain starts, the grace the
//! routers get after the last withdrawal, what `lbctl bgp` says of each
//! VIP (announced as it is, and why not, peer by peer), and the log lines
//! an operator reads (a VIP announced or withdrawn, an announcer's
//! refusal once, the announcers' start).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use super::*;
use crate::announce::SessionState;

/// What a fake announcer was asked, in words, in order.
type Said = Arc<Mutex<Vec<String>>>;

/// An announcer that says what it is asked into `said`, reports `peers`
/// as its rows, and refuses every set while `refusing` holds.
struct Fake {
    said: Said,
    peers: Vec<PeerStatus>,
    refusing: Arc<AtomicBool>,
}

impl Announcer for Fake {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        if self.refusing.load(Ordering::Relaxed) {
            self.said.lock().unwrap().push("refused".into());
            return Err(AnnounceError::Write {
                target: "the pipe".into(),
                source: std::io::Error::other("broken pipe"),
            });
        }
        self.said.lock().unwrap().push(format!("set {prefixes:?}"));
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        self.peers.clone()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        self.said.lock().unwrap().push("shutdown".into());
        Box::pin(async { Ok(()) })
    }
}

/// One [`Fake`] announcer (started afresh by each start), saying into
/// `said`, with these peers, refusing while `refusing` holds.
fn fake(said: &Said, peers: Vec<PeerStatus>, refusing: &Arc<AtomicBool>) -> Announcers {
    let (said, refusing) = (said.clone(), refusing.clone());
    Announcers::new(Box::new(move |_| {
        Ok(vec![Box::new(Fake {
            said: said.clone(),
            peers: peers.clone(),
            refusing: refusing.clone(),
        }) as Box<dyn Announcer>])
    }))
}

/// A rig on [`with_bgp`] whose one announcer reports `peers`.
fn bgp_rig(peers: Vec<PeerStatus>) -> Rig {
    let refusing = Arc::new(AtomicBool::new(false));
    rig_with(
        &with_bgp(),
        Told::default(),
        fake(&Said::default(), peers, &refusing),
    )
}

/// No announcer at all (what `announce::start` gives without an
/// `announce:` section).
fn none() -> Announcers {
    Announcers::new(Box::new(|_| Ok(Vec::new())))
}

/// One [`Graceful`] announcer (a 3 s graceful-shutdown wait); the events
/// it records (`settled …`, `graceful …`).
fn graceful(told: &Told) -> (Announcers, Arc<Mutex<Vec<String>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let (sink, log) = (told.clone(), events.clone());
    let announcers = Announcers::new(Box::new(move |_| {
        Ok(vec![
            Box::new(Graceful(sink.clone(), log.clone())) as Box<dyn Announcer>
        ])
    }));
    (announcers, events)
}

/// [`FILE`] with a BGP announcer configured (one peer; the fakes report
/// their own).
fn with_bgp() -> String {
    format!(
        "{FILE}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    peers:\n      - {{ address: 10.0.0.1, remote_as: 65000 }}\n"
    )
}

/// [`FILE`] with an exec announcer configured.
fn with_exec() -> String {
    format!("{FILE}announce:\n  exec:\n    command: [/bin/true]\n")
}

/// The policy's reason for [`WEB`] while it serves: both backends usable.
const HEALTHY: &str = "2 of 2 backends usable, min_healthy 1";

/// The policy's reason for every VIP of a drained node.
const DRAINED: &str = "withdrawn: the node is drained (`lbctl node undrain` ends it)";

/// A VIP announced or withdrawn is logged while announcers run: the
/// drain withdraws [`WEB`], the undrain announces it again, each said
/// once.
#[tokio::test]
async fn a_vip_announced_or_withdrawn_is_logged_while_announcers_run() {
    let mut r = rig(FILE);
    logs::capture();
    r.daemon.set_drained(true).expect("drains");
    let withdrawn = logs::lines("VIP withdrawn vip=");
    assert!(
        withdrawn.len() == 1 && withdrawn[0].contains(WEB),
        "{withdrawn:?}"
    );
    assert_eq!(logs::lines("VIP announced vip="), Vec::<String>::new());
    r.daemon.set_drained(false).expect("undrains");
    let announced = logs::lines("VIP announced vip=");
    assert!(
        announced.len() == 1 && announced[0].contains(WEB),
        "{announced:?}"
    );
}

/// Without any announcer nothing is announced to anyone, so no VIP is
/// said to be announced or withdrawn.
#[tokio::test]
async fn without_announcers_no_vip_is_said_announced_or_withdrawn() {
    logs::capture();
    let mut r = rig_with(FILE, Told::default(), none());
    r.daemon.set_drained(true).expect("drains");
    r.daemon.set_drained(false).expect("undrains");
    assert_eq!(logs::lines("VIP withdrawn vip="), Vec::<String>::new());
    assert_eq!(logs::lines("VIP announced vip="), Vec::<String>::new());
}

/// The routers' grace starts only when the announced set loses its last
/// address: announcing the same set again leaves nothing to wait for,
/// and so does a drain of a node that announced nothing.
#[tokio::test]
async fn only_the_withdrawal_of_the_last_address_starts_the_grace() {
    let mut r = rig(FILE);
    r.daemon.announce();
    r.daemon.announce();
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    assert_eq!(r.daemon.grace_left(), Duration::ZERO, "nothing withdrawn");

    // Probed, no verdict yet: nothing announced, nothing to withdraw.
    let mut r = rig(&checked(FILE));
    assert!(r.announced().is_empty());
    let c = r.daemon.set_drained(true).expect("drains");
    assert!(c.changed);
    assert!(c.addresses.is_empty(), "{:?}", c.addresses);
    assert_eq!(c.wait_secs, 0.0, "no router had anything to move away");
    assert_eq!(r.daemon.grace_left(), Duration::ZERO);
}

/// An announcer that refuses the set is retried at every announce, and
/// the refusal is logged once until it changes: a recovery says nothing,
/// a new refusal after it is logged again.
#[tokio::test]
async fn a_refused_set_is_retried_but_logged_once() {
    let said = Said::default();
    let refusing = Arc::new(AtomicBool::new(true));
    logs::capture();
    let mut r = rig_with(FILE, Told::default(), fake(&said, Vec::new(), &refusing));
    const REFUSED: &str = "an announcer refused the VIP set";
    let refused = logs::lines(REFUSED);
    assert!(
        refused.len() == 1 && refused[0].contains("writing to the pipe: broken pipe"),
        "{refused:?}"
    );
    let asked = said.lock().unwrap().len();
    r.daemon.announce();
    r.daemon.announce();
    assert_eq!(said.lock().unwrap().len(), asked + 2, "retried each time");
    assert_eq!(logs::lines(REFUSED).len(), 1, "the same refusal: once");
    refusing.store(false, Ordering::Relaxed);
    r.daemon.announce();
    assert_eq!(
        said.lock().unwrap().last().map(String::as_str),
        Some("set {10.99.0.1}")
    );
    assert_eq!(logs::lines(REFUSED).len(), 1, "a recovery says nothing");
    refusing.store(true, Ordering::Relaxed);
    r.daemon.announce();
    assert_eq!(logs::lines(REFUSED).len(), 2, "refused again: said again");
}

/// The announcers' start is logged, with their kinds, when some run;
/// a start that runs none says nothing.
#[tokio::test]
async fn the_announcers_start_is_logged_only_when_some_run() {
    const STARTED: &str = "route announcers started";
    let said = Said::default();
    let refusing = Arc::new(AtomicBool::new(false));
    logs::capture();
    let _r = rig_with(
        &with_exec(),
        Told::default(),
        fake(&said, Vec::new(), &refusing),
    );
    let started = logs::lines(STARTED);
    assert!(
        started.len() == 1 && started[0].contains("announcers=exec"),
        "{started:?}"
    );
    logs::capture();
    let _r = rig_with(FILE, Told::default(), none());
    assert_eq!(logs::lines(STARTED), Vec::<String>::new());
}

/// Stopping the announcers shuts each one down (withdrawals, Cease), and
/// they are told nothing more after it.
#[tokio::test]
async fn stopped_announcers_are_shut_down_and_told_nothing_more() {
    let said = Said::default();
    let refusing = Arc::new(AtomicBool::new(false));
    let mut r = rig_with(FILE, Told::default(), fake(&said, Vec::new(), &refusing));
    assert_eq!(
        said.lock().unwrap().last().map(String::as_str),
        Some("set {10.99.0.1}")
    );
    r.daemon.stop_announcers().await;
    assert_eq!(
        said.lock().unwrap().last().map(String::as_str),
        Some("shutdown")
    );
    let before = said.lock().unwrap().len();
    r.daemon.set_drained(true).expect("drains");
    r.daemon.announce();
    assert_eq!(said.lock().unwrap().len(), before, "{:?}", said.lock());
}

/// A changed announce section shuts the running announcers down before
/// the new ones start.
#[tokio::test]
async fn a_restart_of_the_announcers_shuts_the_old_ones_down_first() {
    let said = Said::default();
    let refusing = Arc::new(AtomicBool::new(false));
    let mut r = rig_with(FILE, Told::default(), fake(&said, Vec::new(), &refusing));
    said.lock().unwrap().clear();
    r.daemon
        .reload(reparse(&r, &with_exec()), false, &plain())
        .await
        .expect("the new announcers start");
    let said = said.lock().unwrap().clone();
    let shutdown = said.iter().position(|s| s == "shutdown");
    assert!(
        shutdown.is_some_and(|at| at + 1 < said.len()),
        "the old announcer shut down, then the new one told: {said:?}"
    );
    assert_eq!(said.last().map(String::as_str), Some("set {10.99.0.1}"));
}

/// A drain of a node that announces nothing starts no graceful shutdown:
/// no community, no deadline, nothing to wait for.
#[tokio::test]
async fn a_drain_with_nothing_announced_starts_no_graceful_shutdown() {
    let told = Told::default();
    let (announcers, events) = graceful(&told);
    let mut r = rig_with(&checked(FILE), told, announcers);
    assert!(r.announced().is_empty(), "no verdict yet: not announced");
    let c = r.daemon.set_drained(true).expect("drains");
    assert!(c.changed);
    assert!(c.addresses.is_empty(), "{:?}", c.addresses);
    assert_eq!(c.wait_secs, 0.0);
    assert_eq!(r.daemon.graceful_deadline(), None);
    let events = events.lock().unwrap().clone();
    assert!(
        !events.iter().any(|e| e.starts_with("graceful")),
        "{events:?}"
    );
}

/// Routes held back until the backends' first verdicts (after a restart,
/// the routers hold the last `lbd`'s) go out at once when the node stops
/// serving: a drain, and a stop, reach the routers before any verdict.
#[tokio::test]
async fn a_drain_or_a_stop_before_the_first_verdicts_is_sent_at_once() {
    let last_settled = |events: &Arc<Mutex<Vec<String>>>| {
        events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e.starts_with("settled"))
            .cloned()
    };
    for stop in [false, true] {
        let told = Told::default();
        let (announcers, events) = graceful(&told);
        let mut r = rig_with(&checked(FILE), told, announcers);
        assert_eq!(last_settled(&events).as_deref(), Some("settled false"));
        if stop {
            r.daemon.begin_stop("SIGTERM").expect("a first signal");
        } else {
            r.daemon.set_drained(true).expect("drains");
        }
        assert_eq!(
            last_settled(&events).as_deref(),
            Some("settled true"),
            "stop: {stop}"
        );
    }
}

/// Announcers started again during a graceful shutdown's wait (a reload
/// that changed `announce:`) announce with its community as well, not at
/// full preference.
#[tokio::test]
async fn announcers_started_during_a_graceful_shutdown_carry_it() {
    let told = Told::default();
    let (announcers, events) = graceful(&told);
    let mut r = rig_with(FILE, told, announcers);
    r.daemon.set_drained(true).expect("drains");
    assert!(r.daemon.graceful_deadline().is_some());
    events.lock().unwrap().clear();
    r.daemon.start_announcers().expect("started again");
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events.first().map(String::as_str),
        Some("graceful true"),
        "{events:?}"
    );
}

/// A drain's graceful shutdown ends its wait (3 s) after the drain: the
/// deadline the serve loop's timer waits for is ahead, not behind.
#[tokio::test]
async fn a_graceful_shutdowns_deadline_is_its_wait_after_the_drain() {
    let told = Told::default();
    let (announcers, _events) = graceful(&told);
    let mut r = rig_with(FILE, told, announcers);
    let wait = Duration::from_secs(3);
    let before = Instant::now();
    r.daemon.set_drained(true).expect("drains");
    let after = Instant::now();
    let deadline = r.daemon.graceful_deadline().expect("a graceful shutdown");
    assert!(
        deadline >= before + wait && deadline <= after + wait,
        "{:?} after the drain",
        deadline.checked_duration_since(before)
    );
}

/// A reload asked for while `lbd` stops is refused as such, not as a
/// request sent the wrong way.
#[tokio::test]
async fn a_reload_while_stopping_is_refused_as_shutting_down() {
    let mut r = rig(FILE);
    r.daemon.begin_stop("SIGTERM").expect("a first signal");
    let e = r
        .refused(ErrorKind::Unavailable, Request::Reload { force: false })
        .await;
    assert!(e.contains("shutting down"), "{e}");
}

/// Only a stop signal makes the node stopping: not serving, not a drain.
#[tokio::test]
async fn only_a_stop_signal_makes_the_node_stopping() {
    let mut r = rig(FILE);
    assert!(!r.daemon.stopping(), "serving");
    r.daemon.set_drained(true).expect("drains");
    assert!(!r.daemon.stopping(), "drained");
    r.daemon.begin_stop("SIGTERM").expect("a first signal");
    assert!(r.daemon.stopping());
}

/// A node drained for maintenance stays drained through a crash (the
/// daemon started again on its revisions, as after `kill -9` or the
/// watchdog), said loudly; an undrain or a clean stop forgets it.
#[tokio::test]
async fn a_drain_outlives_a_crash_but_not_an_undrain_or_a_clean_stop() {
    logs::capture();
    let mut r = rig(FILE);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    r.daemon.set_drained(true).expect("drains");
    let r = restart(r);
    assert_eq!(r.daemon.announce_status().node, NodeState::Drained);
    assert!(r.announced().is_empty(), "{:?}", r.announced());
    let said = logs::lines("it starts drained");
    assert_eq!(said.len(), 1, "{said:?}");

    // Undrained: a crash after it starts serving.
    let mut r = r;
    r.daemon.set_drained(false).expect("undrains");
    let mut r = restart(r);
    assert_eq!(r.daemon.announce_status().node, NodeState::Serving);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));

    // Drained, then stopped cleanly: a restart on purpose serves.
    r.daemon.set_drained(true).expect("drains");
    r.daemon.begin_stop("SIGTERM").expect("a first signal");
    let r = restart(r);
    assert_eq!(r.daemon.announce_status().node, NodeState::Serving);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    assert_eq!(logs::lines("it starts drained").len(), 1, "said only once");
}

/// `lbctl bgp` counts the seconds in the node's state only outside
/// serving: 0 while serving, before a drain and after an undrain.
#[tokio::test]
async fn the_seconds_in_the_node_state_are_zero_while_serving() {
    let mut r = rig(FILE);
    let s = r.daemon.announce_status();
    assert_eq!(s.node, NodeState::Serving);
    assert_eq!(s.node_state_secs, 0.0);
    r.daemon.set_drained(true).expect("drains");
    let s = r.daemon.announce_status();
    assert_eq!(s.node, NodeState::Drained);
    assert!(s.node_state_secs >= 0.0, "{}", s.node_state_secs);
    r.daemon.set_drained(false).expect("undrains");
    let s = r.daemon.announce_status();
    assert_eq!(s.node, NodeState::Serving);
    assert_eq!(s.node_state_secs, 0.0);
}

/// Without an announcer configured, routes are set up outside `lbd`,
/// which cannot know whether a router has them: a VIP the policy wants is
/// not said to be announced (the reason says why and what the policy
/// would do), no address counts, and the metrics carry no
/// `lb_vip_announced` or `lb_address_announced` (an alert on 0 would
/// fire for every VIP; a 1 would claim routes nobody checked).
#[tokio::test]
async fn without_an_announcer_configured_nothing_is_said_announced() {
    let mut r = rig_with(FILE, Told::default(), none());
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert_eq!((v.wanted, v.announced), (true, false), "{v:?}");
    assert_eq!(
        v.reason,
        format!(
            "not announced: no announcer is configured (`announce:`); the policy would ({HEALTHY})"
        )
    );
    assert!(s.announced.is_empty(), "{:?}", s.announced);
    r.daemon.tick();
    let text = r.daemon.metrics.encode().unwrap();
    assert!(
        !text.contains("lb_vip_announced{") && !text.contains("lb_address_announced{"),
        "{text}"
    );
    assert!(
        text.contains("lb_vip_qualifies{vip=\"10.99.0.1:80/tcp\"} 1"),
        "{text}"
    );
    r.daemon.set_drained(true).expect("drains");
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert_eq!((v.wanted, v.announced), (false, false), "{v:?}");
    assert_eq!(v.reason, DRAINED);
}

/// A peer that is established, has not the address and withholds only
/// others; one that withholds this address among others; one whose
/// session is down.
fn peers() -> Vec<PeerStatus> {
    let mut sent_nothing = PeerStatus::new("10.0.0.1:179", SessionState::Established);
    sent_nothing.carried = Some(Vec::new());
    sent_nothing.withheld = vec![(ip("10.99.0.9"), "no IPv6 next hop".into())];
    let mut withholds = PeerStatus::new("10.0.0.2:179", SessionState::Established);
    withholds.carried = Some(vec![ip("10.99.0.9")]);
    withholds.withheld = vec![
        (ip("10.99.0.9"), "another reason".into()),
        (ip("10.99.0.1"), "ipv4 not negotiated".into()),
    ];
    let down = PeerStatus::new("10.0.0.3:179", SessionState::Active);
    vec![sent_nothing, withholds, down]
}

/// A VIP the policy wants but no peer holds is not announced, and `lbctl
/// bgp` says why peer by peer: what the peer withholds for this address
/// (not for another), "not sent yet" on an established session, or the
/// session's state.
#[tokio::test]
async fn a_wanted_vip_no_peer_holds_is_withheld_with_each_peers_reason() {
    let mut r = bgp_rig(peers());
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert_eq!((v.wanted, v.announced), (true, false), "{v:?}");
    assert_eq!(
        v.reason,
        format!(
            "withheld: wanted ({HEALTHY}), but no router has it: \
             10.0.0.1:179: not sent yet; \
             10.0.0.2:179: ipv4 not negotiated; \
             10.0.0.3:179: session Active"
        )
    );
    assert!(s.announced.is_empty(), "{:?}", s.announced);
    // Not wanted (drained): the policy's reason, not the peers'.
    r.daemon.set_drained(true).expect("drains");
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert_eq!((v.wanted, v.announced), (false, false), "{v:?}");
    assert_eq!(v.reason, DRAINED);
}

/// The metrics say what `lbctl bgp` says: a VIP the policy wants but no
/// router holds is not announced.
#[tokio::test]
async fn the_metrics_count_a_vip_no_router_holds_as_not_announced() {
    let mut r = bgp_rig(peers());
    r.daemon.tick();
    let served = r.daemon.metrics().encode().unwrap();
    let line = r#"lb_vip_announced{vip="10.99.0.1:80/tcp"} 0"#;
    assert!(served.contains(line), "{line} not in:\n{served}");
}

/// An announcer configured that reports no peer at all holds nothing:
/// a wanted VIP is withheld, for want of any peer.
#[tokio::test]
async fn a_wanted_vip_with_no_peer_at_all_is_withheld() {
    let r = bgp_rig(Vec::new());
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert_eq!((v.wanted, v.announced), (true, false), "{v:?}");
    assert_eq!(
        v.reason,
        format!("withheld: wanted ({HEALTHY}), but no router has it: no peer")
    );
}

/// `lbctl status`'s announce line counts the sessions up (established
/// only), the BFD sessions up, the addresses announced and those wanted
/// but held by no router, and names a node that does not serve.
#[tokio::test]
async fn the_summary_counts_sessions_up_and_addresses_no_router_holds() {
    let bfd = |up| {
        Some(crate::bfd::BfdStatus {
            up,
            ..Default::default()
        })
    };
    let mut rows = peers();
    rows[0].bfd = bfd(true);
    rows[2].bfd = bfd(false);
    let said = Said::default();
    let refusing = Arc::new(AtomicBool::new(false));
    let mut r = rig_with(&with_bgp(), Told::default(), fake(&said, rows, &refusing));
    assert_eq!(
        r.daemon.announce_summary(),
        "bgp: 2 of 3 up, BFD 1 of 2 up, 0 address(es) announced, 1 wanted but held by no router"
    );
    r.daemon.set_drained(true).expect("drains");
    assert_eq!(
        r.daemon.announce_summary(),
        "bgp: 2 of 3 up, BFD 1 of 2 up, 0 address(es) announced; node drained"
    );
    let r = rig(FILE);
    assert_eq!(
        r.daemon.announce_summary(),
        "no announcer configured (`announce:`)"
    );
}

//! lb's BGP speaker against real routers: BIRD 2 and FRR 8 in a router
//! namespace, the speaker in a balancer namespace (a thread of this
//! process, or the `lb-bgp-probe` process when the test must freeze it),
//! joined by a veth. What counts is what the router does: its session
//! state, its BGP table, and the routes it installs in its kernel.
//! Timings (announce, withdraw, hold expiry, reconnect) are printed; run
//! with `--nocapture` to see them.
//!
//! Needs root and the bird2 and frr packages; without them every test
//! fails with a message saying so. Tests run one at a time.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb::announce::{
    BgpConfig, ConnectRetry, PeerConfig, SessionState,
    wire::{self, Decoder, Message, Notification},
};
use lb_tests::{
    routers::{
        BgpRig, ROUTER_AS, Router, RouterKind, SPEAKER_AS, VIP4, VIP6, kernel_next_hops,
        kernel_routes, start_router, start_router_with, wait_for,
    },
    speaker::{Probe, SpeakerThread},
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn check(result: Result<()>) {
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

const POLL: Duration = Duration::from_millis(5);

/// Speaker `i`'s configuration: one eBGP session to the router over IPv4,
/// IPv6 VIPs with `next_hop_v6` = its IPv6 address on the link. We offer
/// a 9 s hold time; the routers offer 3 s, so 3 s is agreed.
fn speaker_config(i: usize) -> BgpConfig {
    BgpConfig {
        local_as: SPEAKER_AS,
        router_id: BgpRig::speaker_v4(i),
        hold_time: Duration::from_secs(9),
        connect_retry: ConnectRetry {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(1),
        },
        next_hop_v4: None,
        next_hop_v6: Some(BgpRig::speaker_v6(i)),
        graceful_restart: Default::default(),
        graceful_shutdown: None,
        peers: vec![PeerConfig {
            local_address: Some(BgpRig::speaker_v4(i).into()),
            ..PeerConfig::new(BgpRig::router_v4(i).into(), ROUTER_AS)
        }],
    }
}

fn peer_name(i: usize) -> String {
    format!("{}:179", BgpRig::router_v4(i))
}

/// The kernel route for `vip` in the router has exactly `via`.
fn routed_via(rig: &BgpRig, vip: IpAddr, via: &[IpAddr]) -> Result<bool> {
    let mut got = kernel_next_hops(&rig.router, vip)?;
    got.sort();
    let mut want = via.to_vec();
    want.sort();
    Ok(got == want)
}

fn no_route(rig: &BgpRig, vip: IpAddr) -> Result<bool> {
    Ok(kernel_routes(&rig.router, vip)?.trim().is_empty())
}

/// Waits for our session `i` and the router's view of it to be
/// Established; returns how long ours took.
fn wait_established(
    lb: &SpeakerThread,
    router: &dyn Router,
    i: usize,
    limit: Duration,
) -> Result<Duration> {
    let peer = peer_name(i);
    let ours = wait_for("our session Established", limit, POLL, || {
        Ok(lb.peer(&peer)?.state == SessionState::Established)
    })
    .with_context(|| format!("speaker status {:?}\n{}", lb.status(), router.logs()))?;
    wait_for(
        &format!("{} sees the session Established", router.name()),
        limit,
        Duration::from_millis(20),
        || router.established(BgpRig::speaker_v4(i)),
    )
    .with_context(|| router.logs())?;
    Ok(ours)
}

/// The first line of `text` containing `needle` (case-insensitive),
/// trimmed.
fn line_with(text: &str, needle: &str) -> Option<String> {
    text.lines()
        .find(|l| l.to_lowercase().contains(needle))
        .map(|l| l.trim().to_string())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn session_announce_withdraw_and_cease(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let router = start_router(kind, &rig)?;
    let name = router.name();
    let mut lb = SpeakerThread::start(&rig.speakers[0], speaker_config(1))?;
    let up = wait_established(&lb, router.as_ref(), 1, Duration::from_secs(15))?;
    let s = lb.peer(&peer_name(1))?;
    if s.hold_time_secs != Some(3) || s.remote_as != Some(ROUTER_AS) {
        bail!("unexpected session parameters: {s:?}");
    }

    let (lb4, lb6): (IpAddr, IpAddr) = (BgpRig::speaker_v4(1).into(), BgpRig::speaker_v6(1).into());
    let (v4, v6): (IpAddr, IpAddr) = (VIP4.into(), VIP6.into());
    let start = Instant::now();
    lb.set(&[v4, v6])?;
    let limit = Duration::from_secs(5);
    wait_for("the IPv4 VIP in the router's kernel", limit, POLL, || {
        routed_via(&rig, v4, &[lb4])
    })
    .with_context(|| router.logs())?;
    let announce4 = start.elapsed();
    wait_for("the IPv6 VIP in the router's kernel", limit, POLL, || {
        routed_via(&rig, v6, &[lb6])
    })
    .with_context(|| router.logs())?;
    let announce6 = start.elapsed();
    if !router.has_bgp_route(v4)? || !router.has_bgp_route(v6)? {
        bail!("{name}'s BGP table lacks the VIPs");
    }
    let s = lb.peer(&peer_name(1))?;
    if s.prefixes_announced != 2 || s.updates_sent < 2 {
        bail!("status after announcing: {s:?}");
    }

    // Withdraw the IPv4 VIP only; the IPv6 one stays.
    let start = Instant::now();
    lb.set(&[v6])?;
    wait_for("the IPv4 VIP gone", limit, POLL, || no_route(&rig, v4))?;
    let withdraw4 = start.elapsed();
    if !routed_via(&rig, v6, &[lb6])? {
        bail!("withdrawing the IPv4 VIP took the IPv6 one too");
    }
    let start = Instant::now();
    lb.set(&[])?;
    wait_for("the IPv6 VIP gone", limit, POLL, || no_route(&rig, v6))?;
    let withdraw6 = start.elapsed();

    // Graceful shutdown: routes go, the router hears Cease.
    lb.set(&[v4, v6])?;
    wait_for("both VIPs back", limit, POLL, || {
        Ok(routed_via(&rig, v4, &[lb4])? && routed_via(&rig, v6, &[lb6])?)
    })?;
    let start = Instant::now();
    lb.shutdown()?;
    wait_for("both VIPs gone after shutdown", limit, POLL, || {
        Ok(no_route(&rig, v4)? && no_route(&rig, v6)?)
    })?;
    let shutdown = start.elapsed();
    let cease = wait_for(
        &format!("{name} reporting the Cease"),
        limit,
        Duration::from_millis(20),
        || {
            Ok(line_with(
                &router.session_report(BgpRig::speaker_v4(1))?,
                "administrative shutdown",
            )
            .is_some())
        },
    );
    cease.with_context(|| {
        format!(
            "{}\n{}",
            router
                .session_report(BgpRig::speaker_v4(1))
                .unwrap_or_default(),
            router.logs()
        )
    })?;
    let said = line_with(
        &router.session_report(BgpRig::speaker_v4(1))?,
        "administrative shutdown",
    )
    .unwrap_or_default();
    eprintln!(
        "{name}: Established after {}; announce → kernel route: IPv4 {}, IPv6 {}; withdraw → gone: IPv4 {}, IPv6 {}; shutdown → both gone {}; {name} says: {said}",
        ms(up),
        ms(announce4),
        ms(announce6),
        ms(withdraw4),
        ms(withdraw6),
        ms(shutdown)
    );
    Ok(())
}

#[test]
fn bird_session_announce_withdraw_and_cease() {
    check(session_announce_withdraw_and_cease(RouterKind::Bird));
}

#[test]
fn frr_session_announce_withdraw_and_cease() {
    check(session_announce_withdraw_and_cease(RouterKind::Frr));
}

/// A router asks for the routes again (a soft reset inbound, as after an
/// import-policy change): lb offered route refresh, so the router sends
/// ROUTE-REFRESH instead of resetting the session, and lb sends its routes
/// again on the same session.
fn a_refresh_gets_the_routes_again_on_the_same_session(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let router = start_router(kind, &rig)?;
    let mut lb = SpeakerThread::start(&rig.speakers[0], speaker_config(1))?;
    wait_established(&lb, router.as_ref(), 1, Duration::from_secs(15))?;
    let (v4, v6): (IpAddr, IpAddr) = (VIP4.into(), VIP6.into());
    let lb4: IpAddr = BgpRig::speaker_v4(1).into();
    lb.set(&[v4, v6])?;
    wait_for(
        "the IPv4 VIP in the router's kernel",
        Duration::from_secs(5),
        POLL,
        || routed_via(&rig, v4, &[lb4]),
    )
    .with_context(|| router.logs())?;
    let peer = peer_name(1);
    wait_for(
        "lb's two updates counted",
        Duration::from_secs(5),
        POLL,
        || {
            let s = lb.peer(&peer)?;
            Ok(s.prefixes_announced == 2 && s.updates_sent >= 2)
        },
    )?;
    // Settled: nothing more is sent without a refresh (End-of-RIB and the
    // like are out), so a later update can only be its answer.
    let mut before = lb.peer(&peer)?;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let now = lb.peer(&peer)?;
        if now.updates_sent == before.updates_sent {
            break;
        }
        before = now;
    }
    let said = router.refresh_in(BgpRig::speaker_v4(1))?;
    wait_for(
        "lb's routes sent again",
        Duration::from_secs(5),
        POLL,
        || Ok(lb.peer(&peer)?.updates_sent > before.updates_sent),
    )
    .with_context(|| format!("{} said: {said}\n{}", router.name(), router.logs()))?;
    let after = lb.peer(&peer)?;
    if after.sessions_established != before.sessions_established
        || !router.established(BgpRig::speaker_v4(1))?
    {
        bail!("the refresh reset the session: {before:?} → {after:?}");
    }
    if !router.has_bgp_route(v4)? || !router.has_bgp_route(v6)? {
        bail!(
            "{}'s BGP table lost the VIPs after the refresh",
            router.name()
        );
    }
    eprintln!(
        "{}: refresh answered with {} update(s) on the same session; it said: {}",
        router.name(),
        after.updates_sent - before.updates_sent,
        said.trim()
    );
    lb.shutdown()?;
    Ok(())
}

#[test]
fn bird_refresh_gets_the_routes_again() {
    check(a_refresh_gets_the_routes_again_on_the_same_session(
        RouterKind::Bird,
    ));
}

#[test]
fn frr_refresh_gets_the_routes_again() {
    check(a_refresh_gets_the_routes_again_on_the_same_session(
        RouterKind::Frr,
    ));
}

fn two_speakers_make_one_ecmp_route(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(2)?;
    let router = start_router(kind, &rig)?;
    let name = router.name();
    let mut lb1 = SpeakerThread::start(&rig.speakers[0], speaker_config(1))?;
    let lb2 = SpeakerThread::start(&rig.speakers[1], speaker_config(2))?;
    wait_established(&lb1, router.as_ref(), 1, Duration::from_secs(15))?;
    wait_established(&lb2, router.as_ref(), 2, Duration::from_secs(15))?;
    let (v4, v6): (IpAddr, IpAddr) = (VIP4.into(), VIP6.into());
    lb1.set(&[v4, v6])?;
    lb2.set(&[v4, v6])?;
    let both4 = [BgpRig::speaker_v4(1).into(), BgpRig::speaker_v4(2).into()];
    let both6 = [BgpRig::speaker_v6(1).into(), BgpRig::speaker_v6(2).into()];
    wait_for(
        "one ECMP route with both balancers as next hops",
        Duration::from_secs(5),
        POLL,
        || Ok(routed_via(&rig, v4, &both4)? && routed_via(&rig, v6, &both6)?),
    )
    .with_context(|| {
        format!(
            "router kernel: {}{}\n{}",
            kernel_routes(&rig.router, v4).unwrap_or_default(),
            kernel_routes(&rig.router, v6).unwrap_or_default(),
            router.logs()
        )
    })?;
    let ecmp = kernel_routes(&rig.router, v4)?;
    // One balancer leaves: its next hop goes, the other stays.
    let start = Instant::now();
    lb1.shutdown()?;
    wait_for("lb1's next hops gone", Duration::from_secs(5), POLL, || {
        Ok(routed_via(&rig, v4, &both4[1..])? && routed_via(&rig, v6, &both6[1..])?)
    })?;
    let only2 = start.elapsed();
    eprintln!(
        "{name}: ECMP route from two speakers:\n{}\n{name}: one speaker shut down → its next hop gone in {}",
        ecmp.trim_end(),
        ms(only2)
    );
    Ok(())
}

#[test]
fn bird_merges_two_speakers_into_one_ecmp_route() {
    check(two_speakers_make_one_ecmp_route(RouterKind::Bird));
}

#[test]
fn frr_merges_two_speakers_into_one_ecmp_route() {
    check(two_speakers_make_one_ecmp_route(RouterKind::Frr));
}

fn reconnect_after_the_router_restarts(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let mut router = start_router(kind, &rig)?;
    let name = router.name();
    let lb = SpeakerThread::start(&rig.speakers[0], speaker_config(1))?;
    wait_established(&lb, router.as_ref(), 1, Duration::from_secs(15))?;
    let (v4, v6): (IpAddr, IpAddr) = (VIP4.into(), VIP6.into());
    let (lb4, lb6): (IpAddr, IpAddr) = (BgpRig::speaker_v4(1).into(), BgpRig::speaker_v6(1).into());
    lb.set(&[v4, v6])?;
    wait_for(
        "the VIPs in the router's kernel",
        Duration::from_secs(5),
        POLL,
        || Ok(routed_via(&rig, v4, &[lb4])? && routed_via(&rig, v6, &[lb6])?),
    )?;

    let start = Instant::now();
    router.crash()?;
    wait_for(
        "the speaker noticing the router's death",
        Duration::from_secs(5),
        POLL,
        || Ok(lb.peer(&peer_name(1))?.state != SessionState::Established),
    )?;
    let noticed = start.elapsed();
    let down = lb.peer(&peer_name(1))?;
    if down.last_error.is_none() {
        bail!("no error recorded for the lost session: {down:?}");
    }
    // Stay down a little: the speaker keeps retrying with backoff.
    std::thread::sleep(Duration::from_millis(1500));

    let start = Instant::now();
    router.start_again()?;
    let router_up = start.elapsed();
    wait_established(&lb, router.as_ref(), 1, Duration::from_secs(15))?;
    let established = start.elapsed();
    wait_for(
        "the VIPs back in the router's BGP table",
        Duration::from_secs(10),
        POLL,
        || Ok(router.has_bgp_route(v4)? && router.has_bgp_route(v6)?),
    )
    .with_context(|| router.logs())?;
    wait_for(
        "the VIPs back in the router's kernel",
        Duration::from_secs(10),
        POLL,
        || Ok(routed_via(&rig, v4, &[lb4])? && routed_via(&rig, v6, &[lb6])?),
    )?;
    let routes_back = start.elapsed();
    let s = lb.peer(&peer_name(1))?;
    if s.sessions_established != 2 || s.prefixes_announced != 2 {
        bail!("status after the reconnection: {s:?}");
    }
    eprintln!(
        "{name}: router killed → speaker noticed in {}; router restarted (up in {}) → Established {}, routes back {} after its start",
        ms(noticed),
        ms(router_up),
        ms(established),
        ms(routes_back)
    );
    Ok(())
}

#[test]
fn bird_restart_speaker_reconnects_and_routes_come_back() {
    check(reconnect_after_the_router_restarts(RouterKind::Bird));
}

#[test]
fn frr_restart_speaker_reconnects_and_routes_come_back() {
    check(reconnect_after_the_router_restarts(RouterKind::Frr));
}

fn hold_timer_expiry_when_the_speaker_freezes(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let router = start_router(kind, &rig)?;
    let name = router.name();
    let mut probe = Probe::start(&rig.speakers[0], &speaker_config(1), &rig.dir.path, "lb1")?;
    let peer = peer_name(1);
    let established = |probe: &mut Probe| -> Result<bool> {
        Ok(probe
            .status()?
            .iter()
            .any(|p| p.peer == peer && p.state == lb::api::SessionState::Established))
    };
    wait_for(
        "the probe's session Established",
        Duration::from_secs(15),
        Duration::from_millis(20),
        || established(&mut probe),
    )
    .with_context(|| format!("{}\n{}", probe.log_text(), router.logs()))?;
    let v4: IpAddr = VIP4.into();
    let lb4: IpAddr = BgpRig::speaker_v4(1).into();
    probe.set(&[v4])?;
    wait_for(
        "the VIP in the router's kernel",
        Duration::from_secs(5),
        POLL,
        || routed_via(&rig, v4, &[lb4]),
    )?;

    // Freeze the speaker: no more keepalives. The router must drop the
    // session, and the route, when its 3 s hold timer runs out. The 20 s
    // wait is a safety net: a loaded machine delays the router's timer
    // and its kernel update, and the cause is checked in its own report.
    let start = Instant::now();
    probe.freeze()?;
    let mut down = None;
    let gone = wait_for(
        "the route gone after hold expiry",
        Duration::from_secs(20),
        POLL,
        || {
            if down.is_none() && !router.established(BgpRig::speaker_v4(1))? {
                down = Some(start.elapsed());
            }
            no_route(&rig, v4)
        },
    );
    let gone = match gone {
        Ok(_) => start.elapsed(),
        Err(e) => {
            probe.thaw()?;
            return Err(e.context(router.logs()));
        }
    };
    let report = router.session_report(BgpRig::speaker_v4(1))?;
    probe.thaw()?;
    let down = down.unwrap_or(gone);
    // The last keepalive left at most 1 s before the freeze, so a router
    // that keeps to its 3 s hold time holds the session at least 2 s of
    // it (less a margin for the first poll). That it then dropped the
    // session for the hold timer, not for anything else, its report says.
    if down < Duration::from_millis(1500) {
        bail!(
            "session down {} (route gone {}) after the freeze: before the hold time of 3 s could run out",
            ms(down),
            ms(gone)
        );
    }
    let Some(said) = line_with(&report, "hold timer expired") else {
        bail!("{name} does not report the hold timer expiry:\n{report}");
    };

    // Thawed, the speaker reconnects and announces again.
    let start = Instant::now();
    wait_for(
        "the VIP back after the thaw",
        Duration::from_secs(15),
        POLL,
        || routed_via(&rig, v4, &[lb4]),
    )
    .with_context(|| format!("{}\n{}", probe.log_text(), router.logs()))?;
    let back = start.elapsed();
    eprintln!(
        "{name}: speaker frozen → session down after {}, route gone after {} (hold 3 s, keepalive 1 s), {name} says: {said}; thawed → route back in {}",
        ms(down),
        ms(gone),
        ms(back)
    );
    Ok(())
}

#[test]
fn bird_drops_a_frozen_speaker_at_hold_expiry() {
    check(hold_timer_expiry_when_the_speaker_freezes(RouterKind::Bird));
}

#[test]
fn frr_drops_a_frozen_speaker_at_hold_expiry() {
    check(hold_timer_expiry_when_the_speaker_freezes(RouterKind::Frr));
}

/// Reads one message (header included), within the socket's timeout.
fn read_frame(sock: &mut TcpStream) -> Result<Vec<u8>> {
    let mut msg = vec![0u8; wire::HEADER_LEN];
    sock.read_exact(&mut msg).context("reading a header")?;
    let len = usize::from(u16::from_be_bytes([msg[16], msg[17]]));
    if len < wire::HEADER_LEN {
        bail!("the speaker sent a message of length {len}");
    }
    msg.resize(len, 0);
    sock.read_exact(&mut msg[wire::HEADER_LEN..])
        .context("reading a body")?;
    Ok(msg)
}

/// What the fake peer sends, and when.
struct Case {
    name: &'static str,
    /// Sent instead of a proper OPEN (the session never gets established).
    in_open: bool,
    bytes: Vec<u8>,
    want: Notification,
}

fn cases() -> Vec<Case> {
    let header = |len: u16, msg_type: u8| {
        let mut v = vec![0xff; 16];
        v.extend_from_slice(&len.to_be_bytes());
        v.push(msg_type);
        v
    };
    let update = |body: &[u8]| {
        let mut v = header((wire::HEADER_LEN + body.len()) as u16, wire::TYPE_UPDATE);
        v.extend_from_slice(body);
        v
    };
    let router_id = Ipv4Addr::new(127, 0, 0, 2);
    let mut bad_marker = wire::keepalive();
    bad_marker[0] = 0;
    let mut hold_1 = wire::open(ROUTER_AS, 3, router_id, None).expect("open");
    hold_1[22..24].copy_from_slice(&[0, 1]);
    vec![
        Case {
            name: "marker not all ones",
            in_open: false,
            bytes: bad_marker,
            want: Notification::new(1, 1, []),
        },
        Case {
            name: "length 5000",
            in_open: false,
            bytes: header(5000, wire::TYPE_KEEPALIVE),
            want: Notification::new(1, 2, [0x13, 0x88]),
        },
        Case {
            name: "message type 9",
            in_open: false,
            bytes: header(19, 9),
            want: Notification::new(1, 3, [9]),
        },
        Case {
            name: "withdrawn routes length past the end",
            in_open: false,
            bytes: update(&[0, 50, 0, 0]),
            want: Notification::new(3, 1, []),
        },
        Case {
            name: "path attributes past the message",
            in_open: false,
            bytes: update(&[0, 0, 0, 40, 0x40, 1, 1, 0]),
            want: Notification::new(3, 1, []),
        },
        Case {
            name: "OPEN when Established",
            in_open: false,
            bytes: wire::open(ROUTER_AS, 3, router_id, None).expect("open"),
            want: Notification::new(5, 3, [1]),
        },
        Case {
            name: "hold time 1",
            in_open: true,
            bytes: hold_1,
            want: Notification::new(2, 6, [0, 1]),
        },
        Case {
            name: "wrong AS",
            in_open: true,
            bytes: wire::open(65099, 3, router_id, None).expect("open"),
            want: Notification::new(2, 2, 65099u16.to_be_bytes()),
        },
    ]
}

/// One connection of the fake peer: handshake, the case's bytes, then
/// everything the speaker sends until it closes. Returns the NOTIFICATION
/// it sent.
fn fake_session(listener: &TcpListener, case: &Case) -> Result<(Notification, Duration)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    bail!("the speaker did not (re)connect within 10 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let open = read_frame(&mut sock)?;
    if open.get(18) != Some(&wire::TYPE_OPEN) {
        bail!("expected the speaker's OPEN, got {open:?}");
    }
    if case.in_open {
        sock.write_all(&case.bytes)?;
    } else {
        sock.write_all(&wire::open(
            ROUTER_AS,
            3,
            Ipv4Addr::new(127, 0, 0, 2),
            None,
        )?)?;
        sock.write_all(&wire::keepalive())?;
        let ka = read_frame(&mut sock)?;
        if ka != wire::keepalive() {
            bail!("expected KEEPALIVE, got {ka:?}");
        }
        // Let the speaker enter Established before the bad bytes.
        std::thread::sleep(Duration::from_millis(100));
        sock.write_all(&case.bytes)?;
    }
    let sent = Instant::now();
    let mut rest = Vec::new();
    sock.read_to_end(&mut rest)
        .context("the speaker did not close the connection within 5 s")?;
    let closed = sent.elapsed();
    let mut d = Decoder::new();
    d.set_asn4(true);
    d.extend(&rest);
    let mut last = None;
    while let Some(m) = d.next_message().map_err(|e| anyhow::anyhow!("{e:?}"))? {
        last = Some(m);
    }
    match last {
        Some(Message::Notification(n)) => Ok((n, closed)),
        other => bail!("the speaker's last message was {other:?}, not a NOTIFICATION"),
    }
}

#[test]
fn malformed_messages_from_a_peer_get_the_right_notification() {
    check((|| {
        let _serial = serial();
        // One namespace; the fake peer on its loopback.
        let rig = BgpRig::new(1)?;
        let ns = &rig.speakers[0];
        let peer: SocketAddr = "127.0.0.1:1179".parse().expect("literal");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let fake = ns.spawn(move || -> Result<Vec<(Notification, Duration)>> {
            let listener = TcpListener::bind(peer)?;
            listener.set_nonblocking(true)?;
            let _ = ready_tx.send(());
            cases()
                .iter()
                .map(|c| fake_session(&listener, c).with_context(|| c.name))
                .collect()
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .context("the fake peer did not start")?;
        let config = BgpConfig {
            local_as: SPEAKER_AS,
            router_id: Ipv4Addr::new(127, 0, 0, 1),
            hold_time: Duration::from_secs(3),
            connect_retry: ConnectRetry {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(400),
            },
            next_hop_v4: None,
            next_hop_v6: None,
            graceful_restart: Default::default(),
            graceful_shutdown: None,
            peers: vec![PeerConfig {
                port: peer.port(),
                ..PeerConfig::new(peer.ip(), ROUTER_AS)
            }],
        };
        let mut lb = SpeakerThread::start(ns, config)?;
        let results = fake
            .join()
            .map_err(|_| anyhow::anyhow!("the fake peer panicked"))??;
        let results = results?;
        let mut report = String::new();
        for (case, (got, closed)) in cases().iter().zip(&results) {
            if *got != case.want {
                bail!(
                    "{}: the speaker sent {got}, expected {}",
                    case.name,
                    case.want
                );
            }
            report.push_str(&format!(
                "\n  {:<40} → {got}, closed after {}",
                case.name,
                ms(*closed)
            ));
        }
        // Still alive and well, and it says what happened last (once it
        // has finished closing that connection).
        let row = || lb.peer("127.0.0.1:1179");
        wait_for(
            "the last error in the status",
            Duration::from_secs(5),
            POLL,
            || {
                Ok(row()?
                    .last_error
                    .unwrap_or_default()
                    .contains("bad peer AS"))
            },
        )
        .with_context(|| format!("{:?}", row()))?;
        let established = cases().iter().filter(|c| !c.in_open).count() as u64;
        let s = row()?;
        if s.sessions_established != established {
            bail!("{established} sessions should have been established: {s:?}");
        }
        lb.shutdown()?;
        eprintln!("malformed input, one reconnection each:{report}");
        Ok(())
    })());
}

/// Runs the speaker with `config` for `watch` and fails if the router
/// reaches Established (and, with `ours_too`, if the speaker does). Only
/// the router's view decides where its check is the one that drops: our
/// first segments can beat its `IP_MINTTL` set after accept, so our FSM
/// may see its OPEN and KEEPALIVE while it never sees ours.
fn no_session(
    rig: &BgpRig,
    router: &dyn Router,
    config: BgpConfig,
    what: &str,
    ours_too: bool,
    watch: Duration,
) -> Result<()> {
    let mut lb = SpeakerThread::start(&rig.speakers[0], config)?;
    let start = Instant::now();
    while start.elapsed() < watch {
        if (ours_too && lb.peer(&peer_name(1))?.state == SessionState::Established)
            || router.established(BgpRig::speaker_v4(1))?
        {
            bail!(
                "{} established a session {what} (ours: {:?}):\n{}",
                router.name(),
                lb.peer(&peer_name(1))?,
                router.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    lb.shutdown()
}

/// TCP MD5 (RFC 2385) and GTSM (RFC 5082). Against a router that demands
/// both: with the key and TTL 255, the session and the route; without the
/// key, no session; without GTSM, none either (BIRD and FRR both drop the
/// TTL-64 segments of the connection they accepted). Against
/// a router without GTSM (which sends eBGP with TTL 1), the speaker's own
/// check refuses the session.
fn md5_and_gtsm(kind: RouterKind) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let mut spec = rig.router_spec();
    spec.peers[0].password = Some("lb-md5-Key-1".into());
    spec.peers[0].ttl_security = true;
    let router = start_router_with(kind, &rig, &spec)?;
    let name = router.name();
    let key = rig.dir.path.join("lb1.key");
    std::fs::write(&key, "lb-md5-Key-1\n")?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    let full = || {
        let mut c = speaker_config(1);
        c.peers[0].password_file = Some(key.clone());
        c.peers[0].ttl_security = Some(1);
        c
    };

    let mut lb = SpeakerThread::start(&rig.speakers[0], full())?;
    let up = wait_established(&lb, router.as_ref(), 1, Duration::from_secs(15))?;
    let v4: IpAddr = VIP4.into();
    lb.set(&[v4])?;
    wait_for(
        "the VIP in the router's kernel",
        Duration::from_secs(5),
        POLL,
        || routed_via(&rig, v4, &[BgpRig::speaker_v4(1).into()]),
    )
    .with_context(|| router.logs())?;
    lb.shutdown()?;
    wait_for(
        "the router seeing the session closed",
        Duration::from_secs(5),
        POLL,
        || Ok(!router.established(BgpRig::speaker_v4(1))?),
    )?;

    let watch = Duration::from_millis(2500);
    let mut no_key = full();
    no_key.peers[0].password_file = None;
    no_session(
        &rig,
        router.as_ref(),
        no_key,
        "without the key",
        true,
        watch,
    )?;
    let mut no_gtsm = full();
    no_gtsm.peers[0].ttl_security = None;
    no_session(&rig, router.as_ref(), no_gtsm, "without GTSM", true, watch)?;
    drop(router);

    spec.peers[0].ttl_security = false;
    let router = start_router_with(kind, &rig, &spec)?;
    no_session(
        &rig,
        router.as_ref(),
        full(),
        "sending with TTL 1 to a GTSM speaker",
        true,
        watch,
    )?;
    eprintln!(
        "{name} with TCP MD5 and GTSM: established in {}; no session without the key, none with a router that does not send TTL 255, none without GTSM (watched {} each)",
        ms(up),
        ms(watch)
    );
    Ok(())
}

#[test]
fn bird_with_md5_and_gtsm() {
    check(md5_and_gtsm(RouterKind::Bird));
}

#[test]
fn frr_with_md5_and_gtsm() {
    check(md5_and_gtsm(RouterKind::Frr));
}

/// GTSM on the router only (RFC 5082), lb without it: whatever the
/// router does with lb's TTL-64 segments, lb must never report a session
/// the router does not have. Watched for 8 s; the states seen are printed.
fn gtsm_on_the_router_only(kind: RouterKind) -> Result<()> {
    let _serial = serial();
    let rig = BgpRig::new(1)?;
    let mut spec = rig.router_spec();
    spec.peers[0].ttl_security = true;
    let router = start_router_with(kind, &rig, &spec)?;
    let mut lb = SpeakerThread::start(&rig.speakers[0], speaker_config(1))?;
    let start = Instant::now();
    let mut seen = std::collections::BTreeMap::new();
    while start.elapsed() < Duration::from_secs(8) {
        let ours = lb.peer(&peer_name(1))?;
        let theirs = router.established(BgpRig::speaker_v4(1))?;
        *seen.entry((ours.state.to_string(), theirs)).or_insert(0) += 1;
        if ours.state == SessionState::Established && !theirs {
            // The router may lag a moment behind: only a lasting
            // disagreement is a lie.
            std::thread::sleep(Duration::from_millis(500));
            if lb.peer(&peer_name(1))?.state == SessionState::Established
                && !router.established(BgpRig::speaker_v4(1))?
            {
                bail!(
                    "lb says Established, {} does not: {:?}\n{}",
                    router.name(),
                    lb.peer(&peer_name(1))?,
                    router.session_report(BgpRig::speaker_v4(1))?
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let error = lb.peer(&peer_name(1))?.last_error.unwrap_or_default();
    eprintln!(
        "{} with GTSM, lb without: (our state, router established) samples {seen:?}; last error {error:?}",
        router.name(),
    );
    if !error.contains("ttl_security") {
        bail!("lbctl bgp would not point at GTSM: {error}");
    }
    lb.shutdown()
}

#[test]
fn bird_with_gtsm_on_the_router_only() {
    check(gtsm_on_the_router_only(RouterKind::Bird));
}

#[test]
fn frr_with_gtsm_on_the_router_only() {
    check(gtsm_on_the_router_only(RouterKind::Frr));
}

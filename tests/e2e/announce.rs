//! Route announcement by the real `lbd`: one balancer with its built-in BGP
//! speaker, a real router (BIRD 2 or FRR) that learns the VIP only from
//! it, three backends with health checks, real client connections. What
//! counts is the route the router installs in its kernel: it must appear
//! when `lbd` starts, go when every backend is down and come back when one
//! recovers, go on `lbctl node drain` and on SIGTERM (before `lbd` exits),
//! and go at hold-timer expiry when `lbd` is frozen.
//!
//! The router also has a static route to the balancer with a worse metric
//! (see [`EcmpRig::add_fallback_route`]): it stands in for the rest of a
//! real network, so that established connections can be seen to keep
//! flowing through the still-attached XDP program after a withdrawal.
//! Timings are printed (`--nocapture`); bounds are functional, with slack.
//!
//! Needs root and the bird2 and frr packages. Tests run one at a time.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::{EcmpRig, expect_hops},
    rig::{CLIENT, Lbd},
    routers::{RouterKind, wait_for},
    scenario::{check, serial},
    traffic::{Stream, tcp_request},
};

/// Health checks on both VIPs (they share the address, so the address
/// goes only when both have no usable backend). interval 300ms ±10%,
/// timeout 250ms, fall 3: a dead backend is out within 1.24 s.
const CHECK: &str = "    health_check:\n      port: 80\n      interval: 300ms\n      timeout: 250ms\n      rise: 2\n      fall: 3\n";
const DETECTION: Duration = Duration::from_millis(1240);

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Sends `lbd` SIGTERM and checks the shutdown order: the router loses
/// the VIP route, `lbd` exits cleanly at least `grace` later, and the
/// router reports the session closed by a Cease (administrative
/// shutdown). Returns how long the route took to go and `lbd` to exit.
fn sigterm_withdraws_then_exits(
    rig: &EcmpRig,
    lbd: &mut Lbd,
    grace: Duration,
) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    lbd.signal(libc::SIGTERM)?;
    let gone = rig.wait_hops("the VIP route gone on SIGTERM", &[], Duration::from_secs(5))?;
    let status = lbd
        .wait_exit(Duration::from_secs(15))?
        .context("lbd did not exit within 15 s of SIGTERM")?;
    let exited = t.elapsed();
    if !status.success() || exited < grace || gone >= exited {
        bail!(
            "SIGTERM: route gone after {}, exit ({status}) after {}; expected withdraw, then ≥ {}, then a clean exit",
            ms(gone),
            ms(exited),
            ms(grace)
        );
    }
    let router = rig.router_daemon();
    wait_for(
        "the router reporting the Cease",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            Ok(line_with(
                &router.session_report(rig.balancer(1).addr)?,
                "administrative shutdown",
            )
            .is_some())
        },
    )
    .with_context(|| router.logs())?;
    Ok((gone, exited))
}

/// `lbctl bgp`'s verdict for the TCP VIP: (announced, reason).
fn tcp_verdict(lbd: &Lbd) -> Result<(bool, String)> {
    let bgp = lbd.lbctl_json(&["bgp"])?;
    let v = bgp["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.1:80/tcp"))
        .with_context(|| format!("no TCP VIP in {bgp}"))?;
    Ok((
        v["announced"].as_bool().unwrap_or(false),
        v["reason"].as_str().unwrap_or("").to_string(),
    ))
}

/// Fails unless every stream completes round trips during `window`.
fn all_flowing(streams: &[Stream], window: Duration) -> Result<()> {
    let before: Vec<u64> = streams.iter().map(Stream::exchanges).collect();
    std::thread::sleep(window);
    for (s, b) in streams.iter().zip(before) {
        if s.ended() || s.exchanges() <= b {
            bail!(
                "the stream from port {} to {} {} ({} round trips)",
                s.sport,
                s.backend,
                if s.ended() { "ended" } else { "stalled" },
                s.exchanges()
            );
        }
    }
    Ok(())
}

/// Stops the streams; fails if any of them broke.
fn finish_clean(streams: Vec<Stream>) -> Result<usize> {
    let n = streams.len();
    for s in streams {
        let r = s.finish()?;
        if let Some(e) = r.error {
            bail!("the stream from port {} broke: {e}", r.sport);
        }
    }
    Ok(n)
}

/// The first line of `text` containing `needle` (case-insensitive).
fn line_with(text: &str, needle: &str) -> Option<String> {
    text.lines()
        .find(|l| l.to_lowercase().contains(needle))
        .map(|l| l.trim().to_string())
}

#[test]
fn bird_route_follows_health_drain_and_shutdown() {
    let _serial = serial();
    check((|| {
        let mut rig = EcmpRig::new(1, 3, RouterKind::Bird)?;
        rig.add_fallback_route(1)?;
        let config = rig.lbd_config(1, CHECK, "shutdown_grace: 2s\n");
        let started = Instant::now();
        let mut lbd = rig.start_lbd(1, &config)?;
        let up = started.elapsed();
        rig.wait_hops(
            "the VIP route after lbd starts",
            &[1],
            Duration::from_secs(15),
        )?;
        let announced = started.elapsed();
        let bgp = lbd.lbctl_json(&["bgp"])?;
        let peer = &bgp["peers"][0];
        if peer["state"] != "Established" || peer["prefixes_announced"] != 1 {
            bail!("lbctl bgp after start: {bgp}");
        }
        let status = lbd.lbctl(&["status"])?;
        if line_with(&status, "bgp: 1 of 1 up, 1 address(es) announced").is_none() {
            bail!("lbctl status does not mention the speaker:\n{status}");
        }

        // Every backend dies: the address goes (both VIPs lost theirs).
        for be in ["be1", "be2", "be3"] {
            rig.stop_server(be);
        }
        let withdrawn = rig.wait_hops(
            "the VIP route gone with every backend down",
            &[],
            DETECTION * 2 + Duration::from_secs(3),
        )?;
        let (on, why) = tcp_verdict(&lbd)?;
        if on || !why.starts_with("withheld: 0 of 3 backends usable") {
            bail!("lbctl bgp says {on} / {why:?} with every backend down");
        }
        let table = lbd.lbctl(&["bgp"])?;
        // One recovers: rise 2 at ≤ 330 ms, then the announcement.
        rig.start_server("be2")?;
        let back = rig.wait_hops("the VIP route back", &[1], Duration::from_secs(10))?;
        for be in ["be1", "be3"] {
            rig.start_server(be)?;
        }
        // Until they are up, panic mode has the dead ones in the table, and
        // connections to them would be cut when they leave it.
        wait_for(
            "every backend up again",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || Ok(tcp_verdict(&lbd)?.1.starts_with("3 of 3")),
        )?;
        eprintln!(
            "BIRD + lbd: lbd answering {} after spawn, route in the router's kernel {} after spawn; \
             all backends down → route gone {} (detection bound {}); one back → route back {}\n{table}",
            ms(up),
            ms(announced),
            ms(withdrawn),
            ms(DETECTION),
            ms(back)
        );

        // Drain: the route goes, connections keep flowing (through the
        // backstop path and the still-attached program), new ones too.
        let streams = rig.streams(
            40_000..40_030,
            Duration::from_millis(20),
            Duration::from_secs(3),
        )?;
        let forwarded = lbd.counter("fwd_conntrack_hit")?;
        let drain = lbd.lbctl(&["node", "drain", "--no-wait"])?;
        let drained = rig.wait_hops("the VIP route gone on drain", &[], Duration::from_secs(5))?;
        if !drain.contains("withdrew 10.99.0.1") {
            bail!("lbctl node drain said: {drain}");
        }
        let (on, why) = tcp_verdict(&lbd)?;
        if on || !why.contains("node is drained") {
            bail!("lbctl bgp says {on} / {why:?} while drained");
        }
        all_flowing(&streams, Duration::from_secs(1))?;
        let vip = rig.tcp_vip();
        rig.client
            .within(move || tcp_request(CLIENT, 41_000, vip))?
            .context("a new connection while drained")?;
        if lbd.counter("fwd_conntrack_hit")? <= forwarded {
            bail!("the drained balancer stopped forwarding");
        }
        // A drained node stays drained over a reload.
        lbd.lbctl(&["reload"])?;
        std::thread::sleep(Duration::from_millis(300));
        expect_hops(&rig, &[])?;
        // And over a crash: killed and started again, lbd comes up
        // drained and says so; its session is up, its route is not.
        lbd.kill9()?;
        lbd = rig.start_lbd(1, &config)?;
        wait_for(
            "the session up again",
            Duration::from_secs(15),
            Duration::from_millis(50),
            || Ok(lbd.lbctl_json(&["bgp"])?["peers"][0]["state"] == "Established"),
        )?;
        std::thread::sleep(Duration::from_millis(500));
        expect_hops(&rig, &[])?;
        let (on, why) = tcp_verdict(&lbd)?;
        if on || !why.contains("node is drained") {
            bail!("lbctl bgp says {on} / {why:?} after a crash while drained");
        }
        if !lbd.log_text().contains("it starts drained") {
            bail!("lbd did not say it starts drained:\n{}", lbd.log_text());
        }
        lbd.lbctl(&["node", "undrain"])?;
        let undrained = rig.wait_hops(
            "the VIP route back on undrain",
            &[1],
            Duration::from_secs(5),
        )?;
        all_flowing(&streams, Duration::from_millis(500))?;

        // SIGTERM: withdraw first, wait shutdown_grace (2 s), Cease, exit.
        // The program stays attached: connections keep flowing after exit.
        let (gone, exited) = sigterm_withdraws_then_exits(&rig, &mut lbd, Duration::from_secs(2))?;
        all_flowing(&streams, Duration::from_secs(1))?;
        let n = finish_clean(streams)?;
        if !rig.balancer(1).pin_dir().join("link-eth0").exists() {
            bail!("the program did not stay attached after a graceful exit");
        }
        eprintln!(
            "BIRD + lbd: node drain → route gone {}, still gone after a reload and a kill -9, undrain → back {}; SIGTERM → route gone {}, lbd exited {} (shutdown_grace 2 s), BIRD saw Cease; {n} connections kept flowing throughout, also after lbd exited",
            ms(drained),
            ms(undrained),
            ms(gone),
            ms(exited)
        );
        Ok(())
    })());
}

#[test]
fn bird_never_sees_a_vip_whose_backends_are_all_dead_at_start() {
    let _serial = serial();
    check((|| {
        let mut rig = EcmpRig::new(1, 2, RouterKind::Bird)?;
        for be in ["be1", "be2"] {
            rig.stop_server(be);
        }
        let lbd = rig.start_lbd(1, &rig.lbd_config(1, CHECK, ""))?;
        // From the session's establishment until well past the probes'
        // first verdicts (fall 3 × 330 ms), the route never appears.
        wait_for(
            "the BGP session",
            Duration::from_secs(15),
            Duration::from_millis(20),
            || Ok(lbd.lbctl_json(&["bgp"])?["peers"][0]["state"] == "Established"),
        )?;
        let watch = Instant::now();
        while watch.elapsed() < DETECTION * 2 + Duration::from_millis(500) {
            let hops = rig.next_hops()?;
            if !hops.is_empty() {
                bail!(
                    "the router got a route to a VIP with every backend dead, {} after the session came up: {hops:?}",
                    ms(watch.elapsed())
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (on, why) = tcp_verdict(&lbd)?;
        if on || !why.starts_with("withheld: 0 of 2 backends usable") {
            bail!("lbctl bgp says {on} / {why:?}");
        }
        // The first backend that answers brings the route.
        rig.start_server("be1")?;
        let back = rig.wait_hops(
            "the VIP route once be1 answers",
            &[1],
            Duration::from_secs(10),
        )?;
        eprintln!(
            "BIRD + lbd, every backend dead at start: no route for {} after the session came up; route {} after be1 started",
            ms(watch.elapsed()),
            ms(back)
        );
        Ok(())
    })());
}

#[test]
fn bird_drops_a_frozen_lbd_at_hold_expiry_and_forwarding_goes_on() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(1, 3, RouterKind::Bird)?;
        rig.add_fallback_route(1)?;
        let lbd = rig.start_lbd(1, &rig.lbd_config(1, "", ""))?;
        rig.wait_hops(
            "the VIP route after lbd starts",
            &[1],
            Duration::from_secs(15),
        )?;
        let streams = rig.streams(
            42_000..42_010,
            Duration::from_millis(20),
            Duration::from_secs(3),
        )?;

        // Frozen: no keepalives. The router drops the session (and the
        // route) when its 3 s hold timer runs out; the program goes on.
        lbd.signal(libc::SIGSTOP)?;
        let gone = rig.wait_hops(
            "the VIP route gone at hold expiry",
            &[],
            Duration::from_secs(8),
        );
        let gone = match gone {
            Ok(d) => d,
            Err(e) => {
                lbd.signal(libc::SIGCONT)?;
                return Err(e);
            }
        };
        let flowing = all_flowing(&streams, Duration::from_millis(500));
        let report = rig.router_daemon().session_report(rig.balancer(1).addr)?;
        lbd.signal(libc::SIGCONT)?;
        flowing.context("while lbd was frozen")?;
        // The last keepalive left at most 1 s before the freeze.
        if gone < Duration::from_millis(1500) {
            bail!(
                "the route went {} after the freeze: before any hold timer could expire",
                ms(gone)
            );
        }
        let Some(said) = line_with(&report, "hold timer expired") else {
            bail!("BIRD does not report the hold timer expiry:\n{report}");
        };
        let back = rig.wait_hops(
            "the VIP route back after SIGCONT",
            &[1],
            Duration::from_secs(15),
        )?;
        let n = finish_clean(streams)?;
        eprintln!(
            "BIRD + lbd: lbd frozen (SIGSTOP) → route gone {} (hold 3 s; BIRD: {said}); SIGCONT → route back {}; {n} connections kept flowing",
            ms(gone),
            ms(back)
        );
        Ok(())
    })());
}

#[test]
fn frr_route_follows_start_drain_reload_and_shutdown() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(1, 3, RouterKind::Frr)?;
        let config = rig.lbd_config(1, "", "shutdown_grace: 1s\ndetach_on_exit: true\n");
        let started = Instant::now();
        let mut lbd = rig.start_lbd(1, &config)?;
        rig.wait_hops(
            "the VIP route after lbd starts",
            &[1],
            Duration::from_secs(20),
        )?;
        let announced = started.elapsed();
        let router = rig.router_daemon();
        let lb1: IpAddr = rig.balancer(1).addr.into();
        if !router.has_bgp_route(lb_tests::rig::VIP.into())?
            || !router.established(rig.balancer(1).addr)?
        {
            bail!("FRR has no session or BGP route:\n{}", router.logs());
        }

        let drained = {
            lbd.lbctl(&["node", "drain", "--no-wait"])?;
            rig.wait_hops("the VIP route gone on drain", &[], Duration::from_secs(5))?
        };
        let undrained = {
            lbd.lbctl(&["node", "undrain"])?;
            rig.wait_hops(
                "the VIP route back on undrain",
                &[1],
                Duration::from_secs(5),
            )?
        };

        // A reload that leaves `announce:` alone keeps the session.
        let row = |lbd: &Lbd| -> Result<serde_json::Value> {
            Ok(lbd.lbctl_json(&["bgp"])?["peers"][0].clone())
        };
        let before = row(&lbd)?;
        lbd.lbctl(&["reload"])?;
        let after = row(&lbd)?;
        if after["sessions_established"] != before["sessions_established"]
            || after["state"] != "Established"
        {
            bail!("a reload without announce changes touched the session: {before} → {after}");
        }
        // One that changes it restarts the speaker; the route comes back.
        std::fs::write(
            &lbd.config,
            config.replace("hold_time: 3s", "hold_time: 6s"),
        )?;
        lbd.lbctl(&["reload"])?;
        if !lbd.log_text().contains("restarting the announcers") {
            bail!(
                "changing announce: did not restart the announcers:\n{}",
                lbd.log_text()
            );
        }
        rig.wait_hops(
            "the VIP route after the restart",
            &[1],
            Duration::from_secs(15),
        )?;

        // SIGTERM with detach_on_exit: withdraw, grace, Cease, detach.
        let (gone, exited) = sigterm_withdraws_then_exits(&rig, &mut lbd, Duration::from_secs(1))?;
        if rig.balancer(1).pin_dir().exists() {
            bail!("detach_on_exit: the pins are still there");
        }
        eprintln!(
            "FRR + lbd ({lb1}): route in the router's kernel {} after spawn; drain → gone {}, undrain → back {}; SIGTERM → gone {}, exited {} (grace 1 s, detached), FRR saw Cease",
            ms(announced),
            ms(drained),
            ms(undrained),
            ms(gone),
            ms(exited)
        );
        Ok(())
    })());
}

/// "Announced" means a router has it. An IPv6 VIP beside the IPv4 one, a
/// `next_hop_v6` set, and a BIRD that takes IPv4 only: the speaker cannot
/// send the IPv6 route, so `lbctl bgp`, `lbctl status` and the metrics
/// say it is not announced (wanted, held by no router, and why), while the
/// IPv4 VIP is, and BIRD's IPv6 table stays empty.
#[test]
fn an_ipv6_vip_that_no_router_takes_is_never_called_announced() {
    let _serial = serial();
    check((|| {
        let mut rig = EcmpRig::new_with(1, 2, RouterKind::Bird, false, &|spec| {
            spec.ipv4_only = true;
        })?;
        rig.speaker_extra = "    next_hop_v6: fd00:98::2\n".into();
        let metrics = "127.0.0.1:9471";
        let mut config = rig.lbd_config(1, "", &format!("metrics:\n  listen: {metrics}\n"));
        config.push_str(&format!(
            "  - address: fd00:99::1\n    port: 80\n    protocol: tcp\n    backends:\n      - address: {}\n",
            rig.backends[0].addr
        ));
        let lbd = rig.start_lbd(1, &config)?;
        rig.wait_hops("the IPv4 VIP route", &[1], Duration::from_secs(15))?;
        let v6: IpAddr = "fd00:99::1".parse()?;
        // The speaker has had its chance to send everything.
        std::thread::sleep(Duration::from_millis(500));
        let bgp = lbd.lbctl_json(&["bgp"])?;
        let vip6 = bgp["vips"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["vip"] == "[fd00:99::1]:80/tcp"))
            .with_context(|| format!("no IPv6 VIP in {bgp}"))?;
        let reason = vip6["reason"].as_str().unwrap_or("");
        if vip6["announced"] != false
            || vip6["wanted"] != true
            || !reason.contains("did not offer IPv6 unicast")
        {
            bail!("lbctl bgp on the IPv6 VIP: {vip6}");
        }
        let (on, _) = tcp_verdict(&lbd)?;
        let peer = &bgp["peers"][0];
        if !on || peer["families"] != serde_json::json!(["ipv4"]) {
            bail!("the IPv4 VIP or the peer's families: {bgp}");
        }
        if bgp["announced"] != serde_json::json!(["10.99.0.1"]) {
            bail!("lbctl bgp's announced addresses: {}", bgp["announced"]);
        }
        let status = lbd.lbctl(&["status"])?;
        if line_with(
            &status,
            "1 address(es) announced, 1 wanted but held by no router",
        )
        .is_none()
        {
            bail!("lbctl status:\n{status}");
        }
        let scrape = rig.balancer(1).ns.within(move || -> Result<String> {
            use std::io::{Read as _, Write as _};
            let mut s = std::net::TcpStream::connect(metrics)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(s, "GET /metrics HTTP/1.0\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        })??;
        for want in [
            "lb_vip_announced{vip=\"[fd00:99::1]:80/tcp\"} 0",
            "lb_address_announced{address=\"fd00:99::1\"} 0",
            "lb_vip_announced{vip=\"10.99.0.1:80/tcp\"} 1",
            "lb_bgp_routes_announced{peer=\"10.98.1.1:179\",family=\"ipv4\"} 1",
        ] {
            if !scrape.contains(want) {
                bail!("the metrics lack {want}:\n{scrape}");
            }
        }
        let routes = lb_tests::routers::kernel_routes(&rig.router, v6)?;
        if !routes.trim().is_empty() {
            bail!("BIRD has an IPv6 route after all: {routes}");
        }
        eprintln!("IPv6 VIP over an IPv4-only session: {reason}");
        Ok(())
    })());
}

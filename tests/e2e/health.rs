//! End-to-end tests of health checks and backend states: real probes from
//! `lbd` against real servers in the namespace rig, the real XDP program,
//! real client connections. Needs root.
//!
//! Detection and recovery times are measured (from the moment a server
//! stops to the moment its slots leave the kernel table) and printed. What
//! the test asserts is counted, not timed: the backend leaves after `fall`
//! failed probes (one more may have been under way when it died). The
//! prober's schedule, which turns that count into the documented time
//! bound, is checked in virtual time by a unit test (`health.rs`).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, Rig, bin_path},
    scenario::{KillOnDrop, check, finish, run_streams, serial, setup_with},
    traffic::{Mode, tcp_request},
};

const VIP: &str = "10.99.0.1:80/tcp";

/// interval 300ms ±10%, timeout 250ms, fall 3: bound 0.33 × 3 + 0.25 s.
const CHECK: &str = "    health_check:\n      interval: 300ms\n      timeout: 250ms\n      rise: 2\n      fall: 3\n      jitter: 10\n";
const BOUND: Duration = Duration::from_millis(1240);

/// Slots of backend `addr` in the VIP's table (the kernel's table: the
/// daemon's view is written back only after the map writes succeed).
fn slots(lbd: &Lbd, addr: &str) -> Result<u64> {
    let t = lbd.lbctl_json(&["table", VIP])?;
    Ok(t["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .and_then(|b| b["slots"].as_u64())
        .unwrap_or(0))
}

/// Polls (every 20 ms, for at most `limit`) until `cond` holds; returns how
/// long that took.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond()? {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("condition not reached within {limit:?}")
}

/// The TCP VIP's entry of `lbctl health`.
fn vip_health(lbd: &Lbd) -> Result<serde_json::Value> {
    let h = lbd.lbctl_json(&["health"])?;
    h.as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == VIP))
        .cloned()
        .with_context(|| format!("no health entry for {VIP}: {h}"))
}

/// Probes run so far against backend `addr` (`field` `probes`), or their
/// number when the probes last changed its state (`probes_at_change`).
fn probes_field(lbd: &Lbd, addr: &str, field: &str) -> Result<u64> {
    vip_health(lbd)?["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .and_then(|b| b[field].as_u64())
        .with_context(|| format!("no {field} for {addr}"))
}

fn probes(lbd: &Lbd, addr: &str) -> Result<u64> {
    probes_field(lbd, addr, "probes")
}

fn state(lbd: &Lbd, addr: &str) -> Result<String> {
    vip_health(lbd)?["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .and_then(|b| b["state"].as_str())
        .map(str::to_string)
        .with_context(|| format!("no health entry for {addr}"))
}

/// Makes `n` new connections from ports `first..` and counts them by backend.
fn new_connections(rig: &Rig, first: u16, n: u16) -> Result<BTreeMap<String, u32>> {
    let vip = rig.tcp_vip();
    let got: Vec<Result<String>> = rig.client.within(move || {
        (first..first + n)
            .map(|p| tcp_request(CLIENT, p, vip))
            .collect()
    })?;
    let mut split = BTreeMap::new();
    for g in got {
        *split.entry(g?).or_default() += 1;
    }
    Ok(split)
}

#[test]
fn a_dead_backend_leaves_within_the_bound_and_returns_after_rise() {
    let _serial = serial();
    check((|| {
        let (mut rig, lbd) = setup_with(3, &[Some(1), Some(1), Some(1)], CHECK)?;
        let be2 = "10.10.32.2";
        wait_for(Duration::from_secs(5), || Ok(state(&lbd, be2)? == "active"))?;
        let streams = run_streams(&rig, 50_000..50_030)?;
        std::thread::sleep(Duration::from_millis(500));

        let probes_before = probes(&lbd, be2)?;
        rig.stop_server("be2");
        let stopped = Instant::now();
        wait_for(Duration::from_secs(120), || Ok(slots(&lbd, be2)? == 0))?;
        let detection = stopped.elapsed();
        // The probes the daemon had run when it took be2 down (not when
        // this test got round to asking: a busy machine delays that).
        let failed = probes_field(&lbd, be2, "probes_at_change")? - probes_before;
        eprintln!(
            "detection: {detection:?} from server stop to zero slots (the prober's bound {BOUND:?} on an idle machine), after {failed} probes (fall 3)"
        );
        // fall failures; one more if a probe that started before the
        // server stopped still succeeded.
        if !(3..=3 + 1).contains(&failed) {
            bail!("be2 went down after {failed} probes; fall is 3");
        }
        if state(&lbd, be2)? != "down" {
            bail!("be2 is not reported down");
        }
        let split = new_connections(&rig, 51_000, 60)?;
        if split.contains_key("be2") {
            bail!("new connections still reach the dead backend: {split:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
        let reports = finish(streams)?;
        let broken: Vec<_> = reports
            .iter()
            .filter(|r| r.backend != "be2" && r.error.is_some())
            .collect();
        if !broken.is_empty() {
            bail!("connections to healthy backends broke: {broken:?}");
        }

        rig.start_server("be2", Mode::Echo)?;
        let restarted = Instant::now();
        wait_for(Duration::from_secs(120), || Ok(slots(&lbd, be2)? > 0))?;
        let recovery = restarted.elapsed();
        // rise = 2 probes at ≤ 330 ms intervals.
        eprintln!("recovery: {recovery:?} from server start to slots back (rise 2 × ≤330ms)");
        let split = new_connections(&rig, 52_000, 60)?;
        if !split.contains_key("be2") {
            bail!("the recovered backend gets no new connection: {split:?}");
        }
        Ok(())
    })());
}

#[test]
fn draining_finishes_existing_connections_and_sends_no_new_ones() {
    let _serial = serial();
    check((|| {
        let extra = format!("{CHECK}    drain_timeout: 4s\n");
        let (rig, lbd) = setup_with(3, &[Some(1), Some(1), Some(1)], &extra)?;
        let streams = run_streams(&rig, 53_000..53_030)?;
        let on_be1 = streams.iter().filter(|s| s.backend == "be1").count();
        if on_be1 == 0 {
            bail!("no stream on be1");
        }
        lbd.lbctl(&["backend", "drain", VIP, "10.10.31.2"])?;
        if state(&lbd, "10.10.31.2")? != "draining" {
            bail!("be1 is not draining");
        }
        if slots(&lbd, "10.10.31.2")? != 0 {
            bail!("a draining backend still has slots");
        }
        let split = new_connections(&rig, 54_000, 60)?;
        if split.contains_key("be1") {
            bail!("new connections reach a draining backend: {split:?}");
        }
        // Within drain_timeout, every existing connection keeps going.
        std::thread::sleep(Duration::from_secs(2));
        let reports = finish(streams)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a connection broke while draining: {r:?}");
        }
        eprintln!("drain: {on_be1} connections on be1 kept going, 60 new ones avoided it");

        // After drain_timeout, connections still on it are cut (re-picked).
        lbd.lbctl(&["backend", "undrain", VIP, "10.10.31.2"])?;
        let streams = run_streams(&rig, 55_000..55_030)?;
        let streams_be1 = streams.iter().filter(|s| s.backend == "be1").count();
        if streams_be1 == 0 {
            bail!("no stream on be1 after undrain");
        }
        lbd.lbctl(&["backend", "drain", VIP, "10.10.31.2"])?;
        std::thread::sleep(Duration::from_secs(6));
        let reports = finish(streams)?;
        let cut = reports
            .iter()
            .filter(|r| r.backend == "be1" && r.error.is_some())
            .count();
        let others = reports
            .iter()
            .filter(|r| r.backend != "be1" && r.error.is_some())
            .count();
        eprintln!(
            "drain timeout: {cut} of {streams_be1} connections on be1 cut, {others} others broke"
        );
        if others != 0 || cut != streams_be1 {
            bail!("after drain_timeout: {cut} of {streams_be1} on be1 cut, {others} others broke");
        }
        lbd.lbctl(&["backend", "undrain", VIP, "10.10.31.2"])?;
        if state(&lbd, "10.10.31.2")? == "draining" {
            bail!("undrain did not take");
        }
        Ok(())
    })());
}

/// A backend's live flows as `lbctl health` shows them.
fn live_flows(lbd: &Lbd, addr: &str) -> Result<Option<u64>> {
    Ok(vip_health(lbd)?["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .and_then(|b| b["live_flows"].as_u64()))
}

/// Established connections to port 80 in a backend's namespace (`ss`).
fn established(rig: &Rig, name: &str) -> Result<u64> {
    Ok(client_connections(rig, name)?.lines().count() as u64)
}

/// `ss`'s lines for the connections backend `name` holds on port 80 from
/// the client: not `lbd`'s health probes (every 300 ms here), which a
/// read may catch established for a moment.
fn client_connections(rig: &Rig, name: &str) -> Result<String> {
    let filter = format!("( sport = :80 and dst {CLIENT} )");
    let out = rig
        .backend(name)
        .ns
        .run("ss", &["-Htn", "state", "established", &filter])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Drain to empty: the live flows `lbd` counts for a backend being
/// drained match the client's connections the backend holds (`ss`),
/// within one (a stream between its two reads); they fall to 0 once the
/// connections close (after the 10 s idle window), the backend becomes
/// `drained`, and `lbctl backend drain --wait` returns then, saying so.
#[test]
fn a_drained_backend_reaches_empty_and_drain_wait_returns_then() {
    let _serial = serial();
    check((|| {
        let extra = format!("{CHECK}    drain_timeout: 300s\n");
        let (rig, lbd) = setup_with(2, &[Some(1), Some(1)], &extra)?;
        let streams = run_streams(&rig, 56_000..56_016)?;
        let (on_be1, others): (Vec<_>, Vec<_>) =
            streams.into_iter().partition(|s| s.backend == "be1");
        if on_be1.len() < 2 {
            bail!("{} streams on be1", on_be1.len());
        }
        let guard = KillOnDrop::new(
            std::process::Command::new(bin_path("lbctl")?)
                .arg("--socket")
                .arg(&lbd.socket)
                .args(["backend", "drain", VIP, "10.10.31.2", "--wait"])
                .stdout(std::process::Stdio::piped())
                .spawn()?,
        );
        // The drain (lbctl sends it), then the first scan after it (every
        // 2 s while a backend drains): until then the count is absent.
        wait_for(Duration::from_secs(60), || {
            Ok(state(&lbd, "10.10.31.2")? == "draining")
        })?;
        let counted = Instant::now();
        wait_for(Duration::from_secs(60), || {
            Ok(live_flows(&lbd, "10.10.31.2")?.is_some())
        })?;
        let live = live_flows(&lbd, "10.10.31.2")?.unwrap_or(0);
        let held = established(&rig, "be1")?;
        eprintln!(
            "be1 draining: lbd counts {live} live flows, ss shows {held} connections ({} streams), {:?} after the drain",
            on_be1.len(),
            counted.elapsed()
        );
        if live.abs_diff(held) > 1 || live.abs_diff(on_be1.len() as u64) > 1 {
            bail!(
                "lbd counts {live} live flows; be1 holds {held} ({} streams)",
                on_be1.len()
            );
        }
        if state(&lbd, "10.10.31.2")? != "draining" {
            bail!("be1 with live flows is {}", state(&lbd, "10.10.31.2")?);
        }
        let reports = finish(on_be1)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a connection broke while draining: {r:?}");
        }
        let closed = Instant::now();
        let output = guard.wait_with_output(Duration::from_secs(90))?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        eprintln!(
            "$ lbctl backend drain {VIP} 10.10.31.2 --wait ({:?} after the streams closed)\n{text}",
            closed.elapsed()
        );
        if !output.status.success() || !text.contains("10.10.31.2 is drained: no live flows") {
            bail!("drain --wait ended {} saying:\n{text}", output.status);
        }
        if state(&lbd, "10.10.31.2")? != "drained" || live_flows(&lbd, "10.10.31.2")? != Some(0) {
            bail!(
                "after --wait, be1 is {} with {:?} live flows",
                state(&lbd, "10.10.31.2")?,
                live_flows(&lbd, "10.10.31.2")?
            );
        }
        let held = client_connections(&rig, "be1")?;
        if !held.is_empty() {
            bail!("be1 still holds connections from the client:\n{held}");
        }
        let reports = finish(others)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a connection to be2 broke: {r:?}");
        }
        Ok(())
    })());
}

/// The client ports of the connections a backend holds to port 80, from
/// its own TCP stack (`ss`'s peer column).
fn peer_ports(rig: &Rig, name: &str) -> Result<BTreeMap<u16, String>> {
    let out = rig
        .backend(name)
        .ns
        .run("ss", &["-Htn", "state", "established", "( sport = :80 )"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| {
            let peer = l.split_whitespace().nth(3).context("an ss line")?;
            let port = peer.rsplit_once(':').context("address:port")?.1;
            Ok((port.parse()?, name.to_string()))
        })
        .collect()
}

/// `lbctl conns`: on a 2M-bucket table, the flows of the rig's client
/// found by `--client` are exactly the connections the backends' TCP
/// stacks hold from it (client port → backend, `ss` in each namespace),
/// and `--backend` counts each backend's. The search times are printed
/// (the figures of the closing note), not asserted.
#[test]
fn conns_shows_each_connection_with_its_client_port_and_backend() {
    let _serial = serial();
    check((|| {
        let rig = Rig::new(2)?;
        let config = rig.dir.join("lbd.yaml");
        let text = rig.config_with(&[Some(1), Some(1)], "");
        std::fs::write(
            &config,
            text.replace("conntrack_buckets: 65536", "conntrack_buckets: 2097152"),
        )?;
        let lbd = Lbd::start(&rig, &config)?;
        let streams = run_streams(&rig, 57_000..57_012)?;
        // The tick rate is learnt in the first seconds: idle times then.
        std::thread::sleep(Duration::from_secs(3));
        let mut held = peer_ports(&rig, "be1")?;
        held.extend(peer_ports(&rig, "be2")?);
        let by_name = |addr: &str| {
            rig.backends
                .iter()
                .find(|b| b.addr.to_string() == addr)
                .map(|b| b.name.clone())
        };
        let found = lbd.lbctl_json(&["conns", VIP, "--client", &CLIENT.to_string()])?;
        let rows = found["rows"].as_array().context("rows")?;
        let mut seen = BTreeMap::new();
        for r in rows {
            let client = r["client"].as_str().context("a client")?;
            let (addr, port) = client.rsplit_once(':').context("address:port")?;
            let backend = r["backend"].as_str().and_then(by_name).context("backend")?;
            // Every stream sends each 20 ms: idle for a tick at most,
            // 5 s being a stall that would have broken it.
            let idle = r["idle_secs"].as_f64().context("an idle time")?;
            if addr != CLIENT.to_string() || r["confirmed"] != true || idle > 5.0 {
                bail!("unexpected row {r}");
            }
            seen.insert(port.parse::<u16>()?, backend);
        }
        eprintln!(
            "conns --client {CLIENT}: {} flows, {} in {:.0} ms; ss holds {}",
            seen.len(),
            found["searched"],
            found["elapsed_ms"].as_f64().unwrap_or(-1.0),
            held.len()
        );
        if seen != held || held.len() != streams.len() {
            bail!("lbctl conns found {seen:?}; the backends hold {held:?}");
        }
        for name in ["be1", "be2"] {
            let addr = rig.backend(name).addr.to_string();
            let one = lbd.lbctl_json(&["conns", "--backend", &addr, "--limit", "1"])?;
            let want = held.values().filter(|b| *b == name).count() as u64;
            eprintln!(
                "conns --backend {addr}: {} matched, {} in {:.0} ms",
                one["matched"],
                one["searched"],
                one["elapsed_ms"].as_f64().unwrap_or(-1.0)
            );
            if one["matched"].as_u64() != Some(want)
                || one["rows"].as_array().map(Vec::len) != Some(1)
            {
                bail!("conns --backend {addr}: {one}; {want} connections held");
            }
        }
        // A preview of removing be1 counts its live flows apart from its
        // entries: once some of its connections close (and 10 s pass),
        // their entries stay but only the open ones are live.
        let be1 = rig.backend("be1").addr.to_string();
        let (mut on_be1, others): (Vec<_>, Vec<_>) =
            streams.into_iter().partition(|s| s.backend == "be1");
        let closing: Vec<_> = on_be1.drain(..on_be1.len() / 2).collect();
        let entries = (on_be1.len() + closing.len()) as u64;
        finish(closing)?;
        let del = ["--dry-run", "backend", "del", VIP, &be1, "--force"];
        let breaking = || -> Result<(Option<u64>, Option<u64>)> {
            let preview = lbd.lbctl_json(&del)?;
            let change = &preview["preview"]["vips_changed"][0];
            Ok((
                change["flows_breaking"].as_u64(),
                change["live_flows_breaking"].as_u64(),
            ))
        };
        let want = (Some(entries), Some(on_be1.len() as u64));
        wait_for(Duration::from_secs(60), || Ok(breaking()? == want)).with_context(|| {
            format!(
                "--dry-run backend del {be1}: {:?}, want {want:?}",
                breaking()
            )
        })?;
        eprintln!("$ lbctl {}\n{}", del.join(" "), lbd.lbctl(&del)?);
        let streams: Vec<_> = on_be1.into_iter().chain(others).collect();
        eprintln!(
            "$ lbctl conns {VIP} --client {CLIENT} --limit 4\n{}",
            lbd.lbctl(&[
                "conns",
                VIP,
                "--client",
                &CLIENT.to_string(),
                "--limit",
                "4"
            ])?
        );
        let reports = finish(streams)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a stream broke: {r:?}");
        }
        Ok(())
    })());
}

#[test]
fn slow_start_ramps_up_a_new_backends_share() {
    let _serial = serial();
    check((|| {
        let extra = "    slow_start: 8s\n";
        let (rig, lbd) = setup_with(4, &[Some(1), Some(1), Some(1), None], extra)?;
        lbd.lbctl(&["backend", "add", VIP, "10.10.34.2"])?;
        let added = Instant::now();
        let mut shares = Vec::new();
        let mut conns = Vec::new();
        for (i, at) in [1u64, 3, 5, 7, 10].into_iter().enumerate() {
            let wait = Duration::from_secs(at).saturating_sub(added.elapsed());
            std::thread::sleep(wait);
            shares.push(slots(&lbd, "10.10.34.2")?);
            let split = new_connections(&rig, 56_000 + 100 * i as u16, 60)?;
            conns.push(split.get("be4").copied().unwrap_or(0));
        }
        eprintln!(
            "slow start (8s): be4 slots at 1/3/5/7/10 s: {shares:?}; new connections of 60: {conns:?}"
        );
        if shares.windows(2).any(|w| w[1] < w[0]) || shares[0] * 4 > shares[4] {
            bail!("be4's share did not ramp up: {shares:?}");
        }
        // Full weight: a quarter of 65537 slots, ±1%.
        let full = 65_537 / 4;
        if shares[4].abs_diff(full) > full / 100 {
            bail!("after the window be4 has {} slots, want ≈{full}", shares[4]);
        }
        if conns[0] >= conns[4] {
            bail!("its share of new connections did not grow: {conns:?}");
        }
        Ok(())
    })());
}

#[test]
fn panic_mode_spreads_traffic_over_all_backends() {
    let _serial = serial();
    check((|| {
        // Probes hit a separate health port, so that "the probes fail" and
        // "the service fails" can be told apart.
        let extra = format!("{CHECK}      port: 8081\n");
        let mut rig = Rig::new(4)?;
        for b in ["be1", "be2", "be3", "be4"] {
            rig.start_health_port(b, 8081)?;
        }
        let config = rig.dir.join("lbd.yaml");
        std::fs::write(
            &config,
            rig.config_with(&[Some(1), Some(1), Some(1), Some(1)], &extra),
        )?;
        let lbd = Lbd::start(&rig, &config)?;
        wait_for(Duration::from_secs(5), || {
            Ok(vip_health(&lbd)?["backends"][0]["probes"].as_u64() > Some(2))
        })?;

        // Two of four failing: 50% healthy, not below the threshold.
        rig.stop_health_port("be1");
        rig.stop_health_port("be2");
        wait_for(Duration::from_secs(20), || {
            Ok(slots(&lbd, "10.10.31.2")? == 0 && slots(&lbd, "10.10.32.2")? == 0)
        })
        .context("two of four down (50%, not below the threshold) should leave the table")?;
        // A third: 25% healthy → panic: the table uses all four again.
        rig.stop_health_port("be3");
        wait_for(Duration::from_secs(20), || {
            Ok(slots(&lbd, "10.10.31.2")? > 0)
        })?;
        let health = vip_health(&lbd)?;
        if health["panic"] != true || health["panic_entered"] != 1 {
            bail!("panic mode not reported: {health}");
        }
        for b in ["10.10.31.2", "10.10.32.2", "10.10.33.2", "10.10.34.2"] {
            if slots(&lbd, b)? < 15_000 {
                bail!("in panic mode {b} should have about a quarter of the slots");
            }
        }
        let split = new_connections(&rig, 57_000, 120)?;
        eprintln!("panic mode: 120 new connections over all four: {split:?}");
        if split.len() != 4 {
            bail!("traffic not spread over all backends in panic mode: {split:?}");
        }
        let log = lbd.log_text();
        if log.matches("panic mode, the table uses all").count() != 1 {
            bail!("panic mode should be logged exactly once:\n{log}");
        }
        // Back above the threshold: panic over, the failing ones out.
        rig.start_health_port("be1", 8081)?;
        rig.start_health_port("be2", 8081)?;
        wait_for(Duration::from_secs(20), || {
            Ok(slots(&lbd, "10.10.33.2")? == 0)
        })?;
        if vip_health(&lbd)?["panic"] != false {
            bail!("still in panic mode with 3 of 4 healthy");
        }
        Ok(())
    })());
}

#[test]
fn fast_failures_are_not_healthy_backends() {
    let _serial = serial();
    check((|| {
        let (mut rig, lbd) = setup_with(3, &[Some(1), Some(1), Some(1)], CHECK)?;
        // be1 accepts and closes at once; be2 refuses.
        rig.start_server("be1", Mode::AcceptClose)?;
        rig.stop_server("be2");
        for (what, reload) in [
            ("connect", None),
            ("send/expect", Some("      expect: \"be\"\n")),
        ] {
            if let Some(expect) = reload {
                let text =
                    rig.config_with(&[Some(1), Some(1), Some(1)], &format!("{CHECK}{expect}"));
                std::fs::write(&lbd.config, text)?;
                lbd.lbctl(&["reload"])?;
                // A changed check restarts the verdicts: wait for new ones.
                std::thread::sleep(Duration::from_millis(300));
            }
            // Every backend's verdict, not the first two alone: be3 needs
            // its `rise` successes as the others need their `fall`
            // failures, and on a loaded machine it once had not had them
            // yet when both broken backends were down.
            let states = || -> Result<[String; 3]> {
                Ok([
                    state(&lbd, "10.10.31.2")?,
                    state(&lbd, "10.10.32.2")?,
                    state(&lbd, "10.10.33.2")?,
                ])
            };
            wait_for(Duration::from_secs(20), || {
                Ok(states()? == ["down", "down", "active"])
            })
            .with_context(|| {
                format!(
                    "{what} probes: be1, be2, be3 should be down, down, active; they are {:?}",
                    states()
                )
            })?;
            let h = lbd.lbctl(&["health"])?;
            eprintln!("{what} probes:\n{h}");
            if !h.contains("right after accepting") && !h.contains("closed without answering") {
                bail!("{what}: the accept-and-close failure is not explained:\n{h}");
            }
        }
        Ok(())
    })());
}

#[test]
fn probes_through_the_tunnel_catch_a_backend_without_its_vip() {
    let _serial = serial();
    check((|| {
        let extra = format!("{CHECK}      through_tunnel: true\n");
        let (rig, lbd) = setup_with(3, &[Some(1), Some(1), Some(1)], &extra)?;
        wait_for(Duration::from_secs(5), || {
            Ok(vip_health(&lbd)?["backends"].as_array().is_some_and(|b| {
                b.iter()
                    .all(|b| b["probes"].as_u64() > Some(2) && b["health"] == "up")
            }))
        })
        .context("tunnelled probes should find all three healthy")?;
        // be2 loses its VIP: its port is still open on its own address, but
        // packets for the VIP reach nothing.
        let be2 = rig.backend("be2");
        be2.ns.ip(&["addr", "del", "10.99.0.1/32", "dev", "lo"])?;
        wait_for(Duration::from_secs(20), || {
            Ok(state(&lbd, "10.10.32.2")? == "down")
        })
        .context("the tunnelled probe should fail without the VIP on lo")?;
        for b in ["10.10.31.2", "10.10.33.2"] {
            if state(&lbd, b)? != "active" {
                bail!("{b} should stay active");
            }
        }
        be2.ns.ip(&["addr", "add", "10.99.0.1/32", "dev", "lo"])?;
        wait_for(Duration::from_secs(20), || {
            Ok(state(&lbd, "10.10.32.2")? == "active")
        })?;
        eprintln!("{}", lbd.lbctl(&["health"])?);
        Ok(())
    })());
}

/// A tmux session, killed when dropped (also on failure).
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(std::process::Command::new("tmux").args(args).output()?)
    }

    /// The visible screen, as text.
    fn screen(&self) -> Result<String> {
        let out = self.run(&["capture-pane", "-p", "-t", &self.0])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn alive(&self) -> Result<bool> {
        Ok(self.run(&["has-session", "-t", &self.0])?.status.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-session", "-t", &self.0]);
    }
}

/// `lbctl top` in a real terminal (tmux): its screen, read back with
/// `capture-pane`, shows the VIP, each backend with its state and live
/// flows, and the totals; `s` changes the sort, `q` quits. `--once`
/// prints the same lines plainly.
#[test]
fn lbctl_top_shows_vips_backends_and_rates_and_quits_on_q() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup_with(2, &[Some(1), Some(1)], "")?;
        let streams = run_streams(&rig, 57_100..57_106)?;
        let tmux = Tmux(format!("lbtop{}", std::process::id()));
        let command = format!(
            "{} --socket {} top",
            bin_path("lbctl")?.display(),
            lbd.socket.display()
        );
        let started = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            &tmux.0,
            "-x",
            "150",
            "-y",
            "40",
            &command,
        ])?;
        if !started.status.success() {
            bail!("tmux: {}", String::from_utf8_lossy(&started.stderr));
        }
        let backend_lines = |screen: &str| -> usize {
            rig.backends
                .iter()
                .filter(|b| {
                    screen
                        .lines()
                        .any(|l| l.contains(&format!("  {}", b.addr)) && l.contains("active"))
                })
                .count()
        };
        let shown = wait_for(Duration::from_secs(30), || {
            let s = tmux.screen()?;
            Ok(s.contains(VIP) && s.contains("forwarded") && backend_lines(&s) == 2)
        })
        .with_context(|| format!("lbctl top's screen:\n{}", tmux.screen().unwrap_or_default()))?;
        let screen = tmux.screen()?;
        eprintln!("lbctl top drew its screen within {shown:?}:\n{screen}");
        if !screen.contains("live flows") || !screen.contains("sorted by pps") {
            bail!("no live flows column or sort line:\n{screen}");
        }
        // The view follows lbd: the VIP's live flows reach the streams'
        // count once lbd's periodic scan (every 15 s) has seen them.
        let vip_flows = |screen: &str| -> Option<usize> {
            let line = screen.lines().find(|l| l.starts_with(VIP))?;
            line.split_whitespace().nth(4)?.parse().ok()
        };
        wait_for(Duration::from_secs(60), || {
            Ok(vip_flows(&tmux.screen()?) == Some(streams.len()))
        })
        .with_context(|| {
            format!(
                "live flows never reached {}:\n{}",
                streams.len(),
                tmux.screen().unwrap_or_default()
            )
        })?;
        tmux.run(&["send-keys", "-t", &tmux.0, "s"])?;
        wait_for(Duration::from_secs(10), || {
            Ok(tmux.screen()?.contains("sorted by bps"))
        })
        .context("s did not change the sort")?;
        tmux.run(&["send-keys", "-t", &tmux.0, "q"])?;
        wait_for(Duration::from_secs(10), || Ok(!tmux.alive()?)).context("q did not quit")?;
        let once = lbd.lbctl(&["top", "--once"])?;
        eprintln!("$ lbctl top --once\n{once}");
        if !once.contains(VIP) || once.lines().filter(|l| l.contains("active")).count() < 2 {
            bail!("lbctl top --once:\n{once}");
        }
        let reports = finish(streams)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a stream broke: {r:?}");
        }
        Ok(())
    })());
}

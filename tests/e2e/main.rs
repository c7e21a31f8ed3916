//! End-to-end tests: the real `lbd` and `lbctl` binaries, the real XDP
//! program on a veth in a namespace rig, real TCP and UDP servers behind the
//! decap program, real clients. Needs root; without it every test fails
//! with a message saying so.
//!
//! Tests run one at a time (they share the machine's two cores and the
//! timing of streaming connections).

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, VIP},
    scenario::{check, finish, predicted, run_streams, serial, setup},
    traffic::{tcp_request, udp_request},
};

#[test]
fn tcp_connections_follow_the_weights_and_bypass_the_balancer() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(2)])?;
        let not_vip_before = lbd.counter("pass_not_vip")?;
        // Watch the balancer's interface for anything sent from the VIP.
        let tcpdump = rig
            .lb
            .command("tcpdump")
            .args(["-i", "eth0", "-nn", "-l", "-q", &format!("src host {VIP}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tcpdump")?;
        std::thread::sleep(Duration::from_millis(500));

        // 300 connections from fixed source ports, each exchanging data.
        let ports: Vec<u16> = (20_000..20_300).collect();
        let vip = rig.tcp_vip();
        let got: Vec<Result<String>> = rig
            .client
            .within(move || ports.iter().map(|&p| tcp_request(CLIENT, p, vip)).collect())?;
        let mut split: BTreeMap<String, u32> = BTreeMap::new();
        for (i, r) in got.into_iter().enumerate() {
            let sport = 20_000 + i as u16;
            let backend = r.with_context(|| format!("connection from port {sport}"))?;
            let want = predicted(&lbd, &rig, sport)?;
            if backend != want {
                bail!("port {sport} reached {backend}, lbctl simulate said {want}");
            }
            *split.entry(backend).or_default() += 1;
        }
        // Weights 1:1:2 → 75/75/150 expected. Stated tolerance: ±30% of
        // each expectation (4σ of the binomial spread for 300 flows). The
        // flows are fixed, so this cannot flake.
        for (name, want) in [("be1", 75.0), ("be2", 75.0), ("be3", 150.0)] {
            let n = split.get(name).copied().unwrap_or(0) as f64;
            if (n - want).abs() > 0.3 * want {
                bail!("{name} got {n} of 300 connections, expected {want} ± 30%: {split:?}");
            }
        }
        eprintln!("per-backend split of 300 connections (weights 1:1:2): {split:?}");

        // DSR: the balancer saw no packet from the VIP. Its XDP program sees
        // every frame on the interface, and would count a reply as
        // pass_not_vip; tcpdump would see it after XDP_PASS.
        let not_vip_after = lbd.counter("pass_not_vip")?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(tcpdump.id() as i32, libc::SIGINT) };
        let out = tcpdump.wait_with_output()?;
        let seen = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count();
        if not_vip_after != not_vip_before || seen != 0 {
            bail!(
                "replies crossed the balancer: pass_not_vip {not_vip_before}→{not_vip_after}, tcpdump saw {seen} packets from the VIP:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let forwarded = lbd.counter("fwd_maglev_new_flow")?
            + lbd.counter("fwd_handshake")?
            + lbd.counter("fwd_conntrack_hit")?;
        if forwarded < 300 * 4 {
            bail!("only {forwarded} packets forwarded for 300 connections");
        }
        Ok(())
    })());
}

#[test]
fn udp_requests_get_answers_through_the_vip() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let vip = rig.udp_vip();
        let answers: Vec<Result<String>> = rig.client.within(move || {
            (30_000..30_060)
                .map(|p| udp_request(CLIENT, p, vip))
                .collect()
        })?;
        let mut split: BTreeMap<String, u32> = BTreeMap::new();
        for a in answers {
            *split.entry(a?).or_default() += 1;
        }
        if split.len() != 3 {
            bail!("60 UDP flows should reach all three backends: {split:?}");
        }
        eprintln!("UDP split of 60 flows: {split:?}");
        let stats = lbd.lbctl_json(&["stats"])?;
        let udp = stats["vips"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.1:53/udp"))
            .context("UDP VIP in stats")?;
        if udp["packets"].as_u64().unwrap_or(0) < 60 {
            bail!("UDP VIP counted {} packets", udp["packets"]);
        }
        Ok(())
    })());
}

#[test]
fn adding_and_removing_backends_under_streaming_load() {
    let _serial = serial();
    check((|| {
        // Four backends serve; the fourth is not in the configuration yet.
        let (rig, lbd) = setup(4, &[Some(1), Some(1), Some(1), None])?;
        let streams = run_streams(&rig, 40_000..40_050)?;
        std::thread::sleep(Duration::from_secs(2));

        lbd.lbctl(&["backend", "add", "10.99.0.1:80/tcp", "10.10.34.2"])?;
        std::thread::sleep(Duration::from_secs(3));
        // New connections now reach the newcomer too.
        let vip = rig.tcp_vip();
        let fresh: Vec<Result<String>> = rig.client.within(move || {
            (41_000..41_100)
                .map(|p| tcp_request(CLIENT, p, vip))
                .collect()
        })?;
        let fresh: Vec<String> = fresh.into_iter().collect::<Result<_>>()?;
        if !fresh.iter().any(|b| b == "be4") {
            bail!("no new connection reached the added backend");
        }
        let reports = finish(streams)?;
        let broken: Vec<_> = reports.iter().filter(|r| r.error.is_some()).collect();
        if !broken.is_empty() {
            bail!(
                "{} of 50 streams broke when a backend was added: {broken:?}",
                broken.len()
            );
        }
        eprintln!("add: 50 of 50 streams unbroken");

        // Remove be2: only its own connections may break.
        let streams = run_streams(&rig, 42_000..42_050)?;
        let on_be2 = streams.iter().filter(|s| s.backend == "be2").count();
        if on_be2 == 0 {
            bail!("no stream landed on be2; the removal would prove nothing");
        }
        std::thread::sleep(Duration::from_secs(1));
        lbd.lbctl(&["backend", "del", "10.99.0.1:80/tcp", "10.10.32.2"])?;
        std::thread::sleep(Duration::from_secs(4));
        let reports = finish(streams)?;
        let others_broken: Vec<_> = reports
            .iter()
            .filter(|r| r.backend != "be2" && r.error.is_some())
            .collect();
        if !others_broken.is_empty() {
            bail!("streams on other backends broke: {others_broken:?}");
        }
        let be2_broken = reports
            .iter()
            .filter(|r| r.backend == "be2" && r.error.is_some())
            .count();
        eprintln!(
            "remove: {} streams on other backends unbroken; {be2_broken} of {on_be2} on the removed backend ended",
            50 - on_be2
        );
        if be2_broken != on_be2 {
            bail!(
                "only {be2_broken} of {on_be2} streams on the removed backend noticed; were they still forwarded to it?"
            );
        }
        Ok(())
    })());
}

#[test]
fn kill_9_and_restart_keep_connections_and_runtime_changes() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        // A runtime change that must survive the restart.
        lbd.lbctl(&["backend", "weight", "10.99.0.1:80/tcp", "10.10.33.2", "3"])?;
        let streams = run_streams(&rig, 43_000..43_050)?;
        std::thread::sleep(Duration::from_secs(1));
        let config = lbd.config.clone();
        lbd.kill9()?;
        // Forwarding goes on without the daemon.
        std::thread::sleep(Duration::from_secs(2));
        let vip = rig.tcp_vip();
        rig.client
            .within(move || tcp_request(CLIENT, 44_000, vip))?
            .context("a new connection while lbd is dead")?;
        let lbd = Lbd::start(&rig, &config)?;
        std::thread::sleep(Duration::from_secs(2));
        let reports = finish(streams)?;
        let broken: Vec<_> = reports.iter().filter(|r| r.error.is_some()).collect();
        if !broken.is_empty() {
            bail!(
                "{} streams broke across kill -9 and restart: {broken:?}",
                broken.len()
            );
        }
        let worst = reports.iter().map(|r| r.max_gap).max().unwrap_or_default();
        eprintln!("kill -9 + restart: 50 of 50 streams unbroken, longest gap {worst:?}");

        let status = lbd.lbctl_json(&["status"])?;
        if status["maps_adopted"] != true || status["interfaces"][0]["adopted"] != true {
            bail!("restarted lbd did not adopt the pinned maps and link: {status}");
        }
        if status["vips"] != 2 || status["backends"] != 6 || status["api_changes"] != true {
            bail!("unexpected status after restart: {status}");
        }
        let vips = lbd.lbctl_json(&["vip", "list"])?;
        let weight = vips
            .as_array()
            .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.1:80/tcp"))
            .and_then(|v| v["backends"].as_array())
            .and_then(|b| b.iter().find(|b| b["address"] == "10.10.33.2"))
            .map(|b| b["weight"].clone());
        if weight != Some(serde_json::json!(3)) {
            bail!("the runtime weight change was lost: {vips}");
        }
        let human = lbd.lbctl(&["status"])?;
        if !human.contains("adopted") || !human.contains("runtime change") {
            bail!("lbctl status does not say so:\n{human}");
        }
        Ok(())
    })());
}

#[test]
fn an_invalid_reload_is_rejected_and_forwarding_continues() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let streams = run_streams(&rig, 45_000..45_010)?;
        let good = std::fs::read_to_string(&lbd.config)?;
        let bad = good.replacen("weight: 1", "wieght: 1", 1);
        std::fs::write(&lbd.config, &bad)?;

        let err = lbd
            .lbctl(&["reload"])
            .expect_err("an invalid file is refused");
        let msg = format!("{err:#}");
        if !msg.contains("unknown field `wieght`") || !msg.contains("vips[0].backends[0]") {
            bail!("the error does not name the field: {msg}");
        }
        // SIGHUP takes the same path.
        lbd.signal(libc::SIGHUP)?;
        std::thread::sleep(Duration::from_millis(500));
        let status = lbd.lbctl_json(&["status"])?;
        let last = status["last_reload"].as_str().unwrap_or_default();
        if !last.starts_with("failed") {
            bail!("status does not report the failed reload: {status}");
        }
        if !lbd
            .log_text()
            .contains("reload failed, keeping the running configuration")
        {
            bail!("lbd did not log the failed SIGHUP reload");
        }
        let vip = rig.tcp_vip();
        let fresh: Vec<Result<String>> = rig.client.within(move || {
            (46_000..46_030)
                .map(|p| tcp_request(CLIENT, p, vip))
                .collect()
        })?;
        for f in fresh {
            f.context("a new connection after the failed reload")?;
        }
        let reports = finish(streams)?;
        if let Some(r) = reports.iter().find(|r| r.error.is_some()) {
            bail!("a stream broke during the failed reload: {r:?}");
        }

        // A valid edit then reloads fine.
        std::fs::write(&lbd.config, good.replacen("weight: 1", "weight: 2", 1))?;
        lbd.lbctl(&["reload"])?;
        let table = lbd.lbctl_json(&["table", "10.99.0.1:80/tcp"])?;
        let be1 = table["backends"]
            .as_array()
            .and_then(|b| b.iter().find(|b| b["address"] == "10.10.31.2"))
            .context("be1 in the table")?;
        if be1["weight"] != 2 {
            bail!("the valid reload did not apply: {table}");
        }
        Ok(())
    })());
}

#[test]
fn lbctl_rejects_bad_requests_clearly() {
    let _serial = serial();
    check((|| {
        let (_rig, lbd) = setup(1, &[Some(1)])?;
        for (args, want) in [
            (
                vec!["backend", "del", "10.99.0.1:80/tcp", "10.10.99.2"],
                "has no backend 10.10.99.2",
            ),
            (
                vec!["backend", "add", "10.99.0.9:80/tcp", "10.10.31.2"],
                "no VIP 10.99.0.9:80/tcp",
            ),
            (
                vec!["vip", "add", "10.99.0.1:80/tcp", "--backend", "10.10.31.2"],
                "already exists",
            ),
            (
                vec![
                    "backend",
                    "weight",
                    "10.99.0.1:80/tcp",
                    "10.10.31.2",
                    "99999",
                ],
                "out of range",
            ),
            (vec!["table", "10.99.0.1"], "is not a VIP"),
        ] {
            let err = lbd.lbctl(&args).expect_err("rejected");
            if !format!("{err:#}").contains(want) {
                bail!("lbctl {}: expected {want:?}, got {err:#}", args.join(" "));
            }
        }
        // Raw malformed requests on the socket: an error each, not a crash.
        for raw in [
            "{\"op\": 42}\n",
            "not json\n",
            "{\"op\":\"vip_del\",\"vip\":\"1.2.3.4:1/tcp\"}\n",
        ] {
            use std::io::{BufRead as _, Write as _};
            let mut s = std::os::unix::net::UnixStream::connect(&lbd.socket)?;
            s.write_all(raw.as_bytes())?;
            let mut answer = String::new();
            std::io::BufReader::new(s).read_line(&mut answer)?;
            if !answer.contains("\"ok\":false") {
                bail!("{raw:?} was answered {answer}");
            }
        }
        lbd.lbctl(&["status"]).context("lbd still answers")?;
        Ok(())
    })());
}

/// Client affinity (`hash: [src_ip]`): 50 connections from one client
/// address, each from another source port, all reach one backend, and the
/// same one again after `kill -9` and a restart of `lbd`; the 5-tuple VIP
/// beside it spreads the same client's connections.
#[test]
fn a_source_affinity_vip_keeps_a_client_on_one_backend_across_a_restart() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = lb_tests::scenario::setup_with(
            3,
            &[Some(1), Some(1), Some(1)],
            "    hash: [src_ip]\n",
        )?;
        let vip = rig.tcp_vip();
        let backends = |first: u16| -> Result<BTreeMap<String, usize>> {
            let got: Vec<Result<String>> = rig.client.within(move || {
                (first..first + 50)
                    .map(|p| tcp_request(CLIENT, p, vip))
                    .collect()
            })?;
            let mut count = BTreeMap::new();
            for r in got {
                *count.entry(r?).or_insert(0) += 1;
            }
            Ok(count)
        };
        let before = backends(47_000)?;
        if before.len() != 1 {
            bail!("50 connections of one client reached {before:?}");
        }
        let config = lbd.config.clone();
        lbd.kill9()?;
        let lbd = Lbd::start(&rig, &config)?;
        let after = backends(47_100)?;
        if after != before {
            bail!("before the restart {before:?}, after {after:?}");
        }
        let udp = rig.udp_vip();
        let spread = rig.client.within(move || {
            (47_200..47_250u16)
                .map(|p| udp_request(CLIENT, p, udp))
                .collect::<Vec<_>>()
        })?;
        let names: std::collections::BTreeSet<String> =
            spread.into_iter().collect::<Result<_>>()?;
        if names.len() < 2 {
            bail!("the 5-tuple UDP VIP sent 50 flows of one client to {names:?}");
        }
        eprintln!(
            "source affinity: 50 + 50 connections of one client to {before:?}, across kill -9; the 5-tuple VIP spread them over {}",
            names.len()
        );
        lbd.lbctl(&["status"])?;
        Ok(())
    })());
}

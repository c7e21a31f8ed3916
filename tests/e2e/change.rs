//! Safe configuration change with the real `lbd` and `lbctl`, in the
//! namespace rig with real connections: a reload on probation
//! (`--confirm-within`) that nobody confirms is reverted by `lbd` itself
//! while connections to the backends it did not touch go on; a confirmed
//! one stays; a revert by number, which a reload of the unchanged file
//! does not undo; the share of slots `lbctl diff` predicts is the share
//! `lbctl table` shows moved afterwards; and, against BIRD, a change that
//! empties an announced VIP is reverted before the route leaves the
//! router.
//!
//! Needs root (namespaces, XDP) and bird2 for the last test. Tests run one
//! at a time. `--nocapture` shows the operator's view (diff, history).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::EcmpRig,
    rig::{Lbd, Rig, bin_path},
    routers::{RouterKind, wait_for},
    scenario::{check, finish, predicted, run_streams, serial, setup},
};

fn tcp_vip(rig: &Rig) -> String {
    format!("{}/tcp", rig.tcp_vip())
}

/// Every slot's backend of the TCP VIP, from `lbctl table --slots`.
fn slots(lbd: &Lbd, rig: &Rig) -> Result<Vec<serde_json::Value>> {
    let t = lbd.lbctl_json(&["table", &tcp_vip(rig), "--slots"])?;
    t["slots"]
        .as_array()
        .cloned()
        .context("lbctl table --slots lists the slots")
}

/// The TCP VIP's backends as `lbctl vip list` shows them: (address, weight).
fn backends(lbd: &Lbd, rig: &Rig) -> Result<Vec<(String, u64)>> {
    let vips = lbd.lbctl_json(&["vip", "list"])?;
    let vip = vips
        .as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == tcp_vip(rig)))
        .context("the TCP VIP is listed")?;
    Ok(vip["backends"]
        .as_array()
        .context("backends")?
        .iter()
        .map(|b| {
            (
                b["address"].as_str().unwrap_or("").to_string(),
                b["weight"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

fn status(lbd: &Lbd) -> Result<serde_json::Value> {
    lbd.lbctl_json(&["status"])
}

#[test]
fn an_unconfirmed_reload_is_reverted_by_lbd_and_untouched_flows_go_on() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let before = slots(&lbd, &rig)?;
        let listed = backends(&lbd, &rig)?;
        let streams = run_streams(&rig, 43_000..43_030)?;
        let on_be3: Vec<u16> = streams
            .iter()
            .filter(|s| s.backend == "be3")
            .map(|s| s.sport)
            .collect();
        std::fs::write(&lbd.config, rig.config(&[Some(1), Some(1), None]))?;
        let out = lbd.lbctl(&["reload", "--confirm-within", "3s"])?;
        if !out.contains("on probation") {
            bail!("reload --confirm-within says:\n{out}");
        }
        let pending = &status(&lbd)?["pending_confirm"];
        if pending.is_null() || backends(&lbd, &rig)?.len() != 2 {
            bail!("the change did not run on probation: {pending}");
        }
        let started = Instant::now();
        wait_for(
            "the automatic revert",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || Ok(status(&lbd)?["auto_reverts"] == 1),
        )?;
        let took = started.elapsed();
        if took < Duration::from_millis(2500) {
            bail!("reverted after {took:?}, before the 3 s window ended");
        }
        let s = status(&lbd)?;
        let source = s["revision_source"].as_str().unwrap_or("");
        if !source.starts_with("automatic revert of") || !s["pending_confirm"].is_null() {
            bail!("after the revert: {s}");
        }
        if backends(&lbd, &rig)? != listed || slots(&lbd, &rig)? != before {
            bail!("the revert did not bring the previous revision's VIP and table back");
        }
        for report in finish(streams)? {
            if on_be3.contains(&report.sport) {
                continue; // its backend left for a while: it may break
            }
            if let Some(e) = report.error {
                bail!("stream {} on {} broke: {e}", report.sport, report.backend);
            }
        }
        eprintln!("reverted by itself {took:?} after `lbctl reload --confirm-within 3s`");
        eprintln!("{}", lbd.lbctl(&["history"])?);
        Ok(())
    })());
}

/// A change on probation, then `kill -9` of `lbd` and a restart before
/// the deadline: the new `lbd` shows the probation and reverts at the
/// deadline the first one set.
#[test]
fn a_probation_survives_kill_9_and_a_restart() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let listed = backends(&lbd, &rig)?;
        std::fs::write(&lbd.config, rig.config(&[Some(1), Some(1), None]))?;
        let changed = Instant::now();
        lbd.lbctl(&["reload", "--confirm-within", "8s"])?;
        let revision = status(&lbd)?["pending_confirm"]["revision"].clone();
        let config = lbd.config.clone();
        lbd.kill9()?;
        let lbd = Lbd::start(&rig, &config)?;
        let pending = status(&lbd)?["pending_confirm"].clone();
        if pending["revision"] != revision {
            bail!("the restarted lbd does not hold the probation of {revision}: {pending}");
        }
        wait_for(
            "the automatic revert after the restart",
            Duration::from_secs(120),
            Duration::from_millis(50),
            || Ok(status(&lbd)?["auto_reverts"] == 1),
        )?;
        let took = changed.elapsed();
        if took < Duration::from_secs(7) {
            bail!("reverted {took:?} after the change, before its 8 s window ended");
        }
        if backends(&lbd, &rig)? != listed {
            bail!("the revert after the restart did not bring the VIP back");
        }
        eprintln!("the probation survived kill -9; reverted {took:?} after the change");
        Ok(())
    })());
}

#[test]
fn a_confirmed_reload_stays() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        std::fs::write(&lbd.config, rig.config(&[Some(1), Some(1), None]))?;
        lbd.lbctl(&["reload", "--confirm-within", "3s"])?;
        let out = lbd.lbctl(&["confirm"])?;
        if !out.contains("confirmed") {
            bail!("lbctl confirm says:\n{out}");
        }
        std::thread::sleep(Duration::from_secs(4));
        let s = status(&lbd)?;
        if s["auto_reverts"] != 0 || backends(&lbd, &rig)?.len() != 2 {
            bail!("the confirmed change did not stay: {s}");
        }
        Ok(())
    })());
}

#[test]
fn a_revert_by_number_survives_a_reload_of_the_unchanged_file() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        std::fs::write(&lbd.config, rig.config(&[Some(2), Some(1), Some(1)]))?;
        lbd.lbctl(&["reload"])?;
        let weighted = backends(&lbd, &rig)?;
        let revision = status(&lbd)?["revision"].as_u64().context("revision")?;
        std::fs::write(&lbd.config, rig.config(&[Some(1), Some(1), None]))?;
        lbd.lbctl(&["reload"])?;
        let out = lbd.lbctl(&["revert", &revision.to_string()])?;
        eprintln!("$ lbctl revert {revision}\n{out}");
        if backends(&lbd, &rig)? != weighted {
            bail!("revert {revision} did not bring its backends back");
        }
        let s = status(&lbd)?;
        if s["file_differs"].is_null() {
            bail!("status does not say the file differs from what runs: {s}");
        }
        let out = lbd.lbctl(&["reload"])?;
        if !out.contains("unchanged") || backends(&lbd, &rig)? != weighted {
            bail!("a reload of the unchanged file undid the revert:\n{out}");
        }
        lbd.signal(libc::SIGHUP)?;
        std::thread::sleep(Duration::from_secs(1));
        if backends(&lbd, &rig)? != weighted {
            bail!("SIGHUP of the unchanged file undid the revert");
        }
        // A changed file applies as usual.
        std::fs::write(&lbd.config, rig.config(&[Some(1), Some(3), None]))?;
        lbd.lbctl(&["reload"])?;
        if backends(&lbd, &rig)?.len() != 2 {
            bail!("a changed file did not apply after the revert");
        }
        let history = lbd.lbctl(&["history"])?;
        eprintln!("$ lbctl history\n{history}");
        if !history.contains(&format!("revert to {revision}")) {
            bail!("history does not show the revert:\n{history}");
        }
        Ok(())
    })());
}

#[test]
fn the_share_diff_predicts_is_the_share_the_table_moves() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let before = slots(&lbd, &rig)?;
        let file = rig.dir.join("next.yaml");
        std::fs::write(&file, rig.config(&[Some(1), Some(1), Some(3)]))?;
        let path = file.to_string_lossy().to_string();
        let (changed, text) = lbd.lbctl_diff(&["-o", "json", "diff", &path])?;
        if !changed {
            bail!("lbctl diff of a changed file exited 0");
        }
        let diff: serde_json::Value = serde_json::from_str(&text)?;
        let change = diff["preview"]["vips_changed"]
            .as_array()
            .and_then(|v| v.iter().find(|c| c["vip"] == tcp_vip(&rig)))
            .with_context(|| format!("diff names the TCP VIP: {diff}"))?;
        let predicted_moves = change["slots_moved"].as_u64().context("slots_moved")?;
        eprintln!(
            "$ lbctl diff {path}\n{}",
            lbd.lbctl_diff(&["diff", &path])?.1
        );
        if slots(&lbd, &rig)? != before {
            bail!("lbctl diff changed the table");
        }
        std::fs::copy(&file, &lbd.config)?;
        lbd.lbctl(&["reload"])?;
        let after = slots(&lbd, &rig)?;
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as u64;
        if moved != predicted_moves || moved == 0 {
            bail!("diff predicted {predicted_moves} slots to move; the table moved {moved}");
        }
        // The backend the simulation names is the table's.
        predicted(&lbd, &rig, 44_000)?;
        Ok(())
    })());
}

#[test]
fn bird_keeps_the_route_when_a_change_that_empties_the_vip_is_reverted() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(1, 2, RouterKind::Bird)?;
        let good = rig.lbd_config(1, "", "");
        let lbd = rig.start_lbd(1, &good)?;
        rig.wait_hops("the VIP route", &[1], Duration::from_secs(15))?;
        let mut empty = good.clone();
        for b in &rig.backends {
            let line = format!("      - address: {}\n", b.addr);
            empty = empty.replace(&line, &format!("{line}        weight: 0\n"));
        }
        std::fs::write(&lbd.config, &empty)?;
        // lbctl runs as a child while this thread watches the router.
        let reload = std::process::Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&lbd.socket)
            .args(["reload", "--force", "--confirm-within", "1m"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let mut watch = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            if rig.next_hops()?.is_empty() {
                watch.push("the route left the router");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = reload.wait_with_output()?;
        if !out.status.success() {
            bail!("lbctl reload: {}", String::from_utf8_lossy(&out.stderr));
        }
        if !watch.is_empty() {
            bail!("{} ({} samples)\n{}", watch[0], watch.len(), rig.logs());
        }
        let s = lbd.lbctl_json(&["status"])?;
        let source = s["revision_source"].as_str().unwrap_or("");
        if s["auto_reverts"] != 1 || !source.contains("lose its announcement") {
            bail!("the emptying change was not reverted at once: {s}");
        }
        rig.wait_hops("the route, still", &[1], Duration::from_secs(1))?;
        Ok(())
    })());
}

/// Every command of `lbctl -o json`, run against a real `lbd`: `Lbd::lbctl`
/// checks each output against `docs/api.schema.json` with an independent
/// validator (and refusals against the answer line's schema), so the
/// published schema is held to what lbctl prints, command by command.
#[test]
fn every_lbctl_json_output_matches_the_published_schema() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let vip = tcp_vip(&rig);
        let be1 = rig.backend("be1").addr.to_string();
        let client = lb_tests::rig::CLIENT.to_string();
        let extra = "10.99.0.7:8080/tcp";
        let config = rig.dir.join("lbd.yaml");
        let config = config.to_str().context("path")?;
        let json = |args: &[&str]| -> Result<()> {
            let mut all = vec!["-o", "json"];
            all.extend_from_slice(args);
            lbd.lbctl(&all).map(drop)
        };
        let commands: Vec<Vec<&str>> = vec![
            vec!["status"],
            vec!["vip", "list"],
            vec!["health"],
            vec!["stats"],
            vec!["table", &vip, "--slots"],
            vec!["simulate", &vip, "10.10.1.2:40000"],
            vec!["simulate", &vip, &client],
            vec!["conns"],
            vec!["conns", &vip, "--client", &client],
            vec!["bgp"],
            vec!["history"],
            vec!["overrides", "list"],
            vec!["top"],
            vec!["--dry-run", "backend", "weight", &vip, &be1, "3"],
            vec!["vip", "add", extra, "--backend", "10.10.31.2"],
            vec!["backend", "add", extra, "10.10.32.2"],
            vec!["backend", "weight", extra, "10.10.32.2", "2"],
            vec!["backend", "drain", extra, "10.10.32.2"],
            vec!["backend", "undrain", extra, "10.10.32.2"],
            vec!["backend", "del", extra, "10.10.32.2"],
            vec!["overrides", "list"],
            vec!["overrides", "clear", extra],
            vec![
                "--confirm-within",
                "5m",
                "backend",
                "weight",
                &vip,
                &be1,
                "2",
            ],
            vec!["confirm"],
            vec!["revert"],
            vec!["reload"],
            vec!["node", "drain", "--no-wait"],
            vec!["node", "undrain"],
            vec!["backend", "drain", &vip, &be1, "--wait"],
        ];
        for c in &commands {
            json(c).with_context(|| format!("lbctl -o json {}", c.join(" ")))?;
        }
        let (_, _) = lbd.lbctl_diff(&["-o", "json", "diff", config])?;
        // docs/API.md's worked example, a script that drives lbd without
        // lbctl: health, then a drain it follows to the end.
        lbd.lbctl(&["backend", "undrain", &vip, &be1])?;
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/lbd_api.py");
        let socket = lbd.socket.to_str().context("socket path")?;
        let run = |args: &[&str]| -> Result<String> {
            let out = std::process::Command::new("python3")
                .args([example, "--socket", socket])
                .args(args)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            eprintln!("$ lbd_api.py {}\n{text}", args.join(" "));
            if !out.status.success() {
                bail!(
                    "lbd_api.py {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(text)
        };
        let health = run(&["health"])?;
        if !health.contains(&format!("{vip} {be1} active")) {
            bail!("the example's health does not show {be1} active");
        }
        if !run(&["drain", &vip, &be1])?.contains(&format!("{be1} drained")) {
            bail!("the example's drain did not end drained");
        }
        // A refusal (nothing to confirm) is checked against the answer
        // line's schema.
        let refusal = lbd.lbctl_refusal(&["confirm"])?;
        if refusal["code"] != "conflict" {
            bail!("confirm without a change on probation: {refusal}");
        }
        eprintln!(
            "{} lbctl -o json outputs match the schema",
            commands.len() + 2
        );
        Ok(())
    })());
}

//! Per-VIP table sizes end to end (issue 19): the real `lbd` with a VIP of
//! its own table size beside one of the global size. Connections land
//! where `lbctl simulate` says; a `kill -9` and restart adopts the table
//! regions from the pinned maps without writing a table or moving a flow;
//! a changed size is refused by a plain reload (and warned about by `lbd
//! check`), applied by `--force`, and established connections keep their
//! backend through it. Needs root.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, Rig, bin_path},
    scenario::{check, finish, predicted, run_streams, serial, setup_with},
    traffic::{tcp_request, udp_request},
};

const TCP: &str = "10.99.0.1:80/tcp";
const UDP: &str = "10.99.0.1:53/udp";

/// New TCP connections from `ports` and UDP queries from the same ports
/// reach the backends `lbctl simulate` names.
fn follow_simulate(rig: &Rig, lbd: &Lbd, ports: std::ops::Range<u16>) -> Result<()> {
    let (tcp, udp) = (rig.tcp_vip(), rig.udp_vip());
    let list: Vec<u16> = ports.collect();
    let got: Vec<(u16, Result<String>, Result<String>)> = rig.client.within(move || {
        list.iter()
            .map(|&p| (p, tcp_request(CLIENT, p, tcp), udp_request(CLIENT, p, udp)))
            .collect()
    })?;
    for (sport, t, u) in got {
        let want = predicted(lbd, rig, sport)?;
        let t = t.with_context(|| format!("TCP from {sport}"))?;
        if t != want {
            bail!("TCP from {sport} reached {t}, lbctl simulate said {want}");
        }
        let sim = lbd.lbctl_json(&[
            "simulate",
            &format!("{}/udp", rig.udp_vip()),
            &format!("{CLIENT}:{sport}"),
        ])?;
        let addr = sim["backend"].as_str().context("a backend")?;
        let want = rig
            .backends
            .iter()
            .find(|b| b.addr.to_string() == addr)
            .map(|b| b.name.clone())
            .context("a rig backend")?;
        let u = u.with_context(|| format!("UDP from {sport}"))?;
        if u != want {
            bail!("UDP from {sport} reached {u}, lbctl simulate said {want}");
        }
    }
    Ok(())
}

/// `(table_size, digest)` of a VIP's published table.
fn table(lbd: &Lbd, vip: &str) -> Result<(u64, String)> {
    let t = lbd.lbctl_json(&["table", vip])?;
    let m = t["table_size"].as_u64().context("table_size")?;
    let digest = t["digest"].as_str().context("digest")?.to_string();
    Ok((m, digest))
}

#[test]
fn a_vip_of_its_own_table_size_forwards_survives_a_restart_and_changes_only_when_forced() {
    let _serial = serial();
    check((|| {
        let weights = [Some(1), Some(1), Some(1)];
        let (rig, lbd) = setup_with(3, &weights, "    table_size: 1009\n")?;
        follow_simulate(&rig, &lbd, 21_000..21_040)?;
        let slot = lbd.simulate_syn(21_000)?["slot"].as_u64().context("slot")?;
        if slot >= 1009 {
            bail!("slot {slot} of a 1009-slot table");
        }
        let before = (table(&lbd, TCP)?, table(&lbd, UDP)?);
        if (before.0.0, before.1.0) != (1009, 65537) {
            bail!("table sizes {before:?}, want 1009 and 65537");
        }
        let status = lbd.lbctl_json(&["status"])?;
        let used = status["table_pool_used_bytes"].clone();
        // Two halves of 1 chunk and two of 65, 4 KiB each.
        if used != serde_json::json!((2 + 130) * 4096) {
            bail!("pool use {used}");
        }

        // kill -9 and a restart: regions and tables adopted as they are.
        let streams = run_streams(&rig, 46_000..46_020)?;
        std::thread::sleep(Duration::from_millis(500));
        let config = lbd.config.clone();
        lbd.kill9()?;
        let lbd = Lbd::start(&rig, &config)?;
        let status = lbd.lbctl_json(&["status"])?;
        if status["maps_adopted"] != true || status["table_pool_used_bytes"] != used {
            bail!("after the restart: {status}");
        }
        if (table(&lbd, TCP)?, table(&lbd, UDP)?) != before {
            bail!("a table changed across the restart");
        }
        let log = lbd.log_text();
        let programmed = log
            .lines()
            .rfind(|l| l.contains("dataplane programmed"))
            .unwrap_or_default();
        if !programmed.contains("tables_published: 0") || !programmed.contains("chunks_written: 0")
        {
            bail!("the restart wrote tables: {programmed}");
        }
        follow_simulate(&rig, &lbd, 21_040..21_060)?;

        // A new size: refused by lbd check (the running lbd's verdict) and
        // by a plain reload, both saying how to force it.
        let text = std::fs::read_to_string(&config)?;
        std::fs::write(
            &config,
            text.replace("table_size: 1009", "table_size: 2053"),
        )?;
        let out = std::process::Command::new(bin_path("lbd")?)
            .arg("--config")
            .arg(&config)
            .arg("check")
            .output()?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success()
            || !said.contains("table_size 1009 -> 2053 remaps every flow")
            || !said.contains("--force")
        {
            bail!("lbd check ({}) said: {said}", out.status);
        }
        let err = lbd.lbctl(&["reload"]).expect_err("refused without --force");
        if !format!("{err:#}").contains("--force") {
            bail!("the refusal does not say how: {err:#}");
        }
        if table(&lbd, TCP)?.0 != 1009 {
            bail!("a refused reload changed the table");
        }
        lbd.lbctl(&["reload", "--force"])?;
        if table(&lbd, TCP)?.0 != 2053 {
            bail!("the forced reload did not resize the table");
        }
        follow_simulate(&rig, &lbd, 21_060..21_080)?;
        std::thread::sleep(Duration::from_millis(500));
        let broken: Vec<_> = finish(streams)?
            .into_iter()
            .filter(|r| r.error.is_some())
            .collect();
        if !broken.is_empty() {
            bail!("streams broke across the restart and the resize: {broken:?}");
        }
        Ok(())
    })());
}

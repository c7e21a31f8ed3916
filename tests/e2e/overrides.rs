//! Which change wins, with the real `lbd`, `lbctl` and BIRD: runtime
//! changes (`lbctl vip add|del`, `lbctl backend weight`) hold until the
//! file changes the same object; a reload of such a file applies the
//! file's version and says which runtime change it replaced; `lbctl diff`
//! shows it beforehand, and the fields runtime changes still shadow;
//! `lbctl overrides` lists them and `lbctl overrides clear` drops them.
//!
//! What counts besides `lbctl`'s answers: what runs (`lbctl vip list`,
//! `lbctl health`) and the route BIRD installs for an API-added VIP.
//!
//! Needs root and bird2. Tests run one at a time.

use std::{net::IpAddr, time::Duration};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::EcmpRig,
    rig::Lbd,
    routers::{RouterKind, kernel_next_hops, wait_for},
    scenario::{check, serial},
};

/// A VIP on its own address, so that its route is its alone.
const API_VIP: &str = "10.99.0.7:80/tcp";
const API_ADDR: &str = "10.99.0.7";
const TCP: &str = "10.99.0.1:80/tcp";
const UDP: &str = "10.99.0.1:53/udp";

/// A VIP and its backends with their configured weights.
type VipRow = (String, Vec<(String, u64)>);
/// A runtime change: (vip, backend, field, running, revision).
type OverrideRow = (String, String, String, String, u64);

/// `lbctl vip list -o json`: each VIP's backends and configured weights.
fn vips(lbd: &Lbd) -> Result<Vec<VipRow>> {
    let list = lbd.lbctl_json(&["vip", "list"])?;
    let vips = list.as_array().context("vip list")?;
    Ok(vips
        .iter()
        .map(|v| {
            let backends = v["backends"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    (
                        b["address"].as_str().unwrap_or("").to_string(),
                        b["weight"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            (v["vip"].as_str().unwrap_or("").to_string(), backends)
        })
        .collect())
}

fn backends_of(lbd: &Lbd, vip: &str) -> Result<Option<Vec<(String, u64)>>> {
    Ok(vips(lbd)?
        .into_iter()
        .find(|(v, _)| v == vip)
        .map(|(_, b)| b))
}

fn routed(rig: &EcmpRig, addr: &str) -> Result<bool> {
    let ip: IpAddr = addr.parse()?;
    Ok(!kernel_next_hops(&rig.router, ip)?.is_empty())
}

/// `lbctl overrides -o json` as (vip, backend, field, running, revision).
fn overrides(lbd: &Lbd) -> Result<Vec<OverrideRow>> {
    let rows = lbd.lbctl_json(&["overrides", "list"])?;
    Ok(rows
        .as_array()
        .context("overrides")?
        .iter()
        .map(|r| {
            (
                r["vip"].as_str().unwrap_or("").to_string(),
                r["backend"].as_str().unwrap_or("-").to_string(),
                r["field"].as_str().unwrap_or("").to_string(),
                r["running"].as_str().unwrap_or("").to_string(),
                r["revision"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

fn running_revision(lbd: &Lbd) -> Result<u64> {
    lbd.lbctl_json(&["status"])?["revision"]
        .as_u64()
        .context("revision")
}

/// The file's VIP list with `extra` VIPs appended (YAML, two spaces in).
fn with_vips(base: &str, extra: &str) -> String {
    format!("{}{extra}", base.trim_end_matches('\n').to_string() + "\n")
}

#[test]
fn a_file_edit_wins_over_an_older_runtime_change_and_lbctl_says_so() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(1, 3, RouterKind::Bird)?;
        let (be1, be2, be3) = (
            rig.backends[0].addr.to_string(),
            rig.backends[1].addr.to_string(),
            rig.backends[2].addr.to_string(),
        );
        let base = rig.lbd_config(1, "", "");
        let lbd = rig.start_lbd(1, &base)?;
        rig.wait_hops("the VIP route", &[1], Duration::from_secs(15))?;
        let path = lbd.config.clone();

        // 1. A VIP added at runtime, unchecked: announced.
        let said = lbd.lbctl(&["vip", "add", API_VIP, "--backend", &be1])?;
        if !said.contains("no health check") {
            bail!("vip add without a health check said nothing of it:\n{said}");
        }
        let added = running_revision(&lbd)?;
        wait_for(
            "BIRD's route to the API VIP",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || routed(&rig, API_ADDR),
        )?;
        let listed = overrides(&lbd)?;
        if listed
            != [(
                API_VIP.into(),
                "-".into(),
                "vip".into(),
                "added by the API (1 backend(s))".into(),
                added,
            )]
        {
            bail!("lbctl overrides after vip add: {listed:?}");
        }
        let table = lbd.lbctl(&["overrides", "list"])?;

        // The file now defines it: other backends, a health check on a
        // port nothing listens on. diff says the file takes over.
        let file = with_vips(
            &base,
            &format!(
                "  - address: {API_ADDR}\n    port: 80\n    protocol: tcp\n    health_check:\n      port: 9\n      interval: 300ms\n      timeout: 250ms\n      rise: 1\n      fall: 2\n    backends:\n      - address: {be2}\n      - address: {be3}\n"
            ),
        );
        std::fs::write(&path, &file)?;
        let (changed, diff) = lbd.lbctl_diff(&["diff"])?;
        if !changed
            || diff.contains("no change")
            || !diff.contains(&format!("! VIP {API_VIP}: the file decides again"))
        {
            bail!("lbctl diff after the file took the API VIP:\n{diff}");
        }
        // Its backends await their first probe, and the VIP is announced:
        // the guard refuses (it would be withdrawn until they pass);
        // forced, the file takes over.
        let refusal = lbd.lbctl_refusal(&["reload"])?;
        let refused = refusal["error"].as_str().unwrap_or_default();
        if refusal["code"] != "blackhole"
            || !refused.contains(&format!(
            "VIP {API_VIP} is announced and would keep only 2 backend(s) awaiting their first probe"
        )) {
            bail!("a reload leaving only unprobed backends said:\n{refusal}");
        }
        let reloaded = lbd.lbctl(&["reload", "--force"])?;
        if !reloaded.contains(&format!("runtime change of revision {added}")) {
            bail!("the reload does not say which runtime change it replaced:\n{reloaded}");
        }
        let backends = backends_of(&lbd, API_VIP)?.context("the VIP after the reload")?;
        if backends != [(be2.clone(), 1), (be3.clone(), 1)] {
            bail!("the file's VIP does not run: {backends:?}");
        }
        // Its health check runs: nothing on port 9, so it goes.
        wait_for(
            "BIRD's route to the API VIP gone",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || Ok(!routed(&rig, API_ADDR)?),
        )
        .with_context(|| lbd.lbctl(&["health"]).unwrap_or_default())?;
        if !overrides(&lbd)?.is_empty() {
            bail!(
                "runtime changes left after the file took over: {:?}",
                overrides(&lbd)?
            );
        }

        // 2. A runtime weight shadows the file until the file changes it.
        lbd.lbctl(&["backend", "weight", TCP, &be1, "5"])?;
        let weighted = running_revision(&lbd)?;
        let (changed, diff) = lbd.lbctl_diff(&["diff"])?;
        if changed {
            bail!("lbctl diff exited 1 with the file unchanged:\n{diff}");
        }
        let shadow =
            format!("VIP {TCP} backend {be1} weight: file 1, running 5 (revision {weighted}");
        if !diff.contains("no change") || !diff.contains(&shadow) {
            bail!("lbctl diff with the file unchanged:\n{diff}");
        }
        lbd.lbctl(&["reload"])?;
        if backends_of(&lbd, TCP)?.context("TCP VIP")?[0] != (be1.clone(), 5) {
            bail!("an unchanged file undid the runtime weight");
        }
        let file = file.replacen(
            &format!("      - address: {be1}\n"),
            &format!("      - address: {be1}\n        weight: 3\n"),
            1,
        );
        std::fs::write(&path, &file)?;
        lbd.lbctl(&["reload"])?;
        let tcp = backends_of(&lbd, TCP)?.context("TCP VIP")?;
        if tcp[0] != (be1.clone(), 3) {
            bail!("the file's new weight does not run: {tcp:?}");
        }

        // 3. A deleted VIP stays deleted over a reload of the same file,
        // and comes back when the overrides are cleared.
        lbd.lbctl(&["vip", "del", UDP])?;
        lbd.lbctl(&["reload"])?;
        if backends_of(&lbd, UDP)?.is_some() {
            bail!("an unchanged file brought a deleted VIP back");
        }
        let listed = overrides(&lbd)?;
        if listed.len() != 1 || listed[0].0 != UDP || listed[0].3 != "deleted" {
            bail!("lbctl overrides after vip del: {listed:?}");
        }
        let preview = lbd.lbctl(&["overrides", "clear", UDP, "--dry-run"])?;
        if !preview.contains(&format!("+ VIP {UDP}")) {
            bail!("overrides clear --dry-run:\n{preview}");
        }
        lbd.lbctl(&["overrides", "clear", UDP])?;
        if backends_of(&lbd, UDP)?.is_none() || !overrides(&lbd)?.is_empty() {
            bail!("overrides clear did not bring the file's VIP back");
        }
        let history = lbd.lbctl(&["history", "--last", "1"])?;
        if !history.contains(&format!("overrides clear {UDP}")) {
            bail!("the clear is not a revision:\n{history}");
        }
        // 4. lbctl vip add takes the file's settings: a health check on a
        // port nothing listens on keeps the VIP from ever being announced.
        let checked = "10.99.0.8:80/tcp";
        lbd.lbctl(&[
            "vip",
            "add",
            checked,
            "--backend",
            &be1,
            "--health-check-port",
            "9",
            "--health-check-interval",
            "300ms",
            "--health-check-timeout",
            "200ms",
            "--health-check-fall",
            "2",
            "--slow-start",
            "5s",
        ])?;
        wait_for(
            "the added VIP's backend found down",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || {
                let health = lbd.lbctl_json(&["health"])?;
                Ok(health
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v["vip"] == checked && v["backends"][0]["health"] == "down"))
            },
        )?;
        if routed(&rig, "10.99.0.8")? {
            bail!("a VIP whose only backend fails its check is routed");
        }
        eprintln!("lbctl overrides after `lbctl vip add`:\n{table}");
        Ok(())
    })());
}

//! A tier of balancers that takes its VIPs from etcd: two real `lbd`s
//! behind BIRD with ECMP, each with a file that lists no VIP and
//! `source.etcd`, a real etcd (Debian's `etcd-server`) in the router's
//! namespace, and `etcdctl` as the writer of the desired state and the
//! independent reader of what each balancer publishes.
//!
//! What must hold: both balancers apply the desired state written to
//! etcd, with table digests equal to each other's; a change (a backend
//! added) reaches both and is recorded as a revision naming the etcd
//! revision, with no stream broken; a desired state that is not one
//! (not YAML, 1.1 MiB, a wrong field) is refused by both with its name,
//! and nothing changes; a balancer cut off from etcd keeps serving and
//! announcing, is flagged by the other, and catches up when the
//! partition heals; with etcd gone, both keep serving, and a balancer
//! restarted then serves what it served before. Printed: the time from
//! a write to both balancers applied.
//!
//! Needs root, bird2 and etcd. Tests run one at a time.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::{EcmpRig, balancer_addr, router_addr},
    etcd::Etcd,
    rig::Lbd,
    routers::{RouterKind, wait_for},
    scenario::{check, serial},
    traffic::Stream,
};

const PREFIX: &str = "/lb/t1";
/// Streams: a round trip every 50 ms, each may wait this long.
const EVERY: Duration = Duration::from_millis(50);
const PATIENCE: Duration = Duration::from_secs(10);

/// The file of balancer `i` (no VIPs, `source.etcd` pointing at the
/// router's address on its link), and the tier's desired state: the
/// rig's VIPs with backends `backends`.
fn split_config(rig: &EcmpRig, i: usize, backends: &[usize]) -> Result<(String, String)> {
    let weights: Vec<(usize, u32)> = backends.iter().map(|b| (*b, 1)).collect();
    split_weighted(rig, i, &weights)
}

/// As [`split_config`], with each backend's weight.
fn split_weighted(rig: &EcmpRig, i: usize, weights: &[(usize, u32)]) -> Result<(String, String)> {
    let source = format!(
        "source:\n  etcd:\n    endpoints: [http://{}:2379]\n    prefix: {PREFIX}\n    name: lb{i}\n    timeout: 2s\n    lease: 3s\nshutdown_grace: 1s\n",
        router_addr(i)
    );
    let whole = rig.lbd_config_weighted(i, weights, "", &source);
    let at = whole
        .find("vips:\n")
        .context("the rig's configuration has VIPs")?;
    Ok((whole[..at].to_string(), whole[at..].to_string()))
}

/// Starts balancer `i`'s `lbd` with its file.
fn start(rig: &EcmpRig, i: usize) -> Result<Lbd> {
    let (file, _) = split_config(rig, i, &[0])?;
    rig.start_lbd(i, &file)
}

/// `lbctl tier status -o json` of `lbd`.
fn tier_status(lbd: &Lbd) -> Result<serde_json::Value> {
    lbd.lbctl_json(&["tier", "status"])
}

/// Waits until `lbd` runs desired revision `revision`.
fn wait_applied(lbd: &Lbd, revision: i64, limit: Duration) -> Result<Duration> {
    wait_for(
        &format!("desired revision {revision} applied"),
        limit,
        Duration::from_millis(50),
        || Ok(tier_status(lbd)?["applied"] == revision),
    )
}

/// Writes `desired` and waits until both balancers run it: its etcd
/// revision, and the time from the write.
fn roll_out(etcd: &Etcd, lbd: &[Lbd; 2], desired: &str) -> Result<(i64, Duration)> {
    let written = Instant::now();
    let revision = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
    for l in lbd {
        wait_applied(l, revision, Duration::from_secs(60))?;
    }
    Ok((revision, written.elapsed()))
}

/// Balancer `name`'s report as published in etcd, read with etcdctl.
fn report(etcd: &Etcd, name: &str) -> Result<Option<serde_json::Value>> {
    etcd.get(&format!("{PREFIX}/balancers/{name}"))?
        .map(|t| serde_json::from_str(&t).context("a report is JSON"))
        .transpose()
}

/// The TCP VIP's table digest as `lbctl table` says.
fn table_digest(lbd: &Lbd) -> Result<String> {
    let t = lbd.lbctl_json(&["table", "10.99.0.1:80/tcp"])?;
    t["digest"].as_str().map(str::to_string).context("a digest")
}

fn none_broken(streams: Vec<Stream>) -> Result<usize> {
    let reports: Vec<_> = streams
        .into_iter()
        .map(Stream::finish)
        .collect::<Result<_>>()?;
    let broken: Vec<_> = reports.iter().filter(|r| r.error.is_some()).collect();
    if !broken.is_empty() {
        bail!("{} streams broke: {broken:?}", broken.len());
    }
    Ok(reports.len())
}

/// Both balancers follow the desired state, agree on it, and refuse what
/// is not one.
fn follow_change_and_refuse(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd; 2]) -> Result<()> {
    let (_, desired) = split_config(rig, 1, &[0, 1])?;
    let (r1, took) = roll_out(etcd, lbd, &desired)?;
    eprintln!("desired revision {r1}: both balancers applied it {took:?} after the write");
    rig.wait_hops(
        "one ECMP route via both balancers",
        &[1, 2],
        Duration::from_secs(30),
    )?;
    let digests = (table_digest(&lbd[0])?, table_digest(&lbd[1])?);
    if digests.0 != digests.1 {
        bail!("the balancers' tables differ: {digests:?}");
    }
    // What each publishes, read with etcdctl.
    wait_for(
        "both reports",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok((1..=2).all(|i| {
                report(etcd, &format!("lb{i}"))
                    .ok()
                    .flatten()
                    .is_some_and(|r| {
                        r["applied"] == r1 && r["tables"]["10.99.0.1:80/tcp"] == digests.0
                    })
            }))
        },
    )?;
    let streams = rig.streams(47_000..47_040, EVERY, PATIENCE)?;
    std::thread::sleep(Duration::from_secs(1));

    // A backend added: both apply it, the revision names etcd's.
    let (_, desired) = split_config(rig, 1, &[0, 1, 2])?;
    let (r2, took) = roll_out(etcd, lbd, &desired)?;
    eprintln!("desired revision {r2} (a backend added): both applied {took:?} after the write");
    let history = lbd[0].lbctl(&["history"])?;
    if !history.contains(&format!("etcd {PREFIX}/desired@{r2}")) {
        bail!("the revision does not name etcd's:\n{history}");
    }
    let digests = (table_digest(&lbd[0])?, table_digest(&lbd[1])?);
    if digests.0 != digests.1 {
        bail!("after the change the balancers' tables differ: {digests:?}");
    }
    let status = tier_status(&lbd[0])?;
    if status["flags"] != serde_json::json!([])
        || status["members"].as_array().map(Vec::len) != Some(2)
    {
        bail!("two agreeing balancers expected: {status}");
    }

    // Not desired states: each refused by both with its name.
    let bad: [(&str, Vec<u8>, &str); 3] = [
        ("not YAML", b"vips: [".to_vec(), "not a desired state"),
        (
            "1.1 MiB",
            format!("vips: []\n#{}\n", "x".repeat(1_150_000)).into_bytes(),
            "more than",
        ),
        (
            "a wrong field",
            b"vips: []\ninterfaces: [eth7]\n".to_vec(),
            "unknown field `interfaces`",
        ),
    ];
    for (what, value, says) in bad {
        let r = etcd.put(&format!("{PREFIX}/desired"), &value)?;
        for l in lbd {
            wait_for(
                &format!("{what} refused"),
                Duration::from_secs(30),
                Duration::from_millis(50),
                || {
                    let s = tier_status(l)?;
                    Ok(s["seen"] == r && s["refused"].as_str().is_some_and(|w| w.contains(says)))
                },
            )?;
            if tier_status(l)?["applied"] != r2 {
                bail!("{what}: the balancer no longer runs revision {r2}");
            }
        }
        eprintln!("{what}: refused by both, revision {r2} runs on");
    }
    let flags = tier_status(&lbd[0])?["flags"].to_string();
    if !flags.contains("lb2: refused desired revision") {
        bail!("tier status does not flag the refusal: {flags}");
    }
    // Back to a good state, then every stream must have lived through it.
    roll_out(etcd, lbd, &desired)?;
    let n = none_broken(streams)?;
    eprintln!("{n} streams unbroken through the changes and refusals");
    Ok(())
}

/// One balancer cut off from etcd keeps serving, is flagged, and catches
/// up when the partition heals.
fn partition(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd; 2]) -> Result<()> {
    let streams = rig.streams(47_100..47_140, EVERY, PATIENCE)?;
    rig.router_nft(
        "cut-lb2",
        &format!(
            "table inet lbtier {{\n  chain input {{ type filter hook input priority 0; ip saddr {} tcp dport 2379 drop; }}\n}}\n",
            balancer_addr(2)
        ),
    )?;
    wait_for(
        "lb2 cut off",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(tier_status(&lbd[1])?["connected"] == false),
    )?;
    // A weight changed (no backend leaves: every stream must live).
    let (_, desired) = split_weighted(rig, 1, &[(0, 2), (1, 1), (2, 1)])?;
    let r = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
    wait_applied(&lbd[0], r, Duration::from_secs(60))?;
    wait_for(
        "lb1 flags lb2",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let flags = tier_status(&lbd[0])?["flags"].to_string();
            Ok(flags.contains("lb2: not reporting"))
        },
    )?;
    let cut = tier_status(&lbd[1])?;
    if cut["applied"] == r {
        bail!("lb2 applied a revision it cannot have seen: {cut}");
    }
    let human = lbd[1].lbctl(&["status"])?;
    if !human.contains("NOT CONNECTED") {
        bail!("lbctl status of the cut-off balancer does not say so:\n{human}");
    }
    hops_still_both(rig)?;
    rig.router
        .run("nft", &["delete", "table", "inet", "lbtier"])?;
    let healed = Instant::now();
    wait_applied(&lbd[1], r, Duration::from_secs(60))?;
    eprintln!(
        "partition healed: lb2 caught up {:?} later",
        healed.elapsed()
    );
    wait_for(
        "the tier agrees again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(tier_status(&lbd[0])?["flags"] == serde_json::json!([])),
    )?;
    let n = none_broken(streams)?;
    eprintln!("{n} streams unbroken through the partition");
    Ok(())
}

/// Both balancers still announce the VIP (the router's ECMP route has
/// both next hops).
fn hops_still_both(rig: &EcmpRig) -> Result<()> {
    rig.wait_hops(
        "both balancers still in the route",
        &[1, 2],
        Duration::from_secs(5),
    )
    .map(|_| ())
}

/// etcd gone: both keep serving; a balancer restarted then serves what
/// it served.
fn etcd_gone(rig: &EcmpRig, etcd: &mut Etcd, lbd: [Lbd; 2]) -> Result<()> {
    let applied = tier_status(&lbd[0])?["applied"].clone();
    let streams = rig.streams(47_200..47_240, EVERY, PATIENCE)?;
    etcd.kill();
    for l in &lbd {
        wait_for(
            "etcd noticed gone",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || Ok(tier_status(l)?["connected"] == false),
        )?;
    }
    let [lbd1, lbd2] = lbd;
    let config = lbd2.config.clone();
    drop(lbd2);
    let lbd2 = Lbd::start_in(&rig.balancer(2).ns, &rig.balancer(2).dir, &config)?;
    let status = tier_status(&lbd2)?;
    if status["applied"] != applied || status["connected"] != false {
        bail!("restarted without etcd, lb2 should run revision {applied}: {status}");
    }
    let vips = lbd2.lbctl_json(&["vip", "list"])?;
    if vips.as_array().map(Vec::len) != Some(2) {
        bail!("restarted without etcd, lb2 serves no VIPs: {vips}");
    }
    rig.wait_hops(
        "both balancers announce without etcd",
        &[1, 2],
        Duration::from_secs(30),
    )?;
    let metrics_connected = lbd1.lbctl(&["status"])?;
    if !metrics_connected.contains("NOT CONNECTED") {
        bail!("lb1 does not say etcd is gone:\n{metrics_connected}");
    }
    let n = none_broken(streams)?;
    eprintln!("etcd gone: {n} streams unbroken, a restarted balancer serves revision {applied}");
    Ok(())
}

#[test]
fn a_tier_follows_etcd_refuses_bad_states_and_fails_static() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 3, RouterKind::Bird)?;
        let mut etcd = Etcd::start(&rig.router, &rig.dir)?;
        let lbd = [start(&rig, 1)?, start(&rig, 2)?];
        let result =
            follow_change_and_refuse(&rig, &etcd, &lbd).and_then(|_| partition(&rig, &etcd, &lbd));
        if let Err(e) = result {
            bail!("{e:#}\n{}\netcd:\n{}", rig.logs(), etcd.log_text());
        }
        etcd_gone(&rig, &mut etcd, lbd).map_err(|e| anyhow::anyhow!("{e:#}\n{}", rig.logs()))
    })());
}

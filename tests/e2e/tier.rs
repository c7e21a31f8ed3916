//! A tier of balancers that takes its VIPs from etcd: two real `lbd`s
//! behind BIRD with ECMP, each with a file that lists no VIP and
//! `source.etcd`, a real etcd (Debian's `etcd-server`) in the router's
//! namespace, and `etcdctl` as the writer of the desired state and the
//! independent reader of what each balancer publishes.
//!
//! What must hold: both balancers apply the desired state written to
//! etcd, with table digests equal to each other's (a report deleted by
//! hand is published again); a change (a backend
//! added) reaches both and is recorded as a revision naming the etcd
//! revision, with no stream broken; a desired state that is not one
//! (not YAML, 1.1 MiB, a wrong field) is refused by both with its name,
//! and nothing changes; one refused for what a balancer's file lacks
//! applies once the file is fixed and reloaded, one refused while a
//! change awaits confirmation once it is confirmed; a balancer cut off from etcd keeps serving and
//! announcing, is flagged by the other, and catches up when the
//! partition heals; with etcd gone, both keep serving, and a balancer
//! restarted then serves what it served before; etcd restored from an
//! earlier snapshot (its revision behind theirs) changes nothing until
//! the next write, which both apply.
//!
//! Staged rollouts (`lbctl tier rollout`), with three balancers, a
//! three-member etcd cluster and 200 streams: one whose canary cannot
//! reach the backend it adds fails there, is reverted on the canary by
//! itself and never reaches the others; the same rollout, reachable,
//! passes wave by wave through the etcd leader's death and a balancer's
//! restart and is promoted, with the same tables on all three. etcd's own
//! users: a wrong password is refused and named. No stream breaks in any
//! phase. Printed: the time from a write to the balancers applied, from
//! a rollout's write to its promotion, and to the revert of a failed one.
//!
//! Needs root, bird2 and etcd. Tests run one at a time.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::{EcmpRig, balancer_addr, router_addr},
    etcd::{AUTH_TOKEN_TTL, Certs, Etcd, client_port},
    rig::Lbd,
    routers::{RouterKind, wait_for},
    scenario::{check, serial},
    traffic::Stream,
};

const PREFIX: &str = "/lb/t1";
/// A second VIP, for a desired state with an IPv6 backend.
const VIP2: &str = "10.99.0.2";
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
    split_members(rig, i, weights, 1)
}

/// As [`split_weighted`], for an etcd cluster of `members` members.
fn split_members(
    rig: &EcmpRig,
    i: usize,
    weights: &[(usize, u32)],
    members: usize,
) -> Result<(String, String)> {
    let endpoints: Vec<String> = (0..members)
        .map(|m| format!("http://{}:{}", router_addr(i), client_port(m)))
        .collect();
    let source = format!(
        "source:\n  etcd:\n    endpoints: [{}]\n    prefix: {PREFIX}\n    name: lb{i}\n    timeout: 2s\n    lease: 3s\nshutdown_grace: 1s\n",
        endpoints.join(", ")
    );
    let whole = rig.lbd_config_weighted(i, weights, "", &source);
    let at = whole
        .find("vips:\n")
        .context("the rig's configuration has VIPs")?;
    Ok((whole[..at].to_string(), whole[at..].to_string()))
}

/// A TCP health check for the rollout's desired states: a backend the
/// canary cannot reach never comes up there; a reachable one is up
/// within a second; three missed probes of 400 ms in a row (a loaded
/// machine) before a serving one goes down.
const CHECK: &str = "    health_check:\n      port: 80\n      interval: 400ms\n      timeout: 400ms\n      rise: 2\n      fall: 3\n";

/// The tier's desired state with `weights` and the health check.
fn checked_desired(rig: &EcmpRig, weights: &[(usize, u32)]) -> Result<String> {
    let whole = rig.lbd_config_weighted(1, weights, CHECK, "");
    let at = whole.find("vips:\n").context("VIPs")?;
    Ok(whole[at..].to_string())
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

/// Waits until `lbd` saw desired revision `revision` and refused it
/// saying `says` (`what`: the wait, in words).
fn wait_refused(lbd: &Lbd, revision: i64, says: &str, what: &str) -> Result<Duration> {
    wait_for(
        what,
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let s = tier_status(lbd)?;
            Ok(s["seen"] == revision && s["refused"].as_str().is_some_and(|w| w.contains(says)))
        },
    )
}

/// Writes `desired` and waits until every balancer runs it: its etcd
/// revision, and the time from the write.
fn roll_out(etcd: &Etcd, lbd: &[Lbd], desired: &str) -> Result<(i64, Duration)> {
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
    // A report deleted by hand (a tired operator cleaning up) comes back:
    // the tier would count the balancer gone.
    etcd.ctl(&["del", &format!("{PREFIX}/balancers/lb1")])?;
    wait_for(
        "lb1's report published again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(report(etcd, "lb1")?.is_some_and(|r| r["applied"] == r1)),
    )?;
    // So does its member key: peers would ignore its reports and leave it
    // out of rollout plans.
    let member = format!("{PREFIX}/members/lb2");
    etcd.ctl(&["del", &member])?;
    wait_for(
        "lb2's member key recorded again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(etcd.get(&member)?.is_some_and(|v| v == "lb2")),
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
    // The tier's view of its members follows the reports (each
    // published after its balancer applied, the view sent at most every
    // 250 ms): agreement comes, not at once.
    let agree = |s: &serde_json::Value| {
        s["flags"] == serde_json::json!([]) && s["members"].as_array().map(Vec::len) == Some(2)
    };
    let waited = wait_for(
        "two agreeing balancers",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || Ok(agree(&tier_status(&lbd[0])?)),
    );
    if waited.is_err() {
        bail!("two agreeing balancers expected: {}", tier_status(&lbd[0])?);
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
            wait_refused(l, r, says, &format!("{what} refused"))?;
            if tier_status(l)?["applied"] != r2 {
                bail!("{what}: the balancer no longer runs revision {r2}");
            }
        }
        eprintln!("{what}: refused by both, revision {r2} runs on");
    }
    let flagged = wait_for(
        "lb1 flags lb2's refusal",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let flags = tier_status(&lbd[0])?["flags"].to_string();
            Ok(flags.contains("lb2: refused desired revision"))
        },
    );
    if flagged.is_err() {
        let flags = tier_status(&lbd[0])?["flags"].to_string();
        bail!("tier status does not flag the refusal: {flags}");
    }
    guarded_and_diffed(rig, etcd, &lbd[0], r2)?;
    // Back to a good state, then every stream must have lived through it.
    roll_out(etcd, lbd, &desired)?;
    let n = none_broken(streams)?;
    eprintln!("{n} streams unbroken through the changes and refusals");
    Ok(())
}

/// A desired state refused for something a balancer's own file lacks (a
/// VIP with an IPv6 backend, and no IPv6 tunnel source): once the
/// operator adds it and reloads, the balancer applies that desired state
/// without another write to etcd. Then the rig's desired state again.
fn fixed_locally(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd; 2]) -> Result<()> {
    let (_, base) = split_config(rig, 1, &[0, 1, 2])?;
    let with_v6 = format!(
        "{base}  - address: {VIP2}\n    port: 8080\n    protocol: tcp\n    backends:\n      - address: fd00:1::1\n"
    );
    let r = etcd.put(&format!("{PREFIX}/desired"), with_v6.as_bytes())?;
    for l in lbd {
        let what = "an IPv6 backend without an IPv6 tunnel source refused";
        wait_refused(l, r, "outer_source_v6", what)?;
        let mut file = std::fs::read_to_string(&l.config)?;
        file.push_str("outer_source_v6: fd00:98::1\n");
        std::fs::write(&l.config, file)?;
        l.lbctl(&["reload"])?;
        wait_applied(l, r, Duration::from_secs(30))
            .context("the refused desired state applied after the file was fixed")?;
    }
    let (back, _) = roll_out(etcd, lbd, &base)?;
    eprintln!(
        "desired revision {r}, refused for the file, applied once the file was fixed and reloaded; {back} back to the rig's"
    );
    Ok(())
}

/// A desired state refused by lb1 while one of its changes awaits
/// confirmation (`--confirm-within`): `lbctl confirm` applies it, without
/// another write. The change (a runtime weight) is then cleared.
fn confirmed(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd; 2]) -> Result<()> {
    let vip = format!("{}:{}/tcp", lb_tests::rig::VIP, lb_tests::rig::TCP_PORT);
    let backend = rig.backends[0].addr.to_string();
    lbd[0].lbctl(&[
        "backend",
        "weight",
        &vip,
        &backend,
        "2",
        "--confirm-within",
        "5m",
    ])?;
    let (_, desired) = split_weighted(rig, 1, &[(0, 1), (1, 1), (2, 2)])?;
    let r = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
    wait_applied(&lbd[1], r, Duration::from_secs(30))?;
    let what = "refused while a change awaits confirmation";
    wait_refused(&lbd[0], r, "confirm", what)?;
    lbd[0].lbctl(&["confirm"])?;
    wait_applied(&lbd[0], r, Duration::from_secs(30))
        .context("the refused desired state applied after `lbctl confirm`")?;
    lbd[0].lbctl(&["overrides", "clear", "--force"])?;
    eprintln!(
        "desired revision {r}, refused while a change awaited confirmation, applied once it was confirmed"
    );
    Ok(())
}

/// `lbctl revert` on lb2 runs its previous revision instead of the newest
/// desired state: lb2's status and lb1's view of the tier say so, also
/// after lb2 is killed and started again and its unchanged file is
/// reloaded, until the next desired write applies on both.
fn reverted_here(rig: &EcmpRig, etcd: &Etcd, lbd: &mut [Lbd; 2]) -> Result<()> {
    let (_, base) = split_config(rig, 1, &[0, 1, 2])?;
    let (_, weighted) = split_weighted(rig, 1, &[(0, 3), (1, 1), (2, 1)])?;
    let (r, _) = roll_out(etcd, &lbd[..], &weighted)?;
    let weighted_tables = table_digest(&lbd[1])?;
    let reverted = lbd[1].lbctl_json(&["revert"])?["revision"]
        .as_u64()
        .context("the revert's revision")?;
    let said = |lbd: &[Lbd; 2]| -> Result<()> {
        let status = tier_status(&lbd[1])?;
        if status["reverted"] != reverted || status["applied"] != r {
            bail!("lb2 runs revision {reverted} by a revert, not desired revision {r}: {status}");
        }
        let says = format!(
            "lb2: runs its revision {reverted}, from a revert there, instead of desired revision {r}"
        );
        wait_for(
            "lb1 sees lb2's revert",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || Ok(tier_status(&lbd[0])?["flags"].to_string().contains(&says)),
        )?;
        if table_digest(&lbd[1])? == weighted_tables {
            bail!("lb2 should run its revert, not desired revision {r}");
        }
        Ok(())
    };
    said(lbd)?;
    // Killed and started again, then its unchanged file reloaded: the
    // revert still runs, and is still said.
    lbd[1].signal(libc::SIGKILL)?;
    lbd[1].wait_exit(Duration::from_secs(10))?;
    let config = lbd[1].config.clone();
    lbd[1] = Lbd::start_in(&rig.balancer(2).ns, &rig.balancer(2).dir, &config)?;
    said(lbd).context("after a restart")?;
    lbd[1].lbctl(&["reload"])?;
    said(lbd).context("after a reload of the unchanged file")?;
    let (back, _) = roll_out(etcd, &lbd[..], &base)?;
    wait_for(
        "lb1 sees lb2 on the desired state again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(!tier_status(&lbd[0])?["flags"]
                .to_string()
                .contains("from a revert"))
        },
    )?;
    if !tier_status(&lbd[1])?["reverted"].is_null() {
        bail!("desired revision {back} applied on lb2, yet a revert is reported");
    }
    eprintln!(
        "lb2 reverted to its revision {reverted} under desired revision {r}: reported across a restart and a reload until {back} applied"
    );
    Ok(())
}

/// A desired state the blackhole guard refuses (every backend at weight
/// 0) is refused, and `lbctl diff` shows what following the tier would
/// change here.
fn guarded_and_diffed(rig: &EcmpRig, etcd: &Etcd, lbd: &Lbd, runs: i64) -> Result<()> {
    let (_, zero) = split_weighted(rig, 1, &[(0, 0), (1, 0), (2, 0)])?;
    let r = etcd.put(&format!("{PREFIX}/desired"), zero.as_bytes())?;
    wait_for(
        "a blackhole refused",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let s = tier_status(lbd)?;
            Ok(s["seen"] == r && s["refused"].is_string() && s["applied"] == runs)
        },
    )?;
    let out = std::process::Command::new(lb_tests::rig::bin_path("lbctl")?)
        .arg("--socket")
        .arg(&lbd.socket)
        .args(["-o", "json", "diff"])
        .output()?;
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).to_string())?;
    let changed = diff["preview"]["vips_changed"]
        .as_array()
        .map_or(0, Vec::len);
    if out.status.code() != Some(1) || changed != 2 {
        bail!("lbctl diff should show both VIPs re-weighted (exit 1): {diff}");
    }
    eprintln!(
        "a blackhole refused ({}); lbctl diff shows it: {changed} VIPs changed",
        tier_status(lbd)?["refused"]
    );
    Ok(())
}

/// The last balancer cut off from etcd (every member of `members`)
/// keeps serving, is flagged, and catches up with `desired` when the
/// partition heals.
fn partition(
    rig: &EcmpRig,
    etcd: &Etcd,
    lbd: &[Lbd],
    (members, desired): (usize, &str),
) -> Result<()> {
    let n = lbd.len();
    let (cut, name) = (&lbd[n - 1], format!("lb{n}"));
    let streams = rig.streams(47_100..47_140, EVERY, PATIENCE)?;
    let ports: Vec<String> = (0..members).map(|m| client_port(m).to_string()).collect();
    rig.router_nft(
        "cut",
        &format!(
            "table inet lbtier {{\n  chain input {{ type filter hook input priority 0; ip saddr {} tcp dport {{ {} }} drop; }}\n}}\n",
            balancer_addr(n),
            ports.join(", ")
        ),
    )?;
    wait_for(
        &format!("{name} cut off"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(tier_status(cut)?["connected"] == false),
    )?;
    let r = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
    for l in &lbd[..n - 1] {
        wait_applied(l, r, Duration::from_secs(60))?;
    }
    wait_for(
        &format!("lb1 flags {name}"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let flags = tier_status(&lbd[0])?["flags"].to_string();
            Ok(flags.contains(&format!("{name}: not reporting")))
        },
    )?;
    let status = tier_status(cut)?;
    if status["applied"] == r {
        bail!("{name} applied a revision it cannot have seen: {status}");
    }
    let human = cut.lbctl(&["status"])?;
    if !human.contains("NOT CONNECTED") {
        bail!("lbctl status of the cut-off balancer does not say so:\n{human}");
    }
    let all: Vec<usize> = (1..=n).collect();
    rig.wait_hops(
        "every balancer still in the route",
        &all,
        Duration::from_secs(5),
    )?;
    rig.router
        .run("nft", &["delete", "table", "inet", "lbtier"])?;
    let healed = Instant::now();
    wait_applied(cut, r, Duration::from_secs(60))?;
    eprintln!(
        "partition healed: {name} caught up {:?} later",
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

/// etcd gone: both keep serving; a balancer restarted then serves what
/// it served.
fn etcd_gone(rig: &EcmpRig, etcd: &mut Etcd, lbd: [Lbd; 2]) -> Result<[Lbd; 2]> {
    let applied = tier_status(&lbd[0])?["applied"].clone();
    let digest = lbd[1].lbctl_json(&["status"])?["config_digest"].clone();
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
    // It runs what it ran: the promoted desired state, whose reload
    // changed nothing, so that the newest revision is the rollout's
    // candidate (it says so until etcd answers again).
    let status = tier_status(&lbd2)?;
    let now = lbd2.lbctl_json(&["status"])?["config_digest"].clone();
    if now != digest || status["connected"] != false {
        bail!(
            "restarted without etcd, lb2 should run what it ran ({digest}, desired revision {applied}): {now} {status}"
        );
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
    Ok([lbd1, lbd2])
}

/// etcd restored from a snapshot taken earlier (`snapshot`): its
/// revision goes back below what the balancers applied. They keep what
/// they run, say so, and apply the next write of the desired state,
/// though its revision is lower than theirs.
fn restored(rig: &EcmpRig, etcd: &mut Etcd, lbd: &[Lbd; 2], snapshot: &Path) -> Result<()> {
    let before = tier_status(&lbd[0])?["applied"]
        .as_i64()
        .context("applied")?;
    etcd.restore(&rig.router, snapshot)?;
    for l in lbd {
        wait_for(
            "etcd behind what ran, said",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                let t = tier_status(l)?;
                Ok(t["connected"] == true
                    && t["note"].as_str().is_some_and(|n| n.contains("behind")))
            },
        )?;
        if tier_status(l)?["applied"] != before {
            bail!(
                "a restored etcd's older state was applied: {}",
                tier_status(l)?
            );
        }
    }
    let (_, desired) = split_config(rig, 1, &[0, 1, 2])?;
    let (revision, took) = roll_out(etcd, lbd, &desired)?;
    if revision >= before {
        bail!("the restored etcd is at revision {revision}, not behind {before}");
    }
    eprintln!(
        "etcd restored from a snapshot: desired revision {revision} (below the {before} applied before) applied by both {took:?} after the write"
    );
    Ok(())
}

/// Another installation's report appears under lb1's name (two boxes
/// configured with one name): lb1 leaves the tier, saying why, and stays
/// off while that report lives; once it is gone lb1 connects again and
/// reports as itself.
fn namesake(etcd: &Etcd, lbd: &[Lbd]) -> Result<()> {
    let key = format!("{PREFIX}/balancers/lb1");
    let theirs = serde_json::json!({
        "name": "lb1", "version": "0", "applied": null, "seen": null,
        "revision": 0, "config_digest": "", "tables": {}, "announced": {},
        "down": [], "instance": "ffffffffffffffffffffffffffffffff",
    });
    etcd.put(&key, theirs.to_string().as_bytes())?;
    wait_for(
        "lb1 names the namesake",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let s = tier_status(&lbd[0])?;
            Ok(s["connected"] == false
                && s["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("another balancer reports as lb1")))
        },
    )?;
    // Still off a while later: each new session finds the report.
    std::thread::sleep(Duration::from_secs(3));
    if tier_status(&lbd[0])?["connected"] != false {
        bail!("lb1 connected over another installation's report");
    }
    etcd.ctl(&["del", &key])?;
    wait_for(
        "lb1 back on the tier",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || Ok(tier_status(&lbd[0])?["connected"] == true),
    )?;
    wait_for(
        "lb1 reports as itself",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            Ok(report(etcd, "lb1")?.is_some_and(|r| {
                r["instance"]
                    .as_str()
                    .is_some_and(|i| !i.starts_with("ffff"))
            }))
        },
    )?;
    eprintln!("a namesake's report kept lb1 off the tier until it was gone");
    Ok(())
}

/// Writes `desired` to a file and starts a rollout of it from lb1 (the
/// canary, 3 s holds): the rollout's revision.
fn start_rollout(rig: &EcmpRig, lbd: &[Lbd], desired: &str, name: &str) -> Result<i64> {
    let path = rig.dir.join(name);
    std::fs::write(&path, desired)?;
    let path = path.to_string_lossy().to_string();
    let plan = lbd[0].lbctl_json(&["tier", "rollout", "--dry-run", &path])?;
    let names: Vec<String> = (2..=lbd.len()).map(|i| format!("lb{i}")).collect();
    if plan["waves"] != serde_json::json!([["lb1"], names]) || !plan["revision"].is_null() {
        bail!("the dry run's plan: {plan}");
    }
    if plan["preview"]["vips_changed"].as_array().map(Vec::len) != Some(2) {
        bail!("the dry run should show both VIPs changed: {plan}");
    }
    if lbd[0]
        .lbctl(&[
            "tier",
            "rollout",
            "--confirm-within",
            "1m",
            "--dry-run",
            &path,
        ])
        .is_ok()
    {
        bail!("--confirm-within was taken for a rollout, where nothing honours it");
    }
    let written = lbd[0].lbctl_json(&["tier", "rollout", "--hold", "3", &path])?;
    let id = written["revision"]
        .as_i64()
        .context("the rollout's revision")?;
    // `--abort --dry-run` says it could abort, and writes nothing.
    wait_for(
        "lb1 reads the rollout",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || Ok(tier_status(&lbd[0])?["rollout"]["revision"] == id),
    )?;
    let dry = lbd[0].lbctl_json(&["tier", "rollout", "--abort", "--dry-run"])?;
    if dry["aborted"] != true || !dry["revision"].is_null() {
        bail!("the dry run of --abort: {dry}");
    }
    let outcome = tier_status(&lbd[0])?["rollout"]["outcome"].clone();
    if !outcome.is_null() {
        bail!("a dry run of --abort ended the rollout: {outcome}");
    }
    Ok(id)
}

/// A rollout whose candidate the canary's blackhole guard refuses (every
/// backend at weight 0) fails there at once; nobody takes it.
fn rollout_refused(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd]) -> Result<()> {
    let path = rig.dir.join("refused.yaml");
    std::fs::write(&path, checked_desired(rig, &[(0, 0), (1, 0), (2, 0)])?)?;
    let path = path.to_string_lossy().to_string();
    let written = lbd[0].lbctl_json(&["tier", "rollout", "--hold", "3", &path])?;
    let id = written["revision"]
        .as_i64()
        .context("the rollout's revision")?;
    wait_for(
        "the refused rollout failed",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let why = rollout_record(etcd)?["outcome"]["failed"]["why"].to_string();
            Ok(why.contains("refused here") && why.contains("blackhole"))
        },
    )?;
    let candidate_name = format!("etcd {PREFIX}/rollout@{id}");
    for l in lbd {
        let h = l.lbctl(&["history"])?;
        if h.lines()
            .any(|line| line.contains(&candidate_name) && line.contains(" ok "))
        {
            bail!("a refused candidate ran:\n{h}");
        }
        if !tier_status(l)?["candidate"].is_null() {
            bail!("a balancer runs the refused candidate");
        }
    }
    eprintln!("rollout {id}: the canary's guard refused it; it failed there and nobody took it");
    Ok(())
}

/// The rollout record, read with etcdctl.
fn rollout_record(etcd: &Etcd) -> Result<serde_json::Value> {
    let text = etcd
        .get(&format!("{PREFIX}/rollout"))?
        .context("a rollout record")?;
    Ok(serde_json::from_str(&text)?)
}

/// A rollout that adds a backend the canary cannot reach: it fails on
/// the canary, which goes back by itself; lb2 never takes it.
fn rollout_fails(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd], base: &str) -> Result<()> {
    let streams = rig.streams(47_300..47_340, EVERY, PATIENCE)?;
    let before = tier_status(&lbd[0])?["applied"].clone();
    let hidden = rig.backends[3].addr;
    let rules = rig.dir.join("hide.nft");
    std::fs::write(
        &rules,
        format!(
            "table inet lbhide {{\n  chain output {{ type filter hook output priority 0; ip daddr {hidden} drop; }}\n}}\n"
        ),
    )?;
    rig.balancer(1)
        .ns
        .run("nft", &["-f", &rules.to_string_lossy()])?;
    let candidate = checked_desired(rig, &[(0, 2), (1, 1), (2, 1), (3, 1)])?;
    let started = Instant::now();
    let id = start_rollout(rig, lbd, &candidate, "fails.yaml")?;
    let took = wait_for(
        "the rollout failed and lb1 went back",
        Duration::from_secs(90),
        Duration::from_millis(100),
        || {
            let record = rollout_record(etcd)?;
            let s = tier_status(&lbd[0])?;
            Ok(record["outcome"]["failed"]["by"] == "lb1" && s["candidate"].is_null())
        },
    )?;
    rig.balancer(1)
        .ns
        .run("nft", &["delete", "table", "inet", "lbhide"])?;
    let record = rollout_record(etcd)?;
    eprintln!(
        "rollout {id}: failed on the canary and reverted {took:?} after the write ({:?} in all): {}",
        started.elapsed(),
        record["outcome"]["failed"]["why"]
    );
    if !record["outcome"]["failed"]["why"]
        .to_string()
        .contains(&hidden.to_string())
    {
        bail!("the failure should name the unreachable backend: {record}");
    }
    let s = tier_status(&lbd[0])?;
    if s["applied"] != before || s["rollout"]["outcome"]["failed"]["by"] != "lb1" {
        bail!("lb1 should run revision {before} again and show the failure: {s}");
    }
    let candidate_name = format!("etcd {PREFIX}/rollout@{id}");
    for (i, l) in lbd.iter().enumerate() {
        let history = l.lbctl(&["history"])?;
        if history.contains(&candidate_name) != (i == 0) {
            bail!(
                "only the canary takes the candidate; lb{}:\n{history}",
                i + 1
            );
        }
    }
    if etcd.get(&format!("{PREFIX}/desired"))?.as_deref() != Some(base) {
        bail!("a failed rollout changed the desired state");
    }
    let n = none_broken(streams)?;
    eprintln!("{n} streams unbroken through the failed rollout");
    Ok(())
}

#[test]
fn a_tier_follows_etcd_refuses_bad_states_and_fails_static() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 3, RouterKind::Bird)?;
        let mut etcd = Etcd::start(&rig.router, &rig.dir)?;
        // 5 MB under the prefix, more than one gRPC answer holds (4 MiB):
        // the balancers' first read must take it in pages to connect.
        for i in 0..5 {
            etcd.put(&format!("{PREFIX}/attic/{i}"), &[b'x'; 1_000_000])?;
        }
        let mut lbd = [start(&rig, 1)?, start(&rig, 2)?];
        // A weight changed while lb2 is cut off (no backend leaves: every
        // stream must live).
        let (_, reweighted) = split_weighted(&rig, 1, &[(0, 2), (1, 1), (2, 1)])?;
        // A backup, taken before the later writes, restored at the end;
        // 40 writes after it put the desired state written next well
        // above the revision the store goes back to.
        let snapshot = rig.dir.join("etcd.snapshot");
        let result = follow_change_and_refuse(&rig, &etcd, &lbd)
            .and_then(|_| fixed_locally(&rig, &etcd, &lbd))
            .and_then(|_| confirmed(&rig, &etcd, &lbd))
            .and_then(|_| reverted_here(&rig, &etcd, &mut lbd))
            .and_then(|_| etcd.snapshot(&snapshot))
            .and_then(|_| {
                (0..40).try_for_each(|i| etcd.put(&format!("{PREFIX}/attic/pad"), &[i]).map(drop))
            })
            .and_then(|_| partition(&rig, &etcd, &lbd, (1, &reweighted)))
            .and_then(|_| namesake(&etcd, &lbd));
        if let Err(e) = result {
            bail!("{e:#}\n{}\netcd:\n{}", rig.logs(), etcd.log_text());
        }
        let lbd = etcd_gone(&rig, &mut etcd, lbd)
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", rig.logs()))?;
        restored(&rig, &mut etcd, &lbd, &snapshot)
            .and_then(|_| forced_here(&rig, &etcd, &lbd))
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}\netcd:\n{}", rig.logs(), etcd.log_text()))
    })());
}

/// A desired state that needs `--force` (a serving VIP's table size) is
/// refused by both, saying so; `lbctl reload --force` on lb1 applies it
/// there, as the refusal says (it used to compose the file with the state
/// already running: OK, and nothing changed); lb2 still refuses it.
fn forced_here(rig: &EcmpRig, etcd: &Etcd, lbd: &[Lbd; 2]) -> Result<()> {
    let (_, desired) = split_config(rig, 1, &[0, 1, 2])?;
    let resized = desired.replacen(
        "    protocol: tcp\n",
        "    protocol: tcp\n    table_size: 1009\n",
        1,
    );
    if resized == desired {
        bail!("no TCP VIP to resize in:\n{desired}");
    }
    let r = etcd.put(&format!("{PREFIX}/desired"), resized.as_bytes())?;
    for l in lbd {
        wait_refused(l, r, "--force", "a table size change refused")?;
    }
    lbd[0].lbctl(&["reload", "--force"])?;
    wait_applied(&lbd[0], r, Duration::from_secs(30))
        .context("lbctl reload --force applied the refused desired state")?;
    let other = tier_status(&lbd[1])?;
    if other["applied"] == r || !other["refused"].is_string() {
        bail!("lb2 applied what only lb1 was forced to: {other}");
    }
    eprintln!("a table size change refused by both; `lbctl reload --force` applied it on lb1 only");
    Ok(())
}

/// Balancer `i` of a rig whose tier has an etcd cluster of `members`.
fn start_in_cluster(rig: &EcmpRig, i: usize, members: usize) -> Result<Lbd> {
    let (file, _) = split_members(rig, i, &[(0, 1)], members)?;
    rig.start_lbd(i, &file)
}

/// Waits until `lbd` runs the candidate of rollout `id`.
fn wait_candidate(lbd: &Lbd, id: i64) -> Result<Duration> {
    wait_for(
        &format!("the candidate of rollout {id}"),
        Duration::from_secs(60),
        Duration::from_millis(50),
        || Ok(tier_status(lbd)?["candidate"] == id),
    )
}

/// Three balancers, a three-member etcd cluster, 200 streams: a rollout
/// whose canary cannot reach the backend it adds is reverted there and
/// reaches neither other balancer; then the same rollout, reachable,
/// with the etcd leader killed while the canary holds and a balancer of
/// the second wave restarted (`kill -9`) while it holds, reaches all
/// three with the same tables; no stream breaks.
fn three_balancers(rig: &EcmpRig, etcd: &mut Etcd, lbd: &mut Vec<Lbd>) -> Result<()> {
    let base = checked_desired(rig, &[(0, 1), (1, 1), (2, 1)])?;
    let (r, took) = roll_out(etcd, &lbd[..], &base)?;
    eprintln!("desired revision {r}: all three balancers applied it {took:?} after the write");
    rig.wait_hops(
        "one route via all three",
        &[1, 2, 3],
        Duration::from_secs(30),
    )?;
    let streams = rig.streams(48_000..48_200, Duration::from_millis(100), PATIENCE)?;
    std::thread::sleep(Duration::from_secs(1));
    rollout_fails(rig, etcd, &lbd[..], &base)?;
    rollout_refused(rig, etcd, &lbd[..])?;
    let candidate = checked_desired(rig, &[(0, 1), (1, 1), (2, 1), (3, 1)])?;
    let started = Instant::now();
    let id = start_rollout(rig, &lbd[..], &candidate, "three.yaml")?;
    wait_candidate(&lbd[0], id)?;
    let leader = etcd.leader()?;
    etcd.kill_member(leader);
    eprintln!("rollout {id}: the canary took it; etcd member m{leader} (the leader) killed");
    wait_candidate(&lbd[1], id)?;
    let config = lbd[1].config.clone();
    // Killed (SIGKILL: its pins stay), then started again.
    drop(lbd.remove(1));
    lbd.insert(
        1,
        Lbd::start_in(&rig.balancer(2).ns, &rig.balancer(2).dir, &config)?,
    );
    eprintln!("rollout {id}: lb2 took it and was restarted while it held");
    wait_for(
        "the rollout promoted and applied by all three",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || {
            let done = rollout_record(etcd)?["outcome"] == "done";
            let all = lbd.iter().all(|l| {
                tier_status(l)
                    .is_ok_and(|s| s["candidate"].is_null() && s["applied"].as_i64() > Some(id))
            });
            Ok(done && all)
        },
    )?;
    eprintln!(
        "rollout {id}: promoted and applied on all three {:?} after the write (two holds of 3 s, a leader's death and a restart)",
        started.elapsed()
    );
    let log = lbd[1].log_text();
    for says in [
        "holding the candidate again after a restart, against the state before it",
        "every peer has its routes again after the restart; the hold starts",
    ] {
        if !log.contains(says) {
            bail!("restarted during its hold, lb2 should log {says:?}:\n{log}");
        }
    }
    let digests: Vec<String> = lbd.iter().map(table_digest).collect::<Result<_>>()?;
    if digests.iter().any(|d| *d != digests[0]) {
        bail!("after the rollout the tables differ: {digests:?}");
    }
    let reweighted = checked_desired(rig, &[(0, 2), (1, 1), (2, 1), (3, 1)])?;
    partition(rig, etcd, &lbd[..], (3, &reweighted))?;
    let n = none_broken(streams)?;
    eprintln!("{n} streams unbroken through the rollout, the leader's death and the restart");
    Ok(())
}

#[test]
fn a_rollout_reaches_three_balancers_through_a_leader_kill_and_a_restart() {
    let _serial = serial();
    check((|| {
        let mut rig = EcmpRig::new(3, 4, RouterKind::Bird)?;
        // A balancer restarted in a tier keeps its routes on the router
        // (graceful restart), or ECMP moves its flows to balancers whose
        // tables the rollout changed.
        rig.speaker_extra = "    graceful_restart: { mode: on }\n".into();
        let mut etcd = Etcd::cluster(&rig.router, &rig.dir, 3)?;
        let mut lbd = vec![
            start_in_cluster(&rig, 1, 3)?,
            start_in_cluster(&rig, 2, 3)?,
            start_in_cluster(&rig, 3, 3)?,
        ];
        three_balancers(&rig, &mut etcd, &mut lbd)
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}\netcd:\n{}", rig.logs(), etcd.log_text()))
    })());
}

/// `lbd`'s resident memory (KiB) and CPU time used so far (clock ticks:
/// utime + stime), from /proc.
fn usage(lbd: &Lbd) -> Result<(u64, u64)> {
    let pid = lbd.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis: utime is the 12th.
    let after = stat.rsplit_once(") ").context("stat")?.1;
    let f: Vec<&str> = after.split(' ').collect();
    let ticks = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    Ok((rss, ticks))
}

/// A desired state of `n` TCP VIPs (table size 6521), each with backends
/// be1 and be2 of the rig.
fn many_vips(rig: &EcmpRig, n: usize) -> String {
    let (a, b) = (rig.backends[0].addr, rig.backends[1].addr);
    let mut s = String::from("vips:\n");
    for i in 0..n {
        let _ = std::fmt::Write::write_fmt(
            &mut s,
            format_args!(
                "  - address: 10.97.{}.{}\n    port: 80\n    protocol: tcp\n    table_size: 6521\n    backends:\n      - address: {a}\n      - address: {b}\n",
                i / 250,
                i % 250 + 1
            ),
        );
    }
    s
}

#[test]
#[ignore = "a measurement, about a minute: cargo test -p lb-tests --test tier -- --ignored --nocapture"]
fn a_thousand_vips_in_etcd() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(1, 2, RouterKind::Bird)?;
        let etcd = Etcd::start(&rig.router, &rig.dir)?;
        let (file, _) = split_config(&rig, 1, &[0])?;
        let lbd = rig.start_lbd(1, &format!("max_vips: 1024\n{file}"))?;
        wait_for(
            "connected",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || Ok(tier_status(&lbd)?["connected"] == true),
        )?;
        let (rss0, cpu0) = usage(&lbd)?;
        let desired = many_vips(&rig, 1000);
        let (r, took) = roll_out(&etcd, std::slice::from_ref(&lbd), &desired)?;
        let (rss1, cpu1) = usage(&lbd)?;
        let vips = lbd.lbctl_json(&["vip", "list"])?;
        if vips.as_array().map(Vec::len) != Some(1000) {
            bail!(
                "1,000 VIPs expected, lbd runs {}",
                vips.as_array().map_or(0, Vec::len)
            );
        }
        std::thread::sleep(Duration::from_secs(30));
        let (rss2, cpu2) = usage(&lbd)?;
        let report = report(&etcd, "lb1")?.context("a report")?;
        eprintln!(
            "1,000 VIPs in etcd: the desired state is {} bytes ({:.0} a VIP); revision {r} applied {took:?} after the write",
            desired.len(),
            desired.len() as f64 / 1000.0
        );
        eprintln!(
            "lbd: RSS {} MiB before, {} MiB after, {} MiB 30 s later; CPU {:.2} s to apply, {:.1} % idle over 30 s; its report {} bytes",
            rss0 / 1024,
            rss1 / 1024,
            rss2 / 1024,
            (cpu1 - cpu0) as f64 / 100.0,
            (cpu2 - cpu1) as f64 / 30.0,
            report.to_string().len()
        );
        Ok(())
    })());
}

/// etcd's own users: a balancer with its user and password follows the
/// tier; one with a wrong password is refused by etcd, says so, and
/// serves on without VIPs (nothing to serve yet).
#[test]
fn etcd_users_are_checked_and_a_wrong_password_is_named() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 1, RouterKind::Bird)?;
        let mut etcd = Etcd::start(&rig.router, &rig.dir)?;
        etcd.enable_auth(PREFIX, "lb1", "right-password")?;
        let auth = |i: usize, password: &str| -> Result<String> {
            let file = rig.dir.join(format!("password{i}"));
            std::fs::write(&file, format!("{password}\n"))?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
            let (text, _) = split_config(&rig, i, &[0])?;
            Ok(text.replace(
                "    timeout: 2s\n",
                &format!(
                    "    auth: {{ user: lb1, password_file: {} }}\n    timeout: 2s\n",
                    file.display()
                ),
            ))
        };
        let good = rig.start_lbd(1, &auth(1, "right-password")?)?;
        let bad = rig.start_lbd(2, &auth(2, "wrong-password")?)?;
        let (_, desired) = split_config(&rig, 1, &[0])?;
        let r = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
        wait_applied(&good, r, Duration::from_secs(30))?;
        // A quiet tier: its token expires. The next desired state is
        // applied and reported over the same session (the token renewed,
        // not the session ended by "invalid auth token").
        let since = tier_status(&good)?["since"].clone();
        std::thread::sleep(AUTH_TOKEN_TTL * 2);
        let (_, desired) = split_weighted(&rig, 1, &[(0, 2)])?;
        let r2 = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
        wait_applied(&good, r2, Duration::from_secs(30))?;
        wait_for(
            "lb1's report of the new revision in etcd",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || Ok(report(&etcd, "lb1")?.is_some_and(|v| v["applied"].as_i64() == Some(r2))),
        )?;
        let status = tier_status(&good)?;
        if status["since"] != since || status["connected"] != true {
            bail!("the session with etcd ended after the token expired: {status}");
        }
        // A role that may not write the rollout record: `lbctl tier
        // rollout` is refused, and the session goes on.
        etcd.restrict_role("tier", PREFIX, &["balancers/", "members/", "progress/"])?;
        let path = rig.dir.join("denied.yaml");
        std::fs::write(&path, &desired)?;
        let denied = good.lbctl(&["tier", "rollout", "--hold", "3", &path.to_string_lossy()]);
        match denied {
            Err(e) if e.to_string().contains("permission denied") => {}
            other => bail!("a rollout record the role may not write: {other:?}"),
        }
        std::thread::sleep(Duration::from_secs(1));
        let status = tier_status(&good)?;
        if status["since"] != since || status["connected"] != true {
            bail!("a write the role may not make ended the session: {status}");
        }
        let refused = wait_for(
            "the wrong password named",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let s = tier_status(&bad)?;
                Ok(s["connected"] == false
                    && s["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("authentication failed")))
            },
        );
        if let Err(e) = refused {
            bail!("{e}: {}", tier_status(&bad)?);
        }
        if !tier_status(&bad)?["applied"].is_null() {
            bail!("a balancer refused by etcd applied a desired state");
        }
        eprintln!(
            "etcd users: lb1 with its password follows revision {r}; a wrong password is refused and named"
        );
        Ok(())
    })());
}

/// etcd over TLS with client certificates: a balancer with the cluster's
/// CA and its certificate follows the tier; one without a certificate is
/// refused by etcd and says so.
#[test]
fn etcd_over_tls_wants_a_client_certificate() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 1, RouterKind::Bird)?;
        let certs = Certs::make(&rig.dir, &[router_addr(1), router_addr(2)])?;
        let etcd = Etcd::start_tls(&rig.router, &rig.dir, certs.clone())?;
        let file = |i: usize, tls: &str| -> Result<String> {
            let (text, _) = split_config(&rig, i, &[0])?;
            Ok(text.replace("http://", "https://").replace(
                "    timeout: 2s\n",
                &format!("    tls: {tls}\n    timeout: 2s\n"),
            ))
        };
        let with_cert = format!(
            "{{ ca: {}, cert: {}, key: {} }}",
            certs.ca.display(),
            certs.client_cert.display(),
            certs.client_key.display()
        );
        let good = rig.start_lbd(1, &file(1, &with_cert)?)?;
        let without = format!("{{ ca: {} }}", certs.ca.display());
        let bad = rig.start_lbd(2, &file(2, &without)?)?;
        let (_, desired) = split_config(&rig, 1, &[0])?;
        let r = etcd.put(&format!("{PREFIX}/desired"), desired.as_bytes())?;
        wait_applied(&good, r, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(3));
        let s = tier_status(&bad)?;
        if s["connected"] != false || !s["applied"].is_null() || s["error"].is_null() {
            bail!("a balancer without a client certificate should be refused: {s}");
        }
        eprintln!(
            "etcd over TLS: lb1 with its certificate follows revision {r}; lb2 without one: {}",
            s["error"]
        );
        Ok(())
    })());
}

//! `lbd` and `lbctl` under operator mistakes and faults, in the namespace
//! rig with the real binaries: a second `lbd` on a running instance,
//! concurrent decap changes, the gateway lookup, reloads that would
//! blackhole a VIP, oversized and unbounded API requests.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{Lbd, bin_path},
    scenario::{check, serial, setup},
};

/// Runs `cmd` to completion within `limit`; a process still running then
/// is killed and reported (a second lbd that did not refuse would run
/// forever).
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<std::process::Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning")?;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!(
                "still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

#[test]
fn a_second_lbd_on_a_running_instance_is_refused() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        // A runtime change, then an edit of the file on the same backend:
        // a start would settle the two and save the state file. The
        // refused second lbd must not have.
        let be = rig.backends[0].addr.to_string();
        lbd.lbctl(&["backend", "weight", "10.99.0.1:80/tcp", &be, "2"])?;
        let text = std::fs::read_to_string(&lbd.config)?;
        std::fs::write(&lbd.config, text.replacen("weight: 1", "weight: 3", 1))?;
        let state = rig.dir.join("state.json");
        let saved = std::fs::read(&state)?;
        let out = run_bounded(
            rig.lb
                .command(bin_path("lbd")?)
                .arg("--config")
                .arg(&lbd.config)
                .env("RUST_LOG", "info"),
            Duration::from_secs(60),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            bail!("the second lbd exited successfully:\n{err}");
        }
        let want = format!("already in use by process {}", lbd.pid());
        if !err.contains(&want) {
            bail!("the second lbd's error does not name the first ({want}):\n{err}");
        }
        if std::fs::read(&state)? != saved {
            bail!("the refused second lbd rewrote the running one's state file:\n{err}");
        }
        // The first one still owns its socket and its program.
        lbd.lbctl(&["status"])
            .context("the first lbd after the second was refused")?;

        // Tearing the instance down under a running lbd is refused too.
        let out = run_bounded(
            rig.lb
                .command(bin_path("lbd")?)
                .arg("--config")
                .arg(&lbd.config)
                .arg("teardown"),
            Duration::from_secs(60),
        )?;
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains(&want) {
            bail!(
                "teardown under a running lbd: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if !rig.pin_dir().join("LB_FLOWS").exists() {
            bail!("the refused teardown removed pins");
        }
        lbd.lbctl(&["status"])?;

        // A stopped lbd releases the lock; the next one starts.
        let config = lbd.config.clone();
        lbd.signal(libc::SIGTERM)?;
        let mut lbd = lbd;
        if lbd.wait_exit(Duration::from_secs(60))?.is_none() {
            bail!("lbd did not stop on SIGTERM");
        }
        // README's form of teardown (the option after the subcommand) on
        // the stopped instance removes its pins.
        let out = run_bounded(
            rig.lb
                .command(bin_path("lbd")?)
                .arg("teardown")
                .arg("--config")
                .arg(&config),
            Duration::from_secs(60),
        )?;
        if !out.status.success() || rig.pin_dir().exists() {
            bail!(
                "lbd teardown --config FILE: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let next = Lbd::start(&rig, &config).context("an lbd after the first stopped")?;
        next.lbctl(&["status"])?;
        Ok(())
    })());
}

/// Map pins under `dir` (the instance's pin directory), by name.
fn pinned_maps(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("LB_"))
                .collect()
        })
        .unwrap_or_default()
}

/// A first start that fails after its maps were created (an interface
/// that does not exist, found at the gateway lookup) removes every pin
/// it made, so the next start does not adopt half a state; a start that
/// adopted pins and then fails leaves them, and the program forwarding.
#[test]
fn a_failed_first_start_removes_its_pins_and_a_failed_restart_keeps_them() {
    let _serial = serial();
    check((|| {
        let rig = lb_tests::rig::Rig::new(1)?;
        let good = rig.dir.join("lbd.yaml");
        std::fs::write(&good, rig.config(&[Some(1)]))?;
        let bad = rig.dir.join("bad.yaml");
        std::fs::write(
            &bad,
            rig.config(&[Some(1)])
                .replace("interfaces: [eth0]", "interfaces: [eth9]"),
        )?;
        let start_bad = || {
            run_bounded(
                rig.lb
                    .command(bin_path("lbd")?)
                    .arg("--config")
                    .arg(&bad)
                    .env("RUST_LOG", "info"),
                Duration::from_secs(120),
            )
        };
        let out = start_bad()?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains("eth9") {
            bail!(
                "a start on a missing interface: {}
{err}",
                out.status
            );
        }
        let left = pinned_maps(&rig.pin_dir());
        if !left.is_empty() {
            bail!(
                "the failed first start left {} pins: {left:?}
{err}",
                left.len()
            );
        }

        let lbd = Lbd::start(&rig, &good)?;
        let vip = rig.tcp_vip();
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 45_000, vip))?
            .context("a connection through the first lbd")?;
        lbd.kill9()?;
        let before = pinned_maps(&rig.pin_dir());
        let out = start_bad()?;
        if out.status.success() {
            bail!("the start on a missing interface succeeded");
        }
        let after = pinned_maps(&rig.pin_dir());
        if after != before || after.is_empty() {
            bail!("a failed start that adopted pins changed them: {before:?} -> {after:?}");
        }
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 45_001, vip))?
            .context("a connection after the failed restart: the program must go on")?;
        Ok(())
    })());
}

#[test]
fn concurrent_decap_changes_on_one_interface_are_refused() {
    let _serial = serial();
    check((|| {
        let (rig, _lbd) = setup(1, &[Some(1)])?;
        let be = rig.backend("be1");
        // Hold the interface's decap lock as a concurrent `lbctl decap
        // attach` would, from this process.
        let dir = be.decap_pin_dir();
        let held = lb::DirLock::acquire(dir, "test", "interface")?;
        for args in [
            &["decap", "attach", "eth0", "--from-any"][..],
            &["decap", "detach", "eth0"],
        ] {
            let out = run_bounded(
                be.ns.command(bin_path("lbctl")?).args(args),
                Duration::from_secs(60),
            )?;
            let err = String::from_utf8_lossy(&out.stderr);
            let want = format!("in use by process {}", std::process::id());
            if out.status.success() || !err.contains(&want) {
                bail!("lbctl {args:?} while locked: {}\n{err}", out.status);
            }
        }
        drop(held);
        // The program is still attached and serving.
        let out = be
            .ns
            .command(bin_path("lbctl")?)
            .args(["decap", "stats", "eth0"])
            .output()?;
        if !out.status.success() {
            bail!(
                "decap stats after the refused changes: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Attached again with another --from: the prefix left out is said,
        // and stats list what it takes now.
        let lbctl = |args: &[&str]| -> Result<(String, String)> {
            let out = be.ns.command(bin_path("lbctl")?).args(args).output()?;
            let (o, e) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            if !out.status.success() {
                bail!("lbctl {args:?}: {e}");
            }
            Ok((o, e))
        };
        let both = [
            "decap",
            "attach",
            "eth0",
            "--from",
            "10.98.0.0/16",
            "--from",
            "192.0.2.0/24",
        ];
        lbctl(&both)?;
        let (_, said) = lbctl(&["decap", "attach", "eth0", "--from", "10.98.0.0/16"])?;
        if !said.contains("eth0 no longer takes tunnels from 192.0.2.0/24") {
            bail!("re-attaching without a prefix said: {said}");
        }
        let (stats, _) = lbctl(&["decap", "stats", "eth0"])?;
        if !stats.starts_with("tunnels from: 10.98.0.0/16\n") {
            bail!("decap stats: {stats}");
        }
        let (_, said) = lbctl(&["decap", "attach", "eth0", "--from-any"])?;
        let (stats, _) = lbctl(&["decap", "stats", "eth0"])?;
        if said.contains("no longer") || !stats.starts_with("tunnels from: any source\n") {
            bail!("--from-any after --from said: {said}; stats: {stats}");
        }
        Ok(())
    })());
}

/// How many lines of `log` contain `needle`.
fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn gateway_lookups_are_quiet_and_never_stall_the_daemon() {
    let _serial = serial();
    check((|| {
        let rig = lb_tests::rig::Rig::new(1)?;
        let config = rig.dir.join("lbd.yaml");
        std::fs::write(
            &config,
            format!("gateway_refresh: 1s\n{}", rig.config(&[Some(1)])),
        )?;
        let lbd = Lbd::start(&rig, &config)?;
        // Several refreshes of a gateway that does not change.
        std::thread::sleep(Duration::from_millis(4500));
        let log = lbd.log_text();
        let noise = count(&log, "failed to forward response");
        let resolved = count(&log, "gateway resolved") + count(&log, "gateway changed");
        if noise != 0 || resolved != 1 {
            bail!(
                "after 4 refreshes: {noise} netlink warnings, the gateway logged {resolved} times (want 0 and 1):\n{log}"
            );
        }

        // The gateway stops answering: its route points at an address
        // nobody has, so each lookup polls the neighbour table for
        // seconds. The daemon must answer while a lookup is under way.
        rig.lb
            .ip(&["route", "replace", "default", "via", "10.10.2.99"])?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen_lookup = false;
        while Instant::now() < deadline && !seen_lookup {
            let status = lbd.lbctl_json(&["status"])?;
            seen_lookup = status["gateway"]["looking_up"] == true;
            std::thread::sleep(Duration::from_millis(50));
        }
        if !seen_lookup {
            bail!("lbctl status never answered while a gateway lookup was under way");
        }
        // Two failed lookups at least, one warning.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let status = lbd.lbctl_json(&["status"])?;
            let log = lbd.log_text();
            let failed = count(&log, "gateway lookup failed");
            if status["gateway"]["error"].is_string() && failed == 1 {
                // Let another lookup fail; still one line.
                std::thread::sleep(Duration::from_secs(5));
                let again = count(&lbd.log_text(), "gateway lookup failed");
                if again != 1 {
                    bail!("a failing gateway was logged {again} times in 5 s");
                }
                break;
            }
            if Instant::now() > deadline {
                bail!("no failed lookup reported in 20 s ({failed} log lines): {status}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    })());
}

/// Slots per backend address in `lbctl table` of the TCP VIP.
fn slots(lbd: &Lbd) -> Result<Vec<(String, u64)>> {
    let t = lbd.lbctl_json(&["table", "10.99.0.1:80/tcp"])?;
    Ok(t["backends"]
        .as_array()
        .context("backends")?
        .iter()
        .map(|b| {
            (
                b["address"].as_str().unwrap_or("").to_string(),
                b["slots"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

#[test]
fn changes_that_would_blackhole_a_serving_vip_are_refused_unless_forced() {
    let _serial = serial();
    check((|| {
        let (rig, mut lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let before = slots(&lbd)?;
        let good = std::fs::read_to_string(&lbd.config)?;
        let zero = rig.config(&[Some(0), Some(0), Some(0)]);

        // `lbd check` says it loudly.
        let bad_file = rig.dir.join("zero.yaml");
        std::fs::write(&bad_file, &zero)?;
        // As README writes it: the file after `check`.
        let out = Command::new(bin_path("lbd")?)
            .arg("check")
            .arg(&bad_file)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !text.contains("no backend with a weight above 0: it will drop every packet") {
            bail!("lbd check of an all-zero VIP:\n{text}");
        }
        // A hash key file lbd would not start with (readable by others):
        // `lbd check` says so, as the start would (it said ok).
        let key = rig.dir.join("loose.key");
        std::fs::write(&key, "00112233445566778899aabbccddeeff\n")?;
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        let keyed = rig.dir.join("keyed.yaml");
        std::fs::write(
            &keyed,
            format!("{good}\nhash_key_file: {}\n", key.display()),
        )?;
        let out = Command::new(bin_path("lbd")?)
            .args(["check", "--offline"])
            .arg(&keyed)
            .output()?;
        let said = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !said.contains("hash_key_file") {
            bail!(
                "lbd check of a key file others may read: {}\n{said}",
                out.status
            );
        }
        // A key that lives on the box the file is for: offline, named and
        // passed; on this box, a fault (a start would stop on it).
        std::fs::remove_file(&key)?;
        let out = Command::new(bin_path("lbd")?)
            .args(["check", "--offline"])
            .arg(&keyed)
            .output()?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success()
            || !said.contains("offline: not on this box, so not checked: hash_key_file")
        {
            bail!(
                "lbd check --offline of a key kept elsewhere: {}\n{said}",
                out.status
            );
        }

        // SIGHUP never forces: refused, the table stays, connections work.
        std::fs::write(&lbd.config, &zero)?;
        lbd.signal(libc::SIGHUP)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let reload = loop {
            let s = lbd.lbctl_json(&["status"])?;
            if let Some(r) = s["last_reload"].as_str() {
                break r.to_string();
            }
            if Instant::now() > deadline {
                bail!("no reload result after SIGHUP");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !reload.starts_with("failed") || !reload.contains("would have no usable backend") {
            bail!("SIGHUP with every weight 0: {reload}");
        }
        if slots(&lbd)? != before {
            bail!("the refused reload changed the table");
        }
        let vip = rig.tcp_vip();
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 42_000, vip))?
            .context("a connection after the refused reload")?;
        // lbctl reload: refused with the reason; --force applies it.
        match lbd.lbctl(&["reload"]) {
            Ok(out) => bail!("lbctl reload of an all-zero VIP succeeded: {out}"),
            Err(e) if e.to_string().contains("--force") => {}
            Err(e) => bail!("lbctl reload refused without naming --force: {e:#}"),
        }
        // The same refusal for a script: its stable code, on stdout.
        let refusal = lbd.lbctl_refusal(&["reload"])?;
        if refusal["ok"] != false || refusal["code"] != "blackhole" {
            bail!("lbctl -o json reload printed {refusal}");
        }
        // A crash and a start with the refused file on disk: the start
        // applies no more than the reload did, says so, and keeps serving.
        let ran = lbd.lbctl_json(&["status"])?["revision"].clone();
        let config = lbd.config.clone();
        lbd.kill9()?;
        lbd = Lbd::start(&rig, &config)?;
        if slots(&lbd)? != before || lbd.lbctl_json(&["status"])?["revision"] != ran {
            bail!("a start applied the refused file");
        }
        if !lbd.log_text().contains("was refused at revision") {
            bail!(
                "the start did not say it kept what ran:\n{}",
                lbd.log_text()
            );
        }
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 42_001, vip))?
            .context("a connection after the start")?;
        let note = lbd.lbctl(&["reload"])?;
        if !note.contains("keeps running") || slots(&lbd)? != before {
            bail!("a reload of the same refused file after the start: {note}");
        }
        lbd.lbctl(&["reload", "--force"])?;
        if slots(&lbd)?.iter().any(|(_, n)| *n > 0) {
            bail!("the forced reload left slots in the table");
        }
        std::fs::write(&lbd.config, &good)?;
        lbd.lbctl(&["reload"])?;
        if slots(&lbd)? != before {
            bail!("the table did not come back with the good file");
        }

        // The API: the last usable backend cannot be weighted 0, removed
        // or drained without --force.
        let id = "10.99.0.1:80/tcp";
        let (a, b, c) = (
            rig.backend("be1").addr.to_string(),
            rig.backend("be2").addr.to_string(),
            rig.backend("be3").addr.to_string(),
        );
        lbd.lbctl(&["backend", "weight", id, &a, "0"])?;
        lbd.lbctl(&["backend", "drain", id, &b])?;
        for args in [
            vec!["backend", "weight", id, &c, "0"],
            vec!["backend", "del", id, &c],
            vec!["backend", "drain", id, &c],
        ] {
            match lbd.lbctl(&args) {
                Ok(_) => bail!("lbctl {args:?} emptied a serving VIP"),
                Err(e) if e.to_string().contains("would have no usable backend") => {}
                Err(e) => bail!("lbctl {args:?}: {e:#}"),
            }
        }
        let mut forced = vec!["backend", "weight", id, &c, "0", "--force"];
        lbd.lbctl(&forced)?;
        forced.truncate(4);
        forced.push("1");
        lbd.lbctl(&forced)?;
        Ok(())
    })());
}

/// Waits for `last_reload` to change from `before`; returns it.
fn next_reload(lbd: &Lbd, before: &serde_json::Value) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = lbd.lbctl_json(&["status"])?;
        if s["last_reload"] != *before
            && let Some(r) = s["last_reload"].as_str()
        {
            return Ok(r.to_string());
        }
        if Instant::now() > deadline {
            bail!("no new reload result within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn hostile_files_are_refused_on_reload_with_every_problem_named() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let good = std::fs::read_to_string(&lbd.config)?;
        // Nested 40,000 deep: refused by the bounds, not parsed.
        let mut before = lbd.lbctl_json(&["status"])?["last_reload"].clone();
        std::fs::write(
            &lbd.config,
            format!("instance: {}{}\n", "[".repeat(40_000), "]".repeat(40_000)),
        )?;
        lbd.signal(libc::SIGHUP)?;
        let r = next_reload(&lbd, &before)?;
        if !r.contains("nested 40000 deep") {
            bail!("deeply nested file: {r}");
        }
        // Three mistakes in one file: all three in one answer, the 10 MB
        // value cut.
        before = lbd.lbctl_json(&["status"])?["last_reload"].clone();
        let three = good
            .replacen(
                "instance: ",
                &format!(
                    "shutdown_grace: forever\ninstance: {}",
                    "z".repeat(10 << 20)
                ),
                1,
            )
            .replacen("        weight: 1", "        wieght: 1", 1);
        std::fs::write(&lbd.config, three)?;
        lbd.signal(libc::SIGHUP)?;
        let r = next_reload(&lbd, &before)?;
        for want in [
            "shutdown_grace: `forever` is not a duration",
            "unknown field `wieght`",
            "instance:",
            "…` (10485",
        ] {
            if !r.contains(want) {
                bail!(
                    "the reload's answer lacks {want:?}: {}",
                    &r[..r.len().min(2000)]
                );
            }
        }
        if r.len() > 4000 {
            bail!("the reload's answer echoes {} bytes", r.len());
        }
        // The running configuration is untouched and the good file loads.
        std::fs::write(&lbd.config, &good)?;
        lbd.lbctl(&["reload"])?;
        let vip = rig.tcp_vip();
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 42_100, vip))?
            .context("a connection after the refused reloads")?;
        Ok(())
    })());
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// Reads one answer line from a raw API connection.
fn answer(stream: &mut std::os::unix::net::UnixStream) -> Result<serde_json::Value> {
    use std::io::BufRead as _;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    serde_json::from_str(&line).with_context(|| format!("answer {line:?}"))
}

#[test]
fn the_api_bounds_requests_and_connections_and_lbctl_behaves_as_a_unix_tool() {
    use std::io::Write as _;
    use std::os::unix::net::UnixStream;
    let _serial = serial();
    check((|| {
        let (_rig, lbd) = setup(1, &[Some(1)])?;
        let base = rss_kib(lbd.pid())?;
        // Every slot held by a connection that sent half a megabyte and
        // no newline.
        let mut held = Vec::new();
        for _ in 0..lb::api::MAX_CONNECTIONS {
            let mut s = UnixStream::connect(&lbd.socket)?;
            s.write_all(&vec![b'x'; 512 << 10])?;
            held.push(s);
        }
        std::thread::sleep(Duration::from_millis(300));
        let peak = rss_kib(lbd.pid())?;
        // Idle clients on every slot do not lock an operator out: the
        // oldest one still sending its request makes room.
        lbd.lbctl(&["status"])
            .context("lbctl status with every slot held by an idle client")?;
        eprintln!(
            "lbd RSS {base} KiB, {peak} KiB with {} connections holding 512 KiB each",
            held.len()
        );
        // Bounded by the slots and the request limit, not by the peer.
        let bound = base + (lb::api::MAX_CONNECTIONS * lb::api::MAX_REQUEST) as u64 / 1024 * 2;
        if peak > bound {
            bail!("lbd grew from {base} to {peak} KiB (bound {bound})");
        }
        drop(held);
        std::thread::sleep(Duration::from_millis(300));
        // A request past the limit is refused with a reason.
        let mut big = UnixStream::connect(&lbd.socket)?;
        big.write_all(&vec![b'x'; lb::api::MAX_REQUEST + 10])?;
        let a = answer(&mut big)?;
        if !a["error"]
            .as_str()
            .unwrap_or("")
            .contains("request longer than 1024 KiB")
        {
            bail!("an oversized request: {a}");
        }
        lbd.lbctl(&["status"])?;

        // `lbctl stats | head -1`: the pipe closes early; lbctl ends
        // quietly.
        let mut child = Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&lbd.socket)
            .arg("stats")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        drop(child.stdout.take());
        let out = child.wait_with_output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("panicked") || err.contains("Broken pipe") {
            bail!("lbctl into a closed pipe: {err}");
        }
        // A user who is not root: one clear reason, once.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&lbd.socket)
            .arg("status")
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        if out.status.success() || err.matches("permission denied").count() != 1 {
            bail!("lbctl as nobody: {err}");
        }

        // The state file is root's alone; a GUE VIP can be made with lbctl.
        lbd.lbctl(&["backend", "weight", "10.99.0.1:80/tcp", "10.10.31.2", "2"])?;
        lbd.lbctl(&[
            "vip",
            "add",
            "10.99.0.9:80/tcp",
            "--backend",
            "10.10.31.2",
            "--encap",
            "gue",
        ])?;
        let vips = lbd.lbctl_json(&["vip", "list"])?;
        let gue = vips
            .as_array()
            .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.9:80/tcp"))
            .with_context(|| format!("the new VIP in {vips}"))?;
        if gue["encap"] != "gue" {
            bail!("lbctl vip add --encap gue made {gue}");
        }
        let state = lbd.config.with_file_name("state.json");
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&state)?.permissions());
        if mode & 0o777 != 0o600 {
            bail!("{} has mode {:o}", state.display(), mode & 0o777);
        }
        Ok(())
    })());
}

/// A tmpfs of `kib` KiB mounted at `dir`, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, kib: u32) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        lb_tests::netns::sh(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={kib}k,mode=0700"),
                    "tmpfs",
                ])
                .arg(dir),
        )?;
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Fills it up to the last byte.
    fn fill(&self) -> Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.0.join("ballast"))?;
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// With the state file and the revisions on a full file system, changes
/// that cannot be recorded are refused before they touch the maps: the
/// refusal names the disk, the configuration is unchanged, and not one
/// connection on the backend the change would have removed is reset.
#[test]
fn a_change_refused_for_a_full_disk_resets_no_connection() {
    let _serial = serial();
    check((|| {
        let rig = lb_tests::rig::Rig::new(3)?;
        let disk = Tmpfs::mount(&rig.dir.join("disk"), 256)?;
        let config = rig.dir.join("lbd.yaml");
        let text = rig.config(&[Some(1), Some(1), Some(1)]).replace(
            &format!("state_file: {}/state.json", rig.dir.display()),
            &format!("state_file: {}/state.json", disk.0.display()),
        );
        std::fs::write(&config, &text)?;
        let lbd = Lbd::start(&rig, &config)?;
        let streams = lb_tests::scenario::run_streams(&rig, 46_000..46_060)?;
        std::thread::sleep(Duration::from_secs(1));
        let victim = rig.backend("be2").addr.to_string();
        let on_victim = streams.iter().filter(|s| s.backend == "be2").count();
        let before = lbd.lbctl_json(&["vip", "list"])?;
        disk.fill()?;

        let refused = |what: &str, r: Result<String>| -> Result<()> {
            match r {
                Ok(out) => bail!("{what} was applied on a full disk: {out}"),
                Err(e) if e.to_string().contains("No space left on device") => Ok(()),
                Err(e) => bail!("{what} refused without naming the disk: {e:#}"),
            }
        };
        refused(
            "backend del",
            lbd.lbctl(&["backend", "del", "10.99.0.1:80/tcp", &victim]),
        )?;
        refused(
            "backend weight",
            lbd.lbctl(&["backend", "weight", "10.99.0.1:80/tcp", &victim, "5"]),
        )?;
        // A reload that drops the backend.
        std::fs::write(
            &config,
            text.replacen(
                &format!("      - address: {victim}\n        weight: 1\n"),
                "",
                1,
            ),
        )?;
        refused("a reload dropping be2", lbd.lbctl(&["reload"]))?;
        if lbd.lbctl_json(&["vip", "list"])? != before {
            bail!("a refused change changed the configuration");
        }
        std::thread::sleep(Duration::from_secs(1));
        let reports = lb_tests::scenario::finish(streams)?;
        let reset: Vec<_> = reports.iter().filter(|r| r.error.is_some()).collect();
        eprintln!(
            "full disk: 3 changes refused; {} of 60 streams ({on_victim} on be2) reset",
            reset.len()
        );
        if !reset.is_empty() {
            bail!(
                "{} streams were reset by refused changes: {reset:?}",
                reset.len()
            );
        }
        Ok(())
    })());
}

/// `lbd check` and a reload of the running `lbd` agree on every file of a
/// corpus: the file mutated by hand (each value the old check accepted
/// and the reload refused, or that cannot work) and at random (seeded):
/// lines deleted, doubled, cut, digits changed. For each, `lbd check`
/// and `lbctl reload` must both accept it or both refuse it.
#[test]
fn lbd_check_and_a_reload_agree_on_a_corpus_of_mutated_files() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = lb_tests::scenario::setup(2, &[Some(1), Some(1)])?;
        let good = std::fs::read_to_string(&lbd.config)?;
        let mut corpus: Vec<(String, String)> = [
            ("api_socket: ", "api_socket: /run/elsewhere.sock\n# was: "),
            ("state_file: ", "state_file: /tmp/other-state.json\n# was: "),
            ("instance: ", "instance: another\n# was: "),
            ("table_size: 65537", "table_size: 4099"),
            ("conntrack_buckets: 65536", "conntrack_buckets: 2147483648"),
            ("gateway_mac: auto", "gateway_mac: ff:ff:ff:ff:ff:ff"),
            (
                "    protocol: tcp\n",
                "    protocol: tcp\n    min_healthy: 0\n",
            ),
            (
                "    protocol: tcp\n",
                "    protocol: tcp\n    drain_timeout: 65536\n",
            ),
            ("    port: 80\n", "    port: \"80\"\n"),
            ("        weight: 1\n", "        weight: 0\n"),
            ("xdp_mode: native", "xdp_mode: generic"),
            ("mtu: ", "mtu: 100\n# was: "),
        ]
        .iter()
        .map(|(from, to)| (format!("{from} -> {to}"), good.replacen(from, to, 1)))
        .collect();
        corpus.push((
            "every weight 0".into(),
            good.replace("weight: 1", "weight: 0"),
        ));
        corpus.push(("state_file: /".into(), format!("state_file: /\n{good}")));
        corpus.push((
            "a relative bpffs".into(),
            format!("bpffs: sys/fs/bpf\n{good}"),
        ));
        corpus.push(("not YAML".into(), format!("{good}\n  - [")));
        let mut rng = 0x5eed_u64;
        let lines: Vec<&str> = good.lines().collect();
        for n in 0..40 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let at = (rng >> 8) as usize % lines.len();
            let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            let what = match n % 4 {
                0 => {
                    l.remove(at);
                    "deleted"
                }
                1 => {
                    l.insert(at, l[at].clone());
                    "doubled"
                }
                2 => {
                    let cut = (rng >> 24) as usize % (l[at].len() + 1);
                    l[at].truncate(cut);
                    "cut"
                }
                _ => {
                    l[at] = l[at]
                        .chars()
                        .map(|c| if c.is_ascii_digit() { '7' } else { c })
                        .collect();
                    "digits changed"
                }
            };
            corpus.push((format!("line {at} {what}"), l.join("\n") + "\n"));
        }
        let lbd_bin = bin_path("lbd")?;
        let (mut accepted, mut refused) = (0, 0);
        for (what, text) in &corpus {
            std::fs::write(&lbd.config, text)?;
            let check = run_bounded(
                Command::new(&lbd_bin)
                    .arg("--config")
                    .arg(&lbd.config)
                    .arg("check"),
                Duration::from_secs(120),
            )?;
            let reload = lbd.lbctl(&["reload"]);
            let checked = check.status.success();
            if checked != reload.is_ok() {
                bail!(
                    "{what}: lbd check {} but the reload {}:\ncheck: {}{}\nreload: {reload:?}",
                    if checked { "accepted it" } else { "refused it" },
                    if reload.is_ok() {
                        "applied it"
                    } else {
                        "refused it"
                    },
                    String::from_utf8_lossy(&check.stdout),
                    String::from_utf8_lossy(&check.stderr),
                );
            }
            if checked {
                accepted += 1;
            } else {
                refused += 1;
            }
            std::fs::write(&lbd.config, &good)?;
            lbd.lbctl(&["reload", "--force"])?;
        }
        eprintln!(
            "lbd check and reload agreed on {} files: {accepted} accepted, {refused} refused",
            corpus.len()
        );
        let vip = rig.tcp_vip();
        rig.client
            .within(move || lb_tests::traffic::tcp_request(lb_tests::rig::CLIENT, 47_000, vip))?
            .context("a connection after the corpus")?;
        Ok(())
    })());
}

/// A second instance on an interface that runs the first one's program
/// is refused before it creates anything, naming the first instance.
#[test]
fn a_second_instance_on_a_busy_interface_is_refused_before_it_creates_anything() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(1, &[Some(1)])?;
        let text = std::fs::read_to_string(&lbd.config)?;
        let other = format!("{}-b", rig.id);
        let second = rig.dir.join("second.yaml");
        std::fs::write(
            &second,
            text.replace(
                &format!("instance: {}", rig.id),
                &format!("instance: {other}"),
            )
            .replace("lbd.sock", "second.sock")
            .replace("state.json", "second-state.json"),
        )?;
        let out = run_bounded(
            rig.lb
                .command(bin_path("lbd")?)
                .arg("--config")
                .arg(&second),
            Duration::from_secs(60),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        let pins = std::path::Path::new("/sys/fs/bpf/lb").join(&other);
        let left = pinned_maps(&pins);
        let _ = std::fs::remove_dir_all(&pins);
        if out.status.success()
            || !err.contains("already runs XDP program")
            || !err.contains(&format!("lbd instance `{}`", rig.id))
        {
            bail!("the second instance: {}\n{err}", out.status);
        }
        if !left.is_empty() {
            bail!("the refused instance pinned {left:?}");
        }
        lbd.lbctl(&["status"])?;
        Ok(())
    })());
}

/// A preview of a huge file (10 MB, 150,000 VIPs) costs memory while it
/// runs and gives it back: `lbd`'s resident memory returns to near where
/// it was.
#[test]
fn a_preview_of_a_huge_file_gives_its_memory_back() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(1, &[Some(1)])?;
        let base = std::fs::read_to_string(&lbd.config)?;
        let mut huge = base.clone();
        let mut n = 0u32;
        while huge.len() < 10 << 20 {
            huge.push_str(&format!(
                "  - address: 10.{}.{}.{}\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.10.31.2\n",
                100 + n / 65536,
                (n / 256) % 256,
                n % 256
            ));
            n += 1;
        }
        let path = rig.dir.join("huge.yaml");
        std::fs::write(&path, &huge)?;
        let before = rss_kib(lbd.pid())?;
        let err = lbd
            .lbctl(&["diff", path.to_str().context("path")?])
            .expect_err("too many VIPs for max_vips");
        if !format!("{err:#}").contains("max_vips") {
            bail!("the preview of {n} VIPs said: {err:#}");
        }
        std::thread::sleep(Duration::from_millis(500));
        let after = rss_kib(lbd.pid())?;
        eprintln!(
            "lbd RSS {before} KiB before a preview of {n} VIPs ({} MB), {after} KiB after",
            huge.len() >> 20
        );
        if after > before + 32 * 1024 {
            bail!("lbd kept {} MiB after the preview", (after - before) / 1024);
        }
        lbd.lbctl(&["status"])?;
        Ok(())
    })());
}

/// A restart takes the interfaces over as they are now. A pinned link that
/// lost its interface is replaced by a new one (here the link is cut loose
/// with `BPF_LINK_DETACH`, which leaves it as a deleted and re-made
/// interface does: replacing the program in it fails with ENOLINK, and
/// before this every start failed so); a running `lbd` does the same
/// within seconds. An `xdp_mode` changed for the restart is applied, not
/// just reported (generic where native is refused, rather than no
/// program); an interface taken out of `interfaces` is detached.
#[test]
fn a_restart_attaches_afresh_a_link_that_lost_its_interface_or_its_mode() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let config = lbd.config.clone();
        stop(lbd)?;
        cut_loose(&rig.pin_dir().join("link-eth0"))?;
        if let Some(mode) = xdp_mode_of(&rig, "eth0")? {
            bail!("eth0 still runs XDP (mode {mode}) after its link was detached");
        }
        let lbd = Lbd::start(&rig, &config).context("lbd after its link lost eth0")?;
        serves_in_mode(&rig, &lbd, 1, 45_401)?;
        if !lbd.log_text().contains("no longer holds the interface") {
            bail!(
                "lbd said nothing of the link it replaced:\n{}",
                lbd.log_text()
            );
        }
        // The same while lbd runs: it checks every 5 s.
        cut_loose(&rig.pin_dir().join("link-eth0"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while xdp_mode_of(&rig, "eth0")?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        serves_in_mode(&rig, &lbd, 1, 45_403).context("after the link was cut loose under lbd")?;
        if !lbd.log_text().contains("attached afresh") {
            bail!(
                "lbd said nothing of the link it replaced while running:\n{}",
                lbd.log_text()
            );
        }
        stop(lbd)?;
        // Generic, and a second interface (one end of a veth pair inside
        // the namespace, which goes with it).
        rig.lb.ip(&[
            "link", "add", "lbx0", "type", "veth", "peer", "name", "lbx1",
        ])?;
        rig.lb.ip(&["link", "set", "lbx0", "up"])?;
        let text = std::fs::read_to_string(&config)?;
        let generic = text.replace("xdp_mode: native", "xdp_mode: generic");
        std::fs::write(
            &config,
            generic.replace("interfaces: [eth0]", "interfaces: [eth0, lbx0]"),
        )?;
        let lbd = Lbd::start(&rig, &config).context("lbd with xdp_mode: generic")?;
        serves_in_mode(&rig, &lbd, 2, 45_402)?;
        if !lbd.log_text().contains("another mode than xdp_mode") {
            bail!(
                "lbd said nothing of the mode it changed:\n{}",
                lbd.log_text()
            );
        }
        if xdp_mode_of(&rig, "lbx0")? != Some(2) {
            bail!("lbx0 runs no XDP program:\n{}", lbd.log_text());
        }
        // Back to native, where lbx0 cannot be (its peer's MTU is too
        // large for native XDP on a veth): eth0 changes mode, lbx0, whose
        // generic link is gone by then, is attached generic again rather
        // than left bare, and the start goes on.
        stop(lbd)?;
        rig.lb.ip(&["link", "set", "lbx1", "mtu", "9000"])?;
        std::fs::write(
            &config,
            text.replace("interfaces: [eth0]", "interfaces: [eth0, lbx0]"),
        )?;
        let lbd = Lbd::start(&rig, &config).context("lbd with lbx0 unable to run native")?;
        serves_in_mode(&rig, &lbd, 1, 45_405)?;
        let status = lbd.lbctl_json(&["status"])?;
        let shown: Vec<_> = status["interfaces"]
            .as_array()
            .context("status interfaces")?
            .iter()
            .map(|i| (i["name"].as_str(), i["mode"].as_str()))
            .collect();
        if shown
            != [
                (Some("eth0"), Some("native")),
                (Some("lbx0"), Some("generic")),
            ]
        {
            bail!("lbctl status shows the interfaces as {shown:?}");
        }
        if xdp_mode_of(&rig, "lbx0")? != Some(2)
            || !lbd.log_text().contains("attached generic instead")
        {
            bail!(
                "lbx0 runs XDP in mode {:?}:\n{}",
                xdp_mode_of(&rig, "lbx0")?,
                lbd.log_text()
            );
        }
        // An interface taken out of the file is detached by the restart.
        stop(lbd)?;
        std::fs::write(&config, text)?;
        let lbd = Lbd::start(&rig, &config).context("lbd without lbx0")?;
        serves_in_mode(&rig, &lbd, 1, 45_404)?;
        let pin = rig.pin_dir().join("link-lbx0");
        if xdp_mode_of(&rig, "lbx0")?.is_some() || pin.exists() {
            bail!(
                "lbx0 still runs XDP ({:?}) or its link is still pinned ({}):\n{}",
                xdp_mode_of(&rig, "lbx0")?,
                pin.exists(),
                lbd.log_text()
            );
        }
        if !lbd.log_text().contains("no longer in interfaces") {
            bail!("lbd said nothing of lbx0:\n{}", lbd.log_text());
        }
        Ok(())
    })());
}

/// An upgrade after a downgrade: the older `lbd`'s program placed IPv6
/// flows by the unkeyed hash on maps that say keyed. The program of the
/// maps' own key is not in the link when `lbd` starts (here a program
/// with no maps stands in for the older version's, put into the pinned
/// link by hand while `lbd` is stopped), so it turns the legacy lookup on
/// for an hour, and says so; a plain restart does not.
#[test]
fn a_start_after_an_older_program_ran_turns_the_ipv6_legacy_lookup_on() {
    let _serial = serial();
    check((|| {
        const SAID: &str = "an older version's program ran on these maps";
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let config = lbd.config.clone();
        stop(lbd)?;
        let lbd = Lbd::start(&rig, &config).context("a plain restart")?;
        if lbd.log_text().contains(SAID) {
            bail!(
                "a plain restart took its own program for an older one:\n{}",
                lbd.log_text()
            );
        }
        stop(lbd)?;
        let mut older = aya::Ebpf::load(lb::objects::LB_BENCH)?;
        let program: &mut aya::programs::Xdp = older
            .program_mut("bench_pass")
            .context("bench_pass")?
            .try_into()?;
        program.load()?;
        let pin = aya::programs::links::PinnedLink::from_pin(rig.pin_dir().join("link-eth0"))?;
        let link = aya::programs::xdp::XdpLink::try_from(aya::programs::links::FdLink::from(pin))?;
        program.attach_to_link(link)?;
        let lbd = Lbd::start(&rig, &config).context("lbd after the older program")?;
        serves_in_mode(&rig, &lbd, 1, 45_406)?;
        if !lbd.log_text().contains(SAID) {
            bail!("lbd said nothing of the older program:\n{}", lbd.log_text());
        }
        Ok(())
    })());
}

/// Stops `lbd` with SIGTERM (its program stays attached).
fn stop(mut lbd: Lbd) -> Result<()> {
    lbd.signal(libc::SIGTERM)?;
    if lbd.wait_exit(Duration::from_secs(60))?.is_none() {
        bail!("lbd did not stop on SIGTERM");
    }
    Ok(())
}

/// The lb namespace's eth0 runs XDP in `mode` (iproute2's number: 1 in the
/// driver, 2 generic) and a connection to the VIP from `sport` is served.
fn serves_in_mode(rig: &lb_tests::rig::Rig, lbd: &Lbd, mode: u64, sport: u16) -> Result<()> {
    if xdp_mode_of(rig, "eth0")? != Some(mode) {
        bail!(
            "eth0 runs XDP in mode {:?}, expected {mode}:\n{}",
            xdp_mode_of(rig, "eth0")?,
            lbd.log_text()
        );
    }
    let vip = rig.tcp_vip();
    let client = lb_tests::rig::CLIENT;
    rig.client
        .within(move || lb_tests::traffic::tcp_request(client, sport, vip))?
        .context("a connection to the VIP")?;
    Ok(())
}

/// How the lb namespace's `iface` runs XDP, per `ip -json link` (`None`:
/// it runs none).
fn xdp_mode_of(rig: &lb_tests::rig::Rig, iface: &str) -> Result<Option<u64>> {
    let out = rig
        .lb
        .ip(&["-json", "-details", "link", "show", "dev", iface])?;
    let links: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(links[0]["xdp"]["mode"].as_u64().filter(|m| *m != 0))
}

/// Detaches the bpf_link pinned at `pin` from its interface
/// (`BPF_OBJ_GET`, then `BPF_LINK_DETACH`); the link itself stays.
fn cut_loose(pin: &std::path::Path) -> Result<()> {
    use std::os::fd::FromRawFd as _;
    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_LINK_DETACH: libc::c_long = 34;
    let path = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes())?;
    // union bpf_attr, the BPF_OBJ_GET part: pathname, bpf_fd, file_flags.
    let mut attr = [0u64; 16];
    attr[0] = path.as_ptr() as u64;
    let size = std::mem::size_of_val(&attr);
    // SAFETY: `attr` is a zeroed bpf_attr as large as the kernel reads for
    // these commands; `path` outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, attr.as_mut_ptr(), size) };
    if fd < 0 {
        bail!(
            "BPF_OBJ_GET {}: {}",
            pin.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: the kernel just gave us this descriptor.
    let link = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    // The BPF_LINK_DETACH part: link_fd.
    let mut attr = [0u64; 16];
    attr[0] = u64::from(std::os::fd::AsRawFd::as_raw_fd(&link) as u32);
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_DETACH, attr.as_mut_ptr(), size) };
    if r < 0 {
        bail!(
            "BPF_LINK_DETACH {}: {}",
            pin.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// A restart that removes VIPs the running datapath served names them,
/// and says why when it can tell: here a VIP added through the API, whose
/// runtime change lives in a state file the restarted `lbd` no longer
/// reads (`state_file` moved).
#[test]
fn a_restart_that_drops_served_vips_names_them() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let be = rig.backends[0].addr.to_string();
        lbd.lbctl(&["vip", "add", "10.99.0.9:80/tcp", "--backend", &be])?;
        let config = lbd.config.clone();
        stop(lbd)?;
        let text = std::fs::read_to_string(&config)?;
        std::fs::write(&config, text.replace("state.json", "moved.json"))?;
        let lbd = Lbd::start(&rig, &config).context("lbd with its state file moved")?;
        let log = lbd.log_text();
        let said = log
            .lines()
            .find(|l| l.contains("this start removes"))
            .with_context(|| format!("no warning of the removed VIP:\n{log}"))?;
        if !said.contains("served 1 VIP(s)")
            || !said.contains("10.99.0.9:80/tcp")
            || !said.contains("moved.json does not exist")
        {
            bail!("the warning: {said}");
        }
        Ok(())
    })());
}

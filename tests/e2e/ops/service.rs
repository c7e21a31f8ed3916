//! The systemd unit, `scripts/lbd.service`. systemd cannot run in these
//! containers (it is not PID 1), so the unit is never started here;
//! instead:
//!
//! - `systemd-analyze verify` reads it (with its binaries pointed at the
//!   built ones and its man pages generated) and must say nothing at all;
//! - `systemd-analyze security --offline` rates its hardening;
//! - `lbd` runs in the rig with exactly the unit's capability bounding set
//!   and no-new-privileges (applied by `setpriv`, as systemd would), and
//!   must forward, probe through the tunnel, serve metrics, reload with
//!   the unit's `ExecReload` command, stop on SIGTERM within
//!   `TimeoutStopSec` leaving the program forwarding, and be restarted
//!   adopting it.
//!
//! The seccomp filter, address families and mount restrictions are not
//! applied here; they are the parts of the unit only a real systemd host
//! exercises.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, LbdCommand, Rig, bin_path},
    scenario::{check, predicted, serial},
    traffic::tcp_request,
};

use crate::{Scratch, output, repo, stdout};

const METRICS: &str = "127.0.0.1:9469";

fn unit_text() -> Result<String> {
    let path = repo("scripts/lbd.service");
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// The values of `key=` in the unit, in order.
fn values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect()
}

/// The one value of `key=`.
fn value(unit: &str, key: &str) -> Result<String> {
    match values(unit, key).as_slice() {
        [v] => Ok(v.clone()),
        other => bail!("the unit should set {key}= once, not {other:?}"),
    }
}

/// A copy of the unit whose commands are the built binaries, and a man
/// directory holding the pages its `Documentation=` names.
fn testable_unit(scratch: &Scratch) -> Result<(PathBuf, PathBuf)> {
    let unit = unit_text()?;
    let (lbd, lbctl) = (bin_path("lbd")?, bin_path("lbctl")?);
    if !value(&unit, "ExecStart")?.starts_with("/usr/sbin/lbd ")
        || !value(&unit, "ExecReload")?.starts_with("/usr/sbin/lbctl ")
    {
        bail!(
            "ExecStart and ExecReload should run /usr/sbin/lbd and /usr/sbin/lbctl (the package's paths)"
        );
    }
    let rewritten = unit
        .replace("=/usr/sbin/lbd ", &format!("={} ", lbd.display()))
        .replace("=/usr/sbin/lbctl ", &format!("={} ", lbctl.display()));
    let path = scratch.path("lbd.service");
    std::fs::write(&path, rewritten)?;
    let man = scratch.path("man");
    for bin in [&lbd, &lbctl] {
        stdout(
            Command::new(bin)
                .args(["__generate", "man"])
                .arg(man.join("man8")),
            "lb",
        )?;
    }
    Ok((path, man))
}

/// Everything `systemd-analyze verify` says about `unit` (empty: nothing
/// to complain about).
fn verify(unit: &Path, man: &Path) -> Result<String> {
    let out = output(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(unit)
            .env("MANPATH", man),
        "systemd",
    )?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() && said.trim().is_empty() {
        bail!(
            "systemd-analyze verify failed ({}) without a word",
            out.status
        );
    }
    Ok(said.trim().to_string())
}

#[test]
fn the_unit_verifies_without_a_warning() {
    let _serial = serial();
    check((|| {
        let scratch = Scratch::new("unit")?;
        let (unit, man) = testable_unit(&scratch)?;
        let said = verify(&unit, &man)?;
        if !said.is_empty() {
            bail!("systemd-analyze verify scripts/lbd.service:\n{said}");
        }
        // The check can fail: one misspelt value draws a warning.
        let text = std::fs::read_to_string(&unit)?;
        let broken = scratch.path("broken").join("lbd.service");
        std::fs::create_dir_all(broken.parent().context("a directory")?)?;
        std::fs::write(&broken, text.replace("KillMode=mixed", "KillMode=mixd"))?;
        let said = verify(&broken, &man)?;
        if !said.contains("mixd") {
            bail!("systemd-analyze verify did not notice `KillMode=mixd`: {said:?}");
        }
        Ok(())
    })());
}

#[test]
fn the_units_hardening_rates_ok() {
    let _serial = serial();
    check((|| {
        let scratch = Scratch::new("security")?;
        let (unit, _) = testable_unit(&scratch)?;
        let report = stdout(
            Command::new("systemd-analyze")
                .args(["security", "--offline=true", "--no-pager"])
                .arg(&unit),
            "systemd",
        )?;
        let line = report
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .with_context(|| format!("no overall exposure in:\n{report}"))?;
        let level: f64 = line
            .split(':')
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("cannot read {line:?}"))?;
        eprintln!("{}", line.trim());
        // systemd's scale: below 1 SAFE, below 3 OK, then MEDIUM, EXPOSED,
        // UNSAFE. Loading XDP programs as root costs about 2.4.
        if level >= 3.0 {
            bail!("exposure {level} is above OK:\n{report}");
        }
        Ok(())
    })());
}

/// Capability numbers (linux/capability.h) of the names the unit may use.
fn cap_number(name: &str) -> Result<u32> {
    Ok(match name {
        "CAP_NET_BIND_SERVICE" => 10,
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_ADMIN" => 21,
        "CAP_SYS_RESOURCE" => 24,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => bail!("capability {other} is not in this test's table: add it"),
    })
}

/// `setpriv` with the unit's capability bounding set and no new
/// privileges, and the capability mask that leaves lbd with.
fn unit_wrapper(unit: &str) -> Result<(Vec<String>, u64)> {
    let caps: Vec<String> = value(unit, "CapabilityBoundingSet")?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if value(unit, "NoNewPrivileges")? != "yes" {
        bail!("the unit should set NoNewPrivileges=yes");
    }
    let mut mask = 0u64;
    let mut set = String::from("-all");
    for cap in &caps {
        mask |= 1 << cap_number(cap)?;
        set.push_str(&format!(
            ",+{}",
            cap.trim_start_matches("CAP_").to_lowercase()
        ));
    }
    let wrapper = vec![
        "setpriv".to_string(),
        format!("--bounding-set={set}"),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
    ];
    Ok((wrapper, mask))
}

/// Checks the running lbd's capability sets and no-new-privs flag.
fn check_privileges(lbd: &Lbd, mask: u64) -> Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", lbd.pid()))?;
    let field = |name: &str| -> Result<u64> {
        let v = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("no {name} in /proc/PID/status"))?;
        Ok(u64::from_str_radix(v.trim(), 16)?)
    };
    for name in ["CapBnd:", "CapEff:", "CapPrm:"] {
        let got = field(name)?;
        if got != mask {
            bail!("lbd's {name} is {got:#x}, the unit's set is {mask:#x}");
        }
    }
    if field("NoNewPrivs:")? != 1 {
        bail!("lbd runs without no-new-privs");
    }
    Ok(())
}

/// Waits until every probe of the TCP VIP has passed a few times.
fn wait_healthy(lbd: &Lbd) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let h = lbd.lbctl_json(&["health"])?;
        let up = h.as_array().is_some_and(|vips| {
            vips.iter()
                .filter(|v| v["vip"] == "10.99.0.1:80/tcp")
                .all(|v| {
                    v["backends"].as_array().is_some_and(|b| {
                        b.iter()
                            .all(|b| b["probes"].as_u64() > Some(2) && b["health"] == "up")
                    })
                })
        });
        if up {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("probes through the tunnel did not find the backends up: {h}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `count` new connections from `first_port` on: each must reach the
/// backend `lbctl simulate` names.
fn connections(rig: &Rig, lbd: &Lbd, first_port: u16, count: u16) -> Result<()> {
    let vip = rig.tcp_vip();
    let ports: Vec<u16> = (first_port..first_port + count).collect();
    let got: Vec<Result<String>> = rig
        .client
        .within(move || ports.iter().map(|&p| tcp_request(CLIENT, p, vip)).collect())?;
    for (i, r) in got.into_iter().enumerate() {
        let port = first_port + i as u16;
        let backend = r.with_context(|| format!("connection from port {port}"))?;
        let want = predicted(lbd, rig, port)?;
        if backend != want {
            bail!("port {port} reached {backend}, lbctl simulate said {want}");
        }
    }
    Ok(())
}

/// GET /metrics from inside the balancer's namespace.
fn scrape(rig: &Rig) -> Result<String> {
    rig.lb.within(|| -> Result<String> {
        let mut s = TcpStream::connect(METRICS)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: lb\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    })?
}

/// The unit's `ExecReload`, with its socket and binary made the rig's.
fn reload_as_the_unit_does(unit: &str, lbd: &Lbd) -> Result<String> {
    let line = value(unit, "ExecReload")?.replace("${LB_SOCKET}", &lbd.socket.to_string_lossy());
    let mut words = line.split_whitespace();
    if words.next() != Some("/usr/sbin/lbctl") {
        bail!("ExecReload should run /usr/sbin/lbctl: {line}");
    }
    stdout(Command::new(bin_path("lbctl")?).args(words), "lb")
}

/// Starts lbd under `how`, checks its privileges and that it forwards.
fn start_checked(rig: &Rig, config: &Path, how: &LbdCommand, mask: u64) -> Result<Lbd> {
    let lbd = Lbd::start_with(&rig.lb, &rig.dir, config, how, &[])?;
    check_privileges(&lbd, mask)?;
    wait_healthy(&lbd)?;
    Ok(lbd)
}

#[test]
fn lbd_serves_reloads_stops_and_restarts_with_only_the_units_capabilities() {
    let _serial = serial();
    check((|| {
        let unit = unit_text()?;
        let (wrapper, mask) = unit_wrapper(&unit)?;
        let how = LbdCommand {
            program: bin_path("lbd")?,
            wrapper,
        };
        let rig = Rig::new(2)?;
        let config = rig.dir.join("lbd.yaml");
        let probes = "    health_check:\n      interval: 200ms\n      timeout: 150ms\n      rise: 2\n      fall: 3\n      through_tunnel: true\n";
        let write_config = |weights: &[Option<u32>]| {
            std::fs::write(
                &config,
                format!(
                    "metrics:\n  listen: {METRICS}\nshutdown_grace: 1s\n{}",
                    rig.config_with(weights, probes)
                ),
            )
        };
        write_config(&[Some(1), Some(1)])?;
        let mut lbd = start_checked(&rig, &config, &how, mask)?;
        connections(&rig, &lbd, 46_000, 40)?;
        let metrics = scrape(&rig)?;
        if !metrics.starts_with("HTTP/1.1 200") && !metrics.starts_with("HTTP/1.0 200") {
            bail!("GET /metrics: {}", metrics.lines().next().unwrap_or(""));
        }
        write_config(&[Some(1), Some(2)])?;
        let reloaded = reload_as_the_unit_does(&unit, &lbd)?;
        if !reloaded.contains("reloaded") {
            bail!("ExecReload said {reloaded:?}");
        }

        // systemctl stop: SIGTERM, then at most TimeoutStopSec.
        let limit = value(&unit, "TimeoutStopSec")?;
        let secs: u64 = limit.trim_end_matches('s').parse()?;
        lbd.signal(libc::SIGTERM)?;
        let status = lbd
            .wait_exit(Duration::from_secs(secs))?
            .with_context(|| format!("lbd still runs {limit} after SIGTERM"))?;
        if !status.success() {
            bail!("lbd exited with {status} on SIGTERM:\n{}", lbd.log_text());
        }
        // The program stays attached: new connections without any lbd.
        let vip = rig.tcp_vip();
        rig.client.within(move || -> Result<()> {
            for port in 47_000..47_020 {
                tcp_request(CLIENT, port, vip)
                    .with_context(|| format!("port {port}, lbd stopped"))?;
            }
            Ok(())
        })??;

        // systemctl start again: the new lbd adopts what the old one left.
        drop(lbd);
        let lbd = start_checked(&rig, &config, &how, mask)?;
        let status = lbd.lbctl_json(&["status"])?;
        if status["maps_adopted"] != true || status["interfaces"][0]["adopted"] != true {
            bail!("the restarted lbd did not adopt the pinned maps and link: {status}");
        }
        // Without CAP_SYS_ADMIN it knows its own program by its record,
        // and takes it neither for an older one nor for an unknown one.
        let log = lbd.log_text();
        if log.contains("an older version's program ran") || log.contains("cannot tell whether") {
            bail!("the restarted lbd misjudged its own program in the link:\n{log}");
        }
        connections(&rig, &lbd, 48_000, 40)?;
        Ok(())
    })());
}

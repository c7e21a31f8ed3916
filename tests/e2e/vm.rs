//! The Debian package under a real systemd: runs only inside the virtual
//! machines of `cargo xtask vmtest` (systemd as PID 1, Debian 12's
//! userland, on Debian 12's 6.1 and Debian 13's 6.12 kernels), where the
//! unit's sandbox is real: the system-call filter, the address families,
//! `ProtectSystem=strict`, the watchdog. Elsewhere it is ignored (`cargo
//! test` lists it as such); the machines run it with `--ignored`.
//!
//! One test, in phases that build on each other, on the ECMP rig with one
//! balancer and BIRD as its router (a static fallback route stands in for
//! the rest of a network while `lbd` is stopped): `dpkg -i`, `systemctl
//! enable --now` (`lbd` in the rig's balancer namespace through a drop-in
//! with `NetworkNamespacePath=`), forwarding, `systemctl reload` of a valid
//! and of an invalid file, `restart` under live connections (none may
//! break), `stop` (forwarding goes on), the watchdog restarting a stopped
//! `lbd`, every system call outside the unit's filter logged while start,
//! reload, trace, metrics, BGP and stop run (there must be none),
//! `systemd-analyze security` against what the README says, `apt remove`
//! (a graceful stop: withdrawal, no watchdog kill) and `dpkg -P`.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::EcmpRig,
    rig::{CLIENT, bin_path},
    routers::{RouterKind, wait_for},
    scenario::check,
    traffic::{Stream, tcp_request},
};

const UNIT: &str = "/usr/lib/systemd/system/lbd.service";
const DROP_IN_DIR: &str = "/etc/systemd/system/lbd.service.d";
const METRICS_PORT: u16 = 9469;

/// The package the host built, in the machine's output share.
fn deb() -> Result<String> {
    let out = std::env::var("LB_VM_OUT").context("LB_VM_OUT: run me through cargo xtask vmtest")?;
    Ok(format!("{out}/lb.deb"))
}

fn sh(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {text}",
            args.join(" "),
            out.status
        );
    }
    Ok(text)
}

fn systemctl(args: &[&str]) -> Result<String> {
    sh("systemctl", args)
}

/// `lbd`'s journal since `since` (seconds since the epoch), message text.
fn journal(since: u64) -> Result<String> {
    sh(
        "journalctl",
        &[
            "-u",
            "lbd",
            "--no-pager",
            "-o",
            "cat",
            "--since",
            &format!("@{since}"),
        ],
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn main_pid() -> Result<u32> {
    let out = systemctl(&["show", "-p", "MainPID", "--value", "lbd"])?;
    out.trim().parse().context("MainPID")
}

/// The rig and the balancer's configuration as the package's unit wants
/// it (socket and state in the unit's directories: `/tmp` is private to
/// the unit).
struct Machine {
    rig: EcmpRig,
    config: String,
    socket: String,
}

impl Machine {
    fn new() -> Result<Machine> {
        let rig = EcmpRig::new(1, 2, RouterKind::Bird)?;
        rig.add_fallback_route(1)?;
        let lb = rig.balancer(1);
        let socket = format!("/run/lb/{}.sock", lb.instance);
        let config = rig
            .lbd_config(
                1,
                "",
                &format!("metrics: {{ listen: 127.0.0.1:{METRICS_PORT} }}\n"),
            )
            .replace(
                &format!("api_socket: {}/lbd.sock", lb.dir.display()),
                &format!("api_socket: {socket}"),
            )
            .replace(
                &format!("state_file: {}/state.json", lb.dir.display()),
                &format!("state_file: /var/lib/lb/{}.state.json", lb.instance),
            );
        Ok(Machine {
            rig,
            config,
            socket,
        })
    }

    fn lbctl(&self, args: &[&str]) -> Result<String> {
        let lbctl = bin_path("lbctl")?;
        let mut all = vec!["--socket", &self.socket];
        all.extend_from_slice(args);
        sh(&lbctl.to_string_lossy(), &all)
    }

    /// `count` connections through the VIP, each answered.
    fn forwards(&self, count: u16, first_port: u16) -> Result<()> {
        let vip = self.rig.tcp_vip();
        let got: Vec<Result<String>> = self.rig.client.within(move || {
            (first_port..first_port + count)
                .map(|p| tcp_request(CLIENT, p, vip))
                .collect()
        })?;
        let failed: Vec<String> = got
            .into_iter()
            .filter_map(|r| r.err().map(|e| format!("{e:#}")))
            .collect();
        if !failed.is_empty() {
            bail!("{} of {count} connections failed: {failed:?}", failed.len());
        }
        Ok(())
    }

    /// The weight of backend `addr` of the TCP VIP, as `lbd` runs it.
    fn tcp_weight(&self, addr: &str) -> Result<u64> {
        let text = self.lbctl(&["-o", "json", "vip", "list"])?;
        let vips: serde_json::Value = serde_json::from_str(&text)?;
        vips.as_array()
            .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.1:80/tcp"))
            .and_then(|v| v["backends"].as_array())
            .and_then(|b| b.iter().find(|b| b["address"] == addr))
            .and_then(|b| b["weight"].as_u64())
            .with_context(|| format!("no backend {addr} of the TCP VIP in {text}"))
    }

    fn wait_active(&self, what: &str, limit: Duration) -> Result<Duration> {
        wait_for(what, limit, Duration::from_millis(200), || {
            Ok(systemctl(&["is-active", "lbd"]).is_ok() && self.lbctl(&["status"]).is_ok())
        })
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("systemctl").args(["stop", "lbd"]).status();
        let _ = std::fs::remove_dir_all(DROP_IN_DIR);
        let _ = Command::new("systemctl").arg("daemon-reload").status();
    }
}

/// How long `lbd` may take to start (or restart) in an emulated guest:
/// a safety net, not a figure. Starts took 24 s to 133 s in CI runs of
/// the matrix; the watchdog phase, 72 s in one and over 180 s in the next.
const START: Duration = Duration::from_secs(600);

fn phase<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = Instant::now();
    let r = f().with_context(|| format!("phase {name}"));
    eprintln!(
        "vm: {name}: {} in {:.1} s",
        if r.is_ok() { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    r
}

#[test]
#[ignore = "runs inside the virtual machines of `cargo xtask vmtest` (systemd as PID 1)"]
fn the_package_under_systemd() {
    check((|| {
        if std::env::var_os("LB_VM_GUEST").is_none() {
            bail!(
                "this test installs a package and drives systemd: run it through `cargo xtask vmtest`"
            );
        }
        phase("quiet apt", quiet_apt)?;
        let m = phase("install", install)?;
        phase("enable --now", || enable(&m))?;
        phase("forwarding", || m.forwards(20, 21_000))?;
        phase("reload", || reloads(&m))?;
        phase("restart under connections", || restart_keeps_streams(&m))?;
        phase("stop keeps forwarding", || stop_keeps_forwarding(&m))?;
        phase("watchdog", || watchdog_restarts_a_stopped_lbd(&m))?;
        phase("system calls", || nothing_outside_the_filter(&m))?;
        phase("security rating", security_matches_the_readme)?;
        phase("apt remove", || remove_stops_gracefully(&m))?;
        phase("dpkg -P", purge)?;
        Ok(())
    })());
}

/// Debian's daily apt jobs (`apt-daily`, `apt-daily-upgrade`) start at
/// boot and on timers, and while they run they hold dpkg's lock: an
/// `apt-get remove` here once failed on it. They are stopped for the
/// test (a unit the image lacks is skipped), and `apt-get` below also
/// waits up to a minute for the lock (`dpkg` itself cannot wait).
fn quiet_apt() -> Result<()> {
    for unit in [
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "apt-daily.service",
        "apt-daily-upgrade.service",
        "unattended-upgrades.service",
    ] {
        if systemctl(&["cat", unit]).is_ok() {
            systemctl(&["stop", unit])?;
        }
    }
    Ok(())
}

/// `apt-get`, waiting up to a minute for dpkg's lock.
fn apt_get(args: &[&str]) -> Result<String> {
    let mut all = vec!["-o", "DPkg::Lock::Timeout=60"];
    all.extend_from_slice(args);
    sh("apt-get", &all)
}

/// `dpkg -i`: the unit lands under /usr/lib, nothing under /lib.
fn install() -> Result<Machine> {
    sh("dpkg", &["-i", &deb()?])?;
    let files = sh("dpkg", &["-L", "lb"])?;
    if !files.lines().any(|l| l == UNIT) || files.lines().any(|l| l.starts_with("/lib/")) {
        bail!("the package should ship {UNIT} and nothing under /lib:\n{files}");
    }
    if systemctl(&["is-enabled", "lbd"]).is_ok() {
        bail!("installing the package must not enable lbd");
    }
    Machine::new()
}

/// The configuration in place, `lbd` in the balancer's namespace by a
/// drop-in, `systemctl enable --now`, and BIRD learning the VIP.
fn enable(m: &Machine) -> Result<()> {
    let since = now();
    std::fs::write("/etc/lb/lb.yaml", &m.config)?;
    std::fs::write("/etc/default/lbd", format!("LB_SOCKET={}\n", m.socket))?;
    write_drop_in(m, "")?;
    systemctl(&["enable", "--now", "lbd"])?;
    m.wait_active("lbd active and answering", START)?;
    m.rig
        .wait_hops("the VIP announced to BIRD", &[1], Duration::from_secs(120))?;
    learnt_the_kernels_hz(&journal(since)?)
}

/// `lbd` learnt the kernel's HZ inside the unit's sandbox (it sizes the
/// datapath's windows): the value the kernel's build configuration
/// states, read here with grep, or, where the image has none, one that
/// Linux offers.
fn learnt_the_kernels_hz(log: &str) -> Result<()> {
    let Some(line) = log.lines().find(|l| l.contains("kernel tick rate")) else {
        bail!("lbd did not learn the kernel's HZ:\n{log}");
    };
    let release = sh("uname", &["-r"])?;
    let config = format!("/boot/config-{}", release.trim());
    let want = match sh("grep", &["-m1", "^CONFIG_HZ=", &config]) {
        Ok(out) => vec![out.trim().trim_start_matches("CONFIG_HZ=").to_string()],
        Err(_) => ["100", "250", "300", "1000"].map(String::from).to_vec(),
    };
    let said: String = line
        .split_once("hz=")
        .map(|(_, rest)| rest.chars().take_while(char::is_ascii_digit).collect())
        .unwrap_or_default();
    if !want.contains(&said) {
        bail!("lbd says {line:?}; the kernel's HZ is one of {want:?} ({config})");
    }
    Ok(())
}

/// The rig's namespace for the unit (plus `extra` lines of `[Service]`).
fn write_drop_in(m: &Machine, extra: &str) -> Result<()> {
    std::fs::create_dir_all(DROP_IN_DIR)?;
    std::fs::write(
        Path::new(DROP_IN_DIR).join("rig.conf"),
        format!(
            "[Service]\nNetworkNamespacePath=/run/netns/{}\nTimeoutStartSec={}\n{extra}",
            m.rig.balancer(1).ns.name,
            // systemd's 90 s default: a restart under emulation took up
            // to 160 s (10x the host's time and more).
            START.as_secs()
        ),
    )?;
    systemctl(&["daemon-reload"])?;
    Ok(())
}

/// A valid file reloads (`systemctl reload` succeeds, the new weight
/// runs); an invalid one fails the reload and changes nothing.
fn reloads(m: &Machine) -> Result<()> {
    let pid = main_pid()?;
    let weighted = m.config.replacen(
        &format!("      - address: {}\n", m.rig.backends[0].addr),
        &format!(
            "      - address: {}\n        weight: 3\n",
            m.rig.backends[0].addr
        ),
        1,
    );
    std::fs::write("/etc/lb/lb.yaml", &weighted)?;
    systemctl(&["reload", "lbd"])?;
    let first = m.rig.backends[0].addr.to_string();
    if m.tcp_weight(&first)? != 3 {
        bail!("the reloaded weight is not running");
    }
    std::fs::write("/etc/lb/lb.yaml", "vips: [ this is not YAML")?;
    if systemctl(&["reload", "lbd"]).is_ok() {
        bail!("systemctl reload of an invalid file succeeded");
    }
    if main_pid()? != pid || m.tcp_weight(&first)? != 3 {
        bail!("a refused reload changed the running lbd");
    }
    std::fs::write("/etc/lb/lb.yaml", &m.config)?;
    systemctl(&["reload", "lbd"])?;
    m.forwards(10, 21_100)
}

/// `systemctl restart` while 30 connections exchange data: none breaks.
fn restart_keeps_streams(m: &Machine) -> Result<()> {
    let streams = m.rig.streams(
        22_000..22_030,
        Duration::from_millis(200),
        Duration::from_secs(20),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    let pid = main_pid()?;
    systemctl(&["restart", "lbd"])?;
    m.wait_active("lbd back after restart", START)?;
    if main_pid()? == pid {
        bail!("restart kept the same process");
    }
    std::thread::sleep(Duration::from_secs(3));
    finish_unbroken(streams)
}

fn finish_unbroken(streams: Vec<Stream>) -> Result<()> {
    let n = streams.len();
    let mut broken = Vec::new();
    for s in streams {
        let r = s.finish()?;
        if let Some(e) = r.error {
            broken.push(format!("port {}: {e}", r.sport));
        }
    }
    eprintln!("vm: {} of {n} connections broken", broken.len());
    if !broken.is_empty() {
        bail!("{} of {n} connections broke: {broken:?}", broken.len());
    }
    Ok(())
}

/// `systemctl stop`: `lbd` exits cleanly (no watchdog), the program goes
/// on forwarding; `start` brings it back.
fn stop_keeps_forwarding(m: &Machine) -> Result<()> {
    let since = now();
    systemctl(&["stop", "lbd"])?;
    if systemctl(&["is-active", "lbd"]).is_ok() {
        bail!("lbd is still active after stop");
    }
    m.forwards(10, 23_000)?;
    let log = journal(since)?;
    if log.contains("Watchdog") || !log.contains("keeps forwarding") {
        bail!("the stop was not the graceful one:\n{log}");
    }
    systemctl(&["start", "lbd"])?;
    m.wait_active("lbd started again", START)?;
    Ok(())
}

/// A stopped `lbd` (SIGSTOP) misses its watchdog pings: systemd kills it
/// and starts a new one, which adopts the pins; forwarding never stops.
fn watchdog_restarts_a_stopped_lbd(m: &Machine) -> Result<()> {
    let since = now();
    let pid = main_pid()?;
    sh("kill", &["-STOP", &pid.to_string()])?;
    m.forwards(5, 24_000)?;
    let took = wait_for(
        "systemd restarting the stopped lbd",
        // The watchdog (10 s), the abort's wait for a stopped process
        // (TimeoutStopSec, 30 s), RestartSec and a start.
        START + Duration::from_secs(45),
        Duration::from_millis(500),
        || {
            let now = main_pid().unwrap_or(0);
            Ok(now != 0 && now != pid && m.lbctl(&["status"]).is_ok())
        },
    )?;
    eprintln!(
        "vm: the watchdog replaced lbd {pid} after {:.1} s",
        took.as_secs_f64()
    );
    let log = sh(
        "journalctl",
        &["--no-pager", "--since", &format!("@{since}")],
    )?;
    if !log.contains("Watchdog timeout") {
        bail!("no watchdog timeout in the journal:\n{log}");
    }
    m.forwards(10, 24_100)
}

/// With the unit's filter lifted and every call outside it logged
/// (`SystemCallLog=~…`), start, API calls, reload, trace, metrics, BGP
/// and stop log nothing: the filter blocks nothing `lbd` does.
fn nothing_outside_the_filter(m: &Machine) -> Result<()> {
    let unit = std::fs::read_to_string(UNIT)?;
    let filter = unit
        .lines()
        .find_map(|l| l.strip_prefix("SystemCallFilter="))
        .context("the unit has a SystemCallFilter=")?;
    write_drop_in(m, &format!("SystemCallFilter=\nSystemCallLog=~{filter}\n"))?;
    let since = now();
    systemctl(&["restart", "lbd"])?;
    m.wait_active("lbd with system calls logged", START)?;
    m.rig
        .wait_hops("BGP up again", &[1], Duration::from_secs(120))?;
    for args in [
        &["status"][..],
        &["stats"],
        &["health"],
        &["bgp"],
        &["history"],
        &["table", "10.99.0.1:80/tcp"],
    ] {
        m.lbctl(args)?;
    }
    systemctl(&["reload", "lbd"])?;
    trace_one(m)?;
    scrape(m)?;
    systemctl(&["stop", "lbd"])?;
    // The check can see a call outside a filter: `mount` is not in
    // @system-service, and a unit that calls it is logged.
    let _ = Command::new("systemd-run")
        .args(["--wait", "--quiet", "-p", "SystemCallLog=~@system-service"])
        .args(["mount", "-t", "tmpfs", "none", "/nonexistent"])
        .status();
    let kernel = wait_for(
        "the sentinel's logged mount(2) in the kernel log",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let k = sh(
                "journalctl",
                &["-k", "--no-pager", "--since", &format!("@{since}")],
            )?;
            Ok(k.lines()
                .any(|l| l.contains("type=1326") && l.contains("comm=\"mount\"")))
        },
    )
    .and_then(|_| {
        sh(
            "journalctl",
            &["-k", "--no-pager", "--since", &format!("@{since}")],
        )
    })?;
    let logged: Vec<&str> = kernel
        .lines()
        .filter(|l| l.contains("type=1326") && l.contains("comm=\"lbd\""))
        .collect();
    write_drop_in(m, "")?;
    systemctl(&["start", "lbd"])?;
    m.wait_active("lbd under its filter again", START)?;
    if !logged.is_empty() {
        bail!(
            "{} system calls outside the unit's filter:\n{}",
            logged.len(),
            logged.join("\n")
        );
    }
    let log = journal(since)?;
    if log.contains("SIGSYS") || log.contains("Operation not permitted") {
        bail!("lbd hit the sandbox:\n{log}");
    }
    Ok(())
}

/// `lbctl trace --count 1` sees a connection made while it runs.
fn trace_one(m: &Machine) -> Result<()> {
    let lbctl = bin_path("lbctl")?;
    let mut child = Command::new(&lbctl)
        .args(["--socket", &m.socket, "trace", "--vip", "10.99.0.1:80/tcp"])
        .args(["--count", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // Connections until the trace has seen one (under emulation and load
    // the traced program may take a while to swap in), for at most 2 min.
    let started = std::time::Instant::now();
    let mut port = 25_000;
    while child.try_wait()?.is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("lbctl trace saw no packet of 10.99.0.1:80/tcp in 2 minutes of connections");
        }
        m.forwards(3, port)?;
        port += 3;
        std::thread::sleep(Duration::from_secs(1));
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("10.99.0.1") {
        bail!("lbctl trace saw nothing ({}): {text}", out.status);
    }
    Ok(())
}

/// A scrape of `/metrics` inside the balancer's namespace.
fn scrape(m: &Machine) -> Result<()> {
    let body = m.rig.balancer(1).ns.within(|| -> Result<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", METRICS_PORT))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    })??;
    if !body.contains("lb_datapath_packets_total") {
        bail!("the scrape has no lb_ families: {body}");
    }
    Ok(())
}

/// `systemd-analyze security lbd` on the running system gives the rating
/// the README states.
fn security_matches_the_readme() -> Result<()> {
    let report = sh("systemd-analyze", &["security", "lbd", "--no-pager"])?;
    let level = report
        .lines()
        .find_map(|l| l.split("Overall exposure level for lbd.service:").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .with_context(|| format!("no exposure level in:\n{report}"))?
        .to_string();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let claim = format!("`systemd-analyze security lbd` rates it {level} on a running system");
    eprintln!("vm: systemd-analyze security lbd: {level}");
    if !readme.contains(&claim) {
        bail!("README should say {claim:?}");
    }
    Ok(())
}

/// `apt remove`: the package's prerm stops `lbd` gracefully (routes
/// withdrawn, clean exit, no watchdog kill), the program stays attached.
fn remove_stops_gracefully(m: &Machine) -> Result<()> {
    let since = now();
    let out = apt_get(&["remove", "-y", "lb"])?;
    let log = sh(
        "journalctl",
        &["--no-pager", "--since", &format!("@{since}")],
    )?;
    for bad in ["Watchdog timeout", "reception is disabled", "SIGABRT"] {
        if log.contains(bad) {
            bail!("removing the package: {bad:?} in the journal:\n{log}\n{out}");
        }
    }
    if !log.contains("keeps forwarding") {
        bail!("removing the package did not stop lbd gracefully:\n{log}\n{out}");
    }
    m.rig
        .wait_hops("the VIP withdrawn", &[], Duration::from_secs(30))?;
    m.forwards(10, 26_000)
}

/// `dpkg -P` (after the operator's own files went: dpkg rightly keeps a
/// directory that holds them): no warning, the unit, the conffile and
/// `/etc/lb` gone.
fn purge() -> Result<()> {
    std::fs::remove_file("/etc/lb/lb.yaml")?;
    std::fs::remove_file("/etc/default/lbd")?;
    let out = sh("dpkg", &["-P", "lb"])?;
    if out.contains("warning") || Path::new(UNIT).exists() || Path::new("/etc/lb").exists() {
        bail!("purging: {out}");
    }
    Ok(())
}

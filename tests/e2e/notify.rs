//! `lbd` under systemd's service protocol, without systemd: the test
//! plays the service manager on a datagram socket (`NOTIFY_SOCKET`) and
//! checks that `READY=1` comes once `lbd` answers, `WATCHDOG=1` comes on
//! every tick when `WATCHDOG_USEC` asks for it, and `STOPPING=1` comes
//! when SIGTERM begins the stop; and that `log_format: json` writes one
//! JSON object per line.
//!
//! Needs root (namespaces, XDP).

use std::{
    os::unix::net::UnixDatagram,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{Lbd, Rig},
    scenario::{check, serial},
};

/// The next notification, within `limit`.
fn next(sock: &UnixDatagram, limit: Duration) -> Result<String> {
    sock.set_read_timeout(Some(limit))?;
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).context("no notification")?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn lbd_speaks_sd_notify_and_logs_json_lines() {
    let _serial = serial();
    check((|| {
        let rig = Rig::new(2)?;
        let config = rig.dir.join("lbd.yaml");
        let text = rig.config(&[Some(1), Some(1)]);
        std::fs::write(&config, format!("{text}log_format: json\n"))?;
        let path = rig.dir.join("notify.sock");
        let manager = UnixDatagram::bind(&path)?;
        let env = [
            ("NOTIFY_SOCKET", path.display().to_string()),
            ("WATCHDOG_USEC", "2000000".to_string()),
        ];
        let started = Instant::now();
        let lbd = Lbd::start_with_env(&rig.lb, &rig.dir, &config, &env)?;
        let ready = next(&manager, Duration::from_secs(10))?;
        let ready_after = started.elapsed();
        if !ready.lines().any(|l| l == "READY=1") {
            bail!("first notification: {ready:?}");
        }
        lbd.lbctl(&["status"])
            .context("lbctl status right after READY=1")?;
        let mut pings = 0;
        let watch = Instant::now();
        while watch.elapsed() < Duration::from_millis(3500) {
            let msg = next(&manager, Duration::from_secs(3))?;
            if msg.lines().any(|l| l == "WATCHDOG=1") {
                pings += 1;
            }
        }
        if pings < 2 {
            bail!("{pings} WATCHDOG=1 in 3.5 s (one per tick expected)");
        }
        lbd.signal(libc::SIGTERM)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let msg = next(&manager, Duration::from_secs(5))?;
            if msg.lines().any(|l| l == "STOPPING=1") {
                break;
            }
            if Instant::now() > deadline {
                bail!("no STOPPING=1 within 5 s of SIGTERM");
            }
        }
        let log = lbd.log_text();
        let mut objects = 0;
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("a log line is not JSON: {line}"))?;
            if v["level"].is_null() || v["fields"]["message"].is_null() {
                bail!("a log object without level or message: {line}");
            }
            objects += 1;
        }
        if objects < 3 || !log.contains("lbd ready") {
            bail!("{objects} JSON log lines:\n{log}");
        }
        eprintln!(
            "READY=1 {ready_after:?} after start, {pings} watchdog pings in 3.5 s, STOPPING=1 on SIGTERM; {objects} JSON log lines"
        );
        Ok(())
    })());
}

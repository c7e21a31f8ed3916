//! Prometheus metrics with real parts: `lbd` serves them in the rig's
//! balancer namespace, a real Prometheus (Debian's package) started by the
//! test scrapes it every second with the shipped alert rules loaded, and
//! the test asks Prometheus's HTTP API — never `lbd` — what it saw: the
//! datagrams it sent to a VIP, a backend it killed shown down. A scrape
//! taken by the test passes `promtool check metrics`, and the shipped
//! rules pass `promtool test rules`.
//!
//! Needs root (namespaces, XDP) and the prometheus package (`cargo xtask
//! setup` installs it).

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddrV4, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, Rig},
    scenario::{check, serial},
    traffic::tcp_request,
};

/// Probes on the TCP VIP: a dead backend is down within ~1.3 s.
const CHECK: &str = "    health_check:\n      interval: 300ms\n      timeout: 250ms\n      rise: 2\n      fall: 3\n";
const METRICS: &str = "127.0.0.1:9469";
const PROMETHEUS: &str = "127.0.0.1:19090";

/// The repository's `config/prometheus/`.
fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("config/prometheus")
}

/// A Prometheus server in a namespace, killed (and its data removed with
/// the rig's directory) when dropped.
struct Prometheus(Child);

impl Prometheus {
    fn start(rig: &Rig) -> Result<Prometheus> {
        let dir = rig.dir.join("prometheus");
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(rules_dir().join("lb.rules.yml"), dir.join("lb.rules.yml"))?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [lb.rules.yml]\nscrape_configs:\n  - job_name: lb\n    static_configs: [{{targets: ['{METRICS}']}}]\n"
            ),
        )?;
        let child = rig
            .lb
            .command("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={PROMETHEUS}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log"))?)
            .spawn()
            .context("starting prometheus (cargo xtask setup installs it)")?;
        Ok(Prometheus(child))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` from `addr`, inside `rig`'s balancer namespace: the body.
fn get(rig: &Rig, addr: &'static str, path: String) -> Result<String> {
    rig.lb.within(move || -> Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let (head, body) = text.split_once("\r\n\r\n").context("no HTTP head")?;
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            bail!("GET {path}: {head}");
        }
        Ok(body.to_string())
    })?
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of PromQL `query` per Prometheus (one series), if any.
fn query(rig: &Rig, q: &str) -> Result<Option<f64>> {
    let body = get(
        rig,
        PROMETHEUS,
        format!("/api/v1/query?query={}", encode(q)),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let result = &v["data"]["result"];
    match result.as_array().map(Vec::as_slice) {
        Some([one]) => Ok(one["value"][1].as_str().and_then(|s| s.parse().ok())),
        Some([]) | None => Ok(None),
        Some(many) => bail!("{q}: {} series", many.len()),
    }
}

/// Polls `q` until `want` holds for its value, or `limit`.
fn wait_value(rig: &Rig, q: &str, limit: Duration, want: impl Fn(f64) -> bool) -> Result<f64> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        last = query(rig, q)?;
        if let Some(v) = last
            && want(v)
        {
            return Ok(v);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("Prometheus: {q} = {last:?} after {limit:?}")
}

/// Sends exactly `n` UDP datagrams to `vip`, one per source port. The
/// sockets are returned open: a reply to a closed port would make the
/// client answer the VIP with ICMP port unreachable, which the balancer
/// forwards (and counts) as an error about the flow.
fn send_datagrams(rig: &Rig, vip: SocketAddrV4, n: u16) -> Result<Vec<UdpSocket>> {
    rig.client.within(move || -> Result<Vec<UdpSocket>> {
        (30_000..30_000 + n)
            .map(|port| {
                let s = UdpSocket::bind((CLIENT, port))?;
                s.send_to(b"counted", vip)?;
                Ok(s)
            })
            .collect()
    })?
}

#[test]
fn prometheus_scrapes_what_was_sent_and_a_dead_backend() {
    let _serial = serial();
    check((|| {
        let mut rig = Rig::new(3)?;
        let config = rig.dir.join("lbd.yaml");
        let text = rig.config_with(&[Some(1), Some(1), Some(1)], CHECK);
        std::fs::write(&config, format!("{text}metrics:\n  listen: {METRICS}\n"))?;
        let lbd = Lbd::start(&rig, &config)?;
        let _prometheus = Prometheus::start(&rig)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(&rig, PROMETHEUS, "/-/ready".into()).is_err() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(rig.dir.join("prometheus/log"))?;
                bail!("Prometheus not ready after 30 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }

        let scrape = get(&rig, METRICS, "/metrics".into())?;
        let lint = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin
                    .take()
                    .expect("stdin")
                    .write_all(scrape.as_bytes())?;
                c.wait_with_output()
            })?;
        if !lint.status.success() || scrape.lines().count() < 50 {
            bail!(
                "promtool check metrics on a scrape ({} lines): {}{}",
                scrape.lines().count(),
                String::from_utf8_lossy(&lint.stdout),
                String::from_utf8_lossy(&lint.stderr)
            );
        }

        let udp = format!("{}/udp", rig.udp_vip());
        let series = format!("lb_vip_packets_total{{vip=\"{udp}\"}}");
        wait_value(&rig, &series, Duration::from_secs(30), |v| v == 0.0)?;
        let _open = send_datagrams(&rig, rig.udp_vip(), 37)?;
        let seen = wait_value(&rig, &series, Duration::from_secs(15), |v| v >= 37.0)?;
        std::thread::sleep(Duration::from_secs(2));
        let settled = query(&rig, &series)?;
        if seen != 37.0 || settled != Some(37.0) {
            bail!("sent 37 datagrams to {udp}; Prometheus saw {seen}, then {settled:?}");
        }

        // Eleven connections: eleven first SYNs over the backends, and no
        // retransmission (every backend answers).
        let tcp = format!("{}/tcp", rig.tcp_vip());
        let vip = rig.tcp_vip();
        rig.client.within(move || -> Result<()> {
            for sport in 31_000..31_011 {
                tcp_request(CLIENT, sport, vip)?;
            }
            Ok(())
        })??;
        let syns = format!("sum(lb_backend_syns_total{{vip=\"{tcp}\"}})");
        let seen_syns = wait_value(&rig, &syns, Duration::from_secs(15), |v| v >= 11.0)?;
        let retried = format!("sum(lb_backend_syn_retransmits_total{{vip=\"{tcp}\"}})");
        let retransmits = query(&rig, &retried)?;
        if seen_syns != 11.0 || retransmits != Some(0.0) {
            bail!("11 connections: Prometheus saw {seen_syns} SYNs, {retransmits:?} retransmitted");
        }

        let be2 = rig.backend("be2").addr.to_string();
        let down = format!("lb_backend_state{{vip=\"{tcp}\",backend=\"{be2}\",state=\"down\"}}");
        wait_value(&rig, &down, Duration::from_secs(10), |v| v == 0.0)?;
        rig.stop_server("be2");
        wait_value(&rig, &down, Duration::from_secs(20), |v| v == 1.0)?;
        let active = query(&rig, "count(lb_backend_state{state=\"active\"} == 1)")?;
        eprintln!(
            "Prometheus saw {seen} of 37 datagrams to {udp}, be2 down; active backends now {active:?}\n--- scrape excerpt ---\n{}",
            scrape
                .lines()
                .filter(|l| l.contains("lb_vip_") || l.contains("lb_build_info"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        drop(lbd);
        Ok(())
    })());
}

#[test]
fn the_shipped_alert_rules_pass_their_promtool_tests() {
    let dir = rules_dir();
    for args in [
        &["check", "rules", "lb.rules.yml"][..],
        &["test", "rules", "lb.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .context("running promtool (cargo xtask setup installs it)")
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

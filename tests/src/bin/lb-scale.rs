//! `lb-scale` (run by `cargo xtask bench`, as root): the control plane at
//! scale (issue 19). The real `lbd` in a network namespace, real maps, for
//! 1,000 VIPs × 65 backends and 4,000 × 10, each with a table size of its
//! own (the smallest prime ≥ 100·N) and with the default M = 65537:
//! start-up to ready (sd_notify `READY=1`), a restart that adopts the
//! pins, a full reload (every VIP's backends changed), a reload of the
//! same file and of a file changed only in a comment, one backend added
//! and removed with `lbctl`, the maps' kernel memory (fdinfo `memlock`),
//! `lbd`'s resident memory and its CPU when idle. Prints a markdown
//! section; fails only on a broken measurement, never on a timing.
//!
//! With `LB_SCALE_BASELINE=DIR` (a directory holding another build's
//! `lbd` and `lbctl`, e.g. the one `cargo xtask bench --baseline REV`
//! builds), the default-M scenarios also run on that build, in the same
//! run, for before/after ratios. `LB_SCALE_ONLY=1000,4000` picks
//! scenarios by VIP count.
//!
//! 1,000 × 100 is not among them: its 100,000 backend entries are beyond
//! the 65,536 that a backend handle's 16-bit index addresses (`lbd
//! check` refuses the file, naming `max_backends`); 65 is the most
//! backends 1,000 VIPs can have.

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    netns::{Netns, unique, veth},
    rig::{bin_path, require_root},
    stat::Stat,
};

/// Reloads and backend changes measured per figure (the median is shown).
const RUNS: usize = 3;
/// Seconds of idle CPU sampled.
const IDLE_SECS: u64 = 5;

#[derive(Clone, Copy)]
struct Scenario {
    vips: u32,
    backends: u32,
    /// The VIPs' own table size; `None`: the default, 65537.
    m: Option<u32>,
}

impl Scenario {
    fn name(&self) -> String {
        let m = self
            .m
            .map_or("65537 (default)".into(), |m| format!("{m} (own)"));
        format!("{} × {}, M = {m}", self.vips, self.backends)
    }

    /// A pool for the own-size case: the tables and a quarter more.
    fn pool_mib(&self) -> Option<u32> {
        let m = self.m?;
        let bytes = self.vips as u64 * 2 * m.div_ceil(1024) as u64 * 4096;
        Some((bytes * 5 / 4).div_ceil(1 << 20) as u32)
    }
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        vips: 1000,
        backends: 65,
        m: Some(6521),
    },
    Scenario {
        vips: 1000,
        backends: 65,
        m: None,
    },
    Scenario {
        vips: 4000,
        backends: 10,
        m: Some(1009),
    },
    Scenario {
        vips: 4000,
        backends: 10,
        m: None,
    },
];

/// A build of `lbd` and `lbctl` to measure.
struct Build {
    label: String,
    lbd: PathBuf,
    lbctl: PathBuf,
}

impl Build {
    /// The build in `dir`, named `label` or else by `lbd --version`.
    fn from_dir(dir: &Path, label: Option<String>) -> Result<Build> {
        let lbd = dir.join("lbd");
        let label = match label {
            Some(l) => l,
            None => {
                let out = Command::new(&lbd)
                    .arg("--version")
                    .output()
                    .with_context(|| format!("{} --version", lbd.display()))?;
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            }
        };
        Ok(Build {
            label,
            lbctl: dir.join("lbctl"),
            lbd,
        })
    }
}

/// What one run of one scenario on one build measured.
#[derive(Default)]
struct Figures {
    startup: f64,
    restart: f64,
    full: Stat,
    unchanged: Stat,
    touched: Stat,
    add: Stat,
    del: Stat,
    /// Table updates logged by the touched reloads (must be none).
    touched_writes: usize,
    tables_bytes: u64,
    maps_bytes: u64,
    rss_start_kib: u64,
    rss_end_kib: u64,
    hwm_kib: u64,
    idle_cpu: f64,
}

/// The balancer's namespace (with a veth), its scratch directory and its
/// pins, all removed when dropped (also on failure).
struct Site {
    ns: Netns,
    _peer: Netns,
    dir: PathBuf,
    instance: String,
}

impl Site {
    fn new() -> Result<Site> {
        let ns = Netns::new(&unique("lbscale"))?;
        let peer = Netns::new(&unique("lbscalep"))?;
        veth(&ns, "eth0", &peer, "eth0", 1500)?;
        ns.ip(&["addr", "add", "10.250.0.1/24", "dev", "eth0"])?;
        let dir = std::env::temp_dir().join(unique("lbscaledir"));
        std::fs::create_dir_all(&dir)?;
        Ok(Site {
            ns,
            _peer: peer,
            dir,
            instance: unique("scale"),
        })
    }

    fn pins(&self) -> PathBuf {
        Path::new("/sys/fs/bpf/lb").join(&self.instance)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("lbd.sock")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("lbd.yaml")
    }

    /// The file of `s`; `shift` moves every VIP's backends by one address
    /// (one leaves, one joins: every table changes).
    fn write_config(&self, s: &Scenario, shift: u32, comment: &str) -> Result<()> {
        let mut y = format!(
            "instance: {}\ninterfaces: [eth0]\nxdp_mode: native\ngateway_mac: \"02:00:00:00:00:01\"\nouter_source_v4: 10.250.0.1\ntable_size: 65537\nconntrack_buckets: 65536\nmax_vips: {}\nmax_backends: 65536\napi_socket: {}\nstate_file: {}\n",
            self.instance,
            s.vips,
            self.socket().display(),
            self.dir.join("state.json").display()
        );
        if let Some(mib) = s.pool_mib() {
            y.push_str(&format!("table_pool_mib: {mib}\n"));
        }
        y.push_str("vips:\n");
        for v in 0..s.vips {
            y.push_str(&format!(
                "  - address: 10.200.{}.{}\n    port: 80\n    protocol: tcp\n",
                v >> 8,
                v & 255
            ));
            if let Some(m) = s.m {
                y.push_str(&format!("    table_size: {m}\n"));
            }
            y.push_str("    backends:\n");
            for b in 0..s.backends {
                let i = v * s.backends + b + shift;
                y.push_str(&format!(
                    "      - address: 10.{}.{}.{}\n",
                    64 + (i >> 16),
                    (i >> 8) & 255,
                    i & 255
                ));
            }
        }
        y.push_str(comment);
        Ok(std::fs::write(self.config(), y)?)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.pins());
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb"));
        let _ = std::fs::remove_dir_all(&self.dir);
        // The namespaces (and the veth, and with it the attachment) go
        // with the fields.
    }
}

/// A running `lbd`, killed when dropped.
struct Running {
    child: Child,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `build`'s `lbd` at `site` and waits for its `READY=1`; returns
/// it and the seconds from the spawn to the notification.
fn start(site: &Site, build: &Build) -> Result<(Running, f64)> {
    let notify = site.dir.join("notify.sock");
    let _ = std::fs::remove_file(&notify);
    let sock = UnixDatagram::bind(&notify)?;
    sock.set_read_timeout(Some(Duration::from_secs(300)))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(site.dir.join("lbd.log"))?;
    let started = Instant::now();
    let child = site
        .ns
        .command(&build.lbd)
        .arg("--config")
        .arg(site.config())
        .env("NOTIFY_SOCKET", &notify)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting lbd")?;
    let running = Running { child };
    let mut buf = [0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).with_context(|| {
            format!("no READY=1 from lbd:\n{}", tail(&site.dir.join("lbd.log")))
        })?;
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            return Ok((running, started.elapsed().as_secs_f64()));
        }
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Runs `lbctl ARGS` against `site`'s `lbd`; the seconds it took.
fn lbctl(site: &Site, build: &Build, args: &[&str]) -> Result<f64> {
    let started = Instant::now();
    let out = Command::new(&build.lbctl)
        .arg("--socket")
        .arg(site.socket())
        .args(args)
        .output()?;
    let took = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "lbctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(took)
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} of {pid}"))
}

/// Kernel memory of the maps `pid` holds (fdinfo `memlock`): the table
/// pool (the map of 4,096-byte values) and all of them.
fn map_bytes(pid: u32) -> Result<(u64, u64)> {
    let (mut tables, mut all) = (0, 0);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
        let (Some(memlock), Some(value)) = (field("memlock:"), field("value_size:")) else {
            continue;
        };
        let bytes: u64 = memlock.parse().unwrap_or(0);
        all += bytes;
        if value == "4096" {
            tables += bytes;
        }
    }
    Ok((tables, all))
}

/// `pid`'s CPU time over `secs` idle seconds, in % of one core.
fn idle_cpu(pid: u32, secs: u64) -> Result<f64> {
    let ticks = || -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let after = stat.rsplit_once(')').context("stat")?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
    };
    let before = ticks()?;
    std::thread::sleep(Duration::from_secs(secs));
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks()? - before) as f64 / hz / secs as f64 * 100.0)
}

fn log_count(site: &Site, what: &str) -> usize {
    let text = std::fs::read_to_string(site.dir.join("lbd.log")).unwrap_or_default();
    text.lines().filter(|l| l.contains(what)).count()
}

/// One scenario on one build, from fresh maps to the last change.
fn measure(build: &Build, s: &Scenario) -> Result<Figures> {
    let site = Site::new()?;
    site.write_config(s, 0, "")?;
    let mut f = Figures::default();
    let (lbd, secs) = start(&site, build)?;
    f.startup = secs;
    f.rss_start_kib = status_kib(lbd.pid(), "VmRSS:")?;
    (f.tables_bytes, f.maps_bytes) = map_bytes(lbd.pid())?;
    // kill -9 and a restart that adopts the pinned maps.
    drop(lbd);
    let (lbd, secs) = start(&site, build)?;
    f.restart = secs;
    let mut full = Vec::new();
    for run in 0..RUNS as u32 {
        site.write_config(s, 1 - run % 2, "")?;
        full.push(lbctl(&site, build, &["reload"])?);
    }
    f.full = Stat::of(full);
    let same: Vec<f64> = (0..RUNS)
        .map(|_| lbctl(&site, build, &["reload"]))
        .collect::<Result<_>>()?;
    f.unchanged = Stat::of(same);
    let writes = log_count(&site, "dataplane updated");
    let mut touched = Vec::new();
    let running_shift = 1 - (RUNS as u32 - 1) % 2;
    for run in 0..RUNS {
        site.write_config(s, running_shift, &format!("# touched {run}\n"))?;
        touched.push(lbctl(&site, build, &["reload"])?);
    }
    f.touched = Stat::of(touched);
    f.touched_writes = log_count(&site, "dataplane updated") - writes;
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let vip = format!("10.200.0.{}:80/tcp", run + 1);
        let addr = format!("10.99.99.{}", run + 1);
        add.push(lbctl(&site, build, &["backend", "add", &vip, &addr])?);
        del.push(lbctl(&site, build, &["backend", "del", &vip, &addr])?);
    }
    (f.add, f.del) = (Stat::of(add), Stat::of(del));
    f.idle_cpu = idle_cpu(lbd.pid(), IDLE_SECS)?;
    f.rss_end_kib = status_kib(lbd.pid(), "VmRSS:")?;
    f.hwm_kib = status_kib(lbd.pid(), "VmHWM:")?;
    Ok(f)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn row(s: &Scenario, build: &str, f: &Figures) -> String {
    format!(
        "| {} | {build} | {:.2} | {:.2} | {} | {} | {} ({}) | {} / {} | {} | {} | {} / {} / {} | {:.0} |",
        s.name(),
        f.startup,
        f.restart,
        f.full.cell(),
        f.unchanged.cell(),
        f.touched.cell(),
        if f.touched_writes == 0 {
            "no writes".to_string()
        } else {
            format!("{} writes", f.touched_writes)
        },
        f.add.cell(),
        f.del.cell(),
        mib(f.tables_bytes),
        mib(f.maps_bytes),
        f.rss_start_kib / 1024,
        f.rss_end_kib / 1024,
        f.hwm_kib / 1024,
        f.idle_cpu
    )
}

/// A TCP listener on port 80 in `ns` that holds every connection for a
/// second (a connect probe waits 100 ms for a close: one held shorter
/// would fail it); stopped when dropped.
struct HoldingListener {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl HoldingListener {
    fn start(ns: &Netns) -> Result<HoldingListener> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = ns.spawn(move || {
            let l = match std::net::TcpListener::bind(("0.0.0.0", 80)).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            }) {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    return;
                }
            };
            let mut held = std::collections::VecDeque::new();
            while !flag.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => held.push_back((Instant::now(), c)),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
                while held
                    .front()
                    .is_some_and(|(t, _)| t.elapsed() > Duration::from_secs(1))
                {
                    held.pop_front();
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .context("the listener did not start")??;
        Ok(HoldingListener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HoldingListener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the health scenario measured: seconds from the listener up to
/// every VIP announced and from the listener down to every VIP
/// withdrawn, `lbctl status` latency while that went on, and `lbd`'s CPU.
struct Convergence {
    up: f64,
    down: f64,
    status: Stat,
    cpu: f64,
}

/// The file of the health scenario: `vips` VIPs of one backend each
/// (their own address), a TCP check every second (rise 1, fall 2), an
/// ExaBGP announcer so that the announcement policy runs.
fn write_probed_config(site: &Site, vips: u32) -> Result<()> {
    // Two 4 KiB chunks per VIP of 101 slots, and a quarter more.
    let pool = (u64::from(vips) * 8192 * 5 / 4).div_ceil(1 << 20);
    let mut y = format!(
        "instance: {}\ninterfaces: [eth0]\nxdp_mode: native\ngateway_mac: \"02:00:00:00:00:01\"\nouter_source_v4: 10.250.0.1\ntable_size: 65537\nconntrack_buckets: 65536\nmax_vips: {vips}\nmax_backends: 65536\ntable_pool_mib: {pool}\napi_socket: {}\nstate_file: {}\nannounce:\n  exabgp: {{}}\nvips:\n",
        site.instance,
        site.socket().display(),
        site.dir.join("state.json").display()
    );
    for v in 0..vips {
        y.push_str(&format!(
            "  - address: 10.200.{}.{}\n    port: 80\n    protocol: tcp\n    table_size: 101\n    passive_health: {{ enabled: false }}\n    panic_threshold: 0\n    health_check: {{ interval: 1s, timeout: 500ms, rise: 1, fall: 2 }}\n    backends:\n      - address: 10.251.{}.{}\n",
            v >> 8,
            v & 255,
            v >> 8,
            v & 255
        ));
    }
    Ok(std::fs::write(site.config(), y)?)
}

/// How many VIPs `lbctl bgp` says are announced, and how long `lbctl
/// status` took just before.
fn announced(site: &Site, build: &Build) -> Result<(usize, f64)> {
    let status = lbctl(site, build, &["status"])?;
    let out = Command::new(&build.lbctl)
        .arg("--socket")
        .arg(site.socket())
        .args(["-o", "json", "bgp"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("lbctl bgp: {}", String::from_utf8_lossy(&out.stderr)))?;
    let n = v["vips"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|v| v["announced"] == true).count());
    Ok((n, status))
}

/// Polls until `want(announced)` holds; the seconds it took.
fn converge(
    site: &Site,
    build: &Build,
    statuses: &mut Vec<f64>,
    want: impl Fn(usize) -> bool,
) -> Result<f64> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        let (n, status) = announced(site, build)?;
        if started.elapsed().as_secs().is_multiple_of(10) {
            eprintln!(
                "lb-scale: {n} announced after {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        statuses.push(status);
        if want(n) {
            return Ok(started.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "no convergence within 600 s:\n{}",
        tail(&site.dir.join("lbd.log"))
    )
}

/// `vips` health-checked VIPs whose backends come up together, then go
/// down together.
fn measure_probed(build: &Build, vips: u32) -> Result<Convergence> {
    let site = Site::new()?;
    site.ns
        .ip(&["route", "add", "10.251.0.0/16", "via", "10.250.0.2"])?;
    site._peer
        .ip(&["addr", "add", "10.250.0.2/24", "dev", "eth0"])?;
    site._peer
        .ip(&["route", "add", "local", "10.251.0.0/16", "dev", "lo"])?;
    write_probed_config(&site, vips)?;
    let (lbd, _) = start(&site, build)?;
    // Every backend is down at start: its first probes fail.
    let mut statuses = Vec::new();
    converge(&site, build, &mut statuses, |n| n == 0)?;
    std::thread::sleep(Duration::from_secs(3));
    let cpu_before = cpu_ticks(lbd.pid())?;
    let listener = HoldingListener::start(&site._peer)?;
    let up = converge(&site, build, &mut statuses, |n| n == vips as usize)?;
    drop(listener);
    let down = converge(&site, build, &mut statuses, |n| n == 0)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (cpu_ticks(lbd.pid())? - cpu_before) as f64 / hz / (up + down) * 100.0;
    Ok(Convergence {
        up,
        down,
        status: Stat::of(statuses),
        cpu,
    })
}

fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// The health scenarios' section.
fn probed_report(this: &Build, baseline: Option<&Build>) -> Result<String> {
    let mut out = String::from(
        "\n### Health-checked VIPs converging\n\nN VIPs of one backend each (N backends), a TCP check every 1 s (timeout 500 ms, rise 1, fall 2), every backend down at start; then one listener answers for all of them (up), then it stops (down). Seconds from the listener's start to every VIP announced (`lbctl bgp`, polled every 100 ms) and from its stop to every VIP withdrawn; the bound the checks set is one interval for up (rise 1: the next probe) and two intervals plus a timeout for down (fall 2). `lbctl status` latency while it converged: median (min–max). CPU: `lbd`'s, % of one core, over both.\n\n| VIPs | build | up s | down s | `lbctl status` s | CPU % |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for vips in [1000, 4000] {
        if !std::env::var("LB_SCALE_ONLY").map_or(true, |v| {
            v.split(',')
                .any(|p| p.trim() == format!("probes{vips}") || p.trim() == "probes")
        }) {
            continue;
        }
        let builds: Vec<(&str, &Build)> = baseline
            .map(|b| ("baseline", b))
            .into_iter()
            .chain([("this", this)])
            .collect();
        for (name, build) in builds {
            eprintln!("lb-scale: {vips} health-checked VIPs ({name})");
            let c = measure_probed(build, vips)?;
            out.push_str(&format!(
                "| {vips} | {name} | {:.2} | {:.2} | {} | {:.0} |\n",
                c.up,
                c.down,
                c.status.cell(),
                c.cpu
            ));
        }
    }
    Ok(out)
}

fn wanted(s: &Scenario) -> bool {
    std::env::var("LB_SCALE_ONLY").map_or(true, |v| {
        v.split(',').any(|p| p.trim() == s.vips.to_string())
    })
}

/// `after ÷ before` of the figures that a ratio says something about.
fn ratios(before: &Figures, after: &Figures) -> String {
    let r = |a: f64, b: f64| format!("{:.2}", a / b);
    format!(
        "start-up {}, full reload {}, touched reload {}, backend add {}, table memory {}, RSS at start {}",
        r(after.startup, before.startup),
        r(after.full.median, before.full.median),
        r(after.touched.median, before.touched.median),
        r(after.add.median, before.add.median),
        r(after.tables_bytes as f64, before.tables_bytes as f64),
        r(after.rss_start_kib as f64, before.rss_start_kib as f64),
    )
}

fn main() -> Result<()> {
    require_root()?;
    let this = Build::from_dir(
        bin_path("lbd")?.parent().context("the directory of lbd")?,
        None,
    )?;
    let baseline = match std::env::var_os("LB_SCALE_BASELINE") {
        Some(dir) => Some(Build::from_dir(
            Path::new(&dir),
            std::env::var("LB_SCALE_BASELINE_LABEL").ok(),
        )?),
        None => None,
    };
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for pair in SCENARIOS.chunks(2) {
        let (own, default) = (&pair[0], &pair[1]);
        if !wanted(own) {
            continue;
        }
        eprintln!("lb-scale: {} and {}", own.name(), default.name());
        let base = match &baseline {
            Some(b) => Some(measure(b, default)?),
            None => None,
        };
        let fixed = measure(&this, default)?;
        let sized = measure(&this, own)?;
        if let Some(base) = &base {
            rows.push(row(default, "baseline", base));
            notes.push(format!(
                "- {} × {}: this build with M = 65537 ÷ the baseline: {}; with M = {} ÷ the baseline: {}.",
                own.vips,
                own.backends,
                ratios(base, &fixed),
                own.m.unwrap_or_default(),
                ratios(base, &sized)
            ));
        }
        rows.push(row(default, "this", &fixed));
        rows.push(row(own, "this", &sized));
    }
    print!("{}", report(&this, baseline.as_ref(), &rows, &notes));
    print!("{}", probed_report(&this, baseline.as_ref())?);
    Ok(())
}

fn report(this: &Build, baseline: Option<&Build>, rows: &[String], notes: &[String]) -> String {
    let mut out = String::from("## Control plane at scale (`lb-scale`)\n\n");
    out.push_str(&format!(
        "The real `lbd` in a network namespace (native XDP on a veth), real maps, a 65,536-bucket connection table. \"this\": {}.{} Seconds, median (min–max) of {RUNS} runs: a full reload changes every VIP's backends (one leaves, one joins); \"same file\" reloads the file unchanged; \"touched\" reloads it with only a comment changed (the table updates it logged are counted); backend add/del are `lbctl backend add|del` on one VIP, each a new revision. Start-up is from the spawn to sd_notify `READY=1` with fresh maps; restart is the same after a `kill -9`, adopting the pins. Memory: `LB_TABLES` and all maps as the kernel charges them (fdinfo `memlock`), and `lbd`'s resident set (MiB: after start / after the changes / peak). Idle CPU: `lbd`'s user and system time over {IDLE_SECS} s without requests, % of one core. 1,000 × 100 cannot be configured: 100,000 backend entries are beyond the 65,536 a backend handle's 16-bit index addresses; 65 is the most that fits.\n\n",
        this.label,
        baseline.map_or(String::new(), |b| format!(" \"baseline\": {} (it has no per-VIP table size: only the default-M rows).", b.label))
    ));
    out.push_str("| scenario | build | start-up s | restart s | full reload s | same file s | touched s | backend add / del s | LB_TABLES MiB | all maps MiB | RSS MiB | idle CPU % |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in rows {
        out.push_str(r);
        out.push('\n');
    }
    if !notes.is_empty() {
        out.push_str(
            "\nRatios within this run (after ÷ before; below 1 is faster or smaller):\n\n",
        );
        for n in notes {
            out.push_str(n);
            out.push('\n');
        }
    }
    out
}

//! Health checks: one probe ([`probe`]), the rise/fall verdict over a run of
//! probes ([`Tracker`]), and the task that probes one target on a jittered
//! interval ([`spawn_prober`]).
//!
//! A probe is a TCP connect, optionally followed by a send/expect exchange
//! (like HAProxy's `tcp-check`) or an HTTP `GET`. A plain connect probe also
//! fails a backend that accepts and closes at once: it waits a moment after
//! connecting, and an immediate EOF or reset is a failure (a listener whose
//! application is gone is not a healthy backend).
//!
//! What the verdicts do to the dataplane is [`crate::lifecycle`]'s business.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream},
    sync::mpsc,
    task::JoinHandle,
};

use crate::config::{HealthCheck, health::unescape};

/// How long a connect probe waits after the handshake for the backend to
/// close on us (at most; never longer than the timeout leaves).
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// Largest reply read for send/expect and HTTP probes.
const MAX_REPLY: usize = crate::config::health::MAX_PROBE_BYTES;

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    pub ok: bool,
    /// From the start of the connect to the verdict, in microseconds; for
    /// a passed connect check, to the handshake (not the short wait after
    /// it for a backend that closes at once).
    pub latency_us: u64,
    /// What was seen: `connected`, `HTTP 200`, or why it failed.
    pub detail: String,
}

/// Where and how to probe one backend.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProbeTarget {
    pub addr: SocketAddr,
    /// `SO_MARK` for the probe's socket (probes through the tunnel).
    pub mark: Option<u32>,
}

/// How a probe that failed on this box, not at the backend, begins its
/// detail: no socket (descriptors or memory used up), no mark (no
/// `CAP_NET_ADMIN`), no local port or address. It says nothing about the
/// backend, so the rise/fall count skips it ([`Tracker::record`]).
pub const COULD_NOT_RUN: &str = "probe could not run here: ";

/// Says, at most once a minute for the whole process, that probes could
/// not run: their results judge nothing, so a backend that dies
/// meanwhile stays in the table (helper-35: only `lbctl health` showed it).
fn warn_could_not_run(detail: &str) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *last = Some(Instant::now());
        tracing::warn!(
            "health probes cannot run on this box ({detail}): until they can, no verdict changes, and a backend that dies meanwhile stays in its tables"
        );
    }
}

impl ProbeResult {
    /// The probe failed on this box ([`COULD_NOT_RUN`]).
    pub fn could_not_run(&self) -> bool {
        !self.ok && self.detail.starts_with(COULD_NOT_RUN)
    }
}

async fn connect(target: &ProbeTarget) -> Result<TcpStream, String> {
    let here = |e: std::io::Error| format!("{COULD_NOT_RUN}{e}");
    let domain = if target.addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(here)?;
    if let Some(mark) = target.mark {
        s.set_mark(mark).map_err(here)?;
    }
    s.set_nonblocking(true).map_err(here)?;
    let socket = TcpSocket::from_std_stream(s.into());
    socket.connect(target.addr).await.map_err(|e| {
        // No local port or address to connect from: this box's lack.
        if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) {
            here(e)
        } else {
            format!("connect: {e}")
        }
    })
}

/// Reads until `want` bytes, EOF or `MAX_REPLY`.
async fn read_at_least(stream: &mut TcpStream, want: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while buf.len() < want.min(MAX_REPLY) {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(buf)
}

async fn exchange(
    check: &HealthCheck,
    target: &ProbeTarget,
    deadline: tokio::time::Instant,
    connected: &std::sync::OnceLock<Instant>,
) -> Result<String, String> {
    let mut stream = connect(target).await?;
    if let Some(http) = &check.http {
        let host = http
            .host
            .clone()
            .unwrap_or_else(|| target.addr.ip().to_string());
        let request = format!(
            "GET {} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: lb-health\r\nConnection: close\r\n\r\n",
            http.path
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let reply = read_at_least(&mut stream, 12)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let line = String::from_utf8_lossy(&reply);
        let line = line.lines().next().unwrap_or_default();
        let status: Option<u16> = line
            .strip_prefix("HTTP/")
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|code| code.parse().ok());
        return match status {
            Some(code) if code == http.status => Ok(format!("HTTP {code}")),
            Some(code) => Err(format!("HTTP {code}, expected {}", http.status)),
            None if reply.is_empty() => Err("closed without an HTTP answer".into()),
            None => Err(format!("not an HTTP answer: {line:?}")),
        };
    }
    if check.send.is_some() || check.expect.is_some() {
        if let Some(send) = &check.send {
            stream
                .write_all(&unescape(send))
                .await
                .map_err(|e| format!("send: {e}"))?;
        }
        let Some(expect) = &check.expect else {
            return Ok("sent".into());
        };
        let expect = unescape(expect);
        let reply = read_at_least(&mut stream, expect.len())
            .await
            .map_err(|e| format!("read: {e}"))?;
        return if reply.starts_with(&expect) {
            Ok("expected reply".into())
        } else if reply.is_empty() {
            Err("closed without answering".into())
        } else {
            Err(format!(
                "unexpected reply {:?}",
                String::from_utf8_lossy(&reply[..reply.len().min(40)])
            ))
        };
    }
    // Connect check: the handshake worked; a listener that closes at once
    // is not healthy. The wait for that says nothing of the backend's
    // speed: its latency is the handshake's ([`probe`]).
    let _ = connected.set(Instant::now());
    let grace =
        CLOSE_GRACE.min(deadline.saturating_duration_since(tokio::time::Instant::now()) / 2);
    let mut byte = [0u8; 1];
    match tokio::time::timeout(grace, stream.peek(&mut byte)).await {
        Err(_) => Ok("connected".into()),
        Ok(Ok(0)) => Err("closed by the backend right after accepting".into()),
        Ok(Ok(_)) => Ok("connected".into()),
        Ok(Err(e)) => Err(format!("reset right after accepting: {e}")),
    }
}

/// Probes `target` once, within `check.timeout`.
pub async fn probe(check: &HealthCheck, target: &ProbeTarget) -> ProbeResult {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + check.timeout;
    let connected = std::sync::OnceLock::new();
    let outcome =
        tokio::time::timeout_at(deadline, exchange(check, target, deadline, &connected)).await;
    let (ok, detail) = match outcome {
        Err(_) => (false, format!("timed out after {:?}", check.timeout)),
        Ok(Ok(d)) => (true, d),
        Ok(Err(e)) => (false, e),
    };
    // A passed connect check: up to the handshake, not the wait after it.
    let end = connected
        .get()
        .copied()
        .filter(|_| ok)
        .unwrap_or_else(Instant::now);
    let latency_us = end.saturating_duration_since(start).as_micros() as u64;
    let result = ProbeResult {
        ok,
        latency_us,
        detail,
    };
    if result.could_not_run() {
        warn_could_not_run(&result.detail);
    }
    result
}

/// Rise/fall over consecutive probe results.
#[derive(Clone, Debug)]
pub struct Tracker {
    rise: u32,
    fall: u32,
    up: bool,
    /// Consecutive results that disagree with `up`.
    streak: u32,
    /// The probes have confirmed `up`: one agreed with it, or a streak
    /// turned it. Until then `up` is only the starting assumption.
    verdict: bool,
    pub last: Option<ProbeResult>,
    pub probes: u64,
    /// `probes` when the state last changed (0: never).
    pub probes_at_change: u64,
    pub since: Instant,
}

impl Tracker {
    /// A backend counts as up until probes say otherwise (a restart of
    /// `lbd` must not pull every backend out while the first probes run).
    pub fn new(rise: u32, fall: u32) -> Self {
        Self {
            rise: rise.max(1),
            fall: fall.max(1),
            up: true,
            streak: 0,
            verdict: false,
            last: None,
            probes: 0,
            probes_at_change: 0,
            since: Instant::now(),
        }
    }

    /// A tracker for a changed check: the verdict stays until the new
    /// check's probes overturn it (and is still no verdict if the old
    /// check had not given one).
    pub fn continuing(rise: u32, fall: u32, up: bool, verdict: bool) -> Self {
        Self {
            up,
            verdict,
            ..Self::new(rise, fall)
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Starts down instead of up (the last `lbd` had found the backend
    /// down): `rise` successes bring it in. Only before any probe.
    pub fn assume_down(&mut self) {
        if self.probes == 0 {
            self.up = false;
            self.streak = 0;
            self.verdict = false;
        }
    }

    /// The probes have spoken: `is_up` is their verdict, not the starting
    /// assumption. A backend counts toward announcing its VIP only then.
    pub fn has_verdict(&self) -> bool {
        self.verdict
    }

    /// Records a result; returns the new state if it changed. One that
    /// could not run is shown (`last`) but neither counts toward rise or
    /// fall nor breaks a streak: running out of descriptors here must not
    /// take healthy backends down.
    pub fn record(&mut self, result: ProbeResult) -> Option<bool> {
        if result.could_not_run() {
            self.last = Some(result);
            return None;
        }
        self.probes += 1;
        let agrees = result.ok == self.up;
        self.last = Some(result);
        if agrees {
            self.streak = 0;
            self.verdict = true;
            return None;
        }
        self.streak += 1;
        let needed = if self.up { self.fall } else { self.rise };
        if self.streak < needed {
            return None;
        }
        self.up = !self.up;
        self.streak = 0;
        self.verdict = true;
        self.since = Instant::now();
        self.probes_at_change = self.probes;
        Some(self.up)
    }
}

/// A small xorshift generator for jitter; quality is irrelevant, only that
/// balancers and targets do not share a phase.
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Jitter(lb_common::flow::fmix64(seed ^ t ^ u64::from(std::process::id())) | 1)
    }

    /// A uniform value in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Probes `target` forever: first after a random fraction of the interval,
/// then a probe *starts* every `interval ± jitter%`, however long the last
/// one took (at most `timeout`, which is at most the interval). So a dead
/// backend is found within `fall × interval × (1 + jitter) + timeout`
/// ([`crate::config::HealthCheck::detection_bound`]) whether its probes
/// are refused or time out. Results go to `results` tagged with `key`; the
/// task ends when the receiver is gone or it is aborted.
pub fn spawn_prober<K: Clone + Send + 'static>(
    key: K,
    check: HealthCheck,
    target: ProbeTarget,
    seed: u64,
    results: mpsc::Sender<(K, ProbeResult)>,
) -> JoinHandle<()> {
    spawn_prober_with(key, check, target, seed, results, |c, t| async move {
        probe(&c, &t).await
    })
}

/// [`spawn_prober`] with the probe given (tests give one that fails after
/// a chosen delay).
fn spawn_prober_with<K, F, Fut>(
    key: K,
    check: HealthCheck,
    target: ProbeTarget,
    seed: u64,
    results: mpsc::Sender<(K, ProbeResult)>,
    probe: F,
) -> JoinHandle<()>
where
    K: Clone + Send + 'static,
    F: Fn(HealthCheck, ProbeTarget) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ProbeResult> + Send,
{
    tokio::spawn(async move {
        let mut jitter = Jitter::new(seed);
        tokio::time::sleep(check.interval.mul_f64(jitter.next())).await;
        loop {
            let started = tokio::time::Instant::now();
            let result = probe(check.clone(), target.clone()).await;
            if results.send((key.clone(), result)).await.is_err() {
                return;
            }
            let spread = check.jitter as f64 / 100.0;
            let factor = 1.0 + spread * (2.0 * jitter.next() - 1.0);
            tokio::time::sleep_until(started + check.interval.mul_f64(factor)).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;
    use crate::config::HttpCheck;

    fn check() -> HealthCheck {
        HealthCheck {
            port: None,
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 3,
            jitter: 10,
            send: None,
            expect: None,
            http: None,
            through_tunnel: false,
        }
    }

    /// A server on loopback that handles each connection with `f`.
    fn server(f: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> ProbeTarget {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let f = std::sync::Arc::new(f);
        std::thread::spawn(move || {
            for conn in l.incoming().take(20).flatten() {
                let f = f.clone();
                std::thread::spawn(move || f(conn));
            }
        });
        ProbeTarget { addr, mark: None }
    }

    fn refused() -> ProbeTarget {
        // Bind and drop: nothing listens there any more.
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        ProbeTarget { addr, mark: None }
    }

    /// Accepts, reads whatever comes, never answers; closes after 2 s.
    fn hold_open(mut c: std::net::TcpStream) {
        use std::io::Read as _;
        let mut buf = [0u8; 64];
        let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if let Ok(0) = c.read(&mut buf) {
                return;
            }
        }
    }

    fn reply_with(text: &'static str) -> impl Fn(std::net::TcpStream) {
        move |mut c| {
            use std::io::{Read as _, Write as _};
            let mut buf = [0u8; 256];
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = c.read(&mut buf);
            let _ = c.write_all(text.as_bytes());
        }
    }

    /// Passes, and its latency is the handshake's: the probe waits
    /// [`CLOSE_GRACE`] after it (a backend that closes at once fails), which
    /// the latency leaves out (it was ~100 ms for every healthy backend).
    #[tokio::test]
    async fn connect_probe_passes_a_listening_backend() {
        let c = HealthCheck {
            timeout: Duration::from_secs(10),
            ..check()
        };
        let start = Instant::now();
        let r = probe(&c, &server(hold_open)).await;
        let total = start.elapsed();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.detail, "connected");
        assert!(
            Duration::from_micros(r.latency_us) + CLOSE_GRACE <= total,
            "{r:?} in {total:?}"
        );
    }

    #[tokio::test]
    async fn connect_probe_fails_a_refusing_backend() {
        let r = probe(&check(), &refused()).await;
        assert!(!r.ok);
        assert!(r.detail.starts_with("connect:"), "{r:?}");
    }

    #[tokio::test]
    async fn connect_probe_fails_a_backend_that_closes_at_once() {
        let r = probe(&check(), &server(drop)).await;
        assert!(!r.ok, "{r:?}");
        assert!(r.detail.contains("right after accepting"), "{r:?}");
    }

    #[tokio::test]
    async fn send_expect_needs_the_right_reply() {
        let mut c = check();
        c.send = Some("PING\\r\\n".into());
        c.expect = Some("+PONG".into());
        assert!(probe(&c, &server(reply_with("+PONG\r\n"))).await.ok);
        let r = probe(&c, &server(reply_with("-ERR\r\n"))).await;
        assert!(!r.ok && r.detail.starts_with("unexpected reply"), "{r:?}");
        let r = probe(&c, &server(drop)).await;
        assert!(!r.ok, "{r:?}");
        let r = probe(&c, &server(hold_open)).await;
        assert!(!r.ok && r.detail.starts_with("timed out"), "{r:?}");
    }

    #[tokio::test]
    async fn http_probe_checks_the_status() {
        let mut c = check();
        c.http = Some(HttpCheck {
            path: "/healthz".into(),
            status: 200,
            host: None,
        });
        assert!(
            probe(&c, &server(reply_with("HTTP/1.1 200 OK\r\n\r\n")))
                .await
                .ok
        );
        let r = probe(&c, &server(reply_with("HTTP/1.1 503 Unavailable\r\n\r\n"))).await;
        assert_eq!((r.ok, r.detail.as_str()), (false, "HTTP 503, expected 200"));
        let r = probe(&c, &server(reply_with("SSH-2.0-x\r\n"))).await;
        assert!(!r.ok && r.detail.starts_with("not an HTTP answer"), "{r:?}");
    }

    fn result(ok: bool) -> ProbeResult {
        ProbeResult {
            ok,
            latency_us: 1,
            detail: String::new(),
        }
    }

    #[test]
    fn tracker_needs_fall_failures_and_rise_successes_in_a_row() {
        let mut t = Tracker::new(2, 3);
        assert!(t.is_up());
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(true)), None, "a success resets the streak");
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(false)), Some(false));
        assert!(!t.is_up());
        assert_eq!(t.record(result(true)), None);
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(true)), None);
        assert_eq!(t.record(result(true)), Some(true));
        assert_eq!(t.probes, 10);
    }

    /// A probe that could not run here (no descriptor, no mark) is shown
    /// but judges nothing: healthy backends stay up through any number of
    /// them, and a streak of real failures is not broken by them.
    #[test]
    fn a_probe_that_could_not_run_here_judges_nothing() {
        let local = ProbeResult {
            ok: false,
            latency_us: 0,
            detail: format!("{COULD_NOT_RUN}Too many open files (os error 24)"),
        };
        assert!(local.could_not_run() && !result(false).could_not_run());
        let mut t = Tracker::new(2, 3);
        for _ in 0..10 {
            assert_eq!(t.record(local.clone()), None);
        }
        assert!(t.is_up() && !t.has_verdict());
        assert_eq!(t.last.as_ref(), Some(&local), "shown");
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(result(false)), None);
        assert_eq!(t.record(local.clone()), None);
        assert_eq!(t.record(result(false)), Some(false), "the streak held");
        assert_eq!(t.probes, 3);
    }

    #[test]
    fn escapes_are_understood() {
        assert_eq!(unescape("a\\r\\n\\t\\\\b\\x"), b"a\r\n\t\\b\\x");
    }

    /// A backend that dies just after a good probe, whose probes then all
    /// time out: with the clock paused (virtual time), the `fall`-th
    /// failure arrives within the documented bound, not `fall × (interval
    /// + timeout)`.
    #[tokio::test(start_paused = true)]
    async fn detection_stays_within_the_bound_when_probes_time_out() {
        let mut c = check();
        c.interval = Duration::from_millis(300);
        c.timeout = Duration::from_millis(300);
        let bound = c.detection_bound();
        for seed in 0..20 {
            let (tx, mut rx) = mpsc::channel(8);
            let dead_at = std::sync::Arc::new(std::sync::Mutex::new(None));
            let (d, timeout) = (dead_at.clone(), c.timeout);
            let task =
                spawn_prober_with("k", c.clone(), server(hold_open), seed, tx, move |_, _| {
                    let d = d.clone();
                    async move {
                        // The first probe succeeds; the backend dies right after.
                        let first = {
                            let mut dead = d.lock().expect("lock");
                            let first = dead.is_none();
                            if first {
                                *dead = Some(tokio::time::Instant::now());
                            }
                            first
                        };
                        if first {
                            return ProbeResult {
                                ok: true,
                                latency_us: 0,
                                detail: String::new(),
                            };
                        }
                        tokio::time::sleep(timeout).await;
                        ProbeResult {
                            ok: false,
                            latency_us: 0,
                            detail: "timed out".into(),
                        }
                    }
                });
            let mut tracker = Tracker::new(c.rise, c.fall);
            loop {
                let (_, r) = rx.recv().await.expect("prober reports");
                if tracker.record(r) == Some(false) {
                    break;
                }
            }
            let died = dead_at.lock().expect("lock").expect("first probe ran");
            let took = died.elapsed();
            assert!(
                took <= bound,
                "seed {seed}: down after {took:?}, bound {bound:?}"
            );
            task.abort();
        }
    }

    #[tokio::test]
    async fn prober_reports_on_the_interval() {
        let (tx, mut rx) = mpsc::channel(8);
        let task = spawn_prober("k", check(), server(hold_open), 7, tx);
        for _ in 0..3 {
            // A liveness bound, not a timing check: the prober must keep
            // reporting.
            let (key, r) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("the prober stopped reporting")
                .expect("channel open");
            assert_eq!(key, "k");
            assert!(r.ok);
        }
        task.abort();
    }
}

//! Real TCP and UDP traffic: servers that say which backend they are, and
//! clients that make one request or keep a connection streaming, each a
//! thread inside its namespace. Every loop is bounded in time.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::Netns;

/// How a test server treats a TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Greet with the backend's name, then echo lines.
    Echo,
    /// Accept and close at once, without a byte: a listener whose
    /// application is gone.
    AcceptClose,
    /// Read until the client closes its side, then answer with the
    /// backend's name and the number of bytes read (an upload sink).
    Count,
}

/// Servers running in one namespace; stopped when dropped.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<()>>>,
}

impl Servers {
    /// A TCP server on `0.0.0.0:tcp_port` that greets each connection with
    /// `name` and echoes lines, and a UDP server on `udp_addr` that answers
    /// each datagram with `name` and the datagram. The threads run in the
    /// network namespace at `ns_path`.
    pub fn start(
        ns_path: &str,
        name: &str,
        tcp_port: u16,
        udp_addr: SocketAddrV4,
    ) -> Result<Servers> {
        Self::start_mode(ns_path, name, tcp_port, udp_addr, Mode::Echo)
    }

    /// As [`start`](Self::start), with the TCP server behaving as `mode`.
    pub fn start_mode(
        ns_path: &str,
        name: &str,
        tcp_port: u16,
        udp_addr: SocketAddrV4,
        mode: Mode,
    ) -> Result<Servers> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let mut threads = Vec::new();
        {
            let (stop, name, ready) = (stop.clone(), name.to_string(), ready_tx.clone());
            threads.push(std::thread::spawn({
                let path = ns_path.to_string();
                move || -> Result<()> {
                    let listener = enter(&path).and_then(|_| {
                        let l = TcpListener::bind(("0.0.0.0", tcp_port))?;
                        l.set_nonblocking(true)?;
                        Ok(l)
                    });
                    let listener = match listener {
                        Ok(l) => {
                            let _ = ready.send(Ok(()));
                            l
                        }
                        Err(e) => {
                            let _ = ready.send(Err(anyhow!("tcp server {name}: {e:#}")));
                            return Ok(());
                        }
                    };
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((conn, _)) if mode == Mode::AcceptClose => drop(conn),
                            Ok((conn, _)) if mode == Mode::Count => {
                                let name = name.clone();
                                std::thread::spawn(move || count_tcp(conn, &name));
                            }
                            Ok((conn, _)) => {
                                let (stop, name) = (stop.clone(), name.clone());
                                std::thread::spawn(move || serve_tcp(conn, &name, &stop));
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(())
                }
            }));
        }
        {
            let (stop, name, ready) = (stop.clone(), name.to_string(), ready_tx);
            threads.push(std::thread::spawn({
                let path = ns_path.to_string();
                move || -> Result<()> {
                    let sock = enter(&path).and_then(|_| {
                        let s = UdpSocket::bind(udp_addr)?;
                        s.set_read_timeout(Some(Duration::from_millis(50)))?;
                        Ok(s)
                    });
                    let sock = match sock {
                        Ok(s) => {
                            let _ = ready.send(Ok(()));
                            s
                        }
                        Err(e) => {
                            let _ = ready.send(Err(anyhow!("udp server {name}: {e:#}")));
                            return Ok(());
                        }
                    };
                    let mut buf = [0u8; 2048];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((n, from)) = sock.recv_from(&mut buf) {
                            let mut reply = format!("{name} ").into_bytes();
                            reply.extend_from_slice(&buf[..n]);
                            let _ = sock.send_to(&reply, from);
                        }
                    }
                    Ok(())
                }
            }));
        }
        for _ in 0..2 {
            ready_rx
                .recv_timeout(Duration::from_secs(5))
                .context("server did not start")??;
        }
        Ok(Servers { stop, threads })
    }
}

/// A bare TCP listener (a health endpoint): accepts and holds connections
/// open until they close; stopped when dropped.
pub struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub fn start(ns_path: &str, port: u16) -> Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        let (flag, path) = (stop.clone(), ns_path.to_string());
        let thread = std::thread::spawn(move || {
            let l = enter(&path).and_then(|_| {
                let l = TcpListener::bind(("0.0.0.0", port))?;
                l.set_nonblocking(true)?;
                Ok(l)
            });
            let l = match l {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        held.push(c);
                        // Keep at most a few: probes close their side.
                        if held.len() > 64 {
                            held.remove(0);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5))
            .context("listener did not start")??;
        Ok(Listener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn enter(path: &str) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let f = std::fs::File::open(path)?;
    // SAFETY: setns on a namespace fd; affects only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn serve_tcp(conn: TcpStream, name: &str, stop: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    if writer.write_all(format!("{name}\n").as_bytes()).is_err() {
        return;
    }
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if writer.write_all(line.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return,
        }
    }
}

/// Reads until end of stream (at most 60 s of silence), then writes
/// `name count`.
fn count_tcp(mut conn: TcpStream, name: &str) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut buf = vec![0u8; 64 << 10];
    let mut count = 0u64;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => count += n as u64,
            Err(_) => return,
        }
    }
    let _ = conn.write_all(format!("{name} {count}\n").as_bytes());
}

/// Uploads `bytes` bytes from `src:sport` to a [`Mode::Count`] server at
/// `dst` and returns the backend's name and the count it received. A path
/// that stalls fails after `stall` without progress.
pub fn tcp_upload(
    src: Ipv4Addr,
    sport: u16,
    dst: SocketAddrV4,
    bytes: usize,
    stall: Duration,
) -> Result<(String, u64)> {
    let mut stream = connect_from(src, sport, dst)?;
    stream.set_write_timeout(Some(stall))?;
    stream.set_read_timeout(Some(stall))?;
    let chunk = vec![0x5au8; 64 << 10];
    let mut sent = 0;
    while sent < bytes {
        let n = chunk.len().min(bytes - sent);
        stream
            .write_all(&chunk[..n])
            .with_context(|| format!("upload stalled after {sent} of {bytes} bytes"))?;
        sent += n;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .context("reading the byte count")?;
    let (name, count) = answer
        .trim()
        .split_once(' ')
        .with_context(|| format!("malformed answer {answer:?}"))?;
    Ok((name.to_string(), count.parse()?))
}

/// A TCP connection from `src:sport` to `dst`, made in the calling thread's
/// namespace.
fn connect_from(src: Ipv4Addr, sport: u16, dst: SocketAddrV4) -> Result<TcpStream> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::from((src, sport)).into())
        .with_context(|| format!("bind {src}:{sport}"))?;
    s.connect_timeout(&SocketAddr::V4(dst).into(), Duration::from_secs(5))
        .with_context(|| format!("connect {dst} from port {sport}"))?;
    let stream: TcpStream = s.into();
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(stream)
}

/// One TCP exchange from `src:sport`: read the greeting, send a line, read
/// it back. Returns the backend's name.
pub fn tcp_request(src: Ipv4Addr, sport: u16, dst: SocketAddrV4) -> Result<String> {
    let stream = connect_from(src, sport, dst)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut name = String::new();
    reader
        .read_line(&mut name)
        .context("reading the greeting")?;
    let payload = format!("hello from port {sport}\n");
    writer.write_all(payload.as_bytes())?;
    let mut echo = String::new();
    reader.read_line(&mut echo).context("reading the echo")?;
    if echo != payload {
        bail!("echo mismatch: sent {payload:?}, got {echo:?}");
    }
    Ok(name.trim().to_string())
}

/// One UDP request from `src:sport`; returns the backend's name.
pub fn udp_request(src: Ipv4Addr, sport: u16, dst: SocketAddrV4) -> Result<String> {
    let s = UdpSocket::bind((src, sport)).with_context(|| format!("bind {src}:{sport}"))?;
    s.connect(dst)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let query = format!("query {sport}");
    for _ in 0..3 {
        s.send(query.as_bytes())?;
        let mut buf = [0u8; 512];
        if let Ok(n) = s.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            let (name, rest) = text.split_once(' ').context("malformed answer")?;
            if rest != query {
                bail!("answer {rest:?} does not match {query:?}");
            }
            return Ok(name.to_string());
        }
    }
    bail!("no UDP answer from {dst} to port {sport} after 3 tries")
}

/// What a long-lived stream saw.
#[derive(Clone, Debug)]
pub struct StreamReport {
    pub sport: u16,
    /// The backend that greeted it.
    pub backend: String,
    /// Round trips completed.
    pub exchanges: u64,
    /// Longest time between two completed round trips.
    pub max_gap: Duration,
    /// Why it stopped early, if it did.
    pub error: Option<String>,
}

/// A TCP connection that keeps exchanging lines until stopped.
pub struct Stream {
    pub sport: u16,
    /// The backend that greeted it.
    pub backend: String,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    /// Longest gap between round trips since the last
    /// [`take_max_gap`](Stream::take_max_gap), in microseconds.
    recent_gap_us: Arc<AtomicU64>,
    thread: JoinHandle<Result<StreamReport>>,
}

impl Stream {
    /// Opens the connection from inside `ns` and starts the round trips
    /// (one every `every`). Returns once the greeting has arrived. A round
    /// trip that takes more than 3 s ends it with an error.
    pub fn start(
        ns: &Netns,
        src: Ipv4Addr,
        sport: u16,
        dst: SocketAddrV4,
        every: Duration,
    ) -> Result<Stream> {
        Self::start_with(ns, src, sport, dst, every, Duration::from_secs(3))
    }

    /// As [`start`](Self::start), waiting up to `patience` for each round
    /// trip (for tests where TCP must retransmit through a failover).
    pub fn start_with(
        ns: &Netns,
        src: Ipv4Addr,
        sport: u16,
        dst: SocketAddrV4,
        every: Duration,
        patience: Duration,
    ) -> Result<Stream> {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicU64::new(0));
        let done = progress.clone();
        let recent_gap_us = Arc::new(AtomicU64::new(0));
        let recent = recent_gap_us.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Result<String>>();
        let path = ns.path();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || -> Result<StreamReport> {
            let setup = (|| -> Result<(TcpStream, BufReader<TcpStream>, String)> {
                enter(&path)?;
                let stream = connect_from(src, sport, dst)?;
                let mut reader = BufReader::new(stream.try_clone()?);
                let mut name = String::new();
                reader
                    .read_line(&mut name)
                    .context("reading the greeting")?;
                Ok((stream, reader, name.trim().to_string()))
            })();
            let (mut writer, mut reader, backend) = match setup {
                Ok(s) => {
                    let _ = tx.send(Ok(s.2.clone()));
                    s
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = tx.send(Err(e));
                    bail!(msg);
                }
            };
            writer.set_read_timeout(Some(patience))?;
            reader.get_ref().set_read_timeout(Some(patience))?;
            let mut report = StreamReport {
                sport,
                backend,
                exchanges: 0,
                max_gap: Duration::ZERO,
                error: None,
            };
            let mut last = Instant::now();
            let mut line = String::new();
            while !flag.load(Ordering::Relaxed) {
                let msg = format!("{sport} {}\n", report.exchanges);
                let result = writer
                    .write_all(msg.as_bytes())
                    .map_err(anyhow::Error::from)
                    .and_then(|_| {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) => bail!("connection closed by the peer"),
                            Ok(_) if line == msg => Ok(()),
                            Ok(_) => bail!("echo mismatch: {line:?}"),
                            Err(e) => Err(e.into()),
                        }
                    });
                if let Err(e) = result {
                    report.error = Some(format!("{e:#}"));
                    break;
                }
                report.exchanges += 1;
                done.store(report.exchanges, Ordering::Relaxed);
                let gap = last.elapsed();
                recent.fetch_max(gap.as_micros() as u64, Ordering::Relaxed);
                report.max_gap = report.max_gap.max(gap);
                last = Instant::now();
                // In steps, so that a stop never waits out a long interval.
                let until = last + every;
                while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
                }
            }
            Ok(report)
        });
        let backend = rx
            .recv_timeout(Duration::from_secs(10))
            .context("stream did not connect in 10 s")??;
        Ok(Stream {
            sport,
            backend,
            stop,
            progress,
            recent_gap_us,
            thread,
        })
    }

    /// The longest gap between two completed round trips since the
    /// previous call (or the start); starts a new measuring period. Take
    /// it once the stream is flowing again after an event.
    pub fn take_max_gap(&self) -> Duration {
        Duration::from_micros(self.recent_gap_us.swap(0, Ordering::Relaxed))
    }

    /// Round trips completed so far.
    pub fn exchanges(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// It has stopped (an error ended it).
    pub fn ended(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops it and returns what it saw.
    pub fn finish(self) -> Result<StreamReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("stream thread panicked"))?
    }
}

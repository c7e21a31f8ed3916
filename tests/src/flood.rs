//! A spoofed flood: a raw `AF_PACKET` socket in a namespace sends
//! batches of TCP segments (SYNs, or ACKs: one-packet flows that are not
//! SYNs) with random source addresses and ports straight to a MAC address
//! (`sendmmsg`, `PACKET_QDISC_BYPASS`), as fast as one core can, until
//! stopped or its deadline. Every frame is a valid IPv4 segment (header
//! checksum included) that no host will ever answer for.
//!
//! Sources are drawn from one /16 so that a rule can drop the tunnelled
//! flood after the balancer ([`drop_tunnelled`]), sparing the backends'
//! TCP stacks the work.

use std::{
    net::SocketAddrV4,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::netns::{Netns, enter_path};

/// Frames per `sendmmsg`.
const BATCH: usize = 256;
/// Ethernet + IPv4 + TCP without options.
const FRAME_LEN: usize = 14 + 20 + 20;

/// What a flood did.
#[derive(Clone, Copy, Debug)]
pub struct FloodReport {
    /// Frames the socket accepted.
    pub sent: u64,
    pub elapsed: Duration,
}

impl FloodReport {
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A running flood; stopped when [`stop`](SynFlood::stop)ped or dropped.
pub struct SynFlood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<FloodReport>>>,
}

/// Where the flood goes: out of `ifname` in `ns`, to `dst_mac`, from
/// `src_mac`, for `dst`, with sources in `src_net.0.0/16`; TCP flags
/// `tcp_flags` ([`SYN`], [`ACK`] for a flood of one-packet flows that are
/// not SYNs, or [`SYN_ACK_PAIRS`]: each tuple a SYN, then an ACK, as a
/// spoofed handshake); tuples drawn from `seed` (give each generator its
/// own: two floods of one seed send the same tuples).
pub struct Target {
    pub ifname: String,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub dst: SocketAddrV4,
    pub src_net: [u8; 2],
    pub tcp_flags: u8,
    pub seed: u64,
}

/// A fresh seed for a flood's tuples (print it: a run can be replayed).
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

/// TCP flags of a SYN.
pub const SYN: u8 = 0x02;
/// TCP flags of an ACK.
pub const ACK: u8 = 0x10;
/// Not TCP flags: [`Target::tcp_flags`] for a flood of spoofed
/// handshakes, each tuple a SYN then an ACK, back to back.
pub const SYN_ACK_PAIRS: u8 = SYN | ACK;
/// Not TCP flags: each tuple's SYN sent twice, back to back (clients that
/// retry: what passive health counts).
pub const SYN_RETRIED: u8 = SYN | 0x80;
/// Not TCP flags: one SYN, the same tuple in every frame.
pub const SYN_ONE_TUPLE: u8 = SYN | 0x40;

impl SynFlood {
    /// Starts the flood on a thread inside `ns`; it ends by itself after
    /// `limit`.
    pub fn start(ns: &Netns, target: Target, limit: Duration) -> Result<SynFlood> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (flag, count, path) = (stop.clone(), sent.clone(), ns.path());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::spawn(move || -> Result<FloodReport> {
            let sock = enter_path(&path).and_then(|_| RawSocket::open(&target.ifname));
            let sock = match sock {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = ready_tx.send(Err(e));
                    bail!(msg);
                }
            };
            run(&sock, &target, &flag, &count, limit)
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .context("the flood's socket did not open")??;
        Ok(SynFlood {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn stop(mut self) -> Result<FloodReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .context("flood already stopped")?
            .join()
            .map_err(|_| anyhow!("flood thread panicked"))?
    }
}

impl Drop for SynFlood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends batches until `stop` or `limit`.
fn run(
    sock: &RawSocket,
    target: &Target,
    stop: &AtomicBool,
    sent: &AtomicU64,
    limit: Duration,
) -> Result<FloodReport> {
    let pairs = matches!(target.tcp_flags, SYN_ACK_PAIRS | SYN_RETRIED);
    let flags = |i: usize| match (target.tcp_flags, i % 2) {
        (SYN_ACK_PAIRS, 1) => ACK,
        (SYN_ACK_PAIRS | SYN_RETRIED | SYN_ONE_TUPLE, _) => SYN,
        (flags, _) => flags,
    };
    let mut frames: Vec<[u8; FRAME_LEN]> =
        (0..BATCH).map(|i| syn_frame(target, flags(i))).collect();
    let mut rng = XorShift(target.seed | 1);
    let one = rng.next();
    let start = Instant::now();
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < limit {
        let mut r = 0;
        for (i, f) in frames.iter_mut().enumerate() {
            // A pair's second frame repeats the first's tuple.
            if !pairs || i % 2 == 0 {
                r = rng.next();
            }
            if target.tcp_flags == SYN_ONE_TUPLE {
                r = one;
            }
            randomise(f, target.src_net, r);
        }
        let n = sock.send_batch(&frames)?;
        total += n as u64;
        sent.store(total, Ordering::Relaxed);
    }
    Ok(FloodReport {
        sent: total,
        elapsed: start.elapsed(),
    })
}

/// A segment with TCP flags `flags` from `src_net.0.0:0` to the target,
/// checksums for that source.
fn syn_frame(t: &Target, flags: u8) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[0..6].copy_from_slice(&t.dst_mac);
    f[6..12].copy_from_slice(&t.src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..14].copy_from_slice(&t.src_net);
    ip[16..20].copy_from_slice(&t.dst.ip().octets());
    let tcp = &mut f[34..54];
    tcp[2..4].copy_from_slice(&t.dst.port().to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    f
}

/// New source host bits, port and sequence number from `r`; the IPv4
/// header checksum recomputed (the TCP checksum is left alone: no host
/// checks it before the flood is dropped).
fn randomise(f: &mut [u8; FRAME_LEN], src_net: [u8; 2], r: u64) {
    let b = r.to_le_bytes();
    f[14 + 12..14 + 16].copy_from_slice(&[src_net[0], src_net[1], b[0], b[1]]);
    // Source port 1024-65535, sequence number.
    let port = 1024 + (u16::from_le_bytes([b[2], b[3]]) % (65535 - 1024));
    f[34..36].copy_from_slice(&port.to_be_bytes());
    f[38..42].copy_from_slice(&b[4..8]);
    f[24..26].copy_from_slice(&[0, 0]);
    let sum: u32 = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    f[24..26].copy_from_slice(&(!(folded as u16)).to_be_bytes());
}

/// xorshift64*: fast, and good enough to spread sources over buckets.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A send-only `AF_PACKET` socket bound to one interface.
pub struct RawSocket {
    fd: std::os::fd::OwnedFd,
}

impl RawSocket {
    pub fn open(ifname: &str) -> Result<RawSocket> {
        use std::os::fd::FromRawFd as _;
        let name = std::ffi::CString::new(ifname)?;
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface {ifname}: {}", std::io::Error::last_os_error());
        }
        // Protocol 0: the socket receives nothing.
        // SAFETY: plain socket(2) call.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        if raw < 0 {
            bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let sock = RawSocket { fd };
        sock.set_int(libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)?;
        sock.bind(ifindex)?;
        Ok(sock)
    }

    fn raw(&self) -> libc::c_int {
        use std::os::fd::AsRawFd as _;
        self.fd.as_raw_fd()
    }

    fn set_int(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> Result<()> {
        // SAFETY: the option value is a live c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                self.raw(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!("setsockopt {name}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn bind(&self, ifindex: u32) -> Result<()> {
        // SAFETY: a zeroed sockaddr_ll is valid; the fields are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: `addr` is a sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(
                self.raw(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!(
                "bind to ifindex {ifindex}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Sends every frame (on the bound interface); returns how many the
    /// kernel took. A full queue (`ENOBUFS`, `EAGAIN`) is not an error.
    pub fn send_batch<F: AsRef<[u8]>>(&self, frames: &[F]) -> Result<usize> {
        let mut iov: Vec<libc::iovec> = frames
            .iter()
            .map(|f| libc::iovec {
                iov_base: f.as_ref().as_ptr() as *mut libc::c_void,
                iov_len: f.as_ref().len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: a zeroed msghdr is valid (no name, no control).
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = v;
                h.msg_iovlen = 1;
                libc::mmsghdr {
                    msg_hdr: h,
                    msg_len: 0,
                }
            })
            .collect();
        // SAFETY: every mmsghdr points at one live iovec over a live frame,
        // all outliving the call.
        let n = unsafe { libc::sendmmsg(self.raw(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) => Ok(0),
                _ => Err(anyhow!("sendmmsg: {e}")),
            };
        }
        Ok(n as usize)
    }
}

/// Adds a rule to the router `ns` that drops forwarded IP-in-IP packets
/// whose inner source is in `src_net.0.0/16`: the balancer's tunnelled
/// flood, which would otherwise reach the backends.
pub fn drop_tunnelled(ns: &Netns, src_net: [u8; 2]) -> Result<()> {
    let net = u16::from_be_bytes(src_net);
    ns.run("nft", &["add", "table", "inet", "lbflood"])?;
    ns.run(
        "nft",
        &["add chain inet lbflood forward { type filter hook forward priority 0 ; }"],
    )?;
    // The inner IPv4 source starts 12 bytes into the inner header, which
    // starts 20 bytes after the outer one: bit 256 of the network header.
    ns.run(
        "nft",
        &[&format!(
            "add rule inet lbflood forward ip protocol 4 @nh,256,16 {net:#06x} counter drop"
        )],
    )?;
    Ok(())
}

/// The MAC address of `ifname` in `ns`.
pub fn mac_of(ns: &Netns, ifname: &str) -> Result<[u8; 6]> {
    let out = ns.ip(&["-br", "link", "show", "dev", ifname])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = text
        .split_whitespace()
        .nth(2)
        .with_context(|| format!("no MAC in {text:?}"))?;
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = field.split(':').collect();
    if parts.len() != 6 {
        bail!("malformed MAC {field:?}");
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).with_context(|| format!("malformed MAC {field:?}"))?;
    }
    Ok(mac)
}

/// Sources of floods in the tests: 198.18.0.0/16 (RFC 2544's benchmark
/// range), never a real client.
pub const FLOOD_NET: [u8; 2] = [198, 18];

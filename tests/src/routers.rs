//! Real routers for the BGP tests: BIRD 2 and FRR (zebra + bgpd), each run
//! inside a test's router namespace with its configuration, control
//! sockets, pid files and logs in the test's scratch directory, and each
//! owned by a guard that stops the daemons and removes their files, also
//! when a test fails. Also the rig they run in ([`BgpRig`]: one router
//! namespace, N speaker namespaces) and the queries the tests make: the
//! router's view of a session, its BGP table, the kernel routes it
//! installed.
//!
//! FRR runs as the `frr` user (its packaged default: bgpd and zebra keep
//! the capabilities they need); `-u root` is refused by zebra because root
//! is not in the `frrvty` group. It never touches `/var/run/frr`: every
//! path is given on the command line. FRR keeps a crash-log directory per
//! process under `/var/tmp/frr/`; the guard removes it.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    netns::{Netns, sh, unique, veth},
    rig::require_root,
};

pub const BIRD: &str = "/usr/sbin/bird";
pub const BIRDC: &str = "/usr/sbin/birdc";
pub const ZEBRA: &str = "/usr/lib/frr/zebra";
pub const BGPD: &str = "/usr/lib/frr/bgpd";
pub const BFDD: &str = "/usr/lib/frr/bfdd";
pub const VTYSH: &str = "/usr/bin/vtysh";

/// The router's AS and the speakers' AS (eBGP).
pub const ROUTER_AS: u32 = 65000;
pub const SPEAKER_AS: u32 = 65001;
/// The VIPs the tests announce, and the ranges the routers accept.
pub const VIP4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
const VIP4_RANGE: &str = "10.99.0.0/16";
const VIP6_RANGE: &str = "fd00:99::/64";

/// Fails, saying what to install, unless we are root and `binaries` exist.
pub fn require(binaries: &[&str]) -> Result<()> {
    require_root()?;
    for b in binaries {
        if !Path::new(b).is_file() {
            bail!(
                "{b} is missing: the BGP tests need bird2 and frr (`apt-get install bird2 frr`, or `cargo xtask setup`)"
            );
        }
    }
    Ok(())
}

/// Polls `f` every `every` until it holds or `limit` passes; returns how
/// long it took. Errors from `f` end the wait.
pub fn wait_for(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(every);
    }
}

/// A scratch directory, removed on drop.
#[derive(Debug)]
pub struct ScratchDir {
    pub path: PathBuf,
}

impl ScratchDir {
    pub fn new(name: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One router namespace and `n` speaker namespaces, speaker `i` (from 1)
/// joined to the router by a veth:
///
/// ```text
/// router r-lb<i> 10.98.<i>.1/24 fd00:98:<i>::1/64 ── eth0 10.98.<i>.2/24 fd00:98:<i>::2/64 lb<i>
/// ```
pub struct BgpRig {
    pub id: String,
    pub router: Netns,
    pub speakers: Vec<Netns>,
    /// Removed last (fields drop in order).
    pub dir: ScratchDir,
}

impl BgpRig {
    pub fn new(n: usize) -> Result<BgpRig> {
        require_root()?;
        let id = unique("lbg");
        let dir = ScratchDir::new(&id)?;
        let router = Netns::new(&format!("{id}-rt"))?;
        let mut rig = BgpRig {
            id: id.clone(),
            router,
            speakers: Vec::new(),
            dir,
        };
        for i in 1..=n {
            rig.speakers.push(Netns::new(&format!("{id}-lb{i}"))?);
        }
        rig.wire().context("wiring the BGP rig")?;
        Ok(rig)
    }

    fn wire(&self) -> Result<()> {
        self.router.sysctl("net.ipv4.ip_forward", "1")?;
        self.router.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        for (i, lb) in self.speakers.iter().enumerate() {
            let i = i + 1;
            let r_if = format!("r-lb{i}");
            veth(&self.router, &r_if, lb, "eth0", 1500)?;
            for (ns, dev, v4, v6) in [
                (
                    &self.router,
                    r_if.as_str(),
                    format!("10.98.{i}.1/24"),
                    format!("fd00:98:{i}::1/64"),
                ),
                (
                    lb,
                    "eth0",
                    format!("10.98.{i}.2/24"),
                    format!("fd00:98:{i}::2/64"),
                ),
            ] {
                ns.ip(&["addr", "add", &v4, "dev", dev])?;
                // nodad: usable at once, no 1–2 s of duplicate detection.
                ns.ip(&["-6", "addr", "add", &v6, "dev", dev, "nodad"])?;
            }
        }
        Ok(())
    }

    /// Speaker `i`'s (from 1) address on its link.
    pub fn speaker_v4(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 98, i as u8, 2)
    }

    pub fn speaker_v6(i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x98, i as u16, 0, 0, 0, 0, 2)
    }

    /// The router's address on speaker `i`'s link.
    pub fn router_v4(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 98, i as u8, 1)
    }

    /// The router's configuration for this rig: one eBGP peer per speaker.
    pub fn router_spec(&self) -> RouterSpec {
        RouterSpec {
            router_id: Self::router_v4(1),
            check_link: false,
            bfd: false,
            graceful_shutdown_policy: false,
            ipv4_only: false,
            hold_time: HOLD_TIME,
            peers: (1..=self.speakers.len())
                .map(|i| RouterPeer {
                    name: format!("lb{i}"),
                    local: Self::router_v4(i),
                    address: Self::speaker_v4(i),
                    password: None,
                    ttl_security: false,
                })
                .collect(),
        }
    }
}

/// The rigs' hold time, in seconds: short, so that a silent speaker
/// leaves in seconds. Tests of a restart that must not look like a
/// silence on a busy machine (graceful restart) offer a longer one.
pub const HOLD_TIME: u16 = 3;

/// What a router is configured with.
#[derive(Clone, Debug)]
pub struct RouterSpec {
    pub router_id: Ipv4Addr,
    /// Drop a session as soon as its interface loses carrier (BIRD's
    /// `check link`; FRR's fast-external-failover, on by default), rather
    /// than at hold-timer expiry.
    pub check_link: bool,
    /// BFD with every peer (BIRD `protocol bfd`, 300 ms × 3, and `bfd on`:
    /// a BFD session that goes down takes the BGP session down, routes
    /// flushed even while the peer is in graceful restart).
    pub bfd: bool,
    /// Honour GRACEFUL_SHUTDOWN (RFC 8326 §4.2): routes that carry 65535:0
    /// get LOCAL_PREF 0.
    pub graceful_shutdown_policy: bool,
    /// Offer IPv4 unicast only on the sessions, so that IPv6 routes cannot
    /// be sent (BIRD only: no `ipv6` channel).
    pub ipv4_only: bool,
    /// The hold time the router offers, in seconds (keepalives at a third
    /// of it); BGP runs at the smaller of the two sides'. [`HOLD_TIME`].
    pub hold_time: u16,
    pub peers: Vec<RouterPeer>,
}

#[derive(Clone, Debug)]
pub struct RouterPeer {
    /// BIRD protocol name.
    pub name: String,
    /// The router's own address towards the peer.
    pub local: Ipv4Addr,
    pub address: Ipv4Addr,
    /// TCP MD5 key (RFC 2385) of the session.
    pub password: Option<String>,
    /// GTSM (RFC 5082), one hop: the router sends TTL 255 and accepts
    /// only 255.
    pub ttl_security: bool,
}

/// Which router implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    Bird,
    Frr,
}

/// What the tests ask of a router, whichever it is.
pub trait Router {
    fn name(&self) -> &'static str;
    /// The session with `peer` is Established in the router's view.
    fn established(&self, peer: Ipv4Addr) -> Result<bool>;
    /// What the router says about its session with `peer` (state, last
    /// error or notification), as text to search and print.
    fn session_report(&self, peer: Ipv4Addr) -> Result<String>;
    /// The router's BGP table has a route for `vip` (not just the kernel).
    fn has_bgp_route(&self, vip: IpAddr) -> Result<bool>;
    /// Asks `peer` for its IPv4 routes again, as an operator who changed
    /// the import policy does (a soft reset inbound: ROUTE-REFRESH where
    /// the peer offered it). Returns what the router's command printed.
    fn refresh_in(&self, peer: Ipv4Addr) -> Result<String>;
    /// Kills the BGP daemon (SIGKILL), as a crash would.
    fn crash(&mut self) -> Result<()>;
    /// Starts the killed daemon again with the same configuration.
    fn start_again(&mut self) -> Result<()>;
    /// Logs, for failure messages.
    fn logs(&self) -> String;
}

/// Starts a router of `kind` in `rig`'s router namespace.
pub fn start_router(kind: RouterKind, rig: &BgpRig) -> Result<Box<dyn Router>> {
    start_router_with(kind, rig, &rig.router_spec())
}

/// Starts a router of `kind` in `rig`'s router namespace configured as
/// `spec` says.
pub fn start_router_with(
    kind: RouterKind,
    rig: &BgpRig,
    spec: &RouterSpec,
) -> Result<Box<dyn Router>> {
    let spec = spec.clone();
    Ok(match kind {
        RouterKind::Bird => Box::new(Bird::start(&rig.router, &rig.dir.path, &spec)?),
        RouterKind::Frr => Box::new(Frr::start(&rig.router, &rig.dir.path, &spec)?),
    })
}

/// The kernel routes for `vip` in `ns` (`ip route show VIP`), as text.
pub fn kernel_routes(ns: &Netns, vip: IpAddr) -> Result<String> {
    let family = if vip.is_ipv4() { "-4" } else { "-6" };
    let out = ns.ip(&[family, "route", "show", &vip.to_string()])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The next hops of the kernel route for `vip` in `ns` (none: no route).
pub fn kernel_next_hops(ns: &Netns, vip: IpAddr) -> Result<Vec<IpAddr>> {
    let text = kernel_routes(ns, vip)?;
    let words: Vec<&str> = text.split_whitespace().collect();
    Ok(words
        .windows(2)
        .filter(|w| w[0] == "via")
        .filter_map(|w| w[1].parse().ok())
        .collect())
}

/// Stops a child: SIGTERM, then SIGKILL if it is still there after
/// `grace`.
fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: kill(2) on our own child's pid, which we have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn log_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// BIRD's lines for a peer's MD5 key and GTSM.
fn bird_security(p: &RouterPeer) -> String {
    let mut s = String::new();
    if let Some(key) = &p.password {
        let _ = write!(s, "\n  password \"{key}\";");
    }
    if p.ttl_security {
        // Passive: lb never listens, and its kernel's resets to BIRD's own
        // connection attempts leave with TTL 64, which GTSM drops; BIRD
        // would sit in its connect timeout and refuse lb's connections.
        s.push_str("\n  ttl security yes;\n  passive yes;");
    }
    s
}

/// BIRD 2 in a namespace.
pub struct Bird {
    ns_path: String,
    ns_name: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Bird {
    fn config(dir: &Path, spec: &RouterSpec) -> String {
        let mut c = format!(
            r#"router id {id};
log "{dir}/bird.log" all;
protocol device {{ scan time 1; }}
protocol kernel kernel4 {{
  ipv4 {{ import none; export all; }};
  merge paths yes limit 16;
}}
protocol kernel kernel6 {{
  ipv6 {{ import none; export all; }};
  merge paths yes limit 16;
}}
define VIPS4 = [ {VIP4_RANGE}{{32,32}} ];
define VIPS6 = [ {VIP6_RANGE}{{128,128}} ];
filter vips4 {{ if ! (net ~ VIPS4) then reject; {gshut} accept; }}
filter vips6 {{ if ! (net ~ VIPS6) then reject; {gshut} accept; }}
"#,
            id = spec.router_id,
            dir = dir.display(),
            gshut = if spec.graceful_shutdown_policy {
                "if (65535, 0) ~ bgp_community then bgp_local_pref = 0;"
            } else {
                ""
            },
        );
        if spec.bfd {
            c.push_str(
                "protocol bfd {\n  interface \"*\" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; };\n}\n",
            );
        }
        for p in &spec.peers {
            let _ = write!(
                c,
                r#"protocol bgp {name} {{
  local {local} as {ROUTER_AS};
  neighbor {addr} as {SPEAKER_AS};
  hold time {hold}; keepalive time {keepalive}; connect retry time 1;
  error wait time 1, 2;
  check link {check};{security}{bfd}
  ipv4 {{ import filter vips4; export none; }};{v6}
}}
"#,
                v6 = if spec.ipv4_only {
                    ""
                } else {
                    "\n  ipv6 { import filter vips6; export none; };"
                },
                name = p.name,
                hold = spec.hold_time,
                keepalive = (spec.hold_time / 3).max(1),
                local = p.local,
                addr = p.address,
                check = if spec.check_link { "yes" } else { "no" },
                security = bird_security(p),
                bfd = if spec.bfd { "\n  bfd on;" } else { "" },
            );
        }
        c
    }

    pub fn start(ns: &Netns, dir: &Path, spec: &RouterSpec) -> Result<Bird> {
        require(&[BIRD, BIRDC])?;
        let dir = dir.join("bird");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("bird.conf"), Self::config(&dir, spec))?;
        let mut bird = Bird {
            ns_path: ns.path(),
            ns_name: ns.name.clone(),
            dir,
            child: None,
        };
        bird.start_again()?;
        Ok(bird)
    }

    fn ctl(&self) -> PathBuf {
        self.dir.join("bird.ctl")
    }

    /// `birdc -s CTL ARGS...`.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let out = sh(Command::new(BIRDC).arg("-s").arg(self.ctl()).args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn protocol_name(&self, peer: Ipv4Addr) -> Result<String> {
        // The protocol names follow the rig: lb<i> for 10.98.<i>.2.
        let i = peer.octets()[2];
        Ok(format!("lb{i}"))
    }
}

impl Router for Bird {
    fn name(&self) -> &'static str {
        "BIRD"
    }

    fn established(&self, peer: Ipv4Addr) -> Result<bool> {
        Ok(self
            .session_report(peer)?
            .lines()
            .any(|l| l.trim() == "BGP state:          Established"))
    }

    fn session_report(&self, peer: Ipv4Addr) -> Result<String> {
        self.birdc(&["show", "protocols", "all", &self.protocol_name(peer)?])
    }

    fn has_bgp_route(&self, vip: IpAddr) -> Result<bool> {
        let text = self.birdc(&["show", "route", "for", &vip.to_string(), "all"])?;
        Ok(text.contains("BGP.origin"))
    }

    fn refresh_in(&self, peer: Ipv4Addr) -> Result<String> {
        self.birdc(&["reload", "in", &self.protocol_name(peer)?])
    }

    fn crash(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    fn start_again(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("BIRD is already running");
        }
        let _ = std::fs::remove_file(self.ctl());
        let out = log_file(&self.dir.join("bird.out"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns_path))
            .arg("--")
            .arg(BIRD)
            .arg("-f")
            .arg("-c")
            .arg(self.dir.join("bird.conf"))
            .arg("-s")
            .arg(self.ctl())
            .arg("-P")
            .arg(self.dir.join("bird.pid"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting bird")?;
        self.child = Some(child);
        let ready = wait_for(
            "BIRD answering on its control socket",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                if let Some(c) = self.child.as_mut()
                    && let Some(status) = c.try_wait()?
                {
                    bail!("bird exited ({status})");
                }
                Ok(self.birdc(&["show", "status"]).is_ok())
            },
        );
        ready.with_context(|| format!("BIRD in {}:\n{}", self.ns_name, self.logs()))?;
        Ok(())
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for f in ["bird.out", "bird.log"] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let _ = writeln!(s, "--- {f}\n{text}");
        }
        s
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Duration::from_millis(500));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// FRR's zebra and bgpd in a namespace.
pub struct Frr {
    ns_path: String,
    ns_name: String,
    dir: PathBuf,
    zebra: Option<Child>,
    bgpd: Option<Child>,
    /// With `RouterSpec::bfd`.
    bfdd: Option<Child>,
    /// Pids whose `/var/tmp/frr/<daemon>.<pid>` directories to remove.
    pids: Vec<(&'static str, u32)>,
}

impl Frr {
    fn bgpd_config(dir: &Path, spec: &RouterSpec) -> String {
        let mut c = format!(
            "frr defaults traditional\nhostname router\nlog file {dir}/bgpd.log\nlog timestamp precision 3\n\
             ip prefix-list VIPS4 seq 5 permit {VIP4_RANGE} ge 32\n\
             ipv6 prefix-list VIPS6 seq 5 permit {VIP6_RANGE} ge 128\n\
             route-map VIPS4 permit 10\n match ip address prefix-list VIPS4\nexit\n\
             route-map VIPS6 permit 10\n match ipv6 address prefix-list VIPS6\nexit\n\
             router bgp {ROUTER_AS}\n bgp router-id {id}\n bgp log-neighbor-changes\n no bgp default ipv4-unicast\n",
            dir = dir.display(),
            id = spec.router_id,
        );
        for p in &spec.peers {
            let _ = write!(
                c,
                " neighbor {a} remote-as {SPEAKER_AS}\n neighbor {a} timers {k} {h}\n neighbor {a} timers connect 1\n",
                a = p.address,
                k = (spec.hold_time / 3).max(1),
                h = spec.hold_time
            );
            if let Some(key) = &p.password {
                let _ = writeln!(c, " neighbor {} password {key}", p.address);
            }
            if p.ttl_security {
                let _ = writeln!(c, " neighbor {} ttl-security hops 1", p.address);
                let _ = writeln!(c, " neighbor {} passive", p.address);
            }
            if spec.bfd {
                // bfdd's defaults: 300 ms × 3.
                let _ = writeln!(c, " neighbor {} bfd", p.address);
            }
        }
        for (family, map) in [("ipv4", "VIPS4"), ("ipv6", "VIPS6")] {
            let _ = writeln!(c, " address-family {family} unicast\n  maximum-paths 16");
            for p in &spec.peers {
                let _ = write!(
                    c,
                    "  neighbor {a} activate\n  neighbor {a} route-map {map} in\n",
                    a = p.address
                );
            }
            c.push_str(" exit-address-family\n");
        }
        c.push_str("exit\n");
        c
    }

    pub fn start(ns: &Netns, dir: &Path, spec: &RouterSpec) -> Result<Frr> {
        require(&[ZEBRA, BGPD, VTYSH])?;
        let dir = dir.join("frr");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("zebra.conf"),
            format!("hostname router\nlog file {}/zebra.log\n", dir.display()),
        )?;
        std::fs::write(dir.join("bgpd.conf"), Self::bgpd_config(&dir, spec))?;
        std::fs::write(
            dir.join("bfdd.conf"),
            format!("hostname router\nlog file {}/bfdd.log\n", dir.display()),
        )?;
        // The daemons run as frr: they write their sockets, pids and logs
        // here.
        sh(Command::new("chown").arg("-R").arg("frr:frr").arg(&dir))?;
        let mut frr = Frr {
            ns_path: ns.path(),
            ns_name: ns.name.clone(),
            dir,
            zebra: None,
            bgpd: None,
            bfdd: None,
            pids: Vec::new(),
        };
        frr.zebra = Some(frr.spawn("zebra", ZEBRA)?);
        if spec.bfd {
            frr.bfdd = Some(frr.spawn("bfdd", BFDD)?);
        }
        wait_for(
            "zebra's API socket",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || Ok(frr.dir.join("zserv.api").exists()),
        )
        .with_context(|| format!("FRR in {}:\n{}", frr.ns_name, frr.logs()))?;
        frr.start_again()?;
        Ok(frr)
    }

    fn spawn(&mut self, daemon: &'static str, binary: &str) -> Result<Child> {
        let out = log_file(&self.dir.join(format!("{daemon}.out")))?;
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns_path))
            .arg("--")
            .arg(binary)
            .args(["-u", "frr", "-g", "frr", "-P", "0"])
            .arg("-f")
            .arg(self.dir.join(format!("{daemon}.conf")))
            .arg("-i")
            .arg(self.dir.join(format!("{daemon}.pid")))
            .arg("-z")
            .arg(self.dir.join("zserv.api"))
            .arg("--vty_socket")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {daemon}"))?;
        self.pids.push((daemon, child.id()));
        Ok(child)
    }

    /// `vtysh -c COMMAND` against this instance's daemons.
    pub fn vtysh(&self, command: &str) -> Result<String> {
        let out = sh(Command::new(VTYSH)
            .arg("--vty_socket")
            .arg(&self.dir)
            .arg("-c")
            .arg(command))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn vtysh_json(&self, command: &str) -> Result<serde_json::Value> {
        let text = self.vtysh(command)?;
        serde_json::from_str(&text).with_context(|| format!("{command}: {text}"))
    }
}

impl Router for Frr {
    fn name(&self) -> &'static str {
        "FRR"
    }

    fn established(&self, peer: Ipv4Addr) -> Result<bool> {
        let summary = self.vtysh_json("show bgp ipv4 unicast summary json")?;
        Ok(summary["peers"][peer.to_string()]["state"] == "Established")
    }

    fn session_report(&self, peer: Ipv4Addr) -> Result<String> {
        self.vtysh(&format!("show bgp neighbors {peer} json"))
    }

    fn has_bgp_route(&self, vip: IpAddr) -> Result<bool> {
        let (family, len) = if vip.is_ipv4() {
            ("ipv4", 32)
        } else {
            ("ipv6", 128)
        };
        let v = self.vtysh_json(&format!("show bgp {family} unicast {vip}/{len} json"))?;
        Ok(v["paths"].as_array().is_some_and(|p| !p.is_empty()))
    }

    fn refresh_in(&self, peer: Ipv4Addr) -> Result<String> {
        self.vtysh(&format!("clear bgp ipv4 unicast {peer} soft in"))
    }

    fn crash(&mut self) -> Result<()> {
        if let Some(mut child) = self.bgpd.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    fn start_again(&mut self) -> Result<()> {
        if self.bgpd.is_some() {
            bail!("bgpd is already running");
        }
        let _ = std::fs::remove_file(self.dir.join("bgpd.vty"));
        self.bgpd = Some(self.spawn("bgpd", BGPD)?);
        wait_for(
            "bgpd answering vtysh",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || {
                if let Some(c) = self.bgpd.as_mut()
                    && let Some(status) = c.try_wait()?
                {
                    bail!("bgpd exited ({status})");
                }
                Ok(self.vtysh("show bgp summary json").is_ok())
            },
        )
        .with_context(|| format!("FRR in {}:\n{}", self.ns_name, self.logs()))?;
        Ok(())
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for f in [
            "zebra.out",
            "zebra.log",
            "bfdd.out",
            "bfdd.log",
            "bgpd.out",
            "bgpd.log",
        ] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let _ = writeln!(s, "--- {f}\n{text}");
        }
        s
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        for child in [self.bgpd.take(), self.bfdd.take(), self.zebra.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            stop_child(&mut child, Duration::from_secs(2));
        }
        for (daemon, pid) in &self.pids {
            let _ = std::fs::remove_dir_all(format!("/var/tmp/frr/{daemon}.{pid}"));
        }
        // Only if empty: a system FRR may be using it.
        let _ = std::fs::remove_dir("/var/tmp/frr");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! The single-balancer rig: a client, a router, one balancer and N backends,
//! each in its own network namespace, wired with veth pairs.
//!
//! ```text
//!  client 10.10.1.2 ── router ── 10.10.2.2 lb (lbd, XDP on eth0)
//!                        ├──── 10.10.31.2 be1 (decap, VIP on lo, servers)
//!                        ├──── 10.10.32.2 be2
//!                        └──── ...
//! ```
//!
//! The router sends the VIP to the balancer; the balancer tunnels to the
//! backends through the router; backends answer the client directly.
//! Everything the rig creates (namespaces, pins, processes, files) is
//! removed when it is dropped, also when a test fails.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb::decap::PassProgram;

use crate::{
    netns::{Netns, sh, unique, veth},
    traffic::{Listener, Mode, Servers},
};

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const TCP_PORT: u16 = 80;
pub const UDP_PORT: u16 = 53;
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 10, 1, 2);
pub const LB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 10, 2, 2);
/// MTU of the links between router, balancer and backends: room for the
/// tunnel header on top of the client's 1500. The balancer's `mtu` is set
/// to the rig's infrastructure MTU.
pub const INFRA_MTU: u32 = 1600;

/// Path of a binary built next to the running one (`target/<profile>/`).
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "{name} not found next to {}; build the binaries first (`cargo build --bins`, which `cargo xtask test` does)",
        exe.display()
    )
}

pub fn backend_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 10, 30 + i as u8 + 1, 2)
}

pub struct Backend {
    pub name: String,
    pub addr: Ipv4Addr,
    pub ns: Netns,
    pub(crate) decap_pins: PathBuf,
}

impl Backend {
    /// Where `lbctl decap attach eth0` pins the backend's decap program.
    pub fn decap_pin_dir(&self) -> &Path {
        &self.decap_pins
    }
}

pub struct Rig {
    pub id: String,
    /// Scratch directory: configs, sockets, state, logs.
    pub dir: PathBuf,
    servers: std::collections::BTreeMap<String, Servers>,
    health: std::collections::BTreeMap<String, Listener>,
    pass: Option<PassProgram>,
    pub backends: Vec<Backend>,
    pub client: Netns,
    pub lb: Netns,
    pub router: Netns,
    /// MTU of the router–balancer and router–backend links.
    pub infra_mtu: u32,
}

impl Rig {
    /// Builds the rig with `n` backends, decap attached, each running the
    /// TCP and UDP test servers as threads of this process.
    pub fn new(n: usize) -> Result<Rig> {
        let mut rig = Self::without_servers(n)?;
        let names: Vec<String> = rig.backends.iter().map(|b| b.name.clone()).collect();
        for name in names {
            rig.start_server(&name, Mode::Echo)?;
        }
        Ok(rig)
    }

    /// Builds the rig with `n` backends, decap attached, no servers.
    pub fn without_servers(n: usize) -> Result<Rig> {
        Self::with_infra_mtu(n, INFRA_MTU)
    }

    /// As [`without_servers`](Self::without_servers), with `infra_mtu` on
    /// the links behind the router (1500: no room for the tunnel header).
    pub fn with_infra_mtu(n: usize, infra_mtu: u32) -> Result<Rig> {
        Self::build(n, infra_mtu, true)
    }

    /// The rig wired but with its backends' side of direct server return
    /// left undone: no VIP on `lo`, no `rp_filter` settings, no decap
    /// program, no servers. For testing what sets a backend up
    /// (`scripts/lb-backend-setup`); start servers with
    /// [`start_server`](Self::start_server) once the VIP is there.
    pub fn without_backend_setup(n: usize) -> Result<Rig> {
        Self::build(n, INFRA_MTU, false)
    }

    fn build(n: usize, infra_mtu: u32, set_up_backends: bool) -> Result<Rig> {
        require_root()?;
        let id = unique("lbt");
        let dir = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&dir)?;
        let router = Netns::new(&format!("{id}-rt"))?;
        let client = Netns::new(&format!("{id}-cl"))?;
        let lb = Netns::new(&format!("{id}-lb"))?;
        let mut rig = Rig {
            id: id.clone(),
            dir,
            servers: Default::default(),
            health: Default::default(),
            pass: None,
            backends: Vec::new(),
            client,
            lb,
            router,
            infra_mtu,
        };
        for i in 0..n {
            let ns = Netns::new(&format!("{id}-be{}", i + 1))?;
            let decap_pins = PathBuf::from(format!("/sys/fs/bpf/lb/decap/{}-eth0", ns.inode()?));
            rig.backends.push(Backend {
                name: format!("be{}", i + 1),
                addr: backend_addr(i),
                ns,
                decap_pins,
            });
        }
        rig.wire(set_up_backends).context("wiring the rig")?;
        Ok(rig)
    }

    fn wire(&mut self, set_up_backends: bool) -> Result<()> {
        let r = &self.router;
        r.sysctl("net.ipv4.ip_forward", "1")?;
        r.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        r.sysctl("net.ipv4.conf.default.rp_filter", "0")?;

        veth(&self.client, "eth0", r, "r-cl", 1500)?;
        self.client
            .ip(&["addr", "add", "10.10.1.2/24", "dev", "eth0"])?;
        self.client
            .ip(&["route", "add", "default", "via", "10.10.1.1"])?;
        r.ip(&["addr", "add", "10.10.1.1/24", "dev", "r-cl"])?;
        // The balancer forwards the client's frames as they are: make the
        // client compute its TCP/UDP checksums (a veth would leave them to
        // an offload that no longer happens once the frame is tunnelled).
        self.client.run("ethtool", &["-K", "eth0", "tx", "off"])?;

        veth(&self.lb, "eth0", r, "r-lb", self.infra_mtu)?;
        self.lb
            .ip(&["addr", "add", "10.10.2.2/24", "dev", "eth0"])?;
        self.lb
            .ip(&["route", "add", "default", "via", "10.10.2.1"])?;
        r.ip(&["addr", "add", "10.10.2.1/24", "dev", "r-lb"])?;
        r.ip(&["route", "add", &format!("{VIP}/32"), "via", "10.10.2.2"])?;
        // veth quirk: XDP_TX frames reach the peer only if it runs XDP too.
        self.pass = Some(
            r.within(|| PassProgram::attach("r-lb"))?
                .context("attaching the pass program to the router's side of the balancer link")?,
        );

        for (i, b) in self.backends.iter().enumerate() {
            let net = 30 + i + 1;
            veth(&b.ns, "eth0", r, &format!("r-be{}", i + 1), self.infra_mtu)?;
            b.ns.ip(&["addr", "add", &format!("10.10.{net}.2/24"), "dev", "eth0"])?;
            b.ns.ip(&["route", "add", "default", "via", &format!("10.10.{net}.1")])?;
            r.ip(&[
                "addr",
                "add",
                &format!("10.10.{net}.1/24"),
                "dev",
                &format!("r-be{}", i + 1),
            ])?;
            if set_up_backends {
                set_up_backend(b)?;
            }
        }
        Ok(())
    }

    /// Everything this rig created, for removing it later from another
    /// process (`lb-demo --down`): one path or name per line.
    pub fn inventory(&self) -> Vec<String> {
        let mut lines = vec![
            format!("dir {}", self.dir.display()),
            format!("pins {}", self.pin_dir().display()),
        ];
        for b in &self.backends {
            lines.push(format!("pins {}", b.decap_pins.display()));
        }
        for ns in [&self.client, &self.lb, &self.router] {
            lines.push(format!("netns {}", ns.name));
        }
        for b in &self.backends {
            lines.push(format!("netns {}", b.ns.name));
        }
        lines
    }

    /// Leaves the rig in place (namespaces, pins, attached programs) and
    /// returns its inventory. The router's pass program stays attached by
    /// pinning its link under the scratch directory's pins.
    pub fn keep(mut self) -> Result<Vec<String>> {
        if let Some(pass) = self.pass.take() {
            let dir = PathBuf::from(format!("/sys/fs/bpf/lb/pass-{}", self.id));
            pass.pin(&dir)?;
        }
        let mut inventory = self.inventory();
        inventory.push(format!("pins /sys/fs/bpf/lb/pass-{}", self.id));
        self.servers.clear();
        // Disarm every guard: the namespaces outlive this process.
        let Rig {
            client,
            lb,
            router,
            backends,
            ..
        } = &mut self;
        for ns in [client, lb, router] {
            ns.forget();
        }
        for b in backends.iter_mut() {
            b.ns.forget();
        }
        std::mem::forget(self);
        Ok(inventory)
    }

    /// Removes what an [`inventory`](Self::inventory) lists.
    pub fn remove_inventory(lines: &[String]) {
        for line in lines {
            match line.split_once(' ') {
                Some(("netns", name)) => {
                    let _ = crate::netns::ip(&["netns", "del", name]);
                }
                Some(("pins", path)) | Some(("dir", path)) => {
                    let _ = std::fs::remove_dir_all(path);
                }
                _ => {}
            }
        }
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb/decap"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb"));
    }

    /// (Re)starts backend `name`'s TCP and UDP servers.
    pub fn start_server(&mut self, name: &str, mode: Mode) -> Result<()> {
        self.servers.remove(name);
        let path = self.backend(name).ns.path();
        let servers = Servers::start_mode(
            &path,
            name,
            TCP_PORT,
            SocketAddrV4::new(VIP, UDP_PORT),
            mode,
        )?;
        self.servers.insert(name.to_string(), servers);
        Ok(())
    }

    /// Stops backend `name`'s servers: connections to them are refused.
    pub fn stop_server(&mut self, name: &str) {
        self.servers.remove(name);
    }

    /// Starts a bare listener on `port` in backend `name` (a health
    /// endpoint separate from the service).
    pub fn start_health_port(&mut self, name: &str, port: u16) -> Result<()> {
        self.health.remove(name);
        let l = Listener::start(&self.backend(name).ns.path(), port)?;
        self.health.insert(name.to_string(), l);
        Ok(())
    }

    pub fn stop_health_port(&mut self, name: &str) {
        self.health.remove(name);
    }

    pub fn tcp_vip(&self) -> SocketAddrV4 {
        SocketAddrV4::new(VIP, TCP_PORT)
    }

    pub fn udp_vip(&self) -> SocketAddrV4 {
        SocketAddrV4::new(VIP, UDP_PORT)
    }

    /// The backend with this name.
    pub fn backend(&self, name: &str) -> &Backend {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backend {name}"))
    }

    /// A balancer configuration for this rig: `weights[i]` for backend i,
    /// `None` leaves a backend out (it still serves, for adding later).
    pub fn config(&self, weights: &[Option<u32>]) -> String {
        self.config_with(weights, "")
    }

    /// As [`config`](Self::config), with `tcp_extra` (YAML lines indented
    /// by four spaces) added to the TCP VIP: health checks, slow start...
    pub fn config_with(&self, weights: &[Option<u32>], tcp_extra: &str) -> String {
        let backends: String = self
            .backends
            .iter()
            .zip(weights)
            .filter_map(|(b, w)| {
                w.map(|w| format!("      - address: {}\n        weight: {w}\n", b.addr))
            })
            .collect();
        let udp_backends: String = self
            .backends
            .iter()
            .zip(weights)
            .filter_map(|(b, w)| w.map(|_| format!("      - address: {}\n", b.addr)))
            .collect();
        format!(
            "instance: {id}\ninterfaces: [eth0]\nxdp_mode: native\ngateway_mac: auto\nouter_source_v4: {LB_ADDR}\nmtu: {mtu}\ntable_size: 65537\nconntrack_buckets: 65536\napi_socket: {dir}/lbd.sock\nstate_file: {dir}/state.json\nvips:\n  - address: {VIP}\n    port: {TCP_PORT}\n    protocol: tcp\n{tcp_extra}    backends:\n{backends}  - address: {VIP}\n    port: {UDP_PORT}\n    protocol: udp\n    backends:\n{udp_backends}",
            id = self.id,
            dir = self.dir.display(),
            mtu = self.infra_mtu,
        )
    }

    pub fn pin_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf/lb").join(&self.id)
    }
}

/// A backend's side of direct server return: the VIP on `lo`, `rp_filter`
/// off, lb's decap program on `eth0`.
fn set_up_backend(b: &Backend) -> Result<()> {
    b.ns.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
    b.ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
    b.ns.sysctl("net.ipv4.conf.eth0.rp_filter", "0")?;
    let lbctl = bin_path("lbctl")?;
    sh(b.ns
        .command(&lbctl)
        .args(["decap", "attach", "eth0", "--from-any"]))
    .with_context(|| format!("lbctl decap attach in {}", b.name))?;
    Ok(())
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.servers.clear();
        self.health.clear();
        self.pass = None;
        for b in &self.backends {
            let _ = std::fs::remove_dir_all(&b.decap_pins);
        }
        let _ = std::fs::remove_dir_all(self.pin_dir());
        // Leave no empty directories behind either.
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb/decap"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb"));
        let _ = std::fs::remove_dir_all(&self.dir);
        // Namespaces go with the fields.
    }
}

pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("namespace rigs need root (network namespaces, XDP): run `cargo xtask test` as root");
    }
    Ok(())
}

/// How to run `lbd`: which binary, under which wrapper command (e.g.
/// `setpriv` with a capability set), if any.
pub struct LbdCommand {
    pub program: PathBuf,
    pub wrapper: Vec<String>,
}

impl LbdCommand {
    /// The `lbd` built next to the running binary, run directly.
    pub fn built() -> Result<LbdCommand> {
        Ok(LbdCommand {
            program: bin_path("lbd")?,
            wrapper: Vec::new(),
        })
    }
}

/// How long a starting `lbd` may take to answer before a test gives up, at
/// least; see [`start_deadline`].
const START_DEADLINE: Duration = Duration::from_secs(180);

/// The longest start of an `lbd` this test process has seen, in ms.
static LONGEST_START_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The safety net of a start: [`START_DEADLINE`], or ten times the
/// longest start seen so far in this process when that is longer. A
/// restart adopts every table and takes two to four times a first start;
/// under emulation on a loaded machine a first start took 31 s and the
/// restart after it more than 180 s (the 6.12 guest of a CI-like run under
/// stress-ng), so a fixed bound refused a slow machine, not a slow `lbd`.
fn start_deadline() -> Duration {
    let longest = LONGEST_START_MS.load(std::sync::atomic::Ordering::Relaxed);
    START_DEADLINE.max(Duration::from_millis(longest.saturating_mul(10)))
}

/// A running `lbd`, killed when dropped.
pub struct Lbd {
    child: Option<Child>,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Lbd {
    /// Starts `lbd --config <config>` inside the rig's balancer namespace and
    /// waits until it answers on the socket the configuration names.
    pub fn start(rig: &Rig, config: &Path) -> Result<Lbd> {
        Self::start_in(&rig.lb, &rig.dir, config)
    }

    /// Starts `lbd` in namespace `ns`, logging to `dir/lbd.log`.
    pub fn start_in(ns: &Netns, dir: &Path, config: &Path) -> Result<Lbd> {
        Self::start_with_env(ns, dir, config, &[])
    }

    /// As [`start_in`](Self::start_in), with extra environment variables
    /// (systemd's `NOTIFY_SOCKET`, ...).
    pub fn start_with_env(
        ns: &Netns,
        dir: &Path,
        config: &Path,
        env: &[(&str, String)],
    ) -> Result<Lbd> {
        Self::start_with(ns, dir, config, &LbdCommand::built()?, env)
    }

    /// As [`start_with_env`](Self::start_with_env), running `how`'s binary
    /// under its wrapper.
    pub fn start_with(
        ns: &Netns,
        dir: &Path,
        config: &Path,
        how: &LbdCommand,
        env: &[(&str, String)],
    ) -> Result<Lbd> {
        let socket = lb::config::Config::load(config)?.api_socket;
        let log = dir.join("lbd.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut command = match how.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = ns.command(program);
                c.args(args).arg(&how.program);
                c
            }
            None => ns.command(&how.program),
        };
        let child = command
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting lbd")?;
        let mut lbd = Lbd {
            child: Some(child),
            config: config.into(),
            socket,
            log,
        };
        lbd.wait_ready()?;
        Ok(lbd)
    }

    /// Waits until `lbd` answers on its socket. The deadline is only a
    /// safety net (a start verifies two programs and adopts or writes
    /// every table: seconds here, minutes under emulation or heavy load);
    /// the time taken is printed.
    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let limit = start_deadline();
        let deadline = started + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "lbd exited during start-up ({status}):\n{}",
                    self.log_text()
                );
            }
            if lb::api::call(&self.socket, &lb::api::Request::Status).is_ok() {
                let ms = started.elapsed().as_millis() as u64;
                LONGEST_START_MS.fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "lbd answered {:.2} s after it was started",
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "lbd did not answer within {} s:\n{}",
            limit.as_secs(),
            self.log_text()
        )
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// `kill -9`: the process dies, its pinned program and maps stay.
    pub fn kill9(mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Waits up to `limit` for the process to exit; `None` if it is still
    /// running then.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + limit;
        let Some(child) = self.child.as_mut() else {
            bail!("lbd was not running");
        };
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a signal.
    pub fn signal(&self, sig: libc::c_int) -> Result<()> {
        if self.child.is_none() {
            // pid 0 would signal our whole process group.
            bail!("lbd is not running");
        }
        // SAFETY: kill(2) on our own child's pid.
        if unsafe { libc::kill(self.pid() as libc::pid_t, sig) } != 0 {
            bail!("kill: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Runs `lbctl --socket <socket> ARGS...` and returns its stdout; fails
    /// with its stderr.
    pub fn lbctl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "lbctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if args.windows(2).any(|w| w == ["-o", "json"]) {
            crate::schema::check_output(args, &stdout)?;
        }
        Ok(stdout)
    }

    /// `lbctl -o json ARGS...`, parsed.
    pub fn lbctl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let text = self.lbctl(&all)?;
        serde_json::from_str(&text).with_context(|| format!("lbctl output: {text}"))
    }

    /// `lbctl -o json ARGS...`, which must be refused by `lbd`: the
    /// refusal it prints on stdout (`ok`, `code`, `error`), parsed.
    pub fn lbctl_refusal(&self, args: &[&str]) -> Result<serde_json::Value> {
        let out = Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&self.socket)
            .args(["-o", "json"])
            .args(args)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            bail!("lbctl {} was not refused: {text}", args.join(" "));
        }
        let refusal = serde_json::from_str(&text).with_context(|| {
            format!(
                "lbctl {} printed no refusal: {text} {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        crate::schema::check_refusal(&refusal)?;
        Ok(refusal)
    }

    /// `lbctl simulate` for a new client connection (a SYN from `CLIENT`
    /// port `sport`) to the TCP VIP, parsed.
    pub fn simulate_syn(&self, sport: u16) -> Result<serde_json::Value> {
        self.lbctl_json(&[
            "simulate",
            &format!("{VIP}:80/tcp"),
            &format!("{CLIENT}:{sport}"),
            "--syn",
        ])
    }

    /// `lbctl ARGS...` for `lbctl diff`, which exits as diff(1) does: 0
    /// (no change) or 1 (changes), with its output; any other exit is an
    /// error.
    pub fn lbctl_diff(&self, args: &[&str]) -> Result<(bool, String)> {
        let out = Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if matches!(out.status.code(), Some(0 | 1)) && args.windows(2).any(|w| w == ["-o", "json"])
        {
            crate::schema::check_output(args, &text)?;
        }
        match out.status.code() {
            Some(0) => Ok((false, text)),
            Some(1) => Ok((true, text)),
            code => bail!(
                "lbctl {} exited {code:?}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    /// The balancer's counter `name` (packets).
    pub fn counter(&self, name: &str) -> Result<u64> {
        let stats = self.lbctl_json(&["stats"])?;
        stats["counters"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .and_then(|c| c["packets"].as_u64())
            .with_context(|| format!("no counter {name} in {stats}"))
    }
}

impl Drop for Lbd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

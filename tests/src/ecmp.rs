//! The active-active rig: a client, a router running a real BGP daemon
//! (BIRD 2 with `merge paths`, or FRR) that spreads the VIP's flows over
//! the balancers by ECMP, N balancers each running `lbd` with its own
//! address and a BGP session to the router, and M backends.
//!
//! ```text
//!  client 10.10.1.2 ── router ──┬── 10.98.1.2 lb1 (lbd: XDP on eth0, BGP)
//!                     (BGP,     ├── 10.98.2.2 lb2
//!                      ECMP)    ├── 10.10.31.2 be1 (decap, VIP on lo, servers)
//!                               └── ...
//! ```
//!
//! The router learns the VIP only from the balancers' announcements; its
//! kernel hashes each flow on its 5-tuple (`fib_multipath_hash_policy=1`)
//! to one of the announcing balancers. Backends answer the client directly
//! (the router's `rp_filter` is off: replies come from the VIP, whose route
//! points at the balancers). Each balancer's `lbd` runs under a guard the
//! test owns ([`Lbd`]); everything else the rig creates (namespaces, the
//! router daemon, pins, servers, files) is removed when it is dropped,
//! also when a test fails. [`rig`](crate::rig) is the single-balancer
//! sibling without a router daemon.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use lb::decap::PassProgram;

use crate::{
    netns::{Netns, sh, unique, veth},
    rig::{
        Backend, CLIENT, INFRA_MTU, Lbd, TCP_PORT, UDP_PORT, VIP, backend_addr, bin_path,
        require_root,
    },
    routers::{
        Bird, Frr, HOLD_TIME, ROUTER_AS, Router, RouterKind, RouterPeer, RouterSpec, SPEAKER_AS,
    },
    traffic::{Mode, Servers, Stream},
};

/// Balancer `i`'s (from 1) address on its link to the router.
pub fn balancer_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 98, i as u8, 2)
}

/// The router's address on balancer `i`'s link.
pub fn router_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 98, i as u8, 1)
}

/// One balancer namespace.
pub struct Balancer {
    /// `lb1`, `lb2`...
    pub name: String,
    pub ns: Netns,
    pub addr: Ipv4Addr,
    /// `lbd`'s instance name (pins under `/sys/fs/bpf/lb/<instance>`).
    pub instance: String,
    /// Its configuration, socket, state and log.
    pub dir: PathBuf,
}

impl Balancer {
    pub fn pin_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf/lb").join(&self.instance)
    }
}

pub struct EcmpRig {
    pub id: String,
    pub kind: RouterKind,
    /// Scratch directory; removed last.
    pub dir: PathBuf,
    router_daemon: Option<Box<dyn Router>>,
    servers: BTreeMap<String, Servers>,
    passes: Vec<PassProgram>,
    pub balancers: Vec<Balancer>,
    pub backends: Vec<Backend>,
    pub client: Netns,
    pub router: Netns,
    /// Lines added to every balancer's `announce.bgp` (4 spaces in), and
    /// to its peer's flow mapping (`, bfd: {}`).
    pub speaker_extra: String,
    pub peer_extra: String,
    /// The hold time both sides offer, in seconds (the router's spec's).
    hold_time: u16,
}

impl EcmpRig {
    /// Builds the rig with `balancers` balancers (no `lbd` yet), `backends`
    /// backends running the test servers behind the decap program, and a
    /// router daemon of `kind` peering with every balancer. The router
    /// drops a balancer's session as soon as its link goes down.
    pub fn new(balancers: usize, backends: usize, kind: RouterKind) -> Result<EcmpRig> {
        Self::new_with(balancers, backends, kind, true, &|_| {})
    }

    /// As [`new`](Self::new); `check_link`: the router drops a session
    /// when its link loses carrier; `router` edits the router's
    /// configuration (BFD, policies).
    pub fn new_with(
        balancers: usize,
        backends: usize,
        kind: RouterKind,
        check_link: bool,
        edit_router: &dyn Fn(&mut RouterSpec),
    ) -> Result<EcmpRig> {
        require_root()?;
        let daemons: &[&str] = match kind {
            RouterKind::Bird => &[crate::routers::BIRD, crate::routers::BIRDC],
            RouterKind::Frr => &[
                crate::routers::ZEBRA,
                crate::routers::BGPD,
                crate::routers::VTYSH,
            ],
        };
        crate::routers::require(daemons)?;
        let id = unique("lbe");
        let dir = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&dir)?;
        let router = Netns::new(&format!("{id}-rt"))?;
        let client = Netns::new(&format!("{id}-cl"))?;
        let mut rig = EcmpRig {
            id: id.clone(),
            kind,
            dir,
            router_daemon: None,
            servers: BTreeMap::new(),
            passes: Vec::new(),
            balancers: Vec::new(),
            backends: Vec::new(),
            client,
            router,
            speaker_extra: String::new(),
            peer_extra: String::new(),
            hold_time: HOLD_TIME,
        };
        for i in 1..=balancers {
            let name = format!("lb{i}");
            let dir = rig.dir.join(&name);
            std::fs::create_dir_all(&dir)?;
            rig.balancers.push(Balancer {
                ns: Netns::new(&format!("{id}-{name}"))?,
                addr: balancer_addr(i),
                instance: format!("{id}-{name}"),
                dir,
                name,
            });
        }
        for i in 0..backends {
            let ns = Netns::new(&format!("{id}-be{}", i + 1))?;
            let decap_pins = PathBuf::from(format!("/sys/fs/bpf/lb/decap/{}-eth0", ns.inode()?));
            rig.backends.push(Backend {
                name: format!("be{}", i + 1),
                addr: backend_addr(i),
                ns,
                decap_pins,
            });
        }
        rig.wire().context("wiring the ECMP rig")?;
        let mut spec = RouterSpec {
            router_id: router_addr(1),
            check_link,
            bfd: false,
            graceful_shutdown_policy: false,
            ipv4_only: false,
            hold_time: HOLD_TIME,
            peers: (1..=balancers)
                .map(|i| RouterPeer {
                    name: format!("lb{i}"),
                    local: router_addr(i),
                    address: balancer_addr(i),
                    password: None,
                    ttl_security: false,
                })
                .collect(),
        };
        edit_router(&mut spec);
        rig.hold_time = spec.hold_time;
        rig.router_daemon = Some(match kind {
            RouterKind::Bird => Box::new(Bird::start(&rig.router, &rig.dir, &spec)?),
            RouterKind::Frr => Box::new(Frr::start(&rig.router, &rig.dir, &spec)?),
        });
        let names: Vec<String> = rig.backends.iter().map(|b| b.name.clone()).collect();
        for name in names {
            rig.start_server(&name)?;
        }
        Ok(rig)
    }

    fn wire(&mut self) -> Result<()> {
        let r = &self.router;
        r.sysctl("net.ipv4.ip_forward", "1")?;
        r.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
        r.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
        // Hash forwarded flows on their 5-tuple: with the default (L3 only)
        // every flow of one client would go to one balancer.
        r.sysctl("net.ipv4.fib_multipath_hash_policy", "1")?;

        veth(&self.client, "eth0", r, "r-cl", 1500)?;
        self.client
            .ip(&["addr", "add", "10.10.1.2/24", "dev", "eth0"])?;
        self.client
            .ip(&["route", "add", "default", "via", "10.10.1.1"])?;
        r.ip(&["addr", "add", "10.10.1.1/24", "dev", "r-cl"])?;
        // The balancers forward the client's frames as they are: the
        // client must compute its own checksums (see rig.rs).
        self.client.run("ethtool", &["-K", "eth0", "tx", "off"])?;

        for (i, lb) in self.balancers.iter().enumerate() {
            let i = i + 1;
            let r_if = format!("r-lb{i}");
            veth(&lb.ns, "eth0", r, &r_if, INFRA_MTU)?;
            lb.ns
                .ip(&["addr", "add", &format!("{}/24", lb.addr), "dev", "eth0"])?;
            lb.ns.ip(&[
                "route",
                "add",
                "default",
                "via",
                &router_addr(i).to_string(),
            ])?;
            r.ip(&[
                "addr",
                "add",
                &format!("{}/24", router_addr(i)),
                "dev",
                &r_if,
            ])?;
            // veth quirk: XDP_TX frames reach the peer only if it runs XDP.
            let attach = r_if.clone();
            self.passes.push(
                r.within(move || PassProgram::attach(&attach))?
                    .with_context(|| format!("attaching the pass program to {r_if}"))?,
            );
        }

        let lbctl = bin_path("lbctl")?;
        // Tunnels only from the balancers and (second chance) the backends.
        let mut from = vec!["--from".to_string(), "10.98.0.0/16".to_string()];
        for i in 0..self.backends.len() {
            from.extend(["--from".to_string(), format!("{}/32", backend_addr(i))]);
        }
        for (i, b) in self.backends.iter().enumerate() {
            let net = 30 + i + 1;
            let r_if = format!("r-be{}", i + 1);
            veth(&b.ns, "eth0", r, &r_if, INFRA_MTU)?;
            // A backend that hands a second-chance packet on sends it back
            // with XDP_TX: the same veth quirk.
            let attach = r_if.clone();
            self.passes.push(
                r.within(move || PassProgram::attach(&attach))?
                    .with_context(|| format!("attaching the pass program to {r_if}"))?,
            );
            b.ns.ip(&["addr", "add", &format!("10.10.{net}.2/24"), "dev", "eth0"])?;
            b.ns.ip(&["route", "add", "default", "via", &format!("10.10.{net}.1")])?;
            r.ip(&["addr", "add", &format!("10.10.{net}.1/24"), "dev", &r_if])?;
            b.ns.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
            b.ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            b.ns.sysctl("net.ipv4.conf.eth0.rp_filter", "0")?;
            sh(b.ns
                .command(&lbctl)
                .args(["decap", "attach", "eth0"])
                .args(&from))
            .with_context(|| format!("lbctl decap attach in {}", b.name))?;
        }
        Ok(())
    }

    /// The router daemon (BIRD or FRR).
    pub fn router_daemon(&self) -> &dyn Router {
        self.router_daemon
            .as_deref()
            .expect("started in EcmpRig::new")
    }

    /// Balancer `i` (from 1).
    pub fn balancer(&self, i: usize) -> &Balancer {
        &self.balancers[i - 1]
    }

    /// `lbd`'s configuration for balancer `i`: the same VIPs and backends
    /// on every balancer (TCP 80 and UDP 53 on one address, each with
    /// `vip_extra`: YAML lines indented by four spaces), its own
    /// addresses, and a BGP session to the router (the rig's hold time,
    /// [`HOLD_TIME`] unless the router's spec says otherwise);
    /// `top_extra` adds top-level settings.
    pub fn lbd_config(&self, i: usize, vip_extra: &str, top_extra: &str) -> String {
        let backends: String = self
            .backends
            .iter()
            .map(|b| format!("      - address: {}\n", b.addr))
            .collect();
        self.lbd_config_for(i, &backends, vip_extra, vip_extra, top_extra)
    }

    /// As [`lbd_config`](Self::lbd_config), with the TCP VIP's own extra
    /// lines (`tcp_extra`) and only backends `weights` (backend index from
    /// 0, weight), for both VIPs.
    pub fn lbd_config_weighted(
        &self,
        i: usize,
        weights: &[(usize, u32)],
        tcp_extra: &str,
        top_extra: &str,
    ) -> String {
        let backends: String = weights
            .iter()
            .map(|(b, w)| {
                format!(
                    "      - address: {}\n        weight: {w}\n",
                    self.backends[*b].addr
                )
            })
            .collect();
        self.lbd_config_for(i, &backends, tcp_extra, "", top_extra)
    }

    fn lbd_config_for(
        &self,
        i: usize,
        backends: &str,
        tcp_extra: &str,
        udp_extra: &str,
        top_extra: &str,
    ) -> String {
        let lb = self.balancer(i);
        format!(
            "instance: {instance}\ninterfaces: [eth0]\nxdp_mode: native\ngateway_mac: auto\nouter_source_v4: {addr}\nmtu: {INFRA_MTU}\ntable_size: 65537\nconntrack_buckets: 65536\napi_socket: {dir}/lbd.sock\nstate_file: {dir}/state.json\n{top_extra}announce:\n  bgp:\n    local_as: {SPEAKER_AS}\n    router_id: {addr}\n    hold_time: {hold}s\n    connect_retry: {{ initial: 200ms, max: 1s }}\n{speaker}    peers:\n      - {{ address: {router}, remote_as: {ROUTER_AS}, local_address: {addr}{peer} }}\nvips:\n  - address: {VIP}\n    port: {TCP_PORT}\n    protocol: tcp\n{tcp_extra}    backends:\n{backends}  - address: {VIP}\n    port: {UDP_PORT}\n    protocol: udp\n{udp_extra}    backends:\n{backends}",
            instance = lb.instance,
            addr = lb.addr,
            router = router_addr(i),
            dir = lb.dir.display(),
            speaker = self.speaker_extra,
            peer = self.peer_extra,
            hold = self.hold_time,
        )
    }

    /// Writes `config` for balancer `i` and starts its `lbd`.
    pub fn start_lbd(&self, i: usize, config: &str) -> Result<Lbd> {
        let lb = self.balancer(i);
        let path = lb.dir.join("lbd.yaml");
        std::fs::write(&path, config)?;
        Lbd::start_in(&lb.ns, &lb.dir, &path)
    }

    /// The next hops of the VIP's route that the router daemon installed
    /// in the router's kernel (not a static route), sorted.
    pub fn next_hops(&self) -> Result<Vec<IpAddr>> {
        let proto = match self.kind {
            RouterKind::Bird => "bird",
            RouterKind::Frr => "bgp",
        };
        let out = self
            .router
            .ip(&["-4", "route", "show", &format!("{VIP}/32"), "proto", proto])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = text.split_whitespace().collect();
        let mut hops: Vec<IpAddr> = words
            .windows(2)
            .filter(|w| w[0] == "via")
            .filter_map(|w| w[1].parse().ok())
            .collect();
        hops.sort();
        Ok(hops)
    }

    /// Waits until the router's VIP route goes via exactly balancers
    /// `want` (none: no route); returns how long that took. Polls every
    /// 5 ms.
    pub fn wait_hops(&self, what: &str, want: &[usize], limit: Duration) -> Result<Duration> {
        let hops = Self::hops_of(want);
        crate::routers::wait_for(what, limit, Duration::from_millis(5), || {
            Ok(self.next_hops()? == hops)
        })
        .with_context(|| format!("router has {:?}\n{}", self.next_hops(), self.logs()))
    }

    /// The next hops balancers `which` (from 1) would be, sorted.
    pub fn hops_of(which: &[usize]) -> Vec<IpAddr> {
        let mut hops: Vec<IpAddr> = which.iter().map(|&i| balancer_addr(i).into()).collect();
        hops.sort();
        hops
    }

    /// A static route to the VIP through balancer `i`, worse than any BGP
    /// route (metric 1000): the path packets still take once the balancer
    /// withdrew its announcement, standing in for what a real network
    /// offers (other balancers, a backstop route). Single-balancer tests
    /// use it to show that a withdrawn balancer keeps forwarding.
    pub fn add_fallback_route(&self, i: usize) -> Result<()> {
        self.router.ip(&[
            "route",
            "add",
            &format!("{VIP}/32"),
            "via",
            &balancer_addr(i).to_string(),
            "metric",
            "1000",
        ])?;
        Ok(())
    }

    /// Balancer `i`'s link goes silent, carrier up (a dead box behind a
    /// switch, a cut fibre in one direction beyond it): the router drops
    /// every frame from and to it (nftables in the router's namespace,
    /// after its XDP program), so neither BGP nor BFD gets through.
    pub fn silence(&self, i: usize) -> Result<()> {
        let dev = format!("r-lb{i}");
        let rules = format!(
            "table netdev lbsilence{i} {{\n chain in {{ type filter hook ingress device \"{dev}\" priority 0; policy drop; }}\n chain out {{ type filter hook egress device \"{dev}\" priority 0; policy drop; }}\n}}\n"
        );
        let path = self.dir.join(format!("silence{i}.nft"));
        std::fs::write(&path, rules)?;
        sh(self.router.command("nft").arg("-f").arg(&path))?;
        Ok(())
    }

    /// Undoes [`silence`](Self::silence).
    pub fn unsilence(&self, i: usize) -> Result<()> {
        sh(self.router.command("nft").args([
            "delete",
            "table",
            "netdev",
            &format!("lbsilence{i}"),
        ]))?;
        Ok(())
    }

    /// `nft` rules in the router's namespace, from a file written here.
    pub fn router_nft(&self, name: &str, rules: &str) -> Result<()> {
        let path = self.dir.join(format!("{name}.nft"));
        std::fs::write(&path, rules)?;
        sh(self.router.command("nft").arg("-f").arg(&path))?;
        Ok(())
    }

    /// Balancer `i` dies: its router-facing link goes down first (nothing
    /// it says reaches the router any more), then `lbd` is killed with
    /// SIGKILL and its pinned state (program, connection table) is gone,
    /// as after a power loss.
    pub fn power_off(&self, i: usize, lbd: Lbd) -> Result<()> {
        let lb = self.balancer(i);
        lb.ns.ip(&["link", "set", "eth0", "down"])?;
        lbd.kill9()?;
        std::fs::remove_dir_all(lb.pin_dir())
            .with_context(|| format!("removing {}", lb.pin_dir().display()))?;
        Ok(())
    }

    /// Balancer `i` boots again: link up, default route back (a downed
    /// link takes its routes with it). `lbd` is for the test to start.
    pub fn power_on(&self, i: usize) -> Result<()> {
        let lb = self.balancer(i);
        lb.ns.ip(&["link", "set", "eth0", "up"])?;
        lb.ns.ip(&[
            "route",
            "replace",
            "default",
            "via",
            &router_addr(i).to_string(),
        ])?;
        Ok(())
    }

    /// (Re)starts backend `name`'s TCP and UDP servers.
    pub fn start_server(&mut self, name: &str) -> Result<()> {
        self.servers.remove(name);
        let path = self.backend(name).ns.path();
        let servers = Servers::start_mode(
            &path,
            name,
            TCP_PORT,
            SocketAddrV4::new(VIP, UDP_PORT),
            Mode::Echo,
        )?;
        self.servers.insert(name.to_string(), servers);
        Ok(())
    }

    /// Stops backend `name`'s servers: connections to them are refused.
    pub fn stop_server(&mut self, name: &str) {
        self.servers.remove(name);
    }

    pub fn backend(&self, name: &str) -> &Backend {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backend {name}"))
    }

    pub fn tcp_vip(&self) -> SocketAddrV4 {
        SocketAddrV4::new(VIP, TCP_PORT)
    }

    /// Long-lived connections from the client, one per source port, a
    /// round trip every `every`, each waiting up to `patience` for an
    /// answer (TCP retransmits through a failover).
    pub fn streams(
        &self,
        ports: std::ops::Range<u16>,
        every: Duration,
        patience: Duration,
    ) -> Result<Vec<Stream>> {
        ports
            .map(|p| Stream::start_with(&self.client, CLIENT, p, self.tcp_vip(), every, patience))
            .collect()
    }

    /// Router daemon logs and every balancer's `lbd` log, for failures.
    pub fn logs(&self) -> String {
        let mut s = self
            .router_daemon
            .as_ref()
            .map(|r| r.logs())
            .unwrap_or_default();
        for lb in &self.balancers {
            let log = std::fs::read_to_string(lb.dir.join("lbd.log")).unwrap_or_default();
            s.push_str(&format!("--- {} lbd.log\n{log}\n", lb.name));
        }
        s
    }
}

impl Drop for EcmpRig {
    fn drop(&mut self) {
        self.router_daemon = None;
        self.servers.clear();
        self.passes.clear();
        for lb in &self.balancers {
            let _ = std::fs::remove_dir_all(lb.pin_dir());
        }
        for b in &self.backends {
            let _ = std::fs::remove_dir_all(&b.decap_pins);
        }
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb/decap"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/bpf/lb"));
        let _ = std::fs::remove_dir_all(&self.dir);
        // Namespaces go with the fields.
    }
}

/// Fails unless `hops` are what the router has for the VIP now.
pub fn expect_hops(rig: &EcmpRig, want: &[usize]) -> Result<()> {
    let got = rig.next_hops()?;
    if got != EcmpRig::hops_of(want) {
        bail!("the router's VIP route goes via {got:?}, expected balancers {want:?}");
    }
    Ok(())
}

//! The built-in speaker's configuration: who we are (AS, router id), the
//! timers we offer, and the routers we connect to, with their keys, GTSM
//! and next hops. Deserialized from the `announce.bgp` section of `lbd`'s
//! YAML (unknown fields are errors) and checked by
//! [`BgpConfig::validate`] (and [`BgpConfig::check_files`] for key files).
//! The speaker itself is `crate::announce::bgp`.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::config::{
    duration,
    error::{ConfigError, problem},
};

/// The 2-octet AS number that stands for a 4-octet one (RFC 6793).
pub const AS_TRANS: u32 = 23456;
/// The BGP port.
pub const BGP_PORT: u16 = 179;
/// Longest TCP MD5 key (RFC 2385; the kernel's `TCP_MD5SIG_MAXKEYLEN`).
pub const MD5_MAX_KEY: usize = 80;

/// ```yaml
/// local_as: 65001
/// router_id: 10.0.0.11
/// hold_time: 9s            # offered; the session uses min(ours, theirs)
/// connect_retry: { initial: 1s, max: 30s }
/// next_hop_v6: 2001:db8::11   # IPv6 VIPs over an IPv4 session
/// graceful_restart: { restart_time: 30s }  # default: on for peers with bfd
/// graceful_shutdown: { wait: 5s }           # default: off
/// peers:
///   - address: 10.0.0.1
///     remote_as: 65000
///     local_address: 10.0.0.11
///     bfd: { min_rx: 300ms, min_tx: 300ms, multiplier: 3 }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpConfig {
    /// Our AS. `remote_as == local_as` makes a peer internal (iBGP: empty
    /// AS_PATH, LOCAL_PREF 100); otherwise the AS_PATH is `[local_as]`.
    pub local_as: u32,
    /// Our BGP identifier.
    pub router_id: Ipv4Addr,
    /// Hold time offered in our OPEN: whole seconds, 0 (no keepalives, no
    /// hold timer) or at least 3. Keepalives go at a third of the agreed
    /// hold time.
    #[serde(default = "default_hold_time", with = "duration")]
    pub hold_time: Duration,
    #[serde(default)]
    pub connect_retry: ConnectRetry,
    /// Next hop for IPv4 VIPs on sessions over IPv6 (without it such a
    /// session carries IPv6 VIPs only). On IPv4 sessions the next hop is
    /// always the session's own local address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v4: Option<Ipv4Addr>,
    /// Next hop for IPv6 VIPs on sessions over IPv4: our IPv6 address on
    /// the link to the router (without it such a session carries IPv4 VIPs
    /// only). On IPv6 sessions the next hop is the session's local address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v6: Option<Ipv6Addr>,
    /// Graceful restart (RFC 4724) as the restarting speaker: offered to
    /// the peers it is enabled for (see [`GracefulRestart`]).
    #[serde(default)]
    pub graceful_restart: GracefulRestart,
    /// Graceful shutdown (RFC 8326) on a planned stop or `lbctl node
    /// drain`: off without this section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown: Option<GracefulShutdown>,
    pub peers: Vec<PeerConfig>,
}

/// Graceful restart: while `lbd` restarts (a crash, `kill -9`, an
/// upgrade) its XDP program keeps forwarding, so the routers may keep
/// its routes; the restarted `lbd` says so (Forwarding State bit) and
/// sends them again, then End-of-RIB.
///
/// Offered by default only to peers with `bfd`: a router that keeps a
/// dead balancer's routes for `restart_time` blackholes its share of
/// traffic all that time, and only BFD (answered by the datapath, so it
/// survives an `lbd` restart but not the box or its link) tells the
/// router that the box, not `lbd`, died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GracefulRestart {
    /// `auto` (default): for peers with BFD; `on`: every peer; `off`: none.
    #[serde(default)]
    pub mode: GracefulRestartMode,
    /// The Restart Time we advertise (1-4095 s): how long a router keeps
    /// our routes while the session is down.
    #[serde(default = "default_restart_time", with = "duration")]
    pub restart_time: Duration,
    /// After a restart, how long at most to wait for the backends' first
    /// probe verdicts before sending the routes and End-of-RIB (routes
    /// withheld meanwhile stay on the routers, marked stale).
    #[serde(default = "default_eor_defer", with = "duration")]
    pub eor_defer_max: Duration,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GracefulRestartMode {
    #[default]
    Auto,
    On,
    Off,
}

impl Default for GracefulRestart {
    fn default() -> Self {
        Self {
            mode: GracefulRestartMode::Auto,
            restart_time: default_restart_time(),
            eor_defer_max: default_eor_defer(),
        }
    }
}

/// Graceful shutdown: before a planned withdrawal (SIGTERM, `lbctl node
/// drain`) every announced route is sent again with the GRACEFUL_SHUTDOWN
/// community (65535:0) and each peer's `graceful_shutdown` attributes;
/// `wait` later the routes are withdrawn. Routers that honour the
/// community (RFC 8326 §4.2: LOCAL_PREF 0) move traffic to the other
/// balancers before the withdrawal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GracefulShutdown {
    #[serde(default = "default_gshut_wait", with = "duration")]
    pub wait: Duration,
}

/// A peer's BFD session (RFC 5880, RFC 5881 single hop), answered by the
/// datapath. A BFD session that goes down takes the BGP session down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BfdTimers {
    /// Required Min RX: the router sends no faster than this.
    #[serde(default = "default_bfd_interval", with = "duration")]
    pub min_rx: Duration,
    /// Desired Min TX. lb answers each of the router's packets, so it
    /// sends as often as the router does, and advertises at least the
    /// router's interval (ARCHITECTURE.md, "BFD").
    #[serde(default = "default_bfd_interval", with = "duration")]
    pub min_tx: Duration,
    /// Detect Mult: the router declares us down after this many intervals
    /// without an answer.
    #[serde(default = "default_bfd_multiplier")]
    pub multiplier: u8,
}

impl Default for BfdTimers {
    fn default() -> Self {
        Self {
            min_rx: default_bfd_interval(),
            min_tx: default_bfd_interval(),
            multiplier: default_bfd_multiplier(),
        }
    }
}

/// What a peer's announcements carry during a graceful shutdown, besides
/// the GRACEFUL_SHUTDOWN community.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownAttributes {
    /// LOCAL_PREF (internal peers only: it is never sent to external ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pref: Option<u32>,
    /// MULTI_EXIT_DISC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub med: Option<u32>,
    /// Our AS this many more times in the AS_PATH (external peers; 0-10).
    #[serde(default)]
    pub prepend: u8,
}

/// Interval bounds of `bfd` timers: 10 ms to 60 s.
pub const BFD_MIN_INTERVAL: Duration = Duration::from_millis(10);
pub const BFD_MAX_INTERVAL: Duration = Duration::from_secs(60);

/// Reconnection backoff: `initial`, doubling after every failure up to
/// `max`, each wait shortened by a random 0–25% so that balancers that
/// lost a router together do not reconnect in lockstep. Back to `initial`
/// once a session reaches Established.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectRetry {
    #[serde(default = "default_retry_initial", with = "duration")]
    pub initial: Duration,
    #[serde(default = "default_retry_max", with = "duration")]
    pub max: Duration,
}

impl Default for ConnectRetry {
    fn default() -> Self {
        Self {
            initial: default_retry_initial(),
            max: default_retry_max(),
        }
    }
}

/// A router to connect to. We only connect out; we never listen. The
/// address is IPv4 or a global IPv6 address (link-local peers, which need
/// an interface, are not supported).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub address: IpAddr,
    pub remote_as: u32,
    /// The peer's port (179; other values are for tests).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Source address of the session (and so the IPv4/IPv6 next hop);
    /// default: whatever the kernel picks for the route to the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_address: Option<IpAddr>,
    /// TCP MD5 signatures (RFC 2385): a file holding the key shared with
    /// the router, 1-80 bytes (one trailing newline is not part of it),
    /// readable by its owner only. Read at every connection attempt, so a
    /// new key applies from the next session on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// GTSM (RFC 5082): the router is at most this many hops away (1:
    /// on the same link). The session sends with TTL 255 and the kernel
    /// drops segments that arrive below `256 - hops`, so no one further
    /// away can reset or spoof it. The router must be configured alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_security: Option<u8>,
    /// Next hops for this peer only, replacing the speaker's
    /// `next_hop_v4`/`next_hop_v6` (a router on another link needs an
    /// address of ours on its own link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v4: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v6: Option<Ipv6Addr>,
    /// BFD with this router (`bfd: {}` for the defaults, 300 ms × 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdTimers>,
    /// Attributes of this peer's announcements during a graceful
    /// shutdown (with the speaker's `graceful_shutdown`).
    #[serde(default)]
    pub graceful_shutdown: ShutdownAttributes,
}

impl PeerConfig {
    /// This peer's problems, with field paths under `prefix`.
    fn validate(&self, prefix: &str, errors: &mut Vec<ConfigError>) {
        let at = |f: &str| format!("{prefix}.{f}");
        check_as(&at("remote_as"), self.remote_as, errors);
        check_unicast(&at("address"), self.address, errors);
        if self.port == 0 {
            errors.push(problem(at("port"), "must not be 0"));
        }
        if let Some(local) = self.local_address {
            check_unicast(&at("local_address"), local, errors);
            if local.is_ipv4() != self.address.is_ipv4() {
                errors.push(problem(
                    at("local_address"),
                    format!(
                        "{local} and the peer address {} are of different families",
                        self.address
                    ),
                ));
            }
        }
        if let Some(hops) = self.ttl_security
            && !(1..=254).contains(&hops)
        {
            errors.push(problem(
                at("ttl_security"),
                format!("{hops} hops: GTSM allows 1-254"),
            ));
        }
        for (field, nh) in [
            ("next_hop_v4", self.next_hop_v4.map(IpAddr::from)),
            ("next_hop_v6", self.next_hop_v6.map(IpAddr::from)),
        ] {
            if let Some(nh) = nh {
                check_unicast(&at(field), nh, errors);
            }
        }
        if self
            .password_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            errors.push(problem(at("password_file"), "must not be empty"));
        }
        if let Some(bfd) = &self.bfd {
            for (field, d) in [("bfd.min_rx", bfd.min_rx), ("bfd.min_tx", bfd.min_tx)] {
                if !(BFD_MIN_INTERVAL..=BFD_MAX_INTERVAL).contains(&d) {
                    errors.push(problem(at(field), "must be 10ms to 60s"));
                }
            }
            if bfd.multiplier < 2 {
                errors.push(problem(
                    at("bfd.multiplier"),
                    "must be 2-255: with 1, a single lost packet takes the session down",
                ));
            }
            if self.address.is_ipv6() && self.address.to_string().starts_with("fe80") {
                errors.push(problem(at("bfd"), "link-local peers are not supported"));
            }
        }
        if self.graceful_shutdown.prepend > 10 {
            errors.push(problem(at("graceful_shutdown.prepend"), "must be 0-10"));
        }
    }

    /// Whether graceful restart is offered to this peer.
    pub fn graceful_restart(&self, gr: &GracefulRestart) -> bool {
        match gr.mode {
            GracefulRestartMode::On => true,
            GracefulRestartMode::Off => false,
            GracefulRestartMode::Auto => self.bfd.is_some(),
        }
    }

    /// A peer with no optional setting.
    pub fn new(address: IpAddr, remote_as: u32) -> Self {
        Self {
            address,
            remote_as,
            port: BGP_PORT,
            local_address: None,
            password_file: None,
            ttl_security: None,
            next_hop_v4: None,
            next_hop_v6: None,
            bfd: None,
            graceful_shutdown: ShutdownAttributes::default(),
        }
    }

    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// The TCP MD5 key from `password_file`, if one is set; refused if the
    /// file is readable by others or the key's length is out of range.
    pub fn md5_key(&self) -> Result<Option<Vec<u8>>, String> {
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        read_key(path).map(Some)
    }
}

/// Reads a TCP MD5 key file (see [`PeerConfig::password_file`]).
fn read_key(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let meta = crate::config::parse::private_file(path)?;
    if meta.len() > 4096 {
        return Err(format!("{shown} is {} bytes: not a key file", meta.len()));
    }
    let mut key = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    if key.ends_with(b"\n") {
        key.pop();
        if key.ends_with(b"\r") {
            key.pop();
        }
    }
    if key.is_empty() || key.len() > MD5_MAX_KEY {
        return Err(format!(
            "{shown}: a TCP MD5 key is 1-{} bytes, this one {}",
            MD5_MAX_KEY,
            key.len()
        ));
    }
    Ok(key)
}

fn default_hold_time() -> Duration {
    Duration::from_secs(90)
}
fn default_retry_initial() -> Duration {
    Duration::from_secs(1)
}
fn default_retry_max() -> Duration {
    Duration::from_secs(30)
}
fn default_port() -> u16 {
    BGP_PORT
}
fn default_restart_time() -> Duration {
    Duration::from_secs(30)
}
fn default_eor_defer() -> Duration {
    Duration::from_secs(20)
}
fn default_gshut_wait() -> Duration {
    Duration::from_secs(5)
}
fn default_bfd_interval() -> Duration {
    Duration::from_millis(300)
}
fn default_bfd_multiplier() -> u8 {
    3
}

fn check_as(field: &str, asn: u32, errors: &mut Vec<ConfigError>) {
    if asn == 0 {
        errors.push(problem(field, "AS 0 is reserved"));
    } else if asn == AS_TRANS {
        errors.push(problem(
            field,
            "AS 23456 is AS_TRANS (RFC 6793), not a real AS",
        ));
    }
}

fn check_unicast(field: &str, addr: IpAddr, errors: &mut Vec<ConfigError>) {
    if addr.is_unspecified() || addr.is_multicast() {
        errors.push(problem(field, format!("{addr} is not a unicast address")));
    }
}

impl BgpConfig {
    /// The hold time we offer, in seconds (valid after [`validate`](Self::validate)).
    pub fn hold_time_secs(&self) -> u16 {
        u16::try_from(self.hold_time.as_secs()).unwrap_or(u16::MAX)
    }

    /// Every problem, with field paths relative to this section.
    pub fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        check_as("local_as", self.local_as, &mut errors);
        if self.router_id.is_unspecified() {
            errors.push(problem("router_id", "must not be 0.0.0.0"));
        }
        let hold = self.hold_time;
        if hold.subsec_nanos() != 0 {
            errors.push(problem("hold_time", "must be whole seconds"));
        } else if hold.as_secs() != 0 && !(3..=u64::from(u16::MAX)).contains(&hold.as_secs()) {
            errors.push(problem(
                "hold_time",
                "must be 0 (no keepalives) or 3 to 65535 seconds (RFC 4271)",
            ));
        }
        if self.connect_retry.initial.is_zero() {
            errors.push(problem("connect_retry.initial", "must be more than 0"));
        }
        if self.connect_retry.max < self.connect_retry.initial {
            errors.push(problem(
                "connect_retry.max",
                "must be at least connect_retry.initial",
            ));
        }
        if let Some(nh) = self.next_hop_v4 {
            check_unicast("next_hop_v4", nh.into(), &mut errors);
        }
        if let Some(nh) = self.next_hop_v6 {
            check_unicast("next_hop_v6", nh.into(), &mut errors);
        }
        let gr = &self.graceful_restart;
        if gr.restart_time.subsec_nanos() != 0 || !(1..=4095).contains(&gr.restart_time.as_secs()) {
            errors.push(problem(
                "graceful_restart.restart_time",
                "must be whole seconds, 1 to 4095 (RFC 4724)",
            ));
        }
        if gr.eor_defer_max >= gr.restart_time {
            errors.push(problem(
                "graceful_restart.eor_defer_max",
                "must be shorter than restart_time, or the routers drop the routes while lbd waits",
            ));
        }
        if let Some(g) = &self.graceful_shutdown
            && g.wait > Duration::from_secs(60)
        {
            errors.push(problem("graceful_shutdown.wait", "must be at most 60s"));
        }
        if self.peers.is_empty() {
            errors.push(problem("peers", "at least one peer is needed"));
        }
        let (mut seen, mut with_bfd) = (BTreeSet::new(), BTreeSet::new());
        for (i, peer) in self.peers.iter().enumerate() {
            peer.validate(&format!("peers[{i}]"), &mut errors);
            if !seen.insert(peer.socket_addr()) {
                errors.push(problem(
                    format!("peers[{i}].address"),
                    format!("peer {} is listed twice", peer.socket_addr()),
                ));
            }
            // BFD packets name no port: one session per address.
            if peer.bfd.is_some() && !with_bfd.insert(peer.address) {
                errors.push(problem(
                    format!("peers[{i}].bfd"),
                    format!(
                        "another peer at {} has BFD already: BFD runs one session per address",
                        peer.address
                    ),
                ));
            }
        }
        errors
    }

    /// Checks what lives outside the configuration: each peer's key file
    /// (readable, private, of a valid length). `lbd check` and the
    /// speaker's start call it.
    pub fn check_files(&self) -> Vec<ConfigError> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.md5_key()
                    .err()
                    .map(|e| problem(format!("peers[{i}].password_file"), e))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> BgpConfig {
        serde_yaml::from_str(yaml).expect("parses")
    }

    #[test]
    fn defaults_are_rfc_like() {
        let c = parse(
            "local_as: 65001\nrouter_id: 10.0.0.11\npeers:\n  - { address: 10.0.0.1, remote_as: 65000 }\n",
        );
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        assert_eq!(c.hold_time, Duration::from_secs(90));
        assert_eq!(c.hold_time_secs(), 90);
        assert_eq!(c.connect_retry, ConnectRetry::default());
        assert_eq!(c.peers[0].port, 179);
        assert_eq!(c.peers[0].local_address, None);
    }

    /// Two peers on one address may differ in port, but only one of them
    /// may have BFD: its packets name no port, and the datapath keeps one
    /// session per address.
    #[test]
    fn one_peer_per_address_may_have_bfd() {
        let peers = |a: &str, b: &str| {
            parse(&format!(
                "local_as: 65001\nrouter_id: 10.0.0.11\npeers:\n  - {{ address: 10.0.0.1, remote_as: 65000{a} }}\n  - {{ address: 10.0.0.1, port: 1179, remote_as: 65000{b} }}\n"
            ))
        };
        assert!(peers(", bfd: {}", "").validate().is_empty());
        let e = peers(", bfd: {}", ", bfd: {}").validate();
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].field, "peers[1].bfd");
        assert!(e[0].message.contains("one session per address"), "{e:?}");
    }

    #[test]
    fn every_field_parses() {
        let c = parse(
            "local_as: 4200000001\nrouter_id: 10.0.0.11\nhold_time: 3s\nconnect_retry: { initial: 200ms, max: 2s }\nnext_hop_v4: 10.0.0.11\nnext_hop_v6: 2001:db8::11\npeers:\n  - { address: 2001:db8::1, remote_as: 65000, port: 1179, local_address: 2001:db8::11 }\n",
        );
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        assert_eq!(c.hold_time_secs(), 3);
        assert_eq!(c.connect_retry.initial, Duration::from_millis(200));
        assert_eq!(c.peers[0].socket_addr().to_string(), "[2001:db8::1]:1179");
    }

    #[test]
    fn key_files_must_be_private_and_of_a_valid_length() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = crate::scratch::ScratchDir::new("md5");
        let key = dir.join("peer.key");
        let c = |path: &Path| {
            parse(&format!(
                "local_as: 65001\nrouter_id: 10.0.0.11\npeers:\n  - {{ address: 10.0.0.1, remote_as: 65000, password_file: {}, ttl_security: 1 }}\n",
                path.display()
            ))
        };
        std::fs::write(&key, "s3cret\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let good = c(&key);
        assert!(good.validate().is_empty() && good.check_files().is_empty());
        assert_eq!(good.peers[0].md5_key().unwrap().unwrap(), b"s3cret");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(good.check_files()[0].message.contains("readable by others"));
        std::fs::write(&key, "x".repeat(81)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            good.check_files()[0]
                .message
                .contains("1-80 bytes, this one 81")
        );
        let missing = c(&dir.join("nope"));
        assert_eq!(missing.check_files()[0].field, "peers[0].password_file");
        let mut bad = good.clone();
        bad.peers[0].ttl_security = Some(255);
        assert_eq!(bad.validate()[0].field, "peers[0].ttl_security");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_yaml::from_str::<BgpConfig>(
            "local_as: 1\nrouter_id: 10.0.0.1\npeers:\n  - { address: 10.0.0.1, remote_as: 2, remote_port: 5 }\n",
        )
        .expect_err("typo");
        assert!(
            err.to_string().contains("unknown field `remote_port`"),
            "{err}"
        );
    }

    #[test]
    fn each_validation_error_names_its_field() {
        let c = parse(
            "local_as: 23456\nrouter_id: 0.0.0.0\nhold_time: 2s\nconnect_retry: { initial: 0s, max: 0s }\nnext_hop_v6: '::'\npeers:\n  - { address: 10.0.0.1, remote_as: 0, port: 0, local_address: 2001:db8::1 }\n  - { address: 10.0.0.1, remote_as: 65000, port: 0 }\n",
        );
        let errors = c.validate();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        for want in [
            "local_as",
            "router_id",
            "hold_time",
            "connect_retry.initial",
            "next_hop_v6",
            "peers[0].remote_as",
            "peers[0].port",
            "peers[0].local_address",
            "peers[1].address",
        ] {
            assert!(fields.contains(&want), "no error for {want}: {errors:?}");
        }
        let c = parse(
            "local_as: 1\nrouter_id: 1.1.1.1\nhold_time: 1500ms\nconnect_retry: { initial: 5s, max: 1s }\npeers: []\n",
        );
        let fields: Vec<String> = c.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["hold_time", "connect_retry.max", "peers"]);
    }
}

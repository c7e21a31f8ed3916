//! The YAML configuration, parsed into a validated [`Config`].
//!
//! Parse, don't validate later: everything downstream takes a `Config` and
//! can rely on it. Field-level mistakes (unknown field, bad address, a port
//! out of range) are reported by serde with the field's path and line;
//! cross-field rules (duplicates, table size against backend count, address
//! families against outer sources) are checked here and reported with the
//! field's path. All problems are reported at once, not just the first.
//!
//! This module does no I/O beyond reading the file it is given.

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use lb_common::{
    VipKey,
    consts::{ENCAP_GRE, ENCAP_GUE, ENCAP_IPIP, GUE_PORT, PROTO_TCP, PROTO_UDP},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::{
    announce::{AnnounceConfig, prefixed},
    dataplane::Layout,
    maglev,
};

/// Largest weight accepted in a configuration.
pub const MAX_WEIGHT: u32 = 10_000;

/// A value from the file as it is echoed in an error: in backquotes, cut
/// to its first 64 characters (a 10 MB value must not come back whole).
pub fn excerpt(value: &str) -> String {
    const SHOWN: usize = 64;
    match value.char_indices().nth(SHOWN) {
        None => format!("`{value}`"),
        Some((end, _)) => format!("`{}…` ({} bytes)", &value[..end], value.len()),
    }
}

/// An error message cut to a readable length, keeping its end (where
/// serde_yaml says the line and column).
fn cut_message(message: String) -> String {
    const HEAD: usize = 200;
    const TAIL: usize = 60;
    let chars = message.chars().count();
    if chars <= HEAD + TAIL + 5 {
        return message;
    }
    let head: String = message.chars().take(HEAD).collect();
    let tail: String = message.chars().skip(chars - TAIL).collect();
    format!("{head} … {tail}")
}

/// One problem in a configuration: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `vips[1].backends[0].weight`; empty
    /// when serde could not say.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Every problem found in one configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    /// The file, if the configuration came from one.
    pub source_name: Option<String>,
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source_name {
            Some(name) => write!(f, "invalid configuration {name}:")?,
            None => write!(f, "invalid configuration:")?,
        }
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    fn one(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            source_name: None,
            errors: vec![ConfigError {
                field: field.into(),
                message: message.into(),
            }],
        }
    }

    fn named(mut self, name: &Path) -> Self {
        self.source_name = Some(name.display().to_string());
        self
    }
}

/// L4 protocol of a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => PROTO_TCP,
            Protocol::Udp => PROTO_UDP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            PROTO_TCP => Some(Protocol::Tcp),
            PROTO_UDP => Some(Protocol::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            _ => Err(format!(
                "unknown protocol {}, expected `tcp` or `udp`",
                excerpt(s)
            )),
        }
    }
}

/// Tunnel toward the backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encap {
    /// IP-in-IP: 4in4, 6in6, 4in6 or 6in4 by the families involved.
    #[default]
    Ipip,
    /// GRE (RFC 2784, no options) over IPv4 or IPv6.
    Gre,
    /// GUE variant 1 / FOU: the packet after an outer UDP header whose
    /// source port comes from the flow hash (spreads flows over the
    /// backend's receive queues) and whose destination is `gue_port`.
    Gue,
}

impl Encap {
    pub fn code(self) -> u8 {
        match self {
            Encap::Ipip => ENCAP_IPIP,
            Encap::Gre => ENCAP_GRE,
            Encap::Gue => ENCAP_GUE,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            ENCAP_IPIP => Some(Encap::Ipip),
            ENCAP_GRE => Some(Encap::Gre),
            ENCAP_GUE => Some(Encap::Gue),
            _ => None,
        }
    }
}

impl fmt::Display for Encap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encap::Ipip => "ipip",
            Encap::Gre => "gre",
            Encap::Gue => "gue",
        })
    }
}

/// The identity of a VIP: `{address, port, protocol}`; port 0 is all ports.
/// Written `10.0.0.1:80/tcp`, `[2001:db8::1]:443/tcp`, `10.0.0.1:*/udp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VipId {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Protocol,
}

impl VipId {
    pub fn key(&self) -> VipKey {
        VipKey::new(self.addr, self.port, self.proto.number())
    }

    pub fn from_key(key: &VipKey) -> Option<Self> {
        Some(Self {
            addr: key.ip()?,
            port: key.port(),
            proto: Protocol::from_number(key.proto)?,
        })
    }
}

impl fmt::Display for VipId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}")?,
            IpAddr::V6(a) => write!(f, "[{a}]")?,
        }
        if self.port == 0 {
            write!(f, ":*/{}", self.proto)
        } else {
            write!(f, ":{}/{}", self.port, self.proto)
        }
    }
}

impl FromStr for VipId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "{} is not a VIP; write ADDRESS:PORT/PROTO, e.g. 10.0.0.1:80/tcp, [2001:db8::1]:443/tcp or 10.0.0.1:*/udp",
                excerpt(s)
            )
        };
        let (hostport, proto) = s.rsplit_once('/').ok_or_else(usage)?;
        let proto: Protocol = proto.parse()?;
        let (host, port) = hostport.rsplit_once(':').ok_or_else(usage)?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let addr: IpAddr = host
            .parse()
            .map_err(|_| format!("{} is not an IP address", excerpt(host)))?;
        let port = match port {
            "*" | "all" => 0,
            "0" => return Err(PORT_ZERO.into()),
            p => p
                .parse::<u16>()
                .map_err(|_| format!("{} is not a port (1-65535 or *)", excerpt(p)))?,
        };
        Ok(Self { addr, port, proto })
    }
}

impl Serialize for VipId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VipId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_field(d, "a VIP such as 10.0.0.1:80/tcp")
    }
}

/// Deserializes a `FromStr` type from a string, failing inside the
/// deserializer so that serde_yaml reports the field's path and line.
fn from_str_field<'de, D, T>(d: D, expecting: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    struct V<T>(&'static str, std::marker::PhantomData<T>);
    impl<T: FromStr<Err = String>> de::Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            v.parse().map_err(E::custom)
        }
    }
    d.deserialize_str(V(expecting, std::marker::PhantomData))
}

/// The error for a port written 0: it is not a port, and taking it for
/// "all ports" silently would widen a VIP by mistake.
const PORT_ZERO: &str = "port 0 is not a port (1-65535); write `all` or `*` for an all-ports VIP";

/// A port: a number 1-65535, or `all` / `*` (stored as 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PortSpec(u16);

impl<'de> Deserialize<'de> for PortSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = PortSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number 1-65535, or `all`")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortSpec, E> {
                match u16::try_from(v) {
                    Ok(0) => Err(E::custom(PORT_ZERO)),
                    Ok(p) => Ok(PortSpec(p)),
                    Err(_) => Err(E::custom(format!("port {v} is out of range 1-65535"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortSpec, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("port {v} is out of range 1-65535")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortSpec, E> {
                match v {
                    "all" | "*" => Ok(PortSpec(0)),
                    _ => v
                        .parse::<u64>()
                        .map_err(|_| {
                            E::custom(format!("{} is not a port (1-65535 or `all`)", excerpt(v)))
                        })
                        .and_then(|p| self.visit_u64(p)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A MAC address `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || format!("{} is not a MAC address (aa:bb:cc:dd:ee:ff)", excerpt(s));
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (b, p) in mac.iter_mut().zip(parts) {
            if p.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        Ok(Mac(mac))
    }
}

/// Where forwarded frames go at layer 2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gateway {
    /// Resolve the default route's next hop in the kernel's neighbour table.
    #[default]
    Auto,
    Mac(Mac),
}

impl FromStr for Gateway {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Gateway::Auto);
        }
        s.parse()
            .map(Gateway::Mac)
            .map_err(|e| format!("{e}, or `auto`"))
    }
}

impl<'de> Deserialize<'de> for Gateway {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_field(d, "a MAC address or `auto`")
    }
}

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpModeSetting {
    /// In the driver (fast; the NIC driver must support XDP).
    #[default]
    Native,
    /// Generic (skb) mode: works everywhere, slower.
    Generic,
    /// Let the kernel choose (driver mode if supported).
    Auto,
}

/// What to do with malformed or unsupported packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MalformedPolicy {
    /// Hand them to the kernel's stack (it drops what it cannot use).
    #[default]
    Pass,
    Drop,
}

/// What a VIP does with IP fragments (which carry no ports to find the
/// VIP or hash the flow by).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FragmentPolicy {
    /// Drop them and count `drop_fragment`.
    #[default]
    Drop,
    /// Hash every packet of the VIP, fragment or not, on its 3-tuple
    /// (addresses and protocol), so all fragments of a datagram reach the
    /// backend its first fragment reaches. Coarser: all flows of one
    /// client go to one backend. One VIP per address and protocol may.
    Hash,
}

/// What to do with an IPv4 packet without DF that is too big once
/// encapsulated (the balancer does not fragment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TooBigPolicy {
    /// Drop it and count `drop_too_big_no_df`.
    #[default]
    Drop,
    /// Hand it to the kernel (which may fragment or route it itself).
    Pass,
}

/// An address prefix, written `10.99.0.0/16` or `fd00:99::/112`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// Bits after the prefix.
    pub fn host_bits(&self) -> u8 {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        width - self.len
    }
}

impl FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{} is not a prefix like 10.99.0.0/16", excerpt(s)))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{} is not an IP address", excerpt(addr)))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= width)
            .ok_or_else(|| format!("{} is not a prefix length 0-{width}", excerpt(len)))?;
        Ok(Self { addr, len })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl<'de> Deserialize<'de> for Prefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// Durations in YAML: a number of seconds, or a string with a unit
/// (`500ms`, `2s`, `5m`, `1h`). Written back as a string with a unit.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer, de};

    pub fn parse(s: &str) -> Result<Duration, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num.parse().map_err(|_| {
            format!(
                "{} is not a duration (e.g. 500ms, 2s, 5m)",
                super::excerpt(s)
            )
        })?;
        let secs = match unit.trim() {
            "ms" => n / 1000.0,
            "s" | "" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            u => {
                return Err(format!(
                    "unknown unit {} in {} (use ms, s, m or h)",
                    super::excerpt(u),
                    super::excerpt(s)
                ));
            }
        };
        if !(0.0..=86_400.0 * 365.0).contains(&secs) {
            return Err(format!("{} is out of range", super::excerpt(s)));
        }
        Ok(Duration::from_secs_f64(secs))
    }

    pub fn format(d: &Duration) -> String {
        if d.subsec_millis() != 0 || d.is_zero() {
            format!("{}ms", d.as_millis())
        } else {
            format!("{}s", d.as_secs())
        }
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration: seconds, or a string such as 500ms, 2s, 5m")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
                parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// An HTTP health check: `GET path` must answer with `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCheck {
    #[serde(default = "default_http_path")]
    pub path: String,
    #[serde(default = "default_http_status")]
    pub status: u16,
    /// Host header (default: the probed address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

fn default_http_path() -> String {
    "/".into()
}
fn default_http_status() -> u16 {
    200
}

/// How a backend is probed. Without `send`, `expect` or `http` it is a TCP
/// connect check (which also fails a backend that closes the connection
/// right after accepting it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// Port to probe (default: the VIP's port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default = "default_interval", with = "duration")]
    pub interval: Duration,
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Consecutive successes that bring a backend back.
    #[serde(default = "default_rise")]
    pub rise: u32,
    /// Consecutive failures that take a backend out.
    #[serde(default = "default_fall")]
    pub fall: u32,
    /// Random spread of each interval, in percent, so that the probes of
    /// many balancers do not synchronise.
    #[serde(default = "default_jitter")]
    pub jitter: u32,
    /// Bytes to send after connecting (escapes `\r`, `\n`, `\t` allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<String>,
    /// The reply must start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheck>,
    /// Probe the VIP through the tunnel, exactly as clients reach the
    /// backend, instead of the backend's own address: proves the backend's
    /// decapsulation and VIP set-up, not just an open port.
    #[serde(default)]
    pub through_tunnel: bool,
}

fn default_interval() -> Duration {
    Duration::from_secs(2)
}
fn default_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_rise() -> u32 {
    2
}
fn default_fall() -> u32 {
    3
}
fn default_jitter() -> u32 {
    10
}

impl HealthCheck {
    /// Longest time from a backend's death to its removal: `fall` probes
    /// at the longest jittered interval, the last one timing out.
    pub fn detection_bound(&self) -> Duration {
        let longest = self.interval.mul_f64(1.0 + self.jitter as f64 / 100.0);
        longest * self.fall + self.timeout
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub address: IpAddr,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Replaces the VIP's health check for this backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

impl BackendConfig {
    pub fn new(address: IpAddr, weight: u32) -> Self {
        Self {
            address,
            weight,
            health_check: None,
        }
    }
}

fn default_weight() -> u32 {
    1
}

/// A VIP as configured (in the file or through the API). Serialized in the
/// same shape as the file (`address`, `port`, `protocol`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipConfig {
    pub id: VipId,
    pub encap: Encap,
    /// Use the connection table (default). UDP services whose backends
    /// keep no per-flow state may turn it off.
    pub conntrack: bool,
    /// Fragments: dropped (default) or hashed on the 3-tuple.
    pub fragments: FragmentPolicy,
    pub backends: Vec<BackendConfig>,
    /// Probes for the backends; `None`: no probing, backends count as up.
    pub health_check: Option<HealthCheck>,
    /// How long a draining backend keeps its existing connections.
    pub drain_timeout: Duration,
    /// A backend that joins or recovers ramps its weight up over this long.
    pub slow_start: Duration,
    /// Below this percentage of usable backends, the table is built from
    /// all of them (fail open).
    pub panic_threshold: u32,
    /// The VIP's address is announced (BGP, ExaBGP, exec) only while at
    /// least this many of its backends are usable (active or in slow
    /// start). 0 announces it whenever the program is attached.
    pub min_healthy: u32,
}

impl VipConfig {
    /// A VIP with default settings.
    pub fn new(id: VipId, backends: Vec<BackendConfig>) -> Self {
        Self {
            id,
            encap: Encap::default(),
            conntrack: true,
            fragments: FragmentPolicy::default(),
            backends,
            health_check: None,
            drain_timeout: default_drain_timeout(),
            slow_start: Duration::ZERO,
            panic_threshold: default_panic_threshold(),
            min_healthy: default_min_healthy(),
        }
    }

    /// The health check of one backend: its own, else the VIP's.
    pub fn health_check_of<'a>(&'a self, b: &'a BackendConfig) -> Option<&'a HealthCheck> {
        b.health_check.as_ref().or(self.health_check.as_ref())
    }
}

fn default_drain_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_panic_threshold() -> u32 {
    50
}
fn default_min_healthy() -> u32 {
    1
}

/// The VIP as written in YAML or JSON.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVip {
    address: IpAddr,
    port: PortSpec,
    protocol: Protocol,
    #[serde(default)]
    encap: Encap,
    #[serde(default = "yes")]
    conntrack: bool,
    #[serde(default)]
    fragments: FragmentPolicy,
    #[serde(default)]
    backends: Vec<BackendConfig>,
    #[serde(default)]
    health_check: Option<HealthCheck>,
    #[serde(default = "default_drain_timeout", with = "duration")]
    drain_timeout: Duration,
    #[serde(default, with = "duration")]
    slow_start: Duration,
    #[serde(default = "default_panic_threshold")]
    panic_threshold: u32,
    #[serde(default = "default_min_healthy")]
    min_healthy: u32,
}

fn yes() -> bool {
    true
}

impl RawVip {
    fn into_vip(self) -> VipConfig {
        VipConfig {
            id: VipId {
                addr: self.address,
                port: self.port.0,
                proto: self.protocol,
            },
            encap: self.encap,
            conntrack: self.conntrack,
            fragments: self.fragments,
            backends: self.backends,
            health_check: self.health_check,
            drain_timeout: self.drain_timeout,
            slow_start: self.slow_start,
            panic_threshold: self.panic_threshold,
            min_healthy: self.min_healthy,
        }
    }
}

impl Serialize for VipConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Port {
            Number(u16),
            /// All ports: written `all`, as a file says it (0 is refused).
            All(&'static str),
        }
        #[derive(Serialize)]
        struct Out<'a> {
            address: IpAddr,
            port: Port,
            protocol: Protocol,
            encap: Encap,
            conntrack: bool,
            fragments: FragmentPolicy,
            backends: &'a [BackendConfig],
            #[serde(skip_serializing_if = "Option::is_none")]
            health_check: &'a Option<HealthCheck>,
            #[serde(with = "duration")]
            drain_timeout: Duration,
            #[serde(with = "duration")]
            slow_start: Duration,
            panic_threshold: u32,
            min_healthy: u32,
        }
        Out {
            address: self.id.addr,
            port: match self.id.port {
                0 => Port::All("all"),
                p => Port::Number(p),
            },
            protocol: self.id.proto,
            encap: self.encap,
            conntrack: self.conntrack,
            fragments: self.fragments,
            backends: &self.backends,
            health_check: &self.health_check,
            drain_timeout: self.drain_timeout,
            slow_start: self.slow_start,
            panic_threshold: self.panic_threshold,
            min_healthy: self.min_healthy,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for VipConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawVip::deserialize(d).map(RawVip::into_vip)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_instance")]
    instance: String,
    // Defaulted so that each setting can be parsed on its own; an empty
    // list is refused by `validate`.
    #[serde(default)]
    interfaces: Vec<String>,
    #[serde(default)]
    xdp_mode: XdpModeSetting,
    #[serde(default)]
    gateway_mac: Gateway,
    #[serde(default = "default_gateway_refresh", with = "duration")]
    gateway_refresh: Duration,
    outer_source_v4: Option<Ipv4Addr>,
    outer_source_v6: Option<Ipv6Addr>,
    outer_source_v4_prefix: Option<Prefix>,
    outer_source_v6_prefix: Option<Prefix>,
    #[serde(default = "default_mtu")]
    mtu: u16,
    #[serde(default = "default_gue_port")]
    gue_port: u16,
    #[serde(default = "yes")]
    icmp_echo: bool,
    #[serde(default)]
    too_big_no_df: TooBigPolicy,
    #[serde(default = "default_table_size")]
    table_size: u32,
    #[serde(default = "default_ct_buckets")]
    conntrack_buckets: u32,
    #[serde(default = "default_max_vips")]
    max_vips: u32,
    #[serde(default = "default_max_backends")]
    max_backends: u32,
    #[serde(default)]
    malformed: MalformedPolicy,
    api_socket: Option<PathBuf>,
    state_file: Option<PathBuf>,
    #[serde(default = "default_bpffs")]
    bpffs: PathBuf,
    #[serde(default)]
    vips: Vec<VipConfig>,
    #[serde(default)]
    announce: AnnounceConfig,
    #[serde(default = "default_shutdown_grace", with = "duration")]
    shutdown_grace: Duration,
    #[serde(default)]
    detach_on_exit: bool,
}

fn default_gateway_refresh() -> Duration {
    Duration::from_secs(10)
}
fn default_instance() -> String {
    "default".into()
}
fn default_mtu() -> u16 {
    1500
}
fn default_gue_port() -> u16 {
    GUE_PORT
}

/// Smallest `conntrack_buckets`: 6,144 flows. Fewer is a typo, not a
/// design (the default is 262,144 buckets).
pub const MIN_CT_BUCKETS: u32 = 1024;
/// Smallest `table_size`: Maglev balances N backends within 1% only when
/// M ≥ 100·N, so fewer than 101 slots balance not even one pair well (a
/// larger table below 100·N is only warned about).
pub const MIN_TABLE_SIZE: u32 = 101;

/// Smallest non-zero `mtu`: the largest encapsulation (IPv6 and UDP, 48
/// bytes) must leave the 1280 bytes every IPv6 path carries.
pub const MIN_MTU: u16 = 1280 + 48;
fn default_table_size() -> u32 {
    maglev::DEFAULT_TABLE_SIZE
}
fn default_ct_buckets() -> u32 {
    1 << 18
}
fn default_max_vips() -> u32 {
    64
}
fn default_max_backends() -> u32 {
    4096
}
fn default_bpffs() -> PathBuf {
    "/sys/fs/bpf".into()
}
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(5)
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Name of this balancer instance: pins live in `<bpffs>/lb/<instance>`.
    pub instance: String,
    pub interfaces: Vec<String>,
    pub xdp_mode: XdpModeSetting,
    pub gateway: Gateway,
    /// With `gateway_mac: auto`, how often the gateway is looked up again.
    pub gateway_refresh: Duration,
    /// Fixed outer source addresses, or (`*_prefix`) a prefix whose host
    /// bits come from the client's address (RSS entropy on the backend).
    /// At most one of each pair is set.
    pub outer_source_v4: Option<Ipv4Addr>,
    pub outer_source_v6: Option<Ipv6Addr>,
    pub outer_source_v4_prefix: Option<Prefix>,
    pub outer_source_v6_prefix: Option<Prefix>,
    /// MTU of the path to the backends; 0: unchecked.
    pub mtu: u16,
    /// UDP destination port of GUE tunnels.
    pub gue_port: u16,
    /// Answer ICMP echo requests to VIP addresses.
    pub icmp_echo: bool,
    pub too_big_no_df: TooBigPolicy,
    pub layout: Layout,
    pub malformed: MalformedPolicy,
    pub api_socket: PathBuf,
    pub state_file: PathBuf,
    pub bpffs: PathBuf,
    pub vips: Vec<VipConfig>,
    /// Route announcers (none by default).
    pub announce: AnnounceConfig,
    /// On SIGTERM/SIGINT and `lbctl node drain`: how long to wait after
    /// withdrawing every VIP, so the routers move traffic away, before
    /// stopping.
    pub shutdown_grace: Duration,
    /// Detach the program and remove its pins on a graceful exit. Default:
    /// it stays attached and keeps forwarding, so a restart drops nothing.
    pub detach_on_exit: bool,
    /// Advice that does not stop the configuration from loading.
    pub warnings: Vec<String>,
}

impl Config {
    /// Parses and validates YAML text, reporting every problem at once.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        crate::config_parse::precheck(text).map_err(|e| ConfigErrors::one("", e))?;
        let parsed = crate::config_parse::deserialize_all::<RawConfig>(text, "vips");
        validate(parsed)
    }

    /// Reads (at most [`crate::config_parse::MAX_CONFIG_BYTES`]), parses
    /// and validates a file; errors name the file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = crate::config_parse::read_bounded(path)
            .map_err(|e| ConfigErrors::one("", e).named(path))?;
        Self::parse(&text).map_err(|e| e.named(path))
    }

    /// Pin directory of this instance.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.join("lb").join(&self.instance)
    }

    /// Checks a set of VIPs against this configuration's rules (the API
    /// uses it for runtime changes). Returns the warnings.
    pub fn check_vips(&self, vips: &[VipConfig]) -> Result<Vec<String>, ConfigErrors> {
        let mut errors = Vec::new();
        let sources = Sources::new(
            self.outer_source_v4,
            self.outer_source_v6,
            self.outer_source_v4_prefix,
            self.outer_source_v6_prefix,
        );
        let warnings = check_vips(vips, &self.layout, &sources, false, &mut errors);
        if errors.is_empty() {
            Ok(warnings)
        } else {
            Err(ConfigErrors {
                source_name: None,
                errors,
            })
        }
    }
}

/// Splits serde_yaml's "path: message at line L column C" into a field and
/// a message (which keeps the position).
pub(crate) fn serde_error(text: &str) -> ConfigError {
    match text.split_once(": ") {
        Some((field, message))
            if !field.contains(' ') && !field.is_empty() && field != "invalid type" =>
        {
            ConfigError {
                field: field.into(),
                message: message.into(),
            }
        }
        _ => ConfigError {
            field: String::new(),
            message: text.into(),
        },
    }
}

/// The cross-field rules over what parsed, with the parse errors: every
/// problem of the file, each once.
fn validate(parsed: crate::config_parse::Parsed<RawConfig>) -> Result<Config, ConfigErrors> {
    let crate::config_parse::Parsed {
        raw,
        errors: mut all,
        bad_paths,
        vip_index,
    } = parsed;
    let Some(raw) = raw else {
        return Err(finish_errors(all));
    };
    let mut rules = Vec::new();
    let result = validate_raw(raw, &mut rules);
    // A rule about a part that did not parse only repeats its problem.
    rules.retain(|e: &ConfigError| {
        !bad_paths
            .iter()
            .any(|b| e.field == *b || e.field.starts_with(&format!("{b}.")))
    });
    for e in &mut rules {
        renumber_vip(&mut e.field, &vip_index);
    }
    all.extend(rules);
    match result {
        Some(config) if all.is_empty() => Ok(config),
        _ => Err(finish_errors(all)),
    }
}

/// `vips[i]` of the VIPs that parsed becomes the index in the file.
fn renumber_vip(field: &mut String, vip_index: &[usize]) {
    let Some(rest) = field.strip_prefix("vips[") else {
        return;
    };
    let Some((n, tail)) = rest.split_once(']') else {
        return;
    };
    if let Some(orig) = n.parse::<usize>().ok().and_then(|i| vip_index.get(i)) {
        *field = format!("vips[{orig}]{tail}");
    }
}

fn finish_errors(errors: Vec<ConfigError>) -> ConfigErrors {
    ConfigErrors {
        source_name: None,
        errors: errors
            .into_iter()
            .map(|e| ConfigError {
                field: e.field,
                message: cut_message(e.message),
            })
            .collect(),
    }
}

/// The rules; `None` if any failed (the errors are in `errors`).
fn validate_raw(raw: RawConfig, errors: &mut Vec<ConfigError>) -> Option<Config> {
    let mut err = |field: String, message: String| errors.push(ConfigError { field, message });

    if raw.instance.is_empty()
        || raw.instance.len() > 32
        || !raw
            .instance
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        err(
            "instance".into(),
            format!(
                "{} must be 1-32 characters of letters, digits, `-` and `_`",
                excerpt(&raw.instance)
            ),
        );
    }
    if raw.interfaces.is_empty() {
        err(
            "interfaces".into(),
            "at least one interface is needed".into(),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, name) in raw.interfaces.iter().enumerate() {
        if name.is_empty()
            || name.len() > 15
            || name.contains('/')
            || name.chars().any(char::is_whitespace)
        {
            err(
                format!("interfaces[{i}]"),
                format!("{} is not a valid interface name", excerpt(name)),
            );
        } else if !seen.insert(name) {
            err(
                format!("interfaces[{i}]"),
                format!("{} is listed twice", excerpt(name)),
            );
        }
    }
    if !maglev::is_prime(raw.table_size) {
        err(
            "table_size".into(),
            format!(
                "{} is not prime; Maglev needs a prime, e.g. 65537, 131071 or 262147",
                raw.table_size
            ),
        );
    } else if raw.table_size > maglev::MAX_TABLE_SIZE {
        err(
            "table_size".into(),
            format!(
                "{} is larger than the maximum, {}",
                raw.table_size,
                maglev::MAX_TABLE_SIZE
            ),
        );
    }
    if !raw.conntrack_buckets.is_power_of_two() {
        err(
            "conntrack_buckets".into(),
            format!(
                "{} is not a power of two (each bucket holds 6 flows; e.g. 262144)",
                raw.conntrack_buckets
            ),
        );
    } else if raw.conntrack_buckets < MIN_CT_BUCKETS {
        err(
            "conntrack_buckets".into(),
            format!(
                "{} buckets hold {} flows; the least is {MIN_CT_BUCKETS} ({} flows)",
                raw.conntrack_buckets,
                raw.conntrack_buckets as u64 * lb_common::consts::CT_WAYS as u64,
                MIN_CT_BUCKETS as u64 * lb_common::consts::CT_WAYS as u64
            ),
        );
    }
    if maglev::is_prime(raw.table_size) && raw.table_size < MIN_TABLE_SIZE {
        err(
            "table_size".into(),
            format!(
                "{} slots cannot balance even a few backends; the least is {MIN_TABLE_SIZE} (65537 is the default)",
                raw.table_size
            ),
        );
    }
    if raw.max_vips == 0 || raw.max_vips > 65_535 {
        err(
            "max_vips".into(),
            format!("{} is out of range 1-65535", raw.max_vips),
        );
    }
    if raw.max_backends == 0 || raw.max_backends > lb_common::consts::MAX_BACKENDS {
        err(
            "max_backends".into(),
            format!(
                "{} is out of range 1-{}",
                raw.max_backends,
                lb_common::consts::MAX_BACKENDS
            ),
        );
    }
    if raw.mtu != 0 && raw.mtu < MIN_MTU {
        err(
            "mtu".into(),
            format!(
                "{} is below {MIN_MTU} (1280, the IPv6 minimum, plus 48 bytes of encapsulation); 0 turns the check off",
                raw.mtu
            ),
        );
    }
    if raw.gue_port == 0 {
        err("gue_port".into(), "must not be 0".into());
    }
    if raw.gateway_refresh < Duration::from_secs(1)
        || raw.gateway_refresh > Duration::from_secs(3600)
    {
        err("gateway_refresh".into(), "must be between 1s and 1h".into());
    }
    for (field, fixed, prefix, family, min_len) in [
        (
            "outer_source_v4_prefix",
            raw.outer_source_v4.is_some(),
            raw.outer_source_v4_prefix,
            "IPv4",
            0,
        ),
        (
            "outer_source_v6_prefix",
            raw.outer_source_v6.is_some(),
            raw.outer_source_v6_prefix,
            "IPv6",
            96,
        ),
    ] {
        let Some(p) = prefix else { continue };
        if p.addr.is_ipv4() != (family == "IPv4") {
            err(field.into(), format!("{p} is not an {family} prefix"));
        } else if fixed {
            err(
                field.into(),
                format!(
                    "set either {} or {field}, not both",
                    field.trim_end_matches("_prefix")
                ),
            );
        } else if p.len < min_len {
            err(
                field.into(),
                format!(
                    "{p}: the prefix must be /{min_len} or longer (host bits come from the client's last 32 bits)"
                ),
            );
        }
    }
    let sources: [(&str, Option<IpAddr>); 4] = [
        ("outer_source_v4", raw.outer_source_v4.map(IpAddr::V4)),
        ("outer_source_v6", raw.outer_source_v6.map(IpAddr::V6)),
        (
            "outer_source_v4_prefix",
            raw.outer_source_v4_prefix.map(|p| p.addr),
        ),
        (
            "outer_source_v6_prefix",
            raw.outer_source_v6_prefix.map(|p| p.addr),
        ),
    ];
    for (field, addr) in sources {
        if let Some(why) = addr.and_then(unusable_source) {
            err(field.into(), format!("{} {why}", addr.expect("checked")));
        }
    }
    for (field, path) in [
        ("api_socket", raw.api_socket.as_deref()),
        ("state_file", raw.state_file.as_deref()),
        ("bpffs", Some(raw.bpffs.as_path())),
    ] {
        if path.is_some_and(|p| p.as_os_str().is_empty()) {
            err(field.into(), "must not be empty".into());
        }
    }
    errors.extend(prefixed("announce", raw.announce.validate()));
    if raw.shutdown_grace > Duration::from_secs(600) {
        errors.push(ConfigError {
            field: "shutdown_grace".into(),
            message: "is longer than 10 minutes".into(),
        });
    }
    let layout = Layout {
        table_size: raw.table_size,
        max_vips: raw.max_vips,
        max_backends: raw.max_backends,
        ct_buckets: raw.conntrack_buckets,
    };
    if errors.is_empty()
        && let Err(e) = layout.validate()
    {
        errors.push(ConfigError {
            field: String::new(),
            message: e.to_string(),
        });
    }
    let sources = Sources::new(
        raw.outer_source_v4,
        raw.outer_source_v6,
        raw.outer_source_v4_prefix,
        raw.outer_source_v6_prefix,
    );
    let warnings = check_vips(&raw.vips, &layout, &sources, true, errors);
    if !errors.is_empty() {
        return None;
    }
    let run = PathBuf::from("/run/lb");
    Some(Config {
        api_socket: raw
            .api_socket
            .unwrap_or_else(|| run.join(format!("{}.sock", raw.instance))),
        state_file: raw.state_file.unwrap_or_else(|| {
            PathBuf::from("/var/lib/lb").join(format!("{}.state.json", raw.instance))
        }),
        instance: raw.instance,
        interfaces: raw.interfaces,
        xdp_mode: raw.xdp_mode,
        gateway: raw.gateway_mac,
        gateway_refresh: raw.gateway_refresh,
        outer_source_v4: raw.outer_source_v4,
        outer_source_v6: raw.outer_source_v6,
        outer_source_v4_prefix: raw.outer_source_v4_prefix,
        outer_source_v6_prefix: raw.outer_source_v6_prefix,
        mtu: raw.mtu,
        gue_port: raw.gue_port,
        icmp_echo: raw.icmp_echo,
        too_big_no_df: raw.too_big_no_df,
        layout,
        malformed: raw.malformed,
        bpffs: raw.bpffs,
        vips: raw.vips,
        announce: raw.announce,
        shutdown_grace: raw.shutdown_grace,
        detach_on_exit: raw.detach_on_exit,
        warnings,
    })
}

fn check_health(h: &HealthCheck, vip: &VipConfig, at: &str, err: &mut impl FnMut(String, String)) {
    if h.interval < Duration::from_millis(100) || h.interval > Duration::from_secs(3600) {
        err(
            format!("{at}.interval"),
            "must be between 100ms and 1h".into(),
        );
    }
    if h.timeout.is_zero() || h.timeout > h.interval {
        err(
            format!("{at}.timeout"),
            format!(
                "must be above 0 and at most the interval ({})",
                duration::format(&h.interval)
            ),
        );
    }
    for (name, v) in [("rise", h.rise), ("fall", h.fall)] {
        if !(1..=100).contains(&v) {
            err(format!("{at}.{name}"), format!("{v} is out of range 1-100"));
        }
    }
    if h.jitter > 50 {
        err(
            format!("{at}.jitter"),
            format!("{}% is out of range 0-50", h.jitter),
        );
    }
    if h.http.is_some() && (h.send.is_some() || h.expect.is_some()) {
        err(
            at.to_string(),
            "use either `http` or `send`/`expect`, not both".into(),
        );
    }
    if h.expect.as_deref() == Some("") {
        err(format!("{at}.expect"), "must not be empty".into());
    }
    if h.port.is_none() && vip.id.port == 0 {
        err(
            format!("{at}.port"),
            "the VIP covers all ports: say which port to probe".into(),
        );
    }
    if h.port == Some(0) {
        err(format!("{at}.port"), "port 0 cannot be probed".into());
    }
    if h.through_tunnel && vip.id.proto != Protocol::Tcp {
        err(
            format!("{at}.through_tunnel"),
            "probes through the tunnel are TCP: the VIP must be TCP".into(),
        );
    }
}

/// The balancer's tunnel sources, as the VIP rules need them.
struct Sources {
    /// An IPv4 (IPv6) source is configured, fixed or as a prefix.
    v4: bool,
    v6: bool,
    /// The configured source addresses (fixed, or the prefixes' own).
    own: Vec<IpAddr>,
}

impl Sources {
    fn new(
        v4: Option<Ipv4Addr>,
        v6: Option<Ipv6Addr>,
        v4_prefix: Option<Prefix>,
        v6_prefix: Option<Prefix>,
    ) -> Self {
        let own = [
            v4.map(IpAddr::V4),
            v6.map(IpAddr::V6),
            v4_prefix.map(|p| p.addr),
            v6_prefix.map(|p| p.addr),
        ]
        .into_iter()
        .flatten()
        .collect();
        Sources {
            v4: v4.is_some() || v4_prefix.is_some(),
            v6: v6.is_some() || v6_prefix.is_some(),
            own,
        }
    }
}

/// Why `addr` cannot be a tunnel's source address, if it cannot.
fn unusable_source(addr: IpAddr) -> Option<&'static str> {
    if addr.is_unspecified() {
        Some("is unspecified: backends could not answer probes or errors to it")
    } else if addr.is_multicast() {
        Some("is a multicast address")
    } else if addr.is_loopback() {
        Some("is a loopback address: it never leaves this machine")
    } else if addr == IpAddr::V4(Ipv4Addr::BROADCAST) {
        Some("is the broadcast address")
    } else if mapped_v4(addr) {
        Some("is an IPv4-mapped IPv6 address: write the IPv4 address")
    } else {
        None
    }
}

/// `::ffff:a.b.c.d`.
fn mapped_v4(addr: IpAddr) -> bool {
    matches!(addr, IpAddr::V6(a) if a.to_ipv4_mapped().is_some())
}

fn link_local(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.is_unicast_link_local(),
    }
}

/// Why `addr` cannot be a VIP, if it cannot: routers must be able to send
/// it to this balancer.
fn unusable_vip(addr: IpAddr) -> Option<&'static str> {
    if addr.is_unspecified() || addr.is_multicast() || addr == IpAddr::V4(Ipv4Addr::BROADCAST) {
        Some("cannot be a VIP: it is not a unicast address")
    } else if addr.is_loopback() {
        Some("cannot be a VIP: loopback addresses never reach this machine from outside")
    } else if link_local(addr) {
        Some("cannot be a VIP: link-local addresses are not routed")
    } else if mapped_v4(addr) {
        Some("cannot be a VIP: it is an IPv4-mapped IPv6 address; write the IPv4 address")
    } else {
        None
    }
}

/// Why `addr` cannot be a backend (a tunnel destination), if it cannot.
fn unusable_backend(addr: IpAddr) -> Option<&'static str> {
    if addr.is_unspecified() || addr.is_multicast() || addr == IpAddr::V4(Ipv4Addr::BROADCAST) {
        Some("cannot be a backend: it is not a unicast address")
    } else if addr.is_loopback() {
        Some("cannot be a backend: a loopback address is this machine")
    } else if link_local(addr) {
        Some(
            "cannot be a backend: a link-local address needs an interface scope a tunnel does not carry",
        )
    } else if mapped_v4(addr) {
        Some("cannot be a backend: it is an IPv4-mapped IPv6 address; write the IPv4 address")
    } else {
        None
    }
}

/// Rules for a set of VIPs. `from_file`: an empty backend list is an error
/// in a file (a VIP that can never forward), but a state the API may reach.
fn check_vips(
    vips: &[VipConfig],
    layout: &Layout,
    sources: &Sources,
    from_file: bool,
    errors: &mut Vec<ConfigError>,
) -> Vec<String> {
    let (have_v4_source, have_v6_source) = (sources.v4, sources.v6);
    let own = &sources.own;
    let mut warnings = Vec::new();
    let mut err = |field: String, message: String| errors.push(ConfigError { field, message });
    if vips.len() > layout.max_vips as usize {
        err(
            "vips".into(),
            format!("{} VIPs, but max_vips is {}", vips.len(), layout.max_vips),
        );
    }
    let total: usize = vips.iter().map(|v| v.backends.len()).sum();
    if total > layout.max_backends as usize {
        err(
            "vips".into(),
            format!(
                "{total} backends in all, but max_backends is {}",
                layout.max_backends
            ),
        );
    }
    let mut ids = BTreeSet::new();
    let vip_addrs: BTreeSet<IpAddr> = vips.iter().map(|v| v.id.addr).collect();
    let mut frag_hash = std::collections::BTreeMap::new();
    for (i, vip) in vips.iter().enumerate() {
        let at = format!("vips[{i}]");
        if !ids.insert(vip.id) {
            err(at.clone(), format!("VIP {} is defined twice", vip.id));
        }
        if vip.fragments == FragmentPolicy::Hash
            && let Some(other) = frag_hash.insert((vip.id.addr, vip.id.proto), vip.id)
        {
            err(
                format!("{at}.fragments"),
                format!(
                    "VIP {other} already hashes the fragments to {} {}; fragments carry no port, so only one VIP per address and protocol can",
                    vip.id.addr, vip.id.proto
                ),
            );
        }
        if let Some(why) = unusable_vip(vip.id.addr) {
            err(format!("{at}.address"), format!("{} {why}", vip.id.addr));
        } else if own.contains(&vip.id.addr) {
            err(
                format!("{at}.address"),
                format!(
                    "{} is this balancer's tunnel source; a VIP needs an address of its own",
                    vip.id.addr
                ),
            );
        }
        if vip.backends.is_empty() && from_file {
            err(
                format!("{at}.backends"),
                format!("VIP {} has no backends; list at least one", vip.id),
            );
        }
        let mut addrs = BTreeSet::new();
        for (j, b) in vip.backends.iter().enumerate() {
            let at = format!("{at}.backends[{j}]");
            if !addrs.insert(b.address) {
                err(
                    format!("{at}.address"),
                    format!("backend {} is listed twice for VIP {}", b.address, vip.id),
                );
            }
            if b.weight > MAX_WEIGHT {
                err(
                    format!("{at}.weight"),
                    format!("weight {} is out of range 0-{MAX_WEIGHT}", b.weight),
                );
            }
            if let Some(why) = unusable_backend(b.address) {
                err(format!("{at}.address"), format!("{} {why}", b.address));
            } else if vip_addrs.contains(&b.address) {
                err(
                    format!("{at}.address"),
                    format!(
                        "{} is a VIP address of this balancer: its packets would come back here",
                        b.address
                    ),
                );
            } else if own.contains(&b.address) {
                err(
                    format!("{at}.address"),
                    format!(
                        "{} is this balancer's own tunnel source: packets would be tunnelled to itself",
                        b.address
                    ),
                );
            }
            match b.address {
                IpAddr::V4(_) if !have_v4_source => err(
                    format!("{at}.address"),
                    format!(
                        "IPv4 backend {} needs an IPv4 tunnel source: set outer_source_v4",
                        b.address
                    ),
                ),
                IpAddr::V6(_) if !have_v6_source => err(
                    format!("{at}.address"),
                    format!(
                        "IPv6 backend {} needs an IPv6 tunnel source: set outer_source_v6",
                        b.address
                    ),
                ),
                _ => {}
            }
        }
        if let Some(h) = &vip.health_check {
            check_health(h, vip, &format!("{at}.health_check"), &mut err);
        }
        for (j, b) in vip.backends.iter().enumerate() {
            if let Some(h) = &b.health_check {
                check_health(
                    h,
                    vip,
                    &format!("{at}.backends[{j}].health_check"),
                    &mut err,
                );
            }
            if vip.health_check_of(b).is_some_and(|h| h.through_tunnel)
                && b.address.is_ipv4() != vip.id.addr.is_ipv4()
            {
                err(
                    format!("{at}.backends[{j}].address"),
                    format!(
                        "probes through the tunnel need a backend of the VIP's family; {} is not",
                        b.address
                    ),
                );
            }
        }
        if vip.panic_threshold > 100 {
            err(
                format!("{at}.panic_threshold"),
                format!("{}% is out of range 0-100", vip.panic_threshold),
            );
        }
        if vip.slow_start > Duration::from_secs(3600) {
            err(format!("{at}.slow_start"), "is longer than an hour".into());
        }
        if vip.drain_timeout > Duration::from_secs(86_400) {
            err(format!("{at}.drain_timeout"), "is longer than a day".into());
        }
        if vip.min_healthy as usize > vip.backends.len() && !(from_file && vip.backends.is_empty())
        {
            let text = format!(
                "min_healthy {} is more than the {} backend(s) of VIP {}: it would never be announced",
                vip.min_healthy,
                vip.backends.len(),
                vip.id
            );
            // A file that says so is a mistake; the API may pass through
            // such a state while backends are replaced.
            if from_file {
                err(format!("{at}.min_healthy"), text);
            } else {
                warnings.push(format!("{at}.min_healthy: {text}"));
            }
        }
        if !vip.backends.is_empty() && vip.backends.iter().all(|b| b.weight == 0) {
            warnings.push(format!(
                "{at}: VIP {} has no backend with a weight above 0: it will drop every packet sent to it",
                vip.id
            ));
        }
        let live = vip.backends.iter().filter(|b| b.weight > 0).count() as u64;
        if live > 0 && (layout.table_size as u64) < 100 * live {
            warnings.push(format!(
                "{at}: VIP {} has {live} backends; table_size {} is below 100 × {live}, so shares may be off by more than 1%",
                vip.id, layout.table_size
            ));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
instance: t1
interfaces: [eth0]
gateway_mac: "02:00:00:00:00:01"
outer_source_v4: 10.0.0.2
outer_source_v6: fd00::2
table_size: 4099
vips:
  - address: 10.99.0.1
    port: 80
    protocol: tcp
    backends:
      - address: 10.1.0.1
        weight: 2
      - address: 10.1.0.2
  - address: 2001:db8::1
    port: all
    protocol: udp
    encap: gre
    conntrack: false
    backends:
      - address: fd00:1::1
"#;

    fn errors(text: &str) -> Vec<String> {
        Config::parse(text)
            .expect_err("must be rejected")
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn with(replace: &str, by: &str) -> String {
        assert!(GOOD.contains(replace), "fixture lacks {replace:?}");
        GOOD.replacen(replace, by, 1)
    }

    #[test]
    fn a_good_config_parses_with_defaults() {
        let c = Config::parse(GOOD).expect("valid");
        assert_eq!(c.instance, "t1");
        assert_eq!(c.layout.table_size, 4099);
        assert_eq!(c.layout.ct_buckets, 1 << 18);
        assert_eq!(c.xdp_mode, XdpModeSetting::Native);
        assert_eq!(c.gateway, Gateway::Mac(Mac([2, 0, 0, 0, 0, 1])));
        assert_eq!(c.api_socket, PathBuf::from("/run/lb/t1.sock"));
        assert_eq!(c.pin_dir(), PathBuf::from("/sys/fs/bpf/lb/t1"));
        assert_eq!(c.vips.len(), 2);
        assert_eq!(c.vips[0].id.to_string(), "10.99.0.1:80/tcp");
        assert_eq!(c.vips[0].backends[1].weight, 1, "default weight");
        assert!(c.vips[0].conntrack);
        assert_eq!(c.vips[1].id.to_string(), "[2001:db8::1]:*/udp");
        assert_eq!(c.vips[1].encap, Encap::Gre);
        assert!(!c.vips[1].conntrack);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn unknown_field_names_field_and_line() {
        let e = errors(&with("        weight: 2", "        wieght: 2"));
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("vips[0].backends[0]: unknown field `wieght`"),
            "{e:?}"
        );
        assert!(e[0].contains("line 14"), "{e:?}");
    }

    #[test]
    fn bad_address_names_field_and_line() {
        let e = errors(&with("address: 10.1.0.2", "address: 10.1.0.300"));
        assert!(
            e[0].starts_with("vips[0].backends[1].address: invalid IP address"),
            "{e:?}"
        );
        assert!(e[0].contains("line 15"), "{e:?}");
    }

    #[test]
    fn bad_port_protocol_encap_mac_are_named() {
        assert!(
            errors(&with("port: 80", "port: 70000"))[0]
                .starts_with("vips[0].port: port 70000 is out of range")
        );
        assert!(
            errors(&with("port: 80", "port: http"))[0]
                .starts_with("vips[0].port: `http` is not a port")
        );
        assert!(
            errors(&with("protocol: tcp", "protocol: sctp"))[0]
                .starts_with("vips[0].protocol: unknown variant `sctp`")
        );
        assert!(
            errors(&with("encap: gre", "encap: vxlan"))[0]
                .starts_with("vips[1].encap: unknown variant `vxlan`")
        );
        assert!(
            errors(&with("\"02:00:00:00:00:01\"", "\"02:00:00:00:01\""))[0]
                .starts_with("gateway_mac: `02:00:00:00:01` is not a MAC address")
        );
    }

    #[test]
    fn duplicate_vip_and_backend() {
        let dup_vip = format!(
            "{GOOD}  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.1.0.9\n"
        );
        assert_eq!(
            errors(&dup_vip),
            vec!["vips[2]: VIP 10.99.0.1:80/tcp is defined twice"]
        );
        let e = errors(&with("address: 10.1.0.2", "address: 10.1.0.1"));
        assert_eq!(
            e,
            vec![
                "vips[0].backends[1].address: backend 10.1.0.1 is listed twice for VIP 10.99.0.1:80/tcp"
            ]
        );
    }

    #[test]
    fn table_size_must_be_prime_and_not_too_large_and_warns_when_small() {
        assert!(
            errors(&with("table_size: 4099", "table_size: 4096"))[0]
                .starts_with("table_size: 4096 is not prime")
        );
        assert!(
            errors(&with("table_size: 4099", "table_size: 16777259"))[0]
                .starts_with("table_size: 16777259 is larger than the maximum, 16777216")
        );
        let c = Config::parse(&with("table_size: 4099", "table_size: 101")).expect("valid");
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("below 100 × 2"), "{:?}", c.warnings);
    }

    #[test]
    fn a_vip_whose_weights_are_all_zero_is_warned_about() {
        let text = with("weight: 2", "weight: 0").replace(
            "      - address: 10.1.0.2\n",
            "      - address: 10.1.0.2\n        weight: 0\n",
        );
        let c = Config::parse(&text).expect("still valid");
        assert!(
            c.warnings
                .iter()
                .any(|w| w
                    .contains("has no backend with a weight above 0: it will drop every packet")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn weight_out_of_range() {
        assert_eq!(
            errors(&with("weight: 2", "weight: 10001")),
            vec!["vips[0].backends[0].weight: weight 10001 is out of range 0-10000"]
        );
        assert!(
            errors(&with("weight: 2", "weight: -1"))[0]
                .starts_with("vips[0].backends[0].weight: invalid type")
        );
    }

    #[test]
    fn shipped_configurations_parse() {
        for (name, text) in [
            ("example.yaml", include_str!("../../config/example.yaml")),
            ("minimal.yaml", include_str!("../../config/minimal.yaml")),
            ("health.yaml", include_str!("../../config/health.yaml")),
            ("demo.yaml", include_str!("../../config/demo.yaml")),
        ] {
            if let Err(e) = Config::parse(text) {
                panic!("config/{name}: {e}");
            }
        }
    }

    #[test]
    fn datapath_defaults_are_on() {
        let c = Config::parse(GOOD).expect("valid");
        assert_eq!(c.mtu, 1500);
        assert_eq!(c.gue_port, GUE_PORT);
        assert!(c.icmp_echo);
        assert_eq!(c.too_big_no_df, TooBigPolicy::Drop);
        assert!(c.vips.iter().all(|v| v.fragments == FragmentPolicy::Drop));
        assert_eq!(c.outer_source_v4_prefix, None);
    }

    #[test]
    fn datapath_settings_parse() {
        let text = with(
            "table_size: 4099",
            "table_size: 4099\nmtu: 9000\ngue_port: 7000\nicmp_echo: false\ntoo_big_no_df: pass",
        )
        .replace(
            "conntrack: false",
            "conntrack: false\n    fragments: hash\n    encap: gue",
        )
        .replace("    encap: gre\n", "");
        let c = Config::parse(&text).expect("valid");
        assert_eq!((c.mtu, c.gue_port, c.icmp_echo), (9000, 7000, false));
        assert_eq!(c.too_big_no_df, TooBigPolicy::Pass);
        assert_eq!(c.vips[1].fragments, FragmentPolicy::Hash);
        assert_eq!(c.vips[1].encap, Encap::Gue);
        // Written back in the same shape.
        let yaml = serde_yaml::to_string(&c.vips[1]).expect("serialize");
        assert!(yaml.contains("fragments: hash"), "{yaml}");
        assert!(yaml.contains("encap: gue"), "{yaml}");
    }

    #[test]
    fn mtu_too_small_for_ipv6_is_rejected() {
        assert_eq!(
            errors(&with("table_size: 4099", "table_size: 4099\nmtu: 1300")),
            vec![
                "mtu: 1300 is below 1328 (1280, the IPv6 minimum, plus 48 bytes of encapsulation); 0 turns the check off"
            ]
        );
        Config::parse(&with("table_size: 4099", "table_size: 4099\nmtu: 0")).expect("0 is off");
    }

    #[test]
    fn outer_source_prefixes() {
        let c = Config::parse(
            &GOOD
                .replace(
                    "outer_source_v4: 10.0.0.2",
                    "outer_source_v4_prefix: 10.99.0.0/16",
                )
                .replace(
                    "outer_source_v6: fd00::2",
                    "outer_source_v6_prefix: fd00:99::/96",
                ),
        )
        .expect("prefixes stand in for fixed sources");
        let p = c.outer_source_v4_prefix.expect("v4 prefix");
        assert_eq!((p.to_string(), p.host_bits()), ("10.99.0.0/16".into(), 16));
        assert_eq!(c.outer_source_v6_prefix.expect("v6").host_bits(), 32);

        assert_eq!(
            errors(&with(
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4: 10.0.0.2\nouter_source_v4_prefix: 10.99.0.0/16"
            )),
            vec![
                "outer_source_v4_prefix: set either outer_source_v4 or outer_source_v4_prefix, not both"
            ]
        );
        assert_eq!(
            errors(&GOOD.replace(
                "outer_source_v6: fd00::2",
                "outer_source_v6_prefix: fd00:99::/64"
            )),
            vec![
                "outer_source_v6_prefix: fd00:99::/64: the prefix must be /96 or longer (host bits come from the client's last 32 bits)"
            ]
        );
        assert_eq!(
            errors(&GOOD.replace(
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4_prefix: fd00::/120"
            )),
            vec!["outer_source_v4_prefix: fd00::/120 is not an IPv4 prefix"]
        );
        assert!(
            errors(&GOOD.replace(
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4_prefix: 10.0.0.0/33"
            ))[0]
                .contains("`33` is not a prefix length 0-32")
        );
    }

    #[test]
    fn one_vip_per_address_and_protocol_hashes_fragments() {
        let text = r#"
interfaces: [eth0]
outer_source_v4: 10.0.0.2
vips:
  - {address: 10.99.0.1, port: 53, protocol: udp, fragments: hash, backends: [{address: 10.1.0.1}]}
  - {address: 10.99.0.1, port: 5353, protocol: udp, fragments: hash, backends: [{address: 10.1.0.1}]}
  - {address: 10.99.0.1, port: 53, protocol: tcp, fragments: hash, backends: [{address: 10.1.0.1}]}
"#;
        assert_eq!(
            errors(text),
            vec![
                "vips[1].fragments: VIP 10.99.0.1:53/udp already hashes the fragments to 10.99.0.1 udp; fragments carry no port, so only one VIP per address and protocol can"
            ]
        );
    }

    #[test]
    fn empty_vip_is_rejected() {
        let text = "interfaces: [eth0]\nouter_source_v4: 10.0.0.2\nvips:\n  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n";
        assert_eq!(
            errors(text),
            vec!["vips[0].backends: VIP 10.99.0.1:80/tcp has no backends; list at least one"]
        );
    }

    #[test]
    fn backend_family_needs_an_outer_source() {
        let e = errors(&with("outer_source_v6: fd00::2\n", ""));
        assert_eq!(
            e,
            vec![
                "vips[1].backends[0].address: IPv6 backend fd00:1::1 needs an IPv6 tunnel source: set outer_source_v6"
            ]
        );
    }

    #[test]
    fn several_errors_are_reported_together() {
        let text =
            with("table_size: 4099", "table_size: 4096").replace("weight: 2", "weight: 20000");
        let e = errors(&text);
        assert_eq!(e.len(), 2, "layout errors and VIP errors together: {e:?}");
        let text =
            with("weight: 2", "weight: 20000").replace("address: 10.1.0.2", "address: 10.1.0.1");
        assert_eq!(errors(&text).len(), 2);
    }

    #[test]
    fn every_problem_of_a_file_is_reported_in_one_run() {
        // Three parse errors in three places (a top-level setting, a
        // backend of the first VIP, the port of the second) and a rule
        // broken by a part that did parse.
        let text = with("table_size: 4099", "table_size: 4099\nmtu: lots")
            .replace("        weight: 2", "        wieght: 2")
            .replace("port: all", "port: 0")
            .replace("instance: t1", "instance: \"t 1\"");
        let e = errors(&text);
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(
            e.iter()
                .any(|m| m.starts_with("vips[0].backends[0]: unknown field `wieght`")),
            "{e:?}"
        );
        // serde_yaml's first error keeps its line.
        assert!(
            e.iter()
                .any(|m| m.starts_with("mtu: ") && m.contains("at line 8")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("vips[1].port: port 0 is not a port")
                    || m.starts_with("vips[1]: port 0 is not a port")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("instance: `t 1` must be")),
            "{e:?}"
        );
    }

    #[test]
    fn addresses_sizes_and_paths_that_cannot_work_are_named() {
        // (what the file says instead of the good value, the error)
        let cases: &[(&str, &str, &str)] = &[
            (
                "table_size: 4099",
                "table_size: 4099\nconntrack_buckets: 1",
                "conntrack_buckets: 1 buckets hold 6 flows",
            ),
            (
                "table_size: 4099",
                "table_size: 13",
                "table_size: 13 slots cannot balance",
            ),
            ("    port: 80", "    port: 0", "port 0 is not a port"),
            (
                "  - address: 10.99.0.1",
                "  - address: 127.0.0.1",
                "127.0.0.1 cannot be a VIP: loopback",
            ),
            (
                "  - address: 10.99.0.1",
                "  - address: 255.255.255.255",
                "255.255.255.255 cannot be a VIP: it is not a unicast",
            ),
            (
                "  - address: 10.99.0.1",
                "  - address: \"::ffff:198.51.100.1\"",
                "::ffff:198.51.100.1 cannot be a VIP: it is an IPv4-mapped",
            ),
            (
                "  - address: 10.99.0.1",
                "  - address: 169.254.1.1",
                "169.254.1.1 cannot be a VIP: link-local",
            ),
            (
                "      - address: 10.1.0.1",
                "      - address: 255.255.255.255",
                "255.255.255.255 cannot be a backend",
            ),
            (
                "      - address: fd00:1::1",
                "      - address: fe80::1",
                "fe80::1 cannot be a backend: a link-local",
            ),
            (
                "      - address: fd00:1::1",
                "      - address: \"::ffff:127.0.0.1\"",
                "::ffff:127.0.0.1 cannot be a backend",
            ),
            (
                "      - address: 10.1.0.1",
                "      - address: 10.99.0.1",
                "10.99.0.1 is a VIP address of this balancer",
            ),
            (
                "      - address: 10.1.0.1",
                "      - address: 10.0.0.2",
                "10.0.0.2 is this balancer's own tunnel source",
            ),
            (
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4: 0.0.0.0",
                "outer_source_v4: 0.0.0.0 is unspecified",
            ),
            (
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4: 224.0.0.5",
                "outer_source_v4: 224.0.0.5 is a multicast",
            ),
            (
                "outer_source_v6: fd00::2",
                "outer_source_v6: \"::1\"",
                "outer_source_v6: ::1 is a loopback",
            ),
            (
                "instance: t1",
                "instance: t1\napi_socket: \"\"",
                "api_socket: must not be empty",
            ),
            (
                "instance: t1",
                "instance: t1\nstate_file: \"\"",
                "state_file: must not be empty",
            ),
        ];
        for (from, to, want) in cases {
            assert!(GOOD.contains(from), "{from}");
            let e = errors(&with(from, to));
            assert!(
                e.iter().any(|m| m.contains(want)),
                "`{to}`: want an error containing {want:?}, got {e:?}"
            );
        }
        // The same rules hold for API changes (runtime VIPs).
        let c = Config::parse(GOOD).expect("good");
        let mut vips = c.vips.clone();
        vips[0].backends[0].address = "10.99.0.1".parse().unwrap();
        let e = c.check_vips(&vips).expect_err("a VIP as a backend");
        assert!(
            e.to_string().contains("is a VIP address of this balancer"),
            "{e}"
        );
        assert!(
            "10.0.0.1:0/tcp"
                .parse::<VipId>()
                .unwrap_err()
                .contains("port 0 is not a port")
        );
    }

    #[test]
    fn bounds_on_size_nesting_and_echoed_values() {
        let deep = format!("instance: {}{}\n", "[".repeat(40_000), "]".repeat(40_000));
        let started = std::time::Instant::now();
        let e = errors(&deep);
        assert!(e[0].contains("nested 40000 deep"), "{e:?}");
        // Refused by the scan, before the parser: well under a second on
        // any machine (the parser took seven).
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let big = format!("{GOOD}# {}\n", "x".repeat(17 << 20));
        assert!(errors(&big)[0].contains("larger than 16 MiB"));
        let long = with(
            "instance: t1",
            &format!("instance: {}", "y".repeat(10 << 20)),
        );
        let e = errors(&long);
        assert!(
            e[0].contains("(10485760 bytes)"),
            "{}",
            &e[0][..200.min(e[0].len())]
        );
        assert!(e.iter().all(|m| m.len() < 400), "every message is cut");
    }

    #[test]
    fn interfaces_and_instance_are_checked() {
        assert!(
            errors(&with("interfaces: [eth0]", "interfaces: []"))[0]
                .starts_with("interfaces: at least one")
        );
        assert!(
            errors(&with("interfaces: [eth0]", "interfaces: [eth0, eth0]"))[0]
                .starts_with("interfaces[1]: `eth0` is listed twice")
        );
        assert!(
            errors(&with("instance: t1", "instance: a/b"))[0]
                .starts_with("instance: `a/b` must be")
        );
        assert!(
            errors(&with(
                "interfaces: [eth0]",
                "interfaces: [averyveryverylongname]"
            ))[0]
                .starts_with("interfaces[0]")
        );
    }

    #[test]
    fn health_settings_parse_and_are_checked() {
        let hc = |body: &str| {
            with(
                "    backends:\n      - address: 10.1.0.1",
                &format!("{body}    backends:\n      - address: 10.1.0.1"),
            )
        };
        let c = Config::parse(&hc("    health_check:\n      interval: 500ms\n      timeout: 0.2\n      http: { path: /h }\n    slow_start: 1m\n    drain_timeout: 90\n")).expect("valid");
        let v = &c.vips[0];
        let h = v.health_check.as_ref().expect("check");
        assert_eq!(
            (h.interval, h.timeout),
            (Duration::from_millis(500), Duration::from_millis(200))
        );
        assert_eq!((h.rise, h.fall, h.jitter), (2, 3, 10));
        assert_eq!(
            h.http.as_ref().map(|h| (h.path.as_str(), h.status)),
            Some(("/h", 200))
        );
        assert_eq!(
            (v.slow_start, v.drain_timeout),
            (Duration::from_secs(60), Duration::from_secs(90))
        );
        assert_eq!(h.detection_bound(), Duration::from_millis(1850));

        for (body, want) in [
            (
                "    health_check:\n      interval: 1s\n      timeout: 2s\n",
                "vips[0].health_check.timeout: must be above 0 and at most the interval",
            ),
            (
                "    health_check:\n      http: {}\n      expect: x\n",
                "vips[0].health_check: use either `http` or `send`/`expect`",
            ),
            (
                "    health_check:\n      fall: 0\n",
                "vips[0].health_check.fall: 0 is out of range",
            ),
            (
                "    health_check:\n      interval: 2 days\n",
                "vips[0].health_check.interval: unknown unit",
            ),
            (
                "    panic_threshold: 150\n",
                "vips[0].panic_threshold: 150% is out of range",
            ),
        ] {
            let e = errors(&hc(body));
            assert!(e[0].starts_with(want), "{body:?}: {e:?}");
        }
        // An all-ports VIP must say which port to probe.
        let e = errors(&with("encap: gre\n", "encap: gre\n    health_check: {}\n"));
        assert!(
            e[0].starts_with("vips[1].health_check.port: the VIP covers all ports"),
            "{e:?}"
        );
        // Tunnelled probes need a backend of the VIP's family.
        let e = errors(&with(
            "encap: gre\n",
            "encap: gre\n    health_check: { port: 53, through_tunnel: true }\n",
        ));
        assert!(
            e.iter().any(|e| e.starts_with(
                "vips[1].health_check.through_tunnel: probes through the tunnel are TCP"
            )),
            "{e:?}"
        );
    }

    #[test]
    fn announce_settings_parse_with_defaults_and_are_checked() {
        let c = Config::parse(GOOD).expect("valid");
        assert_eq!(c.announce, AnnounceConfig::default());
        assert_eq!(c.shutdown_grace, Duration::from_secs(5));
        assert!(!c.detach_on_exit);
        assert_eq!(c.vips[0].min_healthy, 1);

        let text = format!(
            "{GOOD}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    peers:\n      - {{ address: 10.0.0.1, remote_as: 65000 }}\nshutdown_grace: 2s\ndetach_on_exit: true\n"
        );
        let c = Config::parse(&text.replace(
            "    protocol: tcp\n",
            "    protocol: tcp\n    min_healthy: 2\n",
        ))
        .expect("valid");
        assert_eq!(c.announce.bgp.as_ref().map(|b| b.local_as), Some(65001));
        assert_eq!(c.shutdown_grace, Duration::from_secs(2));
        assert!(c.detach_on_exit);
        assert_eq!(c.vips[0].min_healthy, 2);

        // The announcers' own errors come under `announce.`.
        let e = errors(&text.replace("local_as: 65001", "local_as: 0"));
        assert_eq!(e, vec!["announce.bgp.local_as: AS 0 is reserved"]);
        let e = errors(&format!("{GOOD}announce:\n  bpg: {{}}\n"));
        assert!(e[0].starts_with("announce: unknown field `bpg`"), "{e:?}");
        assert_eq!(
            errors(&format!("{GOOD}shutdown_grace: 1h\n")),
            vec!["shutdown_grace: is longer than 10 minutes"]
        );
        // A min_healthy no VIP can meet is a mistake in a file, a warning
        // through the API.
        let e = errors(&with(
            "    protocol: tcp\n",
            "    protocol: tcp\n    min_healthy: 3\n",
        ));
        assert_eq!(
            e,
            vec![
                "vips[0].min_healthy: min_healthy 3 is more than the 2 backend(s) of VIP 10.99.0.1:80/tcp: it would never be announced"
            ]
        );
        let mut vips = c.vips.clone();
        vips[0].min_healthy = 3;
        let warnings = c.check_vips(&vips).expect("allowed at runtime");
        assert!(warnings[0].contains("never be announced"), "{warnings:?}");
    }

    #[test]
    fn durations_parse_and_print() {
        for (text, d) in [
            ("500ms", 500),
            ("2s", 2000),
            ("1.5s", 1500),
            ("3m", 180_000),
            ("1h", 3_600_000),
            ("7", 7000),
        ] {
            assert_eq!(
                duration::parse(text),
                Ok(Duration::from_millis(d)),
                "{text}"
            );
        }
        assert_eq!(duration::format(&Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration::format(&Duration::from_secs(30)), "30s");
        assert!(duration::parse("soon").is_err());
    }

    #[test]
    fn vip_ids_round_trip() {
        for s in ["10.0.0.1:80/tcp", "[2001:db8::1]:443/udp", "10.0.0.1:*/tcp"] {
            assert_eq!(s.parse::<VipId>().expect(s).to_string(), s);
        }
        assert_eq!("10.0.0.1:all/tcp".parse::<VipId>().unwrap().port, 0);
        for bad in [
            "10.0.0.1:80",
            "10.0.0.1/tcp",
            "x:80/tcp",
            "10.0.0.1:99999/tcp",
            "10.0.0.1:80/sctp",
        ] {
            assert!(bad.parse::<VipId>().is_err(), "{bad}");
        }
    }

    /// The fields serde knows for `T`, read from its "unknown field"
    /// error, so this list can never fall behind the types.
    fn fields_of<T: serde::de::DeserializeOwned + fmt::Debug>() -> Vec<String> {
        let e = serde_yaml::from_str::<T>("__no_such_field__: 1\n").expect_err("unknown field");
        let text = e.to_string();
        let list = text
            .split_once("expected one of ")
            .or_else(|| text.split_once("expected "))
            .map(|(_, l)| l)
            .unwrap_or_else(|| panic!("no field list in {text}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_annotated_example_names_every_setting() {
        let example = include_str!("../../config/example.yaml");
        let mut all = fields_of::<RawConfig>();
        all.extend(fields_of::<RawVip>());
        all.extend(fields_of::<BackendConfig>());
        all.extend(fields_of::<HealthCheck>());
        all.extend(fields_of::<HttpCheck>());
        all.extend(fields_of::<crate::announce::AnnounceConfig>());
        all.extend(fields_of::<crate::announce::bgp::BgpConfig>());
        all.extend(fields_of::<crate::announce::bgp::PeerConfig>());
        all.extend(fields_of::<crate::announce::bgp::ConnectRetry>());
        all.extend(fields_of::<crate::announce::exabgp::ExabgpConfig>());
        all.extend(fields_of::<crate::announce::exec::ExecConfig>());
        assert!(all.len() > 60, "{all:?}");
        let missing: Vec<&String> = all
            .iter()
            .filter(|f| !example.contains(&format!("{f}:")))
            .collect();
        assert!(
            missing.is_empty(),
            "config/example.yaml does not show {missing:?}"
        );
    }

    #[test]
    fn every_example_in_config_dir_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("config/ exists") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 2, "expected example configs in {}", dir.display());
    }
}

//! VIPs and their backends as configured: the identity of a VIP
//! ([`VipId`], written `10.0.0.1:80/tcp`), its settings ([`VipConfig`]),
//! its backends, and the rules a set of VIPs must follow
//! ([`check_vips`]: duplicates, address classes, families against the
//! tunnel sources, limits, fragment hashing, weights).

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, Ipv4Addr},
    str::FromStr,
    time::Duration,
};

use lb_common::{
    VipKey,
    consts::{
        ENCAP_GRE, ENCAP_GUE, ENCAP_IPIP, PROTO_TCP, PROTO_UDP, VIP_F_HASH_NO_DPORT,
        VIP_F_HASH_NO_SPORT,
    },
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::{
    datapath::{Sources, link_local, mapped_v4},
    duration,
    error::{ConfigError, excerpt, from_str_field},
    health::{HealthCheck, ProbedVip, check_health},
    quic::{QuicConfig, ServerId},
};
use crate::{
    dataplane::{
        Layout,
        pool::{CHUNK_BYTES, region_chunks},
    },
    maglev,
};

/// Largest weight accepted in a configuration.
pub const MAX_WEIGHT: u32 = 10_000;

/// Smallest `table_size` (global or a VIP's): Maglev balances N backends
/// within 1% only when M ≥ 100·N, so fewer than 101 slots balance not even
/// one pair well (a larger table below 100·N is only warned about).
pub const MIN_TABLE_SIZE: u32 = 101;

/// Why `m` cannot be a Maglev table size, if it cannot.
pub fn table_size_problem(m: u32) -> Option<String> {
    if !maglev::is_prime(m) {
        Some(format!(
            "{m} is not prime; Maglev needs a prime, e.g. 1009, 10007, 65537 or 131071"
        ))
    } else if m > maglev::MAX_TABLE_SIZE {
        Some(format!(
            "{m} is larger than the maximum, {}",
            maglev::MAX_TABLE_SIZE
        ))
    } else if m < MIN_TABLE_SIZE {
        Some(format!(
            "{m} slots cannot balance even a few backends; the least is {MIN_TABLE_SIZE} (65537 is the default)"
        ))
    } else {
        None
    }
}

/// `chunks` of the table pool as MiB, for messages.
pub fn pool_mib(chunks: u64) -> String {
    format!(
        "{:.1} MiB",
        (chunks * CHUNK_BYTES) as f64 / (1 << 20) as f64
    )
}

/// L4 protocol of a VIP.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
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

impl schemars::JsonSchema for VipId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "VipId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A VIP: ADDRESS:PORT/PROTO, e.g. 10.0.0.1:80/tcp, [2001:db8::1]:443/tcp, 10.0.0.1:*/udp (all ports); lbd writes it so",
            "pattern": "^.+:([0-9]{1,5}|\\*|all)/([Tt][Cc][Pp]|[Uu][Dd][Pp])$"
        })
    }
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
                    // A quoted number is a template that went wrong as
                    // often as not: say so rather than guess.
                    _ if v.parse::<u64>().is_ok() => Err(E::custom(format!(
                        "port {} is quoted: write it as a number ({v}), or `all`",
                        excerpt(v)
                    ))),
                    _ => Err(E::custom(format!(
                        "{} is not a port (1-65535 or `all`)",
                        excerpt(v)
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    #[serde(deserialize_with = "backend_address")]
    pub address: IpAddr,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Replaces the VIP's health check for this backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Its QUIC-LB server ID (a VIP with `quic:`): short-header packets
    /// whose connection ID carries it come here from any client address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<ServerId>,
}

impl BackendConfig {
    pub fn new(address: IpAddr, weight: u32) -> Self {
        Self {
            address,
            weight,
            health_check: None,
            server_id: None,
        }
    }
}

/// A backend's address as written: an IP address, never with a port (the
/// ipvsadm habit `10.0.0.2:8080` gets the reason).
pub fn parse_backend_address(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>().map_err(|_| match s.parse::<std::net::SocketAddr>() {
        Ok(with_port) => format!(
            "{s}: a backend takes no port: it is sent the VIP's own port (with direct server return the packet reaches the backend as the client sent it, and the backend answers from the VIP's address and port); write {}",
            with_port.ip()
        ),
        Err(_) => format!("{} is not an IP address", excerpt(s)),
    })
}

/// Deserializes a backend's address: the error is raised while the
/// parser is at the value, so it names the field and the line.
fn backend_address<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    struct Address;
    impl de::Visitor<'_> for Address {
        type Value = IpAddr;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an IP address")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<IpAddr, E> {
            parse_backend_address(s).map_err(E::custom)
        }
    }
    d.deserialize_str(Address)
}

fn default_weight() -> u32 {
    1
}

/// States every setting of a VIP once: its doc, type and default, and
/// how the file reads and writes it (serde attributes). From the one list
/// it makes [`VipConfig`] and [`VipConfig::new`] (the defaults),
/// [`RawVip`] (the file's form: a setting left out takes the default
/// stated here) and the written form that configuration digests hash
/// (`Written`, fields in the list's order). A new setting is one entry
/// here, a row in [`super::vip_settings::VIP_SETTINGS`] (a test fails
/// without it), its rule in [`VipRules`] if it has one, and its use.
macro_rules! vip_settings {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty = $default:expr, read $read:literal
            $(, write($($write:tt)*))?;
    )*) => {
        /// A VIP as configured (in the file or through the API).
        /// Serialized in the same shape as the file (`address`, `port`,
        /// `protocol`, ...).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct VipConfig {
            pub id: VipId,
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl VipConfig {
            /// A VIP with default settings.
            pub fn new(id: VipId, backends: Vec<BackendConfig>) -> Self {
                let mut vip = Self { id, $( $name: $default, )* };
                vip.backends = backends;
                vip
            }
        }

        /// The VIP as written in YAML or JSON.
        #[derive(Clone, Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawVip {
            address: IpAddr,
            port: PortSpec,
            protocol: Protocol,
            $( #[serde(default, deserialize_with = $read)] $name: Option<$ty>, )*
        }

        impl RawVip {
            fn into_vip(self) -> VipConfig {
                VipConfig {
                    id: VipId {
                        addr: self.address,
                        port: self.port.0,
                        proto: self.protocol,
                    },
                    $( $name: self.$name.unwrap_or_else(|| $default), )*
                }
            }
        }

        /// The VIP as written back: the file's keys, in its order.
        #[derive(Serialize)]
        struct Written {
            address: IpAddr,
            port: WrittenPort,
            protocol: Protocol,
            $( $(#[serde($($write)*)])? $name: $ty, )*
        }

        impl From<&VipConfig> for Written {
            fn from(v: &VipConfig) -> Self {
                Written {
                    address: v.id.addr,
                    port: match v.id.port {
                        0 => WrittenPort::All("all"),
                        p => WrittenPort::Number(p),
                    },
                    protocol: v.id.proto,
                    $( $name: v.$name.clone(), )*
                }
            }
        }
    };
}

vip_settings! {
    encap: Encap = Encap::default(), read "present";
    /// Use the connection table (default). UDP services whose backends
    /// keep no per-flow state may turn it off.
    conntrack: bool = true, read "present";
    /// Fragments: dropped (default) or hashed on the 3-tuple.
    fragments: FragmentPolicy = FragmentPolicy::default(), read "present";
    backends: Vec<BackendConfig> = Vec::new(), read "present";
    /// Probes for the backends; `None`: no probing, backends count as up.
    health_check: Option<HealthCheck> = None, read "present",
        write(skip_serializing_if = "Option::is_none");
    /// How long a draining backend keeps its existing connections.
    drain_timeout: Duration = Duration::from_secs(60), read "duration::some",
        write(with = "duration");
    /// A backend that joins or recovers ramps its weight up over this long.
    slow_start: Duration = Duration::ZERO, read "duration::some",
        write(with = "duration");
    /// Below this percentage of usable backends, the table is built from
    /// all of them (fail open).
    panic_threshold: u32 = 50, read "present";
    /// The VIP's address is announced (BGP, ExaBGP, exec) only while at
    /// least this many of its backends are usable (active or in slow
    /// start); at least 1.
    min_healthy: u32 = 1, read "present";
    /// Ejecting backends whose clients' SYNs go unanswered.
    passive_health: super::passive::PassiveHealth = Default::default(), read "present";
    /// The VIP's own Maglev table size M (a prime); `None`: the global
    /// `table_size`. Never derived from the backends: changing M moves
    /// every flow of the VIP to a new slot.
    table_size: Option<u32> = None, read "present",
        write(skip_serializing_if = "Option::is_none");
    /// Second chance (TCP): a mid-flow packet this balancer never placed
    /// carries the backends other tables give its flow, and a backend
    /// that does not hold the connection hands it on. Needs lb's decap
    /// program on every backend; off by default (ARCHITECTURE.md, "Second
    /// chance"). Not written when off, so that configurations written
    /// before it existed keep their digests.
    second_chance: bool = false, read "present",
        write(skip_serializing_if = "is_false");
    /// The fields that pick a new flow's backend (the 5-tuple by default;
    /// `[src_ip]`: every connection of a client to one backend). Not
    /// written for the 5-tuple, likewise.
    hash: super::hash::HashFields = super::hash::HashFields::FIVE_TUPLE, read "present",
        write(skip_serializing_if = "super::hash::HashFields::is_default");
    /// QUIC by connection ID (UDP): the QUIC-LB configuration of the
    /// connection IDs the backends issue, each with its `server_id`; `None`:
    /// QUIC is hashed on the 4-tuple like any UDP.
    quic: Option<QuicConfig> = None, read "present",
        write(skip_serializing_if = "Option::is_none");
}

/// A port as written back: a number, or `all` (0 is refused in a file).
#[derive(Serialize)]
#[serde(untagged)]
enum WrittenPort {
    Number(u16),
    All(&'static str),
}

impl VipConfig {
    /// The VIP's Maglev table size: its own, else `layout`'s default.
    pub fn maglev_size(&self, layout: &Layout) -> u32 {
        self.table_size.unwrap_or(layout.table_size)
    }

    /// The health check of one backend: its own, else the VIP's.
    pub fn health_check_of<'a>(&'a self, b: &'a BackendConfig) -> Option<&'a HealthCheck> {
        b.health_check.as_ref().or(self.health_check.as_ref())
    }
}

/// `deserialize_with` of a VIP setting written in the file: its value,
/// which must be there (`min_healthy:` without a value is refused, as it
/// was before settings became optional in [`RawVip`]); its default when
/// the key is left out comes from [`vip_settings!`].
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

pub(crate) fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Serialize for VipConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Written::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for VipConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawVip::deserialize(d).map(RawVip::into_vip)
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
pub(crate) fn check_vips(
    vips: &[VipConfig],
    layout: &Layout,
    sources: &Sources,
    mtu: u16,
    from_file: bool,
    errors: &mut Vec<ConfigError>,
) -> Vec<String> {
    let mut rules = VipRules {
        layout,
        sources,
        mtu,
        from_file,
        vip_addrs: vips.iter().map(|v| v.id.addr).collect(),
        errors,
        warnings: Vec::new(),
    };
    if vips.len() > layout.max_vips as usize {
        rules.err(
            "vips".into(),
            format!("{} VIPs, but max_vips is {}", vips.len(), layout.max_vips),
        );
    }
    let total: usize = vips.iter().map(|v| v.backends.len()).sum();
    if total > layout.max_backends as usize {
        rules.err(
            "vips".into(),
            format!(
                "{total} backends in all, but max_backends is {}",
                layout.max_backends
            ),
        );
    }
    rules.pool(vips);
    let mut ids = BTreeSet::new();
    let mut frag_hash = std::collections::BTreeMap::new();
    for (i, vip) in vips.iter().enumerate() {
        let at = vip_field(i, vip, from_file);
        if !ids.insert(vip.id) {
            rules.err(at.clone(), format!("VIP {} is defined twice", vip.id));
        }
        if vip.fragments == FragmentPolicy::Hash
            && let Some(other) = frag_hash.insert((vip.id.addr, vip.id.proto), vip.id)
        {
            rules.err(
                format!("{at}.fragments"),
                format!(
                    "VIP {other} already hashes the fragments to {} {}; fragments carry no port, so only one VIP per address and protocol can",
                    vip.id.addr, vip.id.proto
                ),
            );
        }
        rules.vip_address(vip, &at);
        for (j, b) in vip.backends.iter().enumerate() {
            rules.backend(vip, b, &format!("{at}.backends[{j}]"));
        }
        rules.duplicates(vip, &at);
        rules.health(vip, &at);
        rules.settings(vip, &at);
        rules.table_size(vip, &at);
        rules.shares(vip, &at);
        rules.second_chance(vip, &at);
        rules.quic(vip, &at);
    }
    let second_chance = vips.iter().filter(|v| v.second_chance).count();
    if second_chance > layout.second_chance_vips as usize {
        rules.err(
            "vips".into(),
            format!(
                "{second_chance} VIPs with second_chance, but second_chance_vips is {}",
                layout.second_chance_vips
            ),
        );
    }
    rules.warnings
}

/// How an error names a VIP: its place in the file (`vips[2]`), or, for a
/// set that is not the file's (the file with runtime changes), the VIP
/// itself (`VIP 10.0.0.1:80/tcp`).
pub(crate) fn vip_field(i: usize, vip: &VipConfig, from_file: bool) -> String {
    if from_file {
        format!("vips[{i}]")
    } else {
        format!("VIP {}", vip.id)
    }
}

/// The rules of [`check_vips`], one method per concern, and what they found.
struct VipRules<'a> {
    layout: &'a Layout,
    sources: &'a Sources,
    /// The path MTU toward the backends (0: unchecked).
    mtu: u16,
    from_file: bool,
    /// Every VIP address of the set (a backend must be none of them).
    vip_addrs: BTreeSet<IpAddr>,
    errors: &'a mut Vec<ConfigError>,
    warnings: Vec<String>,
}

impl VipRules<'_> {
    fn err(&mut self, field: String, message: String) {
        self.errors.push(ConfigError { field, message });
    }

    /// The VIP's own address, and that it has backends (in a file).
    fn vip_address(&mut self, vip: &VipConfig, at: &str) {
        if let Some(why) = unusable_vip(vip.id.addr) {
            self.err(format!("{at}.address"), format!("{} {why}", vip.id.addr));
        } else if self.sources.own.contains(&vip.id.addr) {
            self.err(
                format!("{at}.address"),
                format!(
                    "{} is this balancer's tunnel source; a VIP needs an address of its own",
                    vip.id.addr
                ),
            );
        } else if let Some(why) = self.sources.inside_prefix(vip.id.addr) {
            self.err(format!("{at}.address"), format!("{} {why}", vip.id.addr));
        }
        if vip.backends.is_empty() && self.from_file {
            self.err(
                format!("{at}.backends"),
                format!("VIP {} has no backends; list at least one", vip.id),
            );
        }
    }

    /// One backend: its weight, and an address a tunnel can reach that
    /// does not lead back here.
    fn backend(&mut self, vip: &VipConfig, b: &BackendConfig, at: &str) {
        if b.weight > MAX_WEIGHT {
            self.err(
                format!("{at}.weight"),
                format!("weight {} is out of range 0-{MAX_WEIGHT}", b.weight),
            );
        }
        let why = if let Some(why) = unusable_backend(b.address) {
            Some(why.to_string())
        } else if self.vip_addrs.contains(&b.address) {
            Some("is a VIP address of this balancer: its packets would come back here".into())
        } else if self.sources.own.contains(&b.address) {
            Some(
                "is this balancer's own tunnel source: packets would be tunnelled to itself".into(),
            )
        } else {
            self.sources.inside_prefix(b.address)
        };
        if let Some(why) = why {
            self.err(format!("{at}.address"), format!("{} {why}", b.address));
        }
        let (family, missing) = match b.address {
            IpAddr::V4(_) => ("IPv4", !self.sources.v4),
            IpAddr::V6(_) => ("IPv6", !self.sources.v6),
        };
        if missing {
            let setting = if family == "IPv4" {
                "outer_source_v4"
            } else {
                "outer_source_v6"
            };
            self.err(
                format!("{at}.address"),
                format!(
                    "{family} backend {} needs an {family} tunnel source: set {setting}",
                    b.address
                ),
            );
        }
        if vip.health_check_of(b).is_some_and(|h| h.through_tunnel)
            && b.address.is_ipv4() != vip.id.addr.is_ipv4()
        {
            self.err(
                format!("{at}.address"),
                format!(
                    "probes through the tunnel need a backend of the VIP's family; {} is not",
                    b.address
                ),
            );
        }
    }

    /// No backend listed twice.
    fn duplicates(&mut self, vip: &VipConfig, at: &str) {
        let mut addrs = BTreeSet::new();
        for (j, b) in vip.backends.iter().enumerate() {
            if !addrs.insert(b.address) {
                self.err(
                    format!("{at}.backends[{j}].address"),
                    format!("backend {} is listed twice for VIP {}", b.address, vip.id),
                );
            }
        }
    }

    /// The VIP's health check and each backend's own.
    fn health(&mut self, vip: &VipConfig, at: &str) {
        let mut err = |field: String, message: String| {
            self.errors.push(ConfigError { field, message });
        };
        let probed = ProbedVip {
            port: vip.id.port,
            tcp: vip.id.proto == Protocol::Tcp,
        };
        if let Some(h) = &vip.health_check {
            check_health(h, probed, &format!("{at}.health_check"), &mut err);
        }
        for (j, b) in vip.backends.iter().enumerate() {
            if let Some(h) = &b.health_check {
                let field = format!("{at}.backends[{j}].health_check");
                check_health(h, probed, &field, &mut err);
            }
        }
        let udp_port_probed = !probed.tcp
            && vip
                .health_check
                .iter()
                .chain(vip.backends.iter().filter_map(|b| b.health_check.as_ref()))
                .any(|h| h.port.is_none());
        if udp_port_probed {
            // Probes are TCP: a UDP service without a TCP listener on its
            // port would be found down on every backend (helper-37).
            self.warnings.push(format!(
                "{at}.health_check: VIP {} is UDP and probes are TCP, to port {} unless health_check.port names another: make sure the backends listen on it over TCP",
                vip.id, vip.id.port
            ));
        }
    }

    /// Panic threshold, timers, `min_healthy` and passive health.
    fn settings(&mut self, vip: &VipConfig, at: &str) {
        for (field, message) in vip.passive_health.problems() {
            self.err(format!("{at}.passive_health.{field}"), message);
        }
        if vip.panic_threshold > 100 {
            self.err(
                format!("{at}.panic_threshold"),
                format!("{}% is out of range 0-100", vip.panic_threshold),
            );
        } else if vip.panic_threshold == 100 && vip.backends.len() > 1 {
            self.warnings.push(format!(
                "{at}.panic_threshold: 100% puts VIP {}'s backends its probes find dead back in the table as soon as one is down (panic is below the threshold); 0 turns panic off",
                vip.id
            ));
        }
        self.fragment_ports(vip, at);
        if vip.slow_start > Duration::from_secs(3600) {
            self.err(format!("{at}.slow_start"), "is longer than an hour".into());
        }
        if vip.drain_timeout > Duration::from_secs(86_400) {
            self.err(format!("{at}.drain_timeout"), "is longer than a day".into());
        }
        if vip.min_healthy == 0 {
            self.err(
                format!("{at}.min_healthy"),
                "0 would announce the VIP with no usable backend (a blackhole): at least 1".into(),
            );
        }
        let no_backends_in_file = self.from_file && vip.backends.is_empty();
        if vip.min_healthy as usize > vip.backends.len() && !no_backends_in_file {
            let text = format!(
                "min_healthy {} is more than the {} backend(s) of VIP {}: it would never be announced",
                vip.min_healthy,
                vip.backends.len(),
                vip.id
            );
            // A file that says so is a mistake; the API may pass through
            // such a state while backends are replaced.
            if self.from_file {
                self.err(format!("{at}.min_healthy"), text);
            } else {
                self.warnings.push(format!("{at}.min_healthy: {text}"));
            }
        }
    }

    /// A warning when `fragments: hash` takes out ports `hash:` names: the
    /// whole VIP is then hashed without them (fragments carry none), and
    /// the list would say otherwise.
    fn fragment_ports(&mut self, vip: &VipConfig, at: &str) {
        let ports = VIP_F_HASH_NO_SPORT | VIP_F_HASH_NO_DPORT;
        let named = !vip.hash.is_default() && vip.hash.flags() & ports != ports;
        if vip.fragments == FragmentPolicy::Hash && named {
            self.warnings.push(format!(
                "{at}.hash: VIP {} has fragments: hash, which hashes every packet of it without ports (fragments carry none); its hash {} is used without src_port and dst_port",
                vip.id, vip.hash
            ));
        }
    }

    /// The VIP's own table size, if it sets one: a prime in range.
    fn table_size(&mut self, vip: &VipConfig, at: &str) {
        if let Some(why) = vip.table_size.and_then(table_size_problem) {
            self.err(format!("{at}.table_size"), why);
        }
    }

    /// Every VIP's two table halves fit the table pool together.
    fn pool(&mut self, vips: &[VipConfig]) {
        let need: u64 = vips
            .iter()
            .filter(|v| v.table_size.is_none_or(|m| table_size_problem(m).is_none()))
            .map(|v| region_chunks(v.maglev_size(self.layout)) as u64)
            .sum();
        let have = self.layout.pool_chunks() as u64;
        if need > have {
            self.err(
                "vips".into(),
                format!(
                    "the VIPs' tables need {} (two halves of ceil(M / 1024) × 4 KiB each), but the table pool holds {}: raise table_pool_mib (new maps: stop lbd, `lbd teardown`, start; drops the connection table) or give VIPs a smaller table_size",
                    pool_mib(need),
                    pool_mib(have)
                ),
            );
        }
    }

    /// Second chance: TCP only, not with fragment hashing; and what it
    /// needs of the backends, which `lbd` cannot see from here.
    fn second_chance(&mut self, vip: &VipConfig, at: &str) {
        if !vip.second_chance {
            return;
        }
        if vip.id.proto != Protocol::Tcp {
            self.err(
                format!("{at}.second_chance"),
                format!(
                    "VIP {}: second chance follows TCP connections; a UDP VIP has none to find",
                    vip.id
                ),
            );
        }
        if !vip.conntrack {
            self.err(
                format!("{at}.second_chance"),
                format!(
                    "VIP {}: second chance needs the connection table (conntrack: true): without it every packet of every flow would carry alternates",
                    vip.id
                ),
            );
        }
        if vip.fragments == FragmentPolicy::Hash {
            self.err(
                format!("{at}.second_chance"),
                format!(
                    "VIP {}: second chance needs each flow's own Maglev slot; fragments: hash picks by client",
                    vip.id
                ),
            );
        }
        // The VIP's alternates region holds the global table size's slots.
        let global = self.layout.table_size;
        if vip.table_size.is_some_and(|m| m > global) {
            self.err(
                format!("{at}.second_chance"),
                format!(
                    "VIP {}: with second chance the VIP's table_size may not exceed the global table_size {global} (its alternates are kept in regions of that size)",
                    vip.id
                ),
            );
        }
        // IPv6 clients must never be told an MTU below 1280: the largest
        // second-chance header over IPv6 is 104 bytes.
        let least = 1280 + lb_common::consts::SC_MAX_OVERHEAD_V6;
        if vip.id.addr.is_ipv6()
            && vip.backends.iter().any(|b| b.address.is_ipv6())
            && self.mtu != 0
            && (self.mtu as usize) < least
        {
            self.err(
                format!("{at}.second_chance"),
                format!(
                    "VIP {}: with IPv6 backends the largest second-chance header is {} bytes; mtu {} would tell IPv6 clients less than 1280; raise mtu to at least {least}",
                    vip.id,
                    lb_common::consts::SC_MAX_OVERHEAD_V6,
                    self.mtu
                ),
            );
        }
        self.warnings.push(format!(
            "{at}: VIP {} has second_chance: every backend must run lb's decap program (`lbctl decap attach`) accepting GUE on gue_port; kernel tunnel devices (ipip, gre, fou) cannot hand a packet on and drop or misread its alternates",
            vip.id
        ));
    }

    /// QUIC by connection ID (`super::quic::problems`).
    fn quic(&mut self, vip: &VipConfig, at: &str) {
        let backends: Vec<_> = vip
            .backends
            .iter()
            .map(|b| (b.address, b.server_id.as_ref()))
            .collect();
        let (errors, warnings) = super::quic::problems(
            &vip.id.to_string(),
            vip.id.proto == Protocol::Udp,
            vip.quic,
            &backends,
        );
        for (field, message) in errors {
            self.err(format!("{at}.{field}"), message);
        }
        self.warnings
            .extend(warnings.into_iter().map(|w| format!("{at}.{w}")));
    }

    /// Warnings: no weight at all, or a table too small for fair shares.
    fn shares(&mut self, vip: &VipConfig, at: &str) {
        if !vip.backends.is_empty() && vip.backends.iter().all(|b| b.weight == 0) {
            self.warnings.push(format!(
                "{at}: VIP {} has no backend with a weight above 0: it will drop every packet sent to it",
                vip.id
            ));
        }
        let live = vip.backends.iter().filter(|b| b.weight > 0).count() as u64;
        let table_size = vip.maglev_size(self.layout);
        if live > 0 && (table_size as u64) < 100 * live {
            let fair =
                maglev::prime_at_least((100 * live).min(maglev::MAX_TABLE_SIZE as u64) as u32);
            self.warnings.push(format!(
                "{at}: VIP {} has {live} backends; table_size {table_size} is below 100 × {live}, so shares may be off by more than 1% (table_size: {} is the smallest prime above; changing it moves every flow of the VIP)",
                vip.id,
                fair.unwrap_or(table_size)
            ));
        }
    }
}

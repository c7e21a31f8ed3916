//! The datapath's global settings as configured: where forwarded frames go
//! ([`Gateway`], [`Mac`]), how the program is attached, what it does with
//! malformed and too-big packets, and the tunnel sources ([`Prefix`],
//! [`Sources`]) with the address classes that can never be one.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, de};

use super::error::{excerpt, from_str_field};

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
        let mac: Mac = s.parse().map_err(|e| format!("{e}, or `auto`"))?;
        // Frames to it would reach every host of the link, or none.
        if mac.0 == [0; 6] {
            return Err(format!("{mac} is no host's MAC address"));
        }
        if mac.0[0] & 1 != 0 {
            return Err(format!(
                "{mac} is a broadcast or multicast address, not the gateway's"
            ));
        }
        Ok(Gateway::Mac(mac))
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

    /// `addr` is inside the prefix (of its family).
    pub fn contains(&self, addr: IpAddr) -> bool {
        ipnet::IpNet::new(self.addr, self.len).is_ok_and(|net| net.contains(&addr))
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

impl Prefix {
    /// A prefix (`192.0.2.0/24`) or one address (`192.0.2.7`, as
    /// `192.0.2.7/32`).
    pub fn address_or_prefix(s: &str) -> Result<Self, String> {
        if s.contains('/') {
            return s.parse();
        }
        let addr: IpAddr = s.parse().map_err(|_| {
            format!(
                "{} is neither an address nor a prefix like 192.0.2.0/24",
                excerpt(s)
            )
        })?;
        let len = if addr.is_ipv4() { 32 } else { 128 };
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

/// The balancer's tunnel sources, as the VIP rules need them.
pub(crate) struct Sources {
    /// An IPv4 (IPv6) source is configured, fixed or as a prefix.
    pub v4: bool,
    pub v6: bool,
    /// The configured source addresses (fixed, or the prefixes' own).
    pub own: Vec<IpAddr>,
    /// The source prefixes, which a tunnel's source may be any address of.
    pub prefixes: Vec<Prefix>,
}

impl Sources {
    pub(crate) fn new(
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
            prefixes: v4_prefix.into_iter().chain(v6_prefix).collect(),
        }
    }

    /// Why `addr` (a backend's or a VIP's) cannot be where tunnels come
    /// from, if it is inside a source prefix: a client whose low bits
    /// match gets it as its tunnels' source, which the backend drops as
    /// its own address (a martian). `/0`, the client's own address as the
    /// source, is left alone: no client has a backend's address.
    pub(crate) fn inside_prefix(&self, addr: IpAddr) -> Option<String> {
        let p = self
            .prefixes
            .iter()
            .find(|p| p.len > 0 && p.contains(addr))?;
        Some(format!(
            "is inside the tunnel source prefix {}/{}: 1 in {} clients would be tunnelled from it, and a backend drops a packet from its own address; take a prefix of addresses nothing else uses",
            p.addr,
            p.len,
            1u128 << p.host_bits().min(127)
        ))
    }
}

/// Why `addr` cannot be a tunnel's source address, if it cannot.
pub(crate) fn unusable_source(addr: IpAddr) -> Option<&'static str> {
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
pub(crate) fn mapped_v4(addr: IpAddr) -> bool {
    matches!(addr, IpAddr::V6(a) if a.to_ipv4_mapped().is_some())
}

pub(crate) fn link_local(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.is_unicast_link_local(),
    }
}

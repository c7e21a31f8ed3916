//! The `announce:` section: which announcers run and their settings
//! ([`AnnounceConfig`]; the BGP speaker's in [`bgp`]), with their rules.
//! Types and validation only: the announcers are `crate::announce`.

pub(crate) mod bgp;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::{
    duration,
    error::{ConfigError, prefixed, problem},
};

/// The `announce:` section of `lbd`'s configuration: any combination of
/// the three announcers (usually exactly one).
///
/// ```yaml
/// announce:
///   bgp:
///     local_as: 65001
///     router_id: 10.0.0.11
///     peers:
///       - { address: 10.0.0.1, remote_as: 65000 }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnounceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<bgp::BgpConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exabgp: Option<ExabgpConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecConfig>,
}

impl AnnounceConfig {
    /// A VIP no router can ever learn: with the BGP speaker as the only
    /// announcer, a VIP of a family that no peer can carry (no peer of
    /// that family, and no `next_hop_v4`/`next_hop_v6` for it, on the
    /// speaker or a peer). Such a VIP would count as announced while no
    /// router has it.
    pub fn family_problems(
        &self,
        vips: &[crate::config::VipConfig],
        from_file: bool,
    ) -> Vec<ConfigError> {
        let Some(bgp) = &self.bgp else {
            return Vec::new();
        };
        if self.exabgp.is_some() || self.exec.is_some() {
            return Vec::new();
        }
        let carries = |v4: bool| {
            bgp.peers.iter().any(|p| {
                p.address.is_ipv4() == v4
                    || if v4 {
                        p.next_hop_v4.or(bgp.next_hop_v4).is_some()
                    } else {
                        p.next_hop_v6.or(bgp.next_hop_v6).is_some()
                    }
            })
        };
        let (v4, v6) = (carries(true), carries(false));
        vips.iter()
            .enumerate()
            .filter(|(_, v)| if v.id.addr.is_ipv4() { !v4 } else { !v6 })
            .map(|(i, v)| {
                let (family, setting, other) = if v.id.addr.is_ipv4() {
                    ("IPv4", "next_hop_v4", "IPv6")
                } else {
                    ("IPv6", "next_hop_v6", "IPv4")
                };
                ConfigError {
                    field: format!("{}.address", crate::config::vip::vip_field(i, v, from_file)),
                    message: format!(
                        "VIP {} is {family} and no BGP peer can carry it: every peer is over {other} and {setting} is not set; set announce.bgp.{setting} (or the peer's), or add an {family} peer",
                        v.id
                    ),
                }
            })
            .collect()
    }

    /// Every problem, with field paths relative to this section
    /// (`bgp.peers[0].remote_as`).
    pub fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Some(bgp) = &self.bgp {
            errors.extend(prefixed("bgp", bgp.validate()));
        }
        if let Some(exec) = &self.exec {
            errors.extend(prefixed("exec", exec.validate()));
        }
        errors
    }

    /// Checks the files the section names (BGP key files), with paths
    /// relative to the whole configuration (`announce.bgp.peers[0]...`).
    pub fn check_files(&self) -> Vec<ConfigError> {
        match &self.bgp {
            Some(bgp) => prefixed("announce", prefixed("bgp", bgp.check_files())),
            None => Vec::new(),
        }
    }
}

/// ```yaml
/// exabgp: {}                       # next-hop self
/// exabgp: { next_hop_v4: 10.0.0.11 }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExabgpConfig {
    /// Next hop written for IPv4 VIPs; default `self` (ExaBGP's own
    /// address on each session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v4: Option<Ipv4Addr>,
    /// Next hop written for IPv6 VIPs; default `self`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_v6: Option<Ipv6Addr>,
}

/// ```yaml
/// exec:
///   command: [/usr/local/sbin/vip-route, --table, "10"]
///   timeout: 10s
///   retry: 5s
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// The program and its first arguments; the action and the prefix
    /// follow them.
    pub command: Vec<String>,
    /// A run that takes longer is killed and counts as failed.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Wait before retrying failed changes.
    #[serde(default = "default_retry", with = "duration")]
    pub retry: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_retry() -> Duration {
    Duration::from_secs(5)
}

impl ExecConfig {
    pub fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        match self.command.first() {
            None => errors.push(problem("command", "must name a program")),
            Some(p) if p.is_empty() => errors.push(problem("command[0]", "must not be empty")),
            Some(_) => {}
        }
        if self.timeout.is_zero() {
            errors.push(problem("timeout", "must be more than 0"));
        }
        if self.retry.is_zero() {
            errors.push(problem("retry", "must be more than 0"));
        }
        errors
    }
}

//! The control API between `lbctl` and `lbd`: JSON over a Unix socket.
//!
//! One request per connection: the client writes one JSON object and a
//! newline, the daemon answers with one JSON object and a newline, then
//! closes. Requests are a tagged enum ([`Request`]); every answer is a
//! [`Response`] whose `data` has the shape documented on each request. The
//! socket is created with mode 0600: only root talks to the balancer.
//!
//! This module owns the wire types and the blocking client; the daemon's
//! server loop lives in [`crate::daemon`].

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::IpAddr,
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{
    announce::{
        PeerStatus,
        policy::{NodeState, VipVerdict},
    },
    config::{Protocol, VipConfig, VipId},
    health::ProbeResult,
    lifecycle::BackendState,
};

/// Largest request line `lbd` reads: room for a VIP with ~8,000 backends,
/// more than `max_backends` allows by default. A longer one is refused.
pub const MAX_REQUEST: usize = 1 << 20;
/// Largest answer `lbctl` reads (`vip list` of thousands of VIPs).
pub const MAX_RESPONSE: usize = 64 << 20;
/// Connections `lbd` serves at once; one more is answered with an error
/// and closed, so held connections cannot make it buffer without bound.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// → [`Status`]
    Status,
    /// → `Vec<`[`VipInfo`]`>`
    VipList,
    /// → `null`
    VipAdd { vip: Box<VipConfig> },
    /// → `null`
    VipDel { vip: VipId },
    /// → `null`
    BackendAdd {
        vip: VipId,
        address: IpAddr,
        weight: u32,
    },
    /// → `null`. Refused if it leaves an announced VIP without a usable
    /// backend, unless `force`.
    BackendDel {
        vip: VipId,
        address: IpAddr,
        #[serde(default)]
        force: bool,
    },
    /// → `null`. Refused like `backend_del`.
    BackendWeight {
        vip: VipId,
        address: IpAddr,
        weight: u32,
        #[serde(default)]
        force: bool,
    },
    /// Take a backend out of the table; its connections continue until the
    /// VIP's `drain_timeout`. Persisted. → `null`. Refused like
    /// `backend_del`.
    BackendDrain {
        vip: VipId,
        address: IpAddr,
        #[serde(default)]
        force: bool,
    },
    /// → `null`
    BackendUndrain { vip: VipId, address: IpAddr },
    /// → `Vec<`[`VipHealth`]`>`
    Health,
    /// → [`Stats`]
    Stats,
    /// → [`TableInfo`]
    Table { vip: VipId },
    /// → [`Simulation`]
    Simulate {
        src: IpAddr,
        dst: IpAddr,
        protocol: Protocol,
        sport: u16,
        dport: u16,
        /// Treat the packet as a TCP SYN (a new connection).
        #[serde(default)]
        syn: bool,
    },
    /// Re-read the configuration file → `Vec<String>` (warnings). A file
    /// that would leave an announced VIP without a usable backend is
    /// refused unless `force` (SIGHUP never forces).
    Reload {
        #[serde(default)]
        force: bool,
    },
    /// Route announcement: each announcer's peers, and each VIP announced
    /// or withheld and why → [`AnnounceStatus`]
    Bgp,
    /// Withdraw every VIP and keep forwarding what still arrives, until
    /// `node_undrain` or a restart (not persisted) → [`NodeChange`]
    NodeDrain,
    /// Announce again what the policy allows → [`NodeChange`]
    NodeUndrain,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Response {
    pub fn ok(data: impl Serialize) -> Self {
        Self {
            ok: true,
            error: None,
            data: serde_json::to_value(data).unwrap_or(serde_json::Value::Null),
        }
    }

    pub fn err(message: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(message.into()),
            data: serde_json::Value::Null,
        }
    }
}

/// One interface the program is attached to.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InterfaceInfo {
    pub name: String,
    /// `native`, `generic` or `auto`.
    pub mode: String,
    /// The attachment was adopted from a previous `lbd` (not re-created).
    pub adopted: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub instance: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub config_file: String,
    pub interfaces: Vec<InterfaceInfo>,
    pub gateway_mac: String,
    pub pin_dir: String,
    /// Maps were adopted from a previous `lbd` at start.
    pub maps_adopted: bool,
    pub vips: usize,
    pub backends: usize,
    pub table_size: u32,
    pub ct_buckets: u32,
    pub max_vips: u32,
    pub max_backends: u32,
    /// Bytes of map memory by map name.
    pub map_bytes: Vec<(String, u64)>,
    /// Runtime changes on top of the configuration file are present.
    pub api_changes: bool,
    pub last_reload: Option<String>,
    pub warnings: Vec<String>,
    /// One line on route announcement: announcers, peers up, prefixes.
    #[serde(default)]
    pub announce: String,
    /// With `gateway_mac: auto`: what the gateway watcher knows.
    #[serde(default)]
    pub gateway: Option<GatewayInfo>,
}

/// The gateway watcher's state (`gateway_mac: auto`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GatewayInfo {
    pub address: Option<IpAddr>,
    /// A lookup is under way right now (the daemon answers meanwhile).
    pub looking_up: bool,
    /// Why the last lookup failed, if it did.
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendInfo {
    pub address: IpAddr,
    /// Configured weight.
    pub weight: u32,
    pub state: Option<BackendState>,
    /// Its connection-table entries are honoured.
    pub usable: bool,
    pub handle: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendHealth {
    pub address: IpAddr,
    pub state: BackendState,
    /// `up`, `down` or `unchecked`.
    pub health: String,
    /// What is probed, how often.
    pub check: Option<String>,
    pub weight: u32,
    /// The weight in the table now (ramping in slow start, 0 when out).
    pub effective_weight: f64,
    pub in_state_secs: f64,
    pub last_probe: Option<ProbeResult>,
    pub probes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipHealth {
    pub vip: VipId,
    /// Too few backends are healthy: the table uses all of them.
    pub panic: bool,
    /// Times panic mode was entered since `lbd` started.
    pub panic_entered: u64,
    pub backends: Vec<BackendHealth>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipInfo {
    pub vip: VipId,
    pub encap: String,
    pub conntrack: bool,
    pub backends: Vec<BackendInfo>,
}

/// A counter value and its rate over the last sampling interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rate {
    pub packets: u64,
    pub bytes: u64,
    pub pps: f64,
    pub bps: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CounterInfo {
    pub name: String,
    /// `pass`, `forward`, `drop`, `malformed` or `event`.
    pub kind: String,
    #[serde(flatten)]
    pub value: Rate,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendStats {
    pub address: IpAddr,
    #[serde(flatten)]
    pub value: Rate,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VipStats {
    pub vip: VipId,
    #[serde(flatten)]
    pub value: Rate,
    pub backends: Vec<BackendStats>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    /// Seconds the rates are measured over.
    pub interval_secs: f64,
    pub counters: Vec<CounterInfo>,
    pub vips: Vec<VipStats>,
    /// `pass` or `drop`: what happens to the malformed counters' packets.
    pub malformed_policy: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableShare {
    pub address: IpAddr,
    pub weight: u32,
    pub slots: u32,
    /// Fraction of slots owned.
    pub share: f64,
    /// Fraction of the VIP's total weight (of backends in the table).
    pub weight_share: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableInfo {
    pub vip: VipId,
    pub table_size: u32,
    /// Which of the VIP's two table halves is live.
    pub active_half: u32,
    pub backends: Vec<TableShare>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Simulation {
    /// `None` if the destination is not a VIP.
    pub vip: Option<VipId>,
    pub hash: String,
    pub slot: u32,
    /// `None`: dropped (no usable backend) or not a VIP.
    pub backend: Option<IpAddr>,
    /// `connection table` or `maglev`.
    pub via: String,
}

/// `lbctl bgp`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AnnounceStatus {
    pub node: NodeState,
    /// Seconds in that state (drained or stopping); 0 while serving.
    pub node_state_secs: f64,
    /// The XDP program is attached (nothing is announced otherwise).
    pub attached: bool,
    pub shutdown_grace_secs: f64,
    /// The addresses handed to the announcers.
    pub announced: Vec<IpAddr>,
    /// Announcer kinds configured (`bgp`, `exabgp`, `exec`).
    pub announcers: Vec<String>,
    /// One row per BGP peer, ExaBGP pipe or exec command.
    pub peers: Vec<PeerStatus>,
    pub vips: Vec<VipVerdict>,
}

/// The answer to `node_drain` and `node_undrain`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeChange {
    pub node: NodeState,
    /// The request changed the state (false: it was already so).
    pub changed: bool,
    /// Addresses withdrawn (drain) or announced (undrain) by the request.
    pub addresses: Vec<IpAddr>,
    /// Drain: seconds left of `shutdown_grace` since the withdrawal, for a
    /// caller that wants to wait until the routers moved traffic away.
    pub wait_secs: f64,
}

#[derive(Debug, Error)]
pub enum ClientError {
    /// Why the socket could not be reached, in words (each reason once).
    #[error("{0}")]
    Connect(String),
    #[error("talking to lbd")]
    Io(#[from] std::io::Error),
    #[error("bad answer from lbd")]
    Decode(#[from] serde_json::Error),
    #[error("lbd: {0}")]
    Daemon(String),
}

impl ClientError {
    fn connect(path: &Path, e: &std::io::Error) -> Self {
        let path = path.display();
        ClientError::Connect(match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("no lbd socket at {path}: is lbd running, and is this its instance?")
            }
            std::io::ErrorKind::PermissionDenied => {
                format!(
                    "permission denied on {path}: lbd's socket is root's (mode 0600); run lbctl as root"
                )
            }
            std::io::ErrorKind::ConnectionRefused => {
                format!("nothing answers at {path}: lbd is not running (the socket is stale)")
            }
            _ => format!("cannot connect to lbd at {path}: {e}"),
        })
    }
}

/// Sends one request and returns the `data` of a successful answer.
pub fn call(socket: &Path, request: &Request) -> Result<serde_json::Value, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| ClientError::connect(socket, &e))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut reader = BufReader::new(std::io::Read::take(stream, MAX_RESPONSE as u64));
    let mut answer = String::new();
    reader.read_line(&mut answer)?;
    let response: Response = serde_json::from_str(&answer)?;
    if response.ok {
        Ok(response.data)
    } else {
        Err(ClientError::Daemon(
            response.error.unwrap_or_else(|| "unknown error".into()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_a_stable_wire_form() {
        let r = Request::BackendWeight {
            vip: "10.0.0.1:80/tcp".parse().unwrap(),
            address: "10.1.0.1".parse().unwrap(),
            weight: 3,
            force: false,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"op":"backend_weight","vip":"10.0.0.1:80/tcp","address":"10.1.0.1","weight":3,"force":false}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        // Older clients send no `force`.
        let old =
            r#"{"op":"backend_weight","vip":"10.0.0.1:80/tcp","address":"10.1.0.1","weight":3}"#;
        assert_eq!(serde_json::from_str::<Request>(old).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"reload"}"#).unwrap(),
            Request::Reload { force: false }
        );
        let add: Request = serde_json::from_str(
            r#"{"op":"vip_add","vip":{"address":"10.0.0.2","port":53,"protocol":"udp","backends":[{"address":"10.1.0.1"}]}}"#,
        )
        .unwrap();
        let Request::VipAdd { vip } = add else {
            panic!("vip_add")
        };
        assert_eq!(vip.id.to_string(), "10.0.0.2:53/udp");
        assert_eq!(vip.backends[0].weight, 1);
    }

    #[test]
    fn node_and_bgp_requests_are_bare_ops() {
        for (r, text) in [
            (Request::Bgp, r#"{"op":"bgp"}"#),
            (Request::NodeDrain, r#"{"op":"node_drain"}"#),
            (Request::NodeUndrain, r#"{"op":"node_undrain"}"#),
        ] {
            assert_eq!(serde_json::to_string(&r).unwrap(), text);
            assert_eq!(serde_json::from_str::<Request>(text).unwrap(), r);
        }
    }

    #[test]
    fn bad_requests_are_rejected_with_a_reason() {
        for (text, want) in [
            (r#"{"op":"explode"}"#, "unknown variant `explode`"),
            (r#"{"op":"vip_del","vip":"10.0.0.1"}"#, "is not a VIP"),
            (
                r#"{"op":"backend_add","vip":"10.0.0.1:80/tcp","address":"x","weight":1}"#,
                "invalid IP address",
            ),
            (
                r#"{"op":"vip_del","vip":"10.0.0.1:80/tcp","extra":1}"#,
                "unknown field `extra`",
            ),
        ] {
            let err = serde_json::from_str::<Request>(text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}

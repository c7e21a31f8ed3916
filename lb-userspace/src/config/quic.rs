//! QUIC by connection ID as the file writes it: a UDP VIP's `quic:`
//! (the QUIC-LB configuration its servers issue connection IDs with) and
//! each backend's `server_id:`, and their rules. The format and what the
//! datapath reads are `lb_common::quic`'s; servers written in Rust encode
//! with the `lb-quic` crate.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use lb_common::quic::{QUIC_MAX_CONFIG_ID, QUIC_MAX_SERVER_ID_LEN, QuicParams};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::error::excerpt;

/// A VIP's `quic:`: the QUIC-LB configuration (draft-ietf-quic-load-balancers,
/// plaintext algorithm) of the connection IDs its servers issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuicConfig {
    /// Octets of server ID after the connection ID's first octet (1-15).
    pub server_id_len: u8,
    /// The configuration id in the first octet's three high bits (0-6).
    #[serde(default)]
    pub config_id: u8,
}

impl QuicConfig {
    /// As the datapath's VIP entry carries it.
    pub fn params(self) -> QuicParams {
        QuicParams {
            config_id: self.config_id,
            server_id_len: self.server_id_len,
        }
    }
}

/// A backend's `server_id:`, the octets its connection IDs carry, written
/// in hex (`"0a01"`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerId(pub Vec<u8>);

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for ServerId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        hex_octets(s, QUIC_MAX_SERVER_ID_LEN as usize, "a server ID", "0a01").map(ServerId)
    }
}

/// Most octets of a QUIC connection ID (RFC 9000, version 1).
pub const MAX_CID_LEN: usize = 20;

/// A connection ID written in hex (`lbctl simulate --quic-cid`): 1 to 20
/// octets.
pub fn parse_cid(s: &str) -> Result<Vec<u8>, String> {
    hex_octets(s, MAX_CID_LEN, "a connection ID", "27000231c0ffee01")
}

/// [`parse_cid`] for a command line: the ID as given, checked.
pub fn parse_cid_arg(s: &str) -> Result<String, String> {
    parse_cid(s).map(|_| s.to_string())
}

/// 1 to `most` octets written in hex (`0x` allowed before them); the
/// error names `what` and shows `example`.
fn hex_octets(s: &str, most: usize, what: &str, example: &str) -> Result<Vec<u8>, String> {
    let hex = s.strip_prefix("0x").unwrap_or(s);
    let bad = || {
        format!(
            "{} is not {what}: write its octets in hex, 1 to {most} of them (e.g. {example})",
            excerpt(s)
        )
    };
    if hex.is_empty() || !hex.len().is_multiple_of(2) || hex.len() > 2 * most {
        return Err(bad());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad())
}

impl Serialize for ServerId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ServerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Hex;
        impl de::Visitor<'_> for Hex {
            type Value = ServerId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a server ID in hex, quoted (\"0a01\")")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ServerId, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ServerId, E> {
                Err(E::custom(format!(
                    "server ID {v} is a number: write its octets in hex and quote them (\"0a01\"), so that leading zeros and the length are kept"
                )))
            }
        }
        d.deserialize_any(Hex)
    }
}

/// The QUIC rules of one VIP, as `(field under the VIP, message)` errors
/// and warnings: `quic:` on UDP only and in range, server IDs only with
/// it, each of the configured length and unique in the VIP.
/// `vip` names the VIP (`10.0.0.1:443/udp`), `backends` its backends'
/// addresses and server IDs in order.
pub(crate) fn problems(
    vip: &str,
    udp: bool,
    quic: Option<QuicConfig>,
    backends: &[(IpAddr, Option<&ServerId>)],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let Some(quic) = quic else {
        for (j, (address, sid)) in backends.iter().enumerate() {
            if sid.is_some() {
                errors.push((
                    format!("backends[{j}].server_id"),
                    format!(
                        "backend {address} has a server_id but VIP {vip} has no quic: section to route by it"
                    ),
                ));
            }
        }
        return (errors, warnings);
    };
    if !udp {
        errors.push((
            "quic".into(),
            format!("VIP {vip}: QUIC runs over UDP; a TCP VIP has no connection IDs"),
        ));
    }
    if quic.server_id_len == 0 || quic.server_id_len > QUIC_MAX_SERVER_ID_LEN {
        errors.push((
            "quic.server_id_len".into(),
            format!(
                "{} is out of range 1-{QUIC_MAX_SERVER_ID_LEN} (octets; with a nonce of at least 4 a connection ID stays within QUIC's 20)",
                quic.server_id_len
            ),
        ));
    }
    if quic.config_id > QUIC_MAX_CONFIG_ID {
        errors.push((
            "quic.config_id".into(),
            format!(
                "{} is out of range 0-{QUIC_MAX_CONFIG_ID} (7 marks connection IDs no balancer can route)",
                quic.config_id
            ),
        ));
    }
    let mut seen: BTreeMap<&ServerId, IpAddr> = BTreeMap::new();
    for (j, (address, sid)) in backends.iter().enumerate() {
        let at = format!("backends[{j}].server_id");
        let Some(sid) = sid else {
            warnings.push(format!(
                "backends[{j}]: backend {address} of QUIC VIP {vip} has no server_id: its connections break when a client's address changes, and one whose ID happens to carry another backend's server ID goes to that backend"
            ));
            continue;
        };
        if sid.0.len() != quic.server_id_len as usize {
            errors.push((
                at.clone(),
                format!(
                    "server ID {sid} has {} octets; the VIP's quic.server_id_len is {}",
                    sid.0.len(),
                    quic.server_id_len
                ),
            ));
        }
        if let Some(other) = seen.insert(sid, *address) {
            errors.push((
                at,
                format!(
                    "server ID {sid} is also backend {other}'s: each server of a VIP needs its own"
                ),
            ));
        }
    }
    (errors, warnings)
}

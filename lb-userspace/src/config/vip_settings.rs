//! Every setting a VIP has in the file, stated once as a table
//! ([`VIP_SETTINGS`]: the path in the file, how its value is written, one
//! line of help). `lbctl vip add` takes each as a flag named after its
//! path (`health_check.http.path` → `--health-check-http-path`), and
//! `lbd` turns the flags back into the file's form and parses them with
//! the file's own parser ([`vip_from_settings`]), so a VIP added through
//! the API can say everything a VIP in the file can, and is checked by the
//! same rules. A test fails when a field of the file has no row here.
//!
//! Not here: the settings' meaning and defaults (the config structs),
//! their rules ([`super::vip::check_vips`]).

use std::collections::BTreeMap;

use serde::Deserialize as _;

use super::{VipConfig, VipId};

/// How a flag's value becomes the file's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A YAML scalar as written (`80`, `gue`, `500ms`).
    Scalar,
    /// `true` or `false`; the flag alone is `true`.
    Switch,
    /// Text, kept as text (`send`, `expect`, `path`, `host`).
    Text,
    /// A flag without a value: the section with its defaults.
    Section,
}

/// One setting of a VIP.
#[derive(Clone, Copy, Debug)]
pub struct VipSetting {
    /// Its path in the file, under the VIP.
    pub path: &'static str,
    pub value: Value,
    pub help: &'static str,
}

const fn s(path: &'static str, value: Value, help: &'static str) -> VipSetting {
    VipSetting { path, value, help }
}

use Value::{Scalar, Section, Switch, Text};

/// Every setting of a VIP but its identity (address, port, protocol) and
/// its backends, which `lbctl vip add` takes as arguments.
pub const VIP_SETTINGS: &[VipSetting] = &[
    s(
        "encap",
        Scalar,
        "Tunnel to the backends: ipip (default), gre or gue",
    ),
    s(
        "conntrack",
        Switch,
        "Keep flows on their backend through the connection table (default true)",
    ),
    s(
        "fragments",
        Scalar,
        "IP fragments: drop (default) or hash (on the 3-tuple)",
    ),
    s(
        "drain_timeout",
        Scalar,
        "How long a drained backend keeps its connections, e.g. 60s",
    ),
    s(
        "slow_start",
        Scalar,
        "Ramp a joining or recovering backend's weight up over this long, e.g. 30s",
    ),
    s(
        "panic_threshold",
        Scalar,
        "Below this percentage of healthy backends, use all of them (default 50)",
    ),
    s(
        "min_healthy",
        Scalar,
        "Announce the VIP only while this many backends are usable (default 1)",
    ),
    s(
        "table_size",
        Scalar,
        "The VIP's own Maglev table size, a prime (default: the global table_size)",
    ),
    s(
        "second_chance",
        Switch,
        "Second chance for TCP flows moved between balancers (needs lb_decap on every backend)",
    ),
    s(
        "hash",
        Scalar,
        "The fields that pick a new flow's backend, comma-separated: the 5-tuple by default, src_ip for client affinity, src_ip/64 to hash IPv6 clients on their /64",
    ),
    s(
        "quic",
        Section,
        "QUIC by connection ID (UDP): route short-header packets by the server ID in their QUIC-LB connection ID; needs --quic-server-id-len",
    ),
    s(
        "quic.server_id_len",
        Scalar,
        "QUIC: octets of server ID in the connection IDs the backends issue, 1-15 (give each backend its server_id in the file or the tier's desired state: backend add takes none)",
    ),
    s(
        "quic.config_id",
        Scalar,
        "QUIC: the configuration id in the connection IDs' first three bits, 0-6 (default 0)",
    ),
    s(
        "health_check",
        Section,
        "Probe the backends: a TCP connect to the VIP's port, 2s interval, unless other --health-check-* flags say otherwise",
    ),
    s(
        "health_check.port",
        Scalar,
        "Port to probe (default: the VIP's)",
    ),
    s(
        "health_check.interval",
        Scalar,
        "Time between probes, e.g. 2s",
    ),
    s("health_check.timeout", Scalar, "A probe's timeout, e.g. 1s"),
    s(
        "health_check.rise",
        Scalar,
        "Successes in a row that bring a backend back",
    ),
    s(
        "health_check.fall",
        Scalar,
        "Failures in a row that take a backend out",
    ),
    s(
        "health_check.jitter",
        Scalar,
        "Random spread of each interval, in percent",
    ),
    s(
        "health_check.send",
        Text,
        "Bytes to send after connecting (\\r, \\n, \\t allowed)",
    ),
    s(
        "health_check.expect",
        Text,
        "The reply must start with this",
    ),
    s(
        "health_check.http",
        Section,
        "An HTTP GET / that must answer 200, unless --health-check-http-* say otherwise",
    ),
    s("health_check.http.path", Text, "The HTTP check's path"),
    s(
        "health_check.http.status",
        Scalar,
        "The HTTP status the check expects",
    ),
    s(
        "health_check.http.host",
        Text,
        "The HTTP check's Host header (default: the probed address)",
    ),
    s(
        "health_check.through_tunnel",
        Switch,
        "Probe the VIP through the tunnel, as clients reach the backend",
    ),
    s(
        "passive_health",
        Section,
        "Passive health with its defaults (on unless enabled: false)",
    ),
    s(
        "passive_health.enabled",
        Switch,
        "Eject backends whose clients' SYNs go unanswered (default true)",
    ),
    s(
        "passive_health.window",
        Scalar,
        "The window SYNs are counted over, e.g. 30s",
    ),
    s(
        "passive_health.min_syns",
        Scalar,
        "SYNs a backend must have had in the window to be judged",
    ),
    s(
        "passive_health.ratio",
        Scalar,
        "Share of unanswered SYNs that ejects (0-1)",
    ),
    s(
        "passive_health.relative",
        Scalar,
        "How much worse than the VIP's other backends a backend must be",
    ),
    s(
        "passive_health.ejection",
        Scalar,
        "First ejection's length, e.g. 30s",
    ),
    s(
        "passive_health.max_ejection",
        Scalar,
        "Longest ejection, e.g. 5m",
    ),
    s(
        "passive_health.max_ejection_percent",
        Scalar,
        "Most backends of the VIP ejected at once, in percent",
    ),
];

/// The flag of a setting: `health_check.http.path` → `health-check-http-path`.
pub fn flag_name(path: &str) -> String {
    path.replace(['.', '_'], "-")
}

/// The VIP `id` with `backends` (address, weight) and `settings` (path →
/// the value as written on the command line), parsed as the file's VIP
/// would be. Errors name the setting.
pub fn vip_from_settings(
    id: &VipId,
    backends: &[(std::net::IpAddr, u32)],
    settings: &BTreeMap<String, String>,
) -> Result<VipConfig, String> {
    use serde_yaml::{Mapping, Value as Yaml};
    let mut vip = Mapping::new();
    vip.insert("address".into(), Yaml::String(id.addr.to_string()));
    vip.insert(
        "port".into(),
        if id.port == 0 {
            Yaml::String("all".into())
        } else {
            Yaml::Number(id.port.into())
        },
    );
    vip.insert("protocol".into(), Yaml::String(id.proto.to_string()));
    let list = backends
        .iter()
        .map(|(address, weight)| {
            let mut b = Mapping::new();
            b.insert("address".into(), Yaml::String(address.to_string()));
            b.insert("weight".into(), Yaml::Number((*weight).into()));
            Yaml::Mapping(b)
        })
        .collect();
    vip.insert("backends".into(), Yaml::Sequence(list));
    for (path, raw) in settings {
        let Some(setting) = VIP_SETTINGS.iter().find(|s| s.path == path) else {
            return Err(format!(
                "VIP {id}: unknown VIP setting {}",
                super::error::excerpt(path)
            ));
        };
        let value = match setting.value {
            Text => Yaml::String(raw.clone()),
            Section => Yaml::Mapping(Mapping::new()),
            Scalar | Switch => match serde_yaml::from_str::<Yaml>(raw) {
                Ok(v @ (Yaml::Bool(_) | Yaml::Number(_) | Yaml::String(_))) => v,
                _ => Yaml::String(raw.clone()),
            },
        };
        insert(&mut vip, path, value);
    }
    VipConfig::deserialize(Yaml::Mapping(vip)).map_err(|e| format!("VIP {id}: {e}"))
}

/// Puts `value` at the dotted `path` of `map`, making sections on the
/// way; a section flag never replaces settings already under it.
fn insert(map: &mut serde_yaml::Mapping, path: &str, value: serde_yaml::Value) {
    use serde_yaml::{Mapping, Value as Yaml};
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let key = Yaml::String(head.into());
    match rest {
        None => {
            let section = matches!(value, Yaml::Mapping(_));
            if !(section && matches!(map.get(&key), Some(Yaml::Mapping(_)))) {
                map.insert(key, value);
            }
        }
        Some(rest) => {
            let entry = map
                .entry(key)
                .or_insert_with(|| Yaml::Mapping(Mapping::new()));
            if !matches!(entry, Yaml::Mapping(_)) {
                *entry = Yaml::Mapping(Mapping::new());
            }
            if let Yaml::Mapping(inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

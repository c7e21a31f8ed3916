//! Health-check settings: how a backend is probed ([`HealthCheck`], TCP
//! connect, send/expect or HTTP), their defaults, the detection bound they
//! promise, and their rules. The prober (`crate::health`) takes these and
//! nothing else of the configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration;

/// An HTTP health check: `GET path` must answer with `status`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// The bytes a `send` or `expect` stands for: turns `\r`, `\n`, `\t` and `\\` escapes into bytes.
pub fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some(other) => {
                out.push(b'\\');
                let mut buf = [0u8; 4];
                out.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
            }
            None => out.push(b'\\'),
        }
    }
    out
}

/// The most bytes a probe sends (`send`) or compares (`expect`): a reply is
/// read up to this many bytes, so a longer `expect` could never match.
pub(crate) const MAX_PROBE_BYTES: usize = 4096;

/// What [`check_health`] needs of the VIP whose backends `h` probes.
#[derive(Clone, Copy)]
pub(crate) struct ProbedVip {
    /// The VIP's port, 0 if it covers all ports.
    pub port: u16,
    pub tcp: bool,
}

pub(crate) fn check_health(
    h: &HealthCheck,
    vip: ProbedVip,
    at: &str,
    err: &mut impl FnMut(String, String),
) {
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
    for (name, text) in [("send", &h.send), ("expect", &h.expect)] {
        let len = text.as_deref().map_or(0, |t| unescape(t).len());
        if len > MAX_PROBE_BYTES {
            err(
                format!("{at}.{name}"),
                format!("{len} bytes, more than the {MAX_PROBE_BYTES} a probe sends or reads"),
            );
        }
    }
    if h.port.is_none() && vip.port == 0 {
        err(
            format!("{at}.port"),
            "the VIP covers all ports: say which port to probe".into(),
        );
    }
    if h.port == Some(0) {
        err(format!("{at}.port"), "port 0 cannot be probed".into());
    }
    if h.through_tunnel && !vip.tcp {
        err(
            format!("{at}.through_tunnel"),
            "probes through the tunnel are TCP: the VIP must be TCP".into(),
        );
    }
}

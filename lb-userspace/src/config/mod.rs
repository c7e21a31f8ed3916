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
//!
//! Sections live in submodules, each with its types, defaults and rules:
//! [`vip`] (VIPs, backends), [`health`] (probes), [`datapath`] (gateway,
//! tunnel sources, packet policies), and the leaves [`error`] and
//! [`duration`], which import nothing of the crate. [`parse`] turns text
//! into the raw form, reporting every problem of a file.

pub(crate) mod announce;
pub(crate) mod datapath;
pub(crate) mod duration;
pub(crate) mod error;
pub(crate) mod hash;
pub(crate) mod health;
pub(crate) mod parse;
pub(crate) mod passive;
pub(crate) mod quic;
pub(crate) mod source;
pub(crate) mod vip;
pub(crate) mod vip_settings;

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    time::Duration,
};

use lb_common::consts::GUE_PORT;
use serde::Deserialize;

use self::{announce::AnnounceConfig, error::prefixed};
pub use self::{
    datapath::{Gateway, Mac, MalformedPolicy, Prefix, TooBigPolicy, XdpModeSetting},
    error::{ConfigError, ConfigErrors, excerpt},
    hash::{HashFields, load_key as load_hash_key},
    health::{HealthCheck, HttpCheck},
    quic::{QuicConfig, ServerId, parse_cid_arg},
    source::{MAX_DESIRED_BYTES, valid_name},
    vip::{
        BackendConfig, Encap, FragmentPolicy, MAX_WEIGHT, MIN_TABLE_SIZE, Protocol, RawVip,
        VipConfig, VipId,
    },
};
use self::{
    datapath::{Sources, unusable_source},
    error::cut_message,
    vip::check_vips,
};
use crate::{dataplane::Layout, maglev};

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
    #[serde(default = "vip::yes")]
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
    table_pool_mib: Option<u32>,
    /// Default: 8, or `max_vips` if fewer.
    second_chance_vips: Option<u32>,
    #[serde(default)]
    malformed: MalformedPolicy,
    /// The tier's secret key for the hash that picks backends (see
    /// [`hash::load_key`]); none: the public hash.
    hash_key_file: Option<PathBuf>,
    api_socket: Option<PathBuf>,
    state_file: Option<PathBuf>,
    #[serde(default = "default_bpffs")]
    bpffs: PathBuf,
    source: Option<source::SourceConfig>,
    #[serde(default)]
    vips: Vec<VipConfig>,
    #[serde(default)]
    announce: AnnounceConfig,
    #[serde(default = "default_shutdown_grace", with = "duration")]
    shutdown_grace: Duration,
    #[serde(default)]
    detach_on_exit: bool,
    #[serde(default = "default_history")]
    history: usize,
    metrics: Option<MetricsConfig>,
    #[serde(default)]
    log_format: LogFormat,
}

/// How `lbd` writes its log (to standard error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line per event; under systemd (journald stamps lines) without
    /// the time, and without colours unless standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per event, for log shippers.
    Json,
}

/// `metrics:`: where `lbd` serves Prometheus metrics. Absent (the
/// default): no listener at all, as `lbd` listens on nothing it was not
/// asked to; present without `listen`: localhost only.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default = "default_metrics_listen")]
    pub listen: std::net::SocketAddr,
}

fn default_metrics_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 9469))
}

fn default_history() -> usize {
    50
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

/// Largest `conntrack_buckets`: 2^25 buckets, 2 GiB of kernel memory,
/// 201 million flows. More is a typo (2147483648 asked for 128 GiB).
const MAX_CT_BUCKETS: u32 = 1 << 25;

/// Smallest `conntrack_buckets`: 6,144 flows. Fewer is a typo, not a
/// design (the default is 262,144 buckets).
pub const MIN_CT_BUCKETS: u32 = 1024;

/// Largest `table_pool_mib`: 16 GiB of tables.
pub const MAX_TABLE_POOL_MIB: u32 = 16 * 1024;
/// Chunks of `LB_TABLES` per MiB of `table_pool_mib`.
const CHUNKS_PER_MIB: u32 = (1 << 20) / crate::dataplane::pool::CHUNK_BYTES as u32;

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
impl RawConfig {
    fn second_chance_vips(&self) -> u32 {
        self.second_chance_vips.unwrap_or(
            crate::dataplane::DEFAULT_SECOND_CHANCE_VIPS.min(self.max_vips.min(u16::MAX as u32)),
        )
    }
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
    /// The tier's secret hash key, read when the datapath is programmed
    /// (start, reload); every balancer of a tier must have the same.
    pub hash_key_file: Option<PathBuf>,
    pub api_socket: PathBuf,
    pub state_file: PathBuf,
    pub bpffs: PathBuf,
    /// Where the VIPs come from when not from the file: a tier's desired
    /// state in etcd (`source.etcd`; see [`crate::tier`]).
    pub source: Option<source::EtcdSource>,
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
    /// Revisions kept (`lbctl history`, `lbctl revert`).
    pub history: usize,
    /// Prometheus metrics endpoint (none by default).
    pub metrics: Option<MetricsConfig>,
    pub log_format: LogFormat,
    /// Advice that does not stop the configuration from loading.
    pub warnings: Vec<String>,
}

impl Config {
    /// Parses and validates YAML text, reporting every problem at once.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        self::parse::precheck(text).map_err(|e| ConfigErrors::one("", e))?;
        let parsed = self::parse::deserialize_all::<RawConfig>(text, "vips");
        validate(parsed)
    }

    /// Reads (at most [`self::parse::MAX_CONFIG_BYTES`]), parses
    /// and validates a file; errors name the file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = Self::read_text(path)?;
        Self::parse(&text).map_err(|e| e.named(path))
    }

    /// Reads a configuration file's text (at most
    /// [`self::parse::MAX_CONFIG_BYTES`]); errors name the file. Any kind
    /// of file: `lbd check --config /dev/stdin` reads a pipe.
    pub fn read_text(path: &Path) -> Result<String, ConfigErrors> {
        self::parse::read_bounded(path, false).map_err(|e| ConfigErrors::one("", e).named(path))
    }

    /// [`Config::read_text`] of a regular file only, for what the running
    /// `lbd` reads (its file at a reload, a file `lbctl diff` names): a
    /// FIFO or a device would hold one of its threads for good.
    pub fn read_file_text(path: &Path) -> Result<String, ConfigErrors> {
        self::parse::read_bounded(path, true).map_err(|e| ConfigErrors::one("", e).named(path))
    }

    /// Pin directory of this instance.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.join("lb").join(&self.instance)
    }

    /// Where the revisions are kept: `<instance>.revisions/` beside the
    /// state file.
    pub fn revisions_dir(&self) -> PathBuf {
        let dir = self
            .state_file
            .parent()
            .unwrap_or(std::path::Path::new("."));
        dir.join(format!("{}.revisions", self.instance))
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
        let warnings = check_vips(vips, &self.layout, &sources, self.mtu, false, &mut errors);
        errors.extend(self.announce.family_problems(vips, false));
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

/// The cross-field rules over what parsed, with the parse errors: every
/// problem of the file, each once.
fn validate(parsed: self::parse::Parsed<RawConfig>) -> Result<Config, ConfigErrors> {
    let self::parse::Parsed {
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
    // The rules number the VIPs that parsed; the file's numbers first,
    // then a rule about a part that did not parse (it only repeats its
    // problem) is dropped.
    for e in &mut rules {
        renumber_vip(&mut e.field, &vip_index);
    }
    rules.retain(|e: &ConfigError| {
        !bad_paths
            .iter()
            .any(|b| e.field == *b || e.field.starts_with(&format!("{b}.")))
    });
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
    check_identity(&raw, errors);
    check_sizes(&raw, errors);
    check_datapath(&raw, errors);
    check_sources(&raw, errors);
    errors.extend(prefixed("announce", raw.announce.validate()));
    if let Some(source) = &raw.source {
        errors.extend(prefixed("source", source.validate()));
    }
    let layout = Layout {
        table_size: raw.table_size,
        max_vips: raw.max_vips,
        max_backends: raw.max_backends,
        ct_buckets: raw.conntrack_buckets,
        table_pool: raw.table_pool_mib.map_or(0, |mib| mib * CHUNKS_PER_MIB),
        second_chance_vips: raw.second_chance_vips(),
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
    let mut warnings = check_vips(&raw.vips, &layout, &sources, raw.mtu, true, errors);
    errors.extend(raw.announce.family_problems(&raw.vips, true));
    if !errors.is_empty() {
        return None;
    }
    // A stop: the graceful shutdown's wait (routes kept with the
    // community), then shutdown_grace (withdrawn), then the announcers.
    let community_wait = raw
        .announce
        .bgp
        .as_ref()
        .and_then(|b| b.graceful_shutdown.as_ref())
        .map_or(Duration::ZERO, |g| g.wait);
    let stop = community_wait + raw.shutdown_grace;
    if stop > UNIT_STOP_TIMEOUT - STOP_AFTER_GRACE {
        warnings.push(format!(
            "shutdown_grace: a stop waits {} (graceful_shutdown's wait and shutdown_grace), but the packaged unit kills lbd {} s after SIGTERM, before it has withdrawn and stopped (the announcers take up to {} s more): raise TimeoutStopSec in a drop-in (`systemctl edit lbd`)",
            duration::format(&stop),
            UNIT_STOP_TIMEOUT.as_secs(),
            STOP_AFTER_GRACE.as_secs()
        ));
    }
    Some(build(raw, layout, warnings))
}

/// `TimeoutStopSec` of the packaged unit (`scripts/lbd.service`).
const UNIT_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// What a stop takes after `shutdown_grace`, at most: the announcers'
/// bounded shutdown (BGP Cease).
const STOP_AFTER_GRACE: Duration = Duration::from_secs(10);

/// The validated configuration, with the defaults that depend on others.
fn build(raw: RawConfig, layout: Layout, warnings: Vec<String>) -> Config {
    let run = PathBuf::from("/run/lb");
    Config {
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
        hash_key_file: raw.hash_key_file,
        bpffs: raw.bpffs,
        source: raw.source.and_then(|s| s.etcd),
        vips: raw.vips,
        announce: raw.announce,
        shutdown_grace: raw.shutdown_grace,
        detach_on_exit: raw.detach_on_exit,
        history: raw.history,
        metrics: raw.metrics,
        log_format: raw.log_format,
        warnings,
    }
}

/// The instance name and the interfaces.
fn check_identity(raw: &RawConfig, errors: &mut Vec<ConfigError>) {
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
}

/// The maps' sizes.
fn check_sizes(raw: &RawConfig, errors: &mut Vec<ConfigError>) {
    let mut err = |field: String, message: String| errors.push(ConfigError { field, message });
    if let Some(why) = vip::table_size_problem(raw.table_size) {
        err("table_size".into(), why);
    }
    if !raw.conntrack_buckets.is_power_of_two() {
        err(
            "conntrack_buckets".into(),
            format!(
                "{} is not a power of two (each bucket holds 6 flows; e.g. 262144)",
                raw.conntrack_buckets
            ),
        );
    } else if raw.conntrack_buckets > MAX_CT_BUCKETS {
        err(
            "conntrack_buckets".into(),
            format!(
                "{} buckets would take {} GiB of kernel memory; the most is {MAX_CT_BUCKETS} ({} GiB, {} flows)",
                raw.conntrack_buckets,
                (raw.conntrack_buckets as u64 * 64) >> 30,
                (MAX_CT_BUCKETS as u64 * 64) >> 30,
                MAX_CT_BUCKETS as u64 * lb_common::consts::CT_WAYS as u64
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
    if let Some(mib) = raw.table_pool_mib
        && !(1..=MAX_TABLE_POOL_MIB).contains(&mib)
    {
        err(
            "table_pool_mib".into(),
            format!("{mib} is out of range 1-{MAX_TABLE_POOL_MIB}"),
        );
    }
    if raw.max_vips == 0 || raw.max_vips > 65_535 {
        err(
            "max_vips".into(),
            format!("{} is out of range 1-65535", raw.max_vips),
        );
    }
    if raw.second_chance_vips() > raw.max_vips.min(u16::MAX as u32) {
        err(
            "second_chance_vips".into(),
            format!(
                "{} is more than max_vips ({})",
                raw.second_chance_vips(),
                raw.max_vips
            ),
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
}

/// The datapath's settings, paths and the stop grace.
fn check_datapath(raw: &RawConfig, errors: &mut Vec<ConfigError>) {
    let mut err = |field: String, message: String| errors.push(ConfigError { field, message });
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
    check_paths(raw, &mut err);
    if raw.shutdown_grace > Duration::from_secs(600) {
        err("shutdown_grace".into(), "is longer than 10 minutes".into());
    }
    if !(1..=10_000).contains(&raw.history) {
        err(
            "history".into(),
            format!("{} is out of range 1-10000", raw.history),
        );
    }
}

/// `api_socket`, `state_file`, `hash_key_file` and `bpffs`: absolute, a socket path the
/// kernel can bind (at most 107 bytes), files that are files.
fn check_paths(raw: &RawConfig, err: &mut impl FnMut(String, String)) {
    for (field, path, file) in [
        ("api_socket", raw.api_socket.as_deref(), true),
        ("state_file", raw.state_file.as_deref(), true),
        ("hash_key_file", raw.hash_key_file.as_deref(), true),
        ("bpffs", Some(raw.bpffs.as_path()), false),
    ] {
        let Some(path) = path else { continue };
        let shown = excerpt(&path.display().to_string());
        if path.as_os_str().is_empty() {
            err(field.into(), "must not be empty".into());
        } else if !path.is_absolute() {
            err(field.into(), format!("{shown} is not an absolute path"));
        } else if file
            && (path.file_name().is_none() || path.as_os_str().as_encoded_bytes().ends_with(b"/"))
        {
            err(
                field.into(),
                format!("{shown} names a directory, not a file"),
            );
        }
    }
    if let Some(socket) = raw.api_socket.as_deref()
        && socket.as_os_str().len() > MAX_SOCKET_PATH
    {
        err(
            "api_socket".into(),
            format!(
                "is {} bytes long; a Unix socket's path is at most {MAX_SOCKET_PATH}",
                socket.as_os_str().len()
            ),
        );
    }
}

/// The longest path a Unix socket can be bound at (`sun_path` is 108
/// bytes with the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The tunnels' outer sources: fixed or a prefix, never both, and no
/// address that can never be one.
fn check_sources(raw: &RawConfig, errors: &mut Vec<ConfigError>) {
    let mut err = |field: String, message: String| errors.push(ConfigError { field, message });
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
}

#[cfg(test)]
mod tests;

//! Every request `lbd` answers, stated once. Each type is both the JSON
//! on the wire (serde, tagged by `op`, and inside `vip`, `backend` and
//! `node` by `action`) and `lbctl`'s command line (clap): `lbctl vip add
//! ...` parses straight into [`Request::Vip`]`(`[`VipRequest::Add`]`)`,
//! which is what goes to `lbd` and what its dispatch matches on.
//!
//! Adding a request: a variant here (with its clap and serde
//! attributes), its answer's type in [`super::wire`], its handler in
//! `crate::daemon`, its table in `lbctl`.

use std::{net::IpAddr, path::PathBuf, str::FromStr};

use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::config::{Protocol, VipId};

/// A request to `lbd` (the answer's type is named on each variant).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The daemon: interfaces, maps, limits, last reload. → [`super::Status`]
    Status,
    /// VIPs.
    #[command(subcommand)]
    Vip(VipRequest),
    /// Backends of a VIP.
    #[command(subcommand)]
    Backend(BackendRequest),
    /// Counters and rates: outcomes, drop reasons, per VIP and backend.
    /// → [`super::Stats`]
    Stats,
    /// Backend states and the last probe of each. → `Vec<`[`super::VipHealth`]`>`
    Health,
    /// A VIP's Maglev table: slots per backend, share against weight, and
    /// its digest (equal on two balancers exactly when they send every flow
    /// to the same backend). → [`super::TableInfo`]
    Table {
        vip: VipId,
        /// Also list every slot's backend (`-o json`).
        #[arg(long)]
        #[serde(default)]
        slots: bool,
    },
    /// Which backend a flow gets, and why. → [`super::Simulation`]
    Simulate {
        src: IpAddr,
        dst: IpAddr,
        protocol: Protocol,
        sport: u16,
        dport: u16,
        /// As a TCP SYN (a new connection: skips the connection table).
        #[arg(long)]
        #[serde(default)]
        syn: bool,
    },
    /// Re-read the configuration file (an invalid file is rejected and the
    /// running configuration stays). → [`super::Committed`]
    Reload {
        /// Apply a file that leaves an announced VIP without a usable
        /// backend, or changes a VIP's table_size, which remaps its flows
        /// (refused otherwise; SIGHUP never forces).
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// What a reload of FILE (default: the configured file) would change:
    /// VIPs and backends added, removed and re-weighted, settings, the
    /// share of each table's slots that move, and the connections that
    /// would break. Changes nothing. → [`super::ChangePreview`]
    Diff {
        file: Option<PathBuf>,
        /// Refuse what a plain `lbctl reload` (without `--force`) would
        /// refuse, as the reload would (`lbd check` asks this of a running
        /// `lbd`).
        #[arg(long)]
        #[serde(default)]
        strict: bool,
    },
    /// The last revisions: every configuration applied (or refused), with
    /// its source and digest. → `Vec<`[`super::RevisionRow`]`>`
    History {
        /// How many, newest first.
        #[arg(long, default_value_t = 20)]
        #[serde(default = "twenty")]
        last: usize,
    },
    /// Apply an earlier revision again (default: the one before the
    /// running one). The file on disk is not rewritten. → [`super::Committed`]
    Revert {
        revision: Option<u64>,
        /// Even if it leaves an announced VIP without a usable backend or
        /// changes a VIP's table_size.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// Keep a change made with `--confirm-within`. → [`super::Committed`]
    Confirm,
    /// `lbctl trace`'s lease on the datapath's tracing (not a command of
    /// its own: `lbctl trace` sends it). → [`super::TraceLeased`]
    #[command(subcommand, name = "trace-lease", hide = true)]
    #[serde(rename = "trace")]
    TraceLease(TraceRequest),
    /// Route announcement: each peer's session, and which VIPs are
    /// announced or withheld, and why. → [`super::AnnounceStatus`]
    Bgp,
    /// The balancer as a whole: take it out of the routers' paths and back.
    /// → [`super::NodeChange`]
    #[command(subcommand)]
    Node(NodeRequest),
    /// Runtime changes still in force over the file (made with `lbctl vip`
    /// and `lbctl backend`), and clearing them.
    #[command(subcommand)]
    Overrides(OverridesRequest),
}

/// `lbctl overrides ...`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum OverridesRequest {
    /// Every runtime change in force: object, field, what the file says,
    /// what runs, and the revision, time and source that made it so.
    /// → `Vec<`[`super::OverrideRow`]`>`
    List,
    /// Drop runtime changes so that the file decides again: all of them,
    /// a VIP's, or one backend's; a change like any other (previewed with
    /// --dry-run, recorded, revertible). → [`super::Committed`]
    Clear {
        /// Only this VIP's changes (e.g. `10.0.0.1:80/tcp`).
        vip: Option<VipId>,
        /// Only this backend's changes of VIP.
        #[arg(requires = "vip")]
        backend: Option<IpAddr>,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
}

/// `lbctl vip ...`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum VipRequest {
    /// → `Vec<`[`super::VipInfo`]`>`
    List,
    /// Add a VIP, e.g. `vip add 10.0.0.1:80/tcp --backend 10.1.0.1 --backend 10.1.0.2=2`. → `null`
    Add(VipAdd),
    /// → `null`
    Del { vip: VipId },
}

/// A VIP added at runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Args)]
#[serde(deny_unknown_fields)]
pub struct VipAdd {
    pub vip: VipId,
    /// ADDRESS or ADDRESS=WEIGHT; repeat for each backend.
    #[arg(short, long = "backend")]
    pub backends: Vec<BackendSpec>,
    #[arg(long, value_enum, default_value_t = EncapName::Ipip)]
    #[serde(default)]
    pub encap: EncapName,
    /// Hash every packet; keep no per-flow state.
    #[arg(long)]
    #[serde(default)]
    pub no_conntrack: bool,
    /// Announce the VIP only while this many backends are usable.
    #[arg(long, default_value_t = 1)]
    #[serde(default = "one")]
    pub min_healthy: u32,
    /// The VIP's own Maglev table size, a prime (default: the global
    /// table_size); the smallest prime ≥ 100 × backends keeps shares
    /// within 1% in the least memory.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u32>,
    /// Second chance (TCP): mid-flow packets this balancer never placed
    /// carry the flow's alternates; needs lb's decap on every backend.
    #[arg(long)]
    #[serde(default)]
    pub second_chance: bool,
}

fn one() -> u32 {
    1
}

fn twenty() -> usize {
    20
}

/// A tunnel, as the API names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EncapName {
    #[default]
    Ipip,
    Gre,
    Gue,
}

/// `ADDRESS` or `ADDRESS=WEIGHT` on the command line; `{address, weight}`
/// on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    pub address: IpAddr,
    #[serde(default = "one")]
    pub weight: u32,
}

impl FromStr for BackendSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, weight) = match s.split_once('=') {
            Some((a, w)) => (
                a,
                w.parse()
                    .map_err(|_| format!("weight in `{s}` is not a number"))?,
            ),
            None => (s, 1),
        };
        let address = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IP address"))?;
        Ok(Self { address, weight })
    }
}

/// `lbctl backend ...`; changes that would leave a serving VIP with no
/// usable backend are refused unless `force`. Each → [`super::Committed`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum BackendRequest {
    Add {
        vip: VipId,
        address: IpAddr,
        #[arg(short, long, default_value_t = 1)]
        #[serde(default = "one")]
        weight: u32,
    },
    Del {
        vip: VipId,
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    Weight {
        vip: VipId,
        address: IpAddr,
        weight: u32,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// Stop sending it new flows; its connections continue until the VIP's
    /// drain_timeout. Persisted.
    Drain {
        vip: VipId,
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    Undrain {
        vip: VipId,
        address: IpAddr,
    },
}

/// A trace lease: taken or renewed (`on`), or given back (`off`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum TraceRequest {
    On {
        session: u32,
        #[arg(long)]
        vip: Option<VipId>,
        /// `ADDRESS/LEN`.
        #[arg(long)]
        client: Option<String>,
    },
    Off {
        session: u32,
    },
}

/// `lbctl node ...` → [`super::NodeChange`]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeRequest {
    /// Withdraw every VIP from the routers; forwarding goes on for what
    /// still arrives. Lasts until `node undrain` or a restart of lbd.
    /// Waits out `shutdown_grace` (the routers moving traffic away) before
    /// returning.
    Drain {
        /// Return at once (`lbctl` only: the request is the same).
        #[arg(long)]
        #[serde(skip)]
        no_wait: bool,
    },
    /// Announce again what the backends' health allows.
    Undrain,
}

/// How a change (`vip add|del`, `backend ...`, `reload`, `revert`) is
/// applied. Sent beside the request ([`super::Envelope`]); `lbd` refuses
/// them on requests that change nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, Args)]
#[serde(deny_unknown_fields)]
pub struct ChangeOptions {
    /// Show what the change would do, as `lbctl diff` does; change nothing.
    #[arg(long, global = true)]
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Revert to the previous revision by itself unless `lbctl confirm`
    /// arrives within this long (e.g. `2m`); sooner if the change makes a
    /// VIP that was announced lose its announcement.
    #[arg(long, global = true, value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_within: Option<Within>,
}

impl ChangeOptions {
    /// Neither option is set.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A confirmation window, `2m` or `90s` (at most a day).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Within(pub std::time::Duration);

impl FromStr for Within {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let d = crate::config::duration::parse(s)?;
        if d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(86_400) {
            return Err(format!("{s}: a confirmation window is 1s to 24h"));
        }
        Ok(Self(d))
    }
}

impl TryFrom<String> for Within {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Within> for String {
    fn from(w: Within) -> String {
        crate::config::duration::format(&w.0)
    }
}

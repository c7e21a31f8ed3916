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

use clap::{Args, Subcommand};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{Protocol, VipId};

/// A request to lbd (the answer's type is named on each variant).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The daemon: interfaces, maps, limits, last reload.
    // Answer: [`super::Status`]
    Status,
    /// VIPs.
    #[command(subcommand)]
    Vip(VipRequest),
    /// Backends of a VIP.
    #[command(subcommand)]
    Backend(BackendRequest),
    /// Counters and rates: outcomes, drop reasons, per VIP and backend.
    // Answer: [`super::Stats`]
    Stats,
    /// Backend states and the last probe of each.
    // Answer: `Vec<`[`super::VipHealth`]`>`
    Health,
    /// A VIP's Maglev table: slots per backend, share against weight, and
    /// its digest (equal on two balancers exactly when they send every flow
    /// to the same backend).
    // Answer: [`super::TableInfo`]
    Table {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// Also list every slot's backend (-o json).
        #[arg(long)]
        #[serde(default)]
        slots: bool,
    },
    /// Which backend a flow gets, and why (lbctl simulate sends it,
    /// parsing the VIP and client as they are written elsewhere).
    // Answer: [`super::Simulation`]
    #[command(skip)]
    Simulate {
        /// The client's address.
        src: IpAddr,
        /// The VIP's address.
        dst: IpAddr,
        /// tcp or udp.
        protocol: Protocol,
        /// The client's port.
        sport: u16,
        /// The VIP's port.
        dport: u16,
        /// As a TCP SYN (a new connection: skips the connection table).
        #[arg(long)]
        #[serde(default)]
        syn: bool,
        /// As a short-header QUIC packet with this destination connection
        /// ID, in hex (a UDP VIP with quic: routes by its server ID).
        #[arg(long, value_parser = crate::config::quic::parse_cid_arg)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quic_cid: Option<String>,
    },
    /// Connection-table entries: VIP, backend, idle time, confirmed; the
    /// client's address and port only with --client (the table keeps a
    /// tag of each flow, not its tuple: every source port of the prefix
    /// is hashed to find them).
    // Answer: [`super::Conns`]
    Conns {
        /// Only this VIP's entries, e.g. 10.0.0.1:80/tcp.
        vip: Option<VipId>,
        /// Only this backend's entries.
        #[arg(long)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<IpAddr>,
        /// Only flows from this address or prefix (at most 16 addresses
        /// to one VIP, every source port), shown with their address and
        /// port.
        #[arg(long)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<String>,
        /// At most this many rows, 1 to 10,000 (the count of all is
        /// still given).
        #[arg(long, default_value_t = 100)]
        #[serde(default = "hundred")]
        #[schemars(range(min = 1, max = 10_000))]
        limit: usize,
    },
    /// Re-read the configuration file (an invalid file is rejected and the
    /// running configuration stays).
    // Answer: [`super::Committed`]
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
    /// would break. With source.etcd, the file is composed with the
    /// tier's newest desired state (what following the tier would change
    /// here, also when this balancer refused it). Changes nothing.
    // Answer: [`super::ChangePreview`]
    Diff {
        /// The file to compare with what runs (default: lbd's own).
        file: Option<PathBuf>,
        /// Refuse what a plain lbctl reload (without --force) would
        /// refuse, as the reload would (lbd check asks this of a running
        /// lbd).
        #[arg(long)]
        #[serde(default)]
        strict: bool,
    },
    /// The last revisions: every configuration applied (or refused), with
    /// its source and digest.
    // Answer: `Vec<`[`super::RevisionRow`]`>`
    History {
        /// How many, newest first.
        #[arg(long, default_value_t = 20)]
        #[serde(default = "twenty")]
        last: usize,
    },
    /// Apply an earlier revision again (default: the one before the
    /// running one). The file on disk is not rewritten.
    // Answer: [`super::Committed`]
    Revert {
        /// The revision to run again (lbctl history lists them).
        revision: Option<u64>,
        /// Even if it leaves an announced VIP without a usable backend or
        /// changes a VIP's table_size.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// Keep a change made with --confirm-within.
    // Answer: [`super::Committed`]
    Confirm,
    /// lbctl trace's lease on the datapath's tracing (not a command of
    /// its own: lbctl trace sends it).
    // Answer: [`super::TraceLeased`]
    #[command(subcommand, name = "trace-lease", hide = true)]
    #[serde(rename = "trace")]
    TraceLease(TraceRequest),
    /// Route announcement: each peer's session, and which VIPs are
    /// announced or withheld, and why.
    // Answer: [`super::AnnounceStatus`]
    Bgp,
    /// The balancer as a whole: take it out of the routers' paths and back.
    // Answer: [`super::NodeChange`]
    #[command(subcommand)]
    Node(NodeRequest),
    /// Runtime changes still in force over the file (made with lbctl vip
    /// and lbctl backend), and clearing them.
    #[command(subcommand)]
    Overrides(OverridesRequest),
    /// The tier in etcd (source.etcd): every balancer side by side.
    #[command(subcommand)]
    Tier(TierRequest),
}

/// lbctl tier ...
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum TierRequest {
    /// This balancer's link to etcd, the desired revision each balancer
    /// runs, their table digests side by side, and every disagreement.
    // Answer: [`super::TierStatus`]
    Status,
    /// Roll a new desired state (FILE: a YAML document with vips: and
    /// nothing else) out across the tier: to a canary first, then wave by
    /// wave, each wave's gates held for --hold; any gate failing reverts
    /// every balancer that took it. With --dry-run: the plan and this
    /// balancer's slot moves, nothing written.
    // Answer: [`super::RolloutPlan`]
    Rollout {
        /// The new desired state (read by lbctl).
        #[arg(required_unless_present = "abort")]
        file: Option<PathBuf>,
        /// The canary (default: the first balancer by name).
        #[arg(long)]
        canary: Option<String>,
        /// Waves after the canary.
        #[arg(long, default_value_t = 1)]
        #[serde(default = "one_wave")]
        waves: usize,
        /// How long each wave's gates must hold, in seconds.
        #[arg(long, default_value_t = 30)]
        #[serde(default = "thirty")]
        hold: u64,
        /// Stop the rollout in progress: every balancer that took it
        /// goes back.
        #[arg(long, conflicts_with = "file")]
        #[serde(default)]
        abort: bool,
        /// The file's text (lbctl fills it in).
        #[arg(skip)]
        #[serde(default)]
        text: Option<String>,
    },
}

fn one_wave() -> usize {
    1
}

fn thirty() -> u64 {
    30
}

/// lbctl overrides ...
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum OverridesRequest {
    /// Every runtime change in force: object, field, what the file says,
    /// what runs, and the revision, time and source that made it so.
    // Answer: `Vec<`[`super::OverrideRow`]`>`
    List,
    /// Drop runtime changes so that the file decides again: all of them,
    /// a VIP's, or one backend's; a change like any other (previewed with
    /// --dry-run, recorded, revertible).
    // Answer: [`super::Committed`]
    Clear {
        /// Only this VIP's changes (e.g. 10.0.0.1:80/tcp).
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

/// lbctl vip ...
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum VipRequest {
    /// List the VIPs: settings, backends, weights, states and handles.
    // Answer: `Vec<`[`super::VipInfo`]`>`
    List,
    /// Add a VIP, e.g. vip add 10.0.0.1:80/tcp --backend 10.1.0.1 --backend 10.1.0.2=2.
    // Answer: [`super::Committed`]
    Add(VipAdd),
    /// Delete a VIP; its connections break (even if it is the last VIP
    /// announced).
    // Answer: [`super::Committed`]
    Del {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
    },
}

/// A VIP added at runtime: its identity, its backends, and any setting a
/// VIP has in the file (--health-check-interval 1s, --encap gue, ...:
/// one flag per row of VIP_SETTINGS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Args, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VipAdd {
    /// The VIP, e.g. 10.0.0.1:80/tcp, [2001:db8::1]:443/tcp, 10.0.0.1:*/udp.
    pub vip: VipId,
    /// ADDRESS or ADDRESS=WEIGHT; repeat for each backend.
    #[arg(short, long = "backend")]
    pub backends: Vec<BackendSpec>,
    /// The file's settings of a VIP, by their path in the file.
    #[command(flatten)]
    #[serde(default, skip_serializing_if = "VipSettings::is_empty")]
    pub settings: VipSettings,
}

/// A VIP's settings as lbctl vip add takes them: the path of each in the
/// file (health_check.interval) and its value as written (1s); lbd
/// parses them as the file's VIP (config::vip_settings).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct VipSettings(pub std::collections::BTreeMap<String, String>);

impl VipSettings {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl clap::FromArgMatches for VipSettings {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut s = Self::default();
        s.update_from_arg_matches(m)?;
        Ok(s)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        use crate::config::vip_settings::{VIP_SETTINGS, Value};
        for setting in VIP_SETTINGS {
            let given = match setting.value {
                Value::Section => m.get_flag(setting.path).then(String::new),
                _ => m.get_one::<String>(setting.path).cloned(),
            };
            if let Some(v) = given {
                self.0.insert(setting.path.to_string(), v);
            }
        }
        // The older spelling of `--conntrack false`.
        if m.get_flag("no_conntrack") {
            self.0.insert("conntrack".into(), "false".into());
        }
        Ok(())
    }
}

impl clap::Args for VipSettings {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};

        use crate::config::vip_settings::{VIP_SETTINGS, Value, flag_name};
        let cmd = VIP_SETTINGS.iter().fold(cmd, |cmd, s| {
            let arg = Arg::new(s.path)
                // clap keeps `&'static str` names: the 30-odd names are
                // made once per command line built (once per process).
                .long(&*Box::leak(flag_name(s.path).into_boxed_str()))
                .help(s.help)
                .help_heading("VIP settings (as in the file)");
            cmd.arg(match s.value {
                Value::Section => arg.action(ArgAction::SetTrue),
                Value::Switch => arg
                    .value_name("BOOL")
                    .num_args(0..=1)
                    .default_missing_value("true"),
                Value::Scalar | Value::Text => arg.value_name("VALUE"),
            })
        });
        cmd.arg(
            Arg::new("no_conntrack")
                .long("no-conntrack")
                .action(ArgAction::SetTrue)
                .hide(true),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

fn one() -> u32 {
    1
}

fn hundred() -> usize {
    100
}

fn twenty() -> usize {
    20
}

/// ADDRESS or ADDRESS=WEIGHT on the command line; {address, weight}
/// on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
        let address = crate::config::vip::parse_backend_address(addr)?;
        Ok(Self { address, weight })
    }
}

/// lbctl backend ...; changes that would leave a serving VIP with no
/// usable backend are refused unless forced.
// Answer (each): [`super::Committed`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum BackendRequest {
    /// Add a backend to a VIP, e.g. backend add 10.0.0.1:80/tcp 10.1.0.3 -w 2.
    Add {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// The backend's address (it takes the VIP's port: direct server
        /// return keeps the packet as the client sent it).
        #[arg(value_parser = crate::config::vip::parse_backend_address)]
        address: IpAddr,
        /// Its weight: its share of new flows against the others'.
        #[arg(short, long, default_value_t = 1)]
        #[serde(default = "one")]
        weight: u32,
    },
    /// Remove a backend from a VIP; its connections are re-picked and break.
    Del {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// The backend's address.
        #[arg(value_parser = crate::config::vip::parse_backend_address)]
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// Set a backend's weight; 0 takes it out of the table (drain it
    /// instead to keep its connections).
    Weight {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// The backend's address.
        #[arg(value_parser = crate::config::vip::parse_backend_address)]
        address: IpAddr,
        /// The new weight, 0 to 10000.
        weight: u32,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
    },
    /// Stop sending a backend new flows; its connections continue until
    /// the VIP's drain_timeout. Kept across restarts. A draining backend
    /// with no live flow left is drained.
    Drain {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// The backend's address.
        #[arg(value_parser = crate::config::vip::parse_backend_address)]
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        #[serde(default)]
        force: bool,
        /// Wait until the backend is drained (no live flow) or its
        /// drain_timeout runs out, showing its live flows (lbctl only:
        /// the request is the same).
        #[arg(long)]
        #[serde(skip)]
        wait: bool,
    },
    /// Send a drained backend new flows again.
    Undrain {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        vip: VipId,
        /// The backend's address.
        #[arg(value_parser = crate::config::vip::parse_backend_address)]
        address: IpAddr,
    },
}

/// A trace lease: taken or renewed (on), or given back (off).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum TraceRequest {
    /// Take or renew the lease.
    On {
        /// The tracing lbctl's session number.
        session: u32,
        /// Only packets to this VIP.
        #[arg(long)]
        vip: Option<VipId>,
        /// Only packets from this prefix, ADDRESS/LEN.
        #[arg(long)]
        client: Option<String>,
    },
    /// Give the lease back.
    Off {
        /// The tracing lbctl's session number.
        session: u32,
    },
}

/// lbctl node ...
// Answer: [`super::NodeChange`]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Subcommand, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeRequest {
    /// Withdraw every VIP from the routers; forwarding goes on for what
    /// still arrives. Lasts until node undrain or a clean stop of lbd (a
    /// crash or a watchdog kill keeps it).
    /// Waits out shutdown_grace (the routers moving traffic away) before
    /// returning.
    Drain {
        /// Return at once (lbctl only: the request is the same).
        #[arg(long)]
        #[serde(skip)]
        no_wait: bool,
    },
    /// Announce again what the backends' health allows.
    Undrain,
}

/// How a change (vip add|del, backend ..., reload, revert) is
/// applied. Sent beside the request (Envelope); lbd refuses
/// them on requests that change nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, Args, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeOptions {
    /// Show what the change would do, as lbctl diff does; change nothing.
    #[arg(long, global = true)]
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Revert to the previous revision by itself unless lbctl confirm
    /// arrives within this long (e.g. 2m); sooner if the change makes a
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

/// A confirmation window, 2m or 90s (at most a day).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

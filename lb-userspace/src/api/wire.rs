//! The answers `lbd` gives, as they travel: types of the API's own, so
//! that renaming something inside `lbd` cannot change what `lbctl` and
//! scripts read. `crate::daemon` fills them from its state. Field names
//! are the wire format: add fields with `#[serde(default)]`, never rename.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::VipId;

/// Why `lbd` refused a request: a stable code on the wire (`"code"` of a
/// refused answer, beside the message in words), for scripts and tests to
/// branch on instead of the wording. A code is never renamed; new ones
/// may be added, so a client treats an unknown code as `internal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The configuration (a file, or the settings a request gives) breaks
    /// a rule; the message names every problem. The running one is kept.
    InvalidConfig,
    /// The request is malformed or contradicts itself (an option that
    /// does not apply, addresses of two families, not a change).
    BadRequest,
    /// What the request names does not exist: a VIP, a backend, a
    /// revision, a runtime change to clear.
    NotFound,
    /// The VIP or backend already exists.
    Exists,
    /// The change would leave a serving VIP without a usable backend
    /// (the blackhole guard); `--force` does it anyway.
    Blackhole,
    /// The change moves established flows' future packets (a table size
    /// or hash fields changed); `--force` does it anyway.
    NeedsForce,
    /// A setting fixed when `lbd` starts: restart `lbd` to change it.
    FixedSetting,
    /// The request conflicts with the daemon's state: a change awaits
    /// confirmation, there is none to confirm, a revision cannot run.
    Conflict,
    /// The datapath's capacity (VIP ids, backend slots, table pool,
    /// second-chance regions) is used up; the maps' sizes are fixed at
    /// start.
    Capacity,
    /// `lbd` cannot do it now: it is shutting down, or something it needs
    /// (the gateway) does not answer.
    Unavailable,
    /// The request did not reach the daemon as a request: too long, not
    /// JSON, another API version, timed out.
    Protocol,
    /// Writing failed (revision store, state file, maps, announcers);
    /// the message says what, and that nothing changed.
    Internal,
}

impl ErrorKind {
    /// The code as it travels (`blackhole`, `not_found`, ...).
    pub fn code(self) -> &'static str {
        match self {
            Self::InvalidConfig => "invalid_config",
            Self::BadRequest => "bad_request",
            Self::NotFound => "not_found",
            Self::Exists => "exists",
            Self::Blackhole => "blackhole",
            Self::NeedsForce => "needs_force",
            Self::FixedSetting => "fixed_setting",
            Self::Conflict => "conflict",
            Self::Capacity => "capacity",
            Self::Unavailable => "unavailable",
            Self::Protocol => "protocol",
            Self::Internal => "internal",
        }
    }

    /// Every kind, in the order above.
    pub const ALL: [ErrorKind; 12] = [
        Self::InvalidConfig,
        Self::BadRequest,
        Self::NotFound,
        Self::Exists,
        Self::Blackhole,
        Self::NeedsForce,
        Self::FixedSetting,
        Self::Conflict,
        Self::Capacity,
        Self::Unavailable,
        Self::Protocol,
        Self::Internal,
    ];
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// A backend's state (see `crate::lifecycle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BackendState {
    Active,
    SlowStart,
    Draining,
    /// Draining, with no live flow left.
    Drained,
    Down,
    /// Passive health: its clients' SYNs go unanswered.
    Ejected,
}

impl BackendState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::SlowStart => "slow-start",
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::Down => "down",
            Self::Ejected => "ejected",
        }
    }
}

/// What the node as a whole is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    Serving,
    Drained,
    Stopping,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Serving => "serving",
            Self::Drained => "drained",
            Self::Stopping => "stopping",
        })
    }
}

/// A BGP session's state (RFC 4271), or an announcer's (Idle, Established).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SessionState {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeInfo {
    pub ok: bool,
    /// From the start of the connect to the verdict, in microseconds.
    pub latency_us: u64,
    /// What was seen: `connected`, `HTTP 200`, or why it failed.
    pub detail: String,
}

/// One BGP peer, ExaBGP pipe or exec command, for `lbctl bgp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PeerRow {
    /// `10.0.0.1:179` for a BGP peer, `exabgp` or `exec <command>`.
    pub peer: String,
    /// The peer's AS (BGP only).
    pub remote_as: Option<u32>,
    pub state: SessionState,
    /// Seconds since the session reached `Established` (0 when it is not).
    pub uptime_secs: u64,
    /// Hold time agreed with the peer in the current session (BGP only).
    pub hold_time_secs: Option<u16>,
    /// Prefixes the peer (or target) has from us now.
    pub prefixes_announced: usize,
    /// How often the session reached `Established` (BGP only; 0 otherwise).
    pub sessions_established: u64,
    /// The most recent failure, kept after recovery.
    pub last_error: Option<String>,
    /// Messages (or lines, or command runs) sent and received.
    pub messages_sent: u64,
    pub messages_received: u64,
    /// UPDATEs (or prefix changes) sent and received.
    pub updates_sent: u64,
    pub updates_received: u64,
    /// UPDATEs with malformed attributes, ignored (RFC 7606).
    #[serde(default)]
    pub updates_ignored: u64,
    /// The peer's BFD session (BGP peers with `bfd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdRow>,
    /// Graceful restart in the current or last session (BGP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_restart: Option<GracefulRestartRow>,
    /// The routes carry the GRACEFUL_SHUTDOWN community now.
    #[serde(default)]
    pub graceful_shutdown: bool,
    /// The addresses the peer has from us now (BGP; absent for announcers
    /// that cannot tell addresses apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<Vec<IpAddr>>,
    /// The address families the session negotiated (BGP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<String>,
    /// Addresses wanted but not sent to this peer, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld: Vec<(IpAddr, String)>,
}

/// A BGP session's BFD session, as `lbctl bgp` shows it (`lbd`'s BFD
/// code fills it as `crate::bfd::BfdStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BfdRow {
    /// `Up`, `Down`, `Init`, `AdminDown` (RFC 5880), with the Detection
    /// Time applied.
    pub state: String,
    pub up: bool,
    /// Our diagnostic (why it last went down).
    pub diag: String,
    /// The state and diagnostic of the peer's last packet.
    pub remote_state: String,
    pub remote_diag: String,
    /// Seconds since `lbd` saw the state change (`None`: not since it
    /// started).
    pub since_secs: Option<u64>,
    /// The address the peer must send to (and we answer from).
    pub local: Option<IpAddr>,
    pub local_disc: u32,
    pub remote_disc: u32,
    /// Our Detection Time for the peer, and the Desired Min TX of our
    /// last reply, in milliseconds.
    pub detect_ms: u64,
    pub tx_interval_ms: u64,
    /// The peer says its BFD does not share fate with its control plane.
    pub remote_control_independent: bool,
    /// Packets received, replies sent, packets discarded (failed checks),
    /// packets not answered (too soon), transitions to Up.
    pub received: u64,
    pub replied: u64,
    pub invalid: u64,
    pub too_soon: u64,
    pub ups: u64,
    /// Why the session cannot run (no local address, a map error).
    pub error: Option<String>,
}

/// Graceful restart (RFC 4724) in a peer's current or last session (`lbd`'s
/// BGP speaker fills it as `crate::announce::GracefulRestartStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GracefulRestartRow {
    /// We sent the capability; the peer did (it keeps our routes while
    /// we restart).
    pub offered: bool,
    pub peer_supports: bool,
    pub restart_time_secs: u16,
    /// Our OPEN said Restart State (`lbd` restarted) and Forwarding State.
    pub restarting: bool,
    pub forwarding: bool,
    /// Holding the routes and End-of-RIB back until the backends' first
    /// probe verdicts (after a restart).
    pub deferring: bool,
    pub end_of_rib_sent: bool,
}

/// One VIP's announcement verdict, for `lbctl bgp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VipAnnouncement {
    pub vip: VipId,
    /// Backends in the table now, confirmed by their probes.
    pub usable: u32,
    pub backends: u32,
    pub min_healthy: u32,
    /// The VIP's address is announced: the policy wants it and at least
    /// one peer has it (an Established session that negotiated its family,
    /// with a next hop for it).
    pub announced: bool,
    /// The policy wants it announced (enough usable backends, the node
    /// serving, the program attached), whether or not a peer has it.
    #[serde(default)]
    pub wanted: bool,
    /// Why, in words.
    pub reason: String,
}

/// One interface the program is attached to.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct InterfaceInfo {
    pub name: String,
    /// `native`, `generic` or `auto`.
    pub mode: String,
    /// The attachment was adopted from a previous `lbd` (not re-created).
    pub adopted: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Status {
    pub instance: String,
    /// The answering `lbd`'s version and the commit it was built from
    /// (`lb::VERSION`); empty from an `lbd` before it was reported.
    #[serde(default)]
    pub version: String,
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
    /// Bytes of the table pool (`LB_TABLES`), and how many the VIPs'
    /// regions take.
    #[serde(default)]
    pub table_pool_bytes: u64,
    #[serde(default)]
    pub table_pool_used_bytes: u64,
    /// Bytes of map memory by map name.
    pub map_bytes: Vec<(String, u64)>,
    /// Runtime changes on top of the configuration file are present.
    pub api_changes: bool,
    /// How many (`lbctl overrides` lists them).
    #[serde(default)]
    pub overrides: usize,
    pub last_reload: Option<String>,
    pub warnings: Vec<String>,
    /// One line on route announcement: announcers, peers up, prefixes.
    #[serde(default)]
    pub announce: String,
    /// Where the VIPs come from: `file`, or the tier in etcd and this
    /// balancer's link to it.
    #[serde(default)]
    pub source: String,
    /// With `gateway_mac: auto`: what the gateway watcher knows.
    #[serde(default)]
    pub gateway: Option<GatewayInfo>,
    /// The running revision (`lbctl history`).
    pub revision: u64,
    /// Where it came from (`reload`, `revert to 7`, ...).
    pub revision_source: String,
    /// Digest of the effective configuration: equal on the balancers of a
    /// tier that run the same configuration.
    pub config_digest: String,
    /// Set when the running configuration is not the file's (after a
    /// revert), saying so.
    pub file_differs: Option<String>,
    /// A change awaiting `lbctl confirm`.
    pub pending_confirm: Option<PendingConfirm>,
    /// Changes reverted because they were not confirmed in time, or broke
    /// an announcement, since `lbd` started.
    pub auto_reverts: u64,
    /// `lbctl trace` holds the trace lease: the datapath describes the
    /// packets that match its filter.
    pub trace_active: bool,
}

/// A change made with `--confirm-within`, not confirmed yet.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PendingConfirm {
    pub revision: u64,
    /// The revision it reverts to without a confirmation.
    pub fallback: u64,
    /// Seconds left (after a failed revert: until it is tried again).
    pub secs_left: f64,
    /// The automatic revert was due and failed: why.
    #[serde(default)]
    pub revert_failed: Option<String>,
}

/// The gateway watcher's state (`gateway_mac: auto`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct GatewayInfo {
    pub address: Option<IpAddr>,
    /// A lookup is under way right now (the daemon answers meanwhile).
    pub looking_up: bool,
    /// Why the last lookup failed, if it did.
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BackendInfo {
    pub address: IpAddr,
    /// Configured weight.
    pub weight: u32,
    pub state: Option<BackendState>,
    /// Its connection-table entries are honoured.
    pub usable: bool,
    pub handle: u32,
    /// Its connection-table entries seen within the last 10 s.
    #[serde(default)]
    pub live_flows: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
    pub last_probe: Option<ProbeInfo>,
    pub probes: u64,
    /// `probes` when the probes last changed the backend's state (0:
    /// never): how many it took, whatever the delay in reading it.
    #[serde(default)]
    pub probes_at_change: u64,
    /// Passive health over its window (absent for a VIP without it).
    #[serde(default)]
    pub passive: Option<PassiveInfo>,
    /// Held down after flapping probes: seconds left.
    #[serde(default)]
    pub flap_hold_secs: f64,
    /// Its connection-table entries seen within the last 10 s (absent
    /// before the first scan, or where the kernel's clock cannot be read).
    #[serde(default)]
    pub live_flows: Option<u64>,
}

/// A backend's passive health, for `lbctl health`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PassiveInfo {
    /// SYNs sent to it, and retransmitted SYNs of its clients, over the
    /// window.
    pub syns: u64,
    pub retransmits: u64,
    pub ratio: f64,
    /// Ejections in a row (decaying).
    pub ejections: u32,
    /// Seconds of ejection left (0: not ejected).
    pub ejected_secs: f64,
    /// It qualifies but `max_ejection_percent` is reached, or one more
    /// ejection would put the VIP below `panic_threshold`.
    pub held_back: bool,
    /// Why it is not ejected although its ratio is high, if so.
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct VipHealth {
    pub vip: VipId,
    /// Too few backends are healthy: the table uses all of them.
    pub panic: bool,
    /// Times panic mode was entered since `lbd` started.
    pub panic_entered: u64,
    pub backends: Vec<BackendHealth>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct VipInfo {
    pub vip: VipId,
    pub encap: String,
    pub conntrack: bool,
    #[serde(default)]
    pub second_chance: bool,
    pub backends: Vec<BackendInfo>,
}

/// A counter value and its rate over the last sampling interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct Rate {
    pub packets: u64,
    pub bytes: u64,
    pub pps: f64,
    pub bps: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CounterInfo {
    pub name: String,
    /// `pass`, `forward`, `drop`, `malformed` or `event`.
    pub kind: String,
    #[serde(flatten)]
    pub value: Rate,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BackendStats {
    pub address: IpAddr,
    #[serde(flatten)]
    pub value: Rate,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct VipStats {
    pub vip: VipId,
    #[serde(flatten)]
    pub value: Rate,
    pub backends: Vec<BackendStats>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Stats {
    /// Seconds the rates are measured over.
    pub interval_secs: f64,
    pub counters: Vec<CounterInfo>,
    pub vips: Vec<VipStats>,
    /// `pass` or `drop`: what happens to the malformed counters' packets.
    pub malformed_policy: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TableShare {
    pub address: IpAddr,
    pub weight: u32,
    pub slots: u32,
    /// Fraction of slots owned.
    pub share: f64,
    /// Fraction of the VIP's total weight (of backends in the table).
    pub weight_share: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TableInfo {
    pub vip: VipId,
    pub table_size: u32,
    /// Which of the VIP's two table halves is live.
    pub active_half: u32,
    pub backends: Vec<TableShare>,
    /// Digest of the slot → backend assignment (`crate::digest::table`).
    pub digest: String,
    /// Every slot's backend (`None`: dropped), with `--slots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<Option<IpAddr>>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Simulation {
    /// `None` if the destination is not a VIP.
    pub vip: Option<VipId>,
    pub hash: String,
    pub slot: u32,
    /// `None`: dropped (no usable backend) or not a VIP.
    pub backend: Option<IpAddr>,
    /// `connection table` or `maglev`.
    pub via: String,
    /// Second chance: the alternates the packet carries, in the order the
    /// backends try them (none for a SYN, a connection-table hit, UDP, a
    /// VIP without second chance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternates: Vec<IpAddr>,
}

/// `lbctl conns`: connection-table entries, as `ipvsadm -Lnc` lists
/// IPVS's connections.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Conns {
    /// The first `limit` entries that match: in table order, or for a
    /// client query by VIP, client address and port.
    pub rows: Vec<ConnRow>,
    /// Entries that match in all (more than `rows` when cut at the limit).
    pub matched: u64,
    /// What was searched: the buckets read, or the tuples hashed for a
    /// client.
    pub searched: String,
    /// How long the search took, in milliseconds.
    pub elapsed_ms: f64,
    /// VIPs a client query could not search (all-ports VIPs: every
    /// destination port too), named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One connection-table entry.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ConnRow {
    pub vip: VipId,
    pub backend: IpAddr,
    /// The client's address and port: only for `--client` (the table
    /// keeps a tag of the flow, not its tuple).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<std::net::SocketAddr>,
    /// Seconds since its last packet, in steps of the stamps' tick (64
    /// jiffies); stamps wrap every 16,384 ticks (70 min at HZ=250), so an
    /// entry idle longer shows less. `None` without the kernel's clock.
    pub idle_secs: Option<f64>,
    /// Its activity class: 0 one packet and no handshake seen, 1 a second
    /// packet or a handshake seen from its SYN, 2, 3 (active) four
    /// packets or more.
    pub class: u8,
    /// Class 1 or more: more than one packet, or its SYN went out from
    /// here.
    pub confirmed: bool,
    /// Its place: bucket index and way.
    pub bucket: u32,
    pub way: u8,
}

/// `lbctl bgp`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
    pub peers: Vec<PeerRow>,
    pub vips: Vec<VipAnnouncement>,
}

/// The answer to `tier status`: this balancer's link to etcd and what it
/// applied, every member of the tier with its report, and where they
/// disagree.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TierStatus {
    /// This balancer's name in the tier.
    pub name: String,
    pub prefix: String,
    pub endpoints: Vec<String>,
    /// Following etcd now; when not, it keeps what it applied.
    pub connected: bool,
    /// Since when connected, or cut off.
    pub since: String,
    /// Why it is not connected.
    pub error: Option<String>,
    /// The etcd revision of the newest desired state seen, and of the one
    /// this balancer runs.
    pub seen: Option<i64>,
    pub applied: Option<i64>,
    /// Why the newest desired state was refused here, if it was.
    pub refused: Option<String>,
    /// Something to know (no desired state in etcd; etcd behind what was
    /// applied).
    pub note: Option<String>,
    pub members: Vec<crate::tier::Member>,
    /// Where the members disagree, one line each (none: they agree).
    pub flags: Vec<String>,
    /// The rollout whose candidate this balancer runs, if it does.
    #[serde(default)]
    pub candidate: Option<i64>,
    /// The revision a revert brought back here, running instead of the
    /// desired state `applied` names, if one does.
    #[serde(default)]
    pub reverted: Option<u64>,
    /// The staged rollout in progress or last.
    #[serde(default)]
    pub rollout: Option<RolloutView>,
}

/// A staged rollout as `lbctl tier status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RolloutView {
    /// Its etcd revision (the candidate's revision on the balancers).
    pub revision: i64,
    pub by: String,
    pub hold_secs: u64,
    /// Each wave's balancers and their phase (`passed`, `FAILED: ...`,
    /// `reverted`, or `-`).
    pub waves: Vec<Vec<(String, String)>>,
    /// How it ended, if it did.
    pub outcome: Option<crate::tier::rollout::Outcome>,
    /// A desired state written after it started decides instead.
    pub superseded: bool,
    /// What this balancer does in it now, in words.
    pub step: String,
    /// Why the record cannot be read, if it cannot.
    pub error: Option<String>,
}

/// The answer to `lbctl tier rollout`: the plan, and what the change
/// does to this balancer's tables.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RolloutPlan {
    pub prefix: String,
    /// Balancer names, wave by wave; the first is the canary.
    pub waves: Vec<Vec<String>>,
    pub hold_secs: u64,
    /// The change on this balancer (slot moves per VIP, flows that
    /// break); none for `--abort`.
    pub preview: Option<ChangePreview>,
    /// The record's revision once written (`None`: a dry run).
    pub revision: Option<i64>,
    /// `--abort`: the rollout was marked aborted.
    #[serde(default)]
    pub aborted: bool,
}

/// The answer to `node_drain` and `node_undrain`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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

/// A setting's value before and after a change, in the file's words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SettingChange {
    pub name: String,
    pub before: String,
    pub after: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BackendWeight {
    pub address: IpAddr,
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Reweight {
    pub address: IpAddr,
    pub before: u32,
    pub after: u32,
}

/// What a change does to one VIP that exists before and after it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VipChange {
    pub vip: VipId,
    pub backends_added: Vec<BackendWeight>,
    pub backends_removed: Vec<IpAddr>,
    pub backends_reweighted: Vec<Reweight>,
    pub settings: Vec<SettingChange>,
    /// Slots of the table whose backend changes (the tables before and
    /// after, both built, compared slot by slot).
    pub slots_moved: u32,
    pub table_size: u32,
    /// `slots_moved / table_size`: the share of new flows that go
    /// elsewhere (and of established ones that would, without the
    /// connection table).
    pub share_moved: f64,
    /// Connection-table entries that point at backends that leave
    /// (entries of idle or closed flows included).
    pub flows_breaking: u64,
    /// Of those, the live flows (seen within 10 s): the connections that
    /// break. Absent where the kernel's clock cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_flows_breaking: Option<u64>,
}

/// A VIP a change removes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VipRemoved {
    pub vip: VipId,
    /// Its connection-table entries (idle and closed flows included).
    pub flows_breaking: u64,
    /// Of those, the live flows: the connections that break. Absent
    /// where the kernel's clock cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_flows_breaking: Option<u64>,
}

/// A runtime change in force over the file (`lbctl overrides`, and in
/// `lbctl diff`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OverrideRow {
    pub vip: VipId,
    /// The backend, for a change of one backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<IpAddr>,
    /// `vip`, `backend`, `weight` or `state`.
    pub field: String,
    /// What the file says (`absent`: it has no such object).
    pub file: String,
    /// What runs.
    pub running: String,
    /// The revision that made it so (0: kept from an earlier `lbd`).
    pub revision: u64,
    /// When, UTC.
    pub time: String,
    /// What made it: `api: backend weight ...`.
    pub source: String,
}

/// What a change would do (`lbctl diff`, `--dry-run`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChangePreview {
    pub digest_before: String,
    pub digest_after: String,
    pub vips_added: Vec<VipId>,
    pub vips_removed: Vec<VipRemoved>,
    /// VIPs that exist before and after and change (only those).
    pub vips_changed: Vec<VipChange>,
    /// Global settings that change.
    pub settings: Vec<SettingChange>,
    /// Problems of the change that a reload would also report.
    pub warnings: Vec<String>,
    /// Runtime changes that would still be in force, each shadowing what
    /// the file says.
    #[serde(default)]
    pub overrides: Vec<OverrideRow>,
    /// Runtime changes the change takes back (a reload: the file changed
    /// their object since, so the file decides).
    #[serde(default)]
    pub overrides_dropped: Vec<OverrideRow>,
}

impl ChangePreview {
    /// The change changes nothing.
    pub fn is_empty(&self) -> bool {
        self.vips_added.is_empty()
            && self.vips_removed.is_empty()
            && self.vips_changed.is_empty()
            && self.settings.is_empty()
            && self.overrides_dropped.is_empty()
    }
}

/// The answer to a change (`vip`, `backend`, `reload`, `revert`,
/// `confirm`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct Committed {
    /// The revision now running (`None` for a dry run).
    pub revision: Option<u64>,
    pub warnings: Vec<String>,
    /// With `--dry-run`: what the change would do.
    pub preview: Option<ChangePreview>,
    /// With `--confirm-within`: seconds until the automatic revert.
    pub confirm_within_secs: Option<f64>,
    /// In words, when there is something to say (nothing to do, ...).
    pub note: Option<String>,
}

/// The answer to a trace lease.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TraceLeased {
    /// Where the ring buffer of events is pinned.
    pub events: String,
    /// Maglev table size, for the slot of each event.
    pub table_size: u32,
    /// The VIPs whose own table size differs from `table_size`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub table_sizes: Vec<(crate::config::VipId, u32)>,
    /// Seconds the lease lasts unless renewed.
    pub lease_secs: f64,
}

/// One revision, for `lbctl history`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct RevisionRow {
    pub revision: u64,
    /// When, UTC.
    pub time: String,
    pub source: String,
    pub digest: Option<String>,
    /// `ok`, `failed: ...` or `unreadable: ...`.
    pub result: String,
    /// This revision runs now.
    pub running: bool,
}

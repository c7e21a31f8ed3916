//! `lbctl`: the operator's CLI. Talks to `lbd` over its control socket
//! (every command but `decap`, which installs the backend-side program on
//! this machine). Human-readable tables by default, `-o json` for scripts.

use std::{net::IpAddr, path::PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lb::{
    api::{
        self, AnnounceStatus, NodeChange, Request, Simulation, Stats, Status, TableInfo, VipHealth,
        VipInfo,
    },
    config::{BackendConfig, Encap, Protocol, VipConfig, VipId},
};
use serde::de::DeserializeOwned;

#[derive(Parser)]
#[command(version, about = "Control an lb balancer (lbd)")]
struct Args {
    /// lbd's control socket (default: /run/lb/<instance>.sock).
    #[arg(short, long, global = true)]
    socket: Option<PathBuf>,
    /// Instance name, used to find the socket.
    #[arg(short, long, global = true, default_value = "default")]
    instance: String,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// The daemon: interfaces, maps, limits, last reload.
    Status,
    /// VIPs.
    #[command(subcommand)]
    Vip(VipCommand),
    /// Backends of a VIP.
    #[command(subcommand)]
    Backend(BackendCommand),
    /// Counters and rates: outcomes, drop reasons, per VIP and backend.
    Stats,
    /// Backend states and the last probe of each.
    Health,
    /// A VIP's Maglev table: slots per backend, share against weight.
    Table { vip: VipId },
    /// Which backend a flow gets, and why.
    Simulate {
        src: IpAddr,
        dst: IpAddr,
        protocol: Protocol,
        sport: u16,
        dport: u16,
        /// As a TCP SYN (a new connection: skips the connection table).
        #[arg(long)]
        syn: bool,
    },
    /// Re-read the configuration file (an invalid file is rejected and the
    /// running configuration stays).
    Reload {
        /// Apply a file that leaves an announced VIP without a usable
        /// backend (refused otherwise).
        #[arg(long)]
        force: bool,
    },
    /// Route announcement: each peer's session, and which VIPs are
    /// announced or withheld, and why.
    Bgp,
    /// The balancer as a whole: take it out of the routers' paths and back.
    #[command(subcommand)]
    Node(NodeCommand),
    /// The backend-side decapsulation program on this machine.
    #[command(subcommand)]
    Decap(DecapCommand),
}

#[derive(Subcommand)]
enum VipCommand {
    List,
    /// Add a VIP, e.g. `vip add 10.0.0.1:80/tcp --backend 10.1.0.1 --backend 10.1.0.2=2`.
    Add {
        vip: VipId,
        /// ADDRESS or ADDRESS=WEIGHT; repeat for each backend.
        #[arg(short, long = "backend")]
        backends: Vec<String>,
        #[arg(long, value_enum, default_value_t = EncapArg::Ipip)]
        encap: EncapArg,
        /// Hash every packet; keep no per-flow state.
        #[arg(long)]
        no_conntrack: bool,
        /// Announce the VIP only while this many backends are usable.
        #[arg(long, default_value_t = 1)]
        min_healthy: u32,
    },
    Del {
        vip: VipId,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum EncapArg {
    Ipip,
    Gre,
    Gue,
}

#[derive(Subcommand)]
enum BackendCommand {
    Add {
        vip: VipId,
        address: IpAddr,
        #[arg(short, long, default_value_t = 1)]
        weight: u32,
    },
    Del {
        vip: VipId,
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        force: bool,
    },
    Weight {
        vip: VipId,
        address: IpAddr,
        weight: u32,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        force: bool,
    },
    /// Stop sending it new flows; its connections continue until the VIP's
    /// drain_timeout.
    Drain {
        vip: VipId,
        address: IpAddr,
        /// Even if it leaves an announced VIP without a usable backend.
        #[arg(long)]
        force: bool,
    },
    Undrain {
        vip: VipId,
        address: IpAddr,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Withdraw every VIP from the routers; forwarding goes on for what
    /// still arrives. Lasts until `node undrain` or a restart of lbd.
    /// Waits out `shutdown_grace` (the routers moving traffic away) before
    /// returning.
    Drain {
        /// Return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Announce again what the backends' health allows.
    Undrain,
}

#[derive(Subcommand)]
enum DecapCommand {
    /// Attach the decapsulation program to IFACE (stays attached after exit).
    Attach {
        iface: String,
        #[arg(long, value_enum, default_value_t = ModeArg::Native)]
        mode: ModeArg,
        /// Tunnel endpoint addresses to accept (default: IFACE's addresses).
        #[arg(long = "local")]
        local: Vec<IpAddr>,
        /// UDP port on which GUE tunnels are accepted (the balancer's
        /// `gue_port`); 0 accepts no GUE.
        #[arg(long, default_value_t = lb_common::consts::GUE_PORT)]
        gue_port: u16,
    },
    /// Detach it from IFACE.
    Detach { iface: String },
    /// Its counters on IFACE.
    Stats { iface: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Native,
    Generic,
    Auto,
}

fn main() {
    // Like any Unix tool: a closed pipe (`lbctl bgp | head -1`) ends the
    // process quietly, instead of a panic in println!.
    // SAFETY: restoring the default disposition of SIGPIPE before any
    // thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if let Err(e) = run(Args::parse()) {
        eprintln!("lbctl: {e:#}");
        std::process::exit(1);
    }
}

fn parse_backend(s: &str) -> Result<BackendConfig> {
    let (addr, weight) = match s.split_once('=') {
        Some((a, w)) => (a, w.parse().with_context(|| format!("weight in `{s}`"))?),
        None => (s, 1),
    };
    Ok(BackendConfig::new(
        addr.parse()
            .with_context(|| format!("`{addr}` is not an IP address"))?,
        weight,
    ))
}

fn run(args: Args) -> Result<()> {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/run/lb/{}.sock", args.instance)));
    let call = |r: Request| api::call(&socket, &r).map_err(anyhow::Error::from);
    let json = args.output == Output::Json;
    let show = |value: serde_json::Value, table: &dyn Fn(serde_json::Value) -> Result<()>| {
        if json {
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(())
        } else {
            table(value)
        }
    };
    let done = |value: serde_json::Value, what: &str| -> Result<()> {
        if json {
            println!("{}", serde_json::to_string_pretty(&value)?);
        } else {
            println!("{what}");
        }
        Ok(())
    };
    match args.command {
        Command::Status => show(call(Request::Status)?, &|v| print_status(decode(v)?)),
        Command::Vip(VipCommand::List) => {
            show(call(Request::VipList)?, &|v| print_vips(decode(v)?))
        }
        Command::Vip(VipCommand::Add {
            vip,
            backends,
            encap,
            no_conntrack,
            min_healthy,
        }) => {
            let backends = backends
                .iter()
                .map(|b| parse_backend(b))
                .collect::<Result<Vec<_>>>()?;
            let mut config = VipConfig::new(vip, backends);
            config.encap = match encap {
                EncapArg::Ipip => Encap::Ipip,
                EncapArg::Gre => Encap::Gre,
                EncapArg::Gue => Encap::Gue,
            };
            config.conntrack = !no_conntrack;
            config.min_healthy = min_healthy;
            done(
                call(Request::VipAdd {
                    vip: Box::new(config),
                })?,
                &format!("added VIP {vip}"),
            )
        }
        Command::Vip(VipCommand::Del { vip }) => done(
            call(Request::VipDel { vip })?,
            &format!("deleted VIP {vip}"),
        ),
        Command::Backend(BackendCommand::Add {
            vip,
            address,
            weight,
        }) => done(
            call(Request::BackendAdd {
                vip,
                address,
                weight,
            })?,
            &format!("added backend {address} (weight {weight}) to {vip}"),
        ),
        Command::Backend(BackendCommand::Del {
            vip,
            address,
            force,
        }) => done(
            call(Request::BackendDel {
                vip,
                address,
                force,
            })?,
            &format!("deleted backend {address} from {vip}"),
        ),
        Command::Backend(BackendCommand::Weight {
            vip,
            address,
            weight,
            force,
        }) => done(
            call(Request::BackendWeight {
                vip,
                address,
                weight,
                force,
            })?,
            &format!("backend {address} of {vip} now has weight {weight}"),
        ),
        Command::Backend(BackendCommand::Drain {
            vip,
            address,
            force,
        }) => done(
            call(Request::BackendDrain {
                vip,
                address,
                force,
            })?,
            &format!("draining backend {address} of {vip}"),
        ),
        Command::Backend(BackendCommand::Undrain { vip, address }) => done(
            call(Request::BackendUndrain { vip, address })?,
            &format!("backend {address} of {vip} is no longer draining"),
        ),
        Command::Health => show(call(Request::Health)?, &|v| print_health(decode(v)?)),
        Command::Stats => show(call(Request::Stats)?, &|v| print_stats(decode(v)?)),
        Command::Table { vip } => show(call(Request::Table { vip })?, &|v| print_table(decode(v)?)),
        Command::Simulate {
            src,
            dst,
            protocol,
            sport,
            dport,
            syn,
        } => show(
            call(Request::Simulate {
                src,
                dst,
                protocol,
                sport,
                dport,
                syn,
            })?,
            &|v| print_simulation(decode(v)?),
        ),
        Command::Reload { force } => {
            let warnings: Vec<String> = decode(call(Request::Reload { force })?)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&warnings)?);
            } else {
                for w in &warnings {
                    println!("warning: {w}");
                }
                println!("reloaded");
            }
            Ok(())
        }
        Command::Bgp => show(call(Request::Bgp)?, &|v| print_bgp(decode(v)?)),
        Command::Node(NodeCommand::Drain { no_wait }) => {
            let value = call(Request::NodeDrain)?;
            let change: NodeChange = decode(value.clone())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print_node_change(&change, "drained", "withdrew");
            }
            if !no_wait && change.wait_secs > 0.0 {
                if !json {
                    println!(
                        "waiting {:.1}s (shutdown_grace) for the routers to move traffic away",
                        change.wait_secs
                    );
                }
                std::thread::sleep(std::time::Duration::from_secs_f64(change.wait_secs));
            }
            Ok(())
        }
        Command::Node(NodeCommand::Undrain) => {
            let value = call(Request::NodeUndrain)?;
            show(value, &|v| {
                print_node_change(&decode(v)?, "serving", "announced");
                Ok(())
            })
        }
        Command::Decap(cmd) => decap(cmd, json),
    }
}

fn print_node_change(c: &NodeChange, state: &str, verb: &str) {
    let list: Vec<String> = c.addresses.iter().map(ToString::to_string).collect();
    match (c.changed, list.is_empty()) {
        (false, _) => println!("the node was already {state}"),
        (true, true) => println!("node {state}; no route to change"),
        (true, false) => println!("node {state}; {verb} {}", list.join(", ")),
    }
}

fn decode<T: DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).context("unexpected answer from lbd (version mismatch?)")
}

fn decap_dir(iface: &str) -> PathBuf {
    // Interfaces of the same name may exist in several network namespaces:
    // key the pins by the namespace too.
    let ns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| {
            p.to_string_lossy()
                .trim_start_matches("net:[")
                .trim_end_matches(']')
                .to_string()
        })
        .unwrap_or_else(|_| "0".into());
    PathBuf::from(format!("/sys/fs/bpf/lb/decap/{ns}-{iface}"))
}

fn decap(cmd: DecapCommand, json: bool) -> Result<()> {
    use aya::programs::XdpMode;
    match cmd {
        DecapCommand::Attach {
            iface,
            mode,
            local,
            gue_port,
        } => {
            let mode = match mode {
                ModeArg::Native => XdpMode::Driver,
                ModeArg::Generic => XdpMode::Skb,
                ModeArg::Auto => XdpMode::Default,
            };
            lb::decap::attach(&iface, mode, &local, gue_port, &decap_dir(&iface))
                .with_context(|| format!("attaching the decap program to {iface}"))?;
            println!("decap attached to {iface}");
        }
        DecapCommand::Detach { iface } => {
            lb::decap::detach(&decap_dir(&iface))
                .with_context(|| format!("detaching from {iface}"))?;
            println!("decap detached from {iface}");
        }
        DecapCommand::Stats { iface } => {
            let counters = lb::decap::counters_pinned(&decap_dir(&iface))
                .with_context(|| format!("no decap program attached to {iface} by lbctl?"))?;
            let rows: Vec<(String, u64, u64)> = lb_common::counters::DecapCounter::ALL
                .iter()
                .map(|c| {
                    let v = counters.get(*c as usize).copied().unwrap_or_default();
                    (c.name().to_string(), v.packets, v.bytes)
                })
                .collect();
            if json {
                let map: serde_json::Map<String, serde_json::Value> = rows
                    .iter()
                    .map(|(n, p, b)| (n.clone(), serde_json::json!({"packets": p, "bytes": b})))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&map)?);
            } else {
                print_rows(
                    &["counter", "packets", "bytes"],
                    rows.iter()
                        .map(|(n, p, b)| vec![n.clone(), p.to_string(), b.to_string()])
                        .collect(),
                );
            }
        }
    }
    Ok(())
}

/// Prints rows under a header, columns aligned (numbers to the right).
fn print_rows(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|col| {
            !rows.is_empty()
                && rows.iter().all(|r| {
                    r.get(col).is_some_and(|c| {
                        c.matches('.').count() <= 1
                            && c.chars()
                                .all(|ch| ch.is_ascii_digit() || ".%kMG-".contains(ch))
                    })
                })
        })
        .collect();
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if numeric[i] {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row);
    }
}

fn si(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.1}G", x / 1e9),
        x if x >= 1e6 => format!("{:.1}M", x / 1e6),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

fn bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn print_status(s: Status) -> Result<()> {
    let ifaces: Vec<String> = s
        .interfaces
        .iter()
        .map(|i| {
            format!(
                "{} ({}{})",
                i.name,
                i.mode,
                if i.adopted { ", adopted" } else { "" }
            )
        })
        .collect();
    let (h, m, sec) = (
        s.uptime_secs / 3600,
        s.uptime_secs / 60 % 60,
        s.uptime_secs % 60,
    );
    let total: u64 = s.map_bytes.iter().map(|(_, b)| b).sum();
    println!(
        "instance      {} (pid {}, up {h}h{m:02}m{sec:02}s)",
        s.instance, s.pid
    );
    println!(
        "config        {}{}",
        s.config_file,
        if s.api_changes {
            " + runtime changes"
        } else {
            ""
        }
    );
    println!("interfaces    {}", ifaces.join(", "));
    match &s.gateway {
        None => println!("gateway MAC   {}", s.gateway_mac),
        Some(g) => println!(
            "gateway MAC   {} (auto{}{}{})",
            s.gateway_mac,
            g.address
                .map(|a| format!(", gateway {a}"))
                .unwrap_or_default(),
            if g.looking_up {
                "; looking it up now"
            } else {
                ""
            },
            g.error
                .as_ref()
                .map(|e| format!("; last lookup failed: {e}"))
                .unwrap_or_default()
        ),
    }
    println!(
        "pinned maps   {}{}",
        s.pin_dir,
        if s.maps_adopted {
            " (adopted at start)"
        } else {
            ""
        }
    );
    println!("VIPs          {} of {}", s.vips, s.max_vips);
    println!("backends      {} of {}", s.backends, s.max_backends);
    println!(
        "tables        M = {}; connection table {} buckets ({} flows)",
        s.table_size,
        s.ct_buckets,
        s.ct_buckets as u64 * lb_common::consts::CT_WAYS as u64
    );
    let maps: Vec<String> = s
        .map_bytes
        .iter()
        .map(|(n, b)| format!("{n} {}", bytes(*b)))
        .collect();
    println!("map memory    {} ({})", bytes(total), maps.join(", "));
    println!(
        "last reload   {}",
        s.last_reload.as_deref().unwrap_or("none since start")
    );
    println!("announce      {}", s.announce);
    for w in &s.warnings {
        println!("warning       {w}");
    }
    Ok(())
}

fn print_bgp(s: AnnounceStatus) -> Result<()> {
    let node = match s.node {
        lb::announce::policy::NodeState::Serving => "serving".to_string(),
        other => format!("{other} for {}", duration(s.node_state_secs)),
    };
    println!(
        "node          {node}{}",
        if s.attached {
            ""
        } else {
            " (XDP program not attached)"
        }
    );
    println!(
        "announcers    {}",
        if s.announcers.is_empty() {
            "none configured (`announce:` in the configuration file)".to_string()
        } else {
            s.announcers.join(", ")
        }
    );
    println!(
        "grace         {} (shutdown_grace)",
        duration(s.shutdown_grace_secs)
    );
    if !s.peers.is_empty() {
        println!();
        let rows = s
            .peers
            .iter()
            .map(|p| {
                vec![
                    p.peer.clone(),
                    p.remote_as.map_or("-".into(), |a| a.to_string()),
                    p.state.to_string(),
                    if p.state == lb::announce::SessionState::Established {
                        duration(p.uptime_secs as f64)
                    } else {
                        "-".into()
                    },
                    p.prefixes_announced.to_string(),
                    p.updates_sent.to_string(),
                    p.last_error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        print_rows(
            &[
                "peer",
                "remote as",
                "state",
                "uptime",
                "prefixes",
                "updates",
                "last error",
            ],
            rows,
        );
    }
    println!();
    let rows = s
        .vips
        .iter()
        .map(|v| {
            vec![
                v.vip.to_string(),
                if v.announced { "announced" } else { "withheld" }.into(),
                format!("{}/{}", v.usable, v.backends),
                v.min_healthy.to_string(),
                v.reason.clone(),
            ]
        })
        .collect();
    print_rows(&["vip", "route", "usable", "min", "why"], rows);
    Ok(())
}

fn print_vips(vips: Vec<VipInfo>) -> Result<()> {
    let mut rows = Vec::new();
    for v in vips {
        if v.backends.is_empty() {
            rows.push(vec![
                v.vip.to_string(),
                v.encap.clone(),
                if v.conntrack { "yes" } else { "no" }.into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for b in &v.backends {
            rows.push(vec![
                v.vip.to_string(),
                v.encap.clone(),
                if v.conntrack { "yes" } else { "no" }.into(),
                b.address.to_string(),
                b.weight.to_string(),
                b.state.map(state_name).unwrap_or("-").into(),
            ]);
        }
    }
    print_rows(
        &["vip", "encap", "conntrack", "backend", "weight", "state"],
        rows,
    );
    Ok(())
}

fn state_name(s: lb::lifecycle::BackendState) -> &'static str {
    use lb::lifecycle::BackendState::*;
    match s {
        Active => "active",
        SlowStart => "slow-start",
        Draining => "draining",
        Down => "down",
    }
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{secs:.1}s"),
    }
}

fn print_health(vips: Vec<VipHealth>) -> Result<()> {
    let mut rows = Vec::new();
    for v in &vips {
        for b in &v.backends {
            let (last, latency) = match &b.last_probe {
                Some(p) => (
                    format!("{} {}", if p.ok { "ok" } else { "FAIL" }, p.detail),
                    format!("{:.1}ms", p.latency_us as f64 / 1000.0),
                ),
                None => ("-".into(), "-".into()),
            };
            rows.push(vec![
                v.vip.to_string(),
                b.address.to_string(),
                state_name(b.state).into(),
                b.health.clone(),
                format!("{:.2}", b.effective_weight),
                duration(b.in_state_secs),
                last,
                latency,
            ]);
        }
    }
    print_rows(
        &[
            "vip",
            "backend",
            "state",
            "health",
            "weight now",
            "in state",
            "last probe",
            "latency",
        ],
        rows,
    );
    for v in &vips {
        if v.panic {
            println!(
                "PANIC {}: too few healthy backends, the table uses all of them",
                v.vip
            );
        }
        if v.panic_entered > 0 {
            println!(
                "{}: entered panic mode {} time(s) since lbd started",
                v.vip, v.panic_entered
            );
        }
    }
    let checks: std::collections::BTreeSet<String> = vips
        .iter()
        .flat_map(|v| v.backends.iter().filter_map(|b| b.check.clone()))
        .collect();
    for c in checks {
        println!("check: {c}");
    }
    Ok(())
}

fn print_stats(s: Stats) -> Result<()> {
    println!(
        "rates over the last {:.1}s; malformed packets are {}ed",
        s.interval_secs, s.malformed_policy
    );
    println!();
    let rows = s
        .counters
        .iter()
        .filter(|c| c.value.packets > 0 || c.kind == "forward")
        .map(|c| {
            vec![
                c.name.clone(),
                c.kind.clone(),
                c.value.packets.to_string(),
                c.value.bytes.to_string(),
                si(c.value.pps),
            ]
        })
        .collect();
    print_rows(&["counter", "kind", "packets", "bytes", "pps"], rows);
    println!();
    let mut rows = Vec::new();
    for v in &s.vips {
        rows.push(vec![
            v.vip.to_string(),
            "(all)".into(),
            v.value.packets.to_string(),
            v.value.bytes.to_string(),
            si(v.value.pps),
            si(v.value.bps),
        ]);
        for b in &v.backends {
            rows.push(vec![
                String::new(),
                b.address.to_string(),
                b.value.packets.to_string(),
                b.value.bytes.to_string(),
                si(b.value.pps),
                si(b.value.bps),
            ]);
        }
    }
    print_rows(&["vip", "backend", "packets", "bytes", "pps", "bps"], rows);
    Ok(())
}

fn print_table(t: TableInfo) -> Result<()> {
    println!(
        "{}: M = {}, active half {}",
        t.vip, t.table_size, t.active_half
    );
    let rows = t
        .backends
        .iter()
        .map(|b| {
            vec![
                b.address.to_string(),
                b.weight.to_string(),
                b.slots.to_string(),
                format!("{:.2}%", b.share * 100.0),
                format!("{:.2}%", b.weight_share * 100.0),
            ]
        })
        .collect();
    print_rows(
        &["backend", "weight", "slots", "share", "weight share"],
        rows,
    );
    Ok(())
}

fn print_simulation(s: Simulation) -> Result<()> {
    match s.vip {
        None => println!(
            "not a VIP: the packet is passed to the kernel (hash {})",
            s.hash
        ),
        Some(vip) => {
            println!("vip       {vip}");
            println!("hash      {} (slot {})", s.hash, s.slot);
            match s.backend {
                Some(b) => println!("backend   {b}"),
                None => println!("backend   none"),
            }
            println!("via       {}", s.via);
        }
    }
    if s.vip.is_some() && s.backend.is_none() {
        bail!("no backend for this flow");
    }
    Ok(())
}

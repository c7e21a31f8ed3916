//! `lbctl decap ...`: the backend-side decapsulation program on this
//! machine (no `lbd` involved).

use std::{net::IpAddr, path::PathBuf};

use anyhow::{Context as _, Result};
use clap::{Subcommand, ValueEnum};

use crate::print::print_rows;

#[derive(Subcommand)]
pub enum DecapCommand {
    /// Attach the decapsulation program to IFACE (stays attached after exit).
    Attach {
        /// The backend's interface that receives the tunnels, e.g. eth0.
        iface: String,
        /// XDP mode: native (in the driver) or generic (any interface).
        #[arg(long, value_enum, default_value_t = ModeArg::Native)]
        mode: ModeArg,
        /// Tunnel endpoint addresses to accept (default: IFACE's addresses).
        #[arg(long = "local")]
        local: Vec<IpAddr>,
        /// UDP port on which GUE tunnels are accepted (the balancer's
        /// gue_port); 0 accepts no GUE.
        #[arg(long, default_value_t = lb_common::consts::GUE_PORT)]
        gue_port: u16,
        /// Take tunnels only from this prefix (repeat it): the balancers'
        /// addresses (or outer_source prefixes) and, with second chance,
        /// the other backends'. One of --from and --from-any is needed.
        #[arg(long = "from", required_unless_present = "from_any")]
        from: Vec<ipnet::IpNet>,
        /// Take tunnels from any source: whoever reaches this host can
        /// tunnel packets into it (filter tunnels at the edge instead).
        #[arg(long, conflicts_with = "from")]
        from_any: bool,
    },
    /// Detach it from IFACE.
    Detach {
        /// The interface it was attached to.
        iface: String,
    },
    /// Its counters on IFACE: delivered, passed, malformed, second chance.
    Stats {
        /// The interface it is attached to.
        iface: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Native,
    Generic,
    Auto,
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

pub fn run(cmd: DecapCommand, json: bool) -> Result<()> {
    match cmd {
        DecapCommand::Attach {
            iface,
            mode,
            local,
            gue_port,
            from,
            from_any: _,
        } => attach(&iface, mode, &local, gue_port, &from, json),
        DecapCommand::Detach { iface } => {
            lb::decap::detach(&decap_dir(&iface))
                .with_context(|| format!("detaching from {iface}"))?;
            if json {
                println!("{}", serde_json::json!({ "detached": iface }));
            } else {
                println!("decap detached from {iface}");
            }
            Ok(())
        }
        DecapCommand::Stats { iface } => stats(&iface, json),
    }
}

/// `lbctl decap attach`: attached, with what it means said on stderr (a
/// prefix left out, tunnels from anywhere).
fn attach(
    iface: &str,
    mode: ModeArg,
    local: &[std::net::IpAddr],
    gue_port: u16,
    from: &[ipnet::IpNet],
    json: bool,
) -> Result<()> {
    use aya::programs::XdpMode;
    let mode = match mode {
        ModeArg::Native => XdpMode::Driver,
        ModeArg::Generic => XdpMode::Skb,
        ModeArg::Auto => XdpMode::Default,
    };
    let dropped = lb::decap::attach(iface, mode, local, gue_port, from, &decap_dir(iface))
        .with_context(|| format!("attaching the decap program to {iface}"))?;
    // From any source takes them all: nothing is left out then.
    if !dropped.is_empty() && !from.is_empty() {
        let list: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        eprintln!(
            "warning: {iface} no longer takes tunnels from {} (taken before, not in this --from): their tunnels are dropped from now on",
            list.join(", ")
        );
    }
    if from.is_empty() {
        eprintln!(
            "warning: {iface} takes tunnels from any source (--from-any): whoever reaches this host can tunnel packets into it, and have it hand second-chance lists on; give --from with the balancers' (and, for second chance, the backends') prefixes, or filter tunnels at the edge"
        );
    }
    if json {
        println!("{}", serde_json::json!({ "attached": iface }));
    } else {
        println!("decap attached to {iface}");
    }
    Ok(())
}

/// `lbctl decap stats`: the prefixes tunnels are taken from (text only)
/// and the counters.
fn stats(iface: &str, json: bool) -> Result<()> {
    let counters = lb::decap::counters_pinned(&decap_dir(iface))
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
        return Ok(());
    }
    match lb::decap::sources_pinned(&decap_dir(iface)) {
        Ok(from) if from.is_empty() => println!("tunnels from: any source"),
        Ok(from) => {
            let list: Vec<String> = from.iter().map(ToString::to_string).collect();
            println!("tunnels from: {}", list.join(", "));
        }
        Err(e) => println!("tunnels from: unknown ({e})"),
    }
    print_rows(
        &["counter", "packets", "bytes"],
        rows.iter()
            .map(|(n, p, b)| vec![n.clone(), p.to_string(), b.to_string()])
            .collect(),
    );
    Ok(())
}

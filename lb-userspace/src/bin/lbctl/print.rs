//! `lbctl`'s tables: each answer of `lbd` as a person reads it. `-o json`
//! prints the answer as it came instead.

use std::net::IpAddr;

use anyhow::{Result, bail};
use lb::api::{
    AnnounceStatus, NodeChange, Simulation, Stats, Status, TableInfo, VipHealth, VipInfo,
};

pub fn print_node_change(c: &NodeChange, state: &str, verb: &str) {
    let list: Vec<String> = c.addresses.iter().map(ToString::to_string).collect();
    match (c.changed, list.is_empty()) {
        (false, _) => println!("the node was already {state}"),
        (true, true) => println!("node {state}; no route to change"),
        (true, false) => println!("node {state}; {verb} {}", list.join(", ")),
    }
}

pub fn print_rows(header: &[&str], rows: Vec<Vec<String>>) {
    // One line per row: a cell's own line breaks (a multi-line error)
    // would break the table.
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.split('\n').map(str::trim).collect::<Vec<_>>().join(" / "))
                .collect()
        })
        .collect();
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

pub fn si(x: f64) -> String {
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

/// `lbd`'s version, and a warning when this `lbctl` is another build.
fn version_line(lbd: &str, lbctl: &str) -> String {
    match lbd {
        "" => "unknown (an lbd older than this lbctl)".to_string(),
        v if v == lbctl => format!("{v}, lbctl the same"),
        v => format!("{v}; this lbctl is {lbctl}: use the lbctl of the same release"),
    }
}

pub fn print_status(s: Status) -> Result<()> {
    let (h, m, sec) = (
        s.uptime_secs / 3600,
        s.uptime_secs / 60 % 60,
        s.uptime_secs % 60,
    );
    println!(
        "instance      {} (pid {}, up {h}h{m:02}m{sec:02}s)",
        s.instance, s.pid
    );
    println!(
        "version       lbd {}",
        version_line(&s.version, lb::VERSION)
    );
    let changes = if s.overrides > 0 {
        format!(
            " + {} runtime change(s) over it (`lbctl overrides list`)",
            s.overrides
        )
    } else {
        String::new()
    };
    println!("config        {}{changes}", s.config_file);
    println!("interfaces    {}", interfaces(&s));
    println!("gateway MAC   {}", gateway(&s));
    let adopted = if_set(s.maps_adopted, " (adopted at start)");
    println!("pinned maps   {}{adopted}", s.pin_dir);
    println!("VIPs          {} of {}", s.vips, s.max_vips);
    println!("backends      {} of {}", s.backends, s.max_backends);
    println!(
        "tables        M = {} by default; pool {} of {} in use; connection table {} buckets ({} flows)",
        s.table_size,
        bytes(s.table_pool_used_bytes),
        bytes(s.table_pool_bytes),
        s.ct_buckets,
        s.ct_buckets as u64 * lb_common::consts::CT_WAYS as u64
    );
    let total: u64 = s.map_bytes.iter().map(|(_, b)| b).sum();
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
    if !s.source.is_empty() && s.source != "file" {
        println!("vips from     {}", s.source);
    }
    print_revision(&s);
    for w in &s.warnings {
        println!("warning       {w}");
    }
    Ok(())
}

/// The running revision, a probation, a revert.
fn print_revision(s: &Status) {
    println!(
        "revision      {} ({}); configuration digest {}",
        s.revision, s.revision_source, s.config_digest
    );
    if let Some(p) = &s.pending_confirm {
        match &p.revert_failed {
            None => println!(
                "confirm       revision {} awaits `lbctl confirm`: {} left, then lbd reverts to {}",
                p.revision,
                duration(p.secs_left),
                p.fallback
            ),
            Some(e) => println!(
                "confirm       REVERT FAILED: revision {} was due to revert to {}: {e}; tried again in {} (`lbctl confirm` keeps it)",
                p.revision,
                p.fallback,
                duration(p.secs_left)
            ),
        }
    }
    if let Some(note) = &s.file_differs {
        println!("file          {note}");
    }
    if s.auto_reverts > 0 {
        println!("auto reverts  {} since lbd started", s.auto_reverts);
    }
}

fn if_set(flag: bool, text: &str) -> &str {
    if flag { text } else { "" }
}

/// `eth0 (native, adopted), eth1 (native)`.
fn interfaces(s: &Status) -> String {
    let list: Vec<String> = s
        .interfaces
        .iter()
        .map(|i| format!("{} ({}{})", i.name, i.mode, if_set(i.adopted, ", adopted")))
        .collect();
    list.join(", ")
}

/// The MAC, and with `gateway_mac: auto` what the watcher knows.
fn gateway(s: &Status) -> String {
    let Some(g) = &s.gateway else {
        return s.gateway_mac.clone();
    };
    let address = g.address.map(|a| format!(", gateway {a}"));
    let error = g
        .error
        .as_ref()
        .map(|e| format!("; last lookup failed: {e}"));
    format!(
        "{} (auto{}{}{})",
        s.gateway_mac,
        address.unwrap_or_default(),
        if_set(g.looking_up, "; looking it up now"),
        error.unwrap_or_default()
    )
}

/// A peer's BFD session in a few words: `Up 2m`, `Down (control detection
/// time expired)`, `-` without one.
fn bfd_cell(p: &lb::api::PeerRow) -> String {
    let Some(b) = &p.bfd else {
        return "-".into();
    };
    let since = b
        .since_secs
        .map(|s| format!(" {}", duration(s as f64)))
        .unwrap_or_default();
    let why = if b.up || b.diag == "no diagnostic" {
        String::new()
    } else {
        format!(" ({})", b.diag)
    };
    let error = b
        .error
        .as_ref()
        .map(|e| format!(" [{e}]"))
        .unwrap_or_default();
    format!("{}{since}{why}{error}", b.state)
}

/// Graceful restart and shutdown in a few words.
fn gr_cell(p: &lb::api::PeerRow) -> String {
    let mut words = Vec::new();
    if let Some(g) = &p.graceful_restart {
        words.push(
            if g.peer_supports {
                "on"
            } else {
                "peer lacks it"
            }
            .to_string(),
        );
        if g.restarting {
            words.push("restarted".into());
        }
        if g.deferring {
            words.push("holding routes for the first verdicts".into());
        } else if g.end_of_rib_sent {
            words.push("End-of-RIB sent".into());
        }
    }
    if p.graceful_shutdown {
        words.push("GRACEFUL_SHUTDOWN".into());
    }
    if words.is_empty() {
        "-".into()
    } else {
        words.join(", ")
    }
}

pub fn print_bgp(s: AnnounceStatus) -> Result<()> {
    let node = match s.node {
        lb::api::NodeState::Serving => "serving".to_string(),
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
                    if p.state == lb::api::SessionState::Established {
                        duration(p.uptime_secs as f64)
                    } else {
                        "-".into()
                    },
                    p.prefixes_announced.to_string(),
                    p.updates_sent.to_string(),
                    bfd_cell(p),
                    gr_cell(p),
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
                "bfd",
                "graceful restart",
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

pub fn print_vips(vips: Vec<VipInfo>) -> Result<()> {
    let mut rows = Vec::new();
    for mut v in vips {
        if v.second_chance {
            v.encap.push_str(", second chance");
        }
        if v.backends.is_empty() {
            rows.push(vec![
                v.vip.to_string(),
                v.encap.clone(),
                if v.conntrack { "yes" } else { "no" }.into(),
                "-".into(),
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
                flows(b.live_flows),
            ]);
        }
    }
    print_rows(
        &[
            "vip",
            "encap",
            "conntrack",
            "backend",
            "weight",
            "state",
            "live flows",
        ],
        rows,
    );
    Ok(())
}

/// A backend's live flows (`-` before the first scan).
pub fn flows(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The probes' verdict, and a hold after flapping.
fn health_word(b: &lb::api::BackendHealth) -> String {
    if b.flap_hold_secs > 0.0 {
        format!(
            "{}, held {} (flapping)",
            b.health,
            duration(b.flap_hold_secs)
        )
    } else {
        b.health.clone()
    }
}

/// Passive health over its window: `120 (3, 2%)`, and the ejection.
fn passive_word(b: &lb::api::BackendHealth) -> String {
    let Some(p) = &b.passive else {
        return "-".into();
    };
    let mut text = format!("{} ({}, {:.0}%)", p.syns, p.retransmits, p.ratio * 100.0);
    if p.ejected_secs > 0.0 {
        text.push_str(&format!(
            "; ejected #{} for {}",
            p.ejections,
            duration(p.ejected_secs)
        ));
    } else if let Some(note) = &p.note {
        text.push_str("; ");
        text.push_str(note);
    }
    text
}

fn state_name(s: lb::api::BackendState) -> &'static str {
    s.name()
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{secs:.1}s"),
    }
}

pub fn print_health(vips: Vec<VipHealth>) -> Result<()> {
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
                flows(b.live_flows),
                health_word(b),
                format!("{:.2}", b.effective_weight),
                duration(b.in_state_secs),
                last,
                latency,
                passive_word(b),
            ]);
        }
    }
    print_rows(
        &[
            "vip",
            "backend",
            "state",
            "live flows",
            "health",
            "weight now",
            "in state",
            "last probe",
            "latency",
            "syns (retransmitted)",
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

pub fn print_stats(s: Stats) -> Result<()> {
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

/// `lbctl conns`: one line per entry, then how many matched in all.
pub fn print_conns(c: &lb::api::Conns) {
    let with_client = c.rows.iter().any(|r| r.client.is_some());
    let rows = c
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![r.vip.to_string()];
            if with_client {
                row.push(r.client.map_or("-".into(), |a| a.to_string()));
            }
            row.extend([
                r.backend.to_string(),
                r.idle_secs.map_or("-".into(), |s| format!("{s:.1}s")),
                if r.confirmed { "yes" } else { "no" }.into(),
                r.class.to_string(),
                format!("{}/{}", r.bucket, r.way),
            ]);
            row
        })
        .collect();
    let mut header = vec!["vip"];
    if with_client {
        header.push("client");
    }
    header.extend(["backend", "idle", "confirmed", "class", "bucket/way"]);
    print_rows(&header, rows);
    println!(
        "{} of {} entries shown; searched {} in {:.0} ms",
        c.rows.len(),
        c.matched,
        c.searched,
        c.elapsed_ms
    );
    if !c.rows.is_empty() {
        println!(
            "(entries stay until their way is reused; idle times wrap every 16,384 ticks of 64 jiffies: 70 min at HZ=250)"
        );
    }
    for s in &c.skipped {
        println!("not searched: {s}");
    }
}

pub fn print_table(t: TableInfo) -> Result<()> {
    println!(
        "{}: M = {}, active half {}, digest {}",
        t.vip, t.table_size, t.active_half, t.digest
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

pub fn print_simulation(s: Simulation) -> Result<()> {
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
            if !s.alternates.is_empty() {
                let alts: Vec<String> = s.alternates.iter().map(IpAddr::to_string).collect();
                println!(
                    "second    {} (alternates, tried in this order)",
                    alts.join(", ")
                );
            }
        }
    }
    if s.vip.is_some() && s.backend.is_none() {
        bail!("no backend for this flow");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::version_line;

    #[test]
    fn status_says_when_lbctl_and_lbd_differ() {
        assert_eq!(
            version_line("1.2.0 (abc)", "1.2.0 (abc)"),
            "1.2.0 (abc), lbctl the same"
        );
        let other = version_line("1.2.0 (abc)", "1.3.0 (def)");
        assert!(other.contains("this lbctl is 1.3.0 (def)"), "{other}");
        assert!(version_line("", "1.3.0 (def)").starts_with("unknown"));
    }
}

//! `lbctl tier status`: this balancer's link to etcd, then every member of
//! the tier side by side (the desired revision each runs, its digest,
//! its peers, backends down), each VIP's table digest per balancer, and
//! every disagreement `lbd` found, or that they agree, and the staged
//! rollout in progress or last; `lbctl tier rollout`: its plan.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result, bail};
use lb::{
    api::{RolloutPlan, RolloutView, TierStatus},
    config::MAX_DESIRED_BYTES,
    tier::{Outcome, short_digest as short},
};

fn or_dash(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

pub fn print_tier_status(s: &TierStatus) {
    print_link(s);
    println!();
    println!(
        "{:<20} {:>8} {:>8} {:<12} {:>6} {:>5}  STATE",
        "BALANCER", "APPLIED", "REVISION", "CONFIG", "PEERS", "DOWN"
    );
    for m in &s.members {
        match &m.report {
            Some(r) => println!(
                "{:<20} {:>8} {:>8} {:<12} {:>6} {:>5}  {}",
                m.name,
                or_dash(r.applied),
                r.revision,
                short(&r.config_digest),
                r.announced.values().filter(|n| **n > 0).count().to_string()
                    + "/"
                    + &r.announced.len().to_string(),
                r.down.len() + r.down_omitted,
                if r.refused.is_some() {
                    "refused newest"
                } else if r.reverted.is_some() {
                    "reverted"
                } else {
                    "reporting"
                }
            ),
            None => println!(
                "{:<20} {:>8} {:>8} {:<12} {:>6} {:>5}  NOT REPORTING{}",
                m.name,
                "-",
                "-",
                "-",
                "-",
                "-",
                m.unreadable
                    .as_ref()
                    .map(|w| format!(" (unreadable: {w})"))
                    .unwrap_or_else(|| " (lease expired)".into())
            ),
        }
    }
    print_tables(s);
    if let Some(r) = &s.rollout {
        print_rollout(r);
    }
    println!();
    if s.flags.is_empty() {
        println!("the balancers agree");
    } else {
        println!("{} disagreement(s):", s.flags.len());
        for f in &s.flags {
            println!("  ! {f}");
        }
    }
}

/// Each VIP's table digest, one column per reporting balancer.
/// This balancer's link to etcd, what it runs and what it should know.
fn print_link(s: &TierStatus) {
    let link = if s.connected {
        format!("connected since {}", s.since)
    } else {
        format!(
            "NOT CONNECTED since {} ({}): keeping what it applied",
            s.since,
            s.error.as_deref().unwrap_or("?")
        )
    };
    println!("tier {} as {}: {link}", s.prefix, s.name);
    println!(
        "desired revision applied {}, newest seen {}",
        or_dash(s.applied),
        or_dash(s.seen)
    );
    if let Some(why) = &s.refused {
        println!("REFUSED here: {why}");
    }
    if let Some(n) = s.reverted {
        let instead = match s.candidate {
            Some(c) => format!("rollout {c}'s candidate"),
            None => format!("desired revision {}", or_dash(s.applied)),
        };
        println!(
            "REVERTED here: revision {n} runs instead of {instead}, until a desired state with other VIPs or a changed file applies"
        );
    }
    if let Some(note) = &s.note {
        println!("note: {note}");
    }
}

fn print_tables(s: &TierStatus) {
    let reports: Vec<_> = s.members.iter().filter_map(|m| m.report.as_ref()).collect();
    let vips: BTreeSet<&String> = reports.iter().flat_map(|r| r.tables.keys()).collect();
    if vips.is_empty() {
        return;
    }
    println!();
    print!("{:<28}", "VIP");
    for r in &reports {
        print!(" {:<12}", r.name);
    }
    println!();
    for vip in vips {
        print!("{vip:<28}");
        for r in &reports {
            print!(" {:<12}", r.tables.get(vip).map_or("-", |d| short(d)));
        }
        println!();
    }
}

/// The staged rollout, wave by wave.
fn print_rollout(r: &RolloutView) {
    println!();
    if let Some(why) = &r.error {
        println!(
            "rollout record at revision {}: UNREADABLE: {why}",
            r.revision
        );
        return;
    }
    let state = match (&r.outcome, r.superseded) {
        (Some(Outcome::Done), _) => "done: promoted to the desired state".to_string(),
        (Some(Outcome::Failed { by, why }), _) => format!("FAILED on {by}, reverted: {why}"),
        (Some(Outcome::Aborted { why }), _) => format!("ABORTED, reverted: {why}"),
        (None, true) => "superseded by a newer desired state".to_string(),
        (None, false) => "in progress".to_string(),
    };
    println!(
        "rollout {} ({}; hold {} s): {state}",
        r.revision, r.by, r.hold_secs
    );
    for (i, wave) in r.waves.iter().enumerate() {
        let names: Vec<String> = wave.iter().map(|(n, p)| format!("{n} {p}")).collect();
        let label = if i == 0 {
            "canary".to_string()
        } else {
            format!("wave {i}")
        };
        println!("  {label:<8} {}", names.join(", "));
    }
    if !r.step.is_empty() {
        println!("  here: {}", r.step);
    }
}

/// `lbctl tier rollout FILE`: the plan, and what the change does here.
pub fn print_rollout_plan(p: &RolloutPlan) {
    if p.aborted {
        match p.revision {
            Some(r) => {
                println!("rollout aborted (revision {r}): every balancer that took it goes back")
            }
            None => println!(
                "dry run: the rollout would be aborted; nothing written to {}/rollout",
                p.prefix
            ),
        }
        return;
    }
    match p.revision {
        Some(r) => println!("rollout {r} written to {}/rollout", p.prefix),
        None => println!("dry run: nothing written to {}/rollout", p.prefix),
    }
    for (i, wave) in p.waves.iter().enumerate() {
        let label = if i == 0 {
            "canary".to_string()
        } else {
            format!("wave {i}")
        };
        println!(
            "  {label:<8} {} (gates held {} s)",
            wave.join(", "),
            p.hold_secs
        );
    }
    if let Some(preview) = &p.preview {
        println!("\non this balancer:");
        crate::change::print_preview(preview);
    }
}

/// A desired state to roll out, read here (at most the size a balancer
/// takes).
pub fn read_desired(path: &std::path::Path) -> Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    // Read at most one byte past the limit: a pipe or a file that grows
    // has no size to check first.
    let mut bytes = Vec::new();
    file.take(MAX_DESIRED_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| path.display().to_string())?;
    if bytes.len() > MAX_DESIRED_BYTES {
        bail!(
            "{}: more than the {MAX_DESIRED_BYTES} bytes a balancer takes",
            path.display()
        );
    }
    String::from_utf8(bytes).with_context(|| format!("{}: not UTF-8", path.display()))
}

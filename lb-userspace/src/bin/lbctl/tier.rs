//! `lbctl tier status`: this balancer's link to etcd, then every member of
//! the tier side by side (the desired revision each runs, its digest,
//! its peers, backends down), each VIP's table digest per balancer, and
//! every disagreement `lbd` found, or that they agree.

use std::collections::BTreeSet;

use lb::{api::TierStatus, tier::short_digest as short};

fn or_dash(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

pub fn print_tier_status(s: &TierStatus) {
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
    if let Some(note) = &s.note {
        println!("note: {note}");
    }
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
                r.down.len(),
                if r.refused.is_some() {
                    "refused newest"
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

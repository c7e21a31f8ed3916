//! `lbctl`'s output for changes: what a change did (its revision, a
//! probation), what it would do (`diff`, `--dry-run`), and the revisions
//! (`history`).

use lb::api::{ChangePreview, Committed, OverrideRow, RevisionRow, VipChange};

use crate::print::print_rows;

/// The answer to a change: `done` says what was asked, in words.
pub fn print_committed(c: &Committed, done: &str) {
    if let Some(p) = &c.preview {
        print_preview(p);
        println!("(dry run: nothing changed)");
        return;
    }
    for w in &c.warnings {
        println!("warning: {w}");
    }
    match (&c.note, c.revision) {
        (Some(note), _) => println!("{note}"),
        (None, Some(r)) => println!("{done} (revision {r})"),
        (None, None) => println!("{done}"),
    }
    if let Some(secs) = c.confirm_within_secs {
        println!(
            "on probation: `lbctl confirm` within {} keeps it; otherwise lbd reverts it by itself",
            duration(secs)
        );
    }
}

fn duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// `lbctl diff`: what the change would do.
pub fn print_preview(p: &ChangePreview) {
    for w in &p.warnings {
        println!("warning: {w}");
    }
    if p.is_empty() {
        println!("no change (configuration digest {})", p.digest_before);
        print_shadows(&p.overrides);
        return;
    }
    println!(
        "configuration digest {} -> {}",
        p.digest_before, p.digest_after
    );
    for s in &p.settings {
        println!("setting {}: {} -> {}", s.name, s.before, s.after);
    }
    for vip in &p.vips_added {
        println!("+ VIP {vip}");
    }
    for r in &p.vips_removed {
        println!(
            "- VIP {} ({}: those connections break)",
            r.vip,
            breaking(r.flows_breaking, r.live_flows_breaking)
        );
    }
    for v in &p.vips_changed {
        print_vip_change(v);
    }
    for o in &p.overrides_dropped {
        println!(
            "! {}: the file decides again ({}); the runtime change of revision {} ({}: {}) no longer applies",
            object(o),
            o.file,
            o.revision,
            o.source,
            o.running
        );
    }
    print_shadows(&p.overrides);
}

/// `VIP` or `VIP backend ADDR`.
fn object(o: &OverrideRow) -> String {
    match o.backend {
        Some(b) => format!("VIP {} backend {b} {}", o.vip, o.field),
        None => format!("VIP {}", o.vip),
    }
}

/// The runtime changes that still shadow the file.
fn print_shadows(rows: &[OverrideRow]) {
    if rows.is_empty() {
        return;
    }
    println!("runtime changes still in force over the file (`lbctl overrides`):");
    for o in rows {
        println!(
            "  {}: file {}, running {} (revision {}, {})",
            object(o),
            o.file,
            o.running,
            o.revision,
            o.source
        );
    }
}

/// `lbctl overrides`.
pub fn print_overrides(rows: &[OverrideRow]) {
    if rows.is_empty() {
        println!("no runtime change in force: the file decides everything");
        return;
    }
    let rows = rows
        .iter()
        .map(|o| {
            vec![
                o.vip.to_string(),
                o.backend.map_or_else(|| "-".into(), |b| b.to_string()),
                o.field.clone(),
                o.file.clone(),
                o.running.clone(),
                o.revision.to_string(),
                o.time.clone(),
                o.source.clone(),
            ]
        })
        .collect();
    print_rows(
        &[
            "vip",
            "backend",
            "field",
            "file",
            "running",
            "revision",
            "time (UTC)",
            "source",
        ],
        rows,
    );
}

/// "3 live flows (11 connection-table entries)", or the entries alone
/// without a live count.
fn breaking(entries: u64, live: Option<u64>) -> String {
    match live {
        Some(live) => format!("{live} live flows ({entries} connection-table entries)"),
        None => format!("{entries} connection-table entries"),
    }
}

fn print_vip_change(v: &VipChange) {
    println!(
        "~ VIP {}: {} of {} slots move ({:.2}%), {} on backends that leave",
        v.vip,
        v.slots_moved,
        v.table_size,
        v.share_moved * 100.0,
        breaking(v.flows_breaking, v.live_flows_breaking)
    );
    for b in &v.backends_added {
        println!("    + backend {} weight {}", b.address, b.weight);
    }
    for a in &v.backends_removed {
        println!("    - backend {a}");
    }
    for r in &v.backends_reweighted {
        println!(
            "    ~ backend {} weight {} -> {}",
            r.address, r.before, r.after
        );
    }
    for s in &v.settings {
        println!("    ~ {}: {} -> {}", s.name, s.before, s.after);
    }
}

/// `lbctl history`.
pub fn print_history(rows: &[RevisionRow]) {
    let rows = rows
        .iter()
        .map(|r| {
            vec![
                format!("{}{}", r.revision, if r.running { " *" } else { "" }),
                r.time.clone(),
                r.digest.clone().unwrap_or_else(|| "-".into()),
                r.result.clone(),
                r.source.clone(),
            ]
        })
        .collect();
    print_rows(
        &["revision", "time (UTC)", "digest", "result", "source"],
        rows,
    );
}

//! Safe change: previews against independently built tables, revisions,
//! reverts, and the probation of `--confirm-within` on virtual time.

use std::{collections::BTreeMap, time::Duration};

use super::*;
use crate::{
    api::{ChangePreview, Committed, Within},
    lifecycle::WEIGHT_SCALE,
    maglev::{self, MaglevBackend, MaglevTable},
};

/// The tables of `backends` (address, configured weight) as an apply
/// builds them, by the Maglev builder alone: effective weights are the
/// configured ones scaled, members in address order.
fn table_of(backends: &[(&str, u32)]) -> Vec<Option<IpAddr>> {
    let mut members: Vec<MaglevBackend> = backends
        .iter()
        .map(|(a, w)| MaglevBackend {
            addr: ip(a),
            weight: w * WEIGHT_SCALE,
        })
        .collect();
    members.sort_by_key(|b| b.addr);
    match maglev::build(&members, 101).unwrap() {
        MaglevTable::Empty => vec![None; 101],
        MaglevTable::Slots(s) => s.iter().map(|i| Some(members[*i as usize].addr)).collect(),
    }
}

/// The published table of `WEB`, slot by slot.
fn web_table(r: &Rig) -> Vec<Option<IpAddr>> {
    r.daemon
        .reconciler
        .table_addresses(&id(WEB))
        .unwrap()
        .unwrap()
}

/// `by` later: the tick, then what the loop does after every event.
async fn later(r: &mut Rig, by: Duration) {
    tokio::time::advance(by).await;
    r.daemon.tick();
    r.daemon.settle().await;
}

/// Revision 2 (FILE with 10.1.0.2 replaced) was reverted to 1 for want
/// of a confirmation.
fn reverted_to_1(r: &Rig) {
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
    assert_eq!(
        r.daemon.revision_source,
        "automatic revert of 2 to 1: it was not confirmed in time"
    );
}

fn dry() -> ChangeOptions {
    ChangeOptions {
        dry_run: true,
        confirm_within: None,
    }
}

fn within(secs: u64) -> ChangeOptions {
    ChangeOptions {
        dry_run: false,
        confirm_within: Some(Within(Duration::from_secs(secs))),
    }
}

/// FILE with 10.1.0.2 replaced by 10.1.0.3.
fn replaced() -> String {
    FILE.replace("address: 10.1.0.2", "address: 10.1.0.3")
}

/// Puts `n` connection-table entries pointing at `addr`'s backend of WEB.
fn flows_to(r: &mut Rig, addr: &str, first_bucket: u32, n: usize) {
    stamped_flows(r, addr, first_bucket, &vec![0; n]);
}

async fn preview(r: &mut Rig, text: &str) -> ChangePreview {
    let c = r
        .daemon
        .reload(reparse(r, text), false, &dry())
        .await
        .unwrap();
    c.preview.expect("a dry run previews")
}

#[tokio::test]
async fn a_diff_counts_moved_slots_and_breaking_flows_against_built_tables() {
    let mut r = rig(FILE);
    let before = table_of(&[("10.1.0.1", 2), ("10.1.0.2", 1)]);
    assert_eq!(web_table(&r), before);
    flows_to(&mut r, "10.1.0.2", 0, 3);
    flows_to(&mut r, "10.1.0.1", 10, 2);

    let p = preview(&mut r, &replaced()).await;
    let after = table_of(&[("10.1.0.1", 2), ("10.1.0.3", 1)]);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as u32;
    assert!(moved > 0);
    assert_eq!(p.vips_changed.len(), 1, "{p:?}");
    let v = &p.vips_changed[0];
    assert_eq!((v.slots_moved, v.table_size), (moved, 101));
    assert!((v.share_moved - f64::from(moved) / 101.0).abs() < 1e-12);
    assert_eq!(v.flows_breaking, 3, "entries of the backend that leaves");
    assert_eq!(v.backends_removed, vec![ip("10.1.0.2")]);
    assert_eq!(v.backends_added[0].address, ip("10.1.0.3"));
    assert_ne!(p.digest_before, p.digest_after);
    assert!(p.vips_added.is_empty() && p.vips_removed.is_empty());

    // The dry run changed nothing; the apply publishes the previewed table.
    assert_eq!(web_table(&r), before);
    let revision = r.daemon.revision;
    r.reload_ok(&replaced()).await;
    assert_eq!(web_table(&r), after);
    assert_eq!(r.daemon.revision, revision + 1);
}

/// A diff counts the entries and the live flows of every backend that
/// leaves, summed over the VIP's backends: live against the kernel's
/// clock (younger than the window of 40 ticks).
#[tokio::test]
async fn a_diff_sums_the_live_flows_of_the_backends_that_leave() {
    let mut r = rig(FILE);
    clock_at(&mut r, 1_000);
    stamped_flows(&mut r, "10.1.0.1", 0, &[1_000, 999, 900]);
    stamped_flows(&mut r, "10.1.0.2", 10, &[995, 990, 980, 800]);
    let p = preview(&mut r, &FILE.replace("10.99.0.1", "10.99.0.2")).await;
    let gone = &p.vips_removed[0];
    assert_eq!(
        (gone.flows_breaking, gone.live_flows_breaking),
        (7, Some(5))
    );
}

/// With the hash unchanged, the slots a change moves are counted slot by
/// slot, not estimated from sampled flows (at 4,099 slots an estimate
/// from 65,536 samples is off by a few): the count is the difference of
/// the tables published before and after.
#[tokio::test]
async fn with_the_hash_unchanged_moved_slots_are_counted_exactly() {
    let big = FILE.replace("table_size: 101", "table_size: 4099");
    let mut r = rig(&big);
    let before = web_table(&r);
    let p = preview(
        &mut r,
        &big.replace("address: 10.1.0.2", "address: 10.1.0.3"),
    )
    .await;
    r.daemon
        .reload(
            reparse(&r, &big.replace("address: 10.1.0.2", "address: 10.1.0.3")),
            false,
            &plain(),
        )
        .await
        .unwrap();
    let after = web_table(&r);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as u32;
    assert_eq!(p.vips_changed[0].slots_moved, moved);
}

/// A VIP added with backends and no health check is warned about (its
/// backends count as up); one with a check, or with no backend yet, is
/// not. History shows when each revision was made.
#[tokio::test]
async fn an_unchecked_vip_with_backends_is_warned_about() {
    let mut r = rig(FILE);
    let add = |vip: &str, backends: &[&str], settings: &[(&str, &str)]| {
        Request::Vip(VipRequest::Add(VipAdd {
            vip: id(vip),
            backends: backends
                .iter()
                .map(|b| api::BackendSpec {
                    address: ip(b),
                    weight: 1,
                })
                .collect(),
            settings: VipSettings(
                settings
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        }))
    };
    let unchecked = |c: &Committed| c.warnings.iter().any(|w| w.contains("no health check"));
    let c: Committed = parse(r.ok(add("10.99.0.2:80/tcp", &["10.1.0.7"], &[])).await);
    assert!(unchecked(&c), "{:?}", c.warnings);
    let c: Committed = parse(r.ok(add("10.99.0.3:80/tcp", &[], &[])).await);
    assert!(!unchecked(&c), "no backend yet: {:?}", c.warnings);
    let checked = [("health_check", ""), ("health_check.port", "80")];
    let c: Committed = parse(r.ok(add("10.99.0.4:80/tcp", &["10.1.0.7"], &checked)).await);
    assert!(!unchecked(&c), "checked: {:?}", c.warnings);
    let rows: Vec<api::RevisionRow> = parse(r.ok(Request::History { last: 10 }).await);
    let year = views::humantime(std::time::SystemTime::now())[..4].to_string();
    assert!(
        rows.iter().all(|row| row.time.starts_with(&year)),
        "{rows:?}"
    );
}

/// The blackhole guard is for VIPs that have a usable backend to lose: a
/// VIP announced with none (its address is announced for another VIP) may
/// change without force.
#[tokio::test]
async fn a_vip_with_no_usable_backend_to_lose_changes_without_force() {
    let idle = "  - address: 10.99.0.1\n    port: 443\n    protocol: tcp\n    backends:\n      - address: 10.1.0.9\n        weight: 0\n";
    let mut r = rig(&format!("{FILE}{idle}"));
    r.ok(del_backend("10.99.0.1:443/tcp", "10.1.0.9", false))
        .await;
}

#[tokio::test]
async fn a_diff_names_vips_added_removed_and_settings() {
    let mut r = rig(FILE);
    flows_to(&mut r, "10.1.0.1", 0, 4);
    let text = FILE
        .replace("10.99.0.1", "10.99.0.2")
        .replace("table_size: 101", "table_size: 101\nmtu: 9000");
    let p = preview(&mut r, &text).await;
    assert_eq!(p.vips_added, vec![id("10.99.0.2:80/tcp")]);
    assert_eq!(p.vips_removed.len(), 1);
    assert_eq!(p.vips_removed[0].flows_breaking, 4);
    assert_eq!(p.settings.len(), 1, "{:?}", p.settings);
    assert_eq!(
        (p.settings[0].name.as_str(), p.settings[0].after.as_str()),
        ("mtu", "9000")
    );
    // Settings of a VIP, in the file's words.
    let p = preview(
        &mut r,
        &FILE.replace("protocol: tcp", "protocol: tcp\n    encap: gre"),
    )
    .await;
    let s = &p.vips_changed[0].settings;
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(
        (
            s[0].name.as_str(),
            s[0].before.as_str(),
            s[0].after.as_str()
        ),
        ("encap", "ipip", "gre")
    );
    assert_eq!(p.vips_changed[0].slots_moved, 0);
    // No change at all.
    let p = preview(&mut r, FILE).await;
    assert!(p.is_empty(), "{p:?}");
}

#[tokio::test]
async fn a_dry_run_of_an_api_change_changes_nothing() {
    let mut r = rig(FILE);
    let overlay = r.daemon.overlay.clone();
    let revision = r.daemon.revision;
    let numbers = r.daemon.revisions.numbers().unwrap();
    let answer = r
        .daemon
        .handle(del_backend(WEB, "10.1.0.2", false), dry())
        .await;
    assert!(answer.ok, "{:?}", answer.error);
    let c: Committed = parse(answer.data);
    let p = c.preview.unwrap();
    assert_eq!(p.vips_changed[0].backends_removed, vec![ip("10.1.0.2")]);
    assert_eq!(r.daemon.overlay, overlay);
    assert_eq!(r.daemon.revision, revision);
    assert_eq!(r.daemon.revisions.numbers().unwrap(), numbers);
    assert_eq!(r.in_table(WEB).len(), 2);
    // Options on a request that changes nothing are refused.
    let answer = r.daemon.handle(Request::Status, dry()).await;
    assert_eq!(
        answer.code,
        Some(ErrorKind::BadRequest),
        "{:?}",
        answer.error
    );
}

#[tokio::test]
async fn every_change_is_a_revision_that_survives_a_reopen() {
    let mut r = rig(FILE);
    r.ok(del_backend(WEB, "10.1.0.2", false)).await;
    let bad = reparse(&r, &FILE.replace("weight: 2", "weight: 99999"));
    assert!(r.daemon.reload(bad, false, &plain()).await.is_err());
    let rows: Vec<api::RevisionRow> = parse(r.ok(Request::History { last: 10 }).await);
    let summary: Vec<(u64, &str, bool)> = rows
        .iter()
        .map(|r| (r.revision, r.source.as_str(), r.running))
        .collect();
    assert_eq!(
        summary,
        vec![
            (3, "reload", false),
            (2, "api: backend del 10.99.0.1:80/tcp 10.1.0.2", true),
            (1, "start", false),
        ]
    );
    assert!(rows[0].result.starts_with("failed: "), "{}", rows[0].result);
    assert_eq!(rows[1].result, "ok");
    let status: api::Status = parse(r.ok(Request::Status).await);
    assert_eq!(status.revision, 2);
    assert_eq!(Some(&status.config_digest), rows[1].digest.as_ref());
    let reopened = RevisionStore::open(r.daemon.revisions.dir(), 50).unwrap();
    assert_eq!(reopened.numbers().unwrap(), vec![1, 2, 3]);
    assert_eq!(
        reopened.get(2).unwrap().overlay,
        Some(r.daemon.overlay.clone())
    );
}

/// Each revision's digest is that of its own configuration: a change
/// that removes a backend changes it.
#[tokio::test]
async fn a_change_changes_the_config_digest() {
    let mut r = rig(FILE);
    let before = r.daemon.running().digest();
    r.ok(del_backend(WEB, "10.1.0.2", false)).await;
    let after = r.daemon.running().digest();
    assert_ne!(before, after);
    let rows: Vec<api::RevisionRow> = parse(r.ok(Request::History { last: 10 }).await);
    let digests: Vec<Option<&str>> = rows.iter().map(|r| r.digest.as_deref()).collect();
    assert_eq!(digests, [Some(after.as_str()), Some(before.as_str())]);
}

/// A revert is the way out of a bad change: it goes on when the disk
/// refuses its record (here the state file cannot be replaced), where a
/// change would be refused, and when the revision store cannot even be
/// listed.
#[tokio::test]
async fn a_revert_goes_on_when_its_record_cannot_be_written() {
    let mut r = rig(FILE);
    r.ok(del_backend(WEB, "10.1.0.2", false)).await;
    assert_eq!(r.in_table(WEB).len(), 1);
    let state = r.daemon.config.state_file.clone();
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    let refused = r
        .refused(ErrorKind::Internal, del_backend(WEB, "10.1.0.1", true))
        .await;
    assert!(refused.contains("nothing changed"), "{refused}");
    let c: Committed = parse(
        r.ok(Request::Revert {
            revision: Some(1),
            force: false,
        })
        .await,
    );
    assert_eq!(r.in_table(WEB).len(), 2, "revision 1 runs again");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("nothing of it reached the disk")),
        "the answer says the revert is not on disk: {:?}",
        c.warnings
    );
    std::fs::remove_dir(&state).unwrap();

    // A store that cannot even be listed has no newest number to follow:
    // the revert runs as the number after the running revision.
    let running = r.daemon.revision;
    let newest = |rows: Vec<api::RevisionRow>| rows.first().map(|row| row.revision);
    let on_disk = newest(parse(r.ok(Request::History { last: 1 }).await));
    assert_ne!(
        on_disk,
        Some(running),
        "the first revert has no record either"
    );
    r.daemon.revisions.fail_listings(2);
    let c: Committed = parse(
        r.ok(Request::Revert {
            revision: Some(2),
            force: false,
        })
        .await,
    );
    assert_eq!(r.in_table(WEB).len(), 1, "revision 2 runs again");
    assert_eq!(c.revision, Some(running + 1));
    assert_eq!(r.daemon.revision, running + 1);
    assert_eq!(
        newest(parse(r.ok(Request::History { last: 1 }).await)),
        on_disk,
        "the revert's record was not written"
    );
    // The next change takes a number after the running one, not the one
    // no file has: two configurations never share a number.
    let c: Committed = parse(r.ok(weight(WEB, "10.1.0.1", 3)).await);
    assert_eq!(c.revision, Some(running + 2));
}

/// A runtime change is stamped with the revision it runs as, also when
/// the store could not be listed the first time the number was asked for
/// (then the number after the running revision, which the change then
/// takes).
#[tokio::test]
async fn a_change_is_stamped_with_its_revision_when_a_listing_fails() {
    let mut r = rig(FILE);
    r.ok(weight(WEB, "10.1.0.2", 3)).await;
    r.daemon.revisions.fail_listings(1);
    let c: Committed = parse(r.ok(weight(WEB, "10.1.0.1", 5)).await);
    assert_eq!(c.revision, Some(3));
    let rows: Vec<api::OverrideRow> =
        parse(r.ok(Request::Overrides(api::OverridesRequest::List)).await);
    let stamps: Vec<(IpAddr, u64)> = rows
        .iter()
        .map(|o| (o.backend.unwrap(), o.revision))
        .collect();
    assert_eq!(stamps, [(ip("10.1.0.1"), 3), (ip("10.1.0.2"), 2)]);
}

/// A file that changes what a runtime change changed takes it back, and
/// the answer says which, from which revision, and both values.
#[tokio::test]
async fn a_file_that_changes_an_overridden_weight_says_the_override_is_gone() {
    let mut r = rig(FILE);
    r.ok(weight(WEB, "10.1.0.1", 5)).await;
    let file = FILE.replace("weight: 2", "weight: 3");
    let c = r.reload_ok(&file).await;
    let dropped: Vec<&String> = c
        .warnings
        .iter()
        .filter(|w| w.contains("no longer applies"))
        .collect();
    assert_eq!(dropped.len(), 1, "{:?}", c.warnings);
    assert!(
        dropped[0].starts_with(
            "VIP 10.99.0.1:80/tcp backend 10.1.0.1 weight: the runtime change of revision 2"
        ) && dropped[0].ends_with(": 5) no longer applies; the file says 3"),
        "{}",
        dropped[0]
    );
}

/// A change's answer gives the rules' warnings over the VIPs as they will
/// run (`VIP …: …`); a new file adds its own (`vips[0]: …`) only where
/// they say something else, and an API change never does.
#[tokio::test]
async fn a_new_files_warnings_come_once_and_only_with_the_file() {
    let mut r = rig(FILE);
    // FILE's table is small for two backends; 10.1.0.3 added through the
    // API makes the running VIP's three.
    let said = |warnings: &[String], at: &str, n: u32| {
        let text = format!("below 100 × {n}");
        warnings
            .iter()
            .filter(|w| w.starts_with(at) && w.contains(&text))
            .count()
    };
    let c: Committed = parse(
        r.ok(Request::Backend(BackendRequest::Add {
            vip: id(WEB),
            address: ip("10.1.0.3"),
            weight: 1,
        }))
        .await,
    );
    assert_eq!(
        said(&c.warnings, "VIP 10.99.0.1:80/tcp: ", 3),
        1,
        "{:?}",
        c.warnings
    );
    assert_eq!(said(&c.warnings, "vips[0]: ", 2), 0, "{:?}", c.warnings);
    // A new file: the running VIP's warning once, and the file's own,
    // which is about two backends, beside it.
    let file = FILE.replace("weight: 2", "weight: 4");
    let c = r.reload_ok(&file).await;
    assert_eq!(
        said(&c.warnings, "VIP 10.99.0.1:80/tcp: ", 3),
        1,
        "{:?}",
        c.warnings
    );
    assert_eq!(said(&c.warnings, "vips[0]: ", 2), 1, "{:?}", c.warnings);
    // Without the API's backend, the file's warning is the running VIP's:
    // said once, by VIP.
    r.ok(del_backend(WEB, "10.1.0.3", false)).await;
    let file = FILE.replace("weight: 2", "weight: 5");
    let c = r.reload_ok(&file).await;
    let small: Vec<&String> = c
        .warnings
        .iter()
        .filter(|w| w.contains("below 100"))
        .collect();
    assert_eq!(small.len(), 1, "{:?}", c.warnings);
    assert!(small[0].starts_with("VIP 10.99.0.1:80/tcp: "), "{small:?}");
}

/// A forced change is logged as forced; its dry run is not.
#[tokio::test]
async fn a_forced_change_is_logged_and_its_dry_run_is_not() {
    let mut r = rig(FILE);
    r.ok(del_backend(WEB, "10.1.0.2", false)).await;
    logs::capture();
    let preview = r
        .daemon
        .handle(del_backend(WEB, "10.1.0.1", true), dry())
        .await;
    assert!(preview.ok, "{:?}", preview.error);
    assert_eq!(logs::lines("forced: "), Vec::<String>::new());
    r.ok(del_backend(WEB, "10.1.0.1", true)).await;
    let forced = logs::lines("forced: ");
    assert!(
        forced.len() == 1 && forced[0].contains("10.99.0.1:80/tcp"),
        "{forced:?}"
    );
}

#[tokio::test]
async fn a_revert_runs_an_earlier_revision_until_the_file_changes() {
    let mut r = rig(FILE);
    let grown = FILE.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
    );
    r.reload_ok(&grown).await;
    assert_eq!(r.in_table(WEB).len(), 3);
    let c: Committed = parse(
        r.ok(Request::Revert {
            revision: None,
            force: false,
        })
        .await,
    );
    assert_eq!(c.revision, Some(3));
    assert_eq!(r.in_table(WEB).len(), 2, "revision 1 again");
    let status: api::Status = parse(r.ok(Request::Status).await);
    assert_eq!(status.revision_source, "revert to 1");
    assert!(status.file_differs.unwrap().contains("revision 3"));

    // The file did not change: a reload keeps the revert.
    let c = r.reload_ok(&grown).await;
    assert!(c.note.unwrap().contains("unchanged"));
    assert_eq!(c.revision, Some(3), "names the revision that keeps running");
    assert_eq!(r.in_table(WEB).len(), 2);
    // Nor does --force undo it (scripts that always force).
    let forced = r
        .daemon
        .reload(reparse(&r, &grown), true, &plain())
        .await
        .unwrap();
    assert!(forced.note.unwrap().contains("unchanged"));
    assert_eq!(r.in_table(WEB).len(), 2);
    // A changed file applies.
    let edited = grown.replace("weight: 2", "weight: 3");
    r.reload_ok(&edited).await;
    assert_eq!(r.in_table(WEB).len(), 3);
    let status: api::Status = parse(r.ok(Request::Status).await);
    assert!(status.file_differs.is_none());
    // Reverting by number; a number that does not exist is named.
    r.ok(Request::Revert {
        revision: Some(2),
        force: false,
    })
    .await;
    assert_eq!(r.daemon.revision_source, "revert to 2");
    let e = r
        .refused(
            ErrorKind::NotFound,
            Request::Revert {
                revision: Some(99),
                force: false,
            },
        )
        .await;
    assert!(e.contains("99"), "the refusal names the revision: {e}");
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_change_is_reverted_when_its_window_ends() {
    let mut r = rig(FILE);
    let c = r
        .daemon
        .reload(reparse(&r, &replaced()), false, &within(3))
        .await
        .unwrap();
    assert_eq!(c.confirm_within_secs, Some(3.0));
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
    let status: api::Status = parse(r.ok(Request::Status).await);
    let pending = status.pending_confirm.unwrap();
    assert_eq!((pending.revision, pending.fallback), (2, 1));
    // Another change must wait for the confirmation.
    r.refused(ErrorKind::Conflict, del_backend(WEB, "10.1.0.3", false))
        .await;

    later(&mut r, Duration::from_secs(2)).await;
    assert!(r.daemon.confirm.is_some(), "still inside the window");
    later(&mut r, Duration::from_secs(2)).await;
    assert!(r.daemon.confirm.is_none());
    assert_eq!(r.daemon.auto_reverts, 1);
    reverted_to_1(&r);
}

/// An automatic revert that fails (here its fallback revision is gone
/// from the disk) does not end the probation: the unconfirmed change
/// must not become permanent in silence. The status says the revert
/// failed, and it is tried again, with the reason it was due for.
#[tokio::test(start_paused = true)]
async fn a_failed_automatic_revert_keeps_the_probation_and_tries_again() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(3))
        .await
        .unwrap();
    let fallback = r.daemon.revisions.dir().join(format!("{:08}.json", 1));
    let kept = std::fs::read(&fallback).unwrap();
    std::fs::remove_file(&fallback).unwrap();
    later(&mut r, Duration::from_secs(4)).await;
    assert_eq!(r.daemon.auto_reverts, 0);
    let status: api::Status = parse(r.ok(Request::Status).await);
    let pending = status.pending_confirm.expect("still on probation");
    assert_eq!((pending.revision, pending.fallback), (2, 1));
    assert!(
        pending
            .revert_failed
            .as_deref()
            .is_some_and(|e| e.contains('1')),
        "{pending:?}"
    );
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")), "revision 2 runs");
    // The revision is back: the next try reverts.
    std::fs::write(&fallback, kept).unwrap();
    later(&mut r, REVERT_RETRY).await;
    assert_eq!(r.daemon.auto_reverts, 1);
    assert!(r.daemon.confirm.is_none());
    reverted_to_1(&r);
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_change_stays() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(3))
        .await
        .unwrap();
    let c: Committed = parse(r.ok(Request::Confirm).await);
    assert_eq!(c.revision, Some(2));
    later(&mut r, Duration::from_secs(10)).await;
    assert_eq!(r.daemon.auto_reverts, 0);
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
    r.refused(ErrorKind::Conflict, Request::Confirm).await;
}

#[tokio::test(start_paused = true)]
async fn a_change_that_costs_an_announcement_is_reverted_before_the_routers_hear() {
    let mut r = rig(FILE);
    let vip = ip("10.99.0.1");
    let told_before = r.told.lock().unwrap().len();
    let empty = FILE.replace("weight: 2", "weight: 0").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
    );
    r.daemon
        .reload(reparse(&r, &empty), true, &within(60))
        .await
        .unwrap();
    r.daemon.settle().await;
    assert_eq!(r.daemon.auto_reverts, 1);
    assert_eq!(r.in_table(WEB).len(), 2);
    let told = r.told.lock().unwrap();
    assert!(
        told[told_before..].iter().all(|set| set.contains(&vip)),
        "the announcers never lost {vip}: {told:?}"
    );
    assert!(r.daemon.revision_source.contains("lose its announcement"));
}

#[tokio::test(start_paused = true)]
async fn a_revert_ends_a_probation() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(30))
        .await
        .unwrap();
    r.ok(Request::Revert {
        revision: None,
        force: false,
    })
    .await;
    assert!(r.daemon.confirm.is_none());
    later(&mut r, Duration::from_secs(60)).await;
    assert_eq!(r.daemon.auto_reverts, 0);
    let weights: BTreeMap<IpAddr, u32> = r.daemon.effective()[0]
        .backends
        .iter()
        .map(|b| (b.address, b.weight))
        .collect();
    assert_eq!(
        weights,
        BTreeMap::from([(ip("10.1.0.1"), 2), (ip("10.1.0.2"), 1)])
    );
}

#[tokio::test]
async fn a_changed_table_size_is_previewed_and_applied_only_when_forced() {
    let mut r = rig(FILE);
    let before = web_table(&r);
    let text = FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    table_size: 1009\n",
    );
    // The preview (`lbctl diff`, which forces): the setting, and nearly
    // every flow moving (2 backends: about half of them land on the other).
    let p = r
        .daemon
        .reload(reparse(&r, &text), true, &dry())
        .await
        .unwrap()
        .preview
        .expect("a dry run previews");
    let v = &p.vips_changed[0];
    assert_eq!(v.table_size, 1009);
    assert!((0.3..0.7).contains(&v.share_moved), "{v:?}");
    assert_eq!(
        (v.settings[0].name.as_str(), v.settings[0].after.as_str()),
        ("table_size", "1009")
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("table_size 101 -> 1009 remaps")),
        "{:?}",
        p.warnings
    );
    // A plain reload (and so SIGHUP) refuses it and keeps the running table.
    let e = r.reload_refused(&text, "refused without --force").await;
    assert_eq!(e.kind(), ErrorKind::NeedsForce, "{e}");
    assert!(
        e.to_string()
            .contains("VIP 10.99.0.1:80/tcp: table_size 101 -> 1009"),
        "names the VIP and the sizes: {e}"
    );
    assert!(e.to_string().contains("lbctl reload --force"), "{e}");
    assert_eq!(web_table(&r), before);
    // Forced: the VIP gets a 1009-slot table in a region of its size.
    let c = r
        .daemon
        .reload(reparse(&r, &text), true, &plain())
        .await
        .unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("remaps")), "{c:?}");
    let state = &r.daemon.reconciler.vips()[&id(WEB)];
    let table = r.daemon.reconciler.live_table(&id(WEB)).unwrap().unwrap();
    assert_eq!((state.table_size, table.len()), (1009, 1009));
    assert_eq!(state.meta.table_size(), 1009);
    // Back to the default size: refused again, unless forced.
    assert!(
        r.daemon
            .reload(reparse(&r, FILE), false, &plain())
            .await
            .is_err()
    );
}

/// The automatic revert is forced: a change that itself needed --force
/// (a table size) and was not confirmed goes back although going back
/// changes the table size again.
#[tokio::test(start_paused = true)]
async fn an_unconfirmed_forced_change_is_reverted_although_the_revert_needs_force() {
    let mut r = rig(FILE);
    let before = web_table(&r);
    let text = FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    table_size: 1009\n",
    );
    r.daemon
        .reload(reparse(&r, &text), true, &within(2))
        .await
        .unwrap();
    assert_eq!(web_table(&r).len(), 1009);
    later(&mut r, Duration::from_secs(3)).await;
    assert!(r.daemon.confirm.is_none());
    assert_eq!(r.daemon.auto_reverts, 1, "the revert ran");
    assert_eq!(web_table(&r), before, "the table is the one before");
}

#[tokio::test(start_paused = true)]
async fn a_probation_survives_a_restart_and_reverts_at_its_deadline() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(8))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    // The file on disk is the changed one, as after `lbctl reload`.
    let mut r = restart(r);
    let pending = r.daemon.confirm.clone().expect("the probation resumed");
    assert_eq!((pending.revision, pending.fallback), (2, 1));
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
    later(&mut r, Duration::from_secs(4)).await;
    assert!(r.daemon.confirm.is_some(), "time is left");
    later(&mut r, Duration::from_secs(4)).await;
    assert!(r.daemon.confirm.is_none());
    assert_eq!(r.daemon.auto_reverts, 1);
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
    // Reverted: nothing left to resume.
    let r = restart(r);
    assert!(r.daemon.confirm.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_probation_whose_deadline_passed_while_lbd_was_down_reverts_at_once() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(8))
        .await
        .unwrap();
    let mut saved = r.daemon.revisions.probation().unwrap().expect("saved");
    saved.deadline -= 60;
    r.daemon.revisions.save_probation(Some(&saved)).unwrap();
    let mut r = restart(r);
    assert!(r.daemon.revert_due.is_some(), "due at once");
    r.daemon.settle().await;
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
    assert!(
        r.daemon
            .revision_source
            .contains("the deadline passed while lbd was not running"),
        "{}",
        r.daemon.revision_source
    );
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_change_leaves_no_probation_behind() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(8))
        .await
        .unwrap();
    r.ok(Request::Confirm).await;
    assert!(r.daemon.revisions.probation().unwrap().is_none());
    let r = restart(r);
    assert!(r.daemon.confirm.is_none());
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
}

/// A VIP the change left alone that loses its backends during the window
/// is not the change's doing: it is withdrawn, and the probation goes on
/// (before, any lost announcement reverted the change).
#[tokio::test(start_paused = true)]
async fn a_vip_the_change_left_alone_losing_its_backends_does_not_revert_it() {
    const DB: &str = "10.99.0.2:5432/tcp";
    let db = "  - address: 10.99.0.2\n    port: 5432\n    protocol: tcp\n    health_check: { interval: 1s, timeout: 500ms, rise: 1, fall: 1 }\n    backends:\n      - address: 10.1.0.9\n";
    let mut r = rig(&format!("{FILE}{db}"));
    let probed = |ok| crate::ProbeResult {
        ok,
        latency_us: 100,
        detail: "x".into(),
    };
    r.daemon.on_probe((id(DB), ip("10.1.0.9")), probed(true));
    let both = BTreeSet::from([ip("10.99.0.1"), ip("10.99.0.2")]);
    assert_eq!(r.announced(), both);
    // The change adds a backend to WEB: its own warnings change too
    // (table_size against 3 backends), and they are no setting.
    let three = FILE.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
    );
    let changed = format!("{three}{db}");
    r.daemon
        .reload(reparse(&r, &changed), false, &within(30))
        .await
        .unwrap();
    r.daemon.on_probe((id(DB), ip("10.1.0.9")), probed(false));
    r.daemon.settle().await;
    assert_eq!(r.daemon.revert_due, None);
    assert!(r.daemon.confirm.is_some(), "still on probation");
    assert_eq!(r.daemon.auto_reverts, 0);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
}

/// A node drained during a probation withdraws every VIP: the
/// operator's wish, not the change's doing, so the probation goes on.
#[tokio::test(start_paused = true)]
async fn a_node_drained_during_a_probation_does_not_revert_the_change() {
    let mut r = rig(FILE);
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(30))
        .await
        .unwrap();
    r.ok(Request::Node(NodeRequest::Drain { no_wait: true }))
        .await;
    assert!(r.announced().is_empty());
    r.daemon.settle().await;
    assert_eq!(r.daemon.revert_due, None);
    assert!(r.daemon.confirm.is_some(), "still on probation");
    assert_eq!(r.daemon.auto_reverts, 0);
    assert!(r.in_table(WEB).contains(&ip("10.1.0.3")));
}

/// A reload of the file as it runs makes no revision and says so, with
/// the file's warnings still; a confirmation names what it confirmed.
#[tokio::test(start_paused = true)]
async fn a_reload_of_the_running_file_says_nothing_changed_and_still_warns() {
    let mut r = rig(FILE);
    let revision = r.daemon.revision;
    let c = r.reload_ok(FILE).await;
    assert_eq!(c.revision, Some(revision));
    assert_eq!(c.note.as_deref(), Some("nothing changed"));
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("table_size 101 is below 100 × 2")),
        "{:?}",
        c.warnings
    );
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(30))
        .await
        .unwrap();
    let c: Committed = parse(r.ok(Request::Confirm).await);
    let confirmed = format!("revision {} confirmed", revision + 1);
    assert_eq!(c.note.as_deref(), Some(confirmed.as_str()));
}

/// A drain goes on through a restart of `lbd` from when it began (the
/// state file's origin), not from the restart: the drain that began a
/// minute ago is as old after the restart, so its `drain_timeout` is not
/// started again. (A minute: the monotonic clock cannot go back past the
/// boot, and a CI machine may be new.)
#[tokio::test]
async fn a_drain_keeps_its_start_through_a_restart() {
    let mut r = rig(FILE);
    r.ok(r.drain(WEB, "10.1.0.2", false)).await;
    let since = |r: &Rig| {
        r.daemon.lifecycle.vips[&id(WEB)].backends[&ip("10.1.0.2")]
            .drained_since
            .expect("draining")
            .elapsed()
    };
    assert!(since(&r) < Duration::from_secs(10));
    // The drain began a minute ago, as the state file now says.
    let path = r.daemon.config.state_file.clone();
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let origin = &mut state["origins"]["drained"][WEB]["10.1.0.2"]["time"];
    let began = origin.as_u64().expect("the drain's origin time") - 60;
    *origin = began.into();
    std::fs::write(&path, serde_json::to_string(&state).unwrap()).unwrap();
    let r = restart_with_state(r);
    let age = since(&r);
    assert!(
        age >= Duration::from_secs(59) && age < Duration::from_secs(120),
        "{age:?}"
    );
}

/// A dry run during a probation says that the change, made now, would be
/// refused (it needs --confirm-within too); it still shows the change (a
/// diff during a probation works).
#[tokio::test(start_paused = true)]
async fn a_dry_run_during_a_probation_says_the_change_would_be_refused() {
    const SAID: &str = "this change would be refused unless made with --confirm-within";
    let mut r = rig(FILE);
    let c = r
        .daemon
        .reload(reparse(&r, &replaced()), false, &dry())
        .await
        .unwrap();
    let warnings = c.preview.expect("a preview").warnings;
    assert!(!warnings.iter().any(|w| w.contains(SAID)), "{warnings:?}");
    r.daemon
        .reload(reparse(&r, &replaced()), false, &within(30))
        .await
        .unwrap();
    let c = r
        .daemon
        .reload(reparse(&r, FILE), false, &dry())
        .await
        .unwrap();
    let preview = c.preview.expect("a preview");
    assert!(
        preview.warnings.iter().any(|w| w.contains(SAID)),
        "{:?}",
        preview.warnings
    );
}

/// A change that costs an announcement and whose revert fails (its
/// fallback is gone from the disk): the revert is tried again at its
/// deadline, not at every announce, and meanwhile the routes follow the
/// change that runs (the VIP it emptied is withdrawn).
#[tokio::test(start_paused = true)]
async fn a_failed_revert_of_a_lost_announcement_waits_for_its_retry() {
    let mut r = rig(FILE);
    logs::capture();
    let attempts = || logs::lines("reverting revision 2 to 1").len();
    let vip = ip("10.99.0.1");
    let empty = FILE.replace("weight: 2", "weight: 0").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
    );
    std::fs::remove_file(r.daemon.revisions.dir().join(format!("{:08}.json", 1))).unwrap();
    r.daemon
        .reload(reparse(&r, &empty), true, &within(60))
        .await
        .unwrap();
    r.daemon.settle().await;
    assert_eq!(r.daemon.auto_reverts, 0);
    let failed = |r: &Rig| {
        r.daemon
            .confirm
            .as_ref()
            .is_some_and(|p| p.revert_failed.is_some())
    };
    assert!(failed(&r), "the probation stays, its revert failed");
    assert_eq!(attempts(), 1);
    for _ in 0..5 {
        later(&mut r, Duration::from_secs(1)).await;
    }
    assert_eq!(attempts(), 1, "no attempt before the retry's deadline");
    assert!(
        !r.announced().contains(&vip),
        "the routes follow the change that runs"
    );
    later(&mut r, REVERT_RETRY).await;
    assert!(failed(&r), "tried again, failed again");
    assert_eq!(attempts(), 2, "once more at the deadline");
}

/// A drain whose `drain_timeout` ran out before a restart is over after
/// it: drained, its connection-table entries not honoured, and no cut
/// said again (nor a drain that never ends).
#[tokio::test]
async fn a_drain_past_its_timeout_before_a_restart_is_drained_after_it() {
    let text = FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    drain_timeout: 5s\n",
    );
    let mut r = rig(&text);
    r.ok(r.drain(WEB, "10.1.0.2", false)).await;
    let path = r.daemon.config.state_file.clone();
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let origin = &mut state["origins"]["drained"][WEB]["10.1.0.2"]["time"];
    *origin = (origin.as_u64().unwrap() - 20).into();
    std::fs::write(&path, serde_json::to_string(&state).unwrap()).unwrap();
    logs::capture();
    let r = restart_with_state(r);
    let b = &r.daemon.lifecycle.vips[&id(WEB)].backends[&ip("10.1.0.2")];
    assert_eq!(b.state, crate::lifecycle::BackendState::Drained);
    let health = r.daemon.health();
    let row = health[0]
        .backends
        .iter()
        .find(|h| h.address == ip("10.1.0.2"))
        .expect("a row");
    assert_eq!(row.state, api::BackendState::Drained, "{row:?}");
    assert_eq!(logs::lines("cut").len(), 0, "{:?}", logs::lines("cut"));
}

/// A revert that brings back a drain an undrain had ended starts it
/// again, on disk too: a restart counts its `drain_timeout` from the
/// revert, not from the drain the revision first recorded.
#[tokio::test]
async fn a_drain_a_revert_brings_back_begins_at_the_revert() {
    let mut r = rig(FILE);
    let c: Committed = parse(r.ok(r.drain(WEB, "10.1.0.2", false)).await);
    let drained_at = c.revision.expect("a revision");
    // The drain's revision says it began long ago.
    let file = r
        .daemon
        .revisions
        .dir()
        .join(format!("{drained_at:08}.json"));
    let mut revision: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    revision["overlay"]["origins"]["drained"][WEB]["10.1.0.2"]["time"] = 1_000_000.into();
    std::fs::write(&file, serde_json::to_string(&revision).unwrap()).unwrap();
    r.ok(Request::Backend(BackendRequest::Undrain {
        vip: id(WEB),
        address: ip("10.1.0.2"),
    }))
    .await;
    r.ok(Request::Revert {
        revision: Some(drained_at),
        force: false,
    })
    .await;
    let began = r.daemon.overlay.drain_times()[&(id(WEB), ip("10.1.0.2"))];
    assert!(began > 1_000_000, "the drain begins at the revert: {began}");
    let r = restart_with_state(r);
    let since = r.daemon.lifecycle.vips[&id(WEB)].backends[&ip("10.1.0.2")]
        .drained_since
        .expect("draining");
    assert!(since.elapsed() < Duration::from_secs(10));
}

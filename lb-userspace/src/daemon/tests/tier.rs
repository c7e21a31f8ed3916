//! A desired state from etcd, as the daemon takes it: applied through
//! the reload path as a revision named after the etcd revision, reported;
//! one older than the one running (etcd restored) or the same again is
//! not applied; a refused one leaves what runs and is said.

use super::*;
use crate::tier::Desired;

/// A balancer of a tier: its file lists no VIPs.
pub(super) const TIER_FILE: &str = r#"
instance: unit
interfaces: [eth0]
gateway_mac: "02:00:00:00:00:01"
outer_source_v4: 10.0.0.2
table_size: 101
conntrack_buckets: 1024
source:
  etcd:
    endpoints: [http://127.0.0.1:2379]
    prefix: /lb/t1
"#;

pub(super) const VIPS: &str = "vips:\n  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.1.0.1\n      - address: 10.1.0.2\n";

pub(super) fn desired(revision: i64, text: &str) -> Desired {
    Desired {
        revision,
        text: text.into(),
        rollout: false,
    }
}

/// What the loop does with a new desired state: the file composed with
/// it, reloaded, the outcome told.
pub(super) async fn apply(r: &mut Rig, d: &Desired) -> bool {
    if !r.daemon.tier_should_apply(d.revision) {
        return false;
    }
    let read = reparse(r, TIER_FILE).and_then(|f| f.with_desired(d));
    let result = r.daemon.reload(read, false, &plain()).await;
    r.daemon.tier_outcome(
        d.revision,
        result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
    );
    true
}

#[tokio::test]
async fn a_desired_state_applies_as_a_revision_named_after_etcds() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, VIPS)).await);
    assert_eq!(r.in_table(WEB).len(), 2);
    let history: Vec<api::RevisionRow> = parse(r.ok(Request::History { last: 100 }).await);
    let running = history
        .iter()
        .find(|h| h.running)
        .expect("a running revision");
    assert_eq!(running.source, "etcd /lb/t1/desired@5");
    let report = r.daemon.tier_report().unwrap();
    assert_eq!((report.name.as_str(), report.applied), ("lb1", Some(5)));
    assert!(report.tables.contains_key(WEB), "{report:?}");
    let status: api::Status = parse(r.ok(Request::Status).await);
    assert!(
        status.source.contains("desired revision 5 applied"),
        "{}",
        status.source
    );

    // The same revision again (a reconnection), or an older one (etcd
    // restored from a backup): nothing is applied; the older is said.
    assert!(!apply(&mut r, &desired(5, VIPS)).await);
    assert!(!apply(&mut r, &desired(3, "vips: []\n")).await);
    assert_eq!(r.in_table(WEB).len(), 2);
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert!(tier.note.unwrap().contains("behind the 5"));
    assert_eq!(tier.applied, Some(5));
}

#[tokio::test]
async fn a_refused_desired_state_leaves_what_runs_and_is_reported() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, VIPS)).await);
    // Every backend gone from an announced VIP: the blackhole guard.
    let empty = VIPS.replace("      - address: 10.1.0.1\n      - address: 10.1.0.2\n", "");
    let empty = empty.replace("    backends:\n", "    backends: []\n");
    assert!(apply(&mut r, &desired(6, &empty)).await);
    assert_eq!(r.in_table(WEB).len(), 2, "the running state stays");
    let report = r.daemon.tier_report().unwrap();
    assert_eq!((report.applied, report.seen), (Some(5), Some(6)));
    assert!(report.refused.is_some(), "{report:?}");
    // Refused changes in the report show in everyone's tier status.
    let flags = crate::tier::compare(&[crate::tier::Member {
        name: "lb1".into(),
        report: Some(report),
        unreadable: None,
    }]);
    assert!(
        flags[0].starts_with("lb1: refused desired revision 6"),
        "{flags:?}"
    );
    // A later good one applies.
    assert!(apply(&mut r, &desired(7, VIPS)).await);
    assert_eq!(r.daemon.tier_report().unwrap().refused, None);
}

/// etcd restored from a snapshot (which keeps the snapshot's revision)
/// or replaced by a new cluster: its history restarts below the revision
/// applied. What it holds then is not applied, and the next write is,
/// though its number is lower; a rollout's compare-and-swap counts from
/// the new history.
#[tokio::test]
async fn after_etcd_went_back_the_next_write_applies() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), Some((5000, false)));
    assert!(!apply(&mut r, &desired(5000, VIPS)).await, "what runs");
    assert!(!apply(&mut r, &desired(300, "vips: []\n")).await);
    assert!(
        !apply(&mut r, &desired(300, "vips: []\n")).await,
        "a reconnection"
    );
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert!(tier.note.unwrap().contains("behind the 5000"));
    assert_eq!((tier.applied, tier.seen), (Some(5000), Some(300)));

    assert!(apply(&mut r, &desired(301, VIPS)).await, "a write after it");
    assert_eq!(r.in_table(WEB).len(), 2);
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert_eq!(
        (tier.applied, tier.seen, tier.note),
        (Some(301), Some(301), None)
    );
    assert!(!apply(&mut r, &desired(300, VIPS)).await, "older again");

    // Restored to before the key was written: absent, then written.
    r.daemon.tier_desired_absent(40);
    let one = VIPS.replace("      - address: 10.1.0.2\n", "");
    assert!(apply(&mut r, &desired(41, &one)).await);
    assert_eq!(r.daemon.tier_applied(), Some(41));
}

/// The edges of a history gone back: the first write after it may land
/// on the applied revision's own number; a restored desired state that
/// cannot be read marks it too; the old history's refusal is over.
#[tokio::test]
async fn etcd_gone_back_at_its_edges() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), Some((50, false)));
    r.daemon.tier_unreadable(60, "not YAML".into());
    assert!(r.daemon.tier_refused(60));
    assert!(!apply(&mut r, &desired(45, VIPS)).await, "gone back");
    let tier = r.daemon.tier_status().unwrap();
    assert_eq!(
        (tier.seen, tier.refused),
        (Some(45), None),
        "the old refusal is over"
    );
    assert!(
        apply(&mut r, &desired(50, VIPS)).await,
        "a write after it, at 50"
    );
    assert_eq!(r.daemon.tier_applied(), Some(50));

    // Restored to an unreadable state: the next readable write applies.
    r.daemon.tier_unreadable(30, "not YAML".into());
    assert!(apply(&mut r, &desired(31, VIPS)).await);
    assert_eq!(r.daemon.tier_applied(), Some(31));
}

/// What the tier's status says is so: etcd gone since it went, not
/// since the last failed retry; after a restart, the revision running in
/// the metrics too; a rollout's candidate named as one.
#[tokio::test]
async fn the_tiers_status_says_what_is() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), Some((42, false)));
    assert_eq!(r.daemon.metrics.tier_applied.get(), 42);
    assert_eq!(r.daemon.metrics.tier_seen.get(), 42);
    assert!(r.daemon.tier_line().contains("desired revision 42 applied"));

    r.daemon.on_tier_link(Err("connection refused".into()));
    let gone = r.daemon.tier_status().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    r.daemon.on_tier_link(Err("timed out".into()));
    let still = r.daemon.tier_status().unwrap();
    assert_eq!(still.since, gone.since, "gone since it went");
    assert_eq!(
        still.error.as_deref(),
        Some("timed out"),
        "the newest reason"
    );
    r.daemon.on_tier_link(Ok(50));
    assert_ne!(r.daemon.tier_status().unwrap().since, gone.since);

    r.daemon.tier.candidate = Some(60);
    let line = r.daemon.tier_line();
    assert!(line.contains("rollout 60's candidate running"), "{line}");
}

/// `lbctl revert` on a tier member runs an earlier revision instead of
/// the desired state: the report, the status line, `lbctl tier status`
/// and the members' comparison say so (also with a runtime change on
/// top), until a desired state with other VIPs applies; a reload of the
/// unchanged file keeps the revert. A revert to what the desired state
/// composes to is no revert of the tier's. (A restart that keeps the
/// revert is in `tests/e2e/tier.rs`: it needs `lbd`'s own start.)
#[tokio::test]
async fn a_revert_on_a_member_is_reported_until_a_desired_state_applies() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, VIPS)).await);
    let five = r.daemon.revision;
    let three = format!("{VIPS}      - address: 10.1.0.3\n");
    assert!(apply(&mut r, &desired(6, &three)).await);
    let six = r.daemon.revision;
    assert_eq!(r.daemon.tier_report().unwrap().reverted, None);
    r.ok(Request::Revert {
        revision: Some(five),
        force: false,
    })
    .await;
    assert_eq!(r.in_table(WEB).len(), 2, "revision {five} runs again");
    let says = |r: &mut Rig| {
        let running = r.daemon.revision;
        let report = r.daemon.tier_report().unwrap();
        assert_eq!((report.applied, report.reverted), (Some(6), Some(running)));
        let line = r.daemon.tier_line();
        assert!(
            line.contains(&format!("revision {running} running, from a revert here")),
            "{line}"
        );
        let flags = crate::tier::compare(&[crate::tier::Member {
            name: "lb1".into(),
            report: Some(report),
            unreadable: None,
        }]);
        assert!(
            flags.iter().any(|f| f.starts_with(&format!(
                "lb1: runs its revision {running}, from a revert there, instead of desired revision 6"
            ))),
            "{flags:?}"
        );
    };
    says(&mut r);
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert_eq!(tier.reverted, Some(r.daemon.revision));
    // The unchanged file reloaded: the revert holds.
    let read = reparse(&r, TIER_FILE).and_then(|f| f.with_desired(&desired(6, &three)));
    r.daemon.reload(read, false, &plain()).await.unwrap();
    says(&mut r);
    // A runtime change on top: the revert's VIPs still run.
    r.ok(r.drain(WEB, "10.1.0.2", false)).await;
    says(&mut r);
    // Back to the desired state's own revision: no revert of the tier's.
    r.ok(Request::Revert {
        revision: Some(six),
        force: false,
    })
    .await;
    assert_eq!(r.daemon.tier_report().unwrap().reverted, None);
    assert!(r.daemon.tier_line().contains("desired revision 6 applied"));
    // Reverted again; a newer desired state applies over it.
    r.ok(Request::Revert {
        revision: Some(five),
        force: false,
    })
    .await;
    says(&mut r);
    assert!(apply(&mut r, &desired(7, VIPS)).await);
    let report = r.daemon.tier_report().unwrap();
    assert_eq!((report.applied, report.reverted), (Some(7), None));
    assert!(r.daemon.tier_line().contains("desired revision 7 applied"));
}

#[tokio::test]
async fn without_a_tier_there_is_no_tier_status() {
    let mut r = rig(FILE);
    let why = r
        .refused(ErrorKind::NotFound, Request::Tier(api::TierRequest::Status))
        .await;
    assert!(why.contains("from its file"), "{why}");
    assert!(r.daemon.tier_report().is_none());
}

#[tokio::test]
async fn a_balancer_restarted_on_a_candidate_keeps_it_until_a_newer_desired_state() {
    let mut r = rig(TIER_FILE);
    // The newest revision ran rollout 9's candidate.
    r.daemon.tier_started("lb1".into(), Some((9, true)));
    // The tier's desired state is older: the rollout decides, not this.
    assert!(!r.daemon.tier_should_apply(7));
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert_eq!((tier.candidate, tier.applied), (Some(9), Some(7)));
    assert_eq!(tier.note, None, "not etcd behind: a rollout in progress");
    let report = r.daemon.tier_report().unwrap();
    assert_eq!(report.candidate, Some(9));
    let flags = crate::tier::compare(&[crate::tier::Member {
        name: "lb1".into(),
        report: Some(report),
        unreadable: None,
    }]);
    assert!(
        flags
            .iter()
            .any(|f| f == "lb1: runs the candidate of rollout 9"),
        "{flags:?}"
    );
    // Promoted (or superseded): a newer desired state applies, and the
    // candidate is over.
    assert!(apply(&mut r, &desired(12, VIPS)).await);
    let tier: api::TierStatus = parse(r.ok(Request::Tier(api::TierRequest::Status)).await);
    assert_eq!((tier.candidate, tier.applied), (None, Some(12)));
}

/// What the etcd task reports that is not a desired state to apply: one
/// that cannot be read is refused and seen, a deleted key is noted; the
/// revision applied is the one the last good outcome named; a desired
/// state older than the candidate a balancer holds leaves it to the
/// rollout, one as new as it does not.
#[tokio::test]
async fn unreadable_and_absent_desired_states_are_reported() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, VIPS)).await);
    assert_eq!(r.daemon.tier_applied(), Some(5));
    r.daemon.tier_unreadable(6, "larger than 1 MiB".into());
    let report = r.daemon.tier_report().unwrap();
    assert_eq!((report.applied, report.seen), (Some(5), Some(6)));
    assert_eq!(report.refused.as_deref(), Some("larger than 1 MiB"));
    assert!(r.daemon.tier_refused(6) && !r.daemon.tier_refused(5));
    // Going back to 5 (a rollout's revert) leaves 6's refusal standing.
    r.daemon.tier_outcome(5, Ok(()));
    assert!(r.daemon.tier_refused(6));
    assert_eq!(r.daemon.metrics.tier_refused.get(), 1);
    r.daemon.tier_desired_absent(7);
    let note = r.daemon.tier_status().unwrap().note;
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains("no desired state")),
        "{note:?}"
    );
    r.daemon.tier.candidate = Some(9);
    assert!(!r.daemon.tier_should_apply(8), "older than the candidate");
    assert!(r.daemon.tier_should_apply(9), "as new as the candidate");
}

/// Which revisions were refused, and whether `--force` overrides the
/// refusal: a newer one read but not yet judged is not refused, one
/// refused before it stays so (helper-35: "refused" meant "the newest
/// seen, with a refusal on record", so `lbctl reload --force` could force
/// a state nobody had judged, and a revert took a refused one for new),
/// and one applied ends every refusal up to it.
#[tokio::test]
async fn refusals_are_kept_by_revision_with_whether_force_overrides_them() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), Some((5, false)));
    assert!(r.daemon.tier_should_apply(7));
    r.daemon.tier_outcome(7, Err("needs --force".into()));
    assert!(r.daemon.tier_refused(7) && !r.daemon.tier_refused_forceable(7));
    r.daemon.tier_refusal_forceable(7);
    assert!(r.daemon.tier_refused_forceable(7));
    assert!(r.daemon.tier_should_apply(8));
    assert!(!r.daemon.tier_refused(8), "read, not judged");
    assert!(r.daemon.tier_refused(7), "still refused");
    r.daemon.tier_unreadable(9, "not YAML".into());
    assert!(r.daemon.tier_refused(9) && !r.daemon.tier_refused_forceable(9));
    assert!(r.daemon.tier_refused(7));
    r.daemon.tier_outcome(8, Ok(()));
    assert!(!r.daemon.tier_refused(7), "over once a later one applied");
    assert!(r.daemon.tier_refused(9), "a newer refusal stands");
}

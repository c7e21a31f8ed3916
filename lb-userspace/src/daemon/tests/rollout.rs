//! A staged rollout as one balancer takes part in it: the steps
//! `rollout_tick` asks of the loop (apply, pass, fail, promote) for a
//! rollout record, the gates that judge the hold (the plan's tables,
//! packets forwarded), what `lbctl tier status` shows and when `lbctl
//! tier rollout` may start another. etcd itself is in `tests/e2e/tier.rs`.

use super::{
    super::rollout::{Step, change, cut, marked, nominal_tables},
    tier::{TIER_FILE, VIPS, apply, desired},
    *,
};
use std::collections::BTreeMap;

use crate::tier::{
    Desired, Member,
    client::Write,
    rollout::{Action, Change, Outcome, Phase, Progress, Rollout},
};

/// The rollout's revision, its hold (seconds), and when it starts.
const ID: i64 = 8;
const HOLD: u64 = 30;
const T0: u64 = 1_000;

/// The rollout's candidate: [`VIPS`] with a third backend.
fn candidate() -> Desired {
    Desired {
        revision: ID,
        text: format!("{VIPS}      - address: 10.1.0.3\n").into(),
        rollout: true,
    }
}

/// A rollout of [`candidate`] in one wave, lb1 alone, with the tables
/// its plan computes.
fn record(r: &Rig) -> Rollout {
    let (_, config) = crate::tier::with_vips(&r.daemon.text, &candidate(), "test".into())
        .expect("the candidate composes");
    Rollout {
        desired: candidate().text.to_string(),
        waves: vec![vec!["lb1".into()]],
        hold_secs: HOLD,
        expected: nominal_tables(&config),
        by: "test".into(),
        revision: None,
        outcome: None,
    }
}

/// lb1 of a tier, running desired revision 5, connected to etcd.
async fn member() -> Rig {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, VIPS)).await);
    r.daemon.on_tier_link(Ok(10));
    r
}

/// The loop's part of an apply step: the file composed with the
/// candidate and reloaded, the outcome told to the rollout.
async fn take(r: &mut Rig, d: &Desired, now: u64) -> Vec<Step> {
    let old = r.daemon.config.clone();
    let read = reparse(r, TIER_FILE).and_then(|f| f.with_desired(d));
    let result = r.daemon.reload(read, false, &plain()).await;
    let explained = change(&old, &r.daemon.config);
    let outcome = result.map(|_| explained).map_err(|e| e.to_string());
    r.daemon.rollout_applied(d.revision, outcome, now)
}

/// The tick at `now` asks for exactly one step, an apply: its candidate.
fn asked_to_apply(r: &mut Rig, now: u64) -> Desired {
    let steps = r.daemon.rollout_tick(now);
    let [Step::Apply(d)] = &steps[..] else {
        panic!("an apply step, not {steps:?}")
    };
    d.clone()
}

/// The first tick of the rollout asks to apply the candidate; the loop
/// does.
async fn applied(r: &mut Rig, now: u64) {
    let d = asked_to_apply(r, now);
    assert_eq!(d, candidate());
    assert!(r.daemon.rollout_tick(now).is_empty(), "busy applying");
    assert!(take(r, &d, now).await.is_empty());
    assert_eq!(r.in_table(WEB).len(), 3, "the candidate runs");
}

/// Each step in a word.
fn said(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Step::Write(Write::Progress(p)) => format!("progress {} {:?}", p.rollout, p.phase),
            Step::Write(Write::Rollout { record, .. }) => format!("mark {:?}", record.outcome),
            Step::Write(Write::Promote { .. }) => "promote".into(),
            Step::Apply(d) => format!("apply {}", d.revision),
            Step::Revert { id, say } => format!("revert {id} {say}"),
        })
        .collect()
}

/// The first step marks rollout 8 failed here, saying each of `says`.
fn assert_failed(steps: &[String], says: &[&str]) {
    let failed = steps
        .first()
        .is_some_and(|s| s.starts_with("progress 8 Failed") && says.iter().all(|w| s.contains(w)));
    assert!(failed, "{steps:?}");
}

/// The datapath has forwarded `forwarded` packets and passed `passed` so
/// far; the daemon's tick samples them.
fn counted(r: &mut Rig, forwarded: u64, passed: u64) {
    use lb_common::counters::Counter;
    let counters = &mut r.daemon.reconciler.dataplane_mut().counters;
    counters[Counter::FwdMaglev as usize].packets = forwarded;
    counters[Counter::PassNotVip as usize].packets = passed;
    r.daemon.tick();
}

#[tokio::test]
async fn a_member_applies_holds_passes_and_promotes_the_candidate() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    r.daemon.on_tier_link(Err("connection refused".into()));
    assert!(r.daemon.rollout_tick(T0).is_empty(), "no step without etcd");
    r.daemon.on_tier_link(Ok(11));
    applied(&mut r, T0).await;
    assert!(r.daemon.rollout_tick(T0 + 4).is_empty());
    let view = r.daemon.rollout_view().expect("a rollout");
    assert_eq!(view.revision, ID);
    assert!(view.step.contains("holding, 4 s of 30 s"), "{}", view.step);
    // The hold is over, the gates held (nothing forwarded before or
    // since: no traffic to lose).
    assert_eq!(
        said(&r.daemon.rollout_tick(T0 + HOLD)),
        ["progress 8 Passed"]
    );
    assert!(
        r.daemon.rollout_tick(T0 + HOLD + 1).is_empty(),
        "a write is asked once, not every second"
    );
    // A tick that only waits (a clock read a second early: the hold is
    // not over) is not an action: the write after it is still the one
    // asked a moment ago.
    assert!(r.daemon.rollout_tick(T0 + HOLD - 1).is_empty());
    assert!(r.daemon.rollout_view().unwrap().step.contains("holding"));
    assert!(
        r.daemon.rollout_tick(T0 + HOLD + 1).is_empty(),
        "a wait between does not make the same write new"
    );
    let passed = Progress {
        rollout: ID,
        phase: Phase::Passed,
    };
    r.daemon
        .on_rollout_progress(BTreeMap::from([("lb1".to_string(), passed)]));
    assert_eq!(said(&r.daemon.rollout_tick(T0 + HOLD + 2)), ["promote"]);
    let view = r.daemon.rollout_view().expect("a rollout");
    assert_eq!(view.waves, [[("lb1".to_string(), "passed".to_string())]]);
}

#[tokio::test]
async fn a_table_other_than_the_plans_fails_the_gate_and_reverts_the_tier() {
    let mut r = member().await;
    let mut record = record(&r);
    let want = record
        .expected
        .get_mut(WEB)
        .expect("the plan has the table");
    want.digest = "0".repeat(want.digest.len());
    r.daemon.on_rollout(Some(Ok((record, ID))));
    applied(&mut r, T0).await;
    let steps = said(&r.daemon.rollout_tick(T0 + 1));
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert!(
        steps[0].starts_with("progress 8 Failed") && steps[0].contains("the plan computed"),
        "{steps:?}"
    );
    assert!(steps[1].starts_with("mark Some(Failed"), "{steps:?}");
    assert_eq!(steps[2], "revert 8 false");
}

/// [`member`], forwarding in the seconds before `T0`, given the rollout.
async fn forwarding_member() -> Rig {
    let mut r = member().await;
    counted(&mut r, 100, 0);
    assert!(r.daemon.rollout_tick(T0 - 1).is_empty(), "no rollout yet");
    counted(&mut r, 200, 0);
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    r
}

/// Forwarding before the candidate and none during the hold fails it;
/// packets the datapath passed or dropped are not forwarding.
#[tokio::test]
async fn a_member_that_stops_forwarding_during_the_hold_fails_it() {
    let mut r = forwarding_member().await;
    applied(&mut r, T0).await;
    for t in 1..HOLD {
        counted(&mut r, 200, t * 10);
        assert!(r.daemon.rollout_tick(T0 + t).is_empty());
    }
    let steps = said(&r.daemon.rollout_tick(T0 + HOLD));
    assert!(
        steps[0].contains("no packet forwarded during the hold"),
        "{steps:?}"
    );
}

/// The snapshot the gates compare with is the one taken for the rollout
/// that was applied: when another rollout's candidate is applied instead
/// (the record moved on while an apply was asked), a fresh one is taken.
/// Here the stale one was taken while forwarding, the fresh one after
/// the traffic had stopped: only the stale one would ask for forwarding
/// during the hold.
#[tokio::test]
async fn the_hold_compares_with_a_snapshot_of_its_own_rollout() {
    let mut r = forwarding_member().await;
    assert_eq!(asked_to_apply(&mut r, T0).revision, ID);
    // Eleven seconds without a packet (and no step: busy applying).
    for t in 1..=11 {
        counted(&mut r, 200, 0);
        assert!(r.daemon.rollout_tick(T0 + t).is_empty());
    }
    let next = ID + 1;
    r.daemon.on_rollout(Some(Ok((record(&r), next))));
    let d = Desired {
        revision: next,
        ..candidate()
    };
    assert!(take(&mut r, &d, T0 + 11).await.is_empty());
    assert_eq!(
        said(&r.daemon.rollout_tick(T0 + 11 + HOLD)),
        [format!("progress {next} Passed")]
    );
}

/// Forwarding is judged over the last 10 samples (seconds) before the
/// candidate: traffic that stopped `quiet` ticks before it was applied.
async fn hold_after_quiet(quiet: u64) -> Vec<String> {
    let mut r = member().await;
    counted(&mut r, 100, 0);
    assert!(r.daemon.rollout_tick(T0 - quiet - 1).is_empty());
    for t in 0..quiet {
        counted(&mut r, 200, 0);
        assert!(r.daemon.rollout_tick(T0 - quiet + t).is_empty());
    }
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    said(&r.daemon.rollout_tick(T0 + HOLD))
}

/// A balancer that forwarded in the 10 s before the candidate must
/// forward during the hold; one whose traffic stopped before that (the
/// routers moved it away, say) is not asked to.
#[tokio::test]
async fn the_forwarding_gate_looks_back_ten_seconds() {
    // The apply's own tick is the 10th sample: 100, then 200 nine times.
    let steps = hold_after_quiet(8).await;
    assert!(
        steps[0].contains("no packet forwarded during the hold"),
        "{steps:?}"
    );
    assert_eq!(hold_after_quiet(9).await, ["progress 8 Passed"]);
}

/// The gates compare with the state taken just before the candidate was
/// applied: packets forwarded while it was being applied were forwarded
/// since.
#[tokio::test]
async fn the_hold_is_judged_against_the_state_before_the_apply() {
    let mut r = member().await;
    counted(&mut r, 100, 0);
    assert!(r.daemon.rollout_tick(T0 - 1).is_empty());
    counted(&mut r, 200, 0);
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    let d = asked_to_apply(&mut r, T0);
    // The reload takes a while; the datapath forwards meanwhile.
    counted(&mut r, 300, 0);
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty(), "busy applying");
    assert!(take(&mut r, &d, T0 + 2).await.is_empty());
    for t in 3..HOLD + 2 {
        counted(&mut r, 300, 0);
        assert!(r.daemon.rollout_tick(T0 + t).is_empty());
    }
    assert_eq!(
        said(&r.daemon.rollout_tick(T0 + 2 + HOLD)),
        ["progress 8 Passed"]
    );
}

/// A balancer restarted while it held the candidate holds it again, from
/// the start.
#[tokio::test]
async fn a_member_restarted_on_the_candidate_holds_it_again() {
    let mut r = rig(TIER_FILE);
    // A hold kept for an earlier rollout: not this one's.
    let stale = crate::revisions::SavedHold {
        rollout: ID - 1,
        candidate: crate::digest::text(&candidate().text),
        before: crate::tier::rollout::Snapshot {
            announced: BTreeMap::from([("192.0.2.1".into(), 1)]),
            ..Default::default()
        },
        change: Change::default(),
        before_desired: None,
    };
    r.daemon.revisions.save_hold(Some(&stale)).unwrap();
    r.daemon.tier_started("lb1".into(), Some((ID, true)));
    r.daemon.on_tier_link(Ok(10));
    assert!(
        r.daemon.rollout_tick(T0 - 1).is_empty(),
        "the record not read yet: its absence says nothing"
    );
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    assert!(r.daemon.rollout_tick(T0 - 1).is_empty());
    // The progress not read yet: this balancer may have passed already.
    // (The hold starts at T0: one second held at T0 + 1.)
    r.daemon.on_rollout_progress(BTreeMap::new());
    assert!(r.daemon.rollout_tick(T0).is_empty());
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty());
    let view = r.daemon.rollout_view().expect("a rollout");
    assert!(view.step.contains("holding, 1 s of 30 s"), "{}", view.step);
    assert_eq!(
        r.daemon.revisions.hold().unwrap(),
        Some(stale),
        "a state taken with the candidate running is not kept as the state before it"
    );
    assert_eq!(
        said(&r.daemon.rollout_tick(T0 + HOLD)),
        ["progress 8 Passed"]
    );
}

/// A hold kept for another candidate under the rollout's id: etcd's
/// history went back, and this record is another rollout than the one
/// whose candidate runs here. It is not held (it would pass a candidate
/// that never ran here): the balancer goes back to the desired state.
#[tokio::test]
async fn a_candidate_kept_under_the_same_id_by_another_history_is_reverted() {
    let mut r = rig(TIER_FILE);
    let other = crate::revisions::SavedHold {
        rollout: ID,
        candidate: crate::digest::text("another history's candidate"),
        before: Default::default(),
        change: Change::default(),
        before_desired: None,
    };
    r.daemon.revisions.save_hold(Some(&other)).unwrap();
    r.daemon.tier_started("lb1".into(), Some((ID, true)));
    r.daemon.on_tier_link(Ok(10));
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    r.daemon.on_rollout_progress(BTreeMap::new());
    assert_eq!(said(&r.daemon.rollout_tick(T0)), ["revert 8 false"]);
}

/// What ran before the candidate is kept with the hold, for a revert
/// after a restart (helper-32: it was kept in memory only, and a restarted
/// balancer that had refused the tier's newest reverted to it, was
/// refused, and kept the failed candidate); only for that rollout, and
/// only beside a hold.
#[tokio::test]
async fn what_ran_before_the_candidate_outlives_a_restart() {
    let r = rig(TIER_FILE);
    r.daemon.keep_before_candidate(5, "vips: []\n");
    assert_eq!(r.daemon.revisions.hold().unwrap(), None, "no hold: nothing");
    let hold = crate::revisions::SavedHold {
        rollout: ID,
        candidate: crate::digest::text(&candidate().text),
        before: Default::default(),
        change: Change::default(),
        before_desired: None,
    };
    r.daemon.revisions.save_hold(Some(&hold)).unwrap();
    r.daemon.keep_before_candidate(5, "vips: []\n");
    assert_eq!(
        r.daemon.kept_before_candidate(ID),
        Some((5, "vips: []\n".to_string()))
    );
    assert_eq!(r.daemon.kept_before_candidate(ID + 1), None);
}

/// The backends the candidate adds must serve by the end of the hold:
/// one drained meanwhile does not; one whose checks pass does.
#[tokio::test]
async fn an_added_backend_must_serve_by_the_end_of_the_hold() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    r.ok(r.drain(WEB, "10.1.0.3", false)).await;
    let steps = said(&r.daemon.rollout_tick(T0 + HOLD));
    assert!(
        steps[0].contains("10.99.0.1:80/tcp 10.1.0.3: added by the change, not serving"),
        "{steps:?}"
    );
    assert!(
        !steps[0].contains("the plan computed"),
        "a VIP with a backend drained is not judged by the nominal table: {steps:?}"
    );
}

/// A runtime change here (`lbctl backend weight`), made before the
/// rollout or during its hold, gives the VIP a table other than the
/// plan's, which the desired state alone computes. That is not the
/// candidate's doing: the VIP's table is not judged, and the hold passes.
#[tokio::test]
async fn a_runtime_change_here_is_not_judged_by_the_plans_table() {
    for during in [false, true] {
        let mut r = member().await;
        assert_eq!(r.daemon.unjudged(), None, "nothing changed here yet");
        if !during {
            r.ok(weight(WEB, "10.1.0.1", 3)).await;
            let note = r.daemon.unjudged().expect("a VIP not compared");
            assert!(
                note.contains("give 10.99.0.1:80/tcp a table of its own"),
                "{note}"
            );
        }
        r.daemon.on_rollout(Some(Ok((record(&r), ID))));
        applied(&mut r, T0).await;
        if during {
            r.ok(weight(WEB, "10.1.0.2", 3)).await;
        }
        assert_eq!(
            said(&r.daemon.rollout_tick(T0 + HOLD)),
            ["progress 8 Passed"],
            "weight changed during the hold: {during}"
        );
    }
}

/// A candidate no record judges any more (the record deleted, or
/// replaced by another rollout's) goes back to the tier's desired state,
/// unless a newer desired state took over. (Before the record is first
/// read, its absence says nothing: `a_member_restarted_on_the_candidate_
/// holds_it_again`.)
#[tokio::test]
async fn a_candidate_whose_record_is_gone_goes_back() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    r.daemon.on_rollout(None);
    assert_eq!(said(&r.daemon.rollout_tick(T0 + 2)), ["revert 8 false"]);

    // Replaced by another rollout's record: the same.
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    let other = record(&r);
    r.daemon.on_rollout(Some(Ok((other, ID + 5))));
    assert_eq!(said(&r.daemon.rollout_tick(T0 + 1)), ["revert 8 false"]);

    // A newer desired state decides instead.
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    assert!(r.daemon.tier_should_apply(ID + 1), "seen, to be applied");
    r.daemon.on_rollout(None);
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty());
}

/// A candidate read while a newer desired state came is not applied:
/// nothing is written, the record is not marked, and the rollout shows
/// as superseded.
#[tokio::test]
async fn a_candidate_superseded_while_read_writes_nothing() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    asked_to_apply(&mut r, T0);
    assert!(r.daemon.tier_should_apply(ID + 1));
    r.daemon.rollout_superseded(ID);
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty());
    let view = r.daemon.rollout_view().expect("a rollout");
    assert!(view.superseded && view.outcome.is_none(), "{view:?}");
    assert_eq!(r.in_table(WEB).len(), 2, "the candidate did not run");
    // No longer busy: a later rollout is taken part in.
    r.daemon.on_rollout(Some(Ok((record(&r), ID + 5))));
    assert_eq!(asked_to_apply(&mut r, T0 + 2).revision, ID + 5);
}

#[tokio::test]
async fn an_added_backend_that_passes_its_checks_serves() {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, &checked(VIPS))).await);
    r.daemon.on_tier_link(Ok(10));
    r.daemon.on_rollout(Some(Ok((checked_record(&r), ID))));
    let d = asked_to_apply(&mut r, T0);
    assert!(take(&mut r, &d, T0).await.is_empty());
    for b in ["10.1.0.1", "10.1.0.2", "10.1.0.3"] {
        r.daemon.on_probe((id(WEB), ip(b)), probed_as(true, 100));
    }
    assert_eq!(
        said(&r.daemon.rollout_tick(T0 + HOLD)),
        ["progress 8 Passed"]
    );
}

/// lb1 of a tier whose TCP VIP is health-checked, its two backends up,
/// holding the candidate (its third backend up too) since `T0`.
async fn holding_checked_member() -> Rig {
    let mut r = rig(TIER_FILE);
    r.daemon.tier_started("lb1".into(), None);
    assert!(apply(&mut r, &desired(5, &checked(VIPS))).await);
    r.daemon.on_tier_link(Ok(10));
    both_up(&mut r, 100);
    r.daemon.on_rollout(Some(Ok((checked_record(&r), ID))));
    let d = asked_to_apply(&mut r, T0);
    assert!(take(&mut r, &d, T0).await.is_empty());
    r.daemon
        .on_probe((id(WEB), ip("10.1.0.3")), probed_as(true, 100));
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty(), "holding");
    r
}

/// etcd away during the hold: nothing is written, but the gates are
/// judged on. A backend down and up again while etcd was away fails the
/// hold when etcd answers, though the hold's time is long over.
#[tokio::test]
async fn a_gate_that_broke_while_etcd_was_away_fails_the_hold() {
    let mut r = holding_checked_member().await;
    r.daemon.on_tier_link(Err("connection refused".into()));
    let one = (id(WEB), ip("10.1.0.1"));
    for _ in 0..2 {
        r.daemon.on_probe(one, probed_as(false, 100));
    }
    assert!(r.daemon.rollout_tick(T0 + 5).is_empty(), "nothing written");
    r.daemon.on_probe(one, probed_as(true, 100));
    assert!(r.daemon.rollout_tick(T0 + 6).is_empty());
    let step = r.daemon.rollout_view().unwrap().step;
    assert!(
        step.contains("holding, 1 s of 30 s; etcd away")
            && step.contains("; etcd away: nothing is written until it answers, and the hold fails then: a gate broke: ")
            && step.contains("10.1.0.1"),
        "{step}"
    );
    r.daemon.on_tier_link(Ok(11));
    let steps = said(&r.daemon.rollout_tick(T0 + HOLD + 10));
    assert_failed(&steps, &["10.1.0.1", "while etcd was away"]);
}

/// A hold's clock stands still while etcd is away: seconds nobody could
/// have written a failure in do not count, and a reconnection does not
/// start the hold over.
#[tokio::test]
async fn a_hold_passes_only_after_a_whole_hold_with_etcd_there() {
    let mut r = holding_checked_member().await;
    assert!(r.daemon.rollout_tick(T0 + 5).is_empty());
    r.daemon.on_tier_link(Err("connection refused".into()));
    assert!(r.daemon.rollout_tick(T0 + 6).is_empty(), "away from here");
    let back = T0 + HOLD + 10;
    assert!(r.daemon.rollout_tick(back).is_empty());
    let step = r.daemon.rollout_view().unwrap().step;
    assert!(
        step.ends_with("holding, 5 s of 30 s; etcd away: nothing is written until it answers, and the hold's clock stands"),
        "said once, the seconds held before etcd went: {step}"
    );
    r.daemon.on_tier_link(Ok(11));
    // Held 6 s (the clock stops at the first tick away), none while
    // away: 6 s held at back + 1.
    assert!(r.daemon.rollout_tick(back + 1).is_empty(), "holding on");
    let step = r.daemon.rollout_view().unwrap().step;
    assert!(step.contains("holding, 6 s of 30 s"), "{step}");
    assert!(r.daemon.rollout_tick(back + HOLD - 6).is_empty());
    assert_eq!(
        said(&r.daemon.rollout_tick(back + HOLD - 5)),
        ["progress 8 Passed"]
    );
}

/// [`holding_checked_member`], its kept hold (`hold.json`) edited.
async fn holding_with_kept(edit: impl FnOnce(&mut crate::revisions::SavedHold)) -> Rig {
    let r = holding_checked_member().await;
    let mut kept = r
        .daemon
        .revisions
        .hold()
        .unwrap()
        .expect("the hold is kept");
    edit(&mut kept);
    r.daemon.revisions.save_hold(Some(&kept)).unwrap();
    r
}

/// `r`'s `lbd` killed and started again while the candidate `d` runs:
/// it starts from its newest revision (the candidate's, with the probe
/// verdicts kept on disk) and knows that it runs a candidate.
async fn restarted_on(r: Rig, d: &Desired) -> Rig {
    started_on(restart(r), d).await
}

/// A restarted `lbd` `r` on its newest revision, the candidate `d`.
async fn started_on(mut r: Rig, d: &Desired) -> Rig {
    let read = reparse(&r, TIER_FILE).and_then(|f| f.with_desired(d));
    r.daemon.reload(read, false, &plain()).await.unwrap();
    r.daemon
        .tier_started("lb1".into(), Some((d.revision, true)));
    r.daemon.on_tier_link(Ok(12));
    r.daemon.on_rollout_progress(BTreeMap::new());
    r
}

/// [`record`] of [`checked_candidate`].
fn checked_record(r: &Rig) -> Rollout {
    let mut record = record(r);
    record.desired = checked(&record.desired);
    record
}

/// [`candidate`] with WEB health-checked, as [`holding_checked_member`]
/// holds it.
fn checked_candidate() -> Desired {
    Desired {
        text: checked(&candidate().text).into(),
        ..candidate()
    }
}

/// The candidate broke a backend, and `lbd` restarted before the hold
/// judged it: the restarted `lbd` finds the backend down (its kept
/// verdict) and judges the hold against the state before the candidate,
/// kept on disk, not against the state the restart found.
#[tokio::test]
async fn a_hold_taken_up_after_a_restart_is_judged_against_the_state_before_the_candidate() {
    let mut r = holding_checked_member().await;
    let one = (id(WEB), ip("10.1.0.1"));
    for _ in 0..2 {
        r.daemon.on_probe(one, probed_as(false, 100));
    }
    let record = Some(Ok((checked_record(&r), ID)));
    let mut r = restarted_on(r, &checked_candidate()).await;
    r.daemon.on_rollout(record);
    assert!(r.daemon.rollout_tick(T0 + 10).is_empty(), "held again");
    let steps = said(&r.daemon.rollout_tick(T0 + 11));
    assert_failed(&steps, &["10.1.0.1: stopped serving after the change"]);
    // Gone back: nothing is kept to hold after another restart.
    assert!(r.daemon.revisions.hold().unwrap().is_some());
    assert!(r.daemon.rollout_reverted(ID, false, true).is_empty());
    assert_eq!(r.daemon.revisions.hold().unwrap(), None);
}

/// After a restart the BGP sessions start over: a hold taken up again
/// waits for the peers' routes before its clock runs, and judges them
/// after at most a minute.
#[tokio::test]
async fn a_hold_taken_up_after_a_restart_waits_a_minute_at_most_for_the_routes() {
    let r = holding_with_kept(|kept| {
        assert_eq!(kept.rollout, ID);
        kept.before.announced.insert("192.0.2.1".into(), 1);
    })
    .await;
    let record = Some(Ok((checked_record(&r), ID)));
    let mut r = restarted_on(r, &checked_candidate()).await;
    r.daemon.on_rollout(record);
    let taken_up = T0 + 10;
    for t in 0..60 {
        let steps = said(&r.daemon.rollout_tick(taken_up + t));
        assert!(steps.is_empty(), "at {t} s: {steps:?}");
    }
    let step = r.daemon.rollout_view().unwrap().step;
    assert!(
        step.contains("waiting for the peers' routes after a restart, 59 s"),
        "{step}"
    );
    let steps = said(&r.daemon.rollout_tick(taken_up + 60));
    assert_failed(&steps, &["peer 192.0.2.1: 0 routes, 1 before the change"]);
}

/// While etcd is away a balancer with no hold running says so without a
/// clock: its wave has not started, and nothing stands still.
#[tokio::test]
async fn a_balancer_waiting_for_its_wave_says_etcd_is_away_without_a_clock() {
    let mut r = member().await;
    let mut record = record(&r);
    record.waves = vec![vec!["lb0".into()], vec!["lb1".into()]];
    r.daemon.on_rollout(Some(Ok((record, ID))));
    assert!(r.daemon.rollout_tick(T0).is_empty());
    let waiting = r.daemon.rollout_view().unwrap().step;
    assert!(!waiting.is_empty());
    r.daemon.on_tier_link(Err("connection refused".into()));
    assert!(r.daemon.rollout_tick(T0 + 1).is_empty());
    let step = r.daemon.rollout_view().unwrap().step;
    assert_eq!(
        step,
        format!("{waiting}; etcd away: nothing is written until it answers")
    );
}

/// The hold is kept when the candidate is asked for, before its revision
/// runs (a restart in between judges against the state before it), and
/// forgotten if the candidate is refused.
#[tokio::test]
async fn the_hold_is_kept_before_the_candidate_runs_and_forgotten_if_refused() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    let d = asked_to_apply(&mut r, T0);
    let kept = r.daemon.revisions.hold().unwrap().expect("kept at the ask");
    assert_eq!(
        (kept.rollout, kept.candidate.as_str()),
        (ID, crate::digest::text(&d.text).as_str())
    );
    assert!(kept.before.serving.contains("10.99.0.1:80/tcp 10.1.0.1"));
    assert!(kept.change.added.is_empty(), "not known before the apply");
    assert!(take(&mut r, &d, T0).await.is_empty());
    let kept = r.daemon.revisions.hold().unwrap().expect("kept");
    assert!(kept.change.added.contains("10.99.0.1:80/tcp 10.1.0.3"));
    // Another rollout whose candidate is refused here.
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    asked_to_apply(&mut r, T0);
    r.daemon.rollout_applied(ID, Err("refused".into()), T0 + 1);
    assert_eq!(r.daemon.revisions.hold().unwrap(), None);
}

/// A hold taken up after a restart counts packets forwarded from the
/// restart on: counters that started over (a reboot) do not pass for
/// traffic.
#[tokio::test]
async fn a_hold_taken_up_after_a_restart_counts_packets_from_then() {
    let r = holding_with_kept(|kept| {
        (kept.before.forwarding, kept.before.forwarded) = (true, 300);
    })
    .await;
    let record = Some(Ok((checked_record(&r), ID)));
    // Fresh maps: the counters start at 0, and nothing is forwarded.
    let mut r = restarted_on(r, &checked_candidate()).await;
    r.daemon.on_rollout(record);
    for t in 0..HOLD {
        assert!(r.daemon.rollout_tick(T0 + 10 + t).is_empty());
    }
    let steps = said(&r.daemon.rollout_tick(T0 + 10 + HOLD));
    assert_failed(&steps, &["no packet forwarded during the hold"]);
}

/// The wait for routes after a restart outlasts a router's hold timer and
/// `lbd`'s longest connect retry.
#[tokio::test]
async fn the_wait_for_routes_follows_the_bgp_timers() {
    let mut r = rig(TIER_FILE);
    assert_eq!(r.daemon.routes_grace(), 60, "without BGP: a minute");
    let bgp = |hold: u64, retry: u64| -> crate::config::announce::bgp::BgpConfig {
        serde_yaml::from_str(&format!(
            "local_as: 65001\nrouter_id: 10.0.0.11\nhold_time: {hold}s\nconnect_retry: {{ initial: 1s, max: {retry}s }}\npeers: []\n"
        ))
        .unwrap()
    };
    r.daemon.config.announce.bgp = Some(bgp(9, 30));
    assert_eq!(r.daemon.routes_grace(), 60);
    r.daemon.config.announce.bgp = Some(bgp(90, 30));
    assert_eq!(r.daemon.routes_grace(), 130);
}

/// An announcer whose one peer has as many routes as `routes` says.
struct Routes(Arc<std::sync::atomic::AtomicUsize>);

impl Announcer for Routes {
    fn set_announced(&mut self, _: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        let mut peer = PeerStatus::new("192.0.2.1:179", crate::announce::SessionState::Established);
        peer.prefixes_announced = self.0.load(std::sync::atomic::Ordering::Relaxed);
        vec![peer]
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A hold taken up after a restart starts its clock when the peer has
/// its routes again, and passes a whole hold later; without the kept
/// state a hold is judged against the state after the restart.
#[tokio::test]
async fn a_hold_taken_up_after_a_restart_starts_when_the_routes_are_back() {
    let r = holding_with_kept(|kept| {
        kept.before.announced.insert("192.0.2.1:179".into(), 1);
    })
    .await;
    let record = Some(Ok((checked_record(&r), ID)));
    let Rig { daemon, _dir, .. } = r;
    let text = daemon.text.to_string();
    drop(daemon);
    let routes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peer = routes.clone();
    let announcers = Announcers::new(Box::new(move |_| {
        Ok(vec![Box::new(Routes(peer.clone())) as Box<dyn Announcer>])
    }));
    let r = rig_in(_dir, &text, Told::default(), announcers);
    let mut r = started_on(r, &checked_candidate()).await;
    r.daemon.on_rollout(record);
    for t in 0..5 {
        assert!(r.daemon.rollout_tick(T0 + 10 + t).is_empty());
    }
    routes.store(1, std::sync::atomic::Ordering::Relaxed);
    // The clock runs from the last second without them.
    let back = T0 + 15;
    assert!(r.daemon.rollout_tick(back).is_empty());
    assert!(r.daemon.rollout_tick(back + HOLD - 2).is_empty());
    let step = r.daemon.rollout_view().unwrap().step;
    assert!(step.contains("holding, 29 s of 30 s"), "{step}");
    assert_eq!(
        said(&r.daemon.rollout_tick(back + HOLD - 1)),
        ["progress 8 Passed"]
    );
}

/// [`member`], the tier's one member as it reports itself (so a plan
/// has a wave).
async fn reporting_member() -> Rig {
    let mut r = member().await;
    let report = r.daemon.tier_report().expect("a tier member reports");
    r.daemon.on_tier_members(vec![Member {
        name: "lb1".into(),
        report: Some(report),
        unreadable: None,
    }]);
    r
}

#[tokio::test]
async fn a_rollout_in_progress_refuses_another_until_a_desired_state_supersedes_it() {
    let mut r = reporting_member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    let e = r.daemon.rollout_plan(VIPS, None, 1, HOLD).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(!r.daemon.rollout_view().expect("a rollout").superseded);
    // The tier's desired state at the rollout's own revision does not
    // supersede it; a newer one does.
    assert!(r.daemon.tier_should_apply(ID));
    assert!(!r.daemon.rollout_view().expect("a rollout").superseded);
    assert!(r.daemon.tier_should_apply(ID + 1));
    assert!(r.daemon.rollout_view().expect("a rollout").superseded);
    let (plan, ..) = r
        .daemon
        .rollout_plan(VIPS, None, 1, HOLD)
        .expect("a superseded rollout may be replaced");
    assert_eq!(plan.waves, [["lb1"]]);
    // So may a record that cannot be read; the view says why.
    r.daemon
        .on_rollout(Some(Err((ID + 2, "not a rollout record".into()))));
    let view = r.daemon.rollout_view().expect("a record");
    assert_eq!(
        (view.revision, view.error.as_deref()),
        (ID + 2, Some("not a rollout record"))
    );
    r.daemon
        .rollout_plan(VIPS, None, 1, HOLD)
        .expect("an unreadable record may be replaced");
}

/// The compare-and-swap of a rollout asks for the desired key as it is:
/// after a deletion, absent (0), not the newest revision seen, which etcd
/// never matched, so every rollout was refused as changed since its plan.
#[tokio::test]
async fn a_rollout_after_the_desired_key_is_deleted_compares_it_absent() {
    let mut r = reporting_member().await;
    assert!(r.daemon.tier_should_apply(ID + 1));
    let (.., desired_at, _) = r.daemon.rollout_plan(VIPS, None, 1, HOLD).expect("plan");
    assert_eq!(desired_at, Some(ID + 1));
    r.daemon.tier_desired_absent(ID + 5);
    let (.., desired_at, _) = r.daemon.rollout_plan(VIPS, None, 1, HOLD).expect("plan");
    assert_eq!(desired_at, Some(0));
}

/// A desired state under the size limit whose record, as JSON, is not
/// (each line break escaped) is refused before anything is written: every
/// balancer would refuse to read it. A failure's reason is cut so that the
/// marked record stays readable.
#[tokio::test]
async fn a_rollout_record_too_big_to_read_is_refused_and_reasons_are_cut() {
    let r = reporting_member().await;
    let padded = format!("{VIPS}{}", "#\n".repeat(400_000));
    assert!(padded.len() < crate::config::source::MAX_DESIRED_BYTES);
    let e = r.daemon.rollout_plan(&padded, None, 1, HOLD).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("more than the"), "{e}");
    // A record a balancer reads whose promotion (the text twice in one
    // transaction) etcd would refuse: refused now, not after every wave.
    let padded = format!("{VIPS}{}", "#".repeat(800_000));
    let e = r.daemon.rollout_plan(&padded, None, 1, HOLD).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("promoting the rollout"), "{e}");
    let padded = format!("{VIPS}{}", "#".repeat(600_000));
    r.daemon
        .rollout_plan(&padded, None, 1, HOLD)
        .expect("a promotion within etcd's limit");
    let (_, record, ..) = r.daemon.rollout_plan(VIPS, None, 1, HOLD).expect("small");
    // Control characters, escaped as six bytes each in JSON: the worst.
    let why = "\u{1}".repeat(100_000);
    let failed = marked(
        &record,
        ID,
        Outcome::Failed {
            by: "lb1".into(),
            why,
        },
    );
    let size = |r: &Rollout| serde_json::to_vec(r).unwrap().len();
    assert!(
        size(&failed) < size(&record) + (8 << 10),
        "{}",
        size(&failed)
    );
}

/// A failure's reason goes into the progress entry cut as into the
/// record: a gate listing hundreds of backends gave an entry over the
/// 16 KiB every balancer reads, so the failure was skipped everywhere.
#[test]
fn a_failures_progress_entry_stays_readable() {
    let why = cut("\u{1}".repeat(100_000));
    let entry = Progress {
        rollout: ID,
        phase: Phase::Failed { why: why.clone() },
    };
    let bytes = serde_json::to_vec(&entry).unwrap();
    assert!(bytes.len() < 16 << 10, "{}", bytes.len());
    assert!(why.ends_with('…'));
    assert_eq!(cut("short".into()), "short");
}

/// What a change explains to the gates: the backends it adds, and the
/// routes of addresses no VIP keeps.
#[test]
fn a_change_explains_the_backends_it_adds_and_the_routes_it_removes() {
    let config = |vips: &str| {
        crate::tier::with_vips(TIER_FILE, &desired(1, vips), "test".into())
            .expect("composes")
            .1
    };
    let vip = |address: &str, port: u16| {
        format!(
            "  - address: {address}\n    port: {port}\n    protocol: tcp\n    backends:\n      - address: 10.1.0.1\n"
        )
    };
    let old = config(&format!(
        "{VIPS}{}{}",
        vip("10.99.0.1", 443),
        vip("10.99.0.2", 80)
    ));
    let new = config(&format!("{VIPS}      - address: 10.1.0.3\n"));
    assert_eq!(
        change(&old, &new),
        Change {
            added: BTreeSet::from(["10.99.0.1:80/tcp 10.1.0.3".to_string()]),
            removed_routes: 1,
        },
        "10.99.0.1 stays announced for port 80; 10.99.0.2 goes"
    );
    assert_eq!(change(&new, &new), Change::default());
}

/// A refused revert is asked again after 6 s, then 12, 24 … at most a
/// minute, not every 3 s (each try logs and records a refused revision);
/// one that works brings the 3 s back. Other steps keep their 3 s.
#[tokio::test]
async fn a_refused_revert_is_asked_again_less_and_less_often() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    let id = candidate().revision;
    let back = Action::Revert(id);
    let t0 = std::time::Instant::now();
    let at = |secs: u64| t0 + std::time::Duration::from_secs(secs);
    // Not asked again for 3 s before any refusal.
    assert!(!r.daemon.asked_recently(back.clone(), at(0)));
    assert!(r.daemon.asked_recently(back.clone(), at(2)));
    assert!(!r.daemon.asked_recently(back.clone(), at(3)));
    let mut asked = 3;
    for wait in [6, 12, 24, 48, 60, 60] {
        assert!(r.daemon.rollout_reverted(id, true, false).is_empty());
        assert!(
            r.daemon.asked_recently(back.clone(), at(asked + wait - 1)),
            "refused: not asked again before {wait} s"
        );
        assert!(!r.daemon.asked_recently(back.clone(), at(asked + wait)));
        asked += wait;
    }
    // Another rollout's revert starts from 3 s again.
    assert!(!r.daemon.asked_recently(Action::Revert(id + 1), at(asked)));
    assert!(
        !r.daemon
            .asked_recently(Action::Revert(id + 1), at(asked + 3))
    );
    assert!(!r.daemon.asked_recently(back.clone(), at(asked + 3)));
    asked += 3;
    // Another step is not held back by the revert's wait.
    assert!(!r.daemon.asked_recently(Action::Pass(id), at(asked + 1)));
    assert!(!r.daemon.asked_recently(Action::Pass(id), at(asked + 4)));
    let _ = r.daemon.rollout_reverted(id, true, true);
    assert!(!r.daemon.asked_recently(back.clone(), at(asked + 10)));
    assert!(r.daemon.asked_recently(back.clone(), at(asked + 12)));
    assert!(!r.daemon.asked_recently(back, at(asked + 13)), "3 s again");
}

/// Going back from a held candidate: a failed revert keeps the candidate
/// (it still runs here) and says nothing; one that worked drops it and
/// says "reverted" when asked to.
#[tokio::test]
async fn a_revert_that_fails_keeps_the_candidate_one_that_works_drops_it() {
    let mut r = member().await;
    r.daemon.on_rollout(Some(Ok((record(&r), ID))));
    applied(&mut r, T0).await;
    let id = candidate().revision;
    assert_eq!(r.daemon.tier.candidate, Some(id));
    assert!(r.daemon.rollout_reverted(id, true, false).is_empty());
    assert_eq!(r.daemon.tier.candidate, Some(id), "still running here");
    assert_eq!(
        said(&r.daemon.rollout_reverted(id, true, true)),
        [format!("progress {id} Reverted")]
    );
    assert_eq!(r.daemon.tier.candidate, None);
    assert!(
        r.daemon.rollout_reverted(id, false, true).is_empty(),
        "not asked to say"
    );
}

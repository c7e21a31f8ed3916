//! The rollout's state machine on virtual time: balancers that each run
//! [`decide`] once a second against a fake store (keys with modification
//! revisions and a compare-and-swap, as etcd has), and act as `lbd` does.

use std::collections::BTreeMap;

use super::*;

/// etcd, as far as a rollout uses it.
#[derive(Default)]
struct Store {
    revision: i64,
    desired: Option<(String, i64)>,
    rollout: Option<(Rollout, i64)>,
    progress: BTreeMap<String, Progress>,
    desired_writes: usize,
}

impl Store {
    fn next(&mut self) -> i64 {
        self.revision += 1;
        self.revision
    }

    fn put_desired(&mut self, text: &str) -> i64 {
        let r = self.next();
        self.desired = Some((text.into(), r));
        self.desired_writes += 1;
        r
    }

    fn put_rollout(&mut self, rollout: Rollout) -> i64 {
        let r = self.next();
        self.rollout = Some((rollout, r));
        r
    }

    /// The record marked with `outcome` if it is still at `at`.
    fn mark(&mut self, at: i64, id: i64, outcome: Outcome) -> bool {
        let Some((mut rollout, r)) = self.rollout.clone() else {
            return false;
        };
        if r != at {
            return false;
        }
        rollout.revision = Some(id);
        rollout.outcome = Some(outcome);
        self.put_rollout(rollout);
        true
    }
}

/// One `lbd`, as the simulation needs it.
struct Balancer {
    name: String,
    local: Local,
    /// The text it runs.
    runs: String,
    gates_hold: bool,
    refuses: bool,
    cut_off: bool,
    /// When it applied the candidate, if it did.
    took_candidate: Option<u64>,
}

impl Balancer {
    fn new(name: &str, store: &Store) -> Balancer {
        let (text, revision) = store.desired.clone().unwrap();
        Balancer {
            name: name.into(),
            local: Local {
                applied: Some(revision),
                holding: None,
            },
            runs: text,
            gates_hold: true,
            refuses: false,
            cut_off: false,
            took_candidate: None,
        }
    }

    /// One second of this balancer: follow the desired state, then the
    /// rollout.
    fn tick(&mut self, store: &mut Store, now: u64) -> Action {
        if self.cut_off {
            return Action::Wait("cut off".into());
        }
        if let Some((text, revision)) = store.desired.clone()
            && self.local.applied.is_none_or(|a| revision > a)
        {
            self.local.applied = Some(revision);
            self.runs = text;
        }
        let view = View {
            rollout: store.rollout.as_ref().map(|(r, m)| (r, *m)),
            desired: store.desired.as_ref().map(|d| d.1),
            progress: &store.progress,
        };
        let gates_hold = self.gates_hold;
        let action = decide(&view, &self.name, &self.local, now, |_| {
            if gates_hold {
                Ok(())
            } else {
                Err("be3 down".into())
            }
        });
        self.act(&action, store, now);
        action
    }

    fn act(&mut self, action: &Action, store: &mut Store, now: u64) {
        let name = self.name.clone();
        let progress = |store: &mut Store, id, phase| {
            store
                .progress
                .insert(name.clone(), Progress { rollout: id, phase });
            store.next();
        };
        match action {
            Action::Apply(id) if self.refuses => {
                self.fail(store, *id, "refused: bad".into());
            }
            Action::Apply(id) => {
                self.local.applied = Some(*id);
                self.local.holding = Some((*id, now));
                self.runs = store.rollout.as_ref().unwrap().0.desired.clone();
                self.took_candidate = Some(now);
            }
            Action::StartHold(id) => self.local.holding = Some((*id, now)),
            Action::Pass(id) => progress(store, *id, Phase::Passed),
            Action::Fail(id, why) => self.fail(store, *id, why.clone()),
            Action::MarkFailed(id, by, why) => {
                let at = store.rollout.as_ref().unwrap().1;
                let (by, why) = (by.clone(), why.clone());
                store.mark(at, *id, Outcome::Failed { by, why });
            }
            Action::Revert(id) => {
                self.revert(store);
                progress(store, *id, Phase::Reverted);
            }
            Action::Promote(id, at) => {
                let text = store.rollout.as_ref().unwrap().0.desired.clone();
                if store.mark(*at, *id, Outcome::Done) {
                    store.put_desired(&text);
                }
            }
            Action::Wait(_) | Action::Idle => {}
        }
    }

    fn fail(&mut self, store: &mut Store, id: i64, why: String) {
        store.progress.insert(
            self.name.clone(),
            Progress {
                rollout: id,
                phase: Phase::Failed { why: why.clone() },
            },
        );
        let at = store.rollout.as_ref().unwrap().1;
        let by = self.name.clone();
        store.mark(at, id, Outcome::Failed { by, why });
        self.revert(store);
    }

    fn revert(&mut self, store: &Store) {
        let (text, revision) = store.desired.clone().unwrap();
        self.local.applied = Some(revision);
        self.local.holding = None;
        self.runs = text;
    }
}

const OLD: &str = "vips: []\n";
const NEW: &str =
    "vips: [{address: 10.99.0.1, port: 80, protocol: tcp, backends: [{address: 10.10.0.2}]}]\n";

struct Tier {
    store: Store,
    balancers: Vec<Balancer>,
    now: u64,
}

impl Tier {
    fn new(names: &[&str]) -> Tier {
        let mut store = Store::default();
        store.put_desired(OLD);
        let balancers = names.iter().map(|n| Balancer::new(n, &store)).collect();
        Tier {
            store,
            balancers,
            now: 1_000,
        }
    }

    fn start(&mut self, waves: &[&[&str]], hold_secs: u64) -> i64 {
        self.store.put_rollout(Rollout {
            desired: NEW.into(),
            waves: waves
                .iter()
                .map(|w| w.iter().map(|n| n.to_string()).collect())
                .collect(),
            hold_secs,
            expected: BTreeMap::new(),
            by: "test".into(),
            revision: None,
            outcome: None,
        })
    }

    /// `secs` seconds of the tier; each second every balancer acts once,
    /// in an order that turns.
    fn run(&mut self, secs: u64) {
        for _ in 0..secs {
            self.now += 1;
            let n = self.balancers.len();
            for i in 0..n {
                let b = &mut self.balancers[(i + self.now as usize) % n];
                b.tick(&mut self.store, self.now);
            }
        }
    }

    fn get(&mut self, name: &str) -> &mut Balancer {
        self.balancers.iter_mut().find(|b| b.name == name).unwrap()
    }

    fn outcome(&self) -> Option<Outcome> {
        self.store
            .rollout
            .as_ref()
            .and_then(|r| r.0.outcome.clone())
    }
}

#[test]
fn a_rollout_whose_gates_hold_reaches_every_wave_in_order_and_is_promoted_once() {
    let mut tier = Tier::new(&["a", "b", "c"]);
    tier.start(&[&["a"], &["b", "c"]], 30);
    tier.run(100);
    assert_eq!(tier.outcome(), Some(Outcome::Done));
    assert_eq!(tier.store.desired.as_ref().unwrap().0, NEW);
    assert_eq!(tier.store.desired_writes, 2, "promoted exactly once");
    let canary = tier.get("a").took_candidate.unwrap();
    for name in ["b", "c"] {
        let took = tier.get(name).took_candidate.unwrap();
        assert!(
            took >= canary + 30,
            "{name} took the candidate at {took}, the canary at {canary}: before its hold ended"
        );
    }
    let desired = tier.store.desired.as_ref().unwrap().1;
    for b in &tier.balancers {
        assert_eq!(b.runs, NEW);
        assert_eq!(
            b.local.applied,
            Some(desired),
            "{} follows the desired",
            b.name
        );
    }
}

#[test]
fn a_canary_whose_gate_fails_reverts_and_the_others_never_take_the_candidate() {
    let mut tier = Tier::new(&["a", "b", "c"]);
    let id = tier.start(&[&["a"], &["b"], &["c"]], 30);
    tier.get("a").gates_hold = false;
    tier.run(100);
    assert_eq!(
        tier.outcome(),
        Some(Outcome::Failed {
            by: "a".into(),
            why: "be3 down".into()
        })
    );
    assert_eq!(tier.store.desired.as_ref().unwrap().0, OLD, "not promoted");
    assert!(tier.get("a").took_candidate.is_some());
    assert_eq!(tier.get("a").runs, OLD, "the canary went back");
    for name in ["b", "c"] {
        assert_eq!(tier.get(name).took_candidate, None, "{name} took it");
    }
    assert_eq!(tier.store.rollout.as_ref().unwrap().0.revision, Some(id));
}

#[test]
fn a_failure_in_a_later_wave_reverts_every_balancer_that_took_it() {
    let mut tier = Tier::new(&["a", "b", "c", "d"]);
    tier.start(&[&["a"], &["b", "c"], &["d"]], 10);
    tier.get("c").gates_hold = false;
    tier.run(60);
    assert!(matches!(tier.outcome(), Some(Outcome::Failed { by, .. }) if by == "c"));
    for name in ["a", "b", "c"] {
        assert!(tier.get(name).took_candidate.is_some(), "{name}");
        assert_eq!(tier.get(name).runs, OLD, "{name} still runs the candidate");
    }
    assert_eq!(tier.get("d").took_candidate, None);
    for name in ["a", "b"] {
        assert_eq!(
            tier.store.progress[name].phase,
            Phase::Reverted,
            "{name} said it reverted"
        );
    }
}

#[test]
fn a_candidate_refused_on_the_canary_fails_the_rollout_there() {
    let mut tier = Tier::new(&["a", "b"]);
    tier.start(&[&["a"], &["b"]], 5);
    tier.get("a").refuses = true;
    tier.run(30);
    assert!(
        matches!(tier.outcome(), Some(Outcome::Failed { by, why }) if by == "a" && why.starts_with("refused"))
    );
    assert_eq!(tier.get("b").took_candidate, None);
}

#[test]
fn a_balancer_restarted_while_holding_holds_again_and_the_rollout_completes() {
    let mut tier = Tier::new(&["a", "b"]);
    let id = tier.start(&[&["a"], &["b"]], 30);
    tier.run(20);
    assert_eq!(tier.get("a").local.applied, Some(id));
    // A restart keeps what ran (the revision) and forgets the hold.
    tier.get("a").local.holding = None;
    let restarted = tier.now;
    tier.run(25);
    assert_eq!(
        tier.get("b").took_candidate,
        None,
        "b started before a held 30 s again"
    );
    tier.run(60);
    assert_eq!(tier.outcome(), Some(Outcome::Done));
    assert!(tier.get("b").took_candidate.unwrap() >= restarted + 30);
}

#[test]
fn a_balancer_cut_off_from_etcd_holds_the_rollout_until_it_hears_again() {
    let mut tier = Tier::new(&["a", "b", "c"]);
    tier.start(&[&["a"], &["b"], &["c"]], 5);
    tier.get("b").cut_off = true;
    tier.run(60);
    assert_eq!(tier.outcome(), None, "nothing decided without b");
    assert_eq!(tier.get("c").took_candidate, None);
    assert_eq!(tier.get("a").runs, NEW, "the canary keeps the candidate");
    tier.get("b").cut_off = false;
    tier.run(30);
    assert_eq!(tier.outcome(), Some(Outcome::Done));
}

#[test]
fn a_desired_state_written_during_a_rollout_supersedes_it() {
    let mut tier = Tier::new(&["a", "b"]);
    tier.start(&[&["a"], &["b"]], 30);
    tier.run(5);
    assert_eq!(tier.get("a").runs, NEW);
    let direct = "vips: [] # direct\n";
    tier.store.put_desired(direct);
    tier.run(60);
    for b in &tier.balancers {
        assert_eq!(b.runs, direct, "{}", b.name);
    }
    assert_eq!(tier.get("b").took_candidate, None);
    assert_eq!(tier.outcome(), None, "a superseded record is left as it is");
}

#[test]
fn an_aborted_rollout_reverts_like_a_failed_one() {
    let mut tier = Tier::new(&["a", "b"]);
    let id = tier.start(&[&["a"], &["b"]], 30);
    tier.run(5);
    let at = tier.store.rollout.as_ref().unwrap().1;
    let why = "operator".to_string();
    assert!(tier.store.mark(at, id, Outcome::Aborted { why }));
    tier.run(5);
    assert_eq!(tier.get("a").runs, OLD);
    assert_eq!(tier.get("b").took_candidate, None);
}

#[test]
fn a_balancer_outside_the_plan_waits_for_the_promotion() {
    let mut tier = Tier::new(&["a", "b", "late"]);
    tier.start(&[&["a"], &["b"]], 3);
    tier.run(3);
    let local = tier.get("late").local.clone();
    let view = View {
        rollout: tier.store.rollout.as_ref().map(|(r, m)| (r, *m)),
        desired: tier.store.desired.as_ref().map(|d| d.1),
        progress: &tier.store.progress,
    };
    assert!(
        matches!(decide(&view, "late", &local, 0, |_| Ok(())), Action::Wait(w) if w.contains("not in"))
    );
    tier.run(30);
    assert_eq!(tier.get("late").runs, NEW);
    assert_eq!(tier.get("late").took_candidate, None);
}

#[test]
fn plans_put_the_canary_alone_first_and_split_the_rest() {
    let names: Vec<String> = ["d", "b", "a", "c", "e"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        plan(&names, None, 2).unwrap(),
        vec![vec!["a"], vec!["b", "c"], vec!["d", "e"]]
    );
    assert_eq!(
        plan(&names, Some("c"), 1).unwrap(),
        vec![vec!["c"], vec!["a", "b", "d", "e"]]
    );
    assert_eq!(
        plan(&names, Some("c"), 9).unwrap().len(),
        5,
        "no empty wave"
    );
    assert_eq!(plan(&names[..1], None, 3).unwrap(), vec![vec!["d"]]);
    assert!(
        plan(&names, Some("z"), 2)
            .unwrap_err()
            .contains("not a member")
    );
    assert!(plan(&[], None, 2).is_err());
}

#[test]
fn records_that_make_no_sense_are_refused_by_name() {
    let record = |waves: &str, hold: u64| {
        format!(r#"{{"desired": "vips: []", "waves": {waves}, "hold_secs": {hold}}}"#)
    };
    assert!(Rollout::parse(record(r#"[["a"],["b"]]"#, 5).as_bytes()).is_ok());
    let refused = |text: String, wanted: &str| {
        let e = Rollout::parse(text.as_bytes()).unwrap_err();
        assert!(e.contains(wanted), "{e}");
    };
    refused(record(r#"[["a"],["a"]]"#, 5), "more than one wave");
    refused(record("[]", 5), "1 to 64 waves");
    refused(record(r#"[["a"],[]]"#, 5), "at least one");
    refused(record(r#"[["a"]]"#, 3601), "at most 3600");
    refused(record(r#"[["a b"]]"#, 5), "not a balancer name");
    refused(
        r#"{"desired": "vips: []", "waves": [["a"]], "x": 1}"#.into(),
        "unknown field",
    );
    refused(" ".repeat(MAX_ROLLOUT_BYTES + 1), "more than");
}

/// A record's `revision` names the rollout only as the outcome's writer
/// sets it: with an outcome, no later than the record's own write.
#[test]
fn a_records_revision_names_the_rollout_only_as_its_outcome_writes_it() {
    let record = |extra: &str| {
        let text = format!(r#"{{"desired": "vips: []", "waves": [["a"]], "hold_secs": 5{extra}}}"#);
        Rollout::parse(text.as_bytes()).unwrap()
    };
    assert_eq!(record("").id(40), 40);
    let done = r#", "revision": 30, "outcome": "done""#;
    assert_eq!(record(done).id(40), 30, "marked done at 40, started at 30");
    assert_eq!(record(r#", "revision": 90"#).id(40), 40, "in progress");
    let later = r#", "revision": 90, "outcome": "done""#;
    assert_eq!(record(later).id(40), 40, "a revision after its own write");
}

fn snapshot() -> Snapshot {
    Snapshot {
        down: BTreeSet::new(),
        serving: ["10.99.0.1:80/tcp 10.10.0.2".to_string()].into(),
        nominal: ["10.99.0.1:80/tcp".to_string()].into(),
        tables: [("10.99.0.1:80/tcp".to_string(), (65537, "aaaa".to_string()))].into(),
        announced: [("r1".to_string(), 2)].into(),
        forwarded: 10,
        forwarding: true,
    }
}

#[test]
fn each_gate_fails_alone_and_says_which() {
    let before = snapshot();
    let want = |digest: &str| Expected {
        table_size: 65537,
        digest: digest.into(),
    };
    let expected: BTreeMap<String, Expected> =
        [("10.99.0.1:80/tcp".to_string(), want("aaaa"))].into();
    let change = Change::default();
    let mut moved = before.clone();
    moved.forwarded += 5;
    assert_eq!(gates(&before, &moved, &expected, &change, true), Ok(()));

    let mut table = before.clone();
    table
        .tables
        .insert("10.99.0.1:80/tcp".into(), (65537, "bbbb".into()));
    let e = gates(&before, &table, &expected, &change, false).unwrap_err();
    assert!(e.contains("table bbbb here, the plan computed aaaa"), "{e}");
    let mut other_size = table.clone();
    other_size
        .tables
        .insert("10.99.0.1:80/tcp".into(), (251, "bbbb".into()));
    assert_eq!(
        gates(&before, &other_size, &expected, &change, false),
        Ok(()),
        "another box's table size"
    );
    table.nominal.clear();
    assert_eq!(
        gates(&before, &table, &expected, &change, false),
        Ok(()),
        "a VIP with a backend down has health's table"
    );

    let mut down = before.clone();
    down.down.insert("10.99.0.1:80/tcp 10.10.0.2".into());
    down.serving.clear();
    let e = gates(&before, &down, &expected, &change, false).unwrap_err();
    assert!(e.contains("10.10.0.2: stopped serving"), "{e}");
    let added = Change {
        added: down.down.clone(),
        removed_routes: 0,
    };
    assert_eq!(
        gates(&before, &down, &expected, &added, false),
        Ok(()),
        "an added backend may come up late"
    );
    let e = gates(&before, &down, &expected, &added, true).unwrap_err();
    assert!(e.contains("added by the change, not serving"), "{e}");
    // Not down yet but not up either (its probes still running): not
    // serving by the end of the hold is a failure too.
    let mut pending = before.clone();
    pending.serving.clear();
    let e = gates(&before, &pending, &expected, &added, true).unwrap_err();
    assert!(e.contains("added by the change, not serving"), "{e}");
    let mut serving = before.clone();
    serving.forwarded += 1;
    assert_eq!(
        gates(&before, &serving, &expected, &added, true),
        Ok(()),
        "added and serving"
    );

    let mut routes = before.clone();
    routes.announced.insert("r1".into(), 1);
    let e = gates(&before, &routes, &expected, &change, false).unwrap_err();
    assert!(e.contains("peer r1: 1 routes, 2 before"), "{e}");
    let removed = Change {
        added: BTreeSet::new(),
        removed_routes: 1,
    };
    assert_eq!(gates(&before, &routes, &expected, &removed, false), Ok(()));

    let idle = before.clone();
    assert_eq!(
        gates(&before, &idle, &expected, &change, false),
        Ok(()),
        "judged at the end"
    );
    let e = gates(&before, &idle, &expected, &change, true).unwrap_err();
    assert!(e.contains("no packet forwarded during the hold"), "{e}");
    let mut busy = before.clone();
    busy.forwarded += 1;
    assert_eq!(gates(&before, &busy, &expected, &change, true), Ok(()));
    let mut quiet = before.clone();
    quiet.forwarding = false;
    assert_eq!(
        gates(&quiet, &idle, &expected, &change, true),
        Ok(()),
        "no traffic before, none needed after"
    );
}

//! The passive-health policy over scripted counter series.

use super::*;

fn settings() -> PassiveHealth {
    PassiveHealth {
        window: Duration::from_secs(10),
        min_syns: 10,
        ratio: 0.3,
        relative: 3.0,
        ejection: Duration::from_secs(5),
        max_ejection: Duration::from_secs(40),
        max_ejection_percent: 50,
        enabled: true,
    }
}

/// Ticks (seconds) a [`Series`] runs at most: the longest test waits
/// through fewer than 200.
const MAX_TICKS: u64 = 1_000;

/// `n` backends; each tick (1 s) backend i receives `syns[i]` SYNs of
/// which `retransmits[i]` are retransmissions of its own.
struct Series {
    t0: Instant,
    tick: u64,
    totals: Vec<(u64, u64)>,
    states: Vec<Passive>,
}

impl Series {
    fn new(n: usize) -> Self {
        Self {
            t0: Instant::now(),
            tick: 0,
            totals: vec![(0, 0); n],
            states: vec![Passive::default(); n],
        }
    }

    fn now(&self) -> Instant {
        self.t0 + Duration::from_secs(self.tick)
    }

    /// One tick; returns the events. The tests' loops that wait for an
    /// event end here if it never comes.
    fn step(&mut self, s: &PassiveHealth, per_tick: &[(u64, u64)]) -> Vec<Event> {
        assert!(self.tick < MAX_TICKS, "nothing after {MAX_TICKS} ticks");
        self.tick += 1;
        let now = self.now();
        for (i, (syns, rt)) in per_tick.iter().enumerate() {
            self.totals[i].0 += syns;
            self.totals[i].1 += rt;
            let (a, b) = self.totals[i];
            self.states[i].record(now, a, b, s.window);
        }
        let mut refs: Vec<(&mut Passive, bool)> =
            self.states.iter_mut().map(|p| (p, true)).collect();
        evaluate(s, &mut refs, 0, now)
    }

    fn ejected(&self) -> Vec<bool> {
        let now = self.now();
        self.states.iter().map(|p| p.is_ejected(now)).collect()
    }
}

fn ejections(events: &[Event]) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Ejected { index, .. } => Some(*index),
            _ => None,
        })
        .collect()
}

#[test]
fn a_backend_whose_syns_are_retransmitted_is_ejected_once_the_sample_suffices() {
    let s = settings();
    let mut series = Series::new(3);
    // Backend 1 answers nothing: each SYN to it is retried.
    let failing = [(3, 0), (3, 3), (3, 0)];
    let first = series.step(&s, &failing);
    assert!(ejections(&first).is_empty(), "3 SYNs are below min_syns");
    let mut when = None;
    for t in 0..5 {
        if ejections(&series.step(&s, &failing)) == vec![1] {
            when = Some(t + 2);
            break;
        }
    }
    // The first sample is the baseline (counters are cumulative since the
    // maps were made): 12 SYNs in the window after the 5th tick.
    assert_eq!(when, Some(5));
    assert_eq!(series.ejected(), vec![false, true, false]);
}

#[test]
fn a_shared_loss_or_a_flood_ejects_nobody() {
    let s = settings();
    // Everyone's SYNs are retried alike (a lossy client network).
    let mut series = Series::new(3);
    for _ in 0..20 {
        assert!(ejections(&series.step(&s, &[(5, 2), (5, 2), (5, 3)])).is_empty());
    }
    // A spoofed flood: many SYNs, no retransmission at all.
    let mut series = Series::new(3);
    for _ in 0..20 {
        assert!(ejections(&series.step(&s, &[(500, 0), (500, 0), (500, 1)])).is_empty());
    }
}

#[test]
fn the_absolute_threshold_keeps_a_slightly_worse_backend() {
    let s = settings();
    let mut series = Series::new(2);
    // 20% retried, others 0%: relatively far worse, absolutely below 0.3.
    for _ in 0..20 {
        assert!(ejections(&series.step(&s, &[(10, 2), (10, 0)])).is_empty());
    }
}

#[test]
fn ejections_double_up_to_the_maximum_and_decay_when_healthy() {
    let s = settings();
    let mut series = Series::new(2);
    let failing = [(5, 5), (5, 0)];
    let mut lengths = Vec::new();
    while lengths.len() < 5 {
        for e in series.step(&s, &failing) {
            if let Event::Ejected { length, .. } = e {
                lengths.push(length.as_secs());
            }
        }
    }
    assert_eq!(lengths, vec![5, 10, 20, 40, 40]);
    // Released, then healthy for 3 × (ejection × 4) = 60 s: three of the
    // five ejections are forgotten, the next is the third: 4 × 5 s.
    while series.ejected()[0] {
        series.step(&s, &[(5, 0), (5, 0)]);
    }
    for _ in 0..60 {
        series.step(&s, &[(5, 0), (5, 0)]);
    }
    let mut next = None;
    while next.is_none() {
        for e in series.step(&s, &failing) {
            if let Event::Ejected { length, .. } = e {
                next = Some(length.as_secs());
            }
        }
    }
    assert_eq!(next, Some(20));
}

#[test]
fn the_cap_holds_back_all_but_max_ejection_percent_and_says_so() {
    let s = PassiveHealth {
        max_ejection_percent: 17,
        ..settings()
    };
    let mut series = Series::new(6);
    // Two of six fail: each stands out against the others, but the cap
    // (17% of 6: one) lets only the first go; the second is held back.
    let failing = [(5, 5), (5, 5), (5, 0), (5, 0), (5, 0), (5, 0)];
    let mut ejected = Vec::new();
    let mut held = Vec::new();
    for _ in 0..6 {
        for e in series.step(&s, &failing) {
            match e {
                Event::Ejected { index, .. } => ejected.push(index),
                Event::HeldBack { index, .. } => held.push(index),
                Event::Released { .. } => {}
            }
        }
    }
    assert_eq!(s.cap(6), 1);
    assert_eq!(ejected, vec![0]);
    assert_eq!(held, vec![1], "the second is held back, and said so once");
    assert_eq!(series.ejected().iter().filter(|e| **e).count(), 1);
    assert_eq!(s.cap(1), 0, "a lone backend has no peers to compare with");
    assert_eq!(s.cap(3), 1);
    let none = PassiveHealth {
        max_ejection_percent: 0,
        ..settings()
    };
    assert_eq!(
        none.cap(6),
        0,
        "0% ejects none, not the one a small percent rounds up to"
    );
    let mut series = Series::new(6);
    let mut held = Vec::new();
    for _ in 0..6 {
        for e in series.step(&none, &failing) {
            match e {
                Event::Ejected { index, .. } => panic!("ejected {index} at 0%"),
                Event::HeldBack { index, .. } => held.push(index),
                Event::Released { .. } => {}
            }
        }
    }
    assert_eq!(held, vec![0, 1], "both are named as held back");
}

#[test]
fn all_failing_ejects_no_more_than_the_cap() {
    let s = settings();
    let mut series = Series::new(3);
    for _ in 0..10 {
        series.step(&s, &[(5, 5), (5, 5), (5, 5)]);
    }
    // Everyone's ratio is 1: relatively, nobody stands out.
    assert!(series.ejected().iter().all(|e| !e));
}

#[test]
fn a_reused_index_restarts_the_series() {
    let s = settings();
    let mut p = Passive::default();
    let t = Instant::now();
    p.record(t, 100, 50, s.window);
    p.record(t + Duration::from_secs(1), 110, 55, s.window);
    assert_eq!(
        p.window(),
        Window {
            syns: 10,
            retransmits: 5
        }
    );
    p.record(t + Duration::from_secs(2), 3, 0, s.window);
    assert_eq!(p.window(), Window::default());
    // Either counter going back alone restarts it too.
    for (syns, retransmits) in [(20, 1), (2, 2)] {
        p.record(t + Duration::from_secs(3), 10, 2, s.window);
        p.record(t + Duration::from_secs(4), syns, retransmits, s.window);
        assert_eq!(
            p.window(),
            Window::default(),
            "10, 2 then {syns}, {retransmits}"
        );
    }
    let problems = PassiveHealth {
        ratio: f64::NAN,
        window: Duration::from_secs(1),
        ..settings()
    }
    .problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
}

/// The exact test against tails worked out independently (Python's
/// `math.comb` and `fractions`, summing the hypergeometric tail exactly),
/// and an unlucky small sample that passes both ratio tests is not
/// ejected while a backend dropping every SYN is.
#[test]
fn a_small_unlucky_sample_is_chance_and_ejects_nobody() {
    let w = |syns, retransmits| Window { syns, retransmits };
    let near = |got: f64, want: f64| (got - want).abs() <= want * 1e-9;
    for (one, others, want) in [
        (w(16, 8), w(32, 5), 0.015783259004896456),
        (w(10, 10), w(20, 0), 3.328339160423119e-08),
        (w(20, 7), w(27, 0), 0.001232599019463664),
        (w(33, 14), w(27, 0), 4.7204772524682134e-05),
        (w(6, 4), w(30, 3), 0.007611695704674831),
        (w(32, 24), w(32, 8), 6.702229495025774e-05),
        (w(32, 23), w(32, 8), 0.00018776132966917861),
        // Above 255, where ln n! is Stirling's.
        (w(1000, 300), w(2000, 200), 2.4030585271085895e-41),
    ] {
        let got = chance(one, others);
        assert!(
            near(got, want),
            "{one:?} against {others:?}: {got:e}, want {want:e}"
        );
    }
    // No SYN on one side, or retried no more than the others: no evidence.
    for (one, others) in [
        (w(0, 0), w(20, 0)),
        (w(20, 20), w(0, 0)),
        (w(10, 0), w(20, 0)),
        (w(10, 2), w(20, 4)),
        (w(10, 10), w(20, 20)),
    ] {
        assert_eq!(chance(one, others), 1.0, "{one:?} against {others:?}");
    }
    // Counters read apart (more retried than sent) count as all retried.
    assert_eq!(chance(w(10, 12), w(20, 0)), chance(w(10, 10), w(20, 0)));
    // ln n! by Stirling's series above 255, against the sum of logs: at
    // 256 its last term is 1.7e-10, so the tolerance tells it apart.
    for (n, tolerance) in [(256u64, 1e-10), (300, 1e-10), (1000, 1e-9), (5000, 1e-8)] {
        let summed: f64 = (2..=n).map(|i| (i as f64).ln()).sum();
        let got = ln_factorial(n);
        assert!(
            (got - summed).abs() < tolerance,
            "ln {n}!: {got} against {summed}"
        );
    }
    assert_eq!(ln_factorial(0), 0.0);
    assert_eq!(ln_factorial(1), 0.0);
    assert!((ln_factorial(5) - 120f64.ln()).abs() < 1e-12);
    // A trillion SYNs each, 2.9 standard errors apart (σ of the draw
    // 324,037): the tail is cut short after 10,000 terms, 3% of σ, whose
    // sum alone is about 2e-4 and would eject; the rest is bounded from
    // above. The tail there is the normal law's (with continuity
    // correction, worked out in Python): 0.0018658.
    let (one, others) = (
        w(1_000_000_000_000, 300_001_879_415),
        w(1_000_000_000_000, 300_000_000_000),
    );
    let p = chance(one, others);
    assert!((0.0018658 * 0.9..0.0018658 * 3.0).contains(&p), "{p}");
    let relaxed = PassiveHealth {
        relative: 1.0,
        ratio: 0.0,
        ..settings()
    };
    assert_eq!(judge(&relaxed, one, others), Judgement::Chance(p));
    // Counts whose sum overflows: no judgement, no panic.
    assert_eq!(chance(w(u64::MAX, u64::MAX), w(2, 0)), 1.0);
    // A tail far beyond f64's range is 0, not NaN, and cheap.
    assert_eq!(chance(w(1 << 40, 1 << 40), w(1 << 40, 0)), 0.0);

    let s = PassiveHealth {
        min_syns: 10,
        ..settings()
    };
    let now = Instant::now();
    let judge = |counts: [(u64, u64); 3]| {
        let mut states: Vec<Passive> = vec![Passive::default(); 3];
        for (p, (syns, re)) in states.iter_mut().zip(counts) {
            p.record(now - s.window, 0, 0, s.window);
            p.record(now, syns, re, s.window);
        }
        let mut refs: Vec<(&mut Passive, bool)> = states.iter_mut().map(|p| (p, true)).collect();
        evaluate(&s, &mut refs, 0, now)
            .into_iter()
            .filter(|e| matches!(e, Event::Ejected { .. }))
            .count()
    };
    // Unlucky: 8 of 16 against 5 of 32 (two backends of 16): ratios
    // 0.5 ≥ 0.3 and ≥ 3 × 0.156.
    assert_eq!(judge([(16, 8), (16, 2), (16, 3)]), 0);
    // Failing: every SYN retried, against none.
    assert_eq!(judge([(10, 10), (10, 0), (10, 0)]), 1);
}

#[test]
fn a_quiet_spell_keeps_the_series() {
    // Counters that did not move are no reset: the window still reaches
    // back to its first sample.
    let s = settings();
    let mut p = Passive::default();
    let t = Instant::now();
    for (second, syns, retransmits) in [(0, 10, 2), (1, 20, 8), (2, 20, 8), (3, 25, 9)] {
        p.record(t + Duration::from_secs(second), syns, retransmits, s.window);
    }
    assert_eq!(
        p.window(),
        Window {
            syns: 15,
            retransmits: 7
        }
    );
}

#[test]
fn a_healthy_spell_forgets_one_ejection_per_four_ejection_lengths() {
    // `ejection` is 5 s: one of five ejections is forgotten per 20 s.
    let s = settings();
    let t = Instant::now();
    for (healthy, left) in [
        (0, 5),
        (19, 5),
        (20, 4),
        (30, 4),
        (59, 3),
        (60, 2),
        (200, 0),
    ] {
        let mut p = Passive {
            ejections: 5,
            released_at: Some(t),
            ..Passive::default()
        };
        p.decay(&s, t + Duration::from_secs(healthy));
        assert_eq!(p.ejections, left, "after {healthy} s healthy");
    }
}

#[test]
fn an_ejection_as_long_as_its_maximum_is_allowed() {
    let s = PassiveHealth {
        max_ejection: Duration::from_secs(5),
        ..settings()
    };
    assert_eq!(s.ejection, s.max_ejection);
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    let shorter = PassiveHealth {
        max_ejection: Duration::from_secs(4),
        ..settings()
    };
    assert_eq!(shorter.problems().len(), 1, "{:?}", shorter.problems());
}

/// An ejection ends at its instant: the backend is back at `now + length`.
#[test]
fn an_ejection_ends_at_its_length() {
    let s = settings();
    let mut p = Passive::default();
    let now = Instant::now();
    let length = p.eject(&s, now);
    assert_eq!(length, s.ejection);
    assert!(p.is_ejected(now + length - Duration::from_nanos(1)));
    assert!(!p.is_ejected(now + length), "back at the end");
    assert_eq!(p.left(now + length), Duration::ZERO);
}

/// Each setting's bounds are inclusive: the bound itself passes, one step
/// beyond is refused, naming the field; the cap is that share of the
/// backends.
#[test]
fn passive_settings_bounds_are_inclusive() {
    let ms = Duration::from_millis;
    let fields = |s: PassiveHealth| -> Vec<&'static str> {
        s.problems().into_iter().map(|(f, _)| f).collect()
    };
    for ok in [
        PassiveHealth {
            window: ms(5_000),
            ..settings()
        },
        PassiveHealth {
            window: ms(3_600_000),
            ..settings()
        },
        PassiveHealth {
            ratio: 0.0,
            ..settings()
        },
        PassiveHealth {
            ratio: 1.0,
            ..settings()
        },
        PassiveHealth {
            ejection: ms(1_000),
            ..settings()
        },
        PassiveHealth {
            max_ejection_percent: 100,
            ..settings()
        },
    ] {
        assert_eq!(fields(ok.clone()), Vec::<&str>::new(), "{ok:?}");
    }
    for (bad, field) in [
        (
            PassiveHealth {
                window: ms(4_999),
                ..settings()
            },
            "window",
        ),
        (
            PassiveHealth {
                window: ms(3_600_001),
                ..settings()
            },
            "window",
        ),
        (
            PassiveHealth {
                ratio: 150.0,
                ..settings()
            },
            "ratio",
        ),
        (
            PassiveHealth {
                ratio: 30.0,
                ..settings()
            },
            "ratio",
        ),
        (
            PassiveHealth {
                ratio: f64::NAN,
                ..settings()
            },
            "ratio",
        ),
        (
            PassiveHealth {
                ejection: ms(999),
                ..settings()
            },
            "ejection",
        ),
        (
            PassiveHealth {
                max_ejection_percent: 101,
                ..settings()
            },
            "max_ejection_percent",
        ),
    ] {
        assert_eq!(fields(bad.clone()), [field], "{bad:?}");
    }
    let half = PassiveHealth {
        max_ejection_percent: 50,
        ..settings()
    };
    assert_eq!((half.cap(10), half.cap(3), half.cap(1)), (5, 1, 0));
}

/// The policy's tests at their boundaries, in values exact in binary:
/// retried exactly `relative` (3) times the others is not "alike", and
/// then 24 of 32 against 8 of 32 is ejected (by chance once in 14,920).
#[test]
fn judged_at_exactly_relative_times_the_others() {
    let settings = PassiveHealth::default();
    let w = |syns, retransmits| Window { syns, retransmits };
    assert_eq!(settings.relative, 3.0);
    assert_eq!(judge(&settings, w(32, 24), w(32, 8)), Judgement::Eject);
    // Just under 3 times: alike.
    assert_eq!(
        judge(&settings, w(32, 23), w(32, 8)),
        Judgement::LikeOthers(0.25)
    );
}

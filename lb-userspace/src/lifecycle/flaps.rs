//! Flapping probes: a backend whose probe verdict keeps changing is held
//! down for progressively longer before it returns. Four changes within
//! two minutes make the next recovery wait 10 s, then 20 s, 40 s... up to
//! ten minutes; ten quiet minutes forget the history.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// Changes counted.
const WINDOW: Duration = Duration::from_secs(120);
/// Changes within the window that make a recovery wait.
const LIMIT: usize = 4;
const HOLD_BASE: Duration = Duration::from_secs(10);
const HOLD_MAX: Duration = Duration::from_secs(600);
/// Quiet time after which the holds start over.
const FORGET: Duration = Duration::from_secs(600);

/// One backend's verdict changes and hold.
#[derive(Clone, Debug, Default)]
pub struct Flaps {
    changes: VecDeque<Instant>,
    /// Held down (its probes say up) until then.
    pub held_until: Option<Instant>,
    /// Holds in a row.
    pub holds: u32,
}

impl Flaps {
    /// A verdict change at `now` (`up`: the new verdict). Returns how long
    /// a recovery is held, if it is.
    pub fn change(&mut self, up: bool, now: Instant) -> Option<Duration> {
        if self
            .changes
            .back()
            .is_some_and(|last| now.saturating_duration_since(*last) >= FORGET)
        {
            self.holds = 0;
        }
        self.changes.push_back(now);
        while self
            .changes
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > WINDOW)
        {
            self.changes.pop_front();
        }
        if !up {
            self.held_until = None;
            return None;
        }
        if self.changes.len() < LIMIT {
            return None;
        }
        self.holds = self.holds.saturating_add(1);
        let hold = (HOLD_BASE * (1u32 << (self.holds - 1).min(16))).min(HOLD_MAX);
        self.held_until = Some(now + hold);
        Some(hold)
    }

    pub fn held(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flapping_backend_is_held_longer_each_time_and_forgiven_when_quiet() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut f = Flaps::default();
        // down, up, down: three changes, no hold yet.
        assert_eq!(f.change(false, at(0)), None);
        assert_eq!(f.change(true, at(5)), None);
        assert_eq!(f.change(false, at(10)), None);
        // The fourth within two minutes is a recovery: held 10 s.
        assert_eq!(f.change(true, at(15)), Some(Duration::from_secs(10)));
        assert!(f.held(at(20)) && !f.held(at(25)));
        assert_eq!(f.change(false, at(30)), None);
        assert!(
            !f.held(at(31)),
            "down again: the hold ends with the recovery"
        );
        assert_eq!(f.change(true, at(35)), Some(Duration::from_secs(20)));
        // Ten quiet minutes: it starts over, and the old changes are gone.
        assert_eq!(f.change(false, at(700)), None);
        assert_eq!(f.change(true, at(705)), None);
        assert_eq!(f.holds, 0);
    }

    /// "Within two minutes" includes the change exactly two minutes old.
    #[test]
    fn a_change_exactly_two_minutes_old_still_counts() {
        let t0 = Instant::now();
        let flapped = |recovery: u64| {
            let mut f = Flaps::default();
            for (s, up) in [(0, false), (5, true), (10, false)] {
                assert_eq!(f.change(up, t0 + Duration::from_secs(s)), None);
            }
            f.change(true, t0 + Duration::from_secs(recovery))
        };
        assert_eq!(flapped(120), Some(HOLD_BASE));
        assert_eq!(flapped(121), None, "the first change is out of the window");
    }
}

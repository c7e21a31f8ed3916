//! Passive health: ejecting backends that clients cannot reach, judged
//! from the traffic itself. Pure policy, no I/O; the lifecycle feeds it
//! each backend's SYN counters every tick and asks who is ejected.
//!
//! The signal. A client whose SYN gets no SYN-ACK sends the same SYN
//! again (after ~1 s, then 3 s, 7 s...). The datapath counts, per backend,
//! the SYNs sent to it and the retransmissions of SYNs that went to it
//! unanswered (a SYN that finds its own flow's entry still holding only
//! the earlier SYN). A backend whose SYNs are retransmitted far more than
//! its peers' is failing its clients, whatever its probes say: a firewall
//! rule on the service port, a full accept queue, the VIP missing from
//! `lo`, a broken route back.
//!
//! The policy, per VIP, over a sliding `window`: a backend is ejected
//! when it had at least `min_syns` SYNs, its retransmit ratio
//! (retransmits / SYNs) is at least `ratio`, and at least `relative` times
//! the ratio of the VIP's other backends pooled, and the difference is
//! more than chance: Fisher's exact test (one-sided) gives at most
//! [`MAX_CHANCE`] (the tail beyond three standard errors of a normal
//! law) for the VIP's retransmits falling on it as unevenly as they did
//! if every backend were alike. A lossy client network or a SYN flood
//! (spoofed sources never retransmit) moves every backend's ratio alike,
//! so the relative test ejects nobody then; the exact test keeps a small
//! sample (few SYNs in the window, a quiet VIP or a starved client) from
//! ejecting a backend that was merely unlucky: with 30% of SYN-ACKs lost
//! on every path, 8 retried of 16 SYNs against 5 of 32 passes the ratio
//! tests but happens by chance once in 63; a backend dropping every SYN,
//! 10 of 10 against 0 of 20, once in 30 million. The test is exact
//! because the samples it guards are small: the two-proportion z-test
//! used before approximates the tail by a normal law, which at ten or
//! twenty SYNs ejected alike backends several times more often than its
//! nominal rate (about 1 run in 1,500 of the lossy-path test's 12 s in a
//! simulation of it, and once in the suite; the exact test: none in
//! 3,000). Ejected means no
//! new flows, existing connections kept (as draining does). An ejection
//! lasts `ejection` × 2^(n−1) for the n-th in a row, at most
//! `max_ejection`; n decays by one for each `ejection` × 4 without one. At
//! most `max_ejection_percent` of a VIP's backends (at least one of two or
//! more; none at 0) are ejected at once; a backend the cap holds back is
//! named.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

pub use crate::config::passive::PassiveHealth;

/// One backend's passive-health state.
#[derive(Clone, Debug, Default)]
pub struct Passive {
    /// Cumulative `(syns, retransmits)` samples, oldest first, kept over
    /// the window.
    samples: VecDeque<(Instant, u64, u64)>,
    /// Ejected until then.
    pub ejected_until: Option<Instant>,
    /// Ejections in a row (decaying).
    pub ejections: u32,
    /// When the last ejection ended (for the decay).
    released_at: Option<Instant>,
    /// Why it is not ejected although it qualifies, for display.
    pub held_back: Option<Hold>,
}

/// What keeps a backend that qualifies from being ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `max_ejection_percent` of the VIP's backends are ejected.
    Cap,
    /// One more ejection would put the VIP below `panic_threshold`, where
    /// the table takes every backend back, those down by probes too.
    Panic,
}

/// SYNs and retransmits over the window, and their ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    pub syns: u64,
    pub retransmits: u64,
}

/// The most a backend's retransmits may be explained by chance before
/// it is ejected: the one-sided tail of a normal law beyond three
/// standard errors, at most one false ejection in 740 judgements of
/// backends that differ only by chance (Fisher's test is conservative).
pub const MAX_CHANCE: f64 = 0.00135;

/// Terms of the exact test's tail summed at most (each a few flops, some
/// 0.1 ms in all); past them the rest is bounded from above (samples of
/// hundreds of millions of SYNs near the threshold need more).
const MAX_TERMS: u64 = 10_000;

/// How the policy judges a backend's window against its peers' pooled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Judgement {
    /// Too few SYNs to judge, or retried less than `ratio`.
    Fine,
    /// Retried less than `relative` times the others' ratio (given): the
    /// cause is not this backend.
    LikeOthers(f64),
    /// Above both, but the chance of it (given) is more than
    /// [`MAX_CHANCE`]: too few SYNs to tell it from chance.
    Chance(f64),
    /// To eject (within the cap).
    Eject,
}

/// Judges window `w` against `others`, the other backends' pooled.
pub fn judge(settings: &PassiveHealth, w: Window, others: Window) -> Judgement {
    if w.syns < settings.min_syns || w.ratio() < settings.ratio {
        return Judgement::Fine;
    }
    if w.ratio() < settings.relative * others.ratio() {
        return Judgement::LikeOthers(others.ratio());
    }
    match chance(w, others) {
        p if p > MAX_CHANCE => Judgement::Chance(p),
        _ => Judgement::Eject,
    }
}

/// The chance that `one` would get at least as many of the pooled
/// retransmits as it did if its SYNs were retried like `others'`: the
/// one-sided p-value of Fisher's exact test (the hypergeometric tail of
/// drawing `one.syns` of all the SYNs). 1 when either side has no SYN,
/// `one` is retried no more than the others, or the counts overflow.
/// Where the tail is cut short ([`MAX_TERMS`]) the rest is bounded from
/// above: the answer may be too high, never too low (it errs toward
/// keeping the backend).
pub fn chance(one: Window, others: Window) -> f64 {
    // A window's two counters are read apart: never more retried than sent.
    let (n1, r1) = (one.syns, one.retransmits.min(one.syns));
    let (n0, r0) = (others.syns, others.retransmits.min(others.syns));
    let (Some(n), Some(k)) = (n1.checked_add(n0), r1.checked_add(r0)) else {
        return 1.0;
    };
    if n1 == 0 || n0 == 0 || r1 as f64 / n1 as f64 <= r0 as f64 / n0 as f64 {
        return 1.0;
    }
    let ln_choose = |a: u64, b: u64| ln_factorial(a) - ln_factorial(b) - ln_factorial(a - b);
    // P(X = r1), then each next term from the one before. `one`'s ratio
    // is above the pooled mean, so past at most one rising step the terms
    // fall, each by a ratio smaller than the one before.
    let mut term = (ln_choose(k, r1) + ln_choose(n - k, n1 - r1) - ln_choose(n, n1)).exp();
    let (mut sum, mut x, mut ratio) = (0.0, r1, 1.0);
    for _ in 0..MAX_TERMS {
        sum += term;
        if x == k.min(n1) || term <= sum * 1e-12 {
            return sum.min(1.0);
        }
        let (xf, kf, nf, n1f) = (x as f64, k as f64, n as f64, n1 as f64);
        ratio = (kf - xf) * (n1f - xf) / ((xf + 1.0) * (nf - kf - n1f + xf + 1.0));
        term *= ratio;
        x += 1;
    }
    // Cut short: the terms left sum to at most term / (1 − ratio).
    if ratio >= 1.0 {
        return 1.0;
    }
    (sum + term / (1.0 - ratio)).min(1.0)
}

/// ln(n!): summed below 256, Stirling's series above (its first omitted
/// term, 1/(1260 n⁵), is under 10⁻¹⁴ there).
fn ln_factorial(n: u64) -> f64 {
    if n < 256 {
        return (2..=n).map(|i| (i as f64).ln()).sum();
    }
    let x = n as f64;
    x * x.ln() - x + 0.5 * (std::f64::consts::TAU * x).ln() + 1.0 / (12.0 * x)
        - 1.0 / (360.0 * x.powi(3))
}

impl Window {
    pub fn ratio(&self) -> f64 {
        if self.syns == 0 {
            0.0
        } else {
            self.retransmits as f64 / self.syns as f64
        }
    }
}

impl Passive {
    /// Records the backend's cumulative counters at `now`; a counter that
    /// went back (the backend's index was reused) restarts the series.
    pub fn record(&mut self, now: Instant, syns: u64, retransmits: u64, window: Duration) {
        if let Some(&(_, s, r)) = self.samples.back()
            && (syns < s || retransmits < r)
        {
            self.samples.clear();
        }
        self.samples.push_back((now, syns, retransmits));
        // Keep one sample at or before the window's start.
        while self.samples.len() > 2 && self.samples[1].0 <= now.checked_sub(window).unwrap_or(now)
        {
            self.samples.pop_front();
        }
    }

    /// SYNs and retransmits over the window.
    pub fn window(&self) -> Window {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(_, s0, r0)), Some(&(_, s1, r1))) => Window {
                syns: s1 - s0,
                retransmits: r1 - r0,
            },
            _ => Window::default(),
        }
    }

    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|t| now < t)
    }

    /// Time left of the ejection.
    pub fn left(&self, now: Instant) -> Duration {
        self.ejected_until
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    fn eject(&mut self, settings: &PassiveHealth, now: Instant) -> Duration {
        self.decay(settings, now);
        self.ejections = self.ejections.saturating_add(1);
        let factor = 1u32 << (self.ejections - 1).min(16);
        let length = (settings.ejection * factor).min(settings.max_ejection);
        self.ejected_until = Some(now + length);
        // The evidence is spent: the backend starts over when it returns.
        self.samples.clear();
        length
    }

    /// One ejection forgotten per `ejection × 4` since the last one ended.
    fn decay(&mut self, settings: &PassiveHealth, now: Instant) {
        let Some(at) = self.released_at else { return };
        let period = settings.ejection * 4;
        let healthy = now.saturating_duration_since(at);
        let forget = (healthy.as_secs_f64() / period.as_secs_f64()) as u32;
        self.ejections = self.ejections.saturating_sub(forget);
    }
}

/// A change worth a log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Ejected {
        index: usize,
        length: Duration,
        window: Window,
        others: f64,
    },
    Released {
        index: usize,
    },
    HeldBack {
        index: usize,
        window: Window,
        by: Hold,
    },
}

/// Applies the policy to a VIP's backends (each `(state, candidate)`, a
/// candidate being one the table may use: weighted, not drained, not down).
/// `keep` is the fewest candidates that must stay un-ejected: below it the
/// VIP would panic, and a panicking table holds the backends its probes
/// found dead as well, which is worse than ejecting nobody.
pub fn evaluate(
    settings: &PassiveHealth,
    backends: &mut [(&mut Passive, bool)],
    keep: usize,
    now: Instant,
) -> Vec<Event> {
    let mut events = Vec::new();
    for (i, (p, _)) in backends.iter_mut().enumerate() {
        if p.ejected_until.is_some_and(|t| now >= t) {
            p.ejected_until = None;
            p.released_at = Some(now);
            events.push(Event::Released { index: i });
        }
    }
    if !settings.enabled {
        return events;
    }
    let windows: Vec<Window> = backends.iter().map(|(p, _)| p.window()).collect();
    let cap = settings.cap(backends.len());
    let mut ejected = backends.iter().filter(|(p, _)| p.is_ejected(now)).count();
    let mut healthy = backends
        .iter()
        .filter(|(p, candidate)| *candidate && !p.is_ejected(now))
        .count();
    for i in 0..backends.len() {
        let (p, candidate) = &mut backends[i];
        let w = windows[i];
        if !*candidate || p.is_ejected(now) || w.syns < settings.min_syns {
            p.held_back = None;
            continue;
        }
        let pool = pooled(&windows, i);
        let others = pool.ratio();
        let hold = if ejected >= cap {
            Some(Hold::Cap)
        } else if healthy <= keep {
            Some(Hold::Panic)
        } else {
            None
        };
        if judge(settings, w, pool) != Judgement::Eject {
            p.held_back = None;
        } else if let Some(by) = hold {
            if p.held_back != hold {
                events.push(Event::HeldBack {
                    index: i,
                    window: w,
                    by,
                });
            }
            p.held_back = hold;
        } else {
            p.held_back = None;
            let length = p.eject(settings, now);
            ejected += 1;
            healthy -= 1;
            events.push(Event::Ejected {
                index: i,
                length,
                window: w,
                others,
            });
        }
    }
    events
}

/// The windows of every backend but `i`, pooled.
pub fn pooled(windows: &[Window], i: usize) -> Window {
    let (syns, retransmits) = windows
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .fold((0u64, 0u64), |(s, r), (_, w)| {
            (s.saturating_add(w.syns), r.saturating_add(w.retransmits))
        });
    Window { syns, retransmits }
}

#[cfg(test)]
mod tests;

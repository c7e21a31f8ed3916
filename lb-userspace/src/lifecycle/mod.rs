//! Backend lifecycle: from configured weights, probe verdicts and operator
//! drains to what the dataplane should hold. Pure bookkeeping, no I/O; the
//! daemon feeds it events and hands its [`Plan`] to the reconciler.
//!
//! States of a backend of a VIP:
//! - `active`: in the table with its weight;
//! - `slow-start`: in the table, its weight ramping linearly from almost
//!   nothing to full over the VIP's `slow_start` after it joined or
//!   recovered;
//! - `draining` (operator): out of the table, its existing connections kept
//!   through the connection table until `drain_timeout`, then cut (logged
//!   with the number of live flows cut);
//! - `drained`: draining with no live flow left ([`crate::liveflows`]);
//!   its entries are still honoured until `drain_timeout`, in case an idle
//!   connection speaks again;
//! - `down` (probes failed, or a flapping backend held down: see
//!   [`flaps`]): out of the table, its connection-table entries ignored so
//!   its clients re-pick at once;
//! - `ejected` (passive health, [`crate::passive`]: its clients' SYNs go
//!   unanswered): out of the table for new flows, its existing connections
//!   kept (as draining), back after the ejection, slow-starting.
//!
//! Ejected and held-down backends count as unhealthy for the panic
//! threshold, so they never take more than it allows: below it, the table
//! is built from every candidate again.
//!
//! Panic threshold: when fewer than `panic_threshold`% of a VIP's
//! candidates (weight > 0, not drained) are healthy, the table is built from
//! all candidates (fail open: a shared failure of the probes must not take a
//! service down) until enough are healthy again.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, Instant},
};

mod flaps;
mod passive;

use crate::{
    announce::policy::VipCounts,
    config::{VipConfig, VipId},
    health::{ProbeResult, Tracker},
    passive::Passive,
};

pub use self::flaps::Flaps;

/// Configured weights are multiplied by this, so a slow start can ramp in
/// fine steps while shares stay those of the configured weights.
pub const WEIGHT_SCALE: u32 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendState {
    Active,
    SlowStart,
    Draining,
    Drained,
    Down,
    Ejected,
}

/// One backend of one VIP.
#[derive(Clone, Debug)]
pub struct BackendLife {
    /// Start of the slow-start ramp: when it joined or last recovered.
    pub joined: Instant,
    pub drained_since: Option<Instant>,
    /// Probe verdicts; `None` when the backend is not probed.
    pub health: Option<Tracker>,
    pub state: BackendState,
    pub state_since: Instant,
    /// The weight handed to the dataplane (scaled).
    pub effective_weight: u32,
    /// Passive health: SYN counters and ejections.
    pub passive: Passive,
    /// Probe verdict changes, and the hold after flapping.
    pub flaps: Flaps,
    /// Its live flows at the last scan of the connection table (`None`:
    /// not scanned yet).
    pub live_flows: Option<u64>,
    /// Draining on a QUIC VIP: packets went to it within the live-flow
    /// window. Packets routed by connection ID are not in the connection
    /// table, so its live flows alone would call it drained while moved
    /// clients still use it.
    pub quic_traffic: bool,
    /// The end of its drain was logged.
    pub drain_cut: bool,
}

impl BackendLife {
    /// Healthy for the table: probes (if any) say up and no hold.
    fn up(&self, now: Instant) -> bool {
        self.health.as_ref().is_none_or(Tracker::is_up) && !self.flaps.held(now)
    }

    /// Whether passive health judges it (`weighted`: its weight is above
    /// 0): not down, drained or weighted 0.
    pub fn passive_candidate(&self, weighted: bool, now: Instant) -> bool {
        weighted && self.drained_since.is_none() && self.up(now)
    }
}

#[derive(Clone, Debug, Default)]
pub struct VipLife {
    pub panic: bool,
    /// Times this VIP entered panic mode since `lbd` started.
    pub panic_entered: u64,
    pub backends: BTreeMap<IpAddr, BackendLife>,
}

/// What the dataplane should hold now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The VIPs with effective (scaled) weights: 0 leaves the table.
    pub vips: Vec<VipConfig>,
    /// Whether each backend's connection-table entries are honoured.
    pub usable: BTreeMap<(VipId, IpAddr), bool>,
    /// Something changes with time alone (a ramp, a drain timer): plan again
    /// in a second.
    pub pending: bool,
    /// Things worth a log line (panic mode entered or left).
    pub events: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Lifecycle {
    pub vips: BTreeMap<VipId, VipLife>,
}

/// What a probe result changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeEffect {
    /// Nothing anyone else needs to know.
    Nothing,
    /// The probes confirmed the state the backend started in: it now
    /// counts toward announcing its VIP (the table is unchanged).
    FirstVerdict,
    /// The backend went up or down: the table changes.
    Changed,
}

impl Lifecycle {
    /// Aligns the bookkeeping with the configured VIPs and drains. Backends
    /// seen for the first time join now, except at start-up (`initial`),
    /// where they are taken as already serving (no slow start after a
    /// restart of `lbd`). A changed health check restarts the verdicts.
    pub fn sync(
        &mut self,
        vips: &[VipConfig],
        drained: &BTreeSet<(VipId, IpAddr)>,
        now: Instant,
        initial: bool,
    ) {
        let long_ago = now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now);
        self.vips.retain(|id, _| vips.iter().any(|v| v.id == *id));
        for vip in vips {
            let life = self.vips.entry(vip.id).or_default();
            life.backends
                .retain(|addr, _| vip.backends.iter().any(|b| b.address == *addr));
            for b in &vip.backends {
                let check = vip.health_check_of(b);
                let served = !initial && life.backends.contains_key(&b.address);
                let entry = life
                    .backends
                    .entry(b.address)
                    .or_insert_with(|| BackendLife {
                        joined: if initial { long_ago } else { now },
                        drained_since: None,
                        health: None,
                        state: BackendState::Active,
                        state_since: now,
                        effective_weight: 0,
                        passive: Passive::default(),
                        flaps: Flaps::default(),
                        live_flows: None,
                        quic_traffic: false,
                        drain_cut: false,
                    });
                match (check, &entry.health) {
                    (None, _) => entry.health = None,
                    // A backend that served unprobed keeps its standing
                    // until the new check's probes overturn it (`fall`
                    // failures), as a changed check's does: adding a check
                    // must not withdraw a serving VIP until every backend
                    // has passed it once.
                    (Some(c), None) if served => {
                        entry.health = Some(Tracker::continuing(c.rise, c.fall, true, true));
                    }
                    (Some(c), None) => entry.health = Some(Tracker::new(c.rise, c.fall)),
                    (Some(_), Some(_)) => {}
                }
                let is_drained = drained.contains(&(vip.id, b.address));
                match (is_drained, entry.drained_since) {
                    (true, None) => {
                        entry.drained_since = Some(now);
                        // Judged by a scan after the drain began.
                        entry.live_flows = None;
                    }
                    (false, Some(_)) => {
                        entry.drained_since = None;
                        entry.drain_cut = false;
                        entry.joined = now;
                    }
                    _ => {}
                }
            }
        }
    }

    /// At start-up: drains began when the state file says (`began`, seconds
    /// since the Unix epoch; `unix_now` is the clock's now), not now, so a
    /// restart neither starts a drain's `drain_timeout` again nor honours
    /// a cut drain's connection-table entries once more. A drain whose
    /// timeout ran out before this start is over: drained (its flows left
    /// or were cut then), not cut again. Returns how many.
    pub fn backdate_drains(
        &mut self,
        vips: &[VipConfig],
        began: &BTreeMap<(VipId, IpAddr), u64>,
        now: Instant,
        unix_now: u64,
    ) -> usize {
        let mut backdated = 0;
        for vip in vips {
            for b in &vip.backends {
                let Some(at) = began.get(&(vip.id, b.address)) else {
                    continue;
                };
                let Some(l) = self.backend_mut(&vip.id, &b.address) else {
                    continue;
                };
                if l.drained_since.is_none() {
                    continue;
                }
                let age = Duration::from_secs(unix_now.saturating_sub(*at));
                l.drained_since = Some(now.checked_sub(age).unwrap_or(now));
                if age >= vip.drain_timeout {
                    l.state = BackendState::Drained;
                    l.drain_cut = true;
                }
                backdated += 1;
            }
        }
        backdated
    }

    /// At start-up: the backends `down` (as the last `lbd` left them) start
    /// down instead of up, so a backend whose check was failing does not
    /// take new connections while the first probes run. Returns how many.
    pub fn seed_down(&mut self, down: &BTreeSet<(VipId, IpAddr)>) -> usize {
        let mut seeded = 0;
        for (vip, addr) in down {
            if let Some(t) = self.backend_mut(vip, addr).and_then(|b| b.health.as_mut()) {
                t.assume_down();
                seeded += usize::from(!t.is_up());
            }
        }
        seeded
    }

    /// The probed backends whose probes say down now.
    pub fn down(&self) -> BTreeSet<(VipId, IpAddr)> {
        self.vips
            .iter()
            .flat_map(|(id, v)| {
                v.backends
                    .iter()
                    .filter(|(_, b)| b.health.as_ref().is_some_and(|t| !t.is_up()))
                    .map(move |(addr, _)| (*id, *addr))
            })
            .collect()
    }

    /// Restarts the probe streaks of a backend whose check changed; its
    /// current verdict stands until the new check overturns it.
    pub fn reset_health(&mut self, vip: &VipId, addr: &IpAddr, rise: u32, fall: u32) {
        if let Some(b) = self.backend_mut(vip, addr) {
            let up = b.health.as_ref().is_none_or(Tracker::is_up);
            let verdict = b.health.as_ref().is_some_and(Tracker::has_verdict);
            b.health = Some(Tracker::continuing(rise, fall, up, verdict));
        }
    }

    fn backend_mut(&mut self, vip: &VipId, addr: &IpAddr) -> Option<&mut BackendLife> {
        self.vips.get_mut(vip)?.backends.get_mut(addr)
    }

    /// Records a probe result and says what it changed.
    pub fn record_probe(
        &mut self,
        vip: &VipId,
        addr: &IpAddr,
        result: ProbeResult,
        now: Instant,
    ) -> ProbeEffect {
        let Some(b) = self.backend_mut(vip, addr) else {
            return ProbeEffect::Nothing;
        };
        let Some(t) = b.health.as_mut() else {
            return ProbeEffect::Nothing;
        };
        let had_verdict = t.has_verdict();
        match t.record(result) {
            Some(up) => {
                // A held recovery ramps up once the hold ends.
                let hold = b.flaps.change(up, now);
                if up {
                    b.joined = now + hold.unwrap_or_default();
                }
                ProbeEffect::Changed
            }
            None if !had_verdict && t.has_verdict() => ProbeEffect::FirstVerdict,
            None => ProbeEffect::Nothing,
        }
    }

    /// Computes the dataplane input for `vips` at `now`.
    pub fn plan(&mut self, vips: &[VipConfig], now: Instant) -> Plan {
        let mut plan = Plan::default();
        for vip in vips {
            let Some(life) = self.vips.get_mut(&vip.id) else {
                continue;
            };
            let panic = panic_mode(vip, life, now, &mut plan.events);
            let mut eff = vip.clone();
            for (eb, b) in eff.backends.iter_mut().zip(&vip.backends) {
                let Some(l) = life.backends.get_mut(&b.address) else {
                    continue;
                };
                let (state, weight, usable) = backend_plan(vip, b.weight, l, panic, now);
                plan.pending |= matches!(state, BackendState::SlowStart)
                    || (l.drained_since.is_some() && usable)
                    || l.flaps.held(now)
                    || l.passive.is_ejected(now);
                drain_events(vip, b.address, l, state, usable, now, &mut plan.events);
                if state != l.state {
                    l.state = state;
                    l.state_since = now;
                }
                l.effective_weight = weight;
                eb.weight = weight;
                plan.usable.insert((vip.id, b.address), usable);
            }
            plan.vips.push(eff);
        }
        plan
    }
}

/// The log lines of a drain: `drained` reached (once per state change),
/// and `drain_timeout` running out on live flows (once per drain).
fn drain_events(
    vip: &VipConfig,
    addr: IpAddr,
    l: &mut BackendLife,
    state: BackendState,
    usable: bool,
    now: Instant,
    events: &mut Vec<String>,
) {
    let Some(since) = l.drained_since else {
        return;
    };
    let after = now.saturating_duration_since(since).as_secs_f64();
    if state == BackendState::Drained && l.state != BackendState::Drained {
        events.push(format!(
            "VIP {}: backend {addr} drained: no live flows, {after:.0}s after its drain began",
            vip.id
        ));
    }
    if !usable && !l.drain_cut {
        l.drain_cut = true;
        let flows = l
            .live_flows
            .map_or_else(|| "an unknown number of".to_string(), |n| n.to_string());
        if state == BackendState::Draining {
            events.push(format!(
                "VIP {}: backend {addr}: drain_timeout ({:.0}s) ran out with {flows} live flows: cut (their next packets go to other backends)",
                vip.id,
                vip.drain_timeout.as_secs_f64()
            ));
        }
    }
}

/// Whether `vip` is in panic mode now (fewer than `panic_threshold`% of
/// its candidates healthy, ejected and held ones counting as unhealthy);
/// a change is an event.
fn panic_mode(vip: &VipConfig, life: &mut VipLife, now: Instant, events: &mut Vec<String>) -> bool {
    let mut candidates = 0u32;
    let mut healthy = 0u32;
    for b in &vip.backends {
        let Some(l) = life.backends.get(&b.address) else {
            continue;
        };
        if counts_for_panic(b.weight > 0, l) {
            candidates += 1;
            if l.up(now) && !l.passive.is_ejected(now) {
                healthy += 1;
            }
        }
    }
    let panic = healthy < panic_floor(vip.panic_threshold, candidates);
    if panic != life.panic {
        life.panic = panic;
        if panic {
            life.panic_entered += 1;
            events.push(format!(
                "VIP {}: only {healthy} of {candidates} backends are healthy (below {}%): panic mode, the table uses all {candidates}",
                vip.id, vip.panic_threshold
            ));
        } else {
            events.push(format!(
                "VIP {}: {healthy} of {candidates} backends healthy again: panic mode over",
                vip.id
            ));
        }
    }
    panic
}

/// A backend that counts toward the panic threshold: weighted and not
/// drained, up or not.
pub(super) fn counts_for_panic(weighted: bool, l: &BackendLife) -> bool {
    weighted && l.drained_since.is_none()
}

/// The fewest healthy backends of `candidates` that keep a VIP out of
/// panic: `threshold`% of them, rounded up (panic is healthy × 100 <
/// threshold × candidates; none with no candidate).
pub(super) fn panic_floor(threshold: u32, candidates: u32) -> u32 {
    (threshold * candidates).div_ceil(100)
}

/// One backend's state, effective (scaled) weight and whether its
/// connection-table entries are honoured.
fn backend_plan(
    vip: &VipConfig,
    weight: u32,
    l: &BackendLife,
    panic: bool,
    now: Instant,
) -> (BackendState, u32, bool) {
    let full = weight * WEIGHT_SCALE;
    let up = l.up(now);
    if let Some(since) = l.drained_since {
        let keep = now.saturating_duration_since(since) < vip.drain_timeout;
        // Past drain_timeout the state is what it was at the end: a cut
        // drain stays draining though its flows, re-picked, leave it.
        let state = match (keep, l.live_flows) {
            (true, Some(0)) if !l.quic_traffic => BackendState::Drained,
            (false, _) if l.state == BackendState::Drained => BackendState::Drained,
            _ => BackendState::Draining,
        };
        (state, 0, keep)
    } else if panic && weight > 0 {
        let state = if up {
            BackendState::Active
        } else {
            BackendState::Down
        };
        (state, full, true)
    } else if !up {
        (BackendState::Down, 0, false)
    } else if l.passive.is_ejected(now) {
        (BackendState::Ejected, 0, true)
    } else {
        let elapsed = now.saturating_duration_since(l.joined);
        if !vip.slow_start.is_zero() && elapsed < vip.slow_start && weight > 0 {
            let frac = elapsed.as_secs_f64() / vip.slow_start.as_secs_f64();
            let w = ((full as f64 * frac) as u32).max(1);
            (BackendState::SlowStart, w, true)
        } else {
            (BackendState::Active, full, true)
        }
    }
}

impl Lifecycle {
    /// What the announce policy needs of each VIP of `vips`, in order.
    pub fn counts(&self, vips: &[VipConfig]) -> Vec<VipCounts> {
        vips.iter()
            .map(|v| {
                let (usable, awaiting) = usable_backends(v, self.vips.get(&v.id));
                VipCounts {
                    id: v.id,
                    min_healthy: v.min_healthy,
                    backends: v.backends.len() as u32,
                    usable,
                    awaiting,
                }
            })
            .collect()
    }
}

/// Backends of `vip` in its table now, by their states:
/// `(usable, awaiting)`, the second those that would count but await
/// their first probe verdict.
pub fn usable_backends(vip: &VipConfig, life: Option<&VipLife>) -> (u32, u32) {
    let Some(life) = life else {
        return (0, 0);
    };
    let in_table: Vec<_> = vip
        .backends
        .iter()
        .filter(|b| b.weight > 0)
        .filter_map(|b| life.backends.get(&b.address))
        .filter(|l| matches!(l.state, BackendState::Active | BackendState::SlowStart))
        .collect();
    let awaiting = in_table
        .iter()
        .filter(|l| l.health.as_ref().is_some_and(|t| !t.has_verdict()))
        .count() as u32;
    (in_table.len() as u32 - awaiting, awaiting)
}

/// Why none of `vip`'s backends is in its table: counts by cause, e.g.
/// `3 backends: 2 weighted 0, 1 draining`.
pub fn why_unusable(vip: &VipConfig, life: Option<&VipLife>) -> String {
    let mut causes: BTreeMap<&str, u32> = BTreeMap::new();
    for b in &vip.backends {
        let state = life
            .and_then(|l| l.backends.get(&b.address))
            .map(|l| l.state);
        let cause = match state {
            _ if b.weight == 0 => "weighted 0",
            Some(BackendState::Draining | BackendState::Drained) => "draining",
            Some(BackendState::Down) => "down",
            Some(BackendState::Ejected) => "ejected (passive health)",
            _ => "usable",
        };
        *causes.entry(cause).or_default() += 1;
    }
    let list: Vec<String> = causes.iter().map(|(c, n)| format!("{n} {c}")).collect();
    match vip.backends.len() {
        0 => "no backends".into(),
        n => format!("{n} backend(s): {}", list.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, HealthCheck};

    fn check() -> HealthCheck {
        HealthCheck {
            port: None,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 2,
            jitter: 0,
            send: None,
            expect: None,
            http: None,
            through_tunnel: false,
        }
    }

    fn vip(n: usize) -> VipConfig {
        let backends = (1..=n)
            .map(|i| BackendConfig::new(format!("10.1.0.{i}").parse().unwrap(), 1))
            .collect();
        let mut v = VipConfig::new("10.0.0.1:80/tcp".parse().unwrap(), backends);
        v.health_check = Some(check());
        v
    }

    fn addr(i: usize) -> IpAddr {
        format!("10.1.0.{i}").parse().unwrap()
    }

    fn fail() -> ProbeResult {
        ProbeResult {
            ok: false,
            latency_us: 0,
            detail: "refused".into(),
        }
    }

    fn pass() -> ProbeResult {
        ProbeResult {
            ok: true,
            latency_us: 0,
            detail: "connected".into(),
        }
    }

    /// A lifecycle that starts (as `lbd` does) with `v` alone, at `now`.
    fn started(v: &VipConfig, now: Instant) -> Lifecycle {
        let mut l = Lifecycle::default();
        l.sync(std::slice::from_ref(v), &BTreeSet::new(), now, true);
        l
    }

    /// Sets backend `i`'s live flows at the last scan.
    fn set_live_flows(l: &mut Lifecycle, v: &VipConfig, i: usize, n: Option<u64>) {
        let b = l.vips.get_mut(&v.id).unwrap().backends.get_mut(&addr(i));
        b.unwrap().live_flows = n;
    }

    fn weights(p: &Plan) -> Vec<u32> {
        p.vips[0].backends.iter().map(|b| b.weight).collect()
    }

    #[test]
    fn a_failing_backend_goes_down_and_comes_back() {
        let v = vip(3);
        let now = Instant::now();
        let mut l = started(&v, now);
        assert_eq!(
            weights(&l.plan(std::slice::from_ref(&v), now)),
            vec![100, 100, 100]
        );
        assert_eq!(
            l.record_probe(&v.id, &addr(1), pass(), now),
            ProbeEffect::FirstVerdict
        );
        assert_eq!(
            l.record_probe(&v.id, &addr(1), pass(), now),
            ProbeEffect::Nothing
        );
        assert_eq!(
            l.record_probe(&v.id, &addr(2), fail(), now),
            ProbeEffect::Nothing
        );
        assert_eq!(
            l.record_probe(&v.id, &addr(2), fail(), now),
            ProbeEffect::Changed,
            "fall = 2"
        );
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), vec![100, 0, 100]);
        assert!(
            !p.usable[&(v.id, addr(2))],
            "down: its flows re-pick at once"
        );
        assert_eq!(l.vips[&v.id].backends[&addr(2)].state, BackendState::Down);
        l.record_probe(&v.id, &addr(2), pass(), now);
        assert_eq!(
            l.record_probe(&v.id, &addr(2), pass(), now),
            ProbeEffect::Changed,
            "rise = 2"
        );
        assert_eq!(
            weights(&l.plan(std::slice::from_ref(&v), now)),
            vec![100, 100, 100]
        );
    }

    /// `p` has one event, and it says `text`.
    fn said_once(p: &Plan, text: &str) {
        assert!(
            p.events.len() == 1 && p.events[0].contains(text),
            "{text:?} not said once: {:?}",
            p.events
        );
    }

    #[test]
    fn a_drain_ends_drained_when_no_flow_is_left_or_logs_the_flows_it_cuts() {
        let mut v = vip(2);
        v.drain_timeout = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        set_live_flows(&mut l, &v, 1, Some(0));
        let drained = BTreeSet::from([(v.id, addr(1))]);
        l.sync(std::slice::from_ref(&v), &drained, t0, false);
        let state = |l: &Lifecycle| l.vips[&v.id].backends[&addr(1)].state;
        // A count from before the drain does not count: no scan yet.
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(1));
        assert_eq!(state(&l), BackendState::Draining);
        assert!(p.events.is_empty(), "{:?}", p.events);
        set_live_flows(&mut l, &v, 1, Some(4));
        l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(2));
        assert_eq!(state(&l), BackendState::Draining);
        set_live_flows(&mut l, &v, 1, Some(0));
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(3));
        assert_eq!(state(&l), BackendState::Drained);
        assert!(
            p.usable[&(v.id, addr(1))],
            "still honoured until the timeout"
        );
        said_once(&p, "drained: no live flows, 3s after");
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(4));
        assert!(p.events.is_empty(), "said once: {:?}", p.events);
        // Flows again (an idle connection spoke): draining; at the timeout
        // the flows left are cut, and said so once.
        set_live_flows(&mut l, &v, 1, Some(2));
        l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(5));
        assert_eq!(state(&l), BackendState::Draining);
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(11));
        assert!(!p.usable[&(v.id, addr(1))]);
        said_once(&p, "ran out with 2 live flows: cut");
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(12));
        assert!(p.events.is_empty(), "said once: {:?}", p.events);
        // The cut flows go elsewhere and the count falls to 0: the drain
        // was cut, not drained, and stays so.
        set_live_flows(&mut l, &v, 1, Some(0));
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(13));
        assert_eq!(state(&l), BackendState::Draining);
        assert!(p.events.is_empty(), "{:?}", p.events);
    }

    #[test]
    fn drained_backends_keep_their_flows_until_the_timeout() {
        let mut v = vip(2);
        v.drain_timeout = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = Lifecycle::default();
        let drained = BTreeSet::from([(v.id, addr(1))]);
        l.sync(std::slice::from_ref(&v), &drained, t0, true);
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(5));
        assert_eq!(weights(&p), vec![0, 100]);
        assert!(p.usable[&(v.id, addr(1))], "existing flows keep going");
        assert!(p.pending);
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(10));
        assert!(!p.usable[&(v.id, addr(1))], "at drain_timeout they are cut");
        assert_eq!(
            l.vips[&v.id].backends[&addr(1)].state,
            BackendState::Draining
        );
        // Undrain: back in, with a slow start if configured.
        l.sync(
            std::slice::from_ref(&v),
            &BTreeSet::new(),
            t0 + Duration::from_secs(12),
            false,
        );
        assert_eq!(
            weights(&l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(12))),
            vec![100, 100]
        );
    }

    #[test]
    fn slow_start_ramps_a_new_backend_linearly() {
        let mut v = vip(2);
        v.slow_start = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = Lifecycle::default();
        l.sync(&[vip(1)], &BTreeSet::new(), t0, true);
        // Backend 2 joins at t0.
        l.sync(std::slice::from_ref(&v), &BTreeSet::new(), t0, false);
        let at = |s: u64| {
            weights(
                &l.clone()
                    .plan(std::slice::from_ref(&v), t0 + Duration::from_secs(s)),
            )
        };
        assert_eq!(at(0), vec![100, 1]);
        assert_eq!(at(2), vec![100, 20]);
        assert_eq!(at(5), vec![100, 50]);
        assert_eq!(at(10), vec![100, 100]);
        // A backend weighted 0 that joins has nothing to ramp: it stays 0.
        let mut three = vip(3);
        three.slow_start = v.slow_start;
        three.backends[2].weight = 0;
        let mut l3 = l.clone();
        l3.sync(std::slice::from_ref(&three), &BTreeSet::new(), t0, false);
        let p = l3.plan(std::slice::from_ref(&three), t0 + Duration::from_secs(5));
        assert_eq!(weights(&p), vec![100, 50, 0]);
        // At exactly the end of the ramp: active, and nothing left to
        // re-plan for it.
        let mut end = l.clone();
        let p = end.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(10));
        assert!(!p.pending, "the ramp is over at 10 s");
        assert_eq!(
            end.vips[&v.id].backends[&addr(2)].state,
            BackendState::Active
        );
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(5));
        assert!(p.pending);
        assert_eq!(
            l.vips[&v.id].backends[&addr(2)].state,
            BackendState::SlowStart
        );
        assert_eq!(
            l.vips[&v.id].backends[&addr(1)].state,
            BackendState::Active,
            "no slow start at start-up"
        );
    }

    #[test]
    fn recovery_restarts_the_ramp() {
        let mut v = vip(2);
        v.slow_start = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), fail(), t0);
        }
        let t1 = t0 + Duration::from_secs(30);
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), pass(), t1);
        }
        assert_eq!(
            weights(&l.plan(std::slice::from_ref(&v), t1 + Duration::from_secs(5))),
            vec![50, 100]
        );
    }

    #[test]
    fn a_held_recovery_ramps_up_from_the_end_of_its_hold() {
        let mut v = vip(2);
        v.slow_start = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        // Down, up, down, up within two minutes: the fourth change is a
        // recovery held for 10 s, and the ramp starts when the hold ends.
        let mut now = t0;
        for ok in [false, true, false, true] {
            now += Duration::from_secs(1);
            for _ in 0..2 {
                l.record_probe(&v.id, &addr(1), if ok { pass() } else { fail() }, now);
            }
        }
        let at = |s: u64| {
            weights(
                &l.clone()
                    .plan(std::slice::from_ref(&v), now + Duration::from_secs(s)),
            )
        };
        assert_eq!(at(5), vec![0, 100], "held");
        assert_eq!(
            at(15),
            vec![50, 100],
            "half-way up a ramp from the hold's end"
        );
        assert_eq!(at(20), vec![100, 100]);
    }

    #[test]
    fn a_drain_that_ended_drained_stays_drained_past_its_timeout() {
        let mut v = vip(2);
        v.drain_timeout = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        let drained = BTreeSet::from([(v.id, addr(1))]);
        l.sync(std::slice::from_ref(&v), &drained, t0, false);
        set_live_flows(&mut l, &v, 1, Some(0));
        let state = |l: &Lifecycle| l.vips[&v.id].backends[&addr(1)].state;
        l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(1));
        assert_eq!(state(&l), BackendState::Drained);
        let p = l.plan(std::slice::from_ref(&v), t0 + Duration::from_secs(11));
        assert_eq!(state(&l), BackendState::Drained, "not a cut drain");
        assert!(!p.usable[&(v.id, addr(1))]);
    }

    #[test]
    fn why_unusable_counts_each_cause() {
        let mut v = vip(4);
        v.backends[3].weight = 0;
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), fail(), t0);
        }
        let drained = BTreeSet::from([(v.id, addr(2))]);
        l.sync(std::slice::from_ref(&v), &drained, t0, false);
        l.plan(std::slice::from_ref(&v), t0);
        assert_eq!(
            why_unusable(&v, l.vips.get(&v.id)),
            "4 backend(s): 1 down, 1 draining, 1 usable, 1 weighted 0"
        );
        let none = VipConfig::new(v.id, Vec::new());
        assert_eq!(why_unusable(&none, None), "no backends");
        let v = passive_vip(4);
        let mut l = started(&v, t0);
        let now = syn_series(&mut l, &v, &[2], t0);
        l.plan(std::slice::from_ref(&v), now);
        assert_eq!(
            why_unusable(&v, l.vips.get(&v.id)),
            "4 backend(s): 1 ejected (passive health), 3 usable"
        );
    }

    #[test]
    fn panic_mode_fails_open_below_the_threshold() {
        let v = vip(4);
        let now = Instant::now();
        let mut l = started(&v, now);
        let down = |l: &mut Lifecycle, i| {
            for _ in 0..2 {
                l.record_probe(&v.id, &addr(i), fail(), now);
            }
        };
        down(&mut l, 1);
        down(&mut l, 2);
        // 2 of 4 healthy = 50%: not below the default 50%.
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), vec![0, 0, 100, 100]);
        assert!(p.events.is_empty());
        down(&mut l, 3);
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), vec![100, 100, 100, 100], "fail open: all four");
        assert!(p.usable.values().all(|u| *u));
        assert_eq!(p.events.len(), 1);
        assert!(p.events[0].contains("panic mode"), "{:?}", p.events);
        assert!(l.vips[&v.id].panic);
        assert!(
            l.plan(std::slice::from_ref(&v), now).events.is_empty(),
            "logged once"
        );
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), pass(), now);
        }
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), vec![100, 0, 0, 100]);
        assert!(p.events[0].contains("over"));
        assert_eq!(l.vips[&v.id].panic_entered, 1);
    }

    /// Feeds every backend of `v` 10 SYNs in a second, those of `failing`
    /// all retransmitted, applying the policy at each sample.
    fn syn_series(l: &mut Lifecycle, v: &VipConfig, failing: &[usize], t0: Instant) -> Instant {
        let mut now = t0;
        for s in 0..=1u64 {
            now = t0 + Duration::from_secs(s);
            for i in 1..=v.backends.len() {
                let retransmits = if failing.contains(&i) { 10 * s } else { 0 };
                l.record_syns(v, &addr(i), 10 * s, retransmits, now);
            }
            l.evaluate_passive(std::slice::from_ref(v), now);
        }
        now
    }

    fn passive_vip(n: usize) -> VipConfig {
        let mut v = vip(n);
        v.slow_start = Duration::from_secs(10);
        v.passive_health.window = Duration::from_secs(5);
        v.passive_health.min_syns = 10;
        v.passive_health.ejection = Duration::from_secs(5);
        v
    }

    #[test]
    fn ejected_backends_count_as_unhealthy_for_panic_and_slow_start_on_return() {
        let v = passive_vip(4);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), fail(), t0);
        }
        let now = syn_series(&mut l, &v, &[2], t0);
        // One down, one ejected: 2 of 4 healthy, not below 50%.
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(
            l.vips[&v.id].backends[&addr(2)].state,
            BackendState::Ejected
        );
        assert_eq!(weights(&p), vec![0, 0, 100, 100]);
        assert!(p.usable[&(v.id, addr(2))], "ejected: its connections go on");
        assert!(!p.usable[&(v.id, addr(1))], "down: its flows re-pick");
        // A third unhealthy backend: panic, every candidate in the table.
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(3), fail(), now);
        }
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), vec![100, 100, 100, 100], "fail open");
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(3), pass(), now);
        }
        // The ejection (5 s) ends: back, ramping up like a recovery (no
        // SYN reached it meanwhile: retried SYNs re-pick).
        let back = now + Duration::from_secs(6);
        l.record_syns(&v, &addr(2), 10, 10, back);
        l.evaluate_passive(std::slice::from_ref(&v), back);
        l.plan(std::slice::from_ref(&v), back);
        assert_eq!(
            l.vips[&v.id].backends[&addr(2)].state,
            BackendState::SlowStart
        );
        let p = l.plan(std::slice::from_ref(&v), back + Duration::from_secs(5));
        assert_eq!(weights(&p)[1], 50, "half-way through a 10 s slow start");
    }

    /// Ejections stop short of panic: a panicking table takes back the
    /// backends down by probes too, so ejecting past the threshold would
    /// send new flows to dead backends (helper-34). Ten backends, two down
    /// by probes, four retrying: three go, the fourth is held back and
    /// said so, and the dead two stay out of the table.
    #[test]
    fn ejections_stop_short_of_panic_which_would_take_back_the_dead() {
        let v = passive_vip(10);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        for i in [1, 2] {
            for _ in 0..2 {
                l.record_probe(&v.id, &addr(i), fail(), t0);
            }
        }
        let lines = syn_lines(&mut l, &v, &[3, 4, 5, 6], t0);
        let now = t0 + Duration::from_secs(1);
        let p = l.plan(std::slice::from_ref(&v), now);
        let states: Vec<BackendState> = (1..=10)
            .map(|i| l.vips[&v.id].backends[&addr(i)].state)
            .collect();
        let ejected = states
            .iter()
            .filter(|s| **s == BackendState::Ejected)
            .count();
        assert_eq!(ejected, 3, "{states:?}\n{lines:#?}");
        assert!(!l.vips[&v.id].panic, "{lines:#?}");
        assert_eq!(&weights(&p)[..2], &[0, 0], "the dead stay out");
        assert!(
            lines.iter().any(|l| l.contains("below panic_threshold")),
            "{lines:#?}"
        );
    }

    #[test]
    fn a_down_backend_is_not_ejected_and_a_lone_backend_never() {
        let v = passive_vip(2);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        for _ in 0..2 {
            l.record_probe(&v.id, &addr(1), fail(), t0);
        }
        let now = syn_series(&mut l, &v, &[1], t0);
        l.plan(std::slice::from_ref(&v), now);
        assert_eq!(l.vips[&v.id].backends[&addr(1)].state, BackendState::Down);
        let one = passive_vip(1);
        let mut l = started(&one, t0);
        let now = syn_series(&mut l, &one, &[1], t0);
        l.plan(std::slice::from_ref(&one), now);
        assert_eq!(
            l.vips[&one.id].backends[&addr(1)].state,
            BackendState::Active
        );
    }

    /// The lines of [`syn_series`]'s evaluations.
    fn syn_lines(l: &mut Lifecycle, v: &VipConfig, failing: &[usize], t0: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        for s in 0..=1u64 {
            let now = t0 + Duration::from_secs(s);
            for i in 1..=v.backends.len() {
                let retransmits = if failing.contains(&i) { 10 * s } else { 0 };
                l.record_syns(v, &addr(i), 10 * s, retransmits, now);
            }
            lines.extend(l.evaluate_passive(std::slice::from_ref(v), now));
        }
        lines
    }

    /// Only a backend that takes new flows may be ejected: one weighted 0,
    /// one draining or one down is not, however its clients retry. An
    /// ejection is said with its figures.
    #[test]
    fn only_backends_taking_new_flows_are_ejected_and_the_line_says_why() {
        let t0 = Instant::now();
        let ejections = |weight: u32, prepare: &dyn Fn(&mut Lifecycle, &VipConfig)| {
            let mut v = passive_vip(4);
            v.backends[1].weight = weight;
            let mut l = started(&v, t0);
            prepare(&mut l, &v);
            syn_lines(&mut l, &v, &[2], t0)
        };
        let lines = ejections(1, &|_, _| ());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "VIP 10.0.0.1:80/tcp: backend 10.1.0.2 ejected for 5s: 10 of its 10 SYNs were retransmitted (100%"
            ),
            "{lines:?}"
        );
        assert_eq!(ejections(0, &|_, _| ()), Vec::<String>::new(), "weight 0");
        let draining = |l: &mut Lifecycle, v: &VipConfig| {
            let b = l.vips.get_mut(&v.id).unwrap().backends.get_mut(&addr(2));
            b.unwrap().drained_since = Some(t0);
        };
        assert_eq!(ejections(1, &draining), Vec::<String>::new(), "draining");
        let down = |l: &mut Lifecycle, v: &VipConfig| {
            for _ in 0..2 {
                l.record_probe(&v.id, &addr(2), fail(), t0);
            }
        };
        assert_eq!(ejections(1, &down), Vec::<String>::new(), "down");
    }

    /// Panic mode counts the backends that may take new flows: one
    /// weighted 0 or draining is no candidate, healthy or not. Of 3
    /// candidates 1 healthy is below 50%; counting the fourth, 2 of 4
    /// would not be.
    #[test]
    fn panic_mode_counts_only_weighted_undrained_backends() {
        let now = Instant::now();
        let panics = |weight: u32, drained: bool| {
            let mut v = vip(4);
            v.backends[3].weight = weight;
            let mut l = started(&v, now);
            if drained {
                let d = BTreeSet::from([(v.id, addr(4))]);
                l.sync(std::slice::from_ref(&v), &d, now, false);
            }
            for i in 1..=4 {
                let result = if i <= 2 { fail() } else { pass() };
                for _ in 0..2 {
                    l.record_probe(&v.id, &addr(i), result.clone(), now);
                }
            }
            l.plan(std::slice::from_ref(&v), now);
            l.vips[&v.id].panic
        };
        assert!(!panics(1, false), "2 of 4 healthy: not below 50%");
        assert!(panics(0, false), "weight 0: 1 of 3");
        assert!(panics(1, true), "draining: 1 of 3");
    }

    /// Panic mode fails open for the backends that take new flows only: a
    /// backend weighted 0 that is down stays down, and its flows are
    /// re-picked, while a weighted one down is used as if up.
    #[test]
    fn panic_mode_leaves_a_backend_weighted_zero_as_it_is() {
        let now = Instant::now();
        let mut v = vip(4);
        v.backends[3].weight = 0;
        let mut l = started(&v, now);
        for i in [1, 2, 4] {
            for _ in 0..2 {
                l.record_probe(&v.id, &addr(i), fail(), now);
            }
        }
        let p = l.plan(std::slice::from_ref(&v), now);
        assert!(l.vips[&v.id].panic, "1 of 3 candidates healthy");
        assert_eq!(weights(&p), [100, 100, 100, 0]);
        assert!(p.usable[&(v.id, addr(1))], "a candidate, down, in panic");
        assert!(!p.usable[&(v.id, addr(4))], "weighted 0 and down");
        let state = |i| l.vips[&v.id].backends[&addr(i)].state;
        assert_eq!(
            (state(1), state(4)),
            (BackendState::Down, BackendState::Down)
        );
    }

    /// An ejection keeps a re-plan pending, so that its end returns the
    /// backend on time.
    #[test]
    fn an_ejection_keeps_a_replan_pending_a_steady_vip_none() {
        let v = passive_vip(4);
        let t0 = Instant::now();
        let mut l = started(&v, t0);
        let now = syn_series(&mut l, &v, &[2], t0);
        let p = l.plan(std::slice::from_ref(&v), now);
        assert_eq!(weights(&p), [100, 0, 100, 100], "ejected");
        assert!(p.pending);
        // Nothing that changes with time alone: nothing pending.
        let steady = vip(2);
        let mut l = started(&steady, t0);
        assert!(!l.plan(std::slice::from_ref(&steady), t0).pending);
    }

    /// A backend the configuration no longer lists is forgotten, with its
    /// health; the others keep theirs.
    #[test]
    fn backends_no_longer_configured_are_forgotten() {
        let now = Instant::now();
        let three = vip(3);
        let mut l = started(&three, now);
        for _ in 0..2 {
            l.record_probe(&three.id, &addr(1), fail(), now);
        }
        let mut two = three.clone();
        two.backends.pop();
        l.sync(std::slice::from_ref(&two), &BTreeSet::new(), now, false);
        let kept: Vec<IpAddr> = l.vips[&two.id].backends.keys().copied().collect();
        assert_eq!(kept, [addr(1), addr(2)]);
        assert_eq!(weights(&l.plan(std::slice::from_ref(&two), now)), [0, 100]);
    }

    #[test]
    fn unprobed_backends_count_as_healthy() {
        let mut v = vip(2);
        v.health_check = None;
        let now = Instant::now();
        let mut l = started(&v, now);
        assert_eq!(
            l.record_probe(&v.id, &addr(1), fail(), now),
            ProbeEffect::Nothing
        );
        assert_eq!(
            weights(&l.plan(std::slice::from_ref(&v), now)),
            vec![100, 100]
        );
    }
}

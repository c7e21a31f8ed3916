//! The lifecycle's side of passive health: each backend's SYN counters
//! recorded every tick, the policy ([`crate::passive::evaluate`]) applied
//! per VIP, and its changes turned into log lines. An ejection ending is
//! a return: the backend slow-starts as after a recovery.

use std::{net::IpAddr, time::Instant};

use super::Lifecycle;
use crate::{
    config::{VipConfig, VipId},
    passive::{Event, Hold, Passive, evaluate},
};

impl Lifecycle {
    /// Records a backend's cumulative SYN counters at `now`.
    pub fn record_syns(
        &mut self,
        vip: &VipConfig,
        addr: &IpAddr,
        syns: u64,
        retransmits: u64,
        now: Instant,
    ) {
        if let Some(b) = self.backend_mut(&vip.id, addr) {
            b.passive
                .record(now, syns, retransmits, vip.passive_health.window);
        }
    }

    /// Applies the passive-health policy to every VIP of `vips`; returns
    /// the changes in words (the plan changes whenever one is returned).
    pub fn evaluate_passive(&mut self, vips: &[VipConfig], now: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        for vip in vips {
            let Some(life) = self.vips.get_mut(&vip.id) else {
                continue;
            };
            let mut order: Vec<IpAddr> = Vec::new();
            let mut refs: Vec<(&mut Passive, bool)> = Vec::new();
            let mut panic_candidates = 0u32;
            for (addr, l) in life.backends.iter_mut() {
                let weighted = vip
                    .backends
                    .iter()
                    .any(|b| b.address == *addr && b.weight > 0);
                panic_candidates += u32::from(super::counts_for_panic(weighted, l));
                let candidate = l.passive_candidate(weighted, now);
                order.push(*addr);
                refs.push((&mut l.passive, candidate));
            }
            let keep = super::panic_floor(vip.panic_threshold, panic_candidates) as usize;
            let events = evaluate(&vip.passive_health, &mut refs, keep, now);
            for e in events {
                lines.push(describe(&vip.id, &order, &e));
                if let Event::Released { index } = e
                    && let Some(l) = life.backends.get_mut(&order[index])
                {
                    l.joined = now;
                }
            }
        }
        lines
    }
}

fn describe(vip: &VipId, order: &[IpAddr], e: &Event) -> String {
    match e {
        Event::Ejected {
            index,
            length,
            window,
            others,
        } => format!(
            "VIP {vip}: backend {} ejected for {}s: {} of its {} SYNs were retransmitted ({:.0}%; the others' {:.0}%)",
            order[*index],
            length.as_secs(),
            window.retransmits,
            window.syns,
            window.ratio() * 100.0,
            others * 100.0
        ),
        Event::Released { index } => format!(
            "VIP {vip}: backend {} returns after its ejection (slow start)",
            order[*index]
        ),
        Event::HeldBack { index, window, by } => format!(
            "VIP {vip}: backend {} would be ejected ({} of {} SYNs retransmitted) but {}",
            order[*index],
            window.retransmits,
            window.syns,
            match by {
                Hold::Cap => "max_ejection_percent is reached",
                Hold::Panic =>
                    "one more ejection would put the VIP below panic_threshold (its table would take back the backends down by probes too)",
            }
        ),
    }
}

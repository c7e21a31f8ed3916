//! The daemon's side of passive health: every tick, each backend's SYN
//! counters are read from the dataplane into the lifecycle, the policy
//! runs ([`crate::passive`]), and its changes are logged once each.

use super::Daemon;
use crate::dataplane::Dataplane;

impl<D: Dataplane> Daemon<D> {
    /// Passive health's tick: every backend's SYN counters recorded, the
    /// policy applied; `true` if an ejection began or ended (re-plan).
    pub(super) fn passive_tick(&mut self) -> bool {
        let now = std::time::Instant::now();
        let effective = self.effective();
        let syns = self.samples_latest_syns().to_vec();
        for vip in effective.iter().filter(|v| v.passive_health.enabled) {
            let Some(state) = self.reconciler.vips().get(&vip.id) else {
                continue;
            };
            for (addr, b) in &state.backends {
                let index = b.handle & lb_common::consts::BACKEND_INDEX_MASK;
                if let Some(c) = syns.get(index as usize) {
                    self.lifecycle
                        .record_syns(vip, addr, c.syns, c.retransmits, now);
                }
            }
        }
        let lines = self.lifecycle.evaluate_passive(&effective, now);
        for line in &lines {
            tracing::warn!("{line}");
        }
        !lines.is_empty()
    }
}

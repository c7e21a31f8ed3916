//! Where the connection table keeps IPv6 flows, across an upgrade.
//!
//! IPv6 flows are placed by [`lb_common::flow::ct_hash_v6`], a shorter
//! hash than the pinned one that picks backends (an established packet
//! pays for nothing but it). Maps an older version filled hold IPv6 flows
//! at the positions of [`lb_common::flow::hash_v6`]; their config lacks
//! [`CFG_F_CT_V6_SHORT`]. When `lbd` adopts such maps it sets
//! [`CFG_F_CT_V6_LEGACY`]: a missed IPv6 packet then also tries its old
//! position and moves the entry it finds there to its own, so no flow loses
//! its backend. The bit stays for [`CT_V6_LEGACY_SECS`] (again from the
//! start, if `lbd` restarts before that), then goes, and with it the extra
//! lookup on a miss.

use std::time::{Duration, Instant};

use lb_common::{
    DatapathConfig,
    consts::{CFG_F_CT_V6_LEGACY, CFG_F_CT_V6_SHORT, CT_V6_LEGACY_SECS},
};
use tracing::info;

use super::{Reconciler, Result};
use crate::dataplane::Dataplane;

/// How long the legacy lookup stays after adoption.
pub(super) const LEGACY: Duration = Duration::from_secs(CT_V6_LEGACY_SECS);

impl<D: Dataplane> Reconciler<D> {
    /// Marks `cfg` (about to be written) with the IPv6 positions: fresh
    /// maps (`fresh`: no seed yet) place flows by the short hash from the
    /// start; maps an older version filled get the legacy lookup, until
    /// [`LEGACY`] after `now`.
    pub(super) fn mark_ct_v6(&mut self, cfg: &mut DatapathConfig, fresh: bool, now: Instant) {
        if fresh {
            cfg.flags = (cfg.flags | CFG_F_CT_V6_SHORT) & !CFG_F_CT_V6_LEGACY;
            return;
        }
        if cfg.flags & CFG_F_CT_V6_SHORT == 0 {
            info!("adopted maps place IPv6 flows by the older hash: moving them as they are seen");
            cfg.flags |= CFG_F_CT_V6_SHORT | CFG_F_CT_V6_LEGACY;
        }
        if cfg.flags & CFG_F_CT_V6_LEGACY != 0 && self.ct_v6_legacy_until.is_none() {
            self.ct_v6_legacy_until = Some(now + LEGACY);
        }
    }

    /// Clears [`CFG_F_CT_V6_LEGACY`] once its time is up. Returns whether
    /// it did.
    pub fn expire_ct_v6_legacy(&mut self, now: Instant) -> Result<bool> {
        match self.ct_v6_legacy_until {
            Some(until) if now >= until => {}
            _ => return Ok(false),
        }
        let mut cfg = self.dp.config()?;
        cfg.flags &= !CFG_F_CT_V6_LEGACY;
        self.dp.set_config(&cfg)?;
        self.ct_v6_legacy_until = None;
        info!("IPv6 flows of the adopted maps had an hour to move: the legacy lookup is off");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use lb_common::consts::{CFG_F_CT_V6_LEGACY, CFG_F_CT_V6_SHORT};

    use super::*;
    use crate::{
        dataplane::fake::FakeDataplane,
        reconcile::{DatapathSettings, Reconciler, tests::layout},
    };

    fn flags(r: &Reconciler<FakeDataplane>) -> u32 {
        r.dataplane().config().unwrap().flags
    }

    #[test]
    fn fresh_maps_place_ipv6_by_the_short_hash_without_a_legacy_lookup() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(
            flags(&r) & (CFG_F_CT_V6_SHORT | CFG_F_CT_V6_LEGACY),
            CFG_F_CT_V6_SHORT
        );
        assert!(!r.expire_ct_v6_legacy(Instant::now() + LEGACY * 2).unwrap());
    }

    #[test]
    fn older_maps_get_the_legacy_lookup_for_an_hour_even_across_a_restart() {
        // Maps an older version made: a seed, and neither bit.
        let mut dp = FakeDataplane::new(layout());
        let mut cfg = dp.config().unwrap();
        cfg.ct_seed = 0x1234;
        dp.set_config(&cfg).unwrap();
        let start = Instant::now();
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        let both = CFG_F_CT_V6_SHORT | CFG_F_CT_V6_LEGACY;
        assert_eq!(flags(&r) & both, both);
        assert_eq!(r.dataplane().config().unwrap().ct_seed, 0x1234);
        assert!(!r.expire_ct_v6_legacy(start).unwrap());
        // A restart half-way: the bit persists in the maps, and the hour
        // starts again.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & both, both);
        let until = r.ct_v6_legacy_until.expect("an hour from the restart");
        assert!(until >= start + LEGACY);
        assert!(
            !r.expire_ct_v6_legacy(until - Duration::from_secs(1))
                .unwrap()
        );
        assert!(r.expire_ct_v6_legacy(until).unwrap());
        assert_eq!(flags(&r) & both, CFG_F_CT_V6_SHORT);
        // Settings written again never bring it back.
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & both, CFG_F_CT_V6_SHORT);
        assert!(!r.expire_ct_v6_legacy(until + LEGACY).unwrap());
    }
}

//! Where the connection table keeps IPv6 flows, across an upgrade.
//!
//! IPv6 flows are placed by [`lb_common::flow::ct_hash_v6_keyed`] under the
//! box's secret key in `LB_CT_KEY`, so that a client cannot compute a tuple
//! of its own /64 that shares a known flow's bucket and tag. `lbd` writes a
//! random key the first time it meets maps without [`CFG_F_CT_V6_KEYED`]
//! (before the program that reads it is attached) and never changes it
//! while the maps live. Maps an older version filled hold IPv6 flows at
//! the positions of the unkeyed [`lb_common::flow::ct_hash_v6`]. When `lbd`
//! adopts such maps it sets [`CFG_F_CT_V6_LEGACY`] too: a missed IPv6
//! packet then also tries its old position and moves the entry it finds
//! there to its own, so no flow loses its backend. The bit stays for
//! [`CT_V6_LEGACY_SECS`] from the adoption, a deadline kept beside the key
//! (a restart does not start the hour again), then goes, and with it the
//! extra lookup on a miss. A downgrade leaves `CFG_F_CT_V6_KEYED` set (an
//! older `lbd` keeps the bits it does not know) while the older program
//! places IPv6 flows by the unkeyed hash: when `lbd` starts on keyed maps
//! whose attached program does not read their key
//! ([`Reconciler::note_unkeyed_links`]), the legacy lookup comes back for
//! an hour from then, under the same key. Maps of the versions before the unkeyed hash
//! (IPv6 flows at [`lb_common::flow::hash_v6`]'s positions) are not looked
//! up: their established IPv6 flows are picked again once, and keep their
//! backend if Maglev still picks it.

use std::time::{Duration, Instant};

use lb_common::{
    CtKey, DatapathConfig,
    consts::{
        CFG_F_CT_V6_KEYED, CFG_F_CT_V6_LEGACY, CFG_F_CT_V6_SHORT, CT_KEY_WORDS, CT_V6_LEGACY_SECS,
    },
};
use tracing::{info, warn};

use super::{ReconcileError, Reconciler, Result};
use crate::dataplane::Dataplane;

/// How long the legacy lookup stays after adoption.
pub(super) const LEGACY: Duration = Duration::from_secs(CT_V6_LEGACY_SECS);

impl<D: Dataplane> Reconciler<D> {
    /// Keys and marks `cfg` (about to be written) with the IPv6 positions:
    /// maps without [`CFG_F_CT_V6_KEYED`] get a random key first; fresh
    /// maps (`fresh`: no seed yet) place flows by it from the start; maps
    /// an older version filled get the legacy lookup too, for [`LEGACY`]
    /// from their adoption (a restart keeps the deadline, kept in the key's
    /// map), and so do keyed maps an older program ran on
    /// ([`Self::note_unkeyed_links`]), from now. `now` is the monotonic
    /// time the deadline is scheduled in.
    pub(super) fn mark_ct_v6(
        &mut self,
        cfg: &mut DatapathConfig,
        fresh: bool,
        now: Instant,
    ) -> Result<()> {
        let boot = boottime();
        let mut key = self.dp.ct_key()?;
        let keyed = cfg.flags & CFG_F_CT_V6_KEYED != 0;
        let lost = keyed && key.k == [0; CT_KEY_WORDS];
        // An older program ran on keyed maps (a downgrade): its IPv6 flows
        // are at the unkeyed positions, which no key changes.
        let older = std::mem::take(&mut self.ct_v6_unkeyed_links);
        let older_ran = keyed && !older.is_empty();
        if lost {
            warn!(
                "the maps' IPv6 connection-table key is gone (LB_CT_KEY made again?): \
                 a new one; established IPv6 flows are picked again once"
            );
        }
        if cfg.flags & CFG_F_CT_V6_KEYED == 0 || lost {
            key = random_key().map_err(ReconcileError::NoRandomness)?;
            let legacy = !fresh && (!lost || older_ran);
            if legacy {
                key.legacy_until = deadline(boot);
            }
            // Before `CFG_F_CT_V6_KEYED`, which records that the maps' IPv6
            // flows are placed by it (the program that reads it is
            // attached only after these settings are written).
            self.dp.set_ct_key(&key)?;
            cfg.flags |= CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED;
            if !legacy {
                cfg.flags &= !CFG_F_CT_V6_LEGACY;
                return Ok(());
            }
            info!(
                "adopted maps place IPv6 flows by the unkeyed hash of an older version: \
                 moving them to the keyed positions as they are seen, for an hour"
            );
            cfg.flags |= CFG_F_CT_V6_LEGACY;
        }
        if older_ran && !lost {
            warn!(
                interfaces = ?older,
                "an older version's program ran on these maps (a downgrade) and placed IPv6 \
                 flows by the unkeyed hash: moving them to the keyed positions as they are \
                 seen, for an hour"
            );
            key.legacy_until = deadline(boot);
            self.dp.set_ct_key(&key)?;
            cfg.flags |= CFG_F_CT_V6_LEGACY;
            self.ct_v6_legacy_until = Some(now + LEGACY);
        }
        if cfg.flags & CFG_F_CT_V6_LEGACY != 0 && self.ct_v6_legacy_until.is_none() {
            // No deadline recorded (not one of ours): the hour is over.
            let left = Duration::from_nanos(key.legacy_until.saturating_sub(boot));
            self.ct_v6_legacy_until = Some(now + left.min(LEGACY));
        }
        Ok(())
    }

    /// Records that the program attached at `links` (before this `lbd`
    /// attaches its own) does not read the maps' key: an older version's,
    /// which placed IPv6 flows unkeyed. The next settings write on keyed
    /// maps turns the legacy lookup on for [`LEGACY`] from then.
    pub fn note_unkeyed_links(&mut self, links: Vec<String>) {
        self.ct_v6_unkeyed_links = links;
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

/// `CLOCK_BOOTTIME` in nanoseconds: the clock of [`CtKey::legacy_until`],
/// which pinned maps share with every `lbd` of the same boot.
fn boottime() -> u64 {
    crate::liveflows::clock_ns(libc::CLOCK_BOOTTIME)
}

/// The legacy lookup's deadline for maps adopted at `boot`.
fn deadline(boot: u64) -> u64 {
    boot.saturating_add(LEGACY.as_nanos() as u64).max(1)
}

/// A key from the kernel's random source (`getrandom(2)`, which needs no
/// `/dev`): independent words, as NH's bound asks. There is no fallback:
/// a key derived from the time could be found offline from the GUE
/// source ports and flow labels the tunnels carry.
fn random_key() -> std::io::Result<CtKey> {
    let mut bytes = [0u8; CT_KEY_WORDS * 4];
    fill(&mut bytes, getrandom)?;
    let mut key = CtKey::default();
    for (word, b) in key.k.iter_mut().zip(bytes.chunks_exact(4)) {
        *word = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    }
    Ok(key)
}

/// Fills `buf` from `read` (which returns how many bytes it wrote at the
/// start of the slice it is given), through short reads and interrupted
/// calls. A read of nothing is an error, not a loop without end.
fn fill(
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match read(&mut buf[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One `getrandom(2)` call into `buf`.
#[allow(unsafe_code)]
fn getrandom(buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use lb_common::consts::{
        CFG_F_CT_V6_KEYED, CFG_F_CT_V6_LEGACY, CFG_F_CT_V6_SHORT, CFG_F_TRACE,
    };

    use super::*;
    use crate::{
        dataplane::fake::FakeDataplane,
        reconcile::{DatapathSettings, Reconciler, tests::layout},
    };

    const ALL: u32 = CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED | CFG_F_CT_V6_LEGACY;

    fn flags(r: &Reconciler<FakeDataplane>) -> u32 {
        r.dataplane().config().unwrap().flags
    }

    fn key(r: &Reconciler<FakeDataplane>) -> CtKey {
        r.dataplane().ct_key().unwrap()
    }

    #[test]
    fn fresh_maps_place_ipv6_by_a_random_key_without_a_legacy_lookup() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED);
        let first = key(&r);
        assert!(first.k.iter().all(|&w| w != 0), "random words: {first:x?}");
        assert!(!r.expire_ct_v6_legacy(Instant::now() + LEGACY * 2).unwrap());
        // Written again, and by a restart: the key stays (every IPv6 flow
        // is where it put it).
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(key(&r), first);
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(key(&r), first);
        assert_eq!(flags(&r) & ALL, CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED);
        // Another box's maps get another key.
        let mut other = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        other.apply_settings(&DatapathSettings::default()).unwrap();
        assert_ne!(key(&other), first);
    }

    #[test]
    fn older_maps_get_a_key_and_the_legacy_lookup_for_an_hour_even_across_a_restart() {
        // Maps the version before made: a seed, the unkeyed IPv6 positions.
        let mut dp = FakeDataplane::new(layout());
        let mut cfg = dp.config().unwrap();
        cfg.ct_seed = 0x1234;
        cfg.flags = CFG_F_CT_V6_SHORT;
        dp.set_config(&cfg).unwrap();
        let start = Instant::now();
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, ALL);
        assert_eq!(r.dataplane().config().unwrap().ct_seed, 0x1234);
        let keyed = key(&r);
        assert_ne!(keyed, CtKey::default());
        assert!(!r.expire_ct_v6_legacy(start).unwrap());
        let until = r.ct_v6_legacy_until.expect("an hour from the adoption");
        assert!(until >= start + LEGACY && until <= Instant::now() + LEGACY);
        // A restart 50 minutes on (the deadline moved back by hand): the
        // bits and the key persist in the maps, and so does the deadline.
        let mut dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut moved = dp.ct_key().unwrap();
        moved.legacy_until -= 50 * 60 * 1_000_000_000;
        dp.set_ct_key(&moved).unwrap();
        let restart = Instant::now();
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, ALL);
        assert_eq!(key(&r).k, keyed.k, "the key is never changed on live maps");
        let until = r.ct_v6_legacy_until.expect("what is left of the hour");
        let left = until - restart;
        assert!(
            left <= Duration::from_secs(600) && left >= Duration::from_secs(590),
            "{left:?} left, not the hour again"
        );
        assert!(
            !r.expire_ct_v6_legacy(until - Duration::from_secs(1))
                .unwrap()
        );
        assert!(r.expire_ct_v6_legacy(until).unwrap());
        let kept = CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED;
        assert_eq!(flags(&r) & ALL, kept);
        // Settings written again never bring it back.
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, kept);
        assert_eq!(key(&r).k, keyed.k);
        assert!(!r.expire_ct_v6_legacy(until + LEGACY).unwrap());
    }

    #[test]
    fn keyed_maps_an_older_program_ran_on_get_the_legacy_lookup_again_under_their_key() {
        // A keyed box, its hour long over.
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        let keyed = key(&r);
        let kept = CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED;
        assert_eq!(flags(&r) & ALL, kept);
        // Downgraded, then upgraded again: the older lbd kept the bits it
        // did not know, and its program placed IPv6 flows unkeyed.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        r.note_unkeyed_links(vec!["eth0".into()]);
        let start = Instant::now();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, ALL, "the legacy lookup is back");
        let now = key(&r);
        assert_eq!(
            now.k, keyed.k,
            "under the same key: keyed flows stay where they are"
        );
        assert!(
            now.legacy_until > boottime(),
            "a deadline kept for a restart"
        );
        let until = r.ct_v6_legacy_until.expect("an hour from this start");
        assert!(until >= start + LEGACY && until <= Instant::now() + LEGACY);
        // Noted once: a later write (a reload) leaves the hour as it is.
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(r.ct_v6_legacy_until, Some(until));
        assert_eq!(key(&r), now);
        assert!(r.expire_ct_v6_legacy(until).unwrap());
        assert_eq!(flags(&r) & ALL, kept);
        // A start whose links all read the key changes nothing.
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        r.note_unkeyed_links(Vec::new());
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, kept);
        assert!(r.ct_v6_legacy_until.is_none());
    }

    /// What the older program is taken for depends on the maps: on maps
    /// from before the key (every link runs a program without it) the
    /// first adoption's legacy hour, said once, not a downgrade; on keyed
    /// maps whose key was lost, the legacy lookup still (the older
    /// program's flows are at the unkeyed positions, which need no key).
    #[test]
    fn an_older_program_on_unkeyed_or_keyless_maps_is_no_downgrade_but_still_looked_up() {
        const DOWNGRADE: &str = "an older version's program ran on these maps";
        crate::test_logs::capture();
        let mut dp = FakeDataplane::new(layout());
        let mut cfg = dp.config().unwrap();
        cfg.ct_seed = 0x1234;
        cfg.flags = CFG_F_CT_V6_SHORT;
        dp.set_config(&cfg).unwrap();
        let mut r = Reconciler::adopt(dp).unwrap();
        r.note_unkeyed_links(vec!["eth0".into()]);
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(flags(&r) & ALL, ALL);
        assert!(crate::test_logs::lines(DOWNGRADE).is_empty());
        assert_eq!(
            crate::test_logs::lines("adopted maps place IPv6 flows").len(),
            1
        );
        // Keyed maps whose key is gone, and an older program in the link.
        let mut dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        dp.set_ct_key(&CtKey::default()).unwrap();
        let mut r = Reconciler::adopt(dp).unwrap();
        r.note_unkeyed_links(vec!["eth0".into()]);
        let start = Instant::now();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        assert_eq!(
            flags(&r) & ALL,
            ALL,
            "the older program's flows are looked up"
        );
        assert_ne!(key(&r).k, [0; CT_KEY_WORDS]);
        let until = r.ct_v6_legacy_until.expect("an hour from this start");
        assert!(until >= start + LEGACY && until <= Instant::now() + LEGACY);
    }

    #[test]
    fn a_key_is_read_through_short_reads_and_interruptions_and_errors_named() {
        use std::io::{Error, ErrorKind};
        let mut buf = [0u8; 10];
        let mut calls = 0;
        let script = |b: &mut [u8]| {
            calls += 1;
            match calls {
                1 => Err(Error::from(ErrorKind::Interrupted)),
                _ => {
                    let n = b.len().min(3);
                    b[..n].fill(calls as u8);
                    Ok(n)
                }
            }
        };
        fill(&mut buf, script).unwrap();
        assert_eq!(buf, [2, 2, 2, 3, 3, 3, 4, 4, 4, 5]);
        assert_eq!(calls, 5);
        let e = fill(&mut buf, |_| Err(Error::from_raw_os_error(libc::ENOSYS))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
        let e = fill(&mut buf, |_| Ok(0)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
        // The kernel's own: ten keys, no two alike, no word all zero.
        let keys: Vec<CtKey> = (0..10).map(|_| random_key().unwrap()).collect();
        for (i, k) in keys.iter().enumerate() {
            assert!(keys[..i].iter().all(|o| o.k != k.k));
            assert_eq!(k.legacy_until, 0);
        }
    }

    #[test]
    fn a_lost_key_is_replaced_loudly_without_a_legacy_lookup() {
        // Keyed maps whose `LB_CT_KEY` was made again (all zero): a zero key
        // has collisions anyone can compute, and the flows its loss
        // scattered are not anywhere a lookup could find.
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        let first = key(&r);
        r.dataplane_mut().set_ct_key(&CtKey::default()).unwrap();
        // A legacy bit left from before goes with the lost key.
        let mut cfg = r.dataplane().config().unwrap();
        cfg.flags |= CFG_F_CT_V6_LEGACY;
        r.dataplane_mut().set_config(&cfg).unwrap();
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let mut r = Reconciler::adopt(dp).unwrap();
        r.apply_settings(&DatapathSettings::default()).unwrap();
        let again = key(&r);
        assert!(again.k.iter().all(|&w| w != 0), "{again:x?}");
        assert_ne!(again.k, first.k);
        assert_eq!(flags(&r) & ALL, CFG_F_CT_V6_SHORT | CFG_F_CT_V6_KEYED);
        assert_eq!(flags(&r) & CFG_F_TRACE, 0, "no other bit set");
        assert!(r.ct_v6_legacy_until.is_none());
    }
}

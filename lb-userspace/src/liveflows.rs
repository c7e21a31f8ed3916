//! Live flows per backend, from a read-only scan of the connection table:
//! the entries of a backend whose stamp says they were seen within
//! [`IDLE_WINDOW`]. A stamp holds 14 bits of `jiffies >> 6` (see
//! `lb_common::consts::CT_STAMP_TIME`), so an entry's age is the current
//! tick minus its own, modulo 16,384 ticks; the current tick comes from
//! the kernel's `jiffies` (`/proc/timer_list`) and the tick's length from
//! two readings of it a few seconds apart (HZ, snapped to 100, 250, 300
//! or 1000).
//!
//! The age wraps: an entry idle for 70 minutes (HZ=250) looks fresh again
//! for one window (plus [`AHEAD_TICKS`]). For a backend being drained that would hold off
//! `drained` by phantom flows, so the entries of watched backends once
//! seen idle are remembered (bounded by [`MAX_REMEMBERED`]) until their
//! stamp changes; scans come every few seconds, far more often than an
//! age can wrap. Other backends' counts are for display and may include
//! such a phantom for one window.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::BufRead as _,
    time::Instant,
};

use lb_common::{
    FlowBucket, FlowEntry,
    consts::{CT_STAMP_TICK_SHIFT, CT_STAMP_TIME},
};

/// A flow seen within this long is live.
pub const IDLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// A stamp up to this many ticks ahead of the tick read before the scan
/// was written during the scan (the datapath goes on): it is fresh, not
/// 16,000 ticks old.
const AHEAD_TICKS: u16 = 64;

/// At most this many idle entries of watched backends are remembered
/// (about 40 bytes each in the map: 40 MiB).
pub const MAX_REMEMBERED: usize = 1 << 20;

/// The kernel's `jiffies`, from the first `jiffies:` line of
/// `/proc/timer_list` (after CPU 0's timers: read by line, at most 65,536
/// lines). Needs root; `None` where it is hidden (some container
/// profiles), and then no count.
pub fn jiffies() -> Option<u64> {
    let file = std::fs::File::open("/proc/timer_list").ok()?;
    std::io::BufReader::new(file)
        .lines()
        .take(65_536)
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("jiffies:")?.trim().parse().ok())
}

/// What `lbd` says (its log at start, `lbctl status`) when it could not
/// learn the kernel's HZ.
pub const HZ_UNKNOWN: &str = "the kernel's HZ is unknown (no readable CONFIG_HZ in /boot/config-<release>, and /proc/timer_list unreadable or its jiffies uneven for a second): the datapath's windows stay as the pinned maps had them, or in fresh maps 240 ticks of protection for a live flow's entry and 40 for a recent SYN, 61 s and 10 s at HZ=250 but a quarter of that at HZ=1000";

/// The values Linux offers for `CONFIG_HZ` (x86 offers 100, 250, 300
/// and 1000; Arm also 200 and 500), which a measured rate is snapped to.
const HZ_CHOICES: [u32; 6] = [100, 200, 250, 300, 500, 1000];

/// How long [`kernel_hz`] watches `jiffies` when the kernel's build
/// configuration does not say.
const HZ_MEASURE: std::time::Duration = std::time::Duration::from_secs(1);

/// `clock` (`CLOCK_MONOTONIC`: `bpf_ktime_get_ns`'s; `CLOCK_BOOTTIME`)
/// in nanoseconds.
#[allow(unsafe_code)]
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// The kernel's HZ and where it was learnt: `CONFIG_HZ` in the running
/// kernel's build configuration (`/boot/config-<release>`, as Debian,
/// Ubuntu and RHEL install it), else measured over [`HZ_MEASURE`] from
/// two readings of [`jiffies`] and taken if within 8% of one of
/// [`HZ_CHOICES`]. Over a whole second a reading must lag its clock by
/// some 80 ms more than the other (a stall on a busy host) to leave the
/// band of 250 or 300 (they are 20% apart): then no answer, and only past
/// some 100 ms a wrong one. `None` where neither answers. Blocks for up to
/// [`HZ_MEASURE`]: `lbd` runs it beside the program's verification.
pub fn kernel_hz() -> Option<(u32, String)> {
    let release = crate::dataplane::kernel_release();
    let path = format!("/boot/config-{release}");
    if !release.is_empty()
        && let Some(hz) = config_hz(&path)
    {
        return Some((hz, path));
    }
    let (t0, j0) = (Instant::now(), jiffies()?);
    std::thread::sleep(HZ_MEASURE);
    let (t1, j1) = (Instant::now(), jiffies()?);
    let rate = j1.wrapping_sub(j0) as f64 / t1.duration_since(t0).as_secs_f64();
    let hz = snap_hz(rate)?;
    Some((hz, format!("measured: {rate:.0} jiffies a second")))
}

/// The one of [`HZ_CHOICES`] within 8% of a measured `rate`, if any.
fn snap_hz(rate: f64) -> Option<u32> {
    HZ_CHOICES
        .into_iter()
        .find(|hz| (rate / f64::from(*hz) - 1.0).abs() <= 0.08)
}

/// `CONFIG_HZ` of a kernel build configuration at `path`, if it is a
/// rate a kernel can tick at (10 to 10,000; at most 100,000 lines read).
fn config_hz(path: &str) -> Option<u32> {
    let file = std::fs::File::open(path).ok()?;
    std::io::BufReader::new(file)
        .lines()
        .take(100_000)
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("CONFIG_HZ=")?.trim().parse().ok())
        .filter(|hz| (10..=10_000).contains(hz))
}

/// Where `jiffies` is read from: the kernel ([`jiffies`]), or in tests a
/// clock the test moves.
#[derive(Clone, Debug, Default)]
pub enum Jiffies {
    #[default]
    Kernel,
    #[cfg(test)]
    Set(std::sync::Arc<std::sync::atomic::AtomicU64>),
}

impl Jiffies {
    /// The current `jiffies`, if it can be read.
    pub fn read(&self) -> Option<u64> {
        match self {
            Self::Kernel => jiffies(),
            #[cfg(test)]
            Self::Set(j) => Some(j.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }
}

/// The kernel's tick rate, learnt from two readings of `jiffies`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    first: Option<(Instant, u64)>,
    hz: Option<u32>,
}

impl Clock {
    /// A clock that knows HZ from the start when `hz` is given
    /// ([`kernel_hz`]).
    pub fn knowing(hz: Option<u32>) -> Self {
        Self { first: None, hz }
    }

    /// Records a reading; after two seconds, HZ is known.
    pub fn observe(&mut self, at: Instant, jiffies: u64) {
        let Some((t0, j0)) = self.first else {
            self.first = Some((at, jiffies));
            return;
        };
        let secs = at.saturating_duration_since(t0).as_secs_f64();
        if self.hz.is_none() && secs >= 2.0 {
            let rate = jiffies.wrapping_sub(j0) as f64 / secs;
            self.hz = HZ_CHOICES.into_iter().min_by(|a, b| {
                (f64::from(*a) - rate)
                    .abs()
                    .total_cmp(&(f64::from(*b) - rate).abs())
            });
        }
    }

    /// The window in stamp ticks; until HZ is known, that of HZ=1000
    /// (the longest: a flow is rather counted than missed).
    pub fn window_ticks(&self) -> u16 {
        let hz = f64::from(self.hz.unwrap_or(1000));
        let ticks = IDLE_WINDOW.as_secs_f64() * hz / f64::from(1u32 << CT_STAMP_TICK_SHIFT);
        (ticks.ceil() as u16).clamp(1, CT_STAMP_TIME / 2)
    }

    pub fn hz(&self) -> Option<u32> {
        self.hz
    }

    /// `ticks` stamp ticks in seconds, once the tick rate is known.
    pub fn secs_of(&self, ticks: u16) -> Option<f64> {
        let hz = f64::from(self.hz?);
        Some(f64::from(ticks) * f64::from(1u32 << CT_STAMP_TICK_SHIFT) / hz)
    }
}

/// How many ticks ago a way stamped `stamp` was seen, at tick `now`
/// (modulo 16,384 ticks; a stamp written after `now` was read is 0).
pub fn age_ticks(now: u16, stamp: u16) -> u16 {
    let age = now.wrapping_sub(stamp & CT_STAMP_TIME) & CT_STAMP_TIME;
    if CT_STAMP_TIME - age < AHEAD_TICKS {
        0
    } else {
        age
    }
}

/// The stamp tick of `jiffies`.
pub fn tick_of(jiffies: u64) -> u16 {
    (jiffies >> CT_STAMP_TICK_SHIFT) as u16 & CT_STAMP_TIME
}

/// Counts live flows per backend handle over a scan, remembering the idle
/// entries of watched handles between scans.
#[derive(Debug, Default)]
pub struct LiveFlows {
    /// (bucket index, way) → (entry, stamp) seen idle.
    idle: HashMap<(u32, u8), (u64, u16)>,
}

impl LiveFlows {
    /// Starts a scan at tick `now`: feed it every bucket in index order
    /// with [`Scan::bucket`], then [`Scan::finish`].
    pub fn scan<'a>(&'a mut self, now: u16, window: u16, watched: &'a BTreeSet<u32>) -> Scan<'a> {
        Scan {
            flows: self,
            now,
            window,
            watched,
            index: 0,
            counts: BTreeMap::new(),
            seen: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.idle.len()
    }
}

/// One scan of the table (see [`LiveFlows::scan`]).
pub struct Scan<'a> {
    flows: &'a mut LiveFlows,
    now: u16,
    window: u16,
    watched: &'a BTreeSet<u32>,
    index: u32,
    counts: BTreeMap<u32, u64>,
    /// The idle entries of watched handles this scan saw.
    seen: HashMap<(u32, u8), (u64, u16)>,
}

impl Scan<'_> {
    pub fn bucket(&mut self, bucket: &FlowBucket) {
        for (way, (entry, stamp)) in bucket.entries.iter().zip(bucket.stamps).enumerate() {
            if *entry == FlowEntry::EMPTY {
                continue;
            }
            let key = (self.index, way as u8);
            let age = age_ticks(self.now, stamp);
            let watched = self.watched.contains(&entry.handle());
            let known_idle = watched && self.flows.idle.get(&key) == Some(&(entry.0, stamp));
            if age < self.window && !known_idle {
                *self.counts.entry(entry.handle()).or_default() += 1;
            } else if watched && self.seen.len() < MAX_REMEMBERED {
                self.seen.insert(key, (entry.0, stamp));
            }
        }
        self.index += 1;
    }

    /// Live flows per handle (handles without any are absent).
    pub fn finish(self) -> BTreeMap<u32, u64> {
        self.flows.idle = self.seen;
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn bucket(ways: &[(u32, u16)]) -> FlowBucket {
        let mut b = FlowBucket::default();
        for (i, (handle, stamp)) in ways.iter().enumerate() {
            b.entries[i] = FlowEntry::new(7 + i as u32, *handle);
            b.stamps[i] = *stamp;
        }
        b
    }

    /// `CONFIG_HZ` read from a build configuration as kernels install
    /// it; a value Linux does not offer, or none, is no answer.
    #[test]
    fn config_hz_is_read_from_the_build_configuration() {
        let dir = crate::scratch::ScratchDir::new("config-hz");
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path.to_string_lossy().into_owned()
        };
        let debian = "# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\n# CONFIG_HZ_1000 is not set\nCONFIG_HZ=250\nCONFIG_SCHED_HRTICK=y\n";
        assert_eq!(config_hz(&file("debian", debian)), Some(250));
        assert_eq!(
            config_hz(&file("rhel", "CONFIG_HZ_1000=y\nCONFIG_HZ=1000\n")),
            Some(1000)
        );
        assert_eq!(config_hz(&file("arm", "CONFIG_HZ=200\n")), Some(200));
        assert_eq!(config_hz(&file("mips", "CONFIG_HZ=1024\n")), Some(1024));
        assert_eq!(config_hz(&file("odd", "CONFIG_HZ=0\n")), None);
        assert_eq!(config_hz(&file("odder", "CONFIG_HZ=99999\n")), None);
        assert_eq!(config_hz(&file("none", "CONFIG_HZ_250=y\n")), None);
        assert_eq!(config_hz(&dir.join("missing").to_string_lossy()), None);
    }

    /// On this machine's kernel: an answer Linux offers, and, where the
    /// build configuration is not installed and `/proc/timer_list` can be
    /// read (root), the measured one agrees with a second measurement
    /// over a whole second.
    #[test]
    fn the_kernel_hz_is_one_linux_offers() {
        // Three tries: a stall of 80 ms in one second's measurement on a
        // busy host gives no answer (never a wrong one below some 100 ms).
        let Some((hz, from)) = (0..3).find_map(|_| kernel_hz()) else {
            assert!(jiffies().is_none(), "jiffies readable, yet no HZ");
            return;
        };
        assert!((10..=10_000).contains(&hz), "{hz} from {from}");
        let (t0, j0) = (Instant::now(), jiffies().expect("HZ was learnt"));
        std::thread::sleep(std::time::Duration::from_secs(1));
        let (t1, j1) = (Instant::now(), jiffies().expect("HZ was learnt"));
        let rate = (j1 - j0) as f64 / t1.duration_since(t0).as_secs_f64();
        assert!(
            (rate / f64::from(hz) - 1.0).abs() < 0.2,
            "{hz} ({from}) against {rate:.0} jiffies a second"
        );
    }

    /// Measured rates snap to the HZ within 8%, and between bands to none.
    #[test]
    fn a_measured_rate_snaps_to_a_tick_rate_linux_offers() {
        for (rate, want) in [
            (99.0, Some(100)),
            (231.0, Some(250)),
            (269.0, Some(250)),
            (273.0, None),
            (277.0, Some(300)),
            (212.0, Some(200)),
            (520.0, Some(500)),
            (960.0, Some(1000)),
            (700.0, None),
            (0.0, None),
        ] {
            assert_eq!(snap_hz(rate), want, "{rate} jiffies a second");
        }
    }

    /// A clock told HZ at start (what `lbd` learnt for the datapath's
    /// windows) knows it before any reading; one told nothing learns it.
    #[test]
    fn a_clock_told_the_tick_rate_knows_it_at_once() {
        let c = Clock::knowing(Some(250));
        assert_eq!((c.hz(), c.window_ticks()), (Some(250), 40));
        assert_eq!(Clock::knowing(None).hz(), None);
    }

    #[test]
    fn the_tick_rate_is_learnt_from_two_readings() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        c.observe(t0, 4_294_000_000);
        assert_eq!(c.hz(), None);
        assert_eq!(
            c.window_ticks(),
            157,
            "HZ=1000 until known: 10 s of 64 ms ticks"
        );
        // 2.5 s at 250 Hz.
        c.observe(t0 + Duration::from_millis(2500), 4_294_000_625);
        assert_eq!(c.hz(), Some(250));
        assert_eq!(c.window_ticks(), 40, "10 s of 256 ms ticks");
        assert_eq!(tick_of(64 * 16_385), 1, "14 bits of jiffies >> 6");
    }

    #[test]
    fn live_flows_are_entries_seen_within_the_window() {
        // Two backends (handles 1, 2); tick 1000, window 40.
        let mut flows = LiveFlows::default();
        let none = BTreeSet::new();
        let class = 3 << 14;
        let mut scan = flows.scan(1000, 40, &none);
        scan.bucket(&bucket(&[(1, 999 | class), (1, 961), (1, 960), (2, 1000)]));
        // 16,383 is 1,001 ticks before 1,000 (modulo 16,384).
        scan.bucket(&bucket(&[(2, 16_383), (1, 1001)]));
        let counts = scan.finish();
        // 999 and 961 are within 40 ticks; 960 is not; 1001 was written
        // after the tick was read (the scan takes time): live, not 16,383
        // ticks old.
        assert_eq!(counts.get(&1), Some(&3));
        assert_eq!(counts.get(&2), Some(&1), "1000, not 16,383 (1,001 old)");
    }

    #[test]
    fn a_watched_entry_seen_idle_stays_idle_until_its_stamp_changes() {
        let mut flows = LiveFlows::default();
        let watched = BTreeSet::from([1]);
        let idle = bucket(&[(1, 100)]);
        let mut scan = flows.scan(1000, 40, &watched);
        scan.bucket(&idle);
        assert!(scan.finish().is_empty());
        assert_eq!(flows.remembered(), 1);
        // 16,384 ticks later its age wraps to "fresh": still idle.
        let mut scan = flows.scan(110, 40, &watched);
        scan.bucket(&idle);
        assert!(scan.finish().is_empty(), "a wrapped age is no flow");
        // An unwatched backend's wrapped entry counts (display only).
        let unwatched = BTreeSet::new();
        let mut scan = flows.scan(110, 40, &unwatched);
        scan.bucket(&idle);
        assert_eq!(scan.finish().get(&1), Some(&1));
        // A packet: the stamp changes, the flow is live again.
        let mut scan = flows.scan(120, 40, &watched);
        scan.bucket(&bucket(&[(1, 119)]));
        assert_eq!(scan.finish().get(&1), Some(&1));
        assert_eq!(flows.remembered(), 0);
    }
}

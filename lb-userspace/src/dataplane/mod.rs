//! The dataplane interface: everything userspace writes to or reads from the
//! XDP program's maps goes through [`Dataplane`].
//!
//! Two implementations: [`kernel::KernelDataplane`] (the real maps, through
//! aya) and [`fake::FakeDataplane`] (in memory, for unit tests of the logic
//! above it). Tests of the datapath itself program the real maps through the
//! kernel implementation, never by hand.
//!
//! This module also owns the *layout*: the sizes fixed when the maps are
//! created, and where each VIP's two table halves live.

pub mod fake;
pub mod kernel;
mod mmap;

use lb_common::{
    AltChunk, BackendDef, CounterValue, DatapathConfig, FlowBucket, TraceFilter, VipFilter, VipKey,
    VipMeta,
    consts::{MAX_BACKENDS, SC_MAX_ALTERNATES, TABLE_CHUNK_SLOTS, VIP_F_NO_BACKENDS},
    counters::COUNTER_SLOTS,
};
use thiserror::Error;

use crate::maglev;

#[derive(Debug, Error)]
pub enum DataplaneError {
    #[error("invalid layout: {0}")]
    Layout(String),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("{what} {index} out of range (limit {limit})")]
    OutOfRange {
        what: &'static str,
        index: u32,
        limit: u32,
    },
    #[error("table has {got} slots, the layout says {want}")]
    TableSize { got: usize, want: u32 },
    #[error(
        "pinned maps under {dir} were created with {found}, this configuration needs {wanted}; remove the pin directory (this drops the connection table) or restore the old sizes"
    )]
    LayoutMismatch {
        dir: String,
        found: String,
        wanted: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = DataplaneError> = std::result::Result<T, E>;

/// Sizes fixed when the maps are created. Changing any of them means new
/// maps (and an empty connection table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Maglev table size M (prime).
    pub table_size: u32,
    /// Most VIPs at once (each owns two table halves).
    pub max_vips: u32,
    /// Most backends at once, all VIPs together (≤ 65,536).
    pub max_backends: u32,
    /// Connection-table buckets (power of two), each holding 6 flows.
    pub ct_buckets: u32,
    /// Most VIPs with second chance at once: each owns one region of
    /// `LB_ALTERNATES` (M × 12 bytes: 786 KB at M = 65537).
    pub second_chance_vips: u32,
}

/// One slot's alternates: backend handles, 0 after the last.
pub type AltSlot = [u32; SC_MAX_ALTERNATES];

impl Default for Layout {
    fn default() -> Self {
        Self {
            table_size: maglev::DEFAULT_TABLE_SIZE,
            max_vips: 64,
            max_backends: 4096,
            ct_buckets: 1 << 18,
            second_chance_vips: DEFAULT_SECOND_CHANCE_VIPS,
        }
    }
}

/// Default [`Layout::second_chance_vips`]: 6.3 MB of alternates at the
/// default table size, whether or not a VIP uses them.
pub const DEFAULT_SECOND_CHANCE_VIPS: u32 = 8;

impl Layout {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(DataplaneError::Layout(m));
        if !maglev::is_prime(self.table_size) {
            return bad(format!("table size {} is not prime", self.table_size));
        }
        if self.table_size > maglev::MAX_TABLE_SIZE {
            return bad(format!(
                "table size {} is larger than the maximum, {}",
                self.table_size,
                maglev::MAX_TABLE_SIZE
            ));
        }
        if self.max_vips == 0 {
            return bad("max_vips must be at least 1".into());
        }
        if self.max_backends == 0 || self.max_backends > MAX_BACKENDS {
            return bad(format!(
                "max_backends {} must be in 1..={MAX_BACKENDS}",
                self.max_backends
            ));
        }
        if !self.ct_buckets.is_power_of_two() {
            return bad(format!(
                "connection-table buckets {} must be a power of two",
                self.ct_buckets
            ));
        }
        if (self.max_vips as u64) * 2 * self.table_chunks() as u64 > u32::MAX as u64 {
            return bad("max_vips × table size is too large".into());
        }
        if self.second_chance_vips > u16::MAX as u32 {
            return bad(format!(
                "second_chance_vips {} must be at most {}",
                self.second_chance_vips,
                u16::MAX
            ));
        }
        Ok(())
    }

    /// Elements of `LB_ALTERNATES`: a region of `table_chunks` per
    /// second-chance VIP (at least one element: a map cannot be empty).
    pub fn alt_map_entries(&self) -> u32 {
        (self.second_chance_vips * self.table_chunks()).max(1)
    }

    /// First chunk of alternates region `index`.
    pub fn alt_base(&self, index: u16) -> u32 {
        index as u32 * self.table_chunks()
    }

    /// Chunks per table half.
    pub fn table_chunks(&self) -> u32 {
        self.table_size.div_ceil(TABLE_CHUNK_SLOTS)
    }

    /// Elements of `LB_TABLES`.
    pub fn table_map_entries(&self) -> u32 {
        self.max_vips * 2 * self.table_chunks()
    }

    /// Entries of `LB_VIPS`: each VIP, plus its address's ICMP key and its
    /// address and protocol's fragment key.
    pub fn vip_keys(&self) -> u32 {
        self.max_vips * lb_common::consts::VIP_KEYS_PER_VIP
    }

    /// First chunk of half `half` (0 or 1) of VIP `vip_id`'s table region.
    pub fn half_base(&self, vip_id: u32, half: u32) -> u32 {
        (vip_id * 2 + half) * self.table_chunks()
    }

    /// Which half `meta.table_base` points at.
    pub fn active_half(&self, meta: &VipMeta) -> u32 {
        u32::from(meta.table_base != self.half_base(meta.vip_id, 0))
    }

    /// Bytes of kernel memory per map (values only; the kernel adds a little).
    pub fn map_bytes(&self, ncpus: usize) -> Vec<(&'static str, u64)> {
        use lb_common::consts::*;
        let per_cpu = ncpus as u64;
        vec![
            (MAP_VIPS, self.vip_keys() as u64 * (20 + 16 + 48)),
            (MAP_BACKENDS, self.max_backends as u64 * 32),
            (
                MAP_TABLES,
                self.table_map_entries() as u64 * TABLE_CHUNK_SLOTS as u64 * 4,
            ),
            (MAP_FLOWS, self.ct_buckets as u64 * 64),
            (MAP_COUNTERS, COUNTER_SLOTS as u64 * 16 * per_cpu),
            (MAP_VIP_STATS, self.max_vips as u64 * 16 * per_cpu),
            (MAP_BACKEND_STATS, self.max_backends as u64 * 16 * per_cpu),
            (MAP_VIP_FILTER, 8 * lb_common::VIP_FILTER_WORDS as u64),
            (
                MAP_ALTERNATES,
                self.alt_map_entries() as u64 * std::mem::size_of::<AltChunk>() as u64,
            ),
        ]
    }

    /// The connection-table fields of a [`DatapathConfig`] for this layout.
    pub fn apply_to(&self, cfg: &mut DatapathConfig) {
        cfg.table_size = self.table_size;
        cfg.table_chunks = self.table_chunks();
        cfg.ct_mask = self.ct_buckets - 1;
    }
}

/// Counter values summed over CPUs.
pub type Counters = Vec<CounterValue>;

/// Reads and writes of the XDP program's maps.
pub trait Dataplane {
    fn layout(&self) -> Layout;

    fn config(&self) -> Result<DatapathConfig>;
    fn set_config(&mut self, cfg: &DatapathConfig) -> Result<()>;

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>>;
    fn vip(&self, key: &VipKey) -> Result<Option<VipMeta>>;
    /// Inserts or replaces a VIP; a replacement is atomic for packets.
    fn upsert_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<()>;
    fn remove_vip(&mut self, key: &VipKey) -> Result<()>;

    fn backend(&self, index: u32) -> Result<BackendDef>;
    fn set_backend(&mut self, index: u32, def: &BackendDef) -> Result<()>;

    /// Writes `chunks` whole chunks of handles starting at chunk `base`
    /// (`slots.len()` ≤ `chunks × 1024`; the rest of the last chunk is 0).
    fn write_table(&mut self, base: u32, slots: &[u32]) -> Result<()>;
    /// Reads `len` slots starting at chunk `base`.
    fn read_table(&self, base: u32, len: u32) -> Result<Vec<u32>>;

    /// Writes whole chunks of second-chance alternates starting at chunk
    /// `base` of `LB_ALTERNATES` (the rest of the last chunk is 0).
    fn write_alternates(&mut self, base: u32, slots: &[AltSlot]) -> Result<()>;
    /// Reads `len` slots of alternates starting at chunk `base`.
    fn read_alternates(&self, base: u32, len: u32) -> Result<Vec<AltSlot>>;

    /// All `LB_COUNTERS` slots, summed over CPUs, indexed by counter id.
    fn counters(&self) -> Result<Counters>;
    fn vip_stats(&self, vip_id: u32) -> Result<lb_common::CounterValue>;
    fn backend_stats(&self, index: u32) -> Result<lb_common::CounterValue>;
    /// Zeroes a VIP id's counters on every CPU (before the id is reused:
    /// a new VIP must not inherit the old one's packets).
    fn clear_vip_stats(&mut self, vip_id: u32) -> Result<()>;
    /// Zeroes a backend index's counters on every CPU (before reuse).
    fn clear_backend_stats(&mut self, index: u32) -> Result<()>;

    fn flow_bucket(&self, index: u32) -> Result<FlowBucket>;
    fn set_flow_bucket(&mut self, index: u32, bucket: &FlowBucket) -> Result<()>;

    /// Visits every connection-table bucket once, in index order (a
    /// snapshot per bucket, not of the table: the datapath goes on
    /// writing).
    fn scan_flows(&self, visit: &mut dyn FnMut(&FlowBucket)) -> Result<()> {
        for index in 0..self.layout().ct_buckets {
            visit(&self.flow_bucket(index)?);
        }
        Ok(())
    }

    /// Writes the filter of a trace (`LB_TRACE`); the datapath reads it
    /// only while `CFG_F_TRACE` is set.
    fn set_trace_filter(&mut self, filter: &TraceFilter) -> Result<()>;

    /// Runs the traced program (`lb_xdp_trace`) on the attached
    /// interfaces, or the plain one. Nothing to do where nothing is
    /// attached.
    fn select_program(&mut self, trace: bool) -> Result<()> {
        let _ = trace;
        Ok(())
    }

    fn vip_filter(&self) -> Result<VipFilter>;
    fn set_vip_filter(&mut self, filter: &VipFilter) -> Result<()>;

    /// Rewrites the VIP filter from the VIPs in the map, if it changed.
    /// Call after adding VIPs (a VIP is reachable once its bit is set) and
    /// after removing them.
    fn sync_vip_filter(&mut self) -> Result<bool> {
        let mut filter = VipFilter::default();
        for (key, _) in self.vips()? {
            filter.insert(&key);
        }
        if self.vip_filter()? == filter {
            return Ok(false);
        }
        self.set_vip_filter(&filter)?;
        Ok(true)
    }

    /// Publishes `slots` (backend handles, `M` of them) as the VIP's table:
    /// writes the inactive half in full, then replaces the VIP's metadata so
    /// that it points at that half. Packets see the old table or the new
    /// one, never a mix. `None` publishes the "no backend" state.
    fn publish_table(
        &mut self,
        key: &VipKey,
        meta: &mut VipMeta,
        slots: Option<&[u32]>,
    ) -> Result<()> {
        let layout = self.layout();
        match slots {
            Some(slots) => {
                if slots.len() != layout.table_size as usize {
                    return Err(DataplaneError::TableSize {
                        got: slots.len(),
                        want: layout.table_size,
                    });
                }
                let next = 1 - layout.active_half(meta);
                let base = layout.half_base(meta.vip_id, next);
                self.write_table(base, slots)?;
                meta.table_base = base;
                meta.flags &= !VIP_F_NO_BACKENDS;
            }
            None => meta.flags |= VIP_F_NO_BACKENDS,
        }
        self.upsert_vip(key, meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_do_not_overlap() {
        let l = Layout {
            table_size: 2053,
            max_vips: 3,
            ..Layout::default()
        };
        l.validate().unwrap();
        assert_eq!(l.table_chunks(), 3);
        let mut seen = std::collections::BTreeSet::new();
        for vip in 0..3 {
            for half in 0..2 {
                let base = l.half_base(vip, half);
                for c in base..base + l.table_chunks() {
                    assert!(c < l.table_map_entries());
                    assert!(seen.insert(c), "chunk {c} used twice");
                }
            }
        }
    }

    #[test]
    fn layout_rejects_bad_sizes() {
        let ok = Layout::default();
        ok.validate().unwrap();
        for bad in [
            Layout {
                table_size: 65_536,
                ..ok
            },
            Layout { max_vips: 0, ..ok },
            Layout {
                max_backends: 70_000,
                ..ok
            },
            Layout {
                ct_buckets: 1000,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn publish_flips_halves_and_no_backend_state() {
        let mut dp = fake::FakeDataplane::new(Layout {
            table_size: 13,
            max_vips: 2,
            max_backends: 8,
            ct_buckets: 4,
            second_chance_vips: 1,
        });
        let key = VipKey::new("10.0.0.1".parse().unwrap(), 80, 6);
        let mut meta = VipMeta {
            vip_id: 1,
            table_base: dp.layout().half_base(1, 0),
            ..Default::default()
        };
        dp.publish_table(&key, &mut meta, Some(&[7; 13])).unwrap();
        assert_eq!(dp.layout().active_half(&meta), 1);
        assert_eq!(dp.vip(&key).unwrap(), Some(meta));
        assert_eq!(dp.read_table(meta.table_base, 13).unwrap(), vec![7; 13]);
        dp.publish_table(&key, &mut meta, Some(&[9; 13])).unwrap();
        assert_eq!(dp.layout().active_half(&meta), 0);
        dp.publish_table(&key, &mut meta, None).unwrap();
        assert_ne!(dp.vip(&key).unwrap().unwrap().flags & VIP_F_NO_BACKENDS, 0);
        assert!(dp.publish_table(&key, &mut meta, Some(&[1; 12])).is_err());
    }
}

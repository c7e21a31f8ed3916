//! The dataplane interface: everything userspace writes to or reads from the
//! XDP program's maps goes through [`Dataplane`].
//!
//! Two implementations: [`KernelDataplane`] (the real maps, through aya)
//! and `fake::FakeDataplane` (in memory, compiled for unit tests of the
//! logic above it). Tests of the datapath itself program the real maps through the
//! kernel implementation, never by hand.
//!
//! This module also owns the *layout*: the sizes fixed when the maps are
//! created; [`pool`] says where each VIP's two table halves live.

pub(crate) mod batch;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod kernel;
mod link;
mod mmap;
pub(crate) mod pool;
pub(crate) mod verifier;

pub use self::{
    batch::{read_per_cpu_into, zero_array},
    kernel::{KernelDataplane, TracedProgram, pinned_table_sizes},
    verifier::{Rejection, kernel_release},
};

use lb_common::{
    AltChunk, BackendDef, CounterValue, DatapathConfig, FlowBucket, TraceFilter, VipFilter, VipKey,
    VipMeta,
    consts::{MAX_BACKENDS, SC_MAX_ALTERNATES, VIP_F_NO_BACKENDS},
    counters::COUNTER_SLOTS,
    quic::QuicServerKey,
};
use thiserror::Error;

use self::pool::{Region, half_chunks};
use crate::maglev;

/// Reads connection-table buckets by index (see
/// [`Dataplane::with_flow_reader`]).
pub type BucketReader<'a> = &'a dyn Fn(u32) -> FlowBucket;

#[derive(Debug, Error)]
pub enum DataplaneError {
    #[error("invalid layout: {0}")]
    Layout(String),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// Built with `LB_EBPF=stub` (`cargo xtask test --unit`): no program
    /// to load.
    #[error(
        "this build carries no eBPF programs (built with LB_EBPF=stub, for unit tests): build without it to load them"
    )]
    NoObjects,
    /// The kernel's verifier refused a program: the message is short,
    /// the whole log is in [`verifier::Rejection::log`].
    #[error("{0}")]
    Verifier(Box<verifier::Rejection>),
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
        "pinned maps under {dir} were created with {found}, this configuration needs {wanted}; restore the old sizes, or stop lbd and run `lbd teardown` (detaches the program, removes the pins, drops the connection table) before starting with the new ones"
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
    /// The default Maglev table size M (prime): of every VIP that does not
    /// set its own.
    pub table_size: u32,
    /// Most VIPs at once.
    pub max_vips: u32,
    /// Most backends at once, all VIPs together (≤ 65,536).
    pub max_backends: u32,
    /// Connection-table buckets (power of two), each holding 6 flows.
    pub ct_buckets: u32,
    /// Chunks of `LB_TABLES` (1,024 slots, 4 KiB each) that the VIPs'
    /// tables share, each VIP taking two halves of its own size; 0: room
    /// for `max_vips` VIPs of `table_size`, the map's size before per-VIP
    /// sizes (so maps pinned by an older `lbd` are adopted).
    pub table_pool: u32,
    /// Most VIPs with second chance at once: each owns one region of
    /// `LB_ALTERNATES` (ceil(M / 1024) chunks of 12 KiB: 799 KB at M = 65537).
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
            table_pool: 0,
            second_chance_vips: DEFAULT_SECOND_CHANCE_VIPS,
        }
    }
}

/// Most chunks `LB_TABLES` may have: 16 GiB of tables.
pub const MAX_POOL_CHUNKS: u32 = 1 << 22;
/// Most bytes `LB_ALTERNATES` may take: 16 GiB, as the table pool.
pub const MAX_ALTERNATES_BYTES: u64 = 16 << 30;
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
        let pool = self.pool_chunks_wide();
        if pool > MAX_POOL_CHUNKS as u64 {
            return bad(format!(
                "the table pool of {pool} chunks ({} MiB) is larger than the maximum, {} MiB; set table_pool_mib",
                (pool * pool::CHUNK_BYTES) >> 20,
                (MAX_POOL_CHUNKS as u64 * pool::CHUNK_BYTES) >> 20
            ));
        }
        if pool < pool::region_chunks(self.table_size) as u64 {
            return bad(format!(
                "the table pool of {pool} chunks cannot hold even one table of table_size {}",
                self.table_size
            ));
        }
        if self.second_chance_vips > u16::MAX as u32 {
            return bad(format!(
                "second_chance_vips {} must be at most {}",
                self.second_chance_vips,
                u16::MAX
            ));
        }
        let alternates = self.alternates_bytes();
        if alternates > MAX_ALTERNATES_BYTES {
            return bad(format!(
                "second_chance_vips {} at table_size {} need {} MiB of alternates, more than the maximum, {} MiB; lower either",
                self.second_chance_vips,
                self.table_size,
                alternates >> 20,
                MAX_ALTERNATES_BYTES >> 20
            ));
        }
        Ok(())
    }

    /// Bytes of `LB_ALTERNATES` (kernel memory whether or not a VIP uses
    /// second chance), computed wide: a careless `second_chance_vips` and
    /// `table_size` ask for terabytes.
    fn alternates_bytes(&self) -> u64 {
        self.second_chance_vips as u64
            * self.table_chunks() as u64
            * std::mem::size_of::<AltChunk>() as u64
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

    /// Chunks per table half of the default size.
    pub fn table_chunks(&self) -> u32 {
        half_chunks(self.table_size)
    }

    fn pool_chunks_wide(&self) -> u64 {
        match self.table_pool {
            0 => self.max_vips as u64 * pool::region_chunks(self.table_size) as u64,
            n => n as u64,
        }
    }

    /// Chunks of the table pool: elements of `LB_TABLES`.
    pub fn pool_chunks(&self) -> u32 {
        self.pool_chunks_wide().min(u32::MAX as u64) as u32
    }

    /// Elements of `LB_TABLES`.
    pub fn table_map_entries(&self) -> u32 {
        self.pool_chunks()
    }

    /// The Maglev table size of an `LB_VIPS` entry (its own, or the
    /// default for one written before per-VIP sizes).
    pub fn vip_table_size(&self, meta: &VipMeta) -> u32 {
        meta.maglev_size(self.table_size)
    }

    /// The region of an `LB_VIPS` entry, and which half is live.
    pub fn region_of(&self, meta: &VipMeta) -> (Region, u32) {
        Region::of(meta, self.table_size)
    }

    /// Entries of `LB_VIPS`: each VIP, plus its address's ICMP key and its
    /// address and protocol's fragment key.
    pub fn vip_keys(&self) -> u32 {
        self.max_vips * lb_common::consts::VIP_KEYS_PER_VIP
    }

    /// Bytes of kernel memory per map (values only; the kernel adds a little).
    pub fn map_bytes(&self, ncpus: usize) -> Vec<(&'static str, u64)> {
        use lb_common::consts::*;
        let per_cpu = ncpus as u64;
        vec![
            (MAP_VIPS, self.vip_keys() as u64 * (20 + 16 + 48)),
            (MAP_BACKENDS, self.max_backends as u64 * 32),
            (MAP_QUIC_SERVERS, self.max_backends as u64 * (24 + 4 + 48)),
            (
                MAP_TABLES,
                self.table_map_entries() as u64 * pool::CHUNK_BYTES,
            ),
            (MAP_FLOWS, self.ct_buckets as u64 * 64),
            (MAP_COUNTERS, COUNTER_SLOTS as u64 * 16 * per_cpu),
            (MAP_VIP_STATS, self.max_vips as u64 * 16 * per_cpu),
            (MAP_VIP_RETIRED, self.max_vips as u64 * 16),
            (MAP_BACKEND_STATS, self.max_backends as u64 * 16 * per_cpu),
            (MAP_BACKEND_SYNS, self.max_backends as u64 * 16 * per_cpu),
            (MAP_SYNS, SYN_SLOTS as u64 * 16),
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
    /// The tier's hash key in `LB_HASH_KEY` (read by the datapath only
    /// while `CFG_F_HASH_KEY` is set); `[0, 0]` in a build without it.
    fn hash_key(&self) -> Result<[u64; 2]>;
    fn set_hash_key(&mut self, key: &[u64; 2]) -> Result<()>;
    /// The box's key of the IPv6 connection-table hash in `LB_CT_KEY`;
    /// all zero in a build without it.
    fn ct_key(&self) -> Result<lb_common::CtKey>;
    fn set_ct_key(&mut self, key: &lb_common::CtKey) -> Result<()>;

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>>;
    fn vip(&self, key: &VipKey) -> Result<Option<VipMeta>>;
    /// Inserts or replaces a VIP; a replacement is atomic for packets.
    fn upsert_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<()>;
    fn remove_vip(&mut self, key: &VipKey) -> Result<()>;

    fn backend(&self, index: u32) -> Result<BackendDef>;
    fn set_backend(&mut self, index: u32, def: &BackendDef) -> Result<()>;

    /// Every QUIC-LB server ID in `LB_QUIC_SERVERS` and its backend
    /// handle (none in a build without the map).
    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, u32)>>;
    /// Points a server ID at a backend handle.
    fn set_quic_server(&mut self, key: &QuicServerKey, handle: u32) -> Result<()>;
    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<()>;

    /// Every backend entry, index by index (the reconciler reads them all
    /// when it adopts pinned maps). The kernel implementation reads them
    /// in one batch syscall: 65,536 lookups took minutes under emulation.
    fn all_backends(&self) -> Result<Vec<BackendDef>> {
        (0..self.layout().max_backends)
            .map(|i| self.backend(i))
            .collect()
    }

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
    /// A VIP id's packets that no live backend counts: those the datapath
    /// did not forward, and those of backends that left (see
    /// [`Dataplane::add_vip_retired`]). The VIP's total adds its live
    /// backends' [`Dataplane::backend_stats`].
    fn vip_stats(&self, vip_id: u32) -> Result<lb_common::CounterValue>;
    /// Adds a leaving backend's counters to its VIP's.
    fn add_vip_retired(&mut self, vip_id: u32, counts: lb_common::CounterValue) -> Result<()>;
    fn backend_stats(&self, index: u32) -> Result<lb_common::CounterValue>;
    /// Zeroes a VIP id's counters on every CPU (before the id is reused:
    /// a new VIP must not inherit the old one's packets).
    fn clear_vip_stats(&mut self, vip_id: u32) -> Result<()>;
    /// Zeroes a backend index's counters on every CPU (before reuse).
    fn clear_backend_stats(&mut self, index: u32) -> Result<()>;
    /// A backend index's SYNs and retransmitted SYNs, summed over CPUs
    /// (zero for a program without them).
    fn backend_syns(&self, index: u32) -> Result<lb_common::SynCounts>;

    /// Every VIP id's counters (index: VIP id), summed over CPUs. The
    /// kernel reads each array in one syscall; the daemon samples them
    /// every second, whatever the number of VIPs and backends.
    fn all_vip_stats(&self) -> Result<Vec<CounterValue>> {
        (0..self.layout().max_vips)
            .map(|i| self.vip_stats(i))
            .collect()
    }

    /// Every backend index's counters (index: backend index).
    fn all_backend_stats(&self) -> Result<Vec<CounterValue>> {
        (0..self.layout().max_backends)
            .map(|i| self.backend_stats(i))
            .collect()
    }

    /// Every backend index's SYN counts (index: backend index).
    fn all_backend_syns(&self) -> Result<Vec<lb_common::SynCounts>> {
        (0..self.layout().max_backends)
            .map(|i| self.backend_syns(i))
            .collect()
    }

    fn flow_bucket(&self, index: u32) -> Result<FlowBucket>;
    /// The recent-SYN slot of the flow at connection-table bucket index
    /// `bucket_index` (before masking by the table's size).
    fn syn_slot(&self, bucket_index: u32) -> Result<lb_common::SynSlot>;
    /// Writes the recent-SYN slot of `bucket_index` (tests age a SYN).
    fn set_syn_slot(&mut self, bucket_index: u32, slot: &lb_common::SynSlot) -> Result<()>;
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

    /// Lends `read` a reader of connection-table buckets by index, for
    /// lookups of many flows at once (`lbctl conns --client`): through
    /// the read-only mapping on a kernel. An index past the table, or a
    /// bucket that cannot be read, reads as empty.
    fn with_flow_reader(&self, read: &mut dyn FnMut(BucketReader<'_>)) -> Result<()> {
        read(&|index| self.flow_bucket(index).unwrap_or_default());
        Ok(())
    }

    /// Writes the filter of a trace (`LB_TRACE`); the datapath reads it
    /// only while `CFG_F_TRACE` is set.
    fn set_trace_filter(&mut self, filter: &TraceFilter) -> Result<()>;

    /// The traced build is still being verified apart (`lbd` does that
    /// once it serves): a trace must wait. Never, for a dataplane that
    /// verifies it when asked.
    fn tracing_pending(&self) -> bool {
        false
    }

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

    /// Publishes `slots` (backend handles, the VIP's `M` of them) as the
    /// VIP's table: writes the inactive half of its region in full, then
    /// replaces the VIP's metadata so that it points at that half. Packets
    /// see the old table or the new one, never a mix. `None` publishes the
    /// "no backend" state.
    fn publish_table(
        &mut self,
        key: &VipKey,
        meta: &mut VipMeta,
        slots: Option<&[u32]>,
    ) -> Result<()> {
        let layout = self.layout();
        // `meta` changes only once the entry is written: a caller that
        // published again after a failure would otherwise write the half
        // packets are reading.
        let mut next = *meta;
        match slots {
            Some(slots) => {
                let want = layout.vip_table_size(&next);
                if slots.len() != want as usize {
                    return Err(DataplaneError::TableSize {
                        got: slots.len(),
                        want,
                    });
                }
                let (region, live) = layout.region_of(&next);
                self.write_table(region.half_base(1 - live), slots)?;
                region.point(&mut next, 1 - live);
                next.flags &= !VIP_F_NO_BACKENDS;
            }
            None => next.flags |= VIP_F_NO_BACKENDS,
        }
        self.upsert_vip(key, &next)?;
        *meta = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pool_is_the_fixed_layout_of_before() {
        let l = Layout {
            table_size: 2053,
            max_vips: 3,
            ..Layout::default()
        };
        l.validate().unwrap();
        assert_eq!(l.table_chunks(), 3);
        // Three VIPs of two 3-chunk halves, as pinned by older versions.
        assert_eq!(l.table_map_entries(), 18);
        let explicit = Layout {
            table_pool: 1000,
            ..l
        };
        assert_eq!(explicit.table_map_entries(), 1000);
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
            Layout {
                table_pool: MAX_POOL_CHUNKS + 1,
                ..ok
            },
            Layout {
                table_pool: 1,
                ..ok
            },
            Layout {
                max_vips: 65_535,
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
            table_pool: 0,
            second_chance_vips: 1,
        });
        let key = VipKey::new("10.0.0.1".parse().unwrap(), 80, 6);
        let mut meta = VipMeta {
            vip_id: 1,
            ..Default::default()
        };
        meta.set_table_size(13);
        Region::new(2, 13).point(&mut meta, 0);
        dp.publish_table(&key, &mut meta, Some(&[7; 13])).unwrap();
        assert_eq!(dp.layout().region_of(&meta), (Region::new(2, 13), 1));
        assert_eq!(meta.table_base, 3);
        assert_eq!(dp.vip(&key).unwrap(), Some(meta));
        assert_eq!(dp.read_table(meta.table_base, 13).unwrap(), vec![7; 13]);
        dp.publish_table(&key, &mut meta, Some(&[9; 13])).unwrap();
        assert_eq!(dp.layout().region_of(&meta).1, 0);
        assert_eq!(dp.read_table(meta.table_base, 13).unwrap(), vec![9; 13]);
        dp.publish_table(&key, &mut meta, None).unwrap();
        assert_ne!(dp.vip(&key).unwrap().unwrap().flags & VIP_F_NO_BACKENDS, 0);
        assert!(dp.publish_table(&key, &mut meta, Some(&[1; 12])).is_err());
        // An entry write that fails leaves `meta` naming the half packets
        // read: the next publish writes the other one.
        let live = meta;
        dp.refuse_vip = Some(key);
        assert!(dp.publish_table(&key, &mut meta, Some(&[5; 13])).is_err());
        assert_eq!(meta, live);
    }
}

//! An in-memory [`Dataplane`] for unit tests of the logic above the maps
//! (reconciler, API). It stores what is written and returns it; it does not
//! forward packets. It can be told to fail writes, to test error paths.

use std::collections::HashMap;

use lb_common::{
    BackendDef, CounterValue, DatapathConfig, FlowBucket, TraceFilter, VipFilter, VipKey, VipMeta,
    consts::TABLE_CHUNK_SLOTS, counters::COUNTER_SLOTS, quic::QuicServerKey,
};

use super::{AltSlot, Counters, Dataplane, DataplaneError, Layout, Result};

#[derive(Debug)]
pub struct FakeDataplane {
    layout: Layout,
    config: DatapathConfig,
    hash_key: [u64; 2],
    ct_key: lb_common::CtKey,
    vips: HashMap<VipKey, VipMeta>,
    backends: Vec<BackendDef>,
    quic: HashMap<QuicServerKey, u32>,
    tables: Vec<u32>,
    alternates: Vec<AltSlot>,
    flows: Vec<FlowBucket>,
    filter: VipFilter,
    /// The last trace filter written.
    pub trace: TraceFilter,
    /// What [`Dataplane::tracing_pending`] answers.
    pub tracing_pending: bool,
    /// Counter values tests may set to exercise readers.
    pub counters: Vec<CounterValue>,
    pub vip_stats: Vec<CounterValue>,
    pub backend_stats: Vec<CounterValue>,
    /// SYN counts tests may set (passive health).
    pub backend_syns: Vec<lb_common::SynCounts>,
    /// `LB_SYNS`.
    pub syns: Vec<lb_common::SynSlot>,
    /// When set, every write fails with this message.
    pub fail_writes: Option<String>,
    /// When set, writes of this `LB_VIPS` key fail (a write the kernel
    /// refuses half-way through an apply).
    pub refuse_vip: Option<VipKey>,
    /// Number of successful map writes (element updates), for "writes only
    /// what changed" tests.
    pub writes: usize,
}

impl FakeDataplane {
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            config: DatapathConfig::default(),
            hash_key: [0; 2],
            ct_key: lb_common::CtKey::default(),
            vips: HashMap::new(),
            backends: vec![BackendDef::default(); layout.max_backends as usize],
            quic: HashMap::new(),
            tables: vec![0; (layout.table_map_entries() * TABLE_CHUNK_SLOTS) as usize],
            alternates: vec![
                AltSlot::default();
                (layout.alt_map_entries() * TABLE_CHUNK_SLOTS) as usize
            ],
            flows: vec![FlowBucket::default(); layout.ct_buckets as usize],
            filter: VipFilter::default(),
            trace: TraceFilter::default(),
            tracing_pending: false,
            counters: vec![CounterValue::default(); COUNTER_SLOTS as usize],
            vip_stats: vec![CounterValue::default(); layout.max_vips as usize],
            backend_stats: vec![CounterValue::default(); layout.max_backends as usize],
            backend_syns: vec![lb_common::SynCounts::default(); layout.max_backends as usize],
            syns: vec![lb_common::SynSlot::default(); lb_common::consts::SYN_SLOTS as usize],
            fail_writes: None,
            refuse_vip: None,
            writes: 0,
        }
    }

    fn write(&mut self, n: usize) -> Result<()> {
        if let Some(msg) = &self.fail_writes {
            return Err(DataplaneError::Io(std::io::Error::other(msg.clone())));
        }
        self.writes += n;
        Ok(())
    }
}

fn range(what: &'static str, index: u32, limit: usize) -> Result<usize> {
    if (index as usize) < limit {
        Ok(index as usize)
    } else {
        Err(DataplaneError::OutOfRange {
            what,
            index,
            limit: limit as u32,
        })
    }
}

impl Dataplane for FakeDataplane {
    fn layout(&self) -> Layout {
        self.layout
    }

    fn config(&self) -> Result<DatapathConfig> {
        Ok(self.config)
    }

    fn set_config(&mut self, cfg: &DatapathConfig) -> Result<()> {
        self.write(1)?;
        self.config = *cfg;
        Ok(())
    }

    fn hash_key(&self) -> Result<[u64; 2]> {
        Ok(self.hash_key)
    }

    fn set_hash_key(&mut self, key: &[u64; 2]) -> Result<()> {
        self.write(1)?;
        self.hash_key = *key;
        Ok(())
    }

    fn ct_key(&self) -> Result<lb_common::CtKey> {
        Ok(self.ct_key)
    }

    fn set_ct_key(&mut self, key: &lb_common::CtKey) -> Result<()> {
        self.write(1)?;
        self.ct_key = *key;
        Ok(())
    }

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>> {
        Ok(self.vips.iter().map(|(k, v)| (*k, *v)).collect())
    }

    fn vip(&self, key: &VipKey) -> Result<Option<VipMeta>> {
        Ok(self.vips.get(key).copied())
    }

    fn upsert_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<()> {
        if self.refuse_vip == Some(*key) {
            return Err(DataplaneError::Io(std::io::Error::other(
                "refused by the fake's refuse_vip",
            )));
        }
        if !self.vips.contains_key(key) && self.vips.len() >= self.layout.vip_keys() as usize {
            return Err(DataplaneError::OutOfRange {
                what: "VIP keys",
                index: self.vips.len() as u32,
                limit: self.layout.vip_keys(),
            });
        }
        self.write(1)?;
        self.vips.insert(*key, *meta);
        Ok(())
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<()> {
        self.write(1)?;
        self.vips.remove(key);
        Ok(())
    }

    fn backend(&self, index: u32) -> Result<BackendDef> {
        Ok(self.backends[range("backend", index, self.backends.len())?])
    }

    fn set_backend(&mut self, index: u32, def: &BackendDef) -> Result<()> {
        let i = range("backend", index, self.backends.len())?;
        self.write(1)?;
        self.backends[i] = *def;
        Ok(())
    }

    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, u32)>> {
        Ok(self.quic.iter().map(|(k, h)| (*k, *h)).collect())
    }

    fn set_quic_server(&mut self, key: &QuicServerKey, handle: u32) -> Result<()> {
        if !self.quic.contains_key(key) {
            range(
                "QUIC server",
                self.quic.len() as u32,
                self.layout.max_backends as usize,
            )?;
        }
        self.write(1)?;
        self.quic.insert(*key, handle);
        Ok(())
    }

    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<()> {
        self.write(1)?;
        self.quic.remove(key);
        Ok(())
    }

    fn write_table(&mut self, base: u32, slots: &[u32]) -> Result<()> {
        let start = range(
            "table chunk",
            base,
            self.layout.table_map_entries() as usize,
        )? * TABLE_CHUNK_SLOTS as usize;
        let chunks = slots.len().div_ceil(TABLE_CHUNK_SLOTS as usize);
        let end = start + chunks * TABLE_CHUNK_SLOTS as usize;
        if end > self.tables.len() {
            return Err(DataplaneError::OutOfRange {
                what: "table chunk",
                index: base + chunks as u32,
                limit: self.layout.table_map_entries(),
            });
        }
        self.write(chunks)?;
        self.tables[start..end].fill(0);
        self.tables[start..start + slots.len()].copy_from_slice(slots);
        Ok(())
    }

    fn read_table(&self, base: u32, len: u32) -> Result<Vec<u32>> {
        let start = base as usize * TABLE_CHUNK_SLOTS as usize;
        self.tables
            .get(start..start + len as usize)
            .map(<[u32]>::to_vec)
            .ok_or(DataplaneError::OutOfRange {
                what: "table chunk",
                index: base,
                limit: self.layout.table_map_entries(),
            })
    }

    fn write_alternates(&mut self, base: u32, slots: &[AltSlot]) -> Result<()> {
        let limit = self.layout.alt_map_entries();
        let start = range("alternates chunk", base, limit as usize)? * TABLE_CHUNK_SLOTS as usize;
        let chunks = slots.len().div_ceil(TABLE_CHUNK_SLOTS as usize);
        let end = start + chunks * TABLE_CHUNK_SLOTS as usize;
        if end > self.alternates.len() {
            return Err(DataplaneError::OutOfRange {
                what: "alternates chunk",
                index: base + chunks as u32,
                limit,
            });
        }
        self.write(chunks)?;
        self.alternates[start..end].fill(AltSlot::default());
        self.alternates[start..start + slots.len()].copy_from_slice(slots);
        Ok(())
    }

    fn read_alternates(&self, base: u32, len: u32) -> Result<Vec<AltSlot>> {
        let start = base as usize * TABLE_CHUNK_SLOTS as usize;
        self.alternates
            .get(start..start + len as usize)
            .map(<[AltSlot]>::to_vec)
            .ok_or(DataplaneError::OutOfRange {
                what: "alternates chunk",
                index: base,
                limit: self.layout.alt_map_entries(),
            })
    }

    fn counters(&self) -> Result<Counters> {
        Ok(self.counters.clone())
    }

    fn vip_stats(&self, vip_id: u32) -> Result<CounterValue> {
        Ok(self.vip_stats[range("VIP id", vip_id, self.vip_stats.len())?])
    }

    fn add_vip_retired(&mut self, vip_id: u32, counts: CounterValue) -> Result<()> {
        let i = range("VIP id", vip_id, self.vip_stats.len())?;
        self.write(1)?;
        self.vip_stats[i] += counts;
        Ok(())
    }

    fn backend_stats(&self, index: u32) -> Result<CounterValue> {
        Ok(self.backend_stats[range("backend", index, self.backend_stats.len())?])
    }

    fn clear_vip_stats(&mut self, vip_id: u32) -> Result<()> {
        let i = range("VIP id", vip_id, self.vip_stats.len())?;
        self.write(1)?;
        self.vip_stats[i] = CounterValue::default();
        Ok(())
    }

    fn clear_backend_stats(&mut self, index: u32) -> Result<()> {
        let i = range("backend", index, self.backend_stats.len())?;
        self.write(1)?;
        self.backend_stats[i] = CounterValue::default();
        self.backend_syns[i] = lb_common::SynCounts::default();
        Ok(())
    }

    fn backend_syns(&self, index: u32) -> Result<lb_common::SynCounts> {
        Ok(self.backend_syns[range("backend", index, self.backend_syns.len())?])
    }

    fn syn_slot(&self, bucket_index: u32) -> Result<lb_common::SynSlot> {
        Ok(self.syns[(bucket_index & (lb_common::consts::SYN_SLOTS - 1)) as usize])
    }

    fn set_syn_slot(&mut self, bucket_index: u32, slot: &lb_common::SynSlot) -> Result<()> {
        self.write(1)?;
        self.syns[(bucket_index & (lb_common::consts::SYN_SLOTS - 1)) as usize] = *slot;
        Ok(())
    }

    fn flow_bucket(&self, index: u32) -> Result<FlowBucket> {
        Ok(self.flows[range("bucket", index, self.flows.len())?])
    }

    fn set_flow_bucket(&mut self, index: u32, bucket: &FlowBucket) -> Result<()> {
        let i = range("bucket", index, self.flows.len())?;
        self.write(1)?;
        self.flows[i] = *bucket;
        Ok(())
    }

    fn set_trace_filter(&mut self, filter: &TraceFilter) -> Result<()> {
        self.write(1)?;
        self.trace = *filter;
        Ok(())
    }

    fn tracing_pending(&self) -> bool {
        self.tracing_pending
    }

    fn vip_filter(&self) -> Result<VipFilter> {
        Ok(self.filter)
    }

    fn set_vip_filter(&mut self, filter: &VipFilter) -> Result<()> {
        self.write(1)?;
        self.filter = *filter;
        Ok(())
    }
}

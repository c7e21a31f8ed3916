//! The real [`Dataplane`]: loads the embedded `lb_xdp` object with aya, sized
//! by a [`Layout`], optionally pinning (or adopting) its maps, and reads and
//! writes the maps with one syscall per element.

use std::path::Path;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
    programs::Xdp,
};
use lb_common::{
    BackendDef, CounterValue, DatapathConfig, FlowBucket, TableChunk, VipKey, VipMeta,
    consts::{
        ALL_MAPS, MAP_BACKEND_STATS, MAP_BACKENDS, MAP_CONFIG, MAP_COUNTERS, MAP_FLOWS, MAP_TABLES,
        MAP_VIP_STATS, MAP_VIPS, PROG_LB, TABLE_CHUNK_SLOTS,
    },
    counters::COUNTER_SLOTS,
};

use super::{Counters, Dataplane, DataplaneError, Layout, Result};
use crate::objects;

pub struct KernelDataplane {
    ebpf: Ebpf,
    layout: Layout,
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> DataplaneError {
    move |e| DataplaneError::Map {
        name,
        source: Box::new(e),
    }
}

fn prog_err(e: aya::programs::ProgramError) -> DataplaneError {
    DataplaneError::Program {
        name: PROG_LB,
        source: Box::new(e),
    }
}

impl KernelDataplane {
    /// Loads the program with fresh, unpinned maps (tests, benchmarks).
    pub fn load(layout: Layout) -> Result<Self> {
        Self::load_with(layout, None)
    }

    /// Loads the program. With `pin_dir`, each map is adopted from
    /// `pin_dir/<map name>` if pinned there, else created and pinned there.
    pub fn load_with(layout: Layout, pin_dir: Option<&Path>) -> Result<Self> {
        layout.validate()?;
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(MAP_VIPS, layout.max_vips)
            .map_max_entries(MAP_BACKENDS, layout.max_backends)
            .map_max_entries(MAP_TABLES, layout.table_map_entries())
            .map_max_entries(MAP_FLOWS, layout.ct_buckets)
            .map_max_entries(MAP_VIP_STATS, layout.max_vips)
            .map_max_entries(MAP_BACKEND_STATS, layout.max_backends);
        if let Some(dir) = pin_dir {
            for name in ALL_MAPS {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader
            .load(objects::LB_XDP)
            .map_err(|e| DataplaneError::Load(Box::new(e)))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROG_LB)
            .ok_or_else(|| prog_err(aya::programs::ProgramError::NotLoaded))?
            .try_into()
            .map_err(prog_err)?;
        prog.load().map_err(prog_err)?;
        Ok(Self { ebpf, layout })
    }

    /// The loaded `lb_xdp` program (attach it, or drive it with `TestRun`).
    pub fn program(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROG_LB)
            .expect("loaded in load_with")
            .try_into()
            .expect("an XDP program")
    }

    /// The underlying map, for callers that need raw access (benchmarks).
    pub fn raw_map(&self, name: &'static str) -> Result<&Map> {
        self.ebpf.map(name).ok_or(DataplaneError::MissingMap(name))
    }

    fn map(&self, name: &'static str) -> Result<&Map> {
        self.raw_map(name)
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map> {
        self.ebpf
            .map_mut(name)
            .ok_or(DataplaneError::MissingMap(name))
    }

    fn array<V: aya::Pod>(&self, name: &'static str) -> Result<Array<&MapData, V>> {
        Array::try_from(self.map(name)?).map_err(map_err(name))
    }

    fn array_mut<V: aya::Pod>(&mut self, name: &'static str) -> Result<Array<&mut MapData, V>> {
        Array::try_from(self.map_mut(name)?).map_err(map_err(name))
    }

    fn per_cpu_sum(&self, name: &'static str, index: u32) -> Result<CounterValue> {
        let map: PerCpuArray<&MapData, CounterValue> =
            PerCpuArray::try_from(self.map(name)?).map_err(map_err(name))?;
        let values = map.get(&index, 0).map_err(map_err(name))?;
        let mut sum = CounterValue::default();
        for v in values.iter() {
            sum += *v;
        }
        Ok(sum)
    }
}

impl Dataplane for KernelDataplane {
    fn layout(&self) -> Layout {
        self.layout
    }

    fn config(&self) -> Result<DatapathConfig> {
        self.array(MAP_CONFIG)?
            .get(&0, 0)
            .map_err(map_err(MAP_CONFIG))
    }

    fn set_config(&mut self, cfg: &DatapathConfig) -> Result<()> {
        self.array_mut::<DatapathConfig>(MAP_CONFIG)?
            .set(0, cfg, 0)
            .map_err(map_err(MAP_CONFIG))
    }

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>> {
        let map: HashMap<&MapData, VipKey, VipMeta> =
            HashMap::try_from(self.map(MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
        map.iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_VIPS))
    }

    fn vip(&self, key: &VipKey) -> Result<Option<VipMeta>> {
        let map: HashMap<&MapData, VipKey, VipMeta> =
            HashMap::try_from(self.map(MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
        match map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(MAP_VIPS)(e)),
        }
    }

    fn upsert_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<()> {
        let mut map: HashMap<&mut MapData, VipKey, VipMeta> =
            HashMap::try_from(self.map_mut(MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
        map.insert(key, meta, 0).map_err(map_err(MAP_VIPS))
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<()> {
        let mut map: HashMap<&mut MapData, VipKey, VipMeta> =
            HashMap::try_from(self.map_mut(MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
        match map.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(MAP_VIPS)(e)),
        }
    }

    fn backend(&self, index: u32) -> Result<BackendDef> {
        self.array(MAP_BACKENDS)?
            .get(&index, 0)
            .map_err(map_err(MAP_BACKENDS))
    }

    fn set_backend(&mut self, index: u32, def: &BackendDef) -> Result<()> {
        self.array_mut::<BackendDef>(MAP_BACKENDS)?
            .set(index, def, 0)
            .map_err(map_err(MAP_BACKENDS))
    }

    fn write_table(&mut self, base: u32, slots: &[u32]) -> Result<()> {
        let mut map = self.array_mut::<TableChunk>(MAP_TABLES)?;
        let mut chunk = Box::new(TableChunk::default());
        for (i, part) in slots.chunks(TABLE_CHUNK_SLOTS as usize).enumerate() {
            chunk.slots[..part.len()].copy_from_slice(part);
            chunk.slots[part.len()..].fill(0);
            map.set(base + i as u32, *chunk, 0)
                .map_err(map_err(MAP_TABLES))?;
        }
        Ok(())
    }

    fn read_table(&self, base: u32, len: u32) -> Result<Vec<u32>> {
        let map = self.array::<TableChunk>(MAP_TABLES)?;
        let mut out = Vec::with_capacity(len as usize);
        let mut index = base;
        while out.len() < len as usize {
            let chunk = map.get(&index, 0).map_err(map_err(MAP_TABLES))?;
            let want = (len as usize - out.len()).min(TABLE_CHUNK_SLOTS as usize);
            out.extend_from_slice(&chunk.slots[..want]);
            index += 1;
        }
        Ok(out)
    }

    fn counters(&self) -> Result<Counters> {
        (0..COUNTER_SLOTS)
            .map(|i| self.per_cpu_sum(MAP_COUNTERS, i))
            .collect()
    }

    fn vip_stats(&self, vip_id: u32) -> Result<CounterValue> {
        self.per_cpu_sum(MAP_VIP_STATS, vip_id)
    }

    fn backend_stats(&self, index: u32) -> Result<CounterValue> {
        self.per_cpu_sum(MAP_BACKEND_STATS, index)
    }

    fn flow_bucket(&self, index: u32) -> Result<FlowBucket> {
        self.array(MAP_FLOWS)?
            .get(&index, 0)
            .map_err(map_err(MAP_FLOWS))
    }

    fn set_flow_bucket(&mut self, index: u32, bucket: &FlowBucket) -> Result<()> {
        self.array_mut::<FlowBucket>(MAP_FLOWS)?
            .set(index, bucket, 0)
            .map_err(map_err(MAP_FLOWS))
    }
}

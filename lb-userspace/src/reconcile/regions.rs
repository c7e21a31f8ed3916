//! The VIPs' table regions in the pool: finding room for a new VIP or a
//! changed table size, closing gaps when the free chunks are there but in
//! pieces, and checking beforehand that an apply will find its room.
//!
//! Every move is a table swap like any other: the table is written whole
//! into chunks no packet reads, then the VIP's entry (replaced whole) is
//! pointed at them, and only then are the old chunks given back. A moved
//! table keeps its contents, so no flow changes backend; a resized one
//! remaps the VIP's flows, which is what changing M means.

use std::collections::BTreeMap;

use lb_common::{VipMeta, consts::VIP_F_NO_BACKENDS};
use tracing::{info, warn};

use super::{ApplyReport, ReconcileError, Reconciler, Result};
use crate::{
    config::{VipConfig, VipId, vip::pool_mib},
    dataplane::{
        Dataplane,
        pool::{Region, region_chunks},
    },
};

impl<D: Dataplane> Reconciler<D> {
    /// Fails with [`ReconcileError::VipIdsExhausted`] if `desired` has
    /// more VIPs than ids, and with [`ReconcileError::TablePoolFull`] if
    /// applying it
    /// (in order: removed VIPs freed first, then each VIP's new region,
    /// a resized VIP's old one freed after its new one is taken) would at
    /// any point need more chunks than the pool has. Gaps do not count:
    /// compaction closes them.
    pub(super) fn check_pool(
        &self,
        desired: &[VipConfig],
        wanted: &BTreeMap<VipId, &VipConfig>,
    ) -> Result<()> {
        if wanted.len() > self.layout.max_vips as usize {
            return Err(ReconcileError::VipIdsExhausted(self.layout.max_vips));
        }
        let capacity = self.pool.capacity() as u64;
        let mut used: u64 = self
            .vips
            .iter()
            .filter(|(id, _)| wanted.contains_key(id))
            .map(|(_, v)| v.region.chunks() as u64)
            .sum();
        for vip in desired {
            let m = vip.maglev_size(&self.layout);
            let old = match self.vips.get(&vip.id) {
                Some(state) if state.table_size == m => continue,
                Some(state) => state.region.chunks() as u64,
                None => 0,
            };
            let need = region_chunks(m) as u64;
            if used + need > capacity {
                return Err(ReconcileError::TablePoolFull {
                    vip: vip.id,
                    need: pool_mib(need),
                    used: pool_mib(used + need),
                    capacity: pool_mib(capacity),
                });
            }
            used = used + need - old;
        }
        Ok(())
    }

    /// Takes a region for a table of `m` slots for `vip`, compacting the
    /// pool if the chunks are free but in pieces.
    pub(super) fn allocate_region(
        &mut self,
        vip: &VipId,
        m: u32,
        report: &mut ApplyReport,
    ) -> Result<u32> {
        let len = region_chunks(m);
        if let Some(base) = self.pool.allocate(len) {
            return Ok(base);
        }
        if self.pool.free_chunks() >= len {
            self.compact(len, report)?;
            if let Some(base) = self.pool.allocate(len) {
                return Ok(base);
            }
        }
        let capacity = self.pool.capacity() as u64;
        Err(ReconcileError::TablePoolFull {
            vip: *vip,
            need: pool_mib(len as u64),
            used: pool_mib(capacity - self.pool.free_chunks() as u64 + len as u64),
            capacity: pool_mib(capacity),
        })
    }

    /// Slides regions towards the start of the pool, in address order,
    /// until a free run of `len` chunks opens (or every region is packed).
    pub(super) fn compact(&mut self, len: u32, report: &mut ApplyReport) -> Result<()> {
        let mut order: Vec<(Region, VipId)> =
            self.vips.iter().map(|(id, v)| (v.region, *id)).collect();
        order.sort();
        let mut cursor = 0;
        let before = report.tables_moved;
        for (region, id) in order {
            if self.pool.largest_free() >= len {
                break;
            }
            if region.base > cursor {
                self.move_region(&id, cursor, report)?;
            }
            cursor += region.chunks();
        }
        info!(
            moved = report.tables_moved - before,
            free_run = self.pool.largest_free(),
            "table pool compacted"
        );
        Ok(())
    }

    /// Moves `id`'s region down to `to` (below its base; the chunks from
    /// `to` up to the region are free), table and all, without a flow
    /// changing backend: the table is written into the new region's first
    /// half, which must not overlap the live half, and the entry flipped
    /// to it. When the live half is the first and the gap is narrower
    /// than a half, the table first swaps to the region's own second half.
    fn move_region(&mut self, id: &VipId, to: u32, report: &mut ApplyReport) -> Result<()> {
        let table = self.live_table(id)?.unwrap_or_default();
        let state = &self.vips[id];
        let old = state.region;
        let new = Region {
            base: to,
            half: old.half,
        };
        let has_table = state.meta.flags & VIP_F_NO_BACKENDS == 0;
        if has_table && state.live_half() == 0 && to + old.half > old.base {
            self.flip_to(id, old, 1, &table, report)?;
        }
        self.flip_to(id, new, 0, &table, report)?;
        self.pool.release(old.base, old.chunks());
        self.pool
            .reserve(new.base, new.chunks())
            .map_err(|source| ReconcileError::Region { vip: *id, source })?;
        self.vips.get_mut(id).expect("present").region = new;
        report.tables_moved += 1;
        Ok(())
    }

    /// Writes `table` into half `h` of `region` (unless the VIP has no
    /// table) and points the VIP's entry at it.
    fn flip_to(
        &mut self,
        id: &VipId,
        region: Region,
        h: u32,
        table: &[u32],
        report: &mut ApplyReport,
    ) -> Result<()> {
        let mut meta = self.vips[id].meta;
        if meta.flags & VIP_F_NO_BACKENDS == 0 {
            self.dp.write_table(region.half_base(h), table)?;
            report.chunks_written += region.half as usize;
        }
        region.point(&mut meta, h);
        self.dp.upsert_vip(&id.key(), &meta)?;
        self.vips.get_mut(id).expect("present").meta = meta;
        Ok(())
    }

    /// Publishes `vip`'s table of a new size `m` (every flow of the VIP
    /// remaps): a region of the new size is taken, the table written into
    /// its first half, the entry flipped to it with the new size in the
    /// same write, and the old region given back.
    pub(super) fn resize(
        &mut self,
        vip: &VipConfig,
        m: u32,
        handles: Option<Vec<u32>>,
        report: &mut ApplyReport,
    ) -> Result<()> {
        let id = vip.id;
        let region = Region::new(self.allocate_region(&id, m, report)?, m);
        let was = self.vips[&id].table_size;
        let mut meta: VipMeta = self.wanted_meta(vip);
        meta.set_table_size(m);
        let written = match &handles {
            Some(h) => {
                meta.flags &= !VIP_F_NO_BACKENDS;
                report.chunks_written += region.half as usize;
                self.dp.write_table(region.base, h)
            }
            None => {
                meta.flags |= VIP_F_NO_BACKENDS;
                Ok(())
            }
        };
        region.point(&mut meta, 0);
        if let Err(e) = written.and_then(|()| self.dp.upsert_vip(&id.key(), &meta)) {
            // The entry still names the old region: the new one is free
            // again (else the pool would shrink by it until a restart,
            // and a later apply that counted on it would fail half way).
            self.pool.release(region.base, region.chunks());
            return Err(e.into());
        }
        let state = self.vips.get_mut(&id).expect("present");
        let old = std::mem::replace(&mut state.region, region);
        state.meta = meta;
        state.table_size = m;
        self.pool.release(old.base, old.chunks());
        report.tables_published += 1;
        report.vips_updated += 1;
        warn!(vip = %id, from = was, to = m, "table_size changed: every flow of the VIP remaps");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::{
        config::{BackendConfig, Protocol},
        dataplane::{Layout, fake::FakeDataplane, pool::TablePool},
    };

    /// Pool of 24 chunks; the default M (2053) takes 6, M = 1021 takes 2.
    fn layout() -> Layout {
        Layout {
            table_size: 2053,
            max_vips: 16,
            max_backends: 64,
            ct_buckets: 16,
            table_pool: 24,
            second_chance_vips: 1,
        }
    }

    fn vip(n: u8, m: Option<u32>) -> VipConfig {
        let id = VipId {
            addr: format!("10.0.0.{n}").parse().unwrap(),
            port: 80,
            proto: Protocol::Tcp,
        };
        let backends = (1..=3)
            .map(|b| BackendConfig::new(format!("10.1.{n}.{b}").parse().unwrap(), 1))
            .collect();
        let mut v = VipConfig::new(id, backends);
        v.table_size = m;
        v
    }

    fn all(_: &VipId, _: &IpAddr) -> bool {
        true
    }

    /// Each VIP's published table as read from the maps, by address.
    fn tables(r: &Reconciler<FakeDataplane>) -> BTreeMap<VipId, Vec<Option<IpAddr>>> {
        r.vips()
            .iter()
            .map(|(id, state)| {
                let meta = r.dataplane().vip(&id.key()).unwrap().unwrap();
                assert_eq!(meta, state.meta, "kernel entry matches the shadow");
                assert_eq!(r.layout().region_of(&meta).0, state.region);
                let m = meta.table_size();
                let slots = r.dataplane().read_table(meta.table_base, m).unwrap();
                let by = |h: u32| r.backend_by_handle(h).map(|(_, a)| a);
                (*id, slots.into_iter().map(by).collect())
            })
            .collect()
    }

    /// The pool as the regions say it should be.
    fn pool_of_regions(r: &Reconciler<FakeDataplane>) -> TablePool {
        let mut p = TablePool::new(r.layout().pool_chunks());
        for v in r.vips().values() {
            p.reserve(v.region.base, v.region.chunks())
                .expect("disjoint");
        }
        p
    }

    #[test]
    fn each_vip_takes_a_region_of_its_own_size() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let (big, small) = (vip(1, None), vip(2, Some(1021)));
        r.apply(&[big.clone(), small.clone()], &all).unwrap();
        let t = tables(&r);
        assert_eq!((t[&big.id].len(), t[&small.id].len()), (2053, 1021));
        assert_eq!(r.vips()[&big.id].region.chunks(), 6);
        assert_eq!(r.vips()[&small.id].region.chunks(), 2);
        assert_eq!(r.pool().free_chunks(), 24 - 8);
        assert_eq!(*r.pool(), pool_of_regions(&r));
        for id in [big.id, small.id] {
            assert!(t[&id].iter().all(Option::is_some), "every slot served");
        }
    }

    #[test]
    fn a_fragmented_pool_is_compacted_without_moving_a_flow() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        // Twelve 2-chunk tables fill the pool; every other one leaves.
        let small: Vec<VipConfig> = (1..=12).map(|n| vip(n, Some(1021))).collect();
        r.apply(&small, &all).unwrap();
        let mut kept: Vec<VipConfig> = small.iter().step_by(2).cloned().collect();
        r.apply(&kept, &all).unwrap();
        assert_eq!((r.pool().free_chunks(), r.pool().largest_free()), (12, 2));
        let before = tables(&r);
        // A 6-chunk table fits only once the gaps are closed.
        kept.push(vip(20, None));
        let rep = r.apply(&kept, &all).unwrap();
        assert!(rep.tables_moved > 0, "{rep:?}");
        let after = tables(&r);
        for (id, table) in &before {
            assert_eq!(&after[id], table, "VIP {id} kept every slot's backend");
        }
        assert_eq!(after[&vip(20, None).id].len(), 2053);
        assert_eq!(*r.pool(), pool_of_regions(&r));
        assert_eq!(r.pool().free_chunks(), 24 - 12 - 6);
    }

    #[test]
    fn a_full_pool_refuses_before_writing_anything() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let three: Vec<VipConfig> = (1..=3).map(|n| vip(n, None)).collect();
        r.apply(&three, &all).unwrap();
        let (writes, before) = (r.dataplane().writes, tables(&r));
        let mut four = three.clone();
        four.push(vip(4, Some(1021)));
        four.push(vip(5, None));
        let err = r.apply(&four, &all).unwrap_err();
        assert!(
            matches!(&err, ReconcileError::TablePoolFull { vip, .. } if *vip == four[4].id),
            "{err}"
        );
        assert!(err.to_string().contains("table_pool_mib"), "{err}");
        assert_eq!(r.dataplane().writes, writes, "nothing written");
        assert_eq!(tables(&r), before);
        // What fits still goes in.
        four.pop();
        r.apply(&four, &all).unwrap();
        assert_eq!(r.pool().free_chunks(), 24 - 3 * 6 - 2);
    }

    #[test]
    fn a_new_table_size_takes_a_new_region_and_frees_the_old() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let mut v = vip(1, None);
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let old = r.vips()[&v.id].region;
        v.table_size = Some(1021);
        let rep = r.apply(std::slice::from_ref(&v), &all).unwrap();
        assert_eq!((rep.tables_published, rep.vips_updated), (1, 1));
        let state = &r.vips()[&v.id];
        assert_eq!((state.table_size, state.region.chunks()), (1021, 2));
        assert_ne!(state.region, old);
        assert_eq!(tables(&r)[&v.id].len(), 1021);
        assert_eq!(r.pool().free_chunks(), 22, "the old region is free again");
        // Near a full pool, growing needs old and new at once: refused.
        let filler: Vec<VipConfig> = (2..=4).map(|n| vip(n, None)).collect();
        let mut set = filler.clone();
        set.push(v.clone());
        r.apply(&set, &all).unwrap();
        v.table_size = None;
        *set.last_mut().unwrap() = v;
        assert!(matches!(
            r.apply(&set, &all),
            Err(ReconcileError::TablePoolFull { .. })
        ));
    }

    /// A resize writes one half of the new region (counted) and says in
    /// the entry whether the VIP has backends to send to, whatever the
    /// entry said before.
    #[test]
    fn a_resize_counts_its_half_and_marks_a_vip_without_backends() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let none = |_: &VipId, _: &IpAddr| false;
        let mut v = vip(1, None);
        r.apply(std::slice::from_ref(&v), &none).unwrap();
        let flags = |r: &Reconciler<FakeDataplane>, v: &VipConfig| {
            r.dataplane().vip(&v.id.key()).unwrap().unwrap().flags & VIP_F_NO_BACKENDS
        };
        assert_ne!(flags(&r, &v), 0, "no backend to send to");
        v.table_size = Some(1021);
        let rep = r.apply(std::slice::from_ref(&v), &all).unwrap();
        assert_eq!(rep.chunks_written, 1, "one half of a 1021-slot region");
        assert_eq!(flags(&r, &v), 0, "backends again");
        v.table_size = None;
        let rep = r.apply(std::slice::from_ref(&v), &none).unwrap();
        assert_eq!(r.vips()[&v.id].table_size, 2053);
        assert_eq!(rep.chunks_written, 0, "no table without backends");
        assert_ne!(flags(&r, &v), 0);
    }

    /// A new table size whose entry write fails leaves the pool as it
    /// was: the region taken for it is given back, and the VIP keeps its
    /// old one.
    #[test]
    fn a_failed_resize_gives_its_region_back() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let mut v = vip(1, None);
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        let (free, region) = (r.pool().free_chunks(), r.vips()[&v.id].region);
        v.table_size = Some(1021);
        r.dataplane_mut().refuse_vip = Some(v.id.key());
        assert!(r.apply(std::slice::from_ref(&v), &all).is_err());
        assert_eq!(r.pool().free_chunks(), free, "the new region is free again");
        assert_eq!(r.vips()[&v.id].region, region);
        r.dataplane_mut().refuse_vip = None;
        r.apply(std::slice::from_ref(&v), &all).unwrap();
        assert_eq!(r.vips()[&v.id].table_size, 1021);
    }

    #[test]
    fn adoption_recovers_regions_and_rewrites_nothing() {
        let mut r = Reconciler::adopt(FakeDataplane::new(layout())).unwrap();
        let mut set: Vec<VipConfig> = (1..=6).map(|n| vip(n, Some(1021))).collect();
        set.push(vip(7, None));
        r.apply(&set, &all).unwrap();
        // Flip some tables to their second half, free a gap.
        set[0].backends.pop();
        set[3].backends.pop();
        set.remove(2);
        r.apply(&set, &all).unwrap();
        let (pool, before) = (r.pool().clone(), tables(&r));
        let dp = std::mem::replace(r.dataplane_mut(), FakeDataplane::new(layout()));
        let writes = dp.writes;
        let mut again = Reconciler::adopt(dp).unwrap();
        assert_eq!(*again.pool(), pool, "the same chunks in use");
        assert_eq!(tables(&again), before);
        assert!(again.apply(&set, &all).unwrap().is_noop());
        assert_eq!(again.dataplane().writes, writes);
    }

    #[test]
    fn entries_of_an_older_lbd_keep_their_fixed_regions() {
        // What an lbd before per-VIP sizes left: VIP id i's halves at
        // chunks 2i·c and (2i+1)·c of the default size, no size in the
        // entry, no half flag.
        let layout = Layout {
            table_pool: 0,
            max_vips: 4,
            ..layout()
        };
        let mut dp = FakeDataplane::new(layout);
        let v = vip(1, None);
        let handle = (1 << 16) | 5;
        let def = lb_common::BackendDef {
            addr: lb_common::addr_to_words(v.backends[0].address).0,
            handle,
            vip_id: 2,
            flags: lb_common::consts::BACKEND_F_USABLE,
            family: lb_common::consts::FAMILY_V4,
            ..Default::default()
        };
        dp.set_backend(5, &def).unwrap();
        let live = (2 * 2 + 1) * 3; // VIP id 2, second half
        dp.write_table(live, &[handle; 2053]).unwrap();
        let old = VipMeta {
            vip_id: 2,
            table_base: live,
            ..Default::default()
        };
        dp.upsert_vip(&v.id.key(), &old).unwrap();
        let mut r = Reconciler::adopt(dp).unwrap();
        let state = &r.vips()[&v.id];
        assert_eq!(
            (state.region, state.live_half()),
            (Region::new(12, 2053), 1)
        );
        assert_eq!(r.pool().free_chunks(), 24 - 6);
        // The same backend set: the entry gains its size and half flag,
        // the table stays where it is.
        let only = VipConfig {
            backends: v.backends[..1].to_vec(),
            ..v.clone()
        };
        let rep = r.apply(std::slice::from_ref(&only), &all).unwrap();
        assert_eq!((rep.tables_published, rep.chunks_written), (0, 0));
        let meta = r.dataplane().vip(&v.id.key()).unwrap().unwrap();
        assert_eq!((meta.table_base, meta.table_size()), (live, 2053));
        assert_eq!(r.layout().region_of(&meta), (Region::new(12, 2053), 1));
    }
}

//! Where each VIP's Maglev table lives in `LB_TABLES`: a [`Region`] of two
//! halves of `ceil(M / 1024)` chunks each (M the VIP's own table size),
//! handed out by a [`TablePool`] from the map's chunks.
//!
//! The pool only does the bookkeeping (which chunks are free); it writes
//! nothing. Moving regions to close gaps (compaction) needs table writes
//! and VIP entries, so the reconciler does it, asking the pool where the
//! gaps are. A region is recovered from a VIP's `LB_VIPS` entry alone
//! ([`Region::of`]), so a restarted `lbd` rebuilds the pool from the maps.

use std::collections::BTreeMap;

use lb_common::{
    VipMeta,
    consts::{TABLE_CHUNK_SLOTS, VIP_F_SECOND_HALF},
};
use thiserror::Error;

/// Chunks of one table half of `m` slots.
pub const fn half_chunks(m: u32) -> u32 {
    m.div_ceil(TABLE_CHUNK_SLOTS)
}

/// Chunks of a whole region (both halves) for a table of `m` slots.
pub const fn region_chunks(m: u32) -> u32 {
    2 * half_chunks(m)
}

/// Bytes of kernel memory per chunk (one `TableChunk`).
pub const CHUNK_BYTES: u64 = TABLE_CHUNK_SLOTS as u64 * 4;

/// One VIP's table region: half 0 at `base`, half 1 right after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Region {
    pub base: u32,
    /// Chunks per half.
    pub half: u32,
}

impl Region {
    /// The region at `base` for a table of `m` slots.
    pub fn new(base: u32, m: u32) -> Self {
        Self {
            base,
            half: half_chunks(m),
        }
    }

    /// Chunks in all (both halves).
    pub fn chunks(&self) -> u32 {
        2 * self.half
    }

    /// One past the last chunk.
    pub fn end(&self) -> u32 {
        self.base + self.chunks()
    }

    /// First chunk of half `h` (0 or 1).
    pub fn half_base(&self, h: u32) -> u32 {
        self.base + h * self.half
    }

    /// The region of an `LB_VIPS` entry and its live half. Entries written
    /// before per-VIP sizes (`table_size` 0) had the fixed region of their
    /// VIP id: `2 × vip_id` halves of the global size from the start.
    pub fn of(meta: &VipMeta, global_m: u32) -> (Region, u32) {
        if meta.table_size() == 0 {
            let r = Region::new(2 * meta.id() * half_chunks(global_m), global_m);
            return (r, u32::from(meta.table_base != r.base));
        }
        let half = u32::from(meta.flags & VIP_F_SECOND_HALF != 0);
        let chunks = half_chunks(meta.table_size());
        let base = meta.table_base.saturating_sub(half * chunks);
        (Region::new(base, meta.table_size()), half)
    }

    /// Points `meta` at half `h` of this region.
    pub fn point(&self, meta: &mut VipMeta, h: u32) {
        meta.table_base = self.half_base(h);
        if h == 1 {
            meta.flags |= VIP_F_SECOND_HALF;
        } else {
            meta.flags &= !VIP_F_SECOND_HALF;
        }
    }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PoolError {
    #[error("chunks {base}..{end} lie outside the table pool of {capacity} chunks")]
    OutOfRange { base: u32, end: u32, capacity: u32 },
    #[error("chunks {base}..{end} overlap a region already in use")]
    Overlap { base: u32, end: u32 },
}

/// The free chunks of `LB_TABLES`, as runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TablePool {
    capacity: u32,
    /// Free runs: first chunk → length. Never empty runs, never two
    /// adjacent runs (they are merged).
    free: BTreeMap<u32, u32>,
}

impl TablePool {
    /// A pool of `capacity` chunks, all free.
    pub fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self { capacity, free }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Free chunks in all.
    pub fn free_chunks(&self) -> u32 {
        self.free.values().sum()
    }

    /// The longest free run.
    pub fn largest_free(&self) -> u32 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// The free runs, `(first chunk, length)`, in address order.
    pub fn free_runs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.free.iter().map(|(b, l)| (*b, *l))
    }

    /// Takes `len` chunks from the smallest free run that holds them (the
    /// lowest such run on a tie), from its start; `None` if no run does
    /// (the pool may still hold `len` free chunks in pieces).
    pub fn allocate(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let (&base, &run) = self
            .free
            .iter()
            .filter(|(_, l)| **l >= len)
            .min_by_key(|(b, l)| (**l, **b))?;
        self.free.remove(&base);
        if run > len {
            self.free.insert(base + len, run - len);
        }
        Some(base)
    }

    /// Takes exactly `base..base + len` (a region found in the maps after
    /// a restart); every chunk of it must be free.
    pub fn reserve(&mut self, base: u32, len: u32) -> Result<(), PoolError> {
        let end = base.saturating_add(len);
        if end > self.capacity {
            return Err(PoolError::OutOfRange {
                base,
                end,
                capacity: self.capacity,
            });
        }
        let Some((&run, &run_len)) = self.free.range(..=base).next_back() else {
            return Err(PoolError::Overlap { base, end });
        };
        if run + run_len < end {
            return Err(PoolError::Overlap { base, end });
        }
        self.free.remove(&run);
        if base > run {
            self.free.insert(run, base - run);
        }
        if run + run_len > end {
            self.free.insert(end, run + run_len - end);
        }
        Ok(())
    }

    /// Gives `base..base + len` back, merging it with free neighbours.
    /// Freeing chunks that are free already is a bug of the caller; it is
    /// ignored (debug builds panic) rather than corrupting the runs.
    pub fn release(&mut self, base: u32, len: u32) {
        if len == 0 {
            return;
        }
        let end = base + len;
        let overlaps = self
            .free
            .range(..end)
            .next_back()
            .is_some_and(|(b, l)| b + l > base);
        debug_assert!(!overlaps, "chunks {base}..{end} released twice");
        if overlaps || end > self.capacity {
            return;
        }
        let (mut start, mut total) = (base, len);
        if let Some((&b, &l)) = self.free.range(..base).next_back()
            && b + l == base
        {
            self.free.remove(&b);
            start = b;
            total += l;
        }
        if let Some(l) = self.free.remove(&end) {
            total += l;
        }
        self.free.insert(start, total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(p: &TablePool) -> Vec<(u32, u32)> {
        p.free_runs().collect()
    }

    #[test]
    fn allocates_best_fit_and_merges_on_release() {
        let mut p = TablePool::new(100);
        let a = p.allocate(10).unwrap();
        let b = p.allocate(20).unwrap();
        let c = p.allocate(10).unwrap();
        assert_eq!((a, b, c), (0, 10, 30));
        assert_eq!(runs(&p), vec![(40, 60)]);
        p.release(b, 20);
        // A 15-chunk table takes the 20-chunk gap, not the 60 at the end.
        assert_eq!(p.allocate(15), Some(10));
        assert_eq!(runs(&p), vec![(25, 5), (40, 60)]);
        p.release(10, 15);
        p.release(a, 10);
        assert_eq!(runs(&p), vec![(0, 30), (40, 60)]);
        p.release(c, 10);
        assert_eq!(runs(&p), vec![(0, 100)], "everything merged back");
        assert_eq!((p.free_chunks(), p.largest_free()), (100, 100));
    }

    #[test]
    fn a_full_pool_says_no_and_reuses_what_is_freed() {
        let mut p = TablePool::new(8);
        let regions: Vec<u32> = (0..4).map(|_| p.allocate(2).unwrap()).collect();
        assert_eq!(p.allocate(2), None, "full");
        assert_eq!(p.allocate(0), None);
        p.release(regions[2], 2);
        assert_eq!(p.allocate(2), Some(regions[2]), "the freed region again");
        assert_eq!(p.free_chunks(), 0);
    }

    #[test]
    fn fragmented_free_space_is_not_one_run() {
        let mut p = TablePool::new(12);
        let r: Vec<u32> = (0..6).map(|_| p.allocate(2).unwrap()).collect();
        for i in [0, 2, 4] {
            p.release(r[i], 2);
        }
        assert_eq!(p.free_chunks(), 6);
        assert_eq!(p.largest_free(), 2);
        assert_eq!(
            p.allocate(4),
            None,
            "6 chunks free, but no run of 4: the reconciler compacts"
        );
        assert_eq!(runs(&p), vec![(0, 2), (4, 2), (8, 2)]);
    }

    #[test]
    fn reserve_takes_exact_ranges_and_refuses_overlaps() {
        let mut p = TablePool::new(20);
        p.reserve(4, 4).unwrap();
        p.reserve(12, 8).unwrap();
        assert_eq!(runs(&p), vec![(0, 4), (8, 4)]);
        assert_eq!(
            p.reserve(6, 4),
            Err(PoolError::Overlap { base: 6, end: 10 })
        );
        assert_eq!(
            p.reserve(10, 4),
            Err(PoolError::Overlap { base: 10, end: 14 })
        );
        assert_eq!(
            p.reserve(18, 4),
            Err(PoolError::OutOfRange {
                base: 18,
                end: 22,
                capacity: 20
            })
        );
        p.reserve(0, 4).unwrap();
        assert_eq!(runs(&p), vec![(8, 4)]);
    }

    #[test]
    fn regions_come_back_from_vip_entries() {
        let mut meta = VipMeta {
            vip_id: 3,
            ..Default::default()
        };
        // Per-VIP size, first half live.
        meta.set_table_size(2053);
        let r = Region::new(40, 2053);
        assert_eq!((r.half, r.chunks(), r.end()), (3, 6, 46));
        r.point(&mut meta, 0);
        assert_eq!(Region::of(&meta, 65_537), (r, 0));
        r.point(&mut meta, 1);
        assert_eq!(meta.table_base, 43);
        assert_eq!(Region::of(&meta, 65_537), (r, 1));
        // Written before per-VIP sizes: the fixed region of VIP id 3.
        let old = VipMeta {
            vip_id: 3,
            table_base: 3 * 2 * 65 + 65,
            ..Default::default()
        };
        assert_eq!(
            Region::of(&old, 65_537),
            (
                Region {
                    base: 390,
                    half: 65
                },
                1
            )
        );
    }
}

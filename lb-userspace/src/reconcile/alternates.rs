//! Second-chance alternates in `LB_ALTERNATES` ([`crate::second_chance`]
//! computes them): a region per second-chance VIP, taken when the VIP
//! turns second chance on and given back when it turns it off, written in
//! place (only the chunks that differ) after the VIP's new backends and
//! before its entry names the region. The alternates are recomputed only
//! when their sources (configured or previous backends and weights, never
//! health) or the VIP's table size change.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use lb_common::consts::TABLE_CHUNK_SLOTS;

use super::{ApplyReport, BackendState, ReconcileError, Reconciler, Result};
use crate::{
    config::{VipConfig, VipId},
    dataplane::{AltSlot, Dataplane},
    second_chance::{self, AltTable, Sources},
};

/// A second-chance VIP's region of `LB_ALTERNATES`.
#[derive(Clone, Debug)]
pub(super) struct AltState {
    pub(super) index: u16,
    /// The sources the table was computed from, and the table.
    pub(super) computed: Option<(Sources, AltTable)>,
    /// The handles the region holds, if known (read back otherwise).
    pub(super) written: Option<Vec<AltSlot>>,
}

impl<D: Dataplane> Reconciler<D> {
    /// Computes (when its sources or table size changed) and writes (the
    /// chunks that differ) the alternates of second-chance VIP `vip` of
    /// table size `m` into its region of `LB_ALTERNATES`. Called after
    /// the VIP's new backends are written and before its entry names the
    /// region.
    pub(super) fn sync_alternates(
        &mut self,
        vip: &VipConfig,
        m: u32,
        report: &mut ApplyReport,
    ) -> Result<()> {
        let id = vip.id;
        // Validated with the configuration; the region holds no more.
        if m > self.layout.table_size {
            return Err(ReconcileError::AlternatesTableSize {
                vip: id,
                m,
                global: self.layout.table_size,
            });
        }
        let index = self.alt_index_for(&id)?;
        let sources = self.sources.get(&id).cloned().unwrap_or_else(|| Sources {
            configured: second_chance::configured_members(vip, 1),
            previous: None,
        });
        let state = self.vips.get_mut(&id).expect("present");
        let alt = state.alt.get_or_insert(AltState {
            index,
            computed: None,
            written: None,
        });
        let current = alt
            .computed
            .as_ref()
            .is_some_and(|(s, t)| *s == sources && t.slots.len() == m as usize);
        if !current {
            let table = second_chance::alternates(&sources, m)
                .map_err(|source| ReconcileError::Maglev { vip: id, source })?;
            alt.computed = Some((sources, table));
        }
        let (_, table) = alt.computed.as_ref().expect("computed above");
        let slots = alt_handles(table, &state.backends, m as usize);
        let written = alt.written.take();
        let base = self.layout.alt_base(index);
        let chunks = self.write_changed_alternates(base, &slots, written)?;
        report.chunks_written += chunks;
        let state = self.vips.get_mut(&id).expect("present");
        state.alt.as_mut().expect("set above").written = Some(slots);
        Ok(())
    }

    /// The VIP's alternates region: the one it has, else the lowest free.
    fn alt_index_for(&self, id: &VipId) -> Result<u16> {
        if let Some(alt) = self.vips.get(id).and_then(|v| v.alt.as_ref()) {
            return Ok(alt.index);
        }
        let used: BTreeSet<u16> = self
            .vips
            .values()
            .filter_map(|v| v.alt.as_ref().map(|a| a.index))
            .collect();
        (0..self.layout.second_chance_vips)
            .map(|i| i as u16)
            .find(|i| !used.contains(i))
            .ok_or(ReconcileError::AlternatesExhausted(
                self.layout.second_chance_vips,
            ))
    }

    /// Writes the chunks of `slots` at chunk `base` of `LB_ALTERNATES` that
    /// differ from `written` (what the region held; read back if unknown);
    /// returns how many were written.
    fn write_changed_alternates(
        &mut self,
        base: u32,
        slots: &[AltSlot],
        written: Option<Vec<AltSlot>>,
    ) -> Result<usize> {
        let old = match written {
            Some(w) if w.len() == slots.len() => w,
            _ => self.dp.read_alternates(base, slots.len() as u32)?,
        };
        let size = TABLE_CHUNK_SLOTS as usize;
        let mut chunks = 0;
        for (c, (new, old)) in slots.chunks(size).zip(old.chunks(size)).enumerate() {
            if new != old {
                self.dp.write_alternates(base + c as u32, new)?;
                chunks += 1;
            }
        }
        Ok(chunks)
    }
}

/// The handles of `table`'s alternates, slot by slot, in order, skipping
/// those that are not a backend of the VIP now (a previous configuration's).
fn alt_handles(
    table: &AltTable,
    backends: &BTreeMap<IpAddr, BackendState>,
    m: usize,
) -> Vec<AltSlot> {
    let by_member: Vec<u32> = table
        .members
        .iter()
        .map(|a| backends.get(a).map_or(0, |b| b.handle))
        .collect();
    (0..m)
        .map(|s| {
            let mut out = AltSlot::default();
            let handles = table.slots.get(s).into_iter().flatten();
            let live = handles
                .take_while(|&&i| i != second_chance::NONE)
                .map(|&i| by_member[i as usize])
                .filter(|&h| h != 0);
            for (o, h) in out.iter_mut().zip(live) {
                *o = h;
            }
            out
        })
        .collect()
}

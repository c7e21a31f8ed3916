//! Maglev lookup: flow hash → slot → backend handle.

use lb_common::{DatapathConfig, VipMeta, consts::TABLE_CHUNK_SLOTS, flow::maglev_slot};

use crate::maps::LB_TABLES;

/// The handle in the VIP's active table at `hash % M`, M being the VIP's
/// own table size (the global one for an entry written without it); `None`
/// if the slot is empty or the table is missing (a VIP the daemon has not
/// finished writing).
#[inline(always)]
pub fn lookup(cfg: &DatapathConfig, meta: &VipMeta, hash: u64) -> Option<u32> {
    let m = meta.maglev_size(cfg.table_size);
    if m == 0 {
        return None;
    }
    let slot = maglev_slot(hash, m);
    let chunk = LB_TABLES.get_ptr(meta.table_base + slot / TABLE_CHUNK_SLOTS)?;
    let i = (slot % TABLE_CHUNK_SLOTS) as usize;
    // SAFETY: `chunk` is a live map value; `i < TABLE_CHUNK_SLOTS`.
    let handle = unsafe { *(*chunk).slots.get_unchecked(i) };
    (handle != 0).then_some(handle)
}

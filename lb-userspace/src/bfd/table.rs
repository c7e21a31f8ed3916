//! The two BFD maps as `lbd` sees them: `LB_BFD_PEERS` (each session's
//! configuration, which only `lbd` writes) and `LB_BFD_STATE` (each
//! session's state, which only `lb_xdp` writes, but for the zeroing of a
//! slot given to a new session). [`BfdTable`] is the interface; the
//! kernel's maps ([`KernelBfdTable`], opened from the instance's pins or
//! taken from a loaded object) and an in-memory one for tests
//! (`FakeBfdTable`, compiled for tests only) implement it.
//!
//! These maps are outside the reconciler on purpose: they are the BGP
//! speaker's (ARCHITECTURE.md, "BFD"), and nothing in them is VIP state.

use std::{
    path::Path,
    sync::{Mutex, MutexGuard},
};

use aya::maps::{Array, HashMap, Map, MapData};
use lb_common::{
    BfdConfig, BfdKey, BfdState,
    bfd::BFD_MAX_SESSIONS,
    consts::{MAP_BFD_PEERS, MAP_BFD_STATE},
};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BfdTableError {
    #[error("BFD map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("BFD slot {slot} is outside the {BFD_MAX_SESSIONS} sessions")]
    Slot { slot: u32 },
}

type Result<T> = std::result::Result<T, BfdTableError>;

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> BfdTableError {
    move |e| BfdTableError::Map {
        name,
        source: Box::new(e),
    }
}

/// Reading and writing the BFD maps.
pub trait BfdTable: Send + Sync {
    /// Every configured session.
    fn peers(&self) -> Result<Vec<(BfdKey, BfdConfig)>>;
    fn set_peer(&self, key: &BfdKey, config: &BfdConfig) -> Result<()>;
    fn remove_peer(&self, key: &BfdKey) -> Result<()>;
    fn state(&self, slot: u32) -> Result<BfdState>;
    /// Makes a slot a fresh session's (zeroes, state Down) before a new
    /// session takes it.
    fn reset_state(&self, slot: u32) -> Result<()>;
}

/// The kernel's maps.
pub struct KernelBfdTable {
    peers: Mutex<HashMap<MapData, BfdKey, BfdConfig>>,
    state: Mutex<Array<MapData, BfdState>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KernelBfdTable {
    /// The maps an `lbd` pinned under `dir` (its pin directory).
    pub fn open_pinned(dir: &Path) -> Result<Self> {
        let open = |name: &'static str| -> Result<Map> {
            let data = MapData::from_pin(dir.join(name)).map_err(map_err(name))?;
            Ok(match name {
                MAP_BFD_PEERS => Map::HashMap(data),
                _ => Map::Array(data),
            })
        };
        Self::from_maps(open(MAP_BFD_PEERS)?, open(MAP_BFD_STATE)?)
    }

    /// The maps of a loaded object (`KernelDataplane::take_bfd_maps`).
    pub fn from_maps(peers: Map, state: Map) -> Result<Self> {
        Ok(Self {
            peers: Mutex::new(HashMap::try_from(peers).map_err(map_err(MAP_BFD_PEERS))?),
            state: Mutex::new(Array::try_from(state).map_err(map_err(MAP_BFD_STATE))?),
        })
    }
}

impl BfdTable for KernelBfdTable {
    fn peers(&self) -> Result<Vec<(BfdKey, BfdConfig)>> {
        lock(&self.peers)
            .iter()
            .map(|e| e.map_err(map_err(MAP_BFD_PEERS)))
            .collect()
    }

    fn set_peer(&self, key: &BfdKey, config: &BfdConfig) -> Result<()> {
        lock(&self.peers)
            .insert(key, config, 0)
            .map_err(map_err(MAP_BFD_PEERS))
    }

    fn remove_peer(&self, key: &BfdKey) -> Result<()> {
        match lock(&self.peers).remove(key) {
            Ok(()) => Ok(()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(MAP_BFD_PEERS)(e)),
        }
    }

    fn state(&self, slot: u32) -> Result<BfdState> {
        check_slot(slot)?;
        lock(&self.state)
            .get(&slot, 0)
            .map_err(map_err(MAP_BFD_STATE))
    }

    fn reset_state(&self, slot: u32) -> Result<()> {
        check_slot(slot)?;
        lock(&self.state)
            .set(slot, fresh(), 0)
            .map_err(map_err(MAP_BFD_STATE))
    }
}

/// A new session's state: everything 0, Down (0 would be AdminDown, in
/// which RFC 5880 discards every packet).
fn fresh() -> BfdState {
    BfdState {
        state: lb_common::bfd::STATE_DOWN,
        ..BfdState::default()
    }
}

fn check_slot(slot: u32) -> Result<()> {
    if slot >= BFD_MAX_SESSIONS {
        return Err(BfdTableError::Slot { slot });
    }
    Ok(())
}

#[cfg(test)]
pub use fake::FakeBfdTable;

/// The in-memory table, compiled for tests only.
#[cfg(test)]
mod fake {
    use std::{collections::BTreeMap, sync::Mutex};

    use lb_common::{BfdConfig, BfdKey, BfdState};

    use super::{BfdTable, Result, check_slot, fresh, lock};

    /// In memory, for tests: the state is whatever the test sets.
    #[derive(Default)]
    pub struct FakeBfdTable {
        peers: Mutex<BTreeMap<[u32; 5], (BfdKey, BfdConfig)>>,
        state: Mutex<BTreeMap<u32, BfdState>>,
    }

    fn fake_key(k: &BfdKey) -> [u32; 5] {
        [
            k.addr[0],
            k.addr[1],
            k.addr[2],
            k.addr[3],
            u32::from(k.family),
        ]
    }

    impl FakeBfdTable {
        /// Sets a slot's state, as the datapath would.
        pub fn put_state(&self, slot: u32, state: BfdState) {
            lock(&self.state).insert(slot, state);
        }
    }

    impl BfdTable for FakeBfdTable {
        fn peers(&self) -> Result<Vec<(BfdKey, BfdConfig)>> {
            Ok(lock(&self.peers).values().copied().collect())
        }

        fn set_peer(&self, key: &BfdKey, config: &BfdConfig) -> Result<()> {
            lock(&self.peers).insert(fake_key(key), (*key, *config));
            Ok(())
        }

        fn remove_peer(&self, key: &BfdKey) -> Result<()> {
            lock(&self.peers).remove(&fake_key(key));
            Ok(())
        }

        fn state(&self, slot: u32) -> Result<BfdState> {
            check_slot(slot)?;
            Ok(lock(&self.state).get(&slot).copied().unwrap_or_default())
        }

        fn reset_state(&self, slot: u32) -> Result<()> {
            check_slot(slot)?;
            lock(&self.state).insert(slot, fresh());
            Ok(())
        }
    }
}

//! QUIC-LB server IDs in `LB_QUIC_SERVERS`: for every VIP with `quic:`,
//! each backend's server ID under the VIP's id, naming its handle. Synced
//! after every apply of the whole VIP set (the stale entries removed
//! first, then new and changed ones written: the map holds
//! `max_backends`, not old and new together); a backend's handle never changes while
//! it stays, so health alone writes nothing here. Between the apply that
//! retires a backend and this sync, its entry names a handle the datapath
//! no longer honours (it checks the handle and the VIP), which is a miss.

use std::collections::HashMap;

use lb_common::quic::{QuicServerKey, server_key};

use super::{Reconciler, Result};
use crate::{config::VipConfig, dataplane::Dataplane};

impl<D: Dataplane> Reconciler<D> {
    /// Makes `LB_QUIC_SERVERS` hold the server IDs of `desired`'s QUIC
    /// VIPs (all of them in the maps already).
    pub(super) fn sync_quic(&mut self, desired: &[VipConfig]) -> Result<()> {
        let want = self.wanted_quic(desired);
        super::sync_entries(
            &mut self.dp,
            &mut self.quic,
            &want,
            |dp, key, handle| Ok(dp.set_quic_server(key, *handle)?),
            |dp, key| Ok(dp.remove_quic_server(key)?),
        )
    }

    fn wanted_quic(&self, desired: &[VipConfig]) -> HashMap<QuicServerKey, u32> {
        let mut want = HashMap::new();
        for vip in desired {
            let (Some(quic), Some(state)) = (vip.quic, self.vips.get(&vip.id)) else {
                continue;
            };
            for b in &vip.backends {
                let (Some(sid), Some(backend)) = (&b.server_id, state.backends.get(&b.address))
                else {
                    continue;
                };
                let key = server_key(state.meta.id(), quic.server_id_len, &sid.0);
                want.insert(key, backend.handle);
            }
        }
        want
    }
}

//! Runtime changes made through the API, kept as an overlay on the
//! configuration file, persisted so that they survive a restart.
//!
//! The file stays the operator's base; the overlay records what `lbctl`
//! added, removed or re-weighted on top of it. The effective VIP set is
//! `overlay.apply(file)`, recomputed at start and on every reload. Which
//! of a runtime change and a later file edit wins is [`overrides`]'
//! rule: the newest intent for each object.
//!
//! Persistence is crash-safe: write a temporary file, fsync it, rename it
//! over the old one, fsync the directory. A reader sees the old state or the
//! new one, never a torn write.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::{BackendConfig, VipConfig, VipId};

mod overrides;

pub use overrides::{Origins, Override, Stamp};

#[derive(Debug, Error)]
pub enum StateError {
    #[error("no VIP {0}")]
    NoSuchVip(VipId),
    #[error("VIP {0} already exists")]
    VipExists(VipId),
    #[error("VIP {vip} has no backend {addr}")]
    NoSuchBackend { vip: VipId, addr: IpAddr },
    #[error("VIP {vip} already has backend {addr} (use `backend weight` to change it)")]
    BackendExists { vip: VipId, addr: IpAddr },
    #[error("state file {path}: {message}")]
    File { path: String, message: String },
}

/// Sets `addr`'s weight (adding it if absent) or, for `None`, removes it.
fn edit_backend(backends: &mut Vec<BackendConfig>, addr: IpAddr, change: Option<u32>) {
    let pos = backends.iter().position(|b| b.address == addr);
    match (change, pos) {
        (Some(w), Some(i)) => backends[i].weight = w,
        (Some(w), None) => backends.push(BackendConfig::new(addr, w)),
        (None, Some(i)) => {
            backends.remove(i);
        }
        (None, None) => {}
    }
}

/// What the API changed relative to the configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// VIPs defined through the API (complete definitions).
    #[serde(default)]
    pub vips_added: BTreeMap<VipId, VipConfig>,
    /// File VIPs deleted through the API.
    #[serde(default)]
    pub vips_deleted: BTreeSet<VipId>,
    /// Per file VIP: backends added or re-weighted (`Some(weight)`) or
    /// deleted (`None`).
    #[serde(default)]
    pub backends: BTreeMap<VipId, BTreeMap<IpAddr, Option<u32>>>,
    /// Backends an operator drained (`lbctl backend drain`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drained: BTreeMap<VipId, BTreeSet<IpAddr>>,
    /// Where each change above came from, and what the file said of its
    /// object then ([`overrides`]: which change wins).
    #[serde(default, skip_serializing_if = "Origins::is_empty")]
    pub origins: Origins,
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        self.vips_added.is_empty()
            && self.vips_deleted.is_empty()
            && self.backends.is_empty()
            && self.drained.is_empty()
    }

    /// The drained backends that exist in `effective`.
    pub fn drained_in(&self, effective: &[VipConfig]) -> BTreeSet<(VipId, IpAddr)> {
        effective
            .iter()
            .flat_map(|v| v.backends.iter().map(move |b| (v.id, b.address)))
            .filter(|(id, addr)| self.drained.get(id).is_some_and(|s| s.contains(addr)))
            .collect()
    }

    /// When each drain began (seconds since the Unix epoch, as its origin
    /// says), so that a restarted `lbd` goes on with its `drain_timeout`
    /// instead of starting it again.
    pub fn drain_times(&self) -> BTreeMap<(VipId, IpAddr), u64> {
        self.origins
            .drained
            .iter()
            .flat_map(|(id, m)| m.iter().map(move |(addr, o)| ((*id, *addr), o.time)))
            .collect()
    }

    /// The drains `running` does not have begin `now` (a revert brings
    /// back a drain that an undrain had ended): their origins say so, so
    /// that a restart counts their `drain_timeout` from the revert.
    pub fn restamp_drains(&mut self, running: &Overlay, now: u64) {
        for (id, addrs) in &self.drained {
            for addr in addrs {
                if running.drained.get(id).is_some_and(|s| s.contains(addr)) {
                    continue;
                }
                if let Some(o) = self
                    .origins
                    .drained
                    .get_mut(id)
                    .and_then(|m| m.get_mut(addr))
                {
                    o.time = now;
                }
            }
        }
    }

    /// Drains (or undrains) one backend: it leaves the table, its existing
    /// connections continue until the VIP's `drain_timeout`.
    pub fn set_drained(
        &mut self,
        base: &[VipConfig],
        id: &VipId,
        addr: IpAddr,
        drained: bool,
    ) -> Result<(), StateError> {
        self.require_backend(base, id, addr)?;
        if drained {
            self.drained.entry(*id).or_default().insert(addr);
        } else if let Some(set) = self.drained.get_mut(id) {
            set.remove(&addr);
            if set.is_empty() {
                self.drained.remove(id);
            }
        }
        Ok(())
    }

    /// The effective VIPs: `base` (the file) with this overlay applied, in
    /// VIP order.
    pub fn apply(&self, base: &[VipConfig]) -> Vec<VipConfig> {
        let mut vips: BTreeMap<VipId, VipConfig> = base.iter().map(|v| (v.id, v.clone())).collect();
        for id in &self.vips_deleted {
            vips.remove(id);
        }
        for (id, v) in &self.vips_added {
            vips.insert(*id, v.clone());
        }
        for (id, changes) in &self.backends {
            let Some(vip) = vips.get_mut(id) else {
                continue;
            };
            if self.vips_added.contains_key(id) {
                continue;
            }
            for (addr, change) in changes {
                edit_backend(&mut vip.backends, *addr, *change);
            }
        }
        vips.into_values().collect()
    }

    fn effective_vip(&self, base: &[VipConfig], id: &VipId) -> Result<VipConfig, StateError> {
        self.apply(base)
            .into_iter()
            .find(|v| v.id == *id)
            .ok_or(StateError::NoSuchVip(*id))
    }

    /// Fails unless the effective VIP `id` has backend `addr`.
    fn require_backend(
        &self,
        base: &[VipConfig],
        id: &VipId,
        addr: IpAddr,
    ) -> Result<(), StateError> {
        let vip = self.effective_vip(base, id)?;
        if vip.backends.iter().any(|b| b.address == addr) {
            Ok(())
        } else {
            Err(StateError::NoSuchBackend { vip: *id, addr })
        }
    }

    pub fn add_vip(&mut self, base: &[VipConfig], vip: VipConfig) -> Result<(), StateError> {
        if self.apply(base).iter().any(|v| v.id == vip.id) {
            return Err(StateError::VipExists(vip.id));
        }
        self.vips_deleted.remove(&vip.id);
        self.backends.remove(&vip.id);
        self.vips_added.insert(vip.id, vip);
        Ok(())
    }

    pub fn delete_vip(&mut self, base: &[VipConfig], id: &VipId) -> Result<(), StateError> {
        self.effective_vip(base, id)?;
        self.vips_added.remove(id);
        self.backends.remove(id);
        self.drained.remove(id);
        if base.iter().any(|v| v.id == *id) {
            self.vips_deleted.insert(*id);
        }
        Ok(())
    }

    fn set_backend(&mut self, id: &VipId, addr: IpAddr, change: Option<u32>) {
        if let Some(vip) = self.vips_added.get_mut(id) {
            edit_backend(&mut vip.backends, addr, change);
        } else {
            self.backends.entry(*id).or_default().insert(addr, change);
        }
    }

    pub fn add_backend(
        &mut self,
        base: &[VipConfig],
        id: &VipId,
        addr: IpAddr,
        weight: u32,
    ) -> Result<(), StateError> {
        let vip = self.effective_vip(base, id)?;
        if vip.backends.iter().any(|b| b.address == addr) {
            return Err(StateError::BackendExists { vip: *id, addr });
        }
        self.set_backend(id, addr, Some(weight));
        Ok(())
    }

    pub fn delete_backend(
        &mut self,
        base: &[VipConfig],
        id: &VipId,
        addr: IpAddr,
    ) -> Result<(), StateError> {
        self.require_backend(base, id, addr)?;
        self.set_backend(id, addr, None);
        if let Some(set) = self.drained.get_mut(id) {
            set.remove(&addr);
        }
        Ok(())
    }

    pub fn set_weight(
        &mut self,
        base: &[VipConfig],
        id: &VipId,
        addr: IpAddr,
        weight: u32,
    ) -> Result<(), StateError> {
        self.require_backend(base, id, addr)?;
        self.set_backend(id, addr, Some(weight));
        Ok(())
    }

    /// Reads the overlay; a missing file is an empty overlay.
    pub fn load(path: &Path) -> Result<Overlay, StateError> {
        let file_err = |message: String| StateError::File {
            path: path.display().to_string(),
            message,
        };
        let broken = |e: serde_json::Error| {
            file_err(format!(
                "{e}; it holds the changes made with lbctl: fix it, or move it away to start without them"
            ))
        };
        match std::fs::read(path) {
            Ok(bytes) => {
                let mut value: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(broken)?;
                upgrade_all_ports(&mut value);
                serde_json::from_value(value).map_err(broken)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Overlay::default()),
            Err(e) => Err(file_err(e.to_string())),
        }
    }

    /// Writes the overlay atomically and durably, readable by root only.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let file_err = |message: String| StateError::File {
            path: path.display().to_string(),
            message,
        };
        let mut body = serde_json::to_vec_pretty(self).map_err(|e| file_err(e.to_string()))?;
        body.push(b'\n');
        crate::atomic_file::write_private(path, &body).map_err(|e| file_err(e.to_string()))
    }
}

/// Versions before port 0 was refused wrote all-ports VIPs with `"port":
/// 0`; such a file still loads (its VIPs become `all`).
fn upgrade_all_ports(value: &mut serde_json::Value) {
    if let Some(added) = value.get_mut("vips_added").and_then(|v| v.as_object_mut()) {
        for vip in added.values_mut() {
            if let Some(port) = vip.get_mut("port")
                && port.as_u64() == Some(0)
            {
                *port = serde_json::Value::from("all");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;

    fn id(s: &str) -> VipId {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vip(s: &str, backends: &[(&str, u32)]) -> VipConfig {
        let backends = backends
            .iter()
            .map(|(a, w)| BackendConfig::new(ip(a), *w))
            .collect();
        VipConfig::new(id(s), backends)
    }

    fn base() -> Vec<VipConfig> {
        vec![vip("10.0.0.1:80/tcp", &[("10.1.0.1", 1), ("10.1.0.2", 1)])]
    }

    #[test]
    fn empty_overlay_is_the_file() {
        assert_eq!(Overlay::default().apply(&base()), base());
    }

    #[test]
    fn backend_changes_apply_on_top_of_the_file() {
        let b = base();
        let v = id("10.0.0.1:80/tcp");
        let mut o = Overlay::default();
        o.add_backend(&b, &v, ip("10.1.0.3"), 5).unwrap();
        o.set_weight(&b, &v, ip("10.1.0.1"), 3).unwrap();
        o.delete_backend(&b, &v, ip("10.1.0.2")).unwrap();
        let eff = o.apply(&b);
        assert_eq!(
            eff,
            vec![vip("10.0.0.1:80/tcp", &[("10.1.0.1", 3), ("10.1.0.3", 5)])]
        );
        assert!(matches!(
            o.add_backend(&b, &v, ip("10.1.0.3"), 1),
            Err(StateError::BackendExists { .. })
        ));
        assert!(matches!(
            o.delete_backend(&b, &v, ip("10.1.0.2")),
            Err(StateError::NoSuchBackend { .. })
        ));
        assert!(matches!(
            o.set_weight(&b, &id("10.0.0.9:80/tcp"), ip("10.1.0.1"), 1),
            Err(StateError::NoSuchVip(_))
        ));
    }

    #[test]
    fn vips_added_and_deleted() {
        let b = base();
        let mut o = Overlay::default();
        o.add_vip(&b, vip("10.0.0.2:53/udp", &[("10.1.0.9", 1)]))
            .unwrap();
        assert!(matches!(
            o.add_vip(&b, vip("10.0.0.1:80/tcp", &[])),
            Err(StateError::VipExists(_))
        ));
        o.add_backend(&b, &id("10.0.0.2:53/udp"), ip("10.1.0.8"), 2)
            .unwrap();
        o.delete_vip(&b, &id("10.0.0.1:80/tcp")).unwrap();
        let eff = o.apply(&b);
        assert_eq!(
            eff,
            vec![vip("10.0.0.2:53/udp", &[("10.1.0.9", 1), ("10.1.0.8", 2)])]
        );
        assert_eq!(eff[0].id.proto, Protocol::Udp);
        // Re-adding a deleted file VIP through the API replaces it.
        o.add_vip(&b, vip("10.0.0.1:80/tcp", &[("10.1.0.5", 1)]))
            .unwrap();
        assert_eq!(o.apply(&b).len(), 2);
    }

    #[test]
    fn drains_are_kept_for_existing_backends_only() {
        let b = base();
        let v = id("10.0.0.1:80/tcp");
        let mut o = Overlay::default();
        o.set_drained(&b, &v, ip("10.1.0.2"), true).unwrap();
        assert!(matches!(
            o.set_drained(&b, &v, ip("10.1.0.9"), true),
            Err(StateError::NoSuchBackend { .. })
        ));
        assert_eq!(
            o.drained_in(&o.apply(&b)),
            BTreeSet::from([(v, ip("10.1.0.2"))])
        );
        assert!(!o.is_empty());
        o.delete_backend(&b, &v, ip("10.1.0.2")).unwrap();
        assert!(o.drained_in(&o.apply(&b)).is_empty());
        o.set_drained(&b, &v, ip("10.1.0.1"), true).unwrap();
        o.set_drained(&b, &v, ip("10.1.0.1"), false).unwrap();
        assert!(o.drained.is_empty());
    }

    #[test]
    fn an_older_file_with_port_zero_still_loads() {
        let dir = crate::scratch::ScratchDir::new("state-old");
        let path = dir.join("s.json");
        std::fs::write(
            &path,
            r#"{"vips_added":{"10.0.0.9:*/udp":{"address":"10.0.0.9","port":0,"protocol":"udp","backends":[{"address":"10.1.0.1"}]}}}"#,
        )
        .unwrap();
        let o = Overlay::load(&path).expect("an older state file");
        assert_eq!(
            o.vips_added.keys().next().unwrap().to_string(),
            "10.0.0.9:*/udp"
        );
        o.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""port": "all""#), "{text}");
        assert_eq!(Overlay::load(&path).unwrap(), o);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "the state file is root's alone");
    }

    #[test]
    fn survives_a_round_trip_through_the_file() {
        let dir = crate::scratch::ScratchDir::new("state");
        let path = dir.join("s.json");
        let b = base();
        let mut o = Overlay::default();
        o.add_vip(&b, vip("[2001:db8::1]:*/tcp", &[("fd00::1", 4)]))
            .unwrap();
        o.delete_backend(&b, &id("10.0.0.1:80/tcp"), ip("10.1.0.1"))
            .unwrap();
        o.save(&path).unwrap();
        assert_eq!(Overlay::load(&path).unwrap(), o);
        assert!(!path.with_extension("json.tmp").exists());
        std::fs::write(&path, b"{ not json").unwrap();
        let err = Overlay::load(&path).unwrap_err().to_string();
        assert!(err.contains("s.json") && err.contains("lbctl"), "{err}");
        assert_eq!(
            Overlay::load(&dir.join("missing.json")).unwrap(),
            Overlay::default()
        );
    }
}

//! What a change would do, before it is made (`lbctl diff`, `--dry-run`):
//! VIPs added and removed; per VIP, backends added, removed and
//! re-weighted and settings changed; the share of each table's slots
//! that would get another backend; and the connection-table entries
//! that point at backends that would leave, and how many of them are
//! live flows (seen within 10 s: the connections that really break).
//!
//! The tables compared are the one published now (as the reconciler
//! holds it) and the one the change would publish, built by the same
//! function the reconciler builds with ([`crate::reconcile::maglev_table`])
//! from the lifecycle's plan for the new configuration (health, drains,
//! slow start and panic as they stand now). When a VIP's table size
//! changes, the tables have different slots: the share of flows that move
//! is measured over flow hashes instead (nearly all of them move).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Instant,
};

use lb_common::FlowEntry;

use super::{Daemon, Result, commit::Target, refused};
use crate::api::ErrorKind;
use crate::{
    api::{BackendWeight, ChangePreview, Reweight, SettingChange, VipChange, VipRemoved},
    config::{Config, VipConfig, VipId},
    dataplane::Dataplane,
    digest,
    lifecycle::Plan,
    reconcile::maglev_table,
};

impl<D: Dataplane> Daemon<D> {
    /// What running `target` instead of the running configuration changes.
    pub fn preview(&self, target: &Target) -> Result<ChangePreview> {
        let before = self.effective();
        let after = target.effective();
        let m = self.config.layout.table_size;
        let now = Instant::now();
        let mut prospect = self.lifecycle.clone();
        prospect.sync(&after, &target.overlay.drained_in(&after), now, false);
        let plan = prospect.plan(&after, now);

        let old: BTreeMap<VipId, &VipConfig> = before.iter().map(|v| (v.id, v)).collect();
        let new: BTreeMap<VipId, &VipConfig> = after.iter().map(|v| (v.id, v)).collect();
        let leaving = self.leaving_handles(&old, &new);
        let flows = self.count_flows(&leaving.values().flatten().copied().collect())?;
        let breaking = |id: &VipId| -> Breaking {
            let handles = leaving.get(id).into_iter().flatten();
            handles.fold(Breaking::default(), |mut sum, h| {
                let (entries, live) = flows.get(h).copied().unwrap_or((0, Some(0)));
                sum.entries += entries;
                sum.live = sum.live.zip(live).map(|(a, b)| a + b);
                sum
            })
        };
        // A key that cannot be read refuses the change itself (check).
        let keys = (
            self.settings.hash_key.unwrap_or([0; 2]),
            super::settings::hash_key_of(&target.config)
                .ok()
                .flatten()
                .unwrap_or([0; 2]),
        );
        let mut vips_changed = Vec::new();
        for (id, was) in &old {
            let Some(will) = new.get(id) else { continue };
            let change = self.vip_change(was, will, &plan, breaking(id), keys)?;
            if let Some(change) = change {
                vips_changed.push(change);
            }
        }
        Ok(ChangePreview {
            digest_before: digest::config(m, &before),
            digest_after: digest::config(m, &after),
            vips_added: new
                .keys()
                .filter(|id| !old.contains_key(id))
                .copied()
                .collect(),
            vips_removed: old
                .keys()
                .filter(|id| !new.contains_key(id))
                .map(|id| VipRemoved {
                    vip: *id,
                    flows_breaking: breaking(id).entries,
                    live_flows_breaking: breaking(id).live,
                })
                .collect(),
            vips_changed,
            settings: global_changes(&self.config, &target.config),
            warnings: Vec::new(),
            overrides: target
                .overlay
                .overrides(&target.config.vips)
                .into_iter()
                .map(super::views::override_row)
                .collect(),
            overrides_dropped: self
                .dropped_overrides(target)
                .into_iter()
                .map(super::views::override_row)
                .collect(),
        })
    }

    /// The runtime changes in force now that `target` no longer has, each
    /// with what `target`'s file says of its object (what runs after it).
    pub fn dropped_overrides(&self, target: &Target) -> Vec<crate::state::Override> {
        let after = target.overlay.overrides(&target.config.vips);
        let key = |o: &crate::state::Override| (o.vip, o.backend, o.field);
        let kept: BTreeSet<_> = after.iter().map(key).collect();
        self.overlay
            .overrides(&self.config.vips)
            .into_iter()
            .filter(|o| !kept.contains(&key(o)))
            .map(|o| crate::state::Override {
                file: o.file_now(&target.config.vips),
                ..o
            })
            .collect()
    }

    /// Per VIP, the handles of its backends that the change removes (all
    /// of them for a VIP that goes).
    fn leaving_handles(
        &self,
        old: &BTreeMap<VipId, &VipConfig>,
        new: &BTreeMap<VipId, &VipConfig>,
    ) -> BTreeMap<VipId, Vec<u32>> {
        let programmed = self.reconciler.vips();
        old.keys()
            .filter_map(|id| {
                let state = programmed.get(id)?;
                let stays: BTreeSet<IpAddr> = new
                    .get(id)
                    .map(|v| v.backends.iter().map(|b| b.address).collect())
                    .unwrap_or_default();
                let handles = state
                    .backends
                    .iter()
                    .filter(|(addr, _)| !stays.contains(addr))
                    .map(|(_, b)| b.handle)
                    .collect();
                Some((*id, handles))
            })
            .collect()
    }

    /// Connection-table entries per backend handle, for `handles`, and
    /// how many of them are live (`None` without the kernel's clock).
    fn count_flows(&self, handles: &BTreeSet<u32>) -> Result<BTreeMap<u32, (u64, Option<u64>)>> {
        let mut counts = BTreeMap::new();
        if handles.is_empty() {
            return Ok(counts);
        }
        let now = self.jiffies.read().map(crate::liveflows::tick_of);
        let window = self.live_clock.window_ticks();
        self.reconciler.dataplane().scan_flows(&mut |bucket| {
            count_bucket(bucket, handles, now.map(|n| (n, window)), &mut counts);
        })?;
        Ok(counts)
    }

    /// One VIP's change; `None` if nothing about it changes.
    fn vip_change(
        &self,
        was: &VipConfig,
        will: &VipConfig,
        plan: &Plan,
        breaking: Breaking,
        keys: ([u64; 2], [u64; 2]),
    ) -> Result<Option<VipChange>> {
        let layout = &self.config.layout;
        let m_was = self
            .reconciler
            .vips()
            .get(&was.id)
            .map_or(was.maglev_size(layout), |v| v.table_size);
        let m = will.maglev_size(layout);
        let before = self
            .reconciler
            .table_addresses(&was.id)?
            .unwrap_or_else(|| vec![None; m_was as usize]);
        let after = planned_table(plan, &will.id, m)?;
        let rehashed = was.hash != will.hash || keys.0 != keys.1;
        let slots_moved = if rehashed {
            let share = flows_moved_rehashed(was, will, keys, (&before, &after));
            (share * f64::from(m)).round() as u32
        } else if m == m_was {
            before.iter().zip(&after).filter(|(a, b)| a != b).count() as u32
        } else {
            (flows_moved(&before, &after) * f64::from(m)).round() as u32
        };
        let (added, removed, reweighted) = backend_changes(was, will);
        let settings = vip_settings(was, will);
        let unchanged = slots_moved == 0
            && added.is_empty()
            && removed.is_empty()
            && reweighted.is_empty()
            && settings.is_empty();
        if unchanged {
            return Ok(None);
        }
        Ok(Some(VipChange {
            vip: will.id,
            backends_added: added,
            backends_removed: removed,
            backends_reweighted: reweighted,
            settings,
            slots_moved,
            table_size: m,
            share_moved: f64::from(slots_moved) / f64::from(m),
            flows_breaking: breaking.entries,
            live_flows_breaking: breaking.live,
        }))
    }
}

/// The connection-table entries of backends that leave, and the live
/// flows among them (`None` without the kernel's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Breaking {
    entries: u64,
    live: Option<u64>,
}

impl Default for Breaking {
    fn default() -> Self {
        Self {
            entries: 0,
            live: Some(0),
        }
    }
}

/// Adds a bucket's entries of `handles` to `counts`: (entries, live),
/// live judged at `clock` (the tick now, the idle window in ticks).
fn count_bucket(
    bucket: &lb_common::FlowBucket,
    handles: &BTreeSet<u32>,
    clock: Option<(u16, u16)>,
    counts: &mut BTreeMap<u32, (u64, Option<u64>)>,
) {
    for (e, stamp) in bucket.entries.iter().zip(bucket.stamps) {
        if *e == FlowEntry::EMPTY || !handles.contains(&e.handle()) {
            continue;
        }
        let count = counts.entry(e.handle()).or_insert((0, clock.map(|_| 0)));
        count.0 += 1;
        if let (Some(live), Some((now, window))) = (count.1.as_mut(), clock)
            && crate::liveflows::age_ticks(now, stamp) < window
        {
            *live += 1;
        }
    }
}

/// The share of flows whose backend differs between two tables of
/// different sizes: 65,536 flow hashes spread over the 32-bit range (a
/// flow's slot is its hash's low 32 bits modulo M).
fn flows_moved(before: &[Option<IpAddr>], after: &[Option<IpAddr>]) -> f64 {
    const SAMPLES: u32 = 1 << 16;
    if before.is_empty() || after.is_empty() {
        return 1.0;
    }
    let moved = (0..SAMPLES)
        .map(|i| i.wrapping_mul(0x9E37_79B1) as usize)
        .filter(|h| before[h % before.len()] != after[h % after.len()])
        .count();
    moved as f64 / f64::from(SAMPLES)
}

/// The share of flows whose backend differs when the hash that picks it
/// changes (the VIP's fields, or the tier's key: `keys` before and
/// after), and maybe the table too: 65,536 flows of made-up clients to the
/// VIP, each placed by the old hash in the old table and by the new hash
/// in the new one.
fn flows_moved_rehashed(
    was: &VipConfig,
    will: &VipConfig,
    keys: ([u64; 2], [u64; 2]),
    (before, after): (&[Option<IpAddr>], &[Option<IpAddr>]),
) -> f64 {
    use lb_common::{
        FlowKey,
        flow::{maglev_slot, pick_hash},
    };
    const SAMPLES: u32 = 1 << 16;
    if before.is_empty() || after.is_empty() {
        return 1.0;
    }
    let id = will.id;
    // As the datapath's `vip_hash`: the VIP's fields, no ports if it
    // hashes fragments.
    let fields = |v: &VipConfig| {
        let frag = if v.fragments == crate::config::FragmentPolicy::Hash {
            lb_common::consts::VIP_F_FRAG_HASH
        } else {
            0
        };
        lb_common::flow::pick_fields(v.hash.flags() | frag)
    };
    let place = |fields: u16, key: &[u64; 2], table: &[Option<IpAddr>], f: &FlowKey| {
        let h = pick_hash(
            key,
            fields,
            f.family,
            &f.src,
            &f.dst,
            f.ports_word(),
            f.proto,
        );
        table[maglev_slot(h, table.len() as u32) as usize]
    };
    let moved = (0..SAMPLES)
        .filter(|i| {
            let r = lb_common::flow::fmix64(u64::from(*i) ^ 0x5bd1_e995);
            let client: IpAddr = if id.addr.is_ipv4() {
                std::net::Ipv4Addr::from(0x6400_0000 | (r as u32 & 0x00ff_ffff)).into()
            } else {
                std::net::Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(r)).into()
            };
            let dport = if id.port == 0 {
                (r >> 48) as u16
            } else {
                id.port
            };
            let f = FlowKey::new(client, id.addr, id.proto.number(), (r >> 32) as u16, dport);
            place(fields(was), &keys.0, before, &f) != place(fields(will), &keys.1, after, &f)
        })
        .count();
    moved as f64 / f64::from(SAMPLES)
}

/// The table `plan` gives VIP `id`, slot by slot.
fn planned_table(plan: &Plan, id: &VipId, m: u32) -> Result<Vec<Option<IpAddr>>> {
    let Some(vip) = plan.vips.iter().find(|v| v.id == *id) else {
        return Ok(vec![None; m as usize]);
    };
    let members: BTreeMap<IpAddr, u32> = vip
        .backends
        .iter()
        .filter(|b| plan.usable.get(&(*id, b.address)).copied().unwrap_or(true))
        .map(|b| (b.address, b.weight))
        .collect();
    let table = maglev_table(&members, m)
        .map_err(|e| refused(ErrorKind::InvalidConfig, format!("VIP {id}: {e}")))?;
    Ok(match table {
        Some(slots) => slots.into_iter().map(Some).collect(),
        None => vec![None; m as usize],
    })
}

/// Backends added (with weights), removed, and re-weighted (configured
/// weights).
fn backend_changes(
    was: &VipConfig,
    will: &VipConfig,
) -> (Vec<BackendWeight>, Vec<IpAddr>, Vec<Reweight>) {
    let old: BTreeMap<IpAddr, u32> = was.backends.iter().map(|b| (b.address, b.weight)).collect();
    let new: BTreeMap<IpAddr, u32> = will
        .backends
        .iter()
        .map(|b| (b.address, b.weight))
        .collect();
    let added = new
        .iter()
        .filter(|(a, _)| !old.contains_key(a))
        .map(|(a, w)| BackendWeight {
            address: *a,
            weight: *w,
        })
        .collect();
    let removed = old
        .keys()
        .filter(|a| !new.contains_key(a))
        .copied()
        .collect();
    let reweighted = new
        .iter()
        .filter_map(|(a, w)| {
            let before = *old.get(a)?;
            (before != *w).then_some(Reweight {
                address: *a,
                before,
                after: *w,
            })
        })
        .collect();
    (added, removed, reweighted)
}

/// The VIP's settings (everything but its backends) that differ, in the
/// file's names and notation.
fn vip_settings(was: &VipConfig, will: &VipConfig) -> Vec<SettingChange> {
    let fields = |v: &VipConfig| -> BTreeMap<String, serde_json::Value> {
        match serde_json::to_value(v) {
            Ok(serde_json::Value::Object(map)) => {
                map.into_iter().filter(|(k, _)| k != "backends").collect()
            }
            _ => BTreeMap::new(),
        }
    };
    let (old, new) = (fields(was), fields(will));
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    names
        .into_iter()
        .filter(|n| old.get(*n) != new.get(*n))
        .map(|n| SettingChange {
            name: n.clone(),
            before: show(old.get(n)),
            after: show(new.get(n)),
        })
        .collect()
}

fn show(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => "(default)".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// The global settings a reload can change that differ.
fn global_changes(old: &Config, new: &Config) -> Vec<SettingChange> {
    let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
    let row = |name, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| (name, d(a), d(b));
    let rows: [(&str, String, String); 13] = [
        row("gateway_mac", &old.gateway, &new.gateway),
        row(
            "gateway_refresh",
            &old.gateway_refresh,
            &new.gateway_refresh,
        ),
        row(
            "outer_source_v4",
            &old.outer_source_v4,
            &new.outer_source_v4,
        ),
        row(
            "outer_source_v6",
            &old.outer_source_v6,
            &new.outer_source_v6,
        ),
        row(
            "outer_source_v4_prefix",
            &old.outer_source_v4_prefix,
            &new.outer_source_v4_prefix,
        ),
        row(
            "outer_source_v6_prefix",
            &old.outer_source_v6_prefix,
            &new.outer_source_v6_prefix,
        ),
        row("mtu", &old.mtu, &new.mtu),
        row("gue_port", &old.gue_port, &new.gue_port),
        row("icmp_echo", &old.icmp_echo, &new.icmp_echo),
        row("too_big_no_df", &old.too_big_no_df, &new.too_big_no_df),
        row("malformed", &old.malformed, &new.malformed),
        row("hash_key_file", &old.hash_key_file, &new.hash_key_file),
        row("shutdown_grace", &old.shutdown_grace, &new.shutdown_grace),
    ];
    let mut changes: Vec<SettingChange> = rows
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(name, before, after)| SettingChange {
            name: name.into(),
            before,
            after,
        })
        .collect();
    if old.announce != new.announce {
        changes.push(SettingChange {
            name: "announce".into(),
            before: "(as running)".into(),
            after: "changed: the announcers restart (a short withdrawal)".into(),
        });
    }
    for (name, a, b) in [
        (
            "detach_on_exit",
            old.detach_on_exit.to_string(),
            new.detach_on_exit.to_string(),
        ),
        ("history", old.history.to_string(), new.history.to_string()),
    ] {
        if a != b {
            changes.push(SettingChange {
                name: name.into(),
                before: a,
                after: b,
            });
        }
    }
    changes
}

#[cfg(test)]
mod count_tests {
    use lb_common::FlowBucket;

    use super::*;

    #[test]
    fn entries_and_live_flows_of_leaving_backends_are_counted_apart() {
        let mut b = FlowBucket::default();
        // Handle 1: seen at tick 995 (live at 1000, window 40) and 900
        // (idle); handle 2 not asked for.
        b.entries[0] = FlowEntry::new(1, 1);
        b.stamps[0] = 995;
        b.entries[1] = FlowEntry::new(2, 1);
        b.stamps[1] = 900;
        b.entries[2] = FlowEntry::new(3, 2);
        b.stamps[2] = 1000;
        // Handle 1 again: seen at 999 (live) and exactly a window ago, 960
        // (idle: live means younger than the window).
        b.entries[3] = FlowEntry::new(4, 1);
        b.stamps[3] = 999;
        b.entries[4] = FlowEntry::new(5, 1);
        b.stamps[4] = 960;
        let handles = BTreeSet::from([1]);
        let mut counts = BTreeMap::new();
        count_bucket(&b, &handles, Some((1000, 40)), &mut counts);
        assert_eq!(counts, BTreeMap::from([(1, (4, Some(2)))]));
        let mut counts = BTreeMap::new();
        count_bucket(&b, &handles, None, &mut counts);
        assert_eq!(
            counts,
            BTreeMap::from([(1, (4, None))]),
            "no clock: no live count"
        );
    }

    /// The share of flows whose backend differs between two tables, of
    /// the same size or not; every flow, when one table is empty.
    #[test]
    fn flows_moved_is_the_share_whose_backend_differs() {
        let (a, b) = (
            Some(IpAddr::from([10, 1, 0, 1])),
            Some(IpAddr::from([10, 1, 0, 2])),
        );
        let (all_a, all_b) = (vec![a; 7], vec![b; 11]);
        assert_eq!(flows_moved(&all_a, &all_a), 0.0);
        assert_eq!(
            flows_moved(&all_a, &[a; 11]),
            0.0,
            "a size alone moves nothing"
        );
        assert_eq!(flows_moved(&all_a, &all_b), 1.0);
        assert_eq!(flows_moved(&[], &all_b), 1.0);
        assert_eq!(flows_moved(&all_a, &[]), 1.0);
        // Every other slot of 8 changes: half the flows.
        let half: Vec<_> = (0..8).map(|i| if i % 2 == 0 { a } else { b }).collect();
        assert!((flows_moved(&[a; 8], &half) - 0.5).abs() < 0.01);
    }

    /// Against a VIP's empty table (no backend before, or none after),
    /// every flow moves: none has a backend on both sides.
    #[test]
    fn a_rehash_to_or_from_an_empty_table_moves_every_flow() {
        let config = crate::config::Config::parse(concat!(
            "instance: unit\ninterfaces: [eth0]\ngateway_mac: \"02:00:00:00:00:01\"\n",
            "outer_source_v4: 10.0.0.2\nvips:\n  - address: 10.99.0.1\n    port: 80\n",
            "    protocol: tcp\n    backends:\n      - address: 10.1.0.1\n",
        ))
        .expect("parses");
        let vip = &config.vips[0];
        let full = vec![Some(IpAddr::from([10, 1, 0, 1])); 7];
        let keys = ([1, 2], [3, 4]);
        assert_eq!(flows_moved_rehashed(vip, vip, keys, (&[], &full)), 1.0);
        assert_eq!(flows_moved_rehashed(vip, vip, keys, (&full, &[])), 1.0);
    }
}

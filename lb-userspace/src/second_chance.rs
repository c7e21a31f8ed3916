//! Second chance in userspace: which backends a flow's alternates are,
//! computed from state every balancer of a tier shares, so that they agree
//! without talking to each other and a balancer that restarts with empty
//! maps computes the same ones.
//!
//! A flow ECMP moves to this balancer was placed by another balancer's
//! table (or this one's, before it restarted or changed). Its alternates
//! are the backends the flow has, in the same Maglev slot, under the
//! tables that balancer may have used, tried in this order:
//!
//! 1. **configured**: every configured backend with weight above 0, at its
//!    configured weight, whatever its health, drain or slow start. Depends
//!    on the configuration alone, so it is the table of any balancer that
//!    saw every backend up: it covers a backend that this balancer takes
//!    for down (probes that disagree, a drain) while the others do not;
//! 2. **previous**: the same for the VIP's previous configuration, the
//!    newest revision in which its backends or weights differed
//!    ([`previous_members`]). Revisions are on disk, so a restarted
//!    balancer has them: it covers any change of backends or weights
//!    made since the flow was placed, re-weights above all;
//! 3. **second choice**: the slot's owner in the configured table without
//!    the configured owner. A backend added since the flow was placed owns
//!    exactly the slots whose second choice is their previous owner, and a
//!    backend another balancer takes for down hands its slots to their
//!    second choice: it covers both without any history (a balancer whose
//!    revisions do not reach back, a new one).
//!
//! Duplicates are dropped (the configured owner is usually the packet's
//! own backend, which the datapath skips). What none of them covers is in
//! ARCHITECTURE.md ("Second chance").
//!
//! Cost: the configured and previous tables are one Maglev build each;
//! the second choices are one build per configured backend (N builds,
//! 0.7 ms each at M = 65537), made only when the configured backends or
//! weights change (health changes do not touch them), one table at a
//! time. The result is kept as `u16` indexes into the member list.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use lb_common::consts::SC_MAX_ALTERNATES;

use crate::{
    config::{VipConfig, VipId},
    maglev::{self, MaglevBackend, MaglevError, MaglevTable},
};

/// Backends and weights of one VIP (those of weight 0 excluded).
pub type Members = BTreeMap<IpAddr, u32>;

/// What a VIP's alternates are computed from (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// The configured backends with weight above 0, weights as the table
    /// of an all-healthy VIP would be built with.
    pub configured: Members,
    /// The same for the VIP's previous configuration, if known.
    pub previous: Option<Members>,
}

/// No member in this position of a slot.
pub const NONE: u16 = u16::MAX;

/// Each slot's alternates as indexes into `members` ([`NONE`] after the
/// last), in the order they are tried.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AltTable {
    pub members: Vec<IpAddr>,
    pub slots: Vec<[u16; SC_MAX_ALTERNATES]>,
}

impl AltTable {
    /// The addresses of slot `s`'s alternates.
    pub fn slot(&self, s: usize) -> impl Iterator<Item = IpAddr> + '_ {
        self.slots[s]
            .iter()
            .take_while(|&&i| i != NONE)
            .map(|&i| self.members[i as usize])
    }
}

/// The configured members of `vip` (weight above 0), each weight times
/// `scale` (the factor the daemon's effective weights carry).
pub fn configured_members(vip: &VipConfig, scale: u32) -> Members {
    vip.backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| (b.address, b.weight.saturating_mul(scale)))
        .collect()
}

/// The alternates of every slot of a table of `m` slots (module docs).
/// Empty when no backend is configured.
pub fn alternates(sources: &Sources, m: u32) -> Result<AltTable, MaglevError> {
    let Some(configured) = maglev_table(&sources.configured, m)? else {
        return Ok(AltTable::default());
    };
    let previous = match &sources.previous {
        Some(p) => maglev_table(p, m)?,
        None => None,
    };
    let second = second_choices(&sources.configured, &configured, m)?;
    let mut members: BTreeSet<IpAddr> = sources.configured.keys().copied().collect();
    if let Some(p) = &sources.previous {
        members.extend(p.keys().copied());
    }
    let members: Vec<IpAddr> = members.into_iter().collect();
    let index: BTreeMap<IpAddr, u16> = members
        .iter()
        .enumerate()
        .map(|(i, a)| (*a, i as u16))
        .collect();
    let slots = (0..m as usize)
        .map(|s| {
            let mut out = [NONE; SC_MAX_ALTERNATES];
            let mut n = 0;
            let candidates = [
                Some(configured[s]),
                previous.as_ref().map(|p| p[s]),
                second.as_ref().map(|t| t[s]),
            ];
            for addr in candidates.into_iter().flatten() {
                let i = index[&addr];
                if !out[..n].contains(&i) {
                    out[n] = i;
                    n += 1;
                }
            }
            out
        })
        .collect();
    Ok(AltTable { members, slots })
}

/// The Maglev table of `members` as addresses, built exactly as the
/// reconciler builds a VIP's table from the same weights (the builder
/// does not depend on input order); `None` without members.
fn maglev_table(members: &Members, m: u32) -> Result<Option<Vec<IpAddr>>, MaglevError> {
    let input: Vec<MaglevBackend> = members
        .iter()
        .filter(|(_, w)| **w > 0)
        .map(|(addr, weight)| MaglevBackend {
            addr: *addr,
            weight: *weight,
        })
        .collect();
    Ok(match maglev::build(&input, m)? {
        MaglevTable::Empty => None,
        MaglevTable::Slots(slots) => {
            Some(slots.into_iter().map(|i| input[i as usize].addr).collect())
        }
    })
}

/// Slot by slot, the owner of the slot in the table of `members` without
/// the slot's owner in `table` (theirs); `None` for a single member. One
/// table is alive at a time.
fn second_choices(
    members: &Members,
    table: &[IpAddr],
    m: u32,
) -> Result<Option<Vec<IpAddr>>, MaglevError> {
    if members.len() < 2 {
        return Ok(None);
    }
    let mut second = table.to_vec();
    for gone in members.keys() {
        let mut rest = members.clone();
        rest.remove(gone);
        let Some(without) = maglev_table(&rest, m)? else {
            continue;
        };
        for (s, owner) in table.iter().enumerate() {
            if owner == gone {
                second[s] = without[s];
            }
        }
    }
    Ok(Some(second))
}

/// For each VIP of `current`, its members in the newest configuration of
/// `history` (newest first) where they differ from the current ones: the
/// previous members. A VIP absent from a configuration of the history is
/// skipped there (a VIP that did not exist has no flows to keep); one
/// whose members never differ has none.
pub fn previous_members<'a>(
    current: &BTreeMap<VipId, Members>,
    history: impl IntoIterator<Item = &'a BTreeMap<VipId, Members>>,
) -> BTreeMap<VipId, Members> {
    let mut found = BTreeMap::new();
    for config in history {
        for (id, members) in current {
            if found.contains_key(id) {
                continue;
            }
            if let Some(then) = config.get(id)
                && then != members
                && !then.is_empty()
            {
                found.insert(*id, then.clone());
            }
        }
        if found.len() == current.len() {
            break;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default table size: the figures ARCHITECTURE.md quotes.
    const M: u32 = 65_537;

    fn a(i: u32) -> IpAddr {
        format!("10.1.0.{i}").parse().unwrap()
    }

    fn members(ws: &[(u32, u32)]) -> Members {
        ws.iter().map(|(i, w)| (a(*i), *w)).collect()
    }

    fn table(m: &Members) -> Vec<IpAddr> {
        maglev_table(m, M).unwrap().unwrap()
    }

    /// Of the slots whose owner differs between the table that placed a
    /// flow (`placed`) and the one of this balancer (`here`), how many
    /// have the placing owner neither as their owner here nor among their
    /// alternates. Owners that are no longer configured do not count
    /// (their connections went with them).
    fn uncovered(placed: &Members, here: &Members, sources: &Sources) -> (usize, usize) {
        let (tp, th) = (table(placed), table(here));
        let alts = alternates(sources, M).unwrap();
        let mut moved = 0;
        let mut missed = 0;
        for s in 0..M as usize {
            if tp[s] == th[s] || !sources.configured.contains_key(&tp[s]) {
                continue;
            }
            moved += 1;
            if !alts.slot(s).any(|x| x == tp[s]) {
                missed += 1;
            }
        }
        (moved, missed)
    }

    fn sources(configured: &Members, previous: Option<&Members>) -> Sources {
        Sources {
            configured: configured.clone(),
            previous: previous.cloned(),
        }
    }

    /// Slots Maglev moves between two backends that both stay when a
    /// third joins or leaves: no table above names their old owner
    /// without history. A handful per change: under 0.05% of the slots.
    fn few(missed: usize) -> bool {
        missed * 2000 < M as usize
    }

    #[test]
    fn an_added_backend_is_covered() {
        let (b3, b4) = (
            members(&[(1, 1), (2, 1), (3, 1)]),
            members(&[(1, 1), (2, 1), (3, 1), (4, 1)]),
        );
        // Without history: the new backend's slots all, by second choice.
        let (moved, missed) = uncovered(&b3, &b4, &sources(&b4, None));
        assert!(moved > M as usize / 5, "{moved}");
        assert!(few(missed), "{missed} of {moved}");
        let t3 = table(&b3);
        let alts = alternates(&sources(&b4, None), M).unwrap();
        let t4 = table(&b4);
        for s in (0..M as usize).filter(|&s| t4[s] == a(4)) {
            assert!(alts.slot(s).any(|x| x == t3[s]), "slot {s}");
        }
        // With history: every one.
        assert_eq!(uncovered(&b3, &b4, &sources(&b4, Some(&b3))).1, 0);
    }

    #[test]
    fn a_backend_down_on_either_side_is_covered() {
        let all = members(&[(1, 1), (2, 1), (3, 1), (4, 1)]);
        let without = members(&[(1, 1), (3, 1), (4, 1)]);
        // Placed by a balancer that saw every backend, here one is down:
        // the configured table is the placing one.
        let (moved, missed) = uncovered(&all, &without, &sources(&all, None));
        assert!(moved > 0);
        assert_eq!(missed, 0);
        // Placed by a balancer that took one for down, here all are up:
        // the down backend's slots by second choice.
        let (moved, missed) = uncovered(&without, &all, &sources(&all, None));
        assert!(moved > 0);
        assert!(few(missed), "{missed} of {moved}");
    }

    #[test]
    fn larger_tiers_lose_only_maglevs_own_extra_moves() {
        for n in [10, 30] {
            let all: Vec<(u32, u32)> = (1..=n).map(|i| (i, 1)).collect();
            let plus: Vec<(u32, u32)> = (1..=n + 1).map(|i| (i, 1)).collect();
            let (old, new) = (members(&all), members(&plus));
            let (moved, missed) = uncovered(&old, &new, &sources(&new, None));
            assert!(few(missed), "add 1 to {n}: {missed} of {moved}");
            let mut down = old.clone();
            down.remove(&a(4));
            let (moved, missed) = uncovered(&down, &old, &sources(&old, None));
            assert!(few(missed), "down 1 of {n}: {missed} of {moved}");
        }
    }

    #[test]
    fn a_reweight_is_covered_by_the_previous_configuration() {
        for (from, to) in [(1, 2), (2, 1), (3, 1), (1, 5)] {
            let old = members(&[(1, from * 100), (2, 100), (3, 100)]);
            let new = members(&[(1, to * 100), (2, 100), (3, 100)]);
            let (moved, missed) = uncovered(&old, &new, &sources(&new, Some(&old)));
            assert!(moved > 0, "{from}->{to}");
            assert_eq!(missed, 0, "{from}->{to}: of {moved}");
        }
    }

    #[test]
    fn without_history_a_heavier_backend_is_mostly_covered_a_lighter_one_not() {
        // What the second choice alone does for re-weights (the limit
        // ARCHITECTURE.md states): a backend made heavier takes slots
        // whose second choice is mostly their previous owner; a backend
        // made lighter gives slots away to owners whose second choice is
        // often someone else.
        let old = members(&[(1, 100), (2, 100), (3, 100)]);
        let heavier = members(&[(1, 200), (2, 100), (3, 100)]);
        let (moved, missed) = uncovered(&old, &heavier, &sources(&heavier, None));
        assert!(missed * 100 < moved, "heavier: {missed} of {moved}");
        let (moved, missed) = uncovered(&heavier, &old, &sources(&old, None));
        assert!(missed * 10 > moved, "lighter: {missed} of {moved}");
    }

    /// A backend weighted 0 is no member: not in the tables, not among the
    /// addresses the alternates are written with.
    #[test]
    fn backends_weighted_zero_are_not_members() {
        let vip = VipConfig::new(
            "10.99.0.1:80/tcp".parse().unwrap(),
            vec![
                crate::config::BackendConfig::new(a(1), 0),
                crate::config::BackendConfig::new(a(2), 3),
            ],
        );
        assert_eq!(configured_members(&vip, 10), members(&[(2, 30)]));
        let alts = alternates(&sources(&configured_members(&vip, 1), None), M).unwrap();
        assert_eq!(alts.members, vec![a(2)]);
    }

    #[test]
    fn slots_list_distinct_members_configured_first() {
        let cfg = members(&[(1, 1), (2, 1), (3, 1)]);
        let prev = members(&[(1, 1), (2, 1), (9, 1)]);
        let alts = alternates(&sources(&cfg, Some(&prev)), M).unwrap();
        let tc = table(&cfg);
        let tp = table(&prev);
        // The second choice, slot by slot: the table without its owner.
        let without: BTreeMap<IpAddr, Vec<IpAddr>> = cfg
            .keys()
            .map(|gone| {
                let mut rest = cfg.clone();
                rest.remove(gone);
                (*gone, table(&rest))
            })
            .collect();
        for s in 0..M as usize {
            let list: Vec<IpAddr> = alts.slot(s).collect();
            // Configured owner, previous owner, second choice, in that
            // order, each once.
            let mut want = vec![tc[s]];
            for next in [tp[s], without[&tc[s]][s]] {
                if !want.contains(&next) {
                    want.push(next);
                }
            }
            assert_eq!(list, want, "slot {s}");
            assert!(list.contains(&tp[s]), "the previous owner, even one gone");
            assert!(list.len() >= 2, "a second choice always differs");
        }
        // One backend: nothing but itself.
        let one = members(&[(1, 1)]);
        let alts = alternates(&sources(&one, None), M).unwrap();
        assert!((0..M as usize).all(|s| alts.slot(s).eq([a(1)])));
        assert_eq!(
            alternates(&Sources::default(), M).unwrap(),
            AltTable::default()
        );
    }

    #[test]
    fn previous_members_are_the_newest_that_differ() {
        let id = |p| VipId {
            addr: "10.0.0.1".parse().unwrap(),
            port: p,
            proto: crate::config::Protocol::Tcp,
        };
        let (x, y, z) = (
            members(&[(1, 1)]),
            members(&[(1, 2)]),
            members(&[(1, 1), (2, 1)]),
        );
        let current = BTreeMap::from([(id(80), x.clone()), (id(443), x.clone())]);
        let history = [
            BTreeMap::from([(id(80), x.clone()), (id(443), x.clone())]),
            BTreeMap::from([(id(80), y.clone())]),
            BTreeMap::from([(id(80), z.clone()), (id(443), z.clone())]),
        ];
        let prev = previous_members(&current, &history);
        assert_eq!(prev.get(&id(80)), Some(&y));
        assert_eq!(prev.get(&id(443)), Some(&z), "absent in between: skipped");
        assert!(previous_members(&current, &history[..1]).is_empty());
    }
}

//! Probers: one per distinct probe, shared by every backend entry that
//! asks for it. A backend address in several VIPs with the same check
//! (same port, exchange, interval, timeout and jitter; rise and fall are
//! each tracker's own) is one probe stream, its results handed to each
//! entry's tracker: 1,000 VIPs on one backend cost one probe a second,
//! not 1,000, and all of them see the same verdicts at the same moment. A
//! probe through the tunnel names its backend entry (its mark), so it is
//! never shared. Started, restarted when a check or target changes,
//! stopped when the last entry goes. How a prober is started is given
//! ([`SpawnProber`]): `lbd` spawns the real one
//! ([`crate::health::spawn_prober`]), tests record what would run.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use lb_common::consts::{BACKEND_INDEX_MASK, probe_mark};
use tokio::{sync::mpsc, task::JoinHandle};

use crate::{
    config::{Encap, HealthCheck, VipConfig, VipId},
    dataplane::Dataplane,
    health::{ProbeResult, ProbeTarget},
    lifecycle::Lifecycle,
    reconcile::Reconciler,
};

/// A backend of a VIP: the key of probes and lifecycle entries.
pub type BackendKey = (VipId, IpAddr);

/// A running prober, named in the results it sends.
pub type ProbeId = u64;

/// Starts a prober: `(id, the entries it serves, check, target, seed)` →
/// its task.
pub type SpawnProber =
    Box<dyn FnMut(ProbeId, &[BackendKey], HealthCheck, ProbeTarget, u64) -> JoinHandle<()> + Send>;

/// What a probe does, whoever asks for it: the target (address and port
/// resolved), and the check without its port (in the target) and without
/// rise and fall (each tracker applies its own).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Spec {
    check: HealthCheck,
    target: ProbeTarget,
}

impl Spec {
    fn of(check: &HealthCheck, target: &ProbeTarget) -> Self {
        Self {
            check: HealthCheck {
                port: None,
                rise: 1,
                fall: 1,
                ..check.clone()
            },
            target: target.clone(),
        }
    }
}

/// A running prober and the entries it serves.
struct Prober {
    spec: Spec,
    keys: BTreeSet<BackendKey>,
    task: JoinHandle<()>,
}

/// The running probers.
pub struct Probes {
    running: HashMap<ProbeId, Prober>,
    by_spec: HashMap<Spec, ProbeId>,
    /// Each served entry, its prober and its own check (rise and fall).
    by_key: BTreeMap<BackendKey, (ProbeId, HealthCheck)>,
    next: ProbeId,
    spawn: SpawnProber,
}

impl Probes {
    pub fn new(spawn: SpawnProber) -> Self {
        Self {
            running: HashMap::new(),
            by_spec: HashMap::new(),
            by_key: BTreeMap::new(),
            next: 1,
            spawn,
        }
    }

    /// Real probers sending their results to `results`.
    pub fn real(results: mpsc::Sender<(ProbeId, ProbeResult)>) -> Self {
        Self::new(Box::new(move |id, _, check, target, seed| {
            crate::health::spawn_prober(id, check, target, seed, results.clone())
        }))
    }

    /// A prober serves `key`.
    pub fn has(&self, key: &BackendKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// The entries prober `id` serves (none if it stopped since it sent).
    pub fn keys_of(&self, id: ProbeId) -> Vec<BackendKey> {
        self.running
            .get(&id)
            .map(|p| p.keys.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many probers run (a shared one counts once).
    pub fn count(&self) -> usize {
        self.running.len()
    }

    /// Starts, restarts or stops probers so that each probed backend of
    /// `effective` is served by the one prober of its check and target. An
    /// entry that changes prober restarts its probe streaks (its verdict
    /// stands). Returns the entries no longer probed at all.
    pub fn sync<D: Dataplane>(
        &mut self,
        effective: &[VipConfig],
        reconciler: &Reconciler<D>,
        lifecycle: &mut Lifecycle,
    ) -> Vec<BackendKey> {
        let wanted = wanted(effective, reconciler);
        let stale: Vec<BackendKey> = self
            .by_key
            .iter()
            .filter(|(key, (id, check))| {
                wanted.get(*key).is_none_or(|(c, t)| {
                    c != check
                        || self
                            .running
                            .get(id)
                            .is_none_or(|p| p.spec != Spec::of(c, t))
                })
            })
            .map(|(k, _)| *k)
            .collect();
        let mut gone = Vec::new();
        for key in stale {
            self.unsubscribe(&key);
            if !wanted.contains_key(&key) {
                gone.push(key);
            }
        }
        let mut fresh: HashMap<Spec, Vec<(BackendKey, HealthCheck)>> = HashMap::new();
        for (key, (check, target)) in wanted {
            if self.by_key.contains_key(&key) {
                continue;
            }
            lifecycle.reset_health(&key.0, &key.1, check.rise, check.fall);
            let spec = Spec::of(&check, &target);
            match self.by_spec.get(&spec).copied() {
                Some(id) => self.subscribe(id, key, check),
                None => fresh.entry(spec).or_default().push((key, check)),
            }
        }
        for (spec, keys) in fresh {
            self.start(spec, keys);
        }
        gone
    }

    /// A new prober for `keys`.
    fn start(&mut self, spec: Spec, keys: Vec<(BackendKey, HealthCheck)>) {
        let id = self.next;
        self.next += 1;
        let served: Vec<BackendKey> = keys.iter().map(|(k, _)| *k).collect();
        let first = served[0];
        let seed = lb_common::flow::fmix64(
            id ^ u64::from(first.1.is_ipv4()) ^ (u64::from(first.0.port) << 32),
        );
        let task = (self.spawn)(id, &served, spec.check.clone(), spec.target.clone(), seed);
        self.by_spec.insert(spec.clone(), id);
        self.running.insert(
            id,
            Prober {
                spec,
                keys: BTreeSet::new(),
                task,
            },
        );
        for (key, check) in keys {
            self.subscribe(id, key, check);
        }
    }

    fn subscribe(&mut self, id: ProbeId, key: BackendKey, check: HealthCheck) {
        if let Some(p) = self.running.get_mut(&id) {
            p.keys.insert(key);
            self.by_key.insert(key, (id, check));
        }
    }

    /// `key` leaves its prober, which stops when it served only `key`.
    fn unsubscribe(&mut self, key: &BackendKey) {
        let Some((id, _)) = self.by_key.remove(key) else {
            return;
        };
        let Some(p) = self.running.get_mut(&id) else {
            return;
        };
        p.keys.remove(key);
        if p.keys.is_empty() {
            p.task.abort();
            let spec = p.spec.clone();
            self.running.remove(&id);
            self.by_spec.remove(&spec);
        }
    }

    /// Stops every prober.
    pub fn stop(&mut self) {
        for p in self.running.values() {
            p.task.abort();
        }
        self.running.clear();
        self.by_spec.clear();
        self.by_key.clear();
    }
}

/// The check and target of every probed backend of `effective`. A probe
/// through the tunnel needs the backend's handle, so a backend the
/// reconciler has not placed yet waits for the next sync.
fn wanted<D: Dataplane>(
    effective: &[VipConfig],
    reconciler: &Reconciler<D>,
) -> BTreeMap<BackendKey, (HealthCheck, ProbeTarget)> {
    let mut wanted = BTreeMap::new();
    for vip in effective {
        for b in &vip.backends {
            let Some(check) = vip.health_check_of(b) else {
                continue;
            };
            let port = check.port.unwrap_or(vip.id.port);
            let target = if check.through_tunnel {
                let Some(handle) = reconciler
                    .vips()
                    .get(&vip.id)
                    .and_then(|v| v.backends.get(&b.address))
                    .map(|s| s.handle)
                else {
                    continue;
                };
                ProbeTarget {
                    addr: (vip.id.addr, port).into(),
                    mark: Some(probe_mark(
                        handle & BACKEND_INDEX_MASK,
                        vip.encap == Encap::Gre,
                    )),
                }
            } else {
                ProbeTarget {
                    addr: (b.address, port).into(),
                    mark: None,
                }
            };
            wanted.insert((vip.id, b.address), (check.clone(), target));
        }
    }
    wanted
}

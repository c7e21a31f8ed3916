//! One prober per probed backend: started, restarted when its check or
//! target changes, stopped when the backend goes. How a prober is started
//! is given ([`SpawnProber`]): `lbd` spawns the real one
//! ([`crate::health::spawn_prober`]), tests record what would run.

use std::{collections::BTreeMap, net::IpAddr};

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

/// Starts a prober: `(backend, check, target, seed)` → its task.
pub type SpawnProber =
    Box<dyn FnMut(BackendKey, HealthCheck, ProbeTarget, u64) -> JoinHandle<()> + Send>;

/// A running prober and what it probes.
struct Prober {
    check: HealthCheck,
    target: ProbeTarget,
    task: JoinHandle<()>,
}

/// The running probers.
pub struct Probes {
    running: BTreeMap<BackendKey, Prober>,
    spawn: SpawnProber,
}

impl Probes {
    pub fn new(spawn: SpawnProber) -> Self {
        Self {
            running: BTreeMap::new(),
            spawn,
        }
    }

    /// Real probers sending their results to `results`.
    pub fn real(results: mpsc::Sender<(BackendKey, ProbeResult)>) -> Self {
        Self::new(Box::new(move |key, check, target, seed| {
            crate::health::spawn_prober(key, check, target, seed, results.clone())
        }))
    }

    /// A prober runs for `key`.
    pub fn has(&self, key: &BackendKey) -> bool {
        self.running.contains_key(key)
    }

    /// What runs: each prober's backend and target.
    pub fn targets(&self) -> impl Iterator<Item = (&BackendKey, &ProbeTarget)> {
        self.running.iter().map(|(k, p)| (k, &p.target))
    }

    /// Starts, restarts or stops probers so that each probed backend of
    /// `effective` has exactly one, probing what its check says. A new
    /// prober restarts the backend's probe streaks (its verdict stands).
    pub fn sync<D: Dataplane>(
        &mut self,
        effective: &[VipConfig],
        reconciler: &Reconciler<D>,
        lifecycle: &mut Lifecycle,
    ) {
        let wanted = wanted(effective, reconciler);
        self.running.retain(|key, p| {
            let keep = wanted
                .get(key)
                .is_some_and(|(c, t)| *c == p.check && *t == p.target);
            if !keep {
                p.task.abort();
            }
            keep
        });
        for (key, (check, target)) in wanted {
            if self.running.contains_key(&key) {
                continue;
            }
            lifecycle.reset_health(&key.0, &key.1, check.rise, check.fall);
            let seed = lb_common::flow::fmix64(
                self.running.len() as u64 ^ u64::from(key.1.is_ipv4()) ^ u64::from(key.0.port),
            );
            let task = (self.spawn)(key, check.clone(), target.clone(), seed);
            self.running.insert(
                key,
                Prober {
                    check,
                    target,
                    task,
                },
            );
        }
    }

    /// Stops every prober.
    pub fn stop(&mut self) {
        for p in self.running.values() {
            p.task.abort();
        }
        self.running.clear();
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

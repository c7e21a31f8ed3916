//! Second chance end to end: two balancers running the real `lbd` behind a
//! BIRD router with ECMP, four backends behind `lb_decap`, 200 long-lived
//! TCP connections, and the balancer set and the backend set changing
//! together, each scenario run with second chance off (the resets are
//! printed: what lb did before) and on (not one connection may reset):
//!
//! 1. a backend is added and a balancer dies at the same moment: the
//!    survivor places the dead one's flows by a table that has the new
//!    backend;
//! 2. a backend is re-weighted while a balancer is down, and the balancer
//!    comes back (its revisions on disk, its maps gone): it takes flows
//!    placed by the old weights;
//! 3. one balancer's probes to a serving backend fail (a filter on that
//!    balancer only), then the other balancer dies: the first takes the
//!    backend for down, the flows it inherits live on it.
//!
//! About 50 s in all (`cargo test -p lb-tests --test second_chance --
//! --nocapture`). Each run prints how ECMP split the connections, its
//! resets by phase, the balancers' `fwd_second_chance` and what the
//! backends did with the lists (`lbctl decap stats`).
//!
//! Needs root, bird2 and nftables. Tests run one at a time.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::EcmpRig,
    netns::sh,
    rig::{Lbd, bin_path},
    routers::{RouterKind, wait_for},
    scenario::{check, serial},
    traffic::Stream,
};

/// 200 streams, a round trip each every 100 ms; a round trip may wait
/// this long (TCP retransmitting through a failover) before it counts as
/// broken.
const STREAMS: u16 = 200;
const FIRST_PORT: u16 = 45_000;
const EVERY: Duration = Duration::from_millis(100);
const PATIENCE: Duration = Duration::from_secs(10);

const TCP_VIP: &str = "10.99.0.1:80/tcp";
const SECOND_CHANCE: &str = "    second_chance: true\n";
/// Probes fast enough to take a backend down within a second.
const CHECK: &str = "    health_check:\n      interval: 200ms\n      timeout: 150ms\n      rise: 2\n      fall: 2\n      jitter: 10\n";
const TOP: &str = "shutdown_grace: 1s\n";

#[derive(Clone, Copy, Debug)]
enum Scenario {
    AddAndKill,
    ReweightAndReturn,
    ProbesDisagreeAndKill,
}

/// What one run saw.
struct Outcome {
    /// Broken connections (port: error), and when they broke.
    resets: Vec<String>,
    by_phase: Vec<(&'static str, usize)>,
    /// Connections each balancer placed at the start.
    placed: (u64, u64),
    /// `fwd_second_chance` of the balancers left standing.
    listed: u64,
    /// The backends' second-chance counters, summed.
    decap: Vec<(String, u64)>,
}

/// A run of `scenario`: the rig, both balancers, the streams.
struct Run {
    rig: EcmpRig,
    tcp_extra: String,
    streams: Vec<Stream>,
    by_phase: Vec<(&'static str, usize)>,
    placed: (u64, u64),
}

impl Run {
    fn new(second_chance: bool, probes: bool) -> Result<Run> {
        let rig = EcmpRig::new(2, 4, RouterKind::Bird)?;
        let mut tcp_extra = String::new();
        if second_chance {
            tcp_extra.push_str(SECOND_CHANCE);
        }
        if probes {
            tcp_extra.push_str(CHECK);
        }
        Ok(Run {
            rig,
            tcp_extra,
            streams: Vec::new(),
            by_phase: Vec::new(),
            placed: (0, 0),
        })
    }

    /// Balancer `i`'s configuration with `weights` (backend index, weight).
    fn config(&self, i: usize, weights: &[(usize, u32)]) -> String {
        self.rig
            .lbd_config_weighted(i, weights, &self.tcp_extra, TOP)
    }

    /// Both balancers with `weights`, announcing, and the streams flowing.
    fn start(&mut self, weights: &[(usize, u32)]) -> Result<(Lbd, Lbd)> {
        let lbd1 = self.rig.start_lbd(1, &self.config(1, weights))?;
        let lbd2 = self.rig.start_lbd(2, &self.config(2, weights))?;
        self.rig
            .wait_hops("both balancers", &[1, 2], Duration::from_secs(15))?;
        let new = |l: &Lbd| l.counter("fwd_maglev_new_flow");
        let before = (new(&lbd1)?, new(&lbd2)?);
        let end = FIRST_PORT + STREAMS;
        self.streams = self.rig.streams(FIRST_PORT..end, EVERY, PATIENCE)?;
        self.settle("start")?;
        self.placed = (new(&lbd1)? - before.0, new(&lbd2)? - before.1);
        if self.by_phase[0].1 != 0 {
            bail!("streams broke before anything happened");
        }
        Ok((lbd1, lbd2))
    }

    /// Waits until every stream still open has made three more round
    /// trips (at most 30 s; one that does not counts as broken), and
    /// records how many broke in `phase`.
    fn settle(&mut self, phase: &'static str) -> Result<()> {
        let before = self.broken();
        let from: Vec<u64> = self.streams.iter().map(Stream::exchanges).collect();
        let _ = wait_for(
            "the open streams flowing",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                Ok(self
                    .streams
                    .iter()
                    .zip(&from)
                    .all(|(s, f)| s.ended() || s.exchanges() >= f + 3))
            },
        );
        let now = self.broken();
        self.by_phase.push((phase, now - before));
        Ok(())
    }

    /// Streams that ended (a reset, a timeout) or do not advance.
    fn broken(&self) -> usize {
        self.streams.iter().filter(|s| s.ended()).count()
    }

    /// Stops the streams and the rig; what the run saw.
    fn finish(self, standing: &[Lbd]) -> Result<Outcome> {
        let mut listed = 0;
        for lbd in standing {
            listed += lbd.counter("fwd_second_chance")?;
        }
        let decap = decap_counters(&self.rig)?;
        let mut resets = Vec::new();
        for s in self.streams {
            let r = s.finish()?;
            if let Some(e) = r.error {
                resets.push(format!("port {}: {e}", r.sport));
            }
        }
        // A stream that broke after its phase settled (a retransmission
        // that reached the wrong backend late) counts in the last phase.
        let mut by_phase = self.by_phase;
        let counted: usize = by_phase.iter().map(|(_, n)| n).sum();
        if let Some(last) = by_phase.last_mut() {
            last.1 += resets.len().saturating_sub(counted);
        }
        Ok(Outcome {
            resets,
            by_phase,
            placed: self.placed,
            listed,
            decap,
        })
    }
}

/// The backends' second-chance counters (`lbctl decap stats`), summed.
fn decap_counters(rig: &EcmpRig) -> Result<Vec<(String, u64)>> {
    let names = [
        "decap_sc_local",
        "fwd_sc_next_hop",
        "decap_sc_last_resort",
        "decap_sc_no_lookup",
        "malformed_sc_header",
        "drop_source_not_allowed",
    ];
    let mut sums = vec![0u64; names.len()];
    let lbctl = bin_path("lbctl")?;
    for b in &rig.backends {
        let out = sh(b
            .ns
            .command(&lbctl)
            .args(["-o", "json", "decap", "stats", "eth0"]))?;
        let text = String::from_utf8_lossy(&out.stdout);
        lb_tests::schema::check_output(&["-o", "json", "decap", "stats"], &text)?;
        let stats: serde_json::Value = serde_json::from_str(&text)?;
        for (sum, name) in sums.iter_mut().zip(names) {
            *sum += stats[name]["packets"].as_u64().unwrap_or(0);
        }
    }
    Ok(names.iter().map(|n| n.to_string()).zip(sums).collect())
}

/// Scenario 1: backend 4 is added on the survivor as balancer 2 dies.
fn add_and_kill(run: &mut Run) -> Result<Vec<Lbd>> {
    let (lbd1, lbd2) = run.start(&[(0, 1), (1, 1), (2, 1)])?;
    let be4 = run.rig.backends[3].addr.to_string();
    lbd1.lbctl(&["backend", "add", TCP_VIP, &be4])?;
    run.rig.power_off(2, lbd2)?;
    run.rig
        .wait_hops("lb2 gone", &[1], Duration::from_secs(15))?;
    run.settle("backend added, lb2 dead")?;
    Ok(vec![lbd1])
}

/// Scenario 2: balancer 2 dies; backend 1's weight goes from 2 to 1;
/// balancer 2 comes back with the new weights, its maps empty.
fn reweight_and_return(run: &mut Run) -> Result<Vec<Lbd>> {
    let (lbd1, lbd2) = run.start(&[(0, 2), (1, 1), (2, 1)])?;
    run.rig.power_off(2, lbd2)?;
    run.rig
        .wait_hops("lb2 gone", &[1], Duration::from_secs(15))?;
    run.settle("lb2 dead")?;
    let be1 = run.rig.backends[0].addr.to_string();
    lbd1.lbctl(&["backend", "weight", TCP_VIP, &be1, "1"])?;
    run.rig.power_on(2)?;
    let config = run.config(2, &[(0, 1), (1, 1), (2, 1)]);
    let lbd2 = run.rig.start_lbd(2, &config)?;
    run.rig
        .wait_hops("lb2 back", &[1, 2], Duration::from_secs(15))?;
    run.settle("re-weighted, lb2 back")?;
    Ok(vec![lbd1, lbd2])
}

/// Scenario 3: balancer 1's probes to backend 2 are dropped (nftables in
/// its namespace only), then balancer 2 dies.
fn probes_disagree_and_kill(run: &mut Run) -> Result<Vec<Lbd>> {
    let (lbd1, lbd2) = run.start(&[(0, 1), (1, 1), (2, 1)])?;
    let be2 = run.rig.backends[1].addr.to_string();
    let ns = &run.rig.balancer(1).ns;
    ns.run("nft", &["add", "table", "inet", "lbsc"])?;
    ns.run(
        "nft",
        &["add chain inet lbsc out { type filter hook output priority 0 ; }"],
    )?;
    ns.run(
        "nft",
        &[&format!(
            "add rule inet lbsc out ip daddr {be2} tcp dport 80 drop"
        )],
    )?;
    wait_for(
        "lb1 taking be2 for down",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || state(&lbd1, &be2).map(|s| s == "down"),
    )?;
    run.settle("lb1 takes be2 for down")?;
    run.rig.power_off(2, lbd2)?;
    run.rig
        .wait_hops("lb2 gone", &[1], Duration::from_secs(15))?;
    run.settle("lb2 dead")?;
    Ok(vec![lbd1])
}

/// Backend `addr`'s state for the TCP VIP, as `lbctl health` says.
fn state(lbd: &Lbd, addr: &str) -> Result<String> {
    let h = lbd.lbctl_json(&["health"])?;
    h.as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == TCP_VIP))
        .and_then(|v| v["backends"].as_array())
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .and_then(|b| b["state"].as_str())
        .map(str::to_string)
        .with_context(|| format!("no health entry for {addr}: {h}"))
}

/// Runs `scenario` with second chance `on` or off and prints what it saw.
fn measure(scenario: Scenario, on: bool) -> Result<Outcome> {
    let started = Instant::now();
    let mut run = Run::new(on, matches!(scenario, Scenario::ProbesDisagreeAndKill))?;
    let standing = match scenario {
        Scenario::AddAndKill => add_and_kill(&mut run),
        Scenario::ReweightAndReturn => reweight_and_return(&mut run),
        Scenario::ProbesDisagreeAndKill => probes_disagree_and_kill(&mut run),
    }
    .with_context(|| run.rig.logs())?;
    let outcome = run.finish(&standing)?;
    eprintln!(
        "{scenario:?}, second chance {}: {} of {STREAMS} connections (lb1 placed {}, lb2 {}) \
         reset {:?}; fwd_second_chance {}; backends {:?} ({:.1} s)",
        if on { "on" } else { "off" },
        outcome.resets.len(),
        outcome.placed.0,
        outcome.placed.1,
        outcome.by_phase,
        outcome.listed,
        outcome.decap,
        started.elapsed().as_secs_f64()
    );
    Ok(outcome)
}

/// Off: resets (today's behaviour, which the scenario must provoke);
/// on: none.
fn off_then_on(scenario: Scenario) {
    let _serial = serial();
    check((|| {
        let off = measure(scenario, false)?;
        if off.resets.is_empty() {
            bail!("{scenario:?} reset nothing without second chance: it tests nothing");
        }
        let on = measure(scenario, true)?;
        if !on.resets.is_empty() {
            bail!(
                "{scenario:?} with second chance: {} connections reset: {:?}",
                on.resets.len(),
                on.resets
            );
        }
        if on.listed == 0 {
            bail!("{scenario:?}: no packet carried alternates");
        }
        // The backends take tunnels from the balancers and each other only
        // (`--from`): none of theirs may be refused.
        let refused = on
            .decap
            .iter()
            .find(|(n, _)| n == "drop_source_not_allowed");
        if refused.is_none_or(|(_, n)| *n != 0) {
            bail!("{scenario:?}: tunnels refused by source: {:?}", on.decap);
        }
        Ok(())
    })());
}

#[test]
fn a_backend_added_as_a_balancer_dies_resets_nothing() {
    off_then_on(Scenario::AddAndKill);
}

#[test]
fn a_reweight_while_a_balancer_is_away_resets_nothing() {
    off_then_on(Scenario::ReweightAndReturn);
}

#[test]
fn probes_that_disagree_then_a_dead_balancer_reset_nothing() {
    off_then_on(Scenario::ProbesDisagreeAndKill);
}

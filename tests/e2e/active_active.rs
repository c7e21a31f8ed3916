//! The active-active tier: two balancers, each running the real `lbd` with
//! the same VIPs and backends and a BGP session to a BIRD router that
//! merges their announcements into one ECMP route and hashes each flow on
//! its 5-tuple (RIGS.md, "An ECMP rig with a real router"). Three backends
//! behind the decap program, 100 long-lived TCP connections from a client.
//!
//! What must hold: flows spread over both balancers; when one balancer
//! dies (link down, `kill -9`, its pinned state gone), its flows move to
//! the survivor, which has never seen them but computes the same Maglev
//! table, so every connection keeps its backend and goes on without a
//! reset; when it comes back, flows move back (to an empty connection
//! table) just as safely and new connections use both again; a graceful
//! `lbctl node drain` loses nothing. Measured and printed (`--nocapture`):
//! the router's convergence and each stream's longest gap.
//!
//! Needs root and bird2. Tests run one at a time.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    ecmp::EcmpRig,
    rig::{CLIENT, Lbd, VIP},
    routers::{RouterKind, wait_for},
    scenario::{check, serial},
    traffic::{Stream, tcp_request},
};

/// Streams: one round trip every 50 ms; a round trip may wait this long
/// (TCP retransmitting through a failover) before the stream counts as
/// broken.
const EVERY: Duration = Duration::from_millis(50);
const PATIENCE: Duration = Duration::from_secs(15);

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Both balancers up, announcing, one ECMP route; returns their guards.
fn two_balancers(rig: &EcmpRig) -> Result<(Lbd, Lbd)> {
    let lbd1 = rig.start_lbd(1, &rig.lbd_config(1, "", "shutdown_grace: 1s\n"))?;
    let lbd2 = rig.start_lbd(2, &rig.lbd_config(2, "", "shutdown_grace: 1s\n"))?;
    rig.wait_hops(
        "one ECMP route via both balancers",
        &[1, 2],
        Duration::from_secs(15),
    )?;
    Ok((lbd1, lbd2))
}

/// New flows each balancer has picked by Maglev (SYNs, and packets of
/// flows it had not seen).
fn new_flows(lbd: &Lbd) -> Result<u64> {
    lbd.counter("fwd_maglev_new_flow")
}

/// Packets the balancer forwarded for the TCP VIP.
fn vip_packets(lbd: &Lbd) -> Result<u64> {
    let stats = lbd.lbctl_json(&["stats"])?;
    stats["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == "10.99.0.1:80/tcp"))
        .and_then(|v| v["packets"].as_u64())
        .with_context(|| format!("no TCP VIP in {stats}"))
}

/// Waits until every stream has completed `n` more round trips (none
/// ended); returns how long that took.
fn wait_all_advance(streams: &[Stream], n: u64, limit: Duration) -> Result<Duration> {
    let from: Vec<u64> = streams.iter().map(Stream::exchanges).collect();
    wait_for(
        "every stream flowing",
        limit,
        Duration::from_millis(20),
        || {
            if let Some(s) = streams.iter().find(|s| s.ended()) {
                bail!("the stream from port {} ended", s.sport);
            }
            Ok(streams
                .iter()
                .zip(&from)
                .all(|(s, f)| s.exchanges() >= f + n))
        },
    )
    .with_context(|| {
        let stuck: Vec<u16> = streams
            .iter()
            .zip(&from)
            .filter(|(s, f)| s.exchanges() < *f + n)
            .map(|(s, _)| s.sport)
            .collect();
        format!("streams not advancing: {stuck:?}")
    })
}

/// Longest gap of each stream since the last call: (max, median, how
/// many over 100 ms) as text, and the max.
fn gaps(streams: &[Stream]) -> (String, Duration) {
    let mut g: Vec<Duration> = streams.iter().map(Stream::take_max_gap).collect();
    g.sort();
    let max = g.last().copied().unwrap_or_default();
    let median = g.get(g.len() / 2).copied().unwrap_or_default();
    let over = g
        .iter()
        .filter(|d| **d > Duration::from_millis(100))
        .count();
    (
        format!(
            "longest gap {}, median of the streams' longest gaps {}, {over} of {} streams had a gap over 100 ms",
            ms(max),
            ms(median),
            g.len()
        ),
        max,
    )
}

/// Stops the streams; fails if any broke (a reset, a timeout).
fn finish_clean(streams: Vec<Stream>) -> Result<BTreeMap<String, usize>> {
    let mut per_backend = BTreeMap::new();
    let mut broken = Vec::new();
    for s in streams {
        let r = s.finish()?;
        match r.error {
            Some(e) => broken.push(format!("port {}: {e}", r.sport)),
            None => *per_backend.entry(r.backend).or_default() += 1,
        }
    }
    if !broken.is_empty() {
        bail!("{} connections broke: {broken:?}", broken.len());
    }
    Ok(per_backend)
}

/// Makes `n` short connections from ports `first..`; every one must work.
fn new_connections(rig: &EcmpRig, first: u16, n: u16) -> Result<()> {
    let vip = rig.tcp_vip();
    let results: Vec<Result<String>> = rig.client.within(move || {
        (first..first + n)
            .map(|p| tcp_request(CLIENT, p, vip))
            .collect()
    })?;
    for (i, r) in results.into_iter().enumerate() {
        r.with_context(|| format!("new connection from port {}", first + i as u16))?;
    }
    Ok(())
}

/// Fails unless a binomial count `k` of `n` (p = ½) is within 5σ of n/2.
fn balanced(what: &str, k: u64, n: u64) -> Result<()> {
    let sigma = (n as f64).sqrt() / 2.0;
    if (k as f64 - n as f64 / 2.0).abs() > 5.0 * sigma {
        bail!("{what}: {k} of {n}, not an even split");
    }
    Ok(())
}

#[test]
fn streams_survive_losing_a_balancer_and_spread_again_when_it_returns() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 3, RouterKind::Bird)?;
        let (lbd1, lbd2) = two_balancers(&rig)?;
        let ecmp = lb_tests::routers::kernel_routes(&rig.router, VIP.into())?;

        // Both balancers answer every flow the same: same table.
        for sport in (44_000..44_100).step_by(7) {
            let (a, b) = (lbd1.simulate_syn(sport)?, lbd2.simulate_syn(sport)?);
            if a["backend"] != b["backend"] {
                bail!(
                    "port {sport}: lb1 picks {}, lb2 picks {}",
                    a["backend"],
                    b["backend"]
                );
            }
        }

        let before = (new_flows(&lbd1)?, new_flows(&lbd2)?);
        let streams = rig.streams(44_000..44_100, EVERY, PATIENCE)?;
        wait_all_advance(&streams, 5, Duration::from_secs(10))?;
        let (n1, n2) = (new_flows(&lbd1)? - before.0, new_flows(&lbd2)? - before.1);
        let (p1, p2) = (vip_packets(&lbd1)?, vip_packets(&lbd2)?);
        if n1 + n2 < 100 {
            bail!("100 connections, but only {n1} + {n2} new flows counted");
        }
        balanced("lb1's share of 100 new flows", n1, n1 + n2)?;
        eprintln!(
            "ECMP route:\n{}\n100 streams: new flows lb1 {n1}, lb2 {n2}; TCP VIP packets lb1 {p1}, lb2 {p2}",
            ecmp.trim_end()
        );
        gaps(&streams);

        // lb1 dies: link down, kill -9, its pins gone.
        let died = Instant::now();
        rig.power_off(1, lbd1)?;
        rig.wait_hops(
            "the dead balancer's next hop gone",
            &[2],
            Duration::from_secs(15),
        )?;
        let converged = died.elapsed();
        let flowing = wait_all_advance(&streams, 5, PATIENCE)?;
        let all_flowing = died.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        let (death, death_max) = gaps(&streams);
        let moved = new_flows(&lbd2)? - before.1 - n2;
        eprintln!(
            "lb1 killed (link down + kill -9): route down to one next hop in {}, every stream flowing again {} after the kill ({} after convergence); lb2 picked up {moved} flows it had never seen; {death}",
            ms(converged),
            ms(all_flowing),
            ms(flowing)
        );

        // lb1 comes back with empty maps: half the flows move back to it.
        rig.power_on(1)?;
        let booted = Instant::now();
        let lbd1 = rig.start_lbd(1, &rig.lbd_config(1, "", "shutdown_grace: 1s\n"))?;
        rig.wait_hops("both next hops again", &[1, 2], Duration::from_secs(15))?;
        let back = booted.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        wait_all_advance(&streams, 5, PATIENCE)?;
        let taken_back = new_flows(&lbd1)?;
        let (ret, ret_max) = gaps(&streams);
        if taken_back == 0 {
            bail!("no flow moved back to lb1");
        }
        eprintln!(
            "lb1 back: both next hops {} after lbd started; it took back {taken_back} flows into an empty connection table; {ret}",
            ms(back)
        );

        // New connections use both again.
        let before = (new_flows(&lbd1)?, new_flows(&lbd2)?);
        new_connections(&rig, 46_000, 100)?;
        let (m1, m2) = (new_flows(&lbd1)? - before.0, new_flows(&lbd2)? - before.1);
        balanced("lb1's share of 100 new connections", m1, m1 + m2)?;

        let per_backend = finish_clean(streams)?;
        eprintln!(
            "100 new connections after the return: lb1 {m1}, lb2 {m2}; all 100 streams finished without an error (per backend {per_backend:?}); longest gap: {} when lb1 died, {} when it came back",
            ms(death_max),
            ms(ret_max)
        );
        drop(lbd2);
        Ok(())
    })());
}

#[test]
fn a_drained_balancer_loses_no_connection() {
    let _serial = serial();
    check((|| {
        let rig = EcmpRig::new(2, 3, RouterKind::Bird)?;
        let (lbd1, lbd2) = two_balancers(&rig)?;
        let streams = rig.streams(47_000..47_100, EVERY, PATIENCE)?;
        wait_all_advance(&streams, 5, Duration::from_secs(10))?;
        let on_lb1 = vip_packets(&lbd1)?;
        if on_lb1 == 0 || vip_packets(&lbd2)? == 0 {
            bail!("the streams do not use both balancers");
        }
        gaps(&streams);

        // Drain lb1: lbctl returns after shutdown_grace (1 s).
        let t = Instant::now();
        lbd1.lbctl(&["node", "drain"])?;
        let returned = t.elapsed();
        let converged = rig.wait_hops("lb1's next hop gone", &[2], Duration::from_secs(5))?;
        if returned < Duration::from_secs(1) {
            bail!(
                "lbctl node drain returned after {}, before shutdown_grace",
                ms(returned)
            );
        }
        wait_all_advance(&streams, 5, PATIENCE)?;
        // Nothing reaches lb1 any more.
        let idle_from = vip_packets(&lbd1)?;
        std::thread::sleep(Duration::from_millis(500));
        let idle_to = vip_packets(&lbd1)?;
        if idle_to != idle_from {
            bail!("lb1 still gets VIP traffic after the drain: {idle_from} → {idle_to}");
        }
        let (drain, _) = gaps(&streams);
        eprintln!(
            "lb1 drained: next hop gone {} after the request, lbctl returned after {}; {drain}",
            ms(converged),
            ms(returned)
        );

        lbd1.lbctl(&["node", "undrain"])?;
        rig.wait_hops("both next hops again", &[1, 2], Duration::from_secs(5))?;
        std::thread::sleep(Duration::from_millis(500));
        wait_all_advance(&streams, 5, PATIENCE)?;
        if vip_packets(&lbd1)? == idle_to {
            bail!("no traffic came back to lb1 after undrain");
        }
        let (undrain, _) = gaps(&streams);
        let per_backend = finish_clean(streams)?;
        eprintln!(
            "lb1 undrained: {undrain}; all 100 streams finished without an error (per backend {per_backend:?})"
        );
        drop((lbd1, lbd2));
        Ok(())
    })());
}

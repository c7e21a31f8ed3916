//! Spoofed floods against the balancer while established connections
//! run: first SYNs alone, which must not write the connection table at
//! all; then SYNs and one-packet ACK flows together, which churn it; then
//! spoofed handshakes (each tuple a SYN, then an ACK: the cheapest way to
//! a confirmed entry) at the generator's full rate, with a backend added
//! in the middle, while 200 connections stream and 100 more sit idle for
//! 20 s between exchanges. The connection table must keep every
//! established flow's backend: not one connection is reset or stalls.
//!
//! The floods come from raw sockets on the router (random sources in
//! 198.18.0.0/16, each generator from its own seed, printed) straight to
//! the balancer's MAC; the router drops the tunnelled floods before the
//! backends. The connection table is small (4,096 buckets, 24,576 ways)
//! so that the floods churn through it many times within the test.
//! Nothing waits on the clock but the floods' own pacing: the idle
//! connections' second exchange is awaited (with a generous deadline).

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    flood::{
        ACK, FLOOD_NET, SYN, SYN_ACK_PAIRS, SynFlood, Target, drop_tunnelled, fresh_seed, mac_of,
    },
    rig::{Lbd, Rig, TCP_PORT, VIP},
    routers::wait_for,
    scenario::{check, serial},
    traffic::Stream,
};

const BUSY: u16 = 200;
const IDLE: u16 = 100;
const BUCKETS: u64 = 4096;

/// Streams from `first` on, a round trip every `every`.
fn streams(rig: &Rig, first: u16, n: u16, every: Duration) -> Result<Vec<Stream>> {
    (0..n)
        .map(|i| {
            Stream::start_with(
                &rig.client,
                lb_tests::rig::CLIENT,
                first + i,
                rig.tcp_vip(),
                every,
                Duration::from_secs(20),
            )
        })
        .collect()
}

/// Stops `streams`; the broken ones (with why) and the ones that made no
/// round trip since `before` (their counts then).
fn outcome(streams: Vec<Stream>, before: &[u64]) -> Result<(Vec<String>, Vec<u16>)> {
    let mut broken = vec![];
    let mut stalled = vec![];
    for (s, before) in streams.into_iter().zip(before) {
        let after = s.exchanges();
        let r = s.finish()?;
        if let Some(e) = r.error {
            broken.push(format!("port {} ({}): {e}", r.sport, r.backend));
        } else if after <= *before {
            stalled.push(r.sport);
        }
    }
    Ok((broken, stalled))
}

#[test]
fn established_flows_survive_a_syn_flood_and_a_backend_added_during_it() {
    let _serial = serial();
    check((|| {
        let rig = Rig::new(4)?;
        let config = rig.dir.join("lbd.yaml");
        let text = rig.config(&[Some(1), Some(1), Some(1), None]).replace(
            "conntrack_buckets: 65536",
            &format!("conntrack_buckets: {BUCKETS}"),
        );
        std::fs::write(&config, text)?;
        let lbd = Lbd::start(&rig, &config)?;
        drop_tunnelled(&rig.router, FLOOD_NET)?;

        // Round trips every 20 ms; a stalled CPU may delay them, so only a
        // broken connection (reset, wrong backend) ends a stream.
        let busy = streams(&rig, 21_000, BUSY, Duration::from_millis(20))?;
        let idle = streams(&rig, 23_000, IDLE, Duration::from_secs(20))?;
        std::thread::sleep(Duration::from_millis(500));
        let target = |flags| -> Result<Target> {
            let seed = fresh_seed();
            eprintln!("flood with TCP flags {flags:#04x}: seed {seed:#x}");
            Ok(Target {
                ifname: "r-lb".into(),
                src_mac: mac_of(&rig.router, "r-lb")?,
                dst_mac: mac_of(&rig.lb, "eth0")?,
                dst: std::net::SocketAddrV4::new(VIP, TCP_PORT),
                src_net: FLOOD_NET,
                tcp_flags: flags,
                seed,
            })
        };
        let counters = |lbd: &Lbd| -> Result<[u64; 3]> {
            Ok([
                lbd.counter("ct_evicted")?,
                lbd.counter("ct_evicted_established")?,
                lbd.counter("ct_insert_refused")?,
            ])
        };

        // Phase 1: SYNs alone never write the connection table.
        let (new_before, [evicted_before, ..]) =
            (lbd.counter("fwd_maglev_new_flow")?, counters(&lbd)?);
        let syns = SynFlood::start(&rig.router, target(SYN)?, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(3));
        let syn_forwarded = lbd.counter("fwd_maglev_new_flow")? - new_before;
        let syn_evicted = counters(&lbd)?[0] - evicted_before;
        eprintln!(
            "SYN flood alone: {} sent, {syn_forwarded} forwarded, ct_evicted +{syn_evicted}",
            syns.sent()
        );
        if syn_forwarded < BUCKETS * 6 || syn_evicted != 0 {
            bail!(
                "{syn_forwarded} flood SYNs forwarded (want more than the table's {} ways), \
                 {syn_evicted} entries evicted (want none: SYNs are kept apart)",
                BUCKETS * 6
            );
        }

        // Phase 2: one-packet flows that are not SYNs churn the table.
        let acks = SynFlood::start(&rig.router, target(ACK)?, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(3));
        let (syn_report, ack_report) = (syns.stop()?, acks.stop()?);
        let churned = counters(&lbd)?[0] - evicted_before;
        eprintln!(
            "SYN + ACK floods: {} SYNs ({:.0}/s), {} ACKs ({:.0}/s), ct_evicted +{churned}",
            syn_report.sent,
            syn_report.rate(),
            ack_report.sent,
            ack_report.rate(),
        );
        // The flood must have churned the table for the test to mean
        // anything: more evictions than ways.
        if churned < BUCKETS * 6 {
            bail!(
                "the flood evicted only {churned} entries of {} ways: too weak to test",
                BUCKETS * 6
            );
        }

        // Phase 3: spoofed handshakes at full rate; a backend added in
        // the middle; the idle connections' next exchange comes during it.
        let before_busy: Vec<u64> = busy.iter().map(Stream::exchanges).collect();
        let before_idle: Vec<u64> = idle.iter().map(Stream::exchanges).collect();
        let at_pairs = counters(&lbd)?;
        let pairs = SynFlood::start(&rig.router, target(SYN_ACK_PAIRS)?, Duration::from_secs(90))?;
        std::thread::sleep(Duration::from_secs(3));
        let be4 = rig.backend("be4").addr.to_string();
        lbd.lbctl(&["backend", "add", &format!("{VIP}:{TCP_PORT}/tcp"), &be4])
            .context("adding be4 during the flood")?;
        let added_at = pairs.sent();
        wait_for(
            "every idle connection's exchange after the backend was added",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                Ok(idle
                    .iter()
                    .zip(&before_idle)
                    .all(|(s, b)| s.ended() || s.exchanges() > *b))
            },
        )?;
        let pair_report = pairs.stop()?;
        std::thread::sleep(Duration::from_secs(1));
        let [evicted, established, refused] = counters(&lbd)?;
        eprintln!(
            "spoofed handshakes: {} frames ({:.0}/s, {} pairs; {added_at} frames before be4 was added); \
             ct_evicted +{}, ct_evicted_established {established} (+{}), ct_insert_refused +{}",
            pair_report.sent,
            pair_report.rate(),
            pair_report.sent / 2,
            evicted - at_pairs[0],
            established - at_pairs[1],
            refused - at_pairs[2],
        );
        if evicted - at_pairs[0] < BUCKETS * 6 {
            bail!(
                "the handshake flood evicted only {} entries: too weak to test",
                evicted - at_pairs[0]
            );
        }

        let (busy_broken, busy_stalled) = outcome(busy, &before_busy)?;
        let (idle_broken, idle_stalled) = outcome(idle, &before_idle)?;
        if !busy_broken.is_empty()
            || !busy_stalled.is_empty()
            || !idle_broken.is_empty()
            || !idle_stalled.is_empty()
        {
            bail!(
                "busy: {} of {BUSY} broke, {} stalled; idle: {} of {IDLE} broke, {} stalled \
                 (ct_evicted_established {established}):\n{}\n{}\nstalled: {busy_stalled:?} {idle_stalled:?}",
                busy_broken.len(),
                busy_stalled.len(),
                idle_broken.len(),
                idle_stalled.len(),
                busy_broken.join("\n"),
                idle_broken.join("\n"),
            );
        }
        if established != 0 {
            bail!("{established} established flows lost their entries");
        }
        Ok(())
    })());
}

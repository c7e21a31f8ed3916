//! Spoofed floods against the balancer while 200 established connections
//! stream: first SYNs alone, which must not write the connection table
//! at all; then SYNs and one-packet ACK flows together, which churn it,
//! with a backend added in the middle. The connection table must keep
//! every established flow's backend, so not one connection is reset.
//! The floods come from raw sockets on the router (random sources in
//! 198.18.0.0/16) straight to the balancer's MAC; the router drops the
//! tunnelled floods before the backends.
//!
//! The connection table is small (4,096 buckets, 24,576 ways) so that the
//! flood churns through it many times within the test's seconds.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    flood::{ACK, FLOOD_NET, SYN, SynFlood, Target, drop_tunnelled, mac_of},
    rig::{Lbd, Rig, TCP_PORT, VIP},
    scenario::{check, serial},
    traffic::Stream,
};

const STREAMS: u16 = 200;
const BUCKETS: u64 = 4096;

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
        let streams: Vec<Stream> = (0..STREAMS)
            .map(|i| {
                Stream::start_with(
                    &rig.client,
                    lb_tests::rig::CLIENT,
                    21_000 + i,
                    rig.tcp_vip(),
                    Duration::from_millis(20),
                    Duration::from_secs(20),
                )
            })
            .collect::<Result<_>>()?;
        std::thread::sleep(Duration::from_millis(500));
        let target = |flags| -> Result<Target> {
            Ok(Target {
                ifname: "r-lb".into(),
                src_mac: mac_of(&rig.router, "r-lb")?,
                dst_mac: mac_of(&rig.lb, "eth0")?,
                dst: std::net::SocketAddrV4::new(VIP, TCP_PORT),
                src_net: FLOOD_NET,
                tcp_flags: flags,
            })
        };

        // Phase 1: SYNs alone never write the connection table.
        let (new_before, evicted_before) = (
            lbd.counter("fwd_maglev_new_flow")?,
            lbd.counter("ct_evicted")?,
        );
        let syns = SynFlood::start(&rig.router, target(SYN)?, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(3));
        let syn_forwarded = lbd.counter("fwd_maglev_new_flow")? - new_before;
        let syn_evicted = lbd.counter("ct_evicted")? - evicted_before;
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

        // Phase 2: one-packet flows that are not SYNs churn the table,
        // and a backend is added in the middle of it.
        let acks = SynFlood::start(&rig.router, target(ACK)?, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(3));
        let be4 = rig.backend("be4").addr.to_string();
        lbd.lbctl(&["backend", "add", &format!("{VIP}:{TCP_PORT}/tcp"), &be4])
            .context("adding be4 during the flood")?;
        let added_at = acks.sent();
        std::thread::sleep(Duration::from_secs(3));
        let (syn_report, ack_report) = (syns.stop()?, acks.stop()?);
        let progress: Vec<u64> = streams.iter().map(Stream::exchanges).collect();
        std::thread::sleep(Duration::from_secs(1));

        let evicted = lbd.counter("ct_evicted")? - evicted_before;
        let evicted_established = lbd.counter("ct_evicted_established")?;
        eprintln!(
            "floods: {} SYNs ({:.0}/s), {} ACKs ({:.0}/s; {added_at} before be4 was added), \
             ct_evicted {evicted}, ct_evicted_established {evicted_established}",
            syn_report.sent,
            syn_report.rate(),
            ack_report.sent,
            ack_report.rate(),
        );
        // The flood must have churned the table for the test to mean
        // anything: more evictions than ways.
        if evicted < BUCKETS * 6 {
            bail!(
                "the flood evicted only {evicted} entries of {} ways: too weak to test",
                BUCKETS * 6
            );
        }

        let mut broken = vec![];
        let mut stalled = vec![];
        for (s, before) in streams.into_iter().zip(progress) {
            let after = s.exchanges();
            let r = s.finish()?;
            if let Some(e) = r.error {
                broken.push(format!("port {} ({}): {e}", r.sport, r.backend));
            } else if after <= before {
                stalled.push(r.sport);
            }
        }
        if !broken.is_empty() || !stalled.is_empty() {
            bail!(
                "{} of {STREAMS} established connections broke, {} stalled after the flood \
                 (ct_evicted_established {evicted_established}):\n{}\nstalled: {stalled:?}",
                broken.len(),
                stalled.len(),
                broken.join("\n")
            );
        }
        if evicted_established != 0 {
            bail!("{evicted_established} established flows lost their entries");
        }
        Ok(())
    })());
}

//! Path MTU discovery through the balancer, end to end: a client on a
//! 1500-byte link uploads through the VIP while the links from the router
//! to the balancer and to the backend are 1500 bytes too, so a full-size
//! segment no longer fits once tunnelled. The balancer answers it with
//! ICMP "fragmentation needed" (built in XDP, MTU 1500 − 20); the client's
//! kernel lowers its path MTU to the VIP and the upload completes. Without
//! the reply the upload stalls: the oversized frames die on the 1500-byte
//! link and nobody tells the client (a PMTU black hole). Needs root.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, Rig, VIP},
    scenario::{check, serial},
    traffic::{Mode, tcp_upload},
};

/// Bytes uploaded: a few thousand full-size segments.
const UPLOAD: usize = 8 << 20;

#[test]
fn an_upload_through_a_1500_byte_tunnel_path_completes() {
    let _serial = serial();
    check((|| {
        let mut rig = Rig::with_infra_mtu(1, 1500)?;
        rig.start_server("be1", Mode::Count)?;
        let config = rig.dir.join("lbd.yaml");
        std::fs::write(&config, rig.config(&[Some(1)]))?;
        let lbd = Lbd::start(&rig, &config)?;

        let route = |rig: &Rig| -> Result<String> {
            let out = rig.client.ip(&["route", "get", &VIP.to_string()])?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let before = route(&rig)?;
        if before.contains("mtu") {
            bail!("the client already has a path MTU for the VIP: {before}");
        }
        let replies_before = lbd.counter("reply_frag_needed")?;

        let vip = rig.tcp_vip();
        let start = Instant::now();
        let (backend, got) = rig
            .client
            .within(move || tcp_upload(CLIENT, 31_000, vip, UPLOAD, Duration::from_secs(20)))?
            .context("the upload through the VIP")?;
        let took = start.elapsed();
        if backend != "be1" || got != UPLOAD as u64 {
            bail!("{backend} received {got} of {UPLOAD} bytes");
        }

        // The reason it worked: the balancer's replies, and the path MTU
        // the client learned from them.
        let replies = lbd.counter("reply_frag_needed")? - replies_before;
        if replies == 0 {
            bail!("the upload completed without any fragmentation-needed reply");
        }
        let after = route(&rig)?;
        if !after.contains("mtu 1480") {
            bail!("the client did not learn path MTU 1480 for the VIP: {after}");
        }
        let forwarded = lbd.counter("fwd_conntrack_hit")?;
        eprintln!(
            "pmtu: {UPLOAD} bytes uploaded in {took:.2?} ({:.1} MB/s); {replies} fragmentation-needed \
             replies; client route: {}; {forwarded} packets forwarded from the connection table",
            UPLOAD as f64 / took.as_secs_f64() / 1e6,
            after.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        Ok(())
    })());
}

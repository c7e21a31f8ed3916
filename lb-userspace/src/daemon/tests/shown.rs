//! What `lbctl stats`, `status`, `table` and `health` show, from the
//! daemon's state: rates over the sampling interval, the table pool's
//! bytes, slots and shares, the probe each check makes and why a
//! backend retried like its peers is not ejected. Expected values are
//! worked out by hand from the fixture.

use super::*;
use lb_common::counters::Counter;

#[tokio::test]
async fn stats_rates_are_the_counters_change_over_the_interval() {
    let mut r = rig(FILE);
    let set = |r: &mut Rig, packets: u64, bytes: u64| {
        let c = &mut r.daemon.reconciler.dataplane_mut().counters[Counter::FwdMaglev as usize];
        (c.packets, c.bytes) = (packets, bytes);
    };
    let maglev = |s: &api::Stats| {
        let c = s.counters.iter().find(|c| c.name == "fwd_maglev_new_flow");
        c.expect("the counter").value.clone()
    };
    // No earlier sample: totals, no rate.
    set(&mut r, 10, 1_000);
    let s: api::Stats = parse(r.ok(Request::Stats).await);
    assert_eq!((maglev(&s).pps, maglev(&s).bps), (0.0, 0.0));
    r.daemon.sample();
    // Real time must pass for an interval; its length is whatever it is.
    std::thread::sleep(std::time::Duration::from_millis(2));
    set(&mut r, 30, 3_000);
    let s: api::Stats = parse(r.ok(Request::Stats).await);
    let secs = s.interval_secs;
    assert!(secs > 0.0, "{secs}");
    let v = maglev(&s);
    assert_eq!((v.packets, v.bytes), (30, 3_000));
    // 20 packets and 2,000 bytes (16,000 bits) over the interval.
    assert_eq!(v.pps, 20.0 / secs);
    assert_eq!(v.bps, 16_000.0 / secs);
}

#[tokio::test]
async fn status_gives_the_table_pool_and_what_the_tables_use() {
    let r = rig(FILE);
    let s = r.daemon.status();
    // One VIP of 101 slots: two halves of one 4 KiB chunk (1,024 slots of
    // four bytes) each.
    assert_eq!(s.table_pool_used_bytes, 2 * 4096);
    let chunks = r.daemon.config.layout.pool_chunks();
    assert_eq!(s.table_pool_bytes, u64::from(chunks) * 4096);
    assert!(s.table_pool_bytes > s.table_pool_used_bytes);
}

#[tokio::test]
async fn table_shows_each_backends_slots_share_and_weight_share() {
    let mut r = rig(FILE);
    let t = r.daemon.table(&id(WEB), false).unwrap();
    assert_eq!(t.table_size, 101);
    let row = |t: &api::TableInfo, a: &str| {
        t.backends
            .iter()
            .find(|b| b.address == ip(a))
            .unwrap()
            .clone()
    };
    let (one, two) = (row(&t, "10.1.0.1"), row(&t, "10.1.0.2"));
    assert_eq!(one.slots + two.slots, 101);
    assert_eq!((one.weight, two.weight), (2, 1), "the configured weights");
    assert_eq!(one.share, f64::from(one.slots) / 101.0);
    assert_eq!(two.share, f64::from(two.slots) / 101.0);
    assert!((one.weight_share - 2.0 / 3.0).abs() < 1e-12, "{one:?}");
    assert!((two.weight_share - 1.0 / 3.0).abs() < 1e-12, "{two:?}");
    // Out of the table: no slots, no share of the weight.
    r.ok(weight(WEB, "10.1.0.2", 0)).await;
    let t = r.daemon.table(&id(WEB), false).unwrap();
    let (one, two) = (row(&t, "10.1.0.1"), row(&t, "10.1.0.2"));
    assert_eq!((one.slots, one.weight_share), (101, 1.0));
    assert_eq!((two.slots, two.weight, two.weight_share), (0, 0, 0.0));
    let e = r.daemon.table(&id("10.99.0.9:80/tcp"), false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

/// A weight too small for its table: 1 beside 10,000 in 101 slots is
/// 0.0099 of a slot, and the largest remainder goes to the heavier
/// backend, so the light one has no slot. It carries no share of the
/// traffic, and none of the weight in the table either.
#[tokio::test]
async fn a_backend_with_weight_but_no_slot_has_no_weight_share() {
    let mut r = rig(FILE);
    r.ok(weight(WEB, "10.1.0.1", 10_000)).await;
    r.ok(weight(WEB, "10.1.0.2", 1)).await;
    let t = r.daemon.table(&id(WEB), false).unwrap();
    let row = |a: &str| t.backends.iter().find(|b| b.address == ip(a)).unwrap();
    let (heavy, light) = (row("10.1.0.1"), row("10.1.0.2"));
    assert_eq!((heavy.slots, heavy.weight_share), (101, 1.0), "{heavy:?}");
    assert_eq!(
        (light.weight, light.slots, light.share, light.weight_share),
        (1, 0, 0.0, 0.0),
        "{light:?}"
    );
}

#[tokio::test]
async fn health_describes_each_check() {
    let cases = [
        ("{send: ping}", "tcp send/expect 10.1.0.1:80 every "),
        ("{expect: pong}", "tcp send/expect 10.1.0.1:80 every "),
        ("{port: 8080}", "tcp connect 10.1.0.1:8080 every "),
        (
            "{http: {path: /up, status: 204}}",
            "http GET /up → 204 10.1.0.1:80 every ",
        ),
        (
            "{through_tunnel: true}",
            "tcp connect 10.99.0.1:80 through the tunnel every ",
        ),
    ];
    for (check, want) in cases {
        let text = FILE.replace(
            "    protocol: tcp\n",
            &format!("    protocol: tcp\n    health_check: {check}\n"),
        );
        let r = rig(&text);
        let health = r.daemon.health();
        let b = &health[0]
            .backends
            .iter()
            .find(|b| b.address == ip("10.1.0.1"));
        let said = b.and_then(|b| b.check.clone()).unwrap_or_default();
        assert!(said.starts_with(want), "{check}: {said}");
        assert!(said.contains("(timeout "), "{check}: {said}");
    }
}

#[tokio::test]
async fn health_notes_why_a_backend_retried_like_its_peers_is_not_ejected() {
    let text = FILE.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n      - address: 10.1.0.4\n",
    );
    let mut r = rig(&text);
    // .4 is never retried; per tick: .1 20 SYNs, 10 retried (50%); .2 10, 4 (40%); .3 one SYN,
    // retried (100%, but 6 in all: under min_syns 20); .1 and .2 qualify.
    for _ in 0..6 {
        syns(&mut r, "10.1.0.1", 20, 10);
        syns(&mut r, "10.1.0.2", 10, 4);
        syns(&mut r, "10.1.0.3", 1, 1);
        syns(&mut r, "10.1.0.4", 10, 0);
        r.daemon.tick();
    }
    assert_eq!(r.in_table(WEB).len(), 4, "nobody ejected");
    let health = r.daemon.health();
    let note = |a: &str| {
        let b = health[0].backends.iter().find(|b| b.address == ip(a));
        b.and_then(|b| b.passive.as_ref())
            .and_then(|p| p.note.clone())
    };
    let alike = |pct: u32| {
        format!(
            "not ejected: the VIP's other backends see their SYNs retried alike ({pct}%), so the cause is not this backend"
        )
    };
    // .1's others: 126 SYNs, 30 retried (24%); .2's: 186, 66 (35%).
    assert_eq!(note("10.1.0.1"), Some(alike(24)));
    assert_eq!(note("10.1.0.2"), Some(alike(35)));
    assert_eq!(note("10.1.0.4"), None, "not retried");
    assert_eq!(note("10.1.0.3"), None, "too few SYNs to judge");
}

/// A backend retried far more than its peer, but on a sample too small
/// to tell from chance, is said to be that (not "retried alike"); once
/// drained it is not judged at all.
#[tokio::test]
async fn health_notes_a_backend_kept_for_a_small_sample_or_not_judged() {
    let mut r = rig(FILE);
    // After the first tick (the counters' base): .1 20 SYNs, 10 retried
    // (50%); .2 32, 5 (16%). 50% passes 30% and 3 × 16%, but 10 or more
    // of the 15 retries falling on .1's 20 of the 52 SYNs happens once in
    // 102 by chance (the hypergeometric tail, summed exactly in Python).
    for (one, two) in [(5, 2), (5, 3), (5, 2)] {
        syns(&mut r, "10.1.0.1", 10, one);
        syns(&mut r, "10.1.0.2", 16, two);
        r.daemon.tick();
    }
    assert_eq!(r.in_table(WEB).len(), 2, "nobody ejected");
    let note = |r: &Rig, a: &str| {
        let health = r.daemon.health();
        let b = health[0]
            .backends
            .iter()
            .find(|b| b.address == ip(a))
            .cloned();
        b.and_then(|b| b.passive).and_then(|p| p.note)
    };
    assert_eq!(
        note(&r, "10.1.0.1").as_deref(),
        Some(
            "not ejected: too few SYNs to tell it from chance (as uneven as this once in 102 by chance alone; ejecting needs under once in 741)"
        )
    );
    assert_eq!(note(&r, "10.1.0.2"), None, "under the ratio");
    r.ok(r.drain(WEB, "10.1.0.1", false)).await;
    assert_eq!(
        note(&r, "10.1.0.1").as_deref(),
        Some("not judged: it is down, drained or weighted 0")
    );
}

/// `lbctl simulate --quic-cid` with an ID too short to hold the VIP's
/// server ID is refused (its padding would stand for the server ID); one
/// that holds it is routed by it.
#[tokio::test]
async fn a_quic_id_too_short_for_the_server_id_is_refused() {
    let text = "instance: unit\ninterfaces: [eth0]\ngateway_mac: \"02:00:00:00:00:01\"\nouter_source_v4: 10.0.0.2\ntable_size: 101\nconntrack_buckets: 1024\nvips:\n  - address: 10.99.0.3\n    port: 443\n    protocol: udp\n    quic: { server_id_len: 2 }\n    backends:\n      - { address: 10.1.0.1, server_id: \"0a01\" }\n      - { address: 10.1.0.2, server_id: \"0a02\" }\n";
    let r = rig(text);
    let shape = |cid| crate::daemon::views::Shape {
        syn: false,
        quic_cid: Some(cid),
    };
    let simulate = |cid| {
        r.daemon.simulate(
            ip("192.0.2.7"),
            ip("10.99.0.3"),
            17,
            (40_000, 443),
            shape(cid),
        )
    };
    let e = simulate("400a").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
    assert!(e.to_string().contains("holds no server ID of 2"), "{e}");
    let routed = simulate("400a02").expect("three octets hold it");
    assert_eq!(routed.backend, Some(ip("10.1.0.2")), "{routed:?}");
}

#[test]
fn times_are_written_as_utc_dates() {
    // Worked out by hand: 11,016 days after 1970-01-01 is 2000-02-29 (a
    // century's leap day); 1.7e9 s is 19,675 days and 80,000 s.
    let at =
        |secs: u64| views::humantime(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
    assert_eq!(at(0), "1970-01-01T00:00:00Z");
    assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(at(951_868_799), "2000-02-29T23:59:59Z");
    assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
    // First days of months, where the month arithmetic turns over.
    for (secs, day) in [
        (951_868_800, "2000-03-01"),
        (1_685_577_600, "2023-06-01"),
        (1_688_169_600, "2023-07-01"),
        (1_690_848_000, "2023-08-01"),
        (1_698_796_800, "2023-11-01"),
    ] {
        assert_eq!(at(secs), format!("{day}T00:00:00Z"));
    }
    assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
}

#[tokio::test]
async fn overrides_list_each_runtime_change_with_its_time() {
    let mut r = rig(FILE);
    let list = |r: &mut Rig| {
        let rows = r.daemon.override_rows();
        rows.into_iter()
            .map(|o| (o.vip, o.backend, o.field, o.file, o.running, o.time))
            .collect::<Vec<_>>()
    };
    assert!(list(&mut r).is_empty());
    r.ok(weight(WEB, "10.1.0.1", 3)).await;
    let rows = list(&mut r);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (vip, backend, field, file, running, time) = rows[0].clone();
    assert_eq!(
        (
            vip,
            backend,
            field.as_str(),
            file.as_str(),
            running.as_str()
        ),
        (id(WEB), Some(ip("10.1.0.1")), "weight", "2", "3")
    );
    // Now, as UTC: this year, `YYYY-MM-DDTHH:MM:SSZ`.
    let year = views::humantime(std::time::SystemTime::now())[..4].to_string();
    assert!(
        time.starts_with(&year) && time.ends_with('Z') && time.len() == 20,
        "{time}"
    );
}

#[tokio::test]
async fn a_backend_exactly_at_min_syns_and_ratio_is_judged() {
    let mut r = rig(FILE);
    // The first tick reads the counters' base; then two ticks of 10
    // SYNs, 3 retried: 20 SYNs (min_syns 20), 6 retried (ratio 0.3, the
    // default): at both thresholds, so judged; its peer is retried
    // alike, so not ejected, and the note says why.
    for _ in 0..3 {
        syns(&mut r, "10.1.0.1", 10, 3);
        syns(&mut r, "10.1.0.2", 10, 3);
        r.daemon.tick();
    }
    assert_eq!(r.in_table(WEB).len(), 2, "nobody ejected");
    let health = r.daemon.health();
    let b = health[0]
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.1"));
    let note = b
        .and_then(|b| b.passive.as_ref())
        .and_then(|p| p.note.clone());
    assert_eq!(
        note.as_deref(),
        Some(
            "not ejected: the VIP's other backends see their SYNs retried alike (30%), so the cause is not this backend"
        )
    );
}

/// A drain on a VIP without a connection table says what it means there:
/// the flows moved at once, and "drained" is only "no new flows". With a
/// table, no such warning.
#[tokio::test]
async fn a_drain_without_a_connection_table_says_the_flows_moved_at_once() {
    const SAID: &str = "has no connection table (conntrack: false)";
    let untracked = FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    conntrack: false\n",
    );
    let mut r = rig(&untracked);
    let c: api::Committed = parse(r.ok(r.drain(WEB, "10.1.0.1", false)).await);
    assert!(
        c.warnings.iter().any(|w| w.contains(SAID)),
        "{:?}",
        c.warnings
    );
    let mut r = rig(FILE);
    let c: api::Committed = parse(r.ok(r.drain(WEB, "10.1.0.1", false)).await);
    assert!(
        !c.warnings.iter().any(|w| w.contains(SAID)),
        "{:?}",
        c.warnings
    );
}

/// A reload whose file removes a drained backend names the drain it
/// drops, and the backend added back by a later reload is not drained.
#[tokio::test]
async fn a_reload_that_removes_a_drained_backend_names_the_drain() {
    let mut r = rig(FILE);
    r.ok(r.drain(WEB, "10.1.0.2", false)).await;
    let without = FILE.replace("      - address: 10.1.0.2\n", "");
    let c = r
        .daemon
        .reload(reparse(&r, &without), true, &ChangeOptions::default())
        .await
        .unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("backend 10.1.0.2 state")),
        "{:?}",
        c.warnings
    );
    r.daemon
        .reload(reparse(&r, FILE), false, &ChangeOptions::default())
        .await
        .unwrap();
    let drained = r.daemon.overlay.drained_in(&r.daemon.effective());
    assert!(drained.is_empty(), "{drained:?}");
}

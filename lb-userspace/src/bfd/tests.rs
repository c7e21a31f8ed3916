//! The sessions' installation and reading against the in-memory table.

use std::{net::IpAddr, sync::Arc};

use lb_common::bfd::{DIAG_TIME_EXPIRED, STATE_DOWN, STATE_INIT};

use super::*;

fn peer(addr: &str, ms: u64) -> BfdPeer {
    BfdPeer {
        peer: addr.parse().unwrap(),
        local: Some("10.98.1.2".parse().unwrap()),
        timers: BfdTimers {
            min_rx: Duration::from_millis(ms),
            min_tx: Duration::from_millis(ms),
            multiplier: 3,
        },
    }
}

#[test]
fn sessions_get_their_own_slot_discriminator_and_port_and_are_adopted() {
    let table = FakeBfdTable::default();
    let first = install(&table, vec![peer("10.98.1.1", 300), peer("10.98.2.1", 300)]).unwrap();
    let (a, b) = (first[0].config, first[1].config);
    assert_ne!(a.slot, b.slot);
    assert_ne!(a.my_disc, b.my_disc);
    assert!(a.my_disc != 0 && b.my_disc != 0);
    for c in [a, b] {
        assert!(u16::from_be(c.src_port) >= BFD_SRC_PORT_MIN, "{c:?}");
        assert_eq!(
            (c.desired_min_tx_us, c.required_min_rx_us, c.detect_mult),
            (300_000, 300_000, 3)
        );
    }
    assert_eq!(a.local_addr[0].to_ne_bytes(), [10, 98, 1, 2]);
    // A restarted lbd keeps them as they are; a peer no longer
    // configured goes; new timers start a Poll Sequence.
    table.put_state(
        a.slot,
        BfdState {
            state: STATE_UP,
            rx: 9,
            ..BfdState::default()
        },
    );
    let again = install(&table, vec![peer("10.98.1.1", 100)]).unwrap();
    let c = again[0].config;
    assert_eq!(
        (c.slot, c.my_disc, c.src_port),
        (a.slot, a.my_disc, a.src_port)
    );
    assert_eq!(c.config_gen, a.config_gen + 1);
    assert_eq!(c.desired_min_tx_us, 100_000);
    assert_eq!(table.peers().unwrap().len(), 1);
    assert_eq!(
        table.state(a.slot).unwrap().rx,
        9,
        "an adopted session keeps its state"
    );
    // The same timers: the same generation.
    let same = install(&table, vec![peer("10.98.1.1", 100)]).unwrap();
    assert_eq!(same[0].config.config_gen, c.config_gen);
    // A new session's slot is zeroed first.
    table.put_state(
        b.slot,
        BfdState {
            rx: 5,
            ..BfdState::default()
        },
    );
    let third = install(&table, vec![peer("10.98.1.1", 100), peer("10.98.3.1", 300)]).unwrap();
    assert_eq!(table.state(third[1].config.slot).unwrap().rx, 0);
}

/// With no peer asking for BFD, every session left in the maps goes.
#[test]
fn remove_all_empties_the_maps() {
    let table = FakeBfdTable::default();
    install(&table, vec![peer("10.98.1.1", 300), peer("10.98.1.2", 300)]).unwrap();
    assert_eq!(table.peers().unwrap().len(), 2);
    assert_eq!(remove_all(&table).unwrap(), 2);
    assert!(table.peers().unwrap().is_empty());
    assert_eq!(remove_all(&table).unwrap(), 0);
}

#[test]
fn more_sessions_than_the_map_holds_are_refused() {
    let table = FakeBfdTable::default();
    let many: Vec<BfdPeer> = (0..=BFD_MAX_SESSIONS)
        .map(|i| peer(&format!("10.97.{}.{}", i / 200, i % 200 + 1), 300))
        .collect();
    assert!(matches!(install(&table, many), Err(BfdError::TooMany)));
}

/// What the reader knows of a session before its first read.
fn unseen() -> Seen {
    Seen {
        rx: 0,
        rx_at: Instant::now(),
        state: None,
        since: None,
    }
}

#[test]
fn a_silent_session_is_down_after_its_detection_time() {
    let table = FakeBfdTable::default();
    let s = install(&table, vec![peer("10.98.1.1", 300)])
        .unwrap()
        .remove(0);
    let up = BfdState {
        state: STATE_UP,
        rx: 10,
        detect_ns: 900_000_000,
        ..BfdState::default()
    };
    let mut seen = unseen();
    let got = observe(&s, &up, &mut seen);
    assert!(got.up && got.state == "Up", "{got:?}");
    assert_eq!(
        got.since_secs, None,
        "the first read does not know when it changed"
    );
    // Nothing new for longer than the detection time.
    seen.rx_at = Instant::now() - Duration::from_secs(2);
    let got = observe(&s, &up, &mut seen);
    assert!(!got.up, "{got:?}");
    assert_eq!(got.state, "Down");
    assert_eq!(got.diag, diag_name(DIAG_TIME_EXPIRED));
    assert_eq!(got.since_secs, Some(0));
    // Packets again: Init then Up, as the datapath says.
    let init = BfdState {
        state: STATE_INIT,
        rx: 11,
        ..up
    };
    assert_eq!(observe(&s, &init, &mut seen).state, "Init");
    let down = BfdState {
        state: STATE_DOWN,
        rx: 12,
        ..up
    };
    assert!(!observe(&s, &down, &mut seen).up);
}

/// A restarted `lbd`'s first read: the packet count is the earlier
/// `lbd`'s, so silence is judged from the last packet's time in the map
/// (`CLOCK_MONOTONIC`, as `bpf_ktime_get_ns`): a session the map still
/// says is Up but that heard nothing for longer than its detection time
/// is Down at once, not Up for one more detection time.
#[test]
fn the_first_read_judges_silence_by_the_last_packets_time() {
    let table = FakeBfdTable::default();
    let s = install(&table, vec![peer("10.98.1.1", 300)])
        .unwrap()
        .remove(0);
    let now_ns = crate::liveflows::clock_ns(libc::CLOCK_MONOTONIC);
    let read = |last_rx_ago: Duration| {
        let st = BfdState {
            state: STATE_UP,
            rx: 500,
            last_rx_ns: now_ns - last_rx_ago.as_nanos() as u64,
            detect_ns: 900_000_000,
            ..BfdState::default()
        };
        let mut seen = unseen();
        observe(&s, &st, &mut seen)
    };
    let quiet = read(Duration::from_secs(5));
    assert!(!quiet.up, "{quiet:?}");
    assert_eq!(quiet.diag, diag_name(DIAG_TIME_EXPIRED));
    let heard = read(Duration::from_millis(100));
    assert!(heard.up, "{heard:?}");
}

#[tokio::test]
async fn links_follow_the_datapaths_state() {
    let table = Arc::new(FakeBfdTable::default());
    let sessions = start(table.clone(), vec![peer("10.98.1.1", 300)]).unwrap();
    let mut link = sessions.link(0);
    assert!(!*link.up.borrow());
    let slot = table.peers().unwrap()[0].1.slot;
    table.put_state(
        slot,
        BfdState {
            state: STATE_UP,
            rx: 1,
            detect_ns: 60_000_000_000,
            ..BfdState::default()
        },
    );
    tokio::time::timeout(Duration::from_secs(5), link.up.wait_for(|up| *up))
        .await
        .expect("up within 5 s")
        .unwrap();
    table.put_state(
        slot,
        BfdState {
            state: STATE_DOWN,
            rx: 2,
            detect_ns: 60_000_000_000,
            ..BfdState::default()
        },
    );
    tokio::time::timeout(Duration::from_secs(5), link.up.wait_for(|up| !*up))
        .await
        .expect("down within 5 s")
        .unwrap();
    let status = link.status();
    assert_eq!((status.state.as_str(), status.received), ("Down", 2));
    let _: Option<IpAddr> = status.local;
}

//! Second chance in the daemon: the sources of a VIP's alternates follow
//! its configuration and its revisions, survive a restart with empty maps,
//! and a health verdict does not touch them.

use std::collections::BTreeMap;

use super::*;
use crate::{lifecycle::WEIGHT_SCALE, second_chance::Sources};

fn file() -> String {
    FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n",
    )
}

fn sources(r: &Rig) -> Sources {
    r.daemon.reconciler.vips()[&id(WEB)]
        .alternate_sources()
        .expect("a second-chance VIP has sources")
        .clone()
}

fn members(ws: &[(&str, u32)]) -> BTreeMap<IpAddr, u32> {
    ws.iter().map(|(a, w)| (ip(a), w * WEIGHT_SCALE)).collect()
}

/// A new daemon over `r`'s files (state, revisions) and fresh, empty maps:
/// a balancer that restarted after losing its pins.
fn restart(r: Rig) -> Rig {
    let Rig { daemon, _dir, .. } = r;
    let config = daemon.config.clone();
    let text = daemon.text.clone();
    let overlay = daemon.overlay.clone();
    drop(daemon);
    let revisions = RevisionStore::open(&config.revisions_dir(), config.history).unwrap();
    let mut reconciler = Reconciler::adopt(FakeDataplane::new(config.layout)).unwrap();
    let settings = settings::datapath_settings(&config, [2, 0, 0, 0, 0, 1]);
    reconciler.apply_settings(&settings).unwrap();
    let told = Told::default();
    let sink = told.clone();
    let mut daemon = Daemon::new(
        _dir.join("lb.yaml"),
        Target {
            config,
            text,
            overlay,
        },
        reconciler,
        settings,
        Probes::new(Box::new(|_, _, _, _, _| tokio::spawn(async {}))),
        Announcers::new(Box::new(move |_| {
            Ok(vec![Box::new(Recording(sink.clone())) as Box<dyn Announcer>])
        })),
        revisions,
    );
    let effective = daemon.effective();
    daemon.program(&effective, true).expect("programs");
    daemon.start_revision();
    Rig {
        daemon,
        told,
        spawned: Spawned::default(),
        targets: Arc::default(),
        _dir,
    }
}

#[tokio::test]
async fn alternates_come_from_the_configuration_and_the_previous_revision() {
    let mut r = rig(&file());
    let start = members(&[("10.1.0.1", 2), ("10.1.0.2", 1)]);
    assert_eq!(
        sources(&r),
        Sources {
            configured: start.clone(),
            previous: None,
        }
    );
    let meta = r.daemon.reconciler.vips()[&id(WEB)].meta;
    assert_ne!(meta.flags & lb_common::consts::VIP_F_SECOND_CHANCE, 0);

    // A re-weight: the previous table is the one before it.
    r.ok(weight(WEB, "10.1.0.1", 3)).await;
    let now = members(&[("10.1.0.1", 3), ("10.1.0.2", 1)]);
    let want = Sources {
        configured: now.clone(),
        previous: Some(start.clone()),
    };
    assert_eq!(sources(&r), want);

    // A drain changes the table, not the sources: the configured table
    // still names the drained backend.
    let drain = r.drain(WEB, "10.1.0.2", true);
    r.ok(drain).await;
    assert_eq!(sources(&r), want);
    let alts = r.daemon.reconciler.vips()[&id(WEB)].alternates().unwrap();
    assert!((0..101).any(|s| alts.slot(s).any(|a| a == ip("10.1.0.2"))));

    // Restarted with empty maps: the same sources, from the revisions.
    let r = restart(r);
    assert_eq!(sources(&r), want);
}

#[tokio::test]
async fn a_vip_turning_second_chance_on_finds_its_previous_table_in_revisions_without_it() {
    // Revisions 1 and 2 without second chance: the VIP's table changes.
    let mut r = rig(FILE);
    r.ok(weight(WEB, "10.1.0.1", 3)).await;
    // Second chance on: the table before the re-weight is the previous
    // one, though no revision that had it had second chance.
    r.daemon
        .reload(reparse(&r, &file()), true, &plain())
        .await
        .unwrap();
    assert_eq!(
        sources(&r),
        Sources {
            configured: members(&[("10.1.0.1", 3), ("10.1.0.2", 1)]),
            previous: Some(members(&[("10.1.0.1", 2), ("10.1.0.2", 1)])),
        }
    );
}

fn shape(syn: bool) -> crate::daemon::views::Shape<'static> {
    crate::daemon::views::Shape {
        syn,
        quic_cid: None,
    }
}

#[tokio::test]
async fn simulate_lists_the_alternates_of_a_miss_only() {
    let r = rig(&file());
    let (client, vip) = (ip("192.0.2.7"), ip("10.99.0.1"));
    for sport in 40_000..40_020 {
        let syn = r
            .daemon
            .simulate(client, vip, 6, (sport, 80), shape(true))
            .unwrap();
        assert!(syn.alternates.is_empty(), "a SYN carries none");
        let mid = r
            .daemon
            .simulate(client, vip, 6, (sport, 80), shape(false))
            .unwrap();
        assert_eq!(mid.backend, syn.backend);
        assert!(!mid.alternates.is_empty(), "two backends: one alternate");
        assert!(!mid.alternates.contains(&mid.backend.unwrap()));
    }
}

//! A refused change touches nothing: when the disk takes neither the
//! revision nor the state file, no map is written; when the kernel refuses
//! a map write half-way through, the change is undone with every backend
//! under the handle it had, so no connection-table entry goes stale.

use super::*;

/// Two VIPs: a change that removes a backend of the first and adds one to
/// the second retires the first's backend before it writes the second.
const TWO: &str = r#"
instance: unit
interfaces: [eth0]
gateway_mac: "02:00:00:00:00:01"
outer_source_v4: 10.0.0.2
table_size: 101
conntrack_buckets: 1024
vips:
  - address: 10.99.0.1
    port: 80
    protocol: tcp
    backends:
      - address: 10.1.0.1
      - address: 10.1.0.2
      - address: 10.1.0.3
  - address: 10.99.0.2
    port: 80
    protocol: tcp
    backends:
      - address: 10.2.0.1
"#;

/// Every backend handle of every VIP, and every published table.
type Maps = (Vec<(VipId, IpAddr, u32)>, Vec<Vec<Option<IpAddr>>>);

fn maps(r: &Rig) -> Maps {
    let mut handles = Vec::new();
    let mut tables = Vec::new();
    for (id, state) in r.daemon.reconciler.vips() {
        for (addr, b) in &state.backends {
            handles.push((*id, *addr, b.handle));
        }
        tables.push(r.daemon.reconciler.table_addresses(id).unwrap().unwrap());
    }
    (handles, tables)
}

/// Reloads `text` while the fake's maps refuse the write of `vip`'s
/// `LB_VIPS` entry (half-way through the apply): the refusal.
async fn refused_at(r: &mut Rig, text: &str, vip: &str) {
    let id: VipId = vip.parse().unwrap();
    r.daemon.reconciler.dataplane_mut().refuse_vip = Some(id.key());
    let parsed = reparse(r, text);
    let e = r.daemon.reload(parsed, false, &plain()).await.unwrap_err();
    r.daemon.reconciler.dataplane_mut().refuse_vip = None;
    assert!(e.to_string().contains("refused by the fake"), "{e}");
}

#[tokio::test]
async fn a_change_the_disk_cannot_hold_writes_nothing_to_the_maps() {
    let mut r = rig(FILE);
    let before = maps(&r);
    let writes = r.daemon.reconciler.dataplane().writes;
    // The state file cannot be replaced (a directory stands in its way),
    // as on a full file system.
    let state = r.daemon.config.state_file.clone();
    std::fs::create_dir_all(&state).unwrap();
    let e = r
        .refused(ErrorKind::Internal, del_backend(WEB, "10.1.0.2", false))
        .await;
    assert!(e.contains("nothing changed"), "{e}");
    assert_eq!(
        r.daemon.reconciler.dataplane().writes,
        writes,
        "no map write"
    );
    assert_eq!(maps(&r), before);
    std::fs::remove_dir_all(&state).unwrap();

    // Nor can the revision be written: the store's directory is gone and
    // a file stands in its place.
    let dir = r.daemon.revisions.dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "not a directory").unwrap();
    let e = r
        .refused(ErrorKind::Internal, del_backend(WEB, "10.1.0.2", false))
        .await;
    assert!(e.contains("nothing changed"), "{e}");
    assert_eq!(
        r.daemon.reconciler.dataplane().writes,
        writes,
        "no map write"
    );
    assert_eq!(maps(&r), before);
    assert!(
        !std::fs::read_to_string(&r.daemon.config.state_file)
            .unwrap_or_default()
            .contains("10.1.0.2\""),
        "the state file does not hold the refused change"
    );
}

/// A change that fits in all but not on the way (three backends swapped
/// for three others with room for four: the new need indexes before the
/// old give theirs back) is refused before anything is written: no
/// revision that ran, no settings (its MTU), no map write (helper-41: the
/// settings and the revision went first, and were undone after).
#[tokio::test]
async fn a_change_without_room_on_the_way_writes_nothing_not_even_settings() {
    let three = FILE
        .replace(
            "conntrack_buckets: 1024",
            "conntrack_buckets: 1024\nmax_backends: 4",
        )
        .replace(
            "      - address: 10.1.0.2\n",
            "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
        );
    let mut r = rig(&three);
    let writes = r.daemon.reconciler.dataplane().writes;
    let mtu = r.daemon.reconciler.dataplane().config().unwrap().mtu;
    let revision = r.daemon.revision;
    let swapped = three
        .replace("10.1.0.1", "10.1.0.7")
        .replace("10.1.0.2", "10.1.0.8")
        .replace("10.1.0.3", "10.1.0.9")
        .replace("table_size: 101", "table_size: 101\nmtu: 9000");
    let e = r
        .daemon
        .reload(reparse(&r, &swapped), true, &plain())
        .await
        .expect_err("no room on the way");
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert_eq!(r.daemon.reconciler.dataplane().writes, writes, "no write");
    assert_eq!(r.daemon.reconciler.dataplane().config().unwrap().mtu, mtu);
    assert_eq!(r.daemon.revision, revision);
}

/// A change on probation that the state file refuses leaves no probation
/// behind (the probation is written first, so that a crash between the two
/// never leaves a change running unwatched, and taken back).
#[tokio::test]
async fn a_probation_the_state_file_refuses_is_taken_back() {
    let mut r = rig(FILE);
    let state = r.daemon.config.state_file.clone();
    std::fs::create_dir_all(&state).unwrap();
    let options = ChangeOptions {
        dry_run: false,
        confirm_within: Some(crate::api::Within(std::time::Duration::from_secs(60))),
    };
    let answer = r
        .daemon
        .handle(del_backend(WEB, "10.1.0.2", false), options)
        .await;
    assert!(!answer.ok, "{answer:?}");
    assert!(answer.error.unwrap_or_default().contains("nothing changed"));
    assert_eq!(r.daemon.revisions.probation().unwrap(), None);
    std::fs::remove_dir_all(&state).unwrap();
}

#[tokio::test]
async fn a_map_write_refused_half_way_is_undone_under_the_same_handles() {
    let mut r = rig(TWO);
    let before = maps(&r);
    let text = TWO.replace("      - address: 10.1.0.2\n", "").replace(
        "      - address: 10.2.0.1\n",
        "      - address: 10.2.0.1\n      - address: 10.2.0.2\n",
    );
    refused_at(&mut r, &text, "10.99.0.2:80/tcp").await;
    // The first VIP's backend was retired before the second VIP's write
    // failed; the undo brought it back under its handle.
    assert_eq!(maps(&r), before);
    let history: Vec<_> = r.daemon.revisions.list(3).unwrap().collect();
    let newest = history[0].as_ref().expect("readable");
    assert!(
        !newest.applied(),
        "the refusal is the newest revision: {newest:?}"
    );
    assert!(
        history.iter().flatten().filter(|v| v.applied()).count() == 1,
        "no revision claims the refused change ran"
    );
}

/// Maps that refuse a change leave the rest as it was: the bookkeeping of
/// a backend the change would have removed (its slow start began when it
/// joined, not again now), and the routers, who never hear of a VIP the
/// change would have added.
#[tokio::test]
async fn a_change_the_maps_refuse_touches_neither_the_backends_records_nor_the_routes() {
    let mut r = rig(TWO);
    let first: VipId = "10.99.0.1:80/tcp".parse().unwrap();
    let gone: IpAddr = "10.1.0.2".parse().unwrap();
    let joined = |r: &Rig| {
        r.daemon.lifecycle.vips[&first]
            .backends
            .get(&gone)
            .map(|b| b.joined)
    };
    let before = joined(&r).expect("a record");
    let told = r.told.lock().unwrap().len();
    let text = TWO.replace("      - address: 10.1.0.2\n", "")
        + "  - address: 10.99.0.3\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.3.0.1\n";
    refused_at(&mut r, &text, "10.99.0.3:80/tcp").await;
    assert_eq!(joined(&r), Some(before), "the record is the one it had");
    let third_ip: IpAddr = "10.99.0.3".parse().unwrap();
    let sets = r.told.lock().unwrap()[told..].to_vec();
    assert!(
        sets.iter().all(|s| !s.contains(&third_ip)),
        "the refused VIP was announced: {sets:?}"
    );
}

/// The same refusal again takes the place of the last one (with its
/// time), so a broken change retried by a script does not push the
/// revisions that ran out of the history; another refusal is a revision
/// of its own.
#[tokio::test]
async fn the_same_refusal_again_replaces_the_last() {
    let mut r = rig(TWO);
    let refusals = |r: &Rig| -> Vec<u64> {
        let listed = r.daemon.revisions.list(50).unwrap();
        listed
            .flatten()
            .filter(|v| !v.applied())
            .map(|v| v.number)
            .collect()
    };
    let text = TWO.replace("      - address: 10.2.0.1\n", "      - address: 10.2.0.2\n");
    for _ in 0..3 {
        refused_at(&mut r, &text, "10.99.0.2:80/tcp").await;
    }
    assert_eq!(refusals(&r).len(), 1, "one refusal: {:?}", refusals(&r));
    let other = TWO.replace("      - address: 10.2.0.1\n", "      - address: 10.2.0.3\n");
    refused_at(&mut r, &other, "10.99.0.2:80/tcp").await;
    assert_eq!(refusals(&r).len(), 2, "{:?}", refusals(&r));
}

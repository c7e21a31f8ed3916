//! Unit tests of the daemon: every request against the in-memory dataplane,
//! with recording fakes for probers and announcers. What `lbd` adds around
//! this (socket, signals, attachment) is tested end to end in `tests/e2e`.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;

use super::*;
use crate::{
    announce::{Announcer, PeerStatus},
    api::{
        BackendRequest, BackendSpec, ChangeOptions, NodeRequest, NodeState, Request, Response,
        Simulation, VipAdd, VipRequest, VipSettings,
    },
    config::Protocol,
    dataplane::fake::FakeDataplane,
    revisions::RevisionStore,
    scratch::ScratchDir,
    test_logs as logs,
};

const FILE: &str = r#"
instance: unit
interfaces: [eth0]
gateway_mac: "02:00:00:00:00:01"
outer_source_v4: 10.0.0.2
outer_source_v6: fd00::2
table_size: 101
conntrack_buckets: 1024
vips:
  - address: 10.99.0.1
    port: 80
    protocol: tcp
    backends:
      - address: 10.1.0.1
        weight: 2
      - address: 10.1.0.2
"#;

const WEB: &str = "10.99.0.1:80/tcp";

/// What the fake announcers were told, in order, across restarts.
type Told = Arc<Mutex<Vec<BTreeSet<IpAddr>>>>;

/// An announcer that records every set it is handed, and reports one
/// working peer that has it (as an exec announcer whose commands succeed).
struct Recording(Told);

impl Announcer for Recording {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        self.0.lock().unwrap().push(prefixes.clone());
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        vec![PeerStatus::new(
            "recording",
            crate::announce::SessionState::Established,
        )]
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Probers started, by backend.
type Spawned = Arc<Mutex<Vec<BackendKey>>>;

struct Rig {
    daemon: Daemon<FakeDataplane>,
    told: Told,
    spawned: Spawned,
    /// Where each prober started probes, in order.
    targets: Arc<Mutex<Vec<crate::health::ProbeTarget>>>,
    _dir: ScratchDir,
}

/// An announcer that records the sets, the settled flags and the
/// graceful shutdowns it is told, with a graceful-shutdown wait of 3 s.
struct Graceful(Told, Arc<Mutex<Vec<String>>>);

impl Announcer for Graceful {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        self.0.lock().unwrap().push(prefixes.clone());
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        Vec::new()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async { Ok(()) })
    }

    fn set_settled(&mut self, settled: bool) {
        self.1.lock().unwrap().push(format!("settled {settled}"));
    }

    fn graceful_shutdown_wait(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(3))
    }

    fn set_graceful_shutdown(&mut self, on: bool) {
        self.1.lock().unwrap().push(format!("graceful {on}"));
    }
}

/// One recording announcer, recording into `told`.
fn recording(told: &Told) -> Announcers {
    let sink = told.clone();
    Announcers::new(Box::new(move |_| {
        Ok(vec![Box::new(Recording(sink.clone())) as Box<dyn Announcer>])
    }))
}

/// A daemon programmed from `text` (its state file in a scratch
/// directory), attached, with one recording announcer.
fn rig(text: &str) -> Rig {
    let told = Told::default();
    let announcers = recording(&told);
    rig_with(text, told, announcers)
}

/// [`rig`] with these announcers, which record into `told`.
fn rig_with(text: &str, told: Told, announcers: Announcers) -> Rig {
    let dir = ScratchDir::new("daemon");
    let state = dir.join("state.json");
    let text = format!("{text}\nstate_file: {}\n", state.display());
    rig_in(dir, &text, told, announcers)
}

/// The daemon of `r` started again (as after `kill -9`): the same file,
/// state file and revisions, a new daemon on fresh maps.
fn restart(r: Rig) -> Rig {
    let Rig { daemon, _dir, .. } = r;
    let text = daemon.text.to_string();
    drop(daemon);
    let told = Told::default();
    let announcers = recording(&told);
    rig_in(_dir, &text, told, announcers)
}

/// [`restart`], with the runtime changes of the state file, as `lbd`
/// loads them.
fn restart_with_state(r: Rig) -> Rig {
    let Rig { daemon, _dir, .. } = r;
    let text = daemon.text.to_string();
    let overlay = Overlay::load(&daemon.config.state_file).expect("the state file");
    drop(daemon);
    let told = Told::default();
    rig_in_with(_dir, &text, overlay, told.clone(), recording(&told))
}

/// [`rig`] in `dir`, from `text` (which names its state file).
fn rig_in(dir: ScratchDir, text: &str, told: Told, announcers: Announcers) -> Rig {
    rig_in_with(dir, text, Overlay::default(), told, announcers)
}

/// [`rig_in`] with these runtime changes.
fn rig_in_with(
    dir: ScratchDir,
    text: &str,
    overlay: Overlay,
    told: Told,
    announcers: Announcers,
) -> Rig {
    let text = text.to_string();
    let config = Config::parse(&text).expect("test config parses");
    let revisions = RevisionStore::open(&config.revisions_dir(), config.history).unwrap();
    let mut reconciler = Reconciler::adopt(FakeDataplane::new(config.layout)).unwrap();
    let settings = settings::datapath_settings(&config, [2, 0, 0, 0, 0, 1]);
    reconciler.apply_settings(&settings).unwrap();
    let spawned = Spawned::default();
    let targets: Arc<Mutex<Vec<crate::health::ProbeTarget>>> = Arc::default();
    let (record, aim) = (spawned.clone(), targets.clone());
    let probes = Probes::new(Box::new(move |_, keys, _, target, _| {
        record.lock().unwrap().extend_from_slice(keys);
        aim.lock().unwrap().push(target);
        tokio::spawn(async {})
    }));
    let target = Target {
        config,
        text: text.into(),
        overlay,
    };
    let mut daemon = Daemon::new(
        dir.join("lb.yaml"),
        target,
        reconciler,
        settings,
        probes,
        announcers,
        revisions,
    );
    daemon.startup.attached = true;
    daemon.seed_verdicts();
    daemon.resume_drain();
    let effective = daemon.effective();
    daemon.program(&effective, true).expect("programs");
    daemon.start_announcers().unwrap();
    daemon.announce();
    daemon.start_revision();
    daemon.resume_probation();
    Rig {
        daemon,
        told,
        spawned,
        targets,
        _dir: dir,
    }
}

fn id(s: &str) -> VipId {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

impl Rig {
    async fn ask(&mut self, request: Request) -> Response {
        self.daemon.handle(request, ChangeOptions::default()).await
    }

    /// `request` must succeed; its data.
    async fn ok(&mut self, request: Request) -> serde_json::Value {
        let what = format!("{request:?}");
        let r = self.ask(request).await;
        assert!(r.ok, "{what} failed: {:?}", r.error);
        r.data
    }

    /// Reloads the file `text` (without force), which must apply.
    async fn reload_ok(&mut self, text: &str) -> api::Committed {
        let file = reparse(self, text);
        self.daemon.reload(file, false, &plain()).await.unwrap()
    }

    /// Reloads the file `text` (without force), which must be refused
    /// (`what`: why the test expects it); the refusal.
    async fn reload_refused(&mut self, text: &str, what: &str) -> DaemonError {
        let file = reparse(self, text);
        self.daemon
            .reload(file, false, &plain())
            .await
            .expect_err(what)
    }

    /// Sends `request`, which must be refused with `kind`; the message.
    async fn refused(&mut self, kind: ErrorKind, request: Request) -> String {
        let what = format!("{request:?}");
        let r = self.ask(request).await;
        assert!(!r.ok, "{what} should have been refused");
        assert_eq!(r.code, Some(kind), "{what}: {:?}", r.error);
        r.error.unwrap_or_default()
    }

    /// The last set the announcer was handed.
    fn announced(&self) -> BTreeSet<IpAddr> {
        self.told
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }

    /// The backends in `vip`'s table, from the dataplane's own map.
    fn in_table(&self, vip: &str) -> BTreeSet<IpAddr> {
        let info = self.daemon.table(&id(vip), false).expect("VIP programmed");
        info.backends
            .iter()
            .filter(|b| b.slots > 0)
            .map(|b| b.address)
            .collect()
    }

    fn drain(&self, vip: &str, address: &str, force: bool) -> Request {
        Request::Backend(BackendRequest::Drain {
            vip: id(vip),
            address: ip(address),
            force,
            wait: false,
        })
    }
}

/// `lbctl backend weight VIP ADDRESS WEIGHT` (not forced).
fn weight(vip: &str, address: &str, weight: u32) -> Request {
    Request::Backend(BackendRequest::Weight {
        vip: id(vip),
        address: ip(address),
        weight,
        force: false,
    })
}

fn del_backend(vip: &str, address: &str, force: bool) -> Request {
    Request::Backend(BackendRequest::Del {
        vip: id(vip),
        address: ip(address),
        force,
    })
}

fn parse<T: serde::de::DeserializeOwned>(data: serde_json::Value) -> T {
    serde_json::from_value(data).expect("answer has its documented type")
}

#[tokio::test]
async fn status_reports_the_running_configuration() {
    let mut r = rig(FILE);
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert_eq!(s.instance, "unit");
    assert_eq!(s.version, crate::VERSION);
    assert!(
        s.version.contains(env!("CARGO_PKG_VERSION")),
        "{}",
        s.version
    );
    assert_eq!(s.vips, 1);
    assert_eq!(s.backends, 2);
    assert_eq!(s.table_size, 101);
    assert_eq!(s.gateway_mac, "02:00:00:00:00:01");
    assert!(!s.api_changes);
    assert_eq!(s.last_reload, None);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
}

#[tokio::test]
async fn a_vip_added_is_programmed_announced_persisted_and_deleted() {
    let mut r = rig(FILE);
    let add = VipAdd {
        vip: id("10.99.0.2:53/udp"),
        backends: vec![
            BackendSpec {
                address: ip("10.1.0.7"),
                weight: 1,
            },
            BackendSpec {
                address: ip("10.1.0.8"),
                weight: 3,
            },
        ],
        settings: VipSettings(
            [
                ("encap", "gue"),
                ("conntrack", "false"),
                ("table_size", "1009"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ),
    };
    r.ok(Request::Vip(VipRequest::Add(add))).await;
    let list: Vec<api::VipInfo> = parse(r.ok(Request::Vip(VipRequest::List)).await);
    let added = list
        .iter()
        .find(|v| v.vip == id("10.99.0.2:53/udp"))
        .expect("listed");
    assert_eq!(added.encap, "gue");
    assert!(!added.conntrack);
    assert_eq!(added.backends.len(), 2);
    assert_eq!(
        r.in_table("10.99.0.2:53/udp"),
        BTreeSet::from([ip("10.1.0.7"), ip("10.1.0.8")])
    );
    assert!(r.announced().contains(&ip("10.99.0.2")));
    let vip = id("10.99.0.2:53/udp");
    let table = r.daemon.reconciler.live_table(&vip).unwrap().unwrap();
    assert_eq!(r.daemon.reconciler.vips()[&vip].table_size, 1009);
    assert_eq!(table.len(), 1009);
    let saved = Overlay::load(&r.daemon.config.state_file).unwrap();
    assert_eq!(
        saved.vips_added[&id("10.99.0.2:53/udp")].table_size,
        Some(1009),
        "kept across restarts"
    );

    let again = VipAdd {
        vip: id("10.99.0.2:53/udp"),
        backends: vec![],
        settings: VipSettings::default(),
    };
    let e = r
        .refused(ErrorKind::Exists, Request::Vip(VipRequest::Add(again)))
        .await;
    assert!(e.contains("10.99.0.2:53/udp"), "{e}");

    r.ok(Request::Vip(VipRequest::Del {
        vip: id("10.99.0.2:53/udp"),
    }))
    .await;
    assert!(!r.announced().contains(&ip("10.99.0.2")));
    assert!(r.daemon.table(&id("10.99.0.2:53/udp"), false).is_err());
    let saved = Overlay::load(&r.daemon.config.state_file).unwrap();
    assert!(saved.is_empty(), "{saved:?}");
}

#[tokio::test]
async fn backends_added_reweighted_and_deleted_reach_the_table() {
    let mut r = rig(FILE);
    r.ok(Request::Backend(BackendRequest::Add {
        vip: id(WEB),
        address: ip("10.1.0.3"),
        weight: 1,
    }))
    .await;
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2"), ip("10.1.0.3")])
    );
    r.ok(weight(WEB, "10.1.0.1", 0)).await;
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.2"), ip("10.1.0.3")])
    );
    r.ok(del_backend(WEB, "10.1.0.3", false)).await;
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.2")]));
    let e = r
        .refused(ErrorKind::NotFound, del_backend(WEB, "10.1.0.9", false))
        .await;
    assert!(e.contains("10.1.0.9"), "{e}");
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert!(s.api_changes);
}

#[tokio::test]
async fn the_last_usable_backend_is_not_removed_without_force() {
    let mut r = rig(FILE);
    r.ok(del_backend(WEB, "10.1.0.2", false)).await;
    let before = r.daemon.overlay.clone();
    let e = r
        .refused(ErrorKind::Blackhole, del_backend(WEB, "10.1.0.1", false))
        .await;
    assert!(
        e.contains("--force"),
        "the refusal says how to force it: {e}"
    );
    assert_eq!(r.daemon.overlay, before, "a refused change changes nothing");
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    let drain = r.drain(WEB, "10.1.0.1", false);
    r.refused(ErrorKind::Blackhole, drain).await;
    r.refused(ErrorKind::Blackhole, weight(WEB, "10.1.0.1", 0))
        .await;

    r.ok(del_backend(WEB, "10.1.0.1", true)).await;
    assert!(r.in_table(WEB).is_empty());
    assert!(r.announced().is_empty(), "no usable backend: withdrawn");
}

#[tokio::test]
async fn drained_backends_leave_the_table_and_come_back() {
    let mut r = rig(FILE);
    r.ok(r.drain(WEB, "10.1.0.1", false)).await;
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    let b = health[0]
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.1"))
        .unwrap();
    assert_eq!(b.state, api::BackendState::Draining);
    assert_eq!(b.effective_weight, 0.0);
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.2")]));
    r.ok(Request::Backend(BackendRequest::Undrain {
        vip: id(WEB),
        address: ip("10.1.0.1"),
    }))
    .await;
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
}

#[tokio::test]
async fn the_table_shares_slots_by_weight() {
    let mut r = rig(FILE);
    let t: api::TableInfo = parse(
        r.ok(Request::Table {
            vip: id(WEB),
            slots: false,
        })
        .await,
    );
    assert_eq!(t.table_size, 101);
    let slots: u32 = t.backends.iter().map(|b| b.slots).sum();
    assert_eq!(slots, 101, "every slot has an owner");
    let heavy = t
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.1"))
        .unwrap();
    // Weight 2 of 3: two thirds of 101 slots, give or take Maglev's spread.
    assert!((60..=74).contains(&heavy.slots), "{heavy:?}");
    let e = r
        .refused(
            ErrorKind::NotFound,
            Request::Table {
                vip: id("10.99.0.9:80/tcp"),
                slots: false,
            },
        )
        .await;
    assert!(e.contains("10.99.0.9"), "{e}");
}

#[tokio::test]
async fn simulate_names_the_server_a_quic_connection_id_carries() {
    let file = format!(
        "{FILE}  - address: 10.99.0.1\n    port: 443\n    protocol: udp\n    quic: {{server_id_len: 2, config_id: 1}}\n    backends:\n      - address: 10.1.0.1\n        server_id: \"0001\"\n      - address: 10.1.0.2\n        server_id: \"0002\"\n"
    );
    let mut r = rig(&file);
    let simulate = |sport, cid: Option<&str>| Request::Simulate {
        src: ip("192.0.2.7"),
        dst: ip("10.99.0.1"),
        protocol: Protocol::Udp,
        sport,
        dport: 443,
        syn: false,
        quic_cid: cid.map(String::from),
    };
    let mut hashed = BTreeSet::new();
    for sport in 1000..1032 {
        // Config 1 (0x2_), server ID 0002, a nonce.
        let s: Simulation = parse(r.ok(simulate(sport, Some("27000211223344"))).await);
        assert_eq!(s.backend, Some(ip("10.1.0.2")), "port {sport}");
        assert!(
            s.via
                .starts_with("QUIC connection ID: server ID 0002 (backend index "),
            "{}",
            s.via
        );
        // Config 0 is not the VIP's: hashed, as without an ID.
        let other: Simulation = parse(r.ok(simulate(sport, Some("07000211223344"))).await);
        let plain: Simulation = parse(r.ok(simulate(sport, None)).await);
        assert_eq!(other.backend, plain.backend);
        assert!(plain.via.starts_with("maglev"), "{}", plain.via);
        hashed.insert(plain.backend.expect("a backend"));
    }
    assert_eq!(hashed.len(), 2, "by hash, ports spread over both");
    r.refused(ErrorKind::BadRequest, simulate(1, Some("27zz")))
        .await;
}

#[tokio::test]
async fn simulate_names_a_backend_in_the_table_or_none() {
    let mut r = rig(FILE);
    let simulate = |sport, dst: &str| Request::Simulate {
        src: ip("192.0.2.7"),
        dst: ip(dst),
        protocol: Protocol::Tcp,
        sport,
        dport: 80,
        syn: true,
        quic_cid: None,
    };
    let mut seen = BTreeSet::new();
    for sport in 1000..1064 {
        let s: Simulation = parse(r.ok(simulate(sport, "10.99.0.1")).await);
        assert_eq!(s.vip, Some(id(WEB)));
        assert!(s.via.starts_with("maglev"), "{}", s.via);
        seen.insert(s.backend.expect("a backend"));
    }
    assert_eq!(seen, r.in_table(WEB), "64 flows reach both backends");
    let s: Simulation = parse(r.ok(simulate(1000, "10.99.0.5")).await);
    assert_eq!((s.vip, s.backend), (None, None));
    r.refused(
        ErrorKind::BadRequest,
        Request::Simulate {
            src: ip("2001:db8::7"),
            dst: ip("10.99.0.1"),
            protocol: Protocol::Tcp,
            sport: 1,
            dport: 80,
            syn: true,
            quic_cid: None,
        },
    )
    .await;
}

#[tokio::test]
async fn conns_lists_entries_by_vip_backend_and_client() {
    use lb_common::{FlowBucket, FlowEntry, FlowKey, flow::ct_position};
    let mut r = rig(FILE);
    let be = |r: &Rig, a: &str| r.daemon.reconciler.vips()[&id(WEB)].backends[&ip(a)].handle;
    let (be1, be2) = (be(&r, "10.1.0.1"), be(&r, "10.1.0.2"));
    let dp = r.daemon.reconciler.dataplane_mut();
    let cfg = dp.config().unwrap();
    // A flow of 192.0.2.7:40000 on be1, where the datapath records it
    // (class 1), and two entries of unknown flows on be2.
    let flow = FlowKey::new(ip("192.0.2.7"), ip("10.99.0.1"), 6, 40_000, 80);
    let (index, tag) = ct_position(flow.ct_hash(&dp.ct_key().unwrap()), cfg.ct_seed);
    let mut b = FlowBucket::default();
    b.entries[2] = FlowEntry::new(tag, be1);
    b.stamps[2] = 1 << 14;
    dp.set_flow_bucket(index & cfg.ct_mask, &b).unwrap();
    let other = (index & cfg.ct_mask) ^ 1;
    let mut b = FlowBucket::default();
    b.entries[0] = FlowEntry::new(7, be2);
    b.entries[5] = FlowEntry::new(8, be2);
    dp.set_flow_bucket(other, &b).unwrap();
    let conns =
        |vip: Option<&str>, backend: Option<&str>, client: Option<&str>, limit| Request::Conns {
            vip: vip.map(id),
            backend: backend.map(ip),
            client: client.map(str::to_string),
            limit,
        };
    let all: api::Conns = parse(r.ok(conns(None, None, None, 100)).await);
    assert_eq!((all.matched, all.rows.len()), (3, 3));
    assert!(
        all.rows
            .iter()
            .all(|c| c.client.is_none() && c.vip == id(WEB))
    );
    let on_be2: api::Conns = parse(r.ok(conns(Some(WEB), Some("10.1.0.2"), None, 1)).await);
    assert_eq!(
        (on_be2.matched, on_be2.rows.len()),
        (2, 1),
        "cut at the limit"
    );
    assert_eq!(on_be2.rows[0].backend, ip("10.1.0.2"));
    assert!(!on_be2.rows[0].confirmed);
    let mine: api::Conns = parse(r.ok(conns(None, None, Some("192.0.2.7"), 100)).await);
    assert_eq!(mine.matched, 1);
    let row = &mine.rows[0];
    assert_eq!(row.client, Some("192.0.2.7:40000".parse().unwrap()));
    assert_eq!(
        (row.backend, row.class, row.confirmed),
        (ip("10.1.0.1"), 1, true)
    );
    assert_eq!((row.bucket, row.way), (index & cfg.ct_mask, 2));
    assert!(
        mine.searched.starts_with("65536 tuples"),
        "{}",
        mine.searched
    );
    // Refused: a VIP or backend that does not exist, a prefix too wide,
    // a limit of 0.
    r.refused(
        ErrorKind::NotFound,
        conns(Some("10.99.0.9:80/tcp"), None, None, 9),
    )
    .await;
    r.refused(ErrorKind::NotFound, conns(None, Some("10.1.0.9"), None, 9))
        .await;
    let e = r
        .refused(
            ErrorKind::BadRequest,
            conns(None, None, Some("192.0.2.0/24"), 9),
        )
        .await;
    assert!(e.contains("/28 or longer"), "{e}");
    // A client of another family than every VIP: refused, not an empty
    // answer.
    let e = r
        .refused(
            ErrorKind::BadRequest,
            conns(None, None, Some("2001:db8::7"), 9),
        )
        .await;
    assert!(e.contains("no VIP"), "{e}");
    r.refused(
        ErrorKind::BadRequest,
        conns(None, None, Some("192.0.2.x"), 9),
    )
    .await;
    r.refused(ErrorKind::BadRequest, conns(None, None, None, 0))
        .await;
    // The largest limit is allowed, one more is not.
    let most = crate::conns::MAX_LIMIT;
    r.ok(conns(None, None, None, most)).await;
    let e = r
        .refused(ErrorKind::BadRequest, conns(None, None, None, most + 1))
        .await;
    assert!(e.contains("--limit must be 1 to 10000"), "{e}");
}

#[tokio::test]
async fn stats_read_the_dataplane_counters() {
    let mut r = rig(FILE);
    let counters = &mut r.daemon.reconciler.dataplane_mut().counters;
    let maglev = lb_common::counters::Counter::FwdMaglev as usize;
    counters[maglev].packets = 7;
    counters[maglev].bytes = 700;
    let s: api::Stats = parse(r.ok(Request::Stats).await);
    let c = s
        .counters
        .iter()
        .find(|c| c.name == "fwd_maglev_new_flow")
        .unwrap();
    assert_eq!((c.value.packets, c.value.bytes), (7, 700));
    assert_eq!(s.vips.len(), 1);
}

#[tokio::test]
async fn node_drain_withdraws_everything_and_undrain_brings_it_back() {
    let mut r = rig(FILE);
    let c: api::NodeChange = parse(
        r.ok(Request::Node(NodeRequest::Drain { no_wait: false }))
            .await,
    );
    assert!(c.changed);
    assert_eq!(c.node, NodeState::Drained);
    assert_eq!(c.addresses, vec![ip("10.99.0.1")]);
    assert!(r.announced().is_empty());
    // Just withdrawn: the routers get the whole grace.
    let grace = r.daemon.config.shutdown_grace.as_secs_f64();
    assert!(
        c.wait_secs > grace - 1.0 && c.wait_secs <= grace,
        "{} of {grace}",
        c.wait_secs
    );
    assert_eq!(r.in_table(WEB).len(), 2, "forwarding goes on");
    let c: api::NodeChange = parse(
        r.ok(Request::Node(NodeRequest::Drain { no_wait: false }))
            .await,
    );
    assert!(!c.changed);
    let b: api::AnnounceStatus = parse(r.ok(Request::Bgp).await);
    assert_eq!(b.node, NodeState::Drained);
    assert!(b.announced.is_empty());
    assert_eq!(b.vips.len(), 1);
    let c: api::NodeChange = parse(r.ok(Request::Node(NodeRequest::Undrain)).await);
    assert_eq!(c.addresses, vec![ip("10.99.0.1")]);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    let wait = r.daemon.begin_stop("SIGTERM").expect("a first signal");
    assert!(
        wait > r.daemon.config.shutdown_grace / 2 && wait <= r.daemon.config.shutdown_grace,
        "{wait:?}: withdrawn by the signal, the grace follows"
    );
    r.refused(ErrorKind::Unavailable, Request::Node(NodeRequest::Undrain))
        .await;
}

#[tokio::test]
async fn a_graceful_shutdown_keeps_the_routes_with_the_community_then_withdraws() {
    let told = Told::default();
    let events = Arc::new(Mutex::new(Vec::new()));
    let (sink, log) = (told.clone(), events.clone());
    let announcers = Announcers::new(Box::new(move |_| {
        Ok(vec![
            Box::new(Graceful(sink.clone(), log.clone())) as Box<dyn Announcer>
        ])
    }));
    let mut r = rig_with(FILE, told, announcers);
    let graceful = || {
        events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e.starts_with("graceful"))
            .cloned()
    };
    let web = BTreeSet::from([ip("10.99.0.1")]);
    assert_eq!(r.announced(), web);
    assert!(events.lock().unwrap().contains(&"settled true".to_string()));
    // Drain: announced still, with the community, for the 3 s wait.
    let c: api::NodeChange = parse(
        r.ok(Request::Node(NodeRequest::Drain { no_wait: true }))
            .await,
    );
    assert_eq!(c.addresses, vec![ip("10.99.0.1")]);
    assert_eq!(
        c.wait_secs,
        3.0 + r.daemon.config.shutdown_grace.as_secs_f64()
    );
    assert_eq!(r.announced(), web, "not withdrawn before the wait");
    assert_eq!(graceful().as_deref(), Some("graceful true"));
    assert!(r.daemon.graceful_deadline().is_some());
    // A probe result meanwhile changes nothing.
    r.daemon.announce();
    assert_eq!(r.announced(), web);
    // The wait is over: withdrawn.
    r.daemon.end_graceful_shutdown();
    assert!(r.announced().is_empty());
    assert!(r.daemon.graceful_deadline().is_none());
    // Undrain: back, without the community.
    r.ok(Request::Node(NodeRequest::Undrain)).await;
    assert_eq!(r.announced(), web);
    assert_eq!(graceful().as_deref(), Some("graceful false"));
    // SIGTERM: the same, and lbd waits for both.
    let wait = r.daemon.begin_stop("SIGTERM").expect("a first signal");
    assert_eq!(
        wait,
        std::time::Duration::from_secs(3) + r.daemon.config.shutdown_grace
    );
    assert_eq!(r.announced(), web);
    r.daemon.end_graceful_shutdown();
    assert!(r.announced().is_empty());
}

#[tokio::test]
async fn a_reload_request_on_the_loop_is_refused() {
    let mut r = rig(FILE);
    r.refused(ErrorKind::BadRequest, Request::Reload { force: false })
        .await;
}

/// `text` as the configuration file would read (with the rig's state
/// file).
fn reparse(r: &Rig, text: &str) -> std::result::Result<FileRead, ConfigErrors> {
    let state = r.daemon.config.state_file.display().to_string();
    let text = format!("{text}\nstate_file: {state}\n");
    let config = Config::parse(&text)?;
    Ok(FileRead {
        digest: crate::digest::text(&text),
        text: text.into(),
        config,
        desired: None,
    })
}

fn plain() -> ChangeOptions {
    ChangeOptions::default()
}

#[tokio::test]
async fn a_reload_applies_a_good_file_and_keeps_the_running_one_otherwise() {
    let mut r = rig(FILE);
    let grown = FILE.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
    );
    let parsed = reparse(&r, &grown);
    let done = r
        .daemon
        .reload(parsed, false, &plain())
        .await
        .expect("applies");
    assert!(r.daemon.regateway.is_none());
    assert!(done.revision.is_some());
    assert_eq!(r.in_table(WEB).len(), 3);
    assert!(
        r.daemon
            .last_reload
            .as_deref()
            .unwrap()
            .starts_with("ok at")
    );

    let bad = reparse(&r, &FILE.replace("weight: 2", "weight: -2"));
    let e = r.daemon.reload(bad, false, &plain()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("weight"), "names the field: {e}");
    assert_eq!(r.in_table(WEB).len(), 3, "the running configuration stays");
    assert!(
        r.daemon
            .last_reload
            .as_deref()
            .unwrap()
            .starts_with("failed at")
    );

    let renamed = reparse(&r, &FILE.replace("instance: unit", "instance: other"));
    let e = r.daemon.reload(renamed, false, &plain()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FixedSetting, "{e}");
    assert!(e.to_string().starts_with("instance "), "names it: {e}");
    // Each fixed size is named on its own.
    for (from, to, name) in [
        ("table_size: 101", "table_size: 103", "table_size changed"),
        (
            "conntrack_buckets: 1024",
            "conntrack_buckets: 2048",
            "conntrack_buckets changed",
        ),
    ] {
        let changed = reparse(&r, &FILE.replace(from, to));
        let e = r.daemon.reload(changed, true, &plain()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FixedSetting, "{e}");
        assert!(e.to_string().starts_with(name), "names it: {e}");
    }
    // The revision store and the tier's link are set up at start too. A
    // file moved to a tier by a reload has no VIPs of its own yet: it
    // would withdraw every VIP, and etcd would never be asked.
    let kept = "conntrack_buckets: 1024\nhistory: 7";
    let history = reparse(&r, &FILE.replace("conntrack_buckets: 1024", kept));
    let e = r.daemon.reload(history, true, &plain()).await.unwrap_err();
    assert!(e.to_string().starts_with("history changed"), "{e}");
    let (head, _) = FILE.split_once("vips:").unwrap();
    let tier = format!(
        "{head}source:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n    prefix: /lb/t1\n"
    );
    let e = r
        .daemon
        .reload(reparse(&r, &tier), true, &plain())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FixedSetting, "{e}");
    assert!(e.to_string().starts_with("source changed"), "{e}");
    assert_eq!(r.in_table(WEB).len(), 3, "the running configuration stays");
}

#[tokio::test]
async fn a_reload_that_empties_an_announced_vip_needs_force() {
    let mut r = rig(FILE);
    let empty = FILE.replace("weight: 2", "weight: 0").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
    );
    let e = r.reload_refused(&empty, "refused").await;
    assert_eq!(e.kind(), ErrorKind::Blackhole, "{e}");
    assert!(e.to_string().contains("lbctl reload --force"), "{e}");
    assert_eq!(r.in_table(WEB).len(), 2);
    let done = r
        .daemon
        .reload(reparse(&r, &empty), true, &plain())
        .await
        .unwrap();
    assert!(
        done.warnings
            .iter()
            .any(|w| w.contains("no usable backend")),
        "{:?}",
        done.warnings
    );
    assert!(r.in_table(WEB).is_empty());
    assert!(r.announced().is_empty());
}

const PROBED: &str = r#"
    health_check:
      interval: 1s
      timeout: 500ms
      rise: 1
      fall: 2
"#;

/// `text` with [`PROBED`]'s health check on every TCP VIP.
fn checked(text: &str) -> String {
    text.replace("    protocol: tcp\n", &format!("    protocol: tcp{PROBED}"))
}

/// A probe's result, taking `latency_us`.
fn probed_as(ok: bool, latency_us: u64) -> ProbeResult {
    ProbeResult {
        ok,
        latency_us,
        detail: "x".into(),
    }
}

/// Both of WEB's backends probed up (their first verdicts).
fn both_up(r: &mut Rig, latency_us: u64) {
    for b in ["10.1.0.1", "10.1.0.2"] {
        r.daemon
            .on_probe((id(WEB), ip(b)), probed_as(true, latency_us));
    }
}

#[tokio::test]
async fn probed_backends_are_announced_after_their_first_verdict_and_leave_when_down() {
    let text = checked(FILE);
    let mut r = rig(&text);
    let probed: BTreeSet<BackendKey> = r.spawned.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        probed,
        BTreeSet::from([(id(WEB), ip("10.1.0.1")), (id(WEB), ip("10.1.0.2"))])
    );
    assert!(r.announced().is_empty(), "no verdict yet: not announced");
    let result = |ok| ProbeResult {
        ok,
        latency_us: 100,
        detail: if ok { "connected" } else { "refused" }.into(),
    };
    for b in ["10.1.0.1", "10.1.0.2"] {
        r.daemon.on_probe((id(WEB), ip(b)), result(true));
    }
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    }
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    let down = health[0]
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.2"))
        .unwrap();
    assert_eq!(down.health, "down");
    assert_eq!(down.last_probe.as_ref().unwrap().detail, "refused");
    // A result from a prober that was stopped since is ignored, not even
    // timed.
    r.daemon.on_probe((id(WEB), ip("10.1.0.9")), result(true));
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    let served = r.daemon.metrics().encode().unwrap();
    assert!(!served.contains("10.1.0.9"), "{served}");
    // A change that leaves the checks as they are starts no prober.
    r.ok(weight(WEB, "10.1.0.1", 3)).await;
    assert_eq!(r.spawned.lock().unwrap().len(), 2, "the same two probers");
    // Without its check, a backend is not probed: a result its stopped
    // prober sent before it stopped changes nothing.
    for b in ["10.1.0.1", "10.1.0.2"] {
        r.daemon.on_probe((id(WEB), ip(b)), result(true));
    }
    r.reload_ok(FILE).await;
    assert_eq!(r.daemon.probes.count(), 0);
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.1")), result(false));
    }
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
}

/// A probe through the tunnel carries the mark the datapath turns into
/// that backend's tunnel: its index, and GRE for a GRE VIP.
#[tokio::test]
async fn tunnelled_probes_carry_their_backends_mark() {
    let tunnelled = "    health_check: { port: 80, through_tunnel: true }\n";
    for (encap, gre) in [("", false), ("    encap: gre\n", true)] {
        let text = FILE.replace(
            "    protocol: tcp\n",
            &format!("    protocol: tcp\n{encap}{tunnelled}"),
        );
        let r = rig(&text);
        let handles = &r.daemon.reconciler.vips()[&id(WEB)].backends;
        let mut want: Vec<u32> = ["10.1.0.1", "10.1.0.2"]
            .iter()
            .map(|b| {
                let index = handles[&ip(b)].handle & lb_common::consts::BACKEND_INDEX_MASK;
                lb_common::consts::probe_mark(index, gre)
            })
            .collect();
        let mut got: Vec<u32> = r
            .targets
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.mark.expect("a mark"))
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "GRE: {gre}");
        assert!(
            r.targets
                .lock()
                .unwrap()
                .iter()
                .all(|t| t.addr == "10.99.0.1:80".parse().unwrap()),
            "probes go to the VIP"
        );
    }
}

/// A health check added to a serving VIP keeps it announced: its
/// backends served unprobed and keep their standing until the check's
/// probes overturn it (`fall` failures), so the guard has nothing to
/// refuse and no route flaps while the first probes run.
#[tokio::test]
async fn a_check_added_to_a_serving_vip_keeps_it_announced() {
    let mut r = rig(FILE);
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    let done = r.reload_ok(&checked(FILE)).await;
    assert!(
        done.warnings.iter().all(|w| !w.contains("usable")),
        "{:?}",
        done.warnings
    );
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    assert_eq!(r.in_table(WEB).len(), 2);
    // A dead one goes at its check's `fall`, not before its first probe.
    for _ in 0..5 {
        r.daemon
            .on_probe((id(WEB), ip("10.1.0.2")), probed_as(false, 0));
    }
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
}

/// A file that would take every serving VIP away with nothing left to
/// serve (a truncated file, `vips: []`) is refused unless forced; one that
/// removes some of them says which; `lbctl vip del` needs no force.
#[tokio::test]
async fn removing_every_serving_vip_needs_force_and_a_removal_is_said() {
    let two = FILE.replace(
        "vips:\n",
        "vips:\n  - address: 10.99.0.2\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.2.0.1\n",
    );
    let mut r = rig(&two);
    assert_eq!(
        r.announced(),
        BTreeSet::from([ip("10.99.0.1"), ip("10.99.0.2")])
    );
    let empty = two.split("vips:\n").next().unwrap().to_string() + "vips: []\n";
    let e = r.reload_refused(&empty, "every serving VIP removed").await;
    assert!(
        e.to_string().contains(
            "it removes every VIP this balancer serves (10.99.0.1:80/tcp, 10.99.0.2:80/tcp) and none would serve after it"
        ),
        "{e}"
    );
    assert_eq!(r.announced().len(), 2, "nothing changed");

    // One of two removed: applied, and said.
    let one = FILE.to_string();
    let done = r.reload_ok(&one).await;
    assert!(
        done.warnings.iter().any(|w| w
            == "VIP 10.99.0.2:80/tcp is removed: it serves now; it is withdrawn and its connections end"),
        "{:?}",
        done.warnings
    );
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));

    // The last one, on purpose.
    r.ok(Request::Vip(api::VipRequest::Del { vip: id(WEB) }))
        .await;
    assert!(r.announced().is_empty());
}

/// The blackhole guard does not count a backend that awaits its first
/// probe, as the announce policy does not: replacing an announced VIP's
/// probed backends with new ones at once would withdraw it until they
/// pass (for good if they never do), so it is refused unless forced; the
/// new ones added first, the old ones go without a word.
#[tokio::test]
async fn the_blackhole_guard_does_not_count_backends_awaiting_their_first_probe() {
    let text = checked(FILE);
    let mut r = rig(&text);
    let up = ProbeResult {
        ok: true,
        latency_us: 100,
        detail: "connected".into(),
    };
    for b in ["10.1.0.1", "10.1.0.2"] {
        r.daemon.on_probe((id(WEB), ip(b)), up.clone());
    }
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
    let replaced = text
        .replace("      - address: 10.1.0.1\n        weight: 2\n", "")
        .replace("      - address: 10.1.0.2\n", "      - address: 10.1.0.5\n");
    assert!(replaced.contains("10.1.0.5") && !replaced.contains("10.1.0.1"));
    let e = r
        .reload_refused(
            &replaced,
            "only a backend awaiting its first probe would be left",
        )
        .await;
    assert!(
        e.to_string().contains(
            "VIP 10.99.0.1:80/tcp is announced and would keep only 1 backend(s) awaiting their first probe"
        ),
        "{e}"
    );
    assert_eq!(
        r.announced(),
        BTreeSet::from([ip("10.99.0.1")]),
        "nothing changed"
    );
    // The safe order: add the new backend, wait for its probe, then drop
    // the old ones.
    let both = text.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.5\n",
    );
    let added = r.reload_ok(&both).await;
    assert!(
        added.warnings.iter().all(|w| !w.contains("awaiting")),
        "{:?}",
        added.warnings
    );
    r.daemon.on_probe((id(WEB), ip("10.1.0.5")), up);
    let done = r.reload_ok(&replaced).await;
    assert!(
        done.warnings.iter().all(|w| !w.contains("usable")),
        "{:?}",
        done.warnings
    );
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.5")]));
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));
}

/// A change of the announce section restarts the announcers with it; if
/// the new ones cannot start, the change is refused and the old ones run
/// again.
#[tokio::test]
async fn a_changed_announce_section_restarts_the_announcers_or_keeps_the_old() {
    let told = Told::default();
    let started: Arc<Mutex<Vec<Option<Vec<String>>>>> = Arc::default();
    let (sink, log) = (told.clone(), started.clone());
    let announcers = Announcers::new(Box::new(move |cfg| {
        let command = cfg.exec.as_ref().map(|e| e.command.clone());
        log.lock().unwrap().push(command.clone());
        if command.as_deref() == Some(&["/bin/refused".to_string()][..]) {
            return Err(AnnounceError::ShutDown);
        }
        Ok(vec![Box::new(Recording(sink.clone())) as Box<dyn Announcer>])
    }));
    let mut r = rig_with(FILE, told, announcers);
    let with = |cmd: &str| format!("{FILE}announce:\n  exec:\n    command: [{cmd}]\n");
    r.daemon
        .reload(reparse(&r, &with("/bin/true")), false, &plain())
        .await
        .expect("the new announcers start");
    let seen = started.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "started at start, then again: {seen:?}");
    assert_eq!(seen[1], Some(vec!["/bin/true".to_string()]));
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));

    let e = r
        .reload_refused(&with("/bin/refused"), "the new announcers cannot start")
        .await;
    assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
    let seen = started.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "tried the new, then the old again: {seen:?}");
    assert_eq!(seen[3], Some(vec!["/bin/true".to_string()]));
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));

    // Refused that late, a change that also moves backends and makes a
    // runtime change the file's own puts back all of it: the tables, the
    // runtime changes and the state file.
    r.ok(weight(WEB, "10.1.0.2", 0)).await;
    let (overlay, state) = (r.daemon.overlay.clone(), r.daemon.config.state_file.clone());
    let saved = std::fs::read(&state).unwrap();
    let moved = with("/bin/refused").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n      - address: 10.1.0.3\n",
    );
    r.daemon
        .reload(reparse(&r, &moved), false, &plain())
        .await
        .expect_err("the new announcers cannot start");
    assert_eq!(r.daemon.overlay, overlay, "the runtime change is kept");
    assert_eq!(std::fs::read(&state).unwrap(), saved, "and saved");
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    assert_eq!(r.announced(), BTreeSet::from([ip("10.99.0.1")]));

    // A key file that would stop the new announcers from starting is
    // refused before anything is written or stopped.
    let keyed = format!(
        "{FILE}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    peers:\n      - {{ address: 10.0.0.1, remote_as: 65000, password_file: /nonexistent/peer.key }}\n"
    );
    let tried = started.lock().unwrap().len();
    let e = r.reload_refused(&keyed, "the key file is missing").await;
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("password_file"), "names it: {e}");
    assert_eq!(started.lock().unwrap().len(), tried, "nothing restarted");
}

/// The blackhole guard protects what the routers send here: with the
/// node drained (nothing announced) a VIP may be emptied without force.
#[tokio::test]
async fn a_vip_the_routers_do_not_send_here_may_be_emptied_without_force() {
    let mut r = rig(FILE);
    r.ok(Request::Node(NodeRequest::Drain { no_wait: true }))
        .await;
    assert!(r.announced().is_empty());
    let empty = FILE.replace("weight: 2", "weight: 0").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
    );
    r.daemon
        .reload(reparse(&r, &empty), false, &plain())
        .await
        .expect("nothing is announced: no blackhole");
    assert!(r.in_table(WEB).is_empty());
}

/// Adding, changing and removing the tier's hash key each need --force
/// and say which it is.
#[tokio::test]
async fn a_hash_key_added_or_removed_needs_force_and_says_which() {
    use std::os::unix::fs::PermissionsExt as _;
    let mut r = rig(FILE);
    let key = r._dir.join("hash.key");
    std::fs::write(&key, "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let keyed = format!("{FILE}hash_key_file: {}\n", key.display());
    let e = r.reload_refused(&keyed, "refused").await;
    assert_eq!(e.kind(), ErrorKind::NeedsForce, "{e}");
    assert!(
        e.to_string().contains("hash key (hash_key_file) added"),
        "{e}"
    );
    r.daemon
        .reload(reparse(&r, &keyed), true, &plain())
        .await
        .unwrap();
    // Rotated in place: the file's text is the same, the key is not; the
    // force applies it (it was answered "nothing changed").
    std::fs::write(&key, "ffeeddccbbaa99887766554433221100\n").unwrap();
    let e = r.reload_refused(&keyed, "refused").await;
    assert_eq!(e.kind(), ErrorKind::NeedsForce, "{e}");
    let done = r
        .daemon
        .reload(reparse(&r, &keyed), true, &plain())
        .await
        .unwrap();
    assert_ne!(done.note.as_deref(), Some("nothing changed"));
    let rotated = crate::config::hash::load_key(&key).unwrap();
    assert_eq!(r.daemon.reconciler.dataplane().hash_key().unwrap(), rotated);
    let e = r.reload_refused(FILE, "refused").await;
    assert_eq!(e.kind(), ErrorKind::NeedsForce, "{e}");
    assert!(e.to_string().contains("the hash key removed"), "{e}");
}

/// A backend found down stays out of the table across a restart until
/// its probes say up (`rise`); one found up starts up, as before.
#[tokio::test]
async fn a_backend_down_before_a_restart_starts_down_until_its_probes_say_up() {
    let text = FILE.replace(
        "    protocol: tcp\n",
        &format!("    protocol: tcp{}", PROBED.replace("rise: 1", "rise: 2")),
    );
    let mut r = rig(&text);
    let result = |ok| ProbeResult {
        ok,
        latency_us: 100,
        detail: "x".into(),
    };
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    }
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
    let mut r = restart(r);
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1")]),
        "down before the restart: out of the table from the start"
    );
    r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(true));
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]), "rise 2");
    r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(true));
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
    // Up when it stopped: up from the start after the next restart.
    let r = restart(r);
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.2")])
    );
}

/// Two VIPs on one backend address with the same check (probing port 80
/// for both; another rise): one prober, whose results reach both entries
/// at once. (Without `port:`, each would probe its VIP's port: two.)
#[tokio::test]
async fn vips_on_one_backend_share_its_prober() {
    let mut text = checked(FILE);
    text.push_str(&format!(
        "  - address: 10.99.0.1\n    port: 8080\n    protocol: tcp{}    backends:\n      - address: 10.1.0.1\n",
        PROBED
            .replace("health_check:\n", "health_check:\n      port: 80\n")
            .replace("rise: 1", "rise: 2")
            .replace("fall: 2", "fall: 3")
    ));
    let mut r = rig(&text);
    assert_eq!(r.daemon.probes.count(), 2, "10.1.0.1 once, 10.1.0.2 once");
    let shared = r
        .spawned
        .lock()
        .unwrap()
        .iter()
        .filter(|k| k.1 == ip("10.1.0.1"))
        .count();
    assert_eq!(shared, 2, "one prober serving both entries of 10.1.0.1");
    let result = |ok| ProbeResult {
        ok,
        latency_us: 100,
        detail: "x".into(),
    };
    let id_of = |r: &Rig, b: &str| {
        (1..=2)
            .find(|id| r.daemon.probes.keys_of(*id).iter().any(|k| k.1 == ip(b)))
            .expect("a prober")
    };
    let one = id_of(&r, "10.1.0.1");
    let two = id_of(&r, "10.1.0.2");
    r.daemon
        .on_probe_results(vec![(one, result(true)), (two, result(true))]);
    // Each entry judges the shared results by its own fall (2 and 3).
    let states = |health: &[api::VipHealth]| -> Vec<String> {
        health
            .iter()
            .map(|vip| {
                let b = vip.backends.iter().find(|b| b.address == ip("10.1.0.1"));
                format!("{} {}", vip.vip, b.expect("10.1.0.1").health)
            })
            .collect()
    };
    for _ in 0..2 {
        r.daemon.on_probe_results(vec![(one, result(false))]);
    }
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    assert_eq!(
        states(&health),
        ["10.99.0.1:80/tcp down", "10.99.0.1:8080/tcp up"]
    );
    r.daemon.on_probe_results(vec![(one, result(false))]);
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    assert_eq!(
        states(&health),
        ["10.99.0.1:80/tcp down", "10.99.0.1:8080/tcp down"]
    );
}

#[tokio::test]
async fn a_new_gateway_mac_is_written_to_the_dataplane() {
    let mut r = rig(FILE);
    r.daemon.on_gateway(GatewayState {
        gateway: Some(ip("10.0.0.1")),
        mac: Some(Mac([2, 0, 0, 0, 0, 9])),
        looking_up: false,
        error: None,
    });
    let written = r.daemon.reconciler.dataplane_mut().config().unwrap();
    assert_eq!(written.gw_mac, [2, 0, 0, 0, 0, 9]);
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert_eq!(s.gateway.unwrap().address, Some(ip("10.0.0.1")));
}

mod announce;
mod change;
mod refused;
mod rollout;
mod second_chance;
mod shown;
mod tier;
mod trace;

/// Two VIPs on one address: the one left with no usable backend is still
/// announced (its neighbour qualifies the address), and the metrics say
/// both: announced, and that it does not qualify on its own.
#[tokio::test]
async fn a_vip_announced_for_its_neighbour_is_shown_not_to_qualify() {
    const TLS: &str = "10.99.0.1:443/tcp";
    let text = format!(
        "{FILE}  - address: 10.99.0.1\n    port: 443\n    protocol: tcp\n    backends:\n      - address: 10.1.0.3\n"
    );
    let mut r = rig(&text);
    r.ok(r.drain(TLS, "10.1.0.3", true)).await;
    r.daemon.tick();
    let text = r.daemon.metrics.encode().unwrap();
    for line in [
        r#"lb_vip_announced{vip="10.99.0.1:443/tcp"} 1"#,
        r#"lb_vip_qualifies{vip="10.99.0.1:443/tcp"} 0"#,
        r#"lb_vip_announced{vip="10.99.0.1:80/tcp"} 1"#,
        r#"lb_vip_qualifies{vip="10.99.0.1:80/tcp"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
}

#[tokio::test]
async fn metrics_report_counters_states_and_digests_after_a_tick() {
    let mut r = rig(FILE);
    let maglev = lb_common::counters::Counter::FwdMaglev as usize;
    r.daemon.reconciler.dataplane_mut().counters[maglev].packets = 5;
    r.daemon.reconciler.dataplane_mut().counters[maglev].bytes = 640;
    let vip_id = r.daemon.reconciler.vips()[&id(WEB)].meta.id() as usize;
    r.daemon.reconciler.dataplane_mut().vip_stats[vip_id].packets = 9;
    r.ok(r.drain(WEB, "10.1.0.2", false)).await;
    r.daemon.tick();
    let text = r.daemon.metrics.encode().unwrap();
    if std::env::var("LB_PRINT_METRICS").is_ok() {
        eprintln!("{text}");
    }
    let has = |line: &str| {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{text}"
        )
    };
    has(r#"lb_datapath_packets_total{counter="fwd_maglev_new_flow",kind="forward"} 5"#);
    has(r#"lb_datapath_bytes_total{counter="fwd_maglev_new_flow",kind="forward"} 640"#);
    has(r#"lb_backend_state{vip="10.99.0.1:80/tcp",backend="10.1.0.2",state="draining"} 1"#);
    has(r#"lb_backend_state{vip="10.99.0.1:80/tcp",backend="10.1.0.1",state="active"} 1"#);
    has(r#"lb_vip_announced{vip="10.99.0.1:80/tcp"} 1"#);
    has(r#"lb_vip_packets_total{vip="10.99.0.1:80/tcp"} 9"#);
    has(r#"lb_address_announced{address="10.99.0.1"} 1"#);
    let digest = r.daemon.table(&id(WEB), false).unwrap().digest;
    has(&format!(
        r#"lb_vip_table_info{{vip="10.99.0.1:80/tcp",digest="{digest}"}} 1"#
    ));
    let config = r.daemon.running().digest();
    assert!(text.contains(&format!(
        r#"lb_config_info{{digest="{config}",revision="2"}} 1"#
    )));
    assert!(text.contains("lb_table_builds_total "));
    assert!(text.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    if std::env::var("LB_PRINT_METRICS").is_ok() {
        eprintln!("{text}");
    }
}

/// Adds `syns` SYNs (of which `retransmits` retransmitted) to the fake
/// dataplane's counters of backend `addr` of WEB.
fn syns(r: &mut Rig, addr: &str, syns: u64, retransmits: u64) {
    let handle = r.daemon.reconciler.vips()[&id(WEB)].backends[&ip(addr)].handle;
    let index = (handle & lb_common::consts::BACKEND_INDEX_MASK) as usize;
    let c = &mut r.daemon.reconciler.dataplane_mut().backend_syns[index];
    c.syns += syns;
    c.retransmits += retransmits;
}

#[tokio::test]
async fn passive_health_ejects_a_backend_whose_clients_retry_their_syns_and_keeps_its_flows() {
    let text = FILE.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
    );
    let mut r = rig(&text);
    let mut ejected_at = None;
    for t in 0..4 {
        syns(&mut r, "10.1.0.1", 10, 0);
        syns(&mut r, "10.1.0.2", 10, 9);
        syns(&mut r, "10.1.0.3", 10, 1);
        r.daemon.tick();
        let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
        let b = health[0]
            .backends
            .iter()
            .find(|b| b.address == ip("10.1.0.2"));
        let ejections = b.and_then(|b| b.passive.as_ref()).map(|p| p.ejections);
        if ejected_at.is_none() && ejections == Some(1) {
            ejected_at = Some(t);
            assert!(
                !r.in_table(WEB).contains(&ip("10.1.0.2")),
                "out of the table at the tick that ejects it"
            );
        }
    }
    assert!(ejected_at.is_some(), "ejected within 4 ticks");
    assert_eq!(
        r.in_table(WEB),
        BTreeSet::from([ip("10.1.0.1"), ip("10.1.0.3")]),
        "10.1.0.2 out of the table"
    );
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    let b = health[0]
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.2"))
        .unwrap();
    assert_eq!(b.state, api::BackendState::Ejected);
    let p = b.passive.as_ref().unwrap();
    assert!(p.ejected_secs > 25.0 && p.ejections == 1, "{p:?}");
    let list: Vec<api::VipInfo> = parse(r.ok(Request::Vip(VipRequest::List)).await);
    let ejected = list[0]
        .backends
        .iter()
        .find(|b| b.address == ip("10.1.0.2"))
        .unwrap();
    assert!(ejected.usable, "its existing connections continue");
}

#[tokio::test]
async fn passive_health_ejects_nobody_when_everyone_retries_alike() {
    let mut r = rig(FILE);
    for _ in 0..6 {
        syns(&mut r, "10.1.0.1", 20, 10);
        syns(&mut r, "10.1.0.2", 10, 5);
        r.daemon.tick();
    }
    assert_eq!(r.in_table(WEB).len(), 2);
}

/// A change of a serving VIP's hash fields moves its new flows: `lbctl
/// diff` says how many (about 4 in 9 for weights 2:1, by the odds that a
/// flow's two placements agree), and a reload needs --force.
#[tokio::test]
async fn a_change_of_hash_fields_is_previewed_and_needs_force() {
    let mut r = rig(FILE);
    let text = FILE.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    hash: [src_ip]\n",
    );
    let e = r.reload_refused(&text, "refused").await;
    assert_eq!(e.kind(), ErrorKind::NeedsForce, "{e}");
    assert!(
        e.to_string().contains("[src_ip]"),
        "names the new fields: {e}"
    );
    let dry = ChangeOptions {
        dry_run: true,
        ..ChangeOptions::default()
    };
    let preview = r
        .daemon
        .reload(reparse(&r, &text), true, &dry)
        .await
        .expect("a preview")
        .preview
        .expect("preview");
    let web = preview
        .vips_changed
        .iter()
        .find(|v| v.vip == id(WEB))
        .expect("the VIP changes");
    assert!(
        (0.35..0.55).contains(&web.share_moved),
        "share moved {}",
        web.share_moved
    );
    assert!(
        web.settings.iter().any(|s| s.name == "hash"),
        "{:?}",
        web.settings
    );
    r.daemon
        .reload(reparse(&r, &text), true, &plain())
        .await
        .expect("forced");
    let meta = r.daemon.reconciler.vips()[&id(WEB)].meta;
    assert_eq!(
        meta.flags & lb_common::consts::VIP_F_HASH_FIELDS,
        crate::config::hash::HashFields::parse(["src_ip"])
            .unwrap()
            .flags()
    );
}

/// An announcer with one established peer that holds whatever it is told.
struct Carrying;

impl Announcer for Carrying {
    fn set_announced(&mut self, _: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        vec![PeerStatus::new(
            "10.0.0.1",
            crate::announce::SessionState::Established,
        )]
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_vip_a_peer_holds_is_announced_with_the_policys_reason() {
    let text = format!(
        "{FILE}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    peers:\n      - {{ address: 10.0.0.1, remote_as: 65000 }}\n"
    );
    let announcers = Announcers::new(Box::new(|_| {
        Ok(vec![Box::new(Carrying) as Box<dyn Announcer>])
    }));
    let r = rig_with(&text, Told::default(), announcers);
    let s = r.daemon.announce_status();
    let v = &s.vips[0];
    assert!(v.wanted && v.announced, "{v:?}");
    assert!(
        !v.reason.is_empty() && !v.reason.starts_with("withheld"),
        "{}",
        v.reason
    );
    assert_eq!(s.announced, vec![ip("10.99.0.1")]);
    assert_eq!(
        r.daemon.announce_summary(),
        "bgp: 1 of 1 up, 1 address(es) announced"
    );
}

/// The first tick and every 15th after it scan the connection table:
/// the ways in use, of all.
#[tokio::test]
async fn the_table_scan_counts_the_ways_in_use() {
    use lb_common::{FlowBucket, FlowEntry, consts::CT_WAYS};
    let mut r = rig(FILE);
    let all = 1_024 * CT_WAYS as u64;
    let mut b = FlowBucket::default();
    b.entries[0] = FlowEntry::new(7, 1);
    b.entries[3] = FlowEntry::new(8, 1);
    let dp = r.daemon.reconciler.dataplane_mut();
    dp.set_flow_bucket(5, &b).unwrap();
    dp.set_flow_bucket(1_000, &b).unwrap();
    assert_eq!(r.daemon.scan_table_if_due(), Some((4, all)));
    r.daemon
        .reconciler
        .dataplane_mut()
        .set_flow_bucket(6, &b)
        .unwrap();
    let scans: Vec<_> = (0..15).map(|_| r.daemon.scan_table_if_due()).collect();
    assert!(
        scans[..14].iter().all(|s| *s == Some((4, all))),
        "{scans:?}"
    );
    assert_eq!(scans[14], Some((6, all)), "scanned again");
}

/// Gives the daemon a kernel clock of 250 Hz (a live window of 40 stamp
/// ticks) standing at stamp tick `tick`, which the test moves with
/// [`set_tick`].
fn clock_at(r: &mut Rig, tick: u64) -> Arc<std::sync::atomic::AtomicU64> {
    use lb_common::consts::CT_STAMP_TICK_SHIFT;
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(
        tick << CT_STAMP_TICK_SHIFT,
    ));
    r.daemon.jiffies = crate::liveflows::Jiffies::Set(clock.clone());
    let t0 = std::time::Instant::now();
    r.daemon.live_clock.observe(t0, 0);
    r.daemon
        .live_clock
        .observe(t0 + std::time::Duration::from_secs(4), 1_000);
    assert_eq!(r.daemon.live_clock.window_ticks(), 40);
    clock
}

fn set_tick(clock: &std::sync::atomic::AtomicU64, tick: u64) {
    use lb_common::consts::CT_STAMP_TICK_SHIFT;
    clock.store(
        tick << CT_STAMP_TICK_SHIFT,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Puts one connection-table entry per stamp, pointing at `addr`'s
/// backend of WEB, in buckets from `first_bucket` on.
fn stamped_flows(r: &mut Rig, addr: &str, first_bucket: u32, stamps: &[u16]) {
    use lb_common::{FlowBucket, FlowEntry};
    let handle = r.daemon.reconciler.vips()[&id(WEB)].backends[&ip(addr)].handle;
    let dp = r.daemon.reconciler.dataplane_mut();
    for (i, stamp) in (0..).zip(stamps) {
        let mut bucket = FlowBucket::default();
        bucket.entries[0] = FlowEntry::new(0x1000 + first_bucket + i, handle);
        bucket.stamps[0] = *stamp;
        dp.set_flow_bucket(first_bucket + i, &bucket).unwrap();
    }
}

/// WEB's backends as `lbctl health` shows them: state and live flows.
async fn live_flows(r: &mut Rig) -> Vec<(IpAddr, api::BackendState, Option<u64>)> {
    let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
    health[0]
        .backends
        .iter()
        .map(|b| (b.address, b.state, b.live_flows))
        .collect()
}

/// Live flows are the entries whose stamp is younger than the window at
/// the kernel's clock; a draining backend is scanned every second tick
/// (others every fifteenth) and is drained once none of its flows is
/// live.
#[tokio::test]
async fn a_drain_ends_when_the_backends_flows_go_idle() {
    use api::BackendState::{Active, Drained, Draining};
    let mut r = rig(FILE);
    let clock = clock_at(&mut r, 1_000);
    stamped_flows(&mut r, "10.1.0.1", 0, &[1_000, 990, 900]);
    stamped_flows(&mut r, "10.1.0.2", 10, &[995]);
    let (one, two) = (ip("10.1.0.1"), ip("10.1.0.2"));
    r.ok(r.drain(WEB, "10.1.0.1", false)).await;
    assert_eq!(
        live_flows(&mut r).await,
        [(one, Draining, None), (two, Active, None)],
        "not scanned yet"
    );
    r.daemon.tick();
    assert_eq!(
        live_flows(&mut r).await,
        [(one, Draining, Some(2)), (two, Active, Some(1))]
    );
    // At tick 1,031 the entry of 990 is 41 ticks old: idle.
    set_tick(&clock, 1_031);
    r.daemon.tick();
    assert_eq!(live_flows(&mut r).await[0], (one, Draining, Some(2)));
    r.daemon.tick();
    assert_eq!(live_flows(&mut r).await[0], (one, Draining, Some(1)));
    set_tick(&clock, 1_041);
    r.daemon.tick();
    r.daemon.tick();
    assert_eq!(
        live_flows(&mut r).await,
        [(one, Drained, Some(0)), (two, Active, Some(0))]
    );
}

/// A QUIC VIP's backend is drained only once it was sent no packet for
/// a live-flow window as well: packets routed by connection ID (a client
/// that moved) are not in the connection table, which alone would call
/// it drained at once.
#[tokio::test]
async fn a_quic_drain_waits_for_packets_routed_by_connection_id() {
    use api::BackendState::{Drained, Draining};
    const QUIC: &str = "10.99.0.1:443/udp";
    let file = format!(
        "{FILE}  - address: 10.99.0.1\n    port: 443\n    protocol: udp\n    quic: {{server_id_len: 2, config_id: 1}}\n    backends:\n      - address: 10.1.0.1\n        server_id: \"0001\"\n      - address: 10.1.0.2\n        server_id: \"0002\"\n"
    );
    let mut r = rig(&file);
    let clock = clock_at(&mut r, 1_000);
    let handle = r.daemon.reconciler.vips()[&id(QUIC)].backends[&ip("10.1.0.1")].handle;
    let index = (handle & lb_common::consts::BACKEND_INDEX_MASK) as usize;
    let sent = |r: &mut Rig, packets: u64| {
        r.daemon.reconciler.dataplane_mut().backend_stats[index].packets = packets;
    };
    async fn state(r: &mut Rig) -> (api::BackendState, Option<u64>) {
        let health: Vec<api::VipHealth> = parse(r.ok(Request::Health).await);
        let quic = health.iter().find(|v| v.vip == id(QUIC)).unwrap();
        let b = &quic.backends[0];
        assert_eq!(b.address, ip("10.1.0.1"));
        (b.state, b.live_flows)
    }
    sent(&mut r, 100);
    r.ok(r.drain(QUIC, "10.1.0.1", false)).await;
    for (tick, packets, want) in [
        // First seen draining: when it was last sent a packet is unknown.
        (1_000, 100, Draining),
        // No flow in the table, but packets by connection ID.
        (1_030, 150, Draining),
        // 39 ticks since the last packet: within the window of 40.
        (1_069, 150, Draining),
        (1_071, 150, Drained),
    ] {
        set_tick(&clock, tick);
        sent(&mut r, packets);
        r.daemon.tick();
        r.daemon.tick();
        assert_eq!(state(&mut r).await, (want, Some(0)), "at tick {tick}");
    }
}

/// A start over the newest revision's very file keeps its number; the
/// file edited while lbd was down, even by a comment, is a new one (a
/// revision keeps the text `lbctl show` shows).
#[tokio::test]
async fn a_start_over_an_edited_file_is_a_new_revision() {
    let r = rig(FILE);
    let revision = r.daemon.revision;
    let r = restart(r);
    assert_eq!(r.daemon.revision, revision, "nothing changed");
    let Rig { daemon, _dir, .. } = r;
    let text = format!("{}# edited while lbd was down\n", daemon.text);
    drop(daemon);
    let told = Told::default();
    let r = rig_in(_dir, &text, told.clone(), recording(&told));
    assert_eq!(r.daemon.revision, revision + 1);
    assert_eq!(r.daemon.running().digest(), {
        let first = rig(FILE);
        first.daemon.running().digest()
    });
}

#[tokio::test]
async fn clearing_overrides_where_none_are_in_force_says_so() {
    let mut r = rig(FILE);
    let clear = |vip: Option<&str>, backend: Option<&str>| {
        Request::Overrides(api::OverridesRequest::Clear {
            vip: vip.map(id),
            backend: backend.map(ip),
            force: false,
        })
    };
    let e = r.refused(ErrorKind::NotFound, clear(None, None)).await;
    assert!(e.contains("no runtime change is in force"), "{e}");
    let e = r.refused(ErrorKind::NotFound, clear(Some(WEB), None)).await;
    assert!(
        e.contains(&format!("no runtime change of VIP {WEB} ")),
        "{e}"
    );
    let e = r
        .refused(ErrorKind::NotFound, clear(Some(WEB), Some("10.1.0.1")))
        .await;
    assert!(e.contains("backend 10.1.0.1"), "{e}");
    // A VIP the API added: its backends are the VIP's definition.
    let add = VipAdd {
        vip: id("10.99.0.7:80/tcp"),
        backends: vec![BackendSpec {
            address: ip("10.1.0.1"),
            weight: 1,
        }],
        settings: VipSettings::default(),
    };
    r.ok(Request::Vip(VipRequest::Add(add))).await;
    let e = r
        .refused(
            ErrorKind::NotFound,
            clear(Some("10.99.0.7:80/tcp"), Some("10.1.0.1")),
        )
        .await;
    assert!(e.contains("was added by the API"), "{e}");
}

/// An announcer whose peers are these.
struct Reporting(Vec<PeerStatus>);

impl Announcer for Reporting {
    fn set_announced(&mut self, _: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        Ok(())
    }

    fn status(&self) -> Vec<PeerStatus> {
        self.0.clone()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Graceful restart is negotiated only when both sides sent it; routes
/// are counted per address family the session negotiated.
#[tokio::test]
async fn peer_metrics_say_graceful_restart_and_routes_per_family() {
    use crate::announce::{GracefulRestartStatus, SessionState};
    let peer = |address: &str, peer_supports: bool| {
        let mut p = PeerStatus::new(address, SessionState::Established);
        p.graceful_restart = Some(GracefulRestartStatus {
            offered: true,
            peer_supports,
            ..GracefulRestartStatus::default()
        });
        p
    };
    let v4_only = PeerStatus {
        families: vec!["ipv4".into()],
        carried: Some(vec![ip("10.99.0.1"), ip("10.99.0.2"), ip("fd00::99")]),
        ..peer("10.0.0.1", false)
    };
    let both = PeerStatus {
        families: vec!["ipv4".into(), "ipv6".into()],
        carried: Some(vec![ip("fd00::99")]),
        ..peer("10.0.0.3", true)
    };
    let peers = vec![v4_only, both];
    let announcers = Announcers::new(Box::new(move |_| {
        Ok(vec![
            Box::new(Reporting(peers.clone())) as Box<dyn Announcer>
        ])
    }));
    let mut r = rig_with(FILE, Told::default(), announcers);
    r.daemon.tick();
    let text = r.daemon.metrics.encode().unwrap();
    for line in [
        r#"lb_bgp_session_established{peer="10.0.0.1"} 1"#,
        r#"lb_bgp_graceful_restart{peer="10.0.0.1"} 0"#,
        r#"lb_bgp_graceful_restart{peer="10.0.0.3"} 1"#,
        r#"lb_bgp_routes_announced{peer="10.0.0.1",family="ipv4"} 2"#,
        r#"lb_bgp_routes_announced{peer="10.0.0.3",family="ipv4"} 0"#,
        r#"lb_bgp_routes_announced{peer="10.0.0.3",family="ipv6"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    assert!(
        !text.contains(r#"{peer="10.0.0.1",family="ipv6"}"#),
        "a family the session did not negotiate has no routes:\n{text}"
    );
}

/// The share of flows a change of hash fields moves, previewed by
/// placing made-up flows both ways, against what it must be when the two
/// placements are independent: 1 − Σ (a backend's share of the table)².
/// With weights 2:1 that is about 0.447; the sample of 65,536 flows is
/// off by about 0.002.
async fn rehash_previewed(text: &str, fields: (&str, &str)) {
    let vip = if text.contains("fd00::99") {
        "[fd00::99]:80/tcp"
    } else {
        WEB
    };
    let with = |fields: &str| {
        text.replace(
            "    protocol: tcp\n",
            &format!("    protocol: tcp\n    hash: {fields}\n"),
        )
    };
    let mut r = rig(&with(fields.0));
    let table = r.daemon.table(&id(vip), false).expect("programmed");
    let size: u32 = table.backends.iter().map(|b| b.slots).sum();
    let kept: f64 = table
        .backends
        .iter()
        .map(|b| (f64::from(b.slots) / f64::from(size)).powi(2))
        .sum();
    let dry = ChangeOptions {
        dry_run: true,
        ..ChangeOptions::default()
    };
    let preview = r
        .daemon
        .reload(reparse(&r, &with(fields.1)), true, &dry)
        .await
        .expect("a preview")
        .preview
        .expect("preview");
    let share = preview.vips_changed[0].share_moved;
    assert!(
        (share - (1.0 - kept)).abs() < 0.015,
        "{fields:?}: share moved {share}, expected {}",
        1.0 - kept
    );
}

#[tokio::test]
async fn a_change_of_hash_fields_moves_the_share_independent_placements_move() {
    let v6 = FILE
        .replace("10.99.0.1", "fd00::99")
        .replace("10.1.0.", "fd00:1::");
    let all = "[src_ip, dst_ip, protocol, src_port, dst_port]";
    rehash_previewed(&v6, (all, "[src_ip]")).await;
    rehash_previewed(FILE, (all, "[src_ip]")).await;
    // Ports dropped: a VIP that hashes fragments leaves them out anyway;
    // this one does not.
    rehash_previewed(FILE, ("[src_ip, src_port]", "[src_ip]")).await;
}

/// Refusals by an announcer keep their kind on the wire: a configuration
/// it cannot take is the operator's, anything else is lbd's.
#[test]
fn announcer_errors_are_invalid_config_or_internal() {
    let config = AnnounceError::Config(ConfigErrors {
        source_name: None,
        errors: Vec::new(),
    });
    let prefix = AnnounceError::InvalidPrefix {
        prefix: ip("10.0.0.1"),
        reason: "test",
    };
    for (e, kind) in [
        (config, ErrorKind::InvalidConfig),
        (prefix, ErrorKind::InvalidConfig),
        (AnnounceError::ShutDown, ErrorKind::Internal),
    ] {
        assert_eq!(DaemonError::Announce(e).kind(), kind);
    }
}

/// The registry `/metrics` serves is the daemon's own: what a tick
/// records is in it.
#[tokio::test]
async fn the_metrics_endpoint_serves_what_the_tick_records() {
    let mut r = rig(FILE);
    r.daemon.tick();
    let served = r.daemon.metrics().encode().unwrap();
    assert!(
        served.contains(r#"lb_vip_announced{vip="10.99.0.1:80/tcp"} 1"#),
        "{served}"
    );
}

/// The metrics count each backend's SYNs from its own counters.
#[tokio::test]
async fn metrics_count_each_backends_syns() {
    let mut r = rig(FILE);
    syns(&mut r, "10.1.0.2", 7, 3);
    r.daemon.tick();
    let served = r.daemon.metrics().encode().unwrap();
    for line in [
        r#"lb_backend_syns_total{vip="10.99.0.1:80/tcp",backend="10.1.0.2"} 7"#,
        r#"lb_backend_syn_retransmits_total{vip="10.99.0.1:80/tcp",backend="10.1.0.2"} 3"#,
        r#"lb_backend_syns_total{vip="10.99.0.1:80/tcp",backend="10.1.0.1"} 0"#,
    ] {
        assert!(served.contains(line), "{line} not in:\n{served}");
    }
}

/// What lbd tells the daemon at start is what `lbctl status` shows.
#[tokio::test]
async fn status_shows_what_the_start_found() {
    let mut r = rig(FILE);
    let gateway = GatewayState {
        gateway: Some(ip("10.0.0.1")),
        mac: Some(Mac([2, 0, 0, 0, 0, 9])),
        looking_up: false,
        error: None,
    };
    r.daemon.started_with(true, "digest".into(), Some(gateway));
    let eth0 = api::InterfaceInfo {
        name: "eth0".into(),
        mode: "native".into(),
        adopted: true,
    };
    r.daemon.attached(vec![eth0]);
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert!(s.maps_adopted);
    assert_eq!(
        (s.interfaces[0].name.as_str(), s.interfaces[0].adopted),
        ("eth0", true)
    );
    assert_eq!(s.gateway.unwrap().address, Some(ip("10.0.0.1")));
}

/// `lbctl status` warns while the datapath's windows are not sized for
/// the kernel's HZ (the rig's settings know none), and not once they are.
#[tokio::test]
async fn status_warns_while_the_kernels_hz_is_unknown() {
    let mut r = rig(FILE);
    let hz = |s: &api::Status| s.warnings.iter().any(|w| w == crate::liveflows::HZ_UNKNOWN);
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert!(hz(&s), "{:?}", s.warnings);
    r.daemon.settings.kernel_hz = Some(250);
    let s: api::Status = parse(r.ok(Request::Status).await);
    assert!(!hz(&s), "{:?}", s.warnings);
    assert_eq!(s.warnings.len(), 1, "the file's own warning stays");
}

/// Backends a restart starts down are said once, at the start; a start
/// with none, or a reload, says nothing of them.
#[tokio::test]
async fn only_the_start_says_which_backends_start_down() {
    let text = FILE.replace(
        "    protocol: tcp\n",
        &format!("    protocol: tcp{}", PROBED.replace("rise: 1", "rise: 2")),
    );
    logs::capture();
    let mut r = rig(&text);
    assert_eq!(logs::lines("start down"), Vec::<String>::new(), "none down");
    let down = ProbeResult {
        ok: false,
        latency_us: 100,
        detail: "x".into(),
    };
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), down.clone());
    }
    logs::capture();
    let mut r = restart(r);
    let said = logs::lines("start down");
    assert!(
        said.len() == 1 && said[0].contains(" 1 backend(s) start down"),
        "at the start: {said:?}"
    );
    logs::capture();
    let grown = text.replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
    );
    r.daemon
        .reload(reparse(&r, &grown), false, &plain())
        .await
        .expect("applies");
    assert_eq!(logs::lines("start down"), Vec::<String>::new(), "a reload");
}

/// A change of the gateway hands lbd's loop the gateway to follow, once.
#[tokio::test]
async fn a_new_gateway_is_handed_to_the_loop_once() {
    let mut r = rig(FILE);
    assert_eq!(r.daemon.take_regateway(), None);
    let text = FILE.replace("02:00:00:00:00:01", "02:00:00:00:00:07");
    r.daemon
        .reload(reparse(&r, &text), true, &plain())
        .await
        .expect("applies");
    assert_eq!(r.daemon.take_regateway(), Some((None, [2, 0, 0, 0, 0, 7])));
    assert_eq!(r.daemon.take_regateway(), None);
}

#[tokio::test]
async fn stopping_the_probes_stops_every_prober() {
    let text = checked(FILE);
    let mut r = rig(&text);
    assert_eq!(r.daemon.probes.count(), 2);
    r.daemon.stop_probes();
    assert_eq!(r.daemon.probes.count(), 0);
}

/// A backend back from down ramps up under slow start: the probe result
/// leaves a re-plan pending, so that every tick raises its weight.
#[tokio::test]
async fn a_recovery_under_slow_start_leaves_a_replan_pending() {
    let text = FILE.replace(
        "    protocol: tcp\n",
        &format!("    protocol: tcp\n    slow_start: 10s{PROBED}"),
    );
    let mut r = rig(&text);
    let result = |ok| probed_as(ok, 100);
    both_up(&mut r, 100);
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    }
    r.daemon.tick();
    r.daemon.pending = false;
    r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(true));
    assert!(r.daemon.pending, "slow start runs: the ticks re-plan");
}

/// A verdict that changes is said once, and probes that confirm it say
/// nothing; every probe's duration is observed, in seconds.
#[tokio::test]
async fn a_changed_verdict_is_logged_once_and_every_probe_timed() {
    let text = checked(FILE);
    let mut r = rig(&text);
    let result = |ok| probed_as(ok, 250_000);
    both_up(&mut r, 250_000);
    logs::capture();
    for _ in 0..4 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    }
    assert_eq!(logs::lines("backend is down").len(), 1, "fall 2: once");
    r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(true));
    assert_eq!(logs::lines("backend is up").len(), 1);
    let text = r.daemon.metrics.encode().unwrap();
    let line =
        r#"lb_backend_probe_duration_seconds_sum{backend="10.1.0.2",vip="10.99.0.1:80/tcp"} 1.5"#;
    assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    // A backend that leaves takes its series along (helper-34: replaced
    // backends' series piled up until a restart); the other's stays.
    let without = checked(FILE).replace("      - address: 10.1.0.2\n", "");
    r.daemon
        .reload(reparse(&r, &without), false, &plain())
        .await
        .expect("applies");
    let text = r.daemon.metrics.encode().unwrap();
    let series = |b: &str| {
        text.lines().any(|l| {
            l.starts_with("lb_backend_probe_duration") && l.contains(&format!("backend=\"{b}\""))
        })
    };
    assert!(!series("10.1.0.2"), "{text}");
    assert!(series("10.1.0.1"), "{text}");
}

/// A reload that changes a backend's check judges it by the new rise and
/// fall from then on; its verdict stands until they overturn it.
#[tokio::test]
async fn a_changed_check_judges_by_its_new_fall() {
    let text = checked(FILE);
    let mut r = rig(&text);
    let result = |ok| probed_as(ok, 100);
    both_up(&mut r, 100);
    let slower = text.replace("fall: 2", "fall: 3");
    r.daemon
        .reload(reparse(&r, &slower), false, &plain())
        .await
        .expect("applies");
    assert_eq!(r.in_table(WEB).len(), 2, "up still");
    for _ in 0..2 {
        r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    }
    assert_eq!(
        r.in_table(WEB).len(),
        2,
        "fall 3: two failures are not enough"
    );
    r.daemon.on_probe((id(WEB), ip("10.1.0.2")), result(false));
    assert_eq!(r.in_table(WEB), BTreeSet::from([ip("10.1.0.1")]));
}

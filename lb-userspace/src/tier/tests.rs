//! The tier's pure parts: keys, composing a balancer's configuration from
//! its file and the desired state, and finding disagreement.

use super::*;
use crate::{daemon::FileRead, digest};

/// `file` composed with `desired`, as `lbd` reads it.
fn compose(file: &FileRead, desired: &Desired) -> Result<FileRead, ConfigErrors> {
    file.with_desired(desired)
}

const FILE: &str = "interfaces: [eth0]\nouter_source_v4: 10.0.0.1\ngateway_mac: 02:00:00:00:00:01\nsource:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n    prefix: /lb/t1\n";

fn file(text: &str) -> FileRead {
    let config = Config::parse(text).unwrap();
    FileRead {
        digest: digest::text(text),
        text: text.into(),
        config,
        desired: None,
    }
}

fn desired(revision: i64, text: &str) -> Desired {
    Desired {
        revision,
        text: text.into(),
        rollout: false,
    }
}

const ONE_VIP: &str = "vips:\n  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n    backends:\n      - { address: 10.10.0.2 }\n";

#[test]
fn keys_sit_under_the_prefix_and_are_told_apart() {
    let keys = Keys {
        prefix: "/lb/t1".into(),
    };
    assert_eq!(keys.desired(), "/lb/t1/desired");
    assert_eq!(keys.classify("/lb/t1/desired"), Some(TierKey::Desired));
    assert_eq!(
        keys.classify("/lb/t1/balancers/lb2"),
        Some(TierKey::Balancer("lb2"))
    );
    assert_eq!(
        keys.classify("/lb/t1/members/lb2"),
        Some(TierKey::Member("lb2"))
    );
    assert_eq!(keys.classify("/lb/t1/rollout"), Some(TierKey::Rollout));
    assert_eq!(
        keys.classify("/lb/t1/progress/lb2"),
        Some(TierKey::Progress("lb2"))
    );
    assert_eq!(keys.classify("/lb/t10/desired"), None);
    assert_eq!(keys.classify("/lb/t1/other"), None);
}

/// etcd returns a first read sorted by key, so every `balancers/` report
/// comes before the `members/` key that makes it count: the members go
/// first, the rest keep their order.
#[test]
fn a_first_read_takes_the_members_before_their_reports() {
    let keys = Keys {
        prefix: "/lb/t1".into(),
    };
    let mut read = vec![
        "/lb/t1/balancers/lb1",
        "/lb/t1/balancers/lb3",
        "/lb/t1/desired",
        "/lb/t1/members/lb1",
        "/lb/t1/members/lb2",
        "/lb/t1/members/lb3",
        "/lb/t1/progress/lb1",
        "/lb/t1/rollout",
        "/lb/t1/x",
    ];
    keys.members_first(&mut read, |k| Some(*k));
    // Members that report first (lb1, lb3), then lb2, which does not.
    assert_eq!(
        read,
        [
            "/lb/t1/members/lb1",
            "/lb/t1/members/lb3",
            "/lb/t1/members/lb2",
            "/lb/t1/balancers/lb1",
            "/lb/t1/balancers/lb3",
            "/lb/t1/desired",
            "/lb/t1/progress/lb1",
            "/lb/t1/rollout",
            "/lb/t1/x",
        ]
    );
}

/// A digest is cut to 12 characters, never inside one: a peer's report
/// or a rollout record may hold any text.
#[test]
fn a_short_digest_is_twelve_characters_of_any_text() {
    assert_eq!(short_digest("0123456789abcdef"), "0123456789ab");
    assert_eq!(short_digest("abc"), "abc");
    assert_eq!(short_digest(""), "");
    assert_eq!(short_digest("xéééééééééééé"), "xééééééééééé");
    assert_eq!(short_digest("é"), "é");
}

#[test]
fn a_composed_configuration_is_the_file_with_the_desired_vips() {
    let composed = compose(&file(FILE), &desired(42, ONE_VIP)).unwrap();
    assert_eq!(composed.config.vips.len(), 1);
    assert_eq!(composed.config.interfaces, ["eth0"]);
    assert_eq!(composed.desired.map(|d| d.revision), Some(42));
    assert!(composed.config.source.is_some());
    // The text a revision records parses to the same configuration.
    let again = Config::parse(&composed.text).unwrap();
    assert_eq!(again.vips, composed.config.vips);
    // And a restart takes its VIPs back out of it.
    let back = Desired::from_config_text((42, false), &composed.text).unwrap();
    assert_eq!(
        compose(&file(FILE), &back).unwrap().config.vips,
        composed.config.vips
    );
    let source = composed.config.source.as_ref().unwrap();
    assert_eq!(
        revision_of_origin(&origin(source, &back), "/lb/t1"),
        Some((42, false))
    );
    assert_eq!(
        revision_of_origin(&origin(source, &back), "/lb/t2"),
        None,
        "another tier's history"
    );
    assert_eq!(revision_of_origin(&origin(source, &back), "/lb"), None);
    let candidate = Desired {
        rollout: true,
        ..back
    };
    assert_eq!(origin(source, &candidate), "etcd /lb/t1/rollout@42");
    assert_eq!(
        revision_of_origin(&origin(source, &candidate), "/lb/t1"),
        Some((42, true))
    );
    assert_eq!(revision_of_origin("etcd /lb/t1/rollout@x", "/lb/t1"), None);
    assert_eq!(revision_of_origin("reload", "/lb/t1"), None);
}

#[test]
fn bad_desired_states_are_refused_with_a_name() {
    let f = file(FILE);
    let cases = [
        ("not: [yaml", "not a desired state"),
        (
            "vips: []\ninterfaces: [eth9]\n",
            "unknown field `interfaces`",
        ),
        ("- a list\n", "not a desired state"),
        (
            "vips:\n  - address: 10.99.0.1\n    port: 99999\n",
            "vips[0].port",
        ),
    ];
    for (text, says) in cases {
        let err = compose(&f, &desired(7, text)).unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains(says), "{text:?}: {shown}");
        assert!(shown.contains("etcd /lb/t1/desired@7"), "{shown}");
    }
    let huge = format!("vips: []\n#{}\n", "x".repeat(MAX_DESIRED_BYTES));
    let err = compose(&f, &desired(8, &huge)).unwrap_err().to_string();
    assert!(err.contains("bytes, more than"), "{err}");
}

#[test]
fn a_file_with_its_own_vips_is_refused_when_they_come_from_etcd() {
    let text = format!("{FILE}{ONE_VIP}");
    let err = compose(&file(&text), &desired(1, "vips: []\n")).unwrap_err();
    assert_eq!(err.errors[0].field, "vips");
    assert!(err.to_string().contains("come from etcd"));
}

fn report(name: &str, applied: i64, digest: &str, down: &[&str]) -> Member {
    Member {
        name: name.into(),
        report: Some(Report {
            name: name.into(),
            applied: Some(applied),
            seen: Some(applied),
            tables: [("10.99.0.1:80/tcp".to_string(), digest.to_string())].into(),
            down: down.iter().map(|d| d.to_string()).collect(),
            ..Report::default()
        }),
        unreadable: None,
    }
}

#[test]
fn agreeing_balancers_raise_no_flag() {
    let tier = [report("a", 5, "d1", &[]), report("b", 5, "d1", &[])];
    assert_eq!(compare(&tier), Vec::<String>::new());
}

#[test]
fn disagreement_is_named_balancer_by_balancer() {
    let mut tier = vec![
        report("a", 5, "d1", &[]),
        report("b", 5, "d2", &[]),
        report("c", 4, "d1", &[]),
        Member {
            name: "d".into(),
            report: None,
            unreadable: None,
        },
    ];
    let flags = compare(&tier);
    assert!(
        flags.iter().any(|f| f.starts_with("d: not reporting")),
        "{flags:?}"
    );
    assert!(
        flags
            .iter()
            .any(|f| f.starts_with("c: runs desired revision 4, the newest is 5")),
        "{flags:?}"
    );
    assert!(
        flags
            .iter()
            .any(|f| f.contains("VIP 10.99.0.1:80/tcp: tables differ (d1 on a; d2 on b)")),
        "{flags:?}"
    );
    assert_eq!(flags.len(), 3, "{flags:?}");
    // A table that differs because that balancer sees a backend down is
    // the health checks' doing, not a disagreement.
    tier[1] = report("b", 5, "d2", &["10.99.0.1:80/tcp 10.10.0.2 down"]);
    let flags = compare(&tier);
    assert!(
        !flags.iter().any(|f| f.contains("tables differ")),
        "{flags:?}"
    );
    // Nor a balancer running a revert of its own: that is said instead.
    tier[1] = report("b", 5, "d2", &[]);
    if let Some(r) = &mut tier[1].report {
        r.reverted = Some(31);
    }
    let flags = compare(&tier);
    assert!(
        !flags.iter().any(|f| f.contains("tables differ")),
        "{flags:?}"
    );
    assert!(
        flags.iter().any(|f| f
            == "b: runs its revision 31, from a revert there, instead of desired revision 5 (until a desired state with other VIPs or a changed file applies)"),
        "{flags:?}"
    );
}

/// An installation's id is made once and kept beside the state file: the
/// same after a restart, another in another directory (another box), and
/// a damaged file is replaced, not trusted.
#[test]
fn an_installation_keeps_its_id_across_restarts() {
    let dir = crate::scratch::ScratchDir::new("tier-instance");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let first = instance_id(&a).unwrap();
    assert_eq!(first.len(), 32, "{first}");
    assert_eq!(instance_id(&a).unwrap(), first, "kept");
    assert_ne!(instance_id(&b).unwrap(), first, "another box");
    let valid = |id: &str| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    for damaged in ["not an id\n", "abc\n", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\n"] {
        std::fs::write(a.join(INSTANCE_FILE), damaged).unwrap();
        let made = instance_id(&a).unwrap();
        assert!(valid(&made) && made != first, "{damaged:?} gave {made:?}");
        assert_eq!(instance_id(&a).unwrap(), made);
    }
}

/// A report under this balancer's name from another installation names
/// the clash; its own, or one from an `lbd` that wrote no id, does not.
#[test]
fn a_namesakes_report_is_named() {
    let with = |instance: Option<&str>| Report {
        name: "lb1".into(),
        instance: instance.map(str::to_string),
        ..Report::default()
    };
    let why = written_by_another(&with(Some("bb")), "aa").expect("a namesake");
    assert!(why.contains("another balancer reports as lb1"), "{why}");
    assert!(why.contains("source.etcd.name"), "{why}");
    assert_eq!(written_by_another(&with(Some("aa")), "aa"), None);
    assert_eq!(written_by_another(&with(None), "aa"), None);
}

/// A tier that loses a rack of a thousand VIPs' backends reports more
/// than a peer reads (1 MiB) or etcd takes (1.5 MiB): the report is cut
/// to fit, down list first, then tables, and says how much it left out;
/// a small one is untouched. Sizes by serde_json, as published.
#[test]
fn a_report_is_cut_to_what_peers_read() {
    let digest = "d".repeat(64);
    let big = Report {
        name: "lb1".into(),
        down: (0..30_000)
            .map(|i| {
                format!(
                    "10.99.{}.{}:443/tcp 10.1.{}.{} down",
                    i / 250,
                    i % 250,
                    i / 250,
                    i % 250
                )
            })
            .collect(),
        tables: (0..12_000)
            .map(|i| {
                (
                    format!("10.99.{}.{}:443/tcp", i / 250, i % 250),
                    digest.clone(),
                )
            })
            .collect(),
        ..Report::default()
    };
    let size = |r: &Report| serde_json::to_vec(r).unwrap().len();
    assert!(size(&big) > 1_500_000, "{}", size(&big));
    let cut = big.clone().bounded();
    assert!(size(&cut) <= MAX_REPORT_BYTES, "{}", size(&cut));
    assert!(
        size(&cut) > MAX_REPORT_BYTES - 4096,
        "no more is cut than needed: {}",
        size(&cut)
    );
    assert_eq!(cut.down.len() + cut.down_omitted, 30_000);
    assert_eq!(cut.tables.len() + cut.tables_omitted, 12_000);
    assert_eq!(cut.down.len(), 0, "the down list goes first");
    assert!(
        cut.tables_omitted > 0 && !cut.tables.is_empty(),
        "{}",
        cut.tables_omitted
    );
    // A peer reads it back, counts and all.
    let read: Report = serde_json::from_slice(&serde_json::to_vec(&cut).unwrap()).unwrap();
    assert_eq!(read, cut);
    let small = Report {
        down: big.down[..100].to_vec(),
        ..big.clone()
    };
    let small = Report {
        tables: BTreeMap::new(),
        ..small
    };
    assert_eq!(small.clone().bounded(), small);
}

/// Balancers with different flow hash keys are flagged, by fingerprint
/// (their tables agree, their flows do not); one that reports none (an
/// older lbd) is left out; agreeing keys raise nothing.
#[test]
fn different_hash_keys_are_flagged() {
    let keyed = |name: &str, key: Option<&str>| {
        let mut m = report(name, 5, "d1", &[]);
        if let Some(r) = m.report.as_mut() {
            r.hash_key = key.map(str::to_string);
        }
        m
    };
    let a = crate::digest::hash_key(Some(&[1, 2]));
    let b = crate::digest::hash_key(None);
    assert_ne!(a, b);
    assert_eq!(a, crate::digest::hash_key(Some(&[1, 2])));
    let agree = [
        keyed("a", Some(&a)),
        keyed("b", Some(&a)),
        keyed("old", None),
    ];
    assert_eq!(compare(&agree), Vec::<String>::new());
    let differ = [
        keyed("a", Some(&a)),
        keyed("b", Some(&a)),
        keyed("c", Some(&b)),
    ];
    let flags = compare(&differ);
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert!(
        flags[0].contains("hash keys")
            && flags[0].contains("a, b (")
            && flags[0].contains("c (none)"),
        "{flags:?}"
    );
}

/// A report whose down list was cut is not compared table by table: its
/// tables lack backends its list no longer names.
#[test]
fn a_cut_report_raises_no_table_flag() {
    let mut cut = report("b", 5, "d2", &[]);
    if let Some(r) = cut.report.as_mut() {
        r.down_omitted = 3;
    }
    assert_eq!(
        compare(&[report("a", 5, "d1", &[]), cut]),
        Vec::<String>::new()
    );
    let whole = report("b", 5, "d2", &[]);
    assert_eq!(compare(&[report("a", 5, "d1", &[]), whole]).len(), 1);
}

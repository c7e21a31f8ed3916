//! The configuration's unit tests: parsing, every rule, the shipped files.
use super::*;

const GOOD: &str = r#"
instance: t1
interfaces: [eth0]
gateway_mac: "02:00:00:00:00:01"
outer_source_v4: 10.0.0.2
outer_source_v6: fd00::2
table_size: 4099
vips:
  - address: 10.99.0.1
    port: 80
    protocol: tcp
    backends:
      - address: 10.1.0.1
        weight: 2
      - address: 10.1.0.2
  - address: 2001:db8::1
    port: all
    protocol: udp
    encap: gre
    conntrack: false
    backends:
      - address: fd00:1::1
"#;

/// The errors `text` is refused with. A config that is accepted fails the
/// test without printing itself: some fixtures are megabytes long.
fn errors(text: &str) -> Vec<String> {
    match Config::parse(text) {
        Ok(_) => panic!(
            "must be rejected: a {}-byte config was accepted",
            text.len()
        ),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

fn with(replace: &str, by: &str) -> String {
    assert!(GOOD.contains(replace), "fixture lacks {replace:?}");
    GOOD.replacen(replace, by, 1)
}

#[test]
fn a_good_config_parses_with_defaults() {
    let c = Config::parse(GOOD).expect("valid");
    assert_eq!(c.instance, "t1");
    assert_eq!(c.layout.table_size, 4099);
    assert_eq!(c.layout.ct_buckets, 1 << 18);
    assert_eq!(c.xdp_mode, XdpModeSetting::Native);
    assert_eq!(c.gateway, Gateway::Mac(Mac([2, 0, 0, 0, 0, 1])));
    assert_eq!(c.api_socket, PathBuf::from("/run/lb/t1.sock"));
    assert_eq!(c.pin_dir(), PathBuf::from("/sys/fs/bpf/lb/t1"));
    assert_eq!(c.vips.len(), 2);
    assert_eq!(c.vips[0].id.to_string(), "10.99.0.1:80/tcp");
    assert_eq!(c.vips[0].backends[1].weight, 1, "default weight");
    assert!(c.vips[0].conntrack);
    assert_eq!(c.vips[1].id.to_string(), "[2001:db8::1]:*/udp");
    assert_eq!(c.vips[1].encap, Encap::Gre);
    assert!(!c.vips[1].conntrack);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let unnamed = Config::parse(&GOOD.replace("instance: t1\n", "")).expect("valid");
    assert_eq!(unnamed.instance, "default", "the instance's default name");
    assert_eq!(unnamed.api_socket, PathBuf::from("/run/lb/default.sock"));
}

#[test]
fn unknown_field_names_field_and_line() {
    let e = errors(&with("        weight: 2", "        wieght: 2"));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("vips[0].backends[0]: unknown field `wieght`"),
        "{e:?}"
    );
    assert!(e[0].contains("line 14"), "{e:?}");
}

#[test]
fn bad_address_names_field_and_line() {
    let e = errors(&with("address: 10.1.0.2", "address: 10.1.0.300"));
    assert!(
        e[0].starts_with("vips[0].backends[1].address: `10.1.0.300` is not an IP address"),
        "{e:?}"
    );
    assert!(e[0].contains("line 15"), "{e:?}");
}

#[test]
fn bad_port_protocol_encap_mac_are_named() {
    assert!(
        errors(&with("port: 80", "port: 70000"))[0]
            .starts_with("vips[0].port: port 70000 is out of range")
    );
    assert!(
        errors(&with("port: 80", "port: http"))[0]
            .starts_with("vips[0].port: `http` is not a port")
    );
    assert!(
        errors(&with("protocol: tcp", "protocol: sctp"))[0]
            .starts_with("vips[0].protocol: unknown variant `sctp`")
    );
    assert!(
        errors(&with("encap: gre", "encap: vxlan"))[0]
            .starts_with("vips[1].encap: unknown variant `vxlan`")
    );
    assert!(
        errors(&with("\"02:00:00:00:00:01\"", "\"02:00:00:00:01\""))[0]
            .starts_with("gateway_mac: `02:00:00:00:01` is not a MAC address")
    );
}

#[test]
fn duplicate_vip_and_backend() {
    let dup_vip = format!(
        "{GOOD}  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n    backends:\n      - address: 10.1.0.9\n"
    );
    assert_eq!(
        errors(&dup_vip),
        vec!["vips[2]: VIP 10.99.0.1:80/tcp is defined twice"]
    );
    let e = errors(&with("address: 10.1.0.2", "address: 10.1.0.1"));
    assert_eq!(
        e,
        vec![
            "vips[0].backends[1].address: backend 10.1.0.1 is listed twice for VIP 10.99.0.1:80/tcp"
        ]
    );
}

#[test]
fn table_size_must_be_prime_and_not_too_large_and_warns_when_small() {
    assert!(
        errors(&with("table_size: 4099", "table_size: 4096"))[0]
            .starts_with("table_size: 4096 is not prime")
    );
    assert!(
        errors(&with("table_size: 4099", "table_size: 16777259"))[0]
            .starts_with("table_size: 16777259 is larger than the maximum, 16777216")
    );
    let c = Config::parse(&with("table_size: 4099", "table_size: 101")).expect("valid");
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("below 100 × 2"), "{:?}", c.warnings);
    // A backend weighted 0 takes no share: one weighted backend is fair
    // in 101 slots.
    let one = with("table_size: 4099", "table_size: 101").replacen(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
        1,
    );
    let c = Config::parse(&one).expect("valid");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // Three backends want 300 slots: 211 is too few.
    let three = with("table_size: 4099", "table_size: 211").replacen(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n      - address: 10.1.0.3\n",
        1,
    );
    let c = Config::parse(&three).expect("valid");
    assert!(c.warnings[0].contains("below 100 × 3"), "{:?}", c.warnings);
    // A second-chance VIP may have a table as large as the global one.
    let own = with(
        "    port: 80\n    protocol: tcp\n",
        "    port: 80\n    protocol: tcp\n    second_chance: true\n    table_size: 4099\n",
    );
    let c = Config::parse(&own);
    assert!(c.is_ok(), "{:?}", c.err().map(|e| e.to_string()));
}

#[test]
fn a_vip_may_set_its_own_table_size_and_is_held_to_the_same_rules() {
    let own = |m: &str| {
        with(
            "    port: 80\n    protocol: tcp\n",
            &format!("    port: 80\n    protocol: tcp\n    table_size: {m}\n"),
        )
    };
    let c = Config::parse(&own("1009")).expect("valid");
    assert_eq!(c.vips[0].table_size, Some(1009));
    assert_eq!(c.vips[0].maglev_size(&c.layout), 1009);
    assert_eq!(c.vips[1].table_size, None);
    assert_eq!(c.vips[1].maglev_size(&c.layout), 4099, "the global size");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    for (m, why) in [
        ("1000", "vips[0].table_size: 1000 is not prime"),
        ("97", "vips[0].table_size: 97 slots cannot balance"),
        (
            "16777259",
            "vips[0].table_size: 16777259 is larger than the maximum",
        ),
        ("-1", "vips[0].table_size: invalid type"),
    ] {
        let e = errors(&own(m));
        assert!(e.iter().any(|e| e.starts_with(why)), "{m}: {e:?}");
    }
    // Below 100 × N: a warning that names the VIP's own size and the
    // smallest prime that keeps shares within 1%.
    let c = Config::parse(&own("101")).expect("valid");
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(
        c.warnings[0].starts_with(
            "vips[0]: VIP 10.99.0.1:80/tcp has 2 backends; table_size 101 is below 100 × 2"
        ) && c.warnings[0].contains("table_size: 211 is the smallest prime above"),
        "{:?}",
        c.warnings
    );
}

#[test]
fn the_table_pool_must_hold_every_vips_tables() {
    // Default: room for max_vips (64) VIPs of table_size 4099 (5 chunks a half).
    let c = Config::parse(GOOD).expect("valid");
    assert_eq!(c.layout.pool_chunks(), 64 * 2 * 5);
    let c = Config::parse(&with(
        "table_size: 4099",
        "table_size: 4099\ntable_pool_mib: 3",
    ))
    .expect("valid");
    assert_eq!(c.layout.pool_chunks(), 3 * 256);
    for bad in ["0", "16385"] {
        let e = errors(&with(
            "table_size: 4099",
            &format!("table_size: 4099\ntable_pool_mib: {bad}"),
        ));
        assert_eq!(
            e,
            vec![format!("table_pool_mib: {bad} is out of range 1-16384")]
        );
    }
    // Two VIPs of M = 655373 need 2 × 2 × 640 chunks = 10 MiB.
    let big = with("table_size: 4099", "table_size: 655373\ntable_pool_mib: 8");
    let e = errors(&big);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with(
            "vips: the VIPs' tables need 10.0 MiB (two halves of ceil(M / 1024) × 4 KiB each), but the table pool holds 8.0 MiB: raise table_pool_mib"
        ),
        "{e:?}"
    );
    // The API's changes are held to it too.
    let c = Config::parse(&with(
        "table_size: 4099",
        "table_size: 4099\ntable_pool_mib: 1",
    ))
    .unwrap();
    let mut vips = c.vips.clone();
    let mut extra = vips[0].clone();
    extra.id.port = 81;
    extra.table_size = Some(131_071);
    vips.push(extra);
    let e = c
        .check_vips(&vips)
        .expect_err("1 MiB holds no 1 MiB table besides two more");
    assert!(e.to_string().contains("table_pool_mib"), "{e}");
}

#[test]
fn alternates_past_16_gib_are_refused_by_name() {
    // 2,000 regions of 16,384 chunks of 12 KiB: 375 GiB of kernel memory.
    let text = with(
        "table_size: 4099",
        "table_size: 16777213\ntable_pool_mib: 1024\nmax_vips: 2000\nsecond_chance_vips: 2000",
    );
    assert_eq!(
        errors(&text),
        vec![
            "invalid layout: second_chance_vips 2000 at table_size 16777213 need 384000 MiB of alternates, more than the maximum, 16384 MiB; lower either"
        ]
    );
    // 2,000 × 12 KiB at the fixture's table size: 23 MiB, taken.
    let small = with(
        "table_size: 4099",
        "table_size: 4099\nmax_vips: 2000\nsecond_chance_vips: 2000",
    );
    Config::parse(&small).expect("23 MiB of alternates");
}

#[test]
fn a_vip_whose_weights_are_all_zero_is_warned_about() {
    let text = with("weight: 2", "weight: 0").replace(
        "      - address: 10.1.0.2\n",
        "      - address: 10.1.0.2\n        weight: 0\n",
    );
    let c = Config::parse(&text).expect("still valid");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("has no backend with a weight above 0: it will drop every packet")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn settings_that_undo_themselves_are_warned_about() {
    let warned = |text: &str, what: &str| {
        let c = Config::parse(text).expect("still valid");
        c.warnings.iter().any(|w| w.contains(what))
    };
    let panic = "vips[0].panic_threshold: 100% puts VIP 10.99.0.1:80/tcp's backends its probes find dead back";
    assert!(warned(
        &with("protocol: tcp", "protocol: tcp\n    panic_threshold: 100"),
        panic
    ));
    assert!(!warned(
        &with("protocol: tcp", "protocol: tcp\n    panic_threshold: 99"),
        panic
    ));
    let ports = "vips[0].hash: VIP 10.99.0.1:80/tcp has fragments: hash, which hashes every packet of it without ports";
    let frag = |hash: &str| {
        with(
            "protocol: tcp",
            &format!("protocol: tcp\n    fragments: hash{hash}"),
        )
    };
    assert!(warned(&frag("\n    hash: [src_ip, src_port]"), ports));
    assert!(warned(
        &frag("\n    hash: [src_ip, dst_ip, dst_port]"),
        ports
    ));
    // The default (the 5-tuple) and a list without ports say nothing
    // fragments: hash does not already say.
    assert!(!warned(&frag(""), ports));
    assert!(!warned(&frag("\n    hash: [src_ip, dst_ip]"), ports));
}

#[test]
fn weight_out_of_range() {
    assert_eq!(
        errors(&with("weight: 2", "weight: 10001")),
        vec!["vips[0].backends[0].weight: weight 10001 is out of range 0-10000"]
    );
    assert!(
        errors(&with("weight: 2", "weight: -1"))[0]
            .starts_with("vips[0].backends[0].weight: invalid type")
    );
}

#[test]
fn shipped_configurations_parse() {
    for (name, text) in [
        ("example.yaml", include_str!("../../../config/example.yaml")),
        ("minimal.yaml", include_str!("../../../config/minimal.yaml")),
        ("health.yaml", include_str!("../../../config/health.yaml")),
        ("demo.yaml", include_str!("../../../config/demo.yaml")),
    ] {
        if let Err(e) = Config::parse(text) {
            panic!("config/{name}: {e}");
        }
    }
}

#[test]
fn datapath_defaults_are_on() {
    let c = Config::parse(GOOD).expect("valid");
    assert_eq!(c.mtu, 1500);
    assert_eq!(c.gue_port, GUE_PORT);
    assert!(c.icmp_echo);
    assert_eq!(c.too_big_no_df, TooBigPolicy::Drop);
    assert!(c.vips.iter().all(|v| v.fragments == FragmentPolicy::Drop));
    assert_eq!(c.outer_source_v4_prefix, None);
}

#[test]
fn datapath_settings_parse() {
    let text = with(
        "table_size: 4099",
        "table_size: 4099\nmtu: 9000\ngue_port: 7000\nicmp_echo: false\ntoo_big_no_df: pass",
    )
    .replace(
        "conntrack: false",
        "conntrack: false\n    fragments: hash\n    encap: gue",
    )
    .replace("    encap: gre\n", "");
    let c = Config::parse(&text).expect("valid");
    assert_eq!((c.mtu, c.gue_port, c.icmp_echo), (9000, 7000, false));
    assert_eq!(c.too_big_no_df, TooBigPolicy::Pass);
    assert_eq!(c.vips[1].fragments, FragmentPolicy::Hash);
    assert_eq!(c.vips[1].encap, Encap::Gue);
    // Written back in the same shape.
    let yaml = serde_yaml::to_string(&c.vips[1]).expect("serialize");
    assert!(yaml.contains("fragments: hash"), "{yaml}");
    assert!(yaml.contains("encap: gue"), "{yaml}");
}

#[test]
fn mtu_too_small_for_ipv6_is_rejected() {
    assert_eq!(
        errors(&with("table_size: 4099", "table_size: 4099\nmtu: 1300")),
        vec![
            "mtu: 1300 is below 1328 (1280, the IPv6 minimum, plus 48 bytes of encapsulation); 0 turns the check off"
        ]
    );
    Config::parse(&with("table_size: 4099", "table_size: 4099\nmtu: 0")).expect("0 is off");
}

#[test]
fn outer_source_prefixes() {
    let c = Config::parse(
        &GOOD
            .replace(
                "outer_source_v4: 10.0.0.2",
                "outer_source_v4_prefix: 10.98.0.0/16",
            )
            .replace(
                "outer_source_v6: fd00::2",
                "outer_source_v6_prefix: fd00:99::/96",
            ),
    )
    .expect("prefixes stand in for fixed sources");
    let p = c.outer_source_v4_prefix.expect("v4 prefix");
    assert_eq!((p.to_string(), p.host_bits()), ("10.98.0.0/16".into(), 16));
    // A prefix around a VIP or a backend: some clients' tunnels would come
    // from that address, which a backend drops as its own (helper-37).
    assert_eq!(
        errors(&GOOD.replace(
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4_prefix: 10.99.0.0/16"
        )),
        vec![
            "vips[0].address: 10.99.0.1 is inside the tunnel source prefix 10.99.0.0/16: 1 in 65536 clients would be tunnelled from it, and a backend drops a packet from its own address; take a prefix of addresses nothing else uses"
        ]
    );
    let inside = errors(&GOOD.replace(
        "outer_source_v4: 10.0.0.2",
        "outer_source_v4_prefix: 10.1.0.0/24",
    ));
    assert_eq!(inside.len(), 2, "{inside:?}");
    assert!(
        inside[0].starts_with("vips[0].backends[0].address: 10.1.0.1 is inside the tunnel source prefix 10.1.0.0/24: 1 in 256"),
        "{inside:?}"
    );
    assert_eq!(c.outer_source_v6_prefix.expect("v6").host_bits(), 32);

    assert_eq!(
        errors(&with(
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4: 10.0.0.2\nouter_source_v4_prefix: 10.98.0.0/16"
        )),
        vec![
            "outer_source_v4_prefix: set either outer_source_v4 or outer_source_v4_prefix, not both"
        ]
    );
    assert_eq!(
        errors(&GOOD.replace(
            "outer_source_v6: fd00::2",
            "outer_source_v6_prefix: fd00:99::/64"
        )),
        vec![
            "outer_source_v6_prefix: fd00:99::/64: the prefix must be /96 or longer (host bits come from the client's last 32 bits)"
        ]
    );
    assert_eq!(
        errors(&GOOD.replace(
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4_prefix: fd00::/120"
        )),
        vec!["outer_source_v4_prefix: fd00::/120 is not an IPv4 prefix"]
    );
    assert!(
        errors(&GOOD.replace(
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4_prefix: 10.0.0.0/33"
        ))[0]
            .contains("`33` is not a prefix length 0-32")
    );
}

#[test]
fn one_vip_per_address_and_protocol_hashes_fragments() {
    let text = r#"
interfaces: [eth0]
outer_source_v4: 10.0.0.2
vips:
  - {address: 10.99.0.1, port: 53, protocol: udp, fragments: hash, backends: [{address: 10.1.0.1}]}
  - {address: 10.99.0.1, port: 5353, protocol: udp, fragments: hash, backends: [{address: 10.1.0.1}]}
  - {address: 10.99.0.1, port: 53, protocol: tcp, fragments: hash, backends: [{address: 10.1.0.1}]}
"#;
    assert_eq!(
        errors(text),
        vec![
            "vips[1].fragments: VIP 10.99.0.1:53/udp already hashes the fragments to 10.99.0.1 udp; fragments carry no port, so only one VIP per address and protocol can"
        ]
    );
}

#[test]
fn empty_vip_is_rejected() {
    let text = "interfaces: [eth0]\nouter_source_v4: 10.0.0.2\nvips:\n  - address: 10.99.0.1\n    port: 80\n    protocol: tcp\n";
    assert_eq!(
        errors(text),
        vec!["vips[0].backends: VIP 10.99.0.1:80/tcp has no backends; list at least one"]
    );
}

#[test]
fn backend_family_needs_an_outer_source() {
    let e = errors(&with("outer_source_v6: fd00::2\n", ""));
    assert_eq!(
        e,
        vec![
            "vips[1].backends[0].address: IPv6 backend fd00:1::1 needs an IPv6 tunnel source: set outer_source_v6"
        ]
    );
}

#[test]
fn several_errors_are_reported_together() {
    let text = with("table_size: 4099", "table_size: 4096").replace("weight: 2", "weight: 20000");
    let e = errors(&text);
    assert_eq!(e.len(), 2, "layout errors and VIP errors together: {e:?}");
    let text = with("weight: 2", "weight: 20000").replace("address: 10.1.0.2", "address: 10.1.0.1");
    assert_eq!(errors(&text).len(), 2);
}

#[test]
fn every_problem_of_a_file_is_reported_in_one_run() {
    // Three parse errors in three places (a top-level setting, a
    // backend of the first VIP, the port of the second) and a rule
    // broken by a part that did parse.
    let text = with("table_size: 4099", "table_size: 4099\nmtu: lots")
        .replace("        weight: 2", "        wieght: 2")
        .replace("port: all", "port: 0")
        .replace("instance: t1", "instance: \"t 1\"");
    let e = errors(&text);
    assert_eq!(e.len(), 4, "{e:#?}");
    assert!(
        e.iter()
            .any(|m| m.starts_with("vips[0].backends[0]: unknown field `wieght`")),
        "{e:?}"
    );
    // serde_yaml's first error keeps its line.
    assert!(
        e.iter()
            .any(|m| m.starts_with("mtu: ") && m.contains("at line 8")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("vips[1].port: port 0 is not a port")
                || m.starts_with("vips[1]: port 0 is not a port")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("instance: `t 1` must be")),
        "{e:?}"
    );
}

#[test]
fn list_valued_mistakes_and_a_key_after_the_vips_are_each_named() {
    // Two settings given a list where a number goes: each is checked on
    // its own (only the VIP list is left to the VIP checks), so both are
    // named, not only serde's first.
    let e = errors(&with("table_size: 4099", "table_size: [4099]\nmtu: [1500]"));
    assert!(e.iter().any(|m| m.starts_with("table_size: ")), "{e:?}");
    assert!(e.iter().any(|m| m.starts_with("mtu: ")), "{e:?}");
    // An unknown key after a VIP with a misspelt field: serde's first
    // error (the VIP's, with its line) takes the place of the VIP's own
    // error, not of the unknown key's.
    let text = format!(
        "{}colour: blue\n",
        with("        weight: 2", "        wieght: 2")
    );
    let e = errors(&text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(e.iter().any(|m| m.contains("`colour`")), "{e:?}");
    assert!(
        e.iter().any(
            |m| m.starts_with("vips[0].backends[0]: unknown field `wieght`")
                && m.contains("at line 14")
        ),
        "{e:?}"
    );
}

#[test]
fn addresses_sizes_and_paths_that_cannot_work_are_named() {
    // (what the file says instead of the good value, the error)
    let cases: &[(&str, &str, &str)] = &[
        (
            "table_size: 4099",
            "table_size: 4099\nconntrack_buckets: 1",
            "conntrack_buckets: 1 buckets hold 6 flows",
        ),
        (
            "table_size: 4099",
            "table_size: 13",
            "table_size: 13 slots cannot balance",
        ),
        ("    port: 80", "    port: 0", "port 0 is not a port"),
        (
            "  - address: 10.99.0.1",
            "  - address: 127.0.0.1",
            "127.0.0.1 cannot be a VIP: loopback",
        ),
        (
            "  - address: 10.99.0.1",
            "  - address: 255.255.255.255",
            "255.255.255.255 cannot be a VIP: it is not a unicast",
        ),
        (
            "  - address: 10.99.0.1",
            "  - address: \"::ffff:198.51.100.1\"",
            "::ffff:198.51.100.1 cannot be a VIP: it is an IPv4-mapped",
        ),
        (
            "  - address: 10.99.0.1",
            "  - address: 169.254.1.1",
            "169.254.1.1 cannot be a VIP: link-local",
        ),
        (
            "      - address: 10.1.0.1",
            "      - address: 255.255.255.255",
            "255.255.255.255 cannot be a backend",
        ),
        (
            "      - address: fd00:1::1",
            "      - address: fe80::1",
            "fe80::1 cannot be a backend: a link-local",
        ),
        (
            "      - address: fd00:1::1",
            "      - address: \"::ffff:127.0.0.1\"",
            "::ffff:127.0.0.1 cannot be a backend",
        ),
        (
            "      - address: 10.1.0.1",
            "      - address: 10.99.0.1",
            "10.99.0.1 is a VIP address of this balancer",
        ),
        (
            "      - address: 10.1.0.1",
            "      - address: 10.0.0.2",
            "10.0.0.2 is this balancer's own tunnel source",
        ),
        (
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4: 0.0.0.0",
            "outer_source_v4: 0.0.0.0 is unspecified",
        ),
        (
            "outer_source_v4: 10.0.0.2",
            "outer_source_v4: 224.0.0.5",
            "outer_source_v4: 224.0.0.5 is a multicast",
        ),
        (
            "outer_source_v6: fd00::2",
            "outer_source_v6: \"::1\"",
            "outer_source_v6: ::1 is a loopback",
        ),
        (
            "instance: t1",
            "instance: t1\napi_socket: \"\"",
            "api_socket: must not be empty",
        ),
        (
            "instance: t1",
            "instance: t1\nstate_file: \"\"",
            "state_file: must not be empty",
        ),
    ];
    for (from, to, want) in cases {
        assert!(GOOD.contains(from), "{from}");
        let e = errors(&with(from, to));
        assert!(
            e.iter().any(|m| m.contains(want)),
            "`{to}`: want an error containing {want:?}, got {e:?}"
        );
    }
    // The same rules hold for API changes (runtime VIPs).
    let c = Config::parse(GOOD).expect("good");
    let mut vips = c.vips.clone();
    vips[0].backends[0].address = "10.99.0.1".parse().unwrap();
    let e = c.check_vips(&vips).expect_err("a VIP as a backend");
    assert!(
        e.to_string().contains("is a VIP address of this balancer"),
        "{e}"
    );
    assert!(
        "10.0.0.1:0/tcp"
            .parse::<VipId>()
            .unwrap_err()
            .contains("port 0 is not a port")
    );
}

#[test]
fn bounds_on_size_nesting_and_echoed_values() {
    let deep = format!("instance: {}{}\n", "[".repeat(40_000), "]".repeat(40_000));
    let e = errors(&deep);
    // Refused by the scan, before the parser (which took seven seconds
    // over it): the scan's message.
    assert!(e[0].contains("nested 40000 deep"), "{e:?}");
    let big = format!("{GOOD}# {}\n", "x".repeat(17 << 20));
    assert!(errors(&big)[0].contains("larger than 16 MiB"));
    let long = with(
        "instance: t1",
        &format!("instance: {}", "y".repeat(10 << 20)),
    );
    let e = errors(&long);
    assert!(
        e[0].contains("(10485760 bytes)"),
        "{}",
        &e[0][..200.min(e[0].len())]
    );
    assert!(e.iter().all(|m| m.len() < 400), "every message is cut");
}

#[test]
fn interfaces_and_instance_are_checked() {
    assert!(
        errors(&with("interfaces: [eth0]", "interfaces: []"))[0]
            .starts_with("interfaces: at least one")
    );
    assert!(
        errors(&with("interfaces: [eth0]", "interfaces: [eth0, eth0]"))[0]
            .starts_with("interfaces[1]: `eth0` is listed twice")
    );
    assert!(
        errors(&with("instance: t1", "instance: a/b"))[0].starts_with("instance: `a/b` must be")
    );
    assert!(
        errors(&with(
            "interfaces: [eth0]",
            "interfaces: [averyveryverylongname]"
        ))[0]
            .starts_with("interfaces[0]")
    );
}

/// A health check's bounds are inclusive: an interval of 100ms to 1h, a
/// timeout up to the interval, a jitter up to 50%; one step beyond each
/// is refused. An HTTP check with no path asks for `/`.
#[test]
fn health_check_bounds_are_inclusive() {
    let hc = |check: &str| {
        with(
            "    backends:\n      - address: 10.1.0.1",
            &format!("    health_check: {{ {check} }}\n    backends:\n      - address: 10.1.0.1"),
        )
    };
    for ok in [
        "interval: 100ms, timeout: 100ms",
        "interval: 1h, timeout: 1h",
        "jitter: 50",
        // 4,096 bytes once lb's escapes are read: the most a probe reads.
        format!("expect: '{}'", "\\r\\n".repeat(2048)).as_str(),
    ] {
        let c = Config::parse(&hc(ok));
        assert!(c.is_ok(), "{ok}: {:?}", c.err().map(|e| e.to_string()));
    }
    for (bad, want) in [
        (
            "interval: 99ms, timeout: 50ms",
            "interval: must be between 100ms and 1h",
        ),
        ("interval: 3601s", "interval: must be between 100ms and 1h"),
        (
            "interval: 1s, timeout: 1001ms",
            "timeout: must be above 0 and at most the interval",
        ),
        ("jitter: 51", "jitter: 51% is out of range 0-50"),
        (
            format!("expect: {}", "x".repeat(4097)).as_str(),
            "expect: 4097 bytes, more than the 4096",
        ),
        (
            format!("send: {}", "x".repeat(4097)).as_str(),
            "send: 4097 bytes, more than the 4096",
        ),
    ] {
        let e = errors(&hc(bad));
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert!(
            e[0].starts_with(&format!("vips[0].health_check.{want}")),
            "{bad}: {e:?}"
        );
    }
    let c = Config::parse(&hc("http: {}")).expect("valid");
    let http = c.vips[0]
        .health_check
        .as_ref()
        .and_then(|h| h.http.as_ref());
    assert_eq!(http.map(|h| (h.path.as_str(), h.status)), Some(("/", 200)));
}

#[test]
fn health_settings_parse_and_are_checked() {
    let hc = |body: &str| {
        with(
            "    backends:\n      - address: 10.1.0.1",
            &format!("{body}    backends:\n      - address: 10.1.0.1"),
        )
    };
    let c = Config::parse(&hc("    health_check:\n      interval: 500ms\n      timeout: 0.2s\n      http: { path: /h }\n    slow_start: 1m\n    drain_timeout: 90s\n")).expect("valid");
    let v = &c.vips[0];
    let h = v.health_check.as_ref().expect("check");
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_millis(500), Duration::from_millis(200))
    );
    assert_eq!((h.rise, h.fall, h.jitter), (2, 3, 10));
    assert_eq!(
        h.http.as_ref().map(|h| (h.path.as_str(), h.status)),
        Some(("/h", 200))
    );
    assert_eq!(
        (v.slow_start, v.drain_timeout),
        (Duration::from_secs(60), Duration::from_secs(90))
    );
    assert_eq!(h.detection_bound(), Duration::from_millis(1850));

    for (body, want) in [
        (
            "    health_check:\n      interval: 1s\n      timeout: 2s\n",
            "vips[0].health_check.timeout: must be above 0 and at most the interval",
        ),
        (
            "    health_check:\n      http: {}\n      expect: x\n",
            "vips[0].health_check: use either `http` or `send`/`expect`",
        ),
        (
            "    health_check:\n      fall: 0\n",
            "vips[0].health_check.fall: 0 is out of range",
        ),
        (
            "    health_check:\n      interval: 2 days\n",
            "vips[0].health_check.interval: unknown unit",
        ),
        (
            "    panic_threshold: 150\n",
            "vips[0].panic_threshold: 150% is out of range",
        ),
    ] {
        let e = errors(&hc(body));
        assert!(e[0].starts_with(want), "{body:?}: {e:?}");
    }
    // An all-ports VIP must say which port to probe.
    let e = errors(&with("encap: gre\n", "encap: gre\n    health_check: {}\n"));
    assert!(
        e[0].starts_with("vips[1].health_check.port: the VIP covers all ports"),
        "{e:?}"
    );
    // Tunnelled probes need a backend of the VIP's family.
    let e = errors(&with(
        "encap: gre\n",
        "encap: gre\n    health_check: { port: 53, through_tunnel: true }\n",
    ));
    assert!(
        e.iter().any(|e| e
            .starts_with("vips[1].health_check.through_tunnel: probes through the tunnel are TCP")),
        "{e:?}"
    );
}

/// A `shutdown_grace` the packaged unit's 30 s stop timeout cannot hold
/// (the grace, then up to 10 s of announcers' shutdown) is warned about;
/// 20 s fits.
#[test]
fn a_shutdown_grace_longer_than_the_unit_waits_is_warned_about() {
    let warned = |grace: &str| {
        let c = Config::parse(&format!("{GOOD}shutdown_grace: {grace}\n")).expect("valid");
        c.warnings.iter().any(|w| w.contains("TimeoutStopSec"))
    };
    assert!(!warned("20s"));
    assert!(warned("21s"));
    assert!(warned("10m"));
    // The graceful shutdown's wait comes first: 15 s of it and 10 s of
    // grace do not fit either.
    let bgp = "announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    next_hop_v6: fd00::11\n    graceful_shutdown: { wait: 15s }\n    peers:\n      - { address: 10.0.0.1, remote_as: 65000 }\n";
    let c = Config::parse(&format!("{GOOD}{bgp}shutdown_grace: 10s\n")).expect("valid");
    assert!(
        c.warnings.iter().any(|w| w.contains("TimeoutStopSec")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn announce_settings_parse_with_defaults_and_are_checked() {
    let c = Config::parse(GOOD).expect("valid");
    assert_eq!(c.announce, AnnounceConfig::default());
    assert_eq!(c.shutdown_grace, Duration::from_secs(5));
    assert!(!c.detach_on_exit);
    assert_eq!(c.vips[0].min_healthy, 1);

    let text = format!(
        "{GOOD}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n    next_hop_v6: fd00::11\n    peers:\n      - {{ address: 10.0.0.1, remote_as: 65000 }}\nshutdown_grace: 2s\ndetach_on_exit: true\n"
    );
    let c = Config::parse(&text.replace(
        "    protocol: tcp\n",
        "    protocol: tcp\n    min_healthy: 2\n",
    ))
    .expect("valid");
    assert_eq!(c.announce.bgp.as_ref().map(|b| b.local_as), Some(65001));
    assert_eq!(c.shutdown_grace, Duration::from_secs(2));
    assert!(c.detach_on_exit);
    assert_eq!(c.vips[0].min_healthy, 2);

    // The announcers' own errors come under `announce.`.
    let e = errors(&text.replace("local_as: 65001", "local_as: 0"));
    assert_eq!(e, vec!["announce.bgp.local_as: AS 0 is reserved"]);
    let e = errors(&format!("{GOOD}announce:\n  bpg: {{}}\n"));
    assert!(e[0].starts_with("announce: unknown field `bpg`"), "{e:?}");
    assert_eq!(
        errors(&format!("{GOOD}shutdown_grace: 1h\n")),
        vec!["shutdown_grace: is longer than 10 minutes"]
    );
    // A min_healthy no VIP can meet is a mistake in a file, a warning
    // through the API.
    let e = errors(&with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    min_healthy: 3\n",
    ));
    assert_eq!(
        e,
        vec![
            "vips[0].min_healthy: min_healthy 3 is more than the 2 backend(s) of VIP 10.99.0.1:80/tcp: it would never be announced"
        ]
    );
    let mut vips = c.vips.clone();
    vips[0].min_healthy = 3;
    let warnings = c.check_vips(&vips).expect("allowed at runtime");
    assert!(warnings[0].contains("never be announced"), "{warnings:?}");
}

#[test]
fn durations_parse_and_print() {
    for (text, d) in [
        ("500ms", 500),
        ("2s", 2000),
        ("1.5s", 1500),
        ("3m", 180_000),
        ("1h", 3_600_000),
    ] {
        assert_eq!(
            duration::parse(text),
            Ok(Duration::from_millis(d)),
            "{text}"
        );
    }
    assert_eq!(duration::format(&Duration::from_millis(1500)), "1500ms");
    assert_eq!(duration::format(&Duration::from_secs(30)), "30s");
    assert!(duration::parse("soon").is_err());
    // Finer than a millisecond was written back as 0s (helper-37).
    for finer in ["0.5ms", "1.0001s"] {
        let e = duration::parse(finer).unwrap_err();
        assert!(e.contains("finer than a millisecond"), "{finer}: {e}");
    }
    assert_eq!(duration::parse("0.3s"), Ok(Duration::from_millis(300)));
    // A number alone is seconds to some tools and milliseconds to others.
    assert_eq!(
        duration::parse("65536"),
        Err("`65536` has no unit: write 65536s (seconds) or 65536ms (milliseconds)".into())
    );
}

/// In the file, a duration written as a bare number (an integer, negative
/// or not, or a fraction) is refused as such, and one of another type
/// says what is expected, as does a MAC address.
#[test]
fn durations_and_macs_of_the_wrong_type_say_what_is_expected() {
    for (number, why) in [
        ("5", "`5` has no unit"),
        ("-5", "`-5` is not a duration"),
        ("1.5", "`1.5` has no unit"),
    ] {
        let e = errors(&format!("{GOOD}gateway_refresh: {number}\n"));
        assert!(e.len() == 1 && e[0].contains(why), "{number}: {e:?}");
    }
    let e = errors(&format!("{GOOD}gateway_refresh: [5s]\n"));
    assert!(
        e.len() == 1 && e[0].contains("expected a duration with a unit, such as 500ms, 2s, 5m"),
        "{e:?}"
    );
    let e = errors(&with(
        "gateway_mac: \"02:00:00:00:00:01\"",
        "gateway_mac: [1]",
    ));
    assert!(
        e.len() == 1 && e[0].contains("expected a MAC address or `auto`"),
        "{e:?}"
    );
}

#[test]
fn vip_ids_round_trip() {
    for s in ["10.0.0.1:80/tcp", "[2001:db8::1]:443/udp", "10.0.0.1:*/tcp"] {
        assert_eq!(s.parse::<VipId>().expect(s).to_string(), s);
    }
    assert_eq!("10.0.0.1:all/tcp".parse::<VipId>().unwrap().port, 0);
    for bad in [
        "10.0.0.1:80",
        "10.0.0.1/tcp",
        "x:80/tcp",
        "10.0.0.1:99999/tcp",
        "10.0.0.1:80/sctp",
    ] {
        assert!(bad.parse::<VipId>().is_err(), "{bad}");
    }
}

/// The fields serde knows for `T`, read from its "unknown field"
/// error, so this list can never fall behind the types.
fn fields_of<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let e = serde_yaml::from_str::<T>("__no_such_field__: 1\n").expect_err("unknown field");
    let text = e.to_string();
    let list = text
        .split_once("expected one of ")
        .or_else(|| text.split_once("expected "))
        .map(|(_, l)| l)
        .unwrap_or_else(|| panic!("no field list in {text}"));
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_annotated_example_names_every_setting() {
    let example = include_str!("../../../config/example.yaml");
    let mut all = fields_of::<RawConfig>();
    all.extend(fields_of::<RawVip>());
    all.extend(fields_of::<BackendConfig>());
    all.extend(fields_of::<HealthCheck>());
    all.extend(fields_of::<HttpCheck>());
    all.extend(fields_of::<super::passive::PassiveHealth>());
    all.extend(fields_of::<super::quic::QuicConfig>());
    all.extend(fields_of::<super::announce::AnnounceConfig>());
    all.extend(fields_of::<super::announce::bgp::BgpConfig>());
    all.extend(fields_of::<super::announce::bgp::PeerConfig>());
    all.extend(fields_of::<super::announce::bgp::ConnectRetry>());
    all.extend(fields_of::<super::announce::bgp::GracefulRestart>());
    all.extend(fields_of::<super::announce::bgp::GracefulShutdown>());
    all.extend(fields_of::<super::announce::bgp::BfdTimers>());
    all.extend(fields_of::<super::announce::bgp::ShutdownAttributes>());
    all.extend(fields_of::<super::announce::ExabgpConfig>());
    all.extend(fields_of::<super::announce::ExecConfig>());
    all.extend(fields_of::<super::source::SourceConfig>());
    all.extend(fields_of::<super::source::EtcdSource>());
    all.extend(fields_of::<super::source::EtcdTls>());
    assert!(all.len() > 60, "{all:?}");
    let missing: Vec<&String> = all
        .iter()
        .filter(|f| !example.contains(&format!("{f}:")))
        .collect();
    assert!(
        missing.is_empty(),
        "config/example.yaml does not show {missing:?}"
    );
}

#[test]
fn every_example_in_config_dir_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("config/ exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 2, "expected example configs in {}", dir.display());
}

#[test]
fn second_chance_is_off_by_default_tcp_only_and_bounded() {
    let c = Config::parse(GOOD).expect("valid");
    assert!(c.vips.iter().all(|v| !v.second_chance));
    assert_eq!(c.layout.second_chance_vips, 8);
    let small = Config::parse(&format!("{GOOD}max_vips: 4\n")).expect("valid");
    assert_eq!(small.layout.second_chance_vips, 4, "at most max_vips");

    let on = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n",
    );
    let c = Config::parse(&on).expect("valid");
    assert!(c.vips[0].second_chance);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("decap program") && w.contains("10.99.0.1:80/tcp")),
        "{:?}",
        c.warnings
    );

    let udp = with(
        "    conntrack: false\n",
        "    conntrack: false\n    second_chance: true\n",
    );
    let e = errors(&udp);
    assert!(e[0].starts_with("vips[1].second_chance: "), "{e:?}");
    assert!(e[0].contains("UDP"), "{e:?}");

    let untracked = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n    conntrack: false\n",
    );
    let e = errors(&untracked);
    assert!(
        e.iter().any(|e| e.starts_with("vips[0].second_chance: ")
            && e.contains("needs the connection table")),
        "{e:?}"
    );

    let hashed = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n    fragments: hash\n",
    );
    assert!(errors(&hashed)[0].contains("fragments: hash"));

    // Its alternates region has the global M's slots: its own M fits it.
    let smaller = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n    table_size: 1009\n",
    );
    Config::parse(&smaller).expect("a smaller M is fine");
    let larger = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    second_chance: true\n    table_size: 8191\n",
    );
    let e = errors(&larger);
    assert!(
        e.iter().any(|e| e.starts_with("vips[0].second_chance: ")
            && e.contains("may not exceed the global table_size 4099")),
        "{e:?}"
    );

    let none = format!("{on}second_chance_vips: 0\n");
    assert!(errors(&none)[0].contains("1 VIPs with second_chance, but second_chance_vips is 0"));
    let too_many = format!("{GOOD}second_chance_vips: 100\n");
    assert!(errors(&too_many)[0].starts_with("second_chance_vips: 100 is more than max_vips"));
}

#[test]
fn second_chance_over_ipv6_needs_room_for_its_largest_header() {
    let v6 = with(
        "    port: all\n    protocol: udp\n    encap: gre\n    conntrack: false\n",
        "    port: 443\n    protocol: tcp\n    second_chance: true\n",
    );
    Config::parse(&format!("{v6}mtu: 1384\n")).expect("1280 + 104 fits");
    let e = errors(&format!("{v6}mtu: 1383\n"));
    assert!(e[0].contains("at least 1384"), "{e:?}");
}

/// Values that parse but cannot work (issue 24): each refused, naming
/// its field and saying why.
#[test]
fn values_that_cannot_work_are_refused() {
    let top = |line: &str| format!("{line}\n{GOOD}");
    for (text, field, says) in [
        (
            top("conntrack_buckets: 2147483648"),
            "conntrack_buckets",
            "GiB of kernel memory",
        ),
        (
            with(
                "gateway_mac: \"02:00:00:00:00:01\"",
                "gateway_mac: ff:ff:ff:ff:ff:ff",
            ),
            "gateway_mac",
            "broadcast or multicast",
        ),
        (
            with(
                "gateway_mac: \"02:00:00:00:00:01\"",
                "gateway_mac: 00:00:00:00:00:00",
            ),
            "gateway_mac",
            "no host's",
        ),
        (top("state_file: /"), "state_file", "names a directory"),
        (top("state_file: yes"), "state_file", "not an absolute path"),
        (top("bpffs: sys/fs/bpf"), "bpffs", "not an absolute path"),
        (
            top(&format!("api_socket: /run/{}.sock", "s".repeat(5000))),
            "api_socket",
            "at most 107",
        ),
        (
            with(
                "    protocol: tcp\n",
                "    protocol: tcp\n    min_healthy: 0\n",
            ),
            "min_healthy",
            "blackhole",
        ),
        (
            with(
                "    protocol: tcp\n",
                "    protocol: tcp\n    drain_timeout: 65536\n",
            ),
            "drain_timeout",
            "has no unit",
        ),
        (
            with("    port: 80\n", "    port: \"80\"\n"),
            "port",
            "is quoted",
        ),
    ] {
        let errors = errors(&text);
        assert!(
            errors.iter().any(|e| e.contains(field) && e.contains(says)),
            "{field}: {errors:?}"
        );
    }
}

/// `lbctl vip add` takes every setting a VIP has in the file: the table
/// its flags come from lists exactly the file's fields.
#[test]
fn every_vip_setting_of_the_file_has_an_lbctl_flag() {
    use std::collections::BTreeSet;
    let identity = ["address", "port", "protocol", "backends"];
    let mut file: BTreeSet<String> = fields_of::<RawVip>()
        .into_iter()
        .filter(|f| !identity.contains(&f.as_str()))
        .collect();
    let nested = |section: &str, fields: Vec<String>| {
        fields
            .into_iter()
            .map(|f| format!("{section}.{f}"))
            .collect::<Vec<_>>()
    };
    file.extend(nested("health_check", fields_of::<HealthCheck>()));
    file.extend(nested("health_check.http", fields_of::<HttpCheck>()));
    file.extend(nested(
        "passive_health",
        fields_of::<super::passive::PassiveHealth>(),
    ));
    file.extend(nested("quic", fields_of::<super::quic::QuicConfig>()));
    let flags: BTreeSet<String> = vip_settings::VIP_SETTINGS
        .iter()
        .map(|s| s.path.to_string())
        .collect();
    assert_eq!(file, flags, "VIP_SETTINGS and the file's VIP fields differ");
    assert!(
        vip_settings::VIP_SETTINGS
            .iter()
            .all(|s| !s.help.is_empty()),
        "every flag says what it does"
    );
}

#[test]
fn vip_settings_are_parsed_as_the_file_parses_them() {
    use std::collections::BTreeMap;
    let id: VipId = "10.0.0.9:443/tcp".parse().unwrap();
    let backends = [("10.1.0.1".parse().unwrap(), 2)];
    let settings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let v = vip_settings::vip_from_settings(
        &id,
        &backends,
        &settings(&[
            ("health_check", ""),
            ("health_check.http.path", "/ready"),
            ("health_check.interval", "1500ms"),
            ("health_check.send", "true"),
            ("second_chance", "true"),
            ("encap", "gue"),
            ("passive_health.enabled", "false"),
            ("min_healthy", "2"),
            ("hash", "src_ip,protocol"),
        ]),
    )
    .expect("valid settings");
    let check = v.health_check.as_ref().expect("a health check");
    assert_eq!(check.interval, std::time::Duration::from_millis(1500));
    assert_eq!(check.http.as_ref().map(|h| h.path.as_str()), Some("/ready"));
    assert_eq!(check.send.as_deref(), Some("true"), "text stays text");
    assert_eq!(
        (v.second_chance, v.encap, v.min_healthy),
        (true, Encap::Gue, 2)
    );
    assert!(!v.passive_health.enabled);
    assert_eq!(v.backends[0].weight, 2);
    assert_eq!(v.hash.names(), ["src_ip", "protocol"]);
    // A section flag alone turns the section on with its defaults.
    let v = vip_settings::vip_from_settings(&id, &backends, &settings(&[("health_check", "")]))
        .expect("valid settings");
    let check = v.health_check.expect("a health check");
    assert_eq!((check.rise, check.fall), (2, 3), "the defaults");
    // The file's rules and errors: a duration needs a unit, a setting
    // must exist, a quoted number stays a string the file would refuse.
    for (pairs, want) in [
        (vec![("health_check.interval", "5")], "unit"),
        (vec![("no_such", "1")], "unknown VIP setting"),
        (vec![("encap", "vxlan")], "unknown variant"),
        (vec![("health_check.rise", "two")], "invalid type"),
    ] {
        let e = vip_settings::vip_from_settings(&id, &backends, &settings(&pairs))
            .expect_err("refused");
        assert!(
            e.contains(want) && e.contains("10.0.0.9:443/tcp"),
            "{pairs:?}: {e}"
        );
    }
}

/// A VIP of a family no BGP peer can carry is refused: it would count as
/// announced while no router can learn it.
#[test]
fn a_vip_no_bgp_peer_can_carry_is_refused() {
    let bgp = |extra: &str, peer: &str| {
        format!(
            "{GOOD}announce:\n  bgp:\n    local_as: 65001\n    router_id: 10.0.0.11\n{extra}    peers:\n      - {{ address: {peer}, remote_as: 65000 }}\n"
        )
    };
    let e = errors(&bgp("", "10.0.0.1"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with(
            "vips[1].address: VIP [2001:db8::1]:*/udp is IPv6 and no BGP peer can carry it"
        ) && e[0].contains("next_hop_v6"),
        "{e:?}"
    );
    // A next hop for the family, an IPv6 peer, or another announcer: fine.
    Config::parse(&bgp("    next_hop_v6: fd00::11\n", "10.0.0.1")).expect("next_hop_v6");
    Config::parse(&bgp("", "fd00::1"))
        .map_err(|e| e.to_string())
        .expect_err("no IPv4 peer");
    let both = bgp("", "fd00::1").replace(
        "      - { address: fd00::1, remote_as: 65000 }\n",
        "      - { address: fd00::1, remote_as: 65000 }\n      - { address: 10.0.0.1, remote_as: 65000 }\n",
    );
    Config::parse(&both).expect("one peer of each family");
    let exec = format!("{}  exec:\n    command: [/bin/true]\n", bgp("", "10.0.0.1"));
    Config::parse(&exec).expect("the exec announcer may carry it");
    // Through the API the VIP is named, not a place in the file.
    let c = Config::parse(&bgp("", "10.0.0.1").replace(
        "  - address: 2001:db8::1\n    port: all\n    protocol: udp\n    encap: gre\n    conntrack: false\n    backends:\n      - address: fd00:1::1\n",
        "",
    ))
    .expect("IPv4 VIPs only");
    let mut vips = c.vips.clone();
    vips.push(VipConfig::new(
        "[2001:db8::7]:80/tcp".parse().unwrap(),
        vec![],
    ));
    let e = c.check_vips(&vips).expect_err("refused").to_string();
    assert!(e.contains("VIP [2001:db8::7]:80/tcp.address"), "{e}");
}

/// The ipvsadm habit of a backend with a port gets the reason, in the
/// file and on the command line.
#[test]
fn a_backend_with_a_port_is_told_why_it_takes_none() {
    let e = errors(&with("address: 10.1.0.2", "address: 10.1.0.2:8080"));
    assert!(
        e[0].starts_with("vips[0].backends[1].address: 10.1.0.2:8080: a backend takes no port")
            && e[0].contains("direct server return")
            && e[0].contains("write 10.1.0.2"),
        "{e:?}"
    );
    let cli = "10.1.0.2:8080=3"
        .parse::<crate::api::BackendSpec>()
        .unwrap_err();
    assert!(cli.contains("takes no port"), "{cli}");
    assert!(
        vip::parse_backend_address("[fd00::1]:80")
            .unwrap_err()
            .contains("write fd00::1")
    );
}

/// A VIP setting written without a value is a mistake to name, not a
/// request for its default; `health_check:` and `table_size:` without a
/// value mean "none", and `passive_health:` its defaults, as they always
/// have.
#[test]
fn a_vip_setting_without_a_value_is_refused() {
    let mut accepted = Vec::new();
    for setting in [
        "encap",
        "conntrack",
        "fragments",
        "drain_timeout",
        "slow_start",
        "panic_threshold",
        "min_healthy",
        "second_chance",
        "hash",
    ] {
        let text = with(
            "    protocol: tcp\n",
            &format!("    protocol: tcp\n    {setting}:\n"),
        );
        match Config::parse(&text) {
            Ok(_) => accepted.push(setting),
            Err(e) => assert!(e.to_string().contains("vips[0]"), "{setting}: {e}"),
        }
    }
    assert!(
        accepted.is_empty(),
        "accepted without a value: {accepted:?}"
    );
    for none in ["health_check", "table_size"] {
        let text = with(
            "    protocol: tcp\n",
            &format!("    protocol: tcp\n    {none}:\n"),
        );
        let c = Config::parse(&text).expect("valid");
        assert_eq!(
            (&c.vips[0].health_check, c.vips[0].table_size),
            (&None, None)
        );
    }
    let text = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    passive_health:\n",
    );
    let c = Config::parse(&text).expect("valid");
    assert_eq!(c.vips[0].passive_health, Default::default());
}

#[test]
fn quic_routes_by_server_id_and_its_rules_name_every_mistake() {
    let quic = |section: &str, backends: &str| {
        with(
            "    conntrack: false\n    backends:\n      - address: fd00:1::1\n",
            &format!("    conntrack: false\n{section}    backends:\n{backends}"),
        )
    };
    let two = "      - address: fd00:1::1\n        server_id: \"0a01\"\n      - address: fd00:1::2\n        server_id: \"0A02\"\n";
    let c =
        Config::parse(&quic("    quic: {server_id_len: 2, config_id: 3}\n", two)).expect("valid");
    let q = c.vips[1].quic.expect("quic on");
    assert_eq!((q.server_id_len, q.config_id), (2, 3));
    let sids: Vec<String> = c.vips[1]
        .backends
        .iter()
        .map(|b| b.server_id.as_ref().expect("sid").to_string())
        .collect();
    assert_eq!(sids, ["0a01", "0a02"], "hex, case-folded");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // Written back as read (the digest's form).
    let written = serde_yaml::to_string(&c.vips[1]).expect("write");
    assert!(
        written.contains("server_id: 0a01") && written.contains("server_id_len: 2"),
        "{written}"
    );

    // A backend without an ID is warned about; config_id defaults to 0.
    let c = Config::parse(&quic(
        "    quic: {server_id_len: 2}\n",
        "      - address: fd00:1::1\n",
    ))
    .expect("valid");
    assert_eq!(c.vips[1].quic.expect("on").config_id, 0);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("fd00:1::1") && w.contains("no server_id")),
        "{:?}",
        c.warnings
    );

    let cases = [
        (
            "    quic: {server_id_len: 0}\n",
            two,
            "vips[1].quic.server_id_len: 0 is out of range 1-15",
        ),
        (
            "    quic: {server_id_len: 16}\n",
            two,
            "vips[1].quic.server_id_len: 16 is out of range",
        ),
        (
            "    quic: {server_id_len: 2, config_id: 7}\n",
            two,
            "vips[1].quic.config_id: 7 is out of range 0-6",
        ),
        (
            "    quic: {server_id_len: 3}\n",
            two,
            "vips[1].backends[0].server_id: server ID 0a01 has 2 octets; the VIP's quic.server_id_len is 3",
        ),
        (
            "    quic: {server_id_len: 2}\n",
            "      - address: fd00:1::1\n        server_id: \"0a01\"\n      - address: fd00:1::2\n        server_id: \"0a01\"\n",
            "vips[1].backends[1].server_id: server ID 0a01 is also backend fd00:1::1's",
        ),
        (
            "",
            "      - address: fd00:1::1\n        server_id: \"0a01\"\n",
            "vips[1].backends[0].server_id: backend fd00:1::1 has a server_id but VIP [2001:db8::1]:*/udp has no quic: section",
        ),
        (
            "    quic: {server_id_len: 2}\n",
            "      - address: fd00:1::1\n        server_id: \"0a0\"\n",
            "is not a server ID: write its octets in hex",
        ),
        (
            "    quic: {server_id_len: 2}\n",
            "      - address: fd00:1::1\n        server_id: 1234\n",
            "server ID 1234 is a number",
        ),
        (
            "    quic: {server_id_len: 2}\n",
            "      - address: fd00:1::1\n        server_id: [10, 1]\n",
            "expected a server ID in hex, quoted (\"0a01\")",
        ),
    ];
    for (section, backends, want) in cases {
        let e = errors(&quic(section, backends));
        assert!(e.iter().any(|e| e.contains(want)), "want {want:?} in {e:?}");
    }
    // The largest length and config ID are allowed.
    let fifteen =
        "      - address: fd00:1::1\n        server_id: \"000102030405060708090a0b0c0d0e\"\n";
    let c = Config::parse(&quic(
        "    quic: {server_id_len: 15, config_id: 6}\n",
        fifteen,
    ));
    assert!(c.is_ok(), "{:?}", c.err().map(|e| e.to_string()));
    let tcp = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    quic: {server_id_len: 1}\n",
    );
    let e = errors(&tcp);
    assert!(
        e.iter()
            .any(|e| e.starts_with("vips[0].quic: ") && e.contains("UDP")),
        "{e:?}"
    );
}

/// `lbctl simulate --quic-cid` keeps a connection ID as written once it
/// is one, and refuses one that is not.
#[test]
fn a_connection_id_argument_is_kept_as_written() {
    assert_eq!(
        parse_cid_arg("0x27000231C0FFEE01"),
        Ok("0x27000231C0FFEE01".to_string())
    );
    for bad in ["", "0x", "abc", "zz", &"00".repeat(21)] {
        let e = parse_cid_arg(bad).expect_err(bad);
        assert!(e.contains("is not a connection ID"), "{bad}: {e}");
    }
}

/// The VIP rules' limits are inclusive: the most allowed passes, one more
/// is refused. `GOOD` has 2 VIPs of the default table size and 3 backends.
#[test]
fn vip_limits_are_inclusive() {
    // A third VIP, so that two TCP VIPs have second chance.
    let both = |s: &str| {
        s.replace(
            "    protocol: tcp\n",
            "    protocol: tcp\n    second_chance: true\n",
        ) + "  - address: 10.99.0.2\n    port: 80\n    protocol: tcp\n    second_chance: true\n    backends:\n      - address: 10.1.0.3\n"
    };
    let most_weight = format!("weight: {}", MAX_WEIGHT);
    for ok in [
        // The table pool is then exactly two VIPs' tables.
        format!("{GOOD}max_vips: 2\n"),
        format!("{GOOD}max_backends: 3\n"),
        both(&format!("second_chance_vips: 2\n{GOOD}")),
        with("weight: 2", &most_weight),
        with(
            "    protocol: tcp\n",
            "    protocol: tcp\n    panic_threshold: 100\n    slow_start: 1h\n    drain_timeout: 86400s\n",
        ),
    ] {
        let c = Config::parse(&ok);
        assert!(c.is_ok(), "{ok}: {:?}", c.err().map(|e| e.to_string()));
    }
    let too_heavy = format!("weight: {}", MAX_WEIGHT + 1);
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{GOOD}max_vips: 1\n"),
            "vips: 2 VIPs, but max_vips is 1",
        ),
        (
            format!("{GOOD}max_backends: 2\n"),
            "vips: 3 backends in all, but max_backends is 2",
        ),
        (
            both(&format!("second_chance_vips: 1\n{GOOD}")),
            "vips: 2 VIPs with second_chance, but second_chance_vips is 1",
        ),
        (
            with("weight: 2", &too_heavy),
            "vips[0].backends[0].weight: weight",
        ),
        (
            with(
                "    protocol: tcp\n",
                "    protocol: tcp\n    panic_threshold: 101\n",
            ),
            "vips[0].panic_threshold: 101% is out of range",
        ),
        (
            with(
                "    protocol: tcp\n",
                "    protocol: tcp\n    slow_start: 3601s\n",
            ),
            "vips[0].slow_start: is longer than an hour",
        ),
        (
            with(
                "    protocol: tcp\n",
                "    protocol: tcp\n    drain_timeout: 86401s\n",
            ),
            "vips[0].drain_timeout: is longer than a day",
        ),
    ];
    for (text, want) in cases {
        // (A table pool of one VIP is too small for two: a second error.)
        let e = errors(&text);
        assert!(e[0].starts_with(want), "want {want:?}, got {e:?}");
    }
}

/// Neither a VIP nor a backend may be an address that is not unicast,
/// and a port or an address of the wrong type says what is expected.
#[test]
fn vips_and_backends_are_unicast_and_typed() {
    for addr in ["0.0.0.0", "224.0.0.1", "255.255.255.255"] {
        let e = errors(&with("address: 10.99.0.1", &format!("address: {addr}")));
        assert!(
            e.iter()
                .any(|e| e.contains("cannot be a VIP: it is not a unicast address")),
            "{addr}: {e:?}"
        );
        let e = errors(&with("address: 10.1.0.1", &format!("address: {addr}")));
        assert!(
            e.iter()
                .any(|e| e.contains("cannot be a backend: it is not a unicast address")),
            "{addr}: {e:?}"
        );
    }
    let e = errors(&with("port: 80", "port: [80]"));
    assert!(
        e[0].contains("expected a port number 1-65535, or `all`"),
        "{e:?}"
    );
    let e = errors(&with("address: 10.1.0.1", "address: [10, 1, 0, 1]"));
    assert!(e[0].contains("expected an IP address"), "{e:?}");
}

#[test]
fn durations_are_bounded_inclusively() {
    // Each bound itself is allowed; one step past it is refused.
    for ok in [
        "gateway_refresh: 1s",
        "gateway_refresh: 1h",
        "shutdown_grace: 10m",
    ] {
        let c = Config::parse(&format!("{GOOD}{ok}\n"));
        assert!(c.is_ok(), "{ok}: {:?}", c.err().map(|e| e.to_string()));
    }
    for bad in ["gateway_refresh: 999ms", "gateway_refresh: 3601s"] {
        assert_eq!(
            errors(&format!("{GOOD}{bad}\n")),
            vec!["gateway_refresh: must be between 1s and 1h"],
            "{bad}"
        );
    }
    assert_eq!(
        errors(&format!("{GOOD}shutdown_grace: 601s\n")),
        vec!["shutdown_grace: is longer than 10 minutes"]
    );
}

#[test]
fn a_long_message_keeps_its_head_and_its_last_sixty_characters() {
    let message = format!("{}{} at line 7 column 3", "a".repeat(500), "é".repeat(440));
    let cut = cut_message(message.clone());
    let tail: String = message.chars().skip(message.chars().count() - 60).collect();
    assert_eq!(cut, format!("{} … {tail}", "a".repeat(200)));
    assert!(cut.ends_with("é at line 7 column 3"), "{cut}");
    // Short enough: untouched; one character more is cut.
    let short = "b".repeat(265);
    assert_eq!(cut_message(short.clone()), short);
    let long = "b".repeat(266);
    assert_eq!(cut_message(long).chars().count(), 200 + 3 + 60);
}

#[test]
fn serde_errors_split_into_field_and_message_only_at_a_path() {
    let text = "vips[0].port: invalid value: integer `70000` at line 9 column 11";
    let e = error::serde_error(text);
    assert_eq!(
        (e.field.as_str(), e.message.as_str()),
        (
            "vips[0].port",
            "invalid value: integer `70000` at line 9 column 11"
        )
    );
    // No path before the first ": " (words, nothing, serde's own phrase):
    // the whole text is the message.
    for text in [
        "invalid value: integer `5`, expected a string at line 3 column 7",
        "invalid type: map, expected a sequence",
        ": nothing before the colon",
    ] {
        let e = error::serde_error(text);
        assert_eq!((e.field.as_str(), e.message.as_str()), ("", text));
    }
}

#[test]
fn probes_through_the_tunnel_need_tcp_and_only_they_do() {
    // A TCP VIP may probe through the tunnel; a UDP VIP may probe
    // directly.
    let text = with(
        "    protocol: tcp\n",
        "    protocol: tcp\n    health_check: { through_tunnel: true }\n",
    )
    .replace(
        "    encap: gre\n",
        "    encap: gre\n    health_check: { port: 53 }\n",
    );
    let c = Config::parse(&text);
    assert!(c.is_ok(), "{:?}", c.err().map(|e| e.to_string()));
}

#[test]
fn ids_in_hex_are_one_to_most_octets() {
    assert_eq!(quic::parse_cid("0x27000231c0ffee01").unwrap().len(), 8);
    let longest = "ab".repeat(quic::MAX_CID_LEN);
    assert_eq!(quic::parse_cid(&longest).unwrap().len(), quic::MAX_CID_LEN);
    for bad in ["", "0x", "abc", "zz", &format!("{longest}cd")] {
        let e = quic::parse_cid(bad).expect_err(bad);
        assert!(e.contains("1 to 20 of them"), "{bad}: {e}");
    }
}

#[test]
fn encap_codes_round_trip_and_unknown_ones_are_none() {
    // What adoption reads back from the maps' entries.
    for e in [Encap::Ipip, Encap::Gre, Encap::Gue] {
        assert_eq!(Encap::from_code(e.code()), Some(e));
    }
    assert_eq!(Encap::from_code(0xff), None);
}

/// An instance name is 1-32 letters, digits, `-` and `_`.
#[test]
fn instance_names_are_bounded_inclusively() {
    let named = |name: &str| with("instance: t1", &format!("instance: {name}"));
    for good in ["lb_1-a", &"a".repeat(32)] {
        Config::parse(&named(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in [&"a".repeat(33), "lb.1", "lb 1"] {
        let e = errors(&named(bad));
        assert!(e[0].starts_with("instance: "), "{bad}: {e:?}");
    }
}

/// A part that does not parse is reported once: the rules do not repeat
/// it about the default it left behind. The errors of a VIP after one
/// that did not parse name its place in the file, and are reported (they
/// were dropped: the rules' numbers were compared with the file's before
/// they were renumbered).
#[test]
fn a_part_that_does_not_parse_is_one_error_and_later_vips_keep_their_index() {
    let e = errors(&with("interfaces: [eth0]", "interfaces: 5"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("interfaces"), "{e:?}");
    let text = with("  - address: 10.99.0.1\n", "  - address: 10.99.0.300\n").replacen(
        "    conntrack: false\n",
        "    conntrack: false\n    min_healthy: 5\n",
        1,
    );
    let e = errors(&text);
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].starts_with("vips[0].address"), "{e:?}");
    assert!(e[1].starts_with("vips[1].min_healthy"), "{e:?}");
}

/// Each size's bounds: the largest allowed value parses, the next one and
/// 0 do not.
#[test]
fn size_limits_are_inclusive() {
    let most_backends = lb_common::consts::MAX_BACKENDS;
    let cases: [(&str, u64, u64); 3] = [
        ("max_vips", 65_535, 65_536),
        (
            "max_backends",
            most_backends.into(),
            u64::from(most_backends) + 1,
        ),
        ("conntrack_buckets", 1 << 25, 1 << 26),
    ];
    for (key, most, over) in cases {
        let set = |n: u64| format!("{GOOD}{key}: {n}\n");
        Config::parse(&set(most)).unwrap_or_else(|e| panic!("{key}: {most}: {e}"));
        for bad in [over, 0] {
            let e = errors(&set(bad));
            assert!(e.iter().any(|e| e.starts_with(key)), "{key}: {bad}: {e:?}");
        }
    }
    let mtu = |n: u16| format!("{GOOD}mtu: {n}\n");
    Config::parse(&mtu(MIN_MTU)).expect("the least MTU");
    Config::parse(&mtu(0)).expect("0: no check");
    assert!(errors(&mtu(MIN_MTU - 1))[0].starts_with("mtu"));
    // A file's path that ends in `/` names a directory.
    let state = |path: &str| format!("{GOOD}state_file: {path}\n");
    for dir in ["/var/lib/lb/", "/var/lib/lb/.."] {
        let e = errors(&state(dir));
        assert!(
            e[0].contains("names a directory, not a file"),
            "{dir}: {e:?}"
        );
    }
    // A socket path of 107 bytes fits `sun_path` with its NUL; 108 do not.
    let socket = |len: usize| format!("{GOOD}api_socket: /run/{}\n", "s".repeat(len - 5));
    Config::parse(&socket(107)).expect("107 bytes");
    assert!(errors(&socket(108))[0].starts_with("api_socket"));
    let named = |name: &str| with("interfaces: [eth0]", &format!("interfaces: [{name}]"));
    Config::parse(&named(&"e".repeat(15))).expect("15 characters, as IFNAMSIZ allows");
    assert!(errors(&named(&"e".repeat(16)))[0].starts_with("interfaces[0]"));
    // Each fault alone: empty, a path, a blank inside.
    for bad in ["''", "a/b", "'a b'"] {
        let e = errors(&named(bad));
        assert!(
            e[0].contains("is not a valid interface name"),
            "{bad}: {e:?}"
        );
    }
}

/// A UDP VIP's probes are TCP, to its port unless one is named: said
/// (helper-37: a service without a TCP listener there was found down on
/// every backend, silently); with a port named, nothing to say.
#[test]
fn a_udp_vips_tcp_probes_are_said() {
    let dns = "  - address: 10.99.0.2\n    port: 53\n    protocol: udp\n    health_check: {HC}\n    backends:\n      - address: 10.1.0.1\n";
    let with = |hc: &str| format!("{GOOD}{}", dns.replace("{HC}", hc));
    let c = Config::parse(&with("{}")).expect("allowed");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("is UDP and probes are TCP, to port 53")),
        "{:?}",
        c.warnings
    );
    let c = Config::parse(&with("{port: 8053}")).expect("allowed");
    assert!(
        !c.warnings.iter().any(|w| w.contains("probes are TCP")),
        "{:?}",
        c.warnings
    );
}

//! `scripts/lb-backend-setup` on real backends: the rig is wired without
//! its backends' side of direct server return, the script sets each
//! backend up inside its namespace, and real client connections through
//! `lbd` must then reach the backend `lbctl simulate` names; a second run
//! changes nothing; `--undo` removes exactly what it added (a backend
//! undone stops answering, the other goes on); a dry run and bad input
//! change nothing. The script's state files live in the rig's directory,
//! removed with it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    netns::{Netns, veth},
    rig::{Backend, CLIENT, Lbd, Rig, VIP, bin_path},
    scenario::{check, predicted, serial},
    traffic::{Mode, tcp_request, udp_request},
};

use crate::{Scratch, output, repo, stdout};

/// Runs the script in `ns` with the built lbctl, recording into `state`.
fn script(ns: &Netns, state: &Path, args: &[&str]) -> Result<Output> {
    output(
        ns.command(repo("scripts/lb-backend-setup"))
            .arg("--state")
            .arg(state)
            .args(args)
            .env("LBCTL", bin_path("lbctl")?),
        "lb",
    )
}

/// As [`script`], which must succeed; its standard output.
fn script_ok(ns: &Netns, state: &Path, args: &[&str]) -> Result<String> {
    let out = script(ns, state, args)?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "lb-backend-setup {} failed ({}):\n{text}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

/// What the script may change in a namespace, for before/after
/// comparisons.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    vip_on_lo: bool,
    sysctls: Vec<(String, String)>,
    decap_attached: bool,
}

fn snapshot(ns: &Netns) -> Result<Snapshot> {
    let lo = ns.ip(&[
        "-o",
        "addr",
        "show",
        "dev",
        "lo",
        "to",
        &format!("{VIP}/32"),
    ])?;
    let mut sysctls = Vec::new();
    for key in [
        "all/arp_ignore",
        "all/arp_announce",
        "all/rp_filter",
        "eth0/rp_filter",
        "eth0/arp_ignore",
    ] {
        let out = ns.run("cat", &[&format!("/proc/sys/net/ipv4/conf/{key}")])?;
        sysctls.push((
            key.to_string(),
            String::from_utf8_lossy(&out.stdout).trim().into(),
        ));
    }
    let stats = ns
        .command(bin_path("lbctl")?)
        .args(["decap", "stats", "eth0"])
        .output()?;
    Ok(Snapshot {
        vip_on_lo: !lo.stdout.is_empty(),
        sysctls,
        decap_attached: stats.status.success(),
    })
}

fn sysctl<'a>(s: &'a Snapshot, key: &str) -> &'a str {
    s.sysctls
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or("?")
}

fn state_file(rig: &Rig, b: &Backend) -> PathBuf {
    rig.dir.join(format!("{}.setup-state", b.name))
}

/// Sets up every backend with the script, twice, checking what the first
/// run did and that the second changed nothing.
fn set_up(rig: &Rig) -> Result<()> {
    for b in &rig.backends {
        let state = state_file(rig, b);
        let said = script_ok(
            &b.ns,
            &state,
            &["--iface", "eth0", "--from-any", &VIP.to_string()],
        )?;
        for want in [
            format!("+ ip addr add {VIP}/32 dev lo"),
            "decap attach eth0".to_string(),
        ] {
            if !said.contains(&want) {
                bail!("{}: the script did not say `{want}`:\n{said}", b.name);
            }
        }
        // ARP settings before the VIP is on lo: never a moment in which
        // this host answers ARP for it.
        let arp = said.find("arp_ignore").context("no arp_ignore line")?;
        if said.find("ip addr add").is_some_and(|at| at < arp) {
            bail!("{}: the VIP went on lo before arp_ignore:\n{said}", b.name);
        }
        let after = snapshot(&b.ns)?;
        let want_rp = if b.name == "be1" { "2" } else { "0" };
        if !after.vip_on_lo
            || !after.decap_attached
            || sysctl(&after, "all/arp_ignore") != "1"
            || sysctl(&after, "all/arp_announce") != "2"
            || sysctl(&after, "eth0/rp_filter") != want_rp
        {
            bail!("{}: not set up as it should be: {after:?}\n{said}", b.name);
        }
        let recorded = std::fs::read_to_string(&state)?;
        let again = script_ok(
            &b.ns,
            &state,
            &["--iface", "eth0", "--from-any", &VIP.to_string()],
        )?;
        if again.lines().any(|l| l.starts_with("+ ")) {
            bail!("{}: a second run changed something:\n{again}", b.name);
        }
        if std::fs::read_to_string(&state)? != recorded || snapshot(&b.ns)? != after {
            bail!(
                "{}: a second run changed the record or the namespace",
                b.name
            );
        }
    }
    Ok(())
}

/// A client port whose new connection `lbctl simulate` sends to `name`.
fn port_for(lbd: &Lbd, rig: &Rig, name: &str, from: u16) -> Result<u16> {
    for port in from..from + 200 {
        if predicted(lbd, rig, port)? == name {
            return Ok(port);
        }
    }
    bail!("no port in {from}.. goes to {name}")
}

/// Connections and datagrams through the VIP: each reaches its predicted
/// backend, and both backends are reached.
fn traffic(rig: &Rig, lbd: &Lbd) -> Result<()> {
    let (vip, udp) = (rig.tcp_vip(), rig.udp_vip());
    let got: Vec<Result<String>> = rig.client.within(move || {
        (43_000..43_060)
            .map(|p| tcp_request(CLIENT, p, vip))
            .collect()
    })?;
    let mut seen = std::collections::BTreeSet::new();
    for (i, r) in got.into_iter().enumerate() {
        let port = 43_000 + i as u16;
        let backend = r.with_context(|| format!("connection from port {port}"))?;
        let want = predicted(lbd, rig, port)?;
        if backend != want {
            bail!("port {port} reached {backend}, lbctl simulate said {want}");
        }
        seen.insert(backend);
    }
    let answers: Vec<Result<String>> = rig.client.within(move || {
        (44_000..44_020)
            .map(|p| udp_request(CLIENT, p, udp))
            .collect()
    })?;
    for a in answers {
        seen.insert(a.context("a UDP request through the VIP")?);
    }
    if seen.len() != 2 {
        bail!("both backends should serve, saw {seen:?}");
    }
    Ok(())
}

/// `--undo` on be1: dry run first (changes nothing), then for real, then
/// again (nothing left to undo).
fn undo_be1(rig: &Rig, before: &Snapshot) -> Result<()> {
    let be1 = rig.backend("be1");
    let state = state_file(rig, be1);
    let set_up = snapshot(&be1.ns)?;
    let dry = script_ok(&be1.ns, &state, &["--undo", "--dry-run"])?;
    if !dry.contains(&format!("would run: ip addr del {VIP}/32 dev lo"))
        || snapshot(&be1.ns)? != set_up
    {
        bail!("a dry-run undo should plan and change nothing:\n{dry}");
    }
    // Without lbctl, the decap program stays (said, kept in the record)
    // and everything else is undone: the VIP off lo before the ARP
    // settings go back.
    let broken = output(
        be1.ns
            .command(repo("scripts/lb-backend-setup"))
            .args(["--state", &state.display().to_string(), "--undo"])
            .env("LBCTL", "/nonexistent/lbctl"),
        "lb",
    )?;
    let (said, err) = (
        String::from_utf8_lossy(&broken.stdout).into_owned(),
        String::from_utf8_lossy(&broken.stderr).into_owned(),
    );
    if broken.status.success() || !err.contains("stays on eth0") {
        bail!("an undo without lbctl should fail and say what stays:\n{said}{err}");
    }
    let off_lo = said.find("ip addr del").context("no ip addr del")?;
    if said.find("arp_ignore").is_some_and(|at| at < off_lo) {
        bail!("arp_ignore went back before the VIP left lo:\n{said}");
    }
    let left = snapshot(&be1.ns)?;
    if left.vip_on_lo || !left.decap_attached || std::fs::read_to_string(&state)? != "decap eth0\n"
    {
        bail!(
            "after an undo without lbctl: {left:?}, record {:?}",
            std::fs::read_to_string(&state)
        );
    }
    // Resumed with lbctl: only what was left is done.
    let said = script_ok(&be1.ns, &state, &["--undo"])?;
    if said.contains("ip addr del") || !said.contains("decap detach eth0") {
        bail!("a resumed undo should detach only:\n{said}");
    }
    let after = snapshot(&be1.ns)?;
    if after != *before {
        bail!("--undo should restore {before:?}, left {after:?}:\n{said}");
    }
    if state.exists() || be1.decap_pin_dir().exists() {
        bail!("--undo left its record or the decap pins behind");
    }
    let again = script_ok(&be1.ns, &state, &["--undo"])?;
    if !again.contains("nothing to undo") {
        bail!("a second --undo said {again:?}");
    }
    Ok(())
}

#[test]
fn backends_set_up_by_the_script_serve_through_lbd_and_undo_removes_it() {
    let _serial = serial();
    check((|| {
        let mut rig = Rig::without_backend_setup(2)?;
        // be1 starts with strict reverse-path filtering, which drops
        // decapsulated packets: the script must loosen it on eth0.
        rig.backend("be1")
            .ns
            .sysctl("net.ipv4.conf.all.rp_filter", "1")?;
        let before = snapshot(&rig.backend("be1").ns)?;
        if before.vip_on_lo || before.decap_attached {
            bail!("the rig set be1 up already: {before:?}");
        }
        set_up(&rig)?;
        for name in ["be1", "be2"] {
            rig.start_server(name, Mode::Echo)?;
        }
        let config = rig.dir.join("lbd.yaml");
        std::fs::write(&config, rig.config(&[Some(1), Some(1)]))?;
        let lbd = Lbd::start(&rig, &config)?;
        traffic(&rig, &lbd)?;

        undo_be1(&rig, &before)?;
        // be1 no longer decapsulates: its connections fail, be2's go on.
        let (p1, p2) = (
            port_for(&lbd, &rig, "be1", 45_000)?,
            port_for(&lbd, &rig, "be2", 45_000)?,
        );
        let vip = rig.tcp_vip();
        let (r1, r2) = rig
            .client
            .within(move || (tcp_request(CLIENT, p1, vip), tcp_request(CLIENT, p2, vip)))?;
        if let Ok(b) = r1 {
            bail!("a connection for be1 was answered by {b} after --undo");
        }
        r2.context("be2 should still serve")?;
        Ok(())
    })());
}

/// One namespace with an `eth0` (a veth to a second namespace).
fn lone_backend() -> Result<(Netns, Netns)> {
    let be = Netns::new(&lb_tests::netns::unique("lbsb"))?;
    let peer = Netns::new(&lb_tests::netns::unique("lbsp"))?;
    veth(&be, "eth0", &peer, "eth0", 1500)?;
    be.ip(&["addr", "add", "10.66.0.2/24", "dev", "eth0"])?;
    Ok((be, peer))
}

/// Runs the script, which must fail with `code` and say `message`.
fn refused(ns: &Netns, state: &Path, args: &[&str], code: i32, message: &str) -> Result<()> {
    let out = script(ns, state, args)?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(code) || !err.contains(message) {
        bail!(
            "lb-backend-setup {} should fail ({code}) saying {message:?}, got {} and {err:?}",
            args.join(" "),
            out.status
        );
    }
    Ok(())
}

#[test]
fn a_dry_run_and_bad_input_change_nothing() {
    let _serial = serial();
    check((|| {
        let (be, _peer) = lone_backend()?;
        let scratch = Scratch::new("setup")?;
        let state = scratch.path("state");
        let before = snapshot(&be)?;
        let vip = "10.99.0.1";
        let dry = script_ok(
            &be,
            &state,
            &["--dry-run", "--iface", "eth0", "--from-any", vip],
        )?;
        for want in [
            "would run: ip addr add 10.99.0.1/32 dev lo",
            "would set: /proc/sys/net/ipv4/conf/all/arp_ignore 0 -> 1",
            "decap attach eth0 --mode native --gue-port 6080 --from-any",
            "MTU and MSS on eth0 (MTU 1500)",
            "--set-mss 1440",
        ] {
            if !dry.contains(want) {
                bail!("the dry run did not say {want:?}:\n{dry}");
            }
        }
        refused(
            &be,
            &state,
            &["--iface", "eth0", "10.99.0.300"],
            2,
            "not an IP address",
        )?;
        // A record an older script wrote (the VIP before the ARP
        // settings): an undo still takes the VIP off lo first.
        let old = scratch.path("old-state");
        std::fs::write(&old, "addr 10.99.0.1/32\nsysctl all arp_ignore 0\n")?;
        let plan = script_ok(&be, &old, &["--undo", "--dry-run"])?;
        let (vip_at, arp_at) = (plan.find("10.99.0.1/32"), plan.find("arp_ignore -> 0"));
        if !matches!((vip_at, arp_at), (Some(v), Some(a)) if v < a) {
            bail!("an undo of an old record should start with the VIP:\n{plan}");
        }
        refused(&be, &state, &["--iface", "eth0"], 2, "no VIP given")?;
        refused(
            &be,
            &state,
            &["--iface", "nope0", vip],
            1,
            "no interface 'nope0'",
        )?;
        refused(&be, &state, &["--bogus", vip], 2, "unknown option --bogus")?;
        // lb's decap program takes tunnels from the prefixes given, or
        // from anywhere only when told so.
        refused(
            &be,
            &state,
            &["--decap", "lb", "--iface", "eth0", vip],
            1,
            "add --from with the balancers' addresses",
        )?;
        refused(
            &be,
            &state,
            &[
                "--decap",
                "lb",
                "--from",
                "10.98.0.0/16",
                "--from-any",
                "--iface",
                "eth0",
                vip,
            ],
            2,
            "exclude each other",
        )?;
        let args = [
            "--dry-run",
            "--iface",
            "eth0",
            "--from",
            "10.98.0.0/16",
            "--from",
            "fd00:98::/64",
            vip,
        ];
        let dry = script_ok(&be, &state, &args)?;
        if !dry.contains("decap attach eth0 --mode native --gue-port 6080 --from 10.98.0.0/16 --from fd00:98::/64") {
            bail!("the dry run should pass --from on to lbctl:\n{dry}");
        }
        refused(
            &be,
            &state,
            &["--from", "10.98.0.0/16;reboot", "--iface", "eth0", vip],
            2,
            "--from: a prefix",
        )?;
        refused(
            &be,
            &state,
            &[
                "--decap",
                "none",
                "--from",
                "10.98.0.0/16",
                "--iface",
                "eth0",
                vip,
            ],
            1,
            "--from needs lb's decap program",
        )?;
        kernel_decap(&be, &state)?;
        if snapshot(&be)? != before || state.exists() {
            bail!(
                "a dry run or a refused run changed something: {:?}",
                snapshot(&be)?
            );
        }
        Ok(())
    })());
}

/// `--decap kernel`: refused where the kernel has no ipip module (these
/// machines), planned with the kernel's tunl0 where it has one.
fn kernel_decap(be: &Netns, state: &Path) -> Result<()> {
    // What the script looks for: the module loaded or built in, or on disk.
    let release = stdout(Command::new("uname").arg("-r"), "coreutils")?;
    let on_disk = Command::new("find")
        .arg(format!("/lib/modules/{}", release.trim()))
        .args(["-name", "ipip.ko*"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let has_ipip = Path::new("/sys/module/ipip").exists() || on_disk;
    let args = [
        "--dry-run",
        "--decap",
        "kernel",
        "--iface",
        "eth0",
        "10.99.0.1",
    ];
    if has_ipip {
        let plan = script_ok(be, state, &args)?;
        if !plan.contains("tunl0") {
            bail!("--decap kernel should plan tunl0:\n{plan}");
        }
    } else {
        refused(be, state, &args, 1, "lacks a module")?;
    }
    // Whatever the modules: an IPv4 VIP in IPv6 IP-in-IP cannot be taken
    // off by the kernel's ip6tnl0.
    refused(
        be,
        state,
        &[
            "--dry-run",
            "--decap",
            "kernel",
            "--encap",
            "ipip6",
            "--iface",
            "eth0",
            "10.99.0.1",
        ],
        1,
        "cannot take an IPv4 VIP in an IPv6 IP-in-IP tunnel",
    )
}

#[test]
fn the_shell_scripts_pass_shellcheck() {
    check((|| {
        let scripts = [
            "scripts/lb-backend-setup",
            "scripts/debian/postinst",
            "scripts/debian/prerm",
            "scripts/debian/postrm",
        ];
        stdout(
            Command::new("shellcheck")
                .args(["--shell=sh", "--severity=style"])
                .args(scripts.iter().map(|s| repo(s))),
            "shellcheck",
        )?;
        Ok(())
    })());
}

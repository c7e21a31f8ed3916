//! `lbctl trace` with the real `lbd` in the namespace rig: a trace
//! filtered to the client and the VIP shows the packets of one known
//! connection as the datapath decided them; the backend it prints is the
//! one `lbctl simulate` predicts and the one that answered the client.
//!
//! Needs root (namespaces, XDP).

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, bin_path},
    scenario::{check, predicted, serial, setup},
    traffic::tcp_request,
};

#[test]
fn a_trace_shows_a_known_flow_at_the_backend_simulate_names() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(3, &[Some(1), Some(1), Some(1)])?;
        let vip = format!("{}/tcp", rig.tcp_vip());
        let sport = 45_123;
        let expected = predicted(&lbd, &rig, sport)?;
        // Four packets of the connection: SYN, ACK, the request, and more.
        let mut child = Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&lbd.socket)
            // A bare address: that one client.
            .args(["-o", "json", "trace", "--vip", &vip, "--client"])
            .arg(CLIENT.to_string())
            .args(["--count", "4"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // lbctl takes the lease before it reads the ring; a lbd that has
        // just started may still be verifying the traced program, and
        // lbctl waits for it (a second here, a minute in an emulated
        // guest): poll, with a generous safety net.
        let asked = std::time::Instant::now();
        while lbd.lbctl_json(&["status"])?["trace_active"] != true
            && asked.elapsed() < Duration::from_secs(120)
            && child.try_wait()?.is_none()
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "the trace was active {:?} after lbctl trace started",
            asked.elapsed()
        );
        if lbd.lbctl_json(&["status"])?["trace_active"] != true {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            bail!("lbctl trace runs but lbd says no trace is active; lbctl said: {err}");
        }
        let vip_addr = rig.tcp_vip();
        let answered = rig
            .client
            .within(move || tcp_request(CLIENT, sport, vip_addr))??;
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("lbctl trace did not see 4 packets within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        child
            .stdout
            .take()
            .context("stdout")?
            .read_to_string(&mut out)?;
        let mut err = String::new();
        child
            .stderr
            .take()
            .context("stderr")?
            .read_to_string(&mut err)?;
        if !child.wait()?.success() {
            bail!("lbctl trace failed: {err}");
        }
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .with_context(|| format!("lbctl trace -o json printed:\n{out}"))?;
        eprintln!("$ lbctl trace --vip {vip} --client {CLIENT} --count 4 -o json\n{out}");
        lb_tests::schema::check_output(&["-o", "json", "trace"], &out)?;
        let times: Vec<&str> = lines.iter().filter_map(|l| l["time"].as_str()).collect();
        let stamped = |t: &&str| {
            let b = t.as_bytes();
            t.len() == 24
                && b[10] == b'T'
                && b[19] == b'.'
                && b[20..23].iter().all(u8::is_ascii_digit)
                && b[23] == b'Z'
        };
        if times.len() != lines.len() || !times.iter().all(stamped) || !times.is_sorted() {
            bail!("trace lines without UTC millisecond times in order: {times:?}");
        }
        let be = rig.backend(&expected).addr.to_string();
        if answered != expected {
            bail!("simulate said {expected}, but {answered} answered");
        }
        let syn = &lines[0];
        if syn["outcome"] != "fwd_maglev_new_flow"
            || syn["client_port"] != sport
            || syn["backend"] != be.as_str()
            || !syn["via"].as_str().unwrap_or("").starts_with("maglev slot")
        {
            bail!("the SYN's line: {syn}; expected {be} by a maglev slot");
        }
        let slot = lbd.simulate_syn(sport)?["slot"].clone();
        if syn["via"] != format!("maglev slot {slot}") {
            bail!("the trace says {}, lbctl simulate slot {slot}", syn["via"]);
        }
        let ack = &lines[1];
        if ack["outcome"] != "fwd_handshake" || ack["backend"] != be.as_str() {
            bail!("the ACK's line: {ack}; expected {be}, where its SYN went");
        }
        for l in &lines[2..] {
            if l["outcome"] != "fwd_conntrack_hit" || l["backend"] != be.as_str() {
                bail!("a later packet's line: {l}; expected {be} by the connection table");
            }
        }
        // simulate without the client's port: a few ports, each as
        // simulate with that port says.
        let rows = lbd.lbctl_json(&["simulate", &vip, &CLIENT.to_string(), "--syn"])?;
        let rows = rows.as_array().context("rows")?;
        if rows.len() < 3 {
            bail!("simulate without a port showed {} ports", rows.len());
        }
        for row in rows {
            let port = row["client_port"].as_u64().context("client_port")?;
            let one = lbd.simulate_syn(u16::try_from(port)?)?;
            if one["backend"] != row["backend"] || one["slot"] != row["slot"] {
                bail!("port {port}: {row} without the port, {one} with it");
            }
        }
        // The lease was given back: the datapath no longer traces.
        if lbd.lbctl_json(&["status"])?["trace_active"] != false {
            bail!("the trace is still active after lbctl trace exited");
        }
        Ok(())
    })());
}

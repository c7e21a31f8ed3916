//! `lbctl trace` with the real `lbd` in the namespace rig: a trace
//! filtered to the client and the VIP shows the packets of one known
//! connection as the datapath decided them; the backend it prints is the
//! one `lbctl simulate` predicts and the one that answered the client. A
//! packet passed to the stack is traced with what it carried.
//!
//! Needs root (namespaces, XDP).

use std::{
    net::{SocketAddrV4, UdpSocket},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, bin_path},
    scenario::{KillOnDrop, check, predicted, serial, setup},
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
        let client = CLIENT.to_string();
        // A bare address: that one client.
        let args = ["--vip", &vip, "--client", &client, "--count", "4"];
        let child = start_trace(&lbd, &args)?;
        let vip_addr = rig.tcp_vip();
        let answered = rig
            .client
            .within(move || tcp_request(CLIENT, sport, vip_addr))??;
        let (lines, out) = trace_lines(child)?;
        eprintln!("$ lbctl trace --vip {vip} --client {CLIENT} --count 4 -o json\n{out}");
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

/// A packet the datapath does not forward is traced too, with the
/// addresses and ports it carried: UDP from the client to the TCP VIP's
/// address on a port no VIP serves, which `lb_xdp` passes to the stack.
#[test]
fn a_trace_shows_a_packet_that_is_not_forwarded() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let client = CLIENT.to_string();
        let mut child = start_trace(&lbd, &["--client", &client, "--count", "2"])?;
        let to = SocketAddrV4::new(*rig.tcp_vip().ip(), 9);
        let sport = 45_321;
        // One datagram every 50 ms until lbctl has seen two packets.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !child.exited()? && Instant::now() < deadline {
            rig.client.within(move || -> Result<()> {
                UdpSocket::bind((CLIENT, sport))?.send_to(b"not for a VIP", to)?;
                Ok(())
            })??;
            std::thread::sleep(Duration::from_millis(50));
        }
        let (lines, out) = trace_lines(child)?;
        let ours: Vec<_> = lines
            .iter()
            .filter(|l| l["protocol"] == "udp" && l["dst_port"] == 9)
            .collect();
        if ours.is_empty() {
            bail!("no line for the datagrams to {to}:\n{out}");
        }
        for l in ours {
            if l["outcome"] != "pass_not_vip"
                || l["client"] != client.as_str()
                || l["client_port"] != sport
                || l["dst"] != to.ip().to_string().as_str()
                || !l["backend"].is_null()
                || l["bytes"].as_u64() != Some(14 + 20 + 8 + 13)
            {
                bail!(
                    "the datagram's line: {l}; expected pass_not_vip from {client}:{sport} to {to}, 55 bytes, no backend"
                );
            }
        }
        Ok(())
    })());
}

/// Starts `lbctl -o json trace ARGS` and waits until `lbd` says the trace
/// is active.
fn start_trace(lbd: &Lbd, args: &[&str]) -> Result<KillOnDrop> {
    let mut child = KillOnDrop::new(
        Command::new(bin_path("lbctl")?)
            .arg("--socket")
            .arg(&lbd.socket)
            .args(["-o", "json", "trace"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    // lbctl takes the lease before it reads the ring; a lbd that has
    // just started may still be verifying the traced program, and
    // lbctl waits for it (a second here, a minute in an emulated
    // guest): poll, with a generous safety net.
    let asked = Instant::now();
    while lbd.lbctl_json(&["status"])?["trace_active"] != true
        && asked.elapsed() < Duration::from_secs(120)
        && !child.exited()?
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "the trace was active {:?} after lbctl trace started",
        asked.elapsed()
    );
    if lbd.lbctl_json(&["status"])?["trace_active"] != true {
        let out = child.kill_with_output()?;
        bail!(
            "lbctl trace runs but lbd says no trace is active; lbctl said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(child)
}

/// The lines a trace started by [`start_trace`] printed once it has seen
/// the packets it counts (within 10 s), and its output as printed.
fn trace_lines(child: KillOnDrop) -> Result<(Vec<serde_json::Value>, String)> {
    let output = child
        .wait_with_output(Duration::from_secs(10))
        .context("lbctl trace did not see its packets within 10 s")?;
    let out = String::from_utf8(output.stdout)?;
    if !output.status.success() {
        bail!(
            "lbctl trace failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let lines = out
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("lbctl trace -o json printed:\n{out}"))?;
    lb_tests::schema::check_output(&["-o", "json", "trace"], &out)?;
    Ok((lines, out))
}

//! `lb-demo` (run by `cargo xtask demo`): builds the namespace rig, starts
//! the real `lbd` with `config/demo.yaml`, drives real TCP and UDP
//! connections through the VIP, prints what happened, and tears it all
//! down. `--keep` leaves the rig running and says how to poke it;
//! `--down` removes a kept rig.

use std::{
    collections::BTreeMap,
    net::SocketAddrV4,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use lb_tests::{
    rig::{CLIENT, Lbd, Rig, TCP_PORT, UDP_PORT, VIP, bin_path, require_root},
    traffic::{Servers, tcp_request, udp_request},
};

/// Where a kept rig's inventory is written.
const INVENTORY: &str = "/run/lb/demo.rig";

#[derive(Parser)]
#[command(about = "Run lb in a namespace rig with real connections")]
struct Args {
    /// Leave the rig running after the summary.
    #[arg(long)]
    keep: bool,
    /// Remove a rig left by --keep.
    #[arg(long)]
    down: bool,
    /// The demo's configuration (default: config/demo.yaml of this checkout).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Internal: run the test servers of one backend (used with --keep).
    #[arg(long, hide = true)]
    serve: Option<String>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("lb-demo: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if let Some(name) = args.serve {
        // Runs until killed.
        // Started inside the backend's namespace by nsenter: serve there.
        let _servers = Servers::start(
            "/proc/self/ns/net",
            &name,
            TCP_PORT,
            SocketAddrV4::new(VIP, UDP_PORT),
        )?;
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    require_root()?;
    if args.down {
        return down();
    }
    if Path::new(INVENTORY).exists() {
        bail!("a demo rig is still up (see {INVENTORY}); remove it with `cargo xtask demo --down`");
    }
    let config = match args.config {
        Some(c) => c,
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo.yaml"),
    }
    .canonicalize()
    .context("config/demo.yaml")?;
    let parsed = lb::config::Config::load(&config)?;

    step("building the rig: client, router, balancer, 3 backends (network namespaces)");
    let rig = Rig::without_servers(3)?;
    // Servers as processes, so that --keep can leave them running.
    let mut servers = Vec::new();
    for b in &rig.backends {
        let child =
            b.ns.command(std::env::current_exe()?)
                .args(["--serve", &b.name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting a backend server")?;
        servers.push(child);
    }
    let result = demo(&rig, &config, &parsed, args.keep);
    if args.keep && result.is_ok() {
        let mut inventory = rig.keep()?;
        for s in &servers {
            inventory.push(format!("pid {}", s.id()));
        }
        inventory.push(format!("pins {}", parsed.pin_dir().display()));
        inventory.push(format!("file {}", parsed.state_file.display()));
        std::fs::create_dir_all("/run/lb")?;
        std::fs::write(INVENTORY, inventory.join("\n") + "\n")?;
        return Ok(());
    }
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    let _ = std::fs::remove_dir_all(parsed.pin_dir());
    let _ = std::fs::remove_file(&parsed.state_file);
    drop(rig);
    if result.is_ok() {
        step("torn down: namespaces, pinned maps and programs removed");
    }
    result
}

fn step(msg: &str) {
    println!("==> {msg}");
}

fn demo(rig: &Rig, config: &Path, parsed: &lb::config::Config, keep: bool) -> Result<()> {
    // A previous run that was interrupted may have left pins for the
    // instance; start from a clean slate.
    let _ = std::fs::remove_dir_all(parsed.pin_dir());
    let _ = std::fs::remove_file(&parsed.state_file);
    step(&format!("starting lbd --config {}", config.display()));
    let lbd = Lbd::start(rig, config)?;
    wait_for_servers(rig)?;

    step("200 TCP connections to 10.99.0.1:80, each sending a line and reading it back");
    let vip = rig.tcp_vip();
    let started = Instant::now();
    let tcp: Vec<Result<String>> = rig.client.within(move || {
        (20_000..20_200)
            .map(|p| tcp_request(CLIENT, p, vip))
            .collect()
    })?;
    let tcp_secs = started.elapsed().as_secs_f64();
    step("60 UDP queries to 10.99.0.1:53");
    let uvip = rig.udp_vip();
    let udp: Vec<Result<String>> = rig.client.within(move || {
        (30_000..30_060)
            .map(|p| udp_request(CLIENT, p, uvip))
            .collect()
    })?;

    println!();
    println!("Per-backend split (backend names come from the servers' greetings):");
    let weights = [
        ("be1", "10.10.31.2", 1),
        ("be2", "10.10.32.2", 1),
        ("be3", "10.10.33.2", 2),
    ];
    let (tcp_split, tcp_failed) = tally(tcp);
    let (udp_split, udp_failed) = tally(udp);
    println!(
        "  {:<5} {:<12} {:>6} {:>10} {:>9} {:>9}",
        "", "address", "weight", "expected", "TCP", "UDP"
    );
    for (name, addr, w) in weights {
        println!(
            "  {:<5} {:<12} {:>6} {:>9.0}% {:>5} {:>2.0}% {:>5} {:>2.0}%",
            name,
            addr,
            w,
            100.0 * w as f64 / 4.0,
            tcp_split.get(name).copied().unwrap_or(0),
            100.0 * tcp_split.get(name).copied().unwrap_or(0) as f64 / 200.0,
            udp_split.get(name).copied().unwrap_or(0),
            100.0 * udp_split.get(name).copied().unwrap_or(0) as f64 / 60.0,
        );
    }
    println!(
        "  TCP: {} of 200 succeeded in {tcp_secs:.1}s; UDP: {} of 60 answered (UDP weights are equal)",
        200 - tcp_failed,
        60 - udp_failed
    );
    println!("  Replies went from the backends straight to the client (direct server return).");
    println!();
    println!("$ lbctl status");
    print!("{}", indent(&lbd.lbctl(&["status"])?));
    println!();
    println!("$ lbctl stats");
    print!("{}", indent(&lbd.lbctl(&["stats"])?));
    println!();
    println!("$ lbctl table 10.99.0.1:80/tcp");
    print!("{}", indent(&lbd.lbctl(&["table", "10.99.0.1:80/tcp"])?));
    println!();
    println!("$ lbctl simulate 10.99.0.1:80/tcp 10.10.1.2:20000");
    print!(
        "{}",
        indent(&lbd.lbctl(&["simulate", "10.99.0.1:80/tcp", "10.10.1.2:20000"])?)
    );
    println!();
    if tcp_failed > 0 || udp_failed > 0 {
        bail!("{tcp_failed} TCP and {udp_failed} UDP requests failed");
    }
    if keep {
        let lbctl = bin_path("lbctl")?;
        let sock = parsed.api_socket.display();
        println!("The rig is still running. Try:");
        println!(
            "  ip netns exec {} bash -c 'exec 3<>/dev/tcp/10.99.0.1/80; head -1 <&3'   # which backend answers",
            rig.client.name
        );
        println!("  {} --socket {sock} stats", lbctl.display());
        println!(
            "  {} --socket {sock} backend weight 10.99.0.1:80/tcp 10.10.31.2 5",
            lbctl.display()
        );
        println!(
            "  ip netns list    # the rig's namespaces start with {}",
            rig.id
        );
        println!("Remove it with: cargo xtask demo --down");
        std::mem::forget(lbd);
    } else {
        drop(lbd);
    }
    Ok(())
}

fn tally(results: Vec<Result<String>>) -> (BTreeMap<String, u32>, u32) {
    let mut split = BTreeMap::new();
    let mut failed = 0;
    for r in results {
        match r {
            Ok(name) => *split.entry(name).or_default() += 1,
            Err(e) => {
                failed += 1;
                if failed <= 3 {
                    eprintln!("  request failed: {e:#}");
                }
            }
        }
    }
    (split, failed)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// The server processes need a moment to bind.
fn wait_for_servers(rig: &Rig) -> Result<()> {
    for b in &rig.backends {
        let addr = b.addr;
        let ok = b.ns.within(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if std::net::TcpStream::connect(SocketAddrV4::new(addr, TCP_PORT)).is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            false
        })?;
        if !ok {
            bail!("the server in {} did not start", b.name);
        }
    }
    Ok(())
}

fn down() -> Result<()> {
    let text = match std::fs::read_to_string(INVENTORY) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no demo rig is up");
            return Ok(());
        }
        Err(e) => return Err(e).context(INVENTORY),
    };
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    // Processes first (lbd is found by its socket's owner: kill by name in
    // the demo's namespace).
    for line in &lines {
        if let Some(pid) = line.strip_prefix("pid ") {
            let _ = Command::new("kill").arg(pid).status();
        }
        if let Some(ns) = line.strip_prefix("netns ")
            && ns.ends_with("-lb")
        {
            let _ = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .map(|o| {
                    for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                        let _ = Command::new("kill").arg(pid).status();
                    }
                });
        }
        if let Some(file) = line.strip_prefix("file ") {
            let _ = std::fs::remove_file(file);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    Rig::remove_inventory(&lines);
    std::fs::remove_file(INVENTORY)?;
    println!("demo rig removed");
    Ok(())
}

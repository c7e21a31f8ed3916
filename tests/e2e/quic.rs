//! QUIC connections that survive a client's address change, end to end:
//! real `quinn` servers on the backends (behind `lb_decap`) issue QUIC-LB
//! connection IDs carrying their server ID (`lb_quic`), 50 clients connect
//! through `lbd`, and then every one of them moves (a new source port,
//! then a second client address) and keeps exchanging. Between the two,
//! a few move to a port another connection had (on another server), as a
//! NAT reuses ports: the connection table still holds that tuple. With
//! `quic:` on the VIP, every connection stays on its server, also across
//! a backend added while they run; with it off, the same moves break
//! connections (the test prints how many), which is what `quic:` is for.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    quic::{Client, Identity, serve, server_id, socket_in},
    rig::{CLIENT, Lbd, Rig, VIP},
    scenario::{check, serial},
};

const QUIC_PORT: u16 = 443;
const CONNECTIONS: usize = 50;
/// The client's second address, on the same link.
const CLIENT_2: Ipv4Addr = Ipv4Addr::new(10, 10, 1, 3);
/// Exchanges per connection after each move.
const ROUNDS: usize = 3;
/// Connections moved to a port another connection had.
const REUSED: usize = 5;

/// How long a connection that should survive may take to answer: long
/// enough for a busy machine or an emulated guest (a broken connection
/// never answers: its packets reach a server that does not know it).
fn patience() -> Duration {
    if std::env::var_os("LB_VM_GUEST").is_some() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(10)
    }
}

/// The rig's configuration with a UDP VIP on port 443 for the backends
/// `members` (indexes), with `quic:` or without.
fn config(rig: &Rig, members: &[usize], quic: bool) -> String {
    let mut text = rig.config(&[Some(1), Some(1), None]);
    text.push_str(&format!(
        "  - address: {VIP}\n    port: {QUIC_PORT}\n    protocol: udp\n"
    ));
    if quic {
        let c = lb_tests::quic::cid_config();
        text.push_str(&format!(
            "    quic: {{server_id_len: {}, config_id: {}}}\n",
            c.server_id_len(),
            c.config_id()
        ));
    }
    text.push_str("    backends:\n");
    for &i in members {
        text.push_str(&format!("      - address: {}\n", rig.backends[i].addr));
        if quic {
            let [a, b] = server_id(i);
            text.push_str(&format!("        server_id: \"{a:02x}{b:02x}\"\n"));
        }
    }
    text
}

/// Where each connection is, and how many broke.
struct Tally {
    /// The backend each connection answered from first.
    first: Vec<String>,
    /// The connections that broke, each with its first failure.
    broken: std::collections::BTreeMap<usize, String>,
}

/// Runs every client's exchanges: `ROUNDS` each, all connections at once;
/// a connection that fails or answers from another backend is broken
/// (once).
async fn exchange_all(clients: &[Arc<Client>], tally: &mut Tally, phase: &str, patience: Duration) {
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        set.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..ROUNDS {
                seen.push(c.exchange(patience).await.map_err(|e| format!("{e:#}")));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (i, seen)
        });
    }
    while let Some(joined) = set.join_next().await {
        let Ok((i, seen)) = joined else {
            tally
                .broken
                .insert(usize::MAX, format!("{phase}: a client task panicked"));
            continue;
        };
        let wrong = seen
            .iter()
            .find(|s| s.as_deref() != Ok(tally.first[i].as_str()));
        if let Some(wrong) = wrong {
            let what = format!("{phase}: on {}, got {wrong:?}", tally.first[i]);
            tally.broken.entry(i).or_insert(what);
        }
    }
}

/// The QUIC rig: three backends serving, `lbd` with be1 and be2 in the
/// QUIC VIP. Returns the moves' tally.
async fn migrate(rig: &Rig, lbd: &Lbd, identity: &Identity, quic: bool) -> Result<Tally> {
    let vip = SocketAddr::new(IpAddr::V4(VIP), QUIC_PORT);
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let socket = socket_in(&rig.client, SocketAddr::new(CLIENT.into(), 0))?;
        clients.push(Arc::new(Client::connect(identity, socket, vip).await?));
    }
    let mut first = Vec::new();
    for c in &clients {
        first.push(c.exchange(patience()).await.context("a first exchange")?);
    }
    let spread: std::collections::BTreeSet<&String> = first.iter().collect();
    if spread.len() != 2 {
        bail!("50 connections should reach both members; they reached {spread:?}");
    }
    let mut tally = Tally {
        first,
        broken: Default::default(),
    };
    if quic {
        // be3 joins: new flows may hash to it, no established one moves.
        std::fs::write(rig.dir.join("lbd.yaml"), config(rig, &[0, 1, 2], true))?;
        lbd.lbctl(&["reload"])?;
        exchange_all(&clients, &mut tally, "after be3 joined", patience()).await;
    }
    let wait = if quic {
        patience()
    } else {
        Duration::from_secs(3)
    };
    let ports = clients
        .iter()
        .map(|c| c.endpoint.local_addr())
        .collect::<std::io::Result<Vec<_>>>()?;
    for c in &clients {
        c.rebind(socket_in(&rig.client, SocketAddr::new(CLIENT.into(), 0))?)?;
    }
    exchange_all(&clients, &mut tally, "new port", wait).await;
    let reused = reuse_ports(rig, &clients, &tally.first, &ports)?;
    println!("{reused} connections moved to a port another connection had");
    exchange_all(&clients, &mut tally, "a reused port", wait).await;
    for c in &clients {
        c.rebind(socket_in(&rig.client, SocketAddr::new(CLIENT_2.into(), 0))?)?;
    }
    exchange_all(&clients, &mut tally, "new address", wait).await;
    for c in &clients {
        c.conn.close(0u32.into(), b"done");
    }
    Ok(tally)
}

/// Moves `REUSED` clients each to the first address (`ports`) of a
/// connection on another server, freed since: the connection table holds
/// that tuple for the old connection's server. Fails if none could move.
fn reuse_ports(
    rig: &Rig,
    clients: &[Arc<Client>],
    first: &[String],
    ports: &[SocketAddr],
) -> Result<usize> {
    let mut taken = std::collections::BTreeSet::new();
    for (i, c) in clients.iter().enumerate() {
        if taken.len() == REUSED {
            break;
        }
        let other = (1..clients.len())
            .map(|k| (i + k) % clients.len())
            .find(|j| first[*j] != first[i] && !taken.contains(j));
        // A port taken again since (another client's new port) is skipped.
        if let Some(j) = other
            && let Ok(socket) = socket_in(&rig.client, ports[j])
        {
            c.rebind(socket)?;
            taken.insert(j);
        }
    }
    if taken.is_empty() {
        bail!("no connection could move to another's old port: the reuse is untested");
    }
    Ok(taken.len())
}

/// Builds the rig, starts the servers and `lbd`, and migrates.
fn run(quic: bool) -> Result<Tally> {
    let rig = Rig::without_servers(3)?;
    rig.client
        .ip(&["addr", "add", &format!("{CLIENT_2}/24"), "dev", "eth0"])?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let identity = Identity::new()?;
    let _servers = runtime.block_on(async {
        rig.backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let socket = socket_in(&b.ns, SocketAddr::new(IpAddr::V4(VIP), QUIC_PORT))?;
                serve(&identity, socket, &b.name, server_id(i))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let file = rig.dir.join("lbd.yaml");
    std::fs::write(&file, config(&rig, &[0, 1], quic))?;
    let lbd = Lbd::start(&rig, &file)?;
    let tally = runtime.block_on(migrate(&rig, &lbd, &identity, quic))?;
    if quic && lbd.counter("fwd_quic_cid")? == 0 {
        bail!("no packet was routed by its connection ID");
    }
    Ok(tally)
}

#[test]
fn quic_connections_keep_their_server_when_the_client_moves() {
    let _serial = serial();
    check((|| {
        let tally = run(true)?;
        println!(
            "quic on: {CONNECTIONS} connections moved twice (port, address) and across a backend added: {} broken",
            tally.broken.len()
        );
        if !tally.broken.is_empty() {
            bail!("connections broke with quic on: {:#?}", tally.broken);
        }
        Ok(())
    })());
}

#[test]
fn without_quic_routing_the_same_moves_break_connections() {
    let _serial = serial();
    check((|| {
        let tally = run(false)?;
        println!(
            "quic off: {} of {CONNECTIONS} connections broke when their client moved",
            tally.broken.len()
        );
        for (i, what) in tally.broken.iter().take(5) {
            println!("  connection {i}: {what}");
        }
        if tally.broken.is_empty() {
            bail!("no connection broke without quic routing: the test does not test the moves");
        }
        Ok(())
    })());
}

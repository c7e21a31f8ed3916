//! `lbctl simulate VIP CLIENT[:PORT]`: which backend a flow gets, asked of
//! `lbd` as [`Request::Simulate`]. The VIP is written as everywhere else
//! (`10.0.0.1:80/tcp`); the client's port may be left out, and then the
//! answer for a few ports shows whether the backend depends on it.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

use anyhow::{Result, bail};
use clap::Args;
use lb::{
    api::{self, Request, Simulation},
    config::VipId,
};

/// `lbctl simulate ...`
#[derive(Args)]
pub struct SimulateArgs {
    /// The VIP, e.g. 10.0.0.1:80/tcp or [2001:db8::1]:443/tcp (for a VIP
    /// of all ports, the port the client connects to).
    vip: VipId,
    /// The client, with its port (192.0.2.7:40000, [2001:db8::7]:40000)
    /// or without (192.0.2.7): then the answer for a few ports.
    client: String,
    /// As a TCP SYN (a new connection: skips the connection table).
    #[arg(long)]
    syn: bool,
    /// As a short-header QUIC packet to this connection ID, in hex: a UDP
    /// VIP with quic: names the server its server ID says.
    #[arg(long, value_parser = lb::config::parse_cid_arg)]
    quic_cid: Option<String>,
}

/// The client ports shown when none is given: spread over the ephemeral
/// range, enough to see whether the backend depends on the port.
const SAMPLE_PORTS: [u16; 6] = [33_000, 38_211, 43_522, 48_733, 53_944, 59_155];

/// The client address and port, if one is written.
fn parse_client(s: &str) -> Result<(IpAddr, Option<u16>)> {
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Ok((addr, None));
    }
    match s.parse::<SocketAddr>() {
        Ok(sa) if sa.port() != 0 => Ok((sa.ip(), Some(sa.port()))),
        Ok(_) => bail!("{s}: the client's port must be 1-65535"),
        Err(_) => bail!(
            "{s} is not a client; write ADDRESS or ADDRESS:PORT, e.g. 192.0.2.7, 192.0.2.7:40000 or [2001:db8::7]:40000"
        ),
    }
}

pub fn run(socket: &Path, args: SimulateArgs, json: bool) -> Result<()> {
    if args.vip.port == 0 {
        bail!(
            "{}: name the port the client connects to, e.g. {}",
            args.vip,
            VipId {
                port: 443,
                ..args.vip
            }
        );
    }
    let (client, port) = parse_client(&args.client)?;
    let ask = |sport: u16| -> Result<Simulation> {
        let request = Request::Simulate {
            src: client,
            dst: args.vip.addr,
            protocol: args.vip.proto,
            sport,
            dport: args.vip.port,
            syn: args.syn,
            quic_cid: args.quic_cid.clone(),
        };
        Ok(serde_json::from_value(api::call(socket, &request)?)?)
    };
    if let Some(sport) = port {
        let answer = ask(sport)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(());
        }
        return crate::print::print_simulation(answer);
    }
    let answers = SAMPLE_PORTS
        .iter()
        .map(|&p| Ok((p, ask(p)?)))
        .collect::<Result<Vec<_>>>()?;
    if json {
        let rows: Vec<serde_json::Value> = answers
            .iter()
            .map(|(p, s)| {
                let mut row = serde_json::to_value(s)?;
                row["client_port"] = (*p).into();
                Ok(row)
            })
            .collect::<Result<_>>()?;
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print_by_port(&answers);
    Ok(())
}

/// The answers for [`SAMPLE_PORTS`]: one line when the port does not
/// matter (every port hashes to one slot: the VIP's hash leaves the port
/// out), else a line per port. Ports that merely land on one backend
/// prove nothing of the others.
fn print_by_port(answers: &[(u16, Simulation)]) {
    let backend = |s: &Simulation| s.backend.map_or("none".to_string(), |b| b.to_string());
    let first = &answers[0].1;
    if answers
        .iter()
        .all(|(_, s)| s.hash == first.hash && backend(s) == backend(first))
    {
        println!(
            "backend   {} for any client port: this VIP's hash leaves the port out",
            backend(first)
        );
        println!("via       {}", first.via);
        return;
    }
    println!("the backend depends on the client's port; for a few ports:");
    let rows = answers
        .iter()
        .map(|(p, s)| vec![p.to_string(), backend(s), s.slot.to_string(), s.via.clone()])
        .collect();
    crate::print::print_rows(&["client port", "backend", "slot", "via"], rows);
}

#[cfg(test)]
mod tests {
    use super::parse_client;

    #[test]
    fn a_client_is_an_address_with_or_without_its_port() {
        let v4: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let v6: std::net::IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!(parse_client("192.0.2.7").unwrap(), (v4, None));
        assert_eq!(parse_client("192.0.2.7:40000").unwrap(), (v4, Some(40000)));
        assert_eq!(parse_client("2001:db8::7").unwrap(), (v6, None));
        assert_eq!(
            parse_client("[2001:db8::7]:40000").unwrap(),
            (v6, Some(40000))
        );
        for bad in ["192.0.2.7:0", "192.0.2.7:70000", "client", "192.0.2.7/24"] {
            assert!(parse_client(bad).is_err(), "{bad}");
        }
    }
}

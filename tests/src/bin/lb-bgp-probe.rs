//! `lb-bgp-probe CONFIG.json`: lb's BGP speaker in a process of its own,
//! for tests that need to freeze it (SIGSTOP) without freezing the test.
//! The configuration is a [`BgpConfig`] as JSON. It prints `ready`, then
//! answers one line per command read from stdin:
//!
//! - `set [VIP...]` → `ok`: the announced set becomes exactly these VIPs;
//! - `status` → the peers' status as one line of JSON;
//! - `shutdown` → `ok` once routes are withdrawn and Cease is sent; exits.
//!
//! Errors are answered `error: ...`. Logs go to stderr (`RUST_LOG`).

use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{Context as _, Result};
use lb::announce::{Announcer as _, BgpConfig, BgpSpeaker, PeerStatus};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "lb=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let path = std::env::args()
        .nth(1)
        .context("usage: lb-bgp-probe CONFIG.json")?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let config: BgpConfig =
        serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(config))
}

async fn run(config: BgpConfig) -> Result<()> {
    let mut stdout = tokio::io::stdout();
    let mut speaker = match BgpSpeaker::start(config) {
        Ok(s) => s,
        Err(e) => {
            stdout.write_all(format!("error: {e}\n").as_bytes()).await?;
            return Err(e.into());
        }
    };
    stdout.write_all(b"ready\n").await?;
    stdout.flush().await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let mut words = line.split_whitespace();
        let answer = match words.next() {
            Some("set") => words
                .map(|w| {
                    w.parse::<IpAddr>()
                        .with_context(|| format!("{w} is not an address"))
                })
                .collect::<Result<BTreeSet<IpAddr>>>()
                .and_then(|set| Ok(speaker.set_announced(&set)?))
                .map(|()| "ok".to_string()),
            Some("status") => {
                let rows: Vec<_> = speaker.status().into_iter().map(PeerStatus::row).collect();
                Ok(serde_json::to_string(&rows)?)
            }
            Some("shutdown") => {
                let result = speaker.shutdown().await;
                let answer = match result {
                    Ok(()) => "ok\n".to_string(),
                    Err(e) => format!("error: {e}\n"),
                };
                stdout.write_all(answer.as_bytes()).await?;
                stdout.flush().await?;
                return Ok(());
            }
            other => Err(anyhow::anyhow!("unknown command {other:?}")),
        };
        let line = match answer {
            Ok(a) => format!("{a}\n"),
            Err(e) => format!("error: {e:#}\n"),
        };
        stdout.write_all(line.as_bytes()).await?;
        stdout.flush().await?;
    }
    // stdin closed: leave cleanly.
    speaker.shutdown().await?;
    Ok(())
}

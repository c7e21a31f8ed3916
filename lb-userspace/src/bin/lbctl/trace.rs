//! `lbctl trace`: takes `lbd`'s trace lease for a filter, reads the
//! pinned ring buffer of events, prints one line (or JSON object) per
//! packet as the datapath decided it, renews the lease every few seconds,
//! and gives it back on exit — after N packets, or Ctrl-C.

use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use clap::Args;
use lb::{
    api::{self, Request, TraceLeased, TraceRequest},
    config::VipId,
    trace::{Reader, describe},
};

/// `lbctl trace ...`
#[derive(Args)]
pub struct TraceArgs {
    /// Only packets to this VIP, e.g. 10.0.0.1:80/tcp.
    #[arg(long)]
    vip: Option<VipId>,
    /// Only packets from this client (192.0.2.7) or prefix of clients
    /// (192.0.2.0/24).
    #[arg(long)]
    client: Option<String>,
    /// Stop after this many packets (default: until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
}

/// Set by SIGINT/SIGTERM: stop, give the lease back.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(socket: &Path, args: TraceArgs, json: bool) -> Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Not 0 (which no event carries), and unlike a concurrent trace's.
    let session = (std::process::id() << 16 ^ nanos) | 1;
    let on = Request::TraceLease(TraceRequest::On {
        session,
        vip: args.vip,
        client: args.client.clone(),
    });
    let leased: TraceLeased = serde_json::from_value(lease(socket, &on)?)?;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let result = follow(socket, &on, &leased, session, args.count, json);
    let _ = api::call(socket, &Request::TraceLease(TraceRequest::Off { session }));
    result
}

/// How long `lbctl trace` waits for a `lbd` that is still verifying the
/// traced program (a minute at most on an emulated machine, a second or
/// two on a real one).
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Takes the lease; while `lbd` answers that the traced program is not
/// verified yet, says so once and asks again every second, for
/// [`READY_WAIT`] at most.
fn lease(socket: &Path, on: &Request) -> Result<serde_json::Value> {
    let started = std::time::Instant::now();
    let mut told = false;
    loop {
        match api::call(socket, on) {
            Err(api::ClientError::Daemon {
                code: Some(api::ErrorKind::Unavailable),
                message,
            }) if started.elapsed() < READY_WAIT => {
                if !told {
                    eprintln!("{message}; waiting");
                    told = true;
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            other => return Ok(other?),
        }
    }
}

/// Prints events until `count` or a signal, renewing the lease.
fn follow(
    socket: &Path,
    on: &Request,
    leased: &TraceLeased,
    session: u32,
    count: Option<u64>,
    json: bool,
) -> Result<()> {
    let mut reader = Reader::open(Path::new(&leased.events)).map_err(anyhow::Error::msg)?;
    let renew_every = Duration::from_secs_f64(leased.lease_secs / 3.0);
    let mut renewed = Instant::now();
    let mut shown = 0u64;
    while !STOP.load(Ordering::Relaxed) {
        for event in reader.drain(session) {
            let m = lb::trace::table_size_of(&event, leased.table_size, &leased.table_sizes);
            let Some(line) = describe(&event, m) else {
                continue;
            };
            // The time the event was read: within a poll (5 ms) of the
            // packet, which carries no time of its own.
            let time = lb::daemon::humantime_millis(std::time::SystemTime::now());
            if json {
                let mut value = serde_json::to_value(&line)?;
                value["time"] = time.into();
                println!("{value}");
            } else {
                println!(
                    "{time} {}:{} -> {}:{}/{} {} {} ({}{}) {} bytes",
                    line.client,
                    line.client_port,
                    line.dst,
                    line.dst_port,
                    line.protocol,
                    line.outcome,
                    line.backend.map_or("-".into(), |b| format!("-> {b}")),
                    line.via,
                    line.encap.map(|e| format!(", {e}")).unwrap_or_default(),
                    line.bytes
                );
            }
            shown += 1;
            if count.is_some_and(|n| shown >= n) {
                return Ok(());
            }
        }
        if renewed.elapsed() >= renew_every {
            if let Err(e) = api::call(socket, on) {
                bail!("renewing the trace: {e}");
            }
            renewed = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

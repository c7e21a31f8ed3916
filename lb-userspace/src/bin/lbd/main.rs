//! `lbd`: the balancer daemon. Loads and pins the XDP program, owns the
//! configuration, programs the maps through the reconciler, announces the
//! VIPs to the routers (`announce:`), and serves the control API that
//! `lbctl` speaks. Logs go to standard error.
//!
//! `lbd --config FILE` runs it; `lbd --config FILE teardown` detaches the
//! program and removes every pinned object of the instance (this drops the
//! connection table).

mod run;
mod server;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use lb::{config::Config, dataplane::kernel::KernelDataplane};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(version, about = "lb: XDP layer-4 load balancer daemon")]
struct Args {
    /// Configuration file (YAML); before or after the subcommand.
    #[arg(short, long, global = true, default_value = "/etc/lb/lb.yaml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the balancer (the default).
    Run,
    /// Check the configuration file and exit.
    Check,
    /// Detach the program from the configured interfaces and remove every
    /// pinned map and link of this instance (drops the connection table).
    Teardown,
}

fn main() {
    if let Err(e) = run() {
        // The chain in one message, not a debug dump: `lbd check` is read
        // by people.
        eprintln!("lbd: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_target(false)
        // Standard output is ExaBGP's command channel when lbd runs under
        // it (`announce: exabgp`): logs never go there.
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.command.unwrap_or(Command::Run) {
        Command::Check => {
            let config = Config::load(&args.config)?;
            let files = config.announce.check_files();
            if !files.is_empty() {
                return Err(lb::config::ConfigErrors {
                    source_name: Some(args.config.display().to_string()),
                    errors: files,
                }
                .into());
            }
            for w in &config.warnings {
                println!("warning: {w}");
            }
            println!("{}: ok", args.config.display());
            Ok(())
        }
        Command::Teardown => teardown(&args.config),
        Command::Run => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(run::run(args.config)),
    }
}

fn teardown(path: &std::path::Path) -> Result<()> {
    let config = Config::load(path)?;
    // Refused while an lbd runs the instance: it would re-pin what we remove.
    let _lock = lock_instance(&config)?;
    remove_pins(&config)?;
    let dir = config.pin_dir();
    println!(
        "detached from {} and removed {}",
        config.interfaces.join(", "),
        dir.display()
    );
    Ok(())
}

/// Locks the instance's pin directory for as long as the lock lives (the
/// daemon's lifetime, or a teardown): a second `lbd` of the instance is
/// refused with the holder's PID.
pub(crate) fn lock_instance(config: &Config) -> Result<lb::lock::DirLock> {
    Ok(lb::lock::DirLock::acquire(
        &config.pin_dir(),
        &format!("instance `{}`", config.instance),
        "instance",
    )?)
}

/// Detaches the program from the configured interfaces and removes every
/// pinned object of the instance (`lbd teardown`, `detach_on_exit`).
pub(crate) fn remove_pins(config: &Config) -> Result<()> {
    let dir = config.pin_dir();
    for iface in &config.interfaces {
        KernelDataplane::detach(iface, &dir)?;
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

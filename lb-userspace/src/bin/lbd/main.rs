//! `lbd`: the balancer daemon. Loads and pins the XDP program, owns the
//! configuration, programs the maps through the reconciler, announces the
//! VIPs to the routers (`announce:`), and serves the control API that
//! `lbctl` speaks. Logs go to standard error.
//!
//! `lbd --config FILE` runs it; `lbd --config FILE teardown` detaches the
//! program and removes every pinned object of the instance (this drops the
//! connection table).

mod check;
mod notify;
mod run;
mod server;
mod tier;

/// The library's scratch directories for unit tests (compiled into its
/// own tests only, so included here for this binary's).
#[cfg(test)]
#[path = "../../scratch.rs"]
mod scratch;
#[cfg(test)]
use scratch::ScratchDir;

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use lb::{
    cli_docs::Generated,
    config::{Config, LogFormat},
    dataplane::KernelDataplane,
};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "lbd", version = lb::VERSION, about = "lb: XDP layer-4 load balancer daemon")]
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
    /// Check the configuration file and exit: as a reload of the lbd that
    /// runs the file would (if one does), or as a start would.
    Check {
        /// The file to check (default: the one --config names).
        file: Option<PathBuf>,
        /// Leave out what only this box can say (the interfaces, the
        /// running lbd, pinned maps, key files that are not here): for a
        /// file meant for another box.
        #[arg(long)]
        offline: bool,
    },
    /// Detach the program from the configured interfaces and remove every
    /// pinned map and link of this instance (drops the connection table).
    Teardown,
    /// Writes man pages or shell completions into DIR (used to build the
    /// package).
    #[command(name = "__generate", hide = true)]
    Generate { what: Generated, dir: PathBuf },
}

fn main() {
    if let Err(e) = run() {
        // The chain in one message, not a debug dump: `lbd check` is read
        // by people.
        eprintln!("lbd: {e:#}");
        std::process::exit(1);
    }
}

/// Logs to standard error in the configured format (text by default).
fn init_logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_target(false)
        // Standard output is ExaBGP's command channel when lbd runs under
        // it (`announce: exabgp`): logs never go there.
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            use std::io::IsTerminal as _;
            let builder = builder.with_ansi(std::io::stderr().is_terminal());
            // journald stamps every line itself.
            if std::env::var_os("JOURNAL_STREAM").is_some() {
                builder.without_time().init();
            } else {
                builder.init();
            }
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    // The format is a setting of the file: read it first (errors in the
    // file are reported by the command itself, in text).
    let format = match args.command {
        None | Some(Command::Run) => Config::load(&args.config)
            .map(|c| c.log_format)
            .unwrap_or_default(),
        _ => LogFormat::Text,
    };
    init_logging(format);
    let command = args.command.unwrap_or(Command::Run);
    if matches!(command, Command::Run | Command::Teardown) {
        require_capabilities(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())?;
    }
    match command {
        Command::Check { file, offline } => {
            check::check(file.as_ref().unwrap_or(&args.config), offline)
        }
        Command::Teardown => teardown(&args.config),
        Command::Generate { what, dir } => generate(what, &dir),
        Command::Run => {
            raise_open_files();
            run_daemon(args.config)
        }
    }
}

fn run_daemon(config: PathBuf) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run::run(config))
}

/// Raises the soft limit on open files to the hard one. Every probe
/// holds a socket for up to its timeout, and thousands of probed backends
/// passed the soft limit systemd sets (1,024); probes then failed here and
/// counted against healthy backends. A failure is a warning, not fatal.
/// Commands an exec announcer runs keep the limit `lbd` started with.
fn raise_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read one rlimit we own.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && {
            lb::announce::commands_keep_open_files_limit(limit.rlim_cur);
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
        }
    };
    if !raised {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "could not raise the limit on open files; thousands of probes may run out of descriptors"
        );
    }
}

/// The capabilities `lbd` needs, as the unit grants them: loading and
/// pinning programs and maps (`CAP_BPF`), reading program information and
/// tracing (`CAP_PERFMON`), attaching to interfaces and marking probes
/// (`CAP_NET_ADMIN`).
const CAPABILITIES: [(u32, &str); 3] =
    [(39, "CAP_BPF"), (38, "CAP_PERFMON"), (12, "CAP_NET_ADMIN")];

/// Fails once, saying what is missing, unless the effective capabilities
/// (`CapEff` in `status`, the text of /proc/self/status) hold every one of
/// [`CAPABILITIES`]. Without it, `lbd` run by a user fails later, at the
/// first file or map it may not touch, with a bare "Operation not
/// permitted".
fn require_capabilities(status: &str) -> Result<()> {
    let Some(eff) = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
    else {
        return Ok(()); // cannot tell: let the kernel say
    };
    let missing: Vec<&str> = CAPABILITIES
        .iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    bail!(
        "lbd needs root (or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, as lbd.service grants them); missing {}",
        missing.join(", ")
    )
}

/// `lbd check`: the file's VIPs whose table size differs from the one in
/// the maps pinned for the instance (the running `lbd`'s): every flow of
/// such a VIP remaps, and a reload that does it needs `--force`.
pub(crate) fn table_size_changes(config: &Config) -> Vec<String> {
    let pinned = match lb::dataplane::pinned_table_sizes(&config.pin_dir()) {
        Ok(Some(pinned)) => pinned,
        Ok(None) => return Vec::new(),
        Err(e) => {
            return vec![format!(
                "the pinned maps in {} cannot be read ({e}): table_size changes against the running lbd are not checked",
                config.pin_dir().display()
            )];
        }
    };
    let pinned: std::collections::HashMap<_, _> = pinned.into_iter().collect();
    config
        .vips
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let was = *pinned.get(&v.id.key())?;
            let m = v.maglev_size(&config.layout);
            (was != m).then(|| {
                format!(
                    "vips[{i}]: VIP {}: table_size {was} (running) -> {m} remaps every flow of the VIP; the reload needs `lbctl reload --force`",
                    v.id
                )
            })
        })
        .collect()
}

/// Writes lbd's man pages or completions into `dir` (for the package).
fn generate(what: Generated, dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory as _;
    lb::cli_docs::generate(Args::command(), "lbd", what, dir)
        .with_context(|| format!("writing into {}", dir.display()))
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
pub(crate) fn lock_instance(config: &Config) -> Result<lb::DirLock> {
    Ok(lb::DirLock::acquire(
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Args;

    #[test]
    fn missing_capabilities_are_named_once() {
        let root = "Name:\tlbd\nCapEff:\t000001ffffffffff\n";
        assert!(super::require_capabilities(root).is_ok());
        let user = "CapEff:\t0000000000000000\n";
        let e = super::require_capabilities(user).unwrap_err().to_string();
        assert!(
            e.starts_with("lbd needs root")
                && e.ends_with("missing CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),
            "{e}"
        );
        // The unit's three: enough.
        let unit = format!("CapEff:\t{:016x}\n", (1u64 << 39) | (1 << 38) | (1 << 12));
        assert!(super::require_capabilities(&unit).is_ok());
    }

    /// Every command and argument of lbd says what it does in plain words,
    /// and the README shows each command.
    #[test]
    fn help_and_man_pages_describe_every_command_in_plain_words() {
        let cmd = Args::command().name("lbd");
        let problems = lb::cli_docs::doc_problems(&cmd);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let pages = lb::cli_docs::render_man_pages(&cmd).expect("renders");
        assert_eq!(pages.len(), 4, "lbd, run, check, teardown");
        let readme = include_str!("../../../../README.md");
        for c in lb::cli_docs::leaf_commands(&cmd) {
            assert!(
                readme.contains(&format!("lbd {c}")),
                "README never shows lbd {c}"
            );
        }
    }

    /// The soft limit on open files is raised to the hard one: lowered
    /// here first (this test's process, put back by the call under test).
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_one() {
        let get = || {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: writes one rlimit we own.
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
            l
        };
        let hard = get().rlim_max;
        let lowered = libc::rlimit {
            rlim_cur: 256.min(hard),
            rlim_max: hard,
        };
        // SAFETY: reads one rlimit we own.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        super::raise_open_files();
        assert_eq!(get().rlim_cur, hard);
    }
}

//! `lbctl`: the operator's CLI. Every command but `decap` is a request to
//! `lbd` over its control socket, parsed straight into
//! [`lb::api::Request`] (the one statement of each request) and printed
//! by [`print`]; `decap` installs the backend-side program on this
//! machine ([`decap`]). Human-readable tables by default, `-o json` for
//! scripts.

mod change;
mod complete;
mod decap;
mod drain;
mod print;
mod simulate;
mod tier;
mod top;
mod trace;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use lb::{
    api::{self, ChangeOptions, Committed, NodeChange, NodeRequest, Request, VipRequest},
    cli_docs::Generated,
};
use serde::de::DeserializeOwned;

#[derive(Parser)]
#[command(name = "lbctl", version = lb::VERSION, about = "Control an lb balancer (lbd)")]
struct Args {
    /// lbd's control socket (default: /run/lb/<instance>.sock).
    #[arg(short, long, global = true)]
    socket: Option<PathBuf>,
    /// Instance name, used to find the socket.
    #[arg(short, long, global = true, default_value = "default")]
    instance: String,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    change: ChangeOptions,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Api(Request),
    /// The backend-side decapsulation program on this machine.
    #[command(subcommand)]
    Decap(decap::DecapCommand),
    /// Follow packets as the datapath decides them: client, VIP, outcome,
    /// backend, connection table or Maglev slot, tunnel; until --count or
    /// Ctrl-C.
    Trace(trace::TraceArgs),
    /// Which backend a flow gets, and why: by the connection table, its
    /// recent SYN or the Maglev slot; for a second-chance VIP, the
    /// alternates a packet without entry carries.
    Simulate(simulate::SimulateArgs),
    /// The balancer live, full screen: totals, drops and malformed by
    /// reason, peers, and each VIP and backend (state, live flows, pps,
    /// bps), refreshed every second; s sorts, q quits. Off a terminal or
    /// with --once: one plain snapshot.
    Top(top::TopArgs),
    /// Writes man pages or shell completions into DIR (used to build the
    /// package).
    #[command(name = "__generate", hide = true)]
    Generate { what: Generated, dir: PathBuf },
}

fn main() {
    // Like any Unix tool: a closed pipe (`lbctl bgp | head -1`) ends the
    // process quietly, instead of a panic in println!.
    // SAFETY: restoring the default disposition of SIGPIPE before any
    // thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Run by a shell to complete a command line: answers and exits.
    clap_complete::CompleteEnv::with_factory(|| {
        use clap::CommandFactory as _;
        complete::command(Args::command())
    })
    .var(complete::VAR)
    .completer("lbctl")
    .complete();
    let args = Args::parse();
    let json = args.output == Output::Json;
    // `lbctl diff` exits as diff(1) does: 0 no change, 1 changes, 2 trouble.
    let trouble = match args.command {
        Command::Api(Request::Diff { .. }) => 2,
        _ => 1,
    };
    match run(args) {
        Ok(code) => std::process::exit(code),
        Err(e) => fail(&e, json, trouble),
    }
}

/// Reports `e` and exits with `code`.
fn fail(e: &anyhow::Error, json: bool, exit: i32) -> ! {
    // With `-o json`, lbd's refusal also goes to stdout as JSON, its
    // stable code beside the message, for scripts to branch on.
    if json
        && let Some(lb::api::ClientError::Daemon { code, message }) =
            e.downcast_ref::<lb::api::ClientError>()
    {
        let refusal = serde_json::json!({ "ok": false, "code": code, "error": message });
        println!("{refusal}");
    }
    eprintln!("lbctl: {e:#}");
    std::process::exit(exit)
}

/// The change options are lbd's: a command lbctl runs itself would
/// ignore them, and `decap detach --dry-run` would detach for real.
fn refuse_local_change_options(args: &Args) -> Result<()> {
    let local = match &args.command {
        Command::Decap(_) => "decap",
        Command::Trace(_) => "trace",
        Command::Simulate(_) => "simulate",
        Command::Top(_) => "top",
        Command::Generate { .. } => "generate",
        Command::Api(_) => return Ok(()),
    };
    if args.change.is_default() {
        return Ok(());
    }
    anyhow::bail!(
        "--dry-run and --confirm-within apply to changes lbd makes (vip, backend, reload, revert, tier rollout); `lbctl {local}` takes neither"
    )
}

/// Why `lbd` cannot read a file `lbctl diff` names that is here: the unit
/// runs it sandboxed (`PrivateTmp`, `ProtectHome`), so `/tmp`, `/home` and
/// `/root` are not the ones the operator sees. `None` unless `error` is
/// lbd's failure to read `path` and this process can read it.
fn unseen_file_hint(path: &std::path::Path, error: &str) -> Option<String> {
    let unread = error.contains(&format!("cannot read {}: No such file", path.display()));
    (unread && std::fs::File::open(path).is_ok()).then(|| {
        format!(
            "lbd cannot see {}, which is here: its unit runs it with a private /tmp and without /home and /root (PrivateTmp, ProtectHome); put the file where lbd reads, e.g. /etc/lb/",
            path.display()
        )
    })
}

/// Runs the command; the exit code is 0 but for a `diff` that found
/// changes (1).
fn run(args: Args) -> Result<i32> {
    let json = args.output == Output::Json;
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/run/lb/{}.sock", args.instance)));
    refuse_local_change_options(&args)?;
    let mut request = match args.command {
        Command::Decap(cmd) => return decap::run(cmd, json).map(|()| 0),
        Command::Trace(t) => return trace::run(&socket, t, json).map(|()| 0),
        Command::Simulate(s) => return simulate::run(&socket, s, json).map(|()| 0),
        Command::Top(t) => return top::run(&socket, t, json).map(|()| 0),
        Command::Generate { what, dir } => return generate(what, &dir).map(|()| 0),
        Command::Api(request) => request,
    };
    // lbd reads the file: make a relative path relative to here.
    if let Request::Diff {
        file: Some(path), ..
    } = &mut request
        && path.is_relative()
    {
        *path = std::env::current_dir()?.join(&*path);
    }
    if let Request::Tier(api::TierRequest::Rollout {
        file: Some(path),
        text,
        ..
    }) = &mut request
    {
        *text = Some(tier::read_desired(path)?);
    }
    let data = api::call_with(&socket, &request, &args.change).inspect_err(|e| {
        // Said beside the error, which stays lbd's own (its code for -o
        // json).
        if let Request::Diff {
            file: Some(path), ..
        } = &request
            && let Some(hint) = unseen_file_hint(path, &e.to_string())
        {
            eprintln!("hint: {hint}");
        }
    })?;
    let lines = matches!(
        request,
        Request::Backend(api::BackendRequest::Drain { wait: true, .. })
    ) && !args.change.dry_run;
    if json && lines {
        // JSON Lines: the backend's state follows, line by line.
        println!("{}", serde_json::to_string(&data)?);
    } else if json {
        println!("{}", serde_json::to_string_pretty(&data)?);
    } else {
        show(&request, data.clone())?;
    }
    if let Request::Node(NodeRequest::Drain { no_wait: false }) = request {
        wait_grace(decode(data.clone())?, json);
    }
    if let Request::Backend(api::BackendRequest::Drain {
        vip,
        address,
        wait: true,
        ..
    }) = request
        && !args.change.dry_run
    {
        return drain::wait_drained(&socket, vip, address, json);
    }
    if let Request::Diff { .. } = request {
        let c: Committed = decode(data)?;
        return Ok(i32::from(c.preview.is_some_and(|p| !p.is_empty())));
    }
    Ok(0)
}

/// Prints `data`, the answer to `request`, as a table or a line.
fn show(request: &Request, data: serde_json::Value) -> Result<()> {
    match request {
        Request::Status => print::print_status(decode(data)?),
        Request::Vip(VipRequest::List) => print::print_vips(decode(data)?),
        Request::Vip(VipRequest::Add(a)) => committed(data, &format!("added VIP {}", a.vip)),
        Request::Vip(VipRequest::Del { vip }) => committed(data, &format!("deleted VIP {vip}")),
        Request::Backend(b) => committed(data, &describe_backend(b)),
        Request::Stats => print::print_stats(decode(data)?),
        Request::Health => print::print_health(decode(data)?),
        Request::Table { .. } => print::print_table(decode(data)?),
        Request::Simulate { .. } => print::print_simulation(decode(data)?),
        Request::Conns { .. } => {
            print::print_conns(&decode(data)?);
            Ok(())
        }
        Request::Reload { .. } => committed(data, "reloaded"),
        Request::Diff { .. } => {
            let c: Committed = decode(data)?;
            if let Some(p) = &c.preview {
                change::print_preview(p);
            }
            Ok(())
        }
        Request::History { .. } => {
            change::print_history(&decode::<Vec<api::RevisionRow>>(data)?);
            Ok(())
        }
        Request::Revert { .. } => committed(data, "reverted"),
        Request::Confirm => committed(data, "confirmed"),
        Request::TraceLease(_) => Ok(()),
        Request::Bgp => print::print_bgp(decode(data)?),
        Request::Node(NodeRequest::Drain { .. }) => {
            print::print_node_change(&decode(data)?, "drained", "withdrew");
            Ok(())
        }
        Request::Node(NodeRequest::Undrain) => {
            print::print_node_change(&decode(data)?, "serving", "announced");
            Ok(())
        }
        Request::Overrides(api::OverridesRequest::List) => {
            change::print_overrides(&decode::<Vec<api::OverrideRow>>(data)?);
            Ok(())
        }
        Request::Overrides(api::OverridesRequest::Clear { .. }) => {
            committed(data, "cleared runtime changes: the file decides")
        }
        Request::Tier(api::TierRequest::Status) => {
            tier::print_tier_status(&decode(data)?);
            Ok(())
        }
        Request::Tier(api::TierRequest::Rollout { .. }) => {
            tier::print_rollout_plan(&decode(data)?);
            Ok(())
        }
    }
}

fn committed(data: serde_json::Value, what: &str) -> Result<()> {
    change::print_committed(&decode(data)?, what);
    Ok(())
}

fn describe_backend(b: &api::BackendRequest) -> String {
    use api::BackendRequest::*;
    match b {
        Add {
            vip,
            address,
            weight,
        } => format!("added backend {address} (weight {weight}) to {vip}"),
        Del { vip, address, .. } => format!("deleted backend {address} from {vip}"),
        Weight {
            vip,
            address,
            weight,
            ..
        } => format!("backend {address} of {vip} now has weight {weight}"),
        Drain { vip, address, .. } => format!("draining backend {address} of {vip}"),
        Undrain { vip, address } => format!("backend {address} of {vip} is no longer draining"),
    }
}

/// `node drain` without `--no-wait`: waits out what is left of
/// `shutdown_grace`, so that the routers have moved traffic away when
/// `lbctl` returns.
fn wait_grace(change: NodeChange, json: bool) {
    if change.wait_secs > 0.0 {
        if !json {
            println!(
                "waiting {:.1}s (shutdown_grace) for the routers to move traffic away",
                change.wait_secs
            );
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(change.wait_secs));
    }
}

/// Writes lbctl's man pages or completions into `dir` (for the package).
fn generate(what: Generated, dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory as _;
    match what {
        Generated::Completions => complete::write_registrations(dir),
        Generated::Man => lb::cli_docs::generate(Args::command(), "lbctl", what, dir),
    }
    .with_context(|| format!("writing into {}", dir.display()))
}

fn decode<T: DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).context("unexpected answer from lbd (version mismatch?)")
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::Args;

    /// `decap attach` says where tunnels may come from: `--from` prefixes,
    /// or `--from-any` in so many words, never both (helper-33: attaching
    /// without `--from` took tunnels from anywhere by default, and a re-run
    /// without it cleared a filter set before).
    /// A desired state is read up to its limit and no further, whatever
    /// the file's size says (a pipe says none).
    #[test]
    fn a_desired_state_is_read_to_its_limit_only() {
        let dir = std::env::temp_dir().join(format!("lbctl-desired-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let max = lb::config::MAX_DESIRED_BYTES;
        let (fits, over) = (dir.join("fits.yaml"), dir.join("over.yaml"));
        std::fs::write(&fits, "#".repeat(max)).unwrap();
        std::fs::write(&over, "#".repeat(max + 1)).unwrap();
        assert_eq!(
            super::tier::read_desired(&fits)
                .expect("at the limit")
                .len(),
            max
        );
        let e = super::tier::read_desired(&over).unwrap_err().to_string();
        assert!(e.contains("more than the"), "{e}");
        // Cut inside a character: still too large, not "invalid UTF-8".
        std::fs::write(&over, "é".repeat(max / 2 + 1)).unwrap();
        let e = super::tier::read_desired(&over).unwrap_err().to_string();
        assert!(e.contains("more than the"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file lbctl reads but lbd, sandboxed, does not see gets the
    /// sandbox named; a file missing here, or another error, does not.
    #[test]
    fn a_diff_of_a_file_lbd_cannot_see_names_the_sandbox() {
        let dir = std::env::temp_dir().join(format!("lbctl-hint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let here = dir.join("next.yaml");
        std::fs::write(&here, "vips: []\n").unwrap();
        let lbd_says = |p: &std::path::Path| {
            format!(
                "lbd: cannot read {}: No such file or directory",
                p.display()
            )
        };
        let hint = super::unseen_file_hint(&here, &lbd_says(&here)).expect("a hint");
        assert!(hint.contains("PrivateTmp, ProtectHome"), "{hint}");
        let gone = dir.join("gone.yaml");
        assert_eq!(super::unseen_file_hint(&gone, &lbd_says(&gone)), None);
        assert_eq!(
            super::unseen_file_hint(&here, "lbd: vips[0]: bad port"),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn decap_attach_needs_from_or_from_any() {
        let parse = |line: &str| Args::try_parse_from(line.split_whitespace());
        let e = parse("lbctl decap attach eth0")
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--from"), "{e}");
        assert!(parse("lbctl decap attach eth0 --from 10.98.0.0/16 --from-any").is_err());
        assert!(parse("lbctl decap attach eth0 --from-any").is_ok());
        assert!(parse("lbctl decap attach eth0 --from 10.98.0.0/16 --from fd00::/64").is_ok());
    }

    /// `--dry-run` and `--confirm-within` on a command lbctl runs itself
    /// are refused before it acts (`decap detach --dry-run` detached for
    /// real); on lbd's changes they pass.
    #[test]
    fn change_options_are_refused_where_nothing_honours_them() {
        let check = |line: &str| {
            let args = Args::try_parse_from(line.split_whitespace()).expect("parses");
            super::refuse_local_change_options(&args).map_err(|e| e.to_string())
        };
        for line in [
            "lbctl decap detach eth0 --dry-run",
            "lbctl --dry-run decap attach eth0 --from-any",
            "lbctl decap attach eth0 --from-any --confirm-within 2m",
            "lbctl trace --dry-run",
        ] {
            let e = check(line).expect_err(line);
            assert!(e.contains("takes neither"), "{line}: {e}");
        }
        for line in [
            "lbctl decap detach eth0",
            "lbctl reload --dry-run",
            "lbctl backend drain 10.0.0.1:80/tcp 10.1.0.1 --confirm-within 2m",
        ] {
            assert_eq!(check(line), Ok(()), "{line}");
        }
    }

    /// Every command and argument says what it does, in words an operator
    /// reads (no Rust documentation artefacts), in `--help` and in the man
    /// pages, and every command is in the README's list.
    #[test]
    fn help_and_man_pages_describe_every_command_in_plain_words() {
        let cmd = Args::command().name("lbctl");
        let problems = lb::cli_docs::doc_problems(&cmd);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        let pages = lb::cli_docs::render_man_pages(&cmd).expect("renders");
        assert!(pages.len() > 30, "{} pages", pages.len());
        for (name, page) in &pages {
            assert!(
                !page.contains('→') && !page.contains("[`") && !page.contains("super::"),
                "{name}'s man page:\n{page}"
            );
            let title = page
                .lines()
                .skip_while(|l| !l.starts_with(".SH NAME"))
                .nth(1)
                .unwrap_or_default();
            assert!(
                title.split_once(" \\- ").is_some_and(|(_, d)| d.len() > 3),
                "{name}'s name line: {title:?}"
            );
        }
        let readme = include_str!("../../../../README.md");
        let missing: Vec<String> = lb::cli_docs::leaf_commands(&cmd)
            .into_iter()
            .filter(|c| !readme.contains(&format!("`{c}")))
            .collect();
        assert!(
            missing.is_empty(),
            "commands missing from README's lbctl table: {missing:?}"
        );
    }
}

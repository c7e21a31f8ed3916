//! Shell completion from the running `lbd`: VIPs (`lbctl table <TAB>`)
//! and a VIP's backends (`lbctl backend drain 10.0.0.1:80/tcp <TAB>`)
//! come from `lbd vip list`; everything else from the command line's
//! definition. clap_complete's dynamic engine: the shell runs
//! `LBCTL_COMPLETE=bash lbctl -- WORDS...` for each completion, so the
//! registration scripts (`lbctl __generate completions`, or `source
//! <(LBCTL_COMPLETE=bash lbctl)`) never go stale. A completion that cannot
//! reach `lbd` offers nothing and says nothing.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use clap::Command;
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};
use lb::{
    api::{self, Request, VipInfo, VipRequest},
    config::VipId,
};

/// `lbctl`'s command line with the candidates that come from `lbd`.
pub fn command(cmd: Command) -> Command {
    with_candidates(cmd, false)
}

/// Adds VIP candidates to every argument named `vip`, and backend
/// candidates to `address` under `backend`, recursively.
fn with_candidates(mut cmd: Command, in_backend: bool) -> Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        if id == "vip" {
            cmd = cmd.mut_arg(id, |a| a.add(ArgValueCandidates::new(vip_candidates)));
        } else if id == "address" && in_backend {
            cmd = cmd.mut_arg(id, |a| a.add(ArgValueCandidates::new(backend_candidates)));
        }
    }
    let backend = in_backend || cmd.get_name() == "backend";
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for sub in subs {
        cmd = cmd.mut_subcommand(sub, |c| with_candidates(c, backend));
    }
    cmd
}

/// The words being completed: the process's arguments after `--`.
fn words() -> Vec<String> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let start = args
        .iter()
        .position(|a| a == "--")
        .map_or(args.len(), |i| i + 1);
    args[start..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The socket the command line being completed names, as `lbctl` would
/// use it (`--socket`, else `--instance`'s, else the default instance's).
fn socket_of(words: &[String]) -> PathBuf {
    let mut socket = None;
    let mut instance = "default".to_string();
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).cloned();
        match w.as_str() {
            "-s" | "--socket" => socket = next.map(PathBuf::from),
            "-i" | "--instance" => instance = next.unwrap_or(instance),
            _ => {
                if let Some(s) = w.strip_prefix("--socket=") {
                    socket = Some(PathBuf::from(s));
                } else if let Some(i) = w.strip_prefix("--instance=") {
                    instance = i.to_string();
                }
            }
        }
    }
    socket.unwrap_or_else(|| PathBuf::from(format!("/run/lb/{instance}.sock")))
}

/// The VIPs `lbd` runs; none if it cannot be asked.
fn vips(socket: &Path) -> Vec<VipInfo> {
    api::call(socket, &Request::Vip(VipRequest::List))
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

fn vip_candidates() -> Vec<CompletionCandidate> {
    vips(&socket_of(&words()))
        .into_iter()
        .map(|v| {
            CompletionCandidate::new(v.vip.to_string())
                .help(Some(format!("{} backends", v.backends.len()).into()))
        })
        .collect()
}

/// The backends of the VIP named earlier on the line, or of every VIP.
fn backend_candidates() -> Vec<CompletionCandidate> {
    let words = words();
    let named: Option<VipId> = words.iter().find_map(|w| w.parse().ok());
    let mut addrs: Vec<String> = vips(&socket_of(&words))
        .into_iter()
        .filter(|v| named.is_none_or(|n| n == v.vip))
        .flat_map(|v| v.backends.into_iter().map(|b| b.address.to_string()))
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs.into_iter().map(CompletionCandidate::new).collect()
}

/// The registration scripts the package installs (`lbctl.bash`,
/// `_lbctl`, `lbctl.fish`): each runs `LBCTL_COMPLETE=<shell> lbctl -- WORDS`.
pub fn write_registrations(dir: &Path) -> std::io::Result<()> {
    use clap_complete::env::{Bash, EnvCompleter, Fish, Zsh};
    std::fs::create_dir_all(dir)?;
    let shells: [(&dyn EnvCompleter, &str); 3] = [
        (&Bash, "lbctl.bash"),
        (&Zsh, "_lbctl"),
        (&Fish, "lbctl.fish"),
    ];
    for (shell, file) in shells {
        let mut script = Vec::new();
        shell.write_registration(VAR, "lbctl", "lbctl", "lbctl", &mut script)?;
        std::fs::write(dir.join(file), script)?;
    }
    Ok(())
}

/// The environment variable that asks `lbctl` for completions: its own
/// name, not clap's default `COMPLETE`, which a user's environment may
/// hold for something else (lbctl would then answer as a completer).
pub const VAR: &str = "LBCTL_COMPLETE";

#[cfg(test)]
mod tests {
    use super::socket_of;

    #[test]
    fn the_socket_is_the_one_the_line_names() {
        let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            socket_of(&words("lbctl table")),
            std::path::Path::new("/run/lb/default.sock")
        );
        assert_eq!(
            socket_of(&words("lbctl -i edge table")),
            std::path::Path::new("/run/lb/edge.sock")
        );
        assert_eq!(
            socket_of(&words("lbctl --instance=edge --socket /tmp/x.sock table")),
            std::path::Path::new("/tmp/x.sock")
        );
    }
}

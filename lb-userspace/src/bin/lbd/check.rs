//! `lbd check`: one verdict on a file, the one `lbd` itself would give.
//! When an `lbd` runs this very file (found through `/proc`: its
//! `--config`, and the control socket it listens on), the file goes to it
//! as a strict dry-run reload (`lbctl diff --strict`): the same checks a
//! `lbctl reload` runs against the running state — settings only a
//! restart may change, table sizes, the blackhole guard, the VIP rules —
//! so `check` says ok exactly when the reload would succeed. Otherwise it
//! is a start's checks: the rules, the key files, the interfaces on this
//! box (`--offline` leaves those out, for a file checked elsewhere), and
//! table sizes against maps pinned by an `lbd` that is gone.
//!
//! Not here: whether an interface takes native XDP. Only attaching tells,
//! and attaching a program in native mode resets some NICs' queues (a
//! link blip on a production box), so `lbd` finds out at start.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use lb::config::Config;

/// The secrets a start reads (BGP keys, the hash key, etcd's TLS key and
/// password) and what is wrong with each; a start stops on a fault, and
/// so does a check on this box.
fn secret_files(config: &Config) -> Vec<lb::config::ConfigError> {
    let mut files = config.announce.check_files();
    if let Some(key) = &config.hash_key_file
        && let Err(e) = lb::config::load_hash_key(key)
    {
        files.push(lb::config::ConfigError {
            field: "hash_key_file".into(),
            message: e,
        });
    }
    if let Some(etcd) = &config.source {
        files.extend(etcd.check_files());
    }
    files
}

/// Runs `lbd check` on `path`. `--offline` (a file for another box) checks
/// the secret files that are here, and names those that are not: they live
/// on that box.
pub fn check(path: &Path, offline: bool) -> Result<()> {
    let config = Config::load(path)?;
    let (mut files, elsewhere): (Vec<_>, Vec<_>) = secret_files(&config)
        .into_iter()
        .partition(|e| !(offline && e.message.contains("(os error 2)")));
    if config.source.is_some() && !config.vips.is_empty() {
        files.push(lb::config::ConfigError {
            field: "vips".into(),
            message: "the VIPs come from etcd (source.etcd): the file lists none".into(),
        });
    }
    if !files.is_empty() {
        return Err(lb::config::ConfigErrors {
            source_name: Some(path.display().to_string()),
            errors: files,
        }
        .into());
    }
    for w in &config.warnings {
        println!("warning: {w}");
    }
    if !elsewhere.is_empty() {
        let fields: Vec<&str> = elsewhere.iter().map(|e| e.field.as_str()).collect();
        println!(
            "offline: not on this box, so not checked: {} (checked where the file runs)",
            fields.join(", ")
        );
    }
    if !offline && let Some((pid, socket)) = running_lbd_of(path) {
        return against_running(path, pid, &socket);
    }
    if !offline {
        interfaces_exist(&config)?;
        for w in super::table_size_changes(&config) {
            println!("warning: {w}");
        }
    }
    println!("{}: ok", path.display());
    Ok(())
}

/// The file as a strict dry-run reload of the `lbd` that runs it.
fn against_running(path: &Path, pid: u32, socket: &Path) -> Result<()> {
    let request = lb::api::Request::Diff {
        file: Some(std::fs::canonicalize(path)?),
        strict: true,
    };
    let options = lb::api::ChangeOptions {
        dry_run: true,
        confirm_within: None,
    };
    let data = lb::api::call_with(socket, &request, &options).map_err(|e| {
        anyhow::anyhow!(
            "the lbd that runs {} (pid {pid}, {}) would refuse it: {e}",
            path.display(),
            socket.display()
        )
    })?;
    let committed: lb::api::Committed =
        serde_json::from_value(data).context("the running lbd's answer")?;
    for w in committed.warnings {
        println!("warning: {w}");
    }
    println!(
        "{}: ok (a reload of the lbd that runs it, pid {pid}, would apply it)",
        path.display()
    );
    Ok(())
}

/// Every configured interface exists in this network namespace.
fn interfaces_exist(config: &Config) -> Result<()> {
    let missing: Vec<&str> = config
        .interfaces
        .iter()
        .filter(|i| !Path::new("/sys/class/net").join(i).exists())
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        bail!(
            "interfaces: {} does not exist here (`lbd check --offline` checks a file for another box)",
            missing.join(", ")
        );
    }
    Ok(())
}

/// The `lbd` process whose `--config` is `path` (the same file), and the
/// Unix socket it listens on, if one runs.
fn running_lbd_of(path: &Path) -> Option<(u32, PathBuf)> {
    let want = std::fs::metadata(path).ok()?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(config) = lbd_config_of(pid) else {
            continue;
        };
        // The same file, however it was named (relative to the process's
        // own directory, through a link).
        let file = Path::new("/proc")
            .join(pid.to_string())
            .join("cwd")
            .join(&config);
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        if meta.dev() != want.dev() || meta.ino() != want.ino() {
            continue;
        }
        if let Some(socket) = listening_socket(pid) {
            return Some((pid, socket));
        }
    }
    None
}

/// The `--config` of process `pid` if it is an `lbd` that runs (default
/// `/etc/lb/lb.yaml`).
fn lbd_config_of(pid: u32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let (program, rest) = args.split_first()?;
    if !program.ends_with(b"lbd") {
        return None;
    }
    let text: Vec<String> = rest
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if text.iter().any(|a| a == "check" || a == "teardown") {
        return None;
    }
    let mut config = PathBuf::from("/etc/lb/lb.yaml");
    let mut it = text.iter();
    while let Some(a) = it.next() {
        if a == "--config" || a == "-c" {
            config = PathBuf::from(it.next()?);
        } else if let Some(v) = a.strip_prefix("--config=") {
            config = PathBuf::from(v);
        }
    }
    Some(config)
}

/// The path of a listening Unix socket of process `pid` (its control
/// socket): its socket inodes from `/proc/PID/fd`, their paths from its
/// namespace's `/proc/PID/net/unix`.
fn listening_socket(pid: u32) -> Option<PathBuf> {
    let mut inodes = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if let Ok(target) = std::fs::read_link(fd.path())
            && let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    table.lines().skip(1).find_map(|line| {
        // Num RefCount Protocol Flags Type St Inode Path; a listening
        // socket's flags have __SO_ACCEPTCON (0x10000).
        let f: Vec<&str> = line.split_whitespace().collect();
        let listening = f
            .get(3)
            .and_then(|x| u32::from_str_radix(x, 16).ok())
            .is_some_and(|flags| flags & 0x1_0000 != 0);
        (f.len() >= 8 && listening && inodes.contains(f[6])).then(|| PathBuf::from(f[7]))
    })
}

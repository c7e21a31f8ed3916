//! `lbctl`'s shell completion against a running `lbd`: the registration
//! scripts the package installs (`lbctl __generate completions`) are
//! loaded into real bash and fish, which must offer the rig's VIPs after
//! `lbctl table` and a VIP's backends after `lbctl backend drain VIP`;
//! zsh, which cannot be driven without a terminal, must accept its script
//! and get the same candidates through the same protocol.

use std::{path::Path, process::Command};

use anyhow::{Result, bail};
use lb_tests::{
    rig::{Lbd, Rig, bin_path},
    scenario::{check, serial, setup},
};

use crate::{Scratch, stdout};

/// The rig's VIPs and the TCP VIP's backends, as completion must offer
/// them.
fn expected(rig: &Rig) -> (Vec<String>, Vec<String>) {
    let mut vips = vec![
        format!("{}/tcp", rig.tcp_vip()),
        format!("{}/udp", rig.udp_vip()),
    ];
    vips.sort();
    let mut backends: Vec<String> = rig.backends.iter().map(|b| b.addr.to_string()).collect();
    backends.sort();
    (vips, backends)
}

/// The values offered, sorted, but options (`--socket`, ...), which an
/// empty word is offered too.
fn lines(text: &str) -> Vec<String> {
    let mut l: Vec<String> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('-'))
        .collect();
    l.sort();
    l
}

/// Bash completes `words` (the last one being typed) with the installed
/// script: what the completion function leaves in COMPREPLY.
fn bash(dir: &Path, path: &str, words: &[&str]) -> Result<Vec<String>> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        "source {}/lbctl.bash\n\
         COMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_TYPE=9\n\
         _clap_complete_lbctl lbctl {} {}\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        dir.display(),
        quoted.join(" "),
        words.len() - 1,
        quoted[words.len() - 1],
        quoted[words.len() - 2],
    );
    let out = stdout(
        Command::new("bash")
            .args(["--norc", "-c", &script])
            .env("PATH", path),
        "bash",
    )?;
    Ok(lines(&out))
}

/// Fish completes the command line `line` with the installed script.
fn fish(dir: &Path, path: &str, line: &str) -> Result<Vec<String>> {
    let script = format!(
        "source {}/lbctl.fish; complete --do-complete '{line}'",
        dir.display()
    );
    let out = stdout(
        Command::new("fish")
            .args(["--no-config", "-c", &script])
            .env("PATH", path),
        "fish",
    )?;
    Ok(lines(&out))
}

/// The zsh protocol of the installed script, run as its function runs it.
fn zsh(dir: &Path, path: &str, words: &[&str]) -> Result<Vec<String>> {
    stdout(
        Command::new("zsh")
            .args(["-n"])
            .arg(dir.join("_lbctl"))
            .env("PATH", path),
        "zsh",
    )?;
    let out = stdout(
        Command::new("lbctl")
            .arg("--")
            .args(words)
            .env("PATH", path)
            .env("LBCTL_COMPLETE", "zsh")
            .env("_CLAP_IFS", "\n")
            .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string()),
        "lbctl",
    )?;
    Ok(lines(
        &out.lines().map(zsh_value).collect::<Vec<_>>().join("\n"),
    ))
}

/// The value of one of zsh's `value:help` lines (`\:` and `\\` escaped).
fn zsh_value(line: &str) -> String {
    let mut value = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.extend(chars.next()),
            ':' => break,
            c => value.push(c),
        }
    }
    value
}

#[test]
fn completion_offers_the_running_vips_and_a_vips_backends() {
    let _serial = serial();
    check((|| {
        let (rig, lbd) = setup(2, &[Some(1), Some(1)])?;
        let scripts = Scratch::new("completion")?;
        let lbctl = bin_path("lbctl")?;
        stdout(
            Command::new(&lbctl)
                .args(["__generate", "completions"])
                .arg(&scripts.0),
            "lbctl",
        )?;
        let bin_dir = lbctl.parent().map(Path::to_path_buf).unwrap_or_default();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        compare(&rig, &lbd, &scripts.0, &path)
    })());
}

/// Each shell's candidates against the rig's VIPs and backends.
fn compare(rig: &Rig, lbd: &Lbd, dir: &Path, path: &str) -> Result<()> {
    let (vips, backends) = expected(rig);
    let socket = lbd.socket.display().to_string();
    let tcp = format!("{}/tcp", rig.tcp_vip());
    let table = ["lbctl", "--socket", &socket, "table", ""];
    let drain = ["lbctl", "--socket", &socket, "backend", "drain", &tcp, ""];
    let got = [
        ("bash table", bash(dir, path, &table)?, &vips),
        ("bash backend drain", bash(dir, path, &drain)?, &backends),
        (
            "fish table",
            fish(dir, path, &format!("lbctl --socket {socket} table "))?,
            &vips,
        ),
        (
            "fish backend drain",
            fish(
                dir,
                path,
                &format!("lbctl --socket {socket} backend drain {tcp} "),
            )?,
            &backends,
        ),
        ("zsh table", zsh(dir, path, &table)?, &vips),
        ("zsh backend drain", zsh(dir, path, &drain)?, &backends),
    ];
    for (what, candidates, want) in got {
        eprintln!("{what}: {candidates:?}");
        if &candidates != want {
            bail!("{what} offered {candidates:?}, expected {want:?}");
        }
    }
    Ok(())
}

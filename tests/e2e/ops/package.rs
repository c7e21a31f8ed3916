//! The Debian package. The suite does not build release binaries (minutes
//! on two cores): it packages the debug binaries it has just built, with
//! the same code path `cargo xtask package` takes for release ones
//! (`xtask package --bin-dir`, about ten seconds), then checks the package
//! as an operator would meet it: every file with its mode and owner, the
//! control fields and conffiles, the extracted `lbd` validating the
//! packaged example configuration and forwarding real connections in a
//! rig, and a full install, verify and purge with `dpkg --root` into a
//! throwaway directory. Nothing is ever installed into the real system:
//! with `--force-script-chrootless` dpkg sets `DPKG_ROOT`, which the
//! maintainer scripts honour by not reloading this machine's systemd.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use lb_tests::{
    rig::{CLIENT, Lbd, LbdCommand, Rig, bin_path},
    scenario::{check, serial},
    traffic::tcp_request,
};

use crate::{Scratch, repo, stdout};

/// Files the package must hold (besides the man pages), with their mode.
const FILES: &[(&str, &str)] = &[
    ("./etc/lb/lb.yaml.example", "-rw-r--r--"),
    ("./usr/lib/systemd/system/lbd.service", "-rw-r--r--"),
    ("./usr/sbin/lbd", "-rwxr-xr-x"),
    ("./usr/sbin/lbctl", "-rwxr-xr-x"),
    ("./usr/sbin/lb-backend-setup", "-rwxr-xr-x"),
    ("./usr/share/bash-completion/completions/lbd", "-rw-r--r--"),
    (
        "./usr/share/bash-completion/completions/lbctl",
        "-rw-r--r--",
    ),
    ("./usr/share/zsh/vendor-completions/_lbd", "-rw-r--r--"),
    ("./usr/share/zsh/vendor-completions/_lbctl", "-rw-r--r--"),
    (
        "./usr/share/fish/vendor_completions.d/lbd.fish",
        "-rw-r--r--",
    ),
    (
        "./usr/share/fish/vendor_completions.d/lbctl.fish",
        "-rw-r--r--",
    ),
    ("./usr/share/doc/lb/copyright", "-rw-r--r--"),
    ("./usr/share/doc/lb/README.md.gz", "-rw-r--r--"),
];

/// Man pages that must be there among the generated ones.
const MAN_PAGES: &[&str] = &[
    "lbd.8.gz",
    "lbd-check.8.gz",
    "lbd-teardown.8.gz",
    "lbctl.8.gz",
    "lbctl-reload.8.gz",
    "lbctl-vip-add.8.gz",
    "lbctl-decap-attach.8.gz",
];

/// Builds the package from the built debug binaries into `out`.
fn build_package(out: &Path) -> Result<PathBuf> {
    let lbd = bin_path("lbd")?;
    let bins = lbd.parent().context("lbd's directory")?;
    let said = stdout(
        Command::new(bin_path("xtask")?)
            .arg("package")
            .arg("--bin-dir")
            .arg(bins)
            .arg("--out")
            .arg(out),
        "dpkg-dev",
    )?;
    let deb = PathBuf::from(
        said.lines()
            .last()
            .context("xtask package printed no path")?,
    );
    if !deb.is_file() || deb.extension().is_none_or(|e| e != "deb") {
        bail!("xtask package said {said:?}, which is no .deb");
    }
    Ok(deb)
}

/// `dpkg-deb -c`: path → (mode, owner).
fn contents(deb: &Path) -> Result<BTreeMap<String, (String, String)>> {
    let listing = stdout(Command::new("dpkg-deb").arg("-c").arg(deb), "dpkg")?;
    eprintln!("dpkg-deb -c {}:\n{listing}", deb.display());
    let mut files = BTreeMap::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [mode, owner, _size, _date, _time, path] = f.as_slice() else {
            bail!("unexpected line in dpkg-deb -c: {line:?}");
        };
        files.insert(path.to_string(), (mode.to_string(), owner.to_string()));
    }
    Ok(files)
}

/// Every expected file with its mode, all owned by root, nothing else.
fn check_contents(files: &BTreeMap<String, (String, String)>) -> Result<()> {
    for (path, (mode, owner)) in files {
        if owner != "root/root" {
            bail!("{path} is owned by {owner}");
        }
        let listed = FILES.iter().find(|(p, _)| p == path).map(|(_, m)| *m);
        let want = match listed {
            Some(m) => m,
            None if mode.starts_with('d') => "drwxr-xr-x",
            None if path.starts_with("./usr/share/man/man8/") && path.ends_with(".8.gz") => {
                "-rw-r--r--"
            }
            None => bail!("unexpected file in the package: {path}"),
        };
        if mode != want {
            bail!("{path} has mode {mode}, want {want}");
        }
        if path.contains("generate") {
            bail!("the hidden generator leaked into the package: {path}");
        }
    }
    for (path, _) in FILES {
        if !files.contains_key(*path) {
            bail!("the package lacks {path}");
        }
    }
    for page in MAN_PAGES {
        if !files.contains_key(&format!("./usr/share/man/man8/{page}")) {
            bail!("the package lacks the man page {page}");
        }
    }
    Ok(())
}

/// Control fields, conffiles and maintainer scripts.
fn check_control(deb: &Path, scratch: &Scratch) -> Result<()> {
    let field = |name: &str| -> Result<String> {
        Ok(stdout(
            Command::new("dpkg-deb").arg("-f").arg(deb).arg(name),
            "dpkg",
        )?
        .trim()
        .to_string())
    };
    let version = stdout(Command::new(bin_path("lbd")?).arg("--version"), "lb")?;
    let version = version.split_whitespace().nth(1).context("lbd --version")?;
    for (name, want) in [
        ("Package", "lb".to_string()),
        ("Version", format!("{version}-1")),
        ("Section", "net".into()),
        ("Priority", "optional".into()),
        ("Recommends", "iproute2".into()),
    ] {
        let got = field(name)?;
        if got != want {
            bail!("{name}: {got:?}, want {want:?}");
        }
    }
    for (name, part) in [
        ("Depends", "libc6 (>= "),
        ("Maintainer", "@"),
        ("Description", "XDP"),
    ] {
        if !field(name)?.contains(part) {
            bail!("{name} should contain {part:?}: {:?}", field(name)?);
        }
    }
    let control = scratch.path("control");
    stdout(
        Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control),
        "dpkg",
    )?;
    let conffiles = std::fs::read_to_string(control.join("conffiles"))?;
    if conffiles != "/etc/lb/lb.yaml.example\n" {
        bail!("conffiles: {conffiles:?}");
    }
    let postinst = std::fs::read_to_string(control.join("postinst"))?;
    let code: Vec<&str> = postinst
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let systemctl: Vec<&&str> = code.iter().filter(|l| l.contains("systemctl")).collect();
    if systemctl.len() != 1 || !systemctl[0].contains("systemctl --system daemon-reload") {
        bail!("postinst should reload systemd and neither enable nor start lbd:\n{postinst}");
    }
    Ok(())
}

/// The extracted binaries: `lbd check` on the packaged example, `lbctl
/// --help`, the script's `--help`, and the unit as in the repository.
fn check_extracted(root: &Path) -> Result<()> {
    let example = root.join("etc/lb/lb.yaml.example");
    let said = stdout(
        Command::new(root.join("usr/sbin/lbd"))
            .arg("--config")
            .arg(&example)
            .arg("check"),
        "lb",
    )?;
    if !said.contains(": ok") {
        bail!("lbd check of the packaged example said {said:?}");
    }
    let help = stdout(
        Command::new(root.join("usr/sbin/lbctl")).arg("--help"),
        "lb",
    )?;
    if !help.contains("Usage: lbctl") || help.contains("__generate") {
        bail!("lbctl --help said {help:?}");
    }
    let help = stdout(
        Command::new(root.join("usr/sbin/lb-backend-setup")).arg("--help"),
        "lb",
    )?;
    if !help.contains("Usage: lb-backend-setup") {
        bail!("lb-backend-setup --help said {help:?}");
    }
    let unit = std::fs::read(root.join("usr/lib/systemd/system/lbd.service"))?;
    if unit != std::fs::read(repo("scripts/lbd.service"))? {
        bail!("the packaged unit differs from scripts/lbd.service");
    }
    Ok(())
}

/// The packaged (stripped) lbd runs the XDP program it embeds: real
/// connections through it in a one-backend rig.
fn serve_with_packaged_lbd(root: &Path) -> Result<()> {
    let rig = Rig::new(1)?;
    let config = rig.dir.join("lbd.yaml");
    std::fs::write(&config, rig.config(&[Some(1)]))?;
    let how = LbdCommand {
        program: root.join("usr/sbin/lbd"),
        wrapper: Vec::new(),
    };
    let _lbd = Lbd::start_with(&rig.lb, &rig.dir, &config, &how, &[])?;
    let vip = rig.tcp_vip();
    rig.client.within(move || -> Result<()> {
        for port in 49_000..49_020 {
            let backend = tcp_request(CLIENT, port, vip)
                .with_context(|| format!("connection from {port} through the packaged lbd"))?;
            if backend != "be1" {
                bail!("port {port} reached {backend}");
            }
        }
        Ok(())
    })?
}

/// dpkg with its database in `root`.
fn dpkg(root: &Path) -> Command {
    let mut c = Command::new("dpkg");
    c.arg(format!("--root={}", root.display()))
        .arg(format!("--log={}", root.join("dpkg.log").display()))
        .arg("--force-script-chrootless");
    c
}

/// Install, verify, purge in a throwaway root.
fn install_and_purge(deb: &Path, root: &Path) -> Result<()> {
    let admin = root.join("var/lib/dpkg");
    for dir in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(dir))?;
    }
    std::fs::write(admin.join("status"), "")?;
    std::fs::write(admin.join("available"), "")?;
    // Its dependencies are the real system's, which this root's database
    // does not list.
    stdout(dpkg(root).args(["--force-depends", "-i"]).arg(deb), "dpkg")?;
    let status = stdout(dpkg(root).args(["-s", "lb"]), "dpkg")?;
    if !status.contains("Status: install ok installed")
        || !status.contains("/etc/lb/lb.yaml.example")
    {
        bail!("after dpkg -i:\n{status}");
    }
    let verify = stdout(dpkg(root).args(["--verify", "lb"]), "dpkg")?;
    if !verify.trim().is_empty() {
        bail!("dpkg --verify (md5sums against the installed files):\n{verify}");
    }
    for path in [
        "usr/sbin/lbd",
        "usr/lib/systemd/system/lbd.service",
        "etc/lb/lb.yaml.example",
    ] {
        if !root.join(path).is_file() {
            bail!("dpkg -i did not install /{path}");
        }
    }
    stdout(dpkg(root).args(["--purge", "lb"]), "dpkg")?;
    for path in ["usr/sbin/lbd", "etc/lb/lb.yaml.example"] {
        if root.join(path).exists() {
            bail!("dpkg --purge left /{path}");
        }
    }
    Ok(())
}

#[test]
fn the_package_holds_every_file_and_installs_and_serves() {
    let _serial = serial();
    check((|| {
        let scratch = Scratch::new("deb")?;
        let deb = build_package(&scratch.path("out"))?;
        check_contents(&contents(&deb)?)?;
        check_control(&deb, &scratch)?;
        let extracted = scratch.path("x");
        stdout(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted),
            "dpkg",
        )?;
        check_extracted(&extracted)?;
        serve_with_packaged_lbd(&extracted)?;
        install_and_purge(&deb, &scratch.path("root"))
    })());
}

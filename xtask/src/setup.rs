//! Prerequisites, installed idempotently: Debian packages, the nightly
//! toolchain's `rust-src`, `bpf-linker` 0.10.3, a mounted bpffs. Each step
//! checks first and only acts when something is missing.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::run as sh;

/// Debian packages the tests and the demo use.
const PACKAGES: &[&str] = &[
    "iproute2",
    "iputils-ping",
    "tcpdump",
    "ethtool",
    "bpftool",
    "procps",
    // setpriv: the service test runs lbd with the unit's capabilities.
    "util-linux",
    // The operations tests: systemd-analyze (the unit; man for its
    // Documentation=), strip, dpkg-deb and dpkg-shlibdeps (the package),
    // shellcheck (the shell scripts).
    "systemd",
    "man-db",
    "binutils",
    "dpkg-dev",
    "shellcheck",
    // lbctl's completions, run by the shells that use them.
    "zsh",
    "fish",
    // nft: the SYN-flood test drops the tunnelled flood on its router; the
    // BFD tests silence a balancer's link and make BFD's path lossy.
    "nftables",
    // lbctl top runs in a real terminal in its test.
    "tmux",
    // Runs docs/examples/lbd_api.py, the API driven without lbctl.
    "python3",
    // Loads the CPUs to check that a rig test passes on a busy machine.
    "stress-ng",
    // Real BGP routers for the interop and active-active tests.
    "bird2",
    "frr",
    // A real Prometheus (and promtool) scrapes lbd in the metrics test and
    // checks the alert rules.
    "prometheus",
    // The tier's store (etcd 3.4, and etcdctl to write and read it in the
    // tier tests); protoc builds the etcd client's gRPC code, with the
    // well-known types (google/protobuf/*.proto) that only libprotobuf-dev
    // holds: protobuf-compiler merely recommends it, and recommends are
    // not installed here.
    "etcd-server",
    "etcd-client",
    "protobuf-compiler",
    "libprotobuf-dev",
    // The tier test's CA and certificates (etcd over TLS).
    "openssl",
];

/// The linker known to work with the machine's nightly (see TOOLCHAIN.md):
/// 0.11+ wants a system LLVM 23.
const BPF_LINKER_VERSION: &str = "0.10.3";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cargo xtask setup`: check everything, report each step.
    Always,
    /// Before tests: act quietly, only where something is missing.
    IfMissing,
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn run(mode: Mode) -> Result<()> {
    let say = |msg: &str| {
        if mode == Mode::Always {
            eprintln!("setup: {msg}");
        }
    };
    packages(&say)?;
    rust_src(&say)?;
    bpf_linker(&say)?;
    bpffs(&say)?;
    Ok(())
}

fn packages(say: &dyn Fn(&str)) -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        say("Debian packages present");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {missing:?}; run `cargo xtask setup` as root to install them"
        );
    }
    apt_install(&missing)?;
    quiet_services(&missing);
    Ok(())
}

/// Packages on the list that Debian starts as system services at install
/// (and at every boot), and their units. The tests start their own
/// instances; left running, Prometheus would listen on every interface
/// of the machine (`:9090`, no authentication), and etcd, BIRD and FRR
/// would run for nothing.
const SERVICES: &[(&str, &str)] = &[
    ("prometheus", "prometheus.service"),
    ("etcd-server", "etcd.service"),
    ("bird2", "bird.service"),
    ("frr", "frr.service"),
];

/// Stops and disables the services of the packages this setup has just
/// installed (`installed`); a service already there before is left alone.
fn quiet_services(installed: &[&str]) {
    for (package, unit) in SERVICES {
        if installed.contains(package) {
            let stopped = Command::new("systemctl")
                .args(["disable", "--now", unit])
                .output()
                .is_ok_and(|o| o.status.success());
            eprintln!(
                "setup: {unit} (installed with {package}) {}",
                if stopped {
                    "stopped and disabled: the tests run their own"
                } else {
                    "could not be disabled: stop it with `systemctl disable --now` if it runs"
                }
            );
        }
    }
}

/// What building the workspace needs beyond Rust (see [`build_tools`]).
const BUILD_PACKAGES: &[&str] = &["protobuf-compiler", "libprotobuf-dev"];

/// The file of `libprotobuf-dev` that the etcd client's protos import.
const PROTOBUF_WELL_KNOWN: &str = "/usr/include/google/protobuf/timestamp.proto";

/// `protoc` and the protobuf well-known types, for the etcd client's gRPC
/// code. The unit tests, `check`, `lint` and `mutants` build without the
/// rest of [`PACKAGES`], so they install only these (as root) or say in
/// one line what is missing, before cargo fails deep in a build script.
/// A `PROTOC` the caller set is taken as it is.
pub fn build_tools() -> Result<()> {
    let system = have("protoc") && Path::new(PROTOBUF_WELL_KNOWN).exists();
    if system || std::env::var_os("PROTOC").is_some() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "building lb needs protoc and the protobuf well-known types (Debian: {}); run `cargo xtask setup` as root, or install them",
            BUILD_PACKAGES.join(", ")
        );
    }
    apt_install(BUILD_PACKAGES)
}

/// Whether `cmd` is on the `PATH`.
fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `apt-get install`s `packages` (root only), without recommends.
fn apt_install(packages: &[&str]) -> Result<()> {
    eprintln!("setup: installing {packages:?}");
    sh(Command::new("apt-get").args(["update", "-q"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// What `cargo xtask vmtest` needs: QEMU (system emulation and
/// `qemu-img`) and `debootstrap`. Installed on first use only, so that a
/// machine that never boots a guest does not carry them. Two steps:
/// installing Debian 12's qemu-system-x86 removes a newer qemu-utils
/// (from backports) that some machines carry, and the second step puts
/// Debian 12's back.
pub fn vm_tools() -> Result<()> {
    let install = |packages: &[&str]| -> Result<()> {
        if !is_root() {
            bail!("missing {packages:?} for the virtual machines: run as root");
        }
        apt_install(packages)
    };
    if !have("qemu-system-x86_64") || !have("debootstrap") {
        install(&["qemu-system-x86", "debootstrap"])?;
    }
    if !have("qemu-img") {
        install(&["qemu-utils"])?;
    }
    for cmd in ["qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4"] {
        if !have(cmd) {
            bail!("{cmd} is still missing after installing the VM tools");
        }
    }
    Ok(())
}

fn rust_src(say: &dyn Fn(&str)) -> Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is required (the eBPF build uses the nightly toolchain)")?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!("setup: installing the nightly toolchain");
        sh(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        say("nightly rust-src present");
        return Ok(());
    }
    eprintln!("setup: adding rust-src to the nightly toolchain");
    sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker(say: &dyn Fn(&str)) -> Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        say(&format!("bpf-linker {BPF_LINKER_VERSION} present"));
        return Ok(());
    }
    eprintln!("setup: installing bpf-linker {BPF_LINKER_VERSION} (takes a few minutes)");
    sh(Command::new("cargo")
        .args(["+nightly", "install", "--locked", "--force"])
        .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
        .env_remove("RUSTC")
        .env_remove("CARGO"))
}

fn bpffs(say: &dyn Fn(&str)) -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    {
        say("bpffs mounted at /sys/fs/bpf");
        return Ok(());
    }
    if !is_root() {
        eprintln!("setup: /sys/fs/bpf is not a bpffs and we are not root; pinning will fail");
        return Ok(());
    }
    if !Path::new("/sys/fs/bpf").exists() {
        std::fs::create_dir_all("/sys/fs/bpf").context("creating /sys/fs/bpf")?;
    }
    eprintln!("setup: mounting bpffs at /sys/fs/bpf");
    sh(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}

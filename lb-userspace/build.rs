//! Builds `lb-ebpf`'s programs for `bpfel-unknown-none` with the nightly
//! toolchain and `bpf-linker`, and leaves the objects in `OUT_DIR` for
//! `include_bytes_aligned!`.
//!
//! With `LB_EBPF=stub` it builds none and leaves empty objects instead:
//! checking, linting and unit-testing userspace code then needs neither
//! nightly nor `bpf-linker` nor their minutes (`cargo xtask test --unit`,
//! `cargo xtask check`); such a build refuses to load a program, naming
//! the variable.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    git_commit();
    println!("cargo:rerun-if-env-changed=LB_EBPF");
    if std::env::var("LB_EBPF").is_ok_and(|v| v == "stub") {
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        for name in ["lb-xdp", "lb-decap", "lb-bench"] {
            std::fs::write(out.join(name), b"")?;
        }
        return Ok(());
    }
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "lb-ebpf")
        .ok_or_else(|| anyhow!("lb-ebpf package not found"))?;
    let root = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], Toolchain::default()).context(
        "building the eBPF programs failed; run `cargo xtask setup` to install \
         the nightly rust-src component and bpf-linker",
    )
}

/// `LB_GIT_COMMIT`: the commit being built (`lb_build_info`), or
/// `unknown` outside a git checkout (a source tarball).
fn git_commit() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LB_GIT_COMMIT={commit}");
    for path in ["../.git/HEAD", "../.git/refs/heads"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

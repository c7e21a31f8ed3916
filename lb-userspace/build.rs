//! Builds `lb-ebpf`'s programs for `bpfel-unknown-none` with the nightly
//! toolchain and `bpf-linker`, and leaves the objects in `OUT_DIR` for
//! `include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    git_commit();
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

//! Builds `lb-ebpf`'s programs for `bpfel-unknown-none` with the nightly
//! toolchain and `bpf-linker`, and leaves the objects in `OUT_DIR` for
//! `include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
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

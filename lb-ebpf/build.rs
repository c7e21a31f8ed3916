//! Rebuild the eBPF objects when `bpf-linker` changes (it is an undeclared
//! dependency of every bin in this crate).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}

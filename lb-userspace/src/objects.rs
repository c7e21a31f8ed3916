//! The eBPF objects, built by `build.rs` and embedded in the binaries, so a
//! single `lbd` binary is all an operator installs.

/// The balancer (`lb_xdp`) and its maps.
pub static LB_XDP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-xdp"));

//! The eBPF objects, built by `build.rs` and embedded in the binaries, so a
//! single `lbd` binary is all an operator installs.

/// The balancer (`lb_xdp`) and its maps.
pub static LB_XDP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-xdp"));

/// The backend-side decapsulation program (`lb_decap`) and a trivial
/// `XDP_PASS` program (`lb_pass`, for the peer of a veth that receives
/// `XDP_TX` frames).
pub static LB_DECAP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-decap"));

/// Benchmark harness programs (`cargo xtask bench`; never loaded by `lbd`).
pub static LB_BENCH: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-bench"));

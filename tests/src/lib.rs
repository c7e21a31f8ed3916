//! Test infrastructure for lb: network-namespace rigs ([`rig`]), namespace
//! and veth guards ([`netns`]), and real TCP/UDP traffic ([`traffic`]).
//! Used by the end-to-end tests (`tests/e2e`) and the demo (`lb-demo`).

pub mod netns;
pub mod rig;
pub mod traffic;

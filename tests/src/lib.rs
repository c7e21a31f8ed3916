//! Test infrastructure for lb: network-namespace rigs ([`rig`]: one
//! balancer; [`ecmp`]: balancers behind a real BGP router with ECMP),
//! namespace and veth guards ([`netns`]), real TCP/UDP traffic
//! ([`traffic`]), a spoofed SYN flood ([`flood`]), real routers (BIRD,
//! FRR: [`routers`]) and lb's BGP speaker in a namespace ([`speaker`]),
//! and a differential fuzzer of the XDP program ([`fuzz`]). Used by the
//! end-to-end tests (`tests/e2e`), the demo (`lb-demo`), `lb-bgp-probe`
//! and `lb-fuzz`.

pub mod ecmp;
pub mod etcd;
pub mod flood;
pub mod fuzz;
pub mod netns;
pub mod quic;
pub mod rig;
pub mod routers;
pub mod scenario;
pub mod schema;
pub mod speaker;
pub mod stat;
pub mod traffic;

//! Helpers shared by the kernel test suites (`datapath`, `decap`).

use std::net::IpAddr;

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

pub fn v4(s: &str) -> [u8; 4] {
    match ip(s) {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => panic!("{s} is not IPv4"),
    }
}

pub fn v6(s: &str) -> [u8; 16] {
    match ip(s) {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(_) => panic!("{s} is not IPv6"),
    }
}

/// Fails the test, naming `suite`, unless it runs as root.
pub fn require_root(suite: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "{suite} tests load XDP programs and use BPF_PROG_TEST_RUN: they need root \
         (run `cargo xtask test` as root)"
    );
}

//! Helpers shared by the kernel test suites: every file of `tests/` is a
//! test crate that declares `mod common;` and uses part of what is here.
//!
//! - this module: addresses from literals, the XDP actions, the root check;
//! - [`packets`]: frame builders and checksum helpers (for `lb_xdp` and
//!   `lb_decap` alike);
//! - [`decap`]: the `lb_decap` rig and its counter check;
//! - [`xdp`]: the `lb_xdp` rig (the loaded program, programmed through the
//!   reconciler), its standard VIPs, the encapsulation check, and the
//!   fixture type with the runner that the feature suites' tables share.
//!
//! Nothing here is a test. The suites that exercise `lb_xdp` are `parse`,
//! `forward`, `golden`, `icmp` and `fragments`; `decap` exercises `lb_decap`;
//! `second_chance` both.

// Each test crate compiles this module whole and uses a subset of it, so
// what one crate leaves unused is dead there; `expect` would be unfulfilled
// in the crates that do use everything, hence `allow`.
#![allow(dead_code, reason = "each test crate uses a subset of the helpers")]

pub mod decap;
pub mod packets;
pub mod xdp;

use std::{fmt::Debug, io, net::IpAddr, process::Command};

use lb_common::CounterValue;

/// Runs one frame through `program` (`BPF_PROG_TEST_RUN`): `(action,
/// output frame)`, the output room 256 bytes over the input.
pub fn test_run(program: &aya::programs::Xdp, input: &[u8]) -> (u32, Vec<u8>) {
    use aya::programs::{TestRun as _, TestRunOptions};
    let mut out = vec![0u8; input.len() + 256];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ..TestRunOptions::new()
        })
        .expect("BPF_PROG_TEST_RUN failed");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

/// The counters of `all` (slot `id(c)` each) that moved from `before` to
/// `after`, in `all`'s order, each asserted to have moved by one packet of
/// `bytes` bytes; the slots past `all` must not have moved at all.
pub fn moved<C: Copy + Debug>(
    before: &[CounterValue],
    after: &[CounterValue],
    all: &[C],
    id: impl Fn(C) -> usize,
    bytes: usize,
    name: &str,
) -> Vec<C> {
    let mut moved = vec![];
    for c in all {
        let (b, a) = (before[id(*c)], after[id(*c)]);
        if a == b {
            continue;
        }
        assert_eq!(a.packets - b.packets, 1, "{name}: {c:?} packets");
        assert_eq!(a.bytes - b.bytes, bytes as u64, "{name}: {c:?} bytes");
        moved.push(*c);
    }
    for (i, (b, a)) in before.iter().zip(after).enumerate().skip(all.len()) {
        assert_eq!(a, b, "{name}: unused counter slot {i} moved");
    }
    moved
}

/// XDP actions (`enum xdp_action`), as `BPF_PROG_TEST_RUN` returns them.
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

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

/// Runs `f` on a new thread in a new network namespace of its own, which
/// disappears with the thread (and with it every interface made there).
/// The caller checks for root first ([`require_root`]).
pub fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) with a flag only changes this thread's
            // network namespace; children it spawns inherit it.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(
                rc,
                0,
                "unshare(CLONE_NEWNET): {}",
                io::Error::last_os_error()
            );
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Runs `ip ARGS` and asserts that it succeeded.
pub fn ip_cmd(args: &str) -> String {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

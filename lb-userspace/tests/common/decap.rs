//! The `lb_decap` rig: the program loaded with a backend's own addresses,
//! frames run through `BPF_PROG_TEST_RUN`, and the check that exactly the
//! expected counter moved.

use std::net::IpAddr;

use lb::decap::Decap;
use lb_common::{
    CounterValue,
    consts::GUE_PORT,
    counters::{DECAP_COUNTER_SLOTS, DecapCounter, DecapKind},
};

use super::{XDP_DROP, XDP_PASS, XDP_TX, require_root};

/// The loaded program with the backend's addresses.
pub struct DecapRig {
    pub decap: Decap,
}

impl DecapRig {
    /// `lb_decap` taking `local` as its own addresses (GUE on lb's port);
    /// `suite` names the test suite in the root check.
    pub fn new(suite: &str, local: &[IpAddr]) -> DecapRig {
        require_root(suite);
        let mut decap = Decap::load().unwrap_or_else(|e| {
            panic!("loading lb_decap failed (kernel without XDP/BTF support?): {e:#}")
        });
        decap
            .set_local_addrs(local, GUE_PORT)
            .expect("write local addresses");
        DecapRig { decap }
    }

    pub fn counters(&self) -> Vec<CounterValue> {
        self.decap.counters().expect("read counters")
    }

    /// Runs one frame through the program: `(action, output frame)`.
    pub fn run(&mut self, input: &[u8]) -> (u32, Vec<u8>) {
        super::test_run(self.decap.program(), input)
    }

    /// Runs `input` and asserts that exactly one counter moved, by one
    /// packet and the input frame's bytes, that it is `want`, and that the
    /// action is the one `want`'s kind implies.
    pub fn run_counted(&mut self, name: &str, input: &[u8], want: DecapCounter) -> (u32, Vec<u8>) {
        let before = self.counters();
        let (action, out) = self.run(input);
        let after = self.counters();
        assert_eq!(after.len(), DECAP_COUNTER_SLOTS as usize);
        let all = DecapCounter::ALL;
        let moved = super::moved(&before, &after, all, |c| c as usize, input.len(), name);
        assert_eq!(moved, vec![want], "{name}: counters that moved");
        let want_action = match want.kind() {
            DecapKind::Decap | DecapKind::Pass => XDP_PASS,
            DecapKind::Drop => XDP_DROP,
            DecapKind::Forward => XDP_TX,
        };
        assert_eq!(action, want_action, "{name}: action");
        (action, out)
    }
}

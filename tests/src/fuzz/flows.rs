//! Invariant 5: one flow, one backend, while the tables are unchanged.
//!
//! Within an epoch (no table change) every forwarded packet of a 5-tuple,
//! and every ICMP error quoting it, must reach the same backend; so must
//! every fragment of a 3-tuple, and every packet of a fragment-hashing
//! VIP's 3-tuple. A flow seen first in this epoch must reach a backend of
//! positive weight (the table's pick).
//!
//! The connection table outlives epochs, so a flow that may have entered
//! it in an earlier epoch is *carried over*: its packets may reach the
//! backend the old entry names (even of weight 0, as the README says)
//! until an eviction, or a SYN starting a new connection on the tuple,
//! re-picks it, once, after which it stays. That is the only move
//! allowed. A SYN of a carried-over flow goes to the table's pick (of
//! positive weight), while the flow's other packets may still follow the
//! old entry until the new connection takes it over.
//!
//! A GUE tunnel's source port comes from the flow hash: one flow, one
//! source port, across the whole run.
//!
//! A QUIC VIP's datagram routed by its connection ID (`fwd_quic_cid`) is
//! not recorded in the connection table, so it is no part of this
//! history: its flow's other packets (hashed, or connection-table hits,
//! which win over the connection ID) keep the rules above among
//! themselves, whichever server IDs its packets carry in between. A
//! connection-table hit is of a flow some packet may have recorded: a hit
//! for a flow only ever routed by its connection ID means it was recorded.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    net::IpAddr,
};

use super::{check::Violation, oracle::Flow};

/// Flows remembered before the tracker forgets (and turns lenient).
const MAX_FLOWS: usize = 8 << 20;

#[derive(Clone, Copy, Debug)]
struct Seen {
    epoch: u32,
    backend: Option<IpAddr>,
    carried_over: bool,
    moved: bool,
}

#[derive(Default)]
pub struct Flows {
    seen: HashMap<u64, Seen>,
    gue: HashMap<u64, u16>,
    epoch: u32,
    /// Set once the tracker had to forget: unknown flows may be carried over.
    forgot: bool,
}

/// A 64-bit fingerprint of a flow (FNV-1a over its fields).
fn key(flow: &Flow) -> u64 {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    flow.hash(&mut h);
    h.finish()
}

impl Flows {
    pub fn new_epoch(&mut self) {
        self.epoch += 1;
    }

    fn entry(&mut self, flow: &Flow) -> &mut Seen {
        if self.seen.len() >= MAX_FLOWS {
            self.seen.clear();
            self.forgot = true;
        }
        let (epoch, forgot) = (self.epoch, self.forgot);
        let e = self.seen.entry(key(flow)).or_insert(Seen {
            epoch,
            backend: None,
            carried_over: forgot && !flow.three_tuple,
            moved: false,
        });
        if e.epoch != epoch {
            // Fragments never enter the connection table.
            *e = Seen {
                epoch,
                backend: None,
                carried_over: !flow.three_tuple,
                moved: false,
            };
        }
        e
    }

    /// A packet of `flow` that the program may have recorded in the
    /// connection table without forwarding it.
    pub fn touch(&mut self, flow: &Flow) {
        self.entry(flow);
    }

    /// A packet of `flow` reached `backend` (of weight `weight`); `syn`:
    /// a TCP SYN without ACK.
    pub fn observe(
        &mut self,
        flow: &Flow,
        backend: IpAddr,
        weight: u32,
        syn: bool,
    ) -> Result<(), Violation> {
        let e = self.entry(flow);
        if syn && e.carried_over {
            if weight == 0 {
                let what = format!("SYN of {flow:?} sent to {backend}, of weight 0");
                return Err(Violation::new(5, "weight-zero", what));
            }
            return Ok(());
        }
        match e.backend {
            None => {
                e.backend = Some(backend);
                if weight == 0 && !e.carried_over {
                    let what = format!("new flow {flow:?} sent to {backend}, of weight 0");
                    return Err(Violation::new(5, "weight-zero", what));
                }
            }
            Some(b) if b == backend => {}
            Some(_) if e.carried_over && !e.moved => {
                e.moved = true;
                e.backend = Some(backend);
            }
            Some(b) => {
                let what = format!("flow {flow:?} went to {b}, now to {backend}, tables unchanged");
                return Err(Violation::new(5, "flow-moved", what));
            }
        }
        Ok(())
    }

    /// A connection-table hit for `flow`: some earlier packet may have
    /// recorded it ([`Flows::touch`], or forwarded; or the tracker forgot).
    pub fn recorded(&self, flow: &Flow) -> Result<(), Violation> {
        if self.forgot || self.seen.contains_key(&key(flow)) {
            return Ok(());
        }
        let what =
            format!("connection-table hit for {flow:?}, which no packet could have recorded");
        Err(Violation::new(5, "hit-unrecorded", what))
    }

    /// Whether `flow` may follow a connection-table entry of an earlier
    /// epoch.
    pub fn carried_over(&mut self, flow: &Flow) -> bool {
        self.entry(flow).carried_over
    }

    /// A GUE tunnel of `flow` had source port `port`.
    pub fn gue_port(&mut self, flow: &Flow, port: u16) -> Result<(), Violation> {
        let seen = *self.gue.entry(key(flow)).or_insert(port);
        if seen != port {
            let what = format!("flow {flow:?}: GUE source port {port}, earlier {seen}");
            return Err(Violation::new(5, "gue-port", what));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(sport: u16) -> Flow {
        Flow {
            src: "192.0.2.1".parse().expect("literal"),
            dst: "10.0.0.10".parse().expect("literal"),
            proto: 6,
            sport,
            dport: 80,
            three_tuple: false,
        }
    }

    #[test]
    fn a_new_flow_may_not_move() {
        let mut f = Flows::default();
        let (a, b) = (
            "10.1.0.1".parse().expect("a"),
            "10.1.0.2".parse().expect("b"),
        );
        f.observe(&flow(1), a, 1, true).expect("first");
        f.observe(&flow(1), a, 1, false).expect("same");
        assert!(f.observe(&flow(1), b, 1, false).is_err());
        assert!(f.observe(&flow(1), b, 1, true).is_err(), "a SYN too");
    }

    #[test]
    fn a_carried_over_flow_moves_once() {
        let mut f = Flows::default();
        let (a, b) = (
            "10.1.0.1".parse().expect("a"),
            "10.1.0.2".parse().expect("b"),
        );
        f.touch(&flow(1));
        f.new_epoch();
        f.observe(&flow(1), a, 0, false)
            .expect("old entry, weight 0");
        f.observe(&flow(1), b, 1, true)
            .expect("a SYN: the table's pick");
        f.observe(&flow(1), a, 0, false)
            .expect("still the old entry");
        assert!(
            f.observe(&flow(1), b, 0, true).is_err(),
            "a SYN to weight 0"
        );
        f.observe(&flow(1), b, 1, false).expect("re-picked");
        assert!(f.observe(&flow(1), a, 0, false).is_err(), "no way back");
    }

    #[test]
    fn a_hit_needs_a_packet_that_may_have_recorded_the_flow() {
        let mut f = Flows::default();
        assert!(f.recorded(&flow(1)).is_err(), "never seen");
        f.touch(&flow(1));
        f.recorded(&flow(1)).expect("touched");
        f.new_epoch();
        f.recorded(&flow(1)).expect("touched in an earlier epoch");
        assert!(f.recorded(&flow(2)).is_err());
    }
}

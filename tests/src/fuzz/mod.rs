//! A differential fuzzer for the balancer's XDP program: generated and
//! mutated frames run through the real `lb_xdp` with `BPF_PROG_TEST_RUN`,
//! its maps programmed as `lbd` programs them, every outcome judged
//! against an oracle that reads the frame independently (etherparse and
//! code of its own; nothing of lb's parser, hash, tables or `predict`).
//!
//! The run is cut into epochs; between them the settings (malformed and
//! no-DF policies, MTU, echo replies, outer source prefix, GUE port), some
//! VIPs' backends, and the QUIC VIPs' connection-ID configuration, server
//! IDs and backends' health change. On the first violation the run stops
//! and reports the frame, shrunk as far as the same violation persists.
//!
//! A seed replays the same frames, epochs and connection-table buckets;
//! which way a full bucket evicts depends on the kernel clock, so
//! connection-table hits may differ by a few in a thousand between runs.
//! `lb-fuzz` and `cargo xtask fuzz` run it; `tests/e2e/fuzz.rs` runs it in
//! the suite.

mod check;
mod csum;
mod flows;
mod generate;
mod model;
mod oracle;
mod reply;
mod report;
mod rng;
mod shrink;
mod target;
mod wire;

use std::time::Instant;

use anyhow::Result;
use lb_common::{Counter, CounterValue, counters::Kind};

use check::{Judged, Sent, Violation};
use flows::Flows;
use generate::{Gen, Generator};
use model::Model;
use oracle::{Expect, Flow, Forward};
pub use report::{Found, Report, Stats, hexdump};
use target::{Run, Target};

/// Frames per epoch. Fixed, so that a run of fewer frames with the same
/// seed replays the same frames in the same epochs.
const EPOCH: u64 = 25_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub packets: u64,
    pub seed: u64,
    /// Print a line every this many frames (0: never).
    pub progress: u64,
}

/// A fresh seed (time and process id mixed).
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    rng::Rng::new(t ^ u64::from(std::process::id()) << 40).next_u64()
}

/// Runs the fuzzer; `Err` only for failures of the machinery (loading,
/// syscalls), a violation is in the report.
pub fn run(opts: &Options) -> Result<Report> {
    let mut f = Fuzzer::new(opts.seed)?;
    let start = Instant::now();
    let mut found = None;
    for index in 0..opts.packets {
        if index > 0 && index % EPOCH == 0 {
            f.next_epoch()?;
        }
        if opts.progress > 0 && index > 0 && index % opts.progress == 0 {
            let rate = index as f64 / start.elapsed().as_secs_f64();
            eprintln!(
                "lb-fuzz: {index} frames, {rate:.0}/s, epoch {}",
                f.model.epoch
            );
        }
        let sample = f.frames.next(&f.model);
        if let Some(aim) = sample.quic {
            f.stats.quic_aim(aim);
        }
        if let Some((violation, why)) = f.step(sample.source, &sample.frame)? {
            found = Some(f.found(index, sample.source, violation, why, sample.frame)?);
            break;
        }
    }
    Ok(Report {
        seed: opts.seed,
        elapsed: start.elapsed(),
        epochs: f.model.epoch + 1,
        linear_max: f.target.linear_max,
        stats: f.stats,
        found,
    })
}

struct Fuzzer {
    model: Model,
    target: Target,
    frames: Generator,
    epoch_rng: rng::Rng,
    flows: Flows,
    stats: Stats,
    before: Vec<CounterValue>,
    after: Vec<CounterValue>,
}

impl Fuzzer {
    fn new(seed: u64) -> Result<Fuzzer> {
        let model = Model::with_seed(seed);
        let mut target = Target::load(&model, seed)?;
        let linear = target.probe_linear_max()?;
        let mut before = Vec::new();
        target.counters(&mut before)?;
        Ok(Fuzzer {
            model,
            target,
            frames: Generator::new(seed, linear),
            epoch_rng: rng::Rng::new(seed ^ 0x6570_6f63_6873),
            flows: Flows::default(),
            stats: Stats::default(),
            before,
            after: Vec::new(),
        })
    }

    fn next_epoch(&mut self) -> Result<()> {
        self.model.next_epoch(&mut self.epoch_rng);
        self.target.program(&self.model)?;
        self.flows.new_epoch();
        self.frames.new_epoch();
        self.target.counters(&mut self.before)?;
        Ok(())
    }

    /// Runs one frame and judges it; `Some` is a violation and what the
    /// oracle read.
    fn step(&mut self, source: Gen, frame: &[u8]) -> Result<Option<(Violation, String)>> {
        let run = self.target.run(frame)?;
        self.target.counters(&mut self.after)?;
        let verdict = match run {
            Run::Refused => {
                self.stats.class(source, report::REFUSED);
                (self.before != self.after).then(|| {
                    let v =
                        Violation::new(4, "refused-counted", "counters moved for a refused frame");
                    (v, "a frame the kernel refused".to_string())
                })
            }
            Run::Ran { .. } if frame.len() > self.target.linear_max => {
                // Not judged, but the program saw the first buffer as a
                // frame of its own (or the whole) and may have recorded its
                // flow.
                let seen = &frame[..self.target.linear_max];
                for e in [
                    oracle::expect(&self.model, seen),
                    oracle::expect(&self.model, frame),
                ] {
                    if let Some(flow) = e.touches {
                        self.flows.touch(&flow);
                    }
                }
                self.stats.class(source, report::MULTI_BUFFER);
                None
            }
            Run::Ran { action } => {
                let expect = oracle::expect(&self.model, frame);
                match self.judge(frame, action, &expect) {
                    Ok((counter, judged)) => {
                        self.stats.class(source, counter.name());
                        if let Some(q) = &expect.quic {
                            self.stats.quic(q, counter);
                        }
                        if let Some(d) = judged.deviation {
                            self.stats.deviation(d, frame);
                        }
                        self.features(frame, action, counter, &expect, judged.sent);
                        None
                    }
                    Err(v) => Some((v, expect.reading())),
                }
            }
        };
        std::mem::swap(&mut self.before, &mut self.after);
        Ok(verdict)
    }

    /// Invariants 1, 2, 3, 4, 6 and 7 for the frame just run in one
    /// buffer.
    fn verify(
        &self,
        frame: &[u8],
        action: u32,
        expect: &Expect,
    ) -> Result<(Counter, Judged), Violation> {
        let m = &self.model;
        let drop = m.settings.malformed_drop;
        let counter = check::outcome(&self.before, &self.after, frame.len(), action, drop)?;
        let judged = check::frame(m, frame, action, self.target.output(), counter, expect)?;
        check::quic(&self.before, &self.after, counter, expect, judged.sent)?;
        Ok((counter, judged))
    }

    /// [`Fuzzer::verify`], then invariant 5 with the flow history. A
    /// connection-table hit must be of a flow some packet may have
    /// recorded; a datagram routed by its QUIC connection ID is no part of
    /// its flow's history (it was not recorded, and its backend is the
    /// server ID's, checked by invariant 7), but its GUE source port is.
    fn judge(
        &mut self,
        frame: &[u8],
        action: u32,
        expect: &Expect,
    ) -> Result<(Counter, Judged), Violation> {
        let (counter, judged) = self.verify(frame, action, expect)?;
        if counter == Counter::FwdConntrack
            && let Some(fwd) = &expect.forward
        {
            self.flows.recorded(&fwd.flow)?;
        }
        if let Some(flow) = &expect.touches {
            self.flows.touch(flow);
        }
        if let (Some(sent), Some(fwd)) = (judged.sent, &expect.forward) {
            if counter != Counter::FwdQuicCid {
                self.history(fwd, sent, counter)?;
            }
            if let Some(port) = sent.gue_sport {
                self.flows.gue_port(&fwd.flow, port)?;
            }
        }
        Ok((counter, judged))
    }

    /// Invariant 5 for a packet of `fwd.flow` sent to `sent.backend`: its
    /// 5-tuple, and the 3-tuple of a fragment-hashing VIP or the client
    /// of a VIP with affinity.
    fn history(&mut self, fwd: &Forward, sent: Sent, counter: Counter) -> Result<(), Violation> {
        let m = &self.model;
        // A SYN the connection table placed (its tuple's entry is
        // protected) follows the flow's history like any other packet.
        let syn = fwd.syn && counter != Counter::FwdConntrack;
        self.flows
            .observe(&fwd.flow, sent.backend, sent.weight, syn)?;
        if m.vips[fwd.vip].frag_hash && !fwd.flow.three_tuple && !self.flows.carried_over(&fwd.flow)
        {
            let three = Flow {
                sport: 0,
                dport: 0,
                three_tuple: true,
                ..fwd.flow
            };
            self.flows
                .observe(&three, sent.backend, sent.weight, false)?;
        }
        if let Some(affinity) = m.vips[fwd.vip].affinity
            && !self.flows.carried_over(&fwd.flow)
        {
            // One client, one backend: its flows keyed by the client
            // alone (as fragments are keyed by their 3-tuple).
            let client = Flow {
                src: model::client_of(fwd.flow.src, affinity),
                sport: 0,
                dport: 0,
                three_tuple: true,
                ..fwd.flow
            };
            self.flows
                .observe(&client, sent.backend, sent.weight, false)?;
        }
        Ok(())
    }

    /// Re-runs `frame` from an empty connection table without recording
    /// flow history (for the shrinker): the violation it breaks, if any,
    /// and the oracle's reading.
    fn rerun(&mut self, frame: &[u8]) -> Result<Option<(Violation, String)>> {
        if frame.len() < 14 || frame.len() > self.target.linear_max {
            return Ok(None);
        }
        self.target.clear_flows()?;
        let run = self.target.run(frame)?;
        self.target.counters(&mut self.after)?;
        let result = match run {
            Run::Refused => None,
            Run::Ran { action } => {
                let expect = oracle::expect(&self.model, frame);
                let verdict = self.verify(frame, action, &expect);
                verdict.err().map(|v| (v, expect.reading()))
            }
        };
        std::mem::swap(&mut self.before, &mut self.after);
        Ok(result)
    }

    fn found(
        &mut self,
        index: u64,
        source: Gen,
        violation: Violation,
        why: String,
        frame: Vec<u8>,
    ) -> Result<Found> {
        // A flow's history cannot be replayed by one frame: no shrinking.
        // Otherwise every candidate runs from an empty connection table, so
        // the reproducer stands alone (or, if the violation needed earlier
        // flows, the frame is reported as it was).
        let shrunk = if violation.invariant == 5 {
            frame.clone()
        } else {
            shrink::shrink(&frame, |candidate| {
                Ok(matches!(self.rerun(candidate)?, Some((v, _)) if v.same_as(&violation)))
            })?
        };
        let shrunk_reading = match self.rerun(&shrunk)? {
            Some((v, why)) if v.same_as(&violation) => Some((v, why)),
            _ => None,
        };
        Ok(Found {
            index,
            epoch: self.model.epoch,
            source,
            violation,
            why,
            frame,
            shrunk,
            shrunk_reading,
        })
    }

    /// Records the shapes of what the program did (for coverage).
    fn features(
        &mut self,
        frame: &[u8],
        action: u32,
        counter: Counter,
        expect: &Expect,
        sent: Option<Sent>,
    ) {
        let st = &mut self.stats;
        match counter.kind() {
            Kind::Malformed if action == target::XDP_PASS => {
                st.feature("malformed passed (policy pass)")
            }
            Kind::Malformed => st.feature("malformed dropped (policy drop)"),
            Kind::Reply if expect.l2 == 18 => st.feature("reply with a VLAN tag"),
            _ => {}
        }
        let (Some(fwd), Some(sent)) = (&expect.forward, sent) else {
            return;
        };
        let inner = if frame[fwd.inner.start] >> 4 == 6 {
            "6"
        } else {
            "4"
        };
        let outer = if sent.backend.is_ipv6() { "6" } else { "4" };
        let encap = self.model.vips[fwd.vip].encap;
        if counter == Counter::FwdSecondChance {
            st.feature(report::second_chance_feature(&format!("{inner}in{outer}")));
        } else {
            st.feature(report::tunnel_feature(encap, &format!("{inner}in{outer}")));
        }
        if expect.l2 == 18 {
            st.feature("forwarded with a VLAN tag");
        }
        if fwd.inner.end < frame.len() {
            st.feature("forwarded with Ethernet padding");
        }
        let family = if inner == "6" { "IPv6" } else { "IPv4" };
        if fwd.icmp_error {
            st.feature(format!("ICMP error forwarded, {family}"));
        } else if fwd.flow.three_tuple {
            st.feature(format!("fragment forwarded, {family}"));
        }
    }
}

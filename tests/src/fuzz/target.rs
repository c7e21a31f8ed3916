//! The program under test: the real `lb_xdp`, loaded without pins by
//! `KernelDataplane::load` and programmed through the reconciler exactly
//! as `lbd` programs it (`adopt`, `apply_settings`, `apply`). Frames go in
//! through `BPF_PROG_TEST_RUN`; the outcome counters come back with one
//! batch syscall per frame. Nothing here interprets a packet.

use anyhow::{Context as _, Result};
use aya::programs::{ProgramError, TestRun as _, TestRunOptions};
use lb::{
    Reconciler,
    dataplane::{Dataplane as _, KernelDataplane, Layout, read_per_cpu_into, zero_array},
};
use lb_common::{CounterValue, FlowBucket, counters::COUNTER_SLOTS};

use super::model::Model;

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// Maglev table size: prime, more than one 1024-slot chunk.
const TABLE_SIZE: u32 = 4099;
/// Connection-table buckets: small enough that flows get evicted.
const CT_BUCKETS: u32 = 1 << 12;

/// What one frame did.
#[derive(Debug)]
pub enum Run {
    /// `BPF_PROG_TEST_RUN` refused the frame (`EINVAL`: under 14 bytes).
    Refused,
    /// The program ran: its action; the output is in [`Target::output`].
    Ran { action: u32 },
}

pub struct Target {
    r: Reconciler<KernelDataplane>,
    out: Vec<u8>,
    out_len: usize,
    cpus: usize,
    scratch: (Vec<u32>, Vec<CounterValue>),
    /// Largest frame the kernel hands the program in one buffer.
    pub linear_max: usize,
}

impl Target {
    /// Loads `lb_xdp` and programs `model` into its maps. The
    /// connection-table seed, which the reconciler would draw at random for
    /// fresh maps (and keeps when set), comes from `seed`, so that a replay
    /// puts flows in the same buckets.
    pub fn load(model: &Model, seed: u64) -> Result<Target> {
        let layout = Layout {
            table_size: TABLE_SIZE,
            max_vips: 64,
            max_backends: 256,
            ct_buckets: CT_BUCKETS,
            table_pool: 0,
            second_chance_vips: 2,
        };
        let mut dp = KernelDataplane::load(layout)
            .context("loading lb_xdp (root and a kernel with XDP test runs are needed)")?;
        let mut cfg = dp.config()?;
        cfg.ct_seed = seed | 1;
        dp.set_config(&cfg)?;
        let r = Reconciler::adopt(dp).context("adopting fresh maps")?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        let mut t = Target {
            r,
            out: vec![0; 8192],
            out_len: 0,
            cpus,
            scratch: Default::default(),
            linear_max: 0,
        };
        t.program(model)?;
        // The IPv6 key from the seed too (`lbd` wrote a random one), so that
        // a seed replays every bucket; the maps' legacy deadline is kept.
        let dp = t.r.dataplane_mut();
        let mut key = dp.ct_key()?;
        let mut state = seed;
        for word in &mut key.k {
            state = lb_common::flow::fmix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
            *word = state as u32;
        }
        dp.set_ct_key(&key)?;
        Ok(t)
    }

    /// Writes `model`'s settings and VIPs (a backend usable if it is up).
    pub fn program(&mut self, model: &Model) -> Result<()> {
        self.r
            .apply_settings(&model.lb_settings())
            .context("writing the datapath settings")?;
        self.r
            .apply(&model.lb_vips(), &|_, addr| model.is_up(*addr))
            .context("programming the VIPs")?;
        Ok(())
    }

    /// Runs `frame` through the program once.
    pub fn run(&mut self, frame: &[u8]) -> Result<Run> {
        if self.out.len() < frame.len() + 512 {
            self.out.resize(frame.len() + 512, 0);
        }
        let result = self.r.dataplane_mut().program().test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut self.out),
            ..TestRunOptions::new()
        });
        match result {
            Ok(r) => {
                self.out_len = r.data_size_out as usize;
                Ok(Run::Ran {
                    action: r.return_value,
                })
            }
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EINVAL) =>
            {
                self.out_len = 0;
                Ok(Run::Refused)
            }
            Err(e) => Err(e).with_context(|| format!("BPF_PROG_TEST_RUN of {} bytes", frame.len())),
        }
    }

    /// The frame the last run left.
    pub fn output(&self) -> &[u8] {
        &self.out[..self.out_len.min(self.out.len())]
    }

    /// Every counter slot, summed over the CPUs, read with one syscall.
    pub fn counters(&mut self, out: &mut Vec<CounterValue>) -> Result<()> {
        let fd = self.r.dataplane().counters_fd();
        let add = |sum: &mut CounterValue, v: &CounterValue| *sum += *v;
        read_per_cpu_into(fd, COUNTER_SLOTS, self.cpus, &mut self.scratch, add, out)
            .context("BPF_MAP_LOOKUP_BATCH on the counters")
    }

    /// Empties the connection table (one syscall), so that a frame runs
    /// as it would on a fresh balancer with the same tables.
    pub fn clear_flows(&mut self) -> Result<()> {
        let fd = self.r.dataplane().flows_fd();
        let size = std::mem::size_of::<FlowBucket>();
        zero_array(fd, CT_BUCKETS, size).context("BPF_MAP_UPDATE_BATCH on the flows")
    }

    /// Finds the largest frame `BPF_PROG_TEST_RUN` gives the program in one
    /// buffer (larger ones become multi-buffer: the program sees only the
    /// first part): the bytes the program counts for a non-IP frame are
    /// the bytes it saw.
    pub fn probe_linear_max(&mut self) -> Result<usize> {
        let seen = |t: &mut Target, len: usize| -> Result<u64> {
            let mut before = Vec::new();
            let mut after = Vec::new();
            t.counters(&mut before)?;
            let mut frame = vec![0u8; len];
            frame[12..14].copy_from_slice(&[0x08, 0x06]); // ARP
            t.run(&frame)?;
            t.counters(&mut after)?;
            Ok(before
                .iter()
                .zip(&after)
                .map(|(b, a)| a.bytes - b.bytes)
                .max()
                .unwrap_or(0))
        };
        let (mut lo, mut hi) = (64usize, 16384usize);
        if seen(self, hi)? as usize == hi {
            self.linear_max = hi;
            return Ok(hi);
        }
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if seen(self, mid)? as usize == mid {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.linear_max = lo;
        Ok(lo)
    }
}

//! Two CPUs at once: the datapath's net cost per packet on one CPU alone
//! and on both CPUs together, one `BPF_PROG_TEST_RUN` thread pinned to
//! each, and the throughput per CPU relative to one CPU alone.
//!
//! Each thread has a harness of its own (its own frame and sequence, so
//! the harness shares nothing between CPUs) that tail-calls the same
//! balancer. Within a round the threads start each batch together (a
//! barrier), the empty program first, then the balancer: the net cost is
//! the median over rounds of the difference. Classes: an established
//! flow per CPU; new flows (not SYNs) into the 2M-bucket connection
//! table; new SYNs; new flows of both CPUs into the same 64 buckets
//! (every insert contends for lines the other CPU writes); and an
//! established flow on one CPU while the other is flooded with SYNs.

use std::sync::Barrier;

use super::*;

/// One CPU's work in a run: its frame, the stamp offset (0: the same
/// flow every time), and a warm-up frame sent once before.
struct Work {
    frame: Vec<u8>,
    stamp: u32,
    warm: Option<Vec<u8>>,
}

/// A class: its name, the connection table it runs on, and the work of
/// CPU 0 and CPU 1 (alike, or CPU 1 disturbing CPU 0).
struct Class {
    name: &'static str,
    ct_buckets: u32,
    cpu0: Work,
    cpu1: Work,
    alike: bool,
}

const NEW_FLOW_STAMP: u32 = 26;

fn classes() -> Vec<Class> {
    let est = |port| Work {
        frame: tcp4([10, 0, 0, 10], port, false),
        stamp: 0,
        warm: Some(tcp4([10, 0, 0, 10], port, false)),
    };
    let new = |port, syn| Work {
        frame: tcp4([10, 0, 0, 10], port, syn),
        stamp: NEW_FLOW_STAMP,
        warm: None,
    };
    vec![
        Class {
            name: "established TCP, a flow per CPU",
            ct_buckets: 1 << 21,
            cpu0: est(2000),
            cpu1: est(2001),
            alike: true,
        },
        Class {
            name: "new flows (not SYNs), 2M-bucket table",
            ct_buckets: 1 << 21,
            cpu0: new(3000, false),
            cpu1: new(3001, false),
            alike: true,
        },
        Class {
            name: "new SYNs",
            ct_buckets: 1 << 21,
            cpu0: new(3500, true),
            cpu1: new(3501, true),
            alike: true,
        },
        Class {
            name: "new flows of both CPUs into the same 64 buckets",
            ct_buckets: 64,
            cpu0: new(3000, false),
            cpu1: new(3001, false),
            alike: true,
        },
        Class {
            name: "established on CPU 0, SYN flood on CPU 1",
            ct_buckets: 1 << 21,
            cpu0: est(2000),
            cpu1: new(3500, true),
            alike: false,
        },
    ]
}

/// Net ns per packet of each thread (CPU `cpus[i]` runs `work[i]`),
/// batches started together.
fn net_per_cpu(lb: &ProgramFd, work: &[&Work], cpus: &[usize]) -> Result<Vec<Stat>> {
    let barrier = Barrier::new(work.len());
    std::thread::scope(|s| {
        let threads: Vec<_> = work
            .iter()
            .zip(cpus)
            .map(|(w, &cpu)| {
                let (barrier, lb) = (&barrier, lb.try_clone());
                s.spawn(move || -> Result<Stat> {
                    pin_to_cpu(cpu);
                    one_cpu(&lb?, w, barrier)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a bench thread panicked"))?
            })
            .collect()
    })
}

/// One thread: its own harness, `RUNS` rounds of (empty, balancer).
fn one_cpu(lb: &ProgramFd, w: &Work, barrier: &Barrier) -> Result<Stat> {
    let mut h = Harness::load()?;
    let empty = h.fd("bench_pass")?;
    if let Some(warm) = &w.warm {
        h.jump_to(lb)?;
        h.set_packet(warm, 0, 0)?;
        let r = h.prog("lb_bench")?.test_run(TestRunOptions {
            data_in: Some(warm),
            ..TestRunOptions::new()
        })?;
        if r.return_value != XDP_TX {
            bail!("the warm-up packet was not forwarded");
        }
    }
    let mut net = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        h.jump_to(&empty)?;
        h.set_packet(&w.frame, 0, 0)?;
        barrier.wait();
        let e = h.batch(&w.frame, XDP_PASS)?;
        h.jump_to(lb)?;
        h.set_packet(&w.frame, w.stamp, 0)?;
        barrier.wait();
        let t = h.batch(&w.frame, XDP_TX)?;
        net.push(t - e);
    }
    Ok(Stat::of(net))
}

pub(super) fn print_multicore() -> Result<()> {
    println!("## Two CPUs at once");
    println!();
    println!(
        "Net ns per packet (median over {RUNS} rounds of {REPEAT}-repeat batches) on CPU 0 alone, then on CPUs 0 and 1 together, each CPU with its own harness and `BPF_PROG_TEST_RUN` thread, batches started together. \"÷ alone\": the CPU's throughput with both running over CPU 0's alone (1.00 is linear scaling)."
    );
    println!();
    println!("| class | CPU 0 alone | CPU 0, both | CPU 1, both | ÷ alone: CPU 0 \\| CPU 1 |");
    println!("| --- | --- | --- | --- | --- |");
    for c in classes() {
        let mut r = balancer(c.ct_buckets)?;
        let lb = r.dataplane_mut().program().fd()?.try_clone()?;
        let alone = net_per_cpu(&lb, &[&c.cpu0], &[0])?;
        let both = net_per_cpu(&lb, &[&c.cpu0, &c.cpu1], &[0, 1])?;
        // A flood's own figure is not comparable with CPU 0's alone.
        let cpu1_ratio = if c.alike {
            format!("{:.2}", alone[0].median / both[1].median)
        } else {
            "—".into()
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2} \\| {cpu1_ratio} |",
            c.name,
            alone[0].median,
            both[0].median,
            both[1].median,
            alone[0].median / both[0].median,
        );
        drop(r);
    }
    println!();
    Ok(())
}

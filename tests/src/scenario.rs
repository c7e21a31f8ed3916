//! Building blocks shared by the end-to-end test files: a rig with `lbd`
//! running, streams, predictions, and the one-test-at-a-time lock.

use std::{sync::Mutex, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    rig::{CLIENT, Lbd, Rig},
    traffic::{Stream, StreamReport},
};

static SERIAL: Mutex<()> = Mutex::new(());

/// Tests of one binary run one at a time: they share two cores and the
/// timing of streaming connections.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A rig with `n` backends and `lbd` running with `weights`.
pub fn setup(n: usize, weights: &[Option<u32>]) -> Result<(Rig, Lbd)> {
    setup_with(n, weights, "")
}

/// As [`setup`], with extra YAML for the TCP VIP (see [`Rig::config_with`]).
pub fn setup_with(n: usize, weights: &[Option<u32>], tcp_extra: &str) -> Result<(Rig, Lbd)> {
    let rig = Rig::new(n)?;
    let config = rig.dir.join("lbd.yaml");
    std::fs::write(&config, rig.config_with(weights, tcp_extra))?;
    let lbd = Lbd::start(&rig, &config)?;
    Ok((rig, lbd))
}

/// The backend `lbctl simulate` predicts for a new client connection to the
/// TCP VIP from `sport`.
pub fn predicted(lbd: &Lbd, rig: &Rig, sport: u16) -> Result<String> {
    let sim = lbd.simulate_syn(sport)?;
    let addr = sim["backend"]
        .as_str()
        .context("simulate names a backend")?;
    rig.backends
        .iter()
        .find(|b| b.addr.to_string() == addr)
        .map(|b| b.name.clone())
        .with_context(|| format!("simulate named unknown backend {addr}"))
}

/// How often a stream of [`run_streams`] makes a round trip: every 20 ms,
/// and every 200 ms in an emulated guest (`cargo xtask vmtest` sets
/// `LB_VM_GUEST`). There fifty streams at 20 ms (2,500 round trips a
/// second through client, balancer and backends, each a thread) kept the
/// guest's CPUs busy: a restart of `lbd` under them took 157 s where a
/// first start took 32 s, and once more than the ten-fold safety net. The
/// streams are there to see connections survive, not to load the box.
pub fn stream_every() -> Duration {
    if std::env::var_os("LB_VM_GUEST").is_some() {
        Duration::from_millis(200)
    } else {
        Duration::from_millis(20)
    }
}

/// How long a stream of [`run_streams`] waits for one answer: 3 s, and
/// 20 s in an emulated guest. A guest whose host is busy (CI beside other
/// work) stalls for seconds: a clean run at c88432c saw 38 of 50 streams
/// time out at 3 s across the `kill -9` and restart, none reset. A
/// broken connection is a reset or a close, which no patience hides.
pub fn stream_patience() -> Duration {
    if std::env::var_os("LB_VM_GUEST").is_some() {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(3)
    }
}

/// Long-lived connections from the client, one per source port.
pub fn run_streams(rig: &Rig, ports: std::ops::Range<u16>) -> Result<Vec<Stream>> {
    ports
        .map(|p| {
            let (every, patience) = (stream_every(), stream_patience());
            Stream::start_with(&rig.client, CLIENT, p, rig.tcp_vip(), every, patience)
        })
        .collect()
}

pub fn finish(streams: Vec<Stream>) -> Result<Vec<StreamReport>> {
    streams.into_iter().map(Stream::finish).collect()
}

/// Turns a scenario's error into a test failure with the whole chain.
pub fn check(result: Result<()>) {
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

/// A child process (an `lbctl` that waits, say), killed and reaped when
/// dropped unless it was waited for.
pub struct KillOnDrop(Option<std::process::Child>);

impl KillOnDrop {
    pub fn new(child: std::process::Child) -> Self {
        Self(Some(child))
    }

    /// Waits at most `limit` for the child to exit, then returns its exit
    /// status and standard output (piped); past `limit` it is killed and
    /// that is an error.
    pub fn wait_with_output(mut self, limit: Duration) -> Result<std::process::Output> {
        use std::io::Read as _;
        let mut child = self.0.take().context("waited twice")?;
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("the child did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stdout = Vec::new();
        if let Some(mut out) = child.stdout.take() {
            out.read_to_end(&mut stdout)?;
        }
        let mut stderr = Vec::new();
        if let Some(mut err) = child.stderr.take() {
            err.read_to_end(&mut stderr)?;
        }
        Ok(std::process::Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Kills the child and returns what it wrote.
    pub fn kill_with_output(mut self) -> Result<std::process::Output> {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
        }
        self.wait_with_output(Duration::from_secs(5))
    }

    /// Whether the child has exited (it is then reaped by
    /// [`wait_with_output`](Self::wait_with_output)).
    pub fn exited(&mut self) -> Result<bool> {
        let child = self.0.as_mut().context("waited for already")?;
        Ok(child.try_wait()?.is_some())
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

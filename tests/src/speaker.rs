//! The balancer side of the BGP tests: lb's speaker ([`lb::announce::bgp`])
//! running in a thread that entered a speaker namespace, with its own
//! tokio runtime ([`SpeakerThread`]), or in a helper process
//! (`lb-bgp-probe`, [`Probe`]) that a test can freeze with SIGSTOP. Both
//! are driven with the same three operations and both stop when dropped.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    net::IpAddr,
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Stdio},
    sync::Once,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow, bail};
use lb::announce::{Announcer as _, BgpConfig, BgpSpeaker, PeerStatus};
use tokio::sync::{mpsc, oneshot};

use crate::{netns::Netns, rig::bin_path};

/// Sends the library's logs to the test's output (shown when a test
/// fails), once per process.
pub fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "lb=debug".into()),
            )
            .with_test_writer()
            .with_ansi(false)
            .try_init();
    });
}

enum Command {
    Set(BTreeSet<IpAddr>, oneshot::Sender<Result<(), String>>),
    Status(oneshot::Sender<Vec<PeerStatus>>),
    Shutdown(oneshot::Sender<Result<(), String>>),
}

/// A [`BgpSpeaker`] on a thread inside a namespace (a current-thread tokio
/// runtime, so every socket it opens is in that namespace). Shut down and
/// joined when dropped.
pub struct SpeakerThread {
    commands: Option<mpsc::UnboundedSender<Command>>,
    /// `Err` if the thread could not enter the namespace.
    thread: Option<JoinHandle<Result<()>>>,
}

impl SpeakerThread {
    pub fn start(ns: &Netns, config: BgpConfig) -> Result<SpeakerThread> {
        init_logs();
        let (commands, mut rx) = mpsc::unbounded_channel::<Command>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = ns.spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let mut speaker = match BgpSpeaker::start(config) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while let Some(command) = rx.recv().await {
                    match command {
                        Command::Set(set, reply) => {
                            let _ =
                                reply.send(speaker.set_announced(&set).map_err(|e| e.to_string()));
                        }
                        Command::Status(reply) => {
                            let _ = reply.send(speaker.status());
                        }
                        Command::Shutdown(reply) => {
                            let r = speaker.shutdown().await.map_err(|e| e.to_string());
                            let _ = reply.send(r);
                            return;
                        }
                    }
                }
                // The handle went away without a shutdown.
                let _ = speaker.shutdown().await;
            });
        });
        let mut this = SpeakerThread {
            commands: Some(commands),
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(this),
            Ok(Err(e)) => bail!("the speaker did not start: {e}"),
            Err(_) => {
                this.join();
                bail!("the speaker thread did not start")
            }
        }
    }

    fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .as_ref()
            .context("the speaker is shut down")?
            .send(make(tx))
            .map_err(|_| anyhow!("the speaker thread is gone"))?;
        rx.blocking_recv()
            .map_err(|_| anyhow!("the speaker thread dropped the request"))
    }

    /// `set_announced`.
    pub fn set(&self, vips: &[IpAddr]) -> Result<()> {
        let set = vips.iter().copied().collect();
        self.call(|tx| Command::Set(set, tx))?
            .map_err(|e| anyhow!("set_announced: {e}"))
    }

    pub fn status(&self) -> Result<Vec<PeerStatus>> {
        self.call(Command::Status)
    }

    /// The status row of the peer at `addr` (`10.98.1.1:179`).
    pub fn peer(&self, addr: &str) -> Result<PeerStatus> {
        self.status()?
            .into_iter()
            .find(|p| p.peer == addr)
            .with_context(|| format!("no status row for {addr}"))
    }

    /// Graceful shutdown (withdraw all, Cease), then joins the thread.
    pub fn shutdown(&mut self) -> Result<()> {
        let result = self.call(Command::Shutdown);
        self.commands = None;
        self.join();
        result?.map_err(|e| anyhow!("shutdown: {e}"))
    }

    fn join(&mut self) {
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SpeakerThread {
    fn drop(&mut self) {
        // Closing the channel makes the thread shut the speaker down.
        self.join();
    }
}

/// `lb-bgp-probe` (the speaker in a process of its own) inside a
/// namespace, driven over its stdin/stdout; killed when dropped.
pub struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub log: std::path::PathBuf,
}

impl Probe {
    /// Writes `config` as JSON next to `log` and starts the probe in `ns`.
    pub fn start(ns: &Netns, config: &BgpConfig, dir: &Path, name: &str) -> Result<Probe> {
        let config_path = dir.join(format!("{name}.json"));
        std::fs::write(&config_path, serde_json::to_vec(config)?)?;
        let log = dir.join(format!("{name}.log"));
        let err = std::fs::File::create(&log)?;
        let mut child = ns
            .command(bin_path("lb-bgp-probe")?)
            .arg(&config_path)
            .env("RUST_LOG", "lb=debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .context("starting lb-bgp-probe")?;
        let stdin = child.stdin.take().context("probe stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("probe stdout")?);
        let mut probe = Probe {
            child,
            stdin,
            stdout,
            log,
        };
        let hello = probe.read_line().context("the probe's first line")?;
        if hello != "ready" {
            bail!("lb-bgp-probe: {hello}\n{}", probe.log_text());
        }
        Ok(probe)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.is_empty() {
            bail!("lb-bgp-probe exited:\n{}", self.log_text());
        }
        Ok(line.trim_end().to_string())
    }

    fn request(&mut self, line: &str) -> Result<String> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let answer = self.read_line()?;
        match answer.strip_prefix("error: ") {
            Some(e) => bail!("lb-bgp-probe {line}: {e}"),
            None => Ok(answer),
        }
    }

    pub fn set(&mut self, vips: &[IpAddr]) -> Result<()> {
        let list: Vec<String> = vips.iter().map(ToString::to_string).collect();
        self.request(&format!("set {}", list.join(" ")))?;
        Ok(())
    }

    /// The peers' rows, as `lbctl bgp` would show them.
    pub fn status(&mut self) -> Result<Vec<lb::api::PeerRow>> {
        let answer = self.request("status")?;
        serde_json::from_str(&answer).with_context(|| format!("probe status: {answer}"))
    }

    /// Freezes the process (SIGSTOP): its sessions go silent.
    pub fn freeze(&self) -> Result<()> {
        self.signal(libc::SIGSTOP)
    }

    pub fn thaw(&self) -> Result<()> {
        self.signal(libc::SIGCONT)
    }

    fn signal(&self, sig: libc::c_int) -> Result<()> {
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, sig) } != 0 {
            bail!("kill: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

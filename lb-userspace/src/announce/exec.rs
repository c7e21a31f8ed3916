//! The announcer that runs an operator's command once per change, for
//! sites whose routing is driven by their own tooling:
//!
//! ```text
//! COMMAND... announce 10.0.0.1/32
//! COMMAND... withdraw 10.0.0.1/32
//! ```
//!
//! with `LB_ACTION` (`announce`/`withdraw`), `LB_PREFIX` (`10.0.0.1/32`),
//! `LB_VIP` (`10.0.0.1`) and `LB_FAMILY` (`ipv4`/`ipv6`) in its
//! environment. Exit status 0 means done. A command that fails or outlives
//! its timeout (it is killed) leaves that change pending: it is retried
//! after `retry`, or sooner when the desired set changes again, and the
//! failure shows in the status. Commands run one at a time, withdrawals
//! first, in a worker task, so [`Announcer::set_announced`] never waits for
//! them.
//!
//! This module owns the worker and its bookkeeping; what the command does
//! is the operator's business.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    process::Stdio,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::{io::AsyncReadExt as _, process::Command, sync::watch, task::JoinHandle};
use tracing::{info, warn};

use super::{
    AnnounceError, Announcer, PeerStatus, SessionState, diff, host_prefix, publish_desired,
};
use crate::config::ConfigErrors;
pub use crate::config::announce::ExecConfig;

/// The soft limit on open files commands start with; 0 leaves them
/// `lbd`'s own. See [`commands_keep_open_files_limit`].
static COMMAND_OPEN_FILES: AtomicU64 = AtomicU64::new(0);

/// Commands run with `soft` as their soft limit on open files (never above
/// their hard limit): the one `lbd` started with, before it raised its own
/// for thousands of probes. A raised limit is no default a command asked
/// for: programs built on `select()` fail on a descriptor past 1,024, and
/// some close every descriptor up to the limit before they exec.
pub fn commands_keep_open_files_limit(soft: u64) {
    COMMAND_OPEN_FILES.store(soft, Ordering::Relaxed);
}

/// In the child between fork and exec: lowers the soft limit on open files
/// to [`COMMAND_OPEN_FILES`]. Only `getrlimit` and `setrlimit`, which are
/// async-signal-safe; a failure keeps the limit as it is and runs the
/// command anyway.
#[allow(unsafe_code)]
fn restore_open_files(soft: u64) -> std::io::Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read one rlimit we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = soft.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
    Ok(())
}

/// The most [`Announcer::shutdown`] waits for the withdraw commands.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of a failed command's standard error kept for the status.
const STDERR_KEPT: usize = 400;

impl ExecConfig {
    fn describe(&self) -> String {
        format!("exec {}", self.command.join(" "))
    }
}

/// Runs the configured command for every change of the announced set.
pub struct ExecAnnouncer {
    desired: watch::Sender<Arc<BTreeSet<IpAddr>>>,
    stop: watch::Sender<bool>,
    status: Arc<Mutex<PeerStatus>>,
    worker: Option<JoinHandle<()>>,
    shut_down: bool,
}

fn lock(status: &Mutex<PeerStatus>) -> MutexGuard<'_, PeerStatus> {
    status.lock().unwrap_or_else(|e| e.into_inner())
}

impl ExecAnnouncer {
    /// Validates `config` and starts the worker on the current tokio
    /// runtime.
    pub fn start(config: ExecConfig) -> Result<Self, AnnounceError> {
        let errors = config.validate();
        if !errors.is_empty() {
            return Err(ConfigErrors {
                source_name: None,
                errors: super::prefixed("exec", errors),
            }
            .into());
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| AnnounceError::NoRuntime { announcer: "exec" })?;
        let (desired, desired_rx) = watch::channel(Arc::new(BTreeSet::new()));
        let (stop, stop_rx) = watch::channel(false);
        // Connect until the first commands ran; what the command has is
        // `carried`, command by command.
        let mut first = PeerStatus::new(config.describe(), SessionState::Connect);
        first.carried = Some(Vec::new());
        let status = Arc::new(Mutex::new(first));
        let worker = runtime.spawn(work(config, desired_rx, stop_rx, Arc::clone(&status)));
        Ok(Self {
            desired,
            stop,
            status,
            worker: Some(worker),
            shut_down: false,
        })
    }
}

impl Announcer for ExecAnnouncer {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        publish_desired(&self.desired, self.shut_down, prefixes)
    }

    fn status(&self) -> Vec<PeerStatus> {
        vec![lock(&self.status).clone()]
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async move {
            self.shut_down = true;
            let _ = self.stop.send(true);
            let Some(worker) = self.worker.take() else {
                return Ok(());
            };
            let abort = worker.abort_handle();
            if tokio::time::timeout(SHUTDOWN_TIMEOUT, worker)
                .await
                .is_err()
            {
                abort.abort();
                lock(&self.status).state = SessionState::Idle;
                return Err(AnnounceError::Shutdown(format!(
                    "withdraw commands did not finish within {} s",
                    SHUTDOWN_TIMEOUT.as_secs()
                )));
            }
            let status = lock(&self.status);
            match (&status.last_error, status.prefixes_announced) {
                (_, 0) => Ok(()),
                (error, n) => Err(AnnounceError::Shutdown(format!(
                    "{n} withdraw command(s) failed: {}",
                    error.as_deref().unwrap_or("")
                ))),
            }
        })
    }
}

impl Drop for ExecAnnouncer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The worker: brings the command's view (`applied`) to the desired set,
/// retries failures, withdraws everything when stopped.
async fn work(
    config: ExecConfig,
    mut desired: watch::Receiver<Arc<BTreeSet<IpAddr>>>,
    mut stop: watch::Receiver<bool>,
    status: Arc<Mutex<PeerStatus>>,
) {
    let mut applied: BTreeSet<IpAddr> = BTreeSet::new();
    loop {
        let want = Arc::clone(&desired.borrow_and_update());
        let changes = diff(&applied, &want);
        let mut failed = false;
        let steps = changes
            .withdraw
            .iter()
            .map(|&v| ("withdraw", v))
            .chain(changes.announce.iter().map(|&v| ("announce", v)));
        for (action, vip) in steps {
            if *stop.borrow() {
                break;
            }
            if run(&config, action, vip, &status).await {
                if action == "announce" {
                    applied.insert(vip);
                } else {
                    applied.remove(&vip);
                }
                publish(&status, &applied);
            } else {
                failed = true;
            }
        }
        {
            let mut s = lock(&status);
            s.state = if failed {
                SessionState::Active
            } else {
                SessionState::Established
            };
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            changed = desired.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(config.retry), if failed => {}
        }
    }
    for vip in applied.clone() {
        if run(&config, "withdraw", vip, &status).await {
            applied.remove(&vip);
            publish(&status, &applied);
        }
    }
    lock(&status).state = SessionState::Idle;
}

/// What the command has announced, as the status says it: a change that
/// is still running or failed is not counted.
fn publish(status: &Mutex<PeerStatus>, applied: &BTreeSet<IpAddr>) {
    let mut s = lock(status);
    s.prefixes_announced = applied.len();
    s.carried = Some(applied.iter().copied().collect());
}

/// Runs the command for one change; records the outcome in `status`.
async fn run(config: &ExecConfig, action: &str, vip: IpAddr, status: &Mutex<PeerStatus>) -> bool {
    let prefix = host_prefix(vip);
    let outcome = run_command(config, action, vip, &prefix).await;
    let mut s = lock(status);
    s.messages_sent += 1;
    match outcome {
        Ok(()) => {
            s.updates_sent += 1;
            info!(action, prefix = %prefix, "route command done");
            true
        }
        Err(e) => {
            warn!(action, prefix = %prefix, error = %e, "route command failed");
            s.last_error = Some(format!("{action} {prefix}: {e}"));
            false
        }
    }
}

#[allow(unsafe_code)] // the `pre_exec` hook, see there
async fn run_command(
    config: &ExecConfig,
    action: &str,
    vip: IpAddr,
    prefix: &str,
) -> Result<(), String> {
    let (program, args) = config
        .command
        .split_first()
        .ok_or_else(|| "no command configured".to_string())?;
    let mut command = Command::new(program);
    let soft = COMMAND_OPEN_FILES.load(Ordering::Relaxed);
    if soft != 0 {
        // SAFETY: the hook calls only async-signal-safe functions on
        // values it owns (see `restore_open_files`).
        unsafe {
            command.pre_exec(move || restore_open_files(soft));
        }
    }
    let mut child = command
        .args(args)
        .arg(action)
        .arg(prefix)
        .env("LB_ACTION", action)
        .env("LB_PREFIX", prefix)
        .env("LB_VIP", vip.to_string())
        .env("LB_FAMILY", if vip.is_ipv4() { "ipv4" } else { "ipv6" })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let mut stderr = child.stderr.take();
    let finished = tokio::time::timeout(config.timeout, async {
        let mut text = Vec::new();
        if let Some(err) = stderr.as_mut() {
            // Read it all so the child never blocks on a full pipe; keep
            // the start.
            let mut chunk = [0u8; 4096];
            while let Ok(n) = err.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                if text.len() < STDERR_KEPT {
                    text.extend_from_slice(&chunk[..n]);
                }
            }
        }
        (child.wait().await, text)
    })
    .await;
    match finished {
        // The child is killed when `child` drops (kill_on_drop).
        Err(_) => Err(format!(
            "timed out after {} ms and was killed",
            config.timeout.as_millis()
        )),
        Ok((Err(e), _)) => Err(format!("waiting for {program}: {e}")),
        Ok((Ok(status), _)) if status.success() => Ok(()),
        Ok((Ok(status), stderr)) => {
            let text = String::from_utf8_lossy(&stderr[..stderr.len().min(STDERR_KEPT)])
                .trim()
                .to_string();
            Err(if text.is_empty() {
                format!("{status}")
            } else {
                format!("{status}: {text}")
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        time::Instant,
    };

    use super::*;
    use crate::scratch::ScratchDir;

    /// An executable shell script `name` with `body` in `dir`.
    /// A shell script for [`config`] to run. It is run by `/bin/sh`, not
    /// executed itself: a file just written cannot be executed while
    /// another test's child (forked between our write and close, before
    /// its own exec) still holds it open for writing, and the exec then
    /// fails with "Text file busy".
    fn script(dir: &ScratchDir, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("{body}\n")).expect("script");
        path
    }

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn config(script: &Path, timeout_ms: u64) -> ExecConfig {
        ExecConfig {
            command: vec![
                "/bin/sh".into(),
                script.display().to_string(),
                "--table".into(),
                "10".into(),
            ],
            timeout: Duration::from_millis(timeout_ms),
            retry: Duration::from_millis(200),
        }
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (up to 5 s) until `f` holds.
    async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn runs_the_command_per_change_with_arguments_and_environment() {
        let dir = ScratchDir::new("exec-args");
        let log = dir.join("log");
        let script = script(
            &dir,
            "route",
            &format!(
                "echo \"$* | $LB_ACTION $LB_PREFIX $LB_VIP $LB_FAMILY\" >> '{}'",
                log.display()
            ),
        );
        let mut a = ExecAnnouncer::start(config(&script, 5000)).expect("starts");
        a.set_announced(&set(&["10.0.0.1", "2001:db8::1"])).unwrap();
        eventually("two announcements", || lines(&log).len() == 2).await;
        assert_eq!(
            lines(&log),
            [
                "--table 10 announce 10.0.0.1/32 | announce 10.0.0.1/32 10.0.0.1 ipv4",
                "--table 10 announce 2001:db8::1/128 | announce 2001:db8::1/128 2001:db8::1 ipv6",
            ]
        );
        a.set_announced(&set(&["10.0.0.2", "2001:db8::1"])).unwrap();
        eventually("two more runs", || lines(&log).len() == 4).await;
        assert_eq!(
            lines(&log)[2..],
            [
                "--table 10 withdraw 10.0.0.1/32 | withdraw 10.0.0.1/32 10.0.0.1 ipv4",
                "--table 10 announce 10.0.0.2/32 | announce 10.0.0.2/32 10.0.0.2 ipv4",
            ]
        );
        // A run's line is written before the command exits and is
        // counted: wait for the counts, not only the lines.
        eventually("status", || {
            let s = &a.status()[0];
            s.prefixes_announced == 2 && s.messages_sent == 4
        })
        .await;
        let s = &a.status()[0];
        assert_eq!(s.state, SessionState::Established);
        assert_eq!((s.messages_sent, s.updates_sent), (4, 4));
        assert_eq!(s.last_error, None);

        a.shutdown().await.expect("withdrawals succeed");
        let all = lines(&log);
        let mut tail: Vec<&str> = all[4..]
            .iter()
            .map(|l| l.split(" | ").next().unwrap())
            .collect();
        tail.sort();
        assert_eq!(
            tail,
            [
                "--table 10 withdraw 10.0.0.2/32",
                "--table 10 withdraw 2001:db8::1/128"
            ]
        );
        assert_eq!(a.status()[0].state, SessionState::Idle);
        assert!(matches!(
            a.set_announced(&set(&["10.0.0.3"])),
            Err(AnnounceError::ShutDown)
        ));
    }

    #[tokio::test]
    async fn commands_start_with_the_open_files_limit_lbd_started_with() {
        let dir = ScratchDir::new("exec-nofile");
        let log = dir.join("log");
        let script = script(&dir, "route", &format!("ulimit -Sn >> '{}'", log.display()));
        // As `lbd` does at start: keep the limit it had (here, lower than
        // this process's), then raise its own.
        commands_keep_open_files_limit(200);
        let mut a = ExecAnnouncer::start(config(&script, 5000)).expect("starts");
        a.set_announced(&set(&["10.0.0.1"])).unwrap();
        eventually("one run", || lines(&log).len() == 1).await;
        commands_keep_open_files_limit(0);
        // The shell's own reading, not ours.
        assert_eq!(lines(&log), ["200"]);
        a.shutdown().await.expect("withdrawal succeeds");
    }

    #[tokio::test]
    async fn failures_are_reported_and_retried() {
        let dir = ScratchDir::new("exec-fail");
        let flag = dir.join("ok");
        let log = dir.join("log");
        // Fails (with a message) until the flag file exists.
        let script = script(
            &dir,
            "route",
            &format!(
                "echo \"$LB_ACTION $LB_PREFIX\" >> '{log}'\n[ -e '{flag}' ] || {{ echo 'router says no' >&2; exit 3; }}",
                log = log.display(),
                flag = flag.display()
            ),
        );
        let mut a = ExecAnnouncer::start(config(&script, 5000)).expect("starts");
        a.set_announced(&set(&["10.0.0.1"])).unwrap();
        // The error is recorded when the command ends, the state when
        // the round does.
        eventually("the failure in the status", || {
            let s = &a.status()[0];
            s.last_error.is_some() && s.state == SessionState::Active
        })
        .await;
        let s = &a.status()[0];
        assert_eq!(s.prefixes_announced, 0);
        let err = s.last_error.clone().unwrap();
        assert!(
            err.contains("announce 10.0.0.1/32")
                && err.contains("exit status: 3")
                && err.contains("router says no"),
            "{err}"
        );
        eventually("a retry", || lines(&log).len() >= 2).await;

        std::fs::write(&flag, "").unwrap();
        eventually("success after retry", || {
            a.status()[0].state == SessionState::Established
                && a.status()[0].prefixes_announced == 1
        })
        .await;
        a.shutdown().await.expect("withdraw succeeds");
    }

    /// The status says an address is announced only once its command
    /// succeeded: not while it runs, and not for one that fails, while the
    /// others that succeeded still count.
    #[tokio::test]
    async fn the_status_counts_what_the_command_did() {
        let dir = ScratchDir::new("exec-carried");
        let script = script(
            &dir,
            "route",
            "sleep 0.3\n[ \"$LB_VIP\" = 10.0.0.1 ] || { echo no >&2; exit 3; }",
        );
        let mut a = ExecAnnouncer::start(config(&script, 5000)).expect("starts");
        let wanted = set(&["10.0.0.1", "10.0.0.2"]);
        a.set_announced(&wanted).unwrap();
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        let s = a.status().remove(0);
        assert!(!s.carries(&one, &wanted), "a command still runs: {s:?}");
        eventually("the failure", || {
            a.status()[0].state == SessionState::Active
        })
        .await;
        let s = a.status().remove(0);
        assert_eq!(s.carried, Some(vec![one]));
        assert!(s.carries(&one, &wanted), "{s:?}");
        assert!(!s.carries(&two, &wanted), "{s:?}");
        assert_eq!(s.prefixes_announced, 1);
        let _ = a.shutdown().await;
    }

    #[tokio::test]
    async fn a_hung_command_is_killed_at_the_timeout() {
        let dir = ScratchDir::new("exec-hang");
        let script = script(&dir, "route", "exec sleep 30");
        let mut a = ExecAnnouncer::start(config(&script, 200)).expect("starts");
        let started = Instant::now();
        a.set_announced(&set(&["10.0.0.1"])).unwrap();
        eventually("the timeout in the status", || {
            a.status()[0].last_error.is_some()
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let err = a.status()[0].last_error.clone().unwrap();
        assert!(err.contains("timed out after 200 ms"), "{err}");
        // Nothing was applied, so shutdown has nothing to withdraw.
        a.shutdown().await.expect("nothing to withdraw");
    }

    #[test]
    fn configuration_is_checked() {
        let c: ExecConfig = serde_yaml::from_str("command: [/bin/true]\n").unwrap();
        assert!(c.validate().is_empty());
        assert_eq!(
            (c.timeout, c.retry),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        let c: ExecConfig =
            serde_yaml::from_str("command: ['']\ntimeout: 0s\nretry: 0s\n").unwrap();
        let fields: Vec<String> = c.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["command[0]", "timeout", "retry"]);
        assert!(serde_yaml::from_str::<ExecConfig>("command: [x]\ntimout: 1s\n").is_err());
        assert!(matches!(
            ExecAnnouncer::start(c),
            Err(AnnounceError::Config(_))
        ));
    }

    #[test]
    fn starting_outside_a_runtime_is_an_error() {
        let c: ExecConfig = serde_yaml::from_str("command: [/bin/true]\n").unwrap();
        assert!(matches!(
            ExecAnnouncer::start(c),
            Err(AnnounceError::NoRuntime { announcer: "exec" })
        ));
    }
}

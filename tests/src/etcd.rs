//! A real etcd (Debian's `etcd-server`) in a test's namespace, and
//! `etcdctl` to write and read it: the tier tests' store, and the
//! independent reader of what each `lbd` publishes there. One member,
//! its data under the rig's directory; killed when dropped.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{netns::Netns, routers::wait_for};

pub const ETCD: &str = "/usr/bin/etcd";
pub const ETCDCTL: &str = "/usr/bin/etcdctl";

/// A running etcd member; stopped (SIGKILL) when dropped.
pub struct Etcd {
    child: Option<Child>,
    ns_path: String,
    data: PathBuf,
    log: PathBuf,
    /// The client URL tests and `lbctl`-less checks use (from inside the
    /// member's namespace).
    pub local: String,
}

impl Etcd {
    /// Starts a one-member cluster in `ns`, serving clients on every
    /// address of the namespace, port 2379; waits until it answers.
    pub fn start(ns: &Netns, dir: &Path) -> Result<Etcd> {
        if !Path::new(ETCD).is_file() || !Path::new(ETCDCTL).is_file() {
            bail!(
                "{ETCD} is missing: the tier tests need etcd (`apt-get install etcd-server etcd-client`, or `cargo xtask setup`)"
            );
        }
        let mut etcd = Etcd {
            child: None,
            ns_path: ns.path(),
            data: dir.join("etcd.data"),
            log: dir.join("etcd.log"),
            local: "http://127.0.0.1:2379".into(),
        };
        etcd.resume(ns)?;
        Ok(etcd)
    }

    /// Starts the member again on its data (after [`kill`](Self::kill)).
    pub fn resume(&mut self, ns: &Netns) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = ns
            .command(ETCD)
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .args([
                "--listen-client-urls",
                "http://0.0.0.0:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-cluster",
                "t=http://127.0.0.1:2380",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd")?;
        self.child = Some(child);
        wait_for(
            "etcd answering",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || Ok(self.ctl(&["endpoint", "health"]).is_ok()),
        )
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", self.log_text()))?;
        Ok(())
    }

    /// Stops the member at once (its data stays).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn command(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns_path))
            .arg(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.local, "--command-timeout=5s"]);
        c
    }

    /// Runs `etcdctl ARGS`; its standard output.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command()
            .args(args)
            .output()
            .context("running etcdctl")?;
        if !out.status.success() {
            bail!(
                "etcdctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes `value` at `key` (through standard input: values of any
    /// size); returns the store's revision after the write.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<i64> {
        use std::io::Write as _;
        let mut child = self
            .command()
            .args(["put", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running etcdctl put")?;
        child.stdin.take().context("stdin")?.write_all(value)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "etcdctl put {key}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.revision_of(key)
    }

    /// The modification revision of `key` (0: absent), read from
    /// `etcdctl get -w json`.
    pub fn revision_of(&self, key: &str) -> Result<i64> {
        let out = self.ctl(&["get", key, "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v["kvs"][0]["mod_revision"].as_i64().unwrap_or(0))
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let out = self.ctl(&["get", key, "--print-value-only"])?;
        let out = out.strip_suffix('\n').unwrap_or(&out);
        Ok((!out.is_empty()).then(|| out.to_string()))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

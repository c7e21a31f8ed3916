//! Network namespaces and veth pairs, each removed by a guard when dropped
//! (also when a test panics), and threads that run inside a namespace.
//!
//! A thread can enter a network namespace on its own (`setns` with
//! `CLONE_NEWNET` affects only the calling thread), so servers and clients
//! run as threads of the test process, each in its namespace, with plain
//! `std::net` sockets.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result, bail};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this process and call: `<prefix><pid><n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a command, failing with its stderr if it fails.
pub fn sh(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Runs `ip ARGS...` in the root namespace.
pub fn ip(args: &[&str]) -> Result<Output> {
    sh(Command::new("ip").args(args))
}

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str) -> Result<Netns> {
        ip(&["netns", "add", name])?;
        let ns = Netns { name: name.into() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// The namespace's inode number (what `/proc/self/ns/net` names inside it).
    pub fn inode(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt as _;
        Ok(std::fs::metadata(self.path())?.ino())
    }

    /// A command that runs inside this namespace with `nsenter --net`, which
    /// (unlike `ip netns exec`) keeps the host's mounts, so the host's bpffs
    /// and its pins stay visible.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs a command in the namespace and waits for it.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<Output> {
        sh(self.command(program).args(args))
    }

    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        sh(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run("sysctl", &["-qw", &format!("{key}={value}")])?;
        Ok(())
    }

    /// Disarms the guard: the namespace stays after this value is gone.
    pub fn forget(&mut self) {
        self.name.clear();
    }

    /// Makes the calling thread live in this namespace from now on.
    pub fn enter(&self) -> Result<()> {
        enter_path(&self.path())
    }

    /// Spawns a thread that runs `f` inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<Result<T>> {
        let path = self.path();
        std::thread::spawn(move || {
            enter_path(&path)?;
            Ok(f())
        })
    }

    /// Runs `f` on a thread inside this namespace and waits for it.
    pub fn within<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        self.spawn(f)
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {} panicked", self.name))?
    }
}

/// Moves the calling thread into the network namespace at `path`.
pub fn enter_path(path: &str) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {path}"))?;
    // SAFETY: setns on a valid fd of a network namespace; it affects only
    // the calling thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.name.is_empty() {
            return;
        }
        // Best effort: a namespace that cannot be removed is reported, the
        // rest of the cleanup still runs.
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleanup: {e:#}");
        }
    }
}

/// Connects `a` and `b` with a veth pair named `a_if`/`b_if` inside them.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str, mtu: u32) -> Result<()> {
    let ta = unique("va");
    let tb = unique("vb");
    ip(&["link", "add", &ta, "type", "veth", "peer", "name", &tb])?;
    let moved = (|| -> Result<()> {
        ip(&["link", "set", &ta, "netns", &a.name, "name", a_if])?;
        ip(&["link", "set", &tb, "netns", &b.name, "name", b_if])?;
        Ok(())
    })();
    if let Err(e) = moved {
        let _ = ip(&["link", "del", &ta]);
        let _ = ip(&["link", "del", &tb]);
        return Err(e);
    }
    for (ns, ifname) in [(a, a_if), (b, b_if)] {
        ns.ip(&["link", "set", ifname, "mtu", &mtu.to_string()])?;
        ns.ip(&["link", "set", ifname, "up"])?;
    }
    Ok(())
}

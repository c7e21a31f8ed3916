//! The announcer for operators who run ExaBGP: ExaBGP starts `lbd` as one
//! of its `process`es and reads commands from its standard output, one
//! line each:
//!
//! ```text
//! announce route 10.0.0.1/32 next-hop self
//! withdraw route 10.0.0.1/32 next-hop self
//! ```
//!
//! This module owns those lines and writes only changes (withdrawals
//! first). It does not speak BGP and does not run ExaBGP. With this
//! announcer `lbd`'s own logs must go to standard error
//! (`tracing_subscriber::fmt().with_writer(std::io::stderr)`; the default
//! writer is standard output), or ExaBGP reads them as commands.
//!
//! Standard output is made non-blocking: an ExaBGP that stops reading
//! (hung, stopped) fills the pipe, and a blocking write would stop the
//! daemon's loop with it (probes, the API, table updates). A write that
//! would block leaves the rest of its line for the next call (the daemon
//! retries every second), and the status says ExaBGP is not reading.

use std::{collections::BTreeSet, io::Write, net::IpAddr};

use futures::future::BoxFuture;
use tracing::{info, warn};

use super::{
    AnnounceError, Announcer, PeerStatus, SessionState, check_prefixes, diff, host_prefix,
};
pub use crate::config::announce::ExabgpConfig;

/// Writes ExaBGP API commands for every change of the announced set.
pub struct ExabgpAnnouncer {
    config: ExabgpConfig,
    out: Box<dyn Write + Send>,
    announced: BTreeSet<IpAddr>,
    /// The rest of a line the pipe took only part of: written before
    /// anything else, so that ExaBGP never reads half a command.
    partial: Vec<u8>,
    status: PeerStatus,
    shut_down: bool,
}

impl ExabgpAnnouncer {
    /// Writes to `out` (tests pass a buffer).
    pub fn new(config: ExabgpConfig, out: Box<dyn Write + Send>) -> Self {
        Self {
            config,
            out,
            announced: BTreeSet::new(),
            partial: Vec::new(),
            status: PeerStatus::new("exabgp", SessionState::Established),
            shut_down: false,
        }
    }

    /// Writes to standard output, where ExaBGP reads: unbuffered, and
    /// non-blocking when it is a pipe (as under ExaBGP). The flag belongs
    /// to the open file, so on a terminal or a file shared with standard
    /// error (journald) it is left alone: log writes would fail there.
    pub fn stdout(config: ExabgpConfig) -> Self {
        use std::os::{fd::AsFd as _, unix::fs::FileTypeExt as _};
        // Unbuffered: what `write` says went is in the pipe, not in a
        // buffer of ours that a full pipe would also hold up.
        let out = match std::io::stdout().as_fd().try_clone_to_owned() {
            Ok(fd) => std::fs::File::from(fd),
            Err(e) => {
                warn!("standard output cannot be duplicated ({e}): writing through Rust's buffer");
                return Self::new(config, Box::new(std::io::stdout()));
            }
        };
        let pipe = out.metadata().is_ok_and(|m| m.file_type().is_fifo());
        if pipe && !set_nonblocking(libc::STDOUT_FILENO) {
            warn!(
                "standard output cannot be made non-blocking: an ExaBGP that stops reading would stop lbd"
            );
        }
        Self::new(config, Box::new(out))
    }

    /// The command for one change: `announce route 10.0.0.1/32 next-hop
    /// self`.
    pub fn line(&self, action: &str, vip: IpAddr) -> String {
        let next_hop = match vip {
            IpAddr::V4(_) => self.config.next_hop_v4.map(IpAddr::from),
            IpAddr::V6(_) => self.config.next_hop_v6.map(IpAddr::from),
        };
        let next_hop = next_hop.map_or_else(|| "self".to_string(), |a| a.to_string());
        format!("{action} route {} next-hop {next_hop}\n", host_prefix(vip))
    }

    /// Writes what it can of `bytes`: how much went. An error only if
    /// not a byte went.
    fn write_some(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut done = 0;
        while done < bytes.len() {
            match self.out.write(&bytes[done..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if done > 0 && e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Writes the rest of a line cut short; `WouldBlock` while some of it
    /// is still not written.
    fn finish_partial(&mut self) -> std::io::Result<()> {
        if self.partial.is_empty() {
            return Ok(());
        }
        let partial = std::mem::take(&mut self.partial);
        let n = match self.write_some(&partial) {
            Ok(n) => n,
            Err(e) => {
                self.partial = partial;
                return Err(e);
            }
        };
        self.partial = partial[n..].to_vec();
        if self.partial.is_empty() {
            Ok(())
        } else {
            Err(std::io::ErrorKind::WouldBlock.into())
        }
    }

    /// Writes one whole line, or none of it: a line the pipe took only
    /// part of counts as written, its rest kept for the next call.
    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        let n = self.write_some(line)?;
        self.partial = line[n..].to_vec();
        Ok(())
    }

    /// Writes the lines that turn the announced set into `desired`; on a
    /// write error (or a full pipe) the set keeps what was written, so the
    /// next call retries the rest.
    fn apply(&mut self, desired: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        let changes = diff(&self.announced, desired);
        let steps = changes
            .withdraw
            .iter()
            .map(|&v| ("withdraw", v))
            .chain(changes.announce.iter().map(|&v| ("announce", v)));
        let mut result = self.finish_partial();
        for (action, vip) in steps {
            if result.is_err() {
                break;
            }
            if !self.partial.is_empty() {
                result = Err(std::io::ErrorKind::WouldBlock.into());
                break;
            }
            let line = self.line(action, vip);
            if let Err(e) = self.write_line(line.as_bytes()) {
                result = Err(e);
                break;
            }
            self.status.messages_sent += 1;
            self.status.updates_sent += 1;
            if action == "announce" {
                self.announced.insert(vip);
            } else {
                self.announced.remove(&vip);
            }
        }
        if result.is_ok() && !self.partial.is_empty() {
            result = Err(std::io::ErrorKind::WouldBlock.into());
        }
        if result.is_ok() {
            result = self.out.flush();
        }
        self.status.prefixes_announced = self.announced.len();
        match result {
            Ok(()) => {
                if !changes.is_empty() {
                    info!(
                        announced = changes.announce.len(),
                        withdrawn = changes.withdraw.len(),
                        "ExaBGP commands written"
                    );
                }
                self.status.state = SessionState::Established;
                Ok(())
            }
            Err(source) => {
                let why = if source.kind() == std::io::ErrorKind::WouldBlock {
                    "ExaBGP is not reading its commands (the pipe is full); lbd does not wait for it".to_string()
                } else {
                    format!("writing ExaBGP commands: {source}")
                };
                // Once per failure, not at every retry (every second).
                let again = self.status.state == SessionState::Active
                    && self.status.last_error.as_deref() == Some(why.as_str());
                if !again {
                    warn!("{why}");
                }
                self.status.state = SessionState::Active;
                self.status.last_error = Some(why);
                Err(AnnounceError::Write {
                    target: "ExaBGP".into(),
                    source,
                })
            }
        }
    }
}

impl Announcer for ExabgpAnnouncer {
    fn set_announced(&mut self, prefixes: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        if self.shut_down {
            return Err(AnnounceError::ShutDown);
        }
        check_prefixes(prefixes)?;
        self.apply(prefixes)
    }

    fn status(&self) -> Vec<PeerStatus> {
        vec![self.status.clone()]
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), AnnounceError>> {
        Box::pin(async move {
            self.shut_down = true;
            // The withdrawals, and the rest of a line cut short, must go
            // before another announcer writes (a restart) or lbd exits: a
            // full pipe is waited on, for a while.
            let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
            let mut result = self.apply(&BTreeSet::new());
            while result.is_err() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                result = self.apply(&BTreeSet::new());
            }
            self.status.state = SessionState::Idle;
            result
        })
    }
}

/// The most a shutdown waits for ExaBGP to read the withdrawals.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets `O_NONBLOCK` on descriptor `fd`; whether it could.
#[allow(unsafe_code)]
fn set_nonblocking(fd: libc::c_int) -> bool {
    // SAFETY: fcntl on a descriptor the process holds for its whole life
    // (standard output); no memory is involved.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer whose bytes the test can read, and that can be made to
    /// fail, or to take only so many bytes more (a pipe that fills:
    /// `WouldBlock` after them).
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        broken: Arc<Mutex<bool>>,
        room: Arc<Mutex<Option<usize>>>,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if *self.broken.lock().unwrap() {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            let mut room = self.room.lock().unwrap();
            let n = room.map_or(buf.len(), |r| r.min(buf.len()));
            if n == 0 {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            if let Some(r) = room.as_mut() {
                *r -= n;
            }
            self.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.bytes.lock().unwrap())).unwrap()
        }
    }

    /// The announcer's status, checked to say a write failed with `words`.
    fn failed_with(a: &ExabgpAnnouncer, words: &str) -> PeerStatus {
        let s = a.status().remove(0);
        assert_eq!(s.state, SessionState::Active);
        let error = s.last_error.as_deref().unwrap_or("");
        assert!(error.contains(words), "{s:?}");
        s
    }

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn writes_only_changes_withdrawals_first() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        a.set_announced(&set(&["10.0.0.1", "2001:db8::1"])).unwrap();
        assert_eq!(
            sink.take(),
            "announce route 10.0.0.1/32 next-hop self\nannounce route 2001:db8::1/128 next-hop self\n"
        );
        a.set_announced(&set(&["10.0.0.1", "2001:db8::1"])).unwrap();
        assert_eq!(sink.take(), "", "no change, no line");
        a.set_announced(&set(&["10.0.0.2", "2001:db8::1"])).unwrap();
        assert_eq!(
            sink.take(),
            "withdraw route 10.0.0.1/32 next-hop self\nannounce route 10.0.0.2/32 next-hop self\n"
        );
        let s = &a.status()[0];
        assert_eq!(
            (s.state, s.prefixes_announced, s.messages_sent),
            (SessionState::Established, 2, 4)
        );
    }

    #[test]
    fn explicit_next_hops_replace_self() {
        let config = ExabgpConfig {
            next_hop_v4: Some("192.0.2.7".parse().unwrap()),
            next_hop_v6: None,
        };
        let a = ExabgpAnnouncer::new(config, Box::new(Sink::default()));
        assert_eq!(
            a.line("announce", "10.0.0.1".parse().unwrap()),
            "announce route 10.0.0.1/32 next-hop 192.0.2.7\n"
        );
        assert_eq!(
            a.line("withdraw", "2001:db8::1".parse().unwrap()),
            "withdraw route 2001:db8::1/128 next-hop self\n"
        );
    }

    #[test]
    fn a_failed_write_is_reported_and_retried() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        *sink.broken.lock().unwrap() = true;
        let err = a
            .set_announced(&set(&["10.0.0.1"]))
            .expect_err("pipe broken");
        assert!(matches!(err, AnnounceError::Write { .. }), "{err}");
        let s = failed_with(&a, "broken pipe");
        assert_eq!(s.prefixes_announced, 0);

        *sink.broken.lock().unwrap() = false;
        a.set_announced(&set(&["10.0.0.1"])).unwrap();
        assert_eq!(sink.take(), "announce route 10.0.0.1/32 next-hop self\n");
        assert_eq!(a.status()[0].state, SessionState::Established);
    }

    /// ExaBGP stops reading and its pipe fills in the middle of a line:
    /// `set_announced` returns at once, the status says so, and the rest
    /// of the line comes first once it reads again, so ExaBGP reads
    /// whole commands only, each once.
    #[test]
    fn a_full_pipe_is_not_waited_on_and_no_command_is_cut() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        *sink.room.lock().unwrap() = Some(50);
        let err = a
            .set_announced(&set(&["10.0.0.1", "10.0.0.2"]))
            .expect_err("the pipe is full");
        assert!(matches!(err, AnnounceError::Write { .. }), "{err}");
        failed_with(&a, "not reading");
        // Still full: nothing more, nothing twice.
        assert!(a.set_announced(&set(&["10.0.0.1", "10.0.0.2"])).is_err());
        assert_eq!(sink.bytes.lock().unwrap().len(), 50);
        *sink.room.lock().unwrap() = None;
        a.set_announced(&set(&["10.0.0.1", "10.0.0.2"])).unwrap();
        assert_eq!(
            sink.take(),
            "announce route 10.0.0.1/32 next-hop self\nannounce route 10.0.0.2/32 next-hop self\n"
        );
        let s = &a.status()[0];
        assert_eq!(
            (s.state, s.prefixes_announced),
            (SessionState::Established, 2)
        );
    }

    /// A shutdown while the pipe is full waits for ExaBGP to read (here:
    /// room comes after 200 ms), so the line cut short and the
    /// withdrawals all go before another announcer writes.
    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_a_full_pipe() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        *sink.room.lock().unwrap() = Some(50);
        let _ = a.set_announced(&set(&["10.0.0.1", "10.0.0.2"]));
        let room = sink.room.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            *room.lock().unwrap() = None;
        });
        a.shutdown().await.expect("all written once ExaBGP reads");
        assert_eq!(
            sink.take(),
            "announce route 10.0.0.1/32 next-hop self\nannounce route 10.0.0.2/32 next-hop self\n\
             withdraw route 10.0.0.1/32 next-hop self\nwithdraw route 10.0.0.2/32 next-hop self\n"
        );
    }

    #[test]
    fn shutdown_withdraws_everything_and_refuses_more() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        a.set_announced(&set(&["10.0.0.1", "10.0.0.2"])).unwrap();
        sink.take();
        futures::executor::block_on(a.shutdown()).unwrap();
        assert_eq!(
            sink.take(),
            "withdraw route 10.0.0.1/32 next-hop self\nwithdraw route 10.0.0.2/32 next-hop self\n"
        );
        assert_eq!(a.status()[0].state, SessionState::Idle);
        assert!(matches!(
            a.set_announced(&set(&["10.0.0.1"])),
            Err(AnnounceError::ShutDown)
        ));
    }

    #[test]
    fn invalid_vips_change_nothing() {
        let sink = Sink::default();
        let mut a = ExabgpAnnouncer::new(ExabgpConfig::default(), Box::new(sink.clone()));
        assert!(a.set_announced(&set(&["10.0.0.1", "224.0.0.1"])).is_err());
        assert_eq!(sink.take(), "");
    }
}

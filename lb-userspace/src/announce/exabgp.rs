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
            status: PeerStatus::new("exabgp", SessionState::Established),
            shut_down: false,
        }
    }

    /// Writes to standard output, where ExaBGP reads.
    pub fn stdout(config: ExabgpConfig) -> Self {
        Self::new(config, Box::new(std::io::stdout()))
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

    /// Writes the lines that turn the announced set into `desired`; on a
    /// write error the set keeps what was written, so the next call
    /// retries the rest.
    fn apply(&mut self, desired: &BTreeSet<IpAddr>) -> Result<(), AnnounceError> {
        let changes = diff(&self.announced, desired);
        let steps = changes
            .withdraw
            .iter()
            .map(|&v| ("withdraw", v))
            .chain(changes.announce.iter().map(|&v| ("announce", v)));
        let mut result = Ok(());
        for (action, vip) in steps {
            let line = self.line(action, vip);
            if let Err(e) = self.out.write_all(line.as_bytes()) {
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
                warn!(error = %source, "cannot write ExaBGP commands");
                self.status.state = SessionState::Active;
                self.status.last_error = Some(format!("writing ExaBGP commands: {source}"));
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
            let result = self.apply(&BTreeSet::new());
            self.status.state = SessionState::Idle;
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer whose bytes the test can read, and that can be made to
    /// fail.
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        broken: Arc<Mutex<bool>>,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if *self.broken.lock().unwrap() {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
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
        let s = &a.status()[0];
        assert_eq!(s.state, SessionState::Active);
        assert!(
            s.last_error
                .as_deref()
                .unwrap_or("")
                .contains("broken pipe"),
            "{s:?}"
        );
        assert_eq!(s.prefixes_announced, 0);

        *sink.broken.lock().unwrap() = false;
        a.set_announced(&set(&["10.0.0.1"])).unwrap();
        assert_eq!(sink.take(), "announce route 10.0.0.1/32 next-hop self\n");
        assert_eq!(a.status()[0].state, SessionState::Established);
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

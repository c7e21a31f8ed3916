//! The control socket: accepts connections, reads one JSON request each,
//! hands it to the daemon task, writes its answer. Malformed requests are
//! answered with an error here and never reach the daemon.

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result};
use lb::api::{Envelope, ErrorKind, MAX_CONNECTIONS, MAX_REQUEST, Response};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};
use tracing::{debug, warn};

pub type Call = (Envelope, oneshot::Sender<Response>);

/// Binds the socket with mode 0600, replacing a stale one (a socket no
/// process answers on). A socket something still answers on belongs to
/// another lbd (another instance configured with the same `api_socket`):
/// refused, not stolen.
///
/// The socket is bound inside a fresh directory only root can enter,
/// made 0600 there and then renamed into place: under a permissive umask
/// a socket bound at `path` would take connections from any local user
/// until its chmod. The rename also replaces a stale socket in one step.
/// A path too long for that detour (near `sun_path`'s 107 bytes) is bound
/// where it is, as before.
pub fn bind(path: &Path) -> Result<UnixListener> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stale = check_path(path)?;
    let private = PrivateDir::new(dir)?;
    let bound = match &private {
        Some(private) => private.0.join("s"),
        None => {
            if stale {
                std::fs::remove_file(path)
                    .with_context(|| format!("removing stale {}", path.display()))?;
            }
            path.to_path_buf()
        }
    };
    let listener =
        UnixListener::bind(&bound).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", bound.display()))?;
    if private.is_some() {
        std::fs::rename(&bound, path)
            .with_context(|| format!("moving the socket to {}", path.display()))?;
    }
    Ok(listener)
}

/// A directory of mode 0700 beside the socket, removed when dropped.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    /// `None` when a socket inside it would not fit `sun_path`.
    fn new(beside: &Path) -> Result<Option<Self>> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = beside.join(format!(".lbd.{}", std::process::id()));
        if path.join("s").as_os_str().len() > MAX_SOCKET_PATH {
            return Ok(None);
        }
        // One left by a process that died between making and removing it
        // (its pid reused since): nothing in it is in use.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Some(Self(path)))
    }
}

/// The longest path a Unix socket can be bound at.
const MAX_SOCKET_PATH: usize = 107;

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `path` can be the API socket: free, or a stale socket (the
/// answer: `true`, to be removed before binding). Another lbd listening
/// there, or a file that is not a socket (`api_socket` naming the state
/// file, a slip that must not cost the runtime changes), is refused. `lbd`
/// asks before it attaches or announces anything.
pub fn check_path(path: &Path) -> Result<bool> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        anyhow::bail!(
            "{} is in use by another running lbd; give each instance its own api_socket",
            path.display()
        );
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Ok(true),
        Ok(_) => anyhow::bail!(
            "api_socket: {} exists and is not a socket; name a path of its own",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("api_socket: {}", path.display())),
    }
}

/// How long a connection may take to send its request (one line;
/// `lbctl` writes it at once).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client may take to read its answer: one that stops reading
/// (a hung script, a stopped `lbctl`) with an answer bigger than the
/// socket's buffer would otherwise hold its slot for good.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted but still waiting for their request, by id: when
/// every slot is taken, the oldest of them gives its slot to the newcomer,
/// so idle clients never lock an operator out.
type Waiting =
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, tokio::task::AbortHandle>>>;

pub async fn serve(listener: UnixListener, calls: mpsc::Sender<Call>) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let waiting = Waiting::default();
    let mut next = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "accept on the control socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // The oldest connection that has not sent its request yet
                // makes room; if every one is being served, refuse.
                let oldest = waiting.lock().ok().and_then(|mut w| w.pop_first());
                let freed = match oldest {
                    Some((_, task)) => {
                        task.abort();
                        tokio::time::timeout(Duration::from_secs(1), slots.clone().acquire_owned())
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                    None => None,
                };
                match freed {
                    Some(slot) => slot,
                    None => {
                        tokio::spawn(refuse(stream));
                        continue;
                    }
                }
            }
        };
        next += 1;
        let (id, calls, list) = (next, calls.clone(), waiting.clone());
        // Listed as waiting before it reads a byte (it starts once listed).
        let (listed, start) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _slot = slot;
            if start.await.is_ok() {
                handle(stream, calls, id, list).await;
            }
        });
        if let Ok(mut w) = waiting.lock() {
            w.insert(id, task.abort_handle());
        }
        let _ = listed.send(());
    }
}

/// Answers a connection beyond [`MAX_CONNECTIONS`] with an error, without
/// reading it.
async fn refuse(mut stream: UnixStream) {
    let response = Response::err(
        ErrorKind::Unavailable,
        format!("lbd is serving {MAX_CONNECTIONS} connections already; try again"),
    );
    let _ = write_response(&mut stream, &response).await;
}

async fn write_response(
    write: &mut (impl tokio::io::AsyncWrite + Unpin),
    response: &Response,
) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response).unwrap_or_else(|e| {
        format!(r#"{{"ok":false,"code":"internal","error":"encoding the answer: {e}"}}"#)
            .into_bytes()
    });
    out.push(b'\n');
    match tokio::time::timeout(ANSWER_TIMEOUT, write.write_all(&out)).await {
        Ok(written) => written,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the client read no answer for {} s",
                ANSWER_TIMEOUT.as_secs()
            ),
        )),
    }
}

async fn handle(stream: UnixStream, calls: mpsc::Sender<Call>, id: u64, waiting: Waiting) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read.take(MAX_REQUEST as u64));
    let mut line = String::new();
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    // Read (or given up on): no longer one that may make room for others.
    if let Ok(mut w) = waiting.lock() {
        w.remove(&id);
    }
    let response = match read {
        Err(_) => Response::err(ErrorKind::Protocol, "timed out waiting for the request"),
        Ok(Err(e)) => Response::err(ErrorKind::Protocol, format!("reading the request: {e}")),
        Ok(Ok(n)) if !line.ends_with('\n') && n >= MAX_REQUEST => Response::err(
            ErrorKind::Protocol,
            format!(
                "request longer than {} KiB, the most lbd reads",
                MAX_REQUEST >> 10
            ),
        ),
        Ok(Ok(_)) if !line.ends_with('\n') => {
            Response::err(ErrorKind::Protocol, "request not terminated by a newline")
        }
        Ok(Ok(_)) => match Envelope::parse(&line) {
            Err(e) => Response::err(ErrorKind::Protocol, e),
            Ok(envelope) => {
                debug!(request = ?envelope.request, "api request");
                let (tx, rx) = oneshot::channel();
                if calls.send((envelope, tx)).await.is_err() {
                    Response::err(ErrorKind::Unavailable, "lbd is shutting down")
                } else {
                    rx.await.unwrap_or_else(|_| {
                        Response::err(ErrorKind::Internal, "lbd dropped the request")
                    })
                }
            }
        },
    };
    match write_response(&mut write, &response).await {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            warn!("dropped an API client: {e}");
        }
        Err(e) => debug!(error = %e, "client went away before the answer"),
        Ok(()) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file at `api_socket` that is not a socket is refused and kept; a
    /// stale socket (no one listening) is replaced.
    #[tokio::test]
    async fn only_a_stale_socket_is_replaced() {
        let scratch = crate::ScratchDir::new("bind");
        let dir = &scratch.0;
        let file = dir.join("state.json");
        std::fs::write(&file, "{}").unwrap();
        let e = bind(&file).unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}");
        let sock = dir.join("lbd.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let _listener = bind(&sock).unwrap();
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::os::unix::net::UnixStream::connect(&sock).expect("the new socket answers");
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "only the state file and the socket: {left:?}"
        );
        assert!(bind(&sock).unwrap_err().to_string().contains("in use"));
    }

    /// A socket path too long for the private directory's detour is
    /// bound where it is, still 0600, and nothing is left beside it.
    #[tokio::test]
    async fn a_long_socket_path_is_bound_in_place() {
        let scratch = crate::ScratchDir::new("bind-long");
        let base = scratch.0.as_os_str().len() + 1;
        assert!(base + 8 < MAX_SOCKET_PATH, "{}", scratch.0.display());
        let name = "x".repeat(MAX_SOCKET_PATH - base);
        let sock = scratch.0.join(name);
        assert_eq!(sock.as_os_str().len(), MAX_SOCKET_PATH);
        let _listener = bind(&sock).unwrap();
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::os::unix::net::UnixStream::connect(&sock).expect("the socket answers");
        assert_eq!(std::fs::read_dir(&scratch.0).unwrap().count(), 1);
    }

    /// A client that stops reading an answer bigger than the socket's
    /// buffer is dropped after [`ANSWER_TIMEOUT`], not waited on for good
    /// (it would hold one of the connection slots); one that reads gets
    /// it whole.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_no_answer_is_dropped() {
        let big = Response::err(ErrorKind::Internal, "x".repeat(4 << 20));
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let e = write_response(&mut ours, &big).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        drop(theirs);
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            let mut theirs = theirs;
            theirs.read_to_end(&mut all).await.map(|_| all.len())
        });
        write_response(&mut ours, &big).await.unwrap();
        drop(ours);
        assert!(reader.await.unwrap().unwrap() > 4 << 20);
    }
}

//! The control socket: accepts connections, reads one JSON request each,
//! hands it to the daemon task, writes its answer. Malformed requests are
//! answered with an error here and never reach the daemon.

use std::{os::unix::fs::FileTypeExt as _, path::Path, time::Duration};

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
/// The socket is born 0600 ([`bind_private`]): under a permissive umask a
/// socket bound first and chmod-ed after would take connections from any
/// local user in between.
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if check_path(path)? {
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = bind_private(path).with_context(|| format!("binding {}", path.display()))?;
    listener.set_nonblocking(true)?;
    Ok(UnixListener::from_std(listener)?)
}

/// Binds `path` on a thread of its own whose umask (unshared from the
/// process's, `CLONE_FS`) makes the socket file 0600. Not a rename from a
/// private directory: a socket's address stays the path it was bound at,
/// which `ss` and `lbd check` read.
fn bind_private(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare(CLONE_FS) gives this thread its own root,
                // cwd and umask, so umask sets only this thread's.
                unsafe {
                    if libc::unshare(libc::CLONE_FS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::umask(0o177);
                }
                std::os::unix::net::UnixListener::bind(path)
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the binding thread panicked")))
    })
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
    // Taking itself off the list decides the race with the accept loop:
    // one it already took off is being aborted to make room, and must not
    // hand its request to the daemon (a change made whose answer nobody
    // would write).
    let evicted = waiting.lock().is_ok_and(|mut w| w.remove(&id).is_none());
    let response = match read {
        _ if evicted => Response::err(
            ErrorKind::Unavailable,
            "lbd gave this connection's slot to a newer one; try again",
        ),
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
        let dir = crate::ScratchDir::new("bind");
        let file = dir.join("state.json");
        std::fs::write(&file, "{}").unwrap();
        let e = bind(&file).unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}");
        let sock = dir.join("lbd.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let _listener = bind(&sock).unwrap();
        assert!(bind(&sock).unwrap_err().to_string().contains("in use"));
    }

    /// The socket is born 0600 whatever the process's umask, which it
    /// leaves as it was; its address is the path it was asked for.
    #[tokio::test]
    async fn the_socket_is_born_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let scratch = crate::ScratchDir::new("bind-umask");
        let sock = scratch.join("lbd.sock");
        // SAFETY: umask has no memory effects (the process's, for this
        // test binary only; read back at once).
        let before = unsafe { libc::umask(0) };
        let listener = bind_private(&sock);
        let after = unsafe { libc::umask(before) };
        let listener = listener.unwrap();
        assert_eq!(after, 0, "the process's umask was changed");
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let addr = listener.local_addr().unwrap();
        assert_eq!(addr.as_pathname(), Some(sock.as_path()));
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

    /// A connection the accept loop took off the waiting list (to abort it
    /// for a newcomer) just as its request arrived does not pass the
    /// request on: the change would be made and its answer never written.
    #[tokio::test]
    async fn a_connection_evicted_as_it_reads_sends_nothing_on() {
        for listed in [false, true] {
            let (ours, mut theirs) = UnixStream::pair().unwrap();
            theirs
                .write_all(b"{\"api\":2,\"op\":\"status\"}\n")
                .await
                .unwrap();
            let waiting = Waiting::default();
            if listed {
                let idle = tokio::spawn(std::future::pending::<()>());
                waiting.lock().unwrap().insert(7, idle.abort_handle());
            }
            let (calls, mut daemon) = mpsc::channel(1);
            let answering = tokio::spawn(async move {
                let (_, reply): Call = daemon.recv().await?;
                reply.send(Response::ok(1)).ok()
            });
            handle(ours, calls, 7, waiting).await;
            let mut answer = String::new();
            BufReader::new(theirs).read_line(&mut answer).await.unwrap();
            let answer: Response = serde_json::from_str(&answer).unwrap();
            let reached = answering.await.unwrap().is_some();
            assert_eq!((answer.ok, reached), (listed, listed), "{answer:?}");
            if !listed {
                assert_eq!(answer.code, Some(ErrorKind::Unavailable));
            }
        }
    }
}

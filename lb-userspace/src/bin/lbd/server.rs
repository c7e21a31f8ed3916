//! The control socket: accepts connections, reads one JSON request each,
//! hands it to the daemon task, writes its answer. Malformed requests are
//! answered with an error here and never reach the daemon.

use std::{os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use lb::api::{MAX_MESSAGE, Request, Response};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};
use tracing::{debug, warn};

pub type Call = (Request, oneshot::Sender<Response>);

/// Binds the socket with mode 0600, replacing a stale one (a socket no
/// process answers on). A socket something still answers on belongs to
/// another lbd (another instance configured with the same `api_socket`):
/// refused, not stolen.
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        anyhow::bail!(
            "{} is in use by another running lbd; give each instance its own api_socket",
            path.display()
        );
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale {}", path.display())),
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    Ok(listener)
}

pub async fn serve(listener: UnixListener, calls: mpsc::Sender<Call>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle(stream, calls.clone()));
            }
            Err(e) => {
                warn!(error = %e, "accept on the control socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(stream: UnixStream, calls: mpsc::Sender<Call>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read.take(MAX_MESSAGE as u64));
    let mut line = String::new();
    let response =
        match tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line)).await {
            Err(_) => Response::err("timed out waiting for the request"),
            Ok(Err(e)) => Response::err(format!("reading the request: {e}")),
            Ok(Ok(_)) if !line.ends_with('\n') => {
                Response::err("request too long or not terminated by a newline")
            }
            Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
                Err(e) => Response::err(format!("bad request: {e}")),
                Ok(request) => {
                    debug!(?request, "api request");
                    let (tx, rx) = oneshot::channel();
                    if calls.send((request, tx)).await.is_err() {
                        Response::err("lbd is shutting down")
                    } else {
                        rx.await
                            .unwrap_or_else(|_| Response::err("lbd dropped the request"))
                    }
                }
            },
        };
    let mut out = serde_json::to_vec(&response).unwrap_or_else(|e| {
        format!(r#"{{"ok":false,"error":"encoding the answer: {e}"}}"#).into_bytes()
    });
    out.push(b'\n');
    if let Err(e) = write.write_all(&out).await {
        debug!(error = %e, "client went away before the answer");
    }
}

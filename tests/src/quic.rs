//! Real QUIC for the rig (`quinn`): a server per backend that issues
//! QUIC-LB connection IDs with its server ID (`lb_quic::Generator`) and
//! answers every bidirectional stream with its name, and clients, one
//! endpoint per connection, that exchange on their connection and move to
//! a new port or a new address (`Endpoint::rebind`, as a NAT rebinding or a
//! phone changing networks does).
//!
//! Sockets are made inside a namespace (a thread there binds them) and
//! driven from anywhere: a socket keeps the namespace it was created in.

use std::{
    net::{SocketAddr, UdpSocket},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow, bail};
use lb_quic::{Config, Generator};
use quinn::{
    ClientConfig, Connection, Endpoint, EndpointConfig, ServerConfig, TokioRuntime,
    TransportConfig,
    rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};

use crate::netns::Netns;

/// The name the servers' certificate is for.
const SERVER_NAME: &str = "quic.lb.test";
/// Longest reply read: a backend's name.
const MAX_REPLY: usize = 64;

/// The QUIC-LB configuration of the rig's servers and VIP: config id 0,
/// two octets of server ID, six of nonce, no length self-encoding.
pub fn cid_config() -> Config {
    Config::new(0, 2, 6, false).expect("a valid QUIC-LB configuration")
}

/// Server ID of backend `i` (0-based): `00 0i+1`.
pub fn server_id(i: usize) -> [u8; 2] {
    [0, i as u8 + 1]
}

/// A self-signed certificate for [`SERVER_NAME`] and its key.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl Identity {
    pub fn new() -> Result<Identity> {
        install_provider();
        let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])?;
        Ok(Identity {
            cert: made.cert.der().clone(),
            key: made.signing_key.serialize_der(),
        })
    }

    fn server_config(&self) -> Result<ServerConfig> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        let mut config = ServerConfig::with_single_cert(vec![self.cert.clone()], key)?;
        config.transport_config(Arc::new(transport()));
        Ok(config)
    }

    /// A client configuration trusting only this identity.
    pub fn client_config(&self) -> Result<ClientConfig> {
        let mut roots = quinn::rustls::RootCertStore::empty();
        roots.add(self.cert.clone())?;
        let mut config = ClientConfig::with_root_certificates(Arc::new(roots))?;
        config.transport_config(Arc::new(transport()));
        Ok(config)
    }
}

/// ring as rustls's provider for the process (other dependencies may
/// bring a second one, and rustls then wants one chosen).
fn install_provider() {
    let _ = quinn::rustls::crypto::ring::default_provider().install_default();
}

/// Keep-alives well inside the idle timeout, so that a connection dies
/// only of a path that stopped working.
fn transport() -> TransportConfig {
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(2)));
    t.max_idle_timeout(Some(Duration::from_secs(60).try_into().expect("in range")));
    t
}

/// A UDP socket bound to `addr` inside `ns`.
pub fn socket_in(ns: &Netns, addr: SocketAddr) -> Result<UdpSocket> {
    ns.within(move || UdpSocket::bind(addr))?
        .with_context(|| format!("binding {addr} in {}", ns.name))
}

/// Starts backend `name`'s QUIC server on `socket` (in its namespace): it
/// issues connection IDs carrying `sid` and answers every stream with
/// `name`. Runs on the current Tokio runtime until the endpoint is closed.
pub fn serve(identity: &Identity, socket: UdpSocket, name: &str, sid: [u8; 2]) -> Result<Endpoint> {
    let generator = Generator::new(cid_config(), &sid)?;
    let mut config = EndpointConfig::default();
    config.cid_generator(move || Box::new(generator));
    let endpoint = Endpoint::new(
        config,
        Some(identity.server_config()?),
        socket,
        Arc::new(TokioRuntime),
    )?;
    let accepting = endpoint.clone();
    let name: Arc<str> = name.into();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                if let Ok(conn) = incoming.await {
                    answer(conn, &name).await;
                }
            });
        }
    });
    Ok(endpoint)
}

/// Answers each stream of `conn` with `name` until the connection ends.
async fn answer(conn: Connection, name: &str) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        if recv.read_to_end(MAX_REPLY).await.is_err() {
            continue;
        }
        let _ = send.write_all(name.as_bytes()).await;
        let _ = send.finish();
    }
}

/// One client connection on an endpoint of its own.
pub struct Client {
    pub endpoint: Endpoint,
    pub conn: Connection,
}

impl Client {
    /// Connects from `socket` (made in the client's namespace) to `vip`.
    pub async fn connect(
        identity: &Identity,
        socket: UdpSocket,
        vip: SocketAddr,
    ) -> Result<Client> {
        let mut endpoint = Endpoint::new(
            EndpointConfig::default(),
            None,
            socket,
            Arc::new(TokioRuntime),
        )?;
        endpoint.set_default_client_config(identity.client_config()?);
        let conn = endpoint
            .connect(vip, SERVER_NAME)?
            .await
            .context("QUIC handshake")?;
        Ok(Client { endpoint, conn })
    }

    /// One exchange: a stream with a request, the server's name back
    /// within `patience`.
    pub async fn exchange(&self, patience: Duration) -> Result<String> {
        let work = async {
            let (mut send, mut recv) = self.conn.open_bi().await?;
            send.write_all(b"who are you").await?;
            send.finish()?;
            let reply = recv.read_to_end(MAX_REPLY).await?;
            anyhow::Ok(String::from_utf8(reply)?)
        };
        match tokio::time::timeout(patience, work).await {
            Ok(reply) => reply,
            Err(_) => bail!("no answer within {patience:?}"),
        }
    }

    /// Moves the connection to `socket` (a new port or address).
    pub fn rebind(&self, socket: UdpSocket) -> Result<()> {
        self.endpoint
            .rebind(socket)
            .map_err(|e| anyhow!("rebind: {e}"))
    }
}

//! The control API between `lbctl` and `lbd`: JSON over a Unix socket.
//!
//! One request per connection: the client writes one JSON object and a
//! newline, the daemon answers with one JSON object and a newline, then
//! closes. Requests are a tagged enum ([`Request`], in [`request`]: the
//! one statement of each request, also `lbctl`'s command line); every
//! answer is a [`Response`] whose `data` has the shape documented on each
//! request ([`wire`]). Both carry the API's version ([`API_VERSION`]): a
//! request of another version is refused with a message that says so.
//! The socket is created with mode 0600: only root talks to the balancer.
//!
//! This module owns the wire types and the blocking client; the handlers
//! are `crate::daemon`'s, the socket `lbd`'s.

pub(crate) mod request;
#[cfg(test)]
mod schema;
pub(crate) mod wire;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use self::{request::*, wire::*};

/// Largest request line `lbd` reads: room for a VIP with ~8,000 backends,
/// more than `max_backends` allows by default. A longer one is refused.
pub const MAX_REQUEST: usize = 1 << 20;
/// Largest answer `lbctl` reads (`vip list` of thousands of VIPs).
pub const MAX_RESPONSE: usize = 64 << 20;
/// Connections `lbd` serves at once; one more is answered with an error
/// and closed, so held connections cannot make it buffer without bound.
pub const MAX_CONNECTIONS: usize = 64;

/// The API's version. 2: requests nested under `vip`, `backend` and
/// `node` (1 had them flat), answers of the API's own types.
pub const API_VERSION: u32 = 2;

/// A request as it travels: its version, the request, and how a change
/// is applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope {
    /// Absent in version 1's requests.
    #[serde(default = "version_one")]
    pub api: u32,
    #[serde(flatten)]
    pub request: Request,
    #[serde(default, skip_serializing_if = "ChangeOptions::is_default")]
    pub change: ChangeOptions,
}

fn version_one() -> u32 {
    1
}

impl Envelope {
    pub fn new(request: Request, change: ChangeOptions) -> Self {
        Self {
            api: API_VERSION,
            request,
            change,
        }
    }

    /// Reads one request line: a request of another version, or one that
    /// is no request, is refused with the reason.
    pub fn parse(line: &str) -> Result<Envelope, String> {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
        let api = value
            .get("api")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1);
        if api != u64::from(API_VERSION) {
            return Err(format!(
                "this lbd speaks API version {API_VERSION}, the request is version {api}: use the lbctl of the same release"
            ));
        }
        serde_json::from_value::<Envelope>(value).map_err(|e| format!("bad request: {e}"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Response {
    /// The API version of the daemon that answered.
    #[serde(default = "version_one")]
    pub api: u32,
    pub ok: bool,
    /// Why it was refused, as a stable code (absent from daemons before
    /// it was added, and from successful answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Response {
    /// A successful answer carrying `data`; if `data` cannot be written
    /// as JSON, a refusal that says so (never an empty success).
    pub fn ok(data: impl Serialize) -> Self {
        match serde_json::to_value(data) {
            Ok(data) => Self {
                api: API_VERSION,
                ok: true,
                code: None,
                error: None,
                data,
            },
            Err(e) => Self::err(
                ErrorKind::Internal,
                format!("lbd could not write its answer as JSON: {e}"),
            ),
        }
    }

    /// A refusal of kind `kind`, with the reason in words.
    pub fn err(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            api: API_VERSION,
            ok: false,
            code: Some(kind),
            error: Some(message.into()),
            data: serde_json::Value::Null,
        }
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    /// Why the socket could not be reached, in words (each reason once).
    #[error("{0}")]
    Connect(String),
    #[error("talking to lbd")]
    Io(#[from] std::io::Error),
    /// No answer in time: the request may still be carried out.
    #[error(
        "no answer from lbd within {} s; a change may still be made: see `lbctl history` and `lbctl status`",
        .0.as_secs()
    )]
    NoAnswer(Duration),
    #[error("bad answer from lbd")]
    Decode(#[from] serde_json::Error),
    /// The answer ran past [`MAX_RESPONSE`]: cut off, not malformed.
    #[error("lbd's answer is larger than {} MiB, the most lbctl reads", MAX_RESPONSE >> 20)]
    TooLarge,
    /// `lbd` refused the request: its code (none from an older `lbd`)
    /// and its reason.
    #[error("lbd: {message}")]
    Daemon {
        code: Option<ErrorKind>,
        message: String,
    },
}

impl ClientError {
    fn connect(path: &Path, e: &std::io::Error) -> Self {
        let path = path.display();
        ClientError::Connect(match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("no lbd socket at {path}: is lbd running, and is this its instance?")
            }
            std::io::ErrorKind::PermissionDenied => {
                format!(
                    "permission denied on {path}: lbd's socket is root's (mode 0600); run lbctl as root"
                )
            }
            std::io::ErrorKind::ConnectionRefused => {
                format!("nothing answers at {path}: lbd is not running (the socket is stale)")
            }
            _ => format!("cannot connect to lbd at {path}: {e}"),
        })
    }
}

/// Sends one request and returns the `data` of a successful answer.
pub fn call(socket: &Path, request: &Request) -> Result<serde_json::Value, ClientError> {
    call_with(socket, request, &ChangeOptions::default())
}

/// [`call`], with options for a change.
pub fn call_with(
    socket: &Path,
    request: &Request,
    change: &ChangeOptions,
) -> Result<serde_json::Value, ClientError> {
    exchange(socket, request, change, Duration::from_secs(30))
}

/// [`call`], giving up after `timeout` without an answer (a live view
/// that must not freeze on a stuck `lbd`).
pub fn call_within(
    socket: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    exchange(socket, request, &ChangeOptions::default(), timeout)
}

fn exchange(
    socket: &Path,
    request: &Request,
    change: &ChangeOptions,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| ClientError::connect(socket, &e))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_vec(&Envelope::new(request.clone(), change.clone()))?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut reader = BufReader::new(std::io::Read::take(stream, MAX_RESPONSE as u64));
    let mut answer = String::new();
    reader.read_line(&mut answer).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ClientError::NoAnswer(timeout)
        }
        _ => e.into(),
    })?;
    if answer.len() >= MAX_RESPONSE && !answer.ends_with('\n') {
        return Err(ClientError::TooLarge);
    }
    let response: Response = serde_json::from_str(&answer)?;
    if response.ok {
        Ok(response.data)
    } else {
        Err(ClientError::Daemon {
            code: response.code,
            message: response.error.unwrap_or_else(|| "unknown error".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(r: Request) -> String {
        serde_json::to_string(&Envelope::new(r, ChangeOptions::default())).unwrap()
    }

    /// The codes as they travel, written out: a change here is an API
    /// change. Every kind is listed, and `code()` agrees with serde.
    #[test]
    fn refusals_carry_a_stable_code() {
        let written = [
            "invalid_config",
            "bad_request",
            "not_found",
            "exists",
            "blackhole",
            "needs_force",
            "fixed_setting",
            "conflict",
            "capacity",
            "unavailable",
            "protocol",
            "internal",
        ];
        assert_eq!(ErrorKind::ALL.len(), written.len());
        for (kind, code) in ErrorKind::ALL.iter().zip(written) {
            assert_eq!(kind.code(), code);
            assert_eq!(serde_json::to_string(kind).unwrap(), format!("\"{code}\""));
        }
        let answer = Response::err(ErrorKind::Blackhole, "no usable backend");
        let mut line = serde_json::to_string(&answer).unwrap();
        line = line.replace(&format!("\"api\":{API_VERSION}"), "\"api\":N");
        assert_eq!(
            line,
            r#"{"api":N,"ok":false,"code":"blackhole","error":"no usable backend","data":null}"#
        );
        // An answer from an lbd before codes reads as one without.
        let old: Response =
            serde_json::from_str(r#"{"api":2,"ok":false,"error":"x","data":null}"#).unwrap();
        assert_eq!((old.code, old.error.as_deref()), (None, Some("x")));
    }

    /// An `lbd` that takes the request and answers nothing in time: the
    /// client says so, and that the change may still be made (it said
    /// "Resource temporarily unavailable", and the operator retried).
    #[test]
    fn no_answer_in_time_says_the_change_may_still_be_made() {
        let dir = crate::scratch::ScratchDir::new("api-silent");
        let path = dir.join("lbd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let e = call_within(&path, &Request::Status, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ClientError::NoAnswer(_)), "{e:?}");
        assert!(e.to_string().contains("lbctl history"), "{e}");
        drop(held.join());
    }

    /// An answer longer than the client reads is reported as too large,
    /// not as the JSON error its cut-off text would give.
    #[test]
    fn an_answer_past_the_limit_says_it_is_too_large() {
        let dir = crate::scratch::ScratchDir::new("api-large");
        let path = dir.join("lbd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let talker = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let answer = format!(
                r#"{{"api":2,"ok":true,"data":"{}"}}"#,
                "x".repeat(MAX_RESPONSE)
            );
            // The client stops reading at the limit and closes.
            let _ = s.write_all(answer.as_bytes());
        });
        let e = call_within(&path, &Request::Status, Duration::from_secs(30)).unwrap_err();
        assert!(matches!(e, ClientError::TooLarge), "{e:?}");
        assert!(e.to_string().contains("64 MiB"), "{e}");
        talker.join().unwrap();
    }

    /// An answer that cannot be written as JSON is a refusal that says
    /// so, not a success with `null` data.
    #[test]
    fn an_answer_that_cannot_be_serialised_is_an_error_not_null() {
        // JSON object keys must be strings: a map keyed by pairs fails.
        let data = std::collections::BTreeMap::from([((1u8, 2u8), 3u8)]);
        let answer = Response::ok(data);
        assert!(!answer.ok);
        assert_eq!(answer.code, Some(ErrorKind::Internal));
        assert!(answer.error.unwrap().contains("JSON"));
        assert!(Response::ok([1, 2]).ok);
    }

    #[test]
    fn requests_have_a_stable_wire_form() {
        // The wire form, written out: a change here is an API change.
        let cases = [
            (Request::Status, r#"{"api":2,"op":"status"}"#),
            (
                Request::Backend(BackendRequest::Weight {
                    vip: "10.0.0.1:80/tcp".parse().unwrap(),
                    address: "10.1.0.1".parse().unwrap(),
                    weight: 3,
                    force: false,
                }),
                r#"{"api":2,"op":"backend","action":"weight","vip":"10.0.0.1:80/tcp","address":"10.1.0.1","weight":3,"force":false}"#,
            ),
            (
                Request::Node(NodeRequest::Drain { no_wait: false }),
                r#"{"api":2,"op":"node","action":"drain"}"#,
            ),
            (
                Request::Reload { force: true },
                r#"{"api":2,"op":"reload","force":true}"#,
            ),
        ];
        for (r, text) in cases {
            assert_eq!(wire(r.clone()), text);
            assert_eq!(Envelope::parse(text).map(|e| e.request), Ok(r));
        }
        // Options of a change travel beside the request.
        let confirmed = Envelope::new(
            Request::Reload { force: false },
            ChangeOptions {
                dry_run: false,
                confirm_within: Some("2m".parse().unwrap()),
            },
        );
        let text = r#"{"api":2,"op":"reload","force":false,"change":{"confirm_within":"120s"}}"#;
        assert_eq!(serde_json::to_string(&confirmed).unwrap(), text);
        assert_eq!(Envelope::parse(text), Ok(confirmed));
        assert!(
            Envelope::parse(r#"{"api":2,"op":"confirm","change":{"confirm_within":"25h"}}"#)
                .unwrap_err()
                .contains("1s to 24h")
        );
        // Optional fields may be left out.
        let add = Envelope::parse(
            r#"{"api":2,"op":"vip","action":"add","vip":"10.0.0.2:53/udp","backends":[{"address":"10.1.0.1"}]}"#,
        )
        .unwrap()
        .request;
        let Request::Vip(VipRequest::Add(add)) = add else {
            panic!("vip add")
        };
        assert_eq!(add.vip.to_string(), "10.0.0.2:53/udp");
        assert_eq!(add.backends[0].weight, 1);
        assert!(add.settings.is_empty());
        // Settings travel by their path in the file.
        let add = Envelope::parse(
            r#"{"api":2,"op":"vip","action":"add","vip":"10.0.0.2:53/udp","backends":[],"settings":{"encap":"gue","health_check.interval":"1s"}}"#,
        )
        .unwrap()
        .request;
        let Request::Vip(VipRequest::Add(add)) = add else {
            panic!("vip add")
        };
        assert_eq!(add.settings.0["health_check.interval"], "1s");
    }

    #[test]
    fn other_versions_and_bad_requests_are_refused_with_a_reason() {
        for (text, want) in [
            (
                r#"{"op":"status"}"#,
                "API version 2, the request is version 1",
            ),
            (r#"{"api":3,"op":"status"}"#, "the request is version 3"),
            (r#"{"api":2,"op":"explode"}"#, "unknown variant `explode`"),
            (
                r#"{"api":2,"op":"vip","action":"del","vip":"10.0.0.1"}"#,
                "is not a VIP",
            ),
            (
                r#"{"api":2,"op":"backend","action":"add","vip":"10.0.0.1:80/tcp","address":"x"}"#,
                "invalid IP address",
            ),
            ("not json", "bad request"),
        ] {
            let err = Envelope::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    /// `lbctl vip add` has a flag for every VIP setting, named after its
    /// path in the file, and hands the values on as written.
    #[test]
    fn vip_add_takes_every_setting_by_its_file_name() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            request: Request,
        }
        let cli = Cli::try_parse_from([
            "lbctl",
            "vip",
            "add",
            "10.0.0.1:80/tcp",
            "--backend",
            "10.1.0.1=2",
            "--health-check-interval",
            "1s",
            "--health-check-http-path",
            "/ready",
            "--second-chance",
            "--no-conntrack",
            "--passive-health",
        ])
        .expect("parses");
        let Request::Vip(VipRequest::Add(add)) = cli.request else {
            panic!("vip add")
        };
        let got: Vec<(&str, &str)> = add
            .settings
            .0
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("conntrack", "false"),
                ("health_check.http.path", "/ready"),
                ("health_check.interval", "1s"),
                ("passive_health", ""),
                ("second_chance", "true"),
            ]
        );
        let cmd = <Cli as clap::CommandFactory>::command();
        let add = cmd
            .find_subcommand("vip")
            .and_then(|v| v.find_subcommand("add"))
            .expect("vip add");
        for s in crate::config::vip_settings::VIP_SETTINGS {
            let flag = crate::config::vip_settings::flag_name(s.path);
            assert!(
                add.get_arguments()
                    .any(|a| a.get_long() == Some(flag.as_str())),
                "no --{flag}"
            );
        }
    }

    #[test]
    fn backends_on_the_command_line() {
        assert_eq!(
            "10.1.0.1=3".parse::<BackendSpec>(),
            Ok(BackendSpec {
                address: "10.1.0.1".parse().unwrap(),
                weight: 3
            })
        );
        assert!("10.1.0.1=x".parse::<BackendSpec>().is_err());
        assert!("nope".parse::<BackendSpec>().is_err());
    }
}

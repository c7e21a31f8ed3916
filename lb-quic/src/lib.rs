//! QUIC connection IDs that lb's QUIC-LB decoder can route: the plaintext
//! algorithm of the IETF QUIC-LB draft (draft-ietf-quic-load-balancers),
//! for QUIC servers written in Rust that sit behind the balancer.
//!
//! A connection ID in this format is one first octet, the server id, then
//! a nonce:
//!
//! ```text
//! | config id (3 bits) | length or random (5 bits) | server id | nonce |
//! ```
//!
//! This crate owns that layout: [`Config`] (the parameters, validated),
//! [`encode`] and [`decode`] (the pure functions, usable by a balancer as
//! well as a server), and [`Generator`] (a server's source of fresh CIDs,
//! with a `quinn` feature that plugs it into quinn). It does not encrypt
//! (the draft's AES-based algorithms are absent: with the plaintext
//! algorithm an observer can read which server a connection is on), does
//! not allocate server ids, and does no I/O.
//!
//! # Configuring a backend
//!
//! Choose, once for the whole pool and the same on the balancer:
//!
//! - the **config id** (config rotation codepoint), `0..=6`: the top three
//!   bits of every CID. `0b111` is reserved for unroutable CIDs and is
//!   refused. A new configuration takes a new id. lb's balancer routes by
//!   one id per VIP: once it has the new one, a CID issued under the old
//!   one is routed like any packet without a CID (the connection table,
//!   then the 4-tuple), so a client that changes its address in that time
//!   loses its connection;
//! - the **server id length**, `1..=15` octets, large enough for every
//!   server the pool may ever hold; each server gets a distinct id of
//!   exactly that length;
//! - the **nonce length**, at least 4 octets, with server id and nonce
//!   together at most 19 octets (a QUIC v1 CID is at most 20). Longer
//!   nonces make collisions rarer; the CID is `1 + server id + nonce`
//!   octets;
//! - whether the low five bits of the first octet **self-encode the
//!   length** (`cid_len - 1`, for hardware offload) or are random.
//!
//! The balancer needs only the config id and the server id length: it
//! reads the top three bits, and if they are its config id it routes on
//! octets `1..=server_id_len`. Every other CID (another config id,
//! `0b111`, too short) is unroutable and goes to the balancer's fallback.
//! A server whose config id or server id length differs from the
//! balancer's gets its connections spread by that fallback instead of
//! kept.
//!
//! # With quinn
//!
//! With the `quinn` feature, a [`Generator`] is a
//! `quinn_proto::ConnectionIdGenerator`:
//!
//! ```ignore
//! use std::sync::Arc;
//! use lb_quic::{Config, Generator};
//!
//! // Config id 1, a 2-octet server id, an 8-octet nonce, length encoded.
//! let config = Config::new(1, 2, 8, true)?;
//! // This server's id, from the deployment: the balancer maps it to this
//! // server's address.
//! let generator = Generator::new(config, &[0x00, 0x2a])?;
//! let mut endpoint_config = quinn::EndpointConfig::default();
//! endpoint_config.cid_generator(move || Box::new(generator));
//! let endpoint = quinn::Endpoint::new(
//!     endpoint_config,
//!     Some(server_config),
//!     socket,
//!     Arc::new(quinn::TokioRuntime),
//! )?;
//! ```
#![forbid(unsafe_code)]

mod cid;
mod config;
mod generator;
#[cfg(feature = "quinn")]
mod quinn;

pub use cid::{ConnectionId, EncodeError, MAX_CID_LEN, decode, encode};
pub use config::{Config, ConfigError};
pub use generator::Generator;

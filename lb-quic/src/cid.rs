//! The plaintext CID layout: [`encode`] writes a first octet, a server id
//! and a nonce into a [`ConnectionId`]; [`decode`] reads the server id
//! back as a load balancer does, or says the CID is unroutable. Where
//! nonces come from is `generator`'s.

use std::fmt;

use thiserror::Error;

use crate::config::{Config, MAX_SERVER_ID_LEN, MIN_SERVER_ID_LEN, UNROUTABLE_CONFIG_ID};

/// The longest QUIC v1 connection ID, in octets.
pub const MAX_CID_LEN: usize = 20;

/// The first octet's bits below the config id.
const LOW_BITS_MASK: u8 = 0x1f;

/// Where the config id sits in the first octet.
const CONFIG_ID_SHIFT: u8 = 5;

/// A connection ID of at most [`MAX_CID_LEN`] octets, by value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId {
    bytes: [u8; MAX_CID_LEN],
    /// How many of `bytes` are the CID; at most [`MAX_CID_LEN`].
    len: u8,
}

/// Parts that do not fit the [`Config`] they were encoded with.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum EncodeError {
    /// The server id is not the configuration's length.
    #[error("server id is {actual} octets, the configuration's length is {expected}")]
    ServerIdLen { expected: u8, actual: usize },
    /// The nonce is not the configuration's length.
    #[error("nonce is {actual} octets, the configuration's length is {expected}")]
    NonceLen { expected: u8, actual: usize },
}

impl ConnectionId {
    /// The CID's octets.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl AsRef<[u8]> for ConnectionId {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// Hex, as the draft writes CIDs.
impl fmt::Debug for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnectionId(")?;
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

/// The CID of `config` carrying `server_id` and `nonce`, whose lengths
/// must be the configuration's. The first octet's low five bits are the
/// CID's length after it if `config` self-encodes the length, otherwise
/// `random_low_bits & 0x1f` (the caller's random bits).
pub fn encode(
    config: &Config,
    server_id: &[u8],
    nonce: &[u8],
    random_low_bits: u8,
) -> Result<ConnectionId, EncodeError> {
    if server_id.len() != usize::from(config.server_id_len()) {
        return Err(EncodeError::ServerIdLen {
            expected: config.server_id_len(),
            actual: server_id.len(),
        });
    }
    if nonce.len() != usize::from(config.nonce_len()) {
        return Err(EncodeError::NonceLen {
            expected: config.nonce_len(),
            actual: nonce.len(),
        });
    }
    Ok(assemble(config, server_id, nonce, random_low_bits))
}

/// [`encode`] without the length checks, for parts already known to fit
/// (a CID never grows past [`MAX_CID_LEN`]; excess octets are dropped).
pub(crate) fn assemble(
    config: &Config,
    server_id: &[u8],
    nonce: &[u8],
    random_low_bits: u8,
) -> ConnectionId {
    let low_bits = if config.self_encode_length() {
        // At most 19, so it fits the five bits.
        u8::try_from(config.cid_len() - 1).unwrap_or(LOW_BITS_MASK)
    } else {
        random_low_bits
    };
    let mut bytes = [0; MAX_CID_LEN];
    bytes[0] = (config.config_id() << CONFIG_ID_SHIFT) | (low_bits & LOW_BITS_MASK);
    let mut len = 1;
    for (slot, byte) in bytes[1..].iter_mut().zip(server_id.iter().chain(nonce)) {
        *slot = *byte;
        len += 1;
    }
    ConnectionId { bytes, len }
}

/// What a load balancer configured with `config_id` and `server_id_len`
/// reads from `cid`: the server id (octets `1..=server_id_len`), or `None`
/// if the CID is unroutable: empty, another config id (`0b111` always),
/// or too short to hold a server id. A `config_id` or `server_id_len` no
/// [`Config`] accepts routes nothing. Octets after the server id are not
/// looked at, so any nonce length (and any self-encoded length) decodes.
pub fn decode(config_id: u8, server_id_len: u8, cid: &[u8]) -> Option<&[u8]> {
    if config_id >= UNROUTABLE_CONFIG_ID
        || !(MIN_SERVER_ID_LEN..=MAX_SERVER_ID_LEN).contains(&server_id_len)
    {
        return None;
    }
    let (first, rest) = cid.split_first()?;
    if first >> CONFIG_ID_SHIFT != config_id {
        return None;
    }
    rest.get(..usize::from(server_id_len))
}

#[cfg(test)]
mod tests;

//! The parameters of a QUIC-LB plaintext configuration ([`Config`]) and
//! the draft's bounds on them ([`ConfigError`]). What a CID looks like is
//! `cid`'s; which server a process is, the caller's.

use thiserror::Error;

/// The reserved config rotation codepoint: CIDs of servers without a
/// configuration carry it, and no configuration may use it.
pub(crate) const UNROUTABLE_CONFIG_ID: u8 = 0b111;

/// The shortest server id, in octets.
pub(crate) const MIN_SERVER_ID_LEN: u8 = 1;

/// The shortest nonce, in octets.
pub(crate) const MIN_NONCE_LEN: u8 = 4;

/// The longest server id and nonce together: a QUIC v1 CID is at most 20
/// octets, one of them the first octet.
pub(crate) const MAX_SERVER_ID_AND_NONCE_LEN: u8 = 19;

/// The longest server id: what is left beside the shortest nonce.
pub(crate) const MAX_SERVER_ID_LEN: u8 = MAX_SERVER_ID_AND_NONCE_LEN - MIN_NONCE_LEN;

/// One QUIC-LB plaintext configuration, within the draft's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    config_id: u8,
    server_id_len: u8,
    nonce_len: u8,
    self_encode_length: bool,
}

/// A bound of the draft that [`Config::new`] was asked to break.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The config id is not `0..=6` (`0b111` is reserved for unroutable
    /// CIDs, and only three bits carry it).
    #[error("config id {config_id} is not 0..=6 (0b111 is reserved for unroutable CIDs)")]
    ConfigId { config_id: u8 },
    /// The server id length is not `1..=15` octets.
    #[error("server id length {server_id_len} is not 1..=15 octets")]
    ServerIdLen { server_id_len: u8 },
    /// The nonce is shorter than 4 octets.
    #[error("nonce length {nonce_len} is under the minimum of 4 octets")]
    NonceLen { nonce_len: u8 },
    /// Server id and nonce exceed 19 octets together (the CID would exceed
    /// QUIC v1's 20).
    #[error(
        "server id length {server_id_len} and nonce length {nonce_len} sum to more than 19 octets"
    )]
    TooLong { server_id_len: u8, nonce_len: u8 },
}

impl Config {
    /// A configuration: CIDs whose first octet's top three bits are
    /// `config_id`, followed by a server id of `server_id_len` octets and a
    /// nonce of `nonce_len`; with `self_encode_length` the first octet's
    /// low five bits are the CID's length after that octet, otherwise they
    /// are random.
    pub fn new(
        config_id: u8,
        server_id_len: u8,
        nonce_len: u8,
        self_encode_length: bool,
    ) -> Result<Self, ConfigError> {
        if config_id >= UNROUTABLE_CONFIG_ID {
            return Err(ConfigError::ConfigId { config_id });
        }
        if !(MIN_SERVER_ID_LEN..=MAX_SERVER_ID_LEN).contains(&server_id_len) {
            return Err(ConfigError::ServerIdLen { server_id_len });
        }
        if nonce_len < MIN_NONCE_LEN {
            return Err(ConfigError::NonceLen { nonce_len });
        }
        if u16::from(server_id_len) + u16::from(nonce_len) > u16::from(MAX_SERVER_ID_AND_NONCE_LEN)
        {
            return Err(ConfigError::TooLong {
                server_id_len,
                nonce_len,
            });
        }
        Ok(Self {
            config_id,
            server_id_len,
            nonce_len,
            self_encode_length,
        })
    }

    /// The config rotation codepoint, `0..=6`.
    pub fn config_id(&self) -> u8 {
        self.config_id
    }

    /// The server id's length in octets, `1..=15`.
    pub fn server_id_len(&self) -> u8 {
        self.server_id_len
    }

    /// The nonce's length in octets, at least 4.
    pub fn nonce_len(&self) -> u8 {
        self.nonce_len
    }

    /// Whether the first octet's low five bits carry the CID's length.
    pub fn self_encode_length(&self) -> bool {
        self.self_encode_length
    }

    /// The whole CID's length in octets: `1 + server_id_len + nonce_len`,
    /// at most 20.
    pub fn cid_len(&self) -> usize {
        1 + usize::from(self.server_id_len) + usize::from(self.nonce_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_bounds() {
        for (config_id, server_id_len, nonce_len) in [(0, 1, 4), (6, 15, 4), (3, 1, 18), (1, 9, 10)]
        {
            let config = Config::new(config_id, server_id_len, nonce_len, true)
                .expect("a configuration inside every bound");
            assert_eq!(config.config_id(), config_id);
            assert_eq!(config.server_id_len(), server_id_len);
            assert_eq!(config.nonce_len(), nonce_len);
            assert!(config.self_encode_length());
            assert_eq!(
                config.cid_len(),
                1 + usize::from(server_id_len) + usize::from(nonce_len)
            );
        }
        let config = Config::new(0, 1, 4, false).expect("a configuration inside every bound");
        assert!(!config.self_encode_length());
        assert_eq!(config.cid_len(), 6);
    }

    #[test]
    fn refuses_config_id_7_and_above() {
        for config_id in [7, 8, u8::MAX] {
            assert_eq!(
                Config::new(config_id, 1, 4, true),
                Err(ConfigError::ConfigId { config_id })
            );
        }
    }

    #[test]
    fn refuses_server_id_0_and_16() {
        for server_id_len in [0, 16, u8::MAX] {
            assert_eq!(
                Config::new(0, server_id_len, 4, true),
                Err(ConfigError::ServerIdLen { server_id_len })
            );
        }
    }

    #[test]
    fn refuses_nonce_under_4() {
        for nonce_len in [0, 3] {
            assert_eq!(
                Config::new(0, 1, nonce_len, true),
                Err(ConfigError::NonceLen { nonce_len })
            );
        }
    }

    #[test]
    fn refuses_a_sum_over_19() {
        for (server_id_len, nonce_len) in [(1, 19), (15, 5), (10, 10), (15, u8::MAX)] {
            assert_eq!(
                Config::new(0, server_id_len, nonce_len, true),
                Err(ConfigError::TooLong {
                    server_id_len,
                    nonce_len
                })
            );
        }
    }

    #[test]
    fn errors_name_their_bound() {
        let errors = [
            Config::new(7, 1, 4, true),
            Config::new(0, 16, 4, true),
            Config::new(0, 1, 3, true),
            Config::new(0, 10, 10, true),
        ];
        let bounds = ["0..=6", "1..=15", "4 octets", "19 octets"];
        for (error, bound) in errors.into_iter().zip(bounds) {
            let message = error.expect_err("a broken bound").to_string();
            assert!(message.contains(bound), "{message:?} names {bound:?}");
        }
    }
}

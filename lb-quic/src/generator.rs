//! A server's source of fresh CIDs: [`Generator`] holds a [`Config`] and
//! this server's id and draws every nonce (and, without length
//! self-encoding, the first octet's low bits) from `rand`'s thread-local
//! CSPRNG. The layout is `cid`'s; plugging into quinn is `quinn`'s.

use rand::Rng as _;

use crate::{
    cid::{self, ConnectionId, EncodeError, MAX_CID_LEN},
    config::{Config, MAX_SERVER_ID_LEN},
};

/// Generates this server's CIDs under one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generator {
    config: Config,
    /// This server's id in its first `config.server_id_len()` octets.
    server_id: [u8; MAX_SERVER_ID_LEN as usize],
}

impl Generator {
    /// A generator of `config`'s CIDs for the server `server_id`, which
    /// must be `config.server_id_len()` octets.
    pub fn new(config: Config, server_id: &[u8]) -> Result<Self, EncodeError> {
        let mut stored = [0; MAX_SERVER_ID_LEN as usize];
        match stored.get_mut(..server_id.len()) {
            Some(slots) if server_id.len() == usize::from(config.server_id_len()) => {
                slots.copy_from_slice(server_id);
            }
            _ => {
                return Err(EncodeError::ServerIdLen {
                    expected: config.server_id_len(),
                    actual: server_id.len(),
                });
            }
        }
        Ok(Self {
            config,
            server_id: stored,
        })
    }

    /// The configuration the CIDs follow.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This server's id.
    pub fn server_id(&self) -> &[u8] {
        let len = usize::from(self.config.server_id_len());
        self.server_id.get(..len).unwrap_or(&[])
    }

    /// A fresh CID: the configuration's first octet and this server's id,
    /// then a random nonce.
    ///
    /// # Panics
    ///
    /// As [`rand::rng`]: only if the operating system's random source
    /// fails when this thread first seeds its generator (quinn's own CID
    /// generators draw from the same source).
    pub fn generate(&mut self) -> ConnectionId {
        let mut random = [0; MAX_CID_LEN];
        rand::rng().fill_bytes(&mut random);
        let [low_bits, ref rest @ ..] = random;
        let nonce = rest
            .get(..usize::from(self.config.nonce_len()))
            .unwrap_or(rest);
        cid::assemble(&self.config, self.server_id(), nonce, low_bits)
    }

    /// Whether `cid` could be one of this generator's: its length, config
    /// id and server id are this generator's (the nonce and low bits are
    /// not checked).
    pub fn is_ours(&self, cid: &[u8]) -> bool {
        cid.len() == self.config.cid_len()
            && cid::decode(self.config.config_id(), self.config.server_id_len(), cid)
                == Some(self.server_id())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn generator(self_encode: bool) -> Generator {
        let config = Config::new(3, 2, 8, self_encode).expect("a valid test config");
        Generator::new(config, &[0xbe, 0xef]).expect("the config's server id length")
    }

    #[test]
    fn generated_cids_carry_this_server() {
        let mut generator = generator(true);
        assert_eq!(generator.server_id(), [0xbe, 0xef]);
        let mut nonces = HashSet::new();
        for _ in 0..100 {
            let cid = generator.generate();
            let bytes = cid.as_bytes();
            assert_eq!(bytes.len(), 11);
            assert_eq!(bytes[0], 3 << 5 | 10, "config 3, length 10");
            assert_eq!(cid::decode(3, 2, bytes), Some(&[0xbe, 0xef][..]));
            assert!(generator.is_ours(bytes));
            nonces.insert(bytes[3..].to_vec());
        }
        assert_eq!(nonces.len(), 100, "64-bit nonces do not repeat");
    }

    /// Without length self-encoding the low five bits are random: 200
    /// draws all alike would happen with probability 32^-199.
    #[test]
    fn low_bits_vary_without_self_encoding() {
        let mut generator = generator(false);
        let mut low_bits = HashSet::new();
        for _ in 0..200 {
            let cid = generator.generate();
            assert_eq!(cid.as_bytes()[0] >> 5, 3);
            low_bits.insert(cid.as_bytes()[0] & 0x1f);
            if low_bits.len() > 1 {
                return;
            }
        }
        panic!("200 CIDs had the same low bits {low_bits:?}");
    }

    #[test]
    fn is_ours_checks_length_config_and_server() {
        let mut generator = generator(true);
        let cid = generator.generate();
        let bytes = cid.as_bytes();
        assert!(generator.is_ours(bytes));
        assert!(!generator.is_ours(&bytes[..10]), "shorter");
        assert!(!generator.is_ours(&[bytes, &[0]].concat()), "longer");
        let mut other_config = bytes.to_vec();
        other_config[0] ^= 1 << 5;
        assert!(!generator.is_ours(&other_config), "config 2");
        let mut other_server = bytes.to_vec();
        other_server[2] ^= 1;
        assert!(!generator.is_ours(&other_server), "server beee");
        assert!(!generator.is_ours(&[]));
    }

    #[test]
    fn refuses_a_server_id_of_the_wrong_length() {
        let config = Config::new(0, 2, 4, true).expect("a valid test config");
        for server_id in [&[][..], &[1], &[1, 2, 3], &[0; 16], &[0; 40]] {
            assert_eq!(
                Generator::new(config, server_id),
                Err(EncodeError::ServerIdLen {
                    expected: 2,
                    actual: server_id.len()
                })
            );
        }
    }
}

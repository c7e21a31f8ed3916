//! With the `quinn` feature: [`Generator`] as quinn's
//! `ConnectionIdGenerator`, so a quinn endpoint issues CIDs the balancer
//! routes back to it. The CIDs themselves are `generator`'s.

use std::time::Duration;

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};

use crate::generator::Generator;

impl ConnectionIdGenerator for Generator {
    fn generate_cid(&mut self) -> ConnectionId {
        ConnectionId::new(self.generate().as_bytes())
    }

    /// Refuses CIDs that are not this generator's length, config id and
    /// server id.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if self.is_ours(cid) {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        self.config().cid_len()
    }

    /// CIDs do not expire: the server id in them stays valid for as long as
    /// the configuration does, and rotating the configuration is the
    /// deployment's business.
    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn drives_the_trait() {
        let config = Config::new(5, 4, 8, true).expect("a valid test config");
        let server_id = [1, 2, 3, 4];
        let mut generator = Generator::new(config, &server_id).expect("4 octets");
        let boxed: &mut dyn ConnectionIdGenerator = &mut generator;
        assert_eq!(boxed.cid_len(), 13);
        assert_eq!(boxed.cid_lifetime(), None);
        let cid = boxed.generate_cid();
        assert_eq!(cid.len(), 13);
        assert_eq!(cid[0], 5 << 5 | 12);
        assert_eq!(crate::decode(5, 4, &cid), Some(&server_id[..]));
        assert!(boxed.validate(&cid).is_ok());
        assert_ne!(boxed.generate_cid(), cid, "a fresh nonce each time");

        let mut other_config = cid.to_vec();
        other_config[0] = 4 << 5 | 12;
        let mut other_server = cid.to_vec();
        other_server[4] ^= 0xff;
        let mut unroutable = cid.to_vec();
        unroutable[0] = 0b111 << 5 | 12;
        for bad in [
            other_config,
            other_server,
            unroutable,
            cid[..12].to_vec(),
            Vec::new(),
        ] {
            let bad = ConnectionId::new(&bad);
            assert!(boxed.validate(&bad).is_err(), "{bad:?} is not ours");
        }
    }
}

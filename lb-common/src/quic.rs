//! QUIC by connection ID: what `lb_xdp` reads of a QUIC packet to a VIP
//! with `quic:` and the key it looks the server up by, computed the same
//! way on both sides (the datapath, `lbctl simulate`).
//!
//! The format is the plaintext algorithm of the IETF QUIC-LB draft
//! (draft-ietf-quic-load-balancers, "Server ID Encoding in Connection
//! IDs"): a connection ID the server issued starts with a first octet whose
//! three high bits are the configuration's id (0b111: unroutable), then the
//! server ID, `server_id_len` octets, then a nonce of its choosing. A
//! short-header packet (RFC 8999: the high bit of its first byte clear)
//! starts its Destination Connection ID right after that byte, whatever its
//! version; a long-header packet (Initial, 0-RTT, Handshake, Retry, version
//! negotiation) is never routed by connection ID: the client chose its
//! first one.
//!
//! Limits, named like the parser's:
//! - the server ID is 1 to [`QUIC_MAX_SERVER_ID_LEN`] octets (15: the
//!   draft's nonce is at least 4 octets and a QUIC v1 connection ID at
//!   most 20);
//! - the datapath reads exactly [`QUIC_READ_LEN`] bytes of UDP payload (the
//!   first byte, the first octet of the connection ID and 15 more) and
//!   decodes nothing of a shorter datagram; every short-header QUIC packet
//!   is longer (a connection ID of at least 6 octets, a packet number, and
//!   the 16-byte AEAD tag).
//!
//! The encrypted algorithms of the draft (AES-128-ECB, one pass or four
//! Feistel rounds) are not supported: the kernels lb supports (6.1) give
//! an XDP program no cipher (the `bpf_crypto` kfuncs came in 6.10), and a
//! software AES in eBPF would cost the four-pass case several times a
//! whole forwarded packet. Plaintext server IDs let an observer see which
//! server a connection is on, which a balancer's operator usually knows
//! anyway; the draft's "Security Considerations" say what else it gives
//! away.

/// Most octets of a server ID.
pub const QUIC_MAX_SERVER_ID_LEN: u8 = 15;
/// Highest configuration id (0b111 marks an unroutable connection ID).
pub const QUIC_MAX_CONFIG_ID: u8 = 6;
/// Bytes of UDP payload the datapath reads of a short-header packet: its
/// first byte, the connection ID's first octet, 15 octets of server ID.
pub const QUIC_READ_LEN: usize = 2 + QUIC_MAX_SERVER_ID_LEN as usize;
/// The high bit of a QUIC packet's first byte: a long header.
pub const QUIC_LONG_HEADER: u8 = 0x80;

/// `LB_QUIC_SERVERS` key: a VIP and one of its servers' IDs, the ID's
/// octets in order from `sid[0]`'s low byte (little-endian words), the
/// octets past its length zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuicServerKey {
    pub sid: [u64; 2],
    /// [`crate::VipMeta::vip_id`].
    pub vip_id: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<QuicServerKey>() == 24);

/// A VIP's QUIC-LB parameters as [`crate::VipMeta`] carries them
/// ([`crate::consts::VIP_F_QUIC`] set): the configuration id and the
/// server ID's length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicParams {
    pub config_id: u8,
    pub server_id_len: u8,
}

impl QuicParams {
    /// The parameters packed into the VIP entry's `aux_port`, which only
    /// the auxiliary fragment keys use otherwise.
    #[inline(always)]
    pub const fn pack(self) -> u16 {
        ((self.config_id as u16) << 8) | self.server_id_len as u16
    }

    #[inline(always)]
    pub const fn unpack(aux: u16) -> Self {
        Self {
            config_id: (aux >> 8) as u8,
            server_id_len: aux as u8,
        }
    }
}

/// What a datagram to a QUIC VIP says about where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuicRoute {
    /// A short header whose connection ID carries this server key.
    Server(QuicServerKey),
    /// A long header: hashed on the 4-tuple like any UDP flow.
    LongHeader,
    /// A short header whose connection ID does not decode (another or the
    /// unroutable configuration id, or a datagram too short): hashed.
    Unroutable,
}

/// How `bytes`, the first [`QUIC_READ_LEN`] bytes of a datagram's payload
/// (`None`: the payload is shorter), route for VIP `vip_id` with `params`.
#[inline(always)]
pub fn route(vip_id: u32, params: QuicParams, bytes: Option<&[u8; QUIC_READ_LEN]>) -> QuicRoute {
    let Some(b) = bytes else {
        return QuicRoute::Unroutable;
    };
    if b[0] & QUIC_LONG_HEADER != 0 {
        return QuicRoute::LongHeader;
    }
    let len = params.server_id_len;
    if b[1] >> 5 != params.config_id || len == 0 || len > QUIC_MAX_SERVER_ID_LEN {
        return QuicRoute::Unroutable;
    }
    QuicRoute::Server(server_key(vip_id, len, &b[2..]))
}

/// The key of server ID `sid` (its first `len` octets) of VIP `vip_id`.
#[inline(always)]
pub fn server_key(vip_id: u32, len: u8, sid: &[u8]) -> QuicServerKey {
    let mut words = [0u64; 2];
    let mut i = 0;
    while i < QUIC_MAX_SERVER_ID_LEN as usize {
        if i < len as usize && i < sid.len() {
            words[i / 8] |= (sid[i] as u64) << (8 * (i % 8));
        }
        i += 1;
    }
    QuicServerKey {
        sid: words,
        vip_id,
        _pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(first: u8, cid: &[u8]) -> [u8; QUIC_READ_LEN] {
        let mut b = [0xee; QUIC_READ_LEN];
        b[0] = first;
        b[1..1 + cid.len()].copy_from_slice(cid);
        b
    }

    #[test]
    fn the_drafts_first_vector_decodes_to_its_server_id() {
        // draft-ietf-quic-load-balancers, "Unencrypted CIDs": config 0,
        // server ID c4605e, nonce 4504cc4f, CID 07c4605e4504cc4f.
        let cid = [0x07, 0xc4, 0x60, 0x5e, 0x45, 0x04, 0xcc, 0x4f];
        let b = payload(0x40, &cid);
        let params = QuicParams {
            config_id: 0,
            server_id_len: 3,
        };
        let want = QuicServerKey {
            sid: [0x5e60c4, 0],
            vip_id: 9,
            _pad: 0,
        };
        assert_eq!(route(9, params, Some(&b)), QuicRoute::Server(want));
        assert_eq!(server_key(9, 3, &[0xc4, 0x60, 0x5e]), want);
    }

    #[test]
    fn long_headers_other_configs_and_short_datagrams_are_not_routed() {
        let params = QuicParams {
            config_id: 1,
            server_id_len: 2,
        };
        let long = payload(0xc0, &[0x20, 1, 2]);
        assert_eq!(route(0, params, Some(&long)), QuicRoute::LongHeader);
        for first_octet in [0x00, 0x40, 0xe0, 0xff] {
            let other = payload(0x40, &[first_octet, 1, 2]);
            assert_eq!(route(0, params, Some(&other)), QuicRoute::Unroutable);
        }
        assert_eq!(route(0, params, None), QuicRoute::Unroutable);
        let off = QuicParams {
            config_id: 1,
            server_id_len: 0,
        };
        assert_eq!(
            route(0, off, Some(&payload(0x40, &[0x20]))),
            QuicRoute::Unroutable
        );
    }

    #[test]
    fn every_length_keeps_exactly_its_octets() {
        let sid: [u8; 15] = core::array::from_fn(|i| 0x10 + i as u8);
        for len in 1..=QUIC_MAX_SERVER_ID_LEN {
            let key = server_key(1, len, &sid);
            let mut back = [0u8; 16];
            back[..8].copy_from_slice(&key.sid[0].to_le_bytes());
            back[8..].copy_from_slice(&key.sid[1].to_le_bytes());
            assert_eq!(&back[..len as usize], &sid[..len as usize], "len {len}");
            assert!(back[len as usize..].iter().all(|b| *b == 0), "len {len}");
        }
    }

    #[test]
    fn params_pack_into_sixteen_bits() {
        let p = QuicParams {
            config_id: 6,
            server_id_len: 15,
        };
        assert_eq!(QuicParams::unpack(p.pack()), p);
    }
}

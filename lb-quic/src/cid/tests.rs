//! `encode` and `decode` against the draft's test vectors, round trips
//! over every server id length, and the unroutable cases.

use super::*;

/// `0123…` as octets; the test vectors are written in hex.
fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("a hex literal"))
        .collect()
}

fn config(config_id: u8, server_id_len: u8, nonce_len: u8, self_encode: bool) -> Config {
    Config::new(config_id, server_id_len, nonce_len, self_encode).expect("a valid test config")
}

/// The draft's first unencrypted vector, as printed:
/// `0 c4605e 4504cc4f 07c4605e4504cc4f`.
#[test]
fn vector_1() {
    let cid = encode(&config(0, 3, 4, true), &hex("c4605e"), &hex("4504cc4f"), 0)
        .expect("the vector's lengths");
    assert_eq!(cid.as_bytes(), hex("07c4605e4504cc4f"));
    assert_eq!(decode(0, 3, cid.as_bytes()), Some(&hex("c4605e")[..]));
}

/// The draft's second unencrypted vector is printed as
/// `1 350d28b420 3487d970b 20a350d28b4203487d970b`, which contradicts
/// itself: the nonce has 9 hex digits, and the CID does not start with
/// `0x2a` (config 1, length 10). It is a typo: a stray `0` after the
/// CID's first digit and the last digit dropped from nonce and CID. With
/// the nonce `3487d970b0` the printed CID, so repaired, is what the
/// format gives.
#[test]
fn vector_2_repaired() {
    let cid = encode(
        &config(1, 5, 5, true),
        &hex("350d28b420"),
        &hex("3487d970b0"),
        0,
    )
    .expect("the vector's lengths");
    assert_eq!(cid.as_bytes(), hex("2a350d28b4203487d970b0"));
    assert_eq!(decode(1, 5, cid.as_bytes()), Some(&hex("350d28b420")[..]));
    assert_eq!(
        decode(0, 5, cid.as_bytes()),
        None,
        "config 1 is not config 0"
    );
}

#[test]
fn round_trips_every_server_id_len_with_the_largest_nonce() {
    for server_id_len in 1..=15u8 {
        let nonce_len = 19 - server_id_len;
        let config_id = server_id_len % 7;
        let server_id: Vec<u8> = (1..=server_id_len).collect();
        let nonce: Vec<u8> = (0..nonce_len).map(|i| 0xf0 ^ i).collect();
        let config = config(config_id, server_id_len, nonce_len, true);
        let cid = encode(&config, &server_id, &nonce, 0).expect("lengths of the config");
        let bytes = cid.as_bytes();
        assert_eq!(bytes.len(), MAX_CID_LEN);
        assert_eq!(bytes[0], config_id << 5 | 19, "config id and length");
        assert_eq!(&bytes[1..=usize::from(server_id_len)], &server_id[..]);
        assert_eq!(&bytes[1 + usize::from(server_id_len)..], &nonce[..]);
        assert_eq!(
            decode(config_id, server_id_len, bytes),
            Some(&server_id[..])
        );
    }
}

#[test]
fn random_low_bits_are_masked_unless_the_length_is_encoded() {
    let random = config(2, 1, 4, false);
    let cid = encode(&random, &[9], &[1, 2, 3, 4], 0xff).expect("lengths of the config");
    assert_eq!(cid.as_bytes(), [0x5f, 9, 1, 2, 3, 4]);
    let cid = encode(&random, &[9], &[1, 2, 3, 4], 0x20 | 0x0c).expect("lengths of the config");
    assert_eq!(cid.as_bytes()[0], 0x4c);
    let encoded = config(2, 1, 4, true);
    let cid = encode(&encoded, &[9], &[1, 2, 3, 4], 0x1f).expect("lengths of the config");
    assert_eq!(cid.as_bytes()[0], 0x45, "length 5, not the random bits");
}

#[test]
fn refuses_parts_of_the_wrong_length() {
    let config = config(0, 3, 4, true);
    for server_id in [&[1, 2][..], &[1, 2, 3, 4]] {
        assert_eq!(
            encode(&config, server_id, &[0; 4], 0),
            Err(EncodeError::ServerIdLen {
                expected: 3,
                actual: server_id.len()
            })
        );
    }
    for nonce in [&[0; 3][..], &[0; 5], &[]] {
        assert_eq!(
            encode(&config, &[1, 2, 3], nonce, 0),
            Err(EncodeError::NonceLen {
                expected: 4,
                actual: nonce.len()
            })
        );
    }
}

#[test]
fn unroutable_cids() {
    let cid = hex("07c4605e4504cc4f");
    assert_eq!(decode(0, 3, &cid), Some(&cid[1..4]));
    let mut reserved = cid.clone();
    reserved[0] = 0b111 << 5 | 7;
    assert_eq!(decode(0, 3, &reserved), None, "0b111 is never routable");
    assert_eq!(decode(7, 3, &reserved), None, "not even when configured");
    for other in 1..=6 {
        assert_eq!(decode(other, 3, &cid), None, "config {other} is not 0");
    }
    assert_eq!(decode(0, 3, &cid[..3]), None, "too short for the server id");
    assert_eq!(
        decode(0, 3, &cid[..4]),
        Some(&cid[1..4]),
        "just long enough"
    );
    assert_eq!(decode(0, 3, &[]), None, "empty");
    assert_eq!(decode(0, 0, &cid), None, "no valid config has server id 0");
    assert_eq!(decode(0, 16, &[0; 20]), None, "nor server id 16");
}

/// Every input length a QUIC v1 CID can have, every first octet, every
/// decoder configuration: no panic, and routable exactly when the draft
/// says so.
#[test]
fn decode_never_panics() {
    for len in 0..=MAX_CID_LEN {
        for first in 0..=u8::MAX {
            let mut cid = vec![0xa5; len];
            if let Some(octet) = cid.first_mut() {
                *octet = first;
            }
            for config_id in (0..=8).chain([u8::MAX]) {
                for server_id_len in (0..=20).chain([u8::MAX]) {
                    let routable = len > usize::from(server_id_len)
                        && config_id < 7
                        && (1..=15).contains(&server_id_len)
                        && first >> 5 == config_id;
                    let decoded = decode(config_id, server_id_len, &cid);
                    assert_eq!(
                        decoded.is_some(),
                        routable,
                        "{cid:02x?} {config_id} {server_id_len}"
                    );
                    if let Some(server_id) = decoded {
                        assert_eq!(server_id, &cid[1..=usize::from(server_id_len)]);
                    }
                }
            }
        }
    }
}

#[test]
fn debug_is_hex() {
    let cid = encode(&config(0, 3, 4, true), &hex("c4605e"), &hex("4504cc4f"), 0)
        .expect("the vector's lengths");
    assert_eq!(format!("{cid:?}"), "ConnectionId(07c4605e4504cc4f)");
    assert_eq!(cid.as_ref(), cid.as_bytes());
}

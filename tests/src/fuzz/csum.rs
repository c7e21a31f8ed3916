//! The Internet checksum (RFC 1071) and the IPv4/IPv6 pseudo-header sums,
//! written here for the fuzzer alone: the generator uses them to build
//! valid packets and the oracle to verify the balancer's outputs. Nothing
//! is shared with the datapath's checksum code.

use std::net::IpAddr;

/// One's-complement sum of `data` as big-endian 16-bit words (an odd last
/// byte is padded with zero), added to `seed`, not folded.
pub fn sum(data: &[u8], seed: u64) -> u64 {
    let mut acc = seed;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a sum to 16 bits and complements it: the checksum to store.
pub fn finish(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The checksum of `data` (with its checksum field zeroed by the caller).
pub fn checksum(data: &[u8], seed: u64) -> u16 {
    finish(sum(data, seed))
}

/// Whether `data`, checksum field included, sums to all ones.
pub fn verifies(data: &[u8], seed: u64) -> bool {
    finish(sum(data, seed)) == 0
}

/// The pseudo-header sum of TCP, UDP or ICMPv6 over IPv4 or IPv6
/// (RFC 793, RFC 8200 §8.1): addresses, upper-layer length, protocol.
pub fn pseudo(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> u64 {
    let addrs = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum(&s.octets(), sum(&d.octets(), 0)),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum(&s.octets(), sum(&d.octets(), 0)),
        _ => panic!("pseudo-header of mixed families"),
    };
    addrs + (len as u64 >> 16) + (len as u64 & 0xffff) + u64::from(proto)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (folded).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(finish(sum(&data, 0)), !0xddf2);
    }

    #[test]
    fn a_stored_checksum_verifies() {
        let mut h = [
            0x45, 0, 0, 0x54, 0, 0, 0x40, 0, 0x40, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(&h, 0);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert!(verifies(&h, 0));
        h[15] ^= 1;
        assert!(!verifies(&h, 0));
    }
}

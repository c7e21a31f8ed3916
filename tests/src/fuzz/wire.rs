//! Byte-level packet building for the generators: Ethernet with any number
//! of tags, IPv4 with options, IPv6 with an extension-header chain, TCP,
//! UDP, ICMP and ICMPv6, checksums by [`super::csum`]. Every field is the
//! caller's to set, so the generators can build exactly the frames they
//! aim at, broken ones included. Parsing is the oracle's business, not
//! this module's.

use std::net::IpAddr;

use super::csum;

pub const ETH_IPV4: u16 = 0x0800;
pub const ETH_IPV6: u16 = 0x86dd;
pub const ETH_8021Q: u16 = 0x8100;
pub const ETH_8021AD: u16 = 0x88a8;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const ICMPV6: u8 = 58;

pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// The client's MAC and the balancer's (the frames' source and destination).
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// An Ethernet header: MACs and the tags (TPID, TCI) before the ethertype.
#[derive(Clone, Debug)]
pub struct Eth {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub tags: Vec<(u16, u16)>,
}

impl Default for Eth {
    fn default() -> Self {
        Eth {
            dst: LB_MAC,
            src: CLIENT_MAC,
            tags: Vec::new(),
        }
    }
}

impl Eth {
    /// Length of the header with its tags.
    pub fn header_len(&self) -> usize {
        14 + 4 * self.tags.len()
    }

    /// The frame: this header, `ethertype`, then `payload`.
    pub fn frame(&self, ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(self.header_len() + payload.len());
        f.extend_from_slice(&self.dst);
        f.extend_from_slice(&self.src);
        for (tpid, tci) in &self.tags {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }
}

/// IPv4 header fields; the total length and checksum are computed.
#[derive(Clone, Debug)]
pub struct V4 {
    pub tos: u8,
    pub id: u16,
    /// Flags and fragment offset (DF 0x4000, MF 0x2000, offset in 8-byte units).
    pub frag: u16,
    pub ttl: u8,
    pub proto: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// Options, a multiple of 4 bytes, at most 40.
    pub options: Vec<u8>,
}

pub const DF: u16 = 0x4000;
pub const MF: u16 = 0x2000;

impl V4 {
    pub fn new(src: [u8; 4], dst: [u8; 4], proto: u8) -> V4 {
        V4 {
            tos: 0,
            id: 0x1234,
            frag: DF,
            ttl: 64,
            proto,
            src,
            dst,
            options: Vec::new(),
        }
    }

    /// The IP packet: this header (checksummed) and `payload`.
    pub fn packet(&self, payload: &[u8]) -> Vec<u8> {
        let hlen = 20 + self.options.len();
        debug_assert!(hlen.is_multiple_of(4) && hlen <= 60);
        let mut p = Vec::with_capacity(hlen + payload.len());
        p.push(0x40 | (hlen / 4) as u8);
        p.push(self.tos);
        p.extend_from_slice(&((hlen + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&self.id.to_be_bytes());
        p.extend_from_slice(&self.frag.to_be_bytes());
        p.push(self.ttl);
        p.push(self.proto);
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&self.src);
        p.extend_from_slice(&self.dst);
        p.extend_from_slice(&self.options);
        fix_ipv4_checksum(&mut p);
        p.extend_from_slice(payload);
        p
    }
}

/// Recomputes the header checksum of the IPv4 packet at the start of `p`
/// (whose IHL must fit in `p`).
pub fn fix_ipv4_checksum(p: &mut [u8]) {
    let hlen = usize::from(p[0] & 0x0f) * 4;
    if hlen < 20 || hlen > p.len() {
        return;
    }
    p[10..12].copy_from_slice(&[0, 0]);
    let c = csum::checksum(&p[..hlen], 0);
    p[10..12].copy_from_slice(&c.to_be_bytes());
}

/// IPv6 header fields; the payload length is computed.
#[derive(Clone, Debug)]
pub struct V6 {
    pub tclass: u8,
    pub flow: u32,
    pub hop: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

impl V6 {
    pub fn new(src: [u8; 16], dst: [u8; 16]) -> V6 {
        V6 {
            tclass: 0,
            flow: 0,
            hop: 64,
            src,
            dst,
        }
    }

    /// The IP packet: this header with next header `next`, then `payload`
    /// (extension headers included).
    pub fn packet(&self, next: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(40 + payload.len());
        let word = 6 << 28 | u32::from(self.tclass) << 20 | (self.flow & 0xf_ffff);
        p.extend_from_slice(&word.to_be_bytes());
        p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        p.push(next);
        p.push(self.hop);
        p.extend_from_slice(&self.src);
        p.extend_from_slice(&self.dst);
        p.extend_from_slice(payload);
        p
    }
}

/// A TCP segment (20-byte header plus `options`, checksummed for the
/// pseudo-header of `src` → `dst`).
pub fn tcp(
    (src, dst): (IpAddr, IpAddr),
    (sport, dport): (u16, u16),
    flags: u8,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let hlen = 20 + options.len();
    let mut s = Vec::with_capacity(hlen + payload.len());
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&0x0102_0304u32.to_be_bytes());
    s.extend_from_slice(&0x0a0b_0c0du32.to_be_bytes());
    s.push(((hlen / 4) as u8) << 4);
    s.push(flags);
    s.extend_from_slice(&65535u16.to_be_bytes());
    s.extend_from_slice(&[0, 0, 0, 0]);
    s.extend_from_slice(options);
    s.extend_from_slice(payload);
    let c = csum::checksum(&s, csum::pseudo(src, dst, TCP, s.len()));
    s[16..18].copy_from_slice(&c.to_be_bytes());
    s
}

/// A UDP datagram, checksummed.
pub fn udp((src, dst): (IpAddr, IpAddr), (sport, dport): (u16, u16), payload: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(8 + payload.len());
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    s.extend_from_slice(&[0, 0]);
    s.extend_from_slice(payload);
    let c = csum::checksum(&s, csum::pseudo(src, dst, UDP, s.len()));
    let c = if c == 0 { 0xffff } else { c };
    s[6..8].copy_from_slice(&c.to_be_bytes());
    s
}

/// An ICMP (IPv4) message, checksummed.
pub fn icmp4(kind: u8, code: u8, rest: [u8; 4], data: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(data);
    let c = csum::checksum(&m, 0);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An ICMPv6 message from `src` to `dst`, checksummed.
pub fn icmp6(
    (src, dst): (IpAddr, IpAddr),
    kind: u8,
    code: u8,
    rest: [u8; 4],
    data: &[u8],
) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(data);
    let c = csum::checksum(&m, csum::pseudo(src, dst, ICMPV6, m.len()));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An IPv6 extension header of type `kind` (hop-by-hop 0, routing 43,
/// destination options 60: 8-byte units; AH 51: 4-byte units) of exactly
/// `len` bytes, whose next header is `next`; the bytes after the first two
/// come from `fill(offset)`. `len` must be encodable for `kind`.
pub fn ext_header(kind: u8, next: u8, len: usize, fill: &mut dyn FnMut(usize) -> u8) -> Vec<u8> {
    let enc = if kind == 51 { len / 4 - 2 } else { len / 8 - 1 };
    let mut h = vec![next, enc as u8];
    h.extend((2..len).map(fill));
    h
}

/// An IPv6 fragment header (RFC 8200 §4.5: offset in 8-byte units in the
/// top 13 bits of bytes 2–3, M in the lowest bit).
pub fn frag_header(next: u8, offset: u16, more: bool, id: u32) -> [u8; 8] {
    let word = (offset & 0x1fff) << 3 | u16::from(more);
    let w = word.to_be_bytes();
    let i = id.to_be_bytes();
    [next, 0, w[0], w[1], i[0], i[1], i[2], i[3]]
}

/// Octets of an address (4 or 16).
pub fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

pub fn v4(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => panic!("{a} is not IPv4"),
    }
}

pub fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(_) => panic!("{a} is not IPv6"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_header_follows_rfc8200() {
        // Offset 3 (24 bytes), M set: 0x0019.
        assert_eq!(frag_header(17, 3, true, 9)[2..4], [0x00, 0x19]);
        assert_eq!(frag_header(17, 0, false, 9)[2..4], [0, 0]);
    }

    #[test]
    fn ipv4_packet_is_checksummed() {
        let p = V4::new([10, 0, 0, 1], [10, 0, 0, 2], UDP).packet(&[1, 2, 3]);
        assert_eq!(p.len(), 23);
        assert!(csum::verifies(&p[..20], 0));
    }
}

//! Frame builders and checksum helpers used by more than one suite: the
//! client's TCP, UDP and ICMP packets (IPv4 and IPv6), ARP, a VLAN-tagged
//! TCP segment, IPv6 extension headers, and the Internet checksum computed
//! here, independently of the programs. Built with etherparse; each suite
//! says which MAC addresses its frames carry and which client sends their
//! packets ([`Link`]).
//!
//! Builders that only one suite needs live in that suite.

use etherparse::{EtherType, Ethernet2Header, PacketBuilder, VlanId};

use super::{v4, v6};

/// Where a suite's frames travel: their Ethernet source and destination,
/// and the client their IP packets come from.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub client_v4: [u8; 4],
    pub client_v6: [u8; 16],
}

/// A TCP segment from `link`'s client to `dst:dport`: a SYN, or an ACK carrying
/// `payload`.
pub fn tcp4(link: Link, dst: &str, dport: u16, sport: u16, syn: bool, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv4(link.client_v4, v4(dst), 64)
        .tcp(sport, dport, 1000, 65535);
    let b = if syn { b.syn() } else { b.ack(2000) };
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("build packet");
    out
}

pub fn udp4(link: Link, dst: &str, dport: u16, sport: u16, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv4(link.client_v4, v4(dst), 64)
        .udp(sport, dport);
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("build packet");
    out
}

pub fn tcp6(link: Link, dst: &str, dport: u16, sport: u16, syn: bool, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv6(link.client_v6, v6(dst), 64)
        .tcp(sport, dport, 1000, 65535);
    let b = if syn { b.syn() } else { b.ack(2000) };
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("build packet");
    out
}

pub fn udp6(link: Link, dst: &str, dport: u16, sport: u16, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv6(link.client_v6, v6(dst), 64)
        .udp(sport, dport);
    let mut out = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut out, payload).expect("build packet");
    out
}

/// An ACK with 4 bytes of data, tagged with VLAN `vlan` (802.1Q).
pub fn tcp4_vlan(link: Link, dst: &str, dport: u16, sport: u16, vlan: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .single_vlan(VlanId::try_new(vlan).expect("vlan id"))
        .ipv4(link.client_v4, v4(dst), 64)
        .tcp(sport, dport, 1000, 65535)
        .ack(1);
    let mut out = vec![];
    b.write(&mut out, b"vlan").expect("build packet");
    out
}

/// An echo request from `link`'s client to `dst`.
pub fn icmp4(link: Link, dst: &str) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv4(link.client_v4, v4(dst), 64)
        .icmpv4_echo_request(1, 1);
    let mut out = vec![];
    b.write(&mut out, b"ping").expect("build packet");
    out
}

pub fn icmp6(link: Link, dst: &str) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(link.src_mac, link.dst_mac)
        .ipv6(link.client_v6, v6(dst), 64)
        .icmpv6_echo_request(1, 1);
    let mut out = vec![];
    b.write(&mut out, b"ping").expect("build packet");
    out
}

/// A broadcast ARP frame from `src` (28 zero bytes of ARP).
pub fn arp(src: [u8; 6]) -> Vec<u8> {
    let mut out = vec![];
    Ethernet2Header {
        source: src,
        destination: [0xff; 6],
        ether_type: EtherType::ARP,
    }
    .write(&mut out)
    .expect("eth");
    out.extend_from_slice(&[0u8; 28]);
    out
}

/// Inserts an IPv6 extension header (`ext_proto`, bytes `ext`) after the
/// fixed header of an untagged IPv6 frame.
pub fn with_ipv6_ext(mut frame: Vec<u8>, ext_proto: u8, ext: &[u8]) -> Vec<u8> {
    let plen = u16::from_be_bytes([frame[18], frame[19]]) + ext.len() as u16;
    frame[18..20].copy_from_slice(&plen.to_be_bytes());
    frame[20] = ext_proto;
    frame.splice(54..54, ext.iter().copied());
    frame
}

/// The length of a frame's Ethernet header: 18 with one VLAN tag (802.1Q
/// or 802.1ad), else 14.
pub fn l2_len(frame: &[u8]) -> usize {
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x8100 | 0x88a8 => 18,
        _ => 14,
    }
}

/// The Internet checksum (RFC 1071) of `data` plus `seed` (a partial sum,
/// e.g. of a pseudo-header), computed independently of the programs.
pub fn inet_checksum(data: &[u8], seed: u32) -> u16 {
    let mut sum = seed as u64;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += w as u64;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recomputes the IPv4 header checksum of the header at `off` (after a
/// fixture edit, so that only the edited field is wrong).
pub fn fix_ipv4_checksum(frame: &mut [u8], off: usize) {
    let ihl = (usize::from(frame[off] & 0x0f) * 4).max(20);
    frame[off + 10..off + 12].fill(0);
    let c = inet_checksum(&frame[off..off + ihl], 0);
    frame[off + 10..off + 12].copy_from_slice(&c.to_be_bytes());
}

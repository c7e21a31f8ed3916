//! Packet headers as the XDP programs read and write them.
//!
//! Fields keep their RFC names and natural alignment so that a field access
//! is one load or store. Multi-byte fields hold network-order bytes as a
//! little-endian load gives them: compare against [`be16`]/[`be32`] of a
//! host-order constant, never swap in the fast path.

/// A host-order constant as it reads from the packet.
#[inline(always)]
pub const fn be16(x: u16) -> u16 {
    x.to_be()
}

#[inline(always)]
pub const fn be32(x: u32) -> u32 {
    x.to_be()
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub h_dest: [u16; 3],
    pub h_source: [u16; 3],
    pub h_proto: u16,
}

/// The 4 bytes after an 802.1Q/802.1ad TPID.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VlanHdr {
    pub tci: u16,
    pub encapsulated_proto: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    pub version_ihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag_off: u16,
    pub ttl: u8,
    pub protocol: u8,
    pub check: u16,
    pub saddr: u32,
    pub daddr: u32,
}

/// `frag_off` bits, host order.
pub const IP_DF: u16 = 0x4000;
pub const IP_MF: u16 = 0x2000;
pub const IP_OFFSET: u16 = 0x1fff;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6Hdr {
    /// Version (4 bits), traffic class (8), flow label (20).
    pub vtc_flow: u32,
    pub payload_len: u16,
    pub nexthdr: u8,
    pub hop_limit: u8,
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct TcpHdr {
    pub source: u16,
    pub dest: u16,
    pub seq: u32,
    pub ack_seq: u32,
    pub doff_res: u8,
    pub flags: u8,
    pub window: u16,
    pub check: u16,
    pub urg_ptr: u16,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub source: u16,
    pub dest: u16,
    pub len: u16,
    pub check: u16,
}

/// RFC 2784 GRE without optional fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GreHdr {
    pub flags_version: u16,
    pub protocol: u16,
}

/// The GUE header of variant 0 (draft-ietf-intarea-gue): version (2 bits,
/// 0), C (1 bit: control message), `hlen` (5 bits: 32-bit words of
/// extension fields and private data after this header), the inner
/// protocol (4 or 41) and the flags (no extension fields: 0).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GueHdr {
    pub ver_c_hlen: u8,
    pub proto_ctype: u8,
    pub flags: u16,
}

/// lb's private data in a GUE variant 0 header (second chance): its type
/// (`SC_TYPE`, network order), the index of the next alternate to try and
/// the number of alternates, whose addresses follow ([`AltAddr4`] or
/// [`AltAddr6`], the outer header's family).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ScHdr {
    pub kind: u16,
    pub next: u8,
    pub count: u8,
}

/// One IPv4 alternate in lb's GUE private data.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AltAddr4 {
    pub addr: u32,
}

/// One IPv6 alternate in lb's GUE private data.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AltAddr6 {
    pub addr: [u32; 4],
}

/// The first 8 bytes of every ICMP and ICMPv6 message. `rest` is the
/// identifier and sequence of an echo, the next-hop MTU of "fragmentation
/// needed" (low half) or the MTU of "packet too big" (all of it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IcmpHdr {
    pub kind: u8,
    pub code: u8,
    pub check: u16,
    pub rest: u32,
}

/// ICMP types and codes the balancer reads or writes.
pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_FRAG_NEEDED: u8 = 4;
pub const ICMP_ECHO: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMPV6_DEST_UNREACH: u8 = 1;
pub const ICMPV6_PKT_TOOBIG: u8 = 2;
pub const ICMPV6_TIME_EXCEED: u8 = 3;
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
pub const ICMPV6_ECHO_REPLY: u8 = 129;
/// The IPv6 minimum link MTU (RFC 8200).
pub const IPV6_MIN_MTU: u32 = 1280;

/// The mandatory section of a BFD control packet (RFC 5880 §4.1): version
/// (3 bits) and diagnostic (5), state (2) and the P F C A D M flags,
/// Detect Mult, Length, the discriminators and the three intervals
/// (microseconds). The u32 fields hold network-order bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BfdHdr {
    pub vers_diag: u8,
    pub sta_flags: u8,
    pub detect_mult: u8,
    pub length: u8,
    pub my_disc: u32,
    pub your_disc: u32,
    pub desired_min_tx: u32,
    pub required_min_rx: u32,
    pub required_min_echo_rx: u32,
}

//! Golden fixtures: whole frames in and out, every byte written out here
//! (addresses, outer headers, checksums, the GUE source port and IPv6 flow
//! label that come from the flow's connection-table hash), worked out from
//! the RFC layouts and the hashes' definitions in `lb_common::flow` (by a
//! separate implementation of them), not produced by running
//! the program. Each VIP has one backend, so the expected tunnel
//! destination does not depend on the Maglev table; the hash-derived
//! fields pin the hash itself (IPv6's under the rig's fixed key,
//! `TEST_CT_KEY`: each box's own is random). A change in any byte the
//! balancer writes fails here.
//!
//! Needs root and a kernel that runs XDP test runs (≥ 5.15). Without them
//! every test fails with a message saying so; none is skipped.

mod common;

use lb::config::{Encap, MalformedPolicy};
use lb_common::Counter;

use common::{
    XDP_TX,
    xdp::{Rig, settings},
};

struct Golden {
    name: &'static str,
    /// The VIP the frame is for (one backend: see [`VIPS`]).
    vip: &'static str,
    /// Hex bytes, a header per line.
    input: &'static [&'static str],
    /// Bytes appended to `input`: `(value, count)`, for large payloads.
    filler: Option<(u8, usize)>,
    output: &'static [&'static str],
    outcome: Counter,
}

fn bytes(lines: &[&str]) -> Vec<u8> {
    lines
        .iter()
        .flat_map(|l| l.split_whitespace())
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

/// Each VIP's one backend (an index of [`BACKENDS`]) and encapsulation.
const VIPS: [(&str, usize, Encap); 8] = [
    ("10.0.0.10:80/tcp", 0, Encap::Ipip),
    ("10.0.0.30:80/tcp", 1, Encap::Gre),
    ("10.0.0.80:80/tcp", 2, Encap::Gue),
    ("[2001:db8::10]:80/tcp", 3, Encap::Ipip),
    ("[2001:db8::30]:443/tcp", 4, Encap::Gre),
    ("[2001:db8::80]:53/udp", 5, Encap::Gue),
    ("10.0.0.20:80/tcp", 3, Encap::Ipip),
    ("[2001:db8::20]:80/tcp", 0, Encap::Ipip),
];

const GOLDEN: &[Golden] = &[
    Golden {
        name: "tcp syn, ip-in-ip (4in4)",
        vip: "10.0.0.10:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet: balancer <- client, IPv4
            "45 00 00 28 12 34 40 00 40 06 5c 8b c0 00 02 07", // IPv4 192.0.2.7 -> 10.0.0.10, TCP
            "0a 00 00 0a",
            "9c 40 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40000 -> 80, SYN
            "43 59 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 08 00", // Ethernet: gateway <- balancer, IPv4
            "45 00 00 3c 00 00 40 00 40 04 25 bd 0a ff 00 01", // outer IPv4 10.255.0.1 -> 10.1.0.1, protocol 4, DF, TTL 64
            "0a 01 00 01",
            "45 00 00 28 12 34 40 00 40 06 5c 8b c0 00 02 07", // the client's packet, untouched
            "0a 00 00 0a 9c 40 00 50 00 00 03 e8 00 00 00 00",
            "50 02 ff ff 43 59 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "tcp ack with data and DSCP, gre over ipv4",
        vip: "10.0.0.30:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 28 00 2d 00 01 40 00 40 06 6e 7d c0 00 02 07", // IPv4, TOS 0x28
            "0a 00 00 1e",
            "9c 41 00 50 00 00 03 e8 00 00 00 07 50 10 ff ff", // TCP 40001 -> 80, ACK, "hello"
            "ff 57 00 00 68 65 6c 6c 6f",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 08 00", // Ethernet: gateway <- balancer
            "45 28 00 45 00 00 40 00 40 2f 25 60 0a ff 00 01", // outer IPv4 -> 10.1.0.2, TOS 0x28 copied, protocol 47
            "0a 01 00 02",
            "00 00 08 00", // GRE: no flags, version 0, protocol 0x0800
            "45 28 00 2d 00 01 40 00 40 06 6e 7d c0 00 02 07", // inner
            "0a 00 00 1e 9c 41 00 50 00 00 03 e8 00 00 00 07",
            "50 10 ff ff ff 57 00 00 68 65 6c 6c 6f",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "tcp syn, gue over ipv4",
        vip: "10.0.0.80:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 00 00 28 00 02 40 00 40 06 6e 77 c0 00 02 07", // IPv4
            "0a 00 00 50",
            "9c 42 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40002 -> 80, SYN
            "43 11 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 08 00", // Ethernet
            "45 00 00 44 00 00 40 00 40 11 25 a6 0a ff 00 01", // outer IPv4 -> 10.1.0.3, protocol 17
            "0a 01 00 03",
            "c6 d6 1e 61 00 30 00 00", // UDP 0xc6d6 (0xc000 | flow hash bits 32-45) -> 7777, length, checksum 0
            "45 00 00 28 00 02 40 00 40 06 6e 77 c0 00 02 07", // inner
            "0a 00 00 50 9c 42 00 50 00 00 03 e8 00 00 00 00",
            "50 02 ff ff 43 11 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "ipv6 tcp syn, ip6ip6",
        vip: "[2001:db8::10]:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet: IPv6
            "60 01 23 45 00 14 06 40 20 01 0d b8 00 0c 00 00", // IPv6 2001:db8:c::7 -> 2001:db8::10, flow label 0x12345
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 10",
            "9c 43 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40003 -> 80, SYN
            "b3 d2 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 86 dd", // Ethernet: IPv6
            "60 0c 6a 87 00 3c 29 40 fd 00 00 ff 00 00 00 00", // outer IPv6 fd00:ff::1 -> fd00:1::1, flow label 0xc6a87 (connection-table hash under TEST_CT_KEY), next header 41, hop limit 64
            "00 00 00 00 00 00 00 01 fd 00 00 01 00 00 00 00",
            "00 00 00 00 00 00 00 01",
            "60 01 23 45 00 14 06 40 20 01 0d b8 00 0c 00 00", // inner
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 10 9c 43 00 50 00 00 03 e8",
            "00 00 00 00 50 02 ff ff b3 d2 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "ipv6 tcp syn, gre over ipv6",
        vip: "[2001:db8::30]:443/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet
            "60 00 00 00 00 14 06 40 20 01 0d b8 00 0c 00 00", // IPv6
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 30",
            "9c 44 01 bb 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40004 -> 443, SYN
            "b2 46 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 86 dd", // Ethernet
            "60 01 a1 07 00 40 2f 40 fd 00 00 ff 00 00 00 00", // outer IPv6 -> fd00:1::2, flow label 0x1a107, next header 47
            "00 00 00 00 00 00 00 01 fd 00 00 01 00 00 00 00",
            "00 00 00 00 00 00 00 02",
            "00 00 86 dd",                                     // GRE: protocol 0x86dd
            "60 00 00 00 00 14 06 40 20 01 0d b8 00 0c 00 00", // inner
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 30 9c 44 01 bb 00 00 03 e8",
            "00 00 00 00 50 02 ff ff b2 46 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "ipv6 udp, gue over ipv6",
        vip: "[2001:db8::80]:53/udp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet
            "60 00 00 00 00 0d 11 40 20 01 0d b8 00 0c 00 00", // IPv6
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 80",
            "14 e9 00 35 00 0d 3e c9 71 75 65 72 79", // UDP 5353 -> 53, "query"
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 86 dd", // Ethernet
            "60 01 ad 96 00 3d 11 40 fd 00 00 ff 00 00 00 00", // outer IPv6 -> fd00:1::3, flow label 0x1ad96, next header 17
            "00 00 00 00 00 00 00 01 fd 00 00 01 00 00 00 00",
            "00 00 00 00 00 00 00 03",
            "e9 57 1e 61 00 3d 00 00", // UDP 0xe957 (0xc000 | hash bits 32-45) -> 7777, length, checksum 0
            "60 00 00 00 00 0d 11 40 20 01 0d b8 00 0c 00 00", // inner
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 80 14 e9 00 35 00 0d 3e c9",
            "71 75 65 72 79",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "ipv4 tcp syn to an ipv6 backend (4in6)",
        vip: "10.0.0.20:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 00 00 28 00 05 40 00 40 06 6e b0 c0 00 02 07", // IPv4
            "0a 00 00 14",
            "9c 45 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40005 -> 80, SYN
            "43 4a 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 86 dd", // Ethernet: IPv6 now
            "60 0c b2 1d 00 28 04 40 fd 00 00 ff 00 00 00 00", // outer IPv6 -> fd00:1::1, next header 4
            "00 00 00 00 00 00 00 01 fd 00 00 01 00 00 00 00",
            "00 00 00 00 00 00 00 01",
            "45 00 00 28 00 05 40 00 40 06 6e b0 c0 00 02 07", // inner IPv4
            "0a 00 00 14 9c 45 00 50 00 00 03 e8 00 00 00 00",
            "50 02 ff ff 43 4a 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "ipv6 tcp syn to an ipv4 backend (6in4)",
        vip: "[2001:db8::20]:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet
            "60 00 00 00 00 14 06 40 20 01 0d b8 00 0c 00 00", // IPv6
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 20",
            "9c 46 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40006 -> 80, SYN
            "b3 bf 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 08 00", // Ethernet: IPv4 now
            "45 00 00 50 00 00 40 00 40 29 25 84 0a ff 00 01", // outer IPv4 -> 10.1.0.1, protocol 41
            "0a 01 00 01",
            "60 00 00 00 00 14 06 40 20 01 0d b8 00 0c 00 00", // inner IPv6
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 20 9c 46 00 50 00 00 03 e8",
            "00 00 00 00 50 02 ff ff b3 bf 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "vlan 42, tcp syn, ip-in-ip keeps the tag",
        vip: "10.0.0.10:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 81 00 00 2a", // Ethernet, 802.1Q VLAN 42, IPv4
            "08 00",
            "45 00 00 28 00 07 40 00 40 06 6e b8 c0 00 02 07", // IPv4
            "0a 00 00 0a",
            "9c 47 00 50 00 00 03 e8 00 00 00 00 50 02 ff ff", // TCP 40007 -> 80, SYN
            "43 52 00 00",
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 03 02 00 00 00 00 02 81 00 00 2a", // Ethernet: gateway <- balancer, VLAN 42 kept
            "08 00",
            "45 00 00 3c 00 00 40 00 40 04 25 bd 0a ff 00 01", // outer IPv4 -> 10.1.0.1
            "0a 01 00 01",
            "45 00 00 28 00 07 40 00 40 06 6e b8 c0 00 02 07", // inner
            "0a 00 00 0a 9c 47 00 50 00 00 03 e8 00 00 00 00",
            "50 02 ff ff 43 52 00 00",
        ],
        outcome: Counter::FwdMaglev,
    },
    Golden {
        name: "icmp echo request to a vip address is answered",
        vip: "10.0.0.10:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 00 00 20 00 09 00 00 39 01 b5 c3 c0 00 02 07", // IPv4 192.0.2.7 -> 10.0.0.10, TTL 57, ICMP
            "0a 00 00 0a",
            "08 00 d6 eb 42 42 00 01 70 69 6e 67", // echo request, id 0x4242, seq 1, "ping"
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 01 02 00 00 00 00 02 08 00", // Ethernet: back to the client
            "45 00 00 20 00 09 00 00 40 01 ae c3 0a 00 00 0a", // IPv4 10.0.0.10 -> 192.0.2.7, TTL 64
            "c0 00 02 07",
            "00 00 de eb 42 42 00 01 70 69 6e 67", // echo reply
        ],
        outcome: Counter::ReplyIcmpEcho,
    },
    Golden {
        name: "icmpv6 echo request to a vip address is answered",
        vip: "[2001:db8::10]:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet
            "60 00 00 00 00 0d 3a 32 20 01 0d b8 00 0c 00 00", // IPv6 -> 2001:db8::10, hop limit 50, ICMPv6
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 10",
            "80 00 cc 0c 43 43 00 02 70 69 6e 67 36", // echo request, id 0x4343, seq 2, "ping6"
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 01 02 00 00 00 00 02 86 dd", // Ethernet: back to the client
            "60 00 00 00 00 0d 3a 40 20 01 0d b8 00 00 00 00", // IPv6 2001:db8::10 -> 2001:db8:c::7, hop limit 64
            "00 00 00 00 00 00 00 10 20 01 0d b8 00 0c 00 00",
            "00 00 00 00 00 00 00 07",
            "81 00 cb 0c 43 43 00 02 70 69 6e 67 36", // echo reply
        ],
        outcome: Counter::ReplyIcmpEcho,
    },
    Golden {
        name: "echo request of an all-zero message: reply checksum 0xffff",
        vip: "10.0.0.10:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 00 00 1c 12 34 40 00 40 01 f3 b1 c6 33 64 be", // IPv4 198.51.100.190 -> 10.0.0.10, ICMP
            "0a 00 00 0a",
            "08 00 f7 ff 00 00 00 00", // echo request, id 0, seq 0, no data
        ],
        filler: None,
        output: &[
            "02 00 00 00 00 01 02 00 00 00 00 02 08 00", // Ethernet: back to the client
            "45 00 00 1c 12 34 40 00 40 01 f3 b1 0a 00 00 0a", // IPv4 10.0.0.10 -> 198.51.100.190
            "c6 33 64 be",
            "00 00 ff ff 00 00 00 00", // echo reply, checksum 0xffff (0x0000 would not verify)
        ],
        outcome: Counter::ReplyIcmpEcho,
    },
    Golden {
        name: "1500-byte ipv4 with DF, mtu 1500: fragmentation needed, mtu 1480",
        vip: "10.0.0.10:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 08 00", // Ethernet
            "45 00 05 dc 00 55 40 00 40 06 68 b6 c0 00 02 07", // IPv4, 1500 bytes, DF
            "0a 00 00 0a",
            "9c 48 00 50 00 00 03 e8 00 00 00 01 50 10 ff ff", // TCP 40008 -> 80, ACK
            "8d de 00 00",
        ],
        filler: Some((0x61, 1460)),
        output: &[
            "02 00 00 00 00 01 02 00 00 00 00 02 08 00", // Ethernet: back to the client
            "45 00 00 60 00 00 00 00 40 01 ae 8c 0a 00 00 0a", // IPv4 10.0.0.10 -> 192.0.2.7, 96 bytes, TTL 64, ICMP
            "c0 00 02 07",
            "03 04 25 70 00 00 05 c8", // type 3 code 4, next-hop MTU 1480
            "45 00 05 dc 00 55 40 00 40 06 68 b6 c0 00 02 07", // the first 68 bytes of the packet
            "0a 00 00 0a 9c 48 00 50 00 00 03 e8 00 00 00 01",
            "50 10 ff ff 8d de 00 00 61 61 61 61 61 61 61 61",
            "61 61 61 61 61 61 61 61 61 61 61 61 61 61 61 61",
            "61 61 61 61",
        ],
        outcome: Counter::ReplyFragNeeded,
    },
    Golden {
        name: "1500-byte ipv6, mtu 1500: packet too big, mtu 1460",
        vip: "[2001:db8::10]:80/tcp",
        input: &[
            "02 00 00 00 00 02 02 00 00 00 00 01 86 dd", // Ethernet
            "60 00 00 00 05 b4 06 40 20 01 0d b8 00 0c 00 00", // IPv6, payload 1460
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 10",
            "9c 49 00 50 00 00 03 e8 00 00 00 01 50 10 ff ff", // TCP 40009 -> 80, ACK
            "f9 68 00 00",
        ],
        filler: Some((0x62, 1440)),
        output: &[
            "02 00 00 00 00 01 02 00 00 00 00 02 86 dd", // Ethernet: back to the client
            "60 00 00 00 01 08 3a 40 20 01 0d b8 00 00 00 00", // IPv6 2001:db8::10 -> 2001:db8:c::7, payload 264, ICMPv6, hop limit 64
            "00 00 00 00 00 00 00 10 20 01 0d b8 00 0c 00 00",
            "00 00 00 00 00 00 00 07",
            "02 00 40 45 00 00 05 b4", // packet too big, MTU 1460
            "60 00 00 00 05 b4 06 40 20 01 0d b8 00 0c 00 00", // the first 256 bytes of the packet
            "00 00 00 00 00 00 00 07 20 01 0d b8 00 00 00 00",
            "00 00 00 00 00 00 00 10 9c 49 00 50 00 00 03 e8",
            "00 00 00 01 50 10 ff ff f9 68 00 00 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
            "62 62 62 62 62 62 62 62 62 62 62 62 62 62 62 62",
        ],
        outcome: Counter::ReplyPacketTooBig,
    },
];

/// The first differing byte of two frames, for the failure message.
fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!("byte {i}: got {:#04x}, want {:#04x}", got[i], want[i]),
        None => format!("lengths {} and {}", got.len(), want.len()),
    }
}

#[test]
fn golden_frames_in_and_out() {
    let mut rig = Rig::new(1 << 12);
    for (vip, backend, encap) in VIPS {
        rig.add_vip(vip, encap, true, &[backend]);
    }
    let mut s = settings(MalformedPolicy::Pass);
    s.mtu = 1500;
    rig.r.apply_settings(&s).expect("write config");
    assert!(GOLDEN.len() >= 10);
    for g in GOLDEN {
        assert!(VIPS.iter().any(|(v, _, _)| *v == g.vip), "{}: VIP", g.name);
        let mut input = bytes(g.input);
        if let Some((value, count)) = g.filler {
            input.extend(std::iter::repeat_n(value, count));
        }
        let want = bytes(g.output);
        let (action, out, _) = rig.run_counted(&input, g.outcome);
        assert_eq!(action, XDP_TX, "{}: action", g.name);
        assert!(
            out == want,
            "{}: output differs at {}\n got: {:02x?}\nwant: {:02x?}",
            g.name,
            first_difference(&out, &want),
            out,
            want
        );
    }
}

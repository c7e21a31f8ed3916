//! Tracing flows (`lbctl trace`): the filter `lbd` writes for the
//! datapath, the events the datapath writes into the pinned ring buffer
//! `LB_TRACE_EVENTS`, and their reading by `lbctl`.
//!
//! `lbd` owns the filter and the `CFG_F_TRACE` flag: a trace is a lease,
//! renewed by `lbctl` every few seconds and dropped by `lbd` when it runs
//! out, so a killed `lbctl` never leaves the datapath tracing. `lbctl`
//! reads the ring buffer itself, from its pin, and keeps only the events
//! of its own session.

use std::{net::IpAddr, path::Path};

use aya::maps::{Map, MapData, RingBuf};
use lb_common::{Counter, TraceEvent, TraceFilter, addr_to_words, consts::*, words_to_addr};
use serde::{Deserialize, Serialize};

use crate::config::{Prefix, VipId};

/// The filter for packets to `vip` (any VIP if `None`) from `client`
/// (any client if `None`).
pub fn filter(session: u32, vip: Option<&VipId>, client: Option<&Prefix>) -> TraceFilter {
    let mut f = TraceFilter {
        session,
        ..TraceFilter::default()
    };
    if let Some(v) = vip {
        let (addr, family) = addr_to_words(v.addr);
        f.vip_family = family;
        f.vip_addr = addr;
        f.vip_proto = v.proto.number();
        f.vip_port = v.port.to_be();
    }
    if let Some(c) = client {
        let (net, family) = addr_to_words(c.addr);
        let mask = prefix_mask(c);
        f.client_family = family;
        f.client_mask = mask;
        f.client_net = [0, 1, 2, 3].map(|i| net[i] & mask[i]);
    }
    f
}

/// The words of `prefix`'s mask, as the packet's words read (network
/// order in memory).
fn prefix_mask(prefix: &Prefix) -> [u32; 4] {
    let width: u32 = if prefix.addr.is_ipv4() { 32 } else { 128 };
    let len = u32::from(prefix.len).min(width);
    let mut mask = [0u32; 4];
    for (i, word) in mask.iter_mut().enumerate().take((width / 32) as usize) {
        let bits = len.saturating_sub(32 * i as u32).min(32);
        let host = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        *word = host.to_be();
    }
    mask
}

/// One traced packet, as `lbctl trace` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TraceLine {
    pub client: IpAddr,
    pub client_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
    /// `tcp`, `udp`, `icmp`, ...
    pub protocol: String,
    /// The outcome counter: `fwd_conntrack_hit`, `drop_no_backend`, ...
    pub outcome: String,
    pub backend: Option<IpAddr>,
    /// `connection table`, `maglev slot N` or `-`.
    pub via: String,
    pub encap: Option<String>,
    pub bytes: u32,
}

/// Decodes one event from the ring buffer's bytes (`None`: not an event).
pub fn decode(bytes: &[u8]) -> Option<TraceEvent> {
    if bytes.len() < std::mem::size_of::<TraceEvent>() {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap_or_default());
    let words = |o: usize| [0, 1, 2, 3].map(|i| u32_at(o + 4 * i));
    Some(TraceEvent {
        session: u32_at(0),
        counter: u16::from_ne_bytes([bytes[4], bytes[5]]),
        family: bytes[6],
        proto: bytes[7],
        src: words(8),
        dst: words(24),
        ports: u32_at(40),
        frame_len: u32_at(44),
        hash: u64::from_ne_bytes(bytes[48..56].try_into().unwrap_or_default()),
        backend: words(56),
        backend_family: bytes[72],
        encap: bytes[73],
        _pad: [0; 6],
    })
}

/// The table size of the VIP an event is for: its own among `own` (the
/// VIP of the exact port, else the all-ports one), else `global`.
pub fn table_size_of(e: &TraceEvent, global: u32, own: &[(VipId, u32)]) -> u32 {
    let Some(dst) = words_to_addr(&e.dst, e.family) else {
        return global;
    };
    let port = u16::from_be((e.ports >> 16) as u16);
    let size = |port: u16| {
        own.iter()
            .find(|(id, _)| id.addr == dst && id.port == port && id.proto.number() == e.proto)
            .map(|(_, m)| *m)
    };
    size(port).or_else(|| size(0)).unwrap_or(global)
}

/// The server ID a `fwd_quic_cid` event carries in its hash field: the
/// length in the top octet, the first seven octets below (more: `…`).
fn quic_id(field: u64) -> String {
    let len = (field >> 56) as usize;
    let shown: String = field.to_le_bytes()[..len.min(7)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if len > 7 {
        format!("{shown}…")
    } else {
        shown
    }
}

/// An event in words; `table_size` gives the Maglev slot.
pub fn describe(e: &TraceEvent, table_size: u32) -> Option<TraceLine> {
    let counter = Counter::ALL.iter().find(|c| **c as u16 == e.counter)?;
    let via = match counter {
        Counter::FwdConntrack => "connection table".to_string(),
        Counter::FwdHandshake => "its SYN's backend (handshake)".to_string(),
        Counter::FwdQuicCid => format!("QUIC connection ID, server ID {}", quic_id(e.hash)),
        Counter::FwdSecondChance if table_size > 0 => format!(
            "maglev slot {}, with its alternates (second chance)",
            (e.hash as u32) % table_size
        ),
        _ if e.backend_family != 0 && table_size > 0 => {
            format!("maglev slot {}", (e.hash as u32) % table_size)
        }
        _ => "-".into(),
    };
    // A second-chance packet leaves as GUE variant 0 whatever the VIP's
    // tunnel.
    let encap = (e.backend_family != 0).then(|| {
        match e.encap {
            _ if *counter == Counter::FwdSecondChance => "gue+alternates",
            ENCAP_GRE => "gre",
            ENCAP_GUE => "gue",
            _ => "ipip",
        }
        .to_string()
    });
    Some(TraceLine {
        client: words_to_addr(&e.src, e.family)?,
        client_port: u16::from_be(e.ports as u16),
        dst: words_to_addr(&e.dst, e.family)?,
        dst_port: u16::from_be((e.ports >> 16) as u16),
        protocol: match e.proto {
            PROTO_TCP => "tcp".into(),
            PROTO_UDP => "udp".into(),
            PROTO_ICMP | PROTO_ICMPV6 => "icmp".into(),
            p => format!("proto {p}"),
        },
        outcome: counter.name().to_string(),
        backend: words_to_addr(&e.backend, e.backend_family),
        via,
        encap,
        bytes: e.frame_len,
    })
}

/// Ring records one [`Reader::drain`] takes at most.
pub const DRAIN_MAX: usize = 16_384;

/// The pinned ring buffer, opened for reading.
pub struct Reader {
    ring: RingBuf<MapData>,
}

impl Reader {
    pub fn open(pin: &Path) -> Result<Self, String> {
        let data = MapData::from_pin(pin)
            .map_err(|e| format!("opening the trace ring {}: {e}", pin.display()))?;
        let ring = RingBuf::try_from(Map::RingBuf(data))
            .map_err(|e| format!("{} is not a ring buffer: {e}", pin.display()))?;
        Ok(Self { ring })
    }

    /// The events waiting now of `session`, in order, from at most
    /// [`DRAIN_MAX`] records.
    pub fn drain(&mut self, session: u32) -> Vec<TraceEvent> {
        let mut out = Vec::new();
        // At most DRAIN_MAX records a call: a datapath that writes faster
        // than one reader reads would keep it here for good (memory
        // growing, the lease not renewed); the rest waits in the ring.
        for _ in 0..DRAIN_MAX {
            let Some(item) = self.ring.next() else { break };
            if let Some(e) = decode(&item)
                && e.session == session
            {
                out.push(e);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_filters_are_packet_words() {
        let p: Prefix = "10.10.1.0/24".parse().unwrap();
        let f = filter(7, None, Some(&p));
        // In memory the word is the packet's bytes: 10.10.1.x & 255.255.255.0.
        assert_eq!(f.client_mask[0].to_ne_bytes(), [255, 255, 255, 0]);
        assert_eq!(f.client_net[0].to_ne_bytes(), [10, 10, 1, 0]);
        assert_eq!(f.client_family, FAMILY_V4);
        let p: Prefix = "2001:db8::/40".parse().unwrap();
        let m = prefix_mask(&p);
        assert_eq!(m[0].to_ne_bytes(), [255; 4]);
        assert_eq!(m[1].to_ne_bytes(), [255, 0, 0, 0]);
        assert_eq!(m[2..], [0, 0]);
        // A bare address is that one client.
        let one = Prefix::address_or_prefix("10.10.1.2").unwrap();
        let f = filter(7, None, Some(&one));
        assert_eq!(f.client_mask[0].to_ne_bytes(), [255; 4]);
        assert_eq!(f.client_net[0].to_ne_bytes(), [10, 10, 1, 2]);
        let one = Prefix::address_or_prefix("2001:db8::7").unwrap();
        assert_eq!(prefix_mask(&one), [u32::MAX; 4]);
        assert_eq!(
            Prefix::address_or_prefix("10.10.1.0/24").unwrap(),
            "10.10.1.0/24".parse().unwrap()
        );
        assert!(Prefix::address_or_prefix("client").is_err());
        let vip: VipId = "10.99.0.1:80/tcp".parse().unwrap();
        let f = filter(1, Some(&vip), None);
        assert_eq!(f.vip_port.to_ne_bytes(), [0, 80]);
        assert_eq!(f.vip_proto, PROTO_TCP);
    }

    #[test]
    fn events_decode_from_their_bytes_and_read_in_words() {
        let (src, _) = addr_to_words("192.0.2.7".parse().unwrap());
        let (dst, _) = addr_to_words("10.99.0.1".parse().unwrap());
        let (be, _) = addr_to_words("10.1.0.2".parse().unwrap());
        let e = TraceEvent {
            session: 9,
            counter: Counter::FwdMaglev as u16,
            family: FAMILY_V4,
            proto: PROTO_TCP,
            src,
            dst,
            // Source port 40000 low, destination port 80 high, as read.
            ports: u32::from(40000u16.to_be()) | (u32::from(80u16.to_be()) << 16),
            frame_len: 74,
            hash: 1_000_005,
            backend: be,
            backend_family: FAMILY_V4,
            encap: ENCAP_GRE,
            _pad: [0; 6],
        };
        // The ring carries the struct's bytes as the kernel wrote them.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&e.session.to_ne_bytes());
        bytes.extend_from_slice(&e.counter.to_ne_bytes());
        bytes.extend_from_slice(&[e.family, e.proto]);
        for w in e.src.iter().chain(&e.dst) {
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        bytes.extend_from_slice(&e.ports.to_ne_bytes());
        bytes.extend_from_slice(&e.frame_len.to_ne_bytes());
        bytes.extend_from_slice(&e.hash.to_ne_bytes());
        for w in &e.backend {
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        bytes.extend_from_slice(&[e.backend_family, e.encap, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes.len(), std::mem::size_of::<TraceEvent>());
        assert_eq!(decode(&bytes), Some(e));
        assert_eq!(decode(&bytes[..79]), None);
        let line = describe(&e, 101).unwrap();
        assert_eq!(line.client.to_string(), "192.0.2.7");
        assert_eq!((line.client_port, line.dst_port), (40000, 80));
        assert_eq!(line.outcome, "fwd_maglev_new_flow");
        assert_eq!(line.backend.unwrap().to_string(), "10.1.0.2");
        assert_eq!(line.via, format!("maglev slot {}", 1_000_005 % 101));
        assert_eq!(line.encap.as_deref(), Some("gre"));
        // A second-chance packet left as GUE with a list, not by the
        // VIP's tunnel.
        let sc = TraceEvent {
            counter: Counter::FwdSecondChance as u16,
            ..e
        };
        let line = describe(&sc, 101).unwrap();
        assert_eq!(line.encap.as_deref(), Some("gue+alternates"));
        assert!(line.via.ends_with("(second chance)"), "{}", line.via);
        // A QUIC packet routed by its ID: the server ID, not a slot.
        let by_id = |hash| TraceEvent {
            counter: Counter::FwdQuicCid as u16,
            hash,
            ..e
        };
        let line = describe(&by_id((2 << 56) | 0x0100), 101).unwrap();
        assert_eq!(line.via, "QUIC connection ID, server ID 0001");
        let line = describe(&by_id((9 << 56) | 0x0007_0605_0403_0201), 101).unwrap();
        assert_eq!(line.via, "QUIC connection ID, server ID 01020304050607…");
    }
}

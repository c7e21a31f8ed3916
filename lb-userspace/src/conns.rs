//! `lbctl conns`: the connection table as rows, as `ipvsadm -Lnc` lists
//! IPVS's. The table keeps no tuple: each way of a 64-byte bucket holds a
//! flow's 32-bit tag and its backend's handle, and a stamp (class and
//! tick). So a row names its VIP and backend (from the handle), how long
//! it has been idle and whether it is confirmed (from the stamp), and its
//! bucket and way; its client only when the query names a client prefix.
//! Then every tuple from that prefix to each VIP (every source port) is
//! hashed as the datapath hashes it, and a tuple whose bucket holds its
//! tag under a backend of that VIP is a flow of that client. A tuple
//! that is not one matches only if its 32-bit tag equals one of the six
//! in its bucket: at most 6 × 2^-32 per tuple tried, one false row in
//! about 700 queries of the largest size on a full table.
//!
//! Bounded: a scan reads each bucket once through the read-only mapping
//! and keeps at most `limit` rows; a client query tries at most
//! [`MAX_TUPLES`] tuples (16 addresses to one VIP, or one address to 16
//! VIPs), refused beyond. It runs on `lbd`'s loop, which waits for it:
//! the bound keeps that wait near half a second.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use lb_common::{CtKey, FlowEntry, FlowKey, flow::ct_position};

use crate::{config::Prefix, dataplane::BucketReader};

/// The most tuples a client query hashes: 2^16 took 35 ms in a debug
/// build of `lbd` on the test machine, so about half a second at most.
pub const MAX_TUPLES: u64 = 1 << 20;
/// The most rows a query returns.
pub const MAX_LIMIT: usize = 10_000;

/// Where the datapath puts a flow: the table's bucket mask and seed, and
/// the box's IPv6 key (`DatapathConfig::ct_mask`, `ct_seed`, `LB_CT_KEY`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Placement {
    pub mask: u32,
    pub seed: u64,
    pub key: CtKey,
}

impl Placement {
    /// `flow`'s bucket and tag.
    pub fn of(&self, flow: &FlowKey) -> (u32, u32) {
        let (index, tag) = ct_position(flow.ct_hash(&self.key), self.seed);
        (index & self.mask, tag)
    }
}

/// One connection-table way in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Way {
    pub bucket: u32,
    pub way: u8,
    pub entry: FlowEntry,
    pub stamp: u16,
    /// The client, when a client query found it.
    pub client: Option<SocketAddr>,
}

/// What a query found: the first `limit` ways, and how many matched.
#[derive(Debug, Default)]
pub struct Found {
    pub ways: Vec<Way>,
    pub matched: u64,
}

impl Found {
    fn push(&mut self, way: Way, limit: usize) {
        self.matched += 1;
        if self.ways.len() < limit {
            self.ways.push(way);
        }
    }
}

/// Every way in use whose handle `keep` accepts, in bucket order.
pub fn scan(
    read: BucketReader<'_>,
    buckets: u32,
    keep: &dyn Fn(u32) -> bool,
    limit: usize,
) -> Found {
    let mut found = Found::default();
    for bucket in 0..buckets {
        let b = read(bucket);
        for (way, (entry, stamp)) in b.entries.iter().zip(b.stamps).enumerate() {
            if *entry != FlowEntry::EMPTY && keep(entry.handle()) {
                let way = Way {
                    bucket,
                    way: way as u8,
                    entry: *entry,
                    stamp,
                    client: None,
                };
                found.push(way, limit);
            }
        }
    }
    found
}

/// A VIP a client query looks at: its address, port and protocol, and
/// the handles of its backends it asks about.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub handles: BTreeSet<u32>,
}

/// Source ports tried per client address (0 included: it costs nothing).
const PORTS: u64 = 1 << 16;

/// The tuples a client query of `prefix` to `targets` would hash.
pub fn tuples(prefix: &Prefix, targets: usize) -> u64 {
    let addresses = 1u64
        .checked_shl(prefix.host_bits().into())
        .unwrap_or(u64::MAX);
    addresses
        .saturating_mul(PORTS)
        .saturating_mul(targets as u64)
}

/// The flows from `prefix` (any source port) to `targets` held in the
/// table whose flows are placed `at`. An IPv6 flow not yet moved from
/// the unkeyed position an older version gave it (`CFG_F_CT_V6_LEGACY`,
/// for an hour after an upgrade) is not found.
pub fn clients(
    read: BucketReader<'_>,
    at: &Placement,
    targets: &[Target],
    prefix: &Prefix,
    limit: usize,
) -> Result<Found, String> {
    let targets: Vec<&Target> = targets
        .iter()
        .filter(|t| t.addr.is_ipv4() == prefix.addr.is_ipv4())
        .collect();
    let n = tuples(prefix, targets.len());
    if n > MAX_TUPLES {
        let width = if prefix.addr.is_ipv4() { 32 } else { 128 };
        return Err(format!(
            "--client {prefix} to {} VIP(s) means {n} tuples to hash (every source port); at most {MAX_TUPLES}: give a longer prefix (/{} or longer to one VIP) or a VIP",
            targets.len(),
            width - (MAX_TUPLES / PORTS).ilog2()
        ));
    }
    let mut found = Found::default();
    for target in targets {
        for client in addresses(prefix) {
            for sport in 0..=u16::MAX {
                let flow = FlowKey::new(client, target.addr, target.proto, sport, target.port);
                let (bucket, tag) = at.of(&flow);
                let b = read(bucket);
                for (way, (entry, stamp)) in b.entries.iter().zip(b.stamps).enumerate() {
                    if *entry != FlowEntry::EMPTY
                        && entry.tag() == tag
                        && target.handles.contains(&entry.handle())
                    {
                        let way = Way {
                            bucket,
                            way: way as u8,
                            entry: *entry,
                            stamp,
                            client: Some(SocketAddr::new(client, sport)),
                        };
                        found.push(way, limit);
                    }
                }
            }
        }
    }
    Ok(found)
}

/// Every address of `prefix` (its host bits are few: see [`MAX_TUPLES`]).
fn addresses(prefix: &Prefix) -> impl Iterator<Item = IpAddr> + '_ {
    let count = 1u128 << prefix.host_bits().min(64);
    let base = match prefix.addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    } & !(count - 1);
    (0..count).map(move |i| match prefix.addr {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from((base + i) as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(base + i)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::FlowBucket;

    /// A table of `n` buckets, empty.
    fn table(n: usize) -> Vec<FlowBucket> {
        vec![FlowBucket::default(); n]
    }

    /// Records the flow as the datapath would: in the first free way of
    /// its bucket (computed here from the hash by hand: fmix64 is the
    /// shared part, checked against its own vectors in lb-common).
    fn record(t: &mut [FlowBucket], at: &Placement, flow: &FlowKey, handle: u32, stamp: u16) {
        let (index, tag) = ct_position(flow.ct_hash(&at.key), at.seed);
        let b = &mut t[(index & (t.len() as u32 - 1)) as usize];
        let way = b
            .entries
            .iter()
            .position(|e| *e == FlowEntry::EMPTY)
            .unwrap();
        b.entries[way] = FlowEntry::new(tag, handle);
        b.stamps[way] = stamp;
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A table of 1,024 buckets with a seed and a key of every word set.
    fn placement() -> Placement {
        Placement {
            mask: 1023,
            seed: 0x1234_5678_9abc_def0,
            key: CtKey {
                k: core::array::from_fn(|i| 0x9E37_79B9u32.wrapping_mul(i as u32 + 1)),
                legacy_until: 0,
            },
        }
    }

    #[test]
    fn a_client_query_finds_an_ipv6_flow_under_the_tables_key_only() {
        let at = placement();
        let mut t = table(1 << 10);
        let (client, vip) = (ip("2001:db8:1::7"), ip("2001:db8:ffff::80"));
        record(
            &mut t,
            &at,
            &FlowKey::new(client, vip, 6, 40_000, 443),
            1,
            0,
        );
        let target = Target {
            addr: vip,
            port: 443,
            proto: 6,
            handles: BTreeSet::from([1]),
        };
        let prefix: Prefix = "2001:db8:1::4/126".parse().unwrap();
        let read = |i: u32| t[i as usize];
        let found = clients(&read, &at, std::slice::from_ref(&target), &prefix, 10).unwrap();
        let got: Vec<_> = found.ways.iter().filter_map(|w| w.client).collect();
        assert_eq!(got, [SocketAddr::new(client, 40_000)]);
        // Under another box's key the same tuple is elsewhere.
        let mut other = at;
        other.key.k[3] ^= 1;
        let found = clients(&read, &other, &[target], &prefix, 10).unwrap();
        assert_eq!(found.matched, 0);
    }

    #[test]
    fn a_scan_lists_the_ways_of_the_handles_asked_for_up_to_the_limit() {
        let mut t = table(8);
        t[1].entries[0] = FlowEntry::new(9, 1);
        t[1].entries[3] = FlowEntry::new(10, 2);
        t[5].entries[5] = FlowEntry::new(11, 1);
        t[6].entries[2] = FlowEntry::new(12, 1);
        t[5].stamps[5] = 77;
        let read = |i: u32| t[i as usize];
        let found = scan(&read, 8, &|h| h == 1, 2);
        assert_eq!(found.matched, 3);
        let at: Vec<(u32, u8)> = found.ways.iter().map(|w| (w.bucket, w.way)).collect();
        assert_eq!(at, [(1, 0), (5, 5)], "bucket order, cut at the limit");
        assert_eq!(found.ways[1].stamp, 77);
        assert_eq!(scan(&read, 8, &|_| true, 10).matched, 4);
    }

    #[test]
    fn a_client_query_finds_each_flow_of_the_prefix_with_its_port() {
        let at = placement();
        let mut t = table(1 << 10);
        let vip = ip("10.99.0.1");
        let ours = [
            ("192.0.2.7", 40_000),
            ("192.0.2.6", 1),
            ("192.0.2.7", 65_535),
        ];
        for (i, (c, p)) in ours.iter().enumerate() {
            record(
                &mut t,
                &at,
                &FlowKey::new(ip(c), vip, 6, *p, 80),
                1,
                i as u16,
            );
        }
        // Another client, another VIP port, another protocol, and a flow
        // of ours recorded under another VIP's backend (handle 3).
        record(
            &mut t,
            &at,
            &FlowKey::new(ip("192.0.2.9"), vip, 6, 5, 80),
            1,
            0,
        );
        record(
            &mut t,
            &at,
            &FlowKey::new(ip("192.0.2.7"), vip, 6, 6, 443),
            1,
            0,
        );
        record(
            &mut t,
            &at,
            &FlowKey::new(ip("192.0.2.7"), vip, 17, 7, 80),
            1,
            0,
        );
        record(
            &mut t,
            &at,
            &FlowKey::new(ip("192.0.2.7"), vip, 6, 8, 80),
            3,
            0,
        );
        let read = |i: u32| t[i as usize];
        let target = Target {
            addr: vip,
            port: 80,
            proto: 6,
            handles: BTreeSet::from([1, 2]),
        };
        let prefix: Prefix = "192.0.2.6/31".parse().unwrap();
        let found = clients(&read, &at, std::slice::from_ref(&target), &prefix, 10).unwrap();
        let mut got: Vec<SocketAddr> = found.ways.iter().filter_map(|w| w.client).collect();
        got.sort();
        let mut want: Vec<SocketAddr> = ours
            .iter()
            .map(|(c, p)| SocketAddr::new(ip(c), *p))
            .collect();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(found.matched, 3);
        // Host bits set in the prefix are ignored, as in a route.
        let set: Prefix = "192.0.2.7/31".parse().unwrap();
        let found = clients(&read, &at, std::slice::from_ref(&target), &set, 10).unwrap();
        assert_eq!(found.matched, 3);
        let one: Prefix = "192.0.2.7/32".parse().unwrap();
        let found = clients(&read, &at, &[target], &one, 1).unwrap();
        assert_eq!((found.matched, found.ways.len()), (2, 1), "the limit");
    }

    #[test]
    fn a_client_query_too_wide_is_refused_naming_the_bound() {
        let target = Target {
            addr: ip("10.99.0.1"),
            port: 80,
            proto: 6,
            handles: BTreeSet::new(),
        };
        let read = |_: u32| FlowBucket::default();
        let ok: Prefix = "192.0.2.0/28".parse().unwrap();
        assert_eq!(tuples(&ok, 1), MAX_TUPLES);
        assert!(
            clients(
                &read,
                &Placement::default(),
                std::slice::from_ref(&target),
                &ok,
                1
            )
            .is_ok()
        );
        let wide: Prefix = "192.0.2.0/27".parse().unwrap();
        let e = clients(
            &read,
            &Placement::default(),
            std::slice::from_ref(&target),
            &wide,
            1,
        )
        .unwrap_err();
        assert!(e.contains("/28 or longer"), "{e}");
        let v6 = Target {
            addr: ip("2001:db8::1"),
            ..target.clone()
        };
        let wide6: Prefix = "2001:db8::/120".parse().unwrap();
        let e = clients(&read, &Placement::default(), &[v6], &wide6, 1).unwrap_err();
        assert!(e.contains("/124 or longer"), "{e}");
        let all: Prefix = "::/0".parse().unwrap();
        assert_eq!(tuples(&all, 3), u64::MAX, "no overflow");
        let all4: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(
            clients(
                &read,
                &Placement::default(),
                std::slice::from_ref(&target),
                &all4,
                1
            )
            .is_err()
        );
        // Only the VIPs of the client's family count.
        let v6: Prefix = "2001:db8::/122".parse().unwrap();
        assert!(clients(&read, &Placement::default(), &[target], &v6, 1).is_ok());
    }
}

//! Frames from elsewhere, changed: VLAN tags added (one, two, or one cut
//! short), mutations of generated frames (bit flips, overwrites of length,
//! offset and protocol fields, truncation at any length, extension,
//! zeroed ranges, inserted bytes), non-IP frames, random bytes (with or
//! without a plausible IP start), and frames near and past the size the
//! kernel hands the program in one buffer.

use super::{Gen, Generator, Sample, ip};
use crate::fuzz::{model::Model, wire};

/// Generators whose frames are worth tagging (all but the last) or
/// mutating.
const BASES: [Gen; 11] = [
    Gen::Vip4,
    Gen::Vip6,
    Gen::Options4,
    Gen::Ext6,
    Gen::Frag4,
    Gen::Frag6,
    Gen::IcmpError4,
    Gen::IcmpError6,
    Gen::Echo,
    Gen::Quic,
    Gen::TooBig,
];

/// A frame of another generator with `tags` VLAN tags inserted (one tag:
/// sometimes cut short; two: QinQ).
pub fn tagged(g: &mut Generator, model: &Model, tags: usize) -> Sample {
    let base = *g.rng.pick(&BASES[..10]);
    let mut s = g.generate(model, base);
    let mut insert = Vec::new();
    for i in 0..tags {
        let outer = i + 1 < tags;
        let tpid = match (outer, g.rng.below(2)) {
            (true, 0) => wire::ETH_8021AD,
            (_, 0) => wire::ETH_8021Q,
            _ => *g.rng.pick(&[wire::ETH_8021Q, wire::ETH_8021AD]),
        };
        insert.extend_from_slice(&tpid.to_be_bytes());
        insert.extend_from_slice(&(g.rng.u16() & 0xefff).to_be_bytes());
    }
    // The TPID goes where the ethertype was; the ethertype follows the tags.
    let ethertype = [s.frame[12], s.frame[13]];
    s.frame.splice(12..14, insert.iter().copied());
    s.frame
        .splice(12 + insert.len()..12 + insert.len(), ethertype);
    s.fields = s
        .fields
        .iter()
        .map(|f| if *f < 12 { *f } else { f + 4 * tags })
        .collect();
    s.fields.extend([12, 13, 14, 15]);
    if tags == 1 && g.rng.chance(5) {
        s.frame.truncate(g.rng.range(14, 17));
    }
    s.source = if tags == 1 { Gen::Vlan } else { Gen::Qinq };
    s
}

/// A generated frame with one to four mutations.
pub fn mutated(g: &mut Generator, model: &Model) -> Sample {
    let base = *g.rng.pick(&BASES);
    let mut s = if g.rng.chance(15) {
        tagged(g, model, 1)
    } else {
        g.generate(model, base)
    };
    for _ in 0..g.rng.range(1, 4) {
        mutate_once(g, &mut s);
    }
    s.source = Gen::Mutated;
    s.quic = s.quic.map(|_| super::quic::MUTATED);
    s
}

fn mutate_once(g: &mut Generator, s: &mut Sample) {
    let f = &mut s.frame;
    if f.is_empty() {
        return;
    }
    let interesting = s
        .fields
        .iter()
        .copied()
        .filter(|&i| i < f.len())
        .collect::<Vec<_>>();
    match g.rng.weighted(&[3, 5, 1, 2, 1, 1, 1]) {
        0 => {
            let i = g.rng.below(f.len().min(160));
            f[i] ^= 1 << g.rng.below(8);
        }
        1 if !interesting.is_empty() => {
            let i = *g.rng.pick(&interesting);
            f[i] = match g.rng.below(5) {
                0 => 0,
                1 => 0xff,
                2 => f[i].wrapping_add(1),
                3 => f[i].wrapping_sub(1),
                _ => g.rng.u8(),
            };
        }
        2 => {
            let i = g.rng.below(f.len());
            f[i] = g.rng.u8();
        }
        3 => f.truncate(g.rng.below(f.len())),
        4 => {
            let extra = g.rng.bytes_in(1, 100);
            f.extend_from_slice(&extra);
        }
        5 => {
            let a = g.rng.below(f.len());
            let b = (a + g.rng.range(1, 64)).min(f.len());
            f[a..b].fill(0);
        }
        _ => {
            let at = g.rng.below(f.len());
            let bytes = g.rng.bytes_in(1, 16);
            f.splice(at..at, bytes);
        }
    }
}

/// Frames that are not IP: ARP, LLDP, a stacked-VLAN ethertype lb does not
/// treat as a tag, random ethertypes.
pub fn not_ip(g: &mut Generator) -> Sample {
    let any = g.rng.u16();
    let ethertype = *g
        .rng
        .pick(&[0x0806u16, 0x88cc, 0x9100, 0x8137, 0x0842, any]);
    let body = g.rng.bytes_in(0, 200);
    let frame = wire::Eth::default().frame(ethertype, &body);
    Sample {
        source: Gen::NotIp,
        frame,
        fields: vec![12, 13],
        quic: None,
    }
}

/// Random bytes, 0 to ~3,600 of them (mostly short).
pub fn random(g: &mut Generator) -> Sample {
    let n = g.rng.length(3600);
    Sample {
        source: Gen::Random,
        frame: g.rng.bytes(n),
        fields: Vec::new(),
        quic: None,
    }
}

/// An Ethernet header for IPv4 or IPv6, a plausible IP start (version,
/// sometimes a VIP destination), then random bytes.
pub fn random_ip(g: &mut Generator, model: &Model) -> Sample {
    let v6 = g.rng.chance(50);
    let n = g.rng.length(1600) + 40;
    let mut body = g.rng.bytes(n);
    let vip = model.vips[g.rng.below(model.vips.len())].addr;
    if v6 {
        body[0] = 0x60 | (body[0] & 0x0f);
        if vip.is_ipv6() && g.rng.chance(60) {
            body[24..40].copy_from_slice(&wire::octets(vip));
        }
    } else {
        body[0] = 0x40 | (body[0] & 0x0f);
        if vip.is_ipv4() && g.rng.chance(60) {
            body[16..20].copy_from_slice(&wire::octets(vip));
        }
    }
    let ethertype = if v6 { wire::ETH_IPV6 } else { wire::ETH_IPV4 };
    Sample {
        source: Gen::RandomIp,
        frame: wire::Eth::default().frame(ethertype, &body),
        fields: vec![14, 15, 16, 17, 18, 19, 20, 23],
        quic: None,
    }
}

/// A frame within a few hundred bytes of the one-buffer limit, either side.
pub fn huge(g: &mut Generator, model: &Model) -> Sample {
    let target = g
        .rng
        .range(g.linear_max.saturating_sub(300), g.linear_max + 200);
    let mut s = if g.rng.chance(70) {
        let v6 = g.rng.chance(50);
        ip::vip(g, model, v6)
    } else {
        random(g)
    };
    if s.frame.len() < target {
        let pad = g.rng.bytes(target - s.frame.len());
        s.frame.extend_from_slice(&pad);
    } else {
        s.frame.truncate(target);
    }
    s.source = Gen::Huge;
    s
}

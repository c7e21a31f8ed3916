//! IPv6 extension-header chains of every count (0 to 7) and length, up to
//! and past the README's limits (four walked headers, 1,024 bytes): hop-by-
//! hop, routing, destination options, AH, atomic and real fragment
//! headers, and the headers lb does not walk (mobility, HIP, shim6,
//! experimental). The option bytes repeat a (source port, VIP port) word,
//! so that a parser reading the ports from inside the headers would find
//! a VIP's port there, while the real TCP or UDP header is often for a
//! port no VIP serves.

use super::{Gen, Generator, Pkt, Sample};
use crate::fuzz::{model::Model, wire};

/// Total extension bytes to aim at: around the 1,024-byte limit, and
/// around where an offset masked to 10 or 11 bits would wrap.
const TARGETS: [usize; 12] = [
    16, 256, 512, 1016, 1024, 1024, 1032, 1040, 1064, 1536, 2048, 2056,
];

pub fn chain(g: &mut Generator, model: &Model) -> Sample {
    let mut flow = g.flow(model, true);
    let vip = &model.vips[flow.vip];
    let vip_port = flow.dport;
    if g.rng.chance(50) {
        // The real header is for a port no VIP of the address serves.
        flow.dport = *g.rng.pick(&[22u16, 7, 9999, 65535]);
    }
    let payload = g.rng.range(0, 64);
    let (proto, l4) = g.segment(model, &flow, payload);
    let mut p = Pkt::new(flow.client, vip.addr, proto, l4);
    // A fake header: source port with a high byte ≥ 0x50 (a TCP data
    // offset ≥ 5 where the flags byte would be read), the VIP's port.
    let fake = [
        0x50 | g.rng.u8(),
        g.rng.u8(),
        (vip_port >> 8) as u8,
        vip_port as u8,
    ];
    let count = *g.rng.pick(&[0usize, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 7]);
    let kinds: Vec<u8> = (0..count).map(|_| ext_kind(g)).collect();
    let walked = kinds
        .iter()
        .filter(|k| matches!(k, 0 | 43 | 60 | 51))
        .count()
        .max(1);
    let target = if g.rng.chance(60) {
        *g.rng.pick(&TARGETS)
            + if g.rng.chance(30) {
                8 * g.rng.below(4)
            } else {
                0
            }
    } else {
        8 * walked * g.rng.range(1, 6)
    };
    let mut left = target;
    let mut at = 40usize;
    for (i, &kind) in kinds.iter().enumerate() {
        let share = if i + 1 == kinds.len() {
            left
        } else {
            left / (kinds.len() - i)
        };
        let len = header_len(kind, share);
        left = left.saturating_sub(len);
        let bytes = match kind {
            44 => {
                let atomic = g.rng.chance(60);
                let offset = if atomic {
                    0
                } else {
                    g.rng.range(0, 300) as u16
                };
                let more = !atomic && (offset == 0 || g.rng.chance(50));
                wire::frag_header(0, offset, more, g.rng.u32()).to_vec()
            }
            _ => wire::ext_header(kind, 0, len, &mut |o| fake[(at + o) % 4]),
        };
        at += bytes.len();
        p.v6_ext.push((kind, bytes));
    }
    g.sample(Gen::Ext6, &p)
}

fn ext_kind(g: &mut Generator) -> u8 {
    let kinds = [0u8, 43, 60, 51, 44, 135, 139, 140, 253, 254];
    let weights = [20, 15, 30, 10, 10, 3, 1, 1, 1, 1];
    kinds[g.rng.weighted(&weights)]
}

/// A length encodable for `kind`, close to `want`: 8-byte units up to
/// 2,048 (hop-by-hop, routing, destination options), 4-byte units from 12
/// to 1,028 (AH; 8 bytes rarely, below its fixed part), 8 for a fragment.
fn header_len(kind: u8, want: usize) -> usize {
    match kind {
        44 => 8,
        51 => (want / 4 * 4).clamp(8, 1028),
        _ => (want / 8 * 8).clamp(8, 2048),
    }
}

//! The flow hash: one function, computed identically by the XDP program and
//! by userspace.
//!
//! It decides two things. `slot = hash % M` picks the Maglev slot, so every
//! balancer with the same backends sends a flow to the same backend: the
//! hash must never change between versions that run side by side. That
//! hash may be keyed with a secret the balancers of a tier share
//! ([`hash_v4_keyed`]; the key `[0, 0]` is the public, pinned hash) and
//! may leave fields of the 5-tuple out ([`select_fields`], a VIP's `hash:`
//! setting, e.g. the source address alone for client affinity). The
//! connection-table bucket and tag come from the 5-tuple's
//! connection-table hash ([`ct_hash`]) mixed with a secret per-map seed
//! ([`ct_position`]), so that outsiders cannot tell which bucket a flow
//! takes, and a change of the tier's key or a VIP's fields never loses an
//! established flow's entry. For IPv4 that hash is the pick hash itself:
//! two IPv4 tuples of equal hash need a spoofed source, and a spoofer can
//! send the victim's own tuple. For IPv6 it is [`ct_hash_v6_keyed`], keyed
//! with the box's secret [`crate::CtKey`]: a client owns a /64 and could
//! otherwise solve for an interface ID whose tuple shares a known flow's
//! bucket and tag under every seed (ARCHITECTURE.md, the connection
//! table).
//!
//! Inputs are words as the datapath loads them from the packet (see
//! [`crate::abi`]): addresses as network-order words, the ports as the first
//! four bytes of the L4 header read little-endian.

use crate::consts::{
    CT_KEY_WORDS, FAMILY_V4, VIP_F_FRAG_HASH, VIP_F_HASH_FIELDS, VIP_F_HASH_NO_DPORT,
    VIP_F_HASH_NO_DST, VIP_F_HASH_NO_PROTO, VIP_F_HASH_NO_SPORT, VIP_F_HASH_SRC_V6_64,
    VIP_FILTER_WORDS,
};

const K_LANE: u64 = 0x9E37_79B9_7F4A_7C15;
const SEED_V4: u64 = 0x243F_6A88_85A3_08D3;
const SEED_V6: u64 = 0x1319_8A2E_0370_7344;
/// The seeds of [`ct_hash_v6`]'s five lanes (further digits of pi, after
/// the two above).
const SEED_CT_V6: [u64; 5] = [
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
    0x4528_21E6_38D0_1377,
    0xBE54_66CF_34E9_0C6C,
    0xC0AC_29B7_C97C_50DD,
];

/// MurmurHash3's 64-bit finaliser: full avalanche in two multiplications.
#[inline(always)]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

#[inline(always)]
const fn lane(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(K_LANE).rotate_left(31)
}

#[inline(always)]
const fn pair(hi: u32, lo: u32) -> u64 {
    ((hi as u64) << 32) | lo as u64
}

/// Hash of an IPv4 5-tuple.
#[inline(always)]
pub const fn hash_v4(src: u32, dst: u32, ports: u32, proto: u8) -> u64 {
    hash_v4_keyed(&[0, 0], src, dst, ports, proto)
}

/// Hash of an IPv6 5-tuple.
#[inline(always)]
pub const fn hash_v6(src: &[u32; 4], dst: &[u32; 4], ports: u32, proto: u8) -> u64 {
    hash_v6_keyed(&[0, 0], src, dst, ports, proto)
}

/// Hash of an IPv4 5-tuple keyed with `key`: the first word joins the
/// lanes' seed, the second the finaliser's input. `[0, 0]` is [`hash_v4`].
/// Not a cryptographic MAC: it keeps a tier's placement from being
/// computed by someone without the key, not from being learned by someone
/// who can watch many flows' backends.
#[inline(always)]
pub const fn hash_v4_keyed(key: &[u64; 2], src: u32, dst: u32, ports: u32, proto: u8) -> u64 {
    let h = lane(SEED_V4 ^ key[0], pair(src, dst));
    fmix64(lane(h, pair(ports, proto as u32)) ^ key[1])
}

/// Hash of an IPv6 5-tuple keyed with `key` (see [`hash_v4_keyed`]).
#[inline(always)]
pub const fn hash_v6_keyed(
    key: &[u64; 2],
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
) -> u64 {
    let mut h = lane(SEED_V6 ^ key[0], pair(src[0], src[1]));
    h = lane(h, pair(src[2], src[3]));
    h = lane(h, pair(dst[0], dst[1]));
    h = lane(h, pair(dst[2], dst[3]));
    fmix64(lane(h, pair(ports, proto as u32)) ^ key[1])
}

/// The unkeyed connection-table hash of an IPv6 5-tuple of the version
/// before [`ct_hash_v6_keyed`], where the datapath still looks for flows
/// that version placed (`CFG_F_CT_V6_LEGACY`): five independent lanes, one per address half and one
/// for the ports and protocol, joined by xor and finalised like
/// [`hash_v6`]. Each lane is a bijection of its word, so two tuples that
/// differ in one word never collide; the lanes run side by side, so it
/// costs about one lane and the finaliser where [`hash_v6`]'s five lanes
/// run one after another (measured in BENCHMARKS.md). The finaliser is
/// there for the bits used directly, the GUE source port and the IPv6 flow
/// label: a lane's multiplication carries a change only upward, so
/// without it two clients of one subnet would share them. It is a per-box
/// position, free to differ between versions, unlike the pinned
/// [`hash_v6`] that picks backends.
#[inline(always)]
pub const fn ct_hash_v6(src: &[u32; 4], dst: &[u32; 4], ports: u32, proto: u8) -> u64 {
    let a = lane(SEED_CT_V6[0], pair(src[0], src[1]));
    let b = lane(SEED_CT_V6[1], pair(src[2], src[3]));
    let c = lane(SEED_CT_V6[2], pair(dst[0], dst[1]));
    let d = lane(SEED_CT_V6[3], pair(dst[2], dst[3]));
    let e = lane(SEED_CT_V6[4], pair(ports, proto as u32));
    fmix64((a ^ b) ^ (c ^ d) ^ e)
}

/// One term of [`ct_hash_v6_keyed`]: NH's product of a pair of words, each
/// added to its key word, the sums not reduced modulo 2³² (33-bit
/// values, so the datapath needs no mask; see [`ct_hash_v6_keyed`]).
#[inline(always)]
const fn nh(a: u32, ka: u32, b: u32, kb: u32) -> u64 {
    (a as u64 + ka as u64).wrapping_mul(b as u64 + kb as u64)
}

/// The connection-table hash of an IPv6 5-tuple under the box's secret
/// `key` (before the seed, see [`ct_position`]): NH (Black et al., "UMAC:
/// Fast and Secure Message Authentication", CRYPTO 1999; RFC 4418 §5),
/// the sum modulo 2⁶⁴ of `(w[2i] + k[2i]) · (w[2i+1] + k[2i+1])` over the
/// ten 32-bit words of the tuple (the sums of a word and its key word
/// taken whole, not modulo 2³² as in UMAC: two tuples that differ in a
/// term then differ by `Δ₁·(w₂ + k₂) + Δ₂·k₁ + c`, linear in the keys,
/// which one value of a 32-bit key word at most satisfies, so the bound
/// below stands), joined with a second NH pass under other
/// key words over the words a client chooses (its interface ID, its
/// source port with the protocol beside it), then [`fmix64`] for the bits
/// used directly (the tag, the GUE source port, the IPv6 flow label).
///
/// One pass is 2⁻³²-almost-universal, and a client can reach that bound:
/// the halves of its interface ID swapped and shifted by the unknown
/// `k[3] − k[2]` give the same product, so a client of the victim's /64
/// would find a collision within 2³² tries, each a guess of that
/// difference. The second pass, added rotated, needs another difference
/// (`k[11] − k[10]`) at the same time: about 2⁻⁶⁴ for the swap, below the
/// 2⁻⁵² of a bucket and tag by chance. For other changes of a client's
/// words the first pass alone bounds a try's chance by 2⁻³² over the key,
/// and the second, under independent key words, makes a collision need a
/// second coincidence (an estimate, not a proof). Words a client cannot
/// choose (its prefix, the VIP) sit in the first pass, where no change of
/// one word can collide; a spoofed source needs no collision (it can send
/// the victim's own tuple). So a tuple that shares a known flow's bucket
/// and tag can no longer be computed, only guessed. Seven multiplications
/// run side by side. Not a MAC: it keeps collisions from being computed
/// by someone without the key, not from being learnt by someone who
/// watches where many flows go.
#[inline(always)]
pub const fn ct_hash_v6_keyed(
    key: &[u32; CT_KEY_WORDS],
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
) -> u64 {
    let a = nh(src[0], key[0], src[1], key[1]);
    let b = nh(src[2], key[2], src[3], key[3]);
    let c = nh(dst[0], key[4], dst[1], key[5]);
    let d = nh(dst[2], key[6], dst[3], key[7]);
    let e = nh(ports, key[8], proto as u32, key[9]);
    let f = nh(src[2], key[10], src[3], key[11]);
    let g = nh(ports, key[12], proto as u32, key[13]);
    let first = a
        .wrapping_add(b)
        .wrapping_add(c.wrapping_add(d))
        .wrapping_add(e);
    fmix64(first.wrapping_add(f.wrapping_add(g).rotate_left(32)))
}

/// The connection-table hash of a 5-tuple in address family `family`:
/// [`hash_v4`] for IPv4, [`ct_hash_v6_keyed`] under `key` for IPv6.
#[inline(always)]
pub const fn ct_hash(
    family: u8,
    key: &[u32; CT_KEY_WORDS],
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
) -> u64 {
    if family == FAMILY_V4 {
        hash_v4(src[0], dst[0], ports, proto)
    } else {
        ct_hash_v6_keyed(key, src, dst, ports, proto)
    }
}

/// The fields a VIP hashes on (its `VIP_F_HASH_*` bits in `flags`): the
/// 5-tuple with the left-out fields zeroed, an IPv6 source cut to its /64
/// if asked. The ports word is as the datapath loads it (source port in
/// the low half, destination port in the high half).
#[inline(always)]
pub const fn select_fields(
    flags: u16,
    family: u8,
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
) -> ([u32; 4], [u32; 4], u32, u8) {
    // Masks, not branches: the datapath inlines this at four sites, and
    // every branch there is one more path for the verifier to walk.
    let v6 = (family != FAMILY_V4) as u32;
    let cut_src = mask(flags & VIP_F_HASH_SRC_V6_64 != 0) & 0u32.wrapping_sub(v6);
    let keep_dst = !mask(flags & VIP_F_HASH_NO_DST != 0);
    let keep_sport = !mask(flags & VIP_F_HASH_NO_SPORT != 0) | 0xffff_0000;
    let keep_dport = !mask(flags & VIP_F_HASH_NO_DPORT != 0) | 0x0000_ffff;
    let keep_proto = !mask(flags & VIP_F_HASH_NO_PROTO != 0) as u8;
    let s = [src[0], src[1], src[2] & !cut_src, src[3] & !cut_src];
    let d = [
        dst[0] & keep_dst,
        dst[1] & keep_dst,
        dst[2] & keep_dst,
        dst[3] & keep_dst,
    ];
    (s, d, ports & keep_sport & keep_dport, proto & keep_proto)
}

/// All ones if `on`, else zero.
#[inline(always)]
const fn mask(on: bool) -> u32 {
    0u32.wrapping_sub(on as u32)
}

/// The hash fields of a VIP with `VipMeta` flags `meta_flags`: its own,
/// and no ports at all if it hashes fragments (fragments carry none, and
/// a flow's fragments and whole packets must agree).
#[inline(always)]
pub const fn pick_fields(meta_flags: u16) -> u16 {
    let mut fields = meta_flags & VIP_F_HASH_FIELDS;
    if meta_flags & VIP_F_FRAG_HASH != 0 {
        fields |= VIP_F_HASH_NO_SPORT | VIP_F_HASH_NO_DPORT;
    }
    fields
}

/// The hash that picks a new flow's backend for a VIP with hash-field
/// bits `flags`, keyed with `key`: the one definition the datapath and
/// `lbd` (`predict`, `lbctl simulate`) share.
#[inline(always)]
pub const fn pick_hash(
    key: &[u64; 2],
    flags: u16,
    family: u8,
    src: &[u32; 4],
    dst: &[u32; 4],
    ports: u32,
    proto: u8,
) -> u64 {
    let (s, d, p, proto) = select_fields(flags, family, src, dst, ports, proto);
    if family == FAMILY_V4 {
        hash_v4_keyed(key, s[0], d[0], p, proto)
    } else {
        hash_v6_keyed(key, &s, &d, p, proto)
    }
}

/// Number of bits in the VIP filter (a power of two).
pub const VIP_FILTER_BITS: u32 = 64 * VIP_FILTER_WORDS as u32;

/// The VIP filter bit of `{addr, port, proto}` (`port` network order, 0
/// for all-ports VIPs): the top bits of a multiplicative hash, which depend
/// on every input bit. Cheap: a few xors, one multiplication.
#[inline(always)]
pub const fn vip_filter_bit(addr: &[u32; 4], port: u16, proto: u8) -> u32 {
    let a = (addr[0] ^ addr[1].rotate_left(7) ^ addr[2].rotate_left(13) ^ addr[3].rotate_left(19))
        as u64;
    let x = a ^ ((port as u64) << 32) ^ ((proto as u64) << 48);
    let h = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - VIP_FILTER_BITS.trailing_zeros())) as u32
}

/// The Maglev slot of a flow hash in a table of `m` slots.
#[inline(always)]
pub const fn maglev_slot(hash: u64, m: u32) -> u32 {
    (hash as u32) % m
}

/// Connection-table position of a flow hash: `(bucket, tag)`. The bucket is
/// masked by the caller with the table's `ct_mask`; the tag identifies the
/// flow inside the bucket.
#[inline(always)]
pub const fn ct_position(hash: u64, seed: u64) -> (u32, u32) {
    let h = fmix64(hash ^ seed);
    (h as u32, (h >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::FlowKey;

    fn key(src: &str, dst: &str, sport: u16) -> FlowKey {
        FlowKey::new(src.parse().unwrap(), dst.parse().unwrap(), 6, sport, 80)
    }

    #[test]
    fn hash_is_pinned() {
        // The hash is part of the contract between balancers that run side by
        // side: if this value changes, mixed versions send flows to different
        // backends. Change it only on purpose.
        let k = key("192.0.2.1", "198.51.100.7", 40000);
        assert_eq!(k.hash(), 0xbcd2_6174_a377_c616, "got {:#018x}", k.hash());
    }

    #[test]
    fn ipv6_hash_is_pinned() {
        // As above, for IPv6. The value was computed from the definition
        // (lanes, MurmurHash3 finaliser, little-endian words) by a separate
        // implementation, which also reproduces the IPv4 value above.
        let k = FlowKey::new(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            6,
            40000,
            80,
        );
        assert_eq!(k.hash(), 0x539e_870f_399b_9551, "got {:#018x}", k.hash());
    }

    /// A key with every word's bits in play: the golden ratio's multiples.
    const KEY: [u32; CT_KEY_WORDS] = {
        let mut k = [0u32; CT_KEY_WORDS];
        let mut i = 0;
        while i < CT_KEY_WORDS {
            k[i] = 0x9E37_79B9u32.wrapping_mul(i as u32 + 1);
            i += 1;
        }
        k
    };

    fn ct(k: &FlowKey, key: &[u32; CT_KEY_WORDS]) -> u64 {
        k.ct_hash(&crate::CtKey {
            k: *key,
            legacy_until: 0,
        })
    }

    #[test]
    fn ipv6_connection_table_hashes_have_their_golden_values() {
        // Computed from the definitions by a separate implementation (NH
        // after RFC 4418 §5, both passes, the finaliser after smhasher, the words read
        // from the packet's bytes), which reproduces `ipv6_hash_is_pinned`'s
        // value too. Not pinned between versions (`CFG_F_CT_V6_LEGACY`
        // moves the entries), but a change must be on purpose.
        let k = FlowKey::new(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            6,
            40000,
            80,
        );
        assert_eq!(
            ct(&k, &KEY),
            0x730d_a669_b601_70cc,
            "got {:#018x}",
            ct(&k, &KEY)
        );
        let zero = ct(&k, &[0; CT_KEY_WORDS]);
        assert_eq!(zero, 0x3ccb_1820_0857_9bb5, "got {zero:#018x}");
        // The version before's unkeyed hash, where the legacy lookup looks.
        let unkeyed = k.ct_hash_unkeyed();
        assert_eq!(unkeyed, 0x06dc_f1f1_504e_7347, "got {unkeyed:#018x}");
        let v4 = key("192.0.2.1", "198.51.100.7", 40000);
        assert_eq!(ct(&v4, &KEY), v4.hash(), "IPv4 keeps one hash");
        assert_eq!(v4.ct_hash_unkeyed(), v4.hash());
    }

    /// The inverse of an odd number modulo 2⁶⁴ (Newton's iteration).
    fn inverse(k: u64) -> u64 {
        let mut x = k;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(k.wrapping_mul(x)));
        }
        assert_eq!(x.wrapping_mul(k), 1);
        x
    }

    #[test]
    fn a_client_cannot_compute_a_tuple_sharing_a_known_flows_position() {
        // The attack on the unkeyed hash: a client of another /64, knowing
        // a victim's tuple, solves for the interface ID whose lane makes
        // the five lanes' xor equal the victim's (each lane is invertible).
        let victim = key("2001:db8:1:2:3:4:5:6", "2001:db8:ffff::80", 40000);
        let mut attacker = key("2001:db8:9:9::", "2001:db8:ffff::80", 51234);
        let lane_of = |seed: u64, hi: u32, lo: u32| lane(seed, pair(hi, lo));
        let e = |f: &FlowKey| lane_of(SEED_CT_V6[4], f.ports_word(), f.proto as u32);
        let a = |f: &FlowKey| lane_of(SEED_CT_V6[0], f.src[0], f.src[1]);
        let b = lane_of(SEED_CT_V6[1], victim.src[2], victim.src[3]);
        let wanted = a(&victim) ^ b ^ e(&victim) ^ a(&attacker) ^ e(&attacker);
        let w = (wanted.rotate_right(31).wrapping_mul(inverse(K_LANE))) ^ SEED_CT_V6[1];
        attacker.src[2] = (w >> 32) as u32;
        attacker.src[3] = w as u32;
        assert_eq!(
            attacker.ct_hash_unkeyed(),
            victim.ct_hash_unkeyed(),
            "the construction collides without a key"
        );
        // Keyed, the same construction (and the flip of two lanes' top
        // bits, which cancels in a lane hash whatever its seed) misses
        // under each of many keys.
        let mut flipped = victim;
        flipped.src[2] ^= 1 << 31;
        flipped.src[3] ^= 1 << 31;
        let mut key = KEY;
        for round in 0..64u32 {
            for (i, k) in key.iter_mut().enumerate() {
                *k = k.rotate_left(7) ^ (round.wrapping_mul(0x85EB_CA6B) + i as u32);
            }
            assert_ne!(ct(&attacker, &key), ct(&victim, &key), "key {key:x?}");
            assert_ne!(ct(&flipped, &key), ct(&victim, &key), "key {key:x?}");
        }
    }

    #[test]
    fn a_client_of_the_victims_64_cannot_swap_its_words_into_a_collision() {
        // One NH pass lets a client of the victim's /64 swap the halves of
        // its interface ID, shifted by `k[3] − k[2]`: the pair's product
        // commutes, so every key with that difference collides. The second
        // pass's pair has `k[11] − k[10]` instead.
        let victim = key("2001:db8:1:2:0:80:0:80", "2001:db8:ffff::80", 40000);
        let mut key = KEY;
        let mut swapped_rounds = 0;
        for round in 0..64u64 {
            for (i, k) in key.iter_mut().enumerate() {
                *k = fmix64(round << 8 | i as u64) as u32;
            }
            // The swap needs `w + k` equal as integers: rounds whose shift
            // leaves a word's range are skipped (the victim's words are
            // 2³¹, so about half of them).
            let delta = i64::from(key[3]) - i64::from(key[2]);
            let (Ok(two), Ok(three)) = (
                u32::try_from(i64::from(victim.src[3]) + delta),
                u32::try_from(i64::from(victim.src[2]) - delta),
            ) else {
                continue;
            };
            swapped_rounds += 1;
            let mut swapped = victim;
            (swapped.src[2], swapped.src[3]) = (two, three);
            let pair = |f: &FlowKey, at: usize| nh(f.src[2], key[at], f.src[3], key[at + 1]);
            assert_eq!(pair(&swapped, 2), pair(&victim, 2), "one pass collides");
            assert_ne!(pair(&swapped, 10), pair(&victim, 10));
            assert_ne!(ct(&swapped, &key), ct(&victim, &key), "key {key:x?}");
        }
        assert!(swapped_rounds > 10, "{swapped_rounds} rounds tried");
    }

    #[test]
    fn every_word_and_key_word_changes_the_ipv6_connection_table_hash() {
        let base = key("2001:db8:1:2::3:4", "2001:db8:5:6::7:8", 40000);
        let h = |k: &FlowKey| ct(k, &KEY);
        for word in 0..4 {
            for bit in [0, 17, 31] {
                let mut k = base;
                k.src[word] ^= 1 << bit;
                assert_ne!(h(&k), h(&base), "src word {word} bit {bit}");
                let mut k = base;
                k.dst[word] ^= 1 << bit;
                assert_ne!(h(&k), h(&base), "dst word {word} bit {bit}");
            }
        }
        let mut k = base;
        k.proto = 17;
        assert_ne!(h(&k), h(&base));
        let mut k = base;
        k.dport = 81u16.to_be();
        assert_ne!(h(&k), h(&base));
        // Each word has its own key word: swapping the halves, or the two
        // addresses, is another flow.
        let mut k = base;
        k.src.swap(0, 2);
        k.src.swap(1, 3);
        assert_ne!(h(&k), h(&base));
        let mut k = base;
        (k.src, k.dst) = (base.dst, base.src);
        assert_ne!(h(&k), h(&base));
        for i in 0..CT_KEY_WORDS {
            let mut other = KEY;
            other[i] ^= 1 << (i * 3 % 32);
            assert_ne!(ct(&base, &other), h(&base), "key word {i}");
        }
    }

    #[test]
    fn every_field_changes_the_hash() {
        let base = key("192.0.2.1", "198.51.100.7", 40000);
        let mut other = base;
        other.dport = 81u16.to_be();
        assert_ne!(base.hash(), other.hash());
        let mut other = base;
        other.proto = 17;
        assert_ne!(base.hash(), other.hash());
        assert_ne!(base.hash(), key("192.0.2.2", "198.51.100.7", 40000).hash());
        assert_ne!(base.hash(), key("192.0.2.1", "198.51.100.8", 40000).hash());
        assert_ne!(base.hash(), key("192.0.2.1", "198.51.100.7", 40001).hash());
        assert_ne!(
            key("2001:db8::1", "2001:db8::2", 1).hash(),
            key("2001:db8::1", "2001:db8::3", 1).hash()
        );
    }

    #[test]
    fn slots_spread_evenly() {
        // 100k flows over 101 slots: every slot within 15% of the mean.
        const M: u32 = 101;
        let mut counts = [0u32; M as usize];
        for i in 0..100_000u32 {
            let src = core::net::Ipv4Addr::from(0x0a00_0000 + (i / 50_000)).into();
            let k = FlowKey::new(
                src,
                "10.9.9.9".parse().unwrap(),
                6,
                (i % 50_000) as u16,
                443,
            );
            counts[maglev_slot(k.hash(), M) as usize] += 1;
        }
        let mean = 100_000.0 / M as f64;
        for (slot, &c) in counts.iter().enumerate() {
            let dev = (c as f64 - mean).abs() / mean;
            assert!(dev < 0.15, "slot {slot}: {c} vs mean {mean:.0}");
        }
    }

    #[test]
    fn ipv6_buckets_and_tags_spread_evenly_under_a_key() {
        // 100k flows of one /64 (neighbouring interface IDs and ports) over
        // 128 buckets and 128 tag values: every one within 15% of the mean.
        const N: usize = 128;
        let (mut buckets, mut tags) = ([0u32; N], [0u32; N]);
        for i in 0..100_000u32 {
            let mut k = key(
                "2001:db8:1:2::",
                "2001:db8:ffff::80",
                1024 + (i % 50_000) as u16,
            );
            k.src[3] = (i / 50_000).to_be();
            let (bucket, tag) = ct_position(ct(&k, &KEY), 0x1234_5678_9abc_def0);
            buckets[bucket as usize % N] += 1;
            tags[tag as usize % N] += 1;
        }
        let mean = 100_000.0 / N as f64;
        for (i, (&b, &t)) in buckets.iter().zip(&tags).enumerate() {
            assert!(
                (b as f64 - mean).abs() / mean < 0.15,
                "bucket {i}: {b} vs {mean:.0}"
            );
            assert!(
                (t as f64 - mean).abs() / mean < 0.15,
                "tag {i}: {t} vs {mean:.0}"
            );
        }
    }

    #[test]
    fn filter_bits_spread_neighbouring_vips() {
        // 1000 VIPs on consecutive addresses and a few ports: almost all
        // distinct bits in a 16k-bit filter (the birthday bound expects
        // about 30 collisions among 1000 keys).
        let mut seen = [false; VIP_FILTER_BITS as usize];
        let mut distinct = 0;
        for i in 0..1000u32 {
            let addr =
                crate::abi::addr_to_words(core::net::Ipv4Addr::from(0x0a00_0000 + i / 4).into()).0;
            let port = (80 + (i % 4) as u16 * 363).to_be();
            let b = vip_filter_bit(&addr, port, 6) as usize;
            if !seen[b] {
                seen[b] = true;
                distinct += 1;
            }
        }
        assert!(distinct >= 950, "only {distinct} distinct bits");
    }

    /// One pinned value per field set (and for a key), the constants
    /// computed from the definition by a separate implementation (a few
    /// lines of Python: lanes, the MurmurHash3 finaliser, little-endian
    /// words), which also reproduces the public value of `hash_is_pinned`.
    /// If one changes, balancers of two versions disagree.
    #[test]
    fn field_sets_and_keys_are_pinned() {
        use crate::consts::*;
        let k = key("192.0.2.1", "198.51.100.7", 40000);
        let at = |flags, key: [u64; 2]| {
            pick_hash(
                &key,
                flags,
                k.family,
                &k.src,
                &k.dst,
                k.ports_word(),
                k.proto,
            )
        };
        assert_eq!(
            at(0, [0, 0]),
            k.hash(),
            "the 5-tuple, no key: the public hash"
        );
        let src_only =
            VIP_F_HASH_NO_SPORT | VIP_F_HASH_NO_DPORT | VIP_F_HASH_NO_DST | VIP_F_HASH_NO_PROTO;
        assert_eq!(
            at(src_only, [0, 0]),
            hash_v4(k.src[0], 0, 0, 0),
            "the source alone: every other field zero"
        );
        assert_eq!(
            at(VIP_F_HASH_NO_SPORT, [0, 0]),
            hash_v4(k.src[0], k.dst[0], k.ports_word() & 0xffff_0000, k.proto)
        );
        assert_ne!(at(0, [1, 0]), at(0, [0, 0]));
        assert_ne!(at(0, [0, 1]), at(0, [0, 0]));
        assert_eq!(
            at(src_only, [0, 0]),
            0x43c1_a7ab_4b1e_85bd,
            "got {:#018x}",
            at(src_only, [0, 0])
        );
        assert_eq!(
            at(0, [0x1234, 0x5678]),
            0xfc25_e14f_7884_121e,
            "got {:#018x}",
            at(0, [0x1234, 0x5678])
        );
        // Two ports of one client, the same source-only hash; two clients
        // of one /64, the same /64 hash.
        let other_port = key("192.0.2.1", "198.51.100.7", 40001);
        assert_eq!(
            pick_hash(
                &[0, 0],
                src_only,
                4,
                &other_port.src,
                &other_port.dst,
                other_port.ports_word(),
                6
            ),
            at(src_only, [0, 0])
        );
        let a = FlowKey::new(
            "2001:db8:1:2::a".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            6,
            1,
            80,
        );
        let b = FlowKey::new(
            "2001:db8:1:2::b".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            6,
            2,
            80,
        );
        let v6 = src_only | VIP_F_HASH_SRC_V6_64;
        let h = |f: &FlowKey, flags| {
            pick_hash(
                &[0, 0],
                flags,
                f.family,
                &f.src,
                &f.dst,
                f.ports_word(),
                f.proto,
            )
        };
        assert_eq!(h(&a, v6), h(&b, v6));
        assert_ne!(h(&a, src_only), h(&b, src_only));
    }

    #[test]
    fn seed_moves_the_bucket() {
        let h = key("192.0.2.1", "198.51.100.7", 40000).hash();
        assert_ne!(ct_position(h, 1), ct_position(h, 2));
    }
}

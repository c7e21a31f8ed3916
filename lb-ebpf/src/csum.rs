//! Internet checksums (RFC 1071) for headers the programs build or change.
//!
//! The one's-complement sum does not depend on byte order, so words are
//! summed exactly as loaded and the folded result is stored the same way.

/// Folds a 32-bit one's-complement accumulator into the 16-bit checksum
/// (already complemented, ready to store).
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The two 16-bit halves of a word, summed (for accumulating 32-bit
/// fields such as addresses).
#[inline(always)]
pub fn halves(w: u32) -> u32 {
    (w & 0xffff) + (w >> 16)
}

/// Checksum of a 20-byte IPv4 header whose `check` field is zero.
///
/// # Safety
/// `hdr` must point at 20 readable bytes.
#[inline(always)]
pub unsafe fn ipv4_header(hdr: *const u16) -> u16 {
    let mut sum = 0u32;
    let mut i = 0;
    while i < 10 {
        // SAFETY: i < 10 and the caller vouches for 20 bytes.
        sum += unsafe { *hdr.add(i) } as u32;
        i += 1;
    }
    fold(sum)
}

/// Updates checksum `check` for one 16-bit word of the covered data
/// changing from `old` to `new` (RFC 1624, eqn. 3).
///
/// Eqn. 3 gives 0x0000 when the new data sums to zero (an echo reply of
/// an all-zero message, say): one's-complement's other zero, which does
/// not verify (the sum over the data and 0x0000 is 0x0000, not 0xffff).
/// 0xffff verifies whatever the data, so it is written instead.
#[inline(always)]
pub fn replace16(check: u16, old: u16, new: u16) -> u16 {
    let sum = (!check as u32) + (!old as u32) + new as u32;
    match fold(sum) {
        0 => 0xffff,
        c => c,
    }
}

//! Benchmark harness programs (used by `cargo xtask bench` only; `lbd`
//! never loads them).
//!
//! `BPF_PROG_TEST_RUN` with `repeat > 1` runs a program again on the frame
//! it already rewrote, so a balancer would see its own tunnel output. The
//! harness `lb_bench` therefore restores the original frame before every
//! run (shrinks or grows it back to its length, rewrites its headers from
//! `BENCH_PACKET`), optionally stamps a new source address (a new flow per
//! run), and tail-calls the program under test from `BENCH_JUMP`. Its own
//! cost is measured by tail-calling `bench_pass` and subtracted.
//!
//! `bench_gen` is the same restore followed by a redirect into a veth: the
//! live-frames generator for the forwarding-rate benchmark.
//! `bench_bounce` is the same restore followed by `XDP_TX`: on a host where
//! live frames are refused (they need `CAP_SYS_RESOURCE`), a few frames
//! sent into a veth whose two ends run `bench_bounce` and the program under
//! test go back and forth between them, and the rate is counted in
//! `BENCH_BOUNCES` (the ring harness).
//! `bench_mac_swap` is the floor: swap MACs, `XDP_TX`. `bench_hash_v4` and
//! `bench_hash_v6` and `bench_ct_hash_v6` time the flow hashes alone, a chain
//! of them.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    helpers::generated::{bpf_redirect, bpf_xdp_adjust_head},
    macros::{map, xdp},
    maps::{Array, PerCpuArray, ProgramArray},
    programs::XdpContext,
};
use lb_common::{
    BENCH_HASH_CHAIN, BENCH_RESTORE_LEN, BenchPacket, CtKey,
    consts::CT_KEY_WORDS,
    flow::{ct_hash_v6_keyed, hash_v4, hash_v6},
};
use lb_ebpf::{access::ptr_at, hdr::EthHdr};

#[map]
static BENCH_PACKET: Array<BenchPacket> = Array::with_max_entries(1, 0);

#[map]
static BENCH_SEQ: Array<u32> = Array::with_max_entries(1, 0);

/// The key of `bench_ct_hash_v6` (zero: its words are loaded all the same).
#[map]
static BENCH_CT_KEY: Array<CtKey> = Array::with_max_entries(1, 0);

/// Frames `bench_bounce` sent back (per CPU; the ring harness's rate).
#[map]
static BENCH_BOUNCES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Not 0: `bench_bounce` drops what it receives (ends a ring's round).
#[map]
static BENCH_STOP: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static BENCH_JUMP: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// A Maglev table as plain `u32` slots, one map element each: the
/// baseline of the table-write benchmark (one syscall per slot).
#[map]
static BENCH_SLOTS: Array<u32> = Array::with_max_entries(65_537, 0);

/// Largest growth undone: the biggest tunnel header the balancer adds.
const MAX_GROWTH: usize = 64;
/// Largest shrinking undone: the biggest tunnel header `lb_decap` strips.
const MAX_SHRINK: usize = 128;

/// Puts the original frame back; `None` if the frame cannot be restored.
#[inline(always)]
fn restore(ctx: &XdpContext) -> Option<()> {
    let p = BENCH_PACKET.get(0)?;
    let len = ctx.data_end() - ctx.data();
    let want = p.len as usize;
    if len > want {
        let grown = len - want;
        if grown > MAX_GROWTH {
            return None;
        }
        // SAFETY: shrinking the head by what the program under test added.
        if unsafe { bpf_xdp_adjust_head(ctx.ctx, grown as i32) } != 0 {
            return None;
        }
    } else if len < want {
        let shrunk = want - len;
        if shrunk > MAX_SHRINK {
            return None;
        }
        // SAFETY: growing the head back by what the program under test
        // (a decapsulation) removed.
        if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(shrunk as i32)) } != 0 {
            return None;
        }
    }
    let dst: *mut [u64; BENCH_RESTORE_LEN / 8] = ptr_at(ctx, 0)?;
    // Word by word, with volatile reads: a whole-array copy becomes a call
    // to `memmove`, which on BPF copies byte by byte and cost the live
    // generator more than the programs it feeds.
    let src = p.data.as_ptr() as *const u64;
    let dst = dst as *mut u64;
    for i in 0..BENCH_RESTORE_LEN / 8 {
        // SAFETY: bounds checked by `ptr_at`; `data` holds the same number
        // of bytes; unaligned 8-byte accesses are fine for XDP on x86.
        unsafe {
            let word = core::ptr::read_volatile(src.add(i));
            core::ptr::write_unaligned(dst.add(i), word);
        }
    }
    // The mask gives the verifier a bound it keeps (a range check on a
    // copy of the value would not reach the pointer arithmetic).
    let off = p.stamp_off as usize & 0x7f;
    if off != 0 {
        let seq = BENCH_SEQ.get_ptr_mut(0)?;
        // SAFETY: array element; the harness runs on one CPU.
        let n = unsafe {
            *seq = (*seq).wrapping_add(1);
            *seq
        };
        let n = match p.stamp_mod {
            0 => n,
            m => n % m + 1,
        };
        let at: *mut [u8; 4] = ptr_at(ctx, off)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe { *at = n.to_be_bytes() };
    }
    Some(())
}

#[xdp]
pub fn lb_bench(ctx: XdpContext) -> u32 {
    if restore(&ctx).is_none() {
        return xdp_action::XDP_ABORTED;
    }
    // SAFETY: a tail call to a program of the same type; on failure we
    // fall through.
    unsafe { BENCH_JUMP.tail_call(&ctx, 0) };
    xdp_action::XDP_ABORTED
}

#[xdp]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    if restore(&ctx).is_none() {
        return xdp_action::XDP_ABORTED;
    }
    let Some(p) = BENCH_PACKET.get(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: helper call with an ifindex and no flags.
    unsafe { bpf_redirect(p.redirect_ifindex, 0) as u32 }
}

/// The ring harness's other end: restores the frame the program under
/// test sent back, counts it and sends it back again, until `BENCH_STOP`.
#[xdp]
pub fn bench_bounce(ctx: XdpContext) -> u32 {
    if BENCH_STOP.get(0).is_none_or(|stop| *stop != 0) {
        return xdp_action::XDP_DROP;
    }
    if restore(&ctx).is_none() {
        return xdp_action::XDP_ABORTED;
    }
    if let Some(n) = BENCH_BOUNCES.get_ptr_mut(0) {
        // SAFETY: this CPU's element.
        unsafe { *n += 1 };
    }
    xdp_action::XDP_TX
}

/// The measurement loop's own cost: nothing.
#[xdp]
pub fn bench_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The floor of a forwarding program: swap MACs, send back.
#[xdp]
pub fn bench_mac_swap(ctx: XdpContext) -> u32 {
    let Some(eth) = ptr_at::<EthHdr>(&ctx, 0) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr_at`.
    unsafe {
        core::mem::swap(&mut (*eth).h_dest, &mut (*eth).h_source);
    }
    xdp_action::XDP_TX
}

/// The floor of a tunnelling program: grow the frame by an IPv4 header
/// (20 bytes), move the Ethernet header, send back. What every
/// encapsulating balancer pays on top of `bench_mac_swap`.
#[xdp]
pub fn bench_grow(ctx: XdpContext) -> u32 {
    let Some(eth) = ptr_at::<EthHdr>(&ctx, 0) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let (d, s, p) = unsafe { ((*eth).h_dest, (*eth).h_source, (*eth).h_proto) };
    // SAFETY: growing the head by 20 bytes of the test headroom.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -20) } != 0 {
        return xdp_action::XDP_DROP;
    }
    let Some(eth) = ptr_at::<EthHdr>(&ctx, 0) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr_at`.
    unsafe {
        (*eth).h_dest = s;
        (*eth).h_source = d;
        (*eth).h_proto = p;
    }
    xdp_action::XDP_TX
}

/// Runs `step` [`BENCH_HASH_CHAIN`] times in a row, from the frame's first
/// eight bytes (read from the packet so that the compiler cannot fold the
/// chain), and writes the result back over them so that it is not dead
/// code (`lb_bench` restores the frame before the next run).
#[inline(always)]
fn chain(ctx: &XdpContext, step: impl Fn(u64) -> u64) -> u32 {
    let Some(p) = ptr_at::<[u8; 8]>(ctx, 0) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by `ptr_at`; no helper call in between moves
    // the packet.
    let mut h = u64::from_ne_bytes(unsafe { *p });
    for _ in 0..BENCH_HASH_CHAIN {
        h = step(h);
    }
    // SAFETY: as above.
    unsafe { *p = h.to_ne_bytes() };
    xdp_action::XDP_PASS
}

/// The IPv4 flow hash, [`BENCH_HASH_CHAIN`] times in a row, each tuple taken
/// from the hash before: its latency as the datapath pays it once a
/// packet.
#[xdp]
pub fn bench_hash_v4(ctx: XdpContext) -> u32 {
    chain(&ctx, |h| {
        hash_v4(h as u32, (h >> 32) as u32, h as u32 ^ 0x5000_0000, 6)
    })
}

/// The IPv6 flow hash (pinned: it picks a new flow's backend), as
/// [`bench_hash_v4`] does the IPv4 one.
#[xdp]
pub fn bench_hash_v6(ctx: XdpContext) -> u32 {
    chain(&ctx, |h| {
        let (lo, hi) = (h as u32, (h >> 32) as u32);
        hash_v6(&[lo, hi, hi, lo], &[hi, lo, lo, hi], lo ^ 0x5000_0000, 6)
    })
}

/// The IPv6 connection-table hash (the one an established IPv6 packet
/// pays: keyed, its key loaded from a map once, as the datapath loads
/// `LB_CT_KEY` once a packet), as [`bench_hash_v4`] does the IPv4 flow
/// hash.
#[xdp]
pub fn bench_ct_hash_v6(ctx: XdpContext) -> u32 {
    let key = BENCH_CT_KEY.get(0).map_or([0; CT_KEY_WORDS], |k| k.k);
    chain(&ctx, |h| {
        let (lo, hi) = (h as u32, (h >> 32) as u32);
        ct_hash_v6_keyed(
            &key,
            &[lo, hi, hi, lo],
            &[hi, lo, lo, hi],
            lo ^ 0x5000_0000,
            6,
        )
    })
}

/// Receives frames sent back to the generator side of the veth.
#[xdp]
pub fn bench_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

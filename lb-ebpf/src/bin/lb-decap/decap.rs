//! Stripping a recognised tunnel: the L2 header (Ethernet and the VLAN tag
//! if any, both kept) moves forward over the outer headers, its ethertype
//! becomes the inner packet's, and the frame's head moves with it. The inner
//! packet is not touched.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::consts::ETH_HDR_LEN;
use lb_ebpf::{
    access::At,
    hdr::{EthHdr, VlanHdr},
};

use crate::tunnel::Tunnel;

/// The frame could not be shrunk, or re-read after shrinking.
pub struct StripError;

/// Removes `t.overhead` bytes between the L2 header and the inner packet.
///
/// The L2 header is copied out first and written back after
/// `bpf_xdp_adjust_head`, so a refused adjustment leaves the frame as it
/// was. After a successful one the frame is the inner frame; an error past
/// that point (never seen: the inner header is known to be there) leaves it
/// unusable, and the caller drops it.
#[inline(always)]
pub fn strip(ctx: &XdpContext, t: &Tunnel) -> Result<(), StripError> {
    let mut eth = At::<EthHdr>::new(ctx, 0).ok_or(StripError)?.read();
    let tagged = t.l2_len > ETH_HDR_LEN;
    let mut vlan = VlanHdr {
        tci: 0,
        encapsulated_proto: 0,
    };
    if tagged {
        vlan = At::<VlanHdr>::new(ctx, ETH_HDR_LEN)
            .ok_or(StripError)?
            .read();
        vlan.encapsulated_proto = t.inner_ethertype;
    } else {
        eth.h_proto = t.inner_ethertype;
    }

    // SAFETY: `ctx.ctx` is the program's context; every packet pointer taken
    // before this call is dead after it.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, t.overhead as i32) } != 0 {
        return Err(StripError);
    }

    At::<EthHdr>::new(ctx, 0).ok_or(StripError)?.write(eth);
    if tagged {
        At::<VlanHdr>::new(ctx, ETH_HDR_LEN)
            .ok_or(StripError)?
            .write(vlan);
    }
    Ok(())
}

//! Bounds-checked access to the packet: the one place where packet bytes
//! are read and written through pointers.
//!
//! [`At`] is a header of type `T` at an offset that was checked against
//! the end of the packet when it was made. The programs read a header
//! whole ([`At::read`], a copy whose unused fields the compiler drops) and
//! write it one field at a time, through one setter per field written
//! (below, next to nothing else), as smoltcp confines each header's
//! offsets to its accessors. The offsets themselves are the `#[repr(C)]`
//! layouts of [`crate::hdr`].
//!
//! An `At` must not be used after the packet moves (`bpf_xdp_adjust_head`
//! or `_tail`): the verifier rejects any program that does, so such a
//! mistake fails at load time, never on a packet.
//!
//! Alignment: the header types keep their natural alignment so that a
//! field is one load or store; after a 14-byte Ethernet header the IP
//! header is only 2-byte aligned. eBPF allows that (the verifier accepts
//! unaligned packet access, and the JITs of x86-64 and arm64 do it in one
//! instruction). Byte-array fields, as `network-types` 0.2 declares them,
//! would be alignment 1 and split by LLVM's BPF backend into byte stores:
//! see ARCHITECTURE.md ("Packet headers") for the measurement.

use aya_ebpf::programs::XdpContext;

use crate::hdr::{
    AltAddr4, AltAddr6, EthHdr, GreHdr, GueHdr, IcmpHdr, Ipv4Hdr, Ipv6Hdr, ScHdr, UdpHdr, VlanHdr,
};

/// A bounds-checked pointer to a `T` at byte `off` of the packet.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *mut T)
}

/// A `T` inside the packet (see the module docs).
pub struct At<T> {
    ptr: *mut T,
}

impl<T: Copy> At<T> {
    /// The `T` at byte `off`, if the packet holds all of it.
    #[inline(always)]
    pub fn new(ctx: &XdpContext, off: usize) -> Option<Self> {
        ptr_at(ctx, off).map(|ptr| Self { ptr })
    }

    /// A copy of the whole value.
    #[inline(always)]
    pub fn read(&self) -> T {
        // SAFETY: the packet holds `size_of::<T>()` bytes at `ptr`
        // (checked in `new`), and it has not moved since (module docs).
        unsafe { *self.ptr }
    }

    /// Overwrites the whole value.
    #[inline(always)]
    pub fn write(&self, value: T) {
        // SAFETY: as in `read`.
        unsafe { *self.ptr = value }
    }

    /// The address, for helpers that take one (`bpf_csum_diff`).
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut T {
        self.ptr
    }
}

/// One setter per written field: `set_x(value)` stores `value` (already
/// in packet byte order) into field `x`, one store.
macro_rules! setters {
    ($($hdr:ident { $($set:ident => $field:ident: $ty:ty),* $(,)? })*) => {
        $(impl At<$hdr> {
            $(
                #[inline(always)]
                pub fn $set(&self, value: $ty) {
                    // SAFETY: as in `At::read`; the field lies inside the
                    // checked header.
                    unsafe { (*self.ptr).$field = value }
                }
            )*
        })*
    };
}

setters! {
    EthHdr {
        set_dest => h_dest: [u16; 3],
        set_source => h_source: [u16; 3],
        set_proto => h_proto: u16,
    }
    VlanHdr {
        set_tci => tci: u16,
        set_encapsulated_proto => encapsulated_proto: u16,
    }
    Ipv4Hdr {
        set_version_ihl => version_ihl: u8,
        set_tos => tos: u8,
        set_tot_len => tot_len: u16,
        set_id => id: u16,
        set_frag_off => frag_off: u16,
        set_ttl => ttl: u8,
        set_protocol => protocol: u8,
        set_check => check: u16,
        set_saddr => saddr: u32,
        set_daddr => daddr: u32,
    }
    Ipv6Hdr {
        set_vtc_flow => vtc_flow: u32,
        set_payload_len => payload_len: u16,
        set_nexthdr => nexthdr: u8,
        set_hop_limit => hop_limit: u8,
    }
    GreHdr {
        set_flags_version => flags_version: u16,
        set_protocol => protocol: u16,
    }
    UdpHdr {
        set_source => source: u16,
        set_dest => dest: u16,
        set_len => len: u16,
        set_check => check: u16,
    }
    IcmpHdr {
        set_kind => kind: u8,
        set_code => code: u8,
        set_check => check: u16,
        set_rest => rest: u32,
    }
    GueHdr {
        set_ver_c_hlen => ver_c_hlen: u8,
        set_proto_ctype => proto_ctype: u8,
        set_flags => flags: u16,
    }
    ScHdr {
        set_kind => kind: u16,
        set_next => next: u8,
        set_count => count: u8,
    }
    AltAddr4 {
        set_addr => addr: u32,
    }
}

impl At<AltAddr6> {
    /// The address, word by word.
    #[inline(always)]
    pub fn set_addr(&self, words: &[u32; 4]) {
        // SAFETY: as in `At::read`.
        unsafe {
            (*self.ptr).addr[0] = words[0];
            (*self.ptr).addr[1] = words[1];
            (*self.ptr).addr[2] = words[2];
            (*self.ptr).addr[3] = words[3];
        }
    }
}

impl At<Ipv6Hdr> {
    /// The source address, word by word (an array store would become a
    /// byte loop).
    #[inline(always)]
    pub fn set_saddr(&self, words: &[u32; 4]) {
        // SAFETY: as in `At::read`.
        unsafe {
            (*self.ptr).saddr[0] = words[0];
            (*self.ptr).saddr[1] = words[1];
            (*self.ptr).saddr[2] = words[2];
            (*self.ptr).saddr[3] = words[3];
        }
    }

    /// The destination address, word by word.
    #[inline(always)]
    pub fn set_daddr(&self, words: &[u32; 4]) {
        // SAFETY: as in `At::read`.
        unsafe {
            (*self.ptr).daddr[0] = words[0];
            (*self.ptr).daddr[1] = words[1];
            (*self.ptr).daddr[2] = words[2];
            (*self.ptr).daddr[3] = words[3];
        }
    }
}

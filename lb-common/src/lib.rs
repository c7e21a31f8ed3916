//! Everything the XDP program and userspace must agree on, and nothing else.
//!
//! `lb-common` is `no_std` so the kernel side can use it. It owns the layout of
//! every map key and value ([`abi`]), map names and flag bits ([`consts`]), the
//! flow hash that both sides compute ([`flow`]), and the counter ids
//! ([`counters`]), BFD's state machine and timer arithmetic ([`bfd`]),
//! which `lb_xdp` runs and `lbd` reads, and what QUIC-LB routing reads of
//! a connection ID ([`quic`]). It does no I/O and makes no syscalls.
//!
//! ABI discipline (as in Cilium's pinned maps): a field of a pinned map value
//! is never reused for something else; a retired field becomes `_reserved`.
#![cfg_attr(not(test), no_std)]

pub mod abi;
pub mod bfd;
pub mod consts;
pub mod counters;
pub mod flow;
pub mod quic;

pub use abi::*;
pub use counters::Counter;

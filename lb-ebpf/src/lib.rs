//! Code shared by lb's XDP programs: packet headers, bounds-checked packet
//! pointers, the parser and checksums. Each program (`src/bin/*`) owns its
//! own maps, so an object carries only the maps its program uses.
//!
//! Everything here is `#[inline(always)]`: the programs are single functions
//! to the verifier, and no helper call crosses a function boundary.
#![no_std]

pub mod access;
pub mod csum;
pub mod hdr;
pub mod parse;

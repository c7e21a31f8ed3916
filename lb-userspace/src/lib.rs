//! The lb userspace library: everything `lbd` and `lbctl` share.
#![deny(unsafe_code)]

pub mod dataplane;
pub mod decap;
pub mod maglev;
pub mod objects;
pub mod predict;

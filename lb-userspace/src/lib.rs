//! The lb userspace library: everything `lbd` and `lbctl` share.
#![deny(unsafe_code)]

pub mod announce;
pub mod api;
pub mod atomic_file;
pub mod bfd;
pub mod cli_docs;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod digest;
pub mod health;
pub mod lifecycle;
pub mod lock;
pub mod maglev;
pub mod metrics;
pub mod net;
pub mod objects;
pub mod passive;
pub mod predict;
pub mod reconcile;
pub mod revisions;
#[cfg(test)]
mod scratch;
pub mod second_chance;
pub mod state;
pub mod trace;

/// `--version` of `lbd` and `lbctl`: the package version and the commit
/// it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LB_GIT_COMMIT"), ")");

//! The lb userspace library: everything `lbd` and `lbctl` share.
//!
//! The surface, by who uses it (the rest is private to the crate):
//!
//! - `lbd` and `lbctl`: [`api`] (requests, answers, refusal codes, the
//!   client), [`config`] (the file), [`daemon`] (`Daemon` and what its
//!   start-up needs; its fields are its own), [`dataplane`] (the kernel
//!   maps), [`reconcile`], [`revisions`], [`state`], [`announce`],
//!   [`bfd`], [`health`], [`metrics`], [`net`], [`lock`], [`decap`],
//!   [`trace`], [`cli_docs`], [`objects`].
//! - Tests and tools outside the crate (the kernel tests, the fuzzer, the
//!   rigs, the benchmarks) use the same modules, plus [`predict`] (the
//!   model of the datapath's decision) and [`maglev`].
//! - Private: the policies and helpers only the daemon runs
//!   (`lifecycle`, `liveflows`, `passive`, `second_chance`, `digest`,
//!   `atomic_file`).
//!   Internal state types are not serialised: what crosses a process
//!   boundary is a type of [`api`]'s own (`PeerRow` for
//!   `announce::PeerStatus`, `BackendState`, `NodeState`, `SessionState`
//!   for the internal states), so that a change inside cannot change the
//!   wire; two pure reports are API types that `lbd` fills directly
//!   (`BfdRow` as `bfd::BfdStatus`, `GracefulRestartRow` as
//!   `announce::GracefulRestartStatus`).
#![deny(unsafe_code)]

pub mod announce;
pub mod api;
mod atomic_file;
pub mod bfd;
pub mod cli_docs;
pub mod config;
mod conns;
pub mod daemon;
pub mod dataplane;
pub mod decap;
mod digest;
pub mod health;
mod lifecycle;
mod liveflows;
pub mod lock;
pub mod maglev;
pub mod metrics;
pub mod net;
pub mod objects;
mod passive;
pub mod predict;
pub mod reconcile;
pub mod revisions;
#[cfg(test)]
mod scratch;
mod second_chance;
pub mod state;
pub mod tier;
pub mod trace;

/// `--version` of `lbd` and `lbctl`: the package version and the commit
/// it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LB_GIT_COMMIT"), ")");

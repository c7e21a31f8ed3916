//! The lb userspace library: everything `lbd` and `lbctl` share.
//!
//! The surface is small on purpose: every module below a top-level one is
//! private to the crate, and each public module re-exports the items its
//! users need (the way tokio and rust-analyzer's `ide` do), so a module
//! can be split, renamed or moved without touching a caller.
//!
//! - `lbd` and `lbctl`: [`api`] (requests, answers, refusal codes, the
//!   client), [`config`] (the file), [`daemon`] (`Daemon` and what its
//!   start-up needs; its fields are its own), [`dataplane`] (the kernel
//!   maps), [`announce`] (the announcers, and the BGP codec as
//!   [`announce::wire`]), [`tier`] (etcd), [`metrics`], [`net`],
//!   [`decap`], [`trace`], [`cli_docs`], [`objects`]; and, at the root,
//!   the single types of small modules: [`Reconciler`] and
//!   [`DatapathSettings`], [`RevisionStore`], [`Overlay`] and [`Stamp`],
//!   [`BfdTable`] and [`KernelBfdTable`], [`ProbeResult`], [`DirLock`].
//! - Tests and tools outside the crate (the kernel tests, the fuzzer, the
//!   rigs, the benchmarks) use the same surface, plus [`predict`] (the
//!   model of the datapath's decision) and [`maglev`].
//! - Private: the policies and helpers only the daemon runs
//!   (`lifecycle`, `liveflows`, `passive`, `second_chance`, `digest`,
//!   `atomic_file`, `conns`), and the modules behind the root's
//!   re-exports (`reconcile`, `revisions`, `state`, `bfd`, `health`,
//!   `lock`).
//!   Internal state types are not serialised: what crosses a process
//!   boundary is a type of [`api`]'s own (`PeerRow` for
//!   `announce::PeerStatus`, `BackendState`, `NodeState`, `SessionState`
//!   for the internal states), so that a change inside cannot change the
//!   wire; two pure reports are API types that `lbd` fills directly
//!   (`BfdRow` as `bfd::BfdStatus`, `GracefulRestartRow` as
//!   `announce::GracefulRestartStatus`).
#![deny(unsafe_code)]
// The module docs are written for the crate's maintainers and name the
// private modules they lean on; `cargo doc --document-private-items`
// renders every such link.
#![allow(rustdoc::private_intra_doc_links)]

pub mod announce;
pub mod api;
mod atomic_file;
mod bfd;
pub mod cli_docs;
pub mod config;
mod conns;
pub mod daemon;
pub mod dataplane;
pub mod decap;
mod digest;
mod health;
mod lifecycle;
mod liveflows;
mod lock;
pub mod maglev;
pub mod metrics;
pub mod net;
pub mod objects;
mod passive;
pub mod predict;
mod reconcile;
mod revisions;
#[cfg(test)]
mod scratch;
mod second_chance;
mod state;
#[cfg(test)]
mod test_logs;
pub mod tier;
pub mod trace;

pub use self::{
    bfd::{BfdTable, KernelBfdTable},
    health::ProbeResult,
    liveflows::{HZ_UNKNOWN, kernel_hz},
    lock::{DirLock, on_bpffs},
    reconcile::{DatapathSettings, Reconciler},
    revisions::{Revision, RevisionStore},
    state::{Overlay, Stamp},
};

/// `--version` of `lbd` and `lbctl`: the package version and the commit
/// it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LB_GIT_COMMIT"), ")");

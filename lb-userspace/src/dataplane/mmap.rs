//! A read-only view of the connection table through `mmap(2)` (the map
//! is `BPF_F_MMAPABLE`), for scans that one syscall per bucket would make
//! take seconds. One of the dataplane's three unsafe modules (with
//! `batch.rs` and `link.rs`).
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;

use lb_common::FlowBucket;

use super::{DataplaneError, Result};

/// A read-only shared mapping of an mmapable array map, unmapped on drop.
pub struct ReadOnlyMapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl ReadOnlyMapping {
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh mapping of `len` bytes of the map, chosen by the
        // kernel (no fixed address), read-only; checked for MAP_FAILED.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(DataplaneError::Io(std::io::Error::last_os_error()));
        }
        Ok(Self { addr, len })
    }

    /// Copies of the first `n` buckets, one at a time.
    pub fn buckets(&self, n: usize) -> impl Iterator<Item = FlowBucket> + '_ {
        let n = n.min(self.len / std::mem::size_of::<FlowBucket>());
        let base = self.addr as *const FlowBucket;
        // SAFETY: `i < n` buckets lie inside the mapping, which is page
        // aligned (so aligned for FlowBucket) and lives as long as `self`;
        // a volatile read copies what the datapath wrote, torn between
        // ways at worst (each way is one 8-byte word).
        (0..n).map(move |i| unsafe { std::ptr::read_volatile(base.add(i)) })
    }
}

impl ReadOnlyMapping {
    /// A copy of bucket `i`, if the mapping holds it.
    pub fn bucket(&self, i: usize) -> Option<FlowBucket> {
        if i >= self.len / std::mem::size_of::<FlowBucket>() {
            return None;
        }
        // SAFETY: bucket `i` lies inside the mapping (checked above),
        // which is page aligned and lives as long as `self`; a volatile
        // read, as in `buckets`.
        Some(unsafe { std::ptr::read_volatile((self.addr as *const FlowBucket).add(i)) })
    }
}

impl Drop for ReadOnlyMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

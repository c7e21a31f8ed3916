//! Whole per-CPU arrays in one `BPF_MAP_LOOKUP_BATCH` each: aya reads one
//! element per syscall, and at 65,536 backends the per-backend counters
//! read every second took a quarter of a core and held up the daemon's
//! loop. Kernels without batch lookups (before 5.6) answer `EINVAL`; the
//! caller then reads element by element. Unsafe code of the dataplane,
//! with `mmap.rs`.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd as _, BorrowedFd};

/// `BPF_MAP_LOOKUP_BATCH` (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Elements `0..entries` of the per-CPU array `fd`, each summed over the
/// `cpus` possible CPUs with `add`. `T` must be the map's value type, its
/// size a multiple of 8 (the kernel's per-CPU stride).
pub fn read_per_cpu<T: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    entries: u32,
    cpus: usize,
    add: impl Fn(&mut T, &T),
) -> std::io::Result<Vec<T>> {
    assert!(std::mem::size_of::<T>().is_multiple_of(8), "per-CPU stride");
    let mut keys = vec![0u32; entries as usize];
    let mut values = vec![T::default(); entries as usize * cpus];
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        out_batch: &mut out_batch as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: entries,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.batch` whose pointers name
    // buffers that outlive the call, large enough for `count` keys (u32)
    // and `count × cpus` values of `T` (the map's value, whose size is the
    // per-CPU stride); the kernel writes nothing else.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as u32,
        )
    };
    if ret < 0 {
        let err = std::io::Error::last_os_error();
        // ENOENT: the walk reached the end of the array; what it read is
        // valid.
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(err);
        }
    }
    if attr.count != entries || keys.iter().enumerate().any(|(i, k)| *k as usize != i) {
        return Err(std::io::Error::other(format!(
            "batch lookup read {} of {entries} elements, or out of order",
            attr.count
        )));
    }
    Ok(values
        .chunks(cpus)
        .map(|per_cpu| {
            let mut sum = T::default();
            for v in per_cpu {
                add(&mut sum, v);
            }
            sum
        })
        .collect())
}

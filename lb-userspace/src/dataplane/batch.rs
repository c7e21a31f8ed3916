//! Whole arrays in one syscall each: aya reads and writes one element per
//! syscall, and at 65,536 backends the per-backend counters read every
//! second took a quarter of a core and held up the daemon's loop.
//! `BPF_MAP_LOOKUP_BATCH` reads a per-CPU array (the daemon's sample; the
//! fuzzer's counters after every packet), `BPF_MAP_UPDATE_BATCH` fills an
//! array with zeros (the fuzzer empties the connection table). Kernels
//! without batch commands (before 5.6) answer `EINVAL`; the daemon then
//! reads element by element. Unsafe code of the dataplane, with `mmap.rs`.
#![allow(unsafe_code)]

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

/// `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH`
/// (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

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
/// size a multiple of 8 (the kernel's per-CPU stride). A plain array
/// reads as a per-CPU one of one CPU.
pub fn read_per_cpu<T: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    entries: u32,
    cpus: usize,
    add: impl Fn(&mut T, &T),
) -> io::Result<Vec<T>> {
    let mut scratch = (Vec::new(), Vec::new());
    let mut out = Vec::new();
    read_per_cpu_into(fd, entries, cpus, &mut scratch, add, &mut out)?;
    Ok(out)
}

/// [`read_per_cpu`] into `out`, with the keys and values buffers kept by
/// the caller between calls (`scratch`), for readers that read often.
pub fn read_per_cpu_into<T: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    entries: u32,
    cpus: usize,
    scratch: &mut (Vec<u32>, Vec<T>),
    add: impl Fn(&mut T, &T),
    out: &mut Vec<T>,
) -> io::Result<()> {
    assert!(std::mem::size_of::<T>().is_multiple_of(8), "per-CPU stride");
    let (keys, values) = scratch;
    keys.clear();
    keys.resize(entries as usize, 0);
    values.clear();
    values.resize(entries as usize * cpus, T::default());
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        out_batch: &mut out_batch as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: entries,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    // SAFETY: the pointers in `attr` name buffers that outlive the call,
    // large enough for `count` keys (u32) and `count × cpus` values of `T`
    // (the map's value, whose size is the per-CPU stride); the kernel
    // writes nothing else.
    unsafe { batch(BPF_MAP_LOOKUP_BATCH, &mut attr) }?;
    if keys.iter().enumerate().any(|(i, k)| *k as usize != i) {
        return Err(io::Error::other("batch lookup read keys out of order"));
    }
    out.clear();
    out.extend(values.chunks(cpus).map(|per_cpu| {
        let mut sum = T::default();
        for v in per_cpu {
            add(&mut sum, v);
        }
        sum
    }));
    Ok(())
}

/// Zeroes elements `0..entries`, of `value_size` bytes each, of the array
/// `fd`.
pub fn zero_array(fd: BorrowedFd<'_>, entries: u32, value_size: usize) -> io::Result<()> {
    let keys: Vec<u32> = (0..entries).collect();
    let values = vec![0u8; entries as usize * value_size];
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: entries,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    // SAFETY: the kernel only reads `count` keys and `count` values of
    // `value_size` bytes (the caller's map's) from buffers that outlive
    // the call.
    unsafe { batch(BPF_MAP_UPDATE_BATCH, &mut attr) }
}

/// One batch command on `attr`, which must have done all `count` elements.
///
/// # Safety
/// The pointers in `attr` must name buffers large enough for what the
/// command reads or writes for `attr.count` elements of the map.
unsafe fn batch(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    let want = attr.count;
    // SAFETY: `attr` is a valid `bpf_attr.batch`; the caller vouches for
    // its buffers.
    match unsafe { super::link::bpf(cmd, attr) } {
        // ENOENT: a lookup walk reached the end of the array; what it read
        // is valid.
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
        _ => {}
    }
    if attr.count != want {
        let what = format!("batch command {cmd} did {} of {want} elements", attr.count);
        return Err(io::Error::other(what));
    }
    Ok(())
}

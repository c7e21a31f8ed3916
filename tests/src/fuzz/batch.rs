//! Whole arrays in one syscall each (aya reads and writes one element per
//! syscall): `BPF_MAP_LOOKUP_BATCH` reads every outcome counter after every
//! packet; `BPF_MAP_UPDATE_BATCH` empties the connection table before each
//! run of the shrinker. The only unsafe code of the fuzzer.

use std::{io, os::fd::RawFd};

use lb_common::CounterValue;

/// `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH` (include/uapi/linux/bpf.h,
/// `enum bpf_cmd`).
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

/// Reads `entries` elements of the per-CPU array `fd` whose values are
/// [`CounterValue`]s, for `cpus` possible CPUs, summing the CPUs into
/// `out` (resized to `entries`). `keys` and `values` are scratch space
/// kept by the caller between calls.
pub fn read_counters(
    fd: RawFd,
    entries: u32,
    cpus: usize,
    scratch: &mut (Vec<u32>, Vec<CounterValue>),
    out: &mut Vec<CounterValue>,
) -> io::Result<()> {
    let (keys, values) = scratch;
    keys.resize(entries as usize, 0);
    values.resize(entries as usize * cpus, CounterValue::default());
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        out_batch: &mut out_batch as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: entries,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: the pointers in `attr` name buffers that live across the
    // call and are large enough for `count` keys (u32) and `count × cpus`
    // values of 16 bytes (a multiple of 8, so the kernel's per-CPU stride
    // is the value size); the kernel writes nothing else.
    unsafe { batch(BPF_MAP_LOOKUP_BATCH, &mut attr) }?;
    out.clear();
    out.extend(values.chunks(cpus).map(|per_cpu| {
        let mut sum = CounterValue::default();
        for v in per_cpu {
            sum += *v;
        }
        sum
    }));
    Ok(())
}

/// Zeroes the first `entries` elements, of `value_size` bytes each, of the
/// array `fd`.
pub fn zero_array(fd: RawFd, entries: u32, value_size: usize) -> io::Result<()> {
    let keys: Vec<u32> = (0..entries).collect();
    let values = vec![0u8; entries as usize * value_size];
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: entries,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: the kernel only reads `count` keys and `count` values of
    // the map's value size from the buffers, which outlive the call.
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
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as u32,
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        // ENOENT: a lookup walk reached the end; what it read is valid.
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(err);
        }
    }
    if attr.count != want {
        let what = format!("batch command {cmd} did {} of {want} elements", attr.count);
        return Err(io::Error::other(what));
    }
    Ok(())
}

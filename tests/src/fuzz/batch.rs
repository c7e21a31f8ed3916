//! One `BPF_MAP_LOOKUP_BATCH` syscall that reads a whole per-CPU array of
//! counters, so the fuzzer can read every outcome counter after every
//! packet at the cost of one syscall (aya reads one element per syscall).
//! The only unsafe code of the fuzzer.

use std::{io, os::fd::RawFd};

use lb_common::CounterValue;

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
    // SAFETY: `attr` is a valid `bpf_attr.batch` whose pointers name
    // buffers that live across the call and are large enough for `count`
    // keys (u32) and `count × cpus` values of 16 bytes (a multiple of 8,
    // so the kernel's per-CPU stride is the value size); the kernel writes
    // nothing else.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as u32,
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        // ENOENT: the walk reached the end; the elements read are valid.
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(err);
        }
    }
    if attr.count != entries {
        return Err(io::Error::other(format!(
            "batch lookup returned {} of {entries} counters",
            attr.count
        )));
    }
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

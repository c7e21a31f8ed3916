//! Detaching a pinned XDP link at once: `BPF_LINK_DETACH` on the link
//! opened from its pin. Removing the pin alone frees the link only after
//! an RCU grace period (bpffs frees its inodes that way), so an attachment
//! made right after it (a new link in another mode) could find the old one
//! still holding the interface and fail with `EEXIST`. aya has no detach
//! for a pinned link. Unsafe code of the dataplane, with `batch.rs` and
//! `mmap.rs`.
#![allow(unsafe_code)]

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

/// `BPF_OBJ_GET` and `BPF_LINK_DETACH` (include/uapi/linux/bpf.h, `enum
/// bpf_cmd`).
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_DETACH: libc::c_long = 34;

/// `union bpf_attr` for `BPF_OBJ_GET`, as large as the kernel reads (it
/// checks that bytes past what it knows are zero).
#[repr(C)]
#[derive(Default)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    rest: [u64; 2],
}

/// `union bpf_attr` for `BPF_LINK_DETACH`: `link_fd`, the rest zero.
#[repr(C)]
#[derive(Default)]
struct LinkDetach {
    link_fd: u32,
    pad: u32,
    rest: [u64; 3],
}

/// Detaches the link pinned at `pin` from its interface; the pin stays.
/// A link whose interface is gone already detaches without error.
pub fn detach_pinned(pin: &Path) -> io::Result<()> {
    let path = CString::new(pin.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut get = ObjGet {
        pathname: path.as_ptr() as u64,
        ..ObjGet::default()
    };
    // SAFETY: a valid `bpf_attr` for BPF_OBJ_GET whose path outlives the
    // call.
    let fd = unsafe { bpf(BPF_OBJ_GET, &mut get) }?;
    // SAFETY: the kernel just returned this descriptor, ours alone.
    let link = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut detach = LinkDetach {
        link_fd: u32::try_from(link.as_raw_fd()).map_err(io::Error::other)?,
        ..LinkDetach::default()
    };
    // SAFETY: a valid `bpf_attr` for BPF_LINK_DETACH.
    unsafe { bpf(BPF_LINK_DETACH, &mut detach) }?;
    Ok(())
}

/// One `bpf(2)` command with `attr` as its `union bpf_attr`; its
/// non-negative result (`batch.rs` makes its commands through it too).
///
/// # Safety
/// `attr` must be the `bpf_attr` `cmd` reads, with valid pointers to
/// buffers as large as the command reads or writes.
pub(super) unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i32> {
    // SAFETY: the caller vouches for `attr`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    i32::try_from(ret).map_err(io::Error::other)
}

//! One owner per pin directory: an exclusive `flock(2)` on the directory
//! itself, held for as long as the owner runs.
//!
//! `lbd` locks its instance's pin directory (`<bpffs>/lb/<instance>`) before
//! it touches a pinned map, and keeps the lock until it exits; `lbd
//! teardown` and `lbctl decap attach|detach` lock the directory they change
//! for the time of the change. A second process finds the lock taken and
//! refuses, naming the holder's PID (read from `/proc/locks`). The kernel
//! drops the lock when its holder dies, even by `kill -9`, so a crash never
//! leaves a stale lock behind, and no lock file is ever left on disk:
//! the directory is the lock.
//!
//! This module owns the lock only, not the directory's contents.

use std::{
    fs::{File, TryLockError},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LockError {
    #[error(
        "{what} is already in use by {holder} (lock on {dir}); stop it first, or give this one another {key}"
    )]
    Held {
        what: String,
        holder: Holder,
        dir: String,
        /// What to change to run side by side (`instance`, an interface).
        key: String,
    },
    #[error("cannot lock {dir}")]
    Io {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no BPF file system is mounted at {dir} or above it here (`ip netns exec` mounts its own /sys, which hides it): run the command under `nsenter --net=/run/netns/NAME` instead, or mount one with `mount -t bpf bpf /sys/fs/bpf`"
    )]
    NoBpffs { dir: String },
}

/// Whether the file system holding `dir` (or the nearest mount point
/// above it) is a BPF file system, by `/proc/self/mounts`; `None` when
/// that cannot be read.
pub fn on_bpffs(dir: &Path) -> Option<bool> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            Some((PathBuf::from(point.replace("\\040", " ")), kind == "bpf"))
        })
        .filter(|(point, _)| dir.starts_with(point))
        .max_by_key(|(point, _)| point.components().count())
        .map(|(_, bpf)| bpf)
}

/// Who holds a lock, as far as `/proc/locks` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(pub Option<u32>);

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "process {pid}{}", process_name(pid)),
            None => f.write_str("another process"),
        }
    }
}

/// ` (lbd)` for a live process whose command name is known.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|n| format!(" ({})", n.trim()))
        .unwrap_or_default()
}

/// An exclusive lock on a directory, released when dropped (or when the
/// process dies).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    dir: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and locks it without waiting. `what` and
    /// `key` name the resource and what makes a second one distinct, for
    /// the error.
    pub fn acquire(dir: &Path, what: &str, key: &str) -> Result<DirLock, LockError> {
        let io = |source| LockError::Io {
            dir: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| {
            // Pins live on a bpffs; a directory under /sys/fs/bpf that
            // cannot be made is nearly always a bpffs that is not there.
            if dir.starts_with("/sys/fs/bpf") && on_bpffs(dir) == Some(false) {
                LockError::NoBpffs {
                    dir: dir.display().to_string(),
                }
            } else {
                io(e)
            }
        })?;
        let file = File::open(dir).map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock {
                _file: file,
                dir: dir.into(),
            }),
            Err(TryLockError::WouldBlock) => {
                let meta = file.metadata().map_err(io)?;
                let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
                Err(LockError::Held {
                    what: what.into(),
                    holder: Holder(holder_pid(&locks, meta.dev(), meta.ino())),
                    dir: dir.display().to_string(),
                    key: key.into(),
                })
            }
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The PID holding a `FLOCK` on the file `(dev, ino)` in `/proc/locks`
/// text: lines like `1: FLOCK  ADVISORY  WRITE 1234 00:27:184046 0 EOF`,
/// the device as hex `major:minor`.
pub fn holder_pid(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc_major(dev), libc_minor(dev));
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "->" marks a waiter, which shifts the fields by one.
        let f = if f.get(1) == Some(&"->") {
            &f[1..]
        } else {
            &f[..]
        };
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = f.get(4)?.parse().ok()?;
        let mut id = f.get(5)?.split(':');
        let (ma, mi, i) = (id.next()?, id.next()?, id.next()?);
        let same = u64::from_str_radix(ma, 16).ok()? == major
            && u64::from_str_radix(mi, 16).ok()? == minor
            && i.parse::<u64>().ok()? == ino;
        same.then_some(pid)
    })
}

/// `major(dev)` of glibc's encoding.
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}

/// `minor(dev)` of glibc's encoding.
fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bpffs_is_told_from_other_file_systems() {
        assert_eq!(on_bpffs(Path::new("/proc/self/status")), Some(false));
        assert_eq!(on_bpffs(Path::new("/")), Some(false));
        if std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .contains(" /sys/fs/bpf bpf ")
        {
            assert_eq!(on_bpffs(Path::new("/sys/fs/bpf/lb/x/y")), Some(true));
            // `lbd` mounts a bpffs only where this says none is: not over
            // the mount written with a trailing slash.
            assert_eq!(on_bpffs(Path::new("/sys/fs/bpf/")), Some(true));
            assert_eq!(on_bpffs(Path::new("/sys/fs/bpf")), Some(true));
        }
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder() {
        let scratch = crate::scratch::ScratchDir::new("lock");
        let dir = scratch.join("pins");
        let first = DirLock::acquire(&dir, "instance t1", "instance").expect("first lock");
        let err = DirLock::acquire(&dir, "instance t1", "instance").expect_err("second lock");
        let text = err.to_string();
        // flock locks belong to the open file, so even this same process
        // is refused; /proc/locks names it.
        assert!(
            text.contains(&format!("process {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("instance t1 is already in use"), "{text}");
        drop(first);
        let again = DirLock::acquire(&dir, "instance t1", "instance").expect("lock after release");
        assert_eq!(again.dir(), dir);
        drop(again);
    }

    #[test]
    fn proc_locks_lines_are_read_by_device_and_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 00:27:184046 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 10229 00:27:184046 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 999 00:27:184046 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 55 fd:01:184046 0 EOF\n";
        // Device 0x27 (major 0, minor 39).
        assert_eq!(holder_pid(locks, 39, 184_046), Some(10229));
        assert_eq!(holder_pid(locks, 39, 1), None);
        // Device fd:01 is major 253, minor 1.
        let dev = (253u64 << 8) | 1;
        assert_eq!(holder_pid(locks, dev, 184_046), Some(55));
    }
}

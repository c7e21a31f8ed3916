//! Files `lbd` keeps across restarts (the API overlay, revisions), written
//! so that a crash or a full disk never leaves half a file and nothing is
//! readable by other users: a private temporary file beside the target
//! (mode 0600), synced, renamed over the target, the directory synced. A
//! write that fails removes its temporary file; once renamed, the write
//! stands (a directory that cannot be synced is warned about).
//!
//! Owns the write only, not what is written.

use std::{
    io::{self, Write as _},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// The temporary file a write of `path` goes through.
pub fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with `body`, atomically, mode 0600.
pub fn write_private(path: &Path, body: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temporary(path);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A temporary file left by an older version may have other bits.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // The file is replaced now, and the next reader sees the new one: a
    // directory that cannot be synced makes only a power cut's outcome
    // uncertain, so it is said, not taken for a failed write (the caller
    // would undo a change the file already holds).
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!(
            path = %path.display(),
            "written, but its directory could not be synced (a power cut may undo it): {e}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch::ScratchDir;

    fn scratch(name: &str) -> ScratchDir {
        ScratchDir::new(&format!("atomic-{name}"))
    }

    #[test]
    fn the_file_is_private_and_replaced_whole() {
        let dir = scratch("private");
        let path = dir.join("state.json");
        std::fs::write(&path, "old").expect("old file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&path, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!temporary(&path).exists());
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = scratch("failed");
        // The target is a non-empty directory: the rename fails.
        let path = dir.join("state.json");
        std::fs::create_dir_all(path.join("inside")).expect("blocker");
        assert!(write_private(&path, b"x").is_err());
        assert!(!temporary(&path).exists(), "temporary file left behind");
    }
}

//! Operations, tested for real: the systemd unit (`scripts/lbd.service`,
//! [`service`]), the backend set-up script (`scripts/lb-backend-setup`,
//! [`backend_setup`]), the Debian package (`cargo xtask package`,
//! [`package`]) and `lbctl`'s shell completion ([`completion`]). Needs
//! root (namespace rigs, XDP, `dpkg --root`) and the tools `cargo xtask
//! setup` installs (systemd-analyze, setpriv, dpkg-deb, dpkg-shlibdeps,
//! shellcheck, zsh, fish); a missing tool fails the test that needs it,
//! saying which.
//!
//! Tests run one at a time (rigs share the machine's two cores).

mod backend_setup;
mod completion;
mod package;
mod service;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail};
use lb_tests::netns::unique;

/// A file of the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Runs `cmd`; its output whatever its exit status. A program that is
/// not installed is an error naming the Debian package it comes from.
pub fn output(cmd: &mut Command, package: &str) -> Result<Output> {
    cmd.output().with_context(|| {
        format!(
            "cannot run {:?} (Debian package {package}; `cargo xtask setup` installs it)",
            cmd.get_program()
        )
    })
}

/// Runs `cmd` and returns its standard output; fails with its standard
/// error unless it succeeds.
pub fn stdout(cmd: &mut Command, package: &str) -> Result<String> {
    let out = output(cmd, package)?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A scratch directory, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(unique(&format!("lbops-{what}-")));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

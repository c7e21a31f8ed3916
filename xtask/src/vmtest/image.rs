//! The virtual machine's disk: a Debian 12 (bookworm) root made with
//! `debootstrap`, holding Debian's own kernels — bookworm's 6.1,
//! trixie's 6.12 and bullseye's 5.10, each installed through apt so that
//! its initramfs is built by the guest's own tools — systemd as PID 1,
//! and the tools the tests run. Built once and cached (`LB_VMTEST_CACHE`, default
//! `/var/cache/lb-vmtest`) under a name derived from the recipe below, so
//! a change of the recipe builds a new one; each run boots a throwaway
//! qcow2 overlay of it, never the image itself.
//!
//! Why a debootstrap image rather than virtme-ng or the host's root
//! shared read-only: the systemd checks install a package, enable a unit
//! and remove the package again, which needs a root of its own with
//! systemd as PID 1 and Debian's userland (the one the package targets);
//! virtme-ng is not packaged for Debian 12. The checkout is shared into
//! the guest read-only over 9p at its own path, so the test binaries built
//! on the host run there unchanged (same Debian 12 libc).

use std::{
    hash::{Hash as _, Hasher as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{capture, run};

/// The suite the root (and its own kernel, 6.1) comes from.
const SUITE: &str = "bookworm";
/// Kernels from other suites, installed in the same root: Debian 13's
/// 6.12, and Debian 11's 5.10 (older than any kernel lb promises: it
/// tells what an older verifier makes of the programs).
const OTHER_KERNELS: &[(&str, &str)] = &[("6.12", "trixie"), ("5.10", "bullseye")];
const MIRROR: &str = "http://deb.debian.org/debian";

/// Packages in the guest: systemd as init (with dbus for
/// `systemd-analyze security`), Debian 12's kernel, and what the rigs and
/// the systemd checks run.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "initramfs-tools",
    "linux-image-amd64",
    "iproute2",
    "procps",
    "nftables",
    "ethtool",
    "util-linux",
    "iputils-ping",
    "tcpdump",
    "bird2",
];

/// The unit that runs the job the host left in the output share, then
/// powers the machine off.
const JOB_UNIT: &str = "\
[Unit]
Description=lb test job (cargo xtask vmtest)
After=local-fs.target systemd-modules-load.service dbus.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/lb-vmtest-run
TimeoutStartSec=infinity
StandardOutput=journal+console
# Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (5.10 here).
LimitMEMLOCK=infinity

[Install]
WantedBy=multi-user.target
";

/// Mounts the two 9p shares (the checkout, read-only, at the path the
/// kernel command line names; the output directory), runs `job.sh`, and
/// powers off whatever happened.
const RUNNER: &str = r#"#!/bin/sh
set -u
src=$(sed -n 's/.*lb\.src=\([^ ]*\).*/\1/p' /proc/cmdline)
modprobe 9pnet_virtio && modprobe 9p
mkdir -p /lb/out "$src"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 lbout /lb/out
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro,cache=loose lbsrc "$src"; then
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
    cd "$src" && bash /lb/out/job.sh > /lb/out/log 2>&1
    echo $? > /lb/out/rc
else
    echo "cannot mount the checkout at $src" > /lb/out/log
    echo 99 > /lb/out/rc
fi
sync
systemctl --no-block poweroff
"#;

/// One kernel of the matrix, as the image holds it.
#[derive(Clone, Debug)]
pub struct BootKernel {
    /// `6.1`, `6.12`.
    pub name: String,
    /// `uname -r` of that kernel.
    pub release: String,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// A built image: the root file system and its kernels.
pub struct Image {
    pub root: PathBuf,
    pub kernels: Vec<BootKernel>,
}

fn cache_dir() -> PathBuf {
    std::env::var_os("LB_VMTEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/lb-vmtest"))
}

/// The image's directory name: changes whenever the recipe does.
fn recipe_id() -> String {
    let mut h = std::hash::DefaultHasher::new();
    (SUITE, OTHER_KERNELS, PACKAGES, JOB_UNIT, RUNNER, 4u32).hash(&mut h);
    format!("{SUITE}-{:016x}", h.finish())
}

/// The cached image, built first if it is not there (under a lock, so two
/// runs never build one image at once).
pub fn ensure() -> Result<Image> {
    let dir = cache_dir().join(recipe_id());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock = std::fs::File::open(&dir)?;
    lock.lock().context("locking the image directory")?;
    if !dir.join("ready").is_file() {
        let started = std::time::Instant::now();
        eprintln!(
            "vmtest: building the guest image in {} (debootstrap, once)",
            dir.display()
        );
        build(&dir)?;
        eprintln!(
            "vmtest: image built in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    read(&dir)
}

fn read(dir: &Path) -> Result<Image> {
    let list = std::fs::read_to_string(dir.join("kernels"))?;
    let kernels = list
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, release)| BootKernel {
            name: name.into(),
            release: release.into(),
            vmlinuz: dir.join(format!("vmlinuz-{name}")),
            initrd: dir.join(format!("initrd-{name}")),
        })
        .collect();
    Ok(Image {
        root: dir.join("root.img"),
        kernels,
    })
}

fn build(dir: &Path) -> Result<()> {
    let root = dir.join("root");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    run(Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&root)
        .arg(MIRROR))?;
    let mut kernels = Vec::new();
    {
        let _mounts = ChrootMounts::new(&root)?;
        for (name, suite) in OTHER_KERNELS {
            kernels.push((*name, install_kernel_from(&root, suite)?));
        }
    }
    configure(&root)?;
    let others: Vec<String> = kernels.iter().map(|(_, r)| r.clone()).collect();
    kernels.insert(0, ("6.1", only_kernel_other_than(&root, &others)?));
    let mut list = String::new();
    for (name, release) in &kernels {
        if !release.starts_with(name) {
            bail!("expected a {name} kernel, the image has {release}");
        }
        std::fs::copy(
            root.join(format!("boot/vmlinuz-{release}")),
            dir.join(format!("vmlinuz-{name}")),
        )?;
        std::fs::copy(
            root.join(format!("boot/initrd.img-{release}")),
            dir.join(format!("initrd-{name}")),
        )?;
        list.push_str(&format!("{name} {release}\n"));
    }
    std::fs::write(dir.join("kernels"), list)?;
    let image = dir.join("root.img");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "lbroot", "-d"])
        .arg(&root)
        .arg(&image)
        .arg("6G"))?;
    std::fs::remove_dir_all(&root)?;
    std::fs::write(dir.join("ready"), "")?;
    Ok(())
}

/// The kernel of `suite` in the bookworm root: `suite` pinned below
/// bookworm so that nothing else comes from it, its kernel package named
/// by its `linux-image-amd64`; the pin removed afterwards. Returns the
/// kernel's release.
fn install_kernel_from(root: &Path, suite: &str) -> Result<String> {
    let list = root.join(format!("etc/apt/sources.list.d/{suite}.list"));
    let pin = root.join(format!("etc/apt/preferences.d/{suite}"));
    std::fs::write(&list, format!("deb {MIRROR} {suite} main\n"))?;
    std::fs::write(
        &pin,
        format!("Package: *\nPin: release n={suite}\nPin-Priority: 100\n"),
    )?;
    run(chroot(root).args(["apt-get", "update", "-q"]))?;
    let depends = capture(chroot(root).args([
        "apt-cache",
        "depends",
        &format!("linux-image-amd64/{suite}"),
    ]))?;
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .with_context(|| format!("no kernel in {suite}'s linux-image-amd64: {depends}"))?
        .to_string();
    run(chroot(root)
        .args(["apt-get", "install", "-y", "-q", "--no-install-recommends"])
        .arg(&package)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    std::fs::remove_file(&list)?;
    std::fs::remove_file(&pin)?;
    run(chroot(root).args(["apt-get", "update", "-q"]))?;
    run(chroot(root).args(["apt-get", "clean"]))?;
    Ok(package.trim_start_matches("linux-image-").to_string())
}

/// The one kernel release in `/boot` that is none of `known`.
fn only_kernel_other_than(root: &Path, known: &[String]) -> Result<String> {
    let mut others = Vec::new();
    for entry in std::fs::read_dir(root.join("boot"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(release) = name.strip_prefix("vmlinuz-")
            && !known.iter().any(|k| k == release)
        {
            others.push(release.to_string());
        }
    }
    match others.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("expected one bookworm kernel in the image, found {others:?}"),
    }
}

/// Host name, root file system, the job unit and its runner.
fn configure(root: &Path) -> Result<()> {
    std::fs::write(root.join("etc/hostname"), "lbvm\n")?;
    std::fs::write(
        root.join("etc/fstab"),
        "/dev/vda / ext4 rw,errors=remount-ro 0 1\n",
    )?;
    let runner = root.join("usr/local/sbin/lb-vmtest-run");
    std::fs::create_dir_all(runner.parent().context("sbin")?)?;
    std::fs::write(&runner, RUNNER)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755))?;
    let unit_dir = root.join("etc/systemd/system");
    std::fs::write(unit_dir.join("lb-vmtest.service"), JOB_UNIT)?;
    let wants = unit_dir.join("multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/lb-vmtest.service",
        wants.join("lb-vmtest.service"),
    )?;
    Ok(())
}

fn chroot(root: &Path) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root);
    c
}

/// /proc, /sys and /dev inside the chroot while apt runs there; unmounted
/// on drop.
struct ChrootMounts {
    points: Vec<PathBuf>,
}

impl ChrootMounts {
    fn new(root: &Path) -> Result<ChrootMounts> {
        let mut mounts = ChrootMounts { points: Vec::new() };
        for (fs, point) in [("proc", "proc"), ("sysfs", "sys"), ("devtmpfs", "dev")] {
            let at = root.join(point);
            run(Command::new("mount").args(["-t", fs, fs]).arg(&at))?;
            mounts.points.push(at);
        }
        Ok(mounts)
    }
}

impl Drop for ChrootMounts {
    fn drop(&mut self) {
        for point in self.points.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
    }
}

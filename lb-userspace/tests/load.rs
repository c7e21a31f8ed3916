//! Every program lb ships passes this kernel's verifier: `lb_xdp`,
//! `lb_xdp_trace` (verified by `lbd` on a thread of its own once it
//! serves, swapped in while `lbctl trace` runs), `lb_probe_encap` (TC egress, health probes through the
//! tunnel) and `lb_decap` (the backends'). `cargo xtask vmtest` runs this
//! first on each kernel of its matrix (Debian 12's 6.1, Debian 13's
//! 6.12); a refusal fails with the verifier's verdict, the failing
//! instruction and the log's last lines (`lb::dataplane::verifier`).

mod common;

use aya::programs::{
    Xdp, XdpMode,
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
};
use lb::{
    dataplane::{
        Dataplane as _, DataplaneError, KernelDataplane, Layout, Rejection, kernel_release,
    },
    decap::{Decap, DecapError},
};

fn layout() -> Layout {
    Layout {
        table_size: 4099,
        max_vips: 16,
        max_backends: 64,
        ct_buckets: 1 << 12,
        table_pool: 0,
        second_chance_vips: 2,
    }
}

/// The verifier's refusal in full (its summary, then the whole log on
/// stderr for the test's output), or any other failure as it is.
fn explain(rejection: Option<&Rejection>, other: &dyn std::fmt::Display) -> String {
    match rejection {
        Some(r) => {
            eprintln!("the whole verifier log of {}:\n{}", r.program, r.log);
            format!("{r}")
        }
        None => format!("{other}"),
    }
}

fn balancer() -> KernelDataplane {
    common::require_root("datapath");
    eprintln!("kernel {}", kernel_release());
    match KernelDataplane::load(layout()) {
        Ok(dp) => dp,
        Err(e) => {
            let rejection = match &e {
                DataplaneError::Verifier(r) => Some(&**r),
                _ => None,
            };
            panic!("{}", explain(rejection, &e))
        }
    }
}

/// The kernel's verifier refuses a program once it has gone through a
/// million instructions (`BPF_COMPLEXITY_LIMIT_INSNS`).
const VERIFIER_LIMIT: u32 = 1_000_000;

/// Prints how many instructions this kernel's verifier went through to
/// accept the loaded program `name` (`bpf_prog_info.verified_insns`, Linux
/// ≥ 5.16), against its limit: a program creeping towards the limit on
/// the oldest kernel shows here before that kernel refuses it (a change to
/// the IPv6 parser's shape alone once took `lb_xdp_trace` over it on 6.1).
/// The step runs with `--nocapture`, so the figures are in every log.
fn report_verified(name: &str) {
    let count = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(name))
        .filter_map(|p| p.verified_instruction_count())
        .max()
        .unwrap_or_else(|| panic!("{name} is loaded, with a verified instruction count"));
    println!(
        "verifier: {name} took {count} instructions on {}, {:.1}% of the limit",
        kernel_release(),
        f64::from(count) * 100.0 / f64::from(VERIFIER_LIMIT)
    );
}

/// `lb_xdp` and `lb_probe_encap` load together (one object).
#[test]
fn lb_xdp_and_lb_probe_encap_load() {
    let mut dp = balancer();
    let _ = dp.program();
    let _ = dp.probe_encap();
    report_verified("lb_xdp");
    report_verified("lb_probe_encap");
}

/// Pins of a test under `/sys/fs/bpf`, removed when dropped (also when
/// the test fails).
struct Pins(std::path::PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `lb_xdp_trace` as `lbd` loads it: verified apart, on the maps a
/// dataplane pinned, then swapped in and out.
#[test]
fn lb_xdp_trace_loads() {
    common::require_root("datapath");
    let pins = Pins(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/lb-load-test-{}",
        std::process::id()
    )));
    let (mut dp, _) = KernelDataplane::open_pinned(layout(), &pins.0).expect("lb_xdp loads");
    match KernelDataplane::verify_traced(layout(), &pins.0) {
        Ok(traced) => dp.adopt_traced(traced),
        Err(e) => {
            let rejection = match &e {
                DataplaneError::Verifier(r) => Some(&**r),
                _ => None,
            };
            panic!("{}", explain(rejection, &e));
        }
    }
    report_verified("lb_xdp_trace");
    dp.select_program(true).expect("the traced build swaps in");
    dp.select_program(false).expect("and out");
}

/// `lbd` starting on keyed maps asks whether the program attached before
/// it reads their key (`links_without_ct_key`): an older version's does
/// not (a downgrade), and placed IPv6 flows by the unkeyed hash. The
/// programs this version attached are recorded by pins, which answer
/// without `CAP_SYS_ADMIN`; others' maps are listed only with it.
#[test]
fn a_link_whose_program_does_not_read_the_pinned_key_is_named() {
    common::require_root("datapath");
    common::in_private_netns(|| {
        common::ip_cmd("link add ckk-a type veth peer name ckk-b");
        common::ip_cmd("link set ckk-a up");
        common::ip_cmd("link set ckk-b up");
        let pins = Pins(std::path::PathBuf::from(format!(
            "/sys/fs/bpf/lb-load-test-ct-key-{}",
            std::process::id()
        )));
        let dir = pins.0.as_path();
        let named =
            || KernelDataplane::links_without_ct_key(dir).expect("root may list a program's maps");
        // Without CAP_SYS_ADMIN, as under lbd.service.
        let unprivileged = || {
            std::thread::scope(|s| {
                s.spawn(|| {
                    drop_cap_sys_admin();
                    KernelDataplane::links_without_ct_key(dir)
                })
                .join()
                .expect("the unprivileged thread")
            })
        };
        let (mut dp, _) = KernelDataplane::open_pinned(layout(), dir).expect("lb_xdp loads");
        assert!(named().is_empty(), "no link yet");
        dp.attach("ckk-a", XdpMode::Skb, dir, false)
            .expect("attach");
        assert!(named().is_empty(), "this lbd's program reads the key");
        assert_eq!(
            unprivileged(),
            Some(vec![]),
            "and is recorded as this version's"
        );
        // A program with no maps at all, as an older version's reads no
        // LB_CT_KEY, put into the pinned link (and not recorded).
        let mut bench = aya::Ebpf::load(lb::objects::LB_BENCH).expect("the bench object");
        let pass: &mut Xdp = bench
            .program_mut("bench_pass")
            .expect("bench_pass")
            .try_into()
            .expect("an XDP program");
        pass.load().expect("bench_pass loads");
        pass.attach_to_link(pinned_link(dir))
            .expect("replaced in the link");
        assert_eq!(named(), ["ckk-a"]);
        assert_eq!(
            unprivileged(),
            Some(vec!["ckk-a".to_string()]),
            "not recorded"
        );
        // Another balancer's program, on an LB_CT_KEY of its own.
        let mut other = balancer();
        other
            .program()
            .attach_to_link(pinned_link(dir))
            .expect("replaced in the link");
        assert_eq!(named(), ["ckk-a"]);
        // Nothing recorded (the first start of this version): without the
        // capability, no answer rather than a guess; with it, the maps.
        for record in records(dir) {
            std::fs::remove_file(record).expect("remove a record");
        }
        assert_eq!(unprivileged(), None);
        assert_eq!(named(), ["ckk-a"]);
        dp.attach("ckk-a", XdpMode::Skb, dir, false).expect("back");
        assert!(named().is_empty());
        assert_eq!(unprivileged(), Some(vec![]));
        // A restart (another lbd of this version on the same pins) that
        // gives ckk-a its program and stops before ckk-b: ckk-b's program,
        // the first lbd's, is still recorded.
        dp.attach("ckk-b", XdpMode::Skb, dir, false)
            .expect("attach ckk-b");
        let (mut restarted, adopted) =
            KernelDataplane::open_pinned(layout(), dir).expect("lb_xdp loads again");
        assert!(adopted);
        restarted
            .attach("ckk-a", XdpMode::Skb, dir, false)
            .expect("attach");
        assert_eq!(records(dir).len(), 2);
        assert_eq!(unprivileged(), Some(vec![]), "a start that stopped halfway");
        // Once every link runs the new program, the old record goes.
        restarted
            .attach("ckk-b", XdpMode::Skb, dir, false)
            .expect("attach ckk-b");
        KernelDataplane::forget_unattached_programs(dir);
        assert_eq!(records(dir).len(), 1);
        drop(dp);
        // A trace swaps the traced build in and records it; a start while
        // it runs (lbd died mid-trace) sees this version's program.
        restarted
            .select_program(true)
            .expect("the traced build swaps in");
        assert_eq!(records(dir).len(), 1, "only the traced build runs");
        assert_eq!(unprivileged(), Some(vec![]));
        restarted.select_program(false).expect("and out");
        assert_eq!(unprivileged(), Some(vec![]));
        KernelDataplane::detach("ckk-b", dir).expect("detach");
        KernelDataplane::detach("ckk-a", dir).expect("detach");
    });
}

/// The records of attached programs under `dir` (`prog-<name>-<id>`).
fn records(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .expect("the pin directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("prog-"))
        .map(|e| e.path())
        .collect()
}

/// The XDP link pinned for `ckk-a` under `dir`.
fn pinned_link(dir: &std::path::Path) -> XdpLink {
    let link = PinnedLink::from_pin(dir.join("link-ckk-a")).expect("the pinned link");
    XdpLink::try_from(FdLink::from(link)).expect("an XDP link")
}

/// Takes `CAP_SYS_ADMIN` out of this thread's effective set (capabilities
/// are per thread: capset(2) changes the caller's only).
fn drop_cap_sys_admin() {
    const CAP_SYS_ADMIN: u32 = 21;
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a version-3 header and the two data words it reads/writes.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_SYS_ADMIN);
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

#[test]
fn lb_decap_loads() {
    common::require_root("datapath");
    match Decap::load() {
        Ok(_loaded) => {
            report_verified("lb_decap");
        }
        Err(e) => {
            let rejection = match &e {
                DecapError::Verifier(r) => Some(&**r),
                _ => None,
            };
            panic!("{}", explain(rejection, &e));
        }
    }
}

//! The real [`Dataplane`]: loads the embedded `lb_xdp` object with aya, sized
//! by a [`Layout`], optionally pinning (or adopting) its maps, and reads and
//! writes the maps with one syscall per element.
//!
//! Every map is taken out of the object and converted to its typed handle
//! once, when the program is loaded or adopted ([`Maps::take`]): a missing
//! map or one of the wrong kind fails the load, never a later write.

use std::{
    os::fd::{AsFd as _, BorrowedFd},
    path::Path,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, IterableMap as _, Map, MapData, PerCpuArray, PerCpuValues},
    programs::{
        SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};
use lb_common::{
    AltChunk, BackendDef, CounterValue, DatapathConfig, FlowBucket, SynCounts, SynSlot, TableChunk,
    TraceFilter, VipFilter, VipKey, VipMeta,
    bfd::BFD_MAX_SESSIONS,
    consts::{
        ALL_MAPS, MAP_ALTERNATES, MAP_BACKEND_STATS, MAP_BACKEND_SYNS, MAP_BACKENDS, MAP_BFD_PEERS,
        MAP_BFD_STATE, MAP_CONFIG, MAP_COUNTERS, MAP_CT_KEY, MAP_FLOWS, MAP_HASH_KEY,
        MAP_QUIC_SERVERS, MAP_SYNS, MAP_TABLES, MAP_TRACE, MAP_TRACE_EVENTS, MAP_VIP_FILTER,
        MAP_VIP_RETIRED, MAP_VIP_STATS, MAP_VIPS, PROG_LB, PROG_LB_TRACE, PROG_PROBE_ENCAP,
        SYN_SLOTS, TABLE_CHUNK_SLOTS, TRACE_RING_BYTES,
    },
    counters::COUNTER_SLOTS,
    quic::QuicServerKey,
};

use super::{AltSlot, Counters, Dataplane, DataplaneError, Layout, Result};
use crate::objects;

pub struct KernelDataplane {
    ebpf: Ebpf,
    maps: Maps,
    layout: Layout,
    /// The pinned links of the interfaces `attach` attached, for swapping
    /// the traced program in and out.
    links: Vec<std::path::PathBuf>,
    /// `lb_xdp_trace` verified apart ([`KernelDataplane::verify_traced`]).
    traced: Option<Ebpf>,
    /// That verification runs ([`KernelDataplane::verifying_traced`]).
    traced_pending: bool,
    /// The links run the traced program (a trace is on): a link attached
    /// afresh meanwhile gets it too.
    tracing: bool,
}

/// Why the maps of a link's program could not be read.
enum LinkMaps {
    /// The kernel refuses to look a program up by its id without
    /// `CAP_SYS_ADMIN`.
    NotPermitted,
    Unreadable(String),
}

/// The ids of the maps program `id` uses.
fn program_map_ids(id: u32) -> std::result::Result<Vec<u32>, LinkMaps> {
    let unreadable = |e: &dyn std::fmt::Display| LinkMaps::Unreadable(e.to_string());
    let refused = |e: &aya::programs::ProgramError| match e {
        aya::programs::ProgramError::SyscallError(s)
            if s.io_error.raw_os_error() == Some(libc::EPERM) =>
        {
            LinkMaps::NotPermitted
        }
        other => unreadable(other),
    };
    // Another program that goes away meanwhile is skipped; a refusal for
    // want of the capability is a refusal for every program.
    for prog in aya::programs::loaded_programs() {
        match prog {
            Ok(prog) if prog.id() == id => {
                return prog
                    .map_ids()
                    .map_err(|e| refused(&e))?
                    .ok_or_else(|| unreadable(&"the kernel does not list a program's maps"));
            }
            Err(e) if matches!(refused(&e), LinkMaps::NotPermitted) => {
                return Err(LinkMaps::NotPermitted);
            }
            _ => {}
        }
    }
    Err(unreadable(&format!("program {id} is gone")))
}

/// Where [`record_program`] pins program `name` of id `id` under the pin
/// directory `dir`: one record per program, so that a link still running
/// an earlier `lbd`'s program of this version (a start that died between
/// two links) stays recognised.
fn program_pin(dir: &Path, name: &str, id: u32) -> std::path::PathBuf {
    dir.join(format!("{PROGRAM_RECORD}{name}-{id}"))
}

/// The prefix of [`KernelDataplane::link_pin`]'s names.
const LINK_PIN: &str = "link-";

/// The prefix of [`program_pin`]'s names.
const PROGRAM_RECORD: &str = "prog-";

/// Records, before it goes into a link pinned in `dir`, that this version
/// puts `prog` (program `name`) there: a pin of the program beside the
/// links ([`KernelDataplane::links_without_ct_key`] reads them at the next
/// start; [`KernelDataplane::forget_unattached_programs`] removes those no
/// link runs). A record that cannot be written is only warned about: it
/// serves that check alone.
fn record_program(prog: &mut Xdp, name: &str, dir: &Path) {
    let id = match prog.info() {
        Ok(info) => info.id(),
        Err(e) => {
            tracing::warn!(name, "cannot record the attached program: {e}");
            return;
        }
    };
    let path = program_pin(dir, name, id);
    if path.exists() {
        return;
    }
    if let Err(e) = prog.pin(&path) {
        tracing::warn!(path = %path.display(), "cannot record the attached program: {e}");
    }
}

/// The records under `dir` ([`record_program`]): each pin's path and the
/// id of the program it holds.
fn program_records(dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(PROGRAM_RECORD))
        .filter_map(|e| {
            let info = aya::programs::ProgramInfo::from_pin(e.path()).ok()?;
            Some((e.path(), info.id()))
        })
        .collect()
}

/// Per-CPU counters, one [`CounterValue`] per CPU and index.
type Counts = PerCpuArray<MapData, CounterValue>;

/// The program's maps as typed handles, taken once at load.
struct Maps {
    config: Array<MapData, DatapathConfig>,
    vips: HashMap<MapData, VipKey, VipMeta>,
    backends: Array<MapData, BackendDef>,
    tables: Array<MapData, TableChunk>,
    flows: Array<MapData, FlowBucket>,
    counters: Counts,
    vip_stats: Counts,
    backend_stats: Counts,
    vip_filter: Array<MapData, VipFilter>,
    /// Absent in builds before tracing (a benchmark's baseline object).
    trace: Option<Array<MapData, TraceFilter>>,
    /// Absent in builds before passive health (the same).
    backend_syns: Option<PerCpuArray<MapData, SynCounts>>,
    /// Absent in builds before SYNs were kept apart (the same).
    syns: Option<Array<MapData, SynSlot>>,
    /// Absent in builds that counted forwarded packets per VIP too.
    vip_retired: Option<Array<MapData, CounterValue>>,
    /// Absent in builds before second chance (likewise).
    alternates: Option<Array<MapData, AltChunk>>,
    /// Absent in builds before hash keys (likewise).
    hash_key: Option<Array<MapData, lb_common::HashKey>>,
    /// Absent in builds before QUIC routing (likewise).
    quic: Option<HashMap<MapData, QuicServerKey, u32>>,
    /// Absent in builds before the keyed IPv6 connection-table hash
    /// (likewise).
    ct_key: Option<Array<MapData, lb_common::CtKey>>,
}

impl Maps {
    /// Takes every map out of `ebpf` as its typed handle.
    fn take(ebpf: &mut Ebpf) -> Result<Self> {
        fn typed<M: TryFrom<Map, Error = aya::maps::MapError>>(
            ebpf: &mut Ebpf,
            name: &'static str,
        ) -> Result<M> {
            let map = ebpf
                .take_map(name)
                .ok_or(DataplaneError::MissingMap(name))?;
            M::try_from(map).map_err(map_err(name))
        }
        /// A map older objects lack (a benchmark's baseline build).
        fn optional<M: TryFrom<Map, Error = aya::maps::MapError>>(
            ebpf: &mut Ebpf,
            name: &'static str,
        ) -> Result<Option<M>> {
            match ebpf.map(name) {
                Some(_) => typed(ebpf, name).map(Some),
                None => Ok(None),
            }
        }
        Ok(Self {
            config: typed(ebpf, MAP_CONFIG)?,
            vips: typed(ebpf, MAP_VIPS)?,
            backends: typed(ebpf, MAP_BACKENDS)?,
            tables: typed(ebpf, MAP_TABLES)?,
            flows: typed(ebpf, MAP_FLOWS)?,
            counters: typed(ebpf, MAP_COUNTERS)?,
            vip_stats: typed(ebpf, MAP_VIP_STATS)?,
            backend_stats: typed(ebpf, MAP_BACKEND_STATS)?,
            vip_filter: typed(ebpf, MAP_VIP_FILTER)?,
            trace: optional(ebpf, MAP_TRACE)?,
            backend_syns: optional(ebpf, MAP_BACKEND_SYNS)?,
            syns: optional(ebpf, MAP_SYNS)?,
            vip_retired: optional(ebpf, MAP_VIP_RETIRED)?,
            alternates: optional(ebpf, MAP_ALTERNATES)?,
            hash_key: optional(ebpf, MAP_HASH_KEY)?,
            quic: optional(ebpf, MAP_QUIC_SERVERS)?,
            ct_key: optional(ebpf, MAP_CT_KEY)?,
        })
    }
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> DataplaneError {
    move |e| DataplaneError::Map {
        name,
        source: Box::new(e),
    }
}

/// A program error of `name`; a verifier's refusal as such.
fn prog_err(name: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> DataplaneError {
    move |e| match super::verifier::Rejection::from_error(name, e) {
        Ok(rejection) => DataplaneError::Verifier(Box::new(rejection)),
        Err(e) => DataplaneError::Program {
            name,
            source: Box::new(e),
        },
    }
}

impl KernelDataplane {
    /// Loads the program with fresh, unpinned maps (tests, benchmarks).
    pub fn load(layout: Layout) -> Result<Self> {
        Self::load_with(layout, None)
    }

    /// Loads the program. With `pin_dir`, each map is adopted from
    /// `pin_dir/<map name>` if pinned there, else created and pinned there.
    pub fn load_with(layout: Layout, pin_dir: Option<&Path>) -> Result<Self> {
        Self::load_object(objects::LB_XDP, layout, pin_dir)
    }

    /// Loads `object`, another build of `lb_xdp` with the same maps, in
    /// place of the embedded one: `lb-bench` measures a baseline build
    /// against this one in the same run.
    pub fn load_object(object: &[u8], layout: Layout, pin_dir: Option<&Path>) -> Result<Self> {
        layout.validate()?;
        if object.is_empty() {
            return Err(DataplaneError::NoObjects);
        }
        let mut ebpf = loader(layout, pin_dir)
            .load(object)
            .map_err(|e| DataplaneError::Load(Box::new(e)))?;
        loaded_xdp(&mut ebpf, PROG_LB)?;
        let tc: &mut SchedClassifier = ebpf
            .program_mut(PROG_PROBE_ENCAP)
            .ok_or_else(|| prog_err(PROG_PROBE_ENCAP)(aya::programs::ProgramError::NotLoaded))?
            .try_into()
            .map_err(prog_err(PROG_PROBE_ENCAP))?;
        tc.load().map_err(prog_err(PROG_PROBE_ENCAP))?;
        let maps = Maps::take(&mut ebpf)?;
        Ok(Self {
            ebpf,
            maps,
            layout,
            links: Vec::new(),
            traced: None,
            traced_pending: false,
            tracing: false,
        })
    }

    /// `lb_xdp_trace`, verified apart from this dataplane: the object
    /// loaded again with every map taken from the pins under `pin_dir`
    /// (a dataplane opened there made them), and only the traced program
    /// verified. That takes a minute in an emulated guest (the traced
    /// build is the largest program), so `lbd` runs it on a thread of its
    /// own once it serves, and hands the result to [`adopt_traced`](Self::adopt_traced).
    pub fn verify_traced(layout: Layout, pin_dir: &Path) -> Result<TracedProgram> {
        let mut ebpf = loader(layout, Some(pin_dir))
            .load(objects::LB_XDP)
            .map_err(|e| DataplaneError::Load(Box::new(e)))?;
        loaded_xdp(&mut ebpf, PROG_LB_TRACE)?;
        Ok(TracedProgram { ebpf })
    }

    /// Takes a traced program [`verify_traced`](Self::verify_traced) made
    /// for this dataplane's pins: `lbctl trace` then swaps it in without
    /// running the verifier.
    pub fn adopt_traced(&mut self, traced: TracedProgram) {
        self.traced = Some(traced.ebpf);
        self.traced_pending = false;
    }

    /// Says that [`verify_traced`](Self::verify_traced) runs for this
    /// dataplane (`true`) or ended without a program (`false`: a trace then
    /// verifies it here, and says why it cannot): until then a trace is
    /// refused as not ready ([`Dataplane::tracing_pending`]).
    pub fn verifying_traced(&mut self, running: bool) {
        self.traced_pending = running;
    }
}

/// `lb_xdp_trace` verified on its own ([`KernelDataplane::verify_traced`]).
pub struct TracedProgram {
    ebpf: Ebpf,
}

/// The loader of `lb_xdp`'s object: maps sized by `layout`, and with
/// `pin_dir` each map adopted from `pin_dir/<map name>` if pinned there,
/// else created and pinned there.
fn loader(layout: Layout, pin_dir: Option<&Path>) -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(MAP_VIPS, layout.vip_keys())
        .map_max_entries(MAP_BACKENDS, layout.max_backends)
        .map_max_entries(MAP_TABLES, layout.table_map_entries())
        .map_max_entries(MAP_ALTERNATES, layout.alt_map_entries())
        .map_max_entries(MAP_FLOWS, layout.ct_buckets)
        .map_max_entries(MAP_VIP_STATS, layout.max_vips)
        .map_max_entries(MAP_VIP_RETIRED, layout.max_vips)
        .map_max_entries(MAP_BACKEND_STATS, layout.max_backends)
        .map_max_entries(MAP_BACKEND_SYNS, layout.max_backends)
        .map_max_entries(MAP_QUIC_SERVERS, layout.max_backends);
    if let Some(dir) = pin_dir {
        for name in ALL_MAPS {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    loader
}

/// The XDP program `name` of `ebpf`, loaded (verified) now if it was not
/// yet.
fn loaded_xdp<'e>(ebpf: &'e mut Ebpf, name: &'static str) -> Result<&'e mut Xdp> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| prog_err(name)(aya::programs::ProgramError::NotLoaded))?
        .try_into()
        .map_err(prog_err(name))?;
    if prog.fd().is_err() {
        prog.load().map_err(prog_err(name))?;
    }
    Ok(prog)
}

impl KernelDataplane {
    /// The TC egress program that tunnels health probes sent with a probe
    /// mark (drive it with `TestRun`, or attach it).
    pub fn probe_encap(&mut self) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(PROG_PROBE_ENCAP)
            .expect("loaded in load_with")
            .try_into()
            .expect("a classifier")
    }

    /// Attaches the probe-tunnelling program to `iface`'s egress for as
    /// long as this value lives (probes only run while `lbd` does).
    pub fn attach_probe_encap(&mut self, iface: &str) -> Result<()> {
        // Needed only on kernels without TCX (< 6.6); harmless otherwise.
        let _ = aya::programs::tc::qdisc_add_clsact(iface);
        self.probe_encap()
            .attach(iface, TcAttachType::Egress)
            .map_err(prog_err(PROG_PROBE_ENCAP))?;
        Ok(())
    }

    /// Loads the program with its maps pinned under `dir`, adopting maps a
    /// previous `lbd` pinned there (the connection table and tables carry
    /// on). Returns whether maps were adopted. Pinned maps whose sizes do
    /// not match `layout` are refused with [`DataplaneError::LayoutMismatch`]
    /// rather than silently reused.
    pub fn open_pinned(layout: Layout, dir: &Path) -> Result<(Self, bool)> {
        layout.validate()?;
        let adopted = Self::has_pins(dir);
        if adopted {
            check_pinned_layout(&layout, dir)?;
        }
        std::fs::create_dir_all(dir)?;
        let dp = Self::load_with(layout, Some(dir)).inspect_err(|_| {
            // aya pins each map as it creates it, before the programs are
            // verified: a first load that fails takes its pins back.
            if !adopted {
                for name in ALL_MAPS {
                    let _ = std::fs::remove_file(dir.join(name));
                }
            }
        })?;
        Ok((dp, adopted))
    }

    /// The id of the program the link pinned at `path` runs, if it can be
    /// read.
    pub fn pinned_link_program(path: &Path) -> Option<u32> {
        let pinned = PinnedLink::from_pin(path).ok()?;
        FdLink::from(pinned).info().ok().map(|i| i.program_id())
    }

    /// The interfaces whose link pinned under `dir` runs a program that
    /// does not use the `LB_CT_KEY` pinned there: one an older `lbd`
    /// attached (a downgrade before this start), which placed IPv6 flows by
    /// the unkeyed hash while the maps said keyed (`reconcile::ct_v6`).
    /// Asked before this `lbd` attaches its own.
    ///
    /// A program this version put in a link is recorded by a pin beside
    /// it (`prog-<name>-<id>`, [`record_program`]), which needs no
    /// privilege to read. A link running another program is asked for its maps, which
    /// the kernel lists by a program's id only with `CAP_SYS_ADMIN`
    /// (`lbd.service` does not grant it): without it, such a link is named
    /// if this version recorded its programs (so it was not one of them),
    /// and the answer is `None` (cannot tell) if nothing is recorded (the
    /// first start of this version). A link that cannot be read otherwise
    /// is left out, with a warning; with no key pinned there is nothing to
    /// ask.
    pub fn links_without_ct_key(dir: &Path) -> Option<Vec<String>> {
        let Ok(key) = aya::maps::MapInfo::from_pin(dir.join(MAP_CT_KEY)) else {
            return Some(Vec::new());
        };
        let key = key.id();
        let recorded: Vec<u32> = program_records(dir).into_iter().map(|(_, id)| id).collect();
        let mut named = Vec::new();
        for (iface, id) in Self::linked_programs(dir) {
            let Some(id) = id else {
                tracing::warn!(iface, "cannot read the program of the pinned link");
                continue;
            };
            if recorded.contains(&id) {
                continue;
            }
            match program_map_ids(id) {
                Ok(ids) if !ids.contains(&key) => named.push(iface),
                Ok(_) => {}
                Err(LinkMaps::NotPermitted) if recorded.is_empty() => return None,
                Err(LinkMaps::NotPermitted) => named.push(iface),
                Err(LinkMaps::Unreadable(e)) => {
                    tracing::warn!(iface, "cannot read the maps of the attached program: {e}");
                }
            }
        }
        Some(named)
    }

    /// Removes the records ([`record_program`]) of programs that no link
    /// pinned under `dir` runs: called once every link was given this
    /// `lbd`'s program (and after a trace swap), so that a record never
    /// keeps an old program loaded for long.
    pub fn forget_unattached_programs(dir: &Path) {
        let running: Vec<u32> = Self::linked_programs(dir)
            .into_iter()
            .filter_map(|(_, id)| id)
            .collect();
        for (path, id) in program_records(dir) {
            if !running.contains(&id) {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Whether `dir` holds the pins of an earlier `lbd` (its config map).
    pub fn has_pins(dir: &Path) -> bool {
        dir.join(MAP_CONFIG).exists()
    }

    /// Attaches the program to `iface` through a bpf_link pinned at
    /// `dir/link-<iface>`, so it stays attached when `lbd` exits. If that
    /// link exists (a previous `lbd`), the program in it is replaced
    /// atomically instead: no packet goes unprocessed; with `afresh`, that
    /// link is dropped and a new one made (it lost its interface, or is in
    /// the wrong mode). Returns whether the attachment was adopted.
    pub fn attach(&mut self, iface: &str, mode: XdpMode, dir: &Path, afresh: bool) -> Result<bool> {
        let path = Self::link_pin(dir, iface);
        // Listed (for trace swaps) only once attached: a link that failed
        // to attach would make every later swap fail at it.
        self.links.retain(|l| *l != path);
        if afresh {
            Self::detach(iface, dir)?;
        }
        if path.exists() {
            Self::replace_in_link(self.program(), PROG_LB, &path)?;
            self.links.push(path);
            return Ok(true);
        }
        self.attach_new(iface, mode, &path)?;
        self.links.push(path);
        Ok(false)
    }

    /// A new link of the program in force (the traced one while a trace
    /// runs) on `iface`, pinned at `path`.
    fn attach_new(&mut self, iface: &str, mode: XdpMode, path: &Path) -> Result<()> {
        let (ebpf, name) = match (self.tracing, &mut self.traced) {
            (true, Some(traced)) => (traced, PROG_LB_TRACE),
            _ => (&mut self.ebpf, PROG_LB),
        };
        let prog = loaded_xdp(ebpf, name)?;
        if let Some(dir) = path.parent() {
            record_program(prog, name, dir);
        }
        let id = prog.attach(iface, mode).map_err(prog_err(name))?;
        let link = prog.take_link(id).map_err(prog_err(name))?;
        let fd_link = FdLink::try_from(link).map_err(|e| {
            DataplaneError::Io(std::io::Error::other(format!(
                "attached to {iface} without a bpf_link ({e}); the kernel is too old to keep the program attached across restarts"
            )))
        })?;
        fd_link.pin(path).map_err(|e| {
            DataplaneError::Io(std::io::Error::other(format!(
                "pinning the XDP link at {}: {e}",
                path.display()
            )))
        })?;
        Ok(())
    }

    /// Records `prog` (program `name`, [`record_program`]) and makes the
    /// pinned link at `path` run it, atomically: no packet goes
    /// unprocessed.
    fn replace_in_link(prog: &mut Xdp, name: &'static str, path: &Path) -> Result<()> {
        let pinned = PinnedLink::from_pin(path).map_err(|e| {
            DataplaneError::Io(std::io::Error::other(format!(
                "opening pinned link {}: {e}",
                path.display()
            )))
        })?;
        let link = XdpLink::try_from(FdLink::from(pinned)).map_err(|e| {
            DataplaneError::Io(std::io::Error::other(format!(
                "{} is not an XDP link: {e}",
                path.display()
            )))
        })?;
        if let Some(dir) = path.parent() {
            record_program(prog, name, dir);
        }
        prog.attach_to_link(link).map_err(prog_err(name))?;
        Ok(())
    }

    /// Where the link of `iface` is pinned under the pin directory `dir`.
    pub fn link_pin(dir: &Path, iface: &str) -> std::path::PathBuf {
        dir.join(format!("{LINK_PIN}{iface}"))
    }

    /// Each link pinned under `dir`: its interface and the id of the
    /// program it runs (`None`: the link cannot be read).
    fn linked_programs(dir: &Path) -> Vec<(String, Option<u32>)> {
        Self::pinned_links(dir)
            .into_iter()
            .map(|iface| {
                let id = Self::pinned_link_program(&Self::link_pin(dir, &iface));
                (iface, id)
            })
            .collect()
    }

    /// The interfaces that have a link pinned under `dir`.
    pub fn pinned_links(dir: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix(LINK_PIN).map(str::to_string)
            })
            .collect();
        names.sort();
        names
    }

    /// Detaches from `iface` (at once: [`super::link`]) and removes the
    /// pinned link. Idempotent.
    pub fn detach(iface: &str, dir: &Path) -> Result<()> {
        let pin = Self::link_pin(dir, iface);
        match super::link::detach_pinned(&pin) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                // Not a link, or not ours to open: removing the pin is
                // what is left.
                tracing::warn!(pin = %pin.display(), "detaching the pinned link failed: {e}");
            }
            _ => {}
        }
        match std::fs::remove_file(&pin) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The BFD maps of the loaded object, once (`None` after that), for a
    /// `lb::bfd::KernelBfdTable` in tests: `lbd` opens them from the pins.
    pub fn take_bfd_maps(&mut self) -> Option<(Map, Map)> {
        Some((
            self.ebpf.take_map(MAP_BFD_PEERS)?,
            self.ebpf.take_map(MAP_BFD_STATE)?,
        ))
    }

    /// The loaded `lb_xdp` program (attach it, or drive it with `TestRun`).
    pub fn program(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROG_LB)
            .expect("loaded in load_with")
            .try_into()
            .expect("an XDP program")
    }

    /// The connection table's file descriptor, for batch syscalls (the
    /// fuzzer empties it in one).
    pub fn flows_fd(&self) -> BorrowedFd<'_> {
        self.maps.flows.map().fd().as_fd()
    }

    /// The outcome counters' file descriptor, for batch lookups.
    pub fn counters_fd(&self) -> BorrowedFd<'_> {
        self.maps.counters.map().fd().as_fd()
    }
}

/// The table size of every VIP in the maps pinned under `dir` (by a
/// running or a previous `lbd`), read without loading anything; `None`
/// when nothing is pinned there. `lbd check` compares them with a file.
pub fn pinned_table_sizes(dir: &Path) -> Result<Option<Vec<(VipKey, u32)>>> {
    let (vips, config) = (dir.join(MAP_VIPS), dir.join(MAP_CONFIG));
    if !vips.exists() || !config.exists() {
        return Ok(None);
    }
    let open = |path: &Path, name: &'static str| {
        MapData::from_pin(path)
            .and_then(Map::from_map_data)
            .map_err(map_err(name))
    };
    let cfg: Array<MapData, DatapathConfig> =
        Array::try_from(open(&config, MAP_CONFIG)?).map_err(map_err(MAP_CONFIG))?;
    let global = cfg.get(&0, 0).map_err(map_err(MAP_CONFIG))?.table_size;
    let map: HashMap<MapData, VipKey, VipMeta> =
        HashMap::try_from(open(&vips, MAP_VIPS)?).map_err(map_err(MAP_VIPS))?;
    let mut sizes = Vec::new();
    for entry in map.iter() {
        let (key, meta) = entry.map_err(map_err(MAP_VIPS))?;
        sizes.push((key, meta.maglev_size(global)));
    }
    Ok(Some(sizes))
}

fn add_counts(sum: &mut CounterValue, v: &CounterValue) {
    *sum += *v;
}

/// A whole per-CPU array in one batch lookup; `None` if the kernel cannot
/// (then the caller reads element by element).
fn all_per_cpu<T: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    entries: u32,
    add: impl Fn(&mut T, &T),
) -> Option<Vec<T>> {
    let cpus = aya::util::nr_cpus().ok()?;
    match super::batch::read_per_cpu(fd, entries, cpus, add) {
        Ok(values) => Some(values),
        Err(e) => {
            tracing::debug!(error = %e, "batch lookup unavailable; reading element by element");
            None
        }
    }
}

/// Zeroes one index of per-CPU counters.
fn per_cpu_clear(map: &mut Counts, name: &'static str, index: u32) -> Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Io(e))?;
    let zeros =
        PerCpuValues::try_from(vec![CounterValue::default(); cpus]).map_err(DataplaneError::Io)?;
    map.set(index, zeros, 0).map_err(map_err(name))
}

/// One index of per-CPU counters, summed over the CPUs.
fn per_cpu_sum(map: &Counts, name: &'static str, index: u32) -> Result<CounterValue> {
    let values = map.get(&index, 0).map_err(map_err(name))?;
    let mut sum = CounterValue::default();
    for v in values.iter() {
        sum += *v;
    }
    Ok(sum)
}

/// Sizes of each map for `layout`: (name, max entries, value size).
fn expected_maps(layout: &Layout) -> [(&'static str, u32, u32); 20] {
    use std::mem::size_of;
    let v = |n: usize| n as u32;
    [
        (MAP_CONFIG, 1, v(size_of::<lb_common::DatapathConfig>())),
        (MAP_VIPS, layout.vip_keys(), v(size_of::<VipMeta>())),
        (
            MAP_BACKENDS,
            layout.max_backends,
            v(size_of::<BackendDef>()),
        ),
        (
            MAP_TABLES,
            layout.table_map_entries(),
            v(size_of::<TableChunk>()),
        ),
        (MAP_FLOWS, layout.ct_buckets, v(size_of::<FlowBucket>())),
        (MAP_COUNTERS, COUNTER_SLOTS, v(size_of::<CounterValue>())),
        (MAP_VIP_STATS, layout.max_vips, v(size_of::<CounterValue>())),
        (
            MAP_BACKEND_STATS,
            layout.max_backends,
            v(size_of::<CounterValue>()),
        ),
        (MAP_VIP_FILTER, 1, v(size_of::<VipFilter>())),
        (MAP_TRACE, 1, v(size_of::<TraceFilter>())),
        (MAP_TRACE_EVENTS, TRACE_RING_BYTES, 0),
        (
            MAP_BACKEND_SYNS,
            layout.max_backends,
            v(size_of::<SynCounts>()),
        ),
        (MAP_SYNS, SYN_SLOTS, v(size_of::<SynSlot>())),
        (
            MAP_VIP_RETIRED,
            layout.max_vips,
            v(size_of::<CounterValue>()),
        ),
        (
            MAP_ALTERNATES,
            layout.alt_map_entries(),
            v(size_of::<AltChunk>()),
        ),
        (
            MAP_BFD_PEERS,
            BFD_MAX_SESSIONS,
            v(size_of::<lb_common::BfdConfig>()),
        ),
        (
            MAP_BFD_STATE,
            BFD_MAX_SESSIONS,
            v(size_of::<lb_common::BfdState>()),
        ),
        (MAP_HASH_KEY, 1, v(size_of::<lb_common::HashKey>())),
        (MAP_QUIC_SERVERS, layout.max_backends, v(size_of::<u32>())),
        (MAP_CT_KEY, 1, v(size_of::<lb_common::CtKey>())),
    ]
}

fn check_pinned_layout(layout: &Layout, dir: &Path) -> Result<()> {
    for (name, entries, value_size) in expected_maps(layout) {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let info = aya::maps::MapInfo::from_pin(&path).map_err(map_err(name))?;
        if info.max_entries() != entries || info.value_size() != value_size {
            return Err(DataplaneError::LayoutMismatch {
                dir: dir.display().to_string(),
                found: format!(
                    "{name} with {} entries of {} bytes",
                    info.max_entries(),
                    info.value_size()
                ),
                wanted: format!("{entries} entries of {value_size} bytes"),
            });
        }
    }
    Ok(())
}

impl Dataplane for KernelDataplane {
    fn layout(&self) -> Layout {
        self.layout
    }

    fn config(&self) -> Result<DatapathConfig> {
        self.maps.config.get(&0, 0).map_err(map_err(MAP_CONFIG))
    }

    fn set_config(&mut self, cfg: &DatapathConfig) -> Result<()> {
        self.maps.config.set(0, cfg, 0).map_err(map_err(MAP_CONFIG))
    }

    fn hash_key(&self) -> Result<[u64; 2]> {
        match &self.maps.hash_key {
            Some(map) => map.get(&0, 0).map(|k| k.k).map_err(map_err(MAP_HASH_KEY)),
            None => Ok([0; 2]),
        }
    }

    fn set_hash_key(&mut self, key: &[u64; 2]) -> Result<()> {
        let Some(map) = &mut self.maps.hash_key else {
            return Err(DataplaneError::MissingMap(MAP_HASH_KEY));
        };
        map.set(0, lb_common::HashKey { k: *key }, 0)
            .map_err(map_err(MAP_HASH_KEY))
    }

    fn ct_key(&self) -> Result<lb_common::CtKey> {
        match &self.maps.ct_key {
            Some(map) => map.get(&0, 0).map_err(map_err(MAP_CT_KEY)),
            None => Ok(lb_common::CtKey::default()),
        }
    }

    /// A build without `LB_CT_KEY` (a benchmark's baseline object) reads no
    /// key: nothing to write.
    fn set_ct_key(&mut self, key: &lb_common::CtKey) -> Result<()> {
        match &mut self.maps.ct_key {
            Some(map) => map.set(0, key, 0).map_err(map_err(MAP_CT_KEY)),
            None => Ok(()),
        }
    }

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>> {
        self.maps
            .vips
            .iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_VIPS))
    }

    fn vip(&self, key: &VipKey) -> Result<Option<VipMeta>> {
        match self.maps.vips.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(MAP_VIPS)(e)),
        }
    }

    fn upsert_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<()> {
        self.maps
            .vips
            .insert(key, meta, 0)
            .map_err(map_err(MAP_VIPS))
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<()> {
        match self.maps.vips.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(MAP_VIPS)(e)),
        }
    }

    fn backend(&self, index: u32) -> Result<BackendDef> {
        self.maps
            .backends
            .get(&index, 0)
            .map_err(map_err(MAP_BACKENDS))
    }

    fn all_backends(&self) -> Result<Vec<BackendDef>> {
        let fd = self.maps.backends.map().fd().as_fd();
        match super::batch::read_per_cpu(fd, self.layout.max_backends, 1, |sum, v| *sum = *v) {
            Ok(all) => Ok(all),
            Err(e) => {
                tracing::debug!(error = %e, "batch lookup unavailable; reading element by element");
                (0..self.layout.max_backends)
                    .map(|i| self.backend(i))
                    .collect()
            }
        }
    }

    fn set_backend(&mut self, index: u32, def: &BackendDef) -> Result<()> {
        self.maps
            .backends
            .set(index, def, 0)
            .map_err(map_err(MAP_BACKENDS))
    }

    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, u32)>> {
        let Some(map) = &self.maps.quic else {
            return Ok(Vec::new());
        };
        map.iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_QUIC_SERVERS))
    }

    fn set_quic_server(&mut self, key: &QuicServerKey, handle: u32) -> Result<()> {
        let Some(map) = &mut self.maps.quic else {
            return Err(DataplaneError::MissingMap(MAP_QUIC_SERVERS));
        };
        map.insert(key, handle, 0)
            .map_err(map_err(MAP_QUIC_SERVERS))
    }

    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<()> {
        let Some(map) = &mut self.maps.quic else {
            return Ok(());
        };
        match map.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(MAP_QUIC_SERVERS)(e)),
        }
    }

    fn write_table(&mut self, base: u32, slots: &[u32]) -> Result<()> {
        let map = &mut self.maps.tables;
        let mut chunk = Box::new(TableChunk::default());
        for (i, part) in slots.chunks(TABLE_CHUNK_SLOTS as usize).enumerate() {
            chunk.slots[..part.len()].copy_from_slice(part);
            chunk.slots[part.len()..].fill(0);
            map.set(base + i as u32, *chunk, 0)
                .map_err(map_err(MAP_TABLES))?;
        }
        Ok(())
    }

    fn read_table(&self, base: u32, len: u32) -> Result<Vec<u32>> {
        let map = &self.maps.tables;
        let mut out = Vec::with_capacity(len as usize);
        let mut index = base;
        while out.len() < len as usize {
            let chunk = map.get(&index, 0).map_err(map_err(MAP_TABLES))?;
            let want = (len as usize - out.len()).min(TABLE_CHUNK_SLOTS as usize);
            out.extend_from_slice(&chunk.slots[..want]);
            index += 1;
        }
        Ok(out)
    }

    fn write_alternates(&mut self, base: u32, slots: &[AltSlot]) -> Result<()> {
        let map = self
            .maps
            .alternates
            .as_mut()
            .ok_or(DataplaneError::MissingMap(MAP_ALTERNATES))?;
        let mut chunk = Box::new(AltChunk::default());
        for (i, part) in slots.chunks(TABLE_CHUNK_SLOTS as usize).enumerate() {
            chunk.slots[..part.len()].copy_from_slice(part);
            chunk.slots[part.len()..].fill(AltSlot::default());
            map.set(base + i as u32, *chunk, 0)
                .map_err(map_err(MAP_ALTERNATES))?;
        }
        Ok(())
    }

    fn read_alternates(&self, base: u32, len: u32) -> Result<Vec<AltSlot>> {
        let map = self
            .maps
            .alternates
            .as_ref()
            .ok_or(DataplaneError::MissingMap(MAP_ALTERNATES))?;
        let mut out = Vec::with_capacity(len as usize);
        let mut index = base;
        while out.len() < len as usize {
            let chunk = map.get(&index, 0).map_err(map_err(MAP_ALTERNATES))?;
            let want = (len as usize - out.len()).min(TABLE_CHUNK_SLOTS as usize);
            out.extend_from_slice(&chunk.slots[..want]);
            index += 1;
        }
        Ok(out)
    }

    fn counters(&self) -> Result<Counters> {
        (0..COUNTER_SLOTS)
            .map(|i| per_cpu_sum(&self.maps.counters, MAP_COUNTERS, i))
            .collect()
    }

    fn vip_stats(&self, vip_id: u32) -> Result<CounterValue> {
        let mut sum = per_cpu_sum(&self.maps.vip_stats, MAP_VIP_STATS, vip_id)?;
        if let Some(retired) = &self.maps.vip_retired {
            sum += retired.get(&vip_id, 0).map_err(map_err(MAP_VIP_RETIRED))?;
        }
        Ok(sum)
    }

    fn add_vip_retired(&mut self, vip_id: u32, counts: CounterValue) -> Result<()> {
        let Some(retired) = &mut self.maps.vip_retired else {
            return Ok(());
        };
        let mut sum = retired.get(&vip_id, 0).map_err(map_err(MAP_VIP_RETIRED))?;
        sum += counts;
        retired
            .set(vip_id, sum, 0)
            .map_err(map_err(MAP_VIP_RETIRED))
    }

    fn backend_stats(&self, index: u32) -> Result<CounterValue> {
        per_cpu_sum(&self.maps.backend_stats, MAP_BACKEND_STATS, index)
    }

    fn clear_vip_stats(&mut self, vip_id: u32) -> Result<()> {
        per_cpu_clear(&mut self.maps.vip_stats, MAP_VIP_STATS, vip_id)?;
        if let Some(retired) = &mut self.maps.vip_retired {
            retired
                .set(vip_id, CounterValue::default(), 0)
                .map_err(map_err(MAP_VIP_RETIRED))?;
        }
        Ok(())
    }

    fn clear_backend_stats(&mut self, index: u32) -> Result<()> {
        per_cpu_clear(&mut self.maps.backend_stats, MAP_BACKEND_STATS, index)?;
        if let Some(syns) = &mut self.maps.backend_syns {
            let cpus = aya::util::nr_cpus().map_err(|(_, e)| DataplaneError::Io(e))?;
            let zeros = PerCpuValues::try_from(vec![SynCounts::default(); cpus])
                .map_err(DataplaneError::Io)?;
            syns.set(index, zeros, 0)
                .map_err(map_err(MAP_BACKEND_SYNS))?;
        }
        Ok(())
    }

    fn all_vip_stats(&self) -> Result<Vec<CounterValue>> {
        let n = self.layout.max_vips;
        let fd = self.maps.vip_stats.map().fd().as_fd();
        let Some(mut own) = all_per_cpu(fd, n, add_counts) else {
            return (0..n).map(|i| self.vip_stats(i)).collect();
        };
        if let Some(retired) = &self.maps.vip_retired {
            // A plain array reads as a per-CPU one of one CPU.
            let fd = retired.map().fd().as_fd();
            match super::batch::read_per_cpu(fd, n, 1, add_counts) {
                Ok(gone) => own.iter_mut().zip(gone).for_each(|(sum, g)| *sum += g),
                Err(_) => return (0..n).map(|i| self.vip_stats(i)).collect(),
            }
        }
        Ok(own)
    }

    fn all_backend_stats(&self) -> Result<Vec<CounterValue>> {
        let fd = self.maps.backend_stats.map().fd().as_fd();
        all_per_cpu(fd, self.layout.max_backends, add_counts).map_or_else(
            || {
                (0..self.layout.max_backends)
                    .map(|i| self.backend_stats(i))
                    .collect()
            },
            Ok,
        )
    }

    fn all_backend_syns(&self) -> Result<Vec<SynCounts>> {
        let n = self.layout.max_backends;
        let Some(map) = &self.maps.backend_syns else {
            return Ok(vec![SynCounts::default(); n as usize]);
        };
        let add = |sum: &mut SynCounts, v: &SynCounts| *sum += *v;
        all_per_cpu(map.map().fd().as_fd(), n, add)
            .map_or_else(|| (0..n).map(|i| self.backend_syns(i)).collect(), Ok)
    }

    fn backend_syns(&self, index: u32) -> Result<SynCounts> {
        let Some(map) = &self.maps.backend_syns else {
            return Ok(SynCounts::default());
        };
        let values = map.get(&index, 0).map_err(map_err(MAP_BACKEND_SYNS))?;
        let mut sum = SynCounts::default();
        for v in values.iter() {
            sum += *v;
        }
        Ok(sum)
    }

    fn flow_bucket(&self, index: u32) -> Result<FlowBucket> {
        self.maps.flows.get(&index, 0).map_err(map_err(MAP_FLOWS))
    }

    fn syn_slot(&self, bucket_index: u32) -> Result<SynSlot> {
        match &self.maps.syns {
            Some(map) => map
                .get(&(bucket_index & (SYN_SLOTS - 1)), 0)
                .map_err(map_err(MAP_SYNS)),
            None => Ok(SynSlot::default()),
        }
    }

    /// Reads the table through a read-only mapping of the map
    /// (`BPF_F_MMAPABLE`): 2M buckets in tens of milliseconds, where one
    /// syscall per bucket takes seconds.
    fn scan_flows(&self, visit: &mut dyn FnMut(&FlowBucket)) -> Result<()> {
        let buckets = self.layout.ct_buckets as usize;
        let len = buckets * std::mem::size_of::<FlowBucket>();
        let fd = self.flows_fd();
        let mapping = super::mmap::ReadOnlyMapping::new(fd, len)?;
        for bucket in mapping.buckets(buckets) {
            visit(&bucket);
        }
        Ok(())
    }

    fn with_flow_reader(&self, read: &mut dyn FnMut(super::BucketReader<'_>)) -> Result<()> {
        let buckets = self.layout.ct_buckets as usize;
        let len = buckets * std::mem::size_of::<FlowBucket>();
        let mapping = super::mmap::ReadOnlyMapping::new(self.flows_fd(), len)?;
        read(&|index| mapping.bucket(index as usize).unwrap_or_default());
        Ok(())
    }

    fn set_syn_slot(&mut self, bucket_index: u32, slot: &SynSlot) -> Result<()> {
        match &mut self.maps.syns {
            Some(map) => map
                .set(bucket_index & (SYN_SLOTS - 1), slot, 0)
                .map_err(map_err(MAP_SYNS)),
            None => Ok(()),
        }
    }

    fn set_flow_bucket(&mut self, index: u32, bucket: &FlowBucket) -> Result<()> {
        self.maps
            .flows
            .set(index, bucket, 0)
            .map_err(map_err(MAP_FLOWS))
    }

    /// Swaps `lb_xdp_trace` into every attached interface's link, or
    /// `lb_xdp` back. The traced program is loaded (verified) on first use.
    fn tracing_pending(&self) -> bool {
        self.traced_pending
    }

    fn select_program(&mut self, trace: bool) -> Result<()> {
        let name = if trace { PROG_LB_TRACE } else { PROG_LB };
        let links = std::mem::take(&mut self.links);
        // The traced build verified apart, if it came; else verified here.
        let ebpf = match (trace, &mut self.traced) {
            (true, Some(traced)) => traced,
            _ => &mut self.ebpf,
        };
        let result = loaded_xdp(ebpf, name).and_then(|prog| {
            links
                .iter()
                .try_for_each(|p| Self::replace_in_link(prog, name, p))
        });
        if result.is_ok() {
            self.tracing = trace;
            if let Some(dir) = links.first().and_then(|l| l.parent()) {
                Self::forget_unattached_programs(dir);
            }
        }
        self.links = links;
        result
    }

    fn set_trace_filter(&mut self, filter: &TraceFilter) -> Result<()> {
        self.maps
            .trace
            .as_mut()
            .ok_or(DataplaneError::MissingMap(MAP_TRACE))?
            .set(0, filter, 0)
            .map_err(map_err(MAP_TRACE))
    }

    fn vip_filter(&self) -> Result<VipFilter> {
        self.maps
            .vip_filter
            .get(&0, 0)
            .map_err(map_err(MAP_VIP_FILTER))
    }

    fn set_vip_filter(&mut self, filter: &VipFilter) -> Result<()> {
        self.maps
            .vip_filter
            .set(0, filter, 0)
            .map_err(map_err(MAP_VIP_FILTER))
    }
}

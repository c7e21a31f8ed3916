//! Backend-side decapsulation: loading the embedded `lb_decap` object,
//! telling it the backend's own addresses, attaching it to an interface and
//! pinning it there, reading its counters. Also [`PassProgram`], the trivial
//! `lb_pass` program that test rigs put on the peer of a veth receiving the
//! balancer's `XDP_TX` frames.
//!
//! [`attach`] pins the XDP link and both maps under one directory on bpffs,
//! so the program stays attached after the process exits; [`detach`]
//! removes the pins, which detaches it. The directory's layout:
//!
//! ```text
//! <pin_dir>/link               the bpf_link (XDP on one interface)
//! <pin_dir>/LB_DECAP_ADDRS     the local addresses
//! <pin_dir>/LB_DECAP_COUNTERS  per-CPU outcome counters (DecapCounter ids)
//! <pin_dir>/LB_DECAP_FROM      the prefixes tunnels may come from (--from)
//! ```
//!
//! It does not follow address changes on the interface (call [`attach`]
//! again: it replaces the program and the address set in place) and it does
//! not configure the VIPs on `lo`.

use std::{
    collections::HashSet,
    ffi::CStr,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        HashMap, Map, MapData, MapError, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    pin::PinError,
    programs::{
        ProgramError, Xdp, XdpMode,
        links::{FdLink, LinkError, PinnedLink},
        xdp::XdpLink,
    },
};
use ipnet::IpNet;
use lb_common::{
    AddrWords, CounterValue, DecapAddr,
    consts::{
        ALL_DECAP_MAPS, DECAP_F_CHECK_SOURCE, DECAP_MAX_ADDRS, DECAP_MAX_FROM, MAP_DECAP_ADDRS,
        MAP_DECAP_COUNTERS, MAP_DECAP_FROM, PROG_DECAP, PROG_PASS,
    },
    counters::DECAP_COUNTER_SLOTS,
};
use thiserror::Error;

use crate::objects;

/// File name of the pinned XDP link under the pin directory.
pub const LINK_PIN: &str = "link";

#[derive(Debug, Error)]
pub enum DecapError {
    #[error("loading the decap object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error(
        "this build carries no eBPF programs (built with LB_EBPF=stub, for unit tests): build without it to load them"
    )]
    NoObjects,
    /// The kernel's verifier refused the program (short message; the
    /// whole log in the rejection).
    #[error("{0}")]
    Verifier(Box<crate::dataplane::verifier::Rejection>),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
    #[error("map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("pinned link {path}: {source}")]
    Link {
        path: PathBuf,
        #[source]
        source: Box<LinkError>,
    },
    #[error("pinning {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: Box<PinError>,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listing interface addresses (getifaddrs): {0}")]
    Interfaces(#[source] io::Error),
    #[error("no interface {iface} in this network namespace")]
    UnknownInterface { iface: String },
    #[error("no local address to decapsulate for: none given and {iface} has none")]
    NoAddresses { iface: String },
    #[error("{count} local addresses, {map} holds at most {max}")]
    TooManyAddresses {
        count: usize,
        map: &'static str,
        max: u32,
    },
    #[error(
        "the link pinned at {path} is attached to interface index {pinned}, not to {iface} \
         (index {wanted}); use another pin directory per interface"
    )]
    PinnedElsewhere {
        path: PathBuf,
        iface: String,
        pinned: u32,
        wanted: u32,
    },
    #[error(
        "XDP on {iface} was attached through netlink, not a bpf_link (kernel before 5.9?): \
         it cannot be pinned"
    )]
    NotALink { iface: String },
    #[error("{count} prefixes to take tunnels from (--from), at most {max}")]
    TooManyPrefixes { count: usize, max: u32 },
    #[error(
        "--from {0}: IPv6 prefixes may not overlap ::ffff:0:0/96, where IPv4 sources are kept (give IPv4 prefixes as IPv4; an IPv6 tunnel from a mapped address is always dropped)"
    )]
    MappedPrefix(IpNet),
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
}

pub type Result<T, E = DecapError> = std::result::Result<T, E>;

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> DecapError {
    move |e| DecapError::Map {
        name,
        source: Box::new(e),
    }
}

/// A program error of `name`; a verifier's refusal as such.
fn prog_err(name: &'static str) -> impl FnOnce(ProgramError) -> DecapError {
    move |e| match crate::dataplane::verifier::Rejection::from_error(name, e) {
        Ok(rejection) => DecapError::Verifier(Box::new(rejection)),
        Err(e) => DecapError::Program {
            name,
            source: Box::new(e),
        },
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DecapError + '_ {
    move |source| DecapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn link_err(path: &Path) -> impl FnOnce(LinkError) -> DecapError + '_ {
    move |e| DecapError::Link {
        path: path.to_path_buf(),
        source: Box::new(e),
    }
}

/// Loads the decap object and one of its programs. With `pin_dir`, each map
/// is adopted from `pin_dir/<map name>` if pinned there, else created and
/// pinned there.
fn load_object(program: &'static str, pin_dir: Option<&Path>) -> Result<Ebpf> {
    load_bytes(objects::LB_DECAP, program, pin_dir)
}

/// [`load_object`] from `object`, another build of the decap object.
fn load_bytes(object: &[u8], program: &'static str, pin_dir: Option<&Path>) -> Result<Ebpf> {
    if object.is_empty() {
        return Err(DecapError::NoObjects);
    }
    let mut loader = EbpfLoader::new();
    if let Some(dir) = pin_dir {
        for name in ALL_DECAP_MAPS {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    let mut ebpf = loader
        .load(object)
        .map_err(|e| DecapError::Load(Box::new(e)))?;
    xdp_program(&mut ebpf, program)?
        .load()
        .map_err(prog_err(program))?;
    Ok(ebpf)
}

fn xdp_program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(name)
        .ok_or_else(|| prog_err(name)(ProgramError::NotLoaded))?
        .try_into()
        .map_err(prog_err(name))
}

/// Sums a per-CPU counter map over CPUs: one value per slot.
fn sum_counters(map: &Map) -> Result<Vec<CounterValue>> {
    let map: PerCpuArray<&MapData, CounterValue> =
        PerCpuArray::try_from(map).map_err(map_err(MAP_DECAP_COUNTERS))?;
    (0..DECAP_COUNTER_SLOTS)
        .map(|i| {
            let values = map.get(&i, 0).map_err(map_err(MAP_DECAP_COUNTERS))?;
            let mut sum = CounterValue::default();
            for v in values.iter() {
                sum += *v;
            }
            Ok(sum)
        })
        .collect()
}

/// The loaded `lb_decap` program and its maps.
pub struct Decap {
    ebpf: Ebpf,
}

impl Decap {
    /// Loads the program with fresh, unpinned maps and no local address
    /// (tests; [`attach`] for real use).
    pub fn load() -> Result<Self> {
        Self::load_with(None)
    }

    fn load_with(pin_dir: Option<&Path>) -> Result<Self> {
        Ok(Self {
            ebpf: load_object(PROG_DECAP, pin_dir)?,
        })
    }

    /// Loads `object`, another build of the decap object with the same
    /// maps, in place of the embedded one: `lb-bench` measures a baseline
    /// build against this one in the same run.
    pub fn load_build(object: &[u8]) -> Result<Self> {
        Ok(Self {
            ebpf: load_bytes(object, PROG_DECAP, None)?,
        })
    }

    /// Replaces the set of local addresses: the ones not in `addrs` are
    /// removed first, then the new ones added, so an address in both sets
    /// is never missing, even for a moment. Each accepts GUE on `gue_port`
    /// (host order; 0: no GUE) besides IP-in-IP and GRE, from any source.
    pub fn set_local_addrs(&mut self, addrs: &[IpAddr], gue_port: u16) -> Result<()> {
        self.set_tunnels(addrs, gue_port, &[]).map(drop)
    }

    /// [`set_local_addrs`](Self::set_local_addrs), taking tunnels only
    /// from `from` unless it is empty. The prefixes are replaced around
    /// the addresses (the new ones added before, the stale ones removed
    /// after), so no tunnel from a prefix in both sets is ever dropped.
    /// Returns the prefixes tunnels were taken from before and no longer
    /// are, for the caller to say (a re-run that left one out).
    pub fn set_tunnels(
        &mut self,
        addrs: &[IpAddr],
        gue_port: u16,
        from: &[IpNet],
    ) -> Result<Vec<IpNet>> {
        if let Some(net) = from.iter().find(|n| overlaps_mapped(n)) {
            return Err(DecapError::MappedPrefix(*net));
        }
        let want: HashSet<(u32, AddrWords)> = from.iter().map(from_key).collect();
        if want.len() > DECAP_MAX_FROM as usize {
            return Err(DecapError::TooManyPrefixes {
                count: want.len(),
                max: DECAP_MAX_FROM,
            });
        }
        check_addr_count(addrs)?;
        let mut trie = self.sources_map()?;
        let before: HashSet<(u32, AddrWords)> = trie
            .keys()
            .filter_map(std::result::Result::ok)
            .map(|k| (k.prefix_len(), k.data()))
            .collect();
        for (len, words) in &want {
            trie.insert(&Key::new(*len, *words), 1, 0)
                .map_err(map_err(MAP_DECAP_FROM))?;
        }
        let flags = if from.is_empty() {
            0
        } else {
            DECAP_F_CHECK_SOURCE
        };
        if let Err(e) = self.write_addrs(addrs, u32::from(gue_port.to_be()) | flags) {
            // The addresses still check sources against the old prefixes:
            // the ones added here go again.
            let mut trie = self.sources_map()?;
            for (len, words) in want.difference(&before) {
                let _ = trie.remove(&Key::new(*len, *words));
            }
            return Err(e);
        }
        let mut trie = self.sources_map()?;
        let have = trie
            .keys()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_DECAP_FROM))?;
        let mut dropped = Vec::new();
        for stale in have
            .iter()
            .filter(|k| !want.contains(&(k.prefix_len(), k.data())))
        {
            match trie.remove(stale) {
                Ok(()) | Err(MapError::KeyNotFound) => dropped.extend(key_net(stale)),
                Err(e) => return Err(map_err(MAP_DECAP_FROM)(e)),
            }
        }
        dropped.sort();
        Ok(dropped)
    }

    fn sources_map(&mut self) -> Result<LpmTrie<&mut MapData, AddrWords, u32>> {
        LpmTrie::try_from(
            self.ebpf
                .map_mut(MAP_DECAP_FROM)
                .ok_or(DecapError::MissingMap(MAP_DECAP_FROM))?,
        )
        .map_err(map_err(MAP_DECAP_FROM))
    }

    /// The prefixes tunnels must come from (none: any source).
    pub fn sources(&self) -> Result<Vec<IpNet>> {
        let trie: LpmTrie<&MapData, AddrWords, u32> = LpmTrie::try_from(
            self.ebpf
                .map(MAP_DECAP_FROM)
                .ok_or(DecapError::MissingMap(MAP_DECAP_FROM))?,
        )
        .map_err(map_err(MAP_DECAP_FROM))?;
        let keys = trie
            .keys()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_DECAP_FROM))?;
        Ok(keys.iter().filter_map(key_net).collect())
    }

    /// Writes `addrs`, each with `value`, as
    /// [`set_local_addrs`](Self::set_local_addrs) says; its one caller,
    /// [`set_tunnels`](Self::set_tunnels), checked their count.
    fn write_addrs(&mut self, addrs: &[IpAddr], value: u32) -> Result<()> {
        let want: HashSet<DecapAddr> = addrs.iter().map(|a| DecapAddr::new(*a)).collect();
        let mut map: HashMap<&mut MapData, DecapAddr, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_DECAP_ADDRS)
                .ok_or(DecapError::MissingMap(MAP_DECAP_ADDRS))?,
        )
        .map_err(map_err(MAP_DECAP_ADDRS))?;
        let have = map
            .keys()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_DECAP_ADDRS))?;
        for stale in have.iter().filter(|k| !want.contains(k)) {
            match map.remove(stale) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(MAP_DECAP_ADDRS)(e)),
            }
        }
        for key in &want {
            map.insert(key, value, 0)
                .map_err(map_err(MAP_DECAP_ADDRS))?;
        }
        Ok(())
    }

    /// The local addresses the program decapsulates for.
    pub fn local_addrs(&self) -> Result<Vec<IpAddr>> {
        let map: HashMap<&MapData, DecapAddr, u32> = HashMap::try_from(
            self.ebpf
                .map(MAP_DECAP_ADDRS)
                .ok_or(DecapError::MissingMap(MAP_DECAP_ADDRS))?,
        )
        .map_err(map_err(MAP_DECAP_ADDRS))?;
        let keys = map
            .keys()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(map_err(MAP_DECAP_ADDRS))?;
        Ok(keys.iter().filter_map(DecapAddr::ip).collect())
    }

    /// The loaded `lb_decap` program (attach it, or drive it with `TestRun`).
    pub fn program(&mut self) -> &mut Xdp {
        xdp_program(&mut self.ebpf, PROG_DECAP).expect("loaded in load_with")
    }

    /// Packets and bytes per outcome, summed over CPUs, indexed by
    /// `DecapCounter` id (`DECAP_COUNTER_SLOTS` entries).
    pub fn counters(&self) -> Result<Vec<CounterValue>> {
        sum_counters(
            self.ebpf
                .map(MAP_DECAP_COUNTERS)
                .ok_or(DecapError::MissingMap(MAP_DECAP_COUNTERS))?,
        )
    }
}

/// More distinct local addresses than `LB_DECAP_ADDRS` holds: refused
/// before anything is written.
fn check_addr_count(addrs: &[IpAddr]) -> Result<()> {
    let count = addrs
        .iter()
        .map(|a| DecapAddr::new(*a))
        .collect::<HashSet<_>>()
        .len();
    if count > DECAP_MAX_ADDRS as usize {
        return Err(DecapError::TooManyAddresses {
            count,
            map: MAP_DECAP_ADDRS,
            max: DECAP_MAX_ADDRS,
        });
    }
    Ok(())
}

/// Whether `net` is an IPv6 prefix that covers or lies in
/// `::ffff:0:0/96`, the IPv4 sources' part of the trie: `::/0` would let
/// every IPv4 source in.
fn overlaps_mapped(net: &IpNet) -> bool {
    let IpNet::V6(n) = net else { return false };
    let mapped = ipnet::Ipv6Net::new(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96)
        .expect("a valid prefix");
    n.contains(&mapped) || mapped.contains(n)
}

/// The `LB_DECAP_FROM` key of `net` (its network: host bits cleared), as
/// its prefix length and data.
fn from_key(net: &IpNet) -> (u32, AddrWords) {
    let net = net.trunc();
    let len = match net {
        IpNet::V4(n) => 96 + u32::from(n.prefix_len()),
        IpNet::V6(n) => u32::from(n.prefix_len()),
    };
    (len, lb_common::mapped_words(net.addr()))
}

/// The prefix an `LB_DECAP_FROM` key holds.
fn key_net(key: &Key<AddrWords>) -> Option<IpNet> {
    let (len, w) = (key.prefix_len(), key.data());
    let v6 = lb_common::words_to_addr(&w, lb_common::consts::FAMILY_V6)?;
    if w[..3] == [0, 0, lb_common::V4_MAPPED_WORD] && len >= 96 {
        let v4 = lb_common::words_to_addr(&[w[3], 0, 0, 0], lb_common::consts::FAMILY_V4)?;
        return IpNet::new(v4, (len - 96) as u8).ok();
    }
    IpNet::new(v6, len as u8).ok()
}

/// Attaches `lb_decap` to `iface` and pins it and its maps under `pin_dir`
/// (created if missing), so it stays attached after this process exits.
///
/// The program decapsulates tunnel packets addressed to `local`, or, if
/// `local` is empty, to every address `iface` has now in the current network
/// namespace; GUE on UDP port `gue_port` (0: no GUE); from the prefixes
/// `from` only (empty: from any source). If `pin_dir` already holds our link on `iface`, the program is
/// replaced atomically inside that link (no packet sees no program), the
/// pinned maps are kept (counters continue) and the address set is replaced;
/// `mode` then has no effect, as a link keeps the mode it was created with.
/// Returns the prefixes the replaced program took tunnels from that `from`
/// leaves out ([`Decap::set_tunnels`]).
pub fn attach(
    iface: &str,
    mode: XdpMode,
    local: &[IpAddr],
    gue_port: u16,
    from: &[IpNet],
    pin_dir: &Path,
) -> Result<Vec<IpNet>> {
    let info = interface(iface)?;
    let addrs = if local.is_empty() {
        info.addrs
    } else {
        local.to_vec()
    };
    if addrs.is_empty() {
        return Err(DecapError::NoAddresses {
            iface: iface.to_string(),
        });
    }
    // One change at a time per interface: held until this returns.
    let _lock = lock(pin_dir, iface)?;
    let link_path = pin_dir.join(LINK_PIN);
    let existing = pinned_link(&link_path, iface, info.index)?;
    let replacing = existing.is_some();

    let result = load_and_attach(iface, mode, (&addrs, gue_port, from), pin_dir, existing);

    match &result {
        Ok(dropped) => tracing::info!(
            iface,
            ?mode,
            replaced = replacing,
            addrs = ?addrs,
            gue_port,
            from = ?from,
            no_longer_from = ?dropped,
            pin_dir = %pin_dir.display(),
            "decap program attached"
        ),
        Err(e) => {
            // A fresh attach that failed leaves nothing behind; a failed
            // replacement leaves the old program running on its link.
            if !replacing {
                remove_pins(pin_dir).ok();
            }
            tracing::warn!(iface, error = %e, "attaching the decap program failed");
        }
    }
    result
}

/// The part of [`attach`] that pins things: loads the object (adopting or
/// pinning the maps), writes the addresses, then either swaps the program
/// into `existing` or attaches and pins a new link.
fn load_and_attach(
    iface: &str,
    mode: XdpMode,
    (addrs, gue_port, from): (&[IpAddr], u16, &[IpNet]),
    pin_dir: &Path,
    existing: Option<FdLink>,
) -> Result<Vec<IpNet>> {
    let link_path = pin_dir.join(LINK_PIN);
    let mut decap = Decap::load_with(Some(pin_dir))?;
    let dropped = decap.set_tunnels(addrs, gue_port, from)?;
    let prog = decap.program();
    match existing {
        Some(link) => {
            let link = XdpLink::try_from(link).map_err(link_err(&link_path))?;
            prog.attach_to_link(link).map_err(prog_err(PROG_DECAP))?;
        }
        None => {
            let id = prog.attach(iface, mode).map_err(prog_err(PROG_DECAP))?;
            let link = prog.take_link(id).map_err(prog_err(PROG_DECAP))?;
            let link = FdLink::try_from(link).map_err(|_| DecapError::NotALink {
                iface: iface.to_string(),
            })?;
            link.pin(&link_path).map_err(|e| DecapError::Pin {
                path: link_path.clone(),
                source: Box::new(e),
            })?;
        }
    }
    // Dropping `decap` closes our descriptors; the pins keep the link, the
    // program and the maps alive.
    Ok(dropped)
}

/// The link pinned at `path`, if any and still attached to `iface`. A link
/// whose interface is gone is unpinned and forgotten.
fn pinned_link(path: &Path, iface: &str, index: u32) -> Result<Option<FdLink>> {
    if !path.try_exists().map_err(io_err(path))? {
        return Ok(None);
    }
    let link = FdLink::from(PinnedLink::from_pin(path).map_err(link_err(path))?);
    let link_id = link.info().map_err(link_err(path))?.id();
    match link_ifindex(link_id) {
        Some(0) => {
            tracing::info!(
                path = %path.display(),
                "pinned decap link lost its interface; attaching a new one"
            );
            std::fs::remove_file(path).map_err(io_err(path))?;
            Ok(None)
        }
        Some(pinned) if pinned != index => Err(DecapError::PinnedElsewhere {
            path: path.to_path_buf(),
            iface: iface.to_string(),
            pinned,
            wanted: index,
        }),
        // Same interface, or a kernel that does not say (then trust the pin).
        _ => Ok(Some(link)),
    }
}

/// The interface index of the XDP link `link_id`, as the kernel shows it in
/// the fdinfo of our descriptor for it (0: its interface is gone). `None` if
/// no open descriptor of ours names that link or the kernel does not print
/// an interface.
fn link_ifindex(link_id: u32) -> Option<u32> {
    let want = format!("link_id:\t{link_id}");
    for entry in std::fs::read_dir("/proc/self/fdinfo").ok()? {
        let Ok(text) = std::fs::read_to_string(entry.ok()?.path()) else {
            continue;
        };
        if !text.lines().any(|l| l == want) {
            continue;
        }
        return text
            .lines()
            .find_map(|l| l.strip_prefix("ifindex:"))
            .and_then(|v| v.trim().parse().ok());
    }
    None
}

/// Removes the link and map pins under `pin_dir`, then the directory.
/// Missing pins are fine (detaching twice is not an error); a directory that
/// holds anything else is left in place and reported.
/// Locks `pin_dir` (creating it) against a concurrent attach or detach.
fn lock(pin_dir: &Path, iface: &str) -> Result<crate::lock::DirLock> {
    Ok(crate::lock::DirLock::acquire(
        pin_dir,
        &format!("the decap program of {iface}"),
        "interface",
    )?)
}

fn remove_pins(pin_dir: &Path) -> Result<()> {
    for name in std::iter::once(LINK_PIN).chain(ALL_DECAP_MAPS) {
        let path = pin_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
    }
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(pin_dir)(e)),
    }
}

/// Detaches the program [`attach`] pinned under `pin_dir` by removing the
/// pins (the link first), and removes the directory. Nothing pinned there is
/// not an error.
pub fn detach(pin_dir: &Path) -> Result<()> {
    let _lock = lock(pin_dir, "its interface")?;
    remove_pins(pin_dir)?;
    tracing::info!(pin_dir = %pin_dir.display(), "decap program detached");
    Ok(())
}

/// The pinned counters under `pin_dir`, summed over CPUs and indexed by
/// `DecapCounter` id.
/// The prefixes the program pinned under `pin_dir` takes tunnels from
/// (empty: from any source).
pub fn sources_pinned(pin_dir: &Path) -> Result<Vec<IpNet>> {
    let path = pin_dir.join(MAP_DECAP_FROM);
    let data = MapData::from_pin(&path).map_err(map_err(MAP_DECAP_FROM))?;
    let map = Map::from_map_data(data).map_err(map_err(MAP_DECAP_FROM))?;
    let trie: LpmTrie<_, AddrWords, u32> =
        LpmTrie::try_from(map).map_err(map_err(MAP_DECAP_FROM))?;
    let keys = trie
        .keys()
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(map_err(MAP_DECAP_FROM))?;
    let mut nets: Vec<IpNet> = keys.iter().filter_map(key_net).collect();
    nets.sort();
    Ok(nets)
}

pub fn counters_pinned(pin_dir: &Path) -> Result<Vec<CounterValue>> {
    let path = pin_dir.join(MAP_DECAP_COUNTERS);
    let data = MapData::from_pin(&path).map_err(map_err(MAP_DECAP_COUNTERS))?;
    let map = Map::from_map_data(data).map_err(map_err(MAP_DECAP_COUNTERS))?;
    sum_counters(&map)
}

/// `lb_pass` (a bare `XDP_PASS`) attached to one interface for as long as
/// the value lives; nothing is pinned. Test rigs put it on the peer of a
/// veth whose other end sends `XDP_TX` frames, which veth only delivers to
/// a peer with an XDP program.
pub struct PassProgram {
    /// Owns the program and its link: dropping it detaches.
    ebpf: Ebpf,
    link: aya::programs::xdp::XdpLinkId,
}

impl PassProgram {
    pub fn attach(iface: &str) -> Result<PassProgram> {
        let mut ebpf = load_object(PROG_PASS, None)?;
        let link = xdp_program(&mut ebpf, PROG_PASS)?
            .attach(iface, XdpMode::default())
            .map_err(prog_err(PROG_PASS))?;
        Ok(PassProgram { ebpf, link })
    }

    /// Keeps the program attached after this value is gone by pinning its
    /// link at `dir/link` (removing the pin detaches it).
    pub fn pin(mut self, dir: &Path) -> Result<()> {
        let link = xdp_program(&mut self.ebpf, PROG_PASS)?
            .take_link(self.link)
            .map_err(prog_err(PROG_PASS))?;
        let fd_link = FdLink::try_from(link).map_err(|_| DecapError::NotALink {
            iface: "(pass program)".into(),
        })?;
        std::fs::create_dir_all(dir).map_err(|source| DecapError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join("link");
        fd_link.pin(&path).map_err(|e| DecapError::Pin {
            path,
            source: Box::new(e),
        })?;
        Ok(())
    }
}

/// An interface as `getifaddrs(3)` shows it.
struct Interface {
    index: u32,
    addrs: Vec<IpAddr>,
}

/// The index and IP addresses of `iface` in the current network namespace.
#[expect(
    unsafe_code,
    reason = "getifaddrs(3) is the only way to list an interface's addresses without an async \
              netlink client; the raw list is walked and freed here and nowhere else"
)]
fn interface(iface: &str) -> Result<Interface> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for the list pointer; on success the
    // list is freed below, exactly once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(DecapError::Interfaces(io::Error::last_os_error()));
    }
    let mut index = None;
    let mut addrs = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        if unsafe { CStr::from_ptr(ifa.ifa_name) }.to_bytes() != iface.as_bytes() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a socket address,
        // which always starts with its family.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                addrs.push(IpAddr::V4(Ipv4Addr::from(
                    sin.sin_addr.s_addr.to_ne_bytes(),
                )));
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                addrs.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
            libc::AF_PACKET => {
                // SAFETY: glibc reports each link once as AF_PACKET with a
                // `sockaddr_ll`, which carries the interface index.
                let sll = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_ll>() };
                index = u32::try_from(sll.sll_ifindex).ok();
            }
            _ => {}
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // nothing borrowed from the list outlives this call.
    unsafe { libc::freeifaddrs(head) };
    let index = index.ok_or_else(|| DecapError::UnknownInterface {
        iface: iface.to_string(),
    })?;
    Ok(Interface { index, addrs })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv6 prefixes that cover or lie in `::ffff:0:0/96` are the IPv4
    /// sources' part of the trie; any other prefix is not.
    #[test]
    fn ipv6_prefixes_over_the_mapped_range_are_told_apart() {
        let net = |s: &str| -> IpNet { s.parse().unwrap() };
        for over in ["::/0", "::/80", "::ffff:0:0/96", "::ffff:10.0.0.0/104"] {
            assert!(overlaps_mapped(&net(over)), "{over}");
        }
        for clear in [
            "fd00::/8",
            "2001:db8::/32",
            "::1/128",
            "::fffe:0:0/96",
            "10.0.0.0/8",
        ] {
            assert!(!overlaps_mapped(&net(clear)), "{clear}");
        }
    }

    /// A prefix goes into the trie as its network, IPv4 mapped with 96
    /// bits more, and comes back out as it went in.
    #[test]
    fn a_prefix_is_keyed_as_its_network_and_read_back() {
        let net = |s: &str| -> IpNet { s.parse().unwrap() };
        let (len, words) = from_key(&net("10.98.7.9/16"));
        assert_eq!(len, 112);
        assert_eq!(words, lb_common::mapped_words("10.98.0.0".parse().unwrap()));
        assert_eq!(key_net(&Key::new(len, words)), Some(net("10.98.0.0/16")));
        let (len, words) = from_key(&net("fd00:98::1/64"));
        assert_eq!(len, 64);
        assert_eq!(key_net(&Key::new(len, words)), Some(net("fd00:98::/64")));
        let (len, _) = from_key(&net("0.0.0.0/0"));
        assert_eq!(len, 96);
    }
}

//! The answers to read-only requests (`status`, `vip list`, `health`,
//! `stats`, `table`, `simulate`), built from the daemon's state into the
//! API's wire types, and the counter samples behind the rates.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Instant, SystemTime},
};

use lb_common::{
    Counter, CounterValue, FlowKey, consts::BACKEND_INDEX_MASK, counters::Kind, quic::QUIC_READ_LEN,
};
use tracing::warn;

use super::{Daemon, Result, refused};
use crate::api::ErrorKind;
use crate::{
    api::{
        self, BackendHealth, BackendInfo, BackendStats, CounterInfo, ProbeInfo, Rate, Simulation,
        Stats, Status, TableInfo, TableShare, VipAdd, VipHealth, VipInfo, VipStats,
    },
    config::{
        BackendConfig, HealthCheck, Mac, MalformedPolicy, VipConfig, VipId, duration,
        quic::parse_cid,
    },
    dataplane::Dataplane,
    lifecycle::{BackendLife, BackendState, WEIGHT_SCALE},
    predict::Via,
};

/// Counter values at one instant.
#[derive(Clone, Default)]
struct Sample {
    at: Option<Instant>,
    counters: Vec<CounterValue>,
    vips: BTreeMap<VipId, (CounterValue, BTreeMap<IpAddr, CounterValue>)>,
    /// Every backend index's SYN counts (passive health, metrics).
    syns: Vec<lb_common::SynCounts>,
}

/// The two latest samples: rates are taken against the older one, so the
/// interval is between one and two sampling periods.
#[derive(Clone, Default)]
pub struct Samples {
    previous: Sample,
    latest: Sample,
}

/// The VIP an `lbctl vip add` describes, parsed as the file's VIP would
/// be.
pub fn vip_config(add: &VipAdd) -> std::result::Result<VipConfig, String> {
    let backends: Vec<_> = add.backends.iter().map(|b| (b.address, b.weight)).collect();
    crate::config::vip_settings::vip_from_settings(&add.vip, &backends, &add.settings.0)
}

pub(super) fn state_wire(s: BackendState) -> api::BackendState {
    match s {
        BackendState::Active => api::BackendState::Active,
        BackendState::SlowStart => api::BackendState::SlowStart,
        BackendState::Draining => api::BackendState::Draining,
        BackendState::Drained => api::BackendState::Drained,
        BackendState::Down => api::BackendState::Down,
        BackendState::Ejected => api::BackendState::Ejected,
    }
}

fn rate(now: CounterValue, before: Option<CounterValue>, secs: f64) -> Rate {
    let (pps, bps) = match before {
        Some(b) if secs > 0.0 => (
            now.packets.saturating_sub(b.packets) as f64 / secs,
            now.bytes.saturating_sub(b.bytes) as f64 * 8.0 / secs,
        ),
        _ => (0.0, 0.0),
    };
    Rate {
        packets: now.packets,
        bytes: now.bytes,
        pps,
        bps,
    }
}

fn pool_bytes(chunks: u32) -> u64 {
    chunks as u64 * crate::dataplane::pool::CHUNK_BYTES
}

pub(super) fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Pass => "pass",
        Kind::Forward => "forward",
        Kind::Drop => "drop",
        Kind::Malformed => "malformed",
        Kind::Reply => "reply",
        Kind::Event => "event",
        Kind::Retired => "retired",
    }
}

impl<D: Dataplane> Daemon<D> {
    /// `lbctl status`.
    pub fn status(&self) -> Status {
        let layout = self.reconciler.layout();
        let ncpus = aya::util::nr_cpus().unwrap_or(1);
        let vips = self.reconciler.vips();
        Status {
            instance: self.config.instance.clone(),
            version: crate::VERSION.to_string(),
            pid: std::process::id(),
            uptime_secs: self.started.elapsed().as_secs(),
            config_file: self.config_path.display().to_string(),
            interfaces: self.startup.interfaces.clone(),
            gateway_mac: Mac(self.settings.gateway_mac).to_string(),
            pin_dir: self.config.pin_dir().display().to_string(),
            maps_adopted: self.startup.maps_adopted,
            vips: vips.len(),
            backends: vips.values().map(|v| v.backends.len()).sum(),
            table_size: layout.table_size,
            ct_buckets: layout.ct_buckets,
            max_vips: layout.max_vips,
            max_backends: layout.max_backends,
            table_pool_bytes: pool_bytes(self.reconciler.pool().capacity()),
            table_pool_used_bytes: pool_bytes(
                self.reconciler.pool().capacity() - self.reconciler.pool().free_chunks(),
            ),
            map_bytes: layout
                .map_bytes(ncpus)
                .into_iter()
                .map(|(n, b)| (n.to_string(), b))
                .collect(),
            api_changes: !self.overlay.is_empty(),
            overrides: self.overlay.overrides(&self.config.vips).len(),
            last_reload: self.last_reload.clone(),
            warnings: self.status_warnings(),
            announce: self.announce_summary(),
            source: self.tier_line(),
            gateway: self.gateway.as_ref().map(|state| api::GatewayInfo {
                address: state.gateway,
                looking_up: state.looking_up,
                error: state.error.clone(),
            }),
            revision: self.revision,
            revision_source: self.revision_source.clone(),
            config_digest: self.running().digest(),
            file_differs: self.file_differs(),
            pending_confirm: self.confirm.as_ref().map(|p| api::PendingConfirm {
                revision: p.revision,
                fallback: p.fallback,
                secs_left: p
                    .deadline
                    .saturating_duration_since(tokio::time::Instant::now())
                    .as_secs_f64(),
                revert_failed: p.revert_failed.as_ref().map(|(_, e)| e.clone()),
            }),
            auto_reverts: self.auto_reverts,
            trace_active: self.tracing.is_some(),
        }
    }

    /// The configuration's warnings, and the datapath's clock when its
    /// windows could not be sized for the kernel's HZ.
    fn status_warnings(&self) -> Vec<String> {
        let mut warnings = self.config.warnings.clone();
        if self.settings.kernel_hz.is_none() {
            warnings.push(crate::liveflows::HZ_UNKNOWN.to_string());
        }
        warnings
    }

    /// The running text is not the file's as last read: a revert runs.
    pub(super) fn runs_other_than_file(&self) -> bool {
        self.text_digest != self.file_digest
    }

    /// After a revert: the running configuration is not the file's.
    fn file_differs(&self) -> Option<String> {
        self.runs_other_than_file().then(|| {
            format!(
                "the running configuration is revision {}'s ({}), not {} as last read; a reload applies the file once it changes",
                self.revision,
                self.revision_source,
                self.config_path.display()
            )
        })
    }

    /// `lbctl vip list`.
    pub fn vip_list(&self) -> Vec<VipInfo> {
        self.effective()
            .iter()
            .map(|v| {
                let kernel = self.reconciler.vips().get(&v.id);
                let life = self.lifecycle.vips.get(&v.id);
                VipInfo {
                    vip: v.id,
                    encap: v.encap.to_string(),
                    conntrack: v.conntrack,
                    second_chance: v.second_chance,
                    backends: v
                        .backends
                        .iter()
                        .map(|b| {
                            let k = kernel.and_then(|k| k.backends.get(&b.address));
                            BackendInfo {
                                address: b.address,
                                weight: b.weight,
                                state: life
                                    .and_then(|l| l.backends.get(&b.address))
                                    .map(|l| state_wire(l.state)),
                                usable: k.is_some_and(|k| k.usable),
                                handle: k.map(|k| k.handle).unwrap_or(0),
                                live_flows: life
                                    .and_then(|l| l.backends.get(&b.address))
                                    .and_then(|l| l.live_flows),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// `lbctl health`.
    pub fn health(&self) -> Vec<VipHealth> {
        let now = Instant::now();
        self.effective()
            .iter()
            .map(|v| {
                let life = self.lifecycle.vips.get(&v.id);
                VipHealth {
                    vip: v.id,
                    panic: life.is_some_and(|l| l.panic),
                    panic_entered: life.map(|l| l.panic_entered).unwrap_or(0),
                    backends: v
                        .backends
                        .iter()
                        .filter_map(|b| {
                            let l = life?.backends.get(&b.address)?;
                            let mut row = backend_health(v, b, l, now);
                            if let Some(p) = &mut row.passive {
                                p.note = passive_note(v, life?, &b.address, now);
                            }
                            Some(row)
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn read_sample(&self) -> Result<Sample> {
        let counters = self.reconciler.dataplane().counters()?;
        let vips = self
            .reconciler
            .all_vip_counters()?
            .into_iter()
            .map(|(id, (v, backends))| (id, (v, backends.into_iter().collect())))
            .collect();
        Ok(Sample {
            at: Some(Instant::now()),
            counters,
            vips,
            syns: self.reconciler.dataplane().all_backend_syns()?,
        })
    }

    /// The datapath counters of the latest sample.
    pub(super) fn samples_latest_counters(&self) -> &[CounterValue] {
        &self.samples.latest.counters
    }

    /// Every backend index's SYN counts in the latest sample.
    pub(super) fn samples_latest_syns(&self) -> &[lb_common::SynCounts] {
        &self.samples.latest.syns
    }

    /// Per VIP (and backend) counters of the latest sample.
    pub(super) fn samples_latest_vips(
        &self,
    ) -> &BTreeMap<VipId, (CounterValue, BTreeMap<IpAddr, CounterValue>)> {
        &self.samples.latest.vips
    }

    /// Takes a counter sample (the one-second tick).
    pub fn sample(&mut self) {
        match self.read_sample() {
            Ok(s) => {
                let s = std::mem::replace(&mut self.samples.latest, s);
                self.samples.previous = s;
            }
            Err(e) => warn!(error = %e, "reading counters failed"),
        }
    }

    /// `lbctl stats`: counters now, with rates against the older sample.
    pub fn stats(&mut self) -> Stats {
        let now = self.read_sample().unwrap_or_else(|e| {
            warn!(error = %e, "reading counters failed");
            self.samples.latest.clone()
        });
        let s = &self.samples;
        let before = if s.previous.at.is_some() {
            &s.previous
        } else {
            &s.latest
        };
        let secs = match (now.at, before.at) {
            (Some(a), Some(b)) => a.duration_since(b).as_secs_f64(),
            _ => 0.0,
        };
        Stats {
            interval_secs: secs,
            counters: counter_rates(&now, before, secs),
            vips: vip_rates(&now, before, secs),
            malformed_policy: match self.config.malformed {
                MalformedPolicy::Pass => "pass".into(),
                MalformedPolicy::Drop => "drop".into(),
            },
        }
    }

    /// `lbctl table VIP`: slots per backend against its weight's share.
    pub fn table(&self, id: &VipId, list_slots: bool) -> Result<TableInfo> {
        let v = self
            .reconciler
            .vips()
            .get(id)
            .ok_or_else(|| refused(ErrorKind::NotFound, format!("no VIP {id}")))?;
        let mut slots: BTreeMap<u32, u32> = BTreeMap::new();
        for h in self.reconciler.live_table(id)?.unwrap_or_default() {
            *slots.entry(h).or_default() += 1;
        }
        let m = v.table_size;
        // The reconciler holds effective weights (scaled, ramped, panic);
        // the share they give is what the table should show.
        let in_table_weight: u32 = v
            .backends
            .values()
            .filter(|b| slots.contains_key(&b.handle))
            .map(|b| b.weight)
            .sum();
        let configured: BTreeMap<IpAddr, u32> = self
            .effective()
            .into_iter()
            .find(|c| c.id == *id)
            .map(|c| c.backends.iter().map(|b| (b.address, b.weight)).collect())
            .unwrap_or_default();
        let addresses = self.reconciler.table_addresses(id)?.unwrap_or_default();
        if list_slots {
            listable(id, &addresses)?;
        }
        Ok(TableInfo {
            digest: crate::digest::table(&addresses),
            slots: list_slots.then_some(addresses),
            vip: *id,
            table_size: m,
            active_half: v.live_half(),
            backends: v
                .backends
                .iter()
                .map(|(addr, b)| {
                    let n = slots.get(&b.handle).copied().unwrap_or(0);
                    TableShare {
                        address: *addr,
                        weight: configured.get(addr).copied().unwrap_or(0),
                        slots: n,
                        share: n as f64 / m as f64,
                        weight_share: if n > 0 && in_table_weight > 0 {
                            b.weight as f64 / in_table_weight as f64
                        } else {
                            0.0
                        },
                    }
                })
                .collect(),
        })
    }

    /// The server ID length of the QUIC VIP a flow to `dst` (`proto`,
    /// port `dport`) goes to, if it goes to one: the VIP of its port
    /// before an all-ports one.
    fn quic_id_len(&self, dst: IpAddr, proto: u8, dport: u16) -> Option<u8> {
        self.effective()
            .iter()
            .filter(|v| v.id.addr == dst && v.id.proto.number() == proto)
            .filter(|v| v.id.port == dport || v.id.port == 0)
            .min_by_key(|v| v.id.port == 0)
            .and_then(|v| v.quic.map(|q| q.server_id_len))
    }

    /// `lbctl simulate`: the backend a flow gets, and why.
    pub fn simulate(
        &self,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        (sport, dport): (u16, u16),
        shape: Shape<'_>,
    ) -> Result<Simulation> {
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(refused(
                ErrorKind::BadRequest,
                "source and destination must be of the same family",
            ));
        }
        let payload = match shape.quic_cid {
            Some(cid) => Some(quic_short_header(cid, self.quic_id_len(dst, proto, dport))?),
            None => None,
        };
        let flow = FlowKey::new(src, dst, proto, sport, dport);
        let simulated = self
            .reconciler
            .simulate_payload(&flow, shape.syn, payload.as_deref());
        let Some(p) = simulated? else {
            return Ok(Simulation {
                vip: None,
                hash: format!("{:#018x}", flow.hash()),
                slot: 0,
                backend: None,
                via: "not a VIP: passed to the kernel".into(),
                alternates: Vec::new(),
            });
        };
        Ok(Simulation {
            vip: VipId::from_key(&p.vip),
            hash: format!("{:#018x}", p.hash),
            slot: p.slot,
            backend: p.backend.and_then(|b| {
                self.reconciler
                    .backend_by_handle(b.handle)
                    .map(|(_, a)| a)
                    .or_else(|| b.ip())
            }),
            alternates: p
                .alternates()
                .filter_map(|b| {
                    self.reconciler
                        .backend_by_handle(b.handle)
                        .map(|(_, a)| a)
                        .or_else(|| b.ip())
                })
                .collect(),
            via: match (p.backend, p.via) {
                (None, _) => "no usable backend: dropped".into(),
                (Some(_), Via::ConnTrack) => "connection table".into(),
                (Some(_), Via::Handshake) => {
                    "its SYN's backend (a handshake in progress: recent SYNs)".into()
                }
                (Some(b), Via::Maglev) => format!(
                    "maglev slot {} (backend index {})",
                    p.slot,
                    b.handle & BACKEND_INDEX_MASK
                ),
                (Some(b), Via::QuicCid) => format!(
                    "QUIC connection ID: server ID {} (backend index {})",
                    p.meta.quic().map_or(String::new(), |q| shape
                        .quic_cid
                        .and_then(|c| parse_cid(c).ok())
                        .map(|c| server_id_hex(&c, q.server_id_len))
                        .unwrap_or_default()),
                    b.handle & BACKEND_INDEX_MASK
                ),
            },
        })
    }
}

/// What `lbctl simulate` says of its packet besides the tuple.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape<'a> {
    /// A TCP SYN without ACK.
    pub syn: bool,
    /// A short-header QUIC packet with this destination connection ID
    /// (hex).
    pub quic_cid: Option<&'a str>,
}

/// The payload of a short-header QUIC packet to connection ID `cid`
/// (hex): its first byte, the ID, padding the datapath would read past.
/// An ID too short to hold the VIP's server ID (`id_len` octets after its
/// first) is refused: the padding would stand for the server ID, and a
/// real packet's bytes there are not zeros.
fn quic_short_header(cid: &str, id_len: Option<u8>) -> Result<Vec<u8>> {
    let cid = parse_cid(cid).map_err(|e| refused(ErrorKind::BadRequest, e))?;
    if let Some(len) = id_len
        && cid.len() < 1 + usize::from(len)
    {
        return Err(refused(
            ErrorKind::BadRequest,
            format!(
                "a connection ID of {} octets holds no server ID of {len}: give at least {}",
                cid.len(),
                1 + usize::from(len)
            ),
        ));
    }
    let mut payload = vec![0x40];
    payload.extend_from_slice(&cid);
    payload.resize(payload.len().max(QUIC_READ_LEN), 0);
    Ok(payload)
}

/// The server ID `cid` carries for a VIP with IDs of `len` octets, in hex.
fn server_id_hex(cid: &[u8], len: u8) -> String {
    cid.iter()
        .skip(1)
        .take(len as usize)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a backend that looks bad to passive health is not ejected: the
/// policy's own judgement ([`crate::passive::judge`]), in words.
fn passive_note(
    v: &VipConfig,
    life: &crate::lifecycle::VipLife,
    addr: &IpAddr,
    now: Instant,
) -> Option<String> {
    use crate::passive::{Hold, Judgement};
    let l = life.backends.get(addr)?;
    if l.passive.is_ejected(now) {
        return None;
    }
    let windows: Vec<_> = life.backends.values().map(|o| o.passive.window()).collect();
    let i = life.backends.keys().position(|a| a == addr)?;
    let judged = crate::passive::judge(
        &v.passive_health,
        windows[i],
        crate::passive::pooled(&windows, i),
    );
    let weighted = v
        .backends
        .iter()
        .any(|b| b.address == *addr && b.weight > 0);
    Some(match judged {
        Judgement::Fine => return None,
        _ if !l.passive_candidate(weighted, now) => {
            "not judged: it is down, drained or weighted 0".into()
        }
        Judgement::LikeOthers(others) => format!(
            "not ejected: the VIP's other backends see their SYNs retried alike ({:.0}%), so the cause is not this backend",
            others * 100.0
        ),
        Judgement::Chance(p) => format!(
            "not ejected: too few SYNs to tell it from chance (as uneven as this once in {:.0} by chance alone; ejecting needs under once in {:.0})",
            1.0 / p,
            1.0 / crate::passive::MAX_CHANCE
        ),
        Judgement::Eject if l.passive.held_back == Some(Hold::Cap) => {
            "not ejected: max_ejection_percent of the VIP's backends are".into()
        }
        Judgement::Eject if l.passive.held_back == Some(Hold::Panic) => {
            "not ejected: one more ejection would put the VIP below panic_threshold".into()
        }
        Judgement::Eject => "to be ejected at the next evaluation".into(),
    })
}

/// One backend's row of `lbctl health`.
fn backend_health(
    v: &VipConfig,
    b: &BackendConfig,
    l: &BackendLife,
    now: Instant,
) -> BackendHealth {
    BackendHealth {
        address: b.address,
        state: state_wire(l.state),
        health: match &l.health {
            None => "unchecked".into(),
            Some(t) if t.is_up() => "up".into(),
            Some(_) => "down".into(),
        },
        check: v
            .health_check_of(b)
            .map(|c| describe_check(c, v, b.address)),
        weight: b.weight,
        effective_weight: l.effective_weight as f64 / WEIGHT_SCALE as f64,
        in_state_secs: now.saturating_duration_since(l.state_since).as_secs_f64(),
        last_probe: l
            .health
            .as_ref()
            .and_then(|t| t.last.as_ref())
            .map(|p| ProbeInfo {
                ok: p.ok,
                latency_us: p.latency_us,
                detail: p.detail.clone(),
            }),
        probes: l.health.as_ref().map(|t| t.probes).unwrap_or(0),
        probes_at_change: l.health.as_ref().map(|t| t.probes_at_change).unwrap_or(0),
        live_flows: l.live_flows,
        passive: v.passive_health.enabled.then(|| {
            let w = l.passive.window();
            api::PassiveInfo {
                syns: w.syns,
                retransmits: w.retransmits,
                ratio: w.ratio(),
                ejections: l.passive.ejections,
                ejected_secs: l.passive.left(now).as_secs_f64(),
                held_back: l.passive.held_back.is_some(),
                note: None,
            }
        }),
        flap_hold_secs: l
            .flaps
            .held_until
            .map_or(0.0, |t| t.saturating_duration_since(now).as_secs_f64()),
    }
}

fn counter_rates(now: &Sample, before: &Sample, secs: f64) -> Vec<CounterInfo> {
    Counter::ALL
        .iter()
        .filter(|c| c.kind() != Kind::Retired)
        .map(|c| CounterInfo {
            name: c.name().into(),
            kind: kind_name(c.kind()).into(),
            value: rate(
                now.counters.get(*c as usize).copied().unwrap_or_default(),
                before.counters.get(*c as usize).copied(),
                secs,
            ),
        })
        .collect()
}

fn vip_rates(now: &Sample, before: &Sample, secs: f64) -> Vec<VipStats> {
    now.vips
        .iter()
        .map(|(id, (v, backends))| {
            let old = before.vips.get(id);
            VipStats {
                vip: *id,
                value: rate(*v, old.map(|o| o.0), secs),
                backends: backends
                    .iter()
                    .map(|(addr, b)| BackendStats {
                        address: *addr,
                        value: rate(*b, old.and_then(|o| o.1.get(addr)).copied(), secs),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// What a check probes, for `lbctl health`.
fn describe_check(c: &HealthCheck, vip: &VipConfig, backend: IpAddr) -> String {
    let port = c.port.unwrap_or(vip.id.port);
    let what = if let Some(h) = &c.http {
        format!("http GET {} → {}", h.path, h.status)
    } else if c.send.is_some() || c.expect.is_some() {
        "tcp send/expect".to_string()
    } else {
        "tcp connect".to_string()
    };
    let target = if c.through_tunnel {
        format!("{}:{port} through the tunnel", vip.id.addr)
    } else {
        std::net::SocketAddr::from((backend, port)).to_string()
    };
    format!(
        "{what} {target} every {} (timeout {}, rise {}, fall {})",
        duration::format(&c.interval),
        duration::format(&c.timeout),
        c.rise,
        c.fall
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ` without a date crate.
pub fn humantime(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// [`humantime`] to the millisecond: `2026-12-04T10:30:00.123Z`.
pub fn humantime_millis(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_millis());
    let mut s = humantime(t);
    s.insert_str(s.len() - 1, &format!(".{ms:03}"));
    s
}

/// A runtime change in force, as `lbctl overrides` shows it.
pub fn override_row(o: crate::state::Override) -> api::OverrideRow {
    api::OverrideRow {
        vip: o.vip,
        backend: o.backend,
        field: o.field.to_string(),
        file: o.file,
        running: o.running,
        revision: o.revision,
        time: if o.time == 0 {
            String::new()
        } else {
            humantime(std::time::UNIX_EPOCH + std::time::Duration::from_secs(o.time))
        },
        source: o.source,
    }
}

impl<D: Dataplane> Daemon<D> {
    /// `lbctl overrides`: every runtime change in force over the file.
    pub fn override_rows(&self) -> Vec<api::OverrideRow> {
        self.overlay
            .overrides(&self.config.vips)
            .into_iter()
            .map(override_row)
            .collect()
    }
}

/// Refuses `--slots` for a table whose list would not fit in an answer
/// `lbctl` reads ([`crate::api::MAX_RESPONSE`]): a table of millions of
/// IPv6 slots runs to hundreds of MiB, which the client would cut off
/// and fail to parse.
fn listable(id: &VipId, slots: &[Option<IpAddr>]) -> Result<()> {
    let bytes = listed_bytes(slots);
    // Room for the rest of the answer (the backends' shares).
    let budget = crate::api::MAX_RESPONSE as u64 - (1 << 20);
    if bytes > budget {
        return Err(refused(
            ErrorKind::BadRequest,
            format!(
                "VIP {id}'s table has {} slots; listing them takes {} MiB, more than an answer may carry ({} MiB); \
                 compare tables by their digest (`lbctl table {id}` without --slots) instead",
                slots.len(),
                bytes >> 20,
                crate::api::MAX_RESPONSE >> 20
            ),
        ));
    }
    Ok(())
}

/// The bytes `slots` takes in a JSON answer, give or take its brackets:
/// each slot as `"addr",` or `null,`, counted per distinct backend.
fn listed_bytes(slots: &[Option<IpAddr>]) -> u64 {
    let mut per_backend: std::collections::HashMap<Option<IpAddr>, u64> = Default::default();
    for s in slots {
        *per_backend.entry(*s).or_default() += 1;
    }
    per_backend
        .iter()
        .map(|(a, n)| n * a.map_or(5, |a| a.to_string().len() as u64 + 3))
        .sum()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use std::net::IpAddr;

    use super::{humantime, humantime_millis, listable, listed_bytes};

    #[test]
    fn times_are_utc_in_iso_8601() {
        // 2000-01-01 is 946,684,800 s after the epoch; 60 days later (a
        // leap February) is 1 March.
        let t = UNIX_EPOCH + Duration::from_millis(951_868_800_045);
        assert_eq!(humantime(t), "2000-03-01T00:00:00Z");
        assert_eq!(humantime_millis(t), "2000-03-01T00:00:00.045Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_868_799_999);
        assert_eq!(humantime_millis(t), "2000-02-29T23:59:59.999Z");
    }

    /// The estimate is what serde writes (checked against serde_json,
    /// which the answer is written with), and the limit falls between a
    /// default IPv4 table and the largest IPv6 one.
    #[test]
    fn slot_lists_that_an_answer_cannot_carry_are_refused() {
        let a: IpAddr = "10.1.0.1".parse().unwrap();
        let b: IpAddr = "2001:db8:ffff:ffff:ffff:ffff:ffff:1".parse().unwrap();
        let slots = vec![Some(a), None, Some(b), Some(a), None];
        let written = serde_json::to_string(&slots).unwrap().len() as u64;
        // Two brackets, one comma fewer.
        assert_eq!(listed_bytes(&slots), written - 1);

        let vip = "10.99.0.1:80/tcp".parse().unwrap();
        assert!(listable(&vip, &vec![Some(a); 65_537]).is_ok());
        let e = listable(&vip, &vec![Some(b); 1 << 24]).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("16777216 slots") && e.contains("digest"), "{e}");
    }
}

//! Reloads of the configuration file, and the guard every change passes:
//! a change that would leave a serving VIP with no usable backend is
//! refused unless forced. The file is read and parsed by the caller (off
//! the daemon's loop); this applies it, or keeps the running one.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Instant, SystemTime},
};

use tracing::{error, info, warn};

use super::{BackendKey, Daemon, DaemonError, Result, refused, views::humantime};
use crate::{
    config::{Config, ConfigErrors, Gateway, TooBigPolicy, VipConfig},
    dataplane::Dataplane,
    lifecycle,
    reconcile::DatapathSettings,
};

/// What a reload changed that `lbd` must act on outside the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    pub warnings: Vec<String>,
    /// The gateway setting (or its refresh) changed: restart the watcher
    /// from this gateway and MAC.
    pub regateway: Option<(Option<IpAddr>, [u8; 6])>,
}

/// The datapath's global settings for `config`, with `gateway_mac`.
pub fn datapath_settings(config: &Config, gateway_mac: [u8; 6]) -> DatapathSettings {
    let prefix_v4 = config.outer_source_v4_prefix;
    let prefix_v6 = config.outer_source_v6_prefix;
    DatapathSettings {
        gateway_mac,
        outer_source_v4: config
            .outer_source_v4
            .or(prefix_v4.and_then(|p| match p.addr {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            })),
        outer_source_v6: config
            .outer_source_v6
            .or(prefix_v6.and_then(|p| match p.addr {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })),
        outer_source_v4_host_bits: prefix_v4.map_or(0, |p| p.host_bits()),
        outer_source_v6_host_bits: prefix_v6.map_or(0, |p| p.host_bits()),
        malformed: config.malformed,
        mtu: config.mtu,
        gue_port: config.gue_port,
        icmp_echo: config.icmp_echo,
        pass_too_big: config.too_big_no_df == TooBigPolicy::Pass,
    }
}

/// The gateway MAC of `config`: configured, or (`auto`) looked up now,
/// with the gateway's address.
pub async fn resolve_gateway(config: &Config) -> Result<(Option<IpAddr>, [u8; 6])> {
    match config.gateway {
        Gateway::Mac(mac) => Ok((None, mac.0)),
        Gateway::Auto => {
            let iface = &config.interfaces[0];
            let (ip, mac) = crate::net::gateway_mac(iface)
                .await
                .map_err(|e| refused(format!("resolving gateway_mac: auto on {iface}: {e}")))?;
            info!(gateway = %ip, mac = %mac, iface = %iface, "gateway resolved");
            Ok((Some(ip), mac.0))
        }
    }
}

/// Settings that only a restart may change, and whether `new` changes one.
fn fixed_setting_changed(old: &Config, new: &Config) -> Option<&'static str> {
    [
        ("instance", new.instance != old.instance),
        ("interfaces", new.interfaces != old.interfaces),
        ("xdp_mode", new.xdp_mode != old.xdp_mode),
        (
            "table_size, conntrack_buckets, max_vips or max_backends",
            new.layout != old.layout,
        ),
        ("bpffs", new.bpffs != old.bpffs),
        ("api_socket", new.api_socket != old.api_socket),
        ("state_file", new.state_file != old.state_file),
    ]
    .into_iter()
    .find(|(_, changed)| *changed)
    .map(|(what, _)| what)
}

impl<D: Dataplane> Daemon<D> {
    /// Applies a configuration read from the file (or the reason it could
    /// not be read). On any error the running configuration stays; either
    /// way the outcome is kept for `lbctl status`.
    pub async fn reload(
        &mut self,
        parsed: Result<Config, ConfigErrors>,
        force: bool,
    ) -> Result<Reloaded> {
        let result = match parsed {
            Ok(new) => self.try_reload(new, force).await,
            Err(e) => Err(e.into()),
        };
        let when = humantime(SystemTime::now());
        self.last_reload = Some(match &result {
            Ok(_) => format!("ok at {when}"),
            Err(e) => format!("failed at {when}: {e}"),
        });
        result
    }

    async fn try_reload(&mut self, new: Config, force: bool) -> Result<Reloaded> {
        if let Some(what) = fixed_setting_changed(&self.config, &new) {
            return Err(refused(format!(
                "{what} cannot change on reload; restart lbd to change it"
            )));
        }
        let effective = self.overlay.apply(&new.vips);
        let mut warnings = new.check_vips(&effective)?;
        warnings.extend(new.warnings.iter().cloned());
        warnings.extend(self.refuse_blackhole(
            &effective,
            &self.overlay.drained_in(&effective),
            force,
            "lbctl reload --force",
        )?);
        let regateway = new.gateway != self.config.gateway
            || new.gateway_refresh != self.config.gateway_refresh;
        let resolved = if new.gateway == self.config.gateway {
            let ip = self.gateway.as_ref().and_then(|g| g.gateway);
            (ip, self.settings.gateway_mac)
        } else {
            resolve_gateway(&new).await?
        };
        let settings = datapath_settings(&new, resolved.1);
        self.reconciler.apply_settings(&settings)?;
        if let Err(e) = self.program(&effective, false) {
            self.restore();
            return Err(e);
        }
        if new.announce != self.config.announce {
            self.restart_announcers(&new).await?;
        }
        for w in &warnings {
            warn!("{w}");
        }
        self.settings = settings;
        self.config = new;
        // min_healthy may have changed, and new announcers know nothing yet.
        self.announce();
        info!("configuration reloaded");
        Ok(Reloaded {
            warnings,
            regateway: regateway.then_some(resolved),
        })
    }

    /// Puts the running configuration back into the maps after a failed
    /// reload.
    fn restore(&mut self) {
        let _ = self.reconciler.apply_settings(&self.settings);
        let old = self.effective();
        let _ = self.program(&old, false);
    }

    /// The announce section changed: the announcers restart (a short
    /// withdrawal). If the new ones cannot start, the old configuration
    /// goes back, with its announcers.
    async fn restart_announcers(&mut self, new: &Config) -> Result<()> {
        info!("the announce section changed: restarting the announcers");
        self.stop_announcers().await;
        let previous = std::mem::replace(&mut self.config.announce, new.announce.clone());
        if let Err(e) = self.start_announcers() {
            self.config.announce = previous;
            self.restore();
            if let Err(again) = self.start_announcers() {
                error!("restarting the previous announcers failed: {again}");
            }
            self.announce();
            return Err(refused(format!("starting the new announcers: {e}")));
        }
        Ok(())
    }

    /// Checks that `effective` (with `drained`) leaves every VIP that is
    /// serving now (announced, with a usable backend) with a backend in
    /// its table. A VIP left without one would drop all its traffic while
    /// the routers still send it here: refused, unless `force`, in which
    /// case the problems come back as warnings (and are logged as errors).
    /// `how` says how to force it.
    pub fn refuse_blackhole(
        &self,
        effective: &[VipConfig],
        drained: &BTreeSet<BackendKey>,
        force: bool,
        how: &str,
    ) -> Result<Vec<String>> {
        let now = Instant::now();
        let mut prospect = self.lifecycle.clone();
        prospect.sync(effective, drained, now, false);
        prospect.plan(effective, now);
        let problems: Vec<String> = self
            .announcers
            .decision
            .vips
            .iter()
            .filter(|v| v.announced && v.usable > 0)
            .filter_map(|v| {
                let vip = effective.iter().find(|c| c.id == v.vip)?;
                let life = prospect.vips.get(&vip.id);
                let (usable, awaiting) = lifecycle::usable_backends(vip, life);
                (usable + awaiting == 0).then(|| {
                    format!(
                        "VIP {} is announced and would have no usable backend ({})",
                        vip.id,
                        lifecycle::why_unusable(vip, life)
                    )
                })
            })
            .collect();
        if problems.is_empty() {
            return Ok(Vec::new());
        }
        if !force {
            return Err(DaemonError::Refused(format!(
                "refused, it would blackhole traffic: {}; fix it, or force it with `{how}`",
                problems.join("; ")
            )));
        }
        for p in &problems {
            error!("forced: {p}");
        }
        Ok(problems)
    }
}

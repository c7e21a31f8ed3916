//! What a configuration means for the datapath as a whole, apart from its
//! VIPs: the global settings written into the datapath's config map (the
//! tunnel sources, MTU, the tier's hash key read from its file, the
//! gateway's MAC, resolved if `auto`), and the settings only a restart may
//! change. Used by the start (`lbd`'s `run`) and by every commit.

use std::net::IpAddr;

use tracing::info;

use super::{Result, refused};
use crate::api::ErrorKind;
use crate::{
    config::{Config, Gateway, TooBigPolicy},
    reconcile::DatapathSettings,
};

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
        hash_key: None,
        kernel_hz: None,
    }
}

/// The tier's hash key `config` names, read now (`None`: no key). A key
/// file that cannot be used refuses the start or the change, naming it.
pub fn hash_key_of(config: &Config) -> Result<Option<[u64; 2]>> {
    config
        .hash_key_file
        .as_deref()
        .map(|path| {
            crate::config::hash::load_key(path)
                .map_err(|e| refused(ErrorKind::InvalidConfig, format!("hash_key_file: {e}")))
        })
        .transpose()
}

/// The gateway MAC of `config`: configured, or (`auto`) looked up now,
/// with the gateway's address.
pub async fn resolve_gateway(config: &Config) -> Result<(Option<IpAddr>, [u8; 6])> {
    match config.gateway {
        Gateway::Mac(mac) => Ok((None, mac.0)),
        Gateway::Auto => {
            let iface = &config.interfaces[0];
            let (ip, mac) = crate::net::gateway_mac(iface).await.map_err(|e| {
                refused(
                    ErrorKind::Unavailable,
                    format!("resolving gateway_mac: auto on {iface}: {e}"),
                )
            })?;
            info!(gateway = %ip, mac = %mac, iface = %iface, "gateway resolved");
            Ok((Some(ip), mac.0))
        }
    }
}

/// Settings that only a restart may change: the first one `new` changes,
/// and why a restart is needed.
pub(super) fn fixed_setting_changed(
    old: &Config,
    new: &Config,
) -> Option<(&'static str, &'static str)> {
    const MAPS: &str = "the maps are made with it";
    const SET_UP: &str = "it is set up when lbd starts";
    let (o, n) = (&old.layout, &new.layout);
    [
        ("instance", new.instance != old.instance, MAPS),
        ("interfaces", new.interfaces != old.interfaces, SET_UP),
        ("xdp_mode", new.xdp_mode != old.xdp_mode, SET_UP),
        ("table_size", n.table_size != o.table_size, MAPS),
        ("conntrack_buckets", n.ct_buckets != o.ct_buckets, MAPS),
        ("max_vips", n.max_vips != o.max_vips, MAPS),
        ("max_backends", n.max_backends != o.max_backends, MAPS),
        ("table_pool_mib", n.table_pool != o.table_pool, MAPS),
        (
            "second_chance_vips",
            n.second_chance_vips != o.second_chance_vips,
            MAPS,
        ),
        ("bpffs", new.bpffs != old.bpffs, MAPS),
        ("api_socket", new.api_socket != old.api_socket, SET_UP),
        ("state_file", new.state_file != old.state_file, SET_UP),
        ("metrics", new.metrics != old.metrics, SET_UP),
        ("log_format", new.log_format != old.log_format, SET_UP),
        // Without the tier's link a reload would compose no VIPs at all,
        // and withdraw every one.
        (
            "source",
            new.source != old.source,
            "the etcd link starts with lbd",
        ),
        ("history", new.history != old.history, SET_UP),
    ]
    .into_iter()
    .find(|(_, changed, _)| *changed)
    .map(|(what, _, why)| (what, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `too_big_no_df` reaches the datapath as its flag: set for `pass`
    /// only (the default drops).
    #[test]
    fn too_big_no_df_pass_sets_the_flag() {
        let base = "instance: t\ninterfaces: [eth0]\ngateway_mac: \"02:00:00:00:00:01\"\nouter_source_v4: 10.0.0.2\nvips: []\n";
        for (extra, pass) in [
            ("", false),
            ("too_big_no_df: drop\n", false),
            ("too_big_no_df: pass\n", true),
        ] {
            let config = Config::parse(&format!("{base}{extra}")).expect("parses");
            let s = datapath_settings(&config, [2, 0, 0, 0, 0, 1]);
            assert_eq!(s.pass_too_big, pass, "{extra:?}");
        }
    }
}

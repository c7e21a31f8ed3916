//! Digests that let two balancers of a tier be compared with one command
//! each: of the effective configuration (what every balancer of a tier
//! must agree on) and of each VIP's Maglev table as it is published.
//!
//! Both are SHA-256, shown as the first 16 bytes in hex. The configuration
//! digest covers `table_size` and the effective VIPs (the file's with the
//! API's changes on top, in VIP order, as their canonical JSON, a VIP's
//! own `table_size` only where it differs from the global one): not the
//! box's own settings (instance, interfaces, tunnel sources, announce),
//! which differ between balancers of one tier by design. The table digest
//! covers the backend address of every slot, in slot order, so it is
//! equal on two balancers exactly when they send every flow of the VIP to
//! the same backend.

use std::net::IpAddr;

use sha2::{Digest as _, Sha256};

use crate::config::VipConfig;

/// Hex of the first 16 bytes of `hasher`'s digest.
fn finish(hasher: Sha256) -> String {
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fingerprint of the flow hash's key (`hash_key_file`), which a tier
/// compares: balancers with different keys send a flow that ECMP moves
/// between them to different backends, while their tables agree. SHA-256
/// of the key, so the fingerprint tells nothing of it; `none` unkeyed.
pub fn hash_key(key: Option<&[u64; 2]>) -> String {
    let Some(key) = key else {
        return "none".into();
    };
    let mut h = Sha256::new();
    h.update(b"lb hash key 1\n");
    h.update(key[0].to_le_bytes());
    h.update(key[1].to_le_bytes());
    finish(h)
}

/// The digest of an effective configuration (see the module docs).
pub fn config(table_size: u32, vips: &[VipConfig]) -> String {
    let mut sorted: Vec<&VipConfig> = vips.iter().collect();
    sorted.sort_by_key(|v| v.id);
    let mut h = Sha256::new();
    h.update(b"lb config 1\n");
    h.update(table_size.to_be_bytes());
    for vip in sorted {
        // A VIP that names the global size builds the same table as one
        // that names none (and digests of earlier versions stay).
        let same = vip.table_size == Some(table_size);
        let json = if same {
            let plain = VipConfig {
                table_size: None,
                ..vip.clone()
            };
            serde_json::to_vec(&plain)
        } else {
            serde_json::to_vec(vip)
        };
        // Serialising a VipConfig cannot fail (no maps with non-string
        // keys); an empty line would still separate the VIPs.
        h.update(json.unwrap_or_default());
        h.update(b"\n");
    }
    finish(h)
}

/// The digest of a table: `slots[i]` is the backend of slot `i` (`None`:
/// the VIP has no backend, every slot drops).
pub fn table(slots: &[Option<IpAddr>]) -> String {
    let mut h = Sha256::new();
    h.update(b"lb table 1\n");
    h.update((slots.len() as u64).to_be_bytes());
    // The same bytes, handed over 64 KiB at a time rather than 16.
    let mut buf = Vec::with_capacity(16 * 4096);
    for part in slots.chunks(4096) {
        buf.clear();
        for slot in part {
            buf.extend_from_slice(&match slot {
                None => [0u8; 16],
                Some(IpAddr::V4(a)) => a.to_ipv6_mapped().octets(),
                Some(IpAddr::V6(a)) => a.octets(),
            });
        }
        h.update(&buf);
    }
    finish(h)
}

/// The digest of a file's text, to tell whether it changed.
pub fn text(text: &str) -> String {
    let mut h = Sha256::new();
    h.update(text.as_bytes());
    finish(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_of_their_definition() {
        // Independent check: SHA-256 of the empty string is a published
        // constant (FIPS 180-2 test vectors).
        assert_eq!(text(""), "e3b0c44298fc1c149afbf4c8996fb924");
        let a: IpAddr = "10.1.0.1".parse().unwrap();
        let b: IpAddr = "10.1.0.2".parse().unwrap();
        assert_eq!(table(&[Some(a), Some(b)]), table(&[Some(a), Some(b)]));
        assert_ne!(table(&[Some(a), Some(b)]), table(&[Some(b), Some(a)]));
        assert_ne!(table(&[Some(a)]), table(&[None]));
        // Pinned (SHA-256 computed apart from this code): balancers of a
        // tier compare it across versions.
        assert_eq!(table(&[Some(a), None]), "1ed803ada58f873d409570ef1c72bd0a");
    }

    /// What the configuration digest hashes, a VIP's canonical JSON,
    /// written out by hand: keys in the file's order, settings that did not
    /// exist in earlier versions left out at their defaults, so that
    /// balancers of a tier on two versions compare equal.
    #[test]
    fn a_vips_canonical_json_is_pinned() {
        let plain: VipConfig = serde_yaml::from_str(
            "{address: 10.0.0.1, port: 80, protocol: tcp, backends: [{address: 10.1.0.1}]}",
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            concat!(
                r#"{"address":"10.0.0.1","port":80,"protocol":"tcp","encap":"ipip","#,
                r#""conntrack":true,"fragments":"drop","backends":[{"address":"10.1.0.1","weight":1}],"#,
                r#""drain_timeout":"60s","slow_start":"0ms","panic_threshold":50,"min_healthy":1,"#,
                r#""passive_health":{"enabled":true,"window":"30s","min_syns":20,"ratio":0.3,"#,
                r#""relative":3.0,"ejection":"30s","max_ejection":"600s","max_ejection_percent":50}}"#,
            )
        );
        let full: VipConfig = serde_yaml::from_str(concat!(
            "{address: 10.0.0.2, port: all, protocol: udp, encap: gue, conntrack: false, ",
            "fragments: hash, backends: [], health_check: {port: 81}, drain_timeout: 5m, ",
            "slow_start: 1500ms, panic_threshold: 0, min_healthy: 2, ",
            "passive_health: {enabled: false}, table_size: 4099, second_chance: true, ",
            "hash: [src_ip]}",
        ))
        .unwrap();
        let json = serde_json::to_string(&full).unwrap();
        for part in [
            r#"{"address":"10.0.0.2","port":"all","protocol":"udp","encap":"gue","conntrack":false,"fragments":"hash","backends":[],"health_check":{"#,
            r#"},"drain_timeout":"300s","slow_start":"1500ms","panic_threshold":0,"min_healthy":2,"passive_health":{"enabled":false,"#,
            r#"},"table_size":4099,"second_chance":true,"hash":["src_ip"]}"#,
        ] {
            assert!(json.contains(part), "{part}\nnot in\n{json}");
        }
    }

    #[test]
    fn the_configuration_digest_ignores_vip_order_but_not_weights() {
        let vip = |s: &str, w: u32| {
            let backend = crate::config::BackendConfig::new("10.1.0.1".parse().unwrap(), w);
            VipConfig::new(s.parse().unwrap(), vec![backend])
        };
        let (x, y) = (vip("10.0.0.1:80/tcp", 1), vip("10.0.0.2:80/tcp", 1));
        assert_eq!(
            config(4099, &[x.clone(), y.clone()]),
            config(4099, &[y.clone(), x.clone()])
        );
        assert_ne!(
            config(4099, std::slice::from_ref(&x)),
            config(4099, &[vip("10.0.0.1:80/tcp", 2)])
        );
        assert_ne!(
            config(4099, std::slice::from_ref(&x)),
            config(65537, std::slice::from_ref(&x))
        );
        // A VIP's own size counts where it differs from the global one.
        let own = |m| VipConfig {
            table_size: Some(m),
            ..x.clone()
        };
        assert_eq!(
            config(4099, std::slice::from_ref(&x)),
            config(4099, &[own(4099)])
        );
        assert_ne!(
            config(4099, std::slice::from_ref(&x)),
            config(4099, &[own(1009)])
        );
    }
}

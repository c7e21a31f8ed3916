//! What picks a new flow's backend: a VIP's hash fields (`hash:`, e.g.
//! `[src_ip]` for client affinity), and the tier's secret hash key
//! (`hash_key_file`). Both end up in the one function the datapath and
//! `lbd` share, `lb_common::flow::pick_hash`; this module owns their
//! spelling in the file and their checks.
//!
//! Not here: the connection table, which keys every connection by its
//! whole 5-tuple whatever the VIP hashes on (so a connection keeps its
//! backend through a change of fields or key).

use std::{fmt, os::unix::fs::MetadataExt as _, path::Path};

use lb_common::consts::{
    VIP_F_HASH_FIELDS, VIP_F_HASH_NO_DPORT, VIP_F_HASH_NO_DST, VIP_F_HASH_NO_PROTO,
    VIP_F_HASH_NO_SPORT, VIP_F_HASH_SRC_V6_64,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::error::excerpt;

/// A VIP's hash fields, as the datapath's `VIP_F_HASH_*` bits (0: the
/// 5-tuple, the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HashFields(u16);

/// The fields by name, in the order they are written.
const NAMES: [&str; 5] = ["src_ip", "dst_ip", "protocol", "src_port", "dst_port"];

impl HashFields {
    /// The whole 5-tuple.
    pub const FIVE_TUPLE: HashFields = HashFields(0);

    /// The `VIP_F_HASH_*` bits.
    pub fn flags(self) -> u16 {
        self.0
    }

    pub fn is_default(&self) -> bool {
        self.0 == 0
    }

    /// The names of the fields hashed, as a file writes them.
    pub fn names(self) -> Vec<&'static str> {
        let left_out = [
            0,
            VIP_F_HASH_NO_DST,
            VIP_F_HASH_NO_PROTO,
            VIP_F_HASH_NO_SPORT,
            VIP_F_HASH_NO_DPORT,
        ];
        NAMES
            .iter()
            .zip(left_out)
            .filter(|(_, bit)| self.0 & bit == 0)
            .map(|(name, _)| match *name {
                "src_ip" if self.0 & VIP_F_HASH_SRC_V6_64 != 0 => "src_ip/64",
                n => n,
            })
            .collect()
    }

    /// Parses a list of field names; the source address is required (the
    /// balancer's choice is about clients), each field at most once.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut flags = VIP_F_HASH_FIELDS & !VIP_F_HASH_SRC_V6_64;
        let mut source = false;
        let mut seen = std::collections::BTreeSet::new();
        for raw in names {
            let name = raw.trim();
            if !seen.insert(name.to_string()) {
                return Err(format!("hash field {} is listed twice", excerpt(name)));
            }
            match name {
                "src_ip" | "src_ip/64" => {
                    if source {
                        return Err("src_ip and src_ip/64 are one field: list one".into());
                    }
                    source = true;
                    if name == "src_ip/64" {
                        flags |= VIP_F_HASH_SRC_V6_64;
                    }
                }
                "dst_ip" => flags &= !VIP_F_HASH_NO_DST,
                "protocol" => flags &= !VIP_F_HASH_NO_PROTO,
                "src_port" => flags &= !VIP_F_HASH_NO_SPORT,
                "dst_port" => flags &= !VIP_F_HASH_NO_DPORT,
                other => {
                    return Err(format!(
                        "unknown hash field {}, expected src_ip, src_ip/64, dst_ip, protocol, src_port or dst_port",
                        excerpt(other)
                    ));
                }
            }
        }
        if !source {
            return Err(
                "hash fields must include src_ip (or src_ip/64): the choice of backend is about the client".into(),
            );
        }
        Ok(HashFields(flags))
    }
}

impl fmt::Display for HashFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            return f.write_str("the 5-tuple");
        }
        write!(f, "[{}]", self.names().join(", "))
    }
}

impl Serialize for HashFields {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for HashFields {
    /// A list of names, or the same as one comma-separated string (as
    /// `lbctl vip add --hash src_ip,protocol` passes it).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            List(Vec<String>),
            Text(String),
        }
        let names: Vec<String> = match Written::deserialize(d)? {
            Written::List(l) => l,
            Written::Text(t) => t.split(',').map(String::from).collect(),
        };
        HashFields::parse(names.iter().map(String::as_str)).map_err(de::Error::custom)
    }
}

/// Reads a tier's hash key: 32 hexadecimal digits (128 bits; a trailing
/// newline is fine), in a regular file only its owner may read or write
/// (mode 0600 or 0400), as `openssl rand -hex 16 > FILE` makes one. The
/// key is a secret of the tier: every balancer must have the same one.
pub fn load_key(path: &Path) -> Result<[u64; 2], String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{shown} has mode {:o}: a hash key must be readable by its owner only (chmod 600)",
            meta.mode() & 0o777
        ));
    }
    if meta.len() > 64 {
        return Err(format!(
            "{shown} is {} bytes: a hash key is 32 hexadecimal digits",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    let digits = text.trim();
    if digits.len() != 32 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{shown}: a hash key is 32 hexadecimal digits (128 bits), e.g. from `openssl rand -hex 16`"
        ));
    }
    let value = u128::from_str_radix(digits, 16).map_err(|e| format!("{shown}: {e}"))?;
    let key = [(value >> 64) as u64, value as u64];
    if key == [0, 0] {
        return Err(format!(
            "{shown}: an all-zero key is no key (the public hash)"
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_lists_parse_print_and_are_checked() {
        let src = HashFields::parse(["src_ip"]).unwrap();
        assert_eq!(
            src.flags(),
            VIP_F_HASH_NO_DST | VIP_F_HASH_NO_PROTO | VIP_F_HASH_NO_SPORT | VIP_F_HASH_NO_DPORT
        );
        assert_eq!(src.names(), ["src_ip"]);
        assert_eq!(
            HashFields::parse(["src_ip", "dst_ip", "protocol", "src_port", "dst_port"]).unwrap(),
            HashFields::FIVE_TUPLE
        );
        let v6 = HashFields::parse(["src_ip/64", "protocol"]).unwrap();
        assert_eq!(v6.names(), ["src_ip/64", "protocol"]);
        assert_eq!(v6.to_string(), "[src_ip/64, protocol]");
        for (bad, want) in [
            (vec!["dst_ip"], "must include src_ip"),
            (vec!["src_ip", "src_ip"], "twice"),
            (vec!["src_ip", "src_ip/64"], "one field"),
            (vec!["src_ip", "mac"], "unknown hash field"),
        ] {
            let e = HashFields::parse(bad.clone()).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
        let from_text: HashFields = serde_yaml::from_str("src_ip, protocol").unwrap();
        let from_list: HashFields = serde_yaml::from_str("[src_ip, protocol]").unwrap();
        assert_eq!(from_text, from_list);
        assert_eq!(
            serde_yaml::to_string(&from_list).unwrap(),
            "- src_ip\n- protocol\n"
        );
    }

    #[test]
    fn key_files_must_be_private_hex_and_not_zero() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = crate::scratch::ScratchDir::new("hash-key");
        let path = dir.join("k");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("00112233445566778899aabbccddeeff\n", 0o600);
        assert_eq!(
            load_key(&path).unwrap(),
            [0x0011_2233_4455_6677, 0x8899_aabb_ccdd_eeff]
        );
        write("00112233445566778899aabbccddeeff\n", 0o644);
        assert!(load_key(&path).unwrap_err().contains("chmod 600"));
        // Too short, too long (each all hex), or 32 characters not all
        // hex: the same message, and no key of another length.
        for bad in [
            "not hex",
            "0112233445566778899aabbccddeeff",
            "000112233445566778899aabbccddeeff",
            "00112233445566778899aabbccddeefg",
        ] {
            write(bad, 0o600);
            let e = load_key(&path).unwrap_err();
            assert!(e.contains("32 hexadecimal digits"), "{bad}: {e}");
        }
        // The file may hold 64 bytes (the key with blanks around it), not
        // one more: that is refused before it is read.
        let padded = |n: usize| format!("00112233445566778899aabbccddeeff{}", "\n".repeat(n));
        write(&padded(32), 0o600);
        assert!(load_key(&path).is_ok(), "64 bytes");
        write(&padded(33), 0o600);
        let e = load_key(&path).unwrap_err();
        assert!(e.contains("is 65 bytes"), "{e}");
        write(&"0".repeat(32), 0o400);
        assert!(load_key(&path).unwrap_err().contains("all-zero"));
        assert!(load_key(&dir.join("missing")).is_err());
    }
}

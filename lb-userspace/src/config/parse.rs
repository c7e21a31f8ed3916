//! From YAML text to the configuration's raw form, reporting every problem
//! of a file in one run, within bounds an attacker cannot stretch.
//!
//! Bounds first: a file larger than [`MAX_CONFIG_BYTES`] is not read,
//! flow collections (`[...]`, `{...}`) nested deeper than
//! [`MAX_FLOW_DEPTH`] are refused before the YAML parser sees them (40,000
//! levels took the parser seven seconds), and aliases may not expand a
//! document past one value per byte (`alias_expansion`).
//!
//! Then the whole file is deserialized at once: serde_yaml stops at the
//! first problem, but it knows its line. If it fails, each top-level
//! setting, each VIP, and inside a VIP each backend and the health check
//! are deserialized on their own, so that every one that is wrong is
//! reported (with its path, and the first with its line), and the rest is
//! kept for the cross-field rules (`config::validate`).
//!
//! No I/O beyond reading the file it is given, and [`private_file`]'s look
//! at a key file it names.

use std::{io::Read as _, path::Path};

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

use super::{
    error::ConfigError,
    health::HealthCheck,
    vip::{BackendConfig, VipConfig},
};

/// The metadata of a key file (a BGP `password_file`, etcd's client key),
/// or why it is not one: unreadable, or readable by others than its owner.
pub fn private_file(path: &Path) -> Result<std::fs::Metadata, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} is readable by others (mode {:o}): `chmod 600` it",
            mode & 0o777
        ));
    }
    Ok(meta)
}

/// Largest configuration file `lbd` reads: room for thousands of VIPs
/// with hundreds of backends each.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Deepest nesting of YAML flow collections accepted (a configuration
/// needs three or four).
pub const MAX_FLOW_DEPTH: usize = 64;

/// What deserializing produced: the settings that parsed, every problem
/// found, and the paths of the parts left out because they did not parse
/// (rules about those parts would only repeat the problem).
pub struct Parsed<T> {
    pub raw: Option<T>,
    pub errors: Vec<ConfigError>,
    pub bad_paths: Vec<String>,
    /// For each VIP kept in `raw`, its index in the file.
    pub vip_index: Vec<usize>,
}

/// Reads `path`, refusing a file above [`MAX_CONFIG_BYTES`] without
/// reading it all. With `regular_only`, anything but a regular file is
/// refused: a FIFO or a device (`lbctl diff /dev/stdout`, run as root)
/// would block the running `lbd`'s reader for good, or read what was
/// never a configuration; the file is opened without blocking, so that a
/// FIFO is refused, not waited on.
pub fn read_bounded(path: &Path, regular_only: bool) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let flags = if regular_only { libc::O_NONBLOCK } else { 0 };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let kind = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .file_type();
    if regular_only && !kind.is_file() {
        return Err(format!(
            "{} is not a regular file (a FIFO, a socket or a device); a configuration is read from a file",
            path.display()
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "{} is larger than {} MiB, the most a configuration may be",
            path.display(),
            MAX_CONFIG_BYTES >> 20
        ));
    }
    Ok(text)
}

/// Refuses text no configuration needs: over the size limit, or flow
/// collections nested too deep.
pub fn precheck(text: &str) -> Result<(), String> {
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "the configuration is larger than {} MiB, the most it may be",
            MAX_CONFIG_BYTES >> 20
        ));
    }
    let depth = flow_depth(text);
    if depth > MAX_FLOW_DEPTH {
        return Err(format!(
            "brackets or braces nested {depth} deep; a configuration needs a few, at most {MAX_FLOW_DEPTH} are accepted"
        ));
    }
    alias_expansion(text)
}

/// The most values a document may expand to through its aliases: one per
/// byte (a document without aliases has fewer), and room for small ones.
fn max_values(bytes: usize) -> usize {
    bytes + 100_000
}

/// Refuses a document whose aliases (`*name`, repeating an `&name`
/// anchor) expand it past [`max_values`]: the parser charges an alias once
/// however large what it repeats, so 1 MB of aliases of a long list built
/// billions of values, and a desired state in etcd did that on every
/// balancer at once. Counted on the parser's events, building nothing; a
/// document without an anchor needs no count. Other problems are left to
/// the parse proper, which names them.
fn alias_expansion(text: &str) -> Result<(), String> {
    if !text.contains('&') {
        return Ok(());
    }
    let count = std::cell::Cell::new(0);
    let max = max_values(text.len());
    let counted = serde::de::DeserializeSeed::deserialize(
        NodeCount { count: &count, max },
        serde_yaml::Deserializer::from_str(text),
    );
    match counted {
        Err(_) if count.get() > max => Err(format!(
            "its aliases (*name) repeat anchored values (&name) to more than {max} values, more than a file of its size holds; write them out"
        )),
        _ => Ok(()),
    }
}

/// A visitor that counts the values the parser delivers (aliases
/// expanded) and fails past `max`, keeping none of them.
#[derive(Clone, Copy)]
struct NodeCount<'c> {
    count: &'c std::cell::Cell<usize>,
    max: usize,
}

impl NodeCount<'_> {
    fn tick<E: serde::de::Error>(self) -> Result<(), E> {
        self.count.set(self.count.get() + 1);
        if self.count.get() > self.max {
            return Err(E::custom("too many values"));
        }
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for NodeCount<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for NodeCount<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.tick()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.tick()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.tick()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.tick()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.tick()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.tick()?;
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.tick()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.tick()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!tag x`): the tag, then the value.
        use serde::de::VariantAccess as _;
        self.tick()?;
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

/// The deepest nesting of `[` and `{` outside quoted scalars and comments.
/// A quote opens a scalar only where a scalar may start (after `: `, `- `,
/// `[`, `{`, `,`, `?` or at a line's start), as in YAML; a `#` opens a
/// comment only at a line's start or after a blank.
pub fn flow_depth(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    // The last character that was not a blank, and the one just before.
    let (mut last_solid, mut prev) = ('\n', '\n');
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some('"') => match c {
                '\\' => {
                    chars.next();
                }
                '"' => quote = None,
                _ => {}
            },
            Some(_) => {
                if c == '\'' {
                    if chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
            }
            None => match c {
                '#' if prev.is_whitespace() => {
                    while chars.peek().is_some_and(|n| *n != '\n') {
                        chars.next();
                    }
                }
                '"' | '\'' if matches!(last_solid, '\n' | ':' | '-' | '[' | '{' | ',' | '?') => {
                    quote = Some(c)
                }
                '[' | '{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        if c == '\n' || !c.is_whitespace() {
            last_solid = c;
        }
        prev = c;
    }
    max
}

/// Deserializes `T` (the raw configuration) from `text`, reporting every
/// setting, VIP, backend and health check that does not parse.
pub fn deserialize_all<T>(text: &str, vips_key: &str) -> Parsed<T>
where
    T: serde::de::DeserializeOwned,
{
    let first = match serde_yaml::from_str::<T>(text) {
        Ok(raw) => {
            return Parsed {
                raw: Some(raw),
                errors: Vec::new(),
                bad_paths: Vec::new(),
                vip_index: Vec::new(),
            };
        }
        Err(e) => crate::config::error::serde_error(&e.to_string()),
    };
    let mut parsed = Parsed {
        raw: None,
        errors: Vec::new(),
        bad_paths: Vec::new(),
        vip_index: Vec::new(),
    };
    let Ok(Value::Mapping(mut top)) = serde_yaml::from_str::<Value>(text) else {
        // Not even YAML, or not a mapping: serde_yaml's one error says it.
        parsed.errors.push(first);
        return parsed;
    };
    check_settings::<T>(&mut top, vips_key, &mut parsed);
    if let Some(Value::Sequence(vips)) = top.get_mut(vips_key) {
        let mut kept = Vec::new();
        for (i, v) in vips.iter().enumerate() {
            match VipConfig::deserialize(v.clone()) {
                Ok(_) => {
                    kept.push(v.clone());
                    parsed.vip_index.push(i);
                }
                Err(e) => {
                    let at = format!("{vips_key}[{i}]");
                    parsed.errors.extend(vip_errors(&at, v, &e));
                    parsed.bad_paths.push(at);
                }
            }
        }
        *vips = kept;
    }
    match T::deserialize(Value::Mapping(top)) {
        Ok(raw) => parsed.raw = Some(raw),
        Err(e) => parsed.errors.push(error("", &e)),
    }
    merge_first(&mut parsed.errors, first);
    parsed
}

/// Deserializes each top-level setting but the VIP list (a sequence) on
/// its own; removes the ones that fail and reports them.
fn check_settings<T: serde::de::DeserializeOwned>(
    top: &mut Mapping,
    vips_key: &str,
    parsed: &mut Parsed<T>,
) {
    let mut bad = Vec::new();
    for (k, v) in top.iter() {
        let name = k
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{k:?}"));
        if name == vips_key && v.is_sequence() {
            continue;
        }
        let single = Mapping::from_iter([(k.clone(), v.clone())]);
        if let Err(e) = T::deserialize(Value::Mapping(single)) {
            let message = e.to_string();
            // An unknown key is the key's problem, not its value's.
            let at = if message.starts_with("unknown field") {
                String::new()
            } else {
                name.clone()
            };
            parsed.errors.push(error(&at, &e));
            parsed.bad_paths.push(name);
            bad.push(k.clone());
        }
    }
    for k in bad {
        top.remove(&k);
    }
}

/// The problems of one VIP that did not parse: each backend and the health
/// check on their own, then the rest of the VIP without them.
fn vip_errors(at: &str, value: &Value, whole: &serde_yaml::Error) -> Vec<ConfigError> {
    let Value::Mapping(vip) = value else {
        return vec![error(at, whole)];
    };
    let mut errors = Vec::new();
    let mut rest = vip.clone();
    if let Some(Value::Sequence(backends)) = vip.get("backends") {
        for (j, b) in backends.iter().enumerate() {
            if let Err(e) = BackendConfig::deserialize(b.clone()) {
                errors.push(error(&format!("{at}.backends[{j}]"), &e));
            }
        }
        rest.insert("backends".into(), Value::Sequence(Vec::new()));
    }
    if let Some(h) = vip.get("health_check") {
        if let Err(e) = HealthCheck::deserialize(h.clone()) {
            errors.push(error(&format!("{at}.health_check"), &e));
        }
        rest.remove("health_check");
    }
    if let Err(e) = VipConfig::deserialize(Value::Mapping(rest)) {
        errors.push(error(at, &e));
    }
    if errors.is_empty() {
        errors.push(error(at, whole));
    }
    errors
}

fn error(at: &str, e: &serde_yaml::Error) -> ConfigError {
    let inner = crate::config::error::serde_error(&e.to_string());
    let field = match (at.is_empty(), inner.field.is_empty()) {
        (true, _) => inner.field,
        (false, true) => at.to_string(),
        (false, false) => format!("{at}.{}", inner.field),
    };
    ConfigError {
        field,
        message: inner.message,
    }
}

/// Adds serde_yaml's first error (which knows its line) in place of the
/// same problem found again part by part (which does not).
fn merge_first(errors: &mut Vec<ConfigError>, first: ConfigError) {
    let same = |e: &ConfigError| {
        first.message.starts_with(&e.message)
            && (first.field.starts_with(&e.field) || e.field.starts_with(&first.field))
    };
    match errors.iter().position(same) {
        Some(i) => errors[i] = first,
        None => errors.insert(0, first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_depth_counts_real_brackets_only() {
        assert_eq!(flow_depth("a: [1, [2, {b: 3}]]"), 3);
        assert_eq!(flow_depth("a: \"[[[[\"\nb: '[[''[['"), 0);
        assert_eq!(flow_depth("a: x # [[[[[\nb: [1]"), 1);
        // A quote inside a plain scalar opens nothing.
        assert_eq!(flow_depth("a: don't [[x]]"), 2);
        // A `#` inside a quoted scalar is not a comment.
        assert_eq!(flow_depth("a: \"x #\" [[[x]]]"), 3);
        let deep = format!("a: {}{}", "[".repeat(40_000), "]".repeat(40_000));
        assert_eq!(flow_depth(&deep), 40_000);
        // An escaped quote does not end a double-quoted scalar.
        assert_eq!(flow_depth("a: \"x\\\"[[\" [y]"), 1);
        // Closing brackets count down.
        assert_eq!(flow_depth("a: [1]\nb: [2]\nc: {d: [3]}"), 2);
        // A `#` right after a character is part of the scalar.
        assert_eq!(flow_depth("a: b#[c]"), 1);
    }

    /// What the running `lbd` reads: a FIFO (nothing writing to it) or a
    /// device is refused at once, not read (a read of a FIFO would wait
    /// for a writer for good).
    #[test]
    fn only_a_regular_file_is_read() {
        let dir = crate::scratch::ScratchDir::new("config-fifo");
        let fifo = dir.join("lb.yaml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        for path in [fifo.as_path(), Path::new("/dev/null")] {
            let e = read_bounded(path, true).unwrap_err();
            assert!(e.contains("is not a regular file"), "{e}");
        }
        let file = dir.join("regular.yaml");
        std::fs::write(&file, "instance: a\n").unwrap();
        assert_eq!(
            crate::config::Config::read_file_text(&file).unwrap(),
            "instance: a\n"
        );
        assert!(crate::config::Config::read_file_text(&fifo).is_err());
        // `lbd check --config /dev/stdin` reads any kind of file.
        assert_eq!(
            read_bounded(Path::new("/dev/null"), false),
            Ok(String::new())
        );
    }

    /// The size and nesting limits are inclusive, for a file read and for
    /// text given whole: the most allowed passes, one more is refused.
    #[test]
    fn size_and_depth_limits_are_inclusive() {
        let dir = crate::scratch::ScratchDir::new("config-size");
        let most = MAX_CONFIG_BYTES as usize;
        let file = dir.join("lb.yaml");
        for (len, ok) in [(most, true), (most + 1, false), (most + 4096, false)] {
            std::fs::write(&file, " ".repeat(len)).unwrap();
            match read_bounded(&file, true) {
                Ok(text) => assert!(
                    ok && text.len() == most,
                    "{len} bytes read as {}",
                    text.len()
                ),
                Err(e) => assert!(!ok && e.contains("larger than 16 MiB"), "{len} bytes: {e}"),
            }
            assert_eq!(precheck(&" ".repeat(len)).is_ok(), ok, "{len} bytes");
        }
        let nested = |n: usize| format!("a: {}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(precheck(&nested(MAX_FLOW_DEPTH)), Ok(()));
        let e = precheck(&nested(MAX_FLOW_DEPTH + 1)).unwrap_err();
        assert!(e.contains("nested 65 deep"), "{e}");
    }

    /// Aliases that repeat a long anchored list expand a small document
    /// into more values than its size holds: refused before anything is
    /// built (helper-37: ~1 MB of them was 4·10¹⁰ values). An anchor used
    /// a few times, as operators do (one health check for every VIP), is
    /// fine, and so is an `&` in a string.
    #[test]
    fn aliases_that_expand_past_the_files_size_are_refused() {
        let list = vec!["0"; 20_000].join(",");
        let uses = vec!["*a"; 200].join(",");
        let bomb = format!("interfaces: [eth0]\njunk: &a [{list}]\nmore: [{uses}]\n");
        assert!(bomb.len() < 100_000, "{}", bomb.len());
        let e = precheck(&bomb).unwrap_err();
        assert!(e.contains("aliases"), "{e}");
        let shared = "check: &hc {interval: 2s, timeout: 1s}\nvips:\n".to_string()
            + &"  - {address: 10.0.0.1, health_check: *hc}\n".repeat(50);
        assert_eq!(precheck(&shared), Ok(()));
        assert_eq!(precheck("path: \"/health?a=1&b=2\"\n"), Ok(()));
        assert_eq!(precheck("not: [yaml\n&"), Ok(()), "left to the parse");
    }
}

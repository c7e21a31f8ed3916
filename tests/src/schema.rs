//! Every `lbctl -o json` output a rig test reads is checked against the
//! API's checked-in JSON Schema (`docs/api.schema.json`) by an
//! independent validator (the `jsonschema` crate), so the published
//! schema is held to what `lbctl` really prints, not only to what the
//! generator derives from the types.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::Value;

/// The checked-in document.
fn document() -> Result<&'static Value> {
    static DOC: OnceLock<Value> = OnceLock::new();
    if let Some(d) = DOC.get() {
        return Ok(d);
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.schema.json");
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let doc: Value = serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
    Ok(DOC.get_or_init(|| doc))
}

/// Validates `value` against the schema at `section`/`key` (validators
/// built once per key).
fn validate(section: &str, key: &str, value: &Value) -> Result<()> {
    static CACHE: OnceLock<Mutex<HashMap<String, jsonschema::Validator>>> = OnceLock::new();
    let doc = document()?;
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    let id = format!("{section}/{key}");
    if !cache.contains_key(&id) {
        let mut schema = if section == "response" {
            doc["response"].clone()
        } else {
            doc[section]
                .get(key)
                .cloned()
                .with_context(|| format!("docs/api.schema.json has no {section} {key:?}"))?
        };
        schema
            .as_object_mut()
            .context("a schema object")?
            .insert("$defs".into(), doc["$defs"].clone());
        let v = jsonschema::draft202012::new(&schema)
            .map_err(|e| anyhow!("the schema of {id} does not compile: {e}"))?;
        cache.insert(id.clone(), v);
    }
    let errors: Vec<String> = cache[&id]
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .take(5)
        .collect();
    if !errors.is_empty() {
        bail!(
            "output does not match docs/api.schema.json {id}: {}\n{value}",
            errors.join("; ")
        );
    }
    Ok(())
}

/// Checks what `lbctl ARGS` printed with `-o json` (ARGS include `-o
/// json`): lbd's answer to the request ARGS name, or lbctl's own output
/// for `simulate` without a port, `trace`, `backend drain --wait` and
/// `decap stats`. A command the schema does not know is an error.
pub fn check_output(args: &[&str], stdout: &str) -> Result<()> {
    let words = command_words(args);
    let doc = document()?;
    let starts = |key: &str| {
        let k: Vec<&str> = key.split(' ').collect();
        words.len() >= k.len() && words[..k.len()] == k[..]
    };
    let lines = || -> Result<Vec<Value>> {
        stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("a JSON line: {l}")))
            .collect()
    };
    if starts("trace") {
        return lines()?
            .iter()
            .try_for_each(|v| validate("lbctl", "trace", v));
    }
    if starts("backend drain") && args.contains(&"--wait") {
        let key = "backend drain --wait";
        return lines()?.iter().try_for_each(|v| validate("lbctl", key, v));
    }
    let value: Value = serde_json::from_str(stdout).context("lbctl -o json printed no JSON")?;
    for own in ["decap stats", "decap attach", "decap detach", "top"] {
        if starts(own) {
            return validate("lbctl", own, &value);
        }
    }
    if starts("simulate") && value.is_array() {
        return validate("lbctl", "simulate", &value);
    }
    let answers = doc["answers"].as_object().context("answers")?;
    let key = answers
        .keys()
        .filter(|k| starts(k))
        .max_by_key(|k| k.len())
        .with_context(|| {
            format!(
                "docs/api.schema.json has no answer for lbctl {}",
                args.join(" ")
            )
        })?;
    validate("answers", key, &value)
}

/// Checks a refusal `lbctl -o json` printed (`ok`, `code`, `error`)
/// against the schema's refusal and the answer line's.
pub fn check_refusal(value: &Value) -> Result<()> {
    validate("lbctl", "refusal", value)?;
    validate("response", "", value)
}

/// The command's words: ARGS without `-o json` and the options that come
/// before the command (`--dry-run`, `--confirm-within 2m`).
fn command_words<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if skip_value {
            skip_value = false;
        } else if matches!(
            *a,
            "-o" | "--output" | "--confirm-within" | "--socket" | "-s"
        ) {
            skip_value = true;
        } else if !a.starts_with('-') || !out.is_empty() {
            out.push(*a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_skip_the_options_before_the_command() {
        let w = command_words(&["-o", "json", "--dry-run", "backend", "del", "V", "--force"]);
        assert_eq!(w, ["backend", "del", "V", "--force"]);
        let w = command_words(&["--confirm-within", "2m", "-o", "json", "reload"]);
        assert_eq!(w, ["reload"]);
    }

    #[test]
    fn a_wrong_answer_is_caught_and_a_right_one_passes() {
        let good = r#"{"rows": [], "matched": 0, "searched": "8 buckets", "elapsed_ms": 0.5}"#;
        check_output(&["-o", "json", "conns"], good).unwrap();
        let bad = r#"{"rows": [], "matched": -1, "searched": "8 buckets", "elapsed_ms": 0.5}"#;
        assert!(check_output(&["-o", "json", "conns"], bad).is_err());
        assert!(check_output(&["-o", "json", "no-such-command"], "{}").is_err());
        check_refusal(&serde_json::json!({"ok": false, "code": "not_found", "error": "no VIP"}))
            .unwrap();
        assert!(check_refusal(&serde_json::json!({"ok": false, "code": "nope"})).is_err());
        assert!(check_refusal(&serde_json::json!({"ok": false, "code": "conflict"})).is_err());
    }
}

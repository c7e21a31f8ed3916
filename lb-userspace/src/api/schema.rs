//! The API's JSON Schema (draft 2020-12), generated from the wire types
//! with `schemars`: the request line ([`super::Envelope`]), the answer
//! line ([`super::Response`]), for each request (named as `lbctl`
//! spells it) the type of a successful answer's `data`, and the outputs
//! of `lbctl -o json` that are not an answer as it came. Checked in as
//! `docs/api.schema.json`; a unit test compares the two, so a change of
//! the wire shows in review (`UPDATE_SCHEMA=1` rewrites the file). The
//! stability promise is in `docs/API.md`.

use schemars::{SchemaGenerator, generate::SchemaSettings};
use serde_json::{Value, json};

use super::{
    API_VERSION, AnnounceStatus, Committed, Conns, Envelope, NodeChange, OverrideRow, Response,
    RevisionRow, RolloutPlan, Simulation, Stats, Status, TableInfo, TierStatus, TraceLeased,
    VipHealth, VipInfo,
};

/// Each request, as `lbctl` spells it, and the type of its answer's
/// `data` (`T[]`: a list of them). A test checks that every request
/// `lbctl` can send is here.
pub const ANSWERS: &[(&str, &str)] = &[
    ("status", "Status"),
    ("vip list", "VipInfo[]"),
    ("vip add", "Committed"),
    ("vip del", "Committed"),
    ("backend add", "Committed"),
    ("backend del", "Committed"),
    ("backend weight", "Committed"),
    ("backend drain", "Committed"),
    ("backend undrain", "Committed"),
    ("stats", "Stats"),
    ("health", "VipHealth[]"),
    ("table", "TableInfo"),
    ("simulate", "Simulation"),
    ("conns", "Conns"),
    ("reload", "Committed"),
    ("diff", "Committed"),
    ("history", "RevisionRow[]"),
    ("revert", "Committed"),
    ("confirm", "Committed"),
    ("trace-lease on", "TraceLeased"),
    ("trace-lease off", "null"),
    ("bgp", "AnnounceStatus"),
    ("node drain", "NodeChange"),
    ("node undrain", "NodeChange"),
    ("overrides list", "OverrideRow[]"),
    ("overrides clear", "Committed"),
    ("tier status", "TierStatus"),
    ("tier rollout", "RolloutPlan"),
];

/// The schema of answer type `name` (see [`ANSWERS`]), its types added
/// to `g`'s definitions.
fn answer(g: &mut SchemaGenerator, name: &str) -> Option<schemars::Schema> {
    let (one, list) = match name.strip_suffix("[]") {
        Some(one) => (one, true),
        None => (name, false),
    };
    let schema = match one {
        "null" => schemars::json_schema!({ "type": "null" }),
        "Status" => g.subschema_for::<Status>(),
        "VipInfo" => g.subschema_for::<VipInfo>(),
        "Committed" => g.subschema_for::<Committed>(),
        "Stats" => g.subschema_for::<Stats>(),
        "VipHealth" => g.subschema_for::<VipHealth>(),
        "TableInfo" => g.subschema_for::<TableInfo>(),
        "Simulation" => g.subschema_for::<Simulation>(),
        "Conns" => g.subschema_for::<Conns>(),
        "RevisionRow" => g.subschema_for::<RevisionRow>(),
        "TraceLeased" => g.subschema_for::<TraceLeased>(),
        "AnnounceStatus" => g.subschema_for::<AnnounceStatus>(),
        "NodeChange" => g.subschema_for::<NodeChange>(),
        "OverrideRow" => g.subschema_for::<OverrideRow>(),
        "TierStatus" => g.subschema_for::<TierStatus>(),
        "RolloutPlan" => g.subschema_for::<RolloutPlan>(),
        _ => return None,
    };
    Some(if list {
        schemars::json_schema!({ "type": "array", "items": schema })
    } else {
        schema
    })
}

/// What `lbctl -o json` prints where it is not lbd's answer as it came:
/// `simulate` without a client port (one answer per sample port),
/// `trace` and `backend drain --wait` (JSON Lines), `top` (three answers
/// together), `decap ...` (the backend's own program and maps), and a
/// refusal.
fn lbctl_outputs(g: &mut SchemaGenerator) -> Value {
    let simulation = g.subschema_for::<Simulation>().to_value();
    let line = g.subschema_for::<crate::trace::TraceLine>().to_value();
    let committed = g.subschema_for::<Committed>().to_value();
    let backend = g.subschema_for::<super::BackendInfo>().to_value();
    let stats = g.subschema_for::<Stats>().to_value();
    let health = g.subschema_for::<Vec<VipHealth>>().to_value();
    let bgp = g.subschema_for::<AnnounceStatus>().to_value();
    let iface = |key: &str| {
        json!({
            "type": "object",
            "properties": { key: { "type": "string" } },
            "required": [key]
        })
    };
    json!({
        "simulate": {
            "description": "lbctl simulate VIP CLIENT (no port): the answer for each sample client port",
            "type": "array",
            "items": {
                "allOf": [simulation, {
                    "type": "object",
                    "properties": { "client_port": { "type": "integer", "minimum": 0, "maximum": 65535 } },
                    "required": ["client_port"]
                }]
            }
        },
        "trace": {
            "description": "lbctl trace: one object per line, with the time it was read",
            "allOf": [line, {
                "type": "object",
                "properties": { "time": { "type": "string" } },
                "required": ["time"]
            }]
        },
        "backend drain --wait": {
            "description": "lbctl backend drain --wait, one JSON value per line: the drain's answer, then the backend as vip list shows it (null once removed) each time its live flows change, and at the end",
            "anyOf": [committed, backend, { "type": "null" }]
        },
        "top": {
            "description": "lbctl top -o json: what one refresh reads",
            "type": "object",
            "properties": { "stats": stats, "health": health, "bgp": bgp },
            "required": ["stats", "health", "bgp"]
        },
        "decap attach": iface("attached"),
        "decap detach": iface("detached"),
        "refusal": {
            "description": "printed on stdout when lbd refuses a request (exit status 1): the answer line without api and data",
            "type": "object",
            "properties": {
                "ok": { "const": false },
                "code": { "$ref": "#/$defs/ErrorKind" },
                "error": { "type": "string" }
            },
            "required": ["ok", "code", "error"]
        },
        "decap stats": {
            "description": "lbctl decap stats IFACE: each counter of the backend's decapsulation program",
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "packets": { "type": "integer", "minimum": 0 },
                    "bytes": { "type": "integer", "minimum": 0 }
                },
                "required": ["packets", "bytes"]
            }
        }
    })
}

/// The whole document: `request`, `response`, `answers` and `lbctl`
/// refer to the types in `$defs`.
pub fn document() -> Value {
    let mut g = SchemaSettings::draft2020_12().into_generator();
    let request = g.subschema_for::<Envelope>();
    let response = g.subschema_for::<Response>();
    let answers: serde_json::Map<String, Value> = ANSWERS
        .iter()
        .map(|(path, ty)| {
            let schema = answer(&mut g, ty).expect("every answer type has a schema");
            (path.to_string(), schema.to_value())
        })
        .collect();
    let lbctl = lbctl_outputs(&mut g);
    let defs: serde_json::Map<String, Value> = g.take_definitions(true).into_iter().collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "lbd API",
        "description": "One JSON request per line on lbd's Unix socket (request), one answer per line (response); a successful answer's data is answers[request]. See docs/API.md.",
        "api_version": API_VERSION,
        "request": request.to_value(),
        "response": response.to_value(),
        "answers": answers,
        "lbctl": lbctl,
        "$defs": defs,
    })
}

/// `data`'s schema for the request `path` (`section` "answers", or
/// "lbctl" for lbctl's own outputs) as a schema of its own (the
/// document's definitions beside it), to validate an answer with.
pub fn answer_schema(document: &Value, section: &str, path: &str) -> Option<Value> {
    let mut schema = document[section].get(path)?.clone();
    let object = schema.as_object_mut()?;
    object.insert("$defs".into(), document["$defs"].clone());
    Some(schema)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::{CommandFactory as _, Parser};

    use super::*;

    const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.schema.json");

    /// The checked-in schema is what the wire types say; with
    /// `UPDATE_SCHEMA=1` the file is rewritten instead.
    #[test]
    fn the_checked_in_schema_is_the_wire() {
        let text = serde_json::to_string_pretty(&document()).unwrap() + "\n";
        if std::env::var_os("UPDATE_SCHEMA").is_some() {
            std::fs::write(FILE, &text).unwrap();
        }
        let checked_in = std::fs::read_to_string(FILE).unwrap_or_default();
        assert!(
            checked_in == text,
            "docs/api.schema.json is not what the wire types generate: a change of the API's JSON. Review it, then rewrite the file with UPDATE_SCHEMA=1 cargo xtask test --unit (and say in docs/API.md whether it needs a new API version)"
        );
    }

    /// The requests `lbctl` can send, as paths (`vip add`).
    fn paths(cmd: &clap::Command, prefix: &str, out: &mut BTreeSet<String>) {
        for sub in cmd.get_subcommands() {
            let path = format!("{prefix}{}", sub.get_name());
            if sub.has_subcommands() {
                paths(sub, &format!("{path} "), out);
            } else {
                out.insert(path);
            }
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        request: super::super::Request,
    }

    #[test]
    fn every_request_has_its_answer_in_the_schema() {
        let mut requests = BTreeSet::new();
        paths(&Cli::command(), "", &mut requests);
        requests.remove("help");
        // Simulate is sent by lbctl simulate, not parsed as a request.
        requests.insert("simulate".into());
        let listed: BTreeSet<String> = ANSWERS.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(requests, listed);
        let doc = document();
        for (path, _) in ANSWERS {
            let schema = answer_schema(&doc, "answers", path).unwrap();
            assert!(schema.get("$defs").is_some(), "{path}");
        }
    }
}

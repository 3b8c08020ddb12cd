//! Reading records of every schema version: classify a JSON document (current, older,
//! newer, foreign) and bring older versions up to `SCHEMA_VERSION`.
//!
//! Version 0 is the pre-release draft layout: flat keys, no `format` or `schema_version`,
//! and raw per-repetition throughput samples under `results`. It is recognised by a
//! top-level string `mxtune` (the writer's version) next to a string `id`.

use super::schema::{FORMAT_MARKER, SCHEMA_VERSION, Stats};
use serde_json::{Map, Value, json};

/// Turn a parsed document into current-version JSON, or say why it is not a record we can read.
pub fn upgrade(doc: Value) -> Result<Value, String> {
    let Value::Object(obj) = &doc else {
        return Err(format!(
            "not an mxtune run record: the document is a JSON {}, not an object",
            json_kind(&doc)
        ));
    };
    match obj.get("format") {
        Some(Value::String(f)) if f == FORMAT_MARKER => {}
        Some(other) => {
            return Err(format!(
                "not an mxtune run record: `format` is {other}, expected \"{FORMAT_MARKER}\""
            ));
        }
        None if is_v0(obj) => return v0_to_v1(obj),
        None => {
            return Err(format!(
                "not an mxtune run record (no \"format\": \"{FORMAT_MARKER}\" key)"
            ));
        }
    }
    let version = obj
        .get("schema_version")
        .and_then(Value::as_u64)
        .ok_or("run record without a numeric `schema_version`")?;
    if version > u64::from(SCHEMA_VERSION) {
        return Err(format!(
            "written by a newer mxtune (schema v{version}; this build reads up to v{SCHEMA_VERSION}): upgrade mxtune to read it"
        ));
    }
    // Version 1 is current; later versions add their step here.
    Ok(doc)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_v0(obj: &Map<String, Value>) -> bool {
    obj.get("mxtune").is_some_and(Value::is_string) && obj.get("id").is_some_and(Value::is_string)
}

fn v0_to_v1(old: &Map<String, Value>) -> Result<Value, String> {
    let s = |k: &str| old.get(k).and_then(Value::as_str).map(str::to_string);
    let started = s("started").ok_or("v0 record without `started`")?;
    let status = s("status").ok_or("v0 record without `status`")?;
    let kind = s("target").unwrap_or_else(|| "attach".to_string());
    let mut results = Vec::new();
    for (i, r) in old
        .get("results")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let num = |k: &str| r.get(k).and_then(Value::as_u64).map(|n| n as u32);
        let pp = num("pp").ok_or(format!("v0 result {i} without `pp`"))?;
        let tg = num("tg").ok_or(format!("v0 result {i} without `tg`"))?;
        let samples = |k: &str| -> Option<Stats> {
            let v: Vec<f64> = r
                .get(k)?
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            Stats::from_samples(&v)
        };
        results.push(json!({
            "point": {"pp": pp, "tg": tg, "depth": num("depth").unwrap_or(0), "concurrency": 1},
            "pp_tps": samples("pp_tps"),
            "tg_tps": samples("tg_tps"),
            "requests": r.get("requests").cloned().unwrap_or(json!(0)),
            "errors": r.get("errors").cloned().unwrap_or(json!(0)),
        }));
    }
    let launch = old.get("argv").map(|argv| {
        json!({
            "argv": argv,
            "env": old.get("env").cloned().unwrap_or(json!({})),
            "container": null,
            "host": "",
            "port": 0,
            "served_model_name": s("model").unwrap_or_default(),
            "checks": [],
            "warnings": [],
        })
    });
    let docker = s("image").map(|image| json!({"image": image}));
    Ok(json!({
        "format": FORMAT_MARKER,
        "schema_version": SCHEMA_VERSION,
        "identity": {
            "run_id": s("id"),
            "started_at": started,
            "updated_at": s("finished").unwrap_or_else(|| started.clone()),
            "ended_at": s("finished"),
            "status": status,
            "reason": s("error"),
            "mxtune_version": s("mxtune"),
            "note": s("note"),
            "tags": old.get("tags").cloned().unwrap_or(json!([])),
        },
        "target": {
            "kind": kind,
            "preset": s("preset"),
            "flags": old.get("flags").cloned().unwrap_or(Value::Null),
            "launch": launch,
            "url": s("url"),
            "docker": docker,
            "model": s("model"),
        },
        "environment": {
            "host": {"hostname": s("host")},
        },
        "results": results,
    }))
}

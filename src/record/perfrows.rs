//! Perf rows: one measured figure per JSON object, appended to a JSON array file such as
//! `docs/perf/h100.json` (`--json-out`), so figures go from a benchmark's output into the
//! tree without hand copying. Appending keeps every earlier row byte for byte, and a file
//! that is not a JSON array is refused untouched.

use std::io::ErrorKind;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::env::BUILD_COMMIT;
use super::store;

/// What a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PerfKind {
    /// Decode steps: tokens generated per second over the batch.
    Decode,
    /// A prompt through the batched path: prompt tokens per second.
    Prefill,
    /// A server under `mxtune bench`: output tokens per second over all streams.
    Served,
}

/// One measured figure, in the schema of `docs/perf/h100.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerfRow {
    /// The model: a checkpoint's name or the synthetic shape (`gpt-oss-120b`, `tiny`, …).
    pub model: String,
    /// Weight layout (`Fp4Layers::layout_name`): `released`, `mxfp4-qkv-o` or `all-mxfp4`.
    pub layout: String,
    /// What was measured.
    pub kind: PerfKind,
    /// Sequences per step.
    pub batch: usize,
    /// Requests in flight (the batch, for the engine profile).
    pub concurrency: usize,
    /// Tokens already in the KV cache when the measurement starts.
    pub depth: usize,
    /// Tokens per second (the batch's aggregate).
    pub tok_s: f64,
    /// Share of the read-bandwidth roofline in percent (the counted bytes at `bandwidth_gbs`);
    /// null where no bandwidth roofline applies (a prefill is compute-bound).
    pub pct_roofline: Option<f64>,
    /// The read bandwidth the roofline is taken at, measured in the same run, GB/s; null for
    /// a served row (the client measures no bandwidth: compare it with the decode row of the
    /// same batch).
    pub bandwidth_gbs: Option<f64>,
    /// Served rows: the workload's prompt and generated tokens per request, and the
    /// latencies the client saw (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p50_ms: Option<f64>,
    /// Decode rows of `engine profile`: the median SM clock NVML read during the timed graph
    /// steps, MHz (absent where NVML could not be read, and in rows written before it was
    /// recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<f64>,
    /// The commit the binary was built from ([`BUILD_COMMIT`]).
    pub commit: String,
    /// The command line that measured it, shell-quoted.
    pub command: String,
    /// When, in UTC (RFC 3339, seconds).
    pub date: String,
}

impl PerfRow {
    /// A row of this process's measurement: the build's commit, this process's command line
    /// and the current time filled in.
    #[allow(clippy::too_many_arguments)]
    pub fn now(
        model: &str,
        layout: &str,
        kind: PerfKind,
        batch: usize,
        depth: usize,
        tok_s: f64,
        pct_roofline: Option<f64>,
        bandwidth_gbs: f64,
    ) -> Self {
        Self {
            model: model.to_string(),
            layout: layout.to_string(),
            kind,
            batch,
            concurrency: batch,
            depth,
            tok_s,
            pct_roofline,
            bandwidth_gbs: Some(bandwidth_gbs),
            pp: None,
            tg: None,
            tpot_p50_ms: None,
            tpot_p99_ms: None,
            ttft_p50_ms: None,
            sm_clock_mhz: None,
            commit: BUILD_COMMIT.to_string(),
            command: command_line(),
            date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }
    }
}

/// What `mxtune bench` measured at one point of its grid, for a served row.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedPoint {
    pub pp: u32,
    pub tg: u32,
    pub depth: u32,
    pub concurrency: u32,
    /// Output tokens per second over all streams (the point's mean batch total).
    pub tok_s: f64,
    pub tpot_p50_ms: Option<f64>,
    pub tpot_p99_ms: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
}

impl PerfRow {
    /// A served row of this process's measurement (`kind: served`, the batch equal to the
    /// concurrency, no bandwidth roofline).
    pub fn served(model: &str, layout: &str, p: &ServedPoint) -> Self {
        let c = p.concurrency as usize;
        Self {
            kind: PerfKind::Served,
            bandwidth_gbs: None,
            pp: Some(p.pp),
            tg: Some(p.tg),
            tpot_p50_ms: p.tpot_p50_ms,
            tpot_p99_ms: p.tpot_p99_ms,
            ttft_p50_ms: p.ttft_p50_ms,
            ..Self::now(
                model,
                layout,
                PerfKind::Served,
                c,
                p.depth as usize,
                p.tok_s,
                None,
                0.0,
            )
        }
    }
}

/// This process's command line, each argument shell-quoted, so it can be pasted back.
pub fn command_line() -> String {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    shell_words::join(argv)
}

/// The rows file's current text and its number of rows: None when it does not exist yet; an
/// error when it cannot be read or is not a JSON array.
fn read_rows_file(path: &Path) -> Result<Option<(String, usize)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    match serde_json::from_str::<Vec<serde_json::Value>>(&text) {
        Ok(rows) => Ok(Some((text, rows.len()))),
        Err(e) => bail!(
            "{} is not a JSON array of perf rows ({e}); left untouched — fix it, or name \
             another --json-out file",
            path.display()
        ),
    }
}

/// Check before a long measurement that `path` can take rows: a JSON array, or missing in
/// a directory that exists.
pub fn check_file(path: &Path) -> Result<()> {
    if read_rows_file(path)?.is_none() {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            bail!(
                "cannot create {}: directory {} does not exist",
                path.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// Append `rows` to the JSON array in `path`, creating it as `[rows]` when missing. The
/// earlier rows stay as they are written, one row per line is added, and the new file
/// replaces the old one atomically (temp file + rename), so a crash leaves the old file or
/// the new one. A file that is not a JSON array is an error, and is not touched.
pub fn append(path: &Path, rows: &[PerfRow]) -> Result<()> {
    let mut lines = Vec::with_capacity(rows.len());
    for r in rows {
        lines.push(serde_json::to_string(r).context("encoding a perf row")?);
    }
    // A non-empty array keeps its text up to its last element; its closing bracket moves
    // after the new rows. An empty or missing one is written afresh.
    let head = match read_rows_file(path)? {
        Some((text, n)) if n > 0 => {
            let body = text.trim_end().strip_suffix(']').with_context(|| {
                format!(
                    "{} parsed as an array but does not end in ]",
                    path.display()
                )
            })?;
            format!("{},\n", body.trim_end())
        }
        _ => "[\n".to_string(),
    };
    let new = format!("{head}{}\n]\n", lines.join(",\n"));
    store::stage(path, new.as_bytes())
        .and_then(|s| s.commit(true))
        .with_context(|| format!("writing perf rows to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tok_s: f64) -> PerfRow {
        PerfRow {
            model: "gpt-oss-120b".into(),
            layout: "released".into(),
            kind: PerfKind::Decode,
            batch: 4,
            concurrency: 4,
            depth: 0,
            tok_s,
            pct_roofline: Some(41.5),
            bandwidth_gbs: Some(3085.0),
            pp: None,
            tg: None,
            tpot_p50_ms: None,
            tpot_p99_ms: None,
            ttft_p50_ms: None,
            sm_clock_mhz: None,
            commit: "abc".into(),
            command: "mxtune engine profile --batch 4".into(),
            date: "2026-11-22T10:00:00Z".into(),
        }
    }

    fn read(path: &Path) -> Vec<PerfRow> {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn a_missing_file_is_created_with_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h100.json");
        append(&path, &[row(1.0), row(2.0)]).unwrap();
        assert_eq!(read(&path), vec![row(1.0), row(2.0)]);
    }

    #[test]
    fn appending_keeps_earlier_rows_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h100.json");
        // Hand-formatted earlier rows, with a field this schema does not know.
        let earlier = "[\n  {\"model\": \"x\", \"extra\": [1, 2]},\n  {\"tok_s\": 1.5}\n]\n";
        std::fs::write(&path, earlier).unwrap();
        append(&path, &[row(3.0)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let body = earlier.trim_end().strip_suffix(']').unwrap().trim_end();
        assert!(text.starts_with(body), "{text}");
        let all: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0]["extra"], serde_json::json!([1, 2]));
        assert_eq!(
            serde_json::from_value::<PerfRow>(all[2].clone()).unwrap(),
            row(3.0)
        );
        // Again, and into an empty array.
        append(&path, &[row(4.0)]).unwrap();
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .starts_with(&text[..text.len() - 3])
        );
        std::fs::write(&path, "[]\n").unwrap();
        append(&path, &[row(5.0)]).unwrap();
        assert_eq!(read(&path), vec![row(5.0)]);
    }

    #[test]
    fn a_file_that_is_not_a_json_array_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["{\"rows\": []}", "[{\"a\": 1},", "", "not json"] {
            let path = dir.path().join("rows.json");
            std::fs::write(&path, bad).unwrap();
            let err = append(&path, &[row(1.0)]).unwrap_err();
            assert!(
                format!("{err:#}").contains(&path.display().to_string()),
                "{err:#}"
            );
            assert!(check_file(&path).is_err());
            assert_eq!(std::fs::read(&path).unwrap(), bad.as_bytes());
        }
        // A new file needs its directory.
        assert!(check_file(&dir.path().join("new.json")).is_ok());
        assert!(check_file(&dir.path().join("absent").join("new.json")).is_err());
        // No temp file left behind beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn rows_carry_the_schema_names() {
        let v = serde_json::to_value(row(1.0)).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = [
            "model",
            "layout",
            "kind",
            "batch",
            "concurrency",
            "depth",
            "tok_s",
            "pct_roofline",
            "bandwidth_gbs",
            "commit",
            "command",
            "date",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(v["kind"], "decode");
        let prefill = PerfRow {
            kind: PerfKind::Prefill,
            pct_roofline: None,
            ..row(1.0)
        };
        let v = serde_json::to_value(prefill).unwrap();
        assert_eq!(v["kind"], "prefill");
        assert!(v["pct_roofline"].is_null());
    }

    #[test]
    fn a_decode_row_carries_its_clock_and_older_rows_read_without_it() {
        let r = PerfRow {
            sm_clock_mhz: Some(1830.0),
            ..row(1739.2)
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["sm_clock_mhz"], 1830.0);
        let back: PerfRow = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        // A row written before the field has no key and reads back as None.
        let old = serde_json::to_value(row(517.0)).unwrap();
        assert!(old.get("sm_clock_mhz").is_none());
        let back: PerfRow = serde_json::from_value(old).unwrap();
        assert_eq!(back.sm_clock_mhz, None);
    }

    #[test]
    fn a_served_row_names_its_workload_and_reads_back() {
        let r = PerfRow::served(
            "gpt-oss-120b",
            "released",
            &ServedPoint {
                pp: 512,
                tg: 128,
                depth: 0,
                concurrency: 16,
                tok_s: 600.5,
                tpot_p50_ms: Some(25.0),
                tpot_p99_ms: Some(27.5),
                ttft_p50_ms: Some(800.0),
            },
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "served");
        assert_eq!(v["batch"], 16);
        assert_eq!(v["concurrency"], 16);
        assert_eq!(v["pp"], 512);
        assert_eq!(v["tg"], 128);
        assert!(v["bandwidth_gbs"].is_null());
        assert!(v["pct_roofline"].is_null());
        assert_eq!(v["tpot_p99_ms"], 27.5);
        let back: PerfRow = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        // The decode rows written before served rows existed still read.
        let old = r#"{"model":"m","layout":"released","kind":"decode","batch":1,"concurrency":1,
            "depth":0,"tok_s":1.0,"pct_roofline":40.0,"bandwidth_gbs":3000.0,"commit":"c",
            "command":"x","date":"d"}"#;
        let old: PerfRow = serde_json::from_str(old).unwrap();
        assert_eq!(old.bandwidth_gbs, Some(3000.0));
        assert_eq!(old.pp, None);
    }

    #[test]
    fn a_new_row_names_this_build_and_command() {
        let r = PerfRow::now("tiny", "released", PerfKind::Decode, 2, 0, 1.0, None, 1.0);
        assert_eq!(r.commit, BUILD_COMMIT);
        assert!(!r.commit.is_empty());
        assert_eq!(r.concurrency, 2);
        assert!(chrono::DateTime::parse_from_rfc3339(&r.date).is_ok());
        assert!(!r.command.is_empty());
    }
}

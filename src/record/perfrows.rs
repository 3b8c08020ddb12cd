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
    /// The read bandwidth the roofline is taken at, measured in the same run, GB/s.
    pub bandwidth_gbs: f64,
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
            bandwidth_gbs,
            commit: BUILD_COMMIT.to_string(),
            command: command_line(),
            date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
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
            bandwidth_gbs: 3085.0,
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
    fn a_new_row_names_this_build_and_command() {
        let r = PerfRow::now("tiny", "released", PerfKind::Decode, 2, 0, 1.0, None, 1.0);
        assert_eq!(r.commit, BUILD_COMMIT);
        assert!(!r.commit.is_empty());
        assert_eq!(r.concurrency, 2);
        assert!(chrono::DateTime::parse_from_rfc3339(&r.date).is_ok());
        assert!(!r.command.is_empty());
    }
}

//! State file for engine children mxtune started (`<runs dir>/launched-engines.json`), so a
//! later `mxtune stop` can find them after the launching mxtune exited.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File name of the state file inside the runs directory.
pub const STATE_FILE: &str = "launched-engines.json";

/// One engine child mxtune started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRecord {
    /// Run id of the launch.
    pub run_id: String,
    /// Process id (= process group id).
    pub pid: u32,
    /// Start time of the process (clock ticks since boot, /proc/PID/stat field 22), so a
    /// reused pid is never signalled.
    pub start_ticks: Option<u64>,
    /// Program path.
    pub program: String,
    /// Base URL of its API.
    pub url: String,
    /// Its log file.
    pub log_path: String,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Records in the state file (none when it does not exist).
pub fn load(dir: &Path) -> Result<Vec<EngineRecord>> {
    let p = path(dir);
    match std::fs::read_to_string(&p) {
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!(
                "state file {} is corrupt; delete it after checking no engine runs",
                p.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read state file {}", p.display())),
    }
}

fn save(dir: &Path, records: &[EngineRecord]) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create runs directory {}", dir.display()))?;
    let p = path(dir);
    let tmp = dir.join(format!(".{STATE_FILE}.{}.tmp", std::process::id()));
    let text =
        serde_json::to_string_pretty(records).context("cannot serialize the engine state")?;
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &p).with_context(|| format!("cannot replace state file {}", p.display()))
}

/// Adds (or replaces, by run id) a record.
pub fn add(dir: &Path, rec: EngineRecord) -> Result<()> {
    let mut all = load(dir)?;
    all.retain(|r| r.run_id != rec.run_id);
    all.push(rec);
    save(dir, &all)
}

/// Removes the record of a run id.
pub fn remove(dir: &Path, run_id: &str) -> Result<()> {
    let mut all = load(dir)?;
    let before = all.len();
    all.retain(|r| r.run_id != run_id);
    if all.len() != before {
        save(dir, &all)?;
    }
    Ok(())
}

/// Start time of a process in clock ticks since boot, from /proc.
pub fn proc_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // A zombie has exited; only its parent has not collected it yet.
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the recorded process is still the one mxtune started.
pub fn is_alive(rec: &EngineRecord) -> bool {
    match (proc_start_ticks(rec.pid), rec.start_ticks) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_liveness_checks_start_time() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let me = std::process::id();
        let rec = EngineRecord {
            run_id: "r1".into(),
            pid: me,
            start_ticks: proc_start_ticks(me),
            program: "p".into(),
            url: "http://127.0.0.1:1".into(),
            log_path: "l".into(),
        };
        assert!(rec.start_ticks.is_some());
        add(dir.path(), rec.clone()).unwrap();
        add(
            dir.path(),
            EngineRecord {
                run_id: "r2".into(),
                ..rec.clone()
            },
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap().len(), 2);
        assert!(is_alive(&rec));
        let reused = EngineRecord {
            start_ticks: rec.start_ticks.map(|t| t + 1),
            ..rec.clone()
        };
        assert!(!is_alive(&reused));
        remove(dir.path(), "r1").unwrap();
        assert_eq!(
            load(dir.path()).unwrap(),
            vec![EngineRecord {
                run_id: "r2".into(),
                ..rec
            }]
        );
        std::fs::write(dir.path().join(STATE_FILE), "{").unwrap();
        assert!(format!("{:#}", load(dir.path()).unwrap_err()).contains("corrupt"));
    }
}

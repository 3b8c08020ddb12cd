//! The runs directory: one JSON file per run, written atomically, never clobbering
//! another run's file, and read back tolerantly (bad files are reported, not fatal).

use super::migrate;
use super::redact;
use super::schema::{FORMAT_MARKER, RunRecord, RunStatus, SCHEMA_VERSION};
use anyhow::{Context, Result, bail};
use chrono::Utc;
use rayon::prelude::*;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Directory used when neither `--runs-dir` nor `MXTUNE_RUNS_DIR` is given.
pub const DEFAULT_RUNS_DIR: &str = "runs";

/// A runs directory.
#[derive(Debug, Clone)]
pub struct RunStore {
    dir: PathBuf,
}

/// A record read from disk, with the file it came from.
#[derive(Debug, Clone)]
pub struct StoredRun {
    /// The record file.
    pub path: PathBuf,
    /// Its contents, migrated to the current schema.
    pub record: RunRecord,
}

/// A file in the runs directory that could not be read as a record.
#[derive(Debug, Clone, PartialEq)]
pub struct BadFile {
    /// The file.
    pub path: PathBuf,
    /// Why it was rejected, in words an operator can act on.
    pub reason: String,
}

/// Everything found in a runs directory.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Readable records, newest first.
    pub runs: Vec<StoredRun>,
    /// Files that look like records but could not be read.
    pub bad: Vec<BadFile>,
    /// Temp files left by interrupted writes (safe to delete once no mxtune is running).
    pub leftover_temps: Vec<PathBuf>,
}

impl RunStore {
    /// A store rooted at `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RunStore { dir: dir.into() }
    }

    /// The runs directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<UTC start, basic ISO 8601>-<preset or target kind>-<short id>.json`.
    pub fn file_name(record: &RunRecord) -> String {
        let ts = record.identity.started_at.format("%Y%m%dT%H%M%SZ");
        let label: String = record
            .label()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(48)
            .collect();
        let label = label.trim_matches(['-', '.']);
        let label = if label.is_empty() { "run" } else { label };
        format!("{ts}-{label}-{}.json", record.identity.run_id.short())
    }

    /// Write a new record (usually `running`) and return the handle that updates it.
    /// Fails rather than overwrite an existing file of the same name.
    pub fn create(&self, mut record: RunRecord) -> Result<RunHandle> {
        fs::create_dir_all(&self.dir).with_context(|| {
            format!(
                "cannot create runs directory {} (choose another with --runs-dir or MXTUNE_RUNS_DIR)",
                self.dir.display()
            )
        })?;
        sanitize(&mut record);
        let path = self.dir.join(Self::file_name(&record));
        let bytes = encode(&record)?;
        stage(&path, &bytes)?.commit(false)?;
        Ok(RunHandle { path, record })
    }

    /// Read every `*.json` file in the directory. A missing directory is an empty store.
    pub fn scan(&self) -> Result<Scan> {
        let mut scan = Scan::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(scan),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read runs directory {}", self.dir.display()));
            }
        };
        let mut candidates = Vec::new();
        for entry in entries {
            let entry = entry
                .with_context(|| format!("cannot list runs directory {}", self.dir.display()))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_our_temp(&name) {
                scan.leftover_temps.push(path);
                continue;
            }
            if name.starts_with('.')
                || !name.ends_with(".json")
                || NOT_RECORDS.contains(&name.as_str())
                || !path.is_file()
            {
                continue;
            }
            candidates.push(path);
        }
        // Records with raw timings are large; parse them on all cores.
        let loaded: Vec<(PathBuf, std::result::Result<RunRecord, String>)> = candidates
            .into_par_iter()
            .map(|path| {
                let r = load_file(&path);
                (path, r)
            })
            .collect();
        for (path, r) in loaded {
            match r {
                Ok(record) => scan.runs.push(StoredRun { path, record }),
                Err(reason) => scan.bad.push(BadFile { path, reason }),
            }
        }
        scan.runs.sort_by(|a, b| {
            (b.record.identity.started_at, b.record.identity.run_id)
                .cmp(&(a.record.identity.started_at, a.record.identity.run_id))
        });
        scan.bad.sort_by(|a, b| a.path.cmp(&b.path));
        scan.leftover_temps.sort();
        Ok(scan)
    }

    /// Find one run by run id prefix, short id (the random suffix) or file name.
    pub fn find(&self, key: &str) -> Result<StoredRun> {
        let scan = self.scan()?;
        let matches = find_in(&scan.runs, key);
        match matches.as_slice() {
            [one] => Ok((*one).clone()),
            [] => {
                let hint = if scan.bad.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} file(s) there could not be read (see `mxtune runs list`)",
                        scan.bad.len()
                    )
                };
                bail!(
                    "no run matches `{key}` in {} ({} run(s) there){hint}",
                    self.dir.display(),
                    scan.runs.len()
                )
            }
            many => bail!(
                "`{key}` matches {} runs in {}: {}; give more characters of the id",
                many.len(),
                self.dir.display(),
                many.iter()
                    .map(|r| r.record.identity.run_id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Runs matching `key` as an id prefix, short id, or file name (with or without `.json`).
pub fn find_in<'a>(runs: &'a [StoredRun], key: &str) -> Vec<&'a StoredRun> {
    let k = key.trim().to_ascii_uppercase();
    if k.is_empty() {
        return Vec::new();
    }
    runs.iter()
        .filter(|r| {
            let id = r.record.identity.run_id.to_string();
            let file = r
                .path
                .file_name()
                .map(|f| f.to_string_lossy().to_ascii_uppercase())
                .unwrap_or_default();
            id.starts_with(&k)
                || (k.len() >= 4 && id.ends_with(&k))
                || file == k
                || file.strip_suffix(".JSON") == Some(&k)
        })
        .collect()
}

/// Read and migrate one record file; the error is the reason in words.
pub fn load_file(path: &Path) -> std::result::Result<RunRecord, String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("empty file (the writer stopped before its first write completed)".into());
    }
    // Fast path: a current-version record parses straight into the types, without the
    // intermediate JSON tree (records with raw timings run to hundreds of KB).
    if let Ok(mut record) = serde_json::from_slice::<RunRecord>(&bytes)
        && record.format == FORMAT_MARKER
        && record.schema_version == SCHEMA_VERSION
    {
        sanitize(&mut record);
        return Ok(record);
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
            serde_json::error::Category::Eof => {
                format!(
                    "truncated JSON (ends at line {} column {})",
                    e.line(),
                    e.column()
                )
            }
            _ => format!("corrupt JSON: {e}"),
        })?;
    let doc = migrate::upgrade(doc)?;
    let mut record: RunRecord =
        serde_json::from_value(doc).map_err(|e| format!("invalid run record: {e}"))?;
    // Files written by hand or by older builds may hold secrets; never show them.
    sanitize(&mut record);
    Ok(record)
}

/// A record on disk that this process owns and keeps up to date.
#[derive(Debug)]
pub struct RunHandle {
    path: PathBuf,
    record: RunRecord,
}

impl RunHandle {
    /// The record file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record as last written.
    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// Change the record and write it atomically; the file on disk is either the old or
    /// the new version, never a mix.
    pub fn update(&mut self, change: impl FnOnce(&mut RunRecord)) -> Result<()> {
        let mut next = self.record.clone();
        change(&mut next);
        next.identity.updated_at = Utc::now();
        sanitize(&mut next);
        let bytes = encode(&next)?;
        stage(&self.path, &bytes)?.commit(true)?;
        self.record = next;
        Ok(())
    }

    /// Set a final status (with the reason for failed/aborted) and the end time, and write.
    pub fn finish(&mut self, status: RunStatus, reason: Option<String>) -> Result<()> {
        self.update(|r| {
            r.identity.status = status;
            r.identity.reason = reason;
            r.identity.ended_at = Some(Utc::now());
        })
    }
}

/// Redact secrets wherever the launch or the flag set could carry them.
fn sanitize(record: &mut RunRecord) {
    if let Some(spec) = record.target.launch.as_mut() {
        redact::redact_launch(spec);
    }
    redact::redact_json(&mut record.target.flags);
    if let Some(url) = record.target.url.as_mut() {
        *url = redact::redact_url(url);
    }
}

fn encode(record: &RunRecord) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(record).with_context(|| {
        format!(
            "cannot serialize run record {} (a NaN or infinite number in the data?)",
            record.identity.run_id
        )
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

const TEMP_SUFFIX: &str = ".tmp";

/// JSON files other modules keep in the runs directory that are not run records
/// (`launch`'s table of engine processes it started).
pub const NOT_RECORDS: &[&str] = &["launched-engines.json"];

/// Is this one of our temp files, `.<record>.json.<pid>.<n>.tmp`? Other writers' temp
/// files in the directory are not ours to report.
fn is_our_temp(name: &str) -> bool {
    let Some(stem) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
    else {
        return false;
    };
    let mut parts = stem.rsplitn(3, '.');
    let numeric =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    numeric(parts.next())
        && numeric(parts.next())
        && parts.next().is_some_and(|r| r.ends_with(".json"))
}

/// A fully written and fsynced temp file beside its destination, not yet visible under
/// the final name. Dropping it without `commit` leaves the temp file behind — exactly what
/// a crash at that moment does — and readers ignore it.
#[derive(Debug)]
pub struct Staged {
    temp: PathBuf,
    dest: PathBuf,
}

/// Write `bytes` to a temp file in `dest`'s directory and fsync it.
pub fn stage(dest: &Path, bytes: &[u8]) -> Result<Staged> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = parent_dir(dest);
    let name = dest
        .file_name()
        .with_context(|| format!("record path {} has no file name", dest.display()))?
        .to_string_lossy();
    let temp = dir.join(format!(
        ".{name}.{}.{}{TEMP_SUFFIX}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&temp);
        return Err(e).with_context(|| format!("cannot write temp file {}", temp.display()));
    }
    Ok(Staged {
        temp,
        dest: dest.to_path_buf(),
    })
}

impl Staged {
    /// The temp file holding the new contents.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Make the staged contents visible under the final name and fsync the directory.
    /// With `replace` false an existing file is never overwritten (hard link, which fails
    /// if the name exists); with `replace` true the file is atomically replaced (rename).
    pub fn commit(self, replace: bool) -> Result<()> {
        let result = if replace {
            fs::rename(&self.temp, &self.dest)
        } else {
            match fs::hard_link(&self.temp, &self.dest) {
                Ok(()) => fs::remove_file(&self.temp),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(e),
                // Filesystems without hard links (FAT, some network mounts): check, then
                // rename. Run ids are unique, so the window only matters for a copied file.
                Err(_) if self.dest.exists() => Err(ErrorKind::AlreadyExists.into()),
                Err(_) => fs::rename(&self.temp, &self.dest),
            }
        };
        if let Err(e) = result {
            let _ = fs::remove_file(&self.temp);
            if e.kind() == ErrorKind::AlreadyExists {
                bail!(
                    "run record {} already exists; refusing to overwrite another run's file",
                    self.dest.display()
                );
            }
            return Err(e).with_context(|| {
                format!(
                    "cannot move {} to {}",
                    self.temp.display(),
                    self.dest.display()
                )
            });
        }
        let dir = parent_dir(&self.dest);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot fsync runs directory {}", dir.display()))
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

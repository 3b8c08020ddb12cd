//! The matrix state file (`matrix-state.json` in the output directory): the plan, the
//! shuffled order and its seed, and each preset's progress. Written atomically after every
//! change, so an interrupted matrix (Ctrl-C, SSH drop, crash) resumes where it stopped.

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::plan::{Grid, TestLevel};
use crate::bench::client::Endpoint;
use crate::vocab::TargetKind;

/// File name of the state inside the output directory.
pub const STATE_FILE: &str = "matrix-state.json";
/// Format tag of the state file.
pub const STATE_FORMAT: &str = "mxtune.matrix-state";

/// Everything needed to run (or resume) a matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixPlan {
    /// Docker or the bundled engine.
    pub target: TargetKind,
    /// Presets as given, in the operator's order (the first is the baseline of deltas).
    pub presets: Vec<String>,
    /// Levels to run.
    pub levels: Vec<TestLevel>,
    /// The performance grid.
    pub grid: Grid,
    /// Endpoint benchmarks use.
    pub endpoint: Endpoint,
    /// Shuffle seed; `None` keeps the given order.
    pub seed: Option<u64>,
    /// Wait until the GPU is below this temperature before each measured point, °C.
    pub cooldown_c: Option<f64>,
    /// Give up waiting for the cool-down after this many seconds.
    pub cooldown_limit_s: u64,
    /// Start-up watchdog of L1, seconds.
    pub startup_limit_s: u64,
    /// Regression tolerance of L5 (0.05 = ± 5 %).
    pub tolerance: f64,
    /// Presets directory searched first.
    pub presets_dir: Option<PathBuf>,
    /// Runs directory for the per-preset records.
    pub runs_dir: PathBuf,
    /// Engine binary (default: this mxtune).
    pub engine_bin: Option<PathBuf>,
    /// Engine device override (`--device`).
    pub device: Option<String>,
    /// Engine model override (`--engine-model`, e.g. `synthetic:gpt-oss-120b`).
    #[serde(default)]
    pub engine_model: Option<String>,
    /// hosts.toml hosts whose Docker engines run the presets (`--host`, repeatable): the
    /// presets are dealt out over them in run order and each host runs its share at the same
    /// time as the others; empty: this machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Hosts given their own presets (`--host NAME=PRESET,…`): each runs its list, and the
    /// other presets are dealt out over the hosts without one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_presets: BTreeMap<String, Vec<String>>,
}

/// Where one preset stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PresetStatus {
    /// Not started.
    Pending,
    /// Started; a state left like this means the matrix process died.
    Running,
    /// Stopped by an interrupt; rerun on resume.
    Interrupted,
    /// All levels ran (some may have failed).
    Done,
    /// Could not launch or crashed; not rerun on resume.
    Failed,
}

impl PresetStatus {
    /// Finished presets are not rerun on resume.
    pub fn finished(self) -> bool {
        matches!(self, PresetStatus::Done | PresetStatus::Failed)
    }
}

/// One level's outcome for a preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelOutcome {
    /// The level.
    pub level: TestLevel,
    /// `pass`, `fail`, `invalid`, `unknown`, `skipped`, `no baseline`.
    pub verdict: String,
    /// Why, in one line.
    pub detail: String,
}

/// Progress of one preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresetProgress {
    /// Preset name.
    pub name: String,
    /// Status.
    pub status: PresetStatus,
    /// Attempts so far (resume after an interrupt adds one).
    pub attempts: u32,
    /// Run id of the finished attempt's record.
    pub run_id: Option<String>,
    /// Path of that record.
    pub record: Option<PathBuf>,
    /// Level verdicts of the finished attempt.
    pub levels: Vec<LevelOutcome>,
    /// GPU temperature before each measured point, °C (absent without a GPU).
    pub point_temps_c: Vec<Option<f64>>,
    /// Performance results are INVALID (L1.5 said the flags did not take effect).
    pub invalid: bool,
    /// The hosts.toml host that runs this preset; `None`: this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl PresetProgress {
    /// The preset's name, with its host when it runs on one: `baseline (host spark2)`.
    pub fn label(&self) -> String {
        match &self.host {
            Some(h) => format!("{} (host {h})", self.name),
            None => self.name.clone(),
        }
    }

    /// Take a finished run's outcome: status, record, levels, temperatures, validity.
    pub fn finish(&mut self, o: super::run::PresetOutcome) {
        self.status = o.status;
        self.run_id = o.run_id;
        self.record = o.record;
        self.levels = o.levels;
        self.point_temps_c = o.temps;
        self.invalid = o.invalid;
    }
}

/// The state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixState {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// Matrix id (ULID), also a tag on every record (`matrix:<id>`).
    pub matrix_id: String,
    /// When the matrix was first started.
    pub started_at: DateTime<Utc>,
    /// Updated on every write.
    pub updated_at: DateTime<Utc>,
    /// The plan.
    pub plan: MatrixPlan,
    /// Presets in run order (shuffled when a seed is set).
    pub order: Vec<PresetProgress>,
    /// How many times the matrix was resumed.
    pub resumes: u32,
}

impl MatrixState {
    /// A fresh state: presets in `order`, all pending; with hosts, a preset of a host's own
    /// list goes to that host and the others are dealt out, in that order, over the hosts
    /// without a list.
    pub fn new(plan: MatrixPlan, order: Vec<String>) -> Self {
        let now = Utc::now();
        let mut dealers: Vec<&String> = plan
            .hosts
            .iter()
            .filter(|h| !plan.host_presets.contains_key(*h))
            .collect();
        // Every host has a list (the plan allows no preset outside them then).
        if dealers.is_empty() {
            dealers = plan.hosts.iter().collect();
        }
        let mut dealt = 0;
        let mut host_of = |name: &str| -> Option<String> {
            if let Some((h, _)) = plan
                .host_presets
                .iter()
                .find(|(_, list)| list.iter().any(|p| p == name))
            {
                return Some(h.clone());
            }
            let h = dealers
                .get(dealt % dealers.len().max(1))
                .map(|h| (*h).clone());
            dealt += 1;
            h
        };
        let order = order
            .into_iter()
            .map(|name| PresetProgress {
                host: host_of(&name),
                name,
                status: PresetStatus::Pending,
                attempts: 0,
                run_id: None,
                record: None,
                levels: Vec::new(),
                point_temps_c: Vec::new(),
                invalid: false,
            })
            .collect();
        MatrixState {
            format: STATE_FORMAT.to_owned(),
            matrix_id: ulid::Ulid::generate().to_string(),
            started_at: now,
            updated_at: now,
            plan,
            order,
            resumes: 0,
        }
    }

    /// Index of the first preset of `host` that still has to run.
    pub fn next_unfinished_on(&self, host: Option<&str>) -> Option<usize> {
        self.order
            .iter()
            .position(|p| !p.status.finished() && p.host.as_deref() == host)
    }

    /// Index of the first preset that still has to run.
    pub fn next_unfinished(&self) -> Option<usize> {
        self.order.iter().position(|p| !p.status.finished())
    }

    /// Every preset finished.
    pub fn complete(&self) -> bool {
        self.next_unfinished().is_none()
    }

    /// Path of the state file in `out`.
    pub fn path(out: &Path) -> PathBuf {
        out.join(STATE_FILE)
    }

    /// Reads the state of an earlier matrix from `out`.
    pub fn load(out: &Path) -> Result<Self> {
        let path = Self::path(out);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} to resume: was a matrix started with --out {}?",
                path.display(),
                out.display()
            )
        })?;
        let s: MatrixState = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a matrix state file", path.display()))?;
        if s.format != STATE_FORMAT {
            bail!(
                "{} has format `{}`, expected `{STATE_FORMAT}`",
                path.display(),
                s.format
            );
        }
        Ok(s)
    }

    /// Writes the state atomically (temp file + rename), so a crash never leaves half a file.
    pub fn save(&mut self, out: &Path) -> Result<()> {
        self.updated_at = Utc::now();
        std::fs::create_dir_all(out).with_context(|| {
            format!(
                "cannot create the matrix output directory {}",
                out.display()
            )
        })?;
        let path = Self::path(out);
        let tmp = out.join(format!(".{STATE_FILE}.{}.tmp", std::process::id()));
        let text = serde_json::to_string_pretty(self).context("serializing the matrix state")?;
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> MatrixPlan {
        MatrixPlan {
            target: TargetKind::Engine,
            presets: vec!["a".into(), "b".into()],
            levels: vec![TestLevel::Smoke],
            grid: Grid::default(),
            endpoint: Endpoint::Chat,
            seed: Some(1),
            cooldown_c: None,
            cooldown_limit_s: 600,
            startup_limit_s: 300,
            tolerance: 0.05,
            presets_dir: None,
            runs_dir: PathBuf::from("runs"),
            engine_bin: None,
            device: None,
            engine_model: None,
            hosts: Vec::new(),
            host_presets: BTreeMap::new(),
        }
    }

    #[test]
    fn presets_are_dealt_out_over_the_hosts_in_run_order() {
        let mut p = plan();
        p.hosts = vec!["spark1".into(), "spark2".into()];
        let mut s = MatrixState::new(p, vec!["c".into(), "a".into(), "b".into()]);
        let hosts: Vec<Option<&str>> = s.order.iter().map(|p| p.host.as_deref()).collect();
        assert_eq!(hosts, [Some("spark1"), Some("spark2"), Some("spark1")]);
        assert_eq!(s.order[1].label(), "a (host spark2)");
        assert_eq!(s.next_unfinished_on(Some("spark1")), Some(0));
        s.order[0].status = PresetStatus::Done;
        assert_eq!(s.next_unfinished_on(Some("spark1")), Some(2));
        assert_eq!(s.next_unfinished_on(Some("spark2")), Some(1));
        assert_eq!(s.next_unfinished_on(None), None);
        // A state without hosts reads as before (the key is left out).
        let plain = MatrixState::new(plan(), vec!["a".into()]);
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("host"), "{json}");
    }

    #[test]
    fn a_host_with_its_own_list_runs_it_and_the_rest_are_dealt_out_over_the_others() {
        let mut p = plan();
        p.hosts = vec!["spark1".into(), "spark2".into(), "spark3".into()];
        p.host_presets
            .insert("spark2".into(), vec!["b".into(), "d".into()]);
        let order = ["d", "a", "b", "c", "e"].map(String::from).to_vec();
        let s = MatrixState::new(p, order);
        let hosts: Vec<(&str, Option<&str>)> = s
            .order
            .iter()
            .map(|p| (p.name.as_str(), p.host.as_deref()))
            .collect();
        assert_eq!(
            hosts,
            [
                ("d", Some("spark2")),
                ("a", Some("spark1")),
                ("b", Some("spark2")),
                ("c", Some("spark3")),
                ("e", Some("spark1")),
            ]
        );
        // The lists are kept in the state, so a resume deals the same way.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["plan"]["host_presets"],
            serde_json::json!({"spark2": ["b", "d"]})
        );
        let back: MatrixState = serde_json::from_value(json).unwrap();
        assert_eq!(back.plan.host_presets, s.plan.host_presets);
    }

    #[test]
    fn state_round_trips_and_finds_the_first_unfinished_preset() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MatrixState::new(plan(), vec!["b".into(), "a".into()]);
        s.order[0].status = PresetStatus::Done;
        s.order[1].status = PresetStatus::Interrupted;
        s.save(dir.path()).unwrap();
        let back = MatrixState::load(dir.path()).unwrap();
        assert_eq!(back.order, s.order);
        assert_eq!(back.next_unfinished(), Some(1));
        assert!(!back.complete());
    }

    #[test]
    fn missing_state_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = MatrixState::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(STATE_FILE), "{e}");
    }
}

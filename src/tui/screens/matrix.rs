//! The Bench screen's matrix view (`m`) and quick A/B (`a` marks the current flags as A, `A`
//! runs A against the current flags). Both run the headless runners (`mxtune matrix`,
//! `mxtune ab`) on the panel's background runtime and follow their progress events; Esc
//! cancels (a matrix stays resumable with `mxtune matrix --resume --out DIR`).

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Wrap};

use crate::flags::FlagSet;
use crate::launch::cli::TargetArg;
use crate::matrix::ab::{AbOutcome, Ratio};
use crate::matrix::cli::{
    AbArgs, CommonArgs, DEFAULT_AB_ROUNDS, DEFAULT_LEVELS, MatrixArgs, MatrixOutcome,
};
use crate::matrix::plan::{TestLevel, parse_levels};
use crate::matrix::progress::MatrixEvent;
use crate::matrix::state::{LevelOutcome, PresetStatus};
use crate::record::compare::{Noise, parse_noise_sigmas, sigmas_text};
use crate::record::schema::WorkloadPoint;
use crate::vocab::TargetKind;

use super::super::app::{App, Effect};
use super::super::theme::Theme;
use super::bench::FIELDS;

/// Which part of the Bench screen is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BenchView {
    /// The workload form and the benchmark's results.
    #[default]
    Form,
    /// The matrix view.
    Matrix,
    /// The quick A/B.
    Ab,
}

/// Where a matrix or A/B stands.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    /// Running.
    Running,
    /// Esc was pressed: the target is being stopped, the records saved.
    Cancelling,
    /// Ended.
    Finished {
        /// Cancelled before the end.
        interrupted: bool,
        /// Every verdict passed (matrix) / at least one valid round (A/B).
        passed: bool,
    },
    /// Could not run at all.
    Failed(String),
}

impl JobState {
    /// Whether it may still be running.
    pub fn is_active(&self) -> bool {
        matches!(self, JobState::Running | JobState::Cancelling)
    }
}

/// One preset of a running matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetRow {
    /// Preset name.
    pub name: String,
    /// Where it stands.
    pub status: PresetStatus,
    /// What its target is doing now, a few words.
    pub phase: String,
    /// L4 points done and in the grid.
    pub points: (usize, usize),
    /// Level verdicts once finished.
    pub levels: Vec<LevelOutcome>,
    /// Its run record.
    pub record: Option<PathBuf>,
}

/// A matrix started from the view.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixRun {
    /// Matrix id (once planned).
    pub matrix_id: String,
    /// Output directory: state, report, charts.
    pub out: PathBuf,
    /// The levels it runs.
    pub levels: Vec<TestLevel>,
    /// Presets in run order.
    pub rows: Vec<PresetRow>,
    /// Where it stands.
    pub state: JobState,
    /// The cool-down in progress, if any.
    pub cooldown: Option<String>,
    /// The markdown report, once written.
    pub report: Option<PathBuf>,
    /// Problems that did not stop the run.
    pub warnings: Vec<String>,
}

impl MatrixRun {
    /// Apply one progress event.
    pub fn on_event(&mut self, ev: &MatrixEvent) {
        let row = |rows: &mut Vec<PresetRow>, name: &str| rows.iter().position(|r| r.name == name);
        match ev {
            MatrixEvent::Planned {
                matrix_id, order, ..
            } => {
                self.matrix_id = matrix_id.clone();
                self.rows = order
                    .iter()
                    .map(|n| PresetRow {
                        name: n.clone(),
                        status: PresetStatus::Pending,
                        phase: String::new(),
                        points: (0, 0),
                        levels: Vec::new(),
                        record: None,
                    })
                    .collect();
            }
            MatrixEvent::PresetStarted { name, .. } => {
                if let Some(i) = row(&mut self.rows, name) {
                    let r = &mut self.rows[i];
                    r.status = PresetStatus::Running;
                    r.phase = "launching".into();
                    r.levels.clear();
                    r.points = (0, 0);
                }
            }
            MatrixEvent::TargetPhase { preset, phase } => {
                if let Some(i) = row(&mut self.rows, preset) {
                    self.rows[i].phase = phase.clone();
                }
            }
            MatrixEvent::TargetWarning { preset, message } => {
                self.warnings.push(format!("{preset}: {message}"))
            }
            MatrixEvent::TargetFailed { preset, message } => {
                if let Some(i) = row(&mut self.rows, preset) {
                    self.rows[i].phase = "failed".into();
                }
                self.warnings.push(format!("{preset}: {message}"));
            }
            MatrixEvent::Ready { preset, startup_s } => {
                if let Some(i) = row(&mut self.rows, preset) {
                    let r = &mut self.rows[i];
                    r.phase = format!("ready after {startup_s:.1} s");
                    // L1 passed as it happens; the full verdicts replace this at the end.
                    r.levels = vec![LevelOutcome {
                        level: TestLevel::Smoke,
                        verdict: "pass".into(),
                        detail: r.phase.clone(),
                    }];
                }
            }
            MatrixEvent::CoolDown {
                host,
                celsius,
                threshold,
            } => {
                self.cooldown = Some(format!(
                    "cool-down: GPU{} at {celsius:.0} °C, waiting for < {threshold:.0} °C",
                    host.as_ref()
                        .map(|h| format!(" of host {h}"))
                        .unwrap_or_default()
                ));
            }
            MatrixEvent::PointStarted {
                preset,
                index,
                total,
                point,
            } => {
                self.cooldown = None;
                if let Some(i) = row(&mut self.rows, preset) {
                    let r = &mut self.rows[i];
                    r.points = (*index, *total);
                    r.phase = format!("L4 point {}/{total} {}", index + 1, label(point));
                }
            }
            MatrixEvent::PointDone { preset, .. } => {
                if let Some(i) = row(&mut self.rows, preset) {
                    self.rows[i].points.0 += 1;
                }
            }
            MatrixEvent::PresetFinished {
                name,
                status,
                record,
                levels,
            } => {
                if let Some(i) = row(&mut self.rows, name) {
                    let r = &mut self.rows[i];
                    r.status = *status;
                    r.record = record.clone();
                    r.levels = levels.clone();
                    r.phase = match status {
                        PresetStatus::Interrupted => "interrupted".into(),
                        PresetStatus::Failed => "failed".into(),
                        _ => "done".into(),
                    };
                }
            }
            MatrixEvent::ReportWritten(p) => self.report = Some(p.clone()),
            MatrixEvent::Warning(w) => self.warnings.push(w.clone()),
            MatrixEvent::AbRound { .. } | MatrixEvent::AbRatios { .. } => {}
        }
    }

    /// The matrix ended.
    pub fn on_done(&mut self, out: Result<&MatrixOutcome, &str>) {
        self.cooldown = None;
        match out {
            Ok(o) => {
                self.report = Some(o.report.clone());
                self.out = o.out.clone();
                self.state = JobState::Finished {
                    interrupted: o.interrupted,
                    passed: o.all_pass,
                };
            }
            Err(e) => self.state = JobState::Failed(e.to_string()),
        }
    }
}

fn label(p: &WorkloadPoint) -> String {
    format!("{} c{}", p.label(), p.concurrency)
}

/// State of the matrix view.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixView {
    /// Presets in the store.
    pub presets: Vec<String>,
    /// Chosen presets, in the order chosen (the first is the report's baseline).
    pub chosen: Vec<String>,
    /// Selected row of the list.
    pub cursor: usize,
    /// Levels, as `mxtune matrix --levels` takes them.
    pub levels: String,
    /// The levels being typed.
    pub editing: Option<String>,
    /// What is wrong, shown inline.
    pub error: Option<String>,
    /// The matrix started last.
    pub run: Option<MatrixRun>,
}

impl Default for MatrixView {
    fn default() -> Self {
        MatrixView {
            presets: Vec::new(),
            chosen: Vec::new(),
            cursor: 0,
            levels: DEFAULT_LEVELS.to_string(),
            editing: None,
            error: None,
            run: None,
        }
    }
}

impl MatrixView {
    /// Whether a matrix is running.
    pub fn is_running(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.state.is_active())
    }

    /// The store's presets arrived.
    pub fn on_preset_list(&mut self, names: Vec<String>) {
        self.chosen.retain(|c| names.contains(c));
        self.presets = names;
        self.cursor = self.cursor.min(self.presets.len().saturating_sub(1));
        if self.presets.is_empty() {
            self.error = Some("no presets found: save one on the Flags screen (s)".into());
        }
    }

    /// The runtime started the matrix of `args` (it picked `args.out`).
    pub fn on_started(&mut self, args: &MatrixArgs) {
        self.run = Some(MatrixRun {
            matrix_id: String::new(),
            out: args.out.clone(),
            levels: parse_levels(&args.levels).unwrap_or_default(),
            rows: args
                .presets
                .iter()
                .map(|n| PresetRow {
                    name: n.clone(),
                    status: PresetStatus::Pending,
                    phase: String::new(),
                    points: (0, 0),
                    levels: Vec::new(),
                    record: None,
                })
                .collect(),
            state: JobState::Running,
            cooldown: None,
            report: None,
            warnings: Vec::new(),
        });
    }
}

/// The quick A/B's request: the marked A, the current flags as B, and the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct AbRequest {
    /// A's flags.
    pub a: Box<FlagSet>,
    /// What A was (the preset it was marked from), for labels.
    pub a_label: String,
    /// B's flags (the current ones).
    pub b: Box<FlagSet>,
    /// What B is.
    pub b_label: String,
    /// Docker or the bundled engine.
    pub kind: TargetKind,
    /// `--grid` items from the Bench form.
    pub grid: Vec<String>,
    /// A B rounds.
    pub rounds: u32,
    /// Noise threshold of the hints, in standard deviations.
    pub noise: f64,
    /// Engine binary (`None`: this mxtune, as the Launch screen uses).
    pub engine_bin: Option<PathBuf>,
}

/// The flag set marked as A.
#[derive(Debug, Clone, PartialEq)]
pub struct AbMark {
    /// The flags.
    pub flags: Box<FlagSet>,
    /// The preset they were marked from (with `*` when they differed from it).
    pub label: String,
}

/// The most A/B rounds the panel takes (each round launches A and B once).
pub const MAX_AB_ROUNDS: u32 = 100;

/// Reads the A/B rounds typed in the panel; the error says what to type.
pub fn parse_rounds(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_AB_ROUNDS).contains(&n) => Ok(n),
        _ => Err(format!(
            "rounds `{}`: give a whole number from 1 to {MAX_AB_ROUNDS} (each round launches \
             A and B once)",
            s.trim()
        )),
    }
}

/// A quick A/B started from the Bench screen.
#[derive(Debug, Clone, PartialEq)]
pub struct AbRun {
    /// A's label.
    pub a: String,
    /// B's label.
    pub b: String,
    /// Rounds asked for.
    pub rounds: u32,
    /// The round in progress (0 before the first).
    pub round: u32,
    /// What is happening now.
    pub phase: String,
    /// Valid rounds so far.
    pub valid_rounds: usize,
    /// B/A per point and metric so far.
    pub ratios: Vec<Ratio>,
    /// Where it stands.
    pub state: JobState,
    /// Output directory (ab.md, ab.json, the two presets).
    pub out: Option<PathBuf>,
    /// ab.md once written.
    pub md: Option<PathBuf>,
    /// Rounds left out, and why.
    pub excluded: Vec<String>,
}

impl AbRun {
    /// Apply one progress event.
    pub fn on_event(&mut self, ev: &MatrixEvent) {
        match ev {
            MatrixEvent::AbRound { round, rounds } => {
                self.round = *round;
                self.rounds = *rounds;
                self.phase = "launching A".into();
            }
            MatrixEvent::TargetPhase { preset, phase } => {
                self.phase = format!("{}: {phase}", self.side(preset))
            }
            MatrixEvent::Ready { preset, startup_s } => {
                self.phase = format!("{}: ready after {startup_s:.1} s", self.side(preset))
            }
            MatrixEvent::PointStarted {
                preset,
                index,
                total,
                point,
            } => {
                self.phase = format!(
                    "{}: point {}/{total} {}",
                    self.side(preset),
                    index + 1,
                    label(point)
                )
            }
            MatrixEvent::TargetFailed { preset, message } => {
                self.excluded
                    .push(format!("{}: {message}", self.side(preset)));
            }
            MatrixEvent::AbRatios {
                valid_rounds,
                ratios,
            } => {
                self.valid_rounds = *valid_rounds;
                self.ratios = ratios.clone();
            }
            _ => {}
        }
    }

    fn side(&self, preset: &str) -> &'static str {
        if preset.ends_with("-b") { "B" } else { "A" }
    }

    /// The A/B ended.
    pub fn on_done(&mut self, out: Result<&AbOutcome, &str>) {
        match out {
            Ok(o) => {
                self.valid_rounds = o.valid_rounds;
                self.ratios = o.result.ratios.clone();
                self.excluded = o.result.excluded.clone();
                self.md = Some(o.md.clone());
                self.phase = if o.interrupted { "cancelled" } else { "done" }.into();
                self.state = JobState::Finished {
                    interrupted: o.interrupted,
                    passed: o.valid_rounds > 0,
                };
            }
            Err(e) => {
                self.phase = "failed".into();
                self.state = JobState::Failed(e.to_string());
            }
        }
    }
}

/// A setting of the quick A/B typed in its view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbSetting {
    /// A B rounds (`r`).
    Rounds,
    /// The noise threshold in standard deviations (`n`, shared with the Runs comparison).
    Noise,
}

/// State of the quick A/B view.
#[derive(Debug, Clone, PartialEq)]
pub struct AbView {
    /// A B rounds the next A/B runs (`mxtune ab --rounds`).
    pub rounds: u32,
    /// The setting being typed, and its text so far.
    pub editing: Option<(AbSetting, String)>,
    /// What was wrong with the value typed, shown inline.
    pub error: Option<String>,
    /// The A/B started last.
    pub run: Option<AbRun>,
}

impl Default for AbView {
    fn default() -> Self {
        AbView {
            rounds: DEFAULT_AB_ROUNDS,
            editing: None,
            error: None,
            run: None,
        }
    }
}

impl AbView {
    /// Whether an A/B is running.
    pub fn is_running(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.state.is_active())
    }

    /// The runtime wrote the presets and started `args`.
    pub fn on_started(&mut self, args: &AbArgs) {
        if let Some(r) = self.run.as_mut() {
            r.out = Some(args.out.clone());
            r.phase = "starting".into();
        }
    }

    /// The presets could not be written.
    pub fn on_could_not_start(&mut self, e: String) {
        if let Some(r) = self.run.as_mut() {
            r.phase = "failed".into();
            r.state = JobState::Failed(e);
        }
    }
}

/// The shared `mxtune matrix`/`mxtune ab` options of the panel: its runs and presets
/// directories, the Launch screen's start-up limit, and `kind` (engine or docker).
pub fn common_args(app: &App, kind: TargetKind) -> Result<CommonArgs, String> {
    let target = match kind {
        TargetKind::Docker => TargetArg::Docker,
        TargetKind::Engine => TargetArg::Engine,
        TargetKind::Attach | TargetKind::DockerCluster => {
            return Err(
                "the panel's matrix and A/B launch single-host targets: choose engine or \
                 docker on the Launch screen (2, then t); two-node presets run with \
                 `mxtune matrix --target docker-cluster`"
                    .into(),
            );
        }
    };
    Ok(CommonArgs {
        target,
        grid: Vec::new(),
        profile: None,
        endpoint: crate::bench::client::Endpoint::Chat,
        presets_dir: app.paths.presets.dirs.first().cloned(),
        runs_dir: app.paths.runs_dir.clone(),
        engine_bin: None,
        device: None,
        engine_model: None,
        startup_limit_s: app.launch.startup_limit.as_secs().max(1),
        cooldown_c: None,
        cooldown_limit_s: 900,
        hosts: Vec::new(),
    })
}

/// The Bench form's workload as `--grid` items (pp, tg, depth, c, runs); an error names the
/// field at fault.
pub fn grid_items(app: &App) -> Result<Vec<String>, String> {
    let b = &app.bench;
    let mut out = Vec::new();
    for (i, key) in ["pp", "tg", "depth", "c", "runs"].iter().enumerate() {
        let v = super::bench::parse_field(FIELDS[i + 1], &b.values[i])?;
        out.push(format!(
            "{key}={}",
            v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ));
    }
    Ok(out)
}

/// Why a matrix or A/B cannot start now, if it cannot.
fn refuse_start(app: &App) -> Option<String> {
    if app.target_running() {
        return Some(
            "a target started on the Launch screen is running: stop it there (2, then x); \
             the matrix and A/B launch their own"
                .into(),
        );
    }
    if app.bench.is_running() {
        return Some("a benchmark is running: wait for it or cancel it (Esc)".into());
    }
    None
}

/// Keys of the Bench screen that belong to the matrix view and the quick A/B (`m`, `a`,
/// `A`, and every key while one of their views is shown); `None` leaves the key to the
/// form.
pub fn on_bench_key(app: &mut App, key: KeyEvent) -> Option<Vec<Effect>> {
    match app.bench.view {
        BenchView::Matrix => Some(on_matrix_key(app, key)),
        BenchView::Ab => Some(on_ab_key(app, key)),
        BenchView::Form if app.bench.captures_keys() || app.bench.is_running() => None,
        BenchView::Form => match key.code {
            KeyCode::Char('m') => {
                app.bench.view = BenchView::Matrix;
                app.bench.matrix.error = None;
                Some(vec![Effect::ListMatrixPresets])
            }
            KeyCode::Char('a') => {
                mark_a(app);
                Some(Vec::new())
            }
            KeyCode::Char('A') => {
                // The view shows what will run (A, B, rounds, noise threshold) before it does.
                if ab_plan(app).is_some() {
                    app.bench.view = BenchView::Ab;
                    app.bench.ab.error = None;
                }
                Some(Vec::new())
            }
            _ => None,
        },
    }
}

/// The label of the current flags: the loaded preset, with `*` when they differ from it.
fn current_label(app: &App) -> String {
    match (&app.flags.loaded, app.flags.dirty()) {
        (Some(p), true) => format!("{}*", p.name),
        (Some(p), false) => p.name.clone(),
        (None, _) => "flags".into(),
    }
}

/// Mark the current flags as A (Flags or Bench screen).
pub fn mark_a(app: &mut App) {
    let label = current_label(app);
    app.message = Some(format!(
        "marked the current flags ({label}) as A: change flags, then A on the Bench screen \
         opens the A/B"
    ));
    app.ab_mark = Some(AbMark {
        flags: Box::new(app.flags.flags.clone()),
        label,
    });
}

/// What a quick A/B would run now (A, the target kind, the grid), or `None` with the reason
/// on the status line.
fn ab_plan(app: &mut App) -> Option<(AbMark, TargetKind, Vec<String>)> {
    let Some(mark) = app.ab_mark.clone() else {
        app.message = Some("no A marked: press a on the Flags or Bench screen first".into());
        return None;
    };
    if *mark.flags == app.flags.flags {
        app.message = Some(
            "the current flags are the marked A: change a flag on the Flags screen (1), then A"
                .into(),
        );
        return None;
    }
    if let Some(why) = refuse_start(app) {
        app.message = Some(why);
        return None;
    }
    let kind = app.launch.choice;
    if let Err(e) = common_args(app, kind) {
        app.message = Some(e);
        return None;
    }
    match grid_items(app) {
        Ok(g) => Some((mark, kind, g)),
        Err(e) => {
            app.message = Some(format!("the Bench form's grid: {e}"));
            app.bench.error = Some(e);
            None
        }
    }
}

fn start_ab(app: &mut App) -> Vec<Effect> {
    let Some((mark, kind, grid)) = ab_plan(app) else {
        return Vec::new();
    };
    let b_label = current_label(app);
    let rounds = app.bench.ab.rounds;
    app.bench.view = BenchView::Ab;
    app.bench.ab.error = None;
    app.bench.ab.run = Some(AbRun {
        a: mark.label.clone(),
        b: b_label.clone(),
        rounds,
        round: 0,
        phase: "writing the two presets".into(),
        valid_rounds: 0,
        ratios: Vec::new(),
        state: JobState::Running,
        out: None,
        md: None,
        excluded: Vec::new(),
    });
    vec![Effect::StartAb(Box::new(AbRequest {
        a: mark.flags,
        a_label: mark.label,
        b: Box::new(app.flags.flags.clone()),
        b_label,
        kind,
        grid,
        rounds,
        noise: app.noise_sigmas,
        engine_bin: None,
    }))]
}

fn on_ab_key(app: &mut App, key: KeyEvent) -> Vec<Effect> {
    let v = &mut app.bench.ab;
    if let Some((setting, buf)) = v.editing.as_mut() {
        match super::text_key(buf, key, 8) {
            super::TextKey::Cancel => {
                v.editing = None;
                v.error = None;
            }
            super::TextKey::Submit => {
                let parsed = match setting {
                    AbSetting::Rounds => parse_rounds(buf).map(|n| v.rounds = n),
                    AbSetting::Noise => parse_noise_sigmas(buf).map(|k| app.noise_sigmas = k),
                };
                match parsed {
                    Ok(()) => {
                        v.editing = None;
                        v.error = None;
                    }
                    Err(e) => v.error = Some(e),
                }
            }
            super::TextKey::Edited | super::TextKey::Other => {}
        }
        return Vec::new();
    }
    if v.is_running() {
        if key.code == KeyCode::Esc {
            if let Some(r) = v.run.as_mut() {
                r.state = JobState::Cancelling;
                r.phase = "cancelling: stopping the target, saving the records".into();
            }
            return vec![Effect::CancelMatrix];
        }
        return Vec::new();
    }
    match key.code {
        KeyCode::Esc => {
            v.error = None;
            app.bench.view = BenchView::Form;
        }
        KeyCode::Char('A') | KeyCode::Enter => return start_ab(app),
        KeyCode::Char('r') => {
            v.editing = Some((AbSetting::Rounds, v.rounds.to_string()));
            v.error = None;
        }
        KeyCode::Char('n') => {
            v.editing = Some((AbSetting::Noise, app.noise_sigmas.to_string()));
            v.error = None;
        }
        _ => {}
    }
    Vec::new()
}

fn on_matrix_key(app: &mut App, key: KeyEvent) -> Vec<Effect> {
    let kind = app.launch.choice;
    let refused = refuse_start(app);
    let common = common_args(app, kind);
    let grid = grid_items(app);
    let v = &mut app.bench.matrix;
    if let Some(buf) = v.editing.as_mut() {
        match super::text_key(buf, key, 32) {
            super::TextKey::Cancel => {
                v.editing = None;
                v.error = None;
            }
            super::TextKey::Submit => match parse_levels(buf) {
                Ok(_) => {
                    v.levels = buf.trim().to_string();
                    v.editing = None;
                    v.error = None;
                }
                Err(e) => v.error = Some(format!("{e:#}")),
            },
            super::TextKey::Edited | super::TextKey::Other => {}
        }
        return Vec::new();
    }
    if v.is_running() {
        if key.code == KeyCode::Esc {
            if let Some(r) = v.run.as_mut() {
                r.state = JobState::Cancelling;
            }
            return vec![Effect::CancelMatrix];
        }
        return Vec::new();
    }
    match key.code {
        KeyCode::Esc => app.bench.view = BenchView::Form,
        KeyCode::Up | KeyCode::Char('k') => v.cursor = v.cursor.saturating_sub(1),
        KeyCode::Down | KeyCode::Char('j') => {
            v.cursor = (v.cursor + 1).min(v.presets.len().saturating_sub(1))
        }
        KeyCode::Enter | KeyCode::Char(' ') => {
            if let Some(name) = v.presets.get(v.cursor).cloned() {
                match v.chosen.iter().position(|c| *c == name) {
                    Some(i) => {
                        v.chosen.remove(i);
                    }
                    None => v.chosen.push(name),
                }
                v.error = None;
            }
        }
        KeyCode::Char('l') => {
            v.editing = Some(v.levels.clone());
            v.error = None;
        }
        KeyCode::Char('r') => {
            if v.chosen.is_empty() {
                v.error =
                    Some("choose presets first: Space or Enter marks the selected one".into());
                return Vec::new();
            }
            if let Some(why) = refused {
                v.error = Some(why);
                return Vec::new();
            }
            let (common, grid) = match (common, grid) {
                (Ok(c), Ok(g)) => (c, g),
                (Err(e), _) | (_, Err(e)) => {
                    v.error = Some(e);
                    return Vec::new();
                }
            };
            if let Err(e) = parse_levels(&v.levels) {
                v.error = Some(format!("{e:#}"));
                return Vec::new();
            }
            v.error = None;
            let args = MatrixArgs {
                presets: v.chosen.clone(),
                levels: v.levels.clone(),
                // The runtime picks a new directory under the runs dir's `matrix/`.
                out: PathBuf::new(),
                resume: false,
                seed: None,
                no_shuffle: false,
                tolerance_pct: 5.0,
                common: CommonArgs { grid, ..common },
            };
            return vec![Effect::StartMatrix(Box::new(args))];
        }
        _ => {}
    }
    Vec::new()
}

fn verdict_span(theme: &Theme, verdict: &str) -> Span<'static> {
    let style = match verdict {
        "pass" => theme.good(),
        "fail" | "invalid" => theme.error(),
        _ => theme.warn(),
    };
    // "no baseline" (L5 with no earlier record) would not fit a narrow column.
    let text = if verdict == "no baseline" {
        "no ref"
    } else {
        verdict
    };
    Span::styled(text.to_string(), style)
}

fn status_text(s: PresetStatus) -> &'static str {
    match s {
        PresetStatus::Pending => "pending",
        PresetStatus::Running => "running",
        PresetStatus::Interrupted => "interrupted",
        PresetStatus::Done => "done",
        PresetStatus::Failed => "failed",
    }
}

fn kind_text(k: TargetKind) -> &'static str {
    match k {
        TargetKind::Docker => "docker",
        TargetKind::Engine => "engine",
        TargetKind::Attach => "attach (choose engine or docker)",
        TargetKind::DockerCluster => {
            "docker-cluster (not in the panel's matrix: choose engine or docker, or run `mxtune matrix --target docker-cluster`)"
        }
    }
}

fn state_span(theme: &Theme, s: &JobState, what: &str) -> Span<'static> {
    match s {
        JobState::Running => Span::styled("running", theme.accent()),
        JobState::Cancelling => Span::styled("cancelling: stopping the target", theme.warn()),
        JobState::Finished {
            interrupted: true, ..
        } => Span::styled(format!("cancelled ({what})"), theme.warn()),
        JobState::Finished { passed: true, .. } => Span::styled("finished", theme.good()),
        JobState::Finished { .. } => Span::styled("finished: something FAILED", theme.error()),
        JobState::Failed(_) => Span::styled("could not run", theme.error()),
    }
}

/// Draw the matrix view.
pub fn draw_matrix(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let v = &app.bench.matrix;
    let [top, bottom] = Layout::vertical([Constraint::Length(9), Constraint::Min(3)]).areas(area);
    let [list_area, info_area] =
        Layout::horizontal([Constraint::Length(34), Constraint::Min(20)]).areas(top);

    // The preset list: [n] marks the order chosen (1 is the report's baseline).
    let idle = !v.is_running();
    let inner_h = list_area.height.saturating_sub(2) as usize;
    let first = v.cursor.saturating_sub(inner_h.saturating_sub(1));
    let lines: Vec<Line> = v
        .presets
        .iter()
        .enumerate()
        .skip(first)
        .take(inner_h)
        .map(|(i, name)| {
            let mark = match v.chosen.iter().position(|c| c == name) {
                Some(n) => format!("[{}]", n + 1),
                None => "[ ]".into(),
            };
            let style = if i == v.cursor && idle {
                theme.selected()
            } else {
                ratatui::style::Style::default()
            };
            Line::from(vec![
                Span::styled(format!(" {mark:<4} "), theme.accent()),
                Span::styled(theme.text(name).into_owned(), style),
            ])
        })
        .collect();
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Presets (Space: choose) "),
        ),
        list_area,
    );

    // Plan and state.
    let mut info = vec![Line::from(vec![
        Span::styled(" target ", theme.dim()),
        Span::styled(kind_text(app.launch.choice), theme.accent()),
        Span::styled("  levels ", theme.dim()),
        Span::raw(match &v.editing {
            Some(buf) => format!("{buf}_"),
            None => v.levels.clone(),
        }),
    ])];
    info.push(Line::from(vec![
        Span::styled(" grid   ", theme.dim()),
        Span::raw(match grid_items(app) {
            Ok(g) => g.join(" "),
            Err(_) => "(fix the Bench form)".into(),
        }),
    ]));
    if let Some(r) = &v.run {
        info.push(Line::from(vec![
            Span::styled(" matrix ", theme.dim()),
            state_span(theme, &r.state, "resumable"),
        ]));
        if let Some(c) = &r.cooldown {
            info.push(Line::styled(format!(" {}", theme.text(c)), theme.warn()));
        }
        if let Some(p) = &r.report {
            info.push(Line::from(vec![
                Span::styled(" report ", theme.dim()),
                Span::raw(theme.text(&p.display().to_string()).into_owned()),
            ]));
        } else {
            info.push(Line::from(vec![
                Span::styled(" out    ", theme.dim()),
                Span::raw(theme.text(&r.out.display().to_string()).into_owned()),
            ]));
        }
        if let JobState::Finished {
            interrupted: true, ..
        } = r.state
        {
            info.push(Line::styled(
                format!(
                    " resume: mxtune matrix --resume --out {}",
                    theme.text(&r.out.display().to_string())
                ),
                theme.dim(),
            ));
        }
        if let JobState::Failed(e) = &r.state {
            info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
        }
    } else {
        info.push(Line::styled(
            " choose presets; r runs them (as mxtune matrix)",
            theme.dim(),
        ));
    }
    if let Some(e) = &v.error {
        info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
    }
    frame.render_widget(
        Paragraph::new(info).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Matrix "),
        ),
        info_area,
    );

    // Progress per preset and verdicts per level.
    let block = Block::bordered()
        .border_set(theme.border())
        .title(" Presets in run order: verdicts per level ");
    let Some(r) = &v.run else {
        frame.render_widget(
            Paragraph::new(
                " Each preset: launch, L1 smoke, L1.5 kernel path, L2 correctness, L3 stress, \
                 L4 the Bench form's grid, L5 regression against its previous record; one \
                 record per preset and a report. Esc while running cancels; the matrix stays \
                 resumable.",
            )
            .wrap(Wrap { trim: true })
            .style(theme.dim())
            .block(block),
            bottom,
        );
        return;
    };
    let wide = bottom.width >= 120;
    let mut header = vec![Cell::from("preset"), Cell::from("status")];
    for l in &r.levels {
        header.push(Cell::from(format!("L{}", l.number())));
    }
    header.push(Cell::from("now"));
    let rows: Vec<Row> = r
        .rows
        .iter()
        .map(|row| {
            let mut cells = vec![
                Cell::from(theme.text(&row.name).into_owned()),
                Cell::from(status_text(row.status)),
            ];
            for l in &r.levels {
                cells.push(match row.levels.iter().find(|o| o.level == *l) {
                    Some(o) => Cell::from(verdict_span(theme, &o.verdict)),
                    None => Cell::from(Span::styled("-", theme.dim())),
                });
            }
            let now = if row.status == PresetStatus::Running {
                row.phase.clone()
            } else if wide {
                row.record
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            cells.push(Cell::from(theme.text(&now).into_owned()));
            Row::new(cells)
        })
        .collect();
    let mut widths = vec![
        Constraint::Length(if wide { 24 } else { 16 }),
        Constraint::Length(11),
    ];
    widths.extend(
        r.levels
            .iter()
            .map(|_| Constraint::Length(if wide { 9 } else { 6 })),
    );
    widths.push(Constraint::Min(8));
    let inner = block.inner(bottom);
    frame.render_widget(block, bottom);
    let table_h = (rows.len() as u16 + 1).min(inner.height);
    let [table_area, notes_area] =
        Layout::vertical([Constraint::Length(table_h), Constraint::Min(0)]).areas(inner);
    frame.render_widget(
        Table::new(rows, widths).header(Row::new(header).style(theme.accent())),
        table_area,
    );
    let mut notes: Vec<Line> = Vec::new();
    for row in &r.rows {
        for o in row
            .levels
            .iter()
            .filter(|o| matches!(o.verdict.as_str(), "fail" | "invalid"))
        {
            notes.push(Line::styled(
                format!(
                    " {} {}: {}",
                    theme.text(&row.name),
                    o.level.title(),
                    theme.text(o.detail.lines().next().unwrap_or(""))
                ),
                theme.error(),
            ));
        }
    }
    for w in &r.warnings {
        notes.push(Line::styled(format!(" ! {}", theme.text(w)), theme.warn()));
    }
    frame.render_widget(Paragraph::new(notes).wrap(Wrap { trim: false }), notes_area);
}

/// The line of the A/B's settings: rounds and noise threshold, or the one being typed.
fn ab_settings_line(app: &App) -> Line<'static> {
    let theme = &app.theme;
    let v = &app.bench.ab;
    let typed = |what: AbSetting| {
        v.editing
            .as_ref()
            .filter(|(s, _)| *s == what)
            .map(|(_, buf)| format!("{buf}_"))
    };
    let rounds = typed(AbSetting::Rounds).unwrap_or_else(|| v.rounds.to_string());
    let noise = typed(AbSetting::Noise)
        .map(|t| format!("{t} std"))
        .unwrap_or_else(|| sigmas_text(app.noise_sigmas));
    let mut spans = vec![
        Span::styled(" rounds ", theme.dim()),
        Span::styled(rounds, theme.accent()),
        Span::styled(" (r)  noise threshold ", theme.dim()),
        Span::styled(noise, theme.accent()),
        Span::styled(" (n)", theme.dim()),
    ];
    if v.editing.is_some() {
        spans.push(Span::styled("  Enter sets, Esc cancels", theme.dim()));
    }
    Line::from(spans)
}

/// Draw the quick A/B: what it runs and its settings, then B/A per metric with the noise hint.
pub fn draw_ab(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let v = &app.bench.ab;
    let [top, bottom] = Layout::vertical([Constraint::Length(8), Constraint::Min(3)]).areas(area);
    // What A/Enter would run now; the last run's pair when one is shown.
    let next = app
        .ab_mark
        .as_ref()
        .map(|m| (m.label.clone(), current_label(app)));
    let shown = match (&v.run, &next) {
        (Some(r), _) => Some((r.a.clone(), r.b.clone())),
        (None, n) => n.clone(),
    };
    let pair = |(a, b): &(String, String), lead: &'static str| {
        Line::from(vec![
            Span::styled(lead, theme.dim()),
            Span::styled(theme.text(a).into_owned(), theme.accent()),
            Span::styled("  vs  B ", theme.dim()),
            Span::styled(theme.text(b).into_owned(), theme.accent()),
        ])
    };
    let mut first = match &shown {
        Some(p) => pair(p, " A "),
        None => Line::styled(" no A marked: a on the Flags or Bench screen", theme.dim()),
    };
    first.spans.push(Span::styled("  target ", theme.dim()));
    first.spans.push(Span::raw(kind_text(app.launch.choice)));
    let mut info = vec![first];
    if let Some(n) = &next
        && Some(n) != shown.as_ref()
        && !v.is_running()
    {
        info.push(pair(n, " next: A "));
    }
    info.push(ab_settings_line(app));
    if let Some(e) = &v.error {
        info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
    }
    match &v.run {
        Some(r) => {
            info.push(Line::from(vec![
                Span::styled(" state ", theme.dim()),
                state_span(theme, &r.state, "records kept"),
                Span::styled(
                    format!("  round {}/{}  {} valid", r.round, r.rounds, r.valid_rounds),
                    theme.dim(),
                ),
            ]));
            if r.state.is_active() {
                info.push(Line::raw(format!(" {}", theme.text(&r.phase))));
            }
            match (&r.md, &r.out) {
                (Some(md), _) => info.push(Line::from(vec![
                    Span::styled(" result ", theme.dim()),
                    Span::raw(theme.text(&md.display().to_string()).into_owned()),
                ])),
                (None, Some(out)) => info.push(Line::from(vec![
                    Span::styled(" out ", theme.dim()),
                    Span::raw(theme.text(&out.display().to_string()).into_owned()),
                ])),
                _ => {}
            }
            if let JobState::Failed(e) = &r.state {
                info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
            }
        }
        None => info.push(Line::styled(" A or Enter runs it", theme.dim())),
    }
    frame.render_widget(
        Paragraph::new(info).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Quick A/B: A B alternating, relaunched every round "),
        ),
        top,
    );
    let k = app.noise_sigmas;
    let block = Block::bordered().border_set(theme.border()).title(
        theme
            .text(&format!(
                " B/A per metric: ± std over rounds, within noise if |B/A-1| < {} ",
                sigmas_text(k)
            ))
            .into_owned(),
    );
    let Some(r) = v
        .run
        .as_ref()
        .filter(|r| !r.ratios.is_empty() || !r.excluded.is_empty())
    else {
        frame.render_widget(
            Paragraph::new(
                " Each round launches A, measures the Bench form's grid and stops it, then \
                 the same for B. The result is B/A per point and metric with its spread over \
                 the rounds; a ratio closer to 1 than the noise threshold times that spread \
                 is marked within noise (more rounds, not a conclusion). ab.md and ab.json \
                 go to ab/<UTC time> under the runs directory.",
            )
            .wrap(Wrap { trim: true })
            .style(theme.dim())
            .block(block),
            bottom,
        );
        return;
    };
    let inner = block.inner(bottom);
    frame.render_widget(block, bottom);
    let header =
        Row::new(["point", "metric", "B/A", "± std", "noise", "rounds"]).style(theme.accent());
    let rows: Vec<Row> = r
        .ratios
        .iter()
        .map(|x| {
            let better = if x.metric.contains("ms") {
                x.mean < 1.0
            } else {
                x.mean > 1.0
            };
            let noise = x.noise(k);
            let style = match noise {
                Noise::Within => theme.dim(),
                Noise::Beyond if better => theme.good(),
                Noise::Beyond => theme.warn(),
                Noise::Unknown => ratatui::style::Style::default(),
            };
            Row::new(vec![
                Cell::from(label(&x.point)),
                Cell::from(x.metric.clone()),
                Cell::from(Span::styled(format!("{:.3}", x.mean), style)),
                Cell::from(format!("{:.3}", x.std)),
                Cell::from(Span::styled(noise.text(), style)),
                Cell::from(
                    x.rounds
                        .iter()
                        .map(|v| format!("{v:.3}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
            ])
        })
        .collect();
    let table_h = (rows.len() as u16 + 1).min(inner.height);
    let [table_area, notes_area] =
        Layout::vertical([Constraint::Length(table_h), Constraint::Min(0)]).areas(inner);
    frame.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(16),
                Constraint::Length(12),
                Constraint::Length(6),
                Constraint::Length(6),
                Constraint::Length(13),
                Constraint::Min(8),
            ],
        )
        .header(header),
        table_area,
    );
    let notes: Vec<Line> = r
        .excluded
        .iter()
        .map(|e| Line::styled(format!(" excluded {}", theme.text(e)), theme.warn()))
        .collect();
    frame.render_widget(Paragraph::new(notes).wrap(Wrap { trim: false }), notes_area);
}

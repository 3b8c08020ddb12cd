//! Panel state and key handling. Pure: no I/O happens here. Keys and background events go
//! in, state changes and `Effect`s come out; the runtime (`tui::perform`) performs the
//! effects and feeds their results back through the `on_*` methods.

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::keys::{self, Binding};
use super::screens::bench::BenchScreen;
use super::screens::flags::FlagsScreen;
use super::screens::launch::LaunchScreen;
use super::screens::live::LiveScreen;
use super::screens::runs::RunsScreen;
use super::theme::Theme;
use crate::flags::preset::{PRESETS_DIR_ENV, PresetStore, save_dir, user_presets_dir};
use crate::vocab::TargetKind;

/// The five screens, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    /// Flag axes and serving limits of the current configuration.
    Flags,
    /// Start/stop a target and read its log.
    Launch,
    /// Charts of monitor samples.
    Live,
    /// Benchmark workloads against the current target.
    Bench,
    /// Saved run records, compare two.
    Runs,
}

impl Tab {
    /// All tabs in order; number keys 1–5 pick from this list.
    pub const ALL: [Tab; 5] = [Tab::Flags, Tab::Launch, Tab::Live, Tab::Bench, Tab::Runs];

    /// The tab's title.
    pub fn title(self) -> &'static str {
        match self {
            Tab::Flags => "Flags",
            Tab::Launch => "Launch",
            Tab::Live => "Live",
            Tab::Bench => "Bench",
            Tab::Runs => "Runs",
        }
    }

    fn index(self) -> usize {
        Tab::ALL.iter().position(|t| *t == self).unwrap_or(0)
    }

    /// The key bindings specific to this screen.
    pub fn bindings(self) -> &'static [Binding] {
        match self {
            Tab::Flags => keys::FLAGS,
            Tab::Launch => keys::LAUNCH,
            Tab::Live => keys::LIVE,
            Tab::Bench => keys::BENCH,
            Tab::Runs => keys::RUNS,
        }
    }
}

/// What the operator is being asked before quitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuitPrompt {
    /// A target is running: stop it, leave it running, or cancel.
    TargetRunning,
}

/// Side effects the runtime performs on the App's behalf.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Leave the panel; `stop_target` says whether to stop the running target first.
    Quit {
        /// Stop the target launched from this panel before leaving.
        stop_target: bool,
    },
    /// List the presets for the picker.
    ListPresets,
    /// Load the named preset into the Flags screen.
    LoadPreset(String),
    /// Save the current flags as a preset.
    SavePreset {
        /// File stem of the preset.
        name: String,
        /// Replace an existing preset of that name (the operator confirmed).
        overwrite: bool,
    },
    /// Re-read the runs directory.
    ReloadRuns,
    /// Start the target chosen on the Launch screen with the current flags.
    StartTarget,
    /// Follow again the newest running cluster of the loaded docker-cluster preset (its
    /// containers found by their labels on the preset's hosts), as `launch --reattach` does.
    ReattachTarget,
    /// Stop the target started from this panel (the operator confirmed).
    StopTarget,
    /// Write the Launch screen's log pane to this file.
    SaveLog(PathBuf),
    /// Write the comparison of the marked runs as markdown to this file.
    ExportComparison(PathBuf),
    /// Write the Flags screen's command (as `c` shows it) to a new file in the export dir.
    SaveCommand,
    /// Run this benchmark (the options of `mxtune bench --record`) against the target.
    StartBench(Box<crate::bench::cli::BenchArgs>),
    /// Cancel the running benchmark; its partial record is saved as `aborted`.
    CancelBench,
    /// List the presets for the matrix view.
    ListMatrixPresets,
    /// Run this matrix (the options of `mxtune matrix`; the runtime picks `out`, a new
    /// directory under the runs dir's `matrix/`).
    StartMatrix(Box<crate::matrix::cli::MatrixArgs>),
    /// Write A and B as presets in a new directory under the runs dir's `ab/` and run
    /// `mxtune ab` on them.
    StartAb(Box<super::screens::matrix::AbRequest>),
    /// Cancel the running matrix or A/B (the matrix stays resumable).
    CancelMatrix,
}

/// Where the panel reads and writes files.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Where presets are looked up.
    pub presets: PresetStore,
    /// Where `s` saves a preset.
    pub save_dir: PathBuf,
    /// The runs directory (records are read from here).
    pub runs_dir: PathBuf,
    /// Where exports (comparisons, logs) are written.
    pub export_dir: PathBuf,
}

impl Paths {
    /// The same places the headless commands use: `MXTUNE_PRESETS_DIR` if set, the user
    /// preset directory, the bundled presets; saves into the first directory of these;
    /// `MXTUNE_RUNS_DIR` (else `./runs`); exports into `.`.
    pub fn from_env() -> Self {
        let explicit = std::env::var_os(PRESETS_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        // Without HOME there is no user directory: `./presets` stands in for it, so what `s`
        // saves still loads by name.
        let explicit = explicit.or_else(|| user_presets_dir().is_none().then(|| "presets".into()));
        let presets = PresetStore::standard(explicit.clone());
        let save_dir = save_dir(explicit).unwrap_or_else(|| PathBuf::from("presets"));
        let runs_dir = std::env::var_os("MXTUNE_RUNS_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(crate::record::store::DEFAULT_RUNS_DIR));
        Paths {
            presets,
            save_dir,
            runs_dir,
            export_dir: PathBuf::from("."),
        }
    }
}

/// Everything the panel shows.
#[derive(Debug)]
pub struct App {
    /// The visible screen.
    pub tab: Tab,
    /// The `?` overlay is open.
    pub show_help: bool,
    /// First line of the help overlay shown (it is longer than a small terminal).
    pub help_scroll: u16,
    /// The largest useful `help_scroll` at the last draw (the terminal size decides it).
    pub help_max: std::cell::Cell<u16>,
    /// A question is open before quitting.
    pub quit_prompt: Option<QuitPrompt>,
    /// Colours and glyphs.
    pub theme: Theme,
    /// Where files are read and written.
    pub paths: Paths,
    /// One-line message shown in the status line until the next key press.
    pub message: Option<String>,
    /// The Flags screen.
    pub flags: FlagsScreen,
    /// The Launch screen.
    pub launch: LaunchScreen,
    /// The Live screen.
    pub live: LiveScreen,
    /// The Runs screen.
    pub runs: RunsScreen,
    /// The Bench screen.
    pub bench: BenchScreen,
    /// The flag set marked as A for the quick A/B (`a` on the Flags or Bench screen).
    pub ab_mark: Option<super::screens::matrix::AbMark>,
    /// The noise threshold, in standard deviations, of the Runs comparison and the quick
    /// A/B (`n` in either; `--noise` on the command line).
    pub noise_sigmas: f64,
    /// The preset loaded at start (`--preset`, the remembered one, or the default).
    pub start_preset: String,
    /// Where the loaded preset is remembered for the next session (`None`: nowhere).
    pub remember: Option<std::path::PathBuf>,
}

impl App {
    /// A fresh panel on the Flags screen. Nothing is loaded yet: the runtime performs
    /// [`App::startup_effects`] (load the default preset, scan the runs directory).
    pub fn new(theme: Theme, paths: Paths) -> Self {
        App {
            tab: Tab::Flags,
            show_help: false,
            help_scroll: 0,
            help_max: std::cell::Cell::new(u16::MAX),
            quit_prompt: None,
            theme,
            paths,
            message: None,
            flags: FlagsScreen::default(),
            launch: LaunchScreen::default(),
            live: LiveScreen::default(),
            runs: RunsScreen::default(),
            bench: BenchScreen::default(),
            ab_mark: None,
            noise_sigmas: crate::record::compare::DEFAULT_NOISE_SIGMAS,
            start_preset: crate::flags::preset::DEFAULT_PRESET.to_string(),
            remember: None,
        }
    }

    /// What to do once at start: load the starting preset and read the runs directory.
    pub fn startup_effects(&self) -> Vec<Effect> {
        vec![
            Effect::LoadPreset(self.start_preset.clone()),
            Effect::ReloadRuns,
        ]
    }

    /// Whether the visible screen has a text field or dialog open that takes every key.
    fn screen_captures_keys(&self) -> bool {
        match self.tab {
            Tab::Flags => self.flags.captures_keys(),
            Tab::Runs => self.runs.captures_keys(),
            Tab::Launch => self.launch.captures_keys(),
            Tab::Bench => match self.bench.view {
                super::screens::matrix::BenchView::Form => self.bench.captures_keys(),
                super::screens::matrix::BenchView::Matrix => self.bench.matrix.editing.is_some(),
                super::screens::matrix::BenchView::Ab => self.bench.ab.editing.is_some(),
            },
            _ => false,
        }
    }

    /// Handle one key press; returns the effects to perform.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        self.message = None;
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return self.request_quit();
        }
        if let Some(prompt) = self.quit_prompt {
            return self.on_quit_prompt(prompt, key);
        }
        if self.show_help {
            // Scroll keys move the list; any other key closes it. It never acts below.
            let s = self.help_scroll;
            match key.code {
                KeyCode::Up | KeyCode::Char('k') => self.help_scroll = s.saturating_sub(1),
                KeyCode::Down | KeyCode::Char('j') => self.help_scroll = s.saturating_add(1),
                KeyCode::PageUp => self.help_scroll = s.saturating_sub(10),
                KeyCode::PageDown => self.help_scroll = s.saturating_add(10),
                KeyCode::Home => self.help_scroll = 0,
                _ => self.show_help = false,
            }
            self.help_scroll = self.help_scroll.min(self.help_max.get());
            return Vec::new();
        }
        if !self.screen_captures_keys() {
            match key.code {
                KeyCode::Char('?') => {
                    self.show_help = true;
                    self.help_scroll = 0;
                    return Vec::new();
                }
                KeyCode::Char('q') => return self.request_quit(),
                KeyCode::Tab => {
                    self.tab = Tab::ALL[(self.tab.index() + 1) % Tab::ALL.len()];
                    return Vec::new();
                }
                KeyCode::BackTab => {
                    self.tab = Tab::ALL[(self.tab.index() + Tab::ALL.len() - 1) % Tab::ALL.len()];
                    return Vec::new();
                }
                KeyCode::Char(c @ '1'..='5') => {
                    self.tab = Tab::ALL[(c as usize) - ('1' as usize)];
                    return Vec::new();
                }
                _ => {}
            }
        }
        let effects = match self.tab {
            Tab::Flags
                if key.code == KeyCode::Char('a')
                    && !self.flags.captures_keys()
                    && self.flags.overlay.is_none() =>
            {
                super::screens::matrix::mark_a(self);
                Vec::new()
            }
            Tab::Flags => self.flags.on_key(key),
            Tab::Runs => self
                .runs
                .on_key(key, &self.paths.export_dir, &mut self.noise_sigmas),
            Tab::Launch
                if key.code == KeyCode::Char('l')
                    && !self.launch.captures_keys()
                    && (self.bench.matrix.is_running() || self.bench.ab.is_running()) =>
            {
                self.message = Some(
                    "a matrix or A/B is running its own targets: wait for it, or cancel it on \
                     the Bench screen (4, then Esc)"
                        .into(),
                );
                Vec::new()
            }
            Tab::Launch => self.launch.on_key(key, &self.paths.export_dir),
            Tab::Live => {
                self.live.on_key(key);
                Vec::new()
            }
            Tab::Bench => match super::screens::matrix::on_bench_key(self, key) {
                Some(effects) => effects,
                None => {
                    let url = self.target_url();
                    self.bench.on_key(key, url.as_deref(), &self.paths.runs_dir)
                }
            },
        };
        // A screen's one-line answer to a key that could not act (nothing to export, no
        // match) goes to the status line.
        if let Some(m) = self
            .runs
            .notice
            .take()
            .or_else(|| self.launch.notice.take())
        {
            self.message = Some(m);
        }
        // One target choice: the flags render for the kind the Launch screen starts.
        if !self.launch.state.is_live() {
            match self.tab {
                Tab::Flags => self.launch.choice = self.flags.flags.target,
                Tab::Launch if self.launch.choice != TargetKind::Attach => {
                    self.flags.flags.target = self.launch.choice
                }
                _ => {}
            }
        }
        effects
    }

    /// How often the clock ticks: once a second while any screen has a running time (today
    /// the Launch screen's elapsed time, watchdog and probe age), whichever screen is
    /// visible, so switching to it shows the time of now; never while idle.
    pub fn tick_interval(&self) -> Option<std::time::Duration> {
        self.launch
            .wants_tick()
            .then_some(std::time::Duration::from_secs(1))
    }

    /// The clock ticked: every running time moves on.
    pub fn on_tick(&mut self) {
        self.launch.on_tick();
    }

    /// Whether the visible screen shows a running time, so a tick needs a redraw.
    pub fn shows_clock(&self) -> bool {
        self.tab == Tab::Launch && self.launch.wants_tick()
    }

    /// Whether a target started from this panel may still be running.
    pub fn target_running(&self) -> bool {
        self.launch.state.is_live()
    }

    /// The base URL of the running (or attached) target, once it is ready.
    pub fn target_url(&self) -> Option<String> {
        match &self.launch.state {
            super::screens::launch::TargetState::Ready { url, .. } => Some(url.clone()),
            _ => None,
        }
    }

    /// Progress or the end of the benchmark: update the Bench screen, and count its
    /// generated tokens for the Live screen's client-side tok/s.
    pub fn on_bench(&mut self, msg: super::background::BenchMsg) -> Vec<Effect> {
        use super::background::BenchMsg;
        let Some(run) = self.bench.run.as_mut() else {
            return Vec::new();
        };
        match msg {
            BenchMsg::Progress(ev) => {
                if let crate::bench::workload::BenchEvent::RequestDone { tokens, .. } = &ev {
                    self.live.bench_tokens(*tokens);
                }
                run.on_event(&ev);
                Vec::new()
            }
            BenchMsg::Done(out) => {
                self.live.bench_ended();
                run.on_done(out.as_deref().map_err(String::as_str));
                match &run.record {
                    Some(p) => {
                        self.message = Some(format!("saved run record {}", p.display()));
                        vec![Effect::ReloadRuns]
                    }
                    None => Vec::new(),
                }
            }
        }
    }

    /// Progress or the end of the matrix or A/B: update the Bench screen's views.
    pub fn on_matrix(&mut self, msg: super::background::MatrixMsg) -> Vec<Effect> {
        use super::background::MatrixMsg;
        match msg {
            MatrixMsg::Progress(ev) => {
                if let Some(r) = self.bench.matrix.run.as_mut()
                    && r.state.is_active()
                {
                    r.on_event(&ev);
                }
                if let Some(r) = self.bench.ab.run.as_mut()
                    && r.state.is_active()
                {
                    r.on_event(&ev);
                }
                Vec::new()
            }
            MatrixMsg::MatrixDone(out) => {
                let Some(r) = self.bench.matrix.run.as_mut() else {
                    return Vec::new();
                };
                r.on_done(out.as_ref().map_err(String::as_str));
                self.message = Some(match &out {
                    Ok(o) if o.interrupted => format!(
                        "matrix cancelled: resume with mxtune matrix --resume --out {}",
                        o.out.display()
                    ),
                    Ok(o) => format!("matrix report {}", o.report.display()),
                    Err(e) => format!("matrix could not run: {e}"),
                });
                vec![Effect::ReloadRuns]
            }
            MatrixMsg::AbDone(out) => {
                let Some(r) = self.bench.ab.run.as_mut() else {
                    return Vec::new();
                };
                r.on_done(out.as_deref().map_err(String::as_str));
                self.message = Some(match &out {
                    Ok(o) => format!("A/B result {}", o.md.display()),
                    Err(e) => format!("A/B could not run: {e}"),
                });
                vec![Effect::ReloadRuns]
            }
        }
    }

    /// A signal is ending the panel: save what must not be lost.
    pub fn on_signal(&mut self, _sig: i32) {}

    /// The operator quit; stop the target first when asked.
    pub fn on_quit(&mut self, _stop_target: bool) {}

    fn request_quit(&mut self) -> Vec<Effect> {
        if self.target_running() {
            self.quit_prompt = Some(QuitPrompt::TargetRunning);
            Vec::new()
        } else {
            vec![Effect::Quit { stop_target: false }]
        }
    }

    fn on_quit_prompt(&mut self, prompt: QuitPrompt, key: KeyEvent) -> Vec<Effect> {
        match (prompt, key.code) {
            (QuitPrompt::TargetRunning, KeyCode::Char('s')) => {
                vec![Effect::Quit { stop_target: true }]
            }
            (QuitPrompt::TargetRunning, KeyCode::Char('l')) => {
                vec![Effect::Quit { stop_target: false }]
            }
            (_, KeyCode::Esc | KeyCode::Char('c') | KeyCode::Char('n')) => {
                self.quit_prompt = None;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }
}

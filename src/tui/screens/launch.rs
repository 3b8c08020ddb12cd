//! Launch screen: choose the target (Docker vLLM, bundled engine, attach to a URL), start and
//! stop it, phase, elapsed time, the last readiness probe's answer and the watchdog, the
//! kernel-path verdict per flag, and the log pane (follow, scroll, search, wrap, save).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use crate::launch::preflight::{self, LaunchFinding, Severity};
use crate::launch::{
    DEFAULT_ATTACH_LIMIT, DEFAULT_STARTUP_LIMIT, LaunchEvent, Phase, ValidationReport, Verdict,
    fired_by_startup_limit,
};
use crate::vocab::{ProbeAnswer, TargetKind};

use super::super::app::{App, Effect};
use super::super::background::LaunchMsg;
use super::super::theme::Theme;
use super::super::ui::centered;

/// Log lines kept in the pane (older ones stay in the target's log file).
pub const LOG_CAPACITY: usize = 10_000;

/// Where the target stands, as the panel knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetState {
    /// Nothing started from this panel.
    Idle,
    /// Start requested, not yet running.
    Launching,
    /// Running, not ready yet.
    Starting(Phase),
    /// Ready to serve.
    Ready {
        /// Base URL of the API.
        url: String,
        /// Seconds from start to ready.
        startup_s: f64,
    },
    /// Stop requested.
    Stopping,
    /// Failed to start or died; why.
    Failed(String),
    /// Gone; how it ended.
    Exited(String),
}

impl TargetState {
    /// Whether a target started from this panel may still be running.
    pub fn is_live(&self) -> bool {
        matches!(
            self,
            TargetState::Launching
                | TargetState::Starting(_)
                | TargetState::Ready { .. }
                | TargetState::Stopping
        )
    }

    /// A short word for the status line.
    pub fn phase_text(&self) -> String {
        match self {
            TargetState::Idle => "stopped".into(),
            TargetState::Launching => "launching".into(),
            TargetState::Starting(p) => p.to_string(),
            TargetState::Ready { .. } => "ready".into(),
            TargetState::Stopping => "stopping".into(),
            TargetState::Failed(_) => "failed".into(),
            TargetState::Exited(_) => "exited".into(),
        }
    }
}

/// The start-up watchdog as the panel shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watchdog {
    /// No launch being followed: the limit applies from the next one.
    Waiting {
        /// The limit, whole seconds.
        limit_s: u64,
    },
    /// Following a start: time on the watchdog's clock against the limit.
    Running {
        /// Seconds since the target started being followed.
        elapsed_s: u64,
        /// The limit, whole seconds.
        limit_s: u64,
    },
    /// The target became ready in time.
    Passed {
        /// The limit, whole seconds.
        limit_s: u64,
    },
    /// The target was not ready within the limit and the launch failed.
    Fired {
        /// The limit, whole seconds.
        limit_s: u64,
    },
}

/// The last readiness probe answer, and how long ago it came.
#[derive(Debug, Clone, PartialEq)]
pub struct LastProbe {
    /// What the probe got back.
    pub answer: ProbeAnswer,
    /// When it reached the panel.
    pub received: Instant,
    /// Whole seconds since then, updated by ticks.
    pub age_s: u64,
}

/// The log pane: a bounded buffer and how it is being looked at.
#[derive(Debug, Clone, Default)]
pub struct LogView {
    /// Lines, oldest first.
    pub lines: VecDeque<String>,
    /// Lines dropped from the front because of the capacity.
    pub dropped: u64,
    /// Lines scrolled back from the end; 0 = following new lines.
    pub back: usize,
    /// Wrap long lines.
    pub wrap: bool,
    /// The active search.
    pub search: Option<String>,
    /// Search text being typed (after `/`).
    pub typing: Option<String>,
}

impl LogView {
    /// Append a line; a view scrolled back stays on the lines it shows.
    pub fn push(&mut self, line: String) {
        if self.lines.len() == LOG_CAPACITY {
            self.lines.pop_front();
            self.dropped += 1;
        } else if self.back > 0 {
            self.back += 1;
        }
        self.lines.push_back(line);
    }

    /// Whether new lines scroll into view.
    pub fn following(&self) -> bool {
        self.back == 0
    }

    fn scroll_up(&mut self, n: usize) {
        self.back = (self.back + n).min(self.lines.len().saturating_sub(1));
    }

    fn scroll_down(&mut self, n: usize) {
        self.back = self.back.saturating_sub(n);
    }

    fn matches(&self, i: usize) -> bool {
        self.search
            .as_ref()
            .is_some_and(|s| self.lines[i].to_lowercase().contains(&s.to_lowercase()))
    }

    /// Jump to the next match above (`older`) or below the bottom line of the view.
    pub fn jump(&mut self, older: bool) -> bool {
        let n = self.lines.len();
        if n == 0 || self.search.is_none() {
            return false;
        }
        let bottom = n - 1 - self.back.min(n - 1);
        let found = if older {
            (0..bottom).rev().find(|i| self.matches(*i))
        } else {
            (bottom + 1..n).find(|i| self.matches(*i))
        };
        match found {
            Some(i) => {
                self.back = n - 1 - i;
                true
            }
            None => false,
        }
    }
}

/// State of the Launch screen.
#[derive(Debug, Clone)]
pub struct LaunchScreen {
    /// Which kind of target `l` starts.
    pub choice: TargetKind,
    /// URL for the attach target.
    pub url: String,
    /// The URL field is being edited.
    pub editing_url: bool,
    /// `x` asked: stop the target? (y/n)
    pub confirm_stop: bool,
    /// Where the target stands.
    pub state: TargetState,
    /// `Target::describe` of the running target.
    pub describe: Option<String>,
    /// The target's log file.
    pub log_path: Option<PathBuf>,
    /// Run id of the launch.
    pub run_id: Option<String>,
    /// When the start was requested (for elapsed time).
    pub started_at: Option<Instant>,
    /// When the last log line arrived (watchdog).
    pub last_line_at: Option<Instant>,
    /// Whole seconds since start, updated by ticks.
    pub elapsed_s: u64,
    /// Whole seconds since the last log line, updated by ticks.
    pub quiet_s: u64,
    /// The start-up limit a Docker or engine launch from here gets.
    pub startup_limit: Duration,
    /// The limit an attach from here gets.
    pub attach_limit: Duration,
    /// The limit the follower of the current launch applies, as it echoed it back.
    pub limit_in_effect: Option<Duration>,
    /// The last readiness probe answer of the current launch.
    pub probe: Option<LastProbe>,
    /// When the follower took over (the watchdog's clock starts there).
    pub watch_since: Option<Instant>,
    /// Whole seconds on the watchdog's clock, updated by ticks.
    pub watch_s: u64,
    /// The last launch failed because the start-up limit passed.
    pub watchdog_fired: bool,
    /// Warnings from the follower (quiet log, unknown env vars, …).
    pub warnings: Vec<String>,
    /// The current launch's pre-flight findings, once its checks ran (`None` before, and for
    /// an attach, which has none).
    pub preflight: Option<Vec<LaunchFinding>>,
    /// The kernel-path verdict, once ready.
    pub report: Option<ValidationReport>,
    /// The log pane.
    pub log: LogView,
    /// Why the last key did nothing (for the status line).
    pub notice: Option<String>,
    /// What the current launch serves (kind, preset, flags, spec, run id), for the records
    /// of benchmarks started against it.
    pub served: Option<crate::bench::cli::ServedBy>,
    /// The dialect the current vLLM launch was rendered in (flavour, vLLM version, source).
    pub dialect: Option<crate::vocab::Dialect>,
    /// The vLLM version the target's start-up banner announced.
    pub vllm_announced: Option<String>,
    /// The hosts of hosts.toml a Docker target can run on (empty without a hosts file: then
    /// the screen looks and works as it always did).
    pub hosts: Vec<crate::hosts::Host>,
    /// The chosen host (index into `hosts`); `None`: this machine.
    pub host: Option<usize>,
    /// The host the current launch runs on, when not this machine.
    pub on_host: Option<crate::tui::background::OnHost>,
    /// Every host the current launch runs on, when more than one (a two-node cluster).
    pub target_hosts: Vec<crate::tui::background::HostWatch>,
    /// The current launch re-attached to a running cluster (`r`) instead of starting one.
    pub reattaching: bool,
}

impl Default for LaunchScreen {
    fn default() -> Self {
        LaunchScreen {
            choice: TargetKind::Engine,
            url: "http://127.0.0.1:8000".into(),
            editing_url: false,
            confirm_stop: false,
            state: TargetState::Idle,
            describe: None,
            log_path: None,
            run_id: None,
            served: None,
            started_at: None,
            last_line_at: None,
            elapsed_s: 0,
            quiet_s: 0,
            startup_limit: DEFAULT_STARTUP_LIMIT,
            attach_limit: DEFAULT_ATTACH_LIMIT,
            limit_in_effect: None,
            probe: None,
            watch_since: None,
            watch_s: 0,
            watchdog_fired: false,
            warnings: Vec::new(),
            preflight: None,
            report: None,
            log: LogView::default(),
            notice: None,
            dialect: None,
            vllm_announced: None,
            hosts: Vec::new(),
            host: None,
            on_host: None,
            target_hosts: Vec::new(),
            reattaching: false,
        }
    }
}

fn kind_name(k: TargetKind) -> &'static str {
    k.name()
}

/// `h:mm:ss` or `m:ss`.
pub fn clock(s: u64) -> String {
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// Style of a log line: errors and warnings stand out.
pub fn line_style(theme: &Theme, line: &str) -> Style {
    let l = line.to_ascii_lowercase();
    if l.contains("error") || l.contains("traceback") || l.contains("fatal") || l.contains("panic")
    {
        theme.error()
    } else if l.contains("warn") {
        theme.warn()
    } else {
        Style::default()
    }
}

impl LaunchScreen {
    /// Whether a text field or question takes every key.
    /// The host a Docker launch from here goes to (`None`: this machine).
    pub fn chosen_host(&self) -> Option<&crate::hosts::Host> {
        self.host.and_then(|i| self.hosts.get(i))
    }

    pub fn captures_keys(&self) -> bool {
        self.editing_url || self.confirm_stop || self.log.typing.is_some()
    }

    /// The file `S` writes the log pane to.
    pub fn log_export_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!(
            "launch-{}.log",
            self.run_id.as_deref().unwrap_or("no-run")
        ))
    }

    /// A second passed: refresh elapsed time and the watchdog.
    pub fn on_tick(&mut self) {
        if let Some(t) = self.started_at {
            self.elapsed_s = t.elapsed().as_secs();
        }
        if let Some(t) = self.last_line_at {
            self.quiet_s = t.elapsed().as_secs();
        }
        if let Some(t) = self.watch_since {
            self.watch_s = t.elapsed().as_secs();
        }
        if let Some(p) = &mut self.probe {
            p.age_s = p.received.elapsed().as_secs();
        }
    }

    /// The limit the next launch of the chosen kind gets: an attached endpoint is already
    /// running and gets its own, short limit.
    pub fn next_limit(&self) -> Duration {
        match self.choice {
            TargetKind::Attach => self.attach_limit,
            _ => self.startup_limit,
        }
    }

    /// Where the start-up watchdog stands, with the limit that applies: the one the current
    /// launch's follower echoed back, else the next launch's.
    pub fn watchdog(&self) -> Watchdog {
        let limit_s = self.limit_in_effect.unwrap_or(self.next_limit()).as_secs();
        match &self.state {
            TargetState::Failed(_) if self.watchdog_fired => Watchdog::Fired { limit_s },
            TargetState::Starting(_) if self.watch_since.is_some() => Watchdog::Running {
                elapsed_s: self.watch_s,
                limit_s,
            },
            TargetState::Ready { .. } => Watchdog::Passed { limit_s },
            _ => Watchdog::Waiting {
                limit_s: self.next_limit().as_secs(),
            },
        }
    }

    /// Whether elapsed time and watchdog need a ticking clock.
    pub fn wants_tick(&self) -> bool {
        matches!(
            self.state,
            TargetState::Launching | TargetState::Starting(_) | TargetState::Stopping
        )
    }

    /// News from the background launch.
    pub fn on_msg(&mut self, msg: LaunchMsg) {
        match msg {
            LaunchMsg::Started {
                describe,
                run_id,
                log_path,
                startup_limit,
                spec,
                on_host,
                target_hosts,
            } => {
                self.on_host = on_host.map(|b| *b);
                self.target_hosts = target_hosts;
                self.dialect = spec.as_ref().and_then(|b| b.dialect.clone());
                if let Some(s) = self.served.as_mut() {
                    s.launch = spec.map(|b| *b);
                    s.launch_run = Some(run_id.clone());
                }
                self.limit_in_effect = Some(startup_limit);
                self.watch_since = Some(Instant::now());
                self.watch_s = 0;
                if self.reattaching {
                    // As `mxtune launch --reattach` says it, so it stays with the lines.
                    self.log
                        .push(format!("re-attaching to run {run_id}: {describe}"));
                }
                self.describe = Some(describe);
                self.run_id = Some(run_id);
                self.log_path = log_path;
                if self.state == TargetState::Launching {
                    self.state = TargetState::Starting(Phase::Starting);
                }
            }
            LaunchMsg::Preflight(findings) => {
                // In the log as `mxtune launch` prints them, so they stay with the target's
                // lines (and in a saved log).
                for f in &findings {
                    self.log.push(f.line());
                }
                if preflight::blocked(&findings) {
                    self.log.push(preflight::BLOCKED.to_string());
                }
                self.preflight = Some(findings);
            }
            LaunchMsg::StartFailed(e) => self.state = TargetState::Failed(e),
            LaunchMsg::Stopped(r) => {
                self.state = TargetState::Exited(match r {
                    Ok(m) => m,
                    Err(e) => format!("stop failed: {e}"),
                })
            }
            LaunchMsg::Event(ev) => self.on_event(ev),
        }
    }

    fn on_event(&mut self, ev: LaunchEvent) {
        match ev {
            LaunchEvent::Log { line, .. } => {
                self.last_line_at = Some(Instant::now());
                self.quiet_s = 0;
                if self.vllm_announced.is_none() {
                    self.vllm_announced =
                        crate::launch::dialect::banner_version(&line).map(|v| v.to_string());
                }
                self.log.push(line);
            }
            LaunchEvent::PullProgress { status } => self.log.push(format!("[pull] {status}")),
            LaunchEvent::Phase { phase } => {
                if !matches!(
                    self.state,
                    TargetState::Ready { .. } | TargetState::Stopping
                ) {
                    self.state = TargetState::Starting(phase);
                }
            }
            LaunchEvent::Ready { url, startup_s } => {
                self.state = TargetState::Ready { url, startup_s }
            }
            LaunchEvent::Verdict { report } => self.report = Some(report),
            LaunchEvent::Probe { answer } => {
                self.probe = Some(LastProbe {
                    answer,
                    received: Instant::now(),
                    age_s: 0,
                })
            }
            LaunchEvent::Warning { message } => self.warnings.push(message),
            LaunchEvent::Failed { message } => {
                self.watchdog_fired = fired_by_startup_limit(&message);
                self.state = TargetState::Failed(message.lines().next().unwrap_or("").to_string())
            }
            LaunchEvent::Exited { exit } => {
                if !matches!(self.state, TargetState::Failed(_)) {
                    self.state = TargetState::Exited(exit.to_string());
                }
            }
        }
    }

    /// Jump to the next match, or say why the view did not move.
    fn search_jump(&mut self, older: bool) {
        if self.log.jump(older) {
            return;
        }
        self.notice = Some(match &self.log.search {
            None => "no search: / starts one".to_string(),
            Some(q) if older => format!("no older line matches {q:?} (N goes newer)"),
            Some(q) => format!("no newer line matches {q:?} (n goes older)"),
        });
    }

    /// A launch (or, with `reattach`, a re-attach) was asked for: what the last one showed is
    /// cleared and the screen says this one is under way.
    fn begin(&mut self, reattach: bool) {
        self.state = TargetState::Launching;
        self.reattaching = reattach;
        self.started_at = Some(Instant::now());
        self.last_line_at = None;
        self.elapsed_s = 0;
        self.quiet_s = 0;
        self.watch_since = None;
        self.watch_s = 0;
        self.watchdog_fired = false;
        self.limit_in_effect = None;
        self.probe = None;
        self.report = None;
        self.warnings.clear();
        self.preflight = None;
        self.describe = None;
        self.dialect = None;
        self.vllm_announced = None;
        self.log = LogView {
            wrap: self.log.wrap,
            ..LogView::default()
        };
    }

    /// Handle a key on this screen.
    pub fn on_key(&mut self, key: KeyEvent, export_dir: &Path) -> Vec<Effect> {
        if self.confirm_stop {
            self.confirm_stop = false;
            if matches!(key.code, KeyCode::Char('y') | KeyCode::Enter) && self.state.is_live() {
                self.state = TargetState::Stopping;
                return vec![Effect::StopTarget];
            }
            return Vec::new();
        }
        if self.editing_url {
            if matches!(
                super::text_key(&mut self.url, key, usize::MAX),
                super::TextKey::Submit | super::TextKey::Cancel
            ) {
                self.editing_url = false;
            }
            return Vec::new();
        }
        if let Some(t) = &mut self.log.typing {
            match super::text_key(t, key, usize::MAX) {
                super::TextKey::Cancel => self.log.typing = None,
                super::TextKey::Submit => {
                    let s = std::mem::take(t);
                    self.log.typing = None;
                    self.log.search = (!s.is_empty()).then_some(s);
                    self.search_jump(true);
                }
                super::TextKey::Edited | super::TextKey::Other => {}
            }
            return Vec::new();
        }
        match key.code {
            KeyCode::Char('t') if !self.state.is_live() => {
                self.choice = match self.choice {
                    TargetKind::Engine => TargetKind::Docker,
                    TargetKind::Docker => TargetKind::Attach,
                    TargetKind::Attach => TargetKind::Engine,
                    // A two-node preset's own target comes back with the preset.
                    TargetKind::DockerCluster => TargetKind::Engine,
                }
            }
            KeyCode::Char('h') if !self.state.is_live() && !self.hosts.is_empty() => {
                if self.choice == TargetKind::Docker {
                    // this machine → each host of hosts.toml → this machine
                    self.host = match self.host {
                        None => Some(0),
                        Some(i) if i + 1 < self.hosts.len() => Some(i + 1),
                        Some(_) => None,
                    };
                } else {
                    self.notice = Some(
                        "a host of hosts.toml runs Docker targets: press t for docker first".into(),
                    );
                }
            }
            KeyCode::Char('u') if !self.state.is_live() => {
                self.choice = TargetKind::Attach;
                self.editing_url = true;
            }
            KeyCode::Char('l') if !self.state.is_live() => {
                self.begin(false);
                return vec![Effect::StartTarget];
            }
            KeyCode::Char('r')
                if !self.state.is_live() && self.choice == TargetKind::DockerCluster =>
            {
                self.begin(true);
                return vec![Effect::ReattachTarget];
            }
            KeyCode::Char('x') if self.state.is_live() => self.confirm_stop = true,
            KeyCode::Up | KeyCode::Char('k') => self.log.scroll_up(1),
            KeyCode::Down | KeyCode::Char('j') => self.log.scroll_down(1),
            KeyCode::PageUp => self.log.scroll_up(20),
            KeyCode::PageDown => self.log.scroll_down(20),
            KeyCode::Home => self.log.back = self.log.lines.len().saturating_sub(1),
            KeyCode::End => self.log.back = 0,
            KeyCode::Char('/') => self.log.typing = Some(String::new()),
            KeyCode::Char('n') => self.search_jump(true),
            KeyCode::Char('N') => self.search_jump(false),
            KeyCode::Char('w') => self.log.wrap = !self.log.wrap,
            KeyCode::Char('S') => return vec![Effect::SaveLog(self.log_export_path(export_dir))],
            _ => {}
        }
        Vec::new()
    }
}

/// The vLLM line of a Docker launch: the dialect and release it was rendered for, how that
/// release was known, and what the image's banner announced.
fn vllm_line(s: &LaunchScreen, theme: &Theme) -> Option<Line<'static>> {
    let d = s.dialect.as_ref()?;
    let mut spans = vec![Span::styled(" vLLM ", theme.dim())];
    match (&d.vllm_version, d.version_source.as_deref()) {
        (Some(v), Some("assumed")) => spans.push(Span::styled(
            format!(
                "{} dialect, version unknown: rendered for {v} (newest known)",
                d.flavour
            ),
            theme.warn(),
        )),
        (Some(v), Some(src)) => spans.push(Span::raw(format!(
            "{} dialect, rendered for {v} ({src})",
            d.flavour
        ))),
        _ => spans.push(Span::raw(format!("{} dialect", d.flavour))),
    }
    match &s.vllm_announced {
        Some(a) => {
            use crate::flags::versions::{VllmVersion, same_names};
            let differs = match (
                d.vllm_version.as_deref().and_then(VllmVersion::parse),
                VllmVersion::parse(a),
            ) {
                (Some(r), Some(seen)) => !same_names(&r, &seen),
                _ => false,
            };
            spans.push(Span::styled(
                format!("  image says {a}"),
                if differs { theme.warn() } else { theme.good() },
            ));
        }
        None => spans.push(Span::styled("  banner not seen yet", theme.dim())),
    }
    Some(Line::from(spans))
}

/// Draw the Launch screen.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    let s = &app.launch;
    let theme = &app.theme;
    let checks = s.report.as_ref().map(|r| r.checks.len()).unwrap_or(0);
    let verdict_h = if s.report.is_some() {
        (checks as u16 + 2).clamp(3, 8)
    } else {
        0
    };
    let probe_line = probe_line(s, theme);
    let vllm_line = vllm_line(s, theme);

    // Target choice, phase, elapsed, watchdog.
    let mut choice = vec![Span::styled(" target ", theme.dim())];
    for k in [TargetKind::Engine, TargetKind::Docker, TargetKind::Attach] {
        let label = if k == s.choice {
            format!("[{}]", kind_name(k))
        } else {
            format!(" {} ", kind_name(k))
        };
        choice.push(if k == s.choice {
            Span::styled(label, theme.selected())
        } else {
            Span::raw(label)
        });
    }
    match s.choice {
        TargetKind::Attach => {
            choice.push(Span::styled("  url ", theme.dim()));
            choice.push(Span::raw(format!(
                "{}{}",
                s.url,
                if s.editing_url { "_" } else { "" }
            )));
        }
        k => {
            choice.push(Span::styled("  preset ", theme.dim()));
            choice.push(Span::raw(
                app.flags
                    .loaded
                    .as_ref()
                    .map(|p| p.name.clone())
                    .unwrap_or_else(|| "(none)".into()),
            ));
            if app.flags.dirty() {
                choice.push(Span::styled(" [+]", theme.warn()));
            }
            // Only with a hosts file: without one the line is as it always was.
            if k == TargetKind::Docker && !s.hosts.is_empty() {
                choice.push(Span::styled("  host ", theme.dim()));
                choice.push(Span::styled(
                    s.chosen_host()
                        .map(|h| format!("{} ({})", h.name, h.ssh))
                        .unwrap_or_else(|| "this machine".into()),
                    theme.accent(),
                ));
            }
            if k != app.flags.flags.target {
                choice.push(Span::styled(
                    format!("  (flags are for {})", kind_name(app.flags.flags.target)),
                    theme.warn(),
                ));
            }
        }
    }
    let phase_style = match &s.state {
        TargetState::Ready { .. } => theme.good(),
        TargetState::Failed(_) => theme.error(),
        TargetState::Idle | TargetState::Exited(_) => theme.dim(),
        _ => theme.accent(),
    };
    let mut phase = vec![
        Span::styled(" phase ", theme.dim()),
        Span::styled(s.state.phase_text(), phase_style),
    ];
    // Elapsed ticks while starting; once ready the start-up time says it all.
    if s.started_at.is_some() && !matches!(s.state, TargetState::Ready { .. }) {
        phase.push(Span::styled("  elapsed ", theme.dim()));
        phase.push(Span::raw(clock(s.elapsed_s)));
    }
    match &s.state {
        TargetState::Ready { url, startup_s } => {
            phase.push(Span::raw(format!("  {url}  ready after {startup_s:.1} s")));
        }
        TargetState::Failed(m) | TargetState::Exited(m) => {
            phase.push(Span::raw(format!("  {}", theme.text(m))));
        }
        _ => {}
    }
    let mut watch = vec![Span::styled(" watchdog ", theme.dim())];
    match s.watchdog() {
        Watchdog::Waiting { limit_s } => watch.push(Span::styled(
            if s.state == TargetState::Launching && s.reattaching {
                "finding the preset's running cluster on its hosts (by the containers' labels)"
                    .to_string()
            } else if s.state == TargetState::Launching
                && s.preflight.is_none()
                && s.choice != TargetKind::Attach
            {
                format!(
                    "pre-flight checks running {} (port, mounts, GPU, compilers, memory)",
                    match (s.choice, s.chosen_host()) {
                        (TargetKind::DockerCluster, _) => "on the cluster's hosts".to_string(),
                        (TargetKind::Docker, Some(h)) => format!("on host {}", h.name),
                        _ => "here".to_string(),
                    }
                )
            } else if s.state == TargetState::Launching {
                format!("waiting for the target to start (limit {})", clock(limit_s))
            } else {
                format!("waiting: limit {} from the next launch", clock(limit_s))
            },
            theme.dim(),
        )),
        Watchdog::Running { elapsed_s, limit_s } => {
            watch.push(Span::styled(
                format!("{}/{}", clock(elapsed_s), clock(limit_s)),
                theme.accent(),
            ));
            // An attached endpoint has no log to be quiet; the probe line says how it is.
            if s.choice != TargetKind::Attach {
                watch.push(Span::raw(if s.last_line_at.is_some() {
                    format!("  last log line {} ago", clock(s.quiet_s))
                } else {
                    "  no log line yet".into()
                }));
            }
        }
        Watchdog::Passed { limit_s } => watch.push(Span::styled(
            format!("passed: ready within the limit of {}", clock(limit_s)),
            theme.dim(),
        )),
        Watchdog::Fired { limit_s } => watch.push(Span::styled(
            format!(
                "FIRED: not ready within {}; the launch failed",
                clock(limit_s)
            ),
            theme.error(),
        )),
    }
    let mut third = vec![Span::styled(" ", theme.dim())];
    if s.state == TargetState::Idle {
        third.push(Span::styled(
            match s.choice {
                TargetKind::Attach => "l attaches to the URL (u edits it); t picks the target",
                TargetKind::DockerCluster => {
                    "l starts the cluster with the current flags; r re-attaches to its running cluster (one left running by mxtune launch or by quitting the panel); t picks the target"
                }
                _ => "l starts it with the current flags; t picks the target",
            },
            theme.dim(),
        ));
    }
    if let Some(d) = &s.describe {
        third.push(Span::raw(d.clone()));
    }
    if let Some(p) = &s.log_path {
        third.push(Span::styled(format!("  log {}", p.display()), theme.dim()));
    }
    let warn_line = s
        .warnings
        .last()
        .map(|w| Line::styled(format!(" warning: {}", theme.text(w)), theme.warn()))
        .unwrap_or_else(|| Line::raw(""));
    let mut head_lines = vec![Line::from(choice), Line::from(phase)];
    head_lines.extend(probe_line);
    head_lines.extend([Line::from(watch), Line::from(third)]);
    head_lines.extend(vllm_line);
    head_lines.push(warn_line);
    // Wrapped at the edge, never cut; the head takes the rows it needs (up to a third of the
    // screen), the log the rest.
    let head_text = Paragraph::new(head_lines).wrap(Wrap { trim: false });
    let head_h = (head_text.line_count(area.width) as u16).min((area.height / 3).max(6));
    let preflight_box = preflight_box(s, theme);
    // Blocked: up to half the screen, the findings are the news; warnings: a quarter, the
    // target's log matters more from now on.
    let preflight_h = match &preflight_box {
        // The count includes the borders; the text is two columns narrower than the box.
        Some((p, blocked)) => {
            (p.line_count(area.width.saturating_sub(2)) as u16).min(if *blocked {
                area.height / 2
            } else {
                (area.height / 4).max(3)
            })
        }
        None => 0,
    };
    let [head, preflight_area, verdict_area, log_area] = Layout::vertical([
        Constraint::Length(head_h),
        Constraint::Length(preflight_h),
        Constraint::Length(verdict_h),
        Constraint::Min(3),
    ])
    .areas(area);
    frame.render_widget(head_text, head);
    if let Some((p, _)) = preflight_box {
        frame.render_widget(p, preflight_area);
    }

    if let Some(r) = &s.report {
        let mut lines = Vec::new();
        for c in &r.checks {
            let (word, style) = match c.verdict {
                Verdict::Valid => ("valid", theme.good()),
                Verdict::Invalid => ("INVALID", theme.error()),
                Verdict::Unknown => ("unknown", theme.warn()),
            };
            let evidence = c
                .forbidden_seen
                .first()
                .or(c.seen.first())
                .map(|l| format!("saw: {l}"))
                .or_else(|| c.missing.first().map(|m| format!("never saw: {m}")))
                .or_else(|| c.note.clone())
                .unwrap_or_default();
            lines.push(Line::from(vec![
                Span::raw(format!(" {:<28}", format!("{}={}", c.flag, c.value))),
                Span::styled(format!("{word:<8}"), style),
                Span::styled(theme.text(&evidence).into_owned(), theme.dim()),
            ]));
        }
        for e in &r.unknown_env {
            lines.push(Line::styled(
                format!(" unknown env var (ignored by the target): {e}"),
                theme.warn(),
            ));
        }
        frame.render_widget(
            Paragraph::new(lines).block(
                Block::bordered()
                    .border_set(theme.border())
                    .title(" Kernel path: is each flag in effect? "),
            ),
            verdict_area,
        );
    }
    draw_log(frame, app, log_area);

    if s.confirm_stop {
        let popup = centered(area, 56, 5);
        frame.render_widget(Clear, popup);
        frame.render_widget(
            Paragraph::new(format!(
                "Stop {}?\n\ny  stop it    any other key  keep it",
                s.describe.as_deref().unwrap_or("the target")
            ))
            .wrap(Wrap { trim: true })
            .block(
                Block::bordered()
                    .border_set(theme.border())
                    .border_style(theme.warn())
                    .title(" Stop target? "),
            ),
            popup,
        );
    }
}

/// The current launch's pre-flight findings, each with its severity, wrapped; and whether
/// one blocked the launch. `None` when the checks found nothing (or have not run).
fn preflight_box(s: &LaunchScreen, theme: &Theme) -> Option<(Paragraph<'static>, bool)> {
    let findings = s.preflight.as_ref().filter(|f| !f.is_empty())?;
    let blocked = preflight::blocked(findings);
    let lines: Vec<Line> = findings
        .iter()
        .map(|f| {
            let (word, style) = match f.finding.severity {
                Severity::Error => ("error", theme.error()),
                Severity::Warning => ("warning", theme.warn()),
            };
            let node = f.node.map(|n| format!(" ({n})")).unwrap_or_default();
            Line::from(vec![
                Span::styled(format!("{word}{node}: "), style),
                Span::raw(theme.text(&f.finding.message).into_owned()),
            ])
        })
        .collect();
    let title = if blocked {
        " Pre-flight: blocked, nothing was started; fix it, then l launches again ".to_string()
    } else {
        " Pre-flight: warnings; the launch went on ".to_string()
    };
    let p = Paragraph::new(lines).wrap(Wrap { trim: false }).block(
        Block::bordered()
            .border_set(theme.border())
            .border_style(if blocked { theme.error() } else { theme.warn() })
            .title(title),
    );
    Some((p, blocked))
}

/// The line under the phase: the last readiness probe's answer while a start is being
/// followed (why it is not ready yet), and after a failure. `None` when there is nothing to say.
fn probe_line(s: &LaunchScreen, theme: &Theme) -> Option<Line<'static>> {
    let starting = matches!(s.state, TargetState::Launching | TargetState::Starting(_));
    let failed = matches!(s.state, TargetState::Failed(_));
    match &s.probe {
        Some(p) if starting => Some(Line::from(vec![
            Span::styled(" probe: ", theme.dim()),
            Span::styled(theme.text(&p.answer.to_string()).into_owned(), theme.warn()),
            Span::styled(format!(", {} ago", ago(p.age_s)), theme.dim()),
        ])),
        // The age would no longer tick: the last answer is the reason, not news.
        Some(p) if failed => Some(Line::from(vec![
            Span::styled(" last probe: ", theme.dim()),
            Span::styled(theme.text(&p.answer.to_string()).into_owned(), theme.warn()),
        ])),
        None if starting => Some(Line::styled(" probe: no answer yet", theme.dim())),
        _ => None,
    }
}

/// `3 s`, `2:05`: how long ago, short.
fn ago(s: u64) -> String {
    if s < 60 { format!("{s} s") } else { clock(s) }
}

fn draw_log(frame: &mut Frame, app: &App, area: Rect) {
    let s = &app.launch;
    let theme = &app.theme;
    let log = &s.log;
    let inner_h = area.height.saturating_sub(2) as usize;
    let inner_w = area.width.saturating_sub(2).max(1) as usize;
    let n = log.lines.len();
    let end = n - log.back.min(n);
    // Walk back from the bottom line until the pane is full (wrapped lines take more rows).
    let mut rows = 0;
    let mut start = end;
    while start > 0 {
        let len = log.lines[start - 1].chars().count().max(1);
        let h = if log.wrap { len.div_ceil(inner_w) } else { 1 };
        if rows + h > inner_h {
            break;
        }
        rows += h;
        start -= 1;
    }
    let lines: Vec<Line> = (start..end)
        .map(|i| {
            let text = theme.text(&log.lines[i]).into_owned();
            let mut style = line_style(theme, &text);
            if log.matches(i) {
                style = style.add_modifier(ratatui::style::Modifier::REVERSED);
            }
            Line::styled(text, style)
        })
        .collect();
    let mut title = format!(
        " Log {} lines{} ",
        n as u64 + log.dropped,
        if log.following() {
            ", following"
        } else {
            ", paused (End follows)"
        }
    );
    if log.wrap {
        title.push_str("[wrap] ");
    }
    if let Some(t) = &log.typing {
        title.push_str(&format!("search: {t}_ "));
    } else if let Some(q) = &log.search {
        title.push_str(&format!("/{q} (n/N) "));
    }
    let mut p =
        Paragraph::new(lines).block(Block::bordered().border_set(theme.border()).title(title));
    if log.wrap {
        p = p.wrap(Wrap { trim: false });
    }
    frame.render_widget(p, area);
}

//! Bench screen: a workload form (pp / tg / depth / concurrency / runs, or a level), run it
//! against the current target through the same code as `mxtune bench --record`, follow the
//! progress per point, and read the results (mean ± std) as points finish. Esc cancels at
//! once; the partial record is kept as `aborted`.

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Wrap};

use crate::bench::cli::{BenchArgs, BenchOutcome};
use crate::bench::levels::Level;
use crate::bench::workload::{BenchEvent, PointResult, point_label};
use crate::record::schema::{Stats, WorkloadPoint};

use super::super::app::{App, Effect};
use super::super::theme::Theme;

/// The form's rows, in order: the level, then the numeric fields.
pub const FIELDS: [&str; 6] = ["level", "pp", "tg", "depth", "concurrency", "runs"];

/// The levels Enter/←→ cycle through on the level row.
pub const LEVELS: [Level; 3] = [Level::Performance, Level::Correctness, Level::Stress];

/// One finished point as the results table shows it (the same figures `mxtune bench`
/// prints: at concurrency > 1 the batch totals).
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRow {
    /// The point.
    pub point: WorkloadPoint,
    /// Prompt tokens/s.
    pub pp_tps: Option<Stats>,
    /// Generation tokens/s.
    pub tg_tps: Option<Stats>,
    /// Time to first response chunk, ms.
    pub ttfr_ms: Option<Stats>,
    /// Start to first token, ms.
    pub e2e_ttft_ms: Option<Stats>,
    /// Time per output token, ms (mean ± std over requests).
    pub tpot_ms: Option<Stats>,
    /// Measured requests.
    pub requests: u32,
    /// Failed requests.
    pub errors: u32,
    /// Cut short by a cancel.
    pub partial: bool,
}

impl ResultRow {
    /// The row of a measured point.
    pub fn of(p: &PointResult) -> Self {
        let r = &p.stats.record;
        let batch = p.point.concurrency > 1;
        ResultRow {
            point: p.point,
            pp_tps: if batch {
                p.stats.pp_total_tps
            } else {
                r.pp_tps
            },
            tg_tps: if batch { r.total_tg_tps } else { r.tg_tps },
            ttfr_ms: r.ttfr_ms,
            e2e_ttft_ms: r.e2e_ttft_ms,
            tpot_ms: r.latency.tpot_ms.map(|l| Stats {
                n: l.n,
                mean: l.mean,
                std: l.std,
                min: l.p50,
                max: l.p99,
            }),
            requests: r.requests,
            errors: r.errors,
            partial: p.partial,
        }
    }
}

/// Where a benchmark stands.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// Requests are being sent.
    Running,
    /// Esc was pressed; waiting for the record to be saved.
    Cancelling,
    /// Ended; the record (if any) is final.
    Finished {
        /// Cancelled before the end.
        aborted: bool,
        /// Every level passed.
        passed: bool,
    },
    /// Could not run at all (no model, bad URL, ...).
    Failed(String),
}

/// A benchmark started from this screen.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRun {
    /// The target's URL.
    pub url: String,
    /// Measured runs per point.
    pub runs: u32,
    /// Warm-up runs per point.
    pub warmup: u32,
    /// Where it stands.
    pub state: RunState,
    /// Points in the grid (0 until the grid starts).
    pub points: usize,
    /// The point in progress: its index and the point.
    pub current: Option<(usize, WorkloadPoint)>,
    /// Requests finished in the current point (warm-up included).
    pub done_in_point: u64,
    /// What is happening now, a few words.
    pub phase: String,
    /// Finished points, in grid order.
    pub rows: Vec<ResultRow>,
    /// Level verdicts: the level, pass, and the failed checks.
    pub levels: Vec<(Level, bool, Vec<String>)>,
    /// The saved run record.
    pub record: Option<PathBuf>,
    /// Problems that did not stop the run.
    pub warnings: Vec<String>,
}

impl BenchRun {
    /// A run that has just been asked for.
    pub fn new(url: &str, runs: u32, warmup: u32) -> Self {
        BenchRun {
            url: url.to_string(),
            runs,
            warmup,
            state: RunState::Running,
            points: 0,
            current: None,
            done_in_point: 0,
            phase: "connecting".into(),
            rows: Vec::new(),
            levels: Vec::new(),
            record: None,
            warnings: Vec::new(),
        }
    }

    /// Whether requests may still be in flight.
    pub fn is_active(&self) -> bool {
        matches!(self.state, RunState::Running | RunState::Cancelling)
    }

    /// The batch (run) in progress in the current point, 1-based, and whether it is a
    /// warm-up; `None` before the first point.
    pub fn batch(&self) -> Option<(u64, bool)> {
        let (_, p) = self.current?;
        let c = u64::from(p.concurrency.max(1));
        let batch = (self.done_in_point / c).min(u64::from(self.runs + self.warmup - 1));
        let warmup = batch < u64::from(self.warmup);
        Some((
            if warmup {
                batch + 1
            } else {
                batch + 1 - u64::from(self.warmup)
            },
            warmup,
        ))
    }

    /// Apply one progress event.
    pub fn on_event(&mut self, ev: &BenchEvent) {
        match ev {
            BenchEvent::Started { points, .. } => {
                self.points = *points;
                self.phase = "measuring latency".into();
            }
            BenchEvent::Latency { .. } => self.phase = "latency measured".into(),
            BenchEvent::PointStarted { index, point } => {
                self.current = Some((*index, *point));
                self.done_in_point = 0;
            }
            BenchEvent::RequestDone { .. } => self.done_in_point += 1,
            BenchEvent::PointDone { result, .. } => {
                self.rows.push(ResultRow::of(result));
                self.warnings.extend(
                    result
                        .errors
                        .iter()
                        .map(|(m, n)| format!("{}: {n}x {m}", point_label(&result.point))),
                );
            }
            BenchEvent::LevelDone(report) => {
                self.levels
                    .push((report.level, report.passed, report.notes()));
            }
            BenchEvent::Finished { .. } => {}
        }
        if let Some((warm_batch, warmup)) = self.batch()
            && matches!(
                ev,
                BenchEvent::PointStarted { .. } | BenchEvent::RequestDone { .. }
            )
        {
            self.phase = if warmup {
                format!("warm-up {warm_batch}/{}", self.warmup)
            } else {
                "measuring".into()
            };
        }
    }

    /// The benchmark ended.
    pub fn on_done(&mut self, out: Result<&BenchOutcome, &str>) {
        match out {
            Ok(o) => {
                self.state = RunState::Finished {
                    aborted: o.aborted,
                    passed: o.passed(),
                };
                self.record = o.record.clone();
                // Levels reported by the outcome but not as events (correctness, stress).
                for l in &o.levels {
                    if !self.levels.iter().any(|(lv, ..)| *lv == l.level) {
                        self.levels.push((l.level, l.passed, l.notes()));
                    }
                }
                if let Some(g) = &o.grid {
                    for w in &g.warnings {
                        if !self.warnings.contains(w) {
                            self.warnings.push(w.clone());
                        }
                    }
                }
                self.warnings.extend(o.notes.iter().cloned());
                self.warnings.extend(
                    o.record_errors
                        .iter()
                        .map(|e| format!("run record not updated: {e}")),
                );
                self.phase = if o.aborted { "cancelled" } else { "done" }.into();
            }
            Err(e) => {
                self.state = RunState::Failed(e.to_string());
                self.phase = "failed".into();
            }
        }
        self.current = None;
    }
}

/// State of the Bench screen.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchScreen {
    /// The level the run does (performance = the grid).
    pub level: Level,
    /// pp, tg, depth, concurrency, runs as typed (lists are comma-separated).
    pub values: [String; 5],
    /// Selected form row (index into [`FIELDS`]).
    pub selected: usize,
    /// The text being typed into the selected field.
    pub editing: Option<String>,
    /// What is wrong with the form, shown inline.
    pub error: Option<String>,
    /// The benchmark started last.
    pub run: Option<BenchRun>,
    /// Which view is shown: the form, the matrix, or the quick A/B.
    pub view: super::matrix::BenchView,
    /// The matrix view.
    pub matrix: super::matrix::MatrixView,
    /// The quick A/B.
    pub ab: super::matrix::AbView,
}

impl Default for BenchScreen {
    /// The form starts at `mxtune bench`'s defaults.
    fn default() -> Self {
        let d = BenchArgs::defaults("http://127.0.0.1").ok();
        let list = |v: Option<&Vec<u32>>, fallback: &str| {
            v.map(|v| join(v)).unwrap_or_else(|| fallback.to_string())
        };
        BenchScreen {
            level: Level::Performance,
            values: [
                list(d.as_ref().map(|d| &d.pp), "2048"),
                list(d.as_ref().map(|d| &d.tg), "32"),
                list(d.as_ref().map(|d| &d.depth), "0"),
                list(d.as_ref().map(|d| &d.concurrency), "1"),
                d.as_ref()
                    .map(|d| d.runs.to_string())
                    .unwrap_or_else(|| "5".into()),
            ],
            selected: 0,
            editing: None,
            error: None,
            run: None,
            view: super::matrix::BenchView::Form,
            matrix: super::matrix::MatrixView::default(),
            ab: super::matrix::AbView::default(),
        }
    }
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Parse a field: comma- or space-separated whole numbers (one for `runs`).
pub fn parse_field(name: &str, text: &str) -> Result<Vec<u32>, String> {
    let parts: Vec<&str> = text
        .split([',', ' '])
        .filter(|p| !p.trim().is_empty())
        .collect();
    if parts.is_empty() {
        return Err(format!("{name} is empty: type a whole number, e.g. 2048"));
    }
    let mut out = Vec::new();
    for p in parts {
        match p.trim().parse::<u32>() {
            Ok(v) => out.push(v),
            Err(_) => {
                return Err(format!(
                    "{name}: '{}' is not a whole number (type e.g. 2048, or 512,2048 for several)",
                    p.trim()
                ));
            }
        }
    }
    if name == "runs" && out.len() > 1 {
        return Err("runs takes one number (measured runs per point)".into());
    }
    Ok(out)
}

impl BenchScreen {
    /// Whether a field is being typed into (it takes every key).
    pub fn captures_keys(&self) -> bool {
        self.editing.is_some()
    }

    /// Whether a benchmark is running.
    pub fn is_running(&self) -> bool {
        self.run.as_ref().is_some_and(BenchRun::is_active)
    }

    /// The `mxtune bench --record` options this form describes, against `url`, saving the
    /// record into `runs_dir`; an error names the field at fault and what to type.
    pub fn args(&self, url: &str, runs_dir: &std::path::Path) -> Result<BenchArgs, String> {
        let mut a = BenchArgs::defaults(url).map_err(|e| format!("{e:#}"))?;
        let field = |i: usize| parse_field(FIELDS[i + 1], &self.values[i]);
        a.pp = field(0)?;
        a.tg = field(1)?;
        a.depth = field(2)?;
        a.concurrency = field(3)?;
        a.runs = field(4)?[0];
        a.level = vec![self.level];
        a.record = true;
        a.runs_dir = runs_dir.to_path_buf();
        a.validate().map_err(|e| format!("{e:#}"))?;
        Ok(a)
    }

    /// Handle a key. `target` is the URL of the running target, if any.
    pub fn on_key(
        &mut self,
        key: KeyEvent,
        target: Option<&str>,
        runs_dir: &std::path::Path,
    ) -> Vec<Effect> {
        if let Some(buf) = self.editing.as_mut() {
            match super::text_key(buf, key, 64) {
                super::TextKey::Cancel => {
                    self.editing = None;
                    self.error = None;
                }
                super::TextKey::Submit => {
                    let i = self.selected - 1;
                    match parse_field(FIELDS[self.selected], buf) {
                        Ok(v) => {
                            self.values[i] = join(&v);
                            self.editing = None;
                            self.error = None;
                        }
                        Err(e) => self.error = Some(e),
                    }
                }
                super::TextKey::Edited | super::TextKey::Other => {}
            }
            return Vec::new();
        }
        if self.is_running() {
            if key.code == KeyCode::Esc {
                if let Some(r) = self.run.as_mut() {
                    r.state = RunState::Cancelling;
                    r.phase = "cancelling: saving the partial record".into();
                }
                return vec![Effect::CancelBench];
            }
            if key.code == KeyCode::Char('r') {
                self.error = Some("a benchmark is running: Esc cancels it".into());
            }
            return Vec::new();
        }
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = (self.selected + 1).min(FIELDS.len() - 1)
            }
            KeyCode::Left if self.selected == 0 => self.cycle_level(LEVELS.len() - 1),
            KeyCode::Right | KeyCode::Enter | KeyCode::Char(' ') if self.selected == 0 => {
                self.cycle_level(1)
            }
            KeyCode::Enter => {
                self.editing = Some(self.values[self.selected - 1].clone());
                self.error = None;
            }
            KeyCode::Char('r') => {
                let Some(url) = target else {
                    self.error = Some(
                        "no target is running: start one on the Launch screen (2, then l), \
                         or attach to a URL there"
                            .into(),
                    );
                    return Vec::new();
                };
                match self.args(url, runs_dir) {
                    Ok(args) => {
                        self.error = None;
                        self.run = Some(BenchRun::new(url, args.runs, args.warmup));
                        return vec![Effect::StartBench(Box::new(args))];
                    }
                    Err(e) => self.error = Some(e),
                }
            }
            _ => {}
        }
        Vec::new()
    }

    fn cycle_level(&mut self, by: usize) {
        let i = LEVELS.iter().position(|l| *l == self.level).unwrap_or(0);
        self.level = LEVELS[(i + by) % LEVELS.len()];
    }
}

fn level_name(l: Level) -> &'static str {
    match l {
        Level::Performance => "performance",
        Level::Correctness => "correctness",
        Level::Stress => "stress",
    }
}

fn pm(theme: &Theme, s: Option<Stats>) -> String {
    let text = match s {
        Some(s) if s.mean >= 1000.0 => format!("{:.0} ±{:.0}", s.mean, s.std),
        Some(s) => format!("{:.1} ±{:.1}", s.mean, s.std),
        None => "-".into(),
    };
    theme.text(&text).into_owned()
}

/// Draw the Bench screen.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    match app.bench.view {
        super::matrix::BenchView::Matrix => return super::matrix::draw_matrix(frame, app, area),
        super::matrix::BenchView::Ab => return super::matrix::draw_ab(frame, app, area),
        super::matrix::BenchView::Form => {}
    }
    let s = &app.bench;
    let theme = &app.theme;
    let [top, bottom] = Layout::vertical([Constraint::Length(8), Constraint::Min(3)]).areas(area);
    let [form_area, state_area] =
        Layout::horizontal([Constraint::Length(34), Constraint::Min(20)]).areas(top);

    // The form.
    let idle = !s.is_running();
    let mut lines = Vec::new();
    for (i, name) in FIELDS.iter().enumerate() {
        let value = if i == 0 {
            level_name(s.level).to_string()
        } else if let (Some(buf), true) = (&s.editing, s.selected == i) {
            format!("{buf}_")
        } else {
            s.values[i - 1].clone()
        };
        let dimmed = i > 0 && s.level != Level::Performance;
        let style = if i == s.selected && idle {
            theme.selected()
        } else if dimmed {
            theme.dim()
        } else {
            ratatui::style::Style::default()
        };
        lines.push(Line::from(vec![
            Span::styled(format!(" {name:<12}"), theme.dim()),
            Span::styled(value, style),
        ]));
    }
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Workload "),
        ),
        form_area,
    );

    // Target, progress, record, error.
    let mut info = Vec::new();
    match app.target_url() {
        Some(url) => info.push(Line::from(vec![
            Span::styled(" target ", theme.dim()),
            Span::styled(theme.text(&url).into_owned(), theme.accent()),
        ])),
        None => info.push(Line::styled(
            " no target running: start one on the Launch screen (2), then r here",
            theme.warn(),
        )),
    }
    if let Some(r) = &s.run {
        let state = match &r.state {
            RunState::Running => Span::styled("running", theme.accent()),
            RunState::Cancelling => Span::styled("cancelling", theme.warn()),
            RunState::Finished { aborted: true, .. } => {
                Span::styled("cancelled (partial record kept)", theme.warn())
            }
            RunState::Finished { passed: true, .. } => Span::styled("finished", theme.good()),
            RunState::Finished { .. } => Span::styled("finished: a level FAILED", theme.error()),
            RunState::Failed(_) => Span::styled("could not run", theme.error()),
        };
        info.push(Line::from(vec![
            Span::styled(" bench  ", theme.dim()),
            state,
        ]));
        let mut progress = String::from(" ");
        let mut what = None;
        if let Some((i, p)) = r.current {
            progress.push_str(&format!("point {}/{}", i + 1, r.points));
            if let Some((b, warmup)) = r.batch() {
                if warmup {
                    progress.push_str(&format!("  warm-up {b}/{}", r.warmup));
                } else {
                    progress.push_str(&format!("  run {b}/{}", r.runs));
                }
            }
            what = Some(format!(" {} c{}", point_label(&p), p.concurrency));
        } else if r.points > 0 {
            progress.push_str(&format!("{}/{} points", r.rows.len(), r.points));
        }
        if r.is_active() || r.current.is_none() {
            progress.push_str(&format!("  {}", r.phase));
        }
        info.push(Line::raw(format!(" {}", progress.trim())));
        if let Some(w) = what {
            info.push(Line::styled(w, theme.dim()));
        }
        if let Some(p) = &r.record {
            info.push(Line::from(vec![
                Span::styled(" record ", theme.dim()),
                Span::raw(theme.text(&p.display().to_string()).into_owned()),
            ]));
        }
        if let RunState::Failed(e) = &r.state {
            info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
        }
    }
    if let Some(e) = &s.error {
        info.push(Line::styled(format!(" {}", theme.text(e)), theme.error()));
    }
    frame.render_widget(
        Paragraph::new(info)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().border_set(theme.border()).title(" Run ")),
        state_area,
    );

    draw_results(frame, app, bottom);
}

fn draw_results(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let wide = area.width >= 120;
    let block = Block::bordered()
        .border_set(theme.border())
        .title(theme.text(" Results (mean ± std) ").into_owned())
        .padding(ratatui::widgets::Padding::horizontal(1));
    let Some(r) = &app.bench.run else {
        frame.render_widget(
            Paragraph::new(
                " r runs the workload against the target and saves a run record (as `mxtune \
                 bench --record`); Esc cancels and keeps what was measured.",
            )
            .wrap(Wrap { trim: true })
            .style(theme.dim())
            .block(block),
            area,
        );
        return;
    };
    let mut header = vec!["point", "c", "pp t/s", "tg t/s", "ttfr ms", "TPOT ms"];
    if wide {
        header.push("e2e_ttft ms");
    }
    header.push("ok/err");
    let rows: Vec<Row> = r
        .rows
        .iter()
        .map(|row| {
            let mut cells = vec![
                Cell::from(format!(
                    "{}{}",
                    point_label(&row.point),
                    if row.partial { " (partial)" } else { "" }
                )),
                Cell::from(row.point.concurrency.to_string()),
                Cell::from(pm(theme, row.pp_tps)),
                Cell::from(pm(theme, row.tg_tps)),
                Cell::from(pm(theme, row.ttfr_ms)),
                Cell::from(pm(theme, row.tpot_ms)),
            ];
            if wide {
                cells.push(Cell::from(pm(theme, row.e2e_ttft_ms)));
            }
            cells.push(Cell::from(format!(
                "{}/{}",
                row.requests.saturating_sub(row.errors),
                row.errors
            )));
            Row::new(cells)
        })
        .collect();
    let mut notes: Vec<Line> = Vec::new();
    for (level, passed, reasons) in &r.levels {
        if *level == Level::Performance && *passed {
            continue;
        }
        let verdict = if *passed { "PASS" } else { "FAIL" };
        let mut text = format!(" {} level: {verdict}", level_name(*level));
        if !reasons.is_empty() {
            text.push_str(&format!(" ({})", reasons.join("; ")));
        }
        let style = if *passed { theme.good() } else { theme.error() };
        notes.push(Line::styled(theme.text(&text).into_owned(), style));
    }
    for w in &r.warnings {
        notes.push(Line::styled(format!(" ! {}", theme.text(w)), theme.warn()));
    }
    // Wide terminals get roomier columns and the e2e_ttft column.
    let (num, short) = if wide { (14, 12) } else { (11, 9) };
    let mut widths = vec![
        if wide {
            Constraint::Length(28)
        } else {
            Constraint::Min(14)
        },
        Constraint::Length(3),
        Constraint::Length(num),
        Constraint::Length(num),
        Constraint::Length(num - 1),
        Constraint::Length(short),
    ];
    if wide {
        widths.push(Constraint::Length(num));
    }
    widths.push(Constraint::Length(6));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let table_h = (rows.len() as u16 + 1).min(inner.height);
    let [table_area, notes_area] =
        Layout::vertical([Constraint::Length(table_h), Constraint::Min(0)]).areas(inner);
    frame.render_widget(
        Table::new(rows, widths).header(Row::new(header).style(theme.accent())),
        table_area,
    );
    frame.render_widget(Paragraph::new(notes).wrap(Wrap { trim: false }), notes_area);
}

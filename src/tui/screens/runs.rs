//! Runs screen: the records of the runs directory, newest first; filter, open one, mark two
//! for an A/B comparison (deltas and noise hint from `record::compare`, the threshold set with
//! `n`), export it as markdown.

use std::path::{Path, PathBuf};

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};

use crate::record::compare::{self, Format};
use crate::record::schema::RunId;
use crate::record::store::{Scan, StoredRun};
use crate::record::{RunRecord, RunStatus};

use super::super::app::{App, Effect};

/// What the Runs screen shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunsView {
    /// The table of runs.
    #[default]
    List,
    /// One run's summary.
    Show {
        /// First line shown.
        scroll: u16,
    },
    /// The comparison of the two marked runs.
    Compare {
        /// First line shown.
        scroll: u16,
    },
}

/// State of the Runs screen.
#[derive(Debug, Clone, Default)]
pub struct RunsScreen {
    /// Readable records, newest first.
    pub runs: Vec<StoredRun>,
    /// Files that could not be read as records.
    pub bad: usize,
    /// Why the directory could not be read.
    pub error: Option<String>,
    /// Selected row (index into the filtered list).
    pub selected: usize,
    /// Filter text (case-insensitive substring of the row).
    pub filter: String,
    /// The filter field is being typed into.
    pub filtering: bool,
    /// Marked runs in marking order; the first is the baseline of a comparison.
    pub marked: Vec<RunId>,
    /// The current view.
    pub view: RunsView,
    /// Why the last key did nothing (for the status line).
    pub notice: Option<String>,
    /// The noise threshold being typed in the comparison (`n`).
    pub noise_edit: Option<String>,
    /// What was wrong with the threshold typed, shown above the comparison.
    pub noise_error: Option<String>,
}

/// The headline number of a record: best mean generation throughput over its points.
pub fn headline_tps(r: &RunRecord) -> Option<f64> {
    r.results
        .iter()
        .filter_map(|p| p.total_tg_tps.or(p.tg_tps).map(|s| s.mean))
        .fold(None, |acc: Option<f64>, x| {
            Some(acc.map_or(x, |a| a.max(x)))
        })
}

fn row_text(r: &RunRecord) -> [String; 6] {
    [
        r.identity.started_at.format("%Y-%m-%d %H:%M").to_string(),
        r.identity.run_id.short(),
        crate::record::cli::status_text(r),
        r.label(),
        r.target.kind_name().to_string(),
        headline_tps(r)
            .map(|t| format!("{t:.1}"))
            .unwrap_or_else(|| "-".into()),
    ]
}

impl RunsScreen {
    /// Whether the filter field takes every key.
    pub fn captures_keys(&self) -> bool {
        self.filtering || self.noise_edit.is_some()
    }

    /// The runs directory was (re)read.
    pub fn on_scan(&mut self, scan: Result<Scan, String>) {
        match scan {
            Ok(s) => {
                self.runs = s.runs;
                self.bad = s.bad.len();
                self.error = None;
                self.marked.retain(|id| s_contains(&self.runs, id));
            }
            Err(e) => self.error = Some(e),
        }
        self.selected = self.selected.min(self.visible().len().saturating_sub(1));
    }

    /// Indices into `runs` that pass the filter.
    pub fn visible(&self) -> Vec<usize> {
        let f = self.filter.to_lowercase();
        self.runs
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                f.is_empty()
                    || row_text(&r.record)
                        .iter()
                        .chain(std::iter::once(&r.record.identity.run_id.to_string()))
                        .any(|c| c.to_lowercase().contains(&f))
            })
            .map(|(i, _)| i)
            .collect()
    }

    fn selected_run(&self) -> Option<&StoredRun> {
        self.visible().get(self.selected).map(|i| &self.runs[*i])
    }

    /// The two marked records, baseline first, when two are marked and still present.
    pub fn marked_pair(&self) -> Option<[RunRecord; 2]> {
        if self.marked.len() != 2 {
            return None;
        }
        let find = |id: &RunId| {
            self.runs
                .iter()
                .find(|r| r.record.identity.run_id == *id)
                .map(|r| r.record.clone())
        };
        Some([find(&self.marked[0])?, find(&self.marked[1])?])
    }

    /// The comparison of the marked pair in `format`, noise hints at `sigmas` std.
    pub fn comparison(&self, format: Format, sigmas: f64) -> Option<String> {
        self.marked_pair()
            .map(|p| compare::render(&p, format, sigmas))
    }

    /// The file an export of the marked pair goes to.
    pub fn export_path(&self, dir: &Path) -> Option<PathBuf> {
        let [a, b] = self.marked_pair()?;
        Some(dir.join(format!(
            "compare-{}-{}.md",
            a.identity.run_id.short(),
            b.identity.run_id.short()
        )))
    }

    fn need_two(&self) -> String {
        format!(
            "{} of 2 runs marked: mark two with m (the first is the baseline A)",
            self.marked.len()
        )
    }

    fn export(&mut self, export_dir: &Path) -> Vec<Effect> {
        match self.export_path(export_dir) {
            Some(p) => vec![Effect::ExportComparison(p)],
            None => {
                self.notice = Some(self.need_two());
                Vec::new()
            }
        }
    }

    /// Handle a key on this screen; `n` in the comparison sets `noise` (the panel's noise
    /// threshold, in standard deviations).
    pub fn on_key(&mut self, key: KeyEvent, export_dir: &Path, noise: &mut f64) -> Vec<Effect> {
        if let Some(buf) = self.noise_edit.as_mut() {
            match super::text_key(buf, key, 8) {
                super::TextKey::Cancel => {
                    self.noise_edit = None;
                    self.noise_error = None;
                }
                super::TextKey::Submit => match compare::parse_noise_sigmas(buf) {
                    Ok(k) => {
                        *noise = k;
                        self.noise_edit = None;
                        self.noise_error = None;
                    }
                    Err(e) => self.noise_error = Some(e),
                },
                super::TextKey::Edited | super::TextKey::Other => {}
            }
            return Vec::new();
        }
        if self.filtering {
            match super::text_key(&mut self.filter, key, usize::MAX) {
                super::TextKey::Cancel => {
                    self.filter.clear();
                    self.filtering = false;
                }
                super::TextKey::Submit => self.filtering = false,
                super::TextKey::Edited | super::TextKey::Other => {}
            }
            self.selected = 0;
            return Vec::new();
        }
        match self.view {
            RunsView::Show { scroll } | RunsView::Compare { scroll } => {
                let next = match key.code {
                    KeyCode::Esc | KeyCode::Enter => None,
                    KeyCode::Up | KeyCode::Char('k') => Some(scroll.saturating_sub(1)),
                    KeyCode::Down | KeyCode::Char('j') => Some(scroll.saturating_add(1)),
                    KeyCode::PageUp => Some(scroll.saturating_sub(10)),
                    KeyCode::PageDown => Some(scroll.saturating_add(10)),
                    KeyCode::Home => Some(0),
                    KeyCode::Char('e') if matches!(self.view, RunsView::Compare { .. }) => {
                        return self.export(export_dir);
                    }
                    KeyCode::Char('n') if matches!(self.view, RunsView::Compare { .. }) => {
                        self.noise_edit = Some(noise.to_string());
                        self.noise_error = None;
                        return Vec::new();
                    }
                    _ => Some(scroll),
                };
                self.view = match (self.view, next) {
                    (_, None) => RunsView::List,
                    (RunsView::Show { .. }, Some(s)) => RunsView::Show { scroll: s },
                    (_, Some(s)) => RunsView::Compare { scroll: s },
                };
                return Vec::new();
            }
            RunsView::List => {}
        }
        let n = self.visible().len();
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = (self.selected + 1).min(n.saturating_sub(1))
            }
            KeyCode::Home => self.selected = 0,
            KeyCode::End => self.selected = n.saturating_sub(1),
            KeyCode::Enter if self.selected_run().is_some() => {
                self.view = RunsView::Show { scroll: 0 };
            }
            KeyCode::Char('m') | KeyCode::Char(' ') => {
                if let Some(id) = self.selected_run().map(|r| r.record.identity.run_id) {
                    if let Some(p) = self.marked.iter().position(|m| *m == id) {
                        self.marked.remove(p);
                    } else {
                        if self.marked.len() == 2 {
                            self.marked.remove(0);
                        }
                        self.marked.push(id);
                    }
                }
            }
            KeyCode::Char('C') if self.marked_pair().is_some() => {
                self.view = RunsView::Compare { scroll: 0 };
            }
            KeyCode::Char('C') => self.notice = Some(self.need_two()),
            KeyCode::Char('e') => return self.export(export_dir),
            KeyCode::Char('/') => {
                self.filtering = true;
            }
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Char('g') => return vec![Effect::ReloadRuns],
            _ => {}
        }
        Vec::new()
    }
}

fn s_contains(runs: &[StoredRun], id: &RunId) -> bool {
    runs.iter().any(|r| r.record.identity.run_id == *id)
}

/// Draw the Runs screen.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    let s = &app.runs;
    let theme = &app.theme;
    match s.view {
        RunsView::Show { scroll } => {
            let text = s
                .selected_run()
                .map(crate::record::cli::render_show)
                .unwrap_or_default();
            let text = theme.text(&text).into_owned();
            frame.render_widget(
                Paragraph::new(text).scroll((scroll, 0)).block(
                    Block::bordered()
                        .border_set(theme.border())
                        .title(" Run (Esc back, Up/Down scroll) "),
                ),
                area,
            );
            return;
        }
        RunsView::Compare { scroll } => {
            let text = s
                .comparison(Format::Text, app.noise_sigmas)
                .unwrap_or_default();
            let text = theme.text(&text).into_owned();
            let block = Block::bordered()
                .border_set(theme.border())
                .title(" Compare A/B (n noise, e export markdown, Esc back) ");
            let inner = block.inner(area);
            frame.render_widget(block, area);
            // An error gets the lines it needs (it names the value and what to type).
            let setting_h = if s.noise_error.is_some() { 3 } else { 1 };
            let [setting_area, text_area] =
                Layout::vertical([Constraint::Length(setting_h), Constraint::Min(1)]).areas(inner);
            let setting = match (&s.noise_edit, &s.noise_error) {
                (Some(buf), Some(e)) => Line::styled(
                    format!("noise threshold {buf}_ std: {}", theme.text(e)),
                    theme.error(),
                ),
                (Some(buf), None) => Line::from(vec![
                    Span::styled("noise threshold ", theme.dim()),
                    Span::styled(format!("{buf}_ std"), theme.accent()),
                    Span::styled("  Enter sets, Esc cancels", theme.dim()),
                ]),
                (None, _) => Line::from(vec![
                    Span::styled("noise threshold ", theme.dim()),
                    Span::styled(compare::sigmas_text(app.noise_sigmas), theme.accent()),
                    Span::styled(" (n changes it)", theme.dim()),
                ]),
            };
            frame.render_widget(
                Paragraph::new(setting).wrap(ratatui::widgets::Wrap { trim: false }),
                setting_area,
            );
            // Wrapped, so the legend and a wide row are never cut at a small terminal's edge.
            frame.render_widget(
                Paragraph::new(text)
                    .wrap(ratatui::widgets::Wrap { trim: false })
                    .scroll((scroll, 0)),
                text_area,
            );
            return;
        }
        RunsView::List => {}
    }
    let [filter_area, table_area] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(3)]).areas(area);
    let mut top = vec![Span::styled(" filter: ", theme.accent())];
    if s.filtering || !s.filter.is_empty() {
        top.push(Span::raw(format!(
            "{}{}",
            s.filter,
            if s.filtering { "_" } else { "" }
        )));
    } else {
        top.push(Span::styled("(/ to filter)", theme.dim()));
    }
    top.push(Span::styled(
        format!(
            "   {} runs in {}{}   marked {}/2",
            s.runs.len(),
            app.paths.runs_dir.display(),
            if s.bad > 0 {
                format!(", {} unreadable", s.bad)
            } else {
                String::new()
            },
            s.marked.len()
        ),
        theme.dim(),
    ));
    frame.render_widget(Paragraph::new(Line::from(top)), filter_area);

    if let Some(e) = &s.error {
        frame.render_widget(
            Paragraph::new(Line::styled(e.clone(), theme.error()))
                .block(Block::bordered().border_set(theme.border()).title(" Runs ")),
            table_area,
        );
        return;
    }
    let visible = s.visible();
    let rows: Vec<Row> = visible
        .iter()
        .map(|i| {
            let r = &s.runs[*i].record;
            let mark = match s.marked.iter().position(|m| *m == r.identity.run_id) {
                Some(0) => "A",
                Some(_) => "B",
                None => " ",
            };
            let [when, id, status, label, kind, tps] = row_text(r);
            let st = match r.identity.status {
                _ if crate::record::cli::interrupted(r) => theme.warn(),
                RunStatus::Completed => theme.good(),
                RunStatus::Failed => theme.error(),
                RunStatus::Aborted => theme.warn(),
                RunStatus::Running => theme.accent(),
            };
            Row::new(vec![
                Cell::from(Span::styled(mark, theme.accent())),
                Cell::from(when),
                Cell::from(id),
                Cell::from(Span::styled(status, st)),
                Cell::from(label),
                Cell::from(kind),
                Cell::from(tps),
            ])
        })
        .collect();
    let empty = rows.is_empty();
    let table = Table::new(
        rows,
        [
            Constraint::Length(1),
            Constraint::Length(16),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Min(12),
            Constraint::Length(6),
            Constraint::Length(8),
        ],
    )
    .header(
        Row::new(["", "started", "id", "status", "preset", "target", "tok/s"])
            .style(theme.accent()),
    )
    .row_highlight_style(theme.selected())
    .block(
        Block::bordered()
            .border_set(theme.border())
            .title(if empty {
                " Runs (none yet: launch and bench to record one) "
            } else {
                " Runs (newest first) "
            }),
    );
    let mut state = TableState::default().with_selected((!empty).then_some(s.selected));
    frame.render_stateful_widget(table, table_area, &mut state);
}

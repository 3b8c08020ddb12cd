//! One module per screen; this file dispatches drawing and builds the status line.

pub mod bench;
pub mod flags;
pub mod launch;
pub mod live;
pub mod matrix;
pub mod runs;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Span;

use super::app::{App, Tab};

/// What a key did in a one-line text field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKey {
    /// Enter: use the text.
    Submit,
    /// Esc: drop the edit.
    Cancel,
    /// The text changed (Backspace, or a character typed).
    Edited,
    /// Anything else (left to the caller, usually ignored).
    Other,
}

/// The editing every one-line field shares: Backspace deletes, a printable character is typed
/// while the text is shorter than `max` characters; Enter and Esc are reported.
pub fn text_key(buf: &mut String, key: crossterm::event::KeyEvent, max: usize) -> TextKey {
    use crossterm::event::KeyCode;
    match key.code {
        KeyCode::Enter => TextKey::Submit,
        KeyCode::Esc => TextKey::Cancel,
        KeyCode::Backspace => {
            buf.pop();
            TextKey::Edited
        }
        KeyCode::Char(c) if !c.is_control() && buf.chars().count() < max => {
            buf.push(c);
            TextKey::Edited
        }
        _ => TextKey::Other,
    }
}

/// Draw the visible screen into `area`.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    match app.tab {
        Tab::Flags => flags::draw(frame, app, area),
        Tab::Runs => runs::draw(frame, app, area),
        Tab::Launch => launch::draw(frame, app, area),
        Tab::Live => live::draw(frame, app, area),
        Tab::Bench => bench::draw(frame, app, area),
    }
}

/// The bindings that work in the screen's current state (for the hint bar).
pub fn bindings(app: &App) -> &'static [super::keys::Binding] {
    match app.tab {
        Tab::Flags if app.flags.overlay.is_some() => super::keys::FLAGS_DIALOG,
        Tab::Flags if app.flags.editing.is_some() => super::keys::FLAGS_EDIT,
        Tab::Runs if app.runs.noise_edit.is_some() => super::keys::VALUE_INPUT,
        Tab::Runs if app.runs.view != runs::RunsView::List => super::keys::RUNS_VIEW,
        Tab::Launch if app.launch.captures_keys() => super::keys::LAUNCH_INPUT,
        Tab::Launch if app.launch.choice == crate::vocab::TargetKind::DockerCluster => {
            super::keys::LAUNCH_CLUSTER
        }
        Tab::Launch if !app.launch.hosts.is_empty() => super::keys::LAUNCH_HOSTS,
        Tab::Live if app.live.hosts.len() > 1 => super::keys::LIVE_HOSTS,
        Tab::Bench if app.bench.view == matrix::BenchView::Matrix => {
            if app.bench.matrix.editing.is_some() {
                super::keys::BENCH_INPUT
            } else if app.bench.matrix.is_running() {
                super::keys::MATRIX_RUNNING
            } else {
                super::keys::MATRIX
            }
        }
        Tab::Bench if app.bench.view == matrix::BenchView::Ab => {
            if app.bench.ab.editing.is_some() {
                super::keys::VALUE_INPUT
            } else if app.bench.ab.is_running() {
                super::keys::AB_RUNNING
            } else {
                super::keys::AB
            }
        }
        Tab::Bench if app.bench.captures_keys() => super::keys::BENCH_INPUT,
        Tab::Bench if app.bench.is_running() => super::keys::BENCH_RUNNING,
        Tab::Bench if app.target_url().is_none() => super::keys::BENCH_NO_TARGET,
        _ => app.tab.bindings(),
    }
}

/// The status line: target, phase, preset, unsaved changes.
pub fn status_spans(app: &App) -> Vec<Span<'static>> {
    let theme = &app.theme;
    let f = &app.flags;
    let target = app.launch.choice.name();
    let mut spans = vec![
        Span::styled(" target ", theme.dim()),
        Span::styled(target.to_string(), theme.accent()),
        Span::styled("  ", theme.dim()),
        Span::styled(app.launch.state.phase_text(), theme.dim()),
        Span::styled("  preset ", theme.dim()),
        Span::styled(
            f.loaded
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_else(|| "(none)".into()),
            theme.accent(),
        ),
    ];
    if f.dirty() {
        spans.push(Span::styled(" [+] unsaved", theme.warn()));
    }
    if let Some(m) = &app.ab_mark {
        spans.push(Span::styled("  A ", theme.dim()));
        spans.push(Span::styled(
            theme.text(&m.label).into_owned(),
            theme.accent(),
        ));
        if *m.flags == f.flags {
            spans.push(Span::styled(" (= now)", theme.dim()));
        }
    }
    spans
}

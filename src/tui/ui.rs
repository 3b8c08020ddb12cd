//! Drawing: a pure function of `App` into a ratatui `Frame`, so every screen renders the same
//! way into a real terminal and into `TestBackend` for snapshot tests.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Tabs, Wrap};

use super::app::{App, QuitPrompt, Tab};
use super::keys::{self, Binding};

/// Smallest terminal the panel draws in; below it says so instead.
pub const MIN_WIDTH: u16 = 80;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u16 = 24;

/// Draw the whole panel.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "terminal too small: {}x{} (mxtune needs at least {MIN_WIDTH}x{MIN_HEIGHT})",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), area);
        return;
    }
    let [tabs_area, body, status_area, hints_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_tabs(frame, app, tabs_area);
    super::screens::draw(frame, app, body);
    draw_status(frame, app, status_area);
    draw_hints(frame, app, hints_area);

    if app.show_help {
        draw_help(frame, app, area);
    }
    if let Some(prompt) = app.quit_prompt {
        draw_quit_prompt(frame, app, prompt, area);
    }
}

fn draw_tabs(frame: &mut Frame, app: &App, area: Rect) {
    let titles: Vec<Line> = Tab::ALL
        .iter()
        .enumerate()
        .map(|(i, t)| Line::from(format!("{} {}", i + 1, t.title())))
        .collect();
    let selected = Tab::ALL.iter().position(|t| *t == app.tab).unwrap_or(0);
    let tabs = Tabs::new(titles)
        .select(selected)
        .highlight_style(app.theme.selected())
        .divider(if app.theme.ascii { "|" } else { "│" });
    let [left, right] =
        Layout::horizontal([Constraint::Min(40), Constraint::Length(14)]).areas(area);
    frame.render_widget(tabs, left);
    frame.render_widget(
        Paragraph::new(Span::styled("mxtune ? help", app.theme.dim())).right_aligned(),
        right,
    );
}

fn draw_status(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let mut spans = super::screens::status_spans(app);
    if let Some(msg) = &app.message {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(msg.clone(), theme.warn()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)).style(theme.dim()), area);
}

fn hint_spans(app: &App, bindings: &[Binding]) -> Vec<Span<'static>> {
    let mut spans = Vec::new();
    for b in bindings {
        spans.push(Span::styled(b.key, app.theme.accent()));
        spans.push(Span::raw(format!(" {}  ", b.action)));
    }
    spans
}

fn hint_width(b: &Binding) -> usize {
    b.key.len() + b.action.len() + 3
}

/// The screen's bindings that fit, in table order, and always `? help` and `q quit`: a hint
/// is dropped whole rather than cut mid-word.
fn draw_hints(frame: &mut Frame, app: &App, area: Rect) {
    let tail = [keys::GLOBAL[2], keys::GLOBAL[3]];
    let mut room = (area.width as usize).saturating_sub(tail.iter().map(hint_width).sum());
    let mut bindings: Vec<Binding> = Vec::new();
    for b in super::screens::bindings(app) {
        if hint_width(b) > room {
            break;
        }
        room -= hint_width(b);
        bindings.push(*b);
    }
    bindings.extend_from_slice(&tail);
    frame.render_widget(Paragraph::new(Line::from(hint_spans(app, &bindings))), area);
}

/// A rectangle of the given size centred in `area`, clipped to it.
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn draw_help(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let row = |b: &Binding| {
        Line::from(vec![
            Span::styled(format!("  {:<18}", b.key), theme.accent()),
            Span::raw(b.action),
        ])
    };
    let mut lines = Vec::new();
    for (title, bindings) in keys::SECTIONS {
        if !lines.is_empty() {
            lines.push(Line::raw(""));
        }
        lines.push(Line::styled(*title, theme.accent()));
        lines.extend(bindings.iter().map(row));
    }
    let popup = centered(area, 64, area.height.saturating_sub(2));
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Keys (any key closes) "),
        ),
        popup,
    );
}

fn draw_quit_prompt(frame: &mut Frame, app: &App, prompt: QuitPrompt, area: Rect) {
    let text = match prompt {
        QuitPrompt::TargetRunning => {
            "A target started from this panel is still running.\n\n\
             s  stop it, then quit\n\
             l  leave it running and quit (re-attach later)\n\
             Esc  stay"
        }
    };
    let popup = centered(area, 60, 8);
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(text).block(
            Block::bordered()
                .border_set(app.theme.border())
                .border_style(app.theme.warn())
                .title(" Quit? "),
        ),
        popup,
    );
}

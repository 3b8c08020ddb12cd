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
        Layout::horizontal([Constraint::Min(40), Constraint::Length(12)]).areas(area);
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

fn draw_hints(frame: &mut Frame, app: &App, area: Rect) {
    let mut bindings: Vec<Binding> = app.tab.bindings().to_vec();
    bindings.extend_from_slice(&[keys::GLOBAL[2], keys::GLOBAL[3]]);
    frame.render_widget(Paragraph::new(Line::from(hint_spans(app, &bindings))), area);
}

/// A rectangle of the given size centred in `area`, clipped to it.
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(area.x + (area.width - w) / 2, area.y + (area.height - h) / 2, w, h)
}

fn draw_help(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let mut lines = vec![Line::styled("Everywhere", theme.accent())];
    let row = |b: &Binding| {
        Line::from(vec![
            Span::styled(format!("  {:<18}", b.key), theme.accent()),
            Span::raw(b.action),
        ])
    };
    lines.extend(keys::GLOBAL.iter().map(row));
    for tab in Tab::ALL {
        lines.push(Line::raw(""));
        lines.push(Line::styled(tab.title(), theme.accent()));
        lines.extend(tab.bindings().iter().map(row));
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

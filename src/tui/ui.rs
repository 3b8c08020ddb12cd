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
    let status = status_paragraph(app);
    // A long message (the answer to the last key) wraps onto up to three rows.
    let status_h = (status.line_count(area.width) as u16).clamp(1, MAX_STATUS_ROWS);
    let [tabs_area, body, status_area, hints_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(status_h),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_tabs(frame, app, tabs_area);
    super::screens::draw(frame, app, body);
    frame.render_widget(status, status_area);
    draw_hints(frame, app, hints_area);

    if app.show_help {
        draw_help(frame, app, area);
    }
    if let Some(prompt) = app.quit_prompt {
        draw_quit_prompt(frame, app, prompt, area);
    }
}

fn tab_label(i: usize, t: Tab) -> String {
    format!("{} {}", i + 1, t.title())
}

/// The tab whose title is drawn at column `x` of the top row (for mouse clicks): each title
/// has one column of padding either side and a one-column divider after it.
pub fn tab_at(x: u16) -> Option<Tab> {
    let mut left = 0usize;
    for (i, t) in Tab::ALL.iter().enumerate() {
        let right = left + tab_label(i, *t).chars().count() + 2;
        if usize::from(x) >= left && usize::from(x) < right {
            return Some(*t);
        }
        left = right + 1;
    }
    None
}

fn draw_tabs(frame: &mut Frame, app: &App, area: Rect) {
    let titles: Vec<Line> = Tab::ALL
        .iter()
        .enumerate()
        .map(|(i, t)| Line::from(tab_label(i, *t)))
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

/// Rows the status line may take when a message does not fit on one.
pub const MAX_STATUS_ROWS: u16 = 3;

/// The status line, wrapped: the message (the answer to the last key) first, so a narrow
/// terminal still shows it, then target, phase and preset.
fn status_paragraph(app: &App) -> Paragraph<'static> {
    let theme = &app.theme;
    let mut spans = Vec::new();
    if let Some(msg) = &app.message {
        spans.push(Span::styled(format!(" {msg} "), theme.warn()));
    }
    spans.extend(super::screens::status_spans(app));
    Paragraph::new(Line::from(spans))
        .style(theme.dim())
        .wrap(Wrap { trim: false })
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

/// Words of `text` in lines of at most `width` characters (a longer word is cut into pieces).
pub fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > width {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            lines.push(word.drain(..width).collect());
        }
        let len = line.chars().count();
        if !line.is_empty() && len + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.extend(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// Width of the help overlay's key column (two spaces of indent included).
const HELP_KEY_COLUMN: usize = 20;

/// The help overlay's lines at `width` columns: the global keys, then the visible screen's
/// sections, then the rest, so what applies here is on the first page of a small terminal.
/// An action too long for the width wraps under itself, a section title under itself.
pub fn help_lines(app: &App, width: u16) -> Vec<Line<'static>> {
    let width = usize::from(width);
    let theme = &app.theme;
    let here = |title: &str| title.starts_with(app.tab.title());
    // Without a hosts file the panel has no `h`, so its help does not mention one; nor does
    // Live's `h` show while the running target is on one host.
    let shown = |title: &str| {
        (title != keys::HOSTS_SECTION || !app.launch.hosts.is_empty())
            && (title != keys::LIVE_HOSTS_SECTION || app.live.hosts.len() > 1)
            && (title != keys::CLUSTER_SECTION
                || app.launch.choice == crate::vocab::TargetKind::DockerCluster)
    };
    let order = keys::SECTIONS
        .iter()
        .filter(|(t, _)| shown(t))
        .filter(|(t, _)| *t == keys::SECTIONS[0].0)
        .chain(
            keys::SECTIONS
                .iter()
                .skip(1)
                .filter(|(t, _)| shown(t) && here(t)),
        )
        .chain(
            keys::SECTIONS
                .iter()
                .skip(1)
                .filter(|(t, _)| shown(t) && !here(t)),
        );
    let mut lines = Vec::new();
    for (title, bindings) in order {
        if !lines.is_empty() {
            lines.push(Line::raw(""));
        }
        lines.extend(
            wrap_words(title, width)
                .into_iter()
                .map(|t| Line::styled(t, theme.accent())),
        );
        for b in bindings.iter() {
            let key = format!("  {:<w$}", b.key, w = HELP_KEY_COLUMN - 2);
            let key_w = key.chars().count();
            let action = wrap_words(b.action, width.saturating_sub(key_w).max(8));
            for (i, part) in action.into_iter().enumerate() {
                let lead = if i == 0 {
                    Span::styled(key.clone(), theme.accent())
                } else {
                    Span::raw(" ".repeat(key_w))
                };
                lines.push(Line::from(vec![lead, Span::raw(part)]));
            }
        }
    }
    lines
}

fn draw_help(frame: &mut Frame, app: &App, area: Rect) {
    let theme = &app.theme;
    let popup = centered(area, 64, area.height.saturating_sub(2));
    let lines = help_lines(app, popup.width.saturating_sub(2));
    let visible = popup.height.saturating_sub(2) as usize;
    let max = lines.len().saturating_sub(visible);
    app.help_max.set(u16::try_from(max).unwrap_or(u16::MAX));
    let top = usize::from(app.help_scroll).min(max);
    let more = lines.len() > top + visible;
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).scroll((top as u16, 0)).block(
            Block::bordered()
                .border_set(theme.border())
                .title(" Keys (Up/Down/PgUp/PgDn scroll; any other key closes) ")
                .title_bottom(if more { " more below " } else { "" }),
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
        Paragraph::new(text).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .border_set(app.theme.border())
                .border_style(app.theme.warn())
                .title(" Quit? "),
        ),
        popup,
    );
}

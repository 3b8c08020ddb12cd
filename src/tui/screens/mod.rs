//! One module per screen; this file dispatches drawing and builds the status line.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Span;
use ratatui::widgets::{Block, Paragraph};

use super::app::App;

/// Draw the visible screen into `area`.
pub fn draw(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::bordered()
        .border_set(app.theme.border())
        .title(format!(" {} ", app.tab.title()));
    frame.render_widget(Paragraph::new("").block(block), area);
}

/// The status line: target, phase, preset, unsaved changes.
pub fn status_spans(app: &App) -> Vec<Span<'static>> {
    vec![Span::styled(" no target", app.theme.dim())]
}

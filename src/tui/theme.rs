//! Colours and glyphs: indexed/named colours only, `NO_COLOR` honoured, an ASCII-only mode.

use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::border;

/// How the panel draws: colours on or off, Unicode or ASCII glyphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    /// Draw with colours (false when `NO_COLOR` is set or `--no-color` is given).
    pub color: bool,
    /// Use only ASCII glyphs (borders, chart markers, arrows) for poor terminals.
    pub ascii: bool,
}

/// Borders drawn with plain ASCII characters.
pub const ASCII_BORDER: border::Set<'static> = border::Set {
    top_left: "+",
    top_right: "+",
    bottom_left: "+",
    bottom_right: "+",
    vertical_left: "|",
    vertical_right: "|",
    horizontal_top: "-",
    horizontal_bottom: "-",
};

impl Theme {
    /// The theme for this process: colour unless `NO_COLOR` is set (any value, per no-color.org).
    pub fn from_env(ascii: bool, no_color_flag: bool) -> Self {
        let no_color = no_color_flag || std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme {
            color: !no_color,
            ascii,
        }
    }

    /// A style with foreground `c`, or plain when colours are off.
    pub fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    /// Emphasis that survives without colour (bold / reversed).
    pub fn selected(&self) -> Style {
        if self.color {
            Style::default()
                .bg(Color::Blue)
                .fg(Color::White)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }

    /// Titles and active tab.
    pub fn accent(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    /// Secondary text (docs, defaults, hints).
    pub fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }

    /// Something is wrong but not fatal.
    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// Errors, blocked launches, throttling.
    pub fn error(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// Good news: ready, valid, passed.
    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }

    /// Text from the core (docs, rule messages, record summaries) as this terminal can show
    /// it: unchanged with Unicode, with common symbols spelled out in ASCII mode.
    pub fn text<'a>(&self, s: &'a str) -> std::borrow::Cow<'a, str> {
        if !self.ascii || s.is_ascii() {
            return std::borrow::Cow::Borrowed(s);
        }
        let mut out = String::with_capacity(s.len());
        for c in s.chars() {
            match c {
                '→' => out.push_str("->"),
                '←' => out.push_str("<-"),
                '…' => out.push_str("..."),
                '±' => out.push_str("+-"),
                '×' => out.push('x'),
                '≤' => out.push_str("<="),
                '≥' => out.push_str(">="),
                '≈' => out.push('~'),
                '−' | '–' | '—' => out.push('-'),
                '‘' | '’' => out.push('\''),
                '“' | '”' => out.push('"'),
                '·' | '•' => out.push('*'),
                'µ' | 'μ' => out.push('u'),
                c if c.is_ascii() => out.push(c),
                _ => out.push('?'),
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// The border glyph set for blocks.
    pub fn border(&self) -> border::Set<'static> {
        if self.ascii {
            ASCII_BORDER
        } else {
            border::ROUNDED
        }
    }

    /// Marker for line charts.
    pub fn marker(&self) -> ratatui::symbols::Marker {
        if self.ascii {
            ratatui::symbols::Marker::Custom('*')
        } else {
            ratatui::symbols::Marker::Braille
        }
    }
}

//! Panel state and key handling. Pure: no I/O happens here. Keys and background events go
//! in, state changes and `Effect`s come out; the runtime (`tui::run`) performs the effects.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::keys::{self, Binding};
use super::theme::Theme;

/// The five screens, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    Flags,
    Launch,
    Live,
    Bench,
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
    Quit { stop_target: bool },
}

/// Everything the panel shows.
#[derive(Debug)]
pub struct App {
    /// The visible screen.
    pub tab: Tab,
    /// The `?` overlay is open.
    pub show_help: bool,
    /// A question is open before quitting.
    pub quit_prompt: Option<QuitPrompt>,
    /// Colours and glyphs.
    pub theme: Theme,
    /// Whether a target launched from this panel is running (asked about on quit).
    pub target_running: bool,
    /// One-line message shown in the status line until the next key press.
    pub message: Option<String>,
}

impl App {
    /// A fresh panel on the Flags screen.
    pub fn new(theme: Theme) -> Self {
        App {
            tab: Tab::Flags,
            show_help: false,
            quit_prompt: None,
            theme,
            target_running: false,
            message: None,
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
            // Any key closes help; it never acts on the screen below.
            self.show_help = false;
            return Vec::new();
        }
        match key.code {
            KeyCode::Char('?') => {
                self.show_help = true;
                Vec::new()
            }
            KeyCode::Char('q') => self.request_quit(),
            KeyCode::Tab => {
                self.tab = Tab::ALL[(self.tab.index() + 1) % Tab::ALL.len()];
                Vec::new()
            }
            KeyCode::BackTab => {
                self.tab = Tab::ALL[(self.tab.index() + Tab::ALL.len() - 1) % Tab::ALL.len()];
                Vec::new()
            }
            KeyCode::Char(c @ '1'..='5') => {
                self.tab = Tab::ALL[(c as usize) - ('1' as usize)];
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// How often to redraw without input: only while a live view is on screen.
    pub fn tick_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// A signal is ending the panel: save what must not be lost.
    pub fn on_signal(&mut self, _sig: i32) {}

    /// The operator quit; stop the target first when asked.
    pub fn on_quit(&mut self, _stop_target: bool) {}

    fn request_quit(&mut self) -> Vec<Effect> {
        if self.target_running {
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

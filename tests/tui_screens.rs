//! Snapshot and state tests of the panel, drawn into ratatui's `TestBackend`.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use mxtune::tui::app::{App, Effect, QuitPrompt, Tab};
use mxtune::tui::theme::Theme;
use mxtune::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn theme() -> Theme {
    Theme { color: false, ascii: false }
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().to_string()
}

fn key(app: &mut App, code: KeyCode) -> Vec<Effect> {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE))
}

#[test]
fn tabs_switch_by_number_and_tab_keys() {
    let mut app = App::new(theme());
    assert_eq!(app.tab, Tab::Flags);
    key(&mut app, KeyCode::Char('4'));
    assert_eq!(app.tab, Tab::Bench);
    key(&mut app, KeyCode::Tab);
    assert_eq!(app.tab, Tab::Runs);
    key(&mut app, KeyCode::Tab);
    assert_eq!(app.tab, Tab::Flags, "Tab wraps around");
    key(&mut app, KeyCode::BackTab);
    assert_eq!(app.tab, Tab::Runs);
}

#[test]
fn help_overlay_opens_and_any_key_closes_without_acting() {
    let mut app = App::new(theme());
    key(&mut app, KeyCode::Char('?'));
    assert!(app.show_help);
    let screen = render(&app, 80, 24);
    assert!(screen.contains("Keys (any key closes)"), "{screen}");
    let effects = key(&mut app, KeyCode::Char('q'));
    assert!(effects.is_empty(), "q while help is open only closes help");
    assert!(!app.show_help);
}

#[test]
fn quit_asks_when_a_target_runs() {
    let mut app = App::new(theme());
    assert_eq!(key(&mut app, KeyCode::Char('q')), vec![Effect::Quit { stop_target: false }]);

    let mut app = App::new(theme());
    app.target_running = true;
    assert!(key(&mut app, KeyCode::Char('q')).is_empty());
    assert_eq!(app.quit_prompt, Some(QuitPrompt::TargetRunning));
    assert!(render(&app, 80, 24).contains("still running"));
    assert!(key(&mut app, KeyCode::Esc).is_empty());
    assert_eq!(app.quit_prompt, None);
    key(&mut app, KeyCode::Char('q'));
    assert_eq!(key(&mut app, KeyCode::Char('s')), vec![Effect::Quit { stop_target: true }]);
}

#[test]
fn too_small_terminal_says_so() {
    let app = App::new(theme());
    let screen = render(&app, 60, 20);
    assert!(screen.contains("terminal too small: 60x20"), "{screen}");
}

#[test]
fn ascii_mode_draws_only_ascii() {
    let app = App::new(Theme { color: false, ascii: true });
    for (w, h) in [(80, 24), (160, 48)] {
        let screen = render(&app, w, h);
        assert!(screen.is_ascii(), "non-ASCII glyph in ASCII mode:\n{screen}");
    }
}

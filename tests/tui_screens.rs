//! Snapshot and state tests of the panel, drawn into ratatui's `TestBackend`.

use std::path::{Path, PathBuf};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use mxtune::flags::preset::PresetStore;
use mxtune::record::schema::{PointResult, RunId, Stats, WorkloadPoint};
use mxtune::record::store::{Scan, StoredRun};
use mxtune::record::{RunRecord, RunStatus, RunStore};
use mxtune::tui::app::{App, Effect, Paths, QuitPrompt, Tab};
use mxtune::tui::background::{Background, LaunchMsg};
use mxtune::tui::screens::bench::{BenchRun, ResultRow, RunState};
use mxtune::tui::screens::flags::Overlay;
use mxtune::tui::screens::launch::TargetState;
use mxtune::tui::screens::runs::RunsView;
use mxtune::tui::theme::Theme;
use mxtune::tui::{Event, Exit, perform, step, ui};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::cell::RefCell;
use std::sync::mpsc::Receiver;

#[path = "support/vllm_double.rs"]
mod vllm_double;

#[path = "support/loading_double.rs"]
mod loading_double;

fn theme() -> Theme {
    Theme {
        color: false,
        ascii: false,
    }
}

fn repo_presets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("presets")
}

/// Paths with saves going to `scratch` (searched first) and the project presets behind it.
fn paths(scratch: &Path) -> Paths {
    Paths {
        presets: PresetStore::new(vec![scratch.join("presets"), repo_presets()]),
        save_dir: scratch.join("presets"),
        runs_dir: scratch.join("runs"),
        export_dir: scratch.to_path_buf(),
    }
}

thread_local! {
    /// Each test (thread) gets its own background runtime and event channel.
    static BG: RefCell<Option<(Background, Receiver<Event>)>> = const { RefCell::new(None) };
}

fn with_bg<T>(f: impl FnOnce(&mut Background, &Receiver<Event>) -> T) -> T {
    BG.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (bg, rx) = cell.get_or_insert_with(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            (Background::new(tx).unwrap(), rx)
        });
        f(bg, rx)
    })
}

fn run_effect(app: &mut App, e: Effect) -> Option<Exit> {
    with_bg(|bg, _| perform(app, bg, e))
}

/// Feed background events into the panel until `done` holds (a behavioural wait).
fn pump_until(app: &mut App, what: &str, done: impl Fn(&App) -> bool) {
    let start = std::time::Instant::now();
    while !done(app) {
        let ev = with_bg(|_, rx| rx.recv_timeout(std::time::Duration::from_millis(200)));
        if let Ok(ev) = ev {
            with_bg(|bg, _| step(app, bg, ev));
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "never reached: {what}; state {:?}",
            app.launch.state
        );
    }
}

/// A panel started the way `tui::run` starts it, on fixed paths.
fn started(scratch: &Path, theme: Theme) -> App {
    let mut app = App::new(theme, paths(scratch));
    for e in app.startup_effects() {
        run_effect(&mut app, e);
    }
    app
}

/// A panel whose paths print the same in every snapshot.
fn snapshot_app(theme: Theme) -> App {
    let mut app = App::new(
        theme,
        Paths {
            presets: PresetStore::new(vec![repo_presets()]),
            save_dir: PathBuf::from("presets"),
            runs_dir: PathBuf::from("runs"),
            export_dir: PathBuf::from("."),
        },
    );
    run_effect(&mut app, Effect::LoadPreset("engine-cpu-tiny".into()));
    app
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().to_string()
}

fn key(app: &mut App, code: KeyCode) -> Option<Exit> {
    let ev = Event::Term(crossterm::event::Event::Key(KeyEvent::new(
        code,
        KeyModifiers::NONE,
    )));
    with_bg(|bg, _| step(app, bg, ev)).0
}

fn type_str(app: &mut App, s: &str) {
    for c in s.chars() {
        key(app, KeyCode::Char(c));
    }
}

/// A finished record with one point at `tps` ± `std` tok/s, started at a fixed time.
fn record(ulid: &str, preset: &str, minute: u32, tps: f64, std: f64) -> RunRecord {
    use chrono::TimeZone;
    let mut r = RunRecord::new(mxtune::vocab::TargetKind::Engine, Some(preset.into()));
    r.identity.run_id = RunId(ulid.parse().unwrap());
    let at = chrono::Utc
        .with_ymd_and_hms(2026, 11, 20, 10, minute, 0)
        .unwrap();
    r.identity.started_at = at;
    r.identity.updated_at = at;
    r.identity.ended_at = Some(at);
    r.identity.status = RunStatus::Completed;
    r.identity.mxtune_git_sha = None;
    r.identity.pid = None;
    r.identity.mxtune_version = "0.1.0".into();
    r.environment = Default::default();
    r.results = vec![PointResult {
        point: WorkloadPoint {
            pp: 512,
            tg: 128,
            depth: 0,
            concurrency: 1,
        },
        tg_tps: Some(Stats {
            n: 5,
            mean: tps,
            std,
            min: tps - std,
            max: tps + std,
        }),
        requests: 5,
        ..PointResult::default()
    }];
    r
}

fn fixed_runs() -> Scan {
    let runs = vec![
        record("01JD0000000000000000000002", "engine-q8", 30, 131.0, 1.5),
        record(
            "01JD0000000000000000000001",
            "engine-cpu-tiny",
            10,
            120.0,
            1.0,
        ),
    ];
    Scan {
        runs: runs
            .into_iter()
            .map(|record| StoredRun {
                path: PathBuf::from(format!("runs/{}.json", record.identity.run_id.short())),
                record,
            })
            .collect(),
        ..Scan::default()
    }
}

#[test]
fn tabs_switch_by_number_and_tab_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
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
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('?'));
    assert!(app.show_help);
    let screen = render(&app, 80, 24);
    assert!(screen.contains("any other key closes"), "{screen}");
    assert_eq!(
        key(&mut app, KeyCode::Char('q')),
        None,
        "q while help is open only closes help"
    );
    assert!(!app.show_help);
}

#[test]
fn help_puts_this_screen_first_and_scrolls_to_every_binding() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('5'));
    key(&mut app, KeyCode::Char('?'));
    let first = render(&app, 80, 24);
    // On Runs, the Runs sections come right after the global keys.
    assert!(
        first.contains("Runs: run or comparison open") && first.contains("more below"),
        "{first}"
    );
    // The help is longer than 24 rows: scrolling reaches its last binding, and scroll keys
    // do not close it.
    // The help's last binding: the last section that is not the Runs screen's own.
    let live = mxtune::tui::keys::SECTIONS
        .iter()
        .rev()
        .find(|(t, _)| !t.starts_with("Runs"))
        .and_then(|(_, b)| b.last())
        .unwrap()
        .action;
    assert!(!first.contains(live), "{first}");
    for _ in 0..40 {
        key(&mut app, KeyCode::PageDown);
    }
    assert!(app.show_help, "PgDn scrolls, it does not close");
    let end = render(&app, 80, 24);
    assert!(end.contains(live), "{end}");
    assert!(!end.contains("more below"), "{end}");
    key(&mut app, KeyCode::Up);
    assert!(
        render(&app, 80, 24).contains("more below"),
        "one Up from the end scrolls back at once"
    );
    key(&mut app, KeyCode::Home);
    assert!(render(&app, 80, 24).contains("Runs: run or comparison open"));
    key(&mut app, KeyCode::Esc);
    assert!(!app.show_help);
}

#[test]
fn without_colour_nothing_is_coloured() {
    // What NO_COLOR (or --no-color) selects: no cell anywhere gets a colour, on any screen.
    let mut app = snapshot_app(theme());
    app.runs.on_scan(Ok(fixed_runs()));
    fixed_launch(&mut app);
    for t in 0..100 {
        app.live.push(sample(t, t == 99));
    }
    app.flags.flags.set_axis("sinks", "off").unwrap();
    for tab in ['1', '2', '3', '4', '5'] {
        key(&mut app, KeyCode::Char(tab));
        let mut terminal = Terminal::new(TestBackend::new(160, 48)).unwrap();
        terminal.draw(|f| ui::draw(f, &app)).unwrap();
        for cell in terminal.backend().buffer().content() {
            assert!(
                cell.fg == ratatui::style::Color::Reset && cell.bg == ratatui::style::Color::Reset,
                "coloured cell {cell:?} on tab {tab}"
            );
        }
    }
    assert!(
        !Theme::from_env(false, true).color,
        "--no-color turns colour off"
    );
}

#[test]
fn mouse_wheel_scrolls_and_a_click_on_a_tab_switches() {
    use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    let mouse = |kind, column, row| {
        Event::Term(crossterm::event::Event::Mouse(MouseEvent {
            kind,
            column,
            row,
            modifiers: KeyModifiers::NONE,
        }))
    };
    assert_eq!(app.flags.selected, 0);
    with_bg(|bg, _| step(&mut app, bg, mouse(MouseEventKind::ScrollDown, 10, 10)));
    with_bg(|bg, _| step(&mut app, bg, mouse(MouseEventKind::ScrollDown, 10, 10)));
    with_bg(|bg, _| step(&mut app, bg, mouse(MouseEventKind::ScrollUp, 10, 10)));
    assert_eq!(app.flags.selected, 1, "the wheel moves like Down/Up");
    // Click where the screen shows each tab's title.
    let top = render(&app, 80, 24).lines().next().unwrap().to_string();
    for (i, tab) in Tab::ALL.iter().enumerate() {
        let label = format!("{} {}", i + 1, tab.title());
        let col = top
            .find(&label)
            .unwrap_or_else(|| panic!("{label} in {top}"));
        let col = top[..col].chars().count() as u16 - 1; // counted from the opening quote
        with_bg(|bg, _| {
            step(
                &mut app,
                bg,
                mouse(MouseEventKind::Down(MouseButton::Left), col + 2, 0),
            )
        });
        assert_eq!(app.tab, *tab, "click on {label}");
    }
}

#[test]
fn quit_asks_when_a_target_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    assert_eq!(key(&mut app, KeyCode::Char('q')), Some(Exit::Quit));

    let mut app = started(dir.path(), theme());
    app.launch.state = TargetState::Starting(mxtune::launch::Phase::LoadingWeights);
    assert_eq!(key(&mut app, KeyCode::Char('q')), None);
    assert_eq!(app.quit_prompt, Some(QuitPrompt::TargetRunning));
    assert!(render(&app, 80, 24).contains("still running"));
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    assert_eq!(app.quit_prompt, None);
    key(&mut app, KeyCode::Char('q'));
    assert_eq!(
        app.on_key(KeyEvent::new(KeyCode::Char('s'), KeyModifiers::NONE)),
        vec![Effect::Quit { stop_target: true }]
    );
}

#[test]
fn too_small_terminal_says_so() {
    let app = snapshot_app(theme());
    let screen = render(&app, 60, 20);
    assert!(screen.contains("terminal too small: 60x20"), "{screen}");
}

#[test]
fn ascii_mode_draws_only_ascii() {
    let mut app = snapshot_app(Theme {
        color: false,
        ascii: true,
    });
    app.runs.on_scan(Ok(fixed_runs()));
    fixed_launch(&mut app);
    for t in 0..100 {
        app.live.push(sample(t, t == 99));
    }
    for tab in ['1', '2', '3', '4', '5'] {
        key(&mut app, KeyCode::Char(tab));
        for (w, h) in [(80, 24), (160, 48)] {
            let screen = render(&app, w, h);
            assert!(
                screen.is_ascii(),
                "non-ASCII glyph in ASCII mode:\n{screen}"
            );
        }
    }
    key(&mut app, KeyCode::Char('1'));
    insta::assert_snapshot!("flags_ascii_80x24", render(&app, 80, 24));
}

// ---- Flags ----

#[test]
fn fresh_panel_loads_the_cpu_engine_preset() {
    let dir = tempfile::tempdir().unwrap();
    let app = started(dir.path(), theme());
    let loaded = app.flags.loaded.as_ref().expect("default preset loaded");
    assert_eq!(loaded.name, "engine-cpu-tiny");
    assert_eq!(app.flags.flags.axis_value("device"), Some("cpu"));
    assert!(!app.flags.dirty());
    let screen = render(&app, 80, 24);
    assert!(screen.contains("preset engine-cpu-tiny"), "{screen}");
    assert!(!screen.contains("unsaved"), "{screen}");
}

#[test]
fn toggling_a_flag_marks_unsaved_and_reset_restores() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    let before = app.flags.flags.axes.moe_backend;
    key(&mut app, KeyCode::Enter); // row 0: moe_backend
    assert_ne!(
        app.flags.flags.axes.moe_backend, before,
        "Enter cycles the value"
    );
    assert!(app.flags.dirty());
    assert!(render(&app, 80, 24).contains("[+] unsaved"));
    key(&mut app, KeyCode::Left);
    assert_eq!(app.flags.flags.axes.moe_backend, before, "Left steps back");
    key(&mut app, KeyCode::Right);
    key(&mut app, KeyCode::Char('r'));
    assert_eq!(
        app.flags.flags.axis_value("moe_backend"),
        Some("auto"),
        "r resets to the default"
    );

    // Serving limits: down past the axes to max_num_seqs, cycle, reset to the target default.
    let axes = mxtune::flags::axes::all_axes().len();
    for _ in 0..axes + 1 {
        key(&mut app, KeyCode::Down);
    }
    let seqs = app.flags.flags.serving.max_num_seqs;
    key(&mut app, KeyCode::Right);
    assert_ne!(app.flags.flags.serving.max_num_seqs, seqs);
    key(&mut app, KeyCode::Char('r'));
    assert_eq!(app.flags.flags.serving.max_num_seqs, None);
    key(&mut app, KeyCode::Char('R'));
    assert!(!app.flags.dirty(), "R restores the loaded preset");
}

/// Selects the serving-limit row `key` on the Flags screen.
fn select_limit(app: &mut App, key_name: &str) {
    key(app, KeyCode::Home);
    let rows = mxtune::tui::screens::flags::rows();
    let at = rows
        .iter()
        .position(|r| match r {
            mxtune::tui::screens::flags::RowKind::Limit(l) => l.setting().key == key_name,
            _ => false,
        })
        .unwrap_or_else(|| panic!("no row {key_name}"));
    for _ in 0..at {
        key(app, KeyCode::Down);
    }
}

#[test]
fn serving_limits_take_typed_values_checked_against_their_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    select_limit(&mut app, "max_model_len");
    let before = app.flags.flags.serving.max_model_len;
    key(&mut app, KeyCode::Enter);
    assert!(app.flags.editing.is_some(), "Enter opens the editor");
    assert!(app.flags.captures_keys());
    // The field starts with the current value; replace it with a value no candidate has.
    for _ in 0..12 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "12345");
    assert_eq!(app.tab, Tab::Flags, "digits are typed, not tab switches");
    let screen = render(&app, 80, 24);
    assert!(screen.contains("[12345_]"), "{screen}");
    assert!(screen.contains("Enter sets, Esc cancels"), "{screen}");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.flags.editing, None);
    assert_eq!(app.flags.flags.serving.max_model_len, Some(12345));
    assert!(app.flags.dirty());
    let cmd = mxtune::tui::screens::flags::command_lines(&app.flags.flags).join("\n");
    assert!(cmd.contains("--max-model-len 12345"), "{cmd}");

    // 0 is outside the range: an inline error naming it, the old value stays.
    key(&mut app, KeyCode::Enter);
    for _ in 0..5 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "0");
    key(&mut app, KeyCode::Enter);
    let err = app.flags.editing.as_ref().and_then(|e| e.error.clone());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("max_model_len") && e.contains("from 1 to 4294967295")),
        "{err:?}"
    );
    assert!(render(&app, 80, 24).contains("from 1 to 4294967295"));
    assert_eq!(app.flags.flags.serving.max_model_len, Some(12345));
    // Too large for the flag set's type: refused the same way.
    type_str(&mut app, "99999999999");
    key(&mut app, KeyCode::Enter);
    assert!(app.flags.editing.as_ref().unwrap().error.is_some());
    // Esc cancels and keeps the old value.
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.flags.editing, None);
    assert_eq!(app.flags.flags.serving.max_model_len, Some(12345));
    // An empty field means the target's own default.
    key(&mut app, KeyCode::Enter);
    for _ in 0..5 {
        key(&mut app, KeyCode::Backspace);
    }
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.flags.flags.serving.max_model_len, None);
    // Left/Right still step through the candidates.
    key(&mut app, KeyCode::Right);
    assert_eq!(app.flags.flags.serving.max_model_len, Some(1024));
    app.flags.flags.serving.max_model_len = before;

    // The memory fraction: (0, 1], the range flags::render enforces.
    select_limit(&mut app, "gpu_memory_utilization");
    key(&mut app, KeyCode::Enter);
    for _ in 0..8 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "1.5");
    key(&mut app, KeyCode::Enter);
    let err = app.flags.editing.as_ref().and_then(|e| e.error.clone());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("(0, 1]")),
        "{err:?}"
    );
    let mut rejected = app.flags.flags.clone();
    rejected.serving.gpu_memory_utilization = Some(1.5);
    assert!(
        mxtune::flags::render(&rejected, mxtune::vocab::TargetKind::Docker).is_err(),
        "the flags module refuses what the editor refuses"
    );
    type_str(&mut app, "x");
    assert!(
        app.flags.editing.as_ref().unwrap().error.is_some(),
        "letters are refused"
    );
    for _ in 0..3 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "0.77");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.flags.editing, None);
    assert_eq!(app.flags.flags.serving.gpu_memory_utilization, Some(0.77));
    // The engine preset's sinks = "on" is the fork's switch: render it for the fork's image.
    let mut accepted = app.flags.flags.clone();
    accepted.container.vllm = mxtune::flags::VllmFlavor::Fork;
    assert!(
        mxtune::flags::render(&accepted, mxtune::vocab::TargetKind::Docker).is_ok(),
        "what the editor accepts renders"
    );

    // Rows that are not numbers keep cycling on Enter.
    select_limit(&mut app, "prefix_caching");
    let pc = app.flags.flags.serving.prefix_caching;
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.flags.editing, None);
    assert_ne!(app.flags.flags.serving.prefix_caching, pc);
}

#[test]
fn rule_findings_show_inline() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    app.flags.flags.set_axis("sinks", "off").unwrap();
    let findings = app.flags.findings();
    assert!(!findings.is_empty(), "sinks off is a known problem");
    let screen = render(&app, 160, 48);
    assert!(screen.contains(&findings[0].rule.to_string()), "{screen}");
}

#[test]
fn preset_picker_filters_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('p'));
    type_str(&mut app, "engine-q8");
    match &app.flags.overlay {
        Some(Overlay::Picker { filter, names, .. }) => {
            assert_eq!(filter, "engine-q8");
            assert!(names.iter().any(|n| n == "engine-q8"), "{names:?}");
        }
        other => panic!("picker not open: {other:?}"),
    }
    assert_eq!(
        app.tab,
        Tab::Flags,
        "typed digits filter, they do not switch tabs"
    );
    assert!(render(&app, 80, 24).contains("engine-q8"));
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.flags.overlay, None);
    assert_eq!(app.flags.loaded.as_ref().unwrap().name, "engine-q8");
    assert_eq!(app.flags.flags.axis_value("activation"), Some("q8"));
}

#[test]
fn save_validates_the_name_and_asks_before_overwriting() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Enter); // change something
    let changed = app.flags.flags.clone();

    key(&mut app, KeyCode::Char('s'));
    type_str(&mut app, "bad name");
    key(&mut app, KeyCode::Enter);
    assert!(matches!(
        &app.flags.overlay,
        Some(Overlay::Save { error: Some(_), .. })
    ));
    assert!(!dir.path().join("presets/bad name.toml").exists());
    for _ in 0.."bad name".len() {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "my-try");
    key(&mut app, KeyCode::Enter);
    let file = dir.path().join("presets/my-try.toml");
    assert!(file.is_file(), "saved into the save dir");
    assert_eq!(app.flags.overlay, None);
    assert_eq!(app.flags.loaded.as_ref().unwrap().name, "my-try");
    assert!(!app.flags.dirty(), "the saved preset is the new baseline");
    let back = PresetStore::new(vec![dir.path().join("presets"), repo_presets()])
        .load("my-try")
        .unwrap();
    assert_eq!(back.flags, changed, "loads back to the same flags");

    // Same name again: asks; `n` keeps the file, `y` replaces it.
    key(&mut app, KeyCode::Enter);
    let text_before = std::fs::read_to_string(&file).unwrap();
    key(&mut app, KeyCode::Char('s'));
    type_str(&mut app, "my-try");
    key(&mut app, KeyCode::Enter);
    assert!(matches!(
        &app.flags.overlay,
        Some(Overlay::Save {
            confirm_overwrite: true,
            ..
        })
    ));
    assert!(render(&app, 80, 24).contains("Overwrite it? y/n"));
    key(&mut app, KeyCode::Char('n'));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text_before);
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('y'));
    assert_eq!(app.flags.overlay, None);
    let back = PresetStore::new(vec![dir.path().join("presets"), repo_presets()])
        .load("my-try")
        .unwrap();
    assert_eq!(back.flags, app.flags.flags);
    assert_ne!(back.flags, changed, "overwritten with the newer flags");
}

#[test]
fn saving_under_a_bundled_name_asks_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = paths(dir.path());
    paths.presets = PresetStore {
        dirs: vec![dir.path().join("presets")],
        bundled: true,
    };
    let mut app = App::new(theme(), paths);
    for e in app.startup_effects() {
        run_effect(&mut app, e);
    }
    assert_eq!(app.flags.loaded.as_ref().unwrap().name, "engine-cpu-tiny");
    let file = dir.path().join("presets/baseline.toml");
    key(&mut app, KeyCode::Char('s'));
    type_str(&mut app, "baseline");
    key(&mut app, KeyCode::Enter);
    match &app.flags.overlay {
        Some(Overlay::Save {
            confirm_overwrite: true,
            error: Some(q),
            ..
        }) => assert!(q.contains("bundled:presets/baseline.toml"), "{q}"),
        other => panic!("{other:?}"),
    }
    assert!(render(&app, 80, 24).contains("bundled:presets/baseline.toml"));
    key(&mut app, KeyCode::Char('n'));
    assert!(!file.exists(), "n saves nothing");
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('y'));
    assert_eq!(app.flags.overlay, None);
    assert!(file.is_file());
    assert_eq!(
        app.paths.presets.find("baseline"),
        Some(mxtune::flags::preset::PresetOrigin::File(file))
    );
}

#[test]
fn diff_and_command_views() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('d'));
    assert!(render(&app, 80, 24).contains("same flags as preset engine-cpu-tiny"));
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('d'));
    let screen = render(&app, 80, 24);
    assert!(screen.contains("axes.moe_backend: \"auto\" ->"), "{screen}");
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('c'));
    let lines = mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    assert!(lines.iter().any(|l| l.contains("serve")), "{lines:?}");
    let screen = render(&app, 160, 48);
    assert!(
        screen.contains(lines[0].trim_end_matches(" \\")),
        "{screen}"
    );
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(
        app.flags.flags.target,
        mxtune::vocab::TargetKind::Engine,
        "t is ignored while a view is open"
    );
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.flags.flags.target, mxtune::vocab::TargetKind::Docker);
    // The engine preset carries the engine's values; on a stock vLLM image the view says
    // which value it cannot express and what is nearest.
    let refused = mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    assert!(
        refused[0].starts_with("cannot render for docker")
            && refused[0].contains("nearest upstream value"),
        "{refused:?}"
    );
    app.flags.flags.container.vllm = mxtune::flags::VllmFlavor::Fork;
    let docker = mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    assert!(docker[0].starts_with("docker run"), "{docker:?}");
}

#[test]
fn command_view_scrolls_within_the_command_and_saves_it_to_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('c'));
    let lines = mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    for _ in 0..20 {
        key(&mut app, KeyCode::PageDown);
    }
    assert_eq!(
        app.flags.overlay,
        Some(Overlay::Command {
            scroll: (lines.len() - 1) as u16
        }),
        "scrolling stops at the last line"
    );
    assert!(render(&app, 80, 24).contains(lines.last().unwrap().trim()));
    key(&mut app, KeyCode::Char('S'));
    let file = dir.path().join("command-engine-cpu-tiny.sh");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        text,
        lines.join("\n") + "\n",
        "the whole command, however wide"
    );
    assert!(app.message.as_deref().unwrap_or("").contains("wrote"));
    assert!(app.flags.overlay.is_some(), "the view stays open");
    // Saving again never replaces the earlier file.
    std::fs::write(&file, "# edited by hand\n").unwrap();
    key(&mut app, KeyCode::Char('S'));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# edited by hand\n"
    );
    let second = dir.path().join("command-engine-cpu-tiny-2.sh");
    assert_eq!(std::fs::read_to_string(second).unwrap(), text);
}

#[test]
fn snapshots_flags() {
    let mut app = snapshot_app(theme());
    insta::assert_snapshot!("flags_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("flags_160x48", render(&app, 160, 48));
    key(&mut app, KeyCode::Char('c'));
    insta::assert_snapshot!("flags_command_80x24", render(&app, 80, 24));
    key(&mut app, KeyCode::Esc);
    select_limit(&mut app, "max_model_len");
    key(&mut app, KeyCode::Enter);
    for _ in 0..4 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "0");
    key(&mut app, KeyCode::Enter);
    assert!(app.flags.editing.is_some(), "0 is refused");
    insta::assert_snapshot!("flags_limit_refused_80x24", render(&app, 80, 24));
}

// ---- Runs ----

#[test]
fn snapshots_runs() {
    let mut app = snapshot_app(theme());
    app.runs.on_scan(Ok(fixed_runs()));
    key(&mut app, KeyCode::Char('5'));
    insta::assert_snapshot!("runs_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("runs_160x48", render(&app, 160, 48));
    key(&mut app, KeyCode::Char('m'));
    key(&mut app, KeyCode::Down);
    key(&mut app, KeyCode::Char('m'));
    key(&mut app, KeyCode::Char('C'));
    insta::assert_snapshot!("runs_compare_160x48", render(&app, 160, 48));
}

#[test]
fn runs_list_filter_open_compare_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path().join("runs"));
    let older = record(
        "01JD0000000000000000000001",
        "engine-cpu-tiny",
        10,
        120.0,
        1.0,
    );
    let newer = record("01JD0000000000000000000002", "engine-q8", 30, 131.0, 1.5);
    store.create(older).unwrap();
    store.create(newer).unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('5'));
    assert_eq!(app.runs.runs.len(), 2);
    assert_eq!(app.runs.runs[0].record.label(), "engine-q8", "newest first");

    // Compare and export need two marked runs; without them the status line says so.
    key(&mut app, KeyCode::Char('e'));
    assert!(
        app.message
            .as_deref()
            .is_some_and(|m| m.contains("0 of 2 runs marked")),
        "{:?}",
        app.message
    );
    key(&mut app, KeyCode::Char('C'));
    assert_eq!(app.runs.view, RunsView::List);
    assert!(render(&app, 80, 24).contains("mark two with m"));

    key(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "tiny");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.runs.visible(), vec![1]);
    key(&mut app, KeyCode::Enter);
    assert!(matches!(app.runs.view, RunsView::Show { .. }));
    assert!(render(&app, 160, 48).contains("preset engine-cpu-tiny"));
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('m')); // A = the tiny run (baseline)
    key(&mut app, KeyCode::Char('/'));
    key(&mut app, KeyCode::Esc); // clears the filter
    assert_eq!(app.runs.visible().len(), 2);
    key(&mut app, KeyCode::Char('m')); // B = the q8 run (row 0)
    key(&mut app, KeyCode::Char('C'));
    assert!(matches!(app.runs.view, RunsView::Compare { .. }));
    let screen = render(&app, 160, 48);
    assert!(
        screen.contains("+9.2%"),
        "delta against the baseline:\n{screen}"
    );

    key(&mut app, KeyCode::Char('e'));
    let exported = dir.path().join("compare-00000001-00000002.md");
    let md = std::fs::read_to_string(&exported).unwrap();
    assert!(md.contains("| ") && md.contains("engine-q8"), "{md}");
    assert!(app.message.as_deref().unwrap_or("").contains("wrote"));
    // Exporting again keeps the first file and says where the new one went.
    std::fs::write(&exported, "edited\n").unwrap();
    key(&mut app, KeyCode::Char('e'));
    assert_eq!(std::fs::read_to_string(&exported).unwrap(), "edited\n");
    let second = dir.path().join("compare-00000001-00000002-2.md");
    assert_eq!(std::fs::read_to_string(&second).unwrap(), md);
    let msg = app.message.clone().unwrap_or_default();
    assert!(
        msg.contains("compare-00000001-00000002-2.md") && msg.contains("exists, kept"),
        "{msg}"
    );
}

#[test]
fn runs_compare_noise_threshold_is_set_with_n() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path().join("runs"));
    // Marked newest first: 131 ± 1.5 is A, 120 ± 1.0 is B: -11, beyond 2·std (3), within
    // 10·std (15).
    store
        .create(record(
            "01JD0000000000000000000001",
            "engine-cpu-tiny",
            10,
            120.0,
            1.0,
        ))
        .unwrap();
    store
        .create(record(
            "01JD0000000000000000000002",
            "engine-q8",
            30,
            131.0,
            1.5,
        ))
        .unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('5'));
    key(&mut app, KeyCode::Char('m'));
    key(&mut app, KeyCode::Down);
    key(&mut app, KeyCode::Char('m'));
    key(&mut app, KeyCode::Char('C'));
    let screen = render(&app, 80, 24);
    assert!(screen.contains("noise threshold 2·std"), "{screen}");
    assert!(screen.contains("(beyond noise)"), "{screen}");
    // n opens the field; q, digits and letters are typed, not acted on.
    key(&mut app, KeyCode::Char('n'));
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::VALUE_INPUT
    );
    key(&mut app, KeyCode::Backspace);
    type_str(&mut app, "q");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.tab, Tab::Runs);
    assert_eq!(app.noise_sigmas, 2.0, "a bad value changes nothing");
    let refused = render(&app, 80, 24);
    assert!(
        refused.contains("noise threshold `q`: give a number of standard"),
        "{refused}"
    );
    key(&mut app, KeyCode::Backspace);
    type_str(&mut app, "10");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.noise_sigmas, 10.0);
    assert!(app.runs.noise_edit.is_none());
    let screen = render(&app, 80, 24);
    assert!(screen.contains("noise threshold 10·std"), "{screen}");
    assert!(screen.contains("-8.4% (within noise)"), "{screen}");
    insta::assert_snapshot!("runs_compare_noise_80x24", screen);
    // The export says the same.
    key(&mut app, KeyCode::Char('e'));
    let md = std::fs::read_to_string(dir.path().join("compare-00000002-00000001.md")).unwrap();
    assert!(md.contains("-8.4% (within noise)"), "{md}");
    assert!(md.contains("< 10·std"), "{md}");
    // Esc while typing keeps the threshold as it was.
    key(&mut app, KeyCode::Char('n'));
    type_str(&mut app, "5");
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.noise_sigmas, 10.0);
    assert!(matches!(app.runs.view, RunsView::Compare { .. }));
}

// ---- Launch ----

/// A stand-in for an OpenAI server (the attach target's other end): health, models, and a
/// 1-token completion, on an ephemeral port. Runs until the test process ends.
fn target_double() -> String {
    use axum::routing::{get, post};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/v1/models",
                    get(|| async { axum::Json(serde_json::json!({"data": [{"id": "double"}]})) }),
                )
                .route(
                    "/v1/completions",
                    post(|| async {
                        axum::Json(serde_json::json!({"choices": [{"text": "x", "index": 0}]}))
                    }),
                );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    format!("http://{addr}")
}

/// A server that is up but never healthy (`/health` answers 503): a target stuck starting.
fn never_ready_double() -> String {
    use axum::routing::get;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/health",
                get(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "loading") }),
            );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    format!("http://{addr}")
}

fn attach_to(app: &mut App, url: &str) {
    key(app, KeyCode::Char('2'));
    key(app, KeyCode::Char('u'));
    for _ in 0..app.launch.url.len() {
        key(app, KeyCode::Backspace);
    }
    type_str(app, url);
    key(app, KeyCode::Enter);
}

#[test]
fn launch_watchdog_shows_the_limit_in_effect_and_fires() {
    use mxtune::tui::screens::launch::{Watchdog, clock};
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('2'));
    // Before any launch: the launch module's default limit, waiting.
    let default_s = mxtune::launch::DEFAULT_STARTUP_LIMIT.as_secs();
    assert_eq!(
        app.launch.watchdog(),
        Watchdog::Waiting { limit_s: default_s }
    );
    let screen = render(&app, 80, 24);
    assert!(
        screen.contains(&format!("limit {} from the next launch", clock(default_s))),
        "{screen}"
    );

    // Choosing attach shows the attach limit: an endpoint that already runs gets a short one.
    let url = never_ready_double();
    attach_to(&mut app, &url);
    let attach_s = mxtune::launch::DEFAULT_ATTACH_LIMIT.as_secs();
    assert_eq!(
        app.launch.watchdog(),
        Watchdog::Waiting { limit_s: attach_s }
    );
    let screen = render(&app, 80, 24);
    assert!(
        screen.contains(&format!("limit {} from the next launch", clock(attach_s))),
        "{screen}"
    );

    // A target that never gets healthy, with a 2 s limit: the follower's limit is the one
    // shown, it runs, then fires and fails the launch.
    app.launch.attach_limit = std::time::Duration::from_secs(2);
    key(&mut app, KeyCode::Char('l'));
    pump_until(&mut app, "followed", |a| a.launch.describe.is_some());
    assert!(
        matches!(app.launch.watchdog(), Watchdog::Running { limit_s: 2, .. }),
        "{:?}",
        app.launch.watchdog()
    );
    assert!(render(&app, 80, 24).contains("/0:02"));
    pump_until(&mut app, "failed", |a| {
        matches!(a.launch.state, TargetState::Failed(_))
    });
    assert_eq!(app.launch.watchdog(), Watchdog::Fired { limit_s: 2 });
    let screen = render(&app, 160, 48);
    assert!(screen.contains("FIRED: not ready within 0:02"), "{screen}");
    assert!(screen.contains("attach limit of 2 s"), "{screen}");
    // The reason stays on screen: the last probe's answer.
    assert!(
        screen.contains("last probe: GET /health → 503 loading"),
        "{screen}"
    );
}

#[test]
fn launch_shows_each_probe_answer_under_the_phase_line() {
    use loading_double::{LOADING_MESSAGE, loading_double};
    let url = loading_double();
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    attach_to(&mut app, &url);
    key(&mut app, KeyCode::Char('l'));
    // Before any answer the line says so.
    assert!(render(&app, 100, 30).contains("probe: no answer yet"));
    pump_until(&mut app, "a probe answer", |a| a.launch.probe.is_some());
    let probe = app.launch.probe.clone().unwrap();
    assert_eq!(
        (probe.answer.status, probe.answer.message.as_str()),
        (Some(503), LOADING_MESSAGE)
    );
    let screen = render(&app, 100, 30);
    let lines: Vec<&str> = screen.lines().collect();
    let phase = lines.iter().position(|l| l.contains("phase ")).unwrap();
    assert!(
        lines[phase + 1].contains(&format!(
            "probe: POST /v1/completions → 503 {LOADING_MESSAGE}, 0 s ago"
        )),
        "the answer shows under the phase line:\n{screen}"
    );
    // The attach limit applies, not the 45 minutes of a container.
    assert!(screen.contains("/1:00"), "{screen}");
    key(&mut app, KeyCode::Char('x'));
    key(&mut app, KeyCode::Char('y'));
    pump_until(&mut app, "stopped", |a| {
        matches!(a.launch.state, TargetState::Exited(_))
    });
    assert!(
        !render(&app, 100, 30).contains("probe:"),
        "no probe line once the target is gone"
    );
}

/// A `TestBackend` that keeps the screen after every frame: lets a test watch what the real
/// event loop draws over time.
struct Recording {
    screen: TestBackend,
    frames: Vec<String>,
}

impl ratatui::backend::Backend for Recording {
    type Error = <TestBackend as ratatui::backend::Backend>::Error;

    fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
    where
        I: Iterator<Item = (u16, u16, &'a ratatui::buffer::Cell)>,
    {
        self.screen.draw(content)
    }
    fn hide_cursor(&mut self) -> Result<(), Self::Error> {
        self.screen.hide_cursor()
    }
    fn show_cursor(&mut self) -> Result<(), Self::Error> {
        self.screen.show_cursor()
    }
    fn get_cursor_position(&mut self) -> Result<ratatui::layout::Position, Self::Error> {
        self.screen.get_cursor_position()
    }
    fn set_cursor_position<P: Into<ratatui::layout::Position>>(
        &mut self,
        position: P,
    ) -> Result<(), Self::Error> {
        self.screen.set_cursor_position(position)
    }
    fn clear(&mut self) -> Result<(), Self::Error> {
        self.screen.clear()
    }
    fn clear_region(&mut self, clear_type: ratatui::backend::ClearType) -> Result<(), Self::Error> {
        self.screen.clear_region(clear_type)
    }
    fn size(&self) -> Result<ratatui::layout::Size, Self::Error> {
        self.screen.size()
    }
    fn window_size(&mut self) -> Result<ratatui::backend::WindowSize, Self::Error> {
        self.screen.window_size()
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        self.screen.flush()?;
        self.frames.push(self.screen.to_string());
        Ok(())
    }
}

/// The `elapsed m:ss` a Launch screen shows.
fn elapsed_shown(screen: &str) -> Option<String> {
    let rest = &screen[screen.find("elapsed ")? + "elapsed ".len()..];
    rest.split_whitespace().next().map(str::to_string)
}

#[test]
fn the_clock_ticks_once_a_second_while_other_events_keep_coming() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let mut app = App::new(theme(), paths(dir.path()));
    app.tab = Tab::Launch;
    let now = Instant::now();
    app.launch.state = TargetState::Starting(mxtune::launch::Phase::LoadingWeights);
    app.launch.started_at = Some(now);
    app.launch.watch_since = Some(now);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut bg = Background::new(std::sync::mpsc::channel().0).unwrap();
    // Monitor samples (and a probe answer now and then) every 0.9 s for 10.8 s: each one
    // would restart a wait for a quiet channel. Hanging up ends the loop.
    let feeder = std::thread::spawn(move || {
        for i in 0..12 {
            std::thread::sleep(Duration::from_millis(900));
            let ev = if i % 3 == 2 {
                Event::Launch(LaunchMsg::Event(mxtune::launch::LaunchEvent::Probe {
                    answer: mxtune::vocab::ProbeAnswer {
                        request: "POST /v1/completions".into(),
                        status: Some(503),
                        message: "model is still loading".into(),
                        at: chrono::Utc::now(),
                    },
                }))
            } else {
                Event::Sample(Box::new(sample(i, false)))
            };
            tx.send(ev).unwrap();
        }
    });
    let mut terminal = Terminal::new(Recording {
        screen: TestBackend::new(80, 24),
        frames: Vec::new(),
    })
    .unwrap();
    let exit = mxtune::tui::event_loop(&mut terminal, &mut app, &mut bg, &rx).unwrap();
    feeder.join().unwrap();
    assert_eq!(exit, Exit::Quit);

    // The clock on screen moved on about once a second, forwards only.
    let frames = &terminal.backend().frames;
    let mut shown: Vec<String> = frames.iter().filter_map(|f| elapsed_shown(f)).collect();
    shown.dedup();
    let ticks = shown.len() - 1;
    assert!(
        (9..=11).contains(&ticks),
        "{ticks} clock steps in 10.8 s: {shown:?}"
    );
    let seconds = |c: &str| {
        let (m, s) = c.split_once(':').unwrap();
        m.parse::<u64>().unwrap() * 60 + s.parse::<u64>().unwrap()
    };
    assert!(
        shown.windows(2).all(|w| seconds(&w[0]) < seconds(&w[1])),
        "{shown:?}"
    );
    // The probe's age moves with the same clock between answers.
    assert!(
        frames
            .iter()
            .any(|f| f.contains("503 model is still loading, 2 s ago")),
        "{}",
        frames.last().unwrap()
    );
}

fn log_line(app: &mut App, line: &str) {
    app.launch
        .on_msg(LaunchMsg::Event(mxtune::launch::LaunchEvent::Log {
            stream: mxtune::launch::LogStream::Stdout,
            line: line.into(),
        }));
}

#[test]
fn launch_attach_start_and_stop_with_confirmation() {
    let url = target_double();
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('2'));
    key(&mut app, KeyCode::Char('u'));
    assert_eq!(app.launch.choice, mxtune::vocab::TargetKind::Attach);
    for _ in 0..app.launch.url.len() {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, &url);
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('l'));
    assert_eq!(app.launch.state, TargetState::Launching);
    pump_until(&mut app, "ready", |a| {
        matches!(a.launch.state, TargetState::Ready { .. })
    });
    let screen = render(&app, 100, 30);
    assert!(
        screen.contains("ready") && screen.contains(&url),
        "{screen}"
    );
    assert!(app.target_running());
    assert_eq!(
        app.launch.watchdog(),
        mxtune::tui::screens::launch::Watchdog::Passed {
            limit_s: mxtune::launch::DEFAULT_ATTACH_LIMIT.as_secs()
        }
    );

    // Quitting now asks; Esc stays.
    assert_eq!(key(&mut app, KeyCode::Char('q')), None);
    assert_eq!(app.quit_prompt, Some(QuitPrompt::TargetRunning));
    key(&mut app, KeyCode::Esc);

    // Stop asks first; anything but y keeps it.
    key(&mut app, KeyCode::Char('x'));
    assert!(render(&app, 80, 24).contains("Stop target?"));
    key(&mut app, KeyCode::Char('n'));
    assert!(matches!(app.launch.state, TargetState::Ready { .. }));
    key(&mut app, KeyCode::Char('x'));
    key(&mut app, KeyCode::Char('y'));
    assert_eq!(app.launch.state, TargetState::Stopping);
    pump_until(&mut app, "stopped", |a| {
        matches!(a.launch.state, TargetState::Exited(_))
    });
    assert!(!app.target_running());
    assert_eq!(
        key(&mut app, KeyCode::Char('q')),
        Some(Exit::Quit),
        "nothing left to ask about"
    );
}

#[test]
fn launch_failure_is_shown() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('2'));
    key(&mut app, KeyCode::Char('u'));
    for _ in 0..app.launch.url.len() {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "ftp://nowhere");
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('l'));
    pump_until(&mut app, "failed", |a| {
        matches!(a.launch.state, TargetState::Failed(_))
    });
    assert!(render(&app, 160, 48).contains("must start with http://"));
    assert!(
        matches!(
            app.launch.watchdog(),
            mxtune::tui::screens::launch::Watchdog::Waiting { .. }
        ),
        "a failure that is not the start-up limit does not fire the watchdog"
    );
}

/// The default preset (the CPU engine) on `port`, in `scratch/presets`, searched first.
fn tiny_preset_on(scratch: &Path, port: u16) {
    let presets = scratch.join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    let tiny = std::fs::read_to_string(repo_presets().join("engine-cpu-tiny.toml")).unwrap();
    let tiny = tiny.replace("port = 8000", &format!("port = {port}"));
    assert!(
        tiny.contains(&format!("port = {port}")),
        "the preset sets its port"
    );
    std::fs::write(presets.join("engine-cpu-tiny.toml"), tiny).unwrap();
}

/// Processes on this machine whose command line asks for `--port PORT`.
fn processes_on_port(port: u16) -> Vec<String> {
    let wanted = format!("--port\0{port}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).into_owned();
            cmd.contains(&wanted).then(|| cmd.replace('\0', " "))
        })
        .collect()
}

#[test]
fn launch_preflight_port_taken_blocks_and_starts_nothing() {
    use mxtune::launch::preflight::{BLOCKED, Severity};
    // Something listens on the preset's port: the check binds it for real.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    tiny_preset_on(dir.path(), port);
    let mut app = started(dir.path(), theme());
    run_effect(&mut app, Effect::LoadPreset("engine-cpu-tiny".into()));
    key(&mut app, KeyCode::Char('2'));
    assert_eq!(app.launch.choice, mxtune::vocab::TargetKind::Engine);
    key(&mut app, KeyCode::Char('l'));
    assert_eq!(app.launch.state, TargetState::Launching);
    assert!(
        render(&app, 160, 48)
            .contains("pre-flight checks running here (port, mounts, GPU, compilers, memory)"),
        "{}",
        render(&app, 160, 48)
    );
    pump_until(&mut app, "failed", |a| {
        matches!(a.launch.state, TargetState::Failed(_))
    });
    assert_eq!(app.launch.state, TargetState::Failed(BLOCKED.into()));
    let findings = app.launch.preflight.clone().expect("the findings arrived");
    let port_finding = format!("port {port} on 127.0.0.1 is not free");
    let blocking: Vec<_> = findings
        .iter()
        .filter(|f| f.finding.severity == Severity::Error)
        .collect();
    assert_eq!(blocking.len(), 1, "{findings:?}");
    assert!(
        blocking[0].finding.message.starts_with(&port_finding)
            && blocking[0]
                .finding
                .message
                .contains("or choose another port"),
        "{findings:?}"
    );
    // In the log pane as `mxtune launch` prints them, then its last word.
    let log: Vec<&str> = app.launch.log.lines.iter().map(String::as_str).collect();
    assert!(
        log.iter()
            .any(|l| l.starts_with(&format!("pre-flight Error: {port_finding}"))),
        "{log:?}"
    );
    assert_eq!(log.last(), Some(&BLOCKED), "{log:?}");
    // On screen: which check, what is wrong, what to do, and that nothing was started.
    let screen = render(&app, 200, 48);
    assert!(
        screen.contains("Pre-flight: blocked, nothing was started"),
        "{screen}"
    );
    assert!(
        screen.contains(&format!("error: {port_finding}")),
        "{screen}"
    );
    assert!(screen.contains("or choose another port"), "{screen}");
    assert!(screen.contains("phase failed"), "{screen}");

    // Nothing was started: no target followed, no engine process, no log or state file.
    assert_eq!(app.launch.describe, None);
    assert_eq!(app.launch.run_id, None);
    assert!(!app.target_running());
    assert_eq!(processes_on_port(port), Vec::<String>::new());
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        !runs
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".target.log")),
        "{runs:?}"
    );

    // The operator reads them, goes elsewhere and back: still there, and nothing to stop.
    key(&mut app, KeyCode::Char('1'));
    key(&mut app, KeyCode::Char('2'));
    assert!(render(&app, 200, 48).contains(&format!("error: {port_finding}")));
    assert_eq!(
        key(&mut app, KeyCode::Char('q')),
        Some(Exit::Quit),
        "nothing was started, so nothing to ask about"
    );
    drop(taken);
}

#[test]
fn snapshots_launch_preflight() {
    use mxtune::launch::preflight::{BLOCKED, Finding, LaunchFinding, Severity};
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('2'));
    // The state `l` leaves (without starting anything here), then fixed findings: the
    // checks themselves are the previous test's (and the CLI's).
    app.launch.state = TargetState::Launching;
    app.launch.started_at = Some(std::time::Instant::now());
    insta::assert_snapshot!("launch_preflight_checking_80x24", render(&app, 80, 24));
    let finding = |severity, message: &str| LaunchFinding {
        node: None,
        finding: Finding {
            severity,
            message: message.into(),
        },
    };
    app.launch.on_msg(LaunchMsg::Preflight(vec![
        finding(
            Severity::Error,
            "port 8000 on 127.0.0.1 is not free (Address already in use (os error 98)): stop what listens there (`ss -ltnp 'sport = :8000'`) or choose another port",
        ),
        finding(
            Severity::Warning,
            "leftover JIT compiler processes: ptxas (pid 4242, 1.5 GiB RSS); orphaned compilers have caused OOM on the Spark: kill them if no build is running",
        ),
    ]));
    app.launch.on_msg(LaunchMsg::StartFailed(BLOCKED.into()));
    insta::assert_snapshot!("launch_preflight_blocked_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("launch_preflight_blocked_160x48", render(&app, 160, 48));
}

/// With a docker-cluster preset loaded, the Launch screen offers `r`: re-attach to its running
/// cluster (the hint bar, the idle line and the help say so); `r` asks the runtime for the
/// re-attach and the screen says what it is looking for; the screen of any other target has no
/// `r`, and the key does nothing there.
#[test]
fn launch_offers_reattach_for_a_cluster_preset_only() {
    use mxtune::vocab::TargetKind;
    let presets = tempfile::tempdir().unwrap();
    std::fs::write(
        presets.path().join("tp2-sparks.toml"),
        "description = \"gpt-oss-120b over two Sparks\"\ntarget = \"docker-cluster\"\n\
         [cluster]\nhead = \"spark1\"\nworker = \"spark2\"\n\
         [serving]\nmodel = \"openai/gpt-oss-120b\"\nserved_model_name = \"gpt-oss-120b\"\nport = 8000\n\
         [container]\nimage = \"vllm-mxfp4:dev\"\nnetwork = \"host\"\n",
    )
    .unwrap();
    let mut app = App::new(
        theme(),
        Paths {
            presets: PresetStore::new(vec![presets.path().to_path_buf(), repo_presets()]),
            save_dir: PathBuf::from("presets"),
            runs_dir: PathBuf::from("runs"),
            export_dir: PathBuf::from("."),
        },
    );
    run_effect(&mut app, Effect::LoadPreset("engine-cpu-tiny".into()));
    key(&mut app, KeyCode::Char('2'));
    // Not a cluster: no `r` anywhere, and the key does nothing.
    let engine = render(&app, 100, 30);
    assert!(!engine.contains("re-attach"), "{engine}");
    assert_eq!(hit(&mut app, KeyCode::Char('r')), Vec::<Effect>::new());
    assert_eq!(app.launch.state, TargetState::Idle);

    run_effect(&mut app, Effect::LoadPreset("tp2-sparks".into()));
    key(&mut app, KeyCode::Char('2'));
    assert_eq!(app.launch.choice, TargetKind::DockerCluster);
    let idle = render(&app, 100, 30);
    assert!(
        idle.contains("r re-attach to its running cluster"),
        "{idle}"
    );
    assert!(
        idle.contains("r re-attaches to its running cluster"),
        "{idle}"
    );
    insta::assert_snapshot!("launch_cluster_idle_100x30", idle);
    key(&mut app, KeyCode::Char('?'));
    let help = render(&app, 100, 40);
    assert!(help.contains("Launch: a docker-cluster preset"), "{help}");
    key(&mut app, KeyCode::Esc);

    assert_eq!(
        hit(&mut app, KeyCode::Char('r')),
        vec![Effect::ReattachTarget]
    );
    assert_eq!(app.launch.state, TargetState::Launching);
    let looking = render(&app, 100, 30);
    assert!(
        looking.contains("finding the preset's running cluster on its hosts"),
        "{looking}"
    );
    insta::assert_snapshot!("launch_cluster_reattaching_100x30", looking);
    // While it is followed, `r` does nothing more.
    assert_eq!(hit(&mut app, KeyCode::Char('r')), Vec::<Effect>::new());

    // `t` leaves the cluster for the engine, and with it the `r`.
    app.launch.on_msg(LaunchMsg::StartFailed(
        "no running cluster of preset tp2-sparks has its Ray head on host spark1".into(),
    ));
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(app.launch.choice, TargetKind::Engine);
    let other = render(&app, 100, 30);
    assert!(!other.contains("re-attach"), "{other}");
    key(&mut app, KeyCode::Char('?'));
    let help = render(&app, 100, 40);
    assert!(!help.contains("docker-cluster preset"), "{help}");
}

#[test]
fn log_pane_follows_scrolls_searches_wraps_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('2'));
    for i in 0..100 {
        log_line(&mut app, &format!("line {i}"));
    }
    log_line(&mut app, "WARNING something odd");
    log_line(&mut app, "last line");
    assert!(app.launch.log.following());
    assert!(render(&app, 80, 24).contains("last line"));
    key(&mut app, KeyCode::PageUp);
    assert!(!app.launch.log.following());
    let screen = render(&app, 80, 24);
    assert!(
        !screen.contains("last line") && screen.contains("paused"),
        "{screen}"
    );
    log_line(&mut app, "newer line");
    assert!(
        !render(&app, 80, 24).contains("newer line"),
        "a paused view stays put"
    );
    key(&mut app, KeyCode::End);
    assert!(render(&app, 80, 24).contains("newer line"));

    key(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "line 42");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.launch.log.search.as_deref(), Some("line 42"));
    assert!(render(&app, 80, 24).contains("line 42"));
    assert!(
        !render(&app, 80, 24).contains("newer line"),
        "jumped back to the match"
    );
    key(&mut app, KeyCode::Char('N'));
    key(&mut app, KeyCode::End);
    // A search without a match says so instead of doing nothing.
    key(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "no such text");
    key(&mut app, KeyCode::Enter);
    assert!(app.launch.log.following(), "the view did not move");
    assert!(
        render(&app, 80, 24).contains("no older line matches"),
        "{:?}",
        app.message
    );

    log_line(&mut app, &"x".repeat(200));
    key(&mut app, KeyCode::Char('w'));
    assert!(app.launch.log.wrap);
    let wrapped = render(&app, 80, 24);
    assert!(wrapped.matches("xxxxxxxxxx").count() >= 3, "{wrapped}");

    key(&mut app, KeyCode::Char('S'));
    let saved = std::fs::read_to_string(dir.path().join("launch-no-run.log")).unwrap();
    assert!(saved.starts_with("line 0\n") && saved.contains("WARNING something odd"));
    key(&mut app, KeyCode::Char('S'));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("launch-no-run-2.log")).unwrap(),
        saved,
        "a second save goes to a new file"
    );
    assert!(
        render(&app, 80, 24).contains("launch-no-run-2.log"),
        "{:?}",
        app.message
    );
}

fn fixed_launch(app: &mut App) {
    use mxtune::launch::verdict::PathVerdict;
    use mxtune::launch::{LaunchEvent, ValidationReport, Verdict};
    app.launch.state = TargetState::Ready {
        url: "http://127.0.0.1:8000".into(),
        startup_s: 2.5,
    };
    app.launch.describe = Some("engine process 4242 (/usr/bin/mxtune)".into());
    app.launch.log_path = Some(PathBuf::from("runs/01JD0000000000000000000003.target.log"));
    for l in [
        "mxtune serve: synthetic model tiny on cpu",
        "kernel-path moe_kernel=gemv",
        "kernel-path activation=bf16",
        "WARN slow start",
        "error: nothing really",
        "listening on 127.0.0.1:8000",
    ] {
        log_line(app, l);
    }
    let v = |flag: &str, value: &str, verdict, seen: &[&str], missing: &[&str]| PathVerdict {
        flag: flag.into(),
        value: value.into(),
        verdict,
        seen: seen.iter().map(|s| s.to_string()).collect(),
        forbidden_seen: vec![],
        missing: missing.iter().map(|s| s.to_string()).collect(),
        note: None,
    };
    app.launch.on_msg(LaunchMsg::Event(LaunchEvent::Verdict {
        report: ValidationReport {
            checks: vec![
                v(
                    "moe_backend",
                    "auto",
                    Verdict::Valid,
                    &["kernel-path moe_kernel=gemv"],
                    &[],
                ),
                v(
                    "sinks",
                    "on",
                    Verdict::Unknown,
                    &[],
                    &["^kernel-path sinks=on"],
                ),
            ],
            unknown_env: vec![],
            lines_scanned: 6,
        },
    }));
}

#[test]
fn snapshots_launch() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('2'));
    insta::assert_snapshot!("launch_idle_80x24", render(&app, 80, 24));
    // Starting: elapsed and the watchdog's clock against the limit (fixed, no ticks).
    let now = std::time::Instant::now();
    app.launch.state = TargetState::Starting(mxtune::launch::Phase::CapturingGraphs);
    app.launch.started_at = Some(now);
    app.launch.elapsed_s = 754;
    app.launch.watch_since = Some(now);
    app.launch.watch_s = 750;
    app.launch.last_line_at = Some(now);
    app.launch.quiet_s = 5;
    app.launch
        .on_msg(LaunchMsg::Event(mxtune::launch::LaunchEvent::Probe {
            answer: mxtune::vocab::ProbeAnswer {
                request: "POST /v1/completions".into(),
                status: Some(503),
                message: "model is still loading".into(),
                at: chrono::Utc::now(),
            },
        }));
    app.launch.probe.as_mut().unwrap().age_s = 3;
    insta::assert_snapshot!("launch_starting_80x24", render(&app, 80, 24));
    app.launch.started_at = None;
    app.launch.watch_since = None;
    fixed_launch(&mut app);
    insta::assert_snapshot!("launch_ready_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("launch_ready_160x48", render(&app, 160, 48));
}

// ---- Live ----

/// A GB10-like sample at second `t`: unified memory, clocks ramping, server busy;
/// `throttle` adds a power-cap reason.
fn sample(t: i64, throttle: bool) -> mxtune::monitor::Sample {
    use chrono::TimeZone;
    use mxtune::monitor::Reading::Value;
    use mxtune::monitor::sample::*;
    let f = t as f64;
    let clocks = |sm: u32| Clocks {
        sm_mhz: Value(sm),
        graphics_mhz: Value(sm),
        mem_mhz: Value(4266),
    };
    let gpu = GpuSample {
        index: 0,
        name: Value("NVIDIA GB10".into()),
        uuid: Value("GPU-0".into()),
        compute_capability: Value("12.1".into()),
        persistence_mode: Value(true),
        compute_mode: Value("default".into()),
        memory: GpuMemory {
            source: MemorySource::Unified,
            used_bytes: Value((60.0 + f / 10.0) as u64 * (1 << 30)),
            total_bytes: Value(119 * (1 << 30)),
            process_bytes: Value(58 * (1 << 30)),
        },
        clocks: clocks(1500 + (t % 10) as u32 * 30),
        max_clocks: clocks(3003),
        power_w: Value(40.0 + f % 20.0),
        power_limit_w: Value(100.0),
        energy_j: Value(f * 50.0),
        temperature_c: Value(55 + (t % 7) as u32),
        utilization_gpu_pct: Value(((t * 7) % 100) as u32),
        utilization_mem_pct: Value(40),
        pstate: Value("P0".into()),
        throttle_reasons: Value(if throttle {
            vec!["sw_power_cap".into()]
        } else {
            vec!["gpu_idle".into()]
        }),
        processes: Value(vec![]),
    };
    mxtune::monitor::Sample {
        at: chrono::Utc
            .with_ymd_and_hms(2026, 11, 20, 10, 0, 0)
            .unwrap()
            + chrono::Duration::seconds(t),
        elapsed_s: f,
        gpu: GpuStatus::Available {
            driver_version: Value("580.95.05".into()),
            cuda_driver_version: Value("13.0".into()),
            gpus: vec![gpu],
        },
        host: HostSample {
            cpu_pct: Value(20.0 + (t % 30) as f32),
            cpu_per_core_pct: vec![],
            ram_used_bytes: 60 << 30,
            ram_total_bytes: 119 << 30,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            load: Value([1.0, 1.0, 1.0]),
            process: None,
        },
        server: ServerStatus::Scraped(Box::new(ServerMetrics {
            url: "http://127.0.0.1:8000/metrics".into(),
            kind: ServerKind::Vllm,
            generation_tok_s: Value(50.0 + f % 25.0),
            prompt_tok_s: Value(0.0),
            running: Value((t % 4) as f64),
            waiting: Value(0.0),
            kv_cache_usage: Value(0.3),
            spec_acceptance_rate: mxtune::monitor::Reading::NotSupported,
            spec_mean_acceptance_length: mxtune::monitor::Reading::NotSupported,
            tpot_ms: None,
            prefix_cache_hit_rate: None,
            preemptions: None,
        })),
    }
}

/// A target on two hosts: one panel each, side by side above the charts, the head's samples
/// charted; a host without NVML says why; a host whose monitor failed says so and what to do.
#[test]
fn live_shows_each_host_of_a_two_host_target_side_by_side() {
    use mxtune::monitor::sample::GpuStatus;
    use mxtune::tui::screens::live::HostPanel;
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    app.live.set_hosts(vec![
        HostPanel::new("local", "Ray head, API", true),
        HostPanel::new("spark2", "Ray worker", false),
    ]);
    let waiting = render(&app, 100, 34);
    assert_eq!(
        waiting.matches("waiting for the first sample").count(),
        2,
        "{waiting}"
    );
    let send = |app: &mut App, ev: Event| with_bg(|bg, _| step(app, bg, ev));
    for t in 0..120 {
        send(
            &mut app,
            Event::HostSample {
                host: 0,
                sample: Box::new(sample(t, t == 119)),
            },
        );
        let mut w = sample(t, false);
        w.gpu = GpuStatus::Unavailable {
            reason: "NVML not available: libnvidia-ml.so.1 not found".into(),
        };
        send(
            &mut app,
            Event::HostSample {
                host: 1,
                sample: Box::new(w),
            },
        );
    }
    // A late sample of a panel set that is gone changes nothing.
    send(
        &mut app,
        Event::HostSample {
            host: 2,
            sample: Box::new(sample(500, false)),
        },
    );
    // Only the head's samples are charted.
    assert_eq!(app.live.points.len(), 120);
    let screen = render(&app, 100, 34);
    let both = screen
        .lines()
        .find(|l| l.contains("host local") && l.contains("host spark2"))
        .unwrap_or_else(|| panic!("no line has both panels' titles:\n{screen}"));
    assert!(both.find("host local") < both.find("host spark2"), "{both}");
    for want in [
        "charts of host local (Ray head, API)",
        "NVIDIA GB10  P0",
        "mem 71.0/119.0 GiB unified  headroom 48.0 GiB",
        "THROTTLING: sw_power_cap",
        "GPU: NVML not available: libnvidia-ml.so.1",
        "ram 60.0/119.0 GiB, 59.0 free",
        "tok/s gen",
    ] {
        assert!(screen.contains(want), "{want:?} missing:\n{screen}");
    }
    insta::assert_snapshot!("live_two_hosts_100x34", screen);
    send(
        &mut app,
        Event::HostMonitorError {
            host: 1,
            error: "host spark2 runs mxtune 0.0.9, this is mxtune 0.1.0: the two ends must be the same version; install this one there (docs/multi-host.md)".into(),
        },
    );
    let screen = render(&app, 100, 34);
    assert!(
        screen.contains("monitor of host spark2 failed: host spark2 runs"),
        "{screen}"
    );
    assert!(screen.contains("install this one there"), "{screen}");
    // The other host is still shown.
    assert!(screen.contains("THROTTLING: sw_power_cap"), "{screen}");
    insta::assert_snapshot!("live_two_hosts_one_failed_100x34", screen);
    // Back to one host: the single-host view, charts started over.
    app.live.set_hosts(Vec::new());
    let single = render(&app, 100, 34);
    assert!(!single.contains("host local"), "{single}");
    assert!(single.contains("waiting for the first sample"), "{single}");
}

/// Each host of a two-host target has its own charts: the API host's first (with the
/// server's), then `h` shows the worker's GPU and host charts from its own samples, and back.
/// `h` is in the hint bar and the help only while there are several hosts.
#[test]
fn live_charts_each_host_and_h_switches_between_them() {
    use mxtune::monitor::Reading::Value;
    use mxtune::monitor::sample::{GpuStatus, ServerStatus};
    use mxtune::tui::screens::live::HostPanel;
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    let single = render(&app, 100, 34);
    assert!(!single.contains("h charts of the next host"), "{single}");
    // One host has no `h`: the key changes nothing.
    key(&mut app, KeyCode::Char('h'));
    assert_eq!(render(&app, 100, 34), single);
    app.live.set_hosts(vec![
        HostPanel::new("local", "Ray head, API", true),
        HostPanel::new("spark2", "Ray worker", false),
    ]);
    let send = |app: &mut App, ev: Event| with_bg(|bg, _| step(app, bg, ev));
    for t in 0..120 {
        send(
            &mut app,
            Event::HostSample {
                host: 0,
                sample: Box::new(sample(t, false)),
            },
        );
        // The worker: its own GPU readings (hotter, busier, more memory), no /metrics.
        let mut w = sample(t, false);
        w.server = ServerStatus::NotConfigured;
        if let GpuStatus::Available { gpus, .. } = &mut w.gpu {
            let g = &mut gpus[0];
            g.memory.used_bytes = Value((90 + t as u64 / 20) * (1 << 30));
            g.power_w = Value(80.0 + (t % 5) as f64);
            g.temperature_c = Value(70 + (t % 3) as u32);
            g.clocks.sm_mhz = Value(2400);
        }
        send(
            &mut app,
            Event::HostSample {
                host: 1,
                sample: Box::new(w),
            },
        );
    }
    assert_eq!(app.live.points.len(), 120);
    assert_eq!(app.live.hosts[1].points.len(), 120);
    let head = render(&app, 100, 34);
    for want in [
        "charts of host local (Ray head, API)",
        "tok/s gen",
        "h charts of the next host",
    ] {
        assert!(head.contains(want), "{want:?} missing:\n{head}");
    }
    // The head's charts have two pages here; `h` shows the next host from its first.
    key(&mut app, KeyCode::PageDown);
    assert!(render(&app, 100, 34).contains("charts 2/2"));
    key(&mut app, KeyCode::Char('h'));
    let worker = render(&app, 100, 34);
    for want in [
        "charts of host spark2 (Ray worker)",
        "GPU memory (unified, shared with CPU) used 95.0",
        "clocks sm 2400 MHz",
        "power power 84.0 W",
        "temperature temp 72.0 C",
        "host cpu",
        "h charts of the next host",
    ] {
        assert!(worker.contains(want), "{want:?} missing:\n{worker}");
    }
    // The worker serves no API: no server charts for it.
    assert!(!worker.contains("tok/s gen"), "{worker}");
    // Its six charts fit one page.
    assert!(!worker.contains("charts 1/"), "{worker}");
    insta::assert_snapshot!("live_two_hosts_worker_charts_100x34", worker);
    // `h` again: back to the API host's charts, first page.
    key(&mut app, KeyCode::Char('h'));
    assert_eq!(render(&app, 100, 34), head);
    // The help has Live's `h` while there are several hosts.
    key(&mut app, KeyCode::Char('?'));
    let help = screen_words(&render(&app, 100, 60));
    assert!(
        help.contains(mxtune::tui::keys::LIVE_HOSTS_SECTION),
        "{help}"
    );
    assert!(help.contains("h charts of the next host"), "{help}");
}

#[test]
fn snapshots_live() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    insta::assert_snapshot!("live_empty_80x24", render(&app, 80, 24));
    for t in 0..400 {
        app.live.push(sample(t, false));
    }
    insta::assert_snapshot!("live_80x24", render(&app, 80, 24));
    app.live.push(sample(400, true));
    insta::assert_snapshot!("live_throttled_160x48", render(&app, 160, 48));
}

#[test]
fn live_pages_through_every_chart_on_a_small_terminal() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    for t in 0..100 {
        app.live.push(sample(t, false));
    }
    let titles = [
        "tok/s",
        "GPU memory",
        "clocks",
        "GPU utilisation",
        "power",
        "temperature",
        "host",
        "requests",
        "KV cache / spec acceptance",
    ];
    let mut seen = std::collections::BTreeSet::new();
    let first = render(&app, 80, 24);
    assert!(first.contains("charts 1/3"), "{first}");
    for page in 0..3 {
        let screen = render(&app, 80, 24);
        assert!(
            screen.contains(&format!("charts {}/3", page + 1)),
            "{screen}"
        );
        for t in titles {
            if screen.contains(&format!("╭ {t}")) {
                seen.insert(t);
            }
        }
        key(&mut app, KeyCode::PageDown);
    }
    assert_eq!(seen.len(), titles.len(), "every chart reachable: {seen:?}");
    assert_eq!(app.live.page, 2, "PgDn stops at the last page");
    insta::assert_snapshot!("live_page3_80x24", render(&app, 80, 24));
    key(&mut app, KeyCode::PageUp);
    assert!(render(&app, 80, 24).contains("charts 2/3"));
    // A large terminal shows all nine at once and needs no pages.
    let big = render(&app, 160, 48);
    assert!(!big.contains("charts 1/"), "{big}");
    for t in titles {
        assert!(big.contains(&format!("╭ {t}")), "{t} missing:\n{big}");
    }
}

/// `sample(t, false)` from a server that exports the TPOT histogram and the prefix-cache
/// counters; every 5th second no request finished, so TPOT reads n/a there.
fn sample_with_tpot(t: i64) -> mxtune::monitor::Sample {
    use mxtune::monitor::Reading;
    use mxtune::monitor::sample::ServerStatus;
    let mut s = sample(t, false);
    if let ServerStatus::Scraped(m) = &mut s.server {
        m.tpot_ms = Some(if t % 5 == 4 {
            Reading::NotSupported
        } else {
            Reading::Value(20.0 + (t % 7) as f64)
        });
        m.prefix_cache_hit_rate = Some(Reading::Value(0.4 + (t % 4) as f64 / 10.0));
    }
    s
}

/// A server that exports its pre-emption counter gets the count since the panel started
/// watching on the requests chart's title; one that does not keeps the plain title.
#[test]
fn live_names_the_preemptions_on_the_requests_chart() {
    use mxtune::monitor::Reading;
    use mxtune::monitor::sample::ServerStatus;
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    for t in 0..10 {
        app.live.push(sample(t, false));
    }
    let plain = render(&app, 160, 48);
    assert!(plain.contains("╭ requests"), "{plain}");
    assert!(!plain.contains("pre-empted"), "{plain}");
    let mut s = sample(10, false);
    if let ServerStatus::Scraped(m) = &mut s.server {
        m.preemptions = Some(Reading::Value(3.0));
    }
    app.live.push(s);
    let screen = render(&app, 160, 48);
    assert!(screen.contains("╭ requests · 3 pre-empted"), "{screen}");
}

#[test]
fn live_charts_tpot_and_prefix_hits_only_when_the_server_exports_them() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    for t in 0..100 {
        app.live.push(sample(t, false));
    }
    // A server without the series: no chart, no n/a, nothing to page to.
    let plain = render(&app, 160, 48);
    assert!(!plain.contains("time per output token"), "{plain}");
    assert!(!plain.contains("prefix cache"), "{plain}");
    assert!(!plain.contains("charts 1/"), "{plain}");
    for t in 100..=400 {
        app.live.push(sample_with_tpot(t));
    }
    let p = app.live.points.back().unwrap();
    assert_eq!((p.tpot_ms, p.prefix_hit_pct), (Some(21.0), Some(40.0)));
    // t = 400: 20 + 400 % 7 = 21 ms, beside tok/s on the first page.
    let screen = render(&app, 160, 48);
    assert!(
        screen.contains("time per output token tpot 21.0 ms"),
        "{screen}"
    );
    assert!(screen.contains("charts 1/2"), "{screen}");
    insta::assert_snapshot!("live_tpot_160x48", screen);
    // The prefix-cache chart comes last, on the next page.
    key(&mut app, KeyCode::PageDown);
    let next = render(&app, 160, 48);
    assert!(next.contains("prefix cache hits 40.0 %"), "{next}");
}

#[test]
fn live_window_and_freeze() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    for t in 0..100 {
        app.live.push(sample(t, false));
    }
    assert_eq!(app.live.window_s(), 300);
    key(&mut app, KeyCode::Char('-'));
    key(&mut app, KeyCode::Char('-'));
    key(&mut app, KeyCode::Char('-'));
    assert_eq!(app.live.window_s(), 30);
    key(&mut app, KeyCode::Char('-'));
    assert_eq!(app.live.window_s(), 30, "30 s is the shortest");
    for _ in 0..9 {
        key(&mut app, KeyCode::Char('+'));
    }
    assert_eq!(app.live.window_s(), 1800, "30 min is the longest");

    key(&mut app, KeyCode::Char('f'));
    let frozen = render(&app, 120, 40);
    assert!(frozen.contains("FROZEN"), "{frozen}");
    // Samples keep arriving while frozen, but the picture does not move.
    let (_, redraw) =
        with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(100, true)))));
    assert!(!redraw, "a frozen view is not redrawn for new samples");
    assert_eq!(app.live.points.len(), 101, "collection continues");
    assert!(!render(&app, 120, 40).contains("THROTTLING") || app.live.frozen_at.is_some());
    key(&mut app, KeyCode::Char('f'));
    let (_, redraw) =
        with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(101, true)))));
    assert!(redraw);
    assert!(render(&app, 120, 40).contains("THROTTLING: sw_power_cap"));
    // Elsewhere, samples do not cause redraws either.
    key(&mut app, KeyCode::Char('1'));
    let (_, redraw) =
        with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(102, false)))));
    assert!(!redraw);
}

// ---- Bench ----

fn stats(mean: f64, std: f64) -> Option<Stats> {
    Some(Stats {
        n: 5,
        mean,
        std,
        min: mean - std,
        max: mean + std,
    })
}

fn fixed_row(pp: u32, depth: u32, c: u32, tg_tps: f64) -> ResultRow {
    ResultRow {
        point: WorkloadPoint {
            pp,
            tg: 32,
            depth,
            concurrency: c,
        },
        pp_tps: stats(1843.2, 12.5),
        tg_tps: stats(tg_tps, 0.42),
        ttfr_ms: stats(1111.4, 8.1),
        e2e_ttft_ms: stats(1120.9, 8.3),
        tpot_ms: stats(21.7, 0.3),
        requests: 5 * c,
        errors: 0,
        partial: false,
    }
}

/// A target that is ready, and a grid of four points with two finished.
fn fixed_bench_running(app: &mut App) {
    app.launch.state = TargetState::Ready {
        url: "http://127.0.0.1:8000".into(),
        startup_s: 2.5,
    };
    app.tab = Tab::Bench;
    app.bench.values[0] = "512,2048".into();
    app.bench.values[2] = "0,4096".into();
    let mut run = BenchRun::new("http://127.0.0.1:8000", 5, 1);
    run.points = 4;
    run.rows = vec![fixed_row(512, 0, 1, 46.1), fixed_row(2048, 0, 1, 45.3)];
    run.current = Some((
        2,
        WorkloadPoint {
            pp: 512,
            tg: 32,
            depth: 4096,
            concurrency: 1,
        },
    ));
    run.done_in_point = 3;
    run.phase = "measuring".into();
    app.bench.run = Some(run);
}

#[test]
fn snapshots_bench() {
    // Idle, no target: the screen and the hint bar say so.
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('4'));
    let idle = render(&app, 80, 24);
    assert!(idle.contains("no target running"), "{idle}");
    insta::assert_snapshot!("bench_idle_80x24", idle);
    insta::assert_snapshot!("bench_idle_160x48", render(&app, 160, 48));

    // Running, two of four points finished.
    fixed_bench_running(&mut app);
    let running = render(&app, 80, 24);
    assert!(running.contains("point 3/4  run 3/5"), "{running}");
    insta::assert_snapshot!("bench_running_80x24", running);
    insta::assert_snapshot!("bench_running_160x48", render(&app, 160, 48));

    // Finished and saved.
    let run = app.bench.run.as_mut().unwrap();
    run.rows.push(fixed_row(512, 4096, 1, 41.0));
    run.rows.push(fixed_row(2048, 4096, 4, 150.2));
    run.current = None;
    run.state = RunState::Finished {
        aborted: false,
        passed: true,
    };
    run.phase = "done".into();
    run.record = Some(PathBuf::from("runs/01JD0000000000000000000009.json"));
    insta::assert_snapshot!("bench_finished_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("bench_finished_160x48", render(&app, 160, 48));
}

#[test]
fn bench_form_validates_and_starts_and_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('4'));
    // No target: r explains what to do instead of starting anything.
    assert!(
        app.bench
            .on_key(press(KeyCode::Char('r')), None, dir.path())
            .is_empty()
    );
    assert!(
        app.bench
            .error
            .as_deref()
            .unwrap()
            .contains("Launch screen")
    );

    // Level cycles on the first row.
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.bench.level, mxtune::bench::levels::Level::Correctness);
    key(&mut app, KeyCode::Left);
    assert_eq!(app.bench.level, mxtune::bench::levels::Level::Performance);

    // pp: type a list; a bad number is refused inline and the field stays open.
    key(&mut app, KeyCode::Down);
    key(&mut app, KeyCode::Enter);
    assert!(app.bench.captures_keys());
    for _ in 0..10 {
        key(&mut app, KeyCode::Backspace);
    }
    type_str(&mut app, "128,x9");
    key(&mut app, KeyCode::Enter);
    let err = app.bench.error.clone().unwrap();
    assert!(err.contains("pp") && err.contains("'x9'"), "{err}");
    assert!(
        app.bench.captures_keys(),
        "a bad value keeps the field open"
    );
    assert!(render(&app, 80, 24).contains("'x9' is not a whole number"));
    // q while typing is text, not quit.
    assert_eq!(key(&mut app, KeyCode::Char('q')), None);
    key(&mut app, KeyCode::Backspace);
    key(&mut app, KeyCode::Backspace);
    key(&mut app, KeyCode::Backspace);
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.bench.values[0], "128");
    assert!(app.bench.error.is_none());

    // runs: zero runs are accepted as a number but refused when starting.
    for _ in 0..4 {
        key(&mut app, KeyCode::Down);
    }
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Backspace);
    type_str(&mut app, "0");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.bench.values[4], "0");
    app.launch.state = TargetState::Ready {
        url: "http://127.0.0.1:9".into(),
        startup_s: 1.0,
    };
    let effects = app.on_key(press(KeyCode::Char('r')));
    assert!(effects.is_empty());
    assert!(app.bench.error.as_deref().unwrap().contains("--runs"));
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Backspace);
    type_str(&mut app, "3");
    key(&mut app, KeyCode::Enter);

    // r starts: the effect carries `mxtune bench --record` options from the form.
    let effects = app.on_key(press(KeyCode::Char('r')));
    let [Effect::StartBench(args)] = effects.as_slice() else {
        panic!(
            "expected StartBench, got {effects:?}; error {:?}",
            app.bench.error
        );
    };
    assert_eq!(args.url, "http://127.0.0.1:9");
    assert_eq!((args.pp.clone(), args.runs), (vec![128], 3));
    assert!(args.record);
    assert_eq!(args.runs_dir, dir.path().join("runs"));
    assert!(app.bench.is_running());
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::BENCH_RUNNING
    );
    // r again does not start a second one; Esc cancels at once, asking nothing.
    assert!(app.on_key(press(KeyCode::Char('r'))).is_empty());
    assert_eq!(app.on_key(press(KeyCode::Esc)), vec![Effect::CancelBench]);
    assert_eq!(app.bench.run.as_ref().unwrap().state, RunState::Cancelling);
}

#[test]
fn bench_tokens_feed_the_live_tok_s_chart() {
    use mxtune::bench::workload::BenchEvent;
    use mxtune::tui::background::BenchMsg;
    let mut app = snapshot_app(theme());
    fixed_bench_running(&mut app);
    let done = |tokens| {
        Event::Bench(BenchMsg::Progress(BenchEvent::RequestDone {
            index: 2,
            warmup: false,
            tokens,
            error: None,
        }))
    };
    with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(100, false)))));
    assert_eq!(app.live.points.back().unwrap().bench_tok_s, None);
    for _ in 0..3 {
        with_bg(|bg, _| step(&mut app, bg, done(32)));
    }
    // Requests finished in the point move the run counter too.
    assert_eq!(app.bench.run.as_ref().unwrap().done_in_point, 6);
    with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(102, false)))));
    // 96 tokens over the 2 s between samples.
    assert_eq!(app.live.points.back().unwrap().bench_tok_s, Some(48.0));
    key(&mut app, KeyCode::Char('3'));
    assert!(render(&app, 120, 40).contains("bench 48.0 tok/s"));
    // While the bench runs, a quiet interval charts zero; after it ends, nothing.
    with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(103, false)))));
    assert_eq!(app.live.points.back().unwrap().bench_tok_s, Some(0.0));
    app.live.bench_ended();
    with_bg(|bg, _| step(&mut app, bg, Event::Sample(Box::new(sample(104, false)))));
    assert_eq!(app.live.points.back().unwrap().bench_tok_s, None);
}

fn press(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

/// The vLLM-like streaming double, on its own runtime thread; runs until the process ends.
fn streaming_double() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let d = vllm_double::spawn(vllm_double::Script::default()).await;
            tx.send(d.url.clone()).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// Attach the panel to `url` the way an operator does on the Launch screen.
fn attach(app: &mut App, url: &str) {
    key(app, KeyCode::Char('2'));
    key(app, KeyCode::Char('u'));
    for _ in 0..app.launch.url.len() {
        key(app, KeyCode::Backspace);
    }
    type_str(app, url);
    key(app, KeyCode::Enter);
    key(app, KeyCode::Char('l'));
    pump_until(app, "ready", |a| {
        matches!(a.launch.state, TargetState::Ready { .. })
    });
}

fn set_field(app: &mut App, row: usize, value: &str) {
    app.bench.selected = row;
    key(app, KeyCode::Enter);
    for _ in 0..20 {
        key(app, KeyCode::Backspace);
    }
    type_str(app, value);
    key(app, KeyCode::Enter);
    assert!(app.bench.error.is_none(), "{:?}", app.bench.error);
}

#[test]
fn bench_runs_against_a_server_and_saves_the_record() {
    let url = streaming_double();
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    attach(&mut app, &url);
    key(&mut app, KeyCode::Char('4'));
    set_field(&mut app, 1, "64,128");
    set_field(&mut app, 2, "4");
    set_field(&mut app, 5, "2");
    key(&mut app, KeyCode::Char('r'));
    pump_until(&mut app, "bench finished", |a| {
        matches!(
            a.bench.run.as_ref().map(|r| &r.state),
            Some(RunState::Finished { .. }) | Some(RunState::Failed(_))
        )
    });
    let run = app.bench.run.clone().unwrap();
    assert_eq!(
        run.state,
        RunState::Finished {
            aborted: false,
            passed: true
        },
        "{run:?}"
    );
    assert_eq!(run.rows.len(), 2);
    assert!(run.rows.iter().all(|r| r.tg_tps.is_some()));
    // The record is the one `mxtune bench --record` writes, complete, with both points.
    let path = run.record.clone().expect("record path");
    assert!(path.starts_with(dir.path().join("runs")), "{path:?}");
    let rec = RunStore::new(dir.path().join("runs"));
    let scan = rec.scan().unwrap();
    let saved = scan
        .runs
        .iter()
        .find(|r| r.path == path)
        .expect("the record is in the runs dir");
    assert_eq!(saved.record.identity.status, RunStatus::Completed);
    assert_eq!(saved.record.results.len(), 2);
    assert!(render(&app, 80, 24).contains(&run.record.unwrap().display().to_string()[..20]));
    // The Live screen got client-side tokens while it ran.
    assert!(!app.live.bench_running);
}

#[test]
fn bench_cancel_keeps_an_aborted_record() {
    let url = streaming_double();
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    attach(&mut app, &url);
    key(&mut app, KeyCode::Char('4'));
    set_field(&mut app, 1, "64");
    set_field(&mut app, 2, "512");
    set_field(&mut app, 5, "1000");
    key(&mut app, KeyCode::Char('r'));
    pump_until(&mut app, "requests flowing", |a| {
        a.bench.run.as_ref().is_some_and(|r| r.done_in_point > 0)
    });
    key(&mut app, KeyCode::Esc);
    pump_until(&mut app, "bench ended", |a| {
        matches!(
            a.bench.run.as_ref().map(|r| &r.state),
            Some(RunState::Finished { .. })
        )
    });
    let run = app.bench.run.clone().unwrap();
    assert!(matches!(
        run.state,
        RunState::Finished { aborted: true, .. }
    ));
    let path = run.record.expect("record path");
    let text = std::fs::read_to_string(&path).unwrap();
    let rec: RunRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(rec.identity.status, RunStatus::Aborted);
    assert!(text.contains("cancelled from the panel"), "{text}");
}

// ---- Docs ----

#[test]
fn docs_list_every_binding() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tui.md"))
        .expect("docs/tui.md");
    let generated = mxtune::tui::keys::markdown();
    assert!(
        doc.contains(generated.trim_end()),
        "docs/tui.md is out of date with src/tui/keys.rs; replace its bindings section with:\n\n{generated}"
    );
}

// ---- Matrix view and quick A/B ----

use mxtune::matrix::ab::{AbOutcome, AbResult, Ratio};
use mxtune::matrix::cli::MatrixOutcome;
use mxtune::matrix::plan::TestLevel;
use mxtune::matrix::progress::MatrixEvent;
use mxtune::matrix::state::{LevelOutcome, PresetStatus};
use mxtune::tui::background::MatrixMsg;
use mxtune::tui::screens::matrix::{BenchView, JobState};

/// Keys straight into the App, returning the effects instead of performing them.
fn hit(app: &mut App, code: KeyCode) -> Vec<Effect> {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn tiny_point(pp: u32, tg: u32) -> WorkloadPoint {
    WorkloadPoint {
        pp,
        tg,
        depth: 0,
        concurrency: 1,
    }
}

fn lvl(level: TestLevel, verdict: &str, detail: &str) -> LevelOutcome {
    LevelOutcome {
        level,
        verdict: verdict.into(),
        detail: detail.into(),
    }
}

#[test]
fn matrix_view_keys_choose_presets_levels_target_and_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    key(&mut app, KeyCode::Char('4'));
    // m opens the view and lists the store's presets (performed through the runtime).
    key(&mut app, KeyCode::Char('m'));
    assert_eq!(app.bench.view, BenchView::Matrix);
    let presets = app.bench.matrix.presets.clone();
    assert!(presets.len() >= 2, "{presets:?}");
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::MATRIX
    );
    // r with nothing chosen says what to do.
    assert!(hit(&mut app, KeyCode::Char('r')).is_empty());
    assert!(
        app.bench
            .matrix
            .error
            .as_deref()
            .unwrap()
            .contains("choose presets"),
        "{:?}",
        app.bench.matrix.error
    );
    // Choose the second, then the first: the order chosen is kept (first = baseline).
    hit(&mut app, KeyCode::Down);
    hit(&mut app, KeyCode::Char(' '));
    hit(&mut app, KeyCode::Up);
    hit(&mut app, KeyCode::Enter);
    assert_eq!(
        app.bench.matrix.chosen,
        vec![presets[1].clone(), presets[0].clone()]
    );
    // Enter again unchooses; Space chooses again (now last).
    hit(&mut app, KeyCode::Enter);
    hit(&mut app, KeyCode::Char(' '));
    assert_eq!(
        app.bench.matrix.chosen,
        vec![presets[1].clone(), presets[0].clone()]
    );
    // Levels: a bad list is refused inline and the field stays open; a good one is taken.
    assert_eq!(app.bench.matrix.levels, "1,1.5,2,4,5");
    hit(&mut app, KeyCode::Char('l'));
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::BENCH_INPUT
    );
    for _ in 0..20 {
        hit(&mut app, KeyCode::Backspace);
    }
    for c in "1,7".chars() {
        // q and digits go to the field, not to quit or tab switching.
        hit(&mut app, KeyCode::Char(c));
    }
    hit(&mut app, KeyCode::Enter);
    assert!(app.bench.matrix.editing.is_some());
    assert!(app.bench.matrix.error.is_some());
    hit(&mut app, KeyCode::Backspace);
    for c in "1.5,4".chars() {
        hit(&mut app, KeyCode::Char(c));
    }
    hit(&mut app, KeyCode::Enter);
    assert_eq!(app.bench.matrix.editing, None);
    assert_eq!(app.bench.matrix.levels, "1,1.5,4");
    assert_eq!(app.tab, Tab::Bench);
    // The attach target cannot run a matrix: r says to choose engine or docker.
    app.launch.choice = mxtune::vocab::TargetKind::Attach;
    assert!(hit(&mut app, KeyCode::Char('r')).is_empty());
    assert!(
        app.bench
            .matrix
            .error
            .as_deref()
            .unwrap()
            .contains("engine or docker"),
        "{:?}",
        app.bench.matrix.error
    );
    // Engine: r asks for the matrix of the chosen presets, levels, form grid and target.
    app.launch.choice = mxtune::vocab::TargetKind::Engine;
    app.bench.values[0] = "64".into();
    app.bench.values[1] = "4,8".into();
    let effects = hit(&mut app, KeyCode::Char('r'));
    let [Effect::StartMatrix(args)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(args.presets, vec![presets[1].clone(), presets[0].clone()]);
    assert_eq!(args.levels, "1,1.5,4");
    assert!(!args.resume);
    assert_eq!(args.common.target, mxtune::launch::cli::TargetArg::Engine);
    assert_eq!(args.common.runs_dir, dir.path().join("runs"));
    assert_eq!(args.common.presets_dir, Some(dir.path().join("presets")));
    assert!(args.common.grid.contains(&"pp=64".to_string()));
    assert!(args.common.grid.contains(&"tg=4,8".to_string()));
    // Esc leaves the view when nothing runs.
    hit(&mut app, KeyCode::Esc);
    assert_eq!(app.bench.view, BenchView::Form);
}

/// A matrix run in progress: one preset done, one running at its second L4 point.
fn fixed_matrix_running(app: &mut App) {
    app.tab = Tab::Bench;
    app.bench.view = BenchView::Matrix;
    app.bench.matrix.on_preset_list(vec![
        "engine-cpu-tiny".into(),
        "tiny-fp8".into(),
        "tiny-graphs".into(),
    ]);
    app.bench.matrix.chosen = vec!["engine-cpu-tiny".into(), "tiny-graphs".into()];
    app.bench.matrix.levels = "1,1.5,4,5".into();
    let args = mxtune::matrix::cli::MatrixArgs {
        presets: app.bench.matrix.chosen.clone(),
        levels: "1,1.5,4,5".into(),
        out: PathBuf::from("runs/matrix/20260101-000000"),
        resume: false,
        seed: None,
        no_shuffle: false,
        tolerance_pct: 5.0,
        common: mxtune::tui::screens::matrix::common_args(app, mxtune::vocab::TargetKind::Engine)
            .unwrap(),
    };
    app.bench.matrix.on_started(&args);
    let events = vec![
        MatrixEvent::Planned {
            matrix_id: "01JD0000000000000000000000".into(),
            order: vec!["tiny-graphs".into(), "engine-cpu-tiny".into()],
            seed: Some(7),
            state: PathBuf::from("runs/matrix/20260101-000000/matrix-state.json"),
        },
        MatrixEvent::PresetStarted {
            name: "tiny-graphs".into(),
            index: 0,
            total: 2,
        },
        MatrixEvent::Ready {
            preset: "tiny-graphs".into(),
            startup_s: 1.2,
        },
        MatrixEvent::PresetFinished {
            name: "tiny-graphs".into(),
            status: PresetStatus::Done,
            record: Some(PathBuf::from("runs/01JD0000000000000000000001.json")),
            levels: vec![
                lvl(TestLevel::Smoke, "pass", "ready after 1.2 s"),
                lvl(TestLevel::KernelPath, "pass", "graphs=on: valid"),
                lvl(
                    TestLevel::Performance,
                    "fail",
                    "pp64 tg4: 2 of 2 requests failed",
                ),
                lvl(TestLevel::Regression, "no baseline", "no earlier record"),
            ],
        },
        MatrixEvent::PresetStarted {
            name: "engine-cpu-tiny".into(),
            index: 1,
            total: 2,
        },
        MatrixEvent::TargetPhase {
            preset: "engine-cpu-tiny".into(),
            phase: "loading".into(),
        },
        MatrixEvent::Ready {
            preset: "engine-cpu-tiny".into(),
            startup_s: 0.8,
        },
        MatrixEvent::PointStarted {
            preset: "engine-cpu-tiny".into(),
            index: 1,
            total: 2,
            point: tiny_point(64, 8),
        },
    ];
    for e in events {
        app.on_matrix(MatrixMsg::Progress(e));
    }
}

#[test]
fn matrix_events_update_the_view_and_esc_cancels_resumably() {
    let mut app = snapshot_app(theme());
    fixed_matrix_running(&mut app);
    let run = app.bench.matrix.run.clone().unwrap();
    assert_eq!(run.matrix_id, "01JD0000000000000000000000");
    // Rows follow the run order of the plan, not the order chosen.
    let names: Vec<&str> = run.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["tiny-graphs", "engine-cpu-tiny"]);
    assert_eq!(run.rows[0].status, PresetStatus::Done);
    assert_eq!(run.rows[0].levels.len(), 4);
    assert_eq!(run.rows[1].status, PresetStatus::Running);
    assert_eq!(run.rows[1].phase, "L4 point 2/2 pp64 tg8 c1");
    assert_eq!(
        run.levels,
        [
            TestLevel::Smoke,
            TestLevel::KernelPath,
            TestLevel::Performance,
            TestLevel::Regression
        ]
    );
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::MATRIX_RUNNING
    );
    // The Launch screen will not start a target beside the matrix's own.
    key(&mut app, KeyCode::Char('2'));
    assert!(hit(&mut app, KeyCode::Char('l')).is_empty());
    assert!(
        app.message
            .as_deref()
            .unwrap()
            .contains("matrix or A/B is running"),
        "{:?}",
        app.message
    );
    key(&mut app, KeyCode::Char('4'));
    assert_eq!(app.bench.view, BenchView::Matrix);
    // Keys other than Esc do nothing while it runs; Esc cancels.
    assert!(hit(&mut app, KeyCode::Char('r')).is_empty());
    assert_eq!(hit(&mut app, KeyCode::Esc), vec![Effect::CancelMatrix]);
    assert_eq!(
        app.bench.matrix.run.as_ref().unwrap().state,
        JobState::Cancelling
    );
    // The runner stops the target and reports the preset interrupted, then the outcome.
    app.on_matrix(MatrixMsg::Progress(MatrixEvent::PresetFinished {
        name: "engine-cpu-tiny".into(),
        status: PresetStatus::Interrupted,
        record: Some(PathBuf::from("runs/01JD0000000000000000000002.json")),
        levels: vec![lvl(TestLevel::Smoke, "pass", "ready")],
    }));
    let effects = app.on_matrix(MatrixMsg::MatrixDone(Ok(MatrixOutcome {
        matrix_id: "01JD0000000000000000000000".into(),
        out: PathBuf::from("runs/matrix/20260101-000000"),
        report: PathBuf::from("runs/matrix/20260101-000000/report.md"),
        interrupted: true,
        all_pass: false,
    })));
    assert_eq!(effects, vec![Effect::ReloadRuns]);
    let run = app.bench.matrix.run.clone().unwrap();
    assert_eq!(
        run.state,
        JobState::Finished {
            interrupted: true,
            passed: false
        }
    );
    assert_eq!(run.rows[1].status, PresetStatus::Interrupted);
    assert!(
        app.message
            .as_deref()
            .unwrap()
            .contains("mxtune matrix --resume --out runs/matrix/20260101-000000"),
        "{:?}",
        app.message
    );
    let screen = render(&app, 80, 24);
    assert!(
        screen.contains("resume: mxtune matrix --resume"),
        "{screen}"
    );
    // Esc now leaves the view.
    hit(&mut app, KeyCode::Esc);
    assert_eq!(app.bench.view, BenchView::Form);
}

#[test]
fn snapshots_matrix_view() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('4'));
    app.bench.view = BenchView::Matrix;
    app.bench.matrix.on_preset_list(vec![
        "engine-cpu-tiny".into(),
        "tiny-fp8".into(),
        "tiny-graphs".into(),
    ]);
    insta::assert_snapshot!("matrix_idle_80x24", render(&app, 80, 24));
    fixed_matrix_running(&mut app);
    let running = render(&app, 80, 24);
    assert!(running.contains("L4 point 2/2"), "{running}");
    insta::assert_snapshot!("matrix_running_80x24", running);
    insta::assert_snapshot!("matrix_running_160x48", render(&app, 160, 48));
}

fn ratio(metric: &str, rounds: &[f64]) -> Ratio {
    let (mean, std) = mxtune::matrix::ab::mean_std(rounds);
    Ratio {
        point: tiny_point(64, 4),
        metric: metric.into(),
        rounds: rounds.to_vec(),
        mean,
        std,
    }
}

#[test]
fn quick_ab_marks_a_and_runs_against_the_current_flags() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    app.launch.choice = mxtune::vocab::TargetKind::Engine;
    app.flags.flags.target = mxtune::vocab::TargetKind::Engine;
    key(&mut app, KeyCode::Char('4'));
    // Nothing marked: A says how to mark.
    assert!(hit(&mut app, KeyCode::Char('A')).is_empty());
    assert!(app.message.as_deref().unwrap().contains("press a"));
    // Mark on the Flags screen: the status line shows A.
    key(&mut app, KeyCode::Char('1'));
    hit(&mut app, KeyCode::Char('a'));
    let marked = app.ab_mark.clone().expect("marked");
    assert_eq!(*marked.flags, app.flags.flags);
    assert!(app.message.as_deref().unwrap().contains("as A"));
    app.message = None;
    let status = render(&app, 160, 48);
    assert!(status.contains("A engine-cpu-tiny (= now)"), "{status}");
    // Unchanged flags: A refuses.
    key(&mut app, KeyCode::Char('4'));
    assert!(hit(&mut app, KeyCode::Char('A')).is_empty());
    assert!(app.message.as_deref().unwrap().contains("change a flag"));
    // Change a flag, then A asks for the A/B of the marked flags against the current ones.
    key(&mut app, KeyCode::Char('1'));
    let before = app.flags.flags.clone();
    let mut tries = 0;
    while app.flags.flags == before && tries < 40 {
        hit(&mut app, KeyCode::Right);
        if app.flags.flags == before {
            hit(&mut app, KeyCode::Down);
        }
        tries += 1;
    }
    assert_ne!(app.flags.flags, before, "no flag could be changed");
    app.message = None;
    let status = render(&app, 160, 48);
    assert!(status.contains("A engine-cpu-tiny"), "{status}");
    assert!(!status.contains("(= now)"), "{status}");
    key(&mut app, KeyCode::Char('4'));
    // A opens the A/B view: what will run, its rounds and noise threshold; nothing runs yet.
    assert!(hit(&mut app, KeyCode::Char('A')).is_empty());
    assert_eq!(app.bench.view, BenchView::Ab);
    assert_eq!(mxtune::tui::screens::bindings(&app), mxtune::tui::keys::AB);
    let setup = render(&app, 80, 24);
    assert!(
        setup.contains("A engine-cpu-tiny  vs  B engine-cpu-tiny*"),
        "{setup}"
    );
    assert!(
        setup.contains("rounds 3 (r)  noise threshold 2·std (n)"),
        "{setup}"
    );
    insta::assert_snapshot!("ab_setup_80x24", setup);
    // r: rounds. Out of range is refused inline and the field stays open.
    hit(&mut app, KeyCode::Char('r'));
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::VALUE_INPUT
    );
    hit(&mut app, KeyCode::Backspace);
    hit(&mut app, KeyCode::Char('0'));
    assert!(hit(&mut app, KeyCode::Enter).is_empty());
    assert_eq!(app.bench.ab.rounds, 3);
    let refused = render(&app, 80, 24);
    assert!(
        refused.contains("rounds `0`: give a whole number from 1 to 100"),
        "{refused}"
    );
    hit(&mut app, KeyCode::Backspace);
    hit(&mut app, KeyCode::Char('5'));
    hit(&mut app, KeyCode::Enter);
    assert_eq!(app.bench.ab.rounds, 5);
    assert_eq!(app.bench.ab.editing, None);
    // n: the noise threshold, in standard deviations.
    hit(&mut app, KeyCode::Char('n'));
    hit(&mut app, KeyCode::Backspace);
    for c in "1.5".chars() {
        hit(&mut app, KeyCode::Char(c));
    }
    hit(&mut app, KeyCode::Enter);
    assert_eq!(app.noise_sigmas, 1.5);
    assert!(
        render(&app, 80, 24).contains("rounds 5 (r)  noise threshold 1.5·std (n)"),
        "{}",
        render(&app, 80, 24)
    );
    // A (or Enter) runs it with those settings.
    let effects = hit(&mut app, KeyCode::Char('A'));
    let [Effect::StartAb(req)] = effects.as_slice() else {
        panic!("{effects:?} {:?}", app.message);
    };
    assert_eq!(*req.a, before);
    assert_eq!(*req.b, app.flags.flags);
    assert_eq!(req.kind, mxtune::vocab::TargetKind::Engine);
    assert_eq!(req.a_label, "engine-cpu-tiny");
    assert_eq!(req.b_label, "engine-cpu-tiny*");
    assert_eq!((req.rounds, req.noise), (5, 1.5));
    assert_eq!(app.bench.ab.run.as_ref().unwrap().rounds, 5);
    assert_eq!(app.bench.view, BenchView::Ab);
    assert_eq!(
        mxtune::tui::screens::bindings(&app),
        mxtune::tui::keys::AB_RUNNING
    );
    // Progress: rounds and the ratios so far.
    app.on_matrix(MatrixMsg::Progress(MatrixEvent::AbRound {
        round: 2,
        rounds: 3,
    }));
    app.on_matrix(MatrixMsg::Progress(MatrixEvent::AbRatios {
        valid_rounds: 1,
        ratios: vec![ratio("tg t/s", &[1.1])],
    }));
    let r = app.bench.ab.run.clone().unwrap();
    assert_eq!((r.round, r.rounds, r.valid_rounds), (2, 3, 1));
    assert_eq!(r.ratios.len(), 1);
    // Esc cancels.
    assert_eq!(hit(&mut app, KeyCode::Esc), vec![Effect::CancelMatrix]);
    assert_eq!(
        app.bench.ab.run.as_ref().unwrap().state,
        JobState::Cancelling
    );
}

#[test]
fn quick_ab_refuses_an_attach_target() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    // Attach cannot run an A/B.
    app.launch.choice = mxtune::vocab::TargetKind::Attach;
    key(&mut app, KeyCode::Char('4'));
    hit(&mut app, KeyCode::Char('a'));
    app.flags.flags.serving.max_num_seqs = Some(3);
    assert!(hit(&mut app, KeyCode::Char('A')).is_empty());
    assert!(
        app.message.as_deref().unwrap().contains("engine or docker"),
        "{:?}",
        app.message
    );
    assert_eq!(app.bench.view, BenchView::Form);
}

fn fixed_ab_finished(app: &mut App) {
    app.tab = Tab::Bench;
    app.bench.view = BenchView::Ab;
    app.bench.ab.run = Some(mxtune::tui::screens::matrix::AbRun {
        a: "engine-cpu-tiny".into(),
        b: "engine-cpu-tiny*".into(),
        rounds: 3,
        round: 3,
        phase: String::new(),
        valid_rounds: 0,
        ratios: Vec::new(),
        state: JobState::Running,
        out: Some(PathBuf::from("runs/ab/20260101-000000")),
        md: None,
        excluded: Vec::new(),
    });
    let result = AbResult {
        a: "a".into(),
        b: "b".into(),
        rounds: 3,
        reused: false,
        host: None,
        records: Vec::new(),
        excluded: vec!["round 2: quick-ab-b: not ready: watchdog".into()],
        ratios: vec![
            ratio("pp t/s", &[1.02, 0.98]),
            ratio("tg t/s", &[1.21, 1.19]),
            ratio("TTFT p50 ms", &[0.90, 0.88]),
            ratio("E2EL p50 ms", &[1.01]),
        ],
        noise: 2.0,
    };
    app.on_matrix(MatrixMsg::AbDone(Ok(Box::new(AbOutcome {
        result,
        valid_rounds: 2,
        interrupted: false,
        markdown: String::new(),
        md: PathBuf::from("runs/ab/20260101-000000/ab.md"),
        json: PathBuf::from("runs/ab/20260101-000000/ab.json"),
    }))));
}

#[test]
fn snapshots_quick_ab_result() {
    let mut app = snapshot_app(theme());
    fixed_ab_finished(&mut app);
    let r = app.bench.ab.run.clone().unwrap();
    assert_eq!(
        r.state,
        JobState::Finished {
            interrupted: false,
            passed: true
        }
    );
    assert_eq!(mxtune::tui::screens::bindings(&app), mxtune::tui::keys::AB);
    let small = render(&app, 80, 24);
    assert!(small.contains("1.200"), "{small}");
    // Every ratio carries its noise hint: pp 1.000 ± 0.028 is within 2·std, tg 1.200 ±
    // 0.014 and TTFT 0.890 ± 0.014 beyond it, one round has no spread.
    let hints: Vec<&str> = small
        .lines()
        .filter(|l| l.contains("pp64 tg4 c1"))
        .map(|l| {
            ["within noise", "beyond noise", "noise unknown"]
                .into_iter()
                .find(|h| l.contains(h))
                .unwrap_or("none")
        })
        .collect();
    assert_eq!(
        hints,
        [
            "within noise",
            "beyond noise",
            "beyond noise",
            "noise unknown"
        ],
        "{small}"
    );
    insta::assert_snapshot!("ab_result_80x24", small);
    insta::assert_snapshot!("ab_result_160x48", render(&app, 160, 48));
}

#[test]
fn upstream_preset_toggles_moe_backend_in_upstreams_own_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    run_effect(&mut app, Effect::LoadPreset("upstream-marlin".into()));
    assert_eq!(app.flags.loaded.as_ref().unwrap().name, "upstream-marlin");
    let lines = |app: &App| mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    let marlin = lines(&app);
    assert!(
        marlin.iter().any(|l| l.contains("VLLM_MXFP4_USE_MARLIN=1")),
        "{marlin:#?}"
    );
    assert!(
        marlin
            .iter()
            .any(|l| l
                .starts_with("# kernel-path moe_backend=marlin: see Using '?(BATCHED_)?MARLIN")),
        "{marlin:#?}"
    );
    // Row 0 is moe_backend: Enter walks every value a stock image can express, and only those.
    let mut seen = Vec::new();
    for _ in 0..5 {
        key(&mut app, KeyCode::Enter);
        let v = app.flags.flags.axis_value("moe_backend").unwrap();
        seen.push(v);
        let now = lines(&app);
        assert!(
            !now.iter().any(|l| l.starts_with("# warning")),
            "{v}: {now:#?}"
        );
        assert!(
            !now.iter().any(|l| l.contains("VLLM_MXFP4_BACKEND")),
            "{v}: {now:#?}"
        );
        assert!(
            app.flags
                .findings()
                .iter()
                .all(|f| f.rule != "not-in-upstream-dialect"),
            "{v}"
        );
        if v == "cutlass" {
            assert!(
                now.iter()
                    .any(|l| l.contains("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS=1")),
                "{now:#?}"
            );
            assert!(!now.iter().any(|l| l.contains("VLLM_MXFP4_USE_MARLIN=1")));
            assert!(
                now.iter()
                    .any(|l| l.starts_with("# kernel-path moe_backend=cutlass")
                        && l.contains("FLASHINFER_CUTLASS_MXFP4_MXFP8")),
                "{now:#?}"
            );
            key(&mut app, KeyCode::Char('c'));
            let screen = render(&app, 160, 48);
            key(&mut app, KeyCode::Esc);
            assert!(
                screen.contains("MXFP4_MXFP8_CUTLASS=1"),
                "the command view shows it: {screen}"
            );
        }
    }
    assert_eq!(
        seen,
        ["cutlass", "trtllm", "trtllm-mxfp8", "auto", "marlin"]
    );
}

#[test]
fn flags_docs_wrap_at_80x24_instead_of_being_cut() {
    let collapse = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut app = snapshot_app(theme());
    for (i, info) in mxtune::flags::axes::all_axes().iter().enumerate() {
        app.flags.selected = i;
        // TestBackend quotes each row; the quotes are not on the screen.
        let rows: Vec<String> = render(&app, 80, 24)
            .lines()
            .map(|l| l.trim_matches('"').to_string())
            .collect();
        let screen = collapse(&rows.join("\n"));
        let v = app.flags.flags.axis_value(info.key).unwrap_or(info.default);
        let vdoc = info
            .values
            .iter()
            .find(|(n, _, _)| *n == v)
            .map(|(_, d, _)| *d)
            .unwrap();
        for text in [
            format!("{}: {}", info.key, info.doc),
            format!("{v}: {vdoc}"),
        ] {
            assert!(
                screen.contains(&collapse(&text)),
                "row {i}: {text:?} is not whole on screen:\n{}",
                render(&app, 80, 24)
            );
        }
    }
}

/// The words of a rendered screen, rows joined, borders and runs of spaces collapsed, so a
/// text that wraps onto several rows is found whole.
fn screen_words(screen: &str) -> String {
    screen
        .lines()
        .map(|l| l.trim_matches('"').replace(['│', '|'], " "))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn help_lines_wrap_under_their_key_column() {
    let app = snapshot_app(theme());
    // 40: a 20-column key and 20 for the action, where every action wraps but no word of
    // one is cut; 62: the overlay's width on an 80-column terminal.
    for width in [40u16, 62] {
        let lines = mxtune::tui::ui::help_lines(&app, width);
        let text: Vec<String> = lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        for t in &text {
            assert!(
                t.chars().count() <= usize::from(width),
                "{t:?} is wider than {width}"
            );
        }
        // Every action is there whole, in order, once the wrapped rows are joined.
        let all = text
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        // Without a hosts file the help has no host picker, with no target on several
        // hosts no `h` of the Live screen, and without a docker-cluster preset no `r`.
        let hidden = [
            mxtune::tui::keys::HOSTS_SECTION,
            mxtune::tui::keys::LIVE_HOSTS_SECTION,
            mxtune::tui::keys::CLUSTER_SECTION,
        ];
        for h in hidden {
            assert!(!all.contains(h), "{h} at {width}");
        }
        for (title, bindings) in mxtune::tui::keys::SECTIONS
            .iter()
            .filter(|(t, _)| !hidden.contains(t))
        {
            assert!(all.contains(title), "{title} at {width}");
            for b in *bindings {
                let want = format!("{} {}", b.key, b.action);
                let want = want.split_whitespace().collect::<Vec<_>>().join(" ");
                assert!(all.contains(&want), "{want:?} at {width}");
            }
        }
    }
    // A word longer than the line is cut, not lost.
    assert_eq!(
        mxtune::tui::ui::wrap_words("ab cdefgh i", 3),
        ["ab", "cde", "fgh", "i"]
    );
}

#[test]
fn help_overlay_80x24() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('4'));
    key(&mut app, KeyCode::Char('?'));
    insta::assert_snapshot!("help_bench_80x24", render(&app, 80, 24));
}

#[test]
fn a_long_status_message_wraps_instead_of_being_cut() {
    let mut app = snapshot_app(theme());
    let msg = "a matrix or A/B is running its own targets: wait for it, or cancel it on the \
               Bench screen (4, then Esc)";
    app.message = Some(msg.into());
    let screen = render(&app, 80, 24);
    assert!(screen_words(&screen).contains(msg), "{screen}");
    // Two rows of status, then the hints on the last row as always.
    let rows: Vec<&str> = screen.lines().collect();
    assert!(rows[21].contains("a matrix or A/B"), "{screen}");
    assert!(rows[22].contains("(4, then Esc)"), "{screen}");
    assert!(rows[23].contains("? help"), "{screen}");
    insta::assert_snapshot!("status_message_wrapped_80x24", screen);
    // The real message, from the key that answers it.
    app.message = None;
    app.bench.ab.run = Some(mxtune::tui::screens::matrix::AbRun {
        a: "a".into(),
        b: "b".into(),
        rounds: 3,
        round: 1,
        phase: String::new(),
        valid_rounds: 0,
        ratios: Vec::new(),
        state: JobState::Running,
        out: None,
        md: None,
        excluded: Vec::new(),
    });
    key(&mut app, KeyCode::Char('2'));
    assert!(hit(&mut app, KeyCode::Char('l')).is_empty());
    assert_eq!(app.message.as_deref(), Some(msg));
    assert!(screen_words(&render(&app, 80, 24)).contains(msg));
}

#[test]
fn launch_head_wraps_at_80x24() {
    let mut app = snapshot_app(theme());
    fixed_launch(&mut app);
    key(&mut app, KeyCode::Char('2'));
    let screen = render(&app, 80, 24);
    assert!(
        screen_words(&screen).contains("log runs/01JD0000000000000000000003.target.log"),
        "{screen}"
    );
}

#[test]
fn live_head_wraps_at_80x24() {
    let mut app = snapshot_app(theme());
    key(&mut app, KeyCode::Char('3'));
    for t in 0..100 {
        app.live.push(sample(t, false));
    }
    key(&mut app, KeyCode::Char('f'));
    let screen = render(&app, 80, 24);
    let words = screen_words(&screen);
    // The freeze hint and the GPU facts after it are whole, on a second row.
    for text in [
        "FROZEN (f resumes; collection continues)",
        "NVIDIA GB10",
        "GiB unified P0",
    ] {
        assert!(words.contains(text), "{text:?} is cut:\n{screen}");
    }
    insta::assert_snapshot!("live_frozen_80x24", screen);
}

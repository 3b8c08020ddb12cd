//! Snapshot and state tests of the panel, drawn into ratatui's `TestBackend`.

use std::path::{Path, PathBuf};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use mxtune::flags::preset::PresetStore;
use mxtune::record::schema::{PointResult, RunId, Stats, WorkloadPoint};
use mxtune::record::store::{Scan, StoredRun};
use mxtune::record::{RunRecord, RunStatus, RunStore};
use mxtune::tui::app::{App, Effect, Paths, QuitPrompt, Tab};
use mxtune::tui::screens::flags::Overlay;
use mxtune::tui::screens::runs::RunsView;
use mxtune::tui::theme::Theme;
use mxtune::tui::{Event, Exit, perform, step, ui};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

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

/// A panel started the way `tui::run` starts it, on fixed paths.
fn started(scratch: &Path, theme: Theme) -> App {
    let mut app = App::new(theme, paths(scratch));
    for e in app.startup_effects() {
        perform(&mut app, e);
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
    perform(&mut app, Effect::LoadPreset("engine-cpu-tiny".into()));
    app
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().to_string()
}

fn key(app: &mut App, code: KeyCode) -> Option<Exit> {
    step(
        app,
        Event::Term(crossterm::event::Event::Key(KeyEvent::new(
            code,
            KeyModifiers::NONE,
        ))),
    )
    .0
}

fn type_str(app: &mut App, s: &str) {
    for c in s.chars() {
        key(app, KeyCode::Char(c));
    }
}

/// A finished record with one point at `tps` ± `std` tok/s, started at a fixed time.
fn record(ulid: &str, preset: &str, minute: u32, tps: f64, std: f64) -> RunRecord {
    use chrono::TimeZone;
    let mut r = RunRecord::new(
        mxtune::launch::spec::TargetKind::Engine,
        Some(preset.into()),
    );
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
    assert!(screen.contains("Keys (any key closes)"), "{screen}");
    assert_eq!(
        key(&mut app, KeyCode::Char('q')),
        None,
        "q while help is open only closes help"
    );
    assert!(!app.show_help);
}

#[test]
fn quit_asks_when_a_target_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = started(dir.path(), theme());
    assert_eq!(key(&mut app, KeyCode::Char('q')), Some(Exit::Quit));

    let mut app = started(dir.path(), theme());
    app.target_running = true;
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
    key(&mut app, KeyCode::Enter);
    assert_ne!(app.flags.flags.serving.max_num_seqs, seqs);
    key(&mut app, KeyCode::Char('r'));
    assert_eq!(app.flags.flags.serving.max_num_seqs, None);
    key(&mut app, KeyCode::Char('R'));
    assert!(!app.flags.dirty(), "R restores the loaded preset");
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
        mxtune::launch::spec::TargetKind::Engine,
        "t is ignored while a view is open"
    );
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('t'));
    assert_eq!(
        app.flags.flags.target,
        mxtune::launch::spec::TargetKind::Docker
    );
    let docker = mxtune::tui::screens::flags::command_lines(&app.flags.flags);
    assert!(docker[0].starts_with("docker run"), "{docker:?}");
}

#[test]
fn snapshots_flags() {
    let mut app = snapshot_app(theme());
    insta::assert_snapshot!("flags_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("flags_160x48", render(&app, 160, 48));
    key(&mut app, KeyCode::Char('c'));
    insta::assert_snapshot!("flags_command_80x24", render(&app, 80, 24));
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

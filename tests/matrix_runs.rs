//! `mxtune matrix` and `mxtune ab` end to end: the real binary launching the bundled engine
//! (CPU, tiny synthetic model) and the real Docker engine with the local test image.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::*;

fn mxtune() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mxtune"))
}

/// Engine presets derived from the bundled engine-cpu-tiny preset, each on its own port.
fn tiny_presets(dir: &Path, names: &[&str]) {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/presets/engine-cpu-tiny.toml"
    ))
    .unwrap();
    assert!(
        base.contains("port = 8000"),
        "preset layout changed: {base}"
    );
    std::fs::create_dir_all(dir).unwrap();
    for (i, n) in names.iter().enumerate() {
        let text = base
            .replace("port = 8000", &format!("port = {}", free_port()))
            .replace("max_num_seqs = 4", &format!("max_num_seqs = {}", i + 1));
        std::fs::write(dir.join(format!("{n}.toml")), text).unwrap();
    }
}

fn state(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("matrix-state.json")).unwrap()).unwrap()
}

fn statuses(out: &Path) -> Vec<(String, String)> {
    state(out)["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn svg_ok(path: &Path) {
    let s = std::fs::read_to_string(path).unwrap();
    assert!(
        s.trim_start().starts_with("<svg") && s.trim_end().ends_with("</svg>"),
        "{}",
        path.display()
    );
    assert_eq!(s.matches("<svg").count(), s.matches("</svg>").count());
}

#[test]
fn matrix_engine_three_presets_interrupt_resume_report() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    tiny_presets(&presets, &["tiny-a", "tiny-b", "tiny-c"]);
    let out = dir.path().join("out");
    let runs = dir.path().join("runs");
    let args = |cmd: &mut Command| {
        cmd.arg("--presets-dir")
            .arg(&presets)
            .arg("--runs-dir")
            .arg(&runs)
            .arg("--out")
            .arg(&out);
    };
    let mut first = mxtune();
    first.args([
        "matrix", "--target", "engine", "tiny-a", "tiny-b", "tiny-c", "--device", "cpu",
    ]);
    first.args([
        "--grid",
        "pp=64",
        "tg=4",
        "runs=1",
        "warmup=0",
        "--levels",
        "1,1.5,4,5",
        "--seed",
        "42",
    ]);
    args(&mut first);
    let mut child = first
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt as soon as the first preset has finished: the operator's Ctrl-C.
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("matrix ended before it was interrupted: {status}");
        }
        if out.join("matrix-state.json").exists()
            && statuses(&out)
                .iter()
                .any(|(_, s)| s == "done" || s == "failed")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let first_out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&first_out.stderr);
    assert_eq!(first_out.status.code(), Some(130), "{stderr}");
    let after_stop = statuses(&out);
    let done_first: Vec<String> = after_stop
        .iter()
        .filter(|(_, s)| s == "done")
        .map(|(n, _)| n.clone())
        .collect();
    assert!(
        !done_first.is_empty() && done_first.len() < 3,
        "{after_stop:?}"
    );
    let s1 = state(&out);
    let order: Vec<String> = after_stop.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(s1["plan"]["seed"], 42);
    // The report exists already for the partial matrix.
    assert!(
        std::fs::read_to_string(out.join("report.md"))
            .unwrap()
            .contains("INCOMPLETE")
    );
    // No engine survived the interrupt.
    let engines = std::fs::read_to_string(runs.join("launched-engines.json")).unwrap_or_default();
    for pid in serde_json::from_str::<serde_json::Value>(&engines)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["pid"].as_u64())
    {
        assert!(
            unsafe { libc::kill(pid as i32, 0) } != 0,
            "engine {pid} still running"
        );
    }

    let mut resume = mxtune();
    resume.args(["matrix", "--resume"]);
    args(&mut resume);
    let r = resume.output().unwrap();
    let rs = String::from_utf8_lossy(&r.stderr);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{rs}\n{}",
        String::from_utf8_lossy(&r.stdout)
    );
    let s2 = state(&out);
    assert_eq!(s2["resumes"], 1);
    for p in s2["order"].as_array().unwrap() {
        assert_eq!(p["status"], "done", "{p}");
        let name = p["name"].as_str().unwrap().to_owned();
        // Finished presets were not rerun: same run id, one attempt.
        if done_first.contains(&name) {
            let before = s1["order"]
                .as_array()
                .unwrap()
                .iter()
                .find(|q| q["name"] == name.as_str())
                .unwrap();
            assert_eq!(p["run_id"], before["run_id"]);
            assert_eq!(p["attempts"], 1);
        }
        let levels: Vec<(String, String)> = p["levels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["level"].as_str().unwrap().into(),
                    l["verdict"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert!(
            levels.contains(&("smoke".into(), "pass".into())),
            "{levels:?}"
        );
        assert!(
            levels.contains(&("kernel_path".into(), "pass".into())),
            "{levels:?}"
        );
        assert!(
            levels.contains(&("performance".into(), "pass".into())),
            "{levels:?}"
        );
        assert!(levels.iter().any(|(l, _)| l == "regression"), "{levels:?}");
        // Each preset has a completed record with its grid point.
        let rec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p["record"].as_str().unwrap()).unwrap())
                .unwrap();
        assert_eq!(rec["identity"]["status"], "completed", "{rec}");
        assert_eq!(rec["results"].as_array().unwrap().len(), 1);
    }
    // The order survived the resume.
    let order2: Vec<String> = statuses(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(order, order2);

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for n in [
        "tiny-a",
        "tiny-b",
        "tiny-c",
        "## Verdicts",
        "## Results",
        "seed 42",
        "resumed 1 time",
    ] {
        assert!(report.contains(n), "report lacks {n}:\n{report}");
    }
    assert!(
        report.contains("(+") || report.contains("(-"),
        "no deltas against the baseline:\n{report}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("matrix-summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["complete"], true);
    assert_eq!(summary["baseline"], "tiny-a");
    let charts = summary["charts"].as_array().unwrap();
    assert!(
        charts.iter().any(|c| c == "charts/decode-tps.svg"),
        "{charts:?}"
    );
    for c in charts {
        svg_ok(&out.join(c.as_str().unwrap()));
    }
}

#[test]
fn matrix_default_preset_passes_correctness_on_synthetic_weights() {
    // The default preset serves synthetic weights: the text checks are skipped (and the
    // level says so), everything that still means something is checked and passes.
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    tiny_presets(&presets, &["engine-cpu-tiny"]);
    let out = dir.path().join("out");
    let o = mxtune()
        .args([
            "matrix",
            "--target",
            "engine",
            "engine-cpu-tiny",
            "--device",
            "cpu",
        ])
        .args(["--levels", "1,2", "--presets-dir"])
        .arg(&presets)
        .arg("--runs-dir")
        .arg(dir.path().join("runs"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let s = state(&out);
    let p = &s["order"][0];
    assert_eq!(p["status"], "done", "{p}");
    let correctness = p["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["level"] == "correctness")
        .unwrap_or_else(|| panic!("no correctness level: {p}"));
    assert_eq!(correctness["verdict"], "pass", "{correctness}");
    let detail = correctness["detail"].as_str().unwrap();
    assert!(
        detail.contains("skipped non-empty printable text, no degenerate repetition")
            && detail.contains("synthetic weights"),
        "{detail}"
    );
}

#[test]
fn matrix_engine_model_runs_a_checkpoint_preset_on_synthetic_weights() {
    // A gate preset written for a checkpoint nobody has yet still runs, on synthetic
    // weights of the same shape, with --engine-model.
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    tiny_presets(&presets, &["gate"]);
    let file = presets.join("gate.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("model = \"synthetic:tiny\""), "{text}");
    std::fs::write(
        &file,
        text.replace("synthetic:tiny", "/nowhere/gpt-oss-120b"),
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = |extra: &[&str]| {
        mxtune()
            .args(["matrix", "--target", "engine", "gate", "--device", "cpu"])
            .args(["--levels", "1", "--presets-dir"])
            .arg(&presets)
            .arg("--runs-dir")
            .arg(dir.path().join("runs"))
            .arg("--out")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = run(&["--engine-model", "synthetic:tiny"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let p = &state(&out)["order"][0];
    assert_eq!(p["status"], "done", "{p}");
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p["record"].as_str().unwrap()).unwrap())
            .unwrap();
    let argv: Vec<&str> = rec["target"]["launch"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        argv.windows(2).any(|w| w == ["--synthetic", "tiny"]),
        "{argv:?}"
    );
    assert_eq!(rec["target"]["flags"]["engine"]["model"], "synthetic:tiny");
}

#[test]
fn matrix_refuses_an_existing_out_and_resume_without_state() {
    let dir = tempfile::tempdir().unwrap();
    let r = mxtune()
        .args(["matrix", "--resume", "--out"])
        .arg(dir.path().join("none"))
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("matrix-state.json"));
    let r = mxtune()
        .args(["matrix", "--target", "engine", "x", "--grid", "pp=0"])
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("--pp"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

#[test]
fn ab_refuses_an_out_holding_an_earlier_result_before_launching() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ab.md"), "earlier\n").unwrap();
    let r = mxtune()
        .args(["ab", "engine-cpu-tiny", "engine-q8", "--target", "engine"])
        .arg("--runs-dir")
        .arg(dir.path().join("runs"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "{err}");
    assert!(
        err.contains("already holds an A/B result") && err.contains("ab.md"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ab.md")).unwrap(),
        "earlier\n"
    );
    assert!(!dir.path().join("runs").exists(), "nothing ran");
}

#[test]
fn ab_engine_reuse_reports_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    tiny_presets(&presets, &["ab-a", "ab-b"]);
    let out = dir.path().join("ab");
    let r = mxtune()
        .args([
            "ab", "ab-a", "ab-b", "--rounds", "2", "--reuse", "--target", "engine",
        ])
        .args(["--grid", "pp=64", "tg=4", "runs=1", "warmup=0"])
        .arg("--presets-dir")
        .arg(&presets)
        .arg("--runs-dir")
        .arg(dir.path().join("runs"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("ab.json")).unwrap()).unwrap();
    assert_eq!(v["reused"], true);
    assert_eq!(
        v["records"].as_array().unwrap().len(),
        2,
        "one launch each with --reuse"
    );
    let tg = v["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["metric"] == "tg t/s")
        .expect("tg ratio");
    assert_eq!(tg["rounds"].as_array().unwrap().len(), 2);
    assert!(tg["mean"].as_f64().unwrap() > 0.0);
    assert!(stdout.contains("B/A"), "{stdout}");
}

#[tokio::test]
async fn matrix_docker_two_presets_marks_the_invalid_one() {
    let Some(d) = docker_or_skip("matrix_docker_two_presets_marks_the_invalid_one").await else {
        return;
    };
    let image = test_image(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    std::fs::create_dir(&presets).unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    // The test server logs "Using Marlin backend": marlin is valid, cutlass is INVALID.
    for (name, backend) in [("dock-marlin", "marlin"), ("dock-cutlass", "cutlass")] {
        let container = format!("mxtune-matrix-test-{}", ulid::Ulid::generate()).to_lowercase();
        std::fs::write(
            presets.join(format!("{name}.toml")),
            format!(
                "description = \"matrix docker test\"\ntarget = \"docker\"\n[axes]\nmoe_backend = \"{backend}\"\ncuda_graphs = \"on\"\n\
                 [serving]\nmodel = \"openai/gpt-oss-120b\"\nserved_model_name = \"m\"\nhost = \"0.0.0.0\"\nport = {}\n\
                 [container]\nimage = \"{image}\"\nname = \"{container}\"\nnetwork = \"bridge\"\ngpus_all = false\nulimits = {{}}\nvllm = \"fork\"\nhf_cache = \"{}\"\njit_cache = \"{}\"\n",
                free_port(),
                hf.display(),
                dir.path().join("jit").display()
            ),
        )
        .unwrap();
    }
    let out = dir.path().join("out");
    let r = tokio::task::spawn_blocking({
        let (presets, out, runs) = (presets.clone(), out.clone(), dir.path().join("runs"));
        move || {
            mxtune()
                .args([
                    "matrix",
                    "--target",
                    "docker",
                    "dock-marlin",
                    "dock-cutlass",
                    "--endpoint",
                    "completions",
                ])
                .args([
                    "--grid",
                    "pp=64",
                    "tg=4",
                    "runs=1",
                    "warmup=0",
                    "--levels",
                    "1,1.5,4",
                    "--no-shuffle",
                ])
                .arg("--presets-dir")
                .arg(presets)
                .arg("--runs-dir")
                .arg(runs)
                .arg("--out")
                .arg(out)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    // The invalid preset makes the matrix fail.
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    let s = state(&out);
    let order = s["order"].as_array().unwrap();
    let verdict = |p: &serde_json::Value, level: &str| {
        p["levels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["level"] == level)
            .map(|l| l["verdict"].as_str().unwrap().to_owned())
    };
    assert_eq!(order[0]["name"], "dock-marlin");
    assert_eq!(
        // marlin is seen; the other checks have no evidence in the test server's log.
        verdict(&order[0], "kernel_path").as_deref(),
        Some("unknown"),
        "{stderr}"
    );
    // Measured and not INVALID. (pp t/s can be missing against an instant test server
    // whose API latency exceeds its ttfr on a loaded machine; the bench level then says so.)
    assert_ne!(
        verdict(&order[0], "performance").as_deref(),
        Some("invalid"),
        "{stderr}"
    );
    assert_eq!(order[0]["invalid"], false);
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(order[0]["record"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["results"].as_array().unwrap().len(), 1, "{rec}");
    assert!(
        rec["results"][0]["tg_tps"]["mean"].as_f64().unwrap() > 0.0,
        "{rec}"
    );
    assert_eq!(
        verdict(&order[1], "kernel_path").as_deref(),
        Some("invalid"),
        "{stderr}"
    );
    assert_eq!(
        verdict(&order[1], "performance").as_deref(),
        Some("invalid"),
        "{stderr}"
    );
    assert_eq!(order[1]["invalid"], true);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("INVALID"), "{report}");
    // Both containers are gone.
    let left = mxtune::launch::docker::find_mxtune_containers(&d)
        .await
        .unwrap();
    assert!(
        !left.iter().any(|f| f.preset.starts_with("dock-")),
        "{left:?}"
    );
}

/// The panel (state, its background runtime and event channel) over tiny engine presets
/// `names` in `dir/presets`, recording into `dir/runs` (returned).
fn panel(
    dir: &Path,
    names: &[&str],
) -> (
    mxtune::tui::app::App,
    mxtune::tui::background::Background,
    std::sync::mpsc::Receiver<mxtune::tui::Event>,
    PathBuf,
) {
    use mxtune::tui::app::{App, Paths};
    let presets = dir.join("presets");
    tiny_presets(&presets, names);
    let runs = dir.join("runs");
    let (tx, rx) = std::sync::mpsc::channel();
    let bg = mxtune::tui::background::Background::new(tx).unwrap();
    let app = App::new(
        mxtune::tui::theme::Theme {
            color: false,
            ascii: false,
        },
        Paths {
            presets: mxtune::flags::preset::PresetStore::new(vec![presets.clone()]),
            save_dir: presets,
            runs_dir: runs.clone(),
            export_dir: dir.to_path_buf(),
        },
    );
    (app, bg, rx, runs)
}

/// The panel's matrix view: keys choose two presets, the levels and the grid; the effect is
/// performed by the panel's runtime (`tui::perform`), the matrix runs on its background
/// runtime, and its events are fed through `tui::step` until the view says it finished.
#[test]
fn tui_matrix_view_runs_engine_presets_through_the_background() {
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use mxtune::matrix::state::PresetStatus;
    use mxtune::tui::app::{App, Effect};
    use mxtune::tui::screens::matrix::{BenchView, JobState};
    use mxtune::tui::{perform, step};

    let dir = tempfile::tempdir().unwrap();
    let (mut app, mut bg, rx, runs) = panel(dir.path(), &["tui-a", "tui-b"]);
    app.launch.choice = mxtune::vocab::TargetKind::Engine;
    let press = |app: &mut App, code: KeyCode| app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
    press(&mut app, KeyCode::Char('4'));
    // The Bench form's grid is the matrix's grid.
    app.bench.values = ["64".into(), "4".into(), "0".into(), "1".into(), "1".into()];
    for e in press(&mut app, KeyCode::Char('m')) {
        perform(&mut app, &mut bg, e);
    }
    assert_eq!(app.bench.view, BenchView::Matrix);
    assert_eq!(app.bench.matrix.presets, ["tui-a", "tui-b"]);
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('l'));
    for _ in 0..20 {
        press(&mut app, KeyCode::Backspace);
    }
    for c in "1,1.5,4".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    press(&mut app, KeyCode::Enter);
    let effects = press(&mut app, KeyCode::Char('r'));
    let [Effect::StartMatrix(args)] = effects.as_slice() else {
        panic!("{effects:?} {:?}", app.bench.matrix.error);
    };
    let mut args = args.clone();
    // The panel's engine is the running mxtune; under test that is the test binary.
    args.common.engine_bin = Some(env!("CARGO_BIN_EXE_mxtune").into());
    perform(&mut app, &mut bg, Effect::StartMatrix(args));

    let start = std::time::Instant::now();
    let mut saw_running = false;
    while app
        .bench
        .matrix
        .run
        .as_ref()
        .is_some_and(|r| r.state.is_active())
    {
        if let Ok(ev) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            step(&mut app, &mut bg, ev);
        }
        let run = app.bench.matrix.run.as_ref().unwrap();
        saw_running |= run.rows.iter().any(|r| r.status == PresetStatus::Running);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(300),
            "the matrix never finished: {run:?}"
        );
    }
    assert!(saw_running, "no preset was ever shown running");
    let run = app.bench.matrix.run.clone().unwrap();
    assert_eq!(
        run.state,
        JobState::Finished {
            interrupted: false,
            passed: true
        },
        "{run:?}"
    );
    assert!(
        run.out.starts_with(runs.join("matrix")),
        "{}",
        run.out.display()
    );
    let report = run.report.clone().expect("report path");
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("tui-a") && text.contains("tui-b"), "{text}");
    assert!(run.out.join("matrix-state.json").exists());
    let mut names: Vec<String> = statuses(&run.out)
        .into_iter()
        .map(|(n, s)| {
            assert_eq!(s, "done", "{n}");
            n
        })
        .collect();
    names.sort();
    assert_eq!(names, ["tui-a", "tui-b"]);
    for row in &run.rows {
        assert_eq!(row.status, PresetStatus::Done, "{row:?}");
        let verdicts: Vec<(&str, &str)> = row
            .levels
            .iter()
            .map(|l| (l.level.number(), l.verdict.as_str()))
            .collect();
        assert_eq!(
            verdicts,
            [("1", "pass"), ("1.5", "pass"), ("4", "pass")],
            "{row:?}"
        );
        let rec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(row.record.as_ref().expect("record")).unwrap(),
        )
        .unwrap();
        assert_eq!(rec["identity"]["status"], "completed", "{rec}");
        assert_eq!(rec["results"].as_array().unwrap().len(), 1);
    }
    assert!(
        app.message.as_deref().unwrap_or("").contains("report.md"),
        "{:?}",
        app.message
    );
}

/// The panel's quick A/B: mark the loaded preset's flags as A, change one, `A` on the Bench
/// screen; the runtime writes both as presets and runs `mxtune ab`'s code on the background
/// runtime; the view shows the ratios and the files exist.
#[test]
fn tui_quick_ab_runs_marked_a_against_current_flags() {
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use mxtune::tui::app::{App, Effect};
    use mxtune::tui::screens::matrix::{BenchView, JobState};
    use mxtune::tui::{perform, step};

    let dir = tempfile::tempdir().unwrap();
    let (mut app, mut bg, rx, runs) = panel(dir.path(), &["tui-ab"]);
    perform(&mut app, &mut bg, Effect::LoadPreset("tui-ab".into()));
    assert_eq!(app.launch.choice, mxtune::vocab::TargetKind::Engine);
    let press = |app: &mut App, code: KeyCode| app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
    press(&mut app, KeyCode::Char('4'));
    app.bench.values = ["64".into(), "4".into(), "0".into(), "1".into(), "1".into()];
    press(&mut app, KeyCode::Char('a'));
    assert!(app.ab_mark.is_some());
    app.flags.flags.serving.max_num_seqs = Some(2);
    // A opens the A/B view; two rounds instead of the default three keep the test short
    // (four launches), set as an operator would: r, the number, Enter.
    assert!(press(&mut app, KeyCode::Char('A')).is_empty());
    assert_eq!(app.bench.view, BenchView::Ab);
    press(&mut app, KeyCode::Char('r'));
    press(&mut app, KeyCode::Backspace);
    press(&mut app, KeyCode::Char('2'));
    press(&mut app, KeyCode::Enter);
    let effects = press(&mut app, KeyCode::Char('A'));
    let [Effect::StartAb(req)] = effects.as_slice() else {
        panic!("{effects:?} {:?}", app.message);
    };
    assert_eq!(req.rounds, 2);
    let mut req = req.clone();
    // The panel's engine is the running mxtune; under test that is the test binary.
    req.engine_bin = Some(env!("CARGO_BIN_EXE_mxtune").into());
    perform(&mut app, &mut bg, Effect::StartAb(req));
    let start = std::time::Instant::now();
    let mut rounds_seen = Vec::new();
    while app
        .bench
        .ab
        .run
        .as_ref()
        .is_some_and(|r| r.state.is_active())
    {
        if let Ok(ev) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            step(&mut app, &mut bg, ev);
        }
        let run = app.bench.ab.run.as_ref().unwrap();
        if rounds_seen.last() != Some(&run.round) {
            rounds_seen.push(run.round);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(400),
            "the A/B never finished: {run:?}"
        );
    }
    let run = app.bench.ab.run.clone().unwrap();
    assert_eq!(
        run.state,
        JobState::Finished {
            interrupted: false,
            passed: true
        },
        "{run:?}"
    );
    assert_eq!(rounds_seen.last(), Some(&2), "{rounds_seen:?}");
    assert_eq!(run.valid_rounds, 2, "{run:?}");
    let tg = run
        .ratios
        .iter()
        .find(|r| r.metric == "tg t/s")
        .expect("tg ratio");
    assert_eq!(tg.rounds.len(), 2);
    assert!(tg.mean > 0.0);
    let out = run.out.clone().expect("out dir");
    assert!(out.starts_with(runs.join("ab")), "{}", out.display());
    assert!(run.md.as_ref().unwrap().exists());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("ab.json")).unwrap()).unwrap();
    assert_eq!(v["records"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(v["noise"], 2.0, "{v}");
    // The two presets: A as marked, B with the change.
    let b = std::fs::read_to_string(out.join("presets/quick-ab-b.toml")).unwrap();
    assert!(b.contains("max_num_seqs = 2"), "{b}");
    let a = std::fs::read_to_string(out.join("presets/quick-ab-a.toml")).unwrap();
    assert!(a.contains("max_num_seqs = 1"), "{a}");
}

/// Esc in the panel's matrix view cancels the way Ctrl-C does on the command line: the
/// target is stopped, the state is left resumable, and `mxtune matrix --resume` finishes it.
#[test]
fn tui_matrix_view_esc_leaves_a_resumable_matrix() {
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use mxtune::matrix::state::PresetStatus;
    use mxtune::tui::app::{App, Effect};
    use mxtune::tui::screens::matrix::JobState;
    use mxtune::tui::{Event, perform, step};

    let dir = tempfile::tempdir().unwrap();
    let (mut app, mut bg, rx, runs) = panel(dir.path(), &["esc-a", "esc-b"]);
    app.launch.choice = mxtune::vocab::TargetKind::Engine;
    let press = |app: &mut App, code: KeyCode| app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
    press(&mut app, KeyCode::Char('4'));
    app.bench.values = ["64".into(), "4".into(), "0".into(), "1".into(), "1".into()];
    for e in press(&mut app, KeyCode::Char('m')) {
        perform(&mut app, &mut bg, e);
    }
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('l'));
    for _ in 0..20 {
        press(&mut app, KeyCode::Backspace);
    }
    for c in "1,4".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    press(&mut app, KeyCode::Enter);
    let effects = press(&mut app, KeyCode::Char('r'));
    let [Effect::StartMatrix(args)] = effects.as_slice() else {
        panic!("{effects:?} {:?}", app.bench.matrix.error);
    };
    let mut args = args.clone();
    args.common.engine_bin = Some(env!("CARGO_BIN_EXE_mxtune").into());
    perform(&mut app, &mut bg, Effect::StartMatrix(args));

    let start = std::time::Instant::now();
    let mut pressed = false;
    while app
        .bench
        .matrix
        .run
        .as_ref()
        .is_some_and(|r| r.state.is_active())
    {
        if let Ok(ev) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            step(&mut app, &mut bg, ev);
        }
        let running = app
            .bench
            .matrix
            .run
            .as_ref()
            .unwrap()
            .rows
            .iter()
            .any(|r| r.status == PresetStatus::Running);
        if running && !pressed {
            // Esc goes through the same path as a key from the terminal.
            let esc = Event::Term(crossterm::event::Event::Key(KeyEvent::new(
                KeyCode::Esc,
                KeyModifiers::NONE,
            )));
            step(&mut app, &mut bg, esc);
            pressed = true;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(300),
            "the matrix never ended"
        );
    }
    assert!(pressed, "no preset was ever shown running");
    let run = app.bench.matrix.run.clone().unwrap();
    assert_eq!(
        run.state,
        JobState::Finished {
            interrupted: true,
            passed: false
        },
        "{run:?}"
    );
    let after = statuses(&run.out);
    assert!(after.iter().any(|(_, s)| s == "interrupted"), "{after:?}");
    assert!(
        std::fs::read_to_string(run.out.join("report.md"))
            .unwrap()
            .contains("INCOMPLETE")
    );
    assert!(
        app.message
            .as_deref()
            .unwrap()
            .contains("mxtune matrix --resume --out"),
        "{:?}",
        app.message
    );
    // No engine survived the cancel.
    let engines = std::fs::read_to_string(runs.join("launched-engines.json")).unwrap_or_default();
    for pid in serde_json::from_str::<serde_json::Value>(&engines)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["pid"].as_u64())
    {
        assert!(
            unsafe { libc::kill(pid as i32, 0) } != 0,
            "engine {pid} still running"
        );
    }
    // The headless command resumes it to the end.
    let r = mxtune()
        .args(["matrix", "--resume", "--out"])
        .arg(&run.out)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&r.stderr),
        String::from_utf8_lossy(&r.stdout)
    );
    for (n, s) in statuses(&run.out) {
        assert_eq!(s, "done", "{n}");
    }
    assert_eq!(state(&run.out)["resumes"], 1);
}

//! Engine and attach targets, and the headless `mxtune launch` / `mxtune stop` commands,
//! with the static test server standing in for `mxtune serve` (the engine binary is
//! outside the unit under test).

#[path = "support/loading_double.rs"]
mod loading_double;
mod support;

use mxtune::launch::attach::AttachTarget;
use mxtune::launch::engine::EngineTarget;
use mxtune::launch::ready::ReadyProbe;
use mxtune::launch::{LaunchEvent, LaunchOptions, Phase, Status, Target, Verdict, state};
use std::time::Duration;
use support::*;
use tokio::sync::mpsc;

fn opts(tag: &str, dir: &std::path::Path) -> LaunchOptions {
    let run_id = format!("test-{tag}-{}", ulid::Ulid::generate());
    let mut o = LaunchOptions::new(&run_id, "test-preset").unwrap();
    o.ready_poll = Duration::from_millis(100);
    o.log_path = Some(dir.join(format!("{run_id}.log")));
    o
}

/// The test server's binary, a scratch directory and a spec that starts it on a free port
/// serving `model`, with `env` set.
async fn double(
    model: &str,
    env: &[(&str, &str)],
) -> (
    std::path::PathBuf,
    tempfile::TempDir,
    mxtune::vocab::LaunchSpec,
) {
    let bin = tokio::task::spawn_blocking(server_binary).await.unwrap();
    let mut spec = server_spec("mxtune", "127.0.0.1", free_port(), model);
    for (k, v) in env {
        spec.env.insert((*k).into(), (*v).into());
    }
    (bin, tempfile::tempdir().unwrap(), spec)
}

fn alive(pid: u32) -> bool {
    state::proc_start_ticks(pid).is_some()
}

#[tokio::test]
async fn launch_engine_target_ready_verdict_stop() {
    let bin = tokio::task::spawn_blocking(server_binary).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut spec = server_spec("mxtune", "127.0.0.1", port, "synthetic-tiny");
    spec.env.insert("VLLM_BOGUS_ENGINE".into(), "1".into());
    let o = opts("engine", dir.path());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = EngineTarget::launch(Some(&bin), &spec, &o, Some(dir.path()), tx)
        .await
        .unwrap();
    let info = launch.wait_ready().await.unwrap();
    assert_eq!(info.model, "synthetic-tiny");
    assert_eq!(
        streamed_completion(&info.url, "synthetic-tiny", 3)
            .await
            .len(),
        3
    );

    let report = launch.report();
    assert_eq!(report.overall(), Verdict::Valid, "{report:?}");
    assert_eq!(report.unknown_env, vec!["VLLM_BOGUS_ENGINE"]);
    let phases: Vec<Phase> = drain(&mut rx)
        .into_iter()
        .filter_map(|e| match e {
            LaunchEvent::Phase { phase } => Some(phase),
            _ => None,
        })
        .collect();
    assert_eq!(
        phases,
        vec![
            Phase::LoadingWeights,
            Phase::CapturingGraphs,
            Phase::StartingServer,
            Phase::Ready
        ]
    );
    // stdout and stderr both reach the log file, written once.
    let log = std::fs::read_to_string(o.log_path.as_ref().unwrap()).unwrap();
    assert!(
        log.contains("WARNING stderr is followed") && log.contains("kernel-path moe_kernel=marlin"),
        "{log}"
    );
    assert_eq!(log.matches("Uvicorn running on").count(), 1);

    let Target::Engine(t) = &launch.target else {
        panic!("not an engine target")
    };
    let pid = t.pid;
    let recs = state::load(dir.path()).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(
        (recs[0].pid, recs[0].run_id.as_str()),
        (pid, o.run_id.as_str())
    );
    assert_eq!(launch.target.facts().await.pid, Some(pid));

    let msg = launch.stop(Duration::from_secs(5), false).await.unwrap();
    assert!(msg.contains("stopped (SIGTERM)"), "{msg}");
    assert!(!alive(pid));
    assert!(state::load(dir.path()).unwrap().is_empty());
}

/// The ready probe can answer before the log pipe delivers the kernel-path lines; the
/// verdict shown at ready is then refreshed when they arrive (a CI run once showed
/// "never saw" beside the very line it was waiting for).
#[tokio::test]
async fn a_kernel_path_line_read_after_ready_refreshes_the_verdict() {
    let (bin, dir, mut spec) =
        double("synthetic-tiny", &[("MXTUNE_TEST_LATE_PATH_MS", "1500")]).await;
    // Only the late line is evidence (the double's earlier "Using Marlin" line is not).
    spec.checks.truncate(1);
    spec.checks[0].must_see = vec!["^kernel-path moe_kernel=marlin".into()];
    let o = opts("late-path", dir.path());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = EngineTarget::launch(Some(&bin), &spec, &o, None, tx)
        .await
        .unwrap();
    launch.wait_ready().await.unwrap();
    let mut verdicts = Vec::new();
    // Bounded only so that a broken refresh fails instead of hanging.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while verdicts.last() != Some(&Verdict::Valid) {
        let e = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no valid verdict came; verdicts so far {verdicts:?}"))
            .expect("the event channel closed");
        if let LaunchEvent::Verdict { report } = e {
            verdicts.push(report.overall());
        }
    }
    assert_eq!(
        verdicts.first(),
        Some(&Verdict::Unknown),
        "the first verdict came before the late line: {verdicts:?}"
    );
    assert_eq!(launch.report().overall(), Verdict::Valid);
    launch.stop(Duration::from_secs(5), false).await.unwrap();
}

#[tokio::test]
async fn launch_engine_crash_reports_exit_code() {
    let (bin, dir, spec) = double("m", &[("MXTUNE_TEST_CRASH", "7")]).await;
    let o = opts("engine-crash", dir.path());
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut launch = EngineTarget::launch(Some(&bin), &spec, &o, None, tx)
        .await
        .unwrap();
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(
        err.contains("exit code 7") && err.contains("simulated crash"),
        "{err}"
    );
    assert!(matches!(launch.status(), Status::Failed(_)));
}

#[tokio::test]
async fn launch_engine_missing_binary_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = server_spec("/nonexistent/mxtune-engine", "127.0.0.1", free_port(), "m");
    let (tx, _rx) = mpsc::unbounded_channel();
    let err = EngineTarget::launch(None, &spec, &opts("nobin", dir.path()), None, tx)
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("/nonexistent/mxtune-engine"),
        "{err:#}"
    );
}

#[tokio::test]
async fn launch_quiet_target_gets_a_warning_and_startup_limit_fails_it() {
    let (bin, dir, spec) = double("m", &[("MXTUNE_TEST_SILENT_MS", "60000")]).await;
    let mut o = opts("quiet", dir.path());
    o.quiet_warning = Duration::from_millis(300);
    o.startup_limit = Duration::from_secs(2);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = EngineTarget::launch(Some(&bin), &spec, &o, None, tx)
        .await
        .unwrap();
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(
        err.contains("start-up limit") && err.contains("phase: capturing CUDA graphs"),
        "{err}"
    );
    assert!(
        drain(&mut rx).iter().any(
            |e| matches!(e, LaunchEvent::Warning { message } if message.contains("no log line"))
        )
    );
    launch.stop(Duration::from_secs(5), false).await.unwrap();
}

#[tokio::test]
async fn launch_attach_target_is_probed_and_never_stopped() {
    let bin = tokio::task::spawn_blocking(server_binary).await.unwrap();
    let port = free_port();
    let mut server = std::process::Command::new(&bin)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--served-model-name",
            "ext",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let o = opts("attach", dir.path());
    let url = format!("http://127.0.0.1:{port}");
    let (tx, _rx) = mpsc::unbounded_channel();

    let mut launch = AttachTarget::attach(&url, "", &o, tx).unwrap();
    let info = launch.wait_ready().await.unwrap();
    assert_eq!(info.model, "ext");
    assert_eq!(launch.report().overall(), Verdict::Unknown);
    let msg = launch.stop(Duration::from_secs(1), false).await.unwrap();
    assert!(msg.contains("leaves it running"), "{msg}");
    assert_eq!(streamed_completion(&url, "ext", 1).await.len(), 1);
    // A model the server does not list is not ready, and the probe says why.
    let probe = ReadyProbe::new(&url, "other-model", None, Duration::from_secs(5)).unwrap();
    let why = format!("{:#}", probe.check().await.unwrap_err());
    assert!(
        why.contains("does not list model \"other-model\"") && why.contains("ext"),
        "{why}"
    );
    assert!(AttachTarget::attach("ftp://x", "", &o, mpsc::unbounded_channel().0).is_err());
    server.kill().unwrap();
    server.wait().unwrap();
}

#[tokio::test]
async fn launch_attach_publishes_each_probe_answer_and_its_limit_fails_with_the_last() {
    use loading_double::{LOADING_MESSAGE, loading_double};
    let url = loading_double();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts("stuck", dir.path());
    o.attach_limit = Duration::from_secs(2);
    // The attach limit applies to an attach, not the one for targets mxtune starts.
    o.startup_limit = Duration::from_secs(3600);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = AttachTarget::attach(&url, "", &o, tx).unwrap();
    assert_eq!(launch.startup_limit(), Duration::from_secs(2));
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    let reason = format!("POST /v1/completions → 503 {LOADING_MESSAGE}");
    assert!(
        err.contains("not ready within the attach limit of 2 s") && err.contains(&reason),
        "{err}"
    );
    assert!(mxtune::launch::fired_by_startup_limit(
        err.split_once("failed: ").map(|(_, m)| m).unwrap_or("")
    ));

    // Each probe's answer was published as it came, in the server's own words.
    let events = drain(&mut rx);
    let probes: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            LaunchEvent::Probe { answer } => Some(answer),
            _ => None,
        })
        .collect();
    assert!(probes.len() >= 2, "{events:?}");
    for p in &probes {
        assert_eq!(
            (p.request.as_str(), p.status, p.message.as_str()),
            ("POST /v1/completions", Some(503), LOADING_MESSAGE)
        );
    }
    let failed = events
        .iter()
        .position(|e| matches!(e, LaunchEvent::Failed { .. }))
        .expect("a failure event");
    let first_probe = events
        .iter()
        .position(|e| matches!(e, LaunchEvent::Probe { .. }))
        .unwrap();
    assert!(
        first_probe < failed,
        "probes are news before the limit fires"
    );
    assert!(
        !events.iter().any(
            |e| matches!(e, LaunchEvent::Warning { message } if message.contains("no log line"))
        ),
        "an attached endpoint has no log to be quiet"
    );

    // The record's phases keep the last answer.
    let observed = mxtune::launch::record::observed(&launch, None);
    let last = observed.phases.last().and_then(|p| p.last_probe.clone());
    assert_eq!(last.map(|p| p.to_string()), Some(reason));
    launch.stop(Duration::from_secs(1), false).await.unwrap();

    // No server at all: the probe's answer is the connection error.
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let probe = ReadyProbe::new(&nobody, "", None, Duration::from_secs(5)).unwrap();
    let answer = probe.check().await.unwrap_err();
    assert_eq!(
        (answer.request.as_str(), answer.status),
        ("GET /health", None)
    );
    assert!(
        answer.message.to_lowercase().contains("connect"),
        "{answer}"
    );
}

#[test]
fn launch_cli_attach_prints_the_probe_answer_when_it_changes_and_fails_at_its_limit() {
    use loading_double::{LOADING_MESSAGE, loading_double};
    let url = loading_double();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["launch", "--target", "attach", "--url", &url])
        .args(["--attach-limit-s", "3", "--runs-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = format!("probe: POST /v1/completions → 503 {LOADING_MESSAGE}");
    // Several probes gave the same answer: one line.
    assert_eq!(stderr.lines().filter(|l| *l == line).count(), 1, "{stderr}");
    assert!(
        stderr.contains("not ready within the attach limit of 3 s")
            && stderr.contains(&format!(
                "last probe: POST /v1/completions → 503 {LOADING_MESSAGE}"
            )),
        "{stderr}"
    );
}

#[test]
fn launch_cli_engine_headless_then_stop() {
    let bin = server_binary();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let spec = server_spec("mxtune", "127.0.0.1", port, "cli-model");
    let spec_path = dir.path().join("engine-spec.toml");
    std::fs::write(&spec_path, toml::to_string(&spec).unwrap()).unwrap();
    let runs = dir.path().join("runs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["launch", "--target", "engine", "--spec"])
        .arg(&spec_path)
        .arg("--engine-bin")
        .arg(&bin)
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("kernel-path verdict: Valid"), "{stdout}");
    assert!(stdout.contains("moe_backend=marlin: Valid"), "{stdout}");
    assert!(stderr.contains("phase: capturing CUDA graphs"), "{stderr}");
    // mxtune exited; the engine keeps serving.
    let recs = state::load(&runs).unwrap();
    assert_eq!(recs.len(), 1);
    assert!(alive(recs[0].pid));
    let health = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(health.is_ok());

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["stop", "--all", "--grace-s", "5", "--runs-dir"])
        .arg(&runs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("pid {}", recs[0].pid)), "{stdout}");
    assert!(!alive(recs[0].pid));
    assert!(state::load(&runs).unwrap().is_empty());
}

#[test]
fn launch_cli_failed_start_exits_nonzero() {
    let bin = server_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = server_spec("mxtune", "127.0.0.1", free_port(), "m");
    spec.env.insert("MXTUNE_TEST_CRASH".into(), "5".into());
    let spec_path = dir.path().join("crash.json");
    std::fs::write(&spec_path, serde_json::to_string(&spec).unwrap()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["launch", "--target", "engine", "--spec"])
        .arg(&spec_path)
        .arg("--engine-bin")
        .arg(&bin)
        .arg("--runs-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("exit code 5"), "{stderr}");
}

#[test]
fn launch_cli_port_taken_blocks_with_exit_2_and_starts_nothing() {
    // The pre-flight the panel's launch shares: the same lines, the same refusal.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let spec = server_spec("mxtune", "127.0.0.1", port, "m");
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_string(&spec).unwrap()).unwrap();
    let runs = dir.path().join("runs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["launch", "--target", "engine", "--spec"])
        .arg(&spec_path)
        .arg("--engine-bin")
        .arg("/nonexistent/never-started")
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "pre-flight Error: port {port} on 127.0.0.1 is not free"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("pre-flight failed: nothing was started"),
        "{stderr}"
    );
    assert!(!runs.exists(), "nothing was started, so no log: {stderr}");
    drop(taken);
}

#[test]
fn launch_cli_real_mxtune_serve_from_engine_preset() {
    // The bundled engine itself: `mxtune launch` renders the engine-cpu-tiny preset, starts
    // `mxtune serve` (this very binary) and checks its kernel-path report.
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    std::fs::create_dir(&presets).unwrap();
    let port = free_port();
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/presets/engine-cpu-tiny.toml"
    ))
    .unwrap();
    assert!(
        base.contains("port = 8000"),
        "preset layout changed: {base}"
    );
    std::fs::write(
        presets.join("tiny-test.toml"),
        base.replace("port = 8000", &format!("port = {port}")),
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["launch", "--preset", "tiny-test", "--presets-dir"])
        .arg(&presets)
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Stop it whatever happened above.
    let stop = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["stop", "--all", "--grace-s", "10", "--runs-dir"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("kernel-path verdict: Valid"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The engine's own start-up lines drive the phases.
    assert!(
        stderr.contains("phase: loading weights") && stderr.contains("phase: starting server"),
        "{stderr}"
    );
    let log = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".target.log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    assert!(log.contains("kernel-path backend=cpu"), "{log}");
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert!(String::from_utf8_lossy(&stop.stdout).contains("stopped (SIGTERM)"));
    assert!(state::load(&runs).unwrap().is_empty());
}

//! Docker target against the real engine: a `FROM scratch` image with a static test server.
//! Without Docker these tests skip with a message; `MXTUNE_TEST_DOCKER=require` makes that fail.

mod support;

use mxtune::launch::docker::{self, DockerTarget};
use mxtune::launch::{LaunchEvent, LaunchOptions, Phase, Verdict, preflight};
use mxtune::vocab::LaunchSpec;
use std::collections::BTreeMap;
use support::*;
use tokio::sync::mpsc;

fn opts(tag: &str) -> LaunchOptions {
    let run_id = format!("test-{tag}-{}", ulid::Ulid::generate());
    let mut o = LaunchOptions::new(&run_id, "test-preset").unwrap();
    o.ready_poll = std::time::Duration::from_millis(200);
    o.stop_grace = std::time::Duration::from_secs(5);
    o
}

async fn gone(d: &bollard::Docker, id: &str) -> bool {
    matches!(
        d.inspect_container(id, None).await,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        })
    )
}

#[tokio::test]
async fn docker_launch_ready_stream_verdict_stop() {
    let Some(d) = docker_or_skip("docker_launch_ready_stream_verdict_stop").await else {
        return;
    };
    let image = test_image(&d).await;
    let port = free_port();
    let mut spec = docker_spec(&image, port, "test-model");
    spec.argv
        .extend(["--print-file".into(), "/tmp/flashinfer_moe_tile".into()]);
    spec.env.insert("VLLM_BOGUS_FLAG".into(), "1".into());
    let c = spec.container.as_mut().unwrap();
    c.files = BTreeMap::from([(
        "/tmp/flashinfer_moe_tile".to_string(),
        "128x128\n".to_string(),
    )]);
    c.labels.insert("extra".into(), "yes".into());
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts("full");
    let _cleanup = Cleanup(o.run_id.clone());
    o.log_path = Some(dir.path().join("run.log"));
    let (tx, mut rx) = mpsc::unbounded_channel();

    let mut launch = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap();
    let info = launch.wait_ready().await.unwrap();
    assert_eq!(info.url, format!("http://127.0.0.1:{port}"));
    assert_eq!(info.model, "test-model");

    // A streamed completion through the port mapped on 127.0.0.1.
    let pieces = streamed_completion(&info.url, "test-model", 5).await;
    assert_eq!(pieces, vec![" tok0", " tok1", " tok2", " tok3", " tok4"]);

    // Phases came from log lines, in order, and the file placed before start was there.
    let events = drain(&mut rx);
    let phases: Vec<Phase> = events
        .iter()
        .filter_map(|e| match e {
            LaunchEvent::Phase { phase } => Some(*phase),
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
    let lines = launch.tail(1000);
    assert!(
        lines
            .iter()
            .any(|l| l == "file /tmp/flashinfer_moe_tile: 128x128"),
        "{lines:?}"
    );
    // stderr lines are kept too.
    assert!(
        lines.iter().any(|l| l == "WARNING stderr is followed"),
        "{lines:?}"
    );
    let logged = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(logged.contains("Uvicorn running on"));

    // Kernel-path verdict, and the unknown variable warning.
    let report = launch.report();
    assert_eq!(report.overall(), Verdict::Valid, "{report:?}");
    assert_eq!(report.unknown_env, vec!["VLLM_BOGUS_FLAG"]);
    assert!(events.iter().any(
        |e| matches!(e, LaunchEvent::Verdict { report } if report.overall() == Verdict::Valid)
    ));
    assert!(events.iter().any(
        |e| matches!(e, LaunchEvent::Warning { message } if message.contains("VLLM_BOGUS_FLAG"))
    ));

    // Labels, and the container is found by them.
    let mxtune::launch::Target::Docker(t) = &launch.target else {
        panic!("not docker")
    };
    let id = t.id.clone();
    let inspected = d.inspect_container(&id, None).await.unwrap();
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels.get(docker::LABEL_RUN_ID), Some(&o.run_id));
    assert_eq!(
        labels.get(docker::LABEL_PRESET).map(String::as_str),
        Some("test-preset")
    );
    assert_eq!(
        labels.get(docker::LABEL_VERSION).map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(labels.get("extra").map(String::as_str), Some("yes"));
    let hc = inspected.host_config.unwrap();
    let binding = &hc.port_bindings.unwrap()[&format!("{port}/tcp")]
        .clone()
        .unwrap()[0];
    assert_eq!(binding.host_ip.as_deref(), Some("127.0.0.1"));
    assert!(
        hc.device_requests.is_none(),
        "gpus_all=false must not request GPUs"
    );

    // Facts: the image is known; a scratch image has no pip or nvidia-smi, and says so.
    let facts = launch.target.facts().await;
    assert!(
        facts
            .image_id
            .as_deref()
            .unwrap_or("")
            .starts_with("sha256:"),
        "{facts:?}"
    );
    assert_eq!(facts.pip_freeze, None);
    assert!(
        facts
            .notes
            .iter()
            .any(|n| n.contains("pip freeze unavailable"))
    );

    // What goes into the run record.
    let observed = mxtune::launch::record::observed(&launch, Some("run.log".into()));
    let names: Vec<&str> = observed.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "starting",
            "loading weights",
            "capturing CUDA graphs",
            "starting server",
            "ready"
        ]
    );
    assert!(observed.startup_s.is_some());
    assert!(
        observed
            .kernel_path
            .iter()
            .all(|c| c.verdict == mxtune::record::schema::Verdict::Valid)
    );
    assert!(
        observed
            .warnings
            .iter()
            .any(|w| w.contains("VLLM_BOGUS_FLAG"))
    );

    let msg = launch.stop(o.stop_grace, false).await.unwrap();
    assert!(msg.contains("removed"), "{msg}");
    assert!(gone(&d, &id).await);
}

#[tokio::test]
async fn docker_missing_image_is_a_clear_error() {
    let Some(d) = docker_or_skip("docker_missing_image_is_a_clear_error").await else {
        return;
    };
    let spec = docker_spec("mxtune-test-no-such-image:never", free_port(), "m");
    let (tx, _rx) = mpsc::unbounded_channel();
    let err = DockerTarget::launch(d, &spec, &opts("noimg"), tx)
        .await
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("mxtune-test-no-such-image:never")
            && msg.contains("not present")
            && msg.contains("docker pull"),
        "{msg}"
    );
}

#[tokio::test]
async fn docker_port_in_use_blocks_preflight_and_leaves_nothing_behind() {
    let Some(d) =
        docker_or_skip("docker_port_in_use_blocks_preflight_and_leaves_nothing_behind").await
    else {
        return;
    };
    let image = test_image(&d).await;
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let spec = docker_spec(&image, port, "m");
    let findings = preflight::host_checks(&spec, false);
    assert!(
        findings
            .iter()
            .any(|f| f.severity == preflight::Severity::Error
                && f.message.contains(&format!("port {port}"))),
        "{findings:?}"
    );
    // Launching anyway: Docker cannot bind the port, and the created container is removed.
    let o = opts("port");
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, _rx) = mpsc::unbounded_channel();
    let err = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains(&format!("port {port}")),
        "{err:#}"
    );
    let left = docker::find_mxtune_containers(&d).await.unwrap();
    assert!(left.iter().all(|f| f.run_id != o.run_id), "{left:?}");
}

#[tokio::test]
async fn docker_crash_during_startup_reports_exit_code_and_last_lines() {
    let Some(d) =
        docker_or_skip("docker_crash_during_startup_reports_exit_code_and_last_lines").await
    else {
        return;
    };
    let image = test_image(&d).await;
    let mut spec = docker_spec(&image, free_port(), "m");
    spec.env.insert("MXTUNE_TEST_CRASH".into(), "3".into());
    let o = opts("crash");
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap();
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(err.contains("exit code 3"), "{err}");
    assert!(err.contains("simulated crash during start-up"), "{err}");
    assert!(err.contains("Loading weights took"), "{err}");
    let mxtune::launch::Target::Docker(t) = &launch.target else {
        panic!()
    };
    let id = t.id.clone();
    launch.stop(o.stop_grace, false).await.unwrap();
    assert!(gone(&d, &id).await);
    let events = drain(&mut rx);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, LaunchEvent::Exited { exit } if exit.code == Some(3)))
    );
}

#[tokio::test]
async fn docker_fatal_log_line_fails_a_running_container() {
    let Some(d) = docker_or_skip("docker_fatal_log_line_fails_a_running_container").await else {
        return;
    };
    let image = test_image(&d).await;
    let mut spec = docker_spec(&image, free_port(), "m");
    spec.env.insert("MXTUNE_TEST_FATAL".into(), "1".into());
    let o = opts("fatal");
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap();
    let err = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(err.contains("EngineCore failed to start"), "{err}");
    launch.stop(o.stop_grace, false).await.unwrap();
}

#[tokio::test]
async fn docker_reattach_after_restart_and_label_filter() {
    let Some(d) = docker_or_skip("docker_reattach_after_restart_and_label_filter").await else {
        return;
    };
    let image = test_image(&d).await;
    let port = free_port();
    let spec = docker_spec(&image, port, "m");
    let o = opts("reattach");
    let _cleanup = Cleanup(o.run_id.clone());
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut launch = DockerTarget::launch(d.clone(), &spec, &o, tx)
        .await
        .unwrap();
    launch.wait_ready().await.unwrap();
    // "mxtune exits": the follower goes away, the container keeps running.
    drop(launch.detach());
    drop(d);

    // A container mxtune did not start, from the same image.
    let d2 = docker::connect().await.unwrap();
    let foreign_name = format!("not-mxtune-{}", ulid::Ulid::generate()).to_lowercase();
    let foreign = d2
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(foreign_name.clone()),
                ..Default::default()
            }),
            bollard::models::ContainerCreateBody {
                image: Some(image.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // "mxtune restarts": a new client finds its container by label, and only by label.
    let found = docker::find_mxtune_containers(&d2).await.unwrap();
    let ours = found
        .iter()
        .find(|f| f.run_id == o.run_id)
        .expect("our container is found by label")
        .clone();
    assert_eq!(ours.state, "running");
    assert_eq!(ours.preset, "test-preset");
    assert!(
        found.iter().all(|f| f.id != foreign.id),
        "unlabelled container listed: {found:?}"
    );
    let refused = docker::stop_container(&d2, &foreign.id, &foreign_name, o.stop_grace, false)
        .await
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("will not touch it"),
        "{refused:#}"
    );
    assert!(!gone(&d2, &foreign.id).await);

    let (tx, _rx) = mpsc::unbounded_channel();
    // No spec after a restart: port and model come from the container's labels.
    let mut again = DockerTarget::reattach(d2.clone(), &ours, &LaunchSpec::default(), &o, tx)
        .await
        .unwrap();
    let info = again.wait_ready().await.unwrap();
    assert_eq!(streamed_completion(&info.url, "m", 2).await.len(), 2);
    assert_eq!(info.model, "m");
    // The log from before the restart is followed again.
    assert!(
        again
            .tail(100)
            .iter()
            .any(|l| l.contains("Uvicorn running on"))
    );
    again.stop(o.stop_grace, false).await.unwrap();
    assert!(gone(&d2, &ours.id).await);
    d2.remove_container(&foreign.id, None).await.unwrap();
}

#[tokio::test]
async fn docker_cli_launch_preset_leaves_it_running_then_stop_removes_it() {
    let Some(d) =
        docker_or_skip("docker_cli_launch_preset_leaves_it_running_then_stop_removes_it").await
    else {
        return;
    };
    let image = test_image(&d).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let name = format!("mxtune-cli-test-{}", ulid::Ulid::generate()).to_lowercase();
    // A preset as operators write them; the flags module renders `vllm serve …` from it,
    // and the test image runs the test server as `vllm`.
    let presets = dir.path().join("presets");
    std::fs::create_dir(&presets).unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(
        presets.join("cli-test.toml"),
        format!(
            "description = \"launch CLI test\"\ntarget = \"docker\"\n[axes]\nmoe_backend = \"marlin\"\ncuda_graphs = \"on\"\n\
             [serving]\nmodel = \"openai/gpt-oss-120b\"\nserved_model_name = \"cli\"\nhost = \"0.0.0.0\"\nport = {port}\n\
             [container]\nimage = \"{image}\"\nname = \"{name}\"\nnetwork = \"bridge\"\ngpus_all = false\nulimits = {{}}\nvllm = \"fork\"\nhf_cache = \"{}\"\njit_cache = \"{}\"\n",
            hf.display(),
            dir.path().join("jit").display()
        ),
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let run = |args: Vec<std::ffi::OsString>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = tokio::task::spawn_blocking({
        let (presets, runs) = (presets.clone(), runs.clone());
        move || {
            run(vec![
                "launch".into(),
                "--preset".into(),
                "cli-test".into(),
                "--presets-dir".into(),
                presets.into(),
                "--target".into(),
                "docker".into(),
                "--runs-dir".into(),
                runs.into(),
            ])
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let found = docker::find_mxtune_containers(&d).await.unwrap();
    let ours = found.iter().find(|f| f.name == name).cloned();
    let _cleanup = Cleanup(ours.as_ref().map(|f| f.run_id.clone()).unwrap_or_default());
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("kernel-path verdict:") && stdout.contains("moe_backend=marlin"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("mxtune stop {name}")), "{stdout}");
    let ours = ours.expect("the container is still there after mxtune exited");
    assert_eq!(ours.state, "running");
    assert_eq!(ours.preset, "cli-test");
    assert_eq!(ours.port, Some(port));
    // The rendered argv reached the server, and the run's log file sits in the runs dir.
    let log = std::fs::read_to_string(runs.join(format!("{}.target.log", ours.run_id))).unwrap();
    assert!(log.contains("\"serve\", \"openai/gpt-oss-120b\""), "{log}");
    assert!(log.contains("Uvicorn running on"));

    let out = tokio::task::spawn_blocking({
        let name = name.clone();
        move || {
            run(vec![
                "stop".into(),
                name.into(),
                "--grace-s".into(),
                "5".into(),
            ])
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped and removed"));
    assert!(gone(&d, &ours.id).await);
}

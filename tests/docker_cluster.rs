//! The two-node vLLM target (`docker-cluster`) on the local Docker engine: two containers of
//! the stand-in image play the Ray head and the Ray worker (the worker's engine reached through
//! the local sshd "host" when there is one), and `vllm serve … --distributed-executor-backend
//! ray` runs in the head once `ray status` shows both nodes and both GPUs.
//!
//! Without Docker these print `SKIPPED …` and pass (`MXTUNE_TEST_DOCKER=require` fails
//! instead); the CLI test needs sshd as remote_hosts.rs does (`MXTUNE_TEST_SSHD=require`).

mod support;

use mxtune::flags::FlagSet;
use mxtune::flags::model::{Parallel, Transport};
use mxtune::launch::cluster::{ClusterPlan, ClusterTarget, LABEL_HOST, LABEL_ROLE};
use mxtune::launch::{LaunchOptions, Status, docker};
use mxtune::vocab::{NetworkMode, TargetKind};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::sshd::sshd_or_skip;
use support::{Cleanup, docker_or_skip, free_port, streamed_completion, test_image};

const MXTUNE: &str = env!("CARGO_BIN_EXE_mxtune");

/// A docker-cluster flag set for the stand-in image: both nodes on this machine, no GPUs
/// requested (the stand-in counts one per node), caches in `dir`.
fn cluster_flags(image: &str, dir: &Path, port: u16, ray_port: u16) -> FlagSet {
    let mut fs = FlagSet {
        target: TargetKind::DockerCluster,
        ..FlagSet::default()
    };
    fs.container.image = image.into();
    fs.container.vllm = mxtune::flags::VllmFlavor::Fork;
    fs.container.network = NetworkMode::Host;
    fs.container.gpus_all = false;
    fs.container.ulimits.clear();
    fs.container.hf_cache = Some(dir.join("hf").display().to_string());
    fs.container.jit_cache = Some(dir.join("jit").display().to_string());
    fs.serving.port = port;
    fs.serving.host = Some("127.0.0.1".into());
    fs.serving.served_model_name = Some("tp2".into());
    fs.cluster.head = "local".into();
    fs.cluster.worker = "local".into();
    fs.cluster.ray_port = ray_port;
    fs
}

/// What every cluster test starts from: the Docker engine (or a visible skip), the stand-in
/// image built with `env`, a scratch directory, and [`cluster_flags`] on two free ports.
struct Setup {
    d: bollard::Docker,
    image: String,
    dir: tempfile::TempDir,
    port: u16,
    ray_port: u16,
    fs: FlagSet,
}

async fn setup(test: &str, env: &[(&str, &str)]) -> Option<Setup> {
    let d = docker_or_skip(test).await?;
    let image = support::test_image_with_env(&d, env).await;
    let dir = tempfile::tempdir().unwrap();
    let (port, ray_port) = (free_port(), free_port());
    let fs = cluster_flags(&image, dir.path(), port, ray_port);
    Some(Setup {
        d,
        image,
        dir,
        port,
        ray_port,
        fs,
    })
}

/// Write `fs` as preset `name` (with `description`) into `dir`/presets; returns that folder.
fn write_preset(dir: &Path, name: &str, description: &str, fs: &FlagSet) -> std::path::PathBuf {
    let presets = dir.join("presets");
    std::fs::create_dir_all(&presets).unwrap();
    let mut text = format!("description = \"{description}\"\n");
    text.push_str(&toml::to_string(fs).unwrap());
    std::fs::write(presets.join(format!("{name}.toml")), &text).unwrap();
    presets
}

fn local_plan(spec: &mxtune::vocab::LaunchSpec) -> ClusterPlan {
    ClusterPlan::resolve(spec.cluster.as_ref().unwrap(), |n| {
        anyhow::bail!("no hosts in this test, asked for {n}")
    })
    .unwrap()
}

fn opts(dir: &Path, run_id: &str) -> LaunchOptions {
    let mut o = LaunchOptions::new(run_id, "cluster-test").unwrap();
    o.startup_limit = Duration::from_secs(120);
    o.stop_grace = Duration::from_secs(2);
    o.log_path = Some(dir.join(format!("{run_id}.target.log")));
    o
}

/// Kills the worker container `id` and waits (up to a minute) for `launch` to end: its exit's
/// detail, or the test fails naming `what`.
async fn kill_worker_and_wait(
    d: &bollard::Docker,
    id: &str,
    launch: &mxtune::launch::Launch,
    what: &str,
) -> String {
    d.kill_container(id, None::<bollard::query_parameters::KillContainerOptions>)
        .await
        .unwrap();
    let mut status = launch.status();
    for _ in 0..600 {
        if matches!(status, Status::Exited(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = launch.status();
    }
    let Status::Exited(exit) = status else {
        panic!("{what} did not end when its worker died: {status:?}");
    };
    exit.detail.unwrap_or_default()
}

async fn containers_of(d: &bollard::Docker, run_id: &str) -> Vec<docker::Found> {
    docker::find_mxtune_containers(d)
        .await
        .unwrap()
        .into_iter()
        .filter(|f| f.run_id == run_id)
        .collect()
}

#[tokio::test]
async fn worker_that_never_joins_fails_readiness_naming_the_worker_host() {
    let test = "worker_that_never_joins_fails_readiness_naming_the_worker_host";
    let Some(Setup {
        d,
        dir,
        ray_port,
        mut fs,
        ..
    }) = setup(test, &[]).await
    else {
        return;
    };
    fs.cluster.join_limit_s = 3;
    // The stand-in's worker never reaches the head (as behind a firewall).
    fs.container
        .env
        .insert("MXTUNE_TEST_RAY_JOIN".into(), "never".into());
    let spec = mxtune::flags::render(&fs, TargetKind::DockerCluster).unwrap();
    let run_id = ulid::Ulid::generate().to_string();
    let _cleanup = Cleanup(run_id.clone());
    // An image missing on a node is an error naming the host, and nothing is started.
    let mut missing = spec.clone();
    missing.container.as_mut().unwrap().image = "mxtune-test-no-such-image:1".into();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let e = ClusterTarget::launch(
        local_plan(&missing),
        &missing,
        &opts(dir.path(), &run_id),
        tx,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("image mxtune-test-no-such-image:1 is not present on host local (the head)"),
        "{e}"
    );
    assert!(containers_of(&d, &run_id).await.is_empty());

    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut launch =
        ClusterTarget::launch(local_plan(&spec), &spec, &opts(dir.path(), &run_id), tx)
            .await
            .unwrap();
    let e = format!("{:#}", launch.wait_ready().await.unwrap_err());
    assert!(
        e.contains(&format!(
            "the Ray worker on host local (container mxtune-{run_id}-worker) did not join the Ray cluster at 127.0.0.1:{ray_port} within the join limit of 3 s (ray status on the head: 1 node(s), 1 GPU(s))"
        )),
        "{e}"
    );
    assert!(e.contains("[worker local] Local node IP: 127.0.0.1"), "{e}");
    // The server was never started.
    let log = std::fs::read_to_string(dir.path().join(format!("{run_id}.target.log"))).unwrap();
    assert!(!log.contains("Connecting to existing Ray cluster"), "{log}");
    assert_eq!(containers_of(&d, &run_id).await.len(), 2);
    let msg = launch.stop(Duration::from_secs(2), false).await.unwrap();
    assert!(msg.contains("on host local"), "{msg}");
    assert!(containers_of(&d, &run_id).await.is_empty());
}

#[tokio::test]
async fn socket_fallback_is_a_warning_and_a_lost_worker_ends_the_run_with_its_record_kept() {
    let test = "socket_fallback_is_a_warning_and_a_lost_worker_ends_the_run_with_its_record_kept";
    let Some(Setup { d, dir, mut fs, .. }) = setup(test, &[]).await else {
        return;
    };
    fs.cluster.parallel = Parallel::Pipeline;
    // NCCL told to leave InfiniBand alone falls back to sockets, as it does without RDMA.
    fs.container
        .env
        .insert("NCCL_IB_DISABLE".into(), "1".into());
    let spec = mxtune::flags::render(&fs, TargetKind::DockerCluster).unwrap();
    let run_id = ulid::Ulid::generate().to_string();
    let _cleanup = Cleanup(run_id.clone());
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut launch =
        ClusterTarget::launch(local_plan(&spec), &spec, &opts(dir.path(), &run_id), tx)
            .await
            .unwrap();
    let ready = launch.wait_ready().await.unwrap();
    assert_eq!(ready.model, "tp2");
    assert_eq!(
        streamed_completion(&ready.url, "tp2", 3).await,
        [" tok0", " tok1", " tok2"]
    );
    let log = std::fs::read_to_string(dir.path().join(format!("{run_id}.target.log"))).unwrap();
    assert!(log.contains("--pipeline-parallel-size\", \"2\""), "{log}");
    assert!(log.contains("pipeline_parallel_size=2"), "{log}");
    // Both nodes' own lines are in the log, marked with their role and host.
    assert!(log.contains("[head local] Ray runtime started."), "{log}");
    assert!(log.contains("[worker local] Ray runtime started."), "{log}");

    let report = launch.report();
    let nccl = report
        .checks
        .iter()
        .find(|c| c.flag == "nccl_transport")
        .expect("an nccl_transport check");
    assert_eq!(nccl.value, "rdma");
    assert_eq!(nccl.verdict, mxtune::launch::Verdict::Invalid);
    assert!(
        nccl.forbidden_seen
            .iter()
            .any(|l| l.contains("NCCL INFO Using network Socket")),
        "{nccl:?}"
    );
    let warnings = launch.history().warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("NCCL between host local and host local fell back to sockets")),
        "{warnings:?}"
    );

    // Both hosts' environment goes into the record.
    let facts = launch.target.facts().await;
    assert_eq!(facts.kind, "docker-cluster");
    assert_eq!(facts.nodes.len(), 2);
    assert_eq!(facts.nodes[0].role, "head");
    assert_eq!(facts.nodes[1].role, "worker");
    assert_eq!(facts.nodes[1].env["VLLM_HOST_IP"], "127.0.0.1");
    assert!(facts.nodes[1].kernel.is_some(), "{:?}", facts.nodes[1]);

    // The worker dies mid-run: the launch says so and ends, and the record keeps it all.
    let worker = containers_of(&d, &run_id)
        .await
        .into_iter()
        .find(|f| f.cluster_role.as_deref() == Some("worker"))
        .unwrap();
    let detail = kill_worker_and_wait(&d, &worker.id, &launch, "the cluster").await;
    assert!(
        detail.starts_with(&format!(
            "the Ray worker container {} on host local exited",
            worker.name
        )),
        "{detail}"
    );
    let observed = mxtune::launch::record::observed(&launch, None);
    assert!(
        observed
            .warnings
            .iter()
            .any(|w| w.contains("has lost the worker's GPU and cannot serve")),
        "{:?}",
        observed.warnings
    );
    let mut record = mxtune::record::schema::RunRecord::new(
        TargetKind::DockerCluster,
        Some("cluster-test".into()),
    );
    record.observed = observed;
    mxtune::launch::record::apply_facts(&facts, &mut record.target, &mut record.environment);
    let store = mxtune::record::store::RunStore::new(dir.path().join("runs"));
    let handle = store.create(record).unwrap();
    let back = mxtune::record::store::load_file(handle.path()).unwrap();
    assert_eq!(back.target.kind, TargetKind::DockerCluster);
    assert_eq!(back.environment.nodes.len(), 2);
    assert_eq!(back.environment.nodes[1].host, "local");
    assert!(
        back.observed
            .kernel_path
            .iter()
            .any(|c| c.flag == "nccl_transport" && c.reason.is_some()),
        "{:?}",
        back.observed.kernel_path
    );

    let msg = launch.stop(Duration::from_secs(2), false).await.unwrap();
    assert!(
        msg.contains("already gone") || msg.contains("removed"),
        "{msg}"
    );
    assert!(containers_of(&d, &run_id).await.is_empty());
}

#[tokio::test]
async fn cli_launches_a_cluster_with_the_worker_over_ssh_and_stops_only_its_containers() {
    let test = "cli_launches_a_cluster_with_the_worker_over_ssh_and_stops_only_its_containers";
    let Some(Setup {
        d,
        image,
        dir,
        port,
        ray_port,
        mut fs,
    }) = setup(test, &[]).await
    else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    fs.cluster.worker = "remote".into();
    fs.cluster.local_ip = Some("127.0.0.1".into());
    fs.cluster.transport = Transport::Rdma;
    fs.cluster.nccl.ib_hca = Some("rocep1s0f1".into());
    std::fs::create_dir_all(dir.path().join("hf")).unwrap();
    // A cache that is not there yet: pre-flight on each node says it will be created.
    let jit = dir.path().join("jit-missing");
    fs.container.jit_cache = Some(jit.display().to_string());
    let presets = write_preset(dir.path(), "tp2", "two nodes", &fs);
    // The worker's host is the local sshd standing in for a second Spark.
    let home = sshd.config_home(&format!(
        "{}[host.nccl]\nhost_ip = \"127.0.0.1\"\nsocket_ifname = \"lo\"\n",
        sshd.host_entry("remote", MXTUNE)
    ));
    let runs = dir.path().join("runs");
    let run = |args: Vec<String>| {
        let home = home.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new(MXTUNE)
                    .args(&args)
                    .env("XDG_CONFIG_HOME", &home)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let p = presets.display().to_string();
    let r = runs.display().to_string();

    // --host makes no sense for a preset that names its hosts.
    let o = run(vec![
        "launch".into(),
        "--preset".into(),
        "tp2".into(),
        "--presets-dir".into(),
        p.clone(),
        "--host".into(),
        "remote".into(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("names its two hosts itself"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A container of another run, labelled like a cluster node: stop must leave it alone.
    let other = format!("mxtune-test-other-{}", ulid::Ulid::generate()).to_lowercase();
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.clone()),
        labels: Some(std::collections::HashMap::from([
            (docker::LABEL_RUN_ID.to_string(), "other-run".to_string()),
            (LABEL_ROLE.to_string(), "worker".to_string()),
        ])),
        ..Default::default()
    };
    d.create_container(
        Some(bollard::query_parameters::CreateContainerOptions {
            name: Some(other.clone()),
            ..Default::default()
        }),
        body,
    )
    .await
    .unwrap();
    let _other = Cleanup("other-run".into());

    let o = run(vec![
        "launch".into(),
        "--preset".into(),
        "tp2".into(),
        "--presets-dir".into(),
        p.clone(),
        "--runs-dir".into(),
        r.clone(),
        "--startup-limit-s".into(),
        "120".into(),
    ])
    .await;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    let ours: Vec<docker::Found> = docker::find_mxtune_containers(&d)
        .await
        .unwrap()
        .into_iter()
        .filter(|f| f.preset == "tp2")
        .collect();
    let run_id = ours.first().map(|f| f.run_id.clone()).unwrap_or_default();
    let _cleanup = Cleanup(run_id.clone());
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{err}\nsshd log:\n{}",
        sshd.log()
    );
    assert!(
        err.contains(&format!(
            "cluster: Ray head on host local (127.0.0.1), worker on host remote (127.0.0.1), Ray at 127.0.0.1:{ray_port}, tensor parallel over 2 GPUs, expecting NCCL over rdma"
        )),
        "{err}"
    );
    assert!(out.contains("nccl_transport=rdma: Valid"), "{out}");
    // Pre-flight ran on both nodes: here for the head, over SSH on the worker's host.
    assert!(
        err.contains(&format!(
            "pre-flight Warning (head): mount source {}",
            jit.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "pre-flight Warning (worker): on host remote: mount source {}",
            jit.display()
        )),
        "{err}"
    );
    assert!(
        out.contains(&format!("mxtune stop --cluster tp2 {run_id}")),
        "{out}"
    );
    assert!(!err.contains("fell back to sockets"), "{err}");
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert!(ours.iter().all(|f| f.state == "running"));
    let worker = ours
        .iter()
        .find(|f| f.cluster_role.as_deref() == Some("worker"))
        .unwrap();
    let labels = d
        .inspect_container(&worker.id, None)
        .await
        .unwrap()
        .config
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(labels[LABEL_HOST], "remote");
    // The worker got the host's and the preset's NCCL settings.
    let env = d
        .inspect_container(&worker.id, None)
        .await
        .unwrap()
        .config
        .unwrap()
        .env
        .unwrap();
    for want in [
        "NCCL_SOCKET_IFNAME=lo",
        "NCCL_IB_HCA=rocep1s0f1",
        "VLLM_HOST_IP=127.0.0.1",
    ] {
        assert!(env.iter().any(|e| e == want), "{want} not in {env:?}");
    }
    // The server keeps serving after the command ended.
    assert_eq!(
        streamed_completion(&format!("http://127.0.0.1:{port}"), "tp2", 2).await,
        [" tok0", " tok1"]
    );
    let log = std::fs::read_to_string(runs.join(format!("{run_id}.target.log"))).unwrap();
    assert!(
        log.contains(
            "--tensor-parallel-size\", \"2\", \"--distributed-executor-backend\", \"ray\""
        ),
        "{log}"
    );
    assert!(
        log.contains("(RayWorkerWrapper pid=201, ip=127.0.0.1)"),
        "{log}"
    );

    let o = run(vec![
        "stop".into(),
        "--cluster".into(),
        "tp2".into(),
        "--presets-dir".into(),
        p.clone(),
        run_id.clone(),
        "--grace-s".into(),
        "2".into(),
    ])
    .await;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(
        out.matches("stopped and removed container").count(),
        2,
        "{out}"
    );
    assert!(out.contains("on host remote"), "{out}");
    assert!(containers_of(&d, &run_id).await.is_empty());
    assert!(
        d.inspect_container(&other, None).await.is_ok(),
        "stop removed another run's container"
    );
}

/// The panel launches a docker-cluster preset (both nodes here), shows it ready, and reports
/// the worker's death as the target's end with its reason; its stop removes the head too.
#[test]
fn panel_launches_a_cluster_and_reports_a_dead_worker() {
    use mxtune::flags::preset::PresetStore;
    use mxtune::tui::app::{App, Effect, Paths, Tab};
    use mxtune::tui::screens::launch::TargetState;
    use mxtune::tui::{perform, step, ui};
    let test = "panel_launches_a_cluster_and_reports_a_dead_worker";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(d) = rt.block_on(docker_or_skip(test)) else {
        return;
    };
    let image = rt.block_on(test_image(&d));
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut bg = mxtune::tui::background::Background::new(tx).unwrap();
    let mut a = App::new(
        mxtune::tui::theme::Theme {
            color: false,
            ascii: false,
        },
        Paths {
            presets: PresetStore::new(vec![dir.path().join("presets")]),
            save_dir: dir.path().join("presets"),
            runs_dir: dir.path().join("runs"),
            export_dir: dir.path().to_path_buf(),
        },
    );
    a.flags.flags = cluster_flags(&image, dir.path(), free_port(), free_port());
    a.launch.choice = TargetKind::DockerCluster;
    a.tab = Tab::Launch;
    a.launch.state = TargetState::Launching;
    perform(&mut a, &mut bg, Effect::StartTarget);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let pump = |a: &mut App,
                bg: &mut mxtune::tui::background::Background,
                what: &str,
                done: &dyn Fn(&App) -> bool| {
        while !done(a) {
            assert!(
                std::time::Instant::now() < deadline,
                "never reached: {what}"
            );
            if let Ok(ev) = rx.recv_timeout(Duration::from_millis(200)) {
                step(a, bg, ev);
            }
        }
    };
    pump(&mut a, &mut bg, "ready", &|a| {
        matches!(
            a.launch.state,
            TargetState::Ready { .. } | TargetState::Failed(_)
        )
    });
    assert!(
        matches!(a.launch.state, TargetState::Ready { .. }),
        "{:?}",
        a.launch.state
    );
    let describe = a.launch.describe.clone().unwrap();
    assert!(
        describe.starts_with("cluster of container mxtune-") && describe.contains("(Ray worker)"),
        "{describe}"
    );
    let run = rt.block_on(docker::find_mxtune_containers(&d)).unwrap();
    let worker = run
        .iter()
        .find(|f| f.cluster_role.as_deref() == Some("worker") && describe.contains(&f.name))
        .expect("the worker container")
        .clone();
    let _cleanup = Cleanup(worker.run_id.clone());
    rt.block_on(d.kill_container(
        &worker.id,
        None::<bollard::query_parameters::KillContainerOptions>,
    ))
    .unwrap();
    pump(&mut a, &mut bg, "the target's end", &|a| {
        matches!(
            a.launch.state,
            TargetState::Exited(_) | TargetState::Failed(_)
        )
    });
    let TargetState::Exited(why) = &a.launch.state else {
        panic!("{:?}", a.launch.state);
    };
    assert!(
        why.contains(&format!(
            "the Ray worker container {} on host local exited",
            worker.name
        )),
        "{why}"
    );
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(200, 40)).unwrap();
    t.draw(|f| ui::draw(f, &a)).unwrap();
    let s = t.backend().to_string();
    assert!(s.contains("Ray worker container"), "{s}");
    perform(&mut a, &mut bg, Effect::StopTarget);
    // The panel's stop goes to both nodes: the running head and the dead worker are removed.
    pump(
        &mut a,
        &mut bg,
        "stopped",
        &|a| matches!(&a.launch.state, TargetState::Exited(m) if m.contains("removed container")),
    );
    let TargetState::Exited(stopped) = &a.launch.state else {
        unreachable!()
    };
    assert!(stopped.contains("-head on host local"), "{stopped}");
    assert!(stopped.contains("-worker on host local"), "{stopped}");
    let left = rt.block_on(containers_of(&d, &worker.run_id));
    assert!(left.is_empty(), "{left:?}");
}

/// A cluster whose head (and API) is on the sshd "host" and whose worker is here: `launch`
/// leaves it running, `launch --reattach RUN_ID` finds both nodes by their labels on both
/// hosts, probes the server through a new forward of the head's API port and gives the same
/// verdict (the server's lines read back from the launch's log); the library's re-attach serves
/// through its forward while it holds it and reports the worker's death as a launch does;
/// unknown runs, a lone node and a preset that is not a cluster are refused with what to do;
/// `stop --cluster` removes both nodes.
#[tokio::test]
async fn cli_reattaches_to_a_cluster_whose_head_is_over_ssh() {
    let test = "cli_reattaches_to_a_cluster_whose_head_is_over_ssh";
    let Some(Setup {
        d,
        image,
        dir,
        port,
        ray_port: _,
        mut fs,
    }) = setup(test, &[]).await
    else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    fs.cluster.head = "remote".into();
    fs.cluster.worker = "local".into();
    fs.cluster.local_ip = Some("127.0.0.1".into());
    fs.cluster.transport = Transport::Rdma;
    std::fs::create_dir_all(dir.path().join("hf")).unwrap();
    std::fs::create_dir_all(dir.path().join("jit")).unwrap();
    let presets = write_preset(dir.path(), "tp2-re", "two nodes, head over ssh", &fs);
    // A single-container preset of the same image.
    let mut single = fs.clone();
    single.target = TargetKind::Docker;
    single.cluster = Default::default();
    let mut text = String::from("description = \"one container\"\n");
    text.push_str(&toml::to_string(&single).unwrap());
    std::fs::write(presets.join("single.toml"), &text).unwrap();
    let home = sshd.config_home(&format!(
        "{}[host.nccl]\nhost_ip = \"127.0.0.1\"\n",
        sshd.host_entry("remote", MXTUNE)
    ));
    let runs = dir.path().join("runs");
    let run = |args: Vec<&str>| {
        let home = home.clone();
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        async move {
            let o = tokio::task::spawn_blocking(move || {
                Command::new(MXTUNE)
                    .args(&args)
                    .env("XDG_CONFIG_HOME", &home)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    };
    let p = presets.display().to_string();
    let r = runs.display().to_string();
    let launch_args = |preset: &'static str| {
        vec![
            "launch",
            "--preset",
            preset,
            "--presets-dir",
            &p,
            "--runs-dir",
            &r,
            "--startup-limit-s",
            "120",
        ]
    };

    let (code, out, err) = run(launch_args("tp2-re")).await;
    let ours: Vec<docker::Found> = docker::find_mxtune_containers(&d)
        .await
        .unwrap()
        .into_iter()
        .filter(|f| f.preset == "tp2-re" && f.cluster_role.is_some())
        .collect();
    let run_id = ours.first().map(|f| f.run_id.clone()).unwrap_or_default();
    let _cleanup = Cleanup(run_id.clone());
    assert_eq!(code, Some(0), "{out}{err}\nsshd log:\n{}", sshd.log());
    assert_eq!(ours.len(), 2, "{ours:?}");
    let head = ours
        .iter()
        .find(|f| f.cluster_role.as_deref() == Some("head"))
        .unwrap();
    assert_eq!(head.cluster_host.as_deref(), Some("remote"));

    // No such run on those hosts.
    let mut args = launch_args("tp2-re");
    args.extend(["--reattach", "no-such-run"]);
    let (code, _, err) = run(args).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no container of run \"no-such-run\" on host remote (the Ray head) or host local (the Ray worker)"),
        "{err}"
    );
    // A preset that is not a cluster: the cluster's preset is named.
    let mut args = launch_args("single");
    args.extend(["--reattach", &run_id]);
    let (code, _, err) = run(args).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("of two-node cluster run {run_id} (preset tp2-re); --reattach with preset single, which is not a docker-cluster preset,")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "`mxtune launch --preset tp2-re --reattach {run_id}`"
        )),
        "{err}"
    );
    // A run with only its head left (labelled as a launch labels it): the worker is named
    // as missing, with its host.
    let lone_run = format!("lone-{}", ulid::Ulid::generate()).to_lowercase();
    let lone = format!("mxtune-{lone_run}-head");
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.clone()),
        labels: Some(std::collections::HashMap::from([
            (docker::LABEL_RUN_ID.to_string(), lone_run.clone()),
            (docker::LABEL_PRESET.to_string(), "tp2-re".to_string()),
            (LABEL_ROLE.to_string(), "head".to_string()),
            (LABEL_HOST.to_string(), "remote".to_string()),
        ])),
        ..Default::default()
    };
    d.create_container(
        Some(bollard::query_parameters::CreateContainerOptions {
            name: Some(lone.clone()),
            ..Default::default()
        }),
        body,
    )
    .await
    .unwrap();
    let _lone = Cleanup(lone_run.clone());
    let mut args = launch_args("tp2-re");
    args.extend(["--reattach", &lone_run]);
    let (code, _, err) = run(args).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("run {lone_run} has its Ray head (container {lone}) on host remote, but no Ray worker container on host local")),
        "{err}"
    );

    // The re-attach: both nodes found, the API probed through a new forward, the verdict
    // from the server's lines as the launch logged them.
    let mut args = launch_args("tp2-re");
    args.extend(["--reattach", &run_id]);
    let (code, out, err) = run(args).await;
    assert_eq!(code, Some(0), "{out}{err}\nsshd log:\n{}", sshd.log());
    assert!(
        err.contains(&format!("re-attaching to run {run_id}: cluster of container mxtune-{run_id}-head on host remote (Ray head, API) and container mxtune-{run_id}-worker on host local (Ray worker)")),
        "{err}"
    );
    let ready = out
        .lines()
        .find(|l| l.starts_with("ready: http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no ready line:\n{out}"));
    assert!(ready.contains("serves \"tp2\""), "{ready}");
    assert!(
        !ready.contains(&format!(":{port} ")),
        "probed the server's own port, not a forward: {ready}"
    );
    assert!(out.contains("nccl_transport=rdma: Valid"), "{out}");
    assert!(
        out.contains(&format!(
            "(stop with `mxtune stop --cluster tp2-re {run_id}`)"
        )),
        "{out}"
    );
    assert!(!err.contains("is not here"), "{err}");

    // The library's re-attach holds its forward while it follows: the server answers there.
    let mut remote = sshd.host("remote", MXTUNE);
    remote.nccl.host_ip = Some("127.0.0.1".into());
    let spec = mxtune::flags::render(&fs, TargetKind::DockerCluster).unwrap();
    let plan = ClusterPlan::resolve(spec.cluster.as_ref().unwrap(), |n| {
        anyhow::ensure!(n == "remote", "no host {n}");
        Ok(remote.clone())
    })
    .unwrap();
    let mut o = opts(dir.path(), &ulid::Ulid::generate().to_string());
    o.preset = "tp2-re".into();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut launch = ClusterTarget::reattach(plan, &spec, &run_id, Some(&runs), &o, tx)
        .await
        .unwrap();
    let info = launch.wait_ready().await.unwrap();
    assert_ne!(info.url, format!("http://127.0.0.1:{port}"));
    assert_eq!(
        streamed_completion(&info.url, "tp2", 2).await,
        [" tok0", " tok1"]
    );
    let mxtune::launch::Target::Cluster(c) = &launch.target else {
        panic!("not a cluster: {:?}", launch.target);
    };
    assert_eq!(c.tunnels(), 1);
    assert_eq!(c.run_id, run_id);
    // The worker dies: the re-attached launch ends with it, as a launch does.
    let worker = ours
        .iter()
        .find(|f| f.cluster_role.as_deref() == Some("worker"))
        .unwrap();
    let detail = kill_worker_and_wait(&d, &worker.id, &launch, "the re-attached cluster").await;
    assert!(detail.starts_with(&format!(
        "the Ray worker container {} on host local exited",
        worker.name
    )),);
    assert!(
        launch
            .history()
            .warnings
            .iter()
            .any(|w| w.contains("has lost the worker's GPU and cannot serve")),
        "{:?}",
        launch.history().warnings
    );
    drop(launch.detach());

    let (code, out, err) = run(vec![
        "stop",
        "--cluster",
        "tp2-re",
        "--presets-dir",
        &p,
        &run_id,
        "--grace-s",
        "2",
    ])
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out.matches("stopped and removed container").count(),
        2,
        "{out}"
    );
    assert!(containers_of(&d, &run_id).await.is_empty());
}

/// The mxtune probe containers of `image` still there (none once a version probe is over).
async fn probe_leftovers(d: &bollard::Docker, image: &str) -> Vec<String> {
    let filters = std::collections::HashMap::from([
        ("label".to_string(), vec![docker::LABEL_PROBE.to_string()]),
        ("ancestor".to_string(), vec![image.to_string()]),
    ]);
    let opts = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    d.list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// A stock-image (`vllm = "upstream"`) cluster preset is rendered for the release the head's
/// image says it carries, asked on the head's engine through its SSH tunnel: the stand-in
/// plays vLLM 0.12.0, which takes the attention backend from `VLLM_ATTENTION_BACKEND` and
/// refuses `--attention-backend` (the newest known release's form), so the cluster serves only
/// when the probe decided the names.
#[tokio::test]
async fn cli_renders_a_stock_image_cluster_for_the_release_of_the_heads_image() {
    let test = "cli_renders_a_stock_image_cluster_for_the_release_of_the_heads_image";
    let Some(Setup {
        d,
        image,
        dir,
        port,
        ray_port: _,
        mut fs,
    }) = setup(test, &[("MXTUNE_TEST_VLLM_VERSION", "0.12.0")]).await
    else {
        return;
    };
    let Some(sshd) = sshd_or_skip(test) else {
        return;
    };
    fs.container.vllm = mxtune::flags::VllmFlavor::Upstream;
    fs.set_axis("attention_backend", "TRITON_ATTN").unwrap();
    fs.cluster.head = "remote".into();
    fs.cluster.worker = "local".into();
    fs.cluster.local_ip = Some("127.0.0.1".into());
    std::fs::create_dir_all(dir.path().join("hf")).unwrap();
    std::fs::create_dir_all(dir.path().join("jit")).unwrap();
    let presets = write_preset(dir.path(), "tp2-stock", "two nodes, stock image", &fs);
    let home = sshd.config_home(&format!(
        "{}[host.nccl]\nhost_ip = \"127.0.0.1\"\n",
        sshd.host_entry("remote", MXTUNE)
    ));
    let runs = dir.path().join("runs");
    let p = presets.display().to_string();
    let r = runs.display().to_string();
    let run = |args: Vec<String>| {
        let home = home.clone();
        async move {
            let o = tokio::task::spawn_blocking(move || {
                Command::new(MXTUNE)
                    .args(&args)
                    .env("XDG_CONFIG_HOME", &home)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    };
    let (code, out, err) = run([
        "launch",
        "--preset",
        "tp2-stock",
        "--presets-dir",
        &p,
        "--runs-dir",
        &r,
        "--startup-limit-s",
        "120",
    ]
    .map(String::from)
    .to_vec())
    .await;
    let ours: Vec<docker::Found> = docker::find_mxtune_containers(&d)
        .await
        .unwrap()
        .into_iter()
        .filter(|f| f.preset == "tp2-stock")
        .collect();
    let run_id = ours.first().map(|f| f.run_id.clone()).unwrap_or_default();
    let _cleanup = Cleanup(run_id.clone());
    assert_eq!(code, Some(0), "{out}{err}\nsshd log:\n{}", sshd.log());
    assert!(
        err.contains("dialect: upstream vLLM 0.12.0 (vllm --version)"),
        "{err}"
    );
    assert!(!err.contains("note:"), "{err}");
    assert_eq!(
        probe_leftovers(&d, &image).await,
        Vec::<String>::new(),
        "the version probe removes its container"
    );
    // 0.12's names: the backend in the server's environment, not on its command line.
    let log = std::fs::read_to_string(runs.join(format!("{run_id}.target.log"))).unwrap();
    assert!(log.contains("--distributed-executor-backend"), "{log}");
    assert!(!log.contains("--attention-backend"), "{log}");
    assert_eq!(
        streamed_completion(&format!("http://127.0.0.1:{port}"), "tp2", 2).await,
        [" tok0", " tok1"]
    );
    let (code, out, err) = run([
        "stop",
        "--cluster",
        "tp2-stock",
        "--presets-dir",
        &p,
        &run_id,
        "--grace-s",
        "2",
    ]
    .map(String::from)
    .to_vec())
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(containers_of(&d, &run_id).await.is_empty());
}

/// The panel's `r` re-attaches to the newest running cluster of the loaded docker-cluster
/// preset (both nodes here) through the library's re-attach: none running is an error saying
/// so; a cluster `mxtune launch` left running is found by its labels, ready again with
/// `nccl_transport` valid from the server's lines read back from the launch's log, Live gets its
/// host, and the panel's stop removes both containers.
#[test]
fn panel_reattaches_to_a_cluster_left_running_by_the_cli() {
    use mxtune::flags::preset::PresetStore;
    use mxtune::tui::app::{App, Effect, Paths, Tab};
    use mxtune::tui::screens::launch::TargetState;
    use mxtune::tui::{perform, step};
    let test = "panel_reattaches_to_a_cluster_left_running_by_the_cli";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(Setup {
        d,
        dir,
        port,
        mut fs,
        ..
    }) = rt.block_on(setup(test, &[]))
    else {
        return;
    };
    fs.cluster.transport = Transport::Rdma;
    std::fs::create_dir_all(dir.path().join("hf")).unwrap();
    std::fs::create_dir_all(dir.path().join("jit")).unwrap();
    let presets = write_preset(dir.path(), "tp2-panel", "two nodes here", &fs);
    let runs = dir.path().join("runs");
    // No hosts file: both nodes are this machine.
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    let mut bg = mxtune::tui::background::Background::new(tx).unwrap();
    let mut a = App::new(
        mxtune::tui::theme::Theme {
            color: false,
            ascii: false,
        },
        Paths {
            presets: PresetStore::new(vec![presets.clone()]),
            save_dir: presets.clone(),
            runs_dir: runs.clone(),
            export_dir: dir.path().to_path_buf(),
        },
    );
    perform(&mut a, &mut bg, Effect::LoadPreset("tp2-panel".into()));
    a.tab = Tab::Launch;
    assert_eq!(a.launch.choice, TargetKind::DockerCluster);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let pump = |a: &mut App,
                bg: &mut mxtune::tui::background::Background,
                what: &str,
                done: &dyn Fn(&App) -> bool| {
        while !done(a) {
            assert!(
                std::time::Instant::now() < deadline,
                "never reached: {what}"
            );
            if let Ok(ev) = rx.recv_timeout(Duration::from_millis(200)) {
                step(a, bg, ev);
            }
        }
    };
    let settled = |a: &App| {
        matches!(
            a.launch.state,
            TargetState::Ready { .. } | TargetState::Failed(_) | TargetState::Exited(_)
        )
    };

    // Nothing of the preset runs yet.
    assert!(
        a.on_key(crossterm::event::KeyEvent::new(
            crossterm::event::KeyCode::Char('r'),
            crossterm::event::KeyModifiers::NONE
        ))
        .contains(&Effect::ReattachTarget)
    );
    perform(&mut a, &mut bg, Effect::ReattachTarget);
    pump(&mut a, &mut bg, "the refusal", &settled);
    let TargetState::Failed(why) = &a.launch.state else {
        panic!("{:?}", a.launch.state);
    };
    assert!(
        why.contains("no running cluster of preset tp2-panel has its Ray head on host local"),
        "{why}"
    );

    let o = Command::new(MXTUNE)
        .args(["launch", "--preset", "tp2-panel", "--presets-dir"])
        .arg(&presets)
        .arg("--runs-dir")
        .arg(&runs)
        .args(["--startup-limit-s", "120"])
        .env("XDG_CONFIG_HOME", &config)
        .output()
        .unwrap();
    let ours: Vec<docker::Found> = rt
        .block_on(docker::find_mxtune_containers(&d))
        .unwrap()
        .into_iter()
        .filter(|f| f.preset == "tp2-panel")
        .collect();
    let run_id = ours.first().map(|f| f.run_id.clone()).unwrap_or_default();
    let _cleanup = Cleanup(run_id.clone());
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(ours.len(), 2, "{ours:?}");

    a.on_key(crossterm::event::KeyEvent::new(
        crossterm::event::KeyCode::Char('r'),
        crossterm::event::KeyModifiers::NONE,
    ));
    perform(&mut a, &mut bg, Effect::ReattachTarget);
    pump(&mut a, &mut bg, "ready again", &settled);
    assert!(
        matches!(a.launch.state, TargetState::Ready { .. }),
        "{:?}\n{:?}",
        a.launch.state,
        a.launch.log.lines
    );
    assert_eq!(a.launch.run_id.as_deref(), Some(run_id.as_str()));
    let describe = a.launch.describe.clone().unwrap();
    assert!(
        describe.contains(&format!("mxtune-{run_id}-head")) && describe.contains("(Ray worker)"),
        "{describe}"
    );
    assert!(
        a.launch
            .log
            .lines
            .iter()
            .any(|l| l == &format!("re-attaching to run {run_id}: {describe}")),
        "{:?}",
        a.launch.log.lines
    );
    pump(&mut a, &mut bg, "the verdict", &|a| {
        a.launch.report.is_some()
    });
    let report = a.launch.report.clone().unwrap();
    let nccl = report
        .checks
        .iter()
        .find(|c| c.flag == "nccl_transport")
        .expect("nccl_transport in the verdict");
    assert_eq!(nccl.verdict, mxtune::launch::Verdict::Valid, "{nccl:?}");
    assert_eq!(
        rt.block_on(streamed_completion(
            &format!("http://127.0.0.1:{port}"),
            "tp2",
            2
        )),
        [" tok0", " tok1"]
    );

    perform(&mut a, &mut bg, Effect::StopTarget);
    pump(
        &mut a,
        &mut bg,
        "stopped",
        &|a| matches!(&a.launch.state, TargetState::Exited(m) if m.contains("removed container")),
    );
    assert!(rt.block_on(containers_of(&d, &run_id)).is_empty());
}

/// A matrix of one docker-cluster preset (both nodes here) launches it as `mxtune launch`
/// does, benchmarks it through the head's API, records both nodes and the `nccl_transport`
/// verdict, and stops both containers; with `--host`, or under another `--target`, the
/// preset is refused before anything starts.
#[tokio::test]
async fn matrix_runs_a_cluster_preset_and_records_both_nodes() {
    let test = "matrix_runs_a_cluster_preset_and_records_both_nodes";
    let Some(Setup {
        d,
        dir,
        port,
        mut fs,
        ..
    }) = setup(test, &[]).await
    else {
        return;
    };
    fs.cluster.transport = Transport::Rdma;
    std::fs::create_dir_all(dir.path().join("hf")).unwrap();
    std::fs::create_dir_all(dir.path().join("jit")).unwrap();
    let presets = write_preset(dir.path(), "tp2-matrix", "two nodes, matrix", &fs);
    // A hosts file naming a host, for the --host refusals (nothing is reached there).
    let home = dir.path().join("config");
    std::fs::create_dir_all(home.join("mxtune")).unwrap();
    std::fs::write(
        home.join("mxtune/hosts.toml"),
        "[[host]]\nname = \"remote\"\nssh = \"mxtune-test-unreachable\"\n",
    )
    .unwrap();
    let (p, runs, out) = (
        presets.clone(),
        dir.path().join("runs"),
        dir.path().join("out"),
    );
    let run = |args: Vec<String>| {
        let (home, p, runs) = (home.clone(), p.clone(), runs.clone());
        async move {
            let o = tokio::task::spawn_blocking(move || {
                Command::new(MXTUNE)
                    .args(&args)
                    .arg("--presets-dir")
                    .arg(&p)
                    .arg("--runs-dir")
                    .arg(&runs)
                    .env("XDG_CONFIG_HOME", &home)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    };
    let ours = || async {
        docker::find_mxtune_containers(&d)
            .await
            .unwrap()
            .into_iter()
            .filter(|f| f.preset == "tp2-matrix")
            .collect::<Vec<_>>()
    };
    let refused = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // The preset names its hosts: --host is refused, with the cluster target or without.
    let (code, _, err) = run(refused(&[
        "matrix",
        "--target",
        "docker-cluster",
        "--host",
        "remote",
        "tp2-matrix",
    ]))
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--host with --target docker-cluster: a docker-cluster preset names its two hosts itself"),
        "{err}"
    );
    let (code, _, err) = run(refused(&[
        "ab",
        "tp2-matrix",
        "tp2-matrix",
        "--host",
        "remote",
        "--out",
        &dir.path().join("ab").display().to_string(),
    ]))
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("preset tp2-matrix is a docker-cluster preset: it names its two hosts itself (cluster.head and cluster.worker), so --host does not apply"),
        "{err}"
    );
    // Under the default --target docker it would be rendered as one container: refused.
    let (code, _, err) = run(refused(&[
        "matrix",
        "tp2-matrix",
        "--out",
        &dir.path().join("out-docker").display().to_string(),
    ]))
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "preset tp2-matrix is a docker-cluster preset: run it with --target docker-cluster"
        ),
        "{err}"
    );
    assert!(ours().await.is_empty());
    assert!(
        !dir.path()
            .join("out-docker")
            .join("matrix-state.json")
            .exists()
    );

    let (code, stdout, err) = run(refused(&[
        "matrix",
        "--target",
        "docker-cluster",
        "tp2-matrix",
        "--endpoint",
        "completions",
        "--grid",
        "pp=64",
        "tg=4",
        "runs=1",
        "warmup=0",
        "--levels",
        "1,1.5,4",
        "--startup-limit-s",
        "120",
        "--out",
        &out.display().to_string(),
    ]))
    .await;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("matrix-state.json")).unwrap())
            .unwrap();
    let entry = &state["order"][0];
    let run_id = entry["run_id"].as_str().unwrap_or_default().to_string();
    let _cleanup = Cleanup(run_id.clone());
    assert!(matches!(code, Some(0 | 1)), "{stdout}{err}");
    assert_eq!(entry["name"], "tp2-matrix", "{state}");
    assert_eq!(entry["status"], "done", "{state}\n{err}");
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(entry["record"].as_str().unwrap()).unwrap())
            .unwrap();
    assert_eq!(rec["identity"]["run_id"], run_id.as_str(), "{rec}");
    assert_eq!(rec["target"]["kind"], "docker-cluster", "{rec}");
    // Benchmarked through the head's API.
    assert_eq!(
        rec["target"]["url"].as_str().unwrap().trim_end_matches('/'),
        format!("http://127.0.0.1:{port}"),
        "{rec}"
    );
    assert_eq!(rec["results"].as_array().unwrap().len(), 1, "{rec}");
    assert!(
        rec["results"][0]["tg_tps"]["mean"].as_f64().unwrap() > 0.0,
        "{rec}"
    );
    // Both nodes' environment, head first, each with its container.
    let nodes = rec["environment"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{rec}");
    for (node, role) in nodes.iter().zip(["head", "worker"]) {
        assert_eq!(node["role"], role, "{rec}");
        assert_eq!(node["host"], "local", "{rec}");
        assert_eq!(
            node["container_name"],
            format!("mxtune-{run_id}-{role}").as_str(),
            "{rec}"
        );
    }
    let transport = rec["observed"]["kernel_path"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["flag"] == "nccl_transport")
        .unwrap_or_else(|| panic!("no nccl_transport verdict: {rec}"));
    assert_eq!(transport["value"], "rdma", "{rec}");
    assert_eq!(transport["verdict"], "valid", "{rec}");
    // Both containers were stopped and removed before the matrix ended.
    assert!(ours().await.is_empty(), "{:?}", ours().await);
    assert!(containers_of(&d, &run_id).await.is_empty());
}

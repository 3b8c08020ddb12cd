//! Running one preset through the levels: launch → L1 smoke → L1.5 kernel path → L2
//! correctness → L3 stress → L4 grid (cool-down before each point, monitor alongside) →
//! L5 regression → stop, with a run record kept current all the way.

use anyhow::{Context, Result, anyhow, bail};
use chrono::Utc;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

use super::plan::{Grid, TestLevel};
use super::progress::{MatrixEvent, Progress};
use super::state::{LevelOutcome, MatrixPlan, PresetStatus};
use crate::bench::client::{BenchClient, ClientConfig, Endpoint};
use crate::bench::levels::{CorrectnessPlan, LevelReport, MemoryProbe, StressPlan};
use crate::bench::workload::{CancelWatch, PointResult, Runner};
use crate::flags::preset::{Preset, PresetStore};
use crate::flags::render::render;
use crate::flags::rules::evaluate;
use crate::hosts::Host;
use crate::hosts::monitor::{RemoteMonitorArgs, RemoteRun};
use crate::launch::docker::{self, DockerTarget};
use crate::launch::engine::EngineTarget;
use crate::launch::follow::ReadyInfo;
use crate::launch::{Launch, LaunchEvent, LaunchOptions, ValidationReport, Verdict};
use crate::monitor::collector::{Monitor, MonitorConfig, sample_once};
use crate::monitor::sample::{GpuStatus, Sample};
use crate::record::schema::{
    DockerFacts, EngineFacts, HostFacts, KernelPathCheck, Phase as RecordPhase, RunRecord,
    Verdict as RecordVerdict, WorkloadParams,
};
use crate::record::{RunHandle, RunStatus, RunStore};
use crate::vocab::{LaunchSpec, TargetKind};
use bollard::Docker;

/// A launch event and when it arrived.
type Seen = (chrono::DateTime<Utc>, LaunchEvent);

/// A preset rendered for its target, ready to launch.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The loaded preset.
    pub preset: Preset,
    /// Its launch spec.
    pub spec: LaunchSpec,
}

/// Loads preset `name` (a name, or a path to its .toml) as the plan finds it.
fn load(plan: &MatrixPlan, name: &str) -> Result<Preset> {
    let store = PresetStore::standard(plan.presets_dir.clone());
    let loaded = if name.ends_with(".toml") || name.contains('/') {
        store.load_file(Path::new(name))
    } else {
        store.load(name)
    };
    loaded.map_err(|e| anyhow!("{e}"))
}

/// Refuses a docker-cluster preset that the plan would run as something else: with `--host`
/// (the preset names its two hosts itself), or for another `--target`.
fn check_cluster_preset(plan: &MatrixPlan, preset: &Preset) -> Result<()> {
    if preset.flags.target != TargetKind::DockerCluster || plan.target == TargetKind::DockerCluster
    {
        return Ok(());
    }
    if !plan.hosts.is_empty() {
        bail!(
            "preset {} is a docker-cluster preset: it names its two hosts itself (cluster.head and cluster.worker), so --host does not apply; run it with --target docker-cluster and without --host",
            preset.name
        );
    }
    bail!(
        "preset {} is a docker-cluster preset: run it with --target docker-cluster (a matrix renders every preset for its --target, {} here)",
        preset.name,
        plan.target.name()
    )
}

/// Checked before a matrix starts: each preset that loads is one the plan can run
/// ([`check_cluster_preset`]); a preset that does not load fails in its turn.
pub fn check_presets(plan: &MatrixPlan) -> Result<()> {
    for name in &plan.presets {
        if let Ok(p) = load(plan, name) {
            check_cluster_preset(plan, &p)?;
        }
    }
    Ok(())
}

/// Loads and renders `name` for the plan's target; conflict rules that block refuse it, and
/// so does a docker-cluster preset with `--host` or another `--target`.
pub fn prepare(plan: &MatrixPlan, name: &str) -> Result<Prepared> {
    let mut preset = load(plan, name)?;
    check_cluster_preset(plan, &preset)?;
    if let Some(d) = &plan.device {
        preset.flags.engine.device = d.parse().map_err(|e| anyhow!("--device {d}: {e}"))?;
    }
    if let Some(m) = &plan.engine_model {
        preset.flags.engine.model = m.clone();
    }
    let blocking: Vec<String> = evaluate(&preset.flags, plan.target, None)
        .into_iter()
        .filter(|f| f.blocks())
        .map(|f| f.to_string())
        .collect();
    if !blocking.is_empty() {
        bail!(
            "preset {} is blocked by the conflict rules: {}",
            preset.name,
            blocking.join("; ")
        );
    }
    let spec = render(&preset.flags, plan.target).with_context(|| {
        format!(
            "rendering preset {} ({}) for the {:?} target",
            preset.name, preset.origin, plan.target
        )
    })?;
    Ok(Prepared { preset, spec })
}

/// A ready target with its record.
pub struct Started {
    /// The followed launch.
    pub launch: Launch,
    /// What readiness reported.
    pub ready: ReadyInfo,
    /// The kernel-path report.
    pub report: ValidationReport,
    /// The run record, `running`.
    pub record: RunHandle,
    /// Engine pid (for the monitor's RSS/CPU).
    pub pid: Option<u32>,
    /// The hosts.toml host the target runs on, and the SSH tunnel to its Docker engine and
    /// API port (held while the preset runs); `None`: this machine.
    pub host: Option<(String, crate::hosts::ssh::Tunnel)>,
    /// Where the GPU temperature of the cool-down comes from.
    pub readings: Readings,
}

/// Whose GPU a preset's readings and cool-down come from.
#[derive(Debug, Clone)]
pub enum Readings {
    /// This machine's (NVML here).
    Local,
    /// A hosts.toml host's: `mxtune monitor --json --once` there over SSH (its version was
    /// checked when the preset started).
    Host(Box<Host>),
    /// None: the host has no usable mxtune (the record says why), so no cool-down there.
    NotTaken,
}

impl Readings {
    /// The host's name, for messages; `None` for this machine.
    fn host(&self) -> Option<String> {
        match self {
            Readings::Host(h) => Some(h.name.clone()),
            _ => None,
        }
    }

    /// The hottest GPU's temperature now (`None` without NVML or readings); an error when
    /// the host's monitor could not be read.
    fn temperature(&self) -> Result<Option<f64>> {
        match self {
            Readings::Local => Ok(gpu_temperature()),
            Readings::Host(h) => {
                crate::hosts::monitor::sample_once(h, &RemoteMonitorArgs::default())
                    .map(|s| hottest(&s))
            }
            Readings::NotTaken => Ok(None),
        }
    }
}

/// Why a start did not give a ready target.
#[derive(Debug)]
pub enum StartError {
    /// The operator interrupted; the record says `aborted`.
    Interrupted(Option<RunHandle>),
    /// L1 failed (launch error, crash, watchdog); the record says `failed`.
    Failed(String, Option<RunHandle>),
}

fn record_verdict(v: Verdict) -> RecordVerdict {
    match v {
        Verdict::Valid => RecordVerdict::Valid,
        Verdict::Invalid => RecordVerdict::Invalid,
        Verdict::Unknown => RecordVerdict::Unknown,
    }
}

/// The GPU's hottest die temperature now, or `None` without NVML.
pub fn gpu_temperature() -> Option<f64> {
    hottest(&sample_once(&MonitorConfig::default()).ok()?)
}

/// The hottest GPU die temperature of a sample, or `None` without NVML.
fn hottest(s: &Sample) -> Option<f64> {
    match &s.gpu {
        GpuStatus::Available { gpus, .. } => gpus
            .iter()
            .filter_map(|g| g.temperature_c.get())
            .max()
            .map(f64::from),
        GpuStatus::Unavailable { .. } => None,
    }
}

/// Waits until the GPU of `readings` is below `threshold` °C (or `limit` passes, or a
/// cancel); returns the temperature the point starts at. A host whose monitor cannot be
/// read is a warning and no wait.
pub async fn cool_down(
    readings: &Readings,
    threshold: Option<f64>,
    limit: Duration,
    cancel: &CancelWatch,
    progress: &Progress,
) -> Option<f64> {
    let start = Instant::now();
    loop {
        let source = readings.clone();
        let t = match tokio::task::spawn_blocking(move || source.temperature()).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                progress.emit(MatrixEvent::Warning(format!(
                    "no GPU temperature for the cool-down: {e:#}"
                )));
                None
            }
            Err(_) => None,
        };
        let Some(threshold) = threshold else {
            return t;
        };
        match t {
            Some(c) if c >= threshold && start.elapsed() < limit && !cancel.is_cancelled() => {
                progress.emit(MatrixEvent::CoolDown {
                    host: readings.host(),
                    celsius: c,
                    threshold,
                });
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = cancel.cancelled() => return Some(c),
                }
            }
            other => return other,
        }
    }
}

fn base_url(url: &str) -> String {
    url.trim_end_matches('/')
        .trim_end_matches("/v1")
        .trim_end_matches('/')
        .to_owned()
}

/// Creates the record, launches the target and waits for it (L1), then takes the
/// kernel-path report (L1.5): on this machine when `host` is `None`, else on that hosts.toml
/// host's Docker engine through an SSH tunnel, the record's environment then being that
/// host's ([`host_environment`]). `tags` go on the record (e.g. `matrix:<id>`); the target's
/// phases, warnings and failure go to `progress`. `matrix --host` and `ab --host` both launch
/// through here.
pub async fn start_on(
    plan: &MatrixPlan,
    prepared: &Prepared,
    host: Option<&str>,
    tags: &[String],
    cancel: &CancelWatch,
    progress: &Progress,
) -> std::result::Result<Started, StartError> {
    let fail = |m: String| StartError::Failed(m, None);
    let mut r: RunRecord =
        crate::record::begin(plan.target, Some(prepared.preset.name.clone()), &[]);
    r.identity.tags = tags.to_vec();
    r.target.flags = serde_json::to_value(&prepared.preset.flags).unwrap_or_default();
    r.target.launch = Some(prepared.spec.clone());
    r.target.model = Some(prepared.spec.served_model_name.clone());
    // A cluster's head on another host: its environment is filled from there once reached.
    let head_elsewhere = plan.target == TargetKind::DockerCluster
        && prepared
            .spec
            .cluster
            .as_ref()
            .is_some_and(|c| c.head != crate::flags::render::LOCAL_HOST);
    match host {
        None if !head_elsewhere => {
            if let Ok(s) = tokio::task::spawn_blocking(|| sample_once(&MonitorConfig::default()))
                .await
                .map_err(|e| anyhow!("{e}"))
                .and_then(|r| r)
            {
                crate::monitor::record::fill_environment(&mut r.environment, &s);
            }
        }
        None => r.environment.host = HostFacts::default(),
        Some(h) => {
            // Filled from the host once it is reached; this machine's would mislead.
            r.environment.host = HostFacts::default();
            r.environment.remote_host = Some(h.to_string());
        }
    }
    let run_id = r.identity.run_id.to_string();
    let mut record = RunStore::new(&plan.runs_dir)
        .create(r)
        .map_err(|e| fail(format!("{e:#}")))?;

    let mut opts = match LaunchOptions::new(&run_id, &prepared.preset.name) {
        Ok(o) => o,
        Err(e) => return Err(StartError::Failed(format!("{e:#}"), Some(record))),
    };
    let log_path = plan.runs_dir.join(format!("{run_id}.target.log"));
    opts.log_path = Some(log_path.clone());
    opts.startup_limit = Duration::from_secs(plan.startup_limit_s);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let events: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = events.clone();
    let who = prepared.preset.name.clone();
    let news = progress.clone();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            let preset = who.clone();
            match &e {
                LaunchEvent::Phase { phase } => news.emit(MatrixEvent::TargetPhase {
                    preset,
                    phase: phase.to_string(),
                }),
                LaunchEvent::Warning { message } => news.emit(MatrixEvent::TargetWarning {
                    preset,
                    message: message.clone(),
                }),
                LaunchEvent::Failed { message } => news.emit(MatrixEvent::TargetFailed {
                    preset,
                    message: message.clone(),
                }),
                _ => {}
            }
            if !matches!(
                e,
                LaunchEvent::Log { .. } | LaunchEvent::PullProgress { .. }
            ) && let Ok(mut v) = sink.lock()
            {
                v.push((Utc::now(), e));
            }
        }
    });

    let mut remote = None;
    let mut readings = Readings::Local;
    let connected = match host {
        // A cluster reaches its two hosts' engines itself.
        None if plan.target == TargetKind::DockerCluster => Err(anyhow!(
            "a cluster reaches its hosts' Docker engines itself"
        )),
        None => docker::connect().await,
        Some(name) => {
            let forward = (
                docker::connect_host(&prepared.spec.host),
                prepared.spec.port,
            );
            let opened = match crate::hosts::find(name) {
                Ok(h) => match crate::hosts::ssh::Tunnel::open(&h, Some(forward)).await {
                    Ok(t) => docker::connect_tunnel(&t, &h.docker_socket)
                        .await
                        .map(|d| (d, t, h)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match opened {
                Ok((d, t, h)) => {
                    opts.remote_host = Some(name.to_string());
                    opts.api_url = t.url();
                    remote = Some((name.to_string(), t));
                    readings = host_environment(&mut record, &h, &d, progress).await;
                    Ok(d)
                }
                Err(e) => Err(e),
            }
        }
    };
    let launched = match plan.target {
        TargetKind::Docker => match connected {
            Ok(d) => {
                // Rendered again in the names of the vLLM release the image carries.
                let spec = crate::launch::dialect::render_for_launch(
                    &prepared.preset.flags,
                    TargetKind::Docker,
                    Some(&d),
                )
                .await;
                match spec {
                    Ok(spec) if remote.is_some() && spec.port != prepared.spec.port => {
                        Err(anyhow!(
                            "rendering for the image's vLLM release moved the API port from {} to {}: give the port in the preset",
                            prepared.spec.port,
                            spec.port
                        ))
                    }
                    Ok(spec) => {
                        let _ = record.update(|r| r.target.launch = Some(spec.clone()));
                        DockerTarget::launch(d, &spec, &opts, tx).await
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        },
        TargetKind::DockerCluster => {
            match start_cluster(prepared, &opts, &mut record, &tx, progress).await {
                Ok((launch, r)) => {
                    readings = r;
                    Ok(launch)
                }
                Err(e) => Err(e),
            }
        }
        TargetKind::Engine => {
            EngineTarget::launch(
                plan.engine_bin.as_deref(),
                &prepared.spec,
                &opts,
                Some(&plan.runs_dir),
                tx,
            )
            .await
        }
        TargetKind::Attach => Err(anyhow!(
            "a matrix launches its targets; the attach target is not one it can start or stop"
        )),
    };
    let mut launch = match launched {
        Ok(l) => l,
        Err(e) => {
            let msg = format!("launch failed: {e:#}");
            let _ = record.finish(RunStatus::Failed, Some(msg.clone()));
            return Err(StartError::Failed(msg, Some(record)));
        }
    };
    let pid = match &launch.target {
        crate::launch::Target::Engine(t) => Some(t.pid),
        _ => None,
    };
    let ready = tokio::select! {
        r = launch.wait_ready() => Some(r),
        _ = cancel.cancelled() => None,
    };
    let ready = match ready {
        Some(Ok(info)) => info,
        Some(Err(e)) => {
            let tail = launch.tail(10).join("\n");
            let msg = format!("not ready: {e:#}");
            let _ = launch.stop(Duration::from_secs(10), false).await;
            let _ = record.finish(RunStatus::Failed, Some(msg.clone()));
            return Err(StartError::Failed(
                format!("{msg}\nlast log lines:\n{tail}"),
                Some(record),
            ));
        }
        None => {
            let _ = launch.stop(Duration::from_secs(10), false).await;
            let _ = record.finish(
                RunStatus::Aborted,
                Some("interrupted while starting".into()),
            );
            return Err(StartError::Interrupted(Some(record)));
        }
    };
    // Give the follower a moment to deliver the ready/verdict events.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = launch.report();
    let vllm_version = launch.history().vllm_version;
    let facts = launch.target.facts().await;
    let seen = events.lock().map(|v| v.clone()).unwrap_or_default();
    let update = record.update(|r| {
        r.target.url = Some(ready.url.clone());
        r.target.model = Some(ready.model.clone());
        match plan.target {
            TargetKind::Docker | TargetKind::DockerCluster => {
                // A cluster's are the head's; each node's are in environment.nodes.
                r.environment.nodes = facts.nodes.clone();
                r.target.docker = Some(DockerFacts {
                    image: facts.image.clone().unwrap_or_default(),
                    image_id: facts.image_id.clone(),
                    digest: facts.image_digests.first().cloned(),
                    container_id: facts.container_id.clone(),
                    container_name: Some(facts.name.clone()),
                    ..DockerFacts::default()
                })
            }
            _ => {
                r.target.engine = Some(EngineFacts {
                    path: facts.program.clone().unwrap_or_default(),
                    ..EngineFacts::default()
                })
            }
        }
        r.environment.pip_freeze = facts
            .pip_freeze
            .as_ref()
            .map(|p| p.lines().map(str::to_owned).collect());
        r.environment.container_nvidia_smi = facts.nvidia_smi.clone();
        r.observed.startup_s = Some(ready.startup_s);
        r.observed.log_file = Some(log_path.display().to_string());
        r.observed.vllm_version = vllm_version.clone();
        r.observed.kernel_path = report
            .checks
            .iter()
            .map(|c| KernelPathCheck {
                flag: c.flag.clone(),
                value: c.value.clone(),
                verdict: record_verdict(c.verdict),
                lines: c.seen.iter().chain(&c.forbidden_seen).cloned().collect(),
                reason: c.note.clone().or_else(|| {
                    (!c.missing.is_empty()).then(|| format!("never saw {}", c.missing.join(", ")))
                }),
            })
            .collect();
        for (at, e) in &seen {
            match e {
                LaunchEvent::Phase { phase } => r.observed.phases.push(RecordPhase {
                    name: phase.to_string(),
                    at: *at,
                    last_probe: None,
                }),
                LaunchEvent::Probe { answer } => {
                    if let Some(p) = r.observed.phases.last_mut() {
                        p.last_probe = Some(answer.clone());
                    }
                }
                LaunchEvent::Warning { message } => r.observed.warnings.push(message.clone()),
                _ => {}
            }
        }
        r.observed.warnings.extend(report.warnings());
    });
    if let Err(e) = update {
        progress.emit(MatrixEvent::Warning(format!(
            "run record not updated: {e:#}"
        )));
    }
    progress.emit(MatrixEvent::Ready {
        preset: prepared.preset.name.clone(),
        startup_s: ready.startup_s,
    });
    Ok(Started {
        launch,
        ready,
        report,
        record,
        pid,
        host: remote,
        readings,
    })
}

/// Launches a two-node (docker-cluster) preset as `mxtune launch` does: pre-flight on both
/// nodes' hosts (an error blocks, a warning goes to the record), both engines reached and the
/// image readied ([`ClusterEngines::connect_for_launch`]), then both containers started and
/// followed ([`ClusterTarget::launch_on`]). The readings are this machine's when the head
/// runs here, else the head's host's ([`host_environment`]).
async fn start_cluster(
    prepared: &Prepared,
    opts: &LaunchOptions,
    record: &mut RunHandle,
    tx: &mpsc::UnboundedSender<LaunchEvent>,
    progress: &Progress,
) -> Result<(Launch, Readings)> {
    use crate::launch::cluster::{ClusterEngines, ClusterPlan, ClusterTarget};
    use crate::launch::preflight;
    let cluster = prepared.spec.cluster.clone().with_context(|| {
        format!(
            "preset {} rendered no [cluster] section: a docker-cluster matrix needs docker-cluster presets",
            prepared.preset.name
        )
    })?;
    let plan = ClusterPlan::from_hosts_file(&cluster)?;
    let findings = preflight::cluster_checks(&plan, &prepared.spec).await?;
    for f in findings.iter().filter(|f| !f.blocks()) {
        let _ = tx.send(LaunchEvent::Warning { message: f.line() });
    }
    if preflight::blocked(&findings) {
        let errors: Vec<String> = findings
            .iter()
            .filter(|f| f.blocks())
            .map(|f| f.line())
            .collect();
        bail!("{}: {}", preflight::BLOCKED, errors.join("; "));
    }
    let (engines, spec) = ClusterEngines::connect_for_launch(
        &plan,
        &prepared.spec,
        Some(&prepared.preset.flags),
        opts.allow_pull,
        tx,
    )
    .await?;
    let _ = record.update(|r| r.target.launch = Some(spec.clone()));
    let readings = match &plan.head.host {
        None => Readings::Local,
        Some(h) => host_environment(record, h, &engines.head, progress).await,
    };
    let launch = ClusterTarget::launch_on(engines, plan, &spec, opts, tx.clone()).await?;
    Ok((launch, readings))
}

/// Fills a remote run's environment from its host, marked as that host's: the Docker
/// engine's facts (`docker info`: name, OS, kernel, architecture, CPUs, memory) and one sample
/// of the host's own `mxtune monitor` (GPUs or why there are none, RAM, swap, CPUs). The
/// host's readings then also drive the cool-down. Without the same mxtune there, the record
/// says why its GPU and temperature were not read, and there is no cool-down there.
async fn host_environment(
    record: &mut RunHandle,
    host: &Host,
    docker: &Docker,
    progress: &Progress,
) -> Readings {
    let info = docker.info().await;
    let h = host.clone();
    let sampled = tokio::task::spawn_blocking(move || {
        crate::hosts::ssh::check_remote_mxtune(&h)?;
        crate::hosts::monitor::sample_once(&h, &RemoteMonitorArgs::default())
    })
    .await
    .map_err(|e| anyhow!("{e}"))
    .and_then(|r| r);
    let readings = match &sampled {
        Ok(_) => Readings::Host(Box::new(host.clone())),
        Err(_) => Readings::NotTaken,
    };
    let name = &host.name;
    let update = record.update(|r| {
        let env = &mut r.environment;
        env.remote_host = Some(name.clone());
        env.host = HostFacts::default();
        match info {
            Ok(i) => {
                env.host.hostname = i.name;
                env.host.os = i.operating_system;
                env.host.kernel = i.kernel_version;
                env.host.arch = i.architecture;
                env.host.cpu_threads = i.ncpu.and_then(|c| usize::try_from(c).ok());
                env.host.ram_total_bytes = i.mem_total.and_then(|m| u64::try_from(m).ok());
            }
            Err(e) => r.observed.warnings.push(format!(
                "run on host {name}: its Docker engine did not say its facts (docker info: {e}); environment.host is empty"
            )),
        }
        match &sampled {
            Ok(s) => {
                crate::monitor::record::fill_environment(env, s);
                let h = &s.host;
                if h.ram_total_bytes > 0 {
                    env.host.ram_total_bytes = Some(h.ram_total_bytes);
                }
                env.host.swap_total_bytes = Some(h.swap_total_bytes);
                if !h.cpu_per_core_pct.is_empty() {
                    env.host.cpu_threads = Some(h.cpu_per_core_pct.len());
                }
            }
            Err(e) => {
                env.gpu_error = Some(format!("not read on host {name}: {e:#}"));
                r.observed.warnings.push(format!(
                    "run on host {name}: GPU and temperature readings of that host were not taken (no cool-down there): {e:#}"
                ));
            }
        }
    });
    if let Err(e) = update {
        progress.emit(MatrixEvent::Warning(format!(
            "run record not updated: {e:#}"
        )));
    }
    readings
}

/// The monitor sampling alongside L4: this machine's collector, or the host's own monitor.
enum Watch {
    Here(Monitor),
    Host(RemoteRun),
}

/// What the host's monitor watches during L4: the target's `/metrics` at its API address as
/// seen on the host (the port in the preset, not the local forward).
fn remote_monitor_args(started: &Started) -> RemoteMonitorArgs {
    RemoteMonitorArgs {
        url: started.record.record().target.launch.as_ref().map(|l| {
            format!(
                "http://{}:{}/metrics",
                docker::connect_host(&l.host),
                l.port
            )
        }),
        ..RemoteMonitorArgs::default()
    }
}

/// What the measuring levels produced.
#[derive(Debug, Default)]
pub struct Measured {
    /// L2 and L3 reports, as run.
    pub levels: Vec<LevelReport>,
    /// L4 points.
    pub points: Vec<PointResult>,
    /// GPU temperature at each point's start.
    pub temps: Vec<Option<f64>>,
    /// An interrupt cut the measurement short.
    pub interrupted: bool,
    /// Problems that did not stop the run.
    pub warnings: Vec<String>,
}

fn workload_params(grid: &Grid, endpoint: Endpoint, levels: &[TestLevel]) -> WorkloadParams {
    let w = grid.workload(endpoint);
    WorkloadParams {
        endpoint: Some(format!("{endpoint:?}").to_lowercase()),
        pp: w.pp,
        tg: w.tg,
        depth: w.depth,
        concurrency: w.concurrency,
        runs: w.runs,
        warmup: w.warmup,
        tokenizer: Some("o200k_base".to_owned()),
        no_cache: w.no_cache,
        latency_mode: Some(format!("{:?}", w.latency_mode).to_lowercase()),
        level: Some(
            levels
                .iter()
                .map(|l| l.number())
                .collect::<Vec<_>>()
                .join(","),
        ),
        ..WorkloadParams::default()
    }
}

/// Runs L2, L3 and L4 (those in `levels`) against a ready target, point by point so the
/// cool-down can run before each measured point; the monitor runs alongside L4. Each point's
/// start and result go to `progress`.
pub async fn measure(
    plan: &MatrixPlan,
    started: &mut Started,
    levels: &[TestLevel],
    cancel: &CancelWatch,
    progress: &Progress,
) -> Result<Measured> {
    let mut out = Measured::default();
    let preset = started
        .record
        .record()
        .target
        .preset
        .clone()
        .unwrap_or_default();
    let client = BenchClient::new(&ClientConfig::new(&started.ready.url))?;
    let runner = Runner {
        client,
        model: started.ready.model.clone(),
        events: None,
        cancel: cancel.clone(),
    };
    if levels.contains(&TestLevel::Correctness) && !cancel.is_cancelled() {
        let plan_c = CorrectnessPlan {
            endpoint: plan.endpoint,
            ..CorrectnessPlan::default()
        };
        out.levels.push(runner.correctness(&plan_c).await);
    }
    if levels.contains(&TestLevel::Stress) && !cancel.is_cancelled() {
        let plan_s = StressPlan {
            endpoint: plan.endpoint,
            ..StressPlan::default()
        };
        // The GPU the target runs on: this machine's, or the host's through its own monitor.
        let probe = match &started.readings {
            Readings::Local => crate::monitor::probe::GpuMemoryProbe::detect().ok(),
            Readings::Host(h) => {
                let h = (**h).clone();
                tokio::task::spawn_blocking(move || crate::hosts::monitor::memory_probe(&h))
                    .await
                    .ok()
                    .and_then(|p| p.ok())
            }
            Readings::NotTaken => None,
        };
        out.levels.push(
            runner
                .stress(&plan_s, probe.as_ref().map(|p| p as &dyn MemoryProbe))
                .await,
        );
    }
    if levels.contains(&TestLevel::Performance) && !cancel.is_cancelled() {
        let params = workload_params(&plan.grid, plan.endpoint, levels);
        if let Err(e) = started.record.update(|r| r.workload = Some(params)) {
            out.warnings.push(format!("run record not updated: {e:#}"));
        }
        let monitor = match &started.readings {
            Readings::Local => Monitor::start(MonitorConfig {
                metrics_url: Some(format!("{}/metrics", base_url(&started.ready.url))),
                pid: started.pid,
                ..MonitorConfig::default()
            })
            .map(Watch::Here),
            // That host's own monitor, scraping the target's /metrics as the host sees it.
            Readings::Host(h) => {
                let (h, args) = ((**h).clone(), remote_monitor_args(started));
                tokio::task::spawn_blocking(move || RemoteRun::start(&h, &args))
                    .await
                    .map_err(|e| anyhow!("{e}"))
                    .and_then(|r| r)
                    .map(Watch::Host)
            }
            // The record says why; this machine's monitor would describe the wrong GPU.
            Readings::NotTaken => Err(anyhow!("no readings on the host")),
        };
        let monitor = match monitor {
            Ok(m) => Some(m),
            Err(_) if matches!(started.readings, Readings::NotTaken) => None,
            Err(e) => {
                out.warnings.push(format!("monitor not started: {e:#}"));
                None
            }
        };
        let whole = plan.grid.workload(plan.endpoint);
        whole.validate()?;
        let points = whole.points();
        let total = points.len();
        for (index, point) in points.into_iter().enumerate() {
            if cancel.is_cancelled() {
                break;
            }
            let temp = cool_down(
                &started.readings,
                plan.cooldown_c,
                Duration::from_secs(plan.cooldown_limit_s),
                cancel,
                progress,
            )
            .await;
            progress.emit(MatrixEvent::PointStarted {
                preset: preset.clone(),
                index,
                total,
                point,
            });
            out.temps.push(temp);
            let mut one = whole.clone();
            one.pp = vec![point.pp];
            one.tg = vec![point.tg];
            one.depth = vec![point.depth];
            one.concurrency = vec![point.concurrency];
            let mut errors = Vec::new();
            let record = &mut started.record;
            let result = runner
                .run(&one, |p| {
                    let entry = p.stats.record.clone();
                    let methods = p.stats.count_methods.join(",");
                    if let Err(e) = record.update(|r| {
                        r.results.push(entry);
                        if let Some(w) = r.workload.as_mut() {
                            w.token_count_method = Some(methods);
                        }
                    }) {
                        errors.push(format!("run record not updated: {e:#}"));
                    }
                })
                .await?;
            out.warnings.extend(errors);
            out.warnings.extend(result.warnings);
            for p in &result.points {
                progress.emit(MatrixEvent::PointDone {
                    preset: preset.clone(),
                    point: p.point,
                    tg_tps: p.stats.record.tg_tps.map(|s| s.mean),
                });
            }
            out.points.extend(result.points);
            if result.aborted {
                break;
            }
        }
        if let Some(m) = monitor {
            let stopped = tokio::task::spawn_blocking(move || match m {
                Watch::Here(m) => (m.stop(), None),
                // Ended early: its samples so far still count, and the record says why.
                Watch::Host(r) => {
                    let (summary, early) = r.stop();
                    (Ok(summary), early)
                }
            });
            match stopped.await {
                Ok((summary, early)) => {
                    if let Some(e) = early {
                        out.warnings
                            .push(format!("the host's monitor ended early: {e:#}"));
                    }
                    match summary {
                        Ok(summary) => {
                            let res = crate::monitor::record::resources(&summary);
                            if let Err(e) = started.record.update(|r| r.resources = Some(res)) {
                                out.warnings.push(format!("run record not updated: {e:#}"));
                            }
                        }
                        Err(e) => out.warnings.push(format!("monitor: {e:#}")),
                    }
                }
                Err(e) => out.warnings.push(format!("monitor thread: {e}")),
            }
        }
    }
    out.interrupted = cancel.is_cancelled();
    Ok(out)
}

/// The newest earlier completed record of `preset` on this host, other than `run_id`.
pub fn previous_record(runs_dir: &Path, preset: &str, current: &RunRecord) -> Option<RunRecord> {
    let scan = RunStore::new(runs_dir).scan().ok()?;
    scan.runs
        .into_iter()
        .map(|s| s.record)
        .filter(|r| {
            r.target.preset.as_deref() == Some(preset)
                && r.identity.run_id != current.identity.run_id
                && r.identity.status == RunStatus::Completed
                && r.identity.started_at < current.identity.started_at
                && r.environment.host.hostname == current.environment.host.hostname
                && host_tag(r) == host_tag(current)
                && !r.results.is_empty()
        })
        .max_by_key(|r| r.identity.started_at)
}

/// The `host:NAME` tag of a record a matrix ran on a hosts.toml host.
fn host_tag(r: &RunRecord) -> Option<&str> {
    r.identity.tags.iter().find_map(|t| t.strip_prefix("host:"))
}

/// L5: each point's pp and tg t/s against `previous`; slower by more than `tolerance`
/// fails. The noise hint is twice the runs' combined relative standard deviation.
pub fn regression(current: &RunRecord, previous: &RunRecord, tolerance: f64) -> LevelOutcome {
    let mut worse = Vec::new();
    let mut notes = Vec::new();
    for p in &current.results {
        let Some(old) = previous.results.iter().find(|o| o.point == p.point) else {
            continue;
        };
        for (metric, new, base) in [
            ("pp t/s", p.pp_tps, old.pp_tps),
            ("tg t/s", p.tg_tps, old.tg_tps),
        ] {
            let (Some(n), Some(b)) = (new, base) else {
                continue;
            };
            if b.mean <= 0.0 || n.mean <= 0.0 {
                continue;
            }
            let delta = n.mean / b.mean - 1.0;
            let noise = 2.0 * ((n.std / n.mean).powi(2) + (b.std / b.mean).powi(2)).sqrt();
            let label = format!("{} {metric} {:+.1} %", p.point.label(), delta * 100.0);
            let hint = if delta.abs() <= noise {
                format!(" (within noise ± {:.1} %)", noise * 100.0)
            } else {
                String::new()
            };
            if delta < -tolerance {
                worse.push(format!("{label}{hint}"));
            } else if delta.abs() > tolerance {
                notes.push(format!("{label}{hint}"));
            }
        }
    }
    let against = format!(
        "against run {} ({})",
        previous.identity.run_id.short(),
        previous.identity.started_at.format("%Y-%m-%d %H:%M")
    );
    if worse.is_empty() {
        LevelOutcome {
            level: TestLevel::Regression,
            verdict: "pass".into(),
            detail: if notes.is_empty() {
                format!("within ± {:.0} % {against}", tolerance * 100.0)
            } else {
                format!("{against}; faster: {}", notes.join(", "))
            },
        }
    } else {
        LevelOutcome {
            level: TestLevel::Regression,
            verdict: "fail".into(),
            detail: format!(
                "slower than ± {:.0} % {against}: {}",
                tolerance * 100.0,
                worse.join(", ")
            ),
        }
    }
}

/// The whole outcome of one preset.
#[derive(Debug)]
pub struct PresetOutcome {
    /// Done, failed or interrupted.
    pub status: PresetStatus,
    /// The record's run id.
    pub run_id: Option<String>,
    /// The record's path.
    pub record: Option<std::path::PathBuf>,
    /// Level verdicts.
    pub levels: Vec<LevelOutcome>,
    /// GPU temperature at each measured point.
    pub temps: Vec<Option<f64>>,
    /// Performance INVALID.
    pub invalid: bool,
}

fn outcome(level: TestLevel, verdict: &str, detail: impl Into<String>) -> LevelOutcome {
    LevelOutcome {
        level,
        verdict: verdict.into(),
        detail: detail.into(),
    }
}

fn level_of(r: &LevelReport) -> TestLevel {
    use crate::bench::levels::Level;
    match r.level {
        Level::Correctness => TestLevel::Correctness,
        Level::Stress => TestLevel::Stress,
        Level::Performance => TestLevel::Performance,
    }
}

/// Runs one preset through `plan.levels`; never returns an error for a target that fails —
/// that is a verdict — only for the matrix's own I/O.
pub async fn run_preset(
    plan: &MatrixPlan,
    name: &str,
    tags: &[String],
    cancel: &CancelWatch,
    progress: &Progress,
) -> PresetOutcome {
    run_preset_on(plan, name, None, tags, cancel, progress).await
}

/// [`run_preset`] on a hosts.toml host (`None`: this machine).
pub async fn run_preset_on(
    plan: &MatrixPlan,
    name: &str,
    host: Option<&str>,
    tags: &[String],
    cancel: &CancelWatch,
    progress: &Progress,
) -> PresetOutcome {
    let mut levels = Vec::new();
    let failed = |levels: Vec<LevelOutcome>, record: Option<&RunHandle>| PresetOutcome {
        status: PresetStatus::Failed,
        run_id: record.map(|r| r.record().identity.run_id.to_string()),
        record: record.map(|r| r.path().to_path_buf()),
        levels,
        temps: Vec::new(),
        invalid: false,
    };
    let prepared = match prepare(plan, name) {
        Ok(p) => p,
        Err(e) => {
            levels.push(outcome(TestLevel::Smoke, "fail", format!("{e:#}")));
            return failed(levels, None);
        }
    };
    let mut started = match start_on(plan, &prepared, host, tags, cancel, progress).await {
        Ok(s) => s,
        Err(StartError::Failed(msg, record)) => {
            levels.push(outcome(TestLevel::Smoke, "fail", msg));
            return failed(levels, record.as_ref());
        }
        Err(StartError::Interrupted(record)) => {
            return PresetOutcome {
                status: PresetStatus::Interrupted,
                run_id: record
                    .as_ref()
                    .map(|r| r.record().identity.run_id.to_string()),
                record: record.as_ref().map(|r| r.path().to_path_buf()),
                levels,
                temps: Vec::new(),
                invalid: false,
            };
        }
    };
    levels.push(outcome(
        TestLevel::Smoke,
        "pass",
        format!(
            "ready after {:.1} s (watchdog {} s)",
            started.ready.startup_s, plan.startup_limit_s
        ),
    ));
    let overall = started.report.overall();
    let invalid = plan.levels.contains(&TestLevel::KernelPath) && overall == Verdict::Invalid;
    if plan.levels.contains(&TestLevel::KernelPath) {
        let detail = started
            .report
            .checks
            .iter()
            .map(|c| format!("{}={}: {:?}", c.flag, c.value, c.verdict).to_lowercase())
            .collect::<Vec<_>>()
            .join(", ");
        let verdict = match overall {
            Verdict::Valid => "pass",
            Verdict::Invalid => "invalid",
            Verdict::Unknown => "unknown",
        };
        levels.push(outcome(
            TestLevel::KernelPath,
            verdict,
            if detail.is_empty() {
                "no kernel-path checks for this preset".into()
            } else {
                detail
            },
        ));
    }
    let measured = measure(plan, &mut started, &plan.levels, cancel, progress).await;
    let measured = match measured {
        Ok(m) => m,
        Err(e) => Measured {
            warnings: vec![format!("measuring failed: {e:#}")],
            ..Measured::default()
        },
    };
    for l in &measured.levels {
        levels.push(outcome(
            level_of(l),
            if l.passed { "pass" } else { "fail" },
            if l.passed {
                l.passed_summary()
            } else {
                l.reasons().join("; ")
            },
        ));
    }
    if plan.levels.contains(&TestLevel::Performance) {
        let errors: u32 = measured.points.iter().map(|p| p.stats.record.errors).sum();
        let perf =
            crate::bench::levels::performance_report(&crate::bench::workload::WorkloadResult {
                model: started.ready.model.clone(),
                url: started.ready.url.clone(),
                workload: plan.grid.workload(plan.endpoint),
                latency_s: 0.0,
                points: measured.points.clone(),
                aborted: measured.interrupted,
                warnings: Vec::new(),
            });
        let verdict = if invalid {
            "invalid"
        } else if perf.passed && !measured.points.is_empty() {
            "pass"
        } else {
            "fail"
        };
        let detail = if invalid {
            "INVALID: the kernel-path verdict says the flags did not take effect".to_owned()
        } else if perf.passed {
            format!("{} points, {errors} failed requests", measured.points.len())
        } else {
            let mut r = perf.reasons();
            r.extend(measured.warnings.iter().cloned());
            r.join("; ")
        };
        levels.push(outcome(TestLevel::Performance, verdict, detail));
    }
    if plan.levels.contains(&TestLevel::Regression) && !measured.interrupted {
        let current = started.record.record().clone();
        let l5 = match previous_record(&plan.runs_dir, &prepared.preset.name, &current) {
            Some(prev) => regression(&current, &prev, plan.tolerance),
            None => outcome(
                TestLevel::Regression,
                "no baseline",
                "no earlier completed record of this preset on this host",
            ),
        };
        levels.push(l5);
    }
    let stop = started.launch.stop(Duration::from_secs(30), false).await;
    let mut warnings = measured.warnings.clone();
    if let Err(e) = &stop {
        warnings.push(format!("stopping the target: {e:#}"));
    }
    let failures: Vec<String> = levels
        .iter()
        .filter(|l| matches!(l.verdict.as_str(), "fail" | "invalid"))
        .map(|l| format!("{}: {}", l.level.title(), l.verdict))
        .collect();
    let note = levels
        .iter()
        .map(|l| format!("{} {}", l.level.title(), l.verdict))
        .collect::<Vec<_>>()
        .join("; ");
    let (status, reason, state) = if measured.interrupted {
        (
            RunStatus::Aborted,
            Some("interrupted (matrix)".to_owned()),
            PresetStatus::Interrupted,
        )
    } else if failures.is_empty() {
        (RunStatus::Completed, None, PresetStatus::Done)
    } else {
        (
            RunStatus::Failed,
            Some(failures.join("; ")),
            PresetStatus::Done,
        )
    };
    let _ = started.record.update(|r| {
        r.identity.note = Some(note);
        r.observed.warnings.extend(warnings);
    });
    if let Err(e) = started.record.finish(status, reason) {
        progress.emit(MatrixEvent::Warning(format!(
            "run record not finished: {e:#}"
        )));
    }
    PresetOutcome {
        status: state,
        run_id: Some(started.record.record().identity.run_id.to_string()),
        record: Some(started.record.path().to_path_buf()),
        levels,
        temps: measured.temps,
        invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::schema::{PointResult as RecordPoint, Stats, WorkloadPoint};

    fn rec(tg: f64, std: f64) -> RunRecord {
        let mut r = RunRecord::new(TargetKind::Engine, Some("p".into()));
        let s = Stats {
            n: 3,
            mean: tg,
            std,
            min: tg,
            max: tg,
        };
        r.results.push(RecordPoint {
            point: WorkloadPoint {
                pp: 16,
                tg: 4,
                depth: 0,
                concurrency: 1,
            },
            tg_tps: Some(s),
            ..RecordPoint::default()
        });
        r
    }

    #[test]
    fn regression_fails_only_beyond_the_tolerance_and_hints_at_noise() {
        let prev = rec(100.0, 0.5);
        assert_eq!(regression(&rec(97.0, 0.5), &prev, 0.05).verdict, "pass");
        let slow = regression(&rec(90.0, 0.5), &prev, 0.05);
        assert_eq!(slow.verdict, "fail");
        assert!(slow.detail.contains("-10.0 %"), "{}", slow.detail);
        assert!(!slow.detail.contains("noise"), "{}", slow.detail);
        let noisy = regression(&rec(90.0, 20.0), &prev, 0.05);
        assert_eq!(noisy.verdict, "fail");
        assert!(noisy.detail.contains("within noise"), "{}", noisy.detail);
        let fast = regression(&rec(120.0, 0.5), &prev, 0.05);
        assert_eq!(fast.verdict, "pass");
        assert!(fast.detail.contains("faster"), "{}", fast.detail);
    }

    #[test]
    fn the_regression_baseline_comes_from_the_same_host() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::new(dir.path());
        let earlier = |tags: &[&str]| {
            let mut r = rec(100.0, 0.5);
            r.target.preset = Some("p".into());
            r.identity.status = RunStatus::Completed;
            r.identity.started_at = Utc::now() - chrono::Duration::hours(1);
            r.identity.tags = tags.iter().map(|t| t.to_string()).collect();
            store.create(r).unwrap();
        };
        earlier(&["matrix:a", "host:h1"]);
        let mut current = rec(90.0, 0.5);
        current.target.preset = Some("p".into());
        current.identity.tags = vec!["matrix:b".into(), "host:h2".into()];
        assert!(previous_record(dir.path(), "p", &current).is_none());
        current.identity.tags = vec!["matrix:b".into(), "host:h1".into()];
        assert!(previous_record(dir.path(), "p", &current).is_some());
        current.identity.tags = vec!["matrix:b".into()];
        assert!(previous_record(dir.path(), "p", &current).is_none());
    }
}

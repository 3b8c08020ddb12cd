//! Headless `mxtune launch` and `mxtune stop`.

use super::attach::AttachTarget;
use super::docker::{self, DockerTarget};
use super::engine::{EngineTarget, signal_group};
use super::follow::{Launch, LaunchOptions, Status};
use super::preflight::{self, Severity};
use super::{LaunchEvent, LogRules, state};
use crate::flags::preset::PresetStore;
use crate::flags::render::render;
use crate::flags::rules::{GpuArch, evaluate};
use crate::hosts::Host;
use crate::hosts::ssh::Tunnel;
use crate::vocab::LaunchSpec;
use crate::vocab::TargetKind;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::sync::mpsc;

/// Which target to launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetArg {
    /// A container through the Docker Engine API.
    Docker,
    /// The bundled engine (`mxtune serve …`) as a child process.
    Engine,
    /// An endpoint that already runs (`--url`).
    Attach,
    /// vLLM over Ray on the two hosts a `docker-cluster` preset names.
    #[value(name = "docker-cluster")]
    DockerCluster,
}

/// Arguments of `mxtune launch`.
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Preset name (or a path to a preset .toml): rendered for the target by the flags module.
    #[arg(long, conflicts_with = "spec", required_unless_present_any = ["spec", "url", "reattach"])]
    pub preset: Option<String>,
    /// Presets directory searched first, before ~/.config/mxtune/presets and the bundled presets.
    #[arg(long, env = "MXTUNE_PRESETS_DIR")]
    pub presets_dir: Option<PathBuf>,
    /// GPU architecture for the preset's conflict rules (e.g. sm121); unknown when omitted.
    #[arg(long)]
    pub arch: Option<GpuArch>,
    /// An already rendered launch spec (TOML, or JSON by extension) instead of a preset.
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Target kind (default: the preset's target; docker for a spec).
    #[arg(long, value_enum)]
    pub target: Option<TargetArg>,
    /// Base URL for `--target attach`.
    #[arg(long)]
    pub url: Option<String>,
    /// Model expected in /v1/models for `--target attach` (default: whatever it lists).
    #[arg(long, default_value = "")]
    pub model: String,
    /// Re-attach to a container mxtune started earlier (name or run id) instead of launching;
    /// with a docker-cluster preset, to the two nodes of that cluster run on its hosts.
    #[arg(long)]
    pub reattach: Option<String>,
    /// Directory for logs and the engine state file.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Engine binary for `--target engine` (default: this mxtune when argv[0] is `mxtune`).
    #[arg(long)]
    pub engine_bin: Option<PathBuf>,
    /// Pull the image when it is missing.
    #[arg(long)]
    pub pull: bool,
    /// Fail when not ready after this many seconds (docker and engine targets).
    #[arg(long, default_value_t = super::DEFAULT_STARTUP_LIMIT.as_secs())]
    pub startup_limit_s: u64,
    /// Fail an attached endpoint that is not ready after this many seconds.
    #[arg(long, default_value_t = super::DEFAULT_ATTACH_LIMIT.as_secs())]
    pub attach_limit_s: u64,
    /// Warn when no log line arrived for this many seconds.
    #[arg(long, default_value_t = super::DEFAULT_QUIET_WARNING.as_secs())]
    pub quiet_warning_s: u64,
    /// Log rules file (phases, fatal patterns) instead of the built-in table.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Bearer token for the target's API.
    #[arg(long, env = "MXTUNE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print every log line, not only phases and warnings.
    #[arg(long)]
    pub logs: bool,
    /// Drop the page cache before launching (needs root; never done without this flag).
    #[arg(long)]
    pub drop_page_cache: bool,
    /// Keep a failed container for inspection instead of removing it.
    #[arg(long)]
    pub keep: bool,
    /// Run the Docker target on this host of ~/.config/mxtune/hosts.toml: its Docker engine
    /// and the API port are reached through an SSH tunnel that lasts as long as the command.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
}

/// Arguments of `mxtune stop`.
#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// Container name or id, run id, or engine pid to stop.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub name: Option<String>,
    /// Stop every container and engine mxtune started.
    #[arg(long)]
    pub all: bool,
    /// Directory holding the engine state file.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Seconds between SIGTERM and kill.
    #[arg(long, default_value_t = 30)]
    pub grace_s: u64,
    /// Keep stopped containers instead of removing them.
    #[arg(long)]
    pub keep: bool,
    /// Stop containers on this host of ~/.config/mxtune/hosts.toml (over SSH) instead of
    /// this machine's containers and engines.
    #[arg(long, value_name = "NAME", conflicts_with = "cluster")]
    pub host: Option<String>,
    /// Stop the two-node cluster containers (head and worker) on the hosts this
    /// docker-cluster preset names; NAME is then a run id (or --all: every cluster there).
    #[arg(long, value_name = "PRESET")]
    pub cluster: Option<String>,
    /// Presets directory searched first (for --cluster).
    #[arg(long, env = "MXTUNE_PRESETS_DIR")]
    pub presets_dir: Option<PathBuf>,
}

/// Arguments of `mxtune preflight`.
#[derive(Debug, clap::Args)]
pub struct PreflightArgs {
    /// The rendered launch spec: TOML, or JSON by extension; `-` reads JSON from stdin.
    #[arg(long)]
    pub spec: PathBuf,
    /// Leave out the GPU-busy check (a target on the CPU).
    #[arg(long)]
    pub no_gpu: bool,
    /// Print the findings as one JSON array instead of lines.
    #[arg(long)]
    pub json: bool,
    /// When nothing blocks, create the missing writable mount sources (caches) as this user,
    /// as a local launch does before it starts the container.
    #[arg(long)]
    pub create_writable_mounts: bool,
}

/// `mxtune preflight`: launch's host checks (port, mounts, GPU processes, compilers, unified
/// memory) for a spec, on this machine; `launch --host` runs it on the host. Exit 0, or 2
/// when a finding blocks the launch.
pub fn preflight(args: PreflightArgs) -> Result<ExitCode> {
    let spec = if args.spec.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the launch spec from stdin")?;
        serde_json::from_str(&text).context("the launch spec on stdin is not a JSON LaunchSpec")?
    } else {
        load_spec(&args.spec)?
    };
    let mut findings = preflight::host_checks(&spec, !args.no_gpu);
    let blocked = findings.iter().any(|f| f.severity == Severity::Error);
    if args.create_writable_mounts
        && !blocked
        && let Some(c) = &spec.container
        && let Err(e) = preflight::create_writable_mounts(&c.mounts)
    {
        findings.push(preflight::Finding {
            severity: Severity::Error,
            message: format!("{e:#}"),
        });
    }
    if args.json {
        crate::outln!(
            "{}",
            serde_json::to_string(&findings).context("writing the findings as JSON")?
        );
    } else if findings.is_empty() {
        crate::outln!("pre-flight: nothing found");
    } else {
        for f in &findings {
            crate::outln!("pre-flight {:?}: {}", f.severity, f.message);
        }
    }
    Ok(if findings.iter().any(|f| f.severity == Severity::Error) {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Reads a launch spec from TOML or (by `.json` extension) JSON.
pub fn load_spec(path: &Path) -> Result<LaunchSpec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read launch spec {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| {
            format!(
                "launch spec {} is not a valid JSON LaunchSpec",
                path.display()
            )
        })
    } else {
        toml::from_str(&text).with_context(|| {
            format!(
                "launch spec {} is not a valid TOML LaunchSpec",
                path.display()
            )
        })
    }
}

/// What `resolve` found: the spec to launch, the preset name, the target, the preset's rule
/// findings, and the preset's flags (to render again once the image's vLLM version is known).
type Resolved = (
    LaunchSpec,
    String,
    TargetArg,
    Vec<preflight::Finding>,
    Option<crate::flags::FlagSet>,
);

/// The spec to launch, the preset name, the target, the preset's rule findings and flags.
fn resolve(args: &LaunchArgs) -> Result<Resolved> {
    if let Some(name) = &args.preset {
        let store = PresetStore::standard(args.presets_dir.clone());
        let loaded = if name.ends_with(".toml") || name.contains('/') {
            store.load_file(Path::new(name))
        } else {
            store.load(name)
        };
        let p = loaded.map_err(|e| anyhow!("{e}"))?;
        let target = args.target.unwrap_or(match p.flags.target {
            TargetKind::Engine => TargetArg::Engine,
            TargetKind::Attach => TargetArg::Attach,
            TargetKind::Docker => TargetArg::Docker,
            TargetKind::DockerCluster => TargetArg::DockerCluster,
        });
        let kind = match target {
            TargetArg::Docker => TargetKind::Docker,
            TargetArg::Engine => TargetKind::Engine,
            TargetArg::Attach => TargetKind::Attach,
            TargetArg::DockerCluster => TargetKind::DockerCluster,
        };
        let spec = render(&p.flags, kind).with_context(|| {
            format!(
                "rendering preset {} ({}) for the {kind:?} target",
                p.name, p.origin
            )
        })?;
        let findings = evaluate(&p.flags, kind, args.arch)
            .into_iter()
            .map(|f| preflight::Finding {
                severity: if f.blocks() {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                message: f.to_string(),
            })
            .collect();
        return Ok((spec, p.name, target, findings, Some(p.flags)));
    }
    let target = args.target.unwrap_or(TargetArg::Docker);
    match &args.spec {
        Some(path) => {
            let preset = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((load_spec(path)?, preset, target, Vec::new(), None))
        }
        None => Ok((
            LaunchSpec::default(),
            String::new(),
            target,
            Vec::new(),
            None,
        )),
    }
}

/// Prints launch events on stderr as they arrive.
struct EventPrinter {
    /// Every log line too, not only phases and warnings.
    logs: bool,
    /// The probe answer printed last: a stuck start probes every second, and only a new
    /// answer is news.
    last_probe: Option<crate::vocab::ProbeAnswer>,
}

impl EventPrinter {
    fn print(&mut self, e: &LaunchEvent) {
        let logs = self.logs;
        match e {
            LaunchEvent::Log { line, .. } if logs => crate::errln!("  | {line}"),
            LaunchEvent::Log { .. } => {}
            LaunchEvent::PullProgress { status } if logs => crate::errln!("  pull: {status}"),
            LaunchEvent::PullProgress { .. } => {}
            LaunchEvent::Phase { phase } => crate::errln!("phase: {phase}"),
            LaunchEvent::Ready { url, startup_s } => {
                crate::errln!("ready: {url} after {startup_s:.1} s")
            }
            LaunchEvent::Verdict { .. } => {}
            LaunchEvent::Warning { message } => crate::errln!("warning: {message}"),
            LaunchEvent::Failed { message } => crate::errln!("failed: {message}"),
            LaunchEvent::Exited { exit } => crate::errln!("exited: {exit}"),
            LaunchEvent::Probe { answer } => {
                if !self
                    .last_probe
                    .as_ref()
                    .is_some_and(|l| l.same_answer(answer))
                {
                    crate::errln!("probe: {answer}");
                    self.last_probe = Some(answer.clone());
                }
            }
        }
    }
}

/// One line on the dialect a vLLM launch is rendered in, with the note when the version of a
/// stock image had to be assumed.
pub fn dialect_line(spec: &LaunchSpec) -> Option<String> {
    let d = spec.dialect.as_ref()?;
    let mut line = match (&d.vllm_version, &d.version_source) {
        (Some(v), Some(src)) => format!("dialect: {} vLLM {v} ({src})", d.flavour),
        _ => format!("dialect: {}", d.flavour),
    };
    if let Some(n) = &d.note {
        line.push_str(&format!("\nnote: {n}"));
    }
    Some(line)
}

fn print_verdict(launch: &Launch) {
    if let Some(v) = launch.history().vllm_version {
        crate::outln!("vLLM version announced by the target: {v}");
    }
    let report = launch.report();
    crate::outln!("kernel-path verdict: {:?}", report.overall());
    for c in &report.checks {
        crate::outln!("  {}={}: {:?}", c.flag, c.value, c.verdict);
        for l in c.seen.iter().take(3) {
            crate::outln!("      seen: {l}");
        }
        for l in &c.forbidden_seen {
            crate::outln!("      must not see, but saw: {l}");
        }
        for p in &c.missing {
            crate::outln!("      never saw: {p}");
        }
        if let Some(n) = &c.note {
            crate::outln!("      note: {n}");
        }
    }
    for w in report.warnings() {
        crate::outln!("  warning: {w}");
    }
}

/// ` --host NAME` for the hints printed about a remote host's containers.
fn host_flag(host: Option<&Host>) -> String {
    host.map(|h| format!(" --host {}", h.name))
        .unwrap_or_default()
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("cannot start the async runtime")
}

/// `mxtune launch`: pre-flight, start, wait for ready, print phases and the verdict, leave
/// the target running. Exit 0 when ready, 1 when it failed, 2 when pre-flight blocked.
pub fn launch(args: LaunchArgs) -> Result<ExitCode> {
    runtime()?.block_on(launch_async(args))
}

/// `mxtune stop`: stops containers (by mxtune label only) and engine children mxtune started.
pub fn stop(args: StopArgs) -> Result<ExitCode> {
    runtime()?.block_on(stop_async(args))
}

async fn launch_async(args: LaunchArgs) -> Result<ExitCode> {
    let run_id = ulid::Ulid::generate().to_string();
    let (mut spec, preset, target, rule_findings, flags) = resolve(&args)?;
    let remote = match &args.host {
        Some(name) => {
            if target == TargetArg::DockerCluster {
                bail!(
                    "--host {name}: a docker-cluster preset names its two hosts itself (cluster.head and cluster.worker); leave out --host"
                );
            }
            if target != TargetArg::Docker {
                bail!(
                    "--host {name} runs a Docker target on that host; for the {} target, run mxtune there (or attach to its URL with --target attach --url)",
                    match target {
                        TargetArg::Engine => "engine",
                        _ => "attach",
                    }
                );
            }
            if args.drop_page_cache {
                bail!(
                    "--drop-page-cache drops this machine's page cache, not host {name}'s: run `sync; echo 1 | sudo tee /proc/sys/vm/drop_caches` there, then launch without it"
                );
            }
            Some(crate::hosts::find(name)?)
        }
        None => None,
    };
    let remote = remote.as_ref();
    // Declared before the launch so that they are dropped after it: the launch talks to
    // the remote Docker engine and API through them until the end.
    let mut tunnels: Vec<Tunnel> = Vec::new();
    let mut opts = LaunchOptions::new(&run_id, &preset)?;
    opts.remote_host = remote.map(|h| h.name.clone());
    opts.log_path = Some(args.runs_dir.join(format!("{run_id}.target.log")));
    opts.allow_pull = args.pull;
    opts.startup_limit = Duration::from_secs(args.startup_limit_s);
    opts.attach_limit = Duration::from_secs(args.attach_limit_s);
    opts.quiet_warning = Duration::from_secs(args.quiet_warning_s);
    opts.api_key = args.api_key.clone();
    opts.keep = args.keep;
    if let Some(r) = &args.rules {
        opts.rules = LogRules::load(r)?;
    }
    for w in &spec.warnings {
        crate::errln!("warning: {w}");
    }
    let (tx, mut rx) = mpsc::unbounded_channel();

    let mut launch = match (target, &args.reattach) {
        (TargetArg::DockerCluster, Some(which)) => {
            let cluster = spec.cluster.clone().context(
                "the launch spec has no [cluster] section: re-attaching to a two-node cluster needs the docker-cluster preset it was launched with",
            )?;
            let plan = super::cluster::ClusterPlan::from_hosts_file(&cluster)?;
            let engines = super::cluster::ClusterEngines::connect(&plan, &spec).await?;
            if let Some(flags) = &flags {
                // In the names of the vLLM release the head's image carries, as launched.
                spec = super::dialect::render_for_launch(
                    flags,
                    TargetKind::DockerCluster,
                    Some(&engines.head),
                )
                .await?;
            }
            let launch = super::cluster::ClusterTarget::reattach_on(
                engines,
                plan,
                &spec,
                which,
                Some(&args.runs_dir),
                &opts,
                tx,
            )
            .await?;
            if let super::Target::Cluster(c) = &launch.target {
                crate::errln!("re-attaching to run {}: {}", c.run_id, c.describe());
            }
            launch
        }
        (TargetArg::DockerCluster, None) => {
            if args.drop_page_cache {
                bail!(
                    "--drop-page-cache with a two-node cluster: drop the page cache on each host by hand (`sync; echo 1 | sudo tee /proc/sys/vm/drop_caches`), then launch without it"
                );
            }
            let cluster = spec.cluster.clone().context(
                "the launch spec has no [cluster] section: a docker-cluster launch needs a docker-cluster preset (or a spec rendered from one)",
            )?;
            let plan = super::cluster::ClusterPlan::from_hosts_file(&cluster)?;
            let mut findings = preflight::cluster_checks(&plan, &spec).await?;
            // The preset's rule findings concern the head, printed after its host's.
            let head_n = findings.iter().filter(|f| f.node == Some("head")).count();
            findings.splice(
                head_n..head_n,
                rule_findings
                    .into_iter()
                    .map(|finding| preflight::LaunchFinding {
                        node: Some("head"),
                        finding,
                    }),
            );
            for f in &findings {
                crate::errln!("{}", f.line());
            }
            if preflight::blocked(&findings) {
                crate::errln!("{}", preflight::BLOCKED);
                return Ok(ExitCode::from(2));
            }
            crate::errln!(
                "cluster: Ray head on host {} ({}), worker on host {} ({}), Ray at {}, {} parallel over 2 GPUs, expecting NCCL over {}",
                plan.head.host_name(),
                plan.head.ip,
                plan.worker.host_name(),
                plan.worker.ip,
                plan.ray_address(),
                cluster.parallel,
                cluster.transport
            );
            let (engines, rendered) = super::cluster::ClusterEngines::connect_for_launch(
                &plan,
                &spec,
                flags.as_ref(),
                args.pull,
                &tx,
            )
            .await?;
            spec = rendered;
            if let Some(line) = dialect_line(&spec) {
                crate::errln!("{line}");
            }
            super::cluster::ClusterTarget::launch_on(engines, plan, &spec, &opts, tx).await?
        }
        (TargetArg::Attach, _) => {
            let url = args.url.as_deref().context("--target attach needs --url")?;
            AttachTarget::attach(url, &args.model, &opts, tx)?
        }
        (TargetArg::Docker, Some(which)) => {
            let (d, tunnel) = docker::connect_on(remote, None).await?;
            tunnels.extend(tunnel);
            let found = docker::find_mxtune_containers(&d).await?;
            let Some(f) = found
                .iter()
                .find(|f| &f.name == which || &f.run_id == which)
            else {
                bail!(
                    "no mxtune container named or with run id {which:?} (see `docker ps -a --filter label={}`)",
                    docker::LABEL_RUN_ID
                );
            };
            if let Some(role) = &f.cluster_role {
                let given = if preset.is_empty() {
                    "without a preset".to_string()
                } else {
                    format!("with preset {preset}, which is not a docker-cluster preset,")
                };
                bail!(
                    "container {} is the Ray {role} of two-node cluster run {} (preset {}); --reattach {given} follows one container only: re-attach to the cluster with `mxtune launch --preset {} --reattach {}`",
                    f.name,
                    f.run_id,
                    f.preset,
                    f.preset,
                    f.run_id
                );
            }
            crate::errln!(
                "re-attaching to container {} (run {}, preset {})",
                f.name,
                f.run_id,
                f.preset
            );
            if let Some(h) = remote {
                let port = if spec.port == 0 {
                    f.port
                } else {
                    Some(spec.port)
                };
                let port = port.with_context(|| {
                    format!("container {} has no {} label: give the preset or spec it was launched with", f.name, docker::LABEL_PORT)
                })?;
                let api = Tunnel::open(h, Some((docker::connect_host(&spec.host), port))).await?;
                opts.api_url = api.url();
                tunnels.push(api);
            }
            DockerTarget::reattach(d, f, &spec, &opts, tx).await?
        }
        (_, Some(_)) => bail!(
            "--reattach works for the Docker and docker-cluster targets only; an engine keeps running and is stopped with `mxtune stop`"
        ),
        (kind, None) => {
            if args.drop_page_cache {
                preflight::drop_page_cache()?;
                crate::errln!("dropped the page cache");
            }
            // A CPU engine needs no GPU, so nobody else on it matters.
            let mut findings =
                preflight::checks_on(remote, &spec, !preflight::runs_on_cpu(&spec)).await?;
            findings.extend(rule_findings);
            let docker = if kind == TargetArg::Docker {
                let forward = remote.map(|_| (docker::connect_host(&spec.host), spec.port));
                let (d, tunnel) = docker::connect_on(remote, forward).await?;
                if let Some(t) = tunnel {
                    opts.api_url = t.url();
                    tunnels.push(t);
                }
                let earlier = docker::find_mxtune_containers(&d).await?;
                let on = host_flag(remote);
                for f in earlier.iter().filter(|f| f.state == "running") {
                    crate::errln!(
                        "note: mxtune container {} (run {}, preset {}) is running: re-attach with `mxtune launch{on} --reattach {}` or stop it with `mxtune stop{on} {}`",
                        f.name,
                        f.run_id,
                        f.preset,
                        f.name,
                        f.name
                    );
                }
                if let Some(c) = &spec.container
                    && !args.pull
                {
                    findings
                        .extend(preflight::check_image(&d, &c.image, remote, Some("--pull")).await);
                }
                Some(d)
            } else {
                None
            };
            let findings: Vec<_> = findings
                .into_iter()
                .map(preflight::LaunchFinding::single)
                .collect();
            for f in &findings {
                crate::errln!("{}", f.line());
            }
            if preflight::blocked(&findings) {
                crate::errln!("{}", preflight::BLOCKED);
                return Ok(ExitCode::from(2));
            }
            match docker {
                Some(d) => {
                    if let Some(flags) = &flags {
                        if flags.container.vllm == crate::flags::VllmFlavor::Upstream {
                            // The release is asked of the image, so a missing one comes first.
                            docker::ensure_image(&d, &flags.container.image, args.pull, &tx)
                                .await?;
                        }
                        // Rendered again in the names of the vLLM release the image carries.
                        spec =
                            super::dialect::render_for_launch(flags, TargetKind::Docker, Some(&d))
                                .await
                                .with_context(|| {
                                    format!(
                                        "rendering preset {preset} for its image's vLLM release"
                                    )
                                })?;
                    }
                    if let Some(line) = dialect_line(&spec) {
                        crate::errln!("{line}");
                    }
                    if let Some(t) = tunnels.first()
                        && t.port.is_some_and(|(_, p)| p != spec.port)
                    {
                        bail!(
                            "rendering for the image's vLLM release moved the API port from {} to {}: give the port in the preset",
                            t.port.map(|(_, p)| p).unwrap_or_default(),
                            spec.port
                        );
                    }
                    DockerTarget::launch(d, &spec, &opts, tx).await?
                }
                None => {
                    if spec.container.is_some() {
                        crate::errln!(
                            "note: the spec has container settings; the engine target ignores them"
                        );
                    }
                    EngineTarget::launch(
                        args.engine_bin.as_deref(),
                        &spec,
                        &opts,
                        Some(&args.runs_dir),
                        tx,
                    )
                    .await?
                }
            }
        }
    };
    if let (Some(h), Some((local, port))) = (remote, tunnels.last().and_then(|t| t.port)) {
        crate::errln!(
            "on host {} ({}): the API is port {port} there, forwarded to 127.0.0.1:{local} here while this command runs",
            h.name,
            h.ssh
        );
    }
    let log = opts
        .log_path
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if args.reattach.is_some() {
        crate::errln!("log of this re-attach: {log}");
    } else {
        crate::errln!(
            "launched {} (run {run_id}); log: {log}",
            launch.target.describe()
        );
    }

    let mut out = EventPrinter {
        logs: args.logs,
        last_probe: None,
    };
    let printer = tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            out.print(&e);
        }
    });
    let result = launch.wait_ready().await;
    // Let the printer show the ready/verdict events before the summary.
    tokio::time::sleep(Duration::from_millis(100)).await;
    printer.abort();
    match result {
        Ok(info) => {
            crate::outln!(
                "ready: {} serves {:?} after {:.1} s",
                info.url,
                info.model,
                info.startup_s
            );
            print_verdict(&launch);
            let target = launch.detach();
            crate::outln!(
                "left running: {}{} (stop with `{}`)",
                target.describe(),
                remote
                    .map(|h| format!(" on host {}", h.name))
                    .unwrap_or_default(),
                stop_hint(&target, &run_id, &preset, remote)
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            crate::errln!("mxtune: {e:#}");
            if !matches!(launch.status(), Status::Exited(_)) || !args.keep {
                let grace = Duration::from_secs(10);
                match launch.stop(grace, args.keep).await {
                    Ok(msg) => crate::errln!("{msg}"),
                    Err(e) => crate::errln!("mxtune: cleaning up failed: {e:#}"),
                }
            }
            Ok(ExitCode::from(1))
        }
    }
}

fn stop_name(target: &super::Target, run_id: &str) -> String {
    match target {
        super::Target::Docker(t) => t.name.clone(),
        _ => run_id.to_string(),
    }
}

/// The stop command for what `launch` left running.
fn stop_hint(target: &super::Target, run_id: &str, preset: &str, remote: Option<&Host>) -> String {
    match target {
        super::Target::Cluster(c) => format!("mxtune stop --cluster {preset} {}", c.run_id),
        _ => format!(
            "mxtune stop{} {}",
            host_flag(remote),
            stop_name(target, run_id)
        ),
    }
}

/// `mxtune stop --cluster PRESET`: the head and worker containers (by mxtune's labels) on
/// the hosts the preset names, matching the run id or container name (or all with `--all`).
async fn stop_cluster(args: &StopArgs, preset: &str) -> Result<ExitCode> {
    let grace = Duration::from_secs(args.grace_s);
    let store = PresetStore::standard(args.presets_dir.clone());
    let p = store.load(preset).map_err(|e| anyhow!("{e}"))?;
    if p.flags.target != TargetKind::DockerCluster {
        bail!(
            "--cluster {preset}: preset {} is a {} preset, not docker-cluster; stop its container with `mxtune stop NAME`",
            p.name,
            p.flags.target.name()
        );
    }
    let spec = render(&p.flags, TargetKind::DockerCluster)
        .with_context(|| format!("rendering preset {} ({})", p.name, p.origin))?;
    let cluster = spec
        .cluster
        .context("the rendered preset has no cluster section")?;
    let plan = super::cluster::ClusterPlan::from_hosts_file(&cluster)?;
    let (mut stopped, mut failures) = (0usize, 0usize);
    for host in plan.engines() {
        let on = host
            .as_ref()
            .map(|h| h.name.clone())
            .unwrap_or_else(|| crate::flags::render::LOCAL_HOST.into());
        let (d, _tunnel) = docker::connect_on(host.as_ref(), None)
            .await
            .with_context(|| format!("reaching host {on}"))?;
        for f in docker::find_mxtune_containers(&d).await? {
            // Both nodes may share one engine (`local` twice, or a host that is this
            // machine): each host stops the nodes started for it.
            let wanted = f.cluster_role.is_some()
                && f.cluster_host.as_deref() == Some(on.as_str())
                && (args.all
                    || args
                        .name
                        .as_deref()
                        .is_some_and(|n| n == f.run_id || n == f.name));
            if !wanted {
                continue;
            }
            match docker::stop_container(&d, &f.id, &f.name, grace, args.keep).await {
                Ok(msg) => {
                    crate::outln!("{msg} on host {on}");
                    stopped += 1;
                }
                Err(e) => {
                    crate::errln!("mxtune: host {on}: {e:#}");
                    failures += 1;
                }
            }
        }
    }
    if failures > 0 {
        return Ok(ExitCode::FAILURE);
    }
    if stopped == 0 {
        match &args.name {
            Some(n) => bail!(
                "no cluster container of run {n:?} on host {} or host {} (containers by label {})",
                plan.head.host_name(),
                plan.worker.host_name(),
                super::cluster::LABEL_ROLE
            ),
            None => crate::outln!("nothing to stop"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn stop_async(args: StopArgs) -> Result<ExitCode> {
    if let Some(preset) = &args.cluster {
        return stop_cluster(&args, preset).await;
    }
    let grace = Duration::from_secs(args.grace_s);
    let mut stopped = 0usize;
    let mut failures = 0usize;
    let remote = args.host.as_deref().map(crate::hosts::find).transpose()?;
    let remote = remote.as_ref();
    // Engines from the state file: this machine's only.
    let engines = match remote {
        None => state::load(&args.runs_dir)?,
        Some(_) => Vec::new(),
    };
    for rec in &engines {
        let wanted = args.all
            || args
                .name
                .as_deref()
                .is_some_and(|n| n == rec.run_id || n == rec.pid.to_string());
        if !wanted {
            continue;
        }
        if !state::is_alive(rec) {
            crate::errln!(
                "engine run {} (pid {}) is no longer running",
                rec.run_id,
                rec.pid
            );
            state::remove(&args.runs_dir, &rec.run_id)?;
            continue;
        }
        match stop_engine_pid(rec, grace).await {
            Ok(msg) => {
                crate::outln!("{msg}");
                stopped += 1;
                state::remove(&args.runs_dir, &rec.run_id)?;
            }
            Err(e) => {
                crate::errln!("mxtune: {e:#}");
                failures += 1;
            }
        }
    }
    // Containers: only those with mxtune's label are ever listed.
    let docker_matches_engine = !args.all && stopped > 0;
    if !docker_matches_engine {
        match docker::connect_on(remote, None).await {
            Ok((d, _tunnel)) => {
                for f in docker::find_mxtune_containers(&d).await? {
                    let wanted = args.all
                        || args.name.as_deref().is_some_and(|n| {
                            n == f.name || n == f.run_id || (n.len() >= 12 && f.id.starts_with(n))
                        });
                    if !wanted {
                        continue;
                    }
                    match docker::stop_container(&d, &f.id, &f.name, grace, args.keep).await {
                        Ok(msg) => {
                            crate::outln!("{msg}");
                            stopped += 1;
                        }
                        Err(e) => {
                            crate::errln!("mxtune: {e:#}");
                            failures += 1;
                        }
                    }
                }
            }
            Err(e) if args.all => crate::errln!("note: containers not checked: {e:#}"),
            Err(e) if stopped == 0 => return Err(e),
            Err(_) => {}
        }
    }
    if failures > 0 {
        return Ok(ExitCode::FAILURE);
    }
    if stopped == 0 {
        match &args.name {
            Some(n) => match remote {
                Some(h) => bail!(
                    "nothing mxtune started on host {} matches {n:?} (containers by label {})",
                    h.name,
                    docker::LABEL_RUN_ID
                ),
                None => bail!(
                    "nothing mxtune started matches {n:?} (containers by label {}, engines in {})",
                    docker::LABEL_RUN_ID,
                    args.runs_dir.join(state::STATE_FILE).display()
                ),
            },
            None => crate::outln!("nothing to stop"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn stop_engine_pid(rec: &state::EngineRecord, grace: Duration) -> Result<String> {
    signal_group(rec.pid, libc::SIGTERM)?;
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if !state::is_alive(rec) {
            return Ok(format!(
                "engine run {} (pid {}) stopped (SIGTERM)",
                rec.run_id, rec.pid
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal_group(rec.pid, libc::SIGKILL)?;
    Ok(format!(
        "engine run {} (pid {}) killed (SIGKILL after {} s)",
        rec.run_id,
        rec.pid,
        grace.as_secs()
    ))
}

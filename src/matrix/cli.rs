//! Headless `mxtune matrix` and `mxtune ab`.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::ab;
use super::plan::{Grid, Profile, TestLevel, parse_levels, shuffled};
use super::progress::{MatrixEvent, Progress};
use super::state::{MatrixPlan, MatrixState, PresetStatus};
use crate::bench::client::Endpoint;
use crate::bench::workload::{Cancel, CancelWatch};
use crate::launch::cli::TargetArg;
use crate::vocab::TargetKind;

/// Options shared by `matrix` and `ab`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CommonArgs {
    /// Target to launch each preset on.
    #[arg(long, value_enum, default_value = "docker")]
    pub target: TargetArg,
    /// Grid items over the default (pp=2048 tg=32,128 depth=0 c=1 runs=3 warmup=1),
    /// e.g. `--grid pp=16 tg=4 runs=1`.
    #[arg(long, num_args = 1..)]
    pub grid: Vec<String>,
    /// Start from a built-in grid profile (items of --grid still apply on top).
    #[arg(long, value_enum)]
    pub profile: Option<Profile>,
    /// Endpoint the benchmarks stream from.
    #[arg(long, value_enum, default_value = "chat")]
    pub endpoint: Endpoint,
    /// Presets directory searched first, before ~/.config/mxtune/presets and the bundled presets.
    #[arg(long, env = "MXTUNE_PRESETS_DIR")]
    pub presets_dir: Option<PathBuf>,
    /// Runs directory for the run records and target logs.
    #[arg(long, env = "MXTUNE_RUNS_DIR", default_value = crate::record::store::DEFAULT_RUNS_DIR)]
    pub runs_dir: PathBuf,
    /// Engine binary for `--target engine` (default: this mxtune).
    #[arg(long)]
    pub engine_bin: Option<PathBuf>,
    /// Engine device for every preset (`cpu`, `cuda`, `auto`), overriding the presets.
    #[arg(long)]
    pub device: Option<String>,
    /// Engine model for every preset, overriding `engine.model` (e.g.
    /// `synthetic:gpt-oss-120b`: A/B the gates on any GPU before the weights are there).
    #[arg(long)]
    pub engine_model: Option<String>,
    /// L1 watchdog: a target not ready after this many seconds fails L1.
    #[arg(long, default_value_t = 2700)]
    pub startup_limit_s: u64,
    /// Before each measured point wait until the GPU is below this temperature, °C.
    #[arg(long)]
    pub cooldown_c: Option<f64>,
    /// Longest cool-down wait, seconds.
    #[arg(long, default_value_t = 900)]
    pub cooldown_limit_s: u64,
    /// Run the Docker presets on this host of ~/.config/mxtune/hosts.toml (over SSH);
    /// repeated, the presets are dealt out over the hosts, which run at the same time.
    /// `NAME=PRESET,PRESET…` gives the host its own presets instead (matrix only; `ab`
    /// takes one host and runs both presets there).
    #[arg(long = "host", value_name = "NAME[=PRESET,…]")]
    pub hosts: Vec<String>,
}

/// The levels a matrix runs unless told otherwise (`--levels`).
pub const DEFAULT_LEVELS: &str = "1,1.5,2,4,5";

/// Arguments of `mxtune matrix`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct MatrixArgs {
    /// Presets (names or .toml paths); the first is the baseline of the report's deltas.
    /// With `--host NAME=PRESET,…` they may all be in the hosts' lists instead.
    pub presets: Vec<String>,
    /// Test levels to run: 1 smoke, 1.5 kernel path, 2 correctness, 3 stress, 4 grid,
    /// 5 regression.
    #[arg(long, default_value = DEFAULT_LEVELS)]
    pub levels: String,
    /// Output directory: state file, report, charts, summary.
    #[arg(long, default_value = "matrix")]
    pub out: PathBuf,
    /// Resume the matrix in --out from its first unfinished preset (plan taken from there).
    #[arg(long)]
    pub resume: bool,
    /// Shuffle seed (default: random, recorded in the state and the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the given order instead of shuffling.
    #[arg(long, conflicts_with = "seed")]
    pub no_shuffle: bool,
    /// L5 tolerance in percent.
    #[arg(long, default_value_t = 5.0)]
    pub tolerance_pct: f64,
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A B rounds unless `--rounds` says otherwise (the panel starts from it too).
pub const DEFAULT_AB_ROUNDS: u32 = 3;

/// Arguments of `mxtune ab`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct AbArgs {
    /// Configuration A (the reference).
    pub preset_a: String,
    /// Configuration B (the change).
    pub preset_b: String,
    /// A B rounds.
    #[arg(long, default_value_t = DEFAULT_AB_ROUNDS)]
    pub rounds: u32,
    /// Noise threshold in standard deviations: a B/A ratio within K times its spread over
    /// rounds of 1 is marked "within noise".
    #[arg(long, value_name = "K", default_value_t = crate::record::compare::DEFAULT_NOISE_SIGMAS, value_parser = crate::record::compare::parse_noise_sigmas)]
    pub noise: f64,
    /// Keep both targets running across rounds instead of relaunching each round; only
    /// when the two presets listen on different ports (and, for Docker, use different
    /// container names). The record says so.
    #[arg(long)]
    pub reuse: bool,
    /// Output directory for ab.md and ab.json; one holding an earlier A/B is refused.
    #[arg(long, default_value = "ab")]
    pub out: PathBuf,
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

pub(crate) fn target_kind(t: TargetArg) -> Result<TargetKind> {
    Ok(match t {
        TargetArg::Docker => TargetKind::Docker,
        TargetArg::Engine => TargetKind::Engine,
        TargetArg::Attach => {
            bail!(
                "--target attach: a matrix launches and stops its targets; use docker, docker-cluster or engine"
            )
        }
        TargetArg::DockerCluster => TargetKind::DockerCluster,
    })
}

/// The plan of the shared options.
pub(crate) fn plan_of(
    c: &CommonArgs,
    presets: Vec<String>,
    levels: Vec<TestLevel>,
) -> Result<MatrixPlan> {
    let base = c.profile.map(Profile::grid).unwrap_or_default();
    let grid: Grid = base.apply(&c.grid)?;
    grid.workload(c.endpoint).validate()?;
    let mut presets = presets;
    let mut hosts = Vec::new();
    let mut host_presets = std::collections::BTreeMap::new();
    if !c.hosts.is_empty() {
        if c.target == TargetArg::DockerCluster {
            bail!(
                "--host with --target docker-cluster: a docker-cluster preset names its two hosts itself (cluster.head and cluster.worker); leave out --host"
            );
        }
        if c.target != TargetArg::Docker {
            bail!(
                "--host runs Docker presets on that host: use --target docker (for the engine, run mxtune on that host)"
            );
        }
        for arg in &c.hosts {
            let (name, list) = parse_host_arg(arg)?;
            if hosts.contains(&name) {
                bail!("--host {name} is given twice; name each host once");
            }
            crate::hosts::find(&name)?;
            if let Some(list) = list {
                host_presets.insert(name.clone(), list);
            }
            hosts.push(name);
        }
    }
    if !host_presets.is_empty() {
        if !presets.is_empty() && hosts.iter().all(|h| host_presets.contains_key(h)) {
            bail!(
                "preset(s) {} have no host: every --host has its own list; put them in a list (--host NAME=PRESET,…) or add a --host NAME without one to deal them out",
                presets.join(", ")
            );
        }
        // The hosts' presets join the matrix after the named ones, in --host order.
        for h in &hosts {
            presets.extend(host_presets.get(h).into_iter().flatten().cloned());
        }
    }
    let engine_bin = match &c.engine_bin {
        Some(p) => Some(p.clone()),
        None => Some(std::env::current_exe().context("cannot find the running mxtune binary")?),
    };
    Ok(MatrixPlan {
        target: target_kind(c.target)?,
        presets,
        levels,
        grid,
        endpoint: c.endpoint,
        seed: None,
        cooldown_c: c.cooldown_c,
        cooldown_limit_s: c.cooldown_limit_s,
        startup_limit_s: c.startup_limit_s,
        tolerance: 0.05,
        presets_dir: c.presets_dir.clone(),
        runs_dir: c.runs_dir.clone(),
        engine_bin,
        device: c.device.clone(),
        engine_model: c.engine_model.clone(),
        hosts,
        host_presets,
    })
}

/// A `--host` value: `NAME`, or `NAME=PRESET,PRESET…` (the host's own presets).
fn parse_host_arg(arg: &str) -> Result<(String, Option<Vec<String>>)> {
    let (name, list) = match arg.split_once('=') {
        None => (arg.trim(), None),
        Some((name, list)) => (name.trim(), Some(list)),
    };
    if name.is_empty() {
        bail!(
            "--host {arg:?}: the host's name is missing; give --host NAME or --host NAME=PRESET,PRESET…"
        );
    }
    let Some(list) = list else {
        return Ok((name.to_string(), None));
    };
    let presets: Vec<String> = list.split(',').map(|p| p.trim().to_string()).collect();
    if presets.iter().any(String::is_empty) {
        bail!(
            "--host {arg}: the list of presets for host {name} has an empty name; give --host {name}=PRESET,PRESET… (comma-separated, no empty items)"
        );
    }
    Ok((name.to_string(), Some(presets)))
}

/// Ctrl-C, SIGTERM and SIGHUP (a dropped SSH session) all cancel the same way.
pub(crate) fn install_signals(cancel: Cancel) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut hup = signal(SignalKind::hangup()).ok();
        let term_f = async {
            match term.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let hup_f = async {
            match hup.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term_f => {}
            _ = hup_f => {}
        }
        crate::errln!("mxtune: interrupted: stopping the current target; resume with --resume");
        cancel.cancel();
    });
}

/// `mxtune matrix`. Exit: 0 every level of every preset passed, 1 something failed,
/// 130 interrupted (resume with `--resume`).
pub fn matrix(args: MatrixArgs) -> Result<ExitCode> {
    tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(matrix_async(args))
}

fn new_state(args: &MatrixArgs) -> Result<MatrixState> {
    if MatrixState::path(&args.out).exists() {
        bail!(
            "{} already holds a matrix: resume it with --resume, or pick another --out",
            args.out.display()
        );
    }
    if !(args.tolerance_pct.is_finite() && args.tolerance_pct > 0.0) {
        bail!(
            "--tolerance-pct must be a positive number, got {}",
            args.tolerance_pct
        );
    }
    let mut plan = plan_of(
        &args.common,
        args.presets.clone(),
        parse_levels(&args.levels)?,
    )?;
    plan.tolerance = args.tolerance_pct / 100.0;
    if plan.presets.is_empty() {
        bail!(
            "no presets: name the presets to run (mxtune matrix PRESET…), give hosts their own (--host NAME=PRESET,…), or --resume a matrix in --out"
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &plan.presets {
        if !seen.insert(p) {
            bail!("preset {p} is listed twice; a matrix runs each preset once");
        }
    }
    super::run::check_presets(&plan)?;
    plan.seed = if args.no_shuffle {
        None
    } else {
        Some(args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        }))
    };
    let order = match plan.seed {
        Some(s) => shuffled(&plan.presets, s),
        None => plan.presets.clone(),
    };
    Ok(MatrixState::new(plan, order))
}

/// How a matrix run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixOutcome {
    /// Matrix id.
    pub matrix_id: String,
    /// The output directory (state, report, charts).
    pub out: PathBuf,
    /// The markdown report.
    pub report: PathBuf,
    /// Cancelled before every preset finished: resume with `--resume --out`.
    pub interrupted: bool,
    /// Every level of every preset passed.
    pub all_pass: bool,
}

/// Runs (or, with `args.resume`, resumes) the matrix of `args` until it is done or `watch`
/// is cancelled, writing the state after every change and the report at the end. Progress
/// goes to `progress`; nothing is printed and no signal handler is installed (the caller
/// owns those: the CLI's Ctrl-C, the panel's Esc).
pub async fn execute(
    args: &MatrixArgs,
    progress: &Progress,
    watch: &CancelWatch,
) -> Result<MatrixOutcome> {
    let mut state = if args.resume {
        let mut s = MatrixState::load(&args.out)?;
        s.resumes += 1;
        for p in s
            .order
            .iter_mut()
            .filter(|p| p.status == PresetStatus::Running)
        {
            // The process that ran it died without saying so.
            p.status = PresetStatus::Interrupted;
        }
        s
    } else {
        new_state(args)?
    };
    state.save(&args.out)?;
    let out = args.out.clone();
    progress.emit(MatrixEvent::Planned {
        matrix_id: state.matrix_id.clone(),
        order: state.order.iter().map(|p| p.name.clone()).collect(),
        seed: state.plan.seed,
        state: MatrixState::path(&out),
    });
    let interrupted = run_all(&mut state, &out, watch, progress).await?;
    let report = super::report::write(&state, &out)?;
    progress.emit(MatrixEvent::ReportWritten(report.clone()));
    let all_pass = state.order.iter().all(|p| {
        p.status == PresetStatus::Done
            && p.levels
                .iter()
                .all(|l| !matches!(l.verdict.as_str(), "fail" | "invalid"))
    });
    Ok(MatrixOutcome {
        matrix_id: state.matrix_id.clone(),
        out,
        report,
        interrupted,
        all_pass,
    })
}

async fn matrix_async(args: MatrixArgs) -> Result<ExitCode> {
    let (cancel, watch) = Cancel::new();
    install_signals(cancel.clone());
    let outcome = execute(&args, &Progress::cli(), &watch).await?;
    drop(cancel);
    if outcome.interrupted {
        crate::outln!(
            "interrupted: resume with `mxtune matrix --resume --out {}`",
            outcome.out.display()
        );
        return Ok(ExitCode::from(130));
    }
    Ok(if outcome.all_pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs presets from the first unfinished one; true when interrupted. With hosts, each
/// host runs its own presets, one at a time, while the other hosts run theirs.
async fn run_all(
    state: &mut MatrixState,
    out: &std::path::Path,
    watch: &CancelWatch,
    progress: &Progress,
) -> Result<bool> {
    if state.plan.hosts.is_empty() {
        return run_queue(state, out, watch, progress).await;
    }
    let shared = std::sync::Arc::new(std::sync::Mutex::new(state.clone()));
    let queues = state.plan.hosts.clone().into_iter().map(|host| {
        let shared = shared.clone();
        async move { run_host(&shared, &host, out, watch, progress).await }
    });
    let results = futures::future::join_all(queues).await;
    *state = shared
        .lock()
        .map(|s| s.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    let mut interrupted = false;
    for r in results {
        interrupted |= r?;
    }
    Ok(interrupted || (watch.is_cancelled() && !state.complete()))
}

/// One host's share of a matrix spread over hosts; true when interrupted.
async fn run_host(
    shared: &std::sync::Mutex<MatrixState>,
    host: &str,
    out: &std::path::Path,
    watch: &CancelWatch,
    progress: &Progress,
) -> Result<bool> {
    let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
    let (plan, tags) = {
        let s = lock();
        (
            s.plan.clone(),
            vec![format!("matrix:{}", s.matrix_id), format!("host:{host}")],
        )
    };
    loop {
        if watch.is_cancelled() {
            return Ok(true);
        }
        let (i, name, total) = {
            let mut s = lock();
            let Some(i) = s.next_unfinished_on(Some(host)) else {
                return Ok(false);
            };
            s.order[i].status = PresetStatus::Running;
            s.order[i].attempts += 1;
            s.save(out)?;
            (i, s.order[i].name.clone(), s.order.len())
        };
        progress.emit(MatrixEvent::PresetStarted {
            name: name.clone(),
            index: i,
            total,
        });
        let o = super::run::run_preset_on(&plan, &name, Some(host), &tags, watch, progress).await;
        let interrupted = o.status == PresetStatus::Interrupted;
        let (status, record, levels) = {
            let mut s = lock();
            let p = &mut s.order[i];
            p.finish(o);
            let done = (p.status, p.record.clone(), p.levels.clone());
            s.save(out)?;
            done
        };
        progress.emit(MatrixEvent::PresetFinished {
            name,
            status,
            record,
            levels,
        });
        if interrupted {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs this machine's presets one after the other; true when interrupted.
async fn run_queue(
    state: &mut MatrixState,
    out: &std::path::Path,
    watch: &CancelWatch,
    progress: &Progress,
) -> Result<bool> {
    let tags = vec![format!("matrix:{}", state.matrix_id)];
    while let Some(i) = state.next_unfinished() {
        if watch.is_cancelled() {
            return Ok(true);
        }
        let name = state.order[i].name.clone();
        state.order[i].status = PresetStatus::Running;
        state.order[i].attempts += 1;
        state.save(out)?;
        progress.emit(MatrixEvent::PresetStarted {
            name: name.clone(),
            index: i,
            total: state.order.len(),
        });
        let o = super::run::run_preset(&state.plan, &name, &tags, watch, progress).await;
        state.order[i].finish(o);
        state.save(out)?;
        let p = &state.order[i];
        progress.emit(MatrixEvent::PresetFinished {
            name: name.clone(),
            status: p.status,
            record: p.record.clone(),
            levels: p.levels.clone(),
        });
        if p.status == PresetStatus::Interrupted {
            return Ok(true);
        }
        // Let the port and memory of the stopped target free up before the next launch.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(watch.is_cancelled() && !state.complete())
}

/// `mxtune ab`. Exit: 0 done, 1 a launch failed, 130 interrupted.
pub fn ab(args: AbArgs) -> Result<ExitCode> {
    tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(async {
            let (cancel, watch) = Cancel::new();
            install_signals(cancel.clone());
            let outcome = ab::execute(&args, &Progress::cli(), &watch).await?;
            drop(cancel);
            crate::out!("{}", outcome.markdown);
            Ok(if outcome.interrupted {
                ExitCode::from(130)
            } else if outcome.valid_rounds == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        })
}

//! `mxtune bench`: run levels against a server headless, print a llama-bench-like table or
//! JSON, show a progress bar on stderr (hidden when stderr is not a terminal).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::mpsc;

use super::client::{BenchClient, ClientConfig, Endpoint};
use super::levels::{
    CorrectnessPlan, Level, LevelReport, MemoryProbe, StressPlan, performance_report,
};
use super::workload::{
    BenchEvent, Cancel, LatencyMode, PointResult, Runner, Workload, WorkloadResult, point_label,
    pp_label, tg_label,
};
use crate::record::schema::{LatencyStats, Stats, WorkloadParams};
use crate::record::{RunHandle, RunStatus, RunStore};
use crate::vocab::TargetKind;

/// A target this process launched and now benchmarks (the panel's launch).
#[derive(Debug, Clone, PartialEq)]
pub struct ServedBy {
    /// Base URL the target answers on (the bench's `--url` must be this one).
    pub url: String,
    /// docker or engine (or attach).
    pub kind: TargetKind,
    /// Preset the flag set came from.
    pub preset: Option<String>,
    /// The flag set as launched (serialized like `FlagSet`).
    pub flags: serde_json::Value,
    /// The launch as started.
    pub launch: Option<crate::vocab::LaunchSpec>,
    /// Run id of the launch (its log is `<id>.target.log` in the runs directory).
    pub launch_run: Option<String>,
}

/// Arguments of `mxtune bench`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct BenchArgs {
    /// Server base URL, e.g. http://127.0.0.1:8000 (`/v1` is added when missing). With
    /// `--host`, the address as seen on that host.
    #[arg(long)]
    pub url: String,
    /// The server runs on this host of ~/.config/mxtune/hosts.toml: `--url` is its address
    /// as seen there, reached through an SSH forward that is closed when the bench ends;
    /// records are tagged `host:NAME`.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Model name to send; default: the first id of GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token for servers that want one.
    #[arg(long, env = "MXTUNE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Endpoint to stream from.
    #[arg(long, value_enum, default_value = "chat")]
    pub endpoint: Endpoint,
    /// Prompt lengths, tokens.
    #[arg(long, num_args = 1.., default_values_t = [2048])]
    pub pp: Vec<u32>,
    /// Generation lengths, tokens.
    #[arg(long, num_args = 1.., default_values_t = [32])]
    pub tg: Vec<u32>,
    /// Context depths filled before the prompt, tokens.
    #[arg(long, num_args = 1.., default_values_t = [0])]
    pub depth: Vec<u32>,
    /// Concurrent requests per batch.
    #[arg(long, num_args = 1.., default_values_t = [1])]
    pub concurrency: Vec<u32>,
    /// Measured runs per point.
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// Unmeasured warm-up runs per point.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Make every prompt unique so prefix caching cannot help.
    #[arg(long)]
    pub no_cache: bool,
    /// How the latency subtracted from ttfr is measured.
    #[arg(long, value_enum, default_value = "api")]
    pub latency_mode: LatencyMode,
    /// Levels to run, in order.
    #[arg(long, value_enum, num_args = 1.., default_values_t = [Level::Performance])]
    pub level: Vec<Level>,
    /// Send prompts as token ids (completions endpoint only).
    #[arg(long)]
    pub token_ids: bool,
    /// Do not send min_tokens/ignore_eos (for servers that reject them); early ends are then
    /// not flagged.
    #[arg(long)]
    pub no_exact: bool,
    /// Ask for logprobs in the performance grid (exact per-chunk counts; slower servers).
    #[arg(long)]
    pub logprobs: bool,
    /// TCP connect timeout, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Longest silence allowed while reading a response, seconds (no total deadline).
    #[arg(long, default_value_t = 120.0)]
    pub read_timeout: f64,
    /// Print machine-readable JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Append one served row per measured point to this JSON array file (the schema of
    /// docs/perf/h100.json: `kind: served`, output tok/s over all streams, TPOT and TTFT).
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<std::path::PathBuf>,
    /// Model name in the --json-out rows (default: the served model's name without a
    /// leading `synthetic-`, e.g. gpt-oss-120b).
    #[arg(long, value_name = "NAME", requires = "json_out")]
    pub perf_model: Option<String>,
    /// Weight layout in the --json-out rows: released, mxfp4-qkv-o or all-mxfp4.
    #[arg(long, value_name = "LAYOUT", default_value = "released", requires = "json_out",
          value_parser = ["released", "mxfp4-qkv-o", "all-mxfp4"])]
    pub perf_layout: String,
    /// Save a run record (status kept current as points finish; `aborted` on Ctrl-C).
    #[arg(long)]
    pub record: bool,
    /// Runs directory for --record.
    #[arg(long, value_name = "DIR", env = "MXTUNE_RUNS_DIR", default_value = crate::record::store::DEFAULT_RUNS_DIR)]
    pub runs_dir: std::path::PathBuf,
    /// The launch that serves `url`, when the panel started it: the record then carries
    /// its target kind, preset, flag set and launch instead of `attach`.
    #[arg(skip)]
    pub served_by: Option<Box<ServedBy>>,
}

impl BenchArgs {
    /// The grid these options describe.
    pub fn workload(&self) -> Workload {
        Workload {
            pp: self.pp.clone(),
            tg: self.tg.clone(),
            depth: self.depth.clone(),
            concurrency: self.concurrency.clone(),
            runs: self.runs,
            warmup: self.warmup,
            no_cache: self.no_cache,
            latency_mode: self.latency_mode,
            endpoint: self.endpoint,
            token_ids: self.token_ids,
            exact_output: !self.no_exact,
            logprobs: self.logprobs,
        }
    }
}

/// Run `mxtune bench`. Exit code: 0 all levels passed, 1 a level failed, 130 interrupted.
pub fn run(args: BenchArgs) -> Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(run_async(args))
}

/// What [`execute`] produced: the grid, the level verdicts, and the record it kept.
#[derive(Debug, Clone)]
pub struct BenchOutcome {
    /// Model name sent.
    pub model: String,
    /// The performance grid, when that level ran.
    pub grid: Option<WorkloadResult>,
    /// Level verdicts, in the order run.
    pub levels: Vec<LevelReport>,
    /// Cancelled before the end.
    pub aborted: bool,
    /// The run record's file (with `--record`).
    pub record: Option<std::path::PathBuf>,
    /// The run record could not be updated; why (the run itself went on).
    pub record_errors: Vec<String>,
    /// Things skipped on the way (e.g. the stress memory check without a GPU).
    pub notes: Vec<String>,
    /// The host the server ran on (`--host`), none for a URL reached from here.
    pub host: Option<String>,
}

impl BenchOutcome {
    /// Whether every level passed.
    pub fn passed(&self) -> bool {
        self.levels.iter().all(|l| l.passed)
    }
}

impl BenchArgs {
    /// `mxtune bench --url URL` with every other option at its command-line default (the
    /// panel starts from these, so both run the same workload unless told otherwise).
    pub fn defaults(url: &str) -> Result<Self> {
        #[derive(clap::Parser)]
        struct Cmd {
            #[command(flatten)]
            args: BenchArgs,
        }
        let cmd = <Cmd as clap::Parser>::try_parse_from(["bench", "--url", url])
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(cmd.args)
    }

    /// Check the options before anything is sent: the grid (when the performance level
    /// runs) and the timeouts. Errors name the option at fault.
    pub fn validate(&self) -> Result<()> {
        if self.level.contains(&Level::Performance) {
            self.workload().validate()?;
        }
        for (name, secs) in [
            ("--connect-timeout", self.connect_timeout),
            ("--read-timeout", self.read_timeout),
        ] {
            if !(secs.is_finite() && secs > 0.0) {
                anyhow::bail!("{name} must be a positive number of seconds, got {secs}");
            }
        }
        Ok(())
    }
}

async fn run_async(args: BenchArgs) -> Result<ExitCode> {
    let (cancel, watch) = Cancel::new();
    let (tx, rx) = mpsc::unbounded_channel();
    let progress = tokio::spawn(show_progress(rx));
    let signal_cancel = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            signal_cancel.cancel_because("interrupted (Ctrl-C)");
        }
    });
    if let Some(path) = &args.json_out {
        crate::record::perfrows::check_file(path)?;
    }
    let outcome = execute(&args, Some(tx), watch).await;
    // The progress task ends when every sender is gone; wait so the bar is cleared first.
    let _ = progress.await;
    drop(cancel);
    let out = outcome?;
    for n in &out.notes {
        crate::errln!("mxtune bench: {n}");
    }
    if let Some(path) = &out.record {
        crate::errln!("run record: {}", path.display());
    }
    for e in &out.record_errors {
        crate::errln!("mxtune: warning: run record not updated: {e}");
    }

    if let (Some(path), Some(g)) = (&args.json_out, &out.grid) {
        let rows = served_rows(&args, &out.model, g);
        crate::record::perfrows::append(path, &rows)?;
        crate::errln!(
            "appended {} served row(s) to {}",
            rows.len(),
            path.display()
        );
    }
    if args.json {
        let report = JsonReport::new(
            &out.model,
            &args.url,
            out.host.as_deref(),
            out.grid.as_ref(),
            &out.levels,
            out.aborted,
        );
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&report).context("serializing the JSON report")?
        );
    } else {
        if let Some(g) = &out.grid {
            crate::out!("{}", render_tables(g));
        }
        for l in &out.levels {
            crate::out!("{}", render_level(l));
        }
        if out.aborted {
            crate::outln!("interrupted: results above are partial");
        }
    }
    Ok(if out.aborted {
        ExitCode::from(130)
    } else if out.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Run the levels of `args` against its server: the one code path of `mxtune bench` and
/// the panel's Bench screen. Progress goes to `events`; a cancel through `cancel` stops at
/// once, keeps the finished points, and (with `--record`) finishes the run record as
/// `aborted` with the cancel's reason before this returns.
pub async fn execute(
    args: &BenchArgs,
    events: Option<super::workload::Events>,
    cancel: super::workload::CancelWatch,
) -> Result<BenchOutcome> {
    args.validate()?;
    // With --host, the server is reached through an SSH forward to its address as seen on
    // that host; the tunnel lives until this function returns (also on error or cancel).
    let tunnel = match &args.host {
        Some(name) => Some(open_forward(&crate::hosts::find(name)?, &args.url).await?),
        None => None,
    };
    let url = tunnel
        .as_ref()
        .map_or(args.url.clone(), |(_, local)| local.clone());
    let at = match &args.host {
        Some(name) => format!("{} on host {name}", args.url),
        None => args.url.clone(),
    };
    let workload = args.workload();
    let mut config = ClientConfig::new(&url);
    config.api_key = args.api_key.clone();
    config.connect_timeout = Duration::from_secs_f64(args.connect_timeout);
    config.read_timeout = Duration::from_secs_f64(args.read_timeout);
    let client = BenchClient::new(&config)?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client
            .models()
            .await
            .with_context(|| format!("finding the model at {at} (or pass --model)"))?
            .into_iter()
            .next()
            .with_context(|| match &args.host {
                Some(_) => format!("{at} lists no models; pass --model"),
                None => format!("{} lists no models; pass --model", client.base_url()),
            })?,
    };
    let mut record = if args.record {
        Some(start_record(args, &model)?)
    } else {
        None
    };
    let mut record_errors: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    if let (Some(name), Some((_, local))) = (&args.host, &tunnel) {
        notes.push(format!(
            "benchmarked {} on host {name} through an SSH forward at {local} (closed now)",
            args.url
        ));
    }
    let runner = Runner {
        client,
        model: model.clone(),
        events,
        cancel,
    };

    let mut levels = Vec::new();
    let mut grid = None;
    for level in &args.level {
        if runner.cancel.is_cancelled() {
            break;
        }
        match level {
            Level::Correctness => {
                let plan = CorrectnessPlan {
                    endpoint: args.endpoint,
                    ..CorrectnessPlan::default()
                };
                levels.push(runner.correctness(&plan).await);
            }
            Level::Stress => {
                let plan = StressPlan {
                    endpoint: args.endpoint,
                    ..StressPlan::default()
                };
                // The memory check reads the GPU through the monitor; without one it is
                // skipped and the level report says why.
                let probe = crate::monitor::probe::GpuMemoryProbe::detect();
                if let Err(e) = &probe {
                    notes.push(format!("stress memory check skipped: {e:#}"));
                }
                let probe = probe.ok();
                levels.push(
                    runner
                        .stress(&plan, probe.as_ref().map(|p| p as &dyn MemoryProbe))
                        .await,
                );
            }
            Level::Performance => {
                let result = runner
                    .run(&workload, |point| {
                        if let Some(handle) = record.as_mut() {
                            let entry = point.stats.record.clone();
                            let methods = point.stats.count_methods.join(",");
                            if let Err(e) = handle.update(|r| {
                                r.results.push(entry);
                                if let Some(w) = r.workload.as_mut() {
                                    w.token_count_method = Some(methods);
                                }
                            }) {
                                record_errors.push(format!("{e:#}"));
                            }
                        }
                    })
                    .await?;
                levels.push(performance_report(&result));
                grid = Some(result);
            }
        }
    }
    let aborted = runner.cancel.is_cancelled();
    let abort_reason = runner.cancel.reason();
    drop(runner);
    if let Some(handle) = record.as_mut() {
        let failed: Vec<String> = levels
            .iter()
            .filter(|l| !l.passed)
            .flat_map(|l| {
                l.reasons()
                    .into_iter()
                    .map(move |r| format!("{:?}: {r}", l.level).to_lowercase())
            })
            .collect();
        let (status, reason) = if aborted {
            (
                RunStatus::Aborted,
                Some(abort_reason.unwrap_or_else(|| "interrupted".to_owned())),
            )
        } else if !failed.is_empty() {
            (RunStatus::Failed, Some(failed.join("; ")))
        } else {
            (RunStatus::Completed, None)
        };
        if let Err(e) = handle.finish(status, reason) {
            record_errors.push(format!("{e:#}"));
        }
    }
    // Closed before the outcome is reported (and on every early return above).
    drop(tunnel);
    Ok(BenchOutcome {
        model,
        grid,
        levels,
        aborted,
        record: record.as_ref().map(|h| h.path().to_path_buf()),
        record_errors,
        notes,
        host: args.host.clone(),
    })
}

/// The address and port a `--url` names (as seen on the host of `--host`), and the same URL
/// with `127.0.0.1:local` in their place. Only http: a certificate would not match the
/// forward's address.
pub fn forward_target(url: &str, local: u16) -> Result<((String, u16), String)> {
    let mut parsed = reqwest::Url::parse(url).with_context(|| {
        format!("--url {url:?} is not a URL: with --host give the server's address as seen on that host, e.g. http://127.0.0.1:8000")
    })?;
    if parsed.scheme() != "http" {
        anyhow::bail!(
            "--url {url}: with --host the URL must be http:// (the SSH forward ends on 127.0.0.1 here, which a TLS certificate would not name)"
        );
    }
    let addr = match parsed.host_str() {
        // An IPv6 address comes in brackets; the tunnel adds its own.
        Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
        _ => anyhow::bail!("--url {url} names no host: give e.g. http://127.0.0.1:8000"),
    };
    let port = parsed.port_or_known_default().unwrap_or(80);
    parsed
        .set_host(Some("127.0.0.1"))
        .map_err(|e| anyhow::anyhow!("rewriting --url {url} for the SSH forward: {e}"))?;
    parsed
        .set_port(Some(local))
        .map_err(|()| anyhow::anyhow!("rewriting --url {url} for the SSH forward"))?;
    Ok(((addr, port), parsed.to_string()))
}

/// Opens an SSH forward from a local port to `url`'s address and port as seen on `host`,
/// and returns it with the local URL to benchmark instead (closed when the tunnel is dropped).
async fn open_forward(
    host: &crate::hosts::Host,
    url: &str,
) -> Result<(crate::hosts::ssh::Tunnel, String)> {
    let ((addr, port), _) = forward_target(url, 1)?;
    let tunnel = crate::hosts::ssh::Tunnel::open(host, Some((&addr, port)))
        .await
        .with_context(|| format!("forwarding {url} of host {} over SSH", host.name))?;
    let (local, _) = tunnel
        .port
        .context("the SSH tunnel has no forwarded port")?;
    let (_, local_url) = forward_target(url, local)?;
    Ok((tunnel, local_url))
}

/// A `running` record for an attached server, written before the first request.
fn start_record(args: &BenchArgs, model: &str) -> Result<RunHandle> {
    let served = args.served_by.as_ref().filter(|s| {
        s.url.trim_end_matches('/').trim_end_matches("/v1")
            == args.url.trim_end_matches('/').trim_end_matches("/v1")
    });
    let mut r = match served {
        Some(s) => {
            let mut r = crate::record::begin(s.kind, s.preset.clone(), &[]);
            r.target.flags = s.flags.clone();
            r.target.launch = s.launch.clone();
            r.target.launch_run = s.launch_run.clone();
            r
        }
        None => crate::record::begin(TargetKind::Attach, None, &[]),
    };
    // The server's URL as given (with --host: as seen on that host, not the local forward).
    r.target.url = Some(super::client::api_base(&args.url));
    if let Some(host) = &args.host {
        r.identity.tags.push(format!("host:{host}"));
    }
    r.target.model = Some(model.to_owned());
    let levels: Vec<String> = args
        .level
        .iter()
        .map(|l| format!("{l:?}").to_lowercase())
        .collect();
    r.workload = Some(WorkloadParams {
        endpoint: Some(format!("{:?}", args.endpoint).to_lowercase()),
        pp: args.pp.clone(),
        tg: args.tg.clone(),
        depth: args.depth.clone(),
        concurrency: args.concurrency.clone(),
        runs: args.runs,
        warmup: args.warmup,
        tokenizer: Some("o200k_base".to_owned()),
        no_cache: args.no_cache,
        latency_mode: Some(format!("{:?}", args.latency_mode).to_lowercase()),
        level: Some(levels.join(",")),
        ..WorkloadParams::default()
    });
    RunStore::new(&args.runs_dir).create(r)
}

async fn show_progress(mut rx: mpsc::UnboundedReceiver<BenchEvent>) {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(None, target);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    let mut failed = 0u64;
    while let Some(event) = rx.recv().await {
        match event {
            BenchEvent::Started { requests, .. } => bar.set_length(requests),
            BenchEvent::Latency { seconds, .. } => {
                bar.set_message(format!("latency {:.1} ms", seconds * 1e3))
            }
            BenchEvent::PointStarted { point, .. } => bar.set_message(format!(
                "{} c{}{}",
                point_label(&point),
                point.concurrency,
                if failed > 0 {
                    format!(" ({failed} failed)")
                } else {
                    String::new()
                }
            )),
            BenchEvent::RequestDone { error, .. } => {
                if error.as_ref().is_some_and(|e| e.is_fatal()) {
                    failed += 1;
                }
                bar.inc(1);
            }
            BenchEvent::LevelDone(report) => bar.println(format!(
                "{:?} level: {}",
                report.level,
                if report.passed { "pass" } else { "FAIL" }
            )),
            BenchEvent::PointDone { .. } | BenchEvent::Finished { .. } => {}
        }
    }
    bar.finish_and_clear();
}

fn pm(s: Option<Stats>, k: f64) -> String {
    match s {
        Some(s) => format!("{:.2} ± {:.2}", s.mean * k, s.std * k),
        None => "-".to_owned(),
    }
}

fn pct(s: Option<LatencyStats>) -> String {
    match s {
        Some(s) => format!("{:.1} / {:.1} / {:.1}", s.p50, s.p90, s.p99),
        None => "-".to_owned(),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::from("|");
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w - c.chars().count();
            // First two columns (names) left-aligned, figures right-aligned, as llama-bench.
            if i < 2 {
                s.push_str(&format!(" {c}{} |", " ".repeat(pad)));
            } else {
                s.push_str(&format!(" {}{c} |", " ".repeat(pad)));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    let mut sep = String::from("|");
    for (i, w) in widths.iter().enumerate() {
        sep.push_str(if i < 2 { " :" } else { " " });
        sep.push_str(&"-".repeat(w.saturating_sub(1)));
        sep.push_str(if i < 2 { " |" } else { ": |" });
    }
    out.push_str(&sep);
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out
}

/// The llama-bench-like table (pp and tg rows with ttfr / est_ppt / e2e_ttft) and the
/// serving table (vllm bench serve figures) of a grid.
pub fn render_tables(g: &WorkloadResult) -> String {
    let mut rows = Vec::new();
    let mut serving = Vec::new();
    let mut methods: Vec<String> = Vec::new();
    for p in &g.points {
        let r = &p.stats.record;
        let c = p.point.concurrency;
        // At concurrency > 1 the batch totals are what llama-benchy prints.
        let (pp, tg) = if c > 1 {
            (p.stats.pp_total_tps, r.total_tg_tps)
        } else {
            (r.pp_tps, r.tg_tps)
        };
        rows.push(vec![
            g.model.clone(),
            pp_label(&p.point),
            c.to_string(),
            pm(pp, 1.0),
            pm(r.ttfr_ms, 1.0),
            pm(r.est_ppt_ms, 1.0),
            pm(r.e2e_ttft_ms, 1.0),
        ]);
        rows.push(vec![
            g.model.clone(),
            tg_label(&p.point),
            c.to_string(),
            pm(tg, 1.0),
            String::new(),
            String::new(),
            String::new(),
        ]);
        serving.push(vec![
            point_label(&p.point),
            c.to_string(),
            pct(r.latency.ttft_ms),
            pct(r.latency.tpot_ms),
            pct(r.latency.itl_ms),
            pct(r.latency.e2el_ms),
            opt(r.request_throughput),
            opt(r.output_throughput),
            opt(r.total_token_throughput),
            format!("{}/{}/{}", r.requests - r.errors, r.errors, r.early_ended),
        ]);
        for m in &p.stats.count_methods {
            if !methods.contains(m) {
                methods.push(m.clone());
            }
        }
    }
    let mut out = table(
        &[
            "model",
            "test",
            "c",
            "t/s",
            "ttfr (ms)",
            "est_ppt (ms)",
            "e2e_ttft (ms)",
        ],
        &rows,
    );
    out.push('\n');
    out.push_str(&table(
        &[
            "point",
            "c",
            "TTFT ms p50/p90/p99",
            "TPOT ms p50/p90/p99",
            "ITL ms p50/p90/p99",
            "E2EL ms p50/p90/p99",
            "req/s",
            "out t/s",
            "total t/s",
            "ok/err/early",
        ],
        &serving,
    ));
    out.push_str(&format!(
        "\nlatency ({}): {:.2} ms; tokens counted by: {}; t/s at c>1 is the batch total\n",
        format!("{:?}", g.workload.latency_mode).to_lowercase(),
        g.latency_s * 1e3,
        if methods.is_empty() {
            "-".to_owned()
        } else {
            methods.join(", ")
        }
    ));
    out.push_str(&render_server_prompt_tokens(g));
    for p in &g.points {
        for (message, n) in &p.errors {
            out.push_str(&format!(
                "{} c{}: {n}× {message}\n",
                pp_label(&p.point),
                p.point.concurrency
            ));
        }
    }
    for w in &g.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

/// Prompt tokens sent against those the server counted (`usage.prompt_tokens`), and pp t/s by
/// the server's count, one line per point that reported usage (nothing when none did).
pub fn render_server_prompt_tokens(g: &WorkloadResult) -> String {
    let mut lines = String::new();
    for p in &g.points {
        let r = &p.stats.record;
        let Some(counted) = r.server_prompt_tokens else {
            continue;
        };
        let sent = f64::from(p.point.pp) + f64::from(p.point.depth);
        let counted_text = if counted.std > 0.0 {
            format!("{:.1} ± {:.1}", counted.mean, counted.std)
        } else {
            format!("{:.0}", counted.mean)
        };
        let server_pp = if p.point.concurrency > 1 {
            p.stats.server_pp_total_tps
        } else {
            r.server_pp_tps
        };
        lines.push_str(&format!(
            "  {} c{}: {sent:.0} → {counted_text} ({:+.0}); pp t/s by the server's count {}\n",
            pp_label(&p.point),
            p.point.concurrency,
            counted.mean - sent,
            pm(server_pp, 1.0)
        ));
    }
    if lines.is_empty() {
        return lines;
    }
    format!(
        "prompt tokens sent → counted by the server (usage.prompt_tokens; the difference is \
         the chat template):\n{lines}"
    )
}

/// A level's verdict and its checks, one per line.
pub fn render_level(l: &LevelReport) -> String {
    let mut out = format!(
        "\n{:?} level: {}\n",
        l.level,
        if l.passed { "PASS" } else { "FAIL" }
    );
    for c in &l.checks {
        out.push_str(&format!(
            "  [{}] {}: {}\n",
            if c.skipped {
                "skip"
            } else if c.passed {
                "ok"
            } else {
                "FAIL"
            },
            c.name,
            c.detail
        ));
    }
    out
}

/// The `--json-out` rows of a grid: one per point that measured its batch throughput
/// (points cut short by an interrupt or with failed requests are left out: a partial figure
/// is not a figure).
pub fn served_rows(
    args: &BenchArgs,
    served_model: &str,
    g: &WorkloadResult,
) -> Vec<crate::record::perfrows::PerfRow> {
    use crate::record::perfrows::{PerfRow, ServedPoint};
    let model = args.perf_model.clone().unwrap_or_else(|| {
        served_model
            .strip_prefix("synthetic-")
            .unwrap_or(served_model)
            .to_string()
    });
    g.points
        .iter()
        .filter(|p| !p.partial && p.stats.record.errors == 0)
        .filter_map(|p| {
            let r = &p.stats.record;
            let tok_s = r.total_tg_tps?.mean;
            let tpot = r.latency.tpot_ms.as_ref();
            Some(PerfRow::served(
                &model,
                &args.perf_layout,
                &ServedPoint {
                    pp: p.point.pp,
                    tg: p.point.tg,
                    depth: p.point.depth,
                    concurrency: p.point.concurrency,
                    tok_s,
                    tpot_p50_ms: tpot.map(|t| t.p50),
                    tpot_p99_ms: tpot.map(|t| t.p99),
                    ttft_p50_ms: r.latency.ttft_ms.as_ref().map(|t| t.p50),
                },
            ))
        })
        .collect()
}

/// Machine output of `mxtune bench --json`.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// Model name sent.
    pub model: &'a str,
    /// Server URL given.
    pub url: &'a str,
    /// The host the server ran on (`--host`; `url` is as seen there); absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<&'a str>,
    /// Latency subtracted from ttfr, ms (performance level only).
    pub latency_ms: Option<f64>,
    /// One entry per measured point.
    pub points: Vec<JsonPoint<'a>>,
    /// Level verdicts.
    pub levels: &'a [LevelReport],
    /// Interrupted before the end.
    pub aborted: bool,
    /// Problems that did not stop the run.
    pub warnings: &'a [String],
}

/// One point of the JSON output.
#[derive(Debug, Serialize)]
pub struct JsonPoint<'a> {
    /// pp, tg, depth, concurrency.
    pub point: crate::record::schema::WorkloadPoint,
    /// The record's figures (mean/std/n of pp and tg t/s, latencies, throughputs, counts).
    #[serde(flatten)]
    pub figures: JsonFigures<'a>,
    /// Per-batch total prompt throughput.
    pub pp_total_tps: Option<Stats>,
    /// Prompt tokens sent per request (depth + pp, as tokenized here).
    pub prompt_tokens_sent: u32,
    /// The same by the server's prompt token counts.
    pub server_pp_total_tps: Option<Stats>,
    /// How tokens were counted.
    pub count_methods: &'a [String],
    /// Distinct error messages with counts.
    pub error_reasons: &'a [(String, usize)],
}

/// The record point's figures without the raw timings (those go into the run record).
#[derive(Debug, Serialize)]
pub struct JsonFigures<'a> {
    /// Per-request pp t/s.
    pub pp_tps: Option<Stats>,
    /// Prompt tokens as the server counted them (`usage.prompt_tokens`).
    pub server_prompt_tokens: Option<Stats>,
    /// Per-request pp t/s by the server's count.
    pub server_pp_tps: Option<Stats>,
    /// Per-request tg t/s.
    pub tg_tps: Option<Stats>,
    /// Per-batch total tg t/s.
    pub total_tg_tps: Option<Stats>,
    /// ttfr, ms.
    pub ttfr_ms: Option<Stats>,
    /// est_ppt, ms.
    pub est_ppt_ms: Option<Stats>,
    /// e2e_ttft, ms.
    pub e2e_ttft_ms: Option<Stats>,
    /// TTFT/TPOT/ITL/E2EL distributions, ms.
    pub latency: &'a crate::record::schema::Latency,
    /// Requests per second.
    pub request_throughput: Option<f64>,
    /// Output tokens per second.
    pub output_throughput: Option<f64>,
    /// Input + output tokens per second.
    pub total_token_throughput: Option<f64>,
    /// Measured requests.
    pub requests: u32,
    /// Failed requests.
    pub errors: u32,
    /// Responses shorter than asked.
    pub early_ended: u32,
    /// The point was cut short by an interrupt.
    pub partial: bool,
}

impl<'a> JsonReport<'a> {
    fn new(
        model: &'a str,
        url: &'a str,
        host: Option<&'a str>,
        grid: Option<&'a WorkloadResult>,
        levels: &'a [LevelReport],
        aborted: bool,
    ) -> Self {
        Self {
            model,
            url,
            host,
            latency_ms: grid.map(|g| g.latency_s * 1e3),
            points: grid
                .map(|g| g.points.iter().map(json_point).collect())
                .unwrap_or_default(),
            levels,
            aborted,
            warnings: grid.map_or(&[], |g| g.warnings.as_slice()),
        }
    }
}

fn json_point(p: &PointResult) -> JsonPoint<'_> {
    let r = &p.stats.record;
    JsonPoint {
        point: p.point,
        figures: JsonFigures {
            pp_tps: r.pp_tps,
            server_prompt_tokens: r.server_prompt_tokens,
            server_pp_tps: r.server_pp_tps,
            tg_tps: r.tg_tps,
            total_tg_tps: r.total_tg_tps,
            ttfr_ms: r.ttfr_ms,
            est_ppt_ms: r.est_ppt_ms,
            e2e_ttft_ms: r.e2e_ttft_ms,
            latency: &r.latency,
            request_throughput: r.request_throughput,
            output_throughput: r.output_throughput,
            total_token_throughput: r.total_token_throughput,
            requests: r.requests,
            errors: r.errors,
            early_ended: r.early_ended,
            partial: p.partial,
        },
        pp_total_tps: p.stats.pp_total_tps,
        prompt_tokens_sent: p.point.pp.saturating_add(p.point.depth),
        server_pp_total_tps: p.stats.server_pp_total_tps,
        count_methods: &p.stats.count_methods,
        error_reasons: &p.errors,
    }
}

#[cfg(test)]
mod tests {
    use super::forward_target;

    #[test]
    fn forward_target_takes_the_address_on_the_host_and_keeps_the_path() {
        let ((addr, port), local) = forward_target("http://127.0.0.1:8000", 40001).unwrap();
        assert_eq!((addr.as_str(), port), ("127.0.0.1", 8000));
        assert_eq!(local, "http://127.0.0.1:40001/");
        let ((addr, port), local) = forward_target("http://gpu-box/v1", 40002).unwrap();
        assert_eq!((addr.as_str(), port), ("gpu-box", 80));
        assert_eq!(local, "http://127.0.0.1:40002/v1");
        let ((addr, port), _) = forward_target("http://[::1]:9000", 40003).unwrap();
        assert_eq!((addr.as_str(), port), ("::1", 9000));
        let e = forward_target("https://10.0.0.2:8000", 1).unwrap_err();
        assert!(format!("{e}").contains("must be http://"), "{e}");
        let e = forward_target("127.0.0.1:8000", 1).unwrap_err();
        assert!(
            format!("{e:#}").contains("e.g. http://127.0.0.1:8000"),
            "{e:#}"
        );
    }
}

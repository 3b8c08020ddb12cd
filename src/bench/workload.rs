//! The pp × tg × depth × concurrency grid: warm-up, latency probe, measured runs, events.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::client::{BenchClient, Endpoint, PromptBody, RequestSpec};
use super::prompt::Prompt;
use super::stats::PointStats;
use super::trace::{RequestError, RequestTrace};
use crate::record::schema::WorkloadPoint as Point;

/// How the network/API latency subtracted from ttfr is measured (llama-benchy's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyMode {
    /// Mean of three `GET /v1/models` round trips.
    Api,
    /// Mean time to the first chunk of three 1-token requests (after one warm-up).
    Generation,
    /// Assume zero.
    None,
}

/// Smallest context (or prompt, at depth 0) that holds a `--no-cache` tag with room to spare.
pub const MIN_UNIQUE: u32 = 32;

/// The grid and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Prompt lengths, tokens.
    pub pp: Vec<u32>,
    /// Generation lengths, tokens.
    pub tg: Vec<u32>,
    /// Context depths filled before the prompt, tokens.
    pub depth: Vec<u32>,
    /// Concurrent requests per batch.
    pub concurrency: Vec<u32>,
    /// Measured runs (batches) per point.
    pub runs: u32,
    /// Unmeasured warm-up batches per point.
    pub warmup: u32,
    /// Make every request's prompt unique so prefix caching cannot help.
    pub no_cache: bool,
    /// Latency measurement.
    pub latency_mode: LatencyMode,
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Send token ids instead of text (completions endpoint only).
    pub token_ids: bool,
    /// Send `min_tokens` + `ignore_eos` so every request generates exactly `tg` tokens.
    pub exact_output: bool,
    /// Ask for logprobs (exact per-chunk token counts; costs the server some time).
    pub logprobs: bool,
}

impl Workload {
    /// Every point, depth-major (as llama-benchy orders them).
    pub fn points(&self) -> Vec<Point> {
        let mut out = Vec::new();
        for &depth in &self.depth {
            for &pp in &self.pp {
                for &tg in &self.tg {
                    for &concurrency in &self.concurrency {
                        out.push(Point {
                            pp,
                            tg,
                            depth,
                            concurrency,
                        });
                    }
                }
            }
        }
        out
    }

    /// Requests the whole grid sends (warm-up included, latency probes not).
    pub fn total_requests(&self) -> u64 {
        self.points()
            .iter()
            .map(|p| u64::from(p.concurrency) * u64::from(self.runs + self.warmup))
            .sum()
    }

    /// Reject grids that cannot run, naming the option at fault.
    pub fn validate(&self) -> Result<()> {
        for (name, values) in [
            ("--pp", &self.pp),
            ("--tg", &self.tg),
            ("--depth", &self.depth),
            ("--concurrency", &self.concurrency),
        ] {
            if values.is_empty() {
                anyhow::bail!("{name} needs at least one value");
            }
        }
        if self.concurrency.contains(&0) {
            anyhow::bail!("--concurrency values must be at least 1");
        }
        if self.tg.contains(&0) {
            anyhow::bail!("--tg values must be at least 1 (a request must generate a token)");
        }
        if self.pp.contains(&0) {
            anyhow::bail!("--pp values must be at least 1");
        }
        if self.runs == 0 {
            anyhow::bail!("--runs must be at least 1");
        }
        // The uniqueness tag ("[nonce point.run.slot] ") takes up to ~20 tokens of the budget.
        if self.no_cache {
            let room = |d: u32| {
                if d > 0 {
                    d
                } else {
                    self.pp.iter().copied().min().unwrap_or(0)
                }
            };
            if let Some(small) = self
                .depth
                .iter()
                .map(|&d| room(d))
                .find(|&n| n < MIN_UNIQUE)
            {
                anyhow::bail!(
                    "--no-cache needs at least {MIN_UNIQUE} tokens to hold its uniqueness tag \
                     (the depth, or --pp at depth 0); got {small}"
                );
            }
        }
        if self.token_ids && self.endpoint != Endpoint::Completions {
            anyhow::bail!("--token-ids needs --endpoint completions (chat takes messages)");
        }
        Ok(())
    }
}

/// llama-bench style name of the prompt test, e.g. `pp2048 @ d4096`.
pub fn pp_label(p: &Point) -> String {
    format!("pp{}{}", p.pp, at(p))
}

/// llama-bench style name of the generation test, e.g. `tg128 @ d4096`.
pub fn tg_label(p: &Point) -> String {
    format!("tg{}{}", p.tg, at(p))
}

/// Both tests of a point in one name, e.g. `pp2048 tg32 @ d4096`.
pub fn point_label(p: &Point) -> String {
    format!("pp{} tg{}{}", p.pp, p.tg, at(p))
}

fn at(p: &Point) -> String {
    if p.depth > 0 {
        format!(" @ d{}", p.depth)
    } else {
        String::new()
    }
}

/// A measured point: its statistics and the raw traces behind them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// The point.
    pub point: Point,
    /// Statistics over the measured runs.
    pub stats: PointStats,
    /// Raw traces, one batch per measured run.
    pub runs: Vec<Vec<RequestTrace>>,
    /// Distinct error reasons seen, with counts.
    pub errors: Vec<(String, usize)>,
    /// The point was cut short by an abort.
    pub partial: bool,
}

/// A whole grid's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    /// Model name sent.
    pub model: String,
    /// Base URL.
    pub url: String,
    /// The grid.
    pub workload: Workload,
    /// Latency subtracted from ttfr, seconds.
    pub latency_s: f64,
    /// Finished (or partly finished) points, in grid order.
    pub points: Vec<PointResult>,
    /// The run was cancelled before the grid was done.
    pub aborted: bool,
    /// Problems that did not stop the run (e.g. a failed latency probe).
    pub warnings: Vec<String>,
}

/// Progress of a benchmark, for the TUI and the headless progress bar.
#[derive(Debug, Clone)]
pub enum BenchEvent {
    /// The grid starts.
    Started {
        /// Points in the grid.
        points: usize,
        /// Requests to send (warm-up included).
        requests: u64,
    },
    /// Latency measured.
    Latency {
        /// Mode used.
        mode: LatencyMode,
        /// Seconds.
        seconds: f64,
    },
    /// A point starts.
    PointStarted {
        /// Index in the grid.
        index: usize,
        /// The point.
        point: Point,
    },
    /// One request finished (successfully or not).
    RequestDone {
        /// Point index.
        index: usize,
        /// It was a warm-up request.
        warmup: bool,
        /// Completion tokens counted.
        tokens: u64,
        /// What went wrong, if anything.
        error: Option<RequestError>,
    },
    /// A point finished.
    PointDone {
        /// Point index.
        index: usize,
        /// Its result.
        result: Box<PointResult>,
    },
    /// A level check finished (correctness / stress / performance).
    LevelDone(Box<super::levels::LevelReport>),
    /// Everything finished or was aborted.
    Finished {
        /// Cut short by a cancel.
        aborted: bool,
    },
}

/// Sender half of the progress channel; unbounded so a slow UI never slows a measurement.
pub type Events = mpsc::UnboundedSender<BenchEvent>;

/// Why a run was cancelled, shared by a `Cancel` and its watches.
type Reason = std::sync::Arc<std::sync::Mutex<Option<String>>>;

/// Cancels a running benchmark (Ctrl-C, TUI abort key).
#[derive(Debug, Clone)]
pub struct Cancel(watch::Sender<bool>, Reason);

/// Watches for a cancel.
#[derive(Debug, Clone)]
pub struct CancelWatch(watch::Receiver<bool>, Reason);

impl Cancel {
    /// A new, not yet cancelled, pair.
    pub fn new() -> (Self, CancelWatch) {
        let (tx, rx) = watch::channel(false);
        let reason = Reason::default();
        (Self(tx, reason.clone()), CancelWatch(rx, reason))
    }

    /// Cancel everything watching this.
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    /// Cancel, saying why (the run record's status reason); the first reason given wins.
    pub fn cancel_because(&self, reason: impl Into<String>) {
        if let Ok(mut r) = self.1.lock() {
            r.get_or_insert_with(|| reason.into());
        }
        self.cancel();
    }
}

impl CancelWatch {
    /// Whether a cancel was requested.
    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// The reason given with [`Cancel::cancel_because`], if any.
    pub fn reason(&self) -> Option<String> {
        self.1.lock().ok().and_then(|r| r.clone())
    }

    /// Resolves when cancelled; never, if the `Cancel` was dropped without cancelling.
    pub async fn cancelled(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs workloads against one server.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The client.
    pub client: BenchClient,
    /// Model name sent in requests.
    pub model: String,
    /// Progress events (none: silent).
    pub events: Option<Events>,
    /// Cancel watch.
    pub cancel: CancelWatch,
}

/// Outcome of one batch: traces, or `None` when a cancel interrupted it.
type Batch = Option<Vec<RequestTrace>>;

impl Runner {
    pub(crate) fn emit(&self, event: BenchEvent) {
        if let Some(tx) = &self.events {
            // A closed receiver only means nobody is watching; the measurement goes on.
            let _ = tx.send(event);
        }
    }

    /// Latency per `mode`, in seconds.
    pub async fn latency(&self, mode: LatencyMode, endpoint: Endpoint) -> Result<f64> {
        let mut samples = Vec::new();
        match mode {
            LatencyMode::None => return Ok(0.0),
            LatencyMode::Api => {
                for _ in 0..3 {
                    samples.push(self.client.time_models().await?);
                }
            }
            LatencyMode::Generation => {
                let prompt = Prompt::build(1, 0, None)?;
                let spec = RequestSpec {
                    endpoint,
                    model: self.model.clone(),
                    prompt: PromptBody::Text(prompt),
                    max_tokens: 1,
                    exact_output: false,
                    temperature: None,
                    seed: None,
                    logprobs: false,
                    stop: Vec::new(),
                };
                for i in 0..4 {
                    let epoch = Instant::now();
                    let t = self.client.stream(&spec, epoch).await;
                    if let Some(e) = t.error.as_ref().filter(|e| e.is_fatal()) {
                        anyhow::bail!("latency probe failed: {}", e.message);
                    }
                    let first = t.first_chunk_s.unwrap_or(t.end_s);
                    if i > 0 {
                        samples.push(first - t.start_s);
                    }
                }
            }
        }
        Ok(samples.iter().sum::<f64>() / samples.len().max(1) as f64)
    }

    fn spec(&self, w: &Workload, p: &Point, unique: Option<&str>) -> Result<RequestSpec> {
        let prompt = Prompt::build(p.pp as usize, p.depth as usize, unique)?;
        Ok(RequestSpec {
            endpoint: w.endpoint,
            model: self.model.clone(),
            prompt: if w.token_ids {
                PromptBody::TokenIds(prompt)
            } else {
                PromptBody::Text(prompt)
            },
            max_tokens: p.tg,
            exact_output: w.exact_output,
            temperature: None,
            seed: None,
            logprobs: w.logprobs,
            stop: Vec::new(),
        })
    }

    /// Send `specs` at once, one task each; `None` if cancelled first.
    pub async fn batch(
        &self,
        specs: Vec<RequestSpec>,
        epoch: Instant,
        index: usize,
        warmup: bool,
    ) -> Batch {
        let mut handles = Vec::with_capacity(specs.len());
        for spec in specs {
            let client = self.client.clone();
            let events = self.events.clone();
            handles.push(tokio::spawn(async move {
                let trace = client.stream(&spec, epoch).await;
                if let Some(tx) = events {
                    let _ = tx.send(BenchEvent::RequestDone {
                        index,
                        warmup,
                        tokens: trace.completion_tokens,
                        error: trace.error.clone(),
                    });
                }
                trace
            }));
        }
        let aborts: Vec<_> = handles.iter().map(|h| h.abort_handle()).collect();
        let all = futures::future::join_all(handles);
        tokio::select! {
            results = all => {
                let mut traces = Vec::with_capacity(results.len());
                for r in results {
                    match r {
                        Ok(t) => traces.push(t),
                        // A panicking request task is a bug; keep the run alive and say so.
                        Err(e) => {
                            let mut t = RequestTrace::started(epoch, 0);
                            t.fail(super::trace::ErrorKind::Transport, format!("request task failed: {e}"));
                            traces.push(t);
                        }
                    }
                }
                Some(traces)
            }
            _ = self.cancel.cancelled() => {
                for a in aborts {
                    a.abort();
                }
                None
            }
        }
    }

    /// Run the whole grid. Points finished before a cancel are kept; `on_point` sees each one
    /// as it finishes (the CLI uses it to update the run record).
    pub async fn run(
        &self,
        w: &Workload,
        mut on_point: impl FnMut(&PointResult),
    ) -> Result<WorkloadResult> {
        w.validate()?;
        let points = w.points();
        self.emit(BenchEvent::Started {
            points: points.len(),
            requests: w.total_requests(),
        });
        // A failed probe must not stop the grid: each request then reports its own error.
        let mut warnings = Vec::new();
        let latency_s = match self.latency(w.latency_mode, w.endpoint).await {
            Ok(s) => s,
            Err(e) => {
                warnings.push(format!("latency probe failed, using 0 ms: {e:#}"));
                0.0
            }
        };
        self.emit(BenchEvent::Latency {
            mode: w.latency_mode,
            seconds: latency_s,
        });
        let mut result = WorkloadResult {
            model: self.model.clone(),
            url: self.client.base_url().to_owned(),
            workload: w.clone(),
            latency_s,
            points: Vec::new(),
            aborted: false,
            warnings,
        };
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_007)
            .unwrap_or(0);
        let epoch = Instant::now();
        let epoch_wall = Utc::now();
        'grid: for (index, point) in points.iter().enumerate() {
            self.emit(BenchEvent::PointStarted {
                index,
                point: *point,
            });
            let mut runs = Vec::new();
            let mut partial = false;
            for run in 0..(w.warmup + w.runs) {
                let warmup = run < w.warmup;
                let mut specs = Vec::with_capacity(point.concurrency as usize);
                for slot in 0..point.concurrency {
                    let tag = format!("{nonce:x} {index}.{run}.{slot}");
                    let unique = w.no_cache.then_some(tag.as_str());
                    specs.push(self.spec(w, point, unique)?);
                }
                match self.batch(specs, epoch, index, warmup).await {
                    Some(traces) if !warmup => runs.push(traces),
                    Some(_) => {}
                    None => {
                        partial = true;
                        result.aborted = true;
                        break;
                    }
                }
            }
            if !runs.is_empty() || !partial {
                let done = finish_point(*point, runs, latency_s, epoch_wall, partial);
                if let Some(w) = early_first_chunk(&done) {
                    result.warnings.push(w);
                }
                on_point(&done);
                self.emit(BenchEvent::PointDone {
                    index,
                    result: Box::new(done.clone()),
                });
                result.points.push(done);
            }
            if result.aborted {
                break 'grid;
            }
        }
        self.emit(BenchEvent::Finished {
            aborted: result.aborted,
        });
        Ok(result)
    }
}

/// A server that sends its role-only chunk before prefill (the bundled engine did) makes
/// ttfr, est_ppt and pp t/s meaningless; say so instead of printing absurd pp figures.
pub fn early_first_chunk(p: &PointResult) -> Option<String> {
    let r = &p.stats.record;
    let (ttfr, ttft) = (r.ttfr_ms?.mean, r.e2e_ttft_ms?.mean);
    (ttft > 20.0 && ttfr < 0.2 * ttft).then(|| {
        format!(
            "{}: the first chunk arrives {ttfr:.1} ms after the request but the first token \
             {ttft:.1} ms: the server sends its role chunk before prefill, so ttfr, est_ppt and \
             pp t/s do not measure prefill; read e2e_ttft",
            point_label(&p.point)
        )
    })
}

/// Statistics and the error summary of a point's runs.
pub fn finish_point(
    point: Point,
    runs: Vec<Vec<RequestTrace>>,
    latency_s: f64,
    epoch_wall: DateTime<Utc>,
    partial: bool,
) -> PointResult {
    let stats = PointStats::of(point, &runs, latency_s, epoch_wall);
    let mut errors: Vec<(String, usize)> = Vec::new();
    for e in runs.iter().flatten().filter_map(|t| t.error.as_ref()) {
        match errors.iter_mut().find(|(m, _)| *m == e.message) {
            Some((_, n)) => *n += 1,
            None => errors.push((e.message.clone(), 1)),
        }
    }
    PointResult {
        point,
        stats,
        runs,
        errors,
        partial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Workload {
        Workload {
            pp: vec![64, 128],
            tg: vec![8],
            depth: vec![0, 256],
            concurrency: vec![1, 4],
            runs: 3,
            warmup: 1,
            no_cache: true,
            latency_mode: LatencyMode::None,
            endpoint: Endpoint::Chat,
            token_ids: false,
            exact_output: true,
            logprobs: false,
        }
    }

    #[test]
    fn points_are_depth_major_and_requests_count_warmup() {
        let w = grid();
        let p = w.points();
        assert_eq!(p.len(), 8);
        assert_eq!((p[0].depth, p[0].pp, p[0].concurrency), (0, 64, 1));
        assert_eq!((p[1].depth, p[1].pp, p[1].concurrency), (0, 64, 4));
        assert_eq!((p[4].depth, p[4].pp), (256, 64));
        // Each depth: (1 + 4) × 2 pp values × (1 warm-up + 3 runs).
        assert_eq!(w.total_requests(), 2 * 5 * 2 * 4);
        assert_eq!(point_label(&p[5]), "pp64 tg8 @ d256");
        assert_eq!(pp_label(&p[0]), "pp64");
        assert_eq!(tg_label(&p[5]), "tg8 @ d256");
    }

    #[test]
    fn validation_names_the_option_at_fault() {
        assert!(grid().validate().is_ok());
        type Change = fn(&mut Workload);
        let cases: [(Change, &str); 6] = [
            (|w| w.pp = vec![8], "--no-cache"),
            (|w| w.depth = vec![16], "--no-cache"),
            (|w| w.concurrency = vec![0], "--concurrency"),
            (|w| w.tg = vec![], "--tg"),
            (|w| w.runs = 0, "--runs"),
            (|w| w.token_ids = true, "--token-ids"),
        ];
        for (change, option) in cases {
            let mut w = grid();
            change(&mut w);
            let e = w.validate().unwrap_err().to_string();
            assert!(e.contains(option), "{e}");
        }
        let mut w = grid();
        w.no_cache = false;
        w.pp = vec![1];
        assert!(w.validate().is_ok());
    }
}

//! The target's own `/metrics` (Prometheus text format): scrape, parse, derive rates.
//!
//! Servers export cumulative counters; tok/s is the counter's growth over a short window.
//! A counter that goes down means the server restarted, so its new value is all growth since
//! then (the same rule as Prometheus `rate()`). Counters are summed over label sets (one set
//! per engine); the KV-cache gauge is averaged.
//!
//! Where the server exports them, two per-interval figures come from counter deltas over the
//! same window: the mean time per output token (`_sum` / `_count` of vLLM's TPOT histogram)
//! and the prefix-cache hit rate (hits / queries). A server without those series gets `None`
//! for them (nothing shown), not an error.

use super::reading::Reading;
use super::sample::{ServerKind, ServerMetrics, ServerStatus};
use anyhow::{Context, Result, anyhow};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Metric names per server family, in one table.
struct Names {
    kind: ServerKind,
    generation: &'static str,
    prompt: &'static str,
    running: &'static str,
    waiting: &'static str,
    kv_usage: &'static [&'static str],
    spec_accepted: &'static str,
    spec_draft_tokens: &'static str,
    spec_drafts: &'static str,
    /// `(_sum, _count)` of a time-per-output-token histogram, in order of preference.
    tpot: &'static [(&'static str, &'static str)],
    /// `(hits, queries)` counters of the prefix cache, in order of preference.
    prefix_cache: &'static [(&'static str, &'static str)],
    /// Counter of pre-empted requests, in order of preference.
    preemptions: &'static [&'static str],
}

const FAMILIES: [Names; 2] = [
    Names {
        kind: ServerKind::Vllm,
        generation: "vllm:generation_tokens_total",
        prompt: "vllm:prompt_tokens_total",
        running: "vllm:num_requests_running",
        waiting: "vllm:num_requests_waiting",
        // Older vLLM releases named the KV gauge after the GPU cache.
        kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        spec_accepted: "vllm:spec_decode_num_accepted_tokens_total",
        spec_draft_tokens: "vllm:spec_decode_num_draft_tokens_total",
        spec_drafts: "vllm:spec_decode_num_drafts_total",
        // Per finished request (decode time over the tokens after the first); older vLLM
        // only had the per-token histogram under the second name.
        tpot: &[
            (
                "vllm:request_time_per_output_token_seconds_sum",
                "vllm:request_time_per_output_token_seconds_count",
            ),
            (
                "vllm:time_per_output_token_seconds_sum",
                "vllm:time_per_output_token_seconds_count",
            ),
        ],
        // vLLM's counters are `vllm:prefix_cache_{hits,queries}`, exposed with the client
        // library's `_total` suffix; releases before 0.10 said `gpu_prefix_cache`.
        prefix_cache: &[
            (
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_queries_total",
            ),
            ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
            (
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_queries_total",
            ),
        ],
        preemptions: &["vllm:num_preemptions_total", "vllm:num_preemptions"],
    },
    Names {
        kind: ServerKind::LlamaCpp,
        generation: "llamacpp:tokens_predicted_total",
        prompt: "llamacpp:prompt_tokens_total",
        running: "llamacpp:requests_processing",
        waiting: "llamacpp:requests_deferred",
        kv_usage: &["llamacpp:kv_cache_usage_ratio"],
        // llama.cpp exports no speculative-decoding counters.
        spec_accepted: "",
        spec_draft_tokens: "",
        spec_drafts: "",
        tpot: &[],
        prefix_cache: &[],
        preemptions: &[],
    },
];

/// prometheus-parse matches metric names with `\w+`, which has no `:`; every vLLM and
/// llama.cpp name has one. Names are rewritten before parsing and restored after.
const COLON_ESCAPE: &str = "__colon__";

fn escape_name(name: &str) -> String {
    name.replace(':', COLON_ESCAPE)
}

/// Rewrites the metric name of a sample, `# HELP` or `# TYPE` line; other text is kept.
fn escape_line(line: &str) -> String {
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix('#') {
        let mut parts = rest.trim_start().splitn(3, char::is_whitespace);
        return match (parts.next(), parts.next(), parts.next()) {
            (Some(kw @ ("HELP" | "TYPE")), Some(name), tail) => {
                format!("# {kw} {} {}", escape_name(name), tail.unwrap_or(""))
            }
            _ => line.to_string(),
        };
    }
    let end = trimmed
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(trimmed.len());
    format!("{}{}", escape_name(&trimmed[..end]), &trimmed[end..])
}

/// One scrape: each plain numeric series, summed (and counted) per metric name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    values: HashMap<String, (f64, usize)>,
}

impl Snapshot {
    /// Sum over all label sets of a metric, if the scrape has it.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.values.get(name).map(|(s, _)| *s)
    }

    /// Mean over all label sets of a metric, if the scrape has it.
    pub fn mean(&self, name: &str) -> Option<f64> {
        self.values.get(name).map(|(s, n)| s / *n as f64)
    }
}

/// The metric a line is about: a sample's name, or the name in `# HELP` / `# TYPE`.
fn line_metric(line: &str) -> Option<&str> {
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix('#') {
        let mut parts = rest.split_whitespace();
        return match (parts.next(), parts.next()) {
            (Some("HELP" | "TYPE"), Some(name)) => Some(name),
            _ => None,
        };
    }
    let end = t
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(t.len());
    (end > 0).then(|| &t[..end])
}

/// True for the metric names the tracker derives figures from.
pub fn tracked(name: &str) -> bool {
    // Empty entries in the table mean "not exported by this family".
    !name.is_empty()
        && FAMILIES.iter().any(|f| {
            [
                f.generation,
                f.prompt,
                f.running,
                f.waiting,
                f.spec_accepted,
                f.spec_draft_tokens,
                f.spec_drafts,
            ]
            .contains(&name)
                || f.kv_usage.contains(&name)
                || f.preemptions.contains(&name)
                || f.tpot
                    .iter()
                    .chain(f.prefix_cache)
                    .any(|(a, b)| *a == name || *b == name)
        })
}

/// Parses Prometheus text exposition into a `Snapshot` (histograms and summaries skipped),
/// keeping only metrics for which `keep(name)` holds. A vLLM scrape is mostly histogram
/// buckets; dropping unwanted lines before the regex parser is what keeps a 4 Hz scrape cheap.
pub fn parse_metrics(text: &str, keep: impl Fn(&str) -> bool) -> Result<Snapshot> {
    let lines = text
        .lines()
        .filter(|l| line_metric(l).is_some_and(&keep))
        .map(|l| Ok(escape_line(l)));
    let scrape = prometheus_parse::Scrape::parse(lines).context("parsing Prometheus text")?;
    let mut values: HashMap<String, (f64, usize)> = HashMap::new();
    for s in scrape.samples {
        let v = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => {
                continue;
            }
        };
        if !v.is_finite() {
            continue;
        }
        let name = s.metric.replace(COLON_ESCAPE, ":");
        let e = values.entry(name).or_insert((0.0, 0));
        e.0 += v;
        e.1 += 1;
    }
    Ok(Snapshot { values })
}

/// Growth of a counter between two scrapes; a drop means the server restarted from zero.
pub fn counter_delta(previous: f64, current: f64) -> f64 {
    if current >= previous {
        current - previous
    } else {
        current
    }
}

/// A counter made monotonic across restarts, with the points of the last rate window.
#[derive(Debug, Clone)]
pub struct CounterRate {
    window_s: f64,
    last_raw: Option<f64>,
    total: f64,
    points: VecDeque<(f64, f64)>,
}

impl CounterRate {
    /// A rate over at least `window_s` seconds once that much history exists.
    pub fn new(window_s: f64) -> Self {
        CounterRate {
            window_s,
            last_raw: None,
            total: 0.0,
            points: VecDeque::new(),
        }
    }

    /// Records the counter's value at `t` seconds; returns the growth since the last value.
    pub fn observe(&mut self, t: f64, raw: f64) -> f64 {
        let delta = self.last_raw.map_or(0.0, |prev| counter_delta(prev, raw));
        self.last_raw = Some(raw);
        self.total += delta;
        self.points.push_back((t, self.total));
        // Keep the newest point at or before the window start, and everything after it.
        while self.points.len() > 2 && self.points[1].0 <= t - self.window_s {
            self.points.pop_front();
        }
        delta
    }

    /// Per-second growth over the window; `None` until two points exist.
    pub fn rate(&self) -> Option<f64> {
        let (t0, v0) = *self.points.front()?;
        let (t1, v1) = *self.points.back()?;
        (t1 > t0).then(|| (v1 - v0) / (t1 - t0))
    }

    /// Growth over the window (restarts included); `None` until two points exist.
    pub fn window_growth(&self) -> Option<f64> {
        let (t0, v0) = *self.points.front()?;
        let (t1, v1) = *self.points.back()?;
        (t1 > t0).then_some(v1 - v0)
    }

    /// Growth since the first observation, restarts included.
    pub fn total(&self) -> f64 {
        self.total
    }

    /// Points currently kept (bounded by the window and the sample rate).
    pub fn points_kept(&self) -> usize {
        self.points.len()
    }
}

/// Turns successive snapshots into server figures.
#[derive(Debug, Clone)]
pub struct Tracker {
    window_s: f64,
    counters: HashMap<&'static str, CounterRate>,
}

impl Tracker {
    /// tok/s are averaged over `window_s` seconds (1 s suits a per-second display).
    pub fn new(window_s: f64) -> Self {
        Tracker {
            window_s,
            counters: HashMap::new(),
        }
    }

    fn counter(&mut self, name: &'static str, t: f64, snap: &Snapshot) -> Option<&CounterRate> {
        let raw = snap.sum(name)?;
        let window_s = self.window_s;
        let c = self
            .counters
            .entry(name)
            .or_insert_with(|| CounterRate::new(window_s));
        c.observe(t, raw);
        Some(c)
    }

    /// Folds in the snapshot taken at `t` seconds and derives the figures.
    pub fn update(&mut self, url: &str, t: f64, snap: &Snapshot) -> ServerMetrics {
        let family = FAMILIES.iter().find(|f| {
            [f.generation, f.prompt, f.running, f.waiting]
                .iter()
                .any(|n| snap.sum(n).is_some())
        });
        let Some(f) = family else {
            return ServerMetrics {
                url: url.to_string(),
                kind: ServerKind::Unknown,
                generation_tok_s: Reading::NotSupported,
                prompt_tok_s: Reading::NotSupported,
                running: Reading::NotSupported,
                waiting: Reading::NotSupported,
                kv_cache_usage: Reading::NotSupported,
                spec_acceptance_rate: Reading::NotSupported,
                spec_mean_acceptance_length: Reading::NotSupported,
                tpot_ms: None,
                prefix_cache_hit_rate: None,
                preemptions: None,
            };
        };
        let rate = |c: Option<&CounterRate>| match c {
            None => Reading::NotSupported,
            Some(c) => c.rate().map_or(Reading::NotSupported, Reading::Value),
        };
        let generation_tok_s = rate(self.counter(f.generation, t, snap));
        let prompt_tok_s = rate(self.counter(f.prompt, t, snap));
        let gauge = |v: Option<f64>| v.map_or(Reading::NotSupported, Reading::Value);
        let kv_cache_usage = gauge(f.kv_usage.iter().find_map(|n| snap.mean(n)));
        let accepted = self.spec_total(f.spec_accepted, t, snap);
        let draft_tokens = self.spec_total(f.spec_draft_tokens, t, snap);
        let drafts = self.spec_total(f.spec_drafts, t, snap);
        let ratio = |num: Option<f64>, den: Option<f64>| match (num, den) {
            (Some(n), Some(d)) if d > 0.0 => Reading::Value(n / d),
            _ => Reading::NotSupported,
        };
        ServerMetrics {
            url: url.to_string(),
            kind: f.kind,
            generation_tok_s,
            prompt_tok_s,
            running: gauge(snap.sum(f.running)),
            waiting: gauge(snap.sum(f.waiting)),
            kv_cache_usage,
            spec_acceptance_rate: ratio(accepted, draft_tokens),
            spec_mean_acceptance_length: ratio(accepted, drafts).map(|r| 1.0 + r),
            tpot_ms: self
                .window_ratio(f.tpot, t, snap)
                .map(|r| r.map(|s| s * 1000.0)),
            prefix_cache_hit_rate: self.window_ratio(f.prefix_cache, t, snap),
            preemptions: f
                .preemptions
                .iter()
                .find(|n| snap.sum(n).is_some())
                .and_then(|n| self.counter(n, t, snap))
                .map(|c| Reading::Value(c.total())),
        }
    }

    /// Growth of `num` over growth of `den` in the rate window, for the first pair of
    /// `pairs` the scrape has both of. `None`: the server exports no such pair; n/a: too
    /// little history yet, or `den` did not grow (no request finished, no prefix looked up).
    fn window_ratio(
        &mut self,
        pairs: &[(&'static str, &'static str)],
        t: f64,
        snap: &Snapshot,
    ) -> Option<Reading<f64>> {
        let &(num, den) = pairs
            .iter()
            .find(|(n, d)| snap.sum(n).is_some() && snap.sum(d).is_some())?;
        let n = self
            .counter(num, t, snap)
            .and_then(CounterRate::window_growth);
        let d = self
            .counter(den, t, snap)
            .and_then(CounterRate::window_growth);
        Some(match (n, d) {
            (Some(n), Some(d)) if d > 0.0 => Reading::Value(n / d),
            _ => Reading::NotSupported,
        })
    }

    fn spec_total(&mut self, name: &'static str, t: f64, snap: &Snapshot) -> Option<f64> {
        if name.is_empty() {
            return None;
        }
        self.counter(name, t, snap).map(CounterRate::total)
    }
}

/// Makes the scrape URL: a bare `http://host:port` gets `/metrics` appended.
pub fn metrics_url(given: &str) -> Result<reqwest::Url> {
    let mut url = reqwest::Url::parse(given).with_context(|| {
        format!("--url {given:?} is not a URL; give e.g. http://127.0.0.1:8000/metrics")
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(anyhow!(
            "--url {given:?}: only http:// and https:// can be scraped"
        ));
    }
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/metrics");
    }
    Ok(url)
}

/// Scrapes one URL on the collector thread, keeping the rate state between scrapes.
pub struct ServerReader {
    url: reqwest::Url,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    tracker: Tracker,
}

/// How long one scrape may take before the sample records it as failed.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);

impl ServerReader {
    /// Prepares the HTTP client; the URL is checked here so a typo fails at start-up.
    pub fn new(url: &str, window_s: f64) -> Result<Self> {
        let url = metrics_url(url)?;
        let client = reqwest::Client::builder()
            .timeout(SCRAPE_TIMEOUT)
            .build()
            .context("building the HTTP client for /metrics")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the monitor's HTTP runtime")?;
        Ok(ServerReader {
            url,
            client,
            runtime,
            tracker: Tracker::new(window_s),
        })
    }

    /// Scrapes once; `t` is the monitor's clock in seconds.
    pub fn read(&mut self, t: f64) -> ServerStatus {
        let url = self.url.to_string();
        let fetched = self.runtime.block_on(async {
            let resp = self.client.get(self.url.clone()).send().await?;
            let status = resp.status();
            let body = resp.text().await?;
            Ok::<_, reqwest::Error>((status, body))
        });
        match fetched {
            Err(e) => ServerStatus::Failed {
                error: format!("scraping {url}: {:#}", anyhow::Error::from(e)),
            },
            Ok((status, _)) if status == reqwest::StatusCode::NOT_FOUND => {
                ServerStatus::NoMetrics { url }
            }
            Ok((status, _)) if !status.is_success() => ServerStatus::Failed {
                error: format!("scraping {url}: HTTP {status}"),
            },
            Ok((_, body)) => match parse_metrics(&body, tracked) {
                Ok(snap) => ServerStatus::Scraped(Box::new(self.tracker.update(&url, t, &snap))),
                Err(e) => ServerStatus::Failed {
                    error: format!("{url}: {e:#}"),
                },
            },
        }
    }
}

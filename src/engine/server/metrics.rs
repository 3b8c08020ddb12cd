//! Live server metrics with vLLM's names, rendered as Prometheus text for `GET /metrics`,
//! so one monitor reads both the vLLM container and the bundled engine.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A Prometheus histogram with fixed upper bounds.
#[derive(Debug)]
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

// Bucket bounds as in vLLM v1, so dashboards built for vLLM read ours unchanged.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Tokens per engine step, as vLLM buckets `vllm:iteration_tokens_total`.
const ITERATION_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// vLLM's 1-2-5 buckets for token counts: 1, 2, 5, 10, 20, 50, … up to `max`.
fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => return out,
        };
    }
}

#[derive(Debug)]
struct Histograms {
    ttft: Histogram,
    itl: Histogram,
    /// vLLM's older name for the inter-token latency, kept for dashboards that read it.
    tpot_per_token: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
    iteration_tokens: Histogram,
}

/// One finished request's sizes and phase times, for the per-request histograms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestStats {
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
    /// From admission to the first generated token.
    pub prefill_s: f64,
    /// From the first generated token to the last.
    pub decode_s: f64,
}

/// Counters, gauges and histograms shared by the scheduler (writer) and `/metrics` (reader).
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    /// KV positions in all, for `vllm:cache_config_info`.
    kv_cache_tokens: usize,
    /// `--enable-prefix-caching`: the prefix-cache counters are exported only then.
    prefix_caching: bool,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    preemptions: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    /// KV usage in millionths, to keep it atomic.
    kv_usage_ppm: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    success_stop: AtomicU64,
    success_length: AtomicU64,
    success_abort: AtomicU64,
    /// Requests refused because the waiting queue was full (`--max-waiting-queue-length`).
    rejected_queue_full: AtomicU64,
    /// Engine steps run, and their time in nanoseconds: inside the backend's forward (the
    /// GPU step with its sampling and token copy) and the whole scheduler iteration.
    engine_steps: AtomicU64,
    forward_ns: AtomicU64,
    iteration_ns: AtomicU64,
    hist: Mutex<Histograms>,
}

/// Why a request ended, as counted by `vllm:request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    Stop,
    Length,
    Abort,
}

impl Metrics {
    /// Empty metrics labelled with the served model name; `max_model_len` bounds the token
    /// histograms' buckets, `kv_cache_tokens` is reported in `vllm:cache_config_info`.
    pub fn new(model_name: &str, max_model_len: usize, kv_cache_tokens: usize) -> Self {
        let token_buckets = buckets_1_2_5(max_model_len);
        Metrics {
            model_name: model_name.to_string(),
            kv_cache_tokens,
            prefix_caching: false,
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_usage_ppm: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success_stop: AtomicU64::new(0),
            success_length: AtomicU64::new(0),
            success_abort: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            engine_steps: AtomicU64::new(0),
            forward_ns: AtomicU64::new(0),
            iteration_ns: AtomicU64::new(0),
            hist: Mutex::new(Histograms {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                tpot_per_token: Histogram::new(ITL_BUCKETS),
                request_tpot: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(REQUEST_BUCKETS),
                queue: Histogram::new(REQUEST_BUCKETS),
                prefill: Histogram::new(REQUEST_BUCKETS),
                decode: Histogram::new(REQUEST_BUCKETS),
                prompt_tokens: Histogram::new(&token_buckets),
                generation_tokens: Histogram::new(&token_buckets),
                iteration_tokens: Histogram::new(ITERATION_TOKEN_BUCKETS),
            }),
        }
    }

    /// The same metrics for a server with prefix caching `on` (`vllm:cache_config_info` says
    /// so, and the prefix-cache counters are exported).
    pub fn with_prefix_caching(mut self, on: bool) -> Self {
        self.prefix_caching = on;
        self
    }

    /// One admitted sequence's prefix-cache lookup, in tokens as vLLM counts it: its whole
    /// prompt queried, `hits` of them found cached.
    pub fn observe_prefix_cache(&self, prompt_tokens: usize, hits: usize) {
        self.prefix_queries
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.prefix_hits.fetch_add(hits as u64, Ordering::Relaxed);
    }

    /// A running request was pre-empted (its KV freed, to be recomputed when it is admitted
    /// again).
    pub fn observe_preemption(&self) {
        self.preemptions.fetch_add(1, Ordering::Relaxed);
    }

    /// Set the running gauge and the KV usage fraction (0–1).
    pub fn set_load(&self, running: usize, kv_usage: f64) {
        self.running.store(running as u64, Ordering::Relaxed);
        let ppm = (kv_usage.clamp(0.0, 1.0) * 1e6).round() as u64;
        self.kv_usage_ppm.store(ppm, Ordering::Relaxed);
    }

    /// A request was submitted; it waits until admitted. Counted at submission so the
    /// gauge is right even while the engine thread is inside a long forward step.
    pub fn request_queued(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A waiting request left the queue (admitted, cancelled or refused).
    pub fn request_dequeued(&self) {
        // Saturate rather than wrap if a caller ever dequeues twice.
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w.saturating_sub(1))
            });
    }

    /// A request was refused at submission: the waiting queue was full.
    pub fn request_rejected_queue_full(&self) {
        self.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests currently in the running batch.
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    /// Count prompt tokens that were prefilled.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Count one generated token, with the gap since the previous one (none for the first).
    pub fn add_generated_token(&self, gap_s: Option<f64>) {
        self.generation_tokens.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = gap_s {
            self.with_hist(|h| {
                h.itl.observe(g);
                h.tpot_per_token.observe(g);
            });
        }
    }

    /// Record the time from arrival to the first generated token.
    pub fn observe_ttft(&self, s: f64) {
        self.with_hist(|h| h.ttft.observe(s));
    }

    /// Record the time a request waited before it was admitted.
    pub fn observe_queue(&self, s: f64) {
        self.with_hist(|h| h.queue.observe(s));
    }

    /// Record a finished request with its end-to-end latency.
    pub fn observe_finished(&self, why: Finished, e2e_s: f64) {
        let c = match why {
            Finished::Stop => &self.success_stop,
            Finished::Length => &self.success_length,
            Finished::Abort => &self.success_abort,
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.with_hist(|h| h.e2e.observe(e2e_s));
    }

    /// Record a request that finished normally (stop or length): its token counts, its
    /// prefill and decode times, and its mean time per output token (as vLLM: decode time
    /// over the tokens after the first; none for a one-token answer).
    pub fn observe_request(&self, r: RequestStats) {
        self.with_hist(|h| {
            h.prompt_tokens.observe(r.prompt_tokens as f64);
            h.generation_tokens.observe(r.generation_tokens as f64);
            h.prefill.observe(r.prefill_s);
            h.decode.observe(r.decode_s);
            if r.generation_tokens > 1 {
                h.request_tpot
                    .observe(r.decode_s / (r.generation_tokens - 1) as f64);
            }
        });
    }

    /// Record the number of tokens one engine step fed to the backend.
    pub fn observe_iteration_tokens(&self, n: usize) {
        self.with_hist(|h| h.iteration_tokens.observe(n as f64));
    }

    /// Count one engine step: `forward` spent in the backend's forward, `iteration` in the
    /// whole scheduler iteration around it (admission, batching, emitting tokens).
    pub fn observe_step(&self, forward: std::time::Duration, iteration: std::time::Duration) {
        self.engine_steps.fetch_add(1, Ordering::Relaxed);
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.forward_ns.fetch_add(ns(forward), Ordering::Relaxed);
        self.iteration_ns
            .fetch_add(ns(iteration), Ordering::Relaxed);
    }

    fn with_hist(&self, f: impl FnOnce(&mut Histograms)) {
        // A poisoned lock only means a panic elsewhere mid-update; the counts stay usable.
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut h);
    }

    /// The metrics in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut o = String::new();
        // vLLM's labels: the model and the engine index (one engine here, as vLLM's "0").
        let label = format!(
            "model_name=\"{}\",engine=\"0\"",
            escape_label(&self.model_name)
        );
        let gauge = |o: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {v}"
            );
        };
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {v}"
            );
        };
        gauge(
            &mut o,
            "vllm:num_requests_running",
            "Number of requests in the running batch.",
            self.running().to_string(),
        );
        gauge(
            &mut o,
            "vllm:num_requests_waiting",
            "Number of requests waiting for admission.",
            self.waiting.load(Ordering::Relaxed).to_string(),
        );
        gauge(
            &mut o,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage as a fraction (1 = full).",
            format!("{}", self.kv_usage_ppm.load(Ordering::Relaxed) as f64 / 1e6),
        );
        counter(
            &mut o,
            "vllm:prompt_tokens_total",
            "Number of prompt tokens processed (those found in the prefix cache included, as \
             vLLM counts them).",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "vllm:generation_tokens_total",
            "Number of generated tokens.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        if self.prefix_caching {
            counter(
                &mut o,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prefix_queries.load(Ordering::Relaxed),
            );
            counter(
                &mut o,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.prefix_hits.load(Ordering::Relaxed),
            );
        }
        counter(
            &mut o,
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions (a running request's KV freed when a step needed \
             the room, the request recomputed later).",
            self.preemptions.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "mxtune:engine_steps_total",
            "Engine steps run (each a batched forward of every running request).",
            self.engine_steps.load(Ordering::Relaxed),
        );
        for (name, help, ns) in [
            (
                "mxtune:engine_forward_seconds_total",
                "Time in the backend's forward steps (GPU step, sampling, token copy).",
                &self.forward_ns,
            ),
            (
                "mxtune:engine_iteration_seconds_total",
                "Time in whole scheduler iterations (the forward plus admission, batching and \
                 token emission): the difference is the engine's host overhead.",
                &self.iteration_ns,
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {}",
                ns.load(Ordering::Relaxed) as f64 / 1e9
            );
        }
        let _ = writeln!(
            o,
            "# HELP vllm:request_success_total Finished requests by reason.\n\
             # TYPE vllm:request_success_total counter"
        );
        for (reason, c) in [
            ("stop", &self.success_stop),
            ("length", &self.success_length),
            ("abort", &self.success_abort),
        ] {
            let _ = writeln!(
                o,
                "vllm:request_success_total{{{label},finished_reason=\"{reason}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP vllm:admission_rejections_total Requests refused at arrival with a 503, by \
             the limit that refused them (max_waiting_queue_length: that many requests already \
             waited beyond a full batch).\n\
             # TYPE vllm:admission_rejections_total counter\n\
             vllm:admission_rejections_total{{model_name=\"{}\",reason=\"max_waiting_queue_length\"}} {}",
            escape_label(&self.model_name),
            self.rejected_queue_full.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP vllm:cache_config_info Information of the KV cache (this engine reserves \
             positions, so a block is one position; prefix caching reuses whole free slots).\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"1\",enable_prefix_caching=\"{}\",engine=\"0\",\
             num_gpu_blocks=\"{}\"}} 1.0",
            if self.prefix_caching { "True" } else { "False" },
            self.kv_cache_tokens
        );
        let h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        for (name, help, hist) in [
            (
                "vllm:time_to_first_token_seconds",
                "Time from arrival to the first generated token.",
                &h.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Time between consecutive generated tokens.",
                &h.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Time from arrival to the end of the request.",
                &h.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Time a request waited before admission.",
                &h.queue,
            ),
            (
                "vllm:time_per_output_token_seconds",
                "Time between consecutive generated tokens (vLLM's older name of \
                 vllm:inter_token_latency_seconds).",
                &h.tpot_per_token,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Mean time per output token of each finished request (decode time over the \
                 tokens after the first).",
                &h.request_tpot,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Time from admission to the first generated token.",
                &h.prefill,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Time from the first generated token to the last.",
                &h.decode,
            ),
            (
                "vllm:request_prompt_tokens",
                "Prompt tokens of each finished request.",
                &h.prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Generated tokens of each finished request.",
                &h.generation_tokens,
            ),
            (
                "vllm:iteration_tokens_total",
                "Tokens fed to the backend per engine step.",
                &h.iteration_tokens,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (b, c) in hist.bounds.iter().zip(&hist.counts) {
                let _ = writeln!(o, "{name}_bucket{{{label},le=\"{b}\"}} {c}");
            }
            let _ = writeln!(o, "{name}_bucket{{{label},le=\"+Inf\"}} {}", hist.count);
            let _ = writeln!(o, "{name}_sum{{{label}}} {}", hist.sum);
            let _ = writeln!(o, "{name}_count{{{label}}} {}", hist.count);
        }
        o
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_with_cumulative_buckets() {
        let m = Metrics::new("syn\"tiny", 1000, 4096);
        m.set_load(2, 0.25);
        m.request_queued();
        m.request_queued();
        m.request_dequeued();
        m.add_prompt_tokens(7);
        m.add_generated_token(None);
        m.add_generated_token(Some(0.02));
        m.observe_ttft(0.03);
        m.observe_finished(Finished::Length, 0.9);
        m.request_rejected_queue_full();
        m.observe_step(
            std::time::Duration::from_millis(3),
            std::time::Duration::from_millis(4),
        );
        m.observe_step(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        );
        let t = m.render();
        assert!(
            t.contains("mxtune:engine_steps_total{model_name=\"syn\\\"tiny\",engine=\"0\"} 2\n")
        );
        assert!(t.contains(
            "mxtune:engine_forward_seconds_total{model_name=\"syn\\\"tiny\",engine=\"0\"} 0.004\n"
        ));
        assert!(t.contains(
            "mxtune:engine_iteration_seconds_total{model_name=\"syn\\\"tiny\",engine=\"0\"} 0.005\n"
        ));
        assert!(
            t.contains("vllm:num_requests_running{model_name=\"syn\\\"tiny\",engine=\"0\"} 2\n")
        );
        assert!(
            t.contains("vllm:num_requests_waiting{model_name=\"syn\\\"tiny\",engine=\"0\"} 1\n")
        );
        assert!(
            t.contains("vllm:kv_cache_usage_perc{model_name=\"syn\\\"tiny\",engine=\"0\"} 0.25\n")
        );
        assert!(
            t.contains("vllm:prompt_tokens_total{model_name=\"syn\\\"tiny\",engine=\"0\"} 7\n")
        );
        assert!(
            t.contains("vllm:generation_tokens_total{model_name=\"syn\\\"tiny\",engine=\"0\"} 2\n")
        );
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"syn\\\"tiny\",engine=\"0\",le=\"0.02\"} 0\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"syn\\\"tiny\",engine=\"0\",le=\"0.04\"} 1\n"
        ));
        assert!(t.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"syn\\\"tiny\",engine=\"0\",le=\"+Inf\"} 1\n"
        ));
        assert!(t.contains(
            "vllm:inter_token_latency_seconds_count{model_name=\"syn\\\"tiny\",engine=\"0\"} 1\n"
        ));
        assert!(t.contains("finished_reason=\"length\"} 1\n"));
        assert!(t.contains(
            "vllm:admission_rejections_total{model_name=\"syn\\\"tiny\",reason=\"max_waiting_queue_length\"} 1\n"
        ));
        // The per-request histograms: 1-2-5 token buckets up to max_model_len, mean TPOT.
        m.observe_request(RequestStats {
            prompt_tokens: 7,
            generation_tokens: 5,
            prefill_s: 0.2,
            decode_s: 0.4,
        });
        m.observe_iteration_tokens(9);
        let t = m.render();
        let l = "model_name=\"syn\\\"tiny\",engine=\"0\"";
        for want in [
            format!("vllm:request_prompt_tokens_bucket{{{l},le=\"5\"}} 0\n"),
            format!("vllm:request_prompt_tokens_bucket{{{l},le=\"10\"}} 1\n"),
            format!("vllm:request_prompt_tokens_bucket{{{l},le=\"1000\"}} 1\n"),
            format!("vllm:request_generation_tokens_sum{{{l}}} 5\n"),
            format!("vllm:request_time_per_output_token_seconds_sum{{{l}}} 0.1\n"),
            format!("vllm:request_prefill_time_seconds_sum{{{l}}} 0.2\n"),
            format!("vllm:request_decode_time_seconds_count{{{l}}} 1\n"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"8\"}} 0\n"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"16\"}} 1\n"),
            format!("vllm:time_per_output_token_seconds_count{{{l}}} 1\n"),
            "vllm:cache_config_info{block_size=\"1\",enable_prefix_caching=\"False\",engine=\"0\",num_gpu_blocks=\"4096\"} 1.0\n".to_string(),
        ] {
            assert!(t.contains(&want), "{want} missing in\n{t}");
        }
        assert!(
            !t.contains("le=\"2000\""),
            "token buckets stop at max_model_len"
        );
        // Without prefix caching its counters are absent; with it, counted in tokens.
        assert!(!t.contains("prefix_cache"), "{t}");
        let m = Metrics::new("m", 1000, 64).with_prefix_caching(true);
        m.observe_prefix_cache(30, 0);
        m.observe_prefix_cache(40, 29);
        let t = m.render();
        for want in [
            "# TYPE vllm:prefix_cache_queries_total counter\n",
            "vllm:prefix_cache_queries_total{model_name=\"m\",engine=\"0\"} 70\n",
            "vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 29\n",
            "vllm:cache_config_info{block_size=\"1\",enable_prefix_caching=\"True\",",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
        assert_eq!(buckets_1_2_5(60), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        // Every sample line is `name{labels} value` with a numeric value.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }
}

//! Metrics from request traces: llama-benchy's pp/tg/ttfr/est_ppt/e2e_ttft and vllm bench
//! serve's TTFT/TPOT/ITL/E2EL and throughputs. Exact definitions: docs/benchmarking.md.

use serde::{Deserialize, Serialize};

use super::trace::RequestTrace;

/// Mean, standard deviation and count of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Arithmetic mean (0 when empty).
    pub mean: f64,
    /// Population standard deviation, as llama-benchy (numpy `std`) reports it.
    pub std: f64,
    /// Number of values.
    pub n: usize,
}

impl Summary {
    /// Summarise `values`.
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        Self {
            mean,
            std: var.sqrt(),
            n,
        }
    }

    /// Scale mean and std (seconds → milliseconds).
    pub fn scaled(self, k: f64) -> Self {
        Self {
            mean: self.mean * k,
            std: self.std * k,
            n: self.n,
        }
    }
}

/// Mean and the percentiles vllm bench serve prints.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Number of values.
    pub n: usize,
}

impl Percentiles {
    /// Percentiles of `values` (linear interpolation between ranks, as numpy does).
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self {
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
            n: sorted.len(),
        }
    }

    /// Scale every figure (seconds → milliseconds).
    pub fn scaled(self, k: f64) -> Self {
        Self {
            mean: self.mean * k,
            p50: self.p50 * k,
            p90: self.p90 * k,
            p99: self.p99 * k,
            n: self.n,
        }
    }
}

/// `p`-th percentile of sorted values, linear interpolation between closest ranks.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Prompt tokens to credit a request with: the server's count when it is within 20 % of what
/// was sent (it includes the chat template), else the count sent (llama-benchy's rule).
pub fn credited_prompt_tokens(trace: &RequestTrace, expected: u64) -> u64 {
    match trace.prompt_tokens {
        Some(p) if p > 0 && (p.abs_diff(expected) as f64) < expected as f64 * 0.2 => p,
        _ => expected,
    }
}

/// Figures of one request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestMetrics {
    /// Start → first chunk with `choices`.
    pub ttfr_s: Option<f64>,
    /// max(0, ttfr − latency).
    pub est_ppt_s: Option<f64>,
    /// Start → first token-carrying chunk (also vllm's TTFT here).
    pub e2e_ttft_s: Option<f64>,
    /// Credited prompt tokens / est_ppt.
    pub pp_tps: Option<f64>,
    /// Tokens after the first token chunk / (last token arrival − first token arrival).
    pub tg_tps: Option<f64>,
    /// (E2EL − TTFT) / (completion tokens − 1).
    pub tpot_s: Option<f64>,
    /// Start → end of stream.
    pub e2el_s: f64,
    /// Gaps between consecutive token-carrying chunks.
    pub itl_s: Vec<f64>,
}

impl RequestMetrics {
    /// Compute from a usable trace. `latency_s` is the measured network/API latency;
    /// `expected_prompt` the tokens sent (depth + pp).
    pub fn of(trace: &RequestTrace, latency_s: f64, expected_prompt: u64) -> Self {
        let ttfr = trace.first_chunk_s.map(|t| t - trace.start_s);
        let e2e_ttft = trace.first_token_s.map(|t| t - trace.start_s);
        let est_ppt = ttfr.map(|t| (t - latency_s).max(0.0));
        let prompt = credited_prompt_tokens(trace, expected_prompt) as f64;
        let pp_tps = est_ppt.filter(|t| *t > 0.0).map(|t| prompt / t);
        let tg_tps = match (trace.arrivals.first(), trace.arrivals.last()) {
            (Some(first), Some(last)) if last.t_s > first.t_s => {
                let after_first = trace.completion_tokens.saturating_sub(first.tokens as u64);
                (after_first > 0).then(|| after_first as f64 / (last.t_s - first.t_s))
            }
            _ => None,
        };
        let e2el = trace.end_s - trace.start_s;
        let tpot = match e2e_ttft {
            Some(ttft) if trace.completion_tokens > 1 => {
                Some((e2el - ttft) / (trace.completion_tokens - 1) as f64)
            }
            _ => None,
        };
        let itl = trace
            .arrivals
            .windows(2)
            .map(|w| w[1].t_s - w[0].t_s)
            .collect();
        Self {
            ttfr_s: ttfr,
            est_ppt_s: est_ppt,
            e2e_ttft_s: e2e_ttft,
            pp_tps,
            tg_tps,
            tpot_s: tpot,
            e2el_s: e2el,
            itl_s: itl,
        }
    }
}

/// Figures of one concurrent batch (one run of a point).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct BatchMetrics {
    /// First start → last end, seconds.
    pub span_s: f64,
    /// Summed credited prompt tokens / (last first-token − first start).
    pub pp_total_tps: Option<f64>,
    /// Summed tokens after each first token chunk / (last token arrival − first first-token).
    pub tg_total_tps: Option<f64>,
}

impl BatchMetrics {
    /// Compute over the usable traces of one batch.
    pub fn of(traces: &[&RequestTrace], expected_prompt: u64) -> Self {
        if traces.is_empty() {
            return Self::default();
        }
        let min_start = fold(traces.iter().map(|t| t.start_s), f64::min);
        let max_end = fold(traces.iter().map(|t| t.end_s), f64::max);
        let firsts: Vec<f64> = traces.iter().filter_map(|t| t.first_token_s).collect();
        let prompt: u64 = traces
            .iter()
            .map(|t| credited_prompt_tokens(t, expected_prompt))
            .sum();
        let pp_total = (!firsts.is_empty())
            .then(|| fold(firsts.iter().copied(), f64::max) - min_start)
            .filter(|d| *d > 0.0)
            .map(|d| prompt as f64 / d);
        let after_first: u64 = traces
            .iter()
            .map(|t| {
                let first = t.arrivals.first().map_or(0, |a| a.tokens as u64);
                t.completion_tokens.saturating_sub(first)
            })
            .sum();
        let last_token = fold(
            traces
                .iter()
                .filter_map(|t| t.arrivals.last().map(|a| a.t_s)),
            f64::max,
        );
        let tg_total = (!firsts.is_empty() && after_first > 0)
            .then(|| last_token - fold(firsts.iter().copied(), f64::min))
            .filter(|d| *d > 0.0)
            .map(|d| after_first as f64 / d);
        Self {
            span_s: max_end - min_start,
            pp_total_tps: pp_total,
            tg_total_tps: tg_total,
        }
    }
}

fn fold(values: impl Iterator<Item = f64>, f: fn(f64, f64) -> f64) -> f64 {
    let mut it = values;
    let first = it.next().unwrap_or(0.0);
    it.fold(first, f)
}

/// All figures of one grid point over its measured runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PointStats {
    /// Per-request prompt processing speed, t/s.
    pub pp_tps: Summary,
    /// Per-request generation speed, t/s.
    pub tg_tps: Summary,
    /// Per-batch total prompt throughput, t/s (equals `pp_tps` at concurrency 1).
    pub pp_total_tps: Summary,
    /// Per-batch total generation throughput, t/s.
    pub tg_total_tps: Summary,
    /// Time to first response chunk, ms.
    pub ttfr_ms: Summary,
    /// Estimated prompt processing time, ms.
    pub est_ppt_ms: Summary,
    /// Time to first token, ms.
    pub e2e_ttft_ms: Summary,
    /// TTFT (first token), ms.
    pub ttft_ms: Percentiles,
    /// Time per output token, ms.
    pub tpot_ms: Percentiles,
    /// Inter-token (inter-chunk) latency, ms.
    pub itl_ms: Percentiles,
    /// End-to-end request latency, ms.
    pub e2el_ms: Percentiles,
    /// Completed requests / summed batch spans, req/s.
    pub request_throughput: f64,
    /// Output tokens / summed batch spans, t/s.
    pub output_throughput: f64,
    /// (Credited prompt + output tokens) / summed batch spans, t/s.
    pub total_token_throughput: f64,
    /// Requests with usable timings.
    pub completed: usize,
    /// Requests that failed (no usable timings).
    pub failed: usize,
    /// Requests that returned fewer tokens than asked.
    pub ended_early: usize,
    /// How completion tokens were counted (one label per method seen).
    pub count_methods: Vec<String>,
}

impl PointStats {
    /// Compute from the batches (one per measured run) of a point.
    pub fn of(batches: &[Vec<RequestTrace>], latency_s: f64, expected_prompt: u64) -> Self {
        let mut pp = Vec::new();
        let mut tg = Vec::new();
        let mut pp_total = Vec::new();
        let mut tg_total = Vec::new();
        let mut ttfr = Vec::new();
        let mut est = Vec::new();
        let mut ttft = Vec::new();
        let mut tpot = Vec::new();
        let mut itl = Vec::new();
        let mut e2el = Vec::new();
        let mut span = 0.0;
        let mut out_tokens = 0u64;
        let mut in_tokens = 0u64;
        let mut stats = PointStats::default();
        for batch in batches {
            let usable: Vec<&RequestTrace> = batch.iter().filter(|t| t.usable()).collect();
            stats.failed += batch.len() - usable.len();
            stats.completed += usable.len();
            for t in &usable {
                if t.error.is_some() {
                    stats.ended_early += 1;
                }
                let label = t.count_method.label().to_owned();
                if !stats.count_methods.contains(&label) {
                    stats.count_methods.push(label);
                }
                let m = RequestMetrics::of(t, latency_s, expected_prompt);
                pp.extend(m.pp_tps);
                tg.extend(m.tg_tps);
                ttfr.extend(m.ttfr_s);
                est.extend(m.est_ppt_s.filter(|_| m.e2e_ttft_s.is_some()));
                ttft.extend(m.e2e_ttft_s);
                tpot.extend(m.tpot_s);
                itl.extend(m.itl_s);
                e2el.push(m.e2el_s);
                out_tokens += t.completion_tokens;
                in_tokens += credited_prompt_tokens(t, expected_prompt);
            }
            let b = BatchMetrics::of(&usable, expected_prompt);
            span += b.span_s;
            pp_total.extend(b.pp_total_tps);
            tg_total.extend(b.tg_total_tps);
        }
        stats.pp_tps = Summary::of(&pp);
        stats.tg_tps = Summary::of(&tg);
        stats.pp_total_tps = Summary::of(&pp_total);
        stats.tg_total_tps = Summary::of(&tg_total);
        stats.ttfr_ms = Summary::of(&ttfr).scaled(1e3);
        stats.est_ppt_ms = Summary::of(&est).scaled(1e3);
        stats.e2e_ttft_ms = Summary::of(&ttft).scaled(1e3);
        stats.ttft_ms = Percentiles::of(&ttft).scaled(1e3);
        stats.tpot_ms = Percentiles::of(&tpot).scaled(1e3);
        stats.itl_ms = Percentiles::of(&itl).scaled(1e3);
        stats.e2el_ms = Percentiles::of(&e2el).scaled(1e3);
        if span > 0.0 {
            stats.request_throughput = stats.completed as f64 / span;
            stats.output_throughput = out_tokens as f64 / span;
            stats.total_token_throughput = (in_tokens + out_tokens) as f64 / span;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::trace::{Arrival, CountMethod, ErrorKind, RequestError};

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    /// Start 1.0; role chunk 1.2; tokens at 1.5 (1), 1.6 (2), 1.8 (1), 2.0 (2); end 2.1.
    fn trace() -> RequestTrace {
        RequestTrace {
            start_s: 1.0,
            first_chunk_s: Some(1.2),
            first_token_s: Some(1.5),
            arrivals: vec![
                Arrival {
                    t_s: 1.5,
                    tokens: 1,
                },
                Arrival {
                    t_s: 1.6,
                    tokens: 2,
                },
                Arrival {
                    t_s: 1.8,
                    tokens: 1,
                },
                Arrival {
                    t_s: 2.0,
                    tokens: 2,
                },
            ],
            end_s: 2.1,
            prompt_tokens: Some(110),
            completion_tokens: 6,
            count_method: CountMethod::TokenIds,
            usage_completion_tokens: Some(6),
            requested_tokens: 6,
            finish_reason: Some("length".into()),
            error: None,
            content: String::new(),
            reasoning: String::new(),
            logprobs: vec![],
            invalid_logprobs: false,
        }
    }

    #[test]
    fn request_metrics_match_hand_computation() {
        let m = RequestMetrics::of(&trace(), 0.05, 100);
        close(m.ttfr_s.unwrap(), 0.2);
        close(m.est_ppt_s.unwrap(), 0.15);
        close(m.e2e_ttft_s.unwrap(), 0.5);
        // 110 is within 20 % of 100, so the server's count is credited.
        close(m.pp_tps.unwrap(), 110.0 / 0.15);
        // 5 tokens after the first chunk over 0.5 s.
        close(m.tg_tps.unwrap(), 10.0);
        // (1.1 − 0.5) / 5
        close(m.tpot_s.unwrap(), 0.12);
        close(m.e2el_s, 1.1);
        let expect = [0.1, 0.2, 0.2];
        assert_eq!(m.itl_s.len(), 3);
        for (a, b) in m.itl_s.iter().zip(expect) {
            close(*a, b);
        }
    }

    #[test]
    fn far_off_usage_is_not_credited() {
        let t = trace();
        assert_eq!(credited_prompt_tokens(&t, 50), 50);
        assert_eq!(credited_prompt_tokens(&t, 100), 110);
    }

    #[test]
    fn latency_larger_than_ttfr_gives_no_pp_speed() {
        let m = RequestMetrics::of(&trace(), 0.3, 100);
        close(m.est_ppt_s.unwrap(), 0.0);
        assert!(m.pp_tps.is_none());
    }

    #[test]
    fn batch_metrics_use_the_batch_span() {
        let a = trace();
        let mut b = trace();
        // Second request: start 1.1, first token 1.7, last token 2.4, end 2.5, 4 tokens.
        b.start_s = 1.1;
        b.first_token_s = Some(1.7);
        b.arrivals = vec![
            Arrival {
                t_s: 1.7,
                tokens: 1,
            },
            Arrival {
                t_s: 2.4,
                tokens: 3,
            },
        ];
        b.completion_tokens = 4;
        b.end_s = 2.5;
        let m = BatchMetrics::of(&[&a, &b], 100);
        close(m.span_s, 1.5);
        // (110 + 110) / (1.7 − 1.0)
        close(m.pp_total_tps.unwrap(), 220.0 / 0.7);
        // (5 + 3) / (2.4 − 1.5)
        close(m.tg_total_tps.unwrap(), 8.0 / 0.9);
    }

    #[test]
    fn summary_and_percentiles() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        close(s.mean, 5.0);
        close(s.std, 2.0);
        assert_eq!(s.n, 8);
        let p = Percentiles::of(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        close(p.p50, 3.0);
        close(p.p90, 4.6);
        close(p.p99, 4.96);
        close(p.mean, 3.0);
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn point_stats_aggregate_runs_and_count_failures() {
        let mut failed = trace();
        failed.error = Some(RequestError {
            kind: ErrorKind::Http,
            message: "HTTP 500".into(),
        });
        // Shift the second run by 10 s; its figures are the same.
        let mut later = trace();
        for t in [&mut later.start_s, &mut later.end_s] {
            *t += 10.0;
        }
        later.first_chunk_s = Some(11.2);
        later.first_token_s = Some(11.5);
        for a in &mut later.arrivals {
            a.t_s += 10.0;
        }
        let mut short = later.clone();
        short.error = Some(RequestError {
            kind: ErrorKind::TooFewTokens,
            message: "ended early".into(),
        });
        let s = PointStats::of(&[vec![trace(), failed], vec![later, short]], 0.05, 100);
        assert_eq!(s.completed, 3);
        assert_eq!(s.failed, 1);
        assert_eq!(s.ended_early, 1);
        close(s.tg_tps.mean, 10.0);
        close(s.tg_tps.std, 0.0);
        assert_eq!(s.tg_tps.n, 3);
        close(s.ttfr_ms.mean, 200.0);
        close(s.e2e_ttft_ms.mean, 500.0);
        close(s.est_ppt_ms.mean, 150.0);
        close(s.tpot_ms.p50, 120.0);
        assert_eq!(s.itl_ms.n, 9);
        // Spans: run 1 = 1.1 s, run 2 = 1.1 s (two identical overlapping requests).
        close(s.request_throughput, 3.0 / 2.2);
        close(s.output_throughput, 18.0 / 2.2);
        close(s.total_token_throughput, (18.0 + 330.0) / 2.2);
        assert_eq!(s.count_methods, vec!["token_ids".to_string()]);
    }
}

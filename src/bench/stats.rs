//! Metrics from request traces: llama-benchy's pp/tg/ttfr/est_ppt/e2e_ttft and vllm bench
//! serve's TTFT/TPOT/ITL/E2EL and throughputs, filled into the run-record types. Mean, std and
//! percentiles come from `record::stats` (one place for them). Definitions:
//! docs/benchmarking.md.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::trace::RequestTrace;
use crate::record::schema::{
    Arrival as RecordArrival, Latency, PointResult as RecordPoint, RequestTiming, Stats,
    WorkloadPoint,
};

/// Prompt tokens to credit a request with: the server's count when it is within 20 % of what
/// was sent (it includes the chat template), else the count sent (llama-benchy's rule).
pub fn credited_prompt_tokens(trace: &RequestTrace, expected: u64) -> u64 {
    match trace.prompt_tokens {
        Some(p) if p > 0 && (p.abs_diff(expected) as f64) < expected as f64 * 0.2 => p,
        _ => expected,
    }
}

/// llama-benchy figures of one request, seconds and tokens/s.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestMetrics {
    /// Start → first chunk with `choices`.
    pub ttfr_s: Option<f64>,
    /// max(0, ttfr − latency).
    pub est_ppt_s: Option<f64>,
    /// Start → first token-carrying chunk.
    pub e2e_ttft_s: Option<f64>,
    /// Credited prompt tokens / est_ppt.
    pub pp_tps: Option<f64>,
    /// The server's `usage.prompt_tokens` / est_ppt (`None` without usage).
    pub server_pp_tps: Option<f64>,
    /// Tokens after the first token chunk / (last token arrival − first token arrival).
    pub tg_tps: Option<f64>,
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
        let server_pp_tps = match (est_ppt, server_prompt_tokens(trace)) {
            (Some(t), Some(p)) if t > 0.0 => Some(p as f64 / t),
            _ => None,
        };
        let tg_tps = match (trace.arrivals.first(), trace.arrivals.last()) {
            (Some(first), Some(last)) if last.t_s > first.t_s => {
                let after_first = trace.completion_tokens.saturating_sub(first.tokens as u64);
                (after_first > 0).then(|| after_first as f64 / (last.t_s - first.t_s))
            }
            _ => None,
        };
        Self {
            ttfr_s: ttfr,
            est_ppt_s: est_ppt,
            e2e_ttft_s: e2e_ttft,
            pp_tps,
            server_pp_tps,
            tg_tps,
        }
    }
}

/// The server's count of a request's prompt tokens (`usage.prompt_tokens`), when it sent one.
pub fn server_prompt_tokens(trace: &RequestTrace) -> Option<u64> {
    trace.prompt_tokens.filter(|p| *p > 0)
}

/// Figures of one concurrent batch (one run of a point).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct BatchMetrics {
    /// First start → last end, seconds.
    pub span_s: f64,
    /// Summed credited prompt tokens / (last first-token − first start).
    pub pp_total_tps: Option<f64>,
    /// The same with the server's counts (`None` unless every request reported usage).
    pub server_pp_total_tps: Option<f64>,
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
        let pp_span = (!firsts.is_empty())
            .then(|| fold(firsts.iter().copied(), f64::max) - min_start)
            .filter(|d| *d > 0.0);
        let pp_total = pp_span.map(|d| prompt as f64 / d);
        let server_prompt: Option<u64> = traces.iter().map(|t| server_prompt_tokens(t)).sum();
        let server_pp_total = pp_span.zip(server_prompt).map(|(d, p)| p as f64 / d);
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
            server_pp_total_tps: server_pp_total,
            tg_total_tps: tg_total,
        }
    }
}

fn fold(values: impl Iterator<Item = f64>, f: fn(f64, f64) -> f64) -> f64 {
    let mut it = values;
    let first = it.next().unwrap_or(0.0);
    it.fold(first, f)
}

/// A trace as the run record stores it: offsets in ms after the request's own start.
/// A short response (too few tokens) keeps its timings and is counted in `early_ended`;
/// only fatal errors set `error`, which removes the request from the latency statistics.
pub fn to_timing(
    trace: &RequestTrace,
    epoch_wall: DateTime<Utc>,
    run: u32,
    warmup: bool,
    latency_s: f64,
) -> RequestTiming {
    let ms = |t: f64| (t - trace.start_s) * 1e3;
    let start = epoch_wall + chrono::Duration::microseconds((trace.start_s * 1e6).round() as i64);
    RequestTiming {
        run,
        warmup,
        start,
        first_chunk_ms: trace.first_chunk_s.map(ms),
        first_token_ms: trace.first_token_s.map(ms),
        arrivals: trace
            .arrivals
            .iter()
            .map(|a| RecordArrival(ms(a.t_s), a.tokens))
            .collect(),
        end_ms: Some(ms(trace.end_s)),
        latency_ms: Some(latency_s * 1e3),
        prompt_tokens: trace.prompt_tokens.map(|p| p as u32),
        completion_tokens: Some(trace.completion_tokens as u32),
        error: trace
            .error
            .as_ref()
            .filter(|e| e.is_fatal())
            .map(|e| e.message.clone()),
    }
}

/// All figures of one grid point over its measured runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PointStats {
    /// The run-record entry: llama-benchy figures, vllm latencies, throughputs, raw timings.
    pub record: RecordPoint,
    /// Per-batch total prompt throughput, t/s (the record schema has no field for it yet).
    pub pp_total_tps: Option<Stats>,
    /// The same by the server's prompt token counts.
    pub server_pp_total_tps: Option<Stats>,
    /// How completion tokens were counted (one label per method seen).
    pub count_methods: Vec<String>,
}

impl PointStats {
    /// Compute from the batches (one per measured run) of a point. `epoch_wall` is the
    /// wall-clock time of the run epoch the traces' offsets count from.
    pub fn of(
        point: WorkloadPoint,
        batches: &[Vec<RequestTrace>],
        latency_s: f64,
        epoch_wall: DateTime<Utc>,
    ) -> Self {
        let expected_prompt = u64::from(point.pp) + u64::from(point.depth);
        let mut pp = Vec::new();
        let mut tg = Vec::new();
        let mut pp_total = Vec::new();
        let mut server_pp = Vec::new();
        let mut server_prompt = Vec::new();
        let mut server_pp_total = Vec::new();
        let mut tg_total = Vec::new();
        let mut ttfr = Vec::new();
        let mut est = Vec::new();
        let mut ttft = Vec::new();
        let mut span = 0.0;
        let mut out_tokens = 0u64;
        let mut in_tokens = 0u64;
        let mut count_methods: Vec<String> = Vec::new();
        let mut rec = RecordPoint {
            point,
            ..RecordPoint::default()
        };
        for (run, batch) in batches.iter().enumerate() {
            let usable: Vec<&RequestTrace> = batch.iter().filter(|t| t.usable()).collect();
            rec.requests += batch.len() as u32;
            rec.errors += (batch.len() - usable.len()) as u32;
            for t in batch {
                rec.requests_raw
                    .push(to_timing(t, epoch_wall, run as u32, false, latency_s));
            }
            for t in &usable {
                if t.error.is_some() {
                    rec.early_ended += 1;
                }
                let label = t.count_method.label().to_owned();
                if !count_methods.contains(&label) {
                    count_methods.push(label);
                }
                let m = RequestMetrics::of(t, latency_s, expected_prompt);
                pp.extend(m.pp_tps);
                server_pp.extend(m.server_pp_tps);
                server_prompt.extend(server_prompt_tokens(t).map(|p| p as f64));
                tg.extend(m.tg_tps);
                ttfr.extend(m.ttfr_s.map(|s| s * 1e3));
                // est_ppt only where a token arrived, as llama-benchy does.
                est.extend(
                    m.est_ppt_s
                        .filter(|_| m.e2e_ttft_s.is_some())
                        .map(|s| s * 1e3),
                );
                ttft.extend(m.e2e_ttft_s.map(|s| s * 1e3));
                out_tokens += t.completion_tokens;
                in_tokens += credited_prompt_tokens(t, expected_prompt);
            }
            let b = BatchMetrics::of(&usable, expected_prompt);
            span += b.span_s;
            pp_total.extend(b.pp_total_tps);
            server_pp_total.extend(b.server_pp_total_tps);
            tg_total.extend(b.tg_total_tps);
        }
        rec.pp_tps = Stats::from_samples(&pp);
        rec.server_prompt_tokens = Stats::from_samples(&server_prompt);
        rec.server_pp_tps = Stats::from_samples(&server_pp);
        rec.tg_tps = Stats::from_samples(&tg);
        rec.total_tg_tps = Stats::from_samples(&tg_total);
        rec.ttfr_ms = Stats::from_samples(&ttfr);
        rec.est_ppt_ms = Stats::from_samples(&est);
        rec.e2e_ttft_ms = Stats::from_samples(&ttft);
        rec.latency = Latency::from_requests(&rec.requests_raw);
        if span > 0.0 {
            let completed = rec.requests - rec.errors;
            rec.request_throughput = Some(f64::from(completed) / span);
            rec.output_throughput = Some(out_tokens as f64 / span);
            rec.total_token_throughput = Some((in_tokens + out_tokens) as f64 / span);
        }
        Self {
            record: rec,
            pp_total_tps: Stats::from_samples(&pp_total),
            server_pp_total_tps: Stats::from_samples(&server_pp_total),
            count_methods,
        }
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
    }

    #[test]
    fn far_off_usage_is_not_credited() {
        let t = trace();
        assert_eq!(credited_prompt_tokens(&t, 50), 50);
        assert_eq!(credited_prompt_tokens(&t, 100), 110);
    }

    #[test]
    fn the_server_count_gives_its_own_pp_figure_wherever_it_lies() {
        // 110 counted by the server for 50 sent (a chat template of 60 tokens): pp t/s
        // credits the 50 sent, the server figure the 110.
        let m = RequestMetrics::of(&trace(), 0.05, 50);
        close(m.pp_tps.unwrap(), 50.0 / 0.15);
        close(m.server_pp_tps.unwrap(), 110.0 / 0.15);
        // Within 20 % the two agree.
        let m = RequestMetrics::of(&trace(), 0.05, 100);
        close(m.server_pp_tps.unwrap(), m.pp_tps.unwrap());
        // No usage: no server figure.
        let mut t = trace();
        t.prompt_tokens = None;
        let m = RequestMetrics::of(&t, 0.05, 50);
        assert!(m.pp_tps.is_some());
        assert_eq!(m.server_pp_tps, None);
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
        close(m.server_pp_total_tps.unwrap(), 220.0 / 0.7);
        // Far from the 50 sent: credited 50 each, the server figure keeps its 110s.
        let far = BatchMetrics::of(&[&a, &b], 50);
        close(far.pp_total_tps.unwrap(), 100.0 / 0.7);
        close(far.server_pp_total_tps.unwrap(), 220.0 / 0.7);
        // A request without usage: no batch figure from server counts.
        b.prompt_tokens = None;
        assert_eq!(BatchMetrics::of(&[&a, &b], 100).server_pp_total_tps, None);
        // (5 + 3) / (2.4 − 1.5)
        close(m.tg_total_tps.unwrap(), 8.0 / 0.9);
    }

    #[test]
    fn timings_are_ms_after_the_request_start() {
        let epoch = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let r = to_timing(&trace(), epoch, 2, false, 0.05);
        assert_eq!(r.start.to_rfc3339(), "2026-01-01T00:00:01+00:00");
        close(r.first_chunk_ms.unwrap(), 200.0);
        close(r.first_token_ms.unwrap(), 500.0);
        close(r.arrivals[3].0, 1000.0);
        assert_eq!(r.arrivals[1].1, 2);
        close(r.end_ms.unwrap(), 1100.0);
        close(r.latency_ms.unwrap(), 50.0);
        assert_eq!((r.run, r.completion_tokens, r.error), (2, Some(6), None));
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
        let point = WorkloadPoint {
            pp: 60,
            tg: 6,
            depth: 40,
            concurrency: 2,
        };
        let s = PointStats::of(
            point,
            &[vec![trace(), failed], vec![later, short]],
            0.05,
            Utc::now(),
        );
        let r = &s.record;
        assert_eq!((r.requests, r.errors, r.early_ended), (4, 1, 1));
        assert_eq!(r.requests_raw.len(), 4);
        let tg = r.tg_tps.unwrap();
        close(tg.mean, 10.0);
        close(tg.std, 0.0);
        assert_eq!(tg.n, 3);
        close(r.ttfr_ms.unwrap().mean, 200.0);
        close(r.e2e_ttft_ms.unwrap().mean, 500.0);
        close(r.est_ppt_ms.unwrap().mean, 150.0);
        // vllm TPOT = (1100 − 500) / 5 ms for each of the 3 usable requests.
        let tpot = r.latency.tpot_ms.unwrap();
        assert_eq!(tpot.n, 3);
        close(tpot.p50, 120.0);
        assert_eq!(r.latency.itl_ms.unwrap().n, 9);
        close(r.latency.e2el_ms.unwrap().p99, 1100.0);
        // Spans: run 1 = 1.1 s, run 2 = 1.1 s (two identical overlapping requests).
        close(r.request_throughput.unwrap(), 3.0 / 2.2);
        close(r.output_throughput.unwrap(), 18.0 / 2.2);
        close(r.total_token_throughput.unwrap(), (18.0 + 330.0) / 2.2);
        // Run 1 batch: one usable request → 110 / 0.5; run 2: two → 220 / 0.5.
        let ppt = s.pp_total_tps.unwrap();
        close(ppt.mean, (220.0 + 440.0) / 2.0);
        let tgt = r.total_tg_tps.unwrap();
        // Run 1: 5 / 0.5 = 10; run 2: 10 / 0.5 = 20.
        close(tgt.mean, 15.0);
        assert_eq!(s.count_methods, vec!["token_ids".to_string()]);
        // The server counted 110 for each of the 3 usable requests.
        let sp = r.server_prompt_tokens.unwrap();
        assert_eq!(sp.n, 3);
        close(sp.mean, 110.0);
        close(r.server_pp_tps.unwrap().mean, 110.0 / 0.15);
        close(s.server_pp_total_tps.unwrap().mean, (220.0 + 440.0) / 2.0);
    }
}

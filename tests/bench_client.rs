//! The bench client against a real HTTP server on 127.0.0.1 (a vLLM-like double): recorded
//! timestamps, token counting, every statistic recomputed by hand from the client's own
//! timestamps, faults, cancel, levels, and 256 concurrent streams.

#[path = "support/vllm_double.rs"]
mod double;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use double::{Fault, Script, WORDS};
use mxtune::bench::client::{BenchClient, ClientConfig, Endpoint, PromptBody, RequestSpec};
use mxtune::bench::levels::{CorrectnessPlan, MemoryProbe, StressPlan, performance_report};
use mxtune::bench::prompt::Prompt;
use mxtune::bench::stats::credited_prompt_tokens;
use mxtune::bench::trace::{CountMethod, ErrorKind, RequestTrace};
use mxtune::bench::workload::{BenchEvent, Cancel, LatencyMode, Runner, Workload, finish_point};
use mxtune::record::schema::WorkloadPoint;

/// Read timeout generous enough for a loaded 2-core machine running tests in parallel.
fn client(url: &str) -> BenchClient {
    client_with(url, Duration::from_secs(10))
}

fn client_with(url: &str, read_timeout: Duration) -> BenchClient {
    let mut cfg = ClientConfig::new(url);
    cfg.read_timeout = read_timeout;
    cfg.connect_timeout = Duration::from_secs(5);
    BenchClient::new(&cfg).unwrap()
}

fn runner(url: &str) -> Runner {
    let (cancel, watch) = Cancel::new();
    // Keep the sender alive for the test's duration so `cancelled()` stays pending.
    std::mem::forget(cancel);
    Runner {
        client: client(url),
        model: "double-model".into(),
        events: None,
        cancel: watch,
    }
}

fn spec(endpoint: Endpoint, pp: usize, depth: usize, tg: u32) -> RequestSpec {
    RequestSpec {
        endpoint,
        model: "double-model".into(),
        prompt: PromptBody::Text(Prompt::build(pp, depth, None).unwrap()),
        max_tokens: tg,
        exact_output: true,
        temperature: None,
        seed: None,
        logprobs: false,
        stop: Vec::new(),
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} != {b}");
}

fn words(range: std::ops::Range<usize>, offset: usize) -> String {
    range.map(|i| WORDS[(i + offset) % WORDS.len()]).collect()
}

#[tokio::test]
async fn chat_stream_records_role_chunk_reasoning_and_multi_token_chunks() {
    let d = double::spawn(Script {
        tokens_per_chunk: 3,
        reasoning_tokens: 4,
        ..Script::default()
    })
    .await;
    let t = client(&d.url)
        .stream(&spec(Endpoint::Chat, 64, 128, 10), Instant::now())
        .await;
    assert_eq!(t.error, None);
    let first_chunk = t.first_chunk_s.unwrap();
    let first_token = t.first_token_s.unwrap();
    // The role-only chunk counts for ttfr but is not a token.
    assert!(t.start_s <= first_chunk && first_chunk < first_token);
    assert_eq!(
        t.arrivals.iter().map(|a| a.tokens).collect::<Vec<_>>(),
        vec![3, 3, 3, 1]
    );
    assert_eq!(t.arrivals[0].t_s, first_token);
    assert!(t.arrivals.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    assert!(t.end_s >= t.arrivals[3].t_s);
    assert_eq!(t.completion_tokens, 10);
    assert_eq!(t.count_method, CountMethod::TokenIds);
    assert_eq!(t.usage_completion_tokens, Some(10));
    assert_eq!(t.prompt_tokens, Some(192));
    assert_eq!(t.reasoning, words(0..4, 0));
    assert_eq!(t.content, words(4..10, 0));
    assert_eq!(t.finish_reason.as_deref(), Some("length"));
    assert_eq!(d.posts(), 1);
}

#[tokio::test]
async fn reasoning_field_without_token_ids_counts_from_usage() {
    let d = double::spawn(Script {
        tokens_per_chunk: 2,
        reasoning_tokens: 8,
        reasoning_field: "reasoning",
        honour_token_ids: false,
        ..Script::default()
    })
    .await;
    let t = client(&d.url)
        .stream(&spec(Endpoint::Chat, 32, 0, 8), Instant::now())
        .await;
    assert_eq!(t.error, None);
    assert_eq!(t.count_method, CountMethod::Usage);
    assert_eq!(t.completion_tokens, 8);
    assert_eq!(t.arrivals.len(), 4);
    assert_eq!(t.reasoning, words(0..8, 0));
    assert!(t.content.is_empty());
    // With usage only, the first chunk is assumed to carry one token: 7 over the span.
    let m = mxtune::bench::stats::RequestMetrics::of(&t, 0.0, 32);
    close(
        m.tg_tps.unwrap(),
        7.0 / (t.arrivals[3].t_s - t.arrivals[0].t_s),
    );
}

#[tokio::test]
async fn without_usage_or_ids_chunks_are_counted_and_logprobs_count_exactly() {
    let d = double::spawn(Script {
        tokens_per_chunk: 2,
        honour_token_ids: false,
        usage: false,
        ..Script::default()
    })
    .await;
    let c = client(&d.url);
    let t = c
        .stream(&spec(Endpoint::Chat, 16, 0, 6), Instant::now())
        .await;
    assert_eq!(t.count_method, CountMethod::Chunks);
    // Three chunks of two tokens counted as three: the method llama-benchy's docs warn about,
    // so the short count is reported.
    assert_eq!(t.completion_tokens, 3);
    assert_eq!(t.error.unwrap().kind, ErrorKind::TooFewTokens);
    let mut s = spec(Endpoint::Chat, 16, 0, 6);
    s.logprobs = true;
    let t = c.stream(&s, Instant::now()).await;
    assert_eq!(t.count_method, CountMethod::Logprobs);
    assert_eq!(t.completion_tokens, 6);
    assert_eq!(t.logprobs, vec![-0.25; 6]);
    assert_eq!(t.error, None);
}

#[tokio::test]
async fn completions_endpoint_with_text_and_token_ids() {
    let d = double::spawn(Script::default()).await;
    let c = client(&d.url);
    let mut s = spec(Endpoint::Completions, 50, 30, 5);
    let t = c.stream(&s, Instant::now()).await;
    assert_eq!(t.error, None);
    assert_eq!(t.content, words(0..5, 0));
    assert_eq!(t.completion_tokens, 5);
    s.prompt = PromptBody::TokenIds(Prompt::build(50, 30, None).unwrap());
    let t = c.stream(&s, Instant::now()).await;
    assert_eq!(t.prompt_tokens, Some(80));
    assert_eq!(t.error, None);
}

fn expected_tg(t: &RequestTrace) -> f64 {
    let first = t.arrivals.first().unwrap();
    let last = t.arrivals.last().unwrap();
    (t.completion_tokens - first.tokens as u64) as f64 / (last.t_s - first.t_s)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn sample_std(v: &[f64]) -> f64 {
    let m = mean(v);
    if v.len() < 2 {
        return 0.0;
    }
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

#[tokio::test]
async fn grid_statistics_equal_hand_computation_from_recorded_timestamps() {
    let d = double::spawn(Script {
        tokens_per_chunk: 2,
        reasoning_tokens: 3,
        ..Script::default()
    })
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut r = runner(&d.url);
    r.events = Some(tx);
    let w = Workload {
        pp: vec![64],
        tg: vec![7],
        depth: vec![0, 100],
        concurrency: vec![1, 3],
        runs: 2,
        warmup: 1,
        no_cache: true,
        latency_mode: LatencyMode::Api,
        endpoint: Endpoint::Chat,
        token_ids: false,
        exact_output: true,
        logprobs: false,
    };
    let mut seen_points = 0;
    let res = r.run(&w, |_| seen_points += 1).await.unwrap();
    assert!(!res.aborted);
    assert_eq!(res.points.len(), 4);
    assert_eq!(seen_points, 4);
    assert!(res.latency_s > 0.0);

    // api latency uses GET, so only the 24 generation requests are POSTs.
    assert_eq!(d.posts(), 24);
    let lat = res.latency_s;
    for p in &res.points {
        let pt = p.point;
        let expected_prompt = u64::from(pt.pp + pt.depth);
        let rec = &p.stats.record;
        let all: Vec<&RequestTrace> = p.runs.iter().flatten().collect();
        assert_eq!(all.len(), 2 * pt.concurrency as usize);
        assert_eq!(rec.requests as usize, all.len());
        assert_eq!((rec.errors, rec.early_ended), (0, 0));
        for t in &all {
            assert_eq!(t.completion_tokens, 7);
            assert_eq!(t.prompt_tokens, Some(expected_prompt));
            assert_eq!(credited_prompt_tokens(t, expected_prompt), expected_prompt);
        }
        // llama-benchy figures, by hand from the timestamps the client took.
        let ttfr: Vec<f64> = all
            .iter()
            .map(|t| (t.first_chunk_s.unwrap() - t.start_s) * 1e3)
            .collect();
        let ttft: Vec<f64> = all
            .iter()
            .map(|t| (t.first_token_s.unwrap() - t.start_s) * 1e3)
            .collect();
        let est: Vec<f64> = ttfr.iter().map(|x| (x - lat * 1e3).max(0.0)).collect();
        let pp: Vec<f64> = est
            .iter()
            .filter(|e| **e > 0.0)
            .map(|e| expected_prompt as f64 / (e / 1e3))
            .collect();
        let tg: Vec<f64> = all.iter().map(|t| expected_tg(t)).collect();
        close(rec.ttfr_ms.unwrap().mean, mean(&ttfr));
        close(rec.ttfr_ms.unwrap().std, sample_std(&ttfr));
        close(rec.e2e_ttft_ms.unwrap().mean, mean(&ttft));
        close(rec.est_ppt_ms.unwrap().mean, mean(&est));
        if !pp.is_empty() {
            close(rec.pp_tps.unwrap().mean, mean(&pp));
            close(rec.pp_tps.unwrap().std, sample_std(&pp));
        }
        close(rec.tg_tps.unwrap().mean, mean(&tg));
        close(rec.tg_tps.unwrap().std, sample_std(&tg));
        assert_eq!(rec.tg_tps.unwrap().n, all.len());
        // Batch totals.
        let mut tg_tot = Vec::new();
        let mut pp_tot = Vec::new();
        let mut span = 0.0;
        for b in &p.runs {
            let start = b.iter().map(|t| t.start_s).fold(f64::MAX, f64::min);
            let end = b.iter().map(|t| t.end_s).fold(f64::MIN, f64::max);
            let first_min = b
                .iter()
                .map(|t| t.first_token_s.unwrap())
                .fold(f64::MAX, f64::min);
            let first_max = b
                .iter()
                .map(|t| t.first_token_s.unwrap())
                .fold(f64::MIN, f64::max);
            let last = b
                .iter()
                .map(|t| t.arrivals.last().unwrap().t_s)
                .fold(f64::MIN, f64::max);
            let generated: u64 = b
                .iter()
                .map(|t| t.completion_tokens - t.arrivals[0].tokens as u64)
                .sum();
            tg_tot.push(generated as f64 / (last - first_min));
            pp_tot.push((expected_prompt * b.len() as u64) as f64 / (first_max - start));
            span += end - start;
        }
        close(rec.total_tg_tps.unwrap().mean, mean(&tg_tot));
        close(p.stats.pp_total_tps.unwrap().mean, mean(&pp_tot));
        // vllm bench serve figures.
        let n = all.len() as f64;
        close(rec.request_throughput.unwrap(), n / span);
        close(rec.output_throughput.unwrap(), 7.0 * n / span);
        close(
            rec.total_token_throughput.unwrap(),
            (7 + expected_prompt) as f64 * n / span,
        );
        let e2el: Vec<f64> = all.iter().map(|t| (t.end_s - t.start_s) * 1e3).collect();
        let tpot: Vec<f64> = all
            .iter()
            .map(|t| (t.end_s - t.first_token_s.unwrap()) * 1e3 / 6.0)
            .collect();
        let itl: Vec<f64> = all
            .iter()
            .flat_map(|t| t.arrivals.windows(2).map(|w| (w[1].t_s - w[0].t_s) * 1e3))
            .collect();
        let l = &rec.latency;
        assert_eq!(l.itl_ms.unwrap().n, itl.len());
        // 7 tokens in chunks of 2 → 4 chunks → 3 gaps per request.
        assert_eq!(itl.len(), 3 * all.len());
        close(l.itl_ms.unwrap().mean, mean(&itl));
        close(l.e2el_ms.unwrap().mean, mean(&e2el));
        close(l.tpot_ms.unwrap().mean, mean(&tpot));
        close(l.ttft_ms.unwrap().mean, mean(&ttft));
        let mut sorted = e2el.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = 0.5 * (sorted.len() - 1) as f64;
        let median = sorted[rank.floor() as usize]
            + (sorted[rank.ceil() as usize] - sorted[rank.floor() as usize]) * rank.fract();
        close(l.e2el_ms.unwrap().p50, median);
        assert_eq!(rec.requests_raw.len(), all.len());
        assert_eq!(p.stats.count_methods, vec!["token_ids".to_string()]);
    }
    let mut started = 0;
    let mut done_requests = 0;
    let mut finished = false;
    while let Ok(e) = rx.try_recv() {
        match e {
            BenchEvent::PointStarted { .. } => started += 1,
            BenchEvent::RequestDone { error, .. } => {
                assert!(error.is_none());
                done_requests += 1;
            }
            BenchEvent::Finished { aborted } => finished = !aborted,
            _ => {}
        }
    }
    assert_eq!((started, done_requests, finished), (4, 24, true));
    // The double sends its role chunk after the scripted prefill, as vLLM does.
    assert!(res.warnings.is_empty(), "{:?}", res.warnings);
    assert!(performance_report(&res).passed);
}

async fn one(script: Script, tg: u32) -> (RequestTrace, usize) {
    let d = double::spawn(script).await;
    let t = client(&d.url)
        .stream(&spec(Endpoint::Chat, 16, 0, tg), Instant::now())
        .await;
    (t, d.posts())
}

fn fault(f: Fault) -> Script {
    Script {
        fault: f,
        ..Script::default()
    }
}

#[tokio::test]
async fn faults_are_reported_per_request_without_retry() {
    let (t, posts) = one(fault(Fault::Status(500)), 8).await;
    let e = t.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Http);
    assert!(
        e.message.contains("500") && e.message.contains("scripted failure"),
        "{}",
        e.message
    );
    assert_eq!(posts, 1, "a POST must never be retried");

    let (t, _) = one(fault(Fault::Status(404)), 8).await;
    assert!(t.error.unwrap().message.contains("404"));

    let stalled = double::spawn(fault(Fault::StallAfter(2))).await;
    let t = client_with(&stalled.url, Duration::from_millis(300))
        .stream(&spec(Endpoint::Chat, 16, 0, 8), Instant::now())
        .await;
    let posts = stalled.posts();
    let e = t.error.unwrap();
    assert_eq!(e.kind, ErrorKind::ReadTimeout, "{}", e.message);
    assert_eq!(t.arrivals.len(), 2);
    assert_eq!(posts, 1);

    let (t, _) = one(fault(Fault::MalformedAfter(1)), 8).await;
    let e = t.error.clone().unwrap();
    assert_eq!(e.kind, ErrorKind::MalformedSse);
    assert!(e.message.contains("oops"), "{}", e.message);
    assert!(!t.usable());

    let (t, _) = one(fault(Fault::CloseAfter(3)), 8).await;
    assert_eq!(t.error.unwrap().kind, ErrorKind::EarlyClose);
    assert_eq!(t.arrivals.len(), 3);

    let (t, _) = one(fault(Fault::ErrorAfter(1)), 8).await;
    let e = t.error.unwrap();
    assert_eq!(e.kind, ErrorKind::ServerError);
    assert!(e.message.contains("scripted engine error"));

    let (t, _) = one(fault(Fault::Short(3)), 8).await;
    let e = t.error.clone().unwrap();
    assert_eq!(e.kind, ErrorKind::TooFewTokens);
    assert!(
        e.message.contains("5 of 8") && e.message.contains("stop"),
        "{}",
        e.message
    );
    assert!(t.usable(), "a short answer keeps its timings");

    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = client(&format!("http://127.0.0.1:{port}"))
        .stream(&spec(Endpoint::Chat, 16, 0, 8), Instant::now())
        .await;
    let e = t.error.unwrap();
    assert_eq!(e.kind, ErrorKind::Connect);
    assert!(e.message.contains(&port.to_string()), "{}", e.message);
}

#[tokio::test]
async fn nan_logprobs_are_reported() {
    let d = double::spawn(fault(Fault::NanLogprob)).await;
    let mut s = spec(Endpoint::Chat, 16, 0, 4);
    s.logprobs = true;
    let t = client(&d.url).stream(&s, Instant::now()).await;
    let e = t.error.unwrap();
    assert_eq!(e.kind, ErrorKind::MalformedSse);
    assert!(e.message.contains("NaN"), "{}", e.message);
}

#[tokio::test]
async fn grid_runs_on_through_failures_and_keeps_them() {
    let d = double::spawn(fault(Fault::Status(503))).await;
    let r = runner(&d.url);
    let w = Workload {
        pp: vec![16],
        tg: vec![4, 8],
        depth: vec![0],
        concurrency: vec![2],
        runs: 2,
        warmup: 0,
        no_cache: false,
        latency_mode: LatencyMode::Generation,
        endpoint: Endpoint::Chat,
        token_ids: false,
        exact_output: true,
        logprobs: false,
    };
    let res = r.run(&w, |_| {}).await.unwrap();
    assert_eq!(res.points.len(), 2);
    assert!(
        res.warnings[0].contains("latency probe failed"),
        "{:?}",
        res.warnings
    );
    for p in &res.points {
        assert_eq!((p.stats.record.requests, p.stats.record.errors), (4, 4));
        assert_eq!(p.errors.len(), 1);
        assert_eq!(p.errors[0].1, 4);
        assert!(p.stats.record.tg_tps.is_none());
    }
    let report = performance_report(&res);
    assert!(!report.passed);
    assert!(
        report.reasons()[0].contains("4 failed requests"),
        "{:?}",
        report.reasons()
    );
}

#[tokio::test]
async fn cancel_keeps_finished_points_and_marks_the_run_aborted() {
    let d = double::spawn(Script {
        chunk_gap: Duration::from_millis(5),
        ..Script::default()
    })
    .await;
    let (cancel, watch) = Cancel::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let r = Runner {
        client: client(&d.url),
        model: "double-model".into(),
        events: Some(tx),
        cancel: watch,
    };
    let w = Workload {
        pp: vec![16],
        tg: vec![8],
        depth: vec![0, 16, 32, 48],
        concurrency: vec![1],
        runs: 1,
        warmup: 0,
        no_cache: false,
        latency_mode: LatencyMode::None,
        endpoint: Endpoint::Chat,
        token_ids: false,
        exact_output: true,
        logprobs: false,
    };
    let task = tokio::spawn(async move { r.run(&w, |_| {}).await });
    while let Some(e) = rx.recv().await {
        if let BenchEvent::PointDone { index: 0, .. } = e {
            cancel.cancel();
            break;
        }
    }
    let res = task.await.unwrap().unwrap();
    assert!(res.aborted);
    assert!(!res.points.is_empty() && res.points.len() < 4);
    assert!(!res.points[0].partial);
    assert!(!performance_report(&res).passed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustains_256_concurrent_streams_with_correct_counts() {
    let n = 256;
    let d = double::spawn(Script {
        prefill: Duration::from_millis(1),
        first_token: Duration::from_millis(1),
        chunk_gap: Duration::from_millis(1),
        barrier: Some(Arc::new(tokio::sync::Barrier::new(n))),
        ..Script::default()
    })
    .await;
    let mut cfg = ClientConfig::new(&d.url);
    // Generous: on a loaded 2-core machine 256 connections take a while to open.
    cfg.read_timeout = Duration::from_secs(60);
    cfg.connect_timeout = Duration::from_secs(30);
    let (cancel, watch) = Cancel::new();
    let r = Runner {
        client: BenchClient::new(&cfg).unwrap(),
        model: "double-model".into(),
        events: None,
        cancel: watch,
    };
    let specs = (0..n).map(|_| spec(Endpoint::Chat, 32, 0, 32)).collect();
    let wall = Instant::now();
    let traces = r.batch(specs, Instant::now(), 0, false).await.unwrap();
    // Reported for docs/perf.md (`--nocapture`), never asserted.
    println!(
        "256 streams x 32 chunks: {:.3} s wall for {} chunks",
        wall.elapsed().as_secs_f64(),
        n * 32
    );
    drop(cancel);
    assert_eq!(traces.len(), n);
    for t in &traces {
        assert_eq!(t.error, None);
        assert_eq!(t.completion_tokens, 32);
        assert_eq!(t.arrivals.len(), 32);
        assert_eq!(t.count_method, CountMethod::TokenIds);
    }
    // The barrier released only once all 256 were in flight at once.
    assert_eq!(d.posts(), n);
    let point = WorkloadPoint {
        pp: 32,
        tg: 32,
        depth: 0,
        concurrency: n as u32,
    };
    let p = finish_point(point, vec![traces], 0.0, Utc::now(), false);
    assert_eq!(p.stats.record.requests, 256);
    assert_eq!(p.stats.record.errors, 0);
}

#[tokio::test]
async fn correctness_level_passes_and_catches_each_defect() {
    let good = double::spawn(Script::default()).await;
    let report = runner(&good.url)
        .correctness(&CorrectnessPlan::default())
        .await;
    assert!(report.passed, "{:?}", report.reasons());
    assert_eq!(report.checks.len(), 10);
    assert!(report.skipped().is_empty(), "{:?}", report.skipped());
    let stop = report
        .checks
        .iter()
        .find(|c| c.name == "stop string ends the output")
        .unwrap();
    assert!(stop.detail.contains("cut the output"), "{}", stop.detail);

    for (f, check) in [
        (Fault::Degenerate, "no degenerate repetition"),
        (Fault::Unprintable, "non-empty printable text"),
        (Fault::Nondeterministic, "deterministic"),
        (Fault::Short(10), "token count as requested"),
        (Fault::Short(10), "finish reason length"),
        (Fault::NanLogprob, "request 1 completes"),
        (Fault::IgnoreStop, "stop string ends the output"),
    ] {
        let d = double::spawn(fault(f.clone())).await;
        let report = runner(&d.url)
            .correctness(&CorrectnessPlan::default())
            .await;
        assert!(!report.passed, "{f:?} should fail");
        assert!(
            report.reasons().iter().any(|r| r.starts_with(check)),
            "{f:?}: {:?}",
            report.reasons()
        );
    }
}

#[tokio::test]
async fn correctness_level_on_synthetic_weights_skips_the_text_checks_and_keeps_the_rest() {
    // Random tokens: replacement characters and loops mean nothing on synthetic weights.
    for f in [Fault::Unprintable, Fault::Degenerate] {
        let d = double::spawn(Script {
            weights: Some("synthetic"),
            ..fault(f.clone())
        })
        .await;
        let report = runner(&d.url)
            .correctness(&CorrectnessPlan::default())
            .await;
        assert!(report.passed, "{f:?}: {:?}", report.reasons());
        // (The degenerate loop " a is the is" has no four-letter word to stop at, so the
        // stop check says it could not run.)
        let skipped = report.skipped();
        assert_eq!(
            skipped[..2],
            ["non-empty printable text", "no degenerate repetition"]
        );
        assert_eq!(skipped.len(), 2 + usize::from(f == Fault::Degenerate));
        assert!(report.checks[0].detail.starts_with("synthetic"));
        let notes = report.notes();
        assert!(
            notes[0].contains("synthetic weights") && notes[0].contains("skipped"),
            "{notes:?}"
        );
    }
    // Everything that still means something is still checked.
    for (f, check) in [
        (Fault::Nondeterministic, "deterministic"),
        (Fault::Short(10), "token count as requested"),
        (Fault::NanLogprob, "request 1 completes"),
        (Fault::IgnoreStop, "stop string ends the output"),
    ] {
        let d = double::spawn(Script {
            weights: Some("synthetic"),
            ..fault(f.clone())
        })
        .await;
        let report = runner(&d.url)
            .correctness(&CorrectnessPlan::default())
            .await;
        assert!(!report.passed, "{f:?} should fail on synthetic weights too");
        assert!(
            report.reasons().iter().any(|r| r.starts_with(check)),
            "{f:?}: {:?}",
            report.reasons()
        );
    }
    // Weights the server calls a checkpoint keep every check.
    let d = double::spawn(Script {
        weights: Some("checkpoint"),
        ..fault(Fault::Unprintable)
    })
    .await;
    let report = runner(&d.url)
        .correctness(&CorrectnessPlan::default())
        .await;
    assert!(!report.passed && report.skipped().is_empty());
}

struct FakeMemory {
    readings: std::sync::Mutex<Vec<u64>>,
}

impl MemoryProbe for FakeMemory {
    fn used_bytes(&self) -> anyhow::Result<u64> {
        let mut r = self.readings.lock().unwrap();
        Ok(r.remove(0))
    }
    fn describe(&self) -> String {
        "fake GPU memory".into()
    }
}

#[tokio::test]
async fn stress_level_runs_the_plan_and_checks_memory() {
    let d = double::spawn(Script {
        prefill: Duration::from_millis(1),
        first_token: Duration::from_millis(1),
        chunk_gap: Duration::ZERO,
        tokens_per_chunk: 4,
        ..Script::default()
    })
    .await;
    let r = runner(&d.url);
    let plan = StressPlan::default();
    let stable = FakeMemory {
        readings: std::sync::Mutex::new(vec![1000 << 20, 1050 << 20]),
    };
    let report = r.stress(&plan, Some(&stable)).await;
    assert!(report.passed, "{:?}", report.reasons());
    assert_eq!(d.posts(), 100 + 10 + 1);
    assert!(
        report.checks[2].detail.contains("1024 tokens"),
        "{}",
        report.checks[2].detail
    );
    let leaking = FakeMemory {
        readings: std::sync::Mutex::new(vec![1000 << 20, 1200 << 20]),
    };
    let small = StressPlan {
        sequential: 3,
        concurrent: 2,
        long_tokens: 16,
        ..StressPlan::default()
    };
    let report = r.stress(&small, Some(&leaking)).await;
    assert!(!report.passed);
    assert!(
        report.reasons()[0].contains("+20.0 %"),
        "{:?}",
        report.reasons()
    );

    let broken = double::spawn(fault(Fault::Status(500))).await;
    let report = runner(&broken.url).stress(&small, None).await;
    assert_eq!(report.reasons().len(), 3, "{:?}", report.reasons());
}

#[tokio::test]
async fn latency_modes_probe_the_server() {
    let d = double::spawn(Script::default()).await;
    let r = runner(&d.url);
    let none = r.latency(LatencyMode::None, Endpoint::Chat).await.unwrap();
    assert_eq!(none, 0.0);
    assert_eq!(d.posts(), 0);
    let api = r.latency(LatencyMode::Api, Endpoint::Chat).await.unwrap();
    assert!(api > 0.0);
    assert_eq!(d.posts(), 0, "api mode only GETs /v1/models");
    // Generation mode: one warm-up + three timed 1-token requests, each held back by the
    // double's scripted 20 ms prefill before its first chunk.
    let generation = r
        .latency(LatencyMode::Generation, Endpoint::Chat)
        .await
        .unwrap();
    assert!(generation >= 0.020, "{generation}");
    assert_eq!(d.posts(), 4);
}

#[tokio::test]
async fn role_chunk_before_prefill_is_flagged() {
    // Role chunk at once, first token 500 ms later: ttfr says nothing about prefill.
    let d = double::spawn(Script {
        prefill: Duration::ZERO,
        first_token: Duration::from_millis(500),
        ..Script::default()
    })
    .await;
    let w = Workload {
        pp: vec![32],
        tg: vec![4],
        depth: vec![0],
        concurrency: vec![1],
        runs: 2,
        warmup: 0,
        no_cache: false,
        latency_mode: LatencyMode::None,
        endpoint: Endpoint::Chat,
        token_ids: false,
        exact_output: true,
        logprobs: false,
    };
    let res = runner(&d.url).run(&w, |_| {}).await.unwrap();
    let r = &res.points[0].stats.record;
    assert_eq!(
        res.warnings.len(),
        1,
        "{:?} {:?} {:?}",
        res.warnings,
        r.ttfr_ms,
        r.e2e_ttft_ms
    );
    assert!(res.warnings[0].contains("role chunk before prefill"));
}

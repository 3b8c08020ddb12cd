//! Monitor tests: memory-source choice, Prometheus-derived rates, ring bounds, the run
//! summary, a real /metrics server on 127.0.0.1, and the real `mxtune monitor` binary.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use chrono::{TimeZone, Utc};
use mxtune::monitor::collector::{Monitor, MonitorConfig, clamp_rate};
use mxtune::monitor::memory::{DeviceMemory, MemInfo, choose_memory, parse_meminfo};
use mxtune::monitor::prom::{
    CounterRate, ServerReader, Tracker, counter_delta, metrics_url, parse_metrics, tracked,
};
use mxtune::monitor::reading::Reading;
use mxtune::monitor::record::{fill_environment, resources};
use mxtune::monitor::ring::{ChartPoint, Ring, history_for};
use mxtune::monitor::sample::{
    Clocks, GpuMemory, GpuProcess, GpuSample, GpuStatus, HostSample, MemorySource, Sample,
    ServerKind, ServerStatus,
};
use mxtune::monitor::summary::{SERIES_CAPACITY, Summary};
use mxtune::record::schema::Environment;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

// ---------------------------------------------------------------- memory source

fn procs(list: &[(u32, Option<u64>)]) -> Reading<Vec<GpuProcess>> {
    Reading::Value(
        list.iter()
            .map(|&(pid, b)| GpuProcess {
                pid,
                used_bytes: b.map_or(Reading::NotSupported, Reading::Value),
            })
            .collect(),
    )
}

#[test]
fn device_memory_is_used_when_nvml_answers_and_meminfo_is_not_read() {
    let mut consulted = false;
    let m = choose_memory(
        Reading::Value(DeviceMemory {
            used: 10,
            total: 80,
        }),
        || {
            consulted = true;
            Ok(MemInfo {
                total: 1,
                available: 1,
            })
        },
        &procs(&[(7, Some(4))]),
    );
    assert!(!consulted);
    assert_eq!(m.source, MemorySource::Device);
    assert_eq!(m.used_bytes, Reading::Value(10));
    assert_eq!(m.total_bytes, Reading::Value(80));
    assert_eq!(m.process_bytes, Reading::Value(4));
}

#[test]
fn not_supported_device_memory_switches_to_unified_system_memory() {
    // GB10: NVML answers NOT_SUPPORTED for device memory.
    let m = choose_memory(
        Reading::NotSupported,
        || {
            Ok(MemInfo {
                total: 128 << 30,
                available: 100 << 30,
            })
        },
        &procs(&[(11, Some(5 << 30)), (12, Some(3 << 30)), (13, None)]),
    );
    assert_eq!(m.source, MemorySource::Unified);
    assert_eq!(m.used_bytes, Reading::Value(28 << 30));
    assert_eq!(m.total_bytes, Reading::Value(128 << 30));
    assert_eq!(m.process_bytes, Reading::Value(8 << 30));
}

#[test]
fn unified_memory_keeps_the_meminfo_error_and_never_shows_zero() {
    let m = choose_memory(
        Reading::NotSupported,
        || Err(anyhow::anyhow!("reading /proc/meminfo: denied")),
        &Reading::NotSupported,
    );
    assert_eq!(m.source, MemorySource::Unified);
    assert!(matches!(&m.used_bytes, Reading::Error(e) if e.contains("/proc/meminfo")));
    assert_eq!(m.process_bytes, Reading::NotSupported);
}

#[test]
fn a_failed_device_memory_query_stays_an_error_of_the_device() {
    let m = choose_memory(
        Reading::Error("GPU is lost".into()),
        || panic!("meminfo must not be read for a device error"),
        &procs(&[(1, None)]),
    );
    assert_eq!(m.source, MemorySource::Device);
    assert_eq!(m.used_bytes, Reading::Error("GPU is lost".into()));
    // Processes listed without figures: n/a, not 0.
    assert_eq!(m.process_bytes, Reading::NotSupported);
}

#[test]
fn meminfo_parses_kib_lines_and_names_a_missing_key() {
    let text =
        "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   65536000 kB\n";
    let info = parse_meminfo(text).unwrap();
    assert_eq!(info.total, 131_072_000 * 1024);
    assert_eq!(info.available, 65_536_000 * 1024);
    let err = parse_meminfo("MemTotal: 5 kB\n").unwrap_err().to_string();
    assert!(err.contains("MemAvailable"), "{err}");
}

// ---------------------------------------------------------------- Prometheus

const VLLM_TEXT: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="openai/gpt-oss-120b"} 2.0
vllm:num_requests_running{engine="1",model_name="openai/gpt-oss-120b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="openai/gpt-oss-120b"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="openai/gpt-oss-120b"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="openai/gpt-oss-120b"} 0.4
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="openai/gpt-oss-120b"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="openai/gpt-oss-120b"} 500.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
process_cpu_seconds_total 12.5
"#;

#[test]
fn vllm_names_with_colons_parse_and_sum_over_engines() {
    let s = parse_metrics(VLLM_TEXT, |_| true).unwrap();
    assert_eq!(s.sum("vllm:num_requests_running"), Some(3.0));
    assert_eq!(s.sum("vllm:generation_tokens_total"), Some(1500.0));
    let kv = s.mean("vllm:kv_cache_usage_perc").unwrap();
    assert!((kv - 0.3).abs() < 1e-12);
    assert_eq!(s.sum("process_cpu_seconds_total"), Some(12.5));
    assert_eq!(s.sum("vllm:prompt_tokens_total"), None);
}

#[test]
fn only_tracked_metrics_are_parsed_when_asked() {
    let s = parse_metrics(VLLM_TEXT, tracked).unwrap();
    assert_eq!(s.sum("vllm:generation_tokens_total"), Some(1500.0));
    assert_eq!(s.sum("vllm:num_requests_waiting"), Some(4.0));
    assert_eq!(s.sum("process_cpu_seconds_total"), None);
    assert!(tracked("llamacpp:requests_deferred"));
    assert!(tracked("vllm:gpu_cache_usage_perc"));
    assert!(!tracked("vllm:time_to_first_token_seconds_bucket"));
    assert!(!tracked(""));
}

#[test]
fn counter_delta_treats_a_drop_as_a_restart() {
    assert_eq!(counter_delta(100.0, 150.0), 50.0);
    assert_eq!(counter_delta(100.0, 30.0), 30.0);
    assert_eq!(counter_delta(5.0, 5.0), 0.0);
}

#[test]
fn counter_rate_spans_the_window_and_survives_a_reset() {
    let mut c = CounterRate::new(1.0);
    c.observe(0.0, 1000.0);
    assert_eq!(c.rate(), None);
    c.observe(0.5, 1050.0);
    assert_eq!(c.rate(), Some(100.0));
    c.observe(1.0, 1100.0);
    assert_eq!(c.rate(), Some(100.0));
    // Server restarted: counter falls to 40, i.e. 40 tokens since the restart.
    assert_eq!(c.observe(1.5, 40.0), 40.0);
    // Window start is t=0.5 (total 50); now total 140: 90 tokens in 1.0 s.
    assert_eq!(c.rate(), Some(90.0));
    assert_eq!(c.total(), 140.0);
    // Many observations keep the point list bounded by the window.
    for i in 0..10_000 {
        c.observe(2.0 + f64::from(i) * 0.05, 40.0 + f64::from(i));
    }
    assert!(c.points_kept() <= 22, "{}", c.points_kept());
    assert!((c.rate().unwrap() - 20.0).abs() < 1e-6);
}

fn vllm_scrape(
    generation: f64,
    prompt: f64,
    accepted: f64,
    draft_tokens: f64,
    drafts: f64,
) -> String {
    format!(
        "vllm:generation_tokens_total{{model_name=\"m\"}} {generation}\n\
         vllm:prompt_tokens_total{{model_name=\"m\"}} {prompt}\n\
         vllm:num_requests_running{{model_name=\"m\"}} 1\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} 0\n\
         vllm:spec_decode_num_accepted_tokens_total{{model_name=\"m\"}} {accepted}\n\
         vllm:spec_decode_num_draft_tokens_total{{model_name=\"m\"}} {draft_tokens}\n\
         vllm:spec_decode_num_drafts_total{{model_name=\"m\"}} {drafts}\n"
    )
}

#[test]
fn tracker_derives_tok_s_and_spec_decode_acceptance() {
    let mut t = Tracker::new(1.0);
    let first = t.update(
        "u",
        0.0,
        &parse_metrics(&vllm_scrape(0.0, 0.0, 100.0, 300.0, 100.0), tracked).unwrap(),
    );
    assert_eq!(first.kind, ServerKind::Vllm);
    assert_eq!(first.generation_tok_s, Reading::NotSupported);
    // No drafting since the monitor started yet: n/a, not 0.
    assert_eq!(first.spec_acceptance_rate, Reading::NotSupported);
    assert_eq!(first.kv_cache_usage, Reading::NotSupported);
    let m = t.update(
        "u",
        2.0,
        &parse_metrics(&vllm_scrape(120.0, 4000.0, 160.0, 390.0, 130.0), tracked).unwrap(),
    );
    assert_eq!(m.generation_tok_s, Reading::Value(60.0));
    assert_eq!(m.prompt_tok_s, Reading::Value(2000.0));
    assert_eq!(m.running, Reading::Value(1.0));
    assert_eq!(m.waiting, Reading::Value(0.0));
    // 60 accepted of 90 proposed; 30 drafts: 1 + 60/30 = 3.
    assert_eq!(m.spec_acceptance_rate.get(), Some(60.0 / 90.0));
    assert_eq!(m.spec_mean_acceptance_length, Reading::Value(3.0));
    // Restart: all counters fall back; growth since restart counts.
    let r = t.update(
        "u",
        3.0,
        &parse_metrics(&vllm_scrape(30.0, 0.0, 30.0, 30.0, 10.0), tracked).unwrap(),
    );
    assert_eq!(r.generation_tok_s, Reading::Value(30.0));
    assert_eq!(r.spec_acceptance_rate.get(), Some(90.0 / 120.0));
    assert_eq!(
        r.spec_mean_acceptance_length,
        Reading::Value(1.0 + 90.0 / 40.0)
    );
}

#[test]
fn tracker_reads_llama_cpp_names() {
    let text = |tokens: u32| {
        format!(
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n\
             # TYPE llamacpp:tokens_predicted_total counter\n\
             llamacpp:tokens_predicted_total {tokens}\n\
             llamacpp:prompt_tokens_total 512\n\
             llamacpp:requests_processing 2\n\
             llamacpp:requests_deferred 5\n"
        )
    };
    let mut t = Tracker::new(1.0);
    t.update("u", 0.0, &parse_metrics(&text(100), tracked).unwrap());
    let m = t.update("u", 1.0, &parse_metrics(&text(158), tracked).unwrap());
    assert_eq!(m.kind, ServerKind::LlamaCpp);
    assert_eq!(m.generation_tok_s, Reading::Value(58.0));
    assert_eq!(m.prompt_tok_s, Reading::Value(0.0));
    assert_eq!(m.running, Reading::Value(2.0));
    assert_eq!(m.waiting, Reading::Value(5.0));
    assert_eq!(m.kv_cache_usage, Reading::NotSupported);
    assert_eq!(m.spec_acceptance_rate, Reading::NotSupported);
}

#[test]
fn a_server_with_other_metrics_only_reads_not_available() {
    let mut t = Tracker::new(1.0);
    let m = t.update(
        "u",
        0.0,
        &parse_metrics("http_requests_total 4\n", |_| true).unwrap(),
    );
    assert_eq!(m.kind, ServerKind::Unknown);
    assert_eq!(m.generation_tok_s, Reading::NotSupported);
    assert_eq!(m.running, Reading::NotSupported);
}

/// The bundled engine's /metrics (the shape of `src/engine/server/metrics.rs` `render()`,
/// trimmed to the series that matter here): counters and gauges with vLLM's labels, and the
/// two TPOT histograms with their buckets, `_sum` and `_count`. No prefix-cache counters.
fn engine_scrape(generation: u64, tpot_sum: f64, tpot_count: u64, itl_sum: f64) -> String {
    let l = "model_name=\"syn\\\"tiny\",engine=\"0\"";
    format!(
        "# HELP vllm:num_requests_running Number of requests in the running batch.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{{l}}} 2\n\
         # HELP vllm:num_requests_waiting Number of requests waiting for admission.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{{l}}} 0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage as a fraction (1 = full).\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{{l}}} 0.25\n\
         # HELP vllm:generation_tokens_total Number of generated tokens.\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{{l}}} {generation}\n\
         # HELP vllm:cache_config_info Information of the KV cache (this engine reserves positions, so a block is one position; no prefix caching).\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"1\",enable_prefix_caching=\"False\",engine=\"0\",num_gpu_blocks=\"4096\"}} 1.0\n\
         # HELP vllm:time_per_output_token_seconds Time between consecutive generated tokens (vLLM's older name of vllm:inter_token_latency_seconds).\n\
         # TYPE vllm:time_per_output_token_seconds histogram\n\
         vllm:time_per_output_token_seconds_bucket{{{l},le=\"0.01\"}} 0\n\
         vllm:time_per_output_token_seconds_bucket{{{l},le=\"+Inf\"}} {generation}\n\
         vllm:time_per_output_token_seconds_sum{{{l}}} {itl_sum}\n\
         vllm:time_per_output_token_seconds_count{{{l}}} {generation}\n\
         # HELP vllm:request_time_per_output_token_seconds Mean time per output token of each finished request (decode time over the tokens after the first).\n\
         # TYPE vllm:request_time_per_output_token_seconds histogram\n\
         vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.01\"}} 0\n\
         vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.025\"}} {tpot_count}\n\
         vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"+Inf\"}} {tpot_count}\n\
         vllm:request_time_per_output_token_seconds_sum{{{l}}} {tpot_sum}\n\
         vllm:request_time_per_output_token_seconds_count{{{l}}} {tpot_count}\n"
    )
}

/// A vLLM scrape with the older TPOT name only and the prefix-cache counters, as
/// prometheus_client writes them (`_total`, plus a `_created` timestamp).
fn vllm_prefix_scrape(tpot_sum: f64, tpot_count: u64, hits: u64, queries: u64) -> String {
    let l = "engine=\"0\",model_name=\"openai/gpt-oss-120b\"";
    format!(
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{{l}}} 1000.0\n\
         # HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n\
         # TYPE vllm:prefix_cache_queries_total counter\n\
         vllm:prefix_cache_queries_total{{{l}}} {queries}.0\n\
         vllm:prefix_cache_queries_created{{{l}}} 1.7640e+09\n\
         # HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n\
         # TYPE vllm:prefix_cache_hits_total counter\n\
         vllm:prefix_cache_hits_total{{{l}}} {hits}.0\n\
         vllm:prefix_cache_hits_created{{{l}}} 1.7640e+09\n\
         # HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.\n\
         # TYPE vllm:time_per_output_token_seconds histogram\n\
         vllm:time_per_output_token_seconds_bucket{{{l},le=\"0.01\"}} 0.0\n\
         vllm:time_per_output_token_seconds_bucket{{{l},le=\"+Inf\"}} {tpot_count}.0\n\
         vllm:time_per_output_token_seconds_count{{{l}}} {tpot_count}.0\n\
         vllm:time_per_output_token_seconds_sum{{{l}}} {tpot_sum}\n"
    )
}

fn close(r: &Option<Reading<f64>>, want: f64) -> bool {
    matches!(r, Some(Reading::Value(v)) if (v - want).abs() < 1e-9)
}

#[test]
fn histogram_sum_and_count_of_tpot_are_tracked_but_not_its_buckets() {
    assert!(tracked("vllm:request_time_per_output_token_seconds_sum"));
    assert!(tracked("vllm:request_time_per_output_token_seconds_count"));
    assert!(tracked("vllm:time_per_output_token_seconds_sum"));
    assert!(!tracked(
        "vllm:request_time_per_output_token_seconds_bucket"
    ));
    assert!(!tracked("vllm:request_time_per_output_token_seconds"));
    assert!(tracked("vllm:prefix_cache_hits_total"));
    assert!(tracked("vllm:prefix_cache_queries"));
    assert!(!tracked("vllm:prefix_cache_queries_created"));
    let s = parse_metrics(&engine_scrape(40, 1.5, 6, 0.8), tracked).unwrap();
    assert_eq!(
        s.sum("vllm:request_time_per_output_token_seconds_sum"),
        Some(1.5)
    );
    assert_eq!(
        s.sum("vllm:request_time_per_output_token_seconds_count"),
        Some(6.0)
    );
    assert_eq!(
        s.sum("vllm:request_time_per_output_token_seconds_bucket"),
        None
    );
}

#[test]
fn tpot_is_the_mean_over_the_window_of_the_engine_histogram() {
    let mut t = Tracker::new(1.0);
    let snap = |g, s, c, i| parse_metrics(&engine_scrape(g, s, c, i), tracked).unwrap();
    let first = t.update("u", 0.0, &snap(40, 1.5, 6, 0.8));
    // Exported, but one scrape has no interval yet: n/a, not absent.
    assert_eq!(first.tpot_ms, Some(Reading::NotSupported));
    // The engine exports no prefix-cache counters: nothing to show.
    assert_eq!(first.prefix_cache_hit_rate, None);
    // Four requests finished, 0.1 s of TPOT between them: 25 ms each on average (the
    // request histogram wins over the older per-token one, whose mean would be 40 ms).
    let m = t.update("u", 1.0, &snap(50, 1.6, 10, 1.2));
    assert!(close(&m.tpot_ms, 25.0), "{:?}", m.tpot_ms);
    assert_eq!(m.generation_tok_s, Reading::Value(10.0));
    // Nothing finished in the next window: n/a, never 0 ms.
    let idle = t.update("u", 2.0, &snap(60, 1.6, 10, 1.6));
    assert_eq!(idle.tpot_ms, Some(Reading::NotSupported));
    // Restart: the counters fall; what was counted since is the window's growth.
    let r = t.update("u", 3.0, &snap(5, 0.03, 2, 0.1));
    assert!(close(&r.tpot_ms, 15.0), "{:?}", r.tpot_ms);
}

#[test]
fn older_vllm_tpot_and_prefix_cache_hit_rate_come_from_counter_deltas() {
    let mut t = Tracker::new(1.0);
    let snap = |s, c, h, q| parse_metrics(&vllm_prefix_scrape(s, c, h, q), tracked).unwrap();
    let first = t.update("u", 0.0, &snap(2.0, 100, 300, 1000));
    assert_eq!(first.prefix_cache_hit_rate, Some(Reading::NotSupported));
    // 200 of 800 queried tokens hit: 25 %, not the 500/1800 since the server started.
    let m = t.update("u", 1.0, &snap(2.5, 120, 500, 1800));
    assert!(close(&m.prefix_cache_hit_rate, 0.25), "{m:?}");
    assert!(close(&m.tpot_ms, 25.0), "{m:?}");
    // No lookups in the window: n/a.
    let idle = t.update("u", 2.0, &snap(2.5, 120, 500, 1800));
    assert_eq!(idle.prefix_cache_hit_rate, Some(Reading::NotSupported));
    assert_eq!(idle.tpot_ms, Some(Reading::NotSupported));
}

/// Pre-emptions are counted from the monitor's first scrape (a restart's fall is growth,
/// as for every counter); a server without the counter gets none (the test below).
#[test]
fn preemptions_count_from_the_first_scrape() {
    let mut t = Tracker::new(1.0);
    let snap = |n: u64| {
        let text = format!(
            "{}# TYPE vllm:num_preemptions_total counter\n\
             vllm:num_preemptions_total{{engine=\"0\",model_name=\"m\"}} {n}\n",
            vllm_scrape(0.0, 0.0, 0.0, 0.0, 0.0)
        );
        parse_metrics(&text, tracked).unwrap()
    };
    let counts: Vec<_> = [(0.0, 5), (1.0, 7), (2.0, 1)]
        .into_iter()
        .map(|(at, n)| t.update("u", at, &snap(n)).preemptions)
        .collect();
    let v = |x: f64| Some(Reading::Value(x));
    assert_eq!(counts, [v(0.0), v(2.0), v(3.0)]);
}

#[test]
fn a_server_without_tpot_or_prefix_series_gets_none_and_no_json_field() {
    let mut t = Tracker::new(1.0);
    for (i, g) in [0.0, 100.0].into_iter().enumerate() {
        let m = t.update(
            "u",
            i as f64,
            &parse_metrics(&vllm_scrape(g, 0.0, 0.0, 0.0, 0.0), tracked).unwrap(),
        );
        assert_eq!(m.tpot_ms, None);
        assert_eq!(m.prefix_cache_hit_rate, None);
        assert_eq!(m.preemptions, None);
        let json = serde_json::to_string(&m).unwrap();
        assert!(
            !json.contains("tpot") && !json.contains("prefix") && !json.contains("preempt"),
            "{json}"
        );
    }
}

#[test]
fn metrics_url_appends_the_path_and_rejects_nonsense() {
    assert_eq!(
        metrics_url("http://127.0.0.1:8000").unwrap().as_str(),
        "http://127.0.0.1:8000/metrics"
    );
    assert_eq!(
        metrics_url("http://h:1/custom/metrics").unwrap().as_str(),
        "http://h:1/custom/metrics"
    );
    let e = metrics_url("localhost 8000").unwrap_err().to_string();
    assert!(e.contains("localhost 8000"), "{e}");
    assert!(metrics_url("ftp://h/metrics").is_err());
}

// ---------------------------------------------------------------- ring buffers

#[test]
fn ring_never_grows_past_its_capacity_over_a_day_at_4_hz() {
    let mut h = history_for(600.0, 4.0);
    assert_eq!(h.capacity(), 2400);
    let reserved = h.allocated();
    let day = 24 * 3600 * 4;
    for i in 0..day {
        h.push(ChartPoint {
            elapsed_s: f64::from(i) / 4.0,
            ..ChartPoint::default()
        });
        assert!(h.len() <= 2400);
    }
    assert_eq!(h.len(), 2400);
    assert_eq!(h.allocated(), reserved);
    assert_eq!(h.latest().unwrap().elapsed_s, f64::from(day - 1) / 4.0);
    assert_eq!(
        h.iter().next().unwrap().elapsed_s,
        f64::from(day - 2400) / 4.0
    );
}

#[test]
fn ring_of_capacity_zero_still_holds_the_latest() {
    let mut r: Ring<u8> = Ring::new(0);
    assert!(r.is_empty());
    r.push(1);
    r.push(2);
    assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![2]);
}

#[test]
fn rate_is_clamped_to_1_to_20_hz() {
    assert_eq!(clamp_rate(4.0), 4.0);
    assert_eq!(clamp_rate(0.1), 1.0);
    assert_eq!(clamp_rate(100.0), 20.0);
    assert_eq!(clamp_rate(f64::NAN), 4.0);
    let c = MonitorConfig {
        rate_hz: 50.0,
        ..MonitorConfig::default()
    };
    assert_eq!(c.period().as_millis(), 50);
}

// ---------------------------------------------------------------- summary

fn gpu(sm: u32, power: f64, temp: u32, used: u64, throttle: &[&str]) -> GpuSample {
    GpuSample {
        index: 0,
        name: Reading::Value("NVIDIA GB10".into()),
        uuid: Reading::Value("GPU-1".into()),
        compute_capability: Reading::Value("12.1".into()),
        persistence_mode: Reading::NotSupported,
        compute_mode: Reading::Value("Default".into()),
        memory: GpuMemory {
            source: MemorySource::Unified,
            used_bytes: Reading::Value(used),
            total_bytes: Reading::Value(128 << 30),
            process_bytes: Reading::NotSupported,
        },
        clocks: Clocks {
            sm_mhz: Reading::Value(sm),
            graphics_mhz: Reading::Value(sm),
            mem_mhz: Reading::NotSupported,
        },
        max_clocks: Clocks {
            sm_mhz: Reading::Value(3000),
            graphics_mhz: Reading::Value(3000),
            mem_mhz: Reading::NotSupported,
        },
        power_w: Reading::Value(power),
        power_limit_w: Reading::NotSupported,
        energy_j: Reading::NotSupported,
        temperature_c: Reading::Value(temp),
        utilization_gpu_pct: Reading::Value(90),
        utilization_mem_pct: Reading::NotSupported,
        pstate: Reading::Value("P0".into()),
        throttle_reasons: Reading::Value(throttle.iter().map(|s| s.to_string()).collect()),
        processes: Reading::Value(Vec::new()),
    }
}

fn sample(sec: i64, g: GpuSample) -> Sample {
    Sample {
        at: Utc.timestamp_opt(1_700_000_000 + sec, 0).unwrap(),
        elapsed_s: sec as f64,
        gpu: GpuStatus::Available {
            driver_version: Reading::Value("580".into()),
            cuda_driver_version: Reading::Value("13.0".into()),
            gpus: vec![g],
        },
        host: HostSample {
            cpu_pct: Reading::Value(10.0),
            cpu_per_core_pct: vec![10.0],
            ram_used_bytes: 1 << 30,
            ram_total_bytes: 8 << 30,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            load: Reading::NotSupported,
            process: None,
        },
        server: ServerStatus::NotConfigured,
    }
}

#[test]
fn summary_keeps_peaks_means_and_when_throttling_was_seen() {
    let mut s = Summary::default();
    s.add(&sample(0, gpu(2400, 50.0, 40, 10 << 30, &[])));
    s.add(&sample(
        1,
        gpu(1800, 100.0, 70, 30 << 30, &["sw_power_cap"]),
    ));
    s.add(&sample(
        2,
        gpu(2100, 90.0, 65, 20 << 30, &["sw_power_cap", "hw_slowdown"]),
    ));
    s.add(&sample(3, gpu(2400, 40.0, 50, 15 << 30, &[])));
    assert_eq!(s.samples, 4);
    let g = &s.gpus[0];
    assert_eq!(g.name.as_deref(), Some("NVIDIA GB10"));
    assert_eq!(g.memory_source, Some(MemorySource::Unified));
    assert_eq!(g.peak_memory_bytes, Some(30 << 30));
    assert_eq!(g.sm_clock_mhz.min, Some(1800.0));
    assert_eq!(g.sm_clock_mhz.mean, Some(2175.0));
    assert_eq!(g.power_w.mean, Some(70.0));
    assert_eq!(g.temperature_c.max, Some(70.0));
    let cap = &g.throttle_reasons["sw_power_cap"];
    assert_eq!(
        (cap.first_elapsed_s, cap.last_elapsed_s, cap.samples),
        (1.0, 2.0, 2)
    );
    assert_eq!(cap.first_at, Utc.timestamp_opt(1_700_000_001, 0).unwrap());
    assert_eq!(g.throttle_reasons["hw_slowdown"].samples, 1);
    assert_eq!(g.throttle_reasons.len(), 2);
    assert_eq!(s.host_peak_ram_bytes, Some(1 << 30));
    assert_eq!(
        s.started_at,
        Some(Utc.timestamp_opt(1_700_000_000, 0).unwrap())
    );
}

#[test]
fn summary_ignores_not_available_readings_instead_of_counting_zero() {
    let mut s = Summary::default();
    let mut g = gpu(2000, 50.0, 40, 1, &[]);
    s.add(&sample(0, g.clone()));
    g.power_w = Reading::NotSupported;
    g.clocks.sm_mhz = Reading::Error("lost".into());
    s.add(&sample(1, g));
    let g = &s.gpus[0];
    assert_eq!(g.power_w.count, 1);
    assert_eq!(g.power_w.mean, Some(50.0));
    assert_eq!(g.sm_clock_mhz.min, Some(2000.0));
}

#[test]
fn summary_series_stays_bounded_and_even_over_a_day_at_4_hz() {
    let mut s = Summary::new(Some(4.0));
    let base = sample(0, gpu(2000, 50.0, 40, 1, &[]));
    for i in 0..(24 * 3600 * 4) {
        let mut x = base.clone();
        x.elapsed_s = f64::from(i) / 4.0;
        s.add(&x);
        assert!(s.series.len() < SERIES_CAPACITY);
    }
    assert!(s.series.len() >= SERIES_CAPACITY / 2, "{}", s.series.len());
    assert_eq!(s.series[0].elapsed_s, 0.0);
    let step = s.series[1].elapsed_s - s.series[0].elapsed_s;
    assert!(
        s.series
            .windows(2)
            .all(|w| w[1].elapsed_s - w[0].elapsed_s == step)
    );
}

#[test]
fn summary_becomes_the_record_resources_section() {
    let mut s = Summary::new(Some(4.0));
    s.add(&sample(0, gpu(2400, 50.0, 40, 10 << 30, &[])));
    s.add(&sample(
        1,
        gpu(1800, 100.0, 70, 30 << 30, &["sw_power_cap"]),
    ));
    s.add(&sample(2, gpu(2100, 90.0, 65, 20 << 30, &["sw_power_cap"])));
    let r = resources(&s);
    // Without a server nothing is known of pre-emptions.
    assert_eq!(r.server_preemptions, None);
    assert_eq!(r.samples, 3);
    assert_eq!(r.rate_hz, Some(4.0));
    assert_eq!(r.gpu_memory_peak_bytes, Some(30 << 30));
    assert_eq!(r.gpu_memory_source.as_deref(), Some("unified"));
    assert_eq!(r.sm_clock_min_mhz, Some(1800.0));
    assert_eq!(r.sm_clock_mean_mhz, Some(2100.0));
    assert_eq!(r.power_mean_w, Some(80.0));
    assert_eq!(r.temp_max_c, Some(70.0));
    assert_eq!(r.throttle.len(), 1);
    assert_eq!(r.throttle[0].reason, "sw_power_cap");
    assert_eq!(r.throttle[0].samples, 2);
    assert_eq!(
        r.throttle[0].first_seen,
        Utc.timestamp_opt(1_700_000_001, 0).unwrap()
    );
    assert_eq!(
        r.throttle[0].last_seen,
        Utc.timestamp_opt(1_700_000_002, 0).unwrap()
    );
    assert_eq!(r.host_cpu_mean_pct, Some(10.0));
    assert_eq!(r.series.len(), 3);
    assert_eq!(r.series[1].gpu_mem_bytes, Some(30 << 30));
    assert_eq!(r.series[1].sm_clock_mhz, Some(1800.0));
}

/// A watched server's pre-emptions (its counter's growth since the first scrape) reach the
/// record's resources.
#[test]
fn server_preemptions_reach_the_record_resources() {
    let mut s = Summary::new(Some(4.0));
    let mut t = Tracker::new(1.0);
    for (i, n) in [(0, 5), (1, 7)] {
        let text = format!(
            "{}vllm:num_preemptions_total{{engine=\"0\"}} {n}\n",
            vllm_scrape(0.0, 0.0, 0.0, 0.0, 0.0)
        );
        let m = t.update("u", f64::from(i), &parse_metrics(&text, tracked).unwrap());
        let mut x = sample(i.into(), gpu(2100, 90.0, 65, 20 << 30, &[]));
        x.server = ServerStatus::Scraped(Box::new(m));
        s.add(&x);
    }
    assert_eq!(resources(&s).server_preemptions, Some(2));
}

#[test]
fn gpu_facts_fill_the_record_environment() {
    let mut env = Environment::default();
    fill_environment(&mut env, &sample(0, gpu(2000, 50.0, 40, 1, &[])));
    assert_eq!(env.gpu_error, None);
    let g = &env.gpus[0];
    assert_eq!(g.name.as_deref(), Some("NVIDIA GB10"));
    assert_eq!(g.driver_version.as_deref(), Some("580"));
    assert_eq!(g.cuda_version.as_deref(), Some("13.0"));
    assert_eq!(g.compute_capability.as_deref(), Some("12.1"));
    // Unified memory: no dedicated capacity to report.
    assert_eq!(g.memory_total_bytes, None);
    assert_eq!(g.sm_clock_max_mhz, Some(3000));
    assert_eq!(g.persistence_mode, None);

    let mut none = sample(0, gpu(2000, 50.0, 40, 1, &[]));
    none.gpu = GpuStatus::Unavailable {
        reason: "NVML not available: libnvidia-ml.so.1 not found".into(),
    };
    fill_environment(&mut env, &none);
    assert!(env.gpus.is_empty());
    assert_eq!(
        env.gpu_error.as_deref(),
        Some("NVML not available: libnvidia-ml.so.1 not found")
    );
}

#[test]
fn the_compact_line_labels_unified_memory_throttling_and_na() {
    let mut x = sample(0, gpu(1800, 95.5, 71, 30 << 30, &["sw_power_cap"]));
    if let GpuStatus::Available { gpus, .. } = &mut x.gpu {
        gpus[0].clocks.mem_mhz = Reading::NotSupported;
    }
    let line = mxtune::monitor::cli::line(&x);
    for part in [
        "gpu0 90%",
        "mem unified 30.0/128.0 GiB",
        "sm 1800/3000 MHz",
        "mem n/a MHz",
        "96/n/a W",
        "71°C P0 thr sw_power_cap",
        "cpu 10% ram 1.0/8.0 GiB load n/a",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }
}

#[test]
fn the_compact_line_shows_tpot_and_prefix_hits_only_when_exported() {
    let mut x = sample(0, gpu(1800, 95.5, 71, 30 << 30, &[]));
    let mut t = Tracker::new(1.0);
    let scrape = |s, c, h, q| parse_metrics(&vllm_prefix_scrape(s, c, h, q), tracked).unwrap();
    t.update("u", 0.0, &scrape(2.0, 100, 300, 1000));
    x.server = ServerStatus::Scraped(Box::new(t.update("u", 1.0, &scrape(2.5, 120, 500, 1800))));
    let line = mxtune::monitor::cli::line(&x);
    assert!(line.contains(" tpot 25.0 ms prefix hits 25%"), "{line}");
    let mut t = Tracker::new(1.0);
    let plain = |g| parse_metrics(&vllm_scrape(g, 0.0, 0.0, 0.0, 0.0), tracked).unwrap();
    t.update("u", 0.0, &plain(0.0));
    x.server = ServerStatus::Scraped(Box::new(t.update("u", 1.0, &plain(10.0))));
    let line = mxtune::monitor::cli::line(&x);
    assert!(line.contains("gen 10.0 tok/s"), "{line}");
    assert!(!line.contains("tpot") && !line.contains("prefix"), "{line}");
}

#[test]
fn readings_serialize_as_value_na_or_error() {
    let v: Vec<Reading<u32>> = vec![
        Reading::Value(3),
        Reading::NotSupported,
        Reading::Error("boom".into()),
    ];
    assert_eq!(
        serde_json::to_string(&v).unwrap(),
        r#"[3,"n/a",{"error":"boom"}]"#
    );
    assert_eq!(Reading::<u32>::NotSupported.to_string(), "n/a");
}

// ---------------------------------------------------------------- real /metrics server

#[derive(Default)]
struct FakeVllm {
    requests: AtomicU64,
}

/// A real HTTP server on 127.0.0.1 whose counters grow by fixed steps per scrape, and fall
/// back (a restart) on the 4th scrape.
fn serve_metrics() -> (String, Arc<FakeVllm>) {
    let state = Arc::new(FakeVllm::default());
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Arc<FakeVllm>>| async move {
                let n = s.requests.fetch_add(1, Ordering::SeqCst) as f64;
                let k = if n >= 3.0 { n - 3.0 } else { n };
                vllm_scrape(1000.0 + 50.0 * k, 10.0 * k, 30.0 * n, 40.0 * n, 10.0 * n)
            }),
        )
        .route(
            "/engine/metrics",
            get(|State(s): State<Arc<FakeVllm>>| async move {
                // Each scrape: 10 tokens, 2 requests finished at 30 ms per output token.
                let n = s.requests.fetch_add(1, Ordering::SeqCst);
                engine_scrape(10 * n, 0.06 * n as f64, 2 * n, 0.0)
            }),
        )
        .route("/gone", get(|| async { StatusCode::NOT_FOUND }))
        .with_state(state.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), state)
}

#[test]
fn scraping_a_live_server_gives_rates_gauges_and_acceptance() {
    let (base, _state) = serve_metrics();
    let mut r = ServerReader::new(&base, 1.0).unwrap();
    let ServerStatus::Scraped(first) = r.read(0.0) else {
        panic!("first scrape failed")
    };
    assert_eq!(first.url, format!("{base}/metrics"));
    assert_eq!(first.generation_tok_s, Reading::NotSupported);
    let ServerStatus::Scraped(m) = r.read(1.0) else {
        panic!("second scrape failed")
    };
    assert_eq!(m.generation_tok_s, Reading::Value(50.0));
    assert_eq!(m.prompt_tok_s, Reading::Value(10.0));
    assert_eq!(m.running, Reading::Value(1.0));
    assert_eq!(m.spec_acceptance_rate, Reading::Value(0.75));
    assert_eq!(m.spec_mean_acceptance_length, Reading::Value(4.0));
    r.read(2.0);
    // 4th scrape: the generation counter falls from 1100 to 1000, a restart; the 1000
    // tokens since the restart are the growth over the last second.
    let ServerStatus::Scraped(m) = r.read(3.0) else {
        panic!("fourth scrape failed")
    };
    assert_eq!(m.generation_tok_s, Reading::Value(1000.0));
}

#[test]
fn scraping_the_engine_shape_over_http_gives_tpot_and_no_prefix_figure() {
    let (base, _state) = serve_metrics();
    let mut r = ServerReader::new(&format!("{base}/engine/metrics"), 1.0).unwrap();
    let ServerStatus::Scraped(first) = r.read(0.0) else {
        panic!("first scrape failed")
    };
    assert_eq!(first.tpot_ms, Some(Reading::NotSupported));
    let ServerStatus::Scraped(m) = r.read(1.0) else {
        panic!("second scrape failed")
    };
    assert!(close(&m.tpot_ms, 30.0), "{m:?}");
    assert_eq!(m.prefix_cache_hit_rate, None);
    assert_eq!(m.generation_tok_s, Reading::Value(10.0));
    // The plain fake vLLM exports neither series.
    let mut plain = ServerReader::new(&base, 1.0).unwrap();
    plain.read(0.0);
    let ServerStatus::Scraped(p) = plain.read(1.0) else {
        panic!("plain scrape failed")
    };
    assert_eq!((p.tpot_ms, p.prefix_cache_hit_rate), (None, None));
}

#[test]
fn a_server_without_metrics_reads_na_and_a_dead_one_names_its_url() {
    let (base, _state) = serve_metrics();
    let mut r = ServerReader::new(&format!("{base}/gone"), 1.0).unwrap();
    assert!(matches!(r.read(0.0), ServerStatus::NoMetrics { url } if url.ends_with("/gone")));
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut r = ServerReader::new(&url, 1.0).unwrap();
    match r.read(0.0) {
        ServerStatus::Failed { error } => assert!(error.contains(&url), "{error}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn the_monitor_thread_streams_samples_and_summarises_them() {
    let (base, state) = serve_metrics();
    let mut m = Monitor::start(MonitorConfig {
        rate_hz: 20.0,
        metrics_url: Some(base),
        pid: Some(std::process::id()),
    })
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(m.samples.blocking_recv().expect("monitor channel closed"));
    }
    let summary = m.stop().unwrap();
    assert!(summary.samples >= 3);
    assert!(state.requests.load(Ordering::SeqCst) >= 4);
    for w in got.windows(2) {
        assert!(w[1].elapsed_s > w[0].elapsed_s);
    }
    let s = &got[2];
    let ServerStatus::Scraped(metrics) = &s.server else {
        panic!("expected a scrape, got {:?}", s.server)
    };
    assert_eq!(metrics.kind, ServerKind::Vllm);
    assert!(metrics.generation_tok_s.get().is_some_and(|v| v > 0.0));
    let p = s.host.process.as_ref().unwrap();
    assert_eq!(p.pid, std::process::id());
    assert!(p.rss_bytes.get().is_some_and(|b| b > 0));
    assert!(s.host.ram_total_bytes > 0);
    assert!(!s.host.cpu_per_core_pct.is_empty());
}

#[test]
fn the_monitor_refuses_a_bad_url_at_start() {
    let e = Monitor::start(MonitorConfig {
        metrics_url: Some("not a url".into()),
        ..MonitorConfig::default()
    })
    .err()
    .expect("a bad URL must fail at start");
    assert!(e.to_string().contains("not a url"), "{e}");
}

// ---------------------------------------------------------------- the real binary

fn nvml_library_present() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so.1"))
        .unwrap_or(false)
}

#[test]
fn mxtune_monitor_once_json_runs_without_a_gpu() {
    let (base, _state) = serve_metrics();
    let out = Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["monitor", "--once", "--json", "--url", &base])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = &v["gpu"];
    if nvml_library_present() {
        assert!(
            gpu["status"] == "available" || gpu["reason"].is_string(),
            "{gpu}"
        );
    } else {
        assert_eq!(gpu["status"], "unavailable");
        let reason = gpu["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("NVML not available: libnvidia-ml.so.1 not found"),
            "{reason}"
        );
    }
    assert!(v["host"]["ram_total_bytes"].as_u64().unwrap() > 0);
    assert!(v["host"]["cpu_pct"].is_number());
    assert_eq!(v["server"]["status"], "scraped");
    assert_eq!(v["server"]["kind"], "vllm");
    assert_eq!(v["server"]["running"], 1.0);
    // Two scrapes one period apart: a rate exists.
    assert!(v["server"]["generation_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn mxtune_monitor_line_says_why_the_gpu_panel_is_empty() {
    let out = Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["monitor", "--once"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("cpu "), "{text}");
    if !nvml_library_present() {
        assert!(
            text.contains("NVML not available: libnvidia-ml.so.1 not found"),
            "{text}"
        );
    }
}

#[test]
fn mxtune_monitor_rejects_a_bad_url_with_its_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["monitor", "--once", "--url", "localhost 8000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("localhost 8000"), "{err}");
}

#[test]
fn gpu_memory_probe_reads_memory_or_says_why_not() {
    use mxtune::bench::levels::MemoryProbe;
    match mxtune::monitor::probe::GpuMemoryProbe::detect() {
        Ok(probe) => {
            let used = probe.used_bytes().expect("a detected GPU reads its memory");
            assert!(used > 0, "{}: 0 bytes in use", probe.describe());
            assert!(probe.describe().contains("GPU"));
        }
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(
                msg.contains("NVML") || msg.contains("GPU"),
                "unhelpful reason: {msg}"
            );
        }
    }
}

//! `mxtune bench` end to end: the real binary against a real streaming server on 127.0.0.1.

#[path = "support/vllm_double.rs"]
mod double;

use std::process::Output;

use double::{Fault, Script};

async fn mxtune(args: Vec<String>, env: Vec<(String, String)>) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(args)
        .envs(env)
        .output()
        .await
        .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn table_output_against_a_streaming_server() {
    let d = double::spawn(Script {
        tokens_per_chunk: 2,
        reasoning_tokens: 4,
        ..Script::default()
    })
    .await;
    let mut a = args(&["bench", "--url", &d.url, "--pp", "64", "--tg", "8", "16"]);
    a.extend(args(&[
        "--depth",
        "0",
        "32",
        "--runs",
        "2",
        "--concurrency",
        "1",
        "2",
    ]));
    let out = mxtune(a, vec![]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    println!("{stdout}");
    for needle in [
        "| double-model | pp64 ",
        "| double-model | tg16 @ d32 ",
        "e2e_ttft (ms)",
        "TPOT ms p50/p90/p99",
        "tokens counted by: token_ids",
        "Performance level: PASS",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    // 2 tg × 2 depths × 2 concurrencies = 8 points, 2 rows each in the first table.
    assert_eq!(stdout.matches("| double-model |").count(), 16, "{stdout}");
    // Progress bar is hidden when stderr is not a terminal.
    assert!(stderr.is_empty(), "{stderr}");
    // (1 warm-up + 2 runs) × (1 + 2 requests) × 4 (pp, tg, depth) combinations.
    assert_eq!(d.posts(), 3 * 3 * 4);
}

#[tokio::test]
async fn json_output_has_mean_std_n_per_point_and_levels() {
    let d = double::spawn(Script::default()).await;
    let a = args(&[
        "bench",
        "--url",
        &d.url,
        "--model",
        "m",
        "--endpoint",
        "completions",
        "--token-ids",
        "--pp",
        "32",
        "--tg",
        "8",
        "--runs",
        "3",
        "--warmup",
        "0",
        "--no-cache",
        "--latency-mode",
        "api",
        "--level",
        "correctness",
        "performance",
        "--json",
    ]);
    let out = mxtune(a, vec![]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["model"], "m");
    let p = &v["points"][0];
    assert_eq!(p["point"]["pp"], 32);
    assert_eq!(p["tg_tps"]["n"], 3);
    assert!(p["tg_tps"]["mean"].as_f64().unwrap() > 0.0);
    assert!(p["tg_tps"]["std"].as_f64().is_some());
    assert_eq!(p["pp_tps"]["n"], 3);
    assert_eq!(p["latency"]["itl_ms"]["n"], 21);
    assert_eq!(
        (p["requests"].as_u64(), p["errors"].as_u64()),
        (Some(3), Some(0))
    );
    assert_eq!(v["levels"][0]["level"], "correctness");
    assert_eq!(v["levels"][0]["passed"], true);
    assert_eq!(v["levels"][1]["level"], "performance");
    assert!(v["latency_ms"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn failing_server_gives_reasons_and_a_failure_exit_code() {
    let d = double::spawn(Script {
        fault: Fault::Status(500),
        ..Script::default()
    })
    .await;
    let a = args(&[
        "bench", "--url", &d.url, "--model", "m", "--pp", "16", "--tg", "4", "--runs", "2",
        "--warmup", "0",
    ]);
    let out = mxtune(a, vec![]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("Performance level: FAIL"), "{stdout}");
    assert!(stdout.contains("2× POST"), "{stdout}");
    assert!(stdout.contains("HTTP 500"), "{stdout}");
    assert_eq!(d.posts(), 2);
}

#[tokio::test]
async fn bad_arguments_and_unreachable_servers_are_errors_not_panics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = mxtune(
        args(&["bench", "--url", &url, "--connect-timeout", "2"]),
        vec![],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("or pass --model"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = mxtune(
        args(&["bench", "--url", &url, "--model", "m", "--concurrency", "0"]),
        vec![],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("--concurrency"), "{stderr}");
}

fn records(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

#[tokio::test]
async fn record_is_saved_with_raw_timings_via_env_runs_dir() {
    let d = double::spawn(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let a = args(&[
        "bench", "--url", &d.url, "--pp", "16", "--tg", "4", "--depth", "0", "8", "--runs", "2",
        "--warmup", "0", "--record",
    ]);
    let out = mxtune(
        a,
        vec![("MXTUNE_RUNS_DIR".into(), runs.display().to_string())],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("run record: "), "{stderr}");
    let recs = records(&runs);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["identity"]["status"], "completed");
    assert_eq!(r["target"]["kind"], "attach");
    assert_eq!(r["target"]["model"], "double-model");
    assert_eq!(r["workload"]["depth"], serde_json::json!([0, 8]));
    assert_eq!(r["workload"]["tokenizer"], "o200k_base");
    assert_eq!(r["workload"]["token_count_method"], "token_ids");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["point"]["depth"], 8);
    assert_eq!(results[1]["requests_raw"].as_array().unwrap().len(), 2);
    assert_eq!(
        results[1]["requests_raw"][0]["arrivals"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_eq!(results[1]["requests_raw"][0]["prompt_tokens"], 24);
}

/// The server counts more prompt tokens than were sent (its chat template): the JSON output,
/// the text table and the record carry its count and a pp figure from it, next to the
/// credited one (the tokens sent, as the count is more than 20 % off).
#[tokio::test]
async fn server_counted_prompt_tokens_reach_json_text_and_record() {
    let d = double::spawn(Script {
        template_tokens: 70,
        ..Script::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let env = vec![("MXTUNE_RUNS_DIR".to_string(), runs.display().to_string())];
    let a = args(&[
        "bench", "--url", &d.url, "--pp", "64", "--tg", "4", "--runs", "2", "--warmup", "0",
        "--json", "--record",
    ]);
    let out = mxtune(a, env.clone()).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["points"][0];
    assert_eq!(p["prompt_tokens_sent"], 64);
    assert_eq!(p["server_prompt_tokens"]["n"], 2, "{p}");
    assert_eq!(p["server_prompt_tokens"]["mean"], 134.0, "{p}");
    // Same est_ppt per request, so the two figures differ by exactly 134 / 64.
    let ratio = |p: &serde_json::Value| {
        p["server_pp_tps"]["mean"].as_f64().unwrap() / p["pp_tps"]["mean"].as_f64().unwrap()
    };
    assert!((ratio(p) - 134.0 / 64.0).abs() < 1e-9, "{p}");
    let recs = records(&runs);
    assert_eq!(recs.len(), 1);
    let point = &recs[0]["results"][0];
    assert_eq!(point["server_prompt_tokens"]["mean"], 134.0, "{point}");
    assert!((ratio(point) - 134.0 / 64.0).abs() < 1e-9, "{point}");
    assert_eq!(point["requests_raw"][0]["prompt_tokens"], 134);

    // The text output says it under the tables.
    let a = args(&[
        "bench", "--url", &d.url, "--pp", "64", "--tg", "4", "--runs", "2", "--warmup", "0",
    ]);
    let out = mxtune(a, vec![]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("counted by the server (usage.prompt_tokens"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pp64 c1: 64 → 134 (+70); pp t/s by the server's count"),
        "{stdout}"
    );
}

#[tokio::test]
async fn ctrl_c_leaves_an_aborted_record_with_the_points_so_far() {
    let d = double::spawn(Script {
        chunk_gap: std::time::Duration::from_millis(40),
        ..Script::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(args(&[
            "bench",
            "--url",
            &d.url,
            "--pp",
            "16",
            "--tg",
            "8",
            "--depth",
            "0",
            "8",
            "16",
            "24",
            "32",
            "40",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--record",
            "--runs-dir",
        ]))
        .arg(&runs)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as i32;
    // Wait until the first point is in the record, then interrupt.
    for attempt in 0.. {
        assert!(
            attempt < 3000,
            "no point reached the record in {}",
            runs.display()
        );
        let recs = records(&runs);
        if recs
            .first()
            .is_some_and(|r| !r["results"].as_array().unwrap().is_empty())
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // SAFETY: plain kill(2) on the child this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    let r = &records(&runs)[0];
    assert_eq!(r["identity"]["status"], "aborted");
    assert_eq!(r["identity"]["reason"], "interrupted (Ctrl-C)");
    let n = r["results"].as_array().unwrap().len();
    assert!((1..6).contains(&n), "{n} points recorded");
}

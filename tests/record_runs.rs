//! Run records end to end: the store on a real directory, migration of old files, bad
//! files, secret redaction, and the `mxtune runs` commands through the real binary.

use chrono::{TimeZone, Utc};
use mxtune::record::schema::*;
use mxtune::record::store::{self, RunStore, load_file};
use mxtune::vocab::{ContainerSpec, LaunchSpec, Mount, NetworkMode, PathCheck, TargetKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/records")
        .join(name)
}

fn mxtune(args: &[&str], runs_dir: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mxtune"));
    c.args(args).env_remove("MXTUNE_RUNS_DIR");
    if let Some(d) = runs_dir {
        c.env("MXTUNE_RUNS_DIR", d);
    }
    c.output().expect("run mxtune binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A record with every section filled, as the other modules will fill them.
fn full_record(source_repo: &Path) -> RunRecord {
    let mut r = mxtune::record::begin(
        TargetKind::Docker,
        Some("cutlass all-mxfp4".into()),
        &[("vllm".into(), source_repo.to_path_buf())],
    );
    r.identity.note = Some("64x128 tiles".into());
    r.identity.tags = vec!["tiles".into(), "decode".into()];
    r.target.flags = serde_json::json!({
        "moe_backend": "cutlass", "moe_tile": "64x128", "mxfp4_layers": ["moe", "qkv", "o", "lm_head"],
        "serving": {"max_num_seqs": 2, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.85}
    });
    r.target.launch = Some(LaunchSpec {
        argv: vec![
            "vllm".into(),
            "serve".into(),
            "openai/gpt-oss-120b".into(),
            "--mxfp4-backend".into(),
            "CUTLASS".into(),
        ],
        env: BTreeMap::from([("VLLM_ATTENTION_SINKS".into(), "1".into())]),
        container: Some(ContainerSpec {
            image: "vllm-mxfp4-dev:latest".into(),
            name: Some("mxtune-test".into()),
            network: NetworkMode::Host,
            ipc_host: true,
            shm_size: None,
            ulimits: BTreeMap::from([
                ("memlock".into(), (-1, -1)),
                ("stack".into(), (67108864, 67108864)),
            ]),
            devices: vec!["/dev/infiniband".into()],
            cap_add: vec!["IPC_LOCK".into()],
            gpus_all: true,
            mounts: vec![Mount {
                host: "/data/hf".into(),
                container: "/root/.cache/huggingface".into(),
                read_only: false,
            }],
            files: BTreeMap::from([("/tmp/flashinfer_moe_tile".into(), "64x128".into())]),
            labels: BTreeMap::from([("mxtune.preset".into(), "cutlass".into())]),
        }),
        host: "127.0.0.1".into(),
        port: 8000,
        served_model_name: "gpt-oss-120b".into(),
        checks: vec![PathCheck {
            flag: "moe_backend".into(),
            value: "cutlass".into(),
            must_see: vec!["CUTLASS".into()],
            must_not_see: vec!["marlin".into()],
        }],
        warnings: vec!["FLASHINFER_MOE_TILE is planned-only".into()],
        dialect: Some(mxtune::vocab::Dialect {
            flavour: "upstream".into(),
            vllm_version: Some("0.11.2".into()),
            version_source: Some("vllm --version".into()),
            note: None,
        }),
        cluster: None,
    });
    r.target.url = Some("http://127.0.0.1:8000".into());
    r.target.docker = Some(DockerFacts {
        image: "vllm-mxfp4-dev:latest".into(),
        image_id: Some("sha256:abc".into()),
        digest: Some("vllm-mxfp4-dev@sha256:def".into()),
        labels: BTreeMap::from([(
            "org.opencontainers.image.revision".into(),
            "77bf5a554".into(),
        )]),
        container_id: Some("c0ffee".into()),
        container_name: Some("mxtune-test".into()),
    });
    r.target.model = Some("openai/gpt-oss-120b".into());
    r.target.weights = Some(Weights::Real);
    r.environment.gpus = vec![GpuFacts {
        index: 0,
        name: Some("NVIDIA GB10".into()),
        uuid: Some("GPU-1234".into()),
        driver_version: Some("580.95.05".into()),
        cuda_version: Some("13.0".into()),
        compute_capability: Some("12.1".into()),
        memory_total_bytes: None,
        sm_clock_mhz: Some(2411),
        sm_clock_max_mhz: Some(3003),
        mem_clock_mhz: None,
        mem_clock_max_mhz: None,
        power_limit_w: Some(140.5),
        persistence_mode: Some(true),
        compute_mode: Some("Default".into()),
    }];
    r.environment.pip_freeze = Some(vec![
        "torch==2.9.0".into(),
        "vllm @ file:///workspace/vllm".into(),
    ]);
    r.environment.container_nvidia_smi = Some("NVIDIA-SMI 580.95.05".into());
    let t0 = Utc.with_ymd_and_hms(2026, 1, 17, 10, 0, 0).unwrap();
    r.observed = Observed {
        kernel_path: vec![KernelPathCheck {
            flag: "moe_backend".into(),
            value: "cutlass".into(),
            verdict: Verdict::Valid,
            lines: vec!["Using CUTLASS MoE backend".into()],
            reason: None,
        }],
        startup_s: Some(301.25),
        phases: vec![Phase {
            name: "loading weights".into(),
            at: t0,
            last_probe: Some(mxtune::vocab::ProbeAnswer {
                request: "POST /v1/completions".into(),
                status: Some(503),
                message: "model is still loading".into(),
                at: t0,
            }),
        }],
        warnings: vec!["Unknown vLLM environment variable: FLASHINFER_MOE_TILE".into()],
        log_file: Some("20260117T100000Z-cutlass.log".into()),
        vllm_version: Some("0.11.2".into()),
    };
    r.workload = Some(WorkloadParams {
        endpoint: Some("chat".into()),
        pp: vec![2048],
        tg: vec![32],
        depth: vec![0],
        concurrency: vec![1],
        runs: 3,
        warmup: 1,
        temperature: Some(1.0),
        top_p: Some(1.0),
        seed: Some(42),
        tokenizer: Some("o200k_base".into()),
        prefix_caching: Some(true),
        no_cache: true,
        latency_mode: Some("generation".into()),
        level: Some("performance".into()),
        token_count_method: Some("usage".into()),
    });
    // Raw timings with awkward floats, and the summaries recomputed from them.
    let raw: Vec<RequestTiming> = (0..3)
        .map(|i| {
            let f = f64::from(i);
            RequestTiming {
                run: i,
                warmup: false,
                start: t0,
                first_chunk_ms: Some(401.3 + f / 3.0),
                first_token_ms: Some(433.7 + f / 7.0),
                arrivals: (0..32)
                    .map(|k| Arrival(433.7 + f / 7.0 + f64::from(k) * (16.6 + f / 11.0), 1))
                    .collect(),
                end_ms: Some(960.1 + f * 0.1),
                latency_ms: Some(2.31),
                prompt_tokens: Some(2119),
                completion_tokens: Some(32),
                error: None,
            }
        })
        .collect();
    let tg: Vec<f64> = raw
        .iter()
        .map(|q| 31.0 / ((q.arrivals[31].0 - q.arrivals[0].0) / 1000.0))
        .collect();
    let pp: Vec<f64> = raw
        .iter()
        .map(|q| 2048.0 / (q.first_chunk_ms.unwrap() / 1000.0))
        .collect();
    r.results = vec![PointResult {
        point: WorkloadPoint {
            pp: 2048,
            tg: 32,
            depth: 0,
            concurrency: 1,
        },
        pp_tps: Stats::from_samples(&pp),
        // The chat template's 71 tokens on top of the 2048 sent.
        server_prompt_tokens: Stats::from_samples(&[2119.0; 3]),
        server_pp_tps: Stats::from_samples(
            &pp.iter().map(|p| p * 2119.0 / 2048.0).collect::<Vec<_>>(),
        ),
        tg_tps: Stats::from_samples(&tg),
        total_tg_tps: None,
        ttfr_ms: Stats::from_samples(&[401.3, 401.6, 401.9]),
        est_ppt_ms: Stats::from_samples(&[399.0, 399.3, 399.6]),
        e2e_ttft_ms: Stats::from_samples(&[433.7, 433.8, 433.9]),
        latency: Latency::from_requests(&raw),
        request_throughput: Some(1.04),
        output_throughput: Some(33.3),
        total_token_throughput: Some(2164.1),
        requests: 3,
        errors: 0,
        early_ended: 0,
        requests_raw: raw,
    }];
    let mut res = Resources {
        samples: 1200,
        rate_hz: Some(4.0),
        gpu_memory_peak_bytes: Some(101 << 30),
        gpu_memory_source: Some("unified".into()),
        sm_clock_min_mhz: Some(2200.0),
        sm_clock_mean_mhz: Some(2405.5),
        power_mean_w: Some(88.25),
        temp_max_c: Some(71.0),
        throttle: vec![ThrottleSeen {
            reason: "sw_power_cap".into(),
            first_seen: t0,
            last_seen: t0 + chrono::TimeDelta::seconds(3),
            samples: 12,
        }],
        host_cpu_mean_pct: Some(7.5),
        host_cpu_max_pct: Some(31.0),
        target_rss_peak_bytes: Some(5 << 30),
        server_preemptions: Some(2),
        series: Vec::new(),
    };
    res.set_series(
        (0..5000)
            .map(|i| SeriesPoint {
                t_s: f64::from(i) * 0.25,
                gpu_mem_bytes: Some(100 << 30),
                sm_clock_mhz: Some(2400.0 + f64::from(i % 7)),
                power_w: Some(80.0 + f64::from(i % 13) / 3.0),
                temp_c: Some(65.0),
                gpu_util_pct: Some(97.0),
                host_cpu_pct: Some(5.0),
                target_rss_bytes: Some(4 << 30),
                gen_tps: Some(59.4),
            })
            .collect(),
    );
    r.resources = Some(res);
    r
}

#[test]
fn full_record_round_trips_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path().join("runs"));
    let (checkout, repo_sha) = source_checkout();
    let rec = full_record(checkout.path());
    assert_eq!(
        rec.resources.as_ref().unwrap().series.len(),
        SERIES_MAX_POINTS
    );
    let mut handle = store.create(rec.clone()).unwrap();
    let name = handle
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with(&rec.identity.started_at.format("%Y%m%dT%H%M%SZ").to_string()));
    assert!(
        name.ends_with(&format!(
            "-cutlass-all-mxfp4-{}.json",
            rec.identity.run_id.short()
        )),
        "{name}"
    );
    assert_eq!(load_file(handle.path()).unwrap(), rec);

    handle.finish(RunStatus::Completed, None).unwrap();
    let back = load_file(handle.path()).unwrap();
    assert_eq!(&back, handle.record());
    assert_eq!(back.identity.status, RunStatus::Completed);
    assert!(back.identity.ended_at.is_some());
    // The server's pre-emptions while watched come back, and `runs show` names them.
    assert_eq!(back.resources.as_ref().unwrap().server_preemptions, Some(2));
    let shown = mxtune::record::cli::render_show(&mxtune::record::store::StoredRun {
        path: handle.path().to_path_buf(),
        record: back.clone(),
    });
    assert!(
        shown.contains("server pre-empted 2 request(s) while watched (its KV cache was short"),
        "{shown}"
    );
    // Every summary can be recomputed from the stored raw timings.
    let p = &back.results[0];
    assert_eq!(Latency::from_requests(&p.requests_raw), p.latency);
    let host = &back.environment.host;
    assert!(host.hostname.is_some() && host.kernel.is_some() && host.ram_total_bytes.is_some());
    let src = &back.environment.source_repos[0];
    assert_eq!(src.name, "vllm");
    assert_eq!(src.sha.as_deref(), Some(repo_sha.as_str()));
    assert_eq!(src.branch.as_deref(), Some("mxfp4-wip"));
    assert_eq!(src.dirty, Some(true));
    assert_eq!(src.error, None);
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .output()
        .expect("git is installed");
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// A source checkout on branch `mxfp4-wip` with one commit and an uncommitted change.
fn source_checkout() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "mxfp4-wip"]);
    std::fs::write(dir.path().join("setup.py"), "v1").unwrap();
    git(dir.path(), &["add", "setup.py"]);
    git(dir.path(), &["commit", "-q", "-m", "one"]);
    std::fs::write(dir.path().join("setup.py"), "v2").unwrap();
    let sha = git(dir.path(), &["rev-parse", "HEAD"]);
    (dir, sha)
}

#[test]
fn atomic_write_survives_a_crash_between_temp_write_and_rename() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path());
    let mut handle = store
        .create(RunRecord::new(TargetKind::Engine, Some("tiny".into())))
        .unwrap();
    let before = load_file(handle.path()).unwrap();

    // The next update is fully written to its temp file, then the process "dies".
    let mut next = before.clone();
    next.results.push(PointResult::default());
    let staged = store::stage(handle.path(), &serde_json::to_vec_pretty(&next).unwrap()).unwrap();
    let temp = staged.temp_path().to_path_buf();
    drop(staged);

    assert!(temp.exists());
    assert_eq!(
        load_file(handle.path()).unwrap(),
        before,
        "record must be the last complete version"
    );
    let scan = store.scan().unwrap();
    assert_eq!(scan.runs.len(), 1);
    assert!(scan.bad.is_empty(), "{:?}", scan.bad);
    assert_eq!(scan.leftover_temps, vec![temp]);

    // A later writer is not disturbed by the leftover.
    handle
        .update(|r| r.identity.note = Some("after crash".into()))
        .unwrap();
    assert_eq!(
        load_file(handle.path()).unwrap().identity.note.as_deref(),
        Some("after crash")
    );
}

#[test]
fn another_runs_file_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path());
    let rec = RunRecord::new(TargetKind::Attach, None);
    let first = store.create(rec.clone()).unwrap();
    let original = std::fs::read(first.path()).unwrap();
    let mut clash = rec.clone();
    clash.identity.note = Some("impostor".into());
    let err = store.create(clash).unwrap_err().to_string();
    assert!(err.contains("refusing to overwrite"), "{err}");
    assert_eq!(std::fs::read(first.path()).unwrap(), original);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temp file left behind"
    );
}

#[test]
fn secrets_are_redacted_in_env_argv_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path());
    let mut rec = RunRecord::new(TargetKind::Docker, Some("secrets".into()));
    rec.target.flags = serde_json::json!({
        "api_key": "sk-flag-secret", "serving": {"max_num_batched_tokens": 8192}, "hfToken": "hf_flag",
        "extra_args": ["--api-key=sk-in-list"]
    });
    rec.target.launch = Some(LaunchSpec {
        argv: [
            "vllm",
            "serve",
            "m",
            "--api-key",
            "sk-argv-secret",
            "--hf-token=hf_argv",
            "--max-num-batched-tokens",
            "8192",
            "--tokenizer",
            "openai/gpt-oss-120b",
            "-e",
            "HF_TOKEN=hf_docker_e",
        ]
        .map(String::from)
        .to_vec(),
        env: BTreeMap::from([
            ("HF_TOKEN".into(), "hf_env".into()),
            ("OPENAI_API_KEY".into(), "sk-env".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "aws-env".into()),
            ("DB_PASSWORD".into(), "pw-env".into()),
            ("VLLM_MXFP4_BACKEND".into(), "CUTLASS".into()),
            ("HTTPS_PROXY".into(), "http://op:proxy-pw@proxy:3128".into()),
        ]),
        ..LaunchSpec::default()
    });
    rec.target.url = Some("https://bench:url-pw@gpu-box:8000/v1".into());
    let h = store.create(rec).unwrap();
    let raw = std::fs::read_to_string(h.path()).unwrap();
    for secret in [
        "sk-flag-secret",
        "hf_flag",
        "sk-in-list",
        "sk-argv-secret",
        "hf_argv",
        "hf_docker_e",
        "hf_env",
        "sk-env",
        "aws-env",
        "pw-env",
        "proxy-pw",
        "url-pw",
    ] {
        assert!(!raw.contains(secret), "{secret} leaked into {raw}");
    }
    let back = load_file(h.path()).unwrap();
    let l = back.target.launch.unwrap();
    assert_eq!(
        l.argv,
        [
            "vllm",
            "serve",
            "m",
            "--api-key",
            "<redacted>",
            "--hf-token=<redacted>",
            "--max-num-batched-tokens",
            "8192",
            "--tokenizer",
            "openai/gpt-oss-120b",
            "-e",
            "HF_TOKEN=<redacted>",
        ]
    );
    assert_eq!(l.env["HF_TOKEN"], "<redacted>");
    assert_eq!(l.env["OPENAI_API_KEY"], "<redacted>");
    assert_eq!(l.env["AWS_SECRET_ACCESS_KEY"], "<redacted>");
    assert_eq!(l.env["DB_PASSWORD"], "<redacted>");
    assert_eq!(l.env["VLLM_MXFP4_BACKEND"], "CUTLASS");
    assert_eq!(l.env["HTTPS_PROXY"], "http://op:<redacted>@proxy:3128");
    assert_eq!(
        back.target.url.as_deref(),
        Some("https://bench:<redacted>@gpu-box:8000/v1")
    );
    assert_eq!(back.target.flags["api_key"], "<redacted>");
    assert_eq!(back.target.flags["hfToken"], "<redacted>");
    assert_eq!(back.target.flags["serving"]["max_num_batched_tokens"], 8192);
    assert_eq!(back.target.flags["extra_args"][0], "--api-key=<redacted>");
}

#[test]
fn v0_draft_record_migrates_to_current_schema() {
    let r = load_file(&fixture("v0-draft.json")).unwrap();
    assert_eq!(r.schema_version, SCHEMA_VERSION);
    assert_eq!(r.identity.run_id.to_string(), "01KCXFSEM01P777XC4TJX63C2V");
    assert_eq!(r.identity.status, RunStatus::Completed);
    assert_eq!(r.identity.mxtune_version, "0.0.1");
    assert_eq!(r.identity.tags, vec!["draft"]);
    assert_eq!(r.target.kind, TargetKind::Docker);
    assert_eq!(r.target.preset.as_deref(), Some("stock"));
    assert_eq!(
        r.target.docker.as_ref().unwrap().image,
        "vllm/vllm-openai:latest"
    );
    assert_eq!(
        r.environment.host.hostname.as_deref(),
        Some("spark-fixture")
    );
    let l = r.target.launch.as_ref().unwrap();
    assert_eq!(
        l.env["HF_TOKEN"], "<redacted>",
        "old files must not show secrets"
    );
    assert_eq!(l.argv[4], "<redacted>");
    assert_eq!(r.results.len(), 2);
    let pp = r.results[0].pp_tps.unwrap();
    assert_eq!(pp.n, 3);
    assert!((pp.mean - 4663.7).abs() < 1e-9);
    assert_eq!((pp.min, pp.max), (4620.0, 4700.0));
    assert_eq!(r.results[1].point.depth, 4096);
    assert_eq!(r.results[1].tg_tps.unwrap().std, 0.0);
}

fn write(dir: &Path, name: &str, contents: &[u8]) {
    std::fs::write(dir.join(name), contents).unwrap();
}

/// A runs directory with two good records and one of every kind of bad file.
fn messy_runs_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = std::fs::read(fixture("v1-marlin-triton.json")).unwrap();
    write(d, "20260109T162501Z-marlin-triton-BENKA5.json", &good);
    std::fs::copy(
        fixture("v0-draft.json"),
        d.join("20251220T090000Z-stock-X63C2V.json"),
    )
    .unwrap();
    write(d, "truncated.json", &good[..good.len() / 2]);
    write(
        d,
        "corrupt.json",
        b"{\"format\": \"mxtune-run-record\", \"schema_version\": 1,, }",
    );
    write(
        d,
        "foreign.json",
        b"{\"name\": \"left-pad\", \"version\": \"1.3.0\"}",
    );
    write(d, "array.json", b"[1, 2, 3]");
    write(d, "empty.json", b"");
    let mut newer: serde_json::Value = serde_json::from_slice(&good).unwrap();
    newer["schema_version"] = 99.into();
    write(
        d,
        "newer.json",
        serde_json::to_string(&newer).unwrap().as_bytes(),
    );
    let mut invalid: serde_json::Value = serde_json::from_slice(&good).unwrap();
    invalid["identity"]["status"] = "exploded".into();
    write(
        d,
        "invalid.json",
        serde_json::to_string(&invalid).unwrap().as_bytes(),
    );
    write(d, "notes.txt", b"not a record, not a .json file");
    write(d, ".20260109T162501Z-x.json.123.0.tmp", b"{\"half\": ");
    write(d, "launched-engines.json", b"{\"engines\": []}");
    write(d, ".launched-engines.json.77.tmp", b"{");
    dir
}

#[test]
fn bad_files_are_reported_by_name_and_the_rest_still_load() {
    let dir = messy_runs_dir();
    let scan = RunStore::new(dir.path()).scan().unwrap();
    let ids: Vec<String> = scan
        .runs
        .iter()
        .map(|r| r.record.identity.run_id.to_string())
        .collect();
    assert_eq!(
        ids,
        ["01KEHS6NT8YQMP9ZD4B2BENKA5", "01KCXFSEM01P777XC4TJX63C2V"],
        "newest first"
    );
    let reasons: BTreeMap<String, String> = scan
        .bad
        .iter()
        .map(|b| {
            (
                b.path.file_name().unwrap().to_string_lossy().into_owned(),
                b.reason.clone(),
            )
        })
        .collect();
    let expect = [
        ("array.json", "not an mxtune run record"),
        ("corrupt.json", "corrupt JSON"),
        ("empty.json", "empty file"),
        ("foreign.json", "not an mxtune run record"),
        ("invalid.json", "invalid run record"),
        ("newer.json", "newer mxtune (schema v99"),
        ("truncated.json", "truncated JSON"),
    ];
    assert_eq!(reasons.len(), expect.len(), "{reasons:?}");
    for (file, want) in expect {
        assert!(reasons[file].contains(want), "{file}: {}", reasons[file]);
    }
    assert_eq!(scan.leftover_temps.len(), 1);
}

#[test]
fn cli_runs_list_survives_corrupt_files() {
    let dir = messy_runs_dir();
    let out = mxtune(
        &["runs", "list", "--runs-dir", &dir.path().to_string_lossy()],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("STARTED (UTC)"));
    assert!(lines[1].contains("01KEHS6NT8YQMP9ZD4B2BENKA5") && lines[1].contains("marlin-triton"));
    assert!(lines[1].contains("tg32 31.58±0.06") && lines[1].contains("completed"));
    assert!(lines[2].contains("01KCXFSEM01P777XC4TJX63C2V") && lines[2].contains("stock"));
    let stderr = text(&out.stderr);
    for f in [
        "truncated.json",
        "corrupt.json",
        "foreign.json",
        "newer.json",
        "empty.json",
        "array.json",
    ] {
        assert!(stderr.contains(f), "{f} not reported: {stderr}");
    }
    assert!(stderr.contains("temp file"), "{stderr}");
}

fn fixture_runs_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "v1-marlin-triton.json",
        "v1-marlin-flashinfer.json",
        "v1-cutlass-flashinfer.json",
        "v0-draft.json",
    ] {
        std::fs::copy(fixture(f), dir.path().join(f)).unwrap();
    }
    dir
}

#[test]
fn cli_runs_list_filters_by_preset_and_since() {
    let dir = fixture_runs_dir();
    let out = mxtune(
        &["runs", "list", "--preset", "marlin-flashinfer"],
        Some(dir.path()),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert_eq!(s.lines().count(), 2, "{s}");
    assert!(s.contains("01KEKS5910HXXEVSRGX8D6PESW"));

    let out = mxtune(&["runs", "list", "--since", "2026-01-10"], Some(dir.path()));
    let s = text(&out.stdout);
    let ids: Vec<&str> = s
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(
        ids,
        ["01KEQ5RD48AJG15D03KE2YQCVT", "01KEKS5910HXXEVSRGX8D6PESW"]
    );

    let out = mxtune(
        &["runs", "list", "--since", "3 fortnights"],
        Some(dir.path()),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--since `3 fortnights`"),
        "{}",
        text(&out.stderr)
    );

    let empty = tempfile::tempdir().unwrap();
    let out = mxtune(
        &[
            "runs",
            "list",
            "--runs-dir",
            &empty.path().join("none").to_string_lossy(),
        ],
        None,
    );
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "no runs\n");
}

#[test]
fn cli_runs_show_accepts_prefix_and_short_id() {
    let dir = fixture_runs_dir();
    let out = mxtune(&["runs", "show", "01KEQ5"], Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for want in [
        "01KEQ5RD48AJG15D03KE2YQCVT",
        "status    completed",
        "preset cutlass-flashinfer",
        "vllm-mxfp4-dev:latest",
        "NVIDIA GB10",
        "--api-key '<redacted>'",
        "pp2048 tg32",
        "5699.57 ± 38.47",
        "native SM121 CUTLASS FP8xFP4",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    let by_short = mxtune(&["runs", "show", "2YQCVT"], Some(dir.path()));
    assert_eq!(text(&by_short.stdout), s);

    // --json prints the migrated record: the v0 draft comes out in the current shape.
    let out = mxtune(&["runs", "show", "--json", "01KCXF"], Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: RunRecord = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown, load_file(&fixture("v0-draft.json")).unwrap());
    assert_eq!(shown.schema_version, SCHEMA_VERSION);

    let out = mxtune(&["runs", "show", "01KE"], Some(dir.path()));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("matches 3 runs"),
        "{}",
        text(&out.stderr)
    );
    let out = mxtune(&["runs", "show", "7ZZZZ"], Some(dir.path()));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no run matches `7ZZZZ`"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn cli_runs_compare_text_and_markdown() {
    let dir = fixture_runs_dir();
    let args = ["runs", "compare", "01KEHS", "01KEKS", "01KEQ5"];
    let out = mxtune(&args, Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("compare_text", text(&out.stdout));

    let mut md_args = args.to_vec();
    md_args.extend(["--format", "md"]);
    let out = mxtune(&md_args, Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = text(&out.stdout);
    assert!(
        md.starts_with("| Config | pp2048 (tok/s) | tg32 (tok/s) | tg128 (tok/s) | Decode Δ |"),
        "{md}"
    );
    insta::assert_snapshot!("compare_md", md);

    let out = mxtune(&["runs", "compare", "01KEHS"], Some(dir.path()));
    assert!(!out.status.success(), "one run is not a comparison");

    // --noise sets the threshold: tg128 of B is +0.68 t/s with a std of 0.18, beyond
    // 2·std and within 4·std.
    let row = |out: &std::process::Output| {
        let t = text(&out.stdout);
        let mut lines = t.lines().skip_while(|l| !l.starts_with("pp2048 tg128"));
        lines.nth(1).unwrap_or_default().to_string()
    };
    let out = mxtune(&args, Some(dir.path()));
    assert!(row(&out).contains("+2.2% (beyond noise)"), "{}", row(&out));
    let mut wide = args.to_vec();
    wide.extend(["--noise", "4"]);
    let out = mxtune(&wide, Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(row(&out).contains("+2.2% (within noise)"), "{}", row(&out));
    assert!(
        text(&out.stdout).contains("< 4·std"),
        "{}",
        text(&out.stdout)
    );
    let mut bad = args.to_vec();
    bad.extend(["--noise", "0"]);
    let out = mxtune(&bad, Some(dir.path()));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("noise threshold `0`: give a number of standard deviations"),
        "{}",
        text(&out.stderr)
    );
}

/// Child mode of `kill_9_during_updates_leaves_a_readable_record`: update a record
/// forever, as a benchmark adding points would, until killed.
fn writer_until_killed(dir: &Path) -> ! {
    let store = RunStore::new(dir);
    let mut run = store
        .create(mxtune::record::begin(
            TargetKind::Engine,
            Some("crash".into()),
            &[],
        ))
        .unwrap();
    for i in 0u32.. {
        run.update(|r| {
            r.results.push(PointResult {
                point: WorkloadPoint {
                    pp: i,
                    tg: 32,
                    depth: 0,
                    concurrency: 1,
                },
                tg_tps: Stats::from_samples(&[f64::from(i), f64::from(i) + 0.5]),
                requests: i,
                ..PointResult::default()
            })
        })
        .unwrap();
    }
    unreachable!("the parent kills this process")
}

#[test]
fn cli_runs_list_shows_interrupted_runs_by_pid_and_boot_id_without_rewriting_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::new(dir.path());
    // A writer that was killed: its process is gone (reaped, so the pid is free).
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let mut rows = Vec::new();
    for (preset, pid, boot) in [
        ("killed-writer", dead_pid, mxtune::record::schema::boot_id()),
        // This very process is alive, but the record was written in another boot.
        (
            "other-boot",
            std::process::id(),
            Some("0-other-boot".to_string()),
        ),
        // Alive in this boot: still running.
        (
            "live-writer",
            std::process::id(),
            mxtune::record::schema::boot_id(),
        ),
    ] {
        let mut r = mxtune::record::begin(TargetKind::Engine, Some(preset.into()), &[]);
        r.identity.pid = Some(pid);
        r.identity.boot_id = boot;
        let h = store.create(r).unwrap();
        let bytes = std::fs::read(h.path()).unwrap();
        rows.push((preset, h.path().to_path_buf(), bytes));
    }
    let out = mxtune(&["runs", "list"], Some(dir.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let status_of = |preset: &str| {
        stdout
            .lines()
            .find(|l| l.contains(preset))
            .unwrap_or_else(|| panic!("no {preset} in\n{stdout}"))
            .to_string()
    };
    assert!(
        status_of("killed-writer").contains("interrupted"),
        "{stdout}"
    );
    assert!(status_of("other-boot").contains("interrupted"), "{stdout}");
    let live = status_of("live-writer");
    assert!(
        live.contains("running") && !live.contains("interrupted"),
        "{stdout}"
    );
    // History is not rewritten: every file is byte for byte what was written.
    for (preset, path, bytes) in rows {
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{preset} was rewritten"
        );
    }
}

#[test]
fn kill_9_during_updates_leaves_a_readable_record() {
    if let Some(dir) = std::env::var_os("MXTUNE_TEST_CRASH_WRITER_DIR") {
        writer_until_killed(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "kill_9_during_updates_leaves_a_readable_record",
            "--exact",
            "--test-threads=1",
        ])
        .env("MXTUNE_TEST_CRASH_WRITER_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let store = RunStore::new(dir.path());
    // Wait (bounded, so a broken writer fails the test instead of hanging it) until the
    // writer has rewritten the record many times, then kill it mid-stream.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let scan = store.scan().unwrap();
        if scan
            .runs
            .first()
            .is_some_and(|r| r.record.results.len() >= 50)
        {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "writer exited early");
        assert!(
            std::time::Instant::now() < deadline,
            "writer made no progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let scan = store.scan().unwrap();
    assert!(scan.bad.is_empty(), "{:?}", scan.bad);
    assert_eq!(scan.runs.len(), 1);
    let r = &scan.runs[0].record;
    assert_eq!(r.identity.status, RunStatus::Running, "nobody finished it");
    assert_eq!(mxtune::record::cli::status_text(r), "interrupted");
    assert!(r.results.len() >= 50);
    for (i, p) in r.results.iter().enumerate() {
        assert_eq!(p.point.pp as usize, i, "points are complete and in order");
    }
    assert!(
        scan.leftover_temps.len() <= 1,
        "at most the one interrupted write"
    );
}

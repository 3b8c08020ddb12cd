//! llama-benchy (PyPI `llama-benchy`, the benchmark the tuning logs use) against the real
//! `mxtune serve --synthetic tiny` binary on 127.0.0.1, token ids on. Skips without
//! llama-benchy, unless `MXTUNE_TEST_LLAMA_BENCHY=require` (CI), where that fails.
//!
//! llama-benchy reads two things from the internet that CI does not have: a book from
//! Project Gutenberg (its prompt text) and a Hugging Face tokenizer. The test gives it both
//! locally (see docs/api.md, "llama-benchy"): the book in its download cache under a
//! temporary `HOME`, and a word-level `tokenizer.json` over the book's words.

use serde_json::{Value, json};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

fn has_llama_benchy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import llama_benchy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("MXTUNE_TEST_LLAMA_BENCHY").as_deref() != Ok("require"),
            "MXTUNE_TEST_LLAMA_BENCHY=require, but python3 cannot import llama_benchy \
             (pip install llama-benchy)"
        );
        eprintln!(
            "SKIPPED llama_benchy: python3 with `llama_benchy` not found (pip install llama-benchy)"
        );
    }
    ok
}

/// The words the prompt text is made of (any words do: the model is random).
const WORDS: [&str; 24] = [
    "the", "engine", "reads", "a", "prompt", "and", "writes", "tokens", "while", "operator",
    "watches", "every", "flag", "kernel", "memory", "clock", "on", "spark", "with", "records",
    "of", "runs", "quietly", "today",
];

/// A book of `n` words, in sentences; the same every time.
fn book(n: usize) -> String {
    let mut out = String::new();
    let mut x: u64 = 7;
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        out.push_str(if i % 12 == 11 { ".\n" } else { " " });
    }
    out
}

/// A Hugging Face `tokenizer.json` that splits on whitespace and knows the book's words
/// (each a token; anything else is `[UNK]`).
fn word_tokenizer() -> Value {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), json!(0));
    for w in WORDS {
        for word in [w.to_string(), format!("{w}.")] {
            let id = vocab.len();
            vocab.insert(word, json!(id));
        }
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    })
}

/// llama-benchy's download cache: `~/.cache/llama-benchy/<md5 of the URL>.txt`.
fn cache_book(home: &Path, url: &str, text: &str) {
    let dir = home.join(".cache/llama-benchy");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.md5(sys.argv[1].encode()).hexdigest())",
            url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let name = String::from_utf8(out.stdout).unwrap();
    std::fs::write(dir.join(format!("{}.txt", name.trim())), text).unwrap();
}

/// `mxtune serve` with `args` on a free port: the child and its base URL (from the ready
/// line). Its stderr goes to `log`.
fn spawn_serve(args: &[&str], log: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let base = loop {
        let Some(line) = lines.next() else {
            panic!(
                "mxtune serve ended before it was ready: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        };
        if let Some(url) = line.unwrap().strip_prefix("mxtune serve: ready on ") {
            break url.to_string();
        }
    };
    // Keep reading stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, base)
}

#[test]
fn llama_benchy_runs_against_serve_synthetic_tiny_with_token_ids() {
    if !has_llama_benchy() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let url = "http://127.0.0.1:9/no-book-download.txt";
    cache_book(&home, url, &book(4000));
    let tokenizer = dir.path().join("tokenizer.json");
    std::fs::write(&tokenizer, word_tokenizer().to_string()).unwrap();
    let (mut child, base) = spawn_serve(
        &[
            "--synthetic",
            "tiny",
            "--port",
            "0",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "4",
        ],
        &dir.path().join("serve.log"),
    );
    let results = dir.path().join("results.json");
    let progress = dir.path().join("progress.jsonl");
    let (pp, tg, depths, concurrency, runs) = (160, 8, [0, 256], [1, 2], 2);
    let out = Command::new("python3")
        .args(["-m", "llama_benchy", "--base-url"])
        .arg(format!("{base}/v1"))
        .args(["--model", "synthetic-tiny", "--tokenizer"])
        .arg(&tokenizer)
        .args([
            "--book-url",
            url,
            "--pp",
            &pp.to_string(),
            "--tg",
            &tg.to_string(),
        ])
        .arg("--depth")
        .args(depths.map(|d| d.to_string()))
        .arg("--concurrency")
        .args(concurrency.map(|c| c.to_string()))
        .args(["--runs", &runs.to_string(), "--latency-mode", "generation"])
        // Random weights never answer "Paris"; a fixed output length (min_tokens and
        // ignore_eos), and every token one plain-text token, so every streamed chunk
        // carries text and the token count is exact.
        .args(["--skip-coherence", "--exact-tg", "--exit-on-first-fail"])
        .args(["--extra-body", "return_token_ids=true"])
        .args(["--extra-body", r#"logit_bias={"1000":100}"#])
        .args(["--format", "json", "--save-result"])
        .arg(&results)
        .arg("--emit-progress")
        .arg(&progress)
        .env("HOME", &home)
        // Nothing is fetched from Hugging Face: the tokenizer is the local file.
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    // SAFETY: plain kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let served = child.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = format!(
        "stdout:\n{stdout}\nstderr:\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
    );
    assert!(out.status.success(), "llama-benchy failed\n{said}");
    assert!(
        served.success(),
        "mxtune serve did not stop cleanly: {served:?}\n{said}"
    );
    // It read our book and our tokenizer, and never fell back to estimating tokens.
    assert!(stdout.contains("Loading text from cache"), "{said}");
    for fallback in [
        "Falling back",
        "No complete token_ids",
        "No token_ids",
        "Error",
        "HTTP ",
    ] {
        assert!(
            !stdout.contains(fallback),
            "`{fallback}` in the output\n{said}"
        );
    }

    // One result per depth and concurrency, each with prefill and decode figures.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let rows = report["benchmarks"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    let mut seen = Vec::new();
    for row in rows {
        assert_eq!(row["prompt_size"], pp, "{row}");
        assert_eq!(row["response_size"], tg, "{row}");
        let requests = runs * row["concurrency"].as_u64().unwrap() as usize;
        // Throughputs per run (a batch of `concurrency` requests), times per request.
        for (metric, count) in [
            ("pp_throughput", runs),
            ("tg_throughput", runs),
            ("ttfr", requests),
            ("e2e_ttft", requests),
        ] {
            let values = row[metric]["values"]
                .as_array()
                .unwrap_or_else(|| panic!("no {metric} in {row}"));
            assert_eq!(values.len(), count, "{metric}: {row}");
            assert!(
                values.iter().all(|v| v.as_f64().is_some_and(|x| x > 0.0)),
                "{metric}: {row}"
            );
        }
        seen.push((
            row["context_size"].as_u64().unwrap(),
            row["concurrency"].as_u64().unwrap(),
        ));
    }
    seen.sort();
    assert_eq!(seen, [(0, 1), (0, 2), (256, 1), (256, 2)], "{report}");

    // Every measured request: no error, the prompt counted by the server, exactly `tg`
    // tokens counted from the chunks' token ids (never estimated).
    let events: Vec<Value> = std::fs::read_to_string(&progress)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "request_end")
        .collect();
    let expected: usize = depths.len() * concurrency.iter().sum::<usize>() * runs;
    assert_eq!(ends.len(), expected, "{events:?}");
    for e in &ends {
        assert_eq!(e["error"], "", "{e}");
        assert_eq!(e["total_tokens"], tg, "{e}");
        assert!(e["prompt_tokens"].as_u64().unwrap() > 100, "{e}");
    }
    let token_events = events.iter().filter(|e| e["type"] == "tokens");
    assert!(token_events.clone().count() >= expected, "{events:?}");
    for e in token_events {
        assert!(e.get("estimated").is_none(), "{e}");
    }
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "bench_complete" && e["status"] == "ok"),
        "{events:?}"
    );
}

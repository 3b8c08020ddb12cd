//! The OpenAI-compatible server over real HTTP on 127.0.0.1, with a scripted backend
//! standing in for the model (the model is tested by the engine-core tests).

mod engine_server_support;

use engine_server_support::{
    Probe, SCRIPT, ServerOptions, TOOL_SCRIPT, TestServer, candidates, has_python_openai,
    logits_after, metric, options, python, sse_data, start, start_gated, start_with_probe,
    start_with_script, tiny_cpu_server,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    post_url(&s.base, path, body).await
}

/// POST `body` to the server at `base`; its status and JSON answer.
async fn post_url(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn post_stream(s: &TestServer, path: &str, body: Value) -> Vec<String> {
    let r = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    sse_data(&r.text().await.unwrap())
}

async fn metrics(s: &TestServer) -> String {
    client()
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Poll /metrics until `cond` holds (bounded, so a bug fails instead of hanging).
async fn wait_metrics(s: &TestServer, what: &str, cond: impl Fn(&str) -> bool) -> String {
    for _ in 0..2000 {
        let m = metrics(s).await;
        if cond(&m) {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("metrics never showed {what}:\n{}", metrics(s).await);
}

fn running(m: &str) -> f64 {
    metric(m, "vllm:num_requests_running{").unwrap()
}

fn waiting(m: &str) -> f64 {
    metric(m, "vllm:num_requests_waiting{").unwrap()
}

/// The double's greedy continuation of `prompt` (what the server must reproduce).
fn greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut h = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = candidates(&h)[0].0;
        h.push(t);
        out.push(t);
    }
    out
}

fn script_parts() -> (String, String) {
    let a = SCRIPT.split("<|message|>").nth(1).unwrap();
    let reasoning = a.split("<|end|>").next().unwrap().to_string();
    let b = SCRIPT.split("<|message|>").nth(2).unwrap();
    let content = b.split("<|return|>").next().unwrap().to_string();
    (reasoning, content)
}

fn script_len() -> usize {
    mxtune::engine::tokenizer::Tokenizer::o200k_harmony()
        .encode_with_specials(SCRIPT)
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn models_health_and_metrics_names() {
    let s = start(options(), 8, 0).await;
    let r = client()
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = client()
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "double");
    assert_eq!(v["data"][0]["max_model_len"], 2048);
    assert_eq!(v["data"][0]["weights"], "checkpoint");
    let m = metrics(&s).await;
    for name in [
        "vllm:num_requests_running{model_name=\"double\",engine=\"0\"} 0",
        "vllm:num_requests_waiting{model_name=\"double\",engine=\"0\"} 0",
        "vllm:kv_cache_usage_perc{model_name=\"double\",engine=\"0\"} 0",
        "vllm:prompt_tokens_total{model_name=\"double\",engine=\"0\"} 0",
        "vllm:generation_tokens_total{model_name=\"double\",engine=\"0\"} 0",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        "# TYPE vllm:inter_token_latency_seconds histogram",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        "# TYPE vllm:request_queue_time_seconds histogram",
        "# TYPE vllm:time_per_output_token_seconds histogram",
        "# TYPE vllm:request_time_per_output_token_seconds histogram",
        "# TYPE vllm:request_prefill_time_seconds histogram",
        "# TYPE vllm:request_decode_time_seconds histogram",
        "# TYPE vllm:request_prompt_tokens histogram",
        "# TYPE vllm:request_generation_tokens histogram",
        "# TYPE vllm:iteration_tokens_total histogram",
        "vllm:cache_config_info{block_size=\"1\",enable_prefix_caching=\"False\",engine=\"0\",num_gpu_blocks=\"8192\"} 1.0",
    ] {
        assert!(m.contains(name), "missing {name} in\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn completion_token_ids_greedy_with_logprobs() {
    let s = start(options(), 8, 0).await;
    let prompt: Vec<u32> = (0..100).map(|i| 500 + i * 3).collect();
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"model": "double", "prompt": prompt, "max_tokens": 12, "temperature": 0,
               "logprobs": 3, "return_tokens_as_token_ids": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let want = greedy(&prompt, 12);
    let lp = &v["choices"][0]["logprobs"];
    let got: Vec<String> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let want_names: Vec<String> = want.iter().map(|t| format!("token_id:{t}")).collect();
    assert_eq!(got, want_names);
    // The logprob equals log-softmax of the double's logits.
    let l = logits_after(&prompt, &[], 201_088);
    let lse = {
        let m = l.iter().copied().fold(f32::MIN, f32::max);
        m + l.iter().map(|x| f64::from(x - m).exp()).sum::<f64>().ln() as f32
    };
    let lp0 = lp["token_logprobs"][0].as_f64().unwrap() as f32;
    assert!((lp0 - (l[want[0] as usize] - lse)).abs() < 1e-4);
    let top0 = lp["top_logprobs"][0].as_object().unwrap();
    assert_eq!(top0.len(), 3);
    assert!(top0.contains_key(&format!("token_id:{}", want[0])));
    let text = mxtune::engine::tokenizer::Tokenizer::o200k_harmony().decode(&want, true);
    assert_eq!(v["choices"][0]["text"], text);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], 112);
    // Prefill was chunked (64 tokens per step) and still counted once.
    let m = metrics(&s).await;
    assert_eq!(metric(&m, "vllm:prompt_tokens_total{"), Some(100.0), "{m}");
    assert_eq!(metric(&m, "vllm:generation_tokens_total{"), Some(12.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn completion_text_prompt_stream_and_usage() {
    let s = start(options(), 8, 0).await;
    let tok = mxtune::engine::tokenizer::Tokenizer::o200k_harmony();
    let ids = tok.encode_text("Once upon a time");
    let data = post_stream(
        &s,
        "/v1/completions",
        json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert_eq!(usage["usage"]["prompt_tokens"], ids.len());
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, tok.decode(&greedy(&ids, 6), true));
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_non_stream_splits_reasoning_and_content() {
    let s = start(options(), 8, 0).await;
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "double", "messages": [{"role": "user", "content": "Hi"}],
               "temperature": 0, "reasoning_effort": "low"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (reasoning, content) = script_parts();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["reasoning_content"], reasoning);
    assert_eq!(msg["content"], content);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], script_len());
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_stream_role_deltas_usage_done() {
    let s = start(options(), 8, 0).await;
    let data = post_stream(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": "Be nice."},
                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
               "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
               "logprobs": true, "top_logprobs": 2}),
    )
    .await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut lp_tokens = 0;
    for c in &chunks[1..] {
        if let Some(ch) = c["choices"].get(0) {
            reasoning.push_str(ch["delta"]["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if let Some(l) = ch["logprobs"]["content"].as_array() {
                lp_tokens += l.len();
                assert_eq!(l[0]["top_logprobs"].as_array().unwrap().len(), 2);
            }
        }
    }
    let (want_r, want_c) = script_parts();
    assert_eq!((reasoning, content), (want_r, want_c));
    assert_eq!(
        lp_tokens,
        script_len(),
        "one logprob entry per generated token"
    );
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], script_len());
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    // Without include_usage there is no usage chunk.
    let data = post_stream(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "stream": true}),
    )
    .await;
    assert!(data.iter().all(|d| !d.contains("\"usage\"")));
    assert_eq!(data.last().unwrap(), "[DONE]");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_stream_role_chunk_waits_for_the_first_token() {
    let probe = Arc::new(engine_server_support::Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let s = start_with_probe(options(), 8, 0, probe.clone()).await;
    let url = format!("{}/v1/chat/completions", s.base);
    let p = probe.clone();
    // The reader notes whether the engine was still held (no token computed) when the
    // first body bytes arrived.
    let reader = tokio::spawn(async move {
        let mut r = client()
            .post(url)
            .json(&json!({"messages": [{"role": "user", "content": "Hi"}],
                          "max_tokens": 3, "stream": true}))
            .send()
            .await
            .unwrap();
        let first = r.chunk().await.unwrap().unwrap();
        let held = *p.gate_closed.lock().unwrap();
        let mut body = String::from_utf8_lossy(&first).into_owned();
        while let Some(c) = r.chunk().await.unwrap() {
            body.push_str(&String::from_utf8_lossy(&c));
        }
        (held, body)
    });
    for _ in 0..2000 {
        if probe.started.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(probe.started.load(Ordering::SeqCst), "the engine never ran");
    // Give a premature role chunk time to reach the client before the engine may proceed.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    probe.open_gate();
    let (held, body) = reader.await.unwrap();
    assert!(
        !held,
        "a chunk was sent before the first token existed:\n{body}"
    );
    let data = sse_data(&body);
    let first: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let second: Value = serde_json::from_str(&data[1]).unwrap();
    assert!(
        second["choices"][0]["delta"].get("role").is_none(),
        "{body}"
    );
    assert_eq!(data.last().unwrap(), "[DONE]");
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_strings_min_tokens_and_ignore_eos() {
    let s = start(options(), 8, 0).await;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (_, v) = post(&s, "/v1/chat/completions", chat(json!({"stop": ["there"]}))).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (_, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"ignore_eos": true, "max_tokens": 60})),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 60);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let min = script_len() + 5;
    let (_, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"min_tokens": min, "max_tokens": min + 40})),
    )
    .await;
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() >= min as u64,
        "{v}"
    );
}

/// The synthetic tiny model (random weights, the real vocabulary) on the CPU, as
/// `mxtune serve --synthetic tiny` serves it.
async fn tiny_server() -> TestServer {
    let backend = Box::new(mxtune::engine::cpu::CpuBackend::new(
        mxtune::engine::synthetic::build("tiny", 0).unwrap(),
        4 * 512,
    ));
    let opts = ServerOptions {
        served_model_name: "tiny".into(),
        max_model_len: 512,
        max_num_seqs: 4,
        max_num_batched_tokens: 512,
        kv_cache_tokens: 4 * 512,
        ..options()
    };
    start_gated(backend, opts, Arc::new(Probe::default())).await
}

/// `stop_token_ids` as vLLM applies them: generation ends on the listed token with
/// `finish_reason: "stop"`, the token is in `token_ids` but not in the text (unless
/// `include_stop_str_in_output`), it stops even with `ignore_eos`, `min_tokens` bans it
/// until then, and bad values get a 400 naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn stop_token_ids_end_generation_before_the_token() {
    let s = tiny_server().await;
    let tok = mxtune::engine::tokenizer::Tokenizer::o200k_harmony();
    let completion = |extra: Value| {
        let mut b = json!({"model": "tiny", "prompt": "The capital of France is",
                           "max_tokens": 16, "temperature": 0, "ignore_eos": true,
                           "return_token_ids": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (status, free) = post(&s, "/v1/completions", completion(json!({}))).await;
    assert_eq!(status, 200, "{free}");
    let ids = ids_of(&free["choices"][0]["token_ids"]);
    assert_eq!(ids.len(), 16, "{free}");
    // The first token after the start that comes for the first time and has text.
    let k = (1..ids.len())
        .find(|&k| !ids[..k].contains(&ids[k]) && !tok.token_text(ids[k]).is_empty())
        .unwrap_or_else(|| panic!("no token to stop on in the greedy output {ids:?}"));
    let stop = ids[k];
    let free_text = free["choices"][0]["text"].as_str().unwrap();
    let (status, v) = post(
        &s,
        "/v1/completions",
        completion(json!({"stop_token_ids": [stop]})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(ids_of(&c["token_ids"]), ids[..=k], "{v}");
    assert_eq!(c["finish_reason"], "stop", "{v}");
    assert_eq!(c["text"], tok.decode(&ids[..k], true), "{v}");
    assert!(free_text.starts_with(c["text"].as_str().unwrap()));
    assert_eq!(v["usage"]["completion_tokens"], k + 1, "{v}");
    // The same through a stream: the chunks' text and ids add up to the whole answer.
    let mut b = completion(json!({"stop_token_ids": [stop]}));
    b["stream"] = json!(true);
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", b).await);
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, c["text"].as_str().unwrap());
    let streamed: Vec<u32> = chunks
        .iter()
        .flat_map(|c| ids_of(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(streamed, ids[..=k]);
    assert_eq!(finishes(&chunks_of(&chunks, 0)), [json!("stop")]);
    // include_stop_str_in_output keeps the token's text.
    let (_, v) = post(
        &s,
        "/v1/completions",
        completion(json!({"stop_token_ids": [stop], "include_stop_str_in_output": true})),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], tok.decode(&ids[..=k], true), "{v}");
    // min_tokens bans the token until then: the answer is at least that long.
    let (_, v) = post(
        &s,
        "/v1/completions",
        completion(json!({"stop_token_ids": [stop], "min_tokens": k + 2})),
    )
    .await;
    let later = ids_of(&v["choices"][0]["token_ids"]);
    assert!(later.len() >= k + 2, "{v}");
    assert!(!later[..k + 2].contains(&stop), "{v}");
    // Chat: the same rule on the harmony answer.
    let chat = |extra: Value| {
        let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 12, "temperature": 0, "return_token_ids": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (status, free) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(status, 200, "{free}");
    let ids = ids_of(&free["choices"][0]["token_ids"]);
    let k = (1..ids.len())
        .find(|&k| !ids[..k].contains(&ids[k]))
        .unwrap_or_else(|| panic!("no token to stop on in the greedy chat answer {ids:?}"));
    let (_, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"stop_token_ids": [ids[k]]})),
    )
    .await;
    assert_eq!(ids_of(&v["choices"][0]["token_ids"]), ids[..=k], "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // Bad values: a 400 naming the field, on both endpoints.
    for bad in [
        json!(5),
        json!("5"),
        json!([-1]),
        json!([1.5]),
        json!(["a"]),
        json!([201_088]),
    ] {
        for (path, body) in [
            (
                "/v1/completions",
                completion(json!({"stop_token_ids": bad})),
            ),
            ("/v1/chat/completions", chat(json!({"stop_token_ids": bad}))),
        ] {
            let (status, v) = post(&s, path, body).await;
            assert_eq!(status, 400, "{path} {bad}: {v}");
            assert_eq!(v["error"]["param"], "stop_token_ids", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        }
    }
    let (status, _) = post(
        &s,
        "/v1/completions",
        completion(json!({"stop_token_ids": null})),
    )
    .await;
    assert_eq!(status, 200);
}

/// The double's greedy continuation of `prompt` under vLLM's repetition penalty `r`
/// (every token of prompt or output: positive logits divided by `r`, negative multiplied).
fn greedy_with_repetition_penalty(prompt: &[u32], n: usize, r: f32) -> Vec<u32> {
    let mut h = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let mut l = logits_after(&h, &[], 201_088);
        let seen: std::collections::HashSet<u32> = h.iter().copied().collect();
        for t in seen {
            let x = &mut l[t as usize];
            *x = if *x > 0.0 { *x / r } else { *x * r };
        }
        let best = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32;
        h.push(best);
        out.push(best);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_penalties_are_validated_and_applied() {
    let s = start(options(), 8, 0).await;
    let bad: Vec<(Value, &str)> = vec![
        (json!({"frequency_penalty": "banana"}), "frequency_penalty"),
        (json!({"presence_penalty": [1]}), "presence_penalty"),
        (json!({"repetition_penalty": true}), "repetition_penalty"),
        (json!({"frequency_penalty": 2.5}), "frequency_penalty"),
        (json!({"presence_penalty": -2.01}), "presence_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": -1.5}), "repetition_penalty"),
        (json!({"min_p": "banana"}), "min_p"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"min_p": -0.1}), "min_p"),
    ];
    for (extra, param) in bad {
        let mut body = json!({"prompt": [1, 2], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (st, v) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(st, 400, "{body} → {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(param),
            "{v}"
        );
    }
    // The chat endpoint validates the same fields.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "presence_penalty": "x"}),
    )
    .await;
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("presence_penalty"))
    );
    // Half of the double's candidate range sits in the prompt, so a repetition penalty
    // pushes those candidates below the others.
    let prompt: Vec<u32> = (1000..1500).collect();
    let ids = |v: &Value| -> Vec<u32> {
        v["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let plain = greedy(&prompt, 8);
    // Defaults, given explicitly or as null, leave greedy output unchanged.
    for defaults in [
        json!({"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1}),
        json!({"frequency_penalty": null, "presence_penalty": null, "repetition_penalty": null}),
        json!({"min_p": 0.5}),
    ] {
        let mut body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0,
                              "return_token_ids": true});
        for (k, v) in defaults.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (st, v) = post(&s, "/v1/completions", body).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(ids(&v), plain);
    }
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": true,
               "repetition_penalty": 2.0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let want = greedy_with_repetition_penalty(&prompt, 8, 2.0);
    assert_ne!(want, plain, "the prompt must make the penalty matter");
    assert_eq!(ids(&v), want);
    assert!(
        want.iter().all(|t| !(1000..1500).contains(t)),
        "penalised prompt tokens are not chosen: {want:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_options_return_token_ids_and_include_stop_str() {
    let s = start(options(), 8, 0).await;
    let as_ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    // stream_options needs stream: true (an empty object is ignored, as in vLLM).
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1], "max_tokens": 2, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("stream_options")),
        "{v}"
    );
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
               "stream": false, "stream_options": {"include_usage": false}}),
    )
    .await;
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("stream_options")),
        "{v}"
    );
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1], "max_tokens": 2, "stream_options": {}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // return_token_ids, completions: prompt and output ids per choice.
    let prompt: Vec<u32> = vec![7, 8, 9];
    let want = greedy(&prompt, 5);
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "return_token_ids": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(as_ids(&v["choices"][0]["prompt_token_ids"]), prompt);
    assert_eq!(as_ids(&v["choices"][0]["token_ids"]), want);
    // Off by default: no new fields.
    let (_, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 2}),
    )
    .await;
    assert!(v["choices"][0].get("token_ids").is_none(), "{v}");
    // Streamed: the first chunk carries the prompt, the chunks' ids add up to the output.
    let data = post_stream(
        &s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "stream": true,
               "return_token_ids": true}),
    )
    .await;
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(as_ids(&chunks[0]["choices"][0]["prompt_token_ids"]), prompt);
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c["choices"][0].get("prompt_token_ids").is_none())
    );
    let streamed: Vec<u32> = chunks
        .iter()
        .flat_map(|c| as_ids(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(streamed, want);
    // Chat: prompt ids once per response, output ids per choice, stop tokens included.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
                      "return_token_ids": true});
    let (st, v) = post(&s, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    let script = mxtune::engine::tokenizer::Tokenizer::o200k_harmony()
        .encode_with_specials(SCRIPT)
        .unwrap();
    assert_eq!(as_ids(&v["choices"][0]["token_ids"]), script);
    let chat_prompt = as_ids(&v["prompt_token_ids"]);
    assert_eq!(
        chat_prompt.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let data = post_stream(&s, "/v1/chat/completions", body).await;
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(as_ids(&chunks[0]["prompt_token_ids"]), chat_prompt);
    let streamed: Vec<u32> = chunks
        .iter()
        .flat_map(|c| as_ids(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(streamed, script);
    // include_stop_str_in_output keeps the stop string, in both modes.
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
                          "stop": ["there"], "include_stop_str_in_output": true});
    let (_, v) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello there");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let data = post_stream(&s, "/v1/chat/completions", body).await;
    let content: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(content, "Hello there");
}

/// A stream's JSON chunks: everything before `[DONE]`, which must end it.
fn stream_chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// The chunks of one choice of a stream (the usage chunk, with no choices, is no one's).
fn chunks_of(chunks: &[Value], index: usize) -> Vec<&Value> {
    chunks
        .iter()
        .filter(|k| k["choices"][0]["index"] == index)
        .collect()
}

/// The finish reasons a choice's chunks carry (exactly one is expected).
fn finishes(chunks: &[&Value]) -> Vec<Value> {
    chunks
        .iter()
        .map(|k| k["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn n_choices_are_sequences_of_their_own_seeded_seed_plus_index() {
    // options(): max_num_seqs 4, so 6 choices cannot all run at once.
    let s = start(options(), 8, 0).await;
    let body = |n: u64, seed: u64| {
        json!({"prompt": [1, 2, 3], "max_tokens": 12, "temperature": 1.0, "top_k": 8,
               "seed": seed, "n": n, "ignore_eos": true, "return_token_ids": true})
    };
    let (st, v) = post(&s, "/v1/completions", body(6, 40)).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap().clone();
    assert_eq!(choices.len(), 6, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(ids_of(&c["prompt_token_ids"]), [1, 2, 3]);
        assert_eq!(ids_of(&c["token_ids"]).len(), 12);
        assert_eq!(c["finish_reason"], "length");
        // Choice i is what one request seeded seed + i gives, as vLLM seeds its n children.
        let (_, one) = post(&s, "/v1/completions", body(1, 40 + i as u64)).await;
        assert_eq!(c["token_ids"], one["choices"][0]["token_ids"], "choice {i}");
        assert_eq!(c["text"], one["choices"][0]["text"], "choice {i}");
    }
    let distinct: std::collections::HashSet<&Value> = choices.iter().map(|c| &c["text"]).collect();
    assert!(distinct.len() > 1, "the choices should differ: {v}");
    // The prompt counts once, the completions of every choice add up.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 72, "total_tokens": 75})
    );
    // Same seed, same choices.
    let (_, again) = post(&s, "/v1/completions", body(6, 40)).await;
    assert_eq!(again["choices"], v["choices"]);
    // Streamed: each index's chunks add up to that choice; one finish each; usage sums.
    let mut b = body(6, 40);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", b).await);
    let last = chunks.last().unwrap();
    assert_eq!(
        (&last["choices"], &last["usage"]),
        (&json!([]), &v["usage"])
    );
    for (i, c) in choices.iter().enumerate() {
        let mine = chunks_of(&chunks, i);
        let text: String = mine
            .iter()
            .map(|k| k["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, c["text"].as_str().unwrap(), "choice {i}");
        let ids: Vec<u32> = mine
            .iter()
            .flat_map(|k| ids_of(&k["choices"][0]["token_ids"]))
            .collect();
        assert_eq!(ids, ids_of(&c["token_ids"]), "choice {i}");
        assert_eq!(
            ids_of(&mine[0]["choices"][0]["prompt_token_ids"]),
            [1, 2, 3]
        );
        assert_eq!(finishes(&mine), [json!("length")], "choice {i}");
    }
    // Chat: each choice parses its own harmony answer; the role chunk comes per index.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "n": 2, "seed": 5,
                      "temperature": 0.5});
    let (st, v) = post(&s, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    let (reasoning, content) = script_parts();
    for i in 0..2 {
        let c = &v["choices"][i];
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], content.as_str(), "{v}");
        assert_eq!(c["message"]["reasoning_content"], reasoning.as_str(), "{v}");
        assert_eq!(c["finish_reason"], "stop");
    }
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["completion_tokens"], 2 * script_len());
    let mut b = chat.clone();
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&post_stream(&s, "/v1/chat/completions", b).await);
    for i in 0..2 {
        let mine = chunks_of(&chunks, i);
        assert_eq!(mine[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = mine
            .iter()
            .filter_map(|k| k["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, content, "choice {i}");
        assert_eq!(finishes(&mine), [json!("stop")], "choice {i}");
    }
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        2 * script_len()
    );
}

/// With prefix caching on (the default), the `n` choices of a request share its prefill: the
/// first choice prefills the prompt, the others copy its KV (all but the last position) and
/// feed only the last token. Every choice's greedy tokens (top_k 1) are those of a lone
/// request on a server that shares nothing, and the engine fed the prompt once.
#[tokio::test(flavor = "multi_thread")]
async fn n_choices_prefill_the_prompt_once() {
    let tiny = || {
        Box::new(mxtune::engine::cpu::CpuBackend::new(
            mxtune::engine::synthetic::build("tiny", 0).unwrap(),
            4 * 256,
        ))
    };
    let opts = |caching: bool| ServerOptions {
        served_model_name: "tiny".into(),
        max_model_len: 256,
        max_num_seqs: 4,
        max_num_batched_tokens: 256,
        kv_cache_tokens: 4 * 256,
        enable_prefix_caching: caching,
        ..options()
    };
    let prompt: Vec<u32> = (0..40).map(|k| 1000 + 13 * k).collect();
    let body = |n: usize| {
        json!({"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 1.0,
               "top_k": 1, "n": n, "ignore_eos": true, "return_token_ids": true})
    };
    let fed = |m: &str| metric(m, "vllm:iteration_tokens_total_sum{").unwrap();
    let alone = start_gated(tiny(), opts(false), Arc::new(Probe::default())).await;
    let (st, v) = post(&alone, "/v1/completions", body(1)).await;
    assert_eq!(st, 200, "{v}");
    let want = ids_of(&v["choices"][0]["token_ids"]);
    assert_eq!(want.len(), 6);
    // The prompt, then one token per decode step.
    assert_eq!(fed(&metrics(&alone).await), 40.0 + 5.0);
    drop(alone);
    let s = start_gated(tiny(), opts(true), Arc::new(Probe::default())).await;
    let (st, v) = post(&s, "/v1/completions", body(3)).await;
    assert_eq!(st, 200, "{v}");
    for i in 0..3 {
        assert_eq!(
            ids_of(&v["choices"][i]["token_ids"]),
            want,
            "choice {i}: {v}"
        );
    }
    let m = wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
    // The prompt once, the last prompt token of the two others, five decode steps each.
    assert_eq!(fed(&m), 40.0 + 2.0 + 3.0 * 5.0, "{m}");
    assert_eq!(
        metric(&m, "vllm:prefix_cache_hits_total{"),
        Some(2.0 * 39.0),
        "{m}"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 40, "{v}");
}

/// A completions request may carry a list of prompts (strings or lists of token ids), as
/// vLLM's does: prompt i's choice j comes back at index `i * n + j`, each the tokens a lone
/// request for that prompt gets (the tiny model: greedy by top_k 1), `echo` writes each
/// choice's own prompt, and usage sums the prompts; streamed the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_list_of_prompts_answers_each_prompt_in_turn() {
    let s = tiny_cpu_server(8, 128, 128, false).await;
    let ids: Vec<u32> = (0..12).map(|k| 2000 + 7 * k).collect();
    let body = |prompt: Value, n: usize| {
        json!({"prompt": prompt, "max_tokens": 5, "temperature": 1.0, "top_k": 1, "n": n,
               "ignore_eos": true, "return_token_ids": true, "echo": true})
    };
    let prompts = [json!("Once upon a time"), json!(ids)];
    let mut lone = Vec::new();
    for p in &prompts {
        let (st, v) = post(&s, "/v1/completions", body(p.clone(), 1)).await;
        assert_eq!(st, 200, "{v}");
        lone.push(v);
    }
    assert_ne!(
        lone[0]["choices"][0]["token_ids"], lone[1]["choices"][0]["token_ids"],
        "the two prompts must differ in what they generate for this test to tell them apart"
    );
    let (st, v) = post(&s, "/v1/completions", body(json!(prompts), 2)).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "{v}");
    for (k, c) in choices.iter().enumerate() {
        let want = &lone[k / 2]["choices"][0];
        assert_eq!(c["index"], k, "{v}");
        assert_eq!(c["token_ids"], want["token_ids"], "choice {k}: {v}");
        assert_eq!(
            c["prompt_token_ids"], want["prompt_token_ids"],
            "choice {k}"
        );
        assert_eq!(c["text"], want["text"], "choice {k}: echo and continuation");
    }
    let prompt_tokens: u64 = lone
        .iter()
        .map(|l| l["usage"]["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4 * 5, "{v}");
    // Streamed: each index's chunks make up that choice.
    let mut b = body(json!(prompts), 2);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", b).await);
    for k in 0..4 {
        let mine = chunks_of(&chunks, k);
        let text: String = mine
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(
            text,
            lone[k / 2]["choices"][0]["text"].as_str().unwrap(),
            "choice {k}"
        );
        assert_eq!(finishes(&mine), [json!("length")], "choice {k}");
    }
    assert_eq!(
        chunks.last().unwrap()["usage"]["prompt_tokens"],
        prompt_tokens
    );
    // A bad element is named by its place in the list.
    for (prompt, param) in [
        (json!([]), "prompt"),
        (json!(["a", {"x": 1}]), "prompt[1]"),
        (json!([[1, 2], [999999]]), "prompt[1]"),
        (json!(["a", ""]), "prompt[1]"),
        (json!([[1], [-1]]), "prompt[1]"),
    ] {
        let (st, v) = post(&s, "/v1/completions", json!({"prompt": prompt})).await;
        assert_eq!(st, 400, "{prompt}: {v}");
        assert_eq!(v["error"]["param"], param, "{prompt}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn echo_writes_the_prompt_before_each_choice() {
    let s = start(options(), 8, 0).await;
    let plain = json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0});
    let (_, without) = post(&s, "/v1/completions", plain.clone()).await;
    let mut body = plain.clone();
    body["echo"] = json!(true);
    let (st, with) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{with}");
    let continuation = without["choices"][0]["text"].as_str().unwrap();
    assert!(!continuation.is_empty());
    assert_eq!(
        with["choices"][0]["text"],
        format!("Once upon a time{continuation}")
    );
    // Usage counts generated tokens only, as without echo.
    assert_eq!(with["usage"], without["usage"]);
    // Streamed: the prompt rides on the first chunk.
    body["stream"] = json!(true);
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", body).await);
    assert!(
        chunks[0]["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Once upon a time"),
        "{chunks:?}"
    );
    let text: String = chunks
        .iter()
        .map(|k| k["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, with["choices"][0]["text"].as_str().unwrap());
    // A token-id prompt is echoed as its text, control tokens included; with max_tokens 0
    // the answer is the prompt alone (vLLM's "echo without generation").
    let rendered = "<|start|>user<|message|>Hi there";
    let ids = mxtune::engine::tokenizer::Tokenizer::o200k_harmony()
        .encode_with_specials(rendered)
        .unwrap();
    let body = json!({"prompt": ids, "max_tokens": 0, "echo": true, "n": 2});
    let (st, v) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    for i in 0..2 {
        assert_eq!(v["choices"][i]["text"], rendered, "{v}");
        assert_eq!(v["choices"][i]["finish_reason"], "length", "{v}");
    }
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": 0, "total_tokens": ids.len()})
    );
    let mut b = body.clone();
    b["stream"] = json!(true);
    b["n"] = json!(1);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", b).await);
    let mine = chunks_of(&chunks, 0);
    let text: String = mine
        .iter()
        .map(|k| k["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, rendered);
    assert_eq!(finishes(&mine), [json!("length")]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 0);
    // The prompt's logprobs (echo with logprobs) come in a whole response only, for one
    // choice: a stream or n above 1 is refused, naming echo.
    for extra in [json!({"stream": true}), json!({"n": 2, "temperature": 1.0})] {
        let mut b = json!({"prompt": "Hi", "echo": true, "logprobs": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (st, v) = post(&s, "/v1/completions", b).await;
        assert_eq!(st, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], "echo");
        assert_eq!(v["error"]["code"], "unsupported");
    }
}

/// `echo` with `logprobs` scores the prompt, as vLLM does and log-likelihood evaluations
/// (lm-eval's `local-completions`) need: each prompt token after the first gets its logprob
/// under the model — checked against the tiny model run token by token here — and its top
/// alternatives, the first token none; `max_tokens: 0` generates nothing, more generates as
/// without scoring, the generated tokens' offsets counting the echoed text.
#[tokio::test(flavor = "multi_thread")]
async fn echo_with_logprobs_scores_the_prompt() {
    use mxtune::engine::backend::{ModelBackend, SeqStep};
    let tiny = || {
        mxtune::engine::cpu::CpuBackend::new(
            mxtune::engine::synthetic::build("tiny", 0).unwrap(),
            4 * 256,
        )
    };
    let prompt: Vec<u32> = (0..9).map(|k| 3000 + 31 * k).collect();
    // The reference: the prompt fed one token at a time to a backend of its own.
    let mut reference = tiny();
    let seq = reference.alloc_seq(64).unwrap();
    let mut want = Vec::new();
    for k in 0..prompt.len() - 1 {
        let logits = reference
            .forward(&[SeqStep {
                seq,
                tokens: &prompt[k..k + 1],
            }])
            .unwrap()
            .remove(0);
        let lse = mxtune::engine::sampling::log_sum_exp(&logits);
        let best = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        want.push((logits[prompt[k + 1] as usize] - lse, logits[best] - lse));
    }
    let s = tiny_cpu_server(4, 256, 256, true).await;
    // Cached first: scoring must not take the prompt from the cache.
    let (st, _) = post(
        &s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200);
    let body = json!({"prompt": prompt, "echo": true, "logprobs": 2, "max_tokens": 0});
    let (st, v) = post(&s, "/v1/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), prompt.len(), "{v}");
    assert!(lp["token_logprobs"][0].is_null(), "{v}");
    assert!(lp["top_logprobs"][0].is_null(), "{v}");
    assert_eq!(lp["text_offset"][0], 0);
    for (k, &(got_lp, best_lp)) in want.iter().enumerate() {
        let got = lp["token_logprobs"][k + 1].as_f64().unwrap() as f32;
        assert!(
            (got - got_lp).abs() < 1e-4,
            "token {}: {got} against {got_lp}",
            k + 1
        );
        let top = lp["top_logprobs"][k + 1].as_object().unwrap();
        assert_eq!(top.len(), 2, "{v}");
        let top_best = top
            .values()
            .map(|x| x.as_f64().unwrap() as f32)
            .fold(f32::MIN, f32::max);
        assert!(
            (top_best - best_lp).abs() < 1e-4,
            "token {}: {top:?}",
            k + 1
        );
    }
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    // Generating after the scored prompt: the same tokens as without scoring.
    let plain = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": true,
                       "return_token_ids": true});
    let (_, without) = post(&s, "/v1/completions", plain.clone()).await;
    let mut b = plain.clone();
    b["logprobs"] = json!(1);
    let (st, with) = post(&s, "/v1/completions", b).await;
    assert_eq!(st, 200, "{with}");
    let wc = &with["choices"][0];
    assert_eq!(
        wc["token_ids"], without["choices"][0]["token_ids"],
        "{with}"
    );
    assert_eq!(wc["text"], without["choices"][0]["text"]);
    let lp = &wc["logprobs"];
    assert_eq!(
        lp["tokens"].as_array().unwrap().len(),
        prompt.len() + 3,
        "{with}"
    );
    // The first generated token starts where the echoed prompt ends.
    let echo_len = without["choices"][0]["text"].as_str().unwrap().len()
        - (0..3)
            .map(|i| lp["tokens"][prompt.len() + i].as_str().unwrap().len())
            .sum::<usize>();
    assert_eq!(lp["text_offset"][prompt.len()], echo_len, "{with}");
}

#[tokio::test(flavor = "multi_thread")]
async fn continuous_usage_stats_put_usage_in_every_chunk() {
    let s = start(options(), 8, 0).await;
    let opts = json!({"include_usage": true, "continuous_usage_stats": true});
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 1.0, "top_k": 8,
                      "seed": 3, "n": 2, "stream": true, "stream_options": opts});
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", body).await);
    for k in &chunks {
        let u = &k["usage"];
        assert_eq!(u["prompt_tokens"], 3, "{k}");
        assert_eq!(
            u["total_tokens"].as_u64().unwrap(),
            3 + u["completion_tokens"].as_u64().unwrap(),
            "{k}"
        );
    }
    // Each choice's chunks count its own tokens so far; the last usage chunk sums them.
    for i in 0..2 {
        let counts: Vec<u64> = chunks_of(&chunks, i)
            .iter()
            .map(|k| k["usage"]["completion_tokens"].as_u64().unwrap())
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
        assert_eq!(counts.last(), Some(&6), "{counts:?}");
    }
    let last = chunks.last().unwrap();
    assert_eq!(
        (&last["choices"], &last["usage"]["completion_tokens"]),
        (&json!([]), &json!(12))
    );
    // Chat: the role chunk, before any token, counts 0.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
                      "stream": true, "stream_options": opts});
    let chunks = stream_chunks(&post_stream(&s, "/v1/chat/completions", body).await);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["usage"]["completion_tokens"], 0);
    assert!(chunks.iter().all(|k| k["usage"].is_object()), "{chunks:?}");
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        script_len()
    );
    // As in vLLM, usage per chunk is part of include_usage: without it, no usage at all.
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 3, "stream": true,
                      "stream_options": {"continuous_usage_stats": true}});
    let chunks = stream_chunks(&post_stream(&s, "/v1/completions", body).await);
    assert!(
        chunks.iter().all(|k| k.get("usage").is_none()),
        "{chunks:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn over_large_body_is_an_openai_413_naming_the_limit() {
    let opts = ServerOptions {
        max_request_bytes: 1000,
        ..options()
    };
    let s = start(opts, 8, 0).await;
    let big = json!({"prompt": "x".repeat(2000), "max_tokens": 1});
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let r = client()
            .post(format!("{}{path}", s.base))
            .json(&big)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 413, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], "request_too_large", "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("1000 bytes") && m.contains("--max-request-bytes"),
            "{m}"
        );
    }
    // Under the limit it serves.
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1], "max_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn seed_makes_sampling_reproducible() {
    let s = start(options(), 8, 0).await;
    let req = |seed: u64| {
        json!({"prompt": [1, 2, 3], "max_tokens": 24, "temperature": 1.5, "seed": seed,
               "logprobs": 0, "return_tokens_as_token_ids": true})
    };
    let tokens = |v: &Value| v["choices"][0]["logprobs"]["tokens"].clone();
    let (_, a) = post(&s, "/v1/completions", req(42)).await;
    let (_, b) = post(&s, "/v1/completions", req(42)).await;
    let (_, c) = post(&s, "/v1/completions", req(43)).await;
    assert_eq!(tokens(&a), tokens(&b));
    assert_ne!(tokens(&a), tokens(&c));
    assert_ne!(
        tokens(&a),
        json!(
            greedy(&[1, 2, 3], 24)
                .iter()
                .map(|t| format!("token_id:{t}"))
                .collect::<Vec<_>>()
        ),
        "temperature 1.5 should not follow the greedy chain"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_are_batched() {
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let s = start_with_probe(options(), 8, 0, probe.clone()).await;
    let mut handles = Vec::new();
    for i in 0..4u32 {
        let base = s.base.clone();
        handles.push(tokio::spawn(async move {
            let v: Value = reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": [10 + i, 20, 30], "max_tokens": 8, "temperature": 0}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (i, v)
        }));
    }
    // The first request(s) are inside the blocked forward; the rest must queue.
    wait_metrics(&s, "4 requests running or waiting", |m| {
        probe.started.load(Ordering::SeqCst) && running(m) >= 1.0 && running(m) + waiting(m) == 4.0
    })
    .await;
    probe.open_gate();
    for h in handles {
        let (i, v) = h.await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
        let want = mxtune::engine::tokenizer::Tokenizer::o200k_harmony()
            .decode(&greedy(&[10 + i, 20, 30], 8), true);
        assert_eq!(
            v["choices"][0]["text"], want,
            "batching must not mix sequences"
        );
    }
    assert!(probe.max_batch.load(Ordering::SeqCst) >= 3);
    let m = wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
    assert_eq!(probe.live.load(Ordering::SeqCst), 0);
    assert_eq!(metric(&m, "vllm:generation_tokens_total{"), Some(32.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn full_kv_makes_admission_wait() {
    // The backend holds one sequence only; the second request must wait, then succeed.
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let s = start_with_probe(options(), 1, 0, probe.clone()).await;
    let mut handles = Vec::new();
    for _ in 0..2 {
        let base = s.base.clone();
        handles.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": [5, 6], "max_tokens": 4, "temperature": 0}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }));
    }
    wait_metrics(&s, "1 running, 1 waiting", |m| {
        running(m) == 1.0 && waiting(m) == 1.0
    })
    .await;
    probe.open_gate();
    for h in handles {
        let v = h.await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    }
    assert_eq!(probe.max_batch.load(Ordering::SeqCst), 1);
}

/// A client that hangs up cancels its request, streaming or not: the engine drops it at its
/// next iteration, frees the KV slot, counts an abort, and generates nothing more for it.
#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_frees_the_slot() {
    for stream in [true, false] {
        let s = start(options(), 8, 2).await;
        let body = json!({"prompt": [7, 8, 9], "max_tokens": 2000, "ignore_eos": true,
                          "stream": stream});
        if stream {
            let mut r = client()
                .post(format!("{}/v1/completions", s.base))
                .json(&body)
                .send()
                .await
                .unwrap();
            // Read until some tokens arrived, then hang up.
            let mut got = 0;
            while got < 3 {
                let c = r.chunk().await.unwrap().unwrap();
                got += String::from_utf8_lossy(&c).matches("data:").count();
            }
            assert_eq!(running(&metrics(&s).await), 1.0);
            drop(r);
        } else {
            // The whole answer would take 2000 steps; hang up once a few tokens exist.
            let url = format!("{}/v1/completions", s.base);
            let call =
                tokio::spawn(
                    async move { reqwest::Client::new().post(url).json(&body).send().await },
                );
            wait_metrics(&s, "a request generating", |m| {
                running(m) == 1.0 && metric(m, "vllm:generation_tokens_total{").unwrap() >= 3.0
            })
            .await;
            call.abort();
            assert!(call.await.unwrap_err().is_cancelled());
        }
        let m = wait_metrics(&s, "running back to 0", |m| running(m) == 0.0).await;
        assert_eq!(
            s.probe.live.load(Ordering::SeqCst),
            0,
            "KV slot freed ({stream})"
        );
        assert_eq!(
            metric(&m, "vllm:kv_cache_usage_perc{"),
            Some(0.0),
            "stream {stream}"
        );
        assert_eq!(
            metric(
                &m,
                "vllm:request_success_total{model_name=\"double\",engine=\"0\",finished_reason=\"abort\"}"
            ),
            Some(1.0),
            "stream {stream}"
        );
        let generated = metric(&m, "vllm:generation_tokens_total{").unwrap();
        assert!(generated < 2000.0, "stream {stream}");
        // Nothing more is generated for it once it is gone.
        let again = metrics(&s).await;
        assert_eq!(
            metric(&again, "vllm:generation_tokens_total{"),
            Some(generated)
        );
    }
}

/// `--max-waiting-queue-length`: with a full batch and N requests waiting, one more request
/// gets an OpenAI-style 503 at once (streaming or not), counted in /metrics; the requests in
/// the server finish normally, and once they do the server takes requests again.
#[tokio::test(flavor = "multi_thread")]
async fn full_waiting_queue_answers_an_openai_503_at_once() {
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let opts = ServerOptions {
        max_num_seqs: 1,
        max_waiting_queue_length: 2,
        ..options()
    };
    let s = start_with_probe(opts, 8, 0, probe.clone()).await;
    let mut handles = Vec::new();
    for i in 0..3u32 {
        let base = s.base.clone();
        handles.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": [40 + i, 41], "max_tokens": 3, "temperature": 0}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
    }
    // One request is inside the blocked step, two wait: the server is full.
    wait_metrics(&s, "1 running, 2 waiting", |m| {
        probe.started.load(Ordering::SeqCst) && running(m) == 1.0 && waiting(m) == 2.0
    })
    .await;
    for stream in [false, true] {
        let r = client()
            .post(format!("{}/v1/completions", s.base))
            .json(&json!({"prompt": [50, 51], "max_tokens": 3, "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 503, "stream {stream}");
        assert_eq!(r.headers()["retry-after"], "1");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json")
        );
        let v: Value = r.json().await.unwrap();
        let e = &v["error"];
        assert_eq!(e["type"], "server_error", "{v}");
        assert_eq!(e["code"], "waiting_queue_full", "{v}");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains("--max-waiting-queue-length 2"), "{msg}");
        assert!(msg.contains("retry later"), "{msg}");
    }
    // Chat is refused the same way.
    let (status, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "waiting_queue_full");
    let m = metrics(&s).await;
    assert_eq!(
        metric(
            &m,
            "vllm:admission_rejections_total{model_name=\"double\",reason=\"max_waiting_queue_length\"}"
        ),
        Some(3.0)
    );
    // Refused requests never reached the queue.
    assert_eq!(waiting(&m), 2.0);
    probe.open_gate();
    for h in handles {
        let (status, v) = h.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    }
    // A client that heard its answer may send the next request at once.
    for _ in 0..4 {
        let (status, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": [60, 61], "max_tokens": 2, "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
    }
    let m = wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
    assert_eq!(waiting(&m), 0.0);
    assert_eq!(
        metric(
            &m,
            "vllm:admission_rejections_total{model_name=\"double\",reason=\"max_waiting_queue_length\"}"
        ),
        Some(3.0)
    );
}

/// The `n` choices of one request take `n` places under `--max-waiting-queue-length`
/// together: a request whose choices do not all fit is refused with nothing queued, one
/// whose choices fit is served whole, and one that could never fit says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_of_n_choices_takes_n_places_or_none() {
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let opts = ServerOptions {
        max_num_seqs: 1,
        max_waiting_queue_length: 2,
        ..options()
    };
    let s = start_with_probe(opts, 8, 0, probe.clone()).await;
    let send = |n: u32| {
        let base = s.base.clone();
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(
                    &json!({"prompt": [80, 81], "max_tokens": 2, "temperature": 0.8, "seed": 1,
                              "n": n}),
                )
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    let first = send(1);
    wait_metrics(&s, "1 running", |m| {
        probe.started.load(Ordering::SeqCst) && running(m) == 1.0
    })
    .await;
    // 1 in the server, room for 2 more: 3 choices are refused whole, nothing queued.
    let (status, v) = send(3).await.unwrap();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "waiting_queue_full");
    assert_eq!(waiting(&metrics(&s).await), 0.0);
    // More choices than the server ever holds: the message says to ask for fewer.
    let (status, v) = send(4).await.unwrap();
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("a request of 4 choices"), "{msg}");
    assert!(msg.contains("fewer choices"), "{msg}");
    // 2 choices fit.
    let second = send(2);
    wait_metrics(&s, "2 choices waiting", |m| waiting(m) == 2.0).await;
    probe.open_gate();
    let (status, v) = first.await.unwrap();
    assert_eq!(status, 200, "{v}");
    let (status, v) = second.await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");
    let m = metrics(&s).await;
    assert_eq!(
        metric(
            &m,
            "vllm:admission_rejections_total{model_name=\"double\",reason=\"max_waiting_queue_length\"}"
        ),
        Some(2.0)
    );
}

/// Without a limit (the default) nothing is refused however many requests wait.
#[tokio::test(flavor = "multi_thread")]
async fn no_waiting_queue_limit_by_default() {
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let opts = ServerOptions {
        max_num_seqs: 1,
        ..options()
    };
    assert_eq!(opts.max_waiting_queue_length, 0);
    let s = start_with_probe(opts, 8, 0, probe.clone()).await;
    let mut handles = Vec::new();
    for i in 0..12u32 {
        let base = s.base.clone();
        handles.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": [70 + i], "max_tokens": 2, "temperature": 0}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    wait_metrics(&s, "1 running, 11 waiting", |m| {
        running(m) == 1.0 && waiting(m) == 11.0
    })
    .await;
    probe.open_gate();
    for h in handles {
        assert_eq!(h.await.unwrap(), 200);
    }
    let m = metrics(&s).await;
    assert_eq!(
        metric(&m, "vllm:admission_rejections_total{"),
        Some(0.0),
        "{m}"
    );
}

/// The synthetic tiny model on the CPU through the real server: each request's greedy tokens
/// are the same whether it ran alone with its prompt in one piece, or batched with three
/// others under a 16-token step budget (prompts chunked, decode rows beside prefill chunks);
/// the step log shows the batching happened and never went over the budget.
#[tokio::test(flavor = "multi_thread")]
async fn greedy_tokens_are_the_same_alone_and_among_concurrent_requests() {
    let tiny = || {
        Box::new(mxtune::engine::cpu::CpuBackend::new(
            mxtune::engine::synthetic::build("tiny", 0).unwrap(),
            4 * 256,
        ))
    };
    let opts = |budget: usize| ServerOptions {
        served_model_name: "tiny".into(),
        max_model_len: 256,
        max_num_seqs: 4,
        max_num_batched_tokens: budget,
        kv_cache_tokens: 4 * 256,
        ..options()
    };
    // Token-id prompts of different lengths: 3 fits one chunk, 40 takes three.
    let prompts: Vec<Vec<u32>> = [3usize, 40, 7, 25]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n as u32)
                .map(|k| 1000 + 37 * i as u32 + 11 * k)
                .collect()
        })
        .collect();
    let body = |p: &Vec<u32>| {
        json!({"model": "tiny", "prompt": p, "max_tokens": 8, "temperature": 0,
               "ignore_eos": true, "return_token_ids": true})
    };
    let tokens = |v: &Value| -> Vec<u64> {
        v["choices"][0]["token_ids"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    // Alone: one request at a time, the whole prompt in one step.
    let alone_server = start_gated(tiny(), opts(4096), Arc::new(Probe::default())).await;
    let mut alone = Vec::new();
    for p in &prompts {
        let (status, v) = post(&alone_server, "/v1/completions", body(p)).await;
        assert_eq!(status, 200, "{v}");
        alone.push(tokens(&v));
        assert_eq!(alone.last().unwrap().len(), 8);
    }
    drop(alone_server);
    // Together: all four queue behind a closed gate, then run batched.
    let dir = std::env::temp_dir().join(format!("mxtune-batched-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("steps.jsonl");
    let probe = Arc::new(Probe::default());
    *probe.gate_closed.lock().unwrap() = true;
    let s = start_gated(
        tiny(),
        ServerOptions {
            step_log: Some(log.clone()),
            ..opts(16)
        },
        probe.clone(),
    )
    .await;
    let mut handles = Vec::new();
    for p in &prompts {
        let base = s.base.clone();
        let b = body(p);
        handles.push(tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&b)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }));
    }
    wait_metrics(&s, "all four in the server", |m| {
        probe.started.load(Ordering::SeqCst) && running(m) + waiting(m) == 4.0
    })
    .await;
    probe.open_gate();
    for (i, h) in handles.into_iter().enumerate() {
        let v = h.await.unwrap();
        assert_eq!(
            tokens(&v),
            alone[i],
            "prompt {i}: batched tokens differ from alone"
        );
    }
    assert!(
        probe.max_batch.load(Ordering::SeqCst) >= 3,
        "the requests ran batched"
    );
    wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
    assert_eq!(probe.live.load(Ordering::SeqCst), 0);
    let total_prompt: usize = prompts.iter().map(Vec::len).sum();
    let mut steps = Vec::new();
    for _ in 0..2000 {
        if let Ok(v) = mxtune::engine::steplog::read(&log) {
            steps = v;
            if steps.iter().map(|r| r.prefill_tokens).sum::<usize>() == total_prompt
                && steps.iter().map(|r| r.decode_rows).sum::<usize>() == 4 * 7
            {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        steps.iter().map(|r| r.prefill_tokens).sum::<usize>(),
        total_prompt
    );
    assert_eq!(steps.iter().map(|r| r.decode_rows).sum::<usize>(), 4 * 7);
    for r in &steps {
        assert!(r.decode_rows + r.prefill_tokens <= 16, "{r:?}");
    }
    assert!(
        steps
            .iter()
            .any(|r| r.decode_rows > 0 && r.prefill_rows > 0),
        "decode rows ran beside prefill chunks: {steps:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_openai_errors_and_server_keeps_serving() {
    let opts = ServerOptions {
        max_model_len: 64,
        ..options()
    };
    let s = start(opts, 8, 0).await;
    let long: Vec<u32> = (0..64).collect();
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        (
            "/v1/completions",
            json!({"prompt": [1], "model": "nope"}),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": long}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "max_tokens": 63}),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "top_p": 1.5}),
            400,
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "top_k": -3}),
            400,
            Some("top_k"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "n": 0}),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "n": "2"}),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "n": 129}),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "n": 2, "temperature": 0}),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "logprobs": 21}),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "echo": true, "logprobs": 1, "stream": true}),
            400,
            Some("echo"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "stream": true,
                   "stream_options": {"include_usage": true, "continuous_usage_stats": "yes"}}),
            400,
            Some("stream_options.continuous_usage_stats"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1], "min_tokens": 99, "max_tokens": 5}),
            400,
            Some("min_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [999999]}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ""}),
            400,
            Some("prompt"),
        ),
        ("/v1/completions", json!({"max_tokens": 3}), 400, None),
        (
            "/v1/completions",
            json!({"prompt": [1], "max_tokens": "many"}),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            400,
            Some("tools[0].function"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
            400,
            Some("top_logprobs"),
        ),
    ];
    for (path, body, status, param) in cases {
        let (st, v) = post(&s, path, body.clone()).await;
        assert_eq!(st, status, "{path} {body} → {v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("code").is_some() && e.get("param").is_some(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{body} → {v}");
        }
    }
    // Not JSON at all.
    let r = client()
        .post(format!("{}/v1/chat/completions", s.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    // Unknown route.
    let r = client()
        .get(format!("{}/v1/engines", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    // Still serving.
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

async fn get_json(s: &TestServer, path: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// vLLM's utility routes: `/tokenize` (a prompt with control tokens read as such, or a chat
/// rendered exactly as the chat endpoint renders it) and `/detokenize` round-trip, `/version`
/// answers, and `GET /v1/models/{id}` gives the served model's card or a 404.
#[tokio::test(flavor = "multi_thread")]
async fn tokenize_detokenize_version_and_model_retrieve() {
    let s = start(options(), 8, 0).await;
    let text = "Hello world<|end|>";
    let (st, v) = post(&s, "/tokenize", json!({"prompt": text})).await;
    assert_eq!(st, 200, "{v}");
    let ids = ids_of(&v["tokens"]);
    assert_eq!(v["count"], ids.len());
    assert_eq!(v["max_model_len"], 2048);
    assert_eq!(
        ids.last(),
        Some(&200007),
        "<|end|> is one control token: {v}"
    );
    let (st, d) = post(&s, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["prompt"], text);
    // A chat: the ids the chat endpoint feeds the engine.
    let chat = json!({"messages": [{"role": "user", "content": "Hi there"}]});
    let (st, t) = post(&s, "/tokenize", chat.clone()).await;
    assert_eq!(st, 200, "{t}");
    let mut c = chat.clone();
    c["max_tokens"] = json!(1);
    c["return_token_ids"] = json!(true);
    let (st, r) = post(&s, "/v1/chat/completions", c).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(t["tokens"], r["prompt_token_ids"], "{t} against {r}");
    for (path, body, status, param) in [
        ("/tokenize", json!({}), 400, "prompt"),
        ("/tokenize", json!({"prompt": 5}), 400, "prompt"),
        (
            "/tokenize",
            json!({"prompt": "x", "model": "other"}),
            404,
            "model",
        ),
        ("/tokenize", json!({"messages": []}), 400, "messages"),
        ("/detokenize", json!({"tokens": [999999999]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": "x"}), 400, "tokens"),
        ("/detokenize", json!({}), 400, "tokens"),
    ] {
        let (st, v) = post(&s, path, body.clone()).await;
        assert_eq!(st, status, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], param, "{path} {body}: {v}");
    }
    let (st, v) = get_json(&s, "/version").await;
    assert_eq!(st, 200);
    assert!(!v["version"].as_str().unwrap().is_empty(), "{v}");
    let (st, v) = get_json(&s, "/v1/models/double").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], "double");
    assert_eq!(v["object"], "model");
    let (st, v) = get_json(&s, "/v1/models/gpt-4").await;
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn api_key_guards_v1_only() {
    let opts = ServerOptions {
        api_key: Some("sekrit".into()),
        ..options()
    };
    let s = start(opts, 8, 0).await;
    let get = |auth: Option<&'static str>| {
        let mut r = client().get(format!("{}/v1/models", s.base));
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        r.send()
    };
    let r = get(None).await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(
        get(Some("Bearer wrong")).await.unwrap().status().as_u16(),
        401
    );
    assert_eq!(get(Some("sekrit")).await.unwrap().status().as_u16(), 401);
    assert_eq!(
        get(Some("Bearer sekrit")).await.unwrap().status().as_u16(),
        200
    );
    let r = client()
        .post(format!("{}/v1/completions", s.base))
        .json(&json!({"prompt": [1], "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let h = client()
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status().as_u16(), 200);
    let m = client()
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(m.status().as_u16(), 200);
}

/// The official `openai` Python client streams a chat completion from the server. Skipped
/// (with a message) when python3 or the `openai` package is missing.
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_streams_chat() {
    if !has_python_openai("openai_python_client_streams_chat") {
        return;
    }
    let s = start(options(), 8, 0).await;
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
reasoning, content, usage = "", "", None
stream = c.chat.completions.create(model="double", messages=[{"role": "user", "content": "Hi"}],
    stream=True, temperature=0, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for ch in chunk.choices:
        content += ch.delta.content or ""
        reasoning += getattr(ch.delta, "reasoning_content", None) or ""
print(repr(reasoning)); print(repr(content)); print(usage)
"#;
    let stdout = python(script, &[&s.base]).await;
    let (r, c) = script_parts();
    let py_repr = |s: &str| format!("'{s}'");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], py_repr(&r));
    assert_eq!(lines[1], py_repr(&c));
    assert_eq!(lines[2], script_len().to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_errors_and_engine_death_are_reported() {
    let s = start(options(), 8, 0).await;
    s.probe.fail_next.store(true, Ordering::SeqCst);
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 3}),
    )
    .await;
    assert_eq!(st, 500, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected failure"),
        "{v}"
    );
    assert_eq!(
        s.probe.live.load(Ordering::SeqCst),
        0,
        "failed request freed its slot"
    );
    // A backend error does not stop the engine.
    let (st, _) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 3}),
    )
    .await;
    assert_eq!(st, 200);
    // A panic does: the stream ends with an error event, /health turns 503.
    s.probe.panic_next.store(true, Ordering::SeqCst);
    let data = post_stream(
        &s,
        "/v1/completions",
        json!({"prompt": [1, 2], "max_tokens": 3, "stream": true}),
    )
    .await;
    assert!(data.iter().any(|d| d.contains("\"error\"")), "{data:?}");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let h = client()
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status().as_u16(), 503);
    let (st, _) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1], "max_tokens": 1}),
    )
    .await;
    assert_eq!(st, 500);
}

/// The reference file of an oracle fixture (made by tools/make_oracle.py with transformers).
fn oracle_reference(
    model: &str,
) -> std::collections::HashMap<String, (Vec<u8>, safetensors::Dtype)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "tests/fixtures/oracle/{model}.reference.safetensors"
    ));
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.data().to_vec(), t.dtype())))
        .collect()
}

fn ref_ids(
    r: &std::collections::HashMap<String, (Vec<u8>, safetensors::Dtype)>,
    name: &str,
) -> Vec<u32> {
    let (data, dtype) = &r[name];
    assert_eq!(*dtype, safetensors::Dtype::I64);
    data.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

fn ref_f32(
    r: &std::collections::HashMap<String, (Vec<u8>, safetensors::Dtype)>,
    name: &str,
) -> Vec<f32> {
    let (data, dtype) = &r[name];
    assert_eq!(*dtype, safetensors::Dtype::F32);
    data.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Token-id prompts with `temperature: 0` and logprobs reproduce transformers' greedy
/// continuation through HTTP, all prompts of a model in flight at once (so the CPU backend
/// runs them batched, prefills mixed with decodes).
#[tokio::test(flavor = "multi_thread")]
async fn oracle_greedy_continuations_through_http() {
    for model in ["tiny-a", "tiny-b"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/oracle/{model}"));
        let weights = mxtune::engine::loader::load(&dir).unwrap();
        let vocab = weights.config.vocab_size;
        let backend = mxtune::engine::cpu::CpuBackend::new(weights, 4 * 128);
        let opts = ServerOptions {
            served_model_name: model.into(),
            max_model_len: 128,
            max_num_seqs: 4,
            max_num_batched_tokens: 16,
            kv_cache_tokens: 4 * 128,
            api_key: None,
            max_request_bytes: mxtune::engine::server::DEFAULT_MAX_REQUEST_BYTES,
            weights: mxtune::engine::server::WeightsOrigin::Checkpoint,
            step_log: None,
            long_prefill_token_threshold: 0,
            max_waiting_queue_length: 0,
            enable_prefix_caching: false,
        };
        let server = mxtune::engine::server::Server::new(Box::new(backend), opts).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(server.serve(listener, std::future::pending()));
        let r = oracle_reference(model);
        let prompts = (0..)
            .take_while(|i| r.contains_key(&format!("prompt{i}.tokens")))
            .count();
        assert!(prompts >= 2);
        let mut handles = Vec::new();
        for p in 0..prompts {
            let tokens = ref_ids(&r, &format!("prompt{p}.tokens"));
            let want = ref_ids(&r, &format!("prompt{p}.greedy"));
            let base = base.clone();
            handles.push(tokio::spawn(async move {
                let v: Value = reqwest::Client::new()
                    .post(format!("{base}/v1/completions"))
                    .json(&json!({"model": model, "prompt": tokens, "temperature": 0,
                                  "max_tokens": want.len(), "ignore_eos": true, "logprobs": 1,
                                  "return_tokens_as_token_ids": true}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                (p, tokens, want, v)
            }));
        }
        for h in handles {
            let (p, tokens, want, v) = h.await.unwrap();
            let lp = &v["choices"][0]["logprobs"];
            let got: Vec<String> = lp["tokens"]
                .as_array()
                .unwrap_or_else(|| panic!("{v}"))
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
            let want_names: Vec<String> = want.iter().map(|t| format!("token_id:{t}")).collect();
            assert_eq!(got, want_names, "{model} prompt {p}");
            // The first token's logprob is log-softmax of transformers' last prompt logits.
            let logits = ref_f32(&r, &format!("prompt{p}.logits"));
            let last = &logits[(tokens.len() - 1) * vocab..tokens.len() * vocab];
            let m = last.iter().copied().fold(f32::MIN, f32::max);
            let lo = last.iter().copied().fold(f32::MAX, f32::min);
            let lse = m + last
                .iter()
                .map(|x| f64::from(x - m).exp())
                .sum::<f64>()
                .ln() as f32;
            let want_lp = last[want[0] as usize] - lse;
            let got_lp = lp["token_logprobs"][0].as_f64().unwrap() as f32;
            assert!(
                (got_lp - want_lp).abs() <= 1e-3 * (m - lo),
                "{model} prompt {p}: logprob {got_lp} vs {want_lp}"
            );
        }
    }
}

/// Fails unless one of `lines` contains `needle`.
fn assert_a_line(lines: &[String], needle: &str) {
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "no line with {needle:?} in {lines:?}"
    );
}

/// Start the real `mxtune serve` binary; returns the child and its stdout lines up to ready.
fn spawn_serve(args: &[&str]) -> (std::process::Child, Vec<String>) {
    spawn_serve_env(args, &[])
}

/// [`spawn_serve`] with environment variables set (`Some`) or removed (`None`).
fn spawn_serve_env(
    args: &[&str],
    env: &[(&str, Option<&str>)],
) -> (std::process::Child, Vec<String>) {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"));
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd
        .arg("serve")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let ready = line.starts_with("mxtune serve: ready on ");
        lines.push(line);
        if ready {
            break;
        }
    }
    (child, lines)
}

/// The start-up report names the step's token budget the device chose (the CPU: 2048, as
/// vLLM's API server on small devices) and the malloc-arena cap, which an operator's
/// `MALLOC_ARENA_MAX` replaces.
#[test]
fn serve_binary_reports_its_default_budget_and_the_malloc_arena_cap() {
    const ARGS: [&str; 7] = [
        "--synthetic",
        "tiny",
        "--device",
        "cpu",
        "--port",
        "0",
        "--max-model-len=64",
    ];
    let (mut child, lines) = spawn_serve_env(&ARGS, &[("MALLOC_ARENA_MAX", None)]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_a_line(
        &lines,
        "max-num-batched-tokens 2048 (the default for this device) a step",
    );
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert_a_line(&lines, "mxtune serve: malloc arenas capped at 2");
    }
    let (mut child, lines) = spawn_serve_env(&ARGS, &[("MALLOC_ARENA_MAX", Some("4"))]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_a_line(&lines, "mxtune serve: ready on ");
    assert!(
        !lines.iter().any(|l| l.contains("malloc arenas")),
        "the environment's MALLOC_ARENA_MAX stands: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_binary_reports_kernel_paths_and_serves_synthetic_tiny() {
    let (mut child, lines) = tokio::task::spawn_blocking(|| {
        spawn_serve(&[
            "--synthetic",
            "tiny",
            "--port",
            "0",
            "--max-model-len",
            "256",
            "--sinks",
            "off",
            "--moe-kernel",
            "gemv",
            "--max-request-bytes",
            "4096",
            "--max-num-seqs",
            "2",
            "--max-waiting-queue-length",
            "3",
        ])
    })
    .await
    .unwrap();
    assert!(
        lines.iter().any(|l| l
            == "mxtune serve: waiting queue: at most 3 requests wait beyond a full batch of 2; \
                one more gets a 503 (--max-waiting-queue-length 3)"),
        "{lines:?}"
    );
    let ready = lines.last().expect("no output").clone();
    assert!(
        ready.starts_with("mxtune serve: ready on http://127.0.0.1:"),
        "{lines:?}"
    );
    let kp: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| l.starts_with("kernel-path "))
        .collect();
    assert_eq!(
        kp,
        [
            "kernel-path backend=cpu",
            "kernel-path moe_kernel=n/a",
            "kernel-path activation=n/a",
            "kernel-path tile=n/a",
            "kernel-path mxfp4_layers=n/a",
            "kernel-path kv_dtype=n/a",
            "kernel-path sinks=off",
            "kernel-path cuda_graphs=n/a",
        ]
    );
    assert_a_line(&lines, "synthetic model tiny");
    assert_a_line(&lines, "--moe-kernel gemv has no effect");
    let base = ready
        .trim_start_matches("mxtune serve: ready on ")
        .to_string();
    let v: Value = client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["id"], "synthetic-tiny");
    assert_eq!(v["data"][0]["weights"], "synthetic");
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": "synthetic-tiny", "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    // Penalties reach the real model: a negative frequency penalty rewards every repeat, so
    // the tiny model's greedy output (no repeats in 40 tokens) collapses onto few tokens,
    // while explicit defaults change nothing.
    let ids = |extra: Value| {
        let base = base.clone();
        async move {
            let mut body = json!({"prompt": [1, 2, 3], "max_tokens": 40, "temperature": 0,
                                  "ignore_eos": true, "return_token_ids": true});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let v: Value = client()
                .post(format!("{base}/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            serde_json::from_value::<Vec<u32>>(v["choices"][0]["token_ids"].clone())
                .unwrap_or_else(|e| panic!("{e}: {v}"))
        }
    };
    let distinct = |t: &[u32]| t.iter().collect::<std::collections::HashSet<_>>().len();
    let plain = ids(json!({})).await;
    assert_eq!(
        ids(json!({"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1})).await,
        plain
    );
    let repeating = ids(json!({"frequency_penalty": -2})).await;
    assert_eq!(repeating.len(), 40);
    assert!(
        distinct(&repeating) < distinct(&plain),
        "{plain:?} vs {repeating:?}"
    );
    // --max-request-bytes reaches the server.
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "y".repeat(5000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4096 bytes"),
        "{v}"
    );
    // SIGTERM stops it cleanly.
    let pid = child.id() as i32;
    // SAFETY: plain kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Unknown request fields are accepted, as vLLM accepts them, and the server says on stderr
/// once per field name that it ignored them.
#[tokio::test(flavor = "multi_thread")]
async fn serve_binary_warns_once_per_unknown_field() {
    let (child, lines) = tokio::task::spawn_blocking(|| {
        spawn_serve(&[
            "--synthetic",
            "tiny",
            "--port",
            "0",
            "--max-model-len",
            "256",
        ])
    })
    .await
    .unwrap();
    let ready = lines.last().expect("no output").clone();
    let base = ready
        .trim_start_matches("mxtune serve: ready on ")
        .to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{lines:?}");
    let send = |path: &'static str, body: Value| {
        let base = base.clone();
        async move {
            let r = client()
                .post(format!("{base}{path}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        }
    };
    let completion = json!({"prompt": [1, 2], "max_tokens": 1, "frobnicate": 1, "bad_words": ["x"],
                            "user": "someone", "stream": true,
                            "stream_options": {"include_usage": true, "verbose": true}});
    for _ in 0..3 {
        let (st, text) = send("/v1/completions", completion.clone()).await;
        assert_eq!(st, 200, "{text}");
    }
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                      "frobnicate": true, "chat_template_kwargs": {}});
    let (st, text) = send("/v1/chat/completions", chat).await;
    assert_eq!(st, 200, "{text}");
    // A refused request still reports its unknown fields.
    let (st, text) = send(
        "/v1/completions",
        json!({"prompt": [1], "top_p": 9, "late_field": 1}),
    )
    .await;
    assert_eq!(st, 400, "{text}");
    let pid = child.id() as i32;
    // SAFETY: plain kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("mxtune serve: warning: a request carried the field"))
        .collect();
    for name in [
        "frobnicate",
        "bad_words",
        "stream_options.verbose",
        "chat_template_kwargs",
        "late_field",
    ] {
        let n = warned
            .iter()
            .filter(|l| l.contains(&format!("`{name}`")))
            .count();
        assert_eq!(n, 1, "{name} in {stderr}");
    }
    // `user` is an OpenAI field the server knows (and does not use), as vLLM does.
    assert_eq!(warned.len(), 5, "{stderr}");
}

/// Whether this machine can open a GPU (then the no-GPU expectations below do not apply).
fn has_cuda_driver() -> bool {
    ["/dev/nvidiactl", "/proc/driver/nvidia/version"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_binary_auto_without_gpu_falls_back_to_cpu_and_says_why() {
    if has_cuda_driver() {
        eprintln!("skipped: this machine has an NVIDIA driver, so auto picks the GPU");
        return;
    }
    let (mut child, lines) = tokio::task::spawn_blocking(|| {
        spawn_serve(&[
            "--synthetic",
            "tiny",
            "--device",
            "auto",
            "--port",
            "0",
            "--max-model-len",
            "128",
        ])
    })
    .await
    .unwrap();
    let falls: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("falling back to the cpu backend"))
        .collect();
    assert_eq!(falls.len(), 1, "{lines:?}");
    assert!(falls[0].contains("--device auto"), "{lines:?}");
    assert!(falls[0].contains("CUDA driver library"), "{lines:?}");
    assert!(
        lines.iter().any(|l| l == "kernel-path backend=cpu"),
        "{lines:?}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("mxtune serve: ready on http://127.0.0.1:")),
        "{lines:?}"
    );
    let pid = child.id() as i32;
    // SAFETY: plain kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// The real `mxtune serve` on the CPU with a KV cache too small for three requests at once
/// (3 × (20 + 30) positions wanted, 110 there): all three start, one is pre-empted and
/// recomputed, and each still gets the greedy text it gets alone; `/metrics` counts the
/// pre-emptions.
#[tokio::test(flavor = "multi_thread")]
async fn serve_binary_preempts_when_the_kv_cache_is_full_and_keeps_greedy_tokens() {
    let (mut child, lines) = tokio::task::spawn_blocking(|| {
        spawn_serve(&[
            "--synthetic",
            "tiny",
            "--device",
            "cpu",
            "--port",
            "0",
            "--max-model-len",
            "64",
            "--max-num-seqs",
            "3",
            "--max-num-batched-tokens",
            "16",
            "--kv-cache-tokens",
            "110",
        ])
    })
    .await
    .unwrap();
    assert_a_line(&lines, "the request admitted last is pre-empted");
    let url = lines
        .last()
        .and_then(|l| l.strip_prefix("mxtune serve: ready on "))
        .unwrap_or_else(|| panic!("not ready: {lines:?}"))
        .to_string();
    let ask = |k: u32| {
        let url = url.clone();
        async move {
            let prompt: Vec<u32> = (0..20).map(|i| 1000 + 13 * (100 * k + i)).collect();
            let ask = json!({"model": "synthetic-tiny", "prompt": prompt, "max_tokens": 30,
                             "temperature": 0, "ignore_eos": true});
            let (status, v) = post_url(&url, "/v1/completions", ask).await;
            assert_eq!(
                (status, &v["usage"]["completion_tokens"]),
                (200, &json!(30)),
                "{v}"
            );
            v["choices"][0]["text"].as_str().unwrap().to_string()
        }
    };
    let (a, b, c) = tokio::join!(ask(0), ask(1), ask(2));
    let metrics = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let preempted = metric(
        &metrics,
        "vllm:num_preemptions_total{model_name=\"synthetic-tiny\",engine=\"0\"}",
    );
    assert!(preempted.is_some_and(|n| n > 0.0), "{metrics}");
    for (k, together) in [a, b, c].into_iter().enumerate() {
        assert_eq!(ask(k as u32).await, together, "request {k}");
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn serve_binary_refuses_cuda_without_gpu_and_impossible_flags() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    if !has_cuda_driver() {
        let o = run(&["--synthetic", "tiny", "--device", "cuda", "--port", "0"]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--device cuda"), "{err}");
        assert!(err.contains("CUDA driver library was not found"), "{err}");
    }
    let o = run(&[
        "--synthetic",
        "tiny",
        "--tile",
        "64x128",
        "--moe-kernel",
        "gemv",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--moe-kernel grouped"));
    let o = run(&["--synthetic", "huge"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown synthetic model"));
    // A step must hold one token of every running request.
    let o = run(&[
        "--synthetic",
        "tiny",
        "--device",
        "cpu",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "4",
        "--max-waiting-queue-length",
        "2",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--max-num-batched-tokens 4 is below --max-num-seqs 8"),
        "{err}"
    );
    let o = run(&["--model", "/nonexistent/ckpt"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/ckpt"));
    // A KV cache that cannot hold one request of the full length.
    let o = run(&[
        "--synthetic",
        "tiny",
        "--device",
        "cpu",
        "--max-model-len",
        "64",
        "--kv-cache-tokens",
        "10",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--kv-cache-tokens 10 is below --max-model-len 64"),
        "{err}"
    );
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                       "days": {"type": "integer"}}, "required": ["location"]}}})
}

const TOOL_ARGS: &str = r#"{"location": "Paris", "days": 2}"#;

/// A model answer addressed to `functions.get_weather` becomes `message.tool_calls` with
/// `finish_reason: "tool_calls"`; without tools the same answer is plain content.
#[tokio::test(flavor = "multi_thread")]
async fn tool_call_in_the_answer_becomes_tool_calls() {
    let s = start_with_script(TOOL_SCRIPT).await;
    let ask = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                     "tools": [weather_tool()], "temperature": 0, "max_tokens": 64});
    let (st, v) = post(&s, "/v1/chat/completions", ask.clone()).await;
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null, "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], TOOL_ARGS);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"), "{v}");

    // Streaming: the first tool-call delta carries id, type and name; the arguments arrive
    // in pieces that concatenate to the whole.
    let mut stream_ask = ask.clone();
    stream_ask["stream"] = json!(true);
    let data = post_stream(&s, "/v1/chat/completions", stream_ask).await;
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(deltas.len() >= 2, "{data:?}");
    assert_eq!(deltas[0]["index"], 0);
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert_eq!(deltas[0]["type"], "function");
    assert!(deltas[0]["id"].as_str().unwrap().starts_with("call_"));
    let args: String = deltas
        .iter()
        .map(|d| d["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(args, TOOL_ARGS);
    assert!(
        deltas[1..]
            .iter()
            .all(|d| d["index"] == 0 && d.get("id").is_none())
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // No tools (or tool_choice none): the same answer is content, the finish plain `stop`.
    for extra in [
        json!({}),
        json!({"tools": [weather_tool()], "tool_choice": "none"}),
    ] {
        let mut plain = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                               "temperature": 0, "max_tokens": 64});
        for (k, v) in extra.as_object().unwrap() {
            plain[k] = v.clone();
        }
        let (st, v) = post(&s, "/v1/chat/completions", plain).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], TOOL_ARGS, "{v}");
        assert!(
            v["choices"][0]["message"].get("tool_calls").is_none(),
            "{v}"
        );
    }
}

/// `tool_choice: "auto"` with `strict: true`: the double opens a call of `get_weather` and
/// writes arguments that break the strict schema; the constraint, which starts at the call's
/// `<|message|>`, makes them follow it (whole and streamed alike). Without `strict`, or with
/// only another function strict, the double's own arguments stand; a final answer is left as
/// the model writes it.
#[tokio::test(flavor = "multi_thread")]
async fn strict_tools_constrain_the_calls_the_model_chooses_under_auto() {
    let s = start_with_script(TOOL_SCRIPT).await;
    let parameters = json!({"type": "object", "properties": {
        "location": {"enum": ["Oslo", "Rome"]},
        "days": {"type": "integer", "minimum": 3, "maximum": 9}},
        "required": ["location", "days"], "additionalProperties": false});
    let tool = |name: &str, strict: bool| {
        json!({"type": "function", "function": {"name": name, "parameters": parameters,
                                                "strict": strict}})
    };
    let ask = |tools: Value, stream: bool| {
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
               "tool_choice": "auto", "temperature": 0, "max_tokens": 64, "stream": stream})
    };
    // (name, arguments, finish_reason) of the one call, whole or streamed.
    let call = |v: &Value| {
        let c = &v["choices"][0];
        let calls = c["message"]["tool_calls"].as_array();
        let calls = calls.unwrap_or_else(|| panic!("no tool call: {v}"));
        assert_eq!(calls.len(), 1, "{v}");
        let f = &calls[0]["function"];
        (
            f["name"].as_str().unwrap().to_string(),
            f["arguments"].as_str().unwrap().to_string(),
            c["finish_reason"].clone(),
        )
    };
    let streamed_call = |chunks: &[Value]| {
        let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
        for c in chunks {
            for t in c["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                name.push_str(t["function"]["name"].as_str().unwrap_or_default());
                arguments.push_str(t["function"]["arguments"].as_str().unwrap_or_default());
            }
            if !c["choices"][0]["finish_reason"].is_null() {
                finish = c["choices"][0]["finish_reason"].clone();
            }
        }
        (name, arguments, finish)
    };
    for tools in [
        json!([tool("get_weather", false)]),
        json!([tool("get_weather", false), tool("lookup", true)]),
    ] {
        let (st, v) = post(&s, "/v1/chat/completions", ask(tools.clone(), false)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            call(&v),
            ("get_weather".into(), TOOL_ARGS.into(), json!("tool_calls")),
            "{tools}"
        );
    }
    let tools = json!([tool("lookup", false), tool("get_weather", true)]);
    let (st, v) = post(&s, "/v1/chat/completions", ask(tools.clone(), false)).await;
    assert_eq!(st, 200, "{v}");
    let (name, arguments, finish) = call(&v);
    assert_eq!(
        (name.as_str(), &finish),
        ("get_weather", &json!("tool_calls"))
    );
    let a: Value = serde_json::from_str(&arguments)
        .unwrap_or_else(|e| panic!("the arguments are not JSON ({e}): {arguments}"));
    let o = a.as_object().unwrap();
    assert_eq!(o.len(), 2, "{arguments}");
    assert!(
        ["Oslo", "Rome"].contains(&o["location"].as_str().unwrap()),
        "{arguments}"
    );
    assert!(
        (3..=9).contains(&o["days"].as_i64().unwrap()),
        "{arguments}"
    );
    let chunks = stream_chunks(&post_stream(&s, "/v1/chat/completions", ask(tools, true)).await);
    assert_eq!(streamed_call(&chunks), (name, arguments, finish));
    // A final answer under strict tools is the model's, untouched.
    let s = start(options(), 8, 0).await;
    let (_, content) = script_parts();
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        ask(json!([tool("get_weather", true)]), false),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], content, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // A strict function's schema must compile; a function that is not strict is not
    // compiled under `auto`.
    let mut bad = tool("get_weather", true);
    bad["function"]["parameters"] = json!({"type": "banana"});
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        ask(json!([tool("a", false), bad.clone()]), false),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools[1].function.parameters", "{v}");
    bad["function"]["strict"] = json!(false);
    let (st, v) = post(&s, "/v1/chat/completions", ask(json!([bad]), false)).await;
    assert_eq!(st, 200, "{v}");
}

/// A named `tool_choice` pre-fills the call's header into the prompt: the prompt ends with it
/// and the answer is that call's arguments. They are constrained to the schema as compact
/// JSON (docs/api.md, "Constrained calls"), so the double writes its arguments that way, and
/// they come through as written.
#[tokio::test(flavor = "multi_thread")]
async fn named_tool_choice_prefills_the_call() {
    const TOOL_ARGS: &str = r#"{"location":"Paris","days":2}"#;
    let script = TOOL_SCRIPT.replace(r#"{"location": "Paris", "days": 2}"#, TOOL_ARGS);
    assert_ne!(script, TOOL_SCRIPT);
    let s = start_with_script(&script).await;
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": [weather_tool()],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "temperature": 0, "max_tokens": 64, "return_token_ids": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let tok = mxtune::engine::tokenizer::Tokenizer::o200k_harmony();
    let prompt: Vec<u32> = serde_json::from_value(v["prompt_token_ids"].clone()).unwrap();
    let text = tok.decode(&prompt, false);
    assert!(
        text.ends_with("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"),
        "{text}"
    );
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    assert_eq!(call["function"]["arguments"], TOOL_ARGS, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    // The generated ids are only the arguments and `<|call|>`: the header was prompt.
    let out: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(tok.decode(&out, false), format!("{TOOL_ARGS}<|call|>"));
}

/// Tool calls and results sent back render as harmony messages of the next turn.
#[tokio::test(flavor = "multi_thread")]
async fn tool_results_render_into_the_next_prompt() {
    let s = start(options(), 8, 0).await;
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"tools": [weather_tool()], "max_tokens": 1, "return_token_ids": true,
               "tool_choice": "auto",
               "messages": [
                   {"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_7", "content": "sunny"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let tok = mxtune::engine::tokenizer::Tokenizer::o200k_harmony();
    let prompt: Vec<u32> = serde_json::from_value(v["prompt_token_ids"].clone()).unwrap();
    let text = tok.decode(&prompt, false);
    assert!(
        text.ends_with(
            "<|start|>user<|message|>Weather in Paris?<|end|>\
             <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Paris\"}<|call|>\
             <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>assistant"
        ),
        "{text}"
    );
    // The namespace keeps the order the schema arrived in: `json!` writes `location` first
    // as serde_json's `preserve_order` (on in this build) keeps it (tests/harmony_template.rs
    // covers the client's own order).
    assert!(
        text.contains("type get_weather = (_: {\nlocation: string,\ndays?: number,\n}) => any;"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tool_requests_get_400_naming_the_field() {
    let s = start(options(), 8, 0).await;
    let user = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        (
            json!({"messages": user, "tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
            "not in `tools`",
        ),
        (
            json!({"messages": user, "tool_choice": "required"}),
            "tool_choice",
            "needs `tools`",
        ),
        (
            json!({"messages": user, "tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
            "\"required\"",
        ),
        (
            json!({"messages": user, "tools": [{"type": "retrieval"}]}),
            "tools[0].type",
            "\"function\"",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools[0].function.name",
            "letters, digits",
        ),
        (
            json!({"messages": user, "tools": [weather_tool(), weather_tool()]}),
            "tools[1].function.name",
            "twice",
        ),
        (
            json!({"messages": user, "tools": [weather_tool()], "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
            "true or false",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
            "must follow",
        ),
    ];
    for (body, param, msg) in cases {
        let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 400, "{body} -> {v}");
        assert_eq!(v["error"]["param"], param, "{body} -> {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(msg), "{body} -> {m}");
    }
    // parallel_tool_calls as a boolean is accepted.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": user, "tools": [weather_tool()], "parallel_tool_calls": false, "max_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// The official `openai` client parses tool calls, streamed and not. Skipped (with a
/// message) when python3 or the `openai` package is missing.
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_reads_tool_calls() {
    if !has_python_openai("openai_python_client_reads_tool_calls") {
        return;
    }
    let s = start_with_script(TOOL_SCRIPT).await;
    let script = r#"
import sys, json, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
tools = [json.loads(sys.argv[2])]
msgs = [{"role": "user", "content": "Weather in Paris?"}]
r = c.chat.completions.create(model="double", messages=msgs, tools=tools, temperature=0)
call = r.choices[0].message.tool_calls[0]
print(r.choices[0].finish_reason, call.function.name, call.function.arguments)
name, args, finish = None, "", None
for chunk in c.chat.completions.create(model="double", messages=msgs, tools=tools, stream=True,
                                     temperature=0):
    for ch in chunk.choices:
        for d in ch.delta.tool_calls or []:
            name = name or d.function.name
            args += d.function.arguments or ""
        finish = ch.finish_reason or finish
print(finish, name, args)
msgs += [r.choices[0].message.model_dump(exclude_none=True),
         {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
r2 = c.chat.completions.create(model="double", messages=msgs, tools=tools, max_tokens=4)
print(r2.choices[0].finish_reason is not None)
"#;
    let out = python(script, &[&s.base, &weather_tool().to_string()]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("tool_calls get_weather {TOOL_ARGS}"));
    assert_eq!(lines[1], format!("tool_calls get_weather {TOOL_ARGS}"));
    assert_eq!(lines[2], "True");
}

/// The `openai` client reads `n=2` choices (whole and streamed), an echoed completion,
/// per-chunk usage (`continuous_usage_stats`, sent through `extra_body` as for vLLM), a
/// completion of a list of prompts and the model's card (`models.retrieve`).
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_reads_n_choices_echo_and_continuous_usage() {
    if !has_python_openai("openai_python_client_reads_n_choices_echo_and_continuous_usage") {
        return;
    }
    let s = start(options(), 8, 0).await;
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
msgs = [{"role": "user", "content": "Hi"}]
r = c.chat.completions.create(model="double", messages=msgs, n=2, temperature=0.5, seed=1)
print(len(r.choices), [ch.index for ch in r.choices], r.usage.completion_tokens)
print(all(ch.message.content == r.choices[0].message.content for ch in r.choices))
texts = {}
for chunk in c.chat.completions.create(model="double", messages=msgs, n=2, temperature=0.5,
                                       stream=True):
    for ch in chunk.choices:
        texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
print(sorted(texts), texts[0] == texts[1] == r.choices[0].message.content)
e = c.completions.create(model="double", prompt="Once upon", max_tokens=3, echo=True)
print(e.choices[0].text.startswith("Once upon"), e.usage.completion_tokens)
counts = []
for chunk in c.completions.create(model="double", prompt="Once upon", max_tokens=3, stream=True,
        stream_options={"include_usage": True},
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}}):
    counts.append(chunk.usage.completion_tokens)
print(counts[-1], counts == sorted(counts))
b = c.completions.create(model="double", prompt=["Once upon", [1, 2, 3]], max_tokens=3, n=2,
                         temperature=0.5, echo=True)
print([ch.index for ch in b.choices], b.choices[1].text.startswith("Once upon"),
      b.usage.prompt_tokens == e.usage.prompt_tokens + 3, b.usage.completion_tokens)
print(c.models.retrieve("double").id)
"#;
    let out = python(script, &[&s.base]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("2 [0, 1] {}", 2 * script_len()), "{out}");
    assert_eq!(lines[1], "True", "{out}");
    assert_eq!(lines[2], "[0, 1] True", "{out}");
    assert_eq!(lines[3], "True 3", "{out}");
    assert_eq!(lines[4], "3 True", "{out}");
    assert_eq!(lines[5], "[0, 1, 2, 3] True True 12", "{out}");
    assert_eq!(lines[6], "double", "{out}");
}

/// The `openai` client reads logprobs (chat whole and streamed, completions) and sends vLLM's
/// `stop_token_ids` through `extra_body`.
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_reads_logprobs_and_sends_stop_token_ids() {
    if !has_python_openai("openai_python_client_reads_logprobs_and_sends_stop_token_ids") {
        return;
    }
    let s = start(options(), 8, 0).await;
    let ids = greedy(&[1, 2], 6);
    let k = (1..ids.len())
        .find(|&k| !ids[..k].contains(&ids[k]))
        .expect("a token that comes for the first time");
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
msgs = [{"role": "user", "content": "Hi"}]
r = c.chat.completions.create(model="double", messages=msgs, temperature=0, logprobs=True,
                              top_logprobs=2)
lp = r.choices[0].logprobs.content
print(len(lp) == r.usage.completion_tokens, all(len(e.top_logprobs) == 2 for e in lp),
      all(e.top_logprobs[0].token == e.token and e.logprob <= 0 for e in lp))
n = 0
for chunk in c.chat.completions.create(model="double", messages=msgs, temperature=0,
                                       logprobs=True, top_logprobs=1, stream=True):
    for ch in chunk.choices:
        n += len(ch.logprobs.content) if ch.logprobs and ch.logprobs.content else 0
print(n == r.usage.completion_tokens)
e = c.completions.create(model="double", prompt=[1, 2], max_tokens=4, temperature=0, logprobs=2)
l = e.choices[0].logprobs
print(len(l.tokens), [len(t) for t in l.top_logprobs], all(x <= 0 for x in l.token_logprobs))
s = c.completions.create(model="double", prompt=[1, 2], max_tokens=6, temperature=0,
                         extra_body={"stop_token_ids": [int(sys.argv[2])]})
print(s.choices[0].finish_reason, s.usage.completion_tokens)
"#;
    let out = python(script, &[&s.base, &ids[k].to_string()]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[0], "True True True", "{out}");
    assert_eq!(lines[1], "True", "{out}");
    assert_eq!(lines[2], "4 [2, 2, 2, 2] True", "{out}");
    assert_eq!(lines[3], format!("stop {}", k + 1), "{out}");
}

/// The `openai` client with `tools=` against the real binary and synthetic weights: whatever
/// the random model writes, the responses parse.
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_with_tools_against_synthetic_tiny() {
    if !has_python_openai("openai_python_client_with_tools_against_synthetic_tiny") {
        return;
    }
    let (mut child, lines) = tokio::task::spawn_blocking(|| {
        spawn_serve(&[
            "--synthetic",
            "tiny",
            "--port",
            "0",
            "--max-model-len",
            "1024",
        ])
    })
    .await
    .unwrap();
    let ready = lines.last().expect("no output").clone();
    let base = ready
        .trim_start_matches("mxtune serve: ready on ")
        .to_string();
    let script = r#"
import sys, json, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
tools = [json.loads(sys.argv[2])]
msgs = [{"role": "user", "content": "Weather in Paris?"}]
for choice in ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}]:
    r = c.chat.completions.create(model="synthetic-tiny", messages=msgs, tools=tools,
                                  tool_choice=choice, max_tokens=8, temperature=0)
    m = r.choices[0].message
    print(r.choices[0].finish_reason, len(m.tool_calls or []))
    for chunk in c.chat.completions.create(model="synthetic-tiny", messages=msgs, tools=tools,
                                           tool_choice=choice, max_tokens=8, stream=True):
        pass
print("ok")
"#;
    let out = python(script, &[&base, &weather_tool().to_string()]).await;
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[3], "ok");
    // A named choice always yields a call (its header is pre-filled); 8 random tokens do
    // not close it, so it ends by length.
    assert_eq!(lines[2], "length 1", "{out}");
}

/// `logit_bias` under greedy decoding: +100 forces a token the model ranks low, -100 bans
/// the model's first choice; bad keys and values get a 400 naming `logit_bias`.
#[tokio::test(flavor = "multi_thread")]
async fn logit_bias_forces_and_bans_tokens() {
    let s = start(options(), 8, 0).await;
    let ids = |v: &Value| -> Vec<u32> {
        serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap()
    };
    let ask = |bias: Value| {
        json!({"prompt": [1, 2], "max_tokens": 3, "temperature": 0, "return_token_ids": true,
               "logit_bias": bias})
    };
    let plain = greedy(&[1, 2], 3);
    assert!(!plain.contains(&5000));
    let (st, v) = post(&s, "/v1/completions", ask(json!({"5000": 100}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(ids(&v), vec![5000, 5000, 5000]);
    let first = plain[0];
    let runner_up = candidates(&[1, 2])
        .into_iter()
        .map(|(t, _)| t)
        .find(|&t| t != first)
        .unwrap();
    let mut ban = serde_json::Map::new();
    ban.insert(first.to_string(), json!(-100));
    let (st, v) = post(&s, "/v1/completions", ask(Value::Object(ban))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(ids(&v)[0], runner_up);
    // An empty map changes nothing.
    let (_, v) = post(&s, "/v1/completions", ask(json!({}))).await;
    assert_eq!(ids(&v), plain);
    for bad in [
        json!({"abc": 1}),
        json!({"201088": 1}),
        json!({"-1": 1}),
        json!({"5": 101}),
        json!({"5": "x"}),
    ] {
        let (st, v) = post(&s, "/v1/completions", ask(bad.clone())).await;
        assert_eq!(st, 400, "{bad} -> {v}");
        assert_eq!(v["error"]["param"], "logit_bias", "{bad} -> {v}");
    }
}

/// The per-request histograms count a finished request: its prompt and generated tokens,
/// one mean time per output token, and the engine steps' token counts.
#[tokio::test(flavor = "multi_thread")]
async fn per_request_metrics_count_a_finished_request() {
    let s = start(options(), 8, 0).await;
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": [1, 2, 3, 4, 5], "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let m = wait_metrics(&s, "a finished request", |m| {
        metric(m, "vllm:request_generation_tokens_count{").is_some_and(|c| c >= 1.0)
    })
    .await;
    let l = "{model_name=\"double\",engine=\"0\"}";
    assert_eq!(
        metric(&m, &format!("vllm:request_prompt_tokens_sum{l}")),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, &format!("vllm:request_generation_tokens_sum{l}")),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            &format!("vllm:request_time_per_output_token_seconds_count{l}")
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, &format!("vllm:request_prefill_time_seconds_count{l}")),
        Some(1.0)
    );
    // Prefill (5 tokens in one step) plus 3 decode steps of one token: 8 tokens in 4 steps.
    assert_eq!(
        metric(&m, &format!("vllm:iteration_tokens_total_sum{l}")),
        Some(8.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, &format!("vllm:iteration_tokens_total_count{l}")),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "vllm:request_prompt_tokens_bucket{model_name=\"double\",engine=\"0\",le=\"5\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn serve_binary_finds_a_named_model_in_the_hugging_face_cache_or_says_what_to_do() {
    use std::io::BufRead;
    let home = tempfile::tempdir().unwrap();
    let serve = |args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"));
        c.arg("serve")
            .args(args)
            .env("HOME", home.path())
            .env_remove("MXTUNE_MODEL_DIR")
            .env_remove("HF_HOME")
            .env_remove("HF_HUB_CACHE");
        c
    };
    // Nothing anywhere: the error lists where it looked and what to do.
    let o = serve(&["--model", "gpt-oss-20b", "--port", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for needle in [
        "no checkpoint for gpt-oss-20b",
        "MXTUNE_MODEL_DIR: not set",
        "models--openai--gpt-oss-20b",
        "hf download openai/gpt-oss-20b",
        "--synthetic gpt-oss-20b",
    ] {
        assert!(err.contains(needle), "{needle} in {err}");
    }
    // A checkpoint in the Hugging Face cache layout is found by name, and the start-up
    // report says which directory was used and how it was found.
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle/tiny-a");
    let repo = home
        .path()
        .join(".cache/huggingface/hub/models--openai--tiny-a");
    let snap = repo.join("snapshots/rev1");
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(&fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), snap.join(e.file_name())).unwrap();
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "rev1").unwrap();
    let mut child = serve(&["--model", "tiny-a", "--device", "cpu", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let ready = line.starts_with("mxtune serve: ready on ");
        lines.push(line);
        if ready {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let want = format!(
        "mxtune serve: --model tiny-a: {}, from the Hugging Face cache",
        snap.display()
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&want) && l.contains("revision rev1")),
        "{want} in {lines:?}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("mxtune serve: ready on ")),
        "{lines:?}"
    );
}

/// `--step-log`: every step of a served run is one JSON line whose rows add up to the
/// requests' prompt and generated tokens, and `mxtune engine steps` summarizes it.
#[tokio::test(flavor = "multi_thread")]
async fn step_log_accounts_for_every_token() {
    let dir = std::env::temp_dir().join(format!("mxtune-steps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("steps.jsonl");
    let opts = ServerOptions {
        step_log: Some(path.clone()),
        ..options()
    };
    let s = start(opts, 8, 0).await;
    let mut handles = Vec::new();
    for i in 0..2u32 {
        let base = s.base.clone();
        // 100 prompt tokens: two chunks of the 64-token budget.
        let prompt: Vec<u32> = (0..100).map(|k| 700 + i + k).collect();
        handles.push(tokio::spawn(async move {
            let v: Value = reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": prompt, "max_tokens": 9, "temperature": 0,
                              "ignore_eos": true}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v
        }));
    }
    for h in handles {
        let v = h.await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 9, "{v}");
    }
    wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
    // The engine flushes the log when it goes idle; read until both requests are in it.
    let mut steps = Vec::new();
    for _ in 0..2000 {
        if let Ok(v) = mxtune::engine::steplog::read(&path) {
            steps = v;
            let prompt: usize = steps.iter().map(|r| r.prefill_tokens).sum();
            if prompt == 200 && steps.iter().map(|r| r.decode_rows).sum::<usize>() == 16 {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Each request: its first token comes from the step that ends its prompt, the other 8
    // from decode steps; no step goes over the 64-token budget.
    assert_eq!(steps.iter().map(|r| r.prefill_tokens).sum::<usize>(), 200);
    assert_eq!(steps.iter().map(|r| r.decode_rows).sum::<usize>(), 16);
    for r in &steps {
        assert!(r.decode_rows + r.prefill_tokens <= 64, "{r:?}");
        assert!(r.ctx_max >= 100 || r.decode_rows == 0, "{r:?}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mxtune"))
        .args(["engine", "steps", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sum: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sum["steps"], steps.len());
    assert_eq!(sum["decode_tokens"], 16);
    assert_eq!(sum["prefill_tokens"], 200);
    let kinds: Vec<&str> = sum["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"decode") && kinds.contains(&"prefill"),
        "{sum}"
    );
    // A second server never overwrites the log.
    let again = mxtune::engine::server::Server::new(
        Box::new(mxtune::engine::cpu::CpuBackend::new(
            mxtune::engine::synthetic::build("tiny", 0).unwrap(),
            64,
        )),
        ServerOptions {
            step_log: Some(path.clone()),
            ..options()
        },
    );
    let err = format!("{:#}", again.err().unwrap());
    assert!(err.contains("exists"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--long-prefill-token-threshold`: a long prompt feeds at most that many tokens a step, so
/// a request already decoding gets a token in every step while it prefills; the tokens are
/// those of a run without the threshold.
#[tokio::test(flavor = "multi_thread")]
async fn long_prefill_threshold_caps_each_prompt_chunk() {
    let dir = std::env::temp_dir().join(format!("mxtune-longpf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let long: Vec<u32> = (0..200).map(|k| 900 + k).collect();
    let mut texts = Vec::new();
    for threshold in [0usize, 16] {
        let path = dir.join(format!("steps-{threshold}.jsonl"));
        let opts = ServerOptions {
            step_log: Some(path.clone()),
            long_prefill_token_threshold: threshold,
            ..options()
        };
        let s = start(opts, 8, 0).await;
        // A short request that decodes for a while, then the long prompt.
        let base = s.base.clone();
        let short = tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(
                    &json!({"prompt": [5, 6, 7], "max_tokens": 40, "temperature": 0,
                              "ignore_eos": true}),
                )
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        });
        wait_metrics(&s, "the short request running", |m| running(m) == 1.0).await;
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let short = short.await.unwrap();
        texts.push((
            v["choices"][0]["text"].clone(),
            short["choices"][0]["text"].clone(),
        ));
        wait_metrics(&s, "idle", |m| running(m) == 0.0).await;
        let mut steps = Vec::new();
        for _ in 0..2000 {
            if let Ok(v) = mxtune::engine::steplog::read(&path)
                && v.iter().map(|r| r.prefill_tokens).sum::<usize>() == 203
            {
                steps = v;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(
            steps.iter().map(|r| r.prefill_tokens).sum::<usize>(),
            203,
            "{steps:?}"
        );
        // Steps that fed part of the long prompt (the short prompt is 3 tokens).
        let chunks: Vec<usize> = steps
            .iter()
            .filter(|r| r.prefill_tokens > 3)
            .map(|r| r.prefill_tokens)
            .collect();
        if threshold == 0 {
            // The 64-token budget less the decode row: chunks of up to 63.
            assert!(chunks.iter().any(|&n| n > 16), "{chunks:?}");
        } else {
            assert!(chunks.iter().all(|&n| n <= 16), "{chunks:?}");
            assert!(chunks.len() >= 200 / 16, "{chunks:?}");
            // While the long prompt was fed, the short request decoded in the same steps.
            let with_decode = steps
                .iter()
                .filter(|r| r.prefill_tokens > 3 && r.decode_rows == 1)
                .count();
            assert!(with_decode >= 10, "{steps:?}");
        }
    }
    assert_eq!(
        texts[0], texts[1],
        "the threshold must not change the tokens"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One chat exchange's ids and usage, streamed or not.
struct ChatTurn {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    usage: Value,
}

async fn chat_turn(base: &str, mut body: Value) -> ChatTurn {
    body["return_token_ids"] = json!(true);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ids = |v: &Value| serde_json::from_value::<Vec<u32>>(v.clone()).unwrap();
    if body["stream"] != json!(true) {
        let v: Value = r.json().await.unwrap();
        return ChatTurn {
            prompt: ids(&v["prompt_token_ids"]),
            tokens: ids(&v["choices"][0]["token_ids"]),
            usage: v["usage"].clone(),
        };
    }
    let chunks = stream_chunks(&sse_data(&r.text().await.unwrap()));
    let mut turn = ChatTurn {
        prompt: ids(&chunks[0]["prompt_token_ids"]),
        tokens: Vec::new(),
        usage: Value::Null,
    };
    for c in &chunks {
        if let Some(t) = c["choices"].get(0).map(|ch| &ch["token_ids"]) {
            turn.tokens.extend(ids(t));
        }
        if c["choices"] == json!([]) {
            turn.usage = c["usage"].clone();
        }
    }
    turn
}

/// Prefix caching through the real binary, on by default and off with
/// `--no-enable-prefix-caching`: the same chat twice, then its next turn (streamed). With
/// caching the second request reports all but its last prompt token cached and the next turn
/// the tokens it shares with what the slot held; `/metrics` counts them; every answer's greedy
/// tokens equal those of the server without caching.
#[tokio::test(flavor = "multi_thread")]
async fn serve_binary_prefix_caching_reports_cached_tokens_with_unchanged_greedy_tokens() {
    const ARGS: [&str; 6] = [
        "--synthetic",
        "tiny",
        "--port",
        "0",
        "--max-model-len",
        "512",
    ];
    let (on, off) = tokio::join!(
        tokio::task::spawn_blocking(|| spawn_serve(&ARGS)),
        tokio::task::spawn_blocking(|| {
            let mut args = ARGS.to_vec();
            args.push("--no-enable-prefix-caching");
            spawn_serve(&args)
        })
    );
    let ((mut on_child, on_lines), (mut off_child, off_lines)) = (on.unwrap(), off.unwrap());
    assert!(
        on_lines
            .iter()
            .any(|l| l.starts_with("mxtune serve: prefix caching on (")),
        "{on_lines:?}"
    );
    assert!(
        off_lines
            .iter()
            .any(|l| l == "mxtune serve: prefix caching off (--no-enable-prefix-caching)"),
        "{off_lines:?}"
    );
    let base = |lines: &[String]| {
        lines
            .last()
            .unwrap()
            .trim_start_matches("mxtune serve: ready on ")
            .to_string()
    };
    let (on, off) = (base(&on_lines), base(&off_lines));
    let first = json!({"model": "synthetic-tiny", "max_tokens": 3, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hi"}]});
    let next = json!({"model": "synthetic-tiny", "max_tokens": 3, "temperature": 0,
                      "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello."},
                                   {"role": "user", "content": "And now?"}]});
    let get_metrics = |base: String| async move {
        client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let series = |m: &str, name: &str| metric(m, &format!("{name}{{model_name=")).unwrap();
    let run = |base: String| {
        let (first, next) = (first.clone(), next.clone());
        async move {
            let a = chat_turn(&base, first.clone()).await;
            let after_first = get_metrics(base.clone()).await;
            let b = chat_turn(&base, first).await;
            let c = chat_turn(&base, next).await;
            (vec![a, b, c], after_first)
        }
    };
    let ((on_turns, on_after_first), (off_turns, _)) =
        tokio::join!(run(on.clone()), run(off.clone()));
    for (i, (a, b)) in on_turns.iter().zip(&off_turns).enumerate() {
        assert_eq!(a.prompt, b.prompt, "turn {i}");
        assert_eq!(
            a.tokens, b.tokens,
            "turn {i}: greedy tokens differ with prefix caching"
        );
        assert_eq!(a.usage["prompt_tokens"], json!(a.prompt.len()), "turn {i}");
        assert!(
            b.usage.get("prompt_tokens_details").is_none(),
            "{}",
            b.usage
        );
    }
    let [t1, t2, t3] = &on_turns[..] else {
        unreachable!()
    };
    assert_eq!(t1.prompt, t2.prompt);
    assert_eq!(t1.tokens, t2.tokens);
    assert!(
        t1.usage.get("prompt_tokens_details").is_none(),
        "{}",
        t1.usage
    );
    let cached = |t: &ChatTurn| t.usage["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(cached(t2), Some(t2.prompt.len() as u64 - 1), "{}", t2.usage);
    // The slot held the second request's prompt and every token it generated but the last.
    let held: Vec<u32> = t2
        .prompt
        .iter()
        .chain(&t2.tokens[..t2.tokens.len() - 1])
        .copied()
        .collect();
    let shared = held
        .iter()
        .zip(&t3.prompt)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared > 0 && t3.prompt.len() > t2.prompt.len());
    assert_eq!(
        cached(t3),
        Some(shared.min(t3.prompt.len() - 1) as u64),
        "{}",
        t3.usage
    );
    // The counters, in tokens: every prompt queried, the cached ones hit.
    let m = get_metrics(on.clone()).await;
    let queries = (t1.prompt.len() + t2.prompt.len() + t3.prompt.len()) as f64;
    let hits = (cached(t2).unwrap() + cached(t3).unwrap()) as f64;
    assert_eq!(
        series(&on_after_first, "vllm:prefix_cache_queries_total"),
        t1.prompt.len() as f64
    );
    assert_eq!(series(&on_after_first, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(series(&m, "vllm:prefix_cache_queries_total"), queries);
    assert_eq!(series(&m, "vllm:prefix_cache_hits_total"), hits);
    assert!(m.contains("enable_prefix_caching=\"True\""), "{m}");
    let m = get_metrics(off.clone()).await;
    assert!(!m.contains("vllm:prefix_cache_"), "{m}");
    assert!(m.contains("enable_prefix_caching=\"False\""), "{m}");
    for child in [&mut on_child, &mut off_child] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

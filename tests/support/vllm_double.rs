//! A vLLM-like OpenAI streaming server double on 127.0.0.1 for the bench tests.
//!
//! It streams the way vLLM does: a role-only first chunk (`content: ""`), `reasoning_content`
//! deltas, multi-token chunks, `token_ids` when asked, a usage chunk with empty `choices`, and
//! `[DONE]`. Delays are scripted; faults (HTTP errors, stalls, malformed SSE, early close,
//! short answers, NaN logprobs, errors in the stream) are scripted too.

#![allow(dead_code)] // each test binary uses a different part of the double

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::Barrier;

/// Something to go wrong, scripted per server.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Stream normally.
    None,
    /// Answer every POST with this HTTP status.
    Status(u16),
    /// Stop sending (but keep the connection) after this many token chunks.
    StallAfter(usize),
    /// Send a non-JSON `data:` line after this many token chunks.
    MalformedAfter(usize),
    /// Close the connection without `[DONE]` after this many token chunks.
    CloseAfter(usize),
    /// Generate this many tokens fewer than asked, then finish normally with `stop`.
    Short(usize),
    /// Put a NaN literal in the first chunk's logprobs.
    NanLogprob,
    /// Send an `error` object after this many token chunks.
    ErrorAfter(usize),
    /// Answer with a degenerate "a is the is a is the" loop.
    Degenerate,
    /// Vary the output between requests even at temperature 0.
    Nondeterministic,
    /// Put U+FFFD into every word, as random tokens of synthetic weights do.
    Unprintable,
    /// Generate through `stop` strings as if none were sent.
    IgnoreStop,
}

/// How the double streams.
#[derive(Debug, Clone)]
pub struct Script {
    /// Before the role-only chunk (prefill).
    pub prefill: Duration,
    /// Role chunk → first token chunk.
    pub first_token: Duration,
    /// Between token chunks.
    pub chunk_gap: Duration,
    /// Tokens per chunk (the last chunk may carry fewer).
    pub tokens_per_chunk: usize,
    /// The first this-many tokens are reasoning.
    pub reasoning_tokens: usize,
    /// Field name for reasoning deltas (`reasoning_content` or `reasoning`).
    pub reasoning_field: &'static str,
    /// Include `token_ids` in every chunk when the request asks `return_token_ids`.
    pub honour_token_ids: bool,
    /// Send the usage chunk when `stream_options.include_usage` is set.
    pub usage: bool,
    /// What goes wrong.
    pub fault: Fault,
    /// Hold every POST until this many have arrived (proves concurrency without timing).
    pub barrier: Option<Arc<Barrier>>,
    /// `weights` in the `/v1/models` entry (the bundled engine's field; vLLM has none).
    pub weights: Option<&'static str>,
    /// Tokens a chat template adds to every chat prompt, counted in `usage.prompt_tokens`.
    pub template_tokens: usize,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            prefill: Duration::from_millis(20),
            first_token: Duration::from_millis(5),
            chunk_gap: Duration::from_millis(2),
            tokens_per_chunk: 1,
            reasoning_tokens: 0,
            reasoning_field: "reasoning_content",
            honour_token_ids: true,
            usage: true,
            fault: Fault::None,
            barrier: None,
            weights: None,
            template_tokens: 0,
        }
    }
}

struct Shared {
    script: Script,
    posts: AtomicUsize,
    requests: AtomicUsize,
}

/// A running double.
pub struct Double {
    /// `http://127.0.0.1:PORT` (no `/v1`).
    pub url: String,
    shared: Arc<Shared>,
}

impl Double {
    /// POSTs received so far (a retrying client would show more than it sent).
    pub fn posts(&self) -> usize {
        self.shared.posts.load(Ordering::SeqCst)
    }
}

/// Start a double on an ephemeral port of 127.0.0.1.
pub async fn spawn(script: Script) -> Double {
    let shared = Arc::new(Shared {
        script,
        posts: AtomicUsize::new(0),
        requests: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Double {
        url: format!("http://{addr}"),
        shared,
    }
}

/// The word list the double "generates" from; token i of a request is WORDS[(i + k) % len].
pub const WORDS: [&str; 12] = [
    " The", " keeper", " wrote", " down", " the", " weather", " and", " the", " ships", " that",
    " passed", ".",
];

async fn models(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut entry = json!({"id": "double-model", "object": "model"});
    if let Some(w) = s.script.weights {
        entry["weights"] = json!(w);
    }
    axum::Json(json!({"object": "list", "data": [entry]}))
}

async fn chat(State(s): State<Arc<Shared>>, body: axum::Json<Value>) -> Response {
    let prompt_tokens: usize = body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| count(m["content"].as_str().unwrap_or("")))
                .sum()
        })
        .unwrap_or(0)
        + s.script.template_tokens;
    respond(s, body.0, prompt_tokens, true).await
}

async fn completions(State(s): State<Arc<Shared>>, body: axum::Json<Value>) -> Response {
    let prompt_tokens = match &body["prompt"] {
        Value::String(p) => count(p),
        Value::Array(ids) => ids.len(),
        _ => 0,
    };
    respond(s, body.0, prompt_tokens, false).await
}

fn count(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn respond(s: Arc<Shared>, body: Value, prompt_tokens: usize, chat: bool) -> Response {
    let k = s.requests.fetch_add(1, Ordering::SeqCst);
    s.posts.fetch_add(1, Ordering::SeqCst);
    let script = s.script.clone();
    if let Some(b) = &script.barrier {
        b.wait().await;
    }
    if let Fault::Status(code) = script.fault {
        let status = StatusCode::from_u16(code).unwrap();
        return (
            status,
            axum::Json(json!({"error": {"message": "scripted failure", "code": code}})),
        )
            .into_response();
    }
    // Readiness probes (a 1-token completion without `stream`) get a plain JSON answer.
    if body["stream"].as_bool() != Some(true) {
        return axum::Json(json!({"id": "x", "choices": [
            {"index": 0, "text": WORDS[0], "finish_reason": "length"}]}))
        .into_response();
    }
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    let n = match script.fault {
        Fault::Short(k) => max_tokens.saturating_sub(k),
        _ => max_tokens,
    };
    let greedy = body["temperature"].as_f64() == Some(0.0);
    let offset = match script.fault {
        Fault::Nondeterministic => k,
        _ if greedy => body["seed"].as_u64().unwrap_or(0) as usize,
        _ => k,
    };
    let mut words: Vec<String> = (0..n)
        .map(|i| match script.fault {
            Fault::Degenerate => [" a", " is", " the", " is"][i % 4].to_owned(),
            Fault::Unprintable => format!("{}\u{FFFD}", WORDS[(i + offset) % WORDS.len()]),
            _ => WORDS[(i + offset) % WORDS.len()].to_owned(),
        })
        .collect();
    // A `stop` string cuts the text before its first occurrence, as vLLM does.
    let stop = body["stop"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let mut stopped = false;
    if let Some(stop) = stop.filter(|_| script.fault != Fault::IgnoreStop) {
        let mut text = String::new();
        for i in 0..words.len() {
            text.push_str(&words[i]);
            if let Some(at) = text.find(stop) {
                let keep = words[i].len() - (text.len() - at);
                words[i].truncate(keep);
                words.truncate(i + 1);
                stopped = true;
                break;
            }
        }
    }
    let n = words.len();
    let want_ids = script.honour_token_ids && body["return_token_ids"].as_bool() == Some(true);
    let want_logprobs = match &body["logprobs"] {
        Value::Bool(b) => *b,
        Value::Number(_) => true,
        _ => false,
    };
    let want_usage =
        script.usage && body["stream_options"]["include_usage"].as_bool() == Some(true);
    let stream = async_stream::stream! {
        tokio::time::sleep(script.prefill).await;
        let role = if chat {
            json!({"id": "x", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]})
        } else {
            json!({"id": "x", "object": "text_completion", "choices": [
                {"index": 0, "text": "", "logprobs": null, "finish_reason": null}]})
        };
        yield Ok::<Bytes, Infallible>(sse(&role));
        tokio::time::sleep(script.first_token).await;
        let mut sent = 0;
        let mut chunk_no = 0;
        while sent < n {
            if chunk_no > 0 {
                tokio::time::sleep(script.chunk_gap).await;
            }
            match script.fault {
                Fault::StallAfter(c) if c == chunk_no => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Fault::MalformedAfter(c) if c == chunk_no => {
                    yield Ok(Bytes::from("data: {\"choices\": [oops\n\n"));
                    return;
                }
                Fault::CloseAfter(c) if c == chunk_no => return,
                Fault::ErrorAfter(c) if c == chunk_no => {
                    yield Ok(sse(&json!({"error": {"message": "scripted engine error", "code": 500}})));
                    return;
                }
                _ => {}
            }
            let take = script.tokens_per_chunk.min(n - sent);
            let mut reasoning = String::new();
            let mut content = String::new();
            let mut ids = Vec::new();
            for (i, word) in words.iter().enumerate().skip(sent).take(take) {
                if i < script.reasoning_tokens { reasoning.push_str(word) } else { content.push_str(word) }
                ids.push(1000 + i as u64);
            }
            let mut delta = serde_json::Map::new();
            if !reasoning.is_empty() {
                delta.insert(script.reasoning_field.to_owned(), json!(reasoning));
            }
            if !content.is_empty() {
                delta.insert("content".to_owned(), json!(content));
            }
            let finish = if sent + take == n {
                json!(if stopped || n < max_tokens { "stop" } else { "length" })
            } else {
                Value::Null
            };
            let mut choice = if chat {
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            } else {
                json!({"index": 0, "text": format!("{reasoning}{content}"), "finish_reason": finish})
            };
            if want_ids {
                choice["token_ids"] = json!(ids);
            }
            let mut line = None;
            if want_logprobs {
                let lps: Vec<f64> = (0..take).map(|_| -0.25).collect();
                if chat {
                    choice["logprobs"] = json!({"content": lps.iter().map(|l| json!({"token": "t", "logprob": l})).collect::<Vec<_>>()});
                } else {
                    choice["logprobs"] = json!({"tokens": vec!["t"; take], "token_logprobs": lps});
                }
                if script.fault == Fault::NanLogprob && chunk_no == 0 {
                    let text = json!({"choices": [choice]}).to_string().replacen("-0.25", "NaN", 1);
                    line = Some(Bytes::from(format!("data: {text}\n\n")));
                }
            }
            yield Ok(line.unwrap_or_else(|| sse(&json!({"id": "x", "choices": [choice]}))));
            sent += take;
            chunk_no += 1;
        }
        if want_usage {
            yield Ok(sse(&json!({"id": "x", "choices": [], "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": n,
                "total_tokens": prompt_tokens + n}})));
        }
        yield Ok(Bytes::from("data: [DONE]\n\n"));
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

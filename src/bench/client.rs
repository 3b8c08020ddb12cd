//! Streaming client for OpenAI-compatible servers (vLLM, SGLang, llama.cpp, the bundled engine).
//!
//! Connect and read timeouts only: a total deadline would kill long generations. A POST is
//! never retried — a retry would send the prompt twice and corrupt the measurement.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::prompt::Prompt;
use super::trace::{ErrorKind, RequestTrace, consume_sse, error_chain, since};

/// Which OpenAI endpoint to stream from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions` (context = system message, prompt = user message).
    Chat,
    /// `/v1/completions` (context and prompt concatenated).
    Completions,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
        }
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL; `/v1` is appended when missing (`http://host:8000` or `http://host:8000/v1`).
    pub url: String,
    /// Bearer token, when the server wants one.
    pub api_key: Option<String>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Longest silence between two reads of a response body.
    pub read_timeout: Duration,
}

impl ClientConfig {
    /// Defaults: 10 s to connect, 120 s of silence allowed (long prefills stay silent).
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(120),
        }
    }
}

/// The `/v1` base URL of a server URL (`/v1` is added when missing).
pub fn api_base(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    if trimmed.ends_with("/v1") {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1")
    }
}

/// How a prompt is sent.
#[derive(Debug, Clone)]
pub enum PromptBody {
    /// Text (chat messages, or a completions prompt string).
    Text(Prompt),
    /// Token ids in `prompt` (completions endpoint; vLLM and SGLang accept them).
    TokenIds(Prompt),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Model name sent in the body.
    pub model: String,
    /// The prompt.
    pub prompt: PromptBody,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Also send `min_tokens = max_tokens` and `ignore_eos` (vLLM extensions) and treat a
    /// shorter answer as an early end.
    pub exact_output: bool,
    /// Sampling temperature (`None`: server default).
    pub temperature: Option<f64>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Ask for logprobs (one per token; also gives exact per-chunk token counts).
    pub logprobs: bool,
    /// `stop` strings (none: the field is not sent).
    pub stop: Vec<String>,
}

impl RequestSpec {
    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
            // vLLM extension (llama-benchy sends it too): per-chunk token ids give exact
            // per-chunk counts; servers that do not know it ignore it.
            "return_token_ids": true,
        });
        match (&self.prompt, self.endpoint) {
            (PromptBody::Text(p), Endpoint::Chat) | (PromptBody::TokenIds(p), Endpoint::Chat) => {
                let mut messages = Vec::new();
                if !p.context.text.is_empty() {
                    messages.push(json!({"role": "system", "content": p.context.text}));
                }
                messages.push(json!({"role": "user", "content": p.prompt.text}));
                body["messages"] = Value::Array(messages);
            }
            (PromptBody::Text(p), Endpoint::Completions) => {
                body["prompt"] = json!(format!("{}{}", p.context.text, p.prompt.text));
            }
            (PromptBody::TokenIds(p), Endpoint::Completions) => {
                let ids: Vec<u32> = p.context.ids.iter().chain(&p.prompt.ids).copied().collect();
                body["prompt"] = json!(ids);
            }
        }
        if self.exact_output {
            body["min_tokens"] = json!(self.max_tokens);
            body["ignore_eos"] = json!(true);
        }
        if let Some(t) = self.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(s) = self.seed {
            body["seed"] = json!(s);
        }
        if !self.stop.is_empty() {
            body["stop"] = json!(self.stop);
        }
        if self.logprobs {
            match self.endpoint {
                Endpoint::Chat => body["logprobs"] = json!(true),
                Endpoint::Completions => body["logprobs"] = json!(1),
            }
        }
        body
    }
}

/// The streaming client.
#[derive(Debug, Clone)]
pub struct BenchClient {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl BenchClient {
    /// Build a client (no request is sent yet).
    pub fn new(config: &ClientConfig) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            // Keep connections for the whole run: reconnecting inside a timed request adds noise.
            .pool_idle_timeout(None)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            http,
            base: api_base(&config.url),
            api_key: config.api_key.clone(),
        })
    }

    /// The `/v1` base URL requests go to.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    /// `GET /v1/models`: the ids the server serves.
    pub async fn models(&self) -> Result<Vec<String>> {
        let ids = self
            .model_entries()
            .await?
            .iter()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        Ok(ids)
    }

    /// The `weights` field of `model`'s `/v1/models` entry (the bundled engine says
    /// `synthetic` or `checkpoint`; vLLM says nothing, which reads as `None`).
    pub async fn model_weights(&self, model: &str) -> Result<Option<String>> {
        let entries = self.model_entries().await?;
        Ok(entries
            .iter()
            .find(|m| m["id"].as_str() == Some(model))
            .and_then(|m| m["weights"].as_str())
            .map(str::to_owned))
    }

    async fn model_entries(&self) -> Result<Vec<Value>> {
        let url = format!("{}/models", self.base);
        let resp = self
            .auth(self.http.get(&url))
            .send()
            .await
            .with_context(|| format!("GET {url}: is the server up?"))?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("GET {url}: reading the JSON answer"))?;
        if !status.is_success() {
            anyhow::bail!("GET {url}: HTTP {status}: {body}");
        }
        Ok(body["data"].as_array().cloned().unwrap_or_default())
    }

    /// Time one `GET /v1/models` round trip, in seconds (llama-benchy's `api` latency).
    pub async fn time_models(&self) -> Result<f64> {
        let start = Instant::now();
        self.models().await?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Stream one request; never fails as a whole — problems land in `trace.error`.
    pub async fn stream(&self, spec: &RequestSpec, epoch: Instant) -> RequestTrace {
        let url = format!("{}/{}", self.base, spec.endpoint.path());
        let body = spec.body();
        let mut trace = RequestTrace::started(epoch, spec.max_tokens);
        let resp = self.auth(self.http.post(&url).json(&body)).send().await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                trace.end_s = since(epoch);
                let kind = if e.is_connect() {
                    ErrorKind::Connect
                } else if e.is_timeout() {
                    ErrorKind::ReadTimeout
                } else {
                    ErrorKind::Transport
                };
                trace.fail(kind, format!("POST {url}: {}", error_chain(&e)));
                return trace;
            }
        };
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            trace.end_s = since(epoch);
            let text: String = text.chars().take(300).collect();
            trace.fail(
                ErrorKind::Http,
                format!("POST {url}: HTTP {status}: {text}"),
            );
            return trace;
        }
        let exact = spec.exact_output;
        consume_sse(
            resp.bytes_stream(),
            epoch,
            &mut trace,
            exact,
            |e: &reqwest::Error| {
                if e.is_timeout() {
                    ErrorKind::ReadTimeout
                } else {
                    ErrorKind::Transport
                }
            },
        )
        .await;
        trace
    }
}

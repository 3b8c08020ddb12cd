//! Per-request timings taken by the client, and the SSE bookkeeping that fills them.
//!
//! All times are seconds since one run-wide epoch (an `Instant`), so requests of a concurrent
//! batch share one time axis and batch spans can be computed.

use std::time::Instant;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use super::sse::{ChunkError, PerChunkCount, parse_chunk};

/// One chunk that carried generated tokens, as the client saw it arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    /// Arrival time, seconds since the run epoch.
    pub t_s: f64,
    /// Tokens in the chunk (1 when the server did not say; see [`CountMethod`]).
    pub tokens: u32,
}

/// How the completion token count of a request was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountMethod {
    /// Every token-carrying chunk listed its token ids: exact per chunk.
    TokenIds,
    /// Every token-carrying chunk had one logprob entry per token: exact per chunk.
    Logprobs,
    /// Total from `usage.completion_tokens`; per-chunk split unknown (1 assumed per chunk).
    Usage,
    /// Neither: one token per chunk assumed (llama-benchy's method; wrong for multi-token chunks).
    Chunks,
}

impl CountMethod {
    /// Short label for tables and reports.
    pub fn label(self) -> &'static str {
        match self {
            CountMethod::TokenIds => "token_ids",
            CountMethod::Logprobs => "logprobs",
            CountMethod::Usage => "usage",
            CountMethod::Chunks => "chunks",
        }
    }
}

/// What went wrong with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No TCP connection (refused, unreachable, connect timeout).
    Connect,
    /// The server answered with a non-2xx status.
    Http,
    /// No byte arrived within the read timeout.
    ReadTimeout,
    /// The connection broke mid-body.
    Transport,
    /// A `data:` payload was not a valid chunk, or the byte stream was not SSE.
    MalformedSse,
    /// The server put an `error` object into the stream.
    ServerError,
    /// The stream ended without `[DONE]`.
    EarlyClose,
    /// Fewer completion tokens than requested (timings are still usable).
    TooFewTokens,
}

/// A per-request failure with a human-readable reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestError {
    /// Category.
    pub kind: ErrorKind,
    /// What happened, naming the URL or the chunk at fault.
    pub message: String,
}

impl RequestError {
    /// A fatal error leaves no trustworthy timings; a short response still has them.
    pub fn is_fatal(&self) -> bool {
        self.kind != ErrorKind::TooFewTokens
    }
}

/// Everything the client recorded for one streamed request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestTrace {
    /// Request sent (just before the POST), seconds since the run epoch.
    pub start_s: f64,
    /// First chunk with a non-empty `choices` array (may carry no token: role-only chunk).
    pub first_chunk_s: Option<f64>,
    /// First chunk carrying content, reasoning_content or reasoning.
    pub first_token_s: Option<f64>,
    /// Every token-carrying chunk, in arrival order.
    pub arrivals: Vec<Arrival>,
    /// Stream finished (`[DONE]`, close or error).
    pub end_s: f64,
    /// `usage.prompt_tokens`, when the server sent usage.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens, counted by `count_method`.
    pub completion_tokens: u64,
    /// How `completion_tokens` and the per-arrival counts were obtained.
    pub count_method: CountMethod,
    /// `usage.completion_tokens` as sent, to cross-check per-chunk counts.
    pub usage_completion_tokens: Option<u64>,
    /// Tokens asked for (`max_tokens`).
    pub requested_tokens: u32,
    /// `finish_reason` of the last chunk that had one.
    pub finish_reason: Option<String>,
    /// Failure, if any.
    pub error: Option<RequestError>,
    /// Answer text received.
    #[serde(skip)]
    pub content: String,
    /// Reasoning text received.
    #[serde(skip)]
    pub reasoning: String,
    /// Logprobs received (when requested).
    #[serde(skip)]
    pub logprobs: Vec<f64>,
    /// Some logprob entry was null.
    #[serde(skip)]
    pub invalid_logprobs: bool,
}

impl RequestTrace {
    /// An empty trace for a request that starts now.
    pub fn started(epoch: Instant, requested_tokens: u32) -> Self {
        Self {
            start_s: since(epoch),
            first_chunk_s: None,
            first_token_s: None,
            arrivals: Vec::new(),
            end_s: since(epoch),
            prompt_tokens: None,
            completion_tokens: 0,
            count_method: CountMethod::Chunks,
            usage_completion_tokens: None,
            requested_tokens,
            finish_reason: None,
            error: None,
            content: String::new(),
            reasoning: String::new(),
            logprobs: Vec::new(),
            invalid_logprobs: false,
        }
    }

    /// Timings can be used for statistics (no error, or only a short response).
    pub fn usable(&self) -> bool {
        self.error.as_ref().is_none_or(|e| !e.is_fatal())
    }

    /// Mark the request failed unless an earlier error already explains it.
    pub fn fail(&mut self, kind: ErrorKind, message: impl Into<String>) {
        if self.error.as_ref().is_none_or(|e| !e.is_fatal()) {
            self.error = Some(RequestError {
                kind,
                message: message.into(),
            });
        }
    }
}

/// Seconds elapsed since `epoch`.
pub fn since(epoch: Instant) -> f64 {
    epoch.elapsed().as_secs_f64()
}

/// Consume an SSE byte stream into `trace`: the client's hot loop, also used by the benches.
///
/// `classify` maps a transport error (e.g. a reqwest read timeout) to an [`ErrorKind`].
/// `exact_output` says the request asked for exactly `requested_tokens` (min_tokens +
/// ignore_eos), so fewer is reported as [`ErrorKind::TooFewTokens`].
pub async fn consume_sse<S, B, E>(
    stream: S,
    epoch: Instant,
    trace: &mut RequestTrace,
    exact_output: bool,
    classify: impl Fn(&E) -> ErrorKind,
) where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::error::Error,
{
    let mut events = stream.eventsource();
    let mut done = false;
    let mut per_chunk: Option<PerChunkCount> = None;
    let mut all_chunks_counted = true;
    let mut usage = None;
    while let Some(item) = events.next().await {
        let now = since(epoch);
        let event = match item {
            Ok(event) => event,
            Err(EventStreamError::Transport(e)) => {
                let kind = classify(&e);
                trace.fail(
                    kind,
                    format!("stream broke after {:.3}s: {e}", now - trace.start_s),
                );
                break;
            }
            Err(e) => {
                trace.fail(ErrorKind::MalformedSse, format!("not an SSE stream: {e}"));
                break;
            }
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            done = true;
            trace.end_s = now;
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk = match parse_chunk(data) {
            Ok(chunk) => chunk,
            Err(e @ (ChunkError::Malformed { .. } | ChunkError::NonFinite { .. })) => {
                trace.fail(ErrorKind::MalformedSse, e.to_string());
                break;
            }
        };
        if let Some(message) = chunk.error {
            trace.fail(
                ErrorKind::ServerError,
                format!("server error in stream: {message}"),
            );
            break;
        }
        if chunk.has_choices && trace.first_chunk_s.is_none() {
            trace.first_chunk_s = Some(now);
        }
        if chunk.carries_token() {
            if trace.first_token_s.is_none() {
                trace.first_token_s = Some(now);
            }
            match (chunk.tokens, chunk.tokens_from) {
                (Some(n), Some(from)) => {
                    // Token ids beat logprobs when a stream mixes both.
                    if per_chunk != Some(PerChunkCount::TokenIds) {
                        per_chunk = Some(from);
                    }
                    trace.arrivals.push(Arrival {
                        t_s: now,
                        tokens: n,
                    });
                }
                _ => {
                    all_chunks_counted = false;
                    trace.arrivals.push(Arrival {
                        t_s: now,
                        tokens: 1,
                    });
                }
            }
            trace.content.push_str(&chunk.content);
            trace.reasoning.push_str(&chunk.reasoning);
        }
        trace.logprobs.extend_from_slice(&chunk.logprobs);
        trace.invalid_logprobs |= chunk.invalid_logprob;
        if chunk.finish_reason.is_some() {
            trace.finish_reason = chunk.finish_reason;
        }
        if chunk.usage.is_some() {
            usage = chunk.usage;
        }
    }
    if !done {
        trace.end_s = since(epoch);
        if trace.error.is_none() {
            trace.fail(
                ErrorKind::EarlyClose,
                format!(
                    "server closed the stream without [DONE] after {} chunks with tokens",
                    trace.arrivals.len()
                ),
            );
        }
    }
    finish_counts(trace, per_chunk.filter(|_| all_chunks_counted), usage);
    if exact_output
        && trace.error.is_none()
        && trace.completion_tokens < trace.requested_tokens as u64
    {
        trace.error = Some(RequestError {
            kind: ErrorKind::TooFewTokens,
            message: format!(
                "ended early: {} of {} tokens (finish_reason {}); the server may ignore min_tokens/ignore_eos",
                trace.completion_tokens,
                trace.requested_tokens,
                trace.finish_reason.as_deref().unwrap_or("none")
            ),
        });
    }
}

/// An error with its causes (reqwest keeps the real one — refused, timed out — in the chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn finish_counts(
    trace: &mut RequestTrace,
    per_chunk: Option<PerChunkCount>,
    usage: Option<super::sse::Usage>,
) {
    trace.prompt_tokens = usage.map(|u| u.prompt_tokens);
    trace.usage_completion_tokens = usage.map(|u| u.completion_tokens);
    let summed: u64 = trace.arrivals.iter().map(|a| a.tokens as u64).sum();
    match (per_chunk, usage) {
        (Some(PerChunkCount::TokenIds), _) => {
            trace.count_method = CountMethod::TokenIds;
            trace.completion_tokens = summed;
        }
        (Some(PerChunkCount::Logprobs), _) => {
            trace.count_method = CountMethod::Logprobs;
            trace.completion_tokens = summed;
        }
        (None, Some(u)) => {
            trace.count_method = CountMethod::Usage;
            trace.completion_tokens = u.completion_tokens;
        }
        (None, None) => {
            trace.count_method = CountMethod::Chunks;
            trace.completion_tokens = summed;
        }
    }
}

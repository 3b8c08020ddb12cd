//! Turning the scheduler's token events into OpenAI responses: text per channel, stop
//! strings, logprobs, usage; as one JSON body or as an SSE stream.

use super::api::Prepared;
use super::error::ApiError;
use crate::engine::harmony::{Channel, Delta, OutputParser};
use crate::engine::sampling::{Sampled, StopStrings};
use crate::engine::scheduler::{FinishReason, GenEvent};
use crate::engine::tokenizer::{StreamDecoder, Tokenizer};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// Which endpoint a generation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Identity of one response, repeated in every chunk.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

enum TextSource {
    /// Raw text, control tokens left out (vLLM's `skip_special_tokens`).
    Plain(StreamDecoder),
    /// Harmony channels.
    Harmony(Box<OutputParser>),
}

/// Per-choice output state: detokenizer or harmony parser, one stop-string matcher per
/// channel, and the generated-token count for `usage`.
struct Output {
    tok: Tokenizer,
    source: TextSource,
    stops: [StopStrings; 2],
    return_ids: bool,
    /// The request's `stop_token_ids` whose text is left out of the answer (all of them,
    /// unless `include_stop_str_in_output`), as vLLM leaves out the token that stopped it.
    hidden_stops: Vec<u32>,
    completion_tokens: usize,
    /// The id of each tool call of the answer, by call number.
    call_ids: Vec<String>,
}

/// What one token produced.
#[derive(Default)]
struct TokenOut {
    deltas: Vec<Delta>,
    /// A stop string matched: nothing more is emitted.
    stopped: bool,
}

impl Output {
    fn new(tok: Tokenizer, endpoint: Endpoint, p: &Prepared) -> Result<Self, ApiError> {
        let source = match endpoint {
            Endpoint::Completions => TextSource::Plain(StreamDecoder::default()),
            Endpoint::Chat => TextSource::Harmony(Box::new(
                OutputParser::with_prefill(tok, p.tools, &p.prefill)
                    .map_err(|e| ApiError::internal(format!("{e:#}")))?,
            )),
        };
        Ok(Output {
            tok,
            source,
            stops: [
                StopStrings::including(p.stop.clone(), p.include_stop_str_in_output),
                StopStrings::including(p.stop.clone(), p.include_stop_str_in_output),
            ],
            return_ids: p.return_tokens_as_token_ids,
            hidden_stops: if p.include_stop_str_in_output {
                Vec::new()
            } else {
                p.sampling.stop_token_ids.clone()
            },
            completion_tokens: 0,
            call_ids: Vec::new(),
        })
    }

    /// The stop-string matcher of a text channel; tool calls are not matched (their
    /// arguments must stay whole JSON).
    fn stop_index(c: Channel) -> Option<usize> {
        match c {
            Channel::Reasoning => Some(0),
            Channel::Content => Some(1),
            Channel::ToolName(_) | Channel::ToolArgs(_) => None,
        }
    }

    /// The id of tool call `n` (made when its name arrives).
    fn call_id(&mut self, n: usize) -> &str {
        while self.call_ids.len() <= n {
            self.call_ids.push(format!(
                "call_{}",
                ulid::Ulid::generate().to_string().to_lowercase()
            ));
        }
        &self.call_ids[n]
    }

    /// `tool_calls` when the answer called a function and ended normally, as vLLM reports.
    fn finish_str(&self, r: FinishReason) -> &'static str {
        match r {
            FinishReason::Stop if !self.call_ids.is_empty() => "tool_calls",
            r => finish_str(r),
        }
    }

    fn apply_stops(&mut self, raw: Vec<Delta>) -> TokenOut {
        let mut out = TokenOut::default();
        for d in raw {
            let Some(at) = Self::stop_index(d.channel) else {
                if let Channel::ToolName(n) = d.channel {
                    self.call_id(n);
                }
                out.deltas.push(d);
                continue;
            };
            let (text, hit) = self.stops[at].push(&d.text);
            if !text.is_empty() {
                out.deltas.push(Delta {
                    channel: d.channel,
                    text,
                });
            }
            if hit {
                out.stopped = true;
                break;
            }
        }
        out
    }

    fn on_token(&mut self, id: u32) -> TokenOut {
        self.completion_tokens += 1;
        // Such a token ends generation (the scheduler stops on it), so it is the last.
        if self.hidden_stops.contains(&id) {
            return TokenOut::default();
        }
        let raw = match &mut self.source {
            TextSource::Plain(d) => {
                if self.tok.is_special(id) {
                    Vec::new()
                } else {
                    let text = d.push(&self.tok.token_bytes(id));
                    vec![Delta {
                        channel: Channel::Content,
                        text,
                    }]
                }
            }
            TextSource::Harmony(p) => p.push(id),
        };
        self.apply_stops(raw)
    }

    /// End of generation: flush partial characters and held-back stop-string prefixes.
    fn finish(&mut self) -> Vec<Delta> {
        let raw = match &mut self.source {
            TextSource::Plain(d) => vec![Delta {
                channel: Channel::Content,
                text: d.finish(),
            }],
            TextSource::Harmony(p) => p.finish(),
        };
        let mut out = self.apply_stops(raw).deltas;
        for (at, c) in [Channel::Reasoning, Channel::Content]
            .into_iter()
            .enumerate()
        {
            let text = self.stops[at].finish();
            if !text.is_empty() {
                out.push(Delta { channel: c, text });
            }
        }
        out
    }

    fn token_name(&self, id: u32) -> String {
        if self.return_ids {
            format!("token_id:{id}")
        } else {
            self.tok.token_text(id)
        }
    }

    /// Chat-format logprob entry for one token.
    fn chat_logprob(&self, s: &Sampled) -> Value {
        let entry = |id: u32, lp: f32| json!({"token": self.token_name(id), "logprob": lp, "bytes": self.tok.token_bytes(id)});
        let mut e = entry(s.token, s.logprob.unwrap_or(f32::NAN));
        e["top_logprobs"] = s.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
        e
    }
}

/// Completions-format logprobs accumulated over a run of tokens.
#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Add a token at `offset` of the text; returns the length of its name (where the next
    /// token of a scored prompt starts).
    fn push(&mut self, out: &Output, s: &Sampled, offset: usize) -> usize {
        let name = out.token_name(s.token);
        let len = name.len();
        self.tokens.push(name);
        self.token_logprobs.push(s.logprob.unwrap_or(f32::NAN));
        self.top_logprobs.push(Value::Object(
            s.top
                .iter()
                .map(|&(id, lp)| (out.token_name(id), json!(lp)))
                .collect(),
        ));
        self.text_offset.push(offset);
        len
    }

    /// A scored prompt's first token, which has nothing before it to be scored by: null
    /// logprob and alternatives, as vLLM reports it. Returns its name's length.
    fn push_first(&mut self, out: &Output, token: u32) -> usize {
        let name = out.token_name(token);
        let len = name.len();
        self.tokens.push(name);
        self.token_logprobs.push(f32::NAN);
        self.top_logprobs.push(Value::Null);
        self.text_offset.push(0);
        len
    }

    fn to_json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// OpenAI's `usage` object; `prompt_tokens_details.cached_tokens` when the prefix cache gave
/// some of the prompt (left out at 0, as vLLM leaves it out).
fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    let mut u = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    if cached_tokens > 0 {
        u["prompt_tokens_details"] = json!({"cached_tokens": cached_tokens});
    }
    u
}

const ENGINE_GONE: &str =
    "the engine stopped before the request finished (see the server log); restart the server";

fn finish_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// One choice of a whole (non-streamed) response, the tokens it generated, and the prompt
/// tokens its sequence found in the prefix cache.
struct ChoiceDone {
    choice: Value,
    completion_tokens: usize,
    cached_tokens: usize,
}

/// Collect one choice's generation.
async fn collect_choice(
    mut rx: UnboundedReceiver<GenEvent>,
    index: usize,
    mut out: Output,
    endpoint: Endpoint,
    prepared: &Prepared,
) -> Result<ChoiceDone, ApiError> {
    let want_logprobs = prepared.sampling.logprobs.is_some();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut cmpl_lp = CompletionLogprobs::default();
    let mut chat_lp: Vec<Value> = Vec::new();
    let mut finish = None;
    let mut cached_tokens = 0;
    // Every token the engine sent, as vLLM's `token_ids` (stop tokens included).
    let mut token_ids: Vec<u32> = Vec::new();
    // (name, arguments) of each tool call.
    let mut calls: Vec<(String, String)> = Vec::new();
    let push_deltas = |deltas: Vec<Delta>,
                       reasoning: &mut String,
                       content: &mut String,
                       calls: &mut Vec<(String, String)>| {
        for d in deltas {
            match d.channel {
                Channel::Reasoning => reasoning.push_str(&d.text),
                Channel::Content => content.push_str(&d.text),
                Channel::ToolName(_) => calls.push((d.text, String::new())),
                Channel::ToolArgs(_) => {
                    if let Some(c) = calls.last_mut() {
                        c.1.push_str(&d.text);
                    }
                }
            }
        }
    };
    // `echo` with `logprobs` scores the prompt: its tokens lead the logprobs, the first with
    // none, and the generated tokens' offsets count the echoed text before them.
    let echo_len = prepared.echo.as_deref().map_or(0, str::len);
    let mut prompt_off = 0usize;
    if want_logprobs
        && endpoint == Endpoint::Completions
        && prepared.sampling.prompt_logprobs
        && let Some(&first) = prepared.prompt.first()
    {
        prompt_off = cmpl_lp.push_first(&out, first);
    }
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Cached(n) => cached_tokens = n,
            GenEvent::Prompt(s) => {
                if want_logprobs && endpoint == Endpoint::Completions {
                    prompt_off += cmpl_lp.push(&out, &s, prompt_off);
                }
            }
            GenEvent::Token(s) => {
                token_ids.push(s.token);
                if want_logprobs {
                    match endpoint {
                        Endpoint::Completions => {
                            cmpl_lp.push(&out, &s, echo_len + content.len());
                        }
                        Endpoint::Chat => chat_lp.push(out.chat_logprob(&s)),
                    }
                }
                let t = out.on_token(s.token);
                push_deltas(t.deltas, &mut reasoning, &mut content, &mut calls);
                if t.stopped {
                    finish = Some(FinishReason::Stop);
                    break;
                }
            }
            GenEvent::Done(r) => {
                finish = Some(r);
                let rest = out.finish();
                push_deltas(rest, &mut reasoning, &mut content, &mut calls);
                break;
            }
            GenEvent::Error(m) => return Err(ApiError::internal(m)),
        }
    }
    // Dropping the receiver here also cancels a request cut short by a stop string.
    drop(rx);
    // The channel closed without an end: the engine thread died mid-request.
    let Some(finish) = finish else {
        return Err(ApiError::internal(ENGINE_GONE));
    };
    let mut choice = match endpoint {
        Endpoint::Completions => json!({
            "index": index,
            "text": format!("{}{content}", prepared.echo.as_deref().unwrap_or_default()),
            "logprobs": if want_logprobs { cmpl_lp.to_json() } else { Value::Null },
            "finish_reason": out.finish_str(finish),
        }),
        Endpoint::Chat => json!({
            "index": index,
            "message": {
                "role": "assistant",
                // OpenAI's shape: no content when the answer is only a tool call.
                "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) },
                "reasoning_content": if reasoning.is_empty() { Value::Null } else { json!(reasoning) },
            },
            "logprobs": if want_logprobs { json!({"content": chat_lp}) } else { Value::Null },
            "finish_reason": out.finish_str(finish),
        }),
    };
    if !calls.is_empty() {
        choice["message"]["tool_calls"] = calls
            .iter()
            .zip(&out.call_ids)
            .map(|((name, args), id)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
    }
    if prepared.return_token_ids {
        // vLLM's shape: completions carry the prompt per choice (a request may hold several
        // prompts there), chat once per response.
        if endpoint == Endpoint::Completions {
            choice["prompt_token_ids"] = json!(prepared.prompt);
        }
        choice["token_ids"] = json!(token_ids);
    }
    Ok(ChoiceDone {
        choice,
        completion_tokens: out.completion_tokens,
        cached_tokens,
    })
}

/// The prompt each choice answers, prompt after prompt, `n` choices each, and whether the
/// choice is its prompt's first: the one whose prefix-cache hit counts for the prompt (each
/// choice is a sequence of its own).
fn choice_prompts(prompts: &[Prepared]) -> Vec<(&Prepared, bool)> {
    prompts
        .iter()
        .flat_map(|p| (0..p.n).map(move |j| (p, j == 0)))
        .collect()
}

/// One output state per choice of `choices` ([`choice_prompts`]), or the error that keeps
/// the response from starting.
fn outputs(
    tok: Tokenizer,
    endpoint: Endpoint,
    choices: &[(&Prepared, bool)],
) -> Result<Vec<Output>, ApiError> {
    choices
        .iter()
        .map(|&(p, _)| Output::new(tok, endpoint, p))
        .collect()
}

/// The prompts' tokens together (`usage.prompt_tokens` of a request with several prompts).
fn prompt_tokens(prompts: &[Prepared]) -> usize {
    prompts.iter().map(|p| p.prompt.len()).sum()
}

/// Collect every choice's generation into one JSON response. `rxs` holds one receiver per
/// choice, in choice order: the `n` choices of each of `prompts` (one prompt, or a
/// completions request's list), prompt after prompt.
pub async fn respond_full(
    rxs: Vec<UnboundedReceiver<GenEvent>>,
    tok: Tokenizer,
    endpoint: Endpoint,
    prompts: &[Prepared],
    meta: ResponseMeta,
) -> Response {
    let Some(prepared) = prompts.first() else {
        return ApiError::internal("a request with no prompt reached the responder")
            .into_response();
    };
    let per_choice = choice_prompts(prompts);
    let outs = match outputs(tok, endpoint, &per_choice) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    // The first failure ends the response; the other choices' receivers are dropped with
    // their futures, which cancels them in the scheduler.
    let done = futures::future::try_join_all(
        rxs.into_iter()
            .zip(outs)
            .zip(&per_choice)
            .enumerate()
            .map(|(i, ((rx, out), &(p, _)))| collect_choice(rx, i, out, endpoint, p)),
    )
    .await;
    let done = match done {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let completion_tokens = done.iter().map(|d| d.completion_tokens).sum();
    // One count a prompt: its first choice's.
    let cached_tokens = done
        .iter()
        .zip(&per_choice)
        .filter(|&(_, &(_, first))| first)
        .map(|(d, _)| d.cached_tokens)
        .sum();
    let choices: Vec<Value> = done.into_iter().map(|d| d.choice).collect();
    let mut body = json!({
        "id": meta.id,
        "object": match endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(prompt_tokens(prompts), completion_tokens, cached_tokens),
    });
    if prepared.return_token_ids && endpoint == Endpoint::Chat {
        body["prompt_token_ids"] = json!(prepared.prompt);
    }
    axum::Json(body).into_response()
}

fn chunk_value(meta: &ResponseMeta, endpoint: Endpoint, choices: Value) -> Value {
    let object = match endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    })
}

/// What one choice's chunks carry besides its delta.
///
/// `return_token_ids`: the prompt's ids ride on the choice's first chunk (in the choice for
/// completions, at the top for chat, as vLLM does), and each chunk carries the ids of the
/// tokens received since the previous chunk. A token that adds no text (a control token,
/// text held back for a stop string) waits for the next chunk, so the chunks' ids
/// concatenate to every generated token.
///
/// `echo` (completions): the prompt's text goes before the text of the choice's first chunk.
///
/// `continuous_usage_stats`: every chunk carries `usage` with this choice's completion
/// tokens so far, as vLLM counts them.
struct ChoiceChunks {
    index: usize,
    endpoint: Endpoint,
    return_ids: bool,
    prompt: Option<Vec<u32>>,
    pending: Vec<u32>,
    echo: Option<String>,
    continuous_usage: bool,
    prompt_tokens: usize,
}

impl ChoiceChunks {
    fn new(index: usize, endpoint: Endpoint, p: &Prepared) -> Self {
        ChoiceChunks {
            index,
            endpoint,
            return_ids: p.return_token_ids,
            prompt: p.return_token_ids.then(|| p.prompt.clone()),
            pending: Vec::new(),
            echo: p.echo.clone(),
            continuous_usage: p.continuous_usage,
            prompt_tokens: p.prompt.len(),
        }
    }

    fn push(&mut self, token: u32) {
        if self.return_ids {
            self.pending.push(token);
        }
    }

    /// One chunk with `choice` (its index set here), plus what the choice owes.
    fn chunk(&mut self, meta: &ResponseMeta, mut choice: Value, completion_tokens: usize) -> Value {
        choice["index"] = json!(self.index);
        if let Some(echo) = self.echo.take()
            && let Some(text) = choice.get_mut("text")
        {
            *text = json!(format!("{echo}{}", text.as_str().unwrap_or_default()));
        }
        let mut v = chunk_value(meta, self.endpoint, json!([choice]));
        if self.return_ids {
            if let Some(prompt) = self.prompt.take() {
                let at = match self.endpoint {
                    Endpoint::Completions => v["choices"].get_mut(0),
                    Endpoint::Chat => Some(&mut v),
                };
                if let Some(at) = at {
                    at["prompt_token_ids"] = json!(prompt);
                }
            }
            if let Some(c) = v["choices"].get_mut(0) {
                c["token_ids"] = json!(std::mem::take(&mut self.pending));
            }
        }
        if self.continuous_usage {
            v["usage"] = usage(self.prompt_tokens, completion_tokens, 0);
        }
        v
    }
}

fn delta_choice(out: &Output, endpoint: Endpoint, d: Option<&Delta>, logprobs: Value) -> Value {
    match endpoint {
        Endpoint::Completions => json!({
            "text": d.map_or("", |d| d.text.as_str()),
            "logprobs": logprobs,
            "finish_reason": null,
        }),
        Endpoint::Chat => {
            let delta = match d {
                Some(Delta {
                    channel: Channel::Reasoning,
                    text,
                }) => json!({"reasoning_content": text}),
                Some(Delta {
                    channel: Channel::Content,
                    text,
                }) => json!({"content": text}),
                Some(Delta {
                    channel: Channel::ToolName(n),
                    text,
                }) => json!({"tool_calls": [{
                    "index": n,
                    "id": out.call_ids.get(*n),
                    "type": "function",
                    "function": {"name": text, "arguments": ""},
                }]}),
                Some(Delta {
                    channel: Channel::ToolArgs(n),
                    text,
                }) => json!({"tool_calls": [{"index": n, "function": {"arguments": text}}]}),
                None => json!({}),
            };
            json!({"delta": delta, "logprobs": logprobs, "finish_reason": null})
        }
    }
}

/// What one choice's stream hands the response stream.
enum Piece {
    /// A chunk to send.
    Chunk(Value),
    /// An error to send; the response ends after it.
    Failed(Value),
    /// The choice finished after generating this many tokens.
    Finished(usize),
    /// The choice (its index) found this many prompt tokens in the prefix cache.
    Cached { index: usize, tokens: usize },
}

/// One choice's chunks, from its receiver.
fn choice_stream(
    mut rx: UnboundedReceiver<GenEvent>,
    mut out: Output,
    mut chunks: ChoiceChunks,
    want_logprobs: bool,
    meta: ResponseMeta,
) -> impl Stream<Item = Piece> + Send {
    let endpoint = chunks.endpoint;
    async_stream::stream! {
        // The role chunk waits for the engine's first output (after prefill), as in vLLM:
        // clients time the first chunk as time-to-first-response.
        let mut role_pending = endpoint == Endpoint::Chat;
        let mut finish = None;
        let mut failed = false;
        let mut text_len = 0usize;
        while let Some(ev) = rx.recv().await {
            if let GenEvent::Cached(tokens) = ev {
                yield Piece::Cached { index: chunks.index, tokens };
                continue;
            }
            if role_pending && !matches!(ev, GenEvent::Error(_)) {
                role_pending = false;
                let role = json!({"delta": {"role": "assistant", "content": ""},
                                  "logprobs": null, "finish_reason": null});
                yield Piece::Chunk(chunks.chunk(&meta, role, out.completion_tokens));
            }
            match ev {
                GenEvent::Token(s) => {
                    chunks.push(s.token);
                    let lp = if !want_logprobs {
                        Value::Null
                    } else if endpoint == Endpoint::Chat {
                        json!({"content": [out.chat_logprob(&s)]})
                    } else {
                        let mut l = CompletionLogprobs::default();
                        l.push(&out, &s, text_len);
                        l.to_json()
                    };
                    let t = out.on_token(s.token);
                    let mut lp = Some(lp);
                    for d in &t.deltas {
                        text_len += d.text.len();
                        let l = lp.take().unwrap_or(Value::Null);
                        let c = delta_choice(&out, endpoint, Some(d), l);
                        yield Piece::Chunk(chunks.chunk(&meta, c, out.completion_tokens));
                    }
                    // Every token gets a chunk when logprobs were asked for, text or not.
                    if let Some(l) = lp.filter(|_| want_logprobs) {
                        let c = delta_choice(&out, endpoint, None, l);
                        yield Piece::Chunk(chunks.chunk(&meta, c, out.completion_tokens));
                    }
                    if t.stopped {
                        finish = Some(FinishReason::Stop);
                        break;
                    }
                }
                GenEvent::Done(r) => {
                    for d in out.finish() {
                        let c = delta_choice(&out, endpoint, Some(&d), Value::Null);
                        yield Piece::Chunk(chunks.chunk(&meta, c, out.completion_tokens));
                    }
                    finish = Some(r);
                    break;
                }
                GenEvent::Error(m) => {
                    yield Piece::Failed(ApiError::internal(m).body());
                    failed = true;
                    break;
                }
                // A stream never scores its prompt (the server refuses `echo` with
                // `logprobs` there).
                GenEvent::Cached(_) | GenEvent::Prompt(_) => {}
            }
        }
        drop(rx);
        if finish.is_none() && !failed {
            yield Piece::Failed(ApiError::internal(ENGINE_GONE).body());
        }
        if let Some(r) = finish {
            let last = match endpoint {
                Endpoint::Completions => json!({"text": "", "logprobs": null,
                                                 "finish_reason": out.finish_str(r)}),
                Endpoint::Chat => json!({"delta": {}, "logprobs": null,
                                          "finish_reason": out.finish_str(r)}),
            };
            yield Piece::Chunk(chunks.chunk(&meta, last, out.completion_tokens));
            yield Piece::Finished(out.completion_tokens);
        }
    }
}

/// Stream the generation as server-sent events, the choices' chunks interleaved as they
/// come. When the client goes away the stream is dropped, which drops the receivers, which
/// cancels the choices in the scheduler.
pub fn respond_stream(
    rxs: Vec<UnboundedReceiver<GenEvent>>,
    tok: Tokenizer,
    endpoint: Endpoint,
    prompts: &[Prepared],
    meta: ResponseMeta,
) -> Response {
    let Some(prepared) = prompts.first() else {
        return ApiError::internal("a request with no prompt reached the responder")
            .into_response();
    };
    let per_choice = choice_prompts(prompts);
    let outs = match outputs(tok, endpoint, &per_choice) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let n = rxs.len();
    let want_logprobs = prepared.sampling.logprobs.is_some();
    let include_usage = prepared.include_usage;
    let prompt_tokens = prompt_tokens(prompts);
    let firsts: Vec<bool> = per_choice.iter().map(|&(_, first)| first).collect();
    let mut choices = futures::stream::SelectAll::new();
    for (i, ((rx, out), &(p, _))) in rxs.into_iter().zip(outs).zip(&per_choice).enumerate() {
        let chunks = ChoiceChunks::new(i, endpoint, p);
        choices.push(Box::pin(choice_stream(
            rx,
            out,
            chunks,
            want_logprobs,
            meta.clone(),
        )));
    }
    let stream = async_stream::stream! {
        let mut finished = 0usize;
        let mut completion_tokens = 0usize;
        let mut cached_tokens = 0usize;
        let mut failed = false;
        while let Some(piece) = futures::StreamExt::next(&mut choices).await {
            match piece {
                Piece::Chunk(v) => yield Event::default().data(v.to_string()),
                Piece::Failed(v) => {
                    yield Event::default().data(v.to_string());
                    failed = true;
                    break;
                }
                Piece::Finished(t) => {
                    finished += 1;
                    completion_tokens += t;
                }
                // One count a prompt: its first choice's, as for a whole response.
                Piece::Cached { index, tokens } => {
                    if firsts.get(index).copied().unwrap_or(false) {
                        cached_tokens += tokens;
                    }
                }
            }
        }
        // Ends the other choices too when one failed.
        drop(choices);
        if !failed && finished == n && include_usage {
            let mut v = chunk_value(&meta, endpoint, json!([]));
            v["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
            yield Event::default().data(v.to_string());
        }
        yield Event::default().data("[DONE]");
    };
    let stream: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        Box::pin(futures::StreamExt::map(stream, Ok));
    Sse::new(stream).into_response()
}

//! OpenAI request bodies and their validation into one engine request.

use super::error::ApiError;
use crate::engine::harmony::{Message, ReasoningEffort, Renderer, Role};
use crate::engine::sampling::SamplingParams;
use crate::engine::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

/// Most alternatives per token a client may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// `prompt` of `/v1/completions`: text or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Many(Vec<Value>),
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

/// Fields shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    /// Kept as JSON: vLLM refuses a non-empty object without `stream: true`, which needs
    /// the raw value, and unknown keys inside it stay accepted.
    pub stream_options: Option<Value>,
    pub stop: Option<StopInput>,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    #[serde(default)]
    pub return_token_ids: bool,
    /// The penalties are kept as JSON so a wrong type gets a 400 naming the field.
    pub frequency_penalty: Option<Value>,
    pub presence_penalty: Option<Value>,
    pub repetition_penalty: Option<Value>,
    pub min_tokens: Option<i64>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    pub n: Option<i64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    #[serde(flatten)]
    pub common: Common,
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
}

/// Message content: a string or a list of text parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ContentInput {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// One chat message as sent by the client.
#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Option<ContentInput>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub common: Common,
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    pub reasoning_effort: Option<ReasoningEffort>,
    pub tools: Option<Vec<Value>>,
    pub response_format: Option<Value>,
}

/// What the server knows when it validates a request.
#[derive(Debug, Clone)]
pub struct Limits<'a> {
    pub served_model_name: &'a str,
    pub max_model_len: usize,
    pub vocab_size: usize,
}

/// A validated request, ready for the scheduler.
#[derive(Debug)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub return_tokens_as_token_ids: bool,
    /// Keep a matched stop string at the end of the text (vLLM extension).
    pub include_stop_str_in_output: bool,
    /// Report prompt and generated token ids next to the text (vLLM extension).
    pub return_token_ids: bool,
}

/// A number field of the body that may be absent or null; anything else is a 400 naming it.
fn number(param: &str, v: Option<&Value>) -> Result<Option<f32>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (x as f32).is_finite() => Ok(Some(x as f32)),
            _ => Err(ApiError::invalid(
                param,
                format!("{param} must be a finite number, got {n}"),
            )),
        },
        Some(other) => Err(ApiError::invalid(
            param,
            format!("{param} must be a number, got {other}"),
        )),
    }
}

/// `presence_penalty` or `frequency_penalty`: a number in [-2, 2] (vLLM's range), 0 if unset.
fn additive_penalty(param: &str, v: Option<&Value>) -> Result<f32, ApiError> {
    match number(param, v)? {
        None => Ok(0.0),
        Some(x) if (-2.0..=2.0).contains(&x) => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("{param} must be in [-2, 2], got {x}"),
        )),
    }
}

/// `repetition_penalty`: a number greater than 0 (vLLM's rule), 1 (off) if unset.
fn repetition_penalty(v: Option<&Value>) -> Result<f32, ApiError> {
    let param = "repetition_penalty";
    match number(param, v)? {
        None => Ok(1.0),
        Some(x) if x > 0.0 => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("{param} must be greater than 0 (1 turns it off), got {x}"),
        )),
    }
}

/// `stream_options` → whether usage is streamed. As in vLLM, a non-empty object needs
/// `stream: true`; an empty object or null is ignored.
fn stream_options(c: &Common) -> Result<bool, ApiError> {
    let param = "stream_options";
    let opts = match &c.stream_options {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ApiError::invalid(
                param,
                format!(
                    "{param} must be an object such as {{\"include_usage\": true}}, got {other}"
                ),
            ));
        }
    };
    if opts.is_empty() {
        return Ok(false);
    }
    if !c.stream {
        return Err(ApiError::invalid(
            param,
            "Stream options can only be defined when `stream=True`: drop stream_options or \
             set `stream: true`",
        ));
    }
    match opts.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(
            "stream_options.include_usage",
            format!("stream_options.include_usage must be true or false, got {other}"),
        )),
    }
}

fn check_model(c: &Common, lim: &Limits<'_>) -> Result<(), ApiError> {
    match &c.model {
        Some(m) if m != lim.served_model_name => {
            Err(ApiError::unknown_model(m, lim.served_model_name))
        }
        _ => Ok(()),
    }
}

/// Validate what both endpoints share; `default_max_tokens` applies when the client sets none.
fn prepare_common(
    c: &Common,
    prompt: Vec<u32>,
    max_tokens: Option<i64>,
    default_max_tokens: Option<usize>,
    logprobs: Option<usize>,
    lim: &Limits<'_>,
) -> Result<Prepared, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= lim.vocab_size) {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "token id {bad} is outside the model's vocabulary of {} tokens",
                lim.vocab_size
            ),
        ));
    }
    if prompt.len() >= lim.max_model_len {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "This model's maximum context length is {} tokens, but the prompt has {} tokens \
                 (at least one token must be left to generate)",
                lim.max_model_len,
                prompt.len()
            ),
        ));
    }
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::unsupported("n", "n other than 1"));
    }
    if c.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::unsupported("logit_bias", "logit_bias"));
    }
    let room = lim.max_model_len - prompt.len();
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}"),
            ));
        }
        Some(m) if m as usize > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "This model's maximum context length is {} tokens. However, you requested \
                     {} tokens ({} in the prompt, {m} for the completion)",
                    lim.max_model_len,
                    prompt.len() + m as usize,
                    prompt.len()
                ),
            ));
        }
        Some(m) => m as usize,
        None => default_max_tokens.unwrap_or(room).min(room),
    };
    let temperature = c.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be a number ≥ 0, got {temperature}"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 (off) or positive, got {k}"),
            ));
        }
    };
    let min_tokens = match c.min_tokens {
        None => 0,
        Some(m) if m < 0 || m as usize > max_tokens => {
            return Err(ApiError::invalid(
                "min_tokens",
                format!("min_tokens must be between 0 and max_tokens ({max_tokens}), got {m}"),
            ));
        }
        Some(m) => m as usize,
    };
    let presence_penalty = additive_penalty("presence_penalty", c.presence_penalty.as_ref())?;
    let frequency_penalty = additive_penalty("frequency_penalty", c.frequency_penalty.as_ref())?;
    let repetition_penalty = repetition_penalty(c.repetition_penalty.as_ref())?;
    let include_usage = stream_options(c)?;
    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopInput::One(s)) => vec![s.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    Ok(Prepared {
        prompt,
        sampling: SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: c.seed,
            max_tokens,
            min_tokens,
            ignore_eos: c.ignore_eos,
            logprobs,
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
        },
        stop,
        stream: c.stream,
        include_usage,
        return_tokens_as_token_ids: c.return_tokens_as_token_ids,
        include_stop_str_in_output: c.include_stop_str_in_output,
        return_token_ids: c.return_token_ids,
    })
}

fn logprob_count(param: &str, n: Option<i64>) -> Result<Option<usize>, ApiError> {
    match n {
        None => Ok(None),
        Some(n) if (0..=MAX_LOGPROBS as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid(
            param,
            format!("{param} must be between 0 and {MAX_LOGPROBS}, got {n}"),
        )),
    }
}

impl CompletionRequest {
    /// Validate and tokenize. Text prompts may contain harmony special tokens (as with the
    /// HF tokenizer), so clients can send a pre-rendered conversation.
    pub fn prepare(&self, tok: &Tokenizer, lim: &Limits<'_>) -> Result<Prepared, ApiError> {
        check_model(&self.common, lim)?;
        if self.echo {
            return Err(ApiError::unsupported("echo", "echo"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::unsupported("best_of", "best_of other than 1"));
        }
        if self.suffix.is_some() {
            return Err(ApiError::unsupported("suffix", "suffix"));
        }
        let prompt = match &self.prompt {
            PromptInput::Text(s) => tok
                .encode_with_specials(s)
                .map_err(|e| ApiError::invalid("prompt", format!("{e:#}")))?,
            PromptInput::Tokens(t) => t.clone(),
            PromptInput::Many(_) => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "a list of prompts (send one string or one list of token ids)",
                ));
            }
        };
        let logprobs = logprob_count("logprobs", self.logprobs)?;
        // OpenAI's default for completions is 16 tokens.
        prepare_common(
            &self.common,
            prompt,
            self.common.max_tokens,
            Some(16),
            logprobs,
            lim,
        )
    }
}

impl ChatRequest {
    /// Validate and render the conversation in harmony.
    pub fn prepare(&self, renderer: &Renderer, lim: &Limits<'_>) -> Result<Prepared, ApiError> {
        check_model(&self.common, lim)?;
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::unsupported("tools", "tool calling"));
        }
        if let Some(f) = &self.response_format
            && f.get("type").and_then(Value::as_str) != Some("text")
        {
            return Err(ApiError::unsupported(
                "response_format",
                "structured output",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" => Role::System,
                "developer" => Role::Developer,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        format!(
                            "role `{other}` is not supported (use system, developer, user or assistant)"
                        ),
                    ));
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(ContentInput::Text(s)) => s.clone(),
                Some(ContentInput::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::unsupported(
                                    &format!("messages[{i}].content"),
                                    &format!("content part of type `{kind}`"),
                                ));
                            }
                        }
                    }
                    s
                }
            };
            messages.push(Message { role, content });
        }
        let prompt = renderer.render_chat(&messages, self.reasoning_effort.unwrap_or_default());
        let logprobs = if self.logprobs {
            Some(logprob_count("top_logprobs", self.top_logprobs)?.unwrap_or(0))
        } else if self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs `logprobs: true`",
            ));
        } else {
            None
        };
        let max_tokens = self.max_completion_tokens.or(self.common.max_tokens);
        prepare_common(&self.common, prompt, max_tokens, None, logprobs, lim)
    }
}

/// Parse a JSON body into `T`, turning serde's message into a 400 that names the problem.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("invalid request body: {e}")))
}

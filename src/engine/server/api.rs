//! OpenAI request bodies and their validation into one engine request.

use super::error::ApiError;
use crate::engine::harmony::json::Json;
use crate::engine::harmony::{
    Chat, Function, Message, Prefill, ReasoningEffort, Renderer, Role, ToolCall,
};
use crate::engine::sampling::SamplingParams;
use crate::engine::structured::CallSchema;
use crate::engine::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

/// Most alternatives per token a client may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// Most choices (`n`) one request may ask for. Each choice is its own sequence with a KV
/// slot of its own (with prefix caching on the CPU backend, the later ones copy the first
/// one's prompt KV instead of prefilling it); vLLM's limit (`VLLM_MAX_N_SEQUENCES`) is 16384.
pub const MAX_N: usize = 128;

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
    /// Kept as JSON so a wrong type gets a 400 naming the field.
    pub min_p: Option<Value>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    /// Kept as JSON: vLLM refuses a non-empty object without `stream: true`, which needs
    /// the raw value, and unknown keys inside it stay accepted.
    pub stream_options: Option<Value>,
    pub stop: Option<StopInput>,
    /// Kept as JSON so a wrong type gets a 400 naming the field.
    pub stop_token_ids: Option<Value>,
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
    /// Kept as JSON so a wrong type gets a 400 naming the field.
    pub n: Option<Value>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// OpenAI's end-user id: accepted and not used (as in vLLM), so it is not reported as
    /// an unknown field.
    pub user: Option<Value>,
    /// Structured output, OpenAI's way (`json_object`, `json_schema`).
    pub response_format: Option<Value>,
    /// vLLM's structured outputs: `{"json": SCHEMA}`, `{"json_object": true}`,
    /// `{"regex": PATTERN}` or `{"choice": [STRING, …]}`.
    pub structured_outputs: Option<Value>,
    /// vLLM's older name for `structured_outputs.json`.
    pub guided_json: Option<Value>,
    /// vLLM's older name for `structured_outputs.regex`.
    pub guided_regex: Option<Value>,
    /// vLLM's older name for `structured_outputs.choice`.
    pub guided_choice: Option<Value>,
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
    /// Every field the server does not know (accepted, as vLLM accepts them, and logged).
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, Value>,
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
    /// An assistant's earlier calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// A tool message: the function's name (used when `tool_call_id` matches no call).
    pub name: Option<String>,
    /// An assistant's reasoning, under the names vLLM and chat templates read.
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    pub thinking: Option<String>,
}

/// One tool call of an assistant message.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

/// The function part of a tool call; `arguments` is JSON text (OpenAI) or an object.
#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    pub arguments: Option<Json>,
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
    /// Kept in the client's key order: the tool namespace in the prompt follows it.
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    /// Every field the server does not know (accepted, as vLLM accepts them, and logged).
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, Value>,
}

/// What the server knows when it validates a request.
#[derive(Debug, Clone)]
pub struct Limits<'a> {
    pub served_model_name: &'a str,
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// The `Current date:` written into harmony prompts.
    pub today: chrono::NaiveDate,
}

/// A validated request, ready for the scheduler.
#[derive(Debug)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// How many choices to generate (`n`); each is its own sequence in the scheduler.
    pub n: usize,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Usage in every streamed chunk (`stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// Completions with `echo`: the prompt's text, written before each choice's text.
    pub echo: Option<String>,
    pub return_tokens_as_token_ids: bool,
    /// Keep a matched stop string at the end of the text (vLLM extension).
    pub include_stop_str_in_output: bool,
    /// Report prompt and generated token ids next to the text (vLLM extension).
    pub return_token_ids: bool,
    /// Parse tool calls out of the answer (chat with tools, `tool_choice` not `none`).
    pub tools: bool,
    /// The start of the answer written into the prompt (its last tokens), parsed as output.
    pub prefill: Vec<u32>,
    /// What the answer is constrained to, if anything. The server compiles it into
    /// `sampling.grammar`.
    pub constrained: Option<Constrained>,
}

/// A constraint on the answer, before the server compiles it (see docs/api.md).
#[derive(Debug, Clone, PartialEq)]
pub enum Constrained {
    /// Structured output: the final answer takes `shape`; `param` is the field that asked
    /// for it (`response_format`, `structured_outputs`, `guided_json`, `guided_regex` or
    /// `guided_choice`).
    Answer {
        param: &'static str,
        shape: AnswerShape,
    },
    /// `tool_choice` names a function: its arguments follow `schema`, the `parameters` of
    /// `tools[tool]`.
    Arguments { tool: usize, schema: Value },
    /// `tool_choice: "required"`: a call of one of these functions (in the order of `tools`),
    /// its arguments following that function's schema.
    AnyCall(Vec<CallSchema>),
    /// `tool_choice: "auto"` with functions marked `strict: true`: the answer is free, but a
    /// call of one of them has arguments that follow its schema. Each with its index in
    /// `tools`.
    StrictCalls(Vec<(usize, CallSchema)>),
}

/// What a structured answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerShape {
    /// JSON following a schema (`response_format`, `structured_outputs.json` or
    /// `.json_object`, `guided_json`).
    Schema(Value),
    /// Text matching a regular expression as a whole (`structured_outputs.regex`,
    /// `guided_regex`; `structured_outputs.choice` and `guided_choice` as the alternation of
    /// their strings, each matched literally).
    Regex(String),
}

/// The regular expression of a `choice` field: exactly one of its strings. `param` names the
/// field for a 400.
fn choice_regex(param: &str, v: &Value) -> Result<String, ApiError> {
    let bad = || {
        ApiError::invalid(
            param,
            format!("{param} must be a non-empty list of strings, got {v}"),
        )
    };
    let list = v.as_array().filter(|l| !l.is_empty()).ok_or_else(bad)?;
    let words = list
        .iter()
        .map(|w| w.as_str().map(regex::escape).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(format!("(?:{})", words.join("|")))
}

/// The pattern of a `regex` field; `param` names the field for a 400.
fn regex_field(param: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str().map(str::to_string).ok_or_else(|| {
        ApiError::invalid(
            param,
            format!("{param} must be a regular expression as a string, got {v}"),
        )
    })
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

/// `logit_bias`: token id (a string key, as JSON objects have) → a number in [-100, 100].
fn logit_bias(
    m: Option<&serde_json::Map<String, Value>>,
    vocab_size: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let param = "logit_bias";
    let mut out = Vec::new();
    for (k, v) in m.into_iter().flatten() {
        let id = match k.trim().parse::<u32>() {
            Ok(id) if (id as usize) < vocab_size => id,
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "logit_bias keys must be token ids from 0 to {}, got {k:?}",
                        vocab_size.saturating_sub(1)
                    ),
                ));
            }
        };
        let bias = match v.as_f64() {
            Some(b) if (-100.0..=100.0).contains(&b) => b as f32,
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!("logit_bias[{k:?}] must be a number from -100 to 100, got {v}"),
                ));
            }
        };
        out.push((id, bias));
    }
    Ok(out)
}

/// `stop_token_ids` (vLLM's): token ids of the vocabulary that end generation; none if unset.
fn stop_token_ids(v: Option<&Value>, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    let param = "stop_token_ids";
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ApiError::invalid(
                param,
                format!("stop_token_ids must be a list of token ids, got {other}"),
            ));
        }
    };
    list.iter()
        .map(|x| match x.as_u64() {
            Some(id) if id < vocab_size as u64 => Ok(id as u32),
            _ => Err(ApiError::invalid(
                param,
                format!(
                    "stop_token_ids must hold token ids from 0 to {}, got {x}",
                    vocab_size.saturating_sub(1)
                ),
            )),
        })
        .collect()
}

/// What `stream_options` asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct StreamOptions {
    include_usage: bool,
    continuous_usage: bool,
}

/// The keys of `stream_options` the server reads; others are reported as unknown fields.
const STREAM_OPTION_KEYS: [&str; 2] = ["include_usage", "continuous_usage_stats"];

/// `stream_options`. As in vLLM, a non-empty object needs `stream: true` (an empty object
/// or null is ignored), and usage in every chunk needs `include_usage` too.
fn stream_options(c: &Common) -> Result<StreamOptions, ApiError> {
    let param = "stream_options";
    let opts = match &c.stream_options {
        None | Some(Value::Null) => return Ok(StreamOptions::default()),
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
        return Ok(StreamOptions::default());
    }
    if !c.stream {
        return Err(ApiError::invalid(
            param,
            "Stream options can only be defined when `stream=True`: drop stream_options or \
             set `stream: true`",
        ));
    }
    let flag = |key: &str| match opts.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(
            &format!("{param}.{key}"),
            format!("{param}.{key} must be true or false, got {other}"),
        )),
    };
    let include_usage = flag(STREAM_OPTION_KEYS[0])?;
    let continuous = flag(STREAM_OPTION_KEYS[1])?;
    Ok(StreamOptions {
        include_usage,
        continuous_usage: include_usage && continuous,
    })
}

/// `n`: how many choices, 1 if unset. As in vLLM, more than one needs sampling: greedy
/// decoding would give every choice the same text.
fn choices(v: Option<&Value>, temperature: f32) -> Result<usize, ApiError> {
    let param = "n";
    let whole = |x: &serde_json::Number| {
        x.as_i64().or_else(|| {
            x.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map(|f| f as i64)
        })
    };
    let n = match v {
        None | Some(Value::Null) => return Ok(1),
        Some(v) => match v.as_number().and_then(whole) {
            Some(n) => n,
            None => {
                return Err(ApiError::invalid(
                    param,
                    format!("n must be a whole number from 1 to {MAX_N}, got {v}"),
                ));
            }
        },
    };
    if n < 1 {
        return Err(ApiError::invalid(
            param,
            format!("n must be at least 1, got {n}"),
        ));
    }
    if n as u64 > MAX_N as u64 {
        return Err(ApiError::invalid(
            param,
            format!(
                "n must be at most {MAX_N}, got {n}: each choice is a sequence of its own; \
                 send several requests for more"
            ),
        ));
    }
    if n > 1 && temperature <= 1e-5 {
        return Err(ApiError::invalid(
            param,
            format!(
                "n must be 1 when using greedy sampling, got {n}: every choice would be the \
                 same; set temperature above 0, or n to 1"
            ),
        ));
    }
    Ok(n as usize)
}

fn check_model(c: &Common, lim: &Limits<'_>) -> Result<(), ApiError> {
    check_model_name(c.model.as_deref(), lim)
}

/// A request's `model` (absent: any) against the served name: a 404 naming both otherwise.
pub fn check_model_name(asked: Option<&str>, lim: &Limits<'_>) -> Result<(), ApiError> {
    match asked {
        Some(m) if m != lim.served_model_name => {
            Err(ApiError::unknown_model(m, lim.served_model_name))
        }
        _ => Ok(()),
    }
}

/// Validate what both endpoints share; `default_max_tokens` applies when the client sets none.
/// With `echo` (completions), `max_tokens: 0` is allowed: the answer is the prompt alone.
fn prepare_common(
    c: &Common,
    prompt: Vec<u32>,
    max_tokens: Option<i64>,
    default_max_tokens: Option<usize>,
    logprobs: Option<usize>,
    echo: Option<String>,
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
    let logit_bias = logit_bias(c.logit_bias.as_ref(), lim.vocab_size)?;
    let stop_token_ids = stop_token_ids(c.stop_token_ids.as_ref(), lim.vocab_size)?;
    let room = lim.max_model_len - prompt.len();
    let max_tokens = match max_tokens {
        Some(0) if echo.is_some() => 0,
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
    let min_p = match number("min_p", c.min_p.as_ref())? {
        None => 0.0,
        Some(x) if (0.0..=1.0).contains(&x) => x,
        Some(x) => {
            return Err(ApiError::invalid(
                "min_p",
                format!("min_p must be in [0, 1], got {x}"),
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
    let n = choices(c.n.as_ref(), temperature)?;
    let stream_opts = stream_options(c)?;
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
            min_p,
            seed: c.seed,
            max_tokens,
            min_tokens,
            ignore_eos: c.ignore_eos,
            stop_token_ids,
            logprobs,
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            logit_bias,
            grammar: None,
            prompt_logprobs: false,
        },
        n,
        stop,
        stream: c.stream,
        include_usage: stream_opts.include_usage,
        continuous_usage: stream_opts.continuous_usage,
        echo,
        return_tokens_as_token_ids: c.return_tokens_as_token_ids,
        include_stop_str_in_output: c.include_stop_str_in_output,
        return_token_ids: c.return_token_ids,
        tools: false,
        prefill: Vec::new(),
        constrained: None,
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
    /// Validate and tokenize: one prepared prompt, or one per element of a list of prompts
    /// (each a string or a list of token ids), whose choices follow each other in the answer
    /// as vLLM numbers them (prompt i's choice j at index `i * n + j`). Text prompts may
    /// contain harmony special tokens (as with the HF tokenizer), so clients can send a
    /// pre-rendered conversation.
    pub fn prepare(&self, tok: &Tokenizer, lim: &Limits<'_>) -> Result<Vec<Prepared>, ApiError> {
        check_model(&self.common, lim)?;
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::unsupported("best_of", "best_of other than 1"));
        }
        if self.suffix.is_some() {
            return Err(ApiError::unsupported("suffix", "suffix"));
        }
        // One structured-output shape for every prompt of the request.
        let shape = answer_shape(&self.common)?;
        let encode = |s: &str, param: &str| {
            tok.encode_with_specials(s)
                .map_err(|e| ApiError::invalid(param, format!("{e:#}")))
        };
        match &self.prompt {
            PromptInput::Text(s) => Ok(vec![self.prepare_one(
                tok,
                lim,
                &shape,
                encode(s, "prompt")?,
                Some(s),
            )?]),
            PromptInput::Tokens(t) => {
                Ok(vec![self.prepare_one(tok, lim, &shape, t.clone(), None)?])
            }
            PromptInput::Many(list) => {
                if list.is_empty() {
                    return Err(ApiError::invalid(
                        "prompt",
                        "the list of prompts is empty: send at least one prompt",
                    ));
                }
                list.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let param = format!("prompt[{i}]");
                        let prepared = match v {
                            Value::String(s) => {
                                self.prepare_one(tok, lim, &shape, encode(s, &param)?, Some(s))
                            }
                            Value::Array(_) => {
                                let ids = serde_json::from_value::<Vec<u32>>(v.clone()).map_err(
                                    |_| {
                                        ApiError::invalid(
                                            &param,
                                            format!(
                                                "{param} must be a string or a list of token \
                                                 ids (whole numbers from 0 to {}), got {v}",
                                                u32::MAX
                                            ),
                                        )
                                    },
                                )?;
                                self.prepare_one(tok, lim, &shape, ids, None)
                            }
                            Value::Number(_) => Err(ApiError::invalid(
                                "prompt",
                                format!(
                                    "token ids must be whole numbers from 0 to {}, got {v}",
                                    u32::MAX
                                ),
                            )),
                            _ => Err(ApiError::invalid(
                                &param,
                                format!("{param} must be a string or a list of token ids, got {v}"),
                            )),
                        };
                        // A fault in one prompt names it.
                        prepared.map_err(|mut e| {
                            if e.param.as_deref() == Some("prompt") && !v.is_number() {
                                e.param = Some(param.clone());
                                e.message = format!("{param}: {}", e.message);
                            }
                            e
                        })
                    })
                    .collect()
            }
        }
    }

    /// One prompt of the request (`text`: as the client wrote it, for `echo`).
    fn prepare_one(
        &self,
        tok: &Tokenizer,
        lim: &Limits<'_>,
        shape: &Option<(&'static str, AnswerShape)>,
        prompt: Vec<u32>,
        text: Option<&String>,
    ) -> Result<Prepared, ApiError> {
        let logprobs = logprob_count("logprobs", self.logprobs)?;
        // With both, the prompt's tokens get their logprobs too (as in vLLM; what
        // log-likelihood evaluations send): the scheduler scores the prompt one token a step.
        let score = self.echo && logprobs.is_some();
        if score && self.common.stream {
            return Err(ApiError::unsupported(
                "echo",
                "echo together with logprobs on a stream (the prompt's logprobs come in a whole \
                 response; send stream: false)",
            ));
        }
        let echo = self.echo.then(|| match text {
            Some(s) => s.clone(),
            // Control tokens included: the echo shows the prompt as the model read it.
            None => tok.decode(&prompt, false),
        });
        // OpenAI's default for completions is 16 tokens.
        let mut p = prepare_common(
            &self.common,
            prompt,
            self.common.max_tokens,
            Some(16),
            logprobs,
            echo,
            lim,
        )?;
        if score && p.n > 1 {
            return Err(ApiError::unsupported(
                "echo",
                "echo together with logprobs and n above 1 (the prompt is scored once per \
                 request; send n: 1)",
            ));
        }
        p.sampling.prompt_logprobs = score;
        // Structured output: the completion takes the shape from its first token (no
        // channel to open, as a chat answer needs).
        p.constrained = shape
            .clone()
            .map(|(param, shape)| Constrained::Answer { param, shape });
        Ok(p)
    }
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// OpenAI's rule for function names, which also keeps the harmony header parseable.
fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn name_rule(param: &str, name: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!(
            "{param} must be 1 to 64 letters, digits, underscores or dashes, got {:?}",
            name
        ),
    )
}

/// `tools` → the functions offered.
fn functions(tools: &[Json]) -> Result<Vec<Function>, ApiError> {
    let mut out: Vec<Function> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Json::as_str) != Some("function") {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!("{at}.type must be \"function\" (the only tool type supported)"),
            ));
        }
        let Some(f) = t.get("function").filter(|f| f.as_object().is_some()) else {
            return Err(ApiError::invalid(
                &format!("{at}.function"),
                format!("{at}.function must be an object with name, description and parameters"),
            ));
        };
        let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
        if !valid_function_name(name) {
            return Err(name_rule(&format!("{at}.function.name"), name));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(ApiError::invalid(
                &format!("{at}.function.name"),
                format!("{at}.function.name `{name}` is listed twice; names must be unique"),
            ));
        }
        let description = match f.get("description") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{at}.function.description"),
                    format!("{at}.function.description must be a string"),
                ));
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Json::Null) => None,
            Some(p @ Json::Object(_)) => Some(p.clone()),
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{at}.function.parameters"),
                    format!("{at}.function.parameters must be a JSON schema object"),
                ));
            }
        };
        match f.get("strict") {
            None | Some(Json::Null) | Some(Json::Bool(_)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{at}.function.strict"),
                    format!("{at}.function.strict must be true or false"),
                ));
            }
        }
        out.push(Function {
            name: name.to_string(),
            description,
            parameters,
        });
    }
    Ok(out)
}

/// Whether `tools[i]` (checked by [`functions`]) sets `function.strict: true`.
fn is_strict(tool: &Json) -> bool {
    matches!(
        tool.get("function").and_then(|f| f.get("strict")),
        Some(Json::Bool(true))
    )
}

/// The schema a call's arguments follow: the function's `parameters`, or any JSON object
/// when it has none (the arguments of a call are always an object).
fn arguments_schema(f: &Function) -> Value {
    f.parameters
        .as_ref()
        .map_or_else(|| serde_json::json!({"type": "object"}), Json::to_value)
}

/// `tool_choice` (default `auto` with tools, `none` without, as in OpenAI's API).
fn tool_choice(v: Option<&Value>, functions: &[Function]) -> Result<ToolChoice, ApiError> {
    let param = "tool_choice";
    let choice = match v {
        None | Some(Value::Null) if functions.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {other:?}"
                    ),
                ));
            }
        },
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => ToolChoice::Named(n.to_string()),
                _ => {
                    return Err(ApiError::invalid(
                        param,
                        "a named tool_choice must be {\"type\": \"function\", \"function\": {\"name\": \"NAME\"}}",
                    ));
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                param,
                format!("tool_choice must be a string or an object, got {other}"),
            ));
        }
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Named(_) if functions.is_empty() => {
            Err(ApiError::invalid(
                param,
                "tool_choice `required` or a named function needs `tools`: send the functions the model may call",
            ))
        }
        ToolChoice::Named(n) if !functions.iter().any(|f| &f.name == n) => Err(ApiError::invalid(
            param,
            format!(
                "tool_choice names the function `{n}`, which is not in `tools` (offered: {})",
                functions
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        _ => Ok(choice),
    }
}

fn content_text(i: usize, content: &Option<ContentInput>) -> Result<String, ApiError> {
    Ok(match content {
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
    })
}

/// The client's messages as harmony messages: roles checked, tool results matched to the
/// calls they answer.
fn messages(input: &[ChatMessageIn]) -> Result<Vec<Message>, ApiError> {
    let mut out: Vec<Message> = Vec::with_capacity(input.len());
    // (id, name) of every tool call so far, and the name of the latest.
    let mut calls: Vec<(Option<String>, String)> = Vec::new();
    for (i, m) in input.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!(
                        "role `{other}` is not supported (use system, developer, user, assistant or tool)"
                    ),
                ));
            }
        };
        let mut msg = Message::text(role, content_text(i, &m.content)?);
        if role == Role::Assistant {
            msg.thinking = m
                .reasoning_content
                .clone()
                .or_else(|| m.reasoning.clone())
                .or_else(|| m.thinking.clone())
                .unwrap_or_default();
            for (j, c) in m.tool_calls.iter().flatten().enumerate() {
                let at = format!("messages[{i}].tool_calls[{j}].function");
                if !valid_function_name(&c.function.name) {
                    return Err(name_rule(&format!("{at}.name"), &c.function.name));
                }
                let arguments = match &c.function.arguments {
                    None | Some(Json::Null) => "{}".to_string(),
                    Some(Json::String(s)) => s.clone(),
                    Some(o @ Json::Object(_)) => o.to_python(),
                    Some(_) => {
                        return Err(ApiError::invalid(
                            &format!("{at}.arguments"),
                            format!("{at}.arguments must be a JSON string (or an object)"),
                        ));
                    }
                };
                calls.push((c.id.clone(), c.function.name.clone()));
                msg.tool_calls.push(ToolCall {
                    name: c.function.name.clone(),
                    arguments,
                });
            }
            if !msg.tool_calls.is_empty() && !msg.content.is_empty() && !msg.thinking.is_empty() {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content"),
                    "an assistant message with tool_calls may carry its reasoning in content or \
                     in reasoning_content, not both (the chat template refuses this too)",
                ));
            }
        }
        if role == Role::Tool {
            let by_id = m.tool_call_id.as_ref().and_then(|id| {
                calls
                    .iter()
                    .rev()
                    .find(|(cid, _)| cid.as_ref() == Some(id))
                    .map(|(_, n)| n.clone())
            });
            let Some(name) = by_id
                .or_else(|| m.name.clone())
                .or_else(|| calls.last().map(|(_, n)| n.clone()))
            else {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    "a `tool` message must follow an assistant message with tool_calls",
                ));
            };
            msg.tool_name = name;
        }
        out.push(msg);
    }
    Ok(out)
}

/// `response_format`: the JSON schema the answer must follow, or `None` for free text.
/// `json_object` is any JSON object (the schema `{"type": "object"}`, as vLLM makes it).
/// The schema itself is checked when it is compiled (see `StructuredOutput::compile`).
fn response_format(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let param = "response_format";
    let bad = |msg: String| Err(ApiError::invalid(param, msg));
    let f = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(other) => {
            return bad(format!(
                "response_format must be an object such as {{\"type\": \"json_object\"}}, got \
                 {other}"
            ));
        }
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(serde_json::json!({"type": "object"}))),
        Some("json_schema") => {
            let Some(js) = f.get("json_schema").and_then(Value::as_object) else {
                return bad(
                    "response_format of type json_schema needs `json_schema`: an object with \
                     `name`, `schema` and optionally `strict`"
                        .into(),
                );
            };
            match js.get("name") {
                Some(Value::String(n)) if !n.is_empty() => {}
                other => {
                    return bad(format!(
                        "response_format.json_schema.name must be a non-empty string, got {}",
                        other.map_or("nothing".into(), Value::to_string)
                    ));
                }
            }
            match js.get("strict") {
                None | Some(Value::Null) | Some(Value::Bool(_)) => {}
                Some(other) => {
                    return bad(format!(
                        "response_format.json_schema.strict must be true or false, got {other}"
                    ));
                }
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(s.clone())),
                other => bad(format!(
                    "response_format.json_schema.schema must be a JSON schema object, got {}",
                    other.map_or("nothing".into(), Value::to_string)
                )),
            }
        }
        _ => bad(format!(
            "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
            f.get("type").map_or("nothing".into(), Value::to_string)
        )),
    }
}

/// vLLM's own fields for structured output, as an alternative to `response_format`:
/// `structured_outputs.json` (a schema, as an object or as JSON text), `structured_outputs.
/// json_object: true`, `structured_outputs.regex`, `structured_outputs.choice`, and the older
/// `guided_json`, `guided_regex` and `guided_choice`. vLLM's other kinds (grammar, structural
/// tags) are refused. At most one of them may be set.
fn vllm_structured_outputs(r: &Common) -> Result<Option<(&'static str, AnswerShape)>, ApiError> {
    // A schema sent as JSON text, as vLLM accepts it.
    let schema = |param: &str, v: &Value| match v {
        Value::Object(_) => Ok(v.clone()),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(o @ Value::Object(_)) => Ok(o),
            _ => Err(ApiError::invalid(
                param,
                format!("{param} must be a JSON schema object (or its JSON text), got {v}"),
            )),
        },
        other => Err(ApiError::invalid(
            param,
            format!("{param} must be a JSON schema object (or its JSON text), got {other}"),
        )),
    };
    let from_structured = match &r.structured_outputs {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => {
            let mut found = None;
            for (k, v) in o {
                let param = format!("structured_outputs.{k}");
                let this = match (k.as_str(), v) {
                    (_, Value::Null) | ("json_object", Value::Bool(false)) => continue,
                    ("json", v) => AnswerShape::Schema(schema(&param, v)?),
                    ("json_object", Value::Bool(true)) => {
                        AnswerShape::Schema(serde_json::json!({"type": "object"}))
                    }
                    ("json_object", other) => {
                        return Err(ApiError::invalid(
                            &param,
                            format!("{param} must be true or false, got {other}"),
                        ));
                    }
                    ("regex", v) => AnswerShape::Regex(regex_field(&param, v)?),
                    ("choice", v) => AnswerShape::Regex(choice_regex(&param, v)?),
                    (other, _) => {
                        return Err(ApiError::unsupported(
                            &param,
                            &format!(
                                "structured output of kind `{other}` (only `json`, \
                                 `json_object`, `regex` and `choice` are)"
                            ),
                        ));
                    }
                };
                if found.replace(this).is_some() {
                    return Err(ApiError::invalid(
                        "structured_outputs",
                        "structured_outputs may set one of `json`, `json_object`, `regex` and \
                         `choice`, not several",
                    ));
                }
            }
            found.map(|f| ("structured_outputs", f))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "structured_outputs",
                format!(
                    "structured_outputs must be an object such as {{\"json\": {{…}}}}, got {other}"
                ),
            ));
        }
    };
    let set = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let legacy = [
        set(&r.guided_json)
            .map(|v| schema("guided_json", &v).map(|s| ("guided_json", AnswerShape::Schema(s)))),
        set(&r.guided_regex).map(|v| {
            regex_field("guided_regex", &v).map(|x| ("guided_regex", AnswerShape::Regex(x)))
        }),
        set(&r.guided_choice).map(|v| {
            choice_regex("guided_choice", &v).map(|x| ("guided_choice", AnswerShape::Regex(x)))
        }),
    ];
    let mut found = from_structured;
    for l in legacy.into_iter().flatten() {
        let (param, shape) = l?;
        if found.is_some() {
            return Err(ApiError::invalid(
                param,
                format!(
                    "{param} and {} both ask for a structured answer: send one",
                    found.map_or("", |f| f.0)
                ),
            ));
        }
        found = Some((param, shape));
    }
    Ok(found)
}

/// The shape a request's answer must take, from `response_format` or vLLM's fields (at most
/// one of them), with the field that asked for it.
fn answer_shape(c: &Common) -> Result<Option<(&'static str, AnswerShape)>, ApiError> {
    match (
        response_format(c.response_format.as_ref())?,
        vllm_structured_outputs(c)?,
    ) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "response_format",
            "response_format and vLLM's structured_outputs (or guided_json) both ask for a \
             schema: send one",
        )),
        (Some(s), None) => Ok(Some(("response_format", AnswerShape::Schema(s)))),
        (None, b) => Ok(b),
    }
}

impl ChatRequest {
    /// Validate and render the conversation in harmony.
    pub fn prepare(&self, renderer: &Renderer, lim: &Limits<'_>) -> Result<Prepared, ApiError> {
        check_model(&self.common, lim)?;
        let schema = answer_shape(&self.common)?;
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        let functions = functions(self.tools.as_deref().unwrap_or_default())?;
        let choice = tool_choice(self.tool_choice.as_ref(), &functions)?;
        match &self.parallel_tool_calls {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    "parallel_tool_calls",
                    format!("parallel_tool_calls must be true or false, got {other}"),
                ));
            }
        }
        let messages = messages(&self.messages)?;
        if schema.is_some() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(ApiError::invalid(
                "response_format",
                "response_format json_object or json_schema makes the answer a final message, \
                 and tool_choice `required` or a named function makes it a tool call: send one \
                 of the two",
            ));
        }
        // Structured output: the answer starts in the final channel and the schema
        // constrains it from the first generated token (see docs/api.md).
        let prefill = match &choice {
            ToolChoice::Required => Prefill::AnyCall,
            ToolChoice::Named(n) => Prefill::Call(n),
            ToolChoice::None | ToolChoice::Auto if schema.is_some() => Prefill::Final,
            ToolChoice::None | ToolChoice::Auto => Prefill::None,
        };
        let prompt = renderer.render_chat(&Chat {
            messages: &messages,
            tools: &functions,
            effort: self.reasoning_effort.unwrap_or_default(),
            date: lim.today,
            prefill,
        });
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
        let mut p = prepare_common(&self.common, prompt, max_tokens, None, logprobs, None, lim)?;
        // Calls are parsed only when functions were offered and not switched off.
        p.tools = choice != ToolChoice::None && !functions.is_empty();
        p.prefill = renderer.prefill_tokens(prefill);
        // A call forced by tool_choice follows its function's schema, as vLLM guides it; a
        // call the model chooses under `auto` does when its function is strict (docs/api.md).
        let tools = self.tools.as_deref().unwrap_or_default();
        let strict: Vec<(usize, CallSchema)> = functions
            .iter()
            .zip(tools)
            .enumerate()
            .filter(|(_, (_, t))| is_strict(t))
            .map(|(i, (f, _))| {
                let call = CallSchema {
                    name: f.name.clone(),
                    parameters: arguments_schema(f),
                };
                (i, call)
            })
            .collect();
        p.constrained = match &choice {
            ToolChoice::Named(n) => {
                functions
                    .iter()
                    .position(|f| &f.name == n)
                    .map(|tool| Constrained::Arguments {
                        tool,
                        schema: arguments_schema(&functions[tool]),
                    })
            }
            ToolChoice::Required => Some(Constrained::AnyCall(
                functions
                    .iter()
                    .map(|f| CallSchema {
                        name: f.name.clone(),
                        parameters: arguments_schema(f),
                    })
                    .collect(),
            )),
            // A structured answer is a final message: no call to constrain.
            ToolChoice::Auto if schema.is_none() && !strict.is_empty() => {
                Some(Constrained::StrictCalls(strict))
            }
            ToolChoice::None | ToolChoice::Auto => {
                schema.map(|(param, shape)| Constrained::Answer { param, shape })
            }
        };
        Ok(p)
    }
}

/// The names of the fields a request carried that the server does not know: top-level
/// fields, and keys of `stream_options` as `stream_options.KEY`.
fn unknown_fields(top: &serde_json::Map<String, Value>, c: &Common) -> Vec<String> {
    let mut out: Vec<String> = top.keys().cloned().collect();
    if let Some(Value::Object(o)) = &c.stream_options {
        out.extend(
            o.keys()
                .filter(|k| !STREAM_OPTION_KEYS.contains(&k.as_str()))
                .map(|k| format!("stream_options.{k}")),
        );
    }
    out
}

impl CompletionRequest {
    /// Fields of this request the server does not know (see [`unknown_fields`]).
    pub fn unknown_fields(&self) -> Vec<String> {
        unknown_fields(&self.unknown, &self.common)
    }
}

impl ChatRequest {
    /// Fields of this request the server does not know (see [`unknown_fields`]).
    pub fn unknown_fields(&self) -> Vec<String> {
        unknown_fields(&self.unknown, &self.common)
    }
}

/// Parse a JSON body into `T`, turning serde's message into a 400 that names the problem.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_the_ones_no_struct_reads() {
        let r: CompletionRequest = parse_body(
            br#"{"prompt": "x", "n": 2, "user": "u", "min_p": 0.1, "echo": true, "seed": 1,
                 "guided_choice": ["a"], "guided_grammar": "root ::= x",
                 "stream": true, "stream_options": {"include_usage": true, "extra": 1},
                 "logit_bias": {}, "bad_words": ["a"]}"#,
        )
        .unwrap();
        let mut got = r.unknown_fields();
        got.sort();
        assert_eq!(got, ["bad_words", "guided_grammar", "stream_options.extra"]);
        assert!(r.echo && r.common.stream && r.common.seed == Some(1));
        let r: ChatRequest = parse_body(
            br#"{"messages": [], "tools": [], "max_completion_tokens": 3, "store": true,
                 "stream_options": {"continuous_usage_stats": true}}"#,
        )
        .unwrap();
        assert_eq!(r.unknown_fields(), ["store"]);
        assert_eq!(r.max_completion_tokens, Some(3));
    }
}

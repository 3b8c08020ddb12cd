//! The OpenAI-compatible HTTP server (axum): `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` (streaming and not), `/health` and `/metrics`.

pub mod api;
pub mod error;
pub mod generate;
pub mod metrics;

use crate::engine::backend::ModelBackend;
use crate::engine::harmony::{HarmonyTokens, Renderer};
use crate::engine::scheduler::{
    self, FinishReason, GenEvent, SchedulerConfig, SchedulerHandle, SubmitError,
};
use crate::engine::structured::{CallTokens, Grammar, StructuredOutput};
use crate::engine::tokenizer::Tokenizer;
use api::{AnswerShape, ChatRequest, CompletionRequest, Constrained, Limits, parse_body};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use error::ApiError;
use generate::{Endpoint, ResponseMeta};
use metrics::Metrics;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The name clients must use in `model` and that `/v1/models` lists.
    pub served_model_name: String,
    /// Most positions per sequence (prompt + generated).
    pub max_model_len: usize,
    /// Most sequences decoded together.
    pub max_num_seqs: usize,
    /// Most tokens fed to the backend per step (long prompts are prefilled in chunks).
    pub max_num_batched_tokens: usize,
    /// KV-cache positions the backend holds in all (denominator of `kv_cache_usage_perc`).
    pub kv_cache_tokens: usize,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body accepted; a larger one gets a 413 JSON error.
    pub max_request_bytes: usize,
    /// Where the weights came from; `/v1/models` says it, so a client can tell meaningless
    /// text of synthetic weights from a broken kernel.
    pub weights: WeightsOrigin,
    /// Write the step timeline here (`--step-log`), one JSON line per engine step.
    pub step_log: Option<std::path::PathBuf>,
    /// Most prompt tokens a request feeds per step (`--long-prefill-token-threshold`; 0: the
    /// step's whole budget).
    pub long_prefill_token_threshold: usize,
    /// Most requests that may wait beyond a full batch of `max_num_seqs`
    /// (`--max-waiting-queue-length`); one more gets a 503 at once. 0 = no limit.
    pub max_waiting_queue_length: usize,
    /// Prefix caching (`--enable-prefix-caching`): reuse the KV of a free slot holding the
    /// prompt's longest prefix; counted in `/metrics` and in `usage.prompt_tokens_details`.
    pub enable_prefix_caching: bool,
}

/// Where the served weights came from (`weights` in each `/v1/models` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsOrigin {
    /// A checkpoint on disk: the output is the model's.
    Checkpoint,
    /// Deterministic pseudo-random weights: speeds are real, generated text is meaningless.
    Synthetic,
}

impl WeightsOrigin {
    /// The value in `/v1/models` (`checkpoint` or `synthetic`).
    pub fn as_str(self) -> &'static str {
        match self {
            WeightsOrigin::Checkpoint => "checkpoint",
            WeightsOrigin::Synthetic => "synthetic",
        }
    }
}

/// Default `--max-request-bytes`: axum's own default body limit (2 MiB), which the server
/// had before the limit could be set.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// Shared state of all handlers.
#[derive(Debug)]
struct AppState {
    opts: ServerOptions,
    backend_name: String,
    vocab_size: usize,
    scheduler: SchedulerHandle,
    metrics: Arc<Metrics>,
    tok: Tokenizer,
    renderer: Renderer,
    created: u64,
    /// Unknown request field names already reported (each is said once).
    warned_fields: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The tokens that may end a structured answer: the stop set without `<|call|>`.
    structured_ends: Vec<u32>,
    /// The harmony tokens of a constrained tool call (header and end).
    call_tokens: CallTokens,
    /// Built on the first request with a constraint (a `response_format` schema, or a call
    /// forced by `tool_choice`): it indexes the whole vocabulary, which plain servers need
    /// not pay for.
    structured: std::sync::OnceLock<Result<StructuredOutput, String>>,
}

/// A server ready to be bound: the engine thread runs, the routes are built.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Server {
    /// Start the engine thread over `backend`. Stop tokens come from the model config's
    /// eos plus the harmony stop set.
    pub fn new(backend: Box<dyn ModelBackend>, opts: ServerOptions) -> anyhow::Result<Self> {
        anyhow::ensure!(
            opts.max_model_len >= 2,
            "--max-model-len must be at least 2"
        );
        anyhow::ensure!(opts.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
        let tok = Tokenizer::o200k_harmony();
        let renderer = Renderer::new(tok)?;
        let cfg = backend.config();
        let harmony = HarmonyTokens::new(&tok)?;
        let stop_tokens = harmony.stop_set(cfg.eos_token_id);
        let structured_ends = stop_tokens
            .iter()
            .copied()
            .filter(|&t| t != harmony.call)
            .collect();
        let call_tokens = CallTokens {
            constrain: harmony.constrain,
            message: harmony.message,
            call: harmony.call,
        };
        let vocab_size = cfg.vocab_size;
        let backend_name = backend.name();
        let metrics = Arc::new(
            Metrics::new(
                &opts.served_model_name,
                opts.max_model_len,
                opts.kv_cache_tokens,
            )
            .with_prefix_caching(opts.enable_prefix_caching),
        );
        let scheduler = scheduler::spawn(
            backend,
            SchedulerConfig {
                max_num_seqs: opts.max_num_seqs,
                max_model_len: opts.max_model_len,
                max_num_batched_tokens: opts.max_num_batched_tokens,
                kv_cache_tokens: opts.kv_cache_tokens,
                stop_tokens,
                step_log: opts.step_log.clone(),
                long_prefill_token_threshold: opts.long_prefill_token_threshold,
                max_waiting_queue_length: opts.max_waiting_queue_length,
                enable_prefix_caching: opts.enable_prefix_caching,
            },
            metrics.clone(),
        )?;
        Ok(Server {
            state: Arc::new(AppState {
                opts,
                backend_name,
                vocab_size,
                scheduler,
                metrics,
                tok,
                renderer,
                created: unix_now(),
                warned_fields: Default::default(),
                structured_ends,
                call_tokens,
                structured: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The axum routes.
    pub fn router(&self) -> Router {
        let v1 = Router::new()
            .route("/v1/models", get(models))
            .route("/v1/models/{model}", get(model))
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat_completions))
            .route_layer(middleware::from_fn_with_state(self.state.clone(), auth))
            .layer(DefaultBodyLimit::max(self.state.opts.max_request_bytes));
        // vLLM's utility routes, outside /v1 and so, as there, without the API key.
        let util = Router::new()
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .layer(DefaultBodyLimit::max(self.state.opts.max_request_bytes));
        Router::new()
            .route("/health", get(health))
            .route("/metrics", get(metrics_text))
            .route("/version", get(version))
            .merge(util)
            .merge(v1)
            .fallback(no_route)
            .with_state(self.state.clone())
    }

    /// Serve on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr().ok();
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| anyhow::anyhow!("HTTP server on {addr:?} failed: {e}"))
    }
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.opts.api_key {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| given.trim() == key);
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// 200 while the engine thread runs; 503 once it has died (a backend panic), so the
/// launcher's readiness probe and a supervisor see it.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.scheduler.is_alive() {
        "".into_response()
    } else {
        let mut e = ApiError::internal("the engine thread has stopped; restart the server");
        e.status = axum::http::StatusCode::SERVICE_UNAVAILABLE;
        e.into_response()
    }
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

/// The one model this server serves, as `/v1/models` lists it.
fn model_card(st: &AppState) -> serde_json::Value {
    let name = &st.opts.served_model_name;
    json!({
        "id": name,
        "object": "model",
        "created": st.created,
        "owned_by": "mxtune",
        "root": name,
        "max_model_len": st.opts.max_model_len,
        "backend": st.backend_name,
        "weights": st.opts.weights.as_str(),
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&st)]})).into_response()
}

/// `GET /v1/models/{model}` (the OpenAI client's `models.retrieve`): the model's card, or a
/// 404 naming the one this server serves.
async fn model(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if name == st.opts.served_model_name {
        axum::Json(model_card(&st)).into_response()
    } else {
        ApiError::unknown_model(&name, &st.opts.served_model_name).into_response()
    }
}

/// `GET /version`, as vLLM answers it.
async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `POST /tokenize` (vLLM's): a completions prompt (`prompt`, text with harmony control
/// tokens read as such) or a chat (`messages` and the chat fields, rendered as
/// `/v1/chat/completions` renders them, the assistant's start included) to token ids.
async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tokens = read_body(&st, body).and_then(|b| {
        let v: serde_json::Value = parse_body(&b)?;
        if v.get("messages").is_some() {
            // Its own fields (add_generation_prompt, return_token_strs, …) are not the
            // chat's: no unknown-field warning here.
            let r = parse_body::<ChatRequest>(&b)?;
            Ok(r.prepare(&st.renderer, &st.limits())?.prompt)
        } else {
            api::check_model_name(v.get("model").and_then(|m| m.as_str()), &st.limits())?;
            match v.get("prompt") {
                Some(serde_json::Value::String(text)) => st
                    .tok
                    .encode_with_specials(text)
                    .map_err(|e| ApiError::invalid("prompt", format!("{e:#}"))),
                Some(other) => Err(ApiError::invalid(
                    "prompt",
                    format!("prompt must be a string, got {other}"),
                )),
                None => Err(ApiError::invalid(
                    "prompt",
                    "send `prompt` (a string) or `messages` (a chat)",
                )),
            }
        }
    });
    match tokens {
        Ok(tokens) => axum::Json(json!({
            "count": tokens.len(),
            "max_model_len": st.opts.max_model_len,
            "tokens": tokens,
            "token_strs": null,
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /detokenize` (vLLM's): `tokens` back to text, control tokens written out.
async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let text = read_body(&st, body).and_then(|b| {
        let v: serde_json::Value = parse_body(&b)?;
        let bad = |got: &serde_json::Value| {
            ApiError::invalid(
                "tokens",
                format!(
                    "tokens must be a list of token ids below the vocabulary size ({}), got {got}",
                    st.vocab_size
                ),
            )
        };
        let Some(list) = v.get("tokens") else {
            return Err(ApiError::invalid(
                "tokens",
                "send `tokens`: a list of token ids",
            ));
        };
        let ids: Vec<u32> = serde_json::from_value(list.clone()).map_err(|_| bad(list))?;
        if let Some(t) = ids.iter().find(|&&t| t as usize >= st.vocab_size) {
            return Err(bad(&json!(t)));
        }
        Ok(st.tok.decode(&ids, false))
    });
    match text {
        Ok(prompt) => axum::Json(json!({"prompt": prompt})).into_response(),
        Err(e) => e.into_response(),
    }
}

impl AppState {
    fn limits(&self) -> Limits<'_> {
        Limits {
            served_model_name: &self.opts.served_model_name,
            max_model_len: self.opts.max_model_len,
            vocab_size: self.vocab_size,
            today: chrono::Utc::now().date_naive(),
        }
    }

    fn meta(&self, prefix: &str) -> ResponseMeta {
        ResponseMeta {
            id: format!("{prefix}-{}", ulid::Ulid::generate()),
            created: unix_now(),
            model: self.opts.served_model_name.clone(),
        }
    }
}

impl AppState {
    /// Compile what a request's answer is constrained to; a schema llguidance refuses is a
    /// 400 naming the field that sent it. Runs on a blocking thread (the first call builds
    /// the vocabulary index, and a large schema takes a while to compile).
    fn compile_constraint(&self, constrained: &Constrained) -> Result<Grammar, ApiError> {
        let structured = self
            .structured
            .get_or_init(|| {
                StructuredOutput::new(
                    self.tok,
                    self.vocab_size,
                    &self.structured_ends,
                    self.call_tokens,
                )
                .map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| ApiError::internal(format!("structured output is unavailable: {e}")))?;
        let parameters_refused = |tool: usize, e: String| {
            let param = format!("tools[{tool}].function.parameters");
            ApiError::invalid(
                &param,
                format!(
                    "{param} cannot be enforced on the arguments of the call tool_choice asks \
                     for: {e}"
                ),
            )
        };
        match constrained {
            Constrained::Answer {
                param,
                shape: AnswerShape::Regex(rx),
            } => structured.compile_regex(rx).map_err(|e| {
                ApiError::invalid(param, format!("{param}'s pattern cannot be enforced: {e}"))
            }),
            Constrained::Answer {
                param,
                shape: AnswerShape::Schema(schema),
            } => structured.compile(schema).map_err(|e| {
                ApiError::invalid(param, format!("{param}'s schema cannot be enforced: {e}"))
            }),
            Constrained::Arguments { tool, schema } => structured
                .compile_arguments(schema)
                .map_err(|e| parameters_refused(*tool, e)),
            Constrained::AnyCall(functions) => {
                structured
                    .compile_any_call(functions)
                    .map_err(|(tool, e)| match tool {
                        Some(tool) => parameters_refused(tool, e),
                        None => ApiError::internal(format!(
                            "the grammar of a required tool call did not compile: {e}"
                        )),
                    })
            }
            Constrained::StrictCalls(strict) => {
                let functions: Vec<_> = strict.iter().map(|(_, f)| f.clone()).collect();
                structured
                    .compile_strict_calls(&functions)
                    .map_err(|(k, e)| {
                        let param = format!("tools[{}].function.parameters", strict[k].0);
                        ApiError::invalid(
                            &param,
                            format!(
                                "{param} cannot be enforced on the arguments of a call of this \
                                 function, which sets `strict: true`: {e}"
                            ),
                        )
                    })
            }
        }
    }
}

/// The receiver of a choice that generates nothing (`echo` with `max_tokens: 0`): it ends
/// at once, at its length limit.
fn nothing_to_generate() -> UnboundedReceiver<GenEvent> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // The receiver is alive here, so the send cannot fail.
    let _ = tx.send(GenEvent::Done(FinishReason::Length));
    rx
}

/// Generate the choices of every prompt of a request (`prompts`: one, or a completions
/// request's list) and answer them together, prompt after prompt, each prompt's `n` choices
/// in order.
async fn run(
    st: &AppState,
    prompts: Vec<api::Prepared>,
    endpoint: Endpoint,
    prefix: &str,
) -> Response {
    let mut rxs = Vec::with_capacity(prompts.iter().map(|p| p.n).sum());
    for prepared in &prompts {
        match submit(st, prepared) {
            Ok(mut r) => rxs.append(&mut r),
            // Dropping the receivers of the prompts queued before withdraws them from the
            // scheduler: a request is answered whole or not at all.
            Err(e) => return e.into_response(),
        }
    }
    let meta = st.meta(prefix);
    let stream = prompts.first().is_some_and(|p| p.stream);
    if stream {
        generate::respond_stream(rxs, st.tok, endpoint, &prompts, meta)
    } else {
        generate::respond_full(rxs, st.tok, endpoint, &prompts, meta).await
    }
}

/// Queue one prompt's choices. Each choice is its own sequence: the backend cannot share the
/// prompt's KV between running sequences (prefix caching reuses free slots only), so each
/// prefills the prompt. With a seed, choice i samples with seed + i, as vLLM seeds its n
/// child requests.
fn submit(
    st: &AppState,
    prepared: &api::Prepared,
) -> Result<Vec<UnboundedReceiver<GenEvent>>, ApiError> {
    // Nothing to generate and no prompt to score: no sequence at all.
    if prepared.sampling.max_tokens == 0 && !prepared.sampling.prompt_logprobs {
        return Ok((0..prepared.n).map(|_| nothing_to_generate()).collect());
    }
    let samplings = (0..prepared.n)
        .map(|i| {
            let mut sampling = prepared.sampling.clone();
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
            sampling
        })
        .collect();
    // The choices take their places under --max-waiting-queue-length together: all queued,
    // or the request is refused with nothing queued.
    st.scheduler
        .submit_all(&prepared.prompt, samplings)
        .map_err(|e| match e {
            e @ SubmitError::QueueFull { .. } => ApiError::queue_full(e.to_string()),
            e => ApiError::internal(e.to_string()),
        })
}

/// Most distinct unknown field names remembered for the warning; past it, new names are
/// no longer reported, so clients sending random names cannot grow the set without end.
const MAX_WARNED_FIELDS: usize = 256;

impl AppState {
    /// Say once per field name, on stderr, that a request carried a field this server
    /// does not know and ignored (vLLM accepts such fields too, and logs them per request).
    fn warn_unknown_fields(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        // A poisoned lock only means another thread panicked while holding it; the set of
        // names is still fine to use.
        let mut warned = self
            .warned_fields
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for name in names {
            if warned.len() >= MAX_WARNED_FIELDS || warned.contains(&name) {
                continue;
            }
            crate::errln!(
                "mxtune serve: warning: a request carried the field `{name}`, which this server \
                 does not know; it was ignored (said once per field name, see docs/api.md)"
            );
            warned.insert(name);
            if warned.len() == MAX_WARNED_FIELDS {
                crate::errln!(
                    "mxtune serve: warning: {MAX_WARNED_FIELDS} unknown request fields reported; \
                     further ones are ignored without a word"
                );
            }
        }
    }
}

/// The body, or the OpenAI-style error for one that could not be read: axum answers a body
/// over the limit with plain text, which OpenAI clients cannot parse.
fn read_body(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.opts.max_request_bytes)
        } else {
            ApiError::bad_body(format!(
                "could not read the request body: {}",
                e.body_text()
            ))
        }
    })
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut prepared = match read_body(&st, body)
        .and_then(|b| parse_body::<CompletionRequest>(&b))
        .and_then(|r| {
            st.warn_unknown_fields(r.unknown_fields());
            r.prepare(&st.tok, &st.limits())
        }) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = constrain(&st, &mut prepared).await {
        return e.into_response();
    }
    run(&st, prepared, Endpoint::Completions, "cmpl").await
}

/// Compile the constraint the prompts' answers share (a request's prompts all carry the
/// same one), on a blocking thread, and hand each prompt the grammar.
async fn constrain(st: &Arc<AppState>, prompts: &mut [api::Prepared]) -> Result<(), ApiError> {
    let Some(constrained) = prompts.first().and_then(|p| p.constrained.clone()) else {
        return Ok(());
    };
    let state = st.clone();
    let grammar =
        match tokio::task::spawn_blocking(move || state.compile_constraint(&constrained)).await {
            Ok(Ok(g)) => Arc::new(g),
            Ok(Err(e)) => return Err(e),
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "compiling the schema failed: {e}"
                )));
            }
        };
    for p in prompts {
        p.sampling.grammar = Some(grammar.clone());
    }
    Ok(())
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = match read_body(&st, body)
        .and_then(|b| parse_body::<ChatRequest>(&b))
        .and_then(|r| {
            st.warn_unknown_fields(r.unknown_fields());
            r.prepare(&st.renderer, &st.limits())
        }) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut prompts = vec![prepared];
    if let Err(e) = constrain(&st, &mut prompts).await {
        return e.into_response();
    }
    run(&st, prompts, Endpoint::Chat, "chatcmpl").await
}

//! Continuous batching: one thread owns the backend and, every step, builds a batch of
//! prefill chunks and decode tokens from all live requests. Requests arrive and results
//! leave through channels, so the async server never blocks on the model.

use super::backend::{ModelBackend, RowSample, SeqId, SeqStep};
use super::sampling::{Sampled, Sampler, SamplingParams};
use super::server::metrics::{Finished, Metrics, RequestStats};
use super::steplog::{StepLog, StepRecord};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Limits the scheduler enforces.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences in one running batch (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most positions (prompt + generated) of one sequence (`--max-model-len`).
    pub max_model_len: usize,
    /// Most tokens fed to the backend in one step (prefill is chunked to fit).
    pub max_num_batched_tokens: usize,
    /// KV positions the backend holds in all, for the usage gauge.
    pub kv_cache_tokens: usize,
    /// Token ids that end generation (config eos + harmony stop set).
    pub stop_tokens: Vec<u32>,
    /// Where to write the step timeline (`--step-log`), one JSON line per step.
    pub step_log: Option<std::path::PathBuf>,
    /// Most prompt tokens one request feeds per step (`--long-prefill-token-threshold`, as
    /// vLLM names it); 0: as many as the step's budget leaves. A low value keeps a long
    /// prompt from stalling the decoding requests for a whole big chunk.
    pub long_prefill_token_threshold: usize,
}

/// Why generation ended, in OpenAI's `finish_reason` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` or `max_model_len` was reached.
    Length,
}

/// What a request hears from the scheduler, in order: tokens, then one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    Token(Sampled),
    Done(FinishReason),
    Error(String),
}

/// A request for the scheduler.
#[derive(Debug)]
struct GenRequest {
    prompt: Vec<u32>,
    sampling: SamplingParams,
    events: UnboundedSender<GenEvent>,
    arrived: Instant,
}

/// The server's side of the scheduler: submit requests, read live metrics.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<GenRequest>,
    metrics: Arc<Metrics>,
    alive: Arc<AtomicBool>,
}

/// Clears the liveness flag when the engine thread ends, also when it unwinds from a panic.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl SchedulerHandle {
    /// Whether the engine thread is still running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Queue a request. Dropping the returned receiver cancels it and frees its KV slot.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        sampling: SamplingParams,
    ) -> anyhow::Result<UnboundedReceiver<GenEvent>> {
        // A decode step feeds the last token, so there must be one to start from.
        anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
        let (events, rx) = unbounded_channel();
        self.metrics.request_queued();
        self.tx
            .send(GenRequest {
                prompt,
                sampling,
                events,
                arrived: Instant::now(),
            })
            .map_err(|_| {
                self.metrics.request_dequeued();
                anyhow::anyhow!("the engine thread has stopped; restart the server")
            })?;
        Ok(rx)
    }
}

/// A request that holds a KV slot.
struct Running {
    seq: SeqId,
    req: GenRequest,
    sampler: Sampler,
    /// Reserved positions (for the KV usage gauge).
    reserved: usize,
    /// Prompt tokens already fed to the backend.
    prefilled: usize,
    generated: Vec<u32>,
    /// When the request was admitted, and when its first token came (phase times).
    admitted_at: Instant,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

/// Start the engine thread that owns `backend`.
pub fn spawn(
    backend: Box<dyn ModelBackend>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
) -> anyhow::Result<SchedulerHandle> {
    let step_log = match &cfg.step_log {
        Some(p) => Some(StepLog::create(p)?),
        None => None,
    };
    let (tx, rx) = mpsc::channel();
    let engine_metrics = metrics.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let guard = AliveGuard(alive.clone());
    std::thread::Builder::new()
        .name("mxtune-engine".into())
        .spawn(move || {
            let mut engine = Engine::new(guard, backend, cfg, engine_metrics);
            engine.step_log = step_log;
            engine.run(rx)
        })
        .map_err(|e| anyhow::anyhow!("could not start the engine thread: {e}"))?;
    Ok(SchedulerHandle { tx, metrics, alive })
}

struct Engine {
    // First field, so it drops first: when the thread dies, /health turns 503 before any
    // waiting client learns (from its closed channel) that its request failed.
    _alive: AliveGuard,
    backend: Box<dyn ModelBackend>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    waiting: VecDeque<GenRequest>,
    running: Vec<Running>,
    step_log: Option<StepLog>,
}

/// Where one step's time went, for the step log.
#[derive(Default)]
struct StepTimes {
    plan: Duration,
    forward: Duration,
    emit: Duration,
}

impl Engine {
    fn new(
        alive: AliveGuard,
        backend: Box<dyn ModelBackend>,
        cfg: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Engine {
            _alive: alive,
            backend,
            cfg,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            step_log: None,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<GenRequest>) {
        loop {
            let mut idle = Duration::ZERO;
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish_load();
                if let Some(log) = &mut self.step_log {
                    log.flush();
                }
                let t_idle = Instant::now();
                match rx.recv() {
                    Ok(r) => self.waiting.push_back(r),
                    // Every handle is gone: the server has shut down.
                    Err(_) => return,
                }
                idle = t_idle.elapsed();
            }
            let t0 = Instant::now();
            while let Ok(r) = rx.try_recv() {
                self.waiting.push_back(r);
            }
            self.drop_cancelled();
            self.admit();
            self.publish_load();
            if !self.running.is_empty() {
                let admitted = t0.elapsed();
                // What the step holds, read before it runs (it may finish requests).
                let shape = self.step_log.is_some().then(|| self.shape());
                let times = self.step();
                self.metrics.observe_step(times.forward, t0.elapsed());
                if let (Some(log), Some(mut rec)) = (&mut self.step_log, shape) {
                    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                    rec.t = log.since_open(t0);
                    rec.idle_us = us(idle);
                    rec.waiting = self.waiting.len();
                    rec.admit_us = us(admitted);
                    rec.plan_us = us(times.plan);
                    rec.forward_us = us(times.forward);
                    rec.emit_us = us(times.emit);
                    log.write(&rec);
                }
            }
        }
    }

    /// The step about to run as the step log describes it: decode rows and their context,
    /// prompt rows and the tokens the budget gives them (as `step` plans it).
    fn shape(&self) -> StepRecord {
        let (mut decode, mut ctx_sum, mut ctx_max) = (0usize, 0usize, 0usize);
        let (mut rows, mut tokens) = (0usize, 0usize);
        for (i, range) in self.plan() {
            let r = &self.running[i];
            match range {
                None => {
                    let ctx = r.req.prompt.len() + r.generated.len().saturating_sub(1);
                    decode += 1;
                    ctx_sum += ctx;
                    ctx_max = ctx_max.max(ctx);
                }
                Some(range) => {
                    rows += 1;
                    tokens += range.len();
                }
            }
        }
        StepRecord {
            t: 0.0,
            idle_us: 0,
            decode_rows: decode,
            prefill_rows: rows,
            prefill_tokens: tokens,
            ctx_max,
            ctx_mean: if decode > 0 {
                ctx_sum as f64 / decode as f64
            } else {
                0.0
            },
            waiting: 0,
            admit_us: 0,
            plan_us: 0,
            forward_us: 0,
            emit_us: 0,
        }
    }

    fn publish_load(&self) {
        let reserved: usize = self.running.iter().map(|r| r.reserved).sum();
        let capacity = self.cfg.kv_cache_tokens.max(1);
        self.metrics
            .set_load(self.running.len(), reserved as f64 / capacity as f64);
    }

    /// Requests whose client went away: free their slots now, not at the next token.
    fn drop_cancelled(&mut self) {
        let backend = &mut self.backend;
        let metrics = &self.metrics;
        self.running.retain(|r| {
            let gone = r.req.events.is_closed();
            if gone {
                backend.free_seq(r.seq);
                metrics.observe_finished(Finished::Abort, r.req.arrived.elapsed().as_secs_f64());
            }
            !gone
        });
        self.waiting.retain(|r| {
            let gone = r.events.is_closed();
            if gone {
                metrics.request_dequeued();
            }
            !gone
        });
    }

    /// Move waiting requests into the batch while slots and KV memory allow; a request
    /// that does not fit waits (FIFO) until a running one frees its memory.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_num_seqs {
            let Some(front) = self.waiting.front() else {
                return;
            };
            let need = (front.prompt.len() + front.sampling.max_tokens).min(self.cfg.max_model_len);
            match self.backend.alloc_seq(need) {
                Some(seq) => {
                    let Some(req) = self.waiting.pop_front() else {
                        return;
                    };
                    self.metrics.request_dequeued();
                    self.metrics
                        .observe_queue(req.arrived.elapsed().as_secs_f64());
                    self.running.push(Running {
                        seq,
                        sampler: Sampler::for_prompt(req.sampling.clone(), &req.prompt),
                        req,
                        reserved: need,
                        prefilled: 0,
                        generated: Vec::new(),
                        admitted_at: Instant::now(),
                        first_token_at: None,
                        last_token_at: None,
                    });
                }
                None if self.running.is_empty() => {
                    // Nothing will ever free memory: waiting would hang forever.
                    if let Some(req) = self.waiting.pop_front() {
                        self.metrics.request_dequeued();
                        let _ = req.events.send(GenEvent::Error(format!(
                            "the KV cache cannot hold {need} positions even when empty; \
                             lower max_tokens or the server's --max-model-len"
                        )));
                    }
                }
                None => return,
            }
        }
    }

    /// One batched forward step: every decoding sequence feeds its last token, prefilling
    /// sequences feed the next prompt chunk within the step's token budget. Returns where
    /// the step's time went (the backend's forward, and the host work before and after it).
    /// What the next step feeds, as (index into `running`, the range of the prompt fed, or
    /// None for a decode token): every decoding sequence first, then prompt chunks in
    /// admission order, within the step's token budget and, per request, the long-prefill
    /// threshold.
    fn plan(&self) -> Vec<(usize, Option<std::ops::Range<usize>>)> {
        let mut budget = self.cfg.max_num_batched_tokens.max(1);
        let mut plan = Vec::new();
        for (i, r) in self.running.iter().enumerate() {
            if r.prefilled == r.req.prompt.len() && budget > 0 {
                plan.push((i, None));
                budget -= 1;
            }
        }
        let cap = match self.cfg.long_prefill_token_threshold {
            0 => usize::MAX,
            n => n,
        };
        for (i, r) in self.running.iter().enumerate() {
            let left = r.req.prompt.len() - r.prefilled;
            if left > 0 && budget > 0 {
                let n = left.min(budget).min(cap);
                plan.push((i, Some(r.prefilled..r.prefilled + n)));
                budget -= n;
            }
        }
        plan
    }

    fn step(&mut self) -> StepTimes {
        let t_plan = Instant::now();
        let mut times = StepTimes::default();
        let plan = self.plan();
        let stops = &self.cfg.stop_tokens;
        // Split each running request into what the step reads and its sampler, which the
        // backend advances; a row samples only when its prompt is complete after this step.
        let mut parts: Vec<_> = self
            .running
            .iter_mut()
            .map(|r| {
                (
                    r.seq,
                    r.req.prompt.as_slice(),
                    r.generated.as_slice(),
                    Some(&mut r.sampler),
                )
            })
            .collect();
        let mut batch: Vec<SeqStep<'_>> = Vec::with_capacity(plan.len());
        let mut rows: Vec<RowSample<'_>> = Vec::with_capacity(plan.len());
        for (i, range) in &plan {
            let (seq, prompt, generated, sampler) = &mut parts[*i];
            let tokens = match range {
                Some(range) => &prompt[range.clone()],
                // Decoding starts only after prefill sampled a token, so `generated` is
                // non-empty here; fall back to the prompt's tail to stay panic-free.
                None => match generated.last() {
                    Some(t) => std::slice::from_ref(t),
                    None => &prompt[prompt.len() - 1..],
                },
            };
            let ends_prompt = range.as_ref().is_none_or(|r| r.end == prompt.len());
            let (sampler, banned) = match sampler.take() {
                Some(sm) if ends_prompt => {
                    let banned = banned_tokens(stops, sm.params(), generated.len());
                    (Some(sm), banned)
                }
                other => {
                    *sampler = other;
                    (None, &[][..])
                }
            };
            batch.push(SeqStep { seq: *seq, tokens });
            rows.push(RowSample { sampler, banned });
        }
        self.metrics
            .observe_iteration_tokens(batch.iter().map(|b| b.tokens.len()).sum());
        let t_forward = Instant::now();
        times.plan = t_forward.duration_since(t_plan);
        let result = self.backend.forward_sampled(&batch, &mut rows);
        times.forward = t_forward.elapsed();
        let t_emit = Instant::now();
        drop((batch, rows, parts));
        let sampled = match result {
            Ok(l) if l.len() == plan.len() => l,
            Ok(l) => {
                let msg = format!(
                    "backend {} returned {} sampled rows for a batch of {}",
                    self.backend.name(),
                    l.len(),
                    plan.len()
                );
                self.fail_all(&msg);
                times.emit = t_emit.elapsed();
                return times;
            }
            Err(e) => {
                self.fail_all(&format!("backend {} failed: {e:#}", self.backend.name()));
                times.emit = t_emit.elapsed();
                return times;
            }
        };
        let mut finished: Vec<usize> = Vec::new();
        for ((i, range), row) in plan.into_iter().zip(sampled) {
            let r = &mut self.running[i];
            if let Some(range) = range {
                r.prefilled = range.end;
                self.metrics.add_prompt_tokens(range.len());
                if r.prefilled < r.req.prompt.len() {
                    continue;
                }
            }
            let Some(token) = row else {
                let msg = format!(
                    "backend {} sampled no token for a sequence whose prompt is complete",
                    self.backend.name()
                );
                self.fail_all(&msg);
                times.emit = t_emit.elapsed();
                return times;
            };
            if let Some(reason) = Self::emit_token(&self.cfg, &self.metrics, r, token) {
                let _ = r.req.events.send(GenEvent::Done(reason));
                let why = match reason {
                    FinishReason::Stop => Finished::Stop,
                    FinishReason::Length => Finished::Length,
                };
                self.metrics
                    .observe_finished(why, r.req.arrived.elapsed().as_secs_f64());
                let first = r.first_token_at.unwrap_or(r.admitted_at);
                let last = r.last_token_at.unwrap_or(first);
                self.metrics.observe_request(RequestStats {
                    prompt_tokens: r.req.prompt.len(),
                    generation_tokens: r.generated.len(),
                    prefill_s: first.duration_since(r.admitted_at).as_secs_f64(),
                    decode_s: last.duration_since(first).as_secs_f64(),
                });
                finished.push(i);
            }
        }
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            let r = self.running.remove(i);
            self.backend.free_seq(r.seq);
        }
        times.emit = t_emit.elapsed();
        times
    }

    /// Send one sampled token; returns why the request ends, if it does.
    fn emit_token(
        cfg: &SchedulerConfig,
        metrics: &Metrics,
        r: &mut Running,
        s: Sampled,
    ) -> Option<FinishReason> {
        let p = r.sampler.params();
        let ignore_eos = p.ignore_eos;
        let max_tokens = p.max_tokens;
        let now = Instant::now();
        if r.last_token_at.is_none() {
            metrics.observe_ttft(now.duration_since(r.req.arrived).as_secs_f64());
            r.first_token_at = Some(now);
        }
        metrics.add_generated_token(r.last_token_at.map(|t| now.duration_since(t).as_secs_f64()));
        r.last_token_at = Some(now);
        let token = s.token;
        r.generated.push(token);
        let _ = r.req.events.send(GenEvent::Token(s));
        if !ignore_eos && cfg.stop_tokens.contains(&token) {
            Some(FinishReason::Stop)
        } else if r.generated.len() >= max_tokens
            || r.req.prompt.len() + r.generated.len() >= cfg.max_model_len
        {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    fn fail_all(&mut self, msg: &str) {
        for r in self.running.drain(..) {
            // Free the slot before the client hears of the failure, so a client that
            // retries at once finds the room (and a test checking the slot does not race).
            self.backend.free_seq(r.seq);
            let _ = r.req.events.send(GenEvent::Error(msg.to_string()));
            self.metrics
                .observe_finished(Finished::Abort, r.req.arrived.elapsed().as_secs_f64());
        }
    }
}

/// Stop tokens are banned until `min_tokens` tokens exist (unless `ignore_eos`).
fn banned_tokens<'a>(stops: &'a [u32], p: &SamplingParams, generated: usize) -> &'a [u32] {
    if generated < p.min_tokens && !p.ignore_eos {
        stops
    } else {
        &[]
    }
}

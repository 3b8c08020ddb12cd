//! Continuous batching: one thread owns the backend and, every step, builds a batch of
//! prefill chunks and decode tokens from all live requests. Requests arrive and results
//! leave through channels, so the async server never blocks on the model.

use super::backend::{ModelBackend, RowSample, SeqId, SeqStep};
use super::sampling::{Sampled, Sampler, SamplingParams};
use super::server::metrics::{Finished, Metrics, RequestStats};
use super::steplog::{StepLog, StepRecord};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Most requests that may wait beyond a full batch (`--max-waiting-queue-length`);
    /// a request past `max_num_seqs + this` in the server is refused at once. 0 = no limit.
    pub max_waiting_queue_length: usize,
    /// Prefix caching (`--enable-prefix-caching`): a request takes the free KV slot holding
    /// the longest prefix of its prompt and prefills only the rest.
    pub enable_prefix_caching: bool,
}

/// Why generation ended, in OpenAI's `finish_reason` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` or `max_model_len` was reached.
    Length,
}

/// What a request hears from the scheduler, in order: `Cached` at most once, tokens, then
/// one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// With prefix caching, when the request is admitted: how many leading prompt tokens
    /// were found in the cache (sent only when some were).
    Cached(usize),
    /// A prompt token's raw logprob and alternatives, for a request that scores its prompt
    /// (`SamplingParams::prompt_logprobs`): one per prompt token after the first, in order,
    /// all before the first generated token.
    Prompt(Sampled),
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
    in_flight: InFlight,
    /// One of the `n` choices of a request: (the request's number, the choice's index). The
    /// first choice prefills the prompt; with prefix caching, the others copy its KV.
    choice: Option<(u64, usize)>,
}

/// Counts one request as in the server from submission until it ends: released before its
/// client hears `Done` or `Error` (so a client that sends its next request at once finds the
/// room), and on drop for every other way out (cancelled, engine thread gone).
#[derive(Debug)]
struct InFlight(Option<Arc<AtomicUsize>>);

impl InFlight {
    /// Count one more request unless `cap` (0 = none) are already in the server.
    #[cfg(test)]
    fn enter(count: &Arc<AtomicUsize>, cap: usize) -> Option<Self> {
        Self::enter_all(count, cap, 1).and_then(|mut v| v.pop())
    }

    /// Count `k` more requests at once, or none when that would pass `cap` (0 = none).
    fn enter_all(count: &Arc<AtomicUsize>, cap: usize, k: usize) -> Option<Vec<Self>> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                let after = n.checked_add(k)?;
                (cap == 0 || after <= cap).then_some(after)
            })
            .ok()
            .map(|_| (0..k).map(|_| InFlight(Some(count.clone()))).collect())
    }

    fn release(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.release();
    }
}

/// Why [`SchedulerHandle::submit`] refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// The prompt has no token (a decode step needs one to start from).
    EmptyPrompt,
    /// `max_num_seqs + max_waiting_queue_length` requests are already in the server.
    QueueFull {
        max_num_seqs: usize,
        max_waiting_queue_length: usize,
        /// Places the request asked for (its `n` choices).
        choices: usize,
    },
    /// The engine thread has ended.
    EngineStopped,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::EmptyPrompt => write!(f, "the prompt is empty"),
            SubmitError::QueueFull {
                max_num_seqs,
                max_waiting_queue_length,
                choices,
            } if *choices > max_num_seqs + max_waiting_queue_length => write!(
                f,
                "a request of {choices} choices takes {choices} places, more than this server \
                 ever holds: a batch of {max_num_seqs} and {max_waiting_queue_length} waiting \
                 (mxtune serve --max-num-seqs {max_num_seqs} --max-waiting-queue-length \
                 {max_waiting_queue_length}); ask for fewer choices (n) or restart the server \
                 with a larger --max-waiting-queue-length (0 = no limit)"
            ),
            SubmitError::QueueFull {
                max_num_seqs,
                max_waiting_queue_length,
                ..
            } => write!(
                f,
                "the server is full: it holds {} requests, a batch of {max_num_seqs} and \
                 {max_waiting_queue_length} waiting (mxtune serve --max-num-seqs \
                 {max_num_seqs} --max-waiting-queue-length {max_waiting_queue_length}); retry \
                 later, send fewer requests at once, or restart the server with a larger \
                 --max-waiting-queue-length (0 = no limit)",
                max_num_seqs + max_waiting_queue_length
            ),
            SubmitError::EngineStopped => {
                write!(f, "the engine thread has stopped; restart the server")
            }
        }
    }
}

impl std::error::Error for SubmitError {}

/// The server's side of the scheduler: submit requests, read live metrics.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<GenRequest>,
    metrics: Arc<Metrics>,
    alive: Arc<AtomicBool>,
    /// Requests submitted and not yet ended, and the most allowed (0 = no limit).
    in_flight: Arc<AtomicUsize>,
    /// Numbers the requests of several choices, so the engine knows which share a prompt.
    groups: Arc<AtomicU64>,
    max_num_seqs: usize,
    max_waiting_queue_length: usize,
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

    /// Requests submitted and not yet ended (running, waiting, or on their way in).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Queue a request. Dropping the returned receiver cancels it and frees its KV slot.
    /// With a waiting-queue limit, a request that finds `max_num_seqs + limit` requests in
    /// the server is refused at once (counted in the metrics), never queued.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        sampling: SamplingParams,
    ) -> Result<UnboundedReceiver<GenEvent>, SubmitError> {
        self.submit_all(&prompt, vec![sampling])
            .and_then(|mut rxs| rxs.pop().ok_or(SubmitError::EngineStopped))
    }

    /// Queue one sequence per entry of `samplings`, all on `prompt` (the `n` choices of one
    /// request). They take their places under the waiting-queue limit together: all are
    /// queued, or none is and the request is refused (counted once in the metrics).
    pub fn submit_all(
        &self,
        prompt: &[u32],
        samplings: Vec<SamplingParams>,
    ) -> Result<Vec<UnboundedReceiver<GenEvent>>, SubmitError> {
        // A decode step feeds the last token, so there must be one to start from.
        if prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let cap = match self.max_waiting_queue_length {
            0 => 0,
            w => self.max_num_seqs.saturating_add(w),
        };
        let Some(places) = InFlight::enter_all(&self.in_flight, cap, samplings.len()) else {
            self.metrics.request_rejected_queue_full();
            return Err(SubmitError::QueueFull {
                max_num_seqs: self.max_num_seqs,
                max_waiting_queue_length: self.max_waiting_queue_length,
                choices: samplings.len(),
            });
        };
        let group = (samplings.len() > 1).then(|| self.groups.fetch_add(1, Ordering::SeqCst));
        let mut rxs = Vec::with_capacity(samplings.len());
        for (i, (sampling, in_flight)) in samplings.into_iter().zip(places).enumerate() {
            let (events, rx) = unbounded_channel();
            self.metrics.request_queued();
            self.tx
                .send(GenRequest {
                    prompt: prompt.to_vec(),
                    sampling,
                    events,
                    arrived: Instant::now(),
                    in_flight,
                    choice: group.map(|g| (g, i)),
                })
                .map_err(|_| {
                    self.metrics.request_dequeued();
                    SubmitError::EngineStopped
                })?;
            rxs.push(rx);
        }
        Ok(rxs)
    }
}

/// A request that holds a KV slot (or, pre-empted, waits to get one back).
struct Running {
    seq: SeqId,
    req: GenRequest,
    sampler: Sampler,
    /// Reserved positions (for the KV usage gauge).
    reserved: usize,
    /// What the request prefills: its prompt, or after a pre-emption its prompt and every
    /// token it had generated, recomputed in one go.
    input: Vec<u32>,
    /// Tokens of `input` already fed to the backend.
    prefilled: usize,
    /// Prompt tokens counted in `vllm:prompt_tokens_total` so far (a recompute does not
    /// count them again).
    counted: usize,
    generated: Vec<u32>,
    /// Prompt tokens whose logprob is known (sent as `GenEvent::Prompt`), the first counted
    /// (it has none): a request that scores its prompt feeds it one token a step until this
    /// reaches the prompt's length.
    scored: usize,
    /// The tokens banned until `min_tokens` exist: the model's stop set (unless
    /// `ignore_eos`) and the request's `stop_token_ids`.
    early_stops: Vec<u32>,
    /// When the request was admitted, and when its first token came (phase times).
    admitted_at: Instant,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

impl Running {
    /// Count the prompt tokens among the first `fed` of `input` in
    /// `vllm:prompt_tokens_total`, those not counted yet: a recompute's were counted the
    /// first time.
    fn count_prompt(&mut self, metrics: &Metrics, fed: usize) {
        let upto = fed.min(self.req.prompt.len());
        if upto > self.counted {
            metrics.add_prompt_tokens(upto - self.counted);
            self.counted = upto;
        }
    }

    /// Whether the next step must score a prompt token: feed one token, whose logits give the
    /// next prompt token's logprob.
    fn scoring(&self) -> bool {
        self.req.sampling.prompt_logprobs && self.scored < self.req.prompt.len()
    }

    /// Generated tokens that `input` holds after the prompt (0 until a pre-emption).
    fn fed_back(&self) -> usize {
        self.input.len() - self.req.prompt.len()
    }

    /// The tokens whose keys and values the sequence holds, in position order: its input
    /// fed so far and, once all of it is in, every generated token fed back since (all but
    /// the newest, which the next step feeds).
    fn fed(&self) -> impl Iterator<Item = &u32> {
        let back: &[u32] = if self.prefilled == self.input.len() {
            let end = self.generated.len().saturating_sub(1);
            &self.generated[self.fed_back().min(end)..end]
        } else {
            &[]
        };
        self.input[..self.prefilled].iter().chain(back)
    }
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
    let (max_num_seqs, max_waiting_queue_length) = (cfg.max_num_seqs, cfg.max_waiting_queue_length);
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
    Ok(SchedulerHandle {
        tx,
        metrics,
        alive,
        in_flight: Arc::new(AtomicUsize::new(0)),
        groups: Arc::new(AtomicU64::new(0)),
        max_num_seqs,
        max_waiting_queue_length,
    })
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
    /// Pre-empted requests, admitted again before any waiting one (front first).
    preempted: VecDeque<Running>,
    step_log: Option<StepLog>,
}

/// Where the first choice of a request stands, for a later choice waiting to be admitted.
enum FirstChoice {
    /// Not running (finished, or not a choice of several): prefill as usual.
    None,
    /// Running, its prompt not yet fed up to the last token: wait for it.
    Prefilling,
    /// Running with its prompt fed: copy its KV.
    Prefilled(SeqId),
}

/// One row of a step's plan: the index into `running`, and the range of its prompt fed, or
/// None for a decode token.
type PlanRow = (usize, Option<std::ops::Range<usize>>);

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
        let mut backend = backend;
        backend.set_prefix_caching(cfg.enable_prefix_caching);
        Engine {
            _alive: alive,
            backend,
            cfg,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preempted: VecDeque::new(),
            step_log: None,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<GenRequest>) {
        loop {
            let mut idle = Duration::ZERO;
            if self.running.is_empty() && self.waiting.is_empty() && self.preempted.is_empty() {
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
            self.iterate(&rx, idle);
        }
    }

    /// One scheduler iteration: take the requests that arrived, drop those whose client went
    /// away (their slots are free before the step runs), admit, and run one batched step.
    fn iterate(&mut self, rx: &mpsc::Receiver<GenRequest>, idle: Duration) {
        let t0 = Instant::now();
        while let Ok(r) = rx.try_recv() {
            self.waiting.push_back(r);
        }
        self.drop_cancelled();
        self.admit();
        let t_plan = Instant::now();
        let plan = self.reserve_plan();
        self.publish_load();
        if !self.running.is_empty() {
            let admitted = t_plan.duration_since(t0);
            // What the step holds, read before it runs (it may finish requests).
            let shape = self.step_log.is_some().then(|| self.shape(&plan));
            let times = self.step(plan, t_plan);
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

    /// The step about to run as the step log describes it: decode rows and their context,
    /// prompt rows and the tokens the budget gives them (as `step` plans it).
    fn shape(&self, plan: &[PlanRow]) -> StepRecord {
        let (mut decode, mut ctx_sum, mut ctx_max) = (0usize, 0usize, 0usize);
        let (mut rows, mut tokens) = (0usize, 0usize);
        for (i, range) in plan {
            let r = &self.running[*i];
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
        // Pre-empted ones hold no KV; they only leave the queue.
        self.preempted.retain(|r| {
            let gone = r.req.events.is_closed();
            if gone {
                metrics.request_dequeued();
                metrics.observe_finished(Finished::Abort, r.req.arrived.elapsed().as_secs_f64());
            }
            !gone
        });
    }

    /// Move waiting requests into the batch while slots and KV memory allow; a request
    /// that does not fit waits (FIFO) until a running one frees its memory. With prefix
    /// caching, the slot may already hold the prompt's first tokens: those are not fed again.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_num_seqs {
            if !self.preempted.is_empty() {
                if self.readmit() {
                    continue;
                }
                return;
            }
            let Some(front) = self.waiting.front() else {
                return;
            };
            let full = (front.prompt.len() + front.sampling.max_tokens).min(self.cfg.max_model_len);
            // A backend that grows sequences on demand gets the prompt's room now and the
            // rest step by step; a request that could not finish even alone is refused now,
            // not after some of its tokens were sent.
            let on_demand = self.backend.grows_on_demand();
            if on_demand && full > self.cfg.kv_cache_tokens {
                self.refuse_front(full);
                continue;
            }
            let need = if on_demand { front.prompt.len() } else { full };
            if !self.room_for(need) {
                return;
            }
            // A request that scores its prompt needs the logits after every prompt token:
            // nothing of it may come from a cache or a copy.
            let slot = if self.cfg.enable_prefix_caching && !front.sampling.prompt_logprobs {
                match self.first_choice(front) {
                    FirstChoice::Prefilling => return,
                    FirstChoice::Prefilled(src) => {
                        let len = front.prompt.len() - 1;
                        match self.backend.fork_seq(src, len, need) {
                            Some(seq) => Some((seq, len)),
                            None => self.backend.alloc_cached(&front.prompt, need),
                        }
                    }
                    FirstChoice::None => match self.live_prefix(&front.prompt) {
                        // A running sequence holds more of the prompt than any free slot:
                        // copy its KV instead of computing it again.
                        Some((src, n)) if n > self.backend.cached_prefix(&front.prompt) => self
                            .backend
                            .fork_seq(src, n, need)
                            .map(|seq| (seq, n))
                            .or_else(|| self.backend.alloc_cached(&front.prompt, need)),
                        _ => self.backend.alloc_cached(&front.prompt, need),
                    },
                }
            } else {
                self.backend.alloc_seq(need).map(|seq| (seq, 0))
            };
            match slot {
                Some((seq, cached)) => {
                    let Some(mut req) = self.waiting.pop_front() else {
                        return;
                    };
                    self.metrics.request_dequeued();
                    self.metrics
                        .observe_queue(req.arrived.elapsed().as_secs_f64());
                    if cached >= req.prompt.len() {
                        // The last prompt position must run to give logits; a backend that
                        // claims to hold it breaks its contract.
                        self.backend.free_seq(seq);
                        req.in_flight.release();
                        let _ = req.events.send(GenEvent::Error(whole_cached_error(
                            &self.backend.name(),
                            cached,
                            req.prompt.len(),
                            "prompt",
                        )));
                        self.metrics
                            .observe_finished(Finished::Abort, req.arrived.elapsed().as_secs_f64());
                        continue;
                    }
                    if self.cfg.enable_prefix_caching {
                        self.metrics.observe_prefix_cache(req.prompt.len(), cached);
                    }
                    if cached > 0 {
                        // Counted as vLLM counts prompt tokens: cached ones too.
                        self.metrics.add_prompt_tokens(cached);
                        let _ = req.events.send(GenEvent::Cached(cached));
                    }
                    let early_stops = early_stops(&self.cfg.stop_tokens, &req.sampling);
                    self.running.push(Running {
                        seq,
                        sampler: Sampler::for_prompt(req.sampling.clone(), &req.prompt),
                        input: req.prompt.clone(),
                        req,
                        reserved: need,
                        prefilled: cached,
                        counted: cached,
                        generated: Vec::new(),
                        scored: 1,
                        early_stops,
                        admitted_at: Instant::now(),
                        first_token_at: None,
                        last_token_at: None,
                    });
                }
                // Nothing will ever free memory: waiting would hang forever.
                None if self.running.is_empty() => self.refuse_front(need),
                None => return,
            }
        }
    }

    /// Whether a request reserving `need` positions may be admitted now. A backend that
    /// grows sequences on demand must also keep a step's growth for every running request
    /// and the new one (one position each), or the new request would be pre-empted before
    /// its first step; one that reserves up front says so itself when it allocates.
    fn room_for(&self, need: usize) -> bool {
        // Alone, the allocation decides (and a request that cannot fit is refused).
        if !self.backend.grows_on_demand() || self.running.is_empty() {
            return true;
        }
        let reserved: usize = self.running.iter().map(|r| r.reserved).sum();
        reserved + need + self.running.len() < self.cfg.kv_cache_tokens
    }

    /// Refuse the front waiting request, which needs `need` positions that the KV cache
    /// cannot give it even when empty.
    fn refuse_front(&mut self, need: usize) {
        if let Some(mut req) = self.waiting.pop_front() {
            self.metrics.request_dequeued();
            req.in_flight.release();
            let _ = req.events.send(GenEvent::Error(format!(
                "the KV cache cannot hold {need} positions even when empty; \
                 lower max_tokens or the server's --max-model-len"
            )));
        }
    }

    /// Give the front pre-empted request a slot again; its input (prompt and generated
    /// tokens) is prefilled anew, less what the backend still holds of it with prefix
    /// caching. Returns false when the KV memory has no room for it yet.
    fn readmit(&mut self) -> bool {
        let Some(front) = self.preempted.front() else {
            return false;
        };
        let need = front.input.len();
        if !self.room_for(need) {
            return false;
        }
        let slot = if self.cfg.enable_prefix_caching && !front.scoring() {
            self.backend.alloc_cached(&front.input, need)
        } else {
            self.backend.alloc_seq(need).map(|seq| (seq, 0))
        };
        let Some((seq, cached)) = slot else {
            return false;
        };
        let Some(mut r) = self.preempted.pop_front() else {
            self.backend.free_seq(seq);
            return false;
        };
        self.metrics.request_dequeued();
        if cached >= r.input.len() {
            // As in `admit`: the last position must run to give logits.
            self.backend.free_seq(seq);
            let msg = whole_cached_error(&self.backend.name(), cached, r.input.len(), "input");
            Self::fail(&self.metrics, &mut r, &msg);
            return true;
        }
        r.count_prompt(&self.metrics, cached);
        r.seq = seq;
        r.prefilled = cached;
        r.reserved = need;
        self.running.push(r);
        true
    }

    /// The next step's plan with KV room reserved for every row. Where the backend grows
    /// sequences on demand and cannot give a row its room, the request admitted last is
    /// pre-empted — its KV freed, its prompt and generated tokens to be recomputed when it
    /// is admitted again, before any waiting request — and the step planned again; a
    /// request alone that cannot grow fails.
    fn reserve_plan(&mut self) -> Vec<PlanRow> {
        'plan: loop {
            let plan = self.plan();
            for (i, range) in &plan {
                let r = &mut self.running[*i];
                let len = match range {
                    Some(range) => range.end,
                    // The prompt, every generated token but the newest, and that one now.
                    None => r.req.prompt.len() + r.generated.len(),
                };
                if self.backend.grow_seq(r.seq, len) {
                    r.reserved = r.reserved.max(len);
                    continue;
                }
                if self.running.len() == 1 {
                    let mut r = self.running.remove(0);
                    self.backend.free_seq(r.seq);
                    let msg = format!(
                        "the KV cache ({} positions) cannot hold the {len} positions of this \
                         request; lower max_tokens or raise --kv-cache-tokens",
                        self.cfg.kv_cache_tokens
                    );
                    Self::fail(&self.metrics, &mut r, &msg);
                    return Vec::new();
                }
                self.preempt_last();
                continue 'plan;
            }
            return plan;
        }
    }

    /// Pre-empt the request admitted last (recompute): free its KV, and queue it to be
    /// admitted again with its prompt and generated tokens as what it prefills.
    fn preempt_last(&mut self) {
        let Some(mut r) = self.running.pop() else {
            return;
        };
        self.backend.free_seq(r.seq);
        r.input = r.req.prompt.iter().chain(&r.generated).copied().collect();
        r.prefilled = 0;
        r.reserved = 0;
        self.metrics.observe_preemption();
        self.metrics.request_queued();
        self.preempted.push_front(r);
    }

    /// The running sequence holding the longest prefix of `prompt` (short of its last token,
    /// which must run to give logits), and that length; `None` when none holds any or the
    /// backend cannot copy KV.
    fn live_prefix(&self, prompt: &[u32]) -> Option<(SeqId, usize)> {
        if !self.backend.can_fork() {
            return None;
        }
        let cap = prompt.len().saturating_sub(1);
        self.running
            .iter()
            .map(|r| {
                let n = r.fed().zip(prompt).take_while(|(a, b)| a == b).count();
                (r.seq, n.min(cap))
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// For a later choice of a request (`n`), where the first choice stands: its prompt's
    /// KV, all but the last position, is what this one may copy instead of prefilling.
    /// Only when the backend can copy KV and the prompt has more than one token.
    fn first_choice(&self, req: &GenRequest) -> FirstChoice {
        let Some((group, index)) = req.choice else {
            return FirstChoice::None;
        };
        if index == 0 || req.prompt.len() < 2 || !self.backend.can_fork() {
            return FirstChoice::None;
        }
        match self
            .running
            .iter()
            .find(|r| r.req.choice == Some((group, 0)))
        {
            Some(r) if r.prefilled + 1 >= req.prompt.len() => FirstChoice::Prefilled(r.seq),
            Some(_) => FirstChoice::Prefilling,
            None => FirstChoice::None,
        }
    }

    /// What the next step feeds, as (index into `running`, the range of the prompt fed, or
    /// None for a decode token): every decoding sequence first, then prompt chunks in
    /// admission order, within the step's token budget and, per request, the long-prefill
    /// threshold.
    fn plan(&self) -> Vec<PlanRow> {
        let mut budget = self.cfg.max_num_batched_tokens.max(1);
        let mut plan = Vec::new();
        for (i, r) in self.running.iter().enumerate() {
            if r.prefilled == r.input.len() && budget > 0 {
                plan.push((i, None));
                budget -= 1;
            }
        }
        let cap = match self.cfg.long_prefill_token_threshold {
            0 => usize::MAX,
            n => n,
        };
        for (i, r) in self.running.iter().enumerate() {
            let left = r.input.len() - r.prefilled;
            if left > 0 && budget > 0 {
                let n = if r.scoring() {
                    1
                } else {
                    left.min(budget).min(cap)
                };
                plan.push((i, Some(r.prefilled..r.prefilled + n)));
                budget -= n;
            }
        }
        plan
    }

    /// One batched forward step of `plan` (made since `t_plan`): every decoding sequence
    /// feeds its last token, prefilling sequences feed their next prompt chunk. Returns where
    /// the step's time went (the backend's forward, and the host work before and after it).
    fn step(&mut self, plan: Vec<PlanRow>, t_plan: Instant) -> StepTimes {
        let mut times = StepTimes::default();
        // Split each running request into what the step reads and its sampler, which the
        // backend advances; a row samples only when its prompt is complete after this step.
        let mut parts: Vec<_> = self
            .running
            .iter_mut()
            .map(|r| {
                let score = r.scoring().then_some(r.scored);
                (
                    r.seq,
                    r.input.as_slice(),
                    r.generated.as_slice(),
                    r.early_stops.as_slice(),
                    Some(&mut r.sampler),
                    // The prompt token this request scores next, if it scores its prompt.
                    score,
                )
            })
            .collect();
        let mut batch: Vec<SeqStep<'_>> = Vec::with_capacity(plan.len());
        let mut rows: Vec<RowSample<'_>> = Vec::with_capacity(plan.len());
        for (i, range) in &plan {
            let (seq, prompt, generated, early_stops, sampler, score) = &mut parts[*i];
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
            // A chunk that ends just before the prompt token scored next gives its logprob.
            let forced = match (range, *score) {
                (Some(r), Some(k)) if r.end == k && k < prompt.len() => Some(prompt[k]),
                _ => None,
            };
            let (sampler, banned) = match sampler.take() {
                Some(sm) if ends_prompt => {
                    let banned = banned_tokens(early_stops, sm.params(), generated.len());
                    (Some(sm), banned)
                }
                Some(sm) if forced.is_some() => (Some(sm), &[][..]),
                other => {
                    *sampler = other;
                    (None, &[][..])
                }
            };
            batch.push(SeqStep { seq: *seq, tokens });
            rows.push(RowSample {
                sampler,
                banned,
                forced,
            });
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
                r.count_prompt(&self.metrics, range.end);
                if r.prefilled < r.input.len() {
                    if r.scoring() && range.end == r.scored {
                        match row {
                            Some(s) => {
                                let _ = r.req.events.send(GenEvent::Prompt(s));
                                r.scored += 1;
                            }
                            None => {
                                let msg = format!(
                                    "backend {} scored no prompt token where it was asked to",
                                    self.backend.name()
                                );
                                self.fail_all(&msg);
                                times.emit = t_emit.elapsed();
                                return times;
                            }
                        }
                    }
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
            // A request that only scores its prompt (`max_tokens` 0) ends with it.
            let reason = if r.req.sampling.max_tokens == 0 {
                Some(FinishReason::Length)
            } else {
                Self::emit_token(&self.cfg, &self.metrics, r, token)
            };
            if let Some(reason) = reason {
                r.req.in_flight.release();
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
        if (!ignore_eos && cfg.stop_tokens.contains(&token)) || p.stop_token_ids.contains(&token) {
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
        // Pre-empted requests hold no KV (their old id may be another sequence's by now).
        let preempted: Vec<Running> = self.preempted.drain(..).collect();
        for _ in &preempted {
            self.metrics.request_dequeued();
        }
        for mut r in self.running.drain(..) {
            // Free the slot before the client hears of the failure, so a client that
            // retries at once finds the room (and a test checking the slot does not race).
            self.backend.free_seq(r.seq);
            Self::fail(&self.metrics, &mut r, msg);
        }
        for mut r in preempted {
            Self::fail(&self.metrics, &mut r, msg);
        }
    }

    /// Tell one request's client it failed with `msg` (its KV already freed).
    fn fail(metrics: &Metrics, r: &mut Running, msg: &str) {
        r.req.in_flight.release();
        let _ = r.req.events.send(GenEvent::Error(msg.to_string()));
        metrics.observe_finished(Finished::Abort, r.req.arrived.elapsed().as_secs_f64());
    }
}

/// The error for a backend that reports all `len` tokens of a request's `what` (its prompt,
/// or a pre-empted request's input) as cached: `alloc_cached` must leave the last position to
/// compute, because its logits give the next token.
fn whole_cached_error(backend: &str, cached: usize, len: usize, what: &str) -> String {
    format!(
        "backend {backend} reported {cached} cached tokens of a {len}-token {what} (it must \
         leave the last one to compute); restart the server with --no-enable-prefix-caching"
    )
}

/// The tokens that end a request of `p` (the model's `stops` unless `ignore_eos`, and its
/// own `stop_token_ids`), for the ban that `min_tokens` puts on them; empty without one.
fn early_stops(stops: &[u32], p: &SamplingParams) -> Vec<u32> {
    if p.min_tokens == 0 {
        return Vec::new();
    }
    let model = if p.ignore_eos { &[][..] } else { stops };
    model.iter().chain(&p.stop_token_ids).copied().collect()
}

/// Stop tokens (`early_stops`) are banned until `min_tokens` tokens exist.
fn banned_tokens<'a>(early_stops: &'a [u32], p: &SamplingParams, generated: usize) -> &'a [u32] {
    if generated < p.min_tokens {
        early_stops
    } else {
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::ModelConfig;
    use std::collections::HashMap;
    use std::sync::Mutex;

    const VOCAB: usize = 64;

    /// One forward call as the backend saw it: (sequence, tokens fed) per row.
    type Steps = Arc<Mutex<Vec<Vec<(SeqId, usize)>>>>;

    /// A stand-in model for the scheduler's own rules: it records every step, accounts KV
    /// positions like the real backends, and prefers token `(last + 1) % VOCAB`.
    struct Recorder {
        cfg: ModelConfig,
        kv_budget: usize,
        reserved: HashMap<SeqId, usize>,
        next: u32,
        steps: Steps,
    }

    impl ModelBackend for Recorder {
        fn config(&self) -> &ModelConfig {
            &self.cfg
        }
        fn name(&self) -> String {
            "recorder".into()
        }
        fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
            let used: usize = self.reserved.values().sum();
            if used + max_tokens > self.kv_budget {
                return None;
            }
            let id = SeqId(self.next);
            self.next += 1;
            self.reserved.insert(id, max_tokens);
            Some(id)
        }
        fn free_seq(&mut self, seq: SeqId) {
            self.reserved.remove(&seq);
        }
        fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
            self.steps
                .lock()
                .unwrap()
                .push(batch.iter().map(|b| (b.seq, b.tokens.len())).collect());
            Ok(batch
                .iter()
                .map(|b| {
                    let mut l = vec![0.0f32; VOCAB];
                    let last = b.tokens.last().copied().unwrap_or(0) as usize;
                    l[(last + 1) % VOCAB] = 5.0;
                    l
                })
                .collect())
        }
    }

    /// An engine driven one iteration at a time, with no thread and no clock in the way.
    struct Harness {
        engine: Engine,
        tx: mpsc::Sender<GenRequest>,
        rx: mpsc::Receiver<GenRequest>,
        in_flight: Arc<AtomicUsize>,
        steps: Steps,
    }

    impl Harness {
        fn new(max_num_seqs: usize, budget: usize, kv_tokens: usize) -> Self {
            let steps = Steps::default();
            let mut cfg = crate::engine::synthetic::config("tiny").unwrap();
            cfg.vocab_size = VOCAB;
            let backend = Recorder {
                cfg,
                kv_budget: kv_tokens,
                reserved: HashMap::new(),
                next: 0,
                steps: steps.clone(),
            };
            Self::over(
                Box::new(backend),
                steps,
                max_num_seqs,
                budget,
                kv_tokens,
                false,
            )
        }

        /// An engine over `backend` (which records its steps into `steps`), prefix caching
        /// on or off.
        fn over(
            backend: Box<dyn ModelBackend>,
            steps: Steps,
            max_num_seqs: usize,
            budget: usize,
            kv_tokens: usize,
            prefix_caching: bool,
        ) -> Self {
            let sc = SchedulerConfig {
                max_num_seqs,
                max_model_len: 4096,
                max_num_batched_tokens: budget,
                kv_cache_tokens: kv_tokens,
                stop_tokens: Vec::new(),
                step_log: None,
                long_prefill_token_threshold: 0,
                max_waiting_queue_length: 0,
                enable_prefix_caching: prefix_caching,
            };
            let metrics =
                Arc::new(Metrics::new("t", 4096, kv_tokens).with_prefix_caching(prefix_caching));
            let engine = Engine::new(
                AliveGuard(Arc::new(AtomicBool::new(true))),
                backend,
                sc,
                metrics,
            );
            let (tx, rx) = mpsc::channel();
            Harness {
                engine,
                tx,
                rx,
                in_flight: Arc::new(AtomicUsize::new(0)),
                steps,
            }
        }

        /// Submit a greedy request of `prompt_len` tokens starting at `first`.
        fn submit(
            &self,
            prompt_len: usize,
            first: u32,
            max_tokens: usize,
        ) -> UnboundedReceiver<GenEvent> {
            self.submit_prompt(
                (0..prompt_len as u32).map(|k| (first + k) % 60).collect(),
                max_tokens,
            )
        }

        /// Submit a greedy request for `prompt`.
        fn submit_prompt(
            &self,
            prompt: Vec<u32>,
            max_tokens: usize,
        ) -> UnboundedReceiver<GenEvent> {
            let (events, rx) = unbounded_channel();
            self.engine.metrics.request_queued();
            let in_flight = InFlight::enter(&self.in_flight, 0).unwrap();
            self.tx
                .send(GenRequest {
                    prompt,
                    sampling: SamplingParams {
                        temperature: 0.0,
                        max_tokens,
                        ignore_eos: true,
                        ..SamplingParams::default()
                    },
                    events,
                    arrived: Instant::now(),
                    in_flight,
                    choice: None,
                })
                .unwrap();
            rx
        }

        fn tick(&mut self) {
            self.engine.iterate(&self.rx, Duration::ZERO);
        }

        fn live(&self) -> usize {
            self.engine.running.len()
        }

        /// The first prompt token of each running request (tests give each a distinct one).
        fn running_firsts(&self) -> Vec<u32> {
            self.engine
                .running
                .iter()
                .map(|r| r.req.prompt[0])
                .collect()
        }
    }

    /// Tokens received so far, and whether the request ended.
    fn drain(rx: &mut UnboundedReceiver<GenEvent>, got: &mut Vec<u32>) -> bool {
        let mut done = false;
        while let Ok(ev) = rx.try_recv() {
            match ev {
                GenEvent::Cached(_) | GenEvent::Prompt(_) => {}
                GenEvent::Token(s) => got.push(s.token),
                GenEvent::Done(_) => done = true,
                GenEvent::Error(e) => panic!("request failed: {e}"),
            }
        }
        done
    }

    #[test]
    fn every_step_stays_within_the_token_budget_and_feeds_every_prompt_token_once() {
        let mut h = Harness::new(4, 16, 100_000);
        let prompts = [5usize, 40, 3, 33, 17, 1, 64];
        let mut rxs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, &n)| h.submit(n, i as u32, 6))
            .collect();
        let mut got = vec![Vec::new(); prompts.len()];
        let mut done = vec![false; prompts.len()];
        for _ in 0..500 {
            h.tick();
            for (i, rx) in rxs.iter_mut().enumerate() {
                done[i] |= drain(rx, &mut got[i]);
            }
            if done.iter().all(|d| *d) {
                break;
            }
        }
        assert!(done.iter().all(|d| *d), "{done:?}");
        for g in &got {
            assert_eq!(g.len(), 6);
        }
        let steps = h.steps.lock().unwrap();
        let mut fed = 0;
        for s in steps.iter() {
            let n: usize = s.iter().map(|r| r.1).sum();
            assert!(n <= 16, "a step of {n} tokens over the budget of 16: {s:?}");
            fed += n;
        }
        // Every prompt token once, and every generated token but the last fed back once.
        assert_eq!(fed, prompts.iter().sum::<usize>() + prompts.len() * 5);
        assert_eq!(h.in_flight.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_long_prompt_gets_its_first_token_while_short_requests_keep_streaming() {
        // Three short requests decode; a 200-token prompt arrives. Decode rows take 3 of the
        // 16-token budget, so the prompt gets 13 a step (or the long-prefill threshold, when
        // lower): its first token within ceil(200 / 13) steps, and every short request
        // still gets one token every step meanwhile.
        for threshold in [0usize, 8] {
            let mut h = Harness::new(4, 16, 100_000);
            h.engine.cfg.long_prefill_token_threshold = threshold;
            let mut shorts: Vec<_> = (0..3).map(|i| h.submit(2, i * 7, 1000)).collect();
            let mut got = vec![Vec::new(); 3];
            for _ in 0..3 {
                h.tick();
            }
            for (rx, g) in shorts.iter_mut().zip(&mut got) {
                drain(rx, g);
                assert_eq!(g.len(), 3);
            }
            let mut long = h.submit(200, 11, 4);
            let mut long_got = Vec::new();
            let mut first_at = None;
            for step in 1..=40 {
                h.tick();
                for (rx, g) in shorts.iter_mut().zip(&mut got) {
                    let before = g.len();
                    drain(rx, g);
                    assert_eq!(g.len(), before + 1, "a short request missed step {step}");
                }
                drain(&mut long, &mut long_got);
                if !long_got.is_empty() {
                    first_at = Some(step);
                    break;
                }
            }
            let first_at = first_at.expect("the long prompt never got its first token");
            let per_step = match threshold {
                0 => 16 - 3,
                t => t.min(16 - 3),
            };
            assert!(
                first_at <= 200usize.div_ceil(per_step),
                "threshold {threshold}: first token at step {first_at}"
            );
        }
    }

    #[test]
    fn a_flood_of_short_requests_does_not_starve_a_waiting_long_one() {
        // KV for 240 positions: two short requests (24 and 44 positions) run; a long one
        // (210) waits. When the first short ends a slot is free but the KV is not (196 left),
        // and short requests that keep arriving would fit: admission is first come, first
        // served, so none of them takes the room before the long one, which runs as soon as
        // the second short ends.
        let mut h = Harness::new(2, 64, 240);
        let mut rxs = vec![h.submit(4, 1, 20), h.submit(4, 2, 40)];
        h.tick();
        let mut long = h.submit(200, 3, 10);
        let mut long_got = Vec::new();
        let mut later = Vec::new();
        let mut admitted_at = None;
        let mut first_token_at = None;
        for step in 0..200 {
            // A new short request every step.
            later.push(h.submit(4, 10 + step as u32 % 40, 20));
            h.tick();
            let firsts = h.running_firsts();
            if admitted_at.is_none() {
                if firsts.contains(&3) {
                    admitted_at = Some(step);
                } else {
                    // Until the long one is in, no short that came after it runs.
                    assert!(
                        firsts.iter().all(|f| *f == 1 || *f == 2),
                        "a later request overtook the long one at step {step}: {firsts:?}"
                    );
                }
            }
            drain(&mut long, &mut long_got);
            if !long_got.is_empty() {
                first_token_at = Some(step);
                break;
            }
            for rx in &mut rxs {
                drain(rx, &mut Vec::new());
            }
        }
        let admitted_at = admitted_at.expect("the long request was never admitted");
        // The second short ends after 40 tokens (its prefill step and 39 decode steps).
        assert!(admitted_at <= 40, "admitted at step {admitted_at}");
        let first = first_token_at.expect("the long request never got its first token");
        // 200 prompt tokens at 63 or more a step (one decode row beside it at most).
        assert!(first <= admitted_at + 4, "first token at step {first}");
    }

    #[test]
    fn a_cancelled_request_frees_its_slot_before_the_next_step() {
        let mut h = Harness::new(4, 16, 100_000);
        let mut a = h.submit(3, 1, 1000);
        let b = h.submit(3, 2, 1000);
        for _ in 0..3 {
            h.tick();
        }
        drain(&mut a, &mut Vec::new());
        assert_eq!(h.live(), 2);
        assert_eq!(h.in_flight.load(Ordering::SeqCst), 2);
        // Running request gone: the very next iteration frees it before its step runs.
        drop(b);
        let before = h.steps.lock().unwrap().len();
        h.tick();
        assert_eq!(h.live(), 1);
        assert_eq!(h.in_flight.load(Ordering::SeqCst), 1);
        let steps = h.steps.lock().unwrap();
        assert_eq!(steps.len(), before + 1);
        assert_eq!(
            steps[before].len(),
            1,
            "the cancelled row was not in the step"
        );
        drop(steps);
        // A waiting request gone (the batch is full) leaves the queue at the next iteration.
        let mut h = Harness::new(1, 16, 100_000);
        let _a = h.submit(3, 1, 1000);
        let c = h.submit(3, 2, 1000);
        h.tick();
        assert_eq!(h.engine.waiting.len(), 1);
        let gauge =
            |n: u32| format!("vllm:num_requests_waiting{{model_name=\"t\",engine=\"0\"}} {n}\n");
        assert!(h.engine.metrics.render().contains(&gauge(1)));
        drop(c);
        h.tick();
        assert!(h.engine.waiting.is_empty());
        assert_eq!(h.in_flight.load(Ordering::SeqCst), 1);
        assert!(h.engine.metrics.render().contains(&gauge(0)));
    }

    /// A real backend that records its steps as the Recorder does.
    struct Spy {
        inner: Box<dyn ModelBackend>,
        steps: Steps,
    }

    impl ModelBackend for Spy {
        fn config(&self) -> &ModelConfig {
            self.inner.config()
        }
        fn name(&self) -> String {
            self.inner.name()
        }
        fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
            self.inner.alloc_seq(max_tokens)
        }
        fn free_seq(&mut self, seq: SeqId) {
            self.inner.free_seq(seq);
        }
        fn alloc_cached(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
            self.inner.alloc_cached(prompt, max_tokens)
        }
        fn set_prefix_caching(&mut self, on: bool) {
            self.inner.set_prefix_caching(on);
        }
        fn cached_prefix(&self, prompt: &[u32]) -> usize {
            self.inner.cached_prefix(prompt)
        }
        fn can_fork(&self) -> bool {
            self.inner.can_fork()
        }
        fn fork_seq(&mut self, src: SeqId, len: usize, max_tokens: usize) -> Option<SeqId> {
            self.inner.fork_seq(src, len, max_tokens)
        }
        fn grows_on_demand(&self) -> bool {
            self.inner.grows_on_demand()
        }
        fn grow_seq(&mut self, seq: SeqId, len: usize) -> bool {
            self.inner.grow_seq(seq, len)
        }
        fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
            self.steps
                .lock()
                .unwrap()
                .push(batch.iter().map(|b| (b.seq, b.tokens.len())).collect());
            self.inner.forward(batch)
        }
    }

    /// One request's outcome: its greedy tokens and the prompt tokens found cached.
    #[derive(Debug, Clone, PartialEq)]
    struct Outcome {
        tokens: Vec<u32>,
        cached: usize,
    }

    /// Submit `prompts` together (each for `max_tokens` greedy tokens) and run the engine
    /// until all have ended.
    fn run_wave(h: &mut Harness, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Outcome> {
        let mut rxs: Vec<_> = prompts
            .iter()
            .map(|p| h.submit_prompt(p.clone(), max_tokens))
            .collect();
        let mut out = vec![
            Outcome {
                tokens: Vec::new(),
                cached: 0
            };
            prompts.len()
        ];
        let mut done = vec![false; prompts.len()];
        for _ in 0..500 {
            h.tick();
            for ((rx, o), d) in rxs.iter_mut().zip(&mut out).zip(&mut done) {
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        GenEvent::Cached(n) => o.cached = n,
                        GenEvent::Prompt(_) => {}
                        GenEvent::Token(s) => o.tokens.push(s.token),
                        GenEvent::Done(_) => *d = true,
                        GenEvent::Error(e) => panic!("request failed: {e}"),
                    }
                }
            }
            if done.iter().all(|d| *d) {
                return out;
            }
        }
        panic!("the wave did not end: {out:?}");
    }

    /// The tiny synthetic model on the CPU behind a spy, in an engine with a step budget
    /// of 16 tokens and `kv_tokens` KV positions.
    fn tiny_harness(kv_tokens: usize, prefix_caching: bool) -> Harness {
        tiny_harness_with(kv_tokens, prefix_caching, false)
    }

    /// [`tiny_harness`] with the backend reserving KV as sequences grow or not.
    fn tiny_harness_with(kv_tokens: usize, prefix_caching: bool, on_demand: bool) -> Harness {
        let steps = Steps::default();
        let mut be = crate::engine::cpu::CpuBackend::new(
            crate::engine::synthetic::build("tiny", 0).unwrap(),
            kv_tokens,
        );
        be.set_on_demand(on_demand);
        let spy = Spy {
            inner: Box::new(be),
            steps: steps.clone(),
        };
        Harness::over(Box::new(spy), steps, 3, 16, kv_tokens, prefix_caching)
    }

    /// The engine over the same backend with prefix caching switched (its kept caches go
    /// when it is switched off).
    fn switched(h: Harness, prefix_caching: bool) -> Harness {
        let kv = h.engine.cfg.kv_cache_tokens;
        let steps = h.steps.clone();
        h.steps.lock().unwrap().clear();
        Harness::over(h.engine.backend, steps, 3, 16, kv, prefix_caching)
    }

    fn ids(range: std::ops::Range<u32>) -> Vec<u32> {
        range.map(|k| 1000 + 13 * k).collect()
    }

    /// Every step within the 16-token budget, and every token fed exactly once: the
    /// prompts less what was cached, and every generated token but the last.
    fn check_steps(h: &Harness, prompts: &[Vec<u32>], outs: &[Outcome]) {
        let steps = h.steps.lock().unwrap();
        for s in steps.iter() {
            let n: usize = s.iter().map(|r| r.1).sum();
            assert!(n <= 16, "a step of {n} tokens over the budget of 16: {s:?}");
        }
        let fed: usize = steps.iter().flatten().map(|r| r.1).sum();
        let want: usize = prompts
            .iter()
            .zip(outs)
            .map(|(p, o)| p.len() - o.cached + o.tokens.len() - 1)
            .sum();
        assert_eq!(fed, want);
    }

    /// Requests one after another and side by side, with and without prefix caching: the
    /// same greedy tokens, and with caching the prompt tokens that a free slot holds are
    /// neither fed again nor recomputed.
    #[test]
    fn prefix_reuse_gives_the_greedy_tokens_of_a_full_prefill() {
        // Waves of requests; a later wave may extend an earlier answer (a chat's next turn).
        fn waves(h: &mut Harness) -> (Vec<Vec<u32>>, Vec<Outcome>) {
            let mut prompts = Vec::new();
            let mut outs = Vec::new();
            let mut wave = |h: &mut Harness, ps: Vec<Vec<u32>>| {
                let o = run_wave(h, &ps, 2);
                prompts.extend(ps);
                outs.extend(o.clone());
                o
            };
            let p1 = ids(0..24);
            let first = wave(h, vec![p1.clone()]);
            // The same prompt again.
            wave(h, vec![p1.clone()]);
            // The next turn: the whole first exchange and a new message.
            let turn2: Vec<u32> = p1
                .iter()
                .chain(&first[0].tokens)
                .copied()
                .chain(ids(40..46))
                .collect();
            wave(h, vec![turn2.clone()]);
            // Diverging from p1 after 12 tokens.
            let fork: Vec<u32> = p1[..12].iter().copied().chain(ids(60..70)).collect();
            wave(h, vec![fork.clone()]);
            // Side by side: the fork again, something new, and the second turn again; then
            // once more, a new prompt last.
            wave(h, vec![fork.clone(), ids(80..110), turn2.clone()]);
            wave(h, vec![fork, turn2, ids(200..220)]);
            (prompts, outs)
        }
        let mut h = tiny_harness(4096, false);
        let (prompts, off) = waves(&mut h);
        check_steps(&h, &prompts, &off);
        assert!(off.iter().all(|o| o.cached == 0));
        let mut h = switched(h, true);
        let (_, on) = waves(&mut h);
        check_steps(&h, &prompts, &on);
        for (i, (a, b)) in off.iter().zip(&on).enumerate() {
            assert_eq!(
                a.tokens, b.tokens,
                "request {i}: greedy tokens differ with reuse"
            );
        }
        // What each found: nothing at first (no slot was free); the whole prompt but its
        // last token; the first turn and the generated token fed back (the second was never
        // fed); the 12 shared tokens; side by side, admitted in order: the fork's
        // slot, then no free slot left — the new prompt starts empty, and the second turn
        // copies the 12 tokens it shares with the fork, which holds its slot's 21 already;
        // then each prompt its own slot, and the new prompt last overwrites the one left (it
        // shares nothing).
        let cached: Vec<usize> = on.iter().map(|o| o.cached).collect();
        assert_eq!(cached, [0, 23, 25, 12, 21, 0, 12, 21, 31, 0]);
        let m = h.engine.metrics.render();
        let total: usize = prompts.iter().map(Vec::len).sum();
        assert!(
            m.contains(&format!(
                "vllm:prefix_cache_queries_total{{model_name=\"t\",engine=\"0\"}} {total}\n"
            )),
            "{m}"
        );
        let hits: usize = cached.iter().sum();
        assert!(
            m.contains(&format!(
                "vllm:prefix_cache_hits_total{{model_name=\"t\",engine=\"0\"}} {hits}\n"
            )),
            "{m}"
        );
        // Prompt tokens are counted whole, cached ones included, as vLLM counts them.
        assert!(
            m.contains(&format!(
                "vllm:prompt_tokens_total{{model_name=\"t\",engine=\"0\"}} {total}\n"
            )),
            "{m}"
        );
    }

    /// Kept slots share the KV budget: a prompt that needs the room evicts them, and what
    /// follows computes from scratch with the same greedy tokens.
    #[test]
    fn slots_evicted_under_kv_pressure_leave_greedy_tokens_unchanged() {
        // a and b side by side (32 positions each), then c (52), then b again.
        fn waves(h: &mut Harness) -> Vec<Outcome> {
            let mut outs = run_wave(h, &[ids(0..30), ids(100..130)], 2);
            outs.extend(run_wave(h, &[ids(200..250)], 2));
            outs.extend(run_wave(h, &[ids(100..130)], 2));
            outs
        }
        // 80 positions: a's slot (freed first, the least recently used) is overwritten by c,
        // and b's (31 kept positions) must go too, for 52 + 31 > 80.
        let mut h = tiny_harness(80, false);
        let off = waves(&mut h);
        let mut h = switched(h, true);
        let tight = waves(&mut h);
        // Roomy: b's slot survives c, and b's second run takes all but its last token.
        let mut h = tiny_harness(4096, true);
        let roomy = waves(&mut h);
        let cached = |o: &[Outcome]| o.iter().map(|o| o.cached).collect::<Vec<_>>();
        assert_eq!(cached(&tight), [0, 0, 0, 0]);
        assert_eq!(cached(&roomy), [0, 0, 0, 29]);
        for (i, ((a, b), c)) in off.iter().zip(&tight).zip(&roomy).enumerate() {
            assert_eq!(
                a.tokens, b.tokens,
                "request {i}: tokens differ after eviction"
            );
            assert_eq!(a.tokens, c.tokens, "request {i}: tokens differ with reuse");
        }
    }

    /// With prefix caching, a request arriving while another runs with the same first 30
    /// prompt tokens already fed copies their KV from it (no free slot holds them) and
    /// computes only the rest; its greedy tokens are those of a full prefill, and a request
    /// sharing more with a free slot than with anything running takes the slot instead.
    #[test]
    fn a_request_copies_the_prefix_a_running_one_has_fed() {
        let shared = ids(0..30);
        let a: Vec<u32> = shared.iter().copied().chain(ids(40..50)).collect();
        let b: Vec<u32> = shared.iter().copied().chain(ids(60..66)).collect();
        let mut h = tiny_harness(4096, true);
        let mut rx_a = h.submit_prompt(a.clone(), 20);
        // a's 40 prompt tokens go in 16 a step: after three steps it is decoding.
        for _ in 0..3 {
            h.tick();
        }
        let mut got_a = Vec::new();
        assert!(!drain(&mut rx_a, &mut got_a) && !got_a.is_empty());
        let out = run_wave(&mut h, std::slice::from_ref(&b), 4);
        assert_eq!(out[0].cached, 30, "b did not copy the running prefix");
        let mut alone = tiny_harness(4096, false);
        let want = run_wave(&mut alone, std::slice::from_ref(&b), 4);
        assert_eq!(
            out[0].tokens, want[0].tokens,
            "greedy tokens differ after the copy"
        );
        // Once a has ended its slot is free and holds all 40 of its prompt (and more): a
        // request repeating a's prompt takes that slot (39 tokens, the last recomputed),
        // while a copy from b (still running below) could give only 30.
        while !drain(&mut rx_a, &mut got_a) {
            h.tick();
        }
        let mut rx_b = h.submit_prompt(b.clone(), 30);
        h.tick();
        let out = run_wave(&mut h, std::slice::from_ref(&a), 2);
        assert_eq!(out[0].cached, 39);
        let mut got_b = Vec::new();
        while !drain(&mut rx_b, &mut got_b) {
            h.tick();
        }
    }

    /// With KV reserved as sequences grow, three requests that together outgrow the cache
    /// are admitted at once; when a step needs room that is not there, the request admitted
    /// last is pre-empted and later recomputes its prompt and generated tokens. Every
    /// request still gets the greedy tokens of a run with room to spare, with prefix
    /// caching off and on (on, a pre-empted request finds its own freed KV).
    #[test]
    fn preemption_recomputes_with_the_same_greedy_tokens() {
        let prompts = [ids(0..20), ids(100..120), ids(200..220)];
        let preemptions = |h: &Harness| {
            let m = h.engine.metrics.render();
            let line = m
                .lines()
                .find(|l| l.starts_with("vllm:num_preemptions_total{"))
                .unwrap_or_else(|| panic!("no preemption counter in {m}"));
            line.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let mut roomy = tiny_harness_with(4096, false, true);
        let want = run_wave(&mut roomy, &prompts, 30);
        assert_eq!(preemptions(&roomy), 0);
        for prefix_caching in [false, true] {
            // 3 × (20 + 30) positions wanted, 110 there: all three start (60 prompt
            // positions), and from the 17th step on one has to give way.
            let mut h = tiny_harness_with(110, prefix_caching, true);
            let got = run_wave(&mut h, &prompts, 30);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a.tokens, b.tokens,
                    "request {i}: greedy tokens differ after pre-emption (prefix caching \
                     {prefix_caching})"
                );
            }
            // One: the third gives way once, and is admitted again only when its input and
            // a step of growth for every running request fit.
            assert_eq!(preemptions(&h), 1);
            for s in h.steps.lock().unwrap().iter() {
                let n: usize = s.iter().map(|r| r.1).sum();
                assert!(n <= 16, "a step of {n} tokens over the budget of 16: {s:?}");
            }
            assert!(h.engine.preempted.is_empty() && h.engine.running.is_empty());
            let m = h.engine.metrics.render();
            // Recomputed prompt tokens are not counted again.
            assert!(
                m.contains("vllm:prompt_tokens_total{model_name=\"t\",engine=\"0\"} 60\n"),
                "{m}"
            );
        }
    }

    /// With KV reserved as sequences grow, a request that could not finish even with the
    /// whole cache is refused at admission, before any of its tokens are sent.
    #[test]
    fn a_request_larger_than_the_whole_cache_is_refused_before_it_starts() {
        let mut h = tiny_harness_with(40, false, true);
        let mut rx = h.submit_prompt(ids(0..20), 30);
        h.tick();
        match rx.try_recv() {
            Ok(GenEvent::Error(e)) => assert!(e.contains("cannot hold 50 positions"), "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // One that fits runs.
        let out = run_wave(&mut h, &[ids(0..20)], 20);
        assert_eq!(out[0].tokens.len(), 20);
    }

    /// A backend that claims a whole prompt as cached breaks `alloc_cached`'s contract: that
    /// request gets an error saying so and its slot is freed at once, so the next request
    /// (which needs the same KV room) runs.
    #[test]
    fn a_backend_claiming_a_whole_prompt_cached_fails_only_that_request() {
        struct Claims(Recorder);
        impl ModelBackend for Claims {
            fn config(&self) -> &ModelConfig {
                self.0.config()
            }
            fn name(&self) -> String {
                "claims".into()
            }
            fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
                self.0.alloc_seq(max_tokens)
            }
            fn free_seq(&mut self, seq: SeqId) {
                self.0.free_seq(seq);
            }
            fn alloc_cached(
                &mut self,
                prompt: &[u32],
                max_tokens: usize,
            ) -> Option<(SeqId, usize)> {
                let s = self.0.alloc_seq(max_tokens)?;
                Some((s, if prompt.len() == 5 { 5 } else { 0 }))
            }
            fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
                self.0.forward(batch)
            }
        }
        let steps = Steps::default();
        let mut cfg = crate::engine::synthetic::config("tiny").unwrap();
        cfg.vocab_size = VOCAB;
        let backend = Claims(Recorder {
            cfg,
            kv_budget: 10,
            reserved: HashMap::new(),
            next: 0,
            steps: steps.clone(),
        });
        let mut h = Harness::over(Box::new(backend), steps, 4, 16, 10, true);
        let mut bad = h.submit(5, 1, 3);
        let mut good = h.submit(7, 2, 3);
        let mut got = Vec::new();
        let mut done = false;
        for _ in 0..10 {
            h.tick();
            done |= drain(&mut good, &mut got);
        }
        assert!(done && got.len() == 3, "{got:?}");
        match bad.try_recv() {
            Ok(GenEvent::Error(e)) => {
                assert!(e.contains("5 cached tokens of a 5-token prompt"), "{e}");
                assert!(e.contains("--no-enable-prefix-caching"), "{e}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
        assert_eq!(h.in_flight.load(Ordering::SeqCst), 0);
    }
}

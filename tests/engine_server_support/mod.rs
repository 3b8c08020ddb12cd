//! Test doubles and helpers for `tests/engine_server.rs`: a scripted backend (stands in for
//! the model, which is outside the server under test) and a real server on 127.0.0.1.

use mxtune::engine::backend::{ModelBackend, SeqId, SeqStep};
use mxtune::engine::config::ModelConfig;
use mxtune::engine::server::Server;
pub use mxtune::engine::server::ServerOptions;
use mxtune::engine::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The answer the scripted model gives to chat prompts (greedy).
pub const SCRIPT: &str = "<|channel|>analysis<|message|>Let me think 🌍.<|end|><|start|>assistant<|channel|>final<|message|>Hello there, friend!<|return|>";

/// An answer that calls a function, in the header form the model writes.
pub const TOOL_SCRIPT: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Paris\", \"days\": 2}<|call|>";

/// A gpt-oss-shaped config with the real vocabulary (only sizes the server reads matter).
pub fn config() -> ModelConfig {
    ModelConfig {
        num_hidden_layers: 2,
        hidden_size: 64,
        head_dim: 64,
        num_attention_heads: 1,
        num_key_value_heads: 1,
        num_local_experts: 4,
        num_experts_per_tok: 2,
        intermediate_size: 64,
        vocab_size: 201_088,
        sliding_window: 128,
        layer_is_sliding: vec![true, false],
        rope_theta: 150_000.0,
        rope_scaling_factor: 32.0,
        rope_original_max_position: 4096,
        rope_beta_fast: 32.0,
        rope_beta_slow: 1.0,
        max_position_embeddings: 131_072,
        rms_norm_eps: 1e-5,
        swiglu_limit: 7.0,
        eos_token_id: 200_002,
        pad_token_id: 199_999,
    }
}

/// What the test can observe and steer inside the scripted backend.
#[derive(Default)]
pub struct Probe {
    /// Live KV slots.
    pub live: AtomicUsize,
    /// Largest batch one forward call received.
    pub max_batch: AtomicUsize,
    /// While true, `forward` blocks (lets a test queue requests deterministically).
    pub gate_closed: Mutex<bool>,
    pub gate: Condvar,
    /// Set once any forward has started.
    pub started: AtomicBool,
    /// The next forward returns an error.
    pub fail_next: AtomicBool,
    /// The next forward panics (kills the engine thread).
    pub panic_next: AtomicBool,
}

impl Probe {
    pub fn open_gate(&self) {
        *self.gate_closed.lock().unwrap() = false;
        self.gate.notify_all();
    }
}

/// A deterministic stand-in model. For chat prompts (starting with `<|start|>`) it follows
/// `SCRIPT`; otherwise it prefers a chain of plain-text tokens that depends on the history.
pub struct ScriptBackend {
    cfg: ModelConfig,
    script: Vec<u32>,
    seqs: HashMap<SeqId, Vec<u32>>,
    next: u32,
    max_slots: usize,
    delay: std::time::Duration,
    probe: Arc<Probe>,
}

impl ScriptBackend {
    pub fn new(max_slots: usize, delay_ms: u64, probe: Arc<Probe>) -> Self {
        Self::with_script(SCRIPT, max_slots, delay_ms, probe)
    }

    /// A double that answers chat prompts with `script` instead of `SCRIPT`.
    pub fn with_script(script: &str, max_slots: usize, delay_ms: u64, probe: Arc<Probe>) -> Self {
        ScriptBackend {
            cfg: config(),
            script: Tokenizer::o200k_harmony()
                .encode_with_specials(script)
                .unwrap(),
            seqs: HashMap::new(),
            next: 0,
            max_slots,
            delay: std::time::Duration::from_millis(delay_ms),
            probe,
        }
    }
}

/// The eight candidate tokens after `history` and their logits (best first); all are
/// ordinary text tokens in 1000..2000.
pub fn candidates(history: &[u32]) -> Vec<(u32, f32)> {
    let mut h: u64 = 1469598103934665603;
    for &t in history {
        h = (h ^ u64::from(t)).wrapping_mul(1099511628211);
    }
    (0..8u64)
        .map(|j| {
            let tok = 1000 + ((h.rotate_left(j as u32 * 7) ^ j.wrapping_mul(7919)) % 1000) as u32;
            (tok, 3.0 - 0.25 * j as f32)
        })
        .collect()
}

/// The logits the double produces after `history` (pub so tests can compute expectations).
pub fn logits_after(history: &[u32], script: &[u32], vocab: usize) -> Vec<f32> {
    let mut l = vec![-5.0f32; vocab];
    for (t, v) in candidates(history) {
        // Two candidates may collide; keep the larger logit.
        l[t as usize] = l[t as usize].max(v);
    }
    if history.first() == Some(&200006) {
        let k = (0..=script.len().min(history.len()))
            .rev()
            .find(|&k| history.ends_with(&script[..k]))
            .unwrap_or(0);
        l[script[k % script.len()] as usize] = 12.0;
    }
    l
}

impl ModelBackend for ScriptBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn name(&self) -> String {
        "script-double".into()
    }
    fn alloc_seq(&mut self, _max_tokens: usize) -> Option<SeqId> {
        if self.seqs.len() >= self.max_slots {
            return None;
        }
        let id = SeqId(self.next);
        self.next += 1;
        self.seqs.insert(id, Vec::new());
        self.probe.live.store(self.seqs.len(), Ordering::SeqCst);
        Some(id)
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.probe.live.store(self.seqs.len(), Ordering::SeqCst);
    }
    fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.probe.started.store(true, Ordering::SeqCst);
        {
            let mut closed = self.probe.gate_closed.lock().unwrap();
            while *closed {
                closed = self.probe.gate.wait(closed).unwrap();
            }
        }
        if self.probe.fail_next.swap(false, Ordering::SeqCst) {
            anyhow::bail!("injected failure");
        }
        assert!(
            !self.probe.panic_next.swap(false, Ordering::SeqCst),
            "injected panic"
        );
        self.probe
            .max_batch
            .fetch_max(batch.len(), Ordering::SeqCst);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut out = Vec::new();
        for s in batch {
            let h = self
                .seqs
                .get_mut(&s.seq)
                .ok_or_else(|| anyhow::anyhow!("unknown seq {:?}", s.seq))?;
            h.extend_from_slice(s.tokens);
            out.push(logits_after(h, &self.script, self.cfg.vocab_size));
        }
        Ok(out)
    }
}

/// A running server on an ephemeral 127.0.0.1 port.
pub struct TestServer {
    pub base: String,
    pub probe: Arc<Probe>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn options() -> ServerOptions {
    ServerOptions {
        served_model_name: "double".into(),
        max_model_len: 2048,
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        kv_cache_tokens: 4 * 2048,
        api_key: None,
        max_request_bytes: mxtune::engine::server::DEFAULT_MAX_REQUEST_BYTES,
        weights: mxtune::engine::server::WeightsOrigin::Checkpoint,
        step_log: None,
        long_prefill_token_threshold: 0,
        max_waiting_queue_length: 0,
        enable_prefix_caching: false,
    }
}

pub async fn start(opts: ServerOptions, max_slots: usize, delay_ms: u64) -> TestServer {
    start_with_probe(opts, max_slots, delay_ms, Arc::new(Probe::default())).await
}

pub async fn start_with_probe(
    opts: ServerOptions,
    max_slots: usize,
    delay_ms: u64,
    probe: Arc<Probe>,
) -> TestServer {
    serve_backend(
        Box::new(ScriptBackend::new(max_slots, delay_ms, probe.clone())),
        opts,
        probe,
    )
    .await
}

/// A server whose double answers chat prompts with `script`.
pub async fn start_with_script(script: &str) -> TestServer {
    let probe = Arc::new(Probe::default());
    serve_backend(
        Box::new(ScriptBackend::with_script(script, 8, 0, probe.clone())),
        options(),
        probe,
    )
    .await
}

/// A real backend behind the probe's gate: `forward` waits while the gate is closed, so a
/// test can queue requests before the first step and know they run batched.
pub struct Gated {
    pub inner: Box<dyn ModelBackend>,
    pub probe: Arc<Probe>,
}

impl ModelBackend for Gated {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
    fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
        let s = self.inner.alloc_seq(max_tokens)?;
        self.probe.live.fetch_add(1, Ordering::SeqCst);
        Some(s)
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.inner.free_seq(seq);
        self.probe.live.fetch_sub(1, Ordering::SeqCst);
    }
    fn alloc_cached(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        let s = self.inner.alloc_cached(prompt, max_tokens)?;
        self.probe.live.fetch_add(1, Ordering::SeqCst);
        Some(s)
    }
    fn set_prefix_caching(&mut self, on: bool) {
        self.inner.set_prefix_caching(on);
    }
    fn can_fork(&self) -> bool {
        self.inner.can_fork()
    }
    fn fork_seq(&mut self, src: SeqId, len: usize, max_tokens: usize) -> Option<SeqId> {
        let s = self.inner.fork_seq(src, len, max_tokens)?;
        self.probe.live.fetch_add(1, Ordering::SeqCst);
        Some(s)
    }
    fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.probe.started.store(true, Ordering::SeqCst);
        {
            let mut closed = self.probe.gate_closed.lock().unwrap();
            while *closed {
                closed = self.probe.gate.wait(closed).unwrap();
            }
        }
        self.probe
            .max_batch
            .fetch_max(batch.len(), Ordering::SeqCst);
        self.inner.forward(batch)
    }
}

/// A server over `backend` behind `probe`'s gate.
pub async fn start_gated(
    backend: Box<dyn ModelBackend>,
    opts: ServerOptions,
    probe: Arc<Probe>,
) -> TestServer {
    let gated = Gated {
        inner: backend,
        probe: probe.clone(),
    };
    serve_backend(Box::new(gated), opts, probe).await
}

async fn serve_backend(
    backend: Box<dyn ModelBackend>,
    opts: ServerOptions,
    probe: Arc<Probe>,
) -> TestServer {
    let server = Server::new(backend, opts).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    TestServer {
        base,
        probe,
        stop: Some(tx),
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_string())
        .collect()
}

/// Read a gauge/counter value with `model_name` label from Prometheus text.
pub fn metric(text: &str, name_with_labels_prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_with_labels_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Whether python3 with the official `openai` client (and pydantic, which it brings) can be
/// imported; prints why `test` is skipped when not. With `MXTUNE_TEST_OPENAI=require` (CI)
/// a missing client fails the test instead.
pub fn has_python_openai(test: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import openai, pydantic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("MXTUNE_TEST_OPENAI").as_deref() != Ok("require"),
            "{test}: MXTUNE_TEST_OPENAI=require, but python3 cannot import openai and pydantic \
             (pip install openai)"
        );
        eprintln!("SKIPPED {test}: python3 with `openai` not found (pip install openai)");
    }
    ok
}

/// Run a python script with arguments; its stdout (the test fails when it fails).
pub async fn python(script: &'static str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A server over the synthetic tiny model on the CPU backend (random weights, the real
/// vocabulary), served as `tiny`: `seqs` sequences of up to `len` positions, `batched`
/// tokens a step, prefix caching as `caching` says.
pub async fn tiny_cpu_server(seqs: usize, len: usize, batched: usize, caching: bool) -> TestServer {
    let backend = Box::new(mxtune::engine::cpu::CpuBackend::new(
        mxtune::engine::synthetic::build("tiny", 0).unwrap(),
        seqs * len,
    ));
    let opts = ServerOptions {
        served_model_name: "tiny".into(),
        max_model_len: len,
        max_num_seqs: seqs,
        max_num_batched_tokens: batched,
        kv_cache_tokens: seqs * len,
        enable_prefix_caching: caching,
        ..options()
    };
    start_gated(backend, opts, Arc::new(Probe::default())).await
}

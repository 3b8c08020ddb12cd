//! `mxtune serve`: build a backend (checkpoint or synthetic model), print the kernel-path
//! report, and run the OpenAI-compatible server until SIGINT/SIGTERM.

use super::backend::ModelBackend;
use super::cpu::CpuBackend;
use super::cuda::backend::CudaBackend;
use super::cuda::device::Gpu;
use super::cuda::gates::{self as cuda_gates, DecodeGemv, DecodeOptions};
use super::server::{Server, ServerOptions, WeightsOrigin};
use super::weights::Weights;
use super::{loader, synthetic};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use half::bf16;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The GPU when one can be opened, else the CPU (with one log line saying why).
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend.
    Cuda,
}

/// MoE kernel gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MoeKernel {
    Auto,
    Gemv,
    Grouped,
}

/// Activation format gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Activation {
    Bf16,
    Q8,
    Fp8,
}

/// MoE tile gate (grouped kernel only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tile {
    Auto,
    #[value(name = "32x128")]
    T32x128,
    #[value(name = "64x128")]
    T64x128,
    #[value(name = "128x128")]
    T128x128,
}

/// Which layers run in MXFP4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mxfp4Layers {
    #[value(name = "moe")]
    Moe,
    #[value(name = "moe,qkv,o")]
    MoeQkvO,
    #[value(name = "moe,qkv,o,lm_head")]
    All,
}

/// KV-cache element type gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtype {
    Bf16,
    Fp8,
}

/// An on/off gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// The gated paths, with the names the flags table renders.
#[derive(Debug, Clone, Args)]
pub struct Gates {
    /// MoE kernel (CUDA only).
    #[arg(long, value_enum, default_value = "auto")]
    pub moe_kernel: MoeKernel,
    /// Activation format fed to the MoE (CUDA only).
    #[arg(long, value_enum, default_value = "bf16")]
    pub activation: Activation,
    /// MoE tile of the grouped kernel (CUDA only).
    #[arg(long, value_enum, default_value = "auto")]
    pub tile: Tile,
    /// Layers kept in (or quantized at load to) MXFP4 (CUDA only).
    #[arg(long, value_enum, default_value = "moe")]
    pub mxfp4_layers: Mxfp4Layers,
    /// KV-cache element type (CUDA only).
    #[arg(long, value_enum, default_value = "bf16")]
    pub kv_dtype: KvDtype,
    /// Attention sinks; `off` is diagnostic only (gpt-oss produces garbage without them).
    #[arg(long, value_enum, default_value = "on")]
    pub sinks: OnOff,
    /// CUDA graphs for decode steps (CUDA only).
    #[arg(long, value_enum, default_value = "on")]
    pub cuda_graphs: OnOff,
}

/// Arguments of `mxtune serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Checkpoint directory in the HF release layout (config.json + *.safetensors), or a
    /// name (gpt-oss-120b, openai/gpt-oss-120b) looked up under MXTUNE_MODEL_DIR, then in
    /// the Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub).
    #[arg(
        long,
        required_unless_present = "synthetic",
        conflicts_with = "synthetic"
    )]
    pub model: Option<PathBuf>,
    /// Serve a synthetic model with deterministic pseudo-random weights:
    /// gpt-oss-120b, gpt-oss-20b or tiny.
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Seed of the synthetic weights.
    #[arg(long, default_value_t = 0)]
    pub synthetic_seed: u64,
    /// Backend device.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: Device,
    /// Address to bind (127.0.0.1 keeps the server local).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind; 0 picks a free one (the ready line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name for the API (default: the --model path, or `synthetic-<NAME>`).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most positions (prompt + output) per request (default: the model's maximum).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Most requests decoded together.
    #[arg(long, default_value_t = 8)]
    pub max_num_seqs: usize,
    /// Most tokens per engine step; longer prompts are prefilled in chunks. Default as
    /// vLLM's API server: 8192 on a GPU of at least 70 GiB other than an A100, else 2048
    /// (and never fewer than --max-num-seqs).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Most prompt tokens one request feeds per step (vLLM's name); 0: as many as
    /// --max-num-batched-tokens leaves. A low value (e.g. 128) bounds how long a long prompt
    /// stalls the requests that are decoding, at the cost of its own time to first token.
    #[arg(long, default_value_t = 0)]
    pub long_prefill_token_threshold: usize,
    /// KV-cache capacity in positions over all requests (default:
    /// max-num-seqs × max-model-len); requests wait for room when it is full.
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Require `Authorization: Bearer <KEY>` on /v1/*.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Largest request body in bytes; a larger one is refused with a 413 JSON error.
    #[arg(long, default_value_t = super::server::DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Write the engine's step timeline to this new file, one JSON line per step (what
    /// the step held, forward and host time); read it with `mxtune engine steps FILE`.
    #[arg(long)]
    pub step_log: Option<PathBuf>,
    /// Most requests that may wait for a place in the batch beyond a full one of
    /// --max-num-seqs; one more is refused at once with a 503 (`waiting_queue_full`) instead
    /// of queueing. 0 = no limit.
    #[arg(long, default_value_t = 0)]
    pub max_waiting_queue_length: usize,
    /// Prefix caching, on by default as in vLLM V1: a request takes the free KV slot holding
    /// the longest prefix of its prompt and prefills only the rest (slot-granular: a finished
    /// request's slot keeps its KV until another request takes it).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off: every request prefills its whole prompt.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    #[command(flatten)]
    pub gates: Gates,
}

impl ServeArgs {
    /// Whether prefix caching is on: the default, unless `--no-enable-prefix-caching` came
    /// last.
    pub fn prefix_caching(&self) -> bool {
        !self.no_enable_prefix_caching
    }
}

/// One reason `mxtune serve` refuses its arguments before it opens a device or reads
/// weights: the options involved and why. The presets' rules report the same list, so a
/// preset the engine would refuse is refused before launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The `mxtune serve` options at fault.
    pub options: Vec<&'static str>,
    /// Why, and what to do.
    pub message: String,
}

/// Parse `mxtune serve`'s options (`argv` without `mxtune serve`).
pub fn parse_args(argv: &[String]) -> std::result::Result<ServeArgs, clap::Error> {
    #[derive(clap::Parser)]
    #[command(name = "mxtune serve")]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }
    use clap::Parser;
    Cli::try_parse_from(std::iter::once("mxtune serve".to_string()).chain(argv.iter().cloned()))
        .map(|c| c.args)
}

/// The step's token budget when `--max-num-batched-tokens` is not given, by the device the
/// engine runs on (`(name, memory in bytes)`, `None` on the CPU): as vLLM's OpenAI server
/// chooses, 8192 on a GPU of at least 70 GiB that is not an A100 (H100, H200, GB10's unified
/// 128 GB) and 2048 elsewhere. A larger budget prefills several prompts in one step, which
/// fills the grouped MoE's expert tiles better (docs/perf.md, run 131: 120b pp512 tg512 at
/// concurrency 16, 970.5 → 989.4 tok/s).
pub fn default_max_num_batched_tokens(device: Option<(&str, usize)>) -> usize {
    const GIB: usize = 1 << 30;
    match device {
        Some((name, mem)) if mem >= 70 * GIB && !name.to_lowercase().contains("a100") => 8192,
        _ => 2048,
    }
}

/// Everything [`prepare`] refuses that the arguments alone decide (no device, no files).
pub fn refusals(args: &ServeArgs) -> Vec<Refusal> {
    let mut out: Vec<Refusal> = CONFLICTS
        .iter()
        .filter(|(hit, _)| hit(&args.gates))
        .map(|(_, why)| Refusal {
            options: vec!["--tile", "--moe-kernel"],
            message: format!("impossible flag combination: {why}"),
        })
        .collect();
    let mut refuse =
        |options: Vec<&'static str>, message: String| out.push(Refusal { options, message });
    let model_max = match &args.synthetic {
        Some(name) => match synthetic::config(name) {
            Ok(cfg) => Some(cfg.max_position_embeddings),
            Err(e) => {
                refuse(vec!["--synthetic"], format!("{e:#}"));
                None
            }
        },
        None => None,
    };
    if let Some(len) = args.max_model_len {
        if len < 2 {
            refuse(
                vec!["--max-model-len"],
                format!(
                    "--max-model-len {len} leaves no room: a request needs at least one prompt \
                     and one generated position; set 2 or more"
                ),
            );
        }
        if let Some(max) = model_max.filter(|m| len > *m) {
            refuse(
                vec!["--max-model-len"],
                format!(
                    "--max-model-len {len} exceeds the model's max_position_embeddings ({max})"
                ),
            );
        }
    }
    if args.max_num_seqs == 0 {
        refuse(
            vec!["--max-num-seqs"],
            "--max-num-seqs must be at least 1".into(),
        );
    }
    if args.max_num_batched_tokens == Some(0) {
        refuse(
            vec!["--max-num-batched-tokens"],
            "--max-num-batched-tokens must be at least 1".into(),
        );
    }
    if let Some(budget) = args.max_num_batched_tokens.filter(|&b| b > 0)
        && args.max_num_seqs > 0
        && budget < args.max_num_seqs
    {
        // Every decoding request feeds one token a step: with fewer tokens a step than
        // requests in the batch, the ones past the budget would never be fed (vLLM refuses
        // the same).
        refuse(
            vec!["--max-num-batched-tokens", "--max-num-seqs"],
            format!(
                "--max-num-batched-tokens {} is below --max-num-seqs {}: a step must hold one \
                 token of every running request; raise --max-num-batched-tokens or lower \
                 --max-num-seqs",
                budget, args.max_num_seqs
            ),
        );
    }
    if args.max_request_bytes == 0 {
        refuse(
            vec!["--max-request-bytes"],
            format!(
                "--max-request-bytes must be at least 1 (the default is {})",
                super::server::DEFAULT_MAX_REQUEST_BYTES
            ),
        );
    }
    out
}

/// A combination of gates no backend can run, as data: (is it this case?, why).
type Conflict = (fn(&Gates) -> bool, &'static str);

const CONFLICTS: &[Conflict] = &[(
    |g| g.tile != Tile::Auto && g.moe_kernel != MoeKernel::Grouped,
    "--tile chooses the tile of the grouped MoE kernel; add --moe-kernel grouped or drop --tile",
)];

/// Which backend serves, for the kernel-path report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

/// The backend chosen for a `--device`: the opened GPU for CUDA, and for `auto` without a
/// usable GPU the reason it fell back to the CPU.
struct Resolved {
    kind: BackendKind,
    gpu: Option<Arc<Gpu>>,
    fallback: Option<String>,
}

/// Open the GPU for `cuda` (an error names what is missing) or try it for `auto`.
fn resolve_device(d: Device, open: impl FnOnce() -> Result<Gpu>) -> Result<Resolved> {
    let cpu = |fallback| Resolved {
        kind: BackendKind::Cpu,
        gpu: None,
        fallback,
    };
    match d {
        Device::Cpu => Ok(cpu(None)),
        Device::Cuda => {
            let g = open().context(
                "--device cuda: the CUDA backend cannot start (use --device cpu, or auto to \
                 fall back to the CPU)",
            )?;
            Ok(Resolved {
                kind: BackendKind::Cuda,
                gpu: Some(Arc::new(g)),
                fallback: None,
            })
        }
        Device::Auto => match open() {
            Ok(g) => Ok(Resolved {
                kind: BackendKind::Cuda,
                gpu: Some(Arc::new(g)),
                fallback: None,
            }),
            Err(e) => Ok(cpu(Some(format!(
                "mxtune serve: --device auto: no usable GPU ({e:#}); falling back to the cpu backend"
            )))),
        },
    }
}

/// Refuse gate combinations that cannot run anywhere.
pub fn check_gates(g: &Gates) -> Result<()> {
    let problems: Vec<&str> = CONFLICTS
        .iter()
        .filter(|(hit, _)| hit(g))
        .map(|(_, why)| *why)
        .collect();
    if !problems.is_empty() {
        bail!("impossible flag combination: {}", problems.join("; "));
    }
    Ok(())
}

/// The CUDA backend's layers in MXFP4 for the `--mxfp4-layers` gate.
pub(crate) fn fp4_layers(m: Mxfp4Layers) -> cuda_gates::Fp4Layers {
    match m {
        Mxfp4Layers::Moe => cuda_gates::Fp4Layers::Moe,
        Mxfp4Layers::MoeQkvO => cuda_gates::Fp4Layers::MoeQkvO,
        Mxfp4Layers::All => cuda_gates::Fp4Layers::All,
    }
}

/// The CUDA backend's KV cache element type for the `--kv-dtype` gate.
fn kv_dtype(k: KvDtype) -> cuda_gates::KvDtype {
    match k {
        KvDtype::Bf16 => cuda_gates::KvDtype::Bf16,
        KvDtype::Fp8 => cuda_gates::KvDtype::Fp8,
    }
}

/// The grouped MoE's tile for the `--tile` gate (`auto`: chosen per prefill pass by the
/// entries an expert, `MoeTile::for_pass`).
pub(crate) fn moe_tile(t: Tile) -> cuda_gates::MoeTile {
    match t {
        Tile::T32x128 => cuda_gates::MoeTile::T32x128,
        Tile::T64x128 => cuda_gates::MoeTile::T64x128,
        Tile::T128x128 => cuda_gates::MoeTile::T128x128,
        Tile::Auto => cuda_gates::MoeTile::Auto,
    }
}

/// The CUDA backend's path for the `--moe-kernel` gate.
fn moe_path(k: MoeKernel) -> cuda_gates::MoePath {
    match k {
        MoeKernel::Auto => cuda_gates::MoePath::Auto,
        MoeKernel::Gemv => cuda_gates::MoePath::Gemv,
        MoeKernel::Grouped => cuda_gates::MoePath::Grouped,
    }
}

/// The CUDA backend's activation format for the `--activation` gate.
pub(crate) fn act_format(a: Activation) -> cuda_gates::ActFormat {
    match a {
        Activation::Bf16 => cuda_gates::ActFormat::Bf16,
        Activation::Q8 => cuda_gates::ActFormat::Q8,
        Activation::Fp8 => cuda_gates::ActFormat::Fp8,
    }
}

/// The `kernel-path activation=` value on CUDA: the format the GEMV MoE takes and that the
/// grouped MoE stays bf16; with `--moe-kernel grouped` no GEMV MoE runs, so an 8-bit choice
/// has no effect and the line says bf16.
fn activation_report(g: &Gates) -> String {
    let f = act_format(g.activation);
    if g.moe_kernel == MoeKernel::Grouped && f != cuda_gates::ActFormat::Bf16 {
        format!(
            "bf16 (grouped MoE; --activation {} reaches only the gemv MoE)",
            f.name()
        )
    } else {
        f.report().into()
    }
}

fn value_name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map_or_else(|| "?".into(), |p| p.get_name().to_string())
}

/// The start-up report: exactly one `kernel-path <key>=<value>` line per gated path, `n/a`
/// where the backend has no such path. The launcher's kernel-path check reads these lines.
pub fn kernel_path_lines(kind: BackendKind, g: &Gates) -> Vec<String> {
    let na = || "n/a".to_string();
    let pairs: [(&str, String); 8] = match kind {
        // The CPU reference has one path per stage; only sinks can be switched.
        BackendKind::Cpu => [
            ("backend", "cpu".into()),
            ("moe_kernel", na()),
            ("activation", na()),
            ("tile", na()),
            ("mxfp4_layers", na()),
            ("kv_dtype", na()),
            ("sinks", value_name(g.sinks)),
            ("cuda_graphs", na()),
        ],
        // Every gate has a CUDA path. `auto` runs decode steps on the
        // GEMV MoE and prompts on the grouped one; the tile is the grouped kernel's (`auto`
        // reports the tile it runs, 128x128).
        BackendKind::Cuda => [
            ("backend", "cuda".into()),
            ("moe_kernel", moe_path(g.moe_kernel).report().into()),
            ("activation", activation_report(g)),
            (
                "tile",
                if g.moe_kernel == MoeKernel::Gemv {
                    na()
                } else {
                    moe_tile(g.tile).name().into()
                },
            ),
            ("mxfp4_layers", fp4_layers(g.mxfp4_layers).report().into()),
            ("kv_dtype", kv_dtype(g.kv_dtype).name().into()),
            ("sinks", value_name(g.sinks)),
            ("cuda_graphs", value_name(g.cuda_graphs)),
        ],
    };
    pairs
        .into_iter()
        .map(|(k, v)| format!("kernel-path {k}={v}"))
        .collect()
}

/// Gates the backend ignores although the operator set them away from the default.
fn ignored_gates(kind: BackendKind, g: &Gates) -> Vec<String> {
    match kind {
        // Every gate applies (the 8-bit activations under `--moe-kernel grouped` are reported
        // as bf16 with their own warning).
        BackendKind::Cuda => Vec::new(),
        BackendKind::Cpu => {
            let mut v = Vec::new();
            if g.moe_kernel != MoeKernel::Auto {
                v.push(format!("--moe-kernel {}", value_name(g.moe_kernel)));
            }
            if g.activation != Activation::Bf16 {
                v.push(format!("--activation {}", value_name(g.activation)));
            }
            if g.tile != Tile::Auto {
                v.push(format!("--tile {}", value_name(g.tile)));
            }
            if g.mxfp4_layers != Mxfp4Layers::Moe {
                v.push(format!("--mxfp4-layers {}", value_name(g.mxfp4_layers)));
            }
            if g.kv_dtype != KvDtype::Bf16 {
                v.push(format!("--kv-dtype {}", value_name(g.kv_dtype)));
            }
            if g.cuda_graphs == OnOff::Off {
                v.push("--cuda-graphs off".into());
            }
            v
        }
    }
}

/// Sinks off: a sink logit of −∞ adds e^−∞ = 0 to every softmax denominator, which is
/// exactly attention without sinks, for any backend that takes these weights.
fn disable_sinks(w: &mut Weights) {
    for layer in &mut w.layers {
        let shape = layer.sinks.shape().to_vec();
        let n = layer.sinks.data().len();
        layer.sinks = super::weights::Tensor::owned(vec![bf16::NEG_INFINITY; n], shape);
    }
}

/// Everything `serve` prepared before binding: the backend and the server's options.
pub struct Prepared {
    /// The backend that will serve.
    pub backend: Box<dyn ModelBackend>,
    /// Server settings resolved from the arguments and the model config.
    pub options: ServerOptions,
    /// Lines to print before the readiness line.
    pub report: Vec<String>,
}

/// Load or build the model and resolve every setting; prints nothing.
pub fn prepare(args: &ServeArgs) -> Result<Prepared> {
    prepare_with(args, || Gpu::open(0))
}

/// [`prepare`] with the GPU opened by `open`, so the device choice can be tested anywhere.
fn prepare_with(args: &ServeArgs, open: impl FnOnce() -> Result<Gpu>) -> Result<Prepared> {
    let refused: Vec<String> = refusals(args).into_iter().map(|r| r.message).collect();
    if !refused.is_empty() {
        bail!("{}", refused.join("; "));
    }
    let located = match &args.model {
        Some(m) => Some(super::locate::locate(
            m,
            &super::locate::Places::from_env(),
        )?),
        None => None,
    };
    let resolved = resolve_device(args.device, open)?;
    // The GPU generates synthetic weights itself; everything else starts on the host.
    let (cfg, source, host) = match (&located, &args.synthetic) {
        (Some(found), None) => {
            let dir = &found.dir;
            let w = loader::load(dir)
                .with_context(|| format!("loading the checkpoint in {}", dir.display()))?;
            (w.config.clone(), w.source.clone(), Some(w))
        }
        (None, Some(name)) if resolved.gpu.is_some() => (
            synthetic::config(name).with_context(|| format!("synthetic model {name}"))?,
            format!("synthetic:{name}"),
            None,
        ),
        (None, Some(name)) => {
            let w = synthetic::build(name, args.synthetic_seed)
                .with_context(|| format!("building synthetic model {name}"))?;
            (w.config.clone(), w.source.clone(), Some(w))
        }
        _ => bail!("give exactly one of --model DIR or --synthetic NAME"),
    };
    let max_model_len = args.max_model_len.unwrap_or(cfg.max_position_embeddings);
    if max_model_len > cfg.max_position_embeddings {
        bail!(
            "--max-model-len {max_model_len} exceeds the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        );
    }
    let max_num_batched_tokens = args.max_num_batched_tokens.unwrap_or_else(|| {
        default_max_num_batched_tokens(resolved.gpu.as_deref().map(|g| (g.name(), g.total_mem())))
            .max(args.max_num_seqs)
    });
    if args.max_num_seqs == 0 || max_num_batched_tokens == 0 {
        bail!("--max-num-seqs and --max-num-batched-tokens must be at least 1");
    }
    if args.max_request_bytes == 0 {
        bail!(
            "--max-request-bytes must be at least 1 (the default is {})",
            super::server::DEFAULT_MAX_REQUEST_BYTES
        );
    }
    let mut kv_tokens = args
        .kv_cache_tokens
        .unwrap_or(args.max_num_seqs.saturating_mul(max_model_len));
    let mut max_num_seqs = args.max_num_seqs;
    // As vLLM refuses to start when max-model-len does not fit its KV cache: a request of the
    // full length could never be served.
    if kv_tokens < max_model_len {
        bail!(
            "--kv-cache-tokens {kv_tokens} is below --max-model-len {max_model_len}: a request of \
             the full length could never be served; raise --kv-cache-tokens or lower \
             --max-model-len"
        );
    }
    if resolved.kind == BackendKind::Cuda {
        // The CUDA cache holds whole max-model-len slots, one per concurrent sequence (at
        // least one: the cache holds max-model-len, checked above).
        let slots = (kv_tokens / max_model_len.max(1)).min(args.max_num_seqs);
        max_num_seqs = slots;
        kv_tokens = slots * max_model_len;
    }
    let served_model_name = match (&args.served_model_name, &args.synthetic, &args.model) {
        (Some(n), _, _) => n.clone(),
        (None, Some(s), _) => format!("synthetic-{s}"),
        (None, None, Some(dir)) => dir.display().to_string(),
        (None, None, None) => bail!("give --model DIR or --synthetic NAME"),
    };
    let mut report = Vec::new();
    if let (Some(m), Some(found)) = (&args.model, &located) {
        report.push(format!(
            "mxtune serve: --model {}: {}, {}",
            m.display(),
            found.dir.display(),
            found.how
        ));
    }
    report.extend(resolved.fallback.clone());
    report.push(format!(
        "mxtune serve: model {source} ({} layers, hidden {}, {} experts top-{}, vocab {}); \
         max-model-len {max_model_len}, max-num-seqs {max_num_seqs}, kv-cache {kv_tokens} positions, \
         max-num-batched-tokens {} a step, long-prefill-token-threshold {}",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_local_experts,
        cfg.num_experts_per_tok,
        cfg.vocab_size,
        match args.max_num_batched_tokens {
            Some(n) => n.to_string(),
            None => format!("{max_num_batched_tokens} (the default for this device)"),
        },
        match args.long_prefill_token_threshold {
            0 => "off".to_string(),
            n => format!("{n} tokens"),
        },
    ));
    report.push(if args.prefix_caching() {
        "mxtune serve: prefix caching on (--enable-prefix-caching): a request reuses the KV of \
         the free slot holding the longest prefix of its prompt (slot-granular, any length)"
            .to_string()
    } else {
        "mxtune serve: prefix caching off (--no-enable-prefix-caching)".to_string()
    });
    report.push(match args.max_waiting_queue_length {
        0 => "mxtune serve: waiting queue unbounded (--max-waiting-queue-length 0)".to_string(),
        n => format!(
            "mxtune serve: waiting queue: at most {n} requests wait beyond a full batch of \
             {max_num_seqs}; one more gets a 503 (--max-waiting-queue-length {n})"
        ),
    });
    if let Some(name) = &args.synthetic {
        report.push(format!(
            "mxtune serve: synthetic model {name} (deterministic pseudo-random weights, seed {}): \
             speeds are real, generated text is meaningless",
            args.synthetic_seed
        ));
    }
    for g in ignored_gates(resolved.kind, &args.gates) {
        report.push(format!(
            "mxtune serve: warning: {g} has no effect on the cpu backend (reported n/a)"
        ));
    }
    if resolved.kind == BackendKind::Cuda
        && args.gates.moe_kernel == MoeKernel::Grouped
        && args.gates.activation != Activation::Bf16
    {
        report.push(format!(
            "mxtune serve: warning: --activation {} has no effect with --moe-kernel grouped \
             (the grouped MoE takes bf16; the 8-bit formats are the gemv MoE's)",
            value_name(args.gates.activation)
        ));
    }
    if args.gates.sinks == OnOff::Off {
        report.push(
            "mxtune serve: warning: sinks off is diagnostic only; gpt-oss output is garbage without them"
                .into(),
        );
    }
    let backend: Box<dyn ModelBackend> = match (resolved.gpu, host) {
        (Some(gpu), host) => {
            let mut dw = match &host {
                Some(w) => super::cuda::weights::upload(&gpu, w)
                    .with_context(|| format!("uploading {source} to the GPU"))?,
                None => super::cuda::weights::synthetic_device(&gpu, &cfg, args.synthetic_seed)
                    .with_context(|| format!("generating {source} on the GPU"))?,
            };
            drop(host);
            let opts = DecodeOptions {
                sinks: args.gates.sinks == OnOff::On,
                kv_dtype: kv_dtype(args.gates.kv_dtype),
                moe: moe_path(args.gates.moe_kernel),
                fp4_layers: fp4_layers(args.gates.mxfp4_layers),
                activation: act_format(args.gates.activation),
                tile: moe_tile(args.gates.tile),
                gemv: DecodeGemv::from_env()?,
            };
            // Here rather than inside the backend, so a refusal is not reported as a failed
            // KV-cache allocation.
            dw.quantize_dense(&gpu, &cfg, opts.fp4_layers)
                .with_context(|| {
                    format!(
                        "quantizing {source} to MXFP4 on the GPU (--mxfp4-layers {})",
                        opts.fp4_layers.report()
                    )
                })?;
            let mut be = CudaBackend::new(
                gpu,
                &cfg,
                dw,
                opts,
                max_num_seqs,
                max_model_len,
                max_num_seqs,
                args.gates.cuda_graphs == OnOff::On,
            )
            .with_context(|| {
                format!(
                    "allocating the KV cache and buffers ({max_num_seqs} slots × \
                     {max_model_len} positions); lower --max-model-len or --max-num-seqs"
                )
            })?;
            be.reserve_prefill(max_num_batched_tokens)
                .with_context(|| {
                    format!(
                        "allocating the prefill pass's buffers ({} rows, --max-num-batched-tokens \
                     {max_num_batched_tokens}); lower --max-num-batched-tokens",
                        max_num_batched_tokens.min(super::cuda::model::PREFILL_ROWS_LIMIT)
                    )
                })?;
            report.push(format!("mxtune serve: {}", be.describe()));
            if let Some(c) = be
                .capture_graphs()
                .context("capturing the decode step's CUDA graphs (--cuda-graphs off skips it)")?
            {
                report.push(format!(
                    "mxtune serve: capturing cuda graphs: {} decode steps in {:.2} s{} (every \
                     batch size up to --max-num-seqs {max_num_seqs}, short and long contexts)",
                    c.graphs,
                    c.seconds,
                    c.host_bytes.map_or(String::new(), |b| format!(
                        ", host memory +{:.0} MiB",
                        b as f64 / (1 << 20) as f64
                    )),
                ));
            }
            Box::new(be)
        }
        (None, Some(mut w)) => {
            if args.gates.sinks == OnOff::Off {
                disable_sinks(&mut w);
            }
            let mut be = CpuBackend::new(w, kv_tokens);
            be.set_on_demand(true);
            report.push(format!(
                "mxtune serve: KV positions reserved as sequences grow: when a step needs more \
                 than the {kv_tokens} positions hold, the request admitted last is pre-empted \
                 and recomputed later (vllm:num_preemptions_total)"
            ));
            Box::new(be)
        }
        (None, None) => bail!("no weights for the cpu backend (a synthetic model was not built)"),
    };
    report.extend(kernel_path_lines(resolved.kind, &args.gates));
    Ok(Prepared {
        backend,
        options: ServerOptions {
            served_model_name,
            max_model_len,
            max_num_seqs,
            max_num_batched_tokens,
            kv_cache_tokens: kv_tokens,
            api_key: args.api_key.clone(),
            max_request_bytes: args.max_request_bytes,
            step_log: args.step_log.clone(),
            long_prefill_token_threshold: args.long_prefill_token_threshold,
            max_waiting_queue_length: args.max_waiting_queue_length,
            enable_prefix_caching: args.prefix_caching(),
            weights: if args.synthetic.is_some() {
                WeightsOrigin::Synthetic
            } else {
                WeightsOrigin::Checkpoint
            },
        },
        report,
    })
}

/// Listen for SIGINT and SIGTERM now, before "ready" is printed, so a signal sent right after
/// readiness stops the server gracefully instead of killing it with the default action.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}

/// Most glibc malloc arenas the server allocates from. glibc gives threads their own arenas
/// (up to 8 per core), each growing to the largest request its threads have handled, so a
/// 16-core server kept growing after its third storm of bad input as new worker threads met
/// the large bodies (docs/perf.md run 136: storm 4 +1.91 and +1.35 MiB with the default, +0.25
/// and +0.07 with 2 arenas).
const MALLOC_ARENAS: i32 = 2;

/// Cap glibc's malloc arenas at [`MALLOC_ARENAS`] before any thread starts, unless
/// `MALLOC_ARENA_MAX` is set (glibc reads that itself, and the operator's choice wins): the
/// report line, or `None` where nothing was changed (set in the environment, or not glibc).
fn cap_malloc_arenas() -> Option<String> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return None;
        }
        // SAFETY: mallopt only sets an allocator parameter; no thread has started yet.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) } == 1;
        ok.then(|| {
            format!(
                "mxtune serve: malloc arenas capped at {MALLOC_ARENAS} (resident memory stays \
                 flat under request storms; MALLOC_ARENA_MAX in the environment overrides)"
            )
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Run `mxtune serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let arenas = cap_malloc_arenas();
    let mut prepared = prepare(&args)?;
    // Beside the other start-up facts, before the kernel-path lines.
    let at = prepared
        .report
        .iter()
        .position(|l| l.starts_with("kernel-path "))
        .unwrap_or(prepared.report.len());
    prepared.report.splice(at..at, arenas);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let server = Server::new(prepared.backend, prepared.options)?;
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| {
                format!(
                    "binding {}:{} (is another server on that port? choose --port)",
                    args.host, args.port
                )
            })?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let shutdown = shutdown_signal()?;
        // stdout may be closed (`mxtune serve | head -1`, or the reader went away later);
        // the server's clients still matter, so that is no reason to stop.
        for line in &prepared.report {
            crate::outln!("{line}");
        }
        crate::outln!("mxtune serve: ready on http://{addr}");
        server.serve(listener, shutdown).await?;
        crate::outln!("mxtune serve: stopped");
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(argv: &[&str]) -> Result<ServeArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn cpu_report_has_every_key_once_in_order() {
        let a = parse(&["--synthetic", "tiny", "--sinks", "off"]).unwrap();
        assert_eq!(
            kernel_path_lines(BackendKind::Cpu, &a.gates),
            vec![
                "kernel-path backend=cpu",
                "kernel-path moe_kernel=n/a",
                "kernel-path activation=n/a",
                "kernel-path tile=n/a",
                "kernel-path mxfp4_layers=n/a",
                "kernel-path kv_dtype=n/a",
                "kernel-path sinks=off",
                "kernel-path cuda_graphs=n/a",
            ]
        );
    }

    #[test]
    fn flag_names_and_values_match_the_flags_table() {
        let a = parse(&[
            "--model",
            "/m",
            "--moe-kernel",
            "grouped",
            "--activation",
            "fp8",
            "--tile",
            "64x128",
            "--mxfp4-layers",
            "moe,qkv,o,lm_head",
            "--kv-dtype",
            "fp8",
            "--sinks",
            "on",
            "--cuda-graphs",
            "off",
        ])
        .unwrap();
        assert!(check_gates(&a.gates).is_ok());
        assert_eq!(value_name(a.gates.tile), "64x128");
        assert_eq!(value_name(a.gates.mxfp4_layers), "moe,qkv,o,lm_head");
        assert_eq!(ignored_gates(BackendKind::Cpu, &a.gates).len(), 6);
        assert!(parse(&["--model", "/m", "--synthetic", "tiny"]).is_err());
        assert!(parse(&[]).is_err());
        assert!(parse(&["--synthetic", "tiny", "--tile", "32x32"]).is_err());
    }

    fn no_gpu() -> Result<Gpu> {
        bail!("the CUDA driver library was not found (tried [\"libcuda.so\"])")
    }

    #[test]
    fn prefix_caching_is_on_by_default_and_the_last_flag_wins() {
        let on = |argv: &[&str]| {
            let mut all = vec!["--synthetic", "tiny"];
            all.extend_from_slice(argv);
            parse(&all).unwrap().prefix_caching()
        };
        assert!(on(&[]));
        assert!(on(&["--enable-prefix-caching"]));
        assert!(!on(&["--no-enable-prefix-caching"]));
        assert!(!on(&[
            "--enable-prefix-caching",
            "--no-enable-prefix-caching"
        ]));
        assert!(on(&[
            "--no-enable-prefix-caching",
            "--enable-prefix-caching"
        ]));
        assert!(parse(&["--synthetic", "tiny", "--enable-prefix-caching", "yes"]).is_err());
        let a = parse(&["--synthetic", "tiny", "--max-model-len", "64"]).unwrap();
        let p = prepare_with(&a, no_gpu).unwrap();
        assert!(p.options.enable_prefix_caching);
        assert!(
            p.report
                .iter()
                .any(|l| l.starts_with("mxtune serve: prefix caching on (")),
            "{:?}",
            p.report
        );
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--max-model-len",
            "64",
            "--no-enable-prefix-caching",
        ])
        .unwrap();
        let p = prepare_with(&a, no_gpu).unwrap();
        assert!(!p.options.enable_prefix_caching);
        assert!(
            p.report.contains(
                &"mxtune serve: prefix caching off (--no-enable-prefix-caching)".to_string()
            ),
            "{:?}",
            p.report
        );
    }

    #[test]
    fn serving_limits_are_checked_before_start() {
        let a = parse(&["--synthetic", "tiny"]).unwrap();
        assert_eq!(
            a.max_waiting_queue_length, 0,
            "no waiting-queue limit by default"
        );
        assert!(refusals(&a).is_empty());
        let a = parse(&["--synthetic", "tiny", "--max-waiting-queue-length", "4"]).unwrap();
        assert_eq!(a.max_waiting_queue_length, 4);
        assert!(refusals(&a).is_empty());
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "8",
        ])
        .unwrap();
        let r = refusals(&a);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            r[0].options,
            vec!["--max-num-batched-tokens", "--max-num-seqs"]
        );
        assert!(r[0].message.contains("below --max-num-seqs 16"), "{r:?}");
        assert!(parse(&["--synthetic", "tiny", "--max-waiting-queue-length", "-1"]).is_err());
    }

    #[test]
    fn the_default_token_budget_follows_the_device_as_vllm_does() {
        const GIB: usize = 1 << 30;
        assert_eq!(default_max_num_batched_tokens(None), 2048);
        assert_eq!(
            default_max_num_batched_tokens(Some(("NVIDIA H100 80GB HBM3", 80 * GIB))),
            8192
        );
        assert_eq!(
            default_max_num_batched_tokens(Some(("NVIDIA GB10", 119 * GIB))),
            8192
        );
        assert_eq!(
            default_max_num_batched_tokens(Some(("NVIDIA A100-SXM4-80GB", 80 * GIB))),
            2048
        );
        assert_eq!(
            default_max_num_batched_tokens(Some(("NVIDIA L4", 24 * GIB))),
            2048
        );
        let a = parse(&["--synthetic", "tiny"]).unwrap();
        assert_eq!(a.max_num_batched_tokens, None, "resolved per device");
        assert!(refusals(&a).is_empty());
    }

    #[test]
    fn impossible_combinations_are_refused() {
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--tile",
            "64x128",
            "--moe-kernel",
            "gemv",
        ])
        .unwrap();
        let e = check_gates(&a.gates).unwrap_err().to_string();
        assert!(e.contains("--moe-kernel grouped"), "{e}");
    }

    #[test]
    fn cuda_report_has_every_key_once_in_order() {
        let a = parse(&["--synthetic", "tiny", "--cuda-graphs", "off"]).unwrap();
        assert_eq!(
            kernel_path_lines(BackendKind::Cuda, &a.gates),
            vec![
                "kernel-path backend=cuda",
                "kernel-path moe_kernel=gemv+grouped",
                "kernel-path activation=bf16",
                "kernel-path tile=auto",
                "kernel-path mxfp4_layers=moe",
                "kernel-path kv_dtype=bf16",
                "kernel-path sinks=on",
                "kernel-path cuda_graphs=off",
            ]
        );
        assert!(ignored_gates(BackendKind::Cuda, &a.gates).is_empty());
        let a = parse(&["--synthetic", "tiny", "--moe-kernel", "gemv"]).unwrap();
        let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
        assert!(lines.contains(&"kernel-path moe_kernel=gemv".to_string()));
        assert!(lines.contains(&"kernel-path tile=n/a".to_string()));
    }

    #[test]
    fn mxfp4_layers_are_built_on_cuda_and_reported() {
        for (value, layers) in [
            ("moe", cuda_gates::Fp4Layers::Moe),
            ("moe,qkv,o", cuda_gates::Fp4Layers::MoeQkvO),
            ("moe,qkv,o,lm_head", cuda_gates::Fp4Layers::All),
        ] {
            // Alone and beside the other gates: the gates are independent.
            for extra in [
                &[][..],
                &[
                    "--moe-kernel",
                    "grouped",
                    "--cuda-graphs",
                    "off",
                    "--sinks",
                    "off",
                ][..],
                &["--moe-kernel", "gemv"][..],
            ] {
                let mut argv = vec!["--synthetic", "tiny", "--mxfp4-layers", value];
                argv.extend_from_slice(extra);
                let a = parse(&argv).unwrap();
                assert!(check_gates(&a.gates).is_ok());
                assert_eq!(fp4_layers(a.gates.mxfp4_layers), layers);
                let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
                assert_eq!(lines[4], format!("kernel-path mxfp4_layers={value}"));
                assert_eq!(layers.report(), value);
                assert_eq!(lines.len(), 8);
            }
            // The CPU backend has no such path: n/a, with a warning when set.
            let a = parse(&["--synthetic", "tiny", "--mxfp4-layers", value]).unwrap();
            let cpu = kernel_path_lines(BackendKind::Cpu, &a.gates);
            assert_eq!(cpu[4], "kernel-path mxfp4_layers=n/a");
            assert_eq!(
                ignored_gates(BackendKind::Cpu, &a.gates).len(),
                usize::from(value != "moe")
            );
        }
    }

    #[test]
    fn fp8_kv_and_the_128_row_tile_are_built_and_reported() {
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--moe-kernel",
            "grouped",
            "--tile",
            "128x128",
            "--kv-dtype",
            "fp8",
        ])
        .unwrap();
        assert!(check_gates(&a.gates).is_ok());
        let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
        assert!(
            lines.contains(&"kernel-path tile=128x128".to_string()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"kernel-path kv_dtype=fp8".to_string()),
            "{lines:?}"
        );
        assert_eq!(kv_dtype(a.gates.kv_dtype), cuda_gates::KvDtype::Fp8);
        assert_eq!(moe_tile(a.gates.tile), cuda_gates::MoeTile::T128x128);
        // Each gate on its own; auto picks the tile per prefill pass (and reports auto),
        // 64x128 runs the 64-row one.
        let a = parse(&["--synthetic", "tiny", "--kv-dtype", "fp8"]).unwrap();
        let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
        assert!(
            lines.contains(&"kernel-path kv_dtype=fp8".to_string()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"kernel-path tile=auto".to_string()),
            "{lines:?}"
        );
        for (tile, runs) in [
            ("auto", cuda_gates::MoeTile::Auto),
            ("64x128", cuda_gates::MoeTile::T64x128),
        ] {
            let a = parse(&[
                "--synthetic",
                "tiny",
                "--moe-kernel",
                "grouped",
                "--tile",
                tile,
            ])
            .unwrap();
            assert_eq!(moe_tile(a.gates.tile), runs);
            let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
            assert!(
                lines.contains(&format!("kernel-path tile={}", runs.name())),
                "{lines:?}"
            );
            assert!(
                lines.contains(&"kernel-path kv_dtype=bf16".to_string()),
                "{lines:?}"
            );
        }
        // The cpu backend still ignores both (reported n/a, with a warning each).
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--moe-kernel",
            "grouped",
            "--tile",
            "128x128",
            "--kv-dtype",
            "fp8",
        ])
        .unwrap();
        let ignored = ignored_gates(BackendKind::Cpu, &a.gates);
        assert!(
            ignored.contains(&"--tile 128x128".to_string()),
            "{ignored:?}"
        );
        assert!(
            ignored.contains(&"--kv-dtype fp8".to_string()),
            "{ignored:?}"
        );
    }

    #[test]
    fn activation_gate_reaches_the_gemv_moe() {
        for (value, line) in [
            ("bf16", "kernel-path activation=bf16"),
            (
                "q8",
                "kernel-path activation=q8 (gemv MoE; grouped MoE bf16)",
            ),
            (
                "fp8",
                "kernel-path activation=fp8 (gemv MoE; grouped MoE bf16)",
            ),
        ] {
            for moe in ["auto", "gemv"] {
                let a = parse(&[
                    "--synthetic",
                    "tiny",
                    "--activation",
                    value,
                    "--moe-kernel",
                    moe,
                ])
                .unwrap();
                assert!(check_gates(&a.gates).is_ok(), "{value} {moe}");
                let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
                assert!(lines.contains(&line.to_string()), "{lines:?}");
                assert_eq!(act_format(a.gates.activation).name(), value);
            }
        }
        // The grouped MoE takes bf16: with --moe-kernel grouped an 8-bit choice has no effect.
        let a = parse(&[
            "--synthetic",
            "tiny",
            "--activation",
            "q8",
            "--moe-kernel",
            "grouped",
        ])
        .unwrap();
        let lines = kernel_path_lines(BackendKind::Cuda, &a.gates);
        assert!(
            lines.contains(
                &"kernel-path activation=bf16 (grouped MoE; --activation q8 reaches only the \
                  gemv MoE)"
                    .to_string()
            ),
            "{lines:?}"
        );
        // The CPU backend ignores it (reported n/a, with a warning).
        let a = parse(&["--synthetic", "tiny", "--activation", "fp8"]).unwrap();
        assert!(
            kernel_path_lines(BackendKind::Cpu, &a.gates)
                .contains(&"kernel-path activation=n/a".to_string())
        );
        assert_eq!(
            ignored_gates(BackendKind::Cpu, &a.gates),
            vec!["--activation fp8".to_string()]
        );
    }

    #[test]
    fn auto_falls_back_to_cpu_and_cuda_fails_with_the_reason() {
        let r = resolve_device(Device::Auto, no_gpu).unwrap();
        assert_eq!(r.kind, BackendKind::Cpu);
        let why = r.fallback.unwrap();
        assert!(why.contains("CUDA driver library was not found"), "{why}");
        assert!(why.contains("falling back to the cpu backend"), "{why}");
        let r = resolve_device(Device::Cpu, || panic!("opened the GPU")).unwrap();
        assert!(r.fallback.is_none() && r.gpu.is_none());
        let e = format!("{:#}", resolve_device(Device::Cuda, no_gpu).err().unwrap());
        assert!(e.contains("--device cuda"), "{e}");
        assert!(e.contains("CUDA driver library was not found"), "{e}");
        // The whole start-up: one fallback line first, then the cpu report.
        let a = parse(&["--synthetic", "tiny", "--max-model-len", "64"]).unwrap();
        let p = prepare_with(&a, no_gpu).unwrap();
        let falls: Vec<_> = p
            .report
            .iter()
            .filter(|l| l.contains("falling back"))
            .collect();
        assert_eq!(falls.len(), 1, "{:?}", p.report);
        assert!(p.report[0].contains("falling back"), "{:?}", p.report);
        assert!(p.report.contains(&"kernel-path backend=cpu".to_string()));
        assert!(p.backend.name().starts_with("cpu"), "{}", p.backend.name());
    }
}

//! Every vLLM-side name mxtune renders or documents, with where it comes from.
//!
//! The seeds name many knobs; only some exist. Recording the provenance next to the name lets
//! rendering warn about planned-only names and lets `docs/flags.md` say which image knows what.

use serde::Serialize;

/// Where a vLLM/FlashInfer name comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provenance {
    /// Upstream vLLM (or upstream FlashInfer for `FLASHINFER_*`).
    Upstream,
    /// Only in the operators' tuning fork.
    Fork,
    /// In the fork, deprecated and mapped onto a newer name.
    ForkDeprecated,
    /// Named in the plans, never built: an image ignores it.
    Planned,
}

impl Provenance {
    /// The word used in docs and warnings.
    pub const fn as_str(self) -> &'static str {
        match self {
            Provenance::Upstream => "upstream",
            Provenance::Fork => "fork",
            Provenance::ForkDeprecated => "fork-deprecated",
            Provenance::Planned => "planned",
        }
    }
}

/// Whether a name is an environment variable or a command-line flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameKind {
    /// Environment variable.
    Env,
    /// `vllm serve` command-line flag.
    Cli,
}

/// One vLLM-side name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VllmName {
    /// The exact name, e.g. `VLLM_MXFP4_BACKEND` or `--enforce-eager`.
    pub name: &'static str,
    /// Env var or CLI flag.
    pub kind: NameKind,
    /// Upstream, fork, fork-deprecated or planned.
    pub provenance: Provenance,
    /// One line: what it does, or why it is not rendered.
    pub note: &'static str,
}

const fn env(name: &'static str, provenance: Provenance, note: &'static str) -> VllmName {
    VllmName {
        name,
        kind: NameKind::Env,
        provenance,
        note,
    }
}

const fn cli(name: &'static str, provenance: Provenance, note: &'static str) -> VllmName {
    VllmName {
        name,
        kind: NameKind::Cli,
        provenance,
        note,
    }
}

use Provenance::{Fork, ForkDeprecated, Planned, Upstream};

/// Fork: MoE backend selection (auto, MARLIN, CUTLASS, TRITON, TRTLLM, TRTLLM_MXFP8).
pub const VLLM_MXFP4_BACKEND: VllmName = env(
    "VLLM_MXFP4_BACKEND",
    Fork,
    "MoE backend; mxtune renders `moe_backend` through it",
);
/// Fork: CLI twin of `VLLM_MXFP4_BACKEND`.
pub const MXFP4_BACKEND_CLI: VllmName = cli(
    "--mxfp4-backend",
    Fork,
    "CLI twin of VLLM_MXFP4_BACKEND; not rendered (the env var degrades gracefully on upstream images)",
);
/// Fork: legacy kernel selector, mapped onto the backend.
pub const VLLM_MXFP4_MOE_KERNEL: VllmName = env(
    "VLLM_MXFP4_MOE_KERNEL",
    ForkDeprecated,
    "legacy selector (marlin, gemm, gemv, triton); rendered only for moe_backend = gemv, which VLLM_MXFP4_BACKEND lacks",
);
/// Fork: which layers are stored as MXFP4.
pub const MXFP4_LAYERS: VllmName = cli(
    "--mxfp4-layers",
    Fork,
    "layers quantized to MXFP4 at load (moe, qkv, o, lm_head)",
);
/// Fork: attention sink control (auto, true, false).
pub const VLLM_ATTENTION_SINKS: VllmName = env(
    "VLLM_ATTENTION_SINKS",
    Fork,
    "attention sinks auto/true/false; TRITON_ATTN ignores it",
);
/// Fork (FlashInfer): enables the tile override file.
pub const FLASHINFER_DEBUG_TILE_OVERRIDE: VllmName = env(
    "FLASHINFER_DEBUG_TILE_OVERRIDE",
    Fork,
    "set to 1 to make FlashInfer read the MoE tile from /tmp/flashinfer_moe_tile",
);
/// Planned: activation format for the MoE.
pub const VLLM_MXFP4_ACTIVATION: VllmName = env(
    "VLLM_MXFP4_ACTIVATION",
    Planned,
    "activation format for the MoE; never built",
);
/// Planned: MoE tile by env var.
pub const FLASHINFER_MOE_TILE: VllmName = env(
    "FLASHINFER_MOE_TILE",
    Planned,
    "tile by env var; never built (the debug override file is what exists); not rendered",
);
/// Planned: sinks by env var.
pub const VLLM_USE_ATTENTION_SINKS: VllmName = env(
    "VLLM_USE_ATTENTION_SINKS",
    Planned,
    "never built; VLLM_ATTENTION_SINKS is the real name; not rendered",
);
/// Named in the operators' compose files; not a vLLM variable.
pub const VLLM_USE_CUDA_GRAPH: VllmName = env(
    "VLLM_USE_CUDA_GRAPH",
    Planned,
    "in the operators' compose files but read by no vLLM; `--enforce-eager` decides; not rendered",
);
/// Upstream: attention backend.
pub const ATTENTION_BACKEND: VllmName = cli(
    "--attention-backend",
    Upstream,
    "attention backend (TRITON_ATTN, FLASHINFER, FLASH_ATTN)",
);
/// Upstream: attention config JSON.
pub const ATTENTION_CONFIG: VllmName = cli(
    "--attention-config",
    Upstream,
    "attention config as JSON, e.g. {\"backend\": \"TRITON_ATTN\"}; excludes --attention-backend",
);
/// Upstream, deprecated env form of the attention backend.
pub const VLLM_ATTENTION_BACKEND: VllmName = env(
    "VLLM_ATTENTION_BACKEND",
    Upstream,
    "upstream before vLLM 0.13.0 (--attention-backend since): rendered instead of --attention-backend for stock images of older releases",
);
/// Upstream: KV cache dtype.
pub const KV_CACHE_DTYPE: VllmName = cli("--kv-cache-dtype", Upstream, "KV cache element type");
/// Upstream: speculative decoding JSON.
pub const SPECULATIVE_CONFIG: VllmName = cli(
    "--speculative-config",
    Upstream,
    "speculative decoding config as JSON",
);
/// Upstream: disable CUDA graphs.
pub const ENFORCE_EAGER: VllmName = cli("--enforce-eager", Upstream, "run eagerly: no CUDA graphs");
/// Upstream: FlashInfer MoE with BF16 activations (SM100 trtllm-gen).
pub const VLLM_USE_FLASHINFER_MOE_MXFP4_BF16: VllmName = env(
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
    Upstream,
    "upstream: =1 selects FlashInfer MXFP4×BF16 (CUTLASS on SM90, TRT-LLM on SM100), =0 drops both; rendered for moe_backend on upstream images",
);
/// Upstream: FlashInfer MoE with MXFP8 activations (SM100 trtllm-gen).
pub const VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8: VllmName = env(
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
    Upstream,
    "upstream: =1 selects FlashInfer TRT-LLM MXFP4×MXFP8; rendered for moe_backend on upstream images",
);
/// Upstream: FlashInfer CUTLASS MoE with MXFP8 activations.
pub const VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS: VllmName = env(
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
    Upstream,
    "upstream: =1 selects FlashInfer CUTLASS MXFP4×MXFP8; rendered for moe_backend on upstream images",
);
/// Upstream: force Marlin for MXFP4.
pub const VLLM_MXFP4_USE_MARLIN: VllmName = env(
    "VLLM_MXFP4_USE_MARLIN",
    Upstream,
    "upstream: =1 selects Marlin; rendered for moe_backend on upstream images",
);
/// Upstream: compilation options as JSON (CUDA graph mode among them).
pub const COMPILATION_CONFIG: VllmName = cli(
    "--compilation-config",
    Upstream,
    "compilation options as JSON; upstream images get cuda_graphs = off as {\"cudagraph_mode\": \"NONE\"}",
);
/// Upstream: FlashInfer MoE tuning mode.
pub const VLLM_FLASHINFER_MOE_BACKEND: VllmName = env(
    "VLLM_FLASHINFER_MOE_BACKEND",
    Upstream,
    "throughput or latency; in the operators' production compose; set via [container.env]",
);
/// Upstream FlashInfer: log verbosity.
pub const FLASHINFER_LOGLEVEL: VllmName = env(
    "FLASHINFER_LOGLEVEL",
    Upstream,
    "FlashInfer log level 0-5; set via [container.env]",
);
/// Upstream FlashInfer: JIT verbosity.
pub const FLASHINFER_JIT_VERBOSE: VllmName = env(
    "FLASHINFER_JIT_VERBOSE",
    Upstream,
    "show JIT compile output; set via [container.env]",
);
/// Upstream FlashInfer: JIT compile threads.
pub const FLASHINFER_NVCC_THREADS: VllmName = env(
    "FLASHINFER_NVCC_THREADS",
    Upstream,
    "parallel JIT threads; set via [container.env]",
);
/// Upstream FlashInfer: target architectures for JIT.
pub const FLASHINFER_CUDA_ARCH_LIST: VllmName = env(
    "FLASHINFER_CUDA_ARCH_LIST",
    Upstream,
    "JIT target arch, 12.1a / 12.1f on GB10; set via [container.env]",
);
/// Upstream serving flags.
pub const HOST: VllmName = cli("--host", Upstream, "bind address");
/// Upstream serving flag.
pub const PORT: VllmName = cli("--port", Upstream, "API port");
/// Upstream serving flag.
pub const SERVED_MODEL_NAME: VllmName =
    cli("--served-model-name", Upstream, "name listed by /v1/models");
/// Upstream serving flag.
pub const QUANTIZATION: VllmName = cli("--quantization", Upstream, "weight quantization (mxfp4)");
/// Upstream serving flag.
pub const TENSOR_PARALLEL_SIZE: VllmName =
    cli("--tensor-parallel-size", Upstream, "GPUs per model replica");
/// Upstream serving flag.
pub const GPU_MEMORY_UTILIZATION: VllmName = cli(
    "--gpu-memory-utilization",
    Upstream,
    "fraction of GPU memory vLLM may take",
);
/// Upstream serving flag.
pub const MAX_MODEL_LEN: VllmName = cli("--max-model-len", Upstream, "context length limit");
/// Upstream serving flag.
pub const MAX_NUM_SEQS: VllmName = cli("--max-num-seqs", Upstream, "concurrent sequences");
/// Upstream serving flag.
pub const MAX_NUM_BATCHED_TOKENS: VllmName = cli(
    "--max-num-batched-tokens",
    Upstream,
    "tokens per scheduler step",
);
/// Upstream serving flag (chunked prefill's per-request cap).
pub const LONG_PREFILL_TOKEN_THRESHOLD: VllmName = cli(
    "--long-prefill-token-threshold",
    Upstream,
    "most prompt tokens one request feeds per scheduler step",
);
/// Upstream serving flag.
pub const ENABLE_PREFIX_CACHING: VllmName =
    cli("--enable-prefix-caching", Upstream, "prefix caching on");
/// Upstream serving flag.
pub const NO_ENABLE_PREFIX_CACHING: VllmName =
    cli("--no-enable-prefix-caching", Upstream, "prefix caching off");
/// Upstream serving flag.
pub const LOAD_FORMAT: VllmName = cli(
    "--load-format",
    Upstream,
    "weight loader (auto, safetensors, fastsafetensors, …)",
);
/// Upstream serving flag.
pub const ASYNC_SCHEDULING: VllmName = cli(
    "--async-scheduling",
    Upstream,
    "overlap scheduling with execution",
);

/// Every name above, for docs and consistency tests.
pub const ALL: &[&VllmName] = &[
    &VLLM_MXFP4_BACKEND,
    &MXFP4_BACKEND_CLI,
    &VLLM_MXFP4_MOE_KERNEL,
    &MXFP4_LAYERS,
    &VLLM_ATTENTION_SINKS,
    &FLASHINFER_DEBUG_TILE_OVERRIDE,
    &VLLM_MXFP4_ACTIVATION,
    &FLASHINFER_MOE_TILE,
    &VLLM_USE_ATTENTION_SINKS,
    &VLLM_USE_CUDA_GRAPH,
    &ATTENTION_BACKEND,
    &ATTENTION_CONFIG,
    &VLLM_ATTENTION_BACKEND,
    &KV_CACHE_DTYPE,
    &SPECULATIVE_CONFIG,
    &ENFORCE_EAGER,
    &VLLM_USE_FLASHINFER_MOE_MXFP4_BF16,
    &VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8,
    &VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS,
    &VLLM_MXFP4_USE_MARLIN,
    &COMPILATION_CONFIG,
    &VLLM_FLASHINFER_MOE_BACKEND,
    &FLASHINFER_LOGLEVEL,
    &FLASHINFER_JIT_VERBOSE,
    &FLASHINFER_NVCC_THREADS,
    &FLASHINFER_CUDA_ARCH_LIST,
    &HOST,
    &PORT,
    &SERVED_MODEL_NAME,
    &QUANTIZATION,
    &TENSOR_PARALLEL_SIZE,
    &GPU_MEMORY_UTILIZATION,
    &MAX_MODEL_LEN,
    &MAX_NUM_SEQS,
    &MAX_NUM_BATCHED_TOKENS,
    &LONG_PREFILL_TOKEN_THRESHOLD,
    &ENABLE_PREFIX_CACHING,
    &NO_ENABLE_PREFIX_CACHING,
    &LOAD_FORMAT,
    &ASYNC_SCHEDULING,
];

/// Looks a name up in [`ALL`].
pub fn find(name: &str) -> Option<&'static VllmName> {
    ALL.iter().copied().find(|n| n.name == name)
}

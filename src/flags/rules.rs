//! Known incompatibilities as data: one table of rules, evaluated by one function.
//!
//! A rule whose truth depends on the GPU takes the architecture as input; with the
//! architecture unknown it is reported as "may apply" rather than dropped or asserted.

use super::axes::AxisValue;
use super::axes::{
    Activation, AttentionBackend, CudaGraphs, Device, KvCacheDtype, MoeBackend, Mxfp4Layers, Sinks,
    Speculative, Tile,
};
use super::dialect::{Upstream, upstream_moe};
use super::model::{FlagSet, VllmFlavor};
use super::render::choices;
use crate::vocab::{NetworkMode, TargetKind};
use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Blocks the launch.
    Error,
    /// Needs the operator's confirmation.
    Warning,
}

/// Whether a finding certainly applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applies {
    /// The rule applies to this configuration on this GPU.
    Yes,
    /// The rule depends on the GPU architecture, which is unknown.
    MayApply,
}

/// A GPU compute capability, e.g. 12.1 for GB10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuArch {
    /// Major version (12 on GB10).
    pub major: u32,
    /// Minor version (1 on GB10).
    pub minor: u32,
}

impl std::str::FromStr for GpuArch {
    type Err = String;
    /// Accepts `sm121`, `sm_121`, `SM121`, `12.1`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a GPU architecture; write e.g. sm121 or 12.1");
        let t = s.trim().to_ascii_lowercase();
        if let Some((a, b)) = t.split_once('.') {
            return Ok(GpuArch {
                major: a.parse().map_err(|_| bad())?,
                minor: b.parse().map_err(|_| bad())?,
            });
        }
        let digits = t.trim_start_matches("sm").trim_start_matches('_');
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let (a, b) = digits.split_at(digits.len() - 1);
        Ok(GpuArch {
            major: a.parse().map_err(|_| bad())?,
            minor: b.parse().map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for GpuArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm{}{}", self.major, self.minor)
    }
}

/// Which GPUs a rule concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchCond {
    /// Every GPU.
    Any,
    /// SM121 (GB10) exactly.
    Sm121,
    /// Any SM12x (consumer/desktop Blackwell).
    Sm12x,
    /// Every GPU except SM100/SM103 (datacenter Blackwell).
    NotSm10x,
    /// Every GPU except SM90 (Hopper).
    NotSm90,
}

impl ArchCond {
    fn holds(self, a: GpuArch) -> bool {
        match self {
            ArchCond::Any => true,
            ArchCond::Sm121 => a.major == 12 && a.minor == 1,
            ArchCond::Sm12x => a.major == 12,
            ArchCond::NotSm10x => a.major != 10,
            ArchCond::NotSm90 => !(a.major == 9 && a.minor == 0),
        }
    }

    /// Words for docs.
    pub fn describe(self) -> &'static str {
        match self {
            ArchCond::Any => "any GPU",
            ArchCond::Sm121 => "SM121",
            ArchCond::Sm12x => "SM12x",
            ArchCond::NotSm10x => "not SM100/SM103",
            ArchCond::NotSm90 => "not SM90",
        }
    }
}

/// One known incompatibility.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Stable id, e.g. `eagle3-cuda-graphs-sm121`.
    pub id: &'static str,
    /// Error blocks, warning asks.
    pub severity: Severity,
    /// Targets it concerns.
    pub targets: &'static [TargetKind],
    /// GPUs it concerns.
    pub arch: ArchCond,
    /// The preset keys involved (`section.key`), for locating it in a file.
    pub keys: &'static [&'static str],
    /// Why, in the operator's words, and what to do.
    pub reason: &'static str,
    /// Whether the configuration matches.
    pub when: fn(&FlagSet) -> bool,
}

/// One rule that matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Rule id.
    pub rule: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// Certain or dependent on an unknown GPU.
    pub applies: Applies,
    /// Keys involved (`section.key`).
    pub keys: Vec<&'static str>,
    /// What the operator reads.
    pub message: String,
}

impl Finding {
    /// Whether this finding blocks a launch.
    pub fn blocks(&self) -> bool {
        self.severity == Severity::Error && self.applies == Applies::Yes
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let may = if self.applies == Applies::MayApply {
            " (may apply: GPU unknown)"
        } else {
            ""
        };
        write!(f, "{sev}{may} [{}]: {}", self.rule, self.message)
    }
}

const DOCKER: &[TargetKind] = &[TargetKind::Docker];
const ENGINE: &[TargetKind] = &[TargetKind::Engine];
const BOTH: &[TargetKind] = &[TargetKind::Docker, TargetKind::Engine];

/// The attention backend in effect: the axis, or `backend` inside `attention_config`.
pub fn effective_attention(fs: &FlagSet) -> Option<String> {
    if fs.axes.attention_backend != AttentionBackend::Auto {
        return Some(super::axes::AxisValue::as_str(fs.axes.attention_backend).to_string());
    }
    let cfg = fs.axes.attention_config.as_deref()?;
    let v: serde_json::Value = serde_json::from_str(cfg).ok()?;
    v.get("backend")
        .and_then(|b| b.as_str())
        .map(|s| s.to_ascii_uppercase())
}

fn is_trtllm(fs: &FlagSet) -> bool {
    matches!(
        fs.axes.moe_backend,
        MoeBackend::Trtllm | MoeBackend::TrtllmMxfp8
    )
}

/// The rules table.
pub const RULES: &[Rule] = &[
    Rule {
        id: "eagle3-cuda-graphs-sm121",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::Sm121,
        keys: &["axes.speculative", "axes.cuda_graphs"],
        reason: "Eagle3 with CUDA graphs crashed on SM121 (cudaErrorIllegalInstruction during graph replay); set cuda_graphs = \"off\" (--enforce-eager)",
        when: |fs| fs.axes.speculative.is_eagle3() && fs.axes.cuda_graphs == CudaGraphs::On,
    },
    Rule {
        id: "flash-attn-sm12x",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::Sm12x,
        keys: &["axes.attention_backend", "axes.attention_config"],
        reason: "FLASH_ATTN gives garbage for gpt-oss on SM12x (vLLM's FA2 ships SM80 cubins only); use TRITON_ATTN or FLASHINFER",
        when: |fs| effective_attention(fs).as_deref() == Some("FLASH_ATTN"),
    },
    Rule {
        id: "sinks-off-garbage",
        severity: Severity::Warning,
        targets: BOTH,
        arch: ArchCond::Any,
        keys: &["axes.sinks"],
        reason: "gpt-oss needs attention sinks: with sinks off the output is garbage (use only for diagnostics)",
        when: |fs| fs.axes.sinks == Sinks::Off,
    },
    Rule {
        id: "trtllm-sm100-only",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::NotSm10x,
        keys: &["axes.moe_backend"],
        reason: "the trtllm MoE kernels are SM100-only (\"No supported CUDA architectures found for major versions [10]\"); use cutlass or marlin",
        when: is_trtllm,
    },
    Rule {
        id: "tile-needs-cutlass",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.tile", "axes.moe_backend"],
        reason: "the tile override is read only by FlashInfer's CUTLASS MoE GEMM: with another (or an auto-chosen) backend it is ignored; set moe_backend = \"cutlass\"",
        when: |fs| fs.axes.tile != Tile::Auto && fs.axes.moe_backend != MoeBackend::Cutlass,
    },
    Rule {
        id: "tile-needs-grouped",
        severity: Severity::Warning,
        targets: ENGINE,
        arch: ArchCond::Any,
        keys: &["axes.tile", "axes.moe_backend"],
        reason: "the engine's tile applies to the grouped MoE kernel only; gemv ignores it",
        when: |fs| fs.axes.tile != Tile::Auto && fs.axes.moe_backend == MoeBackend::Gemv,
    },
    Rule {
        id: "tile-64x128-needs-fork",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.tile"],
        reason: "M=64 tiles need the fork's SM120 tile expansion; stock FlashInfer hits the TMA layout constraint of the 128-element scale granularity",
        when: |fs| fs.axes.tile == Tile::T64x128,
    },
    Rule {
        id: "attention-backend-and-config",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.attention_backend", "axes.attention_config"],
        reason: "--attention-backend and --attention-config are mutually exclusive; keep one",
        when: |fs| {
            fs.axes.attention_backend != AttentionBackend::Auto
                && fs.axes.attention_config.is_some()
        },
    },
    Rule {
        id: "sinks-ignored-by-triton",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.sinks", "axes.attention_backend"],
        reason: "TRITON_ATTN ignores VLLM_ATTENTION_SINKS and always applies sinks: the sinks setting has no effect",
        when: |fs| {
            fs.axes.sinks != Sinks::Auto
                && effective_attention(fs).as_deref() == Some("TRITON_ATTN")
        },
    },
    Rule {
        id: "trtllm-mxfp8-activation",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.moe_backend", "axes.activation"],
        reason: "trtllm-mxfp8 runs MXFP8 activations; a different activation contradicts it (use auto or mxfp8)",
        when: |fs| {
            fs.axes.moe_backend == MoeBackend::TrtllmMxfp8
                && !matches!(fs.axes.activation, Activation::Auto | Activation::Mxfp8)
        },
    },
    Rule {
        id: "mxfp8-implies-trtllm-mxfp8",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.activation", "axes.moe_backend"],
        reason: "VLLM_MXFP4_ACTIVATION is planned only: in the fork MXFP8 activations come with moe_backend = \"trtllm-mxfp8\" (CUTLASS on SM12x quantizes to FP8 by itself); this activation may not take effect",
        when: |fs| {
            fs.container.vllm == VllmFlavor::Fork
                && fs.axes.activation == Activation::Mxfp8
                && !matches!(
                    fs.axes.moe_backend,
                    MoeBackend::TrtllmMxfp8 | MoeBackend::Cutlass
                )
        },
    },
    Rule {
        id: "upstream-bf16-cutlass-sm90-only",
        severity: Severity::Error,
        targets: DOCKER,
        arch: ArchCond::NotSm90,
        keys: &["axes.moe_backend", "axes.activation", "container.vllm"],
        reason: "on a stock image cutlass with bf16 activations is VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1, which selects CUTLASS only on SM90 (TRT-LLM on SM100, a start-up error elsewhere); use activation = \"mxfp8\"",
        when: |fs| {
            fs.container.vllm == VllmFlavor::Upstream
                && fs.axes.moe_backend == MoeBackend::Cutlass
                && fs.axes.activation == Activation::Bf16
        },
    },
    Rule {
        id: "sinks-sm121-crash",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Sm121,
        keys: &["axes.sinks"],
        reason: "early fork builds crashed in the sink kernel on SM121 (cudaErrorIllegalInstruction); the FlashInfer FA2 sink module fixed it — make sure the image has it",
        when: |fs| fs.axes.sinks == Sinks::On,
    },
    Rule {
        id: "cuda-graphs-mxfp4-sm121",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Sm121,
        keys: &["axes.cuda_graphs", "axes.moe_backend"],
        reason: "CUDA graph capture failed (cudaErrorLaunchFailure) on the MXFP4/MXFP8 kernel path on SM121 in dev builds; if start-up dies at \"Capturing CUDA graphs\", set cuda_graphs = \"off\"",
        when: |fs| {
            fs.axes.cuda_graphs == CudaGraphs::On
                && (matches!(
                    fs.axes.moe_backend,
                    MoeBackend::Cutlass | MoeBackend::TrtllmMxfp8
                ) || fs.axes.activation == Activation::Mxfp8)
        },
    },
    Rule {
        id: "eagle3-flashinfer-needs-fork",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.speculative", "axes.attention_backend"],
        reason: "stock FlashInfer attention asserts when drafter and target layers differ (window_left, sinks); Eagle3 + FLASHINFER needs the fork's per-hyperparameter wrappers",
        when: |fs| {
            fs.axes.speculative.is_eagle3()
                && effective_attention(fs).as_deref() == Some("FLASHINFER")
        },
    },
    Rule {
        id: "ngram-async-scheduling",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["axes.speculative", "serving.async_scheduling"],
        reason: "ngram speculation does not support async scheduling (vLLM falls back to sync) and crashed on repetitive prompts",
        when: |fs| {
            fs.axes.speculative == Speculative::Ngram && fs.serving.async_scheduling == Some(true)
        },
    },
    Rule {
        id: "rdma-needs-host-network",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["container.rdma", "container.network"],
        reason: "two-Spark RDMA runs with network_mode host; in a bridge network the peers cannot reach each other",
        when: |fs| fs.container.rdma && fs.container.network == NetworkMode::Bridge,
    },
    Rule {
        id: "flashinfer-sm12x-needs-fork",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Sm12x,
        keys: &[
            "container.vllm",
            "axes.attention_backend",
            "axes.moe_backend",
        ],
        reason: "upstream FlashInfer has no SM12x JIT targets for these kernels (\"No supported CUDA architectures found for major versions [10]\"); FLASHINFER attention and the CUTLASS MoE need the fork's FlashInfer",
        when: |fs| {
            fs.container.vllm == VllmFlavor::Upstream
                && (effective_attention(fs).as_deref() == Some("FLASHINFER")
                    || fs.axes.moe_backend == MoeBackend::Cutlass)
        },
    },
    Rule {
        id: "cold-jit-cache",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["container.jit_cache", "axes.moe_backend"],
        reason: "no persistent JIT cache: FlashInfer compiles the CUTLASS MoE kernels on every start (3-5 minutes); set container.jit_cache",
        when: |fs| {
            fs.container.jit_cache.is_none()
                && matches!(
                    fs.axes.moe_backend,
                    MoeBackend::Cutlass | MoeBackend::TrtllmMxfp8
                )
        },
    },
    Rule {
        id: "mounted-sources-need-install",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["container.vllm_src", "container.flashinfer_src"],
        reason: "mounted source trees shadow the image's packages via PYTHONPATH; a fresh container lacks their compiled extensions until they are installed from the mounts (pip install -e)",
        when: |fs| fs.container.vllm_src.is_some() || fs.container.flashinfer_src.is_some(),
    },
    Rule {
        id: "waiting-queue-limit-engine-only",
        severity: Severity::Warning,
        targets: DOCKER,
        arch: ArchCond::Any,
        keys: &["serving.max_waiting_queue_length"],
        reason: "vLLM has no limit on waiting requests alone, so serving.max_waiting_queue_length is not rendered for it and its queue stays unbounded (vLLM 0.29's --max-num-queued-reqs caps waiting + running requests); the setting applies to the bundled engine",
        when: |fs| fs.serving.max_waiting_queue_length.is_some(),
    },
    Rule {
        id: "cpu-has-no-cuda-paths",
        severity: Severity::Warning,
        targets: ENGINE,
        arch: ArchCond::Any,
        keys: &["engine.device", "axes.moe_backend"],
        reason: "the CPU backend has only the sinks gate: moe kernel, activation, tile, MXFP4 layers and KV dtype settings report n/a there (and so do CUDA graphs, either way)",
        when: |fs| {
            let a = &fs.axes;
            fs.engine.device == Device::Cpu
                && (a.moe_backend != MoeBackend::Auto
                    || a.activation != Activation::Auto
                    || a.tile != Tile::Auto
                    || a.mxfp4_layers != Mxfp4Layers::Moe
                    || a.kv_cache_dtype != KvCacheDtype::Auto)
        },
    },
];

/// Id of the findings taken from `mxtune serve`'s own argument checks.
pub const ENGINE_REFUSES: &str = "engine-refuses";

/// The preset key behind a `mxtune serve` option, for `file:line` in `presets check`.
fn preset_key(option: &str) -> &'static str {
    match option {
        "--max-model-len" => "serving.max_model_len",
        "--max-num-seqs" => "serving.max_num_seqs",
        "--max-num-batched-tokens" => "serving.max_num_batched_tokens",
        "--long-prefill-token-threshold" => "serving.long_prefill_token_threshold",
        "--max-waiting-queue-length" => "serving.max_waiting_queue_length",
        "--tile" => "axes.tile",
        "--moe-kernel" => "axes.moe_backend",
        "--synthetic" | "--model" => "engine.model",
        _ => "engine",
    }
}

/// What the engine would refuse at start, asked of the engine itself: the flag set is
/// rendered to its `mxtune serve` command line and checked by [`crate::engine::serve::refusals`]
/// (one place for those facts), so the rules can never accept what the engine refuses.
fn engine_refusals(fs: &FlagSet) -> Vec<Finding> {
    let Ok(spec) = super::render(fs, TargetKind::Engine) else {
        // A flag set that does not render is reported by the renderer's own error.
        return Vec::new();
    };
    let Some(options) = spec
        .argv
        .iter()
        .position(|a| a == "serve")
        .map(|i| &spec.argv[i + 1..])
    else {
        return Vec::new();
    };
    let refusals = match crate::engine::serve::parse_args(options) {
        Ok(args) => crate::engine::serve::refusals(&args),
        Err(e) => vec![crate::engine::serve::Refusal {
            options: Vec::new(),
            message: e.to_string().lines().next().unwrap_or_default().to_string(),
        }],
    };
    refusals
        .into_iter()
        .map(|r| {
            let mut keys: Vec<&'static str> = r.options.iter().map(|o| preset_key(o)).collect();
            keys.dedup();
            Finding {
                rule: ENGINE_REFUSES,
                severity: Severity::Error,
                applies: Applies::Yes,
                keys,
                message: format!("the bundled engine refuses this at start: {}", r.message),
            }
        })
        .collect()
}

/// Id of the rule generated from the axis table: a value with no rendering on the target.
pub const NOT_ON_TARGET: &str = "value-not-on-target";

/// Id of the rule generated from the upstream dialect: a value a stock image cannot express.
pub const NOT_UPSTREAM: &str = "not-in-upstream-dialect";

/// One error per axis value a stock vLLM image cannot express, naming the nearest value.
fn upstream_findings(fs: &FlagSet) -> Vec<Finding> {
    let mut errors = Vec::new();
    if let Err(n) = upstream_moe(fs.axes.moe_backend, fs.axes.activation) {
        errors.push(n);
    }
    for c in choices(fs) {
        if let Upstream::Not(n) = c.upstream
            && c.key != MoeBackend::KEY
            && c.key != Activation::KEY
        {
            errors.push(n);
        }
    }
    errors
        .into_iter()
        .map(|n| Finding {
            rule: NOT_UPSTREAM,
            severity: Severity::Error,
            applies: Applies::Yes,
            keys: vec![n.path, "container.vllm"],
            message: n.to_string(),
        })
        .collect()
}

/// Every rule that matches `fs` on `target`, errors first. `arch` = None reports
/// architecture-dependent rules as [`Applies::MayApply`].
pub fn evaluate(fs: &FlagSet, target: TargetKind, arch: Option<GpuArch>) -> Vec<Finding> {
    let mut out = Vec::new();
    let upstream = fs.container.vllm == VllmFlavor::Upstream;
    if matches!(target, TargetKind::Docker | TargetKind::DockerCluster) && upstream {
        out.extend(upstream_findings(fs));
    } else if target != TargetKind::Attach {
        for c in choices(fs) {
            let (ok, valid, name) = match target {
                TargetKind::Engine => (
                    c.spec.engine.is_some(),
                    &c.engine_values,
                    "the bundled engine",
                ),
                _ => (c.spec.vllm.is_some(), &c.vllm_values, "vLLM"),
            };
            if !ok {
                out.push(Finding {
                    rule: NOT_ON_TARGET,
                    severity: Severity::Error,
                    applies: Applies::Yes,
                    keys: vec![c.path],
                    message: format!(
                        "{} = \"{}\" does not exist on {name}; valid there: {}",
                        c.path,
                        c.value,
                        valid.join(", ")
                    ),
                });
            }
        }
    }
    if target == TargetKind::Engine {
        out.extend(engine_refusals(fs));
    }
    for r in RULES {
        if !r.targets.contains(&target) || !(r.when)(fs) {
            continue;
        }
        let applies = match (r.arch, arch) {
            (ArchCond::Any, _) => Applies::Yes,
            (cond, Some(a)) if cond.holds(a) => Applies::Yes,
            (_, Some(_)) => continue,
            (_, None) => Applies::MayApply,
        };
        out.push(Finding {
            rule: r.id,
            severity: r.severity,
            applies,
            keys: r.keys.to_vec(),
            message: r.reason.to_string(),
        });
    }
    out.sort_by_key(|f| f.severity);
    out
}

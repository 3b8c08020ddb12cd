//! The flag axes: one enum per axis and, per value, the table of how it renders on each target
//! and which log lines prove it took effect. This is the one place these facts live.

use super::dialect::{self, Upstream, fork_only};
use super::names::{self, VllmName};

/// Per-value rendering and evidence, read by `render`, `rules` and the docs generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueSpec {
    /// What the vLLM container gets; `None` when vLLM has no such path.
    pub vllm: Option<&'static [VllmEffect]>,
    /// What `mxtune serve` gets; `None` when the bundled engine has no such path.
    pub engine: Option<&'static [EngineArg]>,
    /// Log evidence on vLLM (each regex matched per log line).
    pub vllm_check: Evidence,
    /// What the engine's `kernel-path <key>=` line must report.
    pub engine_report: EngineReport,
}

/// One thing a value does to the vLLM container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VllmEffect {
    /// Set an environment variable.
    Env(&'static VllmName, &'static str),
    /// Pass a flag with no value.
    Flag(&'static VllmName),
    /// Pass a flag with a value.
    Arg(&'static VllmName, &'static str),
    /// Place a file in the container (path, contents).
    File(&'static str, &'static str),
    /// Pass `--speculative-config` JSON with this method and default drafter.
    SpecConfig {
        /// `method` in the JSON.
        method: &'static str,
        /// Default `model` (drafter); `spec_model` overrides it.
        drafter: Option<&'static str>,
    },
}

/// One `mxtune serve` option and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineArg(pub &'static str, pub &'static str);

/// Regexes that must / must not match some log line once the target is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    /// Each must match at least one line.
    pub must_see: &'static [&'static str],
    /// None may match any line.
    pub must_not_see: &'static [&'static str],
}

/// No evidence known for this value.
pub const NO_EVIDENCE: Evidence = Evidence {
    must_see: &[],
    must_not_see: &[],
};

/// What the engine's start-up line for an axis must say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineReport {
    /// Exactly this value.
    Exactly(&'static str),
    /// Any resolved value (the value was `auto`).
    Any,
}

/// A typed axis value: its name, doc, and table row.
pub trait AxisValue: Copy + Eq + std::fmt::Debug + 'static {
    /// Key in the preset's section, e.g. `moe_backend`.
    const KEY: &'static str;
    /// `section.key` in the preset, e.g. `axes.moe_backend`.
    const PATH: &'static str;
    /// One-line doc of the axis.
    const DOC: &'static str;
    /// Key of the engine's `kernel-path` line, when the engine reports this axis.
    const ENGINE_KEY: Option<&'static str>;
    /// Whether the engine's CPU backend has this path (else it reports `n/a`).
    const CPU_APPLIES: bool;
    /// Every value, in display order.
    fn all() -> &'static [Self];
    /// The value's name as written in presets.
    fn as_str(self) -> &'static str;
    /// One-line doc of the value.
    fn value_doc(self) -> &'static str;
    /// The value's row in the table.
    fn spec(self) -> ValueSpec;
    /// How a stock (upstream) vLLM image says this value; for `moe_backend` and `activation`
    /// with the other of the pair at `auto` (render takes them as a pair).
    fn upstream(self) -> Upstream;
    /// Parses a name; the error lists the valid choices.
    fn parse(s: &str) -> Result<Self, String> {
        Self::all()
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                let choices: Vec<&str> = Self::all().iter().map(|v| v.as_str()).collect();
                format!(
                    "unknown value `{s}` for `{}`; valid: {}",
                    Self::KEY,
                    choices.join(", ")
                )
            })
    }
}

macro_rules! axis_enum {
    (
        $(#[$meta:meta])*
        $name:ident, section = $section:literal, key = $key:literal, doc = $doc:literal, engine_key = $ekey:expr,
        cpu = $cpu:literal, default = $default:ident,
        { $( $var:ident = $s:literal : $vdoc:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( #[doc = $vdoc] $var ),+
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl AxisValue for $name {
            const KEY: &'static str = $key;
            const PATH: &'static str = concat!($section, ".", $key);
            const DOC: &'static str = $doc;
            const ENGINE_KEY: Option<&'static str> = $ekey;
            const CPU_APPLIES: bool = $cpu;
            fn all() -> &'static [Self] {
                &[$($name::$var),+]
            }
            fn as_str(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }
            fn value_doc(self) -> &'static str {
                match self { $($name::$var => $vdoc),+ }
            }
            fn spec(self) -> ValueSpec {
                self.row()
            }
            fn upstream(self) -> Upstream {
                self.upstream_row()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$name as AxisValue>::parse(s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$name as AxisValue>::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Shorthand for a row that renders nothing anywhere-applicable and checks nothing.
const fn row(
    vllm: Option<&'static [VllmEffect]>,
    engine: Option<&'static [EngineArg]>,
    vllm_check: Evidence,
    engine_report: EngineReport,
) -> ValueSpec {
    ValueSpec {
        vllm,
        engine,
        vllm_check,
        engine_report,
    }
}

const fn ev(must_see: &'static [&'static str], must_not_see: &'static [&'static str]) -> Evidence {
    Evidence {
        must_see,
        must_not_see,
    }
}

use EngineReport::{Any, Exactly};
use VllmEffect::{Arg, Env, File, Flag, SpecConfig};

axis_enum! {
    /// MoE backend / kernel.
    MoeBackend, section = "axes", key = "moe_backend",
    doc = "MoE GEMM backend: which kernel runs the experts",
    engine_key = Some("moe_kernel"), cpu = false, default = Auto,
    {
        Auto = "auto": "let the target choose (vLLM: its default; engine: its dispatch table)",
        Marlin = "marlin": "Marlin weight-only FP4 dequant + BF16 GEMM (the baseline)",
        Cutlass = "cutlass": "CUTLASS grouped GEMM, FP8×FP4 on SM12x (the seeds' `gemm`)",
        Triton = "triton": "Triton MoE kernels",
        Trtllm = "trtllm": "FlashInfer TRT-LLM MoE, BF16 activations (SM100 only)",
        TrtllmMxfp8 = "trtllm-mxfp8": "FlashInfer TRT-LLM MoE, MXFP8 activations (SM100 only)",
        Gemv = "gemv": "one GEMV per active expert (engine; vLLM only via the legacy DP4A selector)",
        Grouped = "grouped": "engine: grouped GEMM over all active experts (tiled)",
    }
}

impl MoeBackend {
    fn upstream_row(self) -> Upstream {
        dialect::moe_alone(self)
    }

    fn row(self) -> ValueSpec {
        const NOT_MARLIN_RE: &str = r"(?i)marlin_moe|moe.*\bmarlin\b|\bmarlin\b.*moe";
        const NOT_MARLIN: &[&str] = &[NOT_MARLIN_RE];
        match self {
            MoeBackend::Auto => row(
                Some(&[]),
                Some(&[EngineArg("--moe-kernel", "auto")]),
                NO_EVIDENCE,
                Any,
            ),
            MoeBackend::Marlin => row(
                Some(&[Env(&names::VLLM_MXFP4_BACKEND, "MARLIN")]),
                None,
                ev(
                    &[r"(?i)marlin"],
                    &[r"(?i)cutlass_fused_moe|cutlass.*moe|moe.*cutlass"],
                ),
                Exactly("marlin"),
            ),
            MoeBackend::Cutlass => row(
                Some(&[Env(&names::VLLM_MXFP4_BACKEND, "CUTLASS")]),
                None,
                ev(
                    &[r"(?i)cutlass"],
                    &[NOT_MARLIN_RE, r"(?i)using nvfp4 path|quant_dtype=nvfp4"],
                ),
                Exactly("cutlass"),
            ),
            MoeBackend::Triton => row(
                Some(&[Env(&names::VLLM_MXFP4_BACKEND, "TRITON")]),
                None,
                ev(
                    &[r"(?i)triton.*(moe|mxfp4)|(moe|mxfp4).*triton"],
                    NOT_MARLIN,
                ),
                Exactly("triton"),
            ),
            MoeBackend::Trtllm => row(
                Some(&[Env(&names::VLLM_MXFP4_BACKEND, "TRTLLM")]),
                None,
                ev(&[r"(?i)trtllm|trt-llm"], NOT_MARLIN),
                Exactly("trtllm"),
            ),
            MoeBackend::TrtllmMxfp8 => row(
                Some(&[Env(&names::VLLM_MXFP4_BACKEND, "TRTLLM_MXFP8")]),
                None,
                ev(&[r"(?i)trtllm|trt-llm", r"(?i)mxfp8"], NOT_MARLIN),
                Exactly("trtllm-mxfp8"),
            ),
            // VLLM_MXFP4_BACKEND has no GEMV value; only the legacy selector named it.
            MoeBackend::Gemv => row(
                Some(&[Env(&names::VLLM_MXFP4_MOE_KERNEL, "gemv")]),
                Some(&[EngineArg("--moe-kernel", "gemv")]),
                ev(&[r"(?i)gemv"], &[]),
                Exactly("gemv"),
            ),
            MoeBackend::Grouped => row(
                None,
                Some(&[EngineArg("--moe-kernel", "grouped")]),
                NO_EVIDENCE,
                Exactly("grouped"),
            ),
        }
    }
}

axis_enum! {
    /// Activation format fed to the MoE.
    Activation, section = "axes", key = "activation",
    doc = "activation format fed to the MoE GEMM",
    engine_key = Some("activation"), cpu = false, default = Auto,
    {
        Auto = "auto": "target default (BF16 into Marlin; FP8 inside CUTLASS on SM12x)",
        Bf16 = "bf16": "BF16 activations",
        Mxfp8 = "mxfp8": "MXFP8 activations (implied by trtllm-mxfp8)",
        Fp8 = "fp8": "FP8 e4m3 activations",
        Q8 = "q8": "engine: int8 blocks (dp4a path)",
    }
}

impl Activation {
    fn upstream_row(self) -> Upstream {
        dialect::activation_alone(self)
    }

    fn row(self) -> ValueSpec {
        match self {
            Activation::Auto => row(Some(&[]), Some(&[]), NO_EVIDENCE, Any),
            Activation::Bf16 => row(
                Some(&[Env(&names::VLLM_MXFP4_ACTIVATION, "bf16")]),
                Some(&[EngineArg("--activation", "bf16")]),
                NO_EVIDENCE,
                Exactly("bf16"),
            ),
            Activation::Mxfp8 => row(
                Some(&[Env(&names::VLLM_MXFP4_ACTIVATION, "mxfp8")]),
                None,
                ev(&[r"(?i)mxfp8"], &[]),
                Exactly("mxfp8"),
            ),
            Activation::Fp8 => row(
                Some(&[Env(&names::VLLM_MXFP4_ACTIVATION, "fp8")]),
                Some(&[EngineArg("--activation", "fp8")]),
                NO_EVIDENCE,
                Exactly("fp8"),
            ),
            Activation::Q8 => row(
                None,
                Some(&[EngineArg("--activation", "q8")]),
                NO_EVIDENCE,
                Exactly("q8"),
            ),
        }
    }
}

/// Path of the fork's tile override file inside the container.
pub const TILE_FILE: &str = "/tmp/flashinfer_moe_tile";

axis_enum! {
    /// MoE GEMM tile shape.
    Tile, section = "axes", key = "tile",
    doc = "MoE GEMM tile (vLLM: CUTLASS only; engine: grouped only)",
    engine_key = Some("tile"), cpu = false, default = Auto,
    {
        Auto = "auto": "heuristic (fork: 64x128 for M<=16, else 128x128)",
        T128x128 = "128x128": "128×128 tiles (large batches, prefill)",
        T64x128 = "64x128": "64×128 tiles (small-M decode; the 60 tok/s config)",
    }
}

impl Tile {
    fn upstream_row(self) -> Upstream {
        const WHY: &str = "stock FlashInfer reads no tile override (FLASHINFER_DEBUG_TILE_OVERRIDE and its file are the fork's)";
        match self {
            Tile::Auto => Upstream::Same,
            other => fork_only(Self::PATH, other.as_str(), "tile = \"auto\"", WHY),
        }
    }

    fn row(self) -> ValueSpec {
        match self {
            Tile::Auto => row(
                Some(&[]),
                Some(&[EngineArg("--tile", "auto")]),
                NO_EVIDENCE,
                Any,
            ),
            Tile::T128x128 => row(
                Some(&[
                    Env(&names::FLASHINFER_DEBUG_TILE_OVERRIDE, "1"),
                    File(TILE_FILE, "128x128"),
                ]),
                Some(&[EngineArg("--tile", "128x128")]),
                NO_EVIDENCE,
                Exactly("128x128"),
            ),
            Tile::T64x128 => row(
                Some(&[
                    Env(&names::FLASHINFER_DEBUG_TILE_OVERRIDE, "1"),
                    File(TILE_FILE, "64x128"),
                ]),
                Some(&[EngineArg("--tile", "64x128")]),
                NO_EVIDENCE,
                Exactly("64x128"),
            ),
        }
    }
}

axis_enum! {
    /// Which layers hold MXFP4 weights.
    Mxfp4Layers, section = "axes", key = "mxfp4_layers",
    doc = "layers stored as MXFP4 (others stay BF16)",
    engine_key = Some("mxfp4_layers"), cpu = false, default = Moe,
    {
        Moe = "moe": "experts only, as released (vLLM: not rendered, it is the default)",
        MoeQkvO = "moe,qkv,o": "experts + attention projections",
        All = "moe,qkv,o,lm_head": "experts + attention projections + lm_head (the final config)",
    }
}

impl Mxfp4Layers {
    fn upstream_row(self) -> Upstream {
        const WHY: &str = "--mxfp4-layers exists only in the tuning fork (upstream vLLM refuses to start with it)";
        match self {
            Mxfp4Layers::Moe => Upstream::Same,
            other => fork_only(Self::PATH, other.as_str(), "mxfp4_layers = \"moe\"", WHY),
        }
    }

    fn row(self) -> ValueSpec {
        const LM_HEAD: &[&str] = &[r"(?i)\[MXFP4\] lm_head quantized"];
        match self {
            Mxfp4Layers::Moe => row(
                Some(&[]),
                Some(&[EngineArg("--mxfp4-layers", "moe")]),
                ev(&[], LM_HEAD),
                Exactly("moe"),
            ),
            Mxfp4Layers::MoeQkvO => row(
                Some(&[Arg(&names::MXFP4_LAYERS, "moe,qkv,o")]),
                Some(&[EngineArg("--mxfp4-layers", "moe,qkv,o")]),
                ev(&[], LM_HEAD),
                Exactly("moe,qkv,o"),
            ),
            Mxfp4Layers::All => row(
                Some(&[Arg(&names::MXFP4_LAYERS, "moe,qkv,o,lm_head")]),
                Some(&[EngineArg("--mxfp4-layers", "moe,qkv,o,lm_head")]),
                ev(LM_HEAD, &[]),
                Exactly("moe,qkv,o,lm_head"),
            ),
        }
    }
}

axis_enum! {
    /// Attention backend.
    AttentionBackend, section = "axes", key = "attention_backend",
    doc = "vLLM attention backend (the engine has its own kernels)",
    engine_key = None, cpu = true, default = Auto,
    {
        Auto = "auto": "vLLM picks (TRITON_ATTN on stock vLLM for SM121)",
        TritonAttn = "TRITON_ATTN": "Triton unified attention; always applies sinks",
        Flashinfer = "FLASHINFER": "FlashInfer FA2 (with the fork's sink module on SM12x)",
        FlashAttn = "FLASH_ATTN": "FlashAttention 2 (SM80 cubins only: garbage on SM12x)",
    }
}

impl AttentionBackend {
    fn upstream_row(self) -> Upstream {
        Upstream::Same
    }

    fn row(self) -> ValueSpec {
        match self {
            AttentionBackend::Auto => row(Some(&[]), Some(&[]), NO_EVIDENCE, Any),
            AttentionBackend::TritonAttn => row(
                Some(&[Arg(&names::ATTENTION_BACKEND, "TRITON_ATTN")]),
                None,
                ev(
                    &[r"(?i)using\s+(attentionbackendenum\.)?triton(_attn)?\b.*backend"],
                    &[],
                ),
                Exactly("TRITON_ATTN"),
            ),
            AttentionBackend::Flashinfer => row(
                Some(&[Arg(&names::ATTENTION_BACKEND, "FLASHINFER")]),
                None,
                ev(
                    &[r"(?i)using\s+(attentionbackendenum\.)?flashinfer\b.*backend"],
                    &[],
                ),
                Exactly("FLASHINFER"),
            ),
            AttentionBackend::FlashAttn => row(
                Some(&[Arg(&names::ATTENTION_BACKEND, "FLASH_ATTN")]),
                None,
                ev(
                    &[
                        r"(?i)using\s+(attentionbackendenum\.)?(flash_attn|flash attention)\b.*backend",
                    ],
                    &[],
                ),
                Exactly("FLASH_ATTN"),
            ),
        }
    }
}

axis_enum! {
    /// Attention sinks.
    Sinks, section = "axes", key = "sinks",
    doc = "attention sinks (gpt-oss needs them for coherent output)",
    engine_key = Some("sinks"), cpu = true, default = Auto,
    {
        Auto = "auto": "target default (sinks on)",
        On = "on": "force sinks on",
        Off = "off": "force sinks off (diagnostic only: output is garbage)",
    }
}

impl Sinks {
    fn upstream_row(self) -> Upstream {
        const WHY: &str = "stock vLLM has no sinks switch (VLLM_ATTENTION_SINKS is the fork's) and always applies gpt-oss's sinks";
        match self {
            Sinks::Auto => Upstream::Same,
            other => fork_only(Self::PATH, other.as_str(), "sinks = \"auto\"", WHY),
        }
    }

    fn row(self) -> ValueSpec {
        match self {
            Sinks::Auto => row(Some(&[]), Some(&[]), NO_EVIDENCE, Any),
            Sinks::On => row(
                Some(&[Env(&names::VLLM_ATTENTION_SINKS, "true")]),
                Some(&[EngineArg("--sinks", "on")]),
                NO_EVIDENCE,
                Exactly("on"),
            ),
            Sinks::Off => row(
                Some(&[Env(&names::VLLM_ATTENTION_SINKS, "false")]),
                Some(&[EngineArg("--sinks", "off")]),
                NO_EVIDENCE,
                Exactly("off"),
            ),
        }
    }
}

axis_enum! {
    /// KV cache element type.
    KvCacheDtype, section = "axes", key = "kv_cache_dtype",
    doc = "KV cache element type",
    engine_key = Some("kv_dtype"), cpu = false, default = Auto,
    {
        Auto = "auto": "model dtype (BF16)",
        Bf16 = "bf16": "BF16 KV cache",
        Fp8 = "fp8": "FP8 KV cache (half the bytes per token)",
    }
}

impl KvCacheDtype {
    fn upstream_row(self) -> Upstream {
        Upstream::Same
    }

    fn row(self) -> ValueSpec {
        const FP8_KV: &[&str] = &[r"(?i)fp8 data type to store kv cache|kv_cache_dtype=fp8"];
        match self {
            KvCacheDtype::Auto => row(Some(&[]), Some(&[]), NO_EVIDENCE, Any),
            KvCacheDtype::Bf16 => row(
                Some(&[Arg(&names::KV_CACHE_DTYPE, "bfloat16")]),
                Some(&[EngineArg("--kv-dtype", "bf16")]),
                ev(&[], FP8_KV),
                Exactly("bf16"),
            ),
            KvCacheDtype::Fp8 => row(
                Some(&[Arg(&names::KV_CACHE_DTYPE, "fp8")]),
                Some(&[EngineArg("--kv-dtype", "fp8")]),
                ev(FP8_KV, &[]),
                Exactly("fp8"),
            ),
        }
    }
}

/// Hugging Face ids of the Eagle3 drafters for gpt-oss-120b.
pub const EAGLE3_SHORT: &str = "nvidia/gpt-oss-120b-Eagle3-short-context";
/// Long-context drafter.
pub const EAGLE3_LONG: &str = "nvidia/gpt-oss-120b-Eagle3-long-context";
/// Throughput drafter.
pub const EAGLE3_THROUGHPUT: &str = "nvidia/gpt-oss-120b-Eagle3-throughput";

axis_enum! {
    /// Speculative decoding.
    Speculative, section = "axes", key = "speculative",
    doc = "speculative decoding method (vLLM `--speculative-config`; engine: not yet)",
    engine_key = None, cpu = true, default = Off,
    {
        Off = "off": "no speculation",
        Eagle3Short = "eagle3-short": "Eagle3, short-context drafter (prompts < 4K)",
        Eagle3Long = "eagle3-long": "Eagle3, long-context drafter (prompts > 4K)",
        Eagle3Throughput = "eagle3-throughput": "Eagle3, throughput drafter (batches)",
        Eagle3 = "eagle3": "Eagle3 with the drafter in `spec_model` (e.g. a v3 drafter)",
        Ngram = "ngram": "prompt-lookup n-gram drafting",
        Suffix = "suffix": "suffix decoding (global response cache)",
    }
}

impl Speculative {
    fn upstream_row(self) -> Upstream {
        Upstream::Same
    }

    fn row(self) -> ValueSpec {
        const EAGLE: Evidence = Evidence {
            must_see: &[r"(?i)eagle"],
            must_not_see: &[],
        };
        match self {
            Speculative::Off => row(
                Some(&[]),
                Some(&[]),
                ev(&[], &[r"(?i)SpecDecoding metrics"]),
                Exactly("off"),
            ),
            Speculative::Eagle3Short => row(
                Some(&[SpecConfig {
                    method: "eagle3",
                    drafter: Some(EAGLE3_SHORT),
                }]),
                None,
                EAGLE,
                Exactly("eagle3-short"),
            ),
            Speculative::Eagle3Long => row(
                Some(&[SpecConfig {
                    method: "eagle3",
                    drafter: Some(EAGLE3_LONG),
                }]),
                None,
                EAGLE,
                Exactly("eagle3-long"),
            ),
            Speculative::Eagle3Throughput => row(
                Some(&[SpecConfig {
                    method: "eagle3",
                    drafter: Some(EAGLE3_THROUGHPUT),
                }]),
                None,
                EAGLE,
                Exactly("eagle3-throughput"),
            ),
            Speculative::Eagle3 => row(
                Some(&[SpecConfig {
                    method: "eagle3",
                    drafter: None,
                }]),
                None,
                EAGLE,
                Exactly("eagle3"),
            ),
            Speculative::Ngram => row(
                Some(&[SpecConfig {
                    method: "ngram",
                    drafter: None,
                }]),
                None,
                ev(&[r"(?i)ngram"], &[]),
                Exactly("ngram"),
            ),
            Speculative::Suffix => row(
                Some(&[SpecConfig {
                    method: "suffix",
                    drafter: None,
                }]),
                None,
                ev(&[r"(?i)suffix"], &[]),
                Exactly("suffix"),
            ),
        }
    }

    /// Whether this is one of the Eagle3 methods.
    pub fn is_eagle3(self) -> bool {
        matches!(
            self,
            Speculative::Eagle3Short
                | Speculative::Eagle3Long
                | Speculative::Eagle3Throughput
                | Speculative::Eagle3
        )
    }
}

axis_enum! {
    /// CUDA graphs.
    CudaGraphs, section = "axes", key = "cuda_graphs",
    doc = "CUDA graph capture for decode",
    engine_key = Some("cuda_graphs"), cpu = false, default = On,
    {
        On = "on": "capture graphs (vLLM default)",
        Off = "off": "run eagerly (vLLM `--enforce-eager`)",
    }
}

impl CudaGraphs {
    /// Upstream keeps torch.compile and drops only the graphs when told so through its
    /// compilation options; the config dump in the start-up log shows the mode taken.
    fn upstream_row(self) -> Upstream {
        match self {
            CudaGraphs::On => Upstream::Same,
            CudaGraphs::Off => Upstream::Own(
                &[Arg(
                    &names::COMPILATION_CONFIG,
                    r#"{"cudagraph_mode": "NONE"}"#,
                )],
                ev(
                    &[r"'cudagraph_mode': <CUDAGraphMode\.NONE"],
                    &[r"(?i)capturing cuda graphs?|graph capturing finished"],
                ),
            ),
        }
    }

    fn row(self) -> ValueSpec {
        const CAPTURE: &[&str] = &[r"(?i)capturing cuda graphs?|graph capturing finished"];
        match self {
            CudaGraphs::On => row(
                Some(&[]),
                Some(&[EngineArg("--cuda-graphs", "on")]),
                ev(CAPTURE, &[]),
                Exactly("on"),
            ),
            CudaGraphs::Off => row(
                Some(&[Flag(&names::ENFORCE_EAGER)]),
                Some(&[EngineArg("--cuda-graphs", "off")]),
                ev(&[], &[r"(?i)capturing cuda graphs?"]),
                Exactly("off"),
            ),
        }
    }
}

axis_enum! {
    /// Where the bundled engine runs.
    Device, section = "engine", key = "device",
    doc = "engine device (the engine reports it as `kernel-path backend=`)",
    engine_key = Some("backend"), cpu = true, default = Auto,
    {
        Auto = "auto": "CUDA when available, else CPU",
        Cpu = "cpu": "CPU reference backend",
        Cuda = "cuda": "CUDA backend (engine-kernels via NVRTC)",
    }
}

impl Device {
    fn upstream_row(self) -> Upstream {
        Upstream::Same
    }

    fn row(self) -> ValueSpec {
        match self {
            Device::Auto => row(
                None,
                Some(&[EngineArg("--device", "auto")]),
                NO_EVIDENCE,
                Any,
            ),
            Device::Cpu => row(
                None,
                Some(&[EngineArg("--device", "cpu")]),
                NO_EVIDENCE,
                Exactly("cpu"),
            ),
            Device::Cuda => row(
                None,
                Some(&[EngineArg("--device", "cuda")]),
                NO_EVIDENCE,
                Exactly("cuda"),
            ),
        }
    }
}

/// A summary of one axis for docs and generic checks.
#[derive(Debug, Clone)]
pub struct AxisInfo {
    /// Key in the preset.
    pub key: &'static str,
    /// `section.key` in the preset.
    pub path: &'static str,
    /// One-line doc.
    pub doc: &'static str,
    /// Default value name.
    pub default: &'static str,
    /// Engine `kernel-path` key, if any.
    pub engine_key: Option<&'static str>,
    /// Whether the CPU backend has this path.
    pub cpu_applies: bool,
    /// Each value: name, doc, row.
    pub values: Vec<(&'static str, &'static str, ValueSpec)>,
    /// Each value on a stock vLLM image, in the order of `values`.
    pub upstream: Vec<Upstream>,
}

/// Builds the summary of axis `A`.
pub fn axis_info<A: AxisValue + Default>() -> AxisInfo {
    AxisInfo {
        key: A::KEY,
        path: A::PATH,
        doc: A::DOC,
        default: A::default().as_str(),
        engine_key: A::ENGINE_KEY,
        cpu_applies: A::CPU_APPLIES,
        values: A::all()
            .iter()
            .map(|v| (v.as_str(), v.value_doc(), v.spec()))
            .collect(),
        upstream: A::all().iter().map(|v| v.upstream()).collect(),
    }
}

/// Every axis of `[axes]` plus the engine `device`, in display order.
pub fn all_axes() -> Vec<AxisInfo> {
    vec![
        axis_info::<MoeBackend>(),
        axis_info::<Activation>(),
        axis_info::<Tile>(),
        axis_info::<Mxfp4Layers>(),
        axis_info::<AttentionBackend>(),
        axis_info::<Sinks>(),
        axis_info::<KvCacheDtype>(),
        axis_info::<Speculative>(),
        axis_info::<CudaGraphs>(),
        axis_info::<Device>(),
    ]
}

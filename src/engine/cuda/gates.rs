//! The engine's gates: the switches of the CUDA decode and prefill paths (`--kv-dtype`,
//! `--tile`, `--activation`, `--mxfp4-layers`, `--moe-kernel`, `MXTUNE_GEMV`) and the
//! [`DecodeOptions`] that bundles them. The vocabulary the model, the ops and the weights
//! share: it imports nothing from them.

use anyhow::Result;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// bf16 (the default: half the bytes).
    Bf16,
    /// fp32: the precision of the CPU reference, for exact end-to-end comparisons.
    F32,
    /// FP8 E4M3 without a scale (a quarter of the bytes): values cast with round to nearest
    /// even, saturating at ±448 (`quant::e4m3_from_f32`). Needs sm_89 or later.
    Fp8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
            KvDtype::Fp8 => 1,
        }
    }

    /// Name in the kernel-path report.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
            KvDtype::Fp8 => "fp8",
        }
    }

    /// The kernels' element kind argument (`KV_BF16`, `KV_F32`, `KV_FP8` in common.cuh).
    pub fn kernel_kind(self) -> i32 {
        match self {
            KvDtype::Bf16 => 0,
            KvDtype::F32 => 1,
            KvDtype::Fp8 => 2,
        }
    }
}

/// Tile of the grouped (prefill) MoE's tensor-core kernels: token rows × output columns per
/// block (`--tile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeTile {
    /// 32 × 128: what `Auto` picks for a pass of few entries an expert; the register-B
    /// kernels only (the shared-memory ones run their 64-row tile instead).
    T32x128,
    /// 64 × 128.
    T64x128,
    /// 128 × 128: twice the rows per weight stage.
    T128x128,
    /// Chosen per prefill pass (the default, `--tile auto`): [`MoeTile::for_pass`].
    Auto,
}

/// `--tile auto` runs 64-row tiles while a pass routes at most this many entries per expert
/// on average, 128-row tiles above (docs/perf.md, run 150, gpt-oss-120b: at 64 an expert the
/// 64-row tile is 2.7 % faster; at 96, 128 and 192 the 128-row one 4–6 %).
pub const AUTO_TILE_ROWS_PER_EXPERT: usize = 64;

/// `--tile auto` runs 32-row tiles while a pass routes at most this many entries per expert
/// on average (a short prompt, a cached conversation's new turn: most tiles hold a few rows,
/// and the weight stream is all that counts). docs/perf.md, run 155, gpt-oss-120b MoE against
/// the 64-row tile: 1.2 entries an expert 28.5 against 38.9 ms, 4: 39.6 / 52.8, 8: 41.5 /
/// 56.5, 16: 44.3 / 58.6, 32: 63.9 / 63.9; at 64, 109.6 against 97.9.
pub const AUTO_TILE32_ROWS_PER_EXPERT: usize = 32;

impl MoeTile {
    /// Token rows (entries) per tile: the segment cut of `moe_group`; for `Auto` the smallest
    /// tile's (what sizes the tile list).
    pub fn rows(self) -> usize {
        match self {
            MoeTile::T32x128 | MoeTile::Auto => 32,
            MoeTile::T64x128 => 64,
            MoeTile::T128x128 => 128,
        }
    }

    /// The tile a pass of `entries` routed (token, expert) pairs over `experts` experts runs:
    /// `Auto` resolved by the entries per expert, a fixed tile as it is.
    pub fn for_pass(self, entries: usize, experts: usize) -> MoeTile {
        match self {
            MoeTile::Auto if entries <= AUTO_TILE32_ROWS_PER_EXPERT * experts.max(1) => {
                MoeTile::T32x128
            }
            MoeTile::Auto if entries <= AUTO_TILE_ROWS_PER_EXPERT * experts.max(1) => {
                MoeTile::T64x128
            }
            MoeTile::Auto => MoeTile::T128x128,
            t => t,
        }
    }

    /// Name in the kernel-path report.
    pub fn name(self) -> &'static str {
        match self {
            MoeTile::T32x128 => "32x128",
            MoeTile::T64x128 => "64x128",
            MoeTile::T128x128 => "128x128",
            MoeTile::Auto => "auto",
        }
    }
}

/// `--activation`: the format of the activations the decode (GEMV) MoE kernels multiply with
/// the MXFP4 expert weights, quantized per block of 32 while each kernel block stages them
/// (`engine-kernels/moe_gemv.cu`; host mirror in [`super::quant`]). The grouped tensor-core
/// MoE (prompts, `--moe-kernel grouped`) always rounds its activations to bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// The reference path: the GEMV MoE multiplies fp32 activations (the grouped MoE bf16).
    Bf16,
    /// int8 per block of 32 with an fp32 scale amax / 127, dotted by dp4a with the weights
    /// as int8 (llama.cpp's q8_1 × MXFP4 scheme).
    Q8,
    /// FP8 E4M3 per block of 32 with an fp32 scale amax / 448, multiplied in fp32.
    Fp8,
}

impl ActFormat {
    /// The gate's value name.
    pub fn name(self) -> &'static str {
        match self {
            ActFormat::Bf16 => "bf16",
            ActFormat::Q8 => "q8",
            ActFormat::Fp8 => "fp8",
        }
    }

    /// Value of the `kernel-path activation=` line: which MoE kernels the format reaches.
    pub fn report(self) -> &'static str {
        match self {
            ActFormat::Bf16 => "bf16",
            ActFormat::Q8 => "q8 (gemv MoE; grouped MoE bf16)",
            ActFormat::Fp8 => "fp8 (gemv MoE; grouped MoE bf16)",
        }
    }
}

/// Options of the decode path that the panel can toggle.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// Attention sinks in the softmax (off is a diagnostic: gpt-oss needs them).
    pub sinks: bool,
    /// KV cache element type.
    pub kv_dtype: KvDtype,
    /// Which path runs which step (`--moe-kernel`).
    pub moe: MoePath,
    /// Tile of the grouped MoE (`--tile`).
    pub tile: MoeTile,
    /// Activation format of the GEMV MoE (`--activation`).
    pub activation: ActFormat,
    /// Which layers run in MXFP4 (`--mxfp4-layers`): the experts always; with more, the
    /// attention projections (and the lm_head) are quantized on the device when the
    /// [`Decoder`](super::model::Decoder) is built.
    pub fp4_layers: Fp4Layers,
    /// Decode GEMVs of the dense projections (qkv, o, lm_head) and of the MoE.
    pub gemv: DecodeGemv,
}

/// Environment variable choosing [`DecodeGemv`]: `tc` (the default), `tc-moe`, `tc-moe-f16` or
/// `simt`, for
/// A/B timing and as the fp32-activation reference path.
pub const DECODE_GEMV_ENV: &str = "MXTUNE_GEMV";

/// The decode GEMVs of the dense projections and the MoE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeGemv {
    /// Dense projections on tensor cores (`gemv_tc.cu`: bf16 activations, each weight read
    /// once per step for up to 16 rows); the MoE on CUDA cores (`moe_gemv.cu`).
    TensorCore,
    /// The MoE on tensor cores too (each distinct expert of up to 16 rows read once, bf16
    /// activations; with `--activation q8|fp8` the MoE stays on CUDA cores). On the H100
    /// (docs/perf.md, run 44) faster than [`DecodeGemv::TensorCore`] from batch 8 (+5 %; batch
    /// 16 +8 %), slower at batch 1–4; not the default because its bf16 activations round
    /// the MoE's input differently from the fp32 SIMT MoE, so the default path keeps one
    /// arithmetic at every batch size (a sequence's greedy tokens do not depend on what it is
    /// batched with).
    TensorCoreMoe,
    /// The MoE on tensor cores with fp16 operands (`moe_gate_up_f16`, `moe_down_f16`): the
    /// MXFP4 weights become fp16 by byte permutations only (exact), the block scales multiply
    /// the fp32 sums, the inputs are fp16 of x / D per routed row (D a power of two: 11
    /// significant bits), each distinct expert of up to 16 rows read once. A row's
    /// arithmetic does not depend on what it is batched with (the MMA's columns are
    /// independent). With `--activation q8|fp8` the MoE stays on CUDA cores.
    TensorCoreMoeF16,
    /// Everything on CUDA cores (`gemv_bf16.cu`, `gemv_mxfp4`, `moe_gemv.cu`): fp32
    /// activations, 4 rows per dense weight pass, each (row, expert) pair reading its expert.
    Simt,
}

impl DecodeGemv {
    /// From `$MXTUNE_GEMV` (unset: [`DecodeGemv::TensorCore`]).
    pub fn from_env() -> Result<Self> {
        match std::env::var(DECODE_GEMV_ENV).as_deref() {
            Err(_) | Ok("") | Ok("tc") => Ok(Self::TensorCore),
            Ok("tc-moe") => Ok(Self::TensorCoreMoe),
            Ok("tc-moe-f16") => Ok(Self::TensorCoreMoeF16),
            Ok("simt") => Ok(Self::Simt),
            Ok(v) => {
                anyhow::bail!("{DECODE_GEMV_ENV}={v}: expected tc, tc-moe, tc-moe-f16 or simt")
            }
        }
    }

    /// Name in the kernel-path report.
    pub fn name(self) -> &'static str {
        match self {
            Self::TensorCore => "tensor-core",
            Self::TensorCoreMoe => "tensor-core (moe too)",
            Self::TensorCoreMoeF16 => "tensor-core (moe too, fp16)",
            Self::Simt => "simt",
        }
    }

    /// Whether the dense projections run on tensor cores.
    pub fn dense_on_tensor_cores(self) -> bool {
        self != Self::Simt
    }
}

/// `--mxfp4-layers`: the layers whose weights are MXFP4. The experts are MXFP4 in the
/// checkpoint; the others are bf16 there and are quantized at load (`weights::DeviceWeights::
/// quantize_dense`, the quantizer of `engine::mxfp4`), their bf16 copies freed. The embedding
/// table always stays bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp4Layers {
    /// The experts only (the checkpoint as released).
    Moe,
    /// The experts and the attention qkv and o projections.
    MoeQkvO,
    /// The experts, qkv, o and the lm_head (unembedding).
    All,
}

impl Fp4Layers {
    /// The layout's name in perf rows (`--json-out`): the checkpoint as `released`, or which
    /// dense layers are MXFP4 beside the experts.
    pub fn layout_name(self) -> &'static str {
        match self {
            Fp4Layers::Moe => "released",
            Fp4Layers::MoeQkvO => "mxfp4-qkv-o",
            Fp4Layers::All => "all-mxfp4",
        }
    }

    /// Value of the `kernel-path mxfp4_layers=` line (the `--mxfp4-layers` spelling).
    pub fn report(self) -> &'static str {
        match self {
            Fp4Layers::Moe => "moe",
            Fp4Layers::MoeQkvO => "moe,qkv,o",
            Fp4Layers::All => "moe,qkv,o,lm_head",
        }
    }

    /// Whether the attention qkv and o projections are MXFP4.
    pub fn qkv_o(self) -> bool {
        self != Fp4Layers::Moe
    }

    /// Whether the lm_head is MXFP4.
    pub fn lm_head(self) -> bool {
        self == Fp4Layers::All
    }
}

/// `--moe-kernel`: which MoE (and with it which forward path) runs which step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePath {
    /// Decode steps on the GEMV path (CUDA graphs), prompt chunks on the batched path with
    /// the grouped tensor-core MoE.
    Auto,
    /// Everything on the GEMV path: prompts advance token by token through the decode step.
    Gemv,
    /// Everything on the batched path, decode steps included (no graphs).
    Grouped,
}

impl MoePath {
    /// Value of the `kernel-path moe_kernel=` line.
    pub fn report(self) -> &'static str {
        match self {
            MoePath::Auto => "gemv+grouped",
            MoePath::Gemv => "gemv",
            MoePath::Grouped => "grouped",
        }
    }
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            sinks: true,
            kv_dtype: KvDtype::Bf16,
            moe: MoePath::Auto,
            fp4_layers: Fp4Layers::Moe,
            activation: ActFormat::Bf16,
            tile: MoeTile::Auto,
            gemv: DecodeGemv::TensorCore,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_dtypes_have_sizes_names_and_kernel_kinds() {
        let all = [KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8];
        let sizes: Vec<_> = all.iter().map(|k| k.size()).collect();
        let names: Vec<_> = all.iter().map(|k| k.name()).collect();
        let kinds: Vec<_> = all.iter().map(|k| k.kernel_kind()).collect();
        assert_eq!(sizes, [2, 4, 1]);
        assert_eq!(names, ["bf16", "f32", "fp8"]);
        assert_eq!(kinds, [0, 1, 2]);
    }

    #[test]
    fn mxfp4_layer_sets_name_their_layouts() {
        let names: Vec<_> = [Fp4Layers::Moe, Fp4Layers::MoeQkvO, Fp4Layers::All]
            .iter()
            .map(|f| f.layout_name())
            .collect();
        assert_eq!(names, ["released", "mxfp4-qkv-o", "all-mxfp4"]);
    }

    #[test]
    fn auto_tile_follows_the_entries_per_expert_of_a_pass() {
        // gpt-oss-120b (128 experts, top-4): one 2048-token prompt routes 64 an expert, three
        // route 192; gpt-oss-20b (32 experts) routes 256 an expert from 2048 tokens.
        assert_eq!(MoeTile::Auto.for_pass(2048 * 4, 128), MoeTile::T64x128);
        assert_eq!(MoeTile::Auto.for_pass(2048 * 4 + 1, 128), MoeTile::T128x128);
        assert_eq!(MoeTile::Auto.for_pass(6144 * 4, 128), MoeTile::T128x128);
        assert_eq!(MoeTile::Auto.for_pass(2048 * 4, 32), MoeTile::T128x128);
        // A cached turn's 38 new tokens route about 1.2 an expert; 1024 tokens route 32.
        assert_eq!(MoeTile::Auto.for_pass(38 * 4, 128), MoeTile::T32x128);
        assert_eq!(MoeTile::Auto.for_pass(1024 * 4, 128), MoeTile::T32x128);
        assert_eq!(MoeTile::Auto.for_pass(1024 * 4 + 1, 128), MoeTile::T64x128);
        assert_eq!(MoeTile::Auto.for_pass(1, 0), MoeTile::T32x128);
        // Fixed tiles stay; the tile list is sized for the smallest tile under auto.
        assert_eq!(MoeTile::T128x128.for_pass(4, 128), MoeTile::T128x128);
        assert_eq!(MoeTile::T64x128.for_pass(1 << 20, 1), MoeTile::T64x128);
        assert_eq!(MoeTile::Auto.rows(), MoeTile::T32x128.rows());
        assert_eq!(MoeTile::T32x128.name(), "32x128");
        assert_eq!(MoeTile::Auto.name(), "auto");
    }
}

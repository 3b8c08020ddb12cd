//! Model weights shared by every backend: bf16 tensors and packed MXFP4 expert tensors,
//! either memory-mapped from a checkpoint or owned (synthetic models).

use std::sync::Arc;

use half::bf16;
use memmap2::Mmap;

use super::config::{MXFP4_GROUP, ModelConfig};
use super::mxfp4::BLOCK_BYTES;

#[cfg(target_endian = "big")]
compile_error!("checkpoint tensors are little-endian and viewed in place");

/// An element type a tensor can hold (bf16 weights or packed u8): plain bits, every
/// pattern valid, so file bytes can be viewed as it.
pub trait Element: Copy + Send + Sync + 'static {}

impl Element for bf16 {}

impl Element for u8 {}

enum Store<T> {
    /// A read-only view into a mapped file; `ptr` is aligned for `T` (checked when built).
    Mapped {
        _map: Arc<Mmap>,
        ptr: *const T,
        len: usize,
    },
    Owned(Vec<T>),
}

/// A dense row-major tensor.
pub struct Tensor<T: Element> {
    store: Store<T>,
    shape: Vec<usize>,
}

// SAFETY: a `Mapped` store only reads from a private read-only mapping that the `Arc`
// keeps alive for the tensor's lifetime; nothing ever writes through `ptr`.
unsafe impl<T: Element> Send for Tensor<T> {}
// SAFETY: as above; shared access is read-only.
unsafe impl<T: Element> Sync for Tensor<T> {}

impl<T: Element> Tensor<T> {
    /// A tensor owning its data; `data.len()` must equal the product of `shape`.
    pub fn owned(data: Vec<T>, shape: Vec<usize>) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Tensor {
            store: Store::Owned(data),
            shape,
        }
    }

    /// A view of `bytes` (inside `map`), or an owned copy when `bytes` is not aligned for `T`.
    pub(crate) fn from_mapped(map: &Arc<Mmap>, bytes: &[u8], shape: Vec<usize>) -> Self {
        let size = std::mem::size_of::<T>();
        let len = bytes.len() / size;
        if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            Tensor {
                store: Store::Mapped {
                    _map: Arc::clone(map),
                    ptr: bytes.as_ptr().cast::<T>(),
                    len,
                },
                shape,
            }
        } else {
            let data = bytes
                .chunks_exact(size)
                .map(|c| {
                    let mut v = std::mem::MaybeUninit::<T>::uninit();
                    // SAFETY: `T` is u8 or bf16 (plain bits, every pattern valid) and `c`
                    // holds exactly size_of::<T>() bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            c.as_ptr(),
                            v.as_mut_ptr().cast::<u8>(),
                            size,
                        );
                        v.assume_init()
                    }
                })
                .collect();
            Tensor {
                store: Store::Owned(data),
                shape,
            }
        }
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[T] {
        match &self.store {
            // SAFETY: alignment and length were checked in `from_mapped`; the mapping lives
            // as long as `self`.
            Store::Mapped { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Store::Owned(v) => v,
        }
    }

    /// The shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the data is a view into a mapped checkpoint file (else owned).
    pub fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Mapped { .. })
    }
}

/// A bf16 tensor.
pub type Bf16Tensor = Tensor<bf16>;

/// One MoE projection for all experts, MXFP4-packed as in the checkpoint:
/// `blocks` [experts, rows, cols/32, 16] u8, `scales` [experts, rows, cols/32] u8,
/// `bias` [experts, rows] bf16. `cols` is the reduction (input) axis.
pub struct Mxfp4Experts {
    /// Packed E2M1 nibbles.
    pub blocks: Tensor<u8>,
    /// E8M0 scale bytes, one per 32 values.
    pub scales: Tensor<u8>,
    /// Per-expert output bias.
    pub bias: Bf16Tensor,
    /// Number of experts.
    pub experts: usize,
    /// Output rows per expert.
    pub rows: usize,
    /// Input width per row (a multiple of 32).
    pub cols: usize,
}

impl Mxfp4Experts {
    /// Packed blocks and scales of output row `row` of expert `e`.
    pub fn row(&self, e: usize, row: usize) -> (&[u8], &[u8]) {
        let groups = self.cols / MXFP4_GROUP;
        let r = e * self.rows + row;
        let b = &self.blocks.data()[r * groups * BLOCK_BYTES..(r + 1) * groups * BLOCK_BYTES];
        let s = &self.scales.data()[r * groups..(r + 1) * groups];
        (b, s)
    }

    /// Bias of expert `e` (length `rows`).
    pub fn bias(&self, e: usize) -> &[bf16] {
        &self.bias.data()[e * self.rows..(e + 1) * self.rows]
    }
}

/// Weights of one transformer block.
pub struct LayerWeights {
    /// RMSNorm weight before attention.
    pub input_layernorm: Bf16Tensor,
    /// Query projection [q_dim, hidden] and bias [q_dim].
    pub q_proj: Bf16Tensor,
    /// Query bias.
    pub q_bias: Bf16Tensor,
    /// Key projection [kv_dim, hidden].
    pub k_proj: Bf16Tensor,
    /// Key bias.
    pub k_bias: Bf16Tensor,
    /// Value projection [kv_dim, hidden].
    pub v_proj: Bf16Tensor,
    /// Value bias.
    pub v_bias: Bf16Tensor,
    /// Output projection [hidden, q_dim].
    pub o_proj: Bf16Tensor,
    /// Output bias.
    pub o_bias: Bf16Tensor,
    /// One learned sink logit per query head.
    pub sinks: Bf16Tensor,
    /// RMSNorm weight before the MoE.
    pub post_attention_layernorm: Bf16Tensor,
    /// Router [experts, hidden].
    pub router: Bf16Tensor,
    /// Router bias [experts].
    pub router_bias: Bf16Tensor,
    /// Fused gate/linear projection, rows interleaved (even = gate, odd = linear).
    pub gate_up: Mxfp4Experts,
    /// Down projection.
    pub down: Mxfp4Experts,
}

/// A whole model's weights.
pub struct Weights {
    /// The model's shape.
    pub config: ModelConfig,
    /// Where the weights came from: a checkpoint directory or `synthetic:<name>`.
    pub source: String,
    /// Token embedding [vocab, hidden].
    pub embed_tokens: Bf16Tensor,
    /// Transformer blocks.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight.
    pub norm: Bf16Tensor,
    /// Unembedding [vocab, hidden].
    pub lm_head: Bf16Tensor,
}

/// A tensor of either element type, as a checkpoint or generator hands it over.
pub enum AnyTensor {
    /// bf16 data.
    Bf16(Bf16Tensor),
    /// u8 data (MXFP4 blocks or scales).
    U8(Tensor<u8>),
}

impl Weights {
    /// Bytes held by all tensors (mapped or owned).
    pub fn total_bytes(&self) -> usize {
        expected_tensors(&self.config)
            .iter()
            .map(|t| t.bytes())
            .sum()
    }

    /// Build the weights by asking `get` for every tensor of [`expected_tensors`], which it
    /// must return with the spec's shape and dtype.
    pub fn assemble(
        config: ModelConfig,
        source: String,
        mut get: impl FnMut(&TensorSpec) -> anyhow::Result<AnyTensor>,
    ) -> anyhow::Result<Weights> {
        let get: &mut dyn FnMut(&TensorSpec) -> anyhow::Result<AnyTensor> = &mut get;
        let embed_tokens = take_bf(&config, get, "model.embed_tokens.weight")?;
        let norm = take_bf(&config, get, "model.norm.weight")?;
        let lm_head = take_bf(&config, get, "lm_head.weight")?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let mut bf = |s: &str| take_bf(&config, get, &format!("model.layers.{l}.{s}"));
            let input_layernorm = bf("input_layernorm.weight")?;
            let q_proj = bf("self_attn.q_proj.weight")?;
            let q_bias = bf("self_attn.q_proj.bias")?;
            let k_proj = bf("self_attn.k_proj.weight")?;
            let k_bias = bf("self_attn.k_proj.bias")?;
            let v_proj = bf("self_attn.v_proj.weight")?;
            let v_bias = bf("self_attn.v_proj.bias")?;
            let o_proj = bf("self_attn.o_proj.weight")?;
            let o_bias = bf("self_attn.o_proj.bias")?;
            let sinks = bf("self_attn.sinks")?;
            let post_attention_layernorm = bf("post_attention_layernorm.weight")?;
            let router = bf("mlp.router.weight")?;
            let router_bias = bf("mlp.router.bias")?;
            let gate_up_bias = bf("mlp.experts.gate_up_proj_bias")?;
            let down_bias = bf("mlp.experts.down_proj_bias")?;
            let mut packed = |s: &str| take_u8(&config, get, &format!("model.layers.{l}.{s}"));
            let (e, h, i) = (
                config.num_local_experts,
                config.hidden_size,
                config.intermediate_size,
            );
            let gate_up = Mxfp4Experts {
                blocks: packed("mlp.experts.gate_up_proj_blocks")?,
                scales: packed("mlp.experts.gate_up_proj_scales")?,
                bias: gate_up_bias,
                experts: e,
                rows: 2 * i,
                cols: h,
            };
            let down = Mxfp4Experts {
                blocks: packed("mlp.experts.down_proj_blocks")?,
                scales: packed("mlp.experts.down_proj_scales")?,
                bias: down_bias,
                experts: e,
                rows: h,
                cols: i,
            };
            layers.push(LayerWeights {
                input_layernorm,
                q_proj,
                q_bias,
                k_proj,
                k_bias,
                v_proj,
                v_bias,
                o_proj,
                o_bias,
                sinks,
                post_attention_layernorm,
                router,
                router_bias,
                gate_up,
                down,
            });
        }
        Ok(Weights {
            config,
            source,
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }
}

type Getter<'a> = &'a mut dyn FnMut(&TensorSpec) -> anyhow::Result<AnyTensor>;

fn take_bf(c: &ModelConfig, get: Getter<'_>, name: &str) -> anyhow::Result<Bf16Tensor> {
    let spec = spec_for(c, name)?;
    match get(&spec)? {
        AnyTensor::Bf16(t) if t.shape() == spec.shape.as_slice() => Ok(t),
        _ => anyhow::bail!("tensor `{name}` does not have shape {:?} BF16", spec.shape),
    }
}

fn take_u8(c: &ModelConfig, get: Getter<'_>, name: &str) -> anyhow::Result<Tensor<u8>> {
    let spec = spec_for(c, name)?;
    match get(&spec)? {
        AnyTensor::U8(t) if t.shape() == spec.shape.as_slice() => Ok(t),
        _ => anyhow::bail!("tensor `{name}` does not have shape {:?} U8", spec.shape),
    }
}

/// The spec of tensor `name` for shape `c`.
pub fn spec_for(c: &ModelConfig, name: &str) -> anyhow::Result<TensorSpec> {
    let (h, v) = (c.hidden_size, c.vocab_size);
    let (shape, dtype) = match name {
        "model.embed_tokens.weight" | "lm_head.weight" => (vec![v, h], DType::Bf16),
        "model.norm.weight" => (vec![h], DType::Bf16),
        _ => {
            let rest = name.strip_prefix("model.layers.").unwrap_or("");
            let (idx, suffix) = rest.split_once('.').unwrap_or(("", ""));
            let in_range = idx.parse::<usize>().is_ok_and(|l| l < c.num_hidden_layers);
            match layer_tensor_spec(c, suffix) {
                Some(s) if in_range => s,
                _ => anyhow::bail!("`{name}` is not a gpt-oss tensor of this config"),
            }
        }
    };
    Ok(TensorSpec {
        name: name.to_string(),
        shape,
        dtype,
    })
}

/// The dtype of a checkpoint tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// bfloat16.
    Bf16,
    /// Unsigned byte (MXFP4 blocks and scales).
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::U8 => 1,
        }
    }

    /// safetensors name.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "BF16",
            DType::U8 => "U8",
        }
    }
}

/// One tensor a checkpoint must contain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// HF release name.
    pub name: String,
    /// Expected shape.
    pub shape: Vec<usize>,
    /// Expected dtype.
    pub dtype: DType,
}

impl TensorSpec {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Per-layer tensor names (after `model.layers.N.`), in [`LayerWeights`] field order.
pub const LAYER_TENSORS: [&str; 19] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "self_attn.o_proj.bias",
    "self_attn.sinks",
    "post_attention_layernorm.weight",
    "mlp.router.weight",
    "mlp.router.bias",
    "mlp.experts.gate_up_proj_blocks",
    "mlp.experts.gate_up_proj_scales",
    "mlp.experts.gate_up_proj_bias",
    "mlp.experts.down_proj_blocks",
    "mlp.experts.down_proj_scales",
    "mlp.experts.down_proj_bias",
];

/// Shape and dtype of per-layer tensor `suffix` (one of [`LAYER_TENSORS`]).
pub fn layer_tensor_spec(c: &ModelConfig, suffix: &str) -> Option<(Vec<usize>, DType)> {
    let (h, q, kv, e) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.num_local_experts);
    let (i2, i) = (2 * c.intermediate_size, c.intermediate_size);
    let bf = DType::Bf16;
    let u8_ = DType::U8;
    Some(match suffix {
        "input_layernorm.weight" | "post_attention_layernorm.weight" => (vec![h], bf),
        "self_attn.q_proj.weight" => (vec![q, h], bf),
        "self_attn.q_proj.bias" => (vec![q], bf),
        "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => (vec![kv, h], bf),
        "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => (vec![kv], bf),
        "self_attn.o_proj.weight" => (vec![h, q], bf),
        "self_attn.o_proj.bias" => (vec![h], bf),
        "self_attn.sinks" => (vec![c.num_attention_heads], bf),
        "mlp.router.weight" => (vec![e, h], bf),
        "mlp.router.bias" => (vec![e], bf),
        "mlp.experts.gate_up_proj_blocks" => (vec![e, i2, h / MXFP4_GROUP, BLOCK_BYTES], u8_),
        "mlp.experts.gate_up_proj_scales" => (vec![e, i2, h / MXFP4_GROUP], u8_),
        "mlp.experts.gate_up_proj_bias" => (vec![e, i2], bf),
        "mlp.experts.down_proj_blocks" => (vec![e, h, i / MXFP4_GROUP, BLOCK_BYTES], u8_),
        "mlp.experts.down_proj_scales" => (vec![e, h, i / MXFP4_GROUP], u8_),
        "mlp.experts.down_proj_bias" => (vec![e, h], bf),
        _ => return None,
    })
}

/// Every tensor a gpt-oss checkpoint of shape `c` must hold, in a fixed order
/// (globals first, then each layer in [`LAYER_TENSORS`] order).
pub fn expected_tensors(c: &ModelConfig) -> Vec<TensorSpec> {
    let (h, v) = (c.hidden_size, c.vocab_size);
    let globals = [
        ("model.embed_tokens.weight", vec![v, h]),
        ("model.norm.weight", vec![h]),
        ("lm_head.weight", vec![v, h]),
    ];
    let mut out: Vec<TensorSpec> = globals
        .into_iter()
        .map(|(name, shape)| TensorSpec {
            name: name.into(),
            shape,
            dtype: DType::Bf16,
        })
        .collect();
    for l in 0..c.num_hidden_layers {
        for suffix in LAYER_TENSORS {
            if let Some((shape, dtype)) = layer_tensor_spec(c, suffix) {
                out.push(TensorSpec {
                    name: format!("model.layers.{l}.{suffix}"),
                    shape,
                    dtype,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_bf16_views_are_copied_aligned_ones_mapped() {
        let mut f = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0u8..16).collect();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        // SAFETY: a private temp file nobody else writes.
        let map = Arc::new(unsafe { Mmap::map(&f) }.unwrap());
        let odd = Tensor::<bf16>::from_mapped(&map, &map[1..5], vec![2]);
        let even = Tensor::<bf16>::from_mapped(&map, &map[2..6], vec![2]);
        assert!(!odd.is_mapped() && even.is_mapped());
        assert_eq!(odd.data()[0].to_bits(), u16::from_le_bytes([1, 2]));
        assert_eq!(odd.data()[1].to_bits(), u16::from_le_bytes([3, 4]));
        assert_eq!(even.data()[1].to_bits(), u16::from_le_bytes([4, 5]));
    }

    #[test]
    fn expected_tensors_follow_the_release_table() {
        let c = crate::engine::synthetic::config("gpt-oss-120b").unwrap();
        let t = expected_tensors(&c);
        assert_eq!(t.len(), 3 + 36 * LAYER_TENSORS.len());
        let find = |n: &str| t.iter().find(|s| s.name == n).unwrap().shape.clone();
        assert_eq!(
            find("model.layers.35.mlp.experts.gate_up_proj_blocks"),
            vec![128, 5760, 90, 16]
        );
        assert_eq!(
            find("model.layers.0.mlp.experts.down_proj_scales"),
            vec![128, 2880, 90]
        );
        assert_eq!(
            find("model.layers.7.self_attn.o_proj.weight"),
            vec![2880, 4096]
        );
        assert_eq!(find("lm_head.weight"), vec![201088, 2880]);
        assert!(spec_for(&c, "model.layers.36.self_attn.sinks").is_err());
    }
}

//! Synthetic models: exactly the shape of a named gpt-oss model with deterministic
//! pseudo-random weights, for benchmarking where no checkpoint can be downloaded.
//!
//! Every element is a pure function of (seed, tensor, index), the scheme the CUDA backend's
//! `fill_bf16`/`fill_u8` kernels (engine-kernels/synthetic.cu) implement, so the GPU can
//! generate the same model on the device without a host copy:
//! tensor stream seed `splitmix64(seed ^ (layer << 16 | kind))` (globals use layer 0xFFFF),
//! element hash `splitmix64(stream ^ index · 0xD1342543DE82EF95)`, and see [`stream_for`]
//! for each tensor's kind, offset in its stream and distribution.

use anyhow::{Result, bail};
use half::bf16;
use rayon::prelude::*;

use super::config::ModelConfig;
use super::weights::{AnyTensor, DType, Tensor, TensorSpec, Weights, expected_tensors};

/// Names accepted by [`config`] and [`build`].
pub const NAMES: [&str; 3] = ["gpt-oss-120b", "gpt-oss-20b", "tiny"];

/// The shape of synthetic model `name`.
pub fn config(name: &str) -> Result<ModelConfig> {
    let (layers, hidden, heads, kv_heads, experts, intermediate) = match name {
        "gpt-oss-120b" => (36, 2880, 64, 8, 128, 2880),
        "gpt-oss-20b" => (24, 2880, 64, 8, 32, 2880),
        // Small enough for debug-build tests, but with the real vocabulary so the
        // o200k_harmony tokenizer works unchanged (the lm_head is then 201088 × 128).
        "tiny" => (4, 128, 8, 2, 8, 96),
        other => bail!(
            "unknown synthetic model {other:?}; choose one of {}",
            NAMES.join(", ")
        ),
    };
    let cfg = ModelConfig {
        num_hidden_layers: layers,
        hidden_size: hidden,
        head_dim: 64,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        num_local_experts: experts,
        num_experts_per_tok: 4,
        intermediate_size: intermediate,
        vocab_size: 201_088,
        // tiny's short window makes sliding layers matter in short tests.
        sliding_window: if name == "tiny" { 8 } else { 128 },
        layer_is_sliding: (0..layers).map(|i| i % 2 == 0).collect(),
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
    };
    cfg.validate()?;
    Ok(cfg)
}

/// splitmix64 finaliser.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 64 random bits behind element `index` of the stream seeded `stream`.
pub fn element_hash(stream: u64, index: u64) -> u64 {
    splitmix64(stream ^ index.wrapping_mul(0xD134_2543_DE82_EF95))
}

/// Uniform in [0, 1) from the top 24 bits of `h` (exact in f32).
pub fn unit(h: u64) -> f32 {
    (h >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// How a tensor's elements are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// bf16 of `offset + scale · (2u − 1)` (multiply, then add; no fused multiply-add).
    Bf16 {
        /// Half-width.
        scale: f32,
        /// Centre.
        offset: f32,
    },
    /// `lo + h mod (hi − lo + 1)`.
    U8 {
        /// Smallest byte.
        lo: u8,
        /// Largest byte.
        hi: u8,
    },
}

/// Where a tensor's elements come from: element `i` is element `start + i` of stream `seed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    /// Stream seed.
    pub seed: u64,
    /// Offset of the tensor's first element in the stream.
    pub start: u64,
    /// Distribution.
    pub fill: Fill,
}

/// Seed of the stream of tensor `kind` in `layer` (0xFFFF for the global tensors).
pub fn stream_seed(seed: u64, layer: u64, kind: u64) -> u64 {
    splitmix64(seed ^ (layer << 16 | kind))
}

/// MXFP4 scale bytes putting weights near 1/sqrt(fan_in) (E2M1 magnitudes average ~2.6):
/// the nearest power of two and its neighbours.
pub fn scale_range(fan_in: usize) -> (u8, u8) {
    let centre = 127.0 + (1.0 / (2.6 * (fan_in as f64).sqrt())).log2().round();
    let c = centre.clamp(2.0, 250.0) as u8;
    (c - 1, c + 1)
}

/// The stream behind checkpoint tensor `name` of a synthetic model of shape `c`.
/// q, k and v (weights and biases) are consecutive slices of one stream, as the CUDA
/// backend stacks them.
pub fn stream_for(c: &ModelConfig, seed: u64, name: &str) -> Result<Stream> {
    let (h, qd, kvd) = (c.hidden_size as u64, c.q_dim() as u64, c.kv_dim() as u64);
    let inv = |n: u64| 1.0 / (n as f32).sqrt();
    let bf = |scale: f32, offset: f32| Fill::Bf16 { scale, offset };
    let global = |kind, fill| Stream {
        seed: stream_seed(seed, 0xFFFF, kind),
        start: 0,
        fill,
    };
    match name {
        "model.embed_tokens.weight" => return Ok(global(0, bf(1.0, 0.0))),
        "model.norm.weight" => return Ok(global(1, bf(0.1, 1.0))),
        "lm_head.weight" => return Ok(global(2, bf(inv(h), 0.0))),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.").unwrap_or("");
    let (layer, suffix) = rest.split_once('.').unwrap_or(("", ""));
    let Ok(layer) = layer.parse::<u64>() else {
        bail!("`{name}` is not a gpt-oss tensor");
    };
    let (kind, start, fill) = match suffix {
        "input_layernorm.weight" => (0, 0, bf(0.1, 1.0)),
        "self_attn.q_proj.weight" => (1, 0, bf(inv(h), 0.0)),
        "self_attn.k_proj.weight" => (1, qd * h, bf(inv(h), 0.0)),
        "self_attn.v_proj.weight" => (1, (qd + kvd) * h, bf(inv(h), 0.0)),
        "self_attn.q_proj.bias" => (2, 0, bf(0.1, 0.0)),
        "self_attn.k_proj.bias" => (2, qd, bf(0.1, 0.0)),
        "self_attn.v_proj.bias" => (2, qd + kvd, bf(0.1, 0.0)),
        "self_attn.o_proj.weight" => (3, 0, bf(inv(qd), 0.0)),
        "self_attn.o_proj.bias" => (4, 0, bf(0.1, 0.0)),
        "self_attn.sinks" => (5, 0, bf(1.0, 0.0)),
        "post_attention_layernorm.weight" => (6, 0, bf(0.1, 1.0)),
        "mlp.router.weight" => (7, 0, bf(inv(h), 0.0)),
        "mlp.router.bias" => (8, 0, bf(0.1, 0.0)),
        "mlp.experts.gate_up_proj_blocks" => (9, 0, Fill::U8 { lo: 0, hi: 255 }),
        "mlp.experts.gate_up_proj_scales" => {
            let (lo, hi) = scale_range(c.hidden_size);
            (10, 0, Fill::U8 { lo, hi })
        }
        "mlp.experts.gate_up_proj_bias" => (11, 0, bf(0.1, 0.0)),
        "mlp.experts.down_proj_blocks" => (12, 0, Fill::U8 { lo: 0, hi: 255 }),
        "mlp.experts.down_proj_scales" => {
            let (lo, hi) = scale_range(c.intermediate_size);
            (13, 0, Fill::U8 { lo, hi })
        }
        "mlp.experts.down_proj_bias" => (14, 0, bf(0.1, 0.0)),
        _ => bail!("`{name}` is not a gpt-oss tensor"),
    };
    Ok(Stream {
        seed: stream_seed(seed, layer, kind),
        start,
        fill,
    })
}

/// Bytes of host memory `name`'s weights take.
pub fn host_bytes(name: &str) -> Result<u64> {
    Ok(expected_tensors(&config(name)?)
        .iter()
        .map(|t| t.bytes() as u64)
        .sum())
}

/// Build synthetic model `name` in host memory. Refuses (rather than swapping or being
/// killed) when the weights exceed the memory available now — synthetic gpt-oss-120b
/// (~65 GB) is meant to be generated on the GPU from [`element_hash`], not on the host.
pub fn build(name: &str, seed: u64) -> Result<Weights> {
    let cfg = config(name)?;
    let need = host_bytes(name)?;
    let avail = available_memory();
    if let Some(avail) = avail.filter(|&a| need > a) {
        bail!(
            "synthetic {name} needs {:.1} GB of host memory but only {:.1} GB is available; \
             use a smaller synthetic model (tiny, gpt-oss-20b) on the CPU, or --device cuda",
            need as f64 / 1e9,
            avail as f64 / 1e9
        );
    }
    let c = cfg.clone();
    Weights::assemble(cfg, format!("synthetic:{name}"), |spec| {
        generate(spec, &stream_for(&c, seed, &spec.name)?)
    })
}

/// Generate one tensor from its stream (in parallel over elements).
pub fn generate(spec: &TensorSpec, stream: &Stream) -> Result<AnyTensor> {
    let n = spec.shape.iter().product::<usize>() as u64;
    let range = stream.start..stream.start + n;
    Ok(match (spec.dtype, stream.fill) {
        (DType::Bf16, Fill::Bf16 { scale, offset }) => {
            let data: Vec<bf16> = range
                .into_par_iter()
                .map(|i| {
                    let u = unit(element_hash(stream.seed, i));
                    bf16::from_f32(offset + scale * (2.0 * u - 1.0))
                })
                .collect();
            AnyTensor::Bf16(Tensor::owned(data, spec.shape.clone()))
        }
        (DType::U8, Fill::U8 { lo, hi }) => {
            let span = u64::from(hi - lo) + 1;
            let data: Vec<u8> = range
                .into_par_iter()
                .map(|i| lo + (element_hash(stream.seed, i) % span) as u8)
                .collect();
            AnyTensor::U8(Tensor::owned(data, spec.shape.clone()))
        }
        _ => bail!(
            "tensor `{}`: dtype {:?} does not match its fill",
            spec.name,
            spec.dtype
        ),
    })
}

fn available_memory() -> Option<u64> {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::nothing().with_memory(MemoryRefreshKind::everything()),
    )
    .ok()?;
    Some(sys.available_memory()).filter(|&a| a > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_covers_the_interval_exactly() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u64::MAX) < 1.0 && unit(u64::MAX) > 0.99999);
    }

    #[test]
    fn streams_are_deterministic_seeded_and_in_range() {
        let c = config("tiny").unwrap();
        let spec = TensorSpec {
            name: "model.layers.0.mlp.experts.down_proj_scales".into(),
            shape: vec![8, 128, 3],
            dtype: DType::U8,
        };
        let bytes =
            |seed| match generate(&spec, &stream_for(&c, seed, &spec.name).unwrap()).unwrap() {
                AnyTensor::U8(t) => t.data().to_vec(),
                AnyTensor::Bf16(_) => Vec::new(),
            };
        let (a, b, other) = (bytes(7), bytes(7), bytes(8));
        assert_eq!(a.len(), 8 * 128 * 3);
        assert_eq!(a, b);
        assert_ne!(a, other);
        let (lo, hi) = scale_range(96);
        assert_eq!((lo, hi), (121, 123));
        assert!(a.iter().all(|s| (lo..=hi).contains(s)));
    }

    #[test]
    fn values_match_an_independent_implementation() {
        // Golden values from a separate Python implementation of the documented scheme.
        let c = config("tiny").unwrap();
        let emb = stream_for(&c, 42, "model.embed_tokens.weight").unwrap();
        assert_eq!(emb.seed, 0x4bf7_3990_75b1_6a31);
        let spec = TensorSpec {
            name: "model.embed_tokens.weight".into(),
            shape: vec![1, 3],
            dtype: DType::Bf16,
        };
        let AnyTensor::Bf16(t) = generate(&spec, &emb).unwrap() else {
            panic!("bf16 expected")
        };
        let bits: Vec<u16> = t.data().iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, vec![0xbece, 0xbf43, 0x3f0d]);
        let name = "model.layers.3.mlp.experts.gate_up_proj_scales";
        let spec = TensorSpec {
            name: name.into(),
            shape: vec![4],
            dtype: DType::U8,
        };
        let AnyTensor::U8(t) = generate(&spec, &stream_for(&c, 42, name).unwrap()).unwrap() else {
            panic!("u8 expected")
        };
        assert_eq!(t.data(), &[122, 121, 122, 122]);
    }

    #[test]
    fn q_k_v_are_consecutive_slices_of_one_stream() {
        let c = config("tiny").unwrap();
        let q = stream_for(&c, 1, "model.layers.2.self_attn.q_proj.weight").unwrap();
        let v = stream_for(&c, 1, "model.layers.2.self_attn.v_proj.weight").unwrap();
        assert_eq!(q.seed, v.seed);
        assert_eq!(v.start, ((c.q_dim() + c.kv_dim()) * c.hidden_size) as u64);
        let other_layer = stream_for(&c, 1, "model.layers.3.self_attn.q_proj.weight").unwrap();
        assert_ne!(q.seed, other_layer.seed);
        assert!(stream_for(&c, 1, "model.layers.2.mlp.gate").is_err());
    }

    #[test]
    fn named_shapes_match_the_release_models() {
        let c = config("gpt-oss-120b").unwrap();
        assert_eq!(
            (c.num_hidden_layers, c.num_local_experts, c.q_dim()),
            (36, 128, 4096)
        );
        let b = host_bytes("gpt-oss-120b").unwrap();
        assert!(b > 60_000_000_000 && b < 70_000_000_000, "{b}");
        assert!(config("gpt-oss-7b").is_err());
    }
}

//! Synthetic models: exactly the shape of a named gpt-oss model with deterministic
//! pseudo-random weights, for benchmarking where no checkpoint can be downloaded.
//!
//! Every value is a pure function of (seed, tensor id, element index) — see [`element_hash`] —
//! so a GPU backend can generate the same weights on the device without a host copy.
//! Tensor ids are positions in [`expected_tensors`] order.

use anyhow::{Result, bail};
use half::bf16;
use rayon::prelude::*;

use super::config::ModelConfig;
use super::weights::{AnyTensor, DType, Tensor, TensorSpec, Weights, expected_tensors};

/// Names accepted by [`config`] and [`build`].
pub const NAMES: [&str; 3] = ["gpt-oss-120b", "gpt-oss-20b", "tiny"];

/// Lowest MXFP4 scale byte drawn (2^-8).
pub const SCALE_MIN: u8 = 119;
/// Number of distinct scale bytes drawn (119..=123, i.e. 2^-8..2^-4).
pub const SCALE_SPAN: u64 = 5;

/// The shape of synthetic model `name`.
pub fn config(name: &str) -> Result<ModelConfig> {
    let (layers, hidden, heads, kv_heads, experts, intermediate) = match name {
        "gpt-oss-120b" => (36, 2880, 64, 8, 128, 2880),
        "gpt-oss-20b" => (24, 2880, 64, 8, 32, 2880),
        // Small enough for debug-build tests, but with the real vocabulary so the
        // o200k_harmony tokenizer works unchanged (the lm_head is then 201088 × 64).
        "tiny" => (4, 64, 4, 2, 8, 64),
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
        sliding_window: 128,
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

/// The 64 random bits behind element `index` of tensor `tensor_id`.
pub fn element_hash(seed: u64, tensor_id: u64, index: u64) -> u64 {
    splitmix64(splitmix64(seed ^ splitmix64(tensor_id)) ^ index)
}

/// Uniform in [-1, 1): the top 24 bits of `h` scaled (exact in f32).
pub fn unit(h: u64) -> f32 {
    (h >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// How a bf16 tensor's values are drawn: `offset + amplitude · unit`.
pub fn bf16_law(spec: &TensorSpec) -> (f32, f32) {
    let n = &spec.name;
    if n.ends_with("layernorm.weight") || n == "model.norm.weight" {
        (1.0, 0.1)
    } else if n.ends_with("sinks") || n == "model.embed_tokens.weight" {
        (0.0, 1.0)
    } else if n.ends_with("bias") {
        (0.0, 0.1)
    } else {
        // Uniform with standard deviation 1/sqrt(fan_in).
        let fan_in = spec.shape.last().copied().unwrap_or(1) as f32;
        (0.0, (3.0 / fan_in).sqrt())
    }
}

/// Byte `index` of a u8 tensor: any value for blocks, [`SCALE_MIN`].. for scales.
pub fn u8_value(spec: &TensorSpec, h: u64) -> u8 {
    if spec.name.ends_with("_scales") {
        SCALE_MIN + ((h >> 32) % SCALE_SPAN) as u8
    } else {
        (h >> 56) as u8
    }
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
    let specs = expected_tensors(&cfg);
    Weights::assemble(cfg, format!("synthetic:{name}"), |spec| {
        let id = specs
            .iter()
            .position(|s| s.name == spec.name)
            .unwrap_or(usize::MAX) as u64;
        Ok(generate(spec, seed, id))
    })
}

/// Generate one tensor (in parallel over elements).
pub fn generate(spec: &TensorSpec, seed: u64, tensor_id: u64) -> AnyTensor {
    let n: usize = spec.shape.iter().product();
    match spec.dtype {
        DType::Bf16 => {
            let (offset, amp) = bf16_law(spec);
            let data: Vec<bf16> = (0..n as u64)
                .into_par_iter()
                .map(|i| bf16::from_f32(offset + amp * unit(element_hash(seed, tensor_id, i))))
                .collect();
            AnyTensor::Bf16(Tensor::owned(data, spec.shape.clone()))
        }
        DType::U8 => {
            let data: Vec<u8> = (0..n as u64)
                .into_par_iter()
                .map(|i| u8_value(spec, element_hash(seed, tensor_id, i)))
                .collect();
            AnyTensor::U8(Tensor::owned(data, spec.shape.clone()))
        }
    }
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
        assert_eq!(unit(0), -1.0);
        assert!(unit(u64::MAX) < 1.0 && unit(u64::MAX) > 0.9999);
    }

    #[test]
    fn tiny_is_deterministic_and_seed_dependent() {
        let spec = TensorSpec {
            name: "model.layers.0.mlp.experts.down_proj_scales".into(),
            shape: vec![4, 64, 2],
            dtype: DType::U8,
        };
        let a = match generate(&spec, 7, 3) {
            AnyTensor::U8(t) => t.data().to_vec(),
            AnyTensor::Bf16(_) => Vec::new(),
        };
        let b = match generate(&spec, 7, 3) {
            AnyTensor::U8(t) => t.data().to_vec(),
            AnyTensor::Bf16(_) => Vec::new(),
        };
        let c = match generate(&spec, 8, 3) {
            AnyTensor::U8(t) => t.data().to_vec(),
            AnyTensor::Bf16(_) => Vec::new(),
        };
        assert_eq!(a.len(), 512);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(
            a.iter()
                .all(|&s| (SCALE_MIN..SCALE_MIN + SCALE_SPAN as u8).contains(&s))
        );
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

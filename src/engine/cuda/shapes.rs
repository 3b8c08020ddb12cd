//! Model shapes for synthetic runs: the two gpt-oss releases and a tiny model for
//! end-to-end checks (hidden 128, 4 layers, window 8, the real YaRN parameters).

use anyhow::{Result, bail};

use crate::engine::config::ModelConfig;

/// The gpt-oss shape with `layers` layers, `experts` experts (sizes as released).
fn gpt_oss(layers: usize, experts: usize) -> ModelConfig {
    ModelConfig {
        num_hidden_layers: layers,
        hidden_size: 2880,
        head_dim: 64,
        num_attention_heads: 64,
        num_key_value_heads: 8,
        num_local_experts: experts,
        num_experts_per_tok: 4,
        intermediate_size: 2880,
        vocab_size: 201_088,
        sliding_window: 128,
        layer_is_sliding: (0..layers).map(|l| l % 2 == 0).collect(),
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

/// `gpt-oss-120b`, `gpt-oss-20b` or `tiny`.
pub fn synthetic_config(name: &str) -> Result<ModelConfig> {
    Ok(match name {
        "gpt-oss-120b" => gpt_oss(36, 128),
        "gpt-oss-20b" => gpt_oss(24, 32),
        "tiny" => ModelConfig {
            hidden_size: 128,
            num_attention_heads: 8,
            num_key_value_heads: 2,
            num_local_experts: 8,
            intermediate_size: 96,
            vocab_size: 512,
            sliding_window: 8,
            ..gpt_oss(4, 8)
        },
        other => bail!("unknown synthetic model {other:?}; use gpt-oss-120b, gpt-oss-20b or tiny"),
    })
}

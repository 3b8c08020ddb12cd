//! Model configuration, read from a checkpoint's `config.json` (or built for a synthetic model).

use serde::{Deserialize, Serialize};

/// The shape of a gpt-oss model. Every size the engine uses comes from here;
/// nothing assumes the 20b/120b numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub num_hidden_layers: usize,
    pub hidden_size: usize,
    pub head_dim: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub sliding_window: usize,
    /// Per layer: `true` for sliding-window attention, `false` for full causal.
    pub layer_is_sliding: Vec<bool>,
    pub rope_theta: f64,
    pub rope_scaling_factor: f64,
    pub rope_original_max_position: usize,
    pub rope_beta_fast: f64,
    pub rope_beta_slow: f64,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub swiglu_limit: f64,
    pub eos_token_id: u32,
    pub pad_token_id: u32,
}

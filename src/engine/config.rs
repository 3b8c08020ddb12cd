//! Model configuration, read from a checkpoint's `config.json` (or built for a synthetic model).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The shape of a gpt-oss model. Every size the engine uses comes from here;
/// nothing assumes the 20b/120b numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of one attention head (64 for gpt-oss; not hidden / heads).
    pub head_dim: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer (GQA).
    pub num_key_value_heads: usize,
    /// Experts per MoE layer.
    pub num_local_experts: usize,
    /// Experts routed per token.
    pub num_experts_per_tok: usize,
    /// Expert intermediate width (the fused gate_up output is twice this).
    pub intermediate_size: usize,
    /// Rows of the embedding and unembedding.
    pub vocab_size: usize,
    /// Keys visible to a query on a sliding layer, the query's own position included.
    pub sliding_window: usize,
    /// Per layer: `true` for sliding-window attention, `false` for full causal.
    pub layer_is_sliding: Vec<bool>,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// YaRN scaling factor (1.0 means plain RoPE).
    pub rope_scaling_factor: f64,
    /// YaRN original context length.
    pub rope_original_max_position: usize,
    /// YaRN β_fast.
    pub rope_beta_fast: f64,
    /// YaRN β_slow.
    pub rope_beta_slow: f64,
    /// Longest sequence the model supports.
    pub max_position_embeddings: usize,
    /// RMSNorm ε.
    pub rms_norm_eps: f64,
    /// SwiGLU clamp limit.
    pub swiglu_limit: f64,
    /// End-of-sequence token id.
    pub eos_token_id: u32,
    /// Padding token id.
    pub pad_token_id: u32,
}

/// MXFP4 values are packed in groups of this many along the reduction axis.
pub const MXFP4_GROUP: usize = 32;

impl ModelConfig {
    /// Parse an HF `config.json` of a gpt-oss checkpoint (MXFP4 experts) and validate it.
    pub fn from_hf_json(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading model config {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        let cfg = Self::from_hf_value(&v).with_context(|| {
            format!(
                "{}: not a usable gpt-oss config (expected an HF gpt-oss config.json with MXFP4 experts)",
                path.display()
            )
        })?;
        Ok(cfg)
    }

    /// Parse an already-decoded HF config (see [`ModelConfig::from_hf_json`]).
    pub fn from_hf_value(v: &Value) -> Result<ModelConfig> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "gpt_oss" {
            bail!("model_type is {model_type:?}, not \"gpt_oss\"");
        }
        let quant = v
            .get("quantization_config")
            .and_then(|q| q.get("quant_method"))
            .and_then(Value::as_str);
        if quant != Some("mxfp4") {
            bail!(
                "quantization_config.quant_method is {quant:?}, expected \"mxfp4\": only \
                 checkpoints with MXFP4 experts (the official release layout) are supported"
            );
        }
        let usize_key = |k: &str| -> Result<usize> {
            let x = v.get(k).with_context(|| format!("missing key `{k}`"))?;
            x.as_u64()
                .map(|n| n as usize)
                .with_context(|| format!("key `{k}` is not a non-negative integer: {x}"))
        };
        let f64_in = |obj: &Value, k: &str| -> Option<f64> { obj.get(k).and_then(Value::as_f64) };

        let num_hidden_layers = usize_key("num_hidden_layers")?;
        let sliding_window = usize_key("sliding_window")?;
        let layer_is_sliding = match v.get("layer_types") {
            Some(Value::Array(types)) => types
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => bail!(
                        "layer_types[{i}] is {t}, expected sliding_attention or full_attention"
                    ),
                })
                .collect::<Result<Vec<bool>>>()?,
            Some(other) => bail!("layer_types is not a list: {other}"),
            None => (0..num_hidden_layers).map(|i| i % 2 == 0).collect(),
        };

        // transformers 4.x writes `rope_scaling` + `rope_theta`; 5.x writes `rope_parameters`.
        let rope = v
            .get("rope_scaling")
            .filter(|r| !r.is_null())
            .or_else(|| v.get("rope_parameters").filter(|r| !r.is_null()))
            .cloned()
            .unwrap_or(Value::Null);
        let rope_theta = f64_in(v, "rope_theta")
            .or_else(|| {
                v.get("rope_parameters")
                    .and_then(|r| f64_in(r, "rope_theta"))
            })
            .context("missing key `rope_theta` (top level or in rope_parameters)")?;
        let rope_type = rope
            .get("rope_type")
            .or_else(|| rope.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let max_position_embeddings = usize_key("max_position_embeddings")?;
        let (factor, original, beta_fast, beta_slow) = match rope_type {
            "yarn" => {
                if rope
                    .get("truncate")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                {
                    bail!("rope_scaling.truncate = true is not supported (gpt-oss uses false)");
                }
                (
                    f64_in(&rope, "factor").context("rope_scaling.factor missing")?,
                    rope.get("original_max_position_embeddings")
                        .and_then(Value::as_u64)
                        .context("rope_scaling.original_max_position_embeddings missing")?
                        as usize,
                    f64_in(&rope, "beta_fast").unwrap_or(32.0),
                    f64_in(&rope, "beta_slow").unwrap_or(1.0),
                )
            }
            "default" => (1.0, max_position_embeddings, 32.0, 1.0),
            other => bail!("rope type {other:?} is not supported (gpt-oss uses yarn)"),
        };

        let first_id = |k: &str| -> Option<u32> {
            match v.get(k) {
                Some(Value::Number(n)) => n.as_u64().map(|n| n as u32),
                Some(Value::Array(a)) => a.first().and_then(Value::as_u64).map(|n| n as u32),
                _ => None,
            }
        };
        let vocab_size = usize_key("vocab_size")?;
        let cfg = ModelConfig {
            num_hidden_layers,
            hidden_size: usize_key("hidden_size")?,
            head_dim: usize_key("head_dim")?,
            num_attention_heads: usize_key("num_attention_heads")?,
            num_key_value_heads: usize_key("num_key_value_heads")?,
            num_local_experts: usize_key("num_local_experts")?,
            num_experts_per_tok: usize_key("num_experts_per_tok")
                .or_else(|_| usize_key("experts_per_token"))?,
            intermediate_size: usize_key("intermediate_size")?,
            vocab_size,
            sliding_window,
            layer_is_sliding,
            rope_theta,
            rope_scaling_factor: factor,
            rope_original_max_position: original,
            rope_beta_fast: beta_fast,
            rope_beta_slow: beta_slow,
            max_position_embeddings,
            rms_norm_eps: f64_in(v, "rms_norm_eps").context("missing key `rms_norm_eps`")?,
            // Absent from transformers-written configs, whose model hard-codes 7.0.
            swiglu_limit: f64_in(v, "swiglu_limit").unwrap_or(7.0),
            eos_token_id: first_id("eos_token_id").unwrap_or(vocab_size.saturating_sub(1) as u32),
            pad_token_id: first_id("pad_token_id").unwrap_or(0),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check the internal consistency every backend relies on.
    pub fn validate(&self) -> Result<()> {
        let nonzero = [
            ("num_hidden_layers", self.num_hidden_layers),
            ("hidden_size", self.hidden_size),
            ("head_dim", self.head_dim),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("num_local_experts", self.num_local_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("sliding_window", self.sliding_window),
        ];
        for (k, n) in nonzero {
            if n == 0 {
                bail!("`{k}` must be positive");
            }
        }
        if self.layer_is_sliding.len() != self.num_hidden_layers {
            bail!(
                "layer_types has {} entries but num_hidden_layers is {}",
                self.layer_is_sliding.len(),
                self.num_hidden_layers
            );
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!("head_dim {} must be even for RoPE", self.head_dim);
        }
        if self.num_experts_per_tok > self.num_local_experts {
            bail!(
                "num_experts_per_tok {} exceeds num_local_experts {}",
                self.num_experts_per_tok,
                self.num_local_experts
            );
        }
        for (k, n) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
        ] {
            if !n.is_multiple_of(MXFP4_GROUP) {
                bail!("`{k}` = {n} is not a multiple of the MXFP4 group size {MXFP4_GROUP}");
            }
        }
        if self.rope_scaling_factor < 1.0 || self.rope_theta <= 1.0 {
            bail!("rope_theta must exceed 1 and the YaRN factor must be at least 1");
        }
        Ok(())
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The gpt-oss-20b release config.json (transformers 4.x style keys).
    fn release_20b() -> Value {
        let layer_types: Vec<&str> = (0..24)
            .map(|i| {
                if i % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        json!({
            "architectures": ["GptOssForCausalLM"], "attention_bias": true, "eos_token_id": 200002,
            "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
            "initial_context_length": 4096, "intermediate_size": 2880, "layer_types": layer_types,
            "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
            "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
            "num_local_experts": 32, "pad_token_id": 199999,
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
                ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
            "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
            "tie_word_embeddings": false, "vocab_size": 201088
        })
    }

    #[test]
    fn release_config_parses_to_the_20b_shape() {
        let c = ModelConfig::from_hf_value(&release_20b()).unwrap();
        assert_eq!(c, crate::engine::synthetic::config("gpt-oss-20b").unwrap());
        assert_eq!((c.q_dim(), c.kv_dim()), (4096, 512));
    }

    #[test]
    fn transformers_5_rope_parameters_and_missing_layer_types() {
        let mut v = release_20b();
        let o = v.as_object_mut().unwrap();
        let mut rope = o.remove("rope_scaling").unwrap();
        rope["rope_theta"] = o.remove("rope_theta").unwrap();
        o.insert("rope_parameters".into(), rope);
        o.remove("layer_types");
        o.remove("swiglu_limit");
        let c = ModelConfig::from_hf_value(&v).unwrap();
        assert_eq!(c.rope_theta, 150000.0);
        assert_eq!(c.rope_scaling_factor, 32.0);
        assert_eq!(c.swiglu_limit, 7.0);
        assert!(c.layer_is_sliding[0] && !c.layer_is_sliding[1] && c.layer_is_sliding[22]);
    }

    #[test]
    fn inconsistent_configs_are_errors() {
        let cases: [(&str, Value); 4] = [
            ("layer_types", json!(["sliding_attention"])),
            ("hidden_size", json!(2881)),
            ("num_experts_per_tok", json!(64)),
            ("model_type", json!("mixtral")),
        ];
        for (key, val) in cases {
            let mut v = release_20b();
            v[key] = val;
            let e = ModelConfig::from_hf_value(&v).unwrap_err();
            assert!(
                format!("{e:#}").contains(key) || key == "model_type",
                "{key}: {e:#}"
            );
        }
        let mut v = release_20b();
        v["rope_scaling"]["truncate"] = json!(true);
        assert!(ModelConfig::from_hf_value(&v).is_err());
    }
}

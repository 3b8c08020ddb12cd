//! RoPE-YaRN frequency table, computed once on the host from the model config and uploaded.

use crate::engine::config::ModelConfig;

/// Per pair i < head_dim/2: the YaRN-blended inverse frequency, and the attention
/// concentration factor that multiplies both cos and sin (for q and for k).
pub fn yarn_inv_freq(cfg: &ModelConfig) -> (Vec<f32>, f32) {
    let d = cfg.head_dim as f64;
    let base = cfg.rope_theta;
    let factor = cfg.rope_scaling_factor;
    let orig = cfg.rope_original_max_position as f64;
    let corr_dim =
        |rot: f64| d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    // Not rounded (gpt-oss uses YaRN without truncation).
    let low = corr_dim(cfg.rope_beta_fast);
    let high = corr_dim(cfg.rope_beta_slow);
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| {
            let f = base.powf(-2.0 * i as f64 / d);
            let r = if factor > 1.0 {
                ((i as f64 - low) / (high - low).max(1e-3)).clamp(0.0, 1.0)
            } else {
                0.0
            };
            (f * (1.0 - r) + f / factor * r) as f32
        })
        .collect();
    let mscale = if factor > 1.0 {
        (0.1 * factor.ln() + 1.0) as f32
    } else {
        1.0
    };
    (inv, mscale)
}

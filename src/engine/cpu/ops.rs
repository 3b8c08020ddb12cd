//! The forward pass stages of gpt-oss in fp32, one function per stage, named like
//! the spec in shared/GPT-OSS.md. Weights are bf16 or packed MXFP4 (decoded inside the dot
//! products); activations are fp32.

use half::bf16;
use mxtune_cpu_kernels::{self as kernels, dot};
use rayon::prelude::*;

use crate::engine::config::ModelConfig;
use crate::engine::mxfp4;
use crate::engine::weights::Mxfp4Experts;

/// SwiGLU sigmoid sharpness α (a model constant, not in config.json).
pub const SWIGLU_ALPHA: f32 = 1.702;

/// Output rows handed to one rayon task in matrix-vector products.
const ROWS_PER_TASK: usize = 64;

/// RMSNorm of every row of `x` (width `w.len()`): `x · rsqrt(mean(x²) + ε) · w`.
pub fn rms_norm(x: &[f32], w: &[bf16], eps: f32) -> Vec<f32> {
    let d = w.len();
    let mut out = vec![0.0; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, xr)| {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let r = 1.0 / (ms + eps).sqrt();
            for ((o, &v), wi) in o.iter_mut().zip(xr).zip(w) {
                *o = v * r * wi.to_f32();
            }
        });
    out
}

/// `y = W x + b` for every row of `x`; `w` is [out, in] row-major bf16. Each weight row is
/// widened to fp32 once and used for every row of `x`.
pub fn linear(x: &[f32], w: &[bf16], bias: Option<&[bf16]>, n_out: usize) -> Vec<f32> {
    let n_in = w.len() / n_out;
    by_weight_row(x, n_in, n_out, |j, scratch| {
        kernels::widen_bf16(&w[j * n_in..(j + 1) * n_in], scratch);
        bias.map_or(0.0, |b| b[j].to_f32())
    })
}

/// `[rows(x), n_out]` where output `j` of row `t` is `dot(row_j, x_t) + bias_j`, and
/// `load(j, scratch)` writes weight row `j` (length `n_in`) into `scratch` and returns `bias_j`.
/// Parallel over weight rows; computed as `[n_out, rows]` and transposed.
fn by_weight_row(
    x: &[f32],
    n_in: usize,
    n_out: usize,
    load: impl Fn(usize, &mut [f32]) -> f32 + Sync,
) -> Vec<f32> {
    let n = x.len() / n_in;
    let mut by_row = vec![0.0f32; n_out * n];
    by_row
        .par_chunks_mut(n)
        .enumerate()
        .with_min_len(ROWS_PER_TASK)
        .for_each_init(
            || vec![0.0f32; n_in],
            |scratch, (j, o)| {
                let b = load(j, scratch);
                kernels::dot_rows(scratch, x, b, o);
            },
        );
    let mut out = vec![0.0f32; n * n_out];
    for (j, col) in by_row.chunks_exact(n).enumerate() {
        for (t, v) in col.iter().enumerate() {
            out[t * n_out + j] = *v;
        }
    }
    out
}

/// YaRN-scaled rotary embedding tables computed from the config.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Inverse frequency of each of the head_dim/2 rotated pairs.
    pub inv_freq: Vec<f32>,
    /// YaRN concentration `0.1·ln(factor) + 1`, multiplied into cos and sin.
    pub attention_scaling: f32,
}

/// YaRN correction dimension: the pair index whose wavelength fits `num_rotations`
/// times into the original context.
fn yarn_correction_dim(num_rotations: f64, dim: f64, base: f64, original: f64) -> f64 {
    dim * (original / (num_rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

impl Rope {
    /// Tables for `c` (no rounding of the YaRN bounds: gpt-oss uses `truncate: false`).
    pub fn new(c: &ModelConfig) -> Rope {
        let dim = c.head_dim as f64;
        let half = c.head_dim / 2;
        let base = c.rope_theta;
        let factor = c.rope_scaling_factor;
        let original = c.rope_original_max_position as f64;
        let low = yarn_correction_dim(c.rope_beta_fast, dim, base, original).max(0.0);
        let mut high = yarn_correction_dim(c.rope_beta_slow, dim, base, original).min(dim - 1.0);
        if high == low {
            high += 0.001; // avoid a zero-width ramp
        }
        let inv_freq = (0..half)
            .map(|i| {
                let f = base.powf(-2.0 * i as f64 / dim);
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                (f * (1.0 - ramp) + f / factor * ramp) as f32
            })
            .collect();
        let attention_scaling = if factor > 1.0 {
            0.1 * factor.ln() + 1.0
        } else {
            1.0
        } as f32;
        Rope {
            inv_freq,
            attention_scaling,
        }
    }

    /// Rotate one head vector in place (rotate-half pairs (i, i + d/2)) for position `pos`.
    pub fn apply_rope(&self, head: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let theta = pos as f32 * f;
            let (s, c) = theta.sin_cos();
            let (c, s) = (c * self.attention_scaling, s * self.attention_scaling);
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
}

/// One query head attending over `n_keys` keys and values (the visible window only) with a
/// learned sink: the sink logit joins the softmax denominator once and has no value.
/// Key `j` is `keys[j·stride ..][..head_dim]`, value `j` likewise, so the cache is read in place.
pub fn attention_with_sinks(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    stride: usize,
    n_keys: usize,
    sink: f32,
    out: &mut [f32],
) {
    let d = q.len();
    let scale = 1.0 / (d as f32).sqrt();
    let scores: Vec<f32> = (0..n_keys)
        .map(|j| dot(q, &keys[j * stride..j * stride + d]) * scale)
        .collect();
    let m = scores.iter().copied().fold(sink, f32::max);
    let mut denom = (sink - m).exp();
    out.fill(0.0);
    for (j, s) in scores.iter().enumerate() {
        let p = (s - m).exp();
        denom += p;
        kernels::axpy(p, &values[j * stride..j * stride + d], out);
    }
    for o in out.iter_mut() {
        *o /= denom;
    }
}

/// First key position a query at `pos` sees: `pos − window + 1` on sliding layers.
pub fn window_start(pos: usize, sliding: bool, window: usize) -> usize {
    if sliding {
        (pos + 1).saturating_sub(window)
    } else {
        0
    }
}

/// Top-k experts by router logit (ties: lower index first) with weights from a softmax
/// over those k logits only.
pub fn route_top_k(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(k);
    let m = idx
        .iter()
        .map(|&i| logits[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = idx.iter().map(|&i| (logits[i] - m).exp()).collect();
    let sum: f32 = exps.iter().sum();
    idx.into_iter()
        .zip(exps)
        .map(|(i, e)| (i, e / sum))
        .collect()
}

/// Clamped SwiGLU over the interleaved gate_up output: gate = u[0::2], lin = u[1::2],
/// `min(gate, L) · σ(α · min(gate, L)) · (clamp(lin, −L, L) + 1)`.
pub fn swiglu(gate_up: &[f32], limit: f32) -> Vec<f32> {
    gate_up
        .chunks_exact(2)
        .map(|p| {
            let gate = p[0].min(limit);
            let lin = p[1].clamp(-limit, limit);
            gate / (1.0 + (-SWIGLU_ALPHA * gate).exp()) * (lin + 1.0)
        })
        .collect()
}

/// `W_e x + b_e` for every row of `x` with packed expert `e`. Each weight row is decoded
/// once into a scratch row and used for all rows of `x` (no dequantized copy of the model).
pub fn mxfp4_linear(p: &Mxfp4Experts, e: usize, x: &[f32]) -> Vec<f32> {
    let bias = p.bias(e);
    by_weight_row(x, p.cols, p.rows, |r, scratch| {
        let (blocks, scales) = p.row(e, r);
        mxfp4::decode_row(blocks, scales, scratch);
        bias[r].to_f32()
    })
}

/// A transform of MoE activations (rows of whole groups of 32), applied where a backend
/// under test quantizes them (see [`super::CpuBackend::set_moe_activation`]).
pub type ActTransform = fn(&[f32]) -> Vec<f32>;

/// One expert's FFN for every row of `h`: gate_up, clamped SwiGLU, down (its bias included);
/// `act` transforms the SwiGLU outputs before the down projection.
pub fn expert_ffn(
    gate_up: &Mxfp4Experts,
    down: &Mxfp4Experts,
    e: usize,
    h: &[f32],
    limit: f32,
    act: Option<ActTransform>,
) -> Vec<f32> {
    let u = mxfp4_linear(gate_up, e, h);
    let mut a = swiglu(&u, limit);
    if let Some(f) = act {
        a = f(&a);
    }
    mxfp4_linear(down, e, &a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_only_enters_the_denominator() {
        // One key: out = e^s v / (e^s + e^S).
        let q = [1.0, 0.0, 0.0, 0.0];
        let k = [2.0, 0.0, 0.0, 0.0]; // score 2 / sqrt(4) = 1
        let v = [1.0, 2.0, 3.0, 4.0];
        let mut out = [0.0; 4];
        attention_with_sinks(&q, &k, &v, 4, 1, 1.0, &mut out);
        for (o, vi) in out.iter().zip(v) {
            assert!((o - vi * 0.5).abs() < 1e-6, "{out:?}");
        }
        // A very negative sink leaves plain softmax; a huge one drives the output to 0.
        attention_with_sinks(&q, &k, &v, 4, 1, -1e4, &mut out);
        assert!((out[3] - 4.0).abs() < 1e-6);
        attention_with_sinks(&q, &k, &v, 4, 1, 1e4, &mut out);
        assert!(out.iter().all(|o| o.abs() < 1e-6));
    }

    #[test]
    fn routing_softmax_covers_top_k_only_and_breaks_ties_low_first() {
        let logits = [0.5, 3.0, 1.0, 3.0, -2.0, 1.0];
        let r = route_top_k(&logits, 3);
        let ids: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        let z = 2.0 * 3f32.exp() + 1f32.exp();
        assert!((r[0].1 - 3f32.exp() / z).abs() < 1e-6);
        assert!((r[2].1 - 1f32.exp() / z).abs() < 1e-6);
        assert!((r.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn swiglu_clamps_asymmetrically_and_adds_one() {
        let limit = 7.0;
        let out = swiglu(&[10.0, -10.0, 0.0, 3.0], limit);
        let sig = |x: f32| 1.0 / (1.0 + (-SWIGLU_ALPHA * x).exp());
        // gate capped at 7, lin clamped to −7: 7·σ(1.702·7)·(−6).
        assert!((out[0] - 7.0 * sig(7.0) * -6.0).abs() < 1e-4);
        assert_eq!(out[1], 0.0); // gate 0 kills the unit whatever lin is
        let out = swiglu(&[-10.0, 0.0], limit); // gate has no lower clamp
        assert!((out[0] - (-10.0 * sig(-10.0))).abs() < 1e-9);
    }

    #[test]
    fn yarn_constants_follow_the_spec() {
        let c = crate::engine::synthetic::config("gpt-oss-20b").unwrap();
        let r = Rope::new(&c);
        assert!((r.attention_scaling - 1.346_573_6).abs() < 1e-6);
        let low = yarn_correction_dim(32.0, 64.0, 150_000.0, 4096.0);
        let high = yarn_correction_dim(1.0, 64.0, 150_000.0, 4096.0);
        assert!((low - 8.092_779).abs() < 1e-5, "{low}");
        assert!((high - 17.398_025).abs() < 1e-5, "{high}");
        // Below `low` pure extrapolation, above `high` pure interpolation (÷32), between a blend.
        assert_eq!(r.inv_freq[0], 1.0);
        let f = |i: usize| 150_000f64.powf(-2.0 * i as f64 / 64.0);
        assert!((r.inv_freq[8] as f64 - f(8)).abs() < 1e-7);
        assert!((r.inv_freq[18] as f64 - f(18) / 32.0).abs() < 1e-9);
        let ramp = (12.0 - low) / (high - low);
        let want = f(12) * (1.0 - ramp) + f(12) / 32.0 * ramp;
        assert!((r.inv_freq[12] as f64 - want).abs() < 1e-7);
    }

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let rope = Rope {
            inv_freq: vec![1.0, 0.5],
            attention_scaling: 1.0,
        };
        let mut h = [1.0, 0.0, 0.0, 1.0];
        rope.apply_rope(&mut h, 0);
        assert_eq!(h, [1.0, 0.0, 0.0, 1.0]);
        rope.apply_rope(&mut h, 2);
        // pair (0, 2): angle 2; pair (1, 3): angle 1.
        assert!((h[0] - 2f32.cos()).abs() < 1e-6 && (h[2] - 2f32.sin()).abs() < 1e-6);
        assert!((h[1] + 1f32.sin()).abs() < 1e-6 && (h[3] - 1f32.cos()).abs() < 1e-6);
    }

    #[test]
    fn sliding_window_includes_the_query_itself() {
        assert_eq!(window_start(0, true, 8), 0);
        assert_eq!(window_start(7, true, 8), 0);
        assert_eq!(window_start(8, true, 8), 1);
        assert_eq!(window_start(100, false, 8), 0);
    }
}

//! The gpt-oss forward pass on the CPU in f64, composed from the per-kernel references, for
//! one sequence. K/V are rounded to bf16 exactly where the GPU's cache stores them, so the
//! GPU decode can be compared token by token.

use super::reference as r;
use super::weights::HostWeights;
use crate::engine::config::ModelConfig;

/// One sequence's CPU reference state.
pub struct ReferenceModel<'a> {
    cfg: &'a ModelConfig,
    w: &'a HostWeights,
    inv_freq: Vec<f32>,
    mscale: f32,
    sinks: bool,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

fn rms(x: &[f64], w: &[u16], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * s * r::bf(*b)).collect()
}

fn matvec(w: &[u16], b: Option<&[u16]>, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    w.chunks(cols)
        .enumerate()
        .map(|(i, row)| {
            row.iter().zip(x).map(|(a, c)| r::bf(*a) * c).sum::<f64>()
                + b.map_or(0.0, |b| r::bf(b[i]))
        })
        .collect()
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

impl<'a> ReferenceModel<'a> {
    /// A fresh sequence over `w`.
    pub fn new(cfg: &'a ModelConfig, w: &'a HostWeights, sinks: bool) -> Self {
        let (inv_freq, mscale) = super::rope::yarn_inv_freq(cfg);
        let n = cfg.num_hidden_layers;
        Self {
            cfg,
            w,
            inv_freq,
            mscale,
            sinks,
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
        }
    }

    /// Append `token` at the next position; returns the logits after it.
    pub fn step(&mut self, token: u32) -> Vec<f64> {
        let c = self.cfg;
        let (h, hq, hkv, d) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let pos = self.k[0].len() / (hkv * d);
        let eps = c.rms_norm_eps;
        let mut x = r::embed(&self.w.embed, &[token], h);
        for (li, lw) in self.w.layers.iter().enumerate() {
            let hn = rms(&x, &lw.attn_norm, eps);
            let qkv = f32s(&matvec(&lw.qkv_w, Some(&lw.qkv_b), &hn));
            let mut q = Vec::with_capacity(hq * d);
            for hh in 0..hq {
                q.extend(r::rope_head(
                    &qkv[hh * d..][..d],
                    pos as u32,
                    &self.inv_freq,
                    self.mscale,
                ));
            }
            for hh in 0..hkv {
                let kr = r::rope_head(
                    &qkv[(hq + hh) * d..][..d],
                    pos as u32,
                    &self.inv_freq,
                    self.mscale,
                );
                self.k[li].extend(kr.iter().map(|&v| r::to_bf(v as f32)));
            }
            let vs = &qkv[(hq + hkv) * d..][..hkv * d];
            self.v[li].extend(vs.iter().map(|&v| r::to_bf(v)));
            let window = if c.layer_is_sliding[li] {
                c.sliding_window
            } else {
                0
            };
            let sinks = self.sinks.then_some(lw.sinks.as_slice());
            let att = r::attention(
                &f32s(&q),
                &self.k[li],
                &self.v[li],
                pos,
                hq,
                hkv,
                d,
                window,
                sinks,
                1.0 / (d as f64).sqrt(),
            );
            let o = matvec(&lw.o_w, Some(&lw.o_b), &att);
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
            let hn = rms(&x, &lw.mlp_norm, eps);
            let logits = f32s(&matvec(&lw.router_w, Some(&lw.router_b), &hn));
            let (experts, weights) = r::router_topk(&logits, c.num_experts_per_tok);
            let host = r::MoeHost {
                gu_blocks: &lw.gu_blocks,
                gu_scales: &lw.gu_scales,
                gu_bias: &lw.gu_bias,
                dn_blocks: &lw.dn_blocks,
                dn_scales: &lw.dn_scales,
                dn_bias: &lw.dn_bias,
            };
            let y = r::moe(
                &host,
                &f32s(&hn),
                &experts,
                &weights,
                c.intermediate_size,
                c.swiglu_limit,
                1.702,
            );
            for (a, b) in x.iter_mut().zip(&y) {
                *a += b;
            }
        }
        let hn = rms(&x, &self.w.final_norm, eps);
        matvec(&self.w.lm_head, None, &hn)
    }
}

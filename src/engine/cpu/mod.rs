//! The CPU reference backend: the exact gpt-oss forward pass in fp32 over bf16/MXFP4
//! weights, multi-threaded with rayon. It is the oracle the GPU backend is checked against,
//! so it favours plain code over speed.

pub mod ops;

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use rayon::prelude::*;

use super::backend::{ModelBackend, SeqId, SeqStep};
use super::config::ModelConfig;
use super::weights::{LayerWeights, Weights};
use ops::Rope;

/// Keys and values of one sequence, fp32, per layer `[positions × kv_dim]`.
struct KvCache {
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// The CPU backend: weights plus the KV caches of live sequences.
pub struct CpuBackend {
    weights: Weights,
    rope: Rope,
    seqs: BTreeMap<SeqId, KvCache>,
    next_id: u32,
    kv_budget_tokens: usize,
    reserved_tokens: usize,
}

/// Where one new token sits: its sequence (index into the batch) and absolute position.
#[derive(Clone, Copy)]
struct Row {
    batch: usize,
    pos: usize,
}

impl CpuBackend {
    /// A backend over `weights` whose KV caches may hold `kv_budget_tokens` positions in all.
    pub fn new(weights: Weights, kv_budget_tokens: usize) -> CpuBackend {
        let rope = Rope::new(&weights.config);
        CpuBackend {
            weights,
            rope,
            seqs: BTreeMap::new(),
            next_id: 0,
            kv_budget_tokens,
            reserved_tokens: 0,
        }
    }

    /// The weights this backend runs.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Positions a sequence already holds, or `None` for an unknown sequence.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|c| c.len)
    }

    /// Bytes of KV cache one position takes (keys and values, all layers, fp32).
    pub fn kv_bytes_per_token(c: &ModelConfig) -> usize {
        2 * c.num_hidden_layers * c.kv_dim() * std::mem::size_of::<f32>()
    }

    fn check_batch(&self, batch: &[SeqStep<'_>]) -> Result<()> {
        let vocab = self.weights.config.vocab_size;
        for (i, step) in batch.iter().enumerate() {
            if batch[..i].iter().any(|s| s.seq == step.seq) {
                bail!("sequence {:?} appears twice in one forward batch", step.seq);
            }
            let Some(cache) = self.seqs.get(&step.seq) else {
                bail!("sequence {:?} is not allocated", step.seq);
            };
            if step.tokens.is_empty() {
                bail!(
                    "sequence {:?}: a forward step needs at least one token",
                    step.seq
                );
            }
            if cache.len + step.tokens.len() > cache.capacity {
                bail!(
                    "sequence {:?}: {} + {} tokens exceed its reserved {} positions",
                    step.seq,
                    cache.len,
                    step.tokens.len(),
                    cache.capacity
                );
            }
            if let Some(t) = step.tokens.iter().find(|&&t| t as usize >= vocab) {
                bail!("token id {t} is outside the vocabulary (size {vocab})");
            }
        }
        Ok(())
    }

    /// Attention block of layer `l` for all new rows: projections, RoPE, KV append,
    /// attention with sinks, output projection. Returns the residual update.
    fn attention(&mut self, l: usize, x: &[f32], rows: &[Row], batch: &[SeqStep<'_>]) -> Vec<f32> {
        let c = &self.weights.config;
        let w: &LayerWeights = &self.weights.layers[l];
        let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
        let h = ops::rms_norm(x, w.input_layernorm.data(), c.rms_norm_eps as f32);
        let mut q = ops::linear(&h, w.q_proj.data(), Some(w.q_bias.data()), qd);
        let mut k = ops::linear(&h, w.k_proj.data(), Some(w.k_bias.data()), kvd);
        let v = ops::linear(&h, w.v_proj.data(), Some(w.v_bias.data()), kvd);
        let rope = &self.rope;
        q.par_chunks_mut(qd).zip(rows).for_each(|(qr, row)| {
            qr.chunks_exact_mut(hd)
                .for_each(|head| rope.apply_rope(head, row.pos));
        });
        k.par_chunks_mut(kvd).zip(rows).for_each(|(kr, row)| {
            kr.chunks_exact_mut(hd)
                .for_each(|head| rope.apply_rope(head, row.pos));
        });
        // Append this layer's keys and values; rows of one sequence are consecutive.
        for ((kr, vr), row) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).zip(rows) {
            let cache = self.seqs.get_mut(&batch[row.batch].seq);
            if let Some(cache) = cache {
                cache.k[l].extend_from_slice(kr);
                cache.v[l].extend_from_slice(vr);
            }
        }
        let c = &self.weights.config;
        let w = &self.weights.layers[l];
        let sinks: Vec<f32> = w.sinks.data().iter().map(|s| s.to_f32()).collect();
        let group = c.num_attention_heads / c.num_key_value_heads;
        let sliding = c.layer_is_sliding[l];
        let mut attn = vec![0.0f32; rows.len() * qd];
        let seqs = &self.seqs;
        attn.par_chunks_mut(qd)
            .zip(q.par_chunks(qd))
            .zip(rows)
            .for_each(|((out, qr), row)| {
                let Some(cache) = seqs.get(&batch[row.batch].seq) else {
                    return;
                };
                let start = ops::window_start(row.pos, sliding, c.sliding_window);
                for (hq, (o, qh)) in out
                    .chunks_exact_mut(hd)
                    .zip(qr.chunks_exact(hd))
                    .enumerate()
                {
                    let kvh = hq / group;
                    let gather = |buf: &[f32]| -> Vec<f32> {
                        (start..=row.pos)
                            .flat_map(|p| {
                                buf[p * kvd + kvh * hd..p * kvd + (kvh + 1) * hd]
                                    .iter()
                                    .copied()
                            })
                            .collect()
                    };
                    let (keys, values) = (gather(&cache.k[l]), gather(&cache.v[l]));
                    ops::attention_with_sinks(qh, &keys, &values, sinks[hq], o);
                }
            });
        ops::linear(&attn, w.o_proj.data(), Some(w.o_bias.data()), c.hidden_size)
    }

    /// MoE block of layer `l` for every row: router, top-k, experts, weighted sum
    /// (each expert's down bias inside its weighted term).
    fn moe(&self, l: usize, x: &[f32]) -> Vec<f32> {
        let c = &self.weights.config;
        let w = &self.weights.layers[l];
        let d = c.hidden_size;
        let h = ops::rms_norm(x, w.post_attention_layernorm.data(), c.rms_norm_eps as f32);
        let logits = ops::linear(
            &h,
            w.router.data(),
            Some(w.router_bias.data()),
            c.num_local_experts,
        );
        let limit = c.swiglu_limit as f32;
        let mut out = vec![0.0f32; x.len()];
        out.par_chunks_mut(d)
            .zip(h.par_chunks(d))
            .zip(logits.par_chunks(c.num_local_experts))
            .for_each(|((o, hr), lg)| {
                for (e, weight) in ops::route_top_k(lg, c.num_experts_per_tok) {
                    let y = ops::expert_ffn(&w.gate_up, &w.down, e, hr, limit);
                    for (oi, yi) in o.iter_mut().zip(&y) {
                        *oi += weight * yi;
                    }
                }
            });
        out
    }
}

impl ModelBackend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
        if max_tokens == 0 || self.reserved_tokens + max_tokens > self.kv_budget_tokens {
            return None;
        }
        let id = SeqId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        let layers = self.weights.config.num_hidden_layers;
        self.seqs.insert(
            id,
            KvCache {
                capacity: max_tokens,
                len: 0,
                k: vec![Vec::new(); layers],
                v: vec![Vec::new(); layers],
            },
        );
        self.reserved_tokens += max_tokens;
        Some(id)
    }

    fn free_seq(&mut self, seq: SeqId) {
        if let Some(cache) = self.seqs.remove(&seq) {
            self.reserved_tokens -= cache.capacity;
        }
    }

    fn forward(&mut self, batch: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        self.check_batch(batch)?;
        let c = self.weights.config.clone();
        let d = c.hidden_size;
        let mut rows = Vec::new();
        let mut x = Vec::new();
        let embed = self.weights.embed_tokens.data();
        for (b, step) in batch.iter().enumerate() {
            let start = self.seqs.get(&step.seq).map_or(0, |s| s.len);
            for (i, &t) in step.tokens.iter().enumerate() {
                rows.push(Row {
                    batch: b,
                    pos: start + i,
                });
                x.extend(
                    embed[t as usize * d..(t as usize + 1) * d]
                        .iter()
                        .map(|v| v.to_f32()),
                );
            }
        }
        for l in 0..c.num_hidden_layers {
            let a = self.attention(l, &x, &rows, batch);
            x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
            let m = self.moe(l, &x);
            x.iter_mut().zip(&m).for_each(|(xi, mi)| *xi += mi);
        }
        for step in batch {
            if let Some(cache) = self.seqs.get_mut(&step.seq) {
                cache.len += step.tokens.len();
            }
        }
        // Unembed only each sequence's last new row.
        let mut last = Vec::with_capacity(batch.len() * d);
        let mut end = 0;
        for step in batch {
            end += step.tokens.len();
            last.extend_from_slice(&x[(end - 1) * d..end * d]);
        }
        let h = ops::rms_norm(&last, self.weights.norm.data(), c.rms_norm_eps as f32);
        let logits = ops::linear(&h, self.weights.lm_head.data(), None, c.vocab_size);
        Ok(logits
            .chunks_exact(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

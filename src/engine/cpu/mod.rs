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
    /// Applied to the experts' inputs and SwiGLU outputs (None: the reference).
    moe_act: Option<ops::ActTransform>,
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
            moe_act: None,
        }
    }

    /// Transform the MoE experts' inputs and SwiGLU outputs with `f` before they are
    /// multiplied (`None`, the default, leaves the reference untouched): the CUDA self-test
    /// compares its 8-bit activation kernels (`--activation q8|fp8`) with a reference that
    /// quantizes the same activations (`cuda::quant::dequantized`).
    pub fn set_moe_activation(&mut self, f: Option<ops::ActTransform>) {
        self.moe_act = f;
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

    /// The residual stream of a fresh prompt at every layer boundary: `[layers + 1]` entries
    /// of `[tokens × hidden]`, the embeddings first and the final RMSNorm's output last —
    /// what transformers returns as `hidden_states`. For locating where another backend
    /// departs from this one.
    pub fn trace_prompt(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let Some(seq) = self.alloc_seq(tokens.len()) else {
            bail!("KV budget too small to trace {} tokens", tokens.len());
        };
        let batch = [SeqStep { seq, tokens }];
        let result = self.check_batch(&batch).map(|()| {
            let mut trace = Vec::new();
            let x = self.run_layers(&batch, Some(&mut trace));
            let c = &self.weights.config;
            trace.pop();
            trace.push(ops::rms_norm(
                &x,
                self.weights.norm.data(),
                c.rms_norm_eps as f32,
            ));
            trace
        });
        self.free_seq(seq);
        result
    }

    /// Embed every new token, run all layers (appending to the KV caches) and return the
    /// final residual rows; with `trace`, also record the residual before each layer and
    /// after the last.
    fn run_layers(
        &mut self,
        batch: &[SeqStep<'_>],
        mut trace: Option<&mut Vec<Vec<f32>>>,
    ) -> Vec<f32> {
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
            if let Some(t) = trace.as_deref_mut() {
                t.push(x.clone());
            }
            let a = self.attention(l, &x, &rows, batch);
            x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
            let m = self.moe(l, &x);
            x.iter_mut().zip(&m).for_each(|(xi, mi)| *xi += mi);
        }
        if let Some(t) = trace {
            t.push(x.clone());
        }
        for step in batch {
            if let Some(cache) = self.seqs.get_mut(&step.seq) {
                cache.len += step.tokens.len();
            }
        }
        x
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
            let max_pos = self.weights.config.max_position_embeddings;
            if cache.len + step.tokens.len() > max_pos {
                bail!(
                    "sequence {:?}: would pass the model's {max_pos} positions",
                    step.seq
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
            if let Some(cache) = self.seqs.get_mut(&batch[row.batch].seq) {
                cache.k[l].extend_from_slice(kr);
                cache.v[l].extend_from_slice(vr);
            }
        }
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
                let n_keys = row.pos + 1 - start;
                for (hq, (o, qh)) in out
                    .chunks_exact_mut(hd)
                    .zip(qr.chunks_exact(hd))
                    .enumerate()
                {
                    let first = start * kvd + (hq / group) * hd;
                    let (keys, values) = (&cache.k[l][first..], &cache.v[l][first..]);
                    ops::attention_with_sinks(qh, keys, values, kvd, n_keys, sinks[hq], o);
                }
            });
        ops::linear(&attn, w.o_proj.data(), Some(w.o_bias.data()), c.hidden_size)
    }

    /// MoE block of layer `l` for every row: router, top-k, experts, weighted sum
    /// (each expert's down bias inside its weighted term). Rows are grouped by expert so
    /// each expert's weights are decoded once per step.
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
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); c.num_local_experts];
        for (row, lg) in logits.chunks_exact(c.num_local_experts).enumerate() {
            for (e, weight) in ops::route_top_k(lg, c.num_experts_per_tok) {
                routed[e].push((row, weight));
            }
        }
        let mut out = vec![0.0f32; x.len()];
        for (e, rows) in routed.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let mut hs: Vec<f32> = rows
                .iter()
                .flat_map(|&(row, _)| h[row * d..(row + 1) * d].iter().copied())
                .collect();
            if let Some(f) = self.moe_act {
                hs = f(&hs);
            }
            let y = ops::expert_ffn(
                &w.gate_up,
                &w.down,
                e,
                &hs,
                c.swiglu_limit as f32,
                self.moe_act,
            );
            for (&(row, weight), yr) in rows.iter().zip(y.chunks_exact(d)) {
                for (o, yi) in out[row * d..(row + 1) * d].iter_mut().zip(yr) {
                    *o += weight * yi;
                }
            }
        }
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
        // Ids wrap after 2^32 allocations; skip any still live.
        while self.seqs.contains_key(&SeqId(self.next_id)) {
            self.next_id = self.next_id.wrapping_add(1);
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
        let x = self.run_layers(batch, None);
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

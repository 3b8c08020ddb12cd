//! The CPU reference backend: the exact gpt-oss forward pass in fp32 over bf16/MXFP4
//! weights, multi-threaded with rayon. It is the oracle the GPU backend is checked against,
//! so it favours plain code over speed.

pub mod ops;

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use rayon::prelude::*;

use super::backend::{ModelBackend, SeqId, SeqStep};
use super::config::ModelConfig;
use super::prefix::{self, FreeSlot};
use super::weights::{LayerWeights, Weights};
use ops::Rope;

/// Keys and values of one sequence, fp32, per layer `[positions × kv_dim]`.
struct KvCache {
    capacity: usize,
    /// The tokens fed so far, whose keys and values the cache holds (its length).
    tokens: Vec<u32>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// When the cache was freed (prefix caching keeps free caches; LRU among them).
    last_used: u64,
}

impl KvCache {
    fn new(layers: usize) -> Self {
        KvCache {
            capacity: 0,
            tokens: Vec::new(),
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
            last_used: 0,
        }
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    /// A cache of the first `n` positions of this one (`kv_dim` values each per layer).
    fn prefix(&self, n: usize, kv_dim: usize) -> Self {
        let copy = |layers: &[Vec<f32>]| -> Vec<Vec<f32>> {
            layers.iter().map(|l| l[..n * kv_dim].to_vec()).collect()
        };
        KvCache {
            capacity: 0,
            tokens: self.tokens[..n].to_vec(),
            k: copy(&self.k),
            v: copy(&self.v),
            last_used: 0,
        }
    }

    /// Keep the first `n` positions (`kv_dim` values each per layer).
    fn truncate(&mut self, n: usize, kv_dim: usize) {
        self.tokens.truncate(n);
        for l in self.k.iter_mut().chain(self.v.iter_mut()) {
            l.truncate(n * kv_dim);
        }
    }
}

/// The CPU backend: weights plus the KV caches of live sequences.
pub struct CpuBackend {
    weights: Weights,
    rope: Rope,
    seqs: BTreeMap<SeqId, KvCache>,
    /// Freed caches kept for prefix reuse (only with prefix caching on). Their positions
    /// count against the budget beside the reservations of live sequences, and the least
    /// recently used are dropped when a reservation needs the room.
    free: BTreeMap<SeqId, KvCache>,
    keep_free: bool,
    clock: prefix::Clock,
    next_id: u32,
    kv_budget_tokens: usize,
    /// Positions reserved by live sequences (their capacities).
    reserved_tokens: usize,
    /// Applied to the experts' inputs and SwiGLU outputs (None: the reference).
    moe_act: Option<ops::ActTransform>,
    /// Reserve positions as sequences grow (`grow_seq`) rather than at allocation.
    on_demand: bool,
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
            free: BTreeMap::new(),
            keep_free: false,
            clock: prefix::Clock::default(),
            next_id: 0,
            kv_budget_tokens,
            reserved_tokens: 0,
            moe_act: None,
            on_demand: false,
        }
    }

    /// Reserve KV positions as sequences grow ([`ModelBackend::grow_seq`]) instead of the
    /// whole capacity asked at allocation, so that more sequences share the budget and the
    /// scheduler pre-empts one when a step needs room that is not there (`mxtune serve`
    /// turns it on; off by default).
    pub fn set_on_demand(&mut self, on: bool) {
        self.on_demand = on;
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
        self.seqs.get(&seq).map(KvCache::len)
    }

    /// Positions held by freed caches kept for prefix reuse.
    pub fn cached_free_tokens(&self) -> usize {
        self.free.values().map(KvCache::len).sum()
    }

    /// Take a cache for `prompt` (empty: no reuse wanted) reserving `max_tokens` positions:
    /// the free cache sharing the longest prefix with it, cut back to that prefix, else the
    /// least recently used free one emptied, else a new one; then drop the least recently
    /// used free caches until everything fits the budget.
    fn take_cache(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        if max_tokens == 0 || self.reserved_tokens + max_tokens > self.kv_budget_tokens {
            return None;
        }
        let kv_dim = self.weights.config.kv_dim();
        let chosen = self.free_choice(prompt);
        let (id, mut cache, cached) = match chosen.and_then(|ch| {
            self.free
                .remove(&ch.key)
                .map(|c| (ch.key, c, ch.cached.min(max_tokens)))
        }) {
            Some(found) => found,
            None => (
                self.fresh_id(),
                KvCache::new(self.weights.config.num_hidden_layers),
                0,
            ),
        };
        cache.truncate(cached, kv_dim);
        cache.capacity = max_tokens;
        self.seqs.insert(id, cache);
        self.reserved_tokens += max_tokens;
        self.evict_free();
        Some((id, cached))
    }

    /// The kept free cache `prompt` would take, and what of it the cache holds.
    fn free_choice(&self, prompt: &[u32]) -> Option<prefix::Choice<SeqId>> {
        prefix::choose(
            prompt,
            self.free.iter().map(|(id, c)| FreeSlot {
                key: *id,
                tokens: &c.tokens,
                last_used: c.last_used,
            }),
        )
    }

    /// An id no live or kept cache has (ids wrap after 2^32 allocations).
    fn fresh_id(&mut self) -> SeqId {
        while self.seqs.contains_key(&SeqId(self.next_id))
            || self.free.contains_key(&SeqId(self.next_id))
        {
            self.next_id = self.next_id.wrapping_add(1);
        }
        let id = SeqId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Drop the least recently used free caches while they and the reservations exceed the
    /// budget.
    fn evict_free(&mut self) {
        while self.reserved_tokens + self.cached_free_tokens() > self.kv_budget_tokens {
            let Some(lru) = self
                .free
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(id, _)| *id)
            else {
                return;
            };
            self.free.remove(&lru);
        }
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
            let start = self.seqs.get(&step.seq).map_or(0, KvCache::len);
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
                cache.tokens.extend_from_slice(step.tokens);
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
            if cache.len() + step.tokens.len() > cache.capacity {
                bail!(
                    "sequence {:?}: {} + {} tokens exceed its reserved {} positions",
                    step.seq,
                    cache.len(),
                    step.tokens.len(),
                    cache.capacity
                );
            }
            let max_pos = self.weights.config.max_position_embeddings;
            if cache.len() + step.tokens.len() > max_pos {
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
        self.take_cache(&[], max_tokens).map(|(id, _)| id)
    }

    fn grows_on_demand(&self) -> bool {
        self.on_demand
    }

    fn grow_seq(&mut self, seq: SeqId, len: usize) -> bool {
        let Some(cache) = self.seqs.get_mut(&seq) else {
            return false;
        };
        if len <= cache.capacity {
            return true;
        }
        let extra = len - cache.capacity;
        if self.reserved_tokens + extra > self.kv_budget_tokens {
            return false;
        }
        cache.capacity = len;
        self.reserved_tokens += extra;
        // Kept free caches give way to a live sequence.
        self.evict_free();
        true
    }

    fn free_seq(&mut self, seq: SeqId) {
        if let Some(mut cache) = self.seqs.remove(&seq) {
            self.reserved_tokens -= cache.capacity;
            if self.keep_free && cache.len() > 0 {
                cache.last_used = self.clock.tick();
                self.free.insert(seq, cache);
                self.evict_free();
            }
        }
    }

    fn alloc_cached(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        self.take_cache(prompt, max_tokens)
    }

    fn cached_prefix(&self, prompt: &[u32]) -> usize {
        self.free_choice(prompt).map_or(0, |ch| ch.cached)
    }

    fn can_fork(&self) -> bool {
        true
    }

    fn fork_seq(&mut self, src: SeqId, len: usize, max_tokens: usize) -> Option<SeqId> {
        if len > max_tokens || self.reserved_tokens + max_tokens > self.kv_budget_tokens {
            return None;
        }
        let source = self.seqs.get(&src).filter(|c| c.len() >= len)?;
        let mut cache = source.prefix(len, self.weights.config.kv_dim());
        cache.capacity = max_tokens;
        let id = self.fresh_id();
        self.seqs.insert(id, cache);
        self.reserved_tokens += max_tokens;
        self.evict_free();
        Some(id)
    }

    fn set_prefix_caching(&mut self, on: bool) {
        self.keep_free = on;
        if !on {
            self.free.clear();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(budget: usize) -> CpuBackend {
        CpuBackend::new(
            crate::engine::synthetic::build("tiny", 0).expect("tiny model"),
            budget,
        )
    }

    /// Feed `tokens` to `seq` in chunks of `chunk`; the logits after the last one.
    fn feed(be: &mut CpuBackend, seq: SeqId, tokens: &[u32], chunk: usize) -> Vec<f32> {
        let mut last = Vec::new();
        for c in tokens.chunks(chunk) {
            let batch = [SeqStep { seq, tokens: c }];
            last = be.forward(&batch).expect("forward").remove(0);
        }
        last
    }

    /// A freed cache keeps its tokens' KV: a prompt that shares a prefix with it — longer than
    /// the sliding window (8 on tiny), ending mid-way, equal to it, diverging inside it —
    /// computes only the rest and gets bit for bit the logits of a fresh prefill.
    #[test]
    fn reused_prefixes_give_the_logits_of_a_fresh_prompt() {
        let mut be = tiny(4096);
        be.set_prefix_caching(true);
        let p: Vec<u32> = (0..20).map(|k| 1000 + 7 * k).collect();
        let (a, cached) = be.alloc_cached(&p, 64).unwrap();
        assert_eq!(cached, 0);
        feed(&mut be, a, &p, 12);
        // Three generated tokens fed back one at a time, as decoding does.
        let generated = [5u32, 6, 7];
        feed(&mut be, a, &generated, 1);
        be.free_seq(a);
        assert_eq!(be.cached_free_tokens(), 23);
        // A later turn: the whole history and more.
        let q: Vec<u32> = p
            .iter()
            .chain(&generated)
            .copied()
            .chain(300..305)
            .collect();
        let (b, cached) = be.alloc_cached(&q, 64).unwrap();
        assert_eq!(cached, 23);
        assert_eq!(be.seq_len(b), Some(23));
        let reused = feed(&mut be, b, &q[cached..], 4);
        be.free_seq(b);
        // The same prompt from scratch (the other free cache is emptied, not reused).
        let fresh = {
            let s = be.alloc_seq(64).unwrap();
            assert_eq!(be.seq_len(s), Some(0));
            let l = feed(&mut be, s, &q, 64);
            be.free_seq(s);
            l
        };
        assert_eq!(reused, fresh, "logits after a reused prefix differ");
        // The same prompt again: all but its last token come from the cache.
        let (c, cached) = be.alloc_cached(&q, 64).unwrap();
        assert_eq!(cached, q.len() - 1);
        assert_eq!(feed(&mut be, c, &q[cached..], 1), fresh);
        be.free_seq(c);
        // Diverging at position 10: the first 10 tokens are kept, the cache cut back there.
        let r: Vec<u32> = p[..10].iter().copied().chain(900..915).collect();
        let (d, cached) = be.alloc_cached(&r, 64).unwrap();
        assert_eq!(cached, 10);
        let reused = feed(&mut be, d, &r[cached..], 64);
        be.free_seq(d);
        let s = be.alloc_seq(64).unwrap();
        let fresh = feed(&mut be, s, &r, 5);
        assert_eq!(reused, fresh, "logits after a prefix cut mid-way differ");
        be.free_seq(s);
        // Off: nothing is kept, nothing is reused.
        be.set_prefix_caching(false);
        assert_eq!(be.cached_free_tokens(), 0);
        let (e, cached) = be.alloc_cached(&r, 64).unwrap();
        assert_eq!(cached, 0);
        feed(&mut be, e, &r, 64);
        be.free_seq(e);
        assert_eq!(be.cached_free_tokens(), 0);
    }

    /// Kept caches share the KV budget with live reservations: the least recently used go
    /// when a reservation needs their room, and never block one.
    #[test]
    fn a_forked_sequence_gives_the_logits_of_a_full_prefill() {
        let mut be = tiny(256);
        let prompt: Vec<u32> = (0..20).map(|k| 500 + 7 * k).collect();
        let a = be.alloc_seq(64).expect("a slot");
        let fresh = feed(&mut be, a, &prompt, 20);
        // The source decodes on; the copy takes only the prompt's positions.
        feed(&mut be, a, &[42], 1);
        let b = be.fork_seq(a, 19, 64).expect("room for the copy");
        assert_eq!(be.seq_len(b), Some(19));
        assert_eq!(feed(&mut be, b, &prompt[19..], 1), fresh);
        assert_eq!(be.seq_len(a), Some(21), "the source is untouched");
        // More positions than the source holds, or more room than the budget leaves: none.
        assert!(be.fork_seq(a, 22, 64).is_none());
        assert!(be.fork_seq(a, 5, 200).is_none());
    }

    #[test]
    fn kept_caches_are_evicted_least_recently_used_first_under_pressure() {
        let mut be = tiny(60);
        be.set_prefix_caching(true);
        let pa: Vec<u32> = (0..20).map(|k| 2000 + k).collect();
        let pb: Vec<u32> = (0..20).map(|k| 3000 + k).collect();
        let (a, _) = be.alloc_cached(&pa, 30).unwrap();
        let (b, _) = be.alloc_cached(&pb, 30).unwrap();
        assert!(be.alloc_cached(&[1, 2], 1).is_none(), "the budget is full");
        feed(&mut be, a, &pa, 20);
        feed(&mut be, b, &pb, 20);
        be.free_seq(a);
        be.free_seq(b);
        assert_eq!(be.cached_free_tokens(), 40);
        // 50 positions for an unrelated prompt: it overwrites the least recently used cache
        // (a's) and b's must go too, for 50 + 20 > 60.
        let pc: Vec<u32> = (0..10).map(|k| 4000 + k).collect();
        let (c, cached) = be.alloc_cached(&pc, 50).unwrap();
        assert_eq!(cached, 0);
        assert_eq!(be.cached_free_tokens(), 0);
        feed(&mut be, c, &pc, 10);
        be.free_seq(c);
        assert_eq!(
            be.alloc_cached(&pb, 30).unwrap().1,
            0,
            "b's cache was evicted"
        );
        // b's own prompt takes b's cache; a's is kept exactly while it fits beside the
        // reservations.
        let mut be = tiny(60);
        be.set_prefix_caching(true);
        let (a, _) = be.alloc_cached(&pa, 30).unwrap();
        let (b, _) = be.alloc_cached(&pb, 30).unwrap();
        feed(&mut be, a, &pa, 20);
        feed(&mut be, b, &pb, 20);
        be.free_seq(a);
        be.free_seq(b);
        let (b, cached) = be.alloc_cached(&pb, 40).unwrap();
        assert_eq!(cached, 19);
        assert_eq!(be.cached_free_tokens(), 20, "40 + 20 fit in 60");
        be.free_seq(b);
        let (_, cached) = be.alloc_cached(&pb, 41).unwrap();
        assert_eq!(cached, 19);
        assert_eq!(be.cached_free_tokens(), 0, "41 + 20 do not fit in 60");
    }
}

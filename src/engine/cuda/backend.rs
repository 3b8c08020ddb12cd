//! `CudaBackend`: the [`ModelBackend`] on one GPU. A step whose sequences each add one token
//! runs the decode step (CUDA graphs); a step with prompt chunks runs every row through the
//! batched prefill kernels (tensor-core GEMMs, grouped MoE) at once — per `--moe-kernel`.
//! `forward_sampled` samples on the device so only token ids come back.

use std::sync::Arc;

use anyhow::{Result, ensure};
use cudarc::driver::CudaSlice;

use super::device::Gpu;
use super::gates::{ActFormat, DecodeOptions, Fp4Layers, MoePath};
use super::model::Decoder;
use super::ops::{self, SampleRow};
use super::weights::DeviceWeights;
use crate::engine::backend::{ModelBackend, RowSample, SeqId, SeqStep};
use crate::engine::config::ModelConfig;
use crate::engine::prefix::{self, FreeSlot};
use crate::engine::sampling::Sampled;

/// The CUDA backend.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    dec: Decoder,
    /// What each KV slot holds. A free slot keeps its tokens' KV (prefix caching).
    slots: Vec<Slot>,
    clock: prefix::Clock,
    graphs: bool,
    sampling: SampleBufs,
}

/// One KV slot: whether a sequence holds it, and the tokens whose keys and values it holds
/// (their count is the sequence's length; a free slot keeps them for prefix reuse).
#[derive(Default)]
struct Slot {
    busy: bool,
    tokens: Vec<u32>,
    last_used: u64,
}

/// Device buffers of on-device sampling (row requests, banned ids, results), grown on demand.
#[derive(Default)]
struct SampleBufs {
    rows: Option<CudaSlice<u8>>,
    /// `sample_plain`'s per-chunk partial results.
    parts: Option<CudaSlice<u8>>,
    banned: Option<CudaSlice<u32>>,
    out: Option<CudaSlice<u32>>,
}

/// `slot` holding at least `n` elements (reallocated, contents dropped, when smaller).
fn at_least<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    slot: &'a mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<&'a mut CudaSlice<T>> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = Some(g.alloc(n)?);
    }
    slot.as_mut()
        .ok_or_else(|| anyhow::anyhow!("sampling buffer missing after allocation"))
}

/// Where the grouped MoE's tiles dequantize the experts (`MXTUNE_PREFILL_MOE`), for the
/// kernel-path line; a bad value shows as such (loading the model refuses it).
fn grouped_where() -> &'static str {
    match ops::GroupedKernels::from_env() {
        Ok(ops::GroupedKernels::Registers) => "into mma fragments in registers",
        Ok(ops::GroupedKernels::Shared) => "in shared memory",
        Err(_) => "(bad MXTUNE_PREFILL_MOE)",
    }
}

/// What [`CudaBackend::capture_graphs`] did: graphs captured, seconds, and the growth of the
/// process's resident memory over it (the driver keeps each graph in host memory: on GB10's
/// unified memory that is memory the model and cache do not get).
#[derive(Debug, Clone, Copy)]
pub struct GraphCapture {
    /// Graphs captured.
    pub graphs: usize,
    /// Wall time of the captures.
    pub seconds: f64,
    /// Growth of the resident memory over them (`None` where the OS does not say).
    pub host_bytes: Option<u64>,
}

impl CudaBackend {
    /// A backend over weights already on `gpu`, with `slots` sequences of up to `max_pos`
    /// positions and steps of up to `max_batch` sequences; `graphs` replays captured steps.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: Arc<Gpu>,
        cfg: &ModelConfig,
        w: DeviceWeights,
        opts: DecodeOptions,
        slots: usize,
        max_pos: usize,
        max_batch: usize,
        graphs: bool,
    ) -> Result<Self> {
        let dec = Decoder::new(&gpu, cfg, w, opts, slots, max_pos, max_batch)?;
        Ok(Self {
            gpu,
            dec,
            slots: (0..slots).map(|_| Slot::default()).collect(),
            clock: prefix::Clock::default(),
            graphs,
            sampling: SampleBufs::default(),
        })
    }

    /// With graphs on, capture the decode step of every batch size up front
    /// ([`Decoder::capture_all`]); `None` with graphs off.
    pub fn capture_graphs(&mut self) -> Result<Option<GraphCapture>> {
        if !self.graphs {
            return Ok(None);
        }
        let rss0 = crate::launch::preflight::own_rss_bytes();
        let t0 = std::time::Instant::now();
        let graphs = self.dec.capture_all(&self.gpu)?;
        let seconds = t0.elapsed().as_secs_f64();
        let rss1 = crate::launch::preflight::own_rss_bytes();
        Ok(Some(GraphCapture {
            graphs,
            seconds,
            host_bytes: rss0.zip(rss1).map(|(a, b)| b.saturating_sub(a)),
        }))
    }

    /// Prefill passes of up to `rows` rows (the server's step budget, at most
    /// [`PREFILL_ROWS_LIMIT`](super::model::PREFILL_ROWS_LIMIT)), their buffers allocated
    /// now ([`Decoder::reserve_prefill`]); nothing on the GEMV path (`--moe-kernel gemv`),
    /// which feeds prompts through the decode step and never runs a prefill pass.
    pub fn reserve_prefill(&mut self, rows: usize) -> Result<()> {
        if self.dec.options().moe == MoePath::Gemv {
            return Ok(());
        }
        let rows = rows.min(super::model::PREFILL_ROWS_LIMIT);
        self.dec.reserve_prefill(&self.gpu, rows)
    }

    /// The decoder, for `engine profile`, which times its kernels and steps directly.
    pub fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.dec
    }

    /// One line of detail beside the `kernel-path` report (which `engine::serve` builds for
    /// every backend): device, architecture, kernel cache, and the fixed parts of the path.
    pub fn describe(&self) -> String {
        let lr = &self.gpu.load_report;
        let o = self.dec.options();
        format!(
            "cuda backend: device {} ({}); kernels {} compiled, {} cached in {:.2} s ({}); \
             decode: moe gemv on {} with {} activations, {}, {} dense gemv, mxfp4 experts ({}); kv {}, \
             sinks {}, cuda graphs {}; {}{}; sampling on device (rows asking for top logprobs \
             or a sampling penalty sample on the host)",
            self.gpu.name(),
            self.gpu.arch(),
            lr.compiled,
            lr.cached,
            lr.seconds,
            lr.cache_dir,
            if self.dec.moe_on_tensor_cores() {
                "tensor cores"
            } else {
                "cuda cores"
            },
            match o.activation {
                ActFormat::Bf16 if self.dec.moe_f16() => "fp16 (x / D per row)",
                ActFormat::Bf16 if self.dec.moe_on_tensor_cores() => "bf16",
                ActFormat::Bf16 if self.dec.moe_codes() == ops::MoeCodes::F16 =>
                    "fp16 (x / D per 32, fp16 dot)",
                ActFormat::Bf16 => "fp32",
                ActFormat::Q8 => "q8 (int8 per 32, dp4a)",
                ActFormat::Fp8 => "fp8 (e4m3 per 32)",
            },
            match o.fp4_layers {
                Fp4Layers::Moe => "bf16 dense weights",
                Fp4Layers::MoeQkvO =>
                    "mxfp4 attention qkv/o (quantized at load; prefill dequantizes them to bf16 \
                     in shared memory), bf16 router and lm_head",
                Fp4Layers::All =>
                    "mxfp4 attention qkv/o and lm_head (quantized at load; prefill dequantizes \
                     them to bf16 in shared memory), bf16 router and embedding",
            },
            o.gemv.name(),
            match self.dec.expert_layout() {
                ops::ExpertLayout::Standard => "standard layout",
                ops::ExpertLayout::F16 => "fp16 layout, rearranged at load",
            },
            o.kv_dtype.name(),
            if o.sinks { "on" } else { "off" },
            if self.graphs { "on" } else { "off" },
            match o.moe {
                MoePath::Auto => format!(
                    "prompts: batched path (tensor-core mma.sync bf16 GEMMs, moe grouped by \
                     expert with mxfp4 dequantized {}, attention with the GQA group's keys \
                     shared in shared memory)",
                    grouped_where()
                ),
                MoePath::Gemv => "prompts: token by token through the decode step".into(),
                MoePath::Grouped => format!(
                    "every step on the batched path (grouped moe, mxfp4 dequantized {}), no \
                     graphs",
                    grouped_where()
                ),
            },
            match o.moe {
                MoePath::Gemv => String::new(),
                MoePath::Auto | MoePath::Grouped => format!(
                    "; grouped moe tile {}; prompt rows in passes of up to {}",
                    o.tile.name(),
                    self.dec.prefill_rows()
                ),
            },
        )
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Each sequence's KV slot and current length, checking that its new tokens fit.
    fn place(&self, batch: &[SeqStep<'_>]) -> Result<Vec<(usize, usize)>> {
        let mut at = Vec::with_capacity(batch.len());
        for st in batch {
            let (slot, len) = self.slot(st.seq)?;
            ensure!(
                !st.tokens.is_empty(),
                "sequence {} has no new tokens",
                st.seq.0
            );
            ensure!(
                len + st.tokens.len() <= self.dec.max_positions(),
                "sequence {} would hold {} tokens, the KV slot holds {}",
                st.seq.0,
                len + st.tokens.len(),
                self.dec.max_positions()
            );
            at.push((slot, len));
        }
        Ok(at)
    }

    /// Record that the step appended each sequence's new tokens (after it ran).
    fn advance(&mut self, batch: &[SeqStep<'_>], at: &[(usize, usize)]) {
        for (st, &(slot, _)) in batch.iter().zip(at) {
            self.slots[slot].tokens.extend_from_slice(st.tokens);
        }
    }

    fn slot(&self, seq: SeqId) -> Result<(usize, usize)> {
        let s = seq.0 as usize;
        match self.slots.get(s) {
            Some(slot) if slot.busy => Ok((s, slot.tokens.len())),
            _ => anyhow::bail!("sequence {} is not allocated on {}", seq.0, self.name()),
        }
    }

    /// Take the free slot `engine::prefix::choose` picks for `prompt` (empty: no reuse),
    /// cut back to the prefix it keeps, as the CPU backend does.
    fn take_slot(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        if max_tokens > self.dec.max_positions() {
            return None;
        }
        let ch = self.free_choice(prompt)?;
        let slot = &mut self.slots[ch.key];
        slot.busy = true;
        slot.tokens.truncate(ch.cached);
        Some((SeqId(ch.key as u32), ch.cached))
    }

    /// The free slot `prompt` would take, and what of it the slot holds.
    fn free_choice(&self, prompt: &[u32]) -> Option<prefix::Choice<usize>> {
        let free = self.slots.iter().enumerate().filter(|(_, s)| !s.busy);
        prefix::choose(
            prompt,
            free.map(|(i, s)| FreeSlot {
                key: i,
                tokens: &s.tokens,
                last_used: s.last_used,
            }),
        )
    }
}

impl ModelBackend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        self.dec.config()
    }

    fn cached_prefix(&self, prompt: &[u32]) -> usize {
        self.free_choice(prompt).map_or(0, |ch| ch.cached)
    }

    fn name(&self) -> String {
        format!("cuda ({}, {})", self.gpu.name(), self.gpu.arch())
    }

    fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
        self.take_slot(&[], max_tokens).map(|(s, _)| s)
    }

    fn free_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.slots.get_mut(seq.0 as usize).filter(|s| s.busy) {
            s.busy = false;
            s.last_used = self.clock.tick();
        }
    }

    // The slots are allocated whole up front, so a free slot keeps its KV at no cost and
    // `set_prefix_caching` needs nothing here.
    fn alloc_cached(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        self.take_slot(prompt, max_tokens)
    }

    fn can_fork(&self) -> bool {
        true
    }

    // A free slot (the one sharing the longest prefix with the source's first `len` tokens,
    // as admission picks) gets the rest of those positions' KV copied on the device.
    fn fork_seq(&mut self, src: SeqId, len: usize, max_tokens: usize) -> Option<SeqId> {
        let s = src.0 as usize;
        let toks = self
            .slots
            .get(s)
            .filter(|x| x.busy && x.tokens.len() >= len && len <= max_tokens)?
            .tokens[..len]
            .to_vec();
        let (id, cached) = self.take_slot(&toks, max_tokens)?;
        let d = id.0 as usize;
        if let Err(e) = self.dec.copy_kv(&self.gpu, s, d, cached, len) {
            tracing::warn!("fork of sequence {s} failed, its choice prefills instead: {e:#}");
            self.free_seq(id);
            return None;
        }
        self.slots[d].tokens = toks;
        Some(id)
    }

    fn forward(&mut self, batch: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        let rows = self.place(batch)?;
        let mut out = vec![Vec::new(); batch.len()];
        self.run_steps(batch, &rows, |me, ready| {
            for &(row, b) in ready {
                out[b] = me.dec.logits(&me.gpu, row)?;
            }
            Ok(())
        })?;
        self.gpu.sync()?;
        self.advance(batch, &rows);
        Ok(out)
    }

    fn forward_sampled(
        &mut self,
        batch: &[SeqStep<'_>],
        rows: &mut [RowSample<'_>],
    ) -> Result<Vec<Option<Sampled>>> {
        ensure!(
            rows.len() == batch.len(),
            "{} sampling rows for a batch of {}",
            rows.len(),
            batch.len()
        );
        let at = self.place(batch)?;
        // Per row: the kernel's request, or None where the host samples (top logprobs wanted,
        // a presence/frequency/repetition penalty, which needs the request's token history
        // that only the host sampler keeps, a logit bias, or more banned ids than the kernel
        // takes) or nothing is sampled. The uniform number is drawn now, one per non-greedy token, as
        // `Sampler::sample` does on the host.
        let mut dev: Vec<Option<SampleRow>> = Vec::with_capacity(rows.len());
        for r in rows.iter_mut() {
            let req = match r.sampler.as_deref_mut() {
                // A scored prompt token needs the logits on the host.
                Some(s)
                    if r.forced.is_none()
                        && s.params().logprobs.is_none_or(|n| n == 0)
                        && !s.params().needs_host_logits()
                        && r.banned.len() <= ops::SAMPLE_MAX_BANNED =>
                {
                    let greedy = s.is_greedy();
                    let p = s.params().clone();
                    Some(SampleRow {
                        u: if greedy { 0.0 } else { s.next_uniform() },
                        temperature: p.temperature,
                        top_p: p.top_p,
                        top_k: p.top_k,
                        greedy,
                        logprob: p.logprobs.is_some(),
                        ban_n: r.banned.len(),
                        ..Default::default()
                    })
                }
                _ => None,
            };
            dev.push(req);
        }
        let g = self.gpu.clone();
        let n_dev = dev.iter().flatten().count();
        let bans: usize = dev.iter().flatten().map(|r| r.ban_n).sum();
        if n_dev > 0 {
            at_least(&g, &mut self.sampling.out, 2 * batch.len())?;
            at_least(
                &g,
                &mut self.sampling.rows,
                n_dev.min(self.dec.max_batch()) * ops::SAMPLE_ROW_BYTES,
            )?;
            at_least(&g, &mut self.sampling.banned, bans)?;
        }
        let mut host_logits: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        let vocab = self.dec.config().vocab_size;
        self.run_steps(batch, &at, |me, ready| {
            let (mut reqs, mut banned) = (Vec::new(), Vec::new());
            for &(row, b) in ready {
                if rows[b].sampler.is_none() {
                    continue;
                }
                match dev[b] {
                    Some(req) => {
                        reqs.push(SampleRow {
                            logit_row: row,
                            out_row: b,
                            ban_off: banned.len(),
                            ..req
                        });
                        banned.extend_from_slice(rows[b].banned);
                    }
                    None => host_logits[b] = Some(me.dec.logits(&me.gpu, row)?),
                }
            }
            if !reqs.is_empty() {
                me.launch_sampling(&reqs, &banned, vocab)?;
            }
            Ok(())
        })?;
        let out = match &self.sampling.out {
            Some(o) if n_dev > 0 => g
                .stream()
                .clone_dtoh(&o.slice(0..2 * batch.len()))
                .map_err(|e| anyhow::anyhow!("copying sampled tokens: {:?}", e.0))?,
            _ => Vec::new(),
        };
        g.sync()?;
        self.advance(batch, &at);
        let mut res = Vec::with_capacity(batch.len());
        for (b, r) in rows.iter_mut().enumerate() {
            let Some(s) = r.sampler.as_deref_mut() else {
                res.push(None);
                continue;
            };
            if let Some(l) = &host_logits[b] {
                res.push(Some(match r.forced {
                    Some(t) => s.score(l, t),
                    None => s.sample(l, r.banned),
                }));
                continue;
            }
            let (token, lp) = match out.get(2 * b..2 * b + 2) {
                Some(&[t, lp]) if dev[b].is_some() => (t, f32::from_bits(lp)),
                _ => anyhow::bail!("no sampled token came back for row {b}"),
            };
            ensure!(
                (token as usize) < vocab,
                "the sampling kernel returned token {token} ≥ vocab {vocab}"
            );
            res.push(Some(Sampled {
                token,
                logprob: s.params().logprobs.map(|_| lp),
                top: Vec::new(),
            }));
        }
        Ok(res)
    }
}

impl CudaBackend {
    /// Run the step(s) of `batch` (`at`: each sequence's KV slot and current length); after
    /// each step `ready` gets (logits row, batch index) of the sequences whose last new token
    /// it ran. A step whose sequences each add one token runs the decode step (graphs); one
    /// with prompt chunks runs every row through the batched prefill path (per `--moe-kernel`).
    fn run_steps(
        &mut self,
        batch: &[SeqStep<'_>],
        at: &[(usize, usize)],
        mut ready: impl FnMut(&mut Self, &[(usize, usize)]) -> Result<()>,
    ) -> Result<()> {
        let single = batch.iter().all(|s| s.tokens.len() == 1);
        let batched = match self.dec.options().moe {
            MoePath::Auto => !single,
            MoePath::Gemv => false,
            MoePath::Grouped => true,
        };
        let group = self.dec.max_batch();
        if batched {
            // Decode rows ride along as one-row sequences; at most `max_batch` sequences per
            // pass (the head's rows).
            for first in (0..batch.len()).step_by(group) {
                let seqs = first..(first + group).min(batch.len());
                let (mut toks, mut pos, mut slots, mut outs) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for b in seqs.clone() {
                    let (slot, len) = at[b];
                    for (r, &t) in batch[b].tokens.iter().enumerate() {
                        toks.push(t);
                        pos.push((len + r) as u32);
                        slots.push(slot as u32);
                    }
                    outs.push(toks.len() as u32 - 1);
                }
                self.dec.prefill(&self.gpu, &toks, &pos, &slots, &outs)?;
                let done: Vec<(usize, usize)> = seqs.enumerate().collect();
                ready(self, &done)?;
            }
            return Ok(());
        }
        let longest = batch.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        for r in 0..longest {
            let live: Vec<usize> = (0..batch.len())
                .filter(|&b| batch[b].tokens.len() > r)
                .collect();
            for chunk in live.chunks(group) {
                let toks: Vec<u32> = chunk.iter().map(|&b| batch[b].tokens[r]).collect();
                let pos: Vec<u32> = chunk.iter().map(|&b| (at[b].1 + r) as u32).collect();
                let slots: Vec<u32> = chunk.iter().map(|&b| at[b].0 as u32).collect();
                let keys = pos.iter().max().map_or(1, |&p| p as usize + 1);
                self.dec.set_inputs(&self.gpu, &toks, &pos, &slots)?;
                self.dec.run(&self.gpu, chunk.len(), keys, self.graphs)?;
                let done: Vec<(usize, usize)> = chunk
                    .iter()
                    .enumerate()
                    .filter(|&(_, &b)| r + 1 == batch[b].tokens.len())
                    .map(|(row, &b)| (row, b))
                    .collect();
                if !done.is_empty() {
                    ready(self, &done)?;
                }
            }
        }
        Ok(())
    }

    /// Queue the sampling kernels for `reqs` (rows of the step just run) on the stream: the
    /// plain rows ([`SampleRow::is_plain`]) on many blocks a row, the others one block a row.
    fn launch_sampling(&mut self, reqs: &[SampleRow], banned: &[u32], vocab: usize) -> Result<()> {
        let g = &self.gpu;
        let (plain, other): (Vec<SampleRow>, Vec<SampleRow>) =
            reqs.iter().partition(|r| r.is_plain());
        let bytes = SampleRow::encode(&[plain.as_slice(), other.as_slice()].concat())?;
        let buf = at_least(g, &mut self.sampling.rows, bytes.len())?;
        g.stream()
            .memcpy_htod(&bytes, &mut buf.slice_mut(0..bytes.len()))
            .map_err(|e| anyhow::anyhow!("copying sampling rows: {:?}", e.0))?;
        let rows_ptr = g.ptr(buf);
        let out = at_least(g, &mut self.sampling.out, 2)?;
        let out_ptr = g.ptr(out);
        let logits = self.dec.logits_ptr(g);
        if !plain.is_empty() {
            let parts = at_least(
                g,
                &mut self.sampling.parts,
                ops::sample_plain_scratch(vocab, plain.len()),
            )?;
            let parts_ptr = g.ptr(parts);
            ops::sample_plain(g, logits, vocab, rows_ptr, plain.len(), parts_ptr, out_ptr)?;
        }
        if other.is_empty() {
            return Ok(());
        }
        let ban = at_least(g, &mut self.sampling.banned, banned.len())?;
        if !banned.is_empty() {
            g.stream()
                .memcpy_htod(banned, &mut ban.slice_mut(0..banned.len()))
                .map_err(|e| anyhow::anyhow!("copying banned ids: {:?}", e.0))?;
        }
        let ban_ptr = g.ptr(ban);
        let other_ptr = rows_ptr + (plain.len() * ops::SAMPLE_ROW_BYTES) as u64;
        ops::sample(g, logits, vocab, other_ptr, other.len(), ban_ptr, out_ptr)
    }
}

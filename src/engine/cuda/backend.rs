//! `CudaBackend`: the [`ModelBackend`] on one GPU. A step whose sequences each add one token
//! runs the decode step (CUDA graphs); a step with prompt chunks runs every row through the
//! batched prefill kernels (tensor-core GEMMs, grouped MoE) at once, unless prefill is off,
//! when prompts advance token by token through the decode step.

use std::sync::Arc;

use anyhow::{Result, ensure};

use super::device::Gpu;
use super::model::{DecodeOptions, Decoder, MoePath};
use super::weights::DeviceWeights;
use crate::engine::backend::{ModelBackend, SeqId, SeqStep};
use crate::engine::config::ModelConfig;

/// The CUDA backend.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    dec: Decoder,
    /// Tokens held by each KV slot; `None` when the slot is free.
    lens: Vec<Option<usize>>,
    graphs: bool,
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
            lens: vec![None; slots],
            graphs,
        })
    }

    /// One line of detail beside the `kernel-path` report (which `engine::serve` builds for
    /// every backend): device, architecture, kernel cache, and the fixed parts of the path.
    pub fn describe(&self) -> String {
        let lr = &self.gpu.load_report;
        let o = self.dec.options();
        format!(
            "cuda backend: device {} ({}); kernels {} compiled, {} cached in {:.2} s ({}); \
             decode: moe gemv with fp32 activations, bf16 dense weights, mxfp4 experts; kv {}, \
             sinks {}, cuda graphs {}; {}",
            self.gpu.name(),
            self.gpu.arch(),
            lr.compiled,
            lr.cached,
            lr.seconds,
            lr.cache_dir,
            o.kv_dtype.name(),
            if o.sinks { "on" } else { "off" },
            if self.graphs { "on" } else { "off" },
            match o.moe {
                MoePath::Auto =>
                    "prompts: batched path (tensor-core mma.sync bf16 GEMMs, moe grouped by \
                     expert with mxfp4 dequantized in shared memory, split-K attention)",
                MoePath::Gemv => "prompts: token by token through the decode step",
                MoePath::Grouped => "every step on the batched path (grouped moe), no graphs",
            },
        )
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn slot(&self, seq: SeqId) -> Result<(usize, usize)> {
        let s = seq.0 as usize;
        match self.lens.get(s) {
            Some(Some(len)) => Ok((s, *len)),
            _ => anyhow::bail!("sequence {} is not allocated on {}", seq.0, self.name()),
        }
    }
}

impl CudaBackend {
    /// Every row of `batch` through the decode step, one position per step (decode batches,
    /// and prompts when the prefill kernels are off).
    fn token_by_token(
        &mut self,
        batch: &[SeqStep<'_>],
        rows: &[(usize, usize)],
        out: &mut [Vec<f32>],
    ) -> Result<()> {
        let longest = batch.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        for r in 0..longest {
            let live: Vec<usize> = (0..batch.len())
                .filter(|&b| batch[b].tokens.len() > r)
                .collect();
            for chunk in live.chunks(self.dec.max_batch()) {
                let toks: Vec<u32> = chunk.iter().map(|&b| batch[b].tokens[r]).collect();
                let pos: Vec<u32> = chunk.iter().map(|&b| (rows[b].1 + r) as u32).collect();
                let slots: Vec<u32> = chunk.iter().map(|&b| rows[b].0 as u32).collect();
                let keys = pos.iter().max().map_or(1, |&p| p as usize + 1);
                self.dec.set_inputs(&self.gpu, &toks, &pos, &slots)?;
                self.dec.run(&self.gpu, chunk.len(), keys, self.graphs)?;
                for (row, &b) in chunk.iter().enumerate() {
                    if r + 1 == batch[b].tokens.len() {
                        out[b] = self.dec.logits(&self.gpu, row)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// All rows of `batch` through the batched prefill kernels (decode rows ride along as
    /// one-row sequences), in groups of at most `max_batch` sequences (the head's rows).
    fn prefill(
        &mut self,
        batch: &[SeqStep<'_>],
        rows: &[(usize, usize)],
        out: &mut [Vec<f32>],
    ) -> Result<()> {
        let group = self.dec.max_batch();
        for first in (0..batch.len()).step_by(group) {
            let seqs = first..(first + group).min(batch.len());
            let (mut toks, mut pos, mut slots, mut outs) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for b in seqs.clone() {
                let (slot, len) = rows[b];
                for (r, &t) in batch[b].tokens.iter().enumerate() {
                    toks.push(t);
                    pos.push((len + r) as u32);
                    slots.push(slot as u32);
                }
                outs.push(toks.len() as u32 - 1);
            }
            self.dec.prefill(&self.gpu, &toks, &pos, &slots, &outs)?;
            for (row, b) in seqs.enumerate() {
                out[b] = self.dec.logits(&self.gpu, row)?;
            }
        }
        Ok(())
    }
}

impl ModelBackend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        self.dec.config()
    }

    fn name(&self) -> String {
        format!("cuda ({}, {})", self.gpu.name(), self.gpu.arch())
    }

    fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId> {
        if max_tokens > self.dec.max_positions() {
            return None;
        }
        let s = self.lens.iter().position(Option::is_none)?;
        self.lens[s] = Some(0);
        Some(SeqId(s as u32))
    }

    fn free_seq(&mut self, seq: SeqId) {
        if let Some(l) = self.lens.get_mut(seq.0 as usize) {
            *l = None;
        }
    }

    fn forward(&mut self, batch: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        let mut rows = Vec::with_capacity(batch.len());
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
            rows.push((slot, len));
        }
        let mut out = vec![Vec::new(); batch.len()];
        let single = batch.iter().all(|s| s.tokens.len() == 1);
        let batched = match self.dec.options().moe {
            MoePath::Auto => !single,
            MoePath::Gemv => false,
            MoePath::Grouped => true,
        };
        if batched {
            self.prefill(batch, &rows, &mut out)?;
        } else {
            self.token_by_token(batch, &rows, &mut out)?;
        }
        self.gpu.sync()?;
        for (st, (slot, len)) in batch.iter().zip(rows) {
            self.lens[slot] = Some(len + st.tokens.len());
        }
        Ok(out)
    }
}

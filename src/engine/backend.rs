//! The interface between the scheduler/server and a compute backend (CPU reference or CUDA).

use super::config::ModelConfig;
use super::sampling::{Sampled, Sampler};

/// A sequence slot in a backend's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// One sequence's share of a batched forward step: tokens appended after what the
/// sequence already holds (a whole prompt for prefill, one token for decode).
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
}

/// What one row of a sampled step wants: the request's sampler (`None` for a prefill chunk that
/// does not end its prompt: no token, no logits) and the token ids it must not choose.
#[derive(Debug)]
pub struct RowSample<'a> {
    pub sampler: Option<&'a mut Sampler>,
    pub banned: &'a [u32],
    /// A token to score instead of choosing one ([`Sampler::score`]: the prompt's next token
    /// where the request scores its prompt); `None` chooses.
    pub forced: Option<u32>,
}

/// A compute backend. It owns the weights and the KV cache of every live sequence.
pub trait ModelBackend: Send {
    /// The model's shape.
    fn config(&self) -> &ModelConfig;
    /// Human name of the backend for logs and `/v1/models` (e.g. `cpu`, `cuda:0 (H100)`).
    fn name(&self) -> String;
    /// Reserve a KV slot able to hold `max_tokens` positions; `None` when the KV budget is full.
    fn alloc_seq(&mut self, max_tokens: usize) -> Option<SeqId>;
    /// Release a slot and its KV memory.
    fn free_seq(&mut self, seq: SeqId);

    /// Reserve a slot for `prompt` able to hold `max_tokens` positions, reusing the KV of a
    /// free slot that holds a prefix of it (prefix caching, `engine::prefix`): returns the
    /// slot and how many leading prompt tokens it already holds, always fewer than the
    /// prompt's length (the last prompt position must run to give logits); the caller feeds
    /// the rest. `None` when the KV budget is full. The default reuses nothing.
    fn alloc_cached(&mut self, prompt: &[u32], max_tokens: usize) -> Option<(SeqId, usize)> {
        let _ = prompt;
        self.alloc_seq(max_tokens).map(|s| (s, 0))
    }

    /// Leading tokens of `prompt` that [`ModelBackend::alloc_cached`] would find in a free
    /// slot now, without taking it (the scheduler compares it with what a running sequence
    /// could give by [`ModelBackend::fork_seq`]). The default finds nothing.
    fn cached_prefix(&self, prompt: &[u32]) -> usize {
        let _ = prompt;
        0
    }

    /// Whether [`ModelBackend::fork_seq`] can copy a live sequence's KV. The scheduler has
    /// the `n` choices of a request wait for the first one's prefill only when it can.
    fn can_fork(&self) -> bool {
        false
    }

    /// Reserve a slot able to hold `max_tokens` positions holding a copy of the first `len`
    /// positions of live sequence `src` (the `n` choices of one prompt share its prefill).
    /// `None` when the budget is full, `src` holds fewer positions, or the backend cannot
    /// copy (the default); the caller then prefills as usual.
    fn fork_seq(&mut self, src: SeqId, len: usize, max_tokens: usize) -> Option<SeqId> {
        let _ = (src, len, max_tokens);
        None
    }

    /// Whether this backend reserves a sequence's KV positions as the sequence grows
    /// ([`ModelBackend::grow_seq`]) instead of all of them when it is allocated. The scheduler
    /// then reserves only a request's prompt when it admits it, and when a step needs room the
    /// KV memory does not have, it pre-empts the request admitted last (frees its KV and
    /// recomputes it later). The default reserves everything up front.
    fn grows_on_demand(&self) -> bool {
        false
    }

    /// Reserve room for live sequence `seq` to hold `len` positions (its length after the
    /// next step); false when the KV memory cannot take them (or `seq` is unknown). The
    /// default: the allocation reserved everything already.
    fn grow_seq(&mut self, seq: SeqId, len: usize) -> bool {
        let _ = (seq, len);
        true
    }

    /// Whether a freed slot keeps its KV for [`ModelBackend::alloc_cached`] to reuse (the
    /// scheduler turns it on with `--enable-prefix-caching`). The default keeps nothing; a
    /// backend whose free slots keep their KV at no cost may ignore it.
    fn set_prefix_caching(&mut self, on: bool) {
        let _ = on;
    }
    /// Run one step for every sequence in `batch` and return, per sequence in the same
    /// order, the logits (length `vocab_size`) after its last new token.
    fn forward(&mut self, batch: &[SeqStep<'_>]) -> anyhow::Result<Vec<Vec<f32>>>;

    /// Run one step like [`ModelBackend::forward`] and choose each row's next token with its
    /// sampler (`rows` in batch order). The default samples on the host from `forward`'s
    /// logits; a backend may sample where the logits are and return only the tokens, as long
    /// as it follows `sampling::choose` and takes one `Sampler::next_uniform` per non-greedy
    /// token.
    fn forward_sampled(
        &mut self,
        batch: &[SeqStep<'_>],
        rows: &mut [RowSample<'_>],
    ) -> anyhow::Result<Vec<Option<Sampled>>> {
        anyhow::ensure!(
            rows.len() == batch.len(),
            "{} sampling rows for a batch of {}",
            rows.len(),
            batch.len()
        );
        let logits = self.forward(batch)?;
        anyhow::ensure!(
            logits.len() == batch.len(),
            "backend {} returned {} logit rows for a batch of {}",
            self.name(),
            logits.len(),
            batch.len()
        );
        Ok(logits
            .iter()
            .zip(rows.iter_mut())
            .map(|(l, r)| {
                let forced = r.forced;
                r.sampler.as_deref_mut().map(|s| match forced {
                    Some(t) => s.score(l, t),
                    None => s.sample(l, r.banned),
                })
            })
            .collect())
    }
}

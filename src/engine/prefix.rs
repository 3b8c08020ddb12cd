//! Slot-granular prefix caching, the one choice every backend makes the same way.
//!
//! A backend keeps each sequence's KV in one slot that holds every position contiguously
//! (sliding-window layers too: the window is applied when attention reads the keys). When a
//! sequence ends, its slot's keys and values stay valid for the tokens it was fed. A new
//! prompt takes the free slot whose tokens share the longest prefix with it, keeps that
//! prefix and computes only the rest; when no free slot shares anything, the least recently
//! freed one is overwritten.
//!
//! Reuse is counted in tokens, not in vLLM's blocks of 16: a slot is contiguous, so cutting it
//! at any position costs nothing, and rounding down to a block would only recompute KV that
//! is already there. At least the prompt's last token is always left to compute, because its
//! logits choose the first generated token.

/// A free KV slot, as a candidate for a new prompt.
#[derive(Debug, Clone, Copy)]
pub struct FreeSlot<'a, K> {
    /// The backend's name for the slot.
    pub key: K,
    /// The tokens whose keys and values the slot holds, in position order.
    pub tokens: &'a [u32],
    /// When the slot was last freed ([`Clock`] stamps; larger is more recent).
    pub last_used: u64,
}

/// The slot a prompt takes, and how many of the prompt's leading tokens it already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice<K> {
    /// The slot chosen.
    pub key: K,
    /// Prompt tokens whose KV the slot keeps; the slot is cut back to this length.
    pub cached: usize,
}

/// Leading tokens of `prompt` that a slot holding `held` can give: their common prefix,
/// short of the whole prompt (the last prompt position must run to give logits).
pub fn reusable(held: &[u32], prompt: &[u32]) -> usize {
    let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    common.min(prompt.len().saturating_sub(1))
}

/// The free slot `prompt` should take: the one that can give the most leading tokens; among
/// equals (also when none gives any) the least recently used, so the slots used last — the
/// likeliest to be asked for again — survive longest. `None` when no slot is free.
pub fn choose<'a, K: Copy>(
    prompt: &[u32],
    free: impl IntoIterator<Item = FreeSlot<'a, K>>,
) -> Option<Choice<K>> {
    let mut best: Option<(usize, u64, K)> = None;
    for s in free {
        let n = reusable(s.tokens, prompt);
        let better = match best {
            None => true,
            Some((bn, bused, _)) => n > bn || (n == bn && s.last_used < bused),
        };
        if better {
            best = Some((n, s.last_used, s.key));
        }
    }
    best.map(|(cached, _, key)| Choice { key, cached })
}

/// Stamps for "last used", increasing with every tick.
#[derive(Debug, Default)]
pub struct Clock(u64);

impl Clock {
    /// The next stamp.
    pub fn tick(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: usize, tokens: &[u32], last_used: u64) -> FreeSlot<'_, usize> {
        FreeSlot {
            key,
            tokens,
            last_used,
        }
    }

    #[test]
    fn the_longest_prefix_wins_and_the_last_prompt_token_is_never_cached() {
        let a = [1, 2, 3, 4, 5];
        let b = [1, 2, 9];
        let c = [7, 7];
        let free = [slot(0, &a, 3), slot(1, &b, 1), slot(2, &c, 2)];
        // Slot 0 shares [1, 2, 3].
        assert_eq!(
            choose(&[1, 2, 3, 8], free),
            Some(Choice { key: 0, cached: 3 })
        );
        // A prompt equal to what the slot holds, or a prefix of it: all but its last token.
        assert_eq!(
            choose(&[1, 2, 3, 4, 5], free),
            Some(Choice { key: 0, cached: 4 })
        );
        // Slots 0 and 1 both give [1]: the least recently used of them.
        assert_eq!(choose(&[1, 2], free), Some(Choice { key: 1, cached: 1 }));
        // One token: nothing can be cached; the least recently used slot is taken.
        assert_eq!(choose(&[1], free), Some(Choice { key: 1, cached: 0 }));
        // Nothing shared: the least recently used slot is overwritten.
        assert_eq!(choose(&[5, 5, 5], free), Some(Choice { key: 1, cached: 0 }));
        assert_eq!(choose(&[], free), Some(Choice { key: 1, cached: 0 }));
        // Equal prefixes: the least recently used of them.
        let d = [1, 2, 3, 6];
        let tie = [slot(0, &a, 3), slot(3, &d, 2)];
        assert_eq!(
            choose(&[1, 2, 3, 0], tie),
            Some(Choice { key: 3, cached: 3 })
        );
        assert_eq!(choose::<usize>(&[1, 2], []), None);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3, 4], &[1, 2, 3]), 2);
        assert_eq!(reusable(&[], &[1, 2]), 0);
    }
}

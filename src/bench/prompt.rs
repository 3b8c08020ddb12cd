//! Prompts of an exact token length, cut from an embedded text with the o200k tokenizer.
//!
//! The text (`corpus.txt`, written for mxtune and dedicated to the public domain) is natural
//! prose, so prefill sees realistic tokens rather than one repeated id. It is tokenized once,
//! offline (tiktoken-rs embeds the o200k vocabulary), and read cyclically for long prompts.

use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use tiktoken_rs::CoreBPE;

const CORPUS: &str = include_str!("corpus.txt");

fn bpe() -> &'static CoreBPE {
    tiktoken_rs::o200k_base_singleton()
}

fn corpus_tokens() -> &'static [u32] {
    static TOKENS: OnceLock<Vec<u32>> = OnceLock::new();
    TOKENS.get_or_init(|| bpe().encode_ordinary(CORPUS))
}

/// Count o200k tokens of a text (no special tokens).
pub fn count_tokens(text: &str) -> usize {
    bpe().encode_ordinary(text).len()
}

/// A piece of text known to encode to an exact number of o200k tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exact {
    /// The text.
    pub text: String,
    /// Its token ids (o200k).
    pub ids: Vec<u32>,
}

/// Build a text of exactly `n` o200k tokens: `prefix` (for `--no-cache` uniqueness) followed by
/// corpus text starting at token `offset`.
///
/// Decoding a slice of ids and re-encoding can merge tokens at the joins, so the slice is
/// grown or shrunk until the re-encoded length is exactly `n`.
pub fn exact_text(n: usize, prefix: &str, offset: usize) -> Result<Exact> {
    if n == 0 {
        return Ok(Exact {
            text: String::new(),
            ids: Vec::new(),
        });
    }
    let corpus = corpus_tokens();
    if corpus.is_empty() {
        bail!("the embedded corpus encodes to no tokens");
    }
    let prefix_len = count_tokens(prefix);
    if prefix_len >= n {
        bail!("cannot build a {n}-token text: the uniqueness prefix alone is {prefix_len} tokens");
    }
    let mut take = n - prefix_len;
    // Each adjustment moves the length by about one token; a few rounds always settle it.
    for _ in 0..64 {
        let ids: Vec<u32> = (0..take)
            .map(|i| corpus[(offset + i) % corpus.len()])
            .collect();
        let body = bpe()
            .decode(&ids)
            .context("decoding corpus tokens back to text")?;
        let text = format!("{prefix}{body}");
        let encoded = bpe().encode_ordinary(&text);
        match encoded.len().cmp(&n) {
            std::cmp::Ordering::Equal => return Ok(Exact { text, ids: encoded }),
            std::cmp::Ordering::Greater => take = take.saturating_sub(encoded.len() - n).max(1),
            std::cmp::Ordering::Less => take += n - encoded.len(),
        }
    }
    bail!("could not build a text of exactly {n} tokens (prefix {prefix:?}, offset {offset})")
}

/// The two parts of a benchmark prompt: `depth` tokens of context, then `pp` tokens of prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Context that fills the KV cache before the prompt (chat: the system message).
    pub context: Exact,
    /// The measured prompt (chat: the user message).
    pub prompt: Exact,
}

impl Prompt {
    /// Build a prompt. `unique` (with `--no-cache`) starts the context — or the prompt when
    /// there is no context — with a tag no other request shares, so no prefix can be cached.
    pub fn build(pp: usize, depth: usize, unique: Option<&str>) -> Result<Self> {
        let tag = unique.map(|u| format!("[{u}] ")).unwrap_or_default();
        let (context_tag, prompt_tag) = if depth > 0 {
            (tag.as_str(), "")
        } else {
            ("", tag.as_str())
        };
        // The prompt reads the corpus after the context, so the two do not repeat each other.
        let context = exact_text(depth, context_tag, 0)
            .with_context(|| format!("building the {depth}-token context"))?;
        let prompt = exact_text(pp, prompt_tag, depth)
            .with_context(|| format!("building the {pp}-token prompt"))?;
        Ok(Self { context, prompt })
    }

    /// Tokens the two parts hold together (the chat template adds a few more on the server).
    pub fn tokens(&self) -> usize {
        self.context.ids.len() + self.prompt.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lengths_hold_across_sizes_and_offsets() {
        for n in [1, 2, 7, 64, 513, 2048, 5000] {
            for offset in [0, 3, 977] {
                let e = exact_text(n, "", offset).unwrap();
                assert_eq!(count_tokens(&e.text), n, "n={n} offset={offset}");
                assert_eq!(e.ids.len(), n);
            }
        }
    }

    #[test]
    fn unique_prompts_differ_and_keep_their_length() {
        let a = Prompt::build(128, 256, Some("req 1")).unwrap();
        let b = Prompt::build(128, 256, Some("req 2")).unwrap();
        assert_ne!(a.context.text, b.context.text);
        assert_eq!(a.context.ids.len(), 256);
        assert_eq!(a.prompt.ids.len(), 128);
        assert_eq!(a.prompt, b.prompt);
        let c = Prompt::build(32, 0, Some("req 3")).unwrap();
        assert!(c.prompt.text.starts_with("[req 3] "));
        assert_eq!(count_tokens(&c.prompt.text), 32);
    }

    #[test]
    fn prefix_longer_than_the_text_is_an_error() {
        assert!(exact_text(2, "a long prefix of many tokens", 0).is_err());
    }
}

//! The o200k_harmony tokenizer (embedded in tiktoken-rs, fully offline) and a streaming
//! detokenizer that never emits half a UTF-8 character.

use anyhow::Context;
use std::collections::HashSet;
use std::sync::LazyLock;
use tiktoken_rs::CoreBPE;

/// Ids of every special (control or reserved) token, computed once from the vocabulary.
static SPECIAL_IDS: LazyLock<HashSet<u32>> = LazyLock::new(|| {
    let bpe = tiktoken_rs::o200k_harmony_singleton();
    bpe.special_tokens()
        .iter()
        .flat_map(|s| bpe.encode_with_special_tokens(s))
        .collect()
});

/// The gpt-oss tokenizer: o200k_base BPE plus the harmony special tokens.
#[derive(Clone, Copy)]
pub struct Tokenizer {
    bpe: &'static CoreBPE,
    specials: &'static HashSet<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokenizer(o200k_harmony)")
    }
}

impl Tokenizer {
    /// The o200k_harmony tokenizer. The vocabulary is compiled into the binary.
    pub fn o200k_harmony() -> Self {
        Tokenizer {
            bpe: tiktoken_rs::o200k_harmony_singleton(),
            specials: &SPECIAL_IDS,
        }
    }

    /// Encode plain text. Special-token spellings in `text` stay plain text, so user
    /// content can never inject harmony control tokens.
    pub fn encode_text(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }

    /// The id of a special token such as `<|start|>`.
    pub fn special_id(&self, name: &str) -> anyhow::Result<u32> {
        let ids = self.bpe.encode_with_special_tokens(name);
        match ids.as_slice() {
            [id] if self.is_special(*id) => Ok(*id),
            _ => anyhow::bail!("`{name}` is not a special token of o200k_harmony"),
        }
    }

    /// Whether `id` is a special (control or reserved) token rather than text.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.contains(&id)
    }

    /// The raw bytes of one token (empty for an id outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.bpe.decode_bytes(&[id]).unwrap_or_default()
    }

    /// A printable form of one token for logprob listings (lossy for partial UTF-8).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(&self.token_bytes(id)).into_owned()
    }

    /// Decode a whole sequence; `skip_special` leaves control tokens out of the text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut d = StreamDecoder::default();
        let mut out = String::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            out.push_str(&d.push(&self.token_bytes(id)));
        }
        out.push_str(&d.finish());
        out
    }

    /// Encode text that may contain special-token spellings (used by tests and tools to
    /// write exact token sequences).
    pub fn encode_with_specials(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let ids = self.bpe.encode_with_special_tokens(text);
        ids.iter()
            .all(|&id| !self.token_bytes(id).is_empty())
            .then_some(ids)
            .with_context(|| format!("could not encode {text:?}"))
    }
}

/// Turns a stream of token bytes into text, holding back an incomplete UTF-8 sequence
/// until the bytes that finish it arrive (a token may end in the middle of a character).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Add one token's bytes; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Incomplete tail: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes that no continuation can fix: replace them.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flush whatever is held back (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ids_match_gpt_oss() {
        let t = Tokenizer::o200k_harmony();
        assert_eq!(t.special_id("<|start|>").unwrap(), 200006);
        assert_eq!(t.special_id("<|end|>").unwrap(), 200007);
        assert_eq!(t.special_id("<|message|>").unwrap(), 200008);
        assert_eq!(t.special_id("<|channel|>").unwrap(), 200005);
        assert_eq!(t.special_id("<|return|>").unwrap(), 200002);
        assert_eq!(t.special_id("<|call|>").unwrap(), 200012);
        assert_eq!(t.special_id("<|endoftext|>").unwrap(), 199999);
        assert!(t.special_id("hello").is_err());
        assert!(t.is_special(200007));
        assert!(t.is_special(201087));
        assert!(!t.is_special(13225));
    }

    #[test]
    fn user_text_cannot_inject_specials() {
        let t = Tokenizer::o200k_harmony();
        let ids = t.encode_text("<|end|>");
        assert!(ids.len() > 1);
        assert!(ids.iter().all(|&id| !t.is_special(id)));
        assert_eq!(t.decode(&ids, false), "<|end|>");
    }

    #[test]
    fn roundtrip_text() {
        let t = Tokenizer::o200k_harmony();
        let s = "Hello, world! Grüße 🌍 数学";
        assert_eq!(t.decode(&t.encode_text(s), true), s);
    }

    #[test]
    fn stream_decoder_holds_split_characters() {
        let mut d = StreamDecoder::default();
        let globe = "🌍".as_bytes(); // 4 bytes
        assert_eq!(d.push(&globe[..1]), "");
        assert_eq!(d.push(&globe[1..3]), "");
        assert_eq!(d.push(&[globe[3], b'a']), "🌍a");
        assert_eq!(d.push(&globe[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.push(&[0xff, b'b']), "\u{FFFD}b");
    }

    #[test]
    fn stream_decode_of_real_tokens_equals_whole_decode() {
        let t = Tokenizer::o200k_harmony();
        let ids = t.encode_text("emoji 🌍🌍 and ünïcödé");
        let mut d = StreamDecoder::default();
        let mut s = String::new();
        for &id in &ids {
            s.push_str(&d.push(&t.token_bytes(id)));
        }
        s.push_str(&d.finish());
        assert_eq!(s, t.decode(&ids, false));
    }
}

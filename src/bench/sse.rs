//! One OpenAI-style streaming chunk (`data: {...}`), decoded into what the bookkeeping needs.
//!
//! Covers both endpoints: chat chunks carry `choices[0].delta.{content, reasoning_content,
//! reasoning}`, completions chunks carry `choices[0].text`. gpt-oss servers stream the
//! analysis channel as `reasoning_content` (vLLM) or `reasoning` (newer vLLM, llama.cpp), so a
//! client that reads only `content` would see no tokens at all.

use serde::Deserialize;

/// Token usage as reported by the server in the final `include_usage` chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Tokens of the rendered prompt (chat template included).
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
}

/// What one chunk carried, reduced to the fields the statistics use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chunk {
    /// The chunk had a non-empty `choices` array (llama-benchy's "first response" marker).
    pub has_choices: bool,
    /// Answer text in this chunk (`delta.content` or completions `text`).
    pub content: String,
    /// Reasoning text in this chunk (`delta.reasoning_content` or `delta.reasoning`).
    pub reasoning: String,
    /// Tokens in this chunk when the server said so (token ids, else logprob entries).
    pub tokens: Option<u32>,
    /// Where `tokens` came from.
    pub tokens_from: Option<PerChunkCount>,
    /// Log-probabilities of this chunk's tokens, when requested.
    pub logprobs: Vec<f64>,
    /// A logprob entry was present but null or not a number.
    pub invalid_logprob: bool,
    /// `finish_reason` of the first choice, when set.
    pub finish_reason: Option<String>,
    /// Usage, present on the final chunk when `include_usage` was asked for.
    pub usage: Option<Usage>,
    /// An `error` object the server put into the stream (vLLM does this mid-stream).
    pub error: Option<String>,
}

impl Chunk {
    /// The chunk carried generated text (answer or reasoning), i.e. at least one token.
    pub fn carries_token(&self) -> bool {
        !self.content.is_empty() || !self.reasoning.is_empty() || self.tokens.unwrap_or(0) > 0
    }
}

/// How a chunk's token count was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerChunkCount {
    /// `token_ids` on the choice or delta (vLLM `return_token_ids`).
    TokenIds,
    /// One logprob entry per token (`logprobs.content` or `logprobs.tokens`).
    Logprobs,
}

/// Why a `data:` payload could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// The payload is not JSON of the expected shape.
    #[error("malformed SSE data (not an OpenAI chunk): {reason}; data starts with {head:?}")]
    Malformed {
        /// serde's message.
        reason: String,
        /// First bytes of the payload, for the report.
        head: String,
    },
    /// Python servers write NaN / Infinity literals, which are not JSON.
    #[error(
        "chunk contains a NaN or Infinity literal (invalid logprobs?); data starts with {head:?}"
    )]
    NonFinite {
        /// First bytes of the payload.
        head: String,
    },
}

#[derive(Deserialize)]
struct RawChunk {
    #[serde(default)]
    choices: Option<Vec<RawChoice>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawChoice {
    #[serde(default)]
    delta: Option<RawDelta>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    logprobs: Option<RawLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    token_ids: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct RawDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    token_ids: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct RawLogprobs {
    /// Chat: one entry per token.
    #[serde(default)]
    content: Option<Vec<RawTokenLogprob>>,
    /// Completions: parallel arrays.
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f64>>>,
}

#[derive(Deserialize)]
struct RawTokenLogprob {
    #[serde(default)]
    logprob: Option<f64>,
}

fn head(data: &str) -> String {
    data.chars().take(80).collect()
}

/// Decode one `data:` payload (not `[DONE]`).
pub fn parse_chunk(data: &str) -> Result<Chunk, ChunkError> {
    let raw: RawChunk = match serde_json::from_str(data) {
        Ok(raw) => raw,
        Err(e) => {
            if data.contains("NaN") || data.contains("Infinity") {
                return Err(ChunkError::NonFinite { head: head(data) });
            }
            return Err(ChunkError::Malformed {
                reason: e.to_string(),
                head: head(data),
            });
        }
    };
    let mut chunk = Chunk {
        usage: raw.usage,
        error: raw
            .error
            .map(|e| match e.get("message").and_then(|m| m.as_str()) {
                Some(m) => m.to_owned(),
                None => e.to_string(),
            }),
        ..Chunk::default()
    };
    let Some(choice) = raw.choices.and_then(|c| c.into_iter().next()) else {
        return Ok(chunk);
    };
    chunk.has_choices = true;
    chunk.finish_reason = choice.finish_reason;
    let mut token_ids = choice.token_ids;
    if let Some(delta) = choice.delta {
        chunk.content = delta.content.unwrap_or_default();
        chunk.reasoning = delta
            .reasoning_content
            .or(delta.reasoning)
            .unwrap_or_default();
        token_ids = token_ids.or(delta.token_ids);
    }
    if let Some(text) = choice.text {
        chunk.content.push_str(&text);
    }
    if let Some(lp) = choice.logprobs {
        let values: Vec<Option<f64>> = match (lp.content, lp.token_logprobs) {
            (Some(entries), _) => entries.into_iter().map(|e| e.logprob).collect(),
            (None, Some(values)) => values,
            (None, None) => Vec::new(),
        };
        chunk.invalid_logprob = values.iter().any(|v| v.is_none());
        chunk.logprobs = values.iter().flatten().copied().collect();
        if !values.is_empty() {
            chunk.tokens = Some(values.len() as u32);
            chunk.tokens_from = Some(PerChunkCount::Logprobs);
        }
    }
    if let Some(ids) = token_ids {
        chunk.tokens = Some(ids.len() as u32);
        chunk.tokens_from = Some(PerChunkCount::TokenIds);
    }
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_only_first_chunk_has_choices_but_no_token() {
        let c = parse_chunk(
            r#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        )
        .unwrap();
        assert!(c.has_choices);
        assert!(!c.carries_token());
    }

    #[test]
    fn reasoning_content_and_reasoning_both_count_as_tokens() {
        let a = parse_chunk(r#"{"choices":[{"delta":{"reasoning_content":"We"}}]}"#).unwrap();
        let b = parse_chunk(r#"{"choices":[{"delta":{"reasoning":"think"}}]}"#).unwrap();
        assert_eq!(a.reasoning, "We");
        assert_eq!(b.reasoning, "think");
        assert!(a.carries_token() && b.carries_token());
    }

    #[test]
    fn usage_chunk_has_empty_choices() {
        let c = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#,
        )
        .unwrap();
        assert!(!c.has_choices);
        assert_eq!(
            c.usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 7
            })
        );
    }

    #[test]
    fn token_ids_win_over_logprobs_for_the_count() {
        let c = parse_chunk(
            r#"{"choices":[{"delta":{"content":"ab","token_ids":[1,2,3]},"logprobs":{"content":[{"logprob":-0.5},{"logprob":-1.0}]}}]}"#,
        )
        .unwrap();
        assert_eq!(c.tokens, Some(3));
        assert_eq!(c.tokens_from, Some(PerChunkCount::TokenIds));
        assert_eq!(c.logprobs, vec![-0.5, -1.0]);
    }

    #[test]
    fn completions_text_and_token_logprobs() {
        let c = parse_chunk(
            r#"{"choices":[{"text":" hi","logprobs":{"tokens":[" h","i"],"token_logprobs":[-0.1,null]}}]}"#,
        )
        .unwrap();
        assert_eq!(c.content, " hi");
        assert_eq!(c.tokens, Some(2));
        assert!(c.invalid_logprob);
    }

    #[test]
    fn nan_and_garbage_are_reported() {
        assert!(matches!(
            parse_chunk(r#"{"choices":[{"logprobs":{"content":[{"logprob":NaN}]}}]}"#),
            Err(ChunkError::NonFinite { .. })
        ));
        assert!(matches!(
            parse_chunk("{not json"),
            Err(ChunkError::Malformed { .. })
        ));
    }

    #[test]
    fn error_object_in_stream_is_kept() {
        let c = parse_chunk(r#"{"error":{"message":"boom","code":500}}"#).unwrap();
        assert_eq!(c.error.as_deref(), Some("boom"));
    }
}

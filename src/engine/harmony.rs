//! The harmony chat format of gpt-oss: rendering a conversation into prompt tokens and
//! parsing generated tokens into the analysis channel (`reasoning_content`) and the final
//! channel (`content`).

use super::tokenizer::{StreamDecoder, Tokenizer};
use serde::Deserialize;

/// How much the model should think, rendered as `Reasoning: <effort>` in the system message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    Low,
    #[default]
    Medium,
    High,
}

impl ReasoningEffort {
    fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

/// One chat message with plain-text content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// The harmony control tokens, looked up by name in the tokenizer (never hard-coded ids).
#[derive(Debug, Clone)]
pub struct HarmonyTokens {
    pub start: u32,
    pub end: u32,
    pub message: u32,
    pub channel: u32,
    pub constrain: u32,
    pub ret: u32,
    pub call: u32,
    pub endoftext: u32,
}

impl HarmonyTokens {
    /// Look the control tokens up in `tok`.
    pub fn new(tok: &Tokenizer) -> anyhow::Result<Self> {
        Ok(HarmonyTokens {
            start: tok.special_id("<|start|>")?,
            end: tok.special_id("<|end|>")?,
            message: tok.special_id("<|message|>")?,
            channel: tok.special_id("<|channel|>")?,
            constrain: tok.special_id("<|constrain|>")?,
            ret: tok.special_id("<|return|>")?,
            call: tok.special_id("<|call|>")?,
            endoftext: tok.special_id("<|endoftext|>")?,
        })
    }

    /// The tokens that end generation: the model's eos plus `<|return|>`, `<|call|>` and
    /// `<|endoftext|>`. `<|end|>` is deliberately absent: it only closes the analysis message.
    pub fn stop_set(&self, config_eos: u32) -> Vec<u32> {
        let mut v = vec![config_eos, self.ret, self.call, self.endoftext];
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Renders conversations into harmony prompt tokens.
#[derive(Debug, Clone)]
pub struct Renderer {
    tok: Tokenizer,
    t: HarmonyTokens,
}

impl Renderer {
    /// A renderer over the o200k_harmony tokenizer.
    pub fn new(tok: Tokenizer) -> anyhow::Result<Self> {
        Ok(Renderer {
            t: HarmonyTokens::new(&tok)?,
            tok,
        })
    }

    fn push_message(&self, out: &mut Vec<u32>, header: &str, body: &str) {
        out.push(self.t.start);
        out.extend(self.tok.encode_text(header));
        out.push(self.t.message);
        out.extend(self.tok.encode_text(body));
        out.push(self.t.end);
    }

    /// Render `messages` as a harmony prompt ending with `<|start|>assistant`, ready for the
    /// model to write its answer. OpenAI `system` and `developer` messages both become the
    /// harmony developer message; the harmony system message is the standard one.
    pub fn render_chat(&self, messages: &[Message], effort: ReasoningEffort) -> Vec<u32> {
        let mut out = Vec::new();
        let system = format!(
            "You are ChatGPT, a large language model trained by OpenAI.\n\
             Knowledge cutoff: 2024-06\n\n\
             Reasoning: {}\n\n\
             # Valid channels: analysis, commentary, final. Channel must be included for every message.",
            effort.as_str()
        );
        self.push_message(&mut out, "system", &system);
        let instructions: Vec<&str> = messages
            .iter()
            .filter(|m| matches!(m.role, Role::System | Role::Developer))
            .map(|m| m.content.as_str())
            .collect();
        if !instructions.is_empty() {
            let body = format!("# Instructions\n\n{}", instructions.join("\n\n"));
            self.push_message(&mut out, "developer", &body);
        }
        for m in messages {
            match m.role {
                Role::System | Role::Developer => {}
                Role::User => self.push_message(&mut out, "user", &m.content),
                Role::Assistant => {
                    out.push(self.t.start);
                    out.extend(self.tok.encode_text("assistant"));
                    out.push(self.t.channel);
                    out.extend(self.tok.encode_text("final"));
                    out.push(self.t.message);
                    out.extend(self.tok.encode_text(&m.content));
                    out.push(self.t.end);
                }
            }
        }
        out.push(self.t.start);
        out.extend(self.tok.encode_text("assistant"));
        out
    }

    /// The harmony control tokens this renderer uses.
    pub fn tokens(&self) -> &HarmonyTokens {
        &self.t
    }
}

/// Where a piece of generated text belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The analysis channel, returned as `reasoning_content`.
    Reasoning,
    /// The final (or commentary) channel, returned as `content`.
    Content,
}

/// A piece of text parsed from the model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub channel: Channel,
    pub text: String,
}

#[derive(Debug)]
enum State {
    /// Before a message header; `after_start` when `<|start|>` was just seen (a role follows).
    Header { after_start: bool },
    /// Reading the channel name after `<|channel|>`.
    ChannelName(Vec<u8>),
    /// Inside a message body.
    Body(Channel),
}

/// Incremental parser of generated harmony tokens. Text the model writes without any
/// header (possible for untrained or synthetic weights) is treated as final content, so a
/// client always sees what was generated.
#[derive(Debug)]
pub struct OutputParser {
    tok: Tokenizer,
    t: HarmonyTokens,
    state: State,
    decoder: StreamDecoder,
}

impl OutputParser {
    /// A parser for an answer whose prompt ended with `<|start|>assistant`.
    pub fn new(tok: Tokenizer) -> anyhow::Result<Self> {
        Ok(OutputParser {
            t: HarmonyTokens::new(&tok)?,
            tok,
            // The prompt already ends with `<|start|>assistant`: a channel or text follows.
            state: State::Header { after_start: false },
            decoder: StreamDecoder::default(),
        })
    }

    fn channel_of(name: &[u8]) -> Channel {
        let name = String::from_utf8_lossy(name);
        // The channel name may be followed by a recipient (` to=…`) or a constraint.
        match name.split_whitespace().next() {
            Some("analysis") => Channel::Reasoning,
            _ => Channel::Content,
        }
    }

    fn flush(&mut self, out: &mut Vec<Delta>) {
        if let State::Body(channel) = self.state {
            let text = self.decoder.finish();
            if !text.is_empty() {
                out.push(Delta { channel, text });
            }
        }
    }

    /// Feed one generated token; returns the text it completes (possibly none).
    pub fn push(&mut self, id: u32) -> Vec<Delta> {
        let mut out = Vec::new();
        let t = &self.t;
        if id == t.start {
            self.flush(&mut out);
            self.state = State::Header { after_start: true };
        } else if id == t.end || id == t.ret || id == t.call {
            self.flush(&mut out);
            self.state = State::Header { after_start: false };
        } else if id == t.channel {
            self.flush(&mut out);
            self.state = State::ChannelName(Vec::new());
        } else if id == t.message {
            self.flush(&mut out);
            let channel = match &self.state {
                State::ChannelName(name) => Self::channel_of(name),
                State::Body(c) => *c,
                State::Header { .. } => Channel::Content,
            };
            self.state = State::Body(channel);
        } else if id == t.constrain {
            // `<|constrain|>json` belongs to the header; the channel is already known.
        } else if self.tok.is_special(id) {
            // Reserved ids carry no text.
        } else {
            let bytes = self.tok.token_bytes(id);
            match &mut self.state {
                State::ChannelName(name) => name.extend_from_slice(&bytes),
                State::Header { after_start: true } => {
                    // The role name (`assistant`) after `<|start|>`.
                }
                State::Header { after_start: false } => {
                    self.state = State::Body(Channel::Content);
                    let text = self.decoder.push(&bytes);
                    if !text.is_empty() {
                        out.push(Delta {
                            channel: Channel::Content,
                            text,
                        });
                    }
                }
                State::Body(channel) => {
                    let channel = *channel;
                    let text = self.decoder.push(&bytes);
                    if !text.is_empty() {
                        out.push(Delta { channel, text });
                    }
                }
            }
        }
        out
    }

    /// End of generation: flush any held-back partial character.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        self.flush(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Tokenizer {
        Tokenizer::o200k_harmony()
    }

    fn ids(s: &str) -> Vec<u32> {
        tok().encode_with_specials(s).unwrap()
    }

    #[test]
    fn renders_default_system_and_user() {
        let r = Renderer::new(tok()).unwrap();
        let got = r.render_chat(
            &[Message {
                role: Role::User,
                content: "Hi".into(),
            }],
            ReasoningEffort::default(),
        );
        let want = ids(
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
             Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n\
             # Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>\
             <|start|>user<|message|>Hi<|end|><|start|>assistant",
        );
        assert_eq!(got, want);
        assert_eq!(&got[..1], &[200006]);
        assert_eq!(&got[got.len() - 2..], &[200006, 173781]);
    }

    #[test]
    fn renders_developer_effort_and_history() {
        let r = Renderer::new(tok()).unwrap();
        let got = r.render_chat(
            &[
                Message {
                    role: Role::System,
                    content: "Be brief.".into(),
                },
                Message {
                    role: Role::User,
                    content: "2+2?".into(),
                },
                Message {
                    role: Role::Assistant,
                    content: "4".into(),
                },
                Message {
                    role: Role::User,
                    content: "<|end|>".into(),
                },
            ],
            ReasoningEffort::High,
        );
        let text = tok().decode(&got, false);
        assert!(text.contains("Reasoning: high"));
        assert!(text.contains("<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"));
        assert!(text.contains("<|start|>assistant<|channel|>final<|message|>4<|end|>"));
        assert!(text.ends_with("<|start|>user<|message|><|end|><|end|><|start|>assistant"));
        // The user's literal "<|end|>" stays text: one real <|end|> per message (5).
        assert_eq!(got.iter().filter(|&&i| i == 200007).count(), 5);
    }

    #[test]
    fn stop_set_excludes_end() {
        let t = HarmonyTokens::new(&tok()).unwrap();
        assert_eq!(t.stop_set(200002), vec![199999, 200002, 200012]);
        assert!(!t.stop_set(200002).contains(&t.end));
    }

    fn parse(seq: &[u32]) -> (String, String) {
        let mut p = OutputParser::new(tok()).unwrap();
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut deltas: Vec<Delta> = seq.iter().flat_map(|&i| p.push(i)).collect();
        deltas.extend(p.finish());
        for d in deltas {
            match d.channel {
                Channel::Reasoning => reasoning.push_str(&d.text),
                Channel::Content => content.push_str(&d.text),
            }
        }
        (reasoning, content)
    }

    #[test]
    fn parses_analysis_then_final() {
        // <|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>
        let seq = ids(
            "<|channel|>analysis<|message|>Think 🌍.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
        );
        assert_eq!(seq[0], 200005);
        assert_eq!(seq[2], 200008);
        assert_eq!(parse(&seq), ("Think 🌍.".to_string(), "Hello!".to_string()));
    }

    #[test]
    fn parses_split_utf8_and_constrain() {
        let mut seq = ids("<|channel|>final <|constrain|>json<|message|>");
        // Feed a 4-byte character one byte-token at a time.
        for b in "🌍".as_bytes() {
            seq.push(byte_token(*b));
        }
        seq.push(200002);
        assert_eq!(parse(&seq), (String::new(), "🌍".to_string()));
    }

    /// The id of the single-byte token for `b` (o200k maps every byte to a token).
    fn byte_token(b: u8) -> u32 {
        let t = tok();
        (0..1000u32)
            .find(|&i| t.token_bytes(i) == [b])
            .expect("every byte has a token")
    }

    #[test]
    fn headerless_text_is_content() {
        let mut seq = ids("plain");
        seq.push(200006);
        seq.extend(ids("assistant"));
        seq.extend(ids(" words"));
        // After `<|start|>` everything up to `<|message|>` is header, never shown.
        assert_eq!(parse(&seq), (String::new(), "plain".to_string()));
        let mut seq = ids("<|channel|>analysis<|message|>a<|end|>");
        seq.extend(ids(" b"));
        assert_eq!(parse(&seq), ("a".to_string(), " b".to_string()));
    }
}

//! The harmony chat format of gpt-oss: rendering a conversation into prompt tokens and
//! parsing generated tokens into the analysis channel (`reasoning_content`) and the final
//! channel (`content`).

pub mod json;
pub mod tools;

use super::tokenizer::{StreamDecoder, Tokenizer};
use serde::Deserialize;
pub use tools::Function;

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
    /// A function's result, answering an assistant's tool call.
    Tool,
}

/// A function call the assistant made in an earlier turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The function's name (without the `functions.` namespace).
    pub name: String,
    /// The arguments as the client sent them: JSON text (written back in the template's
    /// JSON style when it parses) or any other text (written as a JSON string).
    pub arguments: String,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The assistant's reasoning (`reasoning_content`), kept only before a tool call.
    pub thinking: String,
    /// The assistant's tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// For a `Tool` message: the function whose result this is.
    pub tool_name: String,
}

impl Message {
    /// A message with text only.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            thinking: String::new(),
            tool_calls: Vec::new(),
            tool_name: String::new(),
        }
    }
}

/// Everything a harmony prompt is rendered from.
#[derive(Debug, Clone)]
pub struct Chat<'a> {
    pub messages: &'a [Message],
    /// The functions offered (`tools`); empty renders no `# Tools` section.
    pub tools: &'a [Function],
    pub effort: ReasoningEffort,
    /// The `Current date:` of the system message (the server passes today, UTC).
    pub date: chrono::NaiveDate,
    /// What the assistant's answer is pre-filled with after `<|start|>assistant`.
    pub prefill: Prefill<'a>,
}

/// A start of the assistant's answer written into the prompt, so the model continues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill<'a> {
    /// Nothing: the model chooses the channel (and whether to call a tool).
    None,
    /// `<|channel|>commentary to=functions.`: the model must call some function.
    AnyCall,
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`: the model
    /// writes the arguments of this function.
    Call(&'a str),
    /// `<|channel|>final<|message|>`: the model writes the final answer at once, without
    /// reasoning first (structured output constrains it from its first token).
    Final,
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

    /// `<|start|>{role}<|channel|>{channel}<|message|>{body}{last}`.
    fn push_channel_message(
        &self,
        out: &mut Vec<u32>,
        role: &str,
        channel: &str,
        body: &str,
        last: u32,
    ) {
        out.push(self.t.start);
        out.extend(self.tok.encode_text(role));
        out.push(self.t.channel);
        out.extend(self.tok.encode_text(channel));
        out.push(self.t.message);
        out.extend(self.tok.encode_text(body));
        out.push(last);
    }

    /// The harmony system message, as the model's chat template writes it.
    fn system_message(chat: &Chat<'_>) -> String {
        let mut s = format!(
            "You are ChatGPT, a large language model trained by OpenAI.\n\
             Knowledge cutoff: 2024-06\n\
             Current date: {}\n\n\
             Reasoning: {}\n\n\
             # Valid channels: analysis, commentary, final. Channel must be included for every message.",
            chat.date.format("%Y-%m-%d"),
            chat.effort.as_str()
        );
        if !chat.tools.is_empty() {
            s.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
        }
        s
    }

    /// Render a chat as a harmony prompt ending with `<|start|>assistant` (plus the
    /// prefill), ready for the model to write its answer. The rendering follows gpt-oss's
    /// chat template (`tests/fixtures/harmony/chat_template.jinja`): a first `system` or
    /// `developer` message becomes the developer message's `# Instructions` (later ones are
    /// left out, as the template does), tools become its `# Tools` section, earlier
    /// reasoning is dropped except before a tool call not yet answered by a final message,
    /// and a tool's result is written as a JSON string. Unlike the template, which writes
    /// only the first tool call of an assistant message, every call is written.
    pub fn render_chat(&self, chat: &Chat<'_>) -> Vec<u32> {
        let mut out = Vec::new();
        self.push_message(&mut out, "system", &Self::system_message(chat));
        let (instructions, rest) = match chat.messages.split_first() {
            Some((first, rest)) if matches!(first.role, Role::System | Role::Developer) => {
                (first.content.as_str(), rest)
            }
            _ => ("", chat.messages),
        };
        if !instructions.is_empty() || !chat.tools.is_empty() {
            let mut body = String::new();
            if !instructions.is_empty() {
                body.push_str("# Instructions\n\n");
                body.push_str(instructions);
                body.push_str("\n\n");
            }
            if !chat.tools.is_empty() {
                body.push_str("# Tools\n\n");
                body.push_str(&tools::namespace(chat.tools));
            }
            self.push_message(&mut out, "developer", &body);
        }
        for (i, m) in rest.iter().enumerate() {
            match m.role {
                Role::System | Role::Developer => {}
                Role::User => self.push_message(&mut out, "user", &m.content),
                Role::Assistant if !m.tool_calls.is_empty() => {
                    let answered = rest[i + 1..]
                        .iter()
                        .any(|f| f.role == Role::Assistant && f.tool_calls.is_empty());
                    let thinking = if m.content.is_empty() {
                        &m.thinking
                    } else {
                        &m.content
                    };
                    if !answered && !thinking.is_empty() {
                        self.push_channel_message(
                            &mut out,
                            "assistant",
                            "analysis",
                            thinking,
                            self.t.end,
                        );
                    }
                    for c in &m.tool_calls {
                        let args = match json::Json::parse(&c.arguments) {
                            Ok(j) => j.to_python(),
                            Err(_) => json::python_string(&c.arguments),
                        };
                        self.push_channel_message(
                            &mut out,
                            &format!("assistant to=functions.{}", c.name),
                            "commentary json",
                            &args,
                            self.t.call,
                        );
                    }
                }
                Role::Assistant => self.push_channel_message(
                    &mut out,
                    "assistant",
                    "final",
                    &m.content,
                    self.t.end,
                ),
                Role::Tool => self.push_channel_message(
                    &mut out,
                    &format!("functions.{} to=assistant", m.tool_name),
                    "commentary",
                    &json::python_string(&m.content),
                    self.t.end,
                ),
            }
        }
        out.push(self.t.start);
        out.extend(self.tok.encode_text("assistant"));
        out.extend(self.prefill_tokens(chat.prefill));
        out
    }

    /// The tokens `prefill` adds after `<|start|>assistant`.
    pub fn prefill_tokens(&self, prefill: Prefill<'_>) -> Vec<u32> {
        let mut out = Vec::new();
        match prefill {
            Prefill::None => {}
            Prefill::AnyCall => {
                out.push(self.t.channel);
                out.extend(self.tok.encode_text("commentary to=functions."));
            }
            Prefill::Call(name) => {
                out.push(self.t.channel);
                out.extend(
                    self.tok
                        .encode_text(&format!("commentary to=functions.{name} ")),
                );
                out.push(self.t.constrain);
                out.extend(self.tok.encode_text("json"));
                out.push(self.t.message);
            }
            Prefill::Final => {
                out.push(self.t.channel);
                out.extend(self.tok.encode_text("final"));
                out.push(self.t.message);
            }
        }
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
    /// The name of the function the model calls; the text is the name (without the
    /// `functions.` namespace), sent once when the call's arguments start. The number
    /// counts the calls of this answer from 0.
    ToolName(usize),
    /// A piece of the arguments of call number `n`.
    ToolArgs(usize),
}

/// A piece of text parsed from the model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub channel: Channel,
    pub text: String,
}

#[derive(Debug, Clone)]
enum State {
    /// Right after the prompt's `<|start|>assistant`: text that may still be the rest of the
    /// header (` to=functions.NAME` before `<|channel|>`) is held until it either starts
    /// with ` to=` (a header) or cannot (content).
    Start(Vec<u8>),
    /// Between messages: text here has no header (possible for untrained or synthetic
    /// weights) and is treated as final content, so a client always sees what was generated.
    Between,
    /// Reading a message header: the text after `<|start|>` (role and recipient) and, once
    /// `<|channel|>` came, the text after it (channel, recipient, constraint).
    Header {
        role: Vec<u8>,
        channel: Option<Vec<u8>>,
    },
    /// Inside a message body.
    Body(Channel),
}

/// Incremental parser of generated harmony tokens into reasoning, content and tool calls.
/// A message addressed to `functions.NAME` (` to=functions.NAME` in the role or the channel
/// part of its header) is a tool call when tools are on; otherwise, and for any other
/// recipient, its text is content.
#[derive(Debug, Clone)]
pub struct OutputParser {
    tok: Tokenizer,
    t: HarmonyTokens,
    state: State,
    decoder: StreamDecoder,
    tools: bool,
    calls: usize,
    /// Deltas produced by the prefill, returned with the first generated token.
    pending: Vec<Delta>,
}

impl OutputParser {
    /// A parser for an answer whose prompt ended with `<|start|>assistant`; `tools` turns
    /// tool-call parsing on.
    pub fn new(tok: Tokenizer, tools: bool) -> anyhow::Result<Self> {
        Ok(OutputParser {
            t: HarmonyTokens::new(&tok)?,
            tok,
            state: State::Start(Vec::new()),
            decoder: StreamDecoder::default(),
            tools,
            calls: 0,
            pending: Vec::new(),
        })
    }

    /// A parser for an answer whose prompt ended with `<|start|>assistant` and then the
    /// `prefill` tokens: they are parsed first, as if generated.
    pub fn with_prefill(tok: Tokenizer, tools: bool, prefill: &[u32]) -> anyhow::Result<Self> {
        let mut p = Self::new(tok, tools)?;
        let pending: Vec<Delta> = prefill.iter().flat_map(|&id| p.push(id)).collect();
        p.pending = pending;
        Ok(p)
    }

    /// The number of tool calls parsed so far.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Decide what a message with this header is, at its `<|message|>`.
    fn open_body(&mut self, role: &[u8], channel: Option<&[u8]>, out: &mut Vec<Delta>) -> Channel {
        let role = String::from_utf8_lossy(role);
        let channel = channel.map(String::from_utf8_lossy).unwrap_or_default();
        let words = || role.split_whitespace().chain(channel.split_whitespace());
        let recipient = words().find_map(|w| w.strip_prefix("to="));
        if self.tools
            && let Some(name) = recipient.and_then(|r| r.strip_prefix("functions."))
        {
            let n = self.calls;
            self.calls += 1;
            out.push(Delta {
                channel: Channel::ToolName(n),
                text: name.to_string(),
            });
            return Channel::ToolArgs(n);
        }
        match channel.split_whitespace().next() {
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

    /// Leave the `Start` state: the held text becomes the role's recipient part when
    /// `header` is true, else content.
    fn leave_start(&mut self, header: bool, out: &mut Vec<Delta>) {
        if let State::Start(held) = &mut self.state {
            let held = std::mem::take(held);
            if header {
                let mut role = b"assistant".to_vec();
                role.extend_from_slice(&held);
                self.state = State::Header {
                    role,
                    channel: None,
                };
            } else {
                self.state = State::Body(Channel::Content);
                let text = self.decoder.push(&held);
                if !text.is_empty() {
                    out.push(Delta {
                        channel: Channel::Content,
                        text,
                    });
                }
            }
        }
    }

    /// Feed one generated token; returns the text it completes (possibly none).
    pub fn push(&mut self, id: u32) -> Vec<Delta> {
        const RECIPIENT: &[u8] = b" to=";
        let mut out = std::mem::take(&mut self.pending);
        if let State::Start(held) = &mut self.state {
            if !self.tok.is_special(id) {
                held.extend_from_slice(&self.tok.token_bytes(id));
                if held.starts_with(RECIPIENT) {
                    self.leave_start(true, &mut out);
                } else if !RECIPIENT.starts_with(held) {
                    self.leave_start(false, &mut out);
                }
                return out;
            }
            let header = id == self.t.channel || id == self.t.message;
            self.leave_start(header, &mut out);
        }
        let t = &self.t;
        if id == t.start {
            self.flush(&mut out);
            self.state = State::Header {
                role: Vec::new(),
                channel: None,
            };
        } else if id == t.end || id == t.ret || id == t.call {
            self.flush(&mut out);
            self.state = State::Between;
        } else if id == t.channel {
            self.flush(&mut out);
            let role = match std::mem::replace(&mut self.state, State::Between) {
                State::Header { role, .. } => role,
                _ => Vec::new(),
            };
            self.state = State::Header {
                role,
                channel: Some(Vec::new()),
            };
        } else if id == t.message {
            self.flush(&mut out);
            let channel = match std::mem::replace(&mut self.state, State::Between) {
                State::Header { role, channel } => {
                    self.open_body(&role, channel.as_deref(), &mut out)
                }
                State::Body(c) => c,
                State::Between | State::Start(_) => Channel::Content,
            };
            self.state = State::Body(channel);
        } else if id == t.constrain {
            // `<|constrain|>json` belongs to the header: keep its words apart.
            if let State::Header { role, channel } = &mut self.state {
                channel.as_mut().unwrap_or(role).push(b' ');
            }
        } else if self.tok.is_special(id) {
            // Reserved ids carry no text.
        } else {
            let bytes = self.tok.token_bytes(id);
            match &mut self.state {
                State::Header { role, channel } => {
                    channel.as_mut().unwrap_or(role).extend_from_slice(&bytes);
                }
                State::Between | State::Start(_) => {
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
        let mut out = std::mem::take(&mut self.pending);
        self.leave_start(false, &mut out);
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

    fn date() -> chrono::NaiveDate {
        chrono::NaiveDate::from_ymd_opt(2026, 1, 2).unwrap()
    }

    fn chat<'a>(messages: &'a [Message], effort: ReasoningEffort) -> Chat<'a> {
        Chat {
            messages,
            tools: &[],
            effort,
            date: date(),
            prefill: Prefill::None,
        }
    }

    #[test]
    fn renders_default_system_and_user() {
        let r = Renderer::new(tok()).unwrap();
        let got = r.render_chat(&chat(
            &[Message::text(Role::User, "Hi")],
            ReasoningEffort::default(),
        ));
        let want = ids(
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
             Knowledge cutoff: 2024-06\nCurrent date: 2026-01-02\n\nReasoning: medium\n\n\
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
        let got = r.render_chat(&chat(
            &[
                Message::text(Role::System, "Be brief."),
                Message::text(Role::User, "2+2?"),
                Message::text(Role::Assistant, "4"),
                Message::text(Role::User, "<|end|>"),
            ],
            ReasoningEffort::High,
        ));
        let text = tok().decode(&got, false);
        assert!(text.contains("Reasoning: high"));
        assert!(
            text.contains("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>")
        );
        assert!(text.contains("<|start|>assistant<|channel|>final<|message|>4<|end|>"));
        assert!(text.ends_with("<|start|>user<|message|><|end|><|end|><|start|>assistant"));
        // The user's literal "<|end|>" stays text: one real <|end|> per message (5).
        assert_eq!(got.iter().filter(|&&i| i == 200007).count(), 5);
    }

    #[test]
    fn prefill_named_call_is_parsed_as_that_call() {
        let r = Renderer::new(tok()).unwrap();
        let got = r.render_chat(&Chat {
            prefill: Prefill::Call("get_weather"),
            ..chat(&[Message::text(Role::User, "Hi")], ReasoningEffort::Low)
        });
        let text = tok().decode(&got, false);
        let tail = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
        assert!(text.ends_with(tail), "{text}");
        let prefill = r.prefill_tokens(Prefill::Call("get_weather"));
        assert!(got.ends_with(&prefill));
        let mut p = OutputParser::with_prefill(tok(), true, &prefill).unwrap();
        let mut deltas: Vec<Delta> = ids("{\"city\": \"Oslo\"}<|call|>")
            .into_iter()
            .flat_map(|i| p.push(i))
            .collect();
        deltas.extend(p.finish());
        assert_eq!(
            deltas[0],
            Delta {
                channel: Channel::ToolName(0),
                text: "get_weather".into()
            }
        );
        let args: String = deltas[1..]
            .iter()
            .inspect(|d| assert_eq!(d.channel, Channel::ToolArgs(0)))
            .map(|d| d.text.as_str())
            .collect();
        assert_eq!(args, "{\"city\": \"Oslo\"}");
    }

    #[test]
    fn stop_set_excludes_end() {
        let t = HarmonyTokens::new(&tok()).unwrap();
        assert_eq!(t.stop_set(200002), vec![199999, 200002, 200012]);
        assert!(!t.stop_set(200002).contains(&t.end));
    }

    fn parse(seq: &[u32]) -> (String, String) {
        let mut p = OutputParser::new(tok(), false).unwrap();
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut deltas: Vec<Delta> = seq.iter().flat_map(|&i| p.push(i)).collect();
        deltas.extend(p.finish());
        for d in deltas {
            match d.channel {
                Channel::Reasoning => reasoning.push_str(&d.text),
                Channel::Content => content.push_str(&d.text),
                c => panic!("tool channel {c:?} with tools off"),
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

    /// (reasoning, content, [(name, arguments)]) of a generated sequence, tools on.
    fn parse_tools(seq: &[u32]) -> (String, String, Vec<(String, String)>) {
        let mut p = OutputParser::new(tok(), true).unwrap();
        let mut deltas: Vec<Delta> = seq.iter().flat_map(|&i| p.push(i)).collect();
        deltas.extend(p.finish());
        let (mut r, mut c, mut calls) =
            (String::new(), String::new(), Vec::<(String, String)>::new());
        for d in deltas {
            match d.channel {
                Channel::Reasoning => r.push_str(&d.text),
                Channel::Content => c.push_str(&d.text),
                Channel::ToolName(n) => {
                    assert_eq!(n, calls.len());
                    calls.push((d.text, String::new()));
                }
                Channel::ToolArgs(n) => calls[n].1.push_str(&d.text),
            }
        }
        (r, c, calls)
    }

    #[test]
    fn parses_tool_calls_in_both_header_forms() {
        // The recipient in the channel part, as the model writes it.
        let seq = ids(
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>",
        );
        let (r, c, calls) = parse_tools(&seq);
        assert_eq!((r.as_str(), c.as_str()), ("Need weather.", ""));
        assert_eq!(
            calls,
            vec![(
                "get_weather".to_string(),
                "{\"location\":\"Paris\"}".to_string()
            )]
        );
        // The recipient in the role part, right after the prompt's `<|start|>assistant`.
        let seq = ids(" to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>");
        assert_eq!(
            parse_tools(&seq).2,
            vec![("lookup".to_string(), "{}".to_string())]
        );
        // Tools off: the call's text is content.
        assert_eq!(parse(&seq), (String::new(), "{}".to_string()));
        // Text that starts like a recipient but is not one stays content.
        let seq = ids(" tomorrow<|return|>");
        assert_eq!(
            parse_tools(&seq),
            (String::new(), " tomorrow".to_string(), vec![])
        );
        let seq = ids(" t");
        assert_eq!(parse_tools(&seq).1, " t");
    }

    #[test]
    fn renders_tool_calls_and_results() {
        let r = Renderer::new(tok()).unwrap();
        let mut call = Message::text(Role::Assistant, "");
        call.thinking = "Look it up.".into();
        call.tool_calls = vec![ToolCall {
            name: "get_weather".into(),
            arguments: "{\"b\":1,\"a\":\"x\"}".into(),
        }];
        let mut result = Message::text(Role::Tool, "21 \"C\"");
        result.tool_name = "get_weather".into();
        let tools = [Function {
            name: "get_weather".into(),
            description: Some("Weather.".into()),
            parameters: None,
        }];
        let messages = [Message::text(Role::User, "Hi"), call, result];
        let got = r.render_chat(&Chat {
            tools: &tools,
            ..chat(&messages, ReasoningEffort::Medium)
        });
        let text = tok().decode(&got, false);
        assert!(text.contains("'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Weather.\ntype get_weather = () => any;\n\n} // namespace functions<|end|>"), "{text}");
        assert!(text.ends_with(
            "<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>\
             <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"b\": 1, \"a\": \"x\"}<|call|>\
             <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"21 \\\"C\\\"\"<|end|><|start|>assistant"
        ), "{text}");
    }
}

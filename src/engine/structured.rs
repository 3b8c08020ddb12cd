//! Structured output: a JSON schema enforced token by token with llguidance.
//!
//! The server compiles a request's `response_format` into a [`Grammar`] once; every
//! sequence of the request starts its own [`Constraint`] from it. Each step the constraint
//! says which token ids may come next (a mask over the whole vocabulary), the sampler sets
//! every other logit to −∞ before it chooses, and the chosen token advances the
//! constraint. This runs on the host, in [`crate::engine::sampling::Sampler`], so the CPU
//! and CUDA backends enforce it the same way (CUDA downloads a constrained row's logits,
//! as it does for `logit_bias`).

use crate::engine::harmony::{Channel, OutputParser};
use crate::engine::tokenizer::Tokenizer;
use anyhow::Context;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

/// The engine's vocabulary as llguidance sees it: every id's bytes, control tokens marked
/// so no grammar text can match them, and every token that may end a constrained answer
/// (a final message's or a tool call's) as its EOS set.
struct Vocabulary {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own (canonical) tokenization of text llguidance forces, so a forced
    /// piece of JSON is written in the tokens the model was trained on.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tok.encode_text(text),
            // Bytes that end inside a character: no BPE of ours covers them, so the
            // longest-match split of the trie.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// What a server needs to turn JSON schemas into constraints: llguidance's parser factory
/// over the engine's vocabulary. Built once per server (it indexes the whole vocabulary).
pub struct StructuredOutput {
    factory: ParserFactory,
    /// The tokens that end a final answer.
    answer_ends: Arc<[u32]>,
    /// The harmony tokens of a tool call's header and end.
    call: CallTokens,
    /// A harmony parser of an answer at its start, for strict calls under `auto`.
    parser: OutputParser,
}

/// The harmony control tokens a tool call is written with: `<|constrain|>` and
/// `<|message|>` in its header, `<|call|>` at its end.
#[derive(Debug, Clone, Copy)]
pub struct CallTokens {
    pub constrain: u32,
    pub message: u32,
    pub call: u32,
}

/// One function a tool call may name: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSchema {
    pub name: String,
    pub parameters: Value,
}

impl std::fmt::Debug for StructuredOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StructuredOutput")
    }
}

impl StructuredOutput {
    /// A factory over ids `0..vocab_size` of `tok` (the model's size, from its config: ids
    /// the tokenizer does not know get no bytes and are never allowed). `answer_ends` are
    /// the tokens that may end a constrained final answer, `call.call` the one that ends a
    /// tool call's arguments; a grammar allows its ends only where the JSON is complete.
    pub fn new(
        tok: Tokenizer,
        vocab_size: usize,
        answer_ends: &[u32],
        call: CallTokens,
    ) -> anyhow::Result<Self> {
        let vocab = u32::try_from(vocab_size).context("the vocabulary is too large")?;
        let parser = OutputParser::new(tok, true)?;
        let answer_ends: Vec<u32> = answer_ends
            .iter()
            .copied()
            .filter(|&t| t < vocab && t != call.call)
            .collect();
        let Some(&first_end) = answer_ends.first() else {
            anyhow::bail!(
                "none of the end tokens is inside the model's vocabulary of {vocab_size}: \
                 a constrained answer could never end"
            );
        };
        anyhow::ensure!(
            [call.constrain, call.message, call.call]
                .iter()
                .all(|&t| t < vocab),
            "the harmony call tokens are outside the model's vocabulary of {vocab_size}"
        );
        let mut ends = answer_ends.clone();
        ends.push(call.call);
        let words: Vec<Vec<u8>> = (0..vocab)
            .map(|id| {
                let bytes = tok.token_bytes(id);
                if tok.is_special(id) && !bytes.is_empty() {
                    // llguidance's marker for a special token: it never matches text.
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(&bytes);
                    marked
                } else {
                    bytes
                }
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(vocab, first_end), &words).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(Vocabulary { trie, tok });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| anyhow::anyhow!("building the structured-output index: {e}"))?;
        // Errors come back as values; nothing is printed.
        factory.quiet();
        Ok(StructuredOutput {
            factory,
            answer_ends: answer_ends.into(),
            call,
            parser,
        })
    }

    /// Compile `schema` (a JSON schema object) into the grammar of a final answer. The JSON
    /// is compact (no whitespace between tokens of the syntax), which keeps a model from
    /// writing spaces without end. The error says what llguidance could not accept.
    pub fn compile(&self, schema: &Value) -> Result<Grammar, String> {
        let schema = compact(schema)?;
        self.grammar(
            TopLevelGrammar::from_json_schema(schema),
            self.answer_ends.clone(),
        )
    }

    /// The grammar of a final answer that matches the regular expression `rx` as a whole
    /// (`structured_outputs.regex`, or `choice` as an alternation of literals), then ends as
    /// a structured answer does.
    pub fn compile_regex(&self, rx: &str) -> Result<Grammar, String> {
        self.grammar(TopLevelGrammar::from_regex(rx), self.answer_ends.clone())
    }

    /// The grammar of a tool call's arguments, after a header that names the function:
    /// JSON following `parameters` (compact, as in [`Self::compile`]), ended by `<|call|>`.
    pub fn compile_arguments(&self, parameters: &Value) -> Result<Grammar, String> {
        let schema = compact(parameters)?;
        self.grammar(
            TopLevelGrammar::from_json_schema(schema),
            Arc::new([self.call.call]),
        )
    }

    /// The grammar of a call of any of `functions`, after a prompt that ends with
    /// `to=functions.`: a function's name, the rest of the header (` <|constrain|>json
    /// <|message|>`, as a named call's prefill writes it), that function's arguments, and
    /// `<|call|>`. `Err((Some(i), why))` names the function whose schema llguidance refused;
    /// `Err((None, why))` is a grammar of ours that llguidance refused (a bug here).
    pub fn compile_any_call(
        &self,
        functions: &[CallSchema],
    ) -> Result<Grammar, (Option<usize>, String)> {
        let mut lark = String::from("start: ");
        let alternatives: Vec<String> = (0..functions.len()).map(|i| format!("call_{i}")).collect();
        lark.push_str(&alternatives.join(" | "));
        lark.push('\n');
        for (i, f) in functions.iter().enumerate() {
            // Each schema alone first, so a refusal names its function.
            let schema = compact(&f.parameters).map_err(|e| (Some(i), e))?;
            self.compile_arguments(&f.parameters)
                .map_err(|e| (Some(i), e))?;
            // Names are [A-Za-z0-9_-] (checked by the server), safe inside a literal.
            lark.push_str(&format!(
                "call_{i}: \"{name} \" <[{constrain}]> \"json\" <[{message}]> %json {schema}\n",
                name = f.name,
                constrain = self.call.constrain,
                message = self.call.message,
            ));
        }
        self.grammar(TopLevelGrammar::from_lark(lark), Arc::new([self.call.call]))
            .map_err(|e| (None, e))
    }

    /// The grammar of an answer under `tool_choice: "auto"` whose `functions` are strict:
    /// the answer is free until it opens a call of one of them (as the response's harmony
    /// parser reads the header, so both agree on what a call is); from that call's
    /// `<|message|>`, its arguments follow the function's schema as in
    /// [`Self::compile_arguments`], ended by `<|call|>`. `Err((i, why))` names the function
    /// whose schema llguidance refused.
    pub fn compile_strict_calls(
        &self,
        functions: &[CallSchema],
    ) -> Result<Grammar, (usize, String)> {
        let functions = functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let schema = compact(&f.parameters).map_err(|e| (i, e))?;
                let arguments = self
                    .compiled(
                        TopLevelGrammar::from_json_schema(schema),
                        Arc::new([self.call.call]),
                    )
                    .map_err(|e| (i, e))?;
                Ok(StrictFunction {
                    name: f.name.clone(),
                    arguments,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Grammar {
            kind: Kind::StrictCalls {
                parser: self.parser.clone(),
                functions: functions.into(),
            },
        })
    }

    fn grammar(&self, top: TopLevelGrammar, ends: Arc<[u32]>) -> Result<Grammar, String> {
        Ok(Grammar {
            kind: Kind::Whole(Box::new(self.compiled(top, ends)?)),
        })
    }

    fn compiled(&self, top: TopLevelGrammar, ends: Arc<[u32]>) -> Result<Compiled, String> {
        let parser = self.factory.create_parser(top).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        let trie = self.factory.tok_env().tok_trie();
        // The factory's EOS set holds every end; this grammar may use only its own.
        let other_ends = trie
            .eos_tokens()
            .iter()
            .copied()
            .filter(|t| !ends.contains(t))
            .collect();
        Ok(Compiled {
            start: matcher,
            vocab_size: trie.vocab_size(),
            ends,
            other_ends,
        })
    }
}

/// `schema` with this server's JSON options: no whitespace between the tokens of the syntax.
fn compact(schema: &Value) -> Result<Value, String> {
    let mut schema = schema.clone();
    let Some(obj) = schema.as_object_mut() else {
        return Err("the schema must be a JSON object".into());
    };
    if obj.contains_key("x-guidance") {
        return Err("the schema key `x-guidance` is reserved by this server".into());
    }
    obj.insert(
        "x-guidance".into(),
        serde_json::json!({"whitespace_flexible": false}),
    );
    Ok(schema)
}

/// A compiled grammar, at its start: each sequence that uses it clones it into a
/// [`Constraint`] of its own.
pub struct Grammar {
    kind: Kind,
}

enum Kind {
    /// The answer follows the grammar from its first token.
    Whole(Box<Compiled>),
    /// The answer is free, except the arguments of a call of one of these functions (see
    /// [`StructuredOutput::compile_strict_calls`]); `parser` is a fresh harmony parser of
    /// the answer, which says when such a call opens.
    StrictCalls {
        parser: OutputParser,
        functions: Arc<[StrictFunction]>,
    },
}

/// One llguidance grammar at its start, and the tokens that may end its text.
struct Compiled {
    start: Matcher,
    vocab_size: usize,
    /// The tokens that end this grammar's text.
    ends: Arc<[u32]>,
    /// The factory's other ends (a final answer's for a call, and the reverse): never
    /// allowed.
    other_ends: Arc<[u32]>,
}

/// A function with `strict: true`, offered under `tool_choice: "auto"`.
struct StrictFunction {
    name: String,
    arguments: Compiled,
}

impl Compiled {
    fn start(&self) -> Matching {
        Matching {
            matcher: self.start.deep_clone(),
            vocab_size: self.vocab_size,
            ends: self.ends.clone(),
            other_ends: self.other_ends.clone(),
            failed: false,
        }
    }
}

impl Grammar {
    /// A constraint at the start of the grammar, for one sequence.
    pub fn start(&self) -> Constraint {
        match &self.kind {
            Kind::Whole(c) => Constraint {
                matching: Some(c.start()),
                watch: None,
            },
            Kind::StrictCalls { parser, functions } => Constraint {
                matching: None,
                watch: Some(Watch {
                    parser: parser.clone(),
                    functions: functions.clone(),
                }),
            },
        }
    }
}

/// Two grammars are equal when they are the same compiled grammar.
impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

/// One sequence's place in its grammar.
pub struct Constraint {
    /// The grammar the next token must follow, if any: the whole answer's, or the
    /// arguments' of a strict call the answer opened.
    matching: Option<Matching>,
    /// For strict calls: where the answer is, to start the arguments' grammar when a call
    /// of a strict function opens.
    watch: Option<Watch>,
}

/// The answer so far, read as the response reads it, and the functions whose calls are
/// constrained.
struct Watch {
    parser: OutputParser,
    functions: Arc<[StrictFunction]>,
}

/// A place inside one llguidance grammar.
struct Matching {
    matcher: Matcher,
    vocab_size: usize,
    /// The tokens that end the answer.
    ends: Arc<[u32]>,
    /// Ends of other grammars, taken out of every mask.
    other_ends: Arc<[u32]>,
    /// llguidance reported an error; the sequence may only end from here.
    failed: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("matching", &self.matching.is_some())
            .field("failed", &self.matching.as_ref().is_some_and(|m| m.failed))
            .finish_non_exhaustive()
    }
}

/// The token ids a constraint allows next.
#[derive(Debug)]
pub struct Allowed(SimpleVob);

impl Allowed {
    /// Whether `token` may come next.
    pub fn contains(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    /// Set the logit of every token that may not come next to −∞ (`logits` has one entry
    /// per id of the vocabulary).
    pub fn mask(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.contains(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Whether every allowed token is one of `ids`.
    pub fn is_within(&self, ids: &[u32]) -> bool {
        self.0.num_set() <= ids.len() && self.ids().iter().all(|t| ids.contains(t))
    }

    /// The allowed ids, in order.
    pub fn ids(&self) -> Vec<u32> {
        self.0.to_list()
    }
}

impl Constraint {
    /// The tokens that may come next, or `None` where the answer is free (outside a strict
    /// call's arguments).
    pub fn allowed(&mut self) -> Option<Allowed> {
        self.matching.as_mut().map(Matching::allowed)
    }

    /// Advance past the token the sampler chose.
    pub fn commit(&mut self, token: u32) {
        if let Some(m) = &mut self.matching {
            m.commit(token);
        }
        let Some(w) = &mut self.watch else {
            return;
        };
        // A strict call's end hands the answer back to the model (it goes on past
        // `<|call|>` only with `ignore_eos`).
        if self
            .matching
            .as_ref()
            .is_some_and(|m| m.ends.contains(&token))
        {
            self.matching = None;
        }
        for d in w.parser.push(token) {
            if let Channel::ToolName(_) = d.channel {
                self.matching = w
                    .functions
                    .iter()
                    .find(|f| f.name == d.text)
                    .map(|f| f.arguments.start());
            }
        }
    }

    /// Whether the text so far is a complete value of the grammar (false where the answer
    /// is free).
    pub fn is_accepting(&mut self) -> bool {
        self.matching.as_mut().is_some_and(Matching::is_accepting)
    }
}

impl Matching {
    /// The tokens that may come next: what keeps the JSON valid, or only the end tokens
    /// once it is complete. After an llguidance error (its limits, say), only the end
    /// tokens, so the answer ends instead of leaving the grammar.
    fn allowed(&mut self) -> Allowed {
        if !self.failed {
            match self.matcher.compute_mask_or_eos() {
                Ok(mut m) => {
                    for &t in self.other_ends.iter() {
                        m.disallow_token(t);
                    }
                    return Allowed(m);
                }
                Err(e) => self.fail(&e.to_string()),
            }
        }
        let mut m = SimpleVob::alloc(self.vocab_size);
        for &t in self.ends.iter() {
            m.allow_token(t);
        }
        Allowed(m)
    }

    fn commit(&mut self, token: u32) {
        if self.failed || self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.fail(&e.to_string());
        }
    }

    fn is_accepting(&mut self) -> bool {
        !self.failed && self.matcher.is_accepting().unwrap_or(false)
    }

    fn fail(&mut self, why: &str) {
        self.failed = true;
        crate::errln!(
            "mxtune serve: warning: structured output stopped following its schema ({why}); \
             the answer ends here"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::harmony::HarmonyTokens;
    use crate::engine::sampling::{Sampler, SamplingParams};
    use std::sync::LazyLock;

    const VOCAB: usize = 201_088;

    fn tok() -> Tokenizer {
        Tokenizer::o200k_harmony()
    }

    fn ret() -> u32 {
        HarmonyTokens::new(&tok()).unwrap().ret
    }

    fn call_tokens() -> CallTokens {
        let h = HarmonyTokens::new(&tok()).unwrap();
        CallTokens {
            constrain: h.constrain,
            message: h.message,
            call: h.call,
        }
    }

    static SO: LazyLock<StructuredOutput> =
        LazyLock::new(|| StructuredOutput::new(tok(), VOCAB, &[ret()], call_tokens()).unwrap());

    /// Sample from `g` with logits that favour `hello`, `<|return|>` and `<|end|>` above
    /// everything a grammar allows, until an end token or `limit` tokens.
    fn sample_against_the_grain(g: Grammar, temperature: f32, seed: u64, limit: usize) -> Vec<u32> {
        let t = tok();
        let mut s = Sampler::new(SamplingParams {
            temperature,
            seed: Some(seed),
            grammar: Some(Arc::new(g)),
            ..Default::default()
        });
        let mut logits: Vec<f32> = (0..VOCAB).map(|i| (i % 89) as f32 * 0.01).collect();
        for id in t.encode_text("hello") {
            logits[id as usize] = 50.0;
        }
        logits[ret() as usize] = 60.0;
        logits[t.special_id("<|end|>").unwrap() as usize] = 60.0;
        let mut out = Vec::new();
        for _ in 0..limit {
            let id = s.sample(&logits, &[]).token;
            out.push(id);
            if id == ret() || id == call_tokens().call {
                break;
            }
        }
        out
    }

    #[test]
    fn arguments_follow_their_schema_and_end_with_call() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["city", "days"], "additionalProperties": false
        });
        for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.5, 2)] {
            let out = sample_against_the_grain(
                SO.compile_arguments(&schema).unwrap(),
                temperature,
                seed,
                40,
            );
            let (last, args) = out.split_last().unwrap();
            assert_eq!(*last, call_tokens().call, "T={temperature}: {out:?}");
            let text = tok().decode(args, false);
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(
                ["Paris", "Oslo"].contains(&v["city"].as_str().unwrap()),
                "{text}"
            );
            assert!((1..=9).contains(&v["days"].as_u64().unwrap()), "{text}");
        }
        // A final answer's grammar never ends with `<|call|>`, a call's never with `<|return|>`.
        let mut answer = SO
            .compile(&serde_json::json!({"const": 1}))
            .unwrap()
            .start();
        answer.commit(tok().encode_text("1")[0]);
        assert_eq!(answer.allowed().unwrap().ids(), vec![ret()]);
        let mut args = SO
            .compile_arguments(&serde_json::json!({"const": 1}))
            .unwrap()
            .start();
        args.commit(tok().encode_text("1")[0]);
        assert_eq!(args.allowed().unwrap().ids(), vec![call_tokens().call]);
    }

    #[test]
    fn any_call_names_an_offered_function_then_follows_its_schema() {
        let functions = [
            CallSchema {
                name: "get".into(),
                parameters: serde_json::json!({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"], "additionalProperties": false}),
            },
            CallSchema {
                name: "get_weather".into(),
                parameters: serde_json::json!({"type": "object", "properties": {"n": {"enum": [3, 4]}}, "required": ["n"], "additionalProperties": false}),
            },
        ];
        let t = tok();
        for seed in 0..6 {
            let g = SO.compile_any_call(&functions).unwrap();
            let out = sample_against_the_grain(g, 1.5, seed, 60);
            let text = t.decode(&out, false);
            let (name, rest) = text
                .split_once(" <|constrain|>json<|message|>")
                .unwrap_or_else(|| panic!("{text}"));
            let args = rest
                .strip_suffix("<|call|>")
                .unwrap_or_else(|| panic!("{text}"));
            let v: serde_json::Value =
                serde_json::from_str(args).unwrap_or_else(|e| panic!("{text}: {e}"));
            match name {
                "get" => assert!(
                    v["k"].is_boolean() && v.as_object().unwrap().len() == 1,
                    "{text}"
                ),
                "get_weather" => assert!(
                    [3, 4].contains(&v["n"].as_u64().unwrap()) && v.as_object().unwrap().len() == 1,
                    "{text}"
                ),
                other => panic!("{other:?} was never offered: {text}"),
            }
        }
        // A schema llguidance refuses is named by its index.
        let mut bad = functions.to_vec();
        bad[1].parameters = serde_json::json!({"type": "banana"});
        assert_eq!(
            SO.compile_any_call(&bad).err().map(|(i, _)| i),
            Some(Some(1))
        );
    }

    #[test]
    fn strict_calls_are_free_until_a_strict_function_is_called() {
        let t = tok();
        let ids = |text: &str| t.encode_with_specials(text).unwrap();
        let functions = [CallSchema {
            name: "get_weather".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": false}),
        }];
        let g = Arc::new(SO.compile_strict_calls(&functions).unwrap());
        // A final answer, and a call of a function that is not strict: never constrained.
        for text in [
            "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
            "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{\"q\": 1}<|call|>",
        ] {
            let mut c = g.start();
            for id in ids(text) {
                assert!(c.allowed().is_none(), "{text}");
                c.commit(id);
            }
        }
        // Both places of the recipient, also after an analysis message: from `<|message|>`
        // the arguments follow the schema, whatever the logits prefer, up to `<|call|>`.
        for (seed, header) in [
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
            " to=functions.get_weather<|channel|>commentary json<|message|>",
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
        ]
        .into_iter()
        .enumerate()
        {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                seed: Some(seed as u64),
                grammar: Some(g.clone()),
                ..Default::default()
            });
            for id in ids(header) {
                let mut forced = vec![0.0f32; VOCAB];
                forced[id as usize] = 100.0;
                assert_eq!(s.sample(&forced, &[]).token, id, "{header}");
            }
            let mut logits: Vec<f32> = (0..VOCAB).map(|i| (i % 89) as f32 * 0.01).collect();
            for id in t.encode_text("hello") {
                logits[id as usize] = 50.0;
            }
            logits[ret() as usize] = 60.0;
            let mut args = Vec::new();
            for _ in 0..40 {
                let id = s.sample(&logits, &[]).token;
                if id == call_tokens().call {
                    break;
                }
                args.push(id);
            }
            let text = t.decode(&args, false);
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{header}: {text}: {e}"));
            assert!(
                ["Paris", "Oslo"].contains(&v["city"].as_str().unwrap_or_default())
                    && v.as_object().unwrap().len() == 1,
                "{header}: {text}"
            );
        }
        // After the call's end (generation goes on only with ignore_eos) the answer is free.
        let mut c = g.start();
        for id in ids(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}",
        ) {
            c.commit(id);
        }
        assert_eq!(c.allowed().unwrap().ids(), vec![call_tokens().call]);
        c.commit(call_tokens().call);
        assert!(c.allowed().is_none());
        // A schema llguidance refuses is named by its index.
        let bad = [
            functions[0].clone(),
            CallSchema {
                name: "b".into(),
                parameters: serde_json::json!({"type": "banana"}),
            },
        ];
        assert_eq!(SO.compile_strict_calls(&bad).err().map(|(i, _)| i), Some(1));
    }

    #[test]
    fn the_mask_follows_a_tiny_grammar_and_then_allows_only_the_end() {
        let g = SO
            .compile(&serde_json::json!({"enum": ["yes", "no"]}))
            .unwrap();
        let words = [b"\"yes\"".as_slice(), b"\"no\"".as_slice()];
        let t = tok();
        // Walk the grammar taking the longest allowed token each step.
        let mut c = g.start();
        let mut text: Vec<u8> = Vec::new();
        for _ in 0..8 {
            let a = c.allowed().unwrap();
            let ids = a.ids();
            assert!(!ids.is_empty());
            if words.contains(&text.as_slice()) {
                assert_eq!(ids, vec![ret()], "a complete value allows only the end");
                assert!(c.is_accepting());
                return;
            }
            assert!(
                !a.contains(ret()),
                "the end came before the value was complete"
            );
            assert!(!a.contains(t.special_id("<|end|>").unwrap()));
            for &id in &ids {
                let mut next = text.clone();
                next.extend(t.token_bytes(id));
                assert!(
                    words.iter().any(|w| w.starts_with(&next)),
                    "{:?} allowed after {:?}",
                    t.token_text(id),
                    String::from_utf8_lossy(&text)
                );
            }
            let best = *ids
                .iter()
                .max_by_key(|&&id| t.token_bytes(id).len())
                .unwrap();
            text.extend(t.token_bytes(best));
            c.commit(best);
        }
        panic!(
            "the value never completed: {:?}",
            String::from_utf8_lossy(&text)
        );
    }

    #[test]
    fn the_sampler_never_leaves_the_grammar_whatever_the_logits_prefer() {
        let g = Arc::new(
            SO.compile(&serde_json::json!({
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["n"], "additionalProperties": false
            }))
            .unwrap(),
        );
        let t = tok();
        // Three sequences on one compiled grammar (the `n` choices of a request), stepped in
        // turn: each keeps its own place in it.
        let mut samplers: Vec<(f32, Sampler)> = [(0.0, 1), (1.0, 2), (1.5, 3)]
            .into_iter()
            .map(|(temperature, seed)| {
                let p = SamplingParams {
                    temperature,
                    seed: Some(seed),
                    grammar: Some(g.clone()),
                    ..Default::default()
                };
                // The CUDA backend samples such rows on the host, where the grammar lives.
                assert!(p.needs_host_logits());
                (temperature, Sampler::new(p))
            })
            .collect();
        // Logits that favour `hello` and the end above everything the grammar allows.
        let mut logits: Vec<f32> = (0..VOCAB).map(|i| (i % 97) as f32 * 0.01).collect();
        for id in t.encode_text("hello") {
            logits[id as usize] = 50.0;
        }
        logits[ret() as usize] = 60.0;
        let mut outs = vec![(Vec::new(), false); samplers.len()];
        for _ in 0..20 {
            for ((_, s), (out, ended)) in samplers.iter_mut().zip(outs.iter_mut()) {
                if *ended {
                    continue;
                }
                let id = s.sample(&logits, &[]).token;
                if id == ret() {
                    *ended = true;
                } else {
                    out.push(id);
                }
            }
        }
        for ((temperature, _), (out, ended)) in samplers.iter().zip(&outs) {
            let text = t.decode(out, false);
            assert!(ended, "T={temperature}: {text:?} never ended");
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("T={temperature}: {text:?} is not JSON: {e}"));
            let n = v["n"].as_u64().unwrap_or_else(|| panic!("{text}"));
            assert!(n <= 99 && v.as_object().unwrap().len() == 1, "{text}");
        }
    }

    #[test]
    fn a_ban_on_the_end_gives_way_once_the_value_is_complete() {
        let g = Arc::new(SO.compile(&serde_json::json!({"const": 7})).unwrap());
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            grammar: Some(g),
            ..Default::default()
        });
        let logits = vec![0.0f32; VOCAB];
        // `min_tokens` bans the end: the grammar allows `7`, then only the end.
        assert_eq!(
            tok().decode(&[s.sample(&logits, &[ret()]).token], false),
            "7"
        );
        assert_eq!(s.sample(&logits, &[ret()]).token, ret());
    }

    #[test]
    fn schemas_llguidance_cannot_enforce_are_errors() {
        let unsatisfiable = serde_json::json!({
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
            "required": ["a"]
        });
        assert!(SO.compile(&unsatisfiable).is_err());
        assert!(SO.compile(&serde_json::json!({"type": "banana"})).is_err());
        assert!(SO.compile(&serde_json::json!([1])).is_err());
        assert!(SO.compile(&serde_json::json!({"x-guidance": {}})).is_err());
    }
}

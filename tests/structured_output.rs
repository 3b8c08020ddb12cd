//! Structured output (`response_format`) over real HTTP on 127.0.0.1, against the synthetic
//! tiny model (random weights, the real vocabulary) on the CPU: whatever the weights prefer,
//! the answer must follow the schema.

#[allow(dead_code)]
mod engine_server_support;

use engine_server_support::{TestServer, has_python_openai, python, sse_data, tiny_cpu_server};
use serde_json::{Value, json};

async fn tiny_server() -> TestServer {
    tiny_cpu_server(8, 512, 1024, false).await
}

async fn chat(s: &TestServer, body: Value) -> (u16, Value) {
    post(s, "/v1/chat/completions", body).await
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn request(format: &Value, temperature: f64, seed: u64, max_tokens: usize) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "response_format": format,
        "temperature": temperature,
        "seed": seed,
        "max_tokens": max_tokens,
        "return_token_ids": true,
    })
}

fn json_schema(name: &str, schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": true}})
}

/// Checks `v` against the part of JSON schema the tests use: `type`, `properties`,
/// `required`, `additionalProperties: false`, `enum`, `items`, `minItems`, `maxItems`,
/// `minLength`, `maxLength`, `minimum`, `maximum`. An unknown keyword fails, so a schema the
/// checker cannot read is never passed by accident.
fn validate(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let s = schema
        .as_object()
        .ok_or(format!("{at}: schema is not an object"))?;
    for key in s.keys() {
        let known = [
            "type",
            "properties",
            "required",
            "additionalProperties",
            "enum",
            "items",
            "minItems",
            "maxItems",
            "minLength",
            "maxLength",
            "minimum",
            "maximum",
        ];
        if !known.contains(&key.as_str()) {
            return Err(format!("{at}: the checker does not know `{key}`"));
        }
    }
    let fail = |what: String| Err(format!("{at}: {what}, got {v}"));
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            other => return fail(format!("unknown type {other}")),
        };
        if !ok {
            return fail(format!("not of type {t}"));
        }
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        return fail(format!("not one of {options:?}"));
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !o.contains_key(r) {
                return fail(format!("required `{r}` missing"));
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => validate(sub, x, &format!("{at}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return fail(format!("`{k}` is not a listed property"));
                }
                None => {}
            }
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return fail("item count out of bounds".into());
        }
        if let Some(items) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                validate(items, x, &format!("{at}[{i}]"))?;
            }
        }
    }
    if let Some(text) = v.as_str() {
        let n = text.chars().count() as u64;
        if s.get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return fail("length out of bounds".into());
        }
    }
    if let Some(x) = v.as_f64()
        && (s
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| x < m)
            || s.get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|m| x > m))
    {
        return fail("number out of bounds".into());
    }
    Ok(())
}

#[test]
fn the_checker_refuses_what_breaks_a_schema() {
    let s = person();
    let good = json!({"name": "Ada", "age": 36, "color": "red", "tags": ["a"], "email": null});
    assert_eq!(validate(&s, &good, "$"), Ok(()));
    for bad in [
        json!({"name": "Ada", "age": 36, "color": "red", "tags": ["a"]}),
        json!({"name": "Ada", "age": 36.5, "color": "red", "tags": [], "email": null}),
        json!({"name": "Ada", "age": 36, "color": "pink", "tags": [], "email": null}),
        json!({"name": "Ada", "age": 36, "color": "red", "tags": [1], "email": null}),
        json!({"name": "Ada", "age": 200, "color": "red", "tags": [], "email": null}),
        json!({"name": "Ada", "age": 1, "color": "red", "tags": [], "email": null, "x": 1}),
        json!({"name": "Ada Lovelace, Countess", "age": 1, "color": "red", "tags": [], "email": null}),
        json!(["Ada"]),
    ] {
        assert!(validate(&s, &bad, "$").is_err(), "{bad}");
    }
}

/// An object with required string, integer, enum, array and nullable fields. Every string,
/// number and array is bounded, so every answer ends within the test's `max_tokens` (320:
/// room for every character a `\uXXXX` escape of several tokens).
fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "email": {"type": "null"},
        },
        "required": ["name", "age", "color", "tags", "email"],
        "additionalProperties": false,
    })
}

fn nested() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "owner": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "active": {"type": "boolean"},
                    "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                               "minItems": 1, "maxItems": 4},
                },
                "required": ["name", "active", "scores"],
                "additionalProperties": false,
            },
        },
        "required": ["id", "owner"],
        "additionalProperties": false,
    })
}

fn list() -> Value {
    json!({"type": "array", "items": {"enum": ["low", "mid", "high"]}, "minItems": 2, "maxItems": 5})
}

/// The settings every schema is tried with: greedy and three seeded temperatures.
const SETTINGS: [(f64, u64); 4] = [(0.0, 0), (0.7, 1), (1.0, 2), (1.5, 3)];

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_follows_its_schema_at_any_temperature() {
    let s = tiny_server().await;
    let mut jobs = Vec::new();
    for (name, schema) in [("person", person()), ("nested", nested()), ("list", list())] {
        for (temperature, seed) in SETTINGS {
            let body = request(&json_schema(name, &schema), temperature, seed, 320);
            let base = s.base.clone();
            jobs.push((
                name,
                schema.clone(),
                temperature,
                seed,
                tokio::spawn(async move {
                    let r = reqwest::Client::new()
                        .post(format!("{base}/v1/chat/completions"))
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    (r.status().as_u16(), r.json::<Value>().await.unwrap())
                }),
            ));
        }
    }
    let mut answers = std::collections::HashSet::new();
    for (name, schema, temperature, seed, job) in jobs {
        let (status, v) = job.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        let content = choice["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        let what = format!("{name} at T={temperature} seed {seed}: {content:?}");
        assert_eq!(choice["finish_reason"], "stop", "{what}");
        let value: Value =
            serde_json::from_str(content).unwrap_or_else(|e| panic!("{what} is not JSON: {e}"));
        if let Err(e) = validate(&schema, &value, "$") {
            panic!("{what} breaks the schema: {e}");
        }
        // The answer was the final channel from its first token: no reasoning.
        assert!(choice["message"]["reasoning_content"].is_null(), "{v}");
        answers.insert(content.to_string());
    }
    // The weights and the seeds still choose: not every answer of a schema is the same.
    assert!(answers.len() > 3, "{answers:?}");
}

/// The shortest way to finish a cut-off JSON text: close the open string (a key gets a
/// `null` value), finish a partial literal or number, fill a dangling `:` or `,`, and close
/// every open object and array. Text no JSON starts with stays unparseable.
fn complete_json(prefix: &str) -> String {
    let mut out = prefix.to_string();
    let mut stack = Vec::new();
    let (mut in_string, mut escape, mut is_key) = (false, false, false);
    // What the last complete piece outside strings was: `{`, `[`, `k` (a key), `:`, `,`, `v`.
    let mut last = ' ';
    for c in prefix.chars() {
        if in_string {
            match (escape, c) {
                (true, _) => escape = false,
                (false, '\\') => escape = true,
                (false, '"') => {
                    in_string = false;
                    last = if is_key { 'k' } else { 'v' };
                }
                _ => {}
            }
            continue;
        }
        match c {
            '{' | '[' => {
                stack.push(c);
                last = c;
            }
            '}' | ']' => {
                stack.pop();
                last = 'v';
            }
            '"' => {
                in_string = true;
                is_key = stack.last() == Some(&'{') && matches!(last, '{' | ',');
            }
            ':' | ',' => last = c,
            c if !c.is_whitespace() => last = 'v',
            _ => {}
        }
    }
    if in_string {
        if escape {
            out.push('n');
        }
        out.push('"');
        last = if is_key { 'k' } else { 'v' };
    } else {
        // A literal or number cut off inside: the run of characters after the last
        // structural character.
        let tail: String = out
            .chars()
            .rev()
            .take_while(|c| !matches!(c, '{' | '[' | ':' | ',') && !c.is_whitespace())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let literal = ["true", "false", "null"]
            .into_iter()
            .find(|w| !tail.is_empty() && w.starts_with(&tail));
        if let Some(whole) = literal {
            out.push_str(&whole[tail.len()..]);
        } else if tail.starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'])
            && tail.ends_with(['-', '.', 'e', 'E', '+'])
        {
            out.push('0');
        }
    }
    match last {
        'k' => out.push_str(":null"),
        ':' => out.push_str("null"),
        ',' if stack.last() == Some(&'{') => out.push_str("\"k\":null"),
        ',' => out.push_str("null"),
        _ => {}
    }
    while let Some(open) = stack.pop() {
        out.push(if open == '{' { '}' } else { ']' });
    }
    out
}

#[test]
fn complete_json_finishes_prefixes_of_json_and_only_those() {
    for prefix in [
        "{",
        "{\"a",
        "{\"a\"",
        "{\"a\":",
        "{\"a\":[1,",
        "{\"a\":[1,tr",
        "{\"a\":-",
        "{\"a\":1.",
        "{\"a\":\"x\\",
        "{\"a\":{\"b\":null},",
        "[{\"a\":\"}]",
    ] {
        let done = complete_json(prefix);
        assert!(
            serde_json::from_str::<Value>(&done).is_ok(),
            "{prefix} -> {done}"
        );
    }
    for bad in ["{a", "{\"a\" 1", "{\"a\":\"x\ny", "x"] {
        let done = complete_json(bad);
        assert!(
            serde_json::from_str::<Value>(&done).is_err(),
            "{bad} -> {done}"
        );
    }
}

/// `json_object` is any object: nothing bounds its length, so random weights may run out
/// of tokens inside it. An answer that ends is an object; one cut off by `max_tokens` is the
/// start of one.
#[tokio::test(flavor = "multi_thread")]
async fn json_object_answers_are_objects_and_the_prompt_opens_the_final_channel() {
    let s = tiny_server().await;
    let tok = mxtune::engine::tokenizer::Tokenizer::o200k_harmony();
    let jobs: Vec<_> = SETTINGS
        .iter()
        .map(|&(temperature, seed)| {
            let base = s.base.clone();
            let body = request(&json!({"type": "json_object"}), temperature, seed, 48);
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                (
                    temperature,
                    r.status().as_u16(),
                    r.json::<Value>().await.unwrap(),
                )
            })
        })
        .collect();
    let mut stopped = 0;
    for job in jobs {
        let (temperature, status, v) = job.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let prompt: Vec<u32> = serde_json::from_value(v["prompt_token_ids"].clone()).unwrap();
        let text = tok.decode(&prompt, false);
        assert!(
            text.ends_with("<|start|>assistant<|channel|>final<|message|>"),
            "{text}"
        );
        let choice = &v["choices"][0];
        let content = choice["message"]["content"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
        match choice["finish_reason"].as_str() {
            Some("stop") => {
                let value: Value = serde_json::from_str(content)
                    .unwrap_or_else(|e| panic!("T={temperature}: {content:?}: {e}"));
                assert!(value.is_object(), "{content}");
                // The answer ended with `<|return|>`, not `<|end|>` or `<|call|>`.
                assert_eq!(tok.decode(&ids[ids.len() - 1..], false), "<|return|>");
                stopped += 1;
            }
            Some("length") => {
                assert_eq!(ids.len(), 48, "{v}");
                assert!(content.starts_with('{'), "{content:?}");
                let done = complete_json(content);
                let value: Value = serde_json::from_str(&done)
                    .unwrap_or_else(|e| panic!("T={temperature}: {content:?} starts no JSON: {e}"));
                assert!(value.is_object());
            }
            other => panic!("T={temperature}: finish {other:?} for {content:?}"),
        }
    }
    assert!(stopped > 0, "no json_object answer ended within 48 tokens");
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_gives_the_same_answer_and_max_tokens_cuts_it() {
    let s = tiny_server().await;
    let body = request(&json_schema("person", &person()), 0.0, 0, 320);
    let (status, whole) = chat(&s, body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut content = String::new();
    let mut finish = Value::Null;
    for d in sse_data(&r.text().await.unwrap()) {
        if d == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if !c["choices"][0]["finish_reason"].is_null() {
            finish = c["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(
        content,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(finish, "stop");
    assert!(!content.is_empty());
    // Cut short: `length`, at most max_tokens tokens, and what came is the answer's start.
    let mut short = body.clone();
    short["max_tokens"] = json!(4);
    let (status, v) = chat(&s, short).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), 4);
    let part = choice["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with(part) && part.len() < content.len(),
        "{part:?} vs {content:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_response_formats_get_400_naming_response_format() {
    let s = tiny_server().await;
    let unsatisfiable = json!({
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
        "required": ["a"],
    });
    let cases = [
        (json!("json_object"), "must be an object"),
        (json!({"type": "xml"}), "response_format.type must be"),
        (json!({"type": "json_schema"}), "needs `json_schema`"),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            ".name must be",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}),
            ".schema must be a JSON schema object",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}),
            ".strict must be true or false",
        ),
        (
            json_schema("x", &json!({"type": "banana"})),
            "cannot be enforced",
        ),
        (json_schema("x", &unsatisfiable), "cannot be enforced"),
    ];
    for (format, says) in cases {
        let (status, v) = chat(&s, request(&format, 0.0, 0, 8)).await;
        assert_eq!(status, 400, "{format}: {v}");
        assert_eq!(v["error"]["param"], "response_format", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{format}: {message}");
    }
    // A tool call cannot also be a JSON final answer.
    let mut both = request(&json!({"type": "json_object"}), 0.0, 0, 8);
    both["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    both["tool_choice"] = json!("required");
    let (status, v) = chat(&s, both).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "response_format", "{v}");
    // `text` is free text, and the server still answers after the refusals.
    let (status, v) = chat(&s, request(&json!({"type": "text"}), 0.0, 0, 4)).await;
    assert_eq!(status, 200, "{v}");
}

/// vLLM's own fields: `structured_outputs` (`json`, `json_object`) and the older
/// `guided_json` constrain the answer as `response_format` does.
#[tokio::test(flavor = "multi_thread")]
async fn vllm_structured_outputs_and_guided_json_constrain_alike() {
    let s = tiny_server().await;
    let plain = |extra: Value| {
        let mut body = request(&json!({"type": "text"}), 0.0, 0, 120);
        body.as_object_mut().unwrap().remove("response_format");
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (status, a) = chat(&s, plain(json!({"structured_outputs": {"json": list()}}))).await;
    assert_eq!(status, 200, "{a}");
    let content = a["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{content}: {e}"));
    assert_eq!(validate(&list(), &value, "$"), Ok(()));
    // The schema as JSON text under the older name: the same greedy answer.
    let (status, b) = chat(&s, plain(json!({"guided_json": list().to_string()}))).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["choices"][0]["message"]["content"], content);
    let (status, v) = chat(&s, plain(json!({"structured_outputs": {"json": list()}}))).await;
    assert_eq!(status, 200);
    assert_eq!(
        v["choices"][0]["message"]["content"], content,
        "greedy repeats"
    );
    let bad = [
        (
            json!({"structured_outputs": {"grammar": "root ::= \"a\""}}),
            "structured_outputs.grammar",
        ),
        (
            json!({"structured_outputs": {"json_object": "yes"}}),
            "structured_outputs.json_object",
        ),
        (json!({"structured_outputs": "json"}), "structured_outputs"),
        (json!({"guided_json": 5}), "guided_json"),
        (json!({"guided_json": {"type": "banana"}}), "guided_json"),
        (
            json!({"structured_outputs": {"json": {"type": "banana"}}}),
            "structured_outputs",
        ),
        (json!({"guided_json": "{not json"}), "guided_json"),
        (
            json!({"guided_json": list(), "structured_outputs": {"json": list()}}),
            "guided_json",
        ),
        (
            json!({"guided_json": list(), "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (extra, param) in bad {
        let (status, v) = chat(&s, plain(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
}

/// `structured_outputs.choice` / `guided_choice` make the answer exactly one of the strings,
/// `structured_outputs.regex` / `guided_regex` a whole match of the pattern, whatever the
/// random weights prefer, greedy and sampled.
#[tokio::test(flavor = "multi_thread")]
async fn choice_and_regex_constrain_the_whole_answer() {
    let s = tiny_server().await;
    let body = |extra: Value, temperature: f64, seed: u64| {
        let mut body = request(&json!({"type": "text"}), temperature, seed, 40);
        body.as_object_mut().unwrap().remove("response_format");
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let colors = ["red", "green", "blue (dark)", "a|b"];
    let pattern = "[0-9]{3}-[a-z]{2,4}";
    let whole = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
    for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.0, 2), (1.5, 3)] {
        for extra in [
            json!({"structured_outputs": {"choice": colors}}),
            json!({"guided_choice": colors}),
        ] {
            let (status, v) = chat(&s, body(extra.clone(), temperature, seed)).await;
            assert_eq!(status, 200, "{extra}: {v}");
            let c = &v["choices"][0];
            let content = c["message"]["content"].as_str().unwrap();
            assert!(
                colors.contains(&content),
                "{extra}: {content:?} is not a choice"
            );
            assert_eq!(c["finish_reason"], "stop", "{v}");
        }
        for extra in [
            json!({"structured_outputs": {"regex": pattern}}),
            json!({"guided_regex": pattern}),
        ] {
            let (status, v) = chat(&s, body(extra.clone(), temperature, seed)).await;
            assert_eq!(status, 200, "{extra}: {v}");
            let content = v["choices"][0]["message"]["content"].as_str().unwrap();
            assert!(
                whole.is_match(content),
                "{extra}: {content:?} does not match"
            );
        }
    }
    let bad = [
        (
            json!({"structured_outputs": {"choice": []}}),
            "structured_outputs.choice",
        ),
        (
            json!({"structured_outputs": {"choice": ["a", 1]}}),
            "structured_outputs.choice",
        ),
        (json!({"guided_choice": "red"}), "guided_choice"),
        (
            json!({"structured_outputs": {"regex": 5}}),
            "structured_outputs.regex",
        ),
        (json!({"guided_regex": ["a"]}), "guided_regex"),
        (
            json!({"structured_outputs": {"regex": "(unclosed"}}),
            "structured_outputs",
        ),
        (json!({"guided_regex": "a{2,1}"}), "guided_regex"),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
            "structured_outputs",
        ),
        (
            json!({"guided_json": list(), "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (
            json!({"structured_outputs": {"choice": ["a"]}, "guided_regex": "a"}),
            "guided_regex",
        ),
        (
            json!({"guided_choice": ["a"], "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (extra, param) in bad {
        let (status, v) = chat(&s, body(extra.clone(), 0.0, 0)).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
}

/// `/v1/completions` reads the same fields: the completion takes the shape from its first
/// token, for every prompt of a list.
#[tokio::test(flavor = "multi_thread")]
async fn completions_take_the_same_structured_fields() {
    let s = tiny_server().await;
    let post = |body: Value| post(&s, "/v1/completions", body);
    let colors = ["red", "green", "blue"];
    let prompts = json!(["The sky is", "Grass is", [3000, 3001, 3002]]);
    for (temperature, seed) in [(0.0, 0), (1.0, 4)] {
        let body = json!({"prompt": prompts, "max_tokens": 20, "temperature": temperature,
                          "seed": seed, "guided_choice": colors});
        let (status, v) = post(body.clone()).await;
        assert_eq!(status, 200, "{body}: {v}");
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{v}");
        for c in choices {
            assert!(colors.contains(&c["text"].as_str().unwrap()), "{c}");
            assert_eq!(c["finish_reason"], "stop", "{c}");
        }
    }
    let whole = regex::Regex::new("^(?:[A-Z][a-z]{1,5}!)$").unwrap();
    let body = json!({"prompt": "Say", "max_tokens": 20, "temperature": 1.0, "seed": 9,
                      "structured_outputs": {"regex": "[A-Z][a-z]{1,5}!"}});
    let (status, v) = post(body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(whole.is_match(text), "{text:?}");
    let body = json!({"prompt": "A person:", "max_tokens": 120, "temperature": 0,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "l", "schema": list()}}});
    let (status, v) = post(body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(validate(&list(), &value, "$"), Ok(()));
    let (status, v) = post(json!({"prompt": "x", "guided_choice": []})).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "guided_choice");
}

/// The official `openai` client's structured-output helper: a pydantic model as
/// `response_format`, the answer read back as that model (`message.parsed`).
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_parses_the_answer_into_its_model() {
    if !has_python_openai("openai_python_client_parses_the_answer_into_its_model") {
        return;
    }
    let s = tiny_server().await;
    let script = r#"
import sys, typing, openai, pydantic
class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    age: int = pydantic.Field(ge=0, le=120)
    color: typing.Literal["red", "green"]
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
r = c.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "Who?"}],
                             response_format=Person, max_tokens=120, temperature=0)
p = r.choices[0].message.parsed
assert isinstance(p, Person), r
print(r.choices[0].finish_reason, p.color in ("red", "green"), 0 <= p.age <= 120)
"#;
    assert_eq!(python(script, &[&s.base]).await.trim(), "stop True True");
}

/// Two functions whose arguments are bounded (every string, number and array), so random
/// weights finish a call within the tests' `max_tokens`.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "hourly": {"type": "boolean"},
                },
                "required": ["city", "unit", "days", "hourly"],
                "additionalProperties": false,
            },
        }},
        {"type": "function", "function": {
            "name": "search",
            "strict": true,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 8},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                },
                "required": ["query", "tags"],
                "additionalProperties": false,
            },
        }},
    ])
}

/// The `parameters` of the offered function `name`.
fn parameters_of(name: &str) -> Value {
    tools()
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("`{name}` was never offered"))["function"]["parameters"]
        .clone()
}

fn tool_request(tool_choice: &Value, temperature: f64, seed: u64, stream: bool) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": tools(),
        "tool_choice": tool_choice,
        "temperature": temperature,
        "seed": seed,
        "max_tokens": 200,
        "stream": stream,
    })
}

/// The one call of an answer, whole or streamed: its name, its arguments text and the
/// finish reason.
async fn call_of(base: &str, body: &Value) -> (String, String, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    if r.status().as_u16() != 200 {
        panic!("{}: {}", r.status(), r.text().await.unwrap());
    }
    if body["stream"] != json!(true) {
        let v: Value = r.json().await.unwrap();
        let choice = &v["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array();
        let calls = calls.unwrap_or_else(|| panic!("no tool call: {v}"));
        assert_eq!(calls.len(), 1, "{v}");
        let f = &calls[0]["function"];
        return (
            f["name"].as_str().unwrap().to_string(),
            f["arguments"].as_str().unwrap().to_string(),
            choice["finish_reason"].clone(),
        );
    }
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
    for d in sse_data(&r.text().await.unwrap()) {
        if d == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        for call in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(call["index"], 0, "{c}");
            if let Some(n) = call["function"]["name"].as_str() {
                assert!(name.is_empty(), "the name came twice: {c}");
                name = n.to_string();
            }
            arguments.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
        if !c["choices"][0]["finish_reason"].is_null() {
            finish = c["choices"][0]["finish_reason"].clone();
        }
    }
    (name, arguments, finish)
}

/// `tool_choice` named or `required`: whatever the random weights prefer, the call names an
/// offered function and its arguments satisfy that function's schema, whole and streamed.
#[tokio::test(flavor = "multi_thread")]
async fn forced_tool_calls_follow_the_function_schema() {
    let s = tiny_server().await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let mut jobs = Vec::new();
    for (choice, only) in [(&named, Some("get_weather")), (&json!("required"), None)] {
        for (temperature, seed) in [(0.7, 0), (1.0, 1), (1.5, 2), (1.5, 3)] {
            for stream in [false, true] {
                let body = tool_request(choice, temperature, seed, stream);
                let base = s.base.clone();
                jobs.push((
                    only,
                    body.clone(),
                    tokio::spawn(async move { call_of(&base, &body).await }),
                ));
            }
        }
    }
    let mut seen_arguments = std::collections::HashSet::new();
    for (only, body, job) in jobs {
        let (name, arguments, finish) = job.await.unwrap();
        let what = format!(
            "tool_choice {} T={} seed {} stream {}: {name}({arguments})",
            body["tool_choice"], body["temperature"], body["seed"], body["stream"]
        );
        if let Some(only) = only {
            assert_eq!(name, only, "{what}");
        }
        assert_eq!(finish, "tool_calls", "{what}");
        let value: Value = serde_json::from_str(&arguments)
            .unwrap_or_else(|e| panic!("{what}: the arguments are not JSON: {e}"));
        if let Err(e) = validate(&parameters_of(&name), &value, "$") {
            panic!("{what} breaks the schema: {e}");
        }
        seen_arguments.insert(arguments);
    }
    // The weights and seeds still choose within the schema.
    assert!(seen_arguments.len() > 3, "{seen_arguments:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_forced_call_equals_the_whole_one() {
    let s = tiny_server().await;
    for choice in [
        json!({"type": "function", "function": {"name": "search"}}),
        json!("required"),
    ] {
        let whole = call_of(&s.base, &tool_request(&choice, 0.0, 0, false)).await;
        let streamed = call_of(&s.base, &tool_request(&choice, 0.0, 0, true)).await;
        assert_eq!(whole, streamed, "{choice}");
    }
}

/// `tool_choice: "auto"` with a strict function (`search`): whenever the random weights open
/// a call of it, its arguments satisfy its schema; and the constraint leaves every other
/// answer alone: token for token the one the same request gets with `strict` off.
#[tokio::test(flavor = "multi_thread")]
async fn auto_calls_of_strict_functions_follow_the_schema_and_nothing_else_changes() {
    let s = tiny_server().await;
    let ids = |v: &Value| v["choices"][0]["token_ids"].clone();
    let mut compared = 0;
    for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.5, 2)] {
        let mut body = tool_request(&json!("auto"), temperature, seed, false);
        body["max_tokens"] = json!(24);
        body["return_token_ids"] = json!(true);
        let (status, strict) = chat(&s, body.clone()).await;
        assert_eq!(status, 200, "{strict}");
        body["tools"][1]["function"]["strict"] = json!(false);
        let (status, free) = chat(&s, body).await;
        assert_eq!(status, 200, "{free}");
        let calls = |v: &Value| {
            v["choices"][0]["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        for c in calls(&strict) {
            let f = &c["function"];
            if f["name"] != "search" || strict["choices"][0]["finish_reason"] != "tool_calls" {
                continue;
            }
            let value: Value = serde_json::from_str(f["arguments"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("T={temperature} seed {seed}: {e}: {strict}"));
            if let Err(e) = validate(&parameters_of("search"), &value, "$") {
                panic!("T={temperature} seed {seed} breaks the schema: {e}: {strict}");
            }
        }
        if calls(&free)
            .iter()
            .all(|c| c["function"]["name"] != "search")
        {
            assert_eq!(ids(&strict), ids(&free), "T={temperature} seed {seed}");
            compared += 1;
        }
    }
    assert!(
        compared > 0,
        "every answer called search: nothing was compared"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tool_schemas_and_strict_get_400_naming_the_tool() {
    let s = tiny_server().await;
    let mut bad_tools = tools();
    bad_tools[1]["function"]["parameters"] = json!({"type": "banana"});
    let named_search = json!({"type": "function", "function": {"name": "search"}});
    for choice in [json!("required"), named_search] {
        let mut body = tool_request(&choice, 0.0, 0, false);
        body["tools"] = bad_tools.clone();
        let (status, v) = chat(&s, body).await;
        assert_eq!(status, 400, "{choice}: {v}");
        assert_eq!(v["error"]["param"], "tools[1].function.parameters", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("cannot be enforced"), "{message}");
    }
    // Under `auto` a strict function's calls are constrained: its schema must compile.
    let mut body = tool_request(&json!("auto"), 0.0, 0, false);
    body["tools"] = bad_tools.clone();
    let (status, v) = chat(&s, body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools[1].function.parameters", "{v}");
    // Calls of a function that is not strict are not constrained under `auto`, so its schema
    // is not compiled.
    let mut body = tool_request(&json!("auto"), 0.0, 0, false);
    bad_tools[0]["function"]["parameters"] = json!({"type": "banana"});
    bad_tools[1]["function"]["parameters"] = parameters_of("search");
    body["tools"] = bad_tools;
    body["max_tokens"] = json!(4);
    let (status, v) = chat(&s, body).await;
    assert_eq!(status, 200, "{v}");
    let mut body = tool_request(&json!("auto"), 0.0, 0, false);
    body["tools"][0]["function"]["strict"] = json!("yes");
    let (status, v) = chat(&s, body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools[0].function.strict", "{v}");
}

/// The official `openai` client: a named and a required call, whole and streamed; the
/// arguments it hands back satisfy the schema.
#[tokio::test(flavor = "multi_thread")]
async fn openai_python_client_gets_calls_that_follow_the_schema() {
    if !has_python_openai("openai_python_client_gets_calls_that_follow_the_schema") {
        return;
    }
    let s = tiny_server().await;
    let script = r#"
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
tools = json.loads(sys.argv[2])
msgs = [{"role": "user", "content": "Weather in Oslo?"}]
for choice in [{"type": "function", "function": {"name": "get_weather"}}, "required"]:
    for seed in range(2):
        r = c.chat.completions.create(model="tiny", messages=msgs, tools=tools, tool_choice=choice,
                                      temperature=1.2, seed=seed, max_tokens=200)
        call = r.choices[0].message.tool_calls[0]
        print(json.dumps([call.function.name, call.function.arguments, r.choices[0].finish_reason]))
        name, args, finish = "", "", None
        for chunk in c.chat.completions.create(model="tiny", messages=msgs, tools=tools,
                                               tool_choice=choice, temperature=1.2, seed=seed,
                                               max_tokens=200, stream=True):
            for d in chunk.choices[0].delta.tool_calls or []:
                name += d.function.name or ""
                args += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        print(json.dumps([name, args, finish]))
"#;
    let out = python(script, &[&s.base, &tools().to_string()]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    for pair in lines.chunks(2) {
        // The same seed whole and streamed: the same call.
        assert_eq!(pair[0], pair[1], "{out}");
    }
    for (i, line) in lines.into_iter().enumerate() {
        let [name, arguments, finish]: [Value; 3] = serde_json::from_str(line).unwrap();
        assert_eq!(finish, "tool_calls", "{line}");
        let name = name.as_str().unwrap();
        if i < 4 {
            assert_eq!(name, "get_weather", "the named function: {line}");
        }
        let value: Value = serde_json::from_str(arguments.as_str().unwrap())
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        if let Err(e) = validate(&parameters_of(name), &value, "$") {
            panic!("{line} breaks the schema: {e}");
        }
    }
}

//! The harmony prompts of chat requests against gpt-oss's own chat template: each case of
//! `tests/fixtures/harmony/renderings.json` holds a request body and the text the model's
//! `chat_template.jinja` renders for it (made by `tools/make_harmony_fixtures.py` with jinja2,
//! as Hugging Face transformers applies a template). The request goes through the server's
//! request validation and rendering; the token ids must equal the template text's.

use mxtune::engine::harmony::Renderer;
use mxtune::engine::server::api::{ChatRequest, Limits};
use mxtune::engine::tokenizer::Tokenizer;
/// One fixture case. The request is read straight into the server's request type: going
/// through `serde_json::Value` would sort the keys, and key order shapes the tool namespace.
#[derive(serde::Deserialize)]
struct Case {
    name: String,
    date: String,
    request: ChatRequest,
    expected: String,
}

fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/harmony/renderings.json"
    );
    let text = std::fs::read_to_string(path).expect("renderings.json is in the repository");
    serde_json::from_str(&text).expect("renderings.json is JSON")
}

#[test]
fn prompts_match_the_model_chat_template() {
    let tok = Tokenizer::o200k_harmony();
    let renderer = Renderer::new(tok).unwrap();
    let cases = cases();
    assert!(cases.len() >= 8, "the fixture lost cases");
    let mut with_tools = 0;
    for case in &cases {
        let name = &case.name;
        let date = chrono::NaiveDate::parse_from_str(&case.date, "%Y-%m-%d").unwrap();
        let req = &case.request;
        let lim = Limits {
            served_model_name: "m",
            max_model_len: 1 << 16,
            vocab_size: 201_088,
            today: date,
        };
        let prepared = req
            .prepare(&renderer, &lim)
            .unwrap_or_else(|e| panic!("{name}: {:?}", e.body()));
        let expected = case.expected.as_str();
        let want = tok.encode_with_specials(expected).unwrap();
        if prepared.prompt != want {
            panic!(
                "{name}: the rendering differs from the chat template's\n--- ours\n{}\n--- template\n{expected}",
                tok.decode(&prepared.prompt, false)
            );
        }
        assert!(prepared.prefill.is_empty(), "{name}: no prefill under auto");
        with_tools += usize::from(req.tools.is_some());
    }
    assert!(with_tools >= 4, "the fixture must keep its tool cases");
}

/// The same chat rendered on two dates differs only in the `Current date:` line.
#[test]
fn the_date_is_the_one_given() {
    let tok = Tokenizer::o200k_harmony();
    let renderer = Renderer::new(tok).unwrap();
    let req: ChatRequest =
        serde_json::from_str(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
    let render = |y, m, d| {
        let lim = Limits {
            served_model_name: "m",
            max_model_len: 4096,
            vocab_size: 201_088,
            today: chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap(),
        };
        tok.decode(&req.prepare(&renderer, &lim).unwrap().prompt, false)
    };
    let a = render(2025, 12, 31);
    let b = render(2026, 1, 1);
    assert!(a.contains("\nCurrent date: 2025-12-31\n"), "{a}");
    assert_eq!(a.replace("2025-12-31", "2026-01-01"), b);
}

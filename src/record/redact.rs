//! Secret redaction: values whose names look like secrets never reach a run record.
//!
//! A name is secret when one of its words (split at anything not a letter or digit) ends
//! in TOKEN, KEY, SECRET(S), PASSWORD or PASSWD, case-insensitively: `HF_TOKEN`,
//! `--api-key`, `OPENAI_API_KEY`, `apiKey`, `DB_PASSWORD`. Matching whole-word endings
//! rather than substrings keeps `--max-num-batched-tokens` and `--tokenizer` readable.

use crate::vocab::LaunchSpec;
use std::collections::BTreeMap;

/// What a secret value is replaced with.
pub const REDACTED: &str = "<redacted>";

const SECRET_ENDINGS: [&str; 6] = ["TOKEN", "KEY", "SECRET", "SECRETS", "PASSWORD", "PASSWD"];

/// Does this env var, flag or JSON key name look like it holds a secret?
pub fn is_secret_name(name: &str) -> bool {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_uppercase())
        .any(|w| SECRET_ENDINGS.iter().any(|e| w.ends_with(e)))
}

/// Replace the values of secret-named variables and passwords inside URL values.
pub fn redact_env(env: &mut BTreeMap<String, String>) {
    for (k, v) in env.iter_mut() {
        if is_secret_name(k) {
            *v = REDACTED.to_string();
        } else if v.contains("://") {
            // e.g. HTTP_PROXY=http://user:pw@proxy
            *v = redact_url(v);
        }
    }
}

/// Redact secret values in an argument vector: `--api-key X`, `--api-key=X`, and
/// `NAME=value` words (as in `-e HF_TOKEN=…` or `env HF_TOKEN=… cmd`).
pub fn redact_argv(argv: &mut [String]) {
    let mut redact_next = false;
    for arg in argv.iter_mut() {
        if redact_next {
            redact_next = false;
            if !arg.starts_with("--") {
                *arg = REDACTED.to_string();
                continue;
            }
        }
        if let Some(flag) = arg.strip_prefix('-') {
            let flag = flag.trim_start_matches('-');
            match flag.split_once('=') {
                Some((name, _)) if is_secret_name(name) => {
                    *arg = format!("{}={REDACTED}", &arg[..arg.len() - flag.len() + name.len()]);
                }
                Some(_) => {}
                None => redact_next = is_secret_name(flag),
            }
        } else if let Some((name, _)) = arg.split_once('=')
            && is_env_name(name)
            && is_secret_name(name)
        {
            *arg = format!("{name}={REDACTED}");
        }
        if arg.contains("://") {
            *arg = redact_url(arg);
        }
    }
}

/// Hide the password of a URL's user info: `https://user:pw@host/…` → `https://user:<redacted>@host/…`.
pub fn redact_url(s: &str) -> String {
    let Some(scheme_end) = s.find("://") else {
        return s.to_string();
    };
    let rest = &s[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return s.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{}{user}:{REDACTED}{}", &s[..scheme_end + 3], &rest[at..]),
        None => s.to_string(),
    }
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Redact, recursively, the values of secret-named keys in a JSON value.
pub fn redact_json(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_secret_name(k) && !v.is_null() {
                    *v = serde_json::Value::String(REDACTED.to_string());
                } else {
                    redact_json(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_json),
        serde_json::Value::String(s) => {
            // Flag sets may carry argv-like strings (`--api-key=X`, `HF_TOKEN=X`).
            let mut one = [std::mem::take(s)];
            redact_argv(&mut one);
            let [redacted] = one;
            *s = redacted;
        }
        _ => {}
    }
}

/// Redact a launch spec's argv, env, container labels and secret-named container files.
pub fn redact_launch(spec: &mut LaunchSpec) {
    redact_argv(&mut spec.argv);
    redact_env(&mut spec.env);
    if let Some(c) = spec.container.as_mut() {
        redact_env(&mut c.labels);
        for (path, contents) in c.files.iter_mut() {
            let file_name = path.rsplit('/').next().unwrap_or(path);
            if is_secret_name(file_name) {
                *contents = REDACTED.to_string();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords() {
        assert_eq!(
            redact_url("https://op:hunter2@proxy:3128/path?q=a@b"),
            "https://op:<redacted>@proxy:3128/path?q=a@b"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:8000/v1"),
            "http://127.0.0.1:8000/v1"
        );
        assert_eq!(redact_url("http://user@host/"), "http://user@host/");
        let mut argv = vec!["--url".to_string(), "http://a:b@h".to_string()];
        redact_argv(&mut argv);
        assert_eq!(argv[1], "http://a:<redacted>@h");
    }

    #[test]
    fn names() {
        for s in [
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "api-key",
            "OPENAI_API_KEY",
            "apiKey",
            "AWS_SECRET_ACCESS_KEY",
            "client_secrets",
            "DB_PASSWORD",
            "passwd",
        ] {
            assert!(is_secret_name(s), "{s} should be secret");
        }
        for s in [
            "max-num-batched-tokens",
            "tokenizer",
            "num_speculative_tokens",
            "VLLM_MXFP4_BACKEND",
            "kv-cache-dtype",
            "",
        ] {
            assert!(!is_secret_name(s), "{s} should not be secret");
        }
    }
}

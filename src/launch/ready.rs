//! Readiness: `/health` answers 200, `/v1/models` lists the served model, and a 1-token
//! completion succeeds. vLLM keeps answering `/v1/models` after its EngineCore died, so the
//! completion is the only proof that the engine really serves.

use anyhow::{Context, Result};
use chrono::Utc;
use serde_json::{Value, json};
use std::time::Duration;

use crate::vocab::ProbeAnswer;

/// Characters of a server's message kept in a probe answer: enough for vLLM's one-line
/// errors, short enough for one screen line.
const MESSAGE_CHARS: usize = 300;

/// The server's own message in an error body: vLLM's `{"message": …}`, OpenAI's
/// `{"error": {"message": …}}`, FastAPI's `{"detail": …}`, else the first line of the text.
fn server_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        [
            v.get("message"),
            v.get("error").and_then(|e| e.get("message")),
            v.get("error"),
            v.get("detail"),
        ]
        .into_iter()
        .flatten()
        .find_map(|m| m.as_str().map(str::to_string))
    });
    let text = from_json.unwrap_or_else(|| {
        body.lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_string()
    });
    text.trim().chars().take(MESSAGE_CHARS).collect()
}

/// Why a request got no HTTP answer, in the words of the innermost cause (e.g.
/// `Connection refused (os error 111)`) rather than reqwest's wrapping.
fn transport_error(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {} s", timeout.as_secs());
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let root = cause.to_string();
    if e.is_connect() && !root.to_lowercase().contains("connect") {
        format!("cannot connect: {root}")
    } else {
        root
    }
}

/// Probes one OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct ReadyProbe {
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
}

impl ReadyProbe {
    /// A probe for `base_url` (e.g. `http://127.0.0.1:8000`) expecting `model` in
    /// `/v1/models`; an empty `model` accepts whichever model the server lists first.
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .build()
            .context("cannot build the HTTP client for readiness probes")?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            model: model.to_string(),
            api_key,
            timeout,
        })
    }

    /// Base URL probed.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Sends one request; a non-2xx status or no answer at all becomes the probe's answer.
    async fn send(
        &self,
        request: &str,
        rb: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ProbeAnswer> {
        let rb = match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        };
        match rb.send().await {
            Ok(resp) if resp.status().is_success() => Ok(resp),
            Ok(resp) => {
                let status = resp.status();
                // A body that cannot be read still leaves the status, which says enough.
                let body = resp.text().await.unwrap_or_default();
                let mut message = server_message(&body);
                if message.is_empty() {
                    message = status.canonical_reason().unwrap_or("").to_string();
                }
                Err(answer(request, Some(status.as_u16()), message))
            }
            Err(e) => Err(answer(request, None, transport_error(&e, self.timeout))),
        }
    }

    /// Runs the three checks; `Ok(model)` names the model that answered, `Err` is the answer
    /// of the check that failed.
    pub async fn check(&self) -> Result<String, ProbeAnswer> {
        let request = "GET /health";
        let resp = self
            .send(
                request,
                self.client.get(format!("{}/health", self.base_url)),
            )
            .await?;
        if resp.status() != reqwest::StatusCode::OK {
            let code = resp.status().as_u16();
            return Err(answer(request, Some(code), "expected 200".into()));
        }

        let request = "GET /v1/models";
        let resp = self
            .send(
                request,
                self.client.get(format!("{}/v1/models", self.base_url)),
            )
            .await?;
        let status = Some(resp.status().as_u16());
        let body: Value = resp
            .json()
            .await
            .map_err(|e| answer(request, status, format!("body is not JSON: {e}")))?;
        let ids: Vec<String> = body
            .get("data")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let model = if self.model.is_empty() {
            match ids.first() {
                Some(m) => m.clone(),
                None => return Err(answer(request, status, "lists no model".into())),
            }
        } else if ids.iter().any(|m| m == &self.model) {
            self.model.clone()
        } else {
            return Err(answer(
                request,
                status,
                format!("does not list model {:?} (it lists {ids:?})", self.model),
            ));
        };

        let request = "POST /v1/completions";
        let req = json!({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0});
        let resp = self
            .send(
                request,
                self.client
                    .post(format!("{}/v1/completions", self.base_url))
                    .json(&req),
            )
            .await?;
        let status = Some(resp.status().as_u16());
        let body: Value = resp
            .json()
            .await
            .map_err(|e| answer(request, status, format!("body is not JSON: {e}")))?;
        if body
            .get("choices")
            .and_then(Value::as_array)
            .is_none_or(|c| c.is_empty())
        {
            return Err(answer(
                request,
                status,
                "the 1-token completion returned no choices".into(),
            ));
        }
        Ok(model)
    }
}

fn answer(request: &str, status: Option<u16>, message: String) -> ProbeAnswer {
    ProbeAnswer {
        request: request.to_string(),
        status,
        message,
        at: Utc::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_s_own_message_is_found_in_common_error_bodies() {
        for (body, want) in [
            (
                r#"{"object":"error","message":"model is still loading","type":"ServiceUnavailableError","code":503}"#,
                "model is still loading",
            ),
            (
                r#"{"error":{"message":"overloaded","type":"x"}}"#,
                "overloaded",
            ),
            (r#"{"detail":"Not Found"}"#, "Not Found"),
            (
                "\n  upstream connect error\nsecond line",
                "upstream connect error",
            ),
            ("", ""),
        ] {
            assert_eq!(server_message(body), want, "{body:?}");
        }
        assert_eq!(server_message(&"x".repeat(1000)).len(), MESSAGE_CHARS);
    }

    #[test]
    fn an_answer_reads_as_request_status_and_message() {
        let mut a = answer(
            "POST /v1/completions",
            Some(503),
            "model is still loading".into(),
        );
        assert_eq!(
            a.to_string(),
            "POST /v1/completions → 503 model is still loading"
        );
        let later = ProbeAnswer {
            at: a.at + chrono::Duration::seconds(3),
            ..a.clone()
        };
        assert!(a.same_answer(&later));
        a.status = None;
        a.message = "cannot connect: Connection refused (os error 111)".into();
        assert_eq!(
            a.to_string(),
            "POST /v1/completions → cannot connect: Connection refused (os error 111)"
        );
        assert!(!a.same_answer(&later));
    }
}

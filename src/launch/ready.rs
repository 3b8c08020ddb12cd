//! Readiness: `/health` answers 200, `/v1/models` lists the served model, and a 1-token
//! completion succeeds. vLLM keeps answering `/v1/models` after its EngineCore died, so the
//! completion is the only proof that the engine really serves.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::time::Duration;

/// Probes one OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct ReadyProbe {
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
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
        })
    }

    /// Base URL probed.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// Runs the three checks; `Ok(model)` names the model that answered, `Err` says which
    /// check failed and why.
    pub async fn check(&self) -> Result<String> {
        let url = format!("{}/health", self.base_url);
        let resp = self
            .auth(self.client.get(&url))
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if resp.status() != reqwest::StatusCode::OK {
            bail!("GET {url} answered {}", resp.status());
        }

        let url = format!("{}/v1/models", self.base_url);
        let resp = self
            .auth(self.client.get(&url))
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !resp.status().is_success() {
            bail!("GET {url} answered {}", resp.status());
        }
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("GET {url}: body is not JSON"))?;
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
                None => bail!("GET {url} lists no model"),
            }
        } else if ids.iter().any(|m| m == &self.model) {
            self.model.clone()
        } else {
            bail!(
                "GET {url} does not list model {:?} (it lists {ids:?})",
                self.model
            );
        };

        let url = format!("{}/v1/completions", self.base_url);
        let req = json!({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0});
        let resp = self
            .auth(self.client.post(&url).json(&req))
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            bail!(
                "POST {url} (1-token completion) answered {status}: {}",
                text.chars().take(300).collect::<String>()
            );
        }
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("POST {url}: body is not JSON"))?;
        if body
            .get("choices")
            .and_then(Value::as_array)
            .is_none_or(|c| c.is_empty())
        {
            bail!("POST {url} (1-token completion) returned no choices");
        }
        Ok(model)
    }
}

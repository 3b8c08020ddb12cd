//! OpenAI-style error responses: `{"error":{"message","type","param","code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client; the server keeps serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error type, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A short machine-readable code, e.g. `model_not_found`.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 for a bad value of `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// 400 for a body that is not valid JSON or does not match the schema.
    pub fn bad_body(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_json"),
        }
    }

    /// 400 for a feature this engine does not implement.
    pub fn unsupported(param: &str, what: &str) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("`{param}`: {what} is not supported by the mxtune engine"),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("unsupported"),
        }
    }

    /// 404 for a model name the server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{asked}` does not exist; this server serves `{served}` (see GET /v1/models)"
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key: send `Authorization: Bearer <key>` with the \
                      key given to `mxtune serve --api-key`"
                .into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404 for a path the server does not have.
    pub fn no_route(method: &str, path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "No route {method} {path}; this server has GET /v1/models, POST /v1/completions, \
                 POST /v1/chat/completions, GET /health, GET /metrics"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 413 for a body over the server's `--max-request-bytes`.
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "The request body is larger than this server's limit of {limit} bytes; send a \
                 smaller body or restart `mxtune serve` with a larger --max-request-bytes"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 503 for a request that finds the waiting queue full (`--max-waiting-queue-length`):
    /// OpenAI's type for an overloaded server, `Retry-After` on the response.
    pub fn queue_full(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("waiting_queue_full"),
        }
    }

    /// 500 for a failure inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.code == Some("waiting_queue_full") {
            // A full queue drains within seconds; tell clients that honour it when to retry.
            return (
                self.status,
                [(axum::http::header::RETRY_AFTER, "1")],
                axum::Json(self.body()),
            )
                .into_response();
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

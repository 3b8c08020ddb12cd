//! A server that is up but not serving yet: `/health` and `/v1/models` answer, while every
//! completion gets vLLM's 503 error body "model is still loading". The attach target's other
//! end for the tests of a start that is stuck.

use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::json;

/// What the double answers every completion with.
pub const LOADING_MESSAGE: &str = "model is still loading";

/// Starts the double on an ephemeral port of 127.0.0.1, on its own thread and runtime (so
/// sync and async tests can use it); it runs until the test process ends. Returns its URL.
pub fn loading_double() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime for the loading double");
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/v1/models",
                    get(|| async { axum::Json(json!({"data": [{"id": "loading"}]})) }),
                )
                .route(
                    "/v1/completions",
                    post(|| async {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(json!({
                                "object": "error",
                                "message": LOADING_MESSAGE,
                                "type": "ServiceUnavailableError",
                                "code": 503
                            })),
                        )
                    }),
                );
            let l = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            axum::serve(l, app).await.expect("serve the loading double");
        });
    });
    format!("http://{addr}")
}

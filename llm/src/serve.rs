//! `tooltune model serve`: an OpenAI-compatible HTTP API over any [`ChatModel`] (in practice the embedded
//! model), so other agents and optimizers can use the same model as tooltune.
//!
//! Routes: `GET /v1/models` and `POST /v1/chat/completions` (tools and `tool_choice` supported; no
//! streaming, one choice). Errors use OpenAI's `{"error": {...}}` shape; a 500 says only that the model
//! failed, the details go to the server's log.

use crate::wire::{WireRequest, request_from_wire, response_to_wire};
use crate::{ChatModel, LlmError};
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

struct AppState {
    model: Arc<dyn ChatModel>,
    name: String,
    counter: AtomicU64,
}

/// The router, for embedding in another server or for tests.
pub fn router(model: Arc<dyn ChatModel>, model_name: impl Into<String>) -> Router {
    let state = Arc::new(AppState {
        model,
        name: model_name.into(),
        counter: AtomicU64::new(0),
    });
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(state)
}

/// Serves on `listener` until the task is dropped or the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    model: Arc<dyn ChatModel>,
    model_name: impl Into<String>,
) -> Result<(), LlmError> {
    let addr = listener.local_addr().ok();
    axum::serve(listener, router(model, model_name))
        .await
        .map_err(|e| LlmError::Transport {
            endpoint: addr.map(|a| a.to_string()).unwrap_or_default(),
            message: format!("serving: {e}"),
        })
}

fn error(status: StatusCode, kind: &str, message: String) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": null, "code": null}})),
    )
        .into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [
        {"id": s.name, "object": "model", "created": 0, "owned_by": "tooltune"}
    ]}))
    .into_response()
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: Result<Json<WireRequest>, JsonRejection>,
) -> Response {
    let Json(w) = match body {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e.body_text(),
            );
        }
    };
    if !w.model.is_empty() && w.model != s.name {
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "model: `{}` is not served here; this server has `{}`",
                w.model, s.name
            ),
        );
    }
    let req = match request_from_wire(w) {
        Ok(r) => r,
        Err(m) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", m),
    };
    match s.model.chat(&req).await {
        Ok(r) => {
            let n = s.counter.fetch_add(1, Ordering::Relaxed);
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            Json(response_to_wire(
                &r,
                &s.name,
                format!("chatcmpl-{n}"),
                created,
            ))
            .into_response()
        }
        Err(e @ (LlmError::InvalidRequest(_) | LlmError::ContextOverflow { .. })) => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            e.to_string(),
        ),
        Err(e) => {
            tracing::error!(error = %e, "chat completion failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the model failed to answer; see the server log".into(),
            )
        }
    }
}

//! The OpenAI-compatible backend against a real `model serve` endpoint (the embedded 0.5B model behind
//! axum on port 0), reached through a small real HTTP proxy that answers 429 and 500 before forwarding, so
//! the retry path runs over the wire.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tooltune_core::ToolSpec;
use tooltune_llm::local::{LocalModel, LocalOptions};
use tooltune_llm::openai::{OpenAiModel, OpenAiOptions};
use tooltune_llm::{ChatModel, ChatRequest, LlmError, Message, ModelChoice, Secret, ToolChoice};

struct Proxy {
    upstream: String,
    hits: AtomicU32,
    auth: Mutex<Vec<String>>,
    http: reqwest::Client,
}

/// `/flaky/...`: 429 (Retry-After 0.2 s), then 500, then forwards. `/down/...`: always 503.
async fn proxy(State(p): State<Arc<Proxy>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let n = p.hits.fetch_add(1, Ordering::SeqCst);
    if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        p.auth.lock().expect("lock").push(a.to_string());
    }
    let path = uri.path();
    if path.starts_with("/down/") {
        return (StatusCode::SERVICE_UNAVAILABLE, "down for maintenance").into_response();
    }
    match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "0.2")],
            "slow down",
        )
            .into_response(),
        1 => (StatusCode::INTERNAL_SERVER_ERROR, "oops").into_response(),
        _ => {
            let rest = path.trim_start_matches("/flaky");
            let r = p
                .http
                .post(format!("{}{rest}", p.upstream))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("upstream answers");
            let status = StatusCode::from_u16(r.status().as_u16()).expect("status");
            let bytes = r.bytes().await.expect("body");
            (status, [("content-type", "application/json")], bytes).into_response()
        }
    }
}

async fn spawn(router: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(l, router).await.expect("serve") });
    format!("http://{addr}")
}

fn task() -> ChatRequest {
    let mut r = ChatRequest::new(
        vec![Message::user("Read notes.txt and sum the numbers in it.")],
        vec![
            ToolSpec {
                name: "calculator".into(),
                description: "Evaluate an arithmetic expression.".into(),
                input_schema: json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}).into(),
            },
            ToolSpec {
                name: "read_file".into(),
                description: "Read a text file and return its contents.".into(),
                input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}).into(),
            },
        ],
    );
    r.tool_choice = ToolChoice::Required;
    r.max_tokens = 64;
    r
}

#[tokio::test]
async fn openai_backend_against_model_serve_with_retries() {
    let local = Arc::new(
        LocalModel::load(LocalOptions::for_model(ModelChoice::Fast))
            .await
            .expect("fast model loads"),
    );
    let name = ModelChoice::Fast.info().name;
    let server = spawn(tooltune_llm::serve::router(local.clone(), name)).await;

    // /v1/models names the served model.
    let http = reqwest::Client::new();
    let models: serde_json::Value = http
        .get(format!("{server}/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], name, "{models}");

    // Streaming and unknown models are refused with OpenAI-shaped errors.
    let r = http
        .post(format!("{server}/v1/chat/completions"))
        .json(&json!({"model": name, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("stream"),
        "{body}"
    );
    let r = http
        .post(format!("{server}/v1/chat/completions"))
        .json(&json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 404);

    let p = Arc::new(Proxy {
        upstream: server.clone(),
        hits: AtomicU32::new(0),
        auth: Mutex::new(Vec::new()),
        http: http.clone(),
    });
    let proxy_url = spawn(axum::Router::new().fallback(proxy).with_state(p.clone())).await;

    let mut o = OpenAiOptions::new(name, Some(format!("{proxy_url}/flaky/v1")));
    o.initial_backoff = Duration::from_millis(50);
    o.max_retries = 3;
    let remote = OpenAiModel::with_key(o, Some(Secret::new("sk-test"))).expect("client");
    let t0 = Instant::now();
    let via_http = remote
        .chat(&task())
        .await
        .expect("succeeds after 429 and 500");
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "Retry-After was not honoured"
    );
    assert_eq!(p.hits.load(Ordering::SeqCst), 3, "429, 500, then success");
    assert_eq!(remote.retries(), 2);
    assert!(
        p.auth
            .lock()
            .expect("lock")
            .iter()
            .all(|a| a == "Bearer sk-test")
    );
    assert_eq!(via_http.tool_calls.len(), 1, "{via_http:?}");
    assert!(["calculator", "read_file"].contains(&via_http.tool_calls[0].name.as_str()));
    assert!(via_http.tool_calls[0].arguments.is_object(), "{via_http:?}");

    // The same request straight to the embedded model gives the same (greedy) call.
    let direct = local.chat(&task()).await.expect("direct");
    // Ids differ by design (the engine numbers every call it makes); the calls themselves are the same.
    let call = |c: &tooltune_core::ToolCall| (c.name.clone(), c.arguments.clone());
    assert_eq!(
        direct.tool_calls.iter().map(call).collect::<Vec<_>>(),
        via_http.tool_calls.iter().map(call).collect::<Vec<_>>()
    );
    assert_ne!(direct.tool_calls[0].id, via_http.tool_calls[0].id);
    let u = remote.usage_total();
    assert_eq!(u, via_http.usage, "token accounting");
    assert!(u.prompt_tokens > 0 && u.completion_tokens > 0);
    assert_eq!(
        remote
            .score_tool_choice(&task(), &["a".into()])
            .await
            .expect("ok"),
        None
    );

    // A server that stays down: the error names the endpoint, the status and the attempts.
    let mut o = OpenAiOptions::new(name, Some(format!("{proxy_url}/down/v1")));
    o.initial_backoff = Duration::from_millis(10);
    o.max_retries = 2;
    let down = OpenAiModel::with_key(o, None).expect("client");
    match down.chat(&task()).await {
        Err(LlmError::Http {
            status,
            attempts,
            endpoint,
            message,
        }) => {
            assert_eq!((status, attempts), (503, 3));
            assert!(endpoint.contains("/down/v1/chat/completions"), "{endpoint}");
            assert!(message.contains("maintenance"), "{message}");
        }
        other => panic!("expected an HTTP error, got {other:?}"),
    }
}

//! The Streamable HTTP transport: tooltune listens where the host connects and forwards each request to the
//! upstream server's URL. A POST carries JSON-RPC messages from the host; the answer is either one JSON body or an
//! SSE stream of messages, and a GET opens the server's own stream. Bodies and events pass unchanged except
//! `tools/list` results, which [`Session`] rewrites; SSE is parsed event by event so that a stream flows through
//! as it is written.
//!
//! Sessions are keyed by the upstream's `Mcp-Session-Id`, so a host that reconnects with its session id keeps its
//! variant and its record. A server that gives no session id (stateless) is one shared session: every host's
//! exchanges go into one record under one variant. A record per exchange was the alternative, but a stateless
//! server's exchanges carry nothing that ties a `tools/call` to the `tools/list` the host read, so each call would
//! lose its description version and the variant could change between a listing and the call it led to.

use crate::record::{Recorder, Writer};
use crate::session::{
    Event, FromHost, RecordMode, Session, SessionConfig, UPSTREAM_ERROR, error_reply,
};
use crate::{ProxyError, Variant, assign};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tooltune_store::{NewProxySession, Store};

/// How the HTTP proxy runs.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The upstream server's MCP endpoint.
    pub upstream: String,
    /// The variants (one, unnamed, without A/B) and their weights.
    pub variants: Vec<Variant>,
    /// Weights of `variants`.
    pub weights: Vec<f64>,
    /// What is recorded.
    pub record: RecordMode,
    /// Argument keys never stored.
    pub redact: Vec<String>,
    /// A bearer token the host must present (required on a non-loopback address).
    pub token: Option<String>,
    /// A bearer token sent to the upstream.
    pub upstream_token: Option<String>,
}

/// Headers that travel between host and server as they are, besides every `Mcp-*` header (session id, protocol
/// revision, and from 2026-07-28 the standard headers `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` that servers
/// check against the body: rmcp's server refuses a 2026-07-28 request without them). Everything else (hop-by-hop
/// headers, the host's `Authorization` for the proxy itself, cookies) stays on its side.
const FORWARDED: [&str; 3] = ["content-type", "accept", "last-event-id"];

/// Whether a header crosses the proxy (in either direction).
fn forwarded(name: &HeaderName) -> bool {
    FORWARDED.contains(&name.as_str()) || name.as_str().starts_with("mcp-")
}

/// Bodies larger than this are refused (a JSON-RPC message is small; this bounds memory per request).
const MAX_BODY: usize = 16 << 20;

struct Live {
    session: Mutex<Session>,
    /// Taken out when the session ends: the writer finishes once this, the only sender, is gone (an SSE stream
    /// still open may hold the `Live` itself for a while).
    recorder: Mutex<Option<Recorder>>,
    writer: Mutex<Option<Writer>>,
}

struct Shared {
    options: HttpOptions,
    client: reqwest::Client,
    store: Option<Store>,
    sessions: tokio::sync::Mutex<HashMap<String, Arc<Live>>>,
}

/// A running HTTP proxy.
pub struct HttpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for HttpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProxy")
            .field("addr", &self.addr)
            .finish()
    }
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// The upstream as recorded: scheme, host and path, never credentials or a query (which may hold tokens).
pub fn upstream_name(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port().map(|p| format!(":{p}")).unwrap_or_default(),
            u.path()
        ),
        Err(_) => String::from("(unparsable upstream URL)"),
    }
}

impl HttpProxy {
    /// Binds `listen` and starts serving. A non-loopback address without a token is refused.
    pub async fn start(
        listen: SocketAddr,
        options: HttpOptions,
        store: Option<Store>,
    ) -> Result<HttpProxy, ProxyError> {
        if !is_loopback(&listen) && options.token.as_deref().is_none_or(|t| t.len() < 16) {
            return Err(ProxyError::Probe {
                server: upstream_name(&options.upstream),
                message: format!(
                    "listening on {listen}, which is not a loopback address, needs TOOLTUNE_PROXY_TOKEN (16 characters or more)"
                ),
            });
        }
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            // No kept-alive upstream connections. On a reused connection the upstream's last small segment (the
            // end of its chunked SSE answer) waited for our delayed ACK: each proxied tools/call took 42-46 ms
            // more than a direct one (Python SDK client, contractor over HTTP; curl showed the first byte at 1 ms
            // and the end at 42 ms). A fresh connection acknowledges at once; the added time fell to 0.4 ms at
            // the median. The cost is a TCP handshake per request (a TLS one too for an https upstream).
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| ProxyError::Probe {
                server: upstream_name(&options.upstream),
                message: e.to_string(),
            })?;
        let shared = Arc::new(Shared {
            options,
            client,
            store,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        // Small writes of a streamed (SSE) answer must not wait for the host's ACK (Nagle).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("cannot set TCP_NODELAY: {e}");
            }
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(HttpProxy {
            addr,
            shared,
            shutdown: tx,
            task,
        })
    }

    /// The address bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, then stores everything recorded and closes every session.
    pub async fn shutdown(self) -> Result<(), ProxyError> {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
        let sessions: Vec<Arc<Live>> = self
            .shared
            .sessions
            .lock()
            .await
            .drain()
            .map(|(_, l)| l)
            .collect();
        for live in sessions {
            finish(live).await?;
        }
        Ok(())
    }
}

/// Connects to the upstream once as a client (initialize, tools/list over every page, then ends the session with
/// DELETE), so that the names the proxy may rewrite are checked before any host connects: a misspelt tool is a
/// start-up error over HTTP as it is over stdio, not a warning at the first listing.
pub async fn list_tools(
    upstream: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Vec<String>, ProxyError> {
    let server = upstream_name(upstream);
    let probe = |message: String| ProxyError::Probe {
        server: server.clone(),
        message,
    };
    // Its own client: the check ends before the proxy's client exists, and must not leave a connection behind.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| probe(e.to_string()))?;
    let work = async {
        let mut session: Option<String> = None;
        let mut protocol: Option<String> = None;
        let post = |body: Value, session: &Option<String>, protocol: &Option<String>| {
            let mut req = client
                .post(upstream)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body.to_string());
            if let Some(s) = session {
                req = req.header("mcp-session-id", s.as_str());
            }
            if let Some(p) = protocol {
                req = req.header("mcp-protocol-version", p.as_str());
            }
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send()
        };
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "tooltune-proxy-check", "version": env!("CARGO_PKG_VERSION")}}});
        let resp = post(init, &session, &protocol)
            .await
            .map_err(|e| e.to_string())?;
        session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let r = reply_to(resp, 0).await?;
        protocol = r
            .pointer("/result/protocolVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(note, &session, &protocol)
            .await
            .map_err(|e| e.to_string())?;
        let mut names = Vec::new();
        let mut cursor: Option<Value> = None;
        let mut listed = Ok(());
        for id in 1..1000 {
            let params = match &cursor {
                Some(c) => serde_json::json!({"cursor": c}),
                None => serde_json::json!({}),
            };
            let list = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
            let r = match post(list, &session, &protocol).await {
                Ok(resp) => reply_to(resp, id).await,
                Err(e) => Err(e.to_string()),
            };
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    listed = Err(e);
                    break;
                }
            };
            if let Some(e) = r.get("error") {
                listed = Err(format!("tools/list failed: {e}"));
                break;
            }
            names.extend(
                r.pointer("/result/tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .map(str::to_string),
            );
            cursor = r
                .pointer("/result/nextCursor")
                .filter(|c| !c.is_null())
                .cloned();
            if cursor.is_none() {
                break;
            }
        }
        // The check's session is ended, so that a server with a session limit does not count it until it expires.
        if let Some(s) = &session {
            let mut req = client.delete(upstream).header("mcp-session-id", s.as_str());
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let _ = req.send().await;
        }
        listed.map(|()| names)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(names)) => Ok(names),
        Ok(Err(e)) => Err(probe(format!("{e} (use --no-check to skip this check)"))),
        Err(_) => Err(probe(format!(
            "no answer within {} s (use --no-check to skip this check)",
            timeout.as_secs()
        ))),
    }
}

/// The response to request `id` in an upstream's answer: a JSON body, or the first SSE event carrying it (read
/// event by event: a server may keep the stream open after it).
async fn reply_to(resp: reqwest::Response, id: i64) -> Result<Value, String> {
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let matches =
        |v: &Value| v.get("id").and_then(Value::as_i64) == Some(id) && v.get("method").is_none();
    if !is_sse {
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
            format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            )
        })?;
        let found = match v {
            Value::Array(a) => a.into_iter().find(|m| matches(m)),
            other => Some(other).filter(|m| matches(m)),
        };
        return found.ok_or_else(|| format!("HTTP {status}: no answer to request {id}"));
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.map_err(|e| e.to_string())?);
        while let Some((end, sep)) = find_event_end(&buf) {
            let event = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + sep);
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n"))
                && matches(&v)
            {
                return Ok(v);
            }
        }
    }
    Err(format!(
        "HTTP {status}: the stream ended without an answer to request {id}"
    ))
}

async fn finish(live: Arc<Live>) -> Result<(), ProxyError> {
    let writer = live.writer.lock().ok().and_then(|mut w| w.take());
    drop(live.recorder.lock().ok().and_then(|mut r| r.take()));
    drop(live);
    if let Some(w) = writer {
        w.finish().await?;
    }
    Ok(())
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn authorised(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = shared.options.token.as_deref() else {
        return true;
    };
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    // Compared in time independent of where they differ.
    let (a, b) = (token.as_bytes(), presented.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

fn request_ids(body: &[u8]) -> Vec<Value> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let items: Vec<&Value> = match &v {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    items
        .into_iter()
        .filter(|m| m.get("method").is_some())
        .filter_map(|m| m.get("id").cloned())
        .collect()
}

/// Opens the record of a session the upstream just named, with the variant drawn from its id.
async fn open_session(shared: &Shared, id: &str, early: Vec<Event>) -> Arc<Live> {
    let variant = &shared.options.variants[assign(id, &shared.options.weights)];
    let config = SessionConfig {
        rewrites: variant.rewrites.clone(),
        record: shared.options.record,
        redact: shared.options.redact.clone(),
    };
    let (recorder, writer) = match (&shared.store, shared.options.record) {
        (Some(store), r) if r != RecordMode::None => {
            match Recorder::start(
                store.clone(),
                NewProxySession {
                    id: uuid::Uuid::new_v4().to_string(),
                    server: upstream_name(&shared.options.upstream),
                    variant: variant.name.clone(),
                },
            )
            .await
            {
                Ok((r, w)) => (Some(r), Some(w)),
                Err(e) => {
                    tracing::error!(
                        "cannot record session {id}: {e}; forwarding without recording"
                    );
                    (None, None)
                }
            }
        }
        _ => (None, None),
    };
    if let Some(r) = &recorder {
        early.into_iter().for_each(|e| r.record(e));
    }
    Arc::new(Live {
        session: Mutex::new(Session::new(config)),
        recorder: Mutex::new(recorder),
        writer: Mutex::new(writer),
    })
}

fn record(live: &Live, events: Vec<Event>) {
    for e in events {
        if let Event::MissingTools(m) = &e {
            tracing::warn!(
                "the server's tools/list has no {}: their descriptions are not rewritten",
                m.join(", ")
            );
        }
        if let Ok(r) = live.recorder.lock()
            && let Some(r) = r.as_ref()
        {
            r.record(e);
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !authorised(&shared, &headers) {
        return json_response(
            StatusCode::UNAUTHORIZED,
            br#"{"error":"this proxy needs its bearer token"}"#.to_vec(),
        );
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                error_reply(&Value::Null, -32600, &format!("tooltune proxy: {e}")),
            );
        }
    };
    let session_id = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // The session this request belongs to; a request without a session id before the server named one (the
    // initialize) gets a session of its own, moved under the id the server gives it.
    let known = match &session_id {
        Some(id) => shared.sessions.lock().await.get(id).cloned(),
        None => shared.sessions.lock().await.get("").cloned(),
    };
    let provisional = Arc::new(Live {
        session: Mutex::new(Session::new(SessionConfig {
            record: shared.options.record,
            redact: shared.options.redact.clone(),
            ..SessionConfig::default()
        })),
        recorder: Mutex::new(None),
        writer: Mutex::new(None),
    });
    let live = known.clone().unwrap_or_else(|| provisional.clone());
    let mut early = Vec::new();
    if method == Method::POST {
        let verdict = live
            .session
            .lock()
            .map(|mut s| s.from_host(&body, Instant::now()));
        match verdict {
            Ok((FromHost::Reply(bytes), _)) => {
                return json_response(StatusCode::BAD_REQUEST, bytes);
            }
            Ok((FromHost::Forward, events)) => {
                if known.is_some() {
                    record(&live, events);
                } else {
                    early = events;
                }
            }
            Err(_) => {
                return json_response(StatusCode::INTERNAL_SERVER_ERROR, Vec::new());
            }
        }
    }
    // Forward.
    let mut req = shared
        .client
        .request(method.clone(), &shared.options.upstream);
    for (name, v) in headers.iter().filter(|(n, _)| forwarded(n)) {
        req = req.header(name.as_str(), v.as_bytes());
    }
    if let Some(t) = &shared.options.upstream_token {
        req = req.bearer_auth(t);
    }
    let resp = match req.body(body.clone()).send().await {
        Ok(r) => r,
        Err(e) => {
            // The host gets a JSON-RPC error for each request it sent; the proxy keeps serving.
            let ids = request_ids(&body);
            if let Ok(mut s) = live.session.lock() {
                s.forget(&ids);
            }
            let message = format!(
                "tooltune proxy: the server at {} did not answer: {e}",
                upstream_name(&shared.options.upstream)
            );
            let replies: Vec<Value> = ids
                .iter()
                .filter_map(|id| {
                    serde_json::from_slice(&error_reply(id, UPSTREAM_ERROR, &message)).ok()
                })
                .collect();
            let body = match replies.len() {
                0 => return json_response(StatusCode::BAD_GATEWAY, Vec::new()),
                1 => serde_json::to_vec(&replies[0]).unwrap_or_default(),
                _ => serde_json::to_vec(&replies).unwrap_or_default(),
            };
            return json_response(StatusCode::OK, body);
        }
    };
    // A session the server just named: open its record (variant drawn from the id) and replay the early events.
    let named = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let live = if known.is_none() {
        let key = named.clone().unwrap_or_default();
        let mut sessions = shared.sessions.lock().await;
        let existing = sessions.get(&key).cloned();
        match existing {
            Some(l) => l,
            None => {
                if key.is_empty() {
                    // Every host of a server without session ids is one session: one record, one variant (drawn
                    // from the empty key), so such a server cannot be A/B tested over HTTP (see trace-format.md).
                    tracing::warn!(
                        "the upstream gave no Mcp-Session-Id: all hosts share one recorded session{}",
                        if shared.options.variants.len() > 1 {
                            " and one variant"
                        } else {
                            ""
                        }
                    );
                }
                let opened = open_session(&shared, &key, early).await;
                // The provisional session tracked the initialize request: carry its pending state over.
                if let (Ok(mut new), Ok(mut old)) =
                    (opened.session.lock(), provisional.session.lock())
                {
                    new.adopt_pending(&mut old);
                }
                sessions.insert(key, opened.clone());
                opened
            }
        }
    } else {
        live
    };
    if method == Method::DELETE
        && let Some(id) = &session_id
    {
        let ended = shared.sessions.lock().await.remove(id);
        if let Some(l) = ended {
            // Off the response path: the record is closed once its queue is written.
            let id = id.clone();
            tokio::spawn(async move {
                if let Err(e) = finish(l).await {
                    tracing::error!("closing the record of session {id}: {e}");
                }
            });
        }
    }
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = Response::builder().status(status);
    for (name, v) in resp.headers().iter() {
        // reqwest and axum share the `http` crate's types, so a header passes as it came.
        if forwarded(name) && name.as_str() != "accept" && name.as_str() != "last-event-id" {
            out = out.header(name, v);
        }
    }
    let is_sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if is_sse {
        let stream = sse_rewrite(resp.bytes_stream(), live);
        return out
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| json_response(StatusCode::BAD_GATEWAY, Vec::new()));
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    let bytes = rewrite_json(&live, bytes);
    out.body(Body::from(bytes))
        .unwrap_or_else(|_| json_response(StatusCode::BAD_GATEWAY, Vec::new()))
}

fn rewrite_json(live: &Live, bytes: Bytes) -> Bytes {
    if bytes.is_empty() {
        return bytes;
    }
    let r = live
        .session
        .lock()
        .map(|mut s| s.from_server(&bytes, Instant::now()));
    match r {
        Ok(Ok((replacement, events))) => {
            record(live, events);
            replacement.map(Bytes::from).unwrap_or(bytes)
        }
        // Not JSON-RPC (an HTML error page, say): the host gets it as the server sent it, with its status.
        _ => bytes,
    }
}

/// Rewrites one SSE event (its lines, without the blank line that ends it); `None` keeps it as it is.
fn rewrite_event(live: &Live, event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    let payload = data.join("\n");
    let r = live
        .session
        .lock()
        .map(|mut s| s.from_server(payload.as_bytes(), Instant::now()));
    match r {
        Ok(Ok((replacement, events))) => {
            record(live, events);
            let bytes = replacement?;
            let text = String::from_utf8(bytes).ok()?;
            let mut out: Vec<String> = event
                .lines()
                .filter(|l| !l.starts_with("data:"))
                .map(str::to_string)
                .collect();
            out.push(format!("data: {}", text.trim_end()));
            Some(out.join("\n"))
        }
        _ => None,
    }
}

fn sse_rewrite(
    upstream: impl futures::Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    live: Arc<Live>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let mut buf: Vec<u8> = Vec::new();
    upstream.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        buf.extend_from_slice(&chunk);
        let mut out = Vec::new();
        // Complete events end with a blank line; whatever follows the last one waits for more bytes.
        while let Some((end, sep)) = find_event_end(&buf) {
            let event = String::from_utf8_lossy(&buf[..end]).into_owned();
            match rewrite_event(&live, &event) {
                Some(new) => out.extend_from_slice(new.as_bytes()),
                None => out.extend_from_slice(&buf[..end]),
            }
            out.extend_from_slice(&buf[end..end + sep]);
            buf.drain(..end + sep);
        }
        Ok(Bytes::from(out))
    })
}

/// Where the first complete SSE event ends and how long its terminating blank line is.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_the_first_blank_line_of_either_spelling() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }

    #[test]
    fn a_listing_in_an_sse_event_is_rewritten_and_other_fields_kept() {
        let live = Live {
            session: Mutex::new(Session::new(SessionConfig {
                rewrites: [("a".to_string(), "New.".to_string())].into(),
                ..SessionConfig::default()
            })),
            recorder: Mutex::new(None),
            writer: Mutex::new(None),
        };
        if let Ok(mut s) = live.session.lock() {
            s.from_host(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
                Instant::now(),
            );
        }
        let event = "id: 7\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"a\",\"description\":\"Old.\"}]}}";
        let new = rewrite_event(&live, event).expect("rewritten");
        assert!(new.starts_with("id: 7\nevent: message\ndata: {"), "{new}");
        assert!(new.contains("\"New.\"") && !new.contains("Old."), "{new}");
        assert_eq!(rewrite_event(&live, ": a comment"), None);
    }

    #[test]
    fn mcp_headers_cross_and_the_hosts_credentials_do_not() {
        for h in [
            "mcp-session-id",
            "mcp-protocol-version",
            "mcp-method",
            "mcp-name",
            "mcp-param-region",
            "content-type",
            "last-event-id",
        ] {
            assert!(forwarded(&HeaderName::from_static(h)), "{h}");
        }
        for h in ["authorization", "cookie", "host", "connection", "x-mcp-foo"] {
            assert!(!forwarded(&HeaderName::from_static(h)), "{h}");
        }
    }

    #[test]
    fn the_recorded_upstream_has_no_credentials_or_query() {
        assert_eq!(
            upstream_name("http://user:pw@127.0.0.1:8080/mcp?key=secret"),
            "http://127.0.0.1:8080/mcp"
        );
    }
}

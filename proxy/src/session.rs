//! What the proxy knows about one client session, built from the JSON-RPC messages passing through it: the pure
//! part of the proxy (no IO, no clock of its own: callers pass the instant a message was read).
//!
//! Messages are forwarded as the bytes that came in. Only a `tools/list` result whose tools the proxy rewrites is
//! serialised again (keys keep their order: serde_json's `preserve_order`), so everything the proxy does not need to
//! change reaches the other side exactly as it was written, whatever protocol revision the two sides speak.

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};
use tooltune_core::{DescriptionId, ToolAnnotations, ToolSpec};

/// How much of each call is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordMode {
    /// Nothing: the proxy only rewrites descriptions.
    None,
    /// Tool, description version, arguments, error flag and latency.
    #[default]
    Calls,
    /// Also the results.
    Full,
}

/// What the session asked of the proxy.
#[derive(Debug, Clone, Default)]
pub struct SessionConfig {
    /// Tool name to the description the host is shown instead of the server's.
    pub rewrites: BTreeMap<String, String>,
    /// How much is recorded.
    pub record: RecordMode,
    /// Argument keys (at any depth) whose values are never stored.
    pub redact: Vec<String>,
}

/// Something the session learnt, for the recorder.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The host's `clientInfo` (from `initialize`).
    Client(Value),
    /// The revision the server answered `initialize` with.
    ProtocolVersion(String),
    /// The tools the host was shown, by name.
    Tools(BTreeMap<String, Shown>),
    /// A complete list of tools (no further page) lacked tools that the rewrites name.
    MissingTools(Vec<String>),
    /// A finished `tools/call` (boxed: it is several times the size of the other events).
    Call(Box<Call>),
}

/// A tool as the host was shown it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// The description shown (rewritten or the server's own).
    pub description: String,
    /// Its version id.
    pub id: DescriptionId,
    /// The behaviour hints the server declared for it (`annotations`; empty when it declared none). Recorded as
    /// what the server claims: hosts read them to decide what needs the user's confirmation, so a variant's
    /// effect on calls is read beside them.
    pub annotations: ToolAnnotations,
}

/// A finished `tools/call`, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Order in the session, from 0.
    pub seq: u64,
    /// The tool called.
    pub tool: String,
    /// The description version shown for it, when the session listed tools first.
    pub description_id: Option<DescriptionId>,
    /// Arguments with redacted keys replaced (`None` with [`RecordMode::None`]).
    pub arguments: Option<Value>,
    /// The result had `isError: true`, or the call got a JSON-RPC error.
    pub is_error: bool,
    /// The JSON-RPC error object.
    pub rpc_error: Option<Value>,
    /// Request read from the host to response read from the server.
    pub latency: Duration,
    /// The result, with [`RecordMode::Full`].
    pub result: Option<Value>,
}

/// What to do with a line the host sent.
#[derive(Debug, Clone, PartialEq)]
pub enum FromHost {
    /// Forward it to the server unchanged.
    Forward,
    /// Do not forward; send this reply to the host instead (the line was not JSON).
    Reply(Vec<u8>),
}

#[derive(Debug, Clone)]
enum Pending {
    Initialize,
    ListTools,
    Call {
        seq: u64,
        tool: String,
        arguments: Value,
        at: Instant,
    },
    Other,
}

/// A request the host is waiting on.
#[derive(Debug, Clone)]
struct Waiting {
    id: Value,
    what: Pending,
    at: Instant,
}

/// One session's state.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    /// Requests from the host not yet answered, by their id's JSON text.
    pending: HashMap<String, Waiting>,
    /// Tools shown in the current listing, gathered over its pages.
    shown: BTreeMap<String, Shown>,
    next_seq: u64,
    /// Ids the proxy already answered with a timeout error.
    timed_out: HashSet<String>,
}

/// The JSON-RPC error the host gets when the proxy, not the server, answers.
pub fn error_reply(id: &Value, code: i64, message: &str) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
    .unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// JSON-RPC's code for a line that is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// The code the proxy answers with when the server cannot (it exited, or did not answer in time).
pub const UPSTREAM_ERROR: i64 = -32603;

fn id_key(id: &Value) -> String {
    id.to_string()
}

fn messages(v: &Value) -> Vec<&Value> {
    // A JSON-RPC batch (protocol revision 2025-03-26 allowed them) is an array of messages.
    match v {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

fn redact(v: &mut Value, keys: &[String]) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if keys.iter().any(|r| r == k) {
                    *x = Value::String("[redacted]".into());
                } else {
                    redact(x, keys);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact(x, keys)),
        _ => {}
    }
}

impl Session {
    /// A session with nothing seen yet.
    pub fn new(config: SessionConfig) -> Self {
        Session {
            config,
            pending: HashMap::new(),
            shown: BTreeMap::new(),
            next_seq: 0,
            timed_out: HashSet::new(),
        }
    }

    /// A line from the host (without or with its newline).
    pub fn from_host(&mut self, line: &[u8], at: Instant) -> (FromHost, Vec<Event>) {
        let text = trim_newline(line);
        if text.iter().all(u8::is_ascii_whitespace) {
            return (FromHost::Forward, Vec::new());
        }
        let v: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => {
                return (
                    FromHost::Reply(error_reply(
                        &Value::Null,
                        PARSE_ERROR,
                        &format!("tooltune proxy: the message is not JSON ({e}); not forwarded"),
                    )),
                    Vec::new(),
                );
            }
        };
        let mut events = Vec::new();
        for m in messages(&v) {
            let (Some(method), Some(id)) = (m.get("method").and_then(Value::as_str), m.get("id"))
            else {
                // Notifications and the host's responses to server requests: nothing to track.
                continue;
            };
            let what = match method {
                "initialize" => {
                    if let Some(c) = m.pointer("/params/clientInfo") {
                        events.push(Event::Client(c.clone()));
                    }
                    Pending::Initialize
                }
                "tools/list" => {
                    // A listing without a cursor starts over (after `list_changed`, say).
                    if m.pointer("/params/cursor").is_none() {
                        self.shown.clear();
                    }
                    Pending::ListTools
                }
                "tools/call" => {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    Pending::Call {
                        seq,
                        tool: m
                            .pointer("/params/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        arguments: m
                            .pointer("/params/arguments")
                            .cloned()
                            .unwrap_or(Value::Null),
                        at,
                    }
                }
                _ => Pending::Other,
            };
            self.pending.insert(
                id_key(id),
                Waiting {
                    id: id.clone(),
                    what,
                    at,
                },
            );
        }
        (FromHost::Forward, events)
    }

    /// A line from the server. Returns the bytes to send the host instead when the line was changed (`None`:
    /// forward it as it is), or `Err` with a reason when the line must not reach the host (it is not JSON, or it
    /// answers a request the proxy already failed for timing out).
    pub fn from_server(
        &mut self,
        line: &[u8],
        at: Instant,
    ) -> Result<(Option<Vec<u8>>, Vec<Event>), String> {
        let text = trim_newline(line);
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok((None, Vec::new()));
        }
        let mut v: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        let mut events = Vec::new();
        if let Some(id) = v.get("id")
            && v.get("method").is_none()
            && self.timed_out.remove(&id_key(id))
        {
            return Err(format!(
                "a late answer to request {id}, which the host was already told had timed out"
            ));
        }
        let mut changed = false;
        let items: Vec<&mut Value> = match &mut v {
            Value::Array(a) => a.iter_mut().collect(),
            other => vec![other],
        };
        for m in items {
            if m.get("method").is_some() {
                // A request or notification from the server (sampling, progress, list_changed...): forwarded.
                continue;
            }
            let Some(id) = m.get("id") else { continue };
            let Some(waiting) = self.pending.remove(&id_key(id)) else {
                continue;
            };
            match waiting.what {
                Pending::Initialize => {
                    if let Some(p) = m.pointer("/result/protocolVersion").and_then(Value::as_str) {
                        events.push(Event::ProtocolVersion(p.to_string()));
                    }
                }
                Pending::ListTools => {
                    changed |= self.rewrite_listing(m, &mut events);
                }
                Pending::Call {
                    seq,
                    tool,
                    mut arguments,
                    at: started,
                } => {
                    if self.config.record == RecordMode::None {
                        continue;
                    }
                    let rpc_error = m.get("error").cloned();
                    let is_error = rpc_error.is_some()
                        || m.pointer("/result/isError").and_then(Value::as_bool) == Some(true);
                    redact(&mut arguments, &self.config.redact);
                    let mut result = match self.config.record {
                        RecordMode::Full => m.get("result").cloned(),
                        _ => None,
                    };
                    if let Some(r) = result.as_mut() {
                        redact(r, &self.config.redact);
                    }
                    events.push(Event::Call(Box::new(Call {
                        seq,
                        description_id: self.shown.get(&tool).map(|t| t.id.clone()),
                        tool,
                        arguments: Some(arguments),
                        is_error,
                        rpc_error,
                        latency: at.saturating_duration_since(started),
                        result,
                    })));
                }
                Pending::Other => {}
            }
        }
        if !changed {
            return Ok((None, events));
        }
        let mut bytes = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
        bytes.extend_from_slice(line_ending(line));
        Ok((Some(bytes), events))
    }

    /// Rewrites the descriptions of one `tools/list` result in place; true when anything changed.
    fn rewrite_listing(&mut self, m: &mut Value, events: &mut Vec<Event>) -> bool {
        let mut changed = false;
        let last_page = m.pointer("/result/nextCursor").is_none_or(Value::is_null);
        let Some(tools) = m.pointer_mut("/result/tools").and_then(Value::as_array_mut) else {
            return false;
        };
        for t in tools.iter_mut() {
            let Some(name) = t.get("name").and_then(Value::as_str).map(str::to_string) else {
                continue;
            };
            if let Some(text) = self.config.rewrites.get(&name)
                && t.get("description").and_then(Value::as_str) != Some(text.as_str())
            {
                t["description"] = Value::String(text.clone());
                changed = true;
            }
            let spec = ToolSpec {
                name: name.clone(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                input_schema: t
                    .get("inputSchema")
                    .cloned()
                    .unwrap_or_else(|| json!({}))
                    .into(),
            };
            let id = spec.description_id();
            let annotations = t
                .get("annotations")
                .map(ToolAnnotations::from_mcp)
                .unwrap_or_default();
            self.shown.insert(
                name,
                Shown {
                    description: spec.description,
                    id,
                    annotations,
                },
            );
        }
        if last_page {
            events.push(Event::Tools(self.shown.clone()));
            let missing: Vec<String> = self
                .config
                .rewrites
                .keys()
                .filter(|k| !self.shown.contains_key(*k))
                .cloned()
                .collect();
            if !missing.is_empty() {
                events.push(Event::MissingTools(missing));
            }
        }
        changed
    }

    /// Stops waiting for these requests (the proxy answered them itself).
    pub fn forget(&mut self, ids: &[Value]) {
        for id in ids {
            self.pending.remove(&id_key(id));
        }
    }

    /// Takes over the requests another session object was tracking (over HTTP, the initialize is tracked before
    /// the server has named the session).
    pub fn adopt_pending(&mut self, other: &mut Session) {
        self.pending.extend(other.pending.drain());
        self.next_seq = self.next_seq.max(other.next_seq);
    }

    /// Takes every request still waiting for an answer, e.g. to answer them with errors when the server exits.
    pub fn take_pending(&mut self) -> Vec<Value> {
        self.pending.drain().map(|(_, w)| w.id).collect()
    }

    /// Takes the requests waiting since before `deadline`, so that the host can be told they timed out. The
    /// server's late answer to one is then not forwarded: the host has had its answer for that id.
    pub fn take_older_than(&mut self, deadline: Instant) -> Vec<Value> {
        let old: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, w)| w.at < deadline)
            .map(|(k, _)| k.clone())
            .collect();
        old.into_iter()
            .filter_map(|k| {
                let w = self.pending.remove(&k)?;
                self.timed_out.insert(k);
                Some(w.id)
            })
            .collect()
    }
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let l = line.strip_suffix(b"\n").unwrap_or(line);
    l.strip_suffix(b"\r").unwrap_or(l)
}

fn line_ending(line: &[u8]) -> &'static [u8] {
    if line.ends_with(b"\r\n") {
        b"\r\n"
    } else if line.ends_with(b"\n") {
        b"\n"
    } else {
        b""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(record: RecordMode) -> Session {
        Session::new(SessionConfig {
            rewrites: [("search_docs".to_string(), "New text.".to_string())].into(),
            record,
            redact: vec!["token".into()],
        })
    }

    fn line(v: Value) -> Vec<u8> {
        let mut b = serde_json::to_vec(&v).expect("json");
        b.push(b'\n');
        b
    }

    #[test]
    fn a_listing_is_rewritten_and_everything_else_passes_unchanged() {
        let mut s = session(RecordMode::Calls);
        let t = Instant::now();
        let (f, _) = s.from_host(
            &line(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})),
            t,
        );
        assert_eq!(f, FromHost::Forward);
        let listing = json!({"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"search_docs","description":"Old.","inputSchema":{"type":"object"},
             "annotations":{"title":"Search","readOnlyHint":true,"openWorldHint":false}},
            {"name":"web_search","description":"Web.","inputSchema":{"type":"object"}}]}});
        let (out, events) = s.from_server(&line(listing), t).expect("json");
        let out: Value = serde_json::from_slice(&out.expect("rewritten")).expect("json");
        assert_eq!(out["result"]["tools"][0]["description"], "New text.");
        assert_eq!(out["result"]["tools"][1]["description"], "Web.");
        let Some(Event::Tools(tools)) = events.first() else {
            panic!("no tools event: {events:?}")
        };
        assert_eq!(tools["search_docs"].description, "New text.");
        // The server's hints are kept as it declared them; a tool without any has none.
        assert_eq!(
            tools["search_docs"].annotations,
            ToolAnnotations {
                read_only_hint: Some(true),
                open_world_hint: Some(false),
                ..Default::default()
            }
        );
        assert!(tools["web_search"].annotations.is_empty());
        // A response to another request, a notification and a server request pass unchanged.
        s.from_host(&line(json!({"jsonrpc":"2.0","id":"p","method":"ping"})), t);
        for m in [
            json!({"jsonrpc":"2.0","id":"p","result":{}}),
            json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
            json!({"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{}}),
        ] {
            assert_eq!(s.from_server(&line(m), t).expect("json").0, None);
        }
    }

    #[test]
    fn calls_are_recorded_with_the_version_shown_latency_errors_and_redaction() {
        let mut s = session(RecordMode::Full);
        let t0 = Instant::now();
        s.from_host(
            &line(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})),
            t0,
        );
        s.from_server(
            &line(json!({"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_docs","description":"Old."}]}})),
            t0,
        )
        .expect("json");
        s.from_host(
            &line(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search_docs","arguments":{"q":"x","auth":{"token":"s3cret"}}}})),
            t0,
        );
        s.from_host(
            &line(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope","arguments":{}}})),
            t0,
        );
        let t1 = t0 + Duration::from_millis(7);
        let (_, ev) = s
            .from_server(
                &line(json!({"jsonrpc":"2.0","id":2,"result":{"content":[],"isError":true}})),
                t1,
            )
            .expect("json");
        let Some(Event::Call(c)) = ev.first() else {
            panic!("{ev:?}")
        };
        assert_eq!(
            (c.seq, c.tool.as_str(), c.is_error),
            (0, "search_docs", true)
        );
        assert_eq!(c.latency, Duration::from_millis(7));
        assert!(c.description_id.is_some());
        assert_eq!(
            c.arguments.as_ref().expect("args")["auth"]["token"],
            "[redacted]"
        );
        assert!(c.result.is_some());
        let (_, ev) = s
            .from_server(
                &line(json!({"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"unknown tool"}})),
                t1,
            )
            .expect("json");
        let Some(Event::Call(c)) = ev.first() else {
            panic!("{ev:?}")
        };
        assert!(c.is_error && c.rpc_error.is_some() && c.description_id.is_none());
        assert_eq!(c.seq, 1);
    }

    #[test]
    fn a_listing_without_a_rewritten_tool_says_so_and_garbage_is_refused_both_ways() {
        let mut s = session(RecordMode::Calls);
        let t = Instant::now();
        s.from_host(
            &line(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})),
            t,
        );
        let (_, ev) = s
            .from_server(
                &line(json!({"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"other"}]}})),
                t,
            )
            .expect("json");
        assert!(ev.contains(&Event::MissingTools(vec!["search_docs".into()])));
        let (f, _) = s.from_host(b"not json\n", t);
        let FromHost::Reply(r) = f else {
            panic!("forwarded garbage")
        };
        let r: Value = serde_json::from_slice(&r).expect("json");
        assert_eq!(r["error"]["code"], PARSE_ERROR);
        assert!(s.from_server(b"a log line on stdout\n", t).is_err());
    }

    #[test]
    fn batches_are_tracked_and_pending_requests_can_be_failed() {
        let mut s = session(RecordMode::Calls);
        let t = Instant::now();
        s.from_host(
            &line(json!([{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}])),
            t,
        );
        let (out, _) = s
            .from_server(
                &line(json!([{"jsonrpc":"2.0","id":2,"result":{}},{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"search_docs","description":"x"}]}}])),
                t,
            )
            .expect("json");
        let out: Value = serde_json::from_slice(&out.expect("rewritten")).expect("json");
        assert_eq!(out[1]["result"]["tools"][0]["description"], "New text.");
        s.from_host(&line(json!({"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"search_docs"}})), t);
        assert!(s.take_older_than(t).is_empty());
        assert_eq!(
            s.take_older_than(t + Duration::from_secs(1)),
            vec![json!("slow")]
        );
        assert!(s.take_pending().is_empty());
        let late = s.from_server(&line(json!({"jsonrpc":"2.0","id":"slow","result":{}})), t);
        assert!(late.is_err(), "a late answer must not reach the host twice");
    }
}

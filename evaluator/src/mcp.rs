//! The evaluator's MCP client: one long-lived connection per server, over stdio or Streamable HTTP.
//!
//! Starting a server costs far more than calling it (0.3-1 s for Node and Python servers against well
//! under a millisecond per `tools/call`), so an [`McpServer`] is opened once and serves many rollouts, and a
//! [`ServerPool`] hands the same one to every rollout that names the same server. Child processes start
//! with a cleared environment plus what the suite names, so a server never sees the host's secrets, and
//! are killed when the handle is dropped.
//!
//! Protocol eras: 2026-07-28 servers are reached with `server/discover`, older ones with the `initialize`
//! handshake. With [`ProtocolPref::Auto`] the first connection probes (discover, falling back to
//! initialize) and the version that worked is remembered, in memory and through
//! [`McpServer::negotiated_protocol`] / [`ServerPool::protocol_choices`] for the caller to persist, so a
//! restart goes straight to the right handshake.
//!
//! Failures are sorted for the caller: a tool's `isError` result is a normal [`CallOutcome`]; a JSON-RPC
//! refusal of the call is [`EvalError::ToolRejected`]; a dead server, a timeout or a transport failure is
//! infrastructure ([`EvalError::is_infrastructure`]). A call never restarts a server behind the caller's
//! back, so a rollout never spans two server processes: the caller records the infrastructure error and
//! calls [`McpServer::ensure_connected`] (or [`McpServer::restart`]) before the next rollout.

use crate::EvalError;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, ProtocolVersion, ResourceContents,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tooltune_core::ToolSpec;

/// How many stderr lines of a child server are kept for error messages.
const STDERR_TAIL_LINES: usize = 20;

/// How to reach a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Transport {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        /// The program. A bare name (no `/`) is looked up on the host's `PATH`, since the child's own
        /// environment is cleared and usually has no `PATH`.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// The child's entire environment (it starts from an empty one).
        env: BTreeMap<String, String>,
        /// Host environment variables copied into the child's environment by name, for secrets a server
        /// needs; a name that is unset on the host is an error at start-up.
        pass_env: Vec<String>,
        /// Working directory of the child (default: the host's).
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The endpoint URL, e.g. `http://127.0.0.1:8000/mcp`.
        url: String,
        /// Name of the environment variable holding a bearer token, if the server needs one. The token
        /// is read when connecting and never logged or stored.
        bearer_token_env: Option<String>,
    },
    /// No server: the tools a catalog suite declares in its file (`[[tool]]`, or `tools = "FILE.json"` in the
    /// `tools/list` shape), for tuning descriptions before a server runs, or for tools that exist only as published
    /// text (a benchmark's). Listing works as for a server; a call is refused ([`EvalError::CatalogOnly`]), so only
    /// first moves are scored (routing and selection).
    Catalog {
        /// The declared tools, in file order.
        tools: Vec<CatalogTool>,
    },
}

/// A tool a catalog suite declares: what `tools/list` would have said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogTool {
    /// The tool's name.
    pub name: String,
    /// Its description as published.
    pub description: String,
    /// Its input schema (an object schema).
    pub input_schema: Value,
    /// Its behaviour hints, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolHints>,
}

/// Which protocol revision to speak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtocolPref {
    /// Probe with `server/discover` (2026-07-28) and fall back to `initialize` (2025-11-25) when the
    /// server answers that it does not know discover. A server that never answers costs 10 s, once.
    Auto,
    /// Speak exactly this revision: `server/discover` for 2026-07-28 and later, `initialize` with this
    /// version before that.
    Version(String),
}

impl ProtocolPref {
    /// Parses a suite's `protocol` value: `auto` or a revision date rmcp knows.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(ProtocolPref::Auto);
        }
        let known = ProtocolVersion::KNOWN_VERSIONS;
        if known.iter().any(|v| v.as_str() == s) {
            Ok(ProtocolPref::Version(s.to_string()))
        } else {
            Err(format!(
                "unknown protocol {s:?}; use \"auto\" or one of {}",
                known
                    .iter()
                    .map(|v| format!("\"{}\"", v.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// Everything needed to open a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    /// A name for messages (the suite's name, or the command).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Which protocol revision to speak.
    pub protocol: ProtocolPref,
    /// How long the start-up and handshake may take.
    pub connect_timeout: Duration,
}

impl ServerSpec {
    /// A spec for a child process with an empty environment and [`ProtocolPref::Auto`].
    pub fn stdio(name: impl Into<String>, command: impl Into<String>, args: &[&str]) -> Self {
        ServerSpec {
            name: name.into(),
            transport: Transport::Stdio {
                command: command.into(),
                args: args.iter().map(|s| s.to_string()).collect(),
                env: BTreeMap::new(),
                pass_env: Vec::new(),
                cwd: None,
            },
            protocol: ProtocolPref::Auto,
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// A spec for a Streamable HTTP endpoint with no token and [`ProtocolPref::Auto`].
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        ServerSpec {
            name: name.into(),
            transport: Transport::Http {
                url: url.into(),
                bearer_token_env: None,
            },
            protocol: ProtocolPref::Auto,
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// The same spec speaking a fixed revision.
    pub fn with_protocol(mut self, protocol: ProtocolPref) -> Self {
        self.protocol = protocol;
        self
    }

    /// A stable key for the server this spec reaches (transport only: the name and the protocol
    /// preference do not make it another server). Used by [`ServerPool`] and for persisting protocol
    /// choices.
    pub fn key(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string(&self.transport).unwrap_or_default()
    }
}

/// What one `tools/call` returned.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    /// The result's content as text: text blocks joined by newlines; structured content as JSON when
    /// there is no text; other blocks as a short placeholder (`[image/png image]`).
    pub content_text: String,
    /// MCP's `isError`: the tool itself reported failure.
    pub is_error: bool,
    /// Round-trip time of the call.
    pub duration: Duration,
}

/// One live connection: the rmcp service, plus what is known about the process behind it.
struct Conn {
    service: RunningService<RoleClient, ClientConfig>,
    // Set when a call proved the server gone, before rmcp's own loop may have noticed the closed pipe,
    // so that `ensure_connected` restarts it at once.
    dead: AtomicBool,
    generation: u64,
    pid: Option<u32>,
    protocol: String,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Conn {
    fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
            && !self.service.peer().is_transport_closed()
            && !self.service.is_closed()
    }

    fn stderr_tail(&self) -> String {
        let tail = self
            .stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; last stderr lines:\n{tail}")
        }
    }
}

/// A handle on one MCP server, kept alive across rollouts. Cheap to share behind an [`Arc`]: calls take
/// `&self` and may run concurrently.
pub struct McpServer {
    spec: ServerSpec,
    conn: tokio::sync::RwLock<Option<Arc<Conn>>>,
    // Serialises restarts so that concurrent callers that all saw the same dead connection start one
    // replacement, not several.
    restart_lock: tokio::sync::Mutex<()>,
    negotiated: Mutex<Option<String>>,
    generation: AtomicU64,
    // The behaviour hints of the tools, as the last `tools/list` gave them.
    hints: Mutex<BTreeMap<String, ToolHints>>,
    // A fixture copy the server runs on, removed when the handle goes.
    scratch: Option<tempfile::TempDir>,
}

/// A tool's behaviour hints from `tools/list` (`annotations`, protocol revision 2025-03-26 and later): the
/// domain type, under the name the evaluator has always used. The specification calls them untrusted: a server may
/// say read-only and write anyway, which a fixture's digest catches. They travel with every stored trajectory
/// (`Trajectory::tool_annotations`).
pub type ToolHints = tooltune_core::ToolAnnotations;

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.spec.name)
            .field("negotiated", &self.negotiated_protocol())
            .field("restarts", &self.restarts())
            .finish()
    }
}

impl McpServer {
    /// Starts (or connects to) the server and completes the handshake.
    pub async fn connect(spec: ServerSpec) -> Result<Self, EvalError> {
        let server = McpServer {
            spec,
            conn: tokio::sync::RwLock::new(None),
            restart_lock: tokio::sync::Mutex::new(()),
            negotiated: Mutex::new(None),
            generation: AtomicU64::new(0),
            hints: Mutex::new(BTreeMap::new()),
            scratch: None,
        };
        // A catalog has nothing to start: its tools are in the spec.
        if let Some(tools) = server.catalog() {
            let hints = tools
                .iter()
                .filter_map(|t| Some((t.name.clone(), t.annotations?)))
                .filter(|(_, h)| !h.is_empty())
                .collect();
            if let Ok(mut h) = server.hints.lock() {
                *h = hints;
            }
            return Ok(server);
        }
        let conn = server.open().await?;
        *server.conn.write().await = Some(Arc::new(conn));
        Ok(server)
    }

    /// The same handle, owning the scratch folder (a fixture copy) its server runs on: the folder is removed
    /// when the handle is dropped.
    pub fn keeping(mut self, scratch: tempfile::TempDir) -> Self {
        self.scratch = Some(scratch);
        self
    }

    /// The scratch folder the server runs on, when it runs on a fixture copy.
    pub fn scratch_dir(&self) -> Option<&std::path::Path> {
        self.scratch.as_ref().map(tempfile::TempDir::path)
    }

    /// The tools' behaviour hints from the last [`McpServer::list_tools`] (tools without annotations are absent).
    pub fn hints(&self) -> BTreeMap<String, ToolHints> {
        self.hints.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// The declared tools when this handle is a catalog's (no server behind it).
    pub fn catalog(&self) -> Option<&[CatalogTool]> {
        match &self.spec.transport {
            Transport::Catalog { tools } => Some(tools),
            _ => None,
        }
    }

    /// The spec this handle was opened with.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// The server's name, for messages.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The protocol revision the last successful handshake settled on (e.g. `2026-07-28`). Persist it
    /// and pass it back as [`ProtocolPref::Version`] to skip the probe next time.
    pub fn negotiated_protocol(&self) -> Option<String> {
        self.negotiated.lock().ok().and_then(|g| g.clone())
    }

    /// How many times the server has been (re)started after the first connection.
    pub fn restarts(&self) -> u64 {
        self.generation.load(Ordering::SeqCst).saturating_sub(1)
    }

    /// The process id of a child-process server, for diagnostics (and for tests that kill it).
    pub async fn pid(&self) -> Option<u32> {
        self.conn.read().await.as_ref().and_then(|c| c.pid)
    }

    /// Whether the connection is up: the transport is open and the child (if any) has not exited.
    pub async fn is_alive(&self) -> bool {
        if self.catalog().is_some() {
            return true;
        }
        self.conn
            .read()
            .await
            .as_ref()
            .is_some_and(|c| c.is_alive())
    }

    /// Makes sure the server is up, restarting it if it died. Call before each rollout.
    pub async fn ensure_connected(&self) -> Result<(), EvalError> {
        if self.is_alive().await {
            return Ok(());
        }
        self.restart().await
    }

    /// Stops the current process or connection (if any) and opens a new one, reusing the protocol
    /// revision that worked before.
    pub async fn restart(&self) -> Result<(), EvalError> {
        if self.catalog().is_some() {
            return Ok(());
        }
        let seen = self.current_generation().await;
        let _guard = self.restart_lock.lock().await;
        // Another caller restarted while this one waited: that replacement is good enough when alive.
        if self.current_generation().await != seen && self.is_alive().await {
            return Ok(());
        }
        let old = self.conn.write().await.take();
        if let Some(old) = old {
            close_conn(old).await;
        }
        let conn = self.open().await?;
        *self.conn.write().await = Some(Arc::new(conn));
        Ok(())
    }

    /// Closes the connection and stops the child process, waiting (up to a few seconds) for it to exit.
    pub async fn shutdown(&self) {
        let old = self.conn.write().await.take();
        if let Some(old) = old {
            close_conn(old).await;
        }
    }

    async fn current_generation(&self) -> u64 {
        self.conn
            .read()
            .await
            .as_ref()
            .map(|c| c.generation)
            .unwrap_or(0)
    }

    async fn live_conn(&self) -> Result<Arc<Conn>, EvalError> {
        let guard = self.conn.read().await;
        match guard.as_ref() {
            Some(c) if c.is_alive() => Ok(c.clone()),
            Some(c) => Err(EvalError::ServerDied {
                server: self.spec.name.clone(),
                message: format!("the connection is closed{}", c.stderr_tail()),
            }),
            None => Err(EvalError::ServerDied {
                server: self.spec.name.clone(),
                message: "not connected (shut down, or a restart failed)".into(),
            }),
        }
    }

    /// Lists every tool the server offers (all pages), as the model would see them before any candidate
    /// description is applied.
    pub async fn list_tools(&self) -> Result<Vec<ToolSpec>, EvalError> {
        if let Some(tools) = self.catalog() {
            return Ok(tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    input_schema: Arc::new(t.input_schema.clone()),
                })
                .collect());
        }
        let conn = self.live_conn().await?;
        let tools = tokio::time::timeout(
            self.spec.connect_timeout,
            conn.service.peer().list_all_tools(),
        )
        .await
        .map_err(|_| EvalError::Timeout {
            server: self.spec.name.clone(),
            tool: "tools/list".into(),
            after: self.spec.connect_timeout,
        })?
        .map_err(|e| self.classify(e, &conn, "tools/list"))?;
        // An `annotations` object without any hint (a title alone) says nothing about behaviour: left out, so that
        // "absent" means one thing in the map and in stored trajectories.
        let hints: BTreeMap<String, ToolHints> = tools
            .iter()
            .filter_map(|t| {
                let a = t.annotations.as_ref()?;
                let h = ToolHints {
                    read_only_hint: a.read_only_hint,
                    destructive_hint: a.destructive_hint,
                    idempotent_hint: a.idempotent_hint,
                    open_world_hint: a.open_world_hint,
                };
                (!h.is_empty()).then(|| (t.name.to_string(), h))
            })
            .collect();
        if let Ok(mut h) = self.hints.lock() {
            *h = hints;
        }
        Ok(tools
            .into_iter()
            .map(|t| ToolSpec {
                name: t.name.to_string(),
                description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                input_schema: Value::Object((*t.input_schema).clone()).into(),
            })
            .collect())
    }

    /// Calls a tool with JSON-object arguments, waiting at most `timeout`. A timed-out call is cancelled
    /// on the server (`notifications/cancelled`).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<CallOutcome, EvalError> {
        let arguments = match arguments {
            Value::Object(m) => m,
            // Models send `null` for tools without parameters.
            Value::Null => serde_json::Map::new(),
            other => {
                return Err(EvalError::ToolRejected {
                    server: self.spec.name.clone(),
                    tool: name.to_string(),
                    message: format!("arguments must be a JSON object, got {other}"),
                });
            }
        };
        if self.catalog().is_some() {
            return Err(EvalError::CatalogOnly {
                suite: self.spec.name.clone(),
                what: format!("calling tool `{name}`"),
            });
        }
        let conn = self.live_conn().await?;
        let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, conn.service.peer().call_tool(params)).await;
        let duration = started.elapsed();
        match result {
            Err(_) => Err(EvalError::Timeout {
                server: self.spec.name.clone(),
                tool: name.to_string(),
                after: timeout,
            }),
            Ok(Err(e)) => Err(self.classify(e, &conn, name)),
            Ok(Ok(r)) => Ok(CallOutcome {
                content_text: content_text(&r),
                is_error: r.is_error.unwrap_or(false),
                duration,
            }),
        }
    }

    fn classify(&self, e: ServiceError, conn: &Conn, tool: &str) -> EvalError {
        let server = self.spec.name.clone();
        let stdio = matches!(self.spec.transport, Transport::Stdio { .. });
        let died = |message: String| {
            conn.dead.store(true, Ordering::SeqCst);
            EvalError::ServerDied {
                server: server.clone(),
                message: format!("{message}{}", conn.stderr_tail()),
            }
        };
        match e {
            ServiceError::McpError(data) => EvalError::ToolRejected {
                server,
                tool: tool.to_string(),
                message: format!("{} ({})", data.message, data.code.0),
            },
            ServiceError::Timeout { timeout } => EvalError::Timeout {
                server,
                tool: tool.to_string(),
                after: timeout,
            },
            ServiceError::TransportClosed | ServiceError::Cancelled { .. } => {
                died(format!("the connection closed during `{tool}`"))
            }
            // A failed write to a child's stdin means the child is gone (broken pipe), even when rmcp's
            // reader has not yet seen the end of its stdout.
            ServiceError::TransportSend(err) if stdio || !conn.is_alive() => {
                died(format!("sending `{tool}` failed: {err}"))
            }
            ServiceError::TransportSend(err) => EvalError::Transport {
                server,
                message: format!("sending `{tool}` failed: {err}"),
            },
            other => EvalError::Protocol {
                server,
                message: format!("`{tool}`: {other}"),
            },
        }
    }

    async fn open(&self) -> Result<Conn, EvalError> {
        let remembered = self.negotiated_protocol();
        let pref = match (&self.spec.protocol, remembered) {
            (ProtocolPref::Auto, Some(v)) => ProtocolPref::Version(v),
            (p, _) => p.clone(),
        };
        let (lifecycle, client) = lifecycle_for(&pref);
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let name = self.spec.name.clone();
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let handshake = async {
            match &self.spec.transport {
                Transport::Stdio {
                    command,
                    args,
                    env,
                    pass_env,
                    cwd,
                } => {
                    let (proc, pid) = spawn_child(
                        &name,
                        command,
                        args,
                        env,
                        pass_env,
                        cwd.as_deref(),
                        &stderr_tail,
                    )?;
                    let service =
                        client
                            .serve_with_lifecycle(proc, lifecycle)
                            .await
                            .map_err(|e| EvalError::Connect {
                                server: name.clone(),
                                message: format!("{e}{}", tail_text(&stderr_tail)),
                            })?;
                    Ok((service, pid))
                }
                Transport::Http {
                    url,
                    bearer_token_env,
                } => {
                    let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
                    if let Some(var) = bearer_token_env {
                        let token = std::env::var(var).map_err(|_| EvalError::MissingEnv {
                            var: var.clone(),
                            purpose: format!("bearer token for server `{name}`"),
                        })?;
                        config = config.auth_header(token);
                    }
                    let transport = StreamableHttpClientTransport::from_config(config);
                    let service = client
                        .serve_with_lifecycle(transport, lifecycle)
                        .await
                        .map_err(|e| EvalError::Connect {
                            server: name.clone(),
                            message: e.to_string(),
                        })?;
                    Ok((service, None))
                }
                Transport::Catalog { .. } => Err(EvalError::CatalogOnly {
                    suite: name.clone(),
                    what: "starting a server".into(),
                }),
            }
        };
        let (service, pid) = tokio::time::timeout(self.spec.connect_timeout, handshake)
            .await
            .map_err(|_| EvalError::Connect {
                server: name.clone(),
                message: format!(
                    "no handshake within {:?}{}",
                    self.spec.connect_timeout,
                    tail_text(&stderr_tail)
                ),
            })??;
        let protocol = service
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.as_str().to_string())
            .unwrap_or_default();
        if let Ok(mut n) = self.negotiated.lock()
            && !protocol.is_empty()
        {
            *n = Some(protocol.clone());
        }
        tracing::debug!(server = %name, %protocol, generation, "MCP server connected");
        Ok(Conn {
            service,
            dead: AtomicBool::new(false),
            generation,
            pid,
            protocol,
            stderr_tail,
        })
    }

    /// The protocol revision of the current connection, if connected.
    pub async fn protocol(&self) -> Option<String> {
        self.conn.read().await.as_ref().map(|c| c.protocol.clone())
    }
}

async fn close_conn(conn: Arc<Conn>) {
    // Another task may still hold the Arc for an in-flight call; then dropping our reference leaves the
    // close to the last holder (the drop guard cancels the service, which kills the child).
    if let Ok(conn) = Arc::try_unwrap(conn) {
        let mut service = conn.service;
        let _ = service.close_with_timeout(Duration::from_secs(5)).await;
    }
}

fn lifecycle_for(pref: &ProtocolPref) -> (ClientLifecycleMode, ClientConfig) {
    let base = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("tooltune", env!("CARGO_PKG_VERSION")),
    );
    match pref {
        ProtocolPref::Auto => (
            ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            },
            base.with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE),
        ),
        ProtocolPref::Version(v) => {
            let version = ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .find(|k| k.as_str() == v)
                .cloned()
                .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE);
            if version.has_initialize() {
                (
                    ClientLifecycleMode::Initialize,
                    base.with_protocol_version(version),
                )
            } else {
                (
                    ClientLifecycleMode::Discover {
                        preferred_versions: vec![version],
                    },
                    base,
                )
            }
        }
    }
}

fn tail_text(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    let t = tail
        .lock()
        .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
        .unwrap_or_default();
    if t.is_empty() {
        String::new()
    } else {
        format!("; last stderr lines:\n{t}")
    }
}

/// Looks a bare program name up on the host's PATH: the child's cleared environment has no PATH of its
/// own, and the OS would otherwise search only a default list.
fn resolve_program(command: &str) -> PathBuf {
    if command.contains('/') {
        return PathBuf::from(command);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(command);
            if is_executable(&candidate) {
                return candidate;
            }
        }
    }
    PathBuf::from(command)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn spawn_child(
    name: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    pass_env: &[String],
    cwd: Option<&Path>,
    stderr_tail: &Arc<Mutex<VecDeque<String>>>,
) -> Result<(TokioChildProcess, Option<u32>), EvalError> {
    let program = resolve_program(command);
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(args).env_clear().envs(env);
    for var in pass_env {
        let value = std::env::var_os(var).ok_or_else(|| EvalError::MissingEnv {
            var: var.clone(),
            purpose: format!("passed to server `{name}`"),
        })?;
        cmd.env(var, value);
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    // A backstop to rmcp's own clean-up: the process is killed even if the runtime is gone by the time
    // the handle drops.
    cmd.kill_on_drop(true);
    let (proc, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| EvalError::Spawn {
            server: name.to_string(),
            command: program.display().to_string(),
            message: e.to_string(),
        })?;
    let pid = proc.id();
    if let Some(stderr) = stderr {
        let tail = stderr_tail.clone();
        let server = name.to_string();
        // Drains stderr so a chatty server never blocks on a full pipe, keeping the last lines for error
        // messages.
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::trace!(server = %server, "stderr: {line}");
                if let Ok(mut t) = tail.lock() {
                    if t.len() == STDERR_TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
    }
    Ok((proc, pid))
}

fn content_text(r: &CallToolResult) -> String {
    let mut parts = Vec::new();
    for block in &r.content {
        match block {
            ContentBlock::Text(t) => parts.push(t.text.clone()),
            ContentBlock::Image(i) => parts.push(format!("[{} image]", i.mime_type)),
            ContentBlock::Audio(a) => parts.push(format!("[{} audio]", a.mime_type)),
            ContentBlock::Resource(res) => match &res.resource {
                ResourceContents::TextResourceContents { text, .. } => parts.push(text.clone()),
                ResourceContents::BlobResourceContents { uri, .. } => {
                    parts.push(format!("[binary resource {uri}]"))
                }
                _ => parts.push("[unsupported resource]".to_string()),
            },
            ContentBlock::ResourceLink(link) => parts.push(format!("[resource link {}]", link.uri)),
            #[allow(unreachable_patterns)]
            _ => parts.push("[unsupported content]".to_string()),
        }
    }
    if parts.is_empty()
        && let Some(s) = &r.structured_content
    {
        return s.to_string();
    }
    parts.join("\n")
}

/// Keeps one [`McpServer`] per distinct server so that every rollout that names it reuses the same
/// process or connection.
#[derive(Debug, Default)]
pub struct ServerPool {
    servers: tokio::sync::Mutex<HashMap<String, Arc<McpServer>>>,
    hints: Mutex<BTreeMap<String, String>>,
}

impl ServerPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty pool that already knows which protocol revision each server (by [`ServerSpec::key`])
    /// settled on, e.g. read back from the run directory: such servers skip the probe.
    pub fn with_protocol_choices(choices: BTreeMap<String, String>) -> Self {
        ServerPool {
            servers: Default::default(),
            hints: Mutex::new(choices),
        }
    }

    /// The server for `spec`, opened on first use, restarted when it has died since.
    pub async fn get(&self, spec: &ServerSpec) -> Result<Arc<McpServer>, EvalError> {
        let key = spec.key();
        let mut servers = self.servers.lock().await;
        if let Some(s) = servers.get(&key) {
            let s = s.clone();
            drop(servers);
            s.ensure_connected().await?;
            return Ok(s);
        }
        let mut spec = spec.clone();
        if spec.protocol == ProtocolPref::Auto
            && let Some(v) = self.hints.lock().ok().and_then(|h| h.get(&key).cloned())
        {
            spec.protocol = ProtocolPref::Version(v);
        }
        let server = Arc::new(McpServer::connect(spec).await?);
        if let (Some(v), Ok(mut h)) = (server.negotiated_protocol(), self.hints.lock()) {
            h.insert(key.clone(), v);
        }
        servers.insert(key, server.clone());
        Ok(server)
    }

    /// The protocol revision each server settled on, keyed by [`ServerSpec::key`], for persisting.
    pub async fn protocol_choices(&self) -> BTreeMap<String, String> {
        let mut out = self.hints.lock().map(|h| h.clone()).unwrap_or_default();
        for (k, s) in self.servers.lock().await.iter() {
            if let Some(v) = s.negotiated_protocol() {
                out.insert(k.clone(), v);
            }
        }
        out
    }

    /// Shuts every server down.
    pub async fn shutdown(&self) {
        let servers: Vec<_> = self.servers.lock().await.drain().collect();
        for (_, s) in servers {
            s.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_pref_parses_known_versions_only() {
        assert_eq!(ProtocolPref::parse("auto"), Ok(ProtocolPref::Auto));
        assert_eq!(
            ProtocolPref::parse("2025-11-25"),
            Ok(ProtocolPref::Version("2025-11-25".into()))
        );
        let e = ProtocolPref::parse("2026-13-01").expect_err("unknown");
        assert!(e.contains("\"2026-07-28\""), "{e}");
    }

    #[test]
    fn lifecycle_follows_the_era() {
        let (l, _) = lifecycle_for(&ProtocolPref::Version("2026-07-28".into()));
        assert!(matches!(l, ClientLifecycleMode::Discover { .. }));
        let (l, c) = lifecycle_for(&ProtocolPref::Version("2025-06-18".into()));
        assert!(matches!(l, ClientLifecycleMode::Initialize));
        assert_eq!(c.protocol_version.as_str(), "2025-06-18");
        let (l, _) = lifecycle_for(&ProtocolPref::Auto);
        assert!(matches!(l, ClientLifecycleMode::Auto { .. }));
    }

    #[test]
    fn bare_commands_resolve_on_the_host_path() {
        let sh = resolve_program("sh");
        assert!(sh.is_absolute(), "{}", sh.display());
        assert_eq!(resolve_program("./x"), PathBuf::from("./x"));
    }

    #[test]
    fn spec_key_ignores_name_and_protocol() {
        let a = ServerSpec::stdio("a", "srv", &["--x"]);
        let b = ServerSpec::stdio("b", "srv", &["--x"])
            .with_protocol(ProtocolPref::Version("2025-11-25".into()));
        assert_eq!(a.key(), b.key());
        assert_ne!(a.key(), ServerSpec::stdio("a", "srv", &["--y"]).key());
    }
}

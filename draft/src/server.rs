//! The server side of drafting, shared by `suite draft` and `suite from-traces`: starting the server (on a fixture
//! copy when one is given) and listing its tools, and running a reference call twice the way verification does
//! (a tool not read-only on a fresh fixture copy each time, a tool declared to write never without a fixture), with
//! the reason a failed call is dropped for.

use crate::DraftError;
use crate::outcome::DropReason;
use crate::tools::{self, Access};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tooltune_core::ToolSpec;
use tooltune_evaluator::fixture::{Fixture, Workspace};
use tooltune_evaluator::{EvalError, McpServer, ReferenceCall, ServerSpec, Transport};

/// A started server with its tools, as drafting and verification use it.
pub(crate) struct Opened {
    /// The spec servers are started with (see [`effective_spec`]).
    pub spec: ServerSpec,
    /// The fixture, loaded.
    pub fixture: Option<Fixture>,
    /// The server read-only calls share.
    pub main: Main,
    /// Its tools, in its order.
    pub tools: Vec<ToolSpec>,
    /// Each tool's access.
    pub access: BTreeMap<String, Access>,
    /// The protocol revision that worked.
    pub protocol: Option<String>,
}

/// Loads the fixture, checks that the command names it (and names none without one), starts the server and lists
/// its tools; a server with no tools is an error.
pub(crate) async fn open(
    server: &ServerSpec,
    fixture: Option<&Path>,
) -> Result<Opened, DraftError> {
    let fixture = match fixture {
        Some(p) => {
            let abs = p.canonicalize().map_err(|e| DraftError::Fixture {
                path: p.to_path_buf(),
                message: e.to_string(),
            })?;
            Some(Fixture::load(abs).map_err(|e| DraftError::Fixture {
                path: p.to_path_buf(),
                message: e.to_string(),
            })?)
        }
        None => None,
    };
    let fixture_named = serde_json::to_string(&server.transport)
        .unwrap_or_default()
        .contains(tooltune_evaluator::fixture::FIXTURE_VAR);
    match (&fixture, fixture_named) {
        (Some(_), false) => return Err(DraftError::FixtureUnused),
        (None, true) => return Err(DraftError::FixtureMissing),
        _ => {}
    }
    let spec = effective_spec(server, fixture.is_some());
    let main = Main::open(&spec, fixture.as_ref()).await?;
    let tools = match main.server().list_tools().await {
        Ok(t) => t,
        Err(e) => {
            main.close().await;
            return Err(start_error(&spec, e));
        }
    };
    if tools.is_empty() {
        main.close().await;
        return Err(DraftError::NoTools {
            server: command_line(server),
        });
    }
    let access = tools::access_map(&tools, &main.server().hints());
    let protocol = main.server().negotiated_protocol();
    Ok(Opened {
        spec,
        fixture,
        main,
        tools,
        access,
        protocol,
    })
}

/// The spec drafting starts servers with. With a fixture the server runs in its copy (`cwd = ${FIXTURE_DIR}`, as
/// the written suite says, so relative paths in tool results mean the same in eval), and arguments that name
/// existing paths are made absolute first, since they were given relative to where tooltune runs.
pub(crate) fn effective_spec(spec: &ServerSpec, fixture: bool) -> ServerSpec {
    let mut out = spec.clone();
    if let (
        true,
        Transport::Stdio {
            command, args, cwd, ..
        },
    ) = (fixture, &mut out.transport)
    {
        let abs = |w: &mut String| {
            if !w.contains("${")
                && w.contains('/')
                && let Ok(p) = Path::new(w.as_str()).canonicalize()
            {
                *w = p.to_string_lossy().into_owned();
            }
        };
        abs(command);
        args.iter_mut().for_each(abs);
        if cwd.is_none() {
            *cwd = Some(PathBuf::from(tooltune_evaluator::fixture::FIXTURE_VAR));
        }
    }
    out
}

/// The live server, or the fixture copy the read-only calls share.
pub(crate) enum Main {
    Live(McpServer),
    Copy(Workspace),
}

impl Main {
    async fn open(spec: &ServerSpec, fixture: Option<&Fixture>) -> Result<Main, DraftError> {
        match fixture {
            None => McpServer::connect(spec.clone())
                .await
                .map(Main::Live)
                .map_err(|e| start_error(spec, e)),
            Some(f) => Workspace::open(f, spec, None)
                .await
                .map(Main::Copy)
                .map_err(|e| start_error(spec, e)),
        }
    }

    pub(crate) fn server(&self) -> &McpServer {
        match self {
            Main::Live(s) => s,
            Main::Copy(w) => &w.server,
        }
    }

    pub(crate) async fn close(self) {
        match self {
            Main::Live(s) => s.shutdown().await,
            Main::Copy(w) => w.close().await,
        }
    }
}

/// The command line of a spec, for messages.
pub fn command_line(spec: &ServerSpec) -> String {
    match &spec.transport {
        Transport::Stdio { command, args, .. } => std::iter::once(command.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Transport::Http { url, .. } => url.clone(),
        Transport::Catalog { tools } => format!("a catalog of {} declared tools", tools.len()),
    }
}

pub(crate) fn start_error(spec: &ServerSpec, e: EvalError) -> DraftError {
    DraftError::ServerStart {
        command: command_line(spec),
        message: e.to_string(),
    }
}

/// Why a call failed: the drop reason, the details, and the start of the result when there was one.
pub(crate) type CallFailure = (DropReason, String, Option<String>);

/// What running reference calls needs: the server, its fixture and its tools' access.
pub(crate) struct Calls<'a> {
    pub spec: &'a ServerSpec,
    pub main: &'a McpServer,
    pub fixture: Option<&'a Fixture>,
    pub access: &'a BTreeMap<String, Access>,
    pub timeout: Duration,
}

impl Calls<'_> {
    /// Runs a reference call twice (on the shared server for a read-only tool, on two fresh fixture copies for
    /// one that may write); the two result texts, or why the call failed.
    pub(crate) async fn run_twice(
        &self,
        call: &ReferenceCall,
    ) -> Result<(String, String), CallFailure> {
        let Some(&access) = self.access.get(&call.tool) else {
            return Err((
                DropReason::UnknownTool,
                format!("`{}` is not a tool of this server", call.tool),
                None,
            ));
        };
        if access.explorable() || self.fixture.is_none() {
            if access == Access::Writes && self.fixture.is_none() {
                return Err((
                    DropReason::WritesWithoutFixture,
                    format!(
                        "`{}` declares that it writes and no --fixture was given, so it was not called",
                        call.tool
                    ),
                    None,
                ));
            }
            let a = self.run_one(self.main, call).await?;
            let b = self.run_one(self.main, call).await?;
            return Ok((a, b));
        }
        let Some(f) = self.fixture else {
            return Err((DropReason::ServerFailed, "no fixture".into(), None));
        };
        let mut out = Vec::new();
        for _ in 0..2 {
            let w = Workspace::open(f, self.spec, None)
                .await
                .map_err(|e| (DropReason::ServerFailed, e.to_string(), None))?;
            let r = self.run_one(&w.server, call).await;
            w.close().await;
            out.push(r?);
        }
        let b = out.pop().unwrap_or_default();
        let a = out.pop().unwrap_or_default();
        Ok((a, b))
    }

    /// Runs a chain of reference calls in order, as `suite check` runs a task's (all on one fixture copy when a
    /// tool of the chain may write): the result texts of the calls that succeeded, and why the next one failed
    /// (its index is the number of results), or `None` when all succeeded.
    pub(crate) async fn run_chain(
        &self,
        chain: &[ReferenceCall],
    ) -> (Vec<String>, Option<CallFailure>) {
        // The calls that can run at all: up to the first of a tool the server lacks, or one that writes without a
        // fixture to write on.
        let mut blocked = None;
        let mut writes = false;
        let mut runnable = chain.len();
        for (i, call) in chain.iter().enumerate() {
            let why = match self.access.get(&call.tool) {
                None => Some((
                    DropReason::UnknownTool,
                    format!("`{}` is not a tool of this server", call.tool),
                    None,
                )),
                Some(Access::Writes) if self.fixture.is_none() => Some((
                    DropReason::WritesWithoutFixture,
                    format!(
                        "`{}` declares that it writes and no --fixture was given, so it was not called",
                        call.tool
                    ),
                    None,
                )),
                Some(a) => {
                    writes |= !a.explorable();
                    None
                }
            };
            if why.is_some() {
                blocked = why;
                runnable = i;
                break;
            }
        }
        let copy = match (writes, self.fixture) {
            (true, Some(f)) => match Workspace::open(f, self.spec, None).await {
                Ok(w) => Some(w),
                Err(e) => {
                    return (
                        Vec::new(),
                        Some((DropReason::ServerFailed, e.to_string(), None)),
                    );
                }
            },
            _ => None,
        };
        let server = copy.as_ref().map_or(self.main, |w| &w.server);
        let mut out = Vec::new();
        let mut failed = blocked;
        for call in &chain[..runnable] {
            match self.run_one(server, call).await {
                Ok(text) => out.push(text),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(w) = copy {
            w.close().await;
        }
        (out, failed)
    }

    async fn run_one(
        &self,
        server: &McpServer,
        call: &ReferenceCall,
    ) -> Result<String, CallFailure> {
        match server
            .call_tool(&call.tool, call.arguments.clone(), self.timeout)
            .await
        {
            Ok(o) if o.is_error => Err((
                DropReason::ToolError,
                format!("`{}` answered with an error", call.tool),
                Some(o.content_text),
            )),
            Ok(o) if o.content_text.trim().is_empty() => Err((
                DropReason::EmptyResult,
                format!("`{}` returned nothing", call.tool),
                None,
            )),
            Ok(o) => Ok(o.content_text),
            Err(e @ EvalError::Timeout { .. }) => {
                let _ = server.ensure_connected().await;
                Err((
                    DropReason::Timeout,
                    format!("{e}; raise --call-timeout if the tool is slow"),
                    None,
                ))
            }
            Err(e @ EvalError::ToolRejected { .. }) => {
                Err((DropReason::Rejected, e.to_string(), None))
            }
            Err(e) => {
                let _ = server.ensure_connected().await;
                Err((DropReason::ServerFailed, e.to_string(), None))
            }
        }
    }
}

//! The evaluator: re-runs candidate tool descriptions against real MCP servers.
//!
//! This crate holds the MCP client ([`mcp`]: stdio and Streamable HTTP servers kept alive across rollouts,
//! both protocol eras, per-call timeouts, restarts) and the task suites ([`suite`]: a TOML format, its
//! loader with precise errors, and the pure checks that score a rollout), the host agent loop ([`host`]: the
//! model sees the candidate's descriptions, its calls go to the real server) and the evaluation of a candidate on
//! a suite ([`evaluate`]: scores, exact first-call probabilities, rollouts stored as trajectories), and two
//! evaluations of the same tasks compared with paired tests ([`compare`]).

pub mod compare;
pub mod evaluate;
pub mod fixture;
pub mod host;
pub mod mcp;
pub mod suite;

pub use evaluate::DEFAULT_FIRST_MOVE_SAMPLES;
pub use mcp::{
    CallOutcome, CatalogTool, McpServer, ProtocolPref, ServerPool, ServerSpec, ToolHints, Transport,
};
pub use suite::{
    AnswerCheck, CheckResult, CommandCheck, FileCheck, Provenance, ReferenceCall, Split, Suite,
    Task,
};

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in the evaluator.
///
/// [`EvalError::is_infrastructure`] separates failures of the machinery (a server that died, a timeout, a
/// broken transport: the rollout says nothing about the candidate) from the rest. A tool that reports
/// failure with MCP's `isError` is not an error at all: it is a [`CallOutcome`] with `is_error` set.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A suite file could not be read.
    // The IO error is part of the message and deliberately not a `source`: error chains print sources after
    // the message, which said the same thing twice.
    #[error("{}: cannot be read: {error}", file.display())]
    SuiteRead {
        /// The suite file.
        file: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// A suite file is malformed: names the file, the line when known, the task and the field.
    #[error("{}", suite_location(file, *line, task.as_deref(), field.as_deref(), message))]
    Suite {
        /// The suite file.
        file: PathBuf,
        /// 1-based line of the offending text, when the parser knows it.
        line: Option<usize>,
        /// The task, as "`id` (#n)" or "#n" (1-based index) when it has no usable id.
        task: Option<String>,
        /// The field, as a dotted path (`answer.regex`, `server.command`).
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A server process could not be started.
    #[error("server `{server}`: cannot start `{command}`: {message}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The command that failed.
        command: String,
        /// Why.
        message: String,
    },
    /// The protocol handshake (discover or initialize) failed or took too long.
    #[error("server `{server}`: cannot connect: {message}")]
    Connect {
        /// The server's name.
        server: String,
        /// Why, including the last lines the server wrote to stderr when it is a child process.
        message: String,
    },
    /// The server went away (process exited, connection closed) while in use or before it.
    #[error("server `{server}` died: {message}")]
    ServerDied {
        /// The server's name.
        server: String,
        /// What was seen, including the last lines the server wrote to stderr when it is a child process.
        message: String,
    },
    /// A tool call got no answer within its timeout.
    #[error("server `{server}`: tool `{tool}` did not answer within {after:?}")]
    Timeout {
        /// The server's name.
        server: String,
        /// The tool that was called.
        tool: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// The transport failed without the server being known to be dead (e.g. an HTTP error).
    #[error("server `{server}`: transport error: {message}")]
    Transport {
        /// The server's name.
        server: String,
        /// Why.
        message: String,
    },
    /// The server answered something the protocol does not allow here.
    #[error("server `{server}`: protocol error: {message}")]
    Protocol {
        /// The server's name.
        server: String,
        /// What was received.
        message: String,
    },
    /// The server refused a tool call with a JSON-RPC error (unknown tool, invalid arguments), or the
    /// arguments were not a JSON object. This is the caller's (the model's) doing, not infrastructure: the
    /// host shows the message to the model as a failed tool result.
    #[error("server `{server}` rejected the call of tool `{tool}`: {message}")]
    ToolRejected {
        /// The server's name.
        server: String,
        /// The tool that was called.
        tool: String,
        /// The server's message.
        message: String,
    },
    /// A candidate overrides the description of a tool the server does not have.
    #[error("no tool `{tool}` on the server (it has: {available})")]
    UnknownTool {
        /// The tool named by the candidate.
        tool: String,
        /// The server's tools.
        available: String,
    },
    /// The suite names no tool under study and none was given.
    #[error("suite `{suite}` names no tool under study: pass --target TOOL")]
    NoTarget {
        /// The suite name.
        suite: String,
    },
    /// Storing rollouts failed.
    #[error("storing rollouts: {0}")]
    Store(String),
    /// An environment variable the configuration names is not set. Its value is never shown.
    #[error("environment variable `{var}` ({purpose}) is not set")]
    MissingEnv {
        /// The variable's name.
        var: String,
        /// What it was needed for.
        purpose: String,
    },
    /// A suite's fixture cannot be read, digested or copied.
    #[error("fixture {}: {message}", path.display())]
    Fixture {
        /// The fixture (or the copy being made).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A suite's reset command failed between rollouts.
    #[error("reset command `{command}` {message}; fix it or remove the suite's [reset] section")]
    Reset {
        /// The command.
        command: String,
        /// How it failed.
        message: String,
    },
    /// Something that needs a server was asked of a catalog suite (its tools are declared in the file and nothing
    /// runs them): full rollouts, answer checks, the success objective, a tool call.
    #[error(
        "suite `{suite}` is a catalog (its tools are declared in the file; no server runs them): {what} needs a \
         server. A catalog suite is scored by its tasks' exact first moves only: `tooltune eval` does that by \
         default, `tooltune optimize --objective routing` (or `selection`) optimises on it"
    )]
    CatalogOnly {
        /// The suite's name.
        suite: String,
        /// What was asked.
        what: String,
    },
    /// Two evaluations cannot be compared (different suites or tools under study, no task in common).
    #[error("{0}")]
    Incomparable(String),
}

impl EvalError {
    /// True when the failure is the machinery's (server died, timeout, transport, protocol, start-up,
    /// configuration), so a rollout that hit it must be recorded as an infrastructure error rather than
    /// as the candidate description's failure.
    pub fn is_infrastructure(&self) -> bool {
        !matches!(
            self,
            EvalError::ToolRejected { .. }
                | EvalError::UnknownTool { .. }
                | EvalError::NoTarget { .. }
                | EvalError::Incomparable(_)
        )
    }
}

fn suite_location(
    file: &std::path::Path,
    line: Option<usize>,
    task: Option<&str>,
    field: Option<&str>,
    message: &str,
) -> String {
    let mut s = file.display().to_string();
    if let Some(l) = line {
        s.push_str(&format!(":{l}"));
    }
    if let Some(t) = task {
        s.push_str(&format!(": task {t}"));
    }
    if let Some(f) = field {
        s.push_str(&format!(": field `{f}`"));
    }
    s.push_str(": ");
    s.push_str(message);
    s
}

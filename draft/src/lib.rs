//! Task suites for servers nobody wrote tasks for (`tooltune suite draft`) or from logged runs (`tooltune suite
//! from-traces`), and the check that a suite's tasks are still solvable on its server (`tooltune suite check`).
//!
//! Drafting explores the server with its read-only tools, has a model write requests a user would type from what
//! each tool is and returned (more than from its description, which a later optimisation rewrites), verifies every
//! request on the real server with a reference call the model writes, and writes the suite (atomically) with a
//! review page. The stages are in [`draft`], the server side they share with `from-traces` in `server` (start,
//! list, run a reference call twice), the last stage in `finish` (ids, splits, the file and its review pages), the
//! data in [`outcome`]. From logs: [`traces`] (pure: merge repeats, owner, reference call, answer check) and
//! [`from_traces`]. The other pure parts: [`tools`] (access, parameters, confusable pairs), [`parse`] (model replies,
//! answer checks), [`split`] (stratified splits), [`write`] (TOML) and [`review`].

pub mod check;
pub mod draft;
mod finish;
pub mod from_traces;
pub mod outcome;
pub mod parse;
pub mod prompt;
pub mod review;
mod server;
pub mod split;
pub mod tools;
pub mod traces;
pub mod write;

pub use check::{CheckReport, Finding, Problem, check_suite};
pub use draft::draft;
pub use from_traces::{FromTracesConfig, from_traces};
pub use outcome::{Counts, DraftConfig, DraftOutcome, Progress};
pub use traces::LoggedRun;

use std::path::PathBuf;

/// Everything that can go wrong while drafting or checking a suite. A task that fails verification is not an
/// error: it is dropped with its reason ([`draft::DropReason`]).
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// The server could not be started or reached.
    #[error(
        "the server `{command}` did not start: {message}\n  check the command after `--` (run it by hand: it should \
         wait for MCP messages on stdin), or the --url"
    )]
    ServerStart {
        /// The command line or URL.
        command: String,
        /// What the evaluator's client saw.
        message: String,
    },
    /// The server lists no tools.
    #[error(
        "the server `{server}` lists no tools (tools/list is empty): there is nothing to draft tasks for"
    )]
    NoTools {
        /// The server.
        server: String,
    },
    /// The model wrote no request that could be read, for any tool.
    #[error(
        "the model {model} wrote no parseable request (a numbered list, one request a line); its reply began: \
         {sample:?}\n  try a larger model with --reflector"
    )]
    NothingParseable {
        /// The model's id.
        model: String,
        /// The start of what it wrote.
        sample: String,
    },
    /// Every drafted (or logged) task was dropped during verification.
    #[error(
        "no task survived verification ({reasons}); first: {first}\n  the suite was not written; the reasons per \
         task are in {}",
        review.display()
    )]
    NothingKept {
        /// Dropped tasks per reason.
        reasons: String,
        /// The first reason, in full.
        first: String,
        /// The review page.
        review: PathBuf,
    },
    /// `suite from-traces` found no logged run (or no request) to make tasks from.
    #[error(
        "no logged run to make tasks from ({filters}); no suite was written\n  ingest logs first (`tooltune ingest \
         FILE`), or widen --tool, --since, --until or --label-source"
    )]
    NoLoggedRuns {
        /// The filters in effect, in words.
        filters: String,
    },
    /// Drafting was stopped (Ctrl-C) before any task was verified.
    #[error("stopped before any task was verified; no suite was written")]
    Stopped,
    /// The fixture cannot be read.
    #[error("--fixture {}: {message}", path.display())]
    Fixture {
        /// The fixture given.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A fixture was given but the command never names it.
    #[error(
        "--fixture is given but the server's command line never names ${{FIXTURE_DIR}}, so the server would not run \
         on the copy; pass '${{FIXTURE_DIR}}' (quoted) where the server takes its folder"
    )]
    FixtureUnused,
    /// The command names `${FIXTURE_DIR}` without a fixture.
    #[error("the server's command line names ${{FIXTURE_DIR}} but no --fixture is given")]
    FixtureMissing,
    /// The suite to add to (`--more`) or check cannot be loaded.
    #[error("{0}")]
    Existing(tooltune_evaluator::EvalError),
    /// A file could not be written.
    #[error("{}: cannot be written: {message}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The model backend failed (not a reply that could not be read: an error of the backend itself).
    #[error("the drafting model failed: {0}")]
    Model(String),
    /// A prompt template failed to render (a bug).
    #[error("prompt template: {0}")]
    Template(String),
    /// Something that should not happen.
    #[error("{0}")]
    Internal(String),
}

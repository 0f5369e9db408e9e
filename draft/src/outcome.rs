//! What drafting produces: the counts and configuration asked for, the kept and dropped tasks with their checks,
//! origins and reasons, and the outcome a run reports (its `--json` summary). Shared by `suite draft` and `suite
//! from-traces`, whose tasks differ only in where they came from ([`Origin`]). Pure data.

use crate::parse::Check;
use crate::tools::Access;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tooltune_evaluator::{ReferenceCall, ServerSpec, Split};

/// How many requests of each kind to draft.
#[derive(Debug, Clone)]
pub struct Counts {
    /// Requests per tool.
    pub per_tool: usize,
    /// Requests no tool serves.
    pub no_tool: usize,
    /// Pairs of confusable tools drafted against each other.
    pub pairs: usize,
    /// Requests per direction of a pair.
    pub per_pair: usize,
}

impl Counts {
    /// The defaults for `per_tool` requests a tool: half as many no-tool requests (at least 2), two confusable
    /// pairs with a third as many each way (at least 1).
    pub fn for_per_tool(per_tool: usize) -> Counts {
        Counts {
            per_tool,
            no_tool: (per_tool / 2).max(2),
            pairs: 2,
            per_pair: (per_tool / 3).max(1),
        }
    }
}

/// What to draft, for which server, into which file.
#[derive(Debug, Clone)]
pub struct DraftConfig {
    /// The server as given (`${FIXTURE_DIR}` may stand in its command line).
    pub server: ServerSpec,
    /// A folder or file copied for every call of a tool that may write (and for exploration).
    pub fixture: Option<PathBuf>,
    /// The suite file to write.
    pub out: PathBuf,
    /// The suite's name (default: the file name).
    pub name: Option<String>,
    /// How many requests to draft.
    pub counts: Counts,
    /// Seeds drafting (sampling) and the splits.
    pub seed: u64,
    /// How long one reference or exploration call may take.
    pub call_timeout: Duration,
    /// Add to the suite at `out` instead of writing a new one: tasks already there are kept as they are and no
    /// drafted request repeats one of them.
    pub more: bool,
}

/// Progress: the stage, and units done of the total known so far (the total grows once drafting has made the
/// tasks to verify).
#[derive(Debug, Clone)]
pub struct Progress {
    /// `exploring`, `drafting`, `verifying`, `writing`.
    pub stage: &'static str,
    /// Units done.
    pub done: usize,
    /// Units known.
    pub total: usize,
}

/// What a drafted task was drafted as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Kind {
    /// A request for its owner.
    Tool,
    /// A request no tool serves.
    NoTool,
    /// A request for its owner that sits close to `against`.
    Confusable {
        /// The other tool of the pair.
        against: String,
    },
}

impl Kind {
    /// The provenance word.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::NoTool => "no-tool",
            Kind::Confusable { .. } => "confusable",
        }
    }

    /// The other tool of a confusable pair.
    pub fn against(&self) -> Option<&str> {
        match self {
            Kind::Confusable { against } => Some(against),
            _ => None,
        }
    }
}

/// What a kept task checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskCheck {
    /// An answer check from the reference result.
    Answer(Check),
    /// Only the tool called (the owner, or none); why there is no answer check.
    Routing(String),
}

/// A task that passed verification.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    /// Its id.
    pub id: String,
    /// The request.
    pub prompt: String,
    /// Its split.
    pub split: Split,
    /// The tool it belongs to; `None` for a no-tool request.
    pub owner: Option<String>,
    /// What it was drafted as.
    pub kind: Kind,
    /// Its check.
    pub check: TaskCheck,
    /// The reference calls (one for a drafted task; a logged chain for one from logs).
    pub reference: Vec<ReferenceCall>,
    /// The start of the reference result, for the review page.
    pub result_start: Option<String>,
    /// `sha256:` and the digest of the reference result's text.
    pub digest: Option<String>,
    /// Where it came from.
    pub origin: Origin,
}

/// Where a kept task came from, written as its provenance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum Origin {
    /// Drafted by `suite draft` with this model.
    Drafted {
        /// The drafting model's id.
        model: String,
    },
    /// Made by `suite from-traces` from these logged runs.
    Logged {
        /// The ids of the successful runs it was made from (the ones that name its owner and check).
        trajectories: Vec<String>,
        /// Whether its reference call was run on the server (no server given: written unverified).
        verified: bool,
    },
    /// A task the suite held before this run (`--more`): shown on the review page, never rewritten.
    Earlier,
}

/// Why a drafted task was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// The same request as another, or as a task already in the suite.
    Duplicate,
    /// Too short, too long, or it names a tool.
    Malformed,
    /// The model wrote no call for it.
    NoCall,
    /// The tool may write and no fixture was given, so it was not called.
    WritesWithoutFixture,
    /// The server refused the call (unknown tool, invalid arguments).
    Rejected,
    /// The tool answered with an error (`isError`).
    ToolError,
    /// The call did not answer in time.
    Timeout,
    /// The server died or the transport failed during the call.
    ServerFailed,
    /// The call returned nothing.
    EmptyResult,
    /// The model judged that the result does not give what was asked.
    NotAnswered,
    /// The model's verdict could not be read, twice.
    UnreadableVerdict,
    /// Drafting was stopped (Ctrl-C) before this task was verified.
    Stopped,
    /// From logs: no run of the request succeeded, so nothing says which tool serves it.
    NoSuccessfulRun,
    /// From logs: the successful runs began with different tools (or some with none), equally often.
    OwnerUnclear,
    /// From logs: the owner is not a tool of the server given.
    UnknownTool,
}

impl DropReason {
    /// The reason as a key (`tool-error`).
    pub fn key(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// A drafted task that was not kept.
#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    /// The request.
    pub prompt: String,
    /// The tool it was drafted for.
    pub owner: Option<String>,
    /// What it was drafted as.
    pub kind: Kind,
    /// Why it was dropped.
    pub reason: DropReason,
    /// The details (the server's message, the timeout).
    pub detail: String,
    /// The reference calls, when any were written.
    pub reference: Vec<ReferenceCall>,
    /// The start of its result, when it ran.
    pub result_start: Option<String>,
}

/// One exploration call.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    /// The tool called.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
    /// The text it returned (cut), or the error.
    pub result: String,
    /// Whether it failed.
    pub failed: bool,
}

/// What `suite from-traces` read.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    /// Logged runs read (after the filters).
    pub trajectories: usize,
    /// Distinct requests among them (repeats merged).
    pub requests: usize,
    /// Whether the reference calls were run on a server.
    pub verified: bool,
}

/// The outcome of `suite draft` (and of `suite from-traces`, with `traces` set).
#[derive(Debug, Clone, Serialize)]
pub struct DraftOutcome {
    /// The suite written, or `None` when nothing was kept.
    pub suite: Option<PathBuf>,
    /// The review page as Markdown.
    pub review_md: PathBuf,
    /// The review page as HTML.
    pub review_html: PathBuf,
    /// The drafting model.
    pub model: String,
    /// The server's tools with their access.
    pub tools: Vec<(String, Access)>,
    /// The exploration calls.
    pub explored: Vec<Observation>,
    /// Tasks the suite held before (`--more`).
    pub existing: usize,
    /// Tasks kept (the new ones).
    pub kept: Vec<Kept>,
    /// Tasks dropped, with reasons.
    pub dropped: Vec<Dropped>,
    /// The tasks the suite held before (`--more`), for the review page, which covers the whole file.
    pub earlier: Vec<Kept>,
    /// Set when the tasks came from logged runs (`suite from-traces`).
    pub traces: Option<TraceSummary>,
    /// Whether drafting was stopped early.
    pub stopped: bool,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl DraftOutcome {
    /// Drafted requests in all (kept and dropped).
    pub fn drafted(&self) -> usize {
        self.kept.len() + self.dropped.len()
    }

    /// Dropped tasks per reason.
    pub fn dropped_by_reason(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for d in &self.dropped {
            *m.entry(d.reason.key()).or_insert(0) += 1;
        }
        m
    }

    /// The error of a run that kept no task: the drops counted by reason and the most telling one in full (a failure
    /// of verification says more than a duplicate or a line the parser refused). Shared by `suite draft` and
    /// `suite from-traces`.
    pub fn nothing_kept(&self, review: PathBuf) -> crate::DraftError {
        crate::DraftError::NothingKept {
            reasons: self
                .dropped_by_reason()
                .iter()
                .map(|(r, n)| format!("{n} {r}"))
                .collect::<Vec<_>>()
                .join(", "),
            first: self
                .dropped
                .iter()
                .find(|d| !matches!(d.reason, DropReason::Duplicate | DropReason::Malformed))
                .or(self.dropped.first())
                .map(|d| format!("{}: {}", d.reason.key(), d.detail))
                .unwrap_or_default(),
            review,
        }
    }

    /// Kept tasks with an answer check.
    pub fn answer_checked(&self) -> usize {
        self.kept
            .iter()
            .filter(|k| matches!(k.check, TaskCheck::Answer(_)))
            .count()
    }

    /// The summary `--json` prints.
    pub fn summary(&self) -> Value {
        let mut per_tool: BTreeMap<String, [usize; 2]> = BTreeMap::new();
        for k in &self.kept {
            per_tool
                .entry(k.owner.clone().unwrap_or_else(|| "(no tool)".into()))
                .or_default()[0] += 1;
        }
        for d in &self.dropped {
            per_tool
                .entry(d.owner.clone().unwrap_or_else(|| "(no tool)".into()))
                .or_default()[1] += 1;
        }
        json!({
            "suite": self.suite,
            "review_md": self.review_md,
            "review_html": self.review_html,
            "model": self.model,
            "tools": self.tools.iter().map(|(n, a)| json!({"name": n, "access": a})).collect::<Vec<_>>(),
            "explored": self.explored.len(),
            "existing": self.existing,
            "drafted": self.drafted(),
            "kept": self.kept.len(),
            "answer_checked": self.answer_checked(),
            "routing_only": self.kept.len() - self.answer_checked(),
            "dropped": self.dropped.len(),
            "dropped_by_reason": self.dropped_by_reason(),
            "per_tool": per_tool.iter().map(|(t, [k, d])| json!({"tool": t, "kept": k, "dropped": d})).collect::<Vec<_>>(),
            "stopped": self.stopped,
            "seconds": (self.seconds * 10.0).round() / 10.0,
            "from_traces": self.traces,
        })
    }
}

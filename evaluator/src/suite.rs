//! Task suites: the types a loaded suite is made of (tasks, their checks, the server to run them on). The
//! loader of the TOML format (documented in docs/suite-format.md) is in `load`, the suite variables that say
//! where servers and fixtures are found in `paths`, and the pure checks that score one rollout in `check`.

mod check;
mod load;
mod paths;

use crate::EvalError;
use crate::mcp::ServerSpec;
pub use check::numbers_in;
pub use load::task_lines;
pub use paths::{bin_dir, third_party_dir};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;
use tooltune_core::ToolSpec;

/// Step limit of a task that sets none and whose suite sets none.
pub const DEFAULT_MAX_STEPS: u32 = 8;

/// Which part of the data a task belongs to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Seen by the optimiser (reflection reads these rollouts).
    Train,
    /// Used to accept or reject candidates (Pareto set).
    Validation,
    /// Held out for the final report.
    Test,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        })
    }
}

/// Checks on the final answer. All that are set must pass.
#[derive(Debug, Clone)]
pub struct AnswerCheck {
    /// The answer, trimmed (and without one trailing period), equals this.
    pub exact: Option<String>,
    /// The regex matches somewhere in the answer (anchor it with `^...$` for the whole answer).
    pub regex: Option<Regex>,
    /// Some number in the answer equals this, within `tolerance` (`69,504` reads as 69504).
    pub number: Option<f64>,
    /// Absolute tolerance of `number`.
    pub tolerance: f64,
    /// Every one of these strings occurs in the answer.
    pub contains: Vec<String>,
    /// Compare text case-insensitively (default true).
    pub ignore_case: bool,
}

/// A tool call that solves (part of) a task, used to prove the task is solvable on its server.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceCall {
    /// The tool to call.
    pub tool: String,
    /// Its arguments.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// One task of a suite.
#[derive(Debug, Clone)]
pub struct Task {
    /// Unique id within the suite.
    pub id: String,
    /// The user's request.
    pub prompt: String,
    /// Train, validation or test.
    pub split: Split,
    /// The tool this task belongs to (the one that should be chosen first), for selection rate and
    /// off-target counts; `None` for tasks that need no tool.
    pub owner: Option<String>,
    /// Checks on the final answer.
    pub answer: Option<AnswerCheck>,
    /// Tools that must be called.
    pub expect_tools: Vec<String>,
    /// Whether `expect_tools` must be called in the listed order (as a subsequence of the calls).
    pub expect_order: bool,
    /// Tools that must not be called.
    pub forbid_tools: Vec<String>,
    /// Most model turns the agent gets.
    pub max_steps: u32,
    /// Tool calls that solve the task; the last one's result contains the answer.
    pub reference: Vec<ReferenceCall>,
    /// Checks on the rollout's copy of the fixture after the rollout (suites with a `[fixture]` only).
    pub expect_files: Vec<FileCheck>,
    /// A command run in the rollout's copy of the fixture after the rollout; exit status 0 passes.
    pub expect_command: Option<CommandCheck>,
    /// Where the task came from, when a tool wrote it (`tooltune suite draft`); `None` for a task written by hand.
    /// Informational: no check reads it, so a person may edit or delete a drafted task freely.
    pub provenance: Option<Provenance>,
}

/// Where a task came from (`[task.provenance]` / `provenance = { ... }`): written by `tooltune suite draft` and
/// `tooltune suite from-traces`, kept
/// through later edits. Every field is optional so that a person can trim it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// True when a model drafted the task.
    #[serde(default)]
    pub drafted: bool,
    /// The drafting model's id (`local:qwen2.5-coder-1.5b`).
    pub model: Option<String>,
    /// What the task was drafted as: `tool` (a request for its owner), `no-tool` (no tool of the server serves
    /// it), `confusable` (a request for its owner that sits close to another tool, named in `against`).
    pub kind: Option<String>,
    /// For a `confusable` task, the tool it was drafted against.
    pub against: Option<String>,
    /// `answer` when the task has an answer check taken from the reference result, `routing` when it checks only
    /// which tool is called.
    pub check: Option<String>,
    /// `sha256:` and the hex digest of the last reference call's result text when the task was drafted, so
    /// `tooltune suite check` can say that a tool now answers differently.
    pub reference_sha256: Option<String>,
    /// True when `tooltune suite from-traces` made the task from logged runs.
    #[serde(default)]
    pub from_traces: bool,
    /// For a task made from logs: whether its reference call was run on the server when it was made (no server
    /// given: `false`, the task is unverified until `tooltune suite check` runs it).
    pub verified: Option<bool>,
    /// For a task made from logs: the ids of the stored trajectories (successful runs) it was made from.
    #[serde(default)]
    pub trajectories: Vec<String>,
}

/// A check on one file of the rollout's copy of the fixture.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCheck {
    /// Path relative to the copy's root (`${FIXTURE_DIR}`).
    pub path: String,
    /// Whether the file must exist (default true); `false` checks that it was removed or moved away.
    #[serde(default = "yes")]
    pub exists: bool,
    /// Strings the file must contain.
    #[serde(default)]
    pub contains: Vec<String>,
    /// Strings the file must not contain.
    #[serde(default)]
    pub lacks: Vec<String>,
    /// The file's whole content, compared with surrounding whitespace trimmed.
    pub equals: Option<String>,
}

fn yes() -> bool {
    true
}

/// A command that judges the rollout's copy of the fixture: run in the copy's folder with `FIXTURE_DIR` set,
/// exit status 0 passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCheck {
    /// The program (`${SUITE_DIR}` and the other suite variables expanded).
    pub command: String,
    /// Its arguments (expanded likewise).
    pub args: Vec<String>,
    /// How long it may run.
    pub timeout: Duration,
}

/// The verdict of [`Task::check`] on one rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckResult {
    /// Every check passed.
    pub success: bool,
    /// Fraction of check groups (answer, expected tools, forbidden tools) that passed, in [0, 1].
    pub score: f64,
    /// What passed and what failed, concretely enough for a reflection model to act on.
    pub feedback: String,
}

/// A loaded, validated suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The suite file.
    pub path: PathBuf,
    /// Its folder (`${SUITE_DIR}`).
    pub dir: PathBuf,
    /// The suite's name (its `name` field, or the file name without extension).
    pub name: String,
    /// Free-text description.
    pub description: Option<String>,
    /// How to start or reach the server, with variables expanded.
    pub server: ServerSpec,
    /// The tools whose descriptions are being optimised.
    pub tools_under_study: Vec<String>,
    /// Tools the server offers that the agent must not see (e.g. ones that write files).
    pub hide_tools: Vec<String>,
    /// The tasks, in file order.
    pub tasks: Vec<Task>,
    /// The world every rollout starts from, copied fresh for each (`[fixture]`).
    pub fixture: Option<crate::fixture::Fixture>,
    /// A command run before every rollout, for state a fixture cannot hold (`[reset]`).
    pub reset: Option<crate::fixture::ResetCommand>,
    /// The host's system prompt for this suite (`[host] system_prompt`), when the suite measures descriptions
    /// under a host other than tooltune's default.
    pub system_prompt: Option<String>,
}

impl Suite {
    /// Starts the suite's server for listing its tools (and, without a fixture, for every rollout). With a
    /// fixture it runs on a copy of its own, kept as long as the returned handle.
    pub async fn connect(&self) -> Result<crate::mcp::McpServer, EvalError> {
        match &self.fixture {
            None => crate::mcp::McpServer::connect(self.server.clone()).await,
            Some(f) => {
                let dir = f.materialise()?;
                let server = crate::mcp::McpServer::connect(crate::fixture::spec_for(
                    &self.server,
                    dir.path(),
                ))
                .await?;
                Ok(server.keeping(dir))
            }
        }
    }

    /// Whether the suite declares its tools instead of a server (a catalog suite: first moves only).
    pub fn is_catalog(&self) -> bool {
        matches!(self.server.transport, crate::mcp::Transport::Catalog { .. })
    }

    /// An error unless `what` is possible on this suite: anything that needs a server is refused on a catalog.
    pub fn needs_server(&self, what: &str) -> Result<(), EvalError> {
        if self.is_catalog() {
            return Err(EvalError::CatalogOnly {
                suite: self.name.clone(),
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// What makes a rollout of this suite reproducible besides the suite file: the fixture's content digest.
    pub fn world_digest(&self) -> String {
        self.fixture
            .as_ref()
            .map_or_else(String::new, |f| f.digest.clone())
    }

    /// The tasks of one split, in file order.
    pub fn split(&self, split: Split) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(move |t| t.split == split)
    }

    /// A task by id.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// The server's tool list without the hidden tools: what the agent may see.
    pub fn visible_tools(&self, tools: Vec<ToolSpec>) -> Vec<ToolSpec> {
        tools
            .into_iter()
            .filter(|t| !self.hide_tools.contains(&t.name))
            .collect()
    }
}

#[cfg(test)]
mod tests;

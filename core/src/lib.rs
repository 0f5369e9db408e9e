//! tooltune's domain types: trajectories, the tools shown in them, and content-addressed description versions.
//!
//! This crate does no IO, reads no clock and knows nothing about trace formats, SQL, MCP or language models.
//! Everything else in the workspace speaks in these types, so they are deliberately plain data with one
//! validation step ([`Trajectory::validate`]) that every producer (ingest, the evaluator) goes through.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod canonical;
mod ids;
mod outcome;
mod step;
#[cfg(test)]
mod tests;
pub mod text;
mod tool;
mod validate;

pub use ids::{DescriptionId, TrajectoryId, canonical_json};
pub use outcome::{Links, Meta, Outcome};
pub use step::{Step, Timing, ToolCall, Usage};
pub use tool::{ToolAnnotations, ToolSpec};
pub use validate::ValidationError;

/// One logged agent run: the task, the tools the model was shown, what it did, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// The task (the user's request).
    pub task: String,
    /// The system prompt, if the producer recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The tools the model was shown, with the descriptions it read.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// The behaviour hints the server declared for tools of `tools`, by tool name (untrusted, see
    /// [`ToolAnnotations`]). Tools the producer recorded no hints for are absent; left out of the JSON when empty,
    /// so a trajectory without hints has the id and body it had before the field existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_annotations: BTreeMap<String, ToolAnnotations>,
    /// What happened, in order.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The agent's final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_answer: Option<String>,
    /// How it ended.
    #[serde(default)]
    pub outcome: Outcome,
    /// Where it came from.
    #[serde(default)]
    pub meta: Meta,
    /// tooltune run links.
    #[serde(default, skip_serializing_if = "Links::is_empty")]
    pub links: Links,
}

impl Trajectory {
    /// All tool calls, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.steps.iter().flat_map(|s| match s {
            Step::Model { tool_calls, .. } => tool_calls.as_slice(),
            _ => &[],
        })
    }

    /// How many times the named tool was called.
    pub fn calls_of(&self, tool: &str) -> usize {
        self.tool_calls().filter(|c| c.name == tool).count()
    }

    /// The tool list entry for a name.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// Where finished trajectories go, a chunk at a time: the trace store in production (`tooltune-store` implements
/// it), a vector in a test. The evaluator writes its rollouts through this, so it needs no database of its own and
/// the store needs nothing of the evaluator. A boxed future rather than an `async fn`, so that callers can hand
/// over `&dyn TrajectorySink`.
pub trait TrajectorySink: Send + Sync {
    /// Stores `chunk` whole or not at all (a crash then loses at most the chunk in flight); the error says why.
    fn write<'a>(
        &'a self,
        chunk: &'a [Trajectory],
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'a>>;
}

/// Why a [`TrajectorySink`] could not store a chunk, in the sink's own words.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

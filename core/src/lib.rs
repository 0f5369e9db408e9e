//! tooltune's domain types: trajectories, the tools shown in them, and content-addressed description versions.
//!
//! This crate does no IO, reads no clock and knows nothing about trace formats, SQL, MCP or language models.
//! Everything else in the workspace speaks in these types, so they are deliberately plain data with one
//! validation step ([`Trajectory::validate`]) that every producer (ingest, the evaluator) goes through.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

mod canonical;
pub mod text;

/// A tool as a model saw it: name, natural-language description and JSON Schema of its input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model uses to call the tool.
    pub name: String,
    /// The description the model read. This is the text tooltune optimises.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the tool's arguments (`{}` when the producer did not record one).
    ///
    /// Shared, not owned: a log shows the same schemas in every record, and readers hand out one decoded copy to
    /// all of them (cloning a schema's maps cost as much as decoding it). Equality still compares contents.
    #[serde(default = "empty_object")]
    pub input_schema: Arc<Value>,
}

/// A tool's behaviour hints as its MCP server declared them in `tools/list` (`annotations`, protocol revision
/// 2025-03-26 and later). The specification calls them untrusted: a server may declare a tool read-only and write
/// anyway, so they say what the server claims, never what a call did. `None`: the server did not say.
///
/// Kept apart from [`ToolSpec`] (in [`Trajectory::tool_annotations`]): a description version is the text and schema
/// the model read, and the model never reads the hints, so they are not part of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolAnnotations {
    /// `readOnlyHint`: the tool does not modify its environment (the specification's default is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// `destructiveHint`: a modification may destroy data (meaningful when not read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// `idempotentHint`: repeating the call with the same arguments has no further effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// `openWorldHint`: the tool reaches outside systems (the web, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

impl ToolAnnotations {
    /// The hints of an MCP `annotations` object as a server sends it (`readOnlyHint`, ...). A hint that is absent
    /// or not a boolean is `None`: the hints are advice, and a malformed one says nothing. Other members (`title`)
    /// are not hints and are ignored.
    pub fn from_mcp(annotations: &Value) -> ToolAnnotations {
        let hint = |key: &str| annotations.get(key).and_then(Value::as_bool);
        ToolAnnotations {
            read_only_hint: hint("readOnlyHint"),
            destructive_hint: hint("destructiveHint"),
            idempotent_hint: hint("idempotentHint"),
            open_world_hint: hint("openWorldHint"),
        }
    }

    /// Whether a call may change state: anything not declared read-only (the specification's default for
    /// `readOnlyHint` is false).
    pub fn may_write(&self) -> bool {
        self.read_only_hint != Some(true)
    }

    /// Whether no hint is given at all (an `annotations` object holding only a title, say).
    pub fn is_empty(&self) -> bool {
        *self == ToolAnnotations::default()
    }
}

fn empty_object() -> Arc<Value> {
    Arc::new(Value::Object(Default::default()))
}

fn empty_arguments() -> Value {
    Value::Object(Default::default())
}

impl ToolSpec {
    /// The stable id of this tool's description version.
    pub fn description_id(&self) -> DescriptionId {
        DescriptionId::of(&self.name, &self.description, &self.input_schema)
    }
}

/// Content address of one description version: sha256 over the tool name, the description text and the
/// canonical (key-sorted) JSON of the input schema. Parameter descriptions live in the schema, so changing
/// one is a new version too; re-serialising the same schema with other key order is not.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DescriptionId(String);

impl DescriptionId {
    /// Computes the id of a (name, description, schema) triple.
    pub fn of(name: &str, description: &str, input_schema: &Value) -> Self {
        Self::of_canonical(name, description, &canonical_json(input_schema))
    }

    /// The same id, for a caller that already holds the schema's [`canonical_json`] (the store keeps it too).
    pub fn of_canonical(name: &str, description: &str, canonical_schema: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"tooltune-description-v1\0");
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(description.as_bytes());
        h.update(b"\0");
        h.update(canonical_schema.as_bytes());
        DescriptionId(hex::encode(h.finalize()))
    }

    /// Wraps an id read back from storage. No check is made beyond it being the stored string.
    pub fn from_stored(s: String) -> Self {
        DescriptionId(s)
    }

    /// The full hex id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, enough to tell versions apart on a screen.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(12)]
    }
}

impl fmt::Display for DescriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Content address of a whole trajectory; ingesting the same record twice yields the same id, which is how
/// re-ingesting a file adds nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TrajectoryId(String);

impl TrajectoryId {
    /// Wraps an id read back from storage.
    pub fn from_stored(s: String) -> Self {
        TrajectoryId(s)
    }
    /// The full hex id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TrajectoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// JSON with object keys sorted recursively and no insignificant whitespace.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::new();
    // A `Value`'s keys are all strings, so writing it cannot fail, and serde_json writes UTF-8.
    let _ = canonical::write_canonical(v, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// When a step happened and how long it took, as far as the producer recorded it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// RFC 3339 start time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Duration in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
}

impl Timing {
    fn is_empty(&self) -> bool {
        self.started_at.is_none() && self.duration_ms.is_none()
    }
}

/// Token counts of one model turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: u64,
    /// Generated (output) tokens.
    pub completion_tokens: u64,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The producer's call id, used to pair the call with its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool named by the call.
    pub name: String,
    /// The arguments, as JSON. Producers that log arguments as a string that is not JSON keep it as a string.
    #[serde(default = "empty_arguments")]
    pub arguments: Value,
}

/// One step of a trajectory, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "StepFields")]
pub enum Step {
    /// A further user message after the task (multi-turn conversations).
    User {
        /// The message text.
        content: String,
    },
    /// One model turn: text, tool calls, or both.
    Model {
        /// Text the model wrote, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// Tool calls the model made in this turn.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// When the turn happened.
        #[serde(default, skip_serializing_if = "Timing::is_empty")]
        timing: Timing,
        /// Tokens the turn used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    /// The result of a tool call, as the server returned it.
    ToolResult {
        /// The id of the call this answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// The tool that produced it.
        name: String,
        /// The result content as text.
        content: String,
        /// MCP's `isError`: the tool reported failure.
        #[serde(default)]
        is_error: bool,
        /// When the call ran.
        #[serde(default, skip_serializing_if = "Timing::is_empty")]
        timing: Timing,
    },
}

/// A step as it is read: every field some kind of step has, checked against the kind afterwards.
///
/// serde reads an internally tagged enum by first buffering each object into a tree of its own (the tag may come
/// last, as it does in canonical JSON), then reading the variant from that tree; for steps that was a sixth of
/// parsing a record. Reading one flat struct needs no buffer. Unlike the derived reading, a field of another kind
/// of step must have that field's type, and a `null` where a default exists reads as the default.
#[derive(Deserialize)]
struct StepFields {
    #[serde(rename = "type")]
    kind: StepKind,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    timing: Option<Timing>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum StepKind {
    User,
    Model,
    ToolResult,
}

impl TryFrom<StepFields> for Step {
    type Error = String;

    fn try_from(f: StepFields) -> Result<Step, String> {
        // The messages are serde's own for a missing field, so that both readings say the same.
        let required =
            |v: Option<String>, field: &str| v.ok_or_else(|| format!("missing field `{field}`"));
        Ok(match f.kind {
            StepKind::User => Step::User {
                content: required(f.content, "content")?,
            },
            StepKind::Model => Step::Model {
                content: f.content,
                tool_calls: f.tool_calls.unwrap_or_default(),
                timing: f.timing.unwrap_or_default(),
                usage: f.usage,
            },
            StepKind::ToolResult => Step::ToolResult {
                call_id: f.call_id,
                name: required(f.name, "name")?,
                content: required(f.content, "content")?,
                is_error: f.is_error.unwrap_or(false),
                timing: f.timing.unwrap_or_default(),
            },
        })
    }
}

/// How a trajectory ended, as judged by whoever logged it (or by tooltune's checks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Score in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Whether the task succeeded. When absent but a score is present, success means score >= 0.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    /// Free-text feedback (a grader's comment, a user's complaint, a check's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
}

impl Outcome {
    /// The success verdict, derived from the score when not given explicitly.
    pub fn effective_success(&self) -> Option<bool> {
        self.success.or(self.score.map(|s| s >= 0.5))
    }
}

/// Where a trajectory came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The producer format or component (`tooltune`, `openai`, `langfuse`, `otel`, `evaluator`).
    #[serde(default)]
    pub source: String,
    /// The model that played the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The client/host that ran the agent (self-reported; for logs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The producer's own id for the run (trace id, completion id), for finding it again in the producer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// RFC 3339 time at which the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

/// Links to tooltune's own runs, for trajectories that tooltune's evaluator wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links {
    /// The optimisation or evaluation run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The candidate (set of descriptions) that was evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_id: Option<String>,
    /// Which rollout of the (task, candidate) pair this is, when a task is rolled out several times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<u32>,
}

impl Links {
    fn is_empty(&self) -> bool {
        self.run_id.is_none() && self.candidate_id.is_none() && self.rollout.is_none()
    }
}

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

/// A trajectory's serialised shape without its tool list (the same fields, names and omissions as `Trajectory`),
/// for [`Trajectory::id`], which appends the tool list itself.
///
/// The fields are declared in key order, so that the canonical writer finds the object sorted as written and does
/// not copy the whole body once more to reorder it.
#[derive(Serialize)]
struct WithoutTools<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    final_answer: &'a Option<String>,
    #[serde(skip_serializing_if = "Links::is_empty")]
    links: &'a Links,
    meta: &'a Meta,
    outcome: &'a Outcome,
    #[serde(serialize_with = "sorted_steps")]
    steps: &'a Vec<Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: &'a Option<String>,
    task: &'a String,
    // `tool_annotations` sorts after `task` and before `tools` (`_` before `s`), so the tool list is still the
    // last entry.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tool_annotations: &'a BTreeMap<String, ToolAnnotations>,
}

fn sorted_steps<S: serde::Serializer>(steps: &&Vec<Step>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(steps.iter().map(SortedStep))
}

/// A step written with the entries `Step`'s derived `Serialize` writes, in key order (the derived one writes the
/// `type` tag first). Steps are most of a body, and the canonical writer copied each one once more to reorder it.
/// Only for the canonical body: elsewhere a step's JSON starts with its type, as people expect to read it. Each
/// variant is destructured whole, so a field added to a step is a compile error here until it is written; the
/// skip rules mirror the derive's, and a test holds every shape to the reference form's hash.
struct SortedStep<'a>(&'a Step);

impl Serialize for SortedStep<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        match self.0 {
            Step::User { content } => {
                let mut m = s.serialize_struct("Step", 2)?;
                m.serialize_field("content", content)?;
                m.serialize_field("type", "user")?;
                m.end()
            }
            Step::Model {
                content,
                tool_calls,
                timing,
                usage,
            } => {
                let mut m = s.serialize_struct("Step", 5)?;
                if let Some(content) = content {
                    m.serialize_field("content", content)?;
                }
                if !timing.is_empty() {
                    m.serialize_field("timing", timing)?;
                }
                if !tool_calls.is_empty() {
                    m.serialize_field("tool_calls", tool_calls)?;
                }
                m.serialize_field("type", "model")?;
                if let Some(usage) = usage {
                    m.serialize_field("usage", usage)?;
                }
                m.end()
            }
            Step::ToolResult {
                call_id,
                name,
                content,
                is_error,
                timing,
            } => {
                let mut m = s.serialize_struct("Step", 6)?;
                if let Some(call_id) = call_id {
                    m.serialize_field("call_id", call_id)?;
                }
                m.serialize_field("content", content)?;
                m.serialize_field("is_error", is_error)?;
                m.serialize_field("name", name)?;
                if !timing.is_empty() {
                    m.serialize_field("timing", timing)?;
                }
                m.serialize_field("type", "tool_result")?;
                m.end()
            }
        }
    }
}

impl<'a> WithoutTools<'a> {
    fn of(t: &'a Trajectory) -> Self {
        // Destructured so that a field added to `Trajectory` is a compile error here until the id covers it.
        let Trajectory {
            task,
            system,
            tools: _,
            tool_annotations,
            steps,
            final_answer,
            outcome,
            meta,
            links,
        } = t;
        WithoutTools {
            task,
            system,
            steps,
            final_answer,
            outcome,
            meta,
            links,
            tool_annotations,
        }
    }
}

/// Why a trajectory is not acceptable, with the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    /// JSON path into the trajectory, e.g. `steps[3].tool_calls[0].name`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ValidationError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl Trajectory {
    /// Checks the invariants every stored trajectory keeps: a task, unique tool names, a score in [0, 1],
    /// every tool call naming a tool that was in the tool list (otherwise "selection" is meaningless), and hints
    /// only for tools in it.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.task.trim().is_empty() {
            return Err(ValidationError::new("task", "is empty"));
        }
        // foldhash: std's SipHash is made to resist chosen keys, which costs on every record and buys nothing for
        // a set that lives for one call.
        let mut seen = foldhash::HashSet::default();
        for (i, t) in self.tools.iter().enumerate() {
            if t.name.is_empty() {
                return Err(ValidationError::new(format!("tools[{i}].name"), "is empty"));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(ValidationError::new(
                    format!("tools[{i}].name"),
                    format!("tool `{}` is listed twice", t.name),
                ));
            }
        }
        for name in self.tool_annotations.keys() {
            if !seen.contains(name.as_str()) {
                return Err(ValidationError::new(
                    format!("tool_annotations.{name}"),
                    format!(
                        "hints for tool `{name}`, which is not in the tool list ({})",
                        list_names(&self.tools)
                    ),
                ));
            }
        }
        if let Some(s) = self.outcome.score
            && !(0.0..=1.0).contains(&s)
        {
            return Err(ValidationError::new(
                "outcome.score",
                format!("{s} is outside [0, 1]"),
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Model { tool_calls, .. } => {
                    for (j, c) in tool_calls.iter().enumerate() {
                        if !seen.contains(c.name.as_str()) {
                            return Err(ValidationError::new(
                                format!("steps[{i}].tool_calls[{j}].name"),
                                format!(
                                    "calls tool `{}`, which is not in the tool list ({})",
                                    c.name,
                                    list_names(&self.tools)
                                ),
                            ));
                        }
                    }
                }
                Step::ToolResult { name, .. } => {
                    if !seen.contains(name.as_str()) {
                        return Err(ValidationError::new(
                            format!("steps[{i}].name"),
                            format!(
                                "result of tool `{name}`, which is not in the tool list ({})",
                                list_names(&self.tools)
                            ),
                        ));
                    }
                }
                Step::User { .. } => {}
            }
        }
        Ok(())
    }

    /// Content address of the whole record (canonical JSON), stable across re-ingests of the same data.
    pub fn id(&self) -> TrajectoryId {
        self.id_and_body().0
    }

    /// The id, and the canonical JSON of the record without its tool list: the id hashes that JSON with the tool
    /// list appended, and the store keeps it as the trajectory's body (tool lists are stored apart, each
    /// description once), so one serialisation serves both. The body deserialises back into this trajectory with
    /// an empty tool list.
    pub fn id_and_body(&self) -> (TrajectoryId, Vec<u8>) {
        let mut body = Vec::with_capacity(4096);
        // Plain data with string keys: writing it cannot fail.
        let _ = canonical::write_canonical(&WithoutTools::of(self), &mut body);
        // `tools` sorts after every other field name, so the record's canonical JSON is this object with the
        // tool list appended as its last entry. The object is never empty (`task` is always written).
        let mut h = Sha256::new();
        h.update(b"tooltune-trajectory-v1\0");
        h.update(&body[..body.len() - 1]);
        h.update(b",\"tools\":[");
        for (i, tool) in self.tools.iter().enumerate() {
            if i > 0 {
                h.update(b",");
            }
            canonical::with_tool_json(tool, |json| h.update(json));
        }
        h.update(b"]}");
        (TrajectoryId(hex::encode(h.finalize())), body)
    }

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

fn list_names(tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return "the list is empty".to_string();
    }
    tools
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Trajectory {
        serde_json::from_value(json!({
            "task": "Read notes.txt and sum the numbers in it.",
            "tools": [
                {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
                {"name": "calculator", "description": "Evaluate arithmetic.", "input_schema": {}}
            ],
            "steps": [
                {"type": "model", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"type": "tool_result", "call_id": "c1", "name": "read_file", "content": "Attendees: 4"},
                {"type": "model", "content": "69504"}
            ],
            "final_answer": "69504",
            "outcome": {"score": 1.0}
        }))
        .expect("sample parses")
    }

    #[test]
    fn description_id_ignores_key_order_but_not_text() {
        let a = DescriptionId::of("t", "d", &json!({"a": 1, "b": {"c": 2, "d": 3}}));
        let b = DescriptionId::of("t", "d", &json!({"b": {"d": 3, "c": 2}, "a": 1}));
        let c = DescriptionId::of("t", "d2", &json!({"a": 1, "b": {"c": 2, "d": 3}}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.as_str().len(), 64);
    }

    #[test]
    fn validate_accepts_a_good_trajectory_and_derives_success() {
        let t = sample();
        t.validate().expect("valid");
        assert_eq!(t.outcome.effective_success(), Some(true));
        assert_eq!(t.calls_of("read_file"), 1);
        assert_eq!(t.calls_of("calculator"), 0);
    }

    #[test]
    fn validate_names_the_unknown_tool_and_its_path() {
        let mut t = sample();
        if let Step::Model { tool_calls, .. } = &mut t.steps[0] {
            tool_calls[0].name = "web_search".into();
        }
        let e = t.validate().expect_err("unknown tool");
        assert_eq!(e.path, "steps[0].tool_calls[0].name");
        assert!(e.message.contains("web_search"), "{e}");
        assert!(e.message.contains("read_file, calculator"), "{e}");
    }

    #[test]
    fn validate_rejects_score_out_of_range_and_duplicate_tools() {
        let mut t = sample();
        t.outcome.score = Some(1.5);
        assert_eq!(t.validate().expect_err("score").path, "outcome.score");
        let mut t = sample();
        t.tools.push(t.tools[0].clone());
        assert_eq!(t.validate().expect_err("dup").path, "tools[2].name");
    }

    #[test]
    fn trajectory_id_is_stable_and_content_addressed() {
        let t = sample();
        assert_eq!(t.id(), sample().id());
        let mut u = sample();
        u.final_answer = Some("69505".into());
        assert_ne!(t.id(), u.id());
    }

    /// Ids of stored trajectories must never change: these literals were computed before tool annotations were
    /// added to `Trajectory`, and a trajectory without annotations (all data stored before them) keeps its id,
    /// its canonical body and its tools' description ids byte for byte.
    #[test]
    fn an_annotation_less_trajectory_keeps_its_id_and_body() {
        let t = sample();
        assert_eq!(
            t.id().as_str(),
            "b02fa193c5fbfbb1241d033461d6d9680f1f536aa36ad5949501349b8e4d7f34"
        );
        let body = String::from_utf8(t.id_and_body().1).expect("UTF-8");
        assert_eq!(
            body,
            r#"{"final_answer":"69504","meta":{"source":""},"outcome":{"score":1.0},"steps":[{"tool_calls":[{"arguments":{"path":"notes.txt"},"id":"c1","name":"read_file"}],"type":"model"},{"call_id":"c1","content":"Attendees: 4","is_error":false,"name":"read_file","type":"tool_result"},{"content":"69504","type":"model"}],"task":"Read notes.txt and sum the numbers in it."}"#
        );
        let ids: Vec<String> = t
            .tools
            .iter()
            .map(|x| x.description_id().to_string())
            .collect();
        assert_eq!(
            ids,
            [
                "a209ab907ccdbaa7748e9918e9e41a04302204d7d982e36c6674e0a601039d19",
                "2a9c00cff77b7a74c0df24080c2c6aa01937fa120e3a240759181c2c51d42409"
            ]
        );
    }

    #[test]
    fn annotations_change_the_trajectory_id_but_not_description_ids_and_read_back() {
        let plain = sample();
        let mut t = sample();
        t.tool_annotations.insert(
            "read_file".into(),
            ToolAnnotations {
                read_only_hint: Some(true),
                open_world_hint: Some(false),
                ..Default::default()
            },
        );
        t.validate().expect("hints for a listed tool are valid");
        // The hints are part of the record: another record, another id.
        assert_ne!(t.id(), plain.id());
        // The description versions are the text and schema the model read, whatever the server claims.
        for (a, b) in t.tools.iter().zip(&plain.tools) {
            assert_eq!(a.description_id(), b.description_id());
        }
        // The body (what the store keeps) holds them, and reads back into the same trajectory but its tool list.
        let (id, body) = t.id_and_body();
        let text = String::from_utf8(body.clone()).expect("UTF-8");
        assert!(
            text.ends_with(
                r#""task":"Read notes.txt and sum the numbers in it.","tool_annotations":{"read_file":{"open_world_hint":false,"read_only_hint":true}}}"#
            ),
            "{text}"
        );
        let mut back: Trajectory = serde_json::from_slice(&body).expect("body reads");
        back.tools = t.tools.clone();
        assert_eq!(back, t);
        assert_eq!(back.id(), id);
        // And serde's own JSON of the record reads back as it.
        let again: Trajectory =
            serde_json::from_str(&serde_json::to_string(&t).expect("write")).expect("read");
        assert_eq!(again, t);
    }

    #[test]
    fn a_measured_duration_reads_back_bit_for_bit_so_the_stored_record_keeps_its_id() {
        // 2123.8429889999998 is `as_secs_f64() * 1000.0` of a real tool call; serde_json's default float parser
        // reads it back one unit in the last place off (about 8% of such durations), which gave a stored rollout
        // another id than the one its result named (CI, evaluator fixtures test).
        let mut t = sample();
        for step in &mut t.steps {
            if let Step::Model { timing, .. } | Step::ToolResult { timing, .. } = step {
                timing.duration_ms = Some(2_123.842_988_999_999_8);
            }
        }
        let (id, body) = t.id_and_body();
        let mut back: Trajectory = serde_json::from_slice(&body).expect("body reads");
        back.tools = t.tools.clone();
        assert_eq!(back, t);
        assert_eq!(back.id(), id);
    }

    #[test]
    fn mcp_annotations_are_read_by_their_protocol_names_and_a_malformed_hint_is_absent() {
        let a = ToolAnnotations::from_mcp(&json!({
            "title": "Delete",
            "readOnlyHint": false,
            "destructiveHint": true,
            "idempotentHint": "yes",
        }));
        assert_eq!(
            a,
            ToolAnnotations {
                read_only_hint: Some(false),
                destructive_hint: Some(true),
                idempotent_hint: None,
                open_world_hint: None,
            }
        );
        assert!(a.may_write());
        assert!(ToolAnnotations::from_mcp(&json!({"title": "only"})).is_empty());
        assert!(ToolAnnotations::from_mcp(&json!(null)).is_empty());
    }

    #[test]
    fn validate_rejects_hints_for_an_unlisted_tool_and_unknown_hint_names() {
        let mut t = sample();
        t.tool_annotations
            .insert("web_search".into(), ToolAnnotations::default());
        let e = t.validate().expect_err("unlisted tool");
        assert_eq!(e.path, "tool_annotations.web_search");
        assert!(e.message.contains("read_file, calculator"), "{e}");
        // MCP's camelCase names are not this format's: a typo must not read as "no hint".
        let v = json!({"task": "t", "tools": [{"name": "a"}], "tool_annotations": {"a": {"readOnlyHint": true}}});
        let e = serde_json::from_value::<Trajectory>(v).expect_err("unknown hint name");
        assert!(e.to_string().contains("readOnlyHint"), "{e}");
    }

    #[test]
    fn only_a_declared_read_only_tool_may_not_write() {
        let ro = |v| ToolAnnotations {
            read_only_hint: v,
            ..Default::default()
        };
        assert!(!ro(Some(true)).may_write());
        assert!(ro(Some(false)).may_write());
        assert!(ro(None).may_write());
        assert!(ro(None).is_empty());
        assert!(!ro(Some(false)).is_empty());
    }

    /// `Step` as serde derives it, for comparing with the flat reading.
    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum DerivedStep {
        User {
            content: String,
        },
        Model {
            #[serde(default)]
            content: Option<String>,
            #[serde(default)]
            tool_calls: Vec<ToolCall>,
            #[serde(default)]
            timing: Timing,
            #[serde(default)]
            usage: Option<Usage>,
        },
        ToolResult {
            #[serde(default)]
            call_id: Option<String>,
            name: String,
            content: String,
            #[serde(default)]
            is_error: bool,
            #[serde(default)]
            timing: Timing,
        },
    }

    impl From<DerivedStep> for Step {
        fn from(d: DerivedStep) -> Step {
            match d {
                DerivedStep::User { content } => Step::User { content },
                DerivedStep::Model {
                    content,
                    tool_calls,
                    timing,
                    usage,
                } => Step::Model {
                    content,
                    tool_calls,
                    timing,
                    usage,
                },
                DerivedStep::ToolResult {
                    call_id,
                    name,
                    content,
                    is_error,
                    timing,
                } => Step::ToolResult {
                    call_id,
                    name,
                    content,
                    is_error,
                    timing,
                },
            }
        }
    }

    #[test]
    fn steps_read_as_the_derived_tagged_enum_reads_them() {
        let valid = [
            json!({"type": "user", "content": "More, please."}),
            json!({"content": "More, please.", "type": "user"}),
            json!({"type": "model"}),
            json!({"type": "model", "content": "Looking.", "tool_calls": [
                {"id": "c1", "name": "search", "arguments": {"q": "7"}}, {"name": "noop"}],
                "timing": {"started_at": "2025-01-01T00:00:00Z", "duration_ms": 12.5},
                "usage": {"prompt_tokens": 10, "completion_tokens": 3}, "extra": [1, 2]}),
            json!({"tool_calls": [{"name": "x", "arguments": "not json"}], "type": "model"}),
            json!({"type": "tool_result", "name": "search", "content": "found", "call_id": "c1",
                "is_error": true, "timing": {"duration_ms": 3.0}}),
            json!({"content": "", "name": "search", "type": "tool_result"}),
        ];
        for v in valid {
            let flat: Step = serde_json::from_value(v.clone()).expect("flat reading");
            let derived: DerivedStep = serde_json::from_value(v.clone()).expect("derived reading");
            assert_eq!(flat, Step::from(derived), "{v}");
            // And a step written out reads back as itself.
            let again: Step = serde_json::from_str(&serde_json::to_string(&flat).expect("write"))
                .expect("read back");
            assert_eq!(again, flat);
        }
        let invalid = [
            json!({"content": "no type"}),
            json!({"type": "robot", "content": "x"}),
            json!({"type": "user"}),
            json!({"type": "user", "content": 5}),
            json!({"type": "tool_result", "content": "no name"}),
            json!({"type": "tool_result", "name": "search"}),
            json!({"type": "model", "tool_calls": [{"arguments": {}}]}),
        ];
        for v in invalid {
            let flat = serde_json::from_value::<Step>(v.clone()).expect_err("flat rejects");
            let derived =
                serde_json::from_value::<DerivedStep>(v.clone()).expect_err("derived rejects");
            assert_eq!(flat.to_string(), derived.to_string(), "{v}");
        }
    }
}

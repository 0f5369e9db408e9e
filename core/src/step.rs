//! The steps of a trajectory ([`Step`]: user messages, model turns, tool results) and what they carry (tool calls,
//! timing, token usage), with the flat reading of a step.

use serde::{Deserialize, Serialize};
use serde_json::Value;

fn empty_arguments() -> Value {
    Value::Object(Default::default())
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
    pub(crate) fn is_empty(&self) -> bool {
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

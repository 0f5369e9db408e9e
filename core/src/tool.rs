//! Tools as a model saw them ([`ToolSpec`]: name, description, input schema) and the behaviour hints their server
//! declared ([`ToolAnnotations`]).

use crate::DescriptionId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

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
/// Kept apart from [`ToolSpec`] (in [`Trajectory::tool_annotations`](crate::Trajectory::tool_annotations)): a
/// description version is the text and schema the model read, and the model never reads the hints, so they are not
/// part of it.
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

impl ToolSpec {
    /// The stable id of this tool's description version.
    pub fn description_id(&self) -> DescriptionId {
        DescriptionId::of(&self.name, &self.description, &self.input_schema)
    }
}

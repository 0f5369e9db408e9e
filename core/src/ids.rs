//! Content addresses: description versions ([`DescriptionId`]), whole trajectories ([`TrajectoryId`],
//! [`Trajectory::id`]) and the canonical JSON they hash, with the trajectory body the store keeps.

use crate::canonical;
use crate::{Links, Meta, Outcome, Step, ToolAnnotations, Trajectory};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

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

impl Trajectory {
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
}

//! The `tooltune` format: one `Trajectory` per line in exactly tooltune-core's serde shape (unknown fields denied).

use crate::common::{cached_tools, decode_at, finish, from_json};
use crate::{Format, RecordError};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use tooltune_core::{Links, Meta, Outcome, Step, ToolAnnotations, ToolSpec, Trajectory};

/// A `Trajectory` as it is read, with the tool list kept raw: a log repeats the same list in every record (the
/// list is about half of a typical record's bytes), so it is decoded once per thread ([`cached_tools`]) and its
/// schemas are shared. The fields and their defaults are `Trajectory`'s; a test checks that both read a record
/// alike, and `deny_unknown_fields` makes a field added to `Trajectory` but not here fail loudly.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Record<'a> {
    task: String,
    #[serde(default)]
    system: Option<String>,
    #[serde(default, borrow, deserialize_with = "raw_always")]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    tool_annotations: BTreeMap<String, ToolAnnotations>,
    #[serde(default)]
    steps: Vec<Step>,
    #[serde(default)]
    final_answer: Option<String>,
    #[serde(default)]
    outcome: Outcome,
    #[serde(default)]
    meta: Meta,
    #[serde(default)]
    links: Links,
}

/// Takes the field's JSON as it is, `null` included: `Option<&RawValue>` alone would read `null` as an absent
/// list, which `Trajectory` rejects.
fn raw_always<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Parses and validates one tooltune record.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    let r: Record = from_json(text, line)?;
    let tools = match r.tools {
        Some(raw) => cached_tools(raw.get(), || {
            decode_at::<Vec<ToolSpec>>(text, raw.get(), line, "tools")
        })?,
        None => Vec::new(),
    };
    let t = Trajectory {
        task: r.task,
        system: r.system,
        tools,
        tool_annotations: r.tool_annotations,
        steps: r.steps,
        final_answer: r.final_answer,
        outcome: r.outcome,
        meta: r.meta,
        links: r.links,
    };
    finish(Format::Tooltune, t, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field set, so that a field read differently (or not at all) by `Record` shows.
    fn full() -> serde_json::Value {
        json!({
            "task": "Refund order 7",
            "system": "Be brief.",
            "tools": [
                {"name": "search", "description": "Finds orders.", "input_schema": {"type": "object",
                    "properties": {"q": {"type": "string"}}}},
                {"name": "refund"}
            ],
            "tool_annotations": {"search": {"read_only_hint": true, "open_world_hint": false},
                "refund": {"read_only_hint": false, "destructive_hint": true, "idempotent_hint": true}},
            "steps": [
                {"type": "user", "content": "Refund order 7"},
                {"type": "model", "content": "Looking.", "tool_calls": [
                    {"id": "c1", "name": "search", "arguments": {"q": "7"}}],
                    "timing": {"started_at": "2025-01-01T00:00:00Z", "duration_ms": 12.5},
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3}},
                {"type": "tool_result", "call_id": "c1", "name": "search", "content": "order 7",
                    "is_error": false}
            ],
            "final_answer": "Done.",
            "outcome": {"score": 0.9, "success": true, "feedback": "fine"},
            "meta": {"source": "evaluator", "model": "m", "client": "c", "external_id": "x",
                "started_at": "2025-01-01T00:00:00Z"},
            "links": {"run_id": "r", "candidate_id": "k", "rollout": 2}
        })
    }

    #[test]
    fn a_record_reads_as_the_trajectory_serde_reads() {
        for v in [full(), json!({"task": "only a task"})] {
            let text = v.to_string();
            let want: Trajectory = serde_json::from_str(&text).expect("serde reads it");
            let got = parse(&text, 1).expect("the reader reads it");
            let mut want = want;
            if want.meta.source.is_empty() {
                want.meta.source = "tooltune".into();
            }
            assert_eq!(got, want);
            assert_eq!(got.id(), want.id());
        }
    }

    #[test]
    fn a_null_or_bad_tool_list_is_an_error_with_its_path_and_column() {
        let e = parse(r#"{"task": "t", "tools": null}"#, 3).expect_err("null is not a list");
        assert_eq!(e.path.as_deref(), Some("tools"), "{e}");
        assert!(e.message.contains("expected a sequence"), "{e}");
        let text = r#"{"task": "t", "tools": [{"name": "a"}, {"name": 5}]}"#;
        let e = parse(text, 4).expect_err("a name must be a string");
        assert_eq!(e.line, 4);
        assert_eq!(e.path.as_deref(), Some("tools[1].name"), "{e}");
        // The column is the one in the whole record, just after the offending value.
        let col = text.find("5}").expect("the bad value") + 1;
        assert!(e.message.ends_with(&format!("(column {col})")), "{e}");
    }
}

//! Tests of the domain types: content addresses, validation, tool annotations and the flat reading of steps.

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
        let again: Step =
            serde_json::from_str(&serde_json::to_string(&flat).expect("write")).expect("read back");
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

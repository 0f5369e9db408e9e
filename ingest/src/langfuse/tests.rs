//! The Langfuse reader's tests: input shapes, history reuse, error paths, score outcomes, and the scanner against
//! the serde pass (fixtures, samples and the differential property test on damaged lines).

use super::convert::convert;
use super::fast;
use super::outcome::{names_success, outcome_from_scores};
use super::parse;
use super::schema::{Score, Trace};
use tooltune_core::Step;

/// One GENERATION observation with the given input and output, as a trace line.
fn generation(at: u32, input: &str, output: &str) -> String {
    format!(
        r#"{{"type": "GENERATION", "name": "chat", "startTime": "2025-06-02T09:15:0{at}.000Z", "input": {input}, "output": {output}}}"#
    )
}

fn trace(observations: &[String]) -> String {
    format!(
        r#"{{"id": "t1", "observations": [{}]}}"#,
        observations.join(", ")
    )
}

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "read_file", "description": "Reads a file.", "parameters": {"type": "object"}}}]"#;

#[test]
fn every_generation_input_shape_is_read() {
    let user = r#"{"role": "user", "content": "Sum notes.txt"}"#;
    // `{tools, messages}`; then a bare array; then `{tools}` alone; then a prompt string; then null and a number.
    let t = parse(
        &trace(&[
            generation(
                1,
                &format!(r#"{{"tools": {TOOLS}, "messages": [{user}], "model": "m"}}"#),
                r#"{"role": "assistant", "content": "one"}"#,
            ),
            generation(2, &format!("[{user}]"), r#""two""#),
            generation(
                3,
                &format!(r#"{{"tools": {TOOLS}, "messages": "not a list"}}"#),
                r#""three""#,
            ),
            generation(4, r#""Now say four""#, r#""four""#),
            generation(5, "null", r#""five""#),
            generation(6, "7", r#""six""#),
        ]),
        1,
    )
    .expect("trace");
    assert_eq!(t.task, "Sum notes.txt");
    assert_eq!(t.tools.len(), 1);
    assert_eq!(t.tools[0].description, "Reads a file.");
    let answers: Vec<_> = t
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Model { content, .. } => content.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(answers, ["one", "two", "three", "four", "five", "six"]);
}

#[test]
fn a_message_that_changes_in_place_is_decoded_again() {
    // The second turn's history holds, at the same place and with the same length, a different tool message
    // than the first turn's: its content must be read, not taken over from the first turn.
    let call = r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}"#;
    let t = parse(
        &trace(&[
            generation(1, &format!(r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "task"}}, {{"role": "tool", "tool_call_id": "c1", "content": "stale"}}]}}"#), call),
            generation(2, &format!(r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "task"}}, {{"role": "tool", "tool_call_id": "c1", "content": "fresh"}}]}}"#), r#""done""#),
        ]),
        1,
    )
    .expect("trace");
    let results: Vec<_> = t
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(results, ["fresh"]);
}

#[test]
fn a_bad_message_in_a_later_turn_is_named_by_its_path() {
    let e = parse(
        &trace(&[
            generation(1, r#"[{"role": "user", "content": "first"}]"#, r#""a""#),
            generation(
                2,
                r#"{"messages": [{"role": "user", "content": "first"}, {"role": 3}]}"#,
                r#""b""#,
            ),
        ]),
        4,
    )
    .expect_err("bad role");
    assert_eq!(e.line, 4);
    assert_eq!(
        e.path.as_deref(),
        Some("observations[1].input.messages[1].role"),
        "{e}"
    );
}

#[test]
fn values_the_lean_pass_drops_are_still_checked() {
    // Neither field is used (an AGENT output, a usage total), but a `Value` decode rejected them, so the record
    // is still an error, named at the same path.
    let agent = |field: &str| {
        format!(r#"{{"type": "AGENT", "startTime": "2025-06-02T09:15:00.000Z", {field}}}"#)
    };
    for (field, path, message) in [
        (
            r#""output": {"a": "\ud800"}"#,
            "observations[0].output.a",
            "unexpected end of hex escape",
        ),
        (
            r#""usage": {"total": 1e999}"#,
            "observations[0].usage.total",
            "number out of range",
        ),
        (
            r#""usage": 5"#,
            "observations[0].usage",
            "invalid type: integer `5`, expected a map",
        ),
    ] {
        let e = parse(&trace(&[agent(field)]), 2).expect_err(field);
        assert_eq!(e.path.as_deref(), Some(path), "{e}");
        assert!(e.message.starts_with(message), "{e}");
    }
    // serde_json's private raw-value key makes a `Value` decode read the string as JSON: the strict pass does.
    let t = parse(
        &trace(&[
            agent(r#""metadata": {"$serde_json::private::RawValue": "{\"a\": 1}"}"#),
            generation(1, r#"[{"role": "user", "content": "task"}]"#, r#""done""#),
        ]),
        1,
    )
    .expect("trace");
    assert_eq!(t.final_answer.as_deref(), Some("done"));
}

#[test]
fn success_names_are_matched_by_word() {
    for n in [
        "success",
        "task_success",
        "Correctness",
        "tool-correct",
        "accuracy",
    ] {
        assert!(names_success(n), "{n}");
    }
    for n in ["incorrect", "hallucination", "helpfulness", "user_feedback"] {
        assert!(!names_success(n), "{n}");
    }
}

#[test]
fn boolean_and_numeric_scores_make_the_outcome() {
    let s: Vec<Score> = serde_json::from_str(
        r#"[{"name": "helpfulness", "value": 0.1, "dataType": "NUMERIC"},
            {"name": "correctness", "value": 0.0, "dataType": "NUMERIC", "comment": "expected 69504"},
            {"name": "task_success", "value": 0, "stringValue": "False", "dataType": "BOOLEAN"}]"#,
    )
    .expect("scores");
    let o = outcome_from_scores(&s);
    assert_eq!(o.score, Some(0.0));
    assert_eq!(o.success, Some(false));
    assert_eq!(o.feedback.as_deref(), Some("expected 69504"));
}

/// The scanner must read what real exports hold (else every record pays for a pass that gives up) and build
/// what the serde pass builds.
#[test]
fn the_scanner_reads_the_fixtures_and_samples_as_the_serde_pass_does() {
    let lines = include_str!("../../tests/fixtures/langfuse.jsonl")
        .lines()
        .chain(include_str!("../../samples/langfuse.jsonl").lines())
        .filter(|l| !l.trim().is_empty());
    let mut n = 0;
    for (i, line) in lines.enumerate() {
        let fast = fast::trace(line).unwrap_or_else(|_| panic!("the scanner gave up on line {i}"));
        let lean: Trace = serde_json::from_str(line).expect("valid");
        assert_eq!(
            format!("{:?}", convert(fast, 1)),
            format!("{:?}", convert(lean, 1)),
            "line {i}"
        );
        n += 1;
    }
    assert!(n >= 10, "{n}");
}

/// The fast path's contract, checked differentially on every fixture and sample line, whole and damaged at
/// random: the scanner either gives up or builds exactly what the serde pass builds from the same text. It may
/// be stricter than serde, never looser, so a record reads the same whichever pass reads it.
mod differential {
    use super::*;
    use crate::mutate::{differential, lines};
    use proptest::prelude::*;

    #[test]
    fn the_scanner_gives_up_or_builds_what_serde_builds() {
        let (compared, tried) = differential(
            &lines(&[
                include_str!("../../tests/fixtures/langfuse.jsonl"),
                include_str!("../../samples/langfuse.jsonl"),
            ]),
            1000,
            |text| {
                let Ok(fast) = fast::trace(text) else {
                    return Ok(false);
                };
                let lean = serde_json::from_str::<Trace>(text);
                prop_assert!(
                    lean.is_ok(),
                    "the scanner read what serde rejects: {}",
                    text
                );
                let lean = lean.expect("checked");
                prop_assert_eq!(
                    format!("{:?}", convert(fast, 1)),
                    format!("{:?}", convert(lean, 1))
                );
                Ok(true)
            },
        );
        assert!(
            compared * 5 >= tried,
            "the scanner read only {compared} of {tried} damaged records"
        );
    }
}

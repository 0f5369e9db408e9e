//! OTLP specifics: traces assembled across lines when the root arrives, traces without a root flushed at the end,
//! late spans reported, structured attribute values, and results recovered from chat inputs.

use serde_json::{Value, json};
use std::io::Cursor;
use tooltune_core::{Step, Trajectory};
use tooltune_ingest::{ChunkReader, FormatChoice, Parsed, ReadOptions};

fn s(k: &str, v: &str) -> Value {
    json!({"key": k, "value": {"stringValue": v}})
}

fn span(trace: &str, id: &str, parent: &str, start_ms: u64, attrs: Vec<Value>) -> Value {
    json!({
        "traceId": trace, "spanId": id, "parentSpanId": parent, "name": "span", "kind": 1,
        "startTimeUnixNano": (start_ms * 1_000_000).to_string(),
        "endTimeUnixNano": ((start_ms + 10) * 1_000_000).to_string(),
        "attributes": attrs, "status": {}
    })
}

fn line(spans: Vec<Value>) -> String {
    json!({"resourceSpans": [{"resource": {"attributes": [s("service.name", "agent")]}, "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]})
        .to_string()
}

const TOOLS: &str = r#"[{"type": "function", "name": "calculator", "description": "Evaluate arithmetic.", "parameters": {"type": "object"}}]"#;

fn chat(trace: &str, id: &str, parent: &str, start: u64, input: Value, output: Value) -> Value {
    span(
        trace,
        id,
        parent,
        start,
        vec![
            s("gen_ai.operation.name", "chat"),
            s("gen_ai.request.model", "qwen2.5-1.5b-instruct"),
            s("gen_ai.tool.definitions", TOOLS),
            s("gen_ai.input.messages", &input.to_string()),
            s("gen_ai.output.messages", &output.to_string()),
        ],
    )
}

fn user(text: &str) -> Value {
    json!({"role": "user", "parts": [{"type": "text", "content": text}]})
}

fn answer(text: &str) -> Value {
    json!({"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"})
}

/// The texts of a trajectory's tool results, in order.
fn tool_results(t: &Trajectory) -> Vec<&str> {
    t.steps
        .iter()
        .filter_map(|s| match s {
            Step::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

fn read(text: String, opts: ReadOptions) -> Vec<Parsed> {
    let mut r = ChunkReader::new(Cursor::new(text), "otel.jsonl", FormatChoice::Auto, opts)
        .expect("reader");
    let mut out = Vec::new();
    while let Some(c) = r.next_chunk().expect("read") {
        out.extend(c);
    }
    assert_eq!(r.pending_traces(), 0, "everything is flushed at the end");
    out
}

#[test]
fn a_trace_without_root_is_assembled_from_its_chat_spans_at_eof_and_one_without_chat_spans_is_an_error()
 {
    let a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    let text = [
        line(vec![chat(
            a,
            "a1",
            "a0",
            1,
            json!([user("What is 2+2?")]),
            json!([answer("4")]),
        )]),
        line(vec![span(
            b,
            "b1",
            "b0",
            5,
            vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", "calculator"),
            ],
        )]),
    ]
    .join("\n");
    let parsed = read(text, ReadOptions::default());
    assert_eq!(parsed.len(), 2);
    let t = parsed[0].result.as_ref().expect("assembled without a root");
    assert_eq!(parsed[0].line, 1);
    assert_eq!(t.task, "What is 2+2?");
    assert_eq!(t.final_answer.as_deref(), Some("4"));
    assert_eq!(t.meta.external_id.as_deref(), Some(a));
    let e = parsed[1].result.as_ref().expect_err("nothing to assemble");
    assert!(
        e.message.contains(b) && e.message.contains("root span never arrived"),
        "{e}"
    );
    assert_eq!(e.line, 2);
}

#[test]
fn spans_after_the_root_are_reported_not_glued_to_a_new_trace() {
    let a = "cccccccccccccccccccccccccccccccc";
    let root = span(
        a,
        "r",
        "",
        0,
        vec![s("gen_ai.operation.name", "invoke_agent")],
    );
    let text = [
        line(vec![
            chat(
                a,
                "c1",
                "r",
                1,
                json!([user("What is 2+2?")]),
                json!([answer("4")]),
            ),
            root,
        ]),
        line(vec![chat(
            a,
            "c2",
            "r",
            20,
            json!([user("What is 2+2?")]),
            json!([answer("four")]),
        )]),
    ]
    .join("\n");
    let parsed = read(text, ReadOptions::default());
    assert_eq!(parsed.len(), 2);
    assert!(parsed[0].result.is_ok());
    let e = parsed[1].result.as_ref().expect_err("late span");
    assert!(e.message.contains("arrived after its root span"), "{e}");
}

#[test]
fn only_unfinished_traces_are_held_in_memory() {
    // 300 traces, each spread over two lines and completed by its root on the second.
    let mut lines = Vec::new();
    for i in 0..300 {
        let t = format!("{i:032x}");
        lines.push(line(vec![chat(
            &t,
            "c",
            "r",
            1,
            json!([user(&format!("task {i}"))]),
            json!([answer("ok")]),
        )]));
        lines.push(line(vec![span(
            &t,
            "r",
            "",
            0,
            vec![s("tooltune.outcome.success", "true")],
        )]));
    }
    let mut r = ChunkReader::new(
        Cursor::new(lines.join("\n")),
        "otel.jsonl",
        FormatChoice::Auto,
        ReadOptions {
            chunk_records: 7,
            ..ReadOptions::default()
        },
    )
    .expect("reader");
    let mut tasks = Vec::new();
    while let Some(c) = r.next_chunk().expect("read") {
        assert!(
            r.pending_traces() <= 1,
            "{} traces pending",
            r.pending_traces()
        );
        for p in c {
            let t = p.result.expect("valid");
            assert_eq!(t.outcome.success, Some(true));
            tasks.push(t.task);
        }
    }
    assert_eq!(
        tasks,
        (0..300).map(|i| format!("task {i}")).collect::<Vec<_>>()
    );
}

#[test]
fn structured_attributes_and_results_from_chat_inputs() {
    // Attributes recorded structured (arrayValue/kvlistValue) instead of JSON strings, no execute_tool spans: the
    // tool result is only in the second chat span's input.
    let t = "dddddddddddddddddddddddddddddddd";
    let kv = |k: &str, v: Value| json!({"key": k, "value": v});
    let text_part = |c: &str| json!({"kvlistValue": {"values": [kv("type", json!({"stringValue": "text"})), kv("content", json!({"stringValue": c}))]}});
    let msg = |role: &str, parts: Vec<Value>| json!({"kvlistValue": {"values": [kv("role", json!({"stringValue": role})), kv("parts", json!({"arrayValue": {"values": parts}}))]}});
    let call_part = json!({"kvlistValue": {"values": [
        kv("type", json!({"stringValue": "tool_call"})), kv("id", json!({"stringValue": "k1"})),
        kv("name", json!({"stringValue": "calculator"})),
        kv("arguments", json!({"kvlistValue": {"values": [kv("expression", json!({"stringValue": "2+2"}))]}}))]}});
    let response_part = json!({"kvlistValue": {"values": [
        kv("type", json!({"stringValue": "tool_call_response"})), kv("id", json!({"stringValue": "k1"})),
        kv("response", json!({"intValue": "4"}))]}});
    let defs = json!({"arrayValue": {"values": [{"kvlistValue": {"values": [
        kv("type", json!({"stringValue": "function"})), kv("name", json!({"stringValue": "calculator"})),
        kv("description", json!({"stringValue": "Evaluate arithmetic."}))]}}]}});
    let first = span(
        t,
        "c1",
        "r",
        1,
        vec![
            s("gen_ai.operation.name", "chat"),
            kv("gen_ai.tool.definitions", defs.clone()),
            kv(
                "gen_ai.input.messages",
                json!({"arrayValue": {"values": [msg("user", vec![text_part("What is 2+2?")])]}}),
            ),
            kv(
                "gen_ai.output.messages",
                json!({"arrayValue": {"values": [msg("assistant", vec![call_part.clone()])]}}),
            ),
            kv("gen_ai.usage.input_tokens", json!({"intValue": 120})),
            kv("gen_ai.usage.output_tokens", json!({"intValue": "9"})),
        ],
    );
    let second = span(
        t,
        "c2",
        "r",
        30,
        vec![
            s("gen_ai.operation.name", "chat"),
            kv("gen_ai.tool.definitions", defs),
            kv(
                "gen_ai.input.messages",
                json!({"arrayValue": {"values": [
            msg("user", vec![text_part("What is 2+2?")]), msg("assistant", vec![call_part]), msg("tool", vec![response_part])]}}),
            ),
            kv(
                "gen_ai.output.messages",
                json!({"arrayValue": {"values": [msg("assistant", vec![text_part("4")])]}}),
            ),
        ],
    );
    let mut root = span(
        t,
        "r",
        "",
        0,
        vec![kv("tooltune.outcome.score", json!({"doubleValue": 1.0}))],
    );
    root["status"] = json!({"code": "STATUS_CODE_OK"});
    let parsed = read(line(vec![first, second, root]), ReadOptions::default());
    let tr = parsed[0].result.as_ref().expect("valid");
    assert_eq!(tr.tools[0].description, "Evaluate arithmetic.");
    assert_eq!(tr.tools[0].input_schema, json!({}).into());
    assert_eq!(tr.steps.len(), 3);
    match &tr.steps[0] {
        Step::Model {
            tool_calls, usage, ..
        } => {
            assert_eq!(tool_calls[0].arguments, json!({"expression": "2+2"}));
            assert_eq!(
                usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
                Some((120, 9))
            );
        }
        other => panic!("expected a model step, got {other:?}"),
    }
    match &tr.steps[1] {
        Step::ToolResult {
            call_id,
            name,
            content,
            ..
        } => {
            assert_eq!(
                (call_id.as_deref(), name.as_str(), content.as_str()),
                (Some("k1"), "calculator", "4")
            );
        }
        other => panic!("expected a tool result, got {other:?}"),
    }
    assert_eq!(tr.final_answer.as_deref(), Some("4"));
    assert_eq!(tr.outcome.score, Some(1.0));
    assert_eq!(tr.meta.client.as_deref(), Some("agent"));
}

#[test]
fn a_malformed_messages_attribute_points_at_the_attribute() {
    let t = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
    let mut c = chat(t, "c1", "", 1, json!([user("x")]), json!([answer("y")]));
    c["attributes"][3] = s("gen_ai.input.messages", "[{\"role\": \"user\", ");
    let parsed = read(line(vec![c]), ReadOptions::default());
    let e = parsed[0]
        .result
        .as_ref()
        .expect_err("bad JSON in attribute");
    assert_eq!(
        e.path.as_deref(),
        Some("resourceSpans[0].scopeSpans[0].spans[0].attributes[3].value.stringValue")
    );
    assert!(
        e.message.contains("span c1")
            && e.message
                .contains("`gen_ai.input.messages` is not valid JSON"),
        "{e}"
    );
}

#[test]
fn tool_definitions_that_are_not_a_list_are_an_error_on_every_trace() {
    // The definitions string is decoded once per thread and cached; a failed decode must not be cached, so two
    // traces that share the bad string both report it, at the span that holds it.
    let bad = |t: &str| {
        let mut c = chat(t, "c1", "", 1, json!([user("x")]), json!([answer("y")]));
        c["attributes"][2] = s("gen_ai.tool.definitions", r#"{"name": "calculator"}"#);
        line(vec![c])
    };
    let text = format!(
        "{}\n{}\n",
        bad("12121212121212121212121212121212"),
        bad("34343434343434343434343434343434")
    );
    let parsed = read(text, ReadOptions::default());
    assert_eq!(parsed.len(), 2);
    for p in &parsed {
        let e = p.result.as_ref().expect_err("definitions are not a list");
        assert!(
            e.message.contains("span c1")
                && e.message
                    .contains("`gen_ai.tool.definitions` should be an array, found an object"),
            "{e}"
        );
    }
}

#[test]
fn a_wrong_span_field_type_reports_the_path() {
    let t = "ffffffffffffffffffffffffffffffff";
    let mut sp = span(t, "r", "", 1, vec![]);
    sp["startTimeUnixNano"] = json!("yesterday");
    let parsed = read(line(vec![sp]), ReadOptions::default());
    let e = parsed[0].result.as_ref().expect_err("bad time");
    assert_eq!(
        e.path.as_deref(),
        Some("resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano")
    );
}

#[test]
fn a_history_message_that_changes_in_place_is_read_again() {
    // Chat spans repeat the history; the reader reuses a message equal to the one at the same place in the previous
    // span. Here the second span holds, at the same place and with the same length, a different tool response than
    // the first: the result must be the second's.
    let t = "abababababababababababababababab";
    let call = json!({"role": "assistant", "parts": [{"type": "tool_call", "id": "k1", "name": "calculator",
                                                     "arguments": {"expression": "2+2"}}]});
    let response = |text: &str| json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": "k1", "response": text}]});
    let c1 = chat(
        t,
        "c1",
        "r",
        1,
        json!([user("What is 2+2?"), response("stale")]),
        json!([call]),
    );
    let c2 = chat(
        t,
        "c2",
        "r",
        2,
        json!([user("What is 2+2?"), response("fresh")]),
        json!([answer("4")]),
    );
    let root = span(
        t,
        "r",
        "",
        0,
        vec![s("gen_ai.operation.name", "invoke_agent")],
    );
    let out = read(line(vec![c1, c2, root]), ReadOptions::default());
    let traj = out[0].result.as_ref().expect("trace");
    assert_eq!(tool_results(traj), ["fresh"]);
}

/// A three-turn trace whose chat spans repeat the history; `write` formats each span's input messages.
fn three_turns(t: &str, write: impl Fn(&Value) -> String) -> String {
    let call = |id: &str| {
        json!({"role": "assistant", "parts": [{"type": "tool_call", "id": id, "name": "calculator",
                                              "arguments": {"expression": "1+1"}}]})
    };
    let response = |id: &str, text: &str| json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": id, "response": text}]});
    let inputs = [
        json!([user("Add twice.")]),
        json!([user("Add twice."), call("k1"), response("k1", "2 \"two\"")]),
        json!([
            user("Add twice."),
            call("k1"),
            response("k1", "2 \"two\""),
            call("k2"),
            response("k2", "2\n")
        ]),
    ];
    let outputs = [
        json!([call("k1")]),
        json!([call("k2")]),
        json!([answer("2")]),
    ];
    let mut spans: Vec<Value> = inputs
        .iter()
        .zip(&outputs)
        .enumerate()
        .map(|(n, (input, output))| {
            let mut c = chat(
                t,
                &format!("c{n}"),
                "r",
                n as u64 + 1,
                json!([]),
                output.clone(),
            );
            c["attributes"][3] = s("gen_ai.input.messages", &write(input));
            c
        })
        .collect();
    spans.push(span(
        t,
        "r",
        "",
        0,
        vec![s("gen_ai.operation.name", "invoke_agent")],
    ));
    line(spans)
}

#[test]
fn a_history_read_in_appended_parts_equals_one_read_whole() {
    // Compact inputs, each the previous one with messages appended, are read a new part at a time; pretty-printed
    // ones are not prefixes of each other as written and are read whole. Both must give the same trajectory.
    let t = "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";
    let compact = read(three_turns(t, Value::to_string), ReadOptions::default());
    let pretty = read(
        three_turns(t, |v| serde_json::to_string_pretty(v).expect("json")),
        ReadOptions::default(),
    );
    let a = compact[0].result.as_ref().expect("compact");
    let b = pretty[0].result.as_ref().expect("pretty");
    assert_eq!(a, b);
    assert_eq!(tool_results(a), ["2 \"two\"", "2\n"]);
    assert_eq!(a.steps.len(), 5);
}

#[test]
fn a_bad_message_appended_to_the_history_is_reported_at_its_index() {
    // The third span's input is the second's with a message appended that is not a message: the error names the
    // attribute and the message's index in the whole list, as when the list is read whole.
    let t = "efefefefefefefefefefefefefefefef";
    let text = three_turns(t, |v| {
        let mut v = v.clone();
        if v.as_array().is_some_and(|a| a.len() == 5) {
            v[4] = json!({"role": "tool", "parts": "not a list"});
        }
        v.to_string()
    });
    let parsed = read(text, ReadOptions::default());
    let e = parsed[0].result.as_ref().expect_err("bad message");
    assert!(
        e.message.contains("span c2")
            && e.message
                .contains("`gen_ai.input.messages`[4] does not follow the messages schema"),
        "{e}"
    );
    assert_eq!(
        e.path.as_deref(),
        Some("resourceSpans[0].scopeSpans[0].spans[2].attributes[3].value.stringValue")
    );
}

#[test]
fn keys_and_values_written_with_escapes_read_as_plain_ones() {
    // JSON lets a writer escape any character; attributes are looked up and compared by their decoded text.
    let t = "12341234123412341234123412341234";
    let c = chat(
        t,
        "c1",
        "",
        1,
        json!([user("What is 2+2?")]),
        json!([answer("4")]),
    );
    let plain = line(vec![c]);
    let escaped = plain
        .replace("gen_ai.operation.name", "gen_ai\\u002eoperation.name")
        .replace("\"chat\"", "\"\\u0063hat\"")
        .replace("qwen2.5", "qwen2\\u002e5");
    assert_ne!(plain, escaped);
    let a = read(plain, ReadOptions::default());
    let b = read(escaped, ReadOptions::default());
    let (a, b) = (
        a[0].result.as_ref().expect("plain"),
        b[0].result.as_ref().expect("escaped"),
    );
    assert_eq!(a, b);
    assert_eq!(b.meta.model.as_deref(), Some("qwen2.5-1.5b-instruct"));
}

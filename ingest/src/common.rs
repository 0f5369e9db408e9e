//! Helpers shared by the format readers: JSON decoding with paths, OpenAI-style messages and tool lists held as
//! loose JSON (Langfuse and OTLP embed them), argument strings, timestamps, and the final validation step.

use crate::{Format, RecordError};
use serde::Deserialize;
use serde_json::Value;
use std::cell::RefCell;
use tooltune_core::{Step, ToolCall, ToolSpec, Trajectory};

/// Decodes one record with serde, reporting the JSON path of the first field that does not fit.
/// Records may borrow from `text` (raw JSON kept undecoded until it is needed).
pub(crate) fn from_json<'a, T: Deserialize<'a>>(
    text: &'a str,
    line: u64,
) -> Result<T, RecordError> {
    // Path tracking wraps every nested value and costs about a third of the parse on records with large free-form
    // JSON (message histories). Bad records are rare, so decode plainly first and only replay a failure with
    // tracking to find its path.
    if let Ok(value) = serde_json::from_str(text) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        RecordError::new(line, (path != ".").then_some(path), record_message(&inner))
    })?;
    // A record is one JSON value per line; anything after it is a sign of two records glued together.
    de.end()
        .map_err(|e| RecordError::new(line, None, record_message(&e)))?;
    Ok(value)
}

/// Decodes `raw`, the JSON of the record field `field` (a slice of the record `text`, kept raw by the first pass),
/// with errors that carry the path and the position in the whole record, as if the record had been decoded in one
/// piece.
pub(crate) fn decode_at<'a, T: Deserialize<'a>>(
    text: &str,
    raw: &'a str,
    line: u64,
    field: &str,
) -> Result<T, RecordError> {
    if let Ok(value) = serde_json::from_str(raw) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // serde_json counts lines and columns from 1 within `raw`; `raw` starts `offset` bytes into the record.
        let offset = raw.as_ptr() as usize - text.as_ptr() as usize;
        let message = if inner.line() == 0 {
            inner.to_string()
        } else {
            let before = &text.as_bytes()[..offset];
            let lines_before = memchr::memchr_iter(b'\n', before).count();
            let (l, c) = if inner.line() == 1 {
                let line_start = memchr::memrchr(b'\n', before).map_or(0, |nl| nl + 1);
                (1 + lines_before, offset - line_start + inner.column())
            } else {
                (lines_before + inner.line(), inner.column())
            };
            format!("{}{}", bare_message(&inner), position(l as u64, c as u64))
        };
        let at = if path == "." {
            field.to_string()
        } else {
            format!(
                "{field}{}{path}",
                if path.starts_with('[') { "" } else { "." }
            )
        };
        RecordError::at(line, at, message)
    })
}

/// serde_json's message with its "at line 1 column N" turned into "(column N)": every record is one line, so
/// the line is ours to report and only the column tells the reader anything. For JSON that is not a whole record
/// (a payload held in a string); a record's own errors go through [`record_message`].
pub(crate) fn json_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    if e.line() == 0 {
        return s;
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match s.strip_suffix(&suffix) {
        Some(m) => format!("{m} (column {})", e.column()),
        None => s,
    }
}

/// serde_json's message without its " at line L column C".
fn bare_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match s.strip_suffix(&suffix) {
        Some(m) => m.to_string(),
        None => s,
    }
}

/// An error of a record's JSON: serde_json's message and its position as [`position`] writes it.
fn record_message(e: &serde_json::Error) -> String {
    if e.line() == 0 {
        return e.to_string();
    }
    format!(
        "{}{}",
        bare_message(e),
        position(e.line() as u64, e.column() as u64)
    )
}

thread_local! {
    /// Where the record being parsed on this thread starts in its input (line, column), when it does not start a
    /// line of its own; see [`with_origin`].
    static ORIGIN: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` (the parse of one record) with positions in the record's errors reported in its input: the record
/// starts at `origin` (line, column) there. Without an origin a position is the column in the record's line, which
/// in JSON Lines is the input's line. The parsers keep their signatures; only the few places that write a position
/// read the origin.
pub(crate) fn with_origin<T>(origin: Option<(u64, u64)>, f: impl FnOnce() -> T) -> T {
    let before = ORIGIN.with(|o| o.replace(origin));
    let out = f();
    ORIGIN.with(|o| o.set(before));
    out
}

/// ` (column C)` for a position on the record's first line in JSON Lines; ` (line L, column C)` in the input for a
/// record with an origin, or on a later line of a record.
fn position(line: u64, column: u64) -> String {
    match ORIGIN.with(|o| o.get()) {
        None if line == 1 => format!(" (column {column})"),
        None => format!(" (line {line} of the record, column {column})"),
        Some((l0, c0)) if line == 1 => format!(" (line {l0}, column {})", c0 + column - 1),
        Some((l0, _)) => format!(" (line {}, column {column})", l0 + line - 1),
    }
}

/// Sets the source, then runs the invariants every stored trajectory keeps, turning a failure into a record error
/// that carries the trajectory path of the offending field.
pub(crate) fn finish(
    format: Format,
    mut t: Trajectory,
    line: u64,
) -> Result<Trajectory, RecordError> {
    // A tooltune record may have been written by another component (the evaluator writes `evaluator`); keep its
    // word and only fill the source in when the record left it empty.
    if format != Format::Tooltune || t.meta.source.is_empty() {
        t.meta.source = format.name().to_string();
    }
    t.validate()
        .map_err(|e| RecordError::at(line, e.path, e.message))?;
    Ok(t)
}

/// Tool-call arguments logged as a string: parsed when they are JSON, otherwise kept as the string itself, so a
/// model that wrote broken JSON is visible as such instead of being dropped.
pub(crate) fn parse_arguments(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// A loose JSON value as text: strings as they are, `null` as nothing, anything else as compact JSON.
pub(crate) fn value_to_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A message in OpenAI chat shape, read leniently from loose JSON.
#[derive(Debug, Default)]
pub(crate) struct ChatMsg {
    pub role: String,
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

/// Text of an OpenAI `content`: a string, `null`, or an array of parts whose text parts are joined by newlines.
pub(crate) fn content_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

/// Reads one OpenAI-shaped message (`role`, `content`, `tool_calls`, `function_call`, `tool_call_id`).
/// `default_role` applies when the producer left the role out (Langfuse outputs sometimes do).
/// Errors are `(path suffix, message)` so the caller can prefix where the message sits.
pub(crate) fn chat_msg(v: &Value, default_role: &str) -> Result<ChatMsg, (String, String)> {
    let Value::Object(o) = v else {
        return Err((
            String::new(),
            format!("expected a message object, found {}", kind(v)),
        ));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) => r.clone(),
        None | Some(Value::Null) => default_role.to_string(),
        Some(other) => {
            return Err((
                ".role".into(),
                format!("expected a string, found {}", kind(other)),
            ));
        }
    };
    let text = o.get("content").and_then(content_text);
    let mut tool_calls = match o.get("tool_calls").filter(|c| !c.is_null()) {
        Some(calls) => tool_calls(calls)?,
        None => Vec::new(),
    };
    tool_calls.extend(o.get("function_call").and_then(function_call));
    Ok(ChatMsg {
        role,
        text,
        tool_calls,
        tool_call_id: o
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// A message's `tool_calls` (not null). Errors as [`chat_msg`]'s.
pub(crate) fn tool_calls(calls: &Value) -> Result<Vec<ToolCall>, (String, String)> {
    let Value::Array(calls) = calls else {
        return Err((
            ".tool_calls".into(),
            format!("expected an array, found {}", kind(calls)),
        ));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let f = c.get("function").unwrap_or(c);
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
            (
                format!(".tool_calls[{i}].function.name"),
                "missing tool name".to_string(),
            )
        })?;
        out.push(ToolCall {
            id: c.get("id").and_then(Value::as_str).map(str::to_string),
            name: name.to_string(),
            arguments: arguments_value(f.get("arguments")),
        });
    }
    Ok(out)
}

/// The legacy `function_call` of the functions API: one call without an id, when it is an object with a name.
pub(crate) fn function_call(fc: &Value) -> Option<ToolCall> {
    let name = fc.as_object()?.get("name")?.as_str()?;
    Some(ToolCall {
        id: None,
        name: name.to_string(),
        arguments: arguments_value(fc.get("arguments")),
    })
}

/// Arguments as logged: a JSON string (OpenAI), an object (already decoded), or nothing.
pub(crate) fn arguments_value(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => parse_arguments(s),
        Some(Value::Null) | None => Value::Object(Default::default()),
        Some(other) => other.clone(),
    }
}

/// [`arguments_value`] of a value the caller owns, without copying it.
pub(crate) fn arguments_owned(v: Option<Value>) -> Value {
    match v {
        Some(Value::String(s)) => parse_arguments(&s),
        Some(Value::Null) | None => Value::Object(Default::default()),
        Some(other) => other,
    }
}

/// A tool definition in either the OpenAI request shape (`{type: "function", function: {name, description,
/// parameters}}`) or a flat one (`{name, description, parameters | input_schema | inputSchema}`, as the GenAI
/// semantic conventions and MCP write it). `None` when it names no tool.
pub(crate) fn tool_spec(v: &Value) -> Option<ToolSpec> {
    let f = match v.get("function") {
        Some(f) if f.is_object() => f,
        _ => v,
    };
    let name = f.get("name")?.as_str()?.to_string();
    let description = f
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let input_schema = ["parameters", "input_schema", "inputSchema"]
        .iter()
        .find_map(|k| f.get(*k).filter(|s| !s.is_null()))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    Some(ToolSpec {
        name,
        description,
        input_schema: input_schema.into(),
    })
}

thread_local! {
    /// Tool lists this thread has already decoded, by their raw JSON text. A log's records show the same tool
    /// list over and over (one agent, one server), and decoding its schemas into `Value`s was the largest single
    /// cost of reading a Langfuse trace; a clone of the decoded list costs a fraction of that.
    /// Hashed with foldhash: with SipHash, hashing the text (a kilobyte or more) was 5% of parsing a record.
    static TOOL_LISTS: RefCell<foldhash::HashMap<Box<str>, Vec<ToolSpec>>> = RefCell::new(Default::default());
}
/// At most this many lists are kept per thread; the cache is emptied when full (logs have few distinct lists).
const TOOL_LISTS_LIMIT: usize = 64;
/// A list longer than this is decoded every time, which bounds the cache at `64 x 256 KiB` of text per thread.
const TOOL_LIST_MAX_BYTES: usize = 256 * 1024;

/// The tools of the raw JSON `raw`: from this thread's cache when the same text was decoded before, otherwise by
/// `decode` (whose result is cached when it succeeds). The cache is keyed by the exact text, so it returns what
/// `decode` would.
pub(crate) fn cached_tools<E>(
    raw: &str,
    decode: impl FnOnce() -> Result<Vec<ToolSpec>, E>,
) -> Result<Vec<ToolSpec>, E> {
    if raw.len() > TOOL_LIST_MAX_BYTES {
        return decode();
    }
    if let Some(hit) = TOOL_LISTS.with_borrow(|c| c.get(raw).cloned()) {
        return Ok(hit);
    }
    let tools = decode()?;
    TOOL_LISTS.with_borrow_mut(|c| {
        if c.len() >= TOOL_LISTS_LIMIT {
            c.clear();
        }
        c.insert(raw.into(), tools.clone());
    });
    Ok(tools)
}

/// Adds tools not yet listed (by name); the first definition of a name wins, as it is the one the model saw first.
pub(crate) fn add_tools(into: &mut Vec<ToolSpec>, new: impl IntoIterator<Item = ToolSpec>) {
    for t in new {
        if !into.iter().any(|x| x.name == t.name) {
            into.push(t);
        }
    }
}

/// The agent's final answer: the text of the last model turn that made no tool call.
pub(crate) fn last_answer(steps: &[Step]) -> Option<String> {
    steps.iter().rev().find_map(|s| match s {
        Step::Model {
            content: Some(c),
            tool_calls,
            ..
        } if tool_calls.is_empty() && !c.trim().is_empty() => Some(c.clone()),
        _ => None,
    })
}

/// A JSON type's name, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A score logged as a number or as a numeric string (OpenAI's request `metadata` only holds strings).
pub(crate) fn score_value(v: &Value) -> Result<Option<f64>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => Ok(n.as_f64()),
        Value::String(s) => s
            .trim()
            .parse::<f64>()
            .map(Some)
            .map_err(|_| format!("expected a number, found the string {s:?}")),
        other => Err(format!("expected a number, found {}", kind(other))),
    }
}

/// A success flag logged as a boolean or as the string `"true"`/`"false"`.
pub(crate) fn success_value(v: &Value) -> Result<Option<bool>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Ok(Some(true)),
        Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Ok(Some(false)),
        other => Err(format!(
            "expected a boolean (or \"true\"/\"false\"), found {}",
            kind(other)
        )),
    }
}

/// RFC 3339 (UTC) of a Unix time in nanoseconds.
pub(crate) fn rfc3339_from_nanos(nanos: u64) -> Option<String> {
    let secs = i64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = (nanos % 1_000_000_000) as u32;
    chrono::DateTime::from_timestamp(secs, sub)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// RFC 3339 (UTC) of a Unix time in seconds.
pub(crate) fn rfc3339_from_secs(secs: i64) -> Option<String> {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Milliseconds between two RFC 3339 times, when both parse and the end is not before the start.
pub(crate) fn ms_between(start: &str, end: &str) -> Option<f64> {
    let s = chrono::DateTime::parse_from_rfc3339(start).ok()?;
    let e = chrono::DateTime::parse_from_rfc3339(end).ok()?;
    let micros = (e - s).num_microseconds()?;
    (micros >= 0).then(|| micros as f64 / 1000.0)
}

/// Sort key of an RFC 3339 time: the instant when it parses, so mixed offsets and precisions order correctly.
pub(crate) fn time_key(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_keep_broken_json_as_a_string() {
        assert_eq!(parse_arguments(r#"{"a": 1}"#), json!({"a": 1}));
        assert_eq!(parse_arguments(r#"{"a": 1"#), json!(r#"{"a": 1"#));
    }

    #[test]
    fn tool_spec_reads_openai_and_flat_shapes() {
        let a = tool_spec(&json!({"type": "function", "function": {"name": "calculator", "description": "d", "parameters": {"type": "object"}}}))
            .expect("openai shape");
        let b = tool_spec(&json!({"type": "function", "name": "calculator", "description": "d", "parameters": {"type": "object"}}))
            .expect("flat shape");
        assert_eq!(a, b);
        assert_eq!(a.input_schema, json!({"type": "object"}).into());
        assert!(tool_spec(&json!({"type": "function"})).is_none());
    }

    #[test]
    fn cached_tools_decode_each_text_once_and_share_the_schemas() {
        let raw = r#"[{"name": "cached_tools_test", "parameters": {"type": "object"}}]"#;
        let decode = |text: &str| -> Result<Vec<ToolSpec>, ()> {
            let v: Vec<Value> = serde_json::from_str(text).map_err(|_| ())?;
            Ok(v.iter().filter_map(tool_spec).collect())
        };
        let mut calls = 0;
        let mut read = |text: &str| {
            cached_tools(text, || {
                calls += 1;
                decode(text)
            })
        };
        let a = read(raw).expect("decodes");
        let b = read(raw).expect("cached");
        let other = read(&raw.replace("object", "string")).expect("decodes");
        assert_eq!(a, b);
        assert!(std::sync::Arc::ptr_eq(
            &a[0].input_schema,
            &b[0].input_schema
        ));
        assert_eq!(other[0].input_schema, json!({"type": "string"}).into());
        // A failed decode is not cached: the next read of the text decodes (and fails) again.
        assert!(read("[1,").is_err() && read("[1,").is_err());
        assert_eq!(calls, 4);
    }

    #[test]
    fn json_message_replaces_line_with_column() {
        let e = serde_json::from_str::<Value>("{\"a\": ").expect_err("truncated");
        assert_eq!(json_message(&e), "EOF while parsing a value (column 6)");
    }

    #[test]
    fn a_record_with_an_origin_reports_positions_in_its_input() {
        // A pretty-printed record starting at line 10, column 3 of its file; the bad value is on its third line.
        let text = "{\n  \"a\": 1,\n  \"b\": 1x\n}";
        let serde = serde_json::from_str::<Value>(text).expect_err("bad number");
        assert_eq!(serde.line(), 3);
        let col = serde.column();
        let e = from_json::<Value>(text, 10).expect_err("bad number");
        assert!(
            e.message
                .ends_with(&format!("(line 3 of the record, column {col})")),
            "{e}"
        );
        let e = with_origin(Some((10, 3)), || from_json::<Value>(text, 10)).expect_err("bad");
        assert!(
            e.message.ends_with(&format!("(line 12, column {col})")),
            "{e}"
        );
        // On the record's first line the column is shifted by where the record starts.
        let one = "{\"a\": x}";
        let col = serde_json::from_str::<Value>(one)
            .expect_err("bad")
            .column();
        let e = with_origin(Some((4, 7)), || from_json::<Value>(one, 4)).expect_err("bad");
        assert!(
            e.message
                .ends_with(&format!("(line 4, column {})", col + 6)),
            "{e}"
        );
        // The origin is the parse's only: afterwards positions are columns again.
        let e = from_json::<Value>(one, 4).expect_err("bad");
        assert!(e.message.ends_with(&format!("(column {col})")), "{e}");
    }

    #[test]
    fn durations_and_times() {
        assert_eq!(
            ms_between("2025-06-02T09:15:02.120Z", "2025-06-02T09:15:03.000Z"),
            Some(880.0)
        );
        assert_eq!(
            rfc3339_from_nanos(1_748_855_702_120_000_000).as_deref(),
            Some("2025-06-02T09:15:02.120Z")
        );
        assert!(time_key("2025-06-02T09:15:02.5Z") > time_key("2025-06-02T11:15:02.4+02:00"));
    }
}

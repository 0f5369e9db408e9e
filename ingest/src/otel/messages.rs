//! The GenAI messages attributes (`gen_ai.input.messages`, `gen_ai.output.messages`): decoded lean, then turned
//! into the roles, texts, tool calls and tool results the trace builder reads.

use super::span::SpanRec;
use crate::RecordError;
use crate::common::{arguments_owned, chat_msg, value_to_text};
use serde::Deserialize;
use serde_json::Value;
use tooltune_core::ToolCall;

/// One message of `gen_ai.input.messages` / `gen_ai.output.messages` (parts), or an OpenAI-style message (content)
/// as older instrumentations wrote it.
pub(super) struct OMsg {
    pub(super) role: String,
    pub(super) text: Option<String>,
    pub(super) calls: Vec<ToolCall>,
    /// Tool results sent back to the model: call id and text.
    pub(super) responses: Vec<(Option<String>, String)>,
}

/// A message as `gen_ai.*.messages` holds it, decoded without building a JSON map per message and part (these
/// attributes carry the whole history on every chat span, so they dominate the cost of reading OTLP).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct LiteMsg {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    parts: Option<Vec<LitePart>>,
    /// OpenAI-style fields, as older instrumentations wrote messages.
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct LitePart {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
    /// One example in the conventions names the response field `result`.
    #[serde(default)]
    result: Option<Value>,
}

/// A messages text as `Vec<LiteMsg>` (serde_json names any error). A scanner pass here, which skipped the payloads a
/// history does not need, was removed: taking it out changed a 100k-trace ingest by less than its noise.
pub(super) fn decode_messages(text: &str) -> serde_json::Result<Vec<LiteMsg>> {
    serde_json::from_str(text)
}

/// One message of a messages text, as [`decode_messages`] reads each.
pub(super) fn decode_message(text: &str) -> serde_json::Result<LiteMsg> {
    serde_json::from_str(text)
}

/// Decodes a messages attribute (`gen_ai.input.messages`, `gen_ai.output.messages`), recorded as a JSON string or
/// structured. `None` when the span does not have it.
pub(super) fn messages(rec: &SpanRec, key: &str) -> Result<Option<Vec<OMsg>>, RecordError> {
    let Some((i, v)) = rec.attr(key) else {
        return Ok(None);
    };
    let lite: Vec<LiteMsg> = match v.string_value {
        Some(s) => decode_messages(&s.text()).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Data => "does not follow the messages schema",
                _ => "is not valid JSON",
            };
            rec.error(
                &format!(".attributes[{i}].value.stringValue"),
                format!("`{key}` {what}: {}", crate::common::json_message(&e)),
            )
        })?,
        None => Vec::<LiteMsg>::deserialize(&v.to_json()).map_err(|e| {
            rec.error(
                &format!(".attributes[{i}].value"),
                format!("`{key}` does not follow the messages schema: {e}"),
            )
        })?,
    };
    let mut out = Vec::with_capacity(lite.len());
    for (n, m) in lite.into_iter().enumerate() {
        out.push(omsg(rec, key, i, n, m)?);
    }
    Ok(Some(out))
}

/// Converts one decoded message; `i` is the attribute's index and `n` the message's, for errors.
pub(super) fn omsg(
    rec: &SpanRec,
    key: &str,
    i: usize,
    n: usize,
    m: LiteMsg,
) -> Result<OMsg, RecordError> {
    let role = m.role.unwrap_or_else(|| "assistant".to_string());
    if let Some(parts) = m.parts {
        let mut texts: Vec<String> = Vec::new();
        let mut calls = Vec::new();
        let mut responses = Vec::new();
        for p in parts {
            match p.kind.as_deref() {
                Some("text") => {
                    if let Some(Value::String(t)) = p.content {
                        texts.push(t);
                    }
                }
                Some("tool_call") => {
                    let Some(name) = p.name else {
                        return Err(rec.error(
                            &format!(".attributes[{i}]"),
                            format!("`{key}`[{n}]: a tool_call part has no name"),
                        ));
                    };
                    calls.push(ToolCall {
                        id: p.id,
                        name,
                        arguments: arguments_owned(p.arguments),
                    });
                }
                Some("tool_call_response") => responses.push((
                    p.id,
                    value_to_text(&p.response.or(p.result).unwrap_or(Value::Null)),
                )),
                _ => {}
            }
        }
        Ok(OMsg {
            role,
            text: (!texts.is_empty()).then(|| texts.join("\n")),
            calls,
            responses,
        })
    } else {
        let mut o = serde_json::Map::new();
        o.insert("role".into(), Value::String(role));
        o.insert("content".into(), m.content.unwrap_or(Value::Null));
        o.insert("tool_calls".into(), m.tool_calls.unwrap_or(Value::Null));
        let msg = chat_msg(&Value::Object(o), "assistant").map_err(|(_, e)| {
            rec.error(&format!(".attributes[{i}]"), format!("`{key}`[{n}]: {e}"))
        })?;
        let responses = if msg.role == "tool" {
            vec![(m.tool_call_id, msg.text.clone().unwrap_or_default())]
        } else {
            Vec::new()
        };
        Ok(OMsg {
            role: msg.role,
            text: if responses.is_empty() { msg.text } else { None },
            calls: msg.tool_calls,
            responses,
        })
    }
}

//! The Langfuse reader's fastest first pass: the trace read with [`crate::scan`], skipping by comparison the
//! message histories and tool lists each GENERATION repeats.
//!
//! It builds the same [`Trace`] the serde passes build, field by field as their declarations read them, and gives
//! up on anything else (a repeated field, a missing one, a wrong type): the serde passes then read the record.
//! Free-form values it needs (outputs that are not strings, usage, metadata, score values) are checked by the
//! scanner and then decoded by serde_json from their own text, through the same `Deserialize` impls, so they read
//! exactly as before.

use super::inputs::RawInput;
use super::lean::{Counts, Output, StrOnly, ToolsOf};
use super::schema::{Observation, Score, Text, Trace};
use crate::common::{ChatMsg, content_text, function_call, parse_arguments};
use crate::scan::{Known, Reject, Scan, checked_text, list, once, opt};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::VecDeque;
use tooltune_core::ToolCall;

/// Tool definitions seen in this thread's earlier records: traces of one agent show the same tools, though not
/// always in the same order.
const REMEMBERED_TOOLS: usize = 64;
/// A longer definition is not remembered: the cache must stay small (a few hundred KB a thread) whatever a log holds.
const REMEMBERED_TOOL_BYTES: usize = 8 * 1024;

thread_local! {
    static TOOLS: RefCell<VecDeque<(Box<str>, usize)>> = const { RefCell::new(VecDeque::new()) };
}

/// What repeats within one trace.
#[derive(Default)]
struct Repeats<'a> {
    /// The messages of the last input read: the next input usually starts with the same ones.
    messages: Vec<Known<'a>>,
    tool_lists: Vec<Known<'a>>,
}

/// Reads one trace, or gives up.
pub(super) fn trace(text: &str) -> Result<Trace<'_>, Reject> {
    let mut s = Scan::new(text);
    let mut rep = Repeats::default();
    let (mut id, mut timestamp, mut input, mut output) = (None, None, None, None);
    let (mut metadata, mut observations, mut scores) = (None, None, None);
    s.object(|s, key| match key {
        "id" => once(&mut id, s.str()?.into_owned()),
        "timestamp" => once(&mut timestamp, opt(s, |s| Ok(s.str()?.into_owned()))?),
        "input" => once(&mut input, str_only(s)?),
        "output" => once(&mut output, str_only(s)?),
        "metadata" => once(&mut metadata, tools_of(s)?),
        "observations" => {
            let l = list(s, |s| observation(s, &mut rep))?;
            once(&mut observations, l)
        }
        "scores" => once(&mut scores, list(s, score)?),
        _ => s.value().map(drop),
    })?;
    s.end()?;
    Ok(Trace {
        id: id.ok_or(Reject)?,
        timestamp: timestamp.flatten(),
        input: input.flatten(),
        output: output.flatten(),
        metadata: metadata.flatten(),
        observations: observations.unwrap_or_default(),
        scores: scores.unwrap_or_default(),
    })
}

/// An `Option` field decoded by serde_json from the value's own text, once the scanner has checked it.
fn opt_de<'a, T: Deserialize<'a>>(s: &mut Scan<'a>) -> Result<Option<T>, Reject> {
    opt(s, |s| serde_json::from_str(s.value()?).map_err(|_| Reject))
}

fn text<'a>(s: &mut Scan<'a>) -> Result<Option<Text<'a>>, Reject> {
    opt(s, |s| s.str().map(Text))
}

/// `metadata`, as [`ToolsOf`] reads it: only an object's `tools` entry is kept.
fn tools_of(s: &mut Scan<'_>) -> Result<Option<ToolsOf>, Reject> {
    opt(s, |s| {
        if s.peek()? != b'{' {
            return s.value().map(|_| ToolsOf(None));
        }
        // As in a map, the last of repeated keys counts.
        let mut tools = None;
        s.object(|s, key| {
            match key {
                "tools" => tools = Some(value(s.value()?)?),
                _ => drop(s.value()?),
            }
            Ok(())
        })?;
        Ok(ToolsOf(tools))
    })
}

/// `usage` or `usageDetails`, as [`Counts`] reads it: an object, of which the `input` and `output` entries are kept.
fn counts(s: &mut Scan<'_>) -> Result<Option<Counts>, Reject> {
    opt(s, |s| {
        let (mut input, mut output) = (None, None);
        s.object(|s, key| {
            match key {
                "input" => input = Some(value(s.value()?)?),
                "output" => output = Some(value(s.value()?)?),
                _ => drop(s.value()?),
            }
            Ok(())
        })?;
        Ok(Counts { input, output })
    })
}

fn str_only<'a>(s: &mut Scan<'a>) -> Result<Option<StrOnly<'a>>, Reject> {
    if s.peek()? == b'"' {
        return Ok(Some(StrOnly(Some(s.str()?))));
    }
    opt_de(s)
}

fn observation<'a>(s: &mut Scan<'a>, rep: &mut Repeats<'a>) -> Result<Observation<'a>, Reject> {
    let (mut kind, mut name, mut start_time, mut end_time) = (None, None, None, None);
    let (mut input, mut output, mut metadata, mut model) = (None, None, None, None);
    let (mut usage, mut usage_details, mut level, mut status_message) = (None, None, None, None);
    s.object(|s, key| match key {
        "type" => once(&mut kind, s.str()?),
        "name" => once(&mut name, text(s)?),
        "startTime" => once(&mut start_time, s.str()?),
        "endTime" => once(&mut end_time, text(s)?),
        "input" => once(&mut input, raw_input(s, rep)?),
        "output" => {
            let v = match s.peek()? {
                b'"' => Some(Output::Str(s.str()?)),
                _ if s.null()? => None,
                _ => Some(Output::Raw(s.value()?)),
            };
            once(&mut output, v)
        }
        "metadata" => once(&mut metadata, tools_of(s)?),
        "model" => once(&mut model, text(s)?),
        "usage" => once(&mut usage, counts(s)?),
        "usageDetails" => once(&mut usage_details, counts(s)?),
        "level" => once(&mut level, text(s)?),
        "statusMessage" => once(&mut status_message, text(s)?),
        _ => s.value().map(drop),
    })?;
    Ok(Observation {
        kind: kind.ok_or(Reject)?,
        name: name.flatten(),
        start_time: start_time.ok_or(Reject)?,
        end_time: end_time.flatten(),
        input: input.unwrap_or_default(),
        output: output.flatten(),
        metadata: metadata.flatten(),
        model: model.flatten(),
        usage: usage.flatten(),
        usage_details: usage_details.flatten(),
        level: level.flatten(),
        status_message: status_message.flatten(),
    })
}

/// An observation's input, as [`RawInput`]'s `Deserialize` reads it.
fn raw_input<'a>(s: &mut Scan<'a>, rep: &mut Repeats<'a>) -> Result<RawInput<'a>, Reject> {
    match s.peek()? {
        b'[' => Ok(RawInput::Request {
            messages: messages(s, rep)?,
            tools: Vec::new(),
            in_object: false,
        }),
        b'{' => {
            let mut messages_at = None;
            let mut tools = Vec::new();
            s.object(|s, key| {
                match key {
                    // As in a map, a repeated key's last value counts; a non-array is no messages.
                    "messages" if s.peek()? == b'[' => messages_at = Some(messages(s, rep)?),
                    "messages" => {
                        s.value()?;
                        messages_at = None;
                    }
                    "tools" | "functions" => {
                        let list = tool_list(s, rep)?;
                        if list.starts_with('[') {
                            tools.push(list);
                        }
                    }
                    _ => {
                        s.value()?;
                    }
                }
                Ok(())
            })?;
            Ok(RawInput::of_object(messages_at, tools))
        }
        b'"' => Ok(RawInput::Prompt(s.str()?.into_owned())),
        _ => s.value().map(|_| RawInput::Other),
    }
}

/// A message list: each message that equals the one at its place in the previous list is skipped by comparison.
fn messages<'a>(s: &mut Scan<'a>, rep: &mut Repeats<'a>) -> Result<Vec<&'a str>, Reject> {
    let previous = std::mem::take(&mut rep.messages);
    let mut now = Vec::with_capacity(previous.len() + 2);
    s.array(|s, i| {
        let repeated = previous.get(i).and_then(|&p| s.skip_known(p));
        now.push(match repeated {
            Some(text) => Known {
                text,
                depth: previous[i].depth,
            },
            None => s.known_value()?,
        });
        Ok(())
    })?;
    let texts = now.iter().map(|k| k.text).collect();
    rep.messages = now;
    Ok(texts)
}

/// A `tools` or `functions` value: a list already seen in this trace is skipped by comparison, and so is each
/// tool definition seen in this thread's earlier traces.
fn tool_list<'a>(s: &mut Scan<'a>, rep: &mut Repeats<'a>) -> Result<&'a str, Reject> {
    if let Some(text) = rep.tool_lists.iter().find_map(|&k| s.skip_known(k)) {
        return Ok(text);
    }
    let known = if s.peek()? == b'[' {
        s.known_with(|s| s.array(|s, _| tool(s)))?
    } else {
        s.known_value()?
    };
    rep.tool_lists.push(known);
    Ok(known.text)
}

/// One element of a tool list.
fn tool(s: &mut Scan<'_>) -> Result<(), Reject> {
    let remembered = TOOLS.with_borrow(|tools| {
        tools.iter().any(|(text, depth)| {
            s.skip_known(Known {
                text,
                depth: *depth,
            })
            .is_some()
        })
    });
    if !remembered {
        let k = s.known_value()?;
        if k.text.len() > REMEMBERED_TOOL_BYTES {
            return Ok(());
        }
        TOOLS.with_borrow_mut(|tools| {
            if tools.len() == REMEMBERED_TOOLS {
                tools.pop_back();
            }
            tools.push_front((k.text.into(), k.depth));
        });
    }
    Ok(())
}

fn score<'a>(s: &mut Scan<'a>) -> Result<Score<'a>, Reject> {
    let (mut name, mut value, mut string_value) = (None, None, None);
    let (mut data_type, mut comment, mut observation_id) = (None, None, None);
    s.object(|s, key| match key {
        "name" => once(&mut name, s.str()?),
        "value" => once(&mut value, opt_de::<Value>(s)?),
        "stringValue" => once(&mut string_value, text(s)?),
        "dataType" => once(&mut data_type, text(s)?),
        "comment" => once(&mut comment, text(s)?),
        "observationId" => once(&mut observation_id, text(s)?),
        _ => s.value().map(drop),
    })?;
    Ok(Score {
        name: name.ok_or(Reject)?,
        value: value.flatten(),
        string_value: string_value.flatten(),
        data_type: data_type.flatten(),
        comment: comment.flatten(),
        observation_id: observation_id.flatten(),
    })
}

/// A message as `chat_msg` reads it from a `Value`, and whether it has a `role`, `tool_calls` or `content` key
/// (what makes a GENERATION's output a message). Gives up wherever `chat_msg` would fail, leaving the error to it.
/// Only the parts that are not plain strings (content parts, tool calls) are decoded as `Value`s.
pub(super) fn message(text: &str, default_role: &str) -> Result<(ChatMsg, bool), Reject> {
    let mut s = Scan::new(text);
    // As in a `Value`, the last of repeated keys counts.
    let (mut role, mut content, mut calls, mut function, mut call_id) =
        (None, None, None, None, None);
    s.object(|s, key| {
        let slot = match key {
            "role" => &mut role,
            "content" => &mut content,
            "tool_calls" => &mut calls,
            "function_call" => &mut function,
            "tool_call_id" => &mut call_id,
            _ => return s.value().map(drop),
        };
        *slot = Some(s.value()?);
        Ok(())
    })?;
    s.end()?;
    let shaped = role.is_some() || calls.is_some() || content.is_some();
    let role = match role {
        None | Some("null") => default_role.to_string(),
        Some(r) if r.starts_with('"') => string(r)?.into_owned(),
        Some(_) => return Err(Reject),
    };
    let text = match content {
        Some(c) if c.starts_with('"') => Some(string(c)?.into_owned()),
        Some(c) if c.starts_with('[') => content_text(&value(c)?),
        _ => None,
    };
    let mut calls = match calls {
        None | Some("null") => Vec::new(),
        Some(c) => {
            let mut s = Scan::new(c);
            let mut calls = Vec::new();
            s.array(|s, _| {
                calls.push(call(s)?);
                Ok(())
            })?;
            calls
        }
    };
    if let Some(f) = function {
        calls.extend(function_call(&value(f)?));
    }
    let tool_call_id = match call_id {
        Some(c) if c.starts_with('"') => Some(string(c)?.into_owned()),
        _ => None,
    };
    let msg = ChatMsg {
        role,
        text,
        tool_calls: calls,
        tool_call_id,
    };
    Ok((msg, shaped))
}

/// A string value's text (the scanner checked it, quotes included).
fn string(raw: &str) -> Result<Cow<'_, str>, Reject> {
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or(Reject)?;
    checked_text(inner)
}

/// A value the scanner checked, decoded.
fn value(raw: &str) -> Result<Value, Reject> {
    serde_json::from_str(raw).map_err(|_| Reject)
}

/// One of a message's `tool_calls`, as `common::tool_calls` reads it from a `Value`: the name and arguments are the
/// `function` object's if there is one (anything else there names no tool), else the call's own.
fn call(s: &mut Scan<'_>) -> Result<ToolCall, Reject> {
    type Function<'t> = (Option<&'t str>, Option<&'t str>);
    let (mut id, mut own): (Option<&str>, Function) = (None, (None, None));
    // As in a `Value`, the last of repeated keys counts; `Some(None)` is a `function` that is not an object.
    let mut function: Option<Option<Function>> = None;
    s.object(|s, key| {
        match key {
            "id" => id = Some(s.value()?),
            "name" => own.0 = Some(s.value()?),
            "arguments" => own.1 = Some(s.value()?),
            "function" if s.peek()? == b'{' => {
                let mut f: Function = (None, None);
                s.object(|s, key| {
                    match key {
                        "name" => f.0 = Some(s.value()?),
                        "arguments" => f.1 = Some(s.value()?),
                        _ => drop(s.value()?),
                    }
                    Ok(())
                })?;
                function = Some(Some(f));
            }
            "function" => {
                s.value()?;
                function = Some(None);
            }
            _ => drop(s.value()?),
        }
        Ok(())
    })?;
    let (name, arguments) = match function {
        None => own,
        Some(Some(f)) => f,
        Some(None) => return Err(Reject),
    };
    let name = match name {
        Some(n) if n.starts_with('"') => string(n)?.into_owned(),
        _ => return Err(Reject),
    };
    let id = match id {
        Some(i) if i.starts_with('"') => Some(string(i)?.into_owned()),
        _ => None,
    };
    let arguments = match arguments {
        Some(a) if a.starts_with('"') => parse_arguments(&string(a)?),
        None | Some("null") => Value::Object(Default::default()),
        Some(a) => value(a)?,
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

//! The `langfuse` format: one trace object per line as Langfuse's public API returns it
//! (`GET /api/public/traces/{id}`), with `observations` (a flat list) and `scores` embedded.
//!
//! GENERATION observations are model turns (their input holds the OpenAI-style request the SDK integrations log,
//! their output the assistant message); TOOL observations, and SPANs named after a listed tool, are tool results.

use crate::common::{
    ChatMsg, add_tools, cached_tools, chat_msg, content_text, finish, from_json, json_message,
    last_answer, ms_between, time_key, tool_spec, value_to_text,
};
use crate::{Format, RecordError};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use tooltune_core::{Meta, Outcome, Step, Timing, ToolSpec, Trajectory, Usage};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trace<'a> {
    id: String,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default, borrow)]
    observations: Vec<Observation<'a>>,
    #[serde(default)]
    scores: Vec<Score>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Observation<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    start_time: String,
    #[serde(default)]
    end_time: Option<String>,
    /// Only a GENERATION's input is used (the messages sent); see [`RawInput`].
    #[serde(default, borrow)]
    input: RawInput<'a>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<Map<String, Value>>,
    #[serde(default)]
    usage_details: Option<Map<String, Value>>,
    #[serde(default)]
    level: Option<String>,
    #[serde(default)]
    status_message: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Score {
    name: String,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    string_value: Option<String>,
    #[serde(default)]
    data_type: Option<String>,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    observation_id: Option<String>,
}

/// Parses and validates one Langfuse trace.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    let trace: Trace = from_json(text, line)?;
    let t = convert(trace, line)?;
    finish(Format::Langfuse, t, line)
}

/// An observation's input, split in the same pass that reads the trace: a GENERATION's input repeats the whole
/// history and the tool list on every turn, so its messages and tools are kept as raw JSON and decoded later, each
/// distinct one once (see [`GenInputs`]).
#[derive(Default)]
enum RawInput<'a> {
    /// A message list: a bare array, or the `messages` of `{tools, messages}` (what the OpenAI integration logs
    /// when tools were passed).
    Request {
        messages: Vec<&'a RawValue>,
        /// `tools` and `functions`, when they are arrays.
        tools: Vec<&'a RawValue>,
        /// Whether the messages were the `messages` field of an object (for error paths).
        in_object: bool,
    },
    /// A plain prompt string.
    Prompt(String),
    /// Anything else (null, a number, an object without messages): no messages.
    #[default]
    Other,
}

/// A JSON array kept as its raw elements; any other value counts as absent.
struct RawList<'a>(Option<Vec<&'a RawValue>>);

impl<'de: 'a, 'a> Deserialize<'de> for RawList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawList<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'a RawValue>()? {
                    items.push(item);
                }
                Ok(RawList(Some(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(RawList(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(RawList(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawInput<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawInput<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let RawList(items) =
                    RawList::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(RawInput::Request {
                    messages: items.unwrap_or_default(),
                    tools: Vec::new(),
                    in_object: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut messages = None;
                let mut tools = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "messages" => messages = map.next_value::<RawList<'a>>()?.0,
                        "tools" | "functions" => {
                            let raw: &'a RawValue = map.next_value()?;
                            if raw.get().starts_with('[') {
                                tools.push(raw);
                            }
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(match messages {
                    Some(messages) => RawInput::Request {
                        messages,
                        tools,
                        in_object: true,
                    },
                    // Tools without messages still name the tools shown.
                    None if !tools.is_empty() => RawInput::Request {
                        messages: Vec::new(),
                        tools,
                        in_object: true,
                    },
                    None => RawInput::Other,
                })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawInput::Prompt(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(RawInput::Prompt(v))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(RawInput::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(RawInput::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(RawInput::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(RawInput::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(RawInput::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// What a GENERATION's input holds: the messages sent, as indices into [`GenInputs::messages`].
struct GenInput {
    messages: Vec<usize>,
}

/// Decodes the GENERATION inputs of one trace. Each turn's input repeats the messages of the turn before it, so a
/// message whose raw JSON equals the one at the same place in the previous input is not decoded again (equal text
/// decodes to the same message); the same goes for a tool list equal to one already read. Without this a trace of
/// n turns decodes O(n^2) messages.
#[derive(Default)]
struct GenInputs<'a> {
    messages: Vec<ChatMsg>,
    /// The previous input's messages: raw text and index into `messages`.
    previous: Vec<(&'a str, usize)>,
    tool_lists: Vec<&'a str>,
    tools: Vec<ToolSpec>,
}

impl<'a> GenInputs<'a> {
    fn decode(
        &mut self,
        obs: &Observation<'a>,
        path: &str,
        line: u64,
    ) -> Result<GenInput, RecordError> {
        // Where the list sits, for errors only: formatted when one happens, not on every turn.
        let (raw, tool_lists, at_list) = match &obs.input {
            RawInput::Request {
                messages,
                tools,
                in_object,
            } => (
                messages,
                tools,
                if *in_object {
                    ".input.messages"
                } else {
                    ".input"
                },
            ),
            RawInput::Prompt(prompt) => {
                // A plain prompt string is one user message.
                self.messages.push(ChatMsg {
                    role: "user".into(),
                    text: Some(prompt.clone()),
                    ..ChatMsg::default()
                });
                return Ok(GenInput {
                    messages: vec![self.messages.len() - 1],
                });
            }
            RawInput::Other => {
                return Ok(GenInput {
                    messages: Vec::new(),
                });
            }
        };
        for list in tool_lists {
            if !self.tool_lists.contains(&list.get()) {
                self.tool_lists.push(list.get());
                let Ok(ts) = cached_tools(list.get(), || {
                    // The reading pass already checked this is a well-formed JSON array, so it decodes.
                    let ts: Vec<Value> = serde_json::from_str(list.get()).unwrap_or_default();
                    Ok::<_, std::convert::Infallible>(ts.iter().filter_map(tool_spec).collect())
                });
                add_tools(&mut self.tools, ts);
            }
        }
        let mut current = Vec::with_capacity(raw.len());
        for (i, m) in raw.iter().enumerate() {
            let text = m.get();
            let at = match self.previous.get(i) {
                Some(&(prev, at)) if prev == text => at,
                _ => {
                    let v: Value = serde_json::from_str(text).map_err(|e| {
                        RecordError::at(line, format!("{path}{at_list}[{i}]"), json_message(&e))
                    })?;
                    let msg = chat_msg(&v, "user").map_err(|(p, e)| {
                        RecordError::at(line, format!("{path}{at_list}[{i}]{p}"), e)
                    })?;
                    self.messages.push(msg);
                    self.messages.len() - 1
                }
            };
            current.push((text, at));
        }
        let messages = current.iter().map(|&(_, at)| at).collect();
        self.previous = current;
        Ok(GenInput { messages })
    }
}

fn gen_output(obs: &Observation, path: &str, line: u64) -> Result<ChatMsg, RecordError> {
    let out = match &obs.output {
        // Some integrations log the list of choices' messages; the first is the turn the agent continued with.
        Some(Value::Array(a)) => a.first(),
        other => other.as_ref(),
    };
    match out {
        None | Some(Value::Null) => Ok(ChatMsg::default()),
        Some(Value::String(s)) => Ok(ChatMsg {
            role: "assistant".into(),
            text: Some(s.clone()),
            ..ChatMsg::default()
        }),
        Some(v @ Value::Object(o))
            if o.contains_key("role")
                || o.contains_key("tool_calls")
                || o.contains_key("content") =>
        {
            chat_msg(v, "assistant")
                .map_err(|(p, e)| RecordError::at(line, format!("{path}.output{p}"), e))
        }
        Some(other) => Ok(ChatMsg {
            role: "assistant".into(),
            text: content_text(other).or_else(|| Some(value_to_text(other))),
            ..ChatMsg::default()
        }),
    }
}

fn usage_of(obs: &Observation) -> Option<Usage> {
    let count = |m: &Map<String, Value>, k: &str| {
        m.get(k)
            .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)))
    };
    for m in [&obs.usage_details, &obs.usage].into_iter().flatten() {
        if let (Some(i), Some(o)) = (count(m, "input"), count(m, "output")) {
            return Some(Usage {
                prompt_tokens: i,
                completion_tokens: o,
            });
        }
    }
    None
}

fn timing_of(obs: &Observation) -> Timing {
    Timing {
        started_at: Some(obs.start_time.clone()),
        duration_ms: obs
            .end_time
            .as_deref()
            .and_then(|e| ms_between(&obs.start_time, e)),
    }
}

fn metadata_tools(v: &Option<Value>) -> Vec<ToolSpec> {
    match v.as_ref().and_then(|m| m.get("tools")) {
        Some(Value::Array(ts)) => ts.iter().filter_map(tool_spec).collect(),
        _ => Vec::new(),
    }
}

fn convert(trace: Trace<'_>, line: u64) -> Result<Trajectory, RecordError> {
    // Order by start time; the original index breaks ties and names the observation in errors.
    let mut order: Vec<(i64, usize)> = Vec::with_capacity(trace.observations.len());
    for (i, o) in trace.observations.iter().enumerate() {
        let Some(k) = time_key(&o.start_time) else {
            return Err(RecordError::at(
                line,
                format!("observations[{i}].startTime"),
                format!("`{}` is not an RFC 3339 time", o.start_time),
            ));
        };
        order.push((k, i));
    }
    order.sort_unstable();

    let mut inputs: HashMap<usize, GenInput> = HashMap::new();
    let mut decoded = GenInputs::default();
    for &(_, i) in &order {
        let o = &trace.observations[i];
        if o.kind == "GENERATION" {
            let inp = decoded.decode(o, &format!("observations[{i}]"), line)?;
            inputs.insert(i, inp);
        }
    }
    let mut tools = std::mem::take(&mut decoded.tools);
    if tools.is_empty() {
        for &(_, i) in &order {
            let o = &trace.observations[i];
            if o.kind == "GENERATION" {
                add_tools(&mut tools, metadata_tools(&o.metadata));
            }
        }
        add_tools(&mut tools, metadata_tools(&trace.metadata));
    }
    let tool_names: HashSet<String> = tools.iter().map(|t| t.name.clone()).collect();
    let is_tool_obs = |o: &Observation| {
        o.kind == "TOOL"
            || (o.kind == "SPAN" && o.name.as_ref().is_some_and(|n| tool_names.contains(n)))
    };
    // Without tool observations the results are only visible as `tool` messages in later generation inputs.
    let results_from_inputs = !trace.observations.iter().any(is_tool_obs);

    let mut task: Option<String> = None;
    let mut system: Option<String> = None;
    let mut steps: Vec<Step> = Vec::new();
    let mut users_seen = 0usize;
    let mut pending: VecDeque<(String, Option<String>)> = VecDeque::new();
    let mut call_names: HashMap<String, String> = HashMap::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut model: Option<String> = None;

    for &(_, i) in &order {
        let o = &trace.observations[i];
        let path = format!("observations[{i}]");
        if o.kind == "GENERATION" {
            model = model.or_else(|| o.model.clone());
            let inp = &inputs[&i];
            let mut users = 0usize;
            for m in inp.messages.iter().map(|&at| &decoded.messages[at]) {
                match m.role.as_str() {
                    "system" | "developer" if task.is_none() && users == 0 => {
                        if let Some(t) = &m.text {
                            system = Some(match system.take() {
                                Some(s) => format!("{s}\n\n{t}"),
                                None => t.clone(),
                            });
                        }
                    }
                    "user" => {
                        if task.is_none() {
                            task = m.text.clone();
                        } else if users >= users_seen.max(1) {
                            steps.push(Step::User {
                                content: m.text.clone().unwrap_or_default(),
                            });
                        }
                        users += 1;
                    }
                    "tool" if results_from_inputs => {
                        if let Some(id) = &m.tool_call_id
                            && let Some(name) = call_names.get(id)
                            && answered.insert(id.clone())
                        {
                            steps.push(Step::ToolResult {
                                call_id: Some(id.clone()),
                                name: name.clone(),
                                content: m.text.clone().unwrap_or_default(),
                                is_error: false,
                                timing: Timing::default(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            users_seen = users_seen.max(users);
            let out = gen_output(o, &path, line)?;
            for c in &out.tool_calls {
                pending.push_back((c.name.clone(), c.id.clone()));
                if let Some(id) = &c.id {
                    call_names.insert(id.clone(), c.name.clone());
                }
            }
            steps.push(Step::Model {
                content: out.text.filter(|t| !t.is_empty()),
                tool_calls: out.tool_calls,
                timing: timing_of(o),
                usage: usage_of(o),
            });
        } else if is_tool_obs(o) {
            let Some(name) = o.name.clone() else {
                return Err(RecordError::at(
                    line,
                    format!("{path}.name"),
                    "a TOOL observation needs the tool's name",
                ));
            };
            // Langfuse records no call id on tool observations: pair with the oldest unanswered call of that tool.
            let call_id = pending
                .iter()
                .position(|(n, _)| *n == name)
                .and_then(|p| pending.remove(p))
                .and_then(|(_, id)| id);
            let is_error = o.level.as_deref() == Some("ERROR");
            let content = match &o.output {
                None | Some(Value::Null) => o.status_message.clone().unwrap_or_default(),
                Some(v) => value_to_text(v),
            };
            steps.push(Step::ToolResult {
                call_id,
                name,
                content,
                is_error,
                timing: timing_of(o),
            });
        }
    }

    let task = match task {
        Some(t) => t,
        None => match &trace.input {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => {
                return Err(RecordError::at(
                    line,
                    "observations",
                    "no GENERATION input has a user message (the task), and the trace input is not a string",
                ));
            }
        },
    };
    let final_answer = last_answer(&steps).or_else(|| match &trace.output {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    });
    Ok(Trajectory {
        task,
        system,
        tools,
        steps,
        final_answer,
        outcome: outcome_from_scores(&trace.scores),
        meta: Meta {
            model,
            external_id: Some(trace.id),
            started_at: trace.timestamp,
            ..Meta::default()
        },
        links: Default::default(),
    })
}

/// Whether a score's name says it grades success: one of its words (split on anything not a letter or digit) is
/// success, successful, succeeded, correct, correctness, accuracy, resolved, pass, passed, completed or
/// completion. Word matching keeps `incorrect` or `hallucination` from counting.
fn names_success(name: &str) -> bool {
    const WORDS: [&str; 11] = [
        "success",
        "successful",
        "succeeded",
        "correct",
        "correctness",
        "accuracy",
        "resolved",
        "pass",
        "passed",
        "completed",
        "completion",
    ];
    name.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| WORDS.contains(&w))
}

/// Outcome from scores: the first NUMERIC score in [0, 1] with a success-like name is the score, the first
/// BOOLEAN one the success flag; trace-level scores come before observation-level ones. Their comments are the
/// feedback.
fn outcome_from_scores(scores: &[Score]) -> Outcome {
    let mut ordered: Vec<&Score> = scores.iter().filter(|s| names_success(&s.name)).collect();
    ordered.sort_by_key(|s| s.observation_id.is_some());
    let mut out = Outcome::default();
    let mut comments: Vec<String> = Vec::new();
    for s in ordered {
        let number = s.value.as_ref().and_then(Value::as_f64);
        match s.data_type.as_deref() {
            Some("BOOLEAN") if out.success.is_none() => {
                let flag = number
                    .map(|v| v >= 0.5)
                    .or(match s.string_value.as_deref() {
                        Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
                        Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
                        _ => None,
                    });
                if flag.is_some() {
                    out.success = flag;
                    comments.extend(s.comment.clone());
                }
            }
            Some("NUMERIC") | None if out.score.is_none() => {
                if let Some(v) = number.filter(|v| (0.0..=1.0).contains(v)) {
                    out.score = Some(v);
                    comments.extend(s.comment.clone());
                }
            }
            _ => {}
        }
    }
    comments.dedup();
    if !comments.is_empty() {
        out.feedback = Some(comments.join("; "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

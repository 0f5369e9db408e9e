//! The `langfuse` format: one trace object per line as Langfuse's public API returns it
//! (`GET /api/public/traces/{id}`), with `observations` (a flat list) and `scores` embedded.
//!
//! GENERATION observations are model turns (their input holds the OpenAI-style request the SDK integrations log,
//! their output the assistant message); TOOL observations, and SPANs named after a listed tool, are tool results.

use crate::common::{
    ChatMsg, add_tools, chat_msg, content_text, finish, from_json, last_answer, ms_between,
    time_key, tool_spec, value_to_text,
};
use crate::{Format, RecordError};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use tooltune_core::{Meta, Outcome, Step, Timing, ToolSpec, Trajectory, Usage};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trace {
    id: String,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    observations: Vec<Observation>,
    #[serde(default)]
    scores: Vec<Score>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Observation {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    start_time: String,
    #[serde(default)]
    end_time: Option<String>,
    #[serde(default)]
    input: Option<Value>,
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

/// What a GENERATION's input holds: the messages sent and, when the integration logged them, the tools.
struct GenInput {
    messages: Vec<(usize, ChatMsg)>,
    tools: Vec<ToolSpec>,
}

fn gen_input(obs: &Observation, path: &str, line: u64) -> Result<GenInput, RecordError> {
    let mut tools = Vec::new();
    let msgs: Option<&Vec<Value>> = match &obs.input {
        Some(Value::Array(a)) => Some(a),
        Some(Value::Object(o)) => {
            // The OpenAI integration logs `{tools, messages}` when tools were passed, a bare array otherwise.
            for key in ["tools", "functions"] {
                if let Some(Value::Array(ts)) = o.get(key) {
                    tools.extend(ts.iter().filter_map(tool_spec));
                }
            }
            match o.get("messages") {
                Some(Value::Array(a)) => Some(a),
                _ => None,
            }
        }
        _ => None,
    };
    let mut messages = Vec::new();
    if let Some(msgs) = msgs {
        let base = if matches!(obs.input, Some(Value::Array(_))) {
            format!("{path}.input")
        } else {
            format!("{path}.input.messages")
        };
        for (i, m) in msgs.iter().enumerate() {
            let msg = chat_msg(m, "user")
                .map_err(|(p, e)| RecordError::at(line, format!("{base}[{i}]{p}"), e))?;
            messages.push((i, msg));
        }
    } else if let Some(Value::String(prompt)) = &obs.input {
        // A plain prompt string is one user message.
        messages.push((
            0,
            ChatMsg {
                role: "user".into(),
                text: Some(prompt.clone()),
                ..ChatMsg::default()
            },
        ));
    }
    Ok(GenInput { messages, tools })
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

fn convert(trace: Trace, line: u64) -> Result<Trajectory, RecordError> {
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
    let mut tools: Vec<ToolSpec> = Vec::new();
    for &(_, i) in &order {
        let o = &trace.observations[i];
        if o.kind == "GENERATION" {
            let inp = gen_input(o, &format!("observations[{i}]"), line)?;
            add_tools(&mut tools, inp.tools.iter().cloned());
            inputs.insert(i, inp);
        }
    }
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
            for (_, m) in &inp.messages {
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

//! Turns a read trace into a trajectory: observations in time order, GENERATIONs as model turns (their inputs giving
//! the task, system prompt and user turns), TOOL observations as results paired with the calls they answer.

use super::fast;
use super::inputs::{GenInput, GenInputs};
use super::lean::{Output, ToolsOf};
use super::outcome::outcome_from_scores;
use super::schema::{Observation, Text, Trace};
use crate::RecordError;
use crate::common::{
    ChatMsg, add_tools, chat_msg, content_text, json_message, last_answer, ms_between, time_key,
    tool_spec, value_to_text,
};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde_json::Value;
use std::collections::VecDeque;
use tooltune_core::{Meta, Step, Timing, ToolSpec, Trajectory, Usage};

fn gen_output(obs: &Observation, i: usize, line: u64) -> Result<ChatMsg, RecordError> {
    let decoded: Value;
    let out = match &obs.output {
        None => return Ok(ChatMsg::default()),
        Some(Output::Raw(raw)) => {
            if let Ok((msg, true)) = fast::message(raw, "assistant") {
                return Ok(msg);
            }
            // The scanner checked the text, so it decodes (see `Output::text`).
            decoded = serde_json::from_str(raw).map_err(|e| {
                RecordError::at(line, format!("observations[{i}].output"), json_message(&e))
            })?;
            match &decoded {
                Value::Array(a) => a.first(),
                v => Some(v),
            }
        }
        Some(Output::Str(s)) => {
            return Ok(ChatMsg {
                role: "assistant".into(),
                text: Some(s.to_string()),
                ..ChatMsg::default()
            });
        }
        // Some integrations log the list of choices' messages; the first is the turn the agent continued with.
        Some(Output::Other(Value::Array(a))) => a.first(),
        Some(Output::Other(v)) => Some(v),
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
                .map_err(|(p, e)| RecordError::at(line, format!("observations[{i}].output{p}"), e))
        }
        Some(other) => Ok(ChatMsg {
            role: "assistant".into(),
            text: content_text(other).or_else(|| Some(value_to_text(other))),
            ..ChatMsg::default()
        }),
    }
}

fn usage_of(obs: &Observation) -> Option<Usage> {
    let count = |v: &Option<Value>| {
        v.as_ref()
            .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)))
    };
    for m in [&obs.usage_details, &obs.usage].into_iter().flatten() {
        if let (Some(i), Some(o)) = (count(&m.input), count(&m.output)) {
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
        started_at: Some(obs.start_time.to_string()),
        duration_ms: obs
            .end_time
            .as_ref()
            .and_then(|e| ms_between(&obs.start_time, e.as_str())),
    }
}

fn metadata_tools(v: &Option<ToolsOf>) -> Vec<ToolSpec> {
    match v.as_ref().and_then(|m| m.0.as_ref()) {
        Some(Value::Array(ts)) => ts.iter().filter_map(tool_spec).collect(),
        _ => Vec::new(),
    }
}

pub(super) fn convert(trace: Trace<'_>, line: u64) -> Result<Trajectory, RecordError> {
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
            let inp = decoded.decode(o, i, line)?;
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
    let tool_names: HashSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let is_tool_obs = |o: &Observation| {
        o.kind == "TOOL"
            || (o.kind == "SPAN"
                && o.name
                    .as_ref()
                    .is_some_and(|n| tool_names.contains(n.as_str())))
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
        if o.kind == "GENERATION" {
            model = model.or_else(|| o.model.as_ref().map(|m| m.as_str().to_string()));
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
            let out = gen_output(o, i, line)?;
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
            let Some(name) = o.name.as_ref().map(|n| n.as_str().to_string()) else {
                return Err(RecordError::at(
                    line,
                    format!("observations[{i}].name"),
                    "a TOOL observation needs the tool's name",
                ));
            };
            // Langfuse records no call id on tool observations: pair with the oldest unanswered call of that tool.
            let call_id = pending
                .iter()
                .position(|(n, _)| *n == name)
                .and_then(|p| pending.remove(p))
                .and_then(|(_, id)| id);
            let is_error = o.level.as_ref().map(Text::as_str) == Some("ERROR");
            // A null output was read as `None`.
            let content = match &o.output {
                None => o
                    .status_message
                    .as_ref()
                    .map(|m| m.as_str().to_string())
                    .unwrap_or_default(),
                // The scanner accepts only what a `Value` decode accepts, so this error cannot happen; it is
                // reported rather than hidden should it ever.
                Some(v) => v.text().map_err(|e| {
                    RecordError::at(line, format!("observations[{i}].output"), json_message(&e))
                })?,
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
        None => match trace.input.and_then(|s| s.0) {
            Some(s) if !s.trim().is_empty() => s.into_owned(),
            _ => {
                return Err(RecordError::at(
                    line,
                    "observations",
                    "no GENERATION input has a user message (the task), and the trace input is not a string",
                ));
            }
        },
    };
    let final_answer = last_answer(&steps).or_else(|| match trace.output.and_then(|s| s.0) {
        Some(s) if !s.is_empty() => Some(s.into_owned()),
        _ => None,
    });
    Ok(Trajectory {
        task,
        system,
        tools,
        // Langfuse logs tools in the provider's function format, which has no behaviour hints.
        tool_annotations: Default::default(),
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

//! Builds one trajectory from a trace's spans: tools, task, system prompt, steps from chat and execute_tool spans,
//! and the outcome from our attributes on the root span.

use super::history::History;
use super::messages::messages;
use super::schema::Str;
use super::span::SpanRec;
use super::{OUTCOME_FEEDBACK, OUTCOME_SCORE, OUTCOME_SUCCESS};
use crate::RecordError;
use crate::common::{
    add_tools, cached_tools, content_text, kind, last_answer, rfc3339_from_nanos, score_value,
    success_value, tool_spec, value_to_text,
};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde_json::Value;
use std::borrow::Cow;
use tooltune_core::{Meta, Outcome, Step, Timing, ToolSpec, Trajectory, Usage};

fn system_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| p.get("content").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        other => content_text(other),
    }
}

pub(super) fn build<'a>(
    trace_id: &str,
    mut spans: Vec<SpanRec<'a>>,
    complete: bool,
    line: u64,
) -> Result<Trajectory, RecordError> {
    // Start time orders the steps; arrival order breaks ties (a stable sort keeps it).
    spans.sort_by_key(|s| s.span.start_time_unix_nano);
    let root = spans.iter().find(|s| s.is_root());
    if !complete && !spans.iter().any(SpanRec::is_inference) {
        return Err(RecordError::new(
            line,
            None,
            format!(
                "trace {trace_id}: {} span(s) but the root span never arrived and none is a chat span, so there \
                 is nothing to assemble",
                spans.len()
            ),
        ));
    }

    // Tools: every definition list in the trace (first definition of a name wins), then tools only seen executed.
    let mut tools: Vec<ToolSpec> = Vec::new();
    // Instrumentations repeat the same definitions on every chat span; decode each distinct string once.
    // A trace holds one or a few distinct lists, so a linear search (length, then memcmp) beats SipHashing kilobytes.
    // Both compare the text as written: the same list written the same way, which is what repeats.
    let mut seen_defs: Vec<&str> = Vec::new();
    for s in &spans {
        let raw = s
            .attr("gen_ai.tool.definitions")
            .and_then(|(_, v)| v.string_value.map(Str::raw));
        if let Some(raw) = raw {
            if seen_defs.contains(&raw) {
                continue;
            }
            seen_defs.push(raw);
        }
        let decode = || -> Result<Vec<ToolSpec>, RecordError> {
            let Some(v) = s.attr_json("gen_ai.tool.definitions")? else {
                return Ok(Vec::new());
            };
            let Value::Array(defs) = &v else {
                return Err(s.error(
                    "",
                    format!(
                        "`gen_ai.tool.definitions` should be an array, found {}",
                        kind(&v)
                    ),
                ));
            };
            Ok(defs.iter().filter_map(tool_spec).collect())
        };
        // A list recorded as a JSON string is the same text in every trace of one agent: decode it once per thread.
        let defs = match raw {
            Some(raw) => cached_tools(raw, decode)?,
            None => decode()?,
        };
        add_tools(&mut tools, defs);
    }
    for s in spans.iter().filter(|s| s.op() == "execute_tool") {
        if let (Some(name), Some(description)) =
            (tool_name(s), s.attr_str("gen_ai.tool.description"))
        {
            add_tools(
                &mut tools,
                [ToolSpec {
                    name: name.into_owned(),
                    description: description.into_owned(),
                    input_schema: Value::Object(Default::default()).into(),
                }],
            );
        }
    }
    let any_exec = spans.iter().any(|s| s.op() == "execute_tool");

    let mut task: Option<String> = None;
    let mut system: Option<String> = None;
    let mut model: Option<String> = None;
    let mut steps: Vec<Step> = Vec::new();
    let mut users_seen = 0usize;
    let mut call_names: HashMap<String, String> = HashMap::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut history = History::new();

    for s in &spans {
        if s.is_inference() {
            model = model.or_else(|| {
                s.attr_str("gen_ai.request.model")
                    .or_else(|| s.attr_str("gen_ai.response.model"))
                    .map(Cow::into_owned)
            });
            if system.is_none()
                && let Some(v) = s.attr_json("gen_ai.system_instructions")?
            {
                system = system_text(&v);
            }
            let input = history.of(s, "gen_ai.input.messages")?.unwrap_or_default();
            let mut users = 0usize;
            for m in input.iter().map(|&idx| &history.decoded[idx]) {
                match m.role.as_str() {
                    "system" | "developer" if task.is_none() && users == 0 && system.is_none() => {
                        system = m.text.clone();
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
                    // Without execute_tool spans, results are only visible as tool messages sent back to the model.
                    "tool" if !any_exec => {
                        for (id, text) in &m.responses {
                            if let Some(id) = id
                                && let Some(name) = call_names.get(id)
                                && answered.insert(id.clone())
                            {
                                steps.push(Step::ToolResult {
                                    call_id: Some(id.clone()),
                                    name: name.clone(),
                                    content: text.clone(),
                                    is_error: false,
                                    timing: Timing::default(),
                                });
                            }
                        }
                    }
                    _ => {}
                }
            }
            users_seen = users_seen.max(users);
            let output = messages(s, "gen_ai.output.messages")?.unwrap_or_default();
            // One output message per choice; the agent continued with the first.
            let (text, calls) = match output.into_iter().next() {
                Some(m) => (m.text, m.calls),
                None => (None, Vec::new()),
            };
            for c in &calls {
                if let Some(id) = &c.id {
                    call_names.insert(id.clone(), c.name.clone());
                }
            }
            let usage = match (
                s.attr_u64("gen_ai.usage.input_tokens"),
                s.attr_u64("gen_ai.usage.output_tokens"),
            ) {
                (Some(i), Some(o)) => Some(Usage {
                    prompt_tokens: i,
                    completion_tokens: o,
                }),
                _ => None,
            };
            steps.push(Step::Model {
                content: text.filter(|t| !t.is_empty()),
                tool_calls: calls,
                timing: s.timing(),
                usage,
            });
        } else if s.op() == "execute_tool" {
            let Some(name) = tool_name(s) else {
                return Err(s.error(
                    ".attributes",
                    "an execute_tool span needs `gen_ai.tool.name` (or a name `execute_tool {tool}`)",
                ));
            };
            // A result recorded as a string is the text the tool returned (JSON or not); a structured one is
            // shown as compact JSON.
            let result = s.attr("gen_ai.tool.call.result").map(|(_, v)| v.to_json());
            let status_error = s.span.status.as_ref().is_some_and(|st| st.code == 2);
            let error_type = s.attr_str("error.type");
            let is_error = status_error || error_type.is_some();
            let content = match result {
                Some(v) if !v.is_null() => value_to_text(&v),
                _ if is_error => s
                    .span
                    .status
                    .as_ref()
                    .and_then(|st| st.message.map(|m| m.text().into_owned()))
                    .or_else(|| error_type.map(Cow::into_owned))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            steps.push(Step::ToolResult {
                call_id: s.attr_str("gen_ai.tool.call.id").map(Cow::into_owned),
                name: name.into_owned(),
                content,
                is_error,
                timing: s.timing(),
            });
        }
    }

    // An agent that logged no chat span content may still have its input on the agent span.
    if task.is_none() {
        for s in &spans {
            if let Some(input) = messages(s, "gen_ai.input.messages")? {
                task = input
                    .into_iter()
                    .find(|m| m.role == "user")
                    .and_then(|m| m.text);
                if task.is_some() {
                    break;
                }
            }
        }
    }
    let Some(task) = task else {
        return Err(RecordError::new(
            line,
            None,
            format!(
                "trace {trace_id}: no span has a user message in `gen_ai.input.messages` (the task); message \
                 content capture must be enabled in the instrumentation"
            ),
        ));
    };

    let mut final_answer = last_answer(&steps);
    if final_answer.is_none()
        && let Some(r) = root
        && let Some(output) = messages(r, "gen_ai.output.messages")?
    {
        final_answer = output.into_iter().next().and_then(|m| m.text);
    }
    let outcome = match root {
        Some(r) => outcome_of(r)?,
        None => Outcome::default(),
    };
    let first = root.or(spans.first());
    Ok(Trajectory {
        task,
        system,
        tools,
        // GenAI spans define tools in the provider's function format, which has no behaviour hints.
        tool_annotations: Default::default(),
        steps,
        final_answer,
        outcome,
        meta: Meta {
            model,
            client: first.and_then(|s| s.service.map(|n| n.text().into_owned())),
            external_id: Some(trace_id.to_string()),
            started_at: first.and_then(|s| rfc3339_from_nanos(s.span.start_time_unix_nano)),
            ..Meta::default()
        },
        links: Default::default(),
    })
}

fn tool_name<'a>(s: &SpanRec<'a>) -> Option<Cow<'a, str>> {
    s.attr_str("gen_ai.tool.name")
        .or_else(|| match s.span.name.text() {
            Cow::Borrowed(n) => n.strip_prefix("execute_tool ").map(Cow::Borrowed),
            Cow::Owned(n) => n
                .strip_prefix("execute_tool ")
                .map(|n| n.to_string().into()),
        })
        .filter(|n| !n.is_empty())
}

fn outcome_of(root: &SpanRec) -> Result<Outcome, RecordError> {
    let attr_err = |key: &str, e: String| {
        let i = root.attr(key).map(|(i, _)| i).unwrap_or_default();
        root.error(&format!(".attributes[{i}]"), format!("`{key}`: {e}"))
    };
    let score = match root.attr(OUTCOME_SCORE) {
        Some((_, v)) => score_value(&v.to_json()).map_err(|e| attr_err(OUTCOME_SCORE, e))?,
        None => None,
    };
    let success = match root.attr(OUTCOME_SUCCESS) {
        Some((_, v)) => success_value(&v.to_json()).map_err(|e| attr_err(OUTCOME_SUCCESS, e))?,
        None => None,
    };
    Ok(Outcome {
        score,
        success,
        feedback: root.attr_str(OUTCOME_FEEDBACK).map(Cow::into_owned),
    })
}

//! The `openai` format: one chat-completions request per line (`model`, `messages`, `tools`), optionally with the
//! `response` (a `chat.completion` object) and our outcome fields (`score`, `success`, `feedback`, at top level or
//! under `metadata`).

use crate::common::{
    cached_tools, content_text, decode_at, finish, from_json, kind, last_answer, parse_arguments,
    rfc3339_from_secs, score_value, success_value,
};
use crate::{Format, RecordError};
use foldhash::{HashMap, HashMapExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tooltune_core::{Meta, Outcome, Step, ToolCall, ToolSpec, Trajectory, Usage};

#[derive(Deserialize)]
struct Record<'a> {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<Message>,
    /// Kept raw: every request of one agent repeats the same list, which is decoded once per thread
    /// ([`cached_tools`]).
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    /// The legacy functions API's tool list.
    #[serde(default)]
    functions: Option<Vec<FunctionDef>>,
    #[serde(default)]
    response: Option<Response>,
    #[serde(default)]
    score: Option<Value>,
    #[serde(default)]
    success: Option<Value>,
    #[serde(default)]
    feedback: Option<String>,
    /// The request's own `metadata` (string values when the request was stored by OpenAI), where the outcome
    /// fields may also live.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
}

#[derive(Deserialize)]
struct Message {
    role: Role,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallIn>>,
    #[serde(default)]
    function_call: Option<FunctionCallIn>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct ToolCallIn {
    #[serde(default)]
    id: Option<String>,
    function: FunctionCallIn,
}

#[derive(Deserialize)]
struct FunctionCallIn {
    name: String,
    /// A JSON string, as the API sends it.
    arguments: String,
}

#[derive(Deserialize)]
struct Tool {
    #[serde(default)]
    function: Option<FunctionDef>,
}

#[derive(Deserialize)]
struct FunctionDef {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    created: Option<i64>,
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
}

#[derive(Deserialize)]
struct UsageIn {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl FunctionDef {
    fn into_spec(self) -> ToolSpec {
        ToolSpec {
            name: self.name,
            description: self.description.unwrap_or_default(),
            input_schema: self
                .parameters
                .filter(|p| !p.is_null())
                .unwrap_or_else(|| Value::Object(Map::new()))
                .into(),
        }
    }
}

/// Parses and validates one OpenAI record.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    let r: Record = from_json(text, line)?;
    let listed = match r.tools {
        Some(raw) => cached_tools(raw.get(), || decode_tools(text, raw.get(), line))?,
        None => Vec::new(),
    };
    let t = convert(r, listed, line)?;
    finish(Format::OpenAi, t, line)
}

/// The function tools of a request's `tools` (`raw`, a slice of the record `text`).
fn decode_tools(text: &str, raw: &str, line: u64) -> Result<Vec<ToolSpec>, RecordError> {
    let list: Option<Vec<Tool>> = decode_at(text, raw, line, "tools")?;
    // Non-function tools (built-in or custom grammar tools) carry no JSON Schema to optimise; skip them.
    Ok(list
        .into_iter()
        .flatten()
        .filter_map(|t| t.function.map(FunctionDef::into_spec))
        .collect())
}

fn message_text(m: &Message, path: &str, line: u64) -> Result<Option<String>, RecordError> {
    match &m.content {
        None | Some(Value::Null) => Ok(None),
        Some(v @ (Value::String(_) | Value::Array(_))) => {
            Ok(content_text(v).filter(|s| !s.is_empty()))
        }
        Some(other) => Err(RecordError::at(
            line,
            format!("{path}.content"),
            format!(
                "expected a string or an array of parts, found {}",
                kind(other)
            ),
        )),
    }
}

fn calls_of(m: &Message) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = m
        .tool_calls
        .iter()
        .flatten()
        .map(|c| ToolCall {
            id: c.id.clone(),
            name: c.function.name.clone(),
            arguments: parse_arguments(&c.function.arguments),
        })
        .collect();
    if let Some(fc) = &m.function_call {
        calls.push(ToolCall {
            id: None,
            name: fc.name.clone(),
            arguments: parse_arguments(&fc.arguments),
        });
    }
    calls
}

fn convert(r: Record, listed: Vec<ToolSpec>, line: u64) -> Result<Trajectory, RecordError> {
    let mut tools = listed;
    for f in r.functions.into_iter().flatten() {
        tools.push(f.into_spec());
    }

    let mut task: Option<String> = None;
    let mut system_parts: Vec<String> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut call_names: HashMap<String, String> = HashMap::new();

    for (i, m) in r.messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let text = message_text(m, &path, line)?;
        match m.role {
            Role::System | Role::Developer => {
                // Instructions after the task are rare and not part of what the model was first told.
                if task.is_none()
                    && let Some(t) = text
                {
                    system_parts.push(t);
                }
            }
            Role::User => match (&task, text) {
                (None, Some(t)) => task = Some(t),
                (None, None) => {
                    return Err(RecordError::at(
                        line,
                        format!("{path}.content"),
                        "the first user message (the task) has no text",
                    ));
                }
                (Some(_), t) => steps.push(Step::User {
                    content: t.unwrap_or_default(),
                }),
            },
            Role::Assistant => {
                let tool_calls = calls_of(m);
                for c in &tool_calls {
                    if let Some(id) = &c.id {
                        call_names.insert(id.clone(), c.name.clone());
                    }
                }
                steps.push(Step::Model {
                    content: text,
                    tool_calls,
                    timing: Default::default(),
                    usage: None,
                });
            }
            Role::Tool => {
                let Some(id) = &m.tool_call_id else {
                    return Err(RecordError::at(
                        line,
                        format!("{path}.tool_call_id"),
                        "a tool message needs the id of the call it answers",
                    ));
                };
                let Some(name) = call_names.get(id) else {
                    return Err(RecordError::at(
                        line,
                        format!("{path}.tool_call_id"),
                        format!("`{id}` answers no earlier assistant tool call"),
                    ));
                };
                steps.push(Step::ToolResult {
                    call_id: Some(id.clone()),
                    name: name.clone(),
                    content: text.unwrap_or_default(),
                    is_error: false,
                    timing: Default::default(),
                });
            }
            Role::Function => {
                let Some(name) = &m.name else {
                    return Err(RecordError::at(
                        line,
                        format!("{path}.name"),
                        "a function message needs the function's name",
                    ));
                };
                steps.push(Step::ToolResult {
                    call_id: None,
                    name: name.clone(),
                    content: text.unwrap_or_default(),
                    is_error: false,
                    timing: Default::default(),
                });
            }
        }
    }

    let mut meta = Meta {
        model: r.model,
        ..Meta::default()
    };
    if let Some(resp) = r.response {
        let Some(choice) = resp.choices.first() else {
            return Err(RecordError::at(
                line,
                "response.choices",
                "is empty: the response has no final assistant turn",
            ));
        };
        let m = &choice.message;
        let text = message_text(m, "response.choices[0].message", line)?;
        steps.push(Step::Model {
            content: text,
            tool_calls: calls_of(m),
            timing: Default::default(),
            usage: resp.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
        });
        meta.model = resp.model.or(meta.model);
        meta.external_id = resp.id;
        meta.started_at = resp.created.and_then(rfc3339_from_secs);
    }

    let Some(task) = task else {
        return Err(RecordError::at(
            line,
            "messages",
            "has no user message (the task is the first user message)",
        ));
    };
    let outcome = outcome(&r.score, &r.success, &r.feedback, r.metadata.as_ref(), line)?;
    let final_answer = last_answer(&steps);
    Ok(Trajectory {
        task,
        system: (!system_parts.is_empty()).then(|| system_parts.join("\n\n")),
        tools,
        // A chat-completions tool is a function definition: the format has no behaviour hints.
        tool_annotations: Default::default(),
        steps,
        final_answer,
        outcome,
        meta,
        links: Default::default(),
    })
}

/// Top-level `score`/`success`/`feedback` win over the same keys under `metadata`.
fn outcome(
    score: &Option<Value>,
    success: &Option<Value>,
    feedback: &Option<String>,
    metadata: Option<&Map<String, Value>>,
    line: u64,
) -> Result<Outcome, RecordError> {
    let pick = |key: &str, top: &Option<Value>| -> Option<(String, Value)> {
        match top {
            Some(v) if !v.is_null() => Some((key.to_string(), v.clone())),
            _ => metadata
                .and_then(|m| m.get(key))
                .map(|v| (format!("metadata.{key}"), v.clone())),
        }
    };
    let score = match pick("score", score) {
        Some((path, v)) => score_value(&v).map_err(|e| RecordError::at(line, path, e))?,
        None => None,
    };
    let success = match pick("success", success) {
        Some((path, v)) => success_value(&v).map_err(|e| RecordError::at(line, path, e))?,
        None => None,
    };
    let feedback = match feedback {
        Some(f) => Some(f.clone()),
        None => match metadata.and_then(|m| m.get("feedback")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(RecordError::at(
                    line,
                    "metadata.feedback",
                    format!("expected a string, found {}", kind(other)),
                ));
            }
        },
    };
    Ok(Outcome {
        score,
        success,
        feedback,
    })
}

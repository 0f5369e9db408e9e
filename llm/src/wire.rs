//! The OpenAI chat-completions JSON, as far as tooltune speaks it: the subset both the client backend sends
//! and parses and the `model serve` endpoint accepts and answers. Unknown fields are ignored on input, so
//! requests from other clients (with `top_p`, `user`, ...) are accepted.

use crate::{ChatRequest, ChatResponse, FinishReason, Message, ToolChoice};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tooltune_core::{ToolCall, ToolSpec, Usage};

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRequest {
    /// Model name.
    #[serde(default)]
    pub model: String,
    /// The conversation.
    pub messages: Vec<WireMessage>,
    /// Function tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    /// `"auto"`, `"required"`, `"none"` or `{"type": "function", "function": {"name": ...}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Token limit (the field every compatible server understands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Token limit (newer name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Streaming is not supported by `model serve`; the client always sends `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Number of choices; only 1 is supported by `model serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
}

/// One message on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// A string, an array of content parts, or null.
    #[serde(default)]
    pub content: Option<Value>,
    /// The assistant's tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// For `tool` messages: the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `tool` messages: the tool's name (optional in OpenAI's API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One tool call on the wire; `arguments` is a JSON *string*.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireToolCall {
    /// Call id.
    #[serde(default)]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function called.
    pub function: WireFunctionCall,
}

fn function_type() -> String {
    "function".into()
}

/// The function part of a tool call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireFunctionCall {
    /// Tool name.
    pub name: String,
    /// JSON-encoded arguments.
    #[serde(default)]
    pub arguments: String,
}

/// A chat-completion response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireResponse {
    /// Completion id.
    #[serde(default)]
    pub id: String,
    /// `chat.completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Model name.
    #[serde(default)]
    pub model: String,
    /// The choices (tooltune uses the first).
    pub choices: Vec<WireChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

/// One choice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireChoice {
    /// Index.
    #[serde(default)]
    pub index: u32,
    /// The assistant message.
    pub message: WireMessage,
    /// `stop`, `tool_calls`, `length`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct WireUsage {
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Sum.
    #[serde(default)]
    pub total_tokens: u64,
}

/// Pairs calls and results when the producer gave no id: the id is derived from the tool's name.
fn call_id(id: &Option<String>, name: &str) -> String {
    id.clone().unwrap_or_else(|| format!("call_{name}"))
}

/// A tool in OpenAI's function-tool shape: what the wire carries and what chat templates expect.
pub fn tool_json(t: &ToolSpec) -> Value {
    let params = if t.input_schema.as_object().is_some_and(|o| !o.is_empty()) {
        (*t.input_schema).clone()
    } else {
        json!({"type": "object", "properties": {}})
    };
    json!({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": params}})
}

/// A tooltune request as the JSON body for `model`.
pub fn request_to_wire(req: &ChatRequest, model: &str) -> WireRequest {
    let messages = req
        .messages
        .iter()
        .map(|m| match m {
            Message::System { content } => WireMessage {
                role: "system".into(),
                content: Some(json!(content)),
                ..Default::default()
            },
            Message::User { content } => WireMessage {
                role: "user".into(),
                content: Some(json!(content)),
                ..Default::default()
            },
            Message::Assistant {
                content,
                tool_calls,
            } => WireMessage {
                role: "assistant".into(),
                content: content.as_ref().map(|c| json!(c)),
                tool_calls: (!tool_calls.is_empty()).then(|| {
                    tool_calls
                        .iter()
                        .map(|c| WireToolCall {
                            id: Some(call_id(&c.id, &c.name)),
                            kind: function_type(),
                            function: WireFunctionCall {
                                name: c.name.clone(),
                                arguments: match &c.arguments {
                                    Value::String(s) => s.clone(),
                                    v => v.to_string(),
                                },
                            },
                        })
                        .collect()
                }),
                ..Default::default()
            },
            Message::Tool {
                call_id: id,
                name,
                content,
            } => WireMessage {
                role: "tool".into(),
                content: Some(json!(content)),
                tool_call_id: Some(call_id(id, name)),
                name: Some(name.clone()),
                ..Default::default()
            },
        })
        .collect();
    let has_tools = !req.tools.is_empty();
    WireRequest {
        model: model.to_string(),
        messages,
        tools: req.tools.iter().map(tool_json).collect(),
        tool_choice: has_tools.then(|| match &req.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Required => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        }),
        max_tokens: Some(req.max_tokens),
        max_completion_tokens: None,
        temperature: Some(req.temperature),
        seed: req.seed,
        stream: Some(false),
        n: None,
    }
}

/// Text of a `content` field: a string, or the `text` of its content parts.
fn content_text(c: &Option<Value>) -> Option<String> {
    match c {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Some(other) => Some(other.to_string()),
    }
}

fn parse_arguments(s: &str) -> Value {
    if s.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// A JSON body received by `model serve`, as a tooltune request. Errors name the offending field.
pub fn request_from_wire(w: WireRequest) -> Result<ChatRequest, String> {
    if w.stream == Some(true) {
        return Err("stream: streaming is not supported; send \"stream\": false".into());
    }
    if w.n.is_some_and(|n| n != 1) {
        return Err("n: only one choice is supported".into());
    }
    let mut messages = Vec::new();
    for (i, m) in w.messages.iter().enumerate() {
        let text = content_text(&m.content);
        messages.push(match m.role.as_str() {
            "system" | "developer" => Message::System {
                content: text.unwrap_or_default(),
            },
            "user" => Message::User {
                content: text.unwrap_or_default(),
            },
            "assistant" => Message::Assistant {
                content: text,
                tool_calls: m
                    .tool_calls
                    .iter()
                    .flatten()
                    .map(|c| ToolCall {
                        id: c.id.clone(),
                        name: c.function.name.clone(),
                        arguments: parse_arguments(&c.function.arguments),
                    })
                    .collect(),
            },
            "tool" => {
                // OpenAI's tool messages carry only the call id; the name comes from the matching call.
                let name = m.name.clone().or_else(|| {
                    w.messages[..i].iter().rev().find_map(|prev| {
                        prev.tool_calls.iter().flatten().find_map(|c| {
                            (c.id.is_some() && c.id == m.tool_call_id)
                                .then(|| c.function.name.clone())
                        })
                    })
                });
                Message::Tool {
                    call_id: m.tool_call_id.clone(),
                    name: name.unwrap_or_default(),
                    content: text.unwrap_or_default(),
                }
            }
            other => return Err(format!("messages[{i}].role: unknown role `{other}`")),
        });
    }
    let mut tools = Vec::new();
    for (i, t) in w.tools.iter().enumerate() {
        let f = t
            .get("function")
            .ok_or_else(|| format!("tools[{i}]: only function tools are supported"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("tools[{i}].function.name: missing"))?;
        tools.push(ToolSpec {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            input_schema: f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({}))
                .into(),
        });
    }
    let tool_choice = match &w.tool_choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            other => return Err(format!("tool_choice: unknown value `{other}`")),
        },
        Some(v) => {
            // A named function: that tool must be called; every tool stays in the prompt, as hosted APIs keep them.
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    "tool_choice: expected a string or {\"function\": {\"name\"}}".to_string()
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(format!("tool_choice: no tool named `{name}`"));
            }
            ToolChoice::Tool(name.to_string())
        }
    };
    Ok(ChatRequest {
        messages,
        tools,
        tool_choice,
        max_tokens: w.max_completion_tokens.or(w.max_tokens).unwrap_or(512),
        temperature: w.temperature.unwrap_or(0.0),
        seed: w.seed,
        format: None,
    })
}

/// A tooltune response as the JSON body `model serve` answers with.
pub fn response_to_wire(r: &ChatResponse, model: &str, id: String, created: u64) -> WireResponse {
    let message = WireMessage {
        role: "assistant".into(),
        content: r.content.as_ref().map(|c| json!(c)),
        tool_calls: (!r.tool_calls.is_empty()).then(|| {
            r.tool_calls
                .iter()
                .map(|c| WireToolCall {
                    id: c.id.clone(),
                    kind: function_type(),
                    function: WireFunctionCall {
                        name: c.name.clone(),
                        arguments: c.arguments.to_string(),
                    },
                })
                .collect()
        }),
        ..Default::default()
    };
    WireResponse {
        id,
        object: "chat.completion".into(),
        created,
        model: model.to_string(),
        choices: vec![WireChoice {
            index: 0,
            message,
            finish_reason: Some(
                match r.finish_reason {
                    FinishReason::Stop => "stop",
                    FinishReason::ToolCalls => "tool_calls",
                    FinishReason::Length => "length",
                    FinishReason::Other => "content_filter",
                }
                .into(),
            ),
        }],
        usage: Some(WireUsage {
            prompt_tokens: r.usage.prompt_tokens,
            completion_tokens: r.usage.completion_tokens,
            total_tokens: r.usage.prompt_tokens + r.usage.completion_tokens,
        }),
    }
}

/// A JSON body received from an endpoint, as a tooltune response.
pub fn response_from_wire(w: WireResponse) -> Result<ChatResponse, String> {
    let choice = w
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| "choices: empty".to_string())?;
    let tool_calls: Vec<ToolCall> = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| ToolCall {
            id: c.id,
            name: c.function.name,
            arguments: parse_arguments(&c.function.arguments),
        })
        .collect();
    let finish_reason = match choice.finish_reason.as_deref() {
        Some("stop") | None => {
            if tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            }
        }
        Some("tool_calls") | Some("function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some(_) => FinishReason::Other,
    };
    let usage = w.usage.unwrap_or_default();
    Ok(ChatResponse {
        content: content_text(&choice.message.content).filter(|s| !s.is_empty()),
        tool_calls,
        usage: Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        },
        finish_reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChatRequest {
        let mut r = ChatRequest::new(
            vec![
                Message::system("s"),
                Message::user("u"),
                Message::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall {
                        id: Some("c1".into()),
                        name: "read_file".into(),
                        arguments: json!({"path": "a"}),
                    }],
                },
                Message::Tool {
                    call_id: Some("c1".into()),
                    name: "read_file".into(),
                    content: "text".into(),
                },
            ],
            vec![ToolSpec {
                name: "read_file".into(),
                description: "Read.".into(),
                input_schema: json!({"type": "object", "properties": {}}).into(),
            }],
        );
        r.tool_choice = ToolChoice::Required;
        r.seed = Some(7);
        r
    }

    #[test]
    fn request_round_trips_through_the_wire_format() {
        let w = request_to_wire(&sample(), "m");
        let text = serde_json::to_string(&w).expect("serialises");
        let back: WireRequest = serde_json::from_str(&text).expect("parses");
        assert_eq!(request_from_wire(back).expect("valid"), sample());
    }

    #[test]
    fn tool_message_without_name_takes_it_from_the_call() {
        let mut w = request_to_wire(&sample(), "m");
        w.messages[3].name = None;
        let r = request_from_wire(w).expect("valid");
        assert!(matches!(&r.messages[3], Message::Tool { name, .. } if name == "read_file"));
    }

    #[test]
    fn named_tool_choice_requires_that_tool_and_bad_input_names_the_field() {
        let mut w = request_to_wire(&sample(), "m");
        w.tool_choice = Some(json!({"type": "function", "function": {"name": "read_file"}}));
        assert_eq!(
            request_from_wire(w.clone()).expect("ok").tool_choice,
            ToolChoice::Tool("read_file".into())
        );
        // And back: the name survives the trip to an OpenAI-compatible server.
        let mut named = sample();
        named.tool_choice = ToolChoice::Tool("read_file".into());
        assert_eq!(
            request_to_wire(&named, "m").tool_choice,
            Some(json!({"type": "function", "function": {"name": "read_file"}}))
        );
        w.tool_choice = Some(json!({"type": "function", "function": {"name": "nope"}}));
        assert!(
            request_from_wire(w.clone())
                .expect_err("unknown")
                .contains("nope")
        );
        w.tool_choice = None;
        w.stream = Some(true);
        assert!(
            request_from_wire(w)
                .expect_err("stream")
                .starts_with("stream")
        );
    }

    #[test]
    fn response_round_trips_and_keeps_non_json_arguments_as_strings() {
        let r = ChatResponse {
            content: Some("hi".into()),
            tool_calls: vec![ToolCall {
                id: Some("x".into()),
                name: "t".into(),
                arguments: json!({"a": 1}),
            }],
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            },
            finish_reason: FinishReason::ToolCalls,
        };
        let w = response_to_wire(&r, "m", "id".into(), 0);
        assert_eq!(w.usage.expect("usage").total_tokens, 7);
        assert_eq!(response_from_wire(w.clone()).expect("ok"), r);
        let mut w2 = w;
        w2.choices[0].message.tool_calls.as_mut().expect("calls")[0]
            .function
            .arguments = "not json".into();
        let back = response_from_wire(w2).expect("ok");
        assert_eq!(back.tool_calls[0].arguments, json!("not json"));
    }
}

//! Rendering a conversation with tools through the model's own Jinja chat template (read from the GGUF).
//!
//! llama.cpp's built-in template engine does not render tools, so the GGUF's template runs in minijinja
//! with the inputs Hugging Face's `apply_chat_template` would give it: messages and tools in OpenAI's
//! shape, and a `tojson` filter that writes JSON the way Python's `json.dumps` does (`", "` and `": "`
//! separators, no HTML escaping). The model was trained on that spelling; minijinja's own `tojson` writes
//! compact, HTML-escaped JSON, which would be a prompt the model never saw.

use crate::wire::tool_json;
use crate::{LlmError, Message};
use minijinja::{Environment, Value};
use serde_json::{Value as Json, json};
use tooltune_core::ToolSpec;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles a template's source.
    pub fn new(source: &str) -> Result<Self, LlmError> {
        // The settings Hugging Face's `apply_chat_template` compiles templates with (and so the prompts the
        // model was trained on): blocks trimmed, and the newline that ends the template file dropped.
        // Keeping that newline made the generation prompt `<|im_start|>assistant\n\n`, a turn opening
        // the model never saw, and one that the rendered reply (`assistant\n<tool_call>`) does not repeat.
        let mut env = Environment::new();
        env.set_keep_trailing_newline(false);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", |v: Value| -> Result<Value, minijinja::Error> {
            let j: Json = serde_json::to_value(&v).map_err(|e| {
                minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
            })?;
            Ok(Value::from_safe_string(python_json(&j)))
        });
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| LlmError::Local {
                model: "chat template".into(),
                message: format!("the GGUF's chat template does not compile: {e}"),
            })?;
        Ok(ChatTemplate { env })
    }

    /// Renders the prompt for `messages` with `tools`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let msgs: Vec<Json> = messages.iter().map(message_json).collect();
        let tools: Vec<Json> = tools.iter().map(tool_json).collect();
        let tmpl = self.env.get_template("chat").map_err(|e| LlmError::Local {
            model: "chat template".into(),
            message: e.to_string(),
        })?;
        let ctx = Value::from_serialize(json!({
            "messages": msgs,
            "tools": if tools.is_empty() { Json::Null } else { Json::Array(tools) },
            "add_generation_prompt": add_generation_prompt,
        }));
        tmpl.render(ctx).map_err(|e| LlmError::Local {
            model: "chat template".into(),
            message: format!("rendering the chat template: {e}"),
        })
    }
}

fn message_json(m: &Message) -> Json {
    match m {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let calls: Vec<Json> = tool_calls
                .iter()
                .map(|c| {
                    json!({"type": "function", "id": c.id,
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            json!({"role": "assistant", "content": content.clone().unwrap_or_default(),
                   "tool_calls": calls})
        }
        Message::Tool {
            call_id,
            name,
            content,
        } => json!({"role": "tool", "tool_call_id": call_id, "name": name, "content": content}),
    }
}

/// JSON as Python's `json.dumps(v, ensure_ascii=False)` writes it.
pub fn python_json(v: &Json) -> String {
    let mut out = String::new();
    write_python_json(v, &mut out);
    out
}

fn write_python_json(v: &Json, out: &mut String) {
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => out.push_str(&n.to_string()),
        Json::String(s) => write_python_str(s, out),
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(x, out);
            }
            out.push(']');
        }
        Json::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_str(k, out);
                out.push_str(": ");
                write_python_json(x, out);
            }
            out.push('}');
        }
    }
}

fn write_python_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use tooltune_core::ToolCall;

    /// A cut-down Qwen2.5 template: the parts that use tools, tool calls and `tojson`.
    const QWEN_LIKE: &str = r#"{%- if tools %}<|im_start|>system
{{ messages[0]['content'] }}<tools>{%- for tool in tools %}
{{ tool | tojson }}{%- endfor %}
</tools><|im_end|>
{%- endif %}
{%- for message in messages %}{%- if message.role == "user" %}
<|im_start|>user
{{ message.content }}<|im_end|>{%- elif message.role == "assistant" %}
<|im_start|>assistant{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{%- endfor %}<|im_end|>{%- elif message.role == "tool" %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"#;

    #[test]
    fn python_json_matches_json_dumps_spelling() {
        let v = json!({"b": [1, 2.5, null], "a": "x\"<é>\n", "t": true});
        assert_eq!(
            python_json(&v),
            r#"{"b": [1, 2.5, null], "a": "x\"<é>\n", "t": true}"#
        );
    }

    #[test]
    fn renders_tools_calls_and_results_in_order() {
        let t = ChatTemplate::new(QWEN_LIKE).expect("compiles");
        let tools = vec![ToolSpec {
            name: "read_file".into(),
            description: "Read a <file>.".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        }];
        let msgs = vec![
            Message::system("Be brief."),
            Message::user("Read notes.txt"),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: Some("c1".into()),
                    name: "read_file".into(),
                    arguments: json!({"path": "notes.txt"}),
                }],
            },
            Message::Tool {
                call_id: Some("c1".into()),
                name: "read_file".into(),
                content: "1 2 3".into(),
            },
        ];
        let s = t.render(&msgs, &tools, true).expect("renders");
        assert!(s.contains(r#"{"type": "function", "function": {"name": "read_file", "description": "Read a <file>.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}"#), "{s}");
        assert!(
            s.contains("{\"name\": \"read_file\", \"arguments\": {\"path\": \"notes.txt\"}}"),
            "{s}"
        );
        assert!(
            s.contains("<tool_response>\n1 2 3\n</tool_response>"),
            "{s}"
        );
        assert!(s.ends_with("<|im_start|>assistant\n"), "{s}");
    }

    #[test]
    fn the_newline_ending_the_template_file_is_not_rendered() {
        let t = ChatTemplate::new(&format!("{QWEN_LIKE}\n")).expect("compiles");
        let s = t
            .render(&[Message::user("hi")], &[], true)
            .expect("renders");
        assert!(s.ends_with("<|im_start|>assistant\n"), "{s:?}");
        assert!(!s.ends_with("\n\n"), "{s:?}");
    }
}

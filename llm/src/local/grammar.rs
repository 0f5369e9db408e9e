//! The grammar that makes a local tool call valid JSON naming a real tool: a `oneOf` over the tools, each
//! alternative fixing `name` with `const` and constraining `arguments` with the tool's own input schema.

use serde_json::{Value, json};
use tooltune_core::ToolSpec;

/// The JSON Schema of one tool call (`{"name": ..., "arguments": ...}`) for any of `tools`. Key order
/// matters: `name` comes first, as in Qwen's tool-call format, and `preserve_order` keeps it there.
pub fn tool_call_schema(tools: &[ToolSpec], usable: impl Fn(&Value) -> bool) -> Value {
    let alternatives: Vec<Value> = tools
        .iter()
        .map(|t| {
            let args = arguments_schema(&t.input_schema, &usable);
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": args},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    if alternatives.len() == 1 {
        alternatives.into_iter().next().unwrap_or(Value::Null)
    } else {
        json!({ "oneOf": alternatives })
    }
}

/// A tool's input schema as a grammar can use it. An empty schema, or one the grammar converter rejects
/// (`usable` returns false: unsupported keywords, unresolvable `$ref`s), becomes "any JSON object", so
/// the call is still well-formed JSON naming the tool even when its arguments cannot be constrained.
fn arguments_schema(schema: &Value, usable: &impl Fn(&Value) -> bool) -> Value {
    let any_object = json!({"type": "object"});
    match schema.as_object() {
        Some(o) if !o.is_empty() => {
            let mut s = schema.clone();
            if let Some(m) = s.as_object_mut() {
                // `$schema` and `$id` only name dialects; the converter does not need them.
                m.remove("$schema");
                m.remove("$id");
            }
            if usable(&s) { s } else { any_object }
        }
        _ => any_object,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, schema: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: schema.into(),
        }
    }

    #[test]
    fn one_alternative_per_tool_with_name_first() {
        let tools = vec![
            tool(
                "a",
                json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            ),
            tool("b", json!({})),
        ];
        let s = tool_call_schema(&tools, |_| true);
        let alts = s["oneOf"].as_array().expect("oneOf");
        assert_eq!(alts.len(), 2);
        assert_eq!(alts[0]["properties"]["name"]["const"], "a");
        assert_eq!(
            alts[1]["properties"]["arguments"],
            json!({"type": "object"})
        );
        let keys: Vec<&String> = alts[0]["properties"]
            .as_object()
            .expect("obj")
            .keys()
            .collect();
        assert_eq!(keys, ["name", "arguments"]);
    }

    #[test]
    fn unusable_schema_falls_back_to_any_object() {
        let tools = vec![tool("a", json!({"$ref": "#/nowhere"}))];
        let s = tool_call_schema(&tools, |_| false);
        assert_eq!(s["properties"]["arguments"], json!({"type": "object"}));
    }
}

//! What drafting knows about a server's tools, read from `tools/list`: whether a tool may be called freely
//! (read-only), its parameters as a person would list them, and which pairs of tools are easy to confuse. Pure.

use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use tooltune_core::{ToolAnnotations, ToolSpec};

/// Whether calling a tool may change the server's world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// `readOnlyHint: true`.
    ReadOnly,
    /// No hint either way, but its name says it reads (`list_…`, `search`, `get_…`, `read_…`).
    ReadOnlyByName,
    /// `readOnlyHint: false` or `destructiveHint: true`: it writes.
    Writes,
    /// No hint, and its name does not say.
    Unknown,
}

impl Access {
    /// Whether exploration may call it on the server as it is (a read-only tool, declared or by its name).
    pub fn explorable(self) -> bool {
        matches!(self, Access::ReadOnly | Access::ReadOnlyByName)
    }

    /// A few words for the review page.
    pub fn describe(self) -> &'static str {
        match self {
            Access::ReadOnly => "read-only (declared)",
            Access::ReadOnlyByName => "read-only (by its name; no hint declared)",
            Access::Writes => "writes (declared)",
            Access::Unknown => "unknown (no hint declared)",
        }
    }
}

/// Words in a tool's name that say it only reads. Only consulted when the server declares no hint.
const READING_WORDS: &[&str] = &[
    "list", "search", "get", "read", "find", "query", "show", "describe", "lookup", "view", "info",
    "stat", "tree", "open", "fetch",
];

/// A tool's access, from its declared hints and, failing those, its name.
pub fn access(name: &str, hints: Option<&ToolAnnotations>) -> Access {
    if let Some(h) = hints {
        if h.destructive_hint == Some(true) || h.read_only_hint == Some(false) {
            return Access::Writes;
        }
        if h.read_only_hint == Some(true) {
            return Access::ReadOnly;
        }
    }
    if name_words(name)
        .iter()
        .any(|w| READING_WORDS.contains(&w.as_str()))
    {
        Access::ReadOnlyByName
    } else {
        Access::Unknown
    }
}

/// The lowercase words of an identifier: `read_text_file`, `readTextFile` and `read-text-file` all give
/// `read`, `text`, `file`.
pub fn name_words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !cur.is_empty() {
            words.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        cur.extend(c.to_lowercase());
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// One parameter of a tool, as the prompts list it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its JSON type (`string`, `integer`, `array of string`), or `any`.
    pub r#type: String,
    /// Whether the schema requires it.
    pub required: bool,
    /// The schema's description of it, cut to one line.
    pub description: String,
}

/// The parameters of a tool's input schema, required ones first.
pub fn params(schema: &Value) -> Vec<Param> {
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out: Vec<Param> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, p)| Param {
                    name: name.clone(),
                    r#type: type_of(p),
                    required: required.contains(name.as_str()),
                    description: first_sentence(
                        p.get("description").and_then(Value::as_str).unwrap_or(""),
                        160,
                    ),
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|p| !p.required);
    out
}

fn type_of(p: &Value) -> String {
    match p.get("type") {
        Some(Value::String(t)) if t == "array" => match p.get("items").map(type_of) {
            Some(inner) if inner != "any" => format!("array of {inner}"),
            _ => "array".into(),
        },
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".into(),
    }
}

/// The number of parameters the schema requires.
pub fn required_count(schema: &Value) -> usize {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// The first sentence of a text on one line, at most `max` characters (cut at a word).
pub fn first_sentence(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = line
        .char_indices()
        .find(|(i, c)| matches!(c, '.' | '!' | '?') && line[i + c.len_utf8()..].starts_with(' '))
        .map_or(line.len(), |(i, c)| i + c.len_utf8());
    cut(&line[..end], max)
}

/// `text` cut to at most `max` characters, at a word when one ends close enough, with `…` when cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max.saturating_sub(1)).collect();
    let at = head
        .rfind(' ')
        .filter(|i| *i > head.len() / 2)
        .unwrap_or(head.len());
    format!("{}…", head[..at].trim_end())
}

/// Pairs of tools most alike in the words of their names, descriptions and parameter names (Jaccard similarity of
/// the word sets, stop words left out), most alike first, at most `max` pairs, each tool in at most one pair so the
/// drafted requests spread. A pair with nothing in common is never returned.
pub fn confusable_pairs(tools: &[ToolSpec], max: usize) -> Vec<(String, String, f64)> {
    let words: Vec<BTreeSet<String>> = tools.iter().map(tool_words).collect();
    let mut pairs = Vec::new();
    for i in 0..tools.len() {
        for j in i + 1..tools.len() {
            let inter = words[i].intersection(&words[j]).count();
            let union = words[i].union(&words[j]).count();
            if inter > 0 && union > 0 {
                pairs.push((i, j, inter as f64 / union as f64));
            }
        }
    }
    // Ties broken by position, so the choice is a pure function of the tool list.
    pairs.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    let mut used = BTreeSet::new();
    let mut out = Vec::new();
    for (i, j, s) in pairs {
        if out.len() >= max {
            break;
        }
        if used.contains(&i) || used.contains(&j) {
            continue;
        }
        used.insert(i);
        used.insert(j);
        out.push((tools[i].name.clone(), tools[j].name.clone(), s));
    }
    out
}

const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "is", "are", "be", "it", "its",
    "this", "that", "with", "by", "from", "as", "at", "can", "will", "use", "used", "returns",
    "return", "if", "not", "only", "all", "any", "each", "one", "you", "your", "when", "which",
    "e", "g", "i",
];

fn tool_words(t: &ToolSpec) -> BTreeSet<String> {
    let mut text = t.name.clone();
    text.push(' ');
    text.push_str(&t.description);
    for p in params(&t.input_schema) {
        text.push(' ');
        text.push_str(&p.name);
    }
    name_words(&text)
        .into_iter()
        .filter(|w| w.len() > 1 && !STOP_WORDS.contains(&w.as_str()))
        .collect()
}

/// The hints of each tool, looked up by name.
pub fn access_map(
    tools: &[ToolSpec],
    hints: &BTreeMap<String, ToolAnnotations>,
) -> BTreeMap<String, Access> {
    tools
        .iter()
        .map(|t| (t.name.clone(), access(&t.name, hints.get(&t.name))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, description: &str, schema: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: schema.into(),
        }
    }

    #[test]
    fn access_follows_hints_then_names() {
        let ro = ToolAnnotations {
            read_only_hint: Some(true),
            ..Default::default()
        };
        let destructive = ToolAnnotations {
            read_only_hint: Some(true),
            destructive_hint: Some(true),
            ..Default::default()
        };
        assert_eq!(access("calculator", Some(&ro)), Access::ReadOnly);
        assert_eq!(access("list_files", Some(&destructive)), Access::Writes);
        assert_eq!(access("readTextFile", None), Access::ReadOnlyByName);
        assert_eq!(access("search_nodes", None), Access::ReadOnlyByName);
        assert_eq!(access("write_file", None), Access::Unknown);
        assert_eq!(access("calculator", None), Access::Unknown);
        assert!(!Access::Unknown.explorable() && Access::ReadOnlyByName.explorable());
    }

    #[test]
    fn words_of_identifiers() {
        assert_eq!(name_words("readTextFile"), ["read", "text", "file"]);
        assert_eq!(name_words("list-dir_v2"), ["list", "dir", "v2"]);
        assert_eq!(name_words("HTTPGet"), ["httpget"]);
    }

    #[test]
    fn params_list_required_first_with_types() {
        let s = json!({"type": "object", "properties": {
            "tail": {"type": "integer", "description": "Only the last N lines. Optional."},
            "paths": {"type": "array", "items": {"type": "string"}},
            "path": {"type": "string"}
        }, "required": ["path"]});
        let p = params(&s);
        assert_eq!(p[0].name, "path");
        assert!(p[0].required);
        let paths = p.iter().find(|p| p.name == "paths").expect("paths");
        assert_eq!(paths.r#type, "array of string");
        let tail = p.iter().find(|p| p.name == "tail").expect("tail");
        assert_eq!(tail.description, "Only the last N lines.");
        assert_eq!(required_count(&s), 1);
    }

    #[test]
    fn first_sentence_and_cut() {
        assert_eq!(
            first_sentence("Reads a file.  Use it often.", 100),
            "Reads a file."
        );
        assert_eq!(first_sentence("v1.2 of the API", 100), "v1.2 of the API");
        assert_eq!(cut("alpha beta gamma delta", 12), "alpha beta…");
    }

    #[test]
    fn confusable_pairs_are_the_most_alike_and_disjoint() {
        let obj = json!({"type": "object", "properties": {"query": {"type": "string"}}});
        let tools = vec![
            tool(
                "search_docs",
                "Search the internal documentation.",
                obj.clone(),
            ),
            tool("web_search", "Search the web.", obj.clone()),
            tool(
                "calculator",
                "Evaluate arithmetic.",
                json!({"type": "object"}),
            ),
        ];
        let pairs = confusable_pairs(&tools, 3);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        assert_eq!(
            (pairs[0].0.as_str(), pairs[0].1.as_str()),
            ("search_docs", "web_search")
        );
        assert!(pairs[0].2 > 0.0 && pairs[0].2 <= 1.0);
    }
}

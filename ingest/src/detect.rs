//! Format detection from the top-level keys of the first non-blank record.

use crate::Format;
use serde::de::IgnoredAny;
use std::collections::BTreeMap;

/// Top-level keys that only a Langfuse trace object has (`GET /api/public/traces/{id}`).
const LANGFUSE_KEYS: [&str; 4] = ["observations", "htmlPath", "totalCost", "scores"];

/// Which format the first record is in, or a reason naming the keys seen and the formats known.
pub(crate) fn detect(line: u64, bytes: &[u8]) -> Result<Format, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "the first record (line {line}) is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        )
    })?;
    // Only the keys are needed; the values are skipped without being built.
    let keys: BTreeMap<String, IgnoredAny> = serde_json::from_str(text).map_err(|e| {
        format!(
            "the first record (line {line}) is not a JSON object: {}; {}",
            crate::common::json_message(&e),
            known()
        )
    })?;
    let has = |k: &str| keys.contains_key(k);
    if has("resourceSpans") {
        return Ok(Format::Otel);
    }
    if LANGFUSE_KEYS.iter().any(|k| has(k)) {
        return Ok(Format::Langfuse);
    }
    if has("messages") {
        return Ok(Format::OpenAi);
    }
    if has("task") {
        return Ok(Format::Tooltune);
    }
    let mut seen: Vec<String> = keys.keys().take(12).map(|k| format!("`{k}`")).collect();
    if keys.len() > 12 {
        seen.push(format!("and {} more", keys.len() - 12));
    }
    let seen = if seen.is_empty() {
        "no keys".to_string()
    } else {
        format!("keys {}", seen.join(", "))
    };
    Err(format!(
        "the first record (line {line}) has {seen}; {}",
        known()
    ))
}

fn known() -> String {
    "known formats: tooltune (key `task`), openai (key `messages`), langfuse (keys `observations`, `htmlPath`, \
     `totalCost`, `scores`), otel (key `resourceSpans`); name one explicitly if detection is wrong"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_format_by_its_keys() {
        assert_eq!(detect(1, br#"{"resourceSpans": []}"#), Ok(Format::Otel));
        assert_eq!(
            detect(1, br#"{"id": "t", "observations": []}"#),
            Ok(Format::Langfuse)
        );
        assert_eq!(
            detect(1, br#"{"model": "m", "messages": []}"#),
            Ok(Format::OpenAi)
        );
        assert_eq!(detect(1, br#"{"task": "x"}"#), Ok(Format::Tooltune));
    }

    #[test]
    fn unknown_keys_are_listed_with_the_known_formats() {
        let e = detect(3, br#"{"prompt": "x", "completion": "y"}"#).expect_err("unknown");
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("`completion`, `prompt`"), "{e}");
        assert!(e.contains("otel (key `resourceSpans`)"), "{e}");
        let e = detect(1, b"[1, 2]").expect_err("array");
        assert!(e.contains("not a JSON object"), "{e}");
    }
}

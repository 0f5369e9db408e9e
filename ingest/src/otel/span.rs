//! One decoded span with its place in the line, the attribute lookups the builders use, and the decode of a line
//! into its spans (scanner first, serde for the rest).

use super::fast;
use super::schema::{AnyValue, Request, Span, Str};
use crate::RecordError;
use crate::common::{from_json, rfc3339_from_nanos};
use serde_json::Value;
use std::borrow::Cow;
use tooltune_core::Timing;

/// One decoded span with where it came from; it borrows the text of its line.
pub(super) struct SpanRec<'a> {
    pub(super) span: Span<'a>,
    line: u64,
    /// Indices of the span in its line: resourceSpans, scopeSpans, spans.
    at: (usize, usize, usize),
    pub(super) service: Option<Str<'a>>,
    /// Whether an attribute key has an escape: when none has (nearly always), a key is found by comparing the text
    /// as written, without looking for escapes again on every lookup.
    escaped_keys: bool,
}

impl<'a> SpanRec<'a> {
    pub(super) fn path(&self) -> String {
        let (r, s, p) = self.at;
        format!("resourceSpans[{r}].scopeSpans[{s}].spans[{p}]")
    }

    pub(super) fn is_root(&self) -> bool {
        self.span.parent_span_id.is_none_or(|p| p.raw().is_empty())
    }

    pub(super) fn attr(&self, key: &str) -> Option<(usize, &AnyValue<'a>)> {
        let mut attrs = self.span.attributes.iter().enumerate();
        let found = if self.escaped_keys {
            attrs.find(|(_, kv)| kv.key.is(key))
        } else {
            attrs.find(|(_, kv)| kv.key.raw() == key)
        };
        found.map(|(i, kv)| (i, &kv.value))
    }

    pub(super) fn attr_str(&self, key: &str) -> Option<Cow<'a, str>> {
        self.attr(key)
            .and_then(|(_, v)| v.string_value.map(Str::text))
    }

    pub(super) fn attr_u64(&self, key: &str) -> Option<u64> {
        self.attr(key).and_then(|(_, v)| {
            v.int_value
                .and_then(|i| u64::try_from(i).ok())
                .or_else(|| v.double_value.map(|d| d as u64))
                .or_else(|| v.string_value.and_then(|s| s.text().parse().ok()))
        })
    }

    /// A structured ("any") attribute: recorded structured (kvlist/array) or, as the conventions allow on spans,
    /// as a JSON string.
    pub(super) fn attr_json(&self, key: &str) -> Result<Option<Value>, RecordError> {
        let Some((i, v)) = self.attr(key) else {
            return Ok(None);
        };
        match v.string_value {
            Some(s) => serde_json::from_str(&s.text()).map(Some).map_err(|e| {
                self.error(
                    &format!(".attributes[{i}].value.stringValue"),
                    format!(
                        "`{key}` is not valid JSON: {}",
                        crate::common::json_message(&e)
                    ),
                )
            }),
            None => Ok(Some(v.to_json())),
        }
    }

    pub(super) fn op(&self) -> Cow<'a, str> {
        self.attr_str("gen_ai.operation.name").unwrap_or_default()
    }

    pub(super) fn is_inference(&self) -> bool {
        matches!(
            self.op().as_ref(),
            "chat" | "generate_content" | "text_completion"
        )
    }

    pub(super) fn timing(&self) -> Timing {
        let s = &self.span;
        Timing {
            started_at: rfc3339_from_nanos(s.start_time_unix_nano),
            duration_ms: (s.end_time_unix_nano >= s.start_time_unix_nano
                && s.end_time_unix_nano > 0)
                .then(|| (s.end_time_unix_nano - s.start_time_unix_nano) as f64 / 1e6),
        }
    }

    pub(super) fn error(&self, path_suffix: &str, message: impl std::fmt::Display) -> RecordError {
        RecordError::at(
            self.line,
            format!("{}{path_suffix}", self.path()),
            format!("span {}: {message}", self.span.span_id.text()),
        )
    }
}

/// Decodes one line into its spans, borrowing from its text.
pub(super) fn parse_line(text: &str, line: u64) -> Result<Vec<SpanRec<'_>>, RecordError> {
    // The scanner (fast.rs) reads what it is sure of; serde reads the rest and names errors.
    let req: Request = match fast::request(text) {
        Ok(req) => req,
        Err(_) => from_json(text, line)?,
    };
    let mut out = Vec::new();
    for (r, rs) in req.resource_spans.into_iter().enumerate() {
        let service = rs.resource.as_ref().and_then(|res| {
            res.attributes
                .iter()
                .find(|kv| kv.key.is("service.name"))
                .and_then(|kv| kv.value.string_value)
        });
        for (s, ss) in rs.scope_spans.into_iter().enumerate() {
            for (p, span) in ss.spans.into_iter().enumerate() {
                if span.trace_id.raw().is_empty() {
                    return Err(RecordError::at(
                        line,
                        format!("resourceSpans[{r}].scopeSpans[{s}].spans[{p}].traceId"),
                        "is empty",
                    ));
                }
                let escaped_keys = span
                    .attributes
                    .iter()
                    .any(|kv| memchr::memchr(b'\\', kv.key.raw().as_bytes()).is_some());
                out.push(SpanRec {
                    span,
                    line,
                    at: (r, s, p),
                    service,
                    escaped_keys,
                });
            }
        }
    }
    Ok(out)
}

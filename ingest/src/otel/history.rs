//! History diffing: each chat span repeats the input of the one before it, so a trace's inputs are decoded once per
//! distinct message rather than once per span (O(turns) decodes, not O(turns^2)).

use super::messages::{OMsg, decode_message, decode_messages, messages, omsg};
use super::schema::Str;
use super::span::SpanRec;
use crate::RecordError;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The input messages of one trace's chat spans. Every chat span repeats the history before it, so the messages
/// it shares with the previous span's input are not decoded again (equal text decodes to the same message);
/// without this a trace of n turns decodes O(n^2) messages.
pub(super) struct History<'a> {
    pub(super) decoded: Vec<OMsg>,
    /// The previous input as written, and its messages as indices into `decoded`.
    previous: Option<(Str<'a>, Vec<usize>)>,
    /// The previous input unescaped, when it was read whole: the next whole read compares against it rather
    /// than unescaping it again.
    previous_text: Option<Cow<'a, str>>,
}

/// When the array `cur` is the array `prev` with elements appended, both as written inside a JSON string, the text
/// of the appended elements after the separating comma (`[a,b]`, `[a,b,c]` give `c]`), or `""` when they are
/// equal. The cut falls on a structural character, never inside an escape, so the prefix decodes to `prev`'s
/// elements.
fn appended<'s>(prev: &str, cur: &'s str) -> Option<&'s str> {
    let body = prev.strip_suffix(']')?;
    if body.trim_end() == "[" {
        return None;
    }
    match cur.strip_prefix(body)? {
        "]" => Some(""),
        rest => rest.strip_prefix(','),
    }
}

impl<'a> History<'a> {
    pub(super) fn new() -> Self {
        History {
            decoded: Vec::new(),
            previous: None,
            previous_text: None,
        }
    }

    /// The messages of attribute `key` on `rec`, as indices into `decoded`; `None` when the span does not have it.
    pub(super) fn of(
        &mut self,
        rec: &SpanRec<'a>,
        key: &str,
    ) -> Result<Option<Vec<usize>>, RecordError> {
        let Some((i, v)) = rec.attr(key) else {
            return Ok(None);
        };
        let Some(text) = v.string_value else {
            // Recorded structured: rare, and already one value per message.
            let start = self.decoded.len();
            self.decoded.extend(messages(rec, key)?.unwrap_or_default());
            return Ok(Some((start..self.decoded.len()).collect()));
        };
        // The usual case: the previous input with this turn's messages appended, read without decoding the rest.
        if let Some((prev, shared)) = &self.previous
            && let Some(tail) = appended(prev.raw(), text.raw())
        {
            let mut out = shared.clone();
            if self.decode_tail(rec, key, i, tail, &mut out).is_some() {
                self.previous = Some((text, out.clone()));
                self.previous_text = None;
                return Ok(Some(out));
            }
            // Something in the new messages is wrong: the full read below says what, as for any input.
        }
        // Formatted only when an error happens, not on every span.
        let at = || format!(".attributes[{i}].value.stringValue");
        let decoded = text.text();
        let raw: Vec<&RawValue> = serde_json::from_str(&decoded).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Data => "does not follow the messages schema",
                _ => "is not valid JSON",
            };
            rec.error(
                &at(),
                format!("`{key}` {what}: {}", crate::common::json_message(&e)),
            )
        })?;
        // Messages equal to the one at the same place in the previous input are shared.
        let prev_text = match self.previous_text.take() {
            Some(t) => Some(t),
            None => self.previous.as_ref().map(|(p, _)| p.text()),
        };
        let prev: Vec<&RawValue> = prev_text
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        let prev_idx = self.previous.as_ref().map(|(_, idx)| idx.as_slice());
        let mut out = Vec::with_capacity(raw.len());
        for (n, r) in raw.into_iter().enumerate() {
            let same = prev.get(n).is_some_and(|p| p.get() == r.get());
            let idx = match prev_idx.and_then(|idx| idx.get(n)) {
                Some(&idx) if same => idx,
                _ => {
                    let m = decode_message(r.get()).map_err(|e| {
                        rec.error(
                            &at(),
                            format!(
                                "`{key}`[{n}] does not follow the messages schema: {}",
                                crate::common::json_message(&e)
                            ),
                        )
                    })?;
                    self.decoded.push(omsg(rec, key, i, n, m)?);
                    self.decoded.len() - 1
                }
            };
            out.push(idx);
        }
        self.previous = Some((text, out.clone()));
        self.previous_text = Some(decoded);
        Ok(Some(out))
    }

    /// Decodes the messages appended after the shared ones (`tail` as [`appended`] gives it) onto `out`; `None`
    /// when they do not decode, leaving `decoded` as it was.
    fn decode_tail(
        &mut self,
        rec: &SpanRec<'a>,
        key: &str,
        i: usize,
        tail: &str,
        out: &mut Vec<usize>,
    ) -> Option<()> {
        if tail.is_empty() {
            return Some(());
        }
        // The tail is text inside a JSON string: unescaped first (by serde_json when it has surrogate escapes,
        // which only it pairs), then decoded as the rest of the array in one pass: any failure falls back to the
        // full read, which names it, so the messages need not be split apart first to tell which one failed.
        let text = match crate::scan::unescape(tail) {
            Ok(t) => format!("[{t}"),
            Err(_) => serde_json::from_str(&format!("\"[{tail}\"")).ok()?,
        };
        let lite = decode_messages(&text).ok()?;
        let first = out.len();
        let mut new = Vec::with_capacity(lite.len());
        for (j, m) in lite.into_iter().enumerate() {
            new.push(omsg(rec, key, i, first + j, m).ok()?);
        }
        for m in new {
            self.decoded.push(m);
            out.push(self.decoded.len() - 1);
        }
        Some(())
    }
}

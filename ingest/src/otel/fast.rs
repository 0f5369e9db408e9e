//! The OTLP reader's fastest first pass: a line read with [`crate::scan`], comparing instead of scanning what a
//! span's long string attributes share with the previous span's (the same tool definitions; the same message
//! history with messages appended).
//!
//! It builds the same [`Request`] the serde decode builds, field by field as the declarations read them (the
//! integer forms of `de_u64`, `de_opt_i64` and `de_status_code` included), and gives up on anything else: a
//! repeated or missing field, a wrong type, a number it leaves to serde_json. `parse_line` then decodes the line
//! with serde, which reads it or names its error as it always has.

use super::schema::{
    AnyValue, ArrayValue, KeyValue, KvList, Request, Resource, ResourceSpans, ScopeSpans, Span,
    Status, Str,
};
use crate::scan::{Reject, Scan, list, once, opt};

/// String attributes at least this long are remembered for the next span's attribute of the same key.
const REMEMBER_FROM: usize = 128;

/// The last long string value of each attribute key in this line (keys and values as written).
#[derive(Default)]
struct Previous<'a> {
    strings: Vec<(&'a str, &'a str)>,
}

impl<'a> Previous<'a> {
    fn get(&self, key: &str) -> Option<&'a str> {
        self.strings
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, v)| v)
    }

    fn set(&mut self, key: &'a str, value: &'a str) {
        match self.strings.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.strings.push((key, value)),
        }
    }
}

/// Reads one line, or gives up.
pub(super) fn request(text: &str) -> Result<Request<'_>, Reject> {
    let mut s = Scan::new(text);
    let mut prev = Previous::default();
    let mut resource_spans = None;
    s.object(|s, key| match key {
        "resourceSpans" => {
            let list = list(s, |s| resource_spans_of(s, &mut prev))?;
            once(&mut resource_spans, list)
        }
        _ => s.value().map(drop),
    })?;
    s.end()?;
    Ok(Request {
        resource_spans: resource_spans.ok_or(Reject)?,
    })
}

fn resource_spans_of<'a>(
    s: &mut Scan<'a>,
    prev: &mut Previous<'a>,
) -> Result<ResourceSpans<'a>, Reject> {
    let (mut resource, mut scope_spans) = (None, None);
    s.object(|s, key| match key {
        "resource" => {
            let r = opt(s, |s| {
                let mut attributes = None;
                s.object(|s, key| match key {
                    "attributes" => once(&mut attributes, list(s, |s| key_value(s, prev))?),
                    _ => s.value().map(drop),
                })?;
                Ok(Resource {
                    attributes: attributes.unwrap_or_default(),
                })
            })?;
            once(&mut resource, r)
        }
        "scopeSpans" => {
            let l = list(s, |s| {
                let mut spans = None;
                s.object(|s, key| match key {
                    "spans" => once(&mut spans, list(s, |s| span(s, prev))?),
                    _ => s.value().map(drop),
                })?;
                Ok(ScopeSpans {
                    spans: spans.unwrap_or_default(),
                })
            })?;
            once(&mut scope_spans, l)
        }
        _ => s.value().map(drop),
    })?;
    Ok(ResourceSpans {
        resource: resource.flatten(),
        scope_spans: scope_spans.unwrap_or_default(),
    })
}

fn string<'a>(s: &mut Scan<'a>) -> Result<Str<'a>, Reject> {
    s.quoted_str(None).map(Str)
}

fn span<'a>(s: &mut Scan<'a>, prev: &mut Previous<'a>) -> Result<Span<'a>, Reject> {
    let (mut trace_id, mut span_id, mut parent_span_id, mut name) = (None, None, None, None);
    let (mut start, mut end, mut attributes, mut status) = (None, None, None, None);
    s.object(|s, key| match key {
        "traceId" => once(&mut trace_id, string(s)?),
        "spanId" => once(&mut span_id, string(s)?),
        "parentSpanId" => once(&mut parent_span_id, opt(s, string)?),
        "name" => once(&mut name, string(s)?),
        "startTimeUnixNano" => once(&mut start, time(s)?),
        "endTimeUnixNano" => once(&mut end, time(s)?),
        "attributes" => once(&mut attributes, list(s, |s| key_value(s, prev))?),
        "status" => once(&mut status, opt(s, status_of)?),
        _ => s.value().map(drop),
    })?;
    Ok(Span {
        trace_id: trace_id.ok_or(Reject)?,
        span_id: span_id.ok_or(Reject)?,
        parent_span_id: parent_span_id.flatten(),
        name: name.unwrap_or_default(),
        start_time_unix_nano: start.ok_or(Reject)?,
        end_time_unix_nano: end.unwrap_or_default(),
        attributes: attributes.unwrap_or_default(),
        status: status.flatten(),
    })
}

/// What `IntVisitor` reads: an integer, or a string holding one. Other numbers are left to serde_json.
fn integer(s: &mut Scan<'_>) -> Result<i128, Reject> {
    if s.peek()? == b'"' {
        let text = string(s)?;
        // The usual string: plain digits (times in nanoseconds, token counts), short enough for a `u64`, read
        // without the general parse below, which decodes the string first and works in `i128`.
        let digits = text.raw().as_bytes();
        if (1..=19).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
            let n = digits
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            return Ok(i128::from(n));
        }
        return text.text().trim().parse().map_err(|_| Reject);
    }
    int_literal(s.value()?).ok_or(Reject)
}

/// A JSON number as serde_json hands it to a visitor as an integer: within `u64` or `i64`, and not `-0` (which it
/// reads as the float `-0.0`). Anything else arrives as a float.
fn int_literal(raw: &str) -> Option<i128> {
    if raw == "-0" {
        return None;
    }
    raw.parse::<u64>()
        .map(i128::from)
        .or_else(|_| raw.parse::<i64>().map(i128::from))
        .ok()
}

/// `de_u64`.
fn time(s: &mut Scan<'_>) -> Result<u64, Reject> {
    u64::try_from(integer(s)?).map_err(|_| Reject)
}

fn status_of<'a>(s: &mut Scan<'a>) -> Result<Status<'a>, Reject> {
    let (mut code, mut message) = (None, None);
    s.object(|s, key| match key {
        "code" => {
            // `de_status_code`: an integer (a `u64` cast as it is), or a status name.
            let c = if s.peek()? == b'"' {
                match string(s)?.text().as_ref() {
                    "STATUS_CODE_UNSET" | "UNSET" | "Unset" => 0,
                    "STATUS_CODE_OK" | "OK" | "Ok" => 1,
                    "STATUS_CODE_ERROR" | "ERROR" | "Error" => 2,
                    _ => return Err(Reject),
                }
            } else {
                let v = int_literal(s.value()?).ok_or(Reject)?;
                i64::try_from(v).unwrap_or(v as u64 as i64)
            };
            once(&mut code, c)
        }
        "message" => once(&mut message, opt(s, string)?),
        _ => s.value().map(drop),
    })?;
    Ok(Status {
        code: code.unwrap_or_default(),
        message: message.flatten(),
    })
}

fn key_value<'a>(s: &mut Scan<'a>, prev: &mut Previous<'a>) -> Result<KeyValue<'a>, Reject> {
    if let Some(kv) = s.attempt(|s| compact_key_value(s, prev)) {
        return Ok(kv);
    }
    let (mut key, mut value) = (None, None);
    s.object(|s, k| match k {
        "key" => once(&mut key, string(s)?),
        "value" => {
            let like = key.and_then(|k: Str<'a>| prev.get(k.0));
            let (v, long) = any_value(s, like)?;
            if let (Some(k), Some(long)) = (key, long) {
                prev.set(k.0, long);
            }
            once(&mut value, v)
        }
        _ => s.value().map(drop),
    })?;
    Ok(KeyValue {
        key: key.ok_or(Reject)?,
        value: value.unwrap_or_default(),
    })
}

/// An attribute as OTLP/JSON exporters write nearly all of them, `{"key":"…","value":{"stringValue":"…"}}` (or one
/// of the other scalar values) without whitespace, matched as text rather than read as two objects key by key: a
/// trace has dozens of attributes, and the general path spent more on their framing than on their strings. `None`
/// for any other shape, which [`key_value`] then reads the general way; it builds what that would build.
fn compact_key_value<'a>(s: &mut Scan<'a>, prev: &mut Previous<'a>) -> Option<KeyValue<'a>> {
    s.nests(2)?;
    if !s.exactly(br#"{"key":"#) {
        return None;
    }
    let key = string(s).ok()?;
    if !s.exactly(br#","value":{""#) {
        return None;
    }
    let mut value = AnyValue::default();
    let mut long = None;
    if s.exactly(br#"stringValue":"#) {
        if s.peek().ok()? != b'"' {
            return None;
        }
        let text = s.quoted_str(prev.get(key.0)).ok()?;
        long = Some(text).filter(|t| t.len() >= REMEMBER_FROM);
        value.string_value = Some(Str(text));
    } else if s.exactly(br#"intValue":"#) {
        value.int_value = Some(i64::try_from(integer(s).ok()?).ok()?);
    } else if s.exactly(br#"boolValue":"#) {
        value.bool_value = Some(match s.value().ok()? {
            "true" => true,
            "false" => false,
            _ => return None,
        });
    } else {
        return None;
    }
    if !s.exactly(b"}}") {
        return None;
    }
    if let Some(long) = long {
        prev.set(key.0, long);
    }
    Some(KeyValue { key, value })
}

/// An `AnyValue`, and its string value if it is long enough to remember. `like`: see [`Scan::quoted_str`].
fn any_value<'a>(
    s: &mut Scan<'a>,
    like: Option<&str>,
) -> Result<(AnyValue<'a>, Option<&'a str>), Reject> {
    let mut v = AnyValue::default();
    let mut seen = [false; 7];
    let mut long = None;
    s.object(|s, key| {
        let i = match key {
            "stringValue" => 0,
            "boolValue" => 1,
            "intValue" => 2,
            "doubleValue" => 3,
            "arrayValue" => 4,
            "kvlistValue" => 5,
            "bytesValue" => 6,
            _ => return s.value().map(drop),
        };
        // A derived `Deserialize` rejects a repeated field.
        if std::mem::replace(&mut seen[i], true) {
            return Err(Reject);
        }
        match i {
            0 => {
                v.string_value = opt(s, |s| s.quoted_str(like).map(Str))?;
                long = v
                    .string_value
                    .map(|q| q.0)
                    .filter(|q| q.len() >= REMEMBER_FROM);
            }
            1 => {
                v.bool_value = opt(s, |s| match s.value()? {
                    "true" => Ok(true),
                    "false" => Ok(false),
                    _ => Err(Reject),
                })?
            }
            // `de_opt_i64` reads `null` as an error, like any non-integer.
            2 => v.int_value = Some(i64::try_from(integer(s)?).map_err(|_| Reject)?),
            // serde_json's own float parsing, which differs from Rust's in the last bit for some inputs.
            3 => {
                v.double_value = opt(s, |s| {
                    let raw = s.value()?;
                    if raw.starts_with('"') {
                        return Err(Reject);
                    }
                    serde_json::from_str(raw).map_err(|_| Reject)
                })?
            }
            4 => {
                v.array_value = opt(s, |s| {
                    let mut values = None;
                    s.object(|s, key| match key {
                        "values" => {
                            once(&mut values, list(s, |s| any_value(s, None).map(|v| v.0))?)
                        }
                        _ => s.value().map(drop),
                    })?;
                    Ok(Box::new(ArrayValue {
                        values: values.unwrap_or_default(),
                    }))
                })?
            }
            5 => {
                v.kvlist_value = opt(s, |s| {
                    let mut values = None;
                    let mut nested = Previous::default();
                    s.object(|s, key| match key {
                        "values" => once(&mut values, list(s, |s| key_value(s, &mut nested))?),
                        _ => s.value().map(drop),
                    })?;
                    Ok(Box::new(KvList {
                        values: values.unwrap_or_default(),
                    }))
                })?
            }
            _ => v.bytes_value = opt(s, string)?,
        }
        Ok(())
    })?;
    Ok((v, long))
}

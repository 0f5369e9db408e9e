//! The `otel` format: OTLP/JSON trace requests, one `{"resourceSpans": [...]}` per line as the OpenTelemetry
//! collector's file exporter writes them, with spans following the GenAI semantic conventions.
//!
//! Spans of one trace may arrive on several lines. Lines are decoded in parallel; the [`Assembler`] then groups
//! spans by `traceId` sequentially and hands a trace over for (parallel) assembly as soon as its root span (no
//! `parentSpanId`) arrives. Exporters send a span when it ends and a root ends after its children, so the root is
//! normally the last span of its trace; memory holds only traces still waiting for their root.

use crate::common::{
    add_tools, arguments_owned, cached_tools, chat_msg, content_text, finish, from_json, kind,
    last_answer, rfc3339_from_nanos, score_value, success_value, tool_spec, value_to_text,
};
use crate::{Format, Parsed, RecordError};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use rayon::prelude::*;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use tooltune_core::{Meta, Outcome, Step, Timing, ToolCall, ToolSpec, Trajectory, Usage};

mod fast;

/// Our outcome attributes, set on the root span by whoever judged the run.
pub const OUTCOME_SCORE: &str = "tooltune.outcome.score";
/// See [`OUTCOME_SCORE`].
pub const OUTCOME_SUCCESS: &str = "tooltune.outcome.success";
/// See [`OUTCOME_SCORE`].
pub const OUTCOME_FEEDBACK: &str = "tooltune.outcome.feedback";

/// How many finished trace ids are remembered to recognise spans that arrive after their trace was emitted.
const REMEMBERED_TRACES: usize = 100_000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    #[serde(borrow)]
    resource_spans: Vec<ResourceSpans<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans<'a> {
    #[serde(default, borrow)]
    resource: Option<Resource<'a>>,
    #[serde(default, borrow)]
    scope_spans: Vec<ScopeSpans<'a>>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(default, borrow)]
    attributes: Vec<KeyValue<'a>>,
}

#[derive(Deserialize)]
struct ScopeSpans<'a> {
    #[serde(default, borrow)]
    spans: Vec<Span<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Span<'a> {
    #[serde(borrow)]
    trace_id: Str<'a>,
    #[serde(borrow)]
    span_id: Str<'a>,
    #[serde(default, borrow)]
    parent_span_id: Option<Str<'a>>,
    #[serde(default, borrow)]
    name: Str<'a>,
    #[serde(deserialize_with = "de_u64")]
    start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "de_u64")]
    end_time_unix_nano: u64,
    #[serde(default, borrow)]
    attributes: Vec<KeyValue<'a>>,
    #[serde(default, borrow)]
    status: Option<Status<'a>>,
}

#[derive(Deserialize)]
struct KeyValue<'a> {
    #[serde(borrow)]
    key: Str<'a>,
    #[serde(default, borrow)]
    value: AnyValue<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AnyValue<'a> {
    #[serde(default, borrow)]
    string_value: Option<Str<'a>>,
    #[serde(default)]
    bool_value: Option<bool>,
    #[serde(default, deserialize_with = "de_opt_i64")]
    int_value: Option<i64>,
    #[serde(default)]
    double_value: Option<f64>,
    // Boxed: they are rare, and a span's dozens of attributes are moved around by value; unboxed they made an
    // attribute 136 bytes, whose moves showed in profiles as a twentieth of parsing.
    #[serde(default, borrow)]
    array_value: Option<Box<ArrayValue<'a>>>,
    #[serde(default, borrow)]
    kvlist_value: Option<Box<KvList<'a>>>,
    #[serde(default, borrow)]
    bytes_value: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct ArrayValue<'a> {
    #[serde(default, borrow)]
    values: Vec<AnyValue<'a>>,
}

#[derive(Deserialize)]
struct KvList<'a> {
    #[serde(default, borrow)]
    values: Vec<KeyValue<'a>>,
}

#[derive(Deserialize)]
struct Status<'a> {
    #[serde(default, deserialize_with = "de_status_code")]
    code: i64,
    #[serde(default, borrow)]
    message: Option<Str<'a>>,
}

/// A JSON string as the line writes it, quotes included, its escapes not yet decoded.
///
/// A chat span carries the tool definitions and the whole message history as JSON inside JSON strings, so nearly
/// every character of them is behind an escape; decoding all of that while reading the line, most of it to be
/// thrown away (definitions seen before, history already read on the previous span), was the largest cost of
/// reading OTLP. Decoding waits until a value is used, and comparisons use the text as written.
#[derive(Clone, Copy)]
struct Str<'a>(&'a str);

impl Default for Str<'_> {
    fn default() -> Self {
        Str("\"\"")
    }
}

impl<'a> Str<'a> {
    /// The text between the quotes, escapes as written.
    fn raw(self) -> &'a str {
        &self.0[1..self.0.len() - 1]
    }

    /// The decoded string: borrowed from the line unless it has escapes.
    fn text(self) -> Cow<'a, str> {
        // The string was checked when the line was read, so it decodes; serde_json is left the surrogate escapes.
        crate::scan::checked_text(self.raw())
            .unwrap_or_else(|_| Cow::Owned(serde_json::from_str(self.0).unwrap_or_default()))
    }

    /// Whether the decoded string is `s`, a string without backslashes: written plainly, or escaped (longer).
    fn is(self, s: &str) -> bool {
        let raw = self.raw();
        raw == s
            || (raw.len() > s.len()
                && memchr::memchr(b'\\', raw.as_bytes()).is_some()
                && self.text() == s)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'a RawValue>::deserialize(d)?.get();
        if raw.len() >= 2 && raw.starts_with('"') {
            return Ok(Str(raw));
        }
        // The same complaint serde would make about a `String` field.
        let found = match raw.as_bytes().first() {
            Some(b't') => de::Unexpected::Bool(true),
            Some(b'f') => de::Unexpected::Bool(false),
            Some(b'n') => de::Unexpected::Unit,
            Some(b'[') => de::Unexpected::Seq,
            Some(b'{') => de::Unexpected::Map,
            _ => match (raw.parse::<u64>(), raw.parse::<i64>(), raw.parse::<f64>()) {
                (Ok(u), _, _) => de::Unexpected::Unsigned(u),
                (_, Ok(i), _) => de::Unexpected::Signed(i),
                (_, _, Ok(f)) => de::Unexpected::Float(f),
                _ => de::Unexpected::Other("a value"),
            },
        };
        Err(de::Error::invalid_type(found, &"a string"))
    }
}

/// OTLP/JSON writes 64-bit integers as strings (the protobuf JSON mapping); some producers write numbers.
struct IntVisitor;

impl Visitor<'_> for IntVisitor {
    type Value = i128;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an integer or a string holding one")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        Ok(v.into())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        Ok(v.into())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
        v.trim()
            .parse()
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

fn de_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = d.deserialize_any(IntVisitor)?;
    u64::try_from(v)
        .map_err(|_| de::Error::custom(format!("{v} is not a valid unsigned 64-bit time")))
}

fn de_opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let v = d.deserialize_any(IntVisitor)?;
    i64::try_from(v)
        .map(Some)
        .map_err(|_| de::Error::custom(format!("{v} does not fit a 64-bit integer")))
}

/// `status.code` as the integer of the JSON mapping, or as the enum name some producers write.
fn de_status_code<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    struct CodeVisitor;
    impl Visitor<'_> for CodeVisitor {
        type Value = i64;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a status code (0, 1, 2 or STATUS_CODE_UNSET/OK/ERROR)")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            Ok(v as i64)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
            match v {
                "STATUS_CODE_UNSET" | "UNSET" | "Unset" => Ok(0),
                "STATUS_CODE_OK" | "OK" | "Ok" => Ok(1),
                "STATUS_CODE_ERROR" | "ERROR" | "Error" => Ok(2),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }
    d.deserialize_any(CodeVisitor)
}

impl AnyValue<'_> {
    fn to_json(&self) -> Value {
        if let Some(s) = self.string_value {
            Value::String(s.text().into_owned())
        } else if let Some(b) = self.bool_value {
            Value::Bool(b)
        } else if let Some(i) = self.int_value {
            Value::from(i)
        } else if let Some(d) = self.double_value {
            Value::from(d)
        } else if let Some(a) = &self.array_value {
            Value::Array(a.values.iter().map(AnyValue::to_json).collect())
        } else if let Some(kv) = &self.kvlist_value {
            Value::Object(
                kv.values
                    .iter()
                    .map(|e| (e.key.text().into_owned(), e.value.to_json()))
                    .collect(),
            )
        } else if let Some(b) = self.bytes_value {
            Value::String(b.text().into_owned())
        } else {
            Value::Null
        }
    }
}

/// One decoded span with where it came from; it borrows the text of its line.
struct SpanRec<'a> {
    span: Span<'a>,
    line: u64,
    /// Indices of the span in its line: resourceSpans, scopeSpans, spans.
    at: (usize, usize, usize),
    service: Option<Str<'a>>,
    /// Whether an attribute key has an escape: when none has (nearly always), a key is found by comparing the text
    /// as written, without looking for escapes again on every lookup.
    escaped_keys: bool,
}

impl<'a> SpanRec<'a> {
    fn path(&self) -> String {
        let (r, s, p) = self.at;
        format!("resourceSpans[{r}].scopeSpans[{s}].spans[{p}]")
    }

    fn is_root(&self) -> bool {
        self.span.parent_span_id.is_none_or(|p| p.raw().is_empty())
    }

    fn attr(&self, key: &str) -> Option<(usize, &AnyValue<'a>)> {
        let mut attrs = self.span.attributes.iter().enumerate();
        let found = if self.escaped_keys {
            attrs.find(|(_, kv)| kv.key.is(key))
        } else {
            attrs.find(|(_, kv)| kv.key.raw() == key)
        };
        found.map(|(i, kv)| (i, &kv.value))
    }

    fn attr_str(&self, key: &str) -> Option<Cow<'a, str>> {
        self.attr(key)
            .and_then(|(_, v)| v.string_value.map(Str::text))
    }

    fn attr_u64(&self, key: &str) -> Option<u64> {
        self.attr(key).and_then(|(_, v)| {
            v.int_value
                .and_then(|i| u64::try_from(i).ok())
                .or_else(|| v.double_value.map(|d| d as u64))
                .or_else(|| v.string_value.and_then(|s| s.text().parse().ok()))
        })
    }

    /// A structured ("any") attribute: recorded structured (kvlist/array) or, as the conventions allow on spans,
    /// as a JSON string.
    fn attr_json(&self, key: &str) -> Result<Option<Value>, RecordError> {
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

    fn op(&self) -> Cow<'a, str> {
        self.attr_str("gen_ai.operation.name").unwrap_or_default()
    }

    fn is_inference(&self) -> bool {
        matches!(
            self.op().as_ref(),
            "chat" | "generate_content" | "text_completion"
        )
    }

    fn timing(&self) -> Timing {
        let s = &self.span;
        Timing {
            started_at: rfc3339_from_nanos(s.start_time_unix_nano),
            duration_ms: (s.end_time_unix_nano >= s.start_time_unix_nano
                && s.end_time_unix_nano > 0)
                .then(|| (s.end_time_unix_nano - s.start_time_unix_nano) as f64 / 1e6),
        }
    }

    fn error(&self, path_suffix: &str, message: impl std::fmt::Display) -> RecordError {
        RecordError::at(
            self.line,
            format!("{}{path_suffix}", self.path()),
            format!("span {}: {message}", self.span.span_id.text()),
        )
    }
}

/// Decodes one line into its spans, borrowing from its text.
fn parse_line(text: &str, line: u64) -> Result<Vec<SpanRec<'_>>, RecordError> {
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

/// What one line holds, per trace: decoded in parallel with other lines, before the [`Assembler`] sees it.
pub(crate) struct LineOut<T> {
    line: u64,
    /// Where the line's text lies in its chunk, for when spans must wait for a later line.
    range: Range<usize>,
    result: Result<Vec<LineTrace<T>>, RecordError>,
}

impl<T> LineOut<T> {
    /// The record's errors (and those of the traces built from it alone) with its place in a document, an array
    /// or a page added.
    pub(crate) fn placed(mut self, place: crate::shape::Place) -> Self {
        match &mut self.result {
            Err(e) => *e = place.apply(std::mem::replace(e, RecordError::new(0, None, ""))),
            Ok(traces) => {
                for t in traces {
                    if let Some(Err(e)) = &mut t.built {
                        *e = place.apply(std::mem::replace(e, RecordError::new(0, None, "")));
                    }
                }
            }
        }
        self
    }
}

/// The spans of one trace in one line.
struct LineTrace<T> {
    trace_id: String,
    /// Where the trace's first root span is among the line's spans, if the line has one.
    root_at: Option<usize>,
    /// When the line holds the root, the trace built from this line's spans alone (and mapped): what the trace
    /// is unless an earlier line held some of its spans, which only the [`Assembler`] knows. Collectors batch
    /// whole traces, so this is nearly always the answer, and it was computed in parallel.
    built: Option<Result<T, RecordError>>,
}

/// Decodes one line and builds the traces whose root it holds (see [`LineTrace::built`]).
pub(crate) fn read_line<T>(
    text: Result<&str, RecordError>,
    line: u64,
    range: Range<usize>,
    map: &(impl Fn(Trajectory) -> T + Sync),
) -> LineOut<T> {
    let result = text.and_then(|text| parse_line(text, line)).map(|spans| {
        // Group by trace in order of first appearance; a line usually holds one trace, a batch many.
        let mut index: HashMap<Cow<'_, str>, usize> = HashMap::new();
        let mut groups: Vec<(Cow<'_, str>, Option<usize>, Vec<SpanRec<'_>>)> = Vec::new();
        for (n, s) in spans.into_iter().enumerate() {
            let tid = s.span.trace_id.text();
            let g = match index.get(&tid) {
                Some(&g) => g,
                None => {
                    index.insert(tid.clone(), groups.len());
                    groups.push((tid, None, Vec::new()));
                    groups.len() - 1
                }
            };
            let group = &mut groups[g];
            if group.1.is_none() && s.is_root() {
                group.1 = Some(n);
            }
            group.2.push(s);
        }
        groups
            .into_iter()
            .map(|(tid, root_at, spans)| {
                let built = root_at.map(|_| {
                    build(&tid, spans, true, line)
                        .and_then(|t| finish(Format::Otel, t, line))
                        .map(map)
                });
                LineTrace {
                    trace_id: tid.into_owned(),
                    root_at,
                    built,
                }
            })
            .collect()
    });
    LineOut {
        line,
        range,
        result,
    }
}

/// A line that holds spans of a trace still waiting for its root: its text, shared by the traces it holds.
#[derive(Clone)]
struct Piece {
    line: u64,
    text: Arc<str>,
}

struct Pending {
    first_line: u64,
    seq: u64,
    pieces: Vec<Piece>,
}

enum Slot<T> {
    Ready(Parsed<T>),
    Build {
        line: u64,
        trace_id: String,
        pieces: Vec<Piece>,
        complete: bool,
    },
}

/// Groups spans by trace across lines and emits each trace once its root span has arrived.
///
/// A trace whose spans all came in the line of its root was built in parallel with the line's decoding and passes
/// through. A trace spread over lines keeps the text of each of its lines until the root arrives, and is built
/// again from those lines then; memory holds those lines, for traces still waiting for their root.
#[derive(Default)]
pub(crate) struct Assembler {
    pending: HashMap<String, Pending>,
    seq: u64,
    done: HashSet<String>,
    done_order: VecDeque<String>,
}

impl Assembler {
    fn remember(&mut self, trace_id: String) {
        if self.done_order.len() >= REMEMBERED_TRACES
            && let Some(old) = self.done_order.pop_front()
        {
            self.done.remove(&old);
        }
        self.done.insert(trace_id.clone());
        self.done_order.push_back(trace_id);
    }

    /// How many traces are waiting for their root span.
    pub(crate) fn pending_traces(&self) -> usize {
        self.pending.len()
    }

    /// Takes one chunk's decoded lines in file order (`data` is the chunk's text, which their ranges point into);
    /// at EOF also flushes traces that never got a root.
    pub(crate) fn process<T: Send>(
        &mut self,
        lines: Vec<LineOut<T>>,
        data: &[u8],
        at_eof: bool,
        map: &(impl Fn(Trajectory) -> T + Sync),
    ) -> Vec<Parsed<T>> {
        let mut slots: Vec<Slot<T>> = Vec::new();
        for out in lines {
            let line = out.line;
            let traces = match out.result {
                Ok(traces) => traces,
                Err(e) => {
                    slots.push(Slot::Ready(Parsed {
                        line,
                        result: Err(e),
                    }));
                    continue;
                }
            };
            // The line's text, copied once if some trace of it has to wait.
            let mut piece: Option<Piece> = None;
            let mut piece_of = || -> Piece {
                piece
                    .get_or_insert_with(|| Piece {
                        line,
                        text: Arc::from(String::from_utf8_lossy(&data[out.range.clone()])),
                    })
                    .clone()
            };
            let mut late: Vec<String> = Vec::new();
            let mut completed: Vec<(usize, Slot<T>)> = Vec::new();
            for t in traces {
                if self.done.contains(&t.trace_id) {
                    late.push(t.trace_id);
                    continue;
                }
                if let Some(p) = self.pending.get_mut(&t.trace_id) {
                    p.pieces.push(piece_of());
                    if let Some(root_at) = t.root_at
                        && let Some(p) = self.pending.remove(&t.trace_id)
                    {
                        self.remember(t.trace_id.clone());
                        completed.push((
                            root_at,
                            Slot::Build {
                                line,
                                trace_id: t.trace_id,
                                pieces: p.pieces,
                                complete: true,
                            },
                        ));
                    }
                    continue;
                }
                match (t.root_at, t.built) {
                    (Some(root_at), Some(result)) => {
                        self.remember(t.trace_id);
                        completed.push((root_at, Slot::Ready(Parsed { line, result })));
                    }
                    _ => {
                        self.seq += 1;
                        let pending = Pending {
                            first_line: line,
                            seq: self.seq,
                            pieces: vec![piece_of()],
                        };
                        self.pending.insert(t.trace_id, pending);
                    }
                }
            }
            for tid in late {
                slots.push(Slot::Ready(Parsed {
                    line,
                    result: Err(RecordError::new(
                        line,
                        None,
                        format!(
                            "spans of trace {tid} arrived after its root span completed the trace; they are ignored"
                        ),
                    )),
                }));
            }
            // Traces complete in the order their roots came.
            completed.sort_by_key(|&(root_at, _)| root_at);
            slots.extend(completed.into_iter().map(|(_, slot)| slot));
        }
        if at_eof {
            let mut rest: Vec<(String, Pending)> = self.pending.drain().collect();
            rest.sort_by_key(|(_, p)| p.seq);
            for (tid, p) in rest {
                slots.push(Slot::Build {
                    line: p.first_line,
                    trace_id: tid,
                    pieces: p.pieces,
                    complete: false,
                });
            }
        }
        slots
            .into_par_iter()
            .map(|slot| match slot {
                Slot::Ready(p) => p,
                Slot::Build {
                    line,
                    trace_id,
                    pieces,
                    complete,
                } => Parsed {
                    line,
                    result: rebuild(&trace_id, &pieces, complete, line)
                        .and_then(|t| finish(Format::Otel, t, line))
                        .map(map),
                },
            })
            .collect()
    }
}

/// Builds a trace from the lines that hold its spans, decoding them again.
fn rebuild(
    trace_id: &str,
    pieces: &[Piece],
    complete: bool,
    line: u64,
) -> Result<Trajectory, RecordError> {
    let mut spans = Vec::new();
    for p in pieces {
        spans.extend(
            parse_line(&p.text, p.line)?
                .into_iter()
                .filter(|s| s.span.trace_id.is(trace_id)),
        );
    }
    build(trace_id, spans, complete, line)
}

/// One message of `gen_ai.input.messages` / `gen_ai.output.messages` (parts), or an OpenAI-style message (content)
/// as older instrumentations wrote it.
struct OMsg {
    role: String,
    text: Option<String>,
    calls: Vec<ToolCall>,
    /// Tool results sent back to the model: call id and text.
    responses: Vec<(Option<String>, String)>,
}

/// A message as `gen_ai.*.messages` holds it, decoded without building a JSON map per message and part (these
/// attributes carry the whole history on every chat span, so they dominate the cost of reading OTLP).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct LiteMsg {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    parts: Option<Vec<LitePart>>,
    /// OpenAI-style fields, as older instrumentations wrote messages.
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct LitePart {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
    /// One example in the conventions names the response field `result`.
    #[serde(default)]
    result: Option<Value>,
}

/// A messages text as `Vec<LiteMsg>` (serde_json names any error). A scanner pass here, which skipped the payloads a
/// history does not need, was removed: taking it out changed a 100k-trace ingest by less than its noise.
fn decode_messages(text: &str) -> serde_json::Result<Vec<LiteMsg>> {
    serde_json::from_str(text)
}

/// One message of a messages text, as [`decode_messages`] reads each.
fn decode_message(text: &str) -> serde_json::Result<LiteMsg> {
    serde_json::from_str(text)
}

/// Decodes a messages attribute (`gen_ai.input.messages`, `gen_ai.output.messages`), recorded as a JSON string or
/// structured. `None` when the span does not have it.
fn messages(rec: &SpanRec, key: &str) -> Result<Option<Vec<OMsg>>, RecordError> {
    let Some((i, v)) = rec.attr(key) else {
        return Ok(None);
    };
    let lite: Vec<LiteMsg> = match v.string_value {
        Some(s) => decode_messages(&s.text()).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Data => "does not follow the messages schema",
                _ => "is not valid JSON",
            };
            rec.error(
                &format!(".attributes[{i}].value.stringValue"),
                format!("`{key}` {what}: {}", crate::common::json_message(&e)),
            )
        })?,
        None => Vec::<LiteMsg>::deserialize(&v.to_json()).map_err(|e| {
            rec.error(
                &format!(".attributes[{i}].value"),
                format!("`{key}` does not follow the messages schema: {e}"),
            )
        })?,
    };
    let mut out = Vec::with_capacity(lite.len());
    for (n, m) in lite.into_iter().enumerate() {
        out.push(omsg(rec, key, i, n, m)?);
    }
    Ok(Some(out))
}

/// Converts one decoded message; `i` is the attribute's index and `n` the message's, for errors.
fn omsg(rec: &SpanRec, key: &str, i: usize, n: usize, m: LiteMsg) -> Result<OMsg, RecordError> {
    let role = m.role.unwrap_or_else(|| "assistant".to_string());
    if let Some(parts) = m.parts {
        let mut texts: Vec<String> = Vec::new();
        let mut calls = Vec::new();
        let mut responses = Vec::new();
        for p in parts {
            match p.kind.as_deref() {
                Some("text") => {
                    if let Some(Value::String(t)) = p.content {
                        texts.push(t);
                    }
                }
                Some("tool_call") => {
                    let Some(name) = p.name else {
                        return Err(rec.error(
                            &format!(".attributes[{i}]"),
                            format!("`{key}`[{n}]: a tool_call part has no name"),
                        ));
                    };
                    calls.push(ToolCall {
                        id: p.id,
                        name,
                        arguments: arguments_owned(p.arguments),
                    });
                }
                Some("tool_call_response") => responses.push((
                    p.id,
                    value_to_text(&p.response.or(p.result).unwrap_or(Value::Null)),
                )),
                _ => {}
            }
        }
        Ok(OMsg {
            role,
            text: (!texts.is_empty()).then(|| texts.join("\n")),
            calls,
            responses,
        })
    } else {
        let mut o = serde_json::Map::new();
        o.insert("role".into(), Value::String(role));
        o.insert("content".into(), m.content.unwrap_or(Value::Null));
        o.insert("tool_calls".into(), m.tool_calls.unwrap_or(Value::Null));
        let msg = chat_msg(&Value::Object(o), "assistant").map_err(|(_, e)| {
            rec.error(&format!(".attributes[{i}]"), format!("`{key}`[{n}]: {e}"))
        })?;
        let responses = if msg.role == "tool" {
            vec![(m.tool_call_id, msg.text.clone().unwrap_or_default())]
        } else {
            Vec::new()
        };
        Ok(OMsg {
            role: msg.role,
            text: if responses.is_empty() { msg.text } else { None },
            calls: msg.tool_calls,
            responses,
        })
    }
}

/// The input messages of one trace's chat spans. Every chat span repeats the history before it, so the messages
/// it shares with the previous span's input are not decoded again (equal text decodes to the same message);
/// without this a trace of n turns decodes O(n^2) messages.
struct History<'a> {
    decoded: Vec<OMsg>,
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
    fn new() -> Self {
        History {
            decoded: Vec::new(),
            previous: None,
            previous_text: None,
        }
    }

    /// The messages of attribute `key` on `rec`, as indices into `decoded`; `None` when the span does not have it.
    fn of(&mut self, rec: &SpanRec<'a>, key: &str) -> Result<Option<Vec<usize>>, RecordError> {
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

fn build<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a decoded line says, as text, to compare two decodes.
    fn outline(r: &Request) -> String {
        fn value(v: &AnyValue) -> String {
            format!(
                "{:?}/{:?}/{:?}/{:?}/{:?}/{:?}/{:?}",
                v.string_value.map(|s| s.0),
                v.bool_value,
                v.int_value,
                v.double_value,
                v.array_value
                    .as_ref()
                    .map(|a| a.values.iter().map(value).collect::<Vec<_>>()),
                v.kvlist_value.as_ref().map(|k| k
                    .values
                    .iter()
                    .map(|e| (e.key.0, value(&e.value)))
                    .collect::<Vec<_>>()),
                v.bytes_value.map(|s| s.0),
            )
        }
        fn attrs(a: &[KeyValue]) -> String {
            format!(
                "{:?}",
                a.iter()
                    .map(|e| (e.key.0, value(&e.value)))
                    .collect::<Vec<_>>()
            )
        }
        let mut out = String::new();
        for rs in &r.resource_spans {
            out += &format!("{:?}\n", rs.resource.as_ref().map(|r| attrs(&r.attributes)));
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out += &format!(
                        "{} {} {:?} {} {} {} {:?} {:?}\n",
                        s.trace_id.0,
                        s.span_id.0,
                        s.parent_span_id.map(|p| p.0),
                        s.name.0,
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                        attrs(&s.attributes),
                        s.status
                            .as_ref()
                            .map(|st| (st.code, st.message.map(|m| m.0))),
                    );
                }
            }
        }
        out
    }

    /// The scanner must read what real exports hold (else every line pays for a pass that gives up) and build what
    /// the serde decode builds.
    #[test]
    fn the_scanner_reads_the_fixtures_and_samples_as_the_serde_decode_does() {
        let lines = include_str!("../tests/fixtures/otel.jsonl")
            .lines()
            .chain(include_str!("../samples/otel.jsonl").lines())
            .filter(|l| !l.trim().is_empty());
        let mut n = 0;
        for (i, line) in lines.enumerate() {
            let fast =
                fast::request(line).unwrap_or_else(|_| panic!("the scanner gave up on line {i}"));
            let serde: Request = serde_json::from_str(line).expect("valid");
            assert_eq!(outline(&fast), outline(&serde), "line {i}");
            n += 1;
        }
        assert!(n >= 10, "{n}");
    }

    /// Attributes written the way exporters write them (matched as text) and every other way serde reads them
    /// (read key by key) build the same values, and shapes serde rejects are given up on.
    #[test]
    fn attributes_in_every_shape_read_as_serde_reads_them() {
        let long = format!("\\\"{}\\\"", "x".repeat(200));
        let attrs = [
            r#"{"key":"a","value":{"stringValue":"chat"}}"#.to_string(),
            r#"{"key":"a","value":{"stringValue":"with \"escapes\" \u00e9"}}"#.to_string(),
            format!(r#"{{"key":"m","value":{{"stringValue":"[{long}]"}}}}"#),
            format!(r#"{{"key":"m","value":{{"stringValue":"[{long},{long}]"}}}}"#),
            r#"{"key":"n","value":{"intValue":"443"}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":-7}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":"0007"}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":"9223372036854775807"}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":" 12 "}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":"+5"}}"#.to_string(),
            r#"{"key":"n","value":{"intValue":"-5"}}"#.to_string(),
            r#"{"key":"b","value":{"boolValue":true}}"#.to_string(),
            r#"{"key":"b","value":{"boolValue":false}}"#.to_string(),
            r#"{"key":"d","value":{"doubleValue":0.25}}"#.to_string(),
            r#"{"key":"s","value":{"stringValue":null}}"#.to_string(),
            r#"{"key":"b","value":{"boolValue":null}}"#.to_string(),
            r#"{ "key" : "w" , "value" : { "stringValue" : "spaced" } }"#.to_string(),
            r#"{"value":{"stringValue":"first"},"key":"v"}"#.to_string(),
            r#"{"key":"e","value":{}}"#.to_string(),
            r#"{"key":"e"}"#.to_string(),
            r#"{"key":"x","value":{"stringValue":"a","other":1}}"#.to_string(),
            r#"{"key":"x","value":{"stringValue":"a"},"other":[1]}"#.to_string(),
            r#"{"key":"k\u0065y","value":{"stringValue":"escaped key"}}"#.to_string(),
            r#"{"key":"arr","value":{"arrayValue":{"values":[{"stringValue":"a"},{"intValue":"1"}]}}}"#.to_string(),
            r#"{"key":"kv","value":{"kvlistValue":{"values":[{"key":"in","value":{"boolValue":true}}]}}}"#
                .to_string(),
        ];
        let line = |attrs: &str| {
            format!(
                r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"t","spanId":"s","startTimeUnixNano":"1","attributes":[{attrs}]}}]}}]}}]}}"#
            )
        };
        let all = line(&attrs.join(","));
        let serde: Request = serde_json::from_str(&all).expect("valid");
        let fast = fast::request(&all).unwrap_or_else(|_| panic!("the scanner gave up"));
        assert_eq!(outline(&fast), outline(&serde));
        for a in &attrs {
            let one = line(a);
            let serde: Request = serde_json::from_str(&one).expect("valid");
            let fast = fast::request(&one).unwrap_or_else(|_| panic!("the scanner gave up on {a}"));
            assert_eq!(outline(&fast), outline(&serde), "{a}");
        }
        for bad in [
            r#"{"key":"n","value":{"intValue":"x"}}"#,
            r#"{"key":"n","value":{"intValue":1.5}}"#,
            r#"{"key":"n","value":{"intValue":"9223372036854775808"}}"#,
            r#"{"key":"n","value":{"intValue":"99999999999999999999"}}"#,
            r#"{"key":"n","value":{"intValue":""}}"#,
            r#"{"key":"b","value":{"boolValue":"true"}}"#,
            r#"{"key":"s","value":{"stringValue":5}}"#,
            r#"{"key":"s","value":{"stringValue":"a","stringValue":"b"}}"#,
            r#"{"key":5,"value":{"stringValue":"a"}}"#,
            r#"{"key":"s","value":{"stringValue":"a"}"#,
        ] {
            let l = line(bad);
            assert!(fast::request(&l).is_err(), "{bad}");
            assert!(serde_json::from_str::<Request>(&l).is_err(), "{bad}");
        }
    }

    /// The fast path's contract, checked differentially on every fixture and sample line, whole and damaged at
    /// random: the scanner either gives up or decodes exactly what serde decodes from the same text (never looser).
    mod differential {
        use super::*;
        use crate::mutate::{differential, lines};
        use proptest::prelude::*;

        #[test]
        fn the_scanner_gives_up_or_decodes_what_serde_decodes() {
            let (compared, tried) = differential(
                &lines(&[
                    include_str!("../tests/fixtures/otel.jsonl"),
                    include_str!("../samples/otel.jsonl"),
                ]),
                1000,
                |text| {
                    let Ok(fast) = fast::request(text) else {
                        return Ok(false);
                    };
                    let serde = serde_json::from_str::<Request>(text);
                    prop_assert!(
                        serde.is_ok(),
                        "the scanner read what serde rejects: {}",
                        text
                    );
                    prop_assert_eq!(outline(&fast), outline(&serde.expect("checked")));
                    Ok(true)
                },
            );
            assert!(
                compared * 5 >= tried,
                "the scanner read only {compared} of {tried} damaged records"
            );
        }
    }
}

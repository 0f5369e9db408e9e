//! The `langfuse` format: one trace object per line as Langfuse's public API returns it
//! (`GET /api/public/traces/{id}`), with `observations` (a flat list) and `scores` embedded.
//!
//! GENERATION observations are model turns (their input holds the OpenAI-style request the SDK integrations log,
//! their output the assistant message); TOOL observations, and SPANs named after a listed tool, are tool results.

use crate::common::{
    ChatMsg, add_tools, cached_tools, chat_msg, content_text, finish, from_json, json_message,
    last_answer, ms_between, time_key, tool_spec, value_to_text,
};
use crate::{Format, RecordError};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use tooltune_core::{Meta, Outcome, Step, Timing, ToolSpec, Trajectory, Usage};

mod fast;

// The first pass allocates little: strings borrow from the line when they hold no escapes ([`Text`]), and of the
// free-form values (outputs, metadata, usage) only what `convert` reads is built. Building them all as `Value`s
// (an ordered map and a `String` per key) and `String`s was most of the first pass's cost, and most of them
// (metadata, usage totals and units, AGENT outputs) are never read.

/// The scalar visitor methods of a visitor that takes any scalar as `$v` (and, with `str`, any string too): the
/// visitors below read only some shapes of a free-form value and treat the others as absent.
macro_rules! scalars_give {
    ($v:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
    ($v:expr, str) => {
        scalars_give!($v);
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trace<'a> {
    id: String,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default, borrow)]
    input: Option<StrOnly<'a>>,
    #[serde(default, borrow)]
    output: Option<StrOnly<'a>>,
    #[serde(default)]
    metadata: Option<ToolsOf>,
    #[serde(default, borrow)]
    observations: Vec<Observation<'a>>,
    #[serde(default, borrow)]
    scores: Vec<Score<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Observation<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    start_time: Cow<'a, str>,
    #[serde(default, borrow)]
    end_time: Option<Text<'a>>,
    /// Only a GENERATION's input is used (the messages sent); see [`RawInput`].
    #[serde(default, borrow)]
    input: RawInput<'a>,
    #[serde(default, borrow)]
    output: Option<Output<'a>>,
    #[serde(default)]
    metadata: Option<ToolsOf>,
    #[serde(default, borrow)]
    model: Option<Text<'a>>,
    #[serde(default)]
    usage: Option<Counts>,
    #[serde(default)]
    usage_details: Option<Counts>,
    #[serde(default, borrow)]
    level: Option<Text<'a>>,
    #[serde(default, borrow)]
    status_message: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Score<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default, borrow)]
    string_value: Option<Text<'a>>,
    #[serde(default, borrow)]
    data_type: Option<Text<'a>>,
    #[serde(default, borrow)]
    comment: Option<Text<'a>>,
    #[serde(default, borrow)]
    observation_id: Option<Text<'a>>,
}

/// Parses and validates one Langfuse trace.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    // Three passes, each only for what the one before gave up on: the scanner (fast.rs), the lean serde pass, and
    // the full decode with the declared types and path tracking, which names an error exactly as it always has.
    // Each pass fails on every record the next one fails on (and, conservatively, on a few odd ones it cannot
    // judge), so a record reads the same whichever pass reads it.
    let trace: Trace = match fast::trace(text) {
        Ok(trace) => trace,
        Err(_) => match serde_json::from_str(text) {
            Ok(trace) => trace,
            Err(_) => strict(|| from_json(text, line))?,
        },
    };
    let t = convert(trace, line)?;
    finish(Format::Langfuse, t, line)
}

thread_local! {
    /// Whether [`Output`], [`StrOnly`], [`ToolsOf`] and [`Counts`] decode their field as a `Value` (or map), as
    /// the data model declares it, instead of picking out what `convert` uses: set while a record that failed the
    /// lean pass is decoded again, to report its error as the declared types do (and, for the odd record only
    /// the lean pass rejects, to read it).
    static STRICT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with [`STRICT`] set.
fn strict<T>(f: impl FnOnce() -> T) -> T {
    STRICT.set(true);
    let out = f();
    STRICT.set(false);
    out
}

/// A string field that borrows from the line unless it holds escapes. (`Option<Cow<str>>` would always copy: serde
/// borrows only a bare `Cow` field.) Rejects what a `String` rejects, with the same message.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

// The types below stand for fields the data model declares as `Option<Value>` (or, for usage, a map) and keep
// only what `convert` reads. They accept and reject exactly what those declarations did: the parts they drop are
// walked with the same parser calls a `Value` decode makes ([`Checked`]), inside the record's deserializer, so
// escapes, number ranges and the nesting limit are checked as before. The one case [`Checked`] cannot judge
// (serde_json's private raw-value key, which a `Value` decode treats specially) fails the lean pass, and
// [`STRICT`] then decodes these fields as `Value`s.

/// An observation's `output`: a string is borrowed; anything else is a `Value`, or (read by the scanner, which
/// checked it) its text, decoded when it is used.
enum Output<'a> {
    Str(Cow<'a, str>),
    Other(Value),
    Raw(&'a str),
}

impl<'de: 'a, 'a> Deserialize<'de> for Output<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if STRICT.get() {
            return Ok(match Value::deserialize(d)? {
                Value::String(s) => Output::Str(Cow::Owned(s)),
                v => Output::Other(v),
            });
        }
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Output<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Output::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Output::Str(Cow::Owned(v.to_string())))
            }
            // The rest builds what `Value`'s own visitor builds.
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Output::Other(Value::Bool(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Output::Other(Value::Number(v.into())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Output::Other(Value::Number(v.into())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Output::Other(
                    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
                ))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Output::Other(Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Value>()? {
                    items.push(item);
                }
                Ok(Output::Other(Value::Array(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut values = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key.starts_with(PRIVATE) {
                        return Err(de::Error::custom("serde_json's private key"));
                    }
                    values.insert(key, map.next_value()?);
                }
                Ok(Output::Other(Value::Object(values)))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl Output<'_> {
    /// As [`value_to_text`] has it.
    fn text(&self) -> Result<String, serde_json::Error> {
        Ok(match self {
            Output::Str(s) => s.to_string(),
            Output::Other(v) => value_to_text(v),
            Output::Raw(raw) => value_to_text(&serde_json::from_str(raw)?),
        })
    }
}

/// The trace's `input` or `output`: only a string is used.
struct StrOnly<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for StrOnly<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if STRICT.get() {
            return Ok(StrOnly(match Value::deserialize(d)? {
                Value::String(s) => Some(Cow::Owned(s)),
                _ => None,
            }));
        }
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = StrOnly<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(StrOnly(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StrOnly(Some(Cow::Owned(v.to_string()))))
            }
            scalars_give!(StrOnly(None));
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Checked.visit_seq(seq).map(|()| StrOnly(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Checked.visit_map(map).map(|()| StrOnly(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A `metadata` value: only its `tools` entry is used.
struct ToolsOf(Option<Value>);

impl<'de> Deserialize<'de> for ToolsOf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if STRICT.get() {
            return Ok(ToolsOf(Value::deserialize(d)?.get("tools").cloned()));
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ToolsOf;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            scalars_give!(ToolsOf(None), str);
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Checked.visit_seq(seq).map(|()| ToolsOf(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // A map keeps the last of repeated keys.
                let mut tools = None;
                while let Some(key) = map.next_key_seed(Key)? {
                    if key == KeyName::Tools {
                        tools = Some(map.next_value()?);
                    } else {
                        map.next_value_seed(Checked)?;
                    }
                }
                Ok(ToolsOf(tools))
            }
        }
        d.deserialize_any(V)
    }
}

/// `usage` or `usageDetails`: a JSON object (anything else is an error) of which only the `input` and `output`
/// counts are used.
struct Counts {
    input: Option<Value>,
    output: Option<Value>,
}

impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if STRICT.get() {
            let m = Map::deserialize(d)?;
            return Ok(Counts {
                input: m.get("input").cloned(),
                output: m.get("output").cloned(),
            });
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Counts;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // A map keeps the last of repeated keys.
                let (mut input, mut output) = (None, None);
                while let Some(key) = map.next_key_seed(Key)? {
                    match key {
                        KeyName::Input => input = Some(map.next_value()?),
                        KeyName::Output => output = Some(map.next_value()?),
                        _ => map.next_value_seed(Checked)?,
                    }
                }
                Ok(Counts { input, output })
            }
        }
        d.deserialize_map(V)
    }
}

/// See [`Checked`].
const PRIVATE: &str = "$serde_json::private::";

/// Walks a JSON value the way decoding it into a `Value` would, keeping nothing and allocating nothing; fails on
/// serde_json's private keys (see the comment above [`Output`]).
struct Checked;

impl<'de> DeserializeSeed<'de> for Checked {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    scalars_give!((), str);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Checked)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Key)?.is_some() {
            map.next_value_seed(Checked)?;
        }
        Ok(())
    }
}

/// The map keys the types above look for.
#[derive(PartialEq)]
enum KeyName {
    Input,
    Output,
    Tools,
    Other,
}

/// A map key, read as a `Value` decode reads it (unescaped and checked), failing on serde_json's private keys.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = KeyName;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<KeyName, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = KeyName;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyName, E> {
        Ok(match v {
            "input" => KeyName::Input,
            "output" => KeyName::Output,
            "tools" => KeyName::Tools,
            _ if v.starts_with(PRIVATE) => return Err(E::custom("serde_json's private key")),
            _ => KeyName::Other,
        })
    }
}

/// An observation's input, split in the same pass that reads the trace: a GENERATION's input repeats the whole
/// history and the tool list on every turn, so its messages and tools are kept as raw JSON and decoded later, each
/// distinct one once (see [`GenInputs`]).
#[derive(Default)]
enum RawInput<'a> {
    /// A message list: a bare array, or the `messages` of `{tools, messages}` (what the OpenAI integration logs
    /// when tools were passed).
    Request {
        messages: Vec<&'a str>,
        /// `tools` and `functions`, when they are arrays.
        tools: Vec<&'a str>,
        /// Whether the messages were the `messages` field of an object (for error paths).
        in_object: bool,
    },
    /// A plain prompt string.
    Prompt(String),
    /// Anything else (null, a number, an object without messages): no messages.
    #[default]
    Other,
}

impl<'a> RawInput<'a> {
    /// The input an object gives: its `messages` (when an array) and its tool lists.
    fn of_object(messages: Option<Vec<&'a str>>, tools: Vec<&'a str>) -> Self {
        match messages {
            Some(messages) => RawInput::Request {
                messages,
                tools,
                in_object: true,
            },
            // Tools without messages still name the tools shown.
            None if !tools.is_empty() => RawInput::Request {
                messages: Vec::new(),
                tools,
                in_object: true,
            },
            None => RawInput::Other,
        }
    }
}

/// A JSON array kept as its raw elements; any other value counts as absent.
struct RawList<'a>(Option<Vec<&'a str>>);

impl<'de: 'a, 'a> Deserialize<'de> for RawList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawList<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'a RawValue>()? {
                    items.push(item.get());
                }
                Ok(RawList(Some(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(RawList(None))
            }
            scalars_give!(RawList(None), str);
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawInput<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawInput<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let RawList(items) =
                    RawList::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(RawInput::Request {
                    messages: items.unwrap_or_default(),
                    tools: Vec::new(),
                    in_object: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut messages = None;
                let mut tools = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "messages" => messages = map.next_value::<RawList<'a>>()?.0,
                        "tools" | "functions" => {
                            let raw: &'a RawValue = map.next_value()?;
                            if raw.get().starts_with('[') {
                                tools.push(raw.get());
                            }
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(RawInput::of_object(messages, tools))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawInput::Prompt(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(RawInput::Prompt(v))
            }
            scalars_give!(RawInput::Other);
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// What a GENERATION's input holds: the messages sent, as indices into [`GenInputs::messages`].
struct GenInput {
    messages: Vec<usize>,
}

/// Decodes the GENERATION inputs of one trace. Each turn's input repeats the messages of the turn before it, so a
/// message whose raw JSON equals the one at the same place in the previous input is not decoded again (equal text
/// decodes to the same message); the same goes for a tool list equal to one already read. Without this a trace of
/// n turns decodes O(n^2) messages.
#[derive(Default)]
struct GenInputs<'a> {
    messages: Vec<ChatMsg>,
    /// The previous input's messages: raw text and index into `messages`.
    previous: Vec<(&'a str, usize)>,
    tool_lists: Vec<&'a str>,
    tools: Vec<ToolSpec>,
}

impl<'a> GenInputs<'a> {
    fn decode(
        &mut self,
        obs: &Observation<'a>,
        at_obs: usize,
        line: u64,
    ) -> Result<GenInput, RecordError> {
        // Where the list sits, for errors only: formatted when one happens, not on every turn.
        let (raw, tool_lists, at_list) = match &obs.input {
            RawInput::Request {
                messages,
                tools,
                in_object,
            } => (
                messages,
                tools,
                if *in_object {
                    ".input.messages"
                } else {
                    ".input"
                },
            ),
            RawInput::Prompt(prompt) => {
                // A plain prompt string is one user message.
                self.messages.push(ChatMsg {
                    role: "user".into(),
                    text: Some(prompt.clone()),
                    ..ChatMsg::default()
                });
                return Ok(GenInput {
                    messages: vec![self.messages.len() - 1],
                });
            }
            RawInput::Other => {
                return Ok(GenInput {
                    messages: Vec::new(),
                });
            }
        };
        for list in tool_lists {
            if !self.tool_lists.contains(list) {
                self.tool_lists.push(list);
                let Ok(ts) = cached_tools(list, || {
                    // The reading pass already checked this is a well-formed JSON array, so it decodes.
                    let ts: Vec<Value> = serde_json::from_str(list).unwrap_or_default();
                    Ok::<_, std::convert::Infallible>(ts.iter().filter_map(tool_spec).collect())
                });
                add_tools(&mut self.tools, ts);
            }
        }
        let mut current = Vec::with_capacity(raw.len());
        for (i, m) in raw.iter().enumerate() {
            let text = *m;
            let at = match self.previous.get(i) {
                Some(&(prev, at)) if prev == text => at,
                _ => {
                    let msg = match fast::message(text, "user") {
                        Ok((msg, _)) => msg,
                        // The scanner gave up: decode as a `Value`, which names the error if there is one.
                        Err(_) => {
                            let v: Value = serde_json::from_str(text).map_err(|e| {
                                RecordError::at(
                                    line,
                                    format!("observations[{at_obs}]{at_list}[{i}]"),
                                    json_message(&e),
                                )
                            })?;
                            chat_msg(&v, "user").map_err(|(p, e)| {
                                RecordError::at(
                                    line,
                                    format!("observations[{at_obs}]{at_list}[{i}]{p}"),
                                    e,
                                )
                            })?
                        }
                    };
                    self.messages.push(msg);
                    self.messages.len() - 1
                }
            };
            current.push((text, at));
        }
        let messages = current.iter().map(|&(_, at)| at).collect();
        self.previous = current;
        Ok(GenInput { messages })
    }
}

fn gen_output(obs: &Observation, i: usize, line: u64) -> Result<ChatMsg, RecordError> {
    let decoded: Value;
    let out = match &obs.output {
        None => return Ok(ChatMsg::default()),
        Some(Output::Raw(raw)) => {
            if let Ok((msg, true)) = fast::message(raw, "assistant") {
                return Ok(msg);
            }
            // The scanner checked the text, so it decodes (see `Output::text`).
            decoded = serde_json::from_str(raw).map_err(|e| {
                RecordError::at(line, format!("observations[{i}].output"), json_message(&e))
            })?;
            match &decoded {
                Value::Array(a) => a.first(),
                v => Some(v),
            }
        }
        Some(Output::Str(s)) => {
            return Ok(ChatMsg {
                role: "assistant".into(),
                text: Some(s.to_string()),
                ..ChatMsg::default()
            });
        }
        // Some integrations log the list of choices' messages; the first is the turn the agent continued with.
        Some(Output::Other(Value::Array(a))) => a.first(),
        Some(Output::Other(v)) => Some(v),
    };
    match out {
        None | Some(Value::Null) => Ok(ChatMsg::default()),
        Some(Value::String(s)) => Ok(ChatMsg {
            role: "assistant".into(),
            text: Some(s.clone()),
            ..ChatMsg::default()
        }),
        Some(v @ Value::Object(o))
            if o.contains_key("role")
                || o.contains_key("tool_calls")
                || o.contains_key("content") =>
        {
            chat_msg(v, "assistant")
                .map_err(|(p, e)| RecordError::at(line, format!("observations[{i}].output{p}"), e))
        }
        Some(other) => Ok(ChatMsg {
            role: "assistant".into(),
            text: content_text(other).or_else(|| Some(value_to_text(other))),
            ..ChatMsg::default()
        }),
    }
}

fn usage_of(obs: &Observation) -> Option<Usage> {
    let count = |v: &Option<Value>| {
        v.as_ref()
            .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)))
    };
    for m in [&obs.usage_details, &obs.usage].into_iter().flatten() {
        if let (Some(i), Some(o)) = (count(&m.input), count(&m.output)) {
            return Some(Usage {
                prompt_tokens: i,
                completion_tokens: o,
            });
        }
    }
    None
}

fn timing_of(obs: &Observation) -> Timing {
    Timing {
        started_at: Some(obs.start_time.to_string()),
        duration_ms: obs
            .end_time
            .as_ref()
            .and_then(|e| ms_between(&obs.start_time, e.as_str())),
    }
}

fn metadata_tools(v: &Option<ToolsOf>) -> Vec<ToolSpec> {
    match v.as_ref().and_then(|m| m.0.as_ref()) {
        Some(Value::Array(ts)) => ts.iter().filter_map(tool_spec).collect(),
        _ => Vec::new(),
    }
}

fn convert(trace: Trace<'_>, line: u64) -> Result<Trajectory, RecordError> {
    // Order by start time; the original index breaks ties and names the observation in errors.
    let mut order: Vec<(i64, usize)> = Vec::with_capacity(trace.observations.len());
    for (i, o) in trace.observations.iter().enumerate() {
        let Some(k) = time_key(&o.start_time) else {
            return Err(RecordError::at(
                line,
                format!("observations[{i}].startTime"),
                format!("`{}` is not an RFC 3339 time", o.start_time),
            ));
        };
        order.push((k, i));
    }
    order.sort_unstable();

    let mut inputs: HashMap<usize, GenInput> = HashMap::new();
    let mut decoded = GenInputs::default();
    for &(_, i) in &order {
        let o = &trace.observations[i];
        if o.kind == "GENERATION" {
            let inp = decoded.decode(o, i, line)?;
            inputs.insert(i, inp);
        }
    }
    let mut tools = std::mem::take(&mut decoded.tools);
    if tools.is_empty() {
        for &(_, i) in &order {
            let o = &trace.observations[i];
            if o.kind == "GENERATION" {
                add_tools(&mut tools, metadata_tools(&o.metadata));
            }
        }
        add_tools(&mut tools, metadata_tools(&trace.metadata));
    }
    let tool_names: HashSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let is_tool_obs = |o: &Observation| {
        o.kind == "TOOL"
            || (o.kind == "SPAN"
                && o.name
                    .as_ref()
                    .is_some_and(|n| tool_names.contains(n.as_str())))
    };
    // Without tool observations the results are only visible as `tool` messages in later generation inputs.
    let results_from_inputs = !trace.observations.iter().any(is_tool_obs);

    let mut task: Option<String> = None;
    let mut system: Option<String> = None;
    let mut steps: Vec<Step> = Vec::new();
    let mut users_seen = 0usize;
    let mut pending: VecDeque<(String, Option<String>)> = VecDeque::new();
    let mut call_names: HashMap<String, String> = HashMap::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut model: Option<String> = None;

    for &(_, i) in &order {
        let o = &trace.observations[i];
        if o.kind == "GENERATION" {
            model = model.or_else(|| o.model.as_ref().map(|m| m.as_str().to_string()));
            let inp = &inputs[&i];
            let mut users = 0usize;
            for m in inp.messages.iter().map(|&at| &decoded.messages[at]) {
                match m.role.as_str() {
                    "system" | "developer" if task.is_none() && users == 0 => {
                        if let Some(t) = &m.text {
                            system = Some(match system.take() {
                                Some(s) => format!("{s}\n\n{t}"),
                                None => t.clone(),
                            });
                        }
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
                    "tool" if results_from_inputs => {
                        if let Some(id) = &m.tool_call_id
                            && let Some(name) = call_names.get(id)
                            && answered.insert(id.clone())
                        {
                            steps.push(Step::ToolResult {
                                call_id: Some(id.clone()),
                                name: name.clone(),
                                content: m.text.clone().unwrap_or_default(),
                                is_error: false,
                                timing: Timing::default(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            users_seen = users_seen.max(users);
            let out = gen_output(o, i, line)?;
            for c in &out.tool_calls {
                pending.push_back((c.name.clone(), c.id.clone()));
                if let Some(id) = &c.id {
                    call_names.insert(id.clone(), c.name.clone());
                }
            }
            steps.push(Step::Model {
                content: out.text.filter(|t| !t.is_empty()),
                tool_calls: out.tool_calls,
                timing: timing_of(o),
                usage: usage_of(o),
            });
        } else if is_tool_obs(o) {
            let Some(name) = o.name.as_ref().map(|n| n.as_str().to_string()) else {
                return Err(RecordError::at(
                    line,
                    format!("observations[{i}].name"),
                    "a TOOL observation needs the tool's name",
                ));
            };
            // Langfuse records no call id on tool observations: pair with the oldest unanswered call of that tool.
            let call_id = pending
                .iter()
                .position(|(n, _)| *n == name)
                .and_then(|p| pending.remove(p))
                .and_then(|(_, id)| id);
            let is_error = o.level.as_ref().map(Text::as_str) == Some("ERROR");
            // A null output was read as `None`.
            let content = match &o.output {
                None => o
                    .status_message
                    .as_ref()
                    .map(|m| m.as_str().to_string())
                    .unwrap_or_default(),
                // The scanner accepts only what a `Value` decode accepts, so this error cannot happen; it is
                // reported rather than hidden should it ever.
                Some(v) => v.text().map_err(|e| {
                    RecordError::at(line, format!("observations[{i}].output"), json_message(&e))
                })?,
            };
            steps.push(Step::ToolResult {
                call_id,
                name,
                content,
                is_error,
                timing: timing_of(o),
            });
        }
    }

    let task = match task {
        Some(t) => t,
        None => match trace.input.and_then(|s| s.0) {
            Some(s) if !s.trim().is_empty() => s.into_owned(),
            _ => {
                return Err(RecordError::at(
                    line,
                    "observations",
                    "no GENERATION input has a user message (the task), and the trace input is not a string",
                ));
            }
        },
    };
    let final_answer = last_answer(&steps).or_else(|| match trace.output.and_then(|s| s.0) {
        Some(s) if !s.is_empty() => Some(s.into_owned()),
        _ => None,
    });
    Ok(Trajectory {
        task,
        system,
        tools,
        // Langfuse logs tools in the provider's function format, which has no behaviour hints.
        tool_annotations: Default::default(),
        steps,
        final_answer,
        outcome: outcome_from_scores(&trace.scores),
        meta: Meta {
            model,
            external_id: Some(trace.id),
            started_at: trace.timestamp,
            ..Meta::default()
        },
        links: Default::default(),
    })
}

/// Whether a score's name says it grades success: one of its words (split on anything not a letter or digit) is
/// success, successful, succeeded, correct, correctness, accuracy, resolved, pass, passed, completed or
/// completion. Word matching keeps `incorrect` or `hallucination` from counting.
fn names_success(name: &str) -> bool {
    const WORDS: [&str; 11] = [
        "success",
        "successful",
        "succeeded",
        "correct",
        "correctness",
        "accuracy",
        "resolved",
        "pass",
        "passed",
        "completed",
        "completion",
    ];
    name.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| WORDS.contains(&w))
}

/// Outcome from scores: the first NUMERIC score in [0, 1] with a success-like name is the score, the first
/// BOOLEAN one the success flag; trace-level scores come before observation-level ones. Their comments are the
/// feedback.
fn outcome_from_scores(scores: &[Score]) -> Outcome {
    let mut ordered: Vec<&Score> = scores.iter().filter(|s| names_success(&s.name)).collect();
    ordered.sort_by_key(|s| s.observation_id.is_some());
    let mut out = Outcome::default();
    let mut comments: Vec<String> = Vec::new();
    for s in ordered {
        let number = s.value.as_ref().and_then(Value::as_f64);
        match s.data_type.as_ref().map(Text::as_str) {
            Some("BOOLEAN") if out.success.is_none() => {
                let flag =
                    number
                        .map(|v| v >= 0.5)
                        .or(match s.string_value.as_ref().map(Text::as_str) {
                            Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
                            Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
                            _ => None,
                        });
                if flag.is_some() {
                    out.success = flag;
                    comments.extend(s.comment.as_ref().map(|c| c.as_str().to_string()));
                }
            }
            Some("NUMERIC") | None if out.score.is_none() => {
                if let Some(v) = number.filter(|v| (0.0..=1.0).contains(v)) {
                    out.score = Some(v);
                    comments.extend(s.comment.as_ref().map(|c| c.as_str().to_string()));
                }
            }
            _ => {}
        }
    }
    comments.dedup();
    if !comments.is_empty() {
        out.feedback = Some(comments.join("; "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One GENERATION observation with the given input and output, as a trace line.
    fn generation(at: u32, input: &str, output: &str) -> String {
        format!(
            r#"{{"type": "GENERATION", "name": "chat", "startTime": "2025-06-02T09:15:0{at}.000Z", "input": {input}, "output": {output}}}"#
        )
    }

    fn trace(observations: &[String]) -> String {
        format!(
            r#"{{"id": "t1", "observations": [{}]}}"#,
            observations.join(", ")
        )
    }

    const TOOLS: &str = r#"[{"type": "function", "function": {"name": "read_file", "description": "Reads a file.", "parameters": {"type": "object"}}}]"#;

    #[test]
    fn every_generation_input_shape_is_read() {
        let user = r#"{"role": "user", "content": "Sum notes.txt"}"#;
        // `{tools, messages}`; then a bare array; then `{tools}` alone; then a prompt string; then null and a number.
        let t = parse(
            &trace(&[
                generation(
                    1,
                    &format!(r#"{{"tools": {TOOLS}, "messages": [{user}], "model": "m"}}"#),
                    r#"{"role": "assistant", "content": "one"}"#,
                ),
                generation(2, &format!("[{user}]"), r#""two""#),
                generation(
                    3,
                    &format!(r#"{{"tools": {TOOLS}, "messages": "not a list"}}"#),
                    r#""three""#,
                ),
                generation(4, r#""Now say four""#, r#""four""#),
                generation(5, "null", r#""five""#),
                generation(6, "7", r#""six""#),
            ]),
            1,
        )
        .expect("trace");
        assert_eq!(t.task, "Sum notes.txt");
        assert_eq!(t.tools.len(), 1);
        assert_eq!(t.tools[0].description, "Reads a file.");
        let answers: Vec<_> = t
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Model { content, .. } => content.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(answers, ["one", "two", "three", "four", "five", "six"]);
    }

    #[test]
    fn a_message_that_changes_in_place_is_decoded_again() {
        // The second turn's history holds, at the same place and with the same length, a different tool message
        // than the first turn's: its content must be read, not taken over from the first turn.
        let call = r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}"#;
        let t = parse(
            &trace(&[
                generation(1, &format!(r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "task"}}, {{"role": "tool", "tool_call_id": "c1", "content": "stale"}}]}}"#), call),
                generation(2, &format!(r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "task"}}, {{"role": "tool", "tool_call_id": "c1", "content": "fresh"}}]}}"#), r#""done""#),
            ]),
            1,
        )
        .expect("trace");
        let results: Vec<_> = t
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::ToolResult { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(results, ["fresh"]);
    }

    #[test]
    fn a_bad_message_in_a_later_turn_is_named_by_its_path() {
        let e = parse(
            &trace(&[
                generation(1, r#"[{"role": "user", "content": "first"}]"#, r#""a""#),
                generation(
                    2,
                    r#"{"messages": [{"role": "user", "content": "first"}, {"role": 3}]}"#,
                    r#""b""#,
                ),
            ]),
            4,
        )
        .expect_err("bad role");
        assert_eq!(e.line, 4);
        assert_eq!(
            e.path.as_deref(),
            Some("observations[1].input.messages[1].role"),
            "{e}"
        );
    }

    #[test]
    fn values_the_lean_pass_drops_are_still_checked() {
        // Neither field is used (an AGENT output, a usage total), but a `Value` decode rejected them, so the record
        // is still an error, named at the same path.
        let agent = |field: &str| {
            format!(r#"{{"type": "AGENT", "startTime": "2025-06-02T09:15:00.000Z", {field}}}"#)
        };
        for (field, path, message) in [
            (
                r#""output": {"a": "\ud800"}"#,
                "observations[0].output.a",
                "unexpected end of hex escape",
            ),
            (
                r#""usage": {"total": 1e999}"#,
                "observations[0].usage.total",
                "number out of range",
            ),
            (
                r#""usage": 5"#,
                "observations[0].usage",
                "invalid type: integer `5`, expected a map",
            ),
        ] {
            let e = parse(&trace(&[agent(field)]), 2).expect_err(field);
            assert_eq!(e.path.as_deref(), Some(path), "{e}");
            assert!(e.message.starts_with(message), "{e}");
        }
        // serde_json's private raw-value key makes a `Value` decode read the string as JSON: the strict pass does.
        let t = parse(
            &trace(&[
                agent(r#""metadata": {"$serde_json::private::RawValue": "{\"a\": 1}"}"#),
                generation(1, r#"[{"role": "user", "content": "task"}]"#, r#""done""#),
            ]),
            1,
        )
        .expect("trace");
        assert_eq!(t.final_answer.as_deref(), Some("done"));
    }

    #[test]
    fn success_names_are_matched_by_word() {
        for n in [
            "success",
            "task_success",
            "Correctness",
            "tool-correct",
            "accuracy",
        ] {
            assert!(names_success(n), "{n}");
        }
        for n in ["incorrect", "hallucination", "helpfulness", "user_feedback"] {
            assert!(!names_success(n), "{n}");
        }
    }

    #[test]
    fn boolean_and_numeric_scores_make_the_outcome() {
        let s: Vec<Score> = serde_json::from_str(
            r#"[{"name": "helpfulness", "value": 0.1, "dataType": "NUMERIC"},
                {"name": "correctness", "value": 0.0, "dataType": "NUMERIC", "comment": "expected 69504"},
                {"name": "task_success", "value": 0, "stringValue": "False", "dataType": "BOOLEAN"}]"#,
        )
        .expect("scores");
        let o = outcome_from_scores(&s);
        assert_eq!(o.score, Some(0.0));
        assert_eq!(o.success, Some(false));
        assert_eq!(o.feedback.as_deref(), Some("expected 69504"));
    }

    /// The scanner must read what real exports hold (else every record pays for a pass that gives up) and build
    /// what the serde pass builds.
    #[test]
    fn the_scanner_reads_the_fixtures_and_samples_as_the_serde_pass_does() {
        let lines = include_str!("../tests/fixtures/langfuse.jsonl")
            .lines()
            .chain(include_str!("../samples/langfuse.jsonl").lines())
            .filter(|l| !l.trim().is_empty());
        let mut n = 0;
        for (i, line) in lines.enumerate() {
            let fast =
                fast::trace(line).unwrap_or_else(|_| panic!("the scanner gave up on line {i}"));
            let lean: Trace = serde_json::from_str(line).expect("valid");
            assert_eq!(
                format!("{:?}", convert(fast, 1)),
                format!("{:?}", convert(lean, 1)),
                "line {i}"
            );
            n += 1;
        }
        assert!(n >= 10, "{n}");
    }

    /// The fast path's contract, checked differentially on every fixture and sample line, whole and damaged at
    /// random: the scanner either gives up or builds exactly what the serde pass builds from the same text. It may
    /// be stricter than serde, never looser, so a record reads the same whichever pass reads it.
    mod differential {
        use super::*;
        use crate::mutate::{differential, lines};
        use proptest::prelude::*;

        #[test]
        fn the_scanner_gives_up_or_builds_what_serde_builds() {
            let (compared, tried) = differential(
                &lines(&[
                    include_str!("../tests/fixtures/langfuse.jsonl"),
                    include_str!("../samples/langfuse.jsonl"),
                ]),
                1000,
                |text| {
                    let Ok(fast) = fast::trace(text) else {
                        return Ok(false);
                    };
                    let lean = serde_json::from_str::<Trace>(text);
                    prop_assert!(
                        lean.is_ok(),
                        "the scanner read what serde rejects: {}",
                        text
                    );
                    let lean = lean.expect("checked");
                    prop_assert_eq!(
                        format!("{:?}", convert(fast, 1)),
                        format!("{:?}", convert(lean, 1))
                    );
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

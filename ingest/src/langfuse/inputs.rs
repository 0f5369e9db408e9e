//! GENERATION inputs: kept as raw JSON while the trace is read, then decoded once per distinct message and tool
//! list, since every turn repeats the whole history and the tools (O(turns) decodes, not O(turns^2)).

use super::fast;
use super::schema::Observation;
use crate::RecordError;
use crate::common::{ChatMsg, add_tools, cached_tools, chat_msg, json_message, tool_spec};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use tooltune_core::ToolSpec;

/// An observation's input, split in the same pass that reads the trace: a GENERATION's input repeats the whole
/// history and the tool list on every turn, so its messages and tools are kept as raw JSON and decoded later, each
/// distinct one once (see [`GenInputs`]).
#[derive(Default)]
pub(super) enum RawInput<'a> {
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
    pub(super) fn of_object(messages: Option<Vec<&'a str>>, tools: Vec<&'a str>) -> Self {
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
pub(super) struct GenInput {
    pub(super) messages: Vec<usize>,
}

/// Decodes the GENERATION inputs of one trace. Each turn's input repeats the messages of the turn before it, so a
/// message whose raw JSON equals the one at the same place in the previous input is not decoded again (equal text
/// decodes to the same message); the same goes for a tool list equal to one already read. Without this a trace of
/// n turns decodes O(n^2) messages.
#[derive(Default)]
pub(super) struct GenInputs<'a> {
    pub(super) messages: Vec<ChatMsg>,
    /// The previous input's messages: raw text and index into `messages`.
    previous: Vec<(&'a str, usize)>,
    tool_lists: Vec<&'a str>,
    pub(super) tools: Vec<ToolSpec>,
}

impl<'a> GenInputs<'a> {
    pub(super) fn decode(
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

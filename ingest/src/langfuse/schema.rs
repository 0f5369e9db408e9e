//! The Langfuse trace as the reading passes build it: the trace, its observations and scores, with strings borrowed
//! from the line; the free-form fields are the lean types of `lean.rs`, the inputs those of `inputs.rs`.

use super::inputs::RawInput;
use super::lean::{Counts, Output, StrOnly, ToolsOf};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Trace<'a> {
    pub(super) id: String,
    #[serde(default)]
    pub(super) timestamp: Option<String>,
    #[serde(default, borrow)]
    pub(super) input: Option<StrOnly<'a>>,
    #[serde(default, borrow)]
    pub(super) output: Option<StrOnly<'a>>,
    #[serde(default)]
    pub(super) metadata: Option<ToolsOf>,
    #[serde(default, borrow)]
    pub(super) observations: Vec<Observation<'a>>,
    #[serde(default, borrow)]
    pub(super) scores: Vec<Score<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Observation<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default, borrow)]
    pub(super) name: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) start_time: Cow<'a, str>,
    #[serde(default, borrow)]
    pub(super) end_time: Option<Text<'a>>,
    /// Only a GENERATION's input is used (the messages sent); see [`RawInput`].
    #[serde(default, borrow)]
    pub(super) input: RawInput<'a>,
    #[serde(default, borrow)]
    pub(super) output: Option<Output<'a>>,
    #[serde(default)]
    pub(super) metadata: Option<ToolsOf>,
    #[serde(default, borrow)]
    pub(super) model: Option<Text<'a>>,
    #[serde(default)]
    pub(super) usage: Option<Counts>,
    #[serde(default)]
    pub(super) usage_details: Option<Counts>,
    #[serde(default, borrow)]
    pub(super) level: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) status_message: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Score<'a> {
    #[serde(borrow)]
    pub(super) name: Cow<'a, str>,
    #[serde(default)]
    pub(super) value: Option<Value>,
    #[serde(default, borrow)]
    pub(super) string_value: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) data_type: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) comment: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) observation_id: Option<Text<'a>>,
}

/// A string field that borrows from the line unless it holds escapes. (`Option<Cow<str>>` would always copy: serde
/// borrows only a bare `Cow` field.) Rejects what a `String` rejects, with the same message.
pub(super) struct Text<'a>(pub(super) Cow<'a, str>);

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
    pub(super) fn as_str(&self) -> &str {
        &self.0
    }
}

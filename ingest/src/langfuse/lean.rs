//! The lean pass's free-form fields: types that keep only what `convert` reads of an output, the trace's input and
//! output, metadata and usage, while checking the rest as a `Value` decode would, and the [`STRICT`] switch that
//! makes them decode the declared way when a record must be read again.

use crate::common::value_to_text;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

thread_local! {
    /// Whether [`Output`], [`StrOnly`], [`ToolsOf`] and [`Counts`] decode their field as a `Value` (or map), as
    /// the data model declares it, instead of picking out what `convert` uses: set while a record that failed the
    /// lean pass is decoded again, to report its error as the declared types do (and, for the odd record only
    /// the lean pass rejects, to read it).
    static STRICT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with [`STRICT`] set.
pub(super) fn strict<T>(f: impl FnOnce() -> T) -> T {
    STRICT.set(true);
    let out = f();
    STRICT.set(false);
    out
}

// The types below stand for fields the data model declares as `Option<Value>` (or, for usage, a map) and keep
// only what `convert` reads. They accept and reject exactly what those declarations did: the parts they drop are
// walked with the same parser calls a `Value` decode makes ([`Checked`]), inside the record's deserializer, so
// escapes, number ranges and the nesting limit are checked as before. The one case [`Checked`] cannot judge
// (serde_json's private raw-value key, which a `Value` decode treats specially) fails the lean pass, and
// [`STRICT`] then decodes these fields as `Value`s.

/// An observation's `output`: a string is borrowed; anything else is a `Value`, or (read by the scanner, which
/// checked it) its text, decoded when it is used.
pub(super) enum Output<'a> {
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
    pub(super) fn text(&self) -> Result<String, serde_json::Error> {
        Ok(match self {
            Output::Str(s) => s.to_string(),
            Output::Other(v) => value_to_text(v),
            Output::Raw(raw) => value_to_text(&serde_json::from_str(raw)?),
        })
    }
}

/// The trace's `input` or `output`: only a string is used.
pub(super) struct StrOnly<'a>(pub(super) Option<Cow<'a, str>>);

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
pub(super) struct ToolsOf(pub(super) Option<Value>);

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
pub(super) struct Counts {
    pub(super) input: Option<Value>,
    pub(super) output: Option<Value>,
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

//! The OTLP/JSON request as serde reads it: the types a line decodes into, borrowing its text, with the integer and
//! status forms producers write. The fast scanner (`fast.rs`) builds the same values.

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Request<'a> {
    #[serde(borrow)]
    pub(super) resource_spans: Vec<ResourceSpans<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResourceSpans<'a> {
    #[serde(default, borrow)]
    pub(super) resource: Option<Resource<'a>>,
    #[serde(default, borrow)]
    pub(super) scope_spans: Vec<ScopeSpans<'a>>,
}

#[derive(Deserialize)]
pub(super) struct Resource<'a> {
    #[serde(default, borrow)]
    pub(super) attributes: Vec<KeyValue<'a>>,
}

#[derive(Deserialize)]
pub(super) struct ScopeSpans<'a> {
    #[serde(default, borrow)]
    pub(super) spans: Vec<Span<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Span<'a> {
    #[serde(borrow)]
    pub(super) trace_id: Str<'a>,
    #[serde(borrow)]
    pub(super) span_id: Str<'a>,
    #[serde(default, borrow)]
    pub(super) parent_span_id: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub(super) name: Str<'a>,
    #[serde(deserialize_with = "de_u64")]
    pub(super) start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "de_u64")]
    pub(super) end_time_unix_nano: u64,
    #[serde(default, borrow)]
    pub(super) attributes: Vec<KeyValue<'a>>,
    #[serde(default, borrow)]
    pub(super) status: Option<Status<'a>>,
}

#[derive(Deserialize)]
pub(super) struct KeyValue<'a> {
    #[serde(borrow)]
    pub(super) key: Str<'a>,
    #[serde(default, borrow)]
    pub(super) value: AnyValue<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct AnyValue<'a> {
    #[serde(default, borrow)]
    pub(super) string_value: Option<Str<'a>>,
    #[serde(default)]
    pub(super) bool_value: Option<bool>,
    #[serde(default, deserialize_with = "de_opt_i64")]
    pub(super) int_value: Option<i64>,
    #[serde(default)]
    pub(super) double_value: Option<f64>,
    // Boxed: they are rare, and a span's dozens of attributes are moved around by value; unboxed they made an
    // attribute 136 bytes, whose moves showed in profiles as a twentieth of parsing.
    #[serde(default, borrow)]
    pub(super) array_value: Option<Box<ArrayValue<'a>>>,
    #[serde(default, borrow)]
    pub(super) kvlist_value: Option<Box<KvList<'a>>>,
    #[serde(default, borrow)]
    pub(super) bytes_value: Option<Str<'a>>,
}

#[derive(Deserialize)]
pub(super) struct ArrayValue<'a> {
    #[serde(default, borrow)]
    pub(super) values: Vec<AnyValue<'a>>,
}

#[derive(Deserialize)]
pub(super) struct KvList<'a> {
    #[serde(default, borrow)]
    pub(super) values: Vec<KeyValue<'a>>,
}

#[derive(Deserialize)]
pub(super) struct Status<'a> {
    #[serde(default, deserialize_with = "de_status_code")]
    pub(super) code: i64,
    #[serde(default, borrow)]
    pub(super) message: Option<Str<'a>>,
}

/// A JSON string as the line writes it, quotes included, its escapes not yet decoded.
///
/// A chat span carries the tool definitions and the whole message history as JSON inside JSON strings, so nearly
/// every character of them is behind an escape; decoding all of that while reading the line, most of it to be
/// thrown away (definitions seen before, history already read on the previous span), was the largest cost of
/// reading OTLP. Decoding waits until a value is used, and comparisons use the text as written.
#[derive(Clone, Copy)]
pub(super) struct Str<'a>(pub(super) &'a str);

impl Default for Str<'_> {
    fn default() -> Self {
        Str("\"\"")
    }
}

impl<'a> Str<'a> {
    /// The text between the quotes, escapes as written.
    pub(super) fn raw(self) -> &'a str {
        &self.0[1..self.0.len() - 1]
    }

    /// The decoded string: borrowed from the line unless it has escapes.
    pub(super) fn text(self) -> Cow<'a, str> {
        // The string was checked when the line was read, so it decodes; serde_json is left the surrogate escapes.
        crate::scan::checked_text(self.raw())
            .unwrap_or_else(|_| Cow::Owned(serde_json::from_str(self.0).unwrap_or_default()))
    }

    /// Whether the decoded string is `s`, a string without backslashes: written plainly, or escaped (longer).
    pub(super) fn is(self, s: &str) -> bool {
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
    pub(super) fn to_json(&self) -> Value {
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

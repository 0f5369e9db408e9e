//! Canonical JSON (object keys sorted recursively, no whitespace) written straight from any `Serialize` value.
//!
//! Content addresses (trajectory and description ids) hash the canonical JSON of a value. Building it by way of a
//! `serde_json::Value` tree, then a key-sorted copy of that tree, cost two allocations per node and was most of
//! ingest's CPU time. This serializer writes into one buffer instead: an object's entries are written as final JSON
//! in the order they arrive, remembered as byte ranges, and rewritten in key order when the object ends, unless
//! they arrived in key order already (then nothing is copied). The output is byte-for-byte
//! what `serde_json::to_string` prints for the key-sorted `serde_json::to_value` of the same value (tested against
//! that reference), so ids stay what they were.

use crate::ToolSpec;
use serde::ser::{self, Serialize};
use serde_json::Value;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::Arc;

/// Appends the canonical JSON of `value` to `out`.
///
/// Fails only for values JSON cannot hold (a map key that is not a string or number), as `serde_json` would.
pub(crate) fn write_canonical<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let mut ctx = Ctx {
        out: std::mem::take(out),
        entries: Vec::new(),
        tmp: Vec::new(),
    };
    let result = value.serialize(&mut ctx);
    *out = ctx.out;
    result
}

thread_local! {
    /// Canonical JSON of the tools this thread has written, by the address of their shared schema. Readers hand
    /// the same decoded schema to every record that shows it, and re-serialising a record's tool list (half of a
    /// typical record) was a third of computing its id. Each entry holds a reference to its schema, so an address
    /// cannot be reused by another schema while its entry lives. Bounded: emptied past [`TOOLS_LIMIT`] entries.
    static TOOLS: RefCell<ToolCache> = RefCell::new(ToolCache::default());
}
const TOOLS_LIMIT: usize = 1024;

#[derive(Default)]
struct ToolCache {
    by_schema: foldhash::HashMap<usize, Vec<CachedTool>>,
    len: usize,
}

struct CachedTool {
    schema: Arc<Value>,
    name: String,
    description: String,
    json: Box<[u8]>,
}

/// Hands the canonical JSON of `tool` to `use_json`, from this thread's cache when the same tool (same name and
/// description, same shared schema) was written before. (The id hashes it where it lies in the cache, rather than
/// copying it out first.)
pub(crate) fn with_tool_json(tool: &ToolSpec, use_json: impl FnOnce(&[u8])) {
    let key = Arc::as_ptr(&tool.input_schema) as usize;
    let mut use_json = Some(use_json);
    TOOLS.with_borrow(|cache| {
        let found = cache.by_schema.get(&key)?.iter().find(|c| {
            Arc::ptr_eq(&c.schema, &tool.input_schema)
                && c.name == tool.name
                && c.description == tool.description
        })?;
        use_json.take()?(&found.json);
        Some(())
    });
    let Some(use_json) = use_json else { return };
    let mut json = Vec::with_capacity(256);
    // A tool is a name, a text and a `Value`: writing it cannot fail.
    let _ = write_canonical(tool, &mut json);
    use_json(&json);
    TOOLS.with_borrow_mut(|cache| {
        if cache.len >= TOOLS_LIMIT {
            *cache = ToolCache::default();
        }
        cache.len += 1;
        cache.by_schema.entry(key).or_default().push(CachedTool {
            schema: Arc::clone(&tool.input_schema),
            name: tool.name.clone(),
            description: tool.description.clone(),
            json: json.into(),
        });
    });
}

/// One entry of an object being written: the byte range in `out` of its key (a JSON string; an integer key is
/// quoted as `to_value` would), and where its value ends. The entry's bytes are `"key":value`, from the key's start
/// to the value's end.
struct Entry {
    key: (usize, usize),
    end: usize,
}

/// The serializer's state: the output, a stack of the entries of the objects being written (each open object
/// owns the tail from its base), and a scratch buffer for reordering.
struct Ctx {
    out: Vec<u8>,
    entries: Vec<Entry>,
    tmp: Vec<u8>,
}

/// Appends `s` as a JSON string, escaped exactly as `serde_json` prints it: `"` and `\\` escaped, control
/// characters as `\b \f \n \r \t` or `\u00xx` (lowercase hex), everything else as it is.
///
/// `serde_json` looks each byte up in a table; strings (step contents, tool results, arguments) are most of a
/// record's canonical JSON, and that loop was a sixth of computing an id. This one tests eight bytes at a time
/// and copies the runs that need no escape whole.
fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // `start`: the first byte not yet copied; `i`: the first byte not yet examined.
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            if !needs_escape(word) {
                i += 8;
                continue;
            }
        }
        // Some byte of these eight (or of the short tail) needs an escape: look at them one by one.
        let end = (i + 8).min(bytes.len());
        while i < end {
            let escaped: &[u8] = match bytes[i] {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                0x08 => b"\\b",
                0x0c => b"\\f",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                c @ 0..=0x1f => &[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(c >> 4)],
                    HEX[usize::from(c & 0xf)],
                ],
                _ => {
                    i += 1;
                    continue;
                }
            };
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(escaped);
            i += 1;
            start = i;
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Whether any of the eight bytes of `w` is a control character, `"` or `\\`. Each test is the classic
/// "has a byte less than n" bit trick (exact as a yes/no for n <= 128): a byte below 0x20, or a byte equal to the
/// character once XOR has made that byte zero. Bytes of multi-byte UTF-8 characters (0x80 and up) never match.
const fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const fn zero_byte(x: u64) -> u64 {
        x.wrapping_sub(ONES) & !x & HIGH
    }
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let quote = zero_byte(w ^ (ONES * b'"' as u64));
    let backslash = zero_byte(w ^ (ONES * b'\\' as u64));
    control | quote | backslash != 0
}

impl Ctx {
    fn write_json<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), serde_json::Error> {
        serde_json::to_writer(&mut self.out, v)
    }

    /// Orders two keys written in `out` by their raw (unescaped) text, as a key-sorted map does.
    fn key_cmp(out: &[u8], (a1, b1): (usize, usize), (a2, b2): (usize, usize)) -> Ordering {
        let (x, y) = (&out[a1 + 1..b1 - 1], &out[a2 + 1..b2 - 1]);
        if !x.contains(&b'\\') && !y.contains(&b'\\') {
            // Without escapes the bytes are the text, and UTF-8 orders as its characters do; no need to decode.
            return x.cmp(y);
        }
        // Escapes change the byte order (`\"` sorts after `#`), so compare the unescaped text.
        let text = |a, b| serde_json::from_slice::<String>(&out[a..b]).unwrap_or_default();
        text(a1, b1).cmp(&text(a2, b2))
    }

    /// Starts an entry of the object whose entries begin at `base`: the comma before every entry but the first.
    fn begin_entry(&mut self, base: usize) {
        if self.entries.len() > base {
            self.out.push(b',');
        }
    }

    /// Closes the object whose `{` is at `start` and whose entries begin at `base`. Entries that arrived in key
    /// order are final as written; otherwise the object's bytes are rewritten with its entries sorted.
    fn end_object(&mut self, start: usize, base: usize) {
        let sorted = {
            let out = &self.out;
            self.entries[base..]
                .windows(2)
                .all(|w| Ctx::key_cmp(out, w[0].key, w[1].key) != Ordering::Greater)
        };
        if !sorted {
            {
                let out = &self.out;
                self.entries[base..].sort_by(|a, b| Ctx::key_cmp(out, a.key, b.key));
            }
            self.tmp.clear();
            self.tmp.extend_from_slice(&self.out[start..]);
            self.out.truncate(start);
            self.out.push(b'{');
            for (i, e) in self.entries[base..].iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out
                    .extend_from_slice(&self.tmp[e.key.0 - start..e.end - start]);
            }
        }
        self.out.push(b'}');
        self.entries.truncate(base);
    }
}

/// An array being written.
struct Seq<'a> {
    ctx: &'a mut Ctx,
    first: bool,
    /// Closing bytes after `]` (`}` for a tuple variant's wrapper object).
    close: &'static [u8],
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), serde_json::Error> {
        if !self.first {
            self.ctx.out.push(b',');
        }
        self.first = false;
        v.serialize(&mut *self.ctx)
    }

    fn finish(self) -> Result<(), serde_json::Error> {
        self.ctx.out.push(b']');
        self.ctx.out.extend_from_slice(self.close);
        Ok(())
    }
}

/// An object being written.
struct Obj<'a> {
    ctx: &'a mut Ctx,
    start: usize,
    base: usize,
    pending_key: Option<(usize, usize)>,
    /// Closing bytes after the object (`}` for a struct variant's wrapper object).
    close: &'static [u8],
}

impl Obj<'_> {
    /// Writes the value of an entry whose key (at `key`, with the `:` after it) is written.
    fn value_for<T: Serialize + ?Sized>(
        &mut self,
        key: (usize, usize),
        v: &T,
    ) -> Result<(), serde_json::Error> {
        v.serialize(&mut *self.ctx)?;
        let end = self.ctx.out.len();
        self.ctx.entries.push(Entry { key, end });
        Ok(())
    }

    fn finish(self) -> Result<(), serde_json::Error> {
        self.ctx.end_object(self.start, self.base);
        self.ctx.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut Ctx {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Obj<'a>;
    type SerializeStruct = Obj<'a>;
    type SerializeStructVariant = Obj<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), serde_json::Error> {
        // `to_value` widens an f32 to f64 before printing it.
        self.write_json(&f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_char(self, v: char) -> Result<(), serde_json::Error> {
        self.write_json(&v)
    }
    fn serialize_str(self, v: &str) -> Result<(), serde_json::Error> {
        write_str(&mut self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), serde_json::Error> {
        self.write_json(v)
    }
    fn serialize_none(self) -> Result<(), serde_json::Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), serde_json::Error> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), serde_json::Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), serde_json::Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), serde_json::Error> {
        self.write_json(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), serde_json::Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<(), serde_json::Error> {
        // A one-key object needs no sorting.
        self.out.push(b'{');
        self.write_json(variant)?;
        self.out.push(b':');
        v.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Seq<'a>, serde_json::Error> {
        self.out.push(b'[');
        Ok(Seq {
            ctx: self,
            first: true,
            close: b"",
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, serde_json::Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> Result<Seq<'a>, serde_json::Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Seq<'a>, serde_json::Error> {
        self.out.push(b'{');
        self.write_json(variant)?;
        self.out.extend_from_slice(b":[");
        Ok(Seq {
            ctx: self,
            first: true,
            close: b"}",
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Obj<'a>, serde_json::Error> {
        let start = self.out.len();
        self.out.push(b'{');
        let base = self.entries.len();
        Ok(Obj {
            ctx: self,
            start,
            base,
            pending_key: None,
            close: b"",
        })
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Obj<'a>, serde_json::Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Obj<'a>, serde_json::Error> {
        self.out.push(b'{');
        self.write_json(variant)?;
        self.out.push(b':');
        let mut obj = self.serialize_map(None)?;
        obj.close = b"}";
        Ok(obj)
    }
}

/// serde has one trait per kind of array (sequence, tuple, tuple struct, tuple variant); all are written alike.
macro_rules! array_kind {
    ($trait:ident, $method:ident) => {
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = serde_json::Error;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), serde_json::Error> {
                self.element(v)
            }
            fn end(self) -> Result<(), serde_json::Error> {
                self.finish()
            }
        }
    };
}
array_kind!(SerializeSeq, serialize_element);
array_kind!(SerializeTuple, serialize_element);
array_kind!(SerializeTupleStruct, serialize_field);
array_kind!(SerializeTupleVariant, serialize_field);

impl ser::SerializeMap for Obj<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), serde_json::Error> {
        // The key is written where it lands and picked up again if the object is reordered.
        self.ctx.begin_entry(self.base);
        let a = self.ctx.out.len();
        key.serialize(&mut *self.ctx)?;
        let written = &self.ctx.out[a..];
        let is_string = written.first() == Some(&b'"');
        let is_integer =
            !written.is_empty() && written.iter().all(|c| c.is_ascii_digit() || *c == b'-');
        if !is_string && !is_integer {
            return Err(ser::Error::custom("key must be a string"));
        }
        if is_integer {
            // `serde_json::to_value` turns an integer key into its decimal string.
            self.ctx.out.insert(a, b'"');
            self.ctx.out.push(b'"');
        }
        let b = self.ctx.out.len();
        self.ctx.out.push(b':');
        self.pending_key = Some((a, b));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), serde_json::Error> {
        let key = self
            .pending_key
            .take()
            .ok_or_else(|| <serde_json::Error as ser::Error>::custom("value without a key"))?;
        self.value_for(key, v)
    }
    fn end(self) -> Result<(), serde_json::Error> {
        self.finish()
    }
}

/// Structs and struct variants: objects whose keys are the fields' static names.
macro_rules! struct_kind {
    ($trait:ident) => {
        impl ser::$trait for Obj<'_> {
            type Ok = ();
            type Error = serde_json::Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                v: &T,
            ) -> Result<(), serde_json::Error> {
                self.ctx.begin_entry(self.base);
                let a = self.ctx.out.len();
                write_str(&mut self.ctx.out, key);
                let b = self.ctx.out.len();
                self.ctx.out.push(b':');
                self.value_for((a, b), v)
            }
            fn end(self) -> Result<(), serde_json::Error> {
                self.finish()
            }
        }
    };
}
struct_kind!(SerializeStruct);
struct_kind!(SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// The definition the ids were first computed with: a key-sorted copy of `to_value`, printed.
    fn reference<T: Serialize>(v: &T) -> String {
        fn sorted(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let b: BTreeMap<&String, Value> =
                        m.iter().map(|(k, v)| (k, sorted(v))).collect();
                    Value::Object(b.into_iter().map(|(k, v)| (k.clone(), v)).collect())
                }
                Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
                other => other.clone(),
            }
        }
        serde_json::to_string(&sorted(&serde_json::to_value(v).expect("to_value")))
            .expect("to_string")
    }

    fn canonical<T: Serialize>(v: &T) -> String {
        let mut out = Vec::new();
        write_canonical(v, &mut out).expect("canonical");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn sorts_keys_at_every_depth_and_escapes_like_serde_json() {
        let v = json!({"b": [{"z": 1, "a": null}], "a": {"y\"": 2.5, "y#": "q\"\n", "": true}, "\u{e9}": -3});
        assert_eq!(canonical(&v), reference(&v));
        assert_eq!(canonical(&json!({"b": 1, "a": {}})), r#"{"a":{},"b":1}"#);
    }

    #[test]
    fn matches_the_reference_on_structs_enums_and_integer_keys() {
        #[derive(serde::Serialize)]
        #[serde(tag = "type")]
        enum Tagged {
            One { zeta: u8, alpha: Option<String> },
        }
        #[derive(serde::Serialize)]
        enum External {
            Unit,
            New(BTreeMap<u32, f32>),
            Tuple(i64, f64),
            Strukt { b: bool, a: char },
        }
        #[derive(serde::Serialize)]
        struct S {
            z: Vec<Tagged>,
            y: Vec<External>,
            nan: f64,
            bytes: Vec<u8>,
        }
        let s = S {
            z: vec![Tagged::One {
                zeta: 1,
                alpha: None,
            }],
            y: vec![
                External::Unit,
                External::New(BTreeMap::from([(10, 0.1), (9, 1.5)])),
                External::Tuple(-1, 1e300),
                External::Strukt { b: true, a: 'x' },
            ],
            nan: f64::NAN,
            bytes: vec![1, 2],
        };
        assert_eq!(canonical(&s), reference(&s));
    }

    #[test]
    fn a_trajectory_id_is_the_hash_of_the_reference_form() {
        use sha2::{Digest, Sha256};
        let t: crate::Trajectory = serde_json::from_value(json!({
            "task": "Sum notes.txt",
            "tools": [{"name": "read_file", "description": "Read a file.",
                       "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
            "steps": [
                {"type": "model", "content": "", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"z": 1, "path": "notes.txt"}}],
                 "timing": {"duration_ms": 12.5}},
                {"type": "tool_result", "call_id": "c1", "name": "read_file", "content": "1 2", "is_error": false}
            ],
            "final_answer": "3",
            "outcome": {"score": 1.0, "feedback": "ok"},
            "meta": {"source": "tooltune", "model": "m"}
        }))
        .expect("trajectory");
        let mut h = Sha256::new();
        h.update(b"tooltune-trajectory-v1\0");
        h.update(reference(&t).as_bytes());
        assert_eq!(t.id().as_str(), hex::encode(h.finalize()));
    }

    #[test]
    fn ids_from_cached_tool_json_are_the_hashes_of_the_reference_form() {
        use sha2::{Digest, Sha256};
        let want = |t: &crate::Trajectory| {
            let mut h = Sha256::new();
            h.update(b"tooltune-trajectory-v1\0");
            h.update(reference(t).as_bytes());
            hex::encode(h.finalize())
        };
        let mut t: crate::Trajectory = serde_json::from_value(json!({
            "task": "Find \"x\"",
            "system": "Be brief.",
            "tools": [
                {"name": "b", "description": "Second.", "input_schema": {"z": 1, "a": {"y": [2, {"d": 0, "c": 1}]}}},
                {"name": "a", "description": "", "input_schema": {}}
            ],
            "links": {"run_id": "r", "rollout": 1}
        }))
        .expect("trajectory");
        // Twice: the second time the tool JSON comes from the cache.
        assert_eq!(t.id().as_str(), want(&t));
        assert_eq!(t.id().as_str(), want(&t));
        // The same schema shared by another tool, and the same tool with another description: not the cached text.
        t.tools[1].input_schema = Arc::clone(&t.tools[0].input_schema);
        assert_eq!(t.id().as_str(), want(&t));
        t.tools[0].description = "Changed.".into();
        assert_eq!(t.id().as_str(), want(&t));
        // Tool hints sort between `task` and `tools`: the tool list is still appended last.
        t.tool_annotations.insert(
            "b".into(),
            crate::ToolAnnotations {
                read_only_hint: Some(false),
                destructive_hint: Some(true),
                idempotent_hint: Some(true),
                open_world_hint: None,
            },
        );
        t.tool_annotations
            .insert("a".into(), crate::ToolAnnotations::default());
        assert_eq!(t.id().as_str(), want(&t));
        t.tool_annotations.clear();
        t.tools.clear();
        t.system = None;
        assert_eq!(t.id().as_str(), want(&t));
    }

    /// The body writes steps through a wrapper that puts their entries in key order; every variant, with each
    /// optional entry present and absent, must hash as the reference form of the derived `Serialize` does.
    #[test]
    fn steps_of_every_shape_hash_as_the_reference_form() {
        use crate::{Step, Timing, ToolCall, Usage};
        use sha2::{Digest, Sha256};
        let timings = [
            Timing::default(),
            Timing {
                started_at: Some("2026-01-01T00:00:00Z".into()),
                duration_ms: None,
            },
            Timing {
                started_at: Some("t".into()),
                duration_ms: Some(1.5),
            },
        ];
        let mut steps = vec![Step::User {
            content: "hi \"there\"".into(),
        }];
        for timing in &timings {
            for content in [None, Some(String::new()), Some("done".to_string())] {
                for calls in [0, 2] {
                    for usage in [
                        None,
                        Some(Usage {
                            prompt_tokens: 3,
                            completion_tokens: 4,
                        }),
                    ] {
                        steps.push(Step::Model {
                            content: content.clone(),
                            tool_calls: (0..calls)
                                .map(|i| ToolCall {
                                    id: (i == 0).then(|| format!("c{i}")),
                                    name: "read_file".into(),
                                    arguments: json!({"z": i, "path": "a"}),
                                })
                                .collect(),
                            timing: timing.clone(),
                            usage,
                        });
                    }
                }
            }
            for call_id in [None, Some("c0".to_string())] {
                for is_error in [false, true] {
                    steps.push(Step::ToolResult {
                        call_id: call_id.clone(),
                        name: "read_file".into(),
                        content: "1\n2".into(),
                        is_error,
                        timing: timing.clone(),
                    });
                }
            }
        }
        let mut t: crate::Trajectory =
            serde_json::from_value(json!({"task": "t"})).expect("trajectory");
        t.steps = steps;
        let mut h = Sha256::new();
        h.update(b"tooltune-trajectory-v1\0");
        h.update(reference(&t).as_bytes());
        assert_eq!(t.id().as_str(), hex::encode(h.finalize()));
        // The body reads back as the same steps.
        let back: crate::Trajectory = serde_json::from_slice(&t.id_and_body().1).expect("body");
        assert_eq!(back.steps, t.steps);
    }

    fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-z\"\\\\#\u{0}-\u{1f}\u{7f} é한]{0,6}".prop_map(Value::String),
            // Longer than the eight bytes `write_str` tests at once, mostly plain.
            "[a-z \"\\\\\u{1}\n한]{0,40}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-c\"\\\\#\u{1}é]{0,3}", inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        // Every ASCII character (and a multi-byte one) at every place of a string longer than two words, so that
        // it lands in every lane of the eight-byte test and in the tail after the last whole word.
        let chars = (0u8..0x80).map(char::from).chain(['é', '한', '\u{10348}']);
        for c in chars {
            for len in [1, 7, 8, 9, 17, 23] {
                for at in 0..len {
                    let text: String = (0..len).map(|i| if i == at { c } else { 'x' }).collect();
                    let mut out = Vec::new();
                    write_str(&mut out, &text);
                    let want = serde_json::to_string(&text).expect("a string prints");
                    assert_eq!(
                        String::from_utf8(out).expect("UTF-8"),
                        want,
                        "{c:?} at {at} of {len}"
                    );
                }
            }
        }
        let mut out = Vec::new();
        write_str(&mut out, "");
        assert_eq!(out, b"\"\"");
    }

    proptest! {
        #[test]
        fn any_json_value_prints_as_the_reference_does(v in any_value()) {
            prop_assert_eq!(canonical(&v), reference(&v));
        }
    }
}

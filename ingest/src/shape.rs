//! Records laid out other than one per line: a document (JSON values one after another), a top-level array, or a
//! page envelope (`{"data": [...], "meta": {...}}`). [`detect`] tells the shape from the first bytes; [`Splitter`]
//! finds where each record lies in the bytes read so far, one step at a time, so that the reader can stop at any
//! chunk boundary and go on later.
//!
//! serde_json delimits every value (a record, a key, a skipped member): its `StreamDeserializer` reads one value
//! from a slice as `IgnoredAny`, building nothing, and says where it ended. Only the punctuation between values
//! (`[`, `,`, `]`, `{`, `:`, `}`) is matched here. A record is first tried with the crate's own scanner
//! (`scan.rs`, which reads strings sixteen bytes at a time and accepts only what serde_json accepts): serde_json
//! reads a string byte by byte, and on an array of Langfuse records that alone doubled the time of a read. Whatever the scanner gives up
//! on goes to serde_json, which decides every error. The records are left as byte ranges in the chunk buffer, to be
//! parsed in parallel by the same code as JSON Lines, so memory holds the records of two chunks, never the file.

use crate::{RecordError, Shape};
use serde::de::IgnoredAny;
use serde_json::Deserializer;

/// Where a record lies within its input's structure, for its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    /// 1-based column (in bytes) of the record's first byte.
    pub column: u64,
    pub index: Index,
}

/// A record's index in the list that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Index {
    /// A value of a document: its line and column say where it is.
    Value,
    /// An element of a top-level array.
    Array(u64),
    /// An element of a page's `data` list.
    Page(u64),
}

impl Index {
    /// `[3]`, `data[17]`, or nothing for a document's value.
    pub(crate) fn path(self) -> Option<String> {
        match self {
            Index::Value => None,
            Index::Array(i) => Some(format!("[{i}]")),
            Index::Page(i) => Some(format!("data[{i}]")),
        }
    }
}

impl Place {
    /// A record's error as its reader reported it, with the record's column and index added.
    pub(crate) fn apply(self, mut e: RecordError) -> RecordError {
        e.column = Some(self.column);
        if let Some(index) = self.index.path() {
            e.path = Some(match e.path.take() {
                Some(path) if path.starts_with('[') => format!("{index}{path}"),
                Some(path) => format!("{index}.{path}"),
                None => index,
            });
        }
        e
    }
}

/// How far one value at the start of a slice goes.
pub(crate) enum Extent {
    /// It ends this many bytes in.
    End(usize),
    /// The slice ends inside it: more input is needed.
    More,
    /// It is not JSON (or, at the end of the input, it is cut short).
    Bad(serde_json::Error),
}

/// How far the value starting at `bytes[0]` (not whitespace) goes; `eof` when no input follows `bytes`.
pub(crate) fn extent(bytes: &[u8], eof: bool) -> Extent {
    let mut values = Deserializer::from_slice(bytes).into_iter::<IgnoredAny>();
    match values.next() {
        Some(Ok(_)) => {
            let end = values.byte_offset();
            // A number (or a literal) that reaches the end of the slice may go on in the next read; objects,
            // arrays and strings end at their closing byte.
            let delimited = matches!(bytes.first(), Some(b'{' | b'[' | b'"'));
            if end == bytes.len() && !eof && !delimited {
                Extent::More
            } else {
                Extent::End(end)
            }
        }
        Some(Err(e)) if e.is_eof() && !eof => Extent::More,
        // The bytes may end inside a token (`1.`, `-`, `1e+`): serde_json calls that an invalid number, not an
        // end of input. A fault at the very end of bytes that go on is only that.
        Some(Err(e)) if !eof && offset_of(bytes, e.line(), e.column()) + 8 >= bytes.len() => {
            Extent::More
        }
        Some(Err(e)) => Extent::Bad(e),
        None if eof => Extent::End(bytes.len()),
        None => Extent::More,
    }
}

/// The byte offset of serde_json's 1-based (line, column) in `bytes`.
fn offset_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let line_start = match line {
        0 | 1 => 0,
        n => memchr::memchr_iter(b'\n', bytes)
            .nth(n - 2)
            .map_or(bytes.len(), |nl| nl + 1),
    };
    line_start + column
}

/// How far the object or array starting at `bytes[0]` goes, by the crate's scanner, looking at most `window`
/// bytes; `None` when the scanner gives up (the value is longer than the window, or something it leaves to
/// serde_json).
fn scanned_extent(bytes: &[u8], window: usize) -> Option<usize> {
    if !matches!(bytes.first(), Some(b'{' | b'[')) {
        return None;
    }
    // The scanner reads text; only the window is checked for UTF-8, so that a record costs its own length.
    let window = &bytes[..bytes.len().min(window)];
    let text = match std::str::from_utf8(window) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).ok()?,
    };
    crate::scan::Scan::new(text).value().ok().map(str::len)
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
pub(crate) fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// The shape of an input from its first bytes, or `None` when more bytes are needed to tell (`eof`: there are
/// no more).
///
/// `[` starts an array and an object whose first key is `data` a page (no format's record has that key). Any other
/// object is a record: JSON Lines when it ends on its first line with nothing but whitespace after it there, a
/// document otherwise (pretty-printed, or concatenated on one line). Anything else (a broken first line, a blank
/// input) is left to the JSON Lines reader, which reports it as it always has.
pub(crate) fn detect(head: &[u8], eof: bool) -> Option<Shape> {
    let i = skip_ws(head, 0);
    let Some(&first) = head.get(i) else {
        return eof.then_some(Shape::Jsonl);
    };
    match first {
        b'[' => return Some(Shape::Array),
        b'{' => {}
        _ => return Some(Shape::Jsonl),
    }
    let k = skip_ws(head, i + 1);
    if head.get(k) == Some(&b'"') {
        match extent(&head[k..], eof) {
            Extent::End(n) if &head[k..k + n] == b"\"data\"" => return Some(Shape::Page),
            Extent::More => return None,
            _ => {}
        }
    } else if k == head.len() && !eof {
        return None;
    }
    match extent(&head[i..], eof) {
        Extent::End(n) => {
            let end = i + n;
            if memchr::memchr(b'\n', &head[i..end]).is_some() {
                return Some(Shape::Document);
            }
            let rest = &head[end..];
            let line_rest = match memchr::memchr(b'\n', rest) {
                Some(nl) => &rest[..nl],
                // The first line goes on past what was read: whether another value follows on it is not known yet.
                None if !eof => return None,
                None => rest,
            };
            Some(if line_rest.iter().all(u8::is_ascii_whitespace) {
                Shape::Jsonl
            } else {
                Shape::Document
            })
        }
        Extent::More => None,
        Extent::Bad(_) => Some(Shape::Jsonl),
    }
}

/// The scanner's smallest window, in bytes.
const MIN_WINDOW: usize = 4096;

/// Where the splitter is in the structure, between two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between top-level values.
    Top,
    /// Just after a list's `[`: an element or `]`.
    ListStart,
    /// After a `,` in a list: an element.
    ListNext,
    /// After an element: `,` or `]`.
    AfterElement,
    /// Just after a page's `{`: a key or `}`.
    KeyFirst,
    /// After a `,` in a page: a key.
    KeyNext,
    /// After a page's member: `,` or `}`.
    AfterMember,
}

/// What one step found.
pub(crate) enum Step {
    /// Punctuation or a skipped value: go on from this offset.
    Moved(usize),
    /// A record lies at this range, starting at (line, column).
    Record {
        range: std::ops::Range<usize>,
        line: u64,
        place: Place,
    },
    /// The input ended where it may end.
    Done,
    /// The bytes end inside the value starting at `start`; `record` when that value is a record (which may be
    /// skipped unread when it is over the size limit).
    More { start: usize, record: bool },
    /// The structure is broken.
    Bad(Broken),
}

/// Why and where the structure is broken: the line and column where the broken value starts, and the record's
/// index when it is one.
#[derive(Debug)]
pub(crate) struct Broken {
    pub line: u64,
    pub column: u64,
    pub place: Option<String>,
    pub message: String,
}

/// Lines counted over the bytes passed so far, to give a record (or a fault) its line and column.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Position {
    /// The line at byte `at` of the input.
    line: u64,
    /// The input offset where that line starts.
    line_start: u64,
    /// The input offset counted up to.
    at: u64,
}

impl Position {
    fn new() -> Self {
        Position {
            line: 1,
            line_start: 0,
            at: 0,
        }
    }

    /// The line and column of `data[i]`, where `data[0]` is at input offset `base`; `i` never goes back.
    pub(crate) fn of(&mut self, data: &[u8], base: u64, i: usize) -> (u64, u64) {
        let from = (self.at.saturating_sub(base) as usize).min(i);
        let counted = &data[from..i];
        if let Some(last) = memchr::memrchr(b'\n', counted) {
            self.line += memchr::memchr_iter(b'\n', counted).count() as u64;
            self.line_start = base + (from + last + 1) as u64;
        }
        self.at = base + i as u64;
        (self.line, self.at - self.line_start + 1)
    }

    /// Moves past `bytes` bytes that start at input offset `from` (counted up to already) and were read without
    /// being kept: they hold `newlines` newlines, the last one `last_newline` bytes in.
    pub(crate) fn skip(&mut self, from: u64, bytes: u64, newlines: u64, last_newline: Option<u64>) {
        self.line += newlines;
        if let Some(nl) = last_newline {
            self.line_start = from + nl + 1;
        }
        self.at = from + bytes;
    }
}

/// Finds the records of a document, an array or a page in the bytes read so far.
pub(crate) struct Splitter {
    shape: Shape,
    state: State,
    /// Index of the next element in the current list.
    index: u64,
    /// Top-level values begun.
    values: u64,
    /// The current page has had its `data` list.
    data_seen: bool,
    /// Bytes the scanner looks at for the next record: twice the last record's length (records of a log are much
    /// alike), so that a longer one falls to serde_json rather than every record costing a large window.
    window: usize,
    pub(crate) position: Position,
}

impl Splitter {
    /// A splitter for `shape` (not `Auto` or `Jsonl`).
    pub(crate) fn new(shape: Shape) -> Self {
        Splitter {
            shape,
            state: State::Top,
            index: 0,
            values: 0,
            data_seen: false,
            window: MIN_WINDOW,
            position: Position::new(),
        }
    }

    /// The place of the next element, were it a record here.
    fn index(&self) -> Index {
        match self.shape {
            Shape::Document => Index::Value,
            Shape::Page => Index::Page(self.index),
            _ => Index::Array(self.index),
        }
    }

    /// A record skipped unread (over the size limit) took the place of the value the last step asked more bytes
    /// for.
    pub(crate) fn skipped_record(&mut self) -> Index {
        let index = self.index();
        if self.state == State::Top {
            self.values += 1;
        } else {
            self.index += 1;
            self.state = State::AfterElement;
        }
        index
    }

    /// One step from `data[pos..]` (`data[0]` is at input offset `base`; `eof`: nothing follows `data`).
    pub(crate) fn step(&mut self, data: &[u8], base: u64, pos: usize, eof: bool) -> Step {
        let i = skip_ws(data, pos);
        if i == data.len() {
            if !eof {
                return if i > pos {
                    Step::Moved(i)
                } else {
                    Step::More {
                        start: i,
                        record: false,
                    }
                };
            }
            let state = self.state;
            return match state {
                State::Top if self.values == 0 => {
                    let expected = match self.shape {
                        Shape::Array => "an array of records",
                        Shape::Page => "a page",
                        _ => "a record",
                    };
                    self.bad(
                        data,
                        base,
                        i,
                        None,
                        format!("the input holds no JSON value (an empty document; expected {expected})"),
                    )
                }
                State::Top => Step::Done,
                State::ListStart | State::ListNext | State::AfterElement => {
                    let what = if self.shape == Shape::Page { "the page's `data` list" } else { "the array" };
                    self.bad(
                        data,
                        base,
                        i,
                        None,
                        format!("the input ends inside {what}, after {} record(s): it is not closed by `]` (is the file cut short?)", self.index),
                    )
                }
                State::KeyFirst | State::KeyNext | State::AfterMember => self.bad(
                    data,
                    base,
                    i,
                    None,
                    "the input ends inside the page object: it is not closed by `}` (is the file cut short?)"
                        .into(),
                ),
            };
        }
        let b = data[i];
        let state = self.state;
        match state {
            State::Top => match self.shape {
                Shape::Array if b == b'[' => {
                    self.values += 1;
                    self.index = 0;
                    self.state = State::ListStart;
                    Step::Moved(i + 1)
                }
                Shape::Page if b == b'{' => {
                    self.values += 1;
                    self.data_seen = false;
                    self.state = State::KeyFirst;
                    Step::Moved(i + 1)
                }
                Shape::Array => self.unexpected(data, base, i, "`[` opening an array of records"),
                Shape::Page => {
                    self.unexpected(data, base, i, "`{` opening a page (`{\"data\": [...]}`)")
                }
                _ => {
                    let step = self.record(data, base, i, eof);
                    if matches!(step, Step::Record { .. }) {
                        self.values += 1;
                    }
                    step
                }
            },
            State::ListStart if b == b']' => self.close_list(i),
            State::ListStart | State::ListNext => self.record(data, base, i, eof),
            State::AfterElement => match b {
                b',' => {
                    self.state = State::ListNext;
                    Step::Moved(i + 1)
                }
                b']' => self.close_list(i),
                _ => self.unexpected(data, base, i, "`,` or `]` after a record"),
            },
            State::KeyFirst if b == b'}' => self.close_page(data, base, i),
            State::KeyFirst | State::KeyNext => self.member(data, base, i, eof),
            State::AfterMember => match b {
                b',' => {
                    self.state = State::KeyNext;
                    Step::Moved(i + 1)
                }
                b'}' => self.close_page(data, base, i),
                _ => self.unexpected(data, base, i, "`,` or `}` after a member of the page"),
            },
        }
    }

    fn close_list(&mut self, i: usize) -> Step {
        self.state = if self.shape == Shape::Page {
            State::AfterMember
        } else {
            State::Top
        };
        Step::Moved(i + 1)
    }

    fn close_page(&mut self, data: &[u8], base: u64, i: usize) -> Step {
        if !self.data_seen {
            return self.bad(
                data,
                base,
                i,
                None,
                "the page ends without a `data` list of records".into(),
            );
        }
        self.state = State::Top;
        Step::Moved(i + 1)
    }

    /// A record starting at `data[i]`.
    fn record(&mut self, data: &[u8], base: u64, i: usize, eof: bool) -> Step {
        let found = match scanned_extent(&data[i..], self.window) {
            Some(n) => Extent::End(n),
            None => extent(&data[i..], eof),
        };
        match found {
            Extent::End(n) => {
                self.window = n.saturating_mul(2).max(MIN_WINDOW);
                let (line, column) = self.position.of(data, base, i);
                let place = Place {
                    column,
                    index: self.index(),
                };
                if self.state != State::Top {
                    self.index += 1;
                    self.state = State::AfterElement;
                }
                Step::Record {
                    range: i..i + n,
                    line,
                    place,
                }
            }
            Extent::More => Step::More {
                start: i,
                record: true,
            },
            Extent::Bad(e) => {
                let place = self.index().path();
                self.json_fault(data, base, i, place, &e)
            }
        }
    }

    /// A member of a page object starting at `data[i]`: its key, `:`, and its value (the `data` list is entered,
    /// any other value skipped).
    fn member(&mut self, data: &[u8], base: u64, i: usize, eof: bool) -> Step {
        let more = Step::More {
            start: i,
            record: false,
        };
        if data[i] != b'"' {
            return self.unexpected(data, base, i, "a key (a string) in the page object");
        }
        let key_end = match extent(&data[i..], eof) {
            Extent::End(n) => i + n,
            Extent::More => return more,
            Extent::Bad(e) => return self.json_fault(data, base, i, None, &e),
        };
        let colon = skip_ws(data, key_end);
        if colon == data.len() {
            return if eof {
                self.unexpected(data, base, colon, "`:`")
            } else {
                more
            };
        }
        if data[colon] != b':' {
            return self.unexpected(data, base, colon, "`:` after a key");
        }
        let value = skip_ws(data, colon + 1);
        if value == data.len() {
            return if eof {
                self.unexpected(data, base, value, "a value")
            } else {
                more
            };
        }
        if &data[i..key_end] == b"\"data\"" {
            if data[value] != b'[' {
                let found = match data[value] {
                    b'{' => "an object",
                    b'"' => "a string",
                    b'n' => "null",
                    b't' | b'f' => "a boolean",
                    _ => "a number",
                };
                return self.bad(
                    data,
                    base,
                    value,
                    Some("data".into()),
                    format!("the page's `data` is not a list of records: it is {found}"),
                );
            }
            self.data_seen = true;
            self.index = 0;
            self.state = State::ListStart;
            return Step::Moved(value + 1);
        }
        match extent(&data[value..], eof) {
            Extent::End(n) => {
                self.state = State::AfterMember;
                Step::Moved(value + n)
            }
            Extent::More => more,
            Extent::Bad(e) => self.json_fault(data, base, value, None, &e),
        }
    }

    fn unexpected(&mut self, data: &[u8], base: u64, i: usize, expected: &str) -> Step {
        let found = match data.get(i) {
            None => "the end of the input".to_string(),
            Some(&b) if b.is_ascii_graphic() => format!("`{}`", b as char),
            Some(&b) => format!("byte 0x{b:02x}"),
        };
        self.bad(
            data,
            base,
            i,
            None,
            format!("expected {expected}, found {found}"),
        )
    }

    /// serde_json's fault in the value starting at `data[i]`: named where the value starts, the fault's own
    /// position in the message.
    fn json_fault(
        &mut self,
        data: &[u8],
        base: u64,
        i: usize,
        place: Option<String>,
        e: &serde_json::Error,
    ) -> Step {
        let (line, column) = self.position.of(data, base, i);
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let bare = text.strip_suffix(&suffix).unwrap_or(&text);
        let (fault_line, fault_column) = if e.line() <= 1 {
            (line, column + e.column().saturating_sub(1) as u64)
        } else {
            (line + e.line() as u64 - 1, e.column() as u64)
        };
        let message = if e.is_eof() {
            format!(
                "the input ends inside this value (is the file cut short?): {bare} (line {fault_line}, column {fault_column})"
            )
        } else {
            format!("not JSON: {bare} (line {fault_line}, column {fault_column})")
        };
        Step::Bad(Broken {
            line,
            column,
            place,
            message,
        })
    }

    fn bad(
        &mut self,
        data: &[u8],
        base: u64,
        i: usize,
        place: Option<String>,
        message: String,
    ) -> Step {
        let (line, column) = self.position.of(data, base, i);
        Step::Bad(Broken {
            line,
            column,
            place,
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record's text and place, splitting `input` as the reader does when reads end at `cut` bytes and at
    /// the end.
    fn split(shape: Shape, input: &str) -> Result<Vec<(String, u64, Place)>, String> {
        let data = input.as_bytes();
        let mut s = Splitter::new(shape);
        let mut out = Vec::new();
        let mut pos = 0;
        // Bytes made visible so far: grown one at a time, to stop the splitter at every possible place.
        let mut seen = 0;
        loop {
            let eof = seen == data.len();
            match s.step(&data[..seen], 0, pos, eof) {
                Step::Moved(p) => pos = p,
                Step::Record { range, line, place } => {
                    out.push((input[range.clone()].to_string(), line, place));
                    pos = range.end;
                }
                Step::Done => return Ok(out),
                Step::More { .. } => seen += 1,
                Step::Bad(b) => {
                    return Err(format!(
                        "{}:{}: {}{}",
                        b.line,
                        b.column,
                        b.place.map(|p| format!("{p}: ")).unwrap_or_default(),
                        b.message
                    ));
                }
            }
        }
    }

    fn texts(r: &[(String, u64, Place)]) -> Vec<&str> {
        r.iter().map(|(t, _, _)| t.as_str()).collect()
    }

    #[test]
    fn shapes_are_told_from_the_first_bytes() {
        assert_eq!(detect(b" \n[{\"task\": 1}]", true), Some(Shape::Array));
        assert_eq!(
            detect(b"{\"data\": [], \"meta\": {}}", true),
            Some(Shape::Page)
        );
        assert_eq!(detect(b"{\n  \"data\": 5}", true), Some(Shape::Page));
        assert_eq!(
            detect(b"{\"task\": \"a\"}\n{\"task\": \"b\"}\n", true),
            Some(Shape::Jsonl)
        );
        assert_eq!(
            detect(b"\n\n{\"task\": \"a\"}\r\n", true),
            Some(Shape::Jsonl)
        );
        assert_eq!(
            detect(b"{\n  \"task\": \"a\"\n}\n", true),
            Some(Shape::Document)
        );
        assert_eq!(
            detect(b"{\"task\": \"a\"}{\"task\": \"b\"}", true),
            Some(Shape::Document)
        );
        assert_eq!(
            detect(b"{\"task\": \"a\"} {\"task\": \"b\"}\n", true),
            Some(Shape::Document)
        );
        // A broken first line, or no JSON at all, is left to the JSON Lines reader's reports.
        assert_eq!(detect(b"{\"task\": tru}\n", true), Some(Shape::Jsonl));
        assert_eq!(detect(b"", true), Some(Shape::Jsonl));
        assert_eq!(detect(b"hello", true), Some(Shape::Jsonl));
        // Until the first record and its line end, there is no telling.
        assert_eq!(detect(b"{\"task\": \"a\"", false), None);
        assert_eq!(detect(b"{\"task\": \"a\"}  ", false), None);
        assert_eq!(detect(b"{\"da", false), None);
        assert_eq!(detect(b"  ", false), None);
    }

    #[test]
    fn the_scanner_and_serde_json_delimit_records_alike() {
        for text in [
            "{\"a\": [1, 2.5e3, \"x\\\"]\"], \"b\": {\"c\": null}} , {\"d\": 1}",
            "[{\"a\": \"éé café \\u00e9\"}, true]]",
            "{\"long\": \"0123456789abcdef0123456789abcdef\\n\"}\n",
        ] {
            let bytes = text.as_bytes();
            let Extent::End(want) = extent(bytes, true) else {
                panic!("{text}");
            };
            assert_eq!(scanned_extent(bytes, usize::MAX), Some(want), "{text}");
            // A window that cuts the value makes the scanner give up rather than guess.
            assert_eq!(scanned_extent(bytes, want - 1), None, "{text}");
        }
        // What the scanner gives up on (an escaped key) is still delimited, by serde_json.
        assert_eq!(scanned_extent(b"{\"\\u0061\": 1}", usize::MAX), None);
        let mut s = Splitter::new(Shape::Array);
        let data = b"[{\"\\u0061\": 1}]";
        assert!(matches!(s.step(data, 0, 0, true), Step::Moved(1)));
        assert!(matches!(s.step(data, 0, 1, true), Step::Record { range, .. } if range == (1..14)));
    }

    #[test]
    fn bytes_that_end_inside_a_token_ask_for_more() {
        for cut in [
            "{\"a\": 1.",
            "{\"a\": -",
            "{\"a\": 1e",
            "{\"a\": 1e+",
            "{\"a\": \"\\u00",
            "{\"a\": tr",
        ] {
            assert!(
                matches!(extent(cut.as_bytes(), false), Extent::More),
                "{cut}"
            );
            assert!(
                matches!(extent(cut.as_bytes(), true), Extent::Bad(_)),
                "{cut}"
            );
        }
        // A fault well before the end is one, whatever follows.
        let bad = "{\"a\": 1.x, \"b\": \"a long value that goes on\"";
        assert!(matches!(extent(bad.as_bytes(), false), Extent::Bad(_)));
    }

    #[test]
    fn a_document_of_several_values_gives_each_with_its_line_and_column() {
        let input = "{\"a\": 1}{\"b\": [1,\n 2]}  \n\n   {\"c\": \"}\"}\n";
        let r = split(Shape::Document, input).expect("splits");
        assert_eq!(
            texts(&r),
            ["{\"a\": 1}", "{\"b\": [1,\n 2]}", "{\"c\": \"}\"}"]
        );
        let at: Vec<(u64, u64)> = r.iter().map(|(_, l, p)| (*l, p.column)).collect();
        assert_eq!(at, [(1, 1), (1, 9), (4, 4)]);
        assert!(r.iter().all(|(_, _, p)| p.index == Index::Value));
    }

    #[test]
    fn arrays_and_pages_give_their_elements_with_indices() {
        let input = "[\n  {\"a\": 1},\n  {\"b\": 2}\n]\n[{\"c\": 3}]";
        let r = split(Shape::Array, input).expect("splits");
        assert_eq!(texts(&r), ["{\"a\": 1}", "{\"b\": 2}", "{\"c\": 3}"]);
        let idx: Vec<Index> = r.iter().map(|(_, _, p)| p.index).collect();
        assert_eq!(idx, [Index::Array(0), Index::Array(1), Index::Array(0)]);
        assert_eq!((r[1].1, r[1].2.column), (3, 3));
        assert!(split(Shape::Array, "[]").expect("empty").is_empty());

        let page = "{\"meta\": {\"page\": 1, \"totalPages\": 1}, \"data\": [{\"id\": \"x\"}, {\"id\": \"]\"}], \"x\": null}";
        let r = split(Shape::Page, page).expect("splits");
        assert_eq!(texts(&r), ["{\"id\": \"x\"}", "{\"id\": \"]\"}"]);
        assert_eq!(r[1].2.index, Index::Page(1));
    }

    #[test]
    fn broken_structures_are_named_where_they_are() {
        let e = split(Shape::Array, "[{\"a\": 1},\n {\"b\": 2").expect_err("truncated");
        assert!(
            e.starts_with("2:2: [1]: the input ends inside this value"),
            "{e}"
        );
        let e = split(Shape::Array, "[{\"a\": 1}").expect_err("not closed");
        assert!(e.contains("not closed by `]`"), "{e}");
        let e = split(Shape::Array, "[{\"a\": 1},]").expect_err("trailing comma");
        assert!(e.starts_with("1:11: [1]: not JSON"), "{e}");
        let e = split(Shape::Array, "[{\"a\": 1} {\"b\": 1}]").expect_err("no comma");
        assert_eq!(e, "1:11: expected `,` or `]` after a record, found `{`");
        let e = split(Shape::Page, "{\"data\": {\"a\": 1}}").expect_err("data not a list");
        assert_eq!(
            e,
            "1:10: data: the page's `data` is not a list of records: it is an object"
        );
        let e = split(Shape::Page, "{\"meta\": {}}").expect_err("no data");
        assert!(e.contains("without a `data` list"), "{e}");
        let e = split(Shape::Document, " \n ").expect_err("empty");
        assert!(e.starts_with("2:2: the input holds no JSON value"), "{e}");
        let e = split(Shape::Array, "{\"a\": 1}").expect_err("not an array");
        assert!(e.starts_with("1:1: expected `[`"), "{e}");
    }
}

//! Readers that turn trace files (tooltune JSONL, OpenAI chat requests, Langfuse traces, OTLP/JSON GenAI spans)
//! into [`tooltune_core::Trajectory`] values, in bounded memory and in parallel.
//!
//! The entry point is [`ChunkReader`]: it reads a chunk of raw records sequentially (lines split on `\n` with
//! memchr, or the values of a JSON document, array or paged envelope, delimited by serde_json; see [`Shape`]), then
//! parses the chunk's records in parallel with rayon, preserving order, while the next chunk is read; it never holds
//! more than two chunks. Gzip and zstd input is decompressed as it is read.
//! A bad record is data ([`Parsed::result`] is `Err(RecordError)`), not an error of the read: one broken line in a
//! million must not stop an ingest. Only IO failures and an undetectable format are [`IngestError`]s.
//!
//! The mapping rules of each format are documented in `docs/trace-format.md` at the workspace root.

mod common;
mod detect;
mod input;
mod langfuse;
#[cfg(test)]
mod mutate;
mod openai;
mod otel;
mod reader;
mod scan;
mod shape;
mod tooltune;

use std::fmt;
use std::str::FromStr;

pub use otel::{OUTCOME_FEEDBACK, OUTCOME_SCORE, OUTCOME_SUCCESS};
pub use reader::ChunkReader;
use tooltune_core::Trajectory;

/// A trace format this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// tooltune's own JSONL: one `Trajectory` per line, exactly its serde shape.
    Tooltune,
    /// One OpenAI chat-completions request per line (`model`, `messages`, `tools`), optionally with its response.
    OpenAi,
    /// One Langfuse trace per line, as `GET /api/public/traces/{id}` returns it (observations and scores embedded).
    Langfuse,
    /// One OTLP/JSON `{"resourceSpans": [...]}` request per line (the collector's file exporter), GenAI spans.
    Otel,
}

impl Format {
    /// Every format, in the order they are listed to users.
    pub const ALL: [Format; 4] = [
        Format::Tooltune,
        Format::OpenAi,
        Format::Langfuse,
        Format::Otel,
    ];

    /// The name used on the command line and in `meta.source`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Tooltune => "tooltune",
            Format::OpenAi => "openai",
            Format::Langfuse => "langfuse",
            Format::Otel => "otel",
        }
    }
}

fn known_format_names() -> String {
    Format::ALL
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = IngestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        Format::ALL
            .into_iter()
            .find(|f| f.name() == wanted)
            .ok_or_else(|| IngestError::UnknownFormatName {
                name: s.to_string(),
                known: known_format_names(),
            })
    }
}

/// Whether to detect the format from the first record or to take the caller's word for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FormatChoice {
    /// Detect from the keys of the first non-blank record.
    #[default]
    Auto,
    /// Read every record as this format.
    Fixed(Format),
}

impl fmt::Display for FormatChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatChoice::Auto => f.write_str("auto"),
            FormatChoice::Fixed(format) => format.fmt(f),
        }
    }
}

impl FromStr for FormatChoice {
    type Err = IngestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(FormatChoice::Auto);
        }
        s.parse::<Format>()
            .map(FormatChoice::Fixed)
            .map_err(|_| IngestError::UnknownFormatName {
                name: s.to_string(),
                known: format!("auto, {}", known_format_names()),
            })
    }
}

/// How the records of an input are laid out. The format says what one record is; the shape says how records
/// follow one another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Shape {
    /// Detect from the first bytes: `[` is an array, an object whose first key is `data` a page, a first record
    /// that ends on its first line JSON Lines, and any other JSON a document.
    #[default]
    Auto,
    /// One record per line.
    Jsonl,
    /// JSON values one after another: one whole (pretty-printed or compact) record, or several concatenated, with
    /// or without whitespace between them.
    Document,
    /// A top-level JSON array of records (several arrays one after another are read in turn).
    Array,
    /// The paged envelope of a producer's API, `{"data": [records...], "meta": {...}}` (Langfuse's public API);
    /// keys other than `data` are skipped. Several pages one after another are read in turn.
    Page,
}

impl Shape {
    /// Every shape, in the order they are listed to users.
    pub const ALL: [Shape; 5] = [
        Shape::Auto,
        Shape::Jsonl,
        Shape::Document,
        Shape::Array,
        Shape::Page,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Auto => "auto",
            Shape::Jsonl => "jsonl",
            Shape::Document => "document",
            Shape::Array => "array",
            Shape::Page => "page",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = IngestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        // `concatenated` and `json` are what users call a document of several values, or of one.
        let wanted = match wanted.as_str() {
            "concatenated" | "json" => "document",
            other => other,
        };
        Shape::ALL
            .into_iter()
            .find(|f| f.name() == wanted)
            .ok_or_else(|| IngestError::UnknownShapeName {
                name: s.to_string(),
                known: Shape::ALL
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// Limits of a read. The defaults suit files of any size; lower them for untrusted HTTP bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// A line longer than this is reported as a [`RecordError`] and skipped without being buffered.
    pub max_record_bytes: usize,
    /// How many raw lines one chunk holds at most (the unit of parallel parsing).
    pub chunk_records: usize,
    /// How many bytes of raw lines one chunk holds at most; a chunk ends at whichever limit comes first, so a
    /// file of large records does not make a chunk of `chunk_records` of them.
    pub chunk_bytes: usize,
    /// How records are laid out; [`Shape::Auto`] detects it from the first bytes.
    pub shape: Shape,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            max_record_bytes: 64 * 1024 * 1024,
            chunk_records: 2048,
            // 8 rather than 32 MiB: the same throughput (50,000 bench records of each format, alternating runs),
            // and a Langfuse import's peak RSS 153 -> 92 MB.
            chunk_bytes: 8 * 1024 * 1024,
            shape: Shape::Auto,
        }
    }
}

/// Why one record could not become a trajectory. The caller prefixes the file name when showing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// 1-based line where the record starts.
    pub line: u64,
    /// 1-based column (in bytes) where the record starts, for records that are not a line of their own (those of
    /// a document, an array or a page); `None` in JSON Lines.
    pub column: Option<u64>,
    /// JSON path of the offending field, like `messages[3].tool_calls[0].function.arguments`; for a record of an
    /// array or a page it starts with the record's index there (`[4].messages[3]`, `data[17].observations[2]`).
    pub path: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl RecordError {
    pub(crate) fn new(line: u64, path: Option<String>, message: impl Into<String>) -> Self {
        RecordError {
            line,
            column: None,
            path,
            message: message.into(),
        }
    }

    pub(crate) fn at(line: u64, path: impl Into<String>, message: impl Into<String>) -> Self {
        RecordError::new(line, Some(path.into()), message)
    }

    /// The JSON path and what is wrong, without the line: for a report that names the file and line itself
    /// (`f.jsonl:4: spans[0].traceId: ...`), where the full form would name the line twice. A record that does not
    /// start a line names its column first (`f.json:3: column 5, data[17].observations[2].input: ...`).
    pub fn without_line(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_what(&mut s);
        s
    }

    fn write_what(&self, w: &mut impl fmt::Write) -> fmt::Result {
        if let Some(column) = self.column {
            write!(w, "column {column}, ")?;
        }
        match &self.path {
            Some(path) => write!(w, "{path}: {}", self.message),
            None => w.write_str(&self.message),
        }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        self.write_what(f)
    }
}

impl std::error::Error for RecordError {}

/// One record's outcome, in file order: the validated trajectory (or, from [`ChunkReader::next_chunk_with`], what
/// the caller made of it), or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed<T = Trajectory> {
    /// 1-based line where the record starts (for OTLP, the line that completed the trace).
    pub line: u64,
    /// The trajectory, validated, or why there is none.
    pub result: Result<T, RecordError>,
}

/// Failures of a read as a whole. A bad record is not one of these: it is a [`Parsed`] with a [`RecordError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// Reading the input failed (for compressed input, also: its compressed data is corrupt or cut short).
    #[error("{source_name}{}: {source}", at_line(.line))]
    Io {
        /// The file name (or HTTP body name) being read.
        source_name: String,
        /// The line being read when it failed (of the decompressed text), if reading had begun.
        line: Option<u64>,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// `Auto` detection could not tell the format from the first record.
    #[error("{source_name}: cannot tell the trace format: {reason}")]
    UnknownFormat {
        /// The file name (or HTTP body name) being read.
        source_name: String,
        /// What the first record looked like and which formats are known.
        reason: String,
    },
    /// The input's structure is broken where its records are to be found (an array not closed, a page whose
    /// `data` is not a list, a value that is not JSON, an empty document): no record after this place can be
    /// delimited, so the read stops, whatever the caller does with invalid records.
    #[error("{source_name}:{line}:{column}: {}{message}", place_prefix(.place))]
    Malformed {
        /// The file name (or HTTP body name) being read.
        source_name: String,
        /// 1-based line where the broken value (the record, or the structure around records) starts.
        line: u64,
        /// 1-based column (in bytes) where it starts.
        column: u64,
        /// The index of the record, when the break is inside one (`[3]`, `data[17]`).
        place: Option<String>,
        /// What is wrong, with the position of the fault itself when it lies elsewhere.
        message: String,
    },
    /// A shape name that is not one of the known shapes.
    #[error("unknown input shape `{name}` (known shapes: {known})")]
    UnknownShapeName {
        /// The name given.
        name: String,
        /// The names that would have been accepted.
        known: String,
    },
    /// A format name that is not one of the known formats.
    #[error("unknown trace format `{name}` (known formats: {known})")]
    UnknownFormatName {
        /// The name given.
        name: String,
        /// The names that would have been accepted.
        known: String,
    },
}

/// `:N` for an error's line, or nothing when there is none.
fn at_line(line: &Option<u64>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

/// `data[17]: ` for a record's index, or nothing when there is none.
fn place_prefix(place: &Option<String>) -> String {
    place
        .as_deref()
        .map(|p| format!("{p}: "))
        .unwrap_or_default()
}

//! [`ChunkReader`]: sequential splitting of the input into bounded chunks of records (lines, or the values of a
//! document, an array or a page), parallel parsing of each chunk.

use crate::common::with_origin;
use crate::input::{Prefixed, decompressed};
use crate::shape::Splitter;
use crate::{Format, FormatChoice, IngestError, Parsed, ReadOptions, RecordError, Shape};
use crate::{detect, langfuse, openai, otel, shape, tooltune};
use lines::{Lines, READ_BYTES, RawChunk, RawKind, RawRec};
use rayon::prelude::*;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use tooltune_core::Trajectory;

mod lines;
#[cfg(test)]
mod tests;

/// Reads trace records from a file or any buffered reader, a chunk at a time.
///
/// While one chunk is parsed, the raw records of the next are read on another thread: reading is sequential, and
/// done between parses it left a core idle for a tenth of an ingest. Memory is bounded by two chunks
/// (`chunk_records` records or `chunk_bytes` bytes each, whichever comes first; a chunk holds at least one whole
/// record) plus, for OTLP input, the spans of traces whose root span has not arrived yet. That holds for every
/// [`Shape`]: the records of an array or a page are delimited in the bytes read, never built into one value.
pub struct ChunkReader<R: BufRead + Send> {
    lines: Lines<Prefixed<R>>,
    shape: Shape,
    format: Option<Format>,
    done: bool,
    /// The chunk read ahead while the previous one was parsed, or the read failure to report next.
    ahead: Option<Result<RawChunk, IngestError>>,
    /// A chunk's buffers, kept for reuse.
    spare: RawChunk,
    otel: otel::Assembler,
}

impl ChunkReader<Box<dyn BufRead + Send>> {
    /// Opens a file, decompressing it when it is gzip or zstd (by its extension, `.gz` or `.zst`, and by its first
    /// bytes), and detects (or takes) its shape and format.
    pub fn open(path: &Path, choice: FormatChoice, opts: ReadOptions) -> Result<Self, IngestError> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| IngestError::Io {
            source_name: name.clone(),
            line: None,
            source,
        })?;
        // Large reads amortise the syscall cost; lines are split out of this buffer without copying twice.
        ChunkReader::decompressing(BufReader::with_capacity(1 << 20, file), &name, choice, opts)
    }

    /// [`new`](ChunkReader::new) for a reader that may be gzip or zstd (standard input, an HTTP body): it is
    /// decompressed when its first bytes say so, or when `source_name` ends in `.gz` or `.zst`.
    pub fn decompressing(
        reader: impl BufRead + Send + 'static,
        source_name: &str,
        choice: FormatChoice,
        opts: ReadOptions,
    ) -> Result<Self, IngestError> {
        let input = decompressed(reader, source_name)?;
        ChunkReader::new(input, source_name, choice, opts)
    }
}

impl<R: BufRead + Send> ChunkReader<R> {
    /// Wraps a reader (an HTTP body, a decompressor, ...) and detects (or takes) its shape and format, reading at
    /// most the first record (for JSON Lines) or the first chunk of records. `source_name` is used in errors.
    pub fn new(
        reader: R,
        source_name: &str,
        choice: FormatChoice,
        opts: ReadOptions,
    ) -> Result<Self, IngestError> {
        let opts = ReadOptions {
            max_record_bytes: opts.max_record_bytes.max(1),
            chunk_records: opts.chunk_records.max(1),
            chunk_bytes: opts.chunk_bytes.max(1),
            shape: opts.shape,
        };
        let mut input = Prefixed::new(reader);
        let shape = match opts.shape {
            Shape::Auto => detect_shape(&mut input, &opts).map_err(|source| IngestError::Io {
                source_name: source_name.to_string(),
                line: Some(1),
                source,
            })?,
            shape => shape,
        };
        let mut r = ChunkReader {
            lines: Lines {
                reader: input,
                source_name: source_name.to_string(),
                opts,
                next_line: 1,
                eof: false,
                first: None,
                pending: Vec::new(),
                read_bytes: READ_BYTES,
                split: (shape != Shape::Jsonl).then(|| Splitter::new(shape)),
                base: 0,
            },
            shape,
            format: None,
            done: false,
            ahead: None,
            spare: RawChunk::default(),
            otel: otel::Assembler::default(),
        };
        if shape != Shape::Jsonl {
            // The first chunk is read now, to detect the format from its first record; it is the first to be
            // parsed. A chunk without records (only a page's other members so far) is not kept.
            let mut chunk = RawChunk::default();
            loop {
                r.lines.fill(&mut chunk)?;
                if !chunk.recs.is_empty() || chunk.last {
                    break;
                }
            }
            let Some(first) = chunk.recs.first() else {
                r.done = true;
                return Ok(r);
            };
            r.format = Some(r.format_of(choice, first, &chunk.data)?);
            r.ahead = Some(Ok(chunk));
            return Ok(r);
        }
        let mut buf = Vec::new();
        let Some(first) = r.lines.read_record(&mut buf)? else {
            r.done = true;
            return Ok(r);
        };
        r.format = Some(r.format_of(choice, &first, &buf)?);
        r.lines.first = Some((first, buf));
        Ok(r)
    }

    /// The format chosen, or detected from the first record (`data` holds its bytes).
    fn format_of(
        &self,
        choice: FormatChoice,
        first: &RawRec,
        data: &[u8],
    ) -> Result<Format, IngestError> {
        match choice {
            FormatChoice::Fixed(f) => Ok(f),
            FormatChoice::Auto => {
                let detected = match &first.kind {
                    RawKind::Data(range) => detect::detect(first.line, &data[range.clone()]),
                    RawKind::Oversize(n) => Err(format!(
                        "the first record (line {}) is {n} bytes, over the limit of {} bytes",
                        first.line, self.lines.opts.max_record_bytes
                    )),
                };
                detected.map_err(|reason| IngestError::UnknownFormat {
                    source_name: self.lines.source_name.clone(),
                    reason,
                })
            }
        }
    }

    /// The format being read; `None` only for an empty input (no record).
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    /// The shape being read: the one asked for, or the one detected (never [`Shape::Auto`]; an empty input reads
    /// as JSON Lines).
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The name given for the input, as used in errors.
    pub fn source_name(&self) -> &str {
        &self.lines.source_name
    }

    /// How many OTLP traces are held waiting for their root span (always 0 for the other formats).
    pub fn pending_traces(&self) -> usize {
        self.otel.pending_traces()
    }

    /// The next chunk of results in file order, or `None` when the input is exhausted. IO failures are `Err`;
    /// bad records are `Ok` entries with a [`RecordError`]. A returned chunk is never empty.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<Parsed>>, IngestError> {
        self.next_chunk_with(&|t| t)
    }

    /// [`next_chunk`](Self::next_chunk) with `map` applied to every valid trajectory as part of the parallel
    /// parse, on the thread that parsed it. A caller that turns trajectories into something else (the store's
    /// rows) does so while the record is still in that core's cache, and frees it on the thread that allocated it:
    /// a separate parallel pass over the chunk spent a quarter of its time in cross-thread frees.
    pub fn next_chunk_with<T, F>(&mut self, map: &F) -> Result<Option<Vec<Parsed<T>>>, IngestError>
    where
        T: Send,
        F: Fn(Trajectory) -> T + Sync,
    {
        let Some(format) = self.format else {
            return Ok(None);
        };
        while !self.done {
            let chunk = match self.ahead.take() {
                Some(read) => read?,
                None => {
                    let mut chunk = std::mem::take(&mut self.spare);
                    self.lines.fill(&mut chunk)?;
                    chunk
                }
            };
            let at_eof = chunk.last;
            let max = self.lines.opts.max_record_bytes;
            let lines = &mut self.lines;
            let mut next = std::mem::take(&mut self.spare);
            // Parse this chunk while the next one is read (unless this one was the last).
            let (out, ahead) = rayon::join(
                || parse_chunk(format, &chunk, max, map),
                || (!at_eof).then(|| lines.fill(&mut next).map(|()| next)),
            );
            self.ahead = ahead;
            let out: Vec<Parsed<T>> = match out {
                ChunkOut::Trajectories(out) => out,
                // Traces are grouped in file order, on this thread, which needs the chunk's text for the spans that
                // must wait for a later line.
                ChunkOut::Spans(lines) => self.otel.process(lines, &chunk.data, at_eof, map),
            };
            self.spare = chunk;
            if at_eof {
                self.done = true;
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
        Ok(None)
    }
}

/// What parsing one chunk gives: trajectories, or (OTLP) each line's traces, still to be grouped across lines.
enum ChunkOut<T> {
    Trajectories(Vec<Parsed<T>>),
    Spans(Vec<otel::LineOut<T>>),
}

/// Parses a chunk's lines in parallel, in order.
fn parse_chunk<T, F>(format: Format, chunk: &RawChunk, max: usize, map: &F) -> ChunkOut<T>
where
    T: Send,
    F: Fn(Trajectory) -> T + Sync,
{
    let data = &chunk.data;
    match line_parser(format) {
        Some(parse) => ChunkOut::Trajectories(
            chunk
                .recs
                .par_iter()
                .map(|r| Parsed {
                    line: r.line,
                    result: match r.place {
                        None => text_of(r, data, max).and_then(|t| parse(t, r.line)),
                        // Positions in the record's errors are given in the input, and its column and index added.
                        Some(place) => with_origin(Some((r.line, place.column)), || {
                            text_of(r, data, max).and_then(|t| parse(t, r.line))
                        })
                        .map_err(|e| place.apply(e)),
                    }
                    .map(map),
                })
                .collect(),
        ),
        None => ChunkOut::Spans(
            chunk
                .recs
                .par_iter()
                .map(|r| {
                    let range = match &r.kind {
                        RawKind::Data(range) => range.clone(),
                        RawKind::Oversize(_) => 0..0,
                    };
                    match r.place {
                        None => otel::read_line(text_of(r, data, max), r.line, range, map),
                        Some(place) => with_origin(Some((r.line, place.column)), || {
                            otel::read_line(text_of(r, data, max), r.line, range, map)
                        })
                        .placed(place),
                    }
                })
                .collect(),
        ),
    }
}

/// Reads the first bytes of an input until its shape can be told (see [`shape::detect`]). A first record longer
/// than the limit is left to the JSON Lines reader, which reports it without keeping it.
fn detect_shape<R: Read>(input: &mut Prefixed<R>, opts: &ReadOptions) -> io::Result<Shape> {
    let mut eof = false;
    loop {
        if let Some(shape) = shape::detect(input.head(), eof) {
            return Ok(shape);
        }
        if eof || input.head().len() > opts.max_record_bytes {
            return Ok(Shape::Jsonl);
        }
        // Twice what is held: a long first record is then scanned O(log n) times, not once per read. The first
        // read takes whatever comes, so that a pipe's first line is looked at as soon as it arrives.
        let want = input.head().len().saturating_mul(2).max(1);
        eof = input.look_ahead(want)?;
    }
}

/// The record's text, or why it has none (over the limit, not UTF-8).
fn text_of<'a>(r: &RawRec, data: &'a [u8], max: usize) -> Result<&'a str, RecordError> {
    match &r.kind {
        RawKind::Oversize(n) => Err(RecordError::new(
            r.line,
            None,
            format!("record is {n} bytes, over the limit of {max} bytes"),
        )),
        RawKind::Data(range) => std::str::from_utf8(&data[range.clone()]).map_err(|e| {
            RecordError::new(
                r.line,
                None,
                format!(
                    "invalid UTF-8 at byte offset {} of the {}",
                    e.valid_up_to(),
                    if r.place.is_some() { "record" } else { "line" }
                ),
            )
        }),
    }
}

type LineParser = fn(&str, u64) -> Result<Trajectory, RecordError>;

/// The parser of formats whose every line is one trajectory; `None` for OTLP, whose lines are grouped by trace.
fn line_parser(format: Format) -> Option<LineParser> {
    match format {
        Format::Tooltune => Some(tooltune::parse),
        Format::OpenAi => Some(openai::parse),
        Format::Langfuse => Some(langfuse::parse),
        Format::Otel => None,
    }
}

//! [`ChunkReader`]: sequential splitting of the input into bounded chunks of records (lines, or the values of a
//! document, an array or a page), parallel parsing of each chunk.

use crate::common::with_origin;
use crate::input::{Prefixed, decompressed};
use crate::shape::{Place, Splitter, Step};
use crate::{Format, FormatChoice, IngestError, Parsed, ReadOptions, RecordError, Shape};
use crate::{detect, langfuse, openai, otel, shape, tooltune};
use memchr::memchr;
use rayon::prelude::*;
use serde::Deserialize;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::ops::Range;
use std::path::Path;
use tooltune_core::Trajectory;

/// One raw line of the input: its bytes in the chunk buffer, or only its length when it was over the limit.
#[derive(Debug, Clone)]
enum RawKind {
    Data(Range<usize>),
    Oversize(u64),
}

#[derive(Debug, Clone)]
struct RawRec {
    line: u64,
    kind: RawKind,
    /// Where the record lies in a document, an array or a page; `None` for a line of JSON Lines.
    place: Option<Place>,
}

/// Raw lines of one chunk: their bytes back to back and where each one lies.
#[derive(Default)]
struct RawChunk {
    data: Vec<u8>,
    recs: Vec<RawRec>,
    /// The input ended with this chunk.
    last: bool,
}

/// The sequential half of a read: splitting the input into lines, or (with a splitter) into the records of a
/// document, an array or a page.
struct Lines<R> {
    reader: R,
    source_name: String,
    opts: ReadOptions,
    /// Number of the next line to be read, 1-based.
    next_line: u64,
    eof: bool,
    /// The record read for format detection, handed out first.
    first: Option<(RawRec, Vec<u8>)>,
    /// Bytes read after the last line a chunk took: the start of the next chunk's first line.
    pending: Vec<u8>,
    /// Bytes asked of the reader at a time ([`READ_BYTES`]; tests ask for few, to cut lines anywhere).
    read_bytes: usize,
    /// For a shape other than JSON Lines: where the records are.
    split: Option<Splitter>,
    /// Input offset of the first byte of the chunk being filled (of `pending`, between fills); the splitter's
    /// positions are counted in input offsets.
    base: u64,
}

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

/// Copies `bytes` into `data` at `filled`, growing it if need be.
fn put(data: &mut Vec<u8>, filled: &mut usize, bytes: &[u8]) {
    let end = *filled + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[*filled..end].copy_from_slice(bytes);
    *filled = end;
}

/// Bytes asked of the reader at a time: large reads amortise the syscalls, and a `BufReader` whose own buffer is
/// empty (as it is after the first line) reads them straight into the chunk.
const READ_BYTES: usize = 1 << 20;

/// Bytes reserved in a chunk buffer beyond `chunk_bytes`: the line that crosses the limit is kept whole, and most
/// lines are far shorter than this.
const CHUNK_SLACK: usize = 1 << 20;

impl<R: BufRead> Lines<R> {
    /// Reads raw lines (or a shape's records) into `chunk` (emptied first) until a limit is reached or the input
    /// ends.
    fn fill(&mut self, chunk: &mut RawChunk) -> Result<(), IngestError> {
        if self.split.is_some() {
            return self.fill_split(chunk);
        }
        chunk.recs.clear();
        // A chunk that once held a huge record should not pin that memory for the rest of the read.
        if chunk.data.capacity() > 2 * self.opts.chunk_bytes.max(self.opts.max_record_bytes) {
            chunk.data = Vec::new();
        }
        // Room for a whole chunk up front: grown by doubling instead, the buffer was copied five times over on its
        // way to its size, each copy into fresh pages the kernel had to zero first (a tenth of a second at the start
        // of every import). Pages are only committed as input is read into them, so a small input costs little.
        let room = self.opts.chunk_bytes.saturating_add(CHUNK_SLACK);
        chunk.data.reserve(room.saturating_sub(chunk.data.len()));
        // Input is read straight into the chunk, a large block at a time, and split into lines where it lies:
        // copied out of the reader's buffer line by line instead, every byte of the input was copied once more (a
        // twentieth of the CPU time of importing OTLP, whose records are the largest). `data` stays initialised
        // (zeroed once, when it first grows) so that reads can go into it; `filled` is how much of it this chunk
        // holds.
        let mut filled = 0;
        if let Some((rec, bytes)) = self.first.take() {
            let kind = match rec.kind {
                RawKind::Data(range) => {
                    put(&mut chunk.data, &mut filled, &bytes[range]);
                    RawKind::Data(0..filled)
                }
                oversize => oversize,
            };
            chunk.recs.push(RawRec {
                line: rec.line,
                kind,
                place: None,
            });
        }
        let max = self.opts.max_record_bytes;
        let mut line_start = filled;
        put(&mut chunk.data, &mut filled, &self.pending);
        self.pending.clear();
        let mut searched = line_start;
        loop {
            while !self.chunk_full(chunk, line_start)
                && let Some(nl) =
                    memchr(b'\n', &chunk.data[searched..filled]).map(|at| searched + at)
            {
                self.take_line(chunk, line_start..nl);
                line_start = nl + 1;
                searched = line_start;
            }
            if self.chunk_full(chunk, line_start) {
                self.pending
                    .extend_from_slice(&chunk.data[line_start..filled]);
                chunk.last = self.eof && self.pending.is_empty();
                return Ok(());
            }
            searched = filled;
            if filled - line_start > max {
                // Over the limit: the rest of the line is read to its newline and dropped, never kept.
                let mut total = (filled - line_start) as u64;
                filled = line_start;
                searched = line_start;
                total += self.skip_line()?;
                chunk.recs.push(RawRec {
                    line: self.next_line,
                    kind: RawKind::Oversize(total),
                    place: None,
                });
                self.next_line += 1;
                continue;
            }
            if self.eof {
                // The last line, without a newline.
                if filled > line_start {
                    self.take_line(chunk, line_start..filled);
                }
                chunk.last = true;
                return Ok(());
            }
            let end = filled.saturating_add(self.read_bytes);
            if chunk.data.len() < end {
                chunk.data.resize(end, 0);
            }
            let read = loop {
                match self.reader.read(&mut chunk.data[filled..end]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(IngestError::Io {
                            source_name: self.source_name.clone(),
                            line: Some(self.next_line),
                            source,
                        });
                    }
                }
            };
            if read == 0 {
                self.eof = true;
            }
            filled += read;
        }
    }

    /// [`fill`](Self::fill) for a document, an array or a page: the splitter finds the records in the bytes read,
    /// and more is read whenever the bytes end inside a value. A record over the size limit is read through to its
    /// end without being kept.
    fn fill_split(&mut self, chunk: &mut RawChunk) -> Result<(), IngestError> {
        chunk.recs.clear();
        chunk.last = false;
        if chunk.data.capacity() > 2 * self.opts.chunk_bytes.max(self.opts.max_record_bytes) {
            chunk.data = Vec::new();
        }
        let room = self.opts.chunk_bytes.saturating_add(CHUNK_SLACK);
        chunk.data.reserve(room.saturating_sub(chunk.data.len()));
        let mut filled = 0;
        put(&mut chunk.data, &mut filled, &self.pending);
        self.pending.clear();
        let Lines {
            reader,
            source_name,
            opts,
            eof,
            pending,
            read_bytes,
            split,
            base,
            ..
        } = self;
        let Some(split) = split.as_mut() else {
            return Ok(());
        };
        let malformed = |b: shape::Broken| IngestError::Malformed {
            source_name: source_name.clone(),
            line: b.line,
            column: b.column,
            place: b.place,
            message: b.message,
        };
        let mut pos = 0;
        loop {
            if chunk.recs.len() >= opts.chunk_records || pos >= opts.chunk_bytes {
                // The rest begins the next chunk; lines are counted up to here first, as the bytes counted from
                // are about to move.
                split.position.of(&chunk.data[..filled], *base, pos);
                pending.extend_from_slice(&chunk.data[pos..filled]);
                *base += pos as u64;
                return Ok(());
            }
            match split.step(&chunk.data[..filled], *base, pos, *eof) {
                Step::Moved(p) => pos = p,
                Step::Record { range, line, place } => {
                    pos = range.end;
                    // Found whole in the bytes read, but over the limit all the same: refused as a line would be.
                    let kind = if range.len() > opts.max_record_bytes {
                        RawKind::Oversize(range.len() as u64)
                    } else {
                        RawKind::Data(range)
                    };
                    chunk.recs.push(RawRec {
                        line,
                        kind,
                        place: Some(place),
                    });
                }
                Step::Done => {
                    chunk.last = true;
                    return Ok(());
                }
                Step::Bad(b) => return Err(malformed(b)),
                Step::More { start, record } => {
                    let held = filled - start;
                    if held > opts.max_record_bytes {
                        let (line, column) = split.position.of(&chunk.data[..filled], *base, start);
                        if !record {
                            return Err(malformed(shape::Broken {
                                line,
                                column,
                                place: None,
                                message: format!(
                                    "a value outside the records is over the limit of {} bytes",
                                    opts.max_record_bytes
                                ),
                            }));
                        }
                        let index = split.skipped_record();
                        let skipped =
                            skip_value(&chunk.data[start..filled], reader).map_err(|e| {
                                malformed(shape::Broken {
                                    line,
                                    column,
                                    place: index.path(),
                                    message: format!(
                                        "while skipping this record, over the limit of {} bytes: {e}",
                                        opts.max_record_bytes
                                    ),
                                })
                            })?;
                        // The skipped bytes are gone from the buffer: what is read next goes where the record
                        // began, and lies `skipped.bytes` further into the input than that place did.
                        split.position.skip(
                            *base + start as u64,
                            skipped.bytes,
                            skipped.newlines,
                            skipped.last_newline,
                        );
                        *base += skipped.bytes;
                        filled = start;
                        pos = start;
                        chunk.recs.push(RawRec {
                            line,
                            kind: RawKind::Oversize(skipped.bytes),
                            place: Some(Place { column, index }),
                        });
                        continue;
                    }
                    // At least as much as the value holds so far: a long value is then scanned from its start
                    // O(log n) times, not once per read.
                    let want = (*read_bytes).max(held);
                    let end = filled.saturating_add(want);
                    if chunk.data.len() < end {
                        chunk.data.resize(end, 0);
                    }
                    let read = loop {
                        match reader.read(&mut chunk.data[filled..end]) {
                            Ok(n) => break n,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(source) => {
                                let (line, _) =
                                    split.position.of(&chunk.data[..filled], *base, filled);
                                return Err(IngestError::Io {
                                    source_name: source_name.clone(),
                                    line: Some(line),
                                    source,
                                });
                            }
                        }
                    };
                    if read == 0 {
                        *eof = true;
                    }
                    filled += read;
                }
            }
        }
    }

    /// Whether a chunk whose taken lines end at `len` bytes is as large as it may be.
    fn chunk_full(&self, chunk: &RawChunk, len: usize) -> bool {
        chunk.recs.len() >= self.opts.chunk_records || len >= self.opts.chunk_bytes
    }

    /// Takes the line at `range` of `chunk.data` (without its newline) as the next record, unless it is blank.
    fn take_line(&mut self, chunk: &mut RawChunk, range: Range<usize>) {
        let line = self.next_line;
        self.next_line += 1;
        let len = range.len();
        if len > self.opts.max_record_bytes {
            chunk.recs.push(RawRec {
                line,
                kind: RawKind::Oversize(len as u64),
                place: None,
            });
            return;
        }
        let bytes = &chunk.data[range.clone()];
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        chunk.recs.push(RawRec {
            line,
            kind: RawKind::Data(range.start..range.start + bytes.len()),
            place: None,
        });
    }

    /// Reads the rest of an over-limit line through its newline without keeping it; returns its length.
    fn skip_line(&mut self) -> Result<u64, IngestError> {
        let mut total = 0;
        loop {
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(IngestError::Io {
                        source_name: self.source_name.clone(),
                        line: Some(self.next_line),
                        source,
                    });
                }
            };
            if buf.is_empty() {
                self.eof = true;
                return Ok(total);
            }
            let (take, used, newline) = match memchr(b'\n', buf) {
                Some(i) => (i, i + 1, true),
                None => (buf.len(), buf.len(), false),
            };
            total += take as u64;
            self.reader.consume(used);
            if newline {
                return Ok(total);
            }
        }
    }

    /// Reads the next non-blank line, appending its bytes to `data`. A line over the limit is skipped to its
    /// newline without being kept. `None` at the end of the input.
    fn read_record(&mut self, data: &mut Vec<u8>) -> Result<Option<RawRec>, IngestError> {
        let max = self.opts.max_record_bytes as u64;
        loop {
            if self.eof {
                return Ok(None);
            }
            let line = self.next_line;
            let start = data.len();
            let mut total: u64 = 0;
            let mut over = false;
            let mut any = false;
            loop {
                let buf = match self.reader.fill_buf() {
                    Ok(b) => b,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(IngestError::Io {
                            source_name: self.source_name.clone(),
                            line: Some(self.next_line),
                            source,
                        });
                    }
                };
                if buf.is_empty() {
                    self.eof = true;
                    break;
                }
                any = true;
                let (take, used, newline) = match memchr(b'\n', buf) {
                    Some(i) => (i, i + 1, true),
                    None => (buf.len(), buf.len(), false),
                };
                total += take as u64;
                if !over && total > max {
                    over = true;
                    data.truncate(start);
                }
                if !over {
                    data.extend_from_slice(&buf[..take]);
                }
                self.reader.consume(used);
                if newline {
                    break;
                }
            }
            if !any {
                return Ok(None);
            }
            self.next_line += 1;
            if over {
                return Ok(Some(RawRec {
                    line,
                    kind: RawKind::Oversize(total),
                    place: None,
                }));
            }
            if data.last() == Some(&b'\r') {
                data.pop();
            }
            if data[start..].iter().all(u8::is_ascii_whitespace) {
                data.truncate(start);
                continue;
            }
            return Ok(Some(RawRec {
                line,
                kind: RawKind::Data(start..data.len()),
                place: None,
            }));
        }
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

/// What reading a value through without keeping it passed over.
struct Skipped {
    bytes: u64,
    newlines: u64,
    /// Offset of the last newline among those bytes.
    last_newline: Option<u64>,
}

/// Reads the value that starts at `held[0]` (the part of it already read) and goes on in `rest`, to its end and
/// no further, keeping none of it: serde_json reads it as `IgnoredAny`, and takes no byte past a closing `}`,
/// `]` or `"`.
fn skip_value<R: Read>(held: &[u8], rest: &mut R) -> Result<Skipped, serde_json::Error> {
    let mut counted = Counted {
        inner: held.chain(rest),
        skipped: Skipped {
            bytes: 0,
            newlines: 0,
            last_newline: None,
        },
    };
    let mut de = serde_json::Deserializer::from_reader(&mut counted);
    serde::de::IgnoredAny::deserialize(&mut de)?;
    Ok(counted.skipped)
}

/// A reader that counts the bytes and newlines read through it.
struct Counted<R> {
    inner: R,
    skipped: Skipped,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        for nl in memchr::memchr_iter(b'\n', &buf[..n]) {
            self.skipped.newlines += 1;
            self.skipped.last_newline = Some(self.skipped.bytes + nl as u64);
        }
        self.skipped.bytes += n as u64;
        Ok(n)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A reader handing out its bytes a few at a time, as a pipe or a socket can.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    /// What a record is: its bytes, or its length when it is over the limit.
    type Taken = (u64, Result<Vec<u8>, u64>);

    /// The lines of `input` the plain way: split at newlines, a last line without one, one `\r` dropped from the
    /// end, blank lines skipped, lines over `max` bytes reported by length.
    fn reference(input: &[u8], max: usize) -> Vec<Taken> {
        let mut pieces: Vec<&[u8]> = input.split(|&c| c == b'\n').collect();
        if pieces.last().is_some_and(|p| p.is_empty()) {
            pieces.pop();
        }
        let mut out = Vec::new();
        for (n, p) in pieces.into_iter().enumerate() {
            let line = n as u64 + 1;
            if p.len() > max {
                out.push((line, Err(p.len() as u64)));
                continue;
            }
            let p = p.strip_suffix(b"\r").unwrap_or(p);
            if !p.iter().all(u8::is_ascii_whitespace) {
                out.push((line, Ok(p.to_vec())));
            }
        }
        out
    }

    /// The lines `Lines` takes, the first one read on its own as `ChunkReader::new` reads it.
    fn taken(input: &[u8], step: usize, read_bytes: usize, opts: ReadOptions) -> Vec<Taken> {
        let reader = Trickle {
            data: input.to_vec(),
            pos: 0,
            step,
        };
        let mut lines = Lines {
            reader: BufReader::with_capacity(16, reader),
            source_name: "test".into(),
            opts,
            next_line: 1,
            eof: false,
            first: None,
            pending: Vec::new(),
            read_bytes,
            split: None,
            base: 0,
        };
        let mut buf = Vec::new();
        let Some(first) = lines.read_record(&mut buf).expect("reads") else {
            return Vec::new();
        };
        lines.first = Some((first, buf));
        let mut out = Vec::new();
        let mut chunk = RawChunk::default();
        loop {
            lines.fill(&mut chunk).expect("reads");
            assert!(chunk.recs.len() <= opts.chunk_records);
            for r in &chunk.recs {
                out.push(match &r.kind {
                    RawKind::Data(range) => (r.line, Ok(chunk.data[range.clone()].to_vec())),
                    RawKind::Oversize(n) => (r.line, Err(*n)),
                });
            }
            if chunk.last {
                return out;
            }
        }
    }

    #[test]
    fn lines_are_taken_as_written_whatever_the_reads_and_chunk_limits() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..300 {
            let max = 1 + next(40) as usize;
            let mut input = Vec::new();
            for _ in 0..next(12) {
                match next(6) {
                    0 => {}
                    1 => input.extend_from_slice(b"  \t"),
                    2 => input.push(b'\r'),
                    3 => input.extend(std::iter::repeat_n(b'x', max + next(3) as usize)),
                    _ => input.extend((0..next(max as u64 + 1)).map(|i| b'a' + (i % 26) as u8)),
                }
                if next(4) == 0 {
                    input.push(b'\r');
                }
                input.push(b'\n');
            }
            if next(2) == 0 {
                input.extend_from_slice(b"last");
            }
            let want = reference(&input, max);
            for (step, read_bytes) in [
                (1, 1),
                (3, 5),
                (16, 7),
                (1 << 20, 64),
                (1 << 20, READ_BYTES),
            ] {
                let opts = ReadOptions {
                    max_record_bytes: max,
                    chunk_records: 1 + next(4) as usize,
                    chunk_bytes: 1 + next(60) as usize,
                    shape: Shape::Jsonl,
                };
                assert_eq!(
                    taken(&input, step, read_bytes, opts),
                    want,
                    "{:?} step {step} reads of {read_bytes}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }
}

//! [`ChunkReader`]: sequential line splitting into bounded chunks, parallel parsing of each chunk.

use crate::{Format, FormatChoice, IngestError, Parsed, ReadOptions, RecordError};
use crate::{detect, langfuse, openai, otel, tooltune};
use memchr::memchr;
use rayon::prelude::*;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
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
}

/// Raw lines of one chunk: their bytes back to back and where each one lies.
#[derive(Default)]
struct RawChunk {
    data: Vec<u8>,
    recs: Vec<RawRec>,
    /// The input ended with this chunk.
    last: bool,
}

/// The sequential half of a read: splitting the input into lines.
struct Lines<R> {
    reader: R,
    source_name: String,
    opts: ReadOptions,
    /// Number of the next line to be read, 1-based.
    next_line: u64,
    eof: bool,
    /// The record read for format detection, handed out first.
    first: Option<(RawRec, Vec<u8>)>,
}

/// Reads trace records from a file or any buffered reader, a chunk at a time.
///
/// While one chunk is parsed, the raw lines of the next are read on another thread: reading is sequential, and
/// done between parses it left a core idle for a tenth of an ingest. Memory is bounded by two chunks
/// (`chunk_records` lines or `chunk_bytes` bytes each, whichever comes first) plus, for OTLP input, the spans of
/// traces whose root span has not arrived yet.
pub struct ChunkReader<R: BufRead + Send> {
    lines: Lines<R>,
    format: Option<Format>,
    done: bool,
    /// The chunk read ahead while the previous one was parsed, or the read failure to report next.
    ahead: Option<Result<RawChunk, IngestError>>,
    /// A chunk's buffers, kept for reuse.
    spare: RawChunk,
    otel: otel::Assembler,
}

impl ChunkReader<BufReader<File>> {
    /// Opens a file and detects (or takes) its format.
    pub fn open(path: &Path, choice: FormatChoice, opts: ReadOptions) -> Result<Self, IngestError> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| IngestError::Io {
            source_name: name.clone(),
            source,
        })?;
        // Large reads amortise the syscall cost; lines are split out of this buffer without copying twice.
        ChunkReader::new(BufReader::with_capacity(1 << 20, file), &name, choice, opts)
    }
}

impl<R: BufRead + Send> ChunkReader<R> {
    /// Wraps a reader (an HTTP body, a decompressor, ...) and detects (or takes) its format, reading at most the
    /// first non-blank record. `source_name` is used in errors.
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
        };
        let mut r = ChunkReader {
            lines: Lines {
                reader,
                source_name: source_name.to_string(),
                opts,
                next_line: 1,
                eof: false,
                first: None,
            },
            format: None,
            done: false,
            ahead: None,
            spare: RawChunk::default(),
            otel: otel::Assembler::default(),
        };
        let mut buf = Vec::new();
        let Some(first) = r.lines.read_record(&mut buf)? else {
            r.done = true;
            return Ok(r);
        };
        r.format = Some(match choice {
            FormatChoice::Fixed(f) => f,
            FormatChoice::Auto => {
                let detected = match &first.kind {
                    RawKind::Data(range) => detect::detect(first.line, &buf[range.clone()]),
                    RawKind::Oversize(n) => Err(format!(
                        "the first record (line {}) is {n} bytes, over the limit of {} bytes",
                        first.line, r.lines.opts.max_record_bytes
                    )),
                };
                detected.map_err(|reason| IngestError::UnknownFormat {
                    source_name: r.lines.source_name.clone(),
                    reason,
                })?
            }
        });
        r.lines.first = Some((first, buf));
        Ok(r)
    }

    /// The format being read; `None` only for an empty input (no non-blank line).
    pub fn format(&self) -> Option<Format> {
        self.format
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
                    result: text_of(r, data, max)
                        .and_then(|t| parse(t, r.line))
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
                    otel::read_line(text_of(r, data, max), r.line, range, map)
                })
                .collect(),
        ),
    }
}

/// Bytes reserved in a chunk buffer beyond `chunk_bytes`: the line that crosses the limit is kept whole, and most
/// lines are far shorter than this.
const CHUNK_SLACK: usize = 1 << 20;

impl<R: BufRead> Lines<R> {
    /// Reads raw lines into `chunk` (emptied first) until a limit is reached or the input ends.
    fn fill(&mut self, chunk: &mut RawChunk) -> Result<(), IngestError> {
        chunk.recs.clear();
        // A chunk that once held a huge record should not pin that memory for the rest of the read.
        if chunk.data.capacity() > 2 * self.opts.chunk_bytes.max(self.opts.max_record_bytes) {
            chunk.data = Vec::new();
        }
        chunk.data.clear();
        // Room for a whole chunk up front: grown by doubling instead, the buffer was copied five times over on its
        // way to its size, each copy into fresh pages the kernel had to zero first (a tenth of a second at the start
        // of every import). Pages are only committed as lines are written into them, so a small input costs no
        // more memory than before.
        chunk
            .data
            .reserve(self.opts.chunk_bytes.saturating_add(CHUNK_SLACK));
        if let Some((rec, bytes)) = self.first.take() {
            let kind = match rec.kind {
                RawKind::Data(range) => {
                    chunk.data.extend_from_slice(&bytes[range]);
                    RawKind::Data(0..chunk.data.len())
                }
                oversize => oversize,
            };
            chunk.recs.push(RawRec {
                line: rec.line,
                kind,
            });
        }
        while chunk.recs.len() < self.opts.chunk_records && chunk.data.len() < self.opts.chunk_bytes
        {
            match self.read_record(&mut chunk.data)? {
                Some(rec) => chunk.recs.push(rec),
                None => break,
            }
        }
        chunk.last = self.eof;
        Ok(())
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
            }));
        }
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
                    "invalid UTF-8 at byte offset {} of the line",
                    e.valid_up_to()
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

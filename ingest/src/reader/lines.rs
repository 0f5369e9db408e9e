//! The sequential half of a read: the input split into a chunk's raw records (lines, or a shape's records as its
//! splitter finds them) in large reads straight into the chunk buffer, a record over the limit skipped, not kept.

use crate::shape::{self, Place, Splitter, Step};
use crate::{IngestError, ReadOptions};
use memchr::memchr;
use serde::Deserialize;
use std::io::{self, BufRead, Read};
use std::ops::Range;

/// One raw line of the input: its bytes in the chunk buffer, or only its length when it was over the limit.
#[derive(Debug, Clone)]
pub(super) enum RawKind {
    Data(Range<usize>),
    Oversize(u64),
}

#[derive(Debug, Clone)]
pub(super) struct RawRec {
    pub(super) line: u64,
    pub(super) kind: RawKind,
    /// Where the record lies in a document, an array or a page; `None` for a line of JSON Lines.
    pub(super) place: Option<Place>,
}

/// Raw lines of one chunk: their bytes back to back and where each one lies.
#[derive(Default)]
pub(super) struct RawChunk {
    pub(super) data: Vec<u8>,
    pub(super) recs: Vec<RawRec>,
    /// The input ended with this chunk.
    pub(super) last: bool,
}

/// The sequential half of a read: splitting the input into lines, or (with a splitter) into the records of a
/// document, an array or a page.
pub(super) struct Lines<R> {
    pub(super) reader: R,
    pub(super) source_name: String,
    pub(super) opts: ReadOptions,
    /// Number of the next line to be read, 1-based.
    pub(super) next_line: u64,
    pub(super) eof: bool,
    /// The record read for format detection, handed out first.
    pub(super) first: Option<(RawRec, Vec<u8>)>,
    /// Bytes read after the last line a chunk took: the start of the next chunk's first line.
    pub(super) pending: Vec<u8>,
    /// Bytes asked of the reader at a time ([`READ_BYTES`]; tests ask for few, to cut lines anywhere).
    pub(super) read_bytes: usize,
    /// For a shape other than JSON Lines: where the records are.
    pub(super) split: Option<Splitter>,
    /// Input offset of the first byte of the chunk being filled (of `pending`, between fills); the splitter's
    /// positions are counted in input offsets.
    pub(super) base: u64,
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
pub(super) const READ_BYTES: usize = 1 << 20;

/// Bytes reserved in a chunk buffer beyond `chunk_bytes`: the line that crosses the limit is kept whole, and most
/// lines are far shorter than this.
const CHUNK_SLACK: usize = 1 << 20;

impl<R: BufRead> Lines<R> {
    /// Reads raw lines (or a shape's records) into `chunk` (emptied first) until a limit is reached or the input
    /// ends.
    pub(super) fn fill(&mut self, chunk: &mut RawChunk) -> Result<(), IngestError> {
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
    pub(super) fn read_record(
        &mut self,
        data: &mut Vec<u8>,
    ) -> Result<Option<RawRec>, IngestError> {
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

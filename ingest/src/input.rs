//! Opening an input: a reader whose first bytes can be looked at before they are read (to tell compression and
//! shape apart), and gzip or zstd decompression, chosen by the file name's extension and by the magic bytes.

use crate::IngestError;
use std::io::{self, BufRead, BufReader, Read};

/// A reader with some of its first bytes already taken out to be looked at, handed out again before the rest.
///
/// Detection reads ahead into `head` (as far as it needs, which for a pretty-printed first record is the whole
/// record); every later read sees those bytes first, so nothing is read twice and nothing is lost.
pub(crate) struct Prefixed<R> {
    head: Vec<u8>,
    pos: usize,
    inner: R,
}

impl<R: Read> Prefixed<R> {
    pub(crate) fn new(inner: R) -> Self {
        Prefixed {
            head: Vec::new(),
            pos: 0,
            inner,
        }
    }

    /// The bytes looked at and not yet read.
    pub(crate) fn head(&self) -> &[u8] {
        &self.head[self.pos..]
    }

    /// Reads until [`head`](Self::head) holds at least `want` bytes or the input ends; `true` when it ended.
    pub(crate) fn look_ahead(&mut self, want: usize) -> io::Result<bool> {
        if self.pos > 0 {
            self.head.drain(..self.pos);
            self.pos = 0;
        }
        while self.head.len() < want {
            let filled = self.head.len();
            // Reads of at least 64 KiB, so that looking far ahead costs few calls.
            let step = (want - filled).max(1 << 16);
            self.head.resize(filled + step, 0);
            let n = loop {
                match self.inner.read(&mut self.head[filled..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.head.truncate(filled);
                        return Err(e);
                    }
                }
            };
            self.head.truncate(filled + n);
            if n == 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Frees the head once it has been read, so that a long look ahead does not pin its memory.
    fn drop_head_if_read(&mut self) {
        if self.pos == self.head.len() && !self.head.is_empty() {
            self.head = Vec::new();
            self.pos = 0;
        }
    }
}

impl<R: Read> Read for Prefixed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos < self.head.len() {
            let n = buf.len().min(self.head.len() - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            self.drop_head_if_read();
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl<R: BufRead> BufRead for Prefixed<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos < self.head.len() {
            return Ok(&self.head[self.pos..]);
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        if self.pos < self.head.len() {
            self.pos = (self.pos + amt).min(self.head.len());
            self.drop_head_if_read();
        } else {
            self.inner.consume(amt);
        }
    }
}

/// How an input is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    Gzip,
    Zstd,
}

impl Compression {
    fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }

    /// What the file name's extension says.
    fn by_name(name: &str) -> Option<Compression> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".gz") || lower.ends_with(".gzip") {
            Some(Compression::Gzip)
        } else if lower.ends_with(".zst") || lower.ends_with(".zstd") {
            Some(Compression::Zstd)
        } else {
            None
        }
    }

    /// What the first bytes say (RFC 1952's ID1 ID2; RFC 8878's frame magic number, little-endian 0xFD2FB528).
    fn by_magic(head: &[u8]) -> Option<Compression> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Compression::Zstd)
        } else {
            None
        }
    }
}

/// Bytes of decompressed text buffered at a time: as large as the reads of an uncompressed file, so that the
/// chunk reader's reads cost as few calls.
const DECOMPRESSED_BUFFER: usize = 1 << 20;

/// `reader`, decompressed when its first bytes are gzip or zstd, or when `source_name` ends in `.gz` or `.zst`
/// (then the bytes must agree: a `.gz` file that is not gzip is an error rather than read as text).
pub(crate) fn decompressed<R: BufRead + Send + 'static>(
    reader: R,
    source_name: &str,
) -> Result<Box<dyn BufRead + Send>, IngestError> {
    let io_error = |source| IngestError::Io {
        source_name: source_name.to_string(),
        line: None,
        source,
    };
    let mut input = Prefixed::new(reader);
    input.look_ahead(4).map_err(io_error)?;
    let named = Compression::by_name(source_name);
    let found = Compression::by_magic(input.head());
    let compression = match (named, found) {
        (Some(named), found) if found != Some(named) && !input.head().is_empty() => {
            return Err(io_error(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the name says {} but the data does not start like {} data",
                    named.name(),
                    named.name()
                ),
            )));
        }
        (_, found) => found,
    };
    Ok(match compression {
        None => Box::new(input),
        Some(c @ Compression::Gzip) => Box::new(BufReader::with_capacity(
            DECOMPRESSED_BUFFER,
            // A gzip file may hold several members one after another (`cat a.gz b.gz`); all are read.
            Labelled::new(flate2::bufread::MultiGzDecoder::new(input), c),
        )),
        Some(c @ Compression::Zstd) => Box::new(BufReader::with_capacity(
            DECOMPRESSED_BUFFER,
            // zstd's reader goes on through every frame of the input, as `zstd -d` does.
            Labelled::new(
                zstd::stream::read::Decoder::with_buffer(input).map_err(io_error)?,
                c,
            ),
        )),
    })
}

/// A decompressor whose errors say which compression failed, and that the data was cut short when it ends early.
struct Labelled<R> {
    inner: R,
    compression: Compression,
}

impl<R> Labelled<R> {
    fn new(inner: R, compression: Compression) -> Self {
        Labelled { inner, compression }
    }
}

impl<R: Read> Read for Labelled<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let what = self.compression.name();
            if e.kind() == io::ErrorKind::Interrupted {
                e
            } else if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    e.kind(),
                    format!("the {what} data ends early (is the file cut short?): {e}"),
                )
            } else {
                io::Error::new(e.kind(), format!("invalid {what} data: {e}"))
            }
        })
    }
}

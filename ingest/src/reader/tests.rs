//! The line splitter against a plain split of the same input, whatever the reads, the chunk limits and the record
//! limit.

use super::lines::{Lines, READ_BYTES, RawChunk, RawKind};
use crate::{ReadOptions, Shape};
use std::io::{self, BufReader, Read};

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

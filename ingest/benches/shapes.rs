//! Read throughput and peak memory of every input shape against JSON Lines: generates, for each format, files of
//! the same records in each shape (JSON Lines; one large top-level array, compact and pretty-printed;
//! concatenated pretty-printed documents; a Langfuse page; gzip and zstd), then reads each with `ChunkReader`
//! (shape and format detected) in a child process of its own, so that each case's peak RSS is its own. Each case
//! is read three times and the fastest counts (the machine may be busy with other work); `vs jsonl` is its time
//! over JSON Lines' for the same records.
//!
//! Run: `cargo bench -p tooltune-ingest --bench shapes`. Environment:
//! - `TOOLTUNE_BENCH_MB`: size of the JSON Lines file in MB (default 64); the other shapes hold the same records.
//!   A single-array file of any size can be generated and timed this way, e.g. 1000 for about 1 GB (that needs the
//!   disk space, and minutes per case).
//! - `TOOLTUNE_BENCH_FORMATS`: comma-separated formats (default all four).
//! - `TOOLTUNE_BENCH_DIR`: where to write the files (default a temporary directory, removed afterwards).
//!
//! Records are the shipped samples (`ingest/samples`), repeated; OTLP copies get fresh trace ids.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use tooltune_ingest::{ChunkReader, Format, FormatChoice, ReadOptions};

/// Set in the child process: the file it is to read.
const CHILD_ENV: &str = "TOOLTUNE_BENCH_READ_FILE";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(file) = std::env::var(CHILD_ENV) {
        return read_and_report(Path::new(&file));
    }
    let mb: u64 = std::env::var("TOOLTUNE_BENCH_MB")
        .ok()
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(64);
    let formats: Vec<Format> = match std::env::var("TOOLTUNE_BENCH_FORMATS") {
        Ok(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        Err(_) => Format::ALL.to_vec(),
    };
    let temp = tempfile::tempdir()?;
    let dir = std::env::var("TOOLTUNE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    println!(
        "{} MB per file, {} cores; each case read in a child process (shape and format detected)",
        mb,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<9} {:<22} {:>8} {:>10} {:>13} {:>8} {:>9} {:>12}",
        "format", "shape", "MB", "records", "records/s", "MB/s", "vs jsonl", "peak RSS MB"
    );
    for format in formats {
        let records = sample_records(format)?;
        let mut jsonl: Option<(usize, f64)> = None;
        for shape in shapes_of(format) {
            let path = dir.join(format!("{format}.{}", shape.file_suffix()));
            // JSON Lines is written to the size asked; every other shape holds the same records.
            let limit = match jsonl {
                None => Limit::Bytes(mb * 1_000_000),
                Some((n, _)) => Limit::Records(n),
            };
            let written = write_file(&path, format, &records, shape, limit)?;
            let mut r = read_in_child(&path)?;
            for _ in 0..2 {
                let again = read_in_child(&path)?;
                if again.seconds < r.seconds {
                    r = again;
                }
            }
            let rate = r.records as f64 / r.seconds;
            let (_, base) = *jsonl.get_or_insert((written, r.seconds));
            let file_mb = std::fs::metadata(&path)?.len() as f64 / 1e6;
            println!(
                "{:<9} {:<22} {:>8.1} {:>10} {:>13.0} {:>8.1} {:>8.2}x {:>12.1}",
                format.name(),
                shape.label(),
                file_mb,
                r.records,
                rate,
                file_mb / r.seconds,
                r.seconds / base,
                r.peak_rss_kb as f64 / 1024.0
            );
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// The layouts generated. JSON Lines comes first: the others are compared to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchShape {
    Jsonl,
    Array,
    ArrayPretty,
    DocumentsPretty,
    Page,
    JsonlGzip,
    ArrayZstd,
}

impl BenchShape {
    fn label(self) -> &'static str {
        match self {
            BenchShape::Jsonl => "jsonl",
            BenchShape::Array => "array (one, compact)",
            BenchShape::ArrayPretty => "array (one, pretty)",
            BenchShape::DocumentsPretty => "documents (pretty)",
            BenchShape::Page => "page",
            BenchShape::JsonlGzip => "jsonl.gz",
            BenchShape::ArrayZstd => "array.zst",
        }
    }

    fn file_suffix(self) -> &'static str {
        match self {
            BenchShape::Jsonl => "jsonl",
            BenchShape::Array => "array.json",
            BenchShape::ArrayPretty => "pretty-array.json",
            BenchShape::DocumentsPretty => "documents.json",
            BenchShape::Page => "page.json",
            BenchShape::JsonlGzip => "jsonl.gz",
            BenchShape::ArrayZstd => "array.json.zst",
        }
    }
}

fn shapes_of(format: Format) -> Vec<BenchShape> {
    let mut v = vec![
        BenchShape::Jsonl,
        BenchShape::Array,
        BenchShape::ArrayPretty,
        BenchShape::DocumentsPretty,
    ];
    // The page envelope is Langfuse's API's.
    if format == Format::Langfuse {
        v.push(BenchShape::Page);
    }
    v.extend([BenchShape::JsonlGzip, BenchShape::ArrayZstd]);
    v
}

fn sample_records(format: Format) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("samples/{format}.jsonl"));
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

/// Makes repeated OTLP copies distinct: spans of a trace id seen before would be late spans of a finished trace.
fn fresh_ids(format: Format, v: &mut serde_json::Value, copy: usize) {
    if format != Format::Otel {
        return;
    }
    for r in v["resourceSpans"].as_array_mut().into_iter().flatten() {
        for ss in r["scopeSpans"].as_array_mut().into_iter().flatten() {
            for s in ss["spans"].as_array_mut().into_iter().flatten() {
                if let Some(t) = s["traceId"].as_str() {
                    s["traceId"] = format!("{}{copy:08x}", &t[..24]).into();
                }
            }
        }
    }
}

/// How much a generated file holds.
#[derive(Clone, Copy)]
enum Limit {
    /// About this many bytes of text.
    Bytes(u64),
    /// Exactly this many sample records.
    Records(usize),
}

/// Writes records (samples repeated) in `shape` up to `limit`; returns how many sample records it wrote.
fn write_file(
    path: &Path,
    format: Format,
    samples: &[serde_json::Value],
    shape: BenchShape,
    limit: Limit,
) -> Result<usize, Box<dyn std::error::Error>> {
    let file = std::fs::File::create(path)?;
    let mut out: Box<dyn Write> = match shape {
        BenchShape::JsonlGzip => Box::new(flate2::write::GzEncoder::new(
            BufWriter::new(file),
            flate2::Compression::fast(),
        )),
        BenchShape::ArrayZstd => {
            Box::new(zstd::Encoder::new(BufWriter::new(file), 3)?.auto_finish())
        }
        _ => Box::new(BufWriter::with_capacity(1 << 20, file)),
    };
    let (open, sep, close, pretty) = match shape {
        BenchShape::Jsonl | BenchShape::JsonlGzip => ("", "\n", "\n", false),
        BenchShape::Array | BenchShape::ArrayZstd => ("[\n", ",\n", "\n]\n", false),
        BenchShape::ArrayPretty => ("[\n", ",\n", "\n]\n", true),
        BenchShape::DocumentsPretty => ("", "\n", "\n", true),
        BenchShape::Page => (
            "{\"data\": [\n",
            ",\n",
            "\n], \"meta\": {\"page\": 1}}\n",
            false,
        ),
    };
    out.write_all(open.as_bytes())?;
    let mut written = 0u64;
    let mut records = 0usize;
    let mut copy = 0;
    let mut first = true;
    'outer: loop {
        for s in samples {
            let full = match limit {
                Limit::Bytes(bytes) => written >= bytes,
                Limit::Records(n) => records >= n,
            };
            if full {
                break 'outer;
            }
            records += 1;
            let mut v = s.clone();
            fresh_ids(format, &mut v, copy);
            let text = if pretty {
                serde_json::to_string_pretty(&v)?
            } else {
                serde_json::to_string(&v)?
            };
            if !first {
                out.write_all(sep.as_bytes())?;
            }
            first = false;
            out.write_all(text.as_bytes())?;
            written += text.len() as u64 + 1;
        }
        copy += 1;
    }
    out.write_all(close.as_bytes())?;
    out.flush()?;
    Ok(records)
}

struct ChildReport {
    records: u64,
    seconds: f64,
    peak_rss_kb: u64,
}

fn read_in_child(path: &Path) -> Result<ChildReport, Box<dyn std::error::Error>> {
    let o = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, path)
        .output()?;
    if !o.status.success() {
        return Err(format!(
            "reading {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let n = |k: &str| v[k].as_u64().ok_or(format!("no {k} in {v}"));
    Ok(ChildReport {
        records: n("records")?,
        seconds: v["seconds"].as_f64().ok_or("no seconds")?,
        peak_rss_kb: n("peak_rss_kb")?,
    })
}

/// The child's work: read the file, fail on any invalid record, print what it took.
fn read_and_report(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut r = ChunkReader::open(path, FormatChoice::Auto, ReadOptions::default())?;
    let mut records = 0u64;
    while let Some(chunk) = r.next_chunk()? {
        for p in chunk {
            p.result?;
            records += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"records": records, "seconds": seconds, "peak_rss_kb": peak_rss_kb()})
    );
    Ok(())
}

/// The process's peak resident set (Linux `VmHWM`), 0 where it cannot be read.
fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

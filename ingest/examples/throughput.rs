//! Measures parse throughput: writes N records of one format to a temporary file (tooltune records generated,
//! the other formats by repeating the shipped samples with fresh ids), then reads them back with `ChunkReader`.
//!
//! Usage: `cargo run -p tooltune-ingest --release --example throughput -- [FORMAT] [N] [KEEP_PATH]` (defaults:
//! tooltune 200000). With KEEP_PATH the generated file is kept there; `-- FILE` (an existing file) only reads it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use tooltune_ingest::{ChunkReader, Format, FormatChoice, ReadOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let first = args.next().unwrap_or_else(|| "tooltune".to_string());
    if std::path::Path::new(&first).is_file() {
        return read(std::path::Path::new(&first));
    }
    let format: Format = first.parse()?;
    let n: usize = args.next().as_deref().unwrap_or("200000").parse()?;
    let keep = args.next();

    let mut file = tempfile::NamedTempFile::new()?;
    let started = Instant::now();
    {
        let mut w = std::io::BufWriter::new(file.as_file_mut());
        match format {
            Format::Tooltune => {
                for i in 0..n {
                    writeln!(w, "{}", tooltune_record(i))?;
                }
            }
            _ => {
                let sample = std::fs::read_to_string(
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join(format!("samples/{format}.jsonl")),
                )?;
                let lines: Vec<serde_json::Value> = sample
                    .lines()
                    .map(serde_json::from_str)
                    .collect::<Result<_, _>>()?;
                let per_copy = records_per_copy(format, &lines);
                let copies = n.div_ceil(per_copy);
                for copy in 0..copies {
                    for l in &lines {
                        let mut l = l.clone();
                        fresh_ids(format, &mut l, copy);
                        writeln!(w, "{l}")?;
                    }
                }
            }
        }
        w.flush()?;
    }
    eprintln!(
        "wrote {} bytes in {:.2?}",
        file.as_file().metadata()?.len(),
        started.elapsed()
    );
    match keep {
        Some(path) => {
            file.persist(&path)?;
            read(std::path::Path::new(&path))
        }
        None => read(file.path()),
    }
}

/// Reads a file with auto-detection and prints the rate.
fn read(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::metadata(path)?.len();
    let started = Instant::now();
    let mut r = ChunkReader::open(path, FormatChoice::Auto, ReadOptions::default())?;
    let format = r.format().ok_or("empty input")?;
    let (mut ok, mut bad) = (0usize, 0usize);
    while let Some(chunk) = r.next_chunk()? {
        for p in chunk {
            match p.result {
                Ok(_) => ok += 1,
                Err(e) => {
                    if bad == 0 {
                        eprintln!("first error: {e}");
                    }
                    bad += 1;
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{format}: {ok} trajectories ({bad} errors) from {:.1} MB in {secs:.2} s: {:.0} trajectories/s, {:.0} MB/s, {} rayon threads",
        bytes as f64 / 1e6,
        ok as f64 / secs,
        bytes as f64 / 1e6 / secs,
        rayon::current_num_threads()
    );
    // Run in the test script at a small N: generated records that no longer read are this example rotting.
    if bad > 0 || ok == 0 {
        return Err(format!("{bad} of {} records did not read", ok + bad).into());
    }
    Ok(())
}

/// A trajectory like the lecture's reference run, varied per record.
fn tooltune_record(i: usize) -> String {
    let a = 4 + i % 7;
    format!(
        r#"{{"task":"Read notes{i}.txt and sum the numbers in it.","system":"You are a careful assistant working in the user's project folder.","tools":[{{"name":"read_file","description":"Read a UTF-8 text file from the workspace and return its contents.","input_schema":{{"type":"object","properties":{{"path":{{"type":"string","description":"Path relative to the workspace root."}}}},"required":["path"]}}}},{{"name":"calculator","description":"Evaluate an arithmetic expression.","input_schema":{{"type":"object","properties":{{"expression":{{"type":"string"}}}},"required":["expression"]}}}}],"steps":[{{"type":"model","tool_calls":[{{"id":"call_{i}a","name":"read_file","arguments":{{"path":"notes{i}.txt"}}}}],"timing":{{"started_at":"2025-06-02T09:15:02.120Z","duration_ms":640.0}},"usage":{{"prompt_tokens":310,"completion_tokens":27}}}},{{"type":"tool_result","call_id":"call_{i}a","name":"read_file","content":"Attendees: {a}\nPizza budget: 48000\nDrinks: 9500\nReimbursed so far: 12000","is_error":false}},{{"type":"model","tool_calls":[{{"id":"call_{i}b","name":"calculator","arguments":{{"expression":"{a} + 48000 + 9500 + 12000"}}}}],"usage":{{"prompt_tokens":377,"completion_tokens":27}}}},{{"type":"tool_result","call_id":"call_{i}b","name":"calculator","content":"{}","is_error":false}},{{"type":"model","content":"The numbers add up to {}.","usage":{{"prompt_tokens":452,"completion_tokens":29}}}}],"final_answer":"The numbers add up to {}.","outcome":{{"score":1.0,"success":true}},"meta":{{"model":"gpt-4o-mini-2024-07-18","external_id":"run-{i}"}}}}"#,
        a + 69500,
        a + 69500,
        a + 69500
    )
}

fn records_per_copy(format: Format, lines: &[serde_json::Value]) -> usize {
    match format {
        // One root span per trace.
        Format::Otel => lines
            .iter()
            .map(|l| l.to_string().matches(r#""parentSpanId":"""#).count())
            .sum::<usize>()
            .max(1),
        _ => lines.len(),
    }
}

/// Makes repeated copies distinct (OTLP trace ids must not repeat, or the spans would be late spans of a finished
/// trace).
fn fresh_ids(format: Format, v: &mut serde_json::Value, copy: usize) {
    if format != Format::Otel {
        return;
    }
    if let Some(rs) = v.get_mut("resourceSpans").and_then(|r| r.as_array_mut()) {
        for r in rs {
            for ss in r["scopeSpans"].as_array_mut().into_iter().flatten() {
                for s in ss["spans"].as_array_mut().into_iter().flatten() {
                    if let Some(t) = s["traceId"].as_str() {
                        s["traceId"] = format!("{}{copy:08x}", &t[..24]).into();
                    }
                }
            }
        }
    }
}

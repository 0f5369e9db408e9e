//! `tooltune ingest`: store trajectories from trace files (or standard input), each file all-or-nothing unless
//! `--skip-invalid`.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tooltune_ingest::{ChunkReader, FormatChoice, ReadOptions, Shape};
use tooltune_store::{ImportOptions, ImportReport, SkippedRecord, Store, StoreError};

/// Arguments of `tooltune ingest`.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Trace files to ingest; `-` reads standard input. Each is stored whole or not at all. `.gz` and `.zst` files
    /// (or input starting like them) are decompressed.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The files' format: auto, tooltune, openai, langfuse or otel.
    #[arg(long, default_value = "auto")]
    format: String,
    /// How records are laid out: auto (detected from the first bytes), jsonl (one per line), document (one JSON
    /// value, or several one after another), array (a top-level JSON array) or page (`{"data": [...], ...}`, as
    /// Langfuse's public API returns).
    #[arg(long, default_value = "auto")]
    shape: String,
    /// Store the valid records of a file that has invalid ones, and list every skipped record.
    #[arg(long)]
    skip_invalid: bool,
    /// Largest record (line) accepted, in MiB.
    #[arg(long, default_value_t = 64)]
    max_record_mib: usize,
    /// Print one JSON object with a report per file instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct FileOutcome {
    file: String,
    ok: bool,
    /// The shape read (detected or given), once the input could be opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    shape: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    report: Option<ImportReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    invalid: Vec<SkippedRecord>,
    seconds: f64,
}

pub async fn run(db: &str, args: IngestArgs) -> Result<ExitCode> {
    let choice: FormatChoice = args
        .format
        .parse()
        .with_context(|| format!("--format {}", args.format))?;
    let shape: Shape = args
        .shape
        .parse()
        .with_context(|| format!("--shape {}", args.shape))?;
    let store = Store::open(db).await?;
    let opts = ReadOptions {
        max_record_bytes: args.max_record_mib.saturating_mul(1 << 20),
        shape,
        ..ReadOptions::default()
    };
    let mut outcomes = Vec::new();
    for file in &args.files {
        let stdin = file.as_os_str() == "-";
        let name = if stdin {
            "stdin".to_string()
        } else {
            file.display().to_string()
        };
        let started = Instant::now();
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or(ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        bar.set_message(format!("{name}: reading"));
        let opened = if stdin {
            // Standard input is read as a file is, in large reads, and decompressed when it starts like gzip or zstd.
            ChunkReader::decompressing(
                BufReader::with_capacity(1 << 20, std::io::stdin()),
                &name,
                choice,
                opts,
            )
        } else {
            ChunkReader::open(file, choice, opts)
        };
        let shape_read = opened.as_ref().ok().map(|r| r.shape().to_string());
        let result = match opened {
            Ok(reader) => {
                let bar2 = bar.clone();
                let name2 = name.clone();
                store
                    .import(
                        reader,
                        &name,
                        ImportOptions {
                            skip_invalid: args.skip_invalid,
                        },
                        move |p| bar2.set_message(format!("{name2}: {} records", p.records)),
                    )
                    .await
            }
            Err(e) => Err(StoreError::from(e)),
        };
        bar.finish_and_clear();
        let seconds = started.elapsed().as_secs_f64();
        outcomes.push(match result {
            Ok(report) => FileOutcome {
                file: name,
                ok: true,
                shape: shape_read,
                report: Some(report),
                error: None,
                invalid: vec![],
                seconds,
            },
            Err(StoreError::Rejected { errors, .. }) => FileOutcome {
                error: Some(format!(
                    "{} invalid record(s); nothing of this file was stored (use --skip-invalid to store the valid ones)",
                    errors.len()
                )),
                file: name,
                ok: false,
                shape: shape_read,
                report: None,
                invalid: errors,
                seconds,
            },
            Err(e) => FileOutcome {
                error: Some(e.to_string()),
                file: name,
                ok: false,
                shape: shape_read,
                report: None,
                invalid: vec![],
                seconds,
            },
        });
    }
    let all_ok = outcomes.iter().all(|o| o.ok);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "ok": all_ok, "files": outcomes }))?
        );
    } else {
        for o in &outcomes {
            print_outcome(o);
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_outcome(o: &FileOutcome) {
    match (&o.report, &o.error) {
        (Some(r), _) => {
            if r.format.is_none() {
                println!("{}: empty, nothing to ingest", o.file);
                return;
            }
            let rate = if o.seconds > 0.0 {
                r.records as f64 / o.seconds
            } else {
                0.0
            };
            println!(
                "{}: {} format ({}), {} records: {} added, {} already present, {} skipped ({:.1} s, {:.0} records/s)",
                o.file,
                r.format.as_deref().unwrap_or("?"),
                o.shape.as_deref().unwrap_or("?"),
                r.records,
                r.added,
                r.already_present,
                r.skipped.len(),
                o.seconds,
                rate
            );
            for s in &r.skipped {
                println!("  skipped {}:{}: {}", o.file, s.line, s.message);
            }
        }
        // An error of the read names the file itself (`traces.json:3:5: data[17]: ...`).
        (None, Some(e)) if e.starts_with(&o.file) => eprintln!("error: {e}"),
        (None, Some(e)) => {
            eprintln!("error: {}: {e}", o.file);
            for s in &o.invalid {
                eprintln!("  {}:{}: {}", o.file, s.line, s.message);
            }
        }
        (None, None) => {}
    }
}

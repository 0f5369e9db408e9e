//! `tooltune report RUN [RUN...]`: one self-contained HTML page and its figures as JSON for one or several
//! optimisation runs, side by side (a success run next to a selection run shows whether the latter inflated).

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use tooltune_report::Report;
use tooltune_store::Store;

/// Arguments of `tooltune report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run ids, as printed by `tooltune optimize` (several are compared side by side).
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<String>,
    /// Folder for report.html and report.json.
    #[arg(long, default_value = "tooltune-report")]
    pub out: PathBuf,
    /// Print the figures as JSON to stdout instead of the files' paths (the files are written either way).
    #[arg(long)]
    pub json: bool,
}

pub async fn run(db: &str, args: ReportArgs) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    let report = Report::load(&store, &args.runs)
        .await
        .context("reading the runs")?;
    let (html, json) = tooltune_report::write(&report, &args.out)
        .with_context(|| format!("writing the report into {}", args.out.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        println!("{}", html.display());
        println!("{}", json.display());
        for r in &report.runs {
            if !r.finished {
                eprintln!(
                    "note: run {} is unfinished ({}); the report shows what its events hold",
                    r.run_id, r.status
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

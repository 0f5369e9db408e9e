//! `tooltune traces stats`: the first thing a server author looks at, per tool and per description version.

use crate::text::one_line;
use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tooltune_objectives::stats::Rate;
use tooltune_store::{LabelUse, Store, VerdictCounts};

/// Arguments of `tooltune traces stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Only this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Whether success counts tooltune's labels (`tooltune traces label`) where the producer wrote no outcome:
    /// use (the producer's outcome first, a label only where there is none) or ignore.
    #[arg(long, default_value = "use", value_parser = ["use", "ignore"])]
    labels: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(db: &str, args: StatsArgs) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    let labels: LabelUse = args
        .labels
        .parse()
        .map_err(|e| anyhow::anyhow!("--labels {e}"))?;
    let stats = store.tool_stats_with(args.tool.as_deref(), labels).await?;
    let trajectories = store.count_trajectories().await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "trajectories": trajectories,
                "labels": labels,
                "tools": stats,
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("{trajectories} trajectories in the store");
    if stats.is_empty() {
        println!("no tools yet: ingest traces with `tooltune ingest FILE`");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<34} {:>7} {:>7} {:>24} {:>26}",
        "tool / description version",
        "shown",
        "chosen",
        "selection share (95% CI)",
        "success when chosen (95% CI)"
    );
    for s in &stats {
        let label = match &s.description_id {
            None => s.tool.clone(),
            Some(id) => format!("  {}", &id[..id.len().min(12)]),
        };
        println!(
            "{:<34} {:>7} {:>7} {:>24} {:>26}",
            label,
            s.shown,
            s.chosen,
            fmt_rate(&s.selection_share),
            fmt_rate(&s.success_when_chosen)
        );
        if let Some(d) = &s.description {
            println!("      \"{}\"", one_line(d, 90));
        }
        if s.description_id.is_none()
            && let Some(from) = sources(&s.verdicts)
        {
            println!("      success verdicts: {from}");
        }
    }
    if labels == LabelUse::Ignore {
        println!("success from the producers' outcomes only (--labels ignore)");
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a tool's success verdicts came from, when any came from a label: `producer 3, judge 5, heuristic 2`.
fn sources(v: &VerdictCounts) -> Option<String> {
    if v.judge.judged + v.heuristic.judged == 0 {
        return None;
    }
    Some(
        [
            ("producer", v.producer),
            ("judge label", v.judge),
            ("heuristic label", v.heuristic),
        ]
        .iter()
        .filter(|(_, t)| t.judged > 0)
        .map(|(name, t)| format!("{name} {}/{}", t.succeeded, t.judged))
        .collect::<Vec<_>>()
        .join(", "),
    )
}

fn fmt_rate(r: &Rate) -> String {
    match r.value {
        Some(v) => format!("{v:.2} [{:.2}, {:.2}] n={}", r.low, r.high, r.trials),
        None => "- (n=0)".to_string(),
    }
}

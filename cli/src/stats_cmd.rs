//! `tooltune traces stats`: the first thing a server author looks at, per tool and per description version.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use tooltune_core::text::one_line;
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
    /// tool: logged and evaluated trajectories per tool and description version; variant: the sessions that
    /// `tooltune proxy` recorded, per A/B variant and tool
    #[arg(long, default_value = "tool", value_parser = ["tool", "variant"])]
    by: String,
}

async fn by_variant(store: &Store, tool: Option<&str>, json: bool) -> Result<ExitCode> {
    // The same rows the dashboard's variants page shows (`tooltune_store::variants`).
    let rows = store.proxy_variant_rows(tool).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "variants": rows }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!("no proxy sessions with tool calls yet: run a server behind `tooltune proxy`");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "recorded by `tooltune proxy` (no task text or model turns: calls only); p: Fisher's exact test against \
         the first variant"
    );
    let tw = rows
        .iter()
        .map(|r| r.tool.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let vw = rows
        .iter()
        .map(|r| r.variant.chars().count())
        .max()
        .unwrap_or(6)
        .max(7);
    println!(
        "{:<vw$} {:<tw$} {:>8} {:>6} {:>30} {:>8} {:>28} {:>8} {:>28} {:>8}",
        "variant",
        "tool",
        "sessions",
        "calls",
        "sessions calling it (95% CI)",
        "p",
        "share of calls (95% CI)",
        "p",
        "error rate (95% CI)",
        "p"
    );
    let p = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
    for r in &rows {
        println!(
            "{:<vw$} {:<tw$} {:>8} {:>6} {:>30} {:>8} {:>28} {:>8} {:>28} {:>8}",
            if r.variant.is_empty() {
                "(none)"
            } else {
                &r.variant
            },
            r.tool,
            r.sessions,
            r.calls,
            fmt_rate(&r.session_share),
            p(r.share_p_vs_first),
            fmt_rate(&r.call_share),
            p(r.call_p_vs_first),
            fmt_rate(&r.error_rate),
            p(r.error_p_vs_first)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(db: &str, args: StatsArgs) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    if args.by == "variant" {
        return by_variant(&store, args.tool.as_deref(), args.json).await;
    }
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
